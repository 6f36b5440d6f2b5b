//! The policy decisions (issue 13), one copy for the master, the worker's
//! post-process, `ruled simulate` and `preview`. Pure: they take the
//! schedule, the policy and the times, and say what runs and what is
//! recorded skipped.
//!
//! Two moments decide:
//! - [`decide_due`], when the master finds a rule ready: its due
//!   occurrences (from next_run_time up to now) are the missed ones the
//!   misfire policy and the catch-up window sort into one run and skips.
//! - [`decide_finish`], when a run ends: a retry, or the next occurrence,
//!   with the occurrences that fell due while it ran sorted by the overlap
//!   policy.
//!
//! Between them every occurrence is consumed exactly once: the one that
//! runs is the branch rule's next_run_time, those before it are recorded
//! skipped, and the next decision starts after it.

use chrono_tz::Tz;
use uuid::Uuid;

use crate::clock::millis_to_utc;
use crate::lifecycle::{Finish, RetryUpdate, SkippedOccurrence};
use crate::model::{ExecutionStatus, Millis};
use crate::schedule::{
    CronSchedule, EffectivePolicy, Misfire, Overlap, SkipReason, Window, local_time_of_day,
    next_after_millis,
};

/// An occurrence later than this (past its due time and start offset) is
/// missed, for `misfire: skip`: Quartz's default misfire threshold. Less
/// late, it is merely slow, and runs.
pub const MISFIRE_THRESHOLD_MS: Millis = 60_000;

/// At most this many occurrences are sorted one by one in a decision, so
/// a rule that missed a year of minutes (or whose next_run_time an operator
/// set to 1970) costs bounded work and one bounded write. When more are
/// due, the latest of them are sorted one by one and every older one is
/// recorded in a single skipped execution (see [`decide_due`]).
pub const MAX_OCCURRENCES_PER_DECISION: usize = 1_000;

/// The first span [`latest_due`] looks back over, doubled until it holds
/// enough occurrences.
const FIRST_LOOK_BACK_MS: Millis = 3_600_000;

/// The most steps [`latest_due`] walks through its span, per occurrence it
/// keeps. A span that held at most `keep` occurrences at half its length
/// holds about twice that for any regular schedule; more means the schedule
/// engine's horizon cut the count short (croner searches no later than the
/// year 5000, so a simulation in the year 7961 counts nothing there), and
/// the decision falls back to sorting bounded steps one decision at a time.
const LOOK_BACK_WALK_FACTOR: usize = 16;

/// A branch rule's schedule as the decisions need it.
#[derive(Debug, Clone, Copy)]
pub struct Cadence<'a> {
    pub branch_rule_id: Uuid,
    pub schedule: &'a CronSchedule,
    pub zone: Tz,
    pub window: Option<Window>,
    pub policy: &'a EffectivePolicy,
}

impl Cadence<'_> {
    pub(crate) fn next_after(&self, at: Millis) -> Option<Millis> {
        next_after_millis(self.schedule, self.zone, at).ok()
    }

    /// When an occurrence may start: its due time plus the rule's offset.
    pub fn start_of(&self, occurrence: Millis) -> Millis {
        occurrence + self.policy.jitter_ms(&self.branch_rule_id)
    }

    fn outside_window(&self, occurrence: Millis) -> bool {
        self.window.is_some_and(|window| {
            !window.contains(local_time_of_day(
                self.zone,
                millis_to_utc(self.start_of(occurrence)),
            ))
        })
    }
}

/// What the master does with a ready rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueDecision {
    /// Recorded `skipped`, oldest first.
    pub skipped: Vec<SkippedOccurrence>,
    /// The occurrence to claim now, if any.
    pub run: Option<Millis>,
    /// The branch rule's next_run_time after the decision: `run` when
    /// something runs, else the first occurrence not yet due.
    pub next_run_time: Option<Millis>,
}

impl DueDecision {
    /// Nothing to record: the rule is claimed as it stands.
    pub fn is_plain(&self, next_run_time: Millis) -> bool {
        self.skipped.is_empty() && self.next_run_time == Some(next_run_time)
    }
}

/// How many occurrences from `first` on are due at `now`, counting up to
/// `limit` at most.
fn due_from(cadence: &Cadence<'_>, first: Option<Millis>, now: Millis, limit: usize) -> usize {
    let mut count = 0;
    let mut upcoming = first;
    while let Some(at) = upcoming {
        if count == limit || cadence.start_of(at) > now {
            break;
        }
        count += 1;
        upcoming = cadence.next_after(at);
    }
    count
}

