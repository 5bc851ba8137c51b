//! A harness on the durable default that meets stored state it cannot read: the run that state belongs to is left
//! for an instance that can read it, and once aborted it ends with an error that says what could not be read.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agent::harness::{Actor, RunSource, StartError, StartRun};
use agent::store::RunState;
use agent::wire::{
    ApprovalMode, Decision, DecisionScope, DenialSource, Resolution, RunErrorCode, StreamEvent,
};
use support::{Events, sqlite_harness};

fn start(message: &str) -> StartRun {
    start_in("kept", message)
}

fn start_in(session_id: &str, message: &str) -> StartRun {
    StartRun {
        message: message.into(),
        session_id: Some(session_id.parse().unwrap()),
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

/// A waiting run whose pending call does not read can still be cancelled (the cancel used to fail on the row, and
/// the run held its session for good): the abort settles what it can, and the run ends failed, with a store error
/// that names the call; nothing of it ran, and its session takes the next run.
#[tokio::test]
async fn a_waiting_run_whose_call_does_not_read_can_be_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let harness = sqlite_harness(dir.path(), Duration::from_secs(60)).await;
    std::fs::write(dir.path().join("ws/old.txt"), "old\n").unwrap();
    let run = harness.start(start("delete old.txt")).await.unwrap();
    let mut events = Events::of(&run);
    let request = events.next_approval().await;
    rusqlite::Connection::open(dir.path().join("toolgate.db"))
        .unwrap()
        .execute(
            "UPDATE calls SET record = '{\"not\": \"a call\"}' WHERE run_id = ?1",
            [run.run_id().as_str()],
        )
        .unwrap();

    harness
        .cancel(run.run_id())
        .await
        .expect("the cancel is not refused for what cannot be read");
    match tokio::time::timeout(Duration::from_secs(10), events.end())
        .await
        .expect("the cancelled run ends")
    {
        StreamEvent::Error { code, message, .. } => {
            assert_eq!(code, RunErrorCode::Store);
            assert!(
                message.contains("aborted")
                    && message.contains(&format!("call {}", request.tool_call_id)),
                "{message}"
            );
        }
        other => panic!("the run ended with {other:?}"),
    }
    let ended = harness.run(run.run_id()).await.unwrap().unwrap();
    assert_eq!(ended.info().state, RunState::Failed);
    assert!(dir.path().join("ws/old.txt").exists(), "nothing ran");
    assert!(
        harness.start(start("say hello")).await.is_ok(),
        "the session takes its next run"
    );
}

/// A due approval that does not read is left pending, met once by each sweep, and the sweeper goes on to the next
/// expiry after it (before, it found the same approval due at once, again and again); another run's approval still
/// times out. (Whether the store stopped at it, before, depended on the order of the runs' random ids: the store's
/// conformance tests show that part in order.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_approval_that_does_not_read_is_not_swept_again_and_again() {
    let logged = Arc::new(AtomicUsize::new(0));
    tracing::subscriber::set_global_default(Counting {
        message: "a due approval cannot be read",
        count: Arc::clone(&logged),
    })
    .expect("no other test of this file sets a subscriber");
    let dir = tempfile::tempdir().unwrap();
    // Long enough for the row to be changed before the first approval is due, on a busy machine too.
    let harness = sqlite_harness(dir.path(), Duration::from_secs(2)).await;
    std::fs::write(dir.path().join("ws/a.txt"), "a\n").unwrap();
    std::fs::write(dir.path().join("ws/b.txt"), "b\n").unwrap();
    let first = harness
        .start(start_in("first", "delete a.txt"))
        .await
        .unwrap();
    Events::of(&first).next_approval().await;
    rusqlite::Connection::open(dir.path().join("toolgate.db"))
        .unwrap()
        .execute(
            "UPDATE calls SET record = '{\"not\": \"a call\"}' WHERE run_id = ?1",
            [first.run_id().as_str()],
        )
        .unwrap();
    let second = harness
        .start(start_in("second", "delete b.txt"))
        .await
        .unwrap();
    let mut events = Events::of(&second);
    events.next_approval().await;

    let (_, resolved) = tokio::time::timeout(
        Duration::from_secs(10),
        events.until(|event| matches!(event, StreamEvent::ApprovalResolved { .. })),
    )
    .await
    .expect("the second run's approval times out");
    assert!(
        matches!(
            resolved,
            StreamEvent::ApprovalResolved {
                resolution: Resolution::Denied {
                    source: DenialSource::Timeout,
                    ..
                },
                ..
            }
        ),
        "{resolved:?}"
    );
    // Past both expiries, nothing is due that the sweeper has not swept: the next look is seconds away.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let times = logged.load(Ordering::Relaxed);
    assert!(
        (1..=3).contains(&times),
        "the unreadable approval was met {times} times: once by each sweep"
    );
    let first = harness.run(first.run_id()).await.unwrap().unwrap();
    assert_eq!(first.info().state, RunState::Waiting, "left as it was");
}

/// Counts the events logged whose message holds `message`.
struct Counting {
    message: &'static str,
    count: Arc<AtomicUsize>,
}

impl tracing::Subscriber for Counting {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        if message.0.contains(self.message) {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}
