//! Computing a workflow's next run from its cron expression and zone, used
//! when the database cannot be updated after a job (seed 000 "Local
//! next_run_time calculation").

use chrono_tz::Tz;
use uuid::Uuid;

use super::ExecutionPlan;
use crate::model::Millis;
use crate::schedule::{CronSchedule, ScheduleCache, ScheduleError, next_after_millis};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    #[error("workflow {0} is not in the plan")]
    UnknownWorkflow(Uuid),
    #[error("rule {rule_id} of workflow {workflow_id} is not in the plan")]
    MissingRule { workflow_id: Uuid, rule_id: Uuid },
    #[error("workflow {workflow_id}: {reason}")]
    InvalidZone { workflow_id: Uuid, reason: String },
    #[error("workflow {workflow_id}: {source}")]
    Schedule {
        workflow_id: Uuid,
        source: ScheduleError,
    },
}

/// The cron expression and zone a workflow runs on: the brand rule's
/// expression overrides the rule's; the branch's zone overrides the default.
pub fn schedule_of(
    plan: &ExecutionPlan,
    workflow_id: &Uuid,
    default_zone: Tz,
    schedules: &mut ScheduleCache,
) -> Result<(CronSchedule, Tz), PlanError> {
    let workflow = plan
        .get(workflow_id)
        .ok_or(PlanError::UnknownWorkflow(*workflow_id))?;
    let row = &workflow.branch_rule;
    let rule = plan.rule(&row.rule_id).ok_or(PlanError::MissingRule {
        workflow_id: *workflow_id,
        rule_id: row.rule_id,
    })?;
    let expression = row
        .brand_rule_id
        .and_then(|id| plan.brand_rule(&id))
        .and_then(|brand_rule| brand_rule.cron_expression.as_deref())
        .unwrap_or(&rule.cron_expression);
    let zone = plan
        .zone_of(workflow, default_zone)
        .map_err(|reason| PlanError::InvalidZone {
            workflow_id: *workflow_id,
            reason: reason.to_string(),
        })?;
    let schedule = schedules
        .parse(expression)
        .map_err(|source| PlanError::Schedule {
            workflow_id: *workflow_id,
            source,
        })?;
    Ok((schedule, zone))
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
    let (schedule, zone) = schedule_of(plan, workflow_id, default_zone, schedules)?;
    next_after_millis(&schedule, zone, after).map_err(|source| PlanError::Schedule {
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
        let plan = fixture.plan();
        let err = local_next_run_time(
            &plan,
            &fixture.workflow_id,
            0,
            chrono_tz::UTC,
            &mut ScheduleCache::default(),
        )
        .unwrap_err();
        assert!(matches!(err, PlanError::Schedule { .. }));
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
}
