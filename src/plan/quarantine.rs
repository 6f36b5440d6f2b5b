//! Quarantine: rows of the plan tables that cannot be trusted stay out of
//! the plan, each named, and nothing else is held up by them. Pure.
//!
//! The store sets aside rows that do not decode; [`screen`] sets aside the
//! ones that decode but whose cron expression, zone or window is invalid.
//! The plan keeps the list ([`Quarantine`]) so the rules depending on a
//! quarantined row are held with its reason, and so each row is reported
//! once, when it enters the quarantine, rather than on every refresh.

use std::collections::{BTreeMap, HashMap};

use uuid::Uuid;

use super::resolve::{ResolveError, resolve_zone};
use crate::model::{
    EARLIEST_TIME_MS, LATEST_TIME_MS, PlanData, PlanScope, RejectReason, RejectedRow,
};
use crate::schedule::CronSchedule;

/// Table names as the database spells them, as [`RejectedRow::table`] holds them.
pub const BRANCHES: &str = "branches";
pub const RULES: &str = "rules";
pub const BRAND_RULES: &str = "brand_rules";
pub const BRANCH_RULES: &str = "branch_rules";
pub const ACTION_TEMPLATES: &str = "action_templates";
pub const ACTION_DETAILS: &str = "action_details";

fn rejected(
    table: &str,
    id: Uuid,
    field: &str,
    reason: RejectReason,
    message: String,
) -> RejectedRow {
    RejectedRow {
        table: table.to_string(),
        id: id.to_string(),
        field: field.to_string(),
        reason,
        message,
        branch_rule_id: None,
    }
}

/// Takes out of `data` every row that decoded but cannot be scheduled: a
/// rule or brand rule whose cron expression does not parse, a branch whose
/// zone is not an IANA name, a branch rule with only one window bound, a
/// time outside 1970–9999 or a lock epoch with no room left, a template
/// config or detail params that are not a JSON object.
/// Returns them, in table order.
pub fn screen(data: &mut PlanData) -> Vec<RejectedRow> {
    let mut out = Vec::new();
    data.rules
        .retain(|rule| match CronSchedule::parse(&rule.cron_expression) {
            Ok(_) => true,
            Err(source) => {
                let error = ResolveError::InvalidCron {
                    table: "rule",
                    id: rule.id,
                    source,
                };
                out.push(rejected(
                    RULES,
                    rule.id,
                    "cron_expression",
                    RejectReason::Cron,
                    error.to_string(),
                ));
                false
            }
        });
    data.brand_rules.retain(|brand_rule| {
        let Some(expression) = brand_rule.cron_expression.as_deref() else {
            return true;
        };
        match CronSchedule::parse(expression) {
            Ok(_) => true,
            Err(source) => {
                let error = ResolveError::InvalidCron {
                    table: "brand rule",
                    id: brand_rule.id,
                    source,
                };
                out.push(rejected(
                    BRAND_RULES,
                    brand_rule.id,
                    "cron_expression",
                    RejectReason::Cron,
                    error.to_string(),
                ));
                false
            }
        }
    });
    data.branches.retain(|branch| {
        // The default zone plays no part in whether a name is valid.
        match resolve_zone(branch.id, branch.timezone.as_deref(), chrono_tz::UTC) {
            Ok(_) => true,
            Err(error) => {
                out.push(rejected(
                    BRANCHES,
                    branch.id,
                    "timezone",
                    RejectReason::Zone,
                    error.to_string(),
                ));
                false
            }
        }
    });
    data.branch_rules.retain(|row| {
        // Arithmetic on a time past these (a start offset, a lag) would
        // overflow; the API never stores one.
        let times = [
            ("next_run_time", row.next_run_time),
            ("last_run_time", row.last_run_time),
            ("retry_of", row.retry_of),
            ("lock_time", row.lock_time),
        ];
        for (field, time) in times {
            if let Some(time) = time
                && !(EARLIEST_TIME_MS..=LATEST_TIME_MS).contains(&time)
            {
                out.push(rejected(
                    BRANCH_RULES,
                    row.id,
                    field,
                    RejectReason::Decode,
                    format!(
                        "{field} {time} is outside the times ruled takes \
                         (epoch ms {EARLIEST_TIME_MS} to {LATEST_TIME_MS}, 1970 to 9999)"
                    ),
                ));
                return false;
            }
        }
        // Each claim adds one: at the largest number none can, and the
        // claim batch fails on it every tick, the rule never running.
        if row.lock_epoch > MAX_LOCK_EPOCH {
            out.push(rejected(
                BRANCH_RULES,
                row.id,
                "lock_epoch",
                RejectReason::Decode,
                format!(
                    "lock_epoch {} leaves no room to count further claims; \
                     set it to 0 while the rule is not running",
                    row.lock_epoch
                ),
            ));
            return false;
        }
        let missing = match (row.operation_time_from, row.operation_time_to) {
            (Some(_), None) => "operation_time_to",
            (None, Some(_)) => "operation_time_from",
            _ => return true,
        };
        out.push(rejected(
            BRANCH_RULES,
            row.id,
            missing,
            RejectReason::Window,
            format!("{missing} is not set: a window needs both bounds, or neither for no window"),
        ));
        false
    });
    // A template's config and a detail's params are merged key by key; any
    // other JSON (written with SQL) would replace the config whole and fail
    // every run, where held here it is named once.
    data.action_templates.retain(|template| {
        if template.config.is_object() {
            return true;
        }
        out.push(rejected(
            ACTION_TEMPLATES,
            template.id,
            "config",
            RejectReason::Decode,
            format!("config must be a JSON object, not {}", template.config),
        ));
        false
    });
    data.action_details.retain(|detail| {
        if detail.params.is_object() || detail.params.is_null() {
            return true;
        }
        out.push(RejectedRow {
            branch_rule_id: Some(detail.branch_rule_id),
            ..rejected(
                ACTION_DETAILS,
                detail.id,
                "params",
                RejectReason::Decode,
                format!("params must be a JSON object, not {}", detail.params),
            )
        });
        false
    });
    out
}

