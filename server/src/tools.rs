//! `GET /api/tools`: every tool the agent may call, built in or from an MCP server, with what the policy would
//! decide for it, and the MCP servers with their state.

use agent::policy::SessionGrants;
use agent::wire::{PermissionDecision, RuleAction, ToolSpec};
use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Value, json};

use crate::state::AppState;

/// One tool as `/api/tools` lists it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolEntry<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a Value,
    /// What the tool says about itself; for an MCP tool, what its server claims.
    annotations: Value,
    /// `builtin`, or the MCP server and the tool's own name there.
    source: Value,
    /// `builtin`, `untrusted` (the server's annotations are not believed) or `annotations` (they are).
    trust: &'static str,
    /// The action the rules give every call of this tool, when a rule names the tool as a whole (rules on its
    /// arguments decide per call and are not shown here).
    rule: Option<RuleAction>,
    /// What the policy decides for a call of it without arguments, before any session approval.
    decision: PermissionDecision,
}

pub async fn list_tools(State(state): State<AppState>) -> Response {
    let harness = &state.harness;
    let permissions = &harness.config().permissions;
    let specs = harness.toolbox().specs();
    let no_grants = SessionGrants::new();
    let no_arguments = json!({});
    let tools: Vec<ToolEntry<'_>> = specs
        .iter()
        .map(|spec: &ToolSpec| ToolEntry {
            name: &spec.name,
            description: &spec.description,
            input_schema: &spec.input_schema,
            annotations: serde_json::to_value(spec.annotations).unwrap_or_default(),
            source: match &spec.mcp {
                None => json!("builtin"),
                Some(origin) => json!({"mcp": {"server": origin.server, "tool": origin.tool}}),
            },
            trust: spec
                .mcp
                .as_ref()
                .map_or("builtin", |origin| origin.trust.as_str()),
            rule: permissions.tool_rule(spec),
            decision: permissions.decide(spec, &no_arguments, &no_grants),
        })
        .collect();
    Json(json!({
        "ok": true,
        "policy": permissions.policy,
        "tools": tools,
        "servers": harness.toolbox().sources(),
    }))
    .into_response()
}
