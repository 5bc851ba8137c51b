//! The AG-UI interrupt flow over `POST /api/agui`: run 1 until `RUN_FINISHED` with an `interrupt` outcome, then
//! run 2 (`parentRunId` run 1, the conversation of run 1's `MESSAGES_SNAPSHOT`, a `resume` batch approving the
//! interrupt) until `RUN_FINISHED` with a `success` outcome, as an AG-UI client does it.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{ApprovalFlow, CONTENT, Legs, TripSpec, TripTiming};
use crate::api::{Api, SseStream, TripError};

/// AG-UI: approvals as interrupts, answered by a resume in a second run.
pub struct AguiFlow;

fn unverified(message: String) -> TripError {
    TripError::Unverified(message)
}

fn text<'a>(value: &'a Value, field: &str, what: &str) -> Result<&'a str, TripError> {
    value[field]
        .as_str()
        .ok_or_else(|| unverified(format!("{what} has no {field}: {value}")))
}

/// The `RunAgentInput` that starts a trip's run 1.
fn first_input(spec: &TripSpec, run_id: &str) -> Value {
    let thread = &spec.session_id;
    json!({
        "threadId": thread,
        "runId": run_id,
        "messages": [{"id": format!("{thread}.user"), "role": "user", "content": spec.message()}],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {},
    })
}

/// The `RunAgentInput` of run 2: the conversation as run 1 left it, and the interrupt approved.
fn resume_input(
    spec: &TripSpec,
    run_id: &str,
    parent_run_id: &str,
    messages: Value,
    interrupt_id: &str,
) -> Value {
    json!({
        "threadId": spec.session_id,
        "runId": run_id,
        "parentRunId": parent_run_id,
        "messages": messages,
        "resume": [{"interruptId": interrupt_id, "status": "resolved", "payload": {"approved": true}}],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {},
    })
}

/// What one run streamed, as far as the trip needs it.
struct Run {
    /// Its `RUN_FINISHED` event, and when it arrived.
    finished: Value,
    finished_at: Instant,
    /// The `messages` of its `MESSAGES_SNAPSHOT`.
    messages: Value,
    /// The `TOOL_CALL_RESULT` of the watched call, and when it arrived.
    result: Option<(Value, Instant)>,
}

/// Reads one run from `RUN_STARTED` to `RUN_FINISHED` and the end of its stream. `parent` is the `parentRunId`
/// its `RUN_STARTED` must carry; `resumed` is the call whose result to watch for, which must not be replayed.
async fn read_run(
    stream: &mut SseStream,
    spec: &TripSpec,
    run_id: &str,
    parent: Option<&str>,
    resumed: Option<&str>,
) -> Result<Run, TripError> {
    let thread = spec.session_id.as_str();
    let Some(first) = stream.next_agui("RUN_STARTED").await? else {
        return Err(TripError::Ended {
            waiting_for: "RUN_STARTED".to_owned(),
        });
    };
    if first.kind != "RUN_STARTED" {
        return Err(unverified(format!(
            "run {run_id} began with {} instead of RUN_STARTED",
            first.kind
        )));
    }
    let started = first.json()?;
    if started["threadId"] != thread
        || started["runId"] != run_id
        || started["parentRunId"].as_str() != parent
    {
        return Err(unverified(format!(
            "RUN_STARTED names another run than {run_id} of thread {thread} (parent {parent:?}): {started}"
        )));
    }

    let mut messages = None;
    let mut result = None;
    let (finished, finished_at) = loop {
        let Some(event) = stream.next_agui("RUN_FINISHED").await? else {
            return Err(TripError::Ended {
                waiting_for: "RUN_FINISHED".to_owned(),
            });
        };
        match event.kind.as_str() {
            "RUN_FINISHED" => break (event.json()?, Instant::now()),
            "RUN_ERROR" => return Err(TripError::RunFailed(event.data)),
            "MESSAGES_SNAPSHOT" => {
                if messages.is_some() {
                    return Err(unverified(format!(
                        "run {run_id} sent two MESSAGES_SNAPSHOT events"
                    )));
                }
                let mut snapshot = event.json()?;
                if !snapshot["messages"].is_array() {
                    return Err(unverified(format!(
                        "MESSAGES_SNAPSHOT has no messages: {snapshot}"
                    )));
                }
                messages = Some(snapshot["messages"].take());
            }
            "TOOL_CALL_RESULT" if resumed.is_some() => {
                let at = Instant::now();
                let value = event.json()?;
                if value["toolCallId"].as_str() != resumed {
                    continue;
                }
                if result.is_some() {
                    return Err(unverified(format!(
                        "two TOOL_CALL_RESULT events for the resumed call: {value}"
                    )));
                }
                result = Some((value, at));
            }
            "TOOL_CALL_START" if resumed.is_some() => {
                let value = event.json()?;
                if value["toolCallId"].as_str() == resumed {
                    return Err(unverified(format!(
                        "the resumed call was replayed: {value}"
                    )));
                }
            }
            _ => {}
        }
    };
    if finished["threadId"] != thread || finished["runId"] != run_id {
        return Err(unverified(format!(
            "RUN_FINISHED names another run than {run_id} of thread {thread}: {finished}"
        )));
    }
    let Some(messages) = messages else {
        return Err(unverified(format!(
            "run {run_id} finished without a MESSAGES_SNAPSHOT"
        )));
    };
    // RUN_FINISHED is the last event: the server must end the stream (which also frees the connection).
    if let Some(event) = stream.next_agui("the end of the stream").await? {
        return Err(unverified(format!(
            "a {} event came after RUN_FINISHED",
            event.kind
        )));
    }
    Ok(Run {
        finished,
        finished_at,
        messages,
        result,
    })
}

