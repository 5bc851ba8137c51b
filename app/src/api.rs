//! Server functions for the browser: load the page, start a run, decide an approval, list pending approvals, cancel
//! a run. They reach the same harness as the REST routes, through context the server provides.

use agent::ids::RunId;
use agent::view::SessionView;
use agent::wire::{ApprovalPolicy, ApprovalRequest, McpServerStatus};
use leptos::prelude::*;
use serde::{Deserialize, Serialize};

/// Everything the page needs for its first render.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PageState {
    pub session: SessionView,
    pub policy: ApprovalPolicy,
    pub model: String,
    pub approval_timeout_secs: u64,
    /// The server's clock when the page was rendered, in milliseconds since the Unix epoch.
    pub now_ms: u64,
    /// The MCP servers and their state when the page was rendered.
    #[serde(default)]
    pub mcp_servers: Vec<McpServerStatus>,
}

/// What the person decided on a card.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Choice {
    Approve,
    ApproveForSession,
    Deny,
}

#[cfg(feature = "ssr")]
pub mod ssr {
    //! What server functions need from the server: the harness and the browser's session.

    use agent::hub::Harness;
    use agent::ids::SessionId;
    use leptos::prelude::*;

    /// The browser's session, from its cookie; the server puts it in each request's extensions.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct SessionCookie(pub SessionId);

    /// The name of the cookie that holds the session id.
    pub const SESSION_COOKIE: &str = "toolgate_session";

    pub fn harness() -> Result<Harness, ServerFnError> {
        use_context::<Harness>().ok_or_else(|| ServerFnError::new("the server provides no harness"))
    }

    pub fn session() -> Result<SessionId, ServerFnError> {
        use_context::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<SessionCookie>().cloned())
            .map(|cookie| cookie.0)
            .ok_or_else(|| ServerFnError::new("this request carries no session"))
    }
}

#[server(prefix = "/api/fn", endpoint = "page")]
pub async fn load_page() -> Result<PageState, ServerFnError> {
    let harness = ssr::harness()?;
    let session = ssr::session()?;
    Ok(PageState {
        session: harness.session_view(&session),
        policy: harness.config().permissions.policy,
        model: harness.model_name().to_owned(),
        approval_timeout_secs: harness.config().approval_timeout.as_secs(),
        now_ms: agent::approvals::now_ms(),
        mcp_servers: harness.toolbox().sources(),
    })
}

#[server(prefix = "/api/fn", endpoint = "start_run")]
pub async fn start_run(message: String) -> Result<RunId, ServerFnError> {
    use agent::hub::StartRun;
    use agent::input::StartRunInput;
    use agent::wire::ApprovalMode;

    let harness = ssr::harness()?;
    let session = ssr::session()?;
    let input = StartRunInput::from_json(&serde_json::json!({
        "message": message,
        "sessionId": session.as_str(),
    }))
    .map_err(|errors| ServerFnError::new(errors.to_string()))?;
    let record = harness
        .start(StartRun::new(input, ApprovalMode::Interactive))
        .map_err(|error| ServerFnError::new(error.to_string()))?;
    Ok(record.run_id().clone())
}

#[server(prefix = "/api/fn", endpoint = "decide")]
pub async fn decide_approval(
    run_id: RunId,
    tool_call_id: agent::ids::ToolCallId,
    choice: Choice,
    reason: Option<String>,
) -> Result<(), ServerFnError> {
    use agent::wire::Decision;

    let harness = ssr::harness()?;
    let body = match choice {
        Choice::Approve => serde_json::json!({"decision": "approve"}),
        Choice::ApproveForSession => serde_json::json!({"decision": "approve", "scope": "session"}),
        Choice::Deny => serde_json::json!({"decision": "deny", "reason": reason}),
    };
    let decision =
        Decision::from_json(&body).map_err(|errors| ServerFnError::new(errors.to_string()))?;
    harness
        .decide(&run_id, &tool_call_id, decision)
        .map(|_| ())
        .map_err(|error| ServerFnError::new(error.to_string()))
}

#[server(prefix = "/api/fn", endpoint = "pending")]
pub async fn list_pending(run_id: Option<RunId>) -> Result<Vec<ApprovalRequest>, ServerFnError> {
    Ok(ssr::harness()?.pending(run_id.as_ref()))
}

#[server(prefix = "/api/fn", endpoint = "cancel")]
pub async fn cancel_run(run_id: RunId) -> Result<(), ServerFnError> {
    ssr::harness()?
        .cancel(&run_id)
        .map(|_| ())
        .map_err(|error| ServerFnError::new(error.to_string()))
}
