//! The HTTP API: runs (whole, streamed, or as resources with their own event streams), sessions' event streams,
//! approvals and the audit log.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use agent::harness::{Actor, Harness, RunHandle, StartRun};
use agent::ids::{RunId, SessionId, ToolCallId};
use agent::request_body::StartRunInput;
use agent::store::EncodedEvent;
use agent::view::RunView;
use agent::wire::{ApprovalMode, ApprovalRequest, Decision, RunErrorCode};
use axum::Json;
use axum::extract::{Extension, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde::Serialize;
use serde_json::json;

use crate::body::{JsonValue, Path};
use crate::error::ApiError;
use crate::state::AppState;
use crate::streams::{ClientAddr, StreamPermit, holding};

/// Aborts a run when dropped before the run finished: the client of a streamed run went away.
pub(crate) struct AbortOnDrop {
    run: Option<RunHandle>,
    /// Set once the run's terminal event went out: nothing is left to abort.
    ended: Arc<AtomicBool>,
}

impl AbortOnDrop {
    pub(crate) fn new(run: RunHandle) -> Self {
        Self {
            run: Some(run),
            ended: Arc::new(AtomicBool::new(false)),
        }
    }

    /// What a stream sets when the run's terminal event goes out.
    pub(crate) fn ended(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.ended)
    }

    fn disarm(mut self) {
        self.run = None;
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(run) = self.run.take()
            && !self.ended.load(Ordering::Acquire)
        {
            run.client_gone();
        }
    }
}

/// Whether an event of this `type` ends its run.
pub(crate) fn is_terminal(kind: &str) -> bool {
    agent::harness::is_terminal(kind)
}

fn sse_event(event: &EncodedEvent) -> Event {
    Event::default()
        .event(event.kind)
        .id(event.seq.to_string())
        .data(&*event.json)
}

/// How long an event stream's response waits for its first event before its head goes out alone.
const FIRST_EVENT_WAIT: Duration = Duration::from_millis(5);

/// An event stream as a response that no cache stores, holding its client's place among its open streams until
/// it ends. With `no-cache` alone (axum's default for SSE) Chrome writes the stream into its HTTP cache and makes a
/// second tab's request for the same URL wait on that cache entry until the first stream ends, which for a live
/// stream is never.
///
/// The response waits for the stream's first event, at most [`FIRST_EVENT_WAIT`], so that its head and the events
/// ready by then go out in one write. A run's events come in bursts right after its start (all of a scripted run's,
/// up to its suspension or end), and hyper writes what the body has ready when it is first polled together with the
/// head; returned at once, the head goes out alone, a write (and a TCP segment to the client) more a response.
pub(crate) async fn event_stream(
    events: impl Stream<Item = Event> + Send + 'static,
    permit: StreamPermit,
    keep_alive: Duration,
) -> Response {
    let mut events = Box::pin(holding(events, permit).peekable());
    // A stream with nothing to send yet (a caught-up reader of a waiting run) sends its head after the wait.
    let _ = tokio::time::timeout(FIRST_EVENT_WAIT, events.as_mut().peek()).await;
    let sse =
        Sse::new(events.map(Ok::<_, Infallible>)).keep_alive(KeepAlive::new().interval(keep_alive));
    ([(header::CACHE_CONTROL, "no-store")], sse).into_response()
}

/// A run's events as an SSE response. When `abort_on_close`, closing the connection before the run ended aborts
/// it.
async fn sse_response(
    events: impl Stream<Item = Arc<EncodedEvent>> + Send + 'static,
    abort_on_close: Option<RunHandle>,
    permit: StreamPermit,
    keep_alive: Duration,
) -> Response {
    let guard = abort_on_close.map(AbortOnDrop::new);
    let ended = guard.as_ref().map(AbortOnDrop::ended);
    let events = events.map(move |event| {
        let _guard = &guard;
        if let Some(ended) = &ended
            && is_terminal(event.kind)
        {
            ended.store(true, Ordering::Release);
        }
        sse_event(&event)
    });
    event_stream(events, permit, keep_alive).await
}

fn parse_run_id(raw: &str) -> Result<RunId, ApiError> {
    RunId::parse(raw).map_err(|e| ApiError::bad_id("runId", e))
}

fn parse_call_id(raw: &str) -> Result<ToolCallId, ApiError> {
    ToolCallId::parse(raw).map_err(|e| ApiError::bad_id("toolCallId", e))
}

/// Starts a run from a `{"message", "sessionId"?, "policy"?}` body.
async fn start_run(
    state: &AppState,
    body: &serde_json::Value,
    mode: ApprovalMode,
) -> Result<RunHandle, ApiError> {
    let input = StartRunInput::from_json(body).map_err(ApiError::Invalid)?;
    Ok(state.harness.start(StartRun::new(input, mode)).await?)
}

