//! The SQLite writer's batches, run on the connection's own handle.
//!
//! sqlx runs each SQLite connection on a thread of its own: every statement
//! is a message to that thread and every returned row a message back, each
//! a thread wake-up. A batch of a few hundred transitions is a dozen
//! statements and hundreds of rows, and on a small virtual machine those
//! wake-ups cost as much as SQLite's own work. Here the batcher borrows
//! the handle from sqlx ([`sqlx::SqliteConnection::lock_handle`]) and runs
//! the whole transaction, BEGIN to COMMIT, through rusqlite on one blocking
//! thread: one hand-over per batch. The statements are the very ones
//! `grouped` gives PostgreSQL, bound to the same values.

use std::collections::HashMap;
use std::sync::Arc;

use rusqlite::types::{Value, ValueRef};
use sqlx::pool::PoolConnection;
use sqlx::{Sqlite, SqliteConnection};

use super::StoreError;
use super::batch::Transition;
use super::binds::Bind;
use super::claims::SQLITE_BEGIN_WRITE;
use super::decode::AnyRow;
use super::grouped::{GroupedConn, ItemResult, apply_grouped};

/// How a batch on the handle failed; the transaction was rolled back.
#[derive(Debug)]
pub(super) enum DirectFailure {
    /// A statement failed: which transition caused it is unknown.
    Group(StoreError),
    /// Borrowing the handle, BEGIN or COMMIT failed.
    Transaction(StoreError),
}

/// The SQLite writer's connection: sqlx's, for everything else, and a
/// rusqlite view of the same handle for grouped batches. The view lives as
/// long as the connection so its prepared statements do too: preparing the
/// dozen batch statements again for every batch cost a fifth of the
/// writer's time.
pub(super) struct WriterConn {
    // Declared before `conn` so it drops first: the handle cannot close
    // while statements prepared on it are still alive.
    statements: Option<rusqlite::Connection>,
    /// For each statement text, the placeholder number (`$n`) behind each
    /// parameter index. Asking SQLite for a parameter's name is a linear
    /// search, so naming every parameter of every 512-parameter statement
    /// each batch cost as much as a tenth of SQLite's own work.
    placeholders: HashMap<String, Arc<[usize]>>,
    conn: PoolConnection<Sqlite>,
}

/// Room for every statement shape: ten kinds of statement (the claim's
/// four, the two marks, the renewal, the finish's three) in seven chunk
/// sizes, plus BEGIN, COMMIT and ROLLBACK.
const STATEMENT_CACHE: usize = 80;

impl WriterConn {
    pub(super) fn new(conn: PoolConnection<Sqlite>) -> Self {
        Self {
            statements: None,
            placeholders: HashMap::new(),
            conn,
        }
    }

    /// The connection, for statements run through sqlx.
    pub(super) fn sqlx(&mut self) -> &mut SqliteConnection {
        &mut self.conn
    }

    /// Runs `transitions` with set-based statements in one write
    /// transaction on the handle, on the calling thread. Blocks while
    /// SQLite works (and up to the busy timeout for the write lock): call
    /// it from a blocking thread.
    pub(super) async fn run_grouped(
        &mut self,
        transitions: &[&Transition],
    ) -> Result<Vec<ItemResult>, DirectFailure> {
        let op = "begin transition batch";
        let mut handle = self
            .conn
            .lock_handle()
            .await
            .map_err(StoreError::query(op))
            .map_err(DirectFailure::Transaction)?;
        let db = match &mut self.statements {
            Some(db) => db,
            None => {
                // SAFETY: the handle lives as long as `self.conn`, which
                // outlives `statements` (see the field order). The view is
                // used only while `handle` is locked, so sqlx's worker
                // thread never touches the handle at the same time.
                // `from_handle` leaves the handle open when the view drops.
                let db =
                    unsafe { rusqlite::Connection::from_handle(handle.as_raw_handle().as_ptr()) }
                        .map_err(sqlite_error(op))
                        .map_err(DirectFailure::Transaction)?;
                db.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
                self.statements.insert(db)
            }
        };
        let direct = Direct {
            db,
            placeholders: &mut self.placeholders,
        };
        let outcome = in_transaction(direct, transitions).await;
        drop(handle);
        outcome
    }
}

