//! ruled against its Rust peers, on the same machine, one after another in
//! one invocation (issue 15):
//!
//! - **tokio-cron-scheduler** and **apalis-cron**: `PEERS_FIRES_PER_SECOND`
//!   (1,000) jobs in one process, each on its own six-field every-second
//!   cron, for `PEERS_SECONDS` (10) whole seconds after a warm-up second:
//!   start lag (job body start − the second it was due) p50/p99, and fires
//!   lost (due in the window, never started). Neither keeps anything
//!   durable.
//! - **apalis with apalis-sqlite**: a drain of `PEERS_DRAIN_JOBS` (10,000)
//!   noop jobs pushed first into a fresh SQLite file, `PEERS_WORKERS` (50)
//!   concurrent, every connection in WAL with synchronous=NORMAL: jobs/s
//!   from the worker's start until the storage shows every job done.
//! - **ruled**, through its own engine bench as a child
//!   (`RULED_BENCH_SCENARIO=peers`): the same number of occurrences due on
//!   each whole second, each claimed durably before it starts, and the same
//!   drain with every state recorded, on SQLite.
//!
//! Then the raw figures and one table of ratios, ruled ÷ peer, headed by
//! the date and the machine. Run from the repository root (the first run
//! builds ruled's bench in release, a few minutes):
//!
//! ```sh
//! cargo run --release --manifest-path benches/peers/Cargo.toml
//! ```
//!
//! Settings, from the environment: `PEERS_FIRES_PER_SECOND`,
//! `PEERS_SECONDS`, `PEERS_DRAIN_JOBS`, `PEERS_WORKERS` as above;
//! `PEERS_APALIS_WORKERS` (= `PEERS_WORKERS`), `PEERS_APALIS_BATCH` (50),
//! `PEERS_APALIS_POLL_MS` (1), `PEERS_APALIS_MAX_CONNECTIONS` (1),
//! `PEERS_APALIS_ANALYZE` (1) set up apalis-sqlite (the defaults were its
//! fastest here: see `apalis_sqlite`); `PEERS_APALIS_CRON_MONITOR=0` spawns each apalis-cron
//! worker on its own task instead of one `Monitor`;
//! `PEERS_TOKIO_CRON_PHASE_MS` is how long after a whole second
//! tokio-cron-scheduler is started (see `tokio_cron`);
//! `PEERS_ONLY=tokio-cron,apalis-cron,apalis-sqlite,ruled` runs a subset;
//! `PEERS_RULED_COMMAND` replaces ruled's bench with a shell command line
//! that prints its two `peers:` lines, to try the parsing.
//!
//! Nothing here asserts a figure; the table goes to BENCHMARKS.md.

mod apalis_cron;
mod apalis_sqlite;
mod fires;
mod report;
mod ruled;
mod tokio_cron;

#[allow(dead_code)] // `wall_ms` is for ruled's benches
#[path = "../../common/settings.rs"]
mod settings;

use std::time::Duration;

use settings::env_or;

