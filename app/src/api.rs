//! Server functions for the browser: load the page, start a run, decide an approval, list pending approvals, cancel
//! a run. They reach the same harness as the REST routes, through context the server provides, and act only on the
//! caller's own session (the one its cookie names): another session's runs and approvals are as good as unknown.

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
    /// Whether the person logged in (the server has an access token), so the page offers to log out.
    pub logged_in: bool,
    /// The MCP servers and their state when the page was rendered.
    #[serde(default)]
    pub mcp_servers: Vec<McpServerStatus>,
}

/// What the person decided on a card.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Choice {
    Approve,
    /// What the card's `session` choice covers (the same command, the file tool in the workspace, ...).
    ApproveForSession,
    /// `run_command` only: this program with any arguments, for the session.
    ApproveProgramForSession,
    Deny,
}

#[cfg(feature = "ssr")]
pub mod ssr {
    //! What server functions need from the server: the harness and the browser's session.

    use agent::harness::{Harness, RunHandle};
    use agent::ids::{RunId, SessionId};
    use axum::http::StatusCode;
    use leptos::prelude::*;
    use leptos_axum::ResponseOptions;

    /// The browser's session, from its cookie; the server puts it in each request's extensions.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct SessionCookie(pub SessionId);

    /// The name of the cookie that holds the session id.
    pub const SESSION_COOKIE: &str = "toolgate_session";

    /// Whether people log in to this server (it was started with an access token); the server provides it.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct LoginRequired(pub bool);

    pub fn harness() -> Result<Harness, ServerFnError> {
        use_context::<Harness>().ok_or_else(|| ServerFnError::new("the server provides no harness"))
    }

    pub fn session() -> Result<SessionId, ServerFnError> {
        use_context::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<SessionCookie>().cloned())
            .map(|cookie| cookie.0)
            .ok_or_else(|| ServerFnError::new("this request carries no session"))
    }

    pub fn login_required() -> bool {
        use_context::<LoginRequired>().is_some_and(|required| required.0)
    }

    /// The run, when it is one of `session`'s.
    pub async fn own_run(
        harness: &Harness,
        session: &SessionId,
        run_id: &RunId,
    ) -> Result<Option<RunHandle>, ServerFnError> {
        Ok(harness
            .run(run_id)
            .await
            .map_err(|error| ServerFnError::new(error.to_string()))?
            .filter(|run| run.session_id() == session))
    }

    /// Who is acting, as the server's authentication layer said.
    pub fn actor() -> Result<agent::harness::Actor, ServerFnError> {
        use_context::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<agent::harness::Actor>().cloned())
            .ok_or_else(|| ServerFnError::new("this request was not authenticated"))
    }

    /// A 404 with `message`: what the caller learns about something that is not its own, the same as about
    /// something that does not exist.
    pub fn not_found(message: String) -> ServerFnError {
        if let Some(response) = use_context::<ResponseOptions>() {
            response.set_status(StatusCode::NOT_FOUND);
        }
        ServerFnError::new(message)
    }
}

#[server(prefix = "/api/fn", endpoint = "page")]
pub async fn load_page() -> Result<PageState, ServerFnError> {
    let harness = ssr::harness()?;
    let session = ssr::session()?;
    Ok(PageState {
        session: harness
            .session_view(&session)
            .await
            .map_err(|error| ServerFnError::new(error.to_string()))?,
        policy: harness.config().permissions.policy,
        model: harness.model_name().to_owned(),
        approval_timeout_secs: harness.config().approval_timeout.as_secs(),
        now_ms: agent::clock::now_ms(),
        logged_in: ssr::login_required(),
        mcp_servers: harness.toolbox().sources(),
    })
}

#[server(prefix = "/api/fn", endpoint = "start_run")]
pub async fn start_run(message: String) -> Result<RunId, ServerFnError> {
    use agent::harness::StartRun;
    use agent::request_body::StartRunInput;
    use agent::wire::ApprovalMode;

    let harness = ssr::harness()?;
    let session = ssr::session()?;
    let input = StartRunInput::from_json(&serde_json::json!({
        "message": message,
        "sessionId": session.as_str(),
    }))
    .map_err(|errors| ServerFnError::new(errors.to_string()))?;
    let run = harness
        .start(StartRun::new(input, ApprovalMode::Interactive))
        .await
        .map_err(|error| ServerFnError::new(error.to_string()))?;
    Ok(run.run_id().clone())
}

#[server(prefix = "/api/fn", endpoint = "decide")]
pub async fn decide_approval(
    run_id: RunId,
    tool_call_id: agent::ids::ToolCallId,
    choice: Choice,
    reason: Option<String>,
) -> Result<(), ServerFnError> {
    use agent::approvals::ApprovalNotFound;
    use agent::wire::Decision;

    let harness = ssr::harness()?;
    let session = ssr::session()?;
    if ssr::own_run(&harness, &session, &run_id).await?.is_none() {
        return Err(ssr::not_found(
            ApprovalNotFound {
                run_id,
                tool_call_id,
            }
            .to_string(),
        ));
    }
    let body = match choice {
        Choice::Approve => serde_json::json!({"decision": "approve"}),
        Choice::ApproveForSession => serde_json::json!({"decision": "approve", "scope": "session"}),
        Choice::ApproveProgramForSession => {
            serde_json::json!({"decision": "approve", "scope": "session_program"})
        }
        Choice::Deny => serde_json::json!({"decision": "deny", "reason": reason}),
    };
    let decision =
        Decision::from_json(&body).map_err(|errors| ServerFnError::new(errors.to_string()))?;
    harness
        .decide(&run_id, &tool_call_id, decision, &ssr::actor()?)
        .await
        .map(|_| ())
        .map_err(|error| ServerFnError::new(error.to_string()))
}

/// The caller's session's pending approvals, of one of its runs or of all.
#[server(prefix = "/api/fn", endpoint = "pending")]
pub async fn list_pending(run_id: Option<RunId>) -> Result<Vec<ApprovalRequest>, ServerFnError> {
    let harness = ssr::harness()?;
    let session = ssr::session()?;
    let pending = harness
        .pending(run_id.as_ref())
        .await
        .map_err(|error| ServerFnError::new(error.to_string()))?;
    let mut own = Vec::with_capacity(pending.len());
    for request in pending {
        if ssr::own_run(&harness, &session, &request.run_id)
            .await?
            .is_some()
        {
            own.push(request);
        }
    }
    Ok(own)
}

#[server(prefix = "/api/fn", endpoint = "cancel")]
pub async fn cancel_run(run_id: RunId) -> Result<(), ServerFnError> {
    use agent::harness::RunNotFound;

    let harness = ssr::harness()?;
    let session = ssr::session()?;
    if ssr::own_run(&harness, &session, &run_id).await?.is_none() {
        return Err(ssr::not_found(RunNotFound(run_id).to_string()));
    }
    harness
        .cancel(&run_id)
        .await
        .map(|_| ())
        .map_err(|error| ssr::not_found(error.to_string()))
}
