//! The harness as the server uses it: runs as resources with replayable event logs, sessions, decisions, policy
//! limits, cancellation, retention and shutdown.

mod support;

use std::sync::Arc;
use std::time::Duration;

use agent::harness::{
    Actor, DecideError, Harness, HarnessConfig, Retention, RunSource, StartError, StartRun,
};
use agent::model::ScriptedModel;
use agent::policy::PermissionPolicy;
use agent::tools::{Workspace, workspace_tools};
use agent::view::RunStatus;
use agent::wire::{
    ApprovalMode, ApprovalPolicy, Decision, DecisionScope, RunErrorCode, StreamEvent,
};
use futures::StreamExt;
use serde_json::json;

struct Setup {
    harness: Harness,
    dir: tempfile::TempDir,
}

fn setup_with(policy: ApprovalPolicy, retention: Retention) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let workspace = Workspace::open(dir.path()).unwrap();
    let mut config = HarnessConfig::new(
        PermissionPolicy::new(policy, Default::default()),
        Duration::from_secs(120),
    );
    config.retention = retention;
    let harness = Harness::new(
        config,
        Arc::new(ScriptedModel::new()),
        workspace_tools(&workspace, Default::default()),
    );
    Setup { harness, dir }
}

fn setup() -> Setup {
    setup_with(ApprovalPolicy::OnRequest, Retention::default())
}

fn start(message: &str) -> StartRun {
    StartRun {
        message: message.into(),
        session_id: None,
        policy: None,
        mode: ApprovalMode::Interactive,
        run_id: None,
        source: RunSource::Session,
        refused_while_interrupted: false,
    }
}

fn decode(json: &str) -> StreamEvent {
    serde_json::from_str(json).unwrap()
}

/// Whether a run's events end with its bound on events.
fn ended_at_the_event_limit(events: &[StreamEvent]) -> bool {
    matches!(
        events.last(),
        Some(StreamEvent::Error {
            code: RunErrorCode::EventLimit,
            ..
        })
    )
}

/// Reads a run's events until one matches.
async fn until(
    stream: &mut futures::stream::BoxStream<'static, Arc<agent::store::EncodedEvent>>,
    matches: impl Fn(&StreamEvent) -> bool,
) -> (u64, StreamEvent) {
    while let Some(encoded) = stream.next().await {
        let event = decode(&encoded.json);
        assert_eq!(encoded.kind, event.kind());
        if matches(&event) {
            return (encoded.seq, event);
        }
    }
    panic!("the stream ended first");
}

/// Reads `stream` up to the run's approval request: its sequence number, and the request.
async fn next_approval(
    stream: &mut futures::stream::BoxStream<'static, Arc<agent::store::EncodedEvent>>,
) -> (u64, agent::wire::ApprovalRequest) {
    match until(stream, |e| {
        matches!(e, StreamEvent::ApprovalRequired { .. })
    })
    .await
    {
        (seq, StreamEvent::ApprovalRequired { request }) => (seq, request),
        _ => unreachable!(),
    }
}

#[tokio::test]
async fn a_run_streams_its_events_in_order_with_increasing_ids() {
    let Setup { harness, dir } = setup();
    std::fs::write(dir.path().join("a.txt"), "hi").unwrap();
    let record = harness.start(start("read a.txt")).await.unwrap();
    let events: Vec<_> = record.subscribe(0).collect().await;
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>());
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e.kind)
        .filter(|k| *k != "debug")
        .collect();
    assert_eq!(kinds.first(), Some(&"runStarted"));
    assert_eq!(kinds.last(), Some(&"done"));
    assert!(kinds.contains(&"toolCall") && kinds.contains(&"toolResult"));
    let view = record.view().await.unwrap().unwrap();
    assert_eq!(view.status, RunStatus::Done);
    assert!(
        view.answer
            .unwrap()
            .contains("read_file read a.txt: \"hi\"")
    );
}

#[tokio::test]
async fn a_late_subscriber_and_a_reconnect_miss_nothing_and_repeat_nothing() {
    let Setup { harness, .. } = setup();
    let record = harness.start(start("delete a.txt")).await.unwrap();
    let mut first = record.subscribe(0);
    let (seen_up_to, request) = next_approval(&mut first).await;
    drop(first);

    harness
        .decide(
            &request.run_id,
            &request.tool_call_id,
            Decision::deny(),
            &Actor::local(),
        )
        .await
        .unwrap();
    record.finished().await;

    // A reconnect from the last id it saw gets exactly the rest.
    let rest: Vec<u64> = record.subscribe(seen_up_to).map(|e| e.seq).collect().await;
    let all: Vec<u64> = record.subscribe(0).map(|e| e.seq).collect().await;
    assert_eq!(rest.first(), Some(&(seen_up_to + 1)));
    assert_eq!(all.len() as u64, seen_up_to + rest.len() as u64);
    assert_eq!(&all[seen_up_to as usize..], &rest[..]);
    // A subscriber from past the end gets nothing and ends.
    assert_eq!(record.subscribe(10_000).count().await, 0);
}

