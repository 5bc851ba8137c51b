//! A harness on the durable default that meets stored state it cannot read: the run that state belongs to is left
//! for an instance that can read it, and once aborted it ends with an error that says what could not be read.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Mutex, Once};
use std::time::Duration;

use agent::harness::{Actor, Harness, RunHandle, StartError, StartRun};
use agent::ids::RunId;
use agent::runtime::AbortReason;
use agent::store::sql::{DatabaseUrl, OpenError, SqlStore};
use agent::store::{RunState, Store};
use agent::wire::{ApprovalRequest, Decision, DenialSource, Resolution, RunErrorCode, StreamEvent};
use support::{Events, sqlite_harness, start_in};

fn start(message: &str) -> StartRun {
    start_in("kept", message)
}

/// A waiting run whose saved batch this process cannot read is left waiting once its approval is decided (an
/// instance that can read it, a newer version in a rolling deploy, may carry it on), and its session stays busy.
/// Cancelled, it ends failed, with a store error naming what could not be read, and its session takes the next run:
/// it does not hold its session for good.
#[tokio::test]
async fn a_waiting_run_whose_batch_does_not_read_waits_and_ends_once_cancelled() {
    count_the_log();
    let dir = tempfile::tempdir().unwrap();
    let harness = sqlite_harness(dir.path(), Duration::from_secs(60)).await;
    let (run, mut events, request) =
        asking_to_delete(&harness, dir.path(), "kept", "old.txt").await;
    change_beside(
        dir.path(),
        "UPDATE runs SET batch = '{\"not\": \"a batch\"}' WHERE id = ?1",
        run.run_id(),
    );

    harness
        .decide(
            &request.run_id,
            &request.tool_call_id,
            Decision::approve(),
            &Actor::new("login"),
        )
        .await
        .unwrap();
    // The approved call runs; then the claim of the batch is refused, the harness says it leaves the run, and the
    // run waits on.
    events
        .until(|event| matches!(event, StreamEvent::ToolResult { .. }))
        .await;
    assert!(!dir.path().join("ws/old.txt").exists(), "the call ran");
    logged(LEFT, run.run_id().as_str()).await;
    let waiting = harness.run(run.run_id()).await.unwrap().unwrap();
    assert_eq!(waiting.info().state, RunState::Waiting);
    assert!(
        matches!(
            harness.start(start("say hello")).await,
            Err(StartError::SessionBusy { .. })
        ),
        "the session is still busy"
    );

    harness.cancel(run.run_id(), &Actor::local()).await.unwrap();
    ends_failed_saying(&harness, &run, &mut events, &["aborted", "batch"]).await;
}

/// A waiting run whose pending call does not read can still be cancelled (the cancel used to fail on the row, and
/// the run held its session for good): the abort settles what it can, and the run ends failed, with a store error
/// that names the call; nothing of it ran, and its session takes the next run.
#[tokio::test]
async fn a_waiting_run_whose_call_does_not_read_can_be_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let harness = sqlite_harness(dir.path(), Duration::from_secs(60)).await;
    let (run, mut events, request) =
        asking_to_delete(&harness, dir.path(), "kept", "old.txt").await;
    change_beside(
        dir.path(),
        &format!("UPDATE calls SET record = {NOT_A_CALL} WHERE run_id = ?1"),
        run.run_id(),
    );

    harness
        .cancel(run.run_id(), &Actor::local())
        .await
        .expect("the cancel is not refused for what cannot be read");
    let call = format!("call {}", request.tool_call_id);
    ends_failed_saying(&harness, &run, &mut events, &["aborted", &call]).await;
    assert!(dir.path().join("ws/old.txt").exists(), "nothing ran");
}

