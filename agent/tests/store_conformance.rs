//! What every store promises, checked against each of them: the memory store, SQLite in a temporary directory, and
//! PostgreSQL started from the machine's own packages. A state change happens whole or not at all; a conditional
//! one (a decision, a claim, a take) has exactly one winner however many race for it; what a reader sees is
//! committed and in order.

#[path = "support/postgres.rs"]
mod postgres;

use std::sync::Arc;

use agent::agent_loop::{Interruption, PendingCall};
use agent::ids::{RunId, SessionId, ToolCallId};
use agent::interrupts::{IssuedInterrupt, Suspension, arguments_digest};
use agent::runtime::AbortReason;
use agent::store::memory::MemoryStore;
use agent::store::sql::{DatabaseUrl, OpenError, SqlStore};
use agent::store::*;
use agent::wire::{
    ApprovalMode, ApprovalPolicy, ApprovalPreview, ApprovalRequest, ApprovalSource, DecisionScope,
    DenialSource, InterruptRequest, Message, Resolution, StreamEvent, ToolCall, ToolErrorCode,
    ToolOutput,
};
use serde_json::json;

/// A store under test, and what must live as long as it.
struct Backend {
    store: Arc<dyn Store>,
    /// Where a SQL store's database is, to open it again.
    url: Option<DatabaseUrl>,
    _dir: Option<tempfile::TempDir>,
}

