//! The rows of DESIGN.md §2 as Rust types, shared by the store, the plan and
//! the API. Times are UTC epoch milliseconds, exactly as stored.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::schedule::{Policy, TimeOfDay};

/// UTC epoch milliseconds.
pub type Millis = i64;

/// The times ruled takes, 1970-01-01T00:00:00Z to 9999-12-31T23:59:59.999Z
/// in epoch ms: the API refuses others, and the plan quarantines a row
/// written with SQL that holds one.
pub const EARLIEST_TIME_MS: Millis = 0;
pub const LATEST_TIME_MS: Millis = 253_402_300_799_999;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Brand {
    pub id: Uuid,
    pub name: String,
    pub settings: Value,
    pub created_at: Millis,
    pub updated_at: Millis,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Branch {
    pub id: Uuid,
    pub brand_id: Uuid,
    pub name: String,
    /// IANA zone name; `None` means DEFAULT_TIMEZONE.
    pub timezone: Option<String>,
    pub is_active: bool,
    pub created_at: Millis,
    pub updated_at: Millis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleStatus {
    Active,
    Inactive,
}

impl RuleStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RuleStatus::Active => "active",
            RuleStatus::Inactive => "inactive",
        }
    }

    pub fn parse(text: &str) -> Option<RuleStatus> {
        match text {
            "active" => Some(RuleStatus::Active),
            "inactive" => Some(RuleStatus::Inactive),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rule {
    pub id: Uuid,
    /// `None` is a global rule, usable by every brand.
    pub brand_id: Option<Uuid>,
    pub name: String,
    pub status: RuleStatus,
    pub cron_expression: String,
    pub settings: Value,
    /// The scheduling policy of its branch rules, which may override it.
    #[serde(default)]
    pub policy: Option<Policy>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BrandRule {
    pub id: Uuid,
    pub brand_id: Uuid,
    pub rule_id: Uuid,
    pub settings: Value,
    /// Overrides the rule's expression when set.
    pub cron_expression: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActionTemplate {
    pub id: Uuid,
    pub name: String,
    /// `noop`, `sleep`, `http`, `command`, or a kind registered by a library user.
    pub kind: String,
    pub config: Value,
    pub created_at: Millis,
    pub updated_at: Millis,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BranchRule {
    pub id: Uuid,
    pub branch_id: Uuid,
    pub rule_id: Uuid,
    pub brand_rule_id: Option<Uuid>,
    pub is_active: bool,
    pub is_archived: bool,
    pub is_force_stopped: bool,
    pub is_currently_running: bool,
    pub operation_time_from: Option<TimeOfDay>,
    pub operation_time_to: Option<TimeOfDay>,
    pub next_run_time: Option<Millis>,
    pub last_run_time: Option<Millis>,
    pub lock_holder: Option<String>,
    pub lock_time: Option<Millis>,
    pub lock_epoch: i64,
    pub params: Value,
    /// Overrides fields of its rule's policy.
    #[serde(default)]
    pub policy: Option<Policy>,
    /// A retry is pending: the occurrence it retries. The next claim's
    /// `scheduled_for` is this (not next_run_time, which holds the retry's
    /// time), so every attempt of an occurrence shares its key.
    #[serde(default)]
    pub retry_of: Option<Millis>,
    /// Failed attempts of the occurrence in `retry_of` that count against
    /// `max_attempts` (lost ones do not).
    #[serde(default)]
    pub failed_attempts: i32,
    pub created_at: Millis,
    pub updated_at: Millis,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActionDetail {
    pub id: Uuid,
    pub branch_rule_id: Uuid,
    pub action_template_id: Uuid,
    pub position: i32,
    pub params: Value,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// Which branch rules a read of the plan holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum PlanScope {
    /// Every branch rule: anything the plan holds that is not here is gone.
    #[default]
    Full,
    /// Only branch rules whose `updated_at` is at or after `since`; the
    /// others are unchanged. `total_branch_rules` is the table's row count,
    /// so a delete (which leaves no row to read) is still noticed.
    Changes {
        since: Millis,
        total_branch_rules: u64,
    },
}

/// Everything the refresher reads from SQL in one pass: the server side of a
/// merge (seed 000's `get-execution-plan-v2`). The small tables are always
/// complete; `branch_rules` is complete or a delta, as `scope` says.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PlanData {
    #[serde(default)]
    pub scope: PlanScope,
    pub brands: Vec<Brand>,
    pub branches: Vec<Branch>,
    pub rules: Vec<Rule>,
    pub brand_rules: Vec<BrandRule>,
    pub action_templates: Vec<ActionTemplate>,
    pub branch_rules: Vec<BranchRule>,
    /// Ordered by (branch_rule_id, position) and capped at PLAN_ACTION_DETAILS_CAP.
    pub action_details: Vec<ActionDetail>,
    /// When the cap cut the read of action details: the branch rule whose
    /// details it stopped in. That rule's details and every later rule's
    /// are not all in `action_details`.
    #[serde(default)]
    pub action_details_cut: Option<Uuid>,
}

/// The life of one occurrence (DESIGN.md §4). Stored lower-case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionStatus {
    /// The claim succeeded and the row was inserted (master).
    Requested,
    /// Handed to a worker (master).
    Scheduled,
    /// The worker started the actions (worker).
    Running,
    Completed,
    Failed,
    Cancelled,
    TimedOut,
    /// The occurrence did not run, by policy; `error` says why (master).
    Skipped,
}

impl ExecutionStatus {
    pub const ALL: [ExecutionStatus; 8] = [
        ExecutionStatus::Requested,
        ExecutionStatus::Scheduled,
        ExecutionStatus::Running,
        ExecutionStatus::Completed,
        ExecutionStatus::Failed,
        ExecutionStatus::Cancelled,
        ExecutionStatus::TimedOut,
        ExecutionStatus::Skipped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ExecutionStatus::Requested => "requested",
            ExecutionStatus::Scheduled => "scheduled",
            ExecutionStatus::Running => "running",
            ExecutionStatus::Completed => "completed",
            ExecutionStatus::Failed => "failed",
            ExecutionStatus::Cancelled => "cancelled",
            ExecutionStatus::TimedOut => "timed_out",
            ExecutionStatus::Skipped => "skipped",
        }
    }

    pub fn parse(text: &str) -> Option<ExecutionStatus> {
        ExecutionStatus::ALL
            .into_iter()
            .find(|s| s.as_str() == text)
    }

    /// Terminal states are final: nothing writes over them.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            ExecutionStatus::Completed
                | ExecutionStatus::Failed
                | ExecutionStatus::Cancelled
                | ExecutionStatus::TimedOut
                | ExecutionStatus::Skipped
        )
    }
}

/// One row of `executions`: one attempt at one occurrence of a branch rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Execution {
    pub id: Uuid,
    pub branch_rule_id: Uuid,
    /// The occurrence's due time: the branch rule's next_run_time when it was
    /// claimed (for run-now, the request time).
    pub scheduled_for: Millis,
    pub status: ExecutionStatus,
    /// 1 for the first try; a lost occurrence retried gets the next number.
    pub attempt: i64,
    /// INSTANCE_ID of the instance that claimed it.
    pub owner: String,
    pub lock_epoch: i64,
    pub requested_at: Millis,
    pub scheduled_at: Option<Millis>,
    pub started_at: Option<Millis>,
    pub finished_at: Option<Millis>,
    pub error: Option<String>,
    pub output: Option<Value>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// Why a row was kept out of the plan: the bounded `reason` label of
/// `ruled_plan_rows_rejected_total`.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum RejectReason {
    /// A column does not fit the model (a non-UUID id, bad JSON, a NULL).
    Decode,
    Cron,
    Zone,
    Window,
    /// A `policy` that is not valid JSON or has a bad field.
    Policy,
}

impl RejectReason {
    pub const ALL: [RejectReason; 5] = [
        RejectReason::Decode,
        RejectReason::Cron,
        RejectReason::Zone,
        RejectReason::Window,
        RejectReason::Policy,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::Decode => "decode",
            RejectReason::Cron => "cron",
            RejectReason::Zone => "zone",
            RejectReason::Window => "window",
            RejectReason::Policy => "policy",
        }
    }
}

/// A row of a plan table kept out of the plan (quarantined): it could not
/// be decoded, or its cron expression, zone or window is invalid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RejectedRow {
    pub table: String,
    /// The row's id as stored, which need not be a UUID.
    pub id: String,
    /// The column at fault.
    pub field: String,
    pub reason: RejectReason,
    pub message: String,
    /// For an action detail: the branch rule it belongs to, when that
    /// column could still be read, so the rule is held rather than run
    /// without one of its steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch_rule_id: Option<Uuid>,
}

/// One read of the plan tables: the rows that decoded, and those that did
/// not (each named, so one bad row never stops a refresh).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PlanLoad {
    pub data: PlanData,
    pub rejected: Vec<RejectedRow>,
}
