//! The store in this process's memory: fast, and gone with the process (a restart denies what was pending).
//!
//! One lock over every table: each method is one state change, whole under the lock, which is what makes the
//! conditional ones (a decision, a claim, a resume) exactly once.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use futures::FutureExt;
use parking_lot::Mutex;
use tokio::sync::watch;

use super::watches::Watches;
use super::*;
use crate::clock::now_ms;
use crate::runtime::AbortReason;

struct SessionRow {
    title: String,
    created_at: u64,
    updated_at: u64,
    active: Option<RunId>,
    runs: Vec<RunId>,
    history: Vec<Message>,
    grants: Vec<StoredGrant>,
}

struct RunRow {
    info: RunInfo,
    owner: Option<InstanceId>,
    epoch: Epoch,
    events: Vec<Arc<EncodedEvent>>,
    batch: Option<SavedBatch>,
    calls: Vec<CallRecord>,
    suspension: Option<Suspension>,
    resumed_by: Option<RunId>,
    conversation: Option<Arc<[Message]>>,
    finished_at: Option<u64>,
}

impl RunRow {
    fn append(&mut self, events: Vec<NewEvent>) {
        for event in events {
            self.info.last_seq += 1;
            self.info.event_bytes += event.json.len() as u64;
            self.events.push(Arc::new(EncodedEvent {
                seq: self.info.last_seq,
                kind: event.kind,
                json: event.json,
            }));
        }
    }

    fn owned_by(&self, instance: &InstanceId, epoch: Epoch) -> Result<(), Fenced> {
        if self.info.state != RunState::Running
            || self.owner.as_ref() != Some(instance)
            || self.epoch != epoch
        {
            return Err(Fenced::Lost);
        }
        Ok(())
    }

    fn call_mut(&mut self, call_id: &ToolCallId) -> Option<&mut CallRecord> {
        self.calls
            .iter_mut()
            .find(|record| &record.call.id == call_id)
    }

    fn batch_settled(&self) -> bool {
        self.calls.iter().all(|record| record.status.is_final())
    }

    fn settle(record: &mut CallRecord, settlement: Settlement) -> Vec<NewEvent> {
        record.status = settlement.status;
        record.resolution = Some(settlement.resolution);
        record.edited_arguments = settlement.edited_arguments;
        if settlement.output.is_some() {
            record.output = settlement.output;
        }
        settlement.events
    }
}

#[derive(Default)]
struct Tables {
    sessions: HashMap<SessionId, SessionRow>,
    runs: HashMap<RunId, RunRow>,
    /// Finished runs, oldest first, for retention.
    finished: VecDeque<RunId>,
    /// How many runs have not ended.
    unfinished: u64,
    audit: Vec<AuditEntry>,
    rules: Vec<StoredRule>,
    /// Logins logged out, with when their cookies expire.
    logged_out: HashMap<String, u64>,
}

impl Tables {
    /// The session's newest interrupted run that waits for a resume, and when its interrupts expire.
    fn open_interrupt(&self, session_id: &SessionId) -> Option<(RunId, u64)> {
        let session = self.sessions.get(session_id)?;
        session.runs.iter().rev().find_map(|run_id| {
            let row = self.runs.get(run_id)?;
            let suspension = row.suspension.as_ref()?;
            row.resumed_by
                .is_none()
                .then(|| (run_id.clone(), suspension.expires_at()))
        })
    }

    /// Appends to the audit log; an entry about a run names the run's session.
    fn audit(&mut self, entries: Vec<AuditEntry>) {
        for mut entry in entries.into_iter().map(AuditEntry::bounded) {
            if entry.session_id.is_none()
                && let Some(row) = entry.run_id.as_ref().and_then(|run| self.runs.get(run))
            {
                entry.session_id = Some(row.info.session_id.clone());
            }
            entry.id = self.audit.len() as u64 + 1;
            self.audit.push(entry);
        }
    }
}

