//! Computing a workflow's next run from its cron expression and zone, used
//! when the database cannot be updated after a job (seed 000 "Local
//! next_run_time calculation").

use chrono_tz::Tz;
use uuid::Uuid;

use super::quarantine::{BRANCHES, BRAND_RULES, RULES, quarantined_error};
use super::resolve::{ResolveError, ScheduleParts, next_run, resolve_schedule};
use super::{ExecutionPlan, Workflow};
use crate::model::Millis;
use crate::schedule::{CronSchedule, ScheduleCache};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    #[error("workflow {0} is not in the plan")]
    UnknownWorkflow(Uuid),
    #[error("workflow {workflow_id}: {source}")]
    Schedule {
        workflow_id: Uuid,
        source: ResolveError,
    },
}

impl PlanError {
    /// The schedule problem, when that is what this is.
    pub fn schedule_error(&self) -> Option<&ResolveError> {
        match self {
            PlanError::Schedule { source, .. } => Some(source),
            PlanError::UnknownWorkflow(_) => None,
        }
    }
}

impl ExecutionPlan {
    /// What the workflow's schedule is made of, from the plan's tables. A
    /// row it depends on that is quarantined is an error carrying the
    /// quarantine's reason; a brand rule that sets no expression leaves the
    /// rule's in force.
    pub fn schedule_parts<'p>(
        &'p self,
        workflow: &Workflow,
    ) -> Result<ScheduleParts<'p>, ResolveError> {
        let row = &workflow.branch_rule;
        let branch = match self.branch(&row.branch_id) {
            Some(branch) => (branch.id, branch.timezone.as_deref()),
            None => {
                return Err(self.quarantine.get(BRANCHES, &row.branch_id).map_or(
                    ResolveError::Missing {
                        table: "branch",
                        id: row.branch_id,
                    },
                    quarantined_error,
                ));
            }
        };
        if self.rule(&row.rule_id).is_none()
            && let Some(quarantined) = self.quarantine.get(RULES, &row.rule_id)
        {
            return Err(quarantined_error(quarantined));
        }
        let rule = (
            row.rule_id,
            self.rule(&row.rule_id).map(|r| r.cron_expression.as_str()),
        );
        let mut brand_rule = None;
        if let Some(id) = row.brand_rule_id {
            if let Some(quarantined) = self.quarantine.get(BRAND_RULES, &id) {
                return Err(quarantined_error(quarantined));
            }
            brand_rule = self
                .brand_rule(&id)
                .and_then(|b| b.cron_expression.as_deref())
                .map(|expression| (id, expression));
        }
        Ok(ScheduleParts {
            branch,
            rule,
            brand_rule,
        })
    }
}

fn parts_of<'p>(
    plan: &'p ExecutionPlan,
    workflow_id: &Uuid,
) -> Result<ScheduleParts<'p>, PlanError> {
    let workflow = plan
        .get(workflow_id)
        .ok_or(PlanError::UnknownWorkflow(*workflow_id))?;
    plan.schedule_parts(workflow)
        .map_err(|source| PlanError::Schedule {
            workflow_id: *workflow_id,
            source,
        })
}

/// The cron expression and zone a workflow runs on, by the one resolver.
pub fn schedule_of(
    plan: &ExecutionPlan,
    workflow_id: &Uuid,
    default_zone: Tz,
    schedules: &mut ScheduleCache,
) -> Result<(CronSchedule, Tz), PlanError> {
    let parts = parts_of(plan, workflow_id)?;
    resolve_schedule(&parts, default_zone, schedules).map_err(|source| PlanError::Schedule {
        workflow_id: *workflow_id,
        source,
    })
}

