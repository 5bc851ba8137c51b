//! The durable stores: SQLite, the embedded default (a file beside toolgate, no server to start), and PostgreSQL,
//! on which several toolgate instances serve as one. One implementation: the SQL is written once with `$n`
//! parameters (both databases take them) over the small interface of [`db`], and [`Dialect`] holds the few places
//! where the two differ. The schema comes with the binary, one migration set per dialect (a migration whose SQL both
//! take is one file, in `migrations/both`), applied by sqlx.
//!
//! Every state change is one transaction (on SQLite, part of a transaction that commits a group of them: see
//! [`db`]). SQLite has one writer connection, so this process's state changes never
//! race each other there; PostgreSQL serialises them with row locks and conditional updates, which is also what
//! makes a decision or a claim exactly once across instances. Events a running run appends are queued and
//! committed in batches (group commit): they are durable before anyone can read them, and each run's log keeps the
//! order they were appended in. A background task writes what gathered for a millisecond; a state change that comes
//! first takes the queue into its own transaction on SQLite (one commit instead of two), and on PostgreSQL waits for
//! the queue to be written. On SQLite the results of tool calls join the same queue, so that a call's result and
//! the run's next change are one commit.
//!
//! On SQLite, the newest committed events of each run, and what a run's end recorded (its conversation, its
//! suspension and who took it), stay in memory for the readers that follow the run ([`tail`]), as does the set of
//! sessions that may hold grants; reads by key go through the writer's connection when it is free, whose page cache
//! stays warm (while a change holds it or its group is open, through the reader: see [`SqlStore::by_key`]); scans
//! go through a reader connection beside it.

mod db;
mod queries;
mod tail;
mod wal_writes;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use sqlx::Connection as _;
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::postgres::PgPoolOptions;

use db::{Pool, Tx, query};
use tokio::sync::{Notify, broadcast, watch};

use super::watches::Watches;
use super::{InstanceId, NewEvent, RemoteStop, StoreError, StoreKind};
use crate::ids::{RunId, SessionId, ToolCallId};
use crate::runtime::AbortReason;

/// The channel instances ring each other on (PostgreSQL `LISTEN/NOTIFY`): a doorbell only; readers re-read rows.
const CHANNEL: &str = "toolgate";

/// How long an instance may go without a heartbeat before the others take its work over, by default.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);

/// Where the two databases differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

/// The text of a statement that differs by dialect, made once for each dialect and kept for the life of the process:
/// a statement runs many times a round trip, and making its text anew each time (`format!`: an allocation, the
/// formatting, a free) was work for nothing. One per place a statement is written ([`sql!`]).
pub(super) struct DialectText {
    sqlite: OnceLock<String>,
    postgres: OnceLock<String>,
}

impl DialectText {
    pub(super) const fn new() -> Self {
        Self {
            sqlite: OnceLock::new(),
            postgres: OnceLock::new(),
        }
    }

    /// The text for `dialect`, made by `make` the first time. A function, not a closure: it cannot capture a
    /// variable of its caller, whose value could differ from one use to the next.
    pub(super) fn get(
        &'static self,
        dialect: Dialect,
        make: fn(Dialect) -> String,
    ) -> &'static str {
        let made = match dialect {
            Dialect::Sqlite => &self.sqlite,
            Dialect::Postgres => &self.postgres,
        };
        made.get_or_init(|| make(dialect))
    }
}

/// A statement's text, as `format!` would make it with `$dialect` bound to `$d`, but made once per dialect and kept
/// ([`DialectText`]): `sql!(self.dialect, |d| "SELECT 1 FROM runs WHERE id = $1{}", d.for_update())`. Each place the
/// macro is written keeps its own text, so the text must depend on the dialect and on constants only: the arguments
/// cannot name a variable of the caller (the text is made by a function, [`DialectText::get`]).
macro_rules! sql {
    ($dialect:expr, |$d:pat_param| $($format:tt)+) => {{
        static TEXT: $crate::store::sql::DialectText = $crate::store::sql::DialectText::new();
        TEXT.get($dialect, |$d| format!($($format)+))
    }};
}
pub(super) use sql;

/// On SQLite, the condition that an event's row number lies in the range of the run whose id is `$1` ([`event_row`]):
/// `$from` (`>` or `>=`) the run's number times 2^32 with `$plus` added, and below the next run's number times 2^32.
/// A macro, so that the queries made of it stay constants.
macro_rules! run_rows {
    ($from:literal, $plus:literal) => {
        concat!(
            "run_seq ",
            $from,
            " (SELECT number * 4294967296",
            $plus,
            " FROM runs WHERE id = $1) AND run_seq < (SELECT (number + 1) * 4294967296 FROM runs WHERE id = $1)"
        )
    };
}

impl Dialect {
    /// The database's clock, in milliseconds since the Unix epoch, as SQL that takes this process's clock as `$2`:
    /// leases are measured on the database's clock, so that instances whose clocks disagree still agree on who is
    /// alive. (SQLite has one process: its clock is the one.)
    fn now(self) -> &'static str {
        match self {
            Self::Sqlite => "CAST($2 AS BIGINT)",
            Self::Postgres => {
                "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) + 0 * CAST($2 AS BIGINT)"
            }
        }
    }

    /// Locks the rows a transaction reads before it changes them (SQLite's one writer needs none).
    fn for_update(self) -> &'static str {
        match self {
            Self::Sqlite => "",
            Self::Postgres => " FOR UPDATE",
        }
    }

    /// Locks the rows a transaction reads so that no other changes or deletes them before it ends (SQLite's one
    /// writer needs none).
    fn for_share(self) -> &'static str {
        match self {
            Self::Sqlite => "",
            Self::Postgres => " FOR SHARE",
        }
    }

    /// How a change's statement that writes several rows, or returns what it wrote, begins: `INSERT`, on SQLite
    /// `INSERT OR FAIL`. Such a statement (several rows, or `RETURNING`) otherwise keeps a journal of every page it
    /// changes, so that SQLite can undo the statement alone if a constraint stops it halfway: a copy of each page
    /// into memory, 6% of a round trip's instructions at concurrency 1. A statement that fails fails its change,
    /// which is undone whole (its savepoint, or the transaction it began), so that journal buys nothing but in one
    /// case: on a full disk (or out of memory) SQLite, with no journal to undo the statement by, rolls the whole
    /// transaction back, and the change's group fails with it, as when a group's commit fails (each of its changes
    /// is told, and their rollback hooks run). Every change would fail on a full disk anyway.
    fn insert(self) -> &'static str {
        match self {
            Self::Sqlite => "INSERT OR FAIL",
            Self::Postgres => "INSERT",
        }
    }

    /// `UPDATE`, as [`Dialect::insert`] says.
    fn update(self) -> &'static str {
        match self {
            Self::Sqlite => "UPDATE OR FAIL",
            Self::Postgres => "UPDATE",
        }
    }

    /// A run's events after the sequence number `$2`, at most `$3`, oldest first: each one's sequence number, kind
    /// and JSON. `$1` is the run's id. On SQLite, one range of row numbers: the run's number (found by its id)
    /// times 2^32, plus `$2` (which [`Dialect::seq_after`] keeps below 2^32); its reader stops stepping once the
    /// page holds `$4` bytes ([`super::PAGE_BYTES`]). On PostgreSQL, which sends a query's whole result whatever is
    /// read of it, the query itself stops there: the events while their kinds and JSON come to at most `$4` bytes,
    /// or the first alone (counted without reading the values out of their TOAST).
    fn events_after(self) -> &'static str {
        match self {
            Self::Sqlite => concat!(
                "SELECT run_seq & 4294967295, kind, json FROM events WHERE ",
                run_rows!(">", " + $2"),
                " ORDER BY run_seq LIMIT $3"
            ),
            Self::Postgres => {
                "SELECT seq, kind, json FROM (\
                     SELECT seq, kind, json, octet_length(kind) + octet_length(json) AS bytes, \
                         sum(octet_length(kind) + octet_length(json)) \
                             OVER (ORDER BY seq ROWS UNBOUNDED PRECEDING) AS through \
                     FROM events WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3\
                 ) page WHERE through <= $4 OR through = bytes ORDER BY seq"
            }
        }
    }

    /// Deletes the events of the run whose id is `$1`.
    fn delete_events(self) -> &'static str {
        match self {
            Self::Sqlite => concat!("DELETE FROM events WHERE ", run_rows!(">=", "")),
            Self::Postgres => "DELETE FROM events WHERE run_id = $1",
        }
    }

    /// The sequence number after which [`Dialect::events_after`] reads, as its parameter: none of a run's events
    /// comes after the highest sequence number the table can hold.
    fn seq_after(self, after: u64) -> i64 {
        match self {
            Self::Sqlite => after.min(MAX_SEQ as u64) as i64,
            Self::Postgres => after.min(i64::MAX as u64) as i64,
        }
    }
}

/// The highest sequence number an event can have on SQLite: its row number holds it in its low 32 bits.
const MAX_SEQ: i64 = u32::MAX as i64;

/// The row number of a run's event in SQLite's events table (its migration 7 says why): the run's number times
/// 2^32, plus the event's sequence number. A run's events are one range of the table, in order, and the newest
/// run's at its end. `None` past what a row number holds: a run numbered 2^31 or more, or a sequence number past
/// [`MAX_SEQ`] (a run holds at most 50,000 events by default: the harness ends it past that).
fn event_row(run_number: i64, seq: i64) -> Option<i64> {
    if run_number < 0 || !(0..=MAX_SEQ).contains(&seq) {
        return None;
    }
    run_number.checked_mul(MAX_SEQ + 1)?.checked_add(seq)
}

