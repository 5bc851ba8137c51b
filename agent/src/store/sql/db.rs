//! The two databases behind one small interface, so that the store's SQL is written once.
//!
//! PostgreSQL goes through sqlx's pool. SQLite goes through rusqlite, called inline on the task that runs the
//! query, with the connection behind an async mutex: sqlx runs every SQLite connection on a thread of its own and
//! hands each statement to it and its result back, two thread wake-ups per statement, which measured at about ten
//! times the CPU of the statements themselves (a commit in WAL mode with `synchronous = NORMAL` writes to the page
//! cache and does not wait for the disk, so running it inline blocks a worker for microseconds). Both crates link
//! the same bundled SQLite.
//!
//! SQLite's state changes commit in groups: a change that is done while another waits for the connection leaves
//! the transaction open for it (the change that joins is a savepoint, released into the transaction, so that it can
//! be undone alone; the change that began the transaction needs none), and the group commits once for all of
//! them; each waits for that commit before it returns. Most pages a change writes are the same few for
//! every change (the database's header, the newest rows of the runs and sessions, the small index of unfinished
//! runs), so a group writes them once instead of once per change. A change that is done while nobody waits may
//! also leave the group open for one turn of the runtime's queue, for changes about to begin ([`Linger`]), while
//! that keeps paying; else a change alone commits at once.
//!
//! The SQL uses `$n` parameters, which both databases accept; a statement may name them in any order. Values are
//! the few types the schema has: 64-bit integers and text, each maybe null.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::Row as _;
use sqlx::postgres::{PgPool, PgRow, Postgres};
use tokio::sync::{Mutex, OwnedMutexGuard, watch};

/// Something a database call could not do.
#[derive(Debug, thiserror::Error)]
pub(super) enum DbError {
    #[error(transparent)]
    Postgres(#[from] sqlx::Error),
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    #[error("{0}")]
    Decode(String),
    /// An event's key does not fit SQLite's events table (see `event_row`).
    #[error("the event {seq} of the run numbered {run} does not fit a row number")]
    EventKey { run: i64, seq: i64 },
    /// The commit of the group a change was in failed: none of the group's changes happened.
    #[error("the commit failed: {0}")]
    GroupCommit(String),
}

pub(super) type Db<T> = Result<T, DbError>;

/// A parameter's value. A text is borrowed where the caller has it, so that binding it copies it once, into SQLite.
#[derive(Clone, Debug)]
pub(super) enum Value<'q> {
    Int(Option<i64>),
    Text(Option<Cow<'q, str>>),
}

impl From<i64> for Value<'_> {
    fn from(value: i64) -> Self {
        Self::Int(Some(value))
    }
}

impl From<Option<i64>> for Value<'_> {
    fn from(value: Option<i64>) -> Self {
        Self::Int(value)
    }
}

impl<'q> From<&'q str> for Value<'q> {
    fn from(value: &'q str) -> Self {
        Self::Text(Some(Cow::Borrowed(value)))
    }
}

impl<'q> From<&'q String> for Value<'q> {
    fn from(value: &'q String) -> Self {
        Self::Text(Some(Cow::Borrowed(value)))
    }
}

impl From<String> for Value<'_> {
    fn from(value: String) -> Self {
        Self::Text(Some(Cow::Owned(value)))
    }
}

impl From<Option<String>> for Value<'_> {
    fn from(value: Option<String>) -> Self {
        Self::Text(value.map(Cow::Owned))
    }
}

impl<'q> From<Option<&'q str>> for Value<'q> {
    fn from(value: Option<&'q str>) -> Self {
        Self::Text(value.map(Cow::Borrowed))
    }
}

/// A statement and its parameters, `$1` first.
pub(super) struct Query<'q> {
    sql: Cow<'q, str>,
    params: Vec<Value<'q>>,
}

/// A statement to run.
pub(super) fn query<'q>(sql: impl Into<Cow<'q, str>>) -> Query<'q> {
    Query {
        sql: sql.into(),
        params: Vec::new(),
    }
}

/// What a statement that returns no rows did.
#[derive(Clone, Copy, Debug)]
pub(super) struct Done {
    rows: u64,
    /// On SQLite, the connection's last inserted row number (`rowid`), after a statement that changed rows: see
    /// [`Done::inserted_row`].
    inserted: Option<i64>,
}

impl Done {
    pub(super) fn rows_affected(&self) -> u64 {
        self.rows
    }

    /// The row number SQLite gave the last row this statement inserted: what `RETURNING rowid` would say, without
    /// the table SQLite makes to hold what a statement returns. `None` on PostgreSQL, and for a statement that
    /// changed no row. Only for a plain `INSERT`: SQLite counts no row that an `UPDATE`, a `DELETE` or an upsert's
    /// `DO UPDATE` changes as inserted, so after one of those this is a row the connection inserted before.
    pub(super) fn inserted_row(&self) -> Option<i64> {
        self.inserted
    }
}

/// A pool of connections to one database: for SQLite, one connection.
#[derive(Clone)]
pub(super) enum Pool {
    Sqlite(Arc<Sqlite>),
    Postgres(PgPool),
}

/// What runs once a transaction committed, or once it rolled back.
type Hook = Box<dyn FnOnce() + Send>;

/// How many changes one group commits at most: each waits for the last, so this bounds how long the first waits.
const GROUP_CHANGES: usize = 32;

/// How long a change waits for its group's commit before it commits the group itself: the change the group was
/// left open for may have gone (its task was cancelled while it waited for the connection).
const GROUP_WAIT: Duration = Duration::from_millis(2);

/// Lingers in a row that found no company, after which changes stop lingering ([`Linger`]).
const LINGER_MISSES: u32 = 8;

/// While changes do not linger, one change in this many lingers all the same, to find out whether it pays again.
const LINGER_PROBE_EVERY: u32 = 16;

/// Whether a change that is done while no other waits for the connection leaves its group open (lingers) for one
/// turn of the runtime's queue before it commits it, so that the changes of the tasks that run meanwhile join the
/// group instead of each committing one of their own. Under a load of many runs at once they do: at concurrency 32
/// an AG-UI trip's changes committed in 0.33 groups instead of 0.89, and the trip took about 4% less CPU (measured,
/// see the README). With one run at a time nobody joins, and the turn costs: the runtime wakes an idle worker for
/// the task that yields (11 to 14% more CPU a trip at concurrency 1 when every change lingered). So changes linger
/// only while lingering finds company: after [`LINGER_MISSES`] lingers in a row that found none, only one change in
/// [`LINGER_PROBE_EVERY`] does.
#[derive(Default)]
struct Linger {
    /// Lingers in a row that found no company (at most [`LINGER_MISSES`]).
    misses: AtomicU32,
    /// Changes that did not linger since the last that did, while lingering does not pay.
    skipped: AtomicU32,
}

impl Linger {
    /// Whether the change that is done now lingers.
    fn now(&self) -> bool {
        if self.misses.load(Ordering::Relaxed) < LINGER_MISSES {
            return true;
        }
        let skipped = self.skipped.fetch_add(1, Ordering::Relaxed) + 1;
        if skipped < LINGER_PROBE_EVERY {
            return false;
        }
        self.skipped.store(0, Ordering::Relaxed);
        true
    }

