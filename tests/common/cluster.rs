//! Several real `ruled serve` processes on one PostgreSQL database, the
//! faults the chaos suite throws at them, and the one invariant checker
//! every scenario ends with (issue 11's acceptance).
//!
//! ```ignore
//! let db = common::postgres_db().await?;            // fresh database
//! let cluster = Cluster::start(&db, 3, &[("WORKER_COUNT", "4")]).await;
//! cluster.wait_until_cluster_ready(READY).await;
//! let due = cluster.seed(60, Action::Sleep(3_000), Due::DbNow(0), 0).await;
//! cluster.kill9(1);
//! cluster.wait_until_all_done(&Expect::completed(&due), DEADLINE).await;
//! cluster.check_invariants(&Expect::completed(&due)).await;
//! ```
//!
//! - Each instance has its own scratch directory (plan file, shutdown
//!   marker, log), INSTANCE_ID `chaos-a`, `chaos-b`, … and, in its
//!   DATABASE_URL, `application_name` = its INSTANCE_ID (so the harness can
//!   tell its backends in `pg_stat_activity`) and optionally a PostgreSQL
//!   role of its own (so its connections can be cut, see [`Cluster::cut`]).
//! - Every child is killed when the [`Cluster`] drops, panicking test or
//!   not; on a panic the tail of every instance's log is printed. The logs
//!   are also copied to `target/tmp/chaos-logs/<test>/` for a post-mortem.
//! - Clock skew goes through libfaketime's environment (`LD_PRELOAD`,
//!   `FAKETIME`), read from Debian's `faketime` wrapper, rather than through
//!   the wrapper process itself: `faketime` forks the program and waits for
//!   it, so signals sent to the spawned pid would never reach `ruled`.
//! - Nothing here sleeps to wait for a timer: every wait polls a condition
//!   (the database, a log) with a deadline, and says what it last saw when
//!   the deadline passes.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::future::Future;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, Connection, Executor, PgConnection, PgPool, Row};

use super::TestDb;

pub const BIN: &str = env!("CARGO_BIN_EXE_ruled");

/// The bearer token every instance is started with.
pub const API_TOKEN: &str = "chaos-token";

/// A cron expression that fires once a year: a seeded rule has exactly one
/// due occurrence while a test lasts.
pub const YEARLY: &str = "0 0 1 1 *";

/// The environment every instance starts with; a scenario's overrides come
/// after it. Short intervals so faults play out in seconds, and the memory
/// guard out of the way (a busy CI host must not throttle a chaos test).
pub const BASE_ENV: &[(&str, &str)] = &[
    ("RUST_LOG", "info"),
    ("HTTP_ADDR", "127.0.0.1:0"),
    ("API_TOKEN", API_TOKEN),
    ("MASTER_GRACE_PERIOD_SECONDS", "0"),
    ("WORKER_COOLDOWN_SECONDS", "0"),
    ("WORKER_STAGGER_SECONDS", "0"),
    ("EXECUTION_PLAN_REFRESH_SECONDS", "0.5"),
    ("MASTER_FETCH_INTERVAL_SECONDS", "1"),
    ("PARTITION_COUNT", "24"),
    ("PARTITION_LEASE_TTL_SECONDS", "3"),
    ("PARTITION_LEASE_RETRY_SECONDS", "0.5"),
    ("SCHEDULE_LOCK_TIMEOUT_SECONDS", "6"),
    ("SHUTDOWN_GRACE_SECONDS", "10"),
    ("MEMORY_THROTTLE_THRESHOLD", "99.5"),
    ("MEMORY_RESUME_THRESHOLD", "99"),
    ("SWAP_THROTTLE_THRESHOLD", "100"),
];

/// How long after a fault every occurrence due during it must have run:
/// the lease TTL plus this (issue 11: "within TTL plus 5 s").
pub const RECOVERY_SLACK: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------
// Occurrences, seeding
// ---------------------------------------------------------------------------

/// One due occurrence: a branch rule and the `next_run_time` it was seeded
/// with, which its executions carry as `scheduled_for`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Occurrence {
    pub rule: String,
    pub due: i64,
}

impl std::fmt::Display for Occurrence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} due {}", self.rule, self.due)
    }
}

/// The one action of a seeded rule.
#[derive(Debug, Clone, Copy)]
pub enum Action {
    Noop,
    /// `sleep` for this many milliseconds.
    Sleep(u64),
}

/// When the first seeded rule is due.
#[derive(Debug, Clone, Copy)]
pub enum Due {
    /// The database's clock at seeding plus this many ms (negative: overdue).
    DbNow(i64),
    /// This instant, epoch ms.
    At(i64),
}

/// An execution row as the checker reads it.
#[derive(Debug, Clone)]
pub struct Exec {
    pub id: String,
    pub rule: String,
    pub scheduled_for: i64,
    pub attempt: i64,
    pub status: String,
    pub owner: Option<String>,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub error: Option<String>,
}

impl Exec {
    pub fn occurrence(&self) -> Occurrence {
        Occurrence {
            rule: self.rule.clone(),
            due: self.scheduled_for,
        }
    }

    pub fn is_open(&self) -> bool {
        self.finished_at.is_none()
            || matches!(self.status.as_str(), "requested" | "scheduled" | "running")
    }
}

impl std::fmt::Display for Exec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "[attempt {} {} owner={} started={} finished={} error={}]",
            self.attempt,
            self.status,
            self.owner.as_deref().unwrap_or("-"),
            opt(self.started_at),
            opt(self.finished_at),
            self.error.as_deref().unwrap_or("-"),
        )
    }
}

fn opt(value: Option<i64>) -> String {
    value.map_or_else(|| "-".into(), |v| v.to_string())
}

/// A partition lease row and whether it is held at the read (on the
/// database's clock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub partition: i64,
    pub holder: Option<String>,
    pub epoch: i64,
    pub expires_at: i64,
    pub live: bool,
}

