//! `POST /api/agui`: the AG-UI protocol, with approvals as interrupts.
//!
//! A run that meets a call needing a person ends with `RUN_FINISHED` whose outcome is `interrupt`; the client
//! answers in a new run with a `resume` batch (and, when it says so, the interrupted run as `parentRunId`). The
//! server keeps what it issued and checks the whole batch before anything executes (see [`resume`]); a refused
//! resume is an HTTP 4xx with a machine-readable `code` (the API's one error shape), and executes nothing.

pub mod events;
pub mod resume;
pub mod run_input;

use std::collections::HashSet;

use agent::clock::now_ms;
use agent::harness::{RunSource, StartError, StartRun};
use agent::store::{AuditEntry, AuditKind, TakeError};
use agent::wire::{ApprovalMode, Message};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::response::sse::Event;
use futures::StreamExt;

use agent::harness::Actor;
use axum::extract::Extension;

use crate::api::{AbortOnDrop, event_stream, is_terminal};
use crate::body::JsonBody;
use crate::error::{ApiError, Refusal};
use crate::state::AppState;
use crate::streams::ClientAddr;
use events::Translator;
use run_input::RunInput;

/// What a request starts: the run's source and message, and how many of the conversation's first messages the
/// client already has (for the closing snapshot).
struct Plan {
    source: RunSource,
    message: String,
    known: usize,
    resumed: HashSet<agent::ids::ToolCallId>,
}

/// A store that cannot be read refuses the request; nothing started. What the database said goes to the log, not to
/// the client (it may name tables, rows or the database's own words).
fn unavailable(error: impl std::fmt::Display) -> ApiError {
    tracing::warn!(%error, "an AG-UI request was refused: the store cannot be read");
    Refusal::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "STORE_UNAVAILABLE",
        app::api::UNAVAILABLE,
    )
    .into()
}

/// A new run's plan. An interrupt the thread waits on refuses the run in its start (`THREAD_INTERRUPTED`), checked
/// with the thread's claim.
fn plan_new_run(input: &RunInput) -> Result<Plan, ApiError> {
    let Some((Message::User { content }, earlier)) = input.messages.split_last() else {
        return Err(Refusal::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "NO_USER_MESSAGE",
            "A new run needs the conversation to end with a user message.",
        )
        .into());
    };
    let mut history = input.context.clone();
    history.extend(earlier.iter().cloned());
    let known = history.len() + 1;
    Ok(Plan {
        source: RunSource::Given(history),
        message: content.clone(),
        known,
        resumed: HashSet::new(),
    })
}

/// Checks a resume against what its parent run issued (the run's start takes the parent's interrupts, once).
async fn plan_resume(state: &AppState, input: &RunInput, actor: &Actor) -> Result<Plan, ApiError> {
    let store = state.harness.store();
    let parent = match &input.parent_run_id {
        Some(parent) => Ok(parent.clone()),
        None => store
            .open_interrupt(&input.thread_id)
            .await
            .map_err(unavailable)?
            .map(|(parent, _)| parent)
            .ok_or_else(|| {
                ApiError::from(Refusal::new(
                    StatusCode::NOT_FOUND,
                    "UNKNOWN_PARENT_RUN",
                    format!(
                        "Thread {} has no interrupted run to resume.",
                        input.thread_id
                    ),
                ))
            }),
    };
    let checked = match parent {
        Ok(parent) => check_resume(state, input, &parent, actor).await,
        Err(refused) => Err(refused),
    };
    // A run id already in use is refused before anything the check of the resume found. Only a resume that did not
    // pass asks here: one that passes starts as a new run does, whose start refuses a taken run id (after the
    // server's own refusals: shutting down, full) before anything else, leaving the parent's interrupts open, and
    // that refusal is audited as this one would be.
    if checked.is_err()
        && store
            .run(&input.run_id)
            .await
            .map_err(unavailable)?
            .is_some()
    {
        return Err(ApiError::from(StartError::RunIdTaken(input.run_id.clone())));
    }
    checked
}

/// Checks a resume of `parent` against what the parent issued.
async fn check_resume(
    state: &AppState,
    input: &RunInput,
    parent: &agent::ids::RunId,
    actor: &Actor,
) -> Result<Plan, ApiError> {
    let (suspension, used_by) = state
        .harness
        .store()
        .interrupt(parent)
        .await
        .map_err(unavailable)?
        .ok_or_else(|| StartError::Resume(TakeError::UnknownParent(parent.clone())))?;
    // The same refusals as the start's own take, which a resume racing this one meets there.
    if let Some(by) = used_by {
        return Err(StartError::Resume(TakeError::AlreadyUsed {
            parent: parent.clone(),
            by,
        })
        .into());
    }
    // What was issued never changes; only its use does. The run's start takes the interrupts, in the transaction that
    // records the run, and that take is what makes the use exactly once (a resume racing this one loses there).
    let resolutions = resume::check(
        &suspension,
        input,
        state.harness.toolbox(),
        &state.harness.config().permissions,
        now_ms(),
    )?;
    let added = resume::added_messages(&suspension, input);
    Ok(Plan {
        known: suspension.history.len(),
        resumed: suspension
            .interruption
            .pending
            .iter()
            .map(|pending| pending.call.id.clone())
            .collect(),
        message: added.join("\n\n"),
        source: RunSource::Resume {
            suspension: Box::new(suspension),
            resolutions,
            decided_by: actor.clone(),
            added,
        },
    })
}

