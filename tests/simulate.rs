//! Issue 13: `ruled simulate`, the production decisions on seed 003's
//! logical clock.
//!
//! - The binary prints the same bytes whatever the host's time zone, and
//!   its table and JSON agree with each other.
//! - A bad argument stops it with a message naming the flag, and nothing
//!   on stdout.
//! - The centrepiece: the simulation of the demo rules and a real run of
//!   the service on a real database make the same decisions, occurrence by
//!   occurrence, over three days that include Sydney's change from AEDT to
//!   AEST. The real run is a series of short up windows on the service's
//!   own `Clock` (tokio's paused clock does not mix with a real database,
//!   see `common`); everything between them is "down" for the simulation.
//! - A week of 1,000 rules every 15 minutes (672,000 occurrences) simulates
//!   to the end; its speed is a benchmark, measured by the ignored test at
//!   the bottom, not asserted.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use common::process::{Install, stderr, stdout};
use common::service::{ready_ids, start_service_on_clock, test_config, without_delays};
use common::{TestDb, eventually};
use ruled::actors::ask;
use ruled::clock::{Clock, millis_to_utc};
use ruled::cluster::Ownership;
use ruled::commands::demo::{demo_data, load_demo};
use ruled::commands::simulate::{SimulateArgs, simulation_of};
use ruled::config::Config;
use ruled::messages::{LeaseMsg, MasterMsg};
use ruled::model::*;
use ruled::plan::ExecutionPlan;
use ruled::plan::simulate::{DecisionKind, Report, simulate};
use ruled::service::Service;
use ruled::store::Store;
use serde_json::{Value, json};
use uuid::Uuid;

fn at(text: &str) -> Millis {
    DateTime::parse_from_rfc3339(text)
        .unwrap_or_else(|e| panic!("{text}: {e}"))
        .with_timezone(&Utc)
        .timestamp_millis()
}

fn utc(ms: Millis) -> String {
    millis_to_utc(ms)
        .format("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string()
}

// ---------------------------------------------------------------------------
// 1. Byte-identical across host time zones
// ---------------------------------------------------------------------------

/// The issue's own example week.
const ISSUE_WEEK: [&str; 15] = [
    "simulate",
    "--demo",
    "--from",
    "2026-03-28T00:00:00Z",
    "--to",
    "2026-04-04T00:00:00Z",
    "--down",
    "2026-03-29T01:00Z/PT3H",
    "--fail-rate",
    "0.1",
    "--duration",
    "200ms",
    "--seed",
    "7",
    // The format goes after this.
    "--format",
];

/// A week in which Sydney leaves daylight saving time: 2026-04-05 03:00
/// AEDT becomes 02:00 AEST (2026-04-04T16:00Z).
const DST_WEEK: [&str; 15] = [
    "simulate",
    "--demo",
    "--from",
    "2026-03-30T00:00:00Z",
    "--to",
    "2026-04-06T00:00:00Z",
    "--down",
    "2026-04-01T01:00Z/PT3H",
    "--fail-rate",
    "0.1",
    "--duration",
    "200ms",
    "--seed",
    "7",
    "--format",
];

/// `ruled simulate` under the host time zone `tz`; its stdout.
fn simulate_under(install: &Install, tz: &str, week: &[&str], format: &str) -> Vec<u8> {
    let mut args = week.to_vec();
    args.push(format);
    let output = install
        .command(&args)
        // The host's worker count must not decide anything either.
        .env("WORKER_COUNT", "10")
        .env("TZ", tz)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "TZ={tz} {args:?}: {}",
        stderr(&output)
    );
    assert!(!output.stdout.is_empty(), "TZ={tz} {args:?}: no output");
    output.stdout
}

/// Equal bytes, or a panic showing the first line that differs (the
/// outputs are megabytes: `assert_eq!` would print them whole).
fn assert_same_bytes(what: &str, a: &[u8], b: &[u8]) {
    if a == b {
        return;
    }
    let (a, b) = (String::from_utf8_lossy(a), String::from_utf8_lossy(b));
    let line = a
        .lines()
        .zip(b.lines())
        .position(|(x, y)| x != y)
        .unwrap_or_else(|| a.lines().count().min(b.lines().count()));
    panic!(
        "{what}: the outputs differ ({} vs {} bytes), first at line {}:\n  {:?}\n  {:?}",
        a.len(),
        b.len(),
        line + 1,
        a.lines().nth(line),
        b.lines().nth(line)
    );
}

