//! Checking a resume against what the interrupted run issued, all or nothing, before anything executes.
//!
//! The peers trust the client here: the interrupted call is rebuilt from the history the client sends. toolgate
//! keeps what it issued and refuses a resume that names another thread, comes after the interrupts expired,
//! answers too few or too many of them (or one twice), carries a history whose interrupted calls differ from the
//! ones issued, or carries a payload (or edited arguments) that its schema does not allow.

use std::collections::{HashMap, HashSet};

use agent::ids::ToolCallId;
use agent::interrupts::{Suspension, arguments_digest};
use agent::permissions::ApprovalChoices;
use agent::policy::PermissionPolicy;
use agent::tools::Toolbox;
use agent::wire::{Decision, DecisionScope, Message, Resolution};
use axum::http::StatusCode;
use serde_json::{Value, json};

use super::run_input::{ResumeEntry, ResumeStatus, RunInput};
use crate::error::Refusal;

/// What a resume payload may say, published in each interrupt: `scope: "session"` only where the call offers it
/// (the interrupt's `metadata.session` says what it covers).
pub fn response_schema(session: bool) -> Value {
    let (scopes, description) = if session {
        (
            json!(["once", "session"]),
            "Approve the call, optionally with edited arguments (they must satisfy the tool's input schema) and for the rest of the thread (what that covers: metadata.session.covers, in interrupts that say it).",
        )
    } else {
        (
            json!(["once"]),
            "Approve the call, optionally with edited arguments (they must satisfy the tool's input schema); approving it for the thread is not offered (why: metadata.sessionNote).",
        )
    };
    json!({
        "type": "object",
        "oneOf": [
            {
                "description": description,
                "properties": {
                    "approved": {"const": true},
                    "arguments": {"type": "object"},
                    "scope": {"enum": scopes},
                    "reason": {"type": "string", "maxLength": 2000}
                },
                "required": ["approved"],
                "additionalProperties": false
            },
            {
                "description": "Deny the call; the reason reaches the model.",
                "properties": {
                    "approved": {"const": false},
                    "reason": {"type": "string", "maxLength": 2000}
                },
                "required": ["approved"],
                "additionalProperties": false
            }
        ]
    })
}

fn unprocessable(code: &'static str, message: impl Into<String>) -> Refusal {
    Refusal::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)
}

/// Reads one payload as a person's decision, with the same validation as the REST route's body.
fn decision(entry: &ResumeEntry) -> Result<Decision, Refusal> {
    if entry.status == ResumeStatus::Cancelled {
        return Ok(Decision::Deny {
            reason: Some("the approval was cancelled".to_owned()),
        });
    }
    let invalid = |detail: String| {
        unprocessable(
            "INVALID_RESUME_PAYLOAD",
            format!(
                "The answer to interrupt {} does not match its responseSchema: {detail}",
                entry.interrupt_id
            ),
        )
    };
    let Some(Value::Object(payload)) = &entry.payload else {
        return Err(invalid(
            "a resolved entry needs an object payload".to_owned(),
        ));
    };
    let unknown: Vec<&str> = payload
        .keys()
        .map(String::as_str)
        .filter(|key| !["approved", "arguments", "scope", "reason"].contains(key))
        .collect();
    if !unknown.is_empty() {
        return Err(invalid(format!("unknown field(s) {}", unknown.join(", "))));
    }
    let approved = match payload.get("approved") {
        Some(Value::Bool(approved)) => *approved,
        _ => return Err(invalid("approved must be true or false".to_owned())),
    };
    // As the schema reads: a field given is of its type (null is none of them), and a denial has only a reason.
    if let Some((key, _)) = payload.iter().find(|(_, value)| value.is_null()) {
        return Err(invalid(format!("{key} is null: leave it out instead")));
    }
    if !approved
        && let Some(key) = ["scope", "arguments"]
            .into_iter()
            .find(|key| payload.contains_key(*key))
    {
        return Err(invalid(format!(
            "a denial has no {key} (only approved and reason)"
        )));
    }
    let mut body = payload.clone();
    body.remove("approved");
    body.insert(
        "decision".to_owned(),
        Value::String(if approved { "approve" } else { "deny" }.to_owned()),
    );
    let decision =
        Decision::from_json(&Value::Object(body)).map_err(|errors| invalid(errors.to_string()))?;
    // The REST route also knows `session_program`; an interrupt's schema offers `once` and `session` only.
    if let Decision::Approve {
        scope: DecisionScope::SessionProgram,
        ..
    } = decision
    {
        return Err(invalid(
            "scope: expected 'once' | 'session', received 'session_program'".to_owned(),
        ));
    }
    Ok(decision)
}