/// The latest `keep` occurrences due at `now`, oldest first, of a rule
/// with more than that due since `first`. Found by looking back from
/// `now` over a span doubled until it holds more than `keep`, not by
/// counting forward from `first`: a minutely rule whose next_run_time is
/// 1970 has 29 million occurrences due, and the work stays a few tens of
/// thousands of steps whatever the backlog. `None` when the walk would
/// take more than [`LOOK_BACK_WALK_FACTOR`] steps per kept occurrence.
fn latest_due(
    cadence: &Cadence<'_>,
    first: Millis,
    now: Millis,
    keep: usize,
) -> Option<Vec<Millis>> {
    let mut span = FIRST_LOOK_BACK_MS;
    let from = loop {
        let from = now.saturating_sub(span);
        if from <= first {
            break first;
        }
        let first_in_span = cadence.next_after(from - 1);
        if due_from(cadence, first_in_span, now, keep + 1) > keep {
            break from;
        }
        span = span.saturating_mul(2);
    };
    let mut latest = std::collections::VecDeque::with_capacity(keep + 1);
    let mut upcoming = if from == first {
        Some(first)
    } else {
        cadence.next_after(from - 1)
    };
    let mut steps = 0;
    while let Some(at) = upcoming {
        if cadence.start_of(at) > now {
            break;
        }
        steps += 1;
        if steps > keep.saturating_mul(LOOK_BACK_WALK_FACTOR) {
            return None;
        }
        if latest.len() == keep {
            latest.pop_front();
        }
        latest.push_back(at);
        upcoming = cadence.next_after(at);
    }
    Some(latest.into())
}

/// Sorts the due occurrences of a ready rule, from `next_run_time` up to
/// `now`, by its misfire policy and catch-up window. A pending retry
/// (`retry_of`) is not a cron occurrence: it runs as it stands.
pub fn decide_due(
    cadence: &Cadence<'_>,
    next_run_time: Millis,
    retry_of: Option<Millis>,
    now: Millis,
) -> DueDecision {
    let plain = DueDecision {
        skipped: Vec::new(),
        run: Some(next_run_time),
        next_run_time: Some(next_run_time),
    };
    if retry_of.is_some() {
        return plain;
    }
    let policy = cadence.policy;
    let mut due = Vec::new();
    let mut upcoming = Some(next_run_time);
    while let Some(at) = upcoming {
        if cadence.start_of(at) > now || due.len() == MAX_OCCURRENCES_PER_DECISION {
            break;
        }
        due.push(at);
        upcoming = cadence.next_after(at);
    }
    if due.len() <= 1 && policy.catchup_window_seconds.is_none() && policy.misfire != Misfire::Skip
    {
        return plain;
    }
    let lateness = |at: Millis| now - cadence.start_of(at);
    let expired = |at: Millis| {
        policy
            .catchup_window_seconds
            .is_some_and(|window| lateness(at) > window as Millis * 1000)
    };
    let missed = |at: Millis| {
        if cadence.outside_window(at) {
            SkipReason::OutsideWindow
        } else {
            SkipReason::Misfire
        }
    };
    let mut more_due = upcoming.is_some_and(|at| cadence.start_of(at) <= now);
    // More due than one decision sorts: the latest are sorted one by one
    // (no policy runs an older one: run_once and skip run the latest,
    // run_all at most the latest 1,000), and every occurrence before them
    // is recorded in one skipped execution, at the first one's time. Where
    // the latest cannot be found in bounded work, this decision sorts the
    // oldest 1,000 and the next ones go on from there.
    let mut older_than_due = None;
    if more_due
        && let Some(latest) = latest_due(cadence, next_run_time, now, MAX_OCCURRENCES_PER_DECISION)
    {
        due = latest;
        upcoming = due.last().and_then(|at| cadence.next_after(*at));
        older_than_due = due.first().copied();
        more_due = false;
    }
    let candidates: Vec<Millis> = due.iter().copied().filter(|at| !expired(*at)).collect();
    let run = if more_due {
        match policy.misfire {
            // The latest `catchup_max` run: those of this step among them
            // (fewer than that are due after it) stay, and the first of
            // them runs. Counting on stops at `catchup_max` (at most 1,000).
            Misfire::RunAll => {
                let catchup_max = policy.catchup_max as usize;
                let later = due_from(cadence, upcoming, now, catchup_max);
                let keep = catchup_max.saturating_sub(later).min(candidates.len());
                candidates.get(candidates.len() - keep).copied()
            }
            // Past the per-decision bound: these are all older than what
            // is still due, so none of them is the one to run.
            Misfire::RunOnce | Misfire::Skip => None,
        }
    } else {
        match policy.misfire {
            Misfire::RunOnce => candidates.last().copied(),
            Misfire::Skip => candidates
                .last()
                .copied()
                .filter(|at| lateness(*at) <= MISFIRE_THRESHOLD_MS),
            Misfire::RunAll => {
                let keep = candidates.len().min(policy.catchup_max as usize);
                candidates.get(candidates.len() - keep).copied()
            }
        }
    };
    let mut skipped = Vec::new();
    if let Some(before) = older_than_due {
        let reason = if expired(next_run_time) {
            SkipReason::CatchupWindow
        } else {
            SkipReason::Misfire
        };
        skipped.push(SkippedOccurrence {
            scheduled_for: next_run_time,
            reason,
            detail: format!(
                "missed with every later occurrence before {}: more than {} behind, they are recorded as this one; misfire {}",
                rfc3339(before),
                MAX_OCCURRENCES_PER_DECISION,
                policy.misfire.as_str()
            ),
        });
    }
    for &at in due.iter().take_while(|at| Some(**at) != run) {
        let (reason, detail) = if expired(at) {
            (
                SkipReason::CatchupWindow,
                format!(
                    "{} s late, past catchup_window_seconds {}",
                    lateness(at) / 1000,
                    policy.catchup_window_seconds.unwrap_or_default()
                ),
            )
        } else if policy.misfire == Misfire::RunAll {
            (
                SkipReason::CatchupMax,
                format!(
                    "misfire run_all runs the latest {} missed occurrence(s)",
                    policy.catchup_max
                ),
            )
        } else {
            let reason = missed(at);
            let detail = match (policy.misfire, run) {
                (Misfire::RunOnce, Some(ran)) => format!(
                    "missed; misfire run_once runs the occurrence at {} in its place",
                    rfc3339(ran)
                ),
                _ => format!(
                    "missed by {} s; misfire {}",
                    lateness(at) / 1000,
                    policy.misfire.as_str()
                ),
            };
            (reason, detail)
        };
        skipped.push(SkippedOccurrence {
            scheduled_for: at,
            reason,
            detail: match reason {
                SkipReason::OutsideWindow => format!(
                    "outside the window {}; {detail}",
                    cadence.window.map(|w| w.to_string()).unwrap_or_default()
                ),
                _ => detail,
            },
        });
    }
    let next_run_time = run.or(upcoming);
    DueDecision {
        skipped,
        run,
        next_run_time,
    }
}

