//! What the API answers, as types: every response body is one of these, so
//! the OpenAPI document's schemas are the code's own and a field added here
//! is added to both.
//!
//! Catalog rows come from the store as column maps ([`crate::store::rows`])
//! and are read into these types by serde ([`from_row`]): a column the
//! table gains and the type lacks fails the `views_cover_every_column`
//! test rather than disappearing from the API. Ids are shown as stored
//! (strings of UUID format): a row an operator wrote with SQL is listed,
//! not turned into a 500.

use serde::de::{DeserializeOwned, IgnoredAny};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;
use uuid::Uuid;

use super::error::ApiError;
use super::schema::Timestamp;
use crate::actions::secrets;
use crate::messages::master::CancelOutcome;
use crate::messages::plan::Readiness;
use crate::model::{ExecutionStatus, RejectedRow};
use crate::plan::PlanStats;
use crate::queue::QueueStats;
use crate::schedule::{EffectivePolicy, Policy, SkipReason};

/// A stored row read into its view, secrets hidden on the way: the JSON
/// columns by the action config schema, URLs in error text. A stored
/// `policy` is shown as the plan reads it (`{}` is none, `null`), and one
/// that is not a policy (written with SQL) as `null` with `policy_error`
/// saying why, not turned into a 500.
pub fn from_row<T: DeserializeOwned>(mut row: Map<String, Value>) -> Result<T, ApiError> {
    for (key, value) in row.iter_mut() {
        match key.as_str() {
            "params" | "config" => *value = secrets::redact_config(value),
            "settings" => *value = secrets::redact_named(value),
            _ => {}
        }
    }
    if row.contains_key("policy") {
        let policy = match stored_policy(row.get("policy")) {
            Ok(policy) => serde_json::to_value(policy).unwrap_or(Value::Null),
            Err(problem) => {
                row.insert("policy_error".into(), Value::String(problem));
                Value::Null
            }
        };
        row.insert("policy".into(), policy);
    }
    from_value(Value::Object(row))
}

/// A field of a view that no column holds (the presenter fills it in):
/// whatever a row has under its name is ignored.
fn not_stored<'de, D: Deserializer<'de>, T>(deserializer: D) -> Result<Option<T>, D::Error> {
    IgnoredAny::deserialize(deserializer)?;
    Ok(None)
}

/// A `policy` column as read ([`crate::store::rows`] parses its JSON
/// text, and gives text that is not JSON as a string): none for `NULL` or
/// `{}`, or why it is not a policy (the field and what is wrong with it).
pub fn stored_policy(column: Option<&Value>) -> Result<Option<Policy>, String> {
    match column {
        None | Some(Value::Null) => Ok(None),
        // Empty text, which the plan reads as no policy too.
        Some(Value::String(text)) if text.trim().is_empty() => Ok(None),
        // No policy is a string: the text is not JSON (the parser says
        // where), or a JSON string.
        Some(Value::String(text)) => Err(match Policy::from_json_text(Some(text)) {
            Err(problem) => problem,
            Ok(_) => format!("policy: {text:?} is a JSON string, not an object"),
        }),
        Some(value) => Policy::from_json_text(Some(&value.to_string())),
    }
}

/// A value read into its view; one that does not fit is a 500, logged.
pub fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, ApiError> {
    serde_json::from_value(value).map_err(|e| {
        ApiError::Store(crate::store::StoreError::Decode {
            table: "API view",
            id: String::new(),
            column: "?",
            message: e.to_string(),
        })
    })
}

