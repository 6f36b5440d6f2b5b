//! Issue 13's acceptance: the scheduling policies driven through the real
//! engine on real SQLite and PostgreSQL.
//!
//! - A 3-hour outage with 20 rules every 15 minutes, one per policy mix:
//!   after the restart each rule ran exactly what its policy says, and
//!   every occurrence it did not run is recorded skipped with its reason.
//! - Overlap: a job outlasting its minute under `skip`, `buffer_one` and
//!   `cancel_running`.
//! - Retries: a job failing twice then succeeding runs three times with
//!   growing gaps; a cancel and a failure with no attempts left are not
//!   retried.
//! - Across the DST nights of Berlin and New York, with windows: no
//!   occurrence doubled or lost.
//! - Start jitter: rules due at one instant start spread over the jitter,
//!   each at or after its own offset, on two instances that agree on it.
//!
//! Tokio's paused clock does not mix with a real database, so time that
//! must pass is the wall clock's: a service runs on `Clock::starting_at`
//! the instant the scenario needs (a quarter-hour boundary, a DST night),
//! and an outage is a shutdown followed by a start on a clock hours later.
//! Expected outcomes are written out by hand from the policies, not
//! computed by the decision code under test.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use chrono::{TimeZone, Timelike, Utc};
use common::http::{read_request, serve};
use common::rules::{
    RuleOptions, YEARLY, insert_many_rules, insert_rule_with, policy, step, yearly_after,
};
use common::service::{start_service_on_clock, start_service_with, without_delays};
use common::{TestDb, eventually, wait_for_execution};
use ruled::actors::ask;
use ruled::clock::Clock;
use ruled::config::Config;
use ruled::messages::{MasterMsg, PlanMsg, RefresherMsg};
use ruled::model::{BranchRule, Execution, ExecutionStatus, Millis};
use ruled::schedule::EffectivePolicy;
use ruled::service::Service;
use ruled::store::{ExecutionFilter, Store};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use uuid::Uuid;

const MINUTE: Millis = 60_000;
const QUARTER: Millis = 15 * MINUTE;
const HOUR: Millis = 60 * MINUTE;

fn utc(text: &str) -> Millis {
    chrono::DateTime::parse_from_rfc3339(text)
        .unwrap_or_else(|e| panic!("{text}: {e}"))
        .timestamp_millis()
}

fn show(at: Millis) -> String {
    ruled::clock::millis_to_utc(at)
        .format("%m-%d %H:%M:%S%.3f")
        .to_string()
}

/// The metrics recorder of this test binary (one per process), so the
/// counters the engine bumps can be read. Tests run in parallel, so a test
/// compares the growth of a counter with at least what it caused.
fn metrics() -> &'static metrics_exporter_prometheus::PrometheusHandle {
    static HANDLE: OnceLock<metrics_exporter_prometheus::PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        ruled::metrics::builder()
            .unwrap()
            .install_recorder()
            .expect("the only recorder of this test binary")
    })
}

/// The value of one counter series (`name{labels}` as rendered), 0 when
/// absent.
fn counter(name_and_labels: &str) -> f64 {
    metrics()
        .render()
        .lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            (series == name_and_labels).then(|| value.parse().ok())?
        })
        .unwrap_or(0.0)
}

/// The branch rule as the database has it now.
async fn branch_rule(store: &Store, id: Uuid) -> BranchRule {
    let data = store.load_plan_data(10_000).await.unwrap();
    data.branch_rules
        .into_iter()
        .find(|r| r.id == id)
        .unwrap_or_else(|| panic!("branch rule {id} is gone"))
}

/// The reason a skipped execution records: the start of its error.
fn skip_reason(execution: &Execution) -> String {
    let error = execution.error.as_deref().unwrap_or("");
    error.split(':').next().unwrap_or("").to_string()
}

fn describe(runs: &[Execution]) -> String {
    runs.iter()
        .map(|e| {
            format!(
                "\n  {} attempt {} {} requested {} started {} finished {} {}",
                show(e.scheduled_for),
                e.attempt,
                e.status.as_str(),
                show(e.requested_at),
                e.started_at.map_or("-".into(), show),
                e.finished_at.map_or("-".into(), show),
                e.error.as_deref().unwrap_or("")
            )
        })
        .collect()
}

/// Each run as (occurrence, attempt, status).
fn attempts(runs: &[Execution]) -> Vec<(Millis, i64, ExecutionStatus)> {
    runs.iter()
        .map(|e| (e.scheduled_for, e.attempt, e.status))
        .collect()
}

fn all_terminal(runs: &[Execution]) -> bool {
    runs.iter().all(|e| e.finished_at.is_some())
}

// ---- a: a 3-hour outage, one rule per policy mix ----------------------------

/// 22:00:05 on 1 June 2026: the first service runs the 22:00 occurrence.
const OUTAGE_START: &str = "2026-06-01T22:00:05Z";
/// The restart, 3 h 05 min later: 22:15 … 01:00 were missed.
const OUTAGE_RESTART: &str = "2026-06-02T01:05:05Z";

/// A quarter-hour of the outage night: 12:00–23:59 are 1 June, the rest
/// 2 June.
fn night(hm: &str) -> Millis {
    let (h, m) = hm.split_once(':').unwrap();
    let (h, m): (u32, u32) = (h.parse().unwrap(), m.parse().unwrap());
    let day = if h >= 12 { 1 } else { 2 };
    Utc.with_ymd_and_hms(2026, 6, day, h, m, 0)
        .unwrap()
        .timestamp_millis()
}

/// `"22:00, 22:45-01:00"`: the listed quarter-hours, ranges inclusive.
fn quarters(spec: &str) -> BTreeSet<Millis> {
    let mut set = BTreeSet::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (from, to) = item.split_once('-').unwrap_or((item, item));
        let (from, to) = (night(from), night(to));
        assert!(from <= to, "{item}");
        let mut at = from;
        while at <= to {
            set.insert(at);
            at += QUARTER;
        }
    }
    set
}

struct Mix {
    name: &'static str,
    policy: Value,
    window: Option<(&'static str, &'static str)>,
    /// The occurrences that ran (before and after the outage).
    completed: &'static str,
    /// The occurrences recorded skipped, by reason.
    skipped: &'static [(&'static str, &'static str)],
}

/// Excludes 22:00 (not run before the outage) and 22:00–23:45.
const W_MIDNIGHT: Option<(&str, &str)> = Some(("00:00", "02:00"));
/// Holds 22:00 and the restart, but not 22:15–00:45.
const W_DAYTIME: Option<(&str, &str)> = Some(("01:00", "22:01"));
/// Overnight: excludes 22:00–22:45.
const W_OVERNIGHT: Option<(&str, &str)> = Some(("23:00", "02:00"));