fn execute_cached(db: &rusqlite::Connection, sql: &str) -> rusqlite::Result<()> {
    db.prepare_cached(sql)?.raw_execute().map(drop)
}

async fn in_transaction(
    mut direct: Direct<'_>,
    transitions: &[&Transition],
) -> Result<Vec<ItemResult>, DirectFailure> {
    let db = direct.db;
    execute_cached(db, SQLITE_BEGIN_WRITE)
        .map_err(sqlite_error("begin transition batch"))
        .map_err(DirectFailure::Transaction)?;
    match apply_grouped(&mut direct, transitions).await {
        Ok(results) => match execute_cached(db, "COMMIT") {
            Ok(()) => Ok(results),
            Err(error) => {
                // A COMMIT refused with SQLITE_BUSY leaves the transaction
                // open; any other failure has ended it already.
                let _ = execute_cached(db, "ROLLBACK");
                Err(DirectFailure::Transaction(sqlite_error("commit")(error)))
            }
        },
        Err(error) => {
            let _ = execute_cached(db, "ROLLBACK");
            Err(DirectFailure::Group(error))
        }
    }
}

fn sqlite_error(op: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
    move |error| StoreError::Sqlite {
        op,
        code: error.sqlite_error().map(|e| e.extended_code),
        message: error.to_string(),
    }
}

fn bind_value(bind: Bind) -> Value {
    match bind {
        Bind::Text(text) => Value::Text(text),
        Bind::Int(int) => Value::Integer(int),
        Bind::Bool(flag) => Value::Integer(flag.into()),
        Bind::OptText(text) => text.map_or(Value::Null, Value::Text),
        Bind::OptInt(int) => int.map_or(Value::Null, Value::Integer),
    }
}

struct Direct<'c> {
    db: &'c rusqlite::Connection,
    placeholders: &'c mut HashMap<String, Arc<[usize]>>,
}

/// The placeholder number (`$n`) of each parameter of `statement`, by
/// parameter index. SQLite gives each distinct `$n` an index in order of
/// first use, so `$n` is not index n when a statement repeats or reorders
/// placeholders: bind by name, as sqlx does.
fn placeholder_numbers(
    statement: &rusqlite::CachedStatement<'_>,
    op: &'static str,
) -> Result<Arc<[usize]>, StoreError> {
    (1..=statement.parameter_count())
        .map(|index| {
            statement
                .parameter_name(index)
                .and_then(|name| name.strip_prefix(['$', '?']))
                .and_then(|digits| digits.parse::<usize>().ok())
                .filter(|number| *number >= 1)
                .ok_or_else(|| StoreError::Sqlite {
                    op,
                    code: None,
                    message: format!("placeholder {index} is not numbered"),
                })
        })
        .collect()
}

impl GroupedConn for Direct<'_> {
    type Row = OwnedRow;
    const CLAIM_ROW_LOCK: &'static str = "";

    async fn fetch(
        &mut self,
        op: &'static str,
        sql: String,
        binds: Vec<Bind>,
    ) -> Result<Vec<OwnedRow>, StoreError> {
        let mut statement = self.db.prepare_cached(&sql).map_err(sqlite_error(op))?;
        let numbers = match self.placeholders.get(&sql) {
            Some(numbers) => Arc::clone(numbers),
            None => {
                let numbers = placeholder_numbers(&statement, op)?;
                self.placeholders.insert(sql, Arc::clone(&numbers));
                numbers
            }
        };
        // Each distinct `$n` is one parameter, so each value binds once.
        let mut values: Vec<Option<Value>> = binds
            .into_iter()
            .map(|bind| Some(bind_value(bind)))
            .collect();
        for (index, &number) in numbers.iter().enumerate() {
            let value = values.get_mut(number - 1).and_then(Option::take);
            let value = value.ok_or_else(|| StoreError::Sqlite {
                op,
                code: None,
                message: format!("placeholder ${number} has no bound value"),
            })?;
            statement
                .raw_bind_parameter(index + 1, value)
                .map_err(sqlite_error(op))?;
        }
        collect_rows(&mut statement, op, Some)
    }
}

