//! A harness on the durable default that meets stored state it cannot read: the run that state belongs to is left
//! for an instance that can read it, and once aborted it ends with an error that says what could not be read.

mod support;

use std::time::Duration;

use agent::harness::{Actor, RunSource, StartError, StartRun};
use agent::store::RunState;
use agent::wire::{ApprovalMode, Decision, DecisionScope, RunErrorCode, StreamEvent};
use support::{Events, sqlite_harness};

fn start(message: &str) -> StartRun {
    StartRun {
        message: message.into(),
        session_id: Some("kept".parse().unwrap()),
        policy: None,
        mode: ApprovalMode::Interactive,
        run_id: None,
        source: RunSource::Session,
        refused_while_interrupted: false,
    }
}

/// A waiting run whose saved batch this process cannot read is left waiting once its approval is decided (an
/// instance that can read it, a newer version in a rolling deploy, may carry it on), and its session stays busy.
/// Cancelled, it ends failed, with a store error naming what could not be read, and its session takes the next run:
/// it does not hold its session for good.
#[tokio::test]
async fn a_waiting_run_whose_batch_does_not_read_waits_and_ends_once_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let harness = sqlite_harness(dir.path(), Duration::from_secs(60)).await;
    std::fs::write(dir.path().join("ws/old.txt"), "old\n").unwrap();
    let run = harness.start(start("delete old.txt")).await.unwrap();
    let mut events = Events::of(&run);
    let request = events.next_approval().await;
    rusqlite::Connection::open(dir.path().join("toolgate.db"))
        .unwrap()
        .execute(
            "UPDATE runs SET batch = '{\"not\": \"a batch\"}' WHERE id = ?1",
            [run.run_id().as_str()],
        )
        .unwrap();

    harness
        .decide(
            &request.run_id,
            &request.tool_call_id,
            Decision::Approve {
                scope: DecisionScope::Once,
                reason: None,
                arguments: None,
            },
            &Actor::new("login"),
        )
        .await
        .unwrap();
    // The approved call runs; then the claim of the batch is refused, and the run waits on.
    events
        .until(|event| matches!(event, StreamEvent::ToolResult { .. }))
        .await;
    assert!(!dir.path().join("ws/old.txt").exists(), "the call ran");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let waiting = harness.run(run.run_id()).await.unwrap().unwrap();
    assert_eq!(waiting.info().state, RunState::Waiting);
    assert!(
        matches!(
            harness.start(start("say hello")).await,
            Err(StartError::SessionBusy { .. })
        ),
        "the session is still busy"
    );

    harness.cancel(run.run_id()).await.unwrap();
    match tokio::time::timeout(Duration::from_secs(10), events.end())
        .await
        .expect("the cancelled run ends")
    {
        StreamEvent::Error { code, message, .. } => {
            assert_eq!(code, RunErrorCode::Store);
            assert!(
                message.contains("aborted") && message.contains("batch"),
                "{message}"
            );
        }
        other => panic!("the run ended with {other:?}"),
    }
    let ended = harness.run(run.run_id()).await.unwrap().unwrap();
    assert_eq!(ended.info().state, RunState::Failed);
    assert!(
        harness.start(start("say hello")).await.is_ok(),
        "the session takes its next run"
    );
}
