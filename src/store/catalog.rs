//! brands, branches, rules, brand_rules, action_templates.

use uuid::Uuid;

use super::decode::{AnyRow, RowReader, id_text, json_text, opt_id_text, policy_text};
use super::{Store, StoreError};
use crate::model::{ActionTemplate, Branch, Brand, BrandRule, Rule};

// ---- brands ----------------------------------------------------------------

const INSERT_BRAND: &str = "\
INSERT INTO brands (id, name, settings, created_at, updated_at) \
VALUES ($1, $2, $3, $4, $5)";

pub(super) const SELECT_BRANDS: &str = "\
SELECT id, name, settings, created_at, updated_at \
FROM brands ORDER BY id";

pub(super) fn decode_brand(row: &impl AnyRow) -> Result<Brand, StoreError> {
    let r = RowReader::new(row, "brands")?;
    Ok(Brand {
        id: r.uuid("id")?,
        name: r.text("name")?,
        settings: r.json("settings")?,
        created_at: r.i64("created_at")?,
        updated_at: r.i64("updated_at")?,
    })
}

// ---- branches --------------------------------------------------------------

const INSERT_BRANCH: &str = "\
INSERT INTO branches (id, brand_id, name, timezone, is_active, created_at, updated_at) \
VALUES ($1, $2, $3, $4, $5, $6, $7)";

pub(super) const SELECT_BRANCHES: &str = "\
SELECT id, brand_id, name, timezone, is_active, created_at, updated_at \
FROM branches ORDER BY id";

pub(super) fn decode_branch(row: &impl AnyRow) -> Result<Branch, StoreError> {
    let r = RowReader::new(row, "branches")?;
    Ok(Branch {
        id: r.uuid("id")?,
        brand_id: r.uuid("brand_id")?,
        name: r.text("name")?,
        timezone: r.opt_text("timezone")?,
        is_active: r.bool("is_active")?,
        created_at: r.i64("created_at")?,
        updated_at: r.i64("updated_at")?,
    })
}

// ---- rules -----------------------------------------------------------------

const INSERT_RULE: &str = "\
INSERT INTO rules (id, brand_id, name, status, cron_expression, settings, policy, created_at, updated_at) \
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";

pub(super) const SELECT_RULES: &str = "\
SELECT id, brand_id, name, status, cron_expression, settings, policy, created_at, updated_at \
FROM rules ORDER BY id";

pub(super) fn decode_rule(row: &impl AnyRow) -> Result<Rule, StoreError> {
    let r = RowReader::new(row, "rules")?;
    Ok(Rule {
        id: r.uuid("id")?,
        brand_id: r.opt_uuid("brand_id")?,
        name: r.text("name")?,
        status: r.rule_status("status")?,
        cron_expression: r.text("cron_expression")?,
        settings: r.json("settings")?,
        policy: r.policy("policy")?,
        created_at: r.i64("created_at")?,
        updated_at: r.i64("updated_at")?,
    })
}

// ---- brand_rules -----------------------------------------------------------

const INSERT_BRAND_RULE: &str = "\
INSERT INTO brand_rules (id, brand_id, rule_id, settings, cron_expression, created_at, updated_at) \
VALUES ($1, $2, $3, $4, $5, $6, $7)";

pub(super) const SELECT_BRAND_RULES: &str = "\
SELECT id, brand_id, rule_id, settings, cron_expression, created_at, updated_at \
FROM brand_rules ORDER BY id";

pub(super) fn decode_brand_rule(row: &impl AnyRow) -> Result<BrandRule, StoreError> {
    let r = RowReader::new(row, "brand_rules")?;
    Ok(BrandRule {
        id: r.uuid("id")?,
        brand_id: r.uuid("brand_id")?,
        rule_id: r.uuid("rule_id")?,
        settings: r.json("settings")?,
        cron_expression: r.opt_text("cron_expression")?,
        created_at: r.i64("created_at")?,
        updated_at: r.i64("updated_at")?,
    })
}

// ---- action_templates ------------------------------------------------------

const INSERT_ACTION_TEMPLATE: &str = "\
INSERT INTO action_templates (id, name, kind, config, created_at, updated_at) \
VALUES ($1, $2, $3, $4, $5, $6)";

pub(super) const SELECT_ACTION_TEMPLATES: &str = "\
SELECT id, name, kind, config, created_at, updated_at \
FROM action_templates ORDER BY id";

