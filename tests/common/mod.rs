//! Support shared by every integration test: throw-away databases on both
//! backends, a macro that runs one test body on each, and a poll helper.
//!
//! ```ignore
//! mod common;
//! use common::TestDb;
//!
//! // Generates `loads_a_brand::sqlite` and `loads_a_brand::postgres`.
//! both_backends!(loads_a_brand, |db: TestDb| async move {
//!     let store = db.store().await; // connected and migrated
//!     // ...
//! });
//!
//! // Arguments for `#[tokio::test(...)]` go after the name:
//! both_backends!(under_load, tokio::test(flavor = "multi_thread", worker_threads = 4), |db: TestDb| async move {
//!     // ...
//! });
//! ```
//!
//! Filter with `cargo test --test NAME sqlite` or `... postgres`.
//!
//! PostgreSQL: each test gets a fresh database `ruled_t_<uuid>` on the server
//! of `RULED_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`), dropped when its [`TestDb`]
//! drops. With the server unreachable the `postgres` half is skipped with a
//! loud notice on stderr — unless `CI=true`, where it fails.
//!
//! Tokio's paused clock (`start_paused = true`) does not mix with a real
//! database: the runtime auto-advances while it waits for I/O, so sqlx's own
//! acquire timeouts fire at once. The helpers here avoid tokio timers for
//! that reason, but the store itself cannot.
//!
//! Tests never sleep to wait for something: use [`eventually`].
#![allow(dead_code)]

pub mod api;
pub mod chromium;
pub mod cluster;
pub mod http;
pub mod process;
pub mod rules;
pub mod service;

use std::future::Future;
use std::io::Write;
use std::time::{Duration, Instant};

use ruled::store::{Backend, Store};
use sqlx::{AssertSqlSafe, Connection, Executor, PgConnection};
use tempfile::TempDir;
use uuid::Uuid;

pub const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs one async test body once on SQLite and once on PostgreSQL; see the
/// module docs.
#[macro_export]
macro_rules! both_backends {
    ($name:ident, tokio::test $( ( $($args:tt)* ) )?, $test:expr $(,)?) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[tokio::test $( ( $($args)* ) )?]
            async fn sqlite() {
                let db = $crate::common::sqlite_db().await;
                ($test)(db).await;
            }

            #[tokio::test $( ( $($args)* ) )?]
            async fn postgres() {
                if let Some(db) = $crate::common::postgres_db().await {
                    ($test)(db).await;
                }
            }
        }
    };
    ($name:ident, $test:expr $(,)?) => {
        $crate::both_backends!($name, tokio::test, $test);
    };
}

/// A throw-away database. Keep it alive for as long as the test uses the
/// database: dropping it deletes the SQLite directory or drops the
/// PostgreSQL database.
pub struct TestDb {
    pub url: String,
    pub backend: Backend,
    guard: Guard,
}

enum Guard {
    Sqlite(TempDir),
    Postgres(PgDatabase),
}

impl TestDb {
    /// A new connected and migrated store on this database. Each call opens
    /// its own pool, as separate instances of ruled would.
    pub async fn store(&self) -> Store {
        let store = Store::connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("connect to test database {}: {e}", self.url));
        store
            .migrate()
            .await
            .unwrap_or_else(|e| panic!("migrate test database {}: {e}", self.url));
        store
    }

    /// The SQLite database's directory (for plan files, markers and the
    /// like); `None` on PostgreSQL.
    pub fn sqlite_dir(&self) -> Option<&std::path::Path> {
        match &self.guard {
            Guard::Sqlite(dir) => Some(dir.path()),
            Guard::Postgres(_) => None,
        }
    }
}

impl std::fmt::Debug for TestDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestDb")
            .field("url", &self.url)
            .field("backend", &self.backend)
            .finish()
    }
}

/// A file database in a fresh temporary directory (not `:memory:`, so
/// several pools and the `ruled` binary can share it, as in production).
pub async fn sqlite_db() -> TestDb {
    let dir = tempfile::Builder::new()
        .prefix("ruled-test-")
        .tempdir()
        .expect("create temporary directory for the SQLite test database");
    let url = format!("sqlite://{}/ruled.db", dir.path().display());
    TestDb {
        url,
        backend: Backend::Sqlite,
        guard: Guard::Sqlite(dir),
    }
}

/// A fresh, empty PostgreSQL database, or `None` (after a loud notice) when
/// no server is reachable outside CI.
pub async fn postgres_db() -> Option<TestDb> {
    let admin_url =
        std::env::var("RULED_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_POSTGRES_URL.into());
    let name = format!("ruled_t_{}", Uuid::new_v4().simple());

    if let Err(error) = admin_sql(&admin_url, format!("CREATE DATABASE \"{name}\"")) {
        let test = std::thread::current()
            .name()
            .unwrap_or("<unnamed>")
            .to_string();
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!(
                "PostgreSQL test {test}: cannot create a database on {admin_url}: {error} \
                 (CI=true, so this is a failure; set RULED_TEST_POSTGRES_URL)"
            );
        }
        // Straight to the stderr handle: libtest captures `eprintln!` of
        // passing tests, and a silent skip would read as a pass.
        let _ = writeln!(
            std::io::stderr(),
            "\n!!! SKIPPING PostgreSQL test {test}: cannot reach {admin_url}: {error}\n\
             !!! set RULED_TEST_POSTGRES_URL to a server where this user may CREATE DATABASE\n"
        );
        return None;
    }

    Some(TestDb {
        url: with_database(&admin_url, &name),
        backend: Backend::Postgres,
        guard: Guard::Postgres(PgDatabase { admin_url, name }),
    })
}