/// `GET /healthz`: `ok` while the server accepts requests, with this instance's id (one per process start; several
/// instances on one PostgreSQL each have their own) and the store it runs on.
pub async fn healthz(State(state): State<AppState>) -> String {
    format!(
        "ok\ninstance: {}\nstore: {}\n",
        state.harness.store().instance(),
        state.harness.store_kind().as_str()
    )
}

/// The HTTP status for a run that ended in an error.
fn run_error_status(code: RunErrorCode) -> StatusCode {
    match code {
        RunErrorCode::ApprovalRequired => StatusCode::FORBIDDEN,
        RunErrorCode::StepLimit | RunErrorCode::RepeatedCall => StatusCode::UNPROCESSABLE_ENTITY,
        RunErrorCode::Model => StatusCode::BAD_GATEWAY,
        RunErrorCode::Aborted
        | RunErrorCode::Shutdown
        | RunErrorCode::Restarted
        | RunErrorCode::Store => StatusCode::SERVICE_UNAVAILABLE,
        RunErrorCode::EventLimit | RunErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn run_response(view: RunView) -> Response {
    match &view.error {
        None => Json(json!({
            "ok": true,
            "runId": view.run_id,
            "sessionId": view.session_id,
            "answer": view.answer,
            "steps": view.steps,
        }))
        .into_response(),
        Some(failure) => (
            run_error_status(failure.code),
            Json(json!({
                "ok": false,
                "code": failure.code,
                "error": failure.message,
                "runId": view.run_id,
                "sessionId": view.session_id,
                "steps": view.steps,
            })),
        )
            .into_response(),
    }
}

/// `POST /api/agent`: a whole run, no channel to a person, so fail-closed.
pub async fn run_to_end(
    State(state): State<AppState>,
    JsonValue(body): JsonValue,
) -> Result<Response, ApiError> {
    let run = start_run(&state, &body, ApprovalMode::FailClosed).await?;
    // A client that gives up waiting aborts the run.
    let guard = AbortOnDrop::new(run.clone());
    run.finished().await;
    guard.disarm();
    let view = run.view().await?.ok_or_else(|| {
        ApiError::Internal(format!("run {} finished without events", run.run_id()))
    })?;
    Ok(run_response(view))
}

/// `POST /api/agent/stream`: a run streamed as SSE, interactive. Closing the connection aborts it.
pub async fn run_streamed(
    State(state): State<AppState>,
    client: ClientAddr,
    JsonValue(body): JsonValue,
) -> Result<Response, ApiError> {
    // First: a client with too many streams open starts nothing.
    let permit = state.streams.acquire(client)?;
    let run = start_run(&state, &body, ApprovalMode::Interactive).await?;
    let events = run.subscribe(0);
    Ok(sse_response(events, Some(run), permit, state.keep_alive).await)
}

/// `POST /api/agent/runs`: starts an interactive run and returns its id; its events are a separate resource.
pub async fn create_run(
    State(state): State<AppState>,
    JsonValue(body): JsonValue,
) -> Result<Response, ApiError> {
    let run = start_run(&state, &body, ApprovalMode::Interactive).await?;
    let run_id = run.run_id();
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "ok": true,
            "runId": run_id,
            "sessionId": run.session_id(),
            "events": format!("/api/agent/runs/{run_id}/events"),
        })),
    )
        .into_response())
}

async fn find_run(harness: &Harness, raw: &str) -> Result<RunHandle, ApiError> {
    let run_id = parse_run_id(raw)?;
    harness
        .run(&run_id)
        .await?
        .ok_or(ApiError::RunNotFound(agent::harness::RunNotFound(run_id)))
}

/// Where a subscriber resumes: after the `Last-Event-ID` header when the client sends one (EventSource does on
/// reconnect), else after the `after` query parameter, else from the start.
fn resume_point(headers: &HeaderMap, query: &HashMap<String, String>) -> Result<u64, ApiError> {
    let parse = |field: &str, raw: &[u8]| {
        parse_run_event_id(raw)
            .ok_or_else(|| ApiError::field(field, "Expected a non-negative integer event id"))
    };
    if let Some(value) = headers.get("last-event-id") {
        return parse("Last-Event-ID", value.as_bytes());
    }
    match query.get("after") {
        Some(raw) => parse("after", raw.as_bytes()),
        None => Ok(0),
    }
}

/// A run stream's event id (`Last-Event-ID`, `after`): the sequence number of the last event seen, or `None` for
/// anything else. Public so that the fuzz target reaches the very parser the routes use.
pub fn parse_run_event_id(raw: &[u8]) -> Option<u64> {
    std::str::from_utf8(raw.trim_ascii()).ok()?.parse().ok()
}

