//! Server functions for the browser: load the page, start a run, decide an approval, list pending approvals, cancel
//! a run, list the browser's conversations, read the audit log. They reach the same harness as the REST routes,
//! through context the server provides, and act only on the browser's own sessions: the one its cookie names (when
//! a call names none) or another of the sessions its cookies list (when it names one). Another browser's runs and
//! approvals are as good as unknown. A server with an access token trusts whoever logged in with every session.

use agent::ids::{RunId, SessionId};
use agent::view::SessionView;
use agent::wire::{ApprovalPolicy, ApprovalRequest, McpServerStatus};
use leptos::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A conversation as the sidebar lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Conversation {
    pub session_id: SessionId,
    /// The first message, shortened; empty for a conversation with no message yet.
    pub title: String,
    /// Milliseconds since the Unix epoch.
    pub updated_at: u64,
    pub runs: u64,
}

/// One line of the audit log, as the audit view shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditLine {
    pub id: u64,
    /// Milliseconds since the Unix epoch.
    pub at: u64,
    /// What the entry is about: `approval_requested`, `approval_resolved`, ...
    pub kind: String,
    pub session_id: Option<SessionId>,
    pub run_id: Option<RunId>,
    pub tool_call_id: Option<String>,
    pub tool: Option<String>,
    pub outcome: String,
    pub source: Option<String>,
    pub scope: Option<String>,
    pub reason: Option<String>,
    pub actor: Option<String>,
    /// The call ran with arguments a person edited.
    pub edited: bool,
}

/// A tool's name and the JSON Schema its input must satisfy: what the page checks edited arguments against.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolInput {
    pub name: String,
    pub input_schema: Value,
}

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
    /// Every tool's input schema, to check edited arguments before they are sent.
    pub tools: Vec<ToolInput>,
    /// The browser's conversations, most recent first.
    pub sessions: Vec<Conversation>,
    /// Something the person should know about how the page was opened (a conversation it could not switch to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
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

/// What a client is told when the database did not answer, on every route (the REST API's words too); what the
/// database said goes to the log.
pub const UNAVAILABLE: &str =
    "The server cannot reach its database right now; nothing was changed. Try again shortly.";

/// Why "Always allow" added its rule and did not approve the call: the database did not take the approval (the rule
/// is in force; what the database said goes to the log).
pub const APPROVAL_NOT_RECORDED: &str = "the approval could not be recorded, as the server cannot reach its database right now. Approve the card again shortly.";

/// What a client is told of a failure inside the server, on every route; the detail goes to the log.
pub const INTERNAL: &str = "Internal server error.";

#[cfg(feature = "ssr")]
pub mod ssr {
    //! What server functions need from the server: the harness and the browser's session.