struct PgDatabase {
    admin_url: String,
    name: String,
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        // FORCE: pools the test forgot to close must not keep the database.
        let sql = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name);
        if let Err(error) = admin_sql(&self.admin_url, sql) {
            let _ = writeln!(
                std::io::stderr(),
                "warning: could not drop test database {}: {error}",
                self.name
            );
        }
    }
}

/// Runs one statement on the admin database from a thread with its own
/// runtime: usable from `Drop` (no async there), from a test runtime that is
/// shutting down, and unaffected by a paused test clock.
fn admin_sql(admin_url: &str, sql: String) -> Result<(), String> {
    let admin_url = admin_url.to_string();
    let work = move || -> Result<(), String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        runtime.block_on(async move {
            let connect = PgConnection::connect(&admin_url);
            let mut conn = tokio::time::timeout(ADMIN_TIMEOUT, connect)
                .await
                .map_err(|_| format!("no answer within {ADMIN_TIMEOUT:?}"))?
                .map_err(|e| e.to_string())?;
            let result = conn.execute(AssertSqlSafe(sql)).await;
            let _ = conn.close().await;
            result.map(drop).map_err(|e| e.to_string())
        })
    };
    std::thread::spawn(work)
        .join()
        .unwrap_or_else(|_| Err("admin thread panicked".into()))
}

/// `postgres://u@h:5432/test?x=y` with database `name` instead of `test`.
pub fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let server = match base[authority_start..].find('/') {
        Some(slash) => &base[..authority_start + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{server}/{name}?{query}"),
        None => format!("{server}/{name}"),
    }
}

/// Every execution in the table, whatever its status.
pub async fn execution_count(store: &Store) -> i64 {
    store
        .count_executions_by_status()
        .await
        .unwrap()
        .iter()
        .map(|(_, n)| n)
        .sum()
}

/// Polls `condition` every 20 ms until it returns true; panics naming
/// `what` if it has not after `deadline`.
///
/// The deadline is wall-clock time, so a paused tokio clock (which the 20 ms
/// sleeps advance) cannot make it expire early or never.
pub async fn eventually<F, Fut>(deadline: Duration, what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    loop {
        if condition().await {
            return;
        }
        if started.elapsed() >= deadline {
            panic!("timed out after {deadline:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until branch rule `id` has an execution in `status`.
pub async fn wait_for_execution(
    store: &Store,
    id: Uuid,
    status: ruled::model::ExecutionStatus,
    deadline: Duration,
) {
    eventually(
        deadline,
        &format!("an execution of {id} is {status:?}"),
        || async {
            store
                .executions_for(id)
                .await
                .is_ok_and(|runs| runs.iter().any(|e| e.status == status))
        },
    )
    .await;
}

/// A database made unavailable to the service under test, until
/// [`Outage::restore`].
pub enum Outage {
    /// Another connection holds SQLite's write lock: every writer waits out
    /// its busy timeout and fails with "database is locked", as with a
    /// long-running migration or backup.
    Sqlite(sqlx::SqliteConnection),
    /// The database was renamed away after its connections were
    /// terminated: every reconnect fails, as with a server outage.
    Postgres { admin_url: String, name: String },
}

impl TestDb {
    pub async fn outage(&self) -> Outage {
        match &self.guard {
            Guard::Sqlite(_) => {
                let mut conn = sqlx::SqliteConnection::connect(&self.url).await.unwrap();
                conn.execute("BEGIN EXCLUSIVE").await.unwrap();
                Outage::Sqlite(conn)
            }
            Guard::Postgres(db) => {
                let away = format!("{}_away", db.name);
                let sql = format!(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{0}'; \
                     ALTER DATABASE \"{0}\" RENAME TO \"{away}\"",
                    db.name
                );
                // The service's pool may reconnect between the two
                // statements; try again until the rename wins.
                let mut last = String::new();
                for _ in 0..50 {
                    match admin_sql(&db.admin_url, sql.clone()) {
                        Ok(()) => {
                            return Outage::Postgres {
                                admin_url: db.admin_url.clone(),
                                name: db.name.clone(),
                            };
                        }
                        Err(e) => last = e,
                    }
                }
                panic!("could not take {} away: {last}", db.name);
            }
        }
    }
}

impl Outage {
    pub async fn restore(self) {
        match self {
            Outage::Sqlite(mut conn) => {
                conn.execute("COMMIT").await.unwrap();
                conn.close().await.unwrap();
            }
            Outage::Postgres { admin_url, name } => {
                let sql = format!("ALTER DATABASE \"{name}_away\" RENAME TO \"{name}\"");
                admin_sql(&admin_url, sql).unwrap();
            }
        }
    }
}
