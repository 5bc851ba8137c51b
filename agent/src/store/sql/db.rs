//! The two databases behind one small interface, so that the store's SQL is written once.
//!
//! PostgreSQL goes through sqlx's pool. SQLite goes through rusqlite, called inline on the task that runs the
//! query, with the connection behind an async mutex: sqlx runs every SQLite connection on a thread of its own and
//! hands each statement to it and its result back, two thread wake-ups per statement, which measured at about ten
//! times the CPU of the statements themselves (a commit in WAL mode with `synchronous = NORMAL` writes to the page
//! cache and does not wait for the disk, so running it inline blocks a worker for microseconds). Both crates link
//! the same bundled SQLite.
//!
//! The SQL uses `$n` parameters, which both databases accept; a statement may name them in any order. Values are
//! the few types the schema has: 64-bit integers and text, each maybe null.

use std::borrow::Cow;
use std::sync::Arc;

use sqlx::Row as _;
use sqlx::postgres::{PgPool, PgRow, Postgres};
use tokio::sync::{Mutex, OwnedMutexGuard};

/// Something a database call could not do.
#[derive(Debug, thiserror::Error)]
pub(super) enum DbError {
    #[error(transparent)]
    Postgres(#[from] sqlx::Error),
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    #[error("{0}")]
    Decode(String),
}

pub(super) type Db<T> = Result<T, DbError>;

/// A parameter's value.
#[derive(Clone, Debug)]
pub(super) enum Value {
    Int(Option<i64>),
    Text(Option<String>),
}

impl From<i64> for Value {
    fn from(value: i64) -> Self {
        Self::Int(Some(value))
    }
}

impl From<Option<i64>> for Value {
    fn from(value: Option<i64>) -> Self {
        Self::Int(value)
    }
}

impl From<&str> for Value {
    fn from(value: &str) -> Self {
        Self::Text(Some(value.to_owned()))
    }
}

impl From<&String> for Value {
    fn from(value: &String) -> Self {
        Self::Text(Some(value.clone()))
    }
}

impl From<String> for Value {
    fn from(value: String) -> Self {
        Self::Text(Some(value))
    }
}

impl From<Option<String>> for Value {
    fn from(value: Option<String>) -> Self {
        Self::Text(value)
    }
}

impl From<Option<&str>> for Value {
    fn from(value: Option<&str>) -> Self {
        Self::Text(value.map(str::to_owned))
    }
}

/// A statement and its parameters, `$1` first.
pub(super) struct Query<'q> {
    sql: Cow<'q, str>,
    params: Vec<Value>,
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
}

impl Done {
    pub(super) fn rows_affected(&self) -> u64 {
        self.rows
    }
}

/// A pool of connections to one database: for SQLite, one connection.
#[derive(Clone)]
pub(super) enum Pool {
    Sqlite(Arc<Mutex<rusqlite::Connection>>),
    Postgres(PgPool),
}

/// What runs once a transaction committed, or once it rolled back.
type Hook = Box<dyn FnOnce() + Send>;

/// A transaction: it commits on [`Tx::commit`] and rolls back when dropped before.
pub(super) struct Tx {
    connection: TxConnection,
    committed: bool,
    after_commit: Vec<Hook>,
    after_rollback: Vec<Hook>,
}

