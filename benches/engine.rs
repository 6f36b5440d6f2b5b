//! Engine throughput and dispatch lag (issue 3).
//!
//! `cargo bench --bench engine` runs, on SQLite (WAL) and, when reachable,
//! PostgreSQL (`RULED_BENCH_POSTGRES_URL`, default the local test server):
//!
//! - burst: 10,000 rules due at the same instant, noop actions, single-job
//!   mode with cooldown 0, WORKER_COUNT 10 and 50: time to drain, jobs/s,
//!   start lag (started_at − scheduled_for) p50/p99 — every state recorded;
//! - spread: 1,000 rules due one every 10 ms: start lag p50/p99.
//!
//! `RULED_BENCH_BACKENDS=sqlite` skips PostgreSQL; `RULED_BENCH_WORKERS=10,200`
//! sets the burst's worker counts; `RULED_BENCH_LOG=info` (any tracing
//! filter) prints the service's log on stderr; `RULED_BENCH_SHOW_LATE=<ms>`
//! prints each job that started later than that, with the lag at each
//! recorded state; `RULED_BENCH_CLAIM_LEAD_MS=500` claims that far ahead
//! (MASTER_CLAIM_LEAD_SECONDS).
//!
//! `RULED_BENCH_SCENARIO=growth` measures instead how the drain rate holds
//! as work grows (issue 15): bursts of 1,000, 10,000 and 100,000, and the
//! 10,000 burst again over `RULED_BENCH_HISTORY` (default 10,000,000) rows
//! of finished executions already in the table, checkpointed and synced
//! before the drain starts (`RULED_BENCH_HISTORY_PAUSE=<s>` waits that
//! long after, to attach a profiler to the drain alone). Each case but the
//! 1,000 burst runs `RULED_BENCH_REPEAT` (3) times, interleaved with
//! 10,000 drains on an empty table; the medians are compared.
//!
//! `RULED_BENCH_SCENARIO=peers` is ruled's side of `benches/peers` (issue
//! 15): occurrences due on every whole second, and one drain, on SQLite
//! (on PostgreSQL alone with `RULED_BENCH_BACKENDS=postgres`).
//!
//! Each run's database is dropped when the run ends.
//!
//! Nothing here asserts a time; the figures go to BENCHMARKS.md.

mod common;

use std::time::{Duration, Instant};

use ruled::clock::Clock;
use ruled::config::Config;
use ruled::model::*;
use ruled::service::Service;
use ruled::store::Store;
use uuid::Uuid;

const BURST: usize = 10_000;
const SPREAD: usize = 1_000;
const SPREAD_STEP_MS: i64 = 10;

fn config(database_url: &str, dir: &std::path::Path, workers: usize) -> Config {
    Config {
        database_url: database_url.to_string(),
        plan_file: dir.join("plan.json"),
        shutdown_marker_file: dir.join("marker.json"),
        master_grace_period: Duration::ZERO,
        worker_count: workers,
        worker_cooldown: Duration::ZERO,
        worker_stagger: Duration::ZERO,
        // More than one tick's cap: the burst needs several fetches anyway.
        // RULED_BENCH_ACTION_DETAILS_CAP changes it, to see what rules past
        // the cap cost (their workers read their steps from the database).
        plan_action_details_cap: common::env_or("RULED_BENCH_ACTION_DETAILS_CAP", 20_000),
        // A free port: the bench must not collide with a running ruled.
        http_addr: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        // RULED_BENCH_CLAIM_LEAD_MS: MASTER_CLAIM_LEAD_SECONDS, in ms (the
        // service's default, 0, unless set).
        master_claim_lead: Duration::from_millis(common::env_or("RULED_BENCH_CLAIM_LEAD_MS", 0)),
        ..Config::default()
    }
}

struct Run {
    drain: Duration,
    /// From the service start to the first job started: start-up and the
    /// first plan read, inside `drain`.
    first_start: Millis,
    lags: Vec<Millis>,
    /// Bytes the plan file and its journal took during the drain (the
    /// snapshot at shutdown not included).
    plan_bytes: u64,
}

/// [`run_until`] that must see every occurrence completed within ten
/// minutes.
async fn run(url: &str, workers: usize, due: Vec<Millis>, history: usize) -> Run {
    let occurrences = due.len();
    let run = run_until(url, workers, due, history, Duration::from_secs(600)).await;
    assert_eq!(run.lags.len(), occurrences, "the run did not finish");
    run
}

