//! Rules and session grants over HTTP: the rules in force (adding and removing the ones people added), and a
//! session's grants (listing and revoking them). Who changed what comes from the authentication layer, into the
//! audit log.

use agent::harness::Actor;
use agent::ids::{GrantId, RuleId, SessionId};
use agent::permissions::{ListedRule, SessionGrant};
use agent::policy::{Removed, Rule};
use agent::wire::ValidationErrors;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{Value, json};

use crate::body::{JsonValue, Path};
use crate::error::ApiError;
use crate::state::AppState;

/// A listed rule as the API shows it: with whether it can be removed here.
pub fn rule_json(rule: &ListedRule) -> Value {
    let mut value = serde_json::to_value(rule).unwrap_or_default();
    value["removable"] = Value::Bool(rule.removable());
    value
}

/// A grant as the API shows it: with what it covers, in words.
pub fn grant_json(grant: &SessionGrant) -> Value {
    let mut value = serde_json::to_value(grant).unwrap_or_default();
    value["description"] = Value::String(grant.grant.describe());
    value
}

/// `GET /api/rules`: every rule in force, configured ones first.
pub async fn list_rules(State(state): State<AppState>) -> Result<Response, ApiError> {
    let rules: Vec<Value> = state.harness.rules().await?.iter().map(rule_json).collect();
    Ok(Json(json!({"ok": true, "rules": rules})).into_response())
}

/// Reads `{"rule": "tool(matcher)=action"}`.
fn rule_from_body(body: &Value) -> Result<Rule, ApiError> {
    let mut errors = ValidationErrors::default();
    let Some(map) = body.as_object() else {
        return Err(ApiError::Invalid(ValidationErrors::form(
            "Expected object with a rule, for example {\"rule\": \"run_command(git status)=allow\"}",
        )));
    };
    let unknown: Vec<String> = map
        .keys()
        .filter(|key| key.as_str() != "rule")
        .map(|key| format!("'{key}'"))
        .collect();
    if !unknown.is_empty() {
        errors.form_errors.push(format!(
            "Unrecognized key(s) in object: {}",
            unknown.join(", ")
        ));
    }
    let rule = match map.get("rule") {
        Some(Value::String(text)) => match Rule::parse(text) {
            Ok(rule) => Some(rule),
            Err(error) => {
                errors.field("rule", error.to_string());
                None
            }
        },
        None | Some(Value::Null) => {
            errors.field("rule", "Required");
            None
        }
        Some(_) => {
            errors.field("rule", "Expected string");
            None
        }
    };
    match rule {
        Some(rule) if errors.is_empty() => Ok(rule),
        _ => Err(ApiError::Invalid(errors)),
    }
}

/// `POST /api/rules` `{"rule": "..."}`: adds a rule (what "Always allow" does once the person confirmed it).
pub async fn add_rule(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    JsonValue(body): JsonValue,
) -> Result<Response, ApiError> {
    let rule = rule_from_body(&body)?;
    // Kept all the same (an MCP server may add the tool later; the others fail closed or meet no call), but a
    // typo in a tool's or an argument's name is said at once.
    let warnings = rule.warnings(&state.harness.toolbox().specs());
    let added = state.harness.add_rule(rule, &actor).await?;
    tracing::info!(rule = %added.rule, id = %added.id, %actor, "a rule was added");
    let mut answer = json!({"ok": true, "rule": rule_json(&added.listed())});
    if !warnings.is_empty() {
        answer["warnings"] = json!(warnings);
    }
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

/// `DELETE /api/rules/{ruleId}`: removes a rule a person added. Configured rules are refused (403).
pub async fn remove_rule(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Path(rule_id): Path<String>,
) -> Result<Response, ApiError> {
    let rule_id = RuleId::parse(rule_id).map_err(|e| ApiError::bad_id("ruleId", e))?;
    let removed = state.harness.remove_rule(&rule_id, &actor).await?;
    tracing::info!(rule = %removed.text(), id = %removed.id(), %actor, "a rule was removed");
    let removed = match &removed {
        Removed::Rule(rule) => rule_json(&rule.listed()),
        // A kept row that did not read as a rule: its text as it was kept, and no action.
        Removed::Unreadable { id, text } => {
            json!({"id": id, "rule": text, "origin": "added", "unreadable": true})
        }
    };
    Ok(Json(json!({"ok": true, "removed": removed})).into_response())
}

fn parse_session(raw: String) -> Result<SessionId, ApiError> {
    SessionId::parse(raw).map_err(|e| ApiError::bad_id("sessionId", e))
}

/// `GET /api/agent/sessions/{sessionId}/grants`: the session's grants, oldest first.
pub async fn list_grants(
    State(state): State<AppState>,
    Path(session_id): Path<String>,
) -> Result<Response, ApiError> {
    let session_id = parse_session(session_id)?;
    let grants: Vec<Value> = state
        .harness
        .grants(&session_id)
        .await?
        .list()
        .iter()
        .map(grant_json)
        .collect();
    Ok(Json(json!({"ok": true, "grants": grants})).into_response())
}

/// `DELETE /api/agent/sessions/{sessionId}/grants/{grantId}`: revokes a grant; what it covered asks again.
pub async fn revoke_grant(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Path((session_id, grant_id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let session_id = parse_session(session_id)?;
    let grant_id = GrantId::parse(grant_id).map_err(|e| ApiError::bad_id("grantId", e))?;
    let revoked = state
        .harness
        .revoke_grant(&session_id, &grant_id, &actor)
        .await?;
    Ok(Json(json!({"ok": true, "revoked": grant_json(&revoked)})).into_response())
}