/// The 20 mixes and what each must have done. At the restart (01:05:05)
/// the due occurrences are 22:15 … 01:00 (from 22:00 where a window kept
/// 22:00 from running); a catch-up window of 3600 s reaches back to
/// 00:05:05, so 22:00 … 00:00 are past it; `skip` runs nothing more than
/// 60 s late; `run_all` runs the latest `catchup_max` (default 10) of what
/// is left, oldest first.
fn mixes() -> Vec<Mix> {
    let mix = |name, policy, window, completed, skipped| Mix {
        name,
        policy,
        window,
        completed,
        skipped,
    };
    vec![
        mix(
            "run_once",
            json!({}),
            None,
            "22:00, 01:00",
            &[("misfire", "22:15-00:45")],
        ),
        mix(
            "skip",
            json!({"misfire": "skip"}),
            None,
            "22:00",
            &[("misfire", "22:15-01:00")],
        ),
        mix(
            "run_all",
            json!({"misfire": "run_all"}),
            None,
            "22:00, 22:45-01:00",
            &[("catchup_max", "22:15-22:30")],
        ),
        mix(
            "run_all max 3",
            json!({"misfire": "run_all", "catchup_max": 3}),
            None,
            "22:00, 00:30-01:00",
            &[("catchup_max", "22:15-00:15")],
        ),
        mix(
            "run_once window 1 h",
            json!({"catchup_window_seconds": 3600}),
            None,
            "22:00, 01:00",
            &[
                ("catchup_window", "22:15-00:00"),
                ("misfire", "00:15-00:45"),
            ],
        ),
        mix(
            "skip window 1 h",
            json!({"misfire": "skip", "catchup_window_seconds": 3600}),
            None,
            "22:00",
            &[
                ("catchup_window", "22:15-00:00"),
                ("misfire", "00:15-01:00"),
            ],
        ),
        mix(
            "run_all window 1 h",
            json!({"misfire": "run_all", "catchup_window_seconds": 3600}),
            None,
            "22:00, 00:15-01:00",
            &[("catchup_window", "22:15-00:00")],
        ),
        mix(
            "run_all max 3 window 1 h",
            json!({"misfire": "run_all", "catchup_max": 3, "catchup_window_seconds": 3600}),
            None,
            "22:00, 00:30-01:00",
            &[("catchup_window", "22:15-00:00"), ("catchup_max", "00:15")],
        ),
        mix(
            "run_once 00-02",
            json!({}),
            W_MIDNIGHT,
            "01:00",
            &[
                ("outside_window", "22:00-23:45"),
                ("misfire", "00:00-00:45"),
            ],
        ),
        mix(
            "skip 00-02",
            json!({"misfire": "skip"}),
            W_MIDNIGHT,
            "",
            &[
                ("outside_window", "22:00-23:45"),
                ("misfire", "00:00-01:00"),
            ],
        ),
        mix(
            "run_all 00-02",
            json!({"misfire": "run_all"}),
            W_MIDNIGHT,
            "22:45-01:00",
            &[("catchup_max", "22:00-22:30")],
        ),
        mix(
            "run_all max 3 00-02",
            json!({"misfire": "run_all", "catchup_max": 3}),
            W_MIDNIGHT,
            "00:30-01:00",
            &[("catchup_max", "22:00-00:15")],
        ),
        mix(
            "run_once window 1 h 00-02",
            json!({"catchup_window_seconds": 3600}),
            W_MIDNIGHT,
            "01:00",
            &[
                ("catchup_window", "22:00-00:00"),
                ("misfire", "00:15-00:45"),
            ],
        ),
        mix(
            "run_all max 3 window 1 h 00-02",
            json!({"misfire": "run_all", "catchup_max": 3, "catchup_window_seconds": 3600}),
            W_MIDNIGHT,
            "00:30-01:00",
            &[("catchup_window", "22:00-00:00"), ("catchup_max", "00:15")],
        ),
        mix(
            "run_once 01-22:01",
            json!({}),
            W_DAYTIME,
            "22:00, 01:00",
            &[("outside_window", "22:15-00:45")],
        ),
        mix(
            "skip 01-22:01",
            json!({"misfire": "skip"}),
            W_DAYTIME,
            "22:00",
            &[("outside_window", "22:15-00:45"), ("misfire", "01:00")],
        ),
        mix(
            "run_all max 3 01-22:01",
            json!({"misfire": "run_all", "catchup_max": 3}),
            W_DAYTIME,
            "22:00, 00:30-01:00",
            &[("catchup_max", "22:15-00:15")],
        ),
        mix(
            "run_once 23-02",
            json!({}),
            W_OVERNIGHT,
            "01:00",
            &[
                ("outside_window", "22:00-22:45"),
                ("misfire", "23:00-00:45"),
            ],
        ),
        mix(
            "skip window 1 h 23-02",
            json!({"misfire": "skip", "catchup_window_seconds": 3600}),
            W_OVERNIGHT,
            "",
            &[
                ("catchup_window", "22:00-00:00"),
                ("misfire", "00:15-01:00"),
            ],
        ),
        mix(
            "run_all window 1 h 23-02",
            json!({"misfire": "run_all", "catchup_window_seconds": 3600}),
            W_OVERNIGHT,
            "00:15-01:00",
            &[("catchup_window", "22:00-00:00")],
        ),
    ]
}

/// The expected executions of one mix: scheduled_for → outcome
/// (`completed` or the skip reason).
fn expected_outcomes(mix: &Mix) -> BTreeMap<Millis, String> {
    let mut expected = BTreeMap::new();
    for at in quarters(mix.completed) {
        expected.insert(at, "completed".to_string());
    }
    for (reason, spec) in mix.skipped {
        for at in quarters(spec) {
            let previous = expected.insert(at, reason.to_string());
            assert!(
                previous.is_none(),
                "{}: {} listed twice",
                mix.name,
                show(at)
            );
        }
    }
    expected
}

fn outcomes(runs: &[Execution]) -> BTreeMap<Millis, String> {
    runs.iter()
        .map(|e| {
            let outcome = match e.status {
                ExecutionStatus::Skipped => skip_reason(e),
                status => status.as_str().to_string(),
            };
            (e.scheduled_for, outcome)
        })
        .collect()
}