/// Starts a service on `url`, seeds `due` (over `history` finished
/// executions of the same rules), waits until every execution is
/// completed or `limit` has passed, and reads the lags of the completed
/// ones back from the executions table.
async fn run_until(
    url: &str,
    workers: usize,
    due: Vec<Millis>,
    history: usize,
    limit: Duration,
) -> Run {
    let store = prepare(url, &due, history).await;
    let run = drain(&store, url, workers, due.len(), limit).await;
    store.close().await;
    discard(url).await;
    run
}

/// A migrated database on `url` with a rule due at each of `due`, over
/// `history` finished executions of the same rules, settled.
async fn prepare(url: &str, due: &[Millis], history: usize) -> Store {
    let store = Store::connect(url).await.unwrap();
    store.migrate().await.unwrap();
    let ids = common::seed(&store, due, "0 0 1 1 *", "noop").await;
    if history > 0 {
        let seeding = Instant::now();
        seed_history(&store, &ids, history).await;
        eprintln!(
            "{history} rows of history written in {:.0} s",
            seeding.elapsed().as_secs_f64()
        );
        rearm(&store).await;
    }
    store
}

/// Every rule due as a drain starts, not as the seeding or the last drain
/// left it (the lag measures the engine, not the minutes the history took
/// to write), over the history settled.
async fn rearm(store: &Store) {
    store
        .execute_sql(&format!(
            "UPDATE branch_rules SET next_run_time = {}",
            common::wall_ms() - 1_000
        ))
        .await
        .unwrap();
    settle_history(store).await;
    // RULED_BENCH_HISTORY_PAUSE=<s>: time to attach a profiler to the
    // drain alone, after minutes of history inserts.
    let pause: u64 = common::env_or("RULED_BENCH_HISTORY_PAUSE", 0);
    if pause > 0 {
        eprintln!(
            "pausing {pause} s before the drain; pid {}",
            std::process::id()
        );
        tokio::time::sleep(Duration::from_secs(pause)).await;
    }
}

/// Starts a service on `store`'s database, waits until `total` executions
/// requested since its start are completed or `limit` has passed, stops
/// it, and reads the lags of the completed ones back.
async fn drain(store: &Store, url: &str, workers: usize, total: usize, limit: Duration) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let total = total as i64;
    let started = Instant::now();
    let started_ms = common::wall_ms();
    let service = Service::start(config(url, dir.path(), workers), Clock::system())
        .await
        .unwrap();
    let mut progress = Progress::default();
    loop {
        let completed = completed_since(store, started_ms).await;
        if completed >= total || started.elapsed() >= limit {
            break;
        }
        tokio::time::sleep(progress.pause(started.elapsed(), completed, total)).await;
    }
    let drain = started.elapsed();
    let plan_bytes = match service.directory().writer() {
        Some(writer) => ruled::actors::ask(&writer, ruled::messages::WriterMsg::Stats)
            .await
            .map_or(0, |stats| stats.bytes_written),
        None => 0,
    };
    service.shutdown("bench").await.unwrap();
    let mut lags = Vec::with_capacity(total as usize);
    let mut first_started_at = Millis::MAX;
    let mut cursor = None;
    // RULED_BENCH_SHOW_LATE=<ms>: each job that started later than that,
    // with the lag at each recorded state, to see where a tail comes from.
    let show_late: Millis = common::env_or("RULED_BENCH_SHOW_LATE", Millis::MAX);
    loop {
        let filter = ruled::store::ExecutionFilter {
            limit: 1_000,
            from: Some(started_ms),
            after: cursor,
            ..ruled::store::ExecutionFilter::default()
        };
        let page = store.list_executions(&filter).await.unwrap();
        if page.is_empty() {
            break;
        }
        for execution in &page {
            assert!(execution.scheduled_at.is_some() && execution.finished_at.is_some());
            let started_at = execution.started_at.unwrap();
            first_started_at = first_started_at.min(started_at);
            lags.push(started_at - execution.scheduled_for);
            if started_at - execution.scheduled_for > show_late {
                let due = execution.scheduled_for;
                eprintln!(
                    "late: due at +{} ms; requested +{}, scheduled +{}, started +{}, finished +{} ms",
                    due - started_ms,
                    execution.requested_at - due,
                    execution.scheduled_at.unwrap() - due,
                    started_at - due,
                    execution.finished_at.unwrap() - due,
                );
            }
        }
        cursor = filter.next_cursor(&page);
        if cursor.is_none() {
            break;
        }
    }
    assert!(lags.len() <= total as usize, "one execution per occurrence");
    lags.sort();
    Run {
        drain,
        first_start: first_started_at - started_ms,
        lags,
        plan_bytes,
    }
}