/// What the configuration names as the database. Its `Debug` hides a password.
#[derive(Clone, PartialEq, Eq)]
pub enum DatabaseUrl {
    /// A SQLite file, created when missing.
    Sqlite(PathBuf),
    /// A PostgreSQL server: `postgres://user:password@host:port/database`.
    Postgres(String),
}

impl DatabaseUrl {
    /// Reads `sqlite://PATH`, `sqlite:PATH`, `postgres://...` or `postgresql://...`.
    pub fn parse(url: &str) -> Result<Self, String> {
        let url = url.trim();
        if let Some(rest) = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
        {
            // toolgate sets the file's options itself (its journal, its locking, one writer): options in the URL
            // (`?mode=ro`) would be dropped unseen, so they are refused.
            let (path, options) = rest.split_once('?').unwrap_or((rest, ""));
            if !options.is_empty() {
                return Err(format!(
                    "{url:?} gives options ({options}) that toolgate does not read: name the SQLite file alone"
                ));
            }
            if path.is_empty() {
                return Err(format!("{url:?} names no SQLite file"));
            }
            return Ok(Self::Sqlite(PathBuf::from(path)));
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(Self::Postgres(url.to_owned()));
        }
        Err(format!(
            "{url:?} is not a database URL: use sqlite://PATH, postgres://..., or memory"
        ))
    }
}

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Sqlite(path) => f.debug_tuple("Sqlite").field(path).finish(),
            Self::Postgres(url) => f.debug_tuple("Postgres").field(&redact(url)).finish(),
        }
    }
}

impl std::fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Sqlite(path) => write!(f, "sqlite://{}", path.display()),
            Self::Postgres(url) => f.write_str(&redact(url)),
        }
    }
}

fn unavailable(error: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(error.to_string())
}

/// Why the store could not open.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(
        "another toolgate process is using the database {path} (its lock file {lock} is held{holder}); stop it first, or give this one its own file with --database-url"
    )]
    Locked {
        path: String,
        lock: String,
        holder: String,
    },
    #[error("cannot open the database {what}: {message}")]
    Connect { what: String, message: String },
    #[error("cannot prepare the database {what}: {message}")]
    Migrate { what: String, message: String },
    #[error("cannot create {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    /// A database to read (`toolgate audit`, `toolgate rules check`) that is not there: nothing was recorded yet.
    #[error(
        "no database at {path}: toolgate creates it at its first start, and nothing was recorded there yet"
    )]
    Missing { path: String },
}

/// Holds the lock that keeps a second toolgate off a SQLite file: a POSIX record lock on `<file>.lock`, with the
/// holder's process id inside for the message the second one prints.
///
/// A record lock belongs to the process: a child never inherits it, not even between its fork and its exec (an
/// `flock` is shared with such a child, which then holds the file for a moment after this process let go). Within
/// one process record locks never conflict, so a registry of the files this process holds refuses a second store
/// on the same file; it is checked before the file is opened, because closing any descriptor of a file drops the
/// process's record locks on it.
struct FileLock {
    /// `None` only while dropped.
    file: Option<std::fs::File>,
    /// The lock file, as the registry knows it.
    key: PathBuf,
}

/// The lock files this process holds.
static HELD: std::sync::LazyLock<Mutex<std::collections::HashSet<PathBuf>>> =
    std::sync::LazyLock::new(Mutex::default);

impl FileLock {
    fn acquire(database: &Path) -> Result<Self, OpenError> {
        use std::io::{Seek, Write};
        use std::os::fd::AsRawFd;

        // A database file there already is locked where it is, whatever symlink names it: SQLite follows it to
        // the same file, and two processes that locked `a/toolgate.db.lock` and `b/toolgate.db.lock` would both
        // write it, each recovering the other's running runs as a dead process's.
        let resolved = database.canonicalize().ok();
        let database = resolved.as_deref().unwrap_or(database);
        let lock = PathBuf::from(format!("{}.lock", database.display()));
        let io = |source| OpenError::Io {
            path: lock.display().to_string(),
            source,
        };
        let locked = |holder: Option<u32>| OpenError::Locked {
            path: database.display().to_string(),
            lock: lock.display().to_string(),
            holder: holder.map_or_else(String::new, |pid| format!(" by process {pid}")),
        };
        // The same file under any spelling: the directory resolved, the name as given.
        let key = match (lock.parent(), lock.file_name()) {
            (Some(dir), Some(name)) => {
                let dir = if dir.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    dir
                };
                dir.canonicalize().map_err(io)?.join(name)
            }
            _ => lock.clone(),
        };
        if !HELD.lock().insert(key.clone()) {
            return Err(locked(Some(std::process::id())));
        }
        let release = |error| {
            HELD.lock().remove(&key);
            error
        };
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock)
            .map_err(|e| release(io(e)))?;
        let mut request = record_lock(libc::F_WRLCK);
        // SAFETY: `file` is an open descriptor and `request` a valid `flock` for the duration of the call.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &raw const request) } != 0 {
            let error = std::io::Error::last_os_error();
            if !matches!(
                error.raw_os_error(),
                Some(libc::EAGAIN) | Some(libc::EACCES)
            ) {
                return Err(release(io(error)));
            }
            // SAFETY: as above; F_GETLK writes the holder into `request`.
            let asked = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETLK, &raw mut request) };
            let holder = (asked == 0 && request.l_type != libc::F_UNLCK as libc::c_short)
                .then(|| u32::try_from(request.l_pid).ok())
                .flatten();
            drop(file);
            return Err(release(locked(holder)));
        }
        let write_pid = |file: &mut std::fs::File| -> std::io::Result<()> {
            file.set_len(0)?;
            file.rewind()?;
            write!(file, "{}", std::process::id())
        };
        write_pid(&mut file).map_err(|e| release(io(e)))?;
        Ok(Self {
            file: Some(file),
            key,
        })
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        // Closed (which releases the record lock) before another store of this process may open the file: closing
        // it after would release that store's lock too.
        drop(self.file.take());
        HELD.lock().remove(&self.key);
    }
}

/// A request for a record lock of `kind` on the whole file.
fn record_lock(kind: libc::c_int) -> libc::flock {
    // SAFETY: `flock` is a plain C struct for which all zeroes is a valid value.
    let mut request: libc::flock = unsafe { std::mem::zeroed() };
    request.l_type = kind as libc::c_short;
    request.l_whence = libc::SEEK_SET as libc::c_short;
    request
}

/// The schema's migrations, in order. A database is brought up to the newest at every start.
fn migrations(dialect: Dialect) -> Vec<Migration> {
    let sqls: &[(i64, &str, &'static str)] = match dialect {
        Dialect::Sqlite => &[
            (1, "init", include_str!("migrations/sqlite/0001_init.sql")),
            (
                2,
                "compact rows",
                include_str!("migrations/sqlite/0002_compact_rows.sql"),
            ),
            (
                3,
                "live indexes",
                include_str!("migrations/both/live_indexes.sql"),
            ),
            (
                4,
                "events by run number",
                include_str!("migrations/sqlite/0004_events_by_run_number.sql"),
            ),
            (
                5,
                "calls inline",
                include_str!("migrations/sqlite/0005_calls_inline.sql"),
            ),
            (
                6,
                "unfinished runs by end",
                include_str!("migrations/sqlite/0006_unfinished_runs_by_end.sql"),
            ),
            (
                7,
                "events by row number",
                include_str!("migrations/sqlite/0007_events_by_row_number.sql"),
            ),
            (
                8,
                "instance leases",
                include_str!("migrations/both/instance_leases.sql"),
            ),
            (
                9,
                "logged out",
                include_str!("migrations/both/logged_out.sql"),
            ),
        ],
        Dialect::Postgres => &[
            (1, "init", include_str!("migrations/postgres/0001_init.sql")),
            (
                2,
                "live indexes",
                include_str!("migrations/both/live_indexes.sql"),
            ),
            (
                3,
                "instance leases",
                include_str!("migrations/both/instance_leases.sql"),
            ),
            (
                4,
                "logged out",
                include_str!("migrations/both/logged_out.sql"),
            ),
        ],
    };
    sqls.iter()
        .map(|(version, name, sql)| {
            Migration::new(
                *version,
                (*name).into(),
                MigrationType::Simple,
                sqlx::SqlSafeStr::into_sql_str(*sql),
                false,
            )
        })
        .collect()
}

/// The migrator. On PostgreSQL, several instances share the database, and during a rolling deploy an instance of the
/// older version may start (again) after a newer one migrated it: it starts, and leaves the newer migrations as they
/// are, which is why PostgreSQL's migrations only add what an older version does without (a column it leaves empty,
/// an index). A SQLite file is one process's: an older version refuses a file a newer one migrated.
fn migrator(dialect: Dialect) -> Migrator {
    let mut migrator = Migrator::with_migrations(migrations(dialect));
    migrator.set_ignore_missing(dialect == Dialect::Postgres);
    migrator
}

/// What waits for the next group commit, in the order it was queued.
enum Queued {
    /// Events a running run appended under its claim.
    Events(RunId, super::Epoch, Vec<NewEvent>),
    /// A call's result (SQLite only): see [`SqlStore::settle_call`](super::Store::settle_call).
    Settled(super::CallResult),
}

impl Queued {
    fn run_id(&self) -> &RunId {
        match self {
            Self::Events(run_id, ..) => run_id,
            Self::Settled(result) => &result.run_id,
        }
    }
}

/// Events appended by running runs and results of calls, waiting for the next group commit.
#[derive(Default)]
struct Appends {
    queue: Vec<Queued>,
    /// How many appends were ever queued.
    queued: u64,
    /// The runs whose queued appends the database refused the last time they were written. They are set aside:
    /// the appender tries each such run's alone, in a transaction of its own, and only a change of that run takes
    /// them with its own, so that what the database keeps refusing (a damaged page, a trigger) fails its own run,
    /// not every change and group commit of the others. Empty but after such a refusal.
    refused: std::collections::HashMap<RunId, Refused>,
    /// On PostgreSQL, how many appends of each run a transaction took and has not ended: a change of the run waits
    /// for them too, since the run's row may not be locked by their transaction yet. (SQLite's are in the writer's
    /// open group.)
    in_flight: std::collections::HashMap<RunId, usize>,
}

/// A run whose queued appends the database refused: when the appender tries them again.
struct Refused {
    /// How many times in a row they were refused.
    times: u32,
    retry_at: tokio::time::Instant,
}

/// Which queued appends a transaction takes ([`SqlStore::take_appends_in`]).
#[derive(Clone, Copy)]
enum Take<'a> {
    /// The appender's group commit: all but the refused runs'.
    Group,
    /// A state change of `run` (with `finishing`, its end under that claim): all but the refused runs', and
    /// `run`'s own even if refused, since the change must come after them in its run's log.
    Change {
        run: &'a RunId,
        finishing: Option<super::Epoch>,
    },
    /// The appender again: only this refused run's.
    Refused(&'a RunId),
}

impl Take<'_> {
    fn takes(self, run_id: &RunId, refused: &std::collections::HashMap<RunId, Refused>) -> bool {
        match self {
            Self::Group => !refused.contains_key(run_id),
            Self::Change { run, .. } => run == run_id || !refused.contains_key(run_id),
            Self::Refused(run) => run == run_id,
        }
    }
}