    /// What a linger found: whether a change joined the group meanwhile.
    fn found(&self, company: bool) {
        if company {
            self.misses.store(0, Ordering::Relaxed);
            self.skipped.store(0, Ordering::Relaxed);
        } else {
            let misses = self.misses.load(Ordering::Relaxed);
            self.misses
                .store((misses + 1).min(LINGER_MISSES), Ordering::Relaxed);
        }
    }
}

/// A SQLite connection, behind an async mutex, and the group of changes its open transaction holds.
pub(super) struct Sqlite {
    writer: Arc<Mutex<Writer>>,
    /// How many changes wait for the connection: while one does, a change that is done leaves the group open (as
    /// does one that lingers).
    waiting: AtomicUsize,
    /// Numbers the groups.
    groups: AtomicU64,
    linger: Linger,
}

/// The connection and its open group.
pub(super) struct Writer {
    connection: Connection,
    group: Option<Group>,
}

self_cell::self_cell!(
    /// A SQLite connection and the statements prepared on it.
    pub(super) struct Connection {
        owner: rusqlite::Connection,
        #[not_covariant]
        dependent: Statements,
    }
);

// SAFETY: a `rusqlite::Connection` is `Send`: SQLite is built thread-safe, and a connection may be used on one
// thread after another, never on two at once. rusqlite keeps the statements of its own cache inside the connection,
// as raw handles, and they move with it. The statements here are not `Send` only because each holds such a handle
// and borrows the connection (which is not `Sync`): they belong to this connection alone, move with it, and are
// reached only through `with_dependent` on `&self`, which cannot run on two threads at once (this type is not
// `Sync`: its statements are in a `RefCell`). Moving both is moving the connection with its statements.
unsafe impl Send for Connection {}

/// The statements the store ran on a connection, prepared once and kept by their text, each with the order of its
/// parameters. rusqlite's own cache (`prepare_cached`) hashes the text twice a use, copies it into a new allocation
/// each time and clears the bindings when the statement comes back, and the parameters' names were read at every
/// binding: about a twentieth of the instructions of an AG-UI round trip on SQLite, where a use here is one lookup.
/// The text is the store's own, never a client's, so a fast hash with a fixed seed is safe.
#[derive(Default)]
pub(super) struct Statements<'c>(RefCell<Kept<'c>>);

type Kept<'c> = HashMap<Box<str>, Prepared<'c>, foldhash::fast::FixedState>;

/// How many statements a connection keeps: more than the store's SQL has (under 500 texts: its statements, the
/// insert of events for each number of rows up to 256, the audit log's filters), a bound against SQL that some day
/// varies with its values. Once it is reached, a new text is prepared for its use alone.
const STATEMENTS: usize = 512;

/// A prepared statement, and for each of its parameters (in SQLite's order, the order of their first use in the
/// text) which of a query's values it takes: `$n` takes the n-th.
pub(super) struct Prepared<'c> {
    statement: rusqlite::Statement<'c>,
    values: Box<[usize]>,
    /// The names of the columns it returns, shared by the rows it reads.
    names: Arc<[String]>,
    /// How many bytes of text its last use bound.
    bound_text: usize,
}

/// The most text a statement keeps bound between its uses: more (a conversation, a run's events) is let go after
/// the use.
const KEPT_TEXT: usize = 4096;

impl<'c> Prepared<'c> {
    fn new(connection: &'c rusqlite::Connection, sql: &str) -> Db<Self> {
        let statement =
            connection.prepare_with_flags(sql, rusqlite::PrepFlags::SQLITE_PREPARE_PERSISTENT)?;
        let values = (1..=statement.parameter_count())
            .map(|index| {
                statement
                    .parameter_name(index)
                    .and_then(|name| name.strip_prefix('$'))
                    .and_then(|n| n.parse::<usize>().ok())
                    .and_then(|n| n.checked_sub(1))
                    .ok_or_else(|| {
                        DbError::Decode(format!(
                            "parameter {index} of {sql:?} is not one of $1, $2, ..."
                        ))
                    })
            })
            .collect::<Db<_>>()?;
        Ok(Self {
            names: column_names(&statement),
            statement,
            values,
            bound_text: 0,
        })
    }

    /// The names of the columns it returns (read again if SQLite prepared it anew, after a change of the schema,
    /// with another number of columns; the store's statements name their columns, and its schema changes only in
    /// its migrations, before these connections open).
    fn names(&mut self) -> Arc<[String]> {
        if self.statement.column_count() != self.names.len() {
            self.names = column_names(&self.statement);
        }
        Arc::clone(&self.names)
    }