/// How a run ended, as the finish decision needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    Completed,
    /// Failed or timed out: retried while attempts are left.
    Failed,
    /// Cancelled by an operator: not retried; the schedule goes on.
    Cancelled,
    /// Cancelled because the next occurrence fell due (`cancel_running`):
    /// that occurrence runs next.
    CancelledByOverlap,
}

impl Ending {
    pub fn of(status: ExecutionStatus) -> Ending {
        match status {
            ExecutionStatus::Failed | ExecutionStatus::TimedOut => Ending::Failed,
            ExecutionStatus::Cancelled => Ending::Cancelled,
            _ => Ending::Completed,
        }
    }
}

/// What the post-process writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishDecision {
    /// `None` leaves next_run_time as it is (no next run computable).
    pub next_run_time: Option<Millis>,
    pub retry: RetryUpdate,
    /// Occurrences that fell due while the run ran and do not run.
    pub skipped: Vec<SkippedOccurrence>,
}

impl FinishDecision {
    /// The post-process write of this decision.
    pub fn finish(
        self,
        status: ExecutionStatus,
        finished_at: Millis,
        error: Option<String>,
        output: Option<serde_json::Value>,
        advance_last_run: bool,
    ) -> Finish {
        Finish {
            status,
            finished_at,
            error,
            output,
            next_run_time: self.next_run_time,
            advance_last_run,
            retry: self.retry,
            clear_next_run: self.next_run_time.is_none()
                && !matches!(self.retry, RetryUpdate::Pending { .. }),
            skipped: self.skipped,
        }
    }

