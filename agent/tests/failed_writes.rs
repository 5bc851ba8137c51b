//! A harness on the durable default whose database refuses a write or a read for a while (a full disk, a failover,
//! a lost connection): what it could not record is not left half-done for good once the database takes writes
//! again, and what could not be read is read again.

#[path = "support/postgres.rs"]
mod postgres;
mod support;

use std::sync::Arc;
use std::time::Duration;

use agent::harness::{Harness, HarnessConfig, RunHandle};
use agent::ids::SessionId;
use agent::model::ScriptedModel;
use agent::policy::PermissionPolicy;
use agent::store::sql::{DatabaseUrl, SqlStore};
use agent::store::{CallStatus, RunState, Store};
use agent::tools::{Workspace, workspace_tools};
use agent::view::RunStatus;
use agent::wire::{ApprovalPolicy, Decision, RunErrorCode};
use futures::StreamExt;
use support::{Events, decide_pending, start_in};

const PATIENCE: Duration = Duration::from_secs(20);

/// A harness on the database at `url` that checks its runs every 100 ms, with the built-in tools on `dir/ws`.
async fn harness_on(url: DatabaseUrl, dir: &std::path::Path) -> (Harness, Arc<SqlStore>) {
    let store = SqlStore::open(&url).await.unwrap();
    let mut config = HarnessConfig::new(
        PermissionPolicy::new(ApprovalPolicy::OnRequest, Default::default()),
        Duration::from_secs(120),
    );
    config.reconcile_every = Duration::from_millis(100);
    let workspace = Workspace::open(dir.join("ws")).unwrap();
    let harness = Harness::open(
        config,
        Arc::new(ScriptedModel::new()),
        workspace_tools(&workspace, Default::default()),
        Arc::clone(&store) as Arc<dyn Store>,
    )
    .await
    .unwrap();
    (harness, store)
}

/// A SQLite file, a harness on it, and a connection beside it to change it as a failing disk would.
async fn harness_on_sqlite(
    dir: &std::path::Path,
) -> (Harness, Arc<SqlStore>, rusqlite::Connection) {
    let file = dir.join("toolgate.db");
    let (harness, store) = harness_on(DatabaseUrl::Sqlite(file.clone()), dir).await;
    (harness, store, rusqlite::Connection::open(&file).unwrap())
}

/// Waits until the approved tool has deleted `file`.
async fn until_deleted(file: &std::path::Path) {
    tokio::time::timeout(PATIENCE, async {
        while file.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the tool runs");
}

/// Waits for `run` to end (`waiting` says what for), and checks that it ended done, with `answer`.
async fn ends_done(run: &RunHandle, waiting: &str, answer: &str) {
    tokio::time::timeout(PATIENCE, run.finished())
        .await
        .expect(waiting);
    let view = run.view().await.unwrap().unwrap();
    assert_eq!(view.status, RunStatus::Done, "{:?}", view.error);
    assert_eq!(view.answer.as_deref(), Some(answer));
}

/// The result of an approved call that the database refused for longer than the group commit retries (a few
/// seconds) is kept, not dropped with the events: once the database takes writes again it is written, and the run
/// goes on from it. Before, the call stayed `executing` for good and its run waited until a restart, which then
/// recorded a call that had finished as interrupted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calls_result_the_database_refused_for_a_while_is_written_later_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (harness, _store, beside) = harness_on_sqlite(dir.path()).await;
    let refusal = "CREATE TRIGGER refuse_results BEFORE UPDATE OF status ON calls WHEN NEW.status = 'settled' \
         BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;";
    // Past the group commit's retries (about 3 s).
    result_refused_for_a_while(
        &harness,
        dir.path(),
        Duration::from_secs(5),
        || beside.execute_batch(refusal).unwrap(),
        || beside.execute_batch("DROP TRIGGER refuse_results").unwrap(),
    )
    .await;
}

/// The same on PostgreSQL, where a call's result is written as the tool ends: a failover or a lost connection then
/// is tried again until the result is written. Before, the failure was only logged: the call stayed `executing` for
/// good under a live instance, so nothing (neither a recovery, which takes dead instances' calls, nor a cancel) could
/// end its run, and its session refused every next message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calls_result_postgresql_refused_for_a_while_is_written_later_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let url = postgres::database();
    let (harness, _store) = harness_on(DatabaseUrl::Postgres(url.clone()), dir.path()).await;
    result_refused_for_a_while(
        &harness,
        dir.path(),
        Duration::from_secs(1),
        || {
            postgres::psql(
                &url,
                "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$; \
                 CREATE TRIGGER refuse_results BEFORE UPDATE OF status ON calls FOR EACH ROW \
                 WHEN (NEW.status = 'settled') EXECUTE FUNCTION refuse();",
            );
        },
        || {
            postgres::psql(&url, "DROP TRIGGER refuse_results ON calls");
        },
    )
    .await;
}

