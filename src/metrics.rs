//! Every metric of DESIGN.md §5, registered and described in one place,
//! plus three the alerts need (the last block of constants).
//!
//! Rules: one `ruled_` prefix, base units (seconds, ratios), counters end in
//! `_total`, labels are small closed sets and never an id, no pre-computed
//! rates. Code records through the `metrics` macros with these constants;
//! without an installed recorder (library use, most tests) they are no-ops.
//!
//! [`install`] also gives every series whose label values are known a first
//! value (counters at 0, empty histograms), so `/metrics` lists every name
//! from the first scrape and `rate()` over a counter starts from a real zero
//! instead of missing its first increment.

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::directory::ActorKind;
use crate::model::ExecutionStatus;
use crate::queue::DedupReason;

pub const PLAN_WORKFLOWS: &str = "ruled_plan_workflows";
pub const PLAN_REFRESH_TOTAL: &str = "ruled_plan_refresh_total";
pub const PLAN_REFRESH_DURATION_SECONDS: &str = "ruled_plan_refresh_duration_seconds";
pub const PLAN_MERGE_CHANGES_TOTAL: &str = "ruled_plan_merge_changes_total";
pub const PLAN_WRITE_TOTAL: &str = "ruled_plan_write_total";
pub const PLAN_WRITE_DURATION_SECONDS: &str = "ruled_plan_write_duration_seconds";
pub const PLAN_WRITE_QUEUE_SIZE: &str = "ruled_plan_write_queue_size";
pub const QUEUE_SIZE: &str = "ruled_queue_size";
pub const ACTIVE_JOBS: &str = "ruled_active_jobs";
pub const WORKERS: &str = "ruled_workers";
pub const JOBS_TOTAL: &str = "ruled_jobs_total";
pub const JOB_DURATION_SECONDS: &str = "ruled_job_duration_seconds";
pub const DISPATCH_LAG_SECONDS: &str = "ruled_dispatch_lag_seconds";
pub const JOBS_DEDUPLICATED_TOTAL: &str = "ruled_jobs_deduplicated_total";
pub const MEMORY_USED_RATIO: &str = "ruled_memory_used_ratio";
pub const MEMORY_THROTTLE_ACTIVE: &str = "ruled_memory_throttle_active";
pub const ACTOR_RESTARTS_TOTAL: &str = "ruled_actor_restarts_total";
pub const LOCK_CLAIMS_TOTAL: &str = "ruled_lock_claims_total";
pub const DB_ERRORS_TOTAL: &str = "ruled_db_errors_total";
pub const BUILD_INFO: &str = "ruled_build_info";

// Beyond DESIGN.md §5, for the alerts in prometheus/alerts.yml.
pub const PLAN_READY_WORKFLOWS: &str = "ruled_plan_ready_workflows";
pub const PLAN_MISSED_WINDOW_WORKFLOWS: &str = "ruled_plan_missed_window_workflows";
pub const ACTOR_ALIVE: &str = "ruled_actor_alive";

// Several instances on one database (DESIGN §5, cluster names).
pub const PARTITION_LEASES_HELD: &str = "ruled_partition_leases_held";
pub const FAILOVERS_TOTAL: &str = "ruled_failovers_total";
pub const PARTITION_LEASE_CHANGES_TOTAL: &str = "ruled_partition_lease_changes_total";
pub const SELF_FENCES_TOTAL: &str = "ruled_self_fences_total";
pub const STALE_LOCKS_TOTAL: &str = "ruled_stale_locks_total";
pub const COMMAND_LEFTOVERS_KILLED_TOTAL: &str = "ruled_command_leftovers_killed_total";

// History kept (issue 12): catalog deletes that would erase executions.
pub const CATALOG_ARCHIVED_TOTAL: &str = "ruled_catalog_archived_total";
pub const CATALOG_DELETES_REFUSED_TOTAL: &str = "ruled_catalog_deletes_refused_total";

// Quarantine of bad plan rows (DESIGN §5, hardening names).
pub const PLAN_ROWS_REJECTED_TOTAL: &str = "ruled_plan_rows_rejected_total";

// Scheduling policies (DESIGN §5, policy names).
pub const OCCURRENCES_SKIPPED_TOTAL: &str = "ruled_occurrences_skipped_total";
pub const RETRIES_TOTAL: &str = "ruled_retries_total";