pub(super) fn decode_action_template(row: &impl AnyRow) -> Result<ActionTemplate, StoreError> {
    let r = RowReader::new(row, "action_templates")?;
    Ok(ActionTemplate {
        id: r.uuid("id")?,
        name: r.text("name")?,
        kind: r.text("kind")?,
        config: r.json("config")?,
        created_at: r.i64("created_at")?,
        updated_at: r.i64("updated_at")?,
    })
}

impl Store {
    pub async fn insert_brand(&self, brand: &Brand) -> Result<(), StoreError> {
        execute!(
            self,
            "insert brand",
            INSERT_BRAND,
            id_text(brand.id),
            brand.name.as_str(),
            json_text(&brand.settings),
            brand.created_at,
            brand.updated_at,
        )
        .map(drop)
    }

    pub async fn insert_branch(&self, branch: &Branch) -> Result<(), StoreError> {
        execute!(
            self,
            "insert branch",
            INSERT_BRANCH,
            id_text(branch.id),
            id_text(branch.brand_id),
            branch.name.as_str(),
            branch.timezone.as_deref(),
            branch.is_active,
            branch.created_at,
            branch.updated_at,
        )
        .map(drop)
    }

    pub async fn insert_rule(&self, rule: &Rule) -> Result<(), StoreError> {
        execute!(
            self,
            "insert rule",
            INSERT_RULE,
            id_text(rule.id),
            opt_id_text(rule.brand_id),
            rule.name.as_str(),
            rule.status.as_str(),
            rule.cron_expression.as_str(),
            json_text(&rule.settings),
            policy_text(rule.policy.as_ref()),
            rule.created_at,
            rule.updated_at,
        )
        .map(drop)
    }

    pub async fn insert_brand_rule(&self, brand_rule: &BrandRule) -> Result<(), StoreError> {
        execute!(
            self,
            "insert brand_rule",
            INSERT_BRAND_RULE,
            id_text(brand_rule.id),
            id_text(brand_rule.brand_id),
            id_text(brand_rule.rule_id),
            json_text(&brand_rule.settings),
            brand_rule.cron_expression.as_deref(),
            brand_rule.created_at,
            brand_rule.updated_at,
        )
        .map(drop)
    }

    pub async fn insert_action_template(
        &self,
        template: &ActionTemplate,
    ) -> Result<(), StoreError> {
        execute!(
            self,
            "insert action_template",
            INSERT_ACTION_TEMPLATE,
            id_text(template.id),
            template.name.as_str(),
            template.kind.as_str(),
            json_text(&template.config),
            template.created_at,
            template.updated_at,
        )
        .map(drop)
    }
}

// ---- history: executions under a catalog row, and archiving ----------------

/// A catalog row whose deletion would take executions with it (through the
/// cascades to branch_rules and on to executions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatalogScope {
    /// A brand: its branches' branch rules and its own rules' branch rules.
    Brand,
    Branch,
    Rule,
    BranchRule,
}

/// What [`Store::delete_without_history`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryDelete {
    /// No history below: every row is gone.
    Deleted,
    /// The row `id` was deleted by someone else meanwhile; nothing was
    /// deleted.
    Gone(Uuid),
    /// The row `id` has executions below it; nothing was deleted.
    Refused { id: Uuid, executions: i64 },
}

/// A statement over the branch rules below one catalog row of `$scope`,
/// `$1` being its id: `$before`, the condition on `branch_rules`, then
/// `$after`. The selection, the count and the lock share the one condition,
/// so they cannot drift apart.
macro_rules! below_sql {
    ($scope:expr, $before:literal, $after:literal) => {
        match $scope {
            CatalogScope::Brand => concat!(
                $before,
                "branch_id IN (SELECT id FROM branches WHERE brand_id = $1) \
                 OR rule_id IN (SELECT id FROM rules WHERE brand_id = $1)",
                $after
            ),
            CatalogScope::Branch => concat!($before, "branch_id = $1", $after),
            CatalogScope::Rule => concat!($before, "rule_id = $1", $after),
            CatalogScope::BranchRule => concat!($before, "id = $1", $after),
        }
    };
}

