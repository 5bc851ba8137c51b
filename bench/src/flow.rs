//! One approval round trip, end to end and verified, over a given protocol.
//!
//! The round-trip scenarios measure any [`ApprovalFlow`]: [`ApprovalApiFlow`] over the approval API's routes (a streamed run, a
//! decision POST while its stream stays open), and [`AguiFlow`] over the AG-UI interrupt flow (run 1 until its
//! interrupt, run 2 with the resume until the final answer). Each trip uses its [`TripSpec`]'s session and file;
//! everything else (workers, rounds, /proc figures, file checks, the report) is shared in [`crate::roundtrip`].

mod agui;

pub use agui::AguiFlow;

use std::future::Future;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::api::{Api, TripError};

/// What the file of every trip contains.
pub const CONTENT: &str = "x";

/// The identity of one trip: its own session and its own file in the server's workspace.
#[derive(Clone, Debug)]
pub struct TripSpec {
    pub session_id: String,
    /// Relative to the server's workspace.
    pub file: String,
}

impl TripSpec {
    pub fn new(label: &str, index: usize) -> Self {
        Self {
            session_id: format!("bench-{label}-{index}"),
            file: format!("bench/{label}-{index}.txt"),
        }
    }

    /// The user message that makes the scripted model call `write_file` once, which asks for approval under the
    /// default policy `on_request`.
    pub fn message(&self) -> String {
        format!("write {}: {CONTENT}", self.file)
    }
}

/// How long the parts of one trip took, as the client saw them.
#[derive(Clone, Copy, Debug)]
pub struct TripTiming {
    /// From sending the request that starts the run to receiving its final event.
    pub whole: Duration,
    /// From sending the request that starts the run to receiving the approval request (AG-UI: run 1's
    /// `RUN_FINISHED` with the interrupt).
    pub to_approval: Duration,
    /// From sending the decision to receiving `approvalResolved` on the run's stream (AG-UI: from sending the
    /// resume to receiving the resumed run's `TOOL_CALL_RESULT`).
    pub decision_to_resolved: Duration,
    /// From sending the decision to receiving the decision's own HTTP response (AG-UI: the resumed run's response
    /// head, its 200).
    pub decision_response: Duration,
}

/// What a flow's trip and the legs of its [`TripTiming`] are, in the report's words.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Legs {
    /// The trip, step by step.
    pub trip: &'static str,
    /// What [`TripTiming::to_approval`] measures.
    pub to_approval: &'static str,
    /// What [`TripTiming::decision_to_resolved`] measures.
    pub decision_to_resolved: &'static str,
    /// What [`TripTiming::decision_response`] measures.
    pub decision_response: &'static str,
}

/// One way of taking a run through one approval. `trip` must verify everything it can see on the wire and fail
/// otherwise; the runner checks the file on disk afterwards.
pub trait ApprovalFlow: Send + Sync + 'static {
    fn name(&self) -> &'static str;

    /// How the report names the trip and its measured legs.
    fn legs(&self) -> Legs;

    fn trip(
        &self,
        api: &Api,
        spec: &TripSpec,
        patience: Duration,
    ) -> impl Future<Output = Result<TripTiming, TripError>> + Send;
}

/// The approval API's routes: `POST /api/agent/stream`, then `POST /api/agent/approvals/{runId}/{toolCallId}`.
pub struct ApprovalApiFlow;

fn text<'a>(value: &'a Value, field: &str, event: &str) -> Result<&'a str, TripError> {
    value[field]
        .as_str()
        .ok_or_else(|| TripError::Unverified(format!("the {event} event has no {field}: {value}")))
}

impl ApprovalFlow for ApprovalApiFlow {
    fn name(&self) -> &'static str {
        "approval API"
    }

    fn legs(&self) -> Legs {
        Legs {
            trip: "POST stream -> approvalRequired -> POST decision -> approvalResolved -> done",
            to_approval: "start -> approvalRequired",
            decision_to_resolved: "decision -> approvalResolved",
            decision_response: "decision -> its 200",
        }
    }

    async fn trip(
        &self,
        api: &Api,
        spec: &TripSpec,
        patience: Duration,
    ) -> Result<TripTiming, TripError> {
        let started = Instant::now();
        let mut events = api
            .start_stream(&spec.message(), &spec.session_id, patience)
            .await?;
        let required = events.until("approvalRequired").await?;
        let asked_at = Instant::now();

        let request = &required["request"];
        let run_id = text(request, "runId", "approvalRequired")?;
        let call_id = text(request, "toolCallId", "approvalRequired")?;
        let tool = text(request, "toolName", "approvalRequired")?;
        if tool != "write_file" || request["arguments"]["path"] != spec.file.as_str() {
            return Err(TripError::Unverified(format!(
                "the approval asks for another call than write_file {}: {request}",
                spec.file
            )));
        }

        // The decision and the stream progress together: the stream is read while the POST is in flight.
        let sent_at = Instant::now();
        let decide = async {
            let outcome = api.approve(run_id, call_id).await;
            (outcome, Instant::now())
        };
        let resolved = async {
            let outcome = events.until("approvalResolved").await;
            (outcome, Instant::now())
        };
        let ((decided, responded_at), (resolved, resolved_at)) = tokio::join!(decide, resolved);
        decided?;
        check_resolved(&resolved?, call_id)?;

        let mut tool_ok = false;
        loop {
            let Some(event) = events.next("done").await? else {
                return Err(TripError::Ended {
                    waiting_for: "done".to_owned(),
                });
            };
            match event.name.as_str() {
                "toolResult" => {
                    let result = event.json()?;
                    if result["toolCallId"] != call_id {
                        continue;
                    }
                    let output = &result["output"];
                    if output["status"] != "ok" {
                        return Err(TripError::Unverified(format!(
                            "the approved tool did not run: {output}"
                        )));
                    }
                    tool_ok = true;
                }
                "done" => {
                    event.json()?;
                    break;
                }
                "error" => return Err(TripError::RunFailed(event.data)),
                _ => {}
            }
        }
        let done_at = Instant::now();
        if !tool_ok {
            return Err(TripError::Unverified(
                "the run ended without a toolResult for the approved call".to_owned(),
            ));
        }
        events.expect_end().await?;
        Ok(TripTiming {
            whole: done_at - started,
            to_approval: asked_at - started,
            decision_to_resolved: resolved_at - sent_at,
            decision_response: responded_at - sent_at,
        })
    }
}

/// An `approvalResolved` event must be about this call, and approved.
pub fn check_resolved(event: &Value, call_id: &str) -> Result<(), TripError> {
    if event["toolCallId"] != call_id {
        return Err(TripError::Unverified(format!(
            "approvalResolved is about another call than {call_id}: {event}"
        )));
    }
    if event["resolution"]["type"] != "approved" {
        return Err(TripError::Unverified(format!(
            "the call was not approved: {}",
            event["resolution"]
        )));
    }
    Ok(())
}