    use agent::harness::{Harness, RunHandle};
    use agent::ids::{RunId, SessionId, ToolCallId};
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
        extension::<SessionCookie>()
            .map(|cookie| cookie.0)
            .ok_or_else(|| ServerFnError::new("this request carries no session"))
    }

    /// The session a call acts on: `named` when the browser may act on it, otherwise the one its cookie names. A
    /// session the browser may not act on is answered as if it held nothing (`None`).
    pub fn acting_session(named: Option<SessionId>) -> Result<Option<SessionId>, ServerFnError> {
        let current = session()?;
        Ok(match named {
            None => Some(current),
            Some(named) if named == current || may_open(&named) => Some(named),
            Some(_) => None,
        })
    }

    /// Whether this browser may open and act on `session`: one of the sessions its cookies list, or any session
    /// when people log in to this server (whoever has the token may see every conversation).
    pub fn may_open(session: &SessionId) -> bool {
        login_required()
            || extension::<BrowserSessions>().is_some_and(|known| known.0.contains(session))
    }

    /// [`acting_session`], with a session the browser may not act on refused as a 404: what the caller learns about
    /// another browser's conversation is what it learns about one that does not exist.
    pub fn acting_session_or_404(named: Option<SessionId>) -> Result<SessionId, ServerFnError> {
        acting_session(named)?
            .ok_or_else(|| not_found("This conversation is not one of this browser's.".to_owned()))
    }

    /// The sessions this browser may see without a login: those its cookies list, and the current one.
    pub fn own_sessions() -> Result<Vec<SessionId>, ServerFnError> {
        let mut own = extension::<BrowserSessions>().unwrap_or_default().0;
        let current = session()?;
        if !own.contains(&current) {
            own.push(current);
        }
        Ok(own)
    }

    /// The sessions this browser created or opened, from its cookies; the server puts them in each request's
    /// extensions.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct BrowserSessions(pub Vec<SessionId>);

    /// The name of the cookie that lists the browser's sessions.
    pub const SESSIONS_COOKIE: &str = "toolgate_sessions";

    /// What the server tells the page about the session it opened for this request (a `?session=` it refused).
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct SessionNotice(pub String);

    fn extension<T: Clone + Send + Sync + 'static>() -> Option<T> {
        use_context::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<T>().cloned())
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
            .map_err(|error| unavailable(error.to_string()))?
            .filter(|run| run.session_id() == session))
    }

    /// Who is acting, as the server's authentication layer said.
    pub fn actor() -> Result<agent::harness::Actor, ServerFnError> {
        extension::<agent::harness::Actor>()
            .ok_or_else(|| ServerFnError::new("this request was not authenticated"))
    }

    pub fn notice() -> Option<String> {
        extension::<SessionNotice>().map(|notice| notice.0)
    }

    /// The summaries of the sessions this browser may open, most recent first; the current one first of all when it
    /// has no run yet (a new conversation), so the page always lists what it shows.
    pub async fn browser_sessions(
        harness: &Harness,
        current: &SessionId,
    ) -> Result<Vec<super::Conversation>, ServerFnError> {
        /// Sessions the sidebar lists at most, for a person logged in (who may open any).
        const LISTED: usize = 200;
        // A browser's own sessions are read by their ids: among the server's most recent ones, those of other
        // clients (REST and AG-UI runs, other browsers) would push them out of the list.
        let all = if login_required() {
            harness.sessions(LISTED).await
        } else {
            let own = extension::<BrowserSessions>().unwrap_or_default().0;
            let ids: Vec<SessionId> = own.into_iter().chain([current.clone()]).collect();
            harness.sessions_among(&ids).await
        }
        .map_err(|error| unavailable(error.to_string()))?;
        let as_listed = |summary: agent::store::SessionSummary| super::Conversation {
            session_id: summary.session_id,
            title: summary.title,
            updated_at: summary.updated_at,
            runs: summary.runs,
        };
        let mut listed: Vec<_> = all.into_iter().map(as_listed).collect();
        if !listed.iter().any(|summary| &summary.session_id == current) {
            // Not among the most recent the server lists (for a person logged in, other clients' sessions may be
            // newer), or new (without a login it was looked up by its id already): listed first, as it is when it
            // has runs.
            let held = if login_required() {
                harness
                    .sessions_among(std::slice::from_ref(current))
                    .await
                    .map_err(|error| unavailable(error.to_string()))?
            } else {
                Vec::new()
            };
            let conversation =
                held.into_iter()
                    .next()
                    .map(as_listed)
                    .unwrap_or_else(|| super::Conversation {
                        session_id: current.clone(),
                        title: String::new(),
                        updated_at: agent::clock::now_ms(),
                        runs: 0,
                    });
            listed.insert(0, conversation);
        }
        Ok(listed)
    }

    /// A 404 with `message`: what the caller learns about something that is not its own, the same as about
    /// something that does not exist.
    pub fn not_found(message: String) -> ServerFnError {
        failed_with(StatusCode::NOT_FOUND, message)
    }

    /// A 503: the database did not answer (a full disk, a failover); the caller may try again. As on the REST API,
    /// the `detail` (the database's own words, naming its tables) goes to the log, not to the browser.
    pub fn unavailable(detail: String) -> ServerFnError {
        tracing::error!(%detail, "the store is unavailable");
        failed_with(
            StatusCode::SERVICE_UNAVAILABLE,
            super::UNAVAILABLE.to_owned(),
        )
    }

    /// A 500: a failure inside the server, whose `detail` goes to the log.
    fn internal(detail: String) -> ServerFnError {
        tracing::error!(%detail, "internal error");
        failed_with(
            StatusCode::INTERNAL_SERVER_ERROR,
            super::INTERNAL.to_owned(),
        )
    }

    /// The server function's error `message`, answered with `status`.
    fn failed_with(status: StatusCode, message: String) -> ServerFnError {
        if let Some(response) = use_context::<ResponseOptions>() {
            response.set_status(status);
        }
        ServerFnError::new(message)
    }

    /// A 400 with `message`: what the caller sent cannot be used as it is.
    pub fn invalid(message: String) -> ServerFnError {
        failed_with(StatusCode::BAD_REQUEST, message)
    }

    /// A refused start, with the status every route gives it ([`StartError::refusal`]).
    pub fn start_refused(error: &agent::harness::StartError) -> ServerFnError {
        match error {
            agent::harness::StartError::Unavailable(detail) => unavailable(detail.clone()),
            _ => failed_with(status(error.refusal().0), error.to_string()),
        }
    }

    /// A refused change of the rules, with the rules API's status.
    pub fn rules_refused(error: &agent::policy::RuleBookError) -> ServerFnError {
        use agent::policy::RuleBookError;
        match error {
            RuleBookError::Store(store) => unavailable(store.to_string()),
            // It names a row of the database.
            RuleBookError::Stored { .. } => internal(error.to_string()),
            _ => failed_with(status(error.status()), error.to_string()),
        }
    }

    /// A refused decision, with the approval API's status.
    pub fn decide_refused(error: &agent::harness::DecideError) -> ServerFnError {
        match error {
            agent::harness::DecideError::Unavailable(store) => unavailable(store.to_string()),
            _ => failed_with(status(error.status()), error.to_string()),
        }
    }

    fn status(code: u16) -> StatusCode {
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// The approval API's 404 for a call: what another browser's approval looks like too.
    pub fn approval_not_found(run_id: &RunId, tool_call_id: &ToolCallId) -> ServerFnError {
        not_found(
            agent::approvals::ApprovalNotFound {
                run_id: run_id.clone(),
                tool_call_id: tool_call_id.clone(),
            }
            .to_string(),
        )
    }

    /// Where a decision on a call of `run_id` acts: the session the page names, when it is one of this browser's
    /// and the run is one of its runs; otherwise the approval API's 404, as if the approval were unknown.
    pub async fn deciding_session(
        harness: &Harness,
        named: Option<SessionId>,
        run_id: &RunId,
        tool_call_id: &ToolCallId,
    ) -> Result<SessionId, ServerFnError> {
        let Some(session) = acting_session(named)? else {
            return Err(approval_not_found(run_id, tool_call_id));
        };
        if own_run(harness, &session, run_id).await?.is_none() {
            return Err(approval_not_found(run_id, tool_call_id));
        }
        Ok(session)
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
            .map_err(|error| ssr::unavailable(error.to_string()))?,
        policy: harness.config().permissions.policy,
        model: harness.model_name().to_owned(),
        approval_timeout_secs: harness.config().approval_timeout.as_secs(),
        now_ms: agent::clock::now_ms(),
        logged_in: ssr::login_required(),
        tools: harness
            .toolbox()
            .specs()
            .iter()
            .map(|spec| ToolInput {
                name: spec.name.clone(),
                input_schema: spec.input_schema.clone(),
            })
            .collect(),
        sessions: ssr::browser_sessions(&harness, &session).await?,
        notice: ssr::notice(),
        mcp_servers: harness.toolbox().sources(),
    })
}