    /// The retry this finish schedules: (its time, its number from 1).
    /// A buffered occurrence is owed its run (a pending retry of itself,
    /// no failure behind it) but is not a retry.
    pub fn retry_at(&self) -> Option<(Millis, i32)> {
        match self.retry {
            RetryUpdate::Pending {
                failed_attempts, ..
            } if failed_attempts > 0 => self.next_run_time.map(|at| (at, failed_attempts)),
            _ => None,
        }
    }
}

/// A run that ended: the occurrence it ran, claimed at `claimed_at` with
/// `failed_attempts` failures of it behind it, and how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunEnd {
    pub branch_rule_id: Uuid,
    pub occurrence: Millis,
    pub failed_attempts: i32,
    pub claimed_at: Millis,
    pub finished_at: Millis,
    pub ending: Ending,
}

/// The end of a run. `cadence` is `None` when no next run can be computed
/// (the finish clears next_run_time and the rule is held, see
/// `NoNextRunTime`).
pub fn decide_finish(
    cadence: Option<&Cadence<'_>>,
    policy: &EffectivePolicy,
    run: &RunEnd,
) -> FinishDecision {
    let RunEnd {
        branch_rule_id,
        occurrence,
        failed_attempts,
        claimed_at,
        finished_at,
        ending,
    } = *run;
    let failures = failed_attempts.max(0).saturating_add(1);
    if ending == Ending::Failed && (failures as u32) < policy.max_attempts {
        let delay = policy.backoff_ms(&branch_rule_id, occurrence, failures as u32);
        return FinishDecision {
            next_run_time: Some(finished_at + delay),
            retry: RetryUpdate::Pending {
                of: occurrence,
                failed_attempts: failures,
            },
            skipped: Vec::new(),
        };
    }
    let mut decision = FinishDecision {
        next_run_time: None,
        retry: RetryUpdate::Clear,
        skipped: Vec::new(),
    };
    let Some(cadence) = cadence else {
        return decision;
    };
    let mut upcoming = cadence.next_after(occurrence);
    // Due before the run began: the misfire policy sorts it, at the next
    // fetch.
    if upcoming.is_none_or(|at| cadence.start_of(at) <= claimed_at) {
        decision.next_run_time = upcoming;
        return decision;
    }
    let mut overlapped = Vec::new();
    while let Some(at) = upcoming {
        if cadence.start_of(at) > finished_at || overlapped.len() == MAX_OCCURRENCES_PER_DECISION {
            break;
        }
        overlapped.push(at);
        upcoming = cadence.next_after(at);
    }
    let overlap = match ending {
        Ending::CancelledByOverlap => Overlap::CancelRunning,
        _ => cadence.policy.overlap,
    };
    // The newest waits, so the one after it was never consumed.
    let buffered = match overlap {
        Overlap::Skip => None,
        Overlap::BufferOne | Overlap::CancelRunning => overlapped.last().copied(),
    };
    for &at in overlapped.iter().filter(|at| Some(**at) != buffered) {
        decision.skipped.push(SkippedOccurrence {
            scheduled_for: at,
            reason: SkipReason::Overlap,
            detail: format!(
                "fell due while the run of {} was running; overlap {}",
                rfc3339(occurrence),
                overlap.as_str()
            ),
        });
    }
    decision.next_run_time = buffered.or(upcoming);
    // The buffered occurrence is owed its run right after this one, late
    // as it is by then: as a pending retry of itself (no failure counted)
    // the misfire policy and the catch-up window leave it alone, where
    // `misfire: skip` used to record it skipped a minute later. One the
    // window holds back is not owed: it is missed, and the misfire policy
    // sorts it when the window opens (`outside_window`).
    if let Some(owed) = buffered.filter(|at| !cadence.outside_window(*at)) {
        decision.retry = RetryUpdate::Pending {
            of: owed,
            failed_attempts: 0,
        };
    }
    decision
}

/// When a run of `occurrence` claimed at `claimed_at` is overlapped: the
/// first later occurrence that falls due after the claim and may start
/// then (inside the window). `cancel_running` cancels the run then: an
/// occurrence the window holds back is no reason to cancel, since it would
/// not start in the run's place.
pub fn overlap_due(
    cadence: &Cadence<'_>,
    occurrence: Millis,
    claimed_at: Millis,
) -> Option<Millis> {
    let mut at = cadence.next_after(occurrence)?;
    for _ in 0..MAX_OCCURRENCES_PER_DECISION {
        if cadence.start_of(at) > claimed_at && !cadence.outside_window(at) {
            return Some(cadence.start_of(at));
        }
        at = cadence.next_after(at)?;
    }
    None
}