    /// Binds each parameter of the statement of `sql` to its value in `params`.
    fn bind(&mut self, sql: &str, params: &[Value<'_>]) -> Db<&mut rusqlite::Statement<'c>> {
        for (index, value) in self.values.iter().enumerate() {
            let value = params.get(*value).ok_or_else(|| {
                DbError::Decode(format!("${} of {sql:?} has no value", value + 1))
            })?;
            match value {
                Value::Int(value) => self.statement.raw_bind_parameter(index + 1, value)?,
                Value::Text(value) => {
                    let value = value.as_deref();
                    self.bound_text += value.map_or(0, str::len);
                    self.statement.raw_bind_parameter(index + 1, value)?
                }
            }
        }
        Ok(&mut self.statement)
    }

    /// Runs `work` with it. More than [`KEPT_TEXT`] of text bound to it is let go after, not kept until the next
    /// use.
    fn run<T>(&mut self, work: impl FnOnce(&mut Self) -> Db<T>) -> Db<T> {
        let outcome = work(self);
        if self.bound_text > KEPT_TEXT {
            self.statement.clear_bindings();
        }
        self.bound_text = 0;
        outcome
    }
}

fn column_names(statement: &rusqlite::Statement<'_>) -> Arc<[String]> {
    statement
        .column_names()
        .into_iter()
        .map(str::to_owned)
        .collect()
}

impl Connection {
    fn open(connection: rusqlite::Connection) -> Self {
        Self::new(connection, |_| Statements::default())
    }

    fn sqlite(&self) -> &rusqlite::Connection {
        self.borrow_owner()
    }

    /// Runs `work` with the statement of `sql`, prepared the first time.
    fn with_statement<T>(&self, sql: &str, work: impl FnOnce(&mut Prepared<'_>) -> Db<T>) -> Db<T> {
        self.with_dependent(|connection, statements| {
            // Never borrowed already (`work` runs no other statement); were it so, the statement is prepared anew.
            let Ok(mut statements) = statements.0.try_borrow_mut() else {
                return Prepared::new(connection, sql)?.run(work);
            };
            if let Some(prepared) = statements.get_mut(sql) {
                return prepared.run(work);
            }
            let mut prepared = Prepared::new(connection, sql)?;
            let outcome = prepared.run(work);
            if statements.len() < STATEMENTS {
                statements.insert(sql.into(), prepared);
            }
            outcome
        })
    }
}

/// Changes released into the open transaction, waiting for its commit.
struct Group {
    id: u64,
    changes: usize,
    /// The changes' hooks, in the order the changes were done.
    after_commit: Vec<Hook>,
    after_rollback: Vec<Hook>,
    /// The commit's outcome, for the changes that wait for it.
    done: watch::Sender<Option<Result<(), String>>>,
}

impl Writer {
    /// Commits group `id` if it is the open one. How many changes it committed, if it did.
    fn finish_group_if(&mut self, id: u64) -> Option<usize> {
        let changes = self
            .group
            .as_ref()
            .filter(|group| group.id == id)
            .map(|group| group.changes)?;
        self.finish_group();
        Some(changes)
    }

    /// Commits the open group, if any: its hooks run in the order its changes were done, before the connection is
    /// let go. If the commit fails, none of the group's changes happened: their rollback hooks run, newest first.
    fn finish_group(&mut self) {
        let Some(group) = self.group.take() else {
            return;
        };
        let outcome = match run_cached(&self.connection, "COMMIT") {
            Ok(()) => {
                for hook in group.after_commit {
                    hook();
                }
                Ok(())
            }
            Err(error) => {
                tracing::error!(%error, changes = group.changes, "cannot commit a group of changes");
                if !self.connection.sqlite().is_autocommit()
                    && let Err(error) = self.connection.sqlite().execute_batch("ROLLBACK")
                {
                    tracing::error!(%error, "cannot roll a SQLite transaction back");
                }
                for hook in group.after_rollback.into_iter().rev() {
                    hook();
                }
                Err(error.to_string())
            }
        };
        group.done.send_replace(Some(outcome));
    }
}

/// Runs a statement of the transactions' own from the connection's statements: it is parsed once, not at every
/// change.
fn run_cached(connection: &Connection, sql: &str) -> Db<()> {
    connection.with_statement(sql, |prepared| {
        Ok(prepared.statement.raw_execute().map(drop)?)
    })
}

/// The connection, held. Letting it go commits the open group unless a change waits to join it, or the change
/// that lets it go lingers ([`Linger`]).
pub(super) struct Held {
    writer: OwnedMutexGuard<Writer>,
    pool: Arc<Sqlite>,
    lingers: bool,
}

impl std::ops::Deref for Held {
    type Target = rusqlite::Connection;
    fn deref(&self) -> &rusqlite::Connection {
        self.writer.connection.sqlite()
    }
}

impl Held {
    /// The connection with its statements.
    fn connection(&self) -> &Connection {
        &self.writer.connection
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let full = self
            .writer
            .group
            .as_ref()
            .is_some_and(|group| group.changes >= GROUP_CHANGES);
        if full || (!self.lingers && self.pool.waiting.load(Ordering::Acquire) == 0) {
            self.writer.finish_group();
        }
    }
}

/// Counts a change waiting for the connection, until it has it or is cancelled.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Sqlite {
    fn held(self: &Arc<Self>, writer: OwnedMutexGuard<Writer>) -> Held {
        Held {
            writer,
            pool: Arc::clone(self),
            lingers: false,
        }
    }

    /// The connection, for a change: the open group stays open for it.
    async fn hold_for_change(self: &Arc<Self>) -> Held {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let waiting = Waiting(&self.waiting);
        let writer = Arc::clone(&self.writer).lock_owned().await;
        drop(waiting);
        self.held(writer)
    }

    /// The connection, for a statement outside any change: what the open group holds is committed first, so that
    /// the statement reads only what is committed (and a write is not taken into the group).
    pub(super) async fn hold(self: &Arc<Self>) -> Held {
        let mut writer = Arc::clone(&self.writer).lock_owned().await;
        writer.finish_group();
        self.held(writer)
    }

    /// As [`Sqlite::hold`], from a thread outside the runtime.
    pub(super) fn hold_blocking(self: &Arc<Self>) -> Held {
        let mut writer = Arc::clone(&self.writer).blocking_lock_owned();
        writer.finish_group();
        self.held(writer)
    }

    /// Commits a group that nobody is left to commit (every change in it was cancelled while it waited), if the
    /// connection is free now. A group that a change lingers for is committed with it: the change then finds it
    /// committed.
    pub(super) fn finish_orphaned_group(&self) {
        if self.waiting.load(Ordering::Acquire) == 0
            && let Ok(mut writer) = self.writer.try_lock()
        {
            writer.finish_group();
        }
    }

    /// Commits group `id` unless it is committed already. How many changes it committed, if it did.
    async fn finish(self: &Arc<Self>, id: u64) -> Option<usize> {
        Arc::clone(&self.writer)
            .lock_owned()
            .await
            .finish_group_if(id)
    }

    /// Commits group `id` if it is still open: at once if the connection is free, else on a task of its own once
    /// the connection is let go (whoever holds it may not commit the group: a read that only looks whether a group
    /// is open, or a change's wait for another group). For a change whose commit was dropped while it lingered.
    fn finish_soon(self: &Arc<Self>, id: u64) {
        match self.writer.try_lock() {
            Ok(mut writer) => {
                writer.finish_group_if(id);
            }
            Err(_) => {
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    let pool = Arc::clone(self);
                    runtime.spawn(async move { pool.finish(id).await });
                }
                // Outside a runtime (it was shut down): the next change, read of calls or checkpointer round commits
                // the group.
            }
        }
    }
}

/// Commits a lingering change's group if the change's commit is dropped before the group is known committed.
struct Lingering<'a> {
    pool: &'a Arc<Sqlite>,
    id: u64,
}

impl Lingering<'_> {
    /// The group is committed: nothing is left to do on the way out.
    fn defuse(self) {
        std::mem::forget(self);
    }
}

impl Drop for Lingering<'_> {
    fn drop(&mut self) {
        self.pool.finish_soon(self.id);
    }
}

/// A transaction: it commits on [`Tx::commit`] and rolls back when dropped before.
pub(super) struct Tx {
    connection: TxConnection,
    committed: bool,
    after_commit: Vec<Hook>,
    after_rollback: Vec<Hook>,
}

enum TxConnection {
    /// The connection, in the group's transaction, and how this change is undone until committed.
    Sqlite(Held, Undo),
    /// `None` only once committed.
    Postgres(Option<sqlx::Transaction<'static, Postgres>>),
    /// Committed (SQLite: released into its group).
    Done,
}

/// How a SQLite change that is not committed yet is undone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Undo {
    /// The change began its group's transaction and is all of it until it is released: undone by rolling the
    /// transaction back. It needs no savepoint, so SQLite copies none of the pages it changes to a savepoint's
    /// journal (at concurrency 1, every change is such a change).
    Transaction,
    /// The change joined an open group: its own part is the savepoint `change`, undone alone.
    Savepoint,
}

fn after_commit() -> DbError {
    DbError::Decode("a statement after the transaction committed".to_owned())
}

/// The connection of a PostgreSQL transaction.
fn in_tx<'t>(
    tx: &'t mut Option<sqlx::Transaction<'static, Postgres>>,
) -> Db<&'t mut sqlx::PgConnection> {
    match tx {
        Some(tx) => Ok(&mut **tx),
        None => Err(after_commit()),
    }
}

/// Where a statement runs: in a transaction, or on any connection of a pool.
pub(super) enum On<'e> {
    Tx(&'e mut Tx),
    Pool(&'e Pool),
}

impl<'e> From<&'e mut Tx> for On<'e> {
    fn from(tx: &'e mut Tx) -> Self {
        Self::Tx(tx)
    }
}