/// The one interrupt run 1 must end with, asking for the trip's `write_file`: its id and its tool call's id.
fn the_interrupt(finished: &Value, spec: &TripSpec) -> Result<(String, String), TripError> {
    let outcome = &finished["outcome"];
    if outcome["type"] != "interrupt" {
        return Err(unverified(format!(
            "run 1 ended with outcome {outcome}, not an interrupt"
        )));
    }
    let interrupt = match outcome["interrupts"].as_array().map(Vec::as_slice) {
        Some([interrupt]) => interrupt,
        _ => {
            return Err(unverified(format!(
                "run 1 must end with exactly one interrupt: {outcome}"
            )));
        }
    };
    let metadata = &interrupt["metadata"];
    if metadata["toolName"] != "write_file" || metadata["arguments"]["path"] != spec.file.as_str() {
        return Err(unverified(format!(
            "the interrupt asks for another call than write_file {}: {interrupt}",
            spec.file
        )));
    }
    Ok((
        text(interrupt, "id", "the interrupt")?.to_owned(),
        text(interrupt, "toolCallId", "the interrupt")?.to_owned(),
    ))
}

/// The resumed call's `TOOL_CALL_RESULT` must carry `write_file`'s own output for the trip's file, not an error.
fn check_write_result(result: &Value, spec: &TripSpec) -> Result<(), TripError> {
    let content = text(result, "content", "TOOL_CALL_RESULT")?;
    let output: Value = serde_json::from_str(content).map_err(|_| {
        unverified(format!(
            "the resumed call's result is not write_file's output: {content}"
        ))
    })?;
    if output.get("error").is_some() {
        return Err(unverified(format!(
            "the approved tool did not run: {content}"
        )));
    }
    if output["path"] != spec.file.as_str() || output["bytes"] != CONTENT.len() {
        return Err(unverified(format!(
            "write_file reports another write than {} bytes to {}: {content}",
            CONTENT.len(),
            spec.file
        )));
    }
    Ok(())
}

