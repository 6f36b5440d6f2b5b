//! The ready filter of seed 000: eight criteria, each with a reason an
//! operator can read when a rule is held back.

use std::fmt;

use chrono_tz::Tz;
use serde::Serialize;
use uuid::Uuid;

use super::jobs::{missed_since_due, window_opening};
use super::resolve::resolve_zone;
use super::{ExecutionPlan, Workflow, quarantine};
use crate::clock::millis_to_utc;
use crate::cluster::Ownership;
use crate::model::{Millis, RuleStatus};
use crate::schedule::{TimeOfDay, Window, local_time_of_day};

/// Why a workflow is not ready, in the order the filter checks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum NotReady {
    /// The database no longer returns it; pruned later.
    RemovedFromDatabase,
    Inactive,
    Archived,
    ForceStopped,
    CurrentlyRunning,
    BranchMissing,
    BranchInactive,
    RuleMissing,
    RuleInactive,
    NoNextRunTime,
    NotDue {
        next_run_time: Millis,
    },
    /// Due, but its start offset (`start_jitter_seconds`) has not passed.
    StartOffset {
        next_run_time: Millis,
        starts_at: Millis,
    },
    /// A failed occurrence waits for its retry (`max_attempts`).
    RetryPending {
        occurrence: Millis,
        retry_at: Millis,
        attempt: i64,
    },
    InvalidTimezone {
        timezone: String,
    },
    OutsideWindow {
        local_time: TimeOfDay,
        window: Window,
    },
    /// Held: the branch rule itself, or a row its schedule or actions
    /// depend on, is quarantined. Resumes once the row is fixed.
    Quarantined {
        table: String,
        id: String,
        message: String,
    },
}

impl NotReady {
    /// Held back by another row (its branch or rule, switched off or
    /// gone, a bad zone, a quarantined row it depends on): nothing but a
    /// change of that row can make it ready.
    pub(crate) fn waits_for_another_row(&self) -> bool {
        matches!(
            self,
            NotReady::BranchMissing
                | NotReady::BranchInactive
                | NotReady::RuleMissing
                | NotReady::RuleInactive
                | NotReady::InvalidTimezone { .. }
                | NotReady::Quarantined { .. }
        )
    }

    /// Held for a problem an operator must fix, rather than waiting for
    /// time, a window or a flag.
    pub fn is_held(&self) -> bool {
        matches!(
            self,
            NotReady::Quarantined { .. }
                | NotReady::NoNextRunTime
                | NotReady::InvalidTimezone { .. }
                // A branch or rule deleted under it with SQL (foreign keys
                // are off in the sqlite3 shell by default).
                | NotReady::BranchMissing
                | NotReady::RuleMissing
        )
    }
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotReady::RemovedFromDatabase => write!(f, "removed from the database"),
            NotReady::Inactive => write!(f, "is_active is false"),
            NotReady::Archived => write!(f, "is_archived is true"),
            NotReady::ForceStopped => write!(f, "is_force_stopped is true"),
            NotReady::CurrentlyRunning => write!(f, "is_currently_running is true"),
            NotReady::BranchMissing => write!(f, "its branch is not in the plan"),
            NotReady::BranchInactive => write!(f, "branch.is_active is false"),
            NotReady::RuleMissing => write!(f, "its rule is not in the plan"),
            NotReady::RuleInactive => write!(f, "rule.status is inactive"),
            NotReady::NoNextRunTime => write!(
                f,
                "held: next_run_time is not set (no next run could be computed; an API change of the rule, branch or branch rule, or run now, sets one)"
            ),
            NotReady::NotDue { next_run_time } => {
                write!(
                    f,
                    "not due until {}",
                    millis_to_utc(*next_run_time).to_rfc3339()
                )
            }
            NotReady::StartOffset {
                next_run_time,
                starts_at,
            } => write!(
                f,
                "due at {} but starts at {} (start_jitter_seconds offset {} ms)",
                millis_to_utc(*next_run_time).to_rfc3339(),
                millis_to_utc(*starts_at).to_rfc3339(),
                starts_at - next_run_time
            ),
            NotReady::RetryPending {
                occurrence,
                retry_at,
                attempt,
            } => write!(
                f,
                "the occurrence at {} failed; attempt {attempt} runs at {}",
                millis_to_utc(*occurrence).to_rfc3339(),
                millis_to_utc(*retry_at).to_rfc3339()
            ),
            NotReady::InvalidTimezone { timezone } => {
                write!(f, "branch timezone {timezone:?} is not an IANA zone")
            }
            NotReady::OutsideWindow { local_time, window } => {
                write!(f, "local time {local_time} is outside the window {window}")
            }
            NotReady::Quarantined { table, id, message } => {
                write!(f, "held: {table} row {id} is quarantined: {message}")
            }
        }
    }
}

