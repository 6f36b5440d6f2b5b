//! Seeding and settings shared by the benches.
//!
//! Every bench binary compiles its own copy of this module and uses only
//! part of it, so the parts one of them leaves out are not dead code.
#![allow(dead_code)]

use ruled::model::*;
use ruled::store::Store;
use serde_json::json;
use uuid::Uuid;

mod settings;

pub use settings::{env_or, wall_ms};

/// One brand, branch, rule on `cron` and template of `kind`; `due.len()`
/// branch rules with one action each, written in multi-row statements.
pub async fn seed(store: &Store, due: &[Millis], cron: &str, kind: &str) -> Vec<Uuid> {
    let now = wall_ms();
    let (brand, branch, rule, template) = (
        Uuid::new_v4(),
        Uuid::new_v4(),
        Uuid::new_v4(),
        Uuid::new_v4(),
    );
    store
        .insert_brand(&Brand {
            id: brand,
            name: "bench".into(),
            settings: json!({}),
            created_at: now,
            updated_at: now,
        })
        .await
        .unwrap();
    store
        .insert_branch(&Branch {
            id: branch,
            brand_id: brand,
            name: "bench".into(),
            timezone: Some("UTC".into()),
            is_active: true,
            created_at: now,
            updated_at: now,
        })
        .await
        .unwrap();
    store
        .insert_rule(&Rule {
            id: rule,
            brand_id: Some(brand),
            name: "bench".into(),
            status: RuleStatus::Active,
            cron_expression: cron.into(),
            settings: json!({}),
            policy: None,
            created_at: now,
            updated_at: now,
        })
        .await
        .unwrap();
    store
        .insert_action_template(&ActionTemplate {
            id: template,
            name: kind.into(),
            kind: kind.into(),
            config: json!({}),
            created_at: now,
            updated_at: now,
        })
        .await
        .unwrap();
    let ids: Vec<Uuid> = due.iter().map(|_| Uuid::new_v4()).collect();
    for (chunk_ids, chunk_due) in ids.chunks(500).zip(due.chunks(500)) {
        let rules: Vec<String> = chunk_ids
            .iter()
            .zip(chunk_due)
            .map(|(id, at)| {
                format!("('{id}', '{branch}', '{rule}', TRUE, FALSE, FALSE, FALSE, {at}, 0, '{{}}', {now}, {now})")
            })
            .collect();
        store
            .execute_sql(&format!(
                "INSERT INTO branch_rules (id, branch_id, rule_id, is_active, is_archived, is_force_stopped, \
                 is_currently_running, next_run_time, lock_epoch, params, created_at, updated_at) VALUES {}",
                rules.join(", ")
            ))
            .await
            .unwrap();
        let details: Vec<String> = chunk_ids
            .iter()
            .map(|id| {
                format!(
                    "('{}', '{id}', '{template}', 0, '{{}}', {now}, {now})",
                    Uuid::new_v4()
                )
            })
            .collect();
        store
            .execute_sql(&format!(
                "INSERT INTO action_details (id, branch_rule_id, action_template_id, position, params, created_at, updated_at) VALUES {}",
                details.join(", ")
            ))
            .await
            .unwrap();
    }
    ids
}
