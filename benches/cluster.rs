//! Several `ruled serve` processes on one PostgreSQL database (issue 11).
//!
//! `cargo bench --bench cluster` runs the real binary as child processes,
//! each on a fresh database created next to `RULED_BENCH_POSTGRES_URL` or
//! `RULED_TEST_POSTGRES_URL` (default the local test server) and dropped at
//! the end:
//!
//! - drain: `RULED_BENCH_RULES` (20,000) noop rules due together, first one
//!   instance, then three (WORKER_COUNT 50 each, PARTITION_LEASE_TTL_SECONDS
//!   30): jobs/s = rules / (first process start → the last `completed`
//!   execution's `finished_at`), once a poll every 500 ms finds every rule
//!   completed;
//! - failover: three instances (WORKER_COUNT 20, TTL
//!   `RULED_BENCH_FAILOVER_TTL`, 6 s) on `RULED_BENCH_FAILOVER_RULES` (300)
//!   rules with a 2 s `sleep` action; once every instance runs jobs, the one
//!   with the most `running` executions gets SIGKILL. Failover time is from
//!   the kill until every occurrence it held open has a completed attempt
//!   (the latest of them); also the time until the survivors hold every
//!   partition lease.
//!
//! Every run ends by counting duplicates (occurrences with more than one
//! `completed` execution) and executions left open. Nothing here asserts a
//! time; the figures go to BENCHMARKS.md. Every child is killed when the
//! bench ends or panics.

mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ruled::store::Store;
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, Connection, Executor, PgConnection, PgPool, Row};

const BIN: &str = env!("CARGO_BIN_EXE_ruled");
const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
const YEARLY: &str = "0 0 1 1 *";
const POLL: Duration = Duration::from_millis(100);
/// The drain's progress poll. The drain's time comes from the executions'
/// own `finished_at`, not from the poll, so polling seldom costs no
/// precision, and the server does not share its CPU with the bench.
const DRAIN_POLL: Duration = Duration::from_millis(500);
const DRAIN_DEADLINE: Duration = Duration::from_secs(600);
const FAILOVER_DEADLINE: Duration = Duration::from_secs(180);
const DB_NOW: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

// ---------------------------------------------------------------------------
// A fresh database per run
// ---------------------------------------------------------------------------

struct Database {
    admin_url: String,
    name: String,
    url: String,
}

impl Database {
    async fn create(admin_url: &str, suffix: &str) -> Database {
        let name = format!(
            "ruled_bench_cluster_{}_{suffix}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        admin_sql(admin_url, format!("CREATE DATABASE \"{name}\""))
            .unwrap_or_else(|e| panic!("create database {name} on {admin_url}: {e}"));
        let url = with_database(admin_url, &name);
        let store = Store::connect(&url).await.unwrap();
        store.migrate().await.unwrap();
        store.close().await;
        Database {
            admin_url: admin_url.to_string(),
            name,
            url,
        }
    }

    async fn pool(&self) -> PgPool {
        PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(30))
            .connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url))
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let sql = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name);
        if let Err(e) = admin_sql(&self.admin_url, sql) {
            eprintln!("warning: could not drop database {}: {e}", self.name);
        }
    }
}

/// One statement on the admin database, from a thread with its own runtime
/// (usable from `Drop`, and during a panic).
fn admin_sql(admin_url: &str, sql: String) -> Result<(), String> {
    let admin_url = admin_url.to_string();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        runtime.block_on(async move {
            let mut conn =
                tokio::time::timeout(Duration::from_secs(10), PgConnection::connect(&admin_url))
                    .await
                    .map_err(|_| "no answer within 10 s".to_string())?
                    .map_err(|e| e.to_string())?;
            let result = conn.execute(AssertSqlSafe(sql)).await;
            let _ = conn.close().await;
            result.map(drop).map_err(|e| e.to_string())
        })
    })
    .join()
    .unwrap_or_else(|_| Err("admin thread panicked".into()))
}