impl ApprovalFlow for AguiFlow {
    fn name(&self) -> &'static str {
        "AG-UI interrupts"
    }

    fn legs(&self) -> Legs {
        Legs {
            trip: "POST /api/agui -> RUN_FINISHED interrupt -> POST resume -> TOOL_CALL_RESULT -> RUN_FINISHED \
                   success",
            to_approval: "run 1 sent -> RUN_FINISHED interrupt",
            decision_to_resolved: "resume sent -> TOOL_CALL_RESULT",
            decision_response: "resume sent -> its 200",
        }
    }

    async fn trip(
        &self,
        api: &Api,
        spec: &TripSpec,
        patience: Duration,
    ) -> Result<TripTiming, TripError> {
        let first_run = format!("{}.1", spec.session_id);
        let second_run = format!("{}.2", spec.session_id);

        let started = Instant::now();
        let mut stream = api.agui(&first_input(spec, &first_run), patience).await?;
        let first = read_run(&mut stream, spec, &first_run, None, None).await?;
        let (interrupt_id, call_id) = the_interrupt(&first.finished, spec)?;

        let resume = resume_input(spec, &second_run, &first_run, first.messages, &interrupt_id);
        let sent_at = Instant::now();
        let mut stream = api.agui(&resume, patience).await?;
        let responded_at = Instant::now();
        let second = read_run(
            &mut stream,
            spec,
            &second_run,
            Some(&first_run),
            Some(&call_id),
        )
        .await?;
        let outcome = &second.finished["outcome"];
        if outcome["type"] != "success" {
            return Err(unverified(format!(
                "the resumed run ended with outcome {outcome}, not success"
            )));
        }
        let Some((result, resolved_at)) = &second.result else {
            return Err(unverified(
                "the resumed run finished without a TOOL_CALL_RESULT for the approved call"
                    .to_owned(),
            ));
        };
        check_write_result(result, spec)?;

        Ok(TripTiming {
            whole: second.finished_at - started,
            to_approval: first.finished_at - started,
            decision_to_resolved: *resolved_at - sent_at,
            decision_response: responded_at - sent_at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> TripSpec {
        TripSpec::new("t", 3)
    }

    /// A `RUN_FINISHED` with one interrupt, shaped as server/src/agui/events.rs makes it.
    fn interrupted(path: &str) -> Value {
        json!({
            "type": "RUN_FINISHED", "threadId": "bench-t-3", "runId": "bench-t-3.1",
            "outcome": {"type": "interrupt", "interrupts": [{
                "id": "int_1", "reason": "tool_call", "message": "write_file changes the workspace.",
                "toolCallId": "call_1", "responseSchema": {}, "expiresAt": "2026-11-30T01:18:12.433Z",
                "metadata": {"toolName": "write_file", "arguments": {"path": path, "content": "x"}},
            }]},
        })
    }

    #[test]
    fn the_interrupt_must_be_the_one_write_of_the_trip() {
        let spec = spec();
        assert_eq!(
            the_interrupt(&interrupted("bench/t-3.txt"), &spec).unwrap(),
            ("int_1".to_owned(), "call_1".to_owned())
        );
        assert!(the_interrupt(&interrupted("bench/other.txt"), &spec).is_err());
        let mut two = interrupted("bench/t-3.txt");
        let copy = two["outcome"]["interrupts"][0].clone();
        two["outcome"]["interrupts"]
            .as_array_mut()
            .unwrap()
            .push(copy);
        assert!(the_interrupt(&two, &spec).is_err());
        let success = json!({"type": "RUN_FINISHED", "outcome": {"type": "success"}});
        assert!(the_interrupt(&success, &spec).is_err());
    }

    #[test]
    fn the_result_must_be_the_write_not_an_error() {
        let spec = spec();
        let result = |content: &str| json!({"type": "TOOL_CALL_RESULT", "toolCallId": "call_1", "content": content});
        check_write_result(&result(r#"{"path":"bench/t-3.txt","bytes":1}"#), &spec).unwrap();
        let denied = r#"{"error":{"code":"APPROVAL_DENIED","message":"no"}}"#;
        assert!(check_write_result(&result(denied), &spec).is_err());
        assert!(
            check_write_result(&result(r#"{"path":"bench/t-3.txt","bytes":2}"#), &spec).is_err()
        );
        assert!(check_write_result(&result("write_file wrote 1 bytes"), &spec).is_err());
    }

    #[test]
    fn the_resume_answers_the_interrupt_of_run_1() {
        let spec = spec();
        let first = first_input(&spec, "bench-t-3.1");
        assert_eq!(first["messages"][0]["content"], "write bench/t-3.txt: x");
        assert_eq!(first["threadId"], "bench-t-3");
        let messages = json!([{"id": "m", "role": "user", "content": "c"}]);
        let resume = resume_input(
            &spec,
            "bench-t-3.2",
            "bench-t-3.1",
            messages.clone(),
            "int_1",
        );
        assert_eq!(resume["parentRunId"], "bench-t-3.1");
        assert_eq!(resume["messages"], messages);
        assert_eq!(
            resume["resume"],
            json!([{"interruptId": "int_1", "status": "resolved", "payload": {"approved": true}}])
        );
    }
}
