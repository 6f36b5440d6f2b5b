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
        &mut self,
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
            if holder == me || local.is_some_and(|w| w.running_here) {
                continue;
            }
            if !lock_is_stale(row.lock_time, now, timeout_ms) {
                self.foreign_locks.insert(row.id);
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

    /// Frees the rules the plan holds as running under another holder's
    /// lock that has turned stale since it was read. Such a lock's row does
    /// not change (nobody renews it), so no incremental read brings it
    /// again, and waiting for the next full read would hold the rule up to
    /// PLAN_FULL_REFRESH_SECONDS past the timeout. The plan's copy of a
    /// lock is as fresh as its last read: every renewal touches the row, so
    /// the incremental read after it brings the new `lock_time`. Call it
    /// right after a read is merged.
    pub fn free_locks_turned_stale(
        &mut self,
        me: &str,
        now: Millis,
        timeout_ms: Millis,
    ) -> Vec<StaleLock> {
        let mut freed = Vec::new();
        let candidates: Vec<Uuid> = self.foreign_locks.iter().copied().collect();
        for id in candidates {
            let held = self.get(&id).and_then(|w| {
                let row = &w.branch_rule;
                let holder = row.lock_holder.as_deref()?;
                let foreign = row.is_currently_running && !w.running_here && holder != me;
                foreign.then(|| (holder.to_string(), row.lock_time))
            });
            let Some((holder, lock_time)) = held else {
                self.foreign_locks.remove(&id);
                continue;
            };
            if !lock_is_stale(lock_time, now, timeout_ms) {
                continue;
            }
            self.foreign_locks.remove(&id);
            self.update(&id, |w| w.branch_rule.is_currently_running = false);
            freed.push(StaleLock {
                branch_rule_id: id,
                holder,
                lock_time,
            });
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
    fn a_lock_read_live_is_freed_once_it_turns_stale_unless_renewed_meanwhile() {
        let mut plan = ExecutionPlan::new();
        let live_at = NOW - 1_000;
        let mut rows = vec![
            locked("pod-silent", Some(live_at)),
            locked("pod-renewing", Some(live_at)),
            locked("pod-finishing", Some(live_at)),
        ];
        for (n, row) in rows.iter_mut().enumerate() {
            row.id = Uuid::from_u128(0x100 + n as u128);
        }
        assert!(
            plan.free_stale_locks(&mut rows, "me", NOW, TIMEOUT, false)
                .is_empty()
        );
        for row in &rows {
            plan.insert(crate::plan::Workflow::new(row.clone()));
        }
        assert_eq!(plan.earliest_due(), None, "held rules are not due");
        assert!(plan.free_locks_turned_stale("me", NOW, TIMEOUT).is_empty());

        // Meanwhile one holder renews and another finishes; later reads
        // bring both rows.
        let stale_at = live_at + TIMEOUT + 1;
        let mut renewed = rows[1].clone();
        renewed.lock_time = Some(stale_at - 1_000);
        plan.insert(crate::plan::Workflow::new(renewed));
        let mut finished = rows[2].clone();
        finished.is_currently_running = false;
        finished.lock_holder = None;
        plan.insert(crate::plan::Workflow::new(finished));

        let freed = plan.free_locks_turned_stale("me", stale_at, TIMEOUT);
        assert_eq!(
            freed,
            [StaleLock {
                branch_rule_id: rows[0].id,
                holder: "pod-silent".into(),
                lock_time: Some(live_at),
            }]
        );
        let silent = plan.get(&rows[0].id).unwrap();
        assert!(!silent.branch_rule.is_currently_running);
        assert!(plan.earliest_due().is_some(), "the freed rule is due again");
        // The renewed lock turns stale a timeout after its renewal; the
        // freed and the finished rules are not named again.
        let later: Vec<String> = plan
            .free_locks_turned_stale("me", stale_at + TIMEOUT, TIMEOUT)
            .into_iter()
            .map(|lock| lock.holder)
            .collect();
        assert_eq!(later, ["pod-renewing"]);
        assert!(
            plan.free_locks_turned_stale("me", stale_at + 2 * TIMEOUT, TIMEOUT)
                .is_empty()
        );
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