impl ExecutionPlan {
    /// The branch's zone, or `default_zone` when it has none.
    pub fn zone_of(&self, workflow: &Workflow, default_zone: Tz) -> Result<Tz, NotReady> {
        let branch = self
            .branches
            .get(&workflow.branch_rule.branch_id)
            .ok_or(NotReady::BranchMissing)?;
        let timezone = branch.timezone.as_deref();
        resolve_zone(branch.id, timezone, default_zone).map_err(|_| NotReady::InvalidTimezone {
            timezone: timezone.unwrap_or_default().to_string(),
        })
    }

    /// A quarantined row that holds this workflow back: the branch rule
    /// itself, its branch, rule or brand rule, one of its action details,
    /// or the template of one.
    pub(crate) fn quarantined_dependency(&self, workflow: &Workflow) -> Option<NotReady> {
        let row = &workflow.branch_rule;
        let q = &self.quarantine;
        let hit = q
            .get(quarantine::BRANCH_RULES, &row.id)
            .or_else(|| q.get(quarantine::BRANCHES, &row.branch_id))
            .or_else(|| q.get(quarantine::RULES, &row.rule_id))
            .or_else(|| {
                row.brand_rule_id
                    .and_then(|id| q.get(quarantine::BRAND_RULES, &id))
            })
            .or_else(|| q.detail_of(&row.id))
            .or_else(|| {
                self.action_details(&row.id)
                    .iter()
                    .find_map(|d| q.get(quarantine::ACTION_TEMPLATES, &d.action_template_id))
            })?;
        Some(NotReady::Quarantined {
            table: hit.table.clone(),
            id: hit.id.clone(),
            message: hit.message.clone(),
        })
    }
}

/// Checks every criterion for one workflow at `now`; `Ok` means ready.
pub fn check_ready(
    plan: &ExecutionPlan,
    workflow: &Workflow,
    now: Millis,
    default_zone: Tz,
) -> Result<(), NotReady> {
    let row = &workflow.branch_rule;
    // Cheap when nothing is quarantined, which is the usual case.
    if !plan.quarantine.is_empty()
        && let Some(held) = plan.quarantined_dependency(workflow)
    {
        return Err(held);
    }
    if workflow.missing_since.is_some() {
        return Err(NotReady::RemovedFromDatabase);
    }
    if !row.is_active {
        return Err(NotReady::Inactive);
    }
    if row.is_archived {
        return Err(NotReady::Archived);
    }
    if row.is_force_stopped {
        return Err(NotReady::ForceStopped);
    }
    if row.is_currently_running {
        return Err(NotReady::CurrentlyRunning);
    }
    let branch = plan.branch(&row.branch_id).ok_or(NotReady::BranchMissing)?;
    if !branch.is_active {
        return Err(NotReady::BranchInactive);
    }
    let rule = plan.rule(&row.rule_id).ok_or(NotReady::RuleMissing)?;
    if rule.status != RuleStatus::Active {
        return Err(NotReady::RuleInactive);
    }
    let next_run_time = row.next_run_time.ok_or(NotReady::NoNextRunTime)?;
    if next_run_time > now {
        return Err(match row.retry_of {
            Some(occurrence) => NotReady::RetryPending {
                occurrence,
                retry_at: next_run_time,
                attempt: i64::from(row.failed_attempts) + 1,
            },
            None => NotReady::NotDue { next_run_time },
        });
    }
    let starts_at = next_run_time + super::start_offset(Some(rule), row);
    if starts_at > now {
        return Err(NotReady::StartOffset {
            next_run_time,
            starts_at,
        });
    }
    if let Some(window) = Window::from_bounds(row.operation_time_from, row.operation_time_to) {
        let zone = plan.zone_of(workflow, default_zone)?;
        let local_time = local_time_of_day(zone, millis_to_utc(now));
        if !window.contains(local_time) {
            return Err(NotReady::OutsideWindow { local_time, window });
        }
    }
    Ok(())
}