/// The demo's branch rule of `rule` (0 heartbeat, 1 restock, 2 nightly)
/// in the branch of `zone`.
fn demo_branch_rule(zone: &str, rule: usize) -> Uuid {
    let data = demo_data(0).unwrap();
    let branch = data
        .branches
        .iter()
        .find(|b| b.timezone.as_deref() == Some(zone))
        .unwrap();
    data.branch_rules
        .iter()
        .find(|r| r.branch_id == branch.id && r.rule_id == data.rules[rule].id)
        .unwrap()
        .id
}

/// Checks the JSON report against itself and the table: every decision
/// is of a known kind, the totals count them, every run ends, and the
/// table's lines and totals are the JSON's.
fn check_report(week: &str, table: &[u8], json_bytes: &[u8]) -> Value {
    let report: Value = serde_json::from_slice(json_bytes)
        .unwrap_or_else(|e| panic!("{week}: the JSON does not parse: {e}"));
    let decisions = report["decisions"].as_array().unwrap();
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for d in decisions {
        *kinds
            .entry(d["decision"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    let kind = |name: &str| kinds.get(name).copied().unwrap_or(0);
    let total = |name: &str| report[name].as_u64().unwrap() as usize;
    assert_eq!(total("runs"), kind("run"), "{week}: {kinds:?}");
    assert_eq!(total("skipped"), kind("skipped"), "{week}: {kinds:?}");
    assert_eq!(total("retries"), kind("retry"), "{week}: {kinds:?}");
    let known = [
        "run",
        "skipped",
        "retry",
        "finished",
        "held_by_window",
        "buffered",
        "lost",
    ];
    assert_eq!(
        decisions.len(),
        known.iter().map(|k| kind(k)).sum::<usize>(),
        "{week}: a decision of an unknown kind: {kinds:?}"
    );
    // Every run ends, completed or failed or lost; about a tenth fail.
    assert_eq!(
        kind("finished") + kind("lost"),
        kind("run"),
        "{week}: {kinds:?}"
    );
    let failed = decisions
        .iter()
        .filter(|d| d["decision"] == "finished" && d["status"] == "failed")
        .count();
    assert!(
        failed * 20 > kind("run") && failed * 5 < kind("run"),
        "{week}: {failed} of {} runs failed at --fail-rate 0.1",
        kind("run")
    );
    assert!(
        kind("held_by_window") > 0 && kind("skipped") > 0,
        "{week}: {kinds:?}"
    );

    let table = String::from_utf8(table.to_vec()).unwrap();
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].trim_start().starts_with("tick"), "{}", lines[0]);
    assert_eq!(
        lines.len(),
        decisions.len() + 2,
        "{week}: header + decisions + totals"
    );
    let retries = total("retries");
    assert_eq!(
        *lines.last().unwrap(),
        format!(
            "{} run(s), {} skipped, {retries} retr{}, {} tick(s) visited",
            total("runs"),
            total("skipped"),
            if retries == 1 { "y" } else { "ies" },
            total("ticks_visited")
        )
    );
    // Line by line, the table shows what the JSON says.
    for (line, d) in lines[1..].iter().zip(decisions).step_by(997) {
        for field in ["utc", "local", "branch_rule_id", "occurrence_utc"] {
            assert!(
                line.contains(d[field].as_str().unwrap()),
                "{week}: {field} of {d} missing from {line:?}"
            );
        }
    }
    report
}

#[test]
fn output_is_byte_identical_across_host_time_zones_and_covers_sydneys_dst_change() {
    let install = Install::new();
    let weeks = [
        (
            "issue week",
            &ISSUE_WEEK,
            "2026-03-29T01:00:00Z",
            "2026-03-29T04:00:00Z",
        ),
        (
            "DST week",
            &DST_WEEK,
            "2026-04-01T01:00:00Z",
            "2026-04-01T04:00:00Z",
        ),
    ];
    for (name, week, down_start, down_end) in weeks {
        let table = simulate_under(&install, "UTC", week, "table");
        let json = simulate_under(&install, "UTC", week, "json");
        for tz in ["Pacific/Apia", "UTC"] {
            assert_same_bytes(
                &format!("{name}, table, TZ=UTC vs TZ={tz}"),
                &table,
                &simulate_under(&install, tz, week, "table"),
            );
            assert_same_bytes(
                &format!("{name}, json, TZ=UTC vs TZ={tz}"),
                &json,
                &simulate_under(&install, tz, week, "json"),
            );
        }
        let report = check_report(name, &table, &json);
        let text = String::from_utf8(table).unwrap();
        let decisions = report["decisions"].as_array().unwrap();

        // The outage: the runs going when it starts are lost, nothing is
        // decided during it, and at its end the missed heartbeats are
        // recorded skipped (misfire run_once).
        let (down_start, down_end) = (at(down_start), at(down_end));
        for d in decisions {
            let when = d["at"].as_i64().unwrap();
            if when == down_start {
                assert_eq!(
                    d["decision"], "lost",
                    "{name}: decided at the outage's start: {d}"
                );
            }
            assert!(
                !(down_start < when && when < down_end),
                "{name}: decided while down: {d}"
            );
        }
        let heartbeat = demo_branch_rule("Asia/Riyadh", 0).to_string();
        let missed = decisions
            .iter()
            .filter(|d| {
                d["at"] == down_end
                    && d["branch_rule_id"] == heartbeat.as_str()
                    && d["decision"] == "skipped"
                    && d["reason"] == "misfire"
            })
            .count();
        // 01:00 … 03:59 are missed; 04:00 runs in their place.
        assert_eq!(missed, 180, "{name}: the heartbeats missed while down");

        // Every zone's local time is shown, in its own abbreviation.
        for abbreviation in [" +03 ", " EDT ", " AEDT "] {
            assert!(
                text.contains(abbreviation),
                "{name}: no {abbreviation:?} in the local column"
            );
        }
        if name == "DST week" {
            sydney_leaves_dst(&text, decisions);
        }
    }
}

/// Sydney's heartbeat runs every UTC minute across the repeated local
/// hour, shown first as AEDT, then as AEST; no minute is doubled or lost.
fn sydney_leaves_dst(table: &str, decisions: &[Value]) {
    assert!(table.contains(" AEST "), "no AEST in the local column");
    let heartbeat = demo_branch_rule("Australia/Sydney", 0).to_string();
    let row = |utc_text: &str| {
        table
            .lines()
            .find(|line| {
                line.contains(&heartbeat)
                    && line.contains(&format!("{utc_text}  "))
                    && line.ends_with("  run")
            })
            .unwrap_or_else(|| panic!("no heartbeat run of Sydney at {utc_text}"))
            .to_string()
    };
    assert!(row("2026-04-04T15:59:00.000Z").contains("2026-04-05 02:59:00 AEDT"));
    assert!(row("2026-04-04T16:00:00.000Z").contains("2026-04-05 02:00:00 AEST"));
    assert!(row("2026-04-04T16:59:00.000Z").contains("2026-04-05 02:59:00 AEST"));
    let (start, end) = (at("2026-04-04T15:00:00Z"), at("2026-04-04T17:00:00Z"));
    let mut occurrences: Vec<i64> = decisions
        .iter()
        .filter(|d| d["branch_rule_id"] == heartbeat.as_str() && d["decision"] == "run")
        .map(|d| d["occurrence"].as_i64().unwrap())
        .filter(|o| (start..end).contains(o))
        .collect();
    occurrences.dedup();
    let minutes: Vec<i64> = (0..120).map(|m| start + m * 60_000).collect();
    assert_eq!(
        occurrences, minutes,
        "one run per UTC minute across the repeated hour"
    );
    // The nightly close-out at 02:30 local: the night of 5 April has two
    // 02:30s; it runs at one of them only.
    let nightly = demo_branch_rule("Australia/Sydney", 2).to_string();
    let nights: Vec<String> = decisions
        .iter()
        .filter(|d| d["branch_rule_id"] == nightly.as_str() && d["decision"] == "run")
        .map(|d| d["local"].as_str().unwrap()[..10].to_string())
        .collect();
    let mut unique = nights.clone();
    unique.dedup();
    assert_eq!(
        nights, unique,
        "a nightly close-out ran twice in one local night"
    );
    assert!(nights.iter().any(|n| n == "2026-04-05"), "{nights:?}");
}

// ---------------------------------------------------------------------------
// 2. Argument errors
// ---------------------------------------------------------------------------

#[test]
fn a_bad_argument_names_its_flag_and_prints_nothing_on_stdout() {
    let install = Install::new();
    let cases: [(&str, &str, &[&str]); 8] = [
        (
            "--from",
            "2026-13-01T00:00:00Z",
            &[
                "--from",
                "2026-13-01T00:00:00Z",
                "--to",
                "2026-03-29T00:00:00Z",
            ],
        ),
        (
            "--from",
            "yesterday",
            &["--from", "yesterday", "--to", "2026-03-29T00:00:00Z"],
        ),
        (
            "--to",
            "2026-03-27T00:00:00Z",
            &[
                "--from",
                "2026-03-28T00:00:00Z",
                "--to",
                "2026-03-27T00:00:00Z",
            ],
        ),
        (
            "--down",
            "2026-03-28T01:00Z",
            &["--down", "2026-03-28T01:00Z"],
        ),
        ("--fail-rate", "2", &["--fail-rate", "2"]),
        ("--format", "xml", &["--format", "xml"]),
        ("--resolution", "soon", &["--resolution", "soon"]),
        ("--duration", "fast", &["--duration", "fast"]),
    ];
    for (flag, value, extra) in cases {
        let mut args = vec!["simulate", "--demo"];
        if !extra.contains(&"--from") {
            args.extend([
                "--from",
                "2026-03-28T00:00:00Z",
                "--to",
                "2026-03-29T00:00:00Z",
            ]);
        }
        args.extend(extra);
        let output = install.run(&args);
        assert!(!output.status.success(), "{args:?} succeeded");
        assert_eq!(stdout(&output), "", "{args:?} printed on stdout");
        let message = stderr(&output);
        assert!(
            message.contains(flag),
            "{args:?}: {flag} not named in {message:?}"
        );
        assert!(
            message.contains(value),
            "{args:?}: {value:?} not quoted in {message:?}"
        );
    }
}

// ---------------------------------------------------------------------------
// 3. The simulation agrees with a real run
// ---------------------------------------------------------------------------

const FROM: &str = "2026-04-03T00:00:00Z";
const TO: &str = "2026-04-06T00:00:00Z";

/// The minutes the service is up for (UTC): every six hours, each demo
/// window's opening and closing, each nightly close-out, and Sydney's DST
/// night (02:30 AEDT, the change at 03:00 AEDT = 02:00 AEST, 02:30 AEST).
/// Local times: Riyadh UTC+3; New York EDT, UTC-4; Sydney AEDT, UTC+11,
/// until 2026-04-04T16:00Z, then AEST, UTC+10.
const UP_AT: [&str; 29] = [
    "2026-04-03T00:00:00Z", // the demo's first runs, all due at FROM
    "2026-04-03T06:00:00Z", // Riyadh restock opens (09:00); Sydney's closes (17:00 AEDT)
    "2026-04-03T06:30:00Z", // New York nightly (02:30 EDT)
    "2026-04-03T12:00:00Z",
    "2026-04-03T13:00:00Z", // New York restock opens (09:00 EDT)
    "2026-04-03T14:00:00Z", // Riyadh restock closes (17:00)
    "2026-04-03T15:30:00Z", // Sydney nightly (02:30 AEDT, 4 April)
    "2026-04-03T18:00:00Z",
    "2026-04-03T22:00:00Z", // Sydney restock opens (09:00 AEDT)
    "2026-04-03T23:30:00Z", // Riyadh nightly (02:30)
    "2026-04-04T06:00:00Z",
    "2026-04-04T06:30:00Z",
    "2026-04-04T12:00:00Z",
    "2026-04-04T13:00:00Z",
    "2026-04-04T15:30:00Z", // Sydney nightly: 02:30 AEDT, 5 April
    "2026-04-04T16:00:00Z", // Sydney: 03:00 AEDT becomes 02:00 AEST
    "2026-04-04T16:30:00Z", // 02:30 AEST, 5 April: the second 02:30
    "2026-04-04T18:00:00Z",
    "2026-04-04T21:00:00Z", // New York restock closes (17:00 EDT)
    "2026-04-04T23:00:00Z", // Sydney restock opens (09:00 AEST)
    "2026-04-04T23:30:00Z",
    "2026-04-05T06:00:00Z", // Riyadh opens; Sydney still open (16:00 AEST)
    "2026-04-05T06:30:00Z",
    "2026-04-05T07:00:00Z", // Sydney restock closes (17:00 AEST)
    "2026-04-05T12:00:00Z",
    "2026-04-05T13:00:00Z",
    "2026-04-05T18:00:00Z",
    "2026-04-05T23:00:00Z",
    "2026-04-05T23:30:00Z",
];

/// Each up window starts this long before its minute (so the minute's
/// occurrences are due while the service runs, not at its start)...
const LEAD_MS: Millis = 3_000;
/// ...and ends, for the simulation, this long after it: well after the
/// minute's work and well before the next minute's.
const TAIL_MS: Millis = 30_000;
const WORKERS: usize = 10;
const WINDOW_DEADLINE: Duration = Duration::from_secs(30);

/// One up window: the service's clock starts at `start`; the minute
/// `boundary`'s work runs; the simulation counts it down again from `end`.
#[derive(Debug, Clone, Copy)]
struct UpWindow {
    start: Millis,
    boundary: Millis,
    end: Millis,
}

fn up_windows() -> Vec<UpWindow> {
    let from = at(FROM);
    UP_AT
        .iter()
        .map(|text| {
            let boundary = at(text);
            UpWindow {
                // The first window starts with the simulation.
                start: (boundary - LEAD_MS).max(from),
                boundary,
                end: boundary + TAIL_MS,
            }
        })
        .collect()
}

/// The service's settings for the real run, which the simulation takes
/// too (`simulation_of` reads the workers, cooldown, per-tick cap, default
/// zone and partitions from it).
fn configure(config: Config) -> Config {
    Config {
        worker_count: WORKERS,
        ..without_delays(config)
    }
}

/// The terminal outcome of one attempt at one occurrence: `completed`,
/// `failed`, or `skipped <reason>: <detail>`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Outcome {
    scheduled_for: String,
    attempt: i64,
    outcome: String,
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} #{} {}",
            self.scheduled_for, self.attempt, self.outcome
        )
    }
}

