//! Rules for engine tests, written through the store the way `ruled demo`
//! and the API write them.

use ruled::model::*;
use ruled::store::Store;
use serde_json::{Value, json};
use uuid::Uuid;

/// One action of a test rule: a template kind, its config, the detail's params.
pub struct Step {
    pub kind: &'static str,
    pub config: Value,
}

pub fn step(kind: &'static str, config: Value) -> Step {
    Step { kind, config }
}

/// A branch (in `timezone`) with one active rule on `cron`, first due at
/// `next_run_time`, running `steps` in order. Returns the branch rule id.
pub async fn insert_rule(store: &Store, cron: &str, next_run_time: Millis, steps: &[Step]) -> Uuid {
    let now = chrono::Utc::now().timestamp_millis();
    let brand = Brand {
        id: Uuid::new_v4(),
        name: "test brand".into(),
        settings: json!({}),
        created_at: now,
        updated_at: now,
    };
    store.insert_brand(&brand).await.unwrap();
    let branch = Branch {
        id: Uuid::new_v4(),
        brand_id: brand.id,
        name: "test branch".into(),
        timezone: Some("UTC".into()),
        is_active: true,
        created_at: now,
        updated_at: now,
    };
    store.insert_branch(&branch).await.unwrap();
    let rule = Rule {
        id: Uuid::new_v4(),
        brand_id: Some(brand.id),
        name: "test rule".into(),
        status: RuleStatus::Active,
        cron_expression: cron.into(),
        settings: json!({}),
        created_at: now,
        updated_at: now,
    };
    store.insert_rule(&rule).await.unwrap();
    let branch_rule = BranchRule {
        id: Uuid::new_v4(),
        branch_id: branch.id,
        rule_id: rule.id,
        brand_rule_id: None,
        // Activated once its actions are in: a due rule seen by a refresh
        // before its actions exist would run with none.
        is_active: false,
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
        params: json!({}),
        created_at: now,
        updated_at: now,
    };
    store.insert_branch_rule(&branch_rule).await.unwrap();
    for (position, step) in steps.iter().enumerate() {
        let template = ActionTemplate {
            id: Uuid::new_v4(),
            name: format!("{} step", step.kind),
            kind: step.kind.into(),
            config: step.config.clone(),
            created_at: now,
            updated_at: now,
        };
        store.insert_action_template(&template).await.unwrap();
        let detail = ActionDetail {
            id: Uuid::new_v4(),
            branch_rule_id: branch_rule.id,
            action_template_id: template.id,
            position: position as i32,
            params: json!({}),
            created_at: now,
            updated_at: now,
        };
        store.insert_action_detail(&detail).await.unwrap();
    }
    let id = branch_rule.id;
    store
        .execute_sql(&format!(
            "UPDATE branch_rules SET is_active = TRUE WHERE id = '{id}'"
        ))
        .await
        .unwrap();
    id
}

/// A cron expression that fires once a year: after its first run a test
/// rule is not due again while the test lasts.
pub const YEARLY: &str = "0 0 1 1 *";