impl Backend {
    /// The same database behind a store opened anew, as after a restart, so that reads go to the database instead
    /// of what the store kept in memory. The memory store has no second life: it stays as it is.
    async fn reopened(self) -> Backend {
        let Some(url) = self.url.clone() else {
            return self;
        };
        self.store.close().await.unwrap();
        drop(self.store);
        Backend {
            store: SqlStore::open(&url)
                .await
                .expect("the database opens again"),
            url: Some(url),
            _dir: self._dir,
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Memory,
    Sqlite,
    Postgres,
}

async fn open(kind: Kind) -> Backend {
    match kind {
        Kind::Memory => Backend {
            store: Arc::new(MemoryStore::new()),
            url: None,
            _dir: None,
        },
        Kind::Sqlite => {
            let dir = tempfile::tempdir().unwrap();
            let url = DatabaseUrl::Sqlite(dir.path().join("toolgate.db"));
            Backend {
                store: SqlStore::open(&url).await.expect("SQLite opens"),
                url: Some(url),
                _dir: Some(dir),
            }
        }
        Kind::Postgres => {
            let url = DatabaseUrl::Postgres(postgres::database());
            Backend {
                store: SqlStore::open(&url).await.expect("PostgreSQL opens"),
                url: Some(url),
                _dir: None,
            }
        }
    }
}

fn run_id(id: &str) -> RunId {
    RunId::parse(id).unwrap()
}

fn session(id: &str) -> SessionId {
    SessionId::parse(id).unwrap()
}

fn call_id(id: &str) -> ToolCallId {
    ToolCallId::parse(id).unwrap()
}

fn step_event(run: &str, step: u32) -> NewEvent {
    NewEvent::encode(&StreamEvent::Step {
        run_id: run_id(run),
        step,
    })
    .unwrap()
}

fn new_run(run: &str, session_id: &str) -> NewRun {
    NewRun {
        run_id: run_id(run),
        session_id: session(session_id),
        parent_run_id: None,
        mode: ApprovalMode::Interactive,
        message: format!("the message of {run}"),
        events: vec![step_event(run, 1)],
        audit: Vec::new(),
        at: 1_000,
        refused_while_interrupted: false,
    }
}

fn tool_call(id: &str) -> ToolCall {
    ToolCall {
        id: call_id(id),
        name: "delete_file".into(),
        arguments: json!({"path": id}).to_string(),
    }
}

fn pending_call(run: &str, id: &str, expires_at: u64) -> CallRecord {
    let mut record = CallRecord::new(
        run_id(run),
        tool_call(id),
        json!({"path": id}),
        CallStatus::Pending,
    );
    record.approval = Some(ApprovalRequest {
        run_id: run_id(run),
        tool_call_id: call_id(id),
        tool_name: "delete_file".into(),
        arguments: json!({"path": id}),
        reason: "delete_file is destructive.".into(),
        choices: Default::default(),
        requested_at: 1_000,
        expires_at,
        preview: Some(deletion_preview(id)),
    });
    record
}

/// The preview a pending call of [`pending_call`] carries.
fn deletion_preview(path: &str) -> ApprovalPreview {
    ApprovalPreview::FileDelete {
        path: path.into(),
        bytes: 12,
        head: vec!["first line".into()],
        more: false,
        note: None,
    }
}

fn saved_batch(calls: &[&str]) -> SavedBatch {
    SavedBatch {
        history: vec![Message::User {
            content: "go".into(),
        }],
        prior: 0,
        owned_by_session: true,
        policy: ApprovalPolicy::OnRequest,
        step: 1,
        calls: calls.iter().map(|id| tool_call(id)).collect(),
        repeat: RepeatCounts::default(),
    }
}

fn request_audit(run: &str, call: &str) -> AuditEntry {
    AuditEntry {
        id: 0,
        at: 1_000,
        kind: AuditKind::ApprovalRequested,
        session_id: None,
        run_id: Some(run_id(run)),
        tool_call_id: Some(call_id(call)),
        tool: Some("delete_file".into()),
        arguments_digest: Some(arguments_digest(&json!({"path": call}))),
        edited_digest: None,
        outcome: "requested".into(),
        source: None,
        scope: None,
        reason: Some("delete_file is destructive.".into()),
        actor: None,
    }
}

/// Begins call `call` of the running run `run` inline, as the run's own task does under its claim `epoch`: a call
/// the policy allowed, on a file named like the call. `None` when the store begins nothing.
async fn begin_inline(
    store: &dyn Store,
    run: &str,
    call: &str,
    epoch: Epoch,
) -> Option<CallRecord> {
    let record = CallRecord::new(
        run_id(run),
        tool_call(call),
        json!({"path": call}),
        CallStatus::Allowed,
    );
    store
        .begin_call(&run_id(run), &call_id(call), Some((record, epoch)))
        .await
        .unwrap()
}

/// Opens a batch of the given calls in a run started just before: `pending` ask, the rest are allowed.
async fn open_waiting(store: &dyn Store, run: &str, pending: &[(&str, u64)], allowed: &[&str]) {
    let mut calls: Vec<CallRecord> = pending
        .iter()
        .map(|(id, expires)| pending_call(run, id, *expires))
        .collect();
    calls.extend(allowed.iter().map(|id| {
        CallRecord::new(
            run_id(run),
            tool_call(id),
            json!({"path": id}),
            CallStatus::Allowed,
        )
    }));
    open_batch_of(store, run, calls).await;
}

/// Opens a batch of `calls` in a run started just before, with an audit entry for each call that asks.
/// Starts each `(run, session, call)`, in its session, waiting for its call's approval, due at 5,000 ms.
async fn waiting_on_one_due_at_5000(store: &dyn Store, runs: &[(&str, &str, &str)]) {
    for &(run, session_id, call) in runs {
        store
            .start_run(new_run(run, session_id))
            .await
            .unwrap()
            .unwrap();
        open_waiting(store, run, &[(call, 5_000)], &[]).await;
    }
}

async fn open_batch_of(store: &dyn Store, run: &str, calls: Vec<CallRecord>) {
    let ids: Vec<&str> = calls.iter().map(|call| call.call.id.as_str()).collect();
    let audit = calls
        .iter()
        .filter(|call| call.status == CallStatus::Pending)
        .map(|call| request_audit(run, call.call.id.as_str()))
        .collect();
    store
        .open_batch(OpenBatch {
            run_id: run_id(run),
            epoch: 1,
            batch: saved_batch(&ids),
            calls,
            events: vec![step_event(run, 2)],
            audit,
        })
        .await
        .unwrap()
        .expect("the run's owner opens its batch");
}

fn approve(record: &CallRecord) -> Settlement {
    Settlement {
        resolution: Resolution::Approved {
            source: ApprovalSource::User,
            scope: DecisionScope::Once,
            reason: None,
            edited_arguments: None,
        },
        status: CallStatus::Approved,
        edited_arguments: None,
        output: None,
        events: vec![step_event(record.run_id.as_str(), 99)],
        audit: vec![AuditEntry {
            kind: AuditKind::ApprovalResolved,
            outcome: "approved".into(),
            actor: Some("local".into()),
            ..request_audit(record.run_id.as_str(), record.call.id.as_str())
        }],
        grant: None,
        under_grant: None,
    }
}

/// Approves a card that stands on the session grant `grant_id` (one another decision's grant covers).
fn approve_under_grant(grant_id: &str) -> agent::store::Settle {
    let grant_id = grant_id.to_owned();
    Box::new(move |record| {
        Ok(Settlement {
            under_grant: Some(grant_id),
            ..approve(record)
        })
    })
}

fn deny(record: &CallRecord, source: DenialSource) -> Settlement {
    Settlement {
        resolution: Resolution::Denied {
            source,
            reason: "no".into(),
        },
        status: CallStatus::Denied,
        edited_arguments: None,
        output: Some(ToolOutput::error(ToolErrorCode::ApprovalDenied, "no")),
        events: vec![step_event(record.run_id.as_str(), 98)],
        audit: vec![],
        grant: None,
        under_grant: None,
    }
}

/// What an abort does to a call it left, as the claim is given it in these tests: denied (source `abort`), with an
/// event of its own (step 97) and an audit entry.
fn left_by_abort() -> SettleExpired {
    Box::new(|record| Settlement {
        events: vec![step_event(record.run_id.as_str(), 97)],
        audit: vec![AuditEntry {
            kind: AuditKind::ApprovalResolved,
            outcome: "aborted".into(),
            ..request_audit(record.run_id.as_str(), record.call.id.as_str())
        }],
        ..deny(record, DenialSource::Abort)
    })
}

/// Aborts `run` as a cancel does (what it has pending is denied, source `abort`): the abort is not refused, and the
/// run is there.
async fn cancelled(store: &dyn Store, run: &str) -> Aborted {
    store
        .abort_run(
            &run_id(run),
            AbortReason::Cancelled,
            Box::new(|r| deny(r, DenialSource::Abort)),
        )
        .await
        .expect("the abort is not refused")
        .expect("the run is there")
}

/// The audit log's entries about `run`, oldest first (ten at the most).
async fn audit_of(store: &dyn Store, run: &str) -> Vec<AuditEntry> {
    store
        .audit_log(AuditQuery {
            run_id: Some(run_id(run)),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap()
}

async fn kinds(store: &dyn Store, run: &str) -> Vec<u64> {
    store
        .events_after(&run_id(run), 0, 10_000)
        .await
        .unwrap()
        .iter()
        .map(|event| event.seq)
        .collect()
}

/// A run's log as (sequence number, step) pairs.
async fn steps(store: &dyn Store, run: &str) -> Vec<(u64, u64)> {
    store
        .events_after(&run_id(run), 0, 10_000)
        .await
        .unwrap()
        .iter()
        .map(|event| {
            let json: serde_json::Value = serde_json::from_str(&event.json).unwrap();
            (event.seq, json["step"].as_u64().unwrap())
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------------------------
// The promises
// ---------------------------------------------------------------------------------------------------------------

async fn a_run_id_is_taken_once_and_a_session_runs_one_run_at_a_time(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    assert_eq!(store.start_run(new_run("r1", "s")).await.unwrap(), Ok(1));
    assert_eq!(
        store.start_run(new_run("r1", "other")).await.unwrap(),
        Err(StartConflict::RunIdTaken(run_id("r1"))),
        "a run id is inserted if absent, never twice"
    );
    assert!(
        store
            .sessions(100)
            .await
            .unwrap()
            .iter()
            .all(|summary| summary.session_id != session("other")),
        "the refused start claimed no session"
    );
    assert_eq!(
        store.start_run(new_run("r1", "s")).await.unwrap(),
        Err(StartConflict::RunIdTaken(run_id("r1"))),
        "refused for its id before its session, busy with it"
    );
    let resume = NewRun {
        parent_run_id: Some(run_id("nobody")),
        ..new_run("r1", "other")
    };
    assert_eq!(
        store.start_run(resume).await.unwrap(),
        Err(StartConflict::RunIdTaken(run_id("r1"))),
        "refused for its id before its resume"
    );
    assert_eq!(
        store.start_run(new_run("r2", "s")).await.unwrap(),
        Err(StartConflict::SessionBusy {
            session_id: session("s"),
            active: run_id("r1")
        })
    );
    assert!(
        store.run(&run_id("r2")).await.unwrap().is_none(),
        "nothing of the refused run was written"
    );
    store
        .finish_run(done(
            "r1",
            vec![user("hello"), user("and more")],
            vec![step_event("r1", 9)],
        ))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(store.start_run(new_run("r2", "s")).await.unwrap(), Ok(1));
    assert_eq!(
        store.session_runs(&session("s"), 10).await.unwrap(),
        vec![run_id("r1"), run_id("r2")]
    );
    let sessions = store.sessions(10).await.unwrap();
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0].title, "the message of r1");
    assert_eq!(sessions[0].runs, 2);
    store
        .finish_run(done("r2", vec![user("then"), user("the end")], vec![]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store.history(&session("s")).await.unwrap(),
        vec![
            user("hello"),
            user("and more"),
            user("then"),
            user("the end")
        ],
        "the session's conversation: each run's messages after the runs' before, in their order"
    );
}

/// Sessions are read by their ids too (a browser's own): those that exist, each once, most recently updated first.
async fn sessions_are_read_by_their_ids(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    for (i, name) in ["s1", "s2", "s3"].into_iter().enumerate() {
        let run = NewRun {
            at: 1_000 * (i as u64 + 1),
            ..new_run(&format!("r{i}"), name)
        };
        store.start_run(run).await.unwrap().unwrap();
    }
    let among = store
        .sessions_among(&[
            session("s1"),
            session("s3"),
            session("missing"),
            session("s1"),
        ])
        .await
        .unwrap();
    let ids: Vec<&str> = among
        .iter()
        .map(|summary| summary.session_id.as_str())
        .collect();
    assert_eq!(ids, ["s3", "s1"]);
    assert_eq!(among[1].title, "the message of r0");
    assert_eq!((among[1].updated_at, among[1].runs), (1_000, 1));
    assert!(store.sessions_among(&[]).await.unwrap().is_empty());
}

/// A run's end, done under its first claim: the messages it adds to its session's conversation, and its last events.
fn done(run: &str, history: Vec<Message>, events: Vec<NewEvent>) -> FinishRun {
    FinishRun {
        run_id: run_id(run),
        claim: EndClaim::Held(1),
        state: RunState::Done,
        history,
        conversation: None,
        suspension: None,
        events,
        audit: vec![],
        settle_pending: None,
    }
}

fn user(content: &str) -> Message {
    Message::User {
        content: content.into(),
    }
}

async fn appended_events_are_read_back_in_order_once_durable(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    let mut watch = store.watch_run(&run_id("r"));
    for step in 2..=600 {
        store.append(&run_id("r"), 1, vec![step_event("r", step)]);
    }
    store.flush().await.unwrap();
    assert!(watch.has_changed().unwrap(), "readers are woken");
    watch.borrow_and_update();
    let seqs = kinds(store, "r").await;
    assert_eq!(seqs, (1..=600).collect::<Vec<u64>>());
    let page = store.events_after(&run_id("r"), 100, 50).await.unwrap();
    assert_eq!(page.first().unwrap().seq, 101);
    assert_eq!(page.len(), 50);
    let json: serde_json::Value = serde_json::from_str(&page[0].json).unwrap();
    assert_eq!(json, json!({"type": "step", "runId": "r", "step": 101}));
    assert_eq!(page[0].kind, "step");
    assert_eq!(
        store.run(&run_id("r")).await.unwrap().unwrap().last_seq,
        600
    );
    // A client may say it saw any event id; past the end, there is nothing after it.
    for after in [600, u64::MAX - 1, u64::MAX] {
        assert_eq!(
            store.events_after(&run_id("r"), after, 10).await.unwrap(),
            vec![],
            "{after}"
        );
    }
}

/// A page of a run's log holds a few MiB at most ([`PAGE_BYTES`]): a run whose events are large (an MCP tool's
/// result is kept up to 64 MiB) is read a few events at a time, and an event larger than a page comes alone; read
/// on, the pages hold the whole log, in order, from what the store keeps in memory as from the database. Before, a
/// page was bounded only by its count (512 a read), and a reader of such a run held hundreds of MiB at once.
async fn a_page_of_large_events_holds_a_few_mib(kind: Kind) {
    let backend = open(kind).await;
    let large = |step: u32, bytes: usize| {
        NewEvent::encode(&StreamEvent::AssistantDelta {
            run_id: run_id("r"),
            step,
            delta: "x".repeat(bytes),
        })
        .unwrap()
    };
    let store = &*backend.store;
    store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    for step in 2..=11 {
        store.append(&run_id("r"), 1, vec![large(step, 1 << 20)]);
    }
    store.append(&run_id("r"), 1, vec![large(12, PAGE_BYTES + 1)]);
    store.append(&run_id("r"), 1, vec![step_event("r", 13)]);
    store.flush().await.unwrap();

    let pages = |store: Arc<dyn Store>| async move {
        let mut pages: Vec<Vec<u64>> = Vec::new();
        let mut after = 0;
        loop {
            let page = store.events_after(&run_id("r"), after, 512).await.unwrap();
            let Some(last) = page.last() else {
                return pages;
            };
            after = last.seq;
            let bytes: usize = page.iter().map(|event| event.json.len()).sum();
            assert!(
                page.len() == 1 || bytes <= PAGE_BYTES,
                "{} events, {bytes} bytes",
                page.len()
            );
            pages.push(page.iter().map(|event| event.seq).collect());
        }
    };
    let check = |pages: Vec<Vec<u64>>| {
        assert_eq!(
            pages.concat(),
            (1..=13).collect::<Vec<u64>>(),
            "the whole log, in order: {pages:?}"
        );
        assert!(pages.len() >= 5, "a few events a page: {pages:?}");
        assert!(pages.contains(&vec![12]), "the largest alone: {pages:?}");
    };
    check(pages(Arc::clone(&backend.store)).await);
    let backend = backend.reopened().await;
    check(pages(Arc::clone(&backend.store)).await);
}

async fn a_reader_at_the_end_of_a_log_is_told_whether_more_may_come(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    let r = run_id("r");
    store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    assert!(
        store.continues_after(&r, 1).await.unwrap(),
        "a run that just started goes on past its first event"
    );
    store.append(&r, 1, vec![step_event("r", 2)]);
    store.flush().await.unwrap();
    assert!(store.continues_after(&r, 2).await.unwrap(), "unfinished");
    store
        .finish_run(done("r", vec![], vec![step_event("r", 3)]))
        .await
        .unwrap()
        .unwrap();
    assert!(
        store.continues_after(&r, 2).await.unwrap(),
        "finished, but its last event is still to be read"
    );
    assert!(
        !store.continues_after(&r, 3).await.unwrap(),
        "finished and read to its end"
    );
    assert!(
        !store.continues_after(&run_id("unknown"), 0).await.unwrap(),
        "a run that is not there says nothing more"
    );
}

async fn a_runs_end_follows_the_events_it_queued(kind: Kind) {
    let mut backend = open(kind).await;
    let store = &*backend.store;
    store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    // Still queued when the run ends, one of them under a claim the run never had.
    store.append(&run_id("r"), 1, vec![step_event("r", 2)]);
    store.append(&run_id("r"), 7, vec![step_event("r", 70)]);
    store.append(
        &run_id("r"),
        1,
        vec![step_event("r", 3), step_event("r", 4)],
    );
    store
        .finish_run(done("r", vec![], vec![step_event("r", 5)]))
        .await
        .unwrap()
        .unwrap();
    let expected = vec![(1, 1), (2, 2), (3, 3), (4, 4), (5, 5)];
    assert_eq!(
        steps(store, "r").await,
        expected,
        "the log, in order, without the stray claim's"
    );
    assert_eq!(store.run(&run_id("r")).await.unwrap().unwrap().last_seq, 5);
    backend = backend.reopened().await;
    assert_eq!(
        steps(&*backend.store, "r").await,
        expected,
        "the same, read from the database"
    );
}

async fn an_end_refused_for_a_claim_it_lacks_loses_no_events_queued_with_it(kind: Kind) {
    let mut backend = open(kind).await;
    let store = &*backend.store;
    store.start_run(new_run("a", "s1")).await.unwrap().unwrap();
    store.start_run(new_run("b", "s2")).await.unwrap().unwrap();
    // Queued together when `a` ends under a claim it never had: the end takes the queue (SQLite) and is refused.
    store.append(&run_id("b"), 1, vec![step_event("b", 2)]);
    store.append(&run_id("a"), 7, vec![step_event("a", 70)]);
    store.append(&run_id("b"), 1, vec![step_event("b", 3)]);
    let stray = FinishRun {
        claim: EndClaim::Held(7),
        ..done("a", vec![], vec![step_event("a", 71)])
    };
    assert_eq!(store.finish_run(stray).await.unwrap(), Err(Fenced::Lost));
    store.flush().await.unwrap();
    let b_steps = vec![(1, 1), (2, 2), (3, 3)];
    assert_eq!(
        steps(store, "b").await,
        b_steps,
        "the other run's events, in order"
    );
    assert_eq!(
        steps(store, "a").await,
        vec![(1, 1)],
        "nothing of the stray claim"
    );
    // The run goes on under its own claim, and ends.
    store.append(&run_id("a"), 1, vec![step_event("a", 2)]);
    store
        .finish_run(done("a", vec![], vec![step_event("a", 3)]))
        .await
        .unwrap()
        .unwrap();
    let a_steps = vec![(1, 1), (2, 2), (3, 3)];
    assert_eq!(steps(store, "a").await, a_steps);
    backend = backend.reopened().await;
    assert_eq!(
        steps(&*backend.store, "b").await,
        b_steps,
        "read from the database"
    );
    assert_eq!(steps(&*backend.store, "a").await, a_steps);
}

async fn a_writer_that_lost_its_claim_appends_nothing(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    store.append(&run_id("r"), 7, vec![step_event("r", 2)]);
    store.flush().await.unwrap();
    assert_eq!(
        kinds(store, "r").await,
        vec![1],
        "a wrong epoch writes nothing"
    );
    open_waiting(store, "r", &[], &[]).await;
    store.append(&run_id("r"), 1, vec![step_event("r", 3)]);
    store.flush().await.unwrap();
    assert_eq!(
        kinds(store, "r").await,
        vec![1, 2],
        "a run that is waiting has no writer"
    );
    let claimed = store
        .claim_batch(&run_id("r"), left_by_abort())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.epoch, 2);
    assert_eq!(
        Some(&claimed.run),
        store.run(&run_id("r")).await.unwrap().as_ref(),
        "the claim returns the run as it left it: running"
    );
    assert_eq!(claimed.run.state, RunState::Running);
    store.append(&run_id("r"), 1, vec![step_event("r", 4)]);
    store.append(&run_id("r"), 2, vec![step_event("r", 5)]);
    store.flush().await.unwrap();
    assert_eq!(kinds(store, "r").await, vec![1, 2, 3]);
    let fenced = store
        .finish_run(done("r", vec![], vec![step_event("r", 6)]))
        .await
        .unwrap();
    assert_eq!(fenced, Err(Fenced::Lost));
    assert_eq!(
        store.run(&run_id("r")).await.unwrap().unwrap().state,
        RunState::Running
    );
}

async fn an_open_batch_is_stored_whole_with_its_events_and_audit(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    let wrong_epoch = store
        .open_batch(OpenBatch {
            run_id: run_id("r"),
            epoch: 2,
            batch: saved_batch(&["a"]),
            calls: vec![pending_call("r", "a", u64::MAX)],
            events: vec![step_event("r", 2)],
            audit: vec![request_audit("r", "a")],
        })
        .await
        .unwrap();
    assert_eq!(wrong_epoch, Err(Fenced::Lost));
    assert!(
        store.pending(PendingOf::All).await.unwrap().is_empty(),
        "a refused batch writes nothing"
    );
    assert_eq!(kinds(store, "r").await, vec![1]);

    open_waiting(store, "r", &[("a", u64::MAX)], &["b"]).await;
    let pending = store.pending(PendingOf::All).await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].tool_call_id, call_id("a"));
    assert_eq!(kinds(store, "r").await, vec![1, 2]);
    let info = store.run(&run_id("r")).await.unwrap().unwrap();
    assert_eq!(info.state, RunState::Waiting);
    let calls = store.calls(&run_id("r")).await.unwrap();
    let statuses: Vec<CallStatus> = calls.iter().map(|c| c.status).collect();
    assert_eq!(statuses, [CallStatus::Pending, CallStatus::Allowed]);
    let audit = store
        .audit_log(AuditQuery {
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(
        audit[0].session_id,
        Some(session("s")),
        "an entry about a run names its session"
    );
    assert_eq!(
        store.stalled_runs().await.unwrap(),
        vec![run_id("r")],
        "an allowed call waits to run"
    );
}

async fn concurrent_decisions_have_exactly_one_winner(kind: Kind) {
    let backend = open(kind).await;
    let store = Arc::clone(&backend.store);
    store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    open_waiting(&*store, "r", &[("a", u64::MAX)], &[]).await;
    let decisions = (0..24).map(|i| {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            let settle: Settle = if i % 2 == 0 {
                Box::new(|record| Ok(approve(record)))
            } else {
                Box::new(|record| Ok(deny(record, DenialSource::User)))
            };
            store
                .decide(&run_id("r"), &call_id("a"), settle)
                .await
                .unwrap()
        })
    });
    let results = futures::future::join_all(decisions).await;
    let winners: Vec<_> = results
        .iter()
        .filter(|result| result.as_ref().unwrap().is_ok())
        .collect();
    assert_eq!(winners.len(), 1, "one decision wins");
    assert!(
        results
            .iter()
            .filter(|r| r.as_ref().unwrap().is_err())
            .all(|r| r.as_ref().unwrap().as_ref().unwrap_err() == &DecideFailure::NotPending)
    );
    let resolutions = store
        .events_after(&run_id("r"), 0, 100)
        .await
        .unwrap()
        .iter()
        .filter(|e| e.json.contains("\"step\":99") || e.json.contains("\"step\":98"))
        .count();
    assert_eq!(resolutions, 1, "one resolution's events");
    assert!(store.pending(PendingOf::All).await.unwrap().is_empty());
    let audit = store
        .audit_log(AuditQuery {
            outcome: Some("approved".into()),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(audit.len() <= 1);
}

async fn a_refused_decision_leaves_the_approval_pending(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    open_waiting(store, "r", &[("a", u64::MAX)], &[]).await;
    let refused = store
        .decide(
            &run_id("r"),
            &call_id("a"),
            Box::new(|_| Err(Refused("the edited path is not a string".into()).into())),
        )
        .await
        .unwrap();
    assert_eq!(
        refused,
        Err(DecideFailure::Refused(Refused(
            "the edited path is not a string".into()
        )))
    );
    assert_eq!(store.pending(PendingOf::All).await.unwrap().len(), 1);
    assert_eq!(kinds(store, "r").await, vec![1, 2]);
    let unknown = store
        .decide(&run_id("r"), &call_id("nope"), Box::new(|r| Ok(approve(r))))
        .await
        .unwrap();
    assert_eq!(unknown, Err(DecideFailure::NotPending));
}

async fn expiry_settles_only_what_is_due(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    open_waiting(store, "r", &[("soon", 5_000), ("later", 9_000)], &[]).await;
    assert_eq!(store.next_expiry(0).await.unwrap(), Some(5_000));
    let settle: SettleExpired = Box::new(|record| deny(record, DenialSource::Timeout));
    assert!(store.expire(4_999, settle).await.unwrap().is_empty());
    let settle: SettleExpired = Box::new(|record| deny(record, DenialSource::Timeout));
    let expired = store.expire(5_000, settle).await.unwrap();
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0].call.id, call_id("soon"));
    assert_eq!(expired[0].status, CallStatus::Denied);
    assert_eq!(store.next_expiry(5_000).await.unwrap(), Some(9_000));
    assert_eq!(
        store.next_expiry(0).await.unwrap(),
        Some(9_000),
        "what expired is no longer pending"
    );
    assert_eq!(store.next_expiry(9_000).await.unwrap(), None);
    let late = store
        .decide(&run_id("r"), &call_id("soon"), Box::new(|r| Ok(approve(r))))
        .await
        .unwrap();
    assert_eq!(
        late,
        Err(DecideFailure::NotPending),
        "a timed-out approval cannot be decided"
    );
}

async fn a_call_runs_once_and_only_its_runner_settles_it(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    open_waiting(store, "r", &[("asked", u64::MAX)], &["free"]).await;
    assert!(
        store
            .begin_call(&run_id("r"), &call_id("asked"), None)
            .await
            .unwrap()
            .is_none(),
        "a pending call does not run"
    );
    let begun = store
        .begin_call(&run_id("r"), &call_id("free"), None)
        .await
        .unwrap();
    assert_eq!(begun.unwrap().status, CallStatus::Executing);
    assert!(
        store
            .begin_call(&run_id("r"), &call_id("free"), None)
            .await
            .unwrap()
            .is_none(),
        "a call is taken once"
    );
    let result = |output: ToolOutput| CallResult {
        run_id: run_id("r"),
        call_id: call_id("free"),
        output,
        events: vec![step_event("r", 50)],
        audit: vec![],
    };
    let ok = ToolOutput::Ok {
        content: json!("done"),
    };
    assert!(store.settle_call(result(ok.clone())).await.unwrap());
    assert!(
        !store.settle_call(result(ok)).await.unwrap(),
        "settled once"
    );
    let free = store
        .call(&run_id("r"), &call_id("free"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(free.status, CallStatus::Settled);
    assert!(free.output.unwrap().is_ok());
}

async fn a_call_begun_inline_needs_the_runs_claim_and_an_earlier_batchs_call_of_its_id_gives_way(
    kind: Kind,
) {
    let backend = open(kind).await;
    let store = &*backend.store;
    store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    assert!(
        begin_inline(store, "r", "c", 7).await.is_none(),
        "not under a claim the run does not have"
    );
    assert!(store.calls(&run_id("r")).await.unwrap().is_empty());
    let begun = begin_inline(store, "r", "c", 1)
        .await
        .expect("begun under the run's claim");
    assert_eq!(begun.status, CallStatus::Executing);
    assert!(
        begin_inline(store, "r", "c", 1).await.is_none(),
        "a call of the same id that has no output yet stays"
    );
    let settled = CallResult {
        run_id: run_id("r"),
        call_id: call_id("c"),
        output: ToolOutput::Ok {
            content: json!("done"),
        },
        events: vec![],
        audit: vec![],
    };
    assert!(store.settle_call(settled).await.unwrap());
    begin_inline(store, "r", "d", 1)
        .await
        .expect("another call");
    let again = begin_inline(store, "r", "c", 1)
        .await
        .expect("a settled call of an earlier batch gives way to one of the same id");
    assert_eq!(again.output, None);
    let calls: Vec<(String, CallStatus, bool)> = store
        .calls(&run_id("r"))
        .await
        .unwrap()
        .into_iter()
        .map(|call| {
            (
                call.call.id.as_str().to_owned(),
                call.status,
                call.output.is_some(),
            )
        })
        .collect();
    assert_eq!(
        calls,
        [
            ("d".to_owned(), CallStatus::Executing, false),
            ("c".to_owned(), CallStatus::Executing, false),
        ],
        "the new call comes after the others, without the earlier one's output"
    );

    // An abort recorded before the run's task hears of it (or on another instance): the run holds its claim, and
    // still begins nothing more.
    cancelled(store, "r").await;
    assert!(
        begin_inline(store, "r", "e", 1).await.is_none(),
        "nothing of an aborted run begins"
    );
    assert!(
        !store
            .calls(&run_id("r"))
            .await
            .unwrap()
            .iter()
            .any(|call| call.call.id.as_str() == "e")
    );
}

async fn a_settled_batch_is_claimed_once(kind: Kind) {
    let backend = open(kind).await;
    let store = Arc::clone(&backend.store);
    store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    open_waiting(&*store, "r", &[("a", u64::MAX)], &[]).await;
    assert!(
        store
            .claim_batch(&run_id("r"), left_by_abort())
            .await
            .unwrap()
            .is_none(),
        "not while a call waits"
    );
    store
        .decide(
            &run_id("r"),
            &call_id("a"),
            Box::new(|r| Ok(deny(r, DenialSource::User))),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(store.stalled_runs().await.unwrap(), vec![run_id("r")]);
    let claims = (0..8).map(|_| {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            store
                .claim_batch(&run_id("r"), left_by_abort())
                .await
                .unwrap()
        })
    });
    let claims: Vec<Claimed> = futures::future::join_all(claims)
        .await
        .into_iter()
        .filter_map(|claim| claim.unwrap())
        .collect();
    assert_eq!(claims.len(), 1, "one claim");
    let claimed = &claims[0];
    assert_eq!(claimed.epoch, 2);
    assert_eq!(claimed.batch, saved_batch(&["a"]));
    assert_eq!(claimed.outputs.len(), 1);
    assert!(!claimed.outputs[0].1.is_ok());
    let info = store.run(&run_id("r")).await.unwrap().unwrap();
    assert_eq!(info.state, RunState::Running);
    assert!(store.stalled_runs().await.unwrap().is_empty());
    // An end meant for the run while it waited (by an instance that could not read it) no longer takes it.
    let waiting_end = FinishRun {
        claim: EndClaim::Waiting,
        state: RunState::Failed,
        ..done("r", vec![], vec![step_event("r", 9)])
    };
    assert_eq!(
        store.finish_run(waiting_end).await.unwrap(),
        Err(Fenced::Lost)
    );
    let info = store.run(&run_id("r")).await.unwrap().unwrap();
    assert_eq!(info.state, RunState::Running, "still the claim's");
    // Recovery's end (of a dead instance's run) takes a running run, whoever holds it.
    let recovery_end = FinishRun {
        claim: EndClaim::Unended,
        state: RunState::Failed,
        ..done("r", vec![], vec![step_event("r", 9)])
    };
    store.finish_run(recovery_end).await.unwrap().unwrap();
    let info = store.run(&run_id("r")).await.unwrap().unwrap();
    assert_eq!(info.state, RunState::Failed);
}

async fn finishing_a_run_frees_its_session_and_leaves_nothing_pending(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    open_waiting(store, "r", &[("a", u64::MAX)], &[]).await;
    let claimed = cancelled(store, "r").await;
    assert_eq!(claimed.run.abort, Some(AbortReason::Cancelled));
    assert!(
        store.pending(PendingOf::All).await.unwrap().is_empty(),
        "an abort leaves nothing pending"
    );
    let claimed = store
        .claim_batch(&run_id("r"), left_by_abort())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.run.abort, Some(AbortReason::Cancelled));
    store
        .finish_run(FinishRun {
            run_id: run_id("r"),
            claim: EndClaim::Held(claimed.epoch),
            state: RunState::Failed,
            history: vec![],
            conversation: Some(vec![Message::User {
                content: "kept".into(),
            }]),
            suspension: None,
            events: vec![step_event("r", 100)],
            audit: vec![],
            settle_pending: Some(Box::new(|r| deny(r, DenialSource::Abort))),
        })
        .await
        .unwrap()
        .unwrap();
    let info = store.run(&run_id("r")).await.unwrap().unwrap();
    assert_eq!(info.state, RunState::Failed);
    assert_eq!(
        store
            .conversation(&run_id("r"))
            .await
            .unwrap()
            .unwrap()
            .len(),
        1
    );
    assert!(store.unfinished_runs().await.unwrap().is_empty());
    assert_eq!(
        store.start_run(new_run("r2", "s")).await.unwrap(),
        Ok(1),
        "the session is free"
    );
}

/// How an end settles the calls it finds pending: the step of its event is 90 plus the call's place in the batch,
/// and it records an audit entry naming the call.
fn settle_in_batch_order(record: &CallRecord) -> Settlement {
    let place = ["m", "z", "a"]
        .iter()
        .position(|id| *id == record.call.id.as_str())
        .expect("a call of the batch") as u32;
    Settlement {
        events: vec![step_event(record.run_id.as_str(), 90 + place)],
        audit: vec![AuditEntry {
            kind: AuditKind::ApprovalResolved,
            outcome: "denied".into(),
            ..request_audit(record.run_id.as_str(), record.call.id.as_str())
        }],
        ..deny(record, DenialSource::Abort)
    }
}

async fn an_end_settles_the_calls_still_pending_in_the_order_they_were_asked(kind: Kind) {
    let mut backend = open(kind).await;
    let store = &*backend.store;
    store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    // Asked in this order, which is not the order of their ids.
    open_waiting(
        store,
        "r",
        &[("m", u64::MAX), ("z", u64::MAX), ("a", u64::MAX)],
        &[],
    )
    .await;
    let settling = |claim| FinishRun {
        claim,
        state: RunState::Failed,
        settle_pending: Some(Box::new(settle_in_batch_order)),
        ..done("r", vec![], vec![step_event("r", 5)])
    };
    assert_eq!(
        store.finish_run(settling(EndClaim::Held(7))).await.unwrap(),
        Err(Fenced::Lost),
        "a waiting run is no writer's to end"
    );
    let statuses: Vec<CallStatus> = store
        .calls(&run_id("r"))
        .await
        .unwrap()
        .iter()
        .map(|call| call.status)
        .collect();
    assert_eq!(
        statuses,
        [CallStatus::Pending; 3],
        "a refused end takes no call"
    );
    store
        .finish_run(settling(EndClaim::Waiting))
        .await
        .unwrap()
        .unwrap();
    let expected = vec![(1, 1), (2, 2), (3, 90), (4, 91), (5, 92), (6, 5)];
    assert_eq!(
        steps(store, "r").await,
        expected,
        "the settlements' events in the batch's order, then the end's"
    );
    assert!(store.pending(PendingOf::All).await.unwrap().is_empty());
    assert!(store.calls(&run_id("r")).await.unwrap().is_empty());
    let resolved: Vec<String> = store
        .audit_log(AuditQuery {
            outcome: Some("denied".into()),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_iter()
        .filter_map(|entry| entry.tool_call_id.map(|id| id.as_str().to_owned()))
        .collect();
    assert_eq!(resolved, ["m", "z", "a"]);
    for claim in [EndClaim::Unended, EndClaim::Waiting] {
        assert_eq!(
            store.finish_run(settling(claim)).await.unwrap(),
            Err(Fenced::Lost),
            "an ended run is not ended again"
        );
    }
    backend = backend.reopened().await;
    assert_eq!(steps(&*backend.store, "r").await, expected);
}

/// What a run `run` of `session_id` that asks about one call `c` records, its interrupt expiring at `expires_at`.
fn suspension_of(run: &str, session_id: &str, expires_at: u64) -> Suspension {
    Suspension {
        run_id: run_id(run),
        session_id: session(session_id),
        history: vec![],
        interruption: Interruption {
            step: 1,
            calls: vec![tool_call("c")],
            settled: vec![],
            pending: vec![PendingCall {
                call: tool_call("c"),
                input: json!({"path": "c"}),
                reason: "destructive".into(),
                spec_digest: None,
                shown_state: None,
                choices: Default::default(),
            }],
        },
        interrupts: vec![IssuedInterrupt {
            request: InterruptRequest {
                id: "int-1".into(),
                tool_call_id: call_id("c"),
                tool_name: "delete_file".into(),
                arguments: json!({"path": "c"}),
                reason: "destructive".into(),
                expires_at,
                choices: Default::default(),
            },
            digest: arguments_digest(&json!({"path": "c"})),
        }],
    }
}

/// The end of the suspended run, by its writer.
fn interrupted(suspension: &Suspension) -> FinishRun {
    FinishRun {
        run_id: suspension.run_id.clone(),
        claim: EndClaim::Held(1),
        state: RunState::Interrupted,
        history: vec![],
        conversation: Some(vec![]),
        suspension: Some(suspension.clone()),
        events: vec![step_event(suspension.run_id.as_str(), 2)],
        audit: vec![],
        settle_pending: None,
    }
}

/// A run aborted before its writer ends it with interrupts issues none: the end is refused, told why, and leaves
/// no suspension a resume could answer; the writer can still end it another way (as aborted).
async fn an_aborted_run_leaves_no_suspension(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    store.start_run(new_run("r1", "t")).await.unwrap().unwrap();
    cancelled(store, "r1").await;
    let suspension = suspension_of("r1", "t", u64::MAX);
    // Under a claim it does not hold, the end is refused for that, not for the abort.
    assert_eq!(
        store
            .finish_run(FinishRun {
                claim: EndClaim::Held(7),
                ..interrupted(&suspension)
            })
            .await
            .unwrap(),
        Err(Fenced::Lost)
    );
    assert_eq!(
        store.finish_run(interrupted(&suspension)).await.unwrap(),
        Err(Fenced::Aborted(AbortReason::Cancelled))
    );
    assert_eq!(store.interrupt(&run_id("r1")).await.unwrap(), None);
    store
        .finish_run(FinishRun {
            state: RunState::Failed,
            suspension: None,
            ..interrupted(&suspension)
        })
        .await
        .unwrap()
        .expect("its writer ends it as failed");
    assert_eq!(store.interrupt(&run_id("r1")).await.unwrap(), None);
}

async fn a_suspension_is_taken_once_and_a_replay_is_told_who_took_it(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    store.start_run(new_run("r1", "t")).await.unwrap().unwrap();
    let suspension = suspension_of("r1", "t", 50_000);
    store
        .finish_run(interrupted(&suspension))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store.open_interrupt(&session("t")).await.unwrap(),
        Some((run_id("r1"), 50_000))
    );
    let (read, used) = store.interrupt(&run_id("r1")).await.unwrap().unwrap();
    assert_eq!(read, suspension, "what was issued reads back exactly");
    assert_eq!(used, None);
    let resume = |run: &str, parent: &str| NewRun {
        parent_run_id: Some(run_id(parent)),
        message: String::new(),
        ..new_run(run, "t")
    };
    assert_eq!(
        store.start_run(resume("r9", "nope")).await.unwrap(),
        Err(StartConflict::Resume(TakeError::UnknownParent(run_id(
            "nope"
        ))))
    );
    // A resume whose run cannot start uses nothing: the take commits with the start or not at all.
    store
        .start_run(new_run("busy", "t"))
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        store.start_run(resume("r2", "r1")).await.unwrap(),
        Err(StartConflict::SessionBusy { .. })
    ));
    assert_eq!(
        store.interrupt(&run_id("r1")).await.unwrap().unwrap().1,
        None,
        "the interrupts stay open when the resuming run did not start"
    );
    store
        .finish_run(done("busy", vec![], vec![step_event("busy", 2)]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(store.start_run(resume("r2", "r1")).await.unwrap(), Ok(1));
    assert_eq!(
        store.interrupt(&run_id("r1")).await.unwrap().unwrap().1,
        Some(run_id("r2"))
    );
    assert_eq!(
        store.start_run(resume("r3", "r1")).await.unwrap(),
        Err(StartConflict::Resume(TakeError::AlreadyUsed {
            parent: run_id("r1"),
            by: run_id("r2")
        })),
        "a replay is refused and told who resumed it"
    );
    assert_eq!(store.open_interrupt(&session("t")).await.unwrap(), None);
    let backend = backend.reopened().await;
    assert_eq!(
        backend.store.interrupt(&run_id("r1")).await.unwrap(),
        Some((suspension, Some(run_id("r2")))),
        "the same, read from the database"
    );
}

/// AG-UI's rule, in the start: a thread answers its interrupts before it starts another run.
async fn a_new_run_that_waits_for_no_interrupt_is_refused_while_its_session_waits_for_one(
    kind: Kind,
) {
    let backend = open(kind).await;
    let store = &*backend.store;
    store.start_run(new_run("r1", "t")).await.unwrap().unwrap();
    store
        .finish_run(interrupted(&suspension_of("r1", "t", 50_000)))
        .await
        .unwrap()
        .unwrap();
    let refused_at = |run: &str, at: u64| NewRun {
        at,
        refused_while_interrupted: true,
        ..new_run(run, "t")
    };
    assert_eq!(
        store.start_run(refused_at("r2", 10_000)).await.unwrap(),
        Err(StartConflict::Interrupted {
            session_id: session("t"),
            waiting: run_id("r1")
        })
    );
    assert_eq!(
        store.start_run(refused_at("r1", 10_000)).await.unwrap(),
        Err(StartConflict::RunIdTaken(run_id("r1"))),
        "a taken run id is refused first"
    );
    assert_eq!(store.run(&run_id("r2")).await.unwrap(), None);
    // The refused start claimed nothing: a run that the interrupt does not refuse starts in the session.
    assert_eq!(store.start_run(new_run("r3", "t")).await.unwrap(), Ok(1));
    assert!(matches!(
        store.start_run(refused_at("r4", 10_000)).await.unwrap(),
        Err(StartConflict::SessionBusy { .. })
    ));
    store
        .finish_run(done("r3", vec![], vec![step_event("r3", 2)]))
        .await
        .unwrap()
        .unwrap();
    // Once the interrupt has expired, it refuses nothing.
    assert_eq!(
        store.start_run(refused_at("r5", 50_000)).await.unwrap(),
        Ok(1)
    );
    store
        .finish_run(done("r5", vec![], vec![step_event("r5", 2)]))
        .await
        .unwrap()
        .unwrap();
    // A resume answers the interrupt it would wait on: its take checks it, not this rule.
    let resume = NewRun {
        parent_run_id: Some(run_id("r1")),
        message: String::new(),
        ..refused_at("r6", 10_000)
    };
    assert_eq!(store.start_run(resume).await.unwrap(), Ok(1));
}

/// A run whose interrupts a resume took is kept while that resume goes on (should its process die, the recovery gives
/// the interrupts back to the run), and may go once the resume has ended. Before, it could be pruned for the log's
/// size while its resume ran, and the recovery had nothing to give them back to.
async fn retention_keeps_a_resumed_run_while_its_resume_goes_on(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    store
        .start_run(new_run("parent", "s1"))
        .await
        .unwrap()
        .unwrap();
    let in_an_hour = agent::clock::now_ms() + 3_600_000;
    store
        .finish_run(interrupted(&suspension_of("parent", "s1", in_an_hour)))
        .await
        .unwrap()
        .unwrap();
    let resume = NewRun {
        parent_run_id: Some(run_id("parent")),
        message: String::new(),
        ..new_run("child", "s1")
    };
    store.start_run(resume).await.unwrap().unwrap();
    let crowded = RetentionLimits {
        max_age_ms: u64::MAX,
        max_event_bytes: 0,
    };
    let now = agent::clock::now_ms() + 1;
    assert_eq!(store.prune(crowded, now).await.unwrap(), 0);
    assert!(store.run(&run_id("parent")).await.unwrap().is_some());
    store
        .finish_run(done(
            "child",
            vec![user("hi")],
            vec![step_event("child", 2)],
        ))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(store.prune(crowded, now + 1).await.unwrap(), 2);
    assert!(store.run(&run_id("parent")).await.unwrap().is_none());
}

async fn retention_forgets_old_runs_and_keeps_open_suspensions(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    for (run, session_id) in [("old", "s1"), ("waiting", "s2")] {
        store
            .start_run(new_run(run, session_id))
            .await
            .unwrap()
            .unwrap();
    }
    let grant = StoredGrant {
        id: "g1".into(),
        grant: json!({"tool": "delete_file"}),
        created_at: 5,
    };
    store
        .add_grant(&run_id("old"), 1, grant)
        .await
        .unwrap()
        .unwrap();
    store
        .finish_run(FinishRun {
            audit: vec![request_audit("old", "x")],
            ..done("old", vec![user("hi")], vec![step_event("old", 2)])
        })
        .await
        .unwrap()
        .unwrap();
    open_waiting(store, "waiting", &[("a", u64::MAX)], &[]).await;
    let now = agent::clock::now_ms() + 1;

    // Pruned for the log's size, the run goes; its session, used just now, stays with its conversation and grant.
    let crowded = RetentionLimits {
        max_age_ms: u64::MAX,
        max_event_bytes: 0,
    };
    assert_eq!(store.prune(crowded, now).await.unwrap(), 1);
    assert_eq!(store.counts().await.unwrap().sessions, 2);
    assert_eq!(store.grants(&session("s1")).await.unwrap().len(), 1);
    assert_eq!(store.history(&session("s1")).await.unwrap().len(), 1);

    // Idle past the age, a session without runs goes too, with its conversation and grants; one whose run goes
    // on stays.
    let limits = RetentionLimits {
        max_age_ms: 0,
        max_event_bytes: u64::MAX,
    };
    assert_eq!(store.prune(limits, now).await.unwrap(), 0);
    assert_eq!(store.counts().await.unwrap().sessions, 1);
    assert!(store.grants(&session("s1")).await.unwrap().is_empty());
    assert!(store.history(&session("s1")).await.unwrap().is_empty());
    assert_eq!(
        store.session_runs(&session("s2"), 1).await.unwrap().len(),
        1
    );
    // Its id starts a session afresh.
    store
        .start_run(new_run("again", "s1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(store.counts().await.unwrap().sessions, 2);
    assert!(store.run(&run_id("old")).await.unwrap().is_none());
    assert!(
        store
            .events_after(&run_id("old"), 0, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store.run(&run_id("waiting")).await.unwrap().is_some(),
        "a run going is never pruned"
    );
    assert_eq!(
        audit_of(store, "old").await.len(),
        1,
        "the audit log outlives the runs"
    );
}

async fn a_run_started_after_the_newest_was_pruned_has_a_log_of_its_own(kind: Kind) {
    let mut backend = open(kind).await;
    let store = &*backend.store;
    store
        .start_run(new_run("first", "s1"))
        .await
        .unwrap()
        .unwrap();
    store
        .start_run(new_run("newest", "s2"))
        .await
        .unwrap()
        .unwrap();
    store
        .finish_run(done("newest", vec![], vec![step_event("newest", 2)]))
        .await
        .unwrap()
        .unwrap();
    let limits = RetentionLimits {
        max_age_ms: 0,
        max_event_bytes: u64::MAX,
    };
    let now = agent::clock::now_ms() + 1;
    assert_eq!(store.prune(limits, now).await.unwrap(), 1);
    // A store that numbers runs may give the pruned run's number again: none of its events may come with it. The
    // new run's log is read from the database, by a store opened anew: what the first store keeps in memory knows
    // only what it wrote itself.
    store
        .start_run(NewRun {
            events: vec![],
            ..new_run("next", "s3")
        })
        .await
        .unwrap()
        .unwrap();
    store.append(
        &run_id("next"),
        1,
        vec![step_event("next", 1), step_event("next", 2)],
    );
    store.flush().await.unwrap();
    backend = backend.reopened().await;
    let store = &*backend.store;
    let log = store.events_after(&run_id("next"), 0, 10).await.unwrap();
    assert_eq!(
        log.iter()
            .map(|event| (event.seq, event.json.contains("\"next\"")))
            .collect::<Vec<_>>(),
        vec![(1, true), (2, true)],
        "the new run's own two events, and nothing of the pruned run's"
    );
    assert!(
        store
            .events_after(&run_id("newest"), 0, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn a_run_reads_back_the_conversation_its_end_recorded(kind: Kind) {
    let mut backend = open(kind).await;
    let store = &*backend.store;
    for (run, session_id) in [("kept", "s1"), ("none", "s2"), ("going", "s3")] {
        store
            .start_run(new_run(run, session_id))
            .await
            .unwrap()
            .unwrap();
    }
    let conversation = vec![user("hello"), user("and more")];
    store
        .finish_run(FinishRun {
            conversation: Some(conversation.clone()),
            ..done("kept", vec![], vec![step_event("kept", 2)])
        })
        .await
        .unwrap()
        .unwrap();
    store
        .finish_run(done("none", vec![], vec![step_event("none", 2)]))
        .await
        .unwrap()
        .unwrap();
    let expected = [
        ("kept", Some(conversation)),
        ("none", None),
        ("going", None),
        ("never", None),
    ];
    for (run, conversation) in &expected {
        assert_eq!(
            store.conversation(&run_id(run)).await.unwrap().as_deref(),
            conversation.as_deref(),
            "{run}, in the store that ended it"
        );
    }
    backend = backend.reopened().await;
    for (run, conversation) in &expected {
        assert_eq!(
            backend
                .store
                .conversation(&run_id(run))
                .await
                .unwrap()
                .as_deref(),
            conversation.as_deref(),
            "{run}, read from the database"
        );
    }
}

async fn a_sessions_grants_are_its_own_and_outlive_the_process(kind: Kind) {
    let mut backend = open(kind).await;
    let grant = |id: &str| StoredGrant {
        id: id.into(),
        grant: json!({"tool": "delete_file"}),
        created_at: 5,
    };
    for (run, session_id) in [("r1", "granted"), ("r2", "other")] {
        backend
            .store
            .start_run(new_run(run, session_id))
            .await
            .unwrap()
            .unwrap();
    }
    backend
        .store
        .add_grant(&run_id("r1"), 1, grant("g1"))
        .await
        .unwrap()
        .unwrap();
    backend = backend.reopened().await;
    let store = &*backend.store;
    assert_eq!(
        store.grants(&session("granted")).await.unwrap(),
        vec![grant("g1")],
        "a grant from before the restart"
    );
    assert!(store.grants(&session("other")).await.unwrap().is_empty());
    store
        .start_run(new_run("r3", "third"))
        .await
        .unwrap()
        .unwrap();
    store
        .add_grant(&run_id("r3"), 1, grant("g2"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store.grants(&session("third")).await.unwrap(),
        vec![grant("g2")],
        "a grant to a session that held none"
    );
    assert!(store.grants(&session("other")).await.unwrap().is_empty());
}

/// A decision's grant (an approval for the session) is kept with the decision, in its change: whoever reads the
/// decision's event finds the grant; a decision that does not happen keeps none.
async fn a_decisions_grant_is_kept_with_it(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    open_waiting(store, "r", &[("a", u64::MAX)], &[]).await;
    let grant = StoredGrant {
        id: "g1".into(),
        grant: json!({"tool": "delete_file"}),
        created_at: 5,
    };
    let granting = |grant: &StoredGrant| -> agent::store::Settle {
        let grant = grant.clone();
        Box::new(move |record| {
            Ok(Settlement {
                grant: Some(grant),
                ..approve(record)
            })
        })
    };
    store
        .decide(&run_id("r"), &call_id("a"), granting(&grant))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store.grants(&session("s")).await.unwrap(),
        vec![grant.clone()]
    );
    let too_late = StoredGrant {
        id: "g2".into(),
        ..grant.clone()
    };
    assert_eq!(
        store
            .decide(&run_id("r"), &call_id("a"), granting(&too_late))
            .await
            .unwrap(),
        Err(DecideFailure::NotPending)
    );
    assert_eq!(
        store.grants(&session("s")).await.unwrap(),
        vec![grant],
        "a decision that lost keeps no grant"
    );
}

/// An approval that stands on a session grant (a card the grant another decision made covers) is settled only while
/// the session holds the grant: a revoke that lands first leaves the card waiting for a person.
async fn an_approval_under_a_revoked_grant_is_refused(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    let grant = StoredGrant {
        id: "g1".into(),
        grant: json!({"tool": "delete_file"}),
        created_at: 5,
    };
    store
        .add_grant(&run_id("r"), 1, grant.clone())
        .await
        .unwrap()
        .unwrap();
    open_waiting(store, "r", &[("a", u64::MAX), ("b", u64::MAX)], &[]).await;
    store
        .decide(&run_id("r"), &call_id("a"), approve_under_grant("g1"))
        .await
        .unwrap()
        .expect("a card under a grant the session holds is approved");
    let revoke = AuditEntry {
        kind: AuditKind::GrantRevoked,
        outcome: "revoked".into(),
        ..request_audit("r", "a")
    };
    assert!(
        store
            .revoke_grant(&session("s"), "g1", revoke)
            .await
            .unwrap()
    );
    assert_eq!(
        store
            .decide(&run_id("r"), &call_id("b"), approve_under_grant("g1"))
            .await
            .unwrap(),
        Err(DecideFailure::GrantRevoked)
    );
    let backend = backend.reopened().await;
    let store = &*backend.store;
    assert_eq!(
        listed(store, PendingOf::Run(&run_id("r"))).await,
        vec![("r".to_owned(), "b".to_owned())],
        "the card the revoked grant no longer covers waits for a person"
    );
    assert_eq!(
        audit_of(store, "r")
            .await
            .iter()
            .filter(|entry| entry.kind == AuditKind::ApprovalResolved)
            .count(),
        1,
        "only the approval that stood on a held grant is in the log"
    );
    // Another session's grant of the same id is not this session's.
    store.start_run(new_run("r3", "s3")).await.unwrap().unwrap();
    store
        .add_grant(&run_id("r3"), 1, grant)
        .await
        .unwrap()
        .unwrap();
    store.start_run(new_run("r2", "s2")).await.unwrap().unwrap();
    open_waiting(store, "r2", &[("c", u64::MAX)], &[]).await;
    assert_eq!(
        store
            .decide(&run_id("r2"), &call_id("c"), approve_under_grant("g1"))
            .await
            .unwrap(),
        Err(DecideFailure::GrantRevoked)
    );
}

/// The audit log keeps every entry for good, and some of its texts are chosen by a client or a model (a tool's
/// name, a refusal that repeats what it refused): each is kept to its bound, cut with `…`, in every store.
async fn the_audit_log_keeps_each_text_to_its_bound(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    let long = AuditEntry {
        tool: Some("t".repeat(10_000)),
        outcome: "o".repeat(10_000),
        reason: Some("é".repeat(100_000)),
        actor: Some("a".repeat(300)),
        ..request_audit("r", "c")
    };
    store.audit(long).await.unwrap();
    store.audit(request_audit("r", "d")).await.unwrap();
    let entries = audit_of(store, "r").await;
    let cut = &entries[0];
    let chars = |text: &str| text.chars().count();
    assert_eq!(chars(cut.tool.as_deref().unwrap()), AuditEntry::FIELD_CHARS);
    assert!(cut.tool.as_deref().unwrap().ends_with("t…"));
    assert_eq!(chars(&cut.outcome), AuditEntry::FIELD_CHARS);
    assert_eq!(
        chars(cut.actor.as_deref().unwrap()),
        AuditEntry::FIELD_CHARS
    );
    // The reason, which may be a rule's or a grant's whole text, ends with the digest of the whole.
    let reason = cut.reason.as_deref().unwrap();
    assert_eq!(chars(reason), AuditEntry::REASON_CHARS);
    let digest: String = {
        use sha2::Digest as _;
        sha2::Sha256::digest("é".repeat(100_000).as_bytes())
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect()
    };
    assert!(
        reason.ends_with(&format!(
            "é… (cut: the whole is 100000 characters, SHA-256 {digest})"
        )),
        "{reason}"
    );
    // An entry within its bounds is kept as it is.
    assert_eq!(
        AuditEntry {
            id: entries[1].id,
            session_id: entries[1].session_id.clone(),
            ..request_audit("r", "d")
        },
        entries[1]
    );
}

/// A grant a resume's answer makes is kept only while the resume is still this instance's run at its epoch: a
/// run fenced (taken over, or ended by a recovery that looked for grants) keeps none from its late owner.
async fn a_grant_is_kept_only_by_the_runs_holder(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    let grant = |id: &str| StoredGrant {
        id: id.into(),
        grant: json!({"tool": "delete_file"}),
        created_at: 5,
    };
    store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    assert_eq!(
        store
            .add_grant(&run_id("r"), 2, grant("stale"))
            .await
            .unwrap(),
        Err(Fenced::Lost),
        "an epoch the run is not at"
    );
    assert_eq!(
        store
            .add_grant(&run_id("nobody"), 1, grant("none"))
            .await
            .unwrap(),
        Err(Fenced::Lost),
        "a run that is not there"
    );
    store
        .add_grant(&run_id("r"), 1, grant("held"))
        .await
        .unwrap()
        .expect("the run's holder keeps its grant");
    open_waiting(store, "r", &[("a", u64::MAX)], &[]).await;
    assert_eq!(
        store
            .add_grant(&run_id("r"), 1, grant("waiting"))
            .await
            .unwrap(),
        Err(Fenced::Lost),
        "a run no longer running"
    );
    assert_eq!(
        store.grants(&session("s")).await.unwrap(),
        vec![grant("held")]
    );
}

async fn grants_rules_and_the_audit_log_are_kept_and_filtered(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    let grant = StoredGrant {
        id: "g1".into(),
        grant: json!({"tool": "delete_file"}),
        created_at: 5,
    };
    store
        .add_grant(&run_id("r"), 1, grant.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(store.grants(&session("s")).await.unwrap(), vec![grant]);
    let revoke = AuditEntry {
        kind: AuditKind::GrantRevoked,
        outcome: "revoked".into(),
        at: 10,
        ..request_audit("r", "c")
    };
    assert!(
        store
            .revoke_grant(&session("s"), "g1", revoke.clone())
            .await
            .unwrap()
    );
    assert!(
        !store
            .revoke_grant(&session("s"), "g1", revoke)
            .await
            .unwrap()
    );
    assert!(store.grants(&session("s")).await.unwrap().is_empty());

    let rule = StoredRule {
        id: "rule-1".into(),
        rule: "run_command(git status)=allow".into(),
        created_at: 20,
        created_by: Some("local".into()),
    };
    let changed = AuditEntry {
        kind: AuditKind::RuleChanged,
        outcome: "added".into(),
        at: 20,
        ..request_audit("r", "c")
    };
    assert!(store.add_rule(rule.clone(), changed.clone()).await.unwrap());
    // The same rule again, as a second instance adding it at once would: one rule, one audit line.
    assert!(!store.add_rule(rule.clone(), changed.clone()).await.unwrap());
    assert_eq!(store.rules().await.unwrap(), vec![rule.clone()]);
    // A row of its id with another text (one that another version wrote) is replaced.
    let rewritten = StoredRule {
        rule: "run_command(git status)=ask".into(),
        created_at: 21,
        ..rule
    };
    assert!(
        store
            .add_rule(rewritten.clone(), changed.clone())
            .await
            .unwrap()
    );
    assert_eq!(store.rules().await.unwrap(), vec![rewritten]);
    assert!(store.remove_rule("rule-1", changed.clone()).await.unwrap());
    assert!(!store.remove_rule("rule-1", changed).await.unwrap());

    for at in [30, 40, 50] {
        store
            .audit(AuditEntry {
                at,
                tool: Some(format!("tool{at}")),
                ..request_audit("r", "c")
            })
            .await
            .unwrap();
    }
    let all = store
        .audit_log(AuditQuery {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    // The revoked grant, the rule added, replaced and removed, and the three entries just written.
    assert_eq!(all.len(), 7);
    assert!(all.windows(2).all(|w| w[0].id < w[1].id), "oldest first");
    let window = store
        .audit_log(AuditQuery {
            since: Some(30),
            until: Some(50),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(window.iter().map(|e| e.at).collect::<Vec<_>>(), [30, 40]);
    let page = store
        .audit_log(AuditQuery {
            after_id: Some(all[1].id),
            limit: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        page.iter().map(|e| e.id).collect::<Vec<_>>(),
        [all[2].id, all[3].id]
    );
    let by_tool = store
        .audit_log(AuditQuery {
            tool: Some("tool40".into()),
            session_id: Some(session("s")),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(by_tool.len(), 1);
    // Bounds past what a database column holds mean what they say: nothing is that late, everything is earlier.
    let count = |query: AuditQuery| async move {
        store
            .audit_log(AuditQuery {
                limit: 100,
                ..query
            })
            .await
            .unwrap()
            .len()
    };
    for huge in [i64::MAX as u64, i64::MAX as u64 + 1, u64::MAX] {
        let since = count(AuditQuery {
            since: Some(huge),
            ..Default::default()
        });
        let until = count(AuditQuery {
            until: Some(huge),
            ..Default::default()
        });
        let after = count(AuditQuery {
            after_id: Some(huge),
            ..Default::default()
        });
        assert_eq!([since.await, until.await, after.await], [0, 7, 0], "{huge}");
    }
}

/// A decision (a denial, which settles the batch) and the run's own attempt to claim its batch, at the same moment,
/// on many runs: every decision succeeds and every batch is claimed after it, never a store error. (A decision that locked the call before
/// the run, beside a claim that locked the run before its calls, deadlocked on PostgreSQL, which failed one.)
async fn a_decision_and_a_claim_at_once_never_fail_on_locks(kind: Kind) {
    let backend = open(kind).await;
    let store = Arc::clone(&backend.store);
    let runs: Vec<String> = (0..40).map(|i| format!("r{i}")).collect();
    for run in &runs {
        store
            .start_run(new_run(run, &format!("s-{run}")))
            .await
            .unwrap()
            .unwrap();
        open_waiting(&*store, run, &[("a", u64::MAX)], &[]).await;
    }
    let races = runs.iter().map(|run| {
        let store = Arc::clone(&store);
        let run = run.clone();
        tokio::spawn(async move {
            let (decided, claimed) = tokio::join!(
                store.decide(
                    &run_id(&run),
                    &call_id("a"),
                    Box::new(|r| Ok(deny(r, DenialSource::User)))
                ),
                store.claim_batch(&run_id(&run), left_by_abort()),
            );
            let decided = decided.map(|d| d.is_ok());
            // The claim may come before the decision (nothing to claim yet) or after it (the batch).
            let claimed = match claimed {
                Ok(Some(_)) => Ok(true),
                Ok(None) => store
                    .claim_batch(&run_id(&run), left_by_abort())
                    .await
                    .map(|c| c.is_some()),
                Err(error) => Err(error),
            };
            (run, decided, claimed)
        })
    });
    for race in futures::future::join_all(races).await {
        let (run, decided, claimed) = race.unwrap();
        assert!(
            matches!(decided, Ok(true)),
            "{run}: the decision: {decided:?}"
        );
        assert!(matches!(claimed, Ok(true)), "{run}: the claim: {claimed:?}");
    }
}

/// What one browser may see of the log, read in one query: the entries of its sessions and those of no session,
/// newest first, however many entries other sessions have after them.
async fn the_audit_log_reads_the_entries_of_some_sessions_or_of_none(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    for (session_id, call) in [
        (Some("mine"), "a"),
        (None, "rule"),
        (Some("theirs"), "b"),
        (Some("also-mine"), "c"),
        (Some("theirs"), "d"),
        (Some("theirs"), "e"),
    ] {
        store
            .audit(AuditEntry {
                session_id: session_id.map(session),
                run_id: None,
                ..request_audit("unused", call)
            })
            .await
            .unwrap();
    }
    let read = |sessions: Vec<SessionId>, limit: usize| async move {
        store
            .audit_log(AuditQuery {
                sessions_or_none: Some(sessions),
                newest_first: true,
                limit,
                ..Default::default()
            })
            .await
            .unwrap()
            .iter()
            .map(|entry| entry.tool_call_id.as_ref().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        read(vec![session("mine"), session("also-mine")], 10).await,
        ["c", "rule", "a"]
    );
    assert_eq!(
        read(vec![session("mine"), session("also-mine")], 2).await,
        ["c", "rule"]
    );
    assert_eq!(read(vec![], 10).await, ["rule"]);
    // With the other filters, their placeholders numbered after the sessions'.
    let c = store
        .audit_log(AuditQuery {
            sessions_or_none: Some(vec![session("also-mine")]),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap()[1]
        .id;
    let before_c = store
        .audit_log(AuditQuery {
            sessions_or_none: Some(vec![session("mine"), session("also-mine")]),
            outcome: Some("requested".into()),
            since: Some(1_000),
            before_id: Some(c),
            newest_first: true,
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    let calls: Vec<String> = before_c
        .iter()
        .map(|entry| entry.tool_call_id.as_ref().unwrap().to_string())
        .collect();
    assert_eq!(calls, ["rule", "a"]);
}

/// The audit log reads newest first too, on from before an id, with its filters: a view of what happened last reads
/// the end of the log, not its beginning.
async fn the_audit_log_reads_newest_first_before_an_id(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    for (run, call) in [
        ("r1", "a"),
        ("r2", "b"),
        ("r1", "c"),
        ("r2", "d"),
        ("r1", "e"),
    ] {
        store.audit(request_audit(run, call)).await.unwrap();
    }
    let read = |query: AuditQuery| async move {
        store
            .audit_log(query)
            .await
            .unwrap()
            .iter()
            .map(|entry| entry.tool_call_id.as_ref().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let newest = read(AuditQuery {
        newest_first: true,
        limit: 2,
        ..Default::default()
    })
    .await;
    assert_eq!(newest, ["e", "d"]);
    let all = store
        .audit_log(AuditQuery {
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    let d = all
        .iter()
        .find(|entry| entry.tool_call_id == Some(call_id("d")))
        .unwrap()
        .id;
    let before = read(AuditQuery {
        newest_first: true,
        before_id: Some(d),
        run_id: Some(run_id("r1")),
        limit: 10,
        ..Default::default()
    })
    .await;
    assert_eq!(before, ["c", "a"]);
    let oldest = read(AuditQuery {
        limit: 2,
        ..Default::default()
    })
    .await;
    assert_eq!(oldest, ["a", "b"], "oldest first unless asked otherwise");
}

/// The `(run, call)` of each pending approval `of` lists, in its order.
async fn listed(store: &dyn Store, of: PendingOf<'_>) -> Vec<(String, String)> {
    let pending = store.pending(of).await.unwrap();
    pending
        .iter()
        .map(|request| (request.run_id.to_string(), request.tool_call_id.to_string()))
        .collect()
}

/// A session's listing holds the pending approvals of that session's runs and no other's, and none of a run whose
/// abort is recorded; a run's holds that run's.
async fn pending_approvals_are_listed_by_session_or_run(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    waiting_on_one_due_at_5000(
        store,
        &[
            ("r1", "alice", "a"),
            ("r2", "bob", "b"),
            ("r3", "carol", "c"),
        ],
    )
    .await;
    let pair = |run: &str, call: &str| (run.to_owned(), call.to_owned());
    assert_eq!(
        listed(store, PendingOf::Session(&session("alice"))).await,
        [pair("r1", "a")]
    );
    assert_eq!(
        listed(store, PendingOf::Session(&session("bob"))).await,
        [pair("r2", "b")]
    );
    assert_eq!(
        listed(store, PendingOf::Run(&run_id("r3"))).await,
        [pair("r3", "c")]
    );
    assert!(
        listed(store, PendingOf::Session(&session("dave")))
            .await
            .is_empty()
    );
    assert_eq!(listed(store, PendingOf::All).await.len(), 3);
    cancelled(store, "r2").await;
    assert!(
        listed(store, PendingOf::Session(&session("bob")))
            .await
            .is_empty()
    );
}

/// A logout is kept, and read back by a store opened anew (another instance, or after a restart), until a day after
/// its cookie expires anyway (for the instances whose clocks are behind); then the next logout takes it away, so
/// what is kept stays bounded by the logins of about a week.
async fn a_logout_is_kept_until_its_cookie_expires(kind: Kind) {
    let backend = open(kind).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    backend
        .store
        .log_out("login-a", now + 60_000)
        .await
        .unwrap();
    backend
        .store
        .log_out("login-a", now + 60_000)
        .await
        .unwrap();
    backend
        .store
        .log_out("login-expired-lately", now - 1)
        .await
        .unwrap();
    backend
        .store
        .log_out("login-expired", now - LOGOUT_KEPT_PAST_EXPIRY_MS - 1)
        .await
        .unwrap();
    assert!(backend.store.logged_out("login-a").await.unwrap());
    assert!(!backend.store.logged_out("login-b").await.unwrap());

    let backend = backend.reopened().await;
    assert!(backend.store.logged_out("login-a").await.unwrap());
    backend
        .store
        .log_out("login-b", now + 60_000)
        .await
        .unwrap();
    assert!(backend.store.logged_out("login-b").await.unwrap());
    assert!(
        !backend.store.logged_out("login-expired").await.unwrap(),
        "a logout a day past its cookie's expiry goes"
    );
    assert!(
        backend
            .store
            .logged_out("login-expired-lately")
            .await
            .unwrap(),
        "a logout whose cookie expired lately stays, for the clocks that are behind"
    );
    assert!(backend.store.logged_out("login-a").await.unwrap());
}

macro_rules! conformance {
    ($($test:ident),* $(,)?) => {
        mod memory {
            $(#[tokio::test] async fn $test() { super::$test(super::Kind::Memory).await })*
        }
        mod sqlite {
            $(#[tokio::test] async fn $test() { super::$test(super::Kind::Sqlite).await })*
        }
        mod postgres_store {
            $(#[tokio::test] async fn $test() { super::$test(super::Kind::Postgres).await })*
        }
    };
}

conformance!(
    a_run_id_is_taken_once_and_a_session_runs_one_run_at_a_time,
    appended_events_are_read_back_in_order_once_durable,
    a_page_of_large_events_holds_a_few_mib,
    a_reader_at_the_end_of_a_log_is_told_whether_more_may_come,
    a_runs_end_follows_the_events_it_queued,
    an_end_refused_for_a_claim_it_lacks_loses_no_events_queued_with_it,
    a_writer_that_lost_its_claim_appends_nothing,
    an_open_batch_is_stored_whole_with_its_events_and_audit,
    concurrent_decisions_have_exactly_one_winner,
    a_refused_decision_leaves_the_approval_pending,
    expiry_settles_only_what_is_due,
    a_call_runs_once_and_only_its_runner_settles_it,
    a_call_begun_inline_needs_the_runs_claim_and_an_earlier_batchs_call_of_its_id_gives_way,
    a_settled_batch_is_claimed_once,
    finishing_a_run_frees_its_session_and_leaves_nothing_pending,
    an_end_settles_the_calls_still_pending_in_the_order_they_were_asked,
    a_suspension_is_taken_once_and_a_replay_is_told_who_took_it,
    an_aborted_run_leaves_no_suspension,
    a_new_run_that_waits_for_no_interrupt_is_refused_while_its_session_waits_for_one,
    retention_forgets_old_runs_and_keeps_open_suspensions,
    retention_keeps_a_resumed_run_while_its_resume_goes_on,
    a_run_started_after_the_newest_was_pruned_has_a_log_of_its_own,
    a_run_reads_back_the_conversation_its_end_recorded,
    a_sessions_grants_are_its_own_and_outlive_the_process,
    a_decisions_grant_is_kept_with_it,
    an_approval_under_a_revoked_grant_is_refused,
    a_grant_is_kept_only_by_the_runs_holder,
    the_audit_log_keeps_each_text_to_its_bound,
    grants_rules_and_the_audit_log_are_kept_and_filtered,
    a_decision_and_a_claim_at_once_never_fail_on_locks,
    sessions_are_read_by_their_ids,
    pending_approvals_are_listed_by_session_or_run,
    the_audit_log_reads_newest_first_before_an_id,
    the_audit_log_reads_the_entries_of_some_sessions_or_of_none,
    a_logout_is_kept_until_its_cookie_expires,
);

// ---------------------------------------------------------------------------------------------------------------
// What only a durable store promises
// ---------------------------------------------------------------------------------------------------------------

/// The conformance tests that only a SQL store can take: each on SQLite and on PostgreSQL. On a multi-thread
/// runtime, because they change rows beside the store with a blocking `psql` from the test's own thread: a
/// transaction the store dropped is rolled back by a task of the runtime (sqlx's, as the connection goes back to its
/// pool), and until then its rows stay locked.
macro_rules! durable {
    ($($test:ident),* $(,)?) => {
        mod durable_sqlite {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() { super::$test(super::Kind::Sqlite).await })*
        }
        mod durable_postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() { super::$test(super::Kind::Postgres).await })*
        }
    };
}

durable!(
    a_batch_that_does_not_read_leaves_its_run_waiting_and_whole,
    a_due_approval_that_does_not_read_holds_up_no_other,
    an_expiry_that_fails_for_one_run_still_returns_the_others,
    an_abort_settles_what_reads_and_its_claim_ends_what_did_not,
    an_audit_entry_of_a_kind_this_version_does_not_know_is_shown_as_it_is,
    a_claim_settles_what_the_abort_left_where_it_reads,
    a_claim_settles_what_an_abort_of_a_newer_version_left,
);

/// A SQL store's database, read and changed beside the store: as a newer version of toolgate, or a damaged disk,
/// would leave its rows.
struct Beside<'a>(&'a DatabaseUrl);

impl Beside<'_> {
    fn of(backend: &Backend) -> Beside<'_> {
        Beside(backend.url.as_ref().expect("a SQL store"))
    }

    fn write(&self, sql: &str) {
        match self.0 {
            DatabaseUrl::Sqlite(path) => rusqlite::Connection::open(path)
                .unwrap()
                .execute_batch(sql)
                .unwrap(),
            DatabaseUrl::Postgres(url) => {
                postgres::psql(url, sql);
            }
        }
    }

    /// `text` as an SQL string literal.
    fn quoted(text: &str) -> String {
        format!("'{}'", text.replace('\'', "''"))
    }

    /// The one text value `sql` selects.
    fn read(&self, sql: &str) -> String {
        match self.0 {
            DatabaseUrl::Sqlite(path) => rusqlite::Connection::open(path)
                .unwrap()
                .query_row(sql, [], |row| row.get(0))
                .unwrap(),
            DatabaseUrl::Postgres(url) => postgres::psql(url, sql),
        }
    }
}

/// The claim of `run` is refused with [`StoreError::Corrupt`], saying `what` could not be read.
async fn claim_is_refused_as_unreadable(store: &dyn Store, run: &str, what: &str) {
    let refused = store.claim_batch(&run_id(run), left_by_abort()).await;
    assert!(
        matches!(&refused, Err(StoreError::Corrupt(why)) if why.contains(what)),
        "{:?}",
        refused.map(|claimed| claimed.map(|claimed| claimed.epoch))
    );
}

/// What no version of a call's record reads as.
const NOT_A_CALL: &str = "'{\"not\": \"a call\"}'";

/// A pending approval that this version cannot read (a row of a newer version's, or a damaged one) is left out of
/// the listing of approvals, and left pending when it is due, while the others are listed and time out as usual,
/// whichever run comes first; past the sweep, it is not due again.
async fn a_due_approval_that_does_not_read_holds_up_no_other(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    waiting_on_one_due_at_5000(store, &[("a", "s1", "ca"), ("b", "s2", "cb")]).await;
    let beside = Beside::of(&backend);
    beside.write(&format!(
        "UPDATE calls SET record = {NOT_A_CALL} WHERE call_id = 'ca'"
    ));

    let listed = store
        .pending(PendingOf::All)
        .await
        .expect("a row that does not read fails no one else's listing");
    let listed: Vec<&str> = listed
        .iter()
        .map(|approval| approval.tool_call_id.as_str())
        .collect();
    assert_eq!(listed, ["cb"], "left out of the listing");

    let settle: SettleExpired = Box::new(|record| deny(record, DenialSource::Timeout));
    let expired = store
        .expire(5_000, settle)
        .await
        .expect("a row that does not read fails no one else's expiry");
    let expired: Vec<&str> = expired
        .iter()
        .map(|record| record.call.id.as_str())
        .collect();
    assert_eq!(expired, ["cb"]);
    assert_eq!(
        beside.read("SELECT status FROM calls WHERE call_id = 'ca'"),
        "pending"
    );
    assert_eq!(store.next_expiry(0).await.unwrap(), Some(5_000));
    assert_eq!(
        store.next_expiry(5_000).await.unwrap(),
        None,
        "nothing else is pending"
    );
}

/// A run whose expiry cannot be written (here a trigger refuses its update; in life a lock timeout, a failover) is
/// left due for the next sweep, and the sweep still settles and returns the other runs' approvals: each was
/// committed, and its run is advanced by what the sweep returns.
async fn an_expiry_that_fails_for_one_run_still_returns_the_others(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    waiting_on_one_due_at_5000(
        store,
        &[("a", "s1", "ca"), ("b", "s2", "cb"), ("c", "s3", "cc")],
    )
    .await;
    let beside = Beside::of(&backend);
    beside.write(match beside.0 {
        DatabaseUrl::Sqlite(_) => {
            "CREATE TRIGGER refuse_b BEFORE UPDATE ON calls WHEN NEW.run_id = 'b' \
             BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;"
        }
        DatabaseUrl::Postgres(_) => {
            "CREATE FUNCTION refuse_b() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$ \
             LANGUAGE plpgsql; \
             CREATE TRIGGER refuse_b BEFORE UPDATE ON calls FOR EACH ROW WHEN (NEW.run_id = 'b') \
             EXECUTE FUNCTION refuse_b();"
        }
    });

    let settle = || -> SettleExpired { Box::new(|record| deny(record, DenialSource::Timeout)) };
    let expired = store
        .expire(5_000, settle())
        .await
        .expect("one run's failure fails no other's expiry");
    let ids = |records: &[CallRecord]| -> Vec<String> {
        records
            .iter()
            .map(|r| r.call.id.as_str().to_owned())
            .collect()
    };
    assert_eq!(ids(&expired), ["ca", "cc"]);
    assert_eq!(
        beside.read("SELECT status FROM calls WHERE call_id = 'cb'"),
        "pending"
    );
    assert_eq!(
        store.next_expiry(0).await.unwrap(),
        Some(5_000),
        "b is still due"
    );

    beside.write(match beside.0 {
        DatabaseUrl::Sqlite(_) => "DROP TRIGGER refuse_b",
        DatabaseUrl::Postgres(_) => "DROP TRIGGER refuse_b ON calls",
    });
    let expired = store.expire(5_000, settle()).await.unwrap();
    assert_eq!(ids(&expired), ["cb"], "the next sweep takes it");
}

/// An abort settles the calls it can read and leaves one it cannot as it was (it used to fail, so that the run
/// could not be cancelled), and it reads no call it has nothing to settle in. What it left is neither decided nor
/// begun afterwards, even where it reads (an instance of a newer version). Recovery passes over a running call it
/// cannot read. The run's claim waits for what still runs, then, where the call the abort left does not read either,
/// ends the run as one that does not read, naming that call.
async fn an_abort_settles_what_reads_and_its_claim_ends_what_did_not(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    open_waiting(store, "r", &[("a", u64::MAX), ("b", u64::MAX)], &["x", "y"]).await;
    let beside = Beside::of(&backend);
    let record = |call: &str| {
        beside.read(&format!(
            "SELECT record FROM calls WHERE call_id = '{call}'"
        ))
    };
    let (b, y) = (record("b"), record("y"));
    beside.write(&format!(
        "UPDATE calls SET record = {NOT_A_CALL} WHERE call_id IN ('b', 'x', 'y'); \
         UPDATE calls SET status = 'executing', executing_on = 'elsewhere' WHERE call_id = 'x'"
    ));

    let aborted = cancelled(store, "r").await;
    assert_eq!(aborted.run.abort, Some(AbortReason::Cancelled));
    assert_eq!(aborted.executing.len(), 1, "x still runs");
    let status = |call: &str| {
        beside.read(&format!(
            "SELECT status FROM calls WHERE call_id = '{call}'"
        ))
    };
    assert_eq!(
        [status("a"), status("b"), status("x"), status("y")],
        ["denied", "pending", "executing", "allowed"]
    );

    for (call, text) in [("b", &b), ("y", &y)] {
        beside.write(&format!(
            "UPDATE calls SET record = {} WHERE call_id = '{call}'",
            Beside::quoted(text)
        ));
    }
    let decided = store
        .decide(&run_id("r"), &call_id("b"), Box::new(|r| Ok(approve(r))))
        .await
        .unwrap();
    assert_eq!(decided, Err(DecideFailure::NotPending), "b is not decided");
    assert!(
        store
            .begin_call(&run_id("r"), &call_id("y"), None)
            .await
            .unwrap()
            .is_none(),
        "y is not begun"
    );

    store
        .recover(recovery_events())
        .await
        .expect("recovery is not refused for a running call it cannot read");
    assert_eq!(
        status("x"),
        "executing",
        "left for an instance that can read it"
    );
    // With y gone by (its row settled beside the store), the run has no call to run and a call pending: only its
    // abort makes it one to look at again.
    beside.write("UPDATE calls SET status = 'settled' WHERE call_id = 'y'");
    assert!(
        store.stalled_runs().await.unwrap().contains(&run_id("r")),
        "a waiting run once aborted is looked at again, after a restart too"
    );
    assert!(
        store
            .claim_batch(&run_id("r"), left_by_abort())
            .await
            .unwrap()
            .is_none(),
        "a call still runs"
    );
    beside.write(&format!(
        "UPDATE calls SET status = 'settled', executing_on = NULL WHERE call_id = 'x'; \
         UPDATE calls SET record = {NOT_A_CALL} WHERE call_id = 'b'"
    ));
    claim_is_refused_as_unreadable(store, "r", "call b was left unsettled").await;
    assert_eq!(
        beside.read("SELECT state FROM runs WHERE id = 'r'"),
        "waiting",
        "the claim took nothing"
    );
}

#[tokio::test]
async fn a_second_process_on_a_sqlite_file_is_refused_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let url = DatabaseUrl::Sqlite(dir.path().join("toolgate.db"));
    let first = SqlStore::open(&url).await.unwrap();
    let error = SqlStore::open(&url).await.unwrap_err();
    assert!(matches!(error, OpenError::Locked { .. }), "{error}");
    let message = error.to_string();
    assert!(
        message.contains("another toolgate process is using the database"),
        "{message}"
    );
    assert!(
        message.contains(&format!("by process {}", std::process::id())),
        "{message}"
    );
    drop(first);
    SqlStore::open(&url)
        .await
        .expect("free again once the first is gone");
}

#[tokio::test]
async fn a_second_process_on_a_symlink_to_the_sqlite_file_is_refused_too() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("a")).unwrap();
    std::fs::create_dir(dir.path().join("b")).unwrap();
    let real = dir.path().join("a/toolgate.db");
    let first = SqlStore::open(&DatabaseUrl::Sqlite(real.clone()))
        .await
        .unwrap();
    let link = dir.path().join("b/toolgate.db");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let error = SqlStore::open(&DatabaseUrl::Sqlite(link))
        .await
        .expect_err("the same file under another name");
    assert!(matches!(error, OpenError::Locked { .. }), "{error}");
    drop(first);
}

#[tokio::test]
async fn a_child_process_never_holds_the_sqlite_files_lock() {
    let dir = tempfile::tempdir().unwrap();
    let url = DatabaseUrl::Sqlite(dir.path().join("toolgate.db"));
    let first = SqlStore::open(&url).await.unwrap();
    // A child between its fork and its exec (here it stays there) has a copy of every descriptor of the parent,
    // as children of other tests, of tools and of MCP servers do for a moment.
    // SAFETY: the child only sleeps and exits, both async-signal-safe.
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork failed");
    if child == 0 {
        unsafe {
            libc::sleep(30);
            libc::_exit(0);
        }
    }
    drop(first);
    let reopened = SqlStore::open(&url).await;
    // SAFETY: `child` is this process's child.
    unsafe {
        libc::kill(child, libc::SIGKILL);
        libc::waitpid(child, std::ptr::null_mut(), 0);
    }
    reopened.expect("the lock went with the store, whatever children this process has");
}

/// How the tests' recovery words what it records: a failed run's event is step 77, or 78 when it gave the interrupts
/// it took back.
fn recovery_events() -> RecoveryEvents {
    RecoveryEvents {
        run_failed: Box::new(|info, taken| {
            let step = match taken {
                InterruptsTaken::Kept => 77,
                InterruptsTaken::GivenBack => 78,
            };
            vec![step_event(info.run_id.as_str(), step)]
        }),
        call_interrupted: Box::new(|record| Settlement {
            status: CallStatus::Interrupted,
            output: Some(ToolOutput::error(ToolErrorCode::ToolFailed, "interrupted")),
            ..deny(record, DenialSource::Abort)
        }),
        history: Box::new(|view| {
            if view.approval_mode == ApprovalMode::Interrupt {
                Vec::new()
            } else {
                view.messages(|_| None)
            }
        }),
    }
}

/// A run whose process died while it was sampling leaves its session what it was asked and did, as its end would
/// have: the next run's model reads the person's message and the calls. Before, the recovery ended it with none of
/// it, and the session's next run knew nothing of what was asked or done.
#[tokio::test]
async fn a_run_whose_process_died_leaves_its_session_what_it_was_asked_and_did() {
    let dir = tempfile::tempdir().unwrap();
    let url = DatabaseUrl::Sqlite(dir.path().join("toolgate.db"));
    {
        let store = SqlStore::open(&url).await.unwrap();
        let logged = [
            StreamEvent::RunStarted {
                run_id: run_id("r"),
                session_id: session("s"),
                message: "delete a.txt".into(),
                policy: agent::wire::ApprovalPolicy::OnRequest,
                approval_mode: ApprovalMode::Interactive,
                parent_run_id: None,
            },
            StreamEvent::Step {
                run_id: run_id("r"),
                step: 1,
            },
            StreamEvent::ToolCall {
                run_id: run_id("r"),
                step: 1,
                tool_call_id: call_id("c"),
                tool_name: "delete_file".into(),
                arguments: json!({"path": "a.txt"}),
                permission: agent::wire::PermissionDecision::Ask {
                    reason: "destructive".into(),
                },
            },
        ];
        let run = NewRun {
            message: "delete a.txt".into(),
            events: logged
                .iter()
                .map(|event| NewEvent::encode(event).unwrap())
                .collect(),
            ..new_run("r", "s")
        };
        store.start_run(run).await.unwrap().unwrap();
        store.flush().await.unwrap();
        // The process dies here: nothing more is written.
    }
    let store = SqlStore::open(&url).await.unwrap();
    let recovered = store.recover(recovery_events()).await.unwrap();
    assert_eq!(recovered.failed_runs, [run_id("r")]);
    let history = store.history(&session("s")).await.unwrap();
    assert_eq!(history.len(), 3, "{history:?}");
    assert_eq!(
        history[0],
        Message::User {
            content: "delete a.txt".into()
        }
    );
    assert!(
        matches!(&history[1], Message::Assistant { tool_calls, .. } if tool_calls[0].id == call_id("c")),
        "{history:?}"
    );
    assert!(
        matches!(&history[2], Message::Tool { tool_call_id, output: ToolOutput::Error { .. }, .. } if tool_call_id == &call_id("c")),
        "{history:?}"
    );
}

/// A resume's run whose process died before it began any of the calls it resumed gives the interrupts it took back:
/// the person's answers were not acted on, and the next resume answers them again. Before, the resume was refused
/// as used, nothing had run, and the answers were lost. One that had begun a call, or made a session grant of an
/// answer, keeps them: its answers were acted on; so does one that was cancelled, or whose interrupts expired.
#[tokio::test]
async fn a_resume_whose_process_died_before_its_calls_gives_its_interrupts_back() {
    let dir = tempfile::tempdir().unwrap();
    let url = DatabaseUrl::Sqlite(dir.path().join("toolgate.db"));
    let resume = |run: &str, parent: &str, session_id: &str| NewRun {
        parent_run_id: Some(run_id(parent)),
        message: String::new(),
        ..new_run(run, session_id)
    };
    {
        let store = SqlStore::open(&url).await.unwrap();
        let in_an_hour = agent::clock::now_ms() + 3_600_000;
        for (parent, child, thread, expires_at) in [
            ("p1", "c1", "t1", in_an_hour),
            ("p2", "c2", "t2", in_an_hour),
            ("p3", "c3", "t3", in_an_hour),
            ("p4", "c4", "t4", in_an_hour),
            ("p5", "c5", "t5", 1),
            ("p6", "c6", "t6", in_an_hour),
        ] {
            store
                .start_run(new_run(parent, thread))
                .await
                .unwrap()
                .unwrap();
            store
                .finish_run(interrupted(&suspension_of(parent, thread, expires_at)))
                .await
                .unwrap()
                .unwrap();
            store
                .start_run(resume(child, parent, thread))
                .await
                .unwrap()
                .expect("the resume takes the interrupts");
        }
        // c2 began the call it resumed; c1 had not when the process died.
        let record = CallRecord::new(
            run_id("c2"),
            tool_call("c"),
            json!({"path": "c"}),
            CallStatus::Approved,
        );
        store
            .begin_call(&run_id("c2"), &call_id("c"), Some((record, 1)))
            .await
            .unwrap()
            .expect("c2 begins its call");
        // c3 made a session grant of an answer; c4 was cancelled; c5's interrupts expired.
        store
            .add_grant(
                &run_id("c3"),
                1,
                StoredGrant {
                    id: "g3".into(),
                    grant: json!({"runId": "c3", "tool": "delete_file"}),
                    created_at: 1,
                },
            )
            .await
            .unwrap()
            .unwrap();
        cancelled(&*store, "c4").await;
        store.flush().await.unwrap();
        // The process dies here: nothing more is written.
    }
    // p6's suspension no longer reads (a damaged disk, a newer version's text): the recovery goes on all the same.
    rusqlite::Connection::open(dir.path().join("toolgate.db"))
        .unwrap()
        .execute(
            "UPDATE runs SET suspension = 'not json' WHERE id = 'p6'",
            [],
        )
        .unwrap();
    let store = SqlStore::open(&url).await.unwrap();
    let recovered = store.recover(recovery_events()).await.unwrap();
    let mut failed = recovered.failed_runs.clone();
    failed.sort();
    assert_eq!(
        failed,
        ["c1", "c2", "c3", "c4", "c5", "c6"].map(run_id).to_vec()
    );
    let unlisted: Vec<_> = audit_of(&*store, "p6")
        .await
        .into_iter()
        .filter(|entry| entry.outcome == "reopened")
        .collect();
    assert_eq!(unlisted.len(), 1);
    assert!(
        unlisted[0]
            .reason
            .as_deref()
            .unwrap_or_default()
            .contains("could not be listed"),
        "{unlisted:?}"
    );
    assert_eq!(steps(&*store, "c1").await.last().unwrap().1, 78);
    assert_eq!(
        store.interrupt(&run_id("p1")).await.unwrap().unwrap().1,
        None
    );
    for (parent, child) in [("p2", "c2"), ("p3", "c3"), ("p4", "c4"), ("p5", "c5")] {
        assert_eq!(steps(&*store, child).await.last().unwrap().1, 77, "{child}");
        assert_eq!(
            store.interrupt(&run_id(parent)).await.unwrap().unwrap().1,
            Some(run_id(child)),
            "{child} keeps what it took"
        );
    }
    let reopened: Vec<_> = audit_of(&*store, "p1")
        .await
        .into_iter()
        .filter(|entry| entry.outcome == "reopened")
        .collect();
    assert_eq!(reopened.len(), 1);
    assert_eq!(reopened[0].kind, AuditKind::ApprovalRequested);
    assert_eq!(reopened[0].tool_call_id, Some(call_id("c")));
    assert_eq!(reopened[0].session_id, Some(session("t1")));
    assert!(
        audit_of(&*store, "p2")
            .await
            .iter()
            .all(|entry| entry.outcome != "reopened")
    );
    // The next resume of p1 takes its interrupts; p2's stay used.
    store
        .start_run(resume("c1-again", "p1", "t1"))
        .await
        .unwrap()
        .expect("the interrupts given back are taken again");
    assert!(matches!(
        store
            .start_run(resume("c2-again", "p2", "t2"))
            .await
            .unwrap(),
        Err(StartConflict::Resume(TakeError::AlreadyUsed { .. }))
    ));
}

/// A parent run `parent` of thread `thread` interrupted on one call per answer (`id`, approved, scope), and its
/// resume `child`, whose start took the interrupts and recorded the answers, as a resume's start does.
async fn a_resume_with_answers(
    store: &dyn Store,
    parent: &str,
    child: &str,
    thread: &str,
    answers: &[(&str, bool, DecisionScope)],
) {
    let mut suspension = suspension_of(parent, thread, agent::clock::now_ms() + 3_600_000);
    let (pending, interrupt) = (
        suspension.interruption.pending[0].clone(),
        suspension.interrupts[0].clone(),
    );
    suspension.interruption.calls.clear();
    suspension.interruption.pending.clear();
    suspension.interrupts.clear();
    for &(id, _, _) in answers {
        suspension.interruption.calls.push(tool_call(id));
        suspension.interruption.pending.push(PendingCall {
            call: tool_call(id),
            input: json!({"path": id}),
            ..pending.clone()
        });
        suspension.interrupts.push(IssuedInterrupt {
            request: InterruptRequest {
                id: format!("int-{id}"),
                tool_call_id: call_id(id),
                arguments: json!({"path": id}),
                ..interrupt.request.clone()
            },
            digest: arguments_digest(&json!({"path": id})),
        });
    }
    store
        .start_run(new_run(parent, thread))
        .await
        .unwrap()
        .unwrap();
    store
        .finish_run(interrupted(&suspension))
        .await
        .unwrap()
        .unwrap();
    let audit = answers
        .iter()
        .map(|&(id, approved, scope)| {
            let resolution = if approved {
                Resolution::Approved {
                    source: ApprovalSource::User,
                    scope,
                    reason: None,
                    edited_arguments: None,
                }
            } else {
                Resolution::Denied {
                    source: DenialSource::User,
                    reason: "not that one".into(),
                }
            };
            let record = CallRecord::new(
                run_id(parent),
                tool_call(id),
                json!({"path": id}),
                CallStatus::Pending,
            );
            agent::approvals::resolution_audit(&record, &resolution, Some("person"))
        })
        .collect();
    store
        .start_run(NewRun {
            parent_run_id: Some(run_id(parent)),
            message: String::new(),
            audit,
            ..new_run(child, thread)
        })
        .await
        .unwrap()
        .expect("the resume takes the interrupts");
}

/// The `not_run` lines of the audit log about `run`.
async fn not_run_lines(store: &dyn Store, run: &str) -> Vec<AuditEntry> {
    audit_of(store, run)
        .await
        .into_iter()
        .filter(|entry| entry.outcome == "not_run")
        .collect()
}

/// A resume's run whose process died after it acted on its answers (it made a session grant of one and began one
/// call) keeps the interrupts it took, and the audit log says that the call it approved and never began did not run.
/// Before, the log held that call's approval and nothing after it. The call it began has the recovery's
/// `interrupted` line instead, the call it denied needs none, and the call its abort stopped before it began has its
/// line already (and no second one).
#[tokio::test]
async fn a_resume_that_keeps_its_interrupts_says_which_approved_calls_never_ran() {
    let dir = tempfile::tempdir().unwrap();
    let url = DatabaseUrl::Sqlite(dir.path().join("toolgate.db"));
    {
        let store = SqlStore::open(&url).await.unwrap();
        a_resume_with_answers(
            &*store,
            "p",
            "c",
            "t",
            &[
                ("a", true, DecisionScope::Session),
                ("b", true, DecisionScope::Once),
                ("d", false, DecisionScope::Once),
                ("e", true, DecisionScope::Once),
            ],
        )
        .await;
        store
            .add_grant(
                &run_id("c"),
                1,
                StoredGrant {
                    id: "g".into(),
                    grant: json!({"runId": "c", "tool": "delete_file"}),
                    created_at: 1,
                },
            )
            .await
            .unwrap()
            .unwrap();
        let record = CallRecord::new(
            run_id("c"),
            tool_call("a"),
            json!({"path": "a"}),
            CallStatus::Approved,
        );
        store
            .begin_call(&run_id("c"), &call_id("a"), Some((record, 1)))
            .await
            .unwrap()
            .expect("the resume begins a");
        // e's turn came after an abort, which said so, as a run's task says of a call its abort stopped.
        let stopped = CallRecord::new(
            run_id("c"),
            tool_call("e"),
            json!({"path": "e"}),
            CallStatus::Approved,
        );
        store
            .audit(agent::approvals::not_run_entry(
                &stopped,
                "abort",
                "The run was cancelled.",
            ))
            .await
            .unwrap();
        store.flush().await.unwrap();
        // The process dies here, before b begins.
    }
    let store = SqlStore::open(&url).await.unwrap();
    let recovered = store.recover(recovery_events()).await.unwrap();
    assert_eq!(recovered.failed_runs, [run_id("c")]);
    assert_eq!(
        store.interrupt(&run_id("p")).await.unwrap().unwrap().1,
        Some(run_id("c")),
        "the resume keeps what it took"
    );
    let not_run = not_run_lines(&*store, "p").await;
    assert_eq!(not_run.len(), 1, "{not_run:?}");
    let line = &not_run[0];
    assert_eq!(line.kind, AuditKind::CallRefused);
    assert_eq!(line.tool_call_id, Some(call_id("b")));
    assert_eq!(line.session_id, Some(session("t")));
    assert_eq!(
        line.arguments_digest.as_deref(),
        Some(arguments_digest(&json!({"path": "b"})).as_str())
    );
    assert_eq!(line.source.as_deref(), Some("restart"));
    assert_eq!(
        not_run_lines(&*store, "c").await.len(),
        1,
        "e has the abort's line only"
    );
}

/// A resume's run that failed after it acted on its answers (its database failed it as a call was to begin), ended by
/// its own task or by the look for runs no task works on, says too that the call it approved and never began did not
/// run. One that ended otherwise began every call it approved, and has no such line.
#[tokio::test]
async fn a_resume_that_failed_before_a_call_it_approved_says_the_call_never_ran() {
    let dir = tempfile::tempdir().unwrap();
    let url = DatabaseUrl::Sqlite(dir.path().join("toolgate.db"));
    let store = SqlStore::open(&url).await.unwrap();
    for (parent, child, thread) in [("p1", "c1", "t1"), ("p2", "c2", "t2")] {
        a_resume_with_answers(
            &*store,
            parent,
            child,
            thread,
            &[
                ("a", true, DecisionScope::Session),
                ("b", true, DecisionScope::Once),
            ],
        )
        .await;
        let record = CallRecord::new(
            run_id(child),
            tool_call("a"),
            json!({"path": "a"}),
            CallStatus::Approved,
        );
        store
            .begin_call(&run_id(child), &call_id("a"), Some((record, 1)))
            .await
            .unwrap()
            .expect("the resume begins a");
    }
    store
        .finish_run(FinishRun {
            state: RunState::Failed,
            ..done("c1", vec![], vec![])
        })
        .await
        .unwrap()
        .unwrap();
    let not_run = not_run_lines(&*store, "p1").await;
    assert_eq!(not_run.len(), 1, "{not_run:?}");
    assert_eq!(not_run[0].tool_call_id, Some(call_id("b")));
    assert_eq!(not_run[0].source.as_deref(), Some("failure"));

    store
        .finish_run(done("c2", vec![], vec![]))
        .await
        .unwrap()
        .unwrap();
    assert!(not_run_lines(&*store, "p2").await.is_empty());
}

/// A flush that waited while the appender gave events up is told so, even when the give-up left nothing queued: a
/// graceful shutdown must not say all is written when events are lost. Before, the give-up marked everything queued
/// as written, and the flush that waited answered `Ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_is_told_when_the_events_it_waited_for_were_given_up() {
    let dir = tempfile::tempdir().unwrap();
    let url = DatabaseUrl::Sqlite(dir.path().join("toolgate.db"));
    let store = SqlStore::open(&url).await.unwrap();
    let epoch = store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    let beside = rusqlite::Connection::open(dir.path().join("toolgate.db")).unwrap();
    beside
        .execute_batch(
            "CREATE TRIGGER refuse_steps BEFORE INSERT ON events WHEN NEW.kind = 'step' \
             BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;",
        )
        .unwrap();
    store.append(&run_id("r"), epoch, vec![step_event("r", 2)]);
    // Given up after 3.1 s of retries.
    let flushed = tokio::time::timeout(std::time::Duration::from_secs(20), store.flush())
        .await
        .expect("the flush ends");
    assert!(flushed.is_err(), "{flushed:?}");
    assert_eq!(
        kinds(&*store, "r").await,
        vec![1],
        "the step is not in the log"
    );
}

/// A running run this version cannot read (written by a newer one, or damaged) is left as it is by the recovery at
/// start, which recovers the others: before, it failed the start, and the server did not come up until the row was
/// mended by hand.
#[tokio::test]
async fn a_running_run_that_does_not_read_is_left_and_the_others_are_recovered() {
    let dir = tempfile::tempdir().unwrap();
    let url = DatabaseUrl::Sqlite(dir.path().join("toolgate.db"));
    {
        let store = SqlStore::open(&url).await.unwrap();
        for (run, session) in [("unknown", "s1"), ("sampling", "s2")] {
            store
                .start_run(new_run(run, session))
                .await
                .unwrap()
                .unwrap();
        }
        store.flush().await.unwrap();
    }
    let beside = rusqlite::Connection::open(dir.path().join("toolgate.db")).unwrap();
    beside
        .execute(
            "UPDATE runs SET mode = 'of a newer version' WHERE id = 'unknown'",
            [],
        )
        .unwrap();
    let store = SqlStore::open(&url).await.unwrap();
    let recovered = store.recover(recovery_events()).await.unwrap();
    assert_eq!(recovered.failed_runs, vec![run_id("sampling")]);
    let left: String = beside
        .query_row("SELECT state FROM runs WHERE id = 'unknown'", [], |row| {
            row.get(0)
        })
        .unwrap();
    assert_eq!(left, "running");
}

#[tokio::test]
async fn what_a_sqlite_store_holds_survives_the_process_and_recovery_marks_what_it_was_doing() {
    let dir = tempfile::tempdir().unwrap();
    let url = DatabaseUrl::Sqlite(dir.path().join("toolgate.db"));
    {
        let store = SqlStore::open(&url).await.unwrap();
        store
            .start_run(new_run("sampling", "s1"))
            .await
            .unwrap()
            .unwrap();
        store
            .start_run(new_run("waiting", "s2"))
            .await
            .unwrap()
            .unwrap();
        open_waiting(&*store, "waiting", &[("asked", u64::MAX)], &["running"]).await;
        store
            .begin_call(&run_id("waiting"), &call_id("running"), None)
            .await
            .unwrap()
            .unwrap();
        store.flush().await.unwrap();
        // The process dies here: nothing more is written.
    }
    let store = SqlStore::open(&url).await.unwrap();
    let recovered = store.recover(recovery_events()).await.unwrap();
    assert_eq!(recovered.failed_runs, vec![run_id("sampling")]);
    assert_eq!(
        recovered.interrupted_calls,
        vec![(run_id("waiting"), call_id("running"))]
    );
    let sampling = store.run(&run_id("sampling")).await.unwrap().unwrap();
    assert_eq!(sampling.state, RunState::Failed);
    assert!(
        !store
            .continues_after(&run_id("sampling"), sampling.last_seq)
            .await
            .unwrap()
    );
    let waiting = store.run(&run_id("waiting")).await.unwrap().unwrap();
    assert!(
        store
            .continues_after(&run_id("waiting"), waiting.last_seq)
            .await
            .unwrap(),
        "a run started before the restart is read from its row: still waiting"
    );
    let pending = store.pending(PendingOf::All).await.unwrap();
    assert_eq!(
        pending.len(),
        1,
        "the approval still waits, with its expiry"
    );
    assert_eq!(pending[0].tool_call_id, call_id("asked"));
    assert_eq!(
        pending[0].preview,
        Some(deletion_preview("asked")),
        "the card shows the same preview after the restart"
    );
    let running = store
        .call(&run_id("waiting"), &call_id("running"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(running.status, CallStatus::Interrupted);
    assert!(
        store
            .begin_call(&run_id("waiting"), &call_id("running"), None)
            .await
            .unwrap()
            .is_none(),
        "an interrupted call never runs again"
    );
}

/// Run `r` waits on a batch of one allowed call, `free`, which the store began and whose result it was given.
async fn settle_the_free_call_of_a_waiting_run(store: &dyn Store) {
    store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    open_waiting(store, "r", &[], &["free"]).await;
    store
        .begin_call(&run_id("r"), &call_id("free"), None)
        .await
        .unwrap()
        .unwrap();
    let result = CallResult {
        run_id: run_id("r"),
        call_id: call_id("free"),
        output: ToolOutput::Ok {
            content: json!("done"),
        },
        events: vec![step_event("r", 50)],
        audit: vec![],
    };
    assert!(store.settle_call(result).await.unwrap());
}

/// On SQLite a call's result waits for the next commit (the run's next change takes it along). A process that dies
/// before that commit leaves the call as a crash while it ran leaves it: interrupted, effect unknown, never run
/// again; never executing.
#[tokio::test]
async fn a_result_the_process_had_not_written_when_it_died_leaves_the_call_interrupted() {
    let dir = tempfile::tempdir().unwrap();
    let url = DatabaseUrl::Sqlite(dir.path().join("toolgate.db"));
    {
        let store = SqlStore::open(&url).await.unwrap();
        settle_the_free_call_of_a_waiting_run(&*store).await;
        // The process dies here, the result maybe still queued.
    }
    let store = SqlStore::open(&url).await.unwrap();
    store.recover(recovery_events()).await.unwrap();
    let call = store
        .call(&run_id("r"), &call_id("free"))
        .await
        .unwrap()
        .unwrap();
    // This test's runtime has one thread, and nothing gave the appender a turn before the store went.
    assert_eq!(call.status, CallStatus::Interrupted);
    assert!(
        !call.output.unwrap().is_ok(),
        "its output says it was interrupted"
    );
    assert_eq!(
        store.stalled_runs().await.unwrap(),
        vec![run_id("r")],
        "its batch is settled: the restarted server claims it and samples on"
    );
}

/// On SQLite a call's result rides in the run's next commit; the claim of its settled batch is that commit here,
/// and finds the call settled with its output, its events in the run's log before the claim returns.
#[tokio::test]
async fn the_claim_of_a_batch_takes_a_calls_result_still_queued_along() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqlStore::open(&DatabaseUrl::Sqlite(dir.path().join("toolgate.db")))
        .await
        .unwrap();
    settle_the_free_call_of_a_waiting_run(&*store).await;
    let claimed = store
        .claim_batch(&run_id("r"), left_by_abort())
        .await
        .unwrap()
        .expect("the batch is settled");
    assert_eq!(claimed.outputs.len(), 1);
    assert!(claimed.outputs[0].1.is_ok());
    let log = store.events_after(&run_id("r"), 0, 100).await.unwrap();
    assert!(
        log.last()
            .is_some_and(|event| event.json.contains("\"step\":50")),
        "the result's events are in the run's log"
    );
    assert_eq!(
        log.last().map(|event| event.seq),
        Some(claimed.run.last_seq),
        "and counted in the run the claim returns"
    );
}

/// A batch's calls begin at once, each in a transaction of its own (on PostgreSQL, each on a connection of its own):
/// each must come after every other call of the run, so two that waited for the run's row together must not both
/// take the place after the same last call. Here another connection holds the run's row until both wait for it.
#[tokio::test]
async fn calls_begun_inline_at_once_on_postgresql_take_places_one_after_the_other() {
    use sqlx::{Connection, Executor};
    let url = postgres::database();
    let store = SqlStore::open(&DatabaseUrl::Postgres(url.clone()))
        .await
        .unwrap();
    store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    let mut holder = sqlx::PgConnection::connect(&url).await.unwrap();
    holder.execute("BEGIN").await.unwrap();
    holder
        .execute("SELECT 1 FROM runs WHERE id = 'r' FOR UPDATE")
        .await
        .unwrap();
    let begin = |id: &'static str| {
        let store = Arc::clone(&store);
        tokio::spawn(async move { begin_inline(&*store, "r", id, 1).await })
    };
    let (a, b) = (begin("a"), begin("b"));
    let mut watcher = sqlx::PgConnection::connect(&url).await.unwrap();
    until_waiting_for_locks(
        &mut watcher,
        2,
        "the two starts never both waited for the run's row",
    )
    .await;
    holder.execute("COMMIT").await.unwrap();
    for begun in [a, b] {
        let begun = tokio::time::timeout(std::time::Duration::from_secs(10), begun)
            .await
            .expect("a call's start still waits once the run's row was let go")
            .unwrap();
        assert!(begun.is_some(), "both begin");
    }
    let places: Vec<i64> =
        sqlx::query_scalar("SELECT idx FROM calls WHERE run_id = 'r' ORDER BY idx")
            .fetch_all(&mut watcher)
            .await
            .unwrap();
    assert_eq!(places, [0, 1], "each after the other");
}

/// Waits until `count` sessions of the test's database wait for a lock.
async fn until_waiting_for_locks(watcher: &mut sqlx::PgConnection, count: i64, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock'",
        )
        .fetch_one(&mut *watcher)
        .await
        .unwrap();
        if waiting >= count {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// A recovery on PostgreSQL that waits for the row of run `r`, whose instance (`gone`) it found dead, while another
/// connection holds the row in a transaction not yet committed.
struct HeldRecovery {
    url: String,
    /// The instance the hold takes the run over for, if it does.
    taker: Option<Arc<SqlStore>>,
    holder: sqlx::PgConnection,
    recovery: tokio::task::JoinHandle<Recovered>,
}

impl HeldRecovery {
    /// With `take_over`, the hold takes the run over for another live instance at epoch 2 (committed once let go);
    /// without, it only locks the run's row.
    async fn start(take_over: bool) -> Self {
        use sqlx::{Connection, Executor};
        let url = postgres::database();
        let recovering = SqlStore::open(&DatabaseUrl::Postgres(url.clone()))
            .await
            .unwrap();
        let taker = if take_over {
            Some(
                SqlStore::open(&DatabaseUrl::Postgres(url.clone()))
                    .await
                    .unwrap(),
            )
        } else {
            None
        };
        recovering
            .start_run(new_run("r", "s"))
            .await
            .unwrap()
            .unwrap();
        let mut holder = sqlx::PgConnection::connect(&url).await.unwrap();
        holder
            .execute(
                "INSERT INTO instances (id, started_at, heartbeat_at) VALUES ('gone', 0, 0); \
                 UPDATE runs SET owner = 'gone' WHERE id = 'r'",
            )
            .await
            .unwrap();
        holder.execute("BEGIN").await.unwrap();
        match &taker {
            Some(taker) => sqlx::query("UPDATE runs SET owner = $1, epoch = 2 WHERE id = 'r'")
                .bind(taker.instance().as_str())
                .execute(&mut holder)
                .await
                .map(|_| ()),
            None => holder
                .execute("SELECT 1 FROM runs WHERE id = 'r' FOR UPDATE")
                .await
                .map(|_| ()),
        }
        .unwrap();
        let recovery = {
            let store = Arc::clone(&recovering);
            tokio::spawn(async move { store.recover(recovery_events()).await.unwrap() })
        };
        let mut watcher = sqlx::PgConnection::connect(&url).await.unwrap();
        until_waiting_for_locks(
            &mut watcher,
            1,
            "the recovery never waited for the run's row",
        )
        .await;
        Self {
            url,
            taker,
            holder,
            recovery,
        }
    }

    /// Commits the hold, and returns what the recovery did once it ends.
    async fn let_go(mut self) -> Recovered {
        use sqlx::Executor;
        self.holder.execute("COMMIT").await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(10), self.recovery)
            .await
            .expect("the recovery ends once the run is let go")
            .unwrap()
    }
}

/// A recovery reads which instances are live, takes over the work of the others, then forgets them. An instance that
/// started meanwhile (a rolling restart) was not in what it read, and keeps its row: without it, the new instance
/// takes itself for dead and begins no call. Here another connection holds the dead instance's run until the new
/// instance has started.
#[tokio::test]
async fn a_recovery_on_postgresql_forgets_no_instance_that_started_during_it() {
    let held = HeldRecovery::start(false).await;
    let url = held.url.clone();
    let started = SqlStore::open(&DatabaseUrl::Postgres(url.clone()))
        .await
        .unwrap();
    let recovered = held.let_go().await;
    assert_eq!(recovered.failed_runs, vec![run_id("r")]);

    let instances: Vec<String> = sqlx::query_scalar("SELECT id FROM instances ORDER BY id")
        .fetch_all(
            &mut <sqlx::PgConnection as sqlx::Connection>::connect(&url)
                .await
                .unwrap(),
        )
        .await
        .unwrap();
    assert!(
        instances.contains(&started.instance().as_str().to_owned()),
        "the instance that started during the recovery is still known: {instances:?}"
    );
    assert!(!instances.contains(&"gone".to_owned()), "{instances:?}");
    // And it begins calls: its runs are its own.
    started
        .start_run(new_run("next", "s2"))
        .await
        .unwrap()
        .unwrap();
    assert!(begin_inline(&*started, "next", "c", 1).await.is_some());
}

/// A recovery ends a dead instance's run only as that instance left it: one that another instance took over after
/// the recovery found its owner dead (here while the recovery waits for the run's row) goes on.
#[tokio::test]
async fn a_recovery_on_postgresql_leaves_a_run_taken_over_meanwhile() {
    let held = HeldRecovery::start(true).await;
    let taker = held.taker.clone().expect("a taker");
    let recovered = held.let_go().await;
    assert!(
        recovered.failed_runs.is_empty(),
        "{:?}",
        recovered.failed_runs
    );
    let run = taker.run(&run_id("r")).await.unwrap().unwrap();
    assert_eq!(run.state, RunState::Running, "the new owner's run goes on");
}

/// A recovery fences a dead owner's run before it looks for the calls that owner runs. An owner whose heartbeat was
/// only late, and that begins a call while the recovery is under way (here while it waits for another run's row),
/// begins nothing: before the fence, the call ran and the run's end deleted it unrecorded.
#[tokio::test]
async fn a_call_a_late_owner_begins_during_a_recovery_is_refused() {
    use sqlx::{Connection, Executor};
    let url = postgres::database();
    let owner = SqlStore::open_with_lease(
        &DatabaseUrl::Postgres(url.clone()),
        std::time::Duration::from_secs(600),
    )
    .await
    .unwrap();
    let recovering = SqlStore::open(&DatabaseUrl::Postgres(url.clone()))
        .await
        .unwrap();
    owner.start_run(new_run("r", "s")).await.unwrap().unwrap();
    // A waiting run with a call running on a dead instance: the recovery waits for its row below.
    recovering
        .start_run(new_run("w", "sw"))
        .await
        .unwrap()
        .unwrap();
    open_waiting(&*recovering, "w", &[], &["running"]).await;
    recovering
        .begin_call(&run_id("w"), &call_id("running"), None)
        .await
        .unwrap()
        .unwrap();
    recovering.flush().await.unwrap();
    let mut holder = sqlx::PgConnection::connect(&url).await.unwrap();
    holder
        .execute(
            "INSERT INTO instances (id, started_at, heartbeat_at) VALUES ('gone', 0, 0); \
             UPDATE calls SET executing_on = 'gone' WHERE run_id = 'w'",
        )
        .await
        .unwrap();
    // The owner's heartbeat is late: the recovery takes it for dead.
    sqlx::query("UPDATE instances SET heartbeat_at = 0 WHERE id = $1")
        .bind(owner.instance().as_str())
        .execute(&mut holder)
        .await
        .unwrap();
    holder.execute("BEGIN").await.unwrap();
    holder
        .execute("SELECT 1 FROM runs WHERE id = 'w' FOR UPDATE")
        .await
        .unwrap();
    let recovery = {
        let store = Arc::clone(&recovering);
        tokio::spawn(async move { store.recover(recovery_events()).await.unwrap() })
    };
    let mut watcher = sqlx::PgConnection::connect(&url).await.unwrap();
    until_waiting_for_locks(
        &mut watcher,
        1,
        "the recovery never waited for the run's row",
    )
    .await;

    // The heartbeat comes after all, and the owner begins a call of its run.
    sqlx::query(
        "UPDATE instances SET heartbeat_at = CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) \
         WHERE id = $1",
    )
    .bind(owner.instance().as_str())
    .execute(&mut watcher)
    .await
    .unwrap();
    let begun = begin_inline(&*owner, "r", "c", 1).await;
    holder.execute("COMMIT").await.unwrap();
    let recovered = tokio::time::timeout(std::time::Duration::from_secs(10), recovery)
        .await
        .expect("the recovery ends once the row is let go")
        .unwrap();
    assert!(begun.is_none(), "the fenced run begins no call: {begun:?}");
    assert_eq!(recovered.failed_runs, vec![run_id("r")]);
    assert_eq!(
        recovered.interrupted_calls,
        vec![(run_id("w"), call_id("running"))]
    );
}

/// An instance whose lease is long (its own heartbeat does not come during a test) and another that recovers, on one
/// PostgreSQL database.
async fn late_owner_and_recovering() -> (String, Arc<SqlStore>, Arc<SqlStore>) {
    let url = postgres::database();
    let owner = SqlStore::open_with_lease(
        &DatabaseUrl::Postgres(url.clone()),
        std::time::Duration::from_secs(600),
    )
    .await
    .unwrap();
    let recovering = SqlStore::open(&DatabaseUrl::Postgres(url.clone()))
        .await
        .unwrap();
    (url, owner, recovering)
}

/// Sets `owner`'s heartbeat to `at` (0: late, so that a recovery takes it for dead; `None`: now, on the database's
/// clock).
async fn heartbeat(connection: &mut sqlx::PgConnection, owner: &SqlStore, at: Option<i64>) {
    sqlx::query(
        "UPDATE instances SET heartbeat_at = \
         COALESCE($2, CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)) WHERE id = $1",
    )
    .bind(owner.instance().as_str())
    .bind(at)
    .execute(connection)
    .await
    .unwrap();
}

/// Starts a recovery while `holder` holds the row of run `run` in a transaction it opens, and returns once the
/// recovery waits for that row.
async fn recovery_waiting_for_run(
    url: &str,
    recovering: &Arc<SqlStore>,
    holder: &mut sqlx::PgConnection,
    run: &str,
) -> tokio::task::JoinHandle<Recovered> {
    use sqlx::{Connection, Executor};
    holder.execute("BEGIN").await.unwrap();
    sqlx::query("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE")
        .bind(run)
        .execute(&mut *holder)
        .await
        .unwrap();
    let recovery = {
        let store = Arc::clone(recovering);
        tokio::spawn(async move { store.recover(recovery_events()).await.unwrap() })
    };
    let mut watcher = sqlx::PgConnection::connect(url).await.unwrap();
    until_waiting_for_locks(
        &mut watcher,
        1,
        "the recovery never waited for the run's row",
    )
    .await;
    recovery
}

/// Commits `holder`'s transaction and returns what the recovery did once it ends.
async fn recovered_once_let_go(
    holder: &mut sqlx::PgConnection,
    recovery: tokio::task::JoinHandle<Recovered>,
) -> Recovered {
    use sqlx::Executor;
    holder.execute("COMMIT").await.unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(10), recovery)
        .await
        .expect("the recovery ends once the row is let go")
        .unwrap()
}

/// A call running on an instance whose heartbeat was late when a recovery read who is live, and came while the
/// recovery waited for the call's run, is left to that instance: it is alive, its call runs, and its result will be
/// recorded. Before, the recovery interrupted it from what it had read (its audit line saying the process stopped),
/// while the call went on running, and its result was then thrown away.
#[tokio::test]
async fn a_call_of_an_instance_whose_heartbeat_came_during_a_recovery_is_not_interrupted() {
    use sqlx::Connection;
    let (url, owner, recovering) = late_owner_and_recovering().await;
    owner.start_run(new_run("w", "sw")).await.unwrap().unwrap();
    open_waiting(&*owner, "w", &[], &["running"]).await;
    owner
        .begin_call(&run_id("w"), &call_id("running"), None)
        .await
        .unwrap()
        .expect("the owner begins the call");
    owner.flush().await.unwrap();
    let mut holder = sqlx::PgConnection::connect(&url).await.unwrap();
    heartbeat(&mut holder, &owner, Some(0)).await;
    let recovery = recovery_waiting_for_run(&url, &recovering, &mut holder, "w").await;
    let mut watcher = sqlx::PgConnection::connect(&url).await.unwrap();
    // The heartbeat comes after all.
    heartbeat(&mut watcher, &owner, None).await;
    let recovered = recovered_once_let_go(&mut holder, recovery).await;
    assert_eq!(recovered.interrupted_calls, vec![]);
    let (status, on): (String, Option<String>) = sqlx::query_as(
        "SELECT status, executing_on FROM calls WHERE run_id = 'w' AND call_id = 'running'",
    )
    .fetch_one(&mut watcher)
    .await
    .unwrap();
    assert_eq!(
        (status.as_str(), on.as_deref()),
        ("executing", Some(owner.instance().as_str()))
    );
}

/// A grant is kept only by the instance that holds the run. A late owner's grant and a recovery's fence of its run,
/// at once on PostgreSQL: the grant reads the run's row
/// `FOR SHARE`, so it waits for the fence's update in flight and then finds the run fenced. Read without the lock,
/// it would see the run as its own and keep a grant the recovery (which gives a resume's answers back only when the
/// run made none) does not know of.
#[tokio::test]
async fn a_grant_waits_for_a_fence_in_flight_on_postgresql() {
    use sqlx::{Connection, Executor};
    let url = postgres::database();
    let store = SqlStore::open(&DatabaseUrl::Postgres(url.clone()))
        .await
        .unwrap();
    store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    let grant = |id: &str| StoredGrant {
        id: id.into(),
        grant: json!({"runId": "r", "tool": "delete_file"}),
        created_at: 5,
    };
    // Another instance, at the run's epoch, does not hold it.
    let other = SqlStore::open(&DatabaseUrl::Postgres(url.clone()))
        .await
        .unwrap();
    assert_eq!(
        other
            .add_grant(&run_id("r"), 1, grant("other"))
            .await
            .unwrap(),
        Err(Fenced::Lost)
    );
    let mut fence = sqlx::PgConnection::connect(&url).await.unwrap();
    fence.execute("BEGIN").await.unwrap();
    fence
        .execute("UPDATE runs SET epoch = epoch + 1 WHERE id = 'r'")
        .await
        .unwrap();
    let granting = {
        let store = Arc::clone(&store);
        let grant = grant("g1");
        tokio::spawn(async move { store.add_grant(&run_id("r"), 1, grant).await.unwrap() })
    };
    let mut watcher = sqlx::PgConnection::connect(&url).await.unwrap();
    until_waiting_for_locks(&mut watcher, 1, "the grant never waited for the fence").await;
    fence.execute("COMMIT").await.unwrap();
    let kept = tokio::time::timeout(std::time::Duration::from_secs(10), granting)
        .await
        .expect("the grant ends once the fence commits")
        .unwrap();
    assert_eq!(kept, Err(Fenced::Lost));
    assert!(store.grants(&session("s")).await.unwrap().is_empty());
}

/// On PostgreSQL, a revoke that deletes the grant while a covered card's approval is being made: the approval waits
/// for the revoke's transaction and then finds the grant gone, rather than approving from what it read before.
#[tokio::test]
async fn an_approval_under_a_grant_waits_for_a_revoke_in_flight_on_postgresql() {
    use sqlx::{Connection, Executor};
    let url = postgres::database();
    let store = SqlStore::open(&DatabaseUrl::Postgres(url.clone()))
        .await
        .unwrap();
    store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    store
        .add_grant(
            &run_id("r"),
            1,
            StoredGrant {
                id: "g1".into(),
                grant: json!({"tool": "delete_file"}),
                created_at: 5,
            },
        )
        .await
        .unwrap()
        .unwrap();
    open_waiting(&*store, "r", &[("b", u64::MAX)], &[]).await;
    let mut holder = sqlx::PgConnection::connect(&url).await.unwrap();
    holder.execute("BEGIN").await.unwrap();
    holder
        .execute("DELETE FROM grants WHERE id = 'g1'")
        .await
        .unwrap();
    let decision = {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            store
                .decide(&run_id("r"), &call_id("b"), approve_under_grant("g1"))
                .await
                .unwrap()
        })
    };
    let mut watcher = sqlx::PgConnection::connect(&url).await.unwrap();
    until_waiting_for_locks(&mut watcher, 1, "the approval never waited for the revoke").await;
    holder.execute("COMMIT").await.unwrap();
    let decided = tokio::time::timeout(std::time::Duration::from_secs(10), decision)
        .await
        .expect("the approval ends once the revoke commits")
        .unwrap();
    assert_eq!(decided.map(|_| ()), Err(DecideFailure::GrantRevoked));
}

/// A call of a running run that a recovery fences is recorded as interrupted even when its instance's heartbeat
/// comes back meanwhile: the run ends whatever that instance does now, and its calls go with it, so a call left
/// running would leave no line at all. Here the instance has a call of a waiting run running too, whose run's row
/// another connection holds: the heartbeat comes while the recovery waits for it.
#[tokio::test]
async fn a_call_of_a_run_a_recovery_fenced_is_interrupted_though_its_instance_came_back() {
    use sqlx::Connection;
    let (url, owner, recovering) = late_owner_and_recovering().await;
    owner.start_run(new_run("w", "sw")).await.unwrap().unwrap();
    open_waiting(&*owner, "w", &[], &["running"]).await;
    owner
        .begin_call(&run_id("w"), &call_id("running"), None)
        .await
        .unwrap()
        .expect("the owner begins the waiting run's call");
    owner.start_run(new_run("r", "s")).await.unwrap().unwrap();
    begin_inline(&*owner, "r", "c", 1)
        .await
        .expect("the owner begins the running run's call");
    owner.flush().await.unwrap();
    let mut holder = sqlx::PgConnection::connect(&url).await.unwrap();
    heartbeat(&mut holder, &owner, Some(0)).await;
    let recovery = recovery_waiting_for_run(&url, &recovering, &mut holder, "w").await;
    let mut watcher = sqlx::PgConnection::connect(&url).await.unwrap();
    heartbeat(&mut watcher, &owner, None).await;
    let recovered = recovered_once_let_go(&mut holder, recovery).await;
    assert_eq!(recovered.failed_runs, vec![run_id("r")]);
    // The waiting run's call is the live instance's; the fenced run's is interrupted with its run.
    assert_eq!(
        recovered.interrupted_calls,
        vec![(run_id("r"), call_id("c"))]
    );
}

/// What a recovery on PostgreSQL takes over from an instance it found dead, that instance is told to stop, should it
/// only have been late: a running run (which the recovery ends) as a whole, and a call of a waiting run (recorded as
/// interrupted) alone. Their tasks and tools would otherwise go on, and whatever they did would be thrown away.
/// Before, nothing told it, and then only of the running run. Nobody else is told, and the waiting run itself is not
/// stopped (it goes on after the recovery, and whoever claims it next, that instance maybe, must not be stopped).
#[tokio::test]
async fn an_instance_whose_work_a_recovery_took_over_is_told_to_stop_it() {
    use sqlx::Connection;
    let (url, owner, recovering) = late_owner_and_recovering().await;
    owner.start_run(new_run("r", "s")).await.unwrap().unwrap();
    owner.start_run(new_run("w", "sw")).await.unwrap().unwrap();
    open_waiting(&*owner, "w", &[], &["running"]).await;
    owner
        .begin_call(&run_id("w"), &call_id("running"), None)
        .await
        .unwrap()
        .expect("the owner begins the call");
    owner.flush().await.unwrap();
    let mut told = owner.remote_stops();
    let mut told_others = recovering.remote_stops();
    let mut connection = sqlx::PgConnection::connect(&url).await.unwrap();
    // The owner's heartbeat is late: the recovery takes it for dead.
    heartbeat(&mut connection, &owner, Some(0)).await;
    let recovered = recovering.recover(recovery_events()).await.unwrap();
    assert_eq!(recovered.failed_runs, vec![run_id("r")]);
    assert_eq!(
        recovered.interrupted_calls,
        vec![(run_id("w"), call_id("running"))]
    );
    let mut stops = Vec::new();
    for _ in 0..2 {
        let stop = tokio::time::timeout(std::time::Duration::from_secs(10), told.recv())
            .await
            .expect("the owner is told to stop what was taken over")
            .unwrap();
        stops.push(stop);
    }
    assert_eq!(
        stops,
        vec![
            // Not as a shutdown, which lets a call about to begin go on: the recovery recorded it as interrupted.
            RemoteStop::Run(run_id("r"), AbortReason::TakenOver),
            RemoteStop::Call(run_id("w"), call_id("running")),
        ]
    );
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    for others in [&mut told, &mut told_others] {
        assert!(matches!(
            others.try_recv(),
            Err(tokio::sync::broadcast::error::TryRecvError::Empty)
        ));
    }
}

/// Each instance is judged by its own lease. Here one started with a lease of a minute (a heartbeat every 12 s) last
/// beat 20 s ago; another, started with 10 s, recovers: before, it judged the first by its own 10 s, ended its
/// sampling run as `RESTARTED` and forgot it, though it was alive.
#[tokio::test]
async fn an_instance_is_judged_alive_by_its_own_lease() {
    use sqlx::Connection;
    let url = postgres::database();
    let patient = SqlStore::open_with_lease(
        &DatabaseUrl::Postgres(url.clone()),
        std::time::Duration::from_secs(60),
    )
    .await
    .unwrap();
    let hasty = SqlStore::open_with_lease(
        &DatabaseUrl::Postgres(url.clone()),
        std::time::Duration::from_secs(10),
    )
    .await
    .unwrap();
    patient.start_run(new_run("r", "s")).await.unwrap().unwrap();
    let mut connection = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::query(
        "UPDATE instances SET heartbeat_at = CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) - 20000 \
         WHERE id = $1",
    )
    .bind(patient.instance().as_str())
    .execute(&mut connection)
    .await
    .unwrap();
    let recovered = hasty.recover(recovery_events()).await.unwrap();
    assert_eq!(recovered.failed_runs, Vec::<RunId>::new());
    let run = patient.run(&run_id("r")).await.unwrap().unwrap();
    assert_eq!(run.state, RunState::Running);
    let known: Vec<String> = sqlx::query_scalar("SELECT id FROM instances")
        .fetch_all(&mut connection)
        .await
        .unwrap();
    assert!(
        known.contains(&patient.instance().as_str().to_owned()),
        "{known:?}"
    );

    // Past its own lease, it is dead to the others.
    sqlx::query(
        "UPDATE instances SET heartbeat_at = CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) - 61000 \
         WHERE id = $1",
    )
    .bind(patient.instance().as_str())
    .execute(&mut connection)
    .await
    .unwrap();
    let recovered = hasty.recover(recovery_events()).await.unwrap();
    assert_eq!(recovered.failed_runs, vec![run_id("r")]);
}

/// Readers re-read every ten seconds even while other runs' doorbells keep ringing: a busy cluster must not make a
/// lost notification a lost event. Here the doorbell of run `x`'s new event was never rung (as when it was sent while
/// the listener reconnected), and run `y`'s ring all along.
#[tokio::test]
async fn readers_re_read_on_postgresql_while_other_doorbells_keep_ringing() {
    let url = postgres::database();
    let a = SqlStore::open(&DatabaseUrl::Postgres(url.clone()))
        .await
        .unwrap();
    a.start_run(new_run("x", "sx")).await.unwrap().unwrap();
    a.start_run(new_run("y", "sy")).await.unwrap().unwrap();
    // Opened after the runs started: their doorbells rang before it listened.
    let b = SqlStore::open(&DatabaseUrl::Postgres(url.clone()))
        .await
        .unwrap();
    let mut missed = b.watch_run(&run_id("x"));
    missed.borrow_and_update();
    let ringing = {
        let a = Arc::clone(&a);
        tokio::spawn(async move {
            for step in 2.. {
                a.append(&run_id("y"), 1, vec![step_event("y", step)]);
                a.flush().await.unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        })
    };
    let woken = tokio::time::timeout(std::time::Duration::from_secs(14), missed.changed()).await;
    ringing.abort();
    assert!(
        woken.is_ok(),
        "a reader of a run whose doorbell was lost is woken within ten seconds, however busy the others are"
    );
}

/// During a rolling deploy an instance of the older version may start after a newer one migrated the database: it
/// starts (before, it refused with "migration 99 was previously applied but is missing").
#[tokio::test]
async fn an_older_instance_starts_on_a_postgresql_database_a_newer_one_migrated() {
    use sqlx::Connection;
    let url = postgres::database();
    let first = SqlStore::open(&DatabaseUrl::Postgres(url.clone()))
        .await
        .unwrap();
    first.start_run(new_run("r", "s")).await.unwrap().unwrap();
    let mut connection = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (99, 'a newer version''s', TRUE, '\\x00', 0)",
    )
    .execute(&mut connection)
    .await
    .unwrap();
    let older = SqlStore::open(&DatabaseUrl::Postgres(url.clone()))
        .await
        .expect("the older instance starts");
    assert_eq!(
        older.run(&run_id("r")).await.unwrap().unwrap().state,
        RunState::Running
    );
}

#[tokio::test]
async fn the_audit_log_refuses_updates_and_deletes_in_both_databases() {
    use sqlx::Executor;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("toolgate.db");
    let store = SqlStore::open(&DatabaseUrl::Sqlite(path.clone()))
        .await
        .unwrap();
    store.audit(request_audit("r", "c")).await.unwrap();
    let mut raw = <sqlx::SqliteConnection as sqlx::Connection>::connect(&format!(
        "sqlite://{}",
        path.display()
    ))
    .await
    .unwrap();
    for statement in ["UPDATE audit SET outcome = 'approved'", "DELETE FROM audit"] {
        let error = raw.execute(statement).await.unwrap_err();
        assert!(error.to_string().contains("append-only"), "{error}");
    }

    let url = postgres::database();
    let store = SqlStore::open(&DatabaseUrl::Postgres(url.clone()))
        .await
        .unwrap();
    store.audit(request_audit("r", "c")).await.unwrap();
    for statement in [
        "UPDATE audit SET outcome = 'approved'",
        "DELETE FROM audit",
        "TRUNCATE audit",
    ] {
        let output = std::process::Command::new("psql")
            .args(["-X", "-v", "ON_ERROR_STOP=1", &url, "-c", statement])
            .output()
            .unwrap();
        assert!(!output.status.success(), "{statement} was allowed");
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("append-only"),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// A waiting run whose saved batch this version cannot read (written by a newer one, a file changed by hand, a
/// damaged disk) is refused with the error once its batch is settled, and left as it was: its claim reads the batch
/// only after its check of the calls' statuses (where a status it does not know is not final), and before it changes
/// anything, so it does not take the run and erase the batch and its calls on its way to the error. Once the batch
/// reads again, the run is claimed as usual.
async fn a_batch_that_does_not_read_leaves_its_run_waiting_and_whole(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    open_waiting(store, "r", &[("a", u64::MAX)], &[]).await;
    let beside = Beside::of(&backend);
    const UNREADABLE: &str = "{\"not\": \"a batch\"}";
    let saved = beside.read("SELECT batch FROM runs WHERE id = 'r'");
    let set_batch = |text: &str| {
        beside.write(&format!(
            "UPDATE runs SET batch = {} WHERE id = 'r'",
            Beside::quoted(text)
        ))
    };
    let set_status = |status: &str| {
        beside.write(&format!(
            "UPDATE calls SET status = {} WHERE call_id = 'a'",
            Beside::quoted(status)
        ))
    };
    set_batch(UNREADABLE);
    assert!(
        store
            .claim_batch(&run_id("r"), left_by_abort())
            .await
            .unwrap()
            .is_none(),
        "a batch with a call pending is not the claim's to read"
    );
    // The call settled (denied by the run's abort): now the batch is the claim's to take.
    cancelled(store, "r").await;
    // A call in a status this version does not know (a newer one's) may still be running where it is known: the
    // batch is not the claim's, and nothing is refused as unreadable.
    let settled = beside.read("SELECT status FROM calls WHERE call_id = 'a'");
    set_status("archived");
    assert!(
        store
            .claim_batch(&run_id("r"), left_by_abort())
            .await
            .unwrap()
            .is_none(),
        "a call in a status this version does not know is not final here"
    );
    set_status(&settled);

    claim_is_refused_as_unreadable(store, "r", "batch").await;
    assert_eq!(
        [
            beside.read("SELECT state FROM runs WHERE id = 'r'"),
            beside.read("SELECT CAST(epoch AS TEXT) FROM runs WHERE id = 'r'"),
            beside.read("SELECT batch FROM runs WHERE id = 'r'"),
            beside.read("SELECT CAST(COUNT(*) AS TEXT) FROM calls WHERE run_id = 'r'"),
        ],
        ["waiting", "1", UNREADABLE, "1"],
        "the run is not taken, and its batch and its call are as they were"
    );

    set_batch(&saved);
    let claimed = store
        .claim_batch(&run_id("r"), left_by_abort())
        .await
        .unwrap()
        .expect("claimed once its batch reads");
    assert_eq!(claimed.epoch, 2);
    assert_eq!(claimed.batch, saved_batch(&["a"]));
    assert_eq!(claimed.outputs.len(), 1, "the call's output");
}

/// The overflow pages of a table of the SQLite file at `path`, read beside the store.
fn overflow_pages(path: &std::path::Path, table: &str) -> i64 {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row(
            "SELECT COUNT(*) FROM dbstat WHERE name = $1 AND pagetype = 'overflow'",
            [table],
            |row| row.get(0),
        )
        .unwrap()
}

/// A pending call's record (its arguments, its card with the preview) is more than a quarter of a page, and each of
/// its changes rewrites it whole. It stays on the calls table's own page through those changes (decided, then
/// executing): before, the table was keyed by its primary key alone (WITHOUT ROWID), which keeps at most about a
/// quarter of a page of a row in place, so every change freed the record's overflow page and took another, with the
/// free list's page and the database's header written too.
#[tokio::test]
async fn a_calls_record_stays_on_its_tables_page_through_its_changes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("toolgate.db");
    let store = SqlStore::open(&DatabaseUrl::Sqlite(path.clone()))
        .await
        .unwrap();
    // What the database holds of the call, read beside the store: the record's length and the calls table's
    // overflow pages.
    let pages = || {
        let record: i64 = rusqlite::Connection::open(&path)
            .unwrap()
            .query_row(
                "SELECT length(record) FROM calls WHERE call_id = 'a'",
                [],
                |row| row.get(0),
            )
            .unwrap();
        (record, overflow_pages(&path, "calls"))
    };
    store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    // A card as a deletion of a small text file shows it: the file's first lines.
    let mut call = pending_call("r", "a", u64::MAX);
    if let Some(approval) = call.approval.as_mut() {
        approval.preview = Some(ApprovalPreview::FileDelete {
            path: "notes/todo.txt".into(),
            bytes: 640,
            head: (1..=10)
                .map(|line| format!("{line}. a line of the file that is about to be deleted, as the card shows it"))
                .collect(),
            more: false,
            note: None,
        });
    }
    open_batch_of(&*store, "r", vec![call]).await;

    store
        .decide(&run_id("r"), &call_id("a"), Box::new(|r| Ok(approve(r))))
        .await
        .unwrap()
        .expect("the pending call is decided");
    let (record, overflow) = pages();
    assert!(
        record > 1_100,
        "the record ({record} bytes) is more than a WITHOUT ROWID table keeps in place"
    );
    assert_eq!(
        overflow, 0,
        "the decided record spilled to an overflow page"
    );

    store
        .begin_call(&run_id("r"), &call_id("a"), None)
        .await
        .unwrap()
        .expect("the approved call is taken");
    assert_eq!(pages().1, 0, "the executing record spilled");
}

/// An event of more than a quarter of a page (a card's `approvalRequired` with its preview, a paragraph of the
/// model's text) stays on the events table's own page, and a run's events read back in order. Before, the table
/// was keyed by (run, seq) alone (WITHOUT ROWID), which keeps at most 1,002 bytes of a row in place: the rest of
/// each such event went to an overflow page, one more page written.
#[tokio::test]
async fn an_event_of_more_than_a_quarter_page_stays_on_the_events_tables_page() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("toolgate.db");
    let store = SqlStore::open(&DatabaseUrl::Sqlite(path.clone()))
        .await
        .unwrap();
    let paragraph = NewEvent::encode(&StreamEvent::AssistantDelta {
        run_id: run_id("r"),
        step: 1,
        delta: "A paragraph of the model's answer, as it arrives. ".repeat(30),
    })
    .unwrap();
    assert!(paragraph.json.len() > 1_400, "{}", paragraph.json.len());
    let mut run = new_run("r", "s");
    run.events.push(paragraph);
    let epoch = store.start_run(run).await.unwrap().unwrap();
    store.append(&run_id("r"), epoch, vec![step_event("r", 2)]);
    store.flush().await.unwrap();

    assert_eq!(
        overflow_pages(&path, "events"),
        0,
        "the paragraph spilled to an overflow page"
    );
    let kinds: Vec<(u64, &str)> = store
        .events_after(&run_id("r"), 0, 10)
        .await
        .unwrap()
        .iter()
        .map(|event| (event.seq, event.kind))
        .collect();
    assert_eq!(kinds, [(1, "step"), (2, "assistantDelta"), (3, "step")]);
}

/// An audit entry of a kind this version does not know (a newer version's, written to the same database) is read
/// back with its kind as the log holds it, among the others and in its place: the audit view neither fails for it
/// nor leaves a line of the log out. The kind is shown as it was written.
async fn an_audit_entry_of_a_kind_this_version_does_not_know_is_shown_as_it_is(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    store.audit(request_audit("r", "c1")).await.unwrap();
    Beside::of(&backend).write(
        "INSERT INTO audit (at, kind, run_id, outcome) VALUES (1500, 'budget_exceeded', 'r', 'stopped')",
    );
    store.audit(request_audit("r", "c2")).await.unwrap();

    let entries = audit_of(store, "r").await;
    let seen: Vec<(&str, &str)> = entries
        .iter()
        .map(|entry| (entry.kind.as_str(), entry.outcome.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("approval_requested", "requested"),
            ("budget_exceeded", "stopped"),
            ("approval_requested", "requested"),
        ]
    );
    assert_eq!(
        serde_json::to_value(&entries[1]).unwrap()["kind"],
        json!("budget_exceeded")
    );
}

/// Run `r` waiting on calls `a` and `b`, cancelled while `b`'s record did not read (an older version's abort beside
/// the newer one that wrote it): the database beside the store, `b`'s own record (to put back), and the abort.
async fn aborted_leaving_b_unread(backend: &Backend) -> (Beside<'_>, String, Aborted) {
    let store = &*backend.store;
    store.start_run(new_run("r", "s")).await.unwrap().unwrap();
    open_waiting(store, "r", &[("a", u64::MAX), ("b", 5_000)], &[]).await;
    let beside = Beside::of(backend);
    let b = beside.read("SELECT record FROM calls WHERE call_id = 'b'");
    beside.write(&format!(
        "UPDATE calls SET record = {NOT_A_CALL} WHERE call_id = 'b'"
    ));
    let aborted = cancelled(store, "r").await;
    (beside, b, aborted)
}

/// A call an abort left because it could not read it (the aborting instance an older version, beside the newer one
/// that wrote the call) is settled by the run's claim where it reads, as the abort would have, in the claim's own
/// change: its denial goes to the model with the others, its event follows the abort's, and its audit entry is
/// written; meanwhile it neither times out nor is listed among the approvals. Where it does not read, the claim is
/// refused and takes nothing.
async fn a_claim_settles_what_the_abort_left_where_it_reads(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    let (beside, b, aborted) = aborted_leaving_b_unread(&backend).await;
    let abort_seq = aborted.run.last_seq;
    claim_is_refused_as_unreadable(store, "r", "call b was left unsettled").await;
    assert_eq!(
        [
            beside.read("SELECT state FROM runs WHERE id = 'r'"),
            beside.read("SELECT status FROM calls WHERE call_id = 'b'"),
        ],
        ["waiting", "pending"],
        "the claim took nothing"
    );
    assert_eq!(
        store.run(&run_id("r")).await.unwrap().unwrap().last_seq,
        abort_seq,
        "and wrote nothing"
    );

    beside.write(&format!(
        "UPDATE calls SET record = {} WHERE call_id = 'b'",
        Beside::quoted(&b)
    ));
    let timeout: SettleExpired = Box::new(|r| deny(r, DenialSource::Timeout));
    assert!(
        store.expire(10_000, timeout).await.unwrap().is_empty(),
        "what the abort left does not time out"
    );
    assert_eq!(
        store.next_expiry(0).await.unwrap(),
        None,
        "and the sweeper does not wait for it to"
    );
    assert_eq!(
        [
            store.pending(PendingOf::All).await.unwrap(),
            store.pending(PendingOf::Run(&run_id("r"))).await.unwrap()
        ],
        [vec![], vec![]],
        "nor is it listed as waiting for a decision"
    );
    let claimed = store
        .claim_batch(&run_id("r"), left_by_abort())
        .await
        .unwrap()
        .expect("the claim settles what the abort left");
    assert_eq!(claimed.run.abort, Some(AbortReason::Cancelled));
    assert_eq!(
        (claimed.run.state, claimed.run.last_seq),
        (RunState::Running, abort_seq + 1),
        "the claim returns the run as it left it, the events it added counted"
    );
    assert_eq!(
        Some(&claimed.run),
        store.run(&run_id("r")).await.unwrap().as_ref()
    );
    let denied: Vec<&str> = claimed
        .outputs
        .iter()
        .map(|(call, _)| call.id.as_str())
        .collect();
    assert_eq!(denied, ["a", "b"]);
    let after: Vec<(u64, String)> = store
        .events_after(&run_id("r"), abort_seq, 10)
        .await
        .unwrap()
        .iter()
        .map(|event| (event.seq, event.json.to_string()))
        .collect();
    assert_eq!(
        after,
        [(abort_seq + 1, step_event("r", 97).json.to_string())],
        "b's event, after the abort's"
    );
    let audit = audit_of(store, "r").await;
    let entries: Vec<(&str, &str)> = audit
        .iter()
        .map(|entry| {
            (
                entry.tool_call_id.as_ref().map_or("", |id| id.as_str()),
                entry.outcome.as_str(),
            )
        })
        .collect();
    assert_eq!(
        entries,
        [("a", "requested"), ("b", "requested"), ("b", "aborted")]
    );
}

/// The same with the abort's reason written by a newer version, which this one does not know: the run was aborted
/// all the same, and its claim settles what the abort left.
async fn a_claim_settles_what_an_abort_of_a_newer_version_left(kind: Kind) {
    let backend = open(kind).await;
    let store = &*backend.store;
    let (beside, b, _) = aborted_leaving_b_unread(&backend).await;
    beside.write(&format!(
        "UPDATE calls SET record = {} WHERE call_id = 'b'; \
         UPDATE runs SET abort = 'a_reason_from_a_newer_version' WHERE id = 'r'",
        Beside::quoted(&b)
    ));
    let claimed = store
        .claim_batch(&run_id("r"), left_by_abort())
        .await
        .unwrap()
        .expect("the claim settles what the abort left");
    let settled: Vec<&str> = claimed
        .outputs
        .iter()
        .map(|(call, _)| call.id.as_str())
        .collect();
    assert_eq!(settled, ["a", "b"]);
}