fn simulated_outcomes(report: &Report) -> BTreeMap<Uuid, Vec<Outcome>> {
    let mut runs: BTreeMap<(Uuid, Millis, i64), usize> = BTreeMap::new();
    let mut outcomes: BTreeMap<Uuid, Vec<Outcome>> = BTreeMap::new();
    for d in &report.decisions {
        let outcome = match &d.kind {
            DecisionKind::Run => {
                *runs
                    .entry((d.branch_rule_id, d.occurrence, d.attempt))
                    .or_default() += 1;
                continue;
            }
            DecisionKind::Finished { status } => {
                let run = runs.remove(&(d.branch_rule_id, d.occurrence, d.attempt));
                assert_eq!(run, Some(1), "a finish without its run: {d:?}");
                status.clone()
            }
            DecisionKind::Skipped { reason, detail } => format!("skipped {reason}: {detail}"),
            DecisionKind::Lost => "failed: lost".to_string(),
            DecisionKind::HeldByWindow { .. }
            | DecisionKind::Buffered
            | DecisionKind::Retry { .. } => {
                continue;
            }
        };
        outcomes.entry(d.branch_rule_id).or_default().push(Outcome {
            scheduled_for: utc(d.occurrence),
            attempt: d.attempt,
            outcome,
        });
    }
    assert!(runs.is_empty(), "runs that never ended: {runs:?}");
    for list in outcomes.values_mut() {
        list.sort();
    }
    outcomes
}

