//! ruled on the same work, through its own engine bench run as a child
//! (`RULED_BENCH_SCENARIO=peers`): ruled's sqlx and the peers' cannot
//! share one build, and the child measures ruled exactly as its own
//! BENCHMARKS.md figures are measured.

use std::path::PathBuf;
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::fires::LagSummary;

pub struct Ruled {
    pub fires: LagSummary,
    pub drain_jobs_per_second: f64,
    /// The two `peers:` lines as the child printed them.
    pub lines: Vec<String>,
}

/// The main crate: two directories up from this one.
pub fn repo() -> PathBuf {
    let path = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    path.canonicalize().unwrap_or(path)
}

/// What runs ruled: `PEERS_RULED_COMMAND` (a shell command line, to try
/// the parsing without building ruled's bench), or ruled's engine bench.
pub fn describe() -> String {
    match std::env::var("PEERS_RULED_COMMAND") {
        Ok(line) => format!("sh -c {line:?} (PEERS_RULED_COMMAND)"),
        Err(_) => format!(
            "cargo bench --manifest-path {}/Cargo.toml --bench engine",
            repo().display()
        ),
    }
}

/// Runs the child and reads its two `peers:` lines; its stderr passes
/// through, and its other stdout lines go to stderr, so that stdout keeps
/// only the report.
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
            let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
            cargo
                .arg("bench")
                .arg("--manifest-path")
                .arg(repo().join("Cargo.toml"))
                .args(["--bench", "engine"]);
            cargo
        }
    };
    // `cargo run` gave this process the peers crate's CARGO_PKG_* and its
    // library path; build scripts that watch those would see a changed
    // environment and rebuild ruled's dependencies on every run.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("CARGO_") && name != "CARGO_HOME" {
            command.env_remove(name.as_ref());
        }
    }
    // Entries `cargo run` added: the peers crate's own build outputs and
    // the toolchain's libraries.
    let added = [
        PathBuf::from(env!("CARGO_MANIFEST_DIR")),
        PathBuf::from(std::env::var_os("RUSTUP_HOME").unwrap_or_default()).join("toolchains"),
    ];
    if let Some(paths) = std::env::var_os("LD_LIBRARY_PATH") {
        let kept: Vec<PathBuf> = std::env::split_paths(&paths)
            .filter(|path| !added.iter().any(|prefix| path.starts_with(prefix)))
            .collect();
        match std::env::join_paths(kept) {
            Ok(joined) if !joined.is_empty() => command.env("LD_LIBRARY_PATH", joined),
            _ => command.env_remove("LD_LIBRARY_PATH"),
        };
    }
    let mut child = command
        .env("RULED_BENCH_SCENARIO", "peers")
        .env("RULED_BENCH_BACKENDS", "sqlite")
        .env("RULED_BENCH_WORKERS", workers.to_string())
        .env("RULED_BENCH_FIRES_PER_SECOND", fires_per_second.to_string())
        .env("RULED_BENCH_SECONDS", seconds.to_string())
        .env("RULED_BENCH_DRAIN_JOBS", drain_jobs.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("ruled's bench started");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut fires, mut drain, mut kept) = (None, None, Vec::new());
    while let Some(line) = lines.next_line().await.expect("the child's output") {
        eprintln!("  ruled: {line}");
        if let Some(rest) = line.strip_prefix("peers: ruled lag ") {
            let due: u64 = field(rest, "fires");
            let lost: u64 = field(rest, "lost");
            fires = Some(LagSummary {
                fires: due,
                observed: due.saturating_sub(lost),
                lost,
                doubles: 0,
                p50_ms: field(rest, "p50_ms"),
                p99_ms: field(rest, "p99_ms"),
                max_ms: f64::NAN,
            });
            kept.push(line.clone());
        } else if let Some(rest) = line.strip_prefix("peers: ruled drain ") {
            // jobs= and seconds= stay in the raw line the report prints.
            drain = Some(field::<f64>(rest, "jobs_per_second"));
            kept.push(line.clone());
        }
    }
    let status = child.wait().await.expect("ruled's bench ended");
    assert!(status.success(), "ruled's bench failed: {status}");
    let fires = fires.expect("a `peers: ruled lag` line from the child");
    let drain_jobs_per_second = drain.expect("a `peers: ruled drain` line from the child");
    Ruled {
        fires,
        drain_jobs_per_second,
        lines: kept,
    }
}

/// `name=value` out of a `peers:` line.
fn field<T: std::str::FromStr>(line: &str, name: &str) -> T {
    line.split_whitespace()
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no {name}= in {line:?}"))
}

#[cfg(test)]
mod tests {
    use super::field;

    #[test]
    fn reads_the_fields_of_a_peers_line() {
        let line = "fires=10000 lost=0 p50_ms=2 p99_ms=4.5";
        assert_eq!(field::<u64>(line, "fires"), 10_000);
        assert_eq!(field::<u64>(line, "lost"), 0);
        assert_eq!(field::<f64>(line, "p50_ms"), 2.0);
        assert_eq!(field::<f64>(line, "p99_ms"), 4.5);
        let drain = "jobs=10000 seconds=1.234 jobs_per_second=8103.7";
        // `jobs=` must not match inside `jobs_per_second=`.
        assert_eq!(field::<u64>(drain, "jobs"), 10_000);
        assert_eq!(field::<f64>(drain, "jobs_per_second"), 8103.7);
    }
}