/// How many times the appender tries again what the database refused before it gives the events up.
const APPEND_TRIES: u32 = 5;

/// How long the appender waits before it tries again what was refused `times` times in a row: 100 ms, doubling
/// up to 1.6 s.
fn retry_after(times: u32) -> Duration {
    Duration::from_millis(50 << times.clamp(1, APPEND_TRIES))
}

/// What the appender has to do.
enum Due {
    Nothing,
    Now,
    /// Only refused runs' appends are queued, the first to be tried again then.
    At(tokio::time::Instant),
}

impl Appends {
    /// Takes the appends `take` takes out of the queue, in their order, leaving the rest in theirs. With them,
    /// whether every append queued so far was taken.
    fn take(&mut self, take: Take<'_>) -> (Vec<Queued>, bool) {
        if self.refused.is_empty() {
            return (std::mem::take(&mut self.queue), true);
        }
        let (taken, left): (Vec<_>, Vec<_>) = std::mem::take(&mut self.queue)
            .into_iter()
            .partition(|queued| take.takes(queued.run_id(), &self.refused));
        self.queue = left;
        (taken, self.queue.is_empty())
    }

    fn due(&self, now: tokio::time::Instant) -> Due {
        let mut first: Option<tokio::time::Instant> = None;
        for queued in &self.queue {
            match self.refused.get(queued.run_id()) {
                Some(refused) if refused.retry_at > now => {
                    first = Some(first.map_or(refused.retry_at, |at| at.min(refused.retry_at)));
                }
                _ => return Due::Now,
            }
        }
        first.map_or(Due::Nothing, Due::At)
    }

    /// The refused runs due to be tried again, with appends still queued.
    fn refused_due(&mut self, now: tokio::time::Instant) -> Vec<RunId> {
        let queue = &self.queue;
        self.refused
            .retain(|run_id, _| queue.iter().any(|queued| queued.run_id() == run_id));
        self.refused
            .iter()
            .filter(|(_, refused)| refused.retry_at <= now)
            .map(|(run_id, _)| run_id.clone())
            .collect()
    }

    /// The database refused `run_id`'s appends (once more).
    fn mark_refused(&mut self, run_id: &RunId) -> u32 {
        let refused = self.refused.entry(run_id.clone()).or_insert(Refused {
            times: 0,
            retry_at: tokio::time::Instant::now(),
        });
        refused.times += 1;
        refused.retry_at = tokio::time::Instant::now() + retry_after(refused.times);
        refused.times
    }

    /// What is left of `run_id`'s appends once their events were given up (results of calls) is tried again after
    /// the longest wait, and as many times again before the next give-up. With nothing left, the run is refused no
    /// longer: its next appends join the group commits.
    fn tried_again_later(&mut self, run_id: &RunId) {
        if !self.queue.iter().any(|queued| queued.run_id() == run_id) {
            self.refused.remove(run_id);
        } else if let Some(refused) = self.refused.get_mut(run_id) {
            refused.times = 0;
            refused.retry_at = tokio::time::Instant::now() + retry_after(APPEND_TRIES);
        }
    }

    /// Whether an append of `run_id` is queued, or taken by a transaction not yet ended (PostgreSQL).
    fn holds(&self, run_id: &RunId) -> bool {
        self.in_flight.contains_key(run_id)
            || self.queue.iter().any(|queued| queued.run_id() == run_id)
    }

    /// Whether an event of `run_id` is queued, or taken by a transaction not yet ended (PostgreSQL, where only
    /// events are queued).
    fn holds_events(&self, run_id: &RunId) -> bool {
        self.in_flight.contains_key(run_id)
            || self
                .queue
                .iter()
                .any(|queued| matches!(queued, Queued::Events(run, ..) if run == run_id))
    }

    /// The appends of `runs` (one entry each) that a transaction took are written, or back in the queue.
    fn landed(&mut self, runs: &[RunId]) {
        for run_id in runs {
            if let std::collections::hash_map::Entry::Occupied(mut flying) =
                self.in_flight.entry(run_id.clone())
            {
                *flying.get_mut() -= 1;
                if *flying.get() == 0 {
                    flying.remove();
                }
            }
        }
    }

    /// Gives up the queued events that `gives_up` picks; results of calls stay. How many went.
    fn give_up_events(&mut self, gives_up: impl Fn(&RunId) -> bool) -> usize {
        let before = self.queue.len();
        self.queue
            .retain(|queued| matches!(queued, Queued::Settled(_)) || !gives_up(queued.run_id()));
        before - self.queue.len()
    }
}

/// A SQLite or PostgreSQL store.
pub struct SqlStore {
    dialect: Dialect,
    instance: InstanceId,
    /// State changes: one connection for SQLite, a few for PostgreSQL.
    writer: Pool,
    /// Scans: WAL lets SQLite's reader go on beside the writer. (Reads by key: see [`SqlStore::by_key`].)
    reader: Pool,
    appends: Arc<Mutex<Appends>>,
    /// The calls this process began and has not settled yet (SQLite, whose file no other process writes: a call's
    /// result is then queued, see [`Store::settle_call`](super::Store::settle_call)).
    executing: Mutex<std::collections::HashSet<(RunId, crate::ids::ToolCallId)>>,
    /// Tells the appender to write now rather than after [`GROUP_COMMIT_WINDOW`]: someone waits.
    flush_now: Arc<Notify>,
    /// Wakes the appender (which holds only this and a weak reference to the store, so that the store, and its
    /// file lock, go as soon as its last user lets go).
    appended: Arc<Notify>,
    /// How many queued appends are written.
    written: watch::Sender<u64>,
    /// How many times the appender gave up what the database kept refusing: a flush waiting then is told so.
    gave_up: std::sync::atomic::AtomicU64,
    runs: Watches<RunId>,
    sessions: Watches<SessionId>,
    /// The newest committed events of each run, for its readers (SQLite only: see [`tail`]).
    tails: Option<Arc<tail::Tails>>,
    /// The sessions that may hold grants (SQLite only, whose file no other process writes): those that held one
    /// when the store opened, and every session a grant was added to since, from before its grant is written. A
    /// session not in it holds none, and its grants are not read: most sessions never get one, and every run's
    /// start asks. (Never fewer than hold one: a session stays after its grants are revoked.)
    granted: Option<Mutex<std::collections::HashSet<SessionId>>>,
    /// What another instance's doorbell tells this one's tasks and tools to stop.
    stops: broadcast::Sender<RemoteStop>,
    /// How long this instance's heartbeat holds its work (PostgreSQL).
    lease: Duration,
    _lock: Option<FileLock>,
    /// The calls this version could not read, logged once each by what met them (run and call id, and what was
    /// done): sweeps, listings and recovery meet them again and again.
    unreadable: crate::logged_once::LoggedOnce<(&'static str, String, String)>,
    /// The store itself, for what runs once a transaction commits (`SqlStore::commit_change`).
    me: std::sync::Weak<SqlStore>,
}

impl std::fmt::Debug for SqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlStore")
            .field("dialect", &self.dialect)
            .field("instance", &self.instance)
            .finish()
    }
}

impl SqlStore {
    /// Opens (and creates, and migrates) the database the URL names, with the default lease. A SQLite file is
    /// locked against a second toolgate process; WAL lets readers go on beside the one writer.
    pub async fn open(url: &DatabaseUrl) -> Result<Arc<Self>, OpenError> {
        Self::open_with_lease(url, DEFAULT_LEASE).await
    }

