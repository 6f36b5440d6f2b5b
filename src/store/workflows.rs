//! branch_rules and action_details.

use std::collections::HashMap;

use super::binds::{Bind, placeholder_list};
use super::catalog::decode_action_template;
use super::decode::{
    AnyRow, RowReader, id_text, json_text, opt_id_text, opt_time_text, policy_text,
};
use super::executions::branch_rule_columns;
use super::{Store, StoreError};
use crate::model::{ActionDetail, ActionTemplate, BranchRule};
use uuid::Uuid;

// ---- branch_rules ----------------------------------------------------------

const INSERT_BRANCH_RULE: &str = concat!(
    "INSERT INTO branch_rules (",
    branch_rule_columns!(),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, \
     $17, $18, $19, $20, $21)"
);

pub(super) const SELECT_BRANCH_RULES: &str = concat!(
    "SELECT ",
    branch_rule_columns!(),
    " FROM branch_rules ORDER BY id"
);

pub(super) const SELECT_BRANCH_RULES_CHANGED_SINCE: &str = concat!(
    "SELECT ",
    branch_rule_columns!(),
    " FROM branch_rules WHERE updated_at >= $1 ORDER BY id"
);

pub(super) const COUNT_BRANCH_RULES: &str = "SELECT COUNT(*) FROM branch_rules";

pub(super) fn decode_branch_rule(row: &impl AnyRow) -> Result<BranchRule, StoreError> {
    let r = RowReader::new(row, "branch_rules")?;
    Ok(BranchRule {
        id: r.uuid("id")?,
        branch_id: r.uuid("branch_id")?,
        rule_id: r.uuid("rule_id")?,
        brand_rule_id: r.opt_uuid("brand_rule_id")?,
        is_active: r.bool("is_active")?,
        is_archived: r.bool("is_archived")?,
        is_force_stopped: r.bool("is_force_stopped")?,
        is_currently_running: r.bool("is_currently_running")?,
        operation_time_from: r.opt_time_of_day("operation_time_from")?,
        operation_time_to: r.opt_time_of_day("operation_time_to")?,
        next_run_time: r.opt_i64("next_run_time")?,
        last_run_time: r.opt_i64("last_run_time")?,
        lock_holder: r.opt_text("lock_holder")?,
        lock_time: r.opt_i64("lock_time")?,
        lock_epoch: r.i64("lock_epoch")?,
        params: r.json("params")?,
        policy: r.policy("policy")?,
        retry_of: r.opt_i64("retry_of")?,
        failed_attempts: r.i32("failed_attempts")?,
        created_at: r.i64("created_at")?,
        updated_at: r.i64("updated_at")?,
    })
}

// ---- action_details --------------------------------------------------------

const INSERT_ACTION_DETAIL: &str = "\
INSERT INTO action_details (id, branch_rule_id, action_template_id, position, params, created_at, updated_at) \
VALUES ($1, $2, $3, $4, $5, $6, $7)";

/// `$1` is the cap. `id` breaks ties between equal positions so the cut is
/// the same on every refresh.
pub(super) const SELECT_ACTION_DETAILS_CAPPED: &str = "\
SELECT id, branch_rule_id, action_template_id, position, params, created_at, updated_at \
FROM action_details ORDER BY branch_rule_id, position, id LIMIT $1";

/// The action details of the branch rules named by `{ids}` (`$1, $2, …`),
/// each rule's in position order.
const SELECT_ACTION_DETAILS_OF_RULES: &str = "\
SELECT id, branch_rule_id, action_template_id, position, params, created_at, updated_at \
FROM action_details WHERE branch_rule_id IN ({ids}) ORDER BY branch_rule_id, position, id";

/// The templates those details use.
const SELECT_ACTION_TEMPLATES_OF_RULES: &str = "\
SELECT id, name, kind, config, created_at, updated_at FROM action_templates \
WHERE id IN (SELECT action_template_id FROM action_details WHERE branch_rule_id IN ({ids}))";

/// Branch rules named by one read of [`Store::action_steps_of`]: each is a
/// bound parameter, and SQLite allows 32,766 of them.
const ACTION_STEPS_READ_CHUNK: usize = 500;

