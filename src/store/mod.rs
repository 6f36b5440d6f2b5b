//! The storage layer: one API over SQLite and PostgreSQL.
//!
//! Both backends share one schema (DESIGN.md §2, `migrations/{sqlite,postgres}`)
//! and one text of every statement: SQL uses `$1`-style parameters, which
//! SQLite accepts too, and only types both drivers encode alike (TEXT ids,
//! BIGINT times, TEXT JSON, booleans). A [`Store`] holds a typed pool per
//! backend rather than sqlx's `Any` driver, which cannot decode everything
//! PostgreSQL returns; the macros below run the same statement on whichever
//! pool it holds.
//!
//! Statements are named constants next to the functions that use them,
//! grouped by table: `catalog` (brands, branches, rules, brand rules,
//! action templates), `workflows` (branch rules, action details) and
//! `plan_data` (the refresher's consistent read of all of them).

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, Executor};

/// Runs one statement on an executor (a pool or `&mut *tx`) and returns the
/// number of rows affected.
macro_rules! execute_on {
    ($conn:expr, $op:expr, $sql:expr $(, $arg:expr)* $(,)?) => {
        sqlx::query($sql)
            $(.bind($arg))*
            .execute($conn)
            .await
            .map(|done| done.rows_affected())
            .map_err($crate::store::StoreError::query($op))
    };
}

/// Runs one statement on whichever pool `$store` holds.
macro_rules! execute {
    ($store:expr, $op:expr, $sql:expr $(, $arg:expr)* $(,)?) => {
        match $store {
            $crate::store::Store::Sqlite(pool) => execute_on!(pool, $op, $sql $(, $arg)*),
            $crate::store::Store::Postgres(pool) => execute_on!(pool, $op, $sql $(, $arg)*),
        }
    };
}

/// The rows a fetch returned, each decoded with `$decode`, a function
/// generic over [`decode::AnyRow`]; a failed fetch is the `$op` query's
/// error.
macro_rules! decoded_rows {
    ($fetched:expr, $op:expr, $decode:expr) => {
        match $fetched {
            Ok(rows) => rows
                .iter()
                .map($decode)
                .collect::<Result<Vec<_>, $crate::store::StoreError>>(),
            Err(error) => Err($crate::store::StoreError::Query { op: $op, error }),
        }
    };
}

/// Fetches all rows of one statement on an executor and decodes them.
macro_rules! fetch_all_on {
    ($conn:expr, $op:expr, $decode:expr, $sql:expr $(, $arg:expr)* $(,)?) => {
        decoded_rows!(sqlx::query($sql)$(.bind($arg))*.fetch_all($conn).await, $op, $decode)
    };
}

/// [`fetch_all_on!`] for a statement assembled at run time with its
/// [`binds::Bind`]s.
macro_rules! fetch_bound_on {
    ($conn:expr, $op:expr, $decode:expr, $sql:expr, $binds:expr) => {
        decoded_rows!(
            $crate::store::binds::bound_query!($sql, $binds)
                .fetch_all($conn)
                .await,
            $op,
            $decode
        )
    };
}

/// [`fetch_bound_on!`] on whichever pool `$store` holds.
macro_rules! fetch_bound {
    ($store:expr, $op:expr, $decode:expr, $sql:expr, $binds:expr) => {
        match $store {
            $crate::store::Store::Sqlite(pool) => fetch_bound_on!(pool, $op, $decode, $sql, $binds),
            $crate::store::Store::Postgres(pool) => {
                fetch_bound_on!(pool, $op, $decode, $sql, $binds)
            }
        }
    };
}

mod batch;
/// Fetches and decodes all rows of one statement on whichever pool `$store`
/// holds.
macro_rules! fetch_all {
    ($store:expr, $op:expr, $decode:expr, $sql:expr $(, $arg:expr)* $(,)?) => {
        match $store {
            $crate::store::Store::Sqlite(pool) => fetch_all_on!(pool, $op, $decode, $sql $(, $arg)*),
            $crate::store::Store::Postgres(pool) => fetch_all_on!(pool, $op, $decode, $sql $(, $arg)*),
        }
    };
}

mod binds;
mod catalog;
mod claims;
mod decode;
mod direct;
mod error;
mod executions;
mod grouped;
mod instances;
mod leases;
mod plan_data;
mod retention;
pub mod rows;
mod workflows;

