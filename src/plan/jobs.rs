//! What the master needs to run a ready workflow, and when it should look
//! again: pure reads of the plan.

use chrono_tz::Tz;
use uuid::Uuid;

use super::{Cadence, ExecutionPlan, HELD_BACK, NotReady, check_ready, schedule_of};
use crate::clock::millis_to_utc;
use crate::cluster::Ownership;
use crate::model::{ActionDetail, ActionTemplate, BranchRule, Millis};
use crate::schedule::{CronSchedule, EffectivePolicy, ScheduleCache, Window, next_window_open};

/// One action of a job: the detail and its template, in position order.
#[derive(Debug, Clone, PartialEq)]
pub struct JobStep {
    pub detail: ActionDetail,
    /// `None` when the template is missing from the plan; the step fails
    /// with a clear error rather than being skipped.
    pub template: Option<ActionTemplate>,
}

/// Steps as the store reads them for a rule past the plan's cache.
pub fn job_steps(rows: Vec<(ActionDetail, Option<ActionTemplate>)>) -> Vec<JobStep> {
    rows.into_iter()
        .map(|(detail, template)| JobStep { detail, template })
        .collect()
}

/// Everything a worker needs, copied out of the plan at fetch time.
#[derive(Debug, Clone)]
pub struct JobSpec {
    pub branch_rule: BranchRule,
    /// `None` when the plan's capped cache does not hold all of this rule's
    /// action details: the worker reads them from the database instead.
    pub steps: Option<Vec<JobStep>>,
    /// The expression and zone to compute the next run from after the job;
    /// `Err` explains why there is none (the job still runs and is recorded).
    pub schedule: Result<(CronSchedule, Tz), String>,
    /// The policy in force: its own fields over its rule's.
    pub policy: EffectivePolicy,
}

impl JobSpec {
    /// The schedule as the policy decisions take it, when there is one.
    pub fn cadence(&self) -> Option<Cadence<'_>> {
        let (schedule, zone) = self.schedule.as_ref().ok()?;
        Some(self.cadence_with(schedule, *zone))
    }

    /// This job's window and policy on `schedule` in `zone` (the plan's
    /// current schedule at the finish, which may have changed).
    pub fn cadence_with<'a>(&'a self, schedule: &'a CronSchedule, zone: Tz) -> Cadence<'a> {
        let row = &self.branch_rule;
        Cadence {
            branch_rule_id: row.id,
            schedule,
            zone,
            window: Window::from_bounds(row.operation_time_from, row.operation_time_to),
            policy: &self.policy,
        }
    }
}

/// The job spec of one workflow, if the plan has it.
pub fn job_spec(
    plan: &ExecutionPlan,
    id: &Uuid,
    default_zone: Tz,
    schedules: &mut ScheduleCache,
) -> Option<JobSpec> {
    let workflow = plan.get(id)?;
    let steps = plan.has_all_action_details(id).then(|| {
        plan.action_details(id)
            .iter()
            .map(|detail| JobStep {
                detail: detail.clone(),
                template: plan.action_template(&detail.action_template_id).cloned(),
            })
            .collect()
    });
    Some(JobSpec {
        branch_rule: workflow.branch_rule.clone(),
        steps,
        schedule: schedule_of(plan, id, default_zone, schedules).map_err(|e| e.to_string()),
        policy: plan.policy_of(workflow),
    })
}

/// When the master should next fetch: the earliest future next_run_time,
/// or the opening of the window a due workflow waits for. Workflows held
/// back for other reasons (running, inactive branch) wake the master through
/// the plan change that frees them (their row's, or the lookup table's:
/// [`MergeReport::released`](super::MergeReport::released)), so they are
/// not counted here; that keeps a rule stuck outside its window from
/// spinning the master.
pub fn next_wake(
    plan: &ExecutionPlan,
    now: Millis,
    default_zone: Tz,
    ownership: &Ownership,
) -> Option<Millis> {
    let mut earliest = next_future_due(plan, now, ownership);
    let wake_at = |earliest: Option<Millis>, at: Millis| Some(earliest.map_or(at, |e| e.min(at)));
    for (walked, (_, id)) in plan.due_index.range(..=(now, Uuid::max())).enumerate() {
        if walked >= NEXT_WAKE_WALK {
            // A backlog this long keeps the master busy anyway; looking
            // again in a second costs one fetch, while walking all of it
            // on every fetch made a drain slower the longer it was.
            earliest = wake_at(earliest, now + 1_000);
            break;
        }
        if !ownership.owns(id) {
            continue;
        }
        let Some(workflow) = plan.get(id) else {
            continue;
        };
        if let Err(NotReady::OutsideWindow { window, .. }) =
            check_ready(plan, workflow, now, default_zone)
        {
            let opens = window_opening(plan, workflow, window, now, default_zone);
            earliest = wake_at(earliest, opens);
        }
    }
    earliest
}

