//! The audit log as a harness on the durable default writes it: one entry for every approval requested, and one
//! for how each ended (approved once or for the session, with edited arguments, denied, timed out, aborted), with
//! a digest of the arguments and of the edited ones, the source, the scope, the reason and who decided.

mod support;

use std::time::Duration;

use agent::harness::{Actor, Harness, RunSource, StartRun};
use agent::interrupts::arguments_digest;
use agent::store::AuditKind;
use agent::wire::{ApprovalMode, Decision, DecisionScope};
use serde_json::json;
use support::{Events, sqlite_harness};

async fn start(harness: &Harness, message: &str) -> agent::harness::RunHandle {
    harness
        .start(StartRun {
            message: message.into(),
            session_id: Some("audited".parse().unwrap()),
            policy: None,
            mode: ApprovalMode::Interactive,
            run_id: None,
            source: RunSource::Session,
            refused_while_interrupted: false,
        })
        .await
        .unwrap()
}

#[tokio::test]
async fn every_way_an_approval_ends_is_in_the_audit_log_with_who_and_what() {
    let dir = tempfile::tempdir().unwrap();
    let harness = sqlite_harness(dir.path(), Duration::from_millis(400)).await;
    let alice = Actor::new("login");

    // Approved for the session, with edited arguments.
    let run = start(&harness, "write a.txt: from the model").await;
    let request = Events::of(&run).next_approval().await;
    let edited = json!({"path": "a.txt", "content": "from a person"});
    harness
        .decide(
            &request.run_id,
            &request.tool_call_id,
            Decision::Approve {
                scope: DecisionScope::Session,
                reason: Some("looks right".into()),
                arguments: Some(edited.clone()),
            },
            &alice,
        )
        .await
        .unwrap();
    run.finished().await;

    // Denied by a person.
    let run = start(&harness, "delete b.txt").await;
    let request = Events::of(&run).next_approval().await;
    harness
        .decide(
            &request.run_id,
            &request.tool_call_id,
            Decision::Deny {
                reason: Some("keep it".into()),
            },
            &alice,
        )
        .await
        .unwrap();
    run.finished().await;

    // Aborted: the run was cancelled while the card waited.
    let run = start(&harness, "delete c.txt").await;
    Events::of(&run).next_approval().await;
    harness.cancel(run.run_id(), &alice).await.unwrap();
    run.finished().await;

    // Timed out: nobody decided within the approval timeout.
    let run = start(&harness, "delete d.txt").await;
    run.finished().await;

    let entries = support::audit_entries(&harness).await;
    /// What an entry says: its kind, outcome, source, scope and actor.
    type Said<'a> = (
        AuditKind,
        &'a str,
        Option<&'a str>,
        Option<&'a str>,
        Option<&'a str>,
    );
    let summary: Vec<Said> = entries
        .iter()
        .map(|e| {
            (
                e.kind.clone(),
                e.outcome.as_str(),
                e.source.as_deref(),
                e.scope.as_deref(),
                e.actor.as_deref(),
            )
        })
        .collect();
    use AuditKind::{ApprovalRequested as Requested, ApprovalResolved as Resolved};
    assert_eq!(
        summary,
        [
            (Requested, "requested", None, None, None),
            (
                Resolved,
                "approved_with_edits",
                Some("user"),
                Some("session"),
                Some("login")
            ),
            (Requested, "requested", None, None, None),
            (Resolved, "denied", Some("user"), None, Some("login")),
            (Requested, "requested", None, None, None),
            // Who cancelled the run is who aborted its card.
            (Resolved, "aborted", Some("abort"), None, Some("login")),
            (Requested, "requested", None, None, None),
            (Resolved, "timed_out", Some("timeout"), None, None),
        ]
    );
    let approved = &entries[1];
    assert_eq!(approved.tool.as_deref(), Some("write_file"));
    assert_eq!(
        approved.arguments_digest.as_deref(),
        Some(arguments_digest(&json!({"path": "a.txt", "content": "from the model"})).as_str())
    );
    assert_eq!(
        approved.edited_digest.as_deref(),
        Some(arguments_digest(&edited).as_str())
    );
    assert_eq!(approved.reason.as_deref(), Some("looks right"));
    assert_eq!(
        entries[3].reason.as_deref(),
        Some("The user denied this tool call: keep it")
    );
    assert!(
        entries
            .iter()
            .all(|e| e.session_id.as_ref().map(|s| s.as_str()) == Some("audited")),
        "each entry names its session"
    );
    assert!(
        entries
            .windows(2)
            .all(|w| w[0].at <= w[1].at && w[0].id < w[1].id),
        "in order"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("ws/a.txt")).unwrap(),
        "from a person"
    );
}
