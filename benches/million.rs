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

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(value) => value
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?}: not a number")),
        Err(_) => default,
    }
}

fn wall_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// `rules` branch rules of one brand, branch, yearly rule and noop
/// template, each with one action, due a year from now; written by SQLite
/// itself from a counter, so the seeding takes seconds, not minutes.
async fn seed(store: &Store, rules: usize) {
    let ids = common::seed(store, &[], "0 0 1 1 *", "noop").await;
    assert!(ids.is_empty());
    // Written an hour ago, as rules that were there before the service
    // started: not a bulk change the refresher's slack still re-reads.
    let now = wall_ms() - 3_600_000;
    let next_year = now + 365 * 86_400_000;
    let series = format!(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {rules} - 1)"
    );
    let id = "printf('00000000-0000-4000-8000-%012x', i)";
    store
        .execute_sql(&format!(
            "{series} INSERT INTO branch_rules (id, branch_id, rule_id, is_active, is_archived, \
             is_force_stopped, is_currently_running, next_run_time, lock_epoch, params, created_at, updated_at) \
             SELECT {id}, (SELECT id FROM branches), (SELECT id FROM rules), TRUE, FALSE, FALSE, FALSE, \
             {next_year}, 0, '{{}}', {now}, {now} FROM n"
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

/// One `ruled serve` child with its files in `dir`.
struct Serve {
    child: Child,
    log: PathBuf,
    started: Instant,
    addr: Option<String>,
}

impl Serve {
    fn start(dir: &Path, database_url: &str, run: &str) -> Serve {
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
    let rules: usize = env_or("RULED_BENCH_RULES", 1_000_000);
    let per_second: usize = env_or("RULED_BENCH_DUE_PER_SECOND", 5);
    let seconds: usize = env_or("RULED_BENCH_SECONDS", 60);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::Builder::new()
        .prefix("ruled-bench-million-")
        .tempdir()
        .unwrap();
    let url = format!("sqlite://{}/ruled.db", dir.path().display());
    let store = runtime.block_on(async {
        let store = Store::connect(&url).await.unwrap();
        store.migrate().await.unwrap();
        let seeding = Instant::now();
        seed(&store, rules).await;
        eprintln!("{rules} rules seeded in {:.0?}", seeding.elapsed());
        store
    });

    let mut cold = Serve::start(dir.path(), &url, "cold");
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

    // Steady state: an operator makes `due` rules due one after another.
    let due = per_second * seconds;
    let window_start = wall_ms() + 5_000;
    runtime.block_on(store.execute_sql(&format!(
        "UPDATE branch_rules SET next_run_time = {window_start} + (rowid - 1) * 1000 / {per_second} \
         WHERE rowid <= {due}"
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
    let mut warm = Serve::start(dir.path(), &url, "warm");
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