/// Due workflows [`next_wake`] looks at for window openings, at most.
const NEXT_WAKE_WALK: usize = 4_096;

/// [`next_wake`] for a fetch that found ready rules: their finishes wake
/// the master again, so only a rule falling due sooner matters, and the
/// master looks within a second in any case. No walk of the due rules:
/// a fetch follows every finished job, and a long backlog made that walk
/// the largest cost of a drain.
pub fn next_wake_while_busy(plan: &ExecutionPlan, now: Millis, ownership: &Ownership) -> Millis {
    let soon = now + 1_000;
    next_future_due(plan, now, ownership).map_or(soon, |at| at.min(soon))
}

/// When the master should fetch again, claiming `lead` ahead: `wake` (the
/// next look without a lead), or `lead` before the first rule due after
/// what this fetch could claim ahead, if that is sooner. A rule inside the
/// lead that could not be claimed ahead is still woken for at its own
/// time (`wake` holds it), never earlier, so nothing spins on it.
pub fn next_wake_with_lead(
    wake: Option<Millis>,
    plan: &ExecutionPlan,
    now: Millis,
    lead: Millis,
    ownership: &Ownership,
) -> Option<Millis> {
    if lead <= 0 {
        return wake;
    }
    let ahead = next_future_due(plan, now.saturating_add(lead), ownership).map(|at| at - lead);
    match (wake, ahead) {
        (Some(wake), Some(ahead)) => Some(wake.min(ahead)),
        (wake, ahead) => wake.or(ahead),
    }
}

/// The earliest next_run_time after `now` among the rules owned here.
fn next_future_due(plan: &ExecutionPlan, now: Millis, ownership: &Ownership) -> Option<Millis> {
    plan.due_index
        .range((now.saturating_add(1), Uuid::nil())..(HELD_BACK, Uuid::nil()))
        .find(|(_, id)| ownership.owns(id))
        .map(|&(at, _)| at)
}

/// How many due workflows missed their operation window: it was open at
/// some moment since their next_run_time and is closed now, so they wait
/// for the next opening. A rule due before its window opens and waiting
/// for it is not counted: that is how a window works.
pub fn missed_windows(
    plan: &ExecutionPlan,
    now: Millis,
    default_zone: Tz,
    ownership: &Ownership,
) -> usize {
    plan.due_ids(now)
        .filter(|id| ownership.owns(id))
        .filter_map(|id| plan.get(&id))
        .filter(|workflow| {
            let Err(NotReady::OutsideWindow { window, .. }) =
                check_ready(plan, workflow, now, default_zone)
            else {
                return false;
            };
            missed_since_due(plan, workflow, window, now, default_zone)
        })
        .count()
        + plan.parked_missed(now, ownership)
}

/// Whether the window of a workflow waiting for it opened at some moment
/// since its next_run_time (and is closed at `now`).
pub(super) fn missed_since_due(
    plan: &ExecutionPlan,
    workflow: &super::Workflow,
    window: Window,
    now: Millis,
    default_zone: Tz,
) -> bool {
    workflow
        .branch_rule
        .next_run_time
        .is_some_and(|due| window_opening(plan, workflow, window, due, default_zone) < now)
}

