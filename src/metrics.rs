//! Every metric of DESIGN.md §5, registered and described in one place.
//!
//! Rules: one `ruled_` prefix, base units (seconds, ratios), counters end in
//! `_total`, labels are small closed sets and never an id, no pre-computed
//! rates. Code records through the `metrics` macros with these constants;
//! without an installed recorder (library use, most tests) they are no-ops.

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

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

/// Every name above, for tests and docs.
pub const ALL: &[&str] = &[
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
];

/// Describes every metric to the installed recorder.
pub fn describe_all() {
    describe_gauge!(PLAN_WORKFLOWS, "Workflows in the execution plan, by state.");
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
        "Claims of due rules, by result (won, lost, error)."
    );
    describe_counter!(DB_ERRORS_TOTAL, "Database errors, by operation.");
    describe_gauge!(
        BUILD_INFO,
        "Always 1; the version label says which build runs."
    );
}

/// Installs the global Prometheus recorder and describes every metric.
/// Only `ruled serve` calls this; it can be called once per process.
pub fn install() -> Result<PrometheusHandle, metrics_exporter_prometheus::BuildError> {
    let handle = PrometheusBuilder::new()
        // Dispatch lag is milliseconds to minutes; job duration up to the
        // 600 s execution timeout.
        .set_buckets_for_metric(
            Matcher::Full(DISPATCH_LAG_SECONDS.to_string()),
            &[
                0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0, 60.0,
            ],
        )?
        .set_buckets_for_metric(
            Matcher::Full(JOB_DURATION_SECONDS.to_string()),
            &[0.005, 0.025, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 180.0, 600.0],
        )?
        .set_buckets_for_metric(
            Matcher::Suffix("_duration_seconds".to_string()),
            &[0.001, 0.005, 0.025, 0.1, 0.25, 1.0, 2.5, 10.0],
        )?
        .install_recorder()?;
    describe_all();
    metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    Ok(handle)
}
