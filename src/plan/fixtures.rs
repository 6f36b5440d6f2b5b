//! A minimal consistent plan for unit tests: one brand, branch, rule and
//! branch rule, each field changeable before building the plan.

use serde_json::json;
use uuid::Uuid;

use super::ExecutionPlan;
use crate::model::*;

#[derive(Clone)]
pub struct Fixture {
    pub brand: Brand,
    pub branch: Branch,
    pub rule: Rule,
    pub branch_rule: BranchRule,
    pub workflow_id: Uuid,
}

impl Fixture {
    /// An active branch rule due at `next_run_time`, every 5 minutes.
    pub fn due(next_run_time: Millis) -> Fixture {
        let brand = Brand {
            id: Uuid::from_u128(0xB1),
            name: "brand".into(),
            settings: json!({}),
            created_at: 0,
            updated_at: 0,
        };
        let branch = Branch {
            id: Uuid::from_u128(0xB2),
            brand_id: brand.id,
            name: "branch".into(),
            timezone: None,
            is_active: true,
            created_at: 0,
            updated_at: 0,
        };
        let rule = Rule {
            id: Uuid::from_u128(0xB3),
            brand_id: Some(brand.id),
            name: "rule".into(),
            status: RuleStatus::Active,
            cron_expression: "*/5 * * * *".into(),
            settings: json!({}),
            policy: None,
            created_at: 0,
            updated_at: 0,
        };
        let branch_rule = branch_rule(Uuid::from_u128(0xB4), branch.id, rule.id, next_run_time);
        Fixture {
            workflow_id: branch_rule.id,
            brand,
            branch,
            rule,
            branch_rule,
        }
    }

    pub fn data(&self) -> PlanData {
        PlanData {
            brands: vec![self.brand.clone()],
            branches: vec![self.branch.clone()],
            rules: vec![self.rule.clone()],
            branch_rules: vec![self.branch_rule.clone()],
            ..PlanData::default()
        }
    }

    pub fn plan(&self) -> ExecutionPlan {
        ExecutionPlan::from_data(self.data())
    }

    /// A plan of `count` branch rules of the fixture's branch and rule, all
    /// due at `next_run_time`.
    pub fn many(next_run_time: Millis, count: u128) -> ExecutionPlan {
        let fixture = Fixture::due(next_run_time);
        let mut data = fixture.data();
        data.branch_rules = (0..count)
            .map(|i| {
                let id = Uuid::from_u128(0xC000 + i);
                branch_rule(id, fixture.branch.id, fixture.rule.id, next_run_time)
            })
            .collect();
        ExecutionPlan::from_data(data)
    }
}

pub fn branch_rule(id: Uuid, branch_id: Uuid, rule_id: Uuid, next_run_time: Millis) -> BranchRule {
    BranchRule {
        id,
        branch_id,
        rule_id,
        brand_rule_id: None,
        is_active: true,
        is_archived: false,
        is_force_stopped: false,
        is_currently_running: false,
        operation_time_from: None,
        operation_time_to: None,
        next_run_time: Some(next_run_time),
        last_run_time: None,
        lock_holder: None,
        lock_time: None,
        lock_epoch: 0,
        params: serde_json::Value::Null,
        policy: None,
        retry_of: None,
        failed_attempts: 0,
        created_at: 0,
        updated_at: 0,
    }
}

/// An outbox entry: a failure kept while the database was away.
pub fn outbox_entry(execution_id: Uuid) -> crate::plan::OutboxEntry {
    crate::plan::OutboxEntry {
        fence: crate::lifecycle::Fence {
            execution_id,
            branch_rule_id: Uuid::from_u128(1),
            holder: "here".into(),
            epoch: 1,
        },
        finish: crate::lifecycle::Finish::leaving_due(
            crate::model::ExecutionStatus::Failed,
            5,
            "database down".into(),
        ),
        added_at: 5,
    }
}
