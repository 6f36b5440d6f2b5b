//! A million rules through the real binary (issue 15 part 3).
//!
//! `cargo bench --bench million` seeds `RULED_BENCH_RULES` (1,000,000)
//! branch rules into a fresh SQLite file, all due next year, then runs the
//! release `ruled serve` on it with the defaults (INFO logs to a file,
//! 10 workers, WORKER_COOLDOWN_SECONDS 10, single-job mode):
//!
//! - *cold start*: from spawn until `/readyz` answers 200, with the RSS
//!   then (no plan file yet);
//! - *first snapshot*: until the plan file is written and the writer's
//!   byte count holds still, with the RSS then;
//! - *steady state*: `RULED_BENCH_DUE_PER_SECOND` (5, under the defaults'
//!   capacity of 10 jobs/s) of the rules are made due one after another over
//!   `RULED_BENCH_SECONDS` (60) by an operator's UPDATE, which the
//!   refresher picks up; the plan file's bytes written over the window
//!   (`ruled_plan_write_bytes_total`, snapshots and journal) per finished
//!   job, and the RSS through the window (`VmRSS`, sampled every second,
//!   and `VmHWM`, the peak);
//! - *warm start*: SIGTERM, then the same again with the plan file present.
//!
//! `RULED_BENCH_SCENARIO=drain` times instead a burst through `ruled serve`
//! with its default log level: `RULED_BENCH_DRAIN_JOBS` (10,000) rules due
//! at the spawn, `RULED_BENCH_WORKERS` (50) workers, cooldown 0, no master
//! grace period and no worker stagger, from the spawn (start-up included)
//! until the last execution is completed.
//!
//! Nothing here asserts a figure; they go to BENCHMARKS.md.
//! `RULED_BENCH_KEEP=1` keeps the directory (database, plan file, logs).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use ruled::model::ExecutionStatus;
use ruled::store::Store;

const BIN: &str = env!("CARGO_BIN_EXE_ruled");
const POLL: Duration = Duration::from_millis(100);
const READY_DEADLINE: Duration = Duration::from_secs(600);

/// `rules` branch rules of one brand, branch, yearly rule and noop
/// template, each with one action, due at `next_run_time`; written by
/// SQLite itself from a counter, so the seeding takes seconds, not minutes.
async fn seed(store: &Store, rules: usize, next_run_time: i64) {
    let ids = common::seed(store, &[], "0 0 1 1 *", "noop").await;
    assert!(ids.is_empty());
    // Written an hour ago, as rules that were there before the service
    // started: not a bulk change the refresher's slack still re-reads.
    let now = common::wall_ms() - 3_600_000;
    let series = format!(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {rules} - 1)"
    );
    let id = "printf('00000000-0000-4000-8000-%012x', i)";
    store
        .execute_sql(&format!(
            "{series} INSERT INTO branch_rules (id, branch_id, rule_id, is_active, is_archived, \
             is_force_stopped, is_currently_running, next_run_time, lock_epoch, params, created_at, updated_at) \
             SELECT {id}, (SELECT id FROM branches), (SELECT id FROM rules), TRUE, FALSE, FALSE, FALSE, \
             {next_run_time}, 0, '{{}}', {now}, {now} FROM n"
        ))
        .await
        .unwrap();
    let detail = "printf('00000000-0000-4000-9000-%012x', i)";
    store
        .execute_sql(&format!(
            "{series} INSERT INTO action_details (id, branch_rule_id, action_template_id, position, \
             params, created_at, updated_at) \
             SELECT {detail}, {id}, (SELECT id FROM action_templates), 0, '{{}}', {now}, {now} FROM n"
        ))
        .await
        .unwrap();
}

/// A runtime for the bench's own queries, and a fresh SQLite database in a
/// new directory named from `prefix`, seeded with `rules` rules due at
/// `next_run_time`: the directory, its URL and the store on it.
fn seeded(
    prefix: &str,
    rules: usize,
    next_run_time: i64,
) -> (tokio::runtime::Runtime, tempfile::TempDir, String, Store) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
    let url = format!("sqlite://{}/ruled.db", dir.path().display());
    let store = runtime.block_on(async {
        let store = Store::connect(&url).await.unwrap();
        store.migrate().await.unwrap();
        let seeding = Instant::now();
        seed(&store, rules, next_run_time).await;
        eprintln!("{rules} rules seeded in {:.0?}", seeding.elapsed());
        store
    });
    (runtime, dir, url, store)
}

/// One `ruled serve` child with its files in `dir`.
struct Serve {
    child: Child,
    log: PathBuf,
    started: Instant,
    addr: Option<String>,
}