fn rfc3339(at: Millis) -> String {
    millis_to_utc(at).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    const ID: Uuid = Uuid::from_u128(0xAB);

    fn at(h: u32, m: u32) -> Millis {
        Utc.with_ymd_and_hms(2026, 6, 1, h, m, 0)
            .unwrap()
            .timestamp_millis()
    }

    fn cadence<'a>(
        schedule: &'a CronSchedule,
        policy: &'a EffectivePolicy,
        window: Option<Window>,
    ) -> Cadence<'a> {
        Cadence {
            branch_rule_id: ID,
            schedule,
            zone: chrono_tz::UTC,
            window,
            policy,
        }
    }

    fn finish_of(
        cadence: &Cadence<'_>,
        policy: &EffectivePolicy,
        occurrence: Millis,
        failed_attempts: i32,
        claimed_at: Millis,
        finished_at: Millis,
        ending: Ending,
    ) -> FinishDecision {
        let run = RunEnd {
            branch_rule_id: ID,
            occurrence,
            failed_attempts,
            claimed_at,
            finished_at,
            ending,
        };
        decide_finish(Some(cadence), policy, &run)
    }

    fn quarter() -> CronSchedule {
        CronSchedule::parse("*/15 * * * *").unwrap()
    }

    fn reasons(decision: &[SkippedOccurrence]) -> Vec<(Millis, SkipReason)> {
        decision
            .iter()
            .map(|s| (s.scheduled_for, s.reason))
            .collect()
    }

    #[test]
    fn an_occurrence_on_time_runs_as_it_stands() {
        let schedule = quarter();
        for misfire in [Misfire::RunOnce, Misfire::Skip, Misfire::RunAll] {
            let policy = EffectivePolicy {
                misfire,
                ..EffectivePolicy::default()
            };
            let decision = decide_due(
                &cadence(&schedule, &policy, None),
                at(1, 0),
                None,
                at(1, 0) + 5,
            );
            assert!(decision.is_plain(at(1, 0)), "{misfire:?}: {decision:?}");
        }
    }

    #[test]
    fn after_an_outage_run_once_runs_the_latest_and_records_the_rest() {
        let schedule = quarter();
        let policy = EffectivePolicy::default();
        // Down from 01:00 to 04:00: 01:00 … 04:00 are due at 04:00:30.
        let decision = decide_due(
            &cadence(&schedule, &policy, None),
            at(1, 0),
            None,
            at(4, 0) + 30_000,
        );
        assert_eq!(decision.run, Some(at(4, 0)));
        assert_eq!(decision.skipped.len(), 12);
        assert!(
            decision
                .skipped
                .iter()
                .all(|s| s.reason == SkipReason::Misfire)
        );
        assert_eq!(decision.skipped[0].scheduled_for, at(1, 0));
    }

    #[test]
    fn skip_runs_nothing_missed_and_moves_on() {
        let schedule = quarter();
        let policy = EffectivePolicy {
            misfire: Misfire::Skip,
            ..EffectivePolicy::default()
        };
        let decision = decide_due(&cadence(&schedule, &policy, None), at(1, 0), None, at(4, 5));
        assert_eq!(decision.run, None);
        assert_eq!(decision.skipped.len(), 13);
        assert_eq!(decision.next_run_time, Some(at(4, 15)));
        // Within the threshold the newest still runs.
        let decision = decide_due(
            &cadence(&schedule, &policy, None),
            at(1, 0),
            None,
            at(4, 0) + 10_000,
        );
        assert_eq!(decision.run, Some(at(4, 0)));
        assert_eq!(decision.skipped.len(), 12);
    }

    #[test]
    fn run_all_runs_the_latest_catchup_max_oldest_first() {
        let schedule = quarter();
        let policy = EffectivePolicy {
            misfire: Misfire::RunAll,
            catchup_max: 4,
            ..EffectivePolicy::default()
        };
        let decision = decide_due(&cadence(&schedule, &policy, None), at(1, 0), None, at(4, 1));
        assert_eq!(decision.run, Some(at(3, 15)));
        assert_eq!(decision.skipped.len(), 9);
        assert!(
            decision
                .skipped
                .iter()
                .all(|s| s.reason == SkipReason::CatchupMax)
        );
        // The next decision, after 03:15 ran, runs 03:30 with nothing skipped.
        let decision = decide_due(
            &cadence(&schedule, &policy, None),
            at(3, 30),
            None,
            at(4, 2),
        );
        assert!(decision.is_plain(at(3, 30)), "{decision:?}");
    }

    #[test]
    fn the_catchup_window_bounds_every_misfire_mode() {
        let schedule = quarter();
        let policy = EffectivePolicy {
            misfire: Misfire::RunAll,
            catchup_window_seconds: Some(3600),
            ..EffectivePolicy::default()
        };
        let decision = decide_due(&cadence(&schedule, &policy, None), at(1, 0), None, at(4, 1));
        assert_eq!(decision.run, Some(at(3, 15)));
        let expired: Vec<_> = reasons(&decision.skipped);
        assert_eq!(expired.len(), 9);
        assert!(expired.iter().all(|(_, r)| *r == SkipReason::CatchupWindow));
    }

    #[test]
    fn occurrences_outside_the_window_are_named_so() {
        let schedule = quarter();
        let policy = EffectivePolicy::default();
        let window: Window = "09:00-17:00".parse().unwrap();
        let decision = decide_due(
            &cadence(&schedule, &policy, Some(window)),
            at(8, 0),
            None,
            at(9, 0),
        );
        assert_eq!(decision.run, Some(at(9, 0)));
        assert_eq!(
            reasons(&decision.skipped),
            vec![
                (at(8, 0), SkipReason::OutsideWindow),
                (at(8, 15), SkipReason::OutsideWindow),
                (at(8, 30), SkipReason::OutsideWindow),
                (at(8, 45), SkipReason::OutsideWindow)
            ]
        );
    }

    #[test]
    fn a_pending_retry_runs_as_it_stands() {
        let schedule = quarter();
        let policy = EffectivePolicy::default();
        let decision = decide_due(
            &cadence(&schedule, &policy, None),
            at(1, 0),
            Some(at(0, 45)),
            at(4, 0),
        );
        assert!(decision.is_plain(at(1, 0)));
    }

    #[test]
    fn a_long_outage_is_sorted_in_one_bounded_decision() {
        let schedule = CronSchedule::parse("* * * * *").unwrap();
        let policy = EffectivePolicy::default();
        let now = at(1, 0) + 30 * 24 * 3_600_000;
        let decision = decide_due(&cadence(&schedule, &policy, None), at(1, 0), None, now);
        // One decision: the latest runs, the 999 before it are skipped one
        // by one, and the 42,201 before those in one row.
        let latest = now - now % 60_000;
        assert_eq!(decision.run, Some(latest));
        assert_eq!(decision.next_run_time, Some(latest));
        assert_eq!(decision.skipped.len(), MAX_OCCURRENCES_PER_DECISION);
        let older = &decision.skipped[0];
        assert_eq!(older.scheduled_for, at(1, 0));
        assert_eq!(older.reason, SkipReason::Misfire);
        let first_sorted = latest - 999 * 60_000;
        assert!(
            older.detail.contains(&rfc3339(first_sorted)),
            "{}",
            older.detail
        );
        assert_eq!(decision.skipped[1].scheduled_for, first_sorted);
    }

    /// A next_run_time an operator set to 1970 on a minutely rule: 29
    /// million occurrences due, sorted in one bounded decision, the latest
    /// run now.
    #[test]
    fn a_next_run_time_decades_old_is_sorted_in_one_bounded_decision() {
        let schedule = CronSchedule::parse("* * * * *").unwrap();
        let now = at(1, 0);
        for misfire in [Misfire::RunOnce, Misfire::Skip, Misfire::RunAll] {
            let policy = EffectivePolicy {
                misfire,
                catchup_max: 3,
                ..EffectivePolicy::default()
            };
            let decision = decide_due(&cadence(&schedule, &policy, None), 0, None, now);
            assert!(decision.skipped.len() <= MAX_OCCURRENCES_PER_DECISION + 1);
            assert_eq!(decision.skipped[0].scheduled_for, 0, "{misfire:?}");
            let expected = match misfire {
                Misfire::RunOnce | Misfire::Skip => now,
                Misfire::RunAll => now - 2 * 60_000,
            };
            assert_eq!(decision.run, Some(expected), "{misfire:?}");
        }
    }

    /// Past croner's horizon (the year 5000) no occurrence is found, so the
    /// look back cannot find the latest ones in bounded work: a decision in
    /// the year 7961 (a simulation may go there) sorts bounded steps one
    /// after another, as it would without the look back, instead of
    /// walking every minute up to the horizon.
    #[test]
    fn a_decision_past_the_schedule_horizon_sorts_bounded_steps() {
        let schedule = CronSchedule::parse("* * * * *").unwrap();
        let policy = EffectivePolicy::default();
        let first = at(1, 0);
        let now = Utc
            .with_ymd_and_hms(7961, 1, 1, 0, 0, 0)
            .unwrap()
            .timestamp_millis();
        let decision = decide_due(&cadence(&schedule, &policy, None), first, None, now);
        assert_eq!(decision.run, None);
        assert_eq!(decision.skipped.len(), MAX_OCCURRENCES_PER_DECISION);
        assert_eq!(decision.skipped[0].scheduled_for, first);
        assert_eq!(
            decision.next_run_time,
            Some(first + MAX_OCCURRENCES_PER_DECISION as Millis * 60_000)
        );
        // Within the horizon, the latest are found, whatever the backlog.
        let within = Utc
            .with_ymd_and_hms(4999, 12, 31, 23, 0, 0)
            .unwrap()
            .timestamp_millis();
        let decision = decide_due(&cadence(&schedule, &policy, None), first, None, within);
        assert_eq!(decision.run, Some(within));
    }

    /// More missed than one step sorts: run_all still runs the latest
    /// `catchup_max`, even when some of them are in the first step.
    #[test]
    fn run_all_runs_the_latest_catchup_max_across_bounded_steps() {
        let schedule = CronSchedule::parse("* * * * *").unwrap();
        for (catchup_max, missed) in [(10, 1_005), (10, 1_010), (10, 2_500), (1_000, 1_500)] {
            let policy = EffectivePolicy {
                misfire: Misfire::RunAll,
                catchup_max,
                ..EffectivePolicy::default()
            };
            let first = at(1, 0);
            let now = first + (missed as Millis - 1) * 60_000;
            let mut next = first;
            let mut skipped = 0;
            let mut ran = Vec::new();
            while next <= now {
                let decision = decide_due(&cadence(&schedule, &policy, None), next, None, now);
                assert!(decision.skipped.len() <= MAX_OCCURRENCES_PER_DECISION);
                skipped += decision.skipped.len();
                match decision.run {
                    // It runs; the next decision starts after it.
                    Some(run) => {
                        ran.push(run);
                        next = run + 60_000;
                    }
                    None => next = decision.next_run_time.unwrap(),
                }
            }
            let latest: Vec<Millis> = (missed - catchup_max as usize..missed)
                .map(|n| first + n as Millis * 60_000)
                .collect();
            assert_eq!(ran, latest, "catchup_max {catchup_max}, {missed} missed");
            // The occurrences older than the latest 1,000 share one row.
            let older = missed.saturating_sub(MAX_OCCURRENCES_PER_DECISION);
            assert_eq!(
                skipped + older.saturating_sub(1),
                missed - catchup_max as usize
            );
        }
    }

    #[test]
    fn a_failure_retries_with_growing_gaps_until_attempts_run_out() {
        let schedule = quarter();
        let policy = EffectivePolicy {
            max_attempts: 3,
            ..EffectivePolicy::default()
        };
        let cadence = cadence(&schedule, &policy, None);
        let first = finish_of(
            &cadence,
            &policy,
            at(1, 0),
            0,
            at(1, 0),
            at(1, 0) + 100,
            Ending::Failed,
        );
        let (retry_at, number) = first.retry_at().unwrap();
        assert_eq!(number, 1);
        assert!((8_000..=10_000).contains(&(retry_at - at(1, 0) - 100)));
        let second = finish_of(
            &cadence,
            &policy,
            at(1, 0),
            1,
            retry_at,
            retry_at + 100,
            Ending::Failed,
        );
        let (second_at, number) = second.retry_at().unwrap();
        assert_eq!(number, 2);
        assert!(second_at - retry_at > retry_at - at(1, 0));
        let last = finish_of(
            &cadence,
            &policy,
            at(1, 0),
            2,
            second_at,
            second_at + 100,
            Ending::Failed,
        );
        assert_eq!(last.retry, RetryUpdate::Clear);
        assert_eq!(last.next_run_time, Some(at(1, 15)));
        // A cancel is never retried.
        let cancelled = finish_of(
            &cadence,
            &policy,
            at(1, 0),
            0,
            at(1, 0),
            at(1, 1),
            Ending::Cancelled,
        );
        assert_eq!(cancelled.retry, RetryUpdate::Clear);
    }

    #[test]
    fn overlaps_skip_buffer_or_cancel() {
        let schedule = CronSchedule::parse("* * * * *").unwrap();
        let run = |overlap, ending| {
            let policy = EffectivePolicy {
                overlap,
                ..EffectivePolicy::default()
            };
            let cadence = cadence(&schedule, &policy, None);
            finish_of(
                &cadence,
                &policy,
                at(1, 0),
                0,
                at(1, 0),
                at(1, 2) + 30_000,
                ending,
            )
        };
        let skip = run(Overlap::Skip, Ending::Completed);
        assert_eq!(
            reasons(&skip.skipped),
            vec![
                (at(1, 1), SkipReason::Overlap),
                (at(1, 2), SkipReason::Overlap)
            ]
        );
        assert_eq!(skip.next_run_time, Some(at(1, 3)));
        let buffer = run(Overlap::BufferOne, Ending::Completed);
        assert_eq!(
            reasons(&buffer.skipped),
            vec![(at(1, 1), SkipReason::Overlap)]
        );
        assert_eq!(buffer.next_run_time, Some(at(1, 2)));
        // Owed its run, not a retry: no failure counted, no retry logged.
        assert_eq!(
            buffer.retry,
            RetryUpdate::Pending {
                of: at(1, 2),
                failed_attempts: 0
            }
        );
        assert_eq!(buffer.retry_at(), None);
        assert_eq!(skip.retry, RetryUpdate::Clear);
        let cancel = run(Overlap::Skip, Ending::CancelledByOverlap);
        assert_eq!(cancel.next_run_time, Some(at(1, 2)));
        assert_eq!(
            cancel.retry,
            RetryUpdate::Pending {
                of: at(1, 2),
                failed_attempts: 0
            }
        );
        // `misfire: skip` leaves the buffered occurrence alone however late
        // the run ended: it runs as it stands.
        let skipping = EffectivePolicy {
            overlap: Overlap::BufferOne,
            misfire: Misfire::Skip,
            catchup_window_seconds: Some(10),
            ..EffectivePolicy::default()
        };
        let skipping_cadence = cadence(&schedule, &skipping, None);
        let owed = decide_due(&skipping_cadence, at(1, 2), Some(at(1, 2)), at(1, 7));
        assert_eq!(owed.run, Some(at(1, 2)));
        assert!(owed.skipped.is_empty());
        let unmarked = decide_due(&skipping_cadence, at(1, 2), None, at(1, 7));
        assert_ne!(unmarked.run, Some(at(1, 2)));
        // Due before the claim: left for the misfire policy, nothing skipped.
        let policy = EffectivePolicy::default();
        let every_minute = cadence(&schedule, &policy, None);
        let late = finish_of(
            &every_minute,
            &policy,
            at(1, 0),
            0,
            at(1, 5),
            at(1, 6),
            Ending::Completed,
        );
        assert_eq!(late.next_run_time, Some(at(1, 1)));
        assert!(late.skipped.is_empty());
        assert_eq!(
            overlap_due(&every_minute, at(1, 0), at(1, 0) + 10),
            Some(at(1, 1))
        );
        // An occurrence the window holds back cancels nothing: the run
        // goes on until one that may start in its place.
        let hourly = CronSchedule::parse("0 * * * *").unwrap();
        let window: Window = "09:00-17:00".parse().unwrap();
        let windowed = cadence(&hourly, &policy, Some(window));
        let sixteen = Utc
            .with_ymd_and_hms(2026, 6, 1, 16, 0, 0)
            .unwrap()
            .timestamp_millis();
        let next_nine = Utc
            .with_ymd_and_hms(2026, 6, 2, 9, 0, 0)
            .unwrap()
            .timestamp_millis();
        assert_eq!(
            overlap_due(&windowed, sixteen, sixteen + 10),
            Some(next_nine)
        );
        // Nor is it owed a run when the 16:00 run, buffered, ends at 17:45:
        // 17:00 is missed, for the misfire policy at 09:00.
        let buffering = EffectivePolicy {
            overlap: Overlap::BufferOne,
            ..EffectivePolicy::default()
        };
        let windowed = cadence(&hourly, &buffering, Some(window));
        let late_end = finish_of(
            &windowed,
            &buffering,
            sixteen,
            0,
            sixteen,
            sixteen + 105 * 60_000,
            Ending::Completed,
        );
        assert_eq!(late_end.next_run_time, Some(sixteen + 3_600_000));
        assert_eq!(late_end.retry, RetryUpdate::Clear);
    }
}