#[tokio::test]
async fn two_subscribers_see_the_same_events() {
    let Setup { harness, .. } = setup();
    let record = harness.start(start("delete a.txt")).await.unwrap();
    let one = record.subscribe(0);
    let mut two = record.subscribe(0);
    let (_, request) = next_approval(&mut two).await;
    harness
        .decide(
            &request.run_id,
            &request.tool_call_id,
            Decision::approve(),
            &Actor::local(),
        )
        .await
        .unwrap();
    let one: Vec<String> = one.map(|e| e.json.to_string()).collect().await;
    let all_two: Vec<String> = record
        .subscribe(0)
        .map(|e| e.json.to_string())
        .collect()
        .await;
    assert_eq!(one, all_two);
    assert!(one.last().unwrap().contains("\"type\":\"done\""));
}

#[tokio::test]
async fn a_session_remembers_earlier_turns_and_its_grants() {
    let Setup { harness, dir } = setup();
    std::fs::write(dir.path().join("a.txt"), "a").unwrap();
    std::fs::write(dir.path().join("b.txt"), "b").unwrap();
    let session = "session-1".parse().unwrap();
    let first = harness
        .start(StartRun {
            session_id: Some(session),
            ..start("delete a.txt")
        })
        .await
        .unwrap();
    let mut events = first.subscribe(0);
    let (_, request) = next_approval(&mut events).await;
    harness
        .decide(
            &request.run_id,
            &request.tool_call_id,
            for_the_session(),
            &Actor::local(),
        )
        .await
        .unwrap();
    first.finished().await;

    let second = harness
        .start(StartRun {
            session_id: Some(first.session_id().clone()),
            ..start("delete b.txt")
        })
        .await
        .unwrap();
    second.finished().await;
    let view = second.view().await.unwrap().unwrap();
    assert_eq!(view.status, RunStatus::Done);
    let call = view.tool_calls().next().unwrap();
    assert!(call.approval.is_none(), "no approval was asked");
    assert!(call.output.as_ref().unwrap().is_ok());
    assert!(!dir.path().join("b.txt").exists());
    // The scripted model numbers calls by the conversation so far: it saw the first turn.
    assert_eq!(call.id.as_str(), "call_2");

    let session_view = harness.session_view(first.session_id()).await.unwrap();
    assert_eq!(session_view.runs.len(), 2);
}

#[tokio::test]
async fn a_session_runs_one_run_at_a_time() {
    let Setup { harness, .. } = setup();
    let first = harness
        .start(StartRun {
            session_id: Some("s".parse().unwrap()),
            ..start("delete a.txt")
        })
        .await
        .unwrap();
    let busy = harness
        .start(StartRun {
            session_id: Some("s".parse().unwrap()),
            ..start("list files")
        })
        .await
        .unwrap_err();
    assert!(matches!(busy, StartError::SessionBusy { .. }));
    assert!(busy.to_string().contains(first.run_id().as_str()));
}

#[tokio::test]
async fn whoever_sees_done_can_start_the_sessions_next_run_at_once() {
    let Setup { harness, .. } = setup();
    let session = Some("s".parse().unwrap());
    for _ in 0..20 {
        let record = harness
            .start(StartRun {
                session_id: session.clone(),
                ..start("hello")
            })
            .await
            .unwrap();
        record.finished().await;
    }
}

#[tokio::test]
async fn a_run_may_ask_for_a_stricter_policy_but_never_a_looser_one() {
    let Setup { harness, .. } = setup();
    let error = harness
        .start(StartRun {
            policy: Some(ApprovalPolicy::Trusted),
            ..start("delete a.txt")
        })
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "Policy trusted is looser than the server's policy on_request; a run may only ask for a stricter one."
    );
    let strict = harness
        .start(StartRun {
            policy: Some(ApprovalPolicy::Strict),
            ..start("list files")
        })
        .await
        .unwrap();
    let mut events = strict.subscribe(0);
    let (_, request) = next_approval(&mut events).await;
    assert_eq!(
        request.tool_name, "list_files",
        "strict asks even for read-only tools"
    );
}

