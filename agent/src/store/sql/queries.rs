//! The store's state changes and reads, in SQL. Each state change is one transaction.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::FutureExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use super::db::{Db, DbError, On, Row, Tx, query};
use super::sql;
use super::{SqlStore, tail, unavailable};
use crate::clock::now_ms;
use crate::ids::{RunId, SessionId, ToolCallId};
use crate::interrupts::Suspension;
use crate::runtime::AbortReason;
use crate::store::*;
use crate::wire::{ApprovalMode, ApprovalRequest, Message};

fn json<T: Serialize>(value: &T) -> String {
    // Our own types always serialise (their maps have text keys, and no value refuses). Were one to fail, a bug,
    // its row holds `null`, which reads back as a row that does not read: loud where it is read, never taken for
    // another value.
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned())
}

fn parse<T: DeserializeOwned>(text: &str, what: &str) -> StoreResult<T> {
    serde_json::from_str(text)
        .map_err(|error| StoreError::Corrupt(format!("{what} cannot be read: {error}")))
}

fn mode_str(mode: ApprovalMode) -> &'static str {
    match mode {
        ApprovalMode::FailClosed => "fail_closed",
        ApprovalMode::Interactive => "interactive",
        ApprovalMode::Interrupt => "interrupt",
    }
}

fn parse_mode(value: &str) -> StoreResult<ApprovalMode> {
    Ok(match value {
        "fail_closed" => ApprovalMode::FailClosed,
        "interactive" => ApprovalMode::Interactive,
        "interrupt" => ApprovalMode::Interrupt,
        other => {
            return Err(StoreError::Corrupt(format!(
                "unknown approval mode {other:?}"
            )));
        }
    })
}

fn run_id(value: String) -> StoreResult<RunId> {
    RunId::parse(value).map_err(|error| StoreError::Corrupt(format!("a stored run id: {error}")))
}

fn session_id(value: String) -> StoreResult<SessionId> {
    SessionId::parse(value)
        .map_err(|error| StoreError::Corrupt(format!("a stored session id: {error}")))
}

const RUN_COLUMNS: &str =
    "id, session_id, parent_run_id, mode, state, last_seq, event_bytes, abort, created_at";

fn run_info(row: &Row) -> StoreResult<RunInfo> {
    let get = |error: DbError| StoreError::Corrupt(error.to_string());
    let state: String = row.try_get("state").map_err(get)?;
    let abort: Option<String> = row.try_get("abort").map_err(get)?;
    Ok(RunInfo {
        run_id: run_id(row.try_get("id").map_err(get)?)?,
        session_id: session_id(row.try_get("session_id").map_err(get)?)?,
        parent_run_id: row
            .try_get::<Option<String>, _>("parent_run_id")
            .map_err(get)?
            .map(run_id)
            .transpose()?,
        mode: parse_mode(&row.try_get::<String, _>("mode").map_err(get)?)?,
        state: RunState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown run state {state:?}")))?,
        last_seq: row.try_get::<i64, _>("last_seq").map_err(get)? as u64,
        event_bytes: row.try_get::<i64, _>("event_bytes").map_err(get)? as u64,
        abort: abort.as_deref().and_then(AbortReason::parse),
        created_at: row.try_get::<i64, _>("created_at").map_err(get)? as u64,
    })
}

/// How many bytes of JSON `events` add to their run's log.
fn event_bytes(events: &[NewEvent]) -> i64 {
    events.iter().map(|event| event.json.len() as i64).sum()
}

fn call_record(row: &Row) -> StoreResult<CallRecord> {
    let get = |error: DbError| StoreError::Corrupt(error.to_string());
    let mut record: CallRecord =
        parse(&row.try_get::<String, _>("record").map_err(get)?, "a call")?;
    let status: String = row.try_get("status").map_err(get)?;
    record.status = CallStatus::parse(&status)
        .ok_or_else(|| StoreError::Corrupt(format!("unknown call status {status:?}")))?;
    record.executing_on = row
        .try_get::<Option<String>, _>("executing_on")
        .map_err(get)?
        .map(InstanceId::from_stored);
    Ok(record)
}

impl SqlStore {
    /// A call's row read as [`call_record`] does, or `None` when this version cannot read it (a row of a newer
    /// version's, or damaged), logged with `what` (as an error the first time): for the changes and listings that
    /// go over many calls, which leave such a row as it is, for an instance that can read it, instead of failing
    /// for every other. The row has `run_id` and `call_id` too, for the log.
    fn readable(&self, row: &Row, what: &'static str) -> StoreResult<Option<CallRecord>> {
        match call_record(row) {
            Ok(record) => Ok(Some(record)),
            Err(StoreError::Corrupt(why)) => {
                let run = row.try_get::<String, _>("run_id").unwrap_or_default();
                let call = row.try_get::<String, _>("call_id").unwrap_or_default();
                if self.unreadable.first((what, run.clone(), call.clone())) {
                    tracing::error!(run, call, %why, "{what}; it is left as it is");
                } else {
                    tracing::debug!(run, call, %why, "{what}, still");
                }
                Ok(None)
            }
            Err(error) => Err(error),
        }
    }

    /// Keeps `grant` for the session, in `connection`'s change (one grant per id: the same grant twice is one).
    async fn grant_in(
        &self,
        connection: &mut Tx,
        session_id: &SessionId,
        grant: &StoredGrant,
    ) -> StoreResult<()> {
        if let Some(granted) = &self.granted {
            // Before the grant is written: a read that finds the session not here finds it holds none.
            granted.lock().insert(session_id.clone());
        }
        query("DELETE FROM grants WHERE session_id = $1 AND id = $2")
            .bind(session_id.as_str())
            .bind(grant.id.clone())
            .execute(&mut *connection)
            .await
            .map_err(unavailable)?;
        query(
            "INSERT INTO grants (session_id, id, grant_json, created_at) VALUES ($1, $2, $3, $4)",
        )
        .bind(session_id.as_str())
        .bind(grant.id.clone())
        .bind(json(&grant.grant))
        .bind(grant.created_at as i64)
        .execute(&mut *connection)
        .await
        .map_err(unavailable)?;
        Ok(())
    }

    /// Appends events to a run's log and returns its newest sequence number, or `None` when the run is not there or
    /// (with `fence`) not this writer's any more. Rings the other instances' doorbell for the run.
    async fn append_in(
        &self,
        connection: &mut Tx,
        run_id: &RunId,
        events: &[NewEvent],
        fence: Option<(&InstanceId, Epoch)>,
    ) -> Db<Option<u64>> {
        let count = events.len() as i64;
        let bytes = event_bytes(events);
        let row = match fence {
            Some((owner, epoch)) => {
                query(sql!(
                    self.dialect,
                    |d| "{} runs SET last_seq = last_seq + $2, event_bytes = event_bytes + $3 \
                         WHERE id = $1 AND state = 'running' AND owner = $4 AND epoch = $5 RETURNING {}",
                    d.update(),
                    Self::seq_returning(d)
                ))
                .bind(run_id.as_str())
                .bind(count)
                .bind(bytes)
                .bind(owner.as_str())
                .bind(epoch as i64)
                .fetch_optional(&mut *connection)
                .await?
            }
            None => {
                query(sql!(
                    self.dialect,
                    |d| "{} runs SET last_seq = last_seq + $2, event_bytes = event_bytes + $3 \
                         WHERE id = $1 RETURNING {}",
                    d.update(),
                    Self::seq_returning(d)
                ))
                .bind(run_id.as_str())
                .bind(count)
                .bind(bytes)
                .fetch_optional(&mut *connection)
                .await?
            }
        };
        let Some(row) = row else {
            return Ok(None);
        };
        let (last, run) = self.room_made(run_id, &row)?;
        self.insert_events_in(connection, run_id, last, run, events)
            .await
            .map(Some)
    }

    /// What a write of a run's row that makes room for events returns, after `RETURNING`: its newest sequence
    /// number, then on SQLite its number (what the events table names it by).
    fn seq_returning(dialect: super::Dialect) -> &'static str {
        match dialect {
            super::Dialect::Sqlite => "last_seq, number",
            super::Dialect::Postgres => "last_seq",
        }
    }

    /// What a write of a run's row that made room for events returned ([`Self::seq_returning`]): the run's newest
    /// sequence number, and how the events table names the run.
    fn room_made<'r>(&self, run_id: &'r RunId, row: &Row) -> Db<(i64, EventsOf<'r>)> {
        let last: i64 = row.try_get(0)?;
        Ok((last, self.events_of(run_id, || row.try_get(1))?))
    }

    /// How the events table names a run: SQLite by its number (`number` reads it), within each event's row
    /// number; PostgreSQL by its id.
    fn events_of<'r>(
        &self,
        run_id: &'r RunId,
        number: impl FnOnce() -> Db<i64>,
    ) -> Db<EventsOf<'r>> {
        Ok(match self.dialect {
            super::Dialect::Sqlite => EventsOf::Number(number()?),
            super::Dialect::Postgres => EventsOf::Id(run_id.as_str()),
        })
    }

    /// Writes `events` into the room made for them in their run's log (the run's row, written with `last_seq`
    /// grown by `events.len()` to `last`), and returns the run's newest sequence number. Rings the other
    /// instances' doorbell for the run.
    async fn insert_events_in(
        &self,
        connection: &mut Tx,
        run_id: &RunId,
        last: i64,
        run: EventsOf<'_>,
        events: &[NewEvent],
    ) -> Db<u64> {
        let first = last - events.len() as i64 + 1;
        for (chunk_index, chunk) in events.chunks(EVENTS_PER_INSERT).enumerate() {
            let mut query = query(run.insert(chunk.len()));
            for (i, event) in chunk.iter().enumerate() {
                let seq = first + (chunk_index * EVENTS_PER_INSERT + i) as i64;
                query = match run {
                    EventsOf::Number(number) => query.bind(
                        super::event_row(number, seq)
                            .ok_or(DbError::EventKey { run: number, seq })?,
                    ),
                    EventsOf::Id(id) => query.bind(id).bind(seq),
                };
                query = query.bind(event.kind).bind(&*event.json);
            }
            query.execute(&mut *connection).await?;
        }
        if let Some(tails) = &self.tails {
            // The tail answers for the log only once it holds these events too. Once the commit is made, a reader
            // on another connection sees them (and the run's row) before the hook below has put them in the tail:
            // until it has, the tail does not cover the log, and such a reader reads the database.
            tails.touched(run_id, last as u64);
            let (tails, run_id, events) = (Arc::clone(tails), run_id.clone(), events.to_vec());
            connection.after_commit(move || tails.committed(&run_id, first as u64, events));
        }
        self.doorbell(&mut *connection, || format!("run {run_id} {last}"))
            .await?;
        Ok(last as u64)
    }
}

/// How the events table names the run whose events a statement writes.
#[derive(Clone, Copy)]
enum EventsOf<'a> {
    /// SQLite: the run's number, within each event's row number.
    Number(i64),
    /// PostgreSQL: the run's id.
    Id(&'a str),
}

/// Events written by one statement at most: within both databases' limits on parameters.
const EVENTS_PER_INSERT: usize = 256;

impl EventsOf<'_> {
    /// The columns of an event's row, in the order its parameters are bound (one each).
    fn columns(self) -> &'static [&'static str] {
        match self {
            Self::Number(_) => &["run_seq", "kind", "json"],
            Self::Id(_) => &["run_id", "seq", "kind", "json"],
        }
    }

    /// The database whose events table names runs so.
    fn dialect(self) -> super::Dialect {
        match self {
            Self::Number(_) => super::Dialect::Sqlite,
            Self::Id(_) => super::Dialect::Postgres,
        }
    }

    /// The statement that writes `rows` events (1 to [`EVENTS_PER_INSERT`]), its parameters numbered row by row in
    /// the order of [`Self::columns`]. Made once for each number of rows and kept: an append writes a few events at
    /// a time, and making the statement anew each time took about 1% of the durable store's CPU (a profile of the
    /// AG-UI round trip at concurrency 32).
    fn insert(self, rows: usize) -> &'static str {
        static SQLITE: [OnceLock<String>; EVENTS_PER_INSERT] =
            [const { OnceLock::new() }; EVENTS_PER_INSERT];
        static POSTGRES: [OnceLock<String>; EVENTS_PER_INSERT] =
            [const { OnceLock::new() }; EVENTS_PER_INSERT];
        let made = match self.dialect() {
            super::Dialect::Sqlite => &SQLITE,
            super::Dialect::Postgres => &POSTGRES,
        };
        let rows = rows.clamp(1, EVENTS_PER_INSERT);
        made[rows - 1].get_or_init(|| {
            let columns = self.columns();
            let mut sql = format!(
                "{} INTO events ({}) VALUES ",
                self.dialect().insert(),
                columns.join(", ")
            );
            for row in 0..rows {
                sql.push_str(if row == 0 { "(" } else { ",(" });
                for column in 0..columns.len() {
                    if column > 0 {
                        sql.push_str(", ");
                    }
                    sql.push_str(&format!("${}", row * columns.len() + column + 1));
                }
                sql.push(')');
            }
            sql
        })
    }
}

/// Locks a run's row before its calls' rows (PostgreSQL; SQLite's one writer needs no lock). Every transaction
/// that changes both takes the run first, so two of them never hold one each and wait for the other (a deadlock,
/// which PostgreSQL breaks by failing one of them).
async fn lock_run_in(dialect: super::Dialect, connection: &mut Tx, run_id: &RunId) -> Db<()> {
    if dialect == super::Dialect::Sqlite {
        return Ok(());
    }
    query("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE")
        .bind(run_id.as_str())
        .fetch_optional(&mut *connection)
        .await?;
    Ok(())
}

/// The newest sequence number of a run, for notifications after a change that appended nothing.
async fn last_seq_in(connection: &mut Tx, run_id: &RunId) -> Db<u64> {
    let row = query("SELECT last_seq FROM runs WHERE id = $1")
        .bind(run_id.as_str())
        .fetch_optional(&mut *connection)
        .await?;
    Ok(match row {
        Some(row) => row.try_get::<i64, _>(0)? as u64,
        None => 0,
    })
}

/// Deletes a run's calls (its end: a finished run keeps none) and, with `pending`, returns those still pending, in
/// the order the run asked them. Only their records are read: a call's row this version cannot read fails the end
/// only if the end has to settle that call.
async fn take_calls_in(
    dialect: super::Dialect,
    connection: &mut Tx,
    run_id: &RunId,
    pending: bool,
) -> StoreResult<Vec<CallRecord>> {
    lock_run_in(dialect, &mut *connection, run_id)
        .await
        .map_err(unavailable)?;
    if !pending {
        query("DELETE FROM calls WHERE run_id = $1")
            .bind(run_id.as_str())
            .execute(&mut *connection)
            .await
            .map_err(unavailable)?;
        return Ok(Vec::new());
    }
    let rows = query(
        "DELETE FROM calls WHERE run_id = $1 RETURNING idx, status, executing_on, \
         CASE WHEN status = 'pending' THEN record END AS record",
    )
    .bind(run_id.as_str())
    .fetch_all(&mut *connection)
    .await
    .map_err(unavailable)?;
    let corrupt = |error: DbError| StoreError::Corrupt(error.to_string());
    let mut calls = Vec::new();
    for row in &rows {
        if row.try_get::<String, _>("status").map_err(corrupt)? != CallStatus::Pending.as_str() {
            continue;
        }
        let idx: i64 = row.try_get("idx").map_err(corrupt)?;
        calls.push((idx, call_record(row)?));
    }
    // Neither database promises an order for `RETURNING`'s rows: SQLite gives them in the order they were stored.
    calls.sort_by_key(|(idx, _)| *idx);
    Ok(calls.into_iter().map(|(_, record)| record).collect())
}

/// The interrupts of `parent` that a recovery's end of a resume's run gives back when nothing of them was acted on,
/// and the events that end then has instead of its own.
struct GiveBack {
    parent: RunId,
    events: Vec<NewEvent>,
}

/// The run `child` resumes, if it is a resume's.
async fn parent_in(tx: &mut Tx, child: &RunId) -> StoreResult<Option<RunId>> {
    let row = query("SELECT parent_run_id FROM runs WHERE id = $1")
        .bind(child.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(unavailable)?;
    row.map(|row| row.try_get::<Option<String>, _>(0))
        .transpose()
        .map_err(unavailable)?
        .flatten()
        .map(run_id)
        .transpose()
}

/// Why a resume's run ended before it began a call it approved, as the audit line of that call says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EndedBefore {
    /// Its process died: a recovery ends it.
    Restart,
    /// It failed (its database failed it as the call was to begin, say), or no task of it worked on it any more.
    Failure,
}