impl Serve {
    /// `ruled serve` with the defaults but for `settings`.
    fn start(dir: &Path, database_url: &str, run: &str, settings: &[(&str, &str)]) -> Serve {
        let log = dir.join(format!("{run}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(BIN)
            .arg("serve")
            .current_dir(dir)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("DATABASE_URL", database_url)
            .env("HTTP_ADDR", "127.0.0.1:0")
            .env("PLAN_FILE", dir.join("plan.json"))
            .env("SHUTDOWN_MARKER_FILE", dir.join("marker.json"))
            .env("NO_COLOR", "1")
            .envs(settings.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {BIN}: {e}"));
        Serve {
            child,
            log,
            started: Instant::now(),
            addr: None,
        }
    }

    /// The address from the "HTTP API listening on http://…" line.
    fn addr(&mut self) -> Option<String> {
        if self.addr.is_none() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            self.addr = log.split("listening on http://").nth(1).map(|rest| {
                rest.chars()
                    .take_while(|c| !c.is_whitespace() && *c != '\x1b')
                    .collect()
            });
        }
        self.addr.clone()
    }

    fn get(&mut self, path: &str) -> Option<(u16, String)> {
        let addr = self.addr()?;
        http_get(&addr, path)
    }

    /// Waits for `/readyz`: how long it took from the spawn.
    fn wait_ready(&mut self) -> Duration {
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("ruled exited ({status}); log:\n{}", self.tail());
            }
            if let Some((200, _)) = self.get("/readyz") {
                return self.started.elapsed();
            }
            assert!(
                self.started.elapsed() < READY_DEADLINE,
                "not ready after {READY_DEADLINE:?}; log:\n{}",
                self.tail()
            );
            std::thread::sleep(POLL);
        }
    }

    /// `(VmRSS, VmHWM)` in MiB.
    fn rss_mib(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|kib| kib.parse::<u64>().ok())
                .map_or(0, |kib| kib / 1024)
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    /// CPU time the child has used, user and system together.
    fn cpu_seconds(&self) -> f64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // utime and stime are the 14th and 15th fields, counted after the
        // command name, which may hold spaces, in parentheses.
        let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let ticks: f64 = after_name
            .split_whitespace()
            .skip(11)
            .take(2)
            .filter_map(|field| field.parse::<f64>().ok())
            .sum();
        // SAFETY: sysconf only reads a system constant.
        ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
    }

    /// `ruled_plan_write_bytes_total`, every kind together.
    fn plan_bytes_written(&mut self) -> f64 {
        let (_, body) = self.get("/metrics").expect("GET /metrics");
        body.lines()
            .filter(|line| line.starts_with("ruled_plan_write_bytes_total"))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// SIGTERM, then waits for the exit: how long it took.
    fn stop(mut self) -> Duration {
        let asked = Instant::now();
        // SAFETY: kill(2) on a pid we spawned and have not reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        assert!(status.success(), "{status}; log:\n{}", self.tail());
        asked.elapsed()
    }

    fn tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP/1.0 GET (no chunked body to undo): the status and body.
fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map(|(_, body)| body)?;
    Some((status, body.to_string()))
}

async fn completed(store: &Store) -> i64 {
    store
        .count_executions_by_status()
        .await
        .unwrap()
        .into_iter()
        .find(|(status, _)| *status == ExecutionStatus::Completed)
        .map_or(0, |(_, n)| n)
}