/// `created_by` and `updated_by`: the name of the API token that made the
/// change (`API_TOKENS=name:token`), `null` for rows written otherwise.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Brand {
    #[schema(format = Uuid)]
    pub id: String,
    pub name: String,
    #[schema(value_type = Object)]
    pub settings: Value,
    /// Why the stored `settings` is not JSON (written with SQL), when it is
    /// not; `settings` is then `{}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings_error: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub created_by: Option<String>,
    pub updated_by: Option<String>,
    /// Set by `DELETE …?cascade=archive`; archived rows leave listings.
    pub archived_at: Option<Timestamp>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Branch {
    #[schema(format = Uuid)]
    pub id: String,
    #[schema(format = Uuid)]
    pub brand_id: String,
    pub name: String,
    /// IANA zone its rules run in; `null`: DEFAULT_TIMEZONE.
    pub timezone: Option<String>,
    pub is_active: bool,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub created_by: Option<String>,
    pub updated_by: Option<String>,
    pub archived_at: Option<Timestamp>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RuleStatus {
    Active,
    Inactive,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Rule {
    #[schema(format = Uuid)]
    pub id: String,
    #[schema(format = Uuid)]
    pub brand_id: Option<String>,
    pub name: String,
    pub status: RuleStatus,
    pub cron_expression: String,
    #[schema(value_type = Object)]
    pub settings: Value,
    /// Why the stored `settings` is not JSON (written with SQL), when it is
    /// not; `settings` is then `{}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings_error: Option<String>,
    /// The scheduling policy of its branch rules, as stored; each may
    /// override any field. `null`: none (the defaults).
    pub policy: Option<Policy>,
    /// Why the stored policy is not one (written with SQL), when it is
    /// not; `policy` is then `null` and the plan holds its branch rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_error: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub created_by: Option<String>,
    pub updated_by: Option<String>,
    pub archived_at: Option<Timestamp>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ActionTemplate {
    #[schema(format = Uuid)]
    pub id: String,
    pub name: String,
    /// The action kind: http, sleep, noop, command, …
    pub kind: String,
    /// Secret fields (header values, body fields, URL credentials,
    /// credential-named keys) are shown as `***`; sending `***` back keeps
    /// the stored value.
    #[schema(value_type = Object)]
    pub config: Value,
    /// Why the stored `config` is not JSON (written with SQL), when it is
    /// not; `config` is then `{}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_error: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub created_by: Option<String>,
    pub updated_by: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ActionDetail {
    #[schema(format = Uuid)]
    pub id: String,
    #[schema(format = Uuid)]
    pub branch_rule_id: String,
    #[schema(format = Uuid)]
    pub action_template_id: String,
    /// Where it runs among its branch rule's details, lowest first.
    pub position: i64,
    /// Merged over the template's config at run time; secrets as `***`.
    #[schema(value_type = Object)]
    pub params: Value,
    /// Why the stored `params` is not JSON (written with SQL), when it is
    /// not; `params` is then `{}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params_error: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub created_by: Option<String>,
    pub updated_by: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BranchRule {
    #[schema(format = Uuid)]
    pub id: String,
    #[schema(format = Uuid)]
    pub branch_id: String,
    #[schema(format = Uuid)]
    pub rule_id: String,
    #[schema(format = Uuid)]
    pub brand_rule_id: Option<String>,
    pub is_active: bool,
    pub is_archived: bool,
    pub is_force_stopped: bool,
    pub is_currently_running: bool,
    /// The daily operation window, `HH:MM` in the branch's zone; both or
    /// neither.
    pub operation_time_from: Option<String>,
    pub operation_time_to: Option<String>,
    /// `null`: no next run (the plan holds the rule until it is fixed).
    pub next_run_time: Option<Timestamp>,
    pub last_run_time: Option<Timestamp>,
    /// The instance holding the claim, while one does.
    pub lock_holder: Option<String>,
    pub lock_time: Option<Timestamp>,
    pub lock_epoch: i64,
    #[schema(value_type = Object)]
    pub params: Value,
    /// Why the stored `params` is not JSON (written with SQL), when it is
    /// not; `params` is then `{}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params_error: Option<String>,
    /// Overrides fields of its rule's policy, as stored; `null`: none.
    pub policy: Option<Policy>,
    /// A retry is pending: the occurrence it retries (`next_run_time` is
    /// the retry's time). `null`: none.
    pub retry_of: Option<Timestamp>,
    /// Failed attempts of the occurrence in `retry_of`, counted against
    /// `max_attempts`.
    pub failed_attempts: i64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub created_by: Option<String>,
    pub updated_by: Option<String>,
    /// The policy in force: its own fields, then its rule's, then the
    /// defaults. `null` when a stored policy, its own or its rule's, is
    /// not one (`policy_error` says why; the plan holds it until fixed).
    #[serde(default, deserialize_with = "not_stored")]
    pub effective_policy: Option<EffectivePolicy>,
    /// Why its stored policy or its rule's is not one, when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_error: Option<String>,
    /// `next_run_time` in the branch's zone, with its offset; `null` when
    /// that falls past the year 9999.
    #[serde(default)]
    #[schema(format = DateTime)]
    pub next_run_time_local: Option<String>,
    /// The zone the schedule runs in (the branch's, else the default);
    /// `null` when the stored one is invalid.
    #[serde(default)]
    pub timezone: Option<String>,
    /// Why no schedule can be computed, when none can.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_error: Option<String>,
    /// Its actions in the order they run.
    #[serde(default)]
    pub action_details: Vec<ActionDetail>,
}

/// One run of a branch rule: every state's time is kept.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Execution {
    pub id: Uuid,
    pub branch_rule_id: Uuid,
    /// The occurrence's due time.
    pub scheduled_for: Timestamp,
    pub status: ExecutionStatus,
    #[schema(minimum = 1)]
    pub attempt: i64,
    /// INSTANCE_ID of the instance that claimed it.
    pub owner: String,
    pub lock_epoch: i64,
    pub requested_at: Timestamp,
    pub scheduled_at: Option<Timestamp>,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    pub error: Option<String>,
    /// Response captures and program output: only for requests carrying
    /// the token; others get `{"hidden": true, "reason": …}`.
    #[schema(value_type = Option<Object>)]
    pub output: Option<Value>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// An action's output as the API shows it: only to callers holding the
/// token, since response captures can echo credentials.
pub fn shown_output(output: &Value, with_token: bool) -> Value {
    if with_token {
        secrets::redact_named(output)
    } else {
        super::present::output_needs_token()
    }
}

impl Execution {
    /// The API's view of a stored execution (see [`shown_output`]).
    pub fn shown(execution: &crate::model::Execution, with_token: bool) -> Execution {
        let output = execution
            .output
            .as_ref()
            .map(|output| shown_output(output, with_token));
        Execution {
            id: execution.id,
            branch_rule_id: execution.branch_rule_id,
            scheduled_for: Timestamp(execution.scheduled_for),
            status: execution.status,
            attempt: execution.attempt,
            owner: execution.owner.clone(),
            lock_epoch: execution.lock_epoch,
            requested_at: Timestamp(execution.requested_at),
            scheduled_at: execution.scheduled_at.map(Timestamp),
            started_at: execution.started_at.map(Timestamp),
            finished_at: execution.finished_at.map(Timestamp),
            error: execution
                .error
                .as_deref()
                .map(|text| secrets::mask_urls(text).into_owned()),
            output,
            created_at: Timestamp(execution.created_at),
            updated_at: Timestamp(execution.updated_at),
        }
    }
}

/// A page of executions, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct ExecutionPage {
    pub items: Vec<Execution>,
    /// Pass as `cursor` for the next page; `null` on the last.
    pub next_cursor: Option<String>,
}

/// Run now accepted: the rule is due at once.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunAccepted {
    pub id: Uuid,
    pub next_run_time: Timestamp,
}

/// What force-stop did to the rule's run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunCancel {
    /// It was still queued here; it is recorded cancelled.
    CancelledBeforeHandoff,
    /// A worker here runs it and was told to cancel.
    CancelSentToWorker,
    /// Nothing of it runs here.
    NotInFlight,
    /// Another instance runs it and acts on the request at its next lease
    /// round (`owner` names it).
    Requested,
    /// The same, for a cancel: the request is recorded for its owner.
    CancelRequested,
}

impl From<CancelOutcome> for RunCancel {
    fn from(outcome: CancelOutcome) -> RunCancel {
        match outcome {
            CancelOutcome::CancelledBeforeHandoff => RunCancel::CancelledBeforeHandoff,
            CancelOutcome::CancelSentToWorker => RunCancel::CancelSentToWorker,
            CancelOutcome::NotInFlight => RunCancel::NotInFlight,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ForceStopped {
    pub id: Uuid,
    pub is_force_stopped: bool,
    pub cancel: RunCancel,
    /// The run being cancelled on another instance, when one is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// A cancel accepted: done here, or recorded for the instance that runs it.
#[derive(Debug, Serialize, ToSchema)]
pub struct CancelAccepted {
    pub id: Uuid,
    pub outcome: RunCancel,
    /// INSTANCE_ID of the instance that runs it.
    pub owner: String,
}

/// What `DELETE …?cascade=archive` archived and cancelled.
#[derive(Debug, Serialize, ToSchema)]
pub struct Archived {
    pub archived: Vec<Uuid>,
    pub branch_rules_archived: Vec<Uuid>,
    pub cancelled: Vec<CancelledRun>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CancelledRun {
    pub branch_rule_id: Uuid,
    pub execution_id: Uuid,
    pub owner: String,
    pub outcome: RunCancel,
}

/// The next runs as the service will make them, and what the branch
/// rule's policy does with each occurrence on the way to them.
#[derive(Debug, Serialize, ToSchema)]
pub struct Preview {
    pub cron_expression: String,
    pub timezone: String,
    pub operation_time_from: Option<String>,
    pub operation_time_to: Option<String>,
    /// The next `count` runs: each occurrence, one outside the window
    /// deferred to its opening (the policy aside).
    pub runs: Vec<PreviewRun>,
    /// The policy in force: the branch rule's own fields, then its rule's,
    /// then the defaults. `null` when a stored policy is not one
    /// (`policy_error` says why; the plan holds the rule until it is fixed).
    pub policy: Option<EffectivePolicy>,
    /// Why its stored policy or its rule's is not one, when it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy_error: Option<String>,
    /// Under the policy, in order: every occurrence up to the `count`-th
    /// run, each run with its start (start offset and window applied) and
    /// each skipped one with the reason, as the engine decides them with
    /// ruled up throughout and every run instant (`ruled preview
    /// --policy`). Empty when `policy` is `null`.
    pub decisions: Vec<PolicyStep>,
    /// `decisions` stops short of `count` runs: the policy skips too many
    /// occurrences on the way (more than 10,000 decisions in a span
    /// simulated), none runs within 1,024 days, or the policy is not one.
    pub decisions_truncated: bool,
}

/// One occurrence under the policy, and what happens to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct PolicyStep {
    /// The occurrence (its due time).
    pub occurrence: Timestamp,
    /// When it starts; `null` when it does not run.
    pub starts_at: Option<Timestamp>,
    pub decision: StepDecision,
}

/// `run`, or why the occurrence is skipped (a skip reason).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct StepDecision(pub String);

impl utoipa::PartialSchema for StepDecision {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        let mut choices = vec!["run"];
        choices.extend(SkipReason::ALL.iter().map(|r| r.as_str()));
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .enum_values(Some(choices))
            .description(Some("`run`, or why the occurrence is skipped"))
            .into()
    }
}

impl ToSchema for StepDecision {}

/// `POST /simulate`: the decisions the engine would make over the range,
/// in order, and their totals (`ruled simulate --format json`).
#[derive(Debug, Serialize, ToSchema)]
pub struct SimulationReport {
    /// Tick 0.
    pub from: Timestamp,
    /// The end (exclusive).
    pub to: Timestamp,
    /// Milliseconds per tick.
    pub resolution_ms: i64,
    /// Runs started (retries included).
    pub runs: usize,
    /// Occurrences recorded skipped.
    pub skipped: usize,
    /// Retries scheduled after a failed run.
    pub retries: usize,
    /// Ticks the clock stopped at: where something could happen.
    pub ticks_visited: usize,
    /// In the order they are made: by tick, and within a tick as the
    /// engine makes them (runs ending, then skips and starts by due time
    /// and id).
    pub decisions: Vec<SimulatedDecision>,
}

/// One decision of a simulation. `reason` and `detail` come with
/// `skipped`, `opens` with `held_by_window`, `retry_at` with `retry`,
/// `status` with `finished`.
#[derive(Debug, Serialize, ToSchema)]
pub struct SimulatedDecision {
    /// `(at − from) / resolution_ms`, rounded down.
    pub tick: u64,
    pub at: Timestamp,
    /// `at` as `ruled simulate` prints it: UTC to the millisecond.
    #[schema(examples("2026-03-29T01:00:00.000Z"))]
    pub utc: String,
    /// `at` in the branch's zone, as `ruled simulate` prints it.
    #[schema(examples("2026-03-29 03:00:00 CEST"))]
    pub local: String,
    pub branch_rule_id: Uuid,
    /// Its partition of PARTITION_COUNT.
    pub partition: u32,
    /// The branch's zone (else DEFAULT_TIMEZONE).
    pub zone: String,
    /// The occurrence decided about (its due time).
    pub occurrence: Timestamp,
    /// The attempt at the occurrence, from 1; 0 where none is made
    /// (`held_by_window`, `buffered`).
    #[schema(minimum = 0)]
    pub attempt: i64,
    pub decision: SimulatedDecisionKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<SkipReason>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// When the window opens (left out past 9999-12-31, which RFC 3339
    /// cannot write).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opens: Option<Timestamp>,
    /// When the retry runs (left out past 9999-12-31).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<Timestamp>,
    /// How the run ended: `completed`, `failed` or `cancelled`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(examples("completed"))]
    pub status: Option<String>,
}

/// What the engine decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SimulatedDecisionKind {
    /// Claimed and started.
    Run,
    /// Recorded skipped (`reason`, `detail`).
    Skipped,
    /// Due, but the window is closed; it runs once it opens (`opens`).
    HeldByWindow,
    /// Fell due while the previous run ran; it runs right after it.
    Buffered,
    /// The run failed; this attempt runs at `retry_at`.
    Retry,
    /// The run ended (`status`).
    Finished,
    /// Ruled stopped while it ran (a `down` window): recorded
    /// `worker_lost`, it runs again.
    Lost,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PreviewRun {
    #[schema(format = DateTime)]
    pub utc: String,
    /// The same instant in the branch's zone, with its offset.
    #[schema(format = DateTime)]
    pub local: String,
    /// The zone keeps daylight-saving time at this run.
    pub dst: bool,
    /// The occurrence the window deferred to this run, when it did.
    #[schema(format = DateTime)]
    pub deferred_from: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Instances {
    pub partition_count: u32,
    pub instances: Vec<Instance>,
}

/// An instance sharing the database.
#[derive(Debug, Serialize, ToSchema)]
pub struct Instance {
    /// INSTANCE_ID (the hostname by default).
    pub id: String,
    pub hostname: String,
    pub pid: i64,
    pub started_at: Timestamp,
    pub heartbeat_at: Timestamp,
    /// Heartbeat within PARTITION_LEASE_TTL_SECONDS, on the database's clock.
    pub live: bool,
    /// `k/N` when it prefers a static partition.
    pub partition: Option<String>,
    pub partitions_held: Vec<u32>,
    pub this_instance: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PlanReady {
    pub ready: Vec<Uuid>,
}

/// The writer of the plan file (seed 000).
#[derive(Debug, Serialize, ToSchema)]
pub struct WriterStatus {
    pub write_thread_alive: bool,
    pub write_thread_started: bool,
    pub write_queue_size: usize,
    pub write_queue_full: bool,
    pub writes_ok: u64,
    pub writes_failed: u64,
    pub snapshots_dropped: u64,
    pub last_write_at: Option<Timestamp>,
    pub last_error: Option<String>,
}

impl From<crate::messages::writer::WriterStats> for WriterStatus {
    fn from(stats: crate::messages::writer::WriterStats) -> WriterStatus {
        WriterStatus {
            write_thread_alive: stats.write_thread_alive,
            write_thread_started: stats.write_thread_started,
            write_queue_size: stats.write_queue_size,
            write_queue_full: stats.write_queue_full,
            writes_ok: stats.writes_ok,
            writes_failed: stats.writes_failed,
            snapshots_dropped: stats.snapshots_dropped,
            last_write_at: stats.last_write_at.map(Timestamp),
            last_error: stats.last_error,
        }
    }
}

/// Seed 004's queue statistics, seed 000's writer status, the plan's size,
/// and what the console's overview shows beside them: readiness, memory,
/// start lag and the latest failures.
#[derive(Debug, Serialize, ToSchema)]
pub struct Stats {
    pub queue: QueueStats,
    pub writer: WriterStatus,
    pub plan: PlanStats,
    pub readiness: Readiness,
    pub memory: MemoryView,
    /// This instance's start lag, minute by minute over the last 15 minutes.
    pub start_lag: StartLagView,
    /// The latest failed and timed-out executions, newest first; empty
    /// while the database cannot be read.
    pub recent_errors: Vec<RecentError>,
    /// Why `recent_errors` could not be read (the database is away); the
    /// other figures are this process's own and stand.
    pub recent_errors_unavailable: Option<String>,
    /// The clock the figures were taken at.
    pub now: Timestamp,
    pub instance_id: String,
    /// No API_TOKEN or API_TOKENS is set: every change is refused, and the
    /// console offers none.
    pub read_only: bool,
}

/// The memory guard's state (seed 004): the gate and the last reading as
/// ratios of 0 to 1, with the thresholds it compares them to, in percent.
#[derive(Debug, Serialize, ToSchema)]
pub struct MemoryView {
    pub throttled: bool,
    /// Why, while throttled.
    pub reason: Option<String>,
    /// `None` until the first reading.
    pub ram_ratio: Option<f64>,
    pub swap_ratio: Option<f64>,
    /// The fullest GPU's; `None` with GPU checks off.
    pub gpu_ratio: Option<f64>,
    /// "N NVIDIA device(s)" or "off: why".
    pub gpu: String,
    pub memory_throttle_threshold: f64,
    pub memory_resume_threshold: f64,
    pub swap_throttle_threshold: f64,
    pub gpu_throttle_threshold: f64,
    pub gpu_resume_threshold: f64,
    /// Why the last reading failed, while readings fail.
    pub last_error: Option<String>,
}

/// One minute of start lag.
#[derive(Debug, Serialize, ToSchema)]
pub struct LagPointView {
    pub minute: Timestamp,
    pub starts: u64,
    pub p50_ms: Option<i64>,
    pub p99_ms: Option<i64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct StartLagView {
    pub minutes: Vec<LagPointView>,
    /// The whole window's.
    pub window: LagPointView,
}

impl From<crate::queue::LagPoint> for LagPointView {
    fn from(point: crate::queue::LagPoint) -> LagPointView {
        LagPointView {
            minute: Timestamp(point.minute),
            starts: point.starts,
            p50_ms: point.p50_ms,
            p99_ms: point.p99_ms,
        }
    }
}

impl From<crate::queue::StartLagSeries> for StartLagView {
    fn from(series: crate::queue::StartLagSeries) -> StartLagView {
        StartLagView {
            minutes: series.minutes.into_iter().map(Into::into).collect(),
            window: series.window.into(),
        }
    }
}

/// A failed or timed-out execution, as the overview lists it.
#[derive(Debug, Serialize, ToSchema)]
pub struct RecentError {
    pub id: Uuid,
    pub branch_rule_id: Uuid,
    pub status: ExecutionStatus,
    pub attempt: i64,
    pub requested_at: Timestamp,
    pub finished_at: Option<Timestamp>,
    pub error: Option<String>,
}

/// The execution plan as the plan actor holds it, with each workflow's
/// partition and owner and the reason it is held, if it is.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PlanView {
    pub saved_at: Timestamp,
    /// Post-processes the database could not take yet.
    #[schema(value_type = Vec<Object>)]
    pub outbox: Vec<Value>,
    pub workflows: Vec<PlanWorkflow>,
    #[schema(value_type = Vec<Object>)]
    pub brands: Vec<Value>,
    #[schema(value_type = Vec<Object>)]
    pub branches: Vec<Value>,
    #[schema(value_type = Vec<Object>)]
    pub rules: Vec<Value>,
    #[schema(value_type = Vec<Object>)]
    pub brand_rules: Vec<Value>,
    #[schema(value_type = Vec<Object>)]
    pub action_templates: Vec<Value>,
    #[schema(value_type = Vec<Object>)]
    pub action_details: Vec<Value>,
    /// Rows kept out of the plan, with the field and reason.
    #[serde(default)]
    pub quarantined: Vec<RejectedRow>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PlanWorkflow {
    /// The branch rule as the plan holds it (times RFC 3339, secrets `***`).
    #[schema(value_type = Object)]
    pub branch_rule: Value,
    pub locally_updated_at: Option<Timestamp>,
    pub missing_since: Option<Timestamp>,
    #[serde(default)]
    pub partition: u32,
    /// INSTANCE_ID holding the partition's lease, `null` when none does.
    #[serde(default)]
    pub partition_owner: Option<String>,
    /// Why an operator must act before it runs again, if so.
    #[serde(default)]
    pub held: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::rows::{
        ACTION_DETAILS, ACTION_TEMPLATES, BRANCH_RULES, BRANCHES, BRANDS, RULES, TableSpec,
    };
    use utoipa::PartialSchema;

    /// The property names of a derived schema.
    fn properties<T: PartialSchema>() -> Vec<String> {
        let schema = serde_json::to_value(T::schema()).unwrap();
        schema["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect()
    }

    #[test]
    fn views_cover_every_column() {
        let cases: [(&TableSpec, Vec<String>); 6] = [
            (&BRANDS, properties::<Brand>()),
            (&BRANCHES, properties::<Branch>()),
            (&RULES, properties::<Rule>()),
            (&ACTION_TEMPLATES, properties::<ActionTemplate>()),
            (&BRANCH_RULES, properties::<BranchRule>()),
            (&ACTION_DETAILS, properties::<ActionDetail>()),
        ];
        for (spec, shown) in cases {
            for (column, _) in spec.columns {
                assert!(
                    shown.iter().any(|p| p == column),
                    "{}.{column} is not in its API view",
                    spec.table
                );
            }
        }
    }

    #[test]
    fn a_stored_policy_that_is_not_one_is_shown_with_why() {
        let row = |policy: Value| {
            let Value::Object(row) = serde_json::json!({
                "id": "r", "brand_id": null, "name": "r", "status": "active",
                "cron_expression": "* * * * *", "settings": {}, "policy": policy,
                "created_at": 0, "updated_at": 0, "created_by": null, "updated_by": null,
                "archived_at": null,
            }) else {
                unreachable!()
            };
            serde_json::to_value(from_row::<Rule>(row).unwrap()).unwrap()
        };
        let good = row(serde_json::json!({"max_attempts": 3}));
        assert_eq!(good["policy"], serde_json::json!({"max_attempts": 3}));
        assert!(good.get("policy_error").is_none(), "{good}");
        assert_eq!(row(Value::Null)["policy"], Value::Null);
        let bad = row(serde_json::json!({"max_attempts": 0}));
        assert_eq!(bad["policy"], Value::Null);
        let why = bad["policy_error"].as_str().unwrap();
        assert!(why.starts_with("policy.max_attempts:"), "{why}");
        // Stored text that is not JSON comes from the store as a string.
        for text in ["{max_attempts: 2", "{}", "null"] {
            let why = row(Value::String(text.into()))["policy_error"].clone();
            assert!(why.as_str().unwrap().starts_with("policy"), "{text}: {why}");
        }
        assert!(row(Value::String(" ".into())).get("policy_error").is_none());
    }

    #[test]
    fn a_stored_row_reads_into_its_view_with_secrets_hidden() {
        let row = serde_json::json!({
            "id": "not-a-uuid", "name": "b", "settings": {"password": "p"},
            "created_at": 0, "updated_at": 1, "created_by": null, "updated_by": "ops",
            "archived_at": null,
        });
        let Value::Object(row) = row else {
            unreachable!()
        };
        let brand: Brand = from_row(row).unwrap();
        let shown = serde_json::to_value(&brand).unwrap();
        assert_eq!(shown["settings"]["password"], secrets::MASK);
        assert_eq!(shown["created_at"], "1970-01-01T00:00:00+00:00");
        assert_eq!(shown["id"], "not-a-uuid");
    }
}