// Capacity (DESIGN §5, scale names, and the backlog watch beside it).
pub const CAPACITY_JOBS_PER_SECOND: &str = "ruled_capacity_jobs_per_second";
pub const PLAN_WRITE_BYTES_TOTAL: &str = "ruled_plan_write_bytes_total";
pub const EXECUTIONS_PRUNED_TOTAL: &str = "ruled_executions_pruned_total";
pub const EXECUTIONS_OLDEST_KEPT_TIMESTAMP_SECONDS: &str =
    "ruled_executions_oldest_kept_timestamp_seconds";
pub const READY_BACKLOG_GROWING: &str = "ruled_ready_backlog_growing";

/// Every name above, for tests and docs.
pub const ALL: &[&str] = &[
    CAPACITY_JOBS_PER_SECOND,
    PLAN_WRITE_BYTES_TOTAL,
    EXECUTIONS_PRUNED_TOTAL,
    EXECUTIONS_OLDEST_KEPT_TIMESTAMP_SECONDS,
    READY_BACKLOG_GROWING,
    PLAN_ROWS_REJECTED_TOTAL,
    OCCURRENCES_SKIPPED_TOTAL,
    RETRIES_TOTAL,
    PLAN_WORKFLOWS,
    PLAN_REFRESH_TOTAL,
    PLAN_REFRESH_DURATION_SECONDS,
    PLAN_MERGE_CHANGES_TOTAL,
    PLAN_WRITE_TOTAL,
    PLAN_WRITE_DURATION_SECONDS,
    PLAN_WRITE_QUEUE_SIZE,
    QUEUE_SIZE,
    ACTIVE_JOBS,
    WORKERS,
    JOBS_TOTAL,
    JOB_DURATION_SECONDS,
    DISPATCH_LAG_SECONDS,
    JOBS_DEDUPLICATED_TOTAL,
    MEMORY_USED_RATIO,
    MEMORY_THROTTLE_ACTIVE,
    ACTOR_RESTARTS_TOTAL,
    LOCK_CLAIMS_TOTAL,
    DB_ERRORS_TOTAL,
    BUILD_INFO,
    PLAN_READY_WORKFLOWS,
    PLAN_MISSED_WINDOW_WORKFLOWS,
    ACTOR_ALIVE,
    PARTITION_LEASES_HELD,
    FAILOVERS_TOTAL,
    PARTITION_LEASE_CHANGES_TOTAL,
    SELF_FENCES_TOTAL,
    STALE_LOCKS_TOTAL,
    COMMAND_LEFTOVERS_KILLED_TOTAL,
    CATALOG_ARCHIVED_TOTAL,
    CATALOG_DELETES_REFUSED_TOTAL,
];

/// The `op` label values of [`DB_ERRORS_TOTAL`]; a unit test checks that
/// every one recorded in `src/` is listed.
pub const DB_ERROR_OPS: &[&str] = &[
    "action_steps",
    "claim",
    "finish",
    "finish_row",
    "cancel_requests",
    "heartbeat",
    "leases",
    "leave",
    "mark_running",
    "mark_scheduled",
    "outbox",
    "prune",
    "recover_owner",
    "refresh",
    "renew_lock",
    "skip",
    "stale_owners",
    "takeover",
    "withdraw_claim",
];

/// The `table` label values of [`PLAN_ROWS_REJECTED_TOTAL`]: the tables
/// the plan reads.
pub const PLAN_TABLES: &[&str] = &[
    "brands",
    "branches",
    "rules",
    "brand_rules",
    "action_templates",
    "branch_rules",
    "action_details",
];

/// The (table, reason) series of [`PLAN_ROWS_REJECTED_TOTAL`] that can
/// occur beside `decode`, which any table can have.
const REJECTED_VALUE_SERIES: &[(&str, &str)] = &[
    ("rules", "cron"),
    ("brand_rules", "cron"),
    ("branches", "zone"),
    ("branch_rules", "window"),
    ("rules", "policy"),
    ("branch_rules", "policy"),
];

/// The `kind` label values of [`PLAN_MERGE_CHANGES_TOTAL`].
pub const MERGE_CHANGE_KINDS: &[&str] = &["added", "updated", "removed", "preserved", "pruned"];