/// The store of a single process's memory.
pub struct MemoryStore {
    instance: InstanceId,
    /// Never sent to: there is no other instance.
    stops: tokio::sync::broadcast::Sender<RemoteStop>,
    tables: Mutex<Tables>,
    runs: Watches<RunId>,
    sessions: Watches<SessionId>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        Self {
            instance: InstanceId::generate(),
            stops: tokio::sync::broadcast::channel(1).0,
            tables: Mutex::new(Tables::default()),
            runs: Watches::default(),
            sessions: Watches::default(),
        }
    }

    fn ready<T: Send + 'static>(value: T) -> StoreFuture<'static, T> {
        futures::future::ready(Ok(value)).boxed()
    }
}

/// A session's summary, as listed.
fn summary(session_id: &SessionId, row: &SessionRow) -> SessionSummary {
    SessionSummary {
        session_id: session_id.clone(),
        title: row.title.clone(),
        created_at: row.created_at,
        updated_at: row.updated_at,
        runs: row.runs.len() as u64,
    }
}

/// Most recently updated first; the larger id first among sessions updated at the same time (as SQL orders them).
fn newest_first(sessions: &mut [SessionSummary]) {
    sessions.sort_by(|a, b| (b.updated_at, &b.session_id).cmp(&(a.updated_at, &a.session_id)));
}

impl Store for MemoryStore {
    fn kind(&self) -> StoreKind {
        StoreKind::Memory
    }

    fn instance(&self) -> &InstanceId {
        &self.instance
    }

