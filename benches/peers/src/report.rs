//! The heading (date, machine, settings) and the one table of ratios.

use crate::apalis_sqlite::Drain;
use crate::fires::LagSummary;
use crate::ruled::Ruled;

/// What was measured, each `None` when `PEERS_ONLY` left it out.
pub struct Figures {
    pub fires_per_second: usize,
    pub drain_jobs: usize,
    pub tokio_cron: Option<LagSummary>,
    pub apalis_cron: Option<LagSummary>,
    pub apalis_sqlite: Option<Drain>,
    pub ruled: Option<Ruled>,
}

pub fn table(figures: &Figures) {
    let per_second = thousands(figures.fires_per_second as f64);
    println!("| measure | ruled | peer | peer figure | ratio (ruled ÷ peer) |");
    println!("|---|---:|---|---:|---:|");
    let ruled_drain = figures.ruled.as_ref().map(|r| r.drain_jobs_per_second);
    let peer_drain = figures.apalis_sqlite.as_ref().map(Drain::jobs_per_second);
    println!(
        "| drain jobs/s, {} noop jobs, every state recorded (higher is better) | {} | apalis-sqlite | {} | {} |",
        thousands(figures.drain_jobs as f64),
        show(ruled_drain, thousands),
        show(peer_drain, thousands),
        ratio(ruled_drain, peer_drain, "×"),
    );
    let ruled_fires = figures.ruled.as_ref().map(|r| r.fires);
    let peers = [
        ("tokio-cron-scheduler", figures.tokio_cron),
        ("apalis-cron", figures.apalis_cron),
    ];
    for (name, pick) in [
        ("p99", (|l: &LagSummary| l.p99_ms) as fn(&LagSummary) -> f64),
        ("p50", |l: &LagSummary| l.p50_ms),
    ] {
        for (peer, lag) in peers {
            let ours = ruled_fires.as_ref().map(pick);
            let theirs = lag.as_ref().map(pick);
            println!(
                "| start lag {name}, {per_second} fires/s (lower is better) | {} | {peer} | {} | {} |",
                show(ours, milliseconds),
                show(theirs, milliseconds),
                ratio(ours, theirs, ""),
            );
        }
    }
    for (peer, lag) in peers {
        let ours = ruled_fires.map(|l| l.lost as f64);
        let theirs = lag.map(|l| l.lost as f64);
        println!(
            "| fires lost of {} due (lower is better) | {} | {peer} | {} | {} |",
            show(ruled_fires.map(|l| l.fires as f64), thousands),
            show(ours, thousands),
            show(theirs, thousands),
            ratio(ours, theirs, ""),
        );
    }
    println!();
    println!(
        "Ratios are ruled's figure ÷ the peer's. Drain jobs/s: higher is better, a ratio above 1 favours ruled. \
         Start lag and fires lost: lower is better, a ratio below 1 favours ruled; — where a ratio has no meaning \
         (nothing lost on either side, or a figure missing)."
    );
}

/// `Date: … UTC · Machine: …` from /proc and nproc.
pub fn heading() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name"))
        .and_then(|rest| rest.split_once(':'))
        .map_or("unknown CPU".to_string(), |(_, name)| {
            name.trim().to_string()
        });
    let nproc = std::process::Command::new("nproc")
        .output()
        .ok()
        .and_then(|out| {
            String::from_utf8(out.stdout)
                .ok()?
                .trim()
                .parse::<usize>()
                .ok()
        })
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(0);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0);
    format!(
        "Date: {} UTC\nMachine: {model}, nproc {nproc}, MemTotal {mem_kib} kB ({:.1} GiB)",
        chrono::Utc::now().format("%Y-%m-%d %H:%M:%S"),
        mem_kib as f64 / 1024.0 / 1024.0
    )
}

fn show(value: Option<f64>, format: fn(f64) -> String) -> String {
    value.map_or("—".to_string(), format)
}

/// Sub-millisecond precision where it matters: the peers' lags are
/// measured in nanoseconds, ruled's in whole milliseconds.
fn milliseconds(ms: f64) -> String {
    if ms < 10.0 {
        format!("{ms:.2} ms")
    } else {
        format!("{ms:.1} ms")
    }
}

fn ratio(ours: Option<f64>, theirs: Option<f64>, suffix: &str) -> String {
    match (ours, theirs) {
        (Some(ours), Some(theirs)) if theirs > 0.0 && ours.is_finite() && theirs.is_finite() => {
            let r = ours / theirs;
            if r >= 10.0 {
                format!("{r:.1}{suffix}")
            } else if r >= 0.1 {
                format!("{r:.2}{suffix}")
            } else {
                format!("{r:.3}{suffix}")
            }
        }
        (Some(0.0), Some(_)) => "—".to_string(),
        (Some(_), Some(_)) => "∞".to_string(),
        _ => "—".to_string(),
    }
}

/// A whole number with thousands separators: 10,000.
pub fn thousands(value: f64) -> String {
    if !value.is_finite() {
        return value.to_string();
    }
    let digits = format!("{:.0}", value.abs());
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    if value < -0.5 {
        out.insert(0, '-');
    }
    out
}
