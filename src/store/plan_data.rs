//! The refresher's read of every table the execution plan needs.

use super::catalog::{
    SELECT_ACTION_TEMPLATES, SELECT_BRANCHES, SELECT_BRAND_RULES, SELECT_BRANDS, SELECT_RULES,
    decode_action_template, decode_branch, decode_brand, decode_brand_rule, decode_rule,
};
use super::workflows::{
    COUNT_BRANCH_RULES, SELECT_ACTION_DETAILS_CAPPED, SELECT_BRANCH_RULES,
    SELECT_BRANCH_RULES_CHANGED_SINCE, decode_action_detail, decode_branch_rule,
};
use super::{Store, StoreError};
use crate::model::{Millis, PlanData, PlanScope};

/// A snapshot that sees one committed state for all seven reads, so a branch
/// rule is never loaded without the branch it references. READ ONLY lets
/// PostgreSQL skip predicate locking work and refuses accidental writes.
const BEGIN_PG_SNAPSHOT: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY";

/// Expands to the seven reads on one connection (`&mut *tx`), so the same
/// code runs inside either backend's transaction. With `$since` set, only
/// branch rules changed since then are read, plus the table's row count.
macro_rules! load_all {
    ($tx:ident, $cap:expr, $since:expr) => {{
        let (branch_rules, scope) = match $since {
            None => (
                fetch_all_on!(
                    &mut *$tx,
                    "load branch_rules",
                    decode_branch_rule,
                    SELECT_BRANCH_RULES
                )?,
                PlanScope::Full,
            ),
            Some(since) => {
                let rows = fetch_all_on!(
                    &mut *$tx,
                    "load changed branch_rules",
                    decode_branch_rule,
                    SELECT_BRANCH_RULES_CHANGED_SINCE,
                    since
                )?;
                let total: i64 = sqlx::query_scalar(COUNT_BRANCH_RULES)
                    .fetch_one(&mut *$tx)
                    .await
                    .map_err(StoreError::query("count branch_rules"))?;
                let total_branch_rules = u64::try_from(total).unwrap_or(0);
                (
                    rows,
                    PlanScope::Changes {
                        since,
                        total_branch_rules,
                    },
                )
            }
        };
        PlanData {
            scope,
            brands: fetch_all_on!(&mut *$tx, "load brands", decode_brand, SELECT_BRANDS)?,
            branches: fetch_all_on!(&mut *$tx, "load branches", decode_branch, SELECT_BRANCHES)?,
            rules: fetch_all_on!(&mut *$tx, "load rules", decode_rule, SELECT_RULES)?,
            brand_rules: fetch_all_on!(
                &mut *$tx,
                "load brand_rules",
                decode_brand_rule,
                SELECT_BRAND_RULES
            )?,
            action_templates: fetch_all_on!(
                &mut *$tx,
                "load action_templates",
                decode_action_template,
                SELECT_ACTION_TEMPLATES
            )?,
            branch_rules,
            action_details: fetch_all_on!(
                &mut *$tx,
                "load action_details",
                decode_action_detail,
                SELECT_ACTION_DETAILS_CAPPED,
                $cap
            )?,
        }
    }};
}

impl Store {
    /// Reads brands, branches, rules, brand rules, action templates and all
    /// branch rules (archived ones too: filtering is the plan's job), plus
    /// the first `action_details_cap` action details ordered by
    /// (branch_rule_id, position), all from one consistent snapshot.
    ///
    /// A row whose stored value does not fit the model fails the whole load
    /// with [`StoreError::Decode`] naming table, id and column: a plan built
    /// around a silently skipped row would run the wrong things.
    pub async fn load_plan_data(&self, action_details_cap: usize) -> Result<PlanData, StoreError> {
        self.load_plan(action_details_cap, None).await
    }

    /// Like [`Store::load_plan_data`], but reads only the branch rules whose
    /// `updated_at` is at or after `since` (a trigger bumps it on every
    /// update), plus the table's row count so deletions are noticed. The
    /// other tables are small and always read whole.
    pub async fn load_plan_changes(
        &self,
        since: Millis,
        action_details_cap: usize,
    ) -> Result<PlanData, StoreError> {
        self.load_plan(action_details_cap, Some(since)).await
    }

    async fn load_plan(
        &self,
        action_details_cap: usize,
        since: Option<Millis>,
    ) -> Result<PlanData, StoreError> {
        let cap = i64::try_from(action_details_cap).unwrap_or(i64::MAX);
        match self {
            Store::Sqlite(pool) => {
                // A deferred transaction pins one WAL snapshot at its first
                // read, which is all the consistency needed here.
                let mut tx = pool
                    .begin()
                    .await
                    .map_err(StoreError::query("begin load_plan_data"))?;
                let data = load_all!(tx, cap, since);
                tx.commit()
                    .await
                    .map_err(StoreError::query("commit load_plan_data"))?;
                Ok(data)
            }
            Store::Postgres(pool) => {
                let mut tx = pool
                    .begin_with(BEGIN_PG_SNAPSHOT)
                    .await
                    .map_err(StoreError::query("begin load_plan_data"))?;
                let data = load_all!(tx, cap, since);
                tx.commit()
                    .await
                    .map_err(StoreError::query("commit load_plan_data"))?;
                Ok(data)
            }
        }
    }
}