async fn real_outcomes(store: &Store, ids: &[Uuid]) -> BTreeMap<Uuid, Vec<Outcome>> {
    let mut outcomes = BTreeMap::new();
    for &id in ids {
        let mut list: Vec<Outcome> = store
            .executions_for(id)
            .await
            .unwrap()
            .into_iter()
            .map(|e| Outcome {
                scheduled_for: utc(e.scheduled_for),
                attempt: e.attempt,
                outcome: match e.status {
                    ExecutionStatus::Skipped => {
                        format!("skipped {}", e.error.unwrap_or_default())
                    }
                    status => status.as_str().to_string(),
                },
            })
            .collect();
        list.sort();
        if !list.is_empty() {
            outcomes.insert(id, list);
        }
    }
    outcomes
}

/// The service has done everything due by now: it owns every rule, no
/// rule is ready, nothing is queued or running, and every execution of
/// the demo rules is terminal.
async fn quiet(service: &Service, store: &Store, ids: &[Uuid]) -> bool {
    let owns_all = match service.directory().lease() {
        Some(lease) => match ask(&lease, LeaseMsg::Status).await {
            Ok(status) => match status.ownership {
                Ownership::All => true,
                Ownership::Partitions { count, held } => held.len() == count as usize,
            },
            Err(_) => false,
        },
        None => false,
    };
    if !owns_all || !ready_ids(service).await.is_empty() {
        return false;
    }
    let Some(master) = service.directory().master() else {
        return false;
    };
    match ask(&master, MasterMsg::Stats).await {
        Ok(stats) if stats.queue_size == 0 && stats.active_jobs == 0 => {}
        _ => return false,
    }
    for &id in ids {
        match store.executions_for(id).await {
            Ok(executions) if executions.iter().all(|e| e.status.is_terminal()) => {}
            _ => return false,
        }
    }
    true
}

