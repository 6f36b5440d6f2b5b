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
    insert_rule_with(store, cron, next_run_time, steps, &RuleOptions::default()).await
}

/// A cron expression that fires once a year: after its first run a test
/// rule is not due again while the test lasts.
pub const YEARLY: &str = "0 0 1 1 *";

/// When [`YEARLY`] fires next in UTC after `at`: midnight of the next
/// 1 January. Tests compute it rather than write the year down.
pub fn yearly_after(at: Millis) -> Millis {
    use chrono::{Datelike, TimeZone, Utc};
    let year = Utc.timestamp_millis_opt(at).unwrap().year() + 1;
    Utc.with_ymd_and_hms(year, 1, 1, 0, 0, 0)
        .unwrap()
        .timestamp_millis()
}

/// What [`insert_rule_with`] sets beyond [`insert_rule`]'s defaults.
#[derive(Clone, Default)]
pub struct RuleOptions {
    /// The branch's IANA zone; `None` is UTC.
    pub timezone: Option<String>,
    /// The operation window, `("HH:MM", "HH:MM")` in the branch's zone.
    pub window: Option<(String, String)>,
    /// The rule's policy (the defaults of its branch rules).
    pub rule_policy: Option<ruled::schedule::Policy>,
    /// The branch rule's own policy (overrides the rule's, field by field).
    pub policy: Option<ruled::schedule::Policy>,
    /// created_at / updated_at of the rows: the service's clock when it runs
    /// on a clock of its own (`Clock::starting_at`); `None` is the wall
    /// clock.
    pub now: Option<Millis>,
}

/// A policy from its JSON form, as the API takes it.
pub fn policy(value: Value) -> ruled::schedule::Policy {
    serde_json::from_value(value).expect("a valid policy")
}

/// [`insert_rule`] with a zone, a window and policies.
pub async fn insert_rule_with(
    store: &Store,
    cron: &str,
    next_run_time: Millis,
    steps: &[Step],
    options: &RuleOptions,
) -> Uuid {
    let now = options
        .now
        .unwrap_or_else(|| chrono::Utc::now().timestamp_millis());
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
        timezone: Some(options.timezone.clone().unwrap_or_else(|| "UTC".into())),
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
        policy: options.rule_policy.clone(),
        created_at: now,
        updated_at: now,
    };
    store.insert_rule(&rule).await.unwrap();
    let (from, to) = match &options.window {
        Some((from, to)) => (Some(from.parse().unwrap()), Some(to.parse().unwrap())),
        None => (None, None),
    };
    let branch_rule = BranchRule {
        id: Uuid::new_v4(),
        branch_id: branch.id,
        rule_id: rule.id,
        brand_rule_id: None,
        // Activated once its actions are in, as in `insert_rule`.
        is_active: false,
        is_archived: false,
        is_force_stopped: false,
        is_currently_running: false,
        operation_time_from: from,
        operation_time_to: to,
        next_run_time: Some(next_run_time),
        last_run_time: None,
        lock_holder: None,
        lock_time: None,
        lock_epoch: 0,
        params: json!({}),
        policy: options.policy.clone(),
        retry_of: None,
        failed_attempts: 0,
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
    // updated_at moves (on the rows' clock), so the database's touch
    // trigger leaves it alone.
    store
        .execute_sql(&format!(
            "UPDATE branch_rules SET is_active = TRUE, updated_at = {} WHERE id = '{id}'",
            now + 1
        ))
        .await
        .unwrap();
    id
}

/// `count` branch rules of one rule on `cron` (policy `rule_policy`), in
/// one UTC branch, all first due at `next_run_time`, each with one action
/// of `step`: written in a few multi-row statements, since one
/// [`insert_rule`] per rule is too slow for thousands. Returns their ids.
pub async fn insert_many_rules(
    store: &Store,
    count: usize,
    cron: &str,
    next_run_time: Millis,
    step: &Step,
    rule_policy: Option<ruled::schedule::Policy>,
) -> Vec<Uuid> {
    let now = chrono::Utc::now().timestamp_millis();
    let brand = Brand {
        id: Uuid::new_v4(),
        name: "bulk brand".into(),
        settings: json!({}),
        created_at: now,
        updated_at: now,
    };
    store.insert_brand(&brand).await.unwrap();
    let branch = Branch {
        id: Uuid::new_v4(),
        brand_id: brand.id,
        name: "bulk branch".into(),
        timezone: Some("UTC".into()),
        is_active: true,
        created_at: now,
        updated_at: now,
    };
    store.insert_branch(&branch).await.unwrap();
    let rule = Rule {
        id: Uuid::new_v4(),
        brand_id: Some(brand.id),
        name: "bulk rule".into(),
        status: RuleStatus::Active,
        cron_expression: cron.into(),
        settings: json!({}),
        policy: rule_policy,
        created_at: now,
        updated_at: now,
    };
    store.insert_rule(&rule).await.unwrap();
    let template = ActionTemplate {
        id: Uuid::new_v4(),
        name: format!("{} step", step.kind),
        kind: step.kind.into(),
        config: step.config.clone(),
        created_at: now,
        updated_at: now,
    };
    store.insert_action_template(&template).await.unwrap();
    let ids: Vec<Uuid> = (0..count).map(|_| Uuid::new_v4()).collect();
    for chunk in ids.chunks(500) {
        // Inactive until their actions are in, as in `insert_rule`.
        let rules: Vec<String> = chunk
            .iter()
            .map(|id| {
                format!(
                    "('{id}', '{}', '{}', FALSE, {next_run_time}, {now}, {now})",
                    branch.id, rule.id
                )
            })
            .collect();
        store
            .execute_sql(&format!(
                "INSERT INTO branch_rules (id, branch_id, rule_id, is_active, next_run_time, \
                 created_at, updated_at) VALUES {}",
                rules.join(", ")
            ))
            .await
            .unwrap();
        let details: Vec<String> = chunk
            .iter()
            .map(|id| {
                format!(
                    "('{}', '{id}', '{}', 0, {now}, {now})",
                    Uuid::new_v4(),
                    template.id
                )
            })
            .collect();
        store
            .execute_sql(&format!(
                "INSERT INTO action_details (id, branch_rule_id, action_template_id, position, \
                 created_at, updated_at) VALUES {}",
                details.join(", ")
            ))
            .await
            .unwrap();
    }
    store
        .execute_sql(&format!(
            "UPDATE branch_rules SET is_active = TRUE, updated_at = {} WHERE rule_id = '{}'",
            now + 1,
            rule.id
        ))
        .await
        .unwrap();
    ids
}