/// `postgres://u@h:5432/test?x=y` with database `name` instead of `test`.
fn with_database(url: &str, name: &str) -> String {
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

// ---------------------------------------------------------------------------
// Seeding
// ---------------------------------------------------------------------------

/// `count` branch rules of one brand, one UTC branch and one yearly rule,
/// all due one second ago on the database's clock, each with one action of
/// `kind` (`config` is the template's JSON). One transaction, set-based,
/// then analyzed.
async fn seed(pool: &PgPool, count: usize, kind: &str, config: &str) {
    let mut tx = pool.begin().await.unwrap();
    let brand = uuid::Uuid::new_v4().to_string();
    let branch = uuid::Uuid::new_v4().to_string();
    let rule = uuid::Uuid::new_v4().to_string();
    let template = uuid::Uuid::new_v4().to_string();
    sqlx::query("INSERT INTO brands (id, name) VALUES ($1, 'bench brand')")
        .bind(&brand)
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO branches (id, brand_id, name, timezone) VALUES ($1, $2, 'bench branch', 'UTC')",
    )
    .bind(&branch)
    .bind(&brand)
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO rules (id, brand_id, name, cron_expression) VALUES ($1, $2, 'bench rule', $3)",
    )
    .bind(&rule)
    .bind(&brand)
    .bind(YEARLY)
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query("INSERT INTO action_templates (id, name, kind, config) VALUES ($1, $2, $2, $3)")
        .bind(&template)
        .bind(kind)
        .bind(config)
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "WITH base AS (SELECT {DB_NOW} AS now), \
         br AS ( \
           INSERT INTO branch_rules (id, branch_id, rule_id, is_active, next_run_time, created_at, updated_at) \
           SELECT gen_random_uuid()::text, $1, $2, TRUE, base.now - 1000, base.now, base.now \
           FROM base, generate_series(1, $3::bigint) \
           RETURNING id) \
         INSERT INTO action_details (id, branch_rule_id, action_template_id, position, params) \
         SELECT gen_random_uuid()::text, br.id, $4, 0, '{{}}' FROM br"
    )))
    .bind(&branch)
    .bind(&rule)
    .bind(count as i64)
    .bind(&template)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    // The catalog's statistics, as a database in service has them:
    // autovacuum analyzes a table within a minute of a bulk load, but a
    // drain starts at once. Without them the planner guessed 16,000 of
    // 60,000 action details for a batch of 200 rules and scanned the table
    // in parallel, 19 ms a batch where the index takes 1 (BENCHMARKS.md,
    // 2026-11-29 afternoon). `executions` is left unanalyzed, as a new
    // install's is: analyzed while empty, it made a generic plan of the
    // drain's first second take it for a table of a few rows to the end.
    sqlx::query(
        "ANALYZE brands, branches, rules, brand_rules, action_templates, branch_rules, \
         action_details",
    )
    .execute(pool)
    .await
    .expect("ANALYZE");
}

// ---------------------------------------------------------------------------
// The instances
// ---------------------------------------------------------------------------

struct Instances {
    dir: tempfile::TempDir,
    children: Vec<(String, Option<Child>)>,
}