/// At the end of `child`, a resume's run that keeps the interrupts of `parent` it took (something of its answers
/// was acted on: it began a call, made a session grant, or was aborted): the audit log's `not_run` lines of the calls
/// it approved and never began, which will never run (the interrupts stay answered). Without them the log holds
/// their approvals and nothing to say they did not run. A call it began has lines of its own (its result, or the
/// recovery's `interrupted`), and so has one an abort stopped before it began (`not_run`, source `abort`): neither
/// gets another. The answers are read back from the audit log, where the resume's start wrote them with the start:
/// the latest resolution of each interrupted call. A suspension that does not read costs these lines, never the end.
async fn approved_not_begun_in(
    tx: &mut Tx,
    parent: &RunId,
    child: &RunId,
    ended: EndedBefore,
) -> StoreResult<Vec<AuditEntry>> {
    let row = query("SELECT suspension FROM runs WHERE id = $1 AND resumed_by = $2")
        .bind(parent.as_str())
        .bind(child.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(unavailable)?;
    let Some(Some(suspension)) = row
        .map(|row| row.try_get::<Option<String>, _>(0))
        .transpose()
        .map_err(unavailable)?
    else {
        return Ok(Vec::new());
    };
    let suspension: Suspension = match parse(&suspension, "a suspension") {
        Ok(suspension) => suspension,
        Err(error) => {
            tracing::warn!(%parent, %error, "the interrupts a resume kept do not read: the calls it approved and never began get no audit line");
            return Ok(Vec::new());
        }
    };
    let begun: std::collections::HashSet<String> =
        query("SELECT call_id FROM calls WHERE run_id = $1")
            .bind(child.as_str())
            .fetch_all(&mut *tx)
            .await
            .map_err(unavailable)?
            .iter()
            .map(|row| row.try_get(0))
            .collect::<Result<_, _>>()
            .map_err(unavailable)?;
    // By call: its latest answer's edited arguments' digest, while that answer approved it and no `not_run` line
    // came after it.
    let mut unended: std::collections::HashMap<String, Option<String>> = Default::default();
    for row in query(
        "SELECT tool_call_id, kind, outcome, edited_digest, run_id FROM audit \
         WHERE run_id IN ($1, $2) AND kind IN ($3, $4) AND tool_call_id IS NOT NULL ORDER BY id",
    )
    .bind(parent.as_str())
    .bind(child.as_str())
    .bind(AuditKind::ApprovalResolved.as_str())
    .bind(AuditKind::CallRefused.as_str())
    .fetch_all(&mut *tx)
    .await
    .map_err(unavailable)?
    {
        let call: String = row.try_get(0).map_err(unavailable)?;
        let kind: String = row.try_get(1).map_err(unavailable)?;
        let outcome: String = row.try_get(2).map_err(unavailable)?;
        let run: Option<String> = row.try_get(4).map_err(unavailable)?;
        if kind == AuditKind::ApprovalResolved.as_str() && run.as_deref() == Some(parent.as_str()) {
            if crate::approvals::APPROVED_OUTCOMES.contains(&outcome.as_str()) {
                unended.insert(call, row.try_get(3).map_err(unavailable)?);
            } else {
                unended.remove(&call);
            }
        } else if kind == AuditKind::CallRefused.as_str()
            && outcome == crate::approvals::NOT_RUN_OUTCOME
        {
            unended.remove(&call);
        }
    }
    let (source, reason) = match ended {
        EndedBefore::Restart => (
            "restart",
            format!(
                "The server stopped before run {child}, which resumed with this approval, began the call: it did not run, and the interrupt stays answered."
            ),
        ),
        EndedBefore::Failure => (
            "failure",
            format!(
                "Run {child}, which resumed with this approval, failed before it began the call: it did not run, and the interrupt stays answered."
            ),
        ),
    };
    let at = now_ms();
    Ok(suspension
        .interrupts
        .iter()
        .filter(|issued| !begun.contains(issued.request.tool_call_id.as_str()))
        .filter_map(|issued| {
            let edited = unended.get(issued.request.tool_call_id.as_str())?;
            Some(AuditEntry {
                session_id: Some(suspension.session_id.clone()),
                run_id: Some(parent.clone()),
                tool_call_id: Some(issued.request.tool_call_id.clone()),
                tool: Some(issued.request.tool_name.clone()),
                arguments_digest: Some(issued.digest.clone()),
                edited_digest: edited.clone(),
                source: Some(source.to_owned()),
                reason: Some(reason.clone()),
                at,
                ..AuditEntry::new(AuditKind::CallRefused, crate::approvals::NOT_RUN_OUTCOME)
            })
        })
        .collect())
}

/// The doorbell that tells instance `on` alone to stop what it runs of `run_id`, a running run a recovery fenced and
/// ends, judging `on` dead. Only for such a run, which nobody goes on with: a waiting run whose call a recovery
/// interrupts goes on (its batch is claimed next, perhaps by `on` itself), and stopping `on`'s work on it by the
/// run's id could stop that claim too; its call is stopped alone ([`stop_call_message`]).
fn stop_message(on: &InstanceId, run_id: &RunId) -> String {
    format!("stop {on} {run_id}")
}

/// The doorbell that tells instance `on` alone to stop its call `call_id` of the waiting run `run_id`, which a
/// recovery recorded as interrupted, judging `on` dead: should `on` only have been late, its tool would go on, and
/// its result would be refused.
///
/// A verb of its own, not `stop` with one more word: an instance of a version before it (a rolling deploy) reads it as
/// a doorbell it does not know, not as a stop of the whole run.
fn stop_call_message(on: &InstanceId, run_id: &RunId, call_id: &ToolCallId) -> String {
    format!("stop-call {on} {run_id} {call_id}")
}

/// What a run's end that changed no row returns: [`Fenced::Aborted`] for an end refused for the run's abort (an end
/// with interrupts) under a claim `held` (this instance, at its epoch) that still holds; otherwise [`Fenced::Lost`]
/// (the run is not there, or not the claim's to end); or an error if the run's state does not read as one.
async fn why_not_ended(
    connection: &mut Tx,
    run_id: &RunId,
    held: Option<(&str, Epoch)>,
) -> StoreResult<Fenced> {
    let row = query("SELECT state, abort, owner, epoch FROM runs WHERE id = $1")
        .bind(run_id.as_str())
        .fetch_optional(&mut *connection)
        .await
        .map_err(unavailable)?;
    if let Some(row) = row {
        let state: String = row.try_get(0).map_err(unavailable)?;
        let Some(state) = RunState::parse(&state) else {
            return Err(StoreError::Corrupt(format!("unknown run state {state:?}")));
        };
        let abort: Option<String> = row.try_get(1).map_err(unavailable)?;
        let owner: Option<String> = row.try_get(2).map_err(unavailable)?;
        let epoch = row.try_get::<i64, _>(3).map_err(unavailable)? as Epoch;
        // Refused for its abort (an end with interrupts) only while the claim it was made under still holds.
        let still_held = held.is_some_and(|(by, at)| owner.as_deref() == Some(by) && epoch == at);
        if let Some(reason) = abort.as_deref().and_then(AbortReason::parse)
            && !state.is_finished()
            && still_held
        {
            return Ok(Fenced::Aborted(reason));
        }
    }
    Ok(Fenced::Lost)
}

/// Takes the interrupts `parent` issued for the run `by`, inside the transaction that starts `by`: exactly once,
/// and only if that start commits.
async fn take_interrupt_in(
    connection: &mut Tx,
    parent: &RunId,
    by: &RunId,
) -> StoreResult<Result<(), TakeError>> {
    let changed = query(
        "UPDATE runs SET resumed_by = $2 WHERE id = $1 AND suspension IS NOT NULL AND resumed_by IS NULL",
    )
    .bind(parent.as_str())
    .bind(by.as_str())
    .execute(&mut *connection)
    .await
    .map_err(unavailable)?;
    if changed.rows_affected() == 1 {
        return Ok(Ok(()));
    }
    let row = query("SELECT resumed_by FROM runs WHERE id = $1 AND suspension IS NOT NULL")
        .bind(parent.as_str())
        .fetch_optional(&mut *connection)
        .await
        .map_err(unavailable)?;
    Ok(Err(match row {
        None => TakeError::UnknownParent(parent.clone()),
        Some(row) => {
            let used: Option<String> = row.try_get(0).map_err(unavailable)?;
            TakeError::AlreadyUsed {
                parent: parent.clone(),
                by: run_id(used.unwrap_or_default())?,
            }
        }
    }))
}

/// A start refused for `conflict`, unless its run id is taken: a taken id is refused first ([`StartConflict`]'s
/// order). Only a refused start reads it; one that goes on finds a taken id by its insert.
async fn refused_unless_taken(
    tx: &mut Tx,
    run: RunId,
    conflict: StartConflict,
) -> StoreResult<Result<Epoch, StartConflict>> {
    let taken = query("SELECT 1 FROM runs WHERE id = $1")
        .bind(run.as_str())
        .fetch_optional(tx)
        .await
        .map_err(unavailable)?;
    Ok(Err(match taken {
        Some(_) => StartConflict::RunIdTaken(run),
        None => conflict,
    }))
}

/// The session's newest interrupted run that waits for a resume, and when its interrupts expire.
async fn open_interrupt_in<'e>(
    on: impl Into<On<'e>>,
    session_id: &SessionId,
) -> StoreResult<Option<(RunId, u64)>> {
    let row = query(
        "SELECT id, suspension_expires_at FROM runs WHERE session_id = $1 AND suspension IS NOT NULL \
         AND resumed_by IS NULL ORDER BY ordinal DESC LIMIT 1",
    )
    .bind(session_id.as_str())
    .fetch_optional(on)
    .await
    .map_err(unavailable)?;
    row.map(|row| {
        let id: String = row.try_get(0).map_err(unavailable)?;
        let expires: Option<i64> = row.try_get(1).map_err(unavailable)?;
        Ok((run_id(id)?, expires.unwrap_or(0) as u64))
    })
    .transpose()
}

/// Runs each of `statements` in `connection`, with `$1` bound to `id`.
async fn execute_each(connection: &mut Tx, statements: &[&str], id: &str) -> Db<()> {
    for sql in statements {
        query(*sql).bind(id).execute(&mut *connection).await?;
    }
    Ok(())
}

async fn audit_in(connection: &mut Tx, entries: &[AuditEntry]) -> Db<()> {
    for entry in entries {
        // An entry about a run names the run's session.
        let session = match (&entry.session_id, &entry.run_id) {
            (Some(session), _) => Some(session.as_str().to_owned()),
            (None, Some(run)) => query("SELECT session_id FROM runs WHERE id = $1")
                .bind(run.as_str())
                .fetch_optional(&mut *connection)
                .await?
                .map(|row| row.try_get::<String, _>(0))
                .transpose()?,
            (None, None) => None,
        };
        let bounded;
        let entry = if entry.fits() {
            entry
        } else {
            bounded = entry.clone().bounded();
            &bounded
        };
        query(
            "INSERT INTO audit (at, kind, session_id, run_id, tool_call_id, tool, arguments_digest, edited_digest, \
             outcome, source, scope, reason, actor) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
        )
        .bind(entry.at as i64)
        .bind(entry.kind.as_str())
        .bind(session)
        .bind(entry.run_id.as_ref().map(|r| r.as_str().to_owned()))
        .bind(entry.tool_call_id.as_ref().map(|c| c.as_str().to_owned()))
        .bind(entry.tool.clone())
        .bind(entry.arguments_digest.clone())
        .bind(entry.edited_digest.clone())
        .bind(entry.outcome.clone())
        .bind(entry.source.clone())
        .bind(entry.scope.clone())
        .bind(entry.reason.clone())
        .bind(entry.actor.clone())
        .execute(&mut *connection)
        .await?;
    }
    Ok(())
}

/// Writes a call's new state (its row), keyed by run and call id.
async fn save_call(connection: &mut Tx, record: &CallRecord) -> Db<()> {
    query(
        "UPDATE calls SET status = $3, record = $4, executing_on = $5 WHERE run_id = $1 AND call_id = $2",
    )
    .bind(record.run_id.as_str())
    .bind(record.call.id.as_str())
    .bind(record.status.as_str())
    .bind(json(record))
    .bind(record.executing_on.as_ref().map(|i| i.as_str().to_owned()))
    .execute(&mut *connection)
    .await?;
    Ok(())
}

fn apply(record: &mut CallRecord, settlement: Settlement) -> (Vec<NewEvent>, Vec<AuditEntry>) {
    record.status = settlement.status;
    record.resolution = Some(settlement.resolution);
    record.edited_arguments = settlement.edited_arguments;
    if settlement.output.is_some() {
        record.output = settlement.output;
    }
    (settlement.events, settlement.audit)
}

/// The statuses of calls that have their output ([`CallStatus::is_final`]), as a list for `IN`.
macro_rules! final_calls {
    () => {
        "('refused', 'denied', 'settled', 'interrupted')"
    };
}

/// The statement that begins a call inline: its row, in place of a final call of an earlier batch with the same id
/// (ids are the model's), after every other call of the run. Returns a row only if it wrote one. With
/// [`super::Dialect::insert`]'s beginning (it returns what it wrote).
fn begin_inline_call(dialect: super::Dialect) -> &'static str {
    sql!(
        dialect,
        |d| "{} INTO calls (run_id, call_id, idx, status, record, executing_on) \
             VALUES ($1, $2, (SELECT COALESCE(MAX(idx), -1) + 1 FROM calls WHERE run_id = $1), $3, $4, $5) \
             ON CONFLICT (run_id, call_id) DO UPDATE SET idx = excluded.idx, status = excluded.status, \
             record = excluded.record, requested_at = NULL, expires_at = NULL, \
             executing_on = excluded.executing_on WHERE calls.status IN {} RETURNING 1",
        d.insert(),
        final_calls!()
    )
}

/// That a call's run has not been aborted: a pending call of an aborted run is one its abort left (it could not
/// read it), which nobody may decide and which does not time out; the run's claim settles it. A macro, so that
/// constant queries can be made of it with `concat!`.
macro_rules! of_a_live_run {
    () => {
        "NOT EXISTS (SELECT 1 FROM runs WHERE runs.id = calls.run_id AND runs.abort IS NOT NULL)"
    };
}
/// The pending calls due to expire by `$1`, one row per call. (Each run once, deduplicated by the caller: with
/// `DISTINCT`, SQLite would rather scan every call in key order than read the index of pending calls by expiry.)
pub(super) const DUE_CALLS: &str = concat!(
    "SELECT run_id FROM calls WHERE status = 'pending' AND expires_at <= $1 AND ",
    of_a_live_run!()
);
/// Every pending approval, for the listing, oldest first.
pub(super) const PENDING_CALLS: &str = concat!(
    "SELECT call_id, run_id, record, status, executing_on FROM calls WHERE status = 'pending' AND ",
    of_a_live_run!(),
    " ORDER BY requested_at, run_id, call_id"
);
/// That the run whose id is `$1` has not been aborted, for the changes that settle or begin one of its calls.
const NOT_ABORTED: &str = "NOT EXISTS (SELECT 1 FROM runs WHERE id = $1 AND abort IS NOT NULL)";
/// When the next pending call expires, after a time already swept.
pub(super) const NEXT_EXPIRY: &str = concat!(
    "SELECT MIN(expires_at) FROM calls WHERE status = 'pending' AND expires_at > $1 AND ",
    of_a_live_run!()
);
/// The condition of the index of unfinished runs, in both databases' forms: SQLite's index holds the runs without
/// an end (a run's wait and resumption then leave it alone), PostgreSQL's the runs running or waiting. The two
/// are the same runs: a run's end, the one change that takes it out of both, records when it ended. A macro, so
/// that constant queries can be made of it with `concat!`.
macro_rules! unfinished {
    () => {
        "finished_at IS NULL AND state IN ('running', 'waiting')"
    };
}
pub(super) const UNFINISHED: &str = unfinished!();
/// The runs not finished.
pub(super) const UNFINISHED_RUNS: &str = concat!("SELECT id FROM runs WHERE ", unfinished!());

/// Appends taken from the queue into a transaction, written once it commits ([`SqlStore::appends_written`]).
#[must_use]
#[derive(Default)]
pub(super) struct Taken {
    /// Each run's newest sequence number, for its readers.
    touched: Vec<(RunId, u64)>,
    /// How many appends were ever queued when these were taken, if all of them were.
    through: Option<u64>,
    /// The runs the database had refused appends of, taken here: no longer refused once written.
    cleared: Vec<RunId>,
    /// Appends were left queued (a refused run's): those who wait for one run's look again once these are written.
    left: bool,
    /// On PostgreSQL, the run of each append taken (see [`Appends::in_flight`](super::Appends::in_flight)).
    in_flight: Vec<RunId>,
}

impl Taken {
    /// Nothing taken, but everything queued through `through` is written or gone.
    pub(super) fn through(through: u64) -> Self {
        Self {
            through: Some(through),
            ..Self::default()
        }
    }
}

/// Queued appends that could not be written: the database refused one of `run_id`'s, or (`None`) the transaction.
pub(super) struct AppendFailed {
    run_id: Option<RunId>,
    error: StoreError,
}

impl AppendFailed {
    fn of_tx(error: DbError) -> Self {
        Self {
            run_id: None,
            error: unavailable(error),
        }
    }
}