    /// Opens the database; with PostgreSQL, this instance's work is held by a heartbeat every fifth of `lease`, and
    /// taken over by the others once the heartbeat is `lease` old on the database's clock.
    pub async fn open_with_lease(
        url: &DatabaseUrl,
        lease: Duration,
    ) -> Result<Arc<Self>, OpenError> {
        let (dialect, lock, what) = match url {
            DatabaseUrl::Sqlite(path) => {
                if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::create_dir_all(parent).map_err(|source| OpenError::Io {
                        path: parent.display().to_string(),
                        source,
                    })?;
                }
                let lock = FileLock::acquire(path)?;
                (Dialect::Sqlite, Some(lock), path.display().to_string())
            }
            DatabaseUrl::Postgres(url) => (Dialect::Postgres, None, redact(url)),
        };
        let connect_error = |error: &dyn std::fmt::Display| OpenError::Connect {
            what: what.clone(),
            message: error.to_string(),
        };
        let migrate_error = |error: &dyn std::fmt::Display| OpenError::Migrate {
            what: what.clone(),
            message: error.to_string(),
        };
        let (writer, reader) = match url {
            DatabaseUrl::Sqlite(path) => {
                let options = sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(path)
                    .create_if_missing(true);
                let mut connection = sqlx::SqliteConnection::connect_with(&options)
                    .await
                    .map_err(|e| connect_error(&e))?;
                migrator(dialect)
                    .run(&mut connection)
                    .await
                    .map_err(|e| migrate_error(&e))?;
                connection.close().await.map_err(|e| connect_error(&e))?;
                let open = || sqlite_connection(path, false).map_err(|e| connect_error(&e));
                (Pool::sqlite(open()?), Pool::sqlite(open()?))
            }
            DatabaseUrl::Postgres(url) => {
                let writer = postgres_pool(4)
                    .connect(url)
                    .await
                    .map_err(|e| connect_error(&e))?;
                migrator(dialect)
                    .run(&writer)
                    .await
                    .map_err(|e| migrate_error(&e))?;
                let reader = postgres_pool(4)
                    .connect(url)
                    .await
                    .map_err(|e| connect_error(&e))?;
                (Pool::Postgres(writer), Pool::Postgres(reader))
            }
        };
        let store = Arc::new_cyclic(|me| Self {
            dialect,
            instance: InstanceId::generate(),
            writer,
            reader,
            appends: Arc::default(),
            executing: Mutex::default(),
            flush_now: Arc::default(),
            appended: Arc::new(Notify::new()),
            written: watch::channel(0).0,
            gave_up: Default::default(),
            runs: Watches::default(),
            sessions: Watches::default(),
            tails: (dialect == Dialect::Sqlite)
                .then(|| Arc::new(tail::Tails::new(tail::DEFAULT_BYTES))),
            granted: (dialect == Dialect::Sqlite).then(Mutex::default),
            stops: broadcast::channel(256).0,
            lease,
            _lock: lock,
            unreadable: Default::default(),
            me: me.clone(),
        });
        store
            .register_instance()
            .await
            .map_err(|error| OpenError::Migrate {
                what: what.clone(),
                message: error.to_string(),
            })?;
        if let Some(granted) = &store.granted {
            let sessions = store
                .sessions_with_grants()
                .await
                .map_err(|error| connect_error(&error))?;
            granted.lock().extend(sessions);
        }
        let appender = Arc::downgrade(&store);
        let wake = Arc::clone(&store.appended);
        let flush_now = Arc::clone(&store.flush_now);
        tokio::spawn(async move { append_forever(appender, wake, flush_now).await });
        if let DatabaseUrl::Sqlite(path) = url {
            let connection = sqlite_connection(path, false).map_err(|e| connect_error(&e))?;
            let weak = Arc::downgrade(&store);
            std::thread::Builder::new()
                .name("toolgate-checkpoint".to_owned())
                .spawn(move || checkpoint_forever(connection, weak))
                .map_err(|e| connect_error(&e))?;
        }
        if let DatabaseUrl::Postgres(url) = url {
            let mut listener = sqlx::postgres::PgListener::connect(url)
                .await
                .map_err(|e| connect_error(&e))?;
            listener
                .listen(CHANNEL)
                .await
                .map_err(|e| connect_error(&e))?;
            let weak = Arc::downgrade(&store);
            tokio::spawn(async move { listen_forever(listener, weak).await });
            let weak = Arc::downgrade(&store);
            tokio::spawn(async move { heartbeat_forever(weak, lease).await });
        }
        Ok(store)
    }

    /// Opens an existing database to read it beside a running server (`toolgate audit`): no lock, no changes.
    pub async fn read_only(url: &DatabaseUrl) -> Result<Arc<Self>, OpenError> {
        let (dialect, reader) =
            match url {
                DatabaseUrl::Sqlite(path) => {
                    if !path.exists() {
                        return Err(OpenError::Missing {
                            path: path.display().to_string(),
                        });
                    }
                    let connection =
                        sqlite_connection(path, true).map_err(|error| OpenError::Connect {
                            what: path.display().to_string(),
                            message: error.to_string(),
                        })?;
                    (Dialect::Sqlite, Pool::sqlite(connection))
                }
                DatabaseUrl::Postgres(url) => {
                    let pool = postgres_pool(1).connect(url).await.map_err(|error| {
                        OpenError::Connect {
                            what: redact(url),
                            message: error.to_string(),
                        }
                    })?;
                    (Dialect::Postgres, Pool::Postgres(pool))
                }
            };
        Ok(Arc::new_cyclic(|me| Self {
            dialect,
            instance: InstanceId::generate(),
            writer: reader.clone(),
            reader,
            appends: Arc::default(),
            executing: Mutex::default(),
            flush_now: Arc::default(),
            appended: Arc::new(Notify::new()),
            written: watch::channel(0).0,
            gave_up: Default::default(),
            runs: Watches::default(),
            sessions: Watches::default(),
            tails: None,
            granted: None,
            stops: broadcast::channel(1).0,
            lease: DEFAULT_LEASE,
            _lock: None,
            unreadable: Default::default(),
            me: me.clone(),
        }))
    }

    /// Where a read by key goes. On SQLite, the writer connection when it is free: every commit leaves its page
    /// cache warm, while the reader's starts cold after each commit of the writer; a read by key takes
    /// microseconds, so it holds the writer no longer than a small state change does. While a change holds the
    /// writer, or a group of changes is open (for one that waits, or one that lingers), the reader: on the writer the
    /// read would wait for them and then commit their group early (a read there commits the open group first, to
    /// read only what is committed), and the reader reads the same thing, what is committed, without waiting for the
    /// writer (though behind a scan that holds the reader). Reads of calls are the exception
    /// ([`SqlStore::calls_by_key`]). Scans, which may take long, always go to the reader, beside the writer. On
    /// PostgreSQL, the reader pool.
    fn by_key(&self) -> &Pool {
        match self.dialect {
            Dialect::Sqlite if self.writer.is_busy() => &self.reader,
            Dialect::Sqlite => &self.writer,
            Dialect::Postgres => &self.reader,
        }
    }

    /// Where a read of a run's calls goes. On SQLite, the writer connection even while it is busy: a call's result
    /// that a state change has taken from the queue into the open group is written only when that group commits,
    /// and a read on the writer commits the open group first (see [`Store::settle_call`](super::Store::settle_call)).
    /// On PostgreSQL, whose results are written as they come, the reader pool.
    fn calls_by_key(&self) -> &Pool {
        match self.dialect {
            Dialect::Sqlite => &self.writer,
            Dialect::Postgres => &self.reader,
        }
    }

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    fn store_kind(&self) -> StoreKind {
        match self.dialect {
            Dialect::Sqlite => StoreKind::Sqlite,
            Dialect::Postgres => StoreKind::Postgres,
        }
    }

    async fn register_instance(&self) -> Result<(), StoreError> {
        query(sql!(
            self.dialect,
            |d| "INSERT INTO instances (id, started_at, heartbeat_at, lease_ms) VALUES ($1, {now}, {now}, $3)",
            now = d.now()
        ))
        .bind(self.instance.as_str())
        .bind(crate::clock::now_ms() as i64)
        .bind(self.lease.as_millis() as i64)
        .execute(&self.writer)
        .await
        .map_err(unavailable)?;
        Ok(())
    }

    /// Says this instance is alive; puts its row back if others had declared it dead (its old work is theirs now,
    /// and fenced against it).
    async fn heartbeat(&self) -> Result<(), StoreError> {
        let changed = query(sql!(
            self.dialect,
            |d| "UPDATE instances SET heartbeat_at = {} WHERE id = $1",
            d.now()
        ))
        .bind(self.instance.as_str())
        .bind(crate::clock::now_ms() as i64)
        .execute(&self.writer)
        .await
        .map_err(unavailable)?;
        if changed.rows_affected() == 0 {
            tracing::warn!(instance = %self.instance, "this instance was taken for dead; it serves on");
            self.register_instance().await?;
        }
        Ok(())
    }

    /// The instances whose heartbeat is fresh (this one always).
    pub(super) async fn live_instances(&self) -> Result<Vec<String>, StoreError> {
        let mut live = vec![self.instance.as_str().to_owned()];
        if self.dialect == Dialect::Postgres {
            // Each by its own lease: instances may be started with different `--lease-secs`.
            let rows = query(
                "SELECT id FROM instances \
                 WHERE heartbeat_at >= CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) - COALESCE(lease_ms, $1)",
            )
            .bind(self.lease.as_millis() as i64)
            .fetch_all(&self.writer)
            .await
            .map_err(unavailable)?;
            for row in rows {
                live.push(row.try_get(0).map_err(unavailable)?);
            }
        }
        Ok(live)
    }

    /// Forgets instances that were not live when `live` was read, once their work is taken over. On PostgreSQL
    /// only those still without a fresh heartbeat now, judged by the delete itself: an instance that started (or
    /// came back) since keeps its row, without which it would take itself for dead and begin nothing.
    pub(super) async fn forget_dead_instances(&self, live: &[String]) -> Result<(), StoreError> {
        let rows = query("SELECT id FROM instances")
            .fetch_all(&self.writer)
            .await
            .map_err(unavailable)?;
        for row in rows {
            let id: String = row.try_get(0).map_err(unavailable)?;
            if !live.contains(&id) {
                let delete = match self.dialect {
                    Dialect::Sqlite => query("DELETE FROM instances WHERE id = $1").bind(id),
                    Dialect::Postgres => query(
                        "DELETE FROM instances WHERE id = $1 \
                         AND heartbeat_at < CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) - COALESCE(lease_ms, $2)",
                    )
                    .bind(id)
                    .bind(self.lease.as_millis() as i64),
                };
                delete.execute(&self.writer).await.map_err(unavailable)?;
            }
        }
        Ok(())
    }

    /// Whether this instance's lease still holds, inside a transaction (PostgreSQL; SQLite has one process).
    async fn alive_in(&self, connection: &mut Tx) -> Result<bool, StoreError> {
        if self.dialect == Dialect::Sqlite {
            return Ok(true);
        }
        self.lease_holds_in(connection, self.instance.as_str())
            .await
    }

    /// Whether instance `id` is live now, by its own lease, read in `connection`'s transaction: a recovery that read
    /// who is live before waiting for a run checks again before it takes over what `id` was doing. On SQLite, the
    /// file lock makes every other instance a dead process's.
    async fn instance_alive_in(&self, connection: &mut Tx, id: &str) -> Result<bool, StoreError> {
        if self.dialect == Dialect::Sqlite {
            return Ok(false);
        }
        self.lease_holds_in(connection, id).await
    }

    /// Whether the lease of instance `id` holds, on PostgreSQL's clock and by the lease the instance recorded (this
    /// instance's when it recorded none).
    async fn lease_holds_in(&self, connection: &mut Tx, id: &str) -> Result<bool, StoreError> {
        let row = query(
            "SELECT 1 FROM instances WHERE id = $1 \
             AND heartbeat_at >= CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) - COALESCE(lease_ms, $2)",
        )
        .bind(id)
        .bind(self.lease.as_millis() as i64)
        .fetch_optional(&mut *connection)
        .await
        .map_err(unavailable)?;
        Ok(row.is_some())
    }

    /// Tells the other instances this one is gone, so that they take its work over at once.
    pub(super) async fn retire(&self) -> Result<(), StoreError> {
        if self.dialect == Dialect::Postgres {
            query("DELETE FROM instances WHERE id = $1")
                .bind(self.instance.as_str())
                .execute(&self.writer)
                .await
                .map_err(unavailable)?;
        }
        Ok(())
    }

    /// Rings the other instances' doorbell in `connection`'s transaction: they hear it once it commits. The message
    /// is made only where there is a doorbell (PostgreSQL).
    async fn doorbell(&self, connection: &mut Tx, message: impl FnOnce() -> String) -> db::Db<()> {
        if self.dialect == Dialect::Postgres {
            query("SELECT pg_notify($1, $2)")
                .bind(CHANNEL)
                .bind(message())
                .execute(&mut *connection)
                .await?;
        }
        Ok(())
    }

    /// Wakes every reader to read its rows again: a doorbell may have been missed.
    fn reread_all(&self) {
        self.runs.notify_all();
        self.sessions.notify_all();
    }

    /// What another instance's doorbell says: wake this process's readers, or stop what it runs of a run or a call.
    fn heard(&self, message: &str) {
        let mut parts = message.split(' ');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some("run"), Some(run), Some(seq), None) => {
                if let (Ok(run), Ok(seq)) = (RunId::parse(run), seq.parse()) {
                    self.runs.notify(&run, seq);
                }
            }
            (Some("session"), Some(session), Some(count), None) => {
                if let (Ok(session), Ok(count)) = (SessionId::parse(session), count.parse()) {
                    self.sessions.notify(&session, count);
                }
            }
            (Some("abort"), Some(run), Some(reason), None) => {
                if let (Ok(run), Some(reason)) = (RunId::parse(run), AbortReason::parse(reason)) {
                    let _ = self.stops.send(RemoteStop::Run(run, reason));
                }
            }
            // A recovery took over what this instance ran of a run, judging it dead: it was only late.
            (Some("stop"), Some(instance), Some(run), None)
                if instance == self.instance.as_str() =>
            {
                if let Ok(run) = RunId::parse(run) {
                    tracing::warn!(%run, "another instance took this instance for dead and took the run over; stopping what runs of it here");
                    let _ = self
                        .stops
                        .send(RemoteStop::Run(run, AbortReason::TakenOver));
                }
            }
            // A recovery recorded a call this instance runs of a waiting run as interrupted, judging it dead.
            (Some("stop-call"), Some(instance), Some(run), Some(call))
                if instance == self.instance.as_str() =>
            {
                if let (Ok(run), Ok(call)) = (RunId::parse(run), ToolCallId::parse(call)) {
                    tracing::warn!(%run, %call, "another instance took this instance for dead and recorded its call as interrupted; stopping it here");
                    let _ = self.stops.send(RemoteStop::Call(run, call));
                }
            }
            (Some("stop"), Some(_), Some(_), None)
            | (Some("stop-call"), Some(_), Some(_), Some(_)) => {}
            _ => tracing::debug!(message, "an unknown doorbell"),
        }
    }

    /// Wakes this process's readers of a run, whose log is committed through `seq`.
    fn touched(&self, run_id: &RunId, seq: u64) {
        if let Some(tails) = &self.tails {
            tails.touched(run_id, seq);
        }
        self.runs.notify(run_id, seq);
    }
}