both_backends!(
    after_a_three_hour_outage_each_rule_ran_what_its_policy_says,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let db = db;
        let store = db.store().await;
        let start = utc(OUTAGE_START);
        let restart = utc(OUTAGE_RESTART);
        let mixes = mixes();
        assert_eq!(mixes.len(), 20);
        let names: BTreeSet<&str> = mixes.iter().map(|m| m.name).collect();
        assert_eq!(names.len(), 20, "20 distinct mixes");
        // The book-keeping of the table itself: every occurrence from 22:00
        // to 01:00 is listed exactly once for every rule.
        let night_occurrences = quarters("22:00-01:00");
        for mix in &mixes {
            let expected = expected_outcomes(mix);
            assert_eq!(
                expected.keys().copied().collect::<BTreeSet<_>>(),
                night_occurrences,
                "{}: the table accounts for every occurrence",
                mix.name
            );
        }
        let mut ids = Vec::new();
        for mix in &mixes {
            let options = RuleOptions {
                policy: Some(policy(mix.policy.clone())),
                window: mix.window.map(|(f, t)| (f.to_string(), t.to_string())),
                now: Some(start - MINUTE),
                ..RuleOptions::default()
            };
            let id = insert_rule_with(
                &store,
                "*/15 * * * *",
                night("22:00"),
                &[step("noop", json!({}))],
                &options,
            )
            .await;
            ids.push(id);
        }
        let skipped_before: BTreeMap<&str, f64> =
            ["misfire", "outside_window", "catchup_window", "catchup_max"]
                .into_iter()
                .map(|r| {
                    (
                        r,
                        counter(&format!(
                            "ruled_occurrences_skipped_total{{reason=\"{r}\"}}"
                        )),
                    )
                })
                .collect();

        // Before the outage: 22:00 runs where no window holds it back.
        let dir = tempfile::tempdir().unwrap();
        let first = start_service_on_clock(
            &db.url,
            dir.path(),
            Clock::starting_at(start),
            without_delays,
        )
        .await;
        let runs_at_start: Vec<bool> = mixes
            .iter()
            .map(|m| quarters(m.completed).contains(&night("22:00")))
            .collect();
        assert_eq!(runs_at_start.iter().filter(|r| **r).count(), 11);
        eventually(
            Duration::from_secs(60),
            "22:00 ran before the outage",
            || async {
                for (id, runs) in ids.iter().zip(&runs_at_start) {
                    let executions = store.executions_for(*id).await.unwrap();
                    let done = executions
                        .iter()
                        .any(|e| e.status == ExecutionStatus::Completed);
                    if *runs != done || !all_terminal(&executions) {
                        return false;
                    }
                }
                true
            },
        )
        .await;
        first.shutdown("SIGTERM").await.unwrap();
        for (mix, id) in mixes.iter().zip(&ids) {
            let runs = store.executions_for(*id).await.unwrap();
            let expected: Vec<Millis> = if quarters(mix.completed).contains(&night("22:00")) {
                vec![night("22:00")]
            } else {
                Vec::new()
            };
            let seen: Vec<Millis> = runs.iter().map(|e| e.scheduled_for).collect();
            assert_eq!(
                seen,
                expected,
                "{} before the outage:{}",
                mix.name,
                describe(&runs)
            );
        }

        // 3 h 05 min later, on the same install.
        let second = start_service_on_clock(
            &db.url,
            dir.path(),
            Clock::starting_at(restart),
            without_delays,
        )
        .await;
        let next = night("01:15");
        let settled = || async {
            for (mix, id) in mixes.iter().zip(&ids) {
                let runs = store.executions_for(*id).await.unwrap();
                if runs.len() < expected_outcomes(mix).len() || !all_terminal(&runs) {
                    return false;
                }
                let row = branch_rule(&store, *id).await;
                if row.next_run_time != Some(next)
                    || row.is_currently_running
                    || row.lock_holder.is_some()
                {
                    return false;
                }
            }
            true
        };
        let waited = Instant::now();
        eventually(
            Duration::from_secs(90),
            "every rule settled after the restart",
            settled,
        )
        .await;
        let took = waited.elapsed();
        second.shutdown("SIGTERM").await.unwrap();

        let mut failures = Vec::new();
        let mut expected_skips: BTreeMap<String, usize> = BTreeMap::new();
        for (mix, id) in mixes.iter().zip(&ids) {
            let runs = store.executions_for(*id).await.unwrap();
            let expected = expected_outcomes(mix);
            for outcome in expected.values().filter(|o| *o != "completed") {
                *expected_skips.entry(outcome.clone()).or_default() += 1;
            }
            // No occurrence twice, every one at attempt 1.
            let keys: BTreeSet<Millis> = runs.iter().map(|e| e.scheduled_for).collect();
            if keys.len() != runs.len() || runs.iter().any(|e| e.attempt != 1) {
                failures.push(format!(
                    "{}: an occurrence recorded twice:{}",
                    mix.name,
                    describe(&runs)
                ));
                continue;
            }
            if outcomes(&runs) != expected {
                let got = outcomes(&runs);
                let diff: Vec<String> = night_occurrences
                    .iter()
                    .filter(|at| got.get(at) != expected.get(at))
                    .map(|at| {
                        format!(
                            "{}: expected {:?}, got {:?}",
                            show(*at),
                            expected.get(at),
                            got.get(at)
                        )
                    })
                    .collect();
                failures.push(format!("{}: {diff:#?}{}", mix.name, describe(&runs)));
                continue;
            }
            // run_all runs what it catches up on oldest first, one per claim.
            let mut completed: Vec<&Execution> = runs
                .iter()
                .filter(|e| e.status == ExecutionStatus::Completed)
                .collect();
            completed.sort_by_key(|e| e.scheduled_for);
            if completed
                .windows(2)
                .any(|w| w[0].finished_at.unwrap() > w[1].requested_at)
            {
                failures.push(format!(
                    "{}: not oldest first, one at a time:{}",
                    mix.name,
                    describe(&runs)
                ));
            }
            // A skipped execution is terminal and names its reason.
            for e in runs.iter().filter(|e| e.status == ExecutionStatus::Skipped) {
                let error = e.error.as_deref().unwrap_or("");
                if e.finished_at.is_none() || !error.contains(": ") || e.started_at.is_some() {
                    failures.push(format!(
                        "{}: a malformed skipped execution: {e:?}",
                        mix.name
                    ));
                }
            }
        }
        assert!(
            failures.is_empty(),
            "after {took:?}:\n{}",
            failures.join("\n\n")
        );
        for (reason, count) in &expected_skips {
            let grown = counter(&format!(
                "ruled_occurrences_skipped_total{{reason=\"{reason}\"}}"
            )) - skipped_before[reason.as_str()];
            assert!(
                grown >= *count as f64,
                "ruled_occurrences_skipped_total{{reason={reason}}} grew by {grown}, expected at least {count}"
            );
        }
        eprintln!("outage: the restart settled in {took:?}");
    }
);

// ---- b: overlap ----------------------------------------------------------------

/// 10:00:56: the 10:00 occurrence is due and on time (56 s late, within
/// the 60 s misfire threshold); its 6 s job still runs when 10:01 falls due.
const OVERLAP_START: &str = "2026-06-01T10:00:56Z";
const OVERLAP_JOB_MS: u64 = 6_000;