impl CatalogScope {
    /// The branch rules below one row, `$1` being its id.
    fn branch_rules_sql(self) -> &'static str {
        below_sql!(self, "SELECT id FROM branch_rules WHERE ", " ORDER BY id")
    }

    fn count_sql(self) -> &'static str {
        below_sql!(
            self,
            "SELECT COUNT(*) FROM executions WHERE branch_rule_id IN \
             (SELECT id FROM branch_rules WHERE ",
            ")"
        )
    }

    /// PostgreSQL's row locks for a delete of the row `$1`: the row
    /// itself and the catalog rows between it and its branch rules (new
    /// branch rules below them wait, their foreign keys needing a share
    /// lock), then the branch rules (a claim holds its rule's row until it
    /// commits its execution; later claims skip a locked rule).
    fn postgres_lock_sql(self) -> impl Iterator<Item = &'static str> {
        let rows: &[&'static str] = match self {
            CatalogScope::Brand => &[
                "SELECT id FROM brands WHERE id = $1 FOR UPDATE",
                "SELECT id FROM branches WHERE brand_id = $1 ORDER BY id FOR UPDATE",
                "SELECT id FROM rules WHERE brand_id = $1 ORDER BY id FOR UPDATE",
            ],
            CatalogScope::Branch => &["SELECT id FROM branches WHERE id = $1 FOR UPDATE"],
            CatalogScope::Rule => &["SELECT id FROM rules WHERE id = $1 FOR UPDATE"],
            CatalogScope::BranchRule => &[],
        };
        let branch_rules = below_sql!(
            self,
            "SELECT id FROM branch_rules WHERE ",
            " ORDER BY id FOR UPDATE"
        );
        rows.iter().copied().chain([branch_rules])
    }

    fn delete_sql(self) -> &'static str {
        match self {
            CatalogScope::Brand => "DELETE FROM brands WHERE id = $1",
            CatalogScope::Branch => "DELETE FROM branches WHERE id = $1",
            CatalogScope::Rule => "DELETE FROM rules WHERE id = $1",
            CatalogScope::BranchRule => "DELETE FROM branch_rules WHERE id = $1",
        }
    }

    /// Stamps `archived_at` ($1) on the row ($2) and the catalog rows it
    /// owns; branch rules have their own flag ([`ARCHIVE_BRANCH_RULE`]).
    fn archive_sql(self) -> &'static [&'static str] {
        match self {
            CatalogScope::Brand => &[
                "UPDATE brands SET archived_at = $1, updated_at = $1 \
                 WHERE id = $2 AND archived_at IS NULL",
                "UPDATE branches SET archived_at = $1, updated_at = $1 \
                 WHERE brand_id = $2 AND archived_at IS NULL",
                "UPDATE rules SET archived_at = $1, updated_at = $1 \
                 WHERE brand_id = $2 AND archived_at IS NULL",
            ],
            CatalogScope::Branch => &["UPDATE branches SET archived_at = $1, updated_at = $1 \
                 WHERE id = $2 AND archived_at IS NULL"],
            CatalogScope::Rule => &["UPDATE rules SET archived_at = $1, updated_at = $1 \
                 WHERE id = $2 AND archived_at IS NULL"],
            CatalogScope::BranchRule => &[],
        }
    }
}

/// The plan's ready filter and the claim both skip archived branch rules.
const ARCHIVE_BRANCH_RULE: &str = "\
UPDATE branch_rules SET is_archived = $1, updated_at = $2 WHERE id = $3";

fn parse_ids(ids: Vec<String>) -> Result<Vec<Uuid>, StoreError> {
    ids.into_iter()
        .map(|text| {
            Uuid::parse_str(&text).map_err(|e| StoreError::Decode {
                table: "branch_rules",
                id: text.clone(),
                column: "id",
                message: e.to_string(),
            })
        })
        .collect()
}

impl Store {
    /// Deletes the catalog rows `ids` of `scope` (and, by the cascades,
    /// everything below them) only if no execution lies below any of them;
    /// otherwise deletes nothing and names the first row with history.
    ///
    /// A count and then a separate delete let a claim land in between,
    /// whose execution the cascade then erased. So the delete counts again
    /// in the transaction that deletes, holding the rows against the
    /// engine: on SQLite it takes the write lock first; on PostgreSQL it
    /// locks the rows and their branch rules, so a claim in flight commits
    /// before the count (which then sees its execution) and a later one
    /// skips the locked rule, and a branch rule cannot be added below
    /// meanwhile (its foreign key waits for the parent's lock). A first
    /// count without locks refuses the usual case, rows with history,
    /// without taking a lock the engine would wait for.
    pub async fn delete_without_history(
        &self,
        scope: CatalogScope,
        ids: &[Uuid],
    ) -> Result<HistoryDelete, StoreError> {
        for id in ids {
            let executions = self.executions_under(scope, *id).await?;
            if executions > 0 {
                return Ok(HistoryDelete::Refused {
                    id: *id,
                    executions,
                });
            }
        }
        // Locks in one order whatever the request's, so two deletes do not
        // wait for each other; the engine's batches lock rules in their own
        // order, so PostgreSQL may still pick this one as a deadlock's
        // victim, which rolled it back whole: it runs once more.
        let mut ordered = ids.to_vec();
        ordered.sort_unstable();
        ordered.dedup();
        match self.delete_locked(scope, &ordered).await {
            Err(e) if e.is_rollback_victim() => self.delete_locked(scope, &ordered).await,
            outcome => outcome,
        }
    }

