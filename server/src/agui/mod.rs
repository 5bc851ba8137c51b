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
use std::sync::Arc;

use agent::approvals::now_ms;
use agent::hub::{RunSource, StartError, StartRun};
use agent::interrupts::TakeError;
use agent::wire::{ApprovalMode, Message, StreamEvent};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::response::sse::Event;
use futures::StreamExt;

use crate::api::{AbortOnDrop, event_stream};
use crate::body::JsonValue;
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

fn plan_new_run(state: &AppState, input: &RunInput) -> Result<Plan, ApiError> {
    if let Some(waiting) = state
        .harness
        .interrupts()
        .open_in_session(&input.thread_id, now_ms())
    {
        return Err(Refusal::new(
            StatusCode::CONFLICT,
            "THREAD_INTERRUPTED",
            format!(
                "Thread {} waits for a resume of run {waiting}: answer its interrupts (status resolved or cancelled) before starting another run.",
                input.thread_id
            ),
        )
        .into());
    }
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

fn plan_resume(state: &AppState, input: &RunInput) -> Result<Plan, ApiError> {
    let interrupts = state.harness.interrupts();
    let parent = match &input.parent_run_id {
        Some(parent) => parent.clone(),
        None => interrupts
            .latest_open_in_session(&input.thread_id)
            .ok_or_else(|| {
                Refusal::new(
                    StatusCode::NOT_FOUND,
                    "UNKNOWN_PARENT_RUN",
                    format!(
                        "Thread {} has no interrupted run to resume.",
                        input.thread_id
                    ),
                )
            })?,
    };
    // A run id already in use would make the start fail after the suspension was taken; refuse it first.
    if state.harness.run(&input.run_id).is_some() || interrupts.knows(&input.run_id) {
        return Err(ApiError::from(StartError::RunIdTaken(input.run_id.clone())));
    }
    let now = now_ms();
    let (suspension, resolutions) = interrupts
        .take(&parent, &input.run_id, |suspension| {
            resume::check(suspension, input, state.harness.toolbox(), now)
        })
        .map_err(|error| match error {
            TakeError::UnknownParent(_) => Refusal::new(
                StatusCode::NOT_FOUND,
                "UNKNOWN_PARENT_RUN",
                error.to_string(),
            ),
            TakeError::AlreadyUsed { .. } => Refusal::new(
                StatusCode::CONFLICT,
                "RESUME_ALREADY_USED",
                error.to_string(),
            ),
            TakeError::Refused(refusal) => refusal,
        })?;
    Ok(Plan {
        known: suspension.history.len(),
        resumed: suspension
            .interruption
            .pending
            .iter()
            .map(|pending| pending.call.id.clone())
            .collect(),
        source: RunSource::Resume {
            suspension: Box::new(suspension),
            resolutions,
        },
        message: String::new(),
    })
}

pub async fn run(
    State(state): State<AppState>,
    client: ClientAddr,
    JsonValue(body): JsonValue,
) -> Result<Response, ApiError> {
    let input = RunInput::from_json(body).map_err(ApiError::Invalid)?;
    // Before the plan: a client with too many streams open uses no interrupt and starts nothing.
    let permit = state.streams.acquire(client)?;
    let plan = match input.resume {
        Some(_) => plan_resume(&state, &input)?,
        None => plan_new_run(&state, &input)?,
    };
    let restorable = match &plan.source {
        RunSource::Resume { suspension, .. } => Some((**suspension).clone()),
        _ => None,
    };
    let started = state.harness.start(StartRun {
        message: plan.message,
        session_id: Some(input.thread_id.clone()),
        policy: None,
        mode: ApprovalMode::Interrupt,
        run_id: Some(input.run_id.clone()),
        source: plan.source,
    });
    let record = match started {
        Ok(record) => record,
        Err(error) => {
            // The run did not start, so nothing of the resume was used: the interrupts stay open.
            if let Some(suspension) = restorable {
                state.harness.interrupts().restore(suspension);
            }
            return Err(error.into());
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
    let guard = AbortOnDrop::new(Arc::clone(&record));
    let events = record.subscribe(0).flat_map(move |encoded| {
        let _guard = &guard;
        let translated = match serde_json::from_str::<StreamEvent>(&encoded.json) {
            Ok(event) => translator.translate(&event, || {
                record
                    .conversation()
                    .map(|conversation| conversation.as_ref().clone())
            }),
            Err(error) => {
                tracing::error!(%error, "an event of the run could not be read back");
                Vec::new()
            }
        };
        futures::stream::iter(
            translated
                .into_iter()
                .map(|event| Event::default().data(event.to_string())),
        )
    });
    Ok(event_stream(events, permit, state.keep_alive))
}