both_backends!(
    an_occurrence_due_while_the_last_run_still_runs_follows_the_overlap_policy,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let db = db;
        let store = db.store().await;
        let start = utc(OVERLAP_START);
        let minute = |m: i64| utc("2026-06-01T10:00:00Z") + m * MINUTE;
        let mut ids = BTreeMap::new();
        for overlap in ["skip", "buffer_one", "cancel_running"] {
            let options = RuleOptions {
                policy: Some(policy(json!({"overlap": overlap}))),
                now: Some(start - MINUTE),
                ..RuleOptions::default()
            };
            let id = insert_rule_with(
                &store,
                "* * * * *",
                minute(0),
                &[step("sleep", json!({"ms": OVERLAP_JOB_MS}))],
                &options,
            )
            .await;
            ids.insert(overlap, id);
        }
        let dir = tempfile::tempdir().unwrap();
        let clock = Clock::starting_at(start);
        let service = start_service_on_clock(&db.url, dir.path(), clock, without_delays).await;
        // Until 10:02 has run for every rule: the occurrence after the
        // overlapped one runs on time whatever the policy did.
        eventually(
            Duration::from_secs(120),
            "10:02 ran for every rule",
            || async {
                for id in ids.values() {
                    let runs = store.executions_for(*id).await.unwrap();
                    let done = runs.iter().any(|e| {
                        e.scheduled_for == minute(2) && e.status == ExecutionStatus::Completed
                    });
                    if !done {
                        return false;
                    }
                }
                true
            },
        )
        .await;
        assert!(
            clock.now_ms() < minute(3),
            "the test ran past 10:03, where the next occurrence falls due"
        );
        service.shutdown("SIGTERM").await.unwrap();

        let runs = |policy: &'static str| {
            let store = &store;
            let id = ids[policy];
            async move { store.executions_for(id).await.unwrap() }
        };
        let brief = |runs: &[Execution]| -> Vec<(Millis, ExecutionStatus)> {
            runs.iter().map(|e| (e.scheduled_for, e.status)).collect()
        };
        let job = OVERLAP_JOB_MS as Millis;

        // skip: 10:01 recorded skipped (overlap), 10:02 runs.
        let skip = runs("skip").await;
        assert_eq!(
            brief(&skip),
            vec![
                (minute(0), ExecutionStatus::Completed),
                (minute(1), ExecutionStatus::Skipped),
                (minute(2), ExecutionStatus::Completed),
            ],
            "skip:{}",
            describe(&skip)
        );
        assert!(
            skip[1].error.as_deref().unwrap().starts_with("overlap: "),
            "{:?}",
            skip[1].error
        );
        assert!(
            skip[0].finished_at.unwrap() >= minute(1),
            "the first run outlasted its minute"
        );
        assert!(
            skip[2].requested_at >= minute(2),
            "skip:{}",
            describe(&skip)
        );

        // buffer_one: 10:01 runs right after the first run finished.
        let buffer = runs("buffer_one").await;
        assert_eq!(
            brief(&buffer),
            vec![
                (minute(0), ExecutionStatus::Completed),
                (minute(1), ExecutionStatus::Completed),
                (minute(2), ExecutionStatus::Completed),
            ],
            "buffer_one:{}",
            describe(&buffer)
        );
        let first_end = buffer[0].finished_at.unwrap();
        let buffered_start = buffer[1].started_at.unwrap();
        assert!(first_end >= minute(1), "buffer_one:{}", describe(&buffer));
        assert!(
            buffered_start >= first_end && buffered_start - first_end < 3_000,
            "the buffered occurrence starts right after the first run:{}",
            describe(&buffer)
        );
        assert!(
            buffer[2].requested_at >= minute(2),
            "buffer_one:{}",
            describe(&buffer)
        );

        // cancel_running: the first run is cancelled at 10:01, which starts then.
        let cancel = runs("cancel_running").await;
        assert_eq!(
            brief(&cancel),
            vec![
                (minute(0), ExecutionStatus::Cancelled),
                (minute(1), ExecutionStatus::Completed),
                (minute(2), ExecutionStatus::Completed),
            ],
            "cancel_running:{}",
            describe(&cancel)
        );
        let cancelled_at = cancel[0].finished_at.unwrap();
        assert!(
            (minute(1)..minute(1) + 3_000).contains(&cancelled_at),
            "cancelled when 10:01 fell due:{}",
            describe(&cancel)
        );
        assert!(
            cancelled_at - cancel[0].started_at.unwrap() < job,
            "cancelled before its job was done:{}",
            describe(&cancel)
        );
        assert!(
            cancel[0].error.as_deref().unwrap_or("").contains("Overlap"),
            "{:?}",
            cancel[0].error
        );
        let next_start = cancel[1].started_at.unwrap();
        assert!(
            next_start >= cancelled_at && next_start < minute(1) + 3_000,
            "10:01 starts when it falls due:{}",
            describe(&cancel)
        );
    }
);

// A run lost to a crash always runs again (issue 13: "as today"), however
// late the restart finds it: the misfire policy and the catch-up window
// sort missed occurrences, not one that began and was lost. Recovery used
// to leave it looking missed, and `misfire: skip` recorded it skipped.
both_backends!(
    a_run_lost_to_a_crash_runs_again_whatever_the_misfire_policy,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let db = db;
        let store = db.store().await;
        let due = utc("2026-06-01T10:00:00Z");
        let mut ids = Vec::new();
        for rule_policy in [
            json!({"misfire": "skip"}),
            json!({"catchup_window_seconds": 30}),
            json!({}),
        ] {
            let options = RuleOptions {
                policy: Some(policy(rule_policy)),
                now: Some(due - MINUTE),
                ..RuleOptions::default()
            };
            let id = insert_rule_with(
                &store,
                "0 * * * *",
                due,
                &[step("sleep", json!({"ms": 3_000}))],
                &options,
            )
            .await;
            ids.push(id);
        }
        let dir = tempfile::tempdir().unwrap();
        let first = start_service_on_clock(
            &db.url,
            dir.path(),
            Clock::starting_at(due + 1_000),
            without_delays,
        )
        .await;
        eventually(Duration::from_secs(30), "every rule runs", || async {
            for id in &ids {
                let runs = store.executions_for(*id).await.unwrap();
                if !runs.iter().any(|e| e.status == ExecutionStatus::Running) {
                    return false;
                }
            }
            true
        })
        .await;
        // A crash: nothing of the running jobs is recorded.
        first.abort().await;
        // Back five minutes later: each lost 10:00 is more than a minute
        // late and past the catch-up window.
        let second = start_service_on_clock(
            &db.url,
            dir.path(),
            Clock::starting_at(due + 5 * MINUTE),
            without_delays,
        )
        .await;
        eventually(
            Duration::from_secs(60),
            "every lost run ran again",
            || async {
                for id in &ids {
                    let runs = store.executions_for(*id).await.unwrap();
                    let done = runs
                        .iter()
                        .any(|e| e.scheduled_for == due && e.status == ExecutionStatus::Completed);
                    if !done || !all_terminal(&runs) {
                        return false;
                    }
                }
                true
            },
        )
        .await;
        second.shutdown("SIGTERM").await.unwrap();
        for id in &ids {
            let runs = store.executions_for(*id).await.unwrap();
            let brief = attempts(&runs);
            assert_eq!(
                brief,
                vec![
                    (due, 1, ExecutionStatus::Failed),
                    (due, 2, ExecutionStatus::Completed),
                ],
                "{}",
                describe(&runs)
            );
            assert_eq!(runs[0].error.as_deref(), Some("worker_lost"));
            let row = branch_rule(&store, *id).await;
            assert_eq!(row.retry_of, None, "nothing owed any more");
            assert_eq!(row.failed_attempts, 0, "a lost run is no failure");
            assert_eq!(row.next_run_time, Some(due + HOUR));
        }
    }
);

// ---- c: retries ----------------------------------------------------------------

/// A loopback HTTP server: `/flaky` answers 500, 500, then 200; `/fail`
/// always 500. Counts the requests per path.
async fn flaky_server() -> (
    std::net::SocketAddr,
    Arc<BTreeMap<&'static str, AtomicUsize>>,
) {
    let counts: Arc<BTreeMap<&'static str, AtomicUsize>> = Arc::new(
        ["/flaky", "/fail"]
            .into_iter()
            .map(|p| (p, AtomicUsize::new(0)))
            .collect(),
    );
    let seen = Arc::clone(&counts);
    let addr = serve(move |mut socket| {
        let seen = Arc::clone(&seen);
        async move {
            let Some(request) = read_request(&mut socket).await else {
                return;
            };
            let path = request.split_whitespace().nth(1).unwrap_or("/").to_string();
            let n = seen
                .get(path.as_str())
                .map_or(usize::MAX, |c| c.fetch_add(1, Ordering::SeqCst));
            let status = match path.as_str() {
                "/flaky" if n >= 2 => "200 OK",
                _ => "500 Internal Server Error",
            };
            let reply =
                format!("HTTP/1.1 {status}\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
            let _ = socket.write_all(reply.as_bytes()).await;
            let _ = socket.shutdown().await;
        }
    })
    .await;
    (addr, counts)
}