#[tokio::main]
async fn main() {
    let fires_per_second: usize = env_or("PEERS_FIRES_PER_SECOND", 1_000);
    let seconds: u64 = env_or("PEERS_SECONDS", 10);
    let drain_jobs: usize = env_or("PEERS_DRAIN_JOBS", 10_000);
    let workers: usize = env_or("PEERS_WORKERS", 50);
    // apalis-sqlite's fastest set-up found here; see `apalis_sqlite`.
    let tuning = apalis_sqlite::Tuning {
        concurrency: workers,
        workers: env_or("PEERS_APALIS_WORKERS", workers).clamp(1, workers.max(1)),
        batch_size: env_or("PEERS_APALIS_BATCH", 50),
        poll_ms: env_or("PEERS_APALIS_POLL_MS", 1),
        max_connections: env_or("PEERS_APALIS_MAX_CONNECTIONS", 1),
        analyze: env_or::<u8>("PEERS_APALIS_ANALYZE", 1) != 0,
    };
    let cron_monitored = env_or::<u8>("PEERS_APALIS_CRON_MONITOR", 1) != 0;
    let phase = Duration::from_millis(env_or("PEERS_TOKIO_CRON_PHASE_MS", 1));
    let only = std::env::var("PEERS_ONLY").ok();
    let runs = |name: &str| {
        only.as_deref()
            .is_none_or(|list| list.split(',').any(|n| n.trim() == name))
    };

    let tokio_cron = if runs("tokio-cron") {
        eprintln!(
            "tokio-cron-scheduler: {fires_per_second} jobs every second, {seconds} s after a warm-up"
        );
        let lag = tokio_cron::fires(fires_per_second, seconds, phase).await;
        eprintln!("  {}", lag.line());
        Some(lag)
    } else {
        None
    };
    let apalis_cron = if runs("apalis-cron") {
        eprintln!(
            "apalis-cron: {fires_per_second} workers every second, {seconds} s after a warm-up"
        );
        let lag = apalis_cron::fires(fires_per_second, seconds, cron_monitored).await;
        eprintln!("  {}", lag.line());
        Some(lag)
    } else {
        None
    };
    let apalis_sqlite = if runs("apalis-sqlite") {
        eprintln!("apalis-sqlite: drain of {drain_jobs} noop jobs, {workers} concurrent");
        let drain = apalis_sqlite::drain(drain_jobs, tuning).await;
        eprintln!(
            "  {:.0} jobs/s in {:.3} s (journal_mode {}, synchronous {})",
            drain.jobs_per_second(),
            drain.seconds,
            drain.journal_mode,
            drain.synchronous
        );
        for error in &drain.errors {
            eprintln!("  a worker ended: {error}");
        }
        Some(drain)
    } else {
        None
    };
    let ruled = if runs("ruled") {
        eprintln!("ruled: {}, RULED_BENCH_SCENARIO=peers", ruled::describe());
        Some(ruled::run(fires_per_second, seconds, drain_jobs, workers).await)
    } else {
        None
    };

    println!("# ruled and its Rust peers");
    println!();
    println!("{}", report::heading());
    println!(
        "Settings: PEERS_FIRES_PER_SECOND={fires_per_second} PEERS_SECONDS={seconds} \
         PEERS_DRAIN_JOBS={drain_jobs} PEERS_WORKERS={workers}"
    );
    println!();
    println!("## Raw figures");
    println!();
    println!("```");
    if let Some(lag) = &tokio_cron {
        println!(
            "tokio-cron-scheduler 0.15.1: {fires_per_second} Job::new_async(\"* * * * * *\") in one JobScheduler, \
             started {} ms after a whole second",
            phase.as_millis()
        );
        println!("  {}", lag.line());
    }
    if let Some(lag) = &apalis_cron {
        println!(
            "apalis-cron 1.0.0: {fires_per_second} workers, each a CronScheduler on \"* * * * * *\", {}; \
             lag from the tick's own timestamp",
            if cron_monitored {
                "registered in one Monitor, stopped through run_with_signal"
            } else {
                "each spawned on its own task, stopped through run_until"
            }
        );
        println!("  {}", lag.line());
    }
    if let Some(drain) = &apalis_sqlite {
        println!("apalis-sqlite 1.0.0: {}", tuning.describe());
        println!(
            "  jobs={} seconds={:.3} jobs_per_second={:.1} journal_mode={} synchronous={}",
            drain.jobs,
            drain.seconds,
            drain.jobs_per_second(),
            drain.journal_mode,
            drain.synchronous
        );
        if !drain.errors.is_empty() {
            println!(
                "  {} worker(s) ended during the drain: {}",
                drain.errors.len(),
                drain.errors.join("; ")
            );
        }
    }
    if let Some(ruled) = &ruled {
        println!(
            "ruled: {} with RULED_BENCH_SCENARIO=peers RULED_BENCH_BACKENDS=sqlite",
            ruled::describe()
        );
        for line in &ruled.lines {
            println!("  {line}");
        }
    }
    println!("```");
    if tokio_cron.is_some() || apalis_cron.is_some() {
        println!();
        println!(
            "Start lag: the moment a job's body starts − the whole second it was due (every job is due on .000). \
             observed = fires that started in the measured window; doubles = a job seen twice for one second \
             (a fire more than a second late would show as one lost and one double)."
        );
    }
    println!();
    println!("## ruled ÷ peer");
    println!();
    report::table(&report::Figures {
        fires_per_second,
        drain_jobs,
        tokio_cron,
        apalis_cron,
        apalis_sqlite,
        ruled,
    });
}