/// The interrupted calls as the client's history has them, their arguments read as the tool read them (blank ones
/// as an empty object: the digest asked about is of those).
fn history_calls(messages: &[Message]) -> HashMap<&ToolCallId, (&str, Option<String>)> {
    messages
        .iter()
        .filter_map(|message| match message {
            Message::Assistant { tool_calls, .. } => Some(tool_calls),
            _ => None,
        })
        .flatten()
        .map(|call| {
            let digest = call
                .arguments_json()
                .ok()
                .map(|arguments| arguments_digest(&arguments));
            (&call.id, (call.name.as_str(), digest))
        })
        .collect()
}

/// Whether approving with `scope` may stand, as on the approval API: a session scope must be one the interrupt
/// offered (`offered`, what its card showed when it was issued: not while a rule asked before every such call, nor
/// for a tool that takes no such grant; an interrupt of an older version offered none), and the arguments, edited or
/// not, must make the very grant it offered. Rules changed since the interrupt change nothing of that: what a person
/// approves is what was shown. Otherwise, why not.
fn session_scope(
    permissions: &PermissionPolicy,
    tool: &agent::wire::ToolSpec,
    asked: &Value,
    edited: Option<&Value>,
    scope: DecisionScope,
    offered: &ApprovalChoices,
) -> Result<(), String> {
    if scope == DecisionScope::Once {
        return Ok(());
    }
    let Some(choice) = offered.session_choice(scope) else {
        return Err(format!(
            "approving for the session ({}) was not offered for this call. {}",
            scope.as_str(),
            offered.session_note.as_deref().unwrap_or_default()
        )
        .trim_end()
        .to_owned());
    };
    match permissions.grant_for(tool, asked, edited, scope) {
        Ok(Some(grant)) if grant == choice.grant => Ok(()),
        Ok(Some(_)) => Err(format!(
            "{} changed since this interrupt was issued, and a grant would allow the tool as it is now, which nobody was shown. Approve it once, or deny it.",
            tool.name
        )),
        Ok(None) => Err(format!(
            "approving for the session ({}) is not offered for this call now.",
            scope.as_str()
        )),
        Err(edited) => Err(edited.to_string()),
    }
}

/// The user messages a resume's history holds after the interrupted calls: a person who typed instead of answering
/// the cards (assistant-ui's "steer away" sends the cards cancelled with the new message). The resumed run reads them
/// after the calls' results, as the client's history has them after the calls.
pub fn added_messages(suspension: &Suspension, input: &RunInput) -> Vec<String> {
    let interrupted: HashSet<&ToolCallId> = suspension
        .interrupts
        .iter()
        .map(|issued| &issued.request.tool_call_id)
        .collect();
    let Some(asked_at) = input.messages.iter().rposition(|message| {
        matches!(message, Message::Assistant { tool_calls, .. }
            if tool_calls.iter().any(|call| interrupted.contains(&call.id)))
    }) else {
        return Vec::new();
    };
    input.messages[asked_at + 1..]
        .iter()
        .filter_map(|message| match message {
            Message::User { content } => Some(content.clone()),
            _ => None,
        })
        .collect()
}