fn loopback_http(config: Config) -> Config {
    Config {
        http_action_allow_private: true,
        ..without_delays(config)
    }
}

both_backends!(
    a_failing_job_is_retried_with_growing_gaps_and_a_cancel_is_not,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let db = db;
        let store = db.store().await;
        let (addr, requests) = flaky_server().await;
        let retries_before = counter("ruled_retries_total");
        let now = Utc::now().timestamp_millis();
        let http = |path: &str| {
            step(
                "http",
                json!({"url": format!("http://{addr}{path}"), "timeout_ms": 5_000}),
            )
        };
        let with_policy = |value: Value| RuleOptions {
            policy: Some(policy(value)),
            ..RuleOptions::default()
        };
        let flaky = insert_rule_with(
            &store,
            YEARLY,
            now,
            &[http("/flaky")],
            &with_policy(json!({"max_attempts": 3, "backoff_seconds": 2})),
        )
        .await;
        let once = insert_rule_with(
            &store,
            YEARLY,
            now,
            &[http("/fail")],
            &RuleOptions::default(),
        )
        .await;
        let cancelled = insert_rule_with(
            &store,
            YEARLY,
            now,
            &[step("sleep", json!({"ms": 60_000}))],
            &with_policy(json!({"max_attempts": 3, "backoff_seconds": 1})),
        )
        .await;
        let running = start_service_with(&db.url, loopback_http).await;
        let service = &running.service;

        // The cancel: an operator's cancel ends the occurrence, no retry.
        let running_one = || async {
            let runs = store.executions_for(cancelled).await.unwrap();
            runs.iter()
                .find(|e| e.status == ExecutionStatus::Running)
                .map(|e| e.id)
        };
        eventually(Duration::from_secs(30), "the long job runs", || async {
            running_one().await.is_some()
        })
        .await;
        let master = service.directory().master().unwrap();
        let execution_id = running_one().await.unwrap();
        ask(&master, |reply| MasterMsg::Cancel {
            execution_id,
            reply,
        })
        .await
        .unwrap();

        eventually(
            Duration::from_secs(60),
            "the flaky job succeeded",
            || async {
                let runs = store.executions_for(flaky).await.unwrap();
                runs.iter().any(|e| e.status == ExecutionStatus::Completed)
            },
        )
        .await;
        eventually(
            Duration::from_secs(30),
            "the cancel is recorded",
            || async {
                let runs = store.executions_for(cancelled).await.unwrap();
                runs.first().is_some_and(|e| e.finished_at.is_some())
            },
        )
        .await;
        let next_year = yearly_after(now);
        // Cancelled: never retried, however many attempts are left. The
        // finish that recorded it wrote the rule's next run in the same
        // transaction, so the rule shows now whether a retry is pending.
        let runs = store.executions_for(cancelled).await.unwrap();
        assert_eq!(runs.len(), 1, "{}", describe(&runs));
        assert_eq!(runs[0].status, ExecutionStatus::Cancelled);
        let row = branch_rule(&store, cancelled).await;
        assert_eq!((row.retry_of, row.failed_attempts), (None, 0), "{row:?}");
        assert_eq!(row.next_run_time, Some(next_year));
        assert!(row.lock_holder.is_none(), "{row:?}");
        eventually(
            Duration::from_secs(30),
            "every rule is released",
            || async {
                for id in [flaky, once] {
                    let row = branch_rule(&store, id).await;
                    if row.is_currently_running || row.lock_holder.is_some() {
                        return false;
                    }
                }
                true
            },
        )
        .await;

        // Three attempts of one occurrence: failed, failed, completed.
        let runs = store.executions_for(flaky).await.unwrap();
        let brief = attempts(&runs);
        assert_eq!(
            brief,
            vec![
                (now, 1, ExecutionStatus::Failed),
                (now, 2, ExecutionStatus::Failed),
                (now, 3, ExecutionStatus::Completed),
            ],
            "{}",
            describe(&runs)
        );
        // The gaps: 2 s less up to a fifth, then 4 s less up to a fifth.
        let gap = |i: usize| runs[i + 1].requested_at - runs[i].finished_at.unwrap();
        let (first_gap, second_gap) = (gap(0), gap(1));
        assert!(
            first_gap >= 1_600,
            "first gap {first_gap} ms:{}",
            describe(&runs)
        );
        assert!(
            second_gap >= 3_200,
            "second gap {second_gap} ms:{}",
            describe(&runs)
        );
        assert!(
            second_gap > first_gap,
            "gaps {first_gap} then {second_gap} ms"
        );
        assert_eq!(requests["/flaky"].load(Ordering::SeqCst), 3);
        let row = branch_rule(&store, flaky).await;
        assert_eq!((row.retry_of, row.failed_attempts), (None, 0), "{row:?}");
        assert_eq!(row.next_run_time, Some(next_year));

        // max_attempts 1: one failure, no retry.
        let runs = store.executions_for(once).await.unwrap();
        assert_eq!(runs.len(), 1, "{}", describe(&runs));
        assert_eq!(runs[0].status, ExecutionStatus::Failed);
        assert_eq!(requests["/fail"].load(Ordering::SeqCst), 1);
        let row = branch_rule(&store, once).await;
        assert_eq!((row.retry_of, row.failed_attempts), (None, 0), "{row:?}");
        assert_eq!(row.next_run_time, Some(next_year));

        let retries = counter("ruled_retries_total") - retries_before;
        assert!(retries >= 2.0, "ruled_retries_total grew by {retries}");
        running.service.shutdown("SIGTERM").await.unwrap();
    }
);

// ---- d: DST nights ---------------------------------------------------------------

/// One rule of a DST scenario; times are minutes from the transition.
struct DstRule {
    name: &'static str,
    cron: &'static str,
    /// Minutes between occurrences, for the ranges below.
    step: i64,
    policy: Value,
    window: Option<(&'static str, &'static str)>,
    first: i64,
    /// Inclusive ranges of the occurrences that ran.
    completed: &'static [(i64, i64)],
    skipped: &'static [(&'static str, (i64, i64))],
    /// next_run_time once it all settled.
    next: i64,
}

struct DstNight {
    zone: chrono_tz::Tz,
    /// The instant the clocks change.
    transition: &'static str,
    /// The local wall times just before and at the transition.
    local_before: (u32, u32),
    local_at: (u32, u32),
    /// The first service starts this many seconds from the transition (it
    /// stops before the transition, or just after), the second after the
    /// "outage".
    first_start_s: i64,
    restart_s: i64,
    rules: Vec<DstRule>,
}