/// Runs a bound statement and hands each row, copied out, to `each`; keeps
/// what it returns.
fn collect_rows<T>(
    statement: &mut rusqlite::Statement<'_>,
    op: &'static str,
    mut each: impl FnMut(OwnedRow) -> Option<T>,
) -> Result<Vec<T>, StoreError> {
    let columns: Arc<[String]> = statement
        .column_names()
        .into_iter()
        .map(str::to_string)
        .collect();
    let mut rows = statement.raw_query();
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(sqlite_error(op))? {
        if let Some(value) = each(OwnedRow::of(&columns, row)) {
            out.push(value);
        }
    }
    Ok(out)
}

/// A read of several statements in one deferred transaction on a pooled
/// connection's handle, run on a blocking thread: one hand-over for the
/// whole read instead of a message from sqlx's connection thread for every
/// row. The plan's start-up read of 10,000 branch rules and their details
/// took 300 ms through sqlx on a 2-vCPU guest, most of a 10,000 burst's
/// start-up.
pub(super) async fn read_in_snapshot<T: Send + 'static>(
    pool: &sqlx::SqlitePool,
    op: &'static str,
    read: impl FnOnce(&SnapshotRead<'_>) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    let mut conn = pool.acquire().await.map_err(StoreError::query(op))?;
    let runtime = tokio::runtime::Handle::current();
    let joined = tokio::task::spawn_blocking(move || {
        let mut handle = runtime
            .block_on(conn.lock_handle())
            .map_err(StoreError::query(op))?;
        // SAFETY: the view lives only inside this block, while `handle`
        // keeps sqlx's connection thread off the handle; `from_handle`
        // leaves the handle open when the view drops, and the statements
        // prepared here are finalized before it does.
        let db = unsafe { rusqlite::Connection::from_handle(handle.as_raw_handle().as_ptr()) }
            .map_err(sqlite_error(op))?;
        // A deferred transaction pins one WAL snapshot at its first read:
        // every statement sees the same committed state.
        db.execute_batch("BEGIN").map_err(sqlite_error(op))?;
        // A decoder that panics must not leave the transaction open: the
        // panic goes on once it is rolled back.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            read(&SnapshotRead { db: &db })
        }));
        // Read only: nothing to keep.
        let ended = db.execute_batch("ROLLBACK").map_err(sqlite_error(op));
        let still_open = !db.is_autocommit();
        drop(db);
        drop(handle);
        if still_open {
            // sqlx does not know of this transaction: a connection back in
            // the pool inside it would pin the snapshot and, with a write,
            // hold the write lock for good. Closed instead.
            conn.close_on_drop();
        }
        drop(conn);
        let value = match outcome {
            Ok(value) => value?,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        ended.map(|()| value)
    })
    .await;
    match joined {
        Ok(outcome) => outcome,
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        Err(error) => Err(StoreError::Sqlite {
            op,
            code: None,
            message: format!("the read was cancelled: {error}"),
        }),
    }
}

/// The statements of a [`read_in_snapshot`].
pub(super) struct SnapshotRead<'c> {
    db: &'c rusqlite::Connection,
}

impl SnapshotRead<'_> {
    /// Runs `sql` with `args` bound to its parameters in order, and hands
    /// each row to `each`; keeps what it returns. By position, not by
    /// `$n` as the batches bind: the plan's reads use each of `$1`, `$2`,
    /// … once, in order.
    pub(super) fn rows<T>(
        &self,
        op: &'static str,
        sql: &str,
        args: &[i64],
        mut each: impl FnMut(&OwnedRow) -> Option<T>,
    ) -> Result<Vec<T>, StoreError> {
        let mut statement = self.db.prepare(sql).map_err(sqlite_error(op))?;
        debug_assert_eq!(statement.parameter_count(), args.len(), "{sql}");
        for (index, arg) in args.iter().enumerate() {
            statement
                .raw_bind_parameter(index + 1, *arg)
                .map_err(sqlite_error(op))?;
        }
        collect_rows(&mut statement, op, |row| each(&row))
    }

    /// The one integer `sql` returns.
    pub(super) fn scalar(&self, op: &'static str, sql: &str) -> Result<i64, StoreError> {
        self.db
            .query_row(sql, [], |row| row.get(0))
            .map_err(sqlite_error(op))
    }
}