enum TxConnection {
    /// The connection, in a transaction until committed.
    Sqlite(OwnedMutexGuard<rusqlite::Connection>),
    /// `None` only once committed.
    Postgres(Option<sqlx::Transaction<'static, Postgres>>),
}

/// The connection of a PostgreSQL transaction.
fn in_tx<'t>(
    tx: &'t mut Option<sqlx::Transaction<'static, Postgres>>,
) -> Db<&'t mut sqlx::PgConnection> {
    match tx {
        Some(tx) => Ok(&mut **tx),
        None => Err(DbError::Decode(
            "a statement after the transaction committed".to_owned(),
        )),
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
    pub(super) fn sqlite(connection: rusqlite::Connection) -> Self {
        Self::Sqlite(Arc::new(Mutex::new(connection)))
    }

    /// Begins a transaction. SQLite's takes the write lock at once (`IMMEDIATE`): a transaction that reads and then
    /// writes never finds the database changed under it.
    pub(super) async fn begin(&self) -> Db<Tx> {
        match self {
            Self::Sqlite(connection) => {
                let connection = Arc::clone(connection).lock_owned().await;
                // A transaction whose rollback failed (logged when it was dropped) would otherwise refuse every
                // later one: end it first.
                if !connection.is_autocommit() {
                    connection.execute_batch("ROLLBACK")?;
                }
                connection.execute_batch("BEGIN IMMEDIATE")?;
                Ok(Tx::new(TxConnection::Sqlite(connection)))
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

    pub(super) async fn commit(mut self) -> Db<()> {
        match &mut self.connection {
            TxConnection::Sqlite(connection) => connection.execute_batch("COMMIT")?,
            TxConnection::Postgres(tx) => {
                if let Some(tx) = tx.take() {
                    tx.commit().await?;
                }
            }
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
        // sqlx rolls a PostgreSQL transaction back when it is dropped.
        if let TxConnection::Sqlite(connection) = &self.connection
            && let Err(error) = connection.execute_batch("ROLLBACK")
        {
            tracing::error!(%error, "cannot roll a SQLite transaction back");
        }
        for hook in std::mem::take(&mut self.after_rollback) {
            hook();
        }
    }
}

impl<'q> Query<'q> {
    pub(super) fn bind(mut self, value: impl Into<Value>) -> Self {
        self.params.push(value.into());
        self
    }

    pub(super) async fn execute<'e>(self, on: impl Into<On<'e>>) -> Db<Done> {
        match on.into() {
            On::Tx(Tx {
                connection: TxConnection::Sqlite(connection),
                ..
            }) => self.sqlite_execute(connection),
            On::Pool(Pool::Sqlite(connection)) => {
                self.sqlite_execute(&mut *connection.lock().await)
            }
            On::Tx(Tx {
                connection: TxConnection::Postgres(tx),
                ..
            }) => Ok(Done {
                rows: self.postgres().execute(in_tx(tx)?).await?.rows_affected(),
            }),
            On::Pool(Pool::Postgres(pool)) => Ok(Done {
                rows: self.postgres().execute(pool).await?.rows_affected(),
            }),
        }
    }

    pub(super) async fn fetch_all<'e>(self, on: impl Into<On<'e>>) -> Db<Vec<Row>> {
        match on.into() {
            On::Tx(Tx {
                connection: TxConnection::Sqlite(connection),
                ..
            }) => self.sqlite_rows(connection, usize::MAX),
            On::Pool(Pool::Sqlite(connection)) => {
                self.sqlite_rows(&mut *connection.lock().await, usize::MAX)
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
        }
    }

    pub(super) async fn fetch_optional<'e>(self, on: impl Into<On<'e>>) -> Db<Option<Row>> {
        match on.into() {
            On::Tx(Tx {
                connection: TxConnection::Sqlite(connection),
                ..
            }) => Ok(self.sqlite_rows(connection, 1)?.into_iter().next()),
            On::Pool(Pool::Sqlite(connection)) => Ok(self
                .sqlite_rows(&mut *connection.lock().await, 1)?
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

    /// Prepares (from the connection's cache) and binds: each `$n` of the text gets the n-th value.
    fn sqlite_statement<'c>(
        &self,
        connection: &'c rusqlite::Connection,
    ) -> Db<rusqlite::CachedStatement<'c>> {
        let mut statement = connection.prepare_cached(&self.sql)?;
        for index in 1..=statement.parameter_count() {
            let value = statement
                .parameter_name(index)
                .and_then(|name| name.strip_prefix('$'))
                .and_then(|n| n.parse::<usize>().ok())
                .and_then(|n| self.params.get(n.checked_sub(1)?))
                .ok_or_else(|| {
                    DbError::Decode(format!(
                        "parameter {index} of {:?} has no value (the SQL takes $1, $2, ...)",
                        self.sql
                    ))
                })?;
            match value {
                Value::Int(value) => statement.raw_bind_parameter(index, value)?,
                Value::Text(value) => statement.raw_bind_parameter(index, value)?,
            }
        }
        Ok(statement)
    }

    fn sqlite_execute(&self, connection: &mut rusqlite::Connection) -> Db<Done> {
        let mut statement = self.sqlite_statement(connection)?;
        let rows = statement.raw_execute()?;
        Ok(Done { rows: rows as u64 })
    }

    fn sqlite_rows(&self, connection: &mut rusqlite::Connection, limit: usize) -> Db<Vec<Row>> {
        let mut statement = self.sqlite_statement(connection)?;
        let names: Arc<[String]> = statement
            .column_names()
            .into_iter()
            .map(str::to_owned)
            .collect();
        let width = names.len();
        let mut rows = statement.raw_query();
        let mut out = Vec::new();
        while out.len() < limit
            && let Some(row) = rows.next()?
        {
            let values = (0..width)
                .map(|i| row.get::<_, rusqlite::types::Value>(i))
                .collect::<Result<Vec<_>, _>>()?;
            out.push(Row::Sqlite {
                names: Arc::clone(&names),
                values,
            });
        }
        Ok(out)
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