/// Spring forward: 01:59 is followed by 03:00 local (Berlin 2026-03-29
/// 01:00Z, New York 2026-03-08 07:00Z). The first service starts 10 s
/// before the change and runs what is due then; the second starts 10 min
/// 30 s after it, so the missed occurrences span the change.
fn spring_forward(zone: chrono_tz::Tz, transition: &'static str) -> DstNight {
    DstNight {
        zone,
        transition,
        local_before: (1, 59),
        local_at: (3, 0),
        first_start_s: -10,
        restart_s: 10 * 60 + 30,
        rules: vec![
            DstRule {
                name: "every minute, run_all, window 01:00-04:00",
                cron: "* * * * *",
                step: 1,
                policy: json!({"misfire": "run_all", "catchup_max": 30}),
                window: Some(("01:00", "04:00")),
                first: -1,
                completed: &[(-1, 10)],
                skipped: &[],
                next: 11,
            },
            DstRule {
                name: "every minute, run_once, window 03:05-04:00",
                cron: "* * * * *",
                step: 1,
                policy: json!({"misfire": "run_once"}),
                window: Some(("03:05", "04:00")),
                first: -1,
                completed: &[(10, 10)],
                // 01:59 and 03:00–03:04 local are outside the window.
                skipped: &[("outside_window", (-1, 4)), ("misfire", (5, 9))],
                next: 11,
            },
            DstRule {
                name: "every quarter, run_once",
                cron: "*/15 * * * *",
                step: 15,
                policy: json!({}),
                window: None,
                first: -15,
                completed: &[(-15, 0)],
                skipped: &[],
                next: 15,
            },
        ],
    }
}

/// Fall back in New York (2026-11-01 06:00Z): 01:00–01:59 local happens
/// twice (EDT, then EST). The first service starts at 01:59:50 EDT, the
/// second at 01:40:30 EST.
fn fall_back_new_york() -> DstNight {
    DstNight {
        zone: chrono_tz::America::New_York,
        transition: "2026-11-01T06:00:00Z",
        local_before: (1, 59),
        local_at: (1, 0),
        first_start_s: -10,
        restart_s: 40 * 60 + 30,
        rules: vec![
            DstRule {
                name: "every quarter, run_all, window 01:00-02:00",
                cron: "*/15 * * * *",
                step: 15,
                policy: json!({"misfire": "run_all"}),
                window: Some(("01:00", "02:00")),
                first: -15,
                completed: &[(-15, 30)],
                skipped: &[],
                next: 45,
            },
            DstRule {
                name: "every quarter, run_once, window 01:20-02:00",
                cron: "*/15 * * * *",
                step: 15,
                policy: json!({"misfire": "run_once"}),
                window: Some(("01:20", "02:00")),
                first: -15,
                // 01:45 EDT runs; of 01:00, 01:15, 01:30 EST only the last
                // is in the window, and run_once runs it.
                completed: &[(-15, -15), (30, 30)],
                skipped: &[("outside_window", (0, 15))],
                next: 45,
            },
            DstRule {
                name: "01:30 daily, run_once",
                cron: "30 1 * * *",
                step: 24 * 60,
                policy: json!({}),
                window: None,
                // 01:30 EDT; 01:30 EST (the repeated one) never fires.
                first: -30,
                completed: &[(-30, -30)],
                skipped: &[],
                next: 24 * 60 + 30,
            },
        ],
    }
}

async fn dst_night(db: &TestDb, night: DstNight) {
    let store = db.store().await;
    let z = utc(night.transition);
    let at = |minutes: i64| z + minutes * MINUTE;
    let local = |ms: Millis| {
        let t = ruled::clock::millis_to_utc(ms).with_timezone(&night.zone);
        (t.hour(), t.minute())
    };
    // The scenario itself: the transition is where the test says.
    assert_eq!(
        local(z - MINUTE),
        night.local_before,
        "{}",
        night.transition
    );
    assert_eq!(local(z), night.local_at, "{}", night.transition);

    let first_start = z + night.first_start_s * 1000;
    let mut ids = Vec::new();
    for rule in &night.rules {
        let options = RuleOptions {
            timezone: Some(night.zone.name().to_string()),
            window: rule.window.map(|(f, t)| (f.to_string(), t.to_string())),
            policy: Some(policy(rule.policy.clone())),
            now: Some(first_start - HOUR),
            ..RuleOptions::default()
        };
        let id = insert_rule_with(
            &store,
            rule.cron,
            at(rule.first),
            &[step("noop", json!({}))],
            &options,
        )
        .await;
        ids.push(id);
    }
    let expected: Vec<BTreeMap<Millis, String>> = night
        .rules
        .iter()
        .map(|rule| {
            let mut map = BTreeMap::new();
            let mut add = |(from, to): (i64, i64), outcome: &str| {
                let mut m = from;
                while m <= to {
                    assert!(
                        map.insert(at(m), outcome.to_string()).is_none(),
                        "{}",
                        rule.name
                    );
                    m += rule.step;
                }
            };
            for range in rule.completed {
                add(*range, "completed");
            }
            for (reason, range) in rule.skipped {
                add(*range, reason);
            }
            map
        })
        .collect();

    // The first service: whatever is due when it starts (or falls due
    // while it runs) and the rules' windows allow.
    let dir = tempfile::tempdir().unwrap();
    let first = start_service_on_clock(
        &db.url,
        dir.path(),
        Clock::starting_at(first_start),
        without_delays,
    )
    .await;
    eventually(
        Duration::from_secs(30),
        "the first service ran what was due",
        || async {
            for (rule, id) in night.rules.iter().zip(&ids) {
                let runs = store.executions_for(*id).await.unwrap();
                let due_at_start = expected_first_run(rule);
                let ran = runs.iter().any(|e| e.status == ExecutionStatus::Completed);
                if due_at_start != ran || !all_terminal(&runs) {
                    return false;
                }
            }
            true
        },
    )
    .await;
    first.shutdown("SIGTERM").await.unwrap();

    let restart = z + night.restart_s * 1000;
    let clock = Clock::starting_at(restart);
    let second = start_service_on_clock(&db.url, dir.path(), clock, without_delays).await;
    eventually(Duration::from_secs(60), "the restart settled", || async {
        for ((rule, id), expected) in night.rules.iter().zip(&ids).zip(&expected) {
            let runs = store.executions_for(*id).await.unwrap();
            let row = branch_rule(&store, *id).await;
            if runs.len() < expected.len()
                || !all_terminal(&runs)
                || row.next_run_time != Some(at(rule.next))
                || row.is_currently_running
            {
                return false;
            }
        }
        true
    })
    .await;
    let stopped_at = clock.now_ms();
    second.shutdown("SIGTERM").await.unwrap();

    let mut failures = Vec::new();
    for ((rule, id), expected) in night.rules.iter().zip(&ids).zip(&expected) {
        let runs = store.executions_for(*id).await.unwrap();
        let keys: BTreeSet<Millis> = runs.iter().map(|e| e.scheduled_for).collect();
        if keys.len() != runs.len() {
            failures.push(format!(
                "{}: an occurrence doubled:{}",
                rule.name,
                describe(&runs)
            ));
        } else if outcomes(&runs) != *expected {
            let want: Vec<String> = expected
                .iter()
                .map(|(k, v)| format!("{} {v}", show(*k)))
                .collect();
            failures.push(format!(
                "{}: expected {want:#?}, got:{}",
                rule.name,
                describe(&runs)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} ({}), restarted at {}, stopped at {}:\n{}",
        night.zone.name(),
        night.transition,
        show(restart),
        show(stopped_at),
        failures.join("\n\n")
    );
}

/// Whether the first service runs `rule`'s first occurrence: it is due at
/// the start and the window holds the start (the tables above say so too).
fn expected_first_run(rule: &DstRule) -> bool {
    rule.first < 0
        && rule
            .completed
            .iter()
            .any(|(from, to)| (*from..=*to).contains(&rule.first))
}

both_backends!(
    across_the_spring_dst_night_in_berlin_no_occurrence_is_doubled_or_lost,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let db = db;
        dst_night(
            &db,
            spring_forward(chrono_tz::Europe::Berlin, "2026-03-29T01:00:00Z"),
        )
        .await;
    }
);

both_backends!(
    across_the_spring_dst_night_in_new_york_no_occurrence_is_doubled_or_lost,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let db = db;
        dst_night(
            &db,
            spring_forward(chrono_tz::America::New_York, "2026-03-08T07:00:00Z"),
        )
        .await;
    }
);