// ---------------------------------------------------------------------------
// What the checker expects
// ---------------------------------------------------------------------------

/// The occurrences a scenario seeded and how each must end.
#[derive(Debug, Clone, Default)]
pub struct Expect {
    /// Every occurrence the scenario seeded.
    pub occurrences: Vec<Occurrence>,
    /// Those that must end with a `cancelled` execution and none
    /// `completed` (cancel and force-stop); all others must complete once.
    pub cancelled: BTreeSet<Occurrence>,
    /// Invariant 4: occurrences due during a fault and when it ended.
    pub recovery: Option<Recovery>,
}

/// Invariant 4's input: every occurrence in `due` ran (its completed
/// attempt started) within TTL + 5 s of `max(fault_end_ms, its due time)`.
#[derive(Debug, Clone)]
pub struct Recovery {
    pub fault_end_ms: i64,
    pub due: Vec<Occurrence>,
}

impl Expect {
    pub fn completed(occurrences: &[Occurrence]) -> Expect {
        Expect {
            occurrences: occurrences.to_vec(),
            ..Expect::default()
        }
    }

    pub fn with_recovery(mut self, fault_end_ms: i64, due: Vec<Occurrence>) -> Expect {
        self.recovery = Some(Recovery { fault_end_ms, due });
        self
    }

    pub fn with_cancelled(mut self, cancelled: impl IntoIterator<Item = Occurrence>) -> Expect {
        self.cancelled.extend(cancelled);
        self
    }
}

// ---------------------------------------------------------------------------
// The cluster
// ---------------------------------------------------------------------------

/// Options beyond the environment.
#[derive(Debug, Clone)]
pub struct Options {
    /// Extra environment per instance (after the shared overrides).
    pub per_instance_env: Vec<Vec<(String, String)>>,
    /// Each instance connects as a PostgreSQL role of its own (needed by
    /// [`Cluster::cut`]; on by default).
    pub roles: bool,
    /// A libfaketime offset per instance (`"+90s"`, `"-90s"`); `None`
    /// runs that instance on the real clock.
    pub faketime: Vec<Option<String>>,
}

