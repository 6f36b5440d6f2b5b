//! The lifecycle API's types: a claim request, the won claim, the fence
//! every later write of an occurrence carries, and its finish. Pure data
//! (no sqlx, no I/O), so `plan` and `messages` can name them without
//! depending on the store, which implements the statements.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::model::{BranchRule, Execution, ExecutionStatus, Millis};
use crate::schedule::SkipReason;

/// A fresh execution id for a claim made at `now`: a UUIDv7, so ids sort
/// by creation time. Each batch's new executions then land together at the
/// end of the primary-key index instead of on as many random pages, which
/// a commit would all have to write.
pub fn new_execution_id(now: Millis) -> Uuid {
    let random = Uuid::new_v4();
    let mut counter_random_bytes = [0u8; 10];
    counter_random_bytes.copy_from_slice(&random.as_bytes()[..10]);
    uuid::Builder::from_unix_timestamp_millis(now.max(0) as u64, &counter_random_bytes).into_uuid()
}

/// One attempt to claim a due branch rule for an occurrence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRequest {
    pub branch_rule_id: Uuid,
    /// INSTANCE_ID of the claimer; becomes `lock_holder` and the execution's `owner`.
    pub holder: String,
    pub now: Millis,
    /// A lock older than this is considered abandoned and may be taken over.
    pub lock_timeout_ms: Millis,
    /// Chosen by the caller so a retried claim (outbox) is recognisable.
    pub execution_id: Uuid,
    /// Run now: ignore `next_run_time <= now` and use `now` as the
    /// occurrence's `scheduled_for`. Every other condition still holds.
    pub run_now: bool,
    /// Claimed ahead (MASTER_CLAIM_LEAD_SECONDS): the rule is due by this
    /// instant rather than by `now`, and its job starts then. `now` stays
    /// the claim's own time (the lock's and `requested_at`).
    #[serde(default)]
    pub due_by: Option<Millis>,
}

/// The master's misfire decision for one branch rule
/// ([`Store::skip_occurrences`](crate::store::Store::skip_occurrences)):
/// move its next_run_time from `expected_next_run_time` to `next_run_time`
/// and record `skipped` as skipped executions, without running anything.
/// A compare-and-set on next_run_time, so of two instances deciding the
/// same misfire one writes and the other changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkipRequest {
    pub branch_rule_id: Uuid,
    /// INSTANCE_ID of the decider; the skipped executions' `owner`.
    pub holder: String,
    /// The next_run_time the decision was made on; nothing is written
    /// unless the row still says it.
    pub expected_next_run_time: Millis,
    pub next_run_time: Millis,
    pub skipped: Vec<SkippedOccurrence>,
    pub now: Millis,
    /// A lock older than this is considered abandoned (as in a claim);
    /// a branch rule locked more recently is left alone.
    pub lock_timeout_ms: Millis,
}

/// A won claim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Claim {
    /// As inserted: status Requested.
    pub execution: Execution,
    /// The branch rule row after the claim (locked, epoch incremented).
    pub branch_rule: BranchRule,
}

impl Claim {
    /// The fencing token every later write of this occurrence carries.
    pub fn fence(&self) -> Fence {
        Fence {
            execution_id: self.execution.id,
            branch_rule_id: self.branch_rule.id,
            holder: self.execution.owner.clone(),
            epoch: self.execution.lock_epoch,
        }
    }
}

/// Proof of ownership: a write lands only while `branch_rules.lock_holder`
/// and `lock_epoch` still match, so an instance that lost its lock (taken
/// over after a timeout, or released by recovery) changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Fence {
    pub execution_id: Uuid,
    pub branch_rule_id: Uuid,
    pub holder: String,
    pub epoch: i64,
}