/// While the database refuses a call's result past the group commit's retries, the result is kept, and a flush
/// (what a graceful shutdown waits for before it says all is written) is told that what it waited for was given up,
/// or waits for the result: before, it said the result was written, and a shutdown then left it unwritten, to be
/// recorded as interrupted at the next start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_waits_for_a_calls_result_the_database_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let (harness, store, beside) = harness_on_sqlite(dir.path()).await;
    std::fs::write(dir.path().join("ws/a.txt"), "x").unwrap();
    let run = harness.start(start_in("s", "delete a.txt")).await.unwrap();
    let request = Events::of(&run).next_approval().await;
    beside
        .execute_batch(
            "CREATE TRIGGER refuse_results BEFORE UPDATE OF status ON calls WHEN NEW.status = 'settled' \
             BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;",
        )
        .unwrap();
    decide_pending(&harness, &request, Decision::approve()).await;
    until_deleted(&dir.path().join("ws/a.txt")).await;
    let waiting = tokio::spawn({
        let store = Arc::clone(&store);
        async move { store.flush().await }
    });
    // Past the group commit's retries (about 3 s), when what it could not write is given up but the result kept:
    // the flush that waited then is told so, and a flush from now on waits for the result.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        waiting.is_finished(),
        "a flush is not left waiting for good"
    );
    assert!(
        waiting.await.unwrap().is_err(),
        "nor told that what was given up is written"
    );
    assert!(
        tokio::time::timeout(Duration::from_secs(1), store.flush())
            .await
            .is_err(),
        "a flush waits while the result is not written"
    );

    beside.execute_batch("DROP TRIGGER refuse_results").unwrap();
    tokio::time::timeout(PATIENCE, store.flush())
        .await
        .expect("and ends once it is")
        .unwrap();
    tokio::time::timeout(PATIENCE, run.finished())
        .await
        .expect("the run goes on");
}

/// A call's result the database keeps refusing (here a trigger refuses its run's results; in life a damaged page
/// of its own) holds up its own run only: another conversation's run, started, approved and ended meanwhile, goes on
/// as usual, and the first run goes on once its result is taken. Before, every state change took the queued result
/// into its transaction first, so each of them failed with it: the other run's approval could not even be asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_the_database_keeps_refusing_holds_up_its_own_run_only() {
    let dir = tempfile::tempdir().unwrap();
    let (harness, store, beside) = harness_on_sqlite(dir.path()).await;
    std::fs::write(dir.path().join("ws/a.txt"), "x").unwrap();
    std::fs::write(dir.path().join("ws/b.txt"), "x").unwrap();
    let refused = harness.start(start_in("a", "delete a.txt")).await.unwrap();
    let request = Events::of(&refused).next_approval().await;
    beside
        .execute_batch(&format!(
            "CREATE TRIGGER refuse_results BEFORE UPDATE OF status ON calls \
             WHEN NEW.status = 'settled' AND NEW.run_id = '{}' \
             BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;",
            refused.run_id()
        ))
        .unwrap();
    decide_pending(&harness, &request, Decision::approve()).await;
    until_deleted(&dir.path().join("ws/a.txt")).await;
    // Past the first refusals of the result, by the group commit and by whatever took it.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let other = harness.start(start_in("b", "delete b.txt")).await.unwrap();
    let request = tokio::time::timeout(PATIENCE, Events::of(&other).next_approval())
        .await
        .expect("the other run asks");
    decide_pending(&harness, &request, Decision::approve()).await;
    ends_done(&other, "and ends", "delete_file deleted b.txt.").await;
    assert!(!refused.is_finished().await.unwrap());
    let calls = store.calls(refused.run_id()).await.unwrap();
    assert_eq!(
        calls[0].status,
        CallStatus::Executing,
        "its result is not written"
    );

    beside.execute_batch("DROP TRIGGER refuse_results").unwrap();
    ends_done(
        &refused,
        "the first run goes on once its result is written",
        "delete_file deleted a.txt.",
    )
    .await;
}