/// When to count the completed executions again. Every count reads the
/// whole finished part of the burst, so counting every 20 ms made the
/// bench's own reader grow with the burst: in a 100,000 drain it took more
/// CPU than the writer. The pause is a quarter of the time the rest should
/// take at the rate seen so far (start-up left out), between 20 ms and
/// half a second: a few hundred counts per drain, and the end still seen
/// within 20 ms unless the rate quadruples in the last half second.
#[derive(Default)]
struct Progress {
    /// The first count that saw a completed job, and when.
    first: Option<(Duration, i64)>,
}

impl Progress {
    const MIN: Duration = Duration::from_millis(20);
    const MAX: Duration = Duration::from_millis(500);

    fn pause(&mut self, elapsed: Duration, completed: i64, total: i64) -> Duration {
        let Some((since, from)) = self.first else {
            if completed > 0 {
                self.first = Some((elapsed, completed));
            }
            return Self::MIN;
        };
        let done = completed - from;
        let took = elapsed.saturating_sub(since);
        if done <= 0 || took.is_zero() {
            return Self::MIN;
        }
        let rest = took.mul_f64((total - completed) as f64 / done as f64);
        (rest / 4).clamp(Self::MIN, Self::MAX)
    }
}

/// Executions completed since `since`: a range on the partial
/// (status, requested_at, id) index of finished executions, read from the
/// index alone (without `finished_at IS NOT NULL` SQLite took the
/// requested_at index and looked each row up), so a long history costs
/// nothing here.
async fn completed_since(store: &Store, since: Millis) -> i64 {
    // `$1` binds on both backends, as in the store's own shared statements.
    const COMPLETED_SINCE: &str = "SELECT count(*) FROM executions \
        WHERE status = 'completed' AND finished_at IS NOT NULL AND requested_at >= $1";
    match store {
        Store::Sqlite(pool) => sqlx::query_scalar(COMPLETED_SINCE)
            .bind(since)
            .fetch_one(pool)
            .await
            .unwrap(),
        Store::Postgres(pool) => sqlx::query_scalar(COMPLETED_SINCE)
            .bind(since)
            .fetch_one(pool)
            .await
            .unwrap(),
    }
}

/// `count` completed executions of `rules` (round robin), one every
/// 250 ms before the last 30 days ended an hour ago, written by the
/// database itself in one statement per million rows.
async fn seed_history(store: &Store, rules: &[Uuid], count: usize) {
    store
        .execute_sql("CREATE TABLE bench_history_rules (k BIGINT PRIMARY KEY, id TEXT NOT NULL)")
        .await
        .unwrap();
    for (chunk, ids) in rules.chunks(500).enumerate() {
        let rows: Vec<String> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| format!("({}, '{id}')", chunk * 500 + i))
            .collect();
        store
            .execute_sql(&format!(
                "INSERT INTO bench_history_rules (k, id) VALUES {}",
                rows.join(", ")
            ))
            .await
            .unwrap();
    }
    let end = common::wall_ms() - 3_600_000;
    let start = end - count as i64 * 250;
    let (series, id) = match store {
        Store::Sqlite(_) => (
            "WITH RECURSIVE n(i) AS (SELECT {from} UNION ALL SELECT i + 1 FROM n WHERE i < {to} - 1)",
            "printf('00000000-0000-4000-8000-%012x', i)",
        ),
        Store::Postgres(_) => (
            "WITH n(i) AS (SELECT generate_series({from}::BIGINT, {to}::BIGINT - 1))",
            "'00000000-0000-4000-8000-' || lpad(to_hex(i), 12, '0')",
        ),
    };
    const STEP: usize = 1_000_000;
    for from in (0..count).step_by(STEP) {
        let to = (from + STEP).min(count);
        let series = series
            .replace("{from}", &from.to_string())
            .replace("{to}", &to.to_string());
        let at = format!("({start} + i * 250)");
        store
            .execute_sql(&format!(
                "{series} INSERT INTO executions (id, branch_rule_id, scheduled_for, status, attempt, \
                 owner, lock_epoch, requested_at, scheduled_at, started_at, finished_at) \
                 SELECT {id}, r.id, {at}, 'completed', 1, 'history', 1, {at}, {at} + 2, {at} + 5, {at} + 9 \
                 FROM n JOIN bench_history_rules r ON r.k = i % {rules}",
                rules = rules.len()
            ))
            .await
            .unwrap();
    }
    store
        .execute_sql("DROP TABLE bench_history_rules")
        .await
        .unwrap();
}