/// The post-process of one occurrence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finish {
    /// Must be terminal.
    pub status: ExecutionStatus,
    pub finished_at: Millis,
    /// Cut to [`ERROR_CAP_BYTES`](crate::store::ERROR_CAP_BYTES).
    pub error: Option<String>,
    /// Replaced by a summary above [`OUTPUT_CAP_BYTES`](crate::store::OUTPUT_CAP_BYTES).
    pub output: Option<Value>,
    /// `None` leaves the branch rule's next_run_time as it is.
    pub next_run_time: Option<Millis>,
    /// Set last_run_time to `finished_at` (false e.g. for a cancel before
    /// the handoff, when nothing ran).
    pub advance_last_run: bool,
    /// What happens to the branch rule's pending retry (`retry_of`,
    /// `failed_attempts`). Defaults to `Keep` so outbox entries written
    /// before policies still load.
    #[serde(default)]
    pub retry: RetryUpdate,
    /// Occurrences recorded as `skipped` executions in the same
    /// transaction (e.g. those that fell due while this one ran), only
    /// while the fence holds; one already recorded is not recorded again.
    #[serde(default)]
    pub skipped: Vec<SkippedOccurrence>,
    /// No next run could be computed: next_run_time becomes NULL, so the
    /// occurrence that ran is never run again; the plan holds the rule
    /// until an operator's change sets a next run.
    #[serde(default)]
    pub clear_next_run: bool,
}

impl Finish {
    /// A terminal write that leaves the occurrence due: nothing of it ran
    /// (or nothing may be assumed to have), so it runs again as the next
    /// attempt, with its retry state as it was.
    pub fn leaving_due(status: ExecutionStatus, at: Millis, error: String) -> Finish {
        Finish {
            status,
            finished_at: at,
            error: Some(error),
            output: None,
            next_run_time: None,
            advance_last_run: false,
            retry: RetryUpdate::Keep,
            skipped: Vec::new(),
            clear_next_run: false,
        }
    }
}

/// What the post-process does to the branch rule's pending retry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum RetryUpdate {
    /// `retry_of` and `failed_attempts` stay as they are.
    #[default]
    Keep,
    /// No retry pending: `retry_of` NULL, `failed_attempts` 0.
    Clear,
    /// A retry of occurrence `of` is pending (next_run_time says when),
    /// after `failed_attempts` failed attempts of it.
    Pending { of: Millis, failed_attempts: i32 },
}

/// An occurrence recorded as a `skipped` execution, with why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedOccurrence {
    /// The occurrence's due time: the execution's `scheduled_for`.
    pub scheduled_for: Millis,
    pub reason: SkipReason,
    /// Stored after the reason in the execution's `error`
    /// (`"{reason}: {detail}"`).
    pub detail: String,
}

impl SkippedOccurrence {
    /// The skipped execution's `error` text, before the cap.
    pub fn error(&self) -> String {
        format!("{}: {}", self.reason.as_str(), self.detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finishes_saved_before_policies_still_load() {
        let old = r#"{"status":"completed","finished_at":5,"error":null,"output":null,
            "next_run_time":60,"advance_last_run":true}"#;
        let finish: Finish = serde_json::from_str(old).unwrap();
        assert_eq!(finish.retry, RetryUpdate::Keep);
        assert!(finish.skipped.is_empty());
        let new = Finish {
            retry: RetryUpdate::Pending {
                of: 60,
                failed_attempts: 2,
            },
            skipped: vec![SkippedOccurrence {
                scheduled_for: 120,
                reason: SkipReason::Overlap,
                detail: "still running".into(),
            }],
            ..finish
        };
        let text = serde_json::to_string(&new).unwrap();
        assert_eq!(serde_json::from_str::<Finish>(&text).unwrap(), new);
        assert_eq!(new.skipped[0].error(), "overlap: still running");
    }

    #[test]
    fn execution_ids_sort_by_the_time_they_were_made() {
        let ids: Vec<Uuid> = (0..100)
            .map(|n| new_execution_id(1_800_000_000_000 + n))
            .collect();
        assert!(ids.windows(2).all(|pair| pair[0] < pair[1]));
        assert!(ids.iter().all(|id| id.get_version_num() == 7));
        let same_ms: std::collections::HashSet<Uuid> = (0..1000)
            .map(|_| new_execution_id(1_800_000_000_000))
            .collect();
        assert_eq!(
            same_ms.len(),
            1000,
            "ids made in one millisecond still differ"
        );
    }
}