/// The browser's conversations, most recent first (every conversation, for a person logged in with the token).
#[server(prefix = "/api/fn", endpoint = "sessions")]
pub async fn list_sessions(session: Option<SessionId>) -> Result<Vec<Conversation>, ServerFnError> {
    let harness = ssr::harness()?;
    let current = match ssr::acting_session(session)? {
        Some(session) => session,
        None => ssr::session()?,
    };
    ssr::browser_sessions(&harness, &current).await
}

#[server(prefix = "/api/fn", endpoint = "start_run")]
pub async fn start_run(
    message: String,
    session: Option<SessionId>,
) -> Result<RunId, ServerFnError> {
    use agent::harness::StartRun;
    use agent::request_body::StartRunInput;
    use agent::wire::ApprovalMode;

    let harness = ssr::harness()?;
    let session = ssr::acting_session_or_404(session)?;
    let input = StartRunInput::from_json(&serde_json::json!({
        "message": message,
        "sessionId": session.as_str(),
    }))
    .map_err(|errors| ssr::invalid(errors.to_string()))?;
    let run = harness
        .start(StartRun::new(input, ApprovalMode::Interactive))
        .await
        .map_err(|error| ssr::start_refused(&error))?;
    Ok(run.run_id().clone())
}

/// Decides a pending approval of one of the browser's sessions. `arguments`, on approve, is the JSON text of the
/// arguments a person edited; the server checks it against the tool's schema again. `keep_waiting`, with an
/// approval for the session, is the JSON list of the run's other tool call ids that the grant should not approve
/// (the cards the page is editing, has a reason typed on, or has a decision on its way for).
#[server(prefix = "/api/fn", endpoint = "decide")]
pub async fn decide_approval(
    run_id: RunId,
    tool_call_id: agent::ids::ToolCallId,
    choice: Choice,
    reason: Option<String>,
    arguments: Option<String>,
    session: Option<SessionId>,
    keep_waiting: Option<String>,
) -> Result<(), ServerFnError> {
    use agent::wire::Decision;

    let harness = ssr::harness()?;
    ssr::deciding_session(&harness, session, &run_id, &tool_call_id).await?;
    let edited = match (&choice, arguments) {
        (Choice::Deny, _) | (_, None) => None,
        (_, Some(text)) => Some(serde_json::from_str::<Value>(&text).map_err(|error| {
            ssr::invalid(format!("The edited arguments are not JSON: {error}"))
        })?),
    };
    let mut body = match choice {
        Choice::Approve => serde_json::json!({"decision": "approve"}),
        Choice::ApproveForSession => serde_json::json!({"decision": "approve", "scope": "session"}),
        Choice::ApproveProgramForSession => {
            serde_json::json!({"decision": "approve", "scope": "session_program"})
        }
        Choice::Deny => serde_json::json!({"decision": "deny", "reason": reason}),
    };
    if let Some(edited) = edited {
        body["arguments"] = edited;
    }
    let decision = Decision::from_json(&body).map_err(|errors| ssr::invalid(errors.to_string()))?;
    // The cards of the run this page keeps waiting (being edited, a reason being written): an approval for the
    // session approves the others it covers, not these.
    let kept: Vec<agent::ids::ToolCallId> = match keep_waiting {
        Some(ids) => serde_json::from_str(&ids).map_err(|error| {
            ssr::invalid(format!(
                "keep_waiting is not a list of tool call ids: {error}"
            ))
        })?,
        None => Vec::new(),
    };
    harness
        .decide_keeping(&run_id, &tool_call_id, decision, &ssr::actor()?, &kept)
        .await
        .map(|_| ())
        .map_err(|error| ssr::decide_refused(&error))
}

