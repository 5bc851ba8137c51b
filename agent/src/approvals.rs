//! Approvals: how a pending call ends, in words the model, the page and the audit log share.
//!
//! Pending approvals are rows of the store (a tool call whose status is `pending`), keyed by (run id, tool call id).
//! What can happen to one:
//!
//! - a person decides ([`crate::harness::Harness::decide`]);
//! - nobody decides in time: the harness's sweeper denies it with source `timeout`;
//! - the run aborts (cancelled, its client gone, the server shutting down with a memory store): denied with source
//!   `abort`.
//!
//! Whichever of them the store lets change the row first, under its guard, decides; everybody else finds nothing
//! pending. That is the whole exactly-once argument, and it holds across processes on one database. The row and its
//! `approvalRequired` event are written together, before anyone can see the event: whoever sees it can decide at
//! once.

use std::time::Duration;

use serde_json::Value;

use crate::clock::now_ms;
use crate::events::AgentEvent;
use crate::ids::{RunId, ToolCallId};
use crate::interrupts::arguments_digest;
use crate::permissions::SessionGrant;
use crate::runtime::{encode, tool_result};
use crate::store::{AuditEntry, AuditKind, CallRecord, CallStatus, Settlement};
use crate::wire::{
    ApprovalRequest, ApprovalSource, Decision, DenialSource, Resolution, ToolErrorCode, ToolOutput,
    approval_denied_message,
};

/// The approval API's default: two minutes for a person to decide.
pub const DEFAULT_APPROVAL_TIMEOUT: Duration = Duration::from_secs(120);

/// The resolved pending entry and how it was resolved: the answer to a decision.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedApproval {
    pub pending: ApprovalRequest,
    pub resolution: Resolution,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "No pending approval found for run {run_id} and tool call {tool_call_id}. It may have already been resolved or timed out."
)]
pub struct ApprovalNotFound {
    pub run_id: RunId,
    pub tool_call_id: ToolCallId,
}

impl Resolution {
    /// The resolution a person's decision on a call asked with the arguments `asked` makes. Arguments sent back
    /// unchanged with an approval (as clients do) are no edit: the approval is `approved`, not `approved_with_edits`.
    pub fn from_decision(decision: Decision, asked: &Value) -> Self {
        match decision {
            Decision::Approve {
                scope,
                reason,
                arguments,
            } => Resolution::Approved {
                source: ApprovalSource::User,
                scope,
                reason,
                edited_arguments: arguments.filter(|edited| edited != asked),
            },
            Decision::Deny { reason } => Resolution::Denied {
                source: DenialSource::User,
                reason: match reason {
                    Some(reason) => format!("The user denied this tool call: {reason}"),
                    None => "The user denied this tool call.".to_owned(),
                },
            },
        }
    }
}

/// The denial a timeout or an abort makes.
pub fn denied_by(source: DenialSource, timeout: Duration) -> Resolution {
    let reason = match source {
        DenialSource::Timeout => format!(
            "No decision arrived within {} s, so the call was denied.",
            timeout.as_secs_f64()
        ),
        DenialSource::Abort => "The run was aborted before a decision arrived.".to_owned(),
        DenialSource::User => "The user denied this tool call.".to_owned(),
    };
    Resolution::Denied { source, reason }
}

/// The denial of a call an aborted run will not run (allowed, or approved, but not started).
pub fn not_run_after_abort() -> Resolution {
    Resolution::Denied {
        source: DenialSource::Abort,
        reason: ABORTED_BEFORE_IT_RAN.to_owned(),
    }
}

/// Why a call an aborted run will not run did not run.
pub const ABORTED_BEFORE_IT_RAN: &str = "The run was aborted before this call ran.";

/// What settles a call with `resolution`: its status and output, its events, and the audit entry, by `actor`.
///
/// A pending call's resolution is announced (`approvalResolved`) and audited; a call that needed nobody, or was
/// approved already, keeps its resolution and only gets its output when `resolution` denies it (an abort before
/// it ran).
pub fn settlement(record: &CallRecord, resolution: Resolution, actor: Option<&str>) -> Settlement {
    granting_settlement(record, resolution, actor, None)
}

/// The same, for an approval for the session: `approvalResolved` names the grant it made, and a `debug` event
/// says what the grant covers; the grant is kept with the decision.
pub fn granting_settlement(
    record: &CallRecord,
    resolution: Resolution,
    actor: Option<&str>,
    grant: Option<SessionGrant>,
) -> Settlement {
    let run_id = &record.run_id;
    let call = &record.call;
    let was_pending = record.status == CallStatus::Pending;
    let kept = grant
        .as_ref()
        .filter(|_| was_pending)
        .map(crate::policy::stored_grant);
    let mut events = Vec::new();
    if was_pending {
        let waited = record.approval.as_ref().map_or(Duration::ZERO, |approval| {
            Duration::from_millis(now_ms().saturating_sub(approval.requested_at))
        });
        events.extend(encode(
            run_id,
            AgentEvent::ApprovalResolved {
                tool_call_id: call.id.clone(),
                tool_name: call.name.clone(),
                resolution: resolution.clone(),
                waited,
                grant: grant.clone(),
            },
        ));
        if let Some(grant) = grant {
            events.extend(encode(run_id, AgentEvent::SessionGrantAdded { grant }));
        }
    }
    let (status, output, edited_arguments) = match &resolution {
        Resolution::Approved {
            edited_arguments, ..
        } => (CallStatus::Approved, None, edited_arguments.clone()),
        Resolution::Denied { reason, .. } => {
            let output = ToolOutput::error(
                ToolErrorCode::ApprovalDenied,
                approval_denied_message(reason),
            );
            events.extend(tool_result(
                run_id,
                call,
                None,
                output.clone(),
                Duration::ZERO,
            ));
            (CallStatus::Denied, Some(output), None)
        }
    };
    let audit = match (was_pending, &resolution) {
        (true, _) => vec![resolution_audit(record, &resolution, actor)],
        (
            _,
            Resolution::Denied {
                source: DenialSource::Abort,
                reason,
            },
        ) => not_run_after_abort_entry(record, reason, actor)
            .into_iter()
            .collect(),
        _ => Vec::new(),
    };
    Settlement {
        resolution: match (&record.resolution, was_pending) {
            (Some(kept), false) => kept.clone(),
            _ => resolution,
        },
        status,
        edited_arguments,
        output,
        events,
        audit,
        grant: kept,
        under_grant: None,
    }
}