both_backends!(
    across_the_autumn_dst_night_in_new_york_the_repeated_hour_is_not_doubled,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let db = db;
        dst_night(&db, fall_back_new_york()).await;
    }
);

// ---- e: start jitter --------------------------------------------------------------

/// How many rules fall due at one instant, and their start_jitter_seconds.
/// The figure is 10,000 over 60 s; by default 2,000 over 20 s run
/// here: 10,000 starts a minute take both cores of a 2-core runner in a
/// debug build (two instances on PostgreSQL fell 5 to 60 s behind whenever
/// anything else ran on the machine). `RULED_JITTER_RULES=10000
/// RULED_JITTER_SECONDS=60` runs the full scale.
fn jitter_scale() -> (usize, u64) {
    let read = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .map(|v| {
                v.parse()
                    .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
            })
            .unwrap_or(default)
    };
    (
        read("RULED_JITTER_RULES", 2_000) as usize,
        read("RULED_JITTER_SECONDS", 20),
    )
}

fn jitter_config(instance_id: &str) -> impl FnOnce(Config) -> Config {
    let instance_id = instance_id.to_string();
    move |config| Config {
        instance_id,
        worker_count: 50,
        // Not the tests' usual 100 ms: each incremental refresh re-reads
        // the last 30 s of changes (CHANGE_WINDOW_SLACK_MS), so at 10,000
        // finishes a minute the plan would spend the run refreshing. Nor
        // the default 20 s: until a refresh, an instance's plan still shows
        // the other instance's finished occurrences as due, and every
        // fetch walks them (up to ~1,700 here, 10-40 ms a fetch in a debug
        // build). An instance's own finishes reach its plan at once.
        plan_refresh_interval: Duration::from_secs(5),
        ..without_delays(config)
    }
}

async fn start_instance(db: &TestDb, instance_id: &str) -> (Service, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let config = jitter_config(instance_id);
    let service = start_service_on_clock(&db.url, dir.path(), Clock::system(), config).await;
    (service, dir)
}

async fn all_executions(store: &Store) -> Vec<Execution> {
    let mut filter = ExecutionFilter {
        limit: 1_000,
        ..ExecutionFilter::default()
    };
    let mut all = Vec::new();
    loop {
        let page = store.list_executions(&filter).await.unwrap();
        let next = filter.next_cursor(&page);
        all.extend(page);
        match next {
            Some(after) => filter.after = Some(after),
            None => return all,
        }
    }
}

/// The jitter tests run one at a time: each needs the machine's pace for
/// its real span of starts, and two at once on a 2-core runner fall behind
/// it. A tokio mutex, since each test has a runtime of its own.
static ONE_JITTER_TEST_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

both_backends!(
    rules_due_at_one_instant_start_spread_over_their_jitter,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let db = db;
        let _alone = ONE_JITTER_TEST_AT_A_TIME.lock().await;
        let began = Instant::now();
        let store = db.store().await;
        let (rules, jitter_seconds) = jitter_scale();
        // Every start lands in one of ten slices of the span.
        let slice_ms = jitter_seconds as Millis * 100;
        let rule_policy = policy(json!({"start_jitter_seconds": jitter_seconds}));
        let far = utc("2030-01-01T00:00:00Z");
        let ids = insert_many_rules(
            &store,
            rules,
            YEARLY,
            far,
            &step("noop", json!({})),
            Some(rule_policy.clone()),
        )
        .await;
        let inserted = began.elapsed();
        // Two instances share PostgreSQL's partitions; SQLite has one.
        let names: &[&str] = match db.backend {
            ruled::store::Backend::Postgres => &["jitter-a", "jitter-b"],
            ruled::store::Backend::Sqlite => &["jitter-a"],
        };
        let mut instances = Vec::new();
        for name in names {
            instances.push(start_instance(&db, name).await);
        }
        for (service, _) in &instances {
            let plan = service.directory().plan().unwrap();
            eventually(
                Duration::from_secs(60),
                "every rule is in the plan",
                || async {
                    ask(&plan, PlanMsg::Snapshot)
                        .await
                        .is_ok_and(|s| s.workflows.len() == rules)
                },
            )
            .await;
        }
        if names.len() > 1 {
            eventually(
                Duration::from_secs(60),
                "the partitions are shared",
                || async {
                    let Ok(view) = store.partition_leases().await else {
                        return false;
                    };
                    let mut held: BTreeMap<String, usize> = BTreeMap::new();
                    for lease in &view.leases {
                        if let Some(holder) = lease.live_holder(view.db_now) {
                            *held.entry(holder.to_string()).or_default() += 1;
                        }
                    }
                    held.len() == names.len()
                        && held.values().sum::<usize>() == 64
                        && held.values().all(|n| *n == 32)
                },
            )
            .await;
        }
        // All due at one instant, a few seconds from now, and every plan
        // told so before then.
        let due = Utc::now().timestamp_millis() + 10_000;
        store
            .execute_sql(&format!(
                "UPDATE branch_rules SET next_run_time = {due}, updated_at = {} \
                 WHERE next_run_time = {far}",
                Utc::now().timestamp_millis()
            ))
            .await
            .unwrap();
        for (service, _) in &instances {
            let refresher = service.directory().refresher().unwrap();
            refresher.cast(RefresherMsg::RefreshNow).unwrap();
        }
        for (service, _) in &instances {
            let plan = service.directory().plan().unwrap();
            eventually(
                Duration::from_secs(10),
                "every plan has the due time",
                || async {
                    ask(&plan, PlanMsg::Snapshot).await.is_ok_and(|s| {
                        s.workflows
                            .iter()
                            .all(|w| w.branch_rule.next_run_time == Some(due))
                    })
                },
            )
            .await;
        }
        assert!(
            Utc::now().timestamp_millis() < due,
            "the plans learned the due time only after it: this machine is too slow for the test"
        );
        let waited = Instant::now();
        eventually(
            Duration::from_secs(jitter_seconds + 120),
            "every rule ran",
            || async {
                let counts = store.count_executions_by_status().await.unwrap();
                counts
                    .iter()
                    .find(|(s, _)| *s == ExecutionStatus::Completed)
                    .is_some_and(|(_, n)| *n as usize >= rules)
            },
        )
        .await;
        let ran_for = waited.elapsed();
        for (service, _dir) in instances {
            service.shutdown("SIGTERM").await.unwrap();
        }

        let executions = all_executions(&store).await;
        let effective = EffectivePolicy::resolve(Some(&rule_policy), None);
        let mut per_rule: BTreeMap<Uuid, usize> = BTreeMap::new();
        let mut slices = [0usize; 10];
        let mut owners: BTreeMap<String, usize> = BTreeMap::new();
        let mut early = Vec::new();
        for e in &executions {
            *per_rule.entry(e.branch_rule_id).or_default() += 1;
            *owners.entry(e.owner.clone()).or_default() += 1;
            assert_eq!(e.scheduled_for, due, "{e:?}");
            assert_eq!(e.status, ExecutionStatus::Completed, "{e:?}");
            let offset = effective.jitter_ms(&e.branch_rule_id);
            if e.requested_at < due + offset {
                early.push(format!(
                    "{} claimed by {} at +{} ms, before its offset {offset} ms",
                    e.branch_rule_id,
                    e.owner,
                    e.requested_at - due
                ));
            }
            let slice = ((e.requested_at - due).max(0) / slice_ms).min(9) as usize;
            slices[slice] += 1;
        }
        assert!(
            early.is_empty(),
            "{} early claims: {:#?}",
            early.len(),
            &early[..early.len().min(20)]
        );
        assert_eq!(per_rule.len(), rules, "every rule ran");
        assert!(
            per_rule.values().all(|n| *n == 1),
            "no occurrence ran twice"
        );
        assert_eq!(
            ids.iter().copied().collect::<BTreeSet<_>>(),
            per_rule.keys().copied().collect::<BTreeSet<_>>()
        );
        // How late after its own start time each claim came, by owner.
        let mut lateness: BTreeMap<&str, Vec<Millis>> = BTreeMap::new();
        for e in &executions {
            let starts_at = due + effective.jitter_ms(&e.branch_rule_id);
            lateness
                .entry(e.owner.as_str())
                .or_default()
                .push(e.requested_at - starts_at);
        }
        let lateness: BTreeMap<&str, String> = lateness
            .into_iter()
            .map(|(owner, mut late)| {
                late.sort_unstable();
                let at = |q: usize| late[(late.len() - 1) * q / 100];
                (
                    owner,
                    format!(
                        "p50 {} ms, p90 {} ms, p99 {} ms, max {} ms",
                        at(50),
                        at(90),
                        at(99),
                        at(100)
                    ),
                )
            })
            .collect();
        eprintln!(
            "jitter on {:?}: claim lateness after the offset {lateness:?}",
            db.backend
        );
        let share = rules / 10;
        assert!(
            slices
                .iter()
                .all(|n| (share * 7 / 10..=share * 13 / 10).contains(n)),
            "every tenth of the span holds a share: {slices:?}"
        );
        assert_eq!(
            owners.len(),
            names.len(),
            "every instance claimed some: {owners:?}"
        );
        eprintln!(
            "jitter on {:?}: {rules} rules over {jitter_seconds} s inserted in {inserted:?}, ran in {ran_for:?}, \
             slices of {slice_ms} ms {slices:?}, by owner {owners:?}, whole test {:?}",
            db.backend,
            began.elapsed()
        );
    }
);

