//! Soak run (issue 4): does the service stay flat over a long run?
//!
//! `cargo bench --bench soak` runs the real service in-process on a SQLite
//! file database for RULED_SOAK_MINUTES (default 30): 1,000 rules due every
//! minute, each job allocating and touching RULED_SOAK_ALLOC_KIB (default
//! 4096) of memory and freeing it, single-job mode, WORKER_COUNT 10 with
//! no cooldown. Every five minutes, and at the end, once that minute's
//! round has finished (so no job's buffer is live), it prints the process
//! RSS and the executions so far; the figures go to BENCHMARKS.md. Nothing
//! asserts a size or a time.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ruled::actions::{
    ActionCall, ActionFuture, ActionHandler, ActionOutput, ActionRegistry, ActionSettings,
};
use ruled::clock::Clock;
use ruled::config::Config;
use ruled::model::ExecutionStatus;
use ruled::service::{Service, ServiceOptions};
use ruled::store::Store;
use serde_json::json;

const RULES: usize = 1_000;

/// Allocates a buffer, writes every page of it (so it is resident), reads
/// it back and frees it: a job with a real memory footprint.
struct AllocAction {
    bytes: usize,
}

impl ActionHandler for AllocAction {
    fn kind(&self) -> &str {
        "alloc"
    }

    fn run<'a>(&'a self, _call: &'a ActionCall) -> ActionFuture<'a> {
        Box::pin(async move {
            let mut buffer = vec![0u8; self.bytes];
            for (i, byte) in buffer.iter_mut().enumerate().step_by(4096) {
                *byte = (i / 4096) as u8;
            }
            let checksum: u64 = buffer.iter().step_by(4096).map(|&b| b as u64).sum();
            tokio::task::yield_now().await;
            Ok(ActionOutput(
                json!({ "bytes": buffer.len(), "checksum": checksum }),
            ))
        })
    }
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

async fn report(store: &Store, started: Instant, label: &str) {
    let counts = store.count_executions_by_status().await.unwrap();
    let count = |status| {
        counts
            .iter()
            .find(|(s, _)| *s == status)
            .map_or(0, |(_, n)| *n)
    };
    println!(
        "| {label} | {:.1} | {} | {} | {} | {} |",
        started.elapsed().as_secs_f64() / 60.0,
        rss_kib() / 1024,
        count(ExecutionStatus::Completed),
        count(ExecutionStatus::Failed),
        counts.iter().map(|(_, n)| n).sum::<i64>(),
    );
}

fn main() {
    let minutes = common::env_or::<u64>("RULED_SOAK_MINUTES", 30);
    let alloc_kib = common::env_or::<u64>("RULED_SOAK_ALLOC_KIB", 4096);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/soak.db", dir.path().display());
        let store = Store::connect(&url).await.unwrap();
        store.migrate().await.unwrap();
        // First due at the next minute, then every minute.
        let now = common::wall_ms();
        let first = (now / 60_000 + 1) * 60_000;
        common::seed(&store, &vec![first; RULES], "* * * * *", "alloc").await;

        let mut registry = ActionRegistry::with_builtins(ActionSettings::default());
        registry.register(Arc::new(AllocAction {
            bytes: alloc_kib as usize * 1024,
        }));
        let config = Config {
            database_url: url.clone(),
            plan_file: dir.path().join("plan.json"),
            shutdown_marker_file: dir.path().join("marker.json"),
            http_addr: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            worker_count: 10,
            master_grace_period: Duration::ZERO,
            // 1,000 jobs a minute through 10 single-job workers: the
            // default 10 s cooldown would allow one job a second.
            worker_cooldown: Duration::ZERO,
            worker_stagger: Duration::ZERO,
            ..Config::default()
        };
        let started = Instant::now();
        let service = Service::start_with(
            config,
            Clock::system(),
            ServiceOptions::new().registry(registry),
        )
        .await
        .unwrap();
        println!(
            "soak: {RULES} rules every minute, {alloc_kib} KiB per job, {minutes} min, WORKER_COUNT 10, single-job mode"
        );
        println!("| at | minutes | RSS MiB | completed | failed | executions |");
        println!("|---|---:|---:|---:|---:|---:|");
        // Rounds are due at each minute from `first`; a round is finished
        // when every occurrence due so far is terminal.
        let rounds_due = || {
            let now = common::wall_ms();
            if now < first { 0 } else { (now - first) / 60_000 + 1 }
        };
        let finished = |rounds: i64| {
            let store = store.clone();
            async move {
                let done: i64 = store
                    .count_executions_by_status()
                    .await
                    .unwrap()
                    .iter()
                    .filter(|(status, _)| status.is_terminal())
                    .map(|(_, n)| n)
                    .sum();
                done >= rounds * RULES as i64
            }
        };
        let mut next_report = 1;
        let mut label = "start";
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let rounds = rounds_due();
            let over = started.elapsed() >= Duration::from_secs(minutes * 60);
            if (rounds >= next_report || over) && finished(rounds).await {
                report(&store, started, if over { "end" } else { label }).await;
                if over {
                    break;
                }
                label = "…";
                next_report = rounds + 5;
            }
        }
        service.shutdown("soak").await.unwrap();
    });
}