/// Where the two sides first part, per branch rule, as readable text.
fn differences(
    simulated: &BTreeMap<Uuid, Vec<Outcome>>,
    real: &BTreeMap<Uuid, Vec<Outcome>>,
    names: &BTreeMap<Uuid, String>,
) -> String {
    let mut text = String::new();
    for (id, name) in names {
        let empty = Vec::new();
        let (s, r) = (
            simulated.get(id).unwrap_or(&empty),
            real.get(id).unwrap_or(&empty),
        );
        if s == r {
            continue;
        }
        let first = s
            .iter()
            .zip(r)
            .position(|(a, b)| a != b)
            .unwrap_or(s.len().min(r.len()));
        text.push_str(&format!(
            "\n{name} ({id}): {} simulated vs {} real outcomes; from #{first}:\n",
            s.len(),
            r.len()
        ));
        for i in first..(first + 5) {
            let show = |list: &Vec<Outcome>| list.get(i).map_or("-".to_string(), |o| o.to_string());
            text.push_str(&format!(
                "  simulated {}\n  real      {}\n",
                show(s),
                show(r)
            ));
        }
    }
    text
}

both_backends!(
    simulate_agrees_with_a_real_run_over_three_days_and_a_dst_change,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let db = db;
        let (from, to) = (at(FROM), at(TO));
        let store = db.store().await;
        load_demo(&store, from).await.unwrap();
        let data = demo_data(from).unwrap();
        let ids: Vec<Uuid> = data.branch_rules.iter().map(|r| r.id).collect();
        let names: BTreeMap<Uuid, String> = data
            .branch_rules
            .iter()
            .map(|r| {
                let branch = data.branches.iter().find(|b| b.id == r.branch_id).unwrap();
                let rule = data.rules.iter().find(|x| x.id == r.rule_id).unwrap();
                (r.id, format!("{} / {}", branch.name, rule.name))
            })
            .collect();

        // The real run: the same install restarted for each up window,
        // its clock set to the window's start.
        let dir = tempfile::tempdir().unwrap();
        let windows = up_windows();
        for window in &windows {
            let clock = Clock::starting_at(window.start);
            let service = start_service_on_clock(&db.url, dir.path(), clock, configure).await;
            let what = format!("the work due by {} is done", utc(window.boundary));
            eventually(WINDOW_DEADLINE, &what, || async {
                clock.now_ms() >= window.boundary + 1_000 && quiet(&service, &store, &ids).await
            })
            .await;
            let stopping_at = clock.now_ms();
            assert!(
                stopping_at < window.end,
                "the up window of {} ran until {}, past its end for the simulation {}: \
                 this machine is too slow for the comparison",
                utc(window.boundary),
                utc(stopping_at),
                utc(window.end)
            );
            service.shutdown("SIGTERM").await.unwrap();
        }
        // Each window's first fetch came before its minute: otherwise the
        // service did not see what the simulation saw at the window's start.
        for window in windows.iter().filter(|w| w.start < w.boundary) {
            let mut claimed: Vec<Millis> = Vec::new();
            for &id in &ids {
                for e in store.executions_for(id).await.unwrap() {
                    if (window.start..window.end).contains(&e.requested_at) {
                        claimed.push(e.requested_at);
                    }
                }
            }
            let first = claimed.iter().min().copied().unwrap_or(window.boundary);
            assert!(
                first < window.boundary,
                "the window of {} made its first decision at {}, after its minute: \
                 the service took longer than {LEAD_MS} ms to start",
                utc(window.boundary),
                utc(first)
            );
        }
        let real = real_outcomes(&store, &ids).await;

        // The simulation: the same settings, down between the windows.
        let mut down: Vec<String> = Vec::new();
        for pair in windows.windows(2) {
            down.push(format!("{}/{}", utc(pair[0].end), utc(pair[1].start)));
        }
        down.push(format!("{}/{}", utc(windows.last().unwrap().end), utc(to)));
        let args = SimulateArgs {
            from: FROM.into(),
            to: TO.into(),
            resolution: Some("1s".into()),
            down,
            fail_rate: Some(0.0),
            // The demo's noop and 50 ms pause.
            duration: Some("50ms".into()),
            seed: Some(0),
        };
        let config = configure(test_config(&db.url, dir.path()));
        let sim = simulation_of(&args, &config).unwrap();
        assert_eq!((sim.workers, sim.cooldown_ms), (WORKERS, 0));
        let report = simulate(ExecutionPlan::from_data(data.clone()), &sim).unwrap();
        let simulated = simulated_outcomes(&report);

        let compared: usize = real.values().map(Vec::len).sum();
        let completed = real
            .values()
            .flatten()
            .filter(|o| o.outcome == "completed")
            .count();
        println!(
            "{}: {} up windows; {compared} outcomes compared, {completed} completed, {} skipped",
            db.url,
            windows.len(),
            compared - completed
        );
        let differences = differences(&simulated, &real, &names);
        assert!(
            differences.is_empty(),
            "the simulation and the real run disagree:{differences}"
        );
        // The comparison covered every kind of decision the demo makes.
        let all: Vec<&Outcome> = real.values().flatten().collect();
        for kind in ["completed", "skipped misfire:", "skipped outside_window:"] {
            assert!(
                all.iter().any(|o| o.outcome.starts_with(kind)),
                "no {kind} outcome in the real run"
            );
        }
        assert_eq!(real.len(), ids.len(), "every demo rule decided something");
        // Across Sydney's DST night the heartbeat ran at 02:59 AEDT, 02:00
        // AEST and 02:59 AEST, and the close-out ran once, not at both
        // 02:30s.
        let sydney = |rule: usize| &real[&demo_branch_rule("Australia/Sydney", rule)];
        for minute in [
            "2026-04-04T15:59:00.000Z",
            "2026-04-04T16:00:00.000Z",
            "2026-04-04T16:29:00.000Z",
            "2026-04-04T16:30:00.000Z",
        ] {
            assert!(
                sydney(0)
                    .iter()
                    .any(|o| o.scheduled_for == minute && o.outcome == "completed"),
                "Sydney's heartbeat did not run at {minute}: {:?}",
                sydney(0)
            );
        }
        let nightly_runs: Vec<&Outcome> = sydney(2)
            .iter()
            .filter(|o| o.outcome == "completed")
            .collect();
        let fifth: Vec<&&Outcome> = nightly_runs
            .iter()
            .filter(|o| o.scheduled_for.starts_with("2026-04-04T1"))
            .collect();
        assert_eq!(
            fifth.len(),
            1,
            "Sydney's close-out on 5 April: {nightly_runs:?}"
        );
    }
);