/// A row copied out of a rusqlite statement, read like sqlx's rows.
pub(super) struct OwnedRow {
    columns: Arc<[String]>,
    values: Vec<Value>,
}

impl OwnedRow {
    /// Text that is not UTF-8 (SQL can store it) is kept as its bytes: it
    /// then fails [`AnyRow::text`] as it does through sqlx, and
    /// [`AnyRow::bytes`] still reads it, where rusqlite's own conversion
    /// would panic.
    fn of(columns: &Arc<[String]>, row: &rusqlite::Row<'_>) -> OwnedRow {
        let values = (0..columns.len())
            .map(|index| match row.get_ref(index) {
                Ok(ValueRef::Text(bytes)) => match std::str::from_utf8(bytes) {
                    Ok(text) => Value::Text(text.to_string()),
                    Err(_) => Value::Blob(bytes.to_vec()),
                },
                Ok(ValueRef::Integer(int)) => Value::Integer(int),
                Ok(ValueRef::Real(real)) => Value::Real(real),
                Ok(ValueRef::Blob(bytes)) => Value::Blob(bytes.to_vec()),
                // The index is below the statement's column count.
                Ok(ValueRef::Null) | Err(_) => Value::Null,
            })
            .collect();
        OwnedRow {
            columns: Arc::clone(columns),
            values,
        }
    }

    fn value(&self, column: &str) -> Result<&Value, sqlx::Error> {
        self.columns
            .iter()
            .position(|name| name == column)
            .map(|index| &self.values[index])
            .ok_or_else(|| sqlx::Error::ColumnNotFound(column.to_string()))
    }

    fn mismatch(column: &str, expected: &str, found: &Value) -> sqlx::Error {
        sqlx::Error::ColumnDecode {
            index: column.to_string(),
            source: format!("expected {expected}, found {:?}", found.data_type()).into(),
        }
    }

    fn integer(&self, column: &str) -> Result<Option<i64>, sqlx::Error> {
        match self.value(column)? {
            Value::Null => Ok(None),
            Value::Integer(int) => Ok(Some(*int)),
            other => Err(Self::mismatch(column, "INTEGER", other)),
        }
    }
}

impl AnyRow for OwnedRow {
    fn text(&self, column: &str) -> Result<Option<String>, sqlx::Error> {
        match self.value(column)? {
            Value::Null => Ok(None),
            Value::Text(text) => Ok(Some(text.clone())),
            // Text that is not UTF-8 (see `OwnedRow::of`), or a blob.
            Value::Blob(_) => Err(sqlx::Error::ColumnDecode {
                index: column.to_string(),
                source: "expected TEXT in UTF-8, found other bytes".into(),
            }),
            other => Err(Self::mismatch(column, "TEXT", other)),
        }
    }

    fn int64(&self, column: &str) -> Result<Option<i64>, sqlx::Error> {
        self.integer(column)
    }

    fn int32(&self, column: &str) -> Result<Option<i32>, sqlx::Error> {
        self.integer(column)?
            .map(|int| {
                i32::try_from(int).map_err(|e| sqlx::Error::ColumnDecode {
                    index: column.to_string(),
                    source: Box::new(e),
                })
            })
            .transpose()
    }

    fn boolean(&self, column: &str) -> Result<Option<bool>, sqlx::Error> {
        Ok(self.integer(column)?.map(|int| int != 0))
    }

    fn bytes(&self, column: &str) -> Result<Option<Vec<u8>>, sqlx::Error> {
        match self.value(column)? {
            Value::Null => Ok(None),
            Value::Text(text) => Ok(Some(text.clone().into_bytes())),
            Value::Blob(bytes) => Ok(Some(bytes.clone())),
            other => Err(Self::mismatch(column, "TEXT", other)),
        }
    }
}