/// The same on PostgreSQL, where state changes do not take the queue but wait for the appends queued before them:
/// a change waits for its own run's only. A run whose events the database keeps refusing (a trigger, for one
/// conversation's) does not hold up another conversation's run, which asks for approval at once. Before, every
/// change on PostgreSQL waited for the whole queue to be written, so until the refused events were given up (3 s of
/// retries) no other run could ask, decide or end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgresql_a_run_whose_events_are_refused_holds_up_its_own_run_only() {
    let dir = tempfile::tempdir().unwrap();
    let url = postgres::database();
    let (harness, _store) = harness_on(DatabaseUrl::Postgres(url.clone()), dir.path()).await;
    std::fs::write(dir.path().join("ws/a.txt"), "x").unwrap();
    std::fs::write(dir.path().join("ws/b.txt"), "x").unwrap();
    // The events a running run appends as it samples (each step's `step`), of conversation `a` only.
    postgres::psql(
        &url,
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           IF NEW.kind = 'step' AND EXISTS (SELECT 1 FROM runs WHERE id = NEW.run_id AND session_id = 'a') THEN \
             RAISE EXCEPTION 'refused by the test'; \
           END IF; RETURN NEW; END $$; \
         CREATE TRIGGER refuse_steps BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION refuse();",
    );
    let refused = harness.start(start_in("a", "delete a.txt")).await.unwrap();
    let started = std::time::Instant::now();
    let other = harness.start(start_in("b", "delete b.txt")).await.unwrap();
    let request = tokio::time::timeout(PATIENCE, Events::of(&other).next_approval())
        .await
        .expect("the other run asks");
    // The refused events are retried for 3.1 s (0.1 + 0.2 + 0.4 + 0.8 + 1.6) before they are given up.
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the other run asked after {:?}",
        started.elapsed()
    );
    decide_pending(&harness, &request, Decision::approve()).await;
    ends_done(&other, "and ends", "delete_file deleted b.txt.").await;

    // The first run goes on once its events are given up.
    let request = tokio::time::timeout(PATIENCE, Events::of(&refused).next_approval())
        .await
        .expect("the first run asks too");
    decide_pending(&harness, &request, Decision::approve()).await;
    tokio::time::timeout(PATIENCE, refused.finished())
        .await
        .expect("and ends");
}

