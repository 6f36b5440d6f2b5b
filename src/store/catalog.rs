//! brands, branches, rules, brand_rules, action_templates.

use super::decode::{AnyRow, RowReader, id_text, json_text, opt_id_text};
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
INSERT INTO rules (id, brand_id, name, status, cron_expression, settings, created_at, updated_at) \
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";

pub(super) const SELECT_RULES: &str = "\
SELECT id, brand_id, name, status, cron_expression, settings, created_at, updated_at \
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