/// Describes every metric to the installed recorder.
pub fn describe_all() {
    describe_counter!(
        EXECUTIONS_PRUNED_TOTAL,
        "Finished executions deleted because they were older than EXECUTION_RETENTION_DAYS."
    );
    describe_gauge!(
        EXECUTIONS_OLDEST_KEPT_TIMESTAMP_SECONDS,
        Unit::Seconds,
        "When the oldest execution kept was requested (Unix time), after the last prune."
    );
    describe_counter!(
        PLAN_WRITE_BYTES_TOTAL,
        Unit::Bytes,
        "Bytes written to the plan file, by kind (snapshot: the whole plan; journal: the changes since)."
    );
    describe_gauge!(
        CAPACITY_JOBS_PER_SECOND,
        "Jobs per second the workers sustain with every slot busy: WORKER_COUNT / (mean job length + the cooldown in single-job mode)."
    );
    describe_gauge!(
        READY_BACKLOG_GROWING,
        "1 while the ready backlog outgrows the workers (its lowest point rose from one minute to the next), 0 once they catch up."
    );
    describe_gauge!(
        PLAN_WORKFLOWS,
        "Workflows in the execution plan, by state (active, held, inactive, running, removed)."
    );
    describe_counter!(
        PLAN_ROWS_REJECTED_TOTAL,
        "Plan rows quarantined (kept out of the plan), by table and reason (decode, cron, zone, window, policy); counted once when a row enters the quarantine."
    );
    describe_counter!(
        OCCURRENCES_SKIPPED_TOTAL,
        "Occurrences recorded skipped by policy, by reason (misfire, outside_window, catchup_window, catchup_max, overlap)."
    );
    describe_counter!(
        RETRIES_TOTAL,
        "Retries scheduled after a failed or timed-out run (policy max_attempts)."
    );
    describe_counter!(
        PLAN_REFRESH_TOTAL,
        "Plan refreshes from SQL, by result (ok, error)."
    );
    describe_histogram!(
        PLAN_REFRESH_DURATION_SECONDS,
        Unit::Seconds,
        "Time to read the plan from SQL and merge it."
    );
    describe_counter!(
        PLAN_MERGE_CHANGES_TOTAL,
        "Workflows changed by smart merge, by kind (added, updated, removed, preserved, pruned)."
    );
    describe_counter!(
        PLAN_WRITE_TOTAL,
        "Plan file writes, by result (ok, error, dropped)."
    );
    describe_histogram!(
        PLAN_WRITE_DURATION_SECONDS,
        Unit::Seconds,
        "Time to write the plan file: serialize, write, fsync, rename."
    );
    describe_gauge!(
        PLAN_WRITE_QUEUE_SIZE,
        "Plan snapshots waiting to be written."
    );
    describe_gauge!(QUEUE_SIZE, "Jobs queued for a worker.");
    describe_gauge!(ACTIVE_JOBS, "Jobs running on a worker.");
    describe_gauge!(
        WORKERS,
        "Worker actors, by state (configured, alive, busy)."
    );
    describe_counter!(
        JOBS_TOTAL,
        "Finished jobs, by outcome (completed, failed, cancelled, timed_out)."
    );
    describe_histogram!(
        JOB_DURATION_SECONDS,
        Unit::Seconds,
        "Job run time, started to finished."
    );
    describe_histogram!(
        DISPATCH_LAG_SECONDS,
        Unit::Seconds,
        "Delay from an occurrence's due time to its start on a worker."
    );
    describe_counter!(
        JOBS_DEDUPLICATED_TOTAL,
        "Ready rules not queued, by reason (queued, active, recent, running)."
    );
    describe_gauge!(
        MEMORY_USED_RATIO,
        "Memory in use, 0 to 1, by resource (ram, swap, gpu)."
    );
    describe_gauge!(
        MEMORY_THROTTLE_ACTIVE,
        "1 while the memory guard holds new work back."
    );
    describe_counter!(
        ACTOR_RESTARTS_TOTAL,
        "Actor restarts by the supervisor, by actor."
    );
    describe_counter!(
        LOCK_CLAIMS_TOTAL,
        "Claims of due rules, by result (won, lost, error; withdrawn: a claim made ahead of its due time given back unrun, at a graceful stop or a memory throttle)."
    );
    describe_counter!(DB_ERRORS_TOTAL, "Database errors, by operation.");
    describe_gauge!(
        BUILD_INFO,
        "Always 1; the version label says which build runs."
    );
    describe_gauge!(
        PLAN_READY_WORKFLOWS,
        "Workflows ready to run (due, in their window, not running) at the last look, \
         up to MAX_RUNS_PER_TICK."
    );
    describe_gauge!(
        PLAN_MISSED_WINDOW_WORKFLOWS,
        "Due workflows whose operation window opened and closed again without them running; \
         they wait for the next opening."
    );
    describe_gauge!(
        PARTITION_LEASES_HELD,
        "Partition leases this instance holds (PARTITION_COUNT in all across live instances)."
    );
    describe_counter!(
        FAILOVERS_TOTAL,
        "Silent instances taken over: their open executions failed worker_lost, their claims released."
    );
    describe_counter!(
        PARTITION_LEASE_CHANGES_TOTAL,
        "Partition leases acquired, released or lost by this instance, by change."
    );
    describe_counter!(
        SELF_FENCES_TOTAL,
        "Times this instance could not renew its heartbeat within the lease TTL and stopped its own jobs."
    );
    describe_counter!(
        COMMAND_LEFTOVERS_KILLED_TOTAL,
        "Processes a command action of an earlier run left running when ruled died (SIGKILL), killed at start before their occurrences run again."
    );
    describe_counter!(
        STALE_LOCKS_TOTAL,
        "Branch rule locks of other holders found stale (older than SCHEDULE_LOCK_TIMEOUT_SECONDS, or stamped further ahead than it): their rules are offered to claims again."
    );
    describe_counter!(
        CATALOG_ARCHIVED_TOTAL,
        "Brands, branches, rules and branch rules archived (?cascade=archive) with their history kept, by table."
    );
    describe_counter!(
        CATALOG_DELETES_REFUSED_TOTAL,
        "Deletes refused because the row has execution history, by table."
    );
    describe_gauge!(
        ACTOR_ALIVE,
        "1 while the supervisor has the actor running, 0 while it waits to restart it, by actor."
    );
}

