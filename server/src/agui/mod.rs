//! `POST /api/agui`: the AG-UI protocol, with approvals as interrupts.
//!
//! A run that meets a call needing a person ends with `RUN_FINISHED` whose outcome is `interrupt`; the client
//! answers in a new run with a `resume` batch (and, when it says so, the interrupted run as `parentRunId`). The
//! server keeps what it issued and checks the whole batch before anything executes (see [`resume`]); a refused
//! resume is an HTTP 4xx with a machine-readable `code`, and executes nothing.

pub mod events;
pub mod input;
pub mod resume;

use std::collections::HashSet;
use std::sync::Arc;

use agent::approvals::now_ms;
use agent::hub::{RunSource, StartError, StartRun};
use agent::interrupts::TakeError;
use agent::wire::{ApprovalMode, Message, StreamEvent, ValidationErrors};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::json;

use crate::api::{AbortOnDrop, event_stream};
use crate::body::JsonValue;
use crate::state::AppState;
use events::Translator;
use input::RunInput;
use resume::Refusal;

/// Why an AG-UI request was refused before its run started.
#[derive(Debug)]
pub enum AguiError {
    Invalid(ValidationErrors),
    Refused(Refusal),
}

impl From<Refusal> for AguiError {
    fn from(refusal: Refusal) -> Self {
        Self::Refused(refusal)
    }
}

impl From<StartError> for AguiError {
    fn from(error: StartError) -> Self {
        let (status, code) = match &error {
            StartError::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "SHUTTING_DOWN"),
            StartError::SessionBusy(_) => (StatusCode::CONFLICT, "THREAD_BUSY"),
            StartError::PolicyTooLoose { .. } => (StatusCode::FORBIDDEN, "POLICY_TOO_LOOSE"),
            StartError::RunIdTaken(_) => (StatusCode::CONFLICT, "RUN_ID_TAKEN"),
        };
        Self::Refused(Refusal::new(status, code, error.to_string()))
    }
}

impl IntoResponse for AguiError {
    fn into_response(self) -> Response {
        match self {
            Self::Invalid(errors) => (
                StatusCode::BAD_REQUEST,
                Json(json!({
                    "ok": false,
                    "code": "INVALID_INPUT",
                    "error": format!("Invalid RunAgentInput: {errors}"),
                    "formErrors": errors.form_errors,
                    "fieldErrors": errors.field_errors,
                })),
            )
                .into_response(),
            Self::Refused(refusal) => (
                refusal.status,
                Json(json!({"ok": false, "code": refusal.code, "error": refusal.message})),
            )
                .into_response(),
        }
    }
}

/// What a request starts: the run's source and message, and how many of the conversation's first messages the
/// client already has (for the closing snapshot).
struct Plan {
    source: RunSource,
    message: String,
    known: usize,
    resumed: HashSet<agent::ids::ToolCallId>,
}

fn plan_new_run(state: &AppState, input: &RunInput) -> Result<Plan, AguiError> {
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

fn plan_resume(state: &AppState, input: &RunInput) -> Result<Plan, AguiError> {
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
        return Err(AguiError::from(StartError::RunIdTaken(
            input.run_id.clone(),
        )));
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
    JsonValue(body): JsonValue,
) -> Result<Response, AguiError> {
    let input = RunInput::from_json(body).map_err(AguiError::Invalid)?;
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
    Ok(event_stream(events, state.keep_alive))
}