/// A session stream's event id: `runId:seq`, or `None` for anything else. Public for the fuzz target.
pub fn parse_session_event_id(raw: &[u8]) -> Option<(RunId, u64)> {
    let raw = std::str::from_utf8(raw.trim_ascii()).ok()?;
    let (run, seq) = raw.rsplit_once(':')?;
    Some((RunId::parse(run).ok()?, seq.parse().ok()?))
}

/// `GET /api/agent/runs/{runId}/events`: the run's events from the start or after `Last-Event-ID`, then live.
pub async fn run_events(
    State(state): State<AppState>,
    client: ClientAddr,
    Path(run_id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    only_known(&query, &["after"])?;
    let run = find_run(&state.harness, &run_id).await?;
    // Never after an event the run has not sent: a stream waiting for it would send nothing of the run, not even
    // its end. An id past the end (the last commits lost to a machine's crash, say) resumes after the last event.
    let after = resume_point(&headers, &query)?.min(run.info().last_seq);
    // An ended run read to its end: nothing more will come. 204 tells an EventSource so; a stream that ended at
    // once would have it reconnect every few seconds for as long as its page stays open.
    if !run.info().continues_after(after) {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let permit = state.streams.acquire(client)?;
    Ok(sse_response(run.subscribe(after), None, permit, state.keep_alive).await)
}

/// Where a session follower resumes: after the `runId:seq` of `Last-Event-ID`, else after the `run` and `after`
/// query parameters, else from the session's first remembered run.
fn session_resume_point(
    headers: &HeaderMap,
    query: &HashMap<String, String>,
) -> Result<Option<(RunId, u64)>, ApiError> {
    if let Some(value) = headers.get("last-event-id") {
        return parse_session_event_id(value.as_bytes())
            .map(Some)
            .ok_or_else(|| {
                ApiError::field(
                    "Last-Event-ID",
                    "Expected runId:seq, as sent in the stream's ids",
                )
            });
    }
    match query.get("run") {
        Some(run) => Ok(Some((
            parse_run_id(run)?,
            resume_point(&HeaderMap::new(), query)?,
        ))),
        None => Ok(None),
    }
}

/// `GET /api/agent/sessions/{sessionId}/events`: a session's events run after run, including runs that start
/// later. Ids are `runId:seq`. The browser follows its session with this, so every tab sees every run.
pub async fn session_events(
    State(state): State<AppState>,
    client: ClientAddr,
    Path(session_id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let session_id = SessionId::parse(session_id).map_err(|e| ApiError::bad_id("sessionId", e))?;
    only_known(&query, &["run", "after"])?;
    if query.contains_key("after") && !query.contains_key("run") {
        return Err(ApiError::field(
            "after",
            "A session stream resumes after an event of a run: give its run too (run=ID&after=SEQ)",
        ));
    }
    let mut resume = session_resume_point(&headers, &query)?;
    // A run of the session is resumed after an event it sent at the latest, as on the run's own stream.
    if let Some((run_id, after)) = &mut resume
        && let Some(run) = state.harness.run(run_id).await?
        && run.info().session_id == session_id
    {
        *after = (*after).min(run.info().last_seq);
    }
    let permit = state.streams.acquire(client)?;
    let events = state
        .harness
        .session_events(&session_id, resume)
        .map(|(run_id, event)| {
            Event::default()
                .event(event.kind)
                .id(format!("{run_id}:{}", event.seq))
                .data(&*event.json)
        });
    Ok(event_stream(events, permit, state.keep_alive).await)
}

/// `GET /api/agent/runs/{runId}`: the run as a viewer sees it now.
pub async fn get_run(
    State(state): State<AppState>,
    Path(run_id): Path<String>,
) -> Result<Response, ApiError> {
    let run = find_run(&state.harness, &run_id).await?;
    let view = run.view().await?;
    Ok(Json(json!({"ok": true, "run": view})).into_response())
}

/// `POST /api/agent/runs/{runId}/cancel`: aborts the run.
pub async fn cancel_run(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Path(run_id): Path<String>,
) -> Result<Response, ApiError> {
    let run_id = parse_run_id(&run_id)?;
    let cancelled = state.harness.cancel(&run_id, &actor).await?;
    let status = if cancelled.run.state.is_finished() {
        "finished"
    } else {
        "cancelling"
    };
    Ok(Json(json!({"ok": true, "runId": run_id, "status": status})).into_response())
}

/// Refuses a query parameter the route does not read: a filter misspelt (`runid`) must not quietly become no filter
/// (every run's approvals, a stream from its start).
fn only_known(query: &HashMap<String, String>, known: &[&str]) -> Result<(), ApiError> {
    match query.keys().find(|key| !known.contains(&key.as_str())) {
        Some(unknown) => Err(ApiError::field(
            unknown,
            format!(
                "Unknown query parameter; this route reads {}",
                known.join(", ")
            ),
        )),
        None => Ok(()),
    }
}

/// `GET /api/agent/approvals?runId=...`: pending approvals, of one run or of all.
pub async fn list_approvals(
    State(state): State<AppState>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    only_known(&query, &["runId"])?;
    let run_id = query
        .get("runId")
        .map(|raw| parse_run_id(raw))
        .transpose()?;
    let pending = state.harness.pending(run_id.as_ref()).await?;
    Ok(Json(Listing { ok: true, pending }).into_response())
}

/// The body of `GET /api/agent/approvals`, written straight into the response's bytes: through `json!` a listing of
/// 10,000 approvals first became a tree of values several times the size of its text.
#[derive(Serialize)]
struct Listing {
    ok: bool,
    pending: Vec<ApprovalRequest>,
}

/// `POST /api/agent/approvals/{runId}/{toolCallId}`: a person's decision.
pub async fn decide(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Path((run_id, tool_call_id)): Path<(String, String)>,
    JsonValue(body): JsonValue,
) -> Result<Response, ApiError> {
    let run_id = parse_run_id(&run_id)?;
    let tool_call_id = parse_call_id(&tool_call_id)?;
    let decision = Decision::from_json(&body).map_err(ApiError::Invalid)?;
    let resolved = state
        .harness
        .decide(&run_id, &tool_call_id, decision, &actor)
        .await?;
    Ok(Json(json!({
        "ok": true,
        "pending": resolved.pending,
        "resolution": resolved.resolution,
    }))
    .into_response())
}

/// The most audit entries one page holds.
const AUDIT_PAGE_MAX: usize = 1_000;

/// `GET /api/audit?sessionId=&runId=&tool=&outcome=&since=&until=&after=&limit=`: the audit log, oldest first,
/// a page at a time; `next` is the `after` of the next page (none at the end).
pub async fn audit_log(
    State(state): State<AppState>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    only_known(
        &query,
        &[
            "sessionId",
            "runId",
            "tool",
            "outcome",
            "since",
            "until",
            "after",
            "limit",
        ],
    )?;
    let time = |field: &str| {
        query
            .get(field)
            .map(|raw| {
                crate::config::parse_time(raw).map_err(|error| ApiError::field(field, error))
            })
            .transpose()
    };
    let number = |field: &str| {
        query
            .get(field)
            .map(|raw| {
                raw.parse::<u64>()
                    .map_err(|_| ApiError::field(field, "Expected a non-negative integer"))
            })
            .transpose()
    };
    // A page of none, or of more than a page holds, is a mistake worth saying, not a page of another size.
    let limit = match number("limit")? {
        None => 100,
        Some(limit) if (1..=AUDIT_PAGE_MAX as u64).contains(&limit) => limit as usize,
        Some(_) => {
            return Err(ApiError::field(
                "limit",
                format!("Expected 1 to {AUDIT_PAGE_MAX} entries a page"),
            ));
        }
    };
    let filter = agent::store::AuditQuery {
        session_id: query
            .get("sessionId")
            .map(|raw| SessionId::parse(raw.as_str()).map_err(|e| ApiError::bad_id("sessionId", e)))
            .transpose()?,
        sessions_or_none: None,
        run_id: query
            .get("runId")
            .map(|raw| parse_run_id(raw))
            .transpose()?,
        tool: query.get("tool").cloned(),
        outcome: query.get("outcome").cloned(),
        since: time("since")?,
        until: time("until")?,
        after_id: number("after")?,
        // The API pages oldest first, on from `after`.
        before_id: None,
        newest_first: false,
        limit,
    };
    let entries = state.harness.audit_log(filter).await?;
    let next = (entries.len() == limit)
        .then(|| entries.last().map(|entry| entry.id))
        .flatten();
    Ok(Json(json!({"ok": true, "entries": entries, "next": next})).into_response())
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt as _;

    use super::*;
    use crate::streams::StreamLimit;

    /// What hyper does right after it wrote a response's head: it polls the body once, and writes what is ready
    /// with the head. A stream whose first event comes soon after the response is made has it ready then.
    #[tokio::test]
    async fn a_stream_has_its_first_event_ready_when_the_head_goes_out() {
        let limit = StreamLimit::new(1);
        let permit = limit
            .acquire(ClientAddr("127.0.0.1".parse().unwrap()))
            .unwrap();
        let events = futures::stream::once(async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            Event::default().data("first")
        });
        let mut body = event_stream(events, permit, Duration::from_secs(15))
            .await
            .into_body();
        let frame = futures::FutureExt::now_or_never(body.frame())
            .expect("the first event is ready at the body's first poll")
            .expect("a frame")
            .expect("no error");
        assert_eq!(frame.into_data().unwrap(), "data: first\n\n");
    }
}
