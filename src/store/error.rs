use std::fmt;
use std::path::PathBuf;

use sqlx::error::ErrorKind;
use sqlx::migrate::MigrateError;
use sqlx::sqlite::SqliteError;

/// Extended result code 1811 (`SQLITE_CONSTRAINT | 7 << 8`).
const SQLITE_CONSTRAINT_TRIGGER: &str = "1811";

/// Which database a [`Store`](super::Store) talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Errors of the storage layer.
///
/// The sqlx cause is part of the message rather than `source()`: these errors
/// are mostly logged with `{}`, and an operator needs the database's own words
/// (constraint name, "connection refused") on that one line.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "unsupported database URL scheme {scheme:?}: expected sqlite:, postgres: or postgresql:"
    )]
    InvalidUrl { scheme: String },

    #[error("cannot create directory {} for the SQLite database: {error}", path.display())]
    CreateDir {
        path: PathBuf,
        error: std::io::Error,
    },

    /// `target` is the URL with any password masked.
    #[error("cannot connect to {backend} database {target}: {error}")]
    Connect {
        backend: Backend,
        target: String,
        error: sqlx::Error,
    },

    #[error("{backend} migrations failed: {error}")]
    Migrate {
        backend: Backend,
        error: MigrateError,
    },

    /// `op` names the statement, e.g. `insert branch_rule`.
    #[error("{op} failed: {error}")]
    Query {
        op: &'static str,
        error: sqlx::Error,
    },

    /// A statement on the SQLite writer's own handle (`direct`) failed.
    /// `code` is SQLite's extended result code.
    #[error("{op} failed: {message}")]
    Sqlite {
        op: &'static str,
        code: Option<i32>,
        message: String,
    },

    /// A finish landed, but the branch rule's row it released does not
    /// decode (see [`crate::store::Released::Unreadable`]).
    #[error("the finish landed, but {0}")]
    ReleasedUnreadable(String),

    /// A stored value that does not fit the model: the row is named so an
    /// operator can fix it by hand.
    #[error("cannot decode {table}.{column} of row {id}: {message}")]
    Decode {
        table: &'static str,
        id: String,
        column: &'static str,
        message: String,
    },
}

impl StoreError {
    pub(crate) fn query(op: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
        move |error| StoreError::Query { op, error }
    }

    /// The sqlx error behind a connect or query failure.
    pub fn sqlx_error(&self) -> Option<&sqlx::Error> {
        match self {
            StoreError::Connect { error, .. } | StoreError::Query { error, .. } => Some(error),
            _ => None,
        }
    }

    /// PostgreSQL chose this transaction as a deadlock or serialization
    /// victim and rolled all of it back: running it again is safe.
    pub fn is_rollback_victim(&self) -> bool {
        matches!(
            self.sqlx_error(),
            Some(sqlx::Error::Database(db)) if matches!(db.code().as_deref(), Some("40P01" | "40001"))
        )
    }

    /// The kind of constraint the database refused, if that is what happened.
    pub fn db_error_kind(&self) -> Option<ErrorKind> {
        match self.sqlx_error()? {
            sqlx::Error::Database(db) => {
                // SQLite enforces ON DELETE RESTRICT like a trigger and reports
                // SQLITE_CONSTRAINT_TRIGGER, which sqlx maps to `Other`; it is
                // the same refusal PostgreSQL reports as a foreign key violation.
                let restrict = db.try_downcast_ref::<SqliteError>().is_some()
                    && db.code().as_deref() == Some(SQLITE_CONSTRAINT_TRIGGER)
                    && db.message() == "FOREIGN KEY constraint failed";
                Some(if restrict {
                    ErrorKind::ForeignKeyViolation
                } else {
                    db.kind()
                })
            }
            _ => None,
        }
    }

    /// A UNIQUE or PRIMARY KEY constraint refused the write (e.g. a second
    /// execution row for the same occurrence and attempt).
    pub fn is_unique_violation(&self) -> bool {
        self.db_error_kind() == Some(ErrorKind::UniqueViolation)
    }

    /// A foreign key refused the write: a missing parent on insert, or a
    /// delete of a row still referenced under `ON DELETE RESTRICT` (an action
    /// template in use). The API reports these as conflicts.
    pub fn is_foreign_key_violation(&self) -> bool {
        self.db_error_kind() == Some(ErrorKind::ForeignKeyViolation)
    }

    /// The operation may succeed if retried later unchanged: the database was
    /// unreachable, busy, or aborted the transaction for concurrency reasons.
    /// Callers keep pending writes (the outbox) on these and drop them on
    /// anything else.
    pub fn is_transient(&self) -> bool {
        if let StoreError::Sqlite { code, .. } = self {
            return code.is_some_and(sqlite_busy_or_locked);
        }
        let Some(error) = self.sqlx_error() else {
            return false;
        };
        match error {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => true,
            sqlx::Error::Database(db) => {
                let Some(code) = db.code() else {
                    return false;
                };
                if db.try_downcast_ref::<SqliteError>().is_some() {
                    code.parse::<i32>().is_ok_and(sqlite_busy_or_locked)
                } else {
                    // SQLSTATE: connection exceptions (08), serialization
                    // failure, deadlock, server shutting down or full.
                    code.starts_with("08")
                        || matches!(
                            &*code,
                            "40001" | "40P01" | "57P01" | "57P02" | "57P03" | "53300"
                        )
                }
            }
            _ => false,
        }
    }
}

impl StoreError {
    /// The database refused the values written: a constraint, a value out
    /// of range, text it cannot take. The same write is refused every time,
    /// where a timeout or an I/O error may pass at the next try.
    pub fn is_refused_data(&self) -> bool {
        if let StoreError::Sqlite { code, .. } = self {
            return code.is_some_and(sqlite_refused_data);
        }
        let Some(sqlx::Error::Database(db)) = self.sqlx_error() else {
            return false;
        };
        let Some(code) = db.code() else {
            return false;
        };
        if db.try_downcast_ref::<SqliteError>().is_some() {
            code.parse::<i32>().is_ok_and(sqlite_refused_data)
        } else {
            // SQLSTATE classes 22 (data exception) and 23 (integrity
            // constraint violation).
            code.starts_with("22") || code.starts_with("23")
        }
    }
}

/// SQLITE_TOOBIG (18), SQLITE_CONSTRAINT (19) and SQLITE_MISMATCH (20), in
/// all their extended variants.
fn sqlite_refused_data(code: i32) -> bool {
    matches!(code & 0xff, 18..=20)
}

/// Extended result codes: the low byte is the primary code, SQLITE_BUSY (5)
/// or SQLITE_LOCKED (6) in all their variants.
fn sqlite_busy_or_locked(code: i32) -> bool {
    matches!(code & 0xff, 5 | 6)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query_error(error: sqlx::Error) -> StoreError {
        StoreError::query("test")(error)
    }

    #[test]
    fn outages_are_transient_and_logic_errors_are_not() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(query_error(sqlx::Error::Io(refused)).is_transient());
        assert!(query_error(sqlx::Error::PoolTimedOut).is_transient());
        assert!(!query_error(sqlx::Error::RowNotFound).is_transient());
        assert!(!StoreError::InvalidUrl { scheme: "x".into() }.is_transient());
    }
}
