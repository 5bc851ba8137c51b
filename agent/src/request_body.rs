//! Request bodies and their validation.
//!
//! Bodies are checked field by field so that a client gets every problem at once, in the `formErrors` /
//! `fieldErrors` shape, with Zod's wording, which the approval API's clients expect. Unknown fields are refused: a typo
//! in `decision` or `scope` must never silently become a default.

use serde_json::{Map, Value};

use crate::ids::{IdError, SessionId};
use crate::wire::{ApprovalPolicy, Decision, DecisionScope, ValidationErrors};

/// The longest user message accepted, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 32 * 1024;
/// The largest request body the server accepts, in bytes, on every route but two: AG-UI's, and the page's start of a
/// run ([`MAX_MESSAGE_FORM_BYTES`]).
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// The largest body of the page's start of a run: a message of [`MAX_MESSAGE_BYTES`] as a form carries it (where a
/// byte beyond plain ASCII takes three), with room for its session's id and the fields' names. So any message the API
/// takes can be sent from the page, in any script.
pub const MAX_MESSAGE_FORM_BYTES: usize = 3 * MAX_MESSAGE_BYTES + 1024;
/// The longest reason a person may give, in characters.
pub const MAX_REASON_CHARS: usize = 2_000;

/// The body of `POST /api/agent`, `/api/agent/stream` and `/api/agent/runs`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartRunInput {
    pub message: String,
    pub session_id: Option<SessionId>,
    pub policy: Option<ApprovalPolicy>,
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Reads a JSON object body; anything else is a form error.
fn object<'a>(body: &'a Value, errors: &mut ValidationErrors) -> Option<&'a Map<String, Value>> {
    match body {
        Value::Object(map) => Some(map),
        other => {
            errors
                .form_errors
                .push(format!("Expected object, received {}", type_name(other)));
            None
        }
    }
}

fn refuse_unknown_keys(map: &Map<String, Value>, known: &[&str], errors: &mut ValidationErrors) {
    let unknown: Vec<String> = map
        .keys()
        .filter(|key| !known.contains(&key.as_str()))
        .map(|key| format!("'{key}'"))
        .collect();
    if !unknown.is_empty() {
        errors.form_errors.push(format!(
            "Unrecognized key(s) in object: {}",
            unknown.join(", ")
        ));
    }
}

/// An optional string field: absent and `null` are both "not given".
fn optional_str<'a>(
    map: &'a Map<String, Value>,
    field: &str,
    errors: &mut ValidationErrors,
) -> Option<&'a str> {
    match map.get(field) {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(text),
        Some(other) => {
            errors.field(
                field,
                format!("Expected string, received {}", type_name(other)),
            );
            None
        }
    }
}

fn enum_error(expected: &[&str], received: &str) -> String {
    let expected: Vec<String> = expected.iter().map(|e| format!("'{e}'")).collect();
    format!(
        "Invalid enum value. Expected {}, received '{received}'",
        expected.join(" | ")
    )
}

fn reason_field(map: &Map<String, Value>, errors: &mut ValidationErrors) -> Option<String> {
    let reason = optional_str(map, "reason", errors)?.trim();
    if reason.chars().count() > MAX_REASON_CHARS {
        errors.field(
            "reason",
            format!("String must contain at most {MAX_REASON_CHARS} character(s)"),
        );
        return None;
    }
    (!reason.is_empty()).then(|| reason.to_owned())
}

fn id_error(error: &IdError) -> String {
    format!("Invalid id: {error}")
}

impl Decision {
    /// Validates `{"decision": "approve" | "deny", "reason"?, "scope"?: "once" | "session" | "session_program",
    /// "arguments"?}`.
    pub fn from_json(body: &Value) -> Result<Self, ValidationErrors> {
        let mut errors = ValidationErrors::default();
        let Some(map) = object(body, &mut errors) else {
            return Err(errors);
        };
        refuse_unknown_keys(
            map,
            &["decision", "reason", "scope", "arguments"],
            &mut errors,
        );

        let approve = match map.get("decision") {
            None | Some(Value::Null) => {
                errors.field("decision", "Required");
                None
            }
            Some(Value::String(kind)) if kind == "approve" => Some(true),
            Some(Value::String(kind)) if kind == "deny" => Some(false),
            Some(Value::String(kind)) => {
                errors.field("decision", enum_error(&["approve", "deny"], kind));
                None
            }
            Some(other) => {
                errors.field(
                    "decision",
                    format!("Expected 'approve' | 'deny', received {}", type_name(other)),
                );
                None
            }
        };
        let reason = reason_field(map, &mut errors);
        let scope = match optional_str(map, "scope", &mut errors) {
            None => None,
            Some("once") => Some(DecisionScope::Once),
            Some("session") => Some(DecisionScope::Session),
            Some("session_program") => Some(DecisionScope::SessionProgram),
            Some(other) => {
                errors.field(
                    "scope",
                    enum_error(&["once", "session", "session_program"], other),
                );
                None
            }
        };
        let arguments = match map.get("arguments") {
            None | Some(Value::Null) => None,
            Some(value @ Value::Object(_)) => Some(value.clone()),
            Some(other) => {
                errors.field(
                    "arguments",
                    format!("Expected object, received {}", type_name(other)),
                );
                None
            }
        };
        if approve == Some(false) {
            if matches!(
                scope,
                Some(DecisionScope::Session | DecisionScope::SessionProgram)
            ) {
                errors.field("scope", "Only an approval can apply to the session");
            }
            if arguments.is_some() {
                errors.field("arguments", "Only an approval can carry edited arguments");
            }
        }

        match approve {
            Some(true) if errors.is_empty() => Ok(Self::Approve {
                scope: scope.unwrap_or_default(),
                reason,
                arguments,
            }),
            Some(false) if errors.is_empty() => Ok(Self::Deny { reason }),
            _ => Err(errors),
        }
    }
}