/// A branch rule's action steps: its details in position order, each with
/// its template (`None` if it is missing).
pub type ActionSteps = Vec<(ActionDetail, Option<ActionTemplate>)>;

pub(super) fn decode_action_detail(row: &impl AnyRow) -> Result<ActionDetail, StoreError> {
    let r = RowReader::new(row, "action_details")?;
    Ok(ActionDetail {
        id: r.uuid("id")?,
        branch_rule_id: r.uuid("branch_rule_id")?,
        action_template_id: r.uuid("action_template_id")?,
        position: r.i32("position")?,
        params: r.json("params")?,
        created_at: r.i64("created_at")?,
        updated_at: r.i64("updated_at")?,
    })
}

impl Store {
    pub async fn insert_branch_rule(&self, rule: &BranchRule) -> Result<(), StoreError> {
        execute!(
            self,
            "insert branch_rule",
            INSERT_BRANCH_RULE,
            id_text(rule.id),
            id_text(rule.branch_id),
            id_text(rule.rule_id),
            opt_id_text(rule.brand_rule_id),
            rule.is_active,
            rule.is_archived,
            rule.is_force_stopped,
            rule.is_currently_running,
            opt_time_text(rule.operation_time_from),
            opt_time_text(rule.operation_time_to),
            rule.next_run_time,
            rule.last_run_time,
            rule.lock_holder.as_deref(),
            rule.lock_time,
            rule.lock_epoch,
            json_text(&rule.params),
            policy_text(rule.policy.as_ref()),
            rule.retry_of,
            rule.failed_attempts,
            rule.created_at,
            rule.updated_at,
        )
        .map(drop)
    }

    pub async fn insert_action_detail(&self, detail: &ActionDetail) -> Result<(), StoreError> {
        execute!(
            self,
            "insert action_detail",
            INSERT_ACTION_DETAIL,
            id_text(detail.id),
            id_text(detail.branch_rule_id),
            id_text(detail.action_template_id),
            detail.position,
            json_text(&detail.params),
            detail.created_at,
            detail.updated_at,
        )
        .map(drop)
    }

    /// A branch rule's action steps: what a worker runs when the plan's
    /// capped cache does not hold the rule's details and the master's read
    /// for its batch did not bring them.
    pub async fn action_steps(&self, branch_rule_id: Uuid) -> Result<ActionSteps, StoreError> {
        let mut steps = self.action_steps_of(&[branch_rule_id]).await?;
        Ok(steps.remove(&branch_rule_id).unwrap_or_default())
    }

    /// [`Store::action_steps`] of many branch rules in two statements per
    /// 500 rules instead of two per rule: the master reads them for a
    /// claimed batch past the plan's cache at once, so a burst larger than
    /// PLAN_ACTION_DETAILS_CAP does not cost every job two reads of its
    /// own. Every id asked for is in the answer (a rule without details
    /// has no steps).
    pub async fn action_steps_of(
        &self,
        branch_rule_ids: &[Uuid],
    ) -> Result<HashMap<Uuid, ActionSteps>, StoreError> {
        let mut steps: HashMap<Uuid, ActionSteps> =
            branch_rule_ids.iter().map(|id| (*id, Vec::new())).collect();
        for chunk in branch_rule_ids.chunks(ACTION_STEPS_READ_CHUNK) {
            let ids = placeholder_list(chunk.len());
            let binds: Vec<Bind> = chunk.iter().map(|id| Bind::Text(id_text(*id))).collect();
            let details = fetch_bound!(
                self,
                "load action details",
                decode_action_detail,
                SELECT_ACTION_DETAILS_OF_RULES.replace("{ids}", &ids),
                binds.clone()
            )?;
            let templates: HashMap<Uuid, ActionTemplate> = fetch_bound!(
                self,
                "load action templates",
                decode_action_template,
                SELECT_ACTION_TEMPLATES_OF_RULES.replace("{ids}", &ids),
                binds
            )?
            .into_iter()
            .map(|template| (template.id, template))
            .collect();
            for detail in details {
                let template = templates.get(&detail.action_template_id).cloned();
                steps
                    .entry(detail.branch_rule_id)
                    .or_default()
                    .push((detail, template));
            }
        }
        Ok(steps)
    }
}