/// The audit log's line for a call a person approved whose run ended before it ran (cancelled, its client gone),
/// with `reason` and who ended it: without it the log would hold the approval and nothing to say the call never ran.
/// `None` for a call nobody approved (one the policy allowed has no approval to contradict).
pub fn not_run_after_abort_entry(
    record: &CallRecord,
    reason: &str,
    actor: Option<&str>,
) -> Option<AuditEntry> {
    matches!(record.resolution, Some(Resolution::Approved { .. })).then(|| AuditEntry {
        actor: actor.map(str::to_owned),
        ..not_run_entry(record, "abort", reason)
    })
}

/// The audit log's line for a call a decision let run that was not run (`source`: what stopped it, and `reason`
/// why): without it the log would hold an approval, and nothing to say its call never ran. Its digests are the
/// approval's: the arguments asked about, and the ones a person edited.
pub fn not_run_entry(record: &CallRecord, source: &str, reason: &str) -> AuditEntry {
    AuditEntry {
        run_id: Some(record.run_id.clone()),
        tool_call_id: Some(record.call.id.clone()),
        tool: Some(record.call.name.clone()),
        arguments_digest: Some(arguments_digest(&record.input)),
        edited_digest: record.edited_digest(),
        source: Some(source.to_owned()),
        reason: Some(reason.to_owned()),
        ..AuditEntry::new(AuditKind::CallRefused, NOT_RUN_OUTCOME)
    }
}

/// The outcome of a line that says a call a decision let run did not run ([`not_run_entry`]).
pub const NOT_RUN_OUTCOME: &str = "not_run";

/// The outcomes of [`resolution_audit`]'s lines that approve a call: as it was asked about, and edited.
pub const APPROVED_OUTCOMES: [&str; 2] = ["approved", "approved_with_edits"];

/// The audit entry of a pending call's resolution.
pub fn resolution_audit(
    record: &CallRecord,
    resolution: &Resolution,
    actor: Option<&str>,
) -> AuditEntry {
    let (outcome, source, scope, reason, edited) = match resolution {
        Resolution::Approved {
            scope,
            reason,
            edited_arguments,
            ..
        } => (
            if edited_arguments.is_some() {
                APPROVED_OUTCOMES[1]
            } else {
                APPROVED_OUTCOMES[0]
            },
            "user",
            Some(scope.as_str()),
            reason.clone(),
            edited_arguments.as_ref().map(arguments_digest),
        ),
        Resolution::Denied { source, reason } => (
            match source {
                DenialSource::User => "denied",
                DenialSource::Timeout => "timed_out",
                DenialSource::Abort => "aborted",
            },
            match source {
                DenialSource::User => "user",
                DenialSource::Timeout => "timeout",
                DenialSource::Abort => "abort",
            },
            None,
            Some(reason.clone()),
            None,
        ),
    };
    AuditEntry {
        id: 0,
        at: now_ms(),
        kind: AuditKind::ApprovalResolved,
        session_id: None,
        run_id: Some(record.run_id.clone()),
        tool_call_id: Some(record.call.id.clone()),
        tool: Some(record.call.name.clone()),
        arguments_digest: Some(arguments_digest(&record.input)),
        edited_digest: edited,
        outcome: outcome.to_owned(),
        source: Some(source.to_owned()),
        scope: scope.map(str::to_owned),
        reason,
        // A person decides, or cancels the run (an abort a person asked for); nobody times a card out.
        actor: match resolution {
            Resolution::Denied {
                source: DenialSource::Timeout,
                ..
            } => None,
            Resolution::Approved { .. } | Resolution::Denied { .. } => actor.map(str::to_owned),
        },
    }
}

/// The audit entry of a call that asks for approval.
pub fn request_audit(record: &CallRecord) -> Option<AuditEntry> {
    let approval = record.approval.as_ref()?;
    Some(AuditEntry {
        id: 0,
        at: approval.requested_at,
        kind: AuditKind::ApprovalRequested,
        session_id: None,
        run_id: Some(record.run_id.clone()),
        tool_call_id: Some(record.call.id.clone()),
        tool: Some(record.call.name.clone()),
        arguments_digest: Some(arguments_digest(&record.input)),
        edited_digest: None,
        outcome: "requested".to_owned(),
        source: None,
        scope: None,
        reason: Some(approval.reason.clone()),
        actor: None,
    })
}