#[tokio::test]
async fn edited_arguments_that_break_the_schema_are_refused_and_the_approval_stays() {
    let Setup { harness, .. } = setup();
    let record = harness.start(start("delete a.txt")).await.unwrap();
    let mut events = record.subscribe(0);
    let (_, request) = next_approval(&mut events).await;
    let error = harness
        .decide(
            &request.run_id,
            &request.tool_call_id,
            Decision::Approve {
                scope: DecisionScope::Once,
                reason: None,
                arguments: Some(json!({"path": 7})),
            },
            &Actor::local(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(error, DecideError::InvalidArguments(ref m) if m.contains("/path")),
        "{error:?}"
    );
    assert_eq!(
        harness.pending(Some(&request.run_id)).await.unwrap().len(),
        1
    );
}

#[tokio::test]
async fn cancelling_a_run_denies_its_pending_approvals_as_aborted() {
    let Setup { harness, .. } = setup();
    let record = harness.start(start("delete a.txt")).await.unwrap();
    let mut events = record.subscribe(0);
    until(&mut events, |e| {
        matches!(e, StreamEvent::ApprovalRequired { .. })
    })
    .await;
    harness
        .cancel(record.run_id(), &Actor::local())
        .await
        .unwrap();
    let (_, resolved) = until(&mut events, |e| {
        matches!(e, StreamEvent::ApprovalResolved { .. })
    })
    .await;
    assert!(
        serde_json::to_string(&resolved)
            .unwrap()
            .contains("\"source\":\"abort\"")
    );
    let (_, end) = until(&mut events, StreamEvent::is_terminal).await;
    assert!(matches!(
        end,
        StreamEvent::Error {
            code: RunErrorCode::Aborted,
            ..
        }
    ));
    assert!(harness.pending(None).await.unwrap().is_empty());
    assert!(
        harness
            .cancel(&"nope".parse().unwrap(), &Actor::local())
            .await
            .is_err()
    );
}

/// The bytes of a run's events in the log.
async fn log_bytes(record: &agent::harness::RunHandle) -> u64 {
    record
        .subscribe(0)
        .map(|event| event.json.len() as u64)
        .fold(0, |total, bytes| async move { total + bytes })
        .await
}

/// Approves the one call `message` asks about after `meanwhile` ran, and returns the run's events.
async fn approved_after(
    setup: &Setup,
    message: &str,
    meanwhile: impl AsyncFnOnce(),
) -> Vec<StreamEvent> {
    decided_after(setup, message, meanwhile, |_| Decision::approve()).await
}

/// The same, with the decision made from the card.
async fn decided_after(
    setup: &Setup,
    message: &str,
    meanwhile: impl AsyncFnOnce(),
    decision: impl FnOnce(&agent::wire::ApprovalRequest) -> Decision,
) -> Vec<StreamEvent> {
    let record = setup.harness.start(start(message)).await.unwrap();
    let mut events = record.subscribe(0);
    let (_, request) = next_approval(&mut events).await;
    meanwhile().await;
    setup
        .harness
        .decide(
            &request.run_id,
            &request.tool_call_id,
            decision(&request),
            &Actor::local(),
        )
        .await
        .unwrap();
    record
        .subscribe(0)
        .map(|encoded| decode(&encoded.json))
        .collect()
        .await
}

/// The output of the run's one tool call.
fn tool_output(events: &[StreamEvent]) -> agent::wire::ToolOutput {
    events
        .iter()
        .find_map(|event| match event {
            StreamEvent::ToolResult { output, .. } => Some(output.clone()),
            _ => None,
        })
        .expect("a tool result")
}

/// The audit log's lines as (kind, outcome).
fn audit_lines(audit: &[agent::store::AuditEntry]) -> Vec<(&str, &str)> {
    audit
        .iter()
        .map(|entry| (entry.kind.as_str(), entry.outcome.as_str()))
        .collect()
}

/// A call asked about, approved, and not run.
const APPROVED_THEN_NOT_RUN: [(&str, &str); 3] = [
    ("approval_requested", "requested"),
    ("approval_resolved", "approved"),
    ("call_refused", "not_run"),
];

/// An approval is for the file its card showed: a file written, replaced or deleted between the card and the
/// approval is not touched, and the model is told why. Before, the card for "delete notes.txt, 7 bytes: scratch"
/// deleted whatever notes.txt held by the time someone approved it (cards wait for hours, and survive restarts).
#[tokio::test]
async fn an_approved_call_does_not_touch_a_file_that_changed_after_its_card() {
    let setup = setup();
    let file = setup.dir.path().join("notes.txt");
    std::fs::write(&file, "scratch").unwrap();
    let events = approved_after(&setup, "delete notes.txt", async || {
        std::fs::write(&file, "a day of real work").unwrap()
    })
    .await;
    let output = tool_output(&events);
    assert!(
        matches!(&output, agent::wire::ToolOutput::Error { code: agent::wire::ToolErrorCode::PermissionDenied, message }
            if message.contains("changed after approval was asked")),
        "{output:?}"
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "a day of real work"
    );
    // The audit log has the approval, and beside it a line that says the call was not run, and why: without it a
    // reader of the log would take the delete for done.
    let audit = support::audit_entries(&setup.harness).await;
    assert_eq!(audit_lines(&audit), APPROVED_THEN_NOT_RUN);
    let not_run = &audit[2];
    assert_eq!(not_run.tool.as_deref(), Some("delete_file"));
    assert_eq!(not_run.tool_call_id, audit[1].tool_call_id);
    assert_eq!(not_run.run_id, audit[1].run_id);
    assert!(not_run.session_id.is_some());
    assert_eq!(not_run.arguments_digest, audit[1].arguments_digest);
    assert!(
        not_run
            .reason
            .as_deref()
            .is_some_and(|reason| reason.contains("changed after approval was asked")),
        "{not_run:?}"
    );

    // A new file's card: the file appeared meanwhile, and is not overwritten.
    let fresh = setup.dir.path().join("fresh.txt");
    let events = approved_after(&setup, "write fresh.txt: from the model", async || {
        std::fs::write(&fresh, "written by a person").unwrap()
    })
    .await;
    assert!(!tool_output(&events).is_ok());
    assert_eq!(
        std::fs::read_to_string(&fresh).unwrap(),
        "written by a person"
    );

    // Unchanged, it runs.
    let events = approved_after(&setup, "delete notes.txt", async || {}).await;
    assert!(tool_output(&events).is_ok(), "{events:?}");
    assert!(!file.exists());
}

/// A call a person approved that its run's end leaves unrun (the run cancelled between the approval and the call's
/// turn) has an audit line that says so, beside the approval: before, the log held the approval and nothing else,
/// as it does for a call that ran.
#[tokio::test]
async fn an_approved_call_its_cancelled_run_never_ran_is_in_the_audit_log_as_not_run() {
    let setup = setup();
    let file = setup.dir.path().join("notes.txt");
    std::fs::write(&file, "scratch").unwrap();
    let record = setup
        .harness
        .start(start("delete notes.txt"))
        .await
        .unwrap();
    let mut events = record.subscribe(0);
    let (_, request) = next_approval(&mut events).await;
    // Approved in the store alone, as a decision is before its run goes on: the cancel comes before the call's turn.
    support::approved_in_the_store(&setup.harness, &request, None).await;
    setup
        .harness
        .cancel(&request.run_id, &Actor::local())
        .await
        .unwrap();
    let _: Vec<_> = events.collect().await;
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "scratch");
    let audit = support::audit_entries(&setup.harness).await;
    assert_eq!(audit_lines(&audit), APPROVED_THEN_NOT_RUN);
    let not_run = &audit[2];
    assert_eq!(not_run.tool_call_id, Some(request.tool_call_id.clone()));
    assert_eq!(not_run.arguments_digest, audit[1].arguments_digest);
    assert_eq!(not_run.source.as_deref(), Some("abort"));
    assert_eq!(not_run.actor.as_deref(), Some("local"));
    assert_eq!(
        not_run.reason.as_deref(),
        Some("The run was aborted before this call ran.")
    );
}