pub(super) fn window_opening(
    plan: &ExecutionPlan,
    workflow: &super::Workflow,
    window: Window,
    now: Millis,
    default_zone: Tz,
) -> Millis {
    let zone = plan.zone_of(workflow, default_zone).unwrap_or(default_zone);
    next_window_open(Some(window), zone, millis_to_utc(now)).timestamp_millis()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ActionTemplate;
    use crate::plan::fixtures::Fixture;
    use serde_json::json;

    const NOW: Millis = 1_800_000_000_000;

    fn spec_of(plan: &ExecutionPlan, id: &Uuid) -> Option<JobSpec> {
        job_spec(plan, id, chrono_tz::UTC, &mut ScheduleCache::default())
    }

    #[test]
    fn a_job_spec_carries_steps_in_order_and_the_schedule() {
        let fixture = Fixture::due(NOW - 1);
        let template = ActionTemplate {
            id: Uuid::from_u128(0x7),
            name: "noop".into(),
            kind: "noop".into(),
            config: json!({}),
            created_at: 0,
            updated_at: 0,
        };
        let detail = |n: u128, position| ActionDetail {
            id: Uuid::from_u128(n),
            branch_rule_id: fixture.workflow_id,
            action_template_id: template.id,
            position,
            params: json!({}),
            created_at: 0,
            updated_at: 0,
        };
        let mut data = fixture.data();
        data.action_templates.push(template.clone());
        data.action_details = vec![detail(0x21, 2), detail(0x20, 1)];
        let plan = ExecutionPlan::from_data(data);
        let spec = spec_of(&plan, &fixture.workflow_id).unwrap();
        let steps = spec.steps.unwrap();
        let positions: Vec<i32> = steps.iter().map(|s| s.detail.position).collect();
        assert_eq!(positions, vec![1, 2]);
        assert_eq!(steps[0].template.as_ref(), Some(&template));
        let (schedule, zone) = spec.schedule.unwrap();
        assert_eq!(
            (schedule.expression(), zone),
            ("*/5 * * * *", chrono_tz::UTC)
        );
    }

    #[test]
    fn rules_past_the_action_details_cap_are_read_from_the_database() {
        use crate::plan::{MergeOptions, merge};
        let fixture = Fixture::due(NOW - 1);
        let detail = |rule: u128, n: u128| ActionDetail {
            id: Uuid::from_u128(n),
            branch_rule_id: Uuid::from_u128(rule),
            action_template_id: Uuid::from_u128(0x7),
            position: n as i32,
            params: json!({}),
            created_at: 0,
            updated_at: 0,
        };
        let mut data = fixture.data();
        // Ordered by branch rule id and cut at two: rule 0xA1 is complete,
        // the cut falls on 0xA2, and the fixture's rule (0xB4) is past it.
        data.action_details = vec![detail(0xA1, 1), detail(0xA2, 2)];
        data.action_details_cut = Some(Uuid::from_u128(0xA2));
        let mut plan = ExecutionPlan::new();
        let options = MergeOptions {
            first_refresh: true,
            ..MergeOptions::default()
        };
        merge(&mut plan, data.clone(), NOW, options);
        assert!(plan.has_all_action_details(&Uuid::from_u128(0xA1)));
        assert!(!plan.has_all_action_details(&Uuid::from_u128(0xA2)));
        // Below the cut by id but not in the read: ids written in upper
        // case sort apart in the database's text order, so only the rules
        // read count as cached.
        assert!(!plan.has_all_action_details(&Uuid::from_u128(0x01)));
        assert!(
            spec_of(&plan, &fixture.workflow_id)
                .unwrap()
                .steps
                .is_none()
        );

        data.action_details_cut = None;
        merge(&mut plan, data, NOW, options);
        let spec = spec_of(&plan, &fixture.workflow_id).unwrap();
        assert_eq!(
            spec.steps.unwrap().len(),
            0,
            "below the cap the cache is complete"
        );
    }

    #[test]
    fn the_master_wakes_at_the_next_due_time_or_window_opening() {
        let fixture = Fixture::due(NOW + 5_000);
        let plan = fixture.plan();
        assert_eq!(
            next_wake(&plan, NOW, chrono_tz::UTC, &Ownership::All),
            Some(NOW + 5_000)
        );

        // Due now but outside its window: wake when the window opens, not now.
        let mut fixture = Fixture::due(NOW - 1);
        let local = crate::schedule::local_time_of_day(chrono_tz::UTC, millis_to_utc(NOW));
        let opens = crate::schedule::TimeOfDay::new((local.hour() + 2) % 24, 0).unwrap();
        fixture.branch_rule.operation_time_from = Some(opens);
        fixture.branch_rule.operation_time_to =
            Some(crate::schedule::TimeOfDay::new((local.hour() + 3) % 24, 0).unwrap());
        let plan = fixture.plan();
        let wake = next_wake(&plan, NOW, chrono_tz::UTC, &Ownership::All).unwrap();
        assert!(wake > NOW && wake <= NOW + 2 * 3_600_000, "{wake}");
        assert_eq!(
            crate::schedule::local_time_of_day(chrono_tz::UTC, millis_to_utc(wake)),
            opens
        );

        // Running: no wake from the plan's index; the finish will wake it.
        let fixture = Fixture::due(NOW - 1);
        let mut plan = fixture.plan();
        plan.mark_running(&fixture.workflow_id, NOW);
        assert_eq!(next_wake(&plan, NOW, chrono_tz::UTC, &Ownership::All), None);
    }

    #[test]
    fn a_busy_master_wakes_for_the_next_due_rule_or_within_a_second() {
        let plan = Fixture::due(NOW + 300).plan();
        assert_eq!(next_wake_while_busy(&plan, NOW, &Ownership::All), NOW + 300);
        let plan = Fixture::due(NOW + 60_000).plan();
        assert_eq!(
            next_wake_while_busy(&plan, NOW, &Ownership::All),
            NOW + 1_000
        );
    }

    #[test]
    fn a_long_backlog_is_looked_at_again_within_a_second_not_walked_whole() {
        let plan = Fixture::many(NOW - 1, NEXT_WAKE_WALK as u128 + 10);
        assert_eq!(
            next_wake(&plan, NOW, chrono_tz::UTC, &Ownership::All),
            Some(NOW + 1_000)
        );
        let short = Fixture::many(NOW - 1, 10);
        assert_eq!(
            next_wake(&short, NOW, chrono_tz::UTC, &Ownership::All),
            None,
            "ready rules need no wake: the fetch takes them"
        );
    }

    #[test]
    fn a_rule_missed_its_window_when_the_window_opened_and_closed_since_it_was_due() {
        use crate::plan::take_ready_owned;
        use crate::schedule::TimeOfDay;
        use chrono::TimeZone;
        let at = |day: u32, h: u32, mi: u32| {
            chrono::Utc
                .with_ymd_and_hms(2027, 1, day, h, mi, 0)
                .unwrap()
                .timestamp_millis()
        };
        let day = Some((
            TimeOfDay::new(9, 0).unwrap(),
            TimeOfDay::new(17, 0).unwrap(),
        ));
        let night = Some((
            TimeOfDay::new(22, 0).unwrap(),
            TimeOfDay::new(6, 0).unwrap(),
        ));
        let cases = [
            ("no window", None, at(15, 8, 0), at(16, 8, 0), 0),
            (
                "due before the opening, waiting for it",
                day,
                at(15, 8, 0),
                at(15, 8, 30),
                0,
            ),
            (
                "due before, the window came and went",
                day,
                at(15, 8, 0),
                at(15, 18, 0),
                1,
            ),
            (
                "due inside, now ready",
                day,
                at(15, 10, 0),
                at(15, 12, 0),
                0,
            ),
            (
                "due inside, the window closed",
                day,
                at(15, 10, 0),
                at(15, 17, 30),
                1,
            ),
            (
                "due after the close, waiting overnight",
                day,
                at(15, 17, 30),
                at(16, 8, 0),
                0,
            ),
            (
                "due after the close, missed the next day",
                day,
                at(15, 17, 30),
                at(16, 18, 0),
                1,
            ),
            (
                "overnight window, due before it, missed",
                night,
                at(15, 21, 0),
                at(16, 7, 0),
                1,
            ),
            (
                "overnight window, due after it, waiting",
                night,
                at(15, 7, 0),
                at(15, 12, 0),
                0,
            ),
            ("not due yet", day, at(15, 19, 0), at(15, 18, 0), 0),
        ];
        for (name, window, due, now, expected) in cases {
            let mut fixture = Fixture::due(due);
            fixture.branch_rule.operation_time_from = window.map(|w| w.0);
            fixture.branch_rule.operation_time_to = window.map(|w| w.1);
            let plan = fixture.plan();
            assert_eq!(
                missed_windows(&plan, now, chrono_tz::UTC, &Ownership::All),
                expected,
                "{name}"
            );
            // Parked by a fetch, a waiting rule still counts as it did.
            let mut parked = plan.clone();
            take_ready_owned(&mut parked, now, 500, chrono_tz::UTC, &Ownership::All);
            assert_eq!(
                missed_windows(&parked, now, chrono_tz::UTC, &Ownership::All),
                expected,
                "{name}, parked"
            );
        }

        // Only this instance's partition counts; a running rule waits for
        // its finish, not for a window.
        let mut fixture = Fixture::due(at(15, 10, 0));
        fixture.branch_rule.operation_time_from = day.map(|w| w.0);
        fixture.branch_rule.operation_time_to = day.map(|w| w.1);
        let mut plan = fixture.plan();
        let id = fixture.workflow_id;
        let mine = crate::cluster::partition_of(&id, 2);
        let elsewhere = Ownership::Partitions {
            count: 2,
            held: vec![1 - mine],
        };
        assert_eq!(
            missed_windows(&plan, at(15, 18, 0), chrono_tz::UTC, &elsewhere),
            0
        );
        plan.mark_running(&id, at(15, 18, 0));
        assert_eq!(
            missed_windows(&plan, at(15, 18, 0), chrono_tz::UTC, &Ownership::All),
            0
        );
    }
}