pub use batch::{
    BatchError, DEFAULT_MAX_BATCH, PendingTransition, Released, Transition, TransitionBatcher,
    TransitionOutcome,
};
pub use catalog::{CatalogScope, HistoryDelete};
pub use error::{Backend, StoreError};
pub use executions::{
    ERROR_CAP_BYTES, ExecutionFilter, OUTPUT_CAP_BYTES, WITHDRAWALS_PER_TRANSACTION, WORKER_LOST,
};
pub use instances::InstanceRow;
pub use leases::{CancelRequest, LeaseView};
pub use retention::PruneSummary;

pub use crate::lifecycle::{
    Claim, ClaimRequest, Fence, Finish, RetryUpdate, SkipRequest, SkippedOccurrence,
    new_execution_id,
};

/// SQLite's default busy handler gives up at once; writers from several
/// tasks (refresher, workers, API) must wait for each other instead.
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// WAL allows many readers beside one writer; more connections than this only
/// queue on the write lock.
const SQLITE_MAX_CONNECTIONS: u32 = 8;
const POSTGRES_MAX_CONNECTIONS: u32 = 16;
/// Long enough to ride out a short burst, short enough that a dead database
/// surfaces as an error the caller can log and retry.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);
/// See [`Store::connect_with`]; for tools and tests that do not say.
const DEFAULT_IDLE_IN_TRANSACTION: Duration = Duration::from_secs(10);

static SQLITE_MIGRATOR: Migrator = sqlx::migrate!("./migrations/sqlite");
static POSTGRES_MIGRATOR: Migrator = sqlx::migrate!("./migrations/postgres");

/// A connection pool on one of the two backends. Cheap to clone (the pools
/// are reference-counted); every clone shares the same connections.
#[derive(Debug, Clone)]
pub enum Store {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

impl Store {
    /// Connects to `url` and opens one connection to check it.
    ///
    /// - `sqlite://path/to/file.db` (relative) or `sqlite:///abs/file.db`:
    ///   the parent directory and the file are created if missing; WAL
    ///   journal, `synchronous=NORMAL`, 5 s busy timeout, foreign keys on.
    /// - `sqlite::memory:`: a private in-memory database that lives as long
    ///   as this store (one connection, never recycled).
    /// - `postgres://…` or `postgresql://…`.
    ///
    /// Any other scheme is [`StoreError::InvalidUrl`].
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        Store::connect_with(url, DEFAULT_IDLE_IN_TRANSACTION).await
    }

    /// [`Store::connect`], with PostgreSQL ending any session of this pool
    /// that sits idle inside a transaction for longer than
    /// `idle_in_transaction`. ruled never waits on anything but the database
    /// inside a transaction, so such a session belongs to a frozen process
    /// (SIGSTOP, a stalled VM), whose row locks would otherwise stall every
    /// other instance's takeover of it. The service passes a third of the
    /// lease TTL, so the locks are free before its peers act.
    pub async fn connect_with(
        url: &str,
        idle_in_transaction: Duration,
    ) -> Result<Store, StoreError> {
        let scheme = url.split_once(':').map_or("", |(scheme, _)| scheme);
        match scheme {
            "sqlite" => connect_sqlite(url).await,
            "postgres" | "postgresql" => connect_postgres(url, idle_in_transaction).await,
            _ => Err(StoreError::InvalidUrl {
                scheme: scheme.to_string(),
            }),
        }
    }

    /// [`Store::connect`] for a command that only reads: an SQLite file
    /// that is not there is an error, not a new empty database.
    pub async fn connect_existing(url: &str) -> Result<Store, StoreError> {
        if url.starts_with("sqlite:") && !is_sqlite_memory(url) {
            let connect_error = |error| StoreError::Connect {
                backend: Backend::Sqlite,
                target: url.to_string(),
                error,
            };
            let options = SqliteConnectOptions::from_str(url).map_err(connect_error)?;
            let file = options.get_filename();
            if !file.exists() {
                return Err(connect_error(sqlx::Error::Io(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("no database file at {}", file.display()),
                ))));
            }
        }
        Store::connect(url).await
    }

    pub fn backend(&self) -> Backend {
        match self {
            Store::Sqlite(_) => Backend::Sqlite,
            Store::Postgres(_) => Backend::Postgres,
        }
    }

    /// Applies the pending embedded migrations. Safe to call on every start
    /// and from several instances at once (PostgreSQL takes an advisory lock).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let result = match self {
            Store::Sqlite(pool) => SQLITE_MIGRATOR.run(pool).await,
            Store::Postgres(pool) => POSTGRES_MIGRATOR.run(pool).await,
        };
        result.map_err(|error| StoreError::Migrate {
            backend: self.backend(),
            error,
        })
    }

    /// One round trip to the database, for readiness checks.
    pub async fn ping(&self) -> Result<(), StoreError> {
        execute!(self, "ping", "SELECT 1").map(drop)
    }

    /// Waits for checked-out connections to return, then closes them all.
    /// Later calls on this store (or its clones) fail with `PoolClosed`.
    pub async fn close(&self) {
        match self {
            Store::Sqlite(pool) => pool.close().await,
            Store::Postgres(pool) => pool.close().await,
        }
    }

    /// Runs operator- or test-supplied SQL verbatim, possibly several
    /// statements separated by `;`, and returns the rows affected.
    ///
    /// **Trusted input only**: the text is not parameterised or checked in
    /// any way, so it must never contain data from an API request.
    pub async fn execute_sql(&self, sql: &str) -> Result<u64, StoreError> {
        let raw = sqlx::raw_sql(AssertSqlSafe(sql.to_string()));
        let result = match self {
            Store::Sqlite(pool) => pool.execute(raw).await.map(|r| r.rows_affected()),
            Store::Postgres(pool) => pool.execute(raw).await.map(|r| r.rows_affected()),
        };
        result.map_err(StoreError::query("execute_sql"))
    }
}