/// A call that an abort left pending because the aborting instance could not read it (an older version beside the
/// newer one that wrote the call, in a rolling deploy) is settled by an instance that can read it, as the abort
/// would have: its approval resolves `denied/abort` and the run ends aborted, not failed with a store error.
#[tokio::test]
async fn a_call_an_abort_could_not_read_is_settled_where_it_reads() {
    let dir = tempfile::tempdir().unwrap();
    let harness = sqlite_harness(dir.path(), Duration::from_secs(60)).await;
    let (run, _, request) = asking_to_delete(&harness, dir.path(), "kept", "old.txt").await;
    let run_id = run.run_id().clone();
    harness.shutdown(Duration::from_secs(1)).await;
    harness.store().close().await.unwrap();
    drop((run, harness));

    // The instance that cannot read the call: its abort settles nothing and leaves the call pending.
    let db = rusqlite::Connection::open(dir.path().join("toolgate.db")).unwrap();
    let record: String = db
        .query_row(
            "SELECT record FROM calls WHERE run_id = ?1",
            [run_id.as_str()],
            |row| row.get(0),
        )
        .unwrap();
    change_beside(
        dir.path(),
        &format!("UPDATE calls SET record = {NOT_A_CALL} WHERE run_id = ?1"),
        &run_id,
    );
    // Once the first instance's tasks have let go of its store.
    let url = DatabaseUrl::Sqlite(dir.path().join("toolgate.db"));
    let older = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match SqlStore::open(&url).await {
                Err(OpenError::Locked { .. }) => {
                    tokio::time::sleep(Duration::from_millis(10)).await
                }
                opened => break opened.unwrap(),
            }
        }
    })
    .await
    .expect("the first instance lets go of the database");
    older
        .abort_run(
            &run_id,
            AbortReason::Cancelled,
            Box::new(|record| panic!("the older instance settled {:?}", record.call.id)),
        )
        .await
        .unwrap()
        .expect("the run is there");
    older.close().await.unwrap();
    drop(older);

    // The instance that reads it.
    db.execute(
        "UPDATE calls SET record = ?2 WHERE run_id = ?1",
        [run_id.as_str(), record.as_str()],
    )
    .unwrap();
    let harness = sqlite_harness(dir.path(), Duration::from_secs(60)).await;
    let run = harness
        .run(&run_id)
        .await
        .unwrap()
        .expect("the run is there");
    let mut events = Events::of(&run);
    match tokio::time::timeout(Duration::from_secs(10), next_resolution(&mut events))
        .await
        .expect("the approval resolves")
    {
        StreamEvent::ApprovalResolved {
            tool_call_id,
            resolution:
                Resolution::Denied {
                    source: DenialSource::Abort,
                    ..
                },
            ..
        } => assert_eq!(tool_call_id, request.tool_call_id),
        other => panic!("the approval resolved as {other:?}"),
    }
    match tokio::time::timeout(Duration::from_secs(10), events.end())
        .await
        .expect("the aborted run ends")
    {
        StreamEvent::Error { code, .. } => assert_eq!(code, RunErrorCode::Aborted),
        other => panic!("the run ended with {other:?}"),
    }
    assert!(dir.path().join("ws/old.txt").exists(), "nothing ran");
}

/// A due approval that does not read is left pending, met once by each sweep, and the sweeper goes on to the next
/// expiry after it (before, it found the same approval due at once, again and again); another run's approval still
/// times out. (Whether the store stopped at it, before, depended on the order of the runs' random ids: the store's
/// conformance tests show that part in order.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_approval_that_does_not_read_is_not_swept_again_and_again() {
    // Long enough for the row to be changed before the first approval is due, on a busy machine too.
    // (Every part is bound: the directory holds the harness's files for as long as the test runs.)
    let Behind {
        dir: _dir,
        harness,
        first,
        second: _second,
        mut events,
    } = behind_an_unreadable_approval(
        Duration::from_secs(2),
        &format!("UPDATE calls SET record = {NOT_A_CALL} WHERE run_id = ?1"),
    )
    .await;

    let resolved = tokio::time::timeout(Duration::from_secs(10), next_resolution(&mut events))
        .await
        .expect("the second run's approval times out");
    assert!(timed_out(&resolved), "{resolved:?}");
    // Past both expiries, nothing is due that the sweeper has not swept: the next look is seconds away.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let times = times_logged(SWEPT, first.run_id().as_str());
    assert!(
        (1..=3).contains(&times),
        "the unreadable approval was met {times} times: once by each sweep"
    );
    let first = harness.run(first.run_id()).await.unwrap().unwrap();
    assert_eq!(first.info().state, RunState::Waiting, "left as it was");
}

/// While a due approval that does not read is left pending, an approval committed after the sweep that left it,
/// with an earlier expiry (here its row's expiry moved back beside the store, as a batch opened slower than the
/// timeout or another instance's clock would leave it), still times out within seconds, however far the next
/// expiry is (a minute here): the sweeper looks again by a deadline after each sweep that left something.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_due_behind_one_that_does_not_read_still_times_out() {
    let Behind {
        dir,
        harness,
        first,
        second,
        mut events,
    } = behind_an_unreadable_approval(
        Duration::from_secs(60),
        &format!("UPDATE calls SET record = {NOT_A_CALL}, expires_at = 1 WHERE run_id = ?1"),
    )
    .await;
    // The second run's batch woke the sweeper, which found the first approval due and left it.
    logged(SWEPT, first.run_id().as_str()).await;
    change_beside(
        dir.path(),
        "UPDATE calls SET expires_at = 2 WHERE run_id = ?1",
        second.run_id(),
    );
    // The next expiry after the sweep is a minute away; this batch wakes the sweeper too.
    asking_to_delete(&harness, dir.path(), "third", "c.txt").await;

    let resolved = tokio::time::timeout(Duration::from_secs(10), next_resolution(&mut events))
        .await
        .expect("the second run's approval times out within seconds");
    assert!(timed_out(&resolved), "{resolved:?}");
}