    fn start_run(&self, run: NewRun) -> StoreFuture<'_, Result<Epoch, StartConflict>> {
        let result = {
            let mut tables = self.tables.lock();
            let resume = match &run.parent_run_id {
                None => Ok(()),
                Some(parent) => match tables.runs.get(parent) {
                    Some(row) if row.suspension.is_some() => match &row.resumed_by {
                        Some(used) => Err(TakeError::AlreadyUsed {
                            parent: parent.clone(),
                            by: used.clone(),
                        }),
                        None => Ok(()),
                    },
                    _ => Err(TakeError::UnknownParent(parent.clone())),
                },
            };
            let waiting = (run.refused_while_interrupted && run.parent_run_id.is_none())
                .then(|| tables.open_interrupt(&run.session_id))
                .flatten()
                .filter(|(_, expires_at)| *expires_at > run.at)
                .map(|(waiting, _)| waiting);
            if tables.runs.contains_key(&run.run_id) {
                Err(StartConflict::RunIdTaken(run.run_id.clone()))
            } else if let Err(refused) = resume {
                Err(StartConflict::Resume(refused))
            } else {
                let session = tables
                    .sessions
                    .entry(run.session_id.clone())
                    .or_insert_with(|| SessionRow {
                        title: String::new(),
                        created_at: run.at,
                        updated_at: run.at,
                        active: None,
                        runs: Vec::new(),
                        history: Vec::new(),
                        grants: Vec::new(),
                    });
                match (&session.active, waiting) {
                    (Some(active), _) => Err(StartConflict::SessionBusy {
                        session_id: run.session_id.clone(),
                        active: active.clone(),
                    }),
                    (None, Some(waiting)) => Err(StartConflict::Interrupted {
                        session_id: run.session_id.clone(),
                        waiting,
                    }),
                    (None, None) => {
                        session.active = Some(run.run_id.clone());
                        session.runs.push(run.run_id.clone());
                        session.updated_at = run.at;
                        if session.title.is_empty() && !run.message.is_empty() {
                            session.title = title_of(&run.message);
                        }
                        let runs_in_session = session.runs.len() as u64;
                        let mut row = RunRow {
                            info: RunInfo {
                                run_id: run.run_id.clone(),
                                session_id: run.session_id.clone(),
                                parent_run_id: run.parent_run_id,
                                mode: run.mode,
                                state: RunState::Running,
                                last_seq: 0,
                                event_bytes: 0,
                                abort: None,
                                created_at: run.at,
                            },
                            owner: Some(self.instance.clone()),
                            epoch: 1,
                            events: Vec::new(),
                            batch: None,
                            calls: Vec::new(),
                            suspension: None,
                            resumed_by: None,
                            conversation: None,
                            finished_at: None,
                        };
                        row.append(run.events);
                        let seq = row.info.last_seq;
                        if let Some(parent) = row.info.parent_run_id.as_ref()
                            && let Some(parent) = tables.runs.get_mut(parent)
                        {
                            parent.resumed_by = Some(run.run_id.clone());
                        }
                        tables.runs.insert(run.run_id.clone(), row);
                        tables.audit(run.audit);
                        tables.unfinished += 1;
                        Ok((seq, runs_in_session))
                    }
                }
            }
        };
        let result = result.map(|(seq, runs_in_session)| {
            self.runs.notify(&run.run_id, seq);
            self.sessions.notify(&run.session_id, runs_in_session);
            1
        });
        Self::ready(result)
    }

    fn append(&self, run_id: &RunId, epoch: Epoch, events: Vec<NewEvent>) {
        let seq = {
            let mut tables = self.tables.lock();
            let Some(row) = tables.runs.get_mut(run_id) else {
                return;
            };
            if row.owned_by(&self.instance, epoch).is_err() {
                return;
            }
            row.append(events);
            row.info.last_seq
        };
        self.runs.notify(run_id, seq);
    }

    fn flush(&self) -> StoreFuture<'_, ()> {
        Self::ready(())
    }

    fn close(&self) -> StoreFuture<'_, ()> {
        Self::ready(())
    }

    fn remote_stops(&self) -> tokio::sync::broadcast::Receiver<RemoteStop> {
        // One process: every abort is local.
        self.stops.subscribe()
    }

    fn open_batch(&self, batch: OpenBatch) -> StoreFuture<'_, Result<(), Fenced>> {
        let result = {
            let mut tables = self.tables.lock();
            match tables.runs.get_mut(&batch.run_id) {
                None => Err(Fenced::Lost),
                Some(row) => match (row.owned_by(&self.instance, batch.epoch), row.info.abort) {
                    (Err(fenced), _) => Err(fenced),
                    (Ok(()), Some(reason)) => Err(Fenced::Aborted(reason)),
                    (Ok(()), None) => {
                        row.info.state = RunState::Waiting;
                        row.owner = None;
                        row.batch = Some(batch.batch);
                        row.calls = batch.calls;
                        row.append(batch.events);
                        let seq = row.info.last_seq;
                        tables.audit(batch.audit);
                        Ok(seq)
                    }
                },
            }
        };
        Self::ready(result.map(|seq| self.runs.notify(&batch.run_id, seq)))
    }

    fn decide(
        &self,
        run_id: &RunId,
        call_id: &ToolCallId,
        settle: Settle,
    ) -> StoreFuture<'_, Result<CallRecord, DecideFailure>> {
        let result = {
            let mut guard = self.tables.lock();
            let tables = &mut *guard;
            let sessions = &tables.sessions;
            let decided = tables
                .runs
                .get_mut(run_id)
                .ok_or(DecideFailure::NotPending)
                .and_then(|row| {
                    let session_id = row.info.session_id.clone();
                    let record = row
                        .call_mut(call_id)
                        .filter(|record| record.status == CallStatus::Pending)
                        .ok_or(DecideFailure::NotPending)?;
                    let mut settlement = settle(record)?;
                    if let Some(grant_id) = &settlement.under_grant {
                        let held = sessions.get(&session_id).is_some_and(|session| {
                            session.grants.iter().any(|grant| grant.id == *grant_id)
                        });
                        if !held {
                            return Err(DecideFailure::GrantRevoked);
                        }
                    }
                    let audit = std::mem::take(&mut settlement.audit);
                    let grant = settlement.grant.take();
                    let events = RunRow::settle(record, settlement);
                    let decided = record.clone();
                    row.append(events);
                    Ok((
                        decided,
                        row.info.last_seq,
                        audit,
                        grant.map(|grant| (row.info.session_id.clone(), grant)),
                    ))
                });
            decided.map(|(record, seq, audit, grant)| {
                tables.audit(audit);
                // Kept with the decision: whoever sees the decision finds the grant.
                if let Some((session_id, grant)) = grant
                    && let Some(session) = tables.sessions.get_mut(&session_id)
                {
                    session.grants.retain(|kept| kept.id != grant.id);
                    session.grants.push(grant);
                }
                (record, seq)
            })
        };
        Self::ready(result.map(|(record, seq)| {
            self.runs.notify(run_id, seq);
            record
        }))
    }

    fn expire(&self, now_ms: u64, settle: SettleExpired) -> StoreFuture<'_, Vec<CallRecord>> {
        let mut expired = Vec::new();
        let mut touched = Vec::new();
        {
            let mut tables = self.tables.lock();
            let mut audit = Vec::new();
            for row in tables.runs.values_mut() {
                let mut events = Vec::new();
                for record in &mut row.calls {
                    let due = record.status == CallStatus::Pending
                        && record
                            .approval
                            .as_ref()
                            .is_some_and(|approval| approval.expires_at <= now_ms);
                    if due {
                        let mut settlement = settle(record);
                        audit.append(&mut settlement.audit);
                        events.extend(RunRow::settle(record, settlement));
                        expired.push(record.clone());
                    }
                }
                if !events.is_empty() {
                    row.append(events);
                    touched.push((row.info.run_id.clone(), row.info.last_seq));
                }
            }
            tables.audit(audit);
        }
        for (run_id, seq) in touched {
            self.runs.notify(&run_id, seq);
        }
        Self::ready(expired)
    }

    fn next_expiry(&self, after_ms: u64) -> StoreFuture<'_, Option<u64>> {
        let tables = self.tables.lock();
        let next = tables
            .runs
            .values()
            .flat_map(|row| &row.calls)
            .filter(|record| record.status == CallStatus::Pending)
            .filter_map(|record| record.approval.as_ref().map(|a| a.expires_at))
            .filter(|&at| at > after_ms)
            .min();
        Self::ready(next)
    }

    fn begin_call(
        &self,
        run_id: &RunId,
        call_id: &ToolCallId,
        inline: Option<(CallRecord, Epoch)>,
    ) -> StoreFuture<'_, Option<CallRecord>> {
        let mut tables = self.tables.lock();
        let begun = tables.runs.get_mut(run_id).and_then(|row| {
            if let Some((mut record, epoch)) = inline {
                row.owned_by(&self.instance, epoch).ok()?;
                // An aborted run begins nothing, even before its task hears of the abort.
                if row.info.abort.is_some() {
                    return None;
                }
                // A call of an earlier batch may have had the same id (the id is the model's); one of this
                // batch may not.
                if row
                    .call_mut(call_id)
                    .is_some_and(|earlier| !earlier.status.is_final())
                {
                    return None;
                }
                row.calls.retain(|earlier| &earlier.call.id != call_id);
                record.status = CallStatus::Executing;
                record.executing_on = Some(self.instance.clone());
                row.calls.push(record.clone());
                return Some(record);
            }
            let record = row.call_mut(call_id)?;
            if !record.status.is_runnable() {
                return None;
            }
            record.status = CallStatus::Executing;
            record.executing_on = Some(self.instance.clone());
            Some(record.clone())
        });
        Self::ready(begun)
    }

    fn settle_call(&self, result: CallResult) -> StoreFuture<'_, bool> {
        let seq = {
            let mut tables = self.tables.lock();
            let settled = tables.runs.get_mut(&result.run_id).and_then(|row| {
                let record = row.call_mut(&result.call_id)?;
                if record.status != CallStatus::Executing
                    || record.executing_on.as_ref() != Some(&self.instance)
                {
                    return None;
                }
                record.status = CallStatus::Settled;
                record.executing_on = None;
                record.output = Some(result.output);
                row.append(result.events);
                Some(row.info.last_seq)
            });
            if settled.is_some() {
                tables.audit(result.audit);
            }
            settled
        };
        if let Some(seq) = seq {
            self.runs.notify(&result.run_id, seq);
        }
        Self::ready(seq.is_some())
    }

    /// Its abort reads and settles every call, so nothing is `left_by_abort` here.
    fn claim_batch(&self, run_id: &RunId, _: SettleExpired) -> StoreFuture<'_, Option<Claimed>> {
        let mut tables = self.tables.lock();
        let claimed = tables.runs.get_mut(run_id).and_then(|row| {
            if row.info.state != RunState::Waiting || !row.batch_settled() {
                return None;
            }
            let batch = row.batch.take()?;
            row.info.state = RunState::Running;
            row.owner = Some(self.instance.clone());
            row.epoch += 1;
            let outputs = row
                .calls
                .drain(..)
                .filter_map(|record| record.output.map(|output| (record.call, output)))
                .collect();
            Some(Claimed {
                epoch: row.epoch,
                batch,
                outputs,
                run: row.info.clone(),
            })
        });
        Self::ready(claimed)
    }

    fn finish_run(&self, finish: FinishRun) -> StoreFuture<'_, Result<(), Fenced>> {
        let result = {
            let mut tables = self.tables.lock();
            let Tables {
                sessions,
                runs,
                finished,
                ..
            } = &mut *tables;
            let outcome = match runs.get_mut(&finish.run_id) {
                None => Err(Fenced::Lost),
                Some(row) => {
                    let fenced = match finish.claim {
                        // Interrupts are issued only while the run is not aborted (see the SQL store's).
                        EndClaim::Held(epoch) => row.owned_by(&self.instance, epoch).and(
                            match (&finish.suspension, row.info.abort) {
                                (Some(_), Some(reason)) => Err(Fenced::Aborted(reason)),
                                _ => Ok(()),
                            },
                        ),
                        EndClaim::Abandoned { ref owner, epoch } => row.owned_by(owner, epoch),
                        EndClaim::Unended if !row.info.state.is_finished() => Ok(()),
                        EndClaim::Waiting if row.info.state == RunState::Waiting => Ok(()),
                        EndClaim::Unended | EndClaim::Waiting => Err(Fenced::Lost),
                    };
                    match fenced {
                        Err(fenced) => Err(fenced),
                        Ok(()) => {
                            let mut entries = finish.audit;
                            if let Some(settle) = &finish.settle_pending {
                                let mut events = Vec::new();
                                for record in &mut row.calls {
                                    if record.status == CallStatus::Pending {
                                        let mut settlement = settle(record);
                                        entries.append(&mut settlement.audit);
                                        events.extend(RunRow::settle(record, settlement));
                                    }
                                }
                                row.append(events);
                            }
                            row.info.state = finish.state;
                            row.owner = None;
                            row.batch = None;
                            row.calls.clear();
                            row.suspension = finish.suspension;
                            row.conversation = finish.conversation.map(Arc::from);
                            row.finished_at = Some(now_ms());
                            row.append(finish.events);
                            let seq = row.info.last_seq;
                            if let Some(session) = sessions.get_mut(&row.info.session_id) {
                                session.history.extend(finish.history);
                                if session.active.as_ref() == Some(&finish.run_id) {
                                    session.active = None;
                                }
                                session.updated_at = now_ms();
                            }
                            finished.push_back(finish.run_id.clone());
                            Ok((seq, entries))
                        }
                    }
                }
            };
            outcome.map(|(seq, entries)| {
                tables.unfinished = tables.unfinished.saturating_sub(1);
                tables.audit(entries);
                seq
            })
        };
        Self::ready(result.map(|seq| self.runs.notify(&finish.run_id, seq)))
    }

    fn abort_run(
        &self,
        run_id: &RunId,
        reason: AbortReason,
        settle: SettleExpired,
    ) -> StoreFuture<'_, Option<Aborted>> {
        let result = {
            let mut tables = self.tables.lock();
            let mut entries = Vec::new();
            let aborted = tables.runs.get_mut(run_id).map(|row| {
                if !row.info.state.is_finished() {
                    row.info.abort.get_or_insert(reason);
                }
                let mut events = Vec::new();
                let mut executing = Vec::new();
                for record in &mut row.calls {
                    match record.status {
                        CallStatus::Pending | CallStatus::Allowed | CallStatus::Approved => {
                            let mut settlement = settle(record);
                            entries.append(&mut settlement.audit);
                            events.extend(RunRow::settle(record, settlement));
                        }
                        CallStatus::Executing => {
                            if let Some(instance) = &record.executing_on {
                                executing.push((record.call.id.clone(), instance.clone()));
                            }
                        }
                        _ => {}
                    }
                }
                row.append(events);
                Aborted {
                    run: row.info.clone(),
                    running_on: (row.info.state == RunState::Running)
                        .then(|| row.owner.clone())
                        .flatten(),
                    executing,
                }
            });
            tables.audit(entries);
            aborted
        };
        if let Some(aborted) = &result {
            self.runs.notify(run_id, aborted.run.last_seq);
        }
        Self::ready(result)
    }

    fn recover(&self, _events: RecoveryEvents) -> StoreFuture<'_, Recovered> {
        // Nothing of another process is here: a memory store starts empty.
        Self::ready(Recovered::default())
    }

    fn interrupt(&self, parent: &RunId) -> StoreFuture<'_, Option<(Suspension, Option<RunId>)>> {
        let tables = self.tables.lock();
        let found = tables.runs.get(parent).and_then(|row| {
            row.suspension
                .clone()
                .map(|suspension| (suspension, row.resumed_by.clone()))
        });
        Self::ready(found)
    }

    fn open_interrupt(&self, session_id: &SessionId) -> StoreFuture<'_, Option<(RunId, u64)>> {
        Self::ready(self.tables.lock().open_interrupt(session_id))
    }

    fn run(&self, run_id: &RunId) -> StoreFuture<'_, Option<RunInfo>> {
        let info = self
            .tables
            .lock()
            .runs
            .get(run_id)
            .map(|row| row.info.clone());
        Self::ready(info)
    }

    fn events_after(
        &self,
        run_id: &RunId,
        after: u64,
        limit: usize,
    ) -> StoreFuture<'_, Vec<Arc<EncodedEvent>>> {
        let tables = self.tables.lock();
        let events = tables
            .runs
            .get(run_id)
            .map(|row| {
                let start = usize::try_from(after)
                    .unwrap_or(usize::MAX)
                    .min(row.events.len());
                super::page_of(&row.events[start..], limit)
            })
            .unwrap_or_default();
        Self::ready(events)
    }

    fn watch_run(&self, run_id: &RunId) -> watch::Receiver<u64> {
        self.runs.watch(run_id)
    }

    fn watch_session(&self, session_id: &SessionId) -> watch::Receiver<u64> {
        self.sessions.watch(session_id)
    }

    fn session_runs(&self, session_id: &SessionId, limit: usize) -> StoreFuture<'_, Vec<RunId>> {
        let tables = self.tables.lock();
        let runs = tables
            .sessions
            .get(session_id)
            .map(|session| {
                let kept: Vec<RunId> = session
                    .runs
                    .iter()
                    .filter(|run_id| tables.runs.contains_key(*run_id))
                    .cloned()
                    .collect();
                let skip = kept.len().saturating_sub(limit);
                kept.into_iter().skip(skip).collect()
            })
            .unwrap_or_default();
        Self::ready(runs)
    }

    fn history(&self, session_id: &SessionId) -> StoreFuture<'_, Vec<Message>> {
        let history = self
            .tables
            .lock()
            .sessions
            .get(session_id)
            .map(|session| session.history.clone())
            .unwrap_or_default();
        Self::ready(history)
    }

    fn sessions(&self, limit: usize) -> StoreFuture<'_, Vec<SessionSummary>> {
        let tables = self.tables.lock();
        let mut sessions: Vec<SessionSummary> = tables
            .sessions
            .iter()
            .map(|(session_id, row)| summary(session_id, row))
            .collect();
        newest_first(&mut sessions);
        sessions.truncate(limit);
        Self::ready(sessions)
    }

    fn sessions_among(&self, ids: &[SessionId]) -> StoreFuture<'_, Vec<SessionSummary>> {
        let tables = self.tables.lock();
        let mut sessions: Vec<SessionSummary> = ids
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .filter_map(|id| tables.sessions.get(id).map(|row| summary(id, row)))
            .collect();
        newest_first(&mut sessions);
        Self::ready(sessions)
    }

    fn pending(&self, of: PendingOf<'_>) -> StoreFuture<'_, Vec<ApprovalRequest>> {
        let tables = self.tables.lock();
        let mut pending: Vec<ApprovalRequest> = tables
            .runs
            .values()
            .filter(|row| match of {
                PendingOf::All => true,
                PendingOf::Run(run_id) => &row.info.run_id == run_id,
                PendingOf::Session(session_id) => &row.info.session_id == session_id,
            })
            .flat_map(|row| &row.calls)
            .filter(|record| record.status == CallStatus::Pending)
            .filter_map(|record| record.approval.clone())
            .collect();
        pending.sort_by(|a, b| {
            (a.requested_at, a.run_id.as_str(), a.tool_call_id.as_str()).cmp(&(
                b.requested_at,
                b.run_id.as_str(),
                b.tool_call_id.as_str(),
            ))
        });
        Self::ready(pending)
    }

    fn call(&self, run_id: &RunId, call_id: &ToolCallId) -> StoreFuture<'_, Option<CallRecord>> {
        let mut tables = self.tables.lock();
        let record = tables
            .runs
            .get_mut(run_id)
            .and_then(|row| row.call_mut(call_id).map(|record| record.clone()));
        Self::ready(record)
    }

    fn calls(&self, run_id: &RunId) -> StoreFuture<'_, Vec<CallRecord>> {
        let calls = self
            .tables
            .lock()
            .runs
            .get(run_id)
            .map(|row| row.calls.clone())
            .unwrap_or_default();
        Self::ready(calls)
    }

    fn unfinished_runs(&self) -> StoreFuture<'_, Vec<RunId>> {
        let runs = self
            .tables
            .lock()
            .runs
            .values()
            .filter(|row| !row.info.state.is_finished())
            .map(|row| row.info.run_id.clone())
            .collect();
        Self::ready(runs)
    }

    fn held_runs(&self) -> StoreFuture<'_, Vec<HeldRun>> {
        let held = self
            .tables
            .lock()
            .runs
            .values()
            .filter(|row| {
                row.info.state == RunState::Running && row.owner.as_ref() == Some(&self.instance)
            })
            .map(|row| HeldRun {
                run_id: row.info.run_id.clone(),
                epoch: row.epoch,
                abort: row.info.abort,
            })
            .collect();
        Self::ready(held)
    }

    fn counts(&self) -> StoreFuture<'_, Counts> {
        let tables = self.tables.lock();
        let counts = Counts {
            unfinished_runs: tables.unfinished,
            sessions: tables.sessions.len() as u64,
        };
        Self::ready(counts)
    }

    fn stalled_runs(&self) -> StoreFuture<'_, Vec<RunId>> {
        let tables = self.tables.lock();
        let stalled = tables
            .runs
            .values()
            .filter(|row| row.info.state == RunState::Waiting)
            .filter(|row| {
                row.info.abort.is_some()
                    || row.batch_settled()
                    || row.calls.iter().any(|call| call.status.is_runnable())
            })
            .map(|row| row.info.run_id.clone())
            .collect();
        Self::ready(stalled)
    }

    fn conversation(&self, run_id: &RunId) -> StoreFuture<'_, Option<Arc<[Message]>>> {
        let conversation = self
            .tables
            .lock()
            .runs
            .get(run_id)
            .and_then(|row| row.conversation.clone());
        Self::ready(conversation)
    }

    fn grants(&self, session_id: &SessionId) -> StoreFuture<'_, Vec<StoredGrant>> {
        let grants = self
            .tables
            .lock()
            .sessions
            .get(session_id)
            .map(|session| session.grants.clone())
            .unwrap_or_default();
        Self::ready(grants)
    }

    fn add_grant(
        &self,
        run_id: &RunId,
        epoch: Epoch,
        grant: StoredGrant,
    ) -> StoreFuture<'_, Result<(), Fenced>> {
        let mut tables = self.tables.lock();
        let held = match tables.runs.get(run_id) {
            Some(row) => row
                .owned_by(&self.instance, epoch)
                .map(|()| row.info.session_id.clone()),
            None => Err(Fenced::Lost),
        };
        let kept = held.map(|session_id| {
            if let Some(session) = tables.sessions.get_mut(&session_id) {
                session.grants.retain(|kept| kept.id != grant.id);
                session.grants.push(grant);
            }
        });
        Self::ready(kept)
    }

    fn revoke_grant(
        &self,
        session_id: &SessionId,
        grant_id: &str,
        audit: AuditEntry,
    ) -> StoreFuture<'_, bool> {
        let mut tables = self.tables.lock();
        let revoked = tables.sessions.get_mut(session_id).is_some_and(|session| {
            let before = session.grants.len();
            session.grants.retain(|grant| grant.id != grant_id);
            session.grants.len() < before
        });
        if revoked {
            tables.audit(vec![audit]);
        }
        Self::ready(revoked)
    }

    fn rules(&self) -> StoreFuture<'_, Vec<StoredRule>> {
        Self::ready(self.tables.lock().rules.clone())
    }

    fn log_out(&self, login: &str, expires_at: u64) -> StoreFuture<'_, ()> {
        let gone_before = now_ms().saturating_sub(LOGOUT_KEPT_PAST_EXPIRY_MS);
        let mut tables = self.tables.lock();
        tables
            .logged_out
            .retain(|_, expires| *expires > gone_before);
        tables.logged_out.insert(login.to_owned(), expires_at);
        Self::ready(())
    }

    fn logged_out(&self, login: &str) -> StoreFuture<'_, bool> {
        Self::ready(self.tables.lock().logged_out.contains_key(login))
    }

    fn add_rule(&self, rule: StoredRule, audit: AuditEntry) -> StoreFuture<'_, bool> {
        let mut tables = self.tables.lock();
        if tables
            .rules
            .iter()
            .any(|kept| kept.id == rule.id && kept.rule == rule.rule)
        {
            return Self::ready(false);
        }
        tables.rules.retain(|kept| kept.id != rule.id);
        tables.rules.push(rule);
        tables.audit(vec![audit]);
        Self::ready(true)
    }

    fn remove_rule(&self, rule_id: &str, audit: AuditEntry) -> StoreFuture<'_, bool> {
        let mut tables = self.tables.lock();
        let before = tables.rules.len();
        tables.rules.retain(|rule| rule.id != rule_id);
        let removed = tables.rules.len() < before;
        if removed {
            tables.audit(vec![audit]);
        }
        Self::ready(removed)
    }

    fn audit(&self, entry: AuditEntry) -> StoreFuture<'_, ()> {
        self.tables.lock().audit(vec![entry]);
        Self::ready(())
    }

    fn audit_log(&self, query: AuditQuery) -> StoreFuture<'_, Vec<AuditEntry>> {
        let tables = self.tables.lock();
        let matching = tables.audit.iter().filter(|entry| query.matches(entry));
        let entries = if query.newest_first {
            matching.rev().take(query.limit).cloned().collect()
        } else {
            matching.take(query.limit).cloned().collect()
        };
        Self::ready(entries)
    }

    fn prune(&self, limits: RetentionLimits, now_ms: u64) -> StoreFuture<'_, usize> {
        let mut tables = self.tables.lock();
        let mut total: u64 = tables.runs.values().map(|row| row.info.event_bytes).sum();
        let mut kept = VecDeque::with_capacity(tables.finished.len());
        let mut pruned = 0;
        while let Some(run_id) = tables.finished.pop_front() {
            let Some(row) = tables.runs.get(&run_id) else {
                continue;
            };
            let old = row
                .finished_at
                .is_some_and(|at| now_ms.saturating_sub(at) >= limits.max_age_ms);
            // An open suspension is kept until it is resumed or expires: a person may still answer it. One a resume
            // took is kept while that resume goes on: should it fail at a restart, its interrupts come back here.
            let open = row.suspension.as_ref().is_some_and(|suspension| {
                row.resumed_by.is_none() && suspension.expires_at() > now_ms
            });
            let resumed_and_going = row.resumed_by.as_ref().is_some_and(|child| {
                tables
                    .runs
                    .get(child)
                    .is_some_and(|child| child.finished_at.is_none())
            });
            let open = open || resumed_and_going;
            if open || !(old || total > limits.max_event_bytes) {
                kept.push_back(run_id);
                continue;
            }
            total = total.saturating_sub(row.info.event_bytes);
            tables.runs.remove(&run_id);
            pruned += 1;
        }
        tables.finished = kept;
        // A session goes with the last of its runs, once it has been idle as long as a finished run is kept: its
        // conversation and grants with it. Otherwise sessions would only grow, up to the bound past which a run in a
        // new session is refused.
        let Tables { sessions, runs, .. } = &mut *tables;
        sessions.retain(|_, session| {
            session.active.is_some()
                || now_ms.saturating_sub(session.updated_at) < limits.max_age_ms
                || session.runs.iter().any(|run_id| runs.contains_key(run_id))
        });
        Self::ready(pruned)
    }
}