both_backends!(
    a_next_run_time_of_1970_runs_the_latest_occurrence_at_once_with_one_row_for_the_rest,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        // An operator's UPDATE left a minutely rule 29 million occurrences
        // behind: it must neither write a row for each nor wait hours to
        // run again.
        let store = db.store().await;
        let noop = [step("noop", json!({}))];
        let id = insert_rule_with(&store, "* * * * *", 0, &noop, &RuleOptions::default()).await;
        let running = start_service_with(&db.url, without_delays).await;
        // The latest occurrence runs at once.
        wait_for_execution(
            &store,
            id,
            ExecutionStatus::Completed,
            Duration::from_secs(30),
        )
        .await;
        let runs = store.executions_for(id).await.unwrap();
        let skipped: Vec<&Execution> = runs
            .iter()
            .filter(|e| e.status == ExecutionStatus::Skipped)
            .collect();
        assert_eq!(skipped.len(), 1_000, "999 one by one, and one for the rest");
        let oldest = skipped.iter().min_by_key(|e| e.scheduled_for).unwrap();
        assert_eq!(oldest.scheduled_for, 0);
        let error = oldest.error.as_deref().unwrap_or_default();
        assert!(
            error.starts_with("misfire: missed with every later occurrence before"),
            "{error}"
        );
        let ran = runs
            .iter()
            .find(|e| e.status == ExecutionStatus::Completed)
            .unwrap();
        assert!(
            Utc::now().timestamp_millis() - ran.scheduled_for < 2 * MINUTE,
            "the latest occurrence ran: {}",
            show(ran.scheduled_for)
        );
        running.service.shutdown("test").await.unwrap();
        store.close().await;
    }
);

both_backends!(
    rules_waiting_for_their_window_start_when_it_opens_while_others_run,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let store = db.store().await;
        let opens = utc("2026-06-01T22:00:00Z");
        let start = opens - 15_000;
        let options = |window: Option<(&str, &str)>| RuleOptions {
            window: window.map(|(from, to)| (from.to_string(), to.to_string())),
            now: Some(start - MINUTE),
            ..RuleOptions::default()
        };
        let noop = || vec![step("noop", json!({}))];
        // Due at 21:00, held by their 22:00–23:00 window: the fetches that
        // hand out the ready rules below find them waiting and park them
        // at the opening.
        let mut waiting = Vec::new();
        for _ in 0..20 {
            let window = options(Some(("22:00", "23:00")));
            waiting.push(
                insert_rule_with(&store, YEARLY, opens - 60 * MINUTE, &noop(), &window).await,
            );
        }
        let mut ready = Vec::new();
        for _ in 0..20 {
            ready.push(
                insert_rule_with(&store, YEARLY, start - 1_000, &noop(), &options(None)).await,
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let clock = Clock::starting_at(start);
        let service = start_service_on_clock(&db.url, dir.path(), clock, without_delays).await;
        for id in &ready {
            wait_for_execution(
                &store,
                *id,
                ExecutionStatus::Completed,
                Duration::from_secs(30),
            )
            .await;
        }
        assert!(
            clock.now_ms() < opens,
            "the test needs the ready rules done before 22:00"
        );
        for id in &waiting {
            assert!(
                store.executions_for(*id).await.unwrap().is_empty(),
                "{id} ran outside its window"
            );
        }
        // Parked, they are out of the ready set until the opening, where
        // the master's wake finds them.
        assert!(common::service::ready_ids(&service).await.is_empty());
        for id in &waiting {
            wait_for_execution(
                &store,
                *id,
                ExecutionStatus::Completed,
                Duration::from_secs(60),
            )
            .await;
        }
        for id in &waiting {
            let runs = store.executions_for(*id).await.unwrap();
            assert_eq!(runs.len(), 1, "{}", describe(&runs));
            assert_eq!(runs[0].scheduled_for, opens - 60 * MINUTE);
            // On time: the master woke at the opening, not at some later
            // refresh (one minute at most, for a slow CI host).
            assert!(
                (opens..opens + MINUTE).contains(&runs[0].requested_at),
                "requested {} ms after the opening",
                runs[0].requested_at - opens
            );
        }
        service.shutdown("SIGTERM").await.unwrap();
    }
);