// ---------------------------------------------------------------------------
// 4. A week of 1,000 rules every 15 minutes
// ---------------------------------------------------------------------------

const BENCH_RULES: usize = 1_000;
const BENCH_FROM: &str = "2026-03-28T00:00:00Z";
const BENCH_TO: &str = "2026-04-04T00:00:00Z";

/// 1,000 branch rules on one `*/15 * * * *` rule, in one branch in
/// Riyadh, each running one noop, all first due at `from`.
fn quarter_hour_rules(from: Millis) -> PlanData {
    let id = |kind: u128, n: usize| {
        Uuid::from_u128(0xbe7c_0000_0000_4000_8000_0000_0000_0000 + (kind << 32) + n as u128)
    };
    let brand = Brand {
        id: id(0, 0),
        name: "bench".into(),
        settings: json!({}),
        created_at: from,
        updated_at: from,
    };
    let branch = Branch {
        id: id(1, 0),
        brand_id: brand.id,
        name: "bench branch".into(),
        timezone: Some("Asia/Riyadh".into()),
        is_active: true,
        created_at: from,
        updated_at: from,
    };
    let rule = Rule {
        id: id(2, 0),
        brand_id: Some(brand.id),
        name: "every 15 minutes".into(),
        status: RuleStatus::Active,
        cron_expression: "*/15 * * * *".into(),
        settings: json!({}),
        policy: None,
        created_at: from,
        updated_at: from,
    };
    let template = ActionTemplate {
        id: id(3, 0),
        name: "No-op".into(),
        kind: "noop".into(),
        config: json!({}),
        created_at: from,
        updated_at: from,
    };
    let mut data = PlanData::default();
    for n in 0..BENCH_RULES {
        let branch_rule = BranchRule {
            id: id(4, n),
            branch_id: branch.id,
            rule_id: rule.id,
            brand_rule_id: None,
            is_active: true,
            is_archived: false,
            is_force_stopped: false,
            is_currently_running: false,
            operation_time_from: None,
            operation_time_to: None,
            next_run_time: Some(from),
            last_run_time: None,
            lock_holder: None,
            lock_time: None,
            lock_epoch: 0,
            params: json!({}),
            policy: None,
            retry_of: None,
            failed_attempts: 0,
            created_at: from,
            updated_at: from,
        };
        data.action_details.push(ActionDetail {
            id: id(5, n),
            branch_rule_id: branch_rule.id,
            action_template_id: template.id,
            position: 0,
            params: json!({}),
            created_at: from,
            updated_at: from,
        });
        data.branch_rules.push(branch_rule);
    }
    data.brands.push(brand);
    data.branches.push(branch);
    data.rules.push(rule);
    data.action_templates.push(template);
    data
}