/// A change of a run whose events the database refuses for a while waits for them, even when another run's refused
/// events are given up meanwhile: the run's log keeps the order things happened in. Before, a change went on at any
/// give-up, whichever run's: the run's approval was logged before the steps that led to it, written later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgresql_another_runs_give_up_does_not_put_a_runs_change_before_its_events() {
    let dir = tempfile::tempdir().unwrap();
    let url = postgres::database();
    let (harness, _store) = harness_on(DatabaseUrl::Postgres(url.clone()), dir.path()).await;
    std::fs::write(dir.path().join("ws/r.txt"), "x").unwrap();
    postgres::psql(
        &url,
        "CREATE TABLE refused_sessions (id TEXT PRIMARY KEY); \
         INSERT INTO refused_sessions VALUES ('y'), ('r'); \
         CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           IF NEW.kind = 'step' AND EXISTS (SELECT 1 FROM runs JOIN refused_sessions s ON s.id = runs.session_id \
                                            WHERE runs.id = NEW.run_id) THEN \
             RAISE EXCEPTION 'refused by the test'; \
           END IF; RETURN NEW; END $$; \
         CREATE TRIGGER refuse_steps BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION refuse();",
    );
    // Y's steps are refused for good: given up 3.1 s after their first refusal.
    let _given_up = harness.start(start_in("y", "hello")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    // R's steps are refused from about 1 s on, tried again at 1.1, 1.3, 1.7, 2.5 and 4.1 s; Y's give-up comes at
    // about 3.1 s; from 2.6 s on R's are taken, at their next try.
    let run = harness.start(start_in("r", "delete r.txt")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1600)).await;
    postgres::psql(&url, "DELETE FROM refused_sessions WHERE id = 'r'");
    let request = tokio::time::timeout(PATIENCE, Events::of(&run).next_approval())
        .await
        .expect("the run asks");
    decide_pending(&harness, &request, Decision::approve()).await;
    tokio::time::timeout(PATIENCE, run.finished())
        .await
        .expect("the run ends");
    let kinds = postgres::psql(
        &url,
        &format!(
            "SELECT string_agg(kind, ' ' ORDER BY seq) FROM events WHERE run_id = '{}'",
            run.run_id()
        ),
    );
    let kinds: Vec<&str> = kinds.split(' ').collect();
    let asked = kinds.iter().position(|kind| *kind == "approvalRequired");
    let first_step = kinds.iter().position(|kind| *kind == "step");
    assert!(
        first_step.is_some() && first_step < asked,
        "R's first step, written once taken, comes before its approval: {kinds:?}"
    );
    ends_done(&run, "the run ends", "delete_file deleted r.txt.").await;
}

/// Approves a deletion while `refuse` has the database refuse calls' results, lets it go on refusing for `refused_for`
/// after the tool ran, then has it take them again (`allow`): the run goes on from the result, to its answer.
async fn result_refused_for_a_while(
    harness: &Harness,
    dir: &std::path::Path,
    refused_for: Duration,
    refuse: impl FnOnce(),
    allow: impl FnOnce(),
) {
    std::fs::write(dir.join("ws/a.txt"), "x").unwrap();
    let run = harness.start(start_in("s", "delete a.txt")).await.unwrap();
    let request = Events::of(&run).next_approval().await;

    refuse();
    decide_pending(harness, &request, Decision::approve()).await;
    until_deleted(&dir.join("ws/a.txt")).await;
    tokio::time::sleep(refused_for).await;
    assert!(!run.is_finished().await.unwrap());

    allow();
    ends_done(
        &run,
        "the run goes on once the result is written",
        "delete_file deleted a.txt.",
    )
    .await;
}