/// Two runs in sessions of their own, each waiting for its approval, on a harness whose approvals time out after
/// `approval_timeout`; between the two, the first run's call is changed beside the store by `first_change` (the
/// run's id as `?1`), to a row that does not read.
struct Behind {
    dir: tempfile::TempDir,
    harness: Harness,
    first: RunHandle,
    second: RunHandle,
    /// The second run's events, from its approval on.
    events: Events,
}

async fn behind_an_unreadable_approval(approval_timeout: Duration, first_change: &str) -> Behind {
    count_the_log();
    let dir = tempfile::tempdir().unwrap();
    let harness = sqlite_harness(dir.path(), approval_timeout).await;
    let (first, _, _) = asking_to_delete(&harness, dir.path(), "first", "a.txt").await;
    change_beside(dir.path(), first_change, first.run_id());
    let (second, events, _) = asking_to_delete(&harness, dir.path(), "second", "b.txt").await;
    Behind {
        dir,
        harness,
        first,
        second,
        events,
    }
}

/// What no version of a call's record reads as, as SQL.
const NOT_A_CALL: &str = "'{\"not\": \"a call\"}'";

/// A run of `session_id` that asks to delete `file` (written into the workspace first), waiting for the approval:
/// the run, its events, and the approval.
async fn asking_to_delete(
    harness: &Harness,
    dir: &Path,
    session_id: &str,
    file: &str,
) -> (RunHandle, Events, ApprovalRequest) {
    std::fs::write(dir.join("ws").join(file), "old\n").unwrap();
    let run = harness
        .start(start_in(session_id, &format!("delete {file}")))
        .await
        .unwrap();
    let mut events = Events::of(&run);
    let request = events.next_approval().await;
    (run, events, request)
}

/// Changes a run's rows beside the harness's store in `dir`, as a newer version or a damaged disk would: `sql`, with
/// the run's id as `?1`.
fn change_beside(dir: &Path, sql: &str, run_id: &RunId) {
    rusqlite::Connection::open(dir.join("toolgate.db"))
        .unwrap()
        .execute(sql, [run_id.as_str()])
        .unwrap();
}

/// A cancelled run's end: failed, with a store error whose message holds each of `words`; its session takes the
/// next run.
async fn ends_failed_saying(
    harness: &Harness,
    run: &RunHandle,
    events: &mut Events,
    words: &[&str],
) {
    match tokio::time::timeout(Duration::from_secs(10), events.end())
        .await
        .expect("the cancelled run ends")
    {
        StreamEvent::Error { code, message, .. } => {
            assert_eq!(code, RunErrorCode::Store);
            assert!(words.iter().all(|word| message.contains(word)), "{message}");
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

async fn next_resolution(events: &mut Events) -> StreamEvent {
    events
        .until(|event| matches!(event, StreamEvent::ApprovalResolved { .. }))
        .await
        .1
}

fn timed_out(event: &StreamEvent) -> bool {
    matches!(
        event,
        StreamEvent::ApprovalResolved {
            resolution: Resolution::Denied {
                source: DenialSource::Timeout,
                ..
            },
            ..
        }
    )
}

/// What the tests count in the log, by run: a sweep meeting a due approval it cannot read (the store's log), and the
/// harness leaving a waiting run whose saved state it cannot read.
const SWEPT: &str = "a due approval cannot be read";
const LEFT: &str = "saved state cannot be read here";

/// How many times the log said `what` (one of [`SWEPT`] and [`LEFT`]) about `run`.
fn times_logged(what: &'static str, run: &str) -> usize {
    LOGGED
        .lock()
        .unwrap()
        .get(&(what, run.to_owned()))
        .copied()
        .unwrap_or(0)
}

/// Waits until the log has said `what` about `run`.
async fn logged(what: &'static str, run: &str) {
    tokio::time::timeout(Duration::from_secs(10), async {
        while times_logged(what, run) == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the log says {what:?} about {run}"));
}

static LOGGED: Mutex<BTreeMap<(&'static str, String), usize>> = Mutex::new(BTreeMap::new());

/// Counts, into [`LOGGED`], what the tests look for in the log; installed once for the tests of this file.
fn count_the_log() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        tracing::subscriber::set_global_default(Counting).expect("no other subscriber is set");
    });
}

struct Counting;

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
        #[derive(Default)]
        struct Fields {
            message: String,
            run: String,
        }
        impl tracing::field::Visit for Fields {
            // The store names a run `run` (a string), the harness `run_id` (its id, displayed).
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                if field.name() == "run" {
                    self.run = value.to_owned();
                }
            }

            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                match field.name() {
                    "message" => self.message = format!("{value:?}"),
                    "run_id" => self.run = format!("{value:?}"),
                    _ => {}
                }
            }
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        for what in [SWEPT, LEFT] {
            if fields.message.contains(what) {
                *LOGGED
                    .lock()
                    .unwrap()
                    .entry((what, fields.run.clone()))
                    .or_default() += 1;
            }
        }
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}