/// The caller's session's pending approvals, of one of its runs or of all.
#[server(prefix = "/api/fn", endpoint = "pending")]
pub async fn list_pending(
    run_id: Option<RunId>,
    session: Option<SessionId>,
) -> Result<Vec<ApprovalRequest>, ServerFnError> {
    let harness = ssr::harness()?;
    // Refused, not answered as empty: a page of a conversation this browser no longer lists (its cookies cleared,
    // or past the conversations they keep) would take an empty list for its cards' having been decided.
    let session = ssr::acting_session_or_404(session)?;
    // Read by the session (or the one run, once it is known to be the session's): a page that reconnects reads
    // its own approvals, not every session's.
    let pending = match &run_id {
        Some(run_id) => {
            if ssr::own_run(&harness, &session, run_id).await?.is_none() {
                return Ok(Vec::new());
            }
            harness.pending(Some(run_id)).await
        }
        None => harness.pending_in_session(&session).await,
    };
    pending.map_err(|error| ssr::unavailable(error.to_string()))
}

/// How far the server holds a run of the caller's session, for a page that reconnected: whether the stream can
/// still bring what the page lacks of the run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunAsHeld {
    /// Its log is complete.
    pub finished: bool,
    /// The sequence number of its newest event.
    pub last_seq: u64,
    /// The fingerprint of its event numbered as the page asked ([`agent::wire::event_fingerprint`]), if its log has
    /// one.
    pub fingerprint: Option<u64>,
}