/// Gives every series with known label values its starting value; see the
/// module doc. Gauges only where the value is known before anything
/// happens (nothing queued, not throttled); the rest are set by their
/// owners as they start.
pub fn register_known_series() {
    use metrics::{counter, gauge, histogram};
    for result in ["ok", "error"] {
        counter!(PLAN_REFRESH_TOTAL, "result" => result).increment(0);
    }
    for table in PLAN_TABLES {
        counter!(PLAN_ROWS_REJECTED_TOTAL, "table" => *table, "reason" => "decode").increment(0);
    }
    for (table, reason) in REJECTED_VALUE_SERIES {
        counter!(PLAN_ROWS_REJECTED_TOTAL, "table" => *table, "reason" => *reason).increment(0);
    }
    for kind in MERGE_CHANGE_KINDS {
        counter!(PLAN_MERGE_CHANGES_TOTAL, "kind" => *kind).increment(0);
    }
    for result in ["ok", "error", "dropped"] {
        counter!(PLAN_WRITE_TOTAL, "result" => result).increment(0);
    }
    for kind in ["snapshot", "journal"] {
        counter!(PLAN_WRITE_BYTES_TOTAL, "kind" => kind).increment(0);
    }
    for status in ExecutionStatus::ALL.into_iter().filter(|s| s.is_terminal()) {
        counter!(JOBS_TOTAL, "outcome" => status.as_str()).increment(0);
    }
    for reason in DedupReason::ALL {
        counter!(JOBS_DEDUPLICATED_TOTAL, "reason" => reason.as_str()).increment(0);
    }
    for kind in ActorKind::START_ORDER {
        counter!(ACTOR_RESTARTS_TOTAL, "actor" => kind.as_str()).increment(0);
    }
    for result in ["won", "lost", "error", "withdrawn"] {
        counter!(LOCK_CLAIMS_TOTAL, "result" => result).increment(0);
    }
    for op in DB_ERROR_OPS {
        counter!(DB_ERRORS_TOTAL, "op" => *op).increment(0);
    }
    for name in [
        PLAN_REFRESH_DURATION_SECONDS,
        PLAN_WRITE_DURATION_SECONDS,
        JOB_DURATION_SECONDS,
        DISPATCH_LAG_SECONDS,
    ] {
        // Registering is enough: an empty histogram renders its buckets at 0.
        let _ = histogram!(name);
    }
    gauge!(PLAN_WRITE_QUEUE_SIZE).set(0.0);
    gauge!(QUEUE_SIZE).set(0.0);
    gauge!(ACTIVE_JOBS).set(0.0);
    gauge!(MEMORY_THROTTLE_ACTIVE).set(0.0);
    gauge!(READY_BACKLOG_GROWING).set(0.0);
    gauge!(PARTITION_LEASES_HELD).set(0.0);
    counter!(FAILOVERS_TOTAL).increment(0);
    counter!(RETRIES_TOTAL).increment(0);
    counter!(EXECUTIONS_PRUNED_TOTAL).increment(0);
    for reason in crate::schedule::SkipReason::ALL {
        counter!(OCCURRENCES_SKIPPED_TOTAL, "reason" => reason.as_str()).increment(0);
    }
    counter!(SELF_FENCES_TOTAL).increment(0);
    counter!(STALE_LOCKS_TOTAL).increment(0);
    counter!(COMMAND_LEFTOVERS_KILLED_TOTAL).increment(0);
    for table in ["brands", "branches", "rules", "branch_rules"] {
        counter!(CATALOG_ARCHIVED_TOTAL, "table" => table).increment(0);
        counter!(CATALOG_DELETES_REFUSED_TOTAL, "table" => table).increment(0);
    }
    for change in ["acquired", "released", "lost"] {
        counter!(PARTITION_LEASE_CHANGES_TOTAL, "change" => change).increment(0);
    }
}