/// A run whose end the database refused stays running, with nothing left to end it, and its session refuses every
/// next run. The harness sees that no task of its own works on a run it holds, and ends it as failed once the
/// database takes the write, with what it was asked and answered in its session's conversation; the session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_end_could_not_be_recorded_is_ended_afterwards_and_its_session_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (harness, store, beside) = harness_on_sqlite(dir.path()).await;
    beside
        .execute_batch(
            "CREATE TRIGGER refuse_ends BEFORE UPDATE OF finished_at ON runs WHEN NEW.finished_at IS NOT NULL \
             BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;",
        )
        .unwrap();

    let run = harness.start(start_in("s", "hello")).await.unwrap();
    // The run answers, and cannot record its end (nor can anything else, while the database refuses it): its task
    // is gone, and the run is still running.
    tokio::time::timeout(PATIENCE, async {
        while !harness.local_runs().is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the run's task ends");
    let info = store.run(run.run_id()).await.unwrap().unwrap();
    assert_eq!(info.state, RunState::Running);

    beside.execute_batch("DROP TRIGGER refuse_ends").unwrap();
    tokio::time::timeout(PATIENCE, run.finished())
        .await
        .expect("the run is ended once its end can be recorded");
    let view = run.view().await.unwrap().unwrap();
    assert_eq!(view.status, RunStatus::Failed);
    assert_eq!(
        view.error.map(|error| error.code),
        Some(RunErrorCode::Store)
    );
    // What it was asked and answered joins its session's conversation, read from its log, as its end would have
    // written them: the next run's model reads them.
    let history = store.history(run.session_id()).await.unwrap();
    assert!(
        matches!(history.first(), Some(agent::wire::Message::User { content }) if content == "hello"),
        "{history:?}"
    );
    assert!(
        matches!(history.last(), Some(agent::wire::Message::Assistant { content, .. }) if !content.is_empty()),
        "{history:?}"
    );

    // Its session takes the next run, which ends as usual.
    let next = harness.start(start_in("s", "hello again")).await.unwrap();
    tokio::time::timeout(PATIENCE, next.finished())
        .await
        .expect("the next run ends");
    let view = next.view().await.unwrap().unwrap();
    assert_eq!(view.status, RunStatus::Done);
}

/// A follower of a session whose read of a run's log fails (a lost connection, a failover) reads it again, and goes
/// on with the run from where it was. Before, the failed read looked like the run's end: the follower went on to the
/// session's next run, and the page saw none of the run's later events (its approval resolved, its end) until it
/// reloaded; a client that started the run on its stream saw the stream end, and the run was aborted as if the
/// client had left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_follower_whose_read_fails_reads_again_and_misses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let url = postgres::database();
    let (harness, _store) = harness_on(DatabaseUrl::Postgres(url.clone()), dir.path()).await;
    std::fs::write(dir.path().join("ws/a.txt"), "x").unwrap();
    let run = harness.start(start_in("s", "delete a.txt")).await.unwrap();
    let request = Events::of(&run).next_approval().await;

    // The log cannot be read while the follower begins.
    postgres::psql(&url, "ALTER TABLE events RENAME TO events_away");
    let session: SessionId = "s".parse().unwrap();
    let mut follower = harness.session_events(&session, None);
    let first = tokio::time::timeout(Duration::from_millis(500), follower.next()).await;
    assert!(first.is_err(), "nothing could be read: {first:?}");
    postgres::psql(&url, "ALTER TABLE events_away RENAME TO events");

    decide_pending(&harness, &request, Decision::approve()).await;
    let mut seen = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while let Some((run_id, event)) = follower.next().await {
            assert_eq!(&run_id, run.run_id());
            seen.push((event.seq, event.kind));
            if event.kind == "done" {
                return;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the follower goes on with the run; it saw {seen:?}"));
    let seqs: Vec<u64> = seen.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "every event, once, in order"
    );
    for kind in ["runStarted", "approvalRequired", "approvalResolved", "done"] {
        assert!(
            seen.iter().any(|(_, seen)| *seen == kind),
            "{kind} in {seen:?}"
        );
    }
}

/// A waiting run whose batch is claimed while its row cannot be read whole (a lost connection, a failover; here a
/// column of the runs table is away) is not claimed until it can be, and then goes on from its call's result. Before,
/// the claim took the run and a read after it failed: the run was this instance's with no task on it, and was ended
/// as failed, its approved command's output lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_claimed_while_its_run_cannot_be_read_goes_on_once_it_can() {
    let dir = tempfile::tempdir().unwrap();
    let (harness, store, beside) = harness_on_sqlite(dir.path()).await;
    let run = harness.start(start_in("s", "run sleep 1")).await.unwrap();
    let request = Events::of(&run).next_approval().await;
    decide_pending(&harness, &request, Decision::approve()).await;
    tokio::time::timeout(PATIENCE, async {
        loop {
            let calls = store.calls(run.run_id()).await.unwrap();
            if calls
                .iter()
                .any(|call| call.status == CallStatus::Executing)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the command runs");

    // The command ends and its batch is to be claimed while the run's row does not read.
    beside
        .execute_batch("ALTER TABLE runs RENAME COLUMN created_at TO created_at_away")
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    beside
        .execute_batch("ALTER TABLE runs RENAME COLUMN created_at_away TO created_at")
        .unwrap();

    ends_done(
        &run,
        "the run goes on once it reads",
        "run_command ran sleep (exit code 0) with no output.",
    )
    .await;
}