impl<'e> From<&'e Pool> for On<'e> {
    fn from(pool: &'e Pool) -> Self {
        Self::Pool(pool)
    }
}

impl Pool {
    /// Whether SQLite's connection is taken, or its group open (for a change that waits to join it, or one that
    /// lingers): a statement on it would wait for the change, and then end the group early. Never on PostgreSQL's
    /// pool.
    pub(super) fn is_busy(&self) -> bool {
        match self {
            Self::Sqlite(pool) => {
                pool.waiting.load(Ordering::Acquire) > 0
                    || pool
                        .writer
                        .try_lock()
                        .map_or(true, |writer| writer.group.is_some())
            }
            Self::Postgres(_) => false,
        }
    }

    pub(super) fn sqlite(connection: rusqlite::Connection) -> Self {
        Self::Sqlite(Arc::new(Sqlite {
            writer: Arc::new(Mutex::new(Writer {
                connection: Connection::open(connection),
                group: None,
            })),
            waiting: AtomicUsize::new(0),
            groups: AtomicU64::new(0),
            linger: Linger::default(),
        }))
    }

    /// Begins a transaction. SQLite's takes the write lock at once (`IMMEDIATE`): a transaction that reads and then
    /// writes never finds the database changed under it. It joins the open group, if there is one.
    pub(super) async fn begin(&self) -> Db<Tx> {
        match self {
            Self::Sqlite(pool) => {
                let mut held = pool.hold_for_change().await;
                if held.writer.group.is_some() {
                    if let Err(error) = run_cached(held.connection(), "SAVEPOINT change") {
                        // The group cannot go on in a transaction that refuses a savepoint.
                        held.writer.finish_group();
                        return Err(error);
                    }
                    return Ok(Tx::new(TxConnection::Sqlite(held, Undo::Savepoint)));
                }
                // A transaction whose rollback failed (logged when it was dropped) would otherwise refuse every later
                // one: end it first.
                if !held.is_autocommit() {
                    held.execute_batch("ROLLBACK")?;
                }
                run_cached(held.connection(), "BEGIN IMMEDIATE")?;
                held.writer.group = Some(Group {
                    id: pool.groups.fetch_add(1, Ordering::Relaxed),
                    changes: 0,
                    after_commit: Vec::new(),
                    after_rollback: Vec::new(),
                    done: watch::channel(None).0,
                });
                Ok(Tx::new(TxConnection::Sqlite(held, Undo::Transaction)))
            }
            Self::Postgres(pool) => Ok(Tx::new(TxConnection::Postgres(Some(pool.begin().await?)))),
        }
    }
}

impl Tx {
    fn new(connection: TxConnection) -> Self {
        Self {
            connection,
            committed: false,
            after_commit: Vec::new(),
            after_rollback: Vec::new(),
        }
    }

    /// Runs `hook` once the transaction committed. SQLite runs it before the connection is let go, so that the hooks
    /// of this process's transactions run in the order the transactions committed.
    pub(super) fn after_commit(&mut self, hook: impl FnOnce() + Send + 'static) {
        self.after_commit.push(Box::new(hook));
    }

    /// Runs `hook` once the transaction rolled back (or failed to commit).
    pub(super) fn after_rollback(&mut self, hook: impl FnOnce() + Send + 'static) {
        self.after_rollback.push(Box::new(hook));
    }

    /// Commits. On SQLite the change is released into its group, and this waits for the group's commit; the hooks
    /// run with the group's, even if this future is dropped while it waits.
    pub(super) async fn commit(mut self) -> Db<()> {
        match &mut self.connection {
            TxConnection::Sqlite(held, undo) => {
                if *undo == Undo::Savepoint {
                    run_cached(held.connection(), "RELEASE change")?;
                }
                let pool = Arc::clone(&held.pool);
                let Some(group) = held.writer.group.as_mut() else {
                    return Err(DbError::GroupCommit(
                        "the transaction ended early".to_owned(),
                    ));
                };
                group.changes += 1;
                group.after_commit.append(&mut self.after_commit);
                group.after_rollback.append(&mut self.after_rollback);
                let (id, changes, mut done) = (group.id, group.changes, group.done.subscribe());
                self.committed = true;
                held.lingers = group.changes < GROUP_CHANGES
                    && pool.waiting.load(Ordering::Acquire) == 0
                    && pool.linger.now();
                let lingers = held.lingers;
                // Letting the connection go commits the group, unless a change waits to join it or this one lingers.
                self.connection = TxConnection::Done;
                if lingers {
                    let lingering = Lingering { pool: &pool, id };
                    tokio::task::yield_now().await;
                    // Committed meanwhile by another: mostly a change that joined the group (one that did not linger,
                    // or filled the group), now and then a round of the checkpointer, a read of calls or the change
                    // of a group member whose wait ran out. All count as company: the error only leans towards
                    // lingering, which costs little while others run.
                    let committed = done.borrow_and_update().is_some();
                    let company = committed
                        || pool
                            .finish(id)
                            .await
                            .is_none_or(|committed| committed > changes);
                    lingering.defuse();
                    pool.linger.found(company);
                }
                loop {
                    if let Some(outcome) = done.borrow_and_update().clone() {
                        return outcome.map_err(DbError::GroupCommit);
                    }
                    match tokio::time::timeout(GROUP_WAIT, done.changed()).await {
                        Ok(Ok(())) => {}
                        // The group is gone: its outcome was sent before.
                        Ok(Err(_)) => {
                            let outcome = done.borrow().clone();
                            return outcome
                                .unwrap_or_else(|| Err("the group was dropped".to_owned()))
                                .map_err(DbError::GroupCommit);
                        }
                        Err(_) => {
                            pool.finish(id).await;
                        }
                    }
                }
            }
            TxConnection::Postgres(tx) => {
                if let Some(tx) = tx.take() {
                    tx.commit().await?;
                }
            }
            TxConnection::Done => {}
        }
        self.committed = true;
        for hook in std::mem::take(&mut self.after_commit) {
            hook();
        }
        Ok(())
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        // Rollback hooks run newest first: this change's, then (if the group fails with it) the group's, whose
        // changes came before it. A hook that puts something back in front of a queue then leaves the queue in the
        // order it was taken in.
        let mut undone = std::mem::take(&mut self.after_rollback);
        undone.reverse();
        // sqlx rolls a PostgreSQL transaction back when it is dropped. On SQLite only this change is undone; the
        // group's other changes stay.
        if let TxConnection::Sqlite(held, Undo::Transaction) = &mut self.connection {
            // The change is all that its group's transaction holds (no other joins while it holds the connection):
            // the transaction goes, and the group with it.
            if !held.is_autocommit()
                && let Err(error) = held.execute_batch("ROLLBACK")
            {
                tracing::error!(%error, "cannot roll a SQLite transaction back");
            }
            if let Some(group) = held.writer.group.take()
                && group.changes > 0
            {
                // Never so, but were a change released into it, it went with the transaction: as after a failed
                // group commit.
                undone.extend(group.after_rollback.into_iter().rev());
                for hook in undone.drain(..) {
                    hook();
                }
                group.done.send_replace(Some(Err(
                    "the change that began its group was undone".to_owned()
                )));
            }
        }
        if let TxConnection::Sqlite(held, Undo::Savepoint) = &mut self.connection
            && let Err(error) = held.execute_batch("ROLLBACK TO change; RELEASE change")
        {
            tracing::error!(%error, "cannot roll a SQLite change back; its group fails with it");
            if !held.is_autocommit()
                && let Err(error) = held.execute_batch("ROLLBACK")
            {
                tracing::error!(%error, "cannot roll a SQLite transaction back");
            }
            if let Some(group) = held.writer.group.take() {
                undone.extend(group.after_rollback.into_iter().rev());
                for hook in undone.drain(..) {
                    hook();
                }
                // Its changes learn the outcome once every hook ran, as after a failed group commit.
                group
                    .done
                    .send_replace(Some(Err(format!("a change of its group failed: {error}"))));
            }
        }
        for hook in undone {
            hook();
        }
    }
}