/// How far the server holds run `run_id` of the caller's session, with the fingerprint of its event numbered `seen`;
/// `None` when it does not hold it (a server that kept nothing across its restart, a `memory` store; or a run pruned
/// since it ended). A page that reconnected asks about the run it waits for: no event will ever end a run the server
/// does not hold, and the stream cannot mend a view the log no longer bears out (a machine crash lost the server's
/// last writes, and the events it wrote since have numbers the page has seen).
#[server(prefix = "/api/fn", endpoint = "run_progress")]
pub async fn run_progress(
    run_id: RunId,
    seen: u64,
    session: Option<SessionId>,
) -> Result<Option<RunAsHeld>, ServerFnError> {
    let harness = ssr::harness()?;
    let session = ssr::acting_session_or_404(session)?;
    let Some(run) = ssr::own_run(&harness, &session, &run_id).await? else {
        return Ok(None);
    };
    let fingerprint = run
        .event(seen)
        .await
        .map_err(|error| ssr::unavailable(error.to_string()))?
        .map(|event| agent::wire::event_fingerprint(&event.json));
    Ok(Some(RunAsHeld {
        finished: run.info().state.is_finished(),
        last_seq: run.info().last_seq,
        fingerprint,
    }))
}

#[server(prefix = "/api/fn", endpoint = "cancel")]
pub async fn cancel_run(run_id: RunId, session: Option<SessionId>) -> Result<(), ServerFnError> {
    use agent::harness::{CancelError, RunNotFound};

    let harness = ssr::harness()?;
    let Some(session) = ssr::acting_session(session)? else {
        return Err(ssr::not_found(RunNotFound(run_id).to_string()));
    };
    if ssr::own_run(&harness, &session, &run_id).await?.is_none() {
        return Err(ssr::not_found(RunNotFound(run_id).to_string()));
    }
    harness
        .cancel(&run_id, &ssr::actor()?)
        .await
        .map(|_| ())
        .map_err(|error| match error {
            CancelError::NotFound(unknown) => ssr::not_found(unknown.to_string()),
            CancelError::Unavailable(unavailable) => ssr::unavailable(unavailable.to_string()),
        })
}

/// The most audit entries one call returns.
pub const AUDIT_PAGE: usize = 500;

/// Entries of the audit log, newest last: of the browser's sessions, or of every session for a person logged in
/// with the token.
///
/// Each filter is optional: a conversation, a run, a tool, an outcome, and a time range in milliseconds since the
/// Unix epoch (`since` inclusive, `until` exclusive).
#[server(prefix = "/api/fn", endpoint = "audit")]
pub async fn audit_log(
    session: Option<SessionId>,
    run: Option<RunId>,
    tool: Option<String>,
    outcome: Option<String>,
    since: Option<u64>,
    until: Option<u64>,
) -> Result<Vec<AuditLine>, ServerFnError> {
    use agent::store::AuditQuery;

    let harness = ssr::harness()?;
    if let Some(session) = &session
        && !ssr::may_open(session)
        && Some(session) != ssr::session().ok().as_ref()
    {
        return Ok(Vec::new());
    }
    // Without a login, a browser sees its own conversations' entries, and those of no session (a rule added or
    // removed: about the server as a whole, which the rules panel shows every browser anyway), read as one query:
    // however many entries other clients' sessions have, the newest page of its own is found.
    let sessions_or_none = if ssr::login_required() {
        None
    } else {
        Some(ssr::own_sessions()?)
    };
    let entries = harness
        .audit_log(AuditQuery {
            session_id: session,
            sessions_or_none,
            run_id: run,
            tool: tool.filter(|tool| !tool.is_empty()),
            outcome: outcome.filter(|outcome| !outcome.is_empty()),
            since,
            until,
            after_id: None,
            before_id: None,
            newest_first: true,
            limit: AUDIT_PAGE,
        })
        .await
        .map_err(|error| ssr::unavailable(error.to_string()))?;
    // Shown oldest first, as before.
    Ok(entries
        .into_iter()
        .rev()
        .map(|entry| AuditLine {
            id: entry.id,
            at: entry.at,
            kind: entry.kind.as_str().to_owned(),
            session_id: entry.session_id,
            run_id: entry.run_id,
            tool_call_id: entry.tool_call_id.map(|id| id.to_string()),
            tool: entry.tool,
            outcome: entry.outcome,
            source: entry.source,
            scope: entry.scope,
            reason: entry.reason,
            actor: entry.actor,
            edited: entry.edited_digest.is_some(),
        })
        .collect())
}