impl StartRunInput {
    /// Validates `{"message": "...", "sessionId"?: "...", "policy"?: "..."}`.
    pub fn from_json(body: &Value) -> Result<Self, ValidationErrors> {
        let mut errors = ValidationErrors::default();
        let Some(map) = object(body, &mut errors) else {
            return Err(errors);
        };
        refuse_unknown_keys(map, &["message", "sessionId", "policy"], &mut errors);

        let message = match map.get("message") {
            None | Some(Value::Null) => {
                errors.field("message", "Required");
                None
            }
            Some(Value::String(text)) if text.trim().is_empty() => {
                errors.field("message", "String must contain at least 1 character(s)");
                None
            }
            Some(Value::String(text)) if text.len() > MAX_MESSAGE_BYTES => {
                errors.field(
                    "message",
                    format!("String must contain at most {MAX_MESSAGE_BYTES} byte(s)"),
                );
                None
            }
            Some(Value::String(text)) => Some(text.clone()),
            Some(other) => {
                errors.field(
                    "message",
                    format!("Expected string, received {}", type_name(other)),
                );
                None
            }
        };
        let session_id = optional_str(map, "sessionId", &mut errors).and_then(|raw| {
            SessionId::parse(raw)
                .map_err(|e| errors.field("sessionId", id_error(&e)))
                .ok()
        });
        let policy = optional_str(map, "policy", &mut errors).and_then(|raw| {
            let names: Vec<&str> = ApprovalPolicy::ALL.iter().map(|p| p.as_str()).collect();
            raw.parse::<ApprovalPolicy>()
                .map_err(|_| errors.field("policy", enum_error(&names, raw)))
                .ok()
        });

        match message {
            Some(message) if errors.is_empty() => Ok(Self {
                message,
                session_id,
                policy,
            }),
            _ => Err(errors),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_plain_approve_and_deny_parse() {
        assert_eq!(
            Decision::from_json(&json!({"decision": "approve"})),
            Ok(Decision::approve())
        );
        assert_eq!(
            Decision::from_json(&json!({"decision": "deny", "reason": " too risky "})),
            Ok(Decision::Deny {
                reason: Some("too risky".into())
            })
        );
        assert_eq!(
            Decision::from_json(
                &json!({"decision": "approve", "scope": "session", "arguments": {"path": "a"}})
            ),
            Ok(Decision::Approve {
                scope: DecisionScope::Session,
                reason: None,
                arguments: Some(json!({"path": "a"})),
            })
        );
    }

    #[test]
    fn a_bad_decision_gets_every_error_in_the_zod_shape() {
        let errors = Decision::from_json(&json!({"decision": "maybe", "scope": 3, "extra": true}))
            .unwrap_err();
        assert_eq!(
            serde_json::to_value(&errors).unwrap(),
            json!({
                "formErrors": ["Unrecognized key(s) in object: 'extra'"],
                "fieldErrors": {
                    "decision": ["Invalid enum value. Expected 'approve' | 'deny', received 'maybe'"],
                    "scope": ["Expected string, received number"],
                }
            })
        );
        let errors = Decision::from_json(&json!({})).unwrap_err();
        assert_eq!(errors.field_errors["decision"], vec!["Required"]);
        let errors = Decision::from_json(&json!([1])).unwrap_err();
        assert_eq!(errors.form_errors, vec!["Expected object, received array"]);
    }

    #[test]
    fn a_denial_cannot_carry_a_session_scope_or_arguments() {
        let errors =
            Decision::from_json(&json!({"decision": "deny", "scope": "session", "arguments": {}}))
                .unwrap_err();
        assert!(errors.field_errors.contains_key("scope"));
        assert!(errors.field_errors.contains_key("arguments"));
    }

    #[test]
    fn start_run_validates_message_session_and_policy() {
        assert_eq!(
            StartRunInput::from_json(&json!({"message": "list files", "policy": "strict"})),
            Ok(StartRunInput {
                message: "list files".into(),
                session_id: None,
                policy: Some(ApprovalPolicy::Strict),
            })
        );
        let errors = StartRunInput::from_json(
            &json!({"message": " ", "sessionId": "a/b", "policy": "yolo"}),
        )
        .unwrap_err();
        assert_eq!(errors.field_errors.len(), 3, "{errors:?}");
        let long = "x".repeat(MAX_MESSAGE_BYTES + 1);
        assert!(StartRunInput::from_json(&json!({ "message": long })).is_err());
    }
}