impl<'q> Query<'q> {
    pub(super) fn bind(mut self, value: impl Into<Value<'q>>) -> Self {
        self.params.push(value.into());
        self
    }

    pub(super) async fn execute<'e>(self, on: impl Into<On<'e>>) -> Db<Done> {
        match on.into() {
            On::Tx(Tx {
                connection: TxConnection::Sqlite(held, _),
                ..
            }) => self.sqlite_execute(held.connection()),
            On::Pool(Pool::Sqlite(pool)) => self.sqlite_execute(pool.hold().await.connection()),
            On::Tx(Tx {
                connection: TxConnection::Postgres(tx),
                ..
            }) => Ok(Done {
                rows: self.postgres().execute(in_tx(tx)?).await?.rows_affected(),
                inserted: None,
            }),
            On::Pool(Pool::Postgres(pool)) => Ok(Done {
                rows: self.postgres().execute(pool).await?.rows_affected(),
                inserted: None,
            }),
            On::Tx(Tx {
                connection: TxConnection::Done,
                ..
            }) => Err(after_commit()),
        }
    }

    pub(super) async fn fetch_all<'e>(self, on: impl Into<On<'e>>) -> Db<Vec<Row>> {
        match on.into() {
            On::Tx(Tx {
                connection: TxConnection::Sqlite(held, _),
                ..
            }) => self.sqlite_rows(held.connection(), usize::MAX),
            On::Pool(Pool::Sqlite(pool)) => {
                self.sqlite_rows(pool.hold().await.connection(), usize::MAX)
            }
            On::Tx(Tx {
                connection: TxConnection::Postgres(tx),
                ..
            }) => Ok(self
                .postgres()
                .fetch_all(in_tx(tx)?)
                .await?
                .into_iter()
                .map(Row::Postgres)
                .collect()),
            On::Pool(Pool::Postgres(pool)) => Ok(self
                .postgres()
                .fetch_all(pool)
                .await?
                .into_iter()
                .map(Row::Postgres)
                .collect()),
            On::Tx(Tx {
                connection: TxConnection::Done,
                ..
            }) => Err(after_commit()),
        }
    }

    /// The rows, in their order, while their values' text and blobs come to at most `bytes`, or the first alone:
    /// what stays in memory at once when rows may be large. SQLite stops stepping there. PostgreSQL sends a query's
    /// whole result whatever is read of it (and the connection reads the rest before its next use), so there the
    /// query must stop itself, and all it returns is taken.
    pub(super) async fn fetch_within(self, pool: &Pool, bytes: usize) -> Db<Vec<Row>> {
        match pool {
            Pool::Sqlite(pool) => {
                self.sqlite_rows_within(pool.hold().await.connection(), usize::MAX, bytes)
            }
            Pool::Postgres(_) => self.fetch_all(pool).await,
        }
    }

    pub(super) async fn fetch_optional<'e>(self, on: impl Into<On<'e>>) -> Db<Option<Row>> {
        match on.into() {
            On::Tx(Tx {
                connection: TxConnection::Sqlite(held, _),
                ..
            }) => Ok(self.sqlite_rows(held.connection(), 1)?.into_iter().next()),
            On::Pool(Pool::Sqlite(pool)) => Ok(self
                .sqlite_rows(pool.hold().await.connection(), 1)?
                .into_iter()
                .next()),
            On::Tx(Tx {
                connection: TxConnection::Postgres(tx),
                ..
            }) => Ok(self
                .postgres()
                .fetch_optional(in_tx(tx)?)
                .await?
                .map(Row::Postgres)),
            On::Pool(Pool::Postgres(pool)) => Ok(self
                .postgres()
                .fetch_optional(pool)
                .await?
                .map(Row::Postgres)),
            On::Tx(Tx {
                connection: TxConnection::Done,
                ..
            }) => Err(after_commit()),
        }
    }

    pub(super) async fn fetch_one<'e>(self, on: impl Into<On<'e>>) -> Db<Row> {
        self.fetch_optional(on)
            .await?
            .ok_or_else(|| DbError::Decode("the query returned no row".to_owned()))
    }

    fn postgres(&self) -> sqlx::query::Query<'_, Postgres, sqlx::postgres::PgArguments> {
        let mut query = sqlx::query(sqlx::AssertSqlSafe(&*self.sql));
        for value in &self.params {
            query = match value {
                Value::Int(value) => query.bind(*value),
                Value::Text(value) => query.bind(value.as_deref()),
            };
        }
        query
    }

    fn sqlite_execute(&self, connection: &Connection) -> Db<Done> {
        connection.with_statement(&self.sql, |prepared| {
            let rows = prepared.bind(&self.sql, &self.params)?.raw_execute()?;
            Ok(Done {
                rows: rows as u64,
                inserted: (rows > 0).then(|| connection.sqlite().last_insert_rowid()),
            })
        })
    }

    fn sqlite_rows(&self, connection: &Connection, limit: usize) -> Db<Vec<Row>> {
        self.sqlite_rows_within(connection, limit, usize::MAX)
    }

    /// At most `limit` rows, until their values pass `bytes` (see [`Self::fetch_within`]).
    fn sqlite_rows_within(
        &self,
        connection: &Connection,
        limit: usize,
        bytes: usize,
    ) -> Db<Vec<Row>> {
        connection.with_statement(&self.sql, |prepared| {
            let names = prepared.names();
            let width = names.len();
            let statement = prepared.bind(&self.sql, &self.params)?;
            let mut rows = statement.raw_query();
            let mut out = Vec::new();
            let mut size = 0;
            while out.len() < limit
                && let Some(row) = rows.next()?
            {
                let values = (0..width)
                    .map(|i| row.get::<_, rusqlite::types::Value>(i))
                    .collect::<Result<Vec<_>, _>>()?;
                if bytes != usize::MAX {
                    size += values
                        .iter()
                        .map(|value| match value {
                            rusqlite::types::Value::Text(text) => text.len(),
                            rusqlite::types::Value::Blob(blob) => blob.len(),
                            _ => 0,
                        })
                        .sum::<usize>();
                    if size > bytes && !out.is_empty() {
                        break;
                    }
                }
                out.push(Row::Sqlite {
                    names: Arc::clone(&names),
                    values,
                });
            }
            Ok(out)
        })
    }
}

/// A row a query returned.
pub(super) enum Row {
    Sqlite {
        names: Arc<[String]>,
        values: Vec<rusqlite::types::Value>,
    },
    Postgres(PgRow),
}

