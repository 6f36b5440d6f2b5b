//! ruled on the same work, through its own engine bench run as a child
//! (`RULED_BENCH_SCENARIO=peers`): ruled's sqlx and the peers' cannot
//! share one build, and the child measures ruled exactly as its own
//! BENCHMARKS.md figures are measured.

use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::fires::LagSummary;

pub struct Ruled {
    pub fires: LagSummary,
    pub drain_jobs: u64,
    pub drain_seconds: f64,
    pub drain_jobs_per_second: f64,
}

/// Runs the child and reads its two `peers:` lines; the child's other
/// output passes through. `PEERS_RULED_COMMAND` replaces the child (a
/// shell command line), to try the parsing without a release build.
pub async fn run(
    fires_per_second: usize,
    seconds: u64,
    drain_jobs: usize,
    workers: usize,
) -> Ruled {
    let mut command = match std::env::var("PEERS_RULED_COMMAND") {
        Ok(line) => {
            let mut shell = Command::new("sh");
            shell.arg("-c").arg(line);
            shell
        }
        Err(_) => {
            let repo = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
            let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
            cargo
                .args(["bench", "--bench", "engine", "--manifest-path"])
                .arg(format!("{repo}/Cargo.toml"));
            cargo
        }
    };
    let mut child = command
        .env("RULED_BENCH_SCENARIO", "peers")
        .env("RULED_BENCH_BACKENDS", "sqlite")
        .env("RULED_BENCH_WORKERS", workers.to_string())
        .env("RULED_BENCH_FIRES_PER_SECOND", fires_per_second.to_string())
        .env("RULED_BENCH_SECONDS", seconds.to_string())
        .env("RULED_BENCH_DRAIN_JOBS", drain_jobs.to_string())
        // The peers crate's own target directory must not leak into the
        // child, which builds ruled in ruled's.
        .env_remove("CARGO_TARGET_DIR")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("ruled's bench started");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut fires, mut drain) = (None, None);
    while let Some(line) = lines.next_line().await.expect("the child's output") {
        eprintln!("  ruled: {line}");
        if let Some(rest) = line.strip_prefix("peers: ruled lag ") {
            fires = Some(LagSummary {
                fires: field(rest, "fires"),
                lost: field(rest, "lost"),
                p50_ms: field(rest, "p50_ms"),
                p99_ms: field(rest, "p99_ms"),
            });
        } else if let Some(rest) = line.strip_prefix("peers: ruled drain ") {
            drain = Some((
                field(rest, "jobs"),
                field(rest, "seconds"),
                field(rest, "jobs_per_second"),
            ));
        }
    }
    let status = child.wait().await.expect("ruled's bench ended");
    assert!(status.success(), "ruled's bench failed: {status}");
    let fires = fires.expect("a `peers: ruled lag` line");
    let (drain_jobs, drain_seconds, drain_jobs_per_second) =
        drain.expect("a `peers: ruled drain` line");
    Ruled {
        fires,
        drain_jobs,
        drain_seconds,
        drain_jobs_per_second,
    }
}

/// `name=value` out of a `peers:` line.
fn field<T: std::str::FromStr>(line: &str, name: &str) -> T {
    line.split_whitespace()
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no {name}= in {line:?}"))
}