impl SqlStore {
    /// Takes the queued appends `take` picks into `tx`. Only a transaction holding the writer takes the queue
    /// (SQLite's one writer connection; on PostgreSQL only the appender takes it), so each run's events keep the
    /// order they were appended in, and come before what `tx` appends itself. If `tx` rolls back, they go back to
    /// the front of the queue. `None` when there were none.
    ///
    /// When finishing (see [`Take::Change`](super::Take::Change)): the run's events queued last (after its last
    /// call result, if any) are not written here but returned, for the end to write before its own in the one
    /// update of the run's row it makes anyway. Its end checks the same claim their append would have.
    async fn take_appends_in(
        &self,
        tx: &mut Tx,
        take: super::Take<'_>,
    ) -> Result<Option<(Taken, Vec<NewEvent>)>, AppendFailed> {
        let (batch, through, cleared, in_flight) = {
            let mut appends = self.appends.lock();
            if appends.queue.is_empty() {
                return Ok(None);
            }
            let (batch, all) = appends.take(take);
            if batch.is_empty() {
                return Ok(None);
            }
            let mut cleared: Vec<RunId> = Vec::new();
            if !appends.refused.is_empty() {
                for queued in &batch {
                    let run_id = queued.run_id();
                    if appends.refused.contains_key(run_id) && !cleared.contains(run_id) {
                        cleared.push(run_id.clone());
                    }
                }
            }
            let in_flight: Vec<RunId> = match self.dialect {
                super::Dialect::Postgres => {
                    let runs: Vec<RunId> =
                        batch.iter().map(|queued| queued.run_id().clone()).collect();
                    for run_id in &runs {
                        *appends.in_flight.entry(run_id.clone()).or_default() += 1;
                    }
                    runs
                }
                super::Dialect::Sqlite => Vec::new(),
            };
            (
                super::coalesce(batch),
                all.then_some(appends.queued),
                cleared,
                in_flight,
            )
        };
        let finishing = match take {
            super::Take::Change {
                run,
                finishing: Some(epoch),
            } => Some((run, epoch)),
            _ => None,
        };
        if !in_flight.is_empty() {
            // Whatever ends the take early (a failed statement, a cancel, a panic), what it took lands.
            let (appends, landed) = (Arc::clone(&self.appends), in_flight.clone());
            tx.after_rollback(move || appends.lock().landed(&landed));
        }
        let held = finishing.and_then(|(run_id, epoch)| {
            let last = batch.iter().rposition(|queued| queued.run_id() == run_id)?;
            match &batch[last] {
                super::Queued::Events(_, queued_epoch, events) if *queued_epoch == epoch => {
                    Some((last, events.clone()))
                }
                _ => None,
            }
        });
        let mut touched = Vec::new();
        let mut failed = None;
        for (index, queued) in batch.iter().enumerate() {
            if held.as_ref().is_some_and(|(last, _)| *last == index) {
                continue;
            }
            let written = match queued {
                // A writer that lost the run appends nothing: its events are dropped here, not written late.
                super::Queued::Events(run_id, epoch, events) => self
                    .append_in(tx, run_id, events, Some((&self.instance, *epoch)))
                    .await
                    .map_err(unavailable),
                super::Queued::Settled(result) => match self.settle_in(tx, result).await {
                    // A call whose row cannot be read fails alone (it stays executing, and the next start records it
                    // interrupted), not every change that takes the queue.
                    Err(StoreError::Corrupt(error)) => {
                        tracing::error!(run_id = %result.run_id, call_id = %result.call_id, %error, "cannot record a call's result");
                        Ok(None)
                    }
                    settled => settled.map(Option::flatten),
                },
            };
            match written {
                Ok(Some(seq)) => touched.push((queued.run_id().clone(), seq)),
                Ok(None) => {}
                Err(error) => {
                    failed = Some(AppendFailed {
                        run_id: Some(queued.run_id().clone()),
                        error,
                    });
                    break;
                }
            }
        }
        let (appends, wake) = (Arc::clone(&self.appends), Arc::clone(&self.appended));
        tx.after_rollback(move || {
            let mut appends = appends.lock();
            let later = std::mem::replace(&mut appends.queue, batch);
            appends.queue.extend(later);
            drop(appends);
            wake.notify_one();
        });
        match failed {
            Some(failed) => Err(failed),
            None => Ok(Some((
                Taken {
                    touched,
                    left: through.is_none(),
                    through,
                    cleared,
                    in_flight,
                },
                held.map(|(_, events)| events).unwrap_or_default(),
            ))),
        }
    }

    /// Writes what settling calls of a run gave (its events, if any, and its audit entries) and commits `tx`, as
    /// [`Self::commit_change`] does.
    async fn commit_settled(
        &self,
        mut tx: Tx,
        taken: Taken,
        run_id: &RunId,
        events: &[NewEvent],
        audit: &[AuditEntry],
    ) -> StoreResult<Option<u64>> {
        let seq = if events.is_empty() {
            None
        } else {
            self.append_in(&mut tx, run_id, events, None)
                .await
                .map_err(unavailable)?
        };
        audit_in(&mut tx, audit).await.map_err(unavailable)?;
        self.commit_change(tx, taken, seq.map(|seq| (run_id.clone(), seq)))
            .await?;
        Ok(seq)
    }

    /// Commits `tx`. Once it committed, the appends it took are written and `run`, if any, is committed through its
    /// sequence number (its readers wake): with the commit itself, even if this future is dropped while it waits for
    /// the commit of its group (SQLite).
    async fn commit_change(
        &self,
        mut tx: Tx,
        taken: Taken,
        run: Option<(RunId, u64)>,
    ) -> StoreResult<()> {
        let me = self.me.clone();
        tx.after_commit(move || {
            if let Some(store) = me.upgrade() {
                store.appends_written(taken);
                if let Some((run_id, seq)) = &run {
                    store.touched(run_id, *seq);
                }
            }
        });
        tx.commit().await.map_err(unavailable)
    }

    /// The appends `taken` committed: their readers wake, and whoever waits for them to be written goes on.
    pub(super) fn appends_written(&self, taken: Taken) {
        if !taken.cleared.is_empty() || !taken.in_flight.is_empty() {
            let mut appends = self.appends.lock();
            for run_id in &taken.cleared {
                appends.refused.remove(run_id);
            }
            appends.landed(&taken.in_flight);
        }
        for (run_id, seq) in taken.touched {
            self.touched(&run_id, seq);
        }
        match taken.through {
            Some(through) => {
                self.written.send_if_modified(|written| {
                    let before = *written;
                    *written = before.max(through);
                    *written != before
                });
            }
            // Whoever waits for one run's appends looks again (see `flush_run`).
            None if taken.left => self.written.send_modify(|_| {}),
            None => {}
        }
    }

    /// Writes what the queue holds (the appender's group commit): the appends of the runs the database refused
    /// none of, in a transaction of their own, then each refused run's that are due to be tried again, alone. Whether
    /// the first wrote anything; `Err` when it failed, and then the appender tries again after a while. A run's
    /// appends refused once more after [`APPEND_TRIES`](super::APPEND_TRIES) tries again lose their events.
    pub(super) async fn write_queued(&self) -> StoreResult<bool> {
        let wrote = match self.write_taken(super::Take::Group).await {
            Ok(wrote) => wrote,
            Err(failed) => {
                if let Some(run_id) = &failed.run_id {
                    self.appends.lock().mark_refused(run_id);
                }
                return Err(failed.error);
            }
        };
        let due = self.appends.lock().refused_due(tokio::time::Instant::now());
        for run_id in due {
            if let Err(failed) = self.write_taken(super::Take::Refused(&run_id)).await {
                let times = self.appends.lock().mark_refused(&run_id);
                if times <= super::APPEND_TRIES {
                    tracing::warn!(%run_id, error = %failed.error, times, "cannot write a run's events; trying again");
                } else {
                    let (lost, _) = self.give_up_events(|queued| queued == &run_id);
                    self.appends.lock().tried_again_later(&run_id);
                    tracing::error!(%run_id, error = %failed.error, events = lost, "cannot write a run's events; they are lost");
                }
            }
        }
        Ok(wrote)
    }

    /// Writes the appends `take` picks in a transaction of its own. Whether there were any.
    async fn write_taken(&self, take: super::Take<'_>) -> Result<bool, AppendFailed> {
        {
            let appends = self.appends.lock();
            if !appends
                .queue
                .iter()
                .any(|queued| take.takes(queued.run_id(), &appends.refused))
            {
                return Ok(false);
            }
        }
        let mut tx = self.writer.begin().await.map_err(AppendFailed::of_tx)?;
        let Some((taken, _)) = self.take_appends_in(&mut tx, take).await? else {
            // A state change took them first.
            return Ok(false);
        };
        self.commit_change(tx, taken, None)
            .await
            .map_err(|error| AppendFailed {
                run_id: None,
                error,
            })?;
        Ok(true)
    }

    /// Gives up the queued events of the runs `gives_up` picks; results of calls stay queued. A flush waiting now
    /// is told so. How many events went, and how many appends are left.
    pub(super) fn give_up_events(&self, gives_up: impl Fn(&RunId) -> bool) -> (usize, usize) {
        let mut appends = self.appends.lock();
        let lost = appends.give_up_events(gives_up);
        // Counted first: a flush that sees the appends marked written below sees this too.
        self.gave_up
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        // With nothing left, all that was queued is written or gone; with something left, nothing is marked written
        // (the queue, joined by earlier attempts, no longer says which numbers came before it).
        if appends.queue.is_empty() {
            self.appends_written(Taken::through(appends.queued));
        }
        self.written.send_modify(|_| {});
        (lost, appends.queue.len())
    }

    /// Begins a state change of `run` after the appends queued before it: on SQLite they are written in the same
    /// transaction (one commit instead of two); on PostgreSQL, whose state changes run on several connections at
    /// once, the appender writes them first.
    async fn begin_change(&self, run: &RunId) -> StoreResult<(Tx, Taken)> {
        let (tx, taken, _) = self.begin_finish(run, None).await?;
        Ok((tx, taken))
    }

    /// Begins the change that ends `run` (under the claim `finishing`, if any), like [`Self::begin_change`]; on
    /// SQLite, also returns the run's events queued last, for the end to write first (see
    /// [`Self::take_appends_in`]).
    ///
    /// An append of another run that the database refuses is set aside (see
    /// [`Appends::refused`](super::Appends::refused)) and the change begun again without it; one of `run`'s own
    /// fails the change, which cannot come before it.
    async fn begin_finish(
        &self,
        run: &RunId,
        finishing: Option<Epoch>,
    ) -> StoreResult<(Tx, Taken, Vec<NewEvent>)> {
        if self.dialect == super::Dialect::Postgres {
            // Only this run's: another run's append the database refuses is no reason to wait.
            self.flush_run(run).await;
            let tx = self.writer.begin().await.map_err(unavailable)?;
            return Ok((tx, Taken::default(), Vec::new()));
        }
        // A few tries: when the database refuses everything, this change's own statements fail as well.
        let mut tries = 0;
        loop {
            let mut tx = self.writer.begin().await.map_err(unavailable)?;
            match self
                .take_appends_in(&mut tx, super::Take::Change { run, finishing })
                .await
            {
                Ok(taken) => {
                    let (taken, held) = taken.unwrap_or_default();
                    return Ok((tx, taken, held));
                }
                Err(failed) => {
                    // Rolled back: what it took goes back to the queue.
                    drop(tx);
                    tries += 1;
                    match failed.run_id {
                        Some(other) if &other != run && tries < 3 => {
                            self.appends.lock().mark_refused(&other);
                        }
                        Some(run_id) => {
                            self.appends.lock().mark_refused(&run_id);
                            return Err(failed.error);
                        }
                        None => return Err(failed.error),
                    }
                }
            }
        }
    }

    /// Begins a state change that reads or changes calls: on SQLite after the results of calls queued before it
    /// (written in the same transaction), so that it finds each call as it stands; on PostgreSQL, whose results are
    /// written as they come, at once.
    async fn begin_after_results(&self, run: &RunId) -> StoreResult<(Tx, Taken)> {
        match self.dialect {
            super::Dialect::Sqlite => self.begin_change(run).await,
            super::Dialect::Postgres => Ok((
                self.writer.begin().await.map_err(unavailable)?,
                Taken::default(),
            )),
        }
    }

    /// Queues `queued` for the next group commit and wakes the appender.
    fn enqueue(&self, queued: super::Queued) {
        {
            let mut appends = self.appends.lock();
            appends.queue.push(queued);
            appends.queued += 1;
        }
        self.appended.notify_one();
    }

    /// Whether a result of one of the run's calls waits in the queue (SQLite).
    fn result_queued(&self, run_id: &RunId) -> bool {
        self.appends.lock().queue.iter().any(
            |queued| matches!(queued, super::Queued::Settled(result) if &result.run_id == run_id),
        )
    }

    /// Records a call's result in a change of its own: whether this instance still ran the call.
    async fn settle_now(&self, result: &CallResult) -> StoreResult<bool> {
        let (mut tx, taken) = self.begin_change(&result.run_id).await?;
        let Some(seq) = self.settle_in(&mut tx, result).await? else {
            return Ok(false);
        };
        self.commit_change(tx, taken, seq.map(|seq| (result.run_id.clone(), seq)))
            .await?;
        Ok(true)
    }