/// The ready set at `now`: ordered by (next_run_time, id), at most `cap`.
///
/// Walks only the due part of the index, so its cost grows with the number
/// of due workflows, not with the size of the plan.
pub fn ready(plan: &ExecutionPlan, now: Millis, cap: usize, default_zone: Tz) -> Vec<Uuid> {
    ready_owned(plan, now, cap, default_zone, &Ownership::All)
}

/// [`ready`] restricted to the rules this instance owns: the partitions
/// whose lease it holds (seed 003).
pub fn ready_owned(
    plan: &ExecutionPlan,
    now: Millis,
    cap: usize,
    default_zone: Tz,
    ownership: &Ownership,
) -> Vec<Uuid> {
    ready_ids(plan, now, default_zone, ownership)
        .take(cap)
        .collect()
}

/// [`ready_owned`] for the plan's owner, which parks every due workflow
/// it finds waiting for its operation window at that window's next
/// opening, and every one held back by another row until that row
/// changes: later walks pass over them until then (see `ExecutionPlan`'s
/// `parked`), where every fetch used to check them again.
pub fn take_ready_owned(
    plan: &mut ExecutionPlan,
    now: Millis,
    cap: usize,
    default_zone: Tz,
    ownership: &Ownership,
) -> Vec<Uuid> {
    plan.unpark_opened(now);
    let mut ready = Vec::new();
    let mut waiting = Vec::new();
    let mut held_back = Vec::new();
    for id in plan.due_ids(now) {
        if ready.len() >= cap {
            break;
        }
        if !ownership.owns(&id) {
            continue;
        }
        let Some(workflow) = plan.get(&id) else {
            continue;
        };
        match check_ready(plan, workflow, now, default_zone) {
            Ok(()) => ready.push(id),
            Err(NotReady::OutsideWindow { window, .. }) => waiting.push((
                id,
                window_opening(plan, workflow, window, now, default_zone),
                missed_since_due(plan, workflow, window, now, default_zone),
            )),
            Err(reason) if reason.waits_for_another_row() => held_back.push(id),
            Err(_) => {}
        }
    }
    for (id, opening, missed) in waiting {
        plan.park(id, opening, missed);
    }
    for id in held_back {
        plan.hold_back(id);
    }
    ready
}

/// The workflows that become ready within `lead` after `now`, in the
/// order they do, each with the instant it does: the master claims them
/// ahead (MASTER_CLAIM_LEAD_SECONDS) so their claims have committed when
/// they fall due, and starts each at its instant. The due index is keyed
/// by when a workflow can start (its due time plus its start offset, or
/// the opening its window is parked until), and each is checked at that
/// instant: one that would not be ready then (its window closed, say) is
/// left for the fetch when it falls due, so a job claimed ahead never
/// starts where it would not have otherwise. Parks nothing.
pub fn ready_within_lead(
    plan: &ExecutionPlan,
    now: Millis,
    lead: Millis,
    cap: usize,
    default_zone: Tz,
    ownership: &Ownership,
) -> Vec<(Uuid, Millis)> {
    if lead <= 0 || cap == 0 {
        return Vec::new();
    }
    plan.due_index
        .range((now.saturating_add(1), Uuid::nil())..=(now.saturating_add(lead), Uuid::max()))
        .filter(|(_, id)| ownership.owns(id))
        .filter(|&&(at, id)| {
            plan.get(&id)
                .is_some_and(|w| check_ready(plan, w, at, default_zone).is_ok())
        })
        .map(|&(at, id)| (id, at))
        .take(cap)
        .collect()
}