/// The history as a service running for months finds it: copied out of
/// the WAL into the database file and on disk. Straight after the
/// inserts, the first drain paid for the seeding's last checkpoints and
/// its dirty pages (7,595 against 8,875 jobs/s, BENCHMARKS.md, *The
/// history settled*), which is the bench's set-up, not the engine.
async fn settle_history(store: &Store) {
    let settling = Instant::now();
    let statement = match store {
        Store::Sqlite(_) => "PRAGMA wal_checkpoint(TRUNCATE)",
        Store::Postgres(_) => "CHECKPOINT",
    };
    store.execute_sql(statement).await.unwrap();
    let synced = std::process::Command::new("sync").status();
    assert!(synced.is_ok_and(|status| status.success()), "sync failed");
    eprintln!(
        "history settled in {:.1} s",
        settling.elapsed().as_secs_f64()
    );
}

fn percentile(sorted: &[Millis], p: f64) -> Millis {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// Each backend's label and base URL: a scenario's database is created
/// next to it ([`fresh`]) and dropped when its run ends ([`discard`]).
async fn backends() -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let dir = tempfile::tempdir().unwrap().keep();
    out.push((
        "SQLite (WAL)",
        format!("sqlite://{}/bench.db", dir.display()),
    ));
    if std::env::var("RULED_BENCH_BACKENDS").is_ok_and(|b| !b.contains("postgres")) {
        return out;
    }
    let admin = std::env::var("RULED_BENCH_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    if let Ok(admin_store) = Store::connect(&admin).await {
        admin_store.close().await;
        let name = format!("ruled_bench_{}", Uuid::new_v4().simple());
        let base = admin
            .rsplit_once('/')
            .map_or(admin.as_str(), |(base, _)| base);
        out.push(("PostgreSQL", format!("{base}/{name}")));
    } else {
        eprintln!("PostgreSQL not reachable at {admin}: SQLite only");
    }
    out
}

fn main() {
    // RULED_BENCH_LOG=<filter> shows the service's own log lines, with their
    // times, on stderr: where a run's start-up or drain spends its time.
    if let Ok(filter) = std::env::var("RULED_BENCH_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .init();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        match std::env::var("RULED_BENCH_SCENARIO").as_deref() {
            Ok("growth") => return growth().await,
            Ok("peers") => return peers().await,
            _ => {}
        }
        println!(
            "| backend | scenario | workers | jobs | drain | first job | jobs/s | lag p50 | lag p99 |"
        );
        println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
        for (label, base_url) in backends().await {
            for &workers in &worker_counts() {
                let url = fresh(&base_url, &format!("burst{workers}")).await;
                let due = vec![common::wall_ms() - 1_000; BURST];
                let result = run(&url, workers, due, 0).await;
                report(label, "burst", workers, &result);
            }
            let url = fresh(&base_url, "spread").await;
            let start = common::wall_ms() + 2_000;
            let due = (0..SPREAD as i64)
                .map(|i| start + i * SPREAD_STEP_MS)
                .collect();
            let result = run(&url, 10, due, 0).await;
            report(label, "spread 10 ms", 10, &result);
        }
    });
}