fn main() {
    if std::env::var("RULED_BENCH_SCENARIO").is_ok_and(|s| s == "drain") {
        return drain();
    }
    let rules: usize = common::env_or("RULED_BENCH_RULES", 1_000_000);
    let per_second: usize = common::env_or("RULED_BENCH_DUE_PER_SECOND", 5);
    let seconds: usize = common::env_or("RULED_BENCH_SECONDS", 60);
    let (runtime, dir, url, store) = seeded(
        "ruled-bench-million-",
        rules,
        common::wall_ms() + 365 * 86_400_000,
    );

    let mut cold = Serve::start(dir.path(), &url, "cold", &[]);
    let cold_ready = cold.wait_ready();
    let (cold_rss, _) = cold.rss_mib();
    let plan_file = dir.path().join("plan.json");
    eprintln!("cold start: ready after {cold_ready:.1?}, RSS {cold_rss} MiB");

    // The plan file's first snapshot comes after the plan is ready; the
    // window starts once it is written and the writes have settled.
    let mut last = -1.0;
    loop {
        std::thread::sleep(Duration::from_secs(2));
        let written = cold.plan_bytes_written();
        if written > 0.0 && written == last {
            break;
        }
        last = written;
    }
    let settled = cold.started.elapsed();
    let (settled_rss, _) = cold.rss_mib();
    eprintln!("plan file written, writes settled after {settled:.1?}, RSS {settled_rss} MiB");

    // Steady state: an operator makes `due` rules due one after another,
    // in an order unrelated to their ids (SQLite keeps the table in id order).
    let due = per_second * seconds;
    let window_start = common::wall_ms() + 5_000;
    runtime.block_on(store.execute_sql(&format!(
        "WITH ranked AS (SELECT id, ROW_NUMBER() OVER (ORDER BY substr(id, 25)) AS n \
         FROM branch_rules) \
         UPDATE branch_rules SET next_run_time = {window_start} + (ranked.n - 1) * 1000 / {per_second} \
         FROM ranked WHERE ranked.id = branch_rules.id AND ranked.n <= {due}"
    )))
    .unwrap();
    let bytes_before = cold.plan_bytes_written();
    let mut samples = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(seconds as u64 + 300);
    loop {
        std::thread::sleep(Duration::from_secs(1));
        samples.push(cold.rss_mib().0);
        let done = runtime.block_on(completed(&store));
        if done >= due as i64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{done} of {due} completed; log:\n{}",
            cold.tail()
        );
    }
    let bytes = cold.plan_bytes_written() - bytes_before;
    let (rss_end, peak) = cold.rss_mib();
    let plan_file_mib = std::fs::metadata(&plan_file).map_or(0, |m| m.len() >> 20);
    let cold_stop = cold.stop();
    let mut warm = Serve::start(dir.path(), &url, "warm", &[]);
    let warm_ready = warm.wait_ready();
    let (warm_rss, _) = warm.rss_mib();
    let warm_stop = warm.stop();

    samples.sort_unstable();
    let median = samples[samples.len() / 2];
    println!(
        "| rules | cold start: ready | RSS at ready | first snapshot written | RSS then | plan file | jobs in the window | plan-file bytes per job | RSS in the window (median / last / peak) | SIGTERM to exit | warm start: ready | RSS at ready | SIGTERM to exit |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {rules} | {:.1} s | {cold_rss} MiB | {:.1} s | {settled_rss} MiB | {plan_file_mib} MiB | {due} | {:.0} B | {median} / {rss_end} / {peak} MiB | {:.1} s | {:.1} s | {warm_rss} MiB | {:.1} s |",
        cold_ready.as_secs_f64(),
        settled.as_secs_f64(),
        bytes / due as f64,
        cold_stop.as_secs_f64(),
        warm_ready.as_secs_f64(),
        warm_stop.as_secs_f64(),
    );
    runtime.block_on(store.close());
    if std::env::var_os("RULED_BENCH_KEEP").is_some() {
        eprintln!("kept {}", dir.keep().display());
    }
}

/// A burst through the real binary with its default log level (INFO):
/// `RULED_BENCH_DRAIN_JOBS` (10,000) rules due as `ruled serve` starts,
/// WORKER_COUNT `RULED_BENCH_WORKERS` (50), cooldown 0, every state
/// recorded; timed from the spawn, start-up included, until the last
/// execution is completed. MASTER_GRACE_PERIOD_SECONDS and
/// WORKER_STAGGER_SECONDS are 0: their defaults (15 s before the first
/// fetch, workers started one a second) are waits an operator sets for a
/// gentle start, not work, and would be most of the figure.
fn drain() {
    let jobs: usize = common::env_or("RULED_BENCH_DRAIN_JOBS", 10_000);
    let workers: usize = common::env_or("RULED_BENCH_WORKERS", 50);
    let (runtime, dir, url, store) = seeded("ruled-bench-drain-", jobs, common::wall_ms() - 1_000);
    let workers_setting = workers.to_string();
    let mut serve = Serve::start(
        dir.path(),
        &url,
        "drain",
        &[
            ("WORKER_COUNT", &workers_setting),
            ("WORKER_COOLDOWN_SECONDS", "0"),
            ("WORKER_STAGGER_SECONDS", "0"),
            ("MASTER_GRACE_PERIOD_SECONDS", "0"),
        ],
    );
    let mut ready = None;
    let deadline = Duration::from_secs(600);
    let drained = loop {
        if ready.is_none() && matches!(serve.get("/readyz"), Some((200, _))) {
            ready = Some(serve.started.elapsed());
        }
        let done = runtime.block_on(completed(&store));
        if done >= jobs as i64 {
            break serve.started.elapsed();
        }
        assert!(
            serve.started.elapsed() < deadline,
            "{done} of {jobs} completed; log:\n{}",
            serve.tail()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let cpu = serve.cpu_seconds();
    let log = std::fs::read_to_string(&serve.log).unwrap_or_default();
    let stopped = serve.stop();
    let ready = ready.unwrap_or(drained);
    let after_ready = drained.saturating_sub(ready).as_secs_f64();
    println!(
        "| jobs | workers | spawn to last completed | jobs/s, start-up included | ready after | jobs/s after ready | CPU used | log bytes per job | log lines per job | SIGTERM to exit |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {jobs} | {workers} | {:.2} s | {:.0} | {:.2} s | {:.0} | {cpu:.2} s | {:.0} | {:.1} | {:.1} s |",
        drained.as_secs_f64(),
        jobs as f64 / drained.as_secs_f64(),
        ready.as_secs_f64(),
        jobs as f64 / after_ready.max(f64::EPSILON),
        log.len() as f64 / jobs as f64,
        log.lines().count() as f64 / jobs as f64,
        stopped.as_secs_f64(),
    );
    runtime.block_on(store.close());
    if std::env::var_os("RULED_BENCH_KEEP").is_some() {
        eprintln!("kept {}", dir.keep().display());
    }
}