impl Drop for SqlStore {
    fn drop(&mut self) {
        // The appender sees the store gone and ends.
        self.flush_now.notify_one();
        self.appended.notify_one();
    }
}

/// A database URL as logs may show it: without its password.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let credentials = &url[scheme + 3..at];
            match credentials.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

fn postgres_pool(connections: u32) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(connections)
        .acquire_timeout(Duration::from_secs(10))
}

/// Opens a SQLite connection as the store uses it. WAL: the reader never waits for the writer. NORMAL: a commit
/// survives a crash of the process (the WAL is written); only a crash of the machine may lose the last commits.
/// busy_timeout: a reader that meets a checkpoint waits instead of failing. Checkpoints: a commit that crosses the
/// automatic threshold copies the WAL into the database and waits for the disk (fsync) on the task that committed,
/// holding the writer, so [`checkpoint_forever`] does that on a thread of its own; the automatic one stays as a
/// backstop, at 10,000 pages (about 40 MiB), should that thread fall behind, and the file is cut back to 64 MiB
/// once it is copied whole. No memory-mapped reads: every page a mapping touched
/// counts in the process's resident memory for as long as it stays mapped, so one scan of a large table (the
/// listing of 10,000 pending approvals) kept about 90 MiB of the file resident in the server. Read with system
/// calls, a page lives in SQLite's page cache, bounded per connection, and beyond it in the kernel's. Temporary
/// storage in memory: a change that joins a group is a savepoint within the group's transaction (see [`db`]), and
/// SQLite keeps the pages a savepoint changes in a sub-journal, which by default goes to a temporary file once past
/// 64 KiB; at a busy server's pace that spill was a file created, written and deleted for most groups (7% of the
/// server's CPU in a profile). A change's sub-journal is the few pages it changed: it stays in memory and goes at its
/// release. The connections that may write go through [`wal_writes`], which writes a commit's WAL frames with one
/// system call.
fn sqlite_connection(path: &Path, read_only: bool) -> rusqlite::Result<rusqlite::Connection> {
    use rusqlite::OpenFlags;
    let connection = if read_only {
        rusqlite::Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?
    } else {
        let vfs = wal_writes::register().map_err(|code| {
            rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(code),
                Some("cannot register the VFS that writes the WAL".to_owned()),
            )
        })?;
        rusqlite::Connection::open_with_flags_and_vfs(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            vfs,
        )?
    };
    connection.busy_timeout(Duration::from_secs(5))?;
    if !read_only {
        connection.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;
             PRAGMA wal_autocheckpoint = 10000; PRAGMA journal_size_limit = 67108864; PRAGMA temp_store = MEMORY;",
        )?;
    }
    Ok(connection)
}

/// How often the checkpointer copies the WAL into the database. Each round's copy flushes the WAL, then the
/// database, to the disk, and waits for them.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(100);

/// How often, between two rounds while commits come, the checkpointer has the kernel start writing the WAL's new
/// pages to the disk, without waiting for them ([`WalWriteback`]). A round's work holds one of the machine's cores
/// for as long as it lasts, and a request that needs that core meanwhile waits: with rounds 100 ms apart and nothing
/// between them, each took a few milliseconds at concurrency 1, most of it the kernel writing back the WAL for the
/// round's flush, and the slowest percent of decisions waited for them. Rounds ten times as often made that wait
/// shorter but copied the pages the trips keep rewriting ten times as often (8% more CPU a trip at concurrency 32);
/// writing back every 10 ms and copying every 100 ms shortens the rounds without those copies (measured, see the
/// README).
const WRITEBACK_EVERY: Duration = Duration::from_millis(10);

/// WAL frames (pages of about 4 KiB) past which the checkpointer makes sure the WAL starts over.
const RESTART_WAL_AT: i64 = 6_000;