/// A column, by position or by name.
pub(super) trait Column: sqlx::ColumnIndex<PgRow> + std::fmt::Debug + Copy {
    fn position(&self, names: &[String]) -> Option<usize>;
}

impl Column for usize {
    fn position(&self, names: &[String]) -> Option<usize> {
        (*self < names.len()).then_some(*self)
    }
}

impl Column for &str {
    fn position(&self, names: &[String]) -> Option<usize> {
        names.iter().position(|name| name == self)
    }
}

/// A type a column can be read as.
pub(super) trait Get:
    Sized + for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>
{
    fn from_sqlite(value: &rusqlite::types::Value) -> Option<Self>;
}

impl Get for i64 {
    fn from_sqlite(value: &rusqlite::types::Value) -> Option<Self> {
        match value {
            rusqlite::types::Value::Integer(value) => Some(*value),
            _ => None,
        }
    }
}

impl Get for String {
    fn from_sqlite(value: &rusqlite::types::Value) -> Option<Self> {
        match value {
            rusqlite::types::Value::Text(value) => Some(value.clone()),
            _ => None,
        }
    }
}

impl<T: Get> Get for Option<T>
where
    Option<T>: for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
{
    fn from_sqlite(value: &rusqlite::types::Value) -> Option<Self> {
        match value {
            rusqlite::types::Value::Null => Some(None),
            other => T::from_sqlite(other).map(Some),
        }
    }
}