/// How often [`install`]'s thread drains histogram samples into buckets.
const UPKEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// The exporter with ruled's histogram buckets (every histogram is in
/// seconds; a full-name match wins over the suffix match).
pub fn builder() -> Result<PrometheusBuilder, metrics_exporter_prometheus::BuildError> {
    PrometheusBuilder::new()
        // Dispatch lag is milliseconds when all is well, seconds after a
        // start-up grace period, and up to hours for a rule that waited for
        // its window to open; job duration runs up to the 600 s execution
        // timeout.
        .set_buckets_for_metric(
            Matcher::Full(DISPATCH_LAG_SECONDS.to_string()),
            &[
                0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0, 60.0, 300.0,
                3600.0,
            ],
        )?
        .set_buckets_for_metric(
            Matcher::Full(JOB_DURATION_SECONDS.to_string()),
            &[0.005, 0.025, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 180.0, 600.0],
        )?
        // Plan refreshes and plan-file writes: milliseconds, seconds when
        // the database or disk struggles.
        .set_buckets_for_metric(
            Matcher::Suffix("_duration_seconds".to_string()),
            &[0.001, 0.005, 0.025, 0.1, 0.25, 1.0, 2.5, 10.0],
        )
}

/// Installs the global Prometheus recorder, describes every metric and
/// registers the known series. Only `ruled serve` calls this; it can be
/// called once per process.
pub fn install() -> Result<PrometheusHandle, metrics_exporter_prometheus::BuildError> {
    let handle = builder()?.install_recorder()?;
    // Histogram samples wait in the recorder until upkeep folds them into
    // the buckets. `/metrics` runs it before rendering, but with nobody
    // scraping the samples would pile up, so a thread runs it as well.
    let upkeep = handle.clone();
    std::thread::Builder::new()
        .name("metrics-upkeep".into())
        .spawn(move || {
            loop {
                std::thread::sleep(UPKEEP_INTERVAL);
                upkeep.run_upkeep();
            }
        })
        .map_err(|e| {
            metrics_exporter_prometheus::BuildError::FailedToCreateRuntime(e.to_string())
        })?;
    describe_all();
    register_known_series();
    metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Renders what a fresh `ruled serve` exports before anything happens.
    fn rendered_at_start(extra: impl FnOnce()) -> String {
        let recorder = builder().unwrap().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            describe_all();
            register_known_series();
            extra();
        });
        handle.render()
    }

    /// `(CONSTANT, label, value)` for each counter recorded in `src/` with a
    /// literal label value: `m::DB_ERRORS_TOTAL, "op" => "claim"`.
    fn literal_label_values() -> Vec<(String, String, String)> {
        fn walk(dir: &std::path::Path, found: &mut Vec<(String, String, String)>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    walk(&path, found);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
                    for rest in text.split("m::").skip(1) {
                        let Some((constant, rest)) = rest.split_once(", \"") else {
                            continue;
                        };
                        let Some((label, rest)) = rest.split_once("\" => \"") else {
                            continue;
                        };
                        let Some((value, _)) = rest.split_once('"') else {
                            continue;
                        };
                        let ident = |s: &str| {
                            !s.is_empty()
                                && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                        };
                        if ident(constant) && ident(label) && ident(value) {
                            found.push((constant.into(), label.into(), value.into()));
                        }
                    }
                }
            }
        }
        let mut found = Vec::new();
        walk(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut found,
        );
        found
    }

    #[test]
    fn every_counter_series_recorded_in_the_source_exists_from_the_start() {
        let rendered = rendered_at_start(|| {});
        let found = literal_label_values();
        assert!(
            found.contains(&("DB_ERRORS_TOTAL".into(), "op".into(), "claim".into())),
            "the source scan found too little: {found:?}"
        );
        let mut counters = 0;
        for (constant, label, value) in found {
            let name = format!("ruled_{}", constant.to_lowercase());
            assert!(
                ALL.contains(&name.as_str()),
                "{name} is not in metrics::ALL"
            );
            if !name.ends_with("_total") {
                continue; // gauges are set by their owners as they start
            }
            counters += 1;
            let series = format!("{name}{{{label}=\"{value}\"}} 0");
            assert!(
                rendered.lines().any(|line| line == series),
                "{series} is recorded in src/ but not registered at start:\n{rendered}"
            );
        }
        assert!(counters >= 20, "only {counters} counter series found");
    }

    #[test]
    fn every_series_with_an_enum_label_exists_from_the_start() {
        let rendered = rendered_at_start(|| {});
        for line in [
            "ruled_jobs_total{outcome=\"completed\"} 0",
            "ruled_jobs_total{outcome=\"timed_out\"} 0",
            "ruled_jobs_deduplicated_total{reason=\"recent\"} 0",
            "ruled_actor_restarts_total{actor=\"writer\"} 0",
            "ruled_actor_restarts_total{actor=\"memory_guard\"} 0",
            "ruled_dispatch_lag_seconds_count 0",
            "ruled_job_duration_seconds_count 0",
            "ruled_plan_refresh_duration_seconds_count 0",
            "ruled_plan_write_duration_seconds_count 0",
            "ruled_memory_throttle_active 0",
            "ruled_queue_size 0",
        ] {
            assert!(
                rendered.lines().any(|l| l == line),
                "{line} missing:\n{rendered}"
            );
        }
        assert!(
            !rendered.contains("outcome=\"running\""),
            "only terminal outcomes"
        );
    }

    #[test]
    fn histograms_use_the_buckets_for_their_range() {
        let rendered = rendered_at_start(|| {
            metrics::histogram!(DISPATCH_LAG_SECONDS).record(0.003);
            metrics::histogram!(JOB_DURATION_SECONDS).record(120.0);
            metrics::histogram!(PLAN_REFRESH_DURATION_SECONDS).record(0.02);
        });
        for line in [
            "ruled_dispatch_lag_seconds_bucket{le=\"0.001\"} 0",
            "ruled_dispatch_lag_seconds_bucket{le=\"0.005\"} 1",
            "ruled_dispatch_lag_seconds_bucket{le=\"3600\"} 1",
            "ruled_job_duration_seconds_bucket{le=\"60\"} 0",
            "ruled_job_duration_seconds_bucket{le=\"180\"} 1",
            "ruled_job_duration_seconds_bucket{le=\"600\"} 1",
            "ruled_plan_refresh_duration_seconds_bucket{le=\"0.025\"} 1",
            "ruled_plan_refresh_duration_seconds_bucket{le=\"10\"} 1",
        ] {
            assert!(
                rendered.lines().any(|l| l == line),
                "{line} missing:\n{rendered}"
            );
        }
        assert!(
            !rendered.contains("ruled_job_duration_seconds_bucket{le=\"0.001\"}"),
            "the full-name buckets win over the suffix match"
        );
    }

    #[test]
    fn every_metric_is_described_with_the_prefix_and_no_id_label() {
        // The gauges their owners set as they start, set here instead.
        let rendered = rendered_at_start(|| {
            for name in ALL {
                let histogram = name.ends_with("_seconds") && !name.ends_with("_timestamp_seconds");
                if !name.ends_with("_total") && !histogram {
                    metrics::gauge!(*name).set(1.0);
                }
            }
        });
        for name in ALL {
            assert!(name.starts_with("ruled_"), "{name}");
            assert!(!name.contains("_id"), "{name}");
            assert!(
                rendered.contains(&format!("# HELP {name} ")),
                "{name} is not described (or not registered at start):\n{rendered}"
            );
        }
    }
}