/// The simulation of the benchmark week as `ruled simulate` runs it with
/// WORKER_COUNT=50 WORKER_COOLDOWN_SECONDS=0.
fn bench_simulation() -> ruled::plan::simulate::Simulation {
    let args = SimulateArgs {
        from: BENCH_FROM.into(),
        to: BENCH_TO.into(),
        ..SimulateArgs::default()
    };
    let config = Config {
        worker_count: 50,
        worker_cooldown: Duration::ZERO,
        ..Config::default()
    };
    simulation_of(&args, &config).unwrap()
}

#[test]
fn a_week_of_1000_rules_every_15_minutes_simulates_to_the_end() {
    let sim = bench_simulation();
    let report = simulate(ExecutionPlan::from_data(quarter_hour_rules(sim.from)), &sim).unwrap();
    // 1,000 rules × 4 an hour × 24 × 7: 50 workers run each quarter's
    // thousand 200 ms runs in 4 s, so every occurrence runs, on time.
    assert_eq!(report.runs, 672_000);
    assert_eq!((report.skipped, report.retries), (0, 0));
    assert_eq!(report.decisions.len(), 2 * 672_000);
    let last = report.decisions.last().unwrap();
    assert!(
        last.at < sim.to && last.at > sim.to - 15 * 60_000,
        "{last:?}"
    );
}