fn ready_ids<'a>(
    plan: &'a ExecutionPlan,
    now: Millis,
    default_zone: Tz,
    ownership: &'a Ownership,
) -> impl Iterator<Item = Uuid> + 'a {
    plan.due_ids(now)
        .filter(|id| ownership.owns(id))
        .filter(move |id| {
            plan.get(id)
                .is_some_and(|w| check_ready(plan, w, now, default_zone).is_ok())
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::fixtures::*;
    use chrono::{TimeZone, Utc};
    use chrono_tz::Tz;

    const RIYADH: Tz = chrono_tz::Asia::Riyadh;

    fn at_local(zone: Tz, y: i32, mo: u32, d: u32, h: u32, mi: u32) -> Millis {
        zone.with_ymd_and_hms(y, mo, d, h, mi, 0)
            .single()
            .unwrap()
            .with_timezone(&Utc)
            .timestamp_millis()
    }

    fn reason(fixture: &Fixture, now: Millis) -> Result<(), NotReady> {
        let plan = fixture.plan();
        check_ready(&plan, plan.get(&fixture.workflow_id).unwrap(), now, RIYADH)
    }

    const NOW: Millis = 1_800_000_000_000;

    #[test]
    fn a_due_active_rule_is_ready() {
        assert_eq!(reason(&Fixture::due(NOW - 1), NOW), Ok(()));
        assert_eq!(reason(&Fixture::due(NOW), NOW), Ok(()), "due exactly now");
    }

    #[test]
    fn each_criterion_holds_a_rule_back_on_its_own() {
        type Change = Box<dyn Fn(&mut Fixture)>;
        let cases: Vec<(&str, Change, NotReady)> = vec![
            (
                "is_active",
                Box::new(|f| f.branch_rule.is_active = false),
                NotReady::Inactive,
            ),
            (
                "is_archived",
                Box::new(|f| f.branch_rule.is_archived = true),
                NotReady::Archived,
            ),
            (
                "is_force_stopped",
                Box::new(|f| f.branch_rule.is_force_stopped = true),
                NotReady::ForceStopped,
            ),
            (
                "is_currently_running",
                Box::new(|f| f.branch_rule.is_currently_running = true),
                NotReady::CurrentlyRunning,
            ),
            (
                "branch.is_active",
                Box::new(|f| f.branch.is_active = false),
                NotReady::BranchInactive,
            ),
            (
                "rule.status",
                Box::new(|f| f.rule.status = RuleStatus::Inactive),
                NotReady::RuleInactive,
            ),
            (
                "next_run_time",
                Box::new(|f| f.branch_rule.next_run_time = Some(NOW + 1)),
                NotReady::NotDue {
                    next_run_time: NOW + 1,
                },
            ),
            (
                "next_run_time unset",
                Box::new(|f| f.branch_rule.next_run_time = None),
                NotReady::NoNextRunTime,
            ),
        ];
        for (criterion, change, expected) in cases {
            let mut fixture = Fixture::due(NOW - 60_000);
            change(&mut fixture);
            assert_eq!(reason(&fixture, NOW), Err(expected), "{criterion}");
            let plan = fixture.plan();
            assert!(ready(&plan, NOW, 500, RIYADH).is_empty(), "{criterion}");
        }
    }

    /// A fixture due a minute before NOW whose window opens in two hours
    /// (UTC), and that opening.
    fn waiting_for_its_window() -> (Fixture, Millis) {
        use crate::schedule::{TimeOfDay, local_time_of_day};
        let mut fixture = Fixture::due(NOW - 60_000);
        let local = local_time_of_day(chrono_tz::UTC, millis_to_utc(NOW));
        fixture.branch_rule.operation_time_from =
            Some(TimeOfDay::new((local.hour() + 2) % 24, 0).unwrap());
        fixture.branch_rule.operation_time_to =
            Some(TimeOfDay::new((local.hour() + 3) % 24, 0).unwrap());
        let opening = NOW - NOW % 3_600_000 + 2 * 3_600_000;
        (fixture, opening)
    }

    #[test]
    fn a_rule_waiting_for_its_window_is_parked_until_it_opens() {
        let utc = chrono_tz::UTC;
        let all = &Ownership::All;
        let (fixture, opening) = waiting_for_its_window();
        let id = fixture.workflow_id;
        let mut plan = fixture.plan();
        assert_eq!(plan.due_ids(NOW).count(), 1);
        assert!(take_ready_owned(&mut plan, NOW, 500, utc, all).is_empty());
        // Out of the due part of the index: later walks pass it by. Still
        // due, for the counts.
        assert_eq!(plan.due_ids(NOW).count(), 0);
        assert_eq!(plan.stats(NOW).due, 1);
        assert_eq!(plan.due_ids(opening - 1).count(), 0);
        assert_eq!(crate::plan::next_wake(&plan, NOW, utc, all), Some(opening));
        assert_eq!(take_ready_owned(&mut plan, opening, 500, utc, all), [id]);
        // Once its window opened it is back at its due time, ahead of what
        // fell due after it.
        assert_eq!(plan.due_ids(opening).count(), 1);
        assert_eq!(plan.earliest_due(), Some(NOW - 60_000));

        // A change of the row puts it back at its due time.
        let mut plan = fixture.plan();
        take_ready_owned(&mut plan, NOW, 500, utc, all);
        plan.update(&id, |w| w.branch_rule.operation_time_from = None);
        assert_eq!(take_ready_owned(&mut plan, NOW, 500, utc, all), [id]);

        // So does a refresh that changed it, while an unchanged one keeps
        // it parked.
        let mut plan = fixture.plan();
        take_ready_owned(&mut plan, NOW, 500, utc, all);
        crate::plan::merge(&mut plan, fixture.data(), NOW, Default::default());
        assert_eq!(plan.due_ids(NOW).count(), 0, "unchanged: still parked");
        let mut changed = fixture.clone();
        changed.branch_rule.operation_time_to = None;
        changed.branch_rule.operation_time_from = None;
        crate::plan::merge(&mut plan, changed.data(), NOW, Default::default());
        assert_eq!(take_ready_owned(&mut plan, NOW, 500, utc, all), [id]);

        // A branch's zone may move every window: all go back.
        let mut plan = fixture.plan();
        take_ready_owned(&mut plan, NOW, 500, utc, all);
        let mut moved = fixture.clone();
        moved.branch.timezone = Some("Asia/Tokyo".into());
        crate::plan::merge(&mut plan, moved.data(), NOW, Default::default());
        assert_eq!(plan.due_ids(NOW).count(), 1);

        // Removed while parked: no entry left behind.
        let mut plan = fixture.plan();
        take_ready_owned(&mut plan, NOW, 500, utc, all);
        plan.remove(&id);
        assert_eq!(plan.earliest_due(), None);
    }

    #[test]
    fn rules_ready_within_the_lead_come_with_the_instant_they_are_ready() {
        let utc = chrono_tz::UTC;
        let all = &Ownership::All;
        let lead = 500;
        let ahead = |fixture: &Fixture| {
            let plan = fixture.plan();
            ready_within_lead(&plan, NOW, lead, 500, utc, all)
        };
        let soon = Fixture::due(NOW + 300);
        assert_eq!(ahead(&soon), [(soon.workflow_id, NOW + 300)]);
        assert!(
            ahead(&Fixture::due(NOW + lead + 1)).is_empty(),
            "past the lead"
        );
        assert!(
            ahead(&Fixture::due(NOW)).is_empty(),
            "due now: the ready set's"
        );
        let plan = soon.plan();
        assert!(
            ready_within_lead(&plan, NOW, 0, 500, utc, all).is_empty(),
            "no lead"
        );
        assert!(
            ready_within_lead(&plan, NOW, lead, 0, utc, all).is_empty(),
            "no room"
        );

        // Checked at its own instant: a window that is closed then keeps
        // it for the fetch when it falls due.
        let mut closed_then = Fixture::due(NOW + 300);
        let local = local_time_of_day(utc, millis_to_utc(NOW + 300));
        closed_then.branch_rule.operation_time_from =
            Some(TimeOfDay::new((local.hour() + 2) % 24, 0).unwrap());
        closed_then.branch_rule.operation_time_to =
            Some(TimeOfDay::new((local.hour() + 3) % 24, 0).unwrap());
        assert!(ahead(&closed_then).is_empty());
        let mut off = Fixture::due(NOW + 300);
        off.branch_rule.is_force_stopped = true;
        assert!(ahead(&off).is_empty());

        // Parked for its window: ready within the lead of the opening, at
        // the opening.
        let (fixture, opening) = waiting_for_its_window();
        let mut plan = fixture.plan();
        assert!(take_ready_owned(&mut plan, NOW, 500, utc, all).is_empty());
        assert!(ready_within_lead(&plan, opening - lead - 1, lead, 500, utc, all).is_empty());
        assert_eq!(
            ready_within_lead(&plan, opening - lead, lead, 500, utc, all),
            [(fixture.workflow_id, opening)]
        );
    }

    #[test]
    fn the_master_wakes_a_lead_before_what_it_can_claim_ahead() {
        use crate::plan::next_wake_with_lead;
        let all = &Ownership::All;
        let plan = Fixture::due(NOW + 10_000).plan();
        let wake = Some(NOW + 10_000);
        assert_eq!(
            next_wake_with_lead(wake, &plan, NOW, 500, all),
            Some(NOW + 9_500)
        );
        assert_eq!(next_wake_with_lead(wake, &plan, NOW, 0, all), wake);
        assert_eq!(
            next_wake_with_lead(None, &plan, NOW, 500, all),
            Some(NOW + 9_500)
        );
        // Inside the lead already (not claimable ahead, or being claimed):
        // woken for at its own time, not spun on.
        assert_eq!(
            next_wake_with_lead(wake, &plan, NOW + 9_800, 500, all),
            wake
        );
        // An earlier wake (a window opening, a busy plan) still counts.
        assert_eq!(
            next_wake_with_lead(Some(NOW + 1_000), &plan, NOW, 500, all),
            Some(NOW + 1_000)
        );
    }

    #[test]
    fn a_rule_held_back_by_another_row_is_set_aside_until_that_row_changes() {
        let utc = chrono_tz::UTC;
        let all = &Ownership::All;
        let fixture = Fixture::due(NOW - 60_000);
        let id = fixture.workflow_id;
        let mut branch_off = fixture.clone();
        branch_off.branch.is_active = false;
        let mut rule_off = fixture.clone();
        rule_off.rule.status = RuleStatus::Inactive;
        let mut bad_zone = fixture.clone();
        bad_zone.branch.timezone = Some("Mars/Olympus".into());
        for held in [branch_off, rule_off, bad_zone] {
            let mut plan = ExecutionPlan::from_load(crate::model::PlanLoad {
                data: held.data(),
                rejected: vec![],
            });
            assert_eq!(plan.due_ids(NOW).count(), 1);
            assert!(take_ready_owned(&mut plan, NOW, 500, utc, all).is_empty());
            // Out of every walk and every wake; still due, and held, for
            // the counts and the reasons.
            assert_eq!(plan.due_ids(NOW).count(), 0);
            assert_eq!(plan.earliest_due(), None);
            assert_eq!(crate::plan::next_wake(&plan, NOW, utc, all), None);
            assert_eq!(plan.stats(NOW).due, 1);
            assert!(check_ready(&plan, plan.get(&id).unwrap(), NOW, utc).is_err());

            // A refresh that changed nothing keeps it aside.
            let mut load = crate::model::PlanLoad {
                data: held.data(),
                rejected: vec![],
            };
            plan.quarantine_bad_rows(&mut load, NOW);
            crate::plan::merge(&mut plan, load.data, NOW, Default::default());
            assert_eq!(plan.due_ids(NOW).count(), 0);

            // The row fixed (switched on, the zone corrected): back at its
            // due time, and ready.
            let mut load = crate::model::PlanLoad {
                data: fixture.data(),
                rejected: vec![],
            };
            let change = plan.quarantine_bad_rows(&mut load, NOW);
            let report = crate::plan::merge(&mut plan, load.data, NOW, Default::default());
            // Either says so, for the plan actor to wake the master.
            assert!(
                report.released == 1 || !change.released.is_empty(),
                "{report:?} {change:?}"
            );
            assert_eq!(plan.earliest_due(), Some(NOW - 60_000));
            assert_eq!(take_ready_owned(&mut plan, NOW, 500, utc, all), [id]);
        }
    }

    fn window_case(
        zone: Option<&str>,
        window: Option<&str>,
        local: (u32, u32),
    ) -> Result<(), NotReady> {
        let tz: Tz = zone.map_or(RIYADH, |z| z.parse().unwrap());
        let now = at_local(tz, 2026, 6, 15, local.0, local.1);
        let mut fixture = Fixture::due(now - 60_000);
        fixture.branch.timezone = zone.map(str::to_string);
        if let Some(window) = window {
            let window: Window = window.parse().unwrap();
            fixture.branch_rule.operation_time_from = Some(window.from);
            fixture.branch_rule.operation_time_to = Some(window.to);
        }
        reason(&fixture, now)
    }

    const ZONES: [Option<&str>; 4] = [
        None,
        Some("Asia/Riyadh"),
        Some("America/New_York"),
        Some("Australia/Lord_Howe"),
    ];

    /// In every zone (and the default), `window` is open at each local time
    /// of `inside` and closed at each of `outside`.
    fn assert_window(window: &str, inside: &[(u32, u32)], outside: &[(u32, u32)]) {
        for zone in ZONES {
            for &local in inside {
                assert_eq!(
                    window_case(zone, Some(window), local),
                    Ok(()),
                    "{zone:?} {local:?}"
                );
            }
            for &local in outside {
                assert!(
                    matches!(
                        window_case(zone, Some(window), local),
                        Err(NotReady::OutsideWindow { .. })
                    ),
                    "{zone:?} {local:?}"
                );
            }
        }
    }

    #[test]
    fn same_day_window_in_each_zone() {
        assert_window("09:00-17:00", &[(9, 0), (16, 59)], &[(17, 0), (8, 59)]);
    }

    #[test]
    fn overnight_window_in_each_zone() {
        assert_window(
            "22:00-06:00",
            &[(22, 0), (5, 59), (0, 30)],
            &[(6, 0), (21, 59)],
        );
    }

    #[test]
    fn no_window_is_always_open_in_each_zone() {
        for zone in ZONES {
            for hour in [0, 5, 12, 23] {
                assert_eq!(
                    window_case(zone, None, (hour, 0)),
                    Ok(()),
                    "{zone:?} {hour}"
                );
            }
        }
    }

    #[test]
    fn the_branch_zone_decides_not_the_default() {
        // 23:00 in New York is 06:00 the next morning in Riyadh: inside the
        // overnight window for the branch, outside it in the default zone.
        assert_eq!(
            window_case(Some("America/New_York"), Some("22:00-06:00"), (23, 0)),
            Ok(())
        );
        let now = at_local(chrono_tz::America::New_York, 2026, 6, 15, 23, 0);
        let mut fixture = Fixture::due(now - 1);
        fixture.branch_rule.operation_time_from = Some("22:00".parse().unwrap());
        fixture.branch_rule.operation_time_to = Some("06:00".parse().unwrap());
        assert!(matches!(
            reason(&fixture, now),
            Err(NotReady::OutsideWindow { .. })
        ));
    }

    #[test]
    fn an_unknown_zone_is_reported_not_guessed() {
        let mut fixture = Fixture::due(NOW - 1);
        fixture.branch.timezone = Some("Mars/Olympus".into());
        fixture.branch_rule.operation_time_from = Some("00:00".parse().unwrap());
        fixture.branch_rule.operation_time_to = Some("12:00".parse().unwrap());
        assert!(matches!(
            reason(&fixture, NOW),
            Err(NotReady::InvalidTimezone { .. })
        ));
    }

    #[test]
    fn ordered_by_next_run_time_then_id_and_capped() {
        let mut fixture = Fixture::due(NOW);
        let mut plan = fixture.plan();
        let mut expected = Vec::new();
        for i in 0..50u128 {
            // Pairs share a due time so the id breaks the tie.
            let due = NOW - 1_000 * (25 - (i / 2) as i64);
            let id = Uuid::from_u128(1_000 - i);
            fixture.branch_rule.id = id;
            fixture.branch_rule.next_run_time = Some(due);
            plan.insert(Workflow::new(fixture.branch_rule.clone()));
            expected.push((due, id));
        }
        fixture.branch_rule.id = Uuid::from_u128(5);
        fixture.branch_rule.next_run_time = Some(NOW + 1);
        plan.insert(Workflow::new(fixture.branch_rule.clone()));
        expected.push((NOW, fixture.workflow_id));
        expected.sort();
        let all: Vec<Uuid> = expected.iter().map(|&(_, id)| id).collect();
        assert_eq!(ready(&plan, NOW, 500, RIYADH), all);
        assert_eq!(ready(&plan, NOW, 7, RIYADH), all[..7].to_vec());
    }

    #[test]
    fn the_index_follows_updates() {
        let fixture = Fixture::due(NOW + 10_000);
        let mut plan = fixture.plan();
        let id = fixture.workflow_id;
        assert!(ready(&plan, NOW, 500, RIYADH).is_empty());
        plan.set_next_run_time(&id, NOW - 5, NOW);
        assert_eq!(ready(&plan, NOW, 500, RIYADH), vec![id]);
        plan.mark_running(&id, NOW);
        assert!(ready(&plan, NOW, 500, RIYADH).is_empty());
        assert_eq!(plan.reset_running_flags(), 1);
        assert_eq!(ready(&plan, NOW, 500, RIYADH), vec![id]);
        plan.remove(&id);
        assert!(ready(&plan, NOW, 500, RIYADH).is_empty());
        assert_eq!(plan.earliest_due(), None);
    }

    fn quarantined_plan(
        fixture: &Fixture,
        rejected: Vec<crate::model::RejectedRow>,
    ) -> ExecutionPlan {
        ExecutionPlan::from_load(crate::model::PlanLoad {
            data: fixture.data(),
            rejected,
        })
    }

    #[test]
    fn a_rule_whose_branch_or_rule_is_gone_is_held_and_counted() {
        let fixture = Fixture::due(NOW - 1);
        for missing in ["branch", "rule"] {
            let mut data = fixture.data();
            match missing {
                "branch" => data.branches.clear(),
                _ => data.rules.clear(),
            }
            let plan = ExecutionPlan::from_load(crate::model::PlanLoad {
                data,
                rejected: vec![],
            });
            let reason = check_ready(&plan, plan.get(&fixture.workflow_id).unwrap(), NOW, RIYADH)
                .unwrap_err();
            assert!(reason.is_held(), "{missing}: {reason}");
            assert!(reason.to_string().contains(missing), "{reason}");
            let stats = plan.stats(NOW);
            assert_eq!((stats.held, stats.active), (1, 0), "{missing}");
        }
    }

    #[test]
    fn a_rule_whose_zone_or_cron_is_quarantined_is_held_with_the_reason() {
        let mut fixture = Fixture::due(NOW - 1);
        fixture.branch.timezone = Some("Mars/Olympus".into());
        let plan = quarantined_plan(&fixture, vec![]);
        let reason =
            check_ready(&plan, plan.get(&fixture.workflow_id).unwrap(), NOW, RIYADH).unwrap_err();
        assert!(reason.is_held(), "{reason}");
        assert!(
            reason.to_string().contains(&format!(
                "invalid time zone \"Mars/Olympus\" on branch {}",
                fixture.branch.id
            )),
            "{reason}"
        );
        assert!(ready(&plan, NOW, 500, RIYADH).is_empty());
        assert_eq!(plan.stats(NOW).held, 1);

        let mut fixture = Fixture::due(NOW - 1);
        fixture.rule.cron_expression = "*/0 * * * *".into();
        let plan = quarantined_plan(&fixture, vec![]);
        let reason =
            check_ready(&plan, plan.get(&fixture.workflow_id).unwrap(), NOW, RIYADH).unwrap_err();
        assert!(
            matches!(&reason, NotReady::Quarantined { table, .. } if table == "rules"),
            "{reason}"
        );
        // Fixed: the next refresh brings the rule back and it is ready.
        let mut plan = plan;
        let mut load = crate::model::PlanLoad {
            data: Fixture::due(NOW - 1).data(),
            rejected: vec![],
        };
        let change = plan.quarantine_bad_rows(&mut load, NOW);
        assert_eq!(change.released.len(), 1);
        crate::plan::merge(
            &mut plan,
            load.data,
            NOW,
            crate::plan::MergeOptions::default(),
        );
        assert_eq!(ready(&plan, NOW, 500, RIYADH), vec![fixture.workflow_id]);
    }

    #[test]
    fn a_quarantined_action_detail_holds_its_rule_only() {
        let fixture = Fixture::due(NOW - 1);
        let detail = crate::model::RejectedRow {
            table: "action_details".into(),
            id: "d-1".into(),
            field: "params".into(),
            reason: crate::model::RejectReason::Decode,
            message: "invalid JSON".into(),
            branch_rule_id: Some(fixture.workflow_id),
        };
        let plan = quarantined_plan(&fixture, vec![detail.clone()]);
        assert!(ready(&plan, NOW, 500, RIYADH).is_empty());
        let other = crate::model::RejectedRow {
            branch_rule_id: Some(Uuid::from_u128(0xFFFF)),
            ..detail
        };
        let plan = quarantined_plan(&fixture, vec![other]);
        assert_eq!(ready(&plan, NOW, 500, RIYADH), vec![fixture.workflow_id]);
    }

    #[test]
    fn a_rule_without_a_next_run_is_held_until_one_is_set() {
        let mut fixture = Fixture::due(NOW - 60_000);
        // The finish could not compute a next run: it cleared it.
        fixture.branch_rule.next_run_time = None;
        fixture.branch_rule.last_run_time = Some(NOW - 30_000);
        let reason = reason(&fixture, NOW).unwrap_err();
        assert_eq!(reason, NotReady::NoNextRunTime);
        assert!(reason.is_held(), "{reason}");
        // A new next run (run now, an API fix) resumes it.
        fixture.branch_rule.next_run_time = Some(NOW - 1);
        assert_eq!(reason_of(&fixture, NOW), Ok(()));
    }

    #[test]
    fn a_buffered_occurrence_before_the_last_run_is_ready() {
        let mut fixture = Fixture::due(NOW - 60_000);
        fixture.branch_rule.last_run_time = Some(NOW - 30_000);
        assert_eq!(reason_of(&fixture, NOW), Ok(()));
    }

    fn reason_of(fixture: &Fixture, now: Millis) -> Result<(), NotReady> {
        reason(fixture, now)
    }
}