/// Copies what the WAL holds into the database file, as long as the store lives, on its own thread and connection
/// (it waits for the disk). PASSIVE: it never blocks the writer or a reader. But under a steady load a passive
/// checkpoint never copies the WAL whole (commits go on while it copies), and the WAL starts over from its
/// beginning only once it was copied whole: it grew until the automatic threshold, past which every commit ran a
/// checkpoint of its own, inline, over a WAL of 10,000 pages. So once the WAL is past [`RESTART_WAL_AT`] frames,
/// the checkpointer copies the bulk beside the writer ([`copy_round`]), then holds the writer (this process's only
/// one) for a short pass that copies the rest: the WAL is then copied whole, and the next commit starts it over.
/// While commits come, it starts the WAL's writeback between rounds ([`WRITEBACK_EVERY`]); an idle server's
/// checkpointer wakes ten times a second.
fn checkpoint_forever(connection: rusqlite::Connection, store: std::sync::Weak<SqlStore>) {
    // SQLite names the WAL by the database's full path. A database without a file has no WAL of its own (its path
    // is empty), and rusqlite shows no path that is not UTF-8: then the rounds' flushes write the WAL alone.
    let mut wal = match connection.path().filter(|path| !path.is_empty()) {
        Some(path) => Some(WalWriteback::of(path)),
        None => {
            tracing::debug!(
                "no path of the database's WAL: its writeback is left to the checkpoints"
            );
            None
        }
    };
    let mut pace = Pace::Idle;
    // The WAL's frames at the last round.
    let mut frames = None;
    loop {
        match (pace, wal.as_mut()) {
            (Pace::Busy, Some(wal)) => {
                // A start on each tick but the last, after which the round's own flush writes what is left.
                for _ in 1..(CHECKPOINT_EVERY.as_millis() / WRITEBACK_EVERY.as_millis()) {
                    std::thread::sleep(WRITEBACK_EVERY);
                    wal.start();
                }
                std::thread::sleep(WRITEBACK_EVERY);
                wal.close();
            }
            _ => std::thread::sleep(CHECKPOINT_EVERY),
        }
        // Only the writer's connection is held while this round works, never the store: the store (and its file
        // lock) goes as soon as its last user lets go.
        let writer = match store.upgrade().as_deref().map(|store| &store.writer) {
            Some(Pool::Sqlite(writer)) => Arc::clone(writer),
            _ => return,
        };
        // A group of changes whose every change was cancelled while it waited has nobody left to commit it.
        writer.finish_orphaned_group();
        let copied = copy_round(&connection).and_then(|round| {
            pace = Pace::since(frames, round.frames);
            frames = Some(round.frames);
            if !round.restart_due {
                return Ok(());
            }
            // No transaction of this process is open while the connection is held (taking it commits the open
            // group): this pass copies the WAL whole (unless a reader still reads an older snapshot; then the
            // next round does).
            let _writer = writer.hold_blocking();
            passive(&connection).map(drop)
        });
        if let Err(error) = copied {
            tracing::warn!(%error, "cannot checkpoint the database's WAL");
            pace = Pace::Idle;
            frames = None;
        }
    }
}

/// Whether commits come, as the checkpointer judges from the WAL between two rounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pace {
    /// The WAL changed since the last round (it grew, or started over): the WAL's writeback is started between
    /// rounds.
    Busy,
    /// It did not (or the last round failed): the checkpointer sleeps until its next round.
    Idle,
}

impl Pace {
    /// The pace, given the WAL's frames at the last round (`None` before the first, or after one that failed) and
    /// at this one.
    fn since(last: Option<i64>, frames: i64) -> Self {
        if last == Some(frames) {
            Self::Idle
        } else {
            Self::Busy
        }
    }
}

/// The checkpointer's own handle of the WAL, through which it has the kernel start writing the WAL's dirty pages
/// to the disk (`sync_file_range` with `SYNC_FILE_RANGE_WRITE`: no waiting, no flush of the disk's cache), so that
/// the next round's flush of the WAL finds most of them written. A handle of its own, opened read-only: SQLite holds
/// no lock on the WAL file (its locks are on the database and the shared-memory file), so closing this handle drops
/// none, and SQLite exposes no descriptor. Only a start: what makes a checkpoint safe is still its own flush.
struct WalWriteback {
    path: PathBuf,
    /// Opened at a round's first start that finds the WAL there, let go at the round's end ([`Self::close`]).
    file: Option<std::fs::File>,
}

impl WalWriteback {
    /// The WAL of the database at `database` (SQLite names it by the database's path and `-wal`).
    fn of(database: &str) -> Self {
        let mut path = std::ffi::OsString::from(database);
        path.push("-wal");
        Self {
            path: PathBuf::from(path),
            file: None,
        }
    }

    /// Starts the writeback of what the WAL holds that is not on the disk yet. A failure loses nothing (the next
    /// round's flush writes it all), so it is only logged, and the file opened again at the next start.
    fn start(&mut self) {
        if let Err(error) = self.try_start() {
            tracing::debug!(%error, path = %self.path.display(), "cannot start the WAL's writeback");
            self.close();
        }
    }

    /// Lets the handle go; the next start opens the WAL again. Once a round: SQLite keeps its WAL file while the
    /// store is open, but should something outside the process delete it (and SQLite make a new one), a handle of
    /// the old file would start nothing useful, silently, for as long as it was kept.
    fn close(&mut self) {
        self.file = None;
    }

    #[cfg(target_os = "linux")]
    fn try_start(&mut self) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let file = match &self.file {
            Some(file) => file,
            None => self.file.insert(std::fs::File::open(&self.path)?),
        };
        // SAFETY: `file` is an open descriptor; offset 0 and length 0 name the whole file.
        if unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) }
            != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Elsewhere there is no writeback to start ahead of the flush.
    #[cfg(not(target_os = "linux"))]
    fn try_start(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A passive checkpoint: copies what it can beside the writer and the readers. Returns the WAL's frames.
fn passive(connection: &rusqlite::Connection) -> rusqlite::Result<i64> {
    connection.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| row.get(1))
}

/// What a round of copying found.
struct Round {
    /// The WAL's frames, as the round's first checkpoint found them.
    frames: i64,
    /// The WAL is past [`RESTART_WAL_AT`] frames: the held pass is due.
    restart_due: bool,
}

/// One round of copying, beside the writer. When the WAL has grown past [`RESTART_WAL_AT`] frames, it also copies
/// what was committed meanwhile and writes both files through to the disk, and says that the held pass is due: whatever
/// that pass copies and waits for the disk for, every commit waits for too. Right after a single pass, its two
/// flushes (of the WAL, then of the database) took 2.2 to 2.5 ms on this project's test machine at concurrency 1;
/// after this round, 0.9 ms (medians of about 20 holds in each of two alternating runs, under `strace`).
fn copy_round(connection: &rusqlite::Connection) -> rusqlite::Result<Round> {
    let frames = passive(connection)?;
    if frames < RESTART_WAL_AT {
        return Ok(Round {
            frames,
            restart_due: false,
        });
    }
    passive(connection)?;
    // The WAL last: commits go on adding to it meanwhile.
    sync_file(connection, DatabaseFile::Main)?;
    sync_file(connection, DatabaseFile::Wal)?;
    Ok(Round {
        frames,
        restart_due: true,
    })
}

/// A file of a SQLite database that a checkpoint writes.
#[derive(Clone, Copy, Debug)]
enum DatabaseFile {
    Main,
    Wal,
}

/// Waits until what the kernel holds of `file` is on the disk: what any connection wrote to it, since the kernel
/// caches a file's pages for the file, not for a handle. Through `connection`'s own handle of the file: a handle of
/// the database file opened beside SQLite's would, once closed, drop the POSIX locks SQLite holds on that file for
/// the whole process. A file the connection has not opened yet has nothing of it to write.
fn sync_file(connection: &rusqlite::Connection, file: DatabaseFile) -> rusqlite::Result<()> {
    use rusqlite::ffi;
    let op = match file {
        DatabaseFile::Main => ffi::SQLITE_FCNTL_FILE_POINTER,
        DatabaseFile::Wal => ffi::SQLITE_FCNTL_JOURNAL_POINTER,
    };
    let failed = |code| Err(rusqlite::Error::SqliteFailure(ffi::Error::new(code), None));
    let mut handle: *mut ffi::sqlite3_file = std::ptr::null_mut();
    // SAFETY: the connection is open, and used on one thread at a time (a rusqlite connection is not `Sync`, which
    // is what SQLITE_OPEN_NO_MUTEX asks); both operations write to the pointer given the connection's handle of the
    // file, which stays valid while the connection is open.
    let code = unsafe {
        ffi::sqlite3_file_control(
            connection.handle(),
            c"main".as_ptr(),
            op,
            (&raw mut handle).cast(),
        )
    };
    if code != ffi::SQLITE_OK {
        return failed(code);
    }
    // SAFETY: as above; a handle that is not open has no methods.
    let sync = unsafe { handle.as_ref() }
        .and_then(|handle| unsafe { handle.pMethods.as_ref() })
        .and_then(|methods| methods.xSync);
    let Some(sync) = sync else {
        return Ok(());
    };
    // SAFETY: the file's own method, on its open handle, from the connection's thread.
    match unsafe { sync(handle, ffi::SQLITE_SYNC_NORMAL) } {
        ffi::SQLITE_OK => Ok(()),
        code => failed(code),
    }
}

/// How often readers re-read what they follow even without a doorbell: notifications can be lost (a listener's
/// reconnect), rows cannot.
const REREAD_EVERY: Duration = Duration::from_secs(10);