/// The same for a call a resume approved (AG-UI's way), whose run is cancelled before the call's turn: the resume's
/// approval is in the log, and so is the line that says the call did not run.
#[tokio::test]
async fn an_approved_call_of_a_resume_cancelled_before_it_ran_is_in_the_audit_log_as_not_run() {
    let setup = setup();
    let file = setup.dir.path().join("notes.txt");
    std::fs::write(&file, "scratch").unwrap();
    let interrupted = setup
        .harness
        .start(StartRun {
            mode: ApprovalMode::Interrupt,
            source: RunSource::Given(Vec::new()),
            ..start("delete notes.txt")
        })
        .await
        .unwrap();
    let _: Vec<_> = interrupted.subscribe(0).collect().await;
    let (suspension, _) = setup
        .harness
        .store()
        .interrupt(interrupted.run_id())
        .await
        .unwrap()
        .expect("the run ended with an interrupt");
    let pending = &suspension.interruption.pending[0];
    let resolutions = std::collections::HashMap::from([(
        pending.call.id.clone(),
        agent::wire::Resolution::from_decision(Decision::approve(), &pending.input),
    )]);
    let resumed = setup
        .harness
        .start(StartRun {
            message: String::new(),
            session_id: Some(suspension.session_id.clone()),
            mode: ApprovalMode::Interrupt,
            source: RunSource::Resume {
                suspension: Box::new(suspension.clone()),
                resolutions,
                decided_by: Actor::local(),
                added: Vec::new(),
            },
            ..start("")
        })
        .await
        .unwrap();
    // Before the run's task has had its turn (this test's runtime has one thread): the call never begins.
    setup
        .harness
        .cancel(resumed.run_id(), &Actor::local())
        .await
        .unwrap();
    let _: Vec<_> = resumed.subscribe(0).collect().await;
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "scratch");
    let audit = support::audit_entries(&setup.harness).await;
    assert_eq!(audit_lines(&audit), APPROVED_THEN_NOT_RUN);
    assert_eq!(audit[2].tool_call_id, audit[1].tool_call_id);
    assert_eq!(audit[2].source.as_deref(), Some("abort"));
}

/// Arguments sent back unchanged with an approval, as clients copy them from the request, are no edit: the audit
/// log says `approved`, not `approved_with_edits` with a digest of what was asked.
#[tokio::test]
async fn an_approval_with_the_asked_arguments_unchanged_is_no_edit() {
    let setup = setup();
    std::fs::write(setup.dir.path().join("notes.txt"), "scratch").unwrap();
    let events = decided_after(
        &setup,
        "delete notes.txt",
        async || {},
        |request| Decision::Approve {
            scope: DecisionScope::Once,
            reason: None,
            arguments: Some(request.arguments.clone()),
        },
    )
    .await;
    assert!(tool_output(&events).is_ok(), "{events:?}");
    let audit = support::audit_entries(&setup.harness).await;
    let resolved = audit
        .iter()
        .find(|entry| entry.kind.as_str() == "approval_resolved")
        .unwrap();
    assert_eq!(resolved.outcome, "approved");
    assert_eq!(resolved.edited_digest, None);
}

/// The same with arguments sent along the approval: the card's own, unchanged (as clients copy them from the
/// request), or an edit of a call on the same file, made looking at the file as the card showed it. Before, any
/// arguments skipped the check, and the file a person never saw was deleted or overwritten.
#[tokio::test]
async fn an_approval_with_arguments_does_not_touch_a_file_that_changed_after_its_card() {
    let setup = setup();
    let file = setup.dir.path().join("notes.txt");
    for (message, arguments) in [
        ("delete notes.txt", None),
        (
            "write notes.txt: draft",
            Some(serde_json::json!({"path": "notes.txt", "content": "final"})),
        ),
    ] {
        std::fs::write(&file, "scratch").unwrap();
        let events = decided_after(
            &setup,
            message,
            async || std::fs::write(&file, "a day of real work").unwrap(),
            |request| Decision::Approve {
                scope: agent::wire::DecisionScope::Once,
                reason: None,
                arguments: Some(arguments.unwrap_or_else(|| request.arguments.clone())),
            },
        )
        .await;
        let output = tool_output(&events);
        assert!(
            matches!(&output, agent::wire::ToolOutput::Error { code: agent::wire::ToolErrorCode::PermissionDenied, message }
                if message.contains("changed after approval was asked")),
            "{message}: {output:?}"
        );
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            "a day of real work",
            "{message}"
        );
    }
    // An edit to another file runs, though the card's file went meanwhile (both read as missing now).
    let moved = decided_after(
        &setup,
        "write notes.txt: draft",
        async || std::fs::remove_file(&file).unwrap(),
        |_| Decision::Approve {
            scope: agent::wire::DecisionScope::Once,
            reason: None,
            arguments: Some(serde_json::json!({"path": "elsewhere.txt", "content": "moved on"})),
        },
    )
    .await;
    assert!(tool_output(&moved).is_ok(), "{moved:?}");
    assert_eq!(
        std::fs::read_to_string(setup.dir.path().join("elsewhere.txt")).unwrap(),
        "moved on"
    );
    // An edit made with the file as it still is runs.
    std::fs::write(&file, "scratch").unwrap();
    let events = decided_after(
        &setup,
        "write notes.txt: draft",
        async || {},
        |_| Decision::Approve {
            scope: agent::wire::DecisionScope::Once,
            reason: None,
            arguments: Some(serde_json::json!({"path": "notes.txt", "content": "final"})),
        },
    )
    .await;
    assert!(tool_output(&events).is_ok(), "{events:?}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "final");
}