impl Default for Options {
    /// A role per instance: its backends are told apart by `usename`
    /// whatever `application_name` ruled gives its connections.
    fn default() -> Options {
        Options {
            per_instance_env: Vec::new(),
            roles: true,
            faketime: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Running,
    Stopped,
    Exited,
}

struct Proc {
    child: Option<Child>,
    state: State,
    /// Where this start's part of the log begins.
    log_offset: u64,
    starts: usize,
}

pub struct Instance {
    pub id: String,
    /// The role it connects as, when it has one.
    pub role: Option<String>,
    dir: tempfile::TempDir,
    database_url: String,
    env: Vec<(String, String)>,
    proc: Mutex<Proc>,
}

impl Instance {
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("ruled.log")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The log of the current start only.
    fn current_log(&self) -> String {
        let offset = self.proc.lock().unwrap().log_offset as usize;
        let log = self.log();
        log.get(offset..).unwrap_or("").to_string()
    }

    pub fn state(&self) -> State {
        self.proc.lock().unwrap().state
    }
}

pub struct Cluster {
    pub db_url: String,
    /// The test's own connections (as the server's admin user).
    pub pool: PgPool,
    pub instances: Vec<Instance>,
    pub ttl: Duration,
    pub partition_count: i64,
    name: String,
    started: Instant,
}

impl Cluster {
    /// `n` instances with the base environment plus `env`.
    pub async fn start(db: &TestDb, n: usize, env: &[(&str, &str)]) -> Cluster {
        Cluster::start_with(db, n, env, Options::default()).await
    }

    pub async fn start_with(
        db: &TestDb,
        n: usize,
        env: &[(&str, &str)],
        options: Options,
    ) -> Cluster {
        assert!(n <= 26, "at most 26 instances");
        // Migrate as the admin user before any instance starts: the tables
        // belong to it (so the per-instance roles own nothing and can be
        // dropped), and the harness can seed at once.
        let store = db.store().await;
        drop(store);
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(30))
            .connect(&db.url)
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", db.url));

        let mut shared: Vec<(String, String)> = BASE_ENV
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        for (k, v) in env {
            shared.retain(|(key, _)| key != k);
            shared.push((k.to_string(), v.to_string()));
        }
        let value = |key: &str| {
            shared
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        };
        let ttl = Duration::from_secs_f64(
            value("PARTITION_LEASE_TTL_SECONDS")
                .and_then(|v| v.parse().ok())
                .unwrap_or(30.0),
        );
        let partition_count = value("PARTITION_COUNT")
            .and_then(|v| v.parse().ok())
            .unwrap_or(64);

        let tag = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let name = std::thread::current()
            .name()
            .unwrap_or("chaos")
            .replace("::", "-");
        let mut instances = Vec::new();
        for i in 0..n {
            let letter = (b'a' + i as u8) as char;
            let id = format!("chaos-{letter}");
            let role = options.roles.then(|| format!("chaos_{tag}_{letter}"));
            if let Some(role) = &role {
                sql(&pool, format!("CREATE ROLE \"{role}\" LOGIN SUPERUSER")).await;
            }
            let mut url = match &role {
                Some(role) => with_user(&db.url, role),
                None => db.url.clone(),
            };
            url.push(if url.contains('?') { '&' } else { '?' });
            url.push_str(&format!("application_name={id}"));

            let dir = tempfile::Builder::new()
                .prefix(&format!("ruled-{id}-"))
                .tempdir()
                .unwrap();
            let mut env = shared.clone();
            env.push(("INSTANCE_ID".into(), id.clone()));
            env.push((
                "PLAN_FILE".into(),
                dir.path().join("plan.json").display().to_string(),
            ));
            env.push((
                "SHUTDOWN_MARKER_FILE".into(),
                dir.path().join("marker.json").display().to_string(),
            ));
            if let Some(Some(offset)) = options.faketime.get(i) {
                env.extend(faketime_env(offset).unwrap_or_else(|| {
                    panic!("faketime is not installed; check faketime_available() first")
                }));
            }
            if let Some(extra) = options.per_instance_env.get(i) {
                for (k, v) in extra {
                    env.retain(|(key, _)| key != k);
                    env.push((k.clone(), v.clone()));
                }
            }
            instances.push(Instance {
                id,
                role,
                dir,
                database_url: url,
                env,
                proc: Mutex::new(Proc {
                    child: None,
                    state: State::Exited,
                    log_offset: 0,
                    starts: 0,
                }),
            });
        }
        let cluster = Cluster {
            db_url: db.url.clone(),
            pool,
            instances,
            ttl,
            partition_count,
            name,
            started: Instant::now(),
        };
        for i in 0..n {
            cluster.spawn(i);
        }
        cluster
    }

    pub fn len(&self) -> usize {
        self.instances.len()
    }

    pub fn id(&self, i: usize) -> &str {
        &self.instances[i].id
    }

    pub fn index_of(&self, id: &str) -> usize {
        self.instances
            .iter()
            .position(|instance| instance.id == id)
            .unwrap_or_else(|| panic!("no instance {id}"))
    }

    pub fn log(&self, i: usize) -> String {
        self.instances[i].log()
    }

    fn spawn(&self, i: usize) {
        let instance = &self.instances[i];
        let mut proc = instance.proc.lock().unwrap();
        assert_ne!(
            proc.state,
            State::Running,
            "{} is already running",
            instance.id
        );
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(instance.log_path())
            .unwrap();
        proc.starts += 1;
        writeln!(
            log,
            "===== chaos harness: start #{} of {} at {} ms =====",
            proc.starts,
            instance.id,
            wall_ms()
        )
        .unwrap();
        proc.log_offset = log.metadata().unwrap().len();
        let mut command = Command::new(BIN);
        command
            .arg("serve")
            .current_dir(instance.dir.path())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("DATABASE_URL", &instance.database_url)
            .envs(instance.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        // Should the test process itself die (a CI timeout), take the child
        // with it.
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: prctl(2) only, between fork and exec.
            unsafe {
                command.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {BIN} for {}: {e}", instance.id));
        proc.child = Some(child);
        proc.state = State::Running;
    }

    fn signal(&self, i: usize, signal: i32) {
        let proc = self.instances[i].proc.lock().unwrap();
        let child = proc
            .child
            .as_ref()
            .unwrap_or_else(|| panic!("{} is not running", self.instances[i].id));
        // SAFETY: kill(2) on a pid we spawned and have not reaped.
        let rc = unsafe { libc::kill(child.id() as i32, signal) };
        assert_eq!(rc, 0, "kill({signal}) {}", self.instances[i].id);
    }

    /// SIGKILL, and reap it.
    pub fn kill9(&self, i: usize) {
        let mut proc = self.instances[i].proc.lock().unwrap();
        if let Some(mut child) = proc.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        proc.state = State::Exited;
    }

    pub fn sigstop(&self, i: usize) {
        self.signal(i, libc::SIGSTOP);
        self.instances[i].proc.lock().unwrap().state = State::Stopped;
    }

    pub fn sigcont(&self, i: usize) {
        self.signal(i, libc::SIGCONT);
        self.instances[i].proc.lock().unwrap().state = State::Running;
    }

    /// SIGTERM, then waits (polling, with a deadline) for the exit.
    pub fn sigterm_and_wait(&self, i: usize, deadline: Duration) -> ExitStatus {
        self.sigterm(i);
        self.wait_exit(i, deadline)
    }

    /// SIGTERM, without waiting: the graceful stop begins.
    pub fn sigterm(&self, i: usize) {
        self.signal(i, libc::SIGTERM);
    }

    /// Whether the instance's process has not exited yet.
    pub fn is_running(&self, i: usize) -> bool {
        let mut proc = self.instances[i].proc.lock().unwrap();
        proc.child
            .as_mut()
            .is_some_and(|child| child.try_wait().unwrap().is_none())
    }

    /// Waits (polling, with a deadline) for the instance's exit.
    pub fn wait_exit(&self, i: usize, deadline: Duration) -> ExitStatus {
        let started = Instant::now();
        loop {
            {
                let mut proc = self.instances[i].proc.lock().unwrap();
                let child = proc.child.as_mut().unwrap();
                if let Some(status) = child.try_wait().unwrap() {
                    proc.child = None;
                    proc.state = State::Exited;
                    return status;
                }
            }
            assert!(
                started.elapsed() < deadline,
                "{} did not exit within {deadline:?} of SIGTERM",
                self.instances[i].id
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts an exited instance again, same directory, id and role.
    pub fn restart(&self, i: usize) {
        self.spawn(i);
    }

    /// Panics if an instance the harness believes alive has exited.
    fn assert_alive(&self) {
        for instance in &self.instances {
            let mut proc = instance.proc.lock().unwrap();
            if proc.state == State::Exited {
                continue;
            }
            if let Some(child) = proc.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                proc.state = State::Exited;
                proc.child = None;
                drop(proc);
                panic!(
                    "{} exited unexpectedly ({status}); its log ends:\n{}",
                    instance.id,
                    tail(&instance.log(), 60)
                );
            }
        }
    }

    /// The `host:port` of instance `i`'s HTTP API, from its current log.
    pub fn http_addr(&self, i: usize) -> Option<String> {
        const NEEDLE: &str = "HTTP API listening on http://";
        let log = self.instances[i].current_log();
        let rest = log.rsplit(NEEDLE).next().filter(|_| log.contains(NEEDLE))?;
        let addr: String = rest
            .chars()
            .take_while(|c| !c.is_whitespace() && *c != '\u{1b}')
            .collect();
        Some(addr)
    }

    /// A plain HTTP/1.1 request to instance `i` with the bearer token.
    pub fn http(&self, i: usize, method: &str, path: &str) -> HttpReply {
        let addr = self
            .http_addr(i)
            .unwrap_or_else(|| panic!("{} has no HTTP address yet", self.id(i)));
        http_request(&addr, method, path, Some(API_TOKEN))
    }

    // -----------------------------------------------------------------------
    // Database views
    // -----------------------------------------------------------------------

    pub async fn db_now_ms(&self) -> i64 {
        sqlx::query_scalar::<_, i64>(DB_NOW)
            .fetch_one(&self.pool)
            .await
            .expect("read the database clock")
    }

    pub async fn executions(&self) -> Vec<Exec> {
        let rows = sqlx::query(
            "SELECT id, branch_rule_id, scheduled_for, attempt, status, owner, started_at, \
             finished_at, error FROM executions ORDER BY branch_rule_id, scheduled_for, attempt",
        )
        .fetch_all(&self.pool)
        .await
        .expect("read executions");
        rows.iter()
            .map(|row| Exec {
                id: row.get("id"),
                rule: row.get("branch_rule_id"),
                scheduled_for: row.get("scheduled_for"),
                attempt: row.get("attempt"),
                status: row.get("status"),
                owner: row.get("owner"),
                started_at: row.get("started_at"),
                finished_at: row.get("finished_at"),
                error: row.get("error"),
            })
            .collect()
    }

    /// Running executions per owner.
    pub async fn running_by_owner(&self) -> BTreeMap<String, i64> {
        let rows = sqlx::query(
            "SELECT COALESCE(owner, '') AS owner, count(*) AS n FROM executions \
             WHERE status = 'running' AND finished_at IS NULL GROUP BY owner",
        )
        .fetch_all(&self.pool)
        .await
        .expect("count running executions");
        rows.iter()
            .map(|row| (row.get::<String, _>("owner"), row.get::<i64, _>("n")))
            .collect()
    }

    /// The lease rows, empty when the table does not exist yet.
    pub async fn leases(&self) -> Vec<Lease> {
        let exists: Option<String> =
            sqlx::query_scalar("SELECT to_regclass('partition_leases')::text")
                .fetch_one(&self.pool)
                .await
                .expect("look for partition_leases");
        if exists.is_none() {
            return Vec::new();
        }
        let rows = sqlx::query(
            "SELECT partition::bigint AS partition, holder, epoch::bigint AS epoch, \
             expires_at::bigint AS expires_at, \
             (holder IS NOT NULL AND expires_at > (extract(epoch FROM clock_timestamp()) * 1000)::bigint) AS live \
             FROM partition_leases ORDER BY partition",
        )
        .fetch_all(&self.pool)
        .await
        .expect("read partition_leases");
        rows.iter()
            .map(|row| Lease {
                partition: row.get("partition"),
                holder: row.get("holder"),
                epoch: row.get("epoch"),
                expires_at: row.get("expires_at"),
                live: row.get("live"),
            })
            .collect()
    }

    /// Live leases per holder.
    pub async fn held(&self) -> BTreeMap<String, usize> {
        let mut held = BTreeMap::new();
        for lease in self.leases().await {
            if let (true, Some(holder)) = (lease.live, lease.holder) {
                *held.entry(holder).or_default() += 1;
            }
        }
        held
    }

    /// How many backends the instance has open, and how many are busy (in a
    /// statement, not idle or idle in a transaction).
    pub async fn backends(&self, i: usize) -> (i64, i64) {
        let states = self.backend_states(i).await;
        let total = states.values().sum();
        (total, states.get("active").copied().unwrap_or(0))
    }

    /// The instance's backends by `pg_stat_activity.state`, found by its
    /// role when it has one (ruled may name its connections itself), else
    /// by `application_name`.
    pub async fn backend_states(&self, i: usize) -> BTreeMap<String, i64> {
        let (sql, key) = match &self.instances[i].role {
            Some(role) => (
                "SELECT COALESCE(state, '') AS state, count(*) AS n FROM pg_stat_activity \
                 WHERE usename = $1 GROUP BY state",
                role.as_str(),
            ),
            None => (
                "SELECT COALESCE(state, '') AS state, count(*) AS n FROM pg_stat_activity \
                 WHERE application_name = $1 GROUP BY state",
                self.id(i),
            ),
        };
        sqlx::query(sql)
            .bind(key)
            .fetch_all(&self.pool)
            .await
            .expect("read pg_stat_activity")
            .iter()
            .map(|row| (row.get::<String, _>("state"), row.get::<i64, _>("n")))
            .collect()
    }

    /// Backends waiting on a lock, who they wait on, and what they run: the
    /// evidence when a frozen instance's open transaction blocks the rest.
    pub async fn lock_waits(&self) -> String {
        let rows = sqlx::query(
            "SELECT w.usename AS waiter, w.application_name AS app, \
             (now() - w.query_start)::text AS waiting, left(w.query, 160) AS query, \
             COALESCE((SELECT string_agg(b.usename || ' ' || b.state || ' ' || left(b.query, 100), '; ') \
               FROM pg_stat_activity b WHERE b.pid = ANY(pg_blocking_pids(w.pid))), '') AS blockers \
             FROM pg_stat_activity w WHERE w.wait_event_type = 'Lock' AND w.datname = current_database()",
        )
        .fetch_all(&self.pool)
        .await
        .expect("read lock waits");
        let mut out = String::new();
        for row in &rows {
            let _ = write!(
                out,
                "\n    {} ({}) waiting {} in `{}` blocked by [{}]",
                row.get::<Option<String>, _>("waiter").unwrap_or_default(),
                row.get::<Option<String>, _>("app").unwrap_or_default(),
                row.get::<Option<String>, _>("waiting").unwrap_or_default(),
                row.get::<Option<String>, _>("query").unwrap_or_default(),
                row.get::<String, _>("blockers"),
            );
        }
        out
    }

    /// Waits until instance `i` has no statement in progress on the server:
    /// after a SIGKILL or SIGSTOP, what it sent before has landed.
    pub async fn wait_until_quiet(&self, i: usize, deadline: Duration) {
        self.poll(
            &format!("{} has no statement in flight", self.id(i)),
            deadline,
            || async {
                match self.backends(i).await {
                    (_, 0) => Ok(()),
                    (total, active) => Err(format!("{active} of {total} backends active")),
                }
            },
        )
        .await;
    }

    // -----------------------------------------------------------------------
    // Seeding
    // -----------------------------------------------------------------------

    /// `count` branch rules in one brand, branch (UTC) and yearly rule, each
    /// with one action, the first due at `first_due` and each next one
    /// `spacing_ms` later; active from the start (rules and actions land in
    /// one transaction). Set-based: 10,000 rules take one statement.
    pub async fn seed(
        &self,
        count: usize,
        action: Action,
        first_due: Due,
        spacing_ms: i64,
    ) -> Vec<Occurrence> {
        let mut tx = self.pool.begin().await.expect("begin seeding");
        let brand = uuid::Uuid::new_v4().to_string();
        let branch = uuid::Uuid::new_v4().to_string();
        let rule = uuid::Uuid::new_v4().to_string();
        let template = uuid::Uuid::new_v4().to_string();
        sqlx::query("INSERT INTO brands (id, name) VALUES ($1, 'chaos brand')")
            .bind(&brand)
            .execute(&mut *tx)
            .await
            .expect("insert brand");
        sqlx::query(
            "INSERT INTO branches (id, brand_id, name, timezone) VALUES ($1, $2, 'chaos branch', 'UTC')",
        )
        .bind(&branch)
        .bind(&brand)
        .execute(&mut *tx)
        .await
        .expect("insert branch");
        sqlx::query(
            "INSERT INTO rules (id, brand_id, name, cron_expression) VALUES ($1, $2, 'chaos rule', $3)",
        )
        .bind(&rule)
        .bind(&brand)
        .bind(YEARLY)
        .execute(&mut *tx)
        .await
        .expect("insert rule");
        let (kind, config) = match action {
            Action::Noop => ("noop", "{}".to_string()),
            Action::Sleep(ms) => ("sleep", format!("{{\"ms\": {ms}}}")),
        };
        sqlx::query(
            "INSERT INTO action_templates (id, name, kind, config) VALUES ($1, $2, $3, $4)",
        )
        .bind(&template)
        .bind(format!("chaos {kind}"))
        .bind(kind)
        .bind(&config)
        .execute(&mut *tx)
        .await
        .expect("insert action template");
        let (offset, at) = match first_due {
            Due::DbNow(offset) => (offset, None),
            Due::At(at) => (0, Some(at)),
        };
        let rows = sqlx::query(
            "WITH base AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now), \
             br AS ( \
               INSERT INTO branch_rules (id, branch_id, rule_id, is_active, next_run_time, created_at, updated_at) \
               SELECT gen_random_uuid()::text, $1, $2, TRUE, \
                      COALESCE($3, base.now + $4) + (g - 1) * $5, base.now, base.now \
               FROM base, generate_series(1, $6::bigint) AS g \
               RETURNING id, next_run_time), \
             ad AS ( \
               INSERT INTO action_details (id, branch_rule_id, action_template_id, position, params) \
               SELECT gen_random_uuid()::text, br.id, $7, 0, '{}' FROM br) \
             SELECT id, next_run_time FROM br",
        )
        .bind(&branch)
        .bind(&rule)
        .bind(at)
        .bind(offset)
        .bind(spacing_ms)
        .bind(count as i64)
        .bind(&template)
        .fetch_all(&mut *tx)
        .await
        .expect("insert branch rules and action details");
        tx.commit().await.expect("commit seeding");
        let mut occurrences: Vec<Occurrence> = rows
            .iter()
            .map(|row| Occurrence {
                rule: row.get("id"),
                due: row.get("next_run_time"),
            })
            .collect();
        occurrences.sort_by(|a, b| (a.due, &a.rule).cmp(&(b.due, &b.rule)));
        occurrences
    }

    // -----------------------------------------------------------------------
    // Faults on the database side
    // -----------------------------------------------------------------------

    /// Cuts instance `i` off the database: its role may not log in and its
    /// backends are terminated. Needs [`Options::roles`].
    pub async fn cut(&self, i: usize) {
        let role = self.instances[i]
            .role
            .clone()
            .expect("cut needs Options { roles: true, .. }");
        sql(&self.pool, format!("ALTER ROLE \"{role}\" NOLOGIN")).await;
        // A backend may be mid-connect when the role changes; terminate
        // until none is left.
        self.poll(
            &format!("every backend of {role} is gone"),
            Duration::from_secs(20),
            || async {
                let left: i64 = sqlx::query_scalar(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = $1",
                )
                .bind(&role)
                .fetch_one(&self.pool)
                .await
                .expect("terminate backends");
                if left == 0 {
                    Ok(())
                } else {
                    Err(format!("{left} backend(s) terminated this round"))
                }
            },
        )
        .await;
    }

    /// Lets instance `i` connect again.
    pub async fn restore(&self, i: usize) {
        let role = self.instances[i].role.clone().expect("restore needs roles");
        sql(&self.pool, format!("ALTER ROLE \"{role}\" LOGIN")).await;
    }

    // -----------------------------------------------------------------------
    // Waiting
    // -----------------------------------------------------------------------

    /// Polls `condition` every 100 ms until it is `Ok`; panics after
    /// `deadline` with what it last said. Also fails at once when an
    /// instance that should be alive has exited. Returns the time it took.
    pub async fn poll<F, Fut>(&self, what: &str, deadline: Duration, mut condition: F) -> Duration
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(), String>>,
    {
        let started = Instant::now();
        loop {
            self.assert_alive();
            let last = match condition().await {
                Ok(()) => return started.elapsed(),
                Err(last) => last,
            };
            if started.elapsed() >= deadline {
                panic!("timed out after {deadline:?} waiting until {what}; last seen: {last}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Every running instance answers HTTP and heartbeats (on the
    /// database's clock, within one TTL) and, once leases exist, every
    /// partition is held by a running instance and each holds its fair share
    /// (between floor(P/n) and ceil(P/n)).
    pub async fn ready_state(&self) -> Result<(), String> {
        let live: Vec<usize> = (0..self.len())
            .filter(|&i| self.instances[i].state() == State::Running)
            .collect();
        for &i in &live {
            if self.http_addr(i).is_none() {
                return Err(format!("{} has not logged its HTTP address", self.id(i)));
            }
        }
        let ids: Vec<String> = live.iter().map(|&i| self.id(i).to_string()).collect();
        let fresh: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM instances WHERE id = ANY($1) AND heartbeat_at > \
             (extract(epoch FROM clock_timestamp()) * 1000)::bigint - $2",
        )
        .bind(&ids)
        .bind(self.ttl.as_millis() as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| format!("read instances: {e}"))?;
        let stale: Vec<&String> = ids.iter().filter(|id| !fresh.contains(id)).collect();
        if !stale.is_empty() {
            return Err(format!("no fresh heartbeat from {stale:?}"));
        }
        let leases = self.leases().await;
        if leases.is_empty() {
            return Ok(());
        }
        let mut held: BTreeMap<String, i64> = ids.iter().map(|id| (id.clone(), 0)).collect();
        let mut unowned = Vec::new();
        for partition in 0..self.partition_count {
            match leases.iter().find(|l| l.partition == partition) {
                Some(Lease {
                    live: true,
                    holder: Some(holder),
                    ..
                }) if held.contains_key(holder) => *held.get_mut(holder).unwrap() += 1,
                other => unowned.push((partition, other.and_then(|l| l.holder.clone()))),
            }
        }
        if !unowned.is_empty() {
            return Err(format!(
                "partitions not held by a running instance (partition, last holder): {unowned:?}; held: {held:?}"
            ));
        }
        let n = ids.len() as i64;
        let (low, high) = (self.partition_count / n, (self.partition_count + n - 1) / n);
        if held.values().any(|&h| h < low || h > high) {
            return Err(format!(
                "partitions not shared fairly (each should hold {low}..={high}): {held:?}"
            ));
        }
        Ok(())
    }

    pub async fn wait_until_cluster_ready(&self, deadline: Duration) -> Duration {
        self.poll("the cluster is ready", deadline, || self.ready_state())
            .await
    }

    /// No open execution, and every expected occurrence has a completed
    /// (or, for the expected cancels, a cancelled) execution.
    pub async fn done_state(&self, expect: &Expect) -> Result<(), String> {
        let executions = self.executions().await;
        let open = executions.iter().filter(|e| e.is_open()).count();
        let mut finished: BTreeSet<Occurrence> = BTreeSet::new();
        for e in &executions {
            let wanted = if expect.cancelled.contains(&e.occurrence()) {
                "cancelled"
            } else {
                "completed"
            };
            if e.status == wanted {
                finished.insert(e.occurrence());
            }
        }
        let missing = expect
            .occurrences
            .iter()
            .filter(|o| !finished.contains(*o))
            .count();
        if open == 0 && missing == 0 {
            Ok(())
        } else {
            let by_status = executions.iter().fold(BTreeMap::new(), |mut m, e| {
                *m.entry(e.status.as_str()).or_insert(0) += 1;
                m
            });
            Err(format!(
                "{missing} of {} occurrence(s) not finished yet, {open} open execution(s); \
                 executions by status {by_status:?}; running by owner {:?}; leases held {:?}",
                expect.occurrences.len(),
                self.running_by_owner().await,
                self.held().await,
            ))
        }
    }

    pub async fn wait_until_all_done(&self, expect: &Expect, deadline: Duration) -> Duration {
        self.poll("every occurrence has run", deadline, || {
            self.done_state(expect)
        })
        .await
    }

    // -----------------------------------------------------------------------
    // The invariant checker
    // -----------------------------------------------------------------------

    /// Issue 11's invariants; panics listing the offenders of each.
    ///
    /// 1. every expected occurrence has exactly one `completed` execution
    ///    (an expected cancel: none completed, one `cancelled`), and no
    ///    execution belongs to an occurrence nobody seeded;
    /// 2. no two attempts of one occurrence overlap in
    ///    [started_at, finished_at] (attempts that started);
    /// 3. no execution is open and no branch rule is locked or flagged
    ///    running;
    /// 4. every occurrence due during a fault ran (its completed attempt
    ///    started) within TTL + 5 s of max(the fault's end, its due time);
    /// 5. no instance logged a deadlock or a panic.
    pub async fn check_invariants(&self, expect: &Expect) -> Vec<Exec> {
        match self.violations(expect).await {
            Ok(executions) => executions,
            Err(failures) => panic!("[{}] invariants violated:\n{failures}", self.name),
        }
    }

    /// [`Cluster::check_invariants`] without the panic: every execution
    /// row, or the report of what was violated.
    pub async fn violations(&self, expect: &Expect) -> Result<Vec<Exec>, String> {
        let executions = self.executions().await;
        let mut by_occurrence: BTreeMap<Occurrence, Vec<&Exec>> = BTreeMap::new();
        for e in &executions {
            by_occurrence.entry(e.occurrence()).or_default().push(e);
        }
        let expected: BTreeSet<&Occurrence> = expect.occurrences.iter().collect();
        let attempts = |o: &Occurrence| -> String {
            by_occurrence.get(o).map_or_else(
                || "no execution".into(),
                |list| {
                    list.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(" ")
                },
            )
        };
        let mut failures = String::new();

        // 1. exactly once.
        let mut offenders = Vec::new();
        for o in &expect.occurrences {
            let list = by_occurrence.get(o).map(Vec::as_slice).unwrap_or(&[]);
            let completed = list.iter().filter(|e| e.status == "completed").count();
            let cancelled = list.iter().filter(|e| e.status == "cancelled").count();
            let ok = if expect.cancelled.contains(o) {
                completed == 0 && cancelled == 1
            } else {
                completed == 1
            };
            if !ok {
                offenders.push(format!("{o}: {}", attempts(o)));
            }
        }
        for o in by_occurrence.keys() {
            if !expected.contains(o) {
                offenders.push(format!("{o} was never seeded as due: {}", attempts(o)));
            }
        }
        report(
            &mut failures,
            "1 (every due occurrence has exactly one completed execution)",
            &offenders,
        );

        // 2. no overlapping attempts.
        let mut offenders = Vec::new();
        for (o, list) in &by_occurrence {
            let mut started: Vec<&&Exec> = list.iter().filter(|e| e.started_at.is_some()).collect();
            started.sort_by_key(|e| e.started_at);
            for pair in started.windows(2) {
                let end = pair[0].finished_at.unwrap_or(i64::MAX);
                if pair[1].started_at.unwrap() < end {
                    offenders.push(format!("{o}: {} overlaps {}", pair[0], pair[1]));
                }
            }
        }
        report(
            &mut failures,
            "2 (no two attempts of one occurrence overlap)",
            &offenders,
        );

        // 3. nothing open, nothing locked.
        let mut offenders: Vec<String> = executions
            .iter()
            .filter(|e| e.is_open())
            .map(|e| format!("{}: {e} is open (execution {})", e.occurrence(), e.id))
            .collect();
        let locked = sqlx::query(
            "SELECT id, lock_holder, lock_epoch, is_currently_running FROM branch_rules \
             WHERE lock_holder IS NOT NULL OR is_currently_running ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await
        .expect("read locked branch rules");
        for row in &locked {
            offenders.push(format!(
                "branch rule {}: lock_holder={:?} lock_epoch={} is_currently_running={}",
                row.get::<String, _>("id"),
                row.get::<Option<String>, _>("lock_holder"),
                row.get::<i64, _>("lock_epoch"),
                row.get::<bool, _>("is_currently_running"),
            ));
        }
        report(
            &mut failures,
            "3 (no execution left open, no lock held)",
            &offenders,
        );

        // 4. recovery within TTL + 5 s.
        if let Some(recovery) = &expect.recovery {
            let budget = (self.ttl + RECOVERY_SLACK).as_millis() as i64;
            let mut offenders = Vec::new();
            let mut worst = 0;
            for o in &recovery.due {
                let from = recovery.fault_end_ms.max(o.due);
                let started = by_occurrence.get(o).and_then(|list| {
                    list.iter()
                        .find(|e| e.status == "completed")
                        .and_then(|e| e.started_at)
                });
                match started {
                    Some(started) => {
                        worst = worst.max(started - from);
                        if started - from > budget {
                            offenders.push(format!(
                                "{o}: started {} ms after max(fault end, due) (budget {budget} ms): {}",
                                started - from,
                                attempts(o)
                            ));
                        }
                    }
                    None => offenders.push(format!("{o}: never completed: {}", attempts(o))),
                }
            }
            eprintln!(
                "[{}] recovery: {} occurrence(s) due during the fault, the last started {worst} ms \
                 after max(fault end, due) (budget {budget} ms)",
                self.name,
                recovery.due.len()
            );
            report(
                &mut failures,
                "4 (every occurrence due during the fault ran within TTL + 5 s of its end)",
                &offenders,
            );
        }

        // 5. Issue 11's "claims deadlock between instances", and panics,
        // show only in the logs.
        let mut offenders = Vec::new();
        for instance in &self.instances {
            for line in instance.log().lines() {
                if line.contains("deadlock detected") || line.contains("panicked at") {
                    offenders.push(format!("{}: {line}", instance.id));
                }
            }
        }
        report(
            &mut failures,
            "5 (no deadlock and no panic in any instance's log)",
            &offenders,
        );

        if failures.is_empty() {
            Ok(executions)
        } else {
            Err(failures)
        }
    }

    /// Seconds since the cluster started, for progress lines.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

fn report(failures: &mut String, invariant: &str, offenders: &[String]) {
    if offenders.is_empty() {
        return;
    }
    const SHOWN: usize = 25;
    let _ = writeln!(
        failures,
        "invariant {invariant}: {} offender(s)",
        offenders.len()
    );
    for offender in offenders.iter().take(SHOWN) {
        let _ = writeln!(failures, "  - {offender}");
    }
    if offenders.len() > SHOWN {
        let _ = writeln!(failures, "  … and {} more", offenders.len() - SHOWN);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for instance in &self.instances {
            let mut proc = instance.proc.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(mut child) = proc.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
            proc.state = State::Exited;
        }
        // Keep the logs for a post-mortem.
        let keep = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join("chaos-logs")
            .join(&self.name);
        let _ = std::fs::remove_dir_all(&keep);
        let _ = std::fs::create_dir_all(&keep);
        for instance in &self.instances {
            let _ = std::fs::copy(
                instance.log_path(),
                keep.join(format!("{}.log", instance.id)),
            );
        }
        if std::thread::panicking() {
            let mut out = String::new();
            for instance in &self.instances {
                let _ = writeln!(
                    out,
                    "\n----- {} ({}), last lines of its log -----\n{}",
                    instance.id,
                    instance.log_path().display(),
                    tail(&instance.log(), 40)
                );
            }
            let _ = writeln!(out, "\nfull logs kept in {}", keep.display());
            let _ = std::io::stderr().write_all(out.as_bytes());
        }
        let roles: Vec<String> = self
            .instances
            .iter()
            .filter_map(|i| i.role.clone())
            .collect();
        if !roles.is_empty() {
            let url = self.db_url.clone();
            let result = blocking_sql(&url, move |mut conn| async move {
                for role in &roles {
                    conn.execute(AssertSqlSafe(format!(
                        "ALTER ROLE \"{role}\" NOLOGIN; \
                         SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'"
                    )))
                    .await?;
                }
                for role in &roles {
                    conn.execute(AssertSqlSafe(format!("DROP ROLE IF EXISTS \"{role}\"")))
                        .await?;
                }
                Ok(())
            });
            if let Err(e) = result {
                let _ = writeln!(
                    std::io::stderr(),
                    "warning: could not drop chaos roles: {e}"
                );
            }
        }
    }
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Epoch milliseconds on this host's clock (the database runs on the same
/// host in CI, and the instances write started_at with it).
pub fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

const DB_NOW: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint";

async fn sql(pool: &PgPool, statement: String) {
    pool.execute(AssertSqlSafe(statement.clone()))
        .await
        .unwrap_or_else(|e| panic!("{statement}: {e}"));
}

/// Runs `work` on its own connection from a thread with its own runtime:
/// usable from `Drop`.
fn blocking_sql<F, Fut>(url: &str, work: F) -> Result<(), String>
where
    F: FnOnce(PgConnection) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), sqlx::Error>>,
{
    let url = url.to_string();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        runtime.block_on(async move {
            let conn = tokio::time::timeout(Duration::from_secs(10), PgConnection::connect(&url))
                .await
                .map_err(|_| "no answer within 10 s".to_string())?
                .map_err(|e| e.to_string())?;
            work(conn).await.map_err(|e| e.to_string())
        })
    })
    .join()
    .unwrap_or_else(|_| Err("thread panicked".into()))
}

/// `postgres://old@host/db?x` with user `user` (no password: the test
/// server trusts local connections).
pub fn with_user(url: &str, user: &str) -> String {
    let start = url.find("://").map_or(0, |i| i + 3);
    let authority_end = url[start..]
        .find(['/', '?'])
        .map_or(url.len(), |i| start + i);
    let host = match url[start..authority_end].rfind('@') {
        Some(at) => &url[start + at + 1..authority_end],
        None => &url[start..authority_end],
    };
    format!("{}{user}@{host}{}", &url[..start], &url[authority_end..])
}

// ---------------------------------------------------------------------------
// faketime
// ---------------------------------------------------------------------------

/// Whether Debian's `faketime` is installed.
pub fn faketime_available() -> bool {
    // Tried a few times: one CI run saw the probe fail once on a machine
    // that had faketime (it creates a semaphore and shared memory in
    // /dev/shm for each run), while two dozen service processes started.
    (0..5).any(|attempt| {
        if attempt > 0 {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        faketime_env("+0s").is_some()
    })
}

/// The environment `faketime -m -f OFFSET` gives its program (libfaketime
/// preloaded, the offset), without its shared-memory handle, which dies
/// with the wrapper; the monotonic clock is left alone so tokio's timers
/// run true (FAKETIME_DONT_FAKE_MONOTONIC, `DONT_FAKE_MONOTONIC` in older
/// releases).
pub fn faketime_env(offset: &str) -> Option<Vec<(String, String)>> {
    let output = Command::new("faketime")
        .args(["-m", "-f", offset, "env"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .output()
        .ok()?;
    if !output.status.success() {
        eprintln!(
            "faketime -m -f {offset} env: {} {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        return None;
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let mut env = Vec::new();
    for line in text.lines() {
        if let Some((key, value)) = line.split_once('=')
            && (key == "LD_PRELOAD" || key == "FAKETIME")
        {
            env.push((key.to_string(), value.to_string()));
        }
    }
    if !env.iter().any(|(k, _)| k == "LD_PRELOAD") {
        return None;
    }
    env.push(("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()));
    env.push(("DONT_FAKE_MONOTONIC".into(), "1".into()));
    Some(env)
}

/// The offset of an instance's clock, from the timestamp of the first line
/// of its current log (tracing's pretty format starts with RFC 3339 UTC)
/// against the harness's line before it.
pub fn log_clock_offset_ms(log: &str) -> Option<i64> {
    let mut harness_ms = None;
    for line in log.lines() {
        if let Some(rest) = line.strip_prefix("===== chaos harness: start #") {
            harness_ms = rest
                .split(" at ")
                .nth(1)
                .and_then(|t| t.trim_end_matches(" ms =====").parse::<i64>().ok());
            continue;
        }
        let stamp = line.split_whitespace().next()?;
        if let Ok(time) = chrono::DateTime::parse_from_rfc3339(stamp) {
            return Some(time.timestamp_millis() - harness_ms?);
        }
    }
    None
}

// ---------------------------------------------------------------------------
// A tiny blocking HTTP client
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
pub struct HttpReply {
    pub status: u16,
    pub body: String,
}

impl HttpReply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// One HTTP/1.1 request without a body, `Connection: close`.
pub fn http_request(addr: &str, method: &str, path: &str, token: Option<&str>) -> HttpReply {
    let mut stream =
        std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: 0\r\n"
    );
    if let Some(token) = token {
        request.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .unwrap_or_else(|e| panic!("{method} {path} on {addr}: {e}"));
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
    });
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    HttpReply { status, body }
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// Counts per key, for progress lines.
pub fn count_by<T, K: Ord>(items: &[T], key: impl Fn(&T) -> K) -> BTreeMap<K, usize> {
    let mut counts = BTreeMap::new();
    for item in items {
        *counts.entry(key(item)).or_insert(0) += 1;
    }
    counts
}