/// What the stream reads of an `interrupted` event here: how many calls wait.
#[derive(serde::Deserialize)]
struct Issued {
    interrupts: Vec<serde::de::IgnoredAny>,
}

/// Records a refused resume in the audit log: who tried what, and why it was refused.
async fn audit_refusal(state: &AppState, input: &RunInput, refused: &ApiError, actor: &Actor) {
    let entry = AuditEntry {
        id: 0,
        at: now_ms(),
        kind: AuditKind::ResumeRefused,
        session_id: Some(input.thread_id.clone()),
        run_id: input.parent_run_id.clone(),
        tool_call_id: None,
        tool: None,
        arguments_digest: None,
        edited_digest: None,
        outcome: refused.code().to_ascii_lowercase(),
        source: Some("agui".to_owned()),
        scope: None,
        reason: Some(refused.to_string()),
        actor: Some(actor.as_str().to_owned()),
    };
    if let Err(error) = state.harness.audit(entry).await {
        tracing::error!(%error, "cannot record a refused resume in the audit log");
    }
}

pub async fn run(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    client: ClientAddr,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let input = RunInput::from_body(&body)?;
    // Before the plan: a client with too many streams open uses no interrupt and starts nothing.
    let permit = state.streams.acquire(client)?;
    let plan = match input.resume {
        Some(_) => match plan_resume(&state, &input, &actor).await {
            Ok(plan) => plan,
            Err(refused) => {
                audit_refusal(&state, &input, &refused, &actor).await;
                return Err(refused);
            }
        },
        None => plan_new_run(&input)?,
    };
    let started = state
        .harness
        .start(StartRun {
            message: plan.message,
            session_id: Some(input.thread_id.clone()),
            policy: None,
            mode: ApprovalMode::Interrupt,
            run_id: Some(input.run_id.clone()),
            source: plan.source,
            refused_while_interrupted: input.resume.is_none(),
        })
        .await;
    let run = match started {
        Ok(run) => run,
        // A run that did not start used nothing of its resume: the take and the start commit together or not at
        // all, so the interrupts stay open for a retry.
        Err(error) => {
            let refused = ApiError::from(error);
            // A resume refused at its start is audited as one refused by its check (a taken run id included).
            if input.resume.is_some()
                && matches!(
                    refused,
                    ApiError::Start(StartError::Resume(_) | StartError::RunIdTaken(_))
                )
            {
                audit_refusal(&state, &input, &refused, &actor).await;
            }
            return Err(refused);
        }
    };

    let mut translator = Translator::new(
        input.thread_id,
        input.run_id,
        input.raw_messages,
        plan.known,
        plan.resumed,
    );
    // Closing the stream aborts the run, as on the interactive streaming route.
    let guard = AbortOnDrop::new(run.clone());
    let ended = guard.ended();
    let conversations = run.clone();
    let events = run
        .subscribe(0)
        .then(move |encoded| {
            // The closing snapshot needs the whole conversation, which the run keeps once it ended.
            let ending = is_terminal(encoded.kind).then(|| conversations.clone());
            // An interrupted run's results of the calls that ran wait with its interrupts.
            let waiting = (encoded.kind == "interrupted").then(|| {
                serde_json::from_str::<Issued>(&encoded.json)
                    .map_or(0, |issued| issued.interrupts.len())
            });
            async move {
                let conversation = match ending {
                    Some(run) if let Some(waiting) = waiting => {
                        read_again(|| run.conversation_with_settled(waiting)).await
                    }
                    Some(run) => read_again(|| run.conversation()).await,
                    None => None,
                };
                (encoded, conversation)
            }
        })
        .flat_map(move |(encoded, conversation)| {
            let _guard = &guard;
            if is_terminal(encoded.kind) {
                ended.store(true, std::sync::atomic::Ordering::Release);
            }
            let translated = if Translator::ignores(encoded.kind) {
                Vec::new()
            } else {
                match translator.translate(encoded.kind, &encoded.json, || conversation) {
                    Ok(translated) => translated,
                    Err(error) => {
                        tracing::error!(%error, "an event of the run could not be read back");
                        Vec::new()
                    }
                }
            };
            futures::stream::iter(
                translated
                    .into_iter()
                    .map(|json| Event::default().data(json)),
            )
        });
    Ok(event_stream(events, permit, state.keep_alive).await)
}

/// What a run ended with, read again for a while when the store does not answer (a lost connection, a failover):
/// `None` when the run has none, or when the store still did not answer after about 1.5 s (the stream then ends with
/// `RUN_ERROR`, see [`events::UNREAD_ENDING`]).
async fn read_again<T, Read>(read: impl Fn() -> Read) -> Option<T>
where
    Read: std::future::Future<Output = Result<Option<T>, agent::harness::Unavailable>>,
{
    let mut wait = std::time::Duration::from_millis(50);
    loop {
        match read().await {
            Ok(found) => return found,
            Err(error) if wait <= std::time::Duration::from_millis(800) => {
                tracing::warn!(%error, "cannot read the conversation a run ended with; trying again");
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
            Err(error) => {
                tracing::error!(%error, "cannot read the conversation a run ended with");
                return None;
            }
        }
    }
}
