//! `ruled demo`: example brands, branches in three time zones, rules,
//! action templates and branch rules, so a fresh install has something to
//! run. Fixed ids make it idempotent: a second run adds nothing.

use serde_json::json;
use tracing::info;
use uuid::Uuid;

use super::CommandError;
use crate::clock::millis_to_utc;
use crate::model::*;
use crate::schedule::{CronSchedule, TimeOfDay, parse_timezone};
use crate::store::{Store, StoreError};

/// What a demo load inserted; zero everywhere on a second run.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DemoReport {
    pub inserted: usize,
    pub already_present: usize,
}

const BRAND: u128 = 0xde30_0000_0000_4000_8000_0000_0000_0001;

fn demo_id(kind: u128, index: u128) -> Uuid {
    // Version-4 shaped ids in a recognisable range: `de30…`.
    Uuid::from_u128(BRAND + (kind << 16) + index)
}

const BRANCHES: [(&str, &str); 3] = [
    ("Riyadh Olaya", "Asia/Riyadh"),
    ("New York SoHo", "America/New_York"),
    ("Sydney CBD", "Australia/Sydney"),
];

/// A daily operation window, `HH:MM` to `HH:MM`.
type DemoWindow = Option<(&'static str, &'static str)>;

/// (name, cron, window)
const RULES: [(&str, &str, DemoWindow); 3] = [
    ("Heartbeat every minute", "* * * * *", None),
    (
        "Restock check, business hours",
        "*/15 * * * *",
        Some(("09:00", "17:00")),
    ),
    ("Nightly close-out", "30 2 * * *", Some(("22:00", "06:00"))),
];

/// The demo rows, as a plan would hold them, with every branch rule due at
/// `now`: what `load_demo` inserts and `ruled simulate --demo` runs.
pub fn demo_data(now: Millis) -> Result<PlanData, CommandError> {
    let mut data = PlanData::default();
    let brand = Brand {
        id: demo_id(0, 0),
        name: "Demo Coffee Co.".into(),
        settings: json!({"demo": true}),
        created_at: now,
        updated_at: now,
    };
    let noop = ActionTemplate {
        id: demo_id(1, 0),
        name: "No-op".into(),
        kind: "noop".into(),
        config: json!({}),
        created_at: now,
        updated_at: now,
    };
    let pause = ActionTemplate {
        id: demo_id(1, 1),
        name: "Short pause".into(),
        kind: "sleep".into(),
        config: json!({"ms": 200}),
        created_at: now,
        updated_at: now,
    };
    for (index, (name, cron, _)) in RULES.iter().enumerate() {
        // A demo rule with a broken expression would be a bug here.
        CronSchedule::parse(cron)?;
        data.rules.push(Rule {
            id: demo_id(2, index as u128),
            brand_id: Some(brand.id),
            name: name.to_string(),
            status: RuleStatus::Active,
            cron_expression: cron.to_string(),
            settings: json!({}),
            policy: None,
            created_at: now,
            updated_at: now,
        });
    }
    for (b, (name, zone_name)) in BRANCHES.iter().enumerate() {
        parse_timezone(zone_name)?;
        let branch = Branch {
            id: demo_id(3, b as u128),
            brand_id: brand.id,
            name: name.to_string(),
            timezone: Some(zone_name.to_string()),
            is_active: true,
            created_at: now,
            updated_at: now,
        };
        for (r, (rule, (_, _, window))) in data.rules.iter().zip(RULES.iter()).enumerate() {
            let parse = |t: &str| t.parse::<TimeOfDay>();
            let branch_rule = BranchRule {
                id: demo_id(4, (b * 16 + r) as u128),
                branch_id: branch.id,
                rule_id: rule.id,
                brand_rule_id: None,
                is_active: true,
                is_archived: false,
                is_force_stopped: false,
                is_currently_running: false,
                operation_time_from: window.map(|(from, _)| parse(from)).transpose()?,
                operation_time_to: window.map(|(_, to)| parse(to)).transpose()?,
                // Due at once, so a fresh install shows work right away;
                // after the first run the cron expression takes over.
                next_run_time: Some(now),
                last_run_time: None,
                lock_holder: None,
                lock_time: None,
                lock_epoch: 0,
                params: json!({"branch": name}),
                policy: None,
                retry_of: None,
                failed_attempts: 0,
                created_at: now,
                updated_at: now,
            };
            let steps = [(noop.id, json!({})), (pause.id, json!({"ms": 50}))];
            for (position, (template_id, params)) in steps.into_iter().enumerate() {
                data.action_details.push(ActionDetail {
                    id: demo_id(5, (b * 256 + r * 16 + position) as u128),
                    branch_rule_id: branch_rule.id,
                    action_template_id: template_id,
                    position: position as i32,
                    params,
                    created_at: now,
                    updated_at: now,
                });
            }
            data.branch_rules.push(branch_rule);
        }
        data.branches.push(branch);
    }
    data.brands.push(brand);
    data.action_templates = vec![noop, pause];
    Ok(data)
}

pub async fn load_demo(store: &Store, now: Millis) -> Result<DemoReport, CommandError> {
    let mut report = DemoReport::default();
    let data = demo_data(now)?;
    for brand in &data.brands {
        record(&mut report, store.insert_brand(brand).await)?;
    }
    for template in &data.action_templates {
        record(&mut report, store.insert_action_template(template).await)?;
    }
    for rule in &data.rules {
        record(&mut report, store.insert_rule(rule).await)?;
    }
    for branch in &data.branches {
        record(&mut report, store.insert_branch(branch).await)?;
    }
    for branch_rule in &data.branch_rules {
        record(&mut report, store.insert_branch_rule(branch_rule).await)?;
    }
    for detail in &data.action_details {
        record(&mut report, store.insert_action_detail(detail).await)?;
    }
    info!(
        inserted = report.inserted,
        already_present = report.already_present,
        "🧪 Demo data loaded at {}",
        millis_to_utc(now).to_rfc3339()
    );
    Ok(report)
}

/// A row that is already there is the idempotent case, not an error.
fn record(report: &mut DemoReport, result: Result<(), StoreError>) -> Result<(), CommandError> {
    match result {
        Ok(()) => report.inserted += 1,
        Err(e) if e.is_unique_violation() => report.already_present += 1,
        Err(e) => return Err(e.into()),
    }
    Ok(())
}