/// Not a test: builds an SQLite database with the benchmark's 1,000 rules
/// at `RULED_BENCH_DATABASE_URL` (default `sqlite://target/simulate-bench.db`)
/// for `ruled simulate` in release mode, and times the in-process
/// simulation (meaningful only with `--release`). Then:
///
/// ```text
/// RULED_BENCH_DATABASE_URL=sqlite:///tmp/simulate-bench.db \
///   cargo test --test simulate bench_build -- --ignored --nocapture
/// cargo build --release
/// DATABASE_URL=sqlite:///tmp/simulate-bench.db WORKER_COUNT=50 WORKER_COOLDOWN_SECONDS=0 \
///   /usr/bin/time -v target/release/ruled simulate \
///   --from 2026-03-28T00:00:00Z --to 2026-04-04T00:00:00Z > /dev/null
/// ```
#[tokio::test]
#[ignore]
async fn bench_build_the_1000_rule_database() {
    let url = std::env::var("RULED_BENCH_DATABASE_URL")
        .unwrap_or_else(|_| "sqlite://target/simulate-bench.db".to_string());
    let store = Store::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    let sim = bench_simulation();
    let data = quarter_hour_rules(sim.from);
    // A second run finds the rows there.
    let present = |result: Result<(), ruled::store::StoreError>| {
        if let Err(e) = result {
            assert!(e.is_unique_violation(), "{e}");
        }
    };
    for brand in &data.brands {
        present(store.insert_brand(brand).await);
    }
    for template in &data.action_templates {
        present(store.insert_action_template(template).await);
    }
    for rule in &data.rules {
        present(store.insert_rule(rule).await);
    }
    for branch in &data.branches {
        present(store.insert_branch(branch).await);
    }
    for branch_rule in &data.branch_rules {
        present(store.insert_branch_rule(branch_rule).await);
    }
    for detail in &data.action_details {
        present(store.insert_action_detail(detail).await);
    }
    store.close().await;
    let started = std::time::Instant::now();
    let report = simulate(ExecutionPlan::from_data(data), &sim).unwrap();
    let simulated = started.elapsed();
    let started = std::time::Instant::now();
    let table = report.to_table();
    println!(
        "{url}: {} rules; in-process simulate {simulated:?} ({} runs, {} decisions), to_table {:?} ({} bytes)",
        BENCH_RULES,
        report.runs,
        report.decisions.len(),
        started.elapsed(),
        table.len()
    );
}