fn is_sqlite_memory(url: &str) -> bool {
    let rest = url.trim_start_matches("sqlite:").trim_start_matches("//");
    let (database, params) = rest.split_once('?').unwrap_or((rest, ""));
    database == ":memory:" || params.split('&').any(|param| param == "mode=memory")
}

async fn connect_sqlite(url: &str) -> Result<Store, StoreError> {
    let connect_error = |error| StoreError::Connect {
        backend: Backend::Sqlite,
        target: url.to_string(),
        error,
    };
    let memory = is_sqlite_memory(url);
    let mut options = SqliteConnectOptions::from_str(url)
        .map_err(connect_error)?
        .foreign_keys(true)
        .busy_timeout(SQLITE_BUSY_TIMEOUT)
        .synchronous(SqliteSynchronous::Normal);

    let pool_options = if memory {
        // The database vanishes with its last connection, and a shared-cache
        // in-memory database answers concurrent writers with SQLITE_LOCKED,
        // which the busy timeout does not cover: keep exactly one connection
        // open for the pool's whole life.
        SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
    } else {
        if let Some(dir) = options.get_filename().parent() {
            create_dir(dir)?;
        }
        private_files(options.get_filename()).map_err(|e| connect_error(sqlx::Error::Io(e)))?;
        options = options
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal);
        SqlitePoolOptions::new().max_connections(SQLITE_MAX_CONNECTIONS)
    };

    let pool = pool_options
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(options)
        .await
        .map_err(connect_error)?;
    Ok(Store::Sqlite(pool))
}

/// The database holds action secrets (headers, bodies, URL credentials),
/// so its file is created owner-only (0600) before SQLite opens it; SQLite
/// gives its -wal and -shm files the database file's mode. Files a looser
/// umask made earlier are tightened, with a WARN.
fn private_files(database: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(database)
    {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    for suffix in ["", "-wal", "-shm"] {
        let mut name = database.as_os_str().to_owned();
        name.push(suffix);
        let path = Path::new(&name);
        let Ok(meta) = std::fs::metadata(path) else {
            continue;
        };
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
            tracing::warn!(
                path = %path.display(),
                "🔒 SQLite file was readable by others (mode {mode:o}); set to 0600"
            );
        }
    }
    Ok(())
}

fn create_dir(dir: &Path) -> Result<(), StoreError> {
    if dir.as_os_str().is_empty() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(|error| StoreError::CreateDir {
        path: dir.to_path_buf(),
        error,
    })
}

async fn connect_postgres(url: &str, idle_in_transaction: Duration) -> Result<Store, StoreError> {
    let connect_error = |error| StoreError::Connect {
        backend: Backend::Postgres,
        target: redact_password(url),
        error,
    };
    let mut options = PgConnectOptions::from_str(url)
        .map_err(connect_error)?
        .options([(
            "idle_in_transaction_session_timeout",
            idle_in_transaction.as_millis().max(1),
        )]);
    // An operator's `?application_name=` (one per instance, say) wins.
    if options.get_application_name().is_none() {
        options = options.application_name("ruled");
    }
    let pool = PgPoolOptions::new()
        .max_connections(POSTGRES_MAX_CONNECTIONS)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(options)
        .await
        .map_err(connect_error)?;
    Ok(Store::Postgres(pool))
}