impl Instances {
    /// Starts `n` instances `bench-a`, `bench-b`, … on `database_url`, each
    /// with its own plan file, marker and log; `env` comes on top of the
    /// common settings.
    fn start(database_url: &str, n: usize, env: &[(&str, String)]) -> Instances {
        let dir = tempfile::Builder::new()
            .prefix("ruled-bench-cluster-")
            .tempdir()
            .unwrap();
        let mut instances = Instances {
            dir,
            children: Vec::new(),
        };
        for i in 0..n {
            let id = format!("bench-{}", (b'a' + i as u8) as char);
            let log = std::fs::File::create(instances.log_path(&id)).unwrap();
            // application_name lets the bench see the instance's backends.
            let sep = if database_url.contains('?') { '&' } else { '?' };
            let child = Command::new(BIN)
                .arg("serve")
                .current_dir(instances.dir.path())
                .env_clear()
                .env("PATH", std::env::var("PATH").unwrap_or_default())
                .env(
                    "DATABASE_URL",
                    format!("{database_url}{sep}application_name={id}"),
                )
                .env("INSTANCE_ID", &id)
                .env("HTTP_ADDR", "127.0.0.1:0")
                .env(
                    "PLAN_FILE",
                    instances.dir.path().join(format!("{id}.plan.json")),
                )
                .env(
                    "SHUTDOWN_MARKER_FILE",
                    instances.dir.path().join(format!("{id}.marker.json")),
                )
                .env("MASTER_GRACE_PERIOD_SECONDS", "0")
                .env("WORKER_COOLDOWN_SECONDS", "0")
                .env("WORKER_STAGGER_SECONDS", "0")
                .env("RUST_LOG", "warn")
                .env("EXECUTION_PLAN_REFRESH_SECONDS", "1")
                .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| panic!("spawn {BIN}: {e}"));
            instances.children.push((id, Some(child)));
        }
        instances
    }

    fn log_path(&self, id: &str) -> PathBuf {
        self.dir.path().join(format!("{id}.log"))
    }

    fn ids(&self) -> Vec<String> {
        self.children.iter().map(|(id, _)| id.clone()).collect()
    }

    /// SIGKILL and reap.
    fn kill9(&mut self, id: &str) {
        let (_, child) = self
            .children
            .iter_mut()
            .find(|(i, _)| i == id)
            .unwrap_or_else(|| panic!("no instance {id}"));
        if let Some(mut child) = child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM to every live instance, then waits for each to exit.
    fn stop(&mut self) {
        for child in self.children.iter().filter_map(|(_, c)| c.as_ref()) {
            // SAFETY: kill(2) on a pid we spawned and have not reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        for (id, child) in &mut self.children {
            if let Some(mut c) = child.take() {
                loop {
                    if let Ok(Some(_)) = c.try_wait() {
                        break;
                    }
                    if Instant::now() > deadline {
                        eprintln!("{id} did not exit within 60 s of SIGTERM: killed");
                        let _ = c.kill();
                        let _ = c.wait();
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }

    /// Panics, with the tail of its log, if an instance exited on its own.
    fn assert_alive(&mut self) {
        let mut dead = None;
        for (id, child) in &mut self.children {
            if let Some(c) = child
                && let Ok(Some(status)) = c.try_wait()
            {
                *child = None;
                dead = Some((id.clone(), status));
                break;
            }
        }
        if let Some((id, status)) = dead {
            panic!(
                "{id} exited on its own ({status}); its log ends:\n{}",
                self.tail(&id, 40)
            );
        }
    }

    fn tail(&self, id: &str, n: usize) -> String {
        let log = std::fs::read_to_string(self.log_path(id)).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// WARN and ERROR lines per instance (RUST_LOG=warn logs nothing else).
    fn log_lines(&self) -> BTreeMap<String, usize> {
        self.children
            .iter()
            .map(|(id, _)| {
                let log = std::fs::read_to_string(self.log_path(id)).unwrap_or_default();
                (id.clone(), log.lines().count())
            })
            .collect()
    }
}

impl Drop for Instances {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            if let Some(mut c) = child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        if std::thread::panicking() {
            let mut out = String::new();
            for (id, _) in &self.children {
                let _ = writeln!(
                    out,
                    "\n----- {id}, last lines of its log -----\n{}",
                    self.tail(id, 30)
                );
            }
            let _ = std::io::stderr().write_all(out.as_bytes());
        }
    }
}

// ---------------------------------------------------------------------------
// Database views
// ---------------------------------------------------------------------------

async fn scalar(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar::<_, i64>(sql)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Completed executions, duplicates included: a range of the partial index
/// of finished executions, without a sort.
async fn completed_executions(pool: &PgPool) -> i64 {
    scalar(
        pool,
        "SELECT count(*) FROM executions WHERE status = 'completed' AND finished_at IS NOT NULL",
    )
    .await
}

/// Occurrences with a completed execution.
async fn completed_occurrences(pool: &PgPool) -> i64 {
    scalar(
        pool,
        "SELECT count(*) FROM (SELECT DISTINCT branch_rule_id, scheduled_for FROM executions \
         WHERE status = 'completed') AS done",
    )
    .await
}

/// Branch rules without a completed execution that ruled is done with:
/// not due again, not locked, not running, nothing open.
async fn given_up(pool: &PgPool) -> i64 {
    scalar(
        pool,
        "SELECT count(*) FROM branch_rules br \
         WHERE NOT EXISTS (SELECT 1 FROM executions e WHERE e.branch_rule_id = br.id \
                           AND e.status = 'completed') \
           AND EXISTS (SELECT 1 FROM executions e WHERE e.branch_rule_id = br.id) \
           AND NOT EXISTS (SELECT 1 FROM executions e WHERE e.branch_rule_id = br.id \
                           AND e.finished_at IS NULL) \
           AND br.lock_holder IS NULL AND NOT br.is_currently_running \
           AND br.next_run_time > (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
    )
    .await
}

/// Occurrences with more than one completed execution.
async fn duplicates(pool: &PgPool) -> i64 {
    scalar(
        pool,
        "SELECT count(*) FROM (SELECT branch_rule_id, scheduled_for FROM executions \
         WHERE status = 'completed' GROUP BY branch_rule_id, scheduled_for HAVING count(*) > 1) AS d",
    )
    .await
}

/// Executions not finished (no finished_at, or an open status).
async fn open_executions(pool: &PgPool) -> i64 {
    scalar(
        pool,
        "SELECT count(*) FROM executions WHERE finished_at IS NULL \
         OR status IN ('requested', 'scheduled', 'running')",
    )
    .await
}

async fn group_count(pool: &PgPool, sql: &'static str) -> BTreeMap<String, i64> {
    sqlx::query(sql)
        .fetch_all(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .map(|row| (row.get::<String, _>(0), row.get::<i64, _>(1)))
        .collect()
}

async fn by_status(pool: &PgPool) -> BTreeMap<String, i64> {
    group_count(
        pool,
        "SELECT status, count(*) FROM executions GROUP BY status",
    )
    .await
}

async fn completed_by_owner(pool: &PgPool) -> BTreeMap<String, i64> {
    group_count(
        pool,
        "SELECT COALESCE(owner, '-'), count(*) FROM executions WHERE status = 'completed' GROUP BY 1",
    )
    .await
}

async fn running_by_owner(pool: &PgPool) -> BTreeMap<String, i64> {
    group_count(
        pool,
        "SELECT COALESCE(owner, '-'), count(*) FROM executions \
         WHERE status = 'running' AND finished_at IS NULL GROUP BY 1",
    )
    .await
}

/// Live partition leases per holder, judged on the database's clock.
async fn leases_by_holder(pool: &PgPool) -> BTreeMap<String, i64> {
    group_count(
        pool,
        "SELECT holder, count(*) FROM partition_leases WHERE holder IS NOT NULL \
         AND expires_at > (extract(epoch FROM clock_timestamp()) * 1000)::bigint GROUP BY holder",
    )
    .await
}

/// Everything the bench knows, for a run that did not finish.
async fn diagnose(pool: &PgPool, instances: &Instances) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "executions by status: {:?}", by_status(pool).await);
    let _ = writeln!(
        out,
        "completed by owner: {:?}",
        completed_by_owner(pool).await
    );
    let _ = writeln!(out, "running by owner: {:?}", running_by_owner(pool).await);
    let _ = writeln!(out, "live leases: {:?}", leases_by_holder(pool).await);
    let _ = writeln!(
        out,
        "branch rules locked: {}, running flag: {}, not yet due: {}",
        scalar(
            pool,
            "SELECT count(*) FROM branch_rules WHERE lock_holder IS NOT NULL"
        )
        .await,
        scalar(
            pool,
            "SELECT count(*) FROM branch_rules WHERE is_currently_running"
        )
        .await,
        scalar(
            pool,
            "SELECT count(*) FROM branch_rules WHERE next_run_time > \
             (extract(epoch FROM clock_timestamp()) * 1000)::bigint"
        )
        .await,
    );
    for id in instances.ids() {
        let _ = writeln!(
            out,
            "----- {id}, last lines of its log -----\n{}",
            instances.tail(&id, 20)
        );
    }
    out
}

fn thousands(n: i64) -> String {
    let digits = n.abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

fn shares(map: &BTreeMap<String, i64>) -> String {
    map.iter()
        .map(|(k, v)| format!("{k} {}", thousands(*v)))
        .collect::<Vec<_>>()
        .join(", ")
}

// ---------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------

/// One row of the summary table.
struct Line {
    run: String,
    instances: usize,
    rules: String,
    workers: usize,
    ttl: String,
    figure: String,
    duplicates: i64,
    open: i64,
    jobs_per_s: Option<f64>,
    drained: bool,
}

async fn drain(admin_url: &str, rules: usize, n: usize) -> Line {
    const WORKERS: usize = 50;
    let db = Database::create(admin_url, &format!("drain{n}")).await;
    let pool = db.pool().await;
    seed(&pool, rules, "noop", "{}").await;
    let total = rules as i64;

    let started = Instant::now();
    let started_ms = common::wall_ms();
    let mut instances = Instances::start(&db.url, n, &[("WORKER_COUNT", WORKERS.to_string())]);
    let mut last_report = Instant::now();
    let mut previous = -1;
    let done = loop {
        // A plain count first: the distinct count sorts every completed
        // execution (127 ms at 42,000 rows, 2026-11-29), which every 100 ms
        // took half a core from the server under test.
        let completed = completed_executions(&pool).await;
        if completed >= total {
            let done = completed_occurrences(&pool).await;
            if done >= total {
                break done;
            }
        }
        // No progress since the last poll: has ruled given up on the rest
        // (ended without a completed attempt, not due again, nothing in
        // flight)? Then waiting longer measures nothing.
        if completed == previous {
            let done = completed_occurrences(&pool).await;
            if given_up(&pool).await == total - done {
                break done;
            }
        }
        previous = completed;
        instances.assert_alive();
        if started.elapsed() > DRAIN_DEADLINE {
            panic!(
                "{n} instance(s): only {completed} of {total} rules completed after {:?}\n{}",
                DRAIN_DEADLINE,
                diagnose(&pool, &instances).await
            );
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            eprintln!(
                "  {n} instance(s), {:.0} s: {completed} of {total} completed",
                started.elapsed().as_secs_f64()
            );
            last_report = Instant::now();
        }
        tokio::time::sleep(DRAIN_POLL).await;
    };
    // From the first process's start to the last completed job, as the
    // executions recorded it: exact whatever the poll's interval.
    let last_finish: i64 = scalar(
        &pool,
        "SELECT COALESCE(max(finished_at), 0) FROM executions WHERE status = 'completed'",
    )
    .await;
    let elapsed = Duration::from_millis(u64::try_from(last_finish - started_ms).unwrap_or(0));
    let dups = duplicates(&pool).await;
    let open = open_executions(&pool).await;
    let owners = completed_by_owner(&pool).await;
    let leases = leases_by_holder(&pool).await;
    let first_finish: i64 = scalar(
        &pool,
        "SELECT COALESCE(min(finished_at), 0) FROM executions WHERE status = 'completed'",
    )
    .await;
    let statuses = by_status(&pool).await;
    let errors = group_count(
        &pool,
        "SELECT status || ': ' || COALESCE(error, '-'), count(*) FROM executions \
         WHERE status <> 'completed' GROUP BY 1",
    )
    .await;
    instances.stop();
    let open_after_stop = open_executions(&pool).await;
    let dups_after_stop = duplicates(&pool).await;
    let log_lines = instances.log_lines();
    drop(instances);
    pool.close().await;

    eprintln!(
        "drain, {n} instance(s): {:.2} s; executions by status {statuses:?}; completed by \
         owner {}; live leases at the end {}; log lines (WARN+) {log_lines:?}; after SIGTERM: \
         {open_after_stop} open, {dups_after_stop} duplicates",
        elapsed.as_secs_f64(),
        shares(&owners),
        shares(&leases),
    );
    let rate = done as f64 / elapsed.as_secs_f64();
    let mut figure = if done >= total {
        format!(
            "drain {:.2} s, **{} jobs/s** (first job done {:.1} s after start)",
            elapsed.as_secs_f64(),
            thousands(rate.round() as i64),
            (first_finish - started_ms) as f64 / 1000.0
        )
    } else {
        format!(
            "**did not drain: {} of {} rules never completed** ({}; not retried, next run a \
             year on); the {} that completed took {:.2} s, {} jobs/s",
            thousands(total - done),
            thousands(total),
            errors
                .iter()
                .map(|(e, n)| format!("{n} × {e}"))
                .collect::<Vec<_>>()
                .join("; "),
            thousands(done),
            elapsed.as_secs_f64(),
            thousands(rate.round() as i64),
        )
    };
    if n > 1 {
        let _ = write!(figure, "; completed by {}", shares(&owners));
    }
    Line {
        run: "drain, noop".into(),
        instances: n,
        rules: thousands(total),
        workers: WORKERS,
        ttl: "30 s".into(),
        figure,
        duplicates: dups.max(dups_after_stop),
        open: open.max(open_after_stop),
        jobs_per_s: Some(rate),
        drained: done >= total,
    }
}

async fn failover(admin_url: &str, rules: usize, ttl: f64, sleep_ms: u64) -> Line {
    const WORKERS: usize = 20;
    const N: usize = 3;
    let db = Database::create(admin_url, "failover").await;
    let pool = db.pool().await;
    seed(&pool, rules, "sleep", &format!("{{\"ms\": {sleep_ms}}}")).await;
    let total = rules as i64;

    let started = Instant::now();
    let mut instances = Instances::start(
        &db.url,
        N,
        &[
            ("WORKER_COUNT", WORKERS.to_string()),
            ("PARTITION_LEASE_TTL_SECONDS", ttl.to_string()),
        ],
    );
    // Work is flowing: every instance runs jobs (or, failing that within
    // 30 s, at least one does).
    let running = loop {
        instances.assert_alive();
        let running = running_by_owner(&pool).await;
        let busy = running.values().filter(|n| **n > 0).count();
        if busy == N || (busy > 0 && started.elapsed() > Duration::from_secs(30)) {
            break running;
        }
        if started.elapsed() > Duration::from_secs(120) {
            panic!(
                "no instance ran a job within 120 s\n{}",
                diagnose(&pool, &instances).await
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let flowing_after = started.elapsed();
    let leases_before = leases_by_holder(&pool).await;
    let (victim, victim_running) = running
        .iter()
        .max_by_key(|(id, n)| (**n, std::cmp::Reverse((*id).clone())))
        .map(|(id, n)| (id.clone(), *n))
        .unwrap();
    let kill_ms = common::wall_ms();
    let killed = Instant::now();
    instances.kill9(&victim);

    // Statements the victim had sent still land: wait until its backends
    // are gone before reading what it held.
    loop {
        let backends: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
                .bind(&victim)
                .fetch_one(&pool)
                .await
                .unwrap();
        if backends == 0 || killed.elapsed() > Duration::from_secs(10) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let held = sqlx::query(
        "SELECT branch_rule_id, scheduled_for FROM executions \
         WHERE owner = $1 AND (finished_at IS NULL OR status IN ('requested', 'scheduled', 'running'))",
    )
    .bind(&victim)
    .fetch_all(&pool)
    .await
    .unwrap();
    let held_rules: Vec<String> = held.iter().map(|r| r.get(0)).collect();
    let held_due: Vec<i64> = held.iter().map(|r| r.get(1)).collect();
    // The instances run with the default PARTITION_COUNT. The table makes a
    // partition's row on its first claim, so a count read now may still
    // miss some when the kill comes early: the survivors then held all 64
    // and never matched the 63 counted, and the run failed at its deadline
    // with every occurrence done.
    let partitions = i64::from(ruled::config::Config::default().partition_count);

    let mut leases_moved: Option<Duration> = None;
    let mut held_done: Option<i64> = None;
    let mut all_done: Option<Duration> = None;
    loop {
        if leases_moved.is_none() {
            let leases = leases_by_holder(&pool).await;
            let survivors: i64 = leases
                .iter()
                .filter(|(holder, _)| **holder != victim)
                .map(|(_, n)| n)
                .sum();
            if survivors == partitions && partitions > 0 {
                leases_moved = Some(killed.elapsed());
            }
        }
        if held_done.is_none() {
            let row = sqlx::query(
                "SELECT count(DISTINCT (e.branch_rule_id, e.scheduled_for)), max(e.finished_at) \
                 FROM executions e \
                 JOIN unnest($1::text[], $2::bigint[]) AS h(rule, due) \
                   ON e.branch_rule_id = h.rule AND e.scheduled_for = h.due \
                 WHERE e.status = 'completed'",
            )
            .bind(&held_rules)
            .bind(&held_due)
            .fetch_one(&pool)
            .await
            .unwrap();
            let (done, latest): (i64, Option<i64>) = (row.get(0), row.get(1));
            if done as usize == held_rules.len() {
                held_done = Some(latest.unwrap_or(kill_ms) - kill_ms);
            }
        }
        if all_done.is_none() && completed_occurrences(&pool).await >= total {
            all_done = Some(killed.elapsed());
        }
        if leases_moved.is_some() && held_done.is_some() && all_done.is_some() {
            break;
        }
        instances.assert_alive();
        if killed.elapsed() > FAILOVER_DEADLINE {
            panic!(
                "failover incomplete {FAILOVER_DEADLINE:?} after killing {victim} \
                 (leases moved: {leases_moved:?}, held occurrences done: {held_done:?} ms, \
                 all done: {all_done:?})\n{}",
                diagnose(&pool, &instances).await
            );
        }
        tokio::time::sleep(POLL).await;
    }
    let dups = duplicates(&pool).await;
    let open = open_executions(&pool).await;
    let statuses = by_status(&pool).await;
    let errors = group_count(
        &pool,
        "SELECT COALESCE(split_part(error, ':', 1), '-'), count(*) FROM executions \
         WHERE status <> 'completed' GROUP BY 1",
    )
    .await;
    let leases_after = leases_by_holder(&pool).await;
    instances.stop();
    let open_after_stop = open_executions(&pool).await;
    drop(instances);
    pool.close().await;

    let (leases_moved, all_done) = (leases_moved.unwrap(), all_done.unwrap());
    let held_done = held_done.unwrap();
    eprintln!(
        "failover: work flowing {:.1} s after start, running {}; leases before {}; killed {victim} \
         holding {} open occurrence(s); survivors hold all {partitions} partitions {:.2} s after \
         the kill (then {}); its occurrences all completed {:.2} s after; every rule completed \
         {:.2} s after; executions by status {statuses:?}; not completed by error {errors:?}; \
         after SIGTERM {open_after_stop} open",
        flowing_after.as_secs_f64(),
        shares(&running),
        shares(&leases_before),
        held_rules.len(),
        leases_moved.as_secs_f64(),
        shares(&leases_after),
        held_done as f64 / 1000.0,
        all_done.as_secs_f64(),
    );
    Line {
        run: format!("kill -9, sleep {:.0} s", sleep_ms as f64 / 1000.0),
        instances: N,
        rules: thousands(total),
        workers: WORKERS,
        ttl: format!("{ttl} s"),
        figure: format!(
            "killed the busiest ({victim_running} running, {} open occurrences): all of them \
             completed **{:.2} s** after the kill; survivors held all {partitions} partitions \
             after **{:.2} s**; every rule done after {:.2} s",
            held_rules.len(),
            held_done as f64 / 1000.0,
            leases_moved.as_secs_f64(),
            all_done.as_secs_f64(),
        ),
        duplicates: dups,
        open: open.max(open_after_stop),
        jobs_per_s: None,
        drained: true,
    }
}

fn main() {
    let admin_url = std::env::var("RULED_BENCH_POSTGRES_URL")
        .or_else(|_| std::env::var("RULED_TEST_POSTGRES_URL"))
        .unwrap_or_else(|_| DEFAULT_POSTGRES_URL.into());
    let rules: usize = common::env_or("RULED_BENCH_RULES", 20_000);
    let failover_rules: usize = common::env_or("RULED_BENCH_FAILOVER_RULES", 300);
    let ttl: f64 = common::env_or("RULED_BENCH_FAILOVER_TTL", 6.0);
    let sleep_ms: u64 = common::env_or("RULED_BENCH_SLEEP_MS", 2_000);

    if let Err(e) = admin_sql(&admin_url, "SELECT 1".into()) {
        eprintln!("PostgreSQL not reachable at {admin_url}: {e}; nothing to measure");
        std::process::exit(1);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let lines = runtime.block_on(async {
        vec![
            drain(&admin_url, rules, 1).await,
            drain(&admin_url, rules, 3).await,
            failover(&admin_url, failover_rules, ttl, sleep_ms).await,
        ]
    });
    println!("| run | instances | rules | workers each | lease TTL | result | duplicates | open |");
    println!("|---|---:|---:|---:|---:|---|---:|---:|");
    for l in &lines {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            l.run, l.instances, l.rules, l.workers, l.ttl, l.figure, l.duplicates, l.open
        );
    }
    if let (Some(one), Some(three)) = (lines[0].jobs_per_s, lines[1].jobs_per_s) {
        let verdict = if !(lines[0].drained && lines[1].drained) {
            "not measurable: a run did not drain (rate of the completed jobs only)"
        } else if three >= one {
            "met"
        } else {
            "MISSED"
        };
        println!(
            "\nthree instances drain at {:.2}× the rate of one ({three:.0} against {one:.0} jobs/s): \
             target (at least as fast) {verdict}",
            three / one
        );
    }
    let duplicates: i64 = lines.iter().map(|l| l.duplicates).sum();
    let open: i64 = lines.iter().map(|l| l.open).sum();
    println!(
        "duplicates {duplicates}, open executions {open}: target (0) {}",
        if duplicates == 0 && open == 0 {
            "met"
        } else {
            "MISSED"
        }
    );
    for l in lines.iter().filter(|l| !l.drained) {
        println!(
            "{} instance(s): NOT every rule completed (see its row)",
            l.instances
        );
    }
}