impl Row {
    pub(super) fn try_get<T: Get, C: Column>(&self, column: C) -> Db<T> {
        match self {
            Self::Postgres(row) => Ok(row.try_get::<T, C>(column)?),
            Self::Sqlite { names, values } => {
                let value = column
                    .position(names)
                    .and_then(|i| values.get(i))
                    .ok_or_else(|| DbError::Decode(format!("no column {column:?}")))?;
                T::from_sqlite(value).ok_or_else(|| {
                    DbError::Decode(format!(
                        "column {column:?} holds {value:?}, not a {}",
                        std::any::type_name::<T>()
                    ))
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer pool on a fresh WAL file with one table, and a second connection to read what is committed.
    fn pool() -> (tempfile::TempDir, Pool, Arc<Sqlite>, rusqlite::Connection) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("groups.db");
        let connection = rusqlite::Connection::open(&path).unwrap();
        connection
            .execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE notes (n INTEGER PRIMARY KEY);")
            .unwrap();
        let pool = Pool::sqlite(connection);
        let Pool::Sqlite(sqlite) = &pool else {
            unreachable!()
        };
        let sqlite = Arc::clone(sqlite);
        (dir, pool, sqlite, rusqlite::Connection::open(path).unwrap())
    }

    fn committed(reader: &rusqlite::Connection) -> Vec<i64> {
        let mut statement = reader.prepare("SELECT n FROM notes ORDER BY n").unwrap();
        statement
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    async fn note(tx: &mut Tx, n: i64) {
        query("INSERT INTO notes (n) VALUES ($1)")
            .bind(n)
            .execute(&mut *tx)
            .await
            .unwrap();
    }

    /// Reads the statements the writer's connection keeps (while nothing holds the connection).
    fn kept<T>(sqlite: &Sqlite, read: impl FnOnce(&Kept<'_>) -> T) -> T {
        let writer = sqlite.writer.try_lock().unwrap();
        writer
            .connection
            .with_dependent(|_, statements| read(&statements.0.borrow()))
    }

    #[tokio::test]
    async fn a_kept_statement_binds_each_use_its_own_values_by_their_numbers_in_any_order() {
        let (_dir, pool, sqlite, _reader) = pool();
        query("CREATE TABLE pairs (a TEXT, b INTEGER, c TEXT)")
            .execute(&pool)
            .await
            .unwrap();
        // `$3` comes first in the text, `$1` twice: SQLite numbers them 1, 2, 3 by their first use.
        let insert = "INSERT INTO pairs (c, b, a) VALUES ($3, $2 + length($1), $1)";
        for (a, b, c) in [
            ("x", 1, Some("first")),
            ("yy", 2, None),
            ("zzz", 3, Some("third")),
        ] {
            let done = query(insert)
                .bind(a)
                .bind(b)
                .bind(c)
                .execute(&pool)
                .await
                .unwrap();
            assert_eq!(done.rows_affected(), 1);
        }
        let rows = query("SELECT a, b, c FROM pairs WHERE b > $1 ORDER BY b")
            .bind(0)
            .fetch_all(&pool)
            .await
            .unwrap();
        let read: Vec<(String, i64, Option<String>)> = rows
            .iter()
            .map(|row| {
                (
                    row.try_get(0).unwrap(),
                    row.try_get(1).unwrap(),
                    row.try_get(2).unwrap(),
                )
            })
            .collect();
        assert_eq!(
            read,
            vec![
                ("x".to_owned(), 2, Some("first".to_owned())),
                ("yy".to_owned(), 4, None),
                ("zzz".to_owned(), 6, Some("third".to_owned())),
            ],
            "no value of an earlier use stays bound (the second use bound $3 to null)"
        );
        assert_eq!(
            kept(&sqlite, |statements| statements.len()),
            3,
            "the insert, the read and the table's creation, each prepared once"
        );
    }

    #[tokio::test]
    async fn a_statement_whose_value_is_missing_is_refused_and_more_statements_than_are_kept_still_run()
     {
        let (_dir, pool, sqlite, reader) = pool();
        let refused = query("INSERT INTO notes (n) VALUES ($2)")
            .bind(1)
            .execute(&pool)
            .await
            .expect_err("$2 has no value");
        assert!(refused.to_string().contains("$2 of"), "{refused}");
        // More texts than a connection keeps: each runs, those beyond the bound for their use alone, and the ones
        // kept stay kept.
        for n in 0..(STATEMENTS as i64 + 10) {
            query(format!("INSERT INTO notes (n) VALUES ($1 + {n} * 0)"))
                .bind(n)
                .execute(&pool)
                .await
                .unwrap();
        }
        let holds = |sql: &str| {
            kept(&sqlite, |statements| {
                (statements.len(), statements.contains_key(sql))
            })
        };
        assert_eq!(
            holds("INSERT INTO notes (n) VALUES ($1 + 0 * 0)"),
            (STATEMENTS, true)
        );
        let beyond = format!("INSERT INTO notes (n) VALUES ($1 + {STATEMENTS} * 0)");
        assert_eq!(holds(&beyond), (STATEMENTS, false));
        query(beyond).bind(-1).execute(&pool).await.unwrap();
        let notes = committed(&reader);
        assert_eq!(notes.len(), STATEMENTS + 11);
        assert_eq!(notes.first(), Some(&-1));
    }

    #[tokio::test]
    async fn a_statement_lets_go_of_more_than_a_little_text_after_its_use() {
        let (_dir, pool, sqlite, _reader) = pool();
        query("CREATE TABLE texts (t TEXT)")
            .execute(&pool)
            .await
            .unwrap();
        let insert = "INSERT INTO texts (t) VALUES ($1), ($2)";
        let bound = |sql: &str| {
            kept(&sqlite, |statements| {
                statements[sql].statement.expanded_sql().unwrap()
            })
        };
        // Two texts of half the bound each: kept, as a little text is.
        let half = "h".repeat(KEPT_TEXT / 2);
        query(insert)
            .bind(half.as_str())
            .bind(half.as_str())
            .execute(&pool)
            .await
            .unwrap();
        assert_eq!(
            bound(insert),
            format!("INSERT INTO texts (t) VALUES ('{half}'), ('{half}')")
        );
        // Two texts each under the bound, over it together (as a run's events are): let go.
        let over = "o".repeat(KEPT_TEXT / 2 + 1);
        query(insert)
            .bind(over.as_str())
            .bind(over.as_str())
            .execute(&pool)
            .await
            .unwrap();
        assert_eq!(
            bound(insert),
            "INSERT INTO texts (t) VALUES (NULL), (NULL)",
            "the texts are not kept"
        );
    }

    /// Waits until `waiting` changes wait for the connection.
    async fn until_waiting(sqlite: &Sqlite, waiting: usize) {
        while sqlite.waiting.load(Ordering::Acquire) < waiting {
            tokio::task::yield_now().await;
        }
    }

    /// Turns true once `tx` committed.
    fn ran_on_commit(tx: &mut Tx) -> Arc<std::sync::atomic::AtomicBool> {
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let hook = Arc::clone(&ran);
        tx.after_commit(move || hook.store(true, Ordering::Release));
        ran
    }

    /// A change that writes `n`, its commit spawned, once it is released into its group alone (where it waits for
    /// the group's commit, or lingers); and whether its commit hook ran.
    async fn released(
        pool: &Pool,
        sqlite: &Sqlite,
        n: i64,
    ) -> (
        tokio::task::JoinHandle<Db<()>>,
        Arc<std::sync::atomic::AtomicBool>,
    ) {
        let mut tx = pool.begin().await.unwrap();
        note(&mut tx, n).await;
        let ran = ran_on_commit(&mut tx);
        let commit = tokio::spawn(tx.commit());
        until_released(sqlite, 1).await;
        (commit, ran)
    }

    /// Cancels a spawned commit.
    async fn cancel(commit: tokio::task::JoinHandle<Db<()>>) {
        commit.abort();
        assert!(commit.await.unwrap_err().is_cancelled());
    }

    /// Waits until `changes` changes are released into the open group and the connection is free.
    async fn until_released(sqlite: &Sqlite, changes: usize) {
        while !sqlite.writer.try_lock().is_ok_and(|writer| {
            writer
                .group
                .as_ref()
                .is_some_and(|group| group.changes == changes)
        }) {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn changes_that_wait_for_the_connection_commit_as_one_group_and_a_failed_one_alone_is_undone()
     {
        let (_dir, pool, sqlite, reader) = pool();
        let first = pool.begin().await.unwrap();
        let groups_before = sqlite.groups.load(Ordering::Relaxed);
        let changes: Vec<_> = (1..=6)
            .map(|n| {
                let pool = pool.clone();
                tokio::spawn(async move {
                    let mut tx = pool.begin().await.unwrap();
                    note(&mut tx, n).await;
                    hooks(&mut tx, n);
                    if n == 3 {
                        // Dropped: only this change is undone.
                        return Ok(());
                    }
                    tx.commit().await
                })
            })
            .collect();
        until_waiting(&sqlite, 6).await;
        first.commit().await.unwrap();
        for change in changes {
            change.await.unwrap().unwrap();
        }
        assert_eq!(committed(&reader), vec![1, 2, 4, 5, 6]);
        assert_eq!(
            sqlite.groups.load(Ordering::Relaxed) - groups_before,
            0,
            "every change joined the group the first one opened"
        );

        fn hooks(tx: &mut Tx, n: i64) {
            tx.after_commit(move || assert_ne!(n, 3, "the undone change's commit hook ran"));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_alone_is_committed_when_its_commit_returns_and_a_read_commits_the_open_group_first()
     {
        let (_dir, pool, sqlite, reader) = pool();
        let mut tx = pool.begin().await.unwrap();
        note(&mut tx, 1).await;
        tx.commit().await.unwrap();
        assert_eq!(committed(&reader), vec![1]);

        // A change that the group is left open for never comes: the one that is done commits the group itself
        // (time is paused: the runtime, idle, moves the clock on to the wait's end).
        sqlite.waiting.fetch_add(1, Ordering::AcqRel);
        let mut tx = pool.begin().await.unwrap();
        note(&mut tx, 2).await;
        let ran = ran_on_commit(&mut tx);
        tx.commit().await.unwrap();
        assert!(ran.load(Ordering::Acquire));
        assert_eq!(committed(&reader), vec![1, 2]);

        // A change released into the group left open for a waiter: a read outside any change commits it first,
        // and sees only what is committed.
        let mut tx = pool.begin().await.unwrap();
        note(&mut tx, 3).await;
        let commit = tokio::spawn(tx.commit());
        until_released(&sqlite, 1).await;
        assert_eq!(committed(&reader), vec![1, 2], "the group is still open");
        let rows = query("SELECT n FROM notes ORDER BY n")
            .fetch_all(&pool)
            .await
            .unwrap();
        let seen: Vec<i64> = rows.iter().map(|row| row.try_get(0).unwrap()).collect();
        assert_eq!(seen, vec![1, 2, 3]);
        assert_eq!(
            committed(&reader),
            seen,
            "the read saw only what is committed"
        );
        sqlite.waiting.fetch_sub(1, Ordering::AcqRel);
        commit.await.unwrap().unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_that_began_its_group_is_undone_with_the_transaction_and_the_next_change_begins_anew()
     {
        let (_dir, pool, sqlite, reader) = pool();
        let undone = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut first = pool.begin().await.unwrap();
        note(&mut first, 1).await;
        query("RELEASE change")
            .execute(&mut first)
            .await
            .expect_err("the change that began the transaction has no savepoint");
        let hook = Arc::clone(&undone);
        first.after_rollback(move || hook.store(true, Ordering::Release));
        // A change waits for the connection: letting it go would leave an open group as it is.
        sqlite.waiting.fetch_add(1, Ordering::AcqRel);
        drop(first);
        sqlite.waiting.fetch_sub(1, Ordering::AcqRel);
        assert!(undone.load(Ordering::Acquire), "its rollback hook ran");
        assert!(
            sqlite.writer.try_lock().is_ok_and(|writer| {
                writer.group.is_none() && writer.connection.sqlite().is_autocommit()
            }),
            "no transaction and no group is left open"
        );

        let mut second = pool.begin().await.unwrap();
        note(&mut second, 2).await;
        second.commit().await.unwrap();
        assert_eq!(committed(&reader), vec![2]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_statement_that_fails_halfway_without_its_own_undo_is_undone_with_its_change() {
        // `OR FAIL` keeps what a statement wrote before the row that broke a constraint (the store's statements
        // take it, see `Dialect::insert`): the change the statement fails is undone whole, that row included.
        let (_dir, pool, sqlite, reader) = pool();
        let mut tx = pool.begin().await.unwrap();
        note(&mut tx, 1).await;
        tx.commit().await.unwrap();
        let halfway = "INSERT OR FAIL INTO notes (n) VALUES (5), (1)";

        // A change that began its group.
        let mut alone = pool.begin().await.unwrap();
        query(halfway).execute(&mut alone).await.unwrap_err();
        let kept = query("SELECT n FROM notes WHERE n = 5")
            .fetch_optional(&mut alone)
            .await
            .unwrap();
        assert!(kept.is_some(), "the failed statement kept its first row");
        drop(alone);
        assert_eq!(committed(&reader), vec![1]);

        // A change that joined one (time is paused: the first one's wait for a joiner does not end).
        sqlite.waiting.fetch_add(1, Ordering::AcqRel);
        let mut first = pool.begin().await.unwrap();
        note(&mut first, 2).await;
        let first = tokio::spawn(first.commit());
        until_released(&sqlite, 1).await;
        sqlite.waiting.fetch_sub(1, Ordering::AcqRel);
        let mut joined = pool.begin().await.unwrap();
        query(halfway).execute(&mut joined).await.unwrap_err();
        drop(joined);
        first.await.unwrap().unwrap();
        assert_eq!(committed(&reader), vec![1, 2]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_whose_undo_fails_fails_its_group_and_every_rollback_hook_runs_newest_first() {
        let (_dir, pool, sqlite, reader) = pool();
        // A note of 0 rolls the whole transaction back, as SQLite does on some errors (a full disk, for one): the
        // change's savepoint goes with it, so undoing the change alone fails.
        query(
            "CREATE TRIGGER no_zero BEFORE INSERT ON notes WHEN NEW.n = 0 \
             BEGIN SELECT RAISE(ROLLBACK, 'no zero'); END",
        )
        .execute(&pool)
        .await
        .unwrap();
        let undone = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let on_rollback = |tx: &mut Tx, n: i64| {
            let undone = Arc::clone(&undone);
            tx.after_rollback(move || undone.lock().push(n));
        };

        // The group is left open for a change said to wait (time is paused: the first one's wait does not end).
        sqlite.waiting.fetch_add(1, Ordering::AcqRel);
        let mut first = pool.begin().await.unwrap();
        note(&mut first, 1).await;
        on_rollback(&mut first, 1);
        let first = tokio::spawn(first.commit());
        until_released(&sqlite, 1).await;
        sqlite.waiting.fetch_sub(1, Ordering::AcqRel);

        let mut second = pool.begin().await.unwrap();
        on_rollback(&mut second, 2);
        on_rollback(&mut second, 3);
        query("INSERT INTO notes (n) VALUES (0)")
            .execute(&mut second)
            .await
            .unwrap_err();
        drop(second);
        assert_eq!(
            *undone.lock(),
            vec![3, 2, 1],
            "the failed change's hooks, newest first, then its group's"
        );
        assert!(
            first.await.unwrap().is_err(),
            "the change released into the failed group reports it"
        );
        assert_eq!(committed(&reader), Vec::<i64>::new());

        // The connection serves the next change.
        let mut third = pool.begin().await.unwrap();
        note(&mut third, 4).await;
        third.commit().await.unwrap();
        assert_eq!(committed(&reader), vec![4]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_cancelled_while_it_waits_for_its_group_still_commits_and_runs_its_hooks() {
        let (_dir, pool, sqlite, reader) = pool();
        // The group is left open for a change said to wait (time is paused: the first one's wait does not end).
        sqlite.waiting.fetch_add(1, Ordering::AcqRel);
        let (first, ran) = released(&pool, &sqlite, 6).await;
        cancel(first).await;
        assert!(!ran.load(Ordering::Acquire), "nothing is committed yet");
        assert_eq!(committed(&reader), Vec::<i64>::new());

        // The next change joins the group and commits it: the cancelled one's row and hook with it.
        sqlite.waiting.fetch_sub(1, Ordering::AcqRel);
        let mut second = pool.begin().await.unwrap();
        note(&mut second, 7).await;
        second.commit().await.unwrap();
        assert!(
            ran.load(Ordering::Acquire),
            "the cancelled change's hook ran with its group"
        );
        assert_eq!(committed(&reader), vec![6, 7]);
    }

    #[tokio::test]
    async fn a_change_that_lingers_commits_in_one_group_with_the_change_of_a_task_that_runs_meanwhile()
     {
        let (_dir, pool, sqlite, reader) = pool();
        let groups_before = sqlite.groups.load(Ordering::Relaxed);
        // Ready to run once the first change lingers (the runtime has one thread: nothing runs before).
        let second = tokio::spawn({
            let pool = pool.clone();
            async move {
                let mut tx = pool.begin().await.unwrap();
                note(&mut tx, 2).await;
                tx.commit().await
            }
        });
        let mut first = pool.begin().await.unwrap();
        note(&mut first, 1).await;
        first.commit().await.unwrap();
        second.await.unwrap().unwrap();
        assert_eq!(committed(&reader), vec![1, 2]);
        assert_eq!(
            sqlite.groups.load(Ordering::Relaxed) - groups_before,
            1,
            "the second change joined the first one's group"
        );
        assert_eq!(sqlite.linger.misses.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_lingering_change_whose_commit_is_dropped_still_commits_its_group() {
        let (_dir, pool, sqlite, reader) = pool();
        // Released into its group, which it leaves open while it lingers.
        let (commit, ran) = released(&pool, &sqlite, 5).await;
        cancel(commit).await;
        assert!(ran.load(Ordering::Acquire), "its hook ran with the commit");
        assert_eq!(committed(&reader), vec![5]);
    }

    #[tokio::test]
    async fn a_lingering_change_dropped_while_the_connection_is_held_commits_once_it_is_let_go() {
        let (_dir, pool, sqlite, reader) = pool();
        let (commit, ran) = released(&pool, &sqlite, 8).await;
        // Held by what does not commit the group (as a look at whether a group is open does).
        let looking = Arc::clone(&sqlite.writer).lock_owned().await;
        cancel(commit).await;
        assert!(!ran.load(Ordering::Acquire));
        assert_eq!(committed(&reader), Vec::<i64>::new());
        drop(looking);
        tokio::time::timeout(Duration::from_secs(10), async {
            while committed(&reader).is_empty() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the group was committed once the connection was let go");
        assert_eq!(committed(&reader), vec![8]);
        assert!(ran.load(Ordering::Acquire), "its hook ran with the commit");
    }

    #[test]
    fn changes_stop_lingering_after_lingers_that_find_no_company_and_try_again_now_and_then() {
        let linger = Linger::default();
        for _ in 0..LINGER_MISSES {
            assert!(linger.now());
            linger.found(false);
        }
        // More misses change nothing.
        linger.found(false);
        assert_eq!(linger.misses.load(Ordering::Relaxed), LINGER_MISSES);
        let mut lingered = Vec::new();
        for _ in 0..2 * LINGER_PROBE_EVERY {
            let now = linger.now();
            if now {
                // A probe that finds no company: lingering stays off.
                linger.found(false);
            }
            lingered.push(now);
        }
        let probes: Vec<usize> = (0..lingered.len()).filter(|&i| lingered[i]).collect();
        let every = LINGER_PROBE_EVERY as usize;
        assert_eq!(probes, vec![every - 1, 2 * every - 1]);
        // A probe that finds company: changes linger again.
        linger.found(true);
        assert!((0..LINGER_MISSES).all(|_| linger.now()));
    }
}