/// A `deny` rule beats a person's approval also when it was added while the call waited: the approved call is refused
/// as the rule says, without edits as with them. Before, only edited arguments were checked against the rules again,
/// and a card approved after the rule (hours later, from another tab) ran what the rule forbids.
#[tokio::test]
async fn a_deny_rule_added_while_a_call_waits_refuses_it_when_approved() {
    let setup = setup();
    let file = setup.dir.path().join("precious.txt");
    std::fs::write(&file, "keep").unwrap();
    let events = approved_after(&setup, "delete precious.txt", async || {
        let rule = agent::policy::Rule::parse("delete_file(precious.txt)=deny:Keep it.").unwrap();
        setup.harness.add_rule(rule, &Actor::local()).await.unwrap();
    })
    .await;
    let output = tool_output(&events);
    assert!(
        matches!(&output, agent::wire::ToolOutput::Error { code: agent::wire::ToolErrorCode::PermissionDenied, message }
            if message.contains("Keep it.")),
        "{output:?}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
}

/// Deletes a file after an approval: the bytes of the run's log when its approval was asked, when the deletion's
/// result was in it (what the run's part after the approval starts from), and at its end; and its end.
async fn delete_after_approval(setup: &Setup) -> ([u64; 3], StreamEvent) {
    let Setup { harness, dir } = setup;
    std::fs::write(dir.path().join("a.txt"), "x").unwrap();
    let record = harness.start(start("delete a.txt")).await.unwrap();
    let mut events = record.subscribe(0);
    let mut bytes = [0; 3];
    let mut total = 0;
    loop {
        let encoded = events.next().await.expect("the run ends");
        total += encoded.json.len() as u64;
        match decode(&encoded.json) {
            StreamEvent::ApprovalRequired { request } => {
                bytes[0] = total;
                harness
                    .decide(
                        &request.run_id,
                        &request.tool_call_id,
                        Decision::approve(),
                        &Actor::local(),
                    )
                    .await
                    .unwrap();
            }
            StreamEvent::ToolResult { .. } => bytes[1] = total,
            end if end.is_terminal() => {
                bytes[2] = total;
                return (bytes, end);
            }
            _ => {}
        }
    }
}

/// A run's bound on the bytes of its events holds over the whole run: the part after a batch that waited for a
/// person has what the parts before it left. Before, each part had the whole bound again, so a run could write its
/// bound once for every approval it asked.
#[tokio::test]
async fn a_runs_bound_on_event_bytes_holds_across_its_approvals() {
    let ([asked_at, resumed_at, total], end) = delete_after_approval(&setup()).await;
    assert!(matches!(end, StreamEvent::Done { .. }), "{end:?}");
    // Room for less than the next event after the result; either part alone fits in it.
    let bound = resumed_at + 10;
    assert!(
        asked_at < bound && total - resumed_at < bound,
        "each part alone is within the bound: {asked_at} then {} of {bound}",
        total - resumed_at
    );

    let bounded = setup_with(
        ApprovalPolicy::OnRequest,
        Retention {
            event_bytes_per_run: usize::try_from(bound).unwrap(),
            ..Retention::default()
        },
    );
    let (_, end) = delete_after_approval(&bounded).await;
    assert!(
        matches!(
            end,
            StreamEvent::Error {
                code: RunErrorCode::EventLimit,
                ..
            }
        ),
        "{end:?}"
    );
}

/// A run whose last events do not fit its bound on event bytes ends with the limit. Before, the model's answer was
/// refused from the log but the run still ended done, its log without the text the done run claimed to have said.
#[tokio::test]
async fn a_run_whose_last_events_pass_its_bound_ends_at_the_limit_not_done() {
    let Setup { harness: probe, .. } = setup();
    let whole = probe.start(start("hello")).await.unwrap();
    let sizes: Vec<(u64, StreamEvent)> = whole
        .subscribe(0)
        .map(|event| (event.json.len() as u64, decode(&event.json)))
        .collect()
        .await;
    let (terminal, before) = sizes.split_last().unwrap();
    assert!(matches!(terminal.1, StreamEvent::Done { .. }), "{sizes:?}");
    let (last, earlier) = before.split_last().unwrap();
    // Room for every event but the last one before the end (half of it: its timing may read shorter next time).
    let bound = earlier.iter().map(|(bytes, _)| bytes).sum::<u64>() + last.0 / 2;

    let Setup { harness, .. } = setup_with(
        ApprovalPolicy::OnRequest,
        Retention {
            event_bytes_per_run: usize::try_from(bound).unwrap(),
            ..Retention::default()
        },
    );
    let bounded = harness.start(start("hello")).await.unwrap();
    let events: Vec<StreamEvent> = bounded
        .subscribe(0)
        .map(|event| decode(&event.json))
        .collect()
        .await;
    assert!(
        ended_at_the_event_limit(&events),
        "the run ends at the limit, after {:?} ({events:?})",
        last.1
    );
}

/// A run whose batch's decisions pass its bound on event bytes runs none of the batch's calls, not even one that
/// needs no file lock (a command): the run ends at the limit. Before, the abort was seen by the calls that wait for
/// a file only, and `touch` ran in a run that had already ended.
#[tokio::test]
async fn calls_decided_past_the_runs_bound_on_event_bytes_do_not_run() {
    let probe = setup_with(ApprovalPolicy::Trusted, Retention::default());
    let whole = probe
        .harness
        .start(start("run touch marker"))
        .await
        .unwrap();
    let sizes: Vec<(u64, StreamEvent)> = whole
        .subscribe(0)
        .map(|event| (event.json.len() as u64, decode(&event.json)))
        .collect()
        .await;
    assert!(
        probe.dir.path().join("marker").exists(),
        "the command runs within the default bound: {sizes:?}"
    );
    let decided = sizes
        .iter()
        .position(|(_, event)| matches!(event, StreamEvent::ToolCall { .. }))
        .expect("the call is decided");
    // Room for everything before the decision, and half of it.
    let bound = sizes[..decided].iter().map(|(bytes, _)| bytes).sum::<u64>() + sizes[decided].0 / 2;

    let bounded = setup_with(
        ApprovalPolicy::Trusted,
        Retention {
            event_bytes_per_run: usize::try_from(bound).unwrap(),
            ..Retention::default()
        },
    );
    let run = bounded
        .harness
        .start(start("run touch marker"))
        .await
        .unwrap();
    let events: Vec<StreamEvent> = run
        .subscribe(0)
        .map(|event| decode(&event.json))
        .collect()
        .await;
    assert!(ended_at_the_event_limit(&events), "{events:?}");
    assert!(
        !bounded.dir.path().join("marker").exists(),
        "the command did not run"
    );
}

#[tokio::test]
async fn finished_runs_are_forgotten_oldest_first_past_the_size_of_the_event_log() {
    let Setup { harness: probe, .. } = setup();
    let one = probe.start(start("hello")).await.unwrap();
    one.finished().await;
    let run_bytes = log_bytes(&one).await;

    let Setup { harness, .. } = setup_with(
        ApprovalPolicy::OnRequest,
        Retention {
            // Room for two runs and a half.
            event_log_bytes: run_bytes * 5 / 2,
            ..Retention::default()
        },
    );
    let mut ids = Vec::new();
    for _ in 0..4 {
        let record = harness.start(start("hello")).await.unwrap();
        record.finished().await;
        ids.push(record.run_id().clone());
    }
    assert_eq!(harness.prune().await.unwrap(), 2);
    assert!(harness.run(&ids[0]).await.unwrap().is_none());
    assert!(harness.run(&ids[1]).await.unwrap().is_none());
    assert!(harness.run(&ids[2]).await.unwrap().is_some());
    assert!(harness.run(&ids[3]).await.unwrap().is_some());
}

#[tokio::test]
async fn finished_runs_are_forgotten_past_their_age_and_a_running_one_never() {
    let Setup { harness, .. } = setup_with(
        ApprovalPolicy::OnRequest,
        Retention {
            finished_ttl: Duration::ZERO,
            ..Retention::default()
        },
    );
    let old = harness.start(start("hello")).await.unwrap();
    old.finished().await;
    let waiting = harness.start(start("delete a.txt")).await.unwrap();
    let mut events = waiting.subscribe(0);
    until(&mut events, |e| {
        matches!(e, StreamEvent::ApprovalRequired { .. })
    })
    .await;
    assert_eq!(harness.prune().await.unwrap(), 1);
    assert!(harness.run(old.run_id()).await.unwrap().is_none());
    assert!(harness.run(waiting.run_id()).await.unwrap().is_some());
    assert_eq!(harness.pending(None).await.unwrap().len(), 1);
}

#[tokio::test]
async fn shutdown_aborts_pending_runs_and_refuses_new_ones() {
    let Setup { harness, .. } = setup();
    let record = harness.start(start("delete a.txt")).await.unwrap();
    let mut events = record.subscribe(0);
    until(&mut events, |e| {
        matches!(e, StreamEvent::ApprovalRequired { .. })
    })
    .await;
    assert!(
        harness.shutdown(Duration::from_secs(5)).await,
        "runs end within the grace"
    );
    let (_, end) = until(&mut events, StreamEvent::is_terminal).await;
    match end {
        StreamEvent::Error { code, message, .. } => {
            assert_eq!(code, RunErrorCode::Shutdown);
            assert_eq!(
                message,
                "The server is shutting down, so the run was aborted."
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        harness.start(start("list files")).await.unwrap_err(),
        StartError::ShuttingDown
    );
}

#[tokio::test]
async fn fail_closed_runs_end_with_an_approval_required_error() {
    let Setup { harness, dir } = setup();
    std::fs::write(dir.path().join("a.txt"), "a").unwrap();
    let record = harness
        .start(StartRun {
            mode: ApprovalMode::FailClosed,
            ..start("delete a.txt")
        })
        .await
        .unwrap();
    record.finished().await;
    let view = record.view().await.unwrap().unwrap();
    let error = view.error.unwrap();
    assert_eq!(error.code, RunErrorCode::ApprovalRequired);
    assert!(error.message.contains("delete_file needs approval"));
    assert!(dir.path().join("a.txt").exists());
}

#[tokio::test]
async fn a_session_follower_sees_each_run_in_turn_including_runs_started_later() {
    let Setup { harness, .. } = setup();
    let session: agent::ids::SessionId = "follow".parse().unwrap();
    // Following starts before the session has any run.
    let mut follower = harness.session_events(&session, None);
    let first = harness
        .start(StartRun {
            session_id: Some(session.clone()),
            ..start("list files")
        })
        .await
        .unwrap();
    let mut seen = Vec::new();
    while let Some((run_id, event)) = follower.next().await {
        seen.push((run_id, event.seq));
        if event.kind == "done" {
            break;
        }
    }
    assert!(seen.iter().all(|(run, _)| run == first.run_id()));
    assert_eq!(seen.first().unwrap().1, 1);

    let second = harness
        .start(StartRun {
            session_id: Some(session.clone()),
            ..start("list files")
        })
        .await
        .unwrap();
    let (run_id, event) = follower.next().await.unwrap();
    assert_eq!(&run_id, second.run_id());
    assert_eq!((event.seq, event.kind), (1, "runStarted"));

    // A follower that resumes after the first run's 3rd event gets the rest of it, then the second run.
    second.finished().await;
    let mut resumed = harness.session_events(&session, Some((first.run_id().clone(), 3)));
    let (run_id, event) = resumed.next().await.unwrap();
    assert_eq!((&run_id, event.seq), (first.run_id(), 4));
    let mut last = (run_id, event.seq);
    loop {
        let (run_id, event) = resumed.next().await.unwrap();
        if &run_id == second.run_id() {
            assert_eq!(event.seq, 1, "the next run from its start");
            let first_last = first
                .subscribe(0)
                .collect::<Vec<_>>()
                .await
                .last()
                .unwrap()
                .seq;
            assert_eq!(last.1, first_last, "the first run to its end");
            break;
        }
        last = (run_id, event.seq);
    }

    // Followers end when the harness shuts down.
    harness.shutdown(Duration::from_secs(5)).await;
    let rest: Vec<_> = follower.collect().await;
    assert!(rest.iter().all(|(run, _)| run == second.run_id()));
}

/// Approving for the session makes the grant the card offered, never another: arguments edited so that they would
/// grant something else (another program, other arguments) are refused, and the approval stays pending; the same
/// edit approved once runs.
#[tokio::test]
async fn edited_arguments_cannot_widen_the_grant_the_card_offered() {
    let Setup { harness, .. } = setup();
    let run = harness
        .start(start(
            r#"call run_command {"command": "echo", "args": ["asked"]}"#,
        ))
        .await
        .unwrap();
    let mut events = run.subscribe(0);
    let (_, request) = next_approval(&mut events).await;
    let approve = |scope, arguments| Decision::Approve {
        scope,
        reason: None,
        arguments: Some(arguments),
    };
    for (scope, edited) in [
        (
            DecisionScope::SessionProgram,
            json!({"command": "touch", "args": ["made-by-edit"]}),
        ),
        (
            DecisionScope::Session,
            json!({"command": "echo", "args": ["other"]}),
        ),
    ] {
        let refused = harness
            .decide(
                &request.run_id,
                &request.tool_call_id,
                approve(scope, edited.clone()),
                &Actor::local(),
            )
            .await
            .unwrap_err();
        let DecideError::ScopeNotOffered(message) = refused else {
            panic!("{refused:?}")
        };
        assert!(
            message.contains("would allow something else than the card offered"),
            "{message}"
        );
        assert_eq!(harness.pending(None).await.unwrap().len(), 1, "{edited}");
    }
    harness
        .decide(
            &request.run_id,
            &request.tool_call_id,
            approve(
                DecisionScope::Once,
                json!({"command": "echo", "args": ["edited"]}),
            ),
            &Actor::local(),
        )
        .await
        .unwrap();
    run.finished().await;
    assert!(
        harness
            .grants(run.session_id())
            .await
            .unwrap()
            .list()
            .is_empty()
    );
}

/// Approving a card "for the session", as it showed the call.
fn for_the_session() -> Decision {
    Decision::Approve {
        scope: DecisionScope::Session,
        reason: None,
        arguments: None,
    }
}

/// The cards of a run waiting for a person, oldest first.
async fn waiting_cards(harness: &Harness, run: &agent::harness::RunHandle) -> Vec<String> {
    harness
        .pending(Some(run.run_id()))
        .await
        .unwrap()
        .into_iter()
        .map(|request| format!("{} {}", request.tool_name, request.arguments))
        .collect()
}

/// Approving a card for the session approves the cards of its batch that the grant covers as they were shown, and
/// no other: the same command with the same arguments runs without a second click, another command still waits.
/// Before, the covered card waited although the grant's note said the command "runs without asking".
#[tokio::test]
async fn an_approval_for_the_session_approves_the_waiting_cards_it_covers() {
    let Setup {
        harness,
        dir: _workspace,
    } = setup();
    let run = harness
        .start(start("run echo one and run echo one and run echo two"))
        .await
        .unwrap();
    let mut events = run.subscribe(0);
    let mut asked = Vec::new();
    for _ in 0..3 {
        asked.push(next_approval(&mut events).await.1);
    }
    harness
        .decide(
            &asked[0].run_id,
            &asked[0].tool_call_id,
            for_the_session(),
            &Actor::new("ada"),
        )
        .await
        .unwrap();

    let (_, resolved) = tokio::time::timeout(
        Duration::from_secs(5),
        until(&mut events, |event| {
            matches!(event, StreamEvent::ApprovalResolved { tool_call_id, .. } if *tool_call_id == asked[1].tool_call_id)
        }),
    )
    .await
    .expect("the card the grant covers is approved");
    let StreamEvent::ApprovalResolved {
        resolution:
            agent::wire::Resolution::Approved {
                source,
                scope,
                reason: Some(reason),
                edited_arguments: None,
            },
        grant: None,
        ..
    } = resolved
    else {
        panic!("{resolved:?}")
    };
    assert_eq!(source, agent::wire::ApprovalSource::User);
    assert_eq!(scope, DecisionScope::Session);
    assert_eq!(
        reason,
        format!(
            "Covered by the approval for the session given to call {} (run_command: exactly “echo one”).",
            asked[0].tool_call_id
        )
    );
    assert_eq!(
        waiting_cards(&harness, &run).await,
        [r#"run_command {"args":["two"],"command":"echo"}"#],
        "another command still waits"
    );
    let audit = support::audit_entries(&harness).await;
    let by_grant = audit
        .iter()
        .find(|entry| {
            entry.tool_call_id.as_ref() == Some(&asked[1].tool_call_id)
                && entry.outcome == "approved"
        })
        .expect("the covered call's approval is in the audit log");
    assert_eq!(by_grant.actor.as_deref(), Some("ada"));
    assert_eq!(by_grant.reason.as_deref(), Some(reason.as_str()));

    harness
        .decide(
            &asked[2].run_id,
            &asked[2].tool_call_id,
            Decision::approve(),
            &Actor::new("ada"),
        )
        .await
        .unwrap();
    run.finished().await;
    let view = run.view().await.unwrap().unwrap();
    assert_eq!(view.status, RunStatus::Done);
    assert!(
        view.tool_calls()
            .all(|call| call.output.as_ref().is_some_and(|output| output.is_ok())),
        "all three ran"
    );
}

/// A card the new grant would cover waits all the same when a rule added since it was shown denies its call: a
/// deny rule beats every grant.
#[tokio::test]
async fn an_approval_for_the_session_leaves_a_card_a_newer_deny_rule_covers() {
    let Setup { harness, dir } = setup();
    for name in ["a.txt", "b.txt"] {
        std::fs::write(dir.path().join(name), name).unwrap();
    }
    let run = harness
        .start(start("delete a.txt and delete b.txt"))
        .await
        .unwrap();
    let mut events = run.subscribe(0);
    let (_, first) = next_approval(&mut events).await;
    let (_, second) = next_approval(&mut events).await;
    let rule = agent::policy::Rule::parse("delete_file(b.txt)=deny:Keep b.").unwrap();
    harness.add_rule(rule, &Actor::local()).await.unwrap();
    harness
        .decide(
            &first.run_id,
            &first.tool_call_id,
            for_the_session(),
            &Actor::local(),
        )
        .await
        .unwrap();
    assert_eq!(
        waiting_cards(&harness, &run).await,
        [r#"delete_file {"path":"b.txt"}"#]
    );
    harness
        .decide(
            &second.run_id,
            &second.tool_call_id,
            Decision::Deny { reason: None },
            &Actor::local(),
        )
        .await
        .unwrap();
    run.finished().await;
    assert!(!dir.path().join("a.txt").exists());
    assert!(dir.path().join("b.txt").exists());
}

/// A card the deciding page keeps waiting (the person is editing it, or writing a reason on it) is left out of
/// the cards an approval for the session approves: the edit is not overtaken by the model's arguments.
#[tokio::test]
async fn an_approval_for_the_session_leaves_the_cards_the_page_keeps_waiting() {
    let Setup {
        harness,
        dir: _workspace,
    } = setup();
    let run = harness
        .start(start("run echo one and run echo one"))
        .await
        .unwrap();
    let mut events = run.subscribe(0);
    let (_, first) = next_approval(&mut events).await;
    let (_, edited) = next_approval(&mut events).await;
    harness
        .decide_keeping(
            &first.run_id,
            &first.tool_call_id,
            for_the_session(),
            &Actor::local(),
            std::slice::from_ref(&edited.tool_call_id),
        )
        .await
        .unwrap();
    assert_eq!(
        waiting_cards(&harness, &run).await,
        [r#"run_command {"args":["one"],"command":"echo"}"#]
    );
    assert_eq!(
        harness.pending(Some(run.run_id())).await.unwrap()[0].tool_call_id,
        edited.tool_call_id
    );
    harness
        .decide(
            &edited.run_id,
            &edited.tool_call_id,
            Decision::Deny { reason: None },
            &Actor::local(),
        )
        .await
        .unwrap();
    run.finished().await;
}