    /// How many executions (any state) lie below the catalog row `id`.
    async fn executions_under(&self, scope: CatalogScope, id: Uuid) -> Result<i64, StoreError> {
        let op = "count executions under a catalog row";
        match self {
            Store::Sqlite(pool) => {
                sqlx::query_scalar(scope.count_sql())
                    .bind(id_text(id))
                    .fetch_one(pool)
                    .await
            }
            Store::Postgres(pool) => {
                sqlx::query_scalar(scope.count_sql())
                    .bind(id_text(id))
                    .fetch_one(pool)
                    .await
            }
        }
        .map_err(StoreError::query(op))
    }

    /// [`Store::delete_without_history`]'s transaction, over `ids` in
    /// order.
    async fn delete_locked(
        &self,
        scope: CatalogScope,
        ids: &[Uuid],
    ) -> Result<HistoryDelete, StoreError> {
        // Returning drops the transaction, which rolls it back: nothing is
        // deleted unless every row is.
        macro_rules! run {
            ($tx:expr, $locks:expr) => {{
                let mut tx = $tx;
                for id in ids {
                    for sql in $locks {
                        sqlx::query(sql)
                            .bind(id_text(*id))
                            .fetch_all(&mut *tx)
                            .await
                            .map_err(StoreError::query("lock a catalog row to delete"))?;
                    }
                }
                for id in ids {
                    let executions: i64 = sqlx::query_scalar(scope.count_sql())
                        .bind(id_text(*id))
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(StoreError::query("count executions under a catalog row"))?;
                    if executions > 0 {
                        return Ok(HistoryDelete::Refused {
                            id: *id,
                            executions,
                        });
                    }
                }
                for id in ids {
                    let deleted = execute_on!(
                        &mut *tx,
                        "delete a catalog row",
                        scope.delete_sql(),
                        id_text(*id)
                    )?;
                    if deleted == 0 {
                        return Ok(HistoryDelete::Gone(*id));
                    }
                }
                tx.commit()
                    .await
                    .map_err(StoreError::query("commit delete"))?;
                Ok(HistoryDelete::Deleted)
            }};
        }
        match self {
            Store::Sqlite(pool) => run!(
                super::claims::begin_sqlite_write(pool, "begin delete").await?,
                std::iter::empty::<&'static str>()
            ),
            Store::Postgres(pool) => run!(
                pool.begin()
                    .await
                    .map_err(StoreError::query("begin delete"))?,
                scope.postgres_lock_sql()
            ),
        }
    }

    /// Archives the catalog rows `ids` of `scope` and everything below them
    /// in one transaction: `archived_at` on brands, branches and rules,
    /// `is_archived` on every branch rule below, nothing deleted. Returns
    /// the branch rules archived, whose running jobs the caller cancels.
    pub async fn archive(
        &self,
        scope: CatalogScope,
        ids: &[Uuid],
        now: i64,
    ) -> Result<Vec<Uuid>, StoreError> {
        macro_rules! run {
            ($tx:expr) => {{
                let mut tx = $tx;
                let mut archived = Vec::new();
                for id in ids {
                    let below: Vec<String> = sqlx::query_scalar(scope.branch_rules_sql())
                        .bind(id_text(*id))
                        .fetch_all(&mut *tx)
                        .await
                        .map_err(StoreError::query("select branch rules to archive"))?;
                    for sql in scope.archive_sql() {
                        execute_on!(&mut *tx, "archive catalog row", *sql, now, id_text(*id))?;
                    }
                    for branch_rule in parse_ids(below)? {
                        execute_on!(
                            &mut *tx,
                            "archive branch rule",
                            ARCHIVE_BRANCH_RULE,
                            true,
                            now,
                            id_text(branch_rule)
                        )?;
                        if !archived.contains(&branch_rule) {
                            archived.push(branch_rule);
                        }
                    }
                }
                tx.commit()
                    .await
                    .map_err(StoreError::query("commit archive"))?;
                Ok(archived)
            }};
        }
        match self {
            // It reads before it writes: see `SQLITE_BEGIN_WRITE`.
            Store::Sqlite(pool) => {
                run!(super::claims::begin_sqlite_write(pool, "begin archive").await?)
            }
            Store::Postgres(pool) => run!(
                pool.begin()
                    .await
                    .map_err(StoreError::query("begin archive"))?
            ),
        }
    }
}