/// Checks a resume against the suspension it answers and returns a resolution per interrupted call.
pub fn check(
    suspension: &Suspension,
    input: &RunInput,
    toolbox: &Toolbox,
    permissions: &PermissionPolicy,
    now_ms: u64,
) -> Result<HashMap<ToolCallId, Resolution>, Refusal> {
    if suspension.session_id != input.thread_id {
        return Err(Refusal::new(
            StatusCode::CONFLICT,
            "THREAD_MISMATCH",
            format!(
                "Run {} belongs to thread {}, not {}.",
                suspension.run_id, suspension.session_id, input.thread_id
            ),
        ));
    }
    if now_ms >= suspension.expires_at() {
        return Err(Refusal::new(
            StatusCode::GONE,
            "INTERRUPT_EXPIRED",
            format!(
                "The interrupts of run {} expired; nothing was run. Start a new run instead.",
                suspension.run_id
            ),
        ));
    }

    let entries = input.resume.as_deref().unwrap_or_default();
    let issued: HashMap<&str, _> = suspension
        .interrupts
        .iter()
        .map(|issued| (issued.request.id.as_str(), issued))
        .collect();
    let mut answered = HashSet::new();
    for entry in entries {
        if !issued.contains_key(entry.interrupt_id.as_str()) {
            return Err(unprocessable(
                "UNKNOWN_INTERRUPT",
                format!(
                    "Run {} issued no interrupt {}.",
                    suspension.run_id, entry.interrupt_id
                ),
            ));
        }
        if !answered.insert(entry.interrupt_id.as_str()) {
            return Err(unprocessable(
                "DUPLICATE_RESUME_ENTRY",
                format!(
                    "Interrupt {} is answered more than once.",
                    entry.interrupt_id
                ),
            ));
        }
    }
    let missing: Vec<&str> = suspension
        .interrupts
        .iter()
        .map(|issued| issued.request.id.as_str())
        .filter(|id| !answered.contains(id))
        .collect();
    if !missing.is_empty() {
        return Err(unprocessable(
            "INCOMPLETE_RESUME",
            format!(
                "The resume must answer every open interrupt of run {} exactly once; missing: {}.",
                suspension.run_id,
                missing.join(", ")
            ),
        ));
    }

    let history = history_calls(&input.messages);
    for issued in &suspension.interrupts {
        let request = &issued.request;
        let mismatch = |detail: &str| {
            Refusal::new(
                StatusCode::CONFLICT,
                "HISTORY_MISMATCH",
                format!(
                    "The history's tool call {} ({}) {detail}; nothing was run.",
                    request.tool_call_id, request.tool_name
                ),
            )
        };
        match history.get(&request.tool_call_id) {
            None => return Err(mismatch("is missing")),
            Some((name, _)) if *name != request.tool_name => {
                return Err(mismatch("names another tool"));
            }
            Some((_, digest)) if digest.as_deref() != Some(issued.digest.as_str()) => {
                return Err(mismatch(
                    "has arguments that differ from the ones approval was asked for",
                ));
            }
            Some(_) => {}
        }
    }

    let mut resolutions = HashMap::with_capacity(entries.len());
    for entry in entries {
        let Some(issued) = issued.get(entry.interrupt_id.as_str()) else {
            continue;
        };
        let decision = decision(entry)?;
        if let Decision::Approve {
            arguments, scope, ..
        } = &decision
        {
            if let Some(arguments) = arguments {
                toolbox
                    .validate(&issued.request.tool_name, arguments)
                    .map_err(|error| {
                        unprocessable(
                            "INVALID_ARGUMENTS",
                            format!(
                                "The edited arguments for interrupt {} do not fit {}: {}",
                                entry.interrupt_id, issued.request.tool_name, error.message
                            ),
                        )
                    })?;
            }
            if let Some(tool) = toolbox.lookup(&issued.request.tool_name) {
                session_scope(
                    permissions,
                    tool.spec(),
                    &issued.request.arguments,
                    arguments.as_ref(),
                    *scope,
                    &issued.request.choices,
                )
                .map_err(|why| {
                    unprocessable(
                        "INVALID_RESUME_PAYLOAD",
                        format!("The answer to interrupt {}: {why}", entry.interrupt_id),
                    )
                })?;
            }
        }
        resolutions.insert(
            issued.request.tool_call_id.clone(),
            Resolution::from_decision(decision, &issued.request.arguments),
        );
    }
    Ok(resolutions)
}