/// `postgres://user:secret@host/db` → `postgres://user:***@host/db` (and a
/// `?password=` likewise), so a connect error can name its target in logs
/// without leaking the password.
fn redact_password(url: &str) -> String {
    crate::actions::secrets::mask_database_url(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_masked() {
        assert_eq!(
            redact_password("postgres://u:p%40ss@db:5432/x?sslmode=require"),
            "postgres://u:***@db:5432/x?sslmode=require"
        );
        assert_eq!(redact_password("postgres://u@db/x"), "postgres://u@db/x");
        assert_eq!(redact_password("postgres://db/x"), "postgres://db/x");
        assert_eq!(
            redact_password("postgres://u@db/x?password=s3cret&sslmode=disable"),
            "postgres://u@db/x?password=***&sslmode=disable"
        );
    }

    #[tokio::test]
    async fn sqlite_files_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ruled.db");
        let store = Store::connect(&format!("sqlite://{}", path.display()))
            .await
            .unwrap();
        store.migrate().await.unwrap();
        for suffix in ["", "-wal", "-shm"] {
            let file = dir.path().join(format!("ruled.db{suffix}"));
            let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", file.display());
        }
        store.close().await;

        // An existing world-readable file is tightened.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let store = Store::connect(&format!("sqlite://{}", path.display()))
            .await
            .unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        store.close().await;
    }

    /// The statements every instance runs each second or for every job
    /// must not read the execution history, which grows for
    /// EXECUTION_RETENTION_DAYS (1.4M rows a day at 1,000 rules a minute):
    /// on SQLite, with no statistics, the plan is fixed by the statement
    /// and its indexes, so a migrated empty database shows the plan a
    /// 10M-row one gets. A scan is allowed only over the partial index of
    /// open executions.
    #[tokio::test]
    async fn timer_and_per_job_statements_never_scan_the_history() {
        let store = Store::connect("sqlite::memory:").await.unwrap();
        store.migrate().await.unwrap();
        let Store::Sqlite(pool) = &store else {
            unreachable!()
        };
        // One row of the batch's `WITH v(…)`, as the SQLite writer binds it.
        let values = |columns: usize| format!("VALUES {}", grouped::values(1, columns));
        let statements = [
            ("cancel requests", leases::CANCEL_REQUESTS.to_string()),
            ("stale owners", instances::STALE_OWNERS.sqlite.to_string()),
            (
                "open executions",
                executions::SELECT_OPEN_EXECUTIONS.to_string(),
            ),
            (
                "fail owner executions",
                executions::FAIL_OWNER_EXECUTIONS.to_string(),
            ),
            (
                "open execution of a rule",
                executions::OPEN_EXECUTION_OF.to_string(),
            ),
            ("prune batch", retention::sqlite_prune_sql()),
            ("claim insert", grouped::insert_sql(&values(6))),
            (
                "scheduled and running",
                grouped::mark_sql(&grouped::SCHEDULED_AND_RUNNING, &values(6)),
            ),
            ("finish", grouped::finish_sql(&values(8))),
            ("skipped", grouped::skipped_sql(&values(7))),
        ];
        for (name, sql) in statements {
            let plan: Vec<(i64, i64, i64, String)> =
                sqlx::query_as(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")))
                    .fetch_all(pool)
                    .await
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
            for (_, _, _, detail) in &plan {
                let scans_executions =
                    detail.starts_with("SCAN executions") || detail.starts_with("SCAN e ");
                assert!(
                    !scans_executions || detail.contains("executions_open_idx"),
                    "{name} scans the execution history: {detail}\n{sql}"
                );
            }
        }
        store.close().await;
    }

    /// The writes fenced by a claim find their branch rule by its id on
    /// PostgreSQL whatever the statistics say. Analyzed while no lock is
    /// held (any quiet moment), they say `lock_holder` is always NULL, and
    /// a generic plan then took the lock holder's index for `lock_holder =
    /// $holder`: each row stepped over every lock the instance held, 60 ms
    /// for a release of 100 rules in a burst of 10,000 instead of 4.
    #[tokio::test]
    async fn fenced_writes_find_the_branch_rule_by_id_on_postgres() {
        let admin_url = std::env::var("RULED_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        let name = format!("ruled_unit_{}", uuid::Uuid::new_v4().simple());
        let admin = sqlx::PgPool::connect(&admin_url).await;
        let created = match &admin {
            Ok(admin) => admin
                .execute(AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
                .await
                .map(drop),
            Err(error) => Err(sqlx::Error::Protocol(error.to_string())),
        };
        if let Err(error) = created {
            assert_ne!(
                std::env::var("CI").as_deref(),
                Ok("true"),
                "cannot create a database on {admin_url}: {error} (CI=true, so this is a failure)"
            );
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr(),
                "\n!!! SKIPPING fenced_writes_find_the_branch_rule_by_id_on_postgres: \
                 cannot reach {admin_url}: {error}\n"
            );
            return;
        }
        let admin = admin.unwrap();
        let (base, query) = admin_url.split_once('?').unwrap_or((&admin_url, ""));
        let server = base.rsplit_once('/').map_or(base, |(server, _)| server);
        let url = match query {
            "" => format!("{server}/{name}"),
            query => format!("{server}/{name}?{query}"),
        };
        let store = Store::connect(&url).await.unwrap();
        store.migrate().await.unwrap();
        store
            .execute_sql(
                "INSERT INTO brands (id, name) VALUES ('b', 'b'); \
                 INSERT INTO branches (id, brand_id, name, timezone) VALUES ('br', 'b', 'b', 'UTC'); \
                 INSERT INTO rules (id, brand_id, name, cron_expression) \
                 VALUES ('r', 'b', 'r', '0 0 1 1 *'); \
                 INSERT INTO branch_rules (id, branch_id, rule_id, is_active, next_run_time, \
                 created_at, updated_at) \
                 SELECT gen_random_uuid()::text, 'br', 'r', TRUE, 1000, 1, 1 \
                 FROM generate_series(1, 4000); \
                 ANALYZE; \
                 UPDATE branch_rules SET lock_holder = 'h', lock_time = 2, lock_epoch = 1, \
                 is_currently_running = TRUE WHERE id IN \
                 (SELECT id FROM branch_rules ORDER BY id LIMIT 2000)",
            )
            .await
            .unwrap();

        let unnest = |types: &[&str]| {
            let arrays: Vec<String> = types
                .iter()
                .enumerate()
                .map(|(n, t)| format!("${}::{t}[]", n + 1))
                .collect();
            format!("SELECT * FROM UNNEST({})", arrays.join(", "))
        };
        let statements = [
            (
                "release",
                grouped::release_sql(&unnest(&[
                    "text", "text", "int8", "bool", "int8", "int8", "bool", "int8", "int8", "bool",
                ])),
                10,
            ),
            (
                "renew",
                grouped::renew_sql(&unnest(&["text", "text", "int8", "int8"])),
                4,
            ),
            (
                "scheduled and running",
                grouped::mark_sql(
                    &grouped::SCHEDULED_AND_RUNNING,
                    &unnest(&["text", "text", "text", "int8", "int8", "int8"]),
                ),
                6,
            ),
            ("withdraw", executions::FREE_WITHDRAWN_LOCK.to_string(), 4),
        ];
        let Store::Postgres(pool) = &store else {
            unreachable!()
        };
        let mut conn = pool.acquire().await.unwrap();
        conn.execute("SET plan_cache_mode = force_generic_plan")
            .await
            .unwrap();
        // Every statement's verdict is gathered before asserting, so a
        // failing run still drops its scratch database.
        let mut wrong = Vec::new();
        for (n, (what, sql, params)) in statements.into_iter().enumerate() {
            let nulls = vec!["NULL"; params].join(", ");
            let plan = match conn
                .execute(AssertSqlSafe(format!("PREPARE fenced_{n} AS {sql}")))
                .await
            {
                Ok(_) => sqlx::query_scalar::<_, String>(AssertSqlSafe(format!(
                    "EXPLAIN (COSTS OFF) EXECUTE fenced_{n}({nulls})"
                )))
                .fetch_all(&mut *conn)
                .await
                .map(|lines| lines.join("\n")),
                Err(error) => Err(error),
            };
            match plan {
                Ok(plan)
                    if plan.contains("branch_rules_pkey") && !plan.contains("lock_holder_idx") => {}
                Ok(plan) => wrong.push(format!(
                    "{what} does not find its branch rule by id:\n{plan}"
                )),
                Err(error) => wrong.push(format!("{what}: {error}")),
            }
        }
        drop(conn);
        store.close().await;
        admin
            .execute(AssertSqlSafe(format!(
                "DROP DATABASE \"{name}\" WITH (FORCE)"
            )))
            .await
            .unwrap();
        assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
    }

    #[test]
    fn memory_urls_are_recognised() {
        assert!(is_sqlite_memory("sqlite::memory:"));
        assert!(is_sqlite_memory("sqlite://:memory:"));
        assert!(is_sqlite_memory("sqlite://?mode=memory&cache=private"));
        assert!(!is_sqlite_memory("sqlite://data/ruled.db"));
        assert!(!is_sqlite_memory("sqlite:///tmp/memory.db"));
    }
}