/// The drain rate as the burst and the history grow, against the 10,000
/// burst on an empty table. One drain of each told little on a shared
/// 2-core guest: the same binary's 10,000 drain ran at 6,030 and at 8,042
/// jobs/s within minutes, so a 100,000 burst measured +28% against one and
/// −21% against another. So each case but the 1,000 start-up one runs
/// `RULED_BENCH_REPEAT` (3) times, interleaved with 10,000 drains on an
/// empty table, and the medians are compared: the bursts alternate 10,000
/// and 100,000, then each drain over the history (re-armed and settled
/// before each) is followed by a 10,000 drain on a fresh database, so a
/// machine that slows down during the minutes of history inserts slows
/// both sides.
async fn growth() {
    let history: usize = common::env_or("RULED_BENCH_HISTORY", 10_000_000);
    let repeat: usize = common::env_or("RULED_BENCH_REPEAT", 3);
    assert!(repeat > 0, "RULED_BENCH_REPEAT: at least one run");
    println!(
        "| backend | workers | burst | history rows | run | drain | jobs/s | lag p50 | lag p99 | plan file B/job |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut medians = Vec::new();
    for (label, base_url) in backends().await {
        for &workers in &worker_counts() {
            let mut rates: Vec<((usize, usize), Vec<f64>)> = Vec::new();
            let mut record = |burst: usize, rows: usize, run: usize, result: &Run| {
                let rate = result.lags.len() as f64 / result.drain.as_secs_f64();
                println!(
                    "| {label} | {workers} | {burst} | {rows} | {run} | {:.2} s | {rate:.0} | {} ms | {} ms | {:.0} |",
                    result.drain.as_secs_f64(),
                    percentile(&result.lags, 0.50),
                    percentile(&result.lags, 0.99),
                    result.plan_bytes as f64 / burst as f64,
                );
                match rates.iter_mut().find(|(case, _)| *case == (burst, rows)) {
                    Some((_, runs)) => runs.push(rate),
                    None => rates.push(((burst, rows), vec![rate])),
                }
            };
            let burst_run = async |burst: usize| {
                let url = fresh(&base_url, &format!("growth{workers}_{burst}")).await;
                run(&url, workers, vec![common::wall_ms() - 1_000; burst], 0).await
            };
            record(1_000, 0, 1, &burst_run(1_000).await);
            for n in 1..=repeat {
                record(BURST, 0, n, &burst_run(BURST).await);
                record(100_000, 0, n, &burst_run(100_000).await);
            }
            // RULED_BENCH_HISTORY=0 leaves the history case out: its drains
            // would be 10,000 bursts on an empty table, counted as the base.
            if history == 0 {
                medians.push((label, workers, rates));
                continue;
            }
            let url = fresh(&base_url, &format!("growth{workers}_history")).await;
            let due = vec![common::wall_ms() - 1_000; BURST];
            let store = prepare(&url, &due, history).await;
            for n in 1..=repeat {
                if n > 1 {
                    rearm(&store).await;
                }
                let result = drain(&store, &url, workers, BURST, Duration::from_secs(600)).await;
                assert_eq!(result.lags.len(), BURST, "the run did not finish");
                record(BURST, history, n, &result);
                record(BURST, 0, repeat + n, &burst_run(BURST).await);
            }
            store.close().await;
            discard(&url).await;
            medians.push((label, workers, rates));
        }
    }
    println!();
    println!("| backend | workers | burst | history rows | runs | median jobs/s | vs 10,000 |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (label, workers, rates) in medians {
        let median = |runs: &[f64]| {
            let mut sorted = runs.to_vec();
            sorted.sort_by(f64::total_cmp);
            let middle = sorted.len() / 2;
            match sorted.len() % 2 {
                0 => (sorted[middle - 1] + sorted[middle]) / 2.0,
                _ => sorted[middle],
            }
        };
        let base = rates
            .iter()
            .find(|(case, _)| *case == (BURST, 0))
            .map(|(_, runs)| median(runs))
            .unwrap();
        for ((burst, rows), runs) in &rates {
            let rate = median(runs);
            println!(
                "| {label} | {workers} | {burst} | {rows} | {} | {rate:.0} | {:+.0}% |",
                runs.len(),
                (rate / base - 1.0) * 100.0,
            );
        }
    }
}

/// ruled's side of the peer comparison (`benches/peers`), on the peers'
/// work: `RULED_BENCH_FIRES_PER_SECOND` occurrences due on every whole
/// second for `RULED_BENCH_SECONDS` seconds, each claimed durably before it
/// starts; then a `RULED_BENCH_DRAIN_JOBS` burst with every state recorded.
/// The peers crate reads the two `peers:` lines.
async fn peers() {
    let fires_per_second: usize = common::env_or("RULED_BENCH_FIRES_PER_SECOND", 1_000);
    let seconds: i64 = common::env_or("RULED_BENCH_SECONDS", 10);
    let drain_jobs: usize = common::env_or("RULED_BENCH_DRAIN_JOBS", BURST);
    let workers = worker_counts()[0];
    // RULED_BENCH_BACKENDS=postgres runs it on PostgreSQL alone.
    let backends = backends().await;
    let only_postgres = std::env::var("RULED_BENCH_BACKENDS").is_ok_and(|b| b == "postgres");
    let wanted = if only_postgres {
        "PostgreSQL"
    } else {
        "SQLite (WAL)"
    };
    let (backend, base_url) = backends
        .into_iter()
        .find(|(label, _)| *label == wanted)
        .unwrap_or_else(|| panic!("{wanted} is not reachable"));

    // The first whole second far enough ahead that the service has read
    // its plan: a fire is due on .000, as a cron peer's is.
    let first = (common::wall_ms() / 1_000 + 3) * 1_000;
    let due: Vec<Millis> = (0..seconds * fires_per_second as i64)
        .map(|i| first + i / fires_per_second as i64 * 1_000)
        .collect();
    // A fire not run half a minute after the last one was due counts as lost.
    let limit =
        Duration::from_millis((first - common::wall_ms() + seconds * 1_000 + 30_000) as u64);
    // RULED_BENCH_SECONDS=0 runs the drain alone (to profile it).
    if !due.is_empty() {
        let fires = due.len();
        let url = fresh(&base_url, "peers_fires").await;
        let fired = run_until(&url, workers, due, 0, limit).await;
        report(backend, "fires every second", workers, &fired);
        println!(
            "peers: ruled lag fires={fires} lost={} p50_ms={} p99_ms={}",
            fires - fired.lags.len(),
            percentile(&fired.lags, 0.50),
            percentile(&fired.lags, 0.99),
        );
    }

    // RULED_BENCH_DRAIN_HISTORY puts that many finished executions under
    // the drain, to profile the growth scenario's history case alone.
    let history: usize = common::env_or("RULED_BENCH_DRAIN_HISTORY", 0);
    let url = fresh(&base_url, "peers_drain").await;
    let drained = run(
        &url,
        workers,
        vec![common::wall_ms() - 1_000; drain_jobs],
        history,
    )
    .await;
    report(backend, "burst", workers, &drained);
    println!(
        "peers: ruled drain jobs={} seconds={:.3} jobs_per_second={:.1}",
        drained.lags.len(),
        drained.drain.as_secs_f64(),
        drained.lags.len() as f64 / drained.drain.as_secs_f64(),
    );
}

/// WORKER_COUNT values of the burst: 10 and 50, or the comma-separated
/// list in `RULED_BENCH_WORKERS` (to look at how the engine scales).
fn worker_counts() -> Vec<usize> {
    std::env::var("RULED_BENCH_WORKERS")
        .ok()
        .map(|list| {
            list.split(',')
                .map(|n| {
                    n.trim()
                        .parse()
                        .expect("RULED_BENCH_WORKERS: a list of numbers")
                })
                .collect()
        })
        .unwrap_or_else(|| vec![10, 50])
}

/// A new empty database next to `base_url` for one scenario.
async fn fresh(base_url: &str, suffix: &str) -> String {
    if let Some(path) = base_url.strip_prefix("sqlite://") {
        return format!("sqlite://{}.{suffix}.db", path.trim_end_matches(".db"));
    }
    let (server, name) = base_url.rsplit_once('/').unwrap();
    let scenario = format!("{name}_{suffix}");
    on_server(server, &format!("CREATE DATABASE {scenario}")).await;
    format!("{server}/{scenario}")
}

/// Drops a run's database. Left behind, they added up: 83 PostgreSQL
/// databases of ten thousand rows and more on the server in one afternoon,
/// and a 4 GB SQLite file in the temporary directory for each run over the
/// 10M-row history.
async fn discard(url: &str) {
    if let Some(path) = url.strip_prefix("sqlite://") {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{path}{suffix}"));
        }
        return;
    }
    let (server, name) = url.rsplit_once('/').unwrap();
    on_server(
        server,
        &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
    )
    .await;
}

/// Runs `sql` on the PostgreSQL `server`'s `test` database.
async fn on_server(server: &str, sql: &str) {
    let admin = Store::connect(&format!("{server}/test")).await.unwrap();
    admin.execute_sql(sql).await.unwrap();
    admin.close().await;
}

fn report(backend: &str, scenario: &str, workers: usize, run: &Run) {
    let jobs = run.lags.len();
    println!(
        "| {backend} | {scenario} | {workers} | {jobs} | {:.2} s | {} ms | {:.0} | {} ms | {} ms |",
        run.drain.as_secs_f64(),
        run.first_start,
        jobs as f64 / run.drain.as_secs_f64(),
        percentile(&run.lags, 0.50),
        percentile(&run.lags, 0.99),
    );
}