    /// Records a call's result in `tx`, if this instance still runs the call (recovery may have declared it
    /// interrupted): its row, its events, its audit entries. `None` when it does not; else the run's newest
    /// sequence number, if the result appended events.
    async fn settle_in(
        &self,
        tx: &mut Tx,
        result: &CallResult,
    ) -> StoreResult<Option<Option<u64>>> {
        lock_run_in(self.dialect, &mut *tx, &result.run_id)
            .await
            .map_err(unavailable)?;
        let row = query(sql!(
            self.dialect,
            |d| "SELECT record, status, executing_on FROM calls WHERE run_id = $1 AND call_id = $2 \
                 AND status = 'executing' AND executing_on = $3{}",
            d.for_update()
        ))
        .bind(result.run_id.as_str())
        .bind(result.call_id.as_str())
        .bind(self.instance.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(unavailable)?;
        let Some(row) = row else {
            return Ok(None);
        };
        let mut record = call_record(&row)?;
        record.status = CallStatus::Settled;
        record.executing_on = None;
        record.output = Some(result.output.clone());
        let changed = query(
            "UPDATE calls SET status = 'settled', record = $3, executing_on = NULL \
             WHERE run_id = $1 AND call_id = $2 AND status = 'executing' AND executing_on = $4",
        )
        .bind(result.run_id.as_str())
        .bind(result.call_id.as_str())
        .bind(json(&record))
        .bind(self.instance.as_str())
        .execute(&mut *tx)
        .await
        .map_err(unavailable)?;
        if changed.rows_affected() != 1 {
            return Ok(None);
        }
        let seq = self
            .append_in(&mut *tx, &result.run_id, &result.events, None)
            .await
            .map_err(unavailable)?;
        audit_in(&mut *tx, &result.audit)
            .await
            .map_err(unavailable)?;
        Ok(Some(seq))
    }

    /// Waits until every append queued so far is written: `Err` when the appender gave up some of them meanwhile
    /// (what the database kept refusing: events are lost, results of calls kept for a later write).
    async fn flush_appends(&self) -> StoreResult<()> {
        use std::sync::atomic::Ordering;
        // Read together: a give-up counts itself before it marks what it gave up as written.
        let (target, gave_up) = {
            let appends = self.appends.lock();
            (appends.queued, self.gave_up.load(Ordering::SeqCst))
        };
        let mut written = self.written.subscribe();
        if *written.borrow_and_update() >= target {
            return Ok(());
        }
        self.flush_now.notify_one();
        self.appended.notify_one();
        let given_up = || {
            (self.gave_up.load(Ordering::SeqCst) != gave_up).then(|| {
                StoreError::Unavailable(
                    "the database refused what was queued for a few seconds; events were lost, and results of calls wait for a later write".into(),
                )
            })
        };
        while *written.borrow_and_update() < target {
            if let Some(error) = given_up() {
                return Err(error);
            }
            if written.changed().await.is_err() {
                return Ok(());
            }
        }
        // A give-up that left nothing queued marks everything written: it was not.
        given_up().map_or(Ok(()), Err)
    }

    /// Waits until none of `run`'s appends is queued or, on PostgreSQL, taken by a transaction not yet ended (each
    /// is written, or its events given up), or until only results of its calls are left queued after a give-up
    /// (results are kept for as long as the database refuses them: a read of the run's calls then goes on with the
    /// database as it is). What a change or a read of that run needs, whatever another run's appends do. (On SQLite
    /// an append taken is in the writer's open group, which a change joins and a read on the writer commits first.)
    async fn flush_run(&self, run: &RunId) {
        use std::sync::atomic::Ordering;
        let gave_up = self.gave_up.load(Ordering::SeqCst);
        loop {
            let mut written = self.written.subscribe();
            {
                let appends = self.appends.lock();
                if !appends.holds(run)
                    || (self.gave_up.load(Ordering::SeqCst) != gave_up
                        && !appends.holds_events(run))
                {
                    return;
                }
            }
            self.flush_now.notify_one();
            self.appended.notify_one();
            if written.changed().await.is_err() {
                return;
            }
        }
    }

    /// The sessions that hold grants. (A stored id that no longer reads as one is left out, with a warning: no
    /// read of grants can name it.)
    pub(super) async fn sessions_with_grants(&self) -> StoreResult<Vec<SessionId>> {
        let rows = query("SELECT DISTINCT session_id FROM grants")
            .fetch_all(&self.reader)
            .await
            .map_err(unavailable)?;
        let mut sessions = Vec::with_capacity(rows.len());
        for row in &rows {
            match session_id(row.try_get(0).map_err(unavailable)?) {
                Ok(session) => sessions.push(session),
                Err(error) => {
                    tracing::warn!(%error, "a grant names a session id that does not read as one")
                }
            }
        }
        Ok(sessions)
    }

    /// Ends a run ([`Store::finish_run`]); with `give_back`, a recovery's end of a resume's run that also gives the
    /// interrupts it took back, in the same change, when nothing of them was acted on ([`Self::give_back_in`]): its
    /// end then has `give_back`'s events instead of its own.
    async fn finish_run_giving_back(
        &self,
        mut finish: FinishRun,
        give_back: Option<GiveBack>,
    ) -> StoreResult<Result<(), Fenced>> {
        let finishing = match finish.claim {
            EndClaim::Held(epoch) => Some(epoch),
            EndClaim::Unended | EndClaim::Waiting | EndClaim::Abandoned { .. } => None,
        };
        let (mut tx, taken, mut events) = self.begin_finish(&finish.run_id, finishing).await?;
        // Before the run's calls go with its end: whether it began any is what the give-back asks, and which the
        // audit lines of a resume that keeps its interrupts. (A resume that did not fail began every call it
        // approved, or was aborted, which said so of each call it stopped.)
        let kept = match give_back {
            Some(give_back) => match self
                .give_back_in(&mut tx, &give_back.parent, &finish.run_id)
                .await?
            {
                Some(mut reopened) => {
                    finish.events = give_back.events;
                    finish.audit.append(&mut reopened);
                    if let Some(tails) = &self.tails {
                        let (tails, parent, child) =
                            (Arc::clone(tails), give_back.parent, finish.run_id.clone());
                        tx.after_commit(move || tails.given_back(&parent, &child));
                    }
                    None
                }
                None => Some((give_back.parent, EndedBefore::Restart)),
            },
            None if finish.state == RunState::Failed => parent_in(&mut tx, &finish.run_id)
                .await?
                .map(|parent| (parent, EndedBefore::Failure)),
            None => None,
        };
        if let Some((parent, ended)) = kept {
            finish
                .audit
                .append(&mut approved_not_begun_in(&mut tx, &parent, &finish.run_id, ended).await?);
        }
        // The run's calls go with its end. Those still pending are settled first: their events come after the
        // run's events queued last and before those of its end, all written by the one update of its row below.
        let mut audit = finish.audit;
        let settle = finish.settle_pending.as_deref();
        let pending =
            take_calls_in(self.dialect, &mut tx, &finish.run_id, settle.is_some()).await?;
        if let Some(settle) = settle {
            for mut record in pending {
                let settlement = settle(&record);
                let (mut settled_events, mut settled_audit) = apply(&mut record, settlement);
                events.append(&mut settled_events);
                audit.append(&mut settled_audit);
            }
        }
        events.append(&mut finish.events);
        let now = now_ms() as i64;
        let conversation = finish.conversation.as_ref().map(json);
        let suspension = finish.suspension.as_ref().map(json);
        // What the tail counts the end at, before the texts go to the statement.
        let ending_bytes = conversation.as_ref().map_or(0, String::len)
            + suspension.as_ref().map_or(0, String::len);
        // The run's end and the room for its last events, in one update of its row, made only under the claim
        // the end is made with ([`EndClaim`]): by the writer that holds the run, by anyone while it has not
        // ended, or by anyone while it waits.
        macro_rules! end_under {
            ($claim:literal) => {
                sql!(
                    self.dialect,
                    |d| "{} runs SET state = $2, owner = NULL, batch = NULL, suspension = $3, \
                     suspension_expires_at = $4, conversation = $5, finished_at = $6, \
                     last_seq = last_seq + $7, event_bytes = event_bytes + $8 \
                     WHERE id = $1 AND {} RETURNING {}, session_id",
                    d.update(),
                    $claim,
                    Self::seq_returning(d)
                )
            };
        }
        let mut end = query(match finish.claim {
            // Interrupts are issued only while the run is not aborted: an abort that nothing of the run heard
            // of (no call began) leaves no interrupt a resume could answer.
            EndClaim::Held(_) if finish.suspension.is_some() => {
                end_under!("state = 'running' AND owner = $9 AND epoch = $10 AND abort IS NULL")
            }
            EndClaim::Held(_) | EndClaim::Abandoned { .. } => {
                end_under!("state = 'running' AND owner = $9 AND epoch = $10")
            }
            EndClaim::Unended => end_under!("state IN ('running', 'waiting')"),
            EndClaim::Waiting => end_under!("state = 'waiting'"),
        })
        .bind(finish.run_id.as_str())
        .bind(finish.state.as_str())
        .bind(suspension)
        .bind(finish.suspension.as_ref().map(|s| s.expires_at() as i64))
        .bind(conversation)
        .bind(now)
        .bind(events.len() as i64)
        .bind(event_bytes(&events));
        match &finish.claim {
            EndClaim::Held(epoch) => {
                end = end.bind(self.instance.as_str()).bind(*epoch as i64);
            }
            EndClaim::Abandoned { owner, epoch } => {
                end = end.bind(owner.as_str()).bind(*epoch as i64);
            }
            EndClaim::Unended | EndClaim::Waiting => {}
        }
        let row = end.fetch_optional(&mut tx).await.map_err(unavailable)?;
        let Some(row) = row else {
            // Not this claim's to end (or not there): the transaction rolls back, and the calls and the queued
            // events it took with it.
            let held = match finish.claim {
                EndClaim::Held(epoch) => Some((self.instance.as_str(), epoch)),
                _ => None,
            };
            return why_not_ended(&mut tx, &finish.run_id, held).await.map(Err);
        };
        let session: String = row.try_get("session_id").map_err(unavailable)?;
        let (last, events_of) = self.room_made(&finish.run_id, &row).map_err(unavailable)?;
        let seq = self
            .insert_events_in(&mut tx, &finish.run_id, last, events_of, &events)
            .await
            .map_err(unavailable)?;
        if !finish.history.is_empty() {
            let next: i64 = query(
                "SELECT COALESCE(MAX(idx), -1) + 1 FROM session_messages WHERE session_id = $1",
            )
            .bind(&session)
            .fetch_one(&mut tx)
            .await
            .and_then(|row| row.try_get(0))
            .map_err(unavailable)?;
            for (offset, message) in finish.history.iter().enumerate() {
                query(
                    "INSERT INTO session_messages (session_id, idx, message) VALUES ($1, $2, $3)",
                )
                .bind(&session)
                .bind(next + offset as i64)
                .bind(json(message))
                .execute(&mut tx)
                .await
                .map_err(unavailable)?;
            }
        }
        query(
            "UPDATE sessions SET active_run = CASE WHEN active_run = $2 THEN NULL ELSE active_run END, \
             updated_at = $3 WHERE id = $1",
        )
        .bind(&session)
        .bind(finish.run_id.as_str())
        .bind(now)
        .execute(&mut tx)
        .await
        .map_err(unavailable)?;
        audit_in(&mut tx, &audit).await.map_err(unavailable)?;
        if let Some(tails) = &self.tails {
            let (tails, run_id) = (Arc::clone(tails), finish.run_id.clone());
            let ending = tail::Ending {
                bytes: ending_bytes,
                conversation: finish.conversation.map(Arc::from),
                suspension: finish.suspension,
            };
            tx.after_commit(move || tails.finished(&run_id, seq, ending));
        }
        self.commit_change(tx, taken, Some((finish.run_id.clone(), seq)))
            .await?;
        Ok(Ok(()))
    }

    /// In a recovery's end of `child`, a resume's run whose process died: gives back the interrupts of `parent` it
    /// took when nothing of its answers was acted on, and returns the audit lines that say so (`None`: kept). That is
    /// when it began none of the calls it resumed (it has no call), made no session grant, and was not aborted, and
    /// while the interrupts have not expired. The interrupts are then open again, as before the resume, and the next
    /// resume answers them; otherwise the answers would be lost, the resume refused as used. The child is fenced (no
    /// call of it begins any more), or has no owner, before this is asked.
    async fn give_back_in(
        &self,
        tx: &mut Tx,
        parent: &RunId,
        child: &RunId,
    ) -> StoreResult<Option<Vec<AuditEntry>>> {
        // A grant the child made names it (`"runId":"<id>"` in the grant's JSON); a `_` in the id, a wildcard of
        // LIKE, can only find more, and keep the interrupts used.
        let made_by_child = format!("%\"runId\":\"{child}\"%");
        let given_back = query(sql!(self.dialect, |d|
            "{} runs SET resumed_by = NULL WHERE id = $1 AND resumed_by = $2 AND suspension_expires_at > $3 \
             AND NOT EXISTS (SELECT 1 FROM calls WHERE run_id = $2) \
             AND NOT EXISTS (SELECT 1 FROM runs AS child WHERE child.id = $2 AND child.abort IS NOT NULL) \
             AND NOT EXISTS (SELECT 1 FROM grants WHERE grant_json LIKE $4) \
             RETURNING suspension",
            d.update()
        ))
        .bind(parent.as_str())
        .bind(child.as_str())
        .bind(now_ms() as i64)
        .bind(made_by_child)
        .fetch_optional(&mut *tx)
        .await
        .map_err(unavailable)?;
        let Some(row) = given_back else {
            return Ok(None);
        };
        let suspension: Option<String> = row.try_get(0).map_err(unavailable)?;
        let Some(suspension) = suspension else {
            return Ok(None);
        };
        let at = now_ms();
        // The interrupts are open again whatever the text holds; one that does not read (a damaged disk, a newer
        // version's) costs the audit log its lines by call, never the recovery, which would stop every start.
        let suspension: Suspension = match parse(&suspension, "a suspension") {
            Ok(suspension) => suspension,
            Err(error) => {
                tracing::warn!(%parent, %error, "the interrupts of a run given back by a recovery do not read");
                return Ok(Some(vec![AuditEntry {
                    run_id: Some(parent.clone()),
                    source: Some("restart".to_owned()),
                    reason: Some(format!(
                        "The server stopped before run {child}, which resumed with the answers to this run's interrupts, began any call; nothing of it was acted on, and the interrupts are open again. They could not be listed: {error}"
                    )),
                    at,
                    ..AuditEntry::new(AuditKind::ApprovalRequested, "reopened")
                }]));
            }
        };
        Ok(Some(
            suspension
                .interrupts
                .iter()
                .map(|issued| AuditEntry {
                    session_id: Some(suspension.session_id.clone()),
                    run_id: Some(parent.clone()),
                    tool_call_id: Some(issued.request.tool_call_id.clone()),
                    tool: Some(issued.request.tool_name.clone()),
                    arguments_digest: Some(issued.digest.clone()),
                    source: Some("restart".to_owned()),
                    reason: Some(format!(
                        "The server stopped before run {child}, which resumed with the answer to this interrupt, began any call; nothing of it was acted on, and the interrupt is open again."
                    )),
                    at,
                    ..AuditEntry::new(AuditKind::ApprovalRequested, "reopened")
                })
                .collect(),
        ))
    }

    async fn start_run_tx(&self, run: NewRun) -> StoreResult<Result<Epoch, StartConflict>> {
        // A taken run id is refused first, before anything else that refuses the start: by the insert of the run's
        // row, which comes last, or, when something before it refuses the start, by a read then.
        let mut tx = self.writer.begin().await.map_err(unavailable)?;
        if let Some(parent) = &run.parent_run_id
            && let Err(refused) = take_interrupt_in(&mut tx, parent, &run.run_id).await?
        {
            return refused_unless_taken(&mut tx, run.run_id, StartConflict::Resume(refused)).await;
        }
        if let (Some(parent), Some(tails)) = (&run.parent_run_id, &self.tails) {
            let (tails, parent, by) = (Arc::clone(tails), parent.clone(), run.run_id.clone());
            tx.after_commit(move || tails.resumed(&parent, &by));
        }
        // The session's claim for the run, in one statement: a new session is created with it; one that exists is
        // claimed only while no run is going in it (no row comes back when one is).
        let title = title_of(&run.message);
        let claimed = query(sql!(self.dialect, |d|
            "{} INTO sessions (id, title, created_at, updated_at, active_run, run_count) \
             VALUES ($1, $4, $3, $3, $2, 1) \
             ON CONFLICT (id) DO UPDATE SET active_run = excluded.active_run, run_count = sessions.run_count + 1, \
             updated_at = excluded.updated_at, \
             title = CASE WHEN sessions.title = '' THEN excluded.title ELSE sessions.title END \
             WHERE sessions.active_run IS NULL RETURNING run_count",
            d.insert()
        ))
        .bind(run.session_id.as_str())
        .bind(run.run_id.as_str())
        .bind(run.at as i64)
        .bind(title)
        .fetch_optional(&mut tx)
        .await
        .map_err(unavailable)?;
        let Some(claimed) = claimed else {
            let active: Option<String> = query("SELECT active_run FROM sessions WHERE id = $1")
                .bind(run.session_id.as_str())
                .fetch_one(&mut tx)
                .await
                .and_then(|row| row.try_get(0))
                .map_err(unavailable)?;
            let busy = StartConflict::SessionBusy {
                session_id: run.session_id,
                active: run_id(active.unwrap_or_default())?,
            };
            return refused_unless_taken(&mut tx, run.run_id, busy).await;
        };
        let ordinal: i64 = claimed.try_get(0).map_err(unavailable)?;
        // After the claim: on PostgreSQL a run of the session that ends meanwhile holds the session's row until it
        // committed, the claim waits for it, and (under READ COMMITTED) an interrupt that run opened is seen here.
        // The session's first run has no earlier run whose interrupt it could meet (only a start adds a run to a
        // session, and counts it), so it reads nothing.
        if run.refused_while_interrupted
            && run.parent_run_id.is_none()
            && ordinal > 1
            && let Some((waiting, expires_at)) = open_interrupt_in(&mut tx, &run.session_id).await?
            && expires_at > run.at
        {
            let interrupted = StartConflict::Interrupted {
                session_id: run.session_id,
                waiting,
            };
            return refused_unless_taken(&mut tx, run.run_id, interrupted).await;
        }
        // The run's row, with room for its first events: their numbers are known (1 to their count), and so is,
        // on SQLite, the run's number, which the insert gives the row (nothing to return, so no table for it). A
        // taken id writes nothing, and the start is refused (what it did so far is undone with its transaction).
        let inserted = query(sql!(self.dialect, |d|
            "{} INTO runs (id, session_id, ordinal, parent_run_id, mode, state, owner, epoch, last_seq, \
             event_bytes, message, created_at) VALUES ($1, $2, $3, $4, $5, 'running', $6, 1, $9, $10, $7, $8) \
             ON CONFLICT (id) DO NOTHING",
            d.insert(),
        ))
        .bind(run.run_id.as_str())
        .bind(run.session_id.as_str())
        .bind(ordinal)
        .bind(run.parent_run_id.as_ref().map(|r| r.as_str().to_owned()))
        .bind(mode_str(run.mode))
        .bind(self.instance.as_str())
        .bind(run.message.clone())
        .bind(run.at as i64)
        .bind(run.events.len() as i64)
        .bind(event_bytes(&run.events))
        .execute(&mut tx)
        .await
        .map_err(unavailable)?;
        if inserted.rows_affected() == 0 {
            return Ok(Err(StartConflict::RunIdTaken(run.run_id)));
        }
        let seq = if run.events.is_empty() {
            0
        } else {
            let events_of = self
                .events_of(&run.run_id, || {
                    inserted.inserted_row().ok_or_else(|| {
                        DbError::Decode(format!("the row of run {} was not written", run.run_id))
                    })
                })
                .map_err(unavailable)?;
            self.insert_events_in(
                &mut tx,
                &run.run_id,
                run.events.len() as i64,
                events_of,
                &run.events,
            )
            .await
            .map_err(unavailable)?
        };
        audit_in(&mut tx, &run.audit).await.map_err(unavailable)?;
        self.doorbell(&mut tx, || format!("session {} {ordinal}", run.session_id))
            .await
            .map_err(unavailable)?;
        let (me, run_id, session_id) = (self.me.clone(), run.run_id.clone(), run.session_id);
        tx.after_commit(move || {
            if let Some(store) = me.upgrade() {
                if let Some(tails) = &store.tails {
                    tails.started(&run_id, seq);
                }
                store.sessions.notify(&session_id, ordinal as u64);
            }
        });
        self.commit_change(tx, Taken::default(), Some((run.run_id, seq)))
            .await?;
        Ok(Ok(1))
    }

    async fn open_batch_tx(&self, batch: OpenBatch) -> StoreResult<Result<(), Fenced>> {
        let (mut tx, taken) = self.begin_change(&batch.run_id).await?;
        let row = query(sql!(
            self.dialect,
            |d| "SELECT state, owner, epoch, abort FROM runs WHERE id = $1{}",
            d.for_update()
        ))
        .bind(batch.run_id.as_str())
        .fetch_optional(&mut tx)
        .await
        .map_err(unavailable)?;
        let Some(row) = row else {
            return Ok(Err(Fenced::Lost));
        };
        let state: String = row.try_get("state").map_err(unavailable)?;
        let owner: Option<String> = row.try_get("owner").map_err(unavailable)?;
        let epoch: i64 = row.try_get("epoch").map_err(unavailable)?;
        let abort: Option<String> = row.try_get("abort").map_err(unavailable)?;
        if state != "running"
            || owner.as_deref() != Some(self.instance.as_str())
            || epoch as u64 != batch.epoch
        {
            return Ok(Err(Fenced::Lost));
        }
        if let Some(reason) = abort.as_deref().and_then(AbortReason::parse) {
            return Ok(Err(Fenced::Aborted(reason)));
        }
        query("UPDATE runs SET state = 'waiting', owner = NULL, batch = $2 WHERE id = $1")
            .bind(batch.run_id.as_str())
            .bind(json(&batch.batch))
            .execute(&mut tx)
            .await
            .map_err(unavailable)?;
        query("DELETE FROM calls WHERE run_id = $1")
            .bind(batch.run_id.as_str())
            .execute(&mut tx)
            .await
            .map_err(unavailable)?;
        for (index, record) in batch.calls.iter().enumerate() {
            query(
                "INSERT INTO calls (run_id, call_id, idx, status, record, requested_at, expires_at, executing_on) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, NULL)",
            )
            .bind(batch.run_id.as_str())
            .bind(record.call.id.as_str())
            .bind(index as i64)
            .bind(record.status.as_str())
            .bind(json(record))
            .bind(record.approval.as_ref().map(|a| a.requested_at as i64))
            .bind(record.approval.as_ref().map(|a| a.expires_at as i64))
            .execute(&mut tx)
            .await
            .map_err(unavailable)?;
        }
        let seq = match self
            .append_in(&mut tx, &batch.run_id, &batch.events, None)
            .await
            .map_err(unavailable)?
        {
            Some(seq) => seq,
            None => last_seq_in(&mut tx, &batch.run_id)
                .await
                .map_err(unavailable)?,
        };
        audit_in(&mut tx, &batch.audit).await.map_err(unavailable)?;
        self.commit_change(tx, taken, Some((batch.run_id.clone(), seq)))
            .await?;
        Ok(Ok(()))
    }

    /// Settles calls of one run with `settle`, the ones `pick` picks, inside `tx`; appends their events.
    async fn settle_calls_in(
        &self,
        connection: &mut Tx,
        run_id: &RunId,
        pick: &[CallStatus],
        settle: &(dyn Fn(&CallRecord) -> Settlement + Send + Sync),
    ) -> StoreResult<(Vec<CallRecord>, Vec<AuditEntry>, Option<u64>)> {
        lock_run_in(self.dialect, &mut *connection, run_id)
            .await
            .map_err(unavailable)?;
        let rows = query(sql!(
            self.dialect,
            |d| "SELECT call_id, run_id, record, status, executing_on FROM calls WHERE run_id = $1 ORDER BY idx{}",
            d.for_update()
        ))
        .bind(run_id.as_str())
        .fetch_all(&mut *connection)
        .await
        .map_err(unavailable)?;
        let mut settled = Vec::new();
        let mut events = Vec::new();
        let mut audit = Vec::new();
        for row in &rows {
            // Only the calls picked are read: a row this version cannot read fails nothing it does not settle.
            let status: String = row.try_get("status").map_err(unavailable)?;
            if !CallStatus::parse(&status).is_some_and(|status| pick.contains(&status)) {
                continue;
            }
            // One picked that does not read is left as it is, and the rest settled: the claim of a run aborted
            // with such a call still to settle settles it where it reads, or ends the run (see `claim_batch`).
            let Some(mut record) = self.readable(row, "a call to settle cannot be read here")?
            else {
                continue;
            };
            let settlement = settle(&record);
            let (mut record_events, mut record_audit) = apply(&mut record, settlement);
            save_call(&mut *connection, &record)
                .await
                .map_err(unavailable)?;
            events.append(&mut record_events);
            audit.append(&mut record_audit);
            settled.push(record);
        }
        let seq = if events.is_empty() {
            None
        } else {
            self.append_in(&mut *connection, run_id, &events, None)
                .await
                .map_err(unavailable)?
        };
        Ok((settled, audit, seq))
    }

    /// Deletes the sessions idle since `idle_before` (milliseconds) that have no run left (retention took the
    /// last) and none going, with their conversations and grants. The conditions are checked again by the delete
    /// itself, in its own transaction: a run that starts in the session meanwhile (on another instance, say)
    /// keeps it.
    async fn prune_sessions(&self, idle_before: u64) -> StoreResult<()> {
        const IDLE_WITHOUT_RUNS: &str = "active_run IS NULL AND updated_at <= $2 \
             AND NOT EXISTS (SELECT 1 FROM runs WHERE runs.session_id = sessions.id)";
        let stale = format!(
            "SELECT id FROM sessions WHERE id > $1 AND {IDLE_WITHOUT_RUNS} ORDER BY id LIMIT 1000"
        );
        let delete = format!("DELETE FROM sessions WHERE id = $1 AND {IDLE_WITHOUT_RUNS}");
        let mut after = String::new();
        loop {
            let ids: Vec<String> = query(stale.as_str())
                .bind(&after)
                .bind(idle_before as i64)
                .fetch_all(&self.reader)
                .await
                .and_then(|rows| rows.iter().map(|row| row.try_get(0)).collect())
                .map_err(unavailable)?;
            let Some(last) = ids.last() else {
                return Ok(());
            };
            after = last.clone();
            for id in ids {
                let mut tx = self.writer.begin().await.map_err(unavailable)?;
                let deleted = query(delete.as_str())
                    .bind(&id)
                    .bind(idle_before as i64)
                    .execute(&mut tx)
                    .await
                    .map_err(unavailable)?;
                if deleted.rows_affected() == 1 {
                    let statements = [
                        "DELETE FROM session_messages WHERE session_id = $1",
                        "DELETE FROM grants WHERE session_id = $1",
                    ];
                    execute_each(&mut tx, &statements, &id)
                        .await
                        .map_err(unavailable)?;
                }
                tx.commit().await.map_err(unavailable)?;
            }
        }
    }

    /// Times out one run's due approvals, in a transaction of its own: the records it settled, once committed.
    async fn expire_run(
        &self,
        run_id: &RunId,
        now_ms: u64,
        settle: &SettleExpired,
    ) -> StoreResult<Vec<CallRecord>> {
        let mut expired = Vec::new();
        // After the results queued before it, so that the run's log keeps the order things happened in.
        let (mut tx, taken) = self.begin_after_results(run_id).await?;
        lock_run_in(self.dialect, &mut tx, run_id)
            .await
            .map_err(unavailable)?;
        // Not a call an abort left (it could not read it): that one is settled by the run's claim, as
        // the abort would have.
        let rows = query(sql!(
            self.dialect,
            |d| "SELECT call_id, run_id, record, status, executing_on FROM calls WHERE run_id = $1 \
             AND status = 'pending' AND expires_at <= $2 AND {NOT_ABORTED} ORDER BY idx{}",
            d.for_update()
        ))
        .bind(run_id.as_str())
        .bind(now_ms as i64)
        .fetch_all(&mut tx)
        .await
        .map_err(unavailable)?;
        let mut events = Vec::new();
        let mut audit = Vec::new();
        for row in &rows {
            // A row this version cannot read is left pending (an instance that can read it times it out)
            // and does not keep the other runs' approvals from timing out.
            let Some(mut record) = self.readable(row, "a due approval cannot be read here")? else {
                continue;
            };
            let settlement = settle(&record);
            let (mut e, mut a) = apply(&mut record, settlement);
            let changed = query(
                "UPDATE calls SET status = $3, record = $4 WHERE run_id = $1 AND call_id = $2 AND status = 'pending'",
            )
            .bind(run_id.as_str())
            .bind(record.call.id.as_str())
            .bind(record.status.as_str())
            .bind(json(&record))
            .execute(&mut tx)
            .await
            .map_err(unavailable)?;
            if changed.rows_affected() == 1 {
                events.append(&mut e);
                audit.append(&mut a);
                expired.push(record);
            }
        }
        // A run none of whose due calls was settled here (one this version cannot read, or decided
        // meanwhile) has nothing appended, and nobody is rung for it.
        self.commit_settled(tx, taken, run_id, &events, &audit)
            .await?;
        Ok(expired)
    }
}

/// A session's summary, as listed (the columns [`session_summary`] reads).
const SESSION_SUMMARY: &str = "SELECT id, title, created_at, updated_at, run_count FROM sessions";

fn session_summary(row: &Row) -> StoreResult<SessionSummary> {
    Ok(SessionSummary {
        session_id: session_id(row.try_get(0).map_err(unavailable)?)?,
        title: row.try_get(1).map_err(unavailable)?,
        created_at: row.try_get::<i64, _>(2).map_err(unavailable)? as u64,
        updated_at: row.try_get::<i64, _>(3).map_err(unavailable)? as u64,
        runs: row.try_get::<i64, _>(4).map_err(unavailable)? as u64,
    })
}

impl Store for SqlStore {
    fn kind(&self) -> StoreKind {
        self.store_kind()
    }