/// A claim adds one to `lock_epoch`; above this a row is held rather than
/// left to overflow (no real count of claims comes near it).
pub const MAX_LOCK_EPOCH: i64 = i64::MAX / 2;

/// What entering a new read into the quarantine changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QuarantineChange {
    /// Rows newly quarantined, or quarantined for a new reason.
    pub entered: Vec<RejectedRow>,
    /// Rows no longer quarantined: fixed or deleted.
    pub released: Vec<RejectedRow>,
}

/// The rows currently kept out of the plan, by (table, id).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Quarantine {
    rows: BTreeMap<(String, String), RejectedRow>,
    /// The rows with a UUID id, and the branch rules of quarantined action
    /// details: the ready check looks these up for every workflow, so
    /// without allocating.
    by_uuid: HashMap<(&'static str, Uuid), (String, String)>,
    details_by_branch_rule: HashMap<Uuid, (String, String)>,
}

/// The table names the plan reads, as `'static` keys.
const TABLES: [&str; 6] = [
    BRANCHES,
    RULES,
    BRAND_RULES,
    BRANCH_RULES,
    ACTION_TEMPLATES,
    ACTION_DETAILS,
];

/// Ids are compared as UUIDs when they are UUIDs, so `ABC…` and `abc…`
/// are the same row.
fn key(table: &str, id: &str) -> (String, String) {
    let id = Uuid::parse_str(id).map_or_else(|_| id.to_string(), |uuid| uuid.to_string());
    (table.to_string(), id)
}

impl Quarantine {
    /// Folds one read into the quarantine. A full read replaces it; a read
    /// of changed branch rules replaces every other table's entries (those
    /// tables are always read whole) and, for branch rules, only the rows it
    /// carries: `decoded_branch_rules` are fine now, `rejected` are not.
    pub fn apply(
        &mut self,
        rejected: Vec<RejectedRow>,
        decoded_branch_rules: impl IntoIterator<Item = Uuid>,
        scope: PlanScope,
    ) -> QuarantineChange {
        let mut next: BTreeMap<(String, String), RejectedRow> = BTreeMap::new();
        if let PlanScope::Changes { .. } = scope {
            next = self
                .rows
                .iter()
                .filter(|((table, _), _)| table == BRANCH_RULES)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            for id in decoded_branch_rules {
                next.remove(&key(BRANCH_RULES, &id.to_string()));
            }
        }
        for row in rejected {
            next.insert(key(&row.table, &row.id), row);
        }
        let mut change = QuarantineChange::default();
        for (k, row) in &next {
            if self.rows.get(k) != Some(row) {
                change.entered.push(row.clone());
            }
        }
        for (k, row) in &self.rows {
            if !next.contains_key(k) {
                change.released.push(row.clone());
            }
        }
        self.rows = next;
        self.index();
        change
    }

    fn index(&mut self) {
        self.by_uuid.clear();
        self.details_by_branch_rule.clear();
        for (k, row) in &self.rows {
            let table = TABLES.iter().find(|t| **t == row.table).copied();
            if let (Some(table), Ok(id)) = (table, Uuid::parse_str(&row.id)) {
                self.by_uuid.insert((table, id), k.clone());
            }
            if row.table == ACTION_DETAILS
                && let Some(branch_rule_id) = row.branch_rule_id
            {
                self.details_by_branch_rule
                    .insert(branch_rule_id, k.clone());
            }
        }
    }

