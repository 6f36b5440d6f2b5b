//! ruled against its Rust peers, on the same machine, one after another in
//! one invocation (issue 15):
//!
//! - **tokio-cron-scheduler** and **apalis-cron**: `PEERS_FIRES_PER_SECOND`
//!   (1,000) jobs, each due every second, for `PEERS_SECONDS` (10) whole
//!   seconds after a warm-up: start lag (job body start − the second it was
//!   due) p50/p99, and fires lost. Neither keeps anything durable.
//! - **apalis with apalis-sqlite**: a drain of `PEERS_DRAIN_JOBS` (10,000)
//!   noop jobs pushed first, `PEERS_WORKERS` (50) concurrent, every
//!   connection in WAL with synchronous=NORMAL: jobs/s until the storage
//!   shows every job done.
//! - **ruled**, through its own engine bench as a child: the same number of
//!   occurrences due on each whole second, each claimed durably before it
//!   starts, and the same drain with every state recorded, on SQLite.
//!
//! Then one table of ratios, ruled ÷ peer. Run from the repository root:
//!
//! ```sh
//! cargo run --release --manifest-path benches/peers/Cargo.toml
//! ```
//!
//! Nothing here asserts a figure; the table goes to BENCHMARKS.md.

mod apalis_cron;
mod apalis_sqlite;
mod fires;
mod ruled;
mod tokio_cron;

#[allow(dead_code)] // `wall_ms` is for ruled's benches
#[path = "../../common/settings.rs"]
mod settings;

use fires::LagSummary;
use settings::env_or;

#[tokio::main]
async fn main() {
    let fires_per_second: usize = env_or("PEERS_FIRES_PER_SECOND", 1_000);
    let seconds: u64 = env_or("PEERS_SECONDS", 10);
    let drain_jobs: usize = env_or("PEERS_DRAIN_JOBS", 10_000);
    let workers: usize = env_or("PEERS_WORKERS", 50);
    let poll_ms: u64 = env_or("PEERS_APALIS_POLL_MS", 10);

    eprintln!("tokio-cron-scheduler: {fires_per_second} jobs every second for {seconds} s");
    let tokio_cron = tokio_cron::fires(fires_per_second, seconds).await;
    eprintln!("  {tokio_cron:?}");
    eprintln!("apalis-cron: {fires_per_second} workers every second for {seconds} s");
    let apalis_cron = apalis_cron::fires(fires_per_second, seconds).await;
    eprintln!("  {apalis_cron:?}");
    eprintln!("apalis-sqlite: drain of {drain_jobs}, {workers} concurrent");
    let apalis_sqlite = apalis_sqlite::drain(drain_jobs, workers, poll_ms).await;
    eprintln!(
        "  {:.0} jobs/s in {:.2} s (journal_mode {}, synchronous {})",
        apalis_sqlite.jobs_per_second(),
        apalis_sqlite.seconds,
        apalis_sqlite.journal_mode,
        apalis_sqlite.synchronous
    );
    eprintln!("ruled: cargo bench --bench engine, RULED_BENCH_SCENARIO=peers");
    let ruled = ruled::run(fires_per_second, seconds, drain_jobs, workers).await;

    println!("{}", machine());
    println!(
        "Settings: {fires_per_second} fires a second for {seconds} s; drain of {drain_jobs} noop jobs, {workers} workers; \
         apalis-sqlite: {} (journal_mode {}, synchronous {}); ruled: SQLite, every state recorded, durable claims, \
         cooldown 0, single-job mode.",
        apalis_sqlite.settings, apalis_sqlite.journal_mode, apalis_sqlite.synchronous
    );
    println!();
    println!("| measure | ruled | peer | peer's figure | ruled ÷ peer | better is |");
    println!("|---|---:|---|---:|---:|---|");
    println!(
        "| drain, {drain_jobs} noop jobs, jobs/s | {:.0} | apalis-sqlite | {:.0} | **{:.1}×** | higher |",
        ruled.drain_jobs_per_second,
        apalis_sqlite.jobs_per_second(),
        ruled.drain_jobs_per_second / apalis_sqlite.jobs_per_second(),
    );
    for (peer, figures) in [
        ("tokio-cron-scheduler", tokio_cron),
        ("apalis-cron", apalis_cron),
    ] {
        lag_rows(fires_per_second, &ruled.fires, peer, &figures);
    }
    println!();
    println!(
        "ruled's drain: {} jobs in {:.2} s from the service's start; fires: {} due, lag measured from the due second \
         (ruled records whole milliseconds).",
        ruled.drain_jobs, ruled.drain_seconds, ruled.fires.fires
    );
}

fn lag_rows(per_second: usize, ruled: &LagSummary, peer: &str, figures: &LagSummary) {
    for (name, ours, theirs) in [
        ("p50", ruled.p50_ms, figures.p50_ms),
        ("p99", ruled.p99_ms, figures.p99_ms),
    ] {
        println!(
            "| start lag {name}, {per_second} fires a second | {ours:.1} ms | {peer} | {theirs:.2} ms | {:.1} | lower |",
            ours / theirs
        );
    }
    println!(
        "| fires lost of {} | {} | {peer} | {} of {} | — | fewer |",
        ruled.fires, ruled.lost, figures.lost, figures.fires
    );
}

/// The date and the machine, for the table's heading.
fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name"))
        .and_then(|rest| rest.split(':').nth(1))
        .map_or("unknown CPU".to_string(), |name| name.trim().to_string());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory_gib = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    format!(
        "{} UTC, {model}, {cores} cores, {memory_gib:.0} GiB",
        chrono::Utc::now().format("%Y-%m-%d %H:%M")
    )
}
