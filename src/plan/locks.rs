//! Seed 001's stale-lock release, as the plan sees it.
//!
//! A branch rule another holder claimed is held as running while that
//! holder's lock is live: its workers renew `lock_time` every third of
//! SCHEDULE_LOCK_TIMEOUT_SECONDS. Takeovers of silent instances go through
//! their `instances` rows (`recovery::take_over_silent`), but a lock can
//! outlive any row that would lead there: one written with SQL, one left by
//! another deployment or in a restored backup. Such a lock, once it is
//! older than the timeout, or when it is stamped further ahead than the
//! timeout (a bad row, a clock far off), holds nothing: the claim takes it
//! over (`store::grouped`) and fails whatever the holder left open. So the
//! plan stops holding the rule as running and offers it to claims again.

use uuid::Uuid;

use super::ExecutionPlan;
use crate::model::{BranchRule, Millis};

/// Whether a lock stamped at `lock_time` is stale at `now`: no time at all,
/// not renewed for longer than the timeout, or stamped further ahead than
/// it. The claim's SQL (`store::grouped`) reads a lock the same way.
pub fn lock_is_stale(lock_time: Option<Millis>, now: Millis, timeout_ms: Millis) -> bool {
    lock_time
        .is_none_or(|at| at < now.saturating_sub(timeout_ms) || at > now.saturating_add(timeout_ms))
}

/// A lock the plan no longer holds a rule back for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleLock {
    pub branch_rule_id: Uuid,
    pub holder: String,
    pub lock_time: Option<Millis>,
}

impl ExecutionPlan {
    /// Clears the running flag of every row in `rows` (a refresh's read)
    /// whose lock is another holder's and stale at `now`. Returns the ones
    /// the plan held as running until now, to be logged once; a row the
    /// plan already offers again is not reported on each refresh. The first
    /// read after a start reports them all: the plan's own flags were reset
    /// (crash recovery), so they tell nothing.
    pub fn free_stale_locks(
        &self,
        rows: &mut [BranchRule],
        me: &str,
        now: Millis,
        timeout_ms: Millis,
        first_read: bool,
    ) -> Vec<StaleLock> {
        let mut freed = Vec::new();
        for row in rows.iter_mut().filter(|row| row.is_currently_running) {
            let Some(holder) = row.lock_holder.as_deref() else {
                continue;
            };
            // Our own claims are renewed by this process, or released by
            // its crash recovery; a job in flight here is merge rule 1's.
            let local = self.get(&row.id);
            if holder == me
                || local.is_some_and(|w| w.running_here)
                || !lock_is_stale(row.lock_time, now, timeout_ms)
            {
                continue;
            }
            row.is_currently_running = false;
            if first_read || local.is_none_or(|w| w.branch_rule.is_currently_running) {
                freed.push(StaleLock {
                    branch_rule_id: row.id,
                    holder: holder.to_string(),
                    lock_time: row.lock_time,
                });
            }
        }
        freed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::fixtures::Fixture;

    const NOW: Millis = 1_800_000_000_000;
    const TIMEOUT: Millis = 300_000;

    fn locked(holder: &str, lock_time: Option<Millis>) -> BranchRule {
        let mut row = Fixture::due(NOW).branch_rule;
        row.is_currently_running = true;
        row.lock_holder = Some(holder.into());
        row.lock_time = lock_time;
        row
    }

    #[test]
    fn a_lock_is_stale_without_a_time_past_the_timeout_or_ahead_of_it() {
        assert!(lock_is_stale(None, NOW, TIMEOUT));
        assert!(lock_is_stale(Some(NOW - TIMEOUT - 1), NOW, TIMEOUT));
        assert!(lock_is_stale(Some(NOW + TIMEOUT + 1), NOW, TIMEOUT));
        assert!(!lock_is_stale(Some(NOW - TIMEOUT), NOW, TIMEOUT));
        assert!(!lock_is_stale(Some(NOW + TIMEOUT), NOW, TIMEOUT));
        assert!(!lock_is_stale(Some(NOW), NOW, TIMEOUT));
    }

    #[test]
    fn only_another_holders_stale_lock_is_freed_and_reported_once() {
        let mut plan = ExecutionPlan::new();
        let mut rows = vec![
            locked("pod-gone", Some(NOW - TIMEOUT - 1)),
            locked("pod-ahead", Some(NOW + 10 * TIMEOUT)),
            locked("pod-without-time", None),
            locked("pod-live", Some(NOW - 1_000)),
            locked("me", Some(NOW - 10 * TIMEOUT)),
        ];
        let freed = plan.free_stale_locks(&mut rows, "me", NOW, TIMEOUT, false);
        let holders: Vec<&str> = freed.iter().map(|f| f.holder.as_str()).collect();
        assert_eq!(holders, ["pod-gone", "pod-ahead", "pod-without-time"]);
        let running: Vec<bool> = rows.iter().map(|r| r.is_currently_running).collect();
        assert_eq!(running, [false, false, false, true, true]);

        // Once the plan offers the rule again, the next read of the same
        // row frees it without a second report.
        let mut again = vec![locked("pod-gone", Some(NOW - TIMEOUT - 1))];
        again[0].id = rows[0].id;
        let mut offered = rows[0].clone();
        offered.is_currently_running = false;
        plan.insert(crate::plan::Workflow::new(offered));
        assert!(
            plan.free_stale_locks(&mut again, "me", NOW, TIMEOUT, false)
                .is_empty()
        );
        assert!(!again[0].is_currently_running);
        // After a start the plan's own flags were reset: the first read
        // names every stale lock again.
        again[0].is_currently_running = true;
        let freed = plan.free_stale_locks(&mut again, "me", NOW, TIMEOUT, true);
        assert_eq!(freed.len(), 1);
    }

    #[test]
    fn a_job_in_flight_here_keeps_its_flag() {
        let mut plan = ExecutionPlan::new();
        let row = locked("pod-gone", Some(NOW - TIMEOUT - 1));
        let mut workflow = crate::plan::Workflow::new(row.clone());
        workflow.running_here = true;
        plan.insert(workflow);
        let mut rows = vec![row];
        assert!(
            plan.free_stale_locks(&mut rows, "me", NOW, TIMEOUT, true)
                .is_empty()
        );
        assert!(rows[0].is_currently_running);
    }
}