/// Hears the other instances' doorbells, as long as the store lives.
async fn listen_forever(
    mut listener: sqlx::postgres::PgListener,
    store: std::sync::Weak<SqlStore>,
) {
    // Every REREAD_EVERY, busy or quiet: on a busy cluster the doorbells never stop ringing, and a lost one must
    // still be made up for.
    let mut reread_at = tokio::time::Instant::now() + REREAD_EVERY;
    loop {
        let heard = tokio::time::timeout_at(reread_at, listener.try_recv()).await;
        let Some(strong) = store.upgrade() else {
            return;
        };
        let now = tokio::time::Instant::now();
        if now >= reread_at {
            strong.reread_all();
            reread_at = now + REREAD_EVERY;
        }
        match heard {
            Ok(Ok(Some(notification))) => strong.heard(notification.payload()),
            // The connection was lost (and is back): what rang meanwhile is lost, so every reader re-reads.
            Ok(Ok(None)) => {
                tracing::warn!("the database connection for notifications was lost; reading again");
                strong.reread_all();
            }
            // The connection was lost and could not be made again yet: the next `try_recv` makes it again without
            // saying so, and what rang meanwhile is lost all the same.
            Ok(Err(error)) => {
                tracing::warn!(%error, "cannot hear other instances; trying again");
                strong.reread_all();
                drop(strong);
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            // The time to re-read came while all was quiet: done above.
            Err(_) => {}
        }
    }
}

/// Keeps this instance's lease, as long as the store lives.
async fn heartbeat_forever(store: std::sync::Weak<SqlStore>, lease: Duration) {
    let every = lease / 5;
    loop {
        tokio::time::sleep(every).await;
        let Some(store) = store.upgrade() else {
            return;
        };
        if let Err(error) = store.heartbeat().await {
            tracing::warn!(%error, "cannot renew this instance's lease");
        }
    }
}

/// How long the appender lets appends gather before it writes them: a state change that comes meanwhile (a run's
/// next step, its end) takes them into its own transaction on SQLite, and a busy server writes many in one commit.
/// Readers see an event this much later at most; nothing waits for it (whoever must, flushes).
const GROUP_COMMIT_WINDOW: Duration = Duration::from_millis(1);

/// Writes queued appends in batches, as long as the store lives. It holds the store only while it writes, so that
/// the store (and its file lock) goes as soon as its last user lets go.
async fn append_forever(
    store: std::sync::Weak<SqlStore>,
    wake: Arc<Notify>,
    flush_now: Arc<Notify>,
) {
    let mut attempt = 0;
    loop {
        let Some(strong) = store.upgrade() else {
            return;
        };
        // Whoever takes appends marks them written once committed: a state change may hold some right now.
        let due = strong.appends.lock().due(tokio::time::Instant::now());
        match due {
            Due::Now => {}
            Due::Nothing => {
                drop(strong);
                // Woken by the next append, or by the store's end.
                wake.notified().await;
                tokio::select! {
                    () = tokio::time::sleep(GROUP_COMMIT_WINDOW) => {}
                    () = flush_now.notified() => {}
                }
                continue;
            }
            Due::At(retry_at) => {
                drop(strong);
                tokio::select! {
                    () = tokio::time::sleep_until(retry_at) => {}
                    () = wake.notified() => {}
                }
                continue;
            }
        }
        match strong.write_queued().await {
            Ok(_) => attempt = 0,
            Err(error) if attempt < APPEND_TRIES => {
                attempt += 1;
                tracing::warn!(%error, attempt, "cannot write events; trying again");
                drop(strong);
                tokio::time::sleep(retry_after(attempt)).await;
            }
            Err(error) => {
                attempt = 0;
                // The events go: a run's log may lack some, and nothing waits for them any longer. The results of
                // calls stay queued, for the next write or the run's next change to take (each is what a tool
                // really did, and its run cannot go on without it), and are tried again after the longest wait.
                let (lost, kept) = strong.give_up_events(|_| true);
                tracing::error!(%error, events = lost, results_kept = kept, "cannot write events; they are lost");
                if kept > 0 {
                    drop(strong);
                    tokio::time::sleep(retry_after(APPEND_TRIES)).await;
                }
            }
        }
    }
}

/// Joins the appends of a batch that go to the same run under the same claim, in their order, so that each run's
/// events of a group commit are one append (one update of the run, one insert). A call's result stays between the
/// run's events before it and those after it: the run's log keeps the order things happened in.
fn coalesce(queue: Vec<Queued>) -> Vec<Queued> {
    let mut joined: Vec<Queued> = Vec::with_capacity(queue.len());
    // Where each run's latest append of events is in `joined`, while nothing of the run came after it.
    let mut latest: std::collections::HashMap<RunId, usize> = std::collections::HashMap::new();
    for queued in queue {
        match queued {
            Queued::Events(run_id, epoch, events) => {
                if let Some(&i) = latest.get(&run_id)
                    && let Queued::Events(_, joined_epoch, joined_events) = &mut joined[i]
                    && *joined_epoch == epoch
                {
                    joined_events.extend(events);
                } else {
                    latest.insert(run_id.clone(), joined.len());
                    joined.push(Queued::Events(run_id, epoch, events));
                }
            }
            Queued::Settled(result) => {
                latest.remove(&result.run_id);
                joined.push(Queued::Settled(result));
            }
        }
    }
    joined
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run whose events were all given up is refused no longer: its next appends join the group commits at once,
    /// instead of waiting to be tried alone. One whose call's result is still queued stays set aside.
    #[test]
    fn a_run_with_nothing_left_after_a_give_up_is_refused_no_longer() {
        let run = RunId::parse("r").unwrap();
        let mut appends = Appends::default();
        let event = NewEvent {
            kind: "debug",
            json: "{}".into(),
        };
        appends
            .queue
            .push(Queued::Events(run.clone(), 1, vec![event.clone()]));
        appends.mark_refused(&run);
        assert_eq!(appends.give_up_events(|refused| refused == &run), 1);
        appends.tried_again_later(&run);
        assert!(appends.refused.is_empty());

        appends
            .queue
            .push(Queued::Events(run.clone(), 1, vec![event.clone()]));
        let (taken, all) = appends.take(Take::Group);
        assert_eq!(
            (taken.len(), all),
            (1, true),
            "taken by the next group commit"
        );

        appends
            .queue
            .push(Queued::Events(run.clone(), 1, vec![event]));
        appends
            .queue
            .push(Queued::Settled(crate::store::CallResult {
                run_id: run.clone(),
                call_id: crate::ids::ToolCallId::parse("call_1").unwrap(),
                output: crate::wire::ToolOutput::Ok {
                    content: serde_json::json!("done"),
                },
                events: Vec::new(),
                audit: Vec::new(),
            }));
        appends.mark_refused(&run);
        assert_eq!(appends.give_up_events(|refused| refused == &run), 1);
        appends.tried_again_later(&run);
        assert!(
            appends.refused.contains_key(&run),
            "its result is kept aside"
        );
    }

    /// The scans made while serving read the indexes that hold only unfinished runs and pending calls, not the
    /// tables: with 10,000 finished runs kept, a sweep for expired approvals reads what is pending.
    #[tokio::test]
    async fn the_scans_while_serving_read_the_indexes_of_what_is_live() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("toolgate.db");
        let store = SqlStore::open(&DatabaseUrl::Sqlite(path.clone()))
            .await
            .unwrap();
        drop(store);
        let connection = rusqlite::Connection::open(&path).unwrap();
        let plan = |sql: &str| -> String {
            let mut statement = connection
                .prepare(&format!(
                    "EXPLAIN QUERY PLAN {}",
                    sql.replace("$1", "'0'")
                        .replace("$2", "0")
                        .replace("$3", "10")
                ))
                .unwrap();
            let details = statement
                .query_map([], |row| row.get::<_, String>(3))
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            details.join("; ")
        };
        for (sql, index) in [
            (queries::DUE_CALLS, "calls_pending"),
            (queries::NEXT_EXPIRY, "calls_pending"),
            (queries::PENDING_CALLS, "calls_pending"),
            (queries::UNFINISHED_RUNS, "runs_unfinished"),
        ] {
            let plan = plan(sql);
            assert!(plan.contains(&format!("INDEX {index}")), "{sql}: {plan}");
        }
        // Each looks a pending call's run up by its id (is it aborted?), without a pass over the runs.
        for sql in [
            queries::DUE_CALLS,
            queries::NEXT_EXPIRY,
            queries::PENDING_CALLS,
        ] {
            let plan = plan(sql);
            assert!(plan.contains("SEARCH runs USING"), "{sql}: {plan}");
        }
        // A run's events are one range of the events table's row numbers.
        for sql in [
            Dialect::Sqlite.events_after(),
            Dialect::Sqlite.delete_events(),
        ] {
            let plan = plan(sql);
            assert!(
                plan.contains("events USING INTEGER PRIMARY KEY (rowid>? AND rowid<?)"),
                "{sql}: {plan}"
            );
        }
    }

    /// The checkpointer starts the WAL's writeback between its rounds while the WAL changes, and only sleeps while
    /// it does not.
    #[test]
    fn the_checkpointer_writes_back_between_rounds_while_commits_come() {
        assert_eq!(Pace::since(None, 0), Pace::Busy);
        assert_eq!(Pace::since(Some(40), 90), Pace::Busy);
        assert_eq!(Pace::since(Some(6_100), 12), Pace::Busy);
        assert_eq!(Pace::since(Some(90), 90), Pace::Idle);
        assert!(WRITEBACK_EVERY < CHECKPOINT_EVERY);
    }

    /// The checkpointer's writeback opens the WAL that SQLite writes beside the database; before there is one, a
    /// start fails (and is only logged), and the next start tries again.
    #[test]
    fn the_wal_writeback_starts_on_the_wal_sqlite_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("toolgate.db");
        let mut early = WalWriteback::of(path.to_str().unwrap());
        if cfg!(target_os = "linux") {
            let error = early.try_start().unwrap_err();
            assert_eq!(error.kind(), std::io::ErrorKind::NotFound);
        }
        early.start();
        assert!(early.file.is_none());

        // The store's connections open a database that is there (its migrations made it).
        drop(rusqlite::Connection::open(&path).unwrap());
        let connection = sqlite_connection(&path, false).unwrap();
        connection
            .execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
            .unwrap();
        let mut wal = WalWriteback::of(connection.path().unwrap());
        // SQLite's path is the database's, resolved.
        let expected = dir.path().canonicalize().unwrap().join("toolgate.db-wal");
        assert_eq!(wal.path, expected);
        wal.try_start().unwrap();
        if cfg!(target_os = "linux") {
            let file = wal.file.as_ref().expect("the WAL, open");
            assert!(
                file.metadata().unwrap().len() > 0,
                "the WAL holds the commit"
            );
        }
        // The handle lasts until the round ends; the next start opens the WAL again.
        wal.try_start().unwrap();
        wal.close();
        assert!(wal.file.is_none());
        wal.try_start().unwrap();
        assert!(wal.file.is_some() || !cfg!(target_os = "linux"));
    }

    /// An event's row number holds its run's number and its sequence number apart, up to the largest of each that
    /// fits; past them there is no row number, rather than one that lands among another run's events.
    #[test]
    fn an_events_row_number_is_its_runs_range_plus_its_sequence_number() {
        assert_eq!(event_row(1, 1), Some((1 << 32) + 1));
        assert_eq!(event_row(2, 0), Some(2 << 32));
        assert_eq!(event_row((1 << 31) - 1, MAX_SEQ), Some(i64::MAX));
        assert_eq!(event_row(1, MAX_SEQ + 1), None);
        assert_eq!(event_row(1 << 31, 0), None);
        assert_eq!(event_row(1, -1), None);
        assert_eq!(event_row(-1, 1), None);
        // The SQL spells the same range: a run's rows from its number times 2^32, its sequence number the low bits.
        let (range, low) = ((MAX_SEQ + 1).to_string(), format!("& {MAX_SEQ}"));
        for sql in [
            Dialect::Sqlite.events_after(),
            Dialect::Sqlite.delete_events(),
        ] {
            assert_eq!(sql.matches(&range).count(), 2, "{sql}");
        }
        assert!(Dialect::Sqlite.events_after().contains(&low));
    }

    /// A run that waits for a person and goes on after the decision leaves the index of unfinished runs as it was:
    /// the index names neither the run's state nor anything else those changes write (before, it was keyed by the
    /// state, and both changes moved the run's entry, a page written in each commit).
    #[tokio::test]
    async fn the_index_of_unfinished_runs_names_nothing_a_wait_or_a_resumption_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("toolgate.db");
        drop(
            SqlStore::open(&DatabaseUrl::Sqlite(path.clone()))
                .await
                .unwrap(),
        );
        let connection = rusqlite::Connection::open(&path).unwrap();
        let definition: String = connection
            .query_row(
                "SELECT sql FROM sqlite_schema WHERE type = 'index' AND name = 'runs_unfinished'",
                [],
                |row| row.get(0),
            )
            .unwrap();
        // What a run's wait (the opening of its batch) and its resumption (the claim of the batch) write of its row.
        for column in ["state", "owner", "epoch", "batch"] {
            assert!(
                !definition.contains(column),
                "the index of unfinished runs names {column}: {definition}"
            );
        }
    }

    /// A read by key while a change holds the writer reads what is committed on the reader: it neither waits for
    /// the change nor ends the group the change is in (before, it waited for the connection, then committed the
    /// group early).
    #[tokio::test]
    async fn a_read_by_key_while_a_change_holds_the_writer_reads_what_is_committed_without_waiting()
    {
        use crate::store::{NewRun, Store};
        let dir = tempfile::tempdir().unwrap();
        let store = SqlStore::open(&DatabaseUrl::Sqlite(dir.path().join("toolgate.db")))
            .await
            .unwrap();
        let run = RunId::parse("run_1").unwrap();
        store
            .start_run(NewRun::for_tests(
                run.clone(),
                SessionId::parse("sess_1").unwrap(),
                "hello",
                Vec::new(),
            ))
            .await
            .unwrap()
            .unwrap();

        let change = store.writer.begin().await.unwrap();
        let read = tokio::time::timeout(Duration::from_secs(5), store.run(&run)).await;

        let info = read
            .expect("the read waited for the change that holds the writer")
            .unwrap()
            .expect("the committed run");
        assert_eq!(info.run_id, run);
        change.commit().await.unwrap();
    }

    #[tokio::test]
    async fn a_database_of_the_first_schema_keeps_its_events_calls_and_audit_through_the_migration()
    {
        use crate::store::{AuditQuery, Store};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("toolgate.db");
        {
            let options = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true);
            let mut connection = sqlx::SqliteConnection::connect_with(&options)
                .await
                .unwrap();
            let first = migrations(Dialect::Sqlite).into_iter().take(1).collect();
            Migrator::with_migrations(first)
                .run(&mut connection)
                .await
                .unwrap();
            connection.close().await.unwrap();
            let connection = rusqlite::Connection::open(&path).unwrap();
            connection
                .execute_batch(
                    "INSERT INTO sessions (id, created_at, updated_at) VALUES ('sess_1', 1, 1);
                     INSERT INTO runs (id, session_id, ordinal, mode, state, last_seq, created_at, finished_at)
                         VALUES ('run_1', 'sess_1', 1, 'stream', 'done', 2, 1, 2),
                                ('run_2', 'sess_1', 2, 'stream', 'done', 1, 3, 4);
                     INSERT INTO events (run_id, seq, kind, json) VALUES
                         ('run_2', 1, 'done', '{\"type\":\"done\"}'),
                         ('run_1', 1, 'runStarted', '{\"type\":\"runStarted\"}'),
                         ('run_1', 2, 'done', '{\"type\":\"done\"}');
                     INSERT INTO calls (run_id, call_id, idx, status, record) VALUES ('run_1', 'call_1', 0, 'settled', '{}');
                     INSERT INTO audit (at, kind, run_id, outcome) VALUES (5, 'approval_requested', 'run_1', 'requested');",
                )
                .unwrap();
        }
        let store = SqlStore::open(&DatabaseUrl::Sqlite(path.clone()))
            .await
            .unwrap();
        let run = RunId::parse("run_1").unwrap();
        let events = store.events_after(&run, 0, 10).await.unwrap();
        assert_eq!(
            events.iter().map(|e| (e.seq, e.kind)).collect::<Vec<_>>(),
            vec![(1, "runStarted"), (2, "done")]
        );
        let second = store
            .events_after(&RunId::parse("run_2").unwrap(), 0, 10)
            .await
            .unwrap();
        assert_eq!(
            second.iter().map(|e| (e.seq, e.kind)).collect::<Vec<_>>(),
            vec![(1, "done")],
            "each run keeps its own events"
        );
        let audit = store
            .audit_log(AuditQuery {
                limit: 10,
                ..AuditQuery::default()
            })
            .await
            .unwrap();
        assert_eq!(audit.len(), 1);
        assert_eq!((audit[0].id, audit[0].outcome.as_str()), (1, "requested"));
        drop(store);
        let connection = rusqlite::Connection::open(&path).unwrap();
        let calls: i64 = connection
            .query_row(
                "SELECT COUNT(*) FROM calls WHERE call_id = 'call_1'",
                [],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(calls, 1);
        let without_rowid: Option<String> = connection
            .query_row(
                "SELECT group_concat(name) FROM sqlite_schema WHERE name IN ('events', 'calls') AND sql LIKE '%WITHOUT ROWID%'",
                [],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(
            without_rowid, None,
            "events and calls keep their rows on their tables' pages"
        );
        let run_seqs: Vec<i64> = connection
            .prepare(
                "SELECT run_seq - number * 4294967296 FROM events JOIN runs ON run_seq >> 32 = number \
                 WHERE runs.id = 'run_1' ORDER BY run_seq",
            )
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            run_seqs,
            [1, 2],
            "a run's events are keyed by the run's number and their sequence numbers"
        );
        assert!(
            connection
                .execute("DELETE FROM audit", [])
                .unwrap_err()
                .to_string()
                .contains("append-only"),
            "the audit log stays append-only"
        );
    }

    #[test]
    fn a_group_commit_joins_each_runs_appends_in_order_and_keeps_claims_apart() {
        let (a, b) = (run(1), run(2));
        let joined = coalesce(vec![
            Queued::Events(a.clone(), 1, vec![event("a1")]),
            Queued::Events(b.clone(), 1, vec![event("b1")]),
            Queued::Events(a.clone(), 1, vec![event("a2"), event("a3")]),
            Queued::Events(b.clone(), 2, vec![event("b2")]),
            Queued::Events(a.clone(), 1, vec![event("a4")]),
        ]);
        assert_eq!(
            shape(&joined),
            vec![
                (a.clone(), "1: a1 a2 a3 a4".to_owned()),
                (b.clone(), "1: b1".to_owned()),
                (b, "2: b2".to_owned()),
            ]
        );
    }

    fn run(n: u32) -> RunId {
        RunId::parse(format!("run_{n:032}")).unwrap()
    }

    fn event(name: &str) -> NewEvent {
        NewEvent {
            kind: "debug",
            json: name.into(),
        }
    }

    fn shape(joined: &[Queued]) -> Vec<(RunId, String)> {
        joined
            .iter()
            .map(|queued| match queued {
                Queued::Events(run, epoch, events) => {
                    let names: Vec<_> = events.iter().map(|e| e.json.to_string()).collect();
                    (run.clone(), format!("{epoch}: {}", names.join(" ")))
                }
                Queued::Settled(result) => {
                    (result.run_id.clone(), format!("settled {}", result.call_id))
                }
            })
            .collect()
    }

    #[test]
    fn a_group_commit_keeps_a_calls_result_between_the_runs_events_before_and_after_it() {
        let settled = |run_id: &RunId| {
            Queued::Settled(crate::store::CallResult {
                run_id: run_id.clone(),
                call_id: crate::ids::ToolCallId::parse("call_1").unwrap(),
                output: crate::wire::ToolOutput::Ok {
                    content: serde_json::json!("done"),
                },
                events: Vec::new(),
                audit: Vec::new(),
            })
        };
        let (a, b) = (run(1), run(2));
        let joined = coalesce(vec![
            Queued::Events(a.clone(), 1, vec![event("a1")]),
            Queued::Events(b.clone(), 1, vec![event("b1")]),
            settled(&a),
            Queued::Events(b.clone(), 1, vec![event("b2")]),
            Queued::Events(a.clone(), 1, vec![event("a2")]),
            Queued::Events(a.clone(), 1, vec![event("a3")]),
        ]);
        assert_eq!(
            shape(&joined),
            vec![
                (a.clone(), "1: a1".to_owned()),
                (b.clone(), "1: b1 b2".to_owned()),
                (a.clone(), "settled call_1".to_owned()),
                (a, "1: a2 a3".to_owned()),
            ]
        );
    }
}