/// The next occurrence strictly after `after`, always recomputed from the
/// expression in the branch's zone (never by adding 24 h, which DST breaks).
pub fn local_next_run_time(
    plan: &ExecutionPlan,
    workflow_id: &Uuid,
    after: Millis,
    default_zone: Tz,
    schedules: &mut ScheduleCache,
) -> Result<Millis, PlanError> {
    let parts = parts_of(plan, workflow_id)?;
    next_run(&parts, default_zone, after, schedules).map_err(|source| PlanError::Schedule {
        workflow_id: *workflow_id,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::BrandRule;
    use crate::plan::fixtures::Fixture;
    use chrono::{TimeZone, Utc};
    use serde_json::json;

    fn utc_ms(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> Millis {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0)
            .unwrap()
            .timestamp_millis()
    }

    #[test]
    fn uses_the_rule_expression_in_the_default_zone() {
        let mut fixture = Fixture::due(0);
        fixture.rule.cron_expression = "30 2 * * *".into();
        let plan = fixture.plan();
        // 02:30 in Riyadh (UTC+3) is 23:30 UTC the day before.
        let next = local_next_run_time(
            &plan,
            &fixture.workflow_id,
            utc_ms(2026, 6, 1, 0, 0),
            chrono_tz::Asia::Riyadh,
            &mut ScheduleCache::default(),
        );
        assert_eq!(next, Ok(utc_ms(2026, 6, 1, 23, 30)));
    }

    #[test]
    fn the_brand_rule_expression_and_branch_zone_win() {
        let mut fixture = Fixture::due(0);
        fixture.branch.timezone = Some("America/New_York".into());
        let brand_rule = BrandRule {
            id: Uuid::from_u128(0xBB),
            brand_id: fixture.brand.id,
            rule_id: fixture.rule.id,
            settings: json!({}),
            cron_expression: Some("0 9 * * *".into()),
            created_at: 0,
            updated_at: 0,
        };
        fixture.branch_rule.brand_rule_id = Some(brand_rule.id);
        let mut data = fixture.data();
        data.brand_rules.push(brand_rule);
        let plan = ExecutionPlan::from_data(data);
        let next = local_next_run_time(
            &plan,
            &fixture.workflow_id,
            utc_ms(2026, 6, 1, 0, 0),
            chrono_tz::Asia::Riyadh,
            &mut ScheduleCache::default(),
        );
        // 09:00 EDT is 13:00 UTC.
        assert_eq!(next, Ok(utc_ms(2026, 6, 1, 13, 0)));
    }

    #[test]
    fn errors_name_the_workflow() {
        let mut fixture = Fixture::due(0);
        fixture.rule.cron_expression = "61 * * * *".into();
        // Straight into the plan: a refresh would have quarantined the rule.
        let plan = fixture.plan();
        let err = local_next_run_time(
            &plan,
            &fixture.workflow_id,
            0,
            chrono_tz::UTC,
            &mut ScheduleCache::default(),
        )
        .unwrap_err();
        assert!(matches!(
            err,
            PlanError::Schedule {
                source: ResolveError::InvalidCron { .. },
                ..
            }
        ));
        assert!(err.to_string().contains(&fixture.workflow_id.to_string()));
        let unknown = Uuid::from_u128(7);
        assert_eq!(
            local_next_run_time(
                &plan,
                &unknown,
                0,
                chrono_tz::UTC,
                &mut ScheduleCache::default()
            ),
            Err(PlanError::UnknownWorkflow(unknown))
        );
    }

    #[test]
    fn a_quarantined_branch_gives_its_reason_as_the_error() {
        let mut fixture = Fixture::due(0);
        fixture.branch.timezone = Some("Mars/Olympus".into());
        let plan = ExecutionPlan::from_load(crate::model::PlanLoad {
            data: fixture.data(),
            rejected: vec![],
        });
        let err = local_next_run_time(
            &plan,
            &fixture.workflow_id,
            0,
            chrono_tz::UTC,
            &mut ScheduleCache::default(),
        )
        .unwrap_err();
        let source = err.schedule_error().unwrap();
        assert_eq!(
            source.to_string(),
            format!(
                "invalid time zone \"Mars/Olympus\" on branch {}",
                fixture.branch.id
            )
        );
        assert_eq!(
            source.reject_reason(),
            Some(crate::model::RejectReason::Zone)
        );
    }
}