    pub fn rows(&self) -> impl Iterator<Item = &RejectedRow> {
        self.rows.values()
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The quarantined row of `table` with this id, if any.
    pub fn get(&self, table: &'static str, id: &Uuid) -> Option<&RejectedRow> {
        self.by_uuid
            .get(&(table, *id))
            .and_then(|k| self.rows.get(k))
    }

    /// How many rows of `table` are quarantined.
    pub fn count(&self, table: &str) -> usize {
        self.rows.keys().filter(|(t, _)| t == table).count()
    }

    /// A quarantined action detail of this branch rule, if any: the rule
    /// would otherwise run without one of its steps.
    pub fn detail_of(&self, branch_rule_id: &Uuid) -> Option<&RejectedRow> {
        self.details_by_branch_rule
            .get(branch_rule_id)
            .and_then(|k| self.rows.get(k))
    }

    /// Branch rules quarantined under a UUID id: the plan stops running them.
    pub fn branch_rule_ids(&self) -> impl Iterator<Item = Uuid> + '_ {
        self.rows
            .keys()
            .filter(|(table, _)| table == BRANCH_RULES)
            .filter_map(|(_, id)| Uuid::parse_str(id).ok())
    }
}

/// The resolver's error for a row the schedule depends on that is kept out.
pub fn quarantined_error(row: &RejectedRow) -> ResolveError {
    ResolveError::Quarantined {
        table: row.table.clone(),
        id: row.id.clone(),
        reason: row.reason,
        message: row.message.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::fixtures::Fixture;

    fn row(table: &str, id: &str, reason: RejectReason) -> RejectedRow {
        RejectedRow {
            table: table.into(),
            id: id.into(),
            field: "f".into(),
            reason,
            message: "bad".into(),
            branch_rule_id: None,
        }
    }

    #[test]
    fn screen_takes_out_bad_crons_zones_and_half_windows_only() {
        let mut fixture = Fixture::due(0);
        fixture.branch.timezone = Some("Mars/Olympus".into());
        fixture.rule.cron_expression = "*/0 * * * *".into();
        fixture.branch_rule.operation_time_from = Some("09:00".parse().unwrap());
        let mut data = fixture.data();
        let good = Fixture::due(0);
        let mut good_rule = good.rule.clone();
        good_rule.id = Uuid::from_u128(0xC0);
        data.rules.push(good_rule);
        let out = screen(&mut data);
        let summary: Vec<(&str, &str, RejectReason)> = out
            .iter()
            .map(|r| (r.table.as_str(), r.field.as_str(), r.reason))
            .collect();
        assert_eq!(
            summary,
            vec![
                (RULES, "cron_expression", RejectReason::Cron),
                (BRANCHES, "timezone", RejectReason::Zone),
                (BRANCH_RULES, "operation_time_to", RejectReason::Window),
            ]
        );
        assert!(
            out[1].message.contains("Mars/Olympus"),
            "{}",
            out[1].message
        );
        assert!(out[0].message.contains("*/0"), "{}", out[0].message);
        assert_eq!(data.rules.len(), 1, "the good rule stays");
        assert!(data.branches.is_empty() && data.branch_rules.is_empty());

        let mut clean = Fixture::due(0).data();
        assert!(screen(&mut clean).is_empty());
        assert_eq!(clean, Fixture::due(0).data());
    }

    #[test]
    fn screen_takes_out_times_no_arithmetic_can_take() {
        for (field, set) in [
            (
                "next_run_time",
                (|f: &mut Fixture| f.branch_rule.next_run_time = Some(i64::MAX))
                    as fn(&mut Fixture),
            ),
            ("last_run_time", |f| f.branch_rule.last_run_time = Some(-1)),
            ("retry_of", |f| f.branch_rule.retry_of = Some(i64::MIN)),
            ("lock_time", |f| {
                f.branch_rule.lock_time = Some(LATEST_TIME_MS + 1)
            }),
        ] {
            let mut fixture = Fixture::due(0);
            set(&mut fixture);
            let mut data = fixture.data();
            let out = screen(&mut data);
            assert_eq!(out.len(), 1, "{field}");
            assert_eq!(
                (out[0].field.as_str(), out[0].reason),
                (field, RejectReason::Decode)
            );
            assert!(
                out[0].message.contains("1970 to 9999"),
                "{}",
                out[0].message
            );
            assert!(data.branch_rules.is_empty(), "{field}");
        }
        let mut fixture = Fixture::due(LATEST_TIME_MS);
        fixture.branch_rule.last_run_time = Some(EARLIEST_TIME_MS);
        assert!(
            screen(&mut fixture.data()).is_empty(),
            "the bounds are times"
        );
    }

    #[test]
    fn screen_takes_out_an_exhausted_epoch_and_configs_that_are_not_objects() {
        use crate::model::{ActionDetail, ActionTemplate};
        use serde_json::{Value, json};
        let mut fixture = Fixture::due(0);
        fixture.branch_rule.lock_epoch = i64::MAX;
        let mut data = fixture.data();
        let template = |n: u128, config| ActionTemplate {
            id: Uuid::from_u128(n),
            name: "t".into(),
            kind: "noop".into(),
            config,
            created_at: 0,
            updated_at: 0,
        };
        let detail = |n: u128, params| ActionDetail {
            id: Uuid::from_u128(n),
            branch_rule_id: fixture.branch_rule.id,
            action_template_id: Uuid::from_u128(0x71),
            position: 1,
            params,
            created_at: 0,
            updated_at: 0,
        };
        data.action_templates = vec![template(0x71, json!({})), template(0x72, json!([]))];
        data.action_details = vec![
            detail(0xD1, json!({"a": 1})),
            detail(0xD2, Value::Null),
            detail(0xD3, json!("x")),
        ];
        let out = screen(&mut data);
        let summary: Vec<(&str, &str)> = out
            .iter()
            .map(|r| (r.table.as_str(), r.field.as_str()))
            .collect();
        assert_eq!(
            summary,
            vec![
                (BRANCH_RULES, "lock_epoch"),
                (ACTION_TEMPLATES, "config"),
                (ACTION_DETAILS, "params"),
            ]
        );
        assert_eq!(out[2].branch_rule_id, Some(fixture.branch_rule.id));
        assert_eq!(data.action_templates.len(), 1);
        assert_eq!(data.action_details.len(), 2);
    }

    #[test]
    fn each_row_enters_once_and_leaves_when_fixed() {
        let mut q = Quarantine::default();
        let bad = row(
            BRANCHES,
            &Uuid::from_u128(1).to_string(),
            RejectReason::Zone,
        );
        let change = q.apply(vec![bad.clone()], [], PlanScope::Full);
        assert_eq!(change.entered, vec![bad.clone()]);
        // The same row on the next refresh is not news.
        let change = q.apply(vec![bad.clone()], [], PlanScope::Full);
        assert_eq!(change, QuarantineChange::default());
        assert!(q.get(BRANCHES, &Uuid::from_u128(1)).is_some());
        let change = q.apply(vec![], [], PlanScope::Full);
        assert_eq!(change.released, vec![bad]);
        assert!(q.is_empty());
    }

    #[test]
    fn a_delta_keeps_branch_rules_it_does_not_carry() {
        let mut q = Quarantine::default();
        let id = Uuid::from_u128(9);
        let bad_rule = row(BRANCH_RULES, &id.to_string(), RejectReason::Window);
        let bad_text = row(BRANCH_RULES, "not-a-uuid", RejectReason::Decode);
        let bad_branch = row(
            BRANCHES,
            &Uuid::from_u128(1).to_string(),
            RejectReason::Zone,
        );
        q.apply(
            vec![bad_rule.clone(), bad_text.clone(), bad_branch.clone()],
            [],
            PlanScope::Full,
        );
        let delta = PlanScope::Changes {
            since: 0,
            total_branch_rules: 3,
        };
        // The branch is fixed (small tables are read whole); the branch
        // rules are not in the delta, so they stay.
        let change = q.apply(vec![], [], delta);
        assert_eq!(change.released, vec![bad_branch]);
        assert_eq!(q.count(BRANCH_RULES), 2);
        assert_eq!(q.branch_rule_ids().collect::<Vec<_>>(), vec![id]);
        // The delta brings the fixed row.
        let change = q.apply(vec![], [id], delta);
        assert_eq!(change.released, vec![bad_rule]);
        assert_eq!(q.rows().cloned().collect::<Vec<_>>(), vec![bad_text]);
    }

    #[test]
    fn ids_match_whatever_their_case() {
        let mut q = Quarantine::default();
        let id = Uuid::from_u128(0xABC);
        let upper = id.to_string().to_uppercase();
        q.apply(
            vec![row(RULES, &upper, RejectReason::Cron)],
            [],
            PlanScope::Full,
        );
        assert!(q.get(RULES, &id).is_some());
    }
}