    fn instance(&self) -> &InstanceId {
        &self.instance
    }

    fn start_run(&self, run: NewRun) -> StoreFuture<'_, Result<Epoch, StartConflict>> {
        self.start_run_tx(run).boxed()
    }

    fn append(&self, run_id: &RunId, epoch: Epoch, events: Vec<NewEvent>) {
        if events.is_empty() {
            return;
        }
        self.enqueue(super::Queued::Events(run_id.clone(), epoch, events));
    }

    fn flush(&self) -> StoreFuture<'_, ()> {
        self.flush_appends().boxed()
    }

    fn close(&self) -> StoreFuture<'_, ()> {
        async move {
            let flushed = self.flush_appends().await;
            self.retire().await?;
            flushed
        }
        .boxed()
    }

    fn remote_stops(&self) -> tokio::sync::broadcast::Receiver<RemoteStop> {
        self.stops.subscribe()
    }

    fn open_batch(&self, batch: OpenBatch) -> StoreFuture<'_, Result<(), Fenced>> {
        self.open_batch_tx(batch).boxed()
    }

    fn decide(
        &self,
        run_id: &RunId,
        call_id: &ToolCallId,
        settle: Settle,
    ) -> StoreFuture<'_, Result<CallRecord, DecideFailure>> {
        let run_id = run_id.clone();
        let call_id = call_id.clone();
        async move {
            let (mut tx, taken) = self.begin_after_results(&run_id).await?;
            lock_run_in(self.dialect, &mut tx, &run_id)
                .await
                .map_err(unavailable)?;
            // A call of an aborted run is not decided: its abort settled every call it could read, and one it could
            // not stays as it was, for no decision (see `settle_calls_in`).
            let row = query(sql!(self.dialect, |d|
                "SELECT record, status, executing_on FROM calls WHERE run_id = $1 AND call_id = $2 AND status = 'pending' \
                 AND {NOT_ABORTED}{}",
                d.for_update()
            ))
            .bind(run_id.as_str())
            .bind(call_id.as_str())
            .fetch_optional(&mut tx)
            .await
            .map_err(unavailable)?;
            let Some(row) = row else {
                return Ok(Err(DecideFailure::NotPending));
            };
            let mut record = call_record(&row)?;
            let mut settlement = match settle(&record) {
                Ok(settlement) => settlement,
                Err(failure) => return Ok(Err(failure)),
            };
            // An approval that stands on a session grant needs the grant still held. On PostgreSQL the row is read
            // `FOR SHARE`, so that a revoke's delete waits for this change or this change finds the grant gone.
            if let Some(grant_id) = &settlement.under_grant {
                let held = query(sql!(self.dialect, |d|
                    "SELECT 1 FROM grants WHERE session_id = (SELECT session_id FROM runs WHERE id = $1) AND id = $2{}",
                    d.for_share()
                ))
                .bind(run_id.as_str())
                .bind(grant_id.as_str())
                .fetch_optional(&mut tx)
                .await
                .map_err(unavailable)?;
                if held.is_none() {
                    return Ok(Err(DecideFailure::GrantRevoked));
                }
            }
            // A grant the decision makes is kept with it: whoever sees the decision finds the grant.
            if let Some(grant) = settlement.grant.take() {
                let session: String = query("SELECT session_id FROM runs WHERE id = $1")
                    .bind(run_id.as_str())
                    .fetch_one(&mut tx)
                    .await
                    .map_err(unavailable)?
                    .try_get(0)
                    .map_err(unavailable)?;
                self.grant_in(&mut tx, &session_id(session)?, &grant).await?;
            }
            let (events, audit) = apply(&mut record, settlement);
            // Only a pending call passes: exactly one decision wins, in this process or another.
            let changed = query(
                "UPDATE calls SET status = $3, record = $4 WHERE run_id = $1 AND call_id = $2 AND status = 'pending'",
            )
            .bind(run_id.as_str())
            .bind(call_id.as_str())
            .bind(record.status.as_str())
            .bind(json(&record))
            .execute(&mut tx)
            .await
            .map_err(unavailable)?;
            if changed.rows_affected() != 1 {
                return Ok(Err(DecideFailure::NotPending));
            }
            self.commit_settled(tx, taken, &run_id, &events, &audit)
                .await?;
            Ok(Ok(record))
        }
        .boxed()
    }

    fn expire(&self, now_ms: u64, settle: SettleExpired) -> StoreFuture<'_, Vec<CallRecord>> {
        async move {
            let rows = query(DUE_CALLS)
                .bind(now_ms as i64)
                .fetch_all(&self.reader)
                .await
                .map_err(unavailable)?;
            let mut due = std::collections::BTreeSet::new();
            for row in &rows {
                due.insert(run_id(row.try_get(0).map_err(unavailable)?)?);
            }
            // Each run's expiry commits alone: one that fails is left due, for the next sweep, and neither undoes
            // nor hides the runs expired before it (their records are what their runs are advanced by).
            let mut expired = Vec::new();
            let mut failure = None;
            for run_id in due {
                match self.expire_run(&run_id, now_ms, &settle).await {
                    Ok(mut records) => expired.append(&mut records),
                    Err(error) => {
                        tracing::warn!(%run_id, %error, "cannot time out the run's due approvals");
                        failure.get_or_insert(error);
                    }
                }
            }
            match failure {
                Some(error) if expired.is_empty() => Err(error),
                _ => Ok(expired),
            }
        }
        .boxed()
    }

    fn next_expiry(&self, after_ms: u64) -> StoreFuture<'_, Option<u64>> {
        async move {
            let row = query(NEXT_EXPIRY)
                .bind(after_ms as i64)
                .fetch_one(&self.reader)
                .await
                .map_err(unavailable)?;
            Ok(row
                .try_get::<Option<i64>, _>(0)
                .map_err(unavailable)?
                .map(|at| at as u64))
        }
        .boxed()
    }

    fn begin_call(
        &self,
        run_id: &RunId,
        call_id: &ToolCallId,
        inline: Option<(CallRecord, Epoch)>,
    ) -> StoreFuture<'_, Option<CallRecord>> {
        let run_id = run_id.clone();
        let call_id = call_id.clone();
        async move {
            let (mut tx, taken) = self.begin_after_results(&run_id).await?;
            if !self.alive_in(&mut tx).await? {
                // This instance's lease ran out: another may be taking its work over. It starts nothing.
                return Ok(None);
            }
            let begun = match inline {
                Some((mut record, epoch)) => {
                    // The run must still be this instance's, at this epoch, and not aborted, in this very
                    // transaction: an abort recorded before its task heard of it (or on another instance) begins
                    // nothing.
                    let held = query(sql!(
                        self.dialect,
                        |d| "SELECT 1 FROM runs WHERE id = $1 AND state = 'running' AND owner = $2 AND epoch = $3 AND abort IS NULL{}",
                        d.for_update()
                    ))
                    .bind(run_id.as_str())
                    .bind(self.instance.as_str())
                    .bind(epoch as i64)
                    .fetch_optional(&mut tx)
                    .await
                    .map_err(unavailable)?;
                    if held.is_none() {
                        return Ok(None);
                    }
                    record.status = CallStatus::Executing;
                    record.executing_on = Some(self.instance.clone());
                    // A call of an earlier batch with the same id (ids are the model's) gives way, and the new one
                    // comes after every other; one of this batch does not, and nothing is written.
                    let inserted = query(begin_inline_call(self.dialect))
                        .bind(run_id.as_str())
                        .bind(call_id.as_str())
                        .bind(record.status.as_str())
                        .bind(json(&record))
                        .bind(self.instance.as_str())
                        .fetch_optional(&mut tx)
                        .await
                        .map_err(unavailable)?;
                    inserted.map(|_| record)
                }
                None => {
                    lock_run_in(self.dialect, &mut tx, &run_id)
                        .await
                        .map_err(unavailable)?;
                    // Nor is a call of an aborted run begun (see `decide`).
                    let row = query(sql!(self.dialect, |d|
                        "SELECT record, status, executing_on FROM calls WHERE run_id = $1 AND call_id = $2 \
                         AND status IN ('allowed', 'approved') AND {NOT_ABORTED}{}",
                        d.for_update()
                    ))
                    .bind(run_id.as_str())
                    .bind(call_id.as_str())
                    .fetch_optional(&mut tx)
                    .await
                    .map_err(unavailable)?;
                    match row {
                        None => None,
                        Some(row) => {
                            let mut record = call_record(&row)?;
                            record.status = CallStatus::Executing;
                            record.executing_on = Some(self.instance.clone());
                            // Only a call not yet taken passes: a call runs once.
                            let changed = query(
                                "UPDATE calls SET status = 'executing', record = $3, executing_on = $4 \
                                 WHERE run_id = $1 AND call_id = $2 AND status IN ('allowed', 'approved')",
                            )
                            .bind(run_id.as_str())
                            .bind(call_id.as_str())
                            .bind(json(&record))
                            .bind(self.instance.as_str())
                            .execute(&mut tx)
                            .await
                            .map_err(unavailable)?;
                            (changed.rows_affected() == 1).then_some(record)
                        }
                    }
                }
            };
            self.commit_change(tx, taken, None).await?;
            if let Some(record) = &begun
                && self.dialect == super::Dialect::Sqlite
            {
                self.executing
                    .lock()
                    .insert((record.run_id.clone(), record.call.id.clone()));
            }
            Ok(begun)
        }
        .boxed()
    }

    /// On SQLite a call's result joins the queue of the next group commit (the next state change of any run takes
    /// it into its transaction, or the appender writes it within a millisecond): the run's next change (its next
    /// sampling's end, or the claim of its settled batch) is then one commit with the result, not two. Nothing is
    /// read from the result before it is written: its events wait in the same queue, the state changes that read
    /// calls take the queue first, and reads of a run's calls wait for its queued results. A crash before the
    /// write leaves the call executing in the file, which the next start records as interrupted, effect unknown,
    /// never run again: what a crash while the tool ran records too. Only this process writes the file, so the
    /// calls it began and has not settled are known here, and a second result for the same call is refused.
    fn settle_call(&self, result: CallResult) -> StoreFuture<'_, bool> {
        async move {
            if self.dialect == super::Dialect::Sqlite {
                let key = (result.run_id.clone(), result.call_id.clone());
                if !self.executing.lock().remove(&key) {
                    return Ok(false);
                }
                self.enqueue(super::Queued::Settled(result));
                return Ok(true);
            }
            // On PostgreSQL the result is written now. The tool has run, and its run can neither go on nor end
            // until its result is written, so a database that is unavailable for a while (a failover, a lost
            // connection) is tried again, each wait twice the last, up to 2 s. (A try after a commit whose answer
            // was lost finds the call settled already: not this caller's, as for a call recovery took.)
            let mut wait = Duration::from_millis(50);
            loop {
                match self.settle_now(&result).await {
                    Err(StoreError::Unavailable(error)) => {
                        tracing::warn!(run_id = %result.run_id, call = %result.call_id, %error,
                            "cannot record the call's result yet; trying again");
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(Duration::from_secs(2));
                    }
                    settled => return settled,
                }
            }
        }
        .boxed()
    }

    fn claim_batch(
        &self,
        run_id: &RunId,
        left_by_abort: SettleExpired,
    ) -> StoreFuture<'_, Option<Claimed>> {
        let run_id = run_id.clone();
        async move {
            let (mut tx, taken) = self.begin_after_results(&run_id).await?;
            let row = query(sql!(self.dialect, |d|
                "SELECT {RUN_COLUMNS}, batch, epoch FROM runs WHERE id = $1{}",
                d.for_update()
            ))
            .bind(run_id.as_str())
            .fetch_optional(&mut tx)
            .await
            .map_err(unavailable)?;
            let Some(row) = row else {
                return Ok(None);
            };
            let state: String = row.try_get("state").map_err(unavailable)?;
            let batch: Option<String> = row.try_get("batch").map_err(unavailable)?;
            let (Some(batch), "waiting") = (batch, state.as_str()) else {
                return Ok(None);
            };
            // Whether the run was aborted, as written (a reason a newer version wrote counts too).
            let aborted = row
                .try_get::<Option<String>, _>("abort")
                .map_err(unavailable)?
                .is_some();
            let epoch: i64 = row.try_get("epoch").map_err(unavailable)?;
            let calls = query(sql!(self.dialect, |d|
                "SELECT call_id, record, status, executing_on FROM calls WHERE run_id = $1 ORDER BY idx{}",
                d.for_update()
            ))
            .bind(run_id.as_str())
            .fetch_all(&mut tx)
            .await
            .map_err(unavailable)?;
            // A batch is the claim's once every call is final. A status this version does not know (written by a
            // newer one) is not final here: the call may still be running, on an instance that knows it.
            // An aborted run's abort settled every call still to run or to decide in the change that recorded it,
            // except the ones it could not read (an instance of an older version's, beside the newer one that
            // wrote them). Once nothing else is under way (a call running), this claim settles those it reads as
            // the abort would have (`left_by_abort`), and a run with one it cannot read either is ended as one
            // that does not read: nothing else would settle it.
            let mut left = Vec::new();
            for row in &calls {
                let status: String = row.try_get("status").map_err(unavailable)?;
                match CallStatus::parse(&status) {
                    Some(status) if status.is_final() => {}
                    Some(CallStatus::Pending | CallStatus::Allowed | CallStatus::Approved)
                        if aborted =>
                    {
                        left.push(row);
                    }
                    _ => return Ok(None),
                }
            }
            for row in &left {
                if call_record(row).is_err() {
                    let call: String = row.try_get("call_id").map_err(unavailable)?;
                    return Err(StoreError::Corrupt(format!(
                        "its call {call} was left unsettled by the run's abort, which could not read it"
                    )));
                }
            }
            // Read before anything changes: what this version cannot read leaves the run as it was, for an
            // instance that can, not claimed with its batch and calls erased on the way to the error. The run itself
            // too, as the claim leaves it, for its task: read here, under the claim's lock, not after it, where a
            // failed read would leave the run claimed with nobody to go on with it.
            let mut run = run_info(&row)?;
            let mut outputs = Vec::with_capacity(calls.len());
            let (mut events, mut audit) = (Vec::new(), Vec::new());
            for row in &calls {
                let mut record = call_record(row)?;
                if !record.status.is_final() {
                    let settlement = left_by_abort(&record);
                    let (mut settled_events, mut settled_audit) = apply(&mut record, settlement);
                    events.append(&mut settled_events);
                    audit.append(&mut settled_audit);
                }
                if let Some(output) = record.output {
                    outputs.push((record.call, output));
                }
            }
            let batch: SavedBatch = parse(&batch, "a waiting run's batch")?;
            let epoch = epoch as u64 + 1;
            let changed = query(
                "UPDATE runs SET state = 'running', owner = $2, epoch = $3, batch = NULL WHERE id = $1 AND state = 'waiting'",
            )
            .bind(run_id.as_str())
            .bind(self.instance.as_str())
            .bind(epoch as i64)
            .execute(&mut tx)
            .await
            .map_err(unavailable)?;
            if changed.rows_affected() != 1 {
                return Ok(None);
            }
            query("DELETE FROM calls WHERE run_id = $1")
                .bind(run_id.as_str())
                .execute(&mut tx)
                .await
                .map_err(unavailable)?;
            if let Some(seq) = self
                .commit_settled(tx, taken, &run_id, &events, &audit)
                .await?
            {
                run.last_seq = seq;
                run.event_bytes += event_bytes(&events) as u64;
            }
            run.state = RunState::Running;
            Ok(Some(Claimed {
                epoch,
                batch,
                outputs,
                run,
            }))
        }
        .boxed()
    }

    fn finish_run(&self, finish: FinishRun) -> StoreFuture<'_, Result<(), Fenced>> {
        self.finish_run_giving_back(finish, None).boxed()
    }

    fn abort_run(
        &self,
        run_id: &RunId,
        reason: AbortReason,
        settle: SettleExpired,
    ) -> StoreFuture<'_, Option<Aborted>> {
        let run_id = run_id.clone();
        async move {
            let (mut tx, taken) = self.begin_after_results(&run_id).await?;
            let row = query(sql!(self.dialect, |d|
                "SELECT {RUN_COLUMNS}, owner FROM runs WHERE id = $1{}",
                d.for_update()
            ))
            .bind(run_id.as_str())
            .fetch_optional(&mut tx)
            .await
            .map_err(unavailable)?;
            let Some(row) = row else {
                return Ok(None);
            };
            let mut info = run_info(&row)?;
            let owner: Option<String> = row.try_get("owner").map_err(unavailable)?;
            if !info.state.is_finished() && info.abort.is_none() {
                query("UPDATE runs SET abort = $2 WHERE id = $1 AND abort IS NULL")
                    .bind(run_id.as_str())
                    .bind(reason.as_str())
                    .execute(&mut tx)
                    .await
                    .map_err(unavailable)?;
                info.abort = Some(reason);
            }
            let (_, audit, seq) = self
                .settle_calls_in(
                    &mut tx,
                    &run_id,
                    &[CallStatus::Pending, CallStatus::Allowed, CallStatus::Approved],
                    &*settle,
                )
                .await?;
            let executing = query(
                "SELECT call_id, executing_on FROM calls WHERE run_id = $1 AND status = 'executing'",
            )
            .bind(run_id.as_str())
            .fetch_all(&mut tx)
            .await
            .map_err(unavailable)?
            .iter()
            .filter_map(|row| {
                let call: String = row.try_get(0).ok()?;
                let on: Option<String> = row.try_get(1).ok()?;
                Some((ToolCallId::parse(call).ok()?, InstanceId::from_stored(on?)))
            })
            .collect();
            audit_in(&mut tx, &audit).await.map_err(unavailable)?;
            // Other instances stop what they run of it.
            self.doorbell(&mut tx, || format!("abort {run_id} {}", reason.as_str()))
                .await
                .map_err(unavailable)?;
            self.commit_change(tx, taken, seq.map(|seq| (run_id.clone(), seq)))
                .await?;
            if let Some(seq) = seq {
                info.last_seq = seq;
            }
            Ok(Some(Aborted {
                running_on: (info.state == RunState::Running)
                    .then(|| owner.map(InstanceId::from_stored))
                    .flatten(),
                run: info,
                executing,
            }))
        }
        .boxed()
    }

    fn recover(&self, events: RecoveryEvents) -> StoreFuture<'_, Recovered> {
        async move {
            let mut recovered = Recovered::default();
            // With SQLite, the file lock makes this process the only one: whatever another instance left
            // running is a dead process's. With PostgreSQL, the dead are those whose heartbeat stopped.
            let live = self.live_instances().await?;
            let is_dead = |owner: &Option<String>| owner.as_ref().is_none_or(|owner| !live.contains(owner));
            // [`UNFINISHED`] is the condition of the index of unfinished runs, so that the query reads that index.
            let running = query(sql!(self.dialect, |_|
                "SELECT {RUN_COLUMNS}, owner, epoch FROM runs WHERE {UNFINISHED} AND state = 'running'"
            ))
            .fetch_all(&self.reader)
            .await
            .map_err(unavailable)?;
            let mut dead_runs = Vec::new();
            for row in &running {
                let owner: Option<String> = row.try_get("owner").map_err(unavailable)?;
                if is_dead(&owner) {
                    // Ended only as the dead instance left it: not if another took it over since.
                    let claim = match owner {
                        Some(owner) => EndClaim::Abandoned {
                            owner: InstanceId::from_stored(owner),
                            epoch: row.try_get::<i64, _>("epoch").map_err(unavailable)? as Epoch,
                        },
                        None => EndClaim::Unended,
                    };
                    // A run this version cannot read is left for an instance that can: the others are recovered.
                    let info = match run_info(row) {
                        Ok(info) => info,
                        Err(StoreError::Corrupt(why)) => {
                            let what = "a running run of a process gone cannot be read here to recover it";
                            let run = row.try_get::<String, _>("id").unwrap_or_default();
                            if self.unreadable.first((what, run.clone(), String::new())) {
                                tracing::error!(run, %why, "{what}; it is left as it is");
                            }
                            continue;
                        }
                        Err(error) => return Err(error),
                    };
                    dead_runs.push((info, claim));
                }
            }
            // Each dead owner's run is fenced before its running calls are looked for: should the owner come back
            // (its heartbeat was only late), it begins no call and writes nothing from here, so the calls found
            // running below are all it ran. Without the fence, a call it began between that look and the run's end
            // would run and go with the end unrecorded. A run another instance took over meanwhile is left to it.
            let mut fenced = Vec::with_capacity(dead_runs.len());
            for (info, claim) in dead_runs {
                let claim = match claim {
                    EndClaim::Abandoned { owner, epoch } => {
                        let mut tx = self.writer.begin().await.map_err(unavailable)?;
                        let changed = query(
                            "UPDATE runs SET epoch = epoch + 1 \
                             WHERE id = $1 AND state = 'running' AND owner = $2 AND epoch = $3",
                        )
                        .bind(info.run_id.as_str())
                        .bind(owner.as_str())
                        .bind(epoch as i64)
                        .execute(&mut tx)
                        .await
                        .map_err(unavailable)?;
                        if changed.rows_affected() == 0 {
                            continue;
                        }
                        // Should the owner only have been late, it stops its task and tools of the run: what they
                        // did from now on would be thrown away.
                        self.doorbell(&mut tx, || stop_message(&owner, &info.run_id))
                            .await
                            .map_err(unavailable)?;
                        tx.commit().await.map_err(unavailable)?;
                        EndClaim::Abandoned {
                            owner,
                            epoch: epoch + 1,
                        }
                    }
                    unowned => unowned,
                };
                fenced.push((info, claim));
            }
            let fenced_runs: std::collections::HashSet<RunId> =
                fenced.iter().map(|(info, _)| info.run_id.clone()).collect();
            let executing = query(
                "SELECT call_id, run_id, record, status, executing_on FROM calls WHERE status = 'executing'",
            )
            .fetch_all(&self.reader)
            .await
            .map_err(unavailable)?;
            for row in &executing {
                let Some(dead) = row
                    .try_get::<Option<String>, _>("executing_on")
                    .map_err(unavailable)?
                    .filter(|on| is_dead(&Some(on.clone())))
                else {
                    continue;
                };
                // A call this version cannot read is left for an instance that can: the others are recovered.
                let Some(mut record) = self.readable(row, "a running call cannot be read here to recover it")?
                else {
                    continue;
                };
                let mut tx = self.writer.begin().await.map_err(unavailable)?;
                lock_run_in(self.dialect, &mut tx, &record.run_id)
                    .await
                    .map_err(unavailable)?;
                // Its heartbeat may have come while this waited for the run: then it is alive, and its call runs.
                // Not for a run fenced above: that run ends here whatever its owner does now (it was told to stop),
                // and its call is recorded as interrupted rather than dropped with the run's calls.
                if !fenced_runs.contains(&record.run_id)
                    && self.instance_alive_in(&mut tx, &dead).await?
                {
                    continue;
                }
                let settlement = (events.call_interrupted)(&record);
                let (call_events, audit) = apply(&mut record, settlement);
                record.executing_on = None;
                let changed = query(
                    "UPDATE calls SET status = $3, record = $4, executing_on = NULL \
                     WHERE run_id = $1 AND call_id = $2 AND status = 'executing' AND executing_on = $5",
                )
                .bind(record.run_id.as_str())
                .bind(record.call.id.as_str())
                .bind(record.status.as_str())
                .bind(json(&record))
                .bind(dead.as_str())
                .execute(&mut tx)
                .await
                .map_err(unavailable)?;
                if changed.rows_affected() == 1 {
                    let seq = self.append_in(&mut tx, &record.run_id, &call_events, None)
                        .await
                        .map_err(unavailable)?;
                    audit_in(&mut tx, &audit).await.map_err(unavailable)?;
                    // Should its instance only have been late, its tool stops (a fenced run's is stopped with the
                    // run).
                    if !fenced_runs.contains(&record.run_id) {
                        let dead = InstanceId::from_stored(dead.clone());
                        self.doorbell(&mut tx, || {
                            stop_call_message(&dead, &record.run_id, &record.call.id)
                        })
                        .await
                        .map_err(unavailable)?;
                    }
                    self.commit_change(
                        tx,
                        Taken::default(),
                        seq.map(|seq| (record.run_id.clone(), seq)),
                    )
                    .await?;
                    recovered
                        .interrupted_calls
                        .push((record.run_id.clone(), record.call.id.clone()));
                }
            }
            for (info, claim) in fenced {
                let give_back = info.parent_run_id.clone().map(|parent| GiveBack {
                    parent,
                    events: (events.run_failed)(&info, InterruptsTaken::GivenBack),
                });
                // What the run was asked and did, for its session's next run, as its end would have recorded it. A
                // log that cannot be read costs the conversation that, never the recovery (nor the start).
                let history = match crate::store::all_events(self, &info.run_id).await {
                    Ok(logged) => crate::view::RunView::from_events(&logged)
                        .map(|view| (events.history)(&view))
                        .unwrap_or_default(),
                    Err(error) => {
                        tracing::warn!(run = %info.run_id, %error, "the log of a recovered run cannot be read: its session's conversation goes on without it");
                        Vec::new()
                    }
                };
                let finish = FinishRun {
                    run_id: info.run_id.clone(),
                    claim,
                    state: RunState::Failed,
                    history,
                    conversation: None,
                    suspension: None,
                    events: (events.run_failed)(&info, InterruptsTaken::Kept),
                    audit: Vec::new(),
                    settle_pending: None,
                };
                if self
                    .finish_run_giving_back(finish, give_back)
                    .await?
                    .is_ok()
                {
                    recovered.failed_runs.push(info.run_id);
                }
            }
            self.forget_dead_instances(&live).await?;
            Ok(recovered)
        }
        .boxed()
    }

    fn interrupt(&self, parent: &RunId) -> StoreFuture<'_, Option<(Suspension, Option<RunId>)>> {
        let parent = parent.clone();
        async move {
            if let Some(kept) = self
                .tails
                .as_ref()
                .and_then(|tails| tails.suspension(&parent))
            {
                return Ok(kept);
            }
            let row = query(
                "SELECT suspension, resumed_by FROM runs WHERE id = $1 AND suspension IS NOT NULL",
            )
            .bind(parent.as_str())
            .fetch_optional(self.by_key())
            .await
            .map_err(unavailable)?;
            let Some(row) = row else {
                return Ok(None);
            };
            let suspension: String = row.try_get(0).map_err(unavailable)?;
            let resumed_by: Option<String> = row.try_get(1).map_err(unavailable)?;
            Ok(Some((
                parse(&suspension, "a suspension")?,
                resumed_by.map(run_id).transpose()?,
            )))
        }
        .boxed()
    }

    fn open_interrupt(&self, session_id: &SessionId) -> StoreFuture<'_, Option<(RunId, u64)>> {
        let session_id = session_id.clone();
        async move { open_interrupt_in(self.by_key(), &session_id).await }.boxed()
    }

    fn run(&self, run_id: &RunId) -> StoreFuture<'_, Option<RunInfo>> {
        let run_id = run_id.clone();
        async move {
            let row = query(sql!(
                self.dialect,
                |_| "SELECT {RUN_COLUMNS} FROM runs WHERE id = $1"
            ))
            .bind(run_id.as_str())
            .fetch_optional(self.by_key())
            .await
            .map_err(unavailable)?;
            row.as_ref().map(run_info).transpose()
        }
        .boxed()
    }

    fn events_after(
        &self,
        run_id: &RunId,
        after: u64,
        limit: usize,
    ) -> StoreFuture<'_, Vec<Arc<EncodedEvent>>> {
        let run_id = run_id.clone();
        async move {
            if let Some(events) = self
                .tails
                .as_ref()
                .and_then(|tails| tails.read(&run_id, after, limit))
            {
                return Ok(events);
            }
            let rows = query(self.dialect.events_after())
                .bind(run_id.as_str())
                .bind(self.dialect.seq_after(after))
                .bind(limit.min(i64::MAX as usize) as i64)
                .bind(PAGE_BYTES as i64)
                .fetch_within(self.by_key(), PAGE_BYTES)
                .await
                .map_err(unavailable)?;
            rows.iter()
                .map(|row| {
                    let kind: String = row.try_get(1).map_err(unavailable)?;
                    Ok(Arc::new(EncodedEvent {
                        seq: row.try_get::<i64, _>(0).map_err(unavailable)? as u64,
                        kind: event_kind(&kind).ok_or_else(|| {
                            StoreError::Corrupt(format!("unknown event type {kind:?}"))
                        })?,
                        json: row
                            .try_get::<String, _>(2)
                            .map_err(unavailable)?
                            .into_boxed_str(),
                    }))
                })
                .collect()
        }
        .boxed()
    }

    fn continues_after(&self, run_id: &RunId, after: u64) -> StoreFuture<'_, bool> {
        let known = self
            .tails
            .as_ref()
            .and_then(|tails| tails.continues_after(run_id, after));
        let run_id = run_id.clone();
        async move {
            match known {
                Some(continues) => Ok(continues),
                None => Ok(self
                    .run(&run_id)
                    .await?
                    .is_some_and(|info| info.continues_after(after))),
            }
        }
        .boxed()
    }

    fn watch_run(&self, run_id: &RunId) -> watch::Receiver<u64> {
        self.runs.watch(run_id)
    }

    fn watch_session(&self, session_id: &SessionId) -> watch::Receiver<u64> {
        self.sessions.watch(session_id)
    }

    fn session_runs(&self, session_id: &SessionId, limit: usize) -> StoreFuture<'_, Vec<RunId>> {
        let session_id = session_id.clone();
        async move {
            let rows =
                query("SELECT id FROM runs WHERE session_id = $1 ORDER BY ordinal DESC LIMIT $2")
                    .bind(session_id.as_str())
                    .bind(limit.min(i64::MAX as usize) as i64)
                    .fetch_all(self.by_key())
                    .await
                    .map_err(unavailable)?;
            let mut runs = rows
                .into_iter()
                .map(|row| run_id(row.try_get(0).map_err(unavailable)?))
                .collect::<StoreResult<Vec<_>>>()?;
            runs.reverse();
            Ok(runs)
        }
        .boxed()
    }

    fn history(&self, session_id: &SessionId) -> StoreFuture<'_, Vec<Message>> {
        let session_id = session_id.clone();
        async move {
            let rows =
                query("SELECT message FROM session_messages WHERE session_id = $1 ORDER BY idx")
                    .bind(session_id.as_str())
                    .fetch_all(self.by_key())
                    .await
                    .map_err(unavailable)?;
            rows.iter()
                .map(|row| {
                    parse(
                        &row.try_get::<String, _>(0).map_err(unavailable)?,
                        "a message",
                    )
                })
                .collect()
        }
        .boxed()
    }

    fn sessions(&self, limit: usize) -> StoreFuture<'_, Vec<SessionSummary>> {
        async move {
            let rows = query(format!(
                "{SESSION_SUMMARY} ORDER BY updated_at DESC, id DESC LIMIT $1"
            ))
            .bind(limit.min(i64::MAX as usize) as i64)
            .fetch_all(&self.reader)
            .await
            .map_err(unavailable)?;
            rows.iter().map(session_summary).collect()
        }
        .boxed()
    }

    fn sessions_among(&self, ids: &[SessionId]) -> StoreFuture<'_, Vec<SessionSummary>> {
        let ids: Vec<String> = ids
            .iter()
            .map(|id| id.as_str().to_owned())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        async move {
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            let wanted = (1..=ids.len())
                .map(|i| format!("${i}"))
                .collect::<Vec<_>>()
                .join(", ");
            let mut among = query(format!(
                "{SESSION_SUMMARY} WHERE id IN ({wanted}) ORDER BY updated_at DESC, id DESC"
            ));
            for id in &ids {
                among = among.bind(id.as_str());
            }
            let rows = among.fetch_all(&self.reader).await.map_err(unavailable)?;
            rows.iter().map(session_summary).collect()
        }
        .boxed()
    }

    fn pending(&self, of: PendingOf<'_>) -> StoreFuture<'_, Vec<ApprovalRequest>> {
        // Not a call an abort left (it could not read it): nobody may decide it, and the run's claim settles it.
        let (listing, on) = match of {
            PendingOf::All => (query(PENDING_CALLS), &self.reader),
            PendingOf::Run(run_id) => (
                query(sql!(self.dialect, |_|
                    "SELECT call_id, run_id, record, status, executing_on FROM calls WHERE status = 'pending' \
                     AND run_id = $1 AND {NOT_ABORTED} ORDER BY requested_at, run_id, call_id"
                ))
                .bind(run_id.as_str().to_owned()),
                self.by_key(),
            ),
            PendingOf::Session(session_id) => (
                query(
                    "SELECT calls.call_id, calls.run_id, calls.record, calls.status, calls.executing_on \
                     FROM runs JOIN calls ON calls.run_id = runs.id WHERE runs.session_id = $1 \
                     AND runs.abort IS NULL AND calls.status = 'pending' \
                     ORDER BY calls.requested_at, calls.run_id, calls.call_id",
                )
                .bind(session_id.as_str().to_owned()),
                self.by_key(),
            ),
        };
        async move {
            let rows = listing.fetch_all(on).await.map_err(unavailable)?;
            // Each row goes as soon as it is read: a listing of thousands holds the rows or the approvals, not both.
            // One this version cannot read is left out, not the listing failed for everyone.
            let mut pending = Vec::with_capacity(rows.len());
            for row in rows {
                let Some(record) =
                    self.readable(&row, "a pending approval cannot be read here to list it")?
                else {
                    continue;
                };
                if let Some(approval) = record.approval {
                    pending.push(approval);
                }
            }
            Ok(pending)
        }
        .boxed()
    }

    fn call(&self, run_id: &RunId, call_id: &ToolCallId) -> StoreFuture<'_, Option<CallRecord>> {
        let run_id = run_id.clone();
        let call_id = call_id.clone();
        async move {
            // A result of the run's calls still queued is written first: a call reads as it stands (as the
            // database holds it, when the database keeps refusing the result).
            if self.result_queued(&run_id) {
                self.flush_run(&run_id).await;
            }
            let row = query(
                "SELECT record, status, executing_on FROM calls WHERE run_id = $1 AND call_id = $2",
            )
            .bind(run_id.as_str())
            .bind(call_id.as_str())
            .fetch_optional(self.calls_by_key())
            .await
            .map_err(unavailable)?;
            row.as_ref().map(call_record).transpose()
        }
        .boxed()
    }

    fn calls(&self, run_id: &RunId) -> StoreFuture<'_, Vec<CallRecord>> {
        let run_id = run_id.clone();
        async move {
            if self.result_queued(&run_id) {
                self.flush_run(&run_id).await;
            }
            let rows = query(
                "SELECT record, status, executing_on FROM calls WHERE run_id = $1 ORDER BY idx",
            )
            .bind(run_id.as_str())
            .fetch_all(self.calls_by_key())
            .await
            .map_err(unavailable)?;
            rows.iter().map(call_record).collect()
        }
        .boxed()
    }

    fn unfinished_runs(&self) -> StoreFuture<'_, Vec<RunId>> {
        async move {
            let rows = query(UNFINISHED_RUNS)
                .fetch_all(&self.reader)
                .await
                .map_err(unavailable)?;
            rows.into_iter()
                .map(|row| run_id(row.try_get(0).map_err(unavailable)?))
                .collect()
        }
        .boxed()
    }

    fn held_runs(&self) -> StoreFuture<'_, Vec<HeldRun>> {
        async move {
            // [`UNFINISHED`] is the condition of the index of unfinished runs, so that the query reads that index.
            let rows = query(sql!(self.dialect, |_|
                "SELECT id, epoch, abort FROM runs WHERE {UNFINISHED} AND state = 'running' AND owner = $1"
            ))
            .bind(self.instance.as_str())
            .fetch_all(&self.reader)
            .await
            .map_err(unavailable)?;
            rows.iter()
                .map(|row| {
                    let abort: Option<String> = row.try_get("abort").map_err(unavailable)?;
                    Ok(HeldRun {
                        run_id: run_id(row.try_get("id").map_err(unavailable)?)?,
                        epoch: row.try_get::<i64, _>("epoch").map_err(unavailable)? as Epoch,
                        abort: abort.as_deref().and_then(AbortReason::parse),
                    })
                })
                .collect()
        }
        .boxed()
    }

    fn counts(&self) -> StoreFuture<'_, Counts> {
        async move {
            let row = query(sql!(self.dialect, |_|
                "SELECT (SELECT COUNT(*) FROM runs WHERE {UNFINISHED}), (SELECT COUNT(*) FROM sessions)"
            ))
            .fetch_one(&self.reader)
            .await
            .map_err(unavailable)?;
            Ok(Counts {
                unfinished_runs: row.try_get::<i64, _>(0).map_err(unavailable)? as u64,
                sessions: row.try_get::<i64, _>(1).map_err(unavailable)? as u64,
            })
        }
        .boxed()
    }

    fn stalled_runs(&self) -> StoreFuture<'_, Vec<RunId>> {
        async move {
            // [`UNFINISHED`]: see `recover`.
            let rows = query(sql!(self.dialect, |_|
                "SELECT id FROM runs r WHERE {UNFINISHED} AND state = 'waiting' AND ( \
                   abort IS NOT NULL OR EXISTS (SELECT 1 FROM calls c WHERE c.run_id = r.id AND c.status IN ('allowed', 'approved')) \
                   OR NOT EXISTS (SELECT 1 FROM calls c WHERE c.run_id = r.id \
                     AND c.status NOT IN ('refused', 'denied', 'settled', 'interrupted')))",
            ))
            .fetch_all(&self.reader)
            .await
            .map_err(unavailable)?;
            rows.into_iter()
                .map(|row| run_id(row.try_get(0).map_err(unavailable)?))
                .collect()
        }
        .boxed()
    }

    fn conversation(&self, run_id: &RunId) -> StoreFuture<'_, Option<Arc<[Message]>>> {
        let run_id = run_id.clone();
        async move {
            if let Some(conversation) = self
                .tails
                .as_ref()
                .and_then(|tails| tails.conversation(&run_id))
            {
                return Ok(conversation);
            }
            let row = query("SELECT conversation FROM runs WHERE id = $1")
                .bind(run_id.as_str())
                .fetch_optional(self.by_key())
                .await
                .map_err(unavailable)?;
            match row.map(|row| row.try_get::<Option<String>, _>(0)) {
                Some(Ok(Some(text))) => {
                    Ok(Some(parse::<Vec<Message>>(&text, "a conversation")?.into()))
                }
                Some(Err(error)) => Err(unavailable(error)),
                _ => Ok(None),
            }
        }
        .boxed()
    }

    fn grants(&self, session_id: &SessionId) -> StoreFuture<'_, Vec<StoredGrant>> {
        let session_id = session_id.clone();
        async move {
            if let Some(granted) = &self.granted
                && !granted.lock().contains(&session_id)
            {
                return Ok(Vec::new());
            }
            let rows = query(
                "SELECT id, grant_json, created_at FROM grants WHERE session_id = $1 ORDER BY created_at, id",
            )
            .bind(session_id.as_str())
            .fetch_all(self.by_key())
            .await
            .map_err(unavailable)?;
            rows.iter()
                .map(|row| {
                    Ok(StoredGrant {
                        id: row.try_get(0).map_err(unavailable)?,
                        grant: parse(&row.try_get::<String, _>(1).map_err(unavailable)?, "a grant")?,
                        created_at: row.try_get::<i64, _>(2).map_err(unavailable)? as u64,
                    })
                })
                .collect()
        }
        .boxed()
    }

    fn add_grant(
        &self,
        run_id: &RunId,
        epoch: Epoch,
        grant: StoredGrant,
    ) -> StoreFuture<'_, Result<(), Fenced>> {
        let run_id = run_id.clone();
        async move {
            let mut tx = self.writer.begin().await.map_err(unavailable)?;
            // The run must still be this instance's at `epoch`. On PostgreSQL its row is read `FOR SHARE`: a
            // recovery's fence (an update of the row) waits for this change, or this change finds the run fenced.
            let held = query(sql!(
                self.dialect,
                |d| "SELECT session_id FROM runs WHERE id = $1 AND state = 'running' AND owner = $2 AND epoch = $3{}",
                d.for_share()
            ))
            .bind(run_id.as_str())
            .bind(self.instance.as_str())
            .bind(epoch as i64)
            .fetch_optional(&mut tx)
            .await
            .map_err(unavailable)?;
            let Some(row) = held else {
                return Ok(Err(Fenced::Lost));
            };
            let session = session_id(row.try_get(0).map_err(unavailable)?)?;
            self.grant_in(&mut tx, &session, &grant).await?;
            tx.commit().await.map_err(unavailable)?;
            Ok(Ok(()))
        }
        .boxed()
    }

    fn revoke_grant(
        &self,
        session_id: &SessionId,
        grant_id: &str,
        audit: AuditEntry,
    ) -> StoreFuture<'_, bool> {
        let session_id = session_id.clone();
        let grant_id = grant_id.to_owned();
        async move {
            let mut tx = self.writer.begin().await.map_err(unavailable)?;
            let changed = query("DELETE FROM grants WHERE session_id = $1 AND id = $2")
                .bind(session_id.as_str())
                .bind(grant_id)
                .execute(&mut tx)
                .await
                .map_err(unavailable)?;
            let revoked = changed.rows_affected() > 0;
            if revoked {
                audit_in(&mut tx, &[audit]).await.map_err(unavailable)?;
            }
            tx.commit().await.map_err(unavailable)?;
            Ok(revoked)
        }
        .boxed()
    }

    fn log_out(&self, login: &str, expires_at: u64) -> StoreFuture<'_, ()> {
        let login = login.to_owned();
        async move {
            let mut tx = self.writer.begin().await.map_err(unavailable)?;
            query("DELETE FROM logged_out WHERE expires_at <= $1")
                .bind(now_ms().saturating_sub(LOGOUT_KEPT_PAST_EXPIRY_MS) as i64)
                .execute(&mut tx)
                .await
                .map_err(unavailable)?;
            query(
                "INSERT INTO logged_out (login, expires_at) VALUES ($1, $2) ON CONFLICT (login) DO NOTHING",
            )
            .bind(login)
            .bind(i64::try_from(expires_at).unwrap_or(i64::MAX))
            .execute(&mut tx)
            .await
            .map_err(unavailable)?;
            tx.commit().await.map_err(unavailable)?;
            Ok(())
        }
        .boxed()
    }

    fn logged_out(&self, login: &str) -> StoreFuture<'_, bool> {
        let login = login.to_owned();
        async move {
            let row = query("SELECT 1 FROM logged_out WHERE login = $1")
                .bind(login)
                .fetch_optional(&self.reader)
                .await
                .map_err(unavailable)?;
            Ok(row.is_some())
        }
        .boxed()
    }

    fn rules(&self) -> StoreFuture<'_, Vec<StoredRule>> {
        async move {
            let rows =
                query("SELECT id, rule, created_at, created_by FROM rules ORDER BY created_at, id")
                    .fetch_all(&self.reader)
                    .await
                    .map_err(unavailable)?;
            rows.iter()
                .map(|row| {
                    Ok(StoredRule {
                        id: row.try_get(0).map_err(unavailable)?,
                        rule: row.try_get(1).map_err(unavailable)?,
                        created_at: row.try_get::<i64, _>(2).map_err(unavailable)? as u64,
                        created_by: row.try_get(3).map_err(unavailable)?,
                    })
                })
                .collect()
        }
        .boxed()
    }

    fn add_rule(&self, rule: StoredRule, audit: AuditEntry) -> StoreFuture<'_, bool> {
        async move {
            let mut tx = self.writer.begin().await.map_err(unavailable)?;
            // The row is written unless the same rule is kept already; PostgreSQL's unique key makes a second
            // instance's insert of it wait for the first's commit, then find it there.
            let kept = query(
                "INSERT INTO rules (id, rule, created_at, created_by) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (id) DO UPDATE SET rule = excluded.rule, created_at = excluded.created_at, \
                 created_by = excluded.created_by WHERE rules.rule <> excluded.rule",
            )
            .bind(rule.id.clone())
            .bind(rule.rule.clone())
            .bind(rule.created_at as i64)
            .bind(rule.created_by.clone())
            .execute(&mut tx)
            .await
            .map_err(unavailable)?;
            let added = kept.rows_affected() > 0;
            if added {
                audit_in(&mut tx, &[audit]).await.map_err(unavailable)?;
            }
            tx.commit().await.map_err(unavailable)?;
            Ok(added)
        }
        .boxed()
    }

    fn remove_rule(&self, rule_id: &str, audit: AuditEntry) -> StoreFuture<'_, bool> {
        let rule_id = rule_id.to_owned();
        async move {
            let mut tx = self.writer.begin().await.map_err(unavailable)?;
            let changed = query("DELETE FROM rules WHERE id = $1")
                .bind(rule_id)
                .execute(&mut tx)
                .await
                .map_err(unavailable)?;
            let removed = changed.rows_affected() > 0;
            if removed {
                audit_in(&mut tx, &[audit]).await.map_err(unavailable)?;
            }
            tx.commit().await.map_err(unavailable)?;
            Ok(removed)
        }
        .boxed()
    }

    fn audit(&self, entry: AuditEntry) -> StoreFuture<'_, ()> {
        async move {
            let mut tx = self.writer.begin().await.map_err(unavailable)?;
            audit_in(&mut tx, &[entry]).await.map_err(unavailable)?;
            tx.commit().await.map_err(unavailable)?;
            Ok(())
        }
        .boxed()
    }

    fn audit_log(&self, query: AuditQuery) -> StoreFuture<'_, Vec<AuditEntry>> {
        async move {
            let mut sql = String::from(
                "SELECT id, at, kind, session_id, run_id, tool_call_id, tool, arguments_digest, edited_digest, \
                 outcome, source, scope, reason, actor FROM audit WHERE 1 = 1",
            );
            let mut texts: Vec<String> = Vec::new();
            let mut numbers: Vec<(usize, i64)> = Vec::new();
            let mut next = 1;
            let mut text_filter = |column: &str, value: Option<String>, sql: &mut String| {
                if let Some(value) = value {
                    sql.push_str(&format!(" AND {column} = ${next}"));
                    next += 1;
                    texts.push(value);
                }
            };
            text_filter(
                "session_id",
                query.session_id.as_ref().map(|s| s.as_str().to_owned()),
                &mut sql,
            );
            text_filter("run_id", query.run_id.as_ref().map(|r| r.as_str().to_owned()), &mut sql);
            text_filter("tool", query.tool.clone(), &mut sql);
            text_filter("outcome", query.outcome.clone(), &mut sql);
            if let Some(sessions) = &query.sessions_or_none {
                let mut among = Vec::with_capacity(sessions.len());
                for session in sessions {
                    among.push(format!("${next}"));
                    next += 1;
                    texts.push(session.as_str().to_owned());
                }
                sql.push_str(&if among.is_empty() {
                    " AND session_id IS NULL".to_owned()
                } else {
                    format!(
                        " AND (session_id IS NULL OR session_id IN ({}))",
                        among.join(", ")
                    )
                });
            }
            for (column, op, value) in [
                ("at", ">=", query.since),
                ("at", "<", query.until),
                ("id", ">", query.after_id),
                ("id", "<", query.before_id),
            ] {
                if let Some(value) = value {
                    sql.push_str(&format!(" AND {column} {op} ${next}"));
                    // Past what the column holds, the bound means the same at its largest value: nothing is that
                    // late (no time or id reaches it), everything is earlier.
                    numbers.push((next, value.min(i64::MAX as u64) as i64));
                    next += 1;
                }
            }
            let order = if query.newest_first { "DESC" } else { "ASC" };
            sql.push_str(&format!(" ORDER BY id {order} LIMIT ${next}"));
            let mut q = super::db::query(sql);
            for text in texts {
                q = q.bind(text);
            }
            for (_, number) in numbers {
                q = q.bind(number);
            }
            q = q.bind(query.limit.min(i64::MAX as usize) as i64);
            let rows = q.fetch_all(&self.reader).await.map_err(unavailable)?;
            rows.iter()
                .map(|row| {
                    let kind: String = row.try_get(2).map_err(unavailable)?;
                    Ok(AuditEntry {
                        id: row.try_get::<i64, _>(0).map_err(unavailable)? as u64,
                        at: row.try_get::<i64, _>(1).map_err(unavailable)? as u64,
                        kind: AuditKind::parse(&kind),
                        session_id: row
                            .try_get::<Option<String>, _>(3)
                            .map_err(unavailable)?
                            .map(session_id)
                            .transpose()?,
                        run_id: row
                            .try_get::<Option<String>, _>(4)
                            .map_err(unavailable)?
                            .map(run_id)
                            .transpose()?,
                        tool_call_id: row
                            .try_get::<Option<String>, _>(5)
                            .map_err(unavailable)?
                            .and_then(|id| ToolCallId::parse(id).ok()),
                        tool: row.try_get(6).map_err(unavailable)?,
                        arguments_digest: row.try_get(7).map_err(unavailable)?,
                        edited_digest: row.try_get(8).map_err(unavailable)?,
                        outcome: row.try_get(9).map_err(unavailable)?,
                        source: row.try_get(10).map_err(unavailable)?,
                        scope: row.try_get(11).map_err(unavailable)?,
                        reason: row.try_get(12).map_err(unavailable)?,
                        actor: row.try_get(13).map_err(unavailable)?,
                    })
                })
                .collect()
        }
        .boxed()
    }

    fn prune(&self, limits: RetentionLimits, now_ms: u64) -> StoreFuture<'_, usize> {
        async move {
            let total: i64 =
                query("SELECT CAST(COALESCE(SUM(event_bytes), 0) AS BIGINT) FROM runs")
                    .fetch_one(&self.reader)
                    .await
                    .and_then(|row| row.try_get(0))
                    .map_err(unavailable)?;
            // A run whose interrupts a resume took is kept while that resume goes on: should its process die, the
            // recovery gives them back to it (`give_back_in`), which a run pruned meanwhile would not take.
            let finished = query(
                "SELECT id, finished_at, event_bytes, suspension_expires_at, resumed_by FROM runs \
                 WHERE finished_at IS NOT NULL AND NOT EXISTS (SELECT 1 FROM runs AS child \
                 WHERE child.id = runs.resumed_by AND child.finished_at IS NULL) ORDER BY finished_at, id",
            )
            .fetch_all(&self.reader)
            .await
            .map_err(unavailable)?;
            let mut total = total.max(0) as u64;
            let mut pruned = 0;
            for row in &finished {
                let id: String = row.try_get(0).map_err(unavailable)?;
                let finished_at: i64 = row.try_get(1).map_err(unavailable)?;
                let bytes: i64 = row.try_get(2).map_err(unavailable)?;
                let expires: Option<i64> = row.try_get(3).map_err(unavailable)?;
                let resumed: Option<String> = row.try_get(4).map_err(unavailable)?;
                // An open suspension is kept until it is resumed or expires: a person may still answer it.
                let open = expires.is_some_and(|at| at as u64 > now_ms) && resumed.is_none();
                let old = now_ms.saturating_sub(finished_at as u64) >= limits.max_age_ms;
                if open || !(old || total > limits.max_event_bytes) {
                    continue;
                }
                let mut tx = self.writer.begin().await.map_err(unavailable)?;
                lock_run_in(self.dialect, &mut tx, &run_id(id.clone())?)
                    .await
                    .map_err(unavailable)?;
                // The events first: SQLite finds them by the run's row.
                let statements = [
                    self.dialect.delete_events(),
                    "DELETE FROM calls WHERE run_id = $1",
                    "DELETE FROM runs WHERE id = $1",
                ];
                execute_each(&mut tx, &statements, &id)
                    .await
                    .map_err(unavailable)?;
                tx.commit().await.map_err(unavailable)?;
                if let Some(tails) = &self.tails {
                    tails.forget(&run_id(id)?);
                }
                total = total.saturating_sub(bytes.max(0) as u64);
                pruned += 1;
            }
            self.prune_sessions(now_ms.saturating_sub(limits.max_age_ms))
                .await?;
            Ok(pruned)
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::store::sql::DatabaseUrl;
    use crate::wire::{
        ApprovalPolicy, DenialSource, Resolution, StreamEvent, ToolCall, ToolOutput,
    };

    #[test]
    fn the_statement_that_writes_events_numbers_its_parameters_row_by_row_for_each_database() {
        let sqlite = EventsOf::Number(7);
        let postgres = EventsOf::Id("run");
        assert_eq!(
            sqlite.insert(1),
            "INSERT OR FAIL INTO events (run_seq, kind, json) VALUES ($1, $2, $3)"
        );
        assert_eq!(
            sqlite.insert(2),
            "INSERT OR FAIL INTO events (run_seq, kind, json) VALUES ($1, $2, $3),($4, $5, $6)"
        );
        assert_eq!(
            postgres.insert(2),
            "INSERT INTO events (run_id, seq, kind, json) VALUES ($1, $2, $3, $4),($5, $6, $7, $8)"
        );
        // Made once per number of rows, kept apart per database.
        assert!(std::ptr::eq(sqlite.insert(1), sqlite.insert(1)));
        assert!(
            sqlite
                .insert(EVENTS_PER_INSERT)
                .ends_with(",($766, $767, $768)")
        );
        assert!(
            postgres
                .insert(EVENTS_PER_INSERT)
                .ends_with(",($1021, $1022, $1023, $1024)")
        );
        assert_eq!(
            sqlite.insert(EVENTS_PER_INSERT).matches('(').count(),
            EVENTS_PER_INSERT + 1
        );
    }

    #[test]
    fn the_final_statuses_in_sql_are_the_ones_with_an_output() {
        let names = [
            "refused",
            "allowed",
            "pending",
            "approved",
            "denied",
            "executing",
            "settled",
            "interrupted",
        ];
        for name in names {
            let status = CallStatus::parse(name).expect("a status");
            assert_eq!(
                final_calls!().contains(&format!("'{name}'")),
                status.is_final(),
                "{name}"
            );
        }
    }

    /// Starts the run `run_1` in the session `sess_1` with `message`; its claim's epoch.
    async fn start_run_1(store: &SqlStore, message: &str) -> Epoch {
        store
            .start_run(NewRun::for_tests(
                RunId::parse("run_1").unwrap(),
                SessionId::parse("sess_1").unwrap(),
                message,
                Vec::new(),
            ))
            .await
            .unwrap()
            .unwrap()
    }

    /// A SQLite store with the run `run_1` (session `sess_1`) waiting on the pending calls `call_0`, `call_1` and
    /// `call_2`, asked in that order; then `change`, run on the closed file; then the store opened again.
    async fn waiting_run_changed_on_the_file(
        path: &std::path::Path,
        change: &str,
    ) -> Arc<SqlStore> {
        let store = SqlStore::open(&DatabaseUrl::Sqlite(path.to_owned()))
            .await
            .unwrap();
        let run = RunId::parse("run_1").unwrap();
        let epoch = start_run_1(&store, "delete three files").await;
        let calls: Vec<ToolCall> = (0..3)
            .map(|n| ToolCall {
                id: ToolCallId::parse(format!("call_{n}")).unwrap(),
                name: "delete_file".into(),
                arguments: format!(r#"{{"path":"{n}.txt"}}"#),
            })
            .collect();
        store
            .open_batch(OpenBatch {
                run_id: run.clone(),
                epoch,
                batch: SavedBatch {
                    history: Vec::new(),
                    prior: 0,
                    owned_by_session: true,
                    policy: ApprovalPolicy::OnRequest,
                    step: 1,
                    calls: calls.clone(),
                    repeat: RepeatCounts::default(),
                },
                calls: calls
                    .into_iter()
                    .map(|call| CallRecord::new(run.clone(), call, json!({}), CallStatus::Pending))
                    .collect(),
                events: Vec::new(),
                audit: Vec::new(),
            })
            .await
            .unwrap()
            .unwrap();
        store.close().await.unwrap();
        drop(store);
        rusqlite::Connection::open(path)
            .unwrap()
            .execute_batch(change)
            .unwrap();
        SqlStore::open(&DatabaseUrl::Sqlite(path.to_owned()))
            .await
            .unwrap()
    }

    /// Ends `run_1` whoever holds it, settling what is pending with `settle`, if given.
    fn end_of_run_1(settle_pending: Option<SettleExpired>) -> FinishRun {
        FinishRun {
            run_id: RunId::parse("run_1").unwrap(),
            claim: EndClaim::Unended,
            state: RunState::Failed,
            history: Vec::new(),
            conversation: None,
            suspension: None,
            events: Vec::new(),
            audit: Vec::new(),
            settle_pending,
        }
    }

    /// A denial whose event's step is the number in the call's id.
    fn denial_numbered_by_call(record: &CallRecord) -> Settlement {
        let step = record
            .call
            .id
            .as_str()
            .trim_start_matches("call_")
            .parse()
            .unwrap();
        Settlement {
            resolution: Resolution::Denied {
                source: DenialSource::Abort,
                reason: "the run ended".into(),
            },
            status: CallStatus::Denied,
            edited_arguments: None,
            output: None,
            events: vec![
                NewEvent::encode(&StreamEvent::Step {
                    run_id: record.run_id.clone(),
                    step,
                })
                .unwrap(),
            ],
            audit: Vec::new(),
            grant: None,
            under_grant: None,
        }
    }

    /// SQLite gives the rows of `DELETE … RETURNING` back in the order they were stored, which is the order a batch
    /// asked its calls in unless they were stored otherwise (as here, in reverse); and a call whose row this version
    /// cannot read (say, written by a newer one) stops an end only if it has to be settled.
    #[tokio::test]
    async fn an_end_settles_pending_calls_in_the_order_asked_and_skips_rows_it_need_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let store = waiting_run_changed_on_the_file(
            &dir.path().join("toolgate.db"),
            "CREATE TEMP TABLE asked AS SELECT * FROM calls;
             DELETE FROM calls;
             INSERT INTO calls SELECT * FROM asked ORDER BY idx DESC;
             INSERT INTO calls (run_id, call_id, idx, status, record)
                 VALUES ('run_1', 'call_9', 3, 'archived', 'a record of a newer version');",
        )
        .await;
        store
            .finish_run(end_of_run_1(Some(Box::new(denial_numbered_by_call))))
            .await
            .unwrap()
            .unwrap();
        let run = RunId::parse("run_1").unwrap();
        let steps: Vec<String> = store
            .events_after(&run, 0, 10)
            .await
            .unwrap()
            .iter()
            .map(|event| event.json.to_string())
            .collect();
        assert_eq!(steps.len(), 3, "{steps:?}");
        for (n, step) in steps.iter().enumerate() {
            assert!(step.contains(&format!(r#""step":{n}"#)), "{steps:?}");
        }
        assert!(store.calls(&run).await.unwrap().is_empty());
    }

    /// An end that settles nothing (recovery's) reads no call's row.
    #[tokio::test]
    async fn an_end_that_settles_nothing_is_not_stopped_by_a_row_it_cannot_read() {
        let dir = tempfile::tempdir().unwrap();
        let store = waiting_run_changed_on_the_file(
            &dir.path().join("toolgate.db"),
            "UPDATE calls SET status = 'archived', record = 'a record of a newer version'
                 WHERE call_id = 'call_1';",
        )
        .await;
        store.finish_run(end_of_run_1(None)).await.unwrap().unwrap();
        let run = RunId::parse("run_1").unwrap();
        assert_eq!(
            store.run(&run).await.unwrap().unwrap().state,
            RunState::Failed
        );
        assert!(store.calls(&run).await.unwrap().is_empty());
    }

    /// A result that a state change has taken into the open group of changes is written when that group commits:
    /// a read of the run's calls meanwhile waits for the commit and finds the call settled, not still executing.
    #[tokio::test]
    async fn a_read_of_calls_finds_a_result_that_an_open_group_has_taken_from_the_queue() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqlStore::open(&DatabaseUrl::Sqlite(dir.path().join("toolgate.db")))
            .await
            .unwrap();
        let run = RunId::parse("run_1").unwrap();
        let call = ToolCall {
            id: ToolCallId::parse("call_1").unwrap(),
            name: "delete_file".into(),
            arguments: r#"{"path":"a.txt"}"#.into(),
        };
        let epoch = start_run_1(&store, "delete a.txt").await;
        store
            .open_batch(OpenBatch {
                run_id: run.clone(),
                epoch,
                batch: SavedBatch {
                    history: vec![Message::User {
                        content: "delete a.txt".into(),
                    }],
                    prior: 0,
                    owned_by_session: true,
                    policy: ApprovalPolicy::OnRequest,
                    step: 1,
                    calls: vec![call.clone()],
                    repeat: RepeatCounts::default(),
                },
                calls: vec![CallRecord::new(
                    run.clone(),
                    call.clone(),
                    json!({"path": "a.txt"}),
                    CallStatus::Allowed,
                )],
                events: Vec::new(),
                audit: Vec::new(),
            })
            .await
            .unwrap()
            .unwrap();
        store
            .begin_call(&run, &call.id, None)
            .await
            .unwrap()
            .unwrap();
        let settled = store
            .settle_call(CallResult {
                run_id: run.clone(),
                call_id: call.id.clone(),
                output: ToolOutput::Ok {
                    content: json!("done"),
                },
                events: Vec::new(),
                audit: Vec::new(),
            })
            .await
            .unwrap();
        assert!(settled);

        // A change takes the queued result into its transaction and holds the connection.
        let (change, taken) = store.begin_change(&run).await.unwrap();
        let read = tokio::spawn({
            let store = Arc::clone(&store);
            let run = run.clone();
            async move { store.calls(&run).await.unwrap() }
        });
        // One turn of this (single-threaded) runtime: the read runs until it waits.
        tokio::task::yield_now().await;
        assert!(
            !read.is_finished(),
            "the read waits for the commit of the group that holds the result"
        );
        store.commit_change(change, taken, None).await.unwrap();
        let calls = read.await.unwrap();

        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].status, CallStatus::Settled, "the result is read");
    }
}
