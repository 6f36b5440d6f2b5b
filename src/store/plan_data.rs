//! The refresher's read of every table the execution plan needs.

use super::catalog::{
    SELECT_ACTION_TEMPLATES, SELECT_BRANCHES, SELECT_BRAND_RULES, SELECT_BRANDS, SELECT_RULES,
    decode_action_template, decode_branch, decode_brand, decode_brand_rule, decode_rule,
};
use super::decode::AnyRow;
use super::direct;
use super::workflows::{
    COUNT_BRANCH_RULES, SELECT_ACTION_DETAILS_CAPPED, SELECT_BRANCH_RULES,
    SELECT_BRANCH_RULES_CHANGED_SINCE, decode_action_detail, decode_branch_rule,
};
use super::{Store, StoreError};
use crate::model::{
    ActionDetail, BranchRule, Millis, PlanData, PlanLoad, PlanScope, RejectReason, RejectedRow,
};
use uuid::Uuid;

/// A snapshot that sees one committed state for all seven reads, so a branch
/// rule is never loaded without the branch it references. READ ONLY lets
/// PostgreSQL skip predicate locking work and refuses accidental writes.
const BEGIN_PG_SNAPSHOT: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY";

/// Runs one statement on an executor and decodes each row with `$decode`
/// as it arrives, setting aside the rows that do not decode (see
/// [`Sifted::sift`]). Rows are streamed, not fetched whole: at a million
/// branch rules the driver's rows would otherwise sit beside the decoded
/// ones, and the start-up read's peak was the two together.
macro_rules! sift_on {
    ($conn:expr, $op:expr, $decode:expr, $sifted:expr, $sql:expr $(, $arg:expr)* $(,)?) => {{
        let mut rows = sqlx::query($sql)$(.bind($arg))*.fetch($conn);
        let mut decoded = Vec::new();
        loop {
            match std::future::poll_fn(|cx| rows.as_mut().poll_next(cx)).await {
                Some(Ok(row)) => {
                    if let Some(value) = $sifted.sift(&row, $decode) {
                        decoded.push(value);
                    }
                }
                Some(Err(error)) => break Err(StoreError::Query { op: $op, error }),
                None => break Ok(decoded),
            }
        }
    }};
}

/// [`sift_on!`] on SQLite's handle, inside a [`direct::read_in_snapshot`].
macro_rules! sift_direct {
    ($db:expr, $op:expr, $decode:expr, $sifted:expr, $sql:expr $(, $arg:expr)* $(,)?) => {
        $db.rows($op, $sql, &[$($arg),*], |row| $sifted.sift(row, $decode))
    };
}

/// The branch rules' row count, through sqlx.
macro_rules! count_on {
    ($conn:expr) => {
        sqlx::query_scalar::<_, i64>(COUNT_BRANCH_RULES)
            .fetch_one($conn)
            .await
            .map_err(StoreError::query("count branch_rules"))
    };
}

/// The branch rules' row count, on SQLite's handle.
macro_rules! count_direct {
    ($db:expr) => {
        $db.scalar("count branch_rules", COUNT_BRANCH_RULES)
    };
}

/// A branch rule as the plan takes it. A running flag with no lock behind
/// it (an operator's `UPDATE … SET is_currently_running = 1`, or one left
/// by hand after clearing the lock) is not a run: every claim sets the two
/// together and every release clears them together, and a claim takes a
/// rule whose lock is free. Kept, it would hold the rule as running for
/// good, since no instance would ever release it.
fn decode_plan_branch_rule(row: &impl AnyRow) -> Result<BranchRule, StoreError> {
    let mut rule = decode_branch_rule(row)?;
    if rule.is_currently_running && rule.lock_holder.is_none() {
        rule.is_currently_running = false;
    }
    Ok(rule)
}

/// Expands to the seven reads on one connection, so the same code runs
/// inside either backend's transaction: through sqlx (`&mut *tx`, with
/// `sift_on` and `count_on`) or on SQLite's handle (with `sift_direct` and
/// `count_direct`). With `$since` set, only branch rules changed since then
/// are read, plus the table's row count.
macro_rules! load_all {
    ($tx:expr, $cap:expr, $since:expr, $sifted:ident, $sift:ident, $count:ident) => {{
        let (branch_rules, scope) = match $since {
            None => (
                $sift!(
                    $tx,
                    "load branch_rules",
                    decode_plan_branch_rule,
                    $sifted,
                    SELECT_BRANCH_RULES
                )?,
                PlanScope::Full,
            ),
            Some(since) => {
                let rows = $sift!(
                    $tx,
                    "load changed branch_rules",
                    decode_plan_branch_rule,
                    $sifted,
                    SELECT_BRANCH_RULES_CHANGED_SINCE,
                    since
                )?;
                let total: i64 = $count!($tx)?;
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
        let rejected_before = $sifted.rejected.len();
        // The branch rule of the last row read, decoded or not: where a cut
        // read stopped, in the database's own order.
        let last_rule = std::cell::RefCell::new(None);
        let action_details = $sift!(
            $tx,
            "load action_details",
            |row| {
                *last_rule.borrow_mut() = Some(row.text("branch_rule_id").ok().flatten());
                decode_action_detail(row)
            },
            $sifted,
            SELECT_ACTION_DETAILS_CAPPED,
            $cap
        )?;
        let action_details_cut = $sifted.cut_of_details(
            &action_details,
            rejected_before,
            last_rule.into_inner().flatten(),
            $cap,
        );
        PlanData {
            scope,
            brands: $sift!($tx, "load brands", decode_brand, $sifted, SELECT_BRANDS)?,
            branches: $sift!(
                $tx,
                "load branches",
                decode_branch,
                $sifted,
                SELECT_BRANCHES
            )?,
            rules: $sift!($tx, "load rules", decode_rule, $sifted, SELECT_RULES)?,
            brand_rules: $sift!(
                $tx,
                "load brand_rules",
                decode_brand_rule,
                $sifted,
                SELECT_BRAND_RULES
            )?,
            action_templates: $sift!(
                $tx,
                "load action_templates",
                decode_action_template,
                $sifted,
                SELECT_ACTION_TEMPLATES
            )?,
            branch_rules,
            action_details,
            action_details_cut,
        }
    }};
}

/// The rows a load set aside, and the first decode error as the store
/// reported it (for the strict [`Store::load_plan_data`]).
#[derive(Default)]
struct Sifted {
    rejected: Vec<RejectedRow>,
    first_error: Option<StoreError>,
}

impl Sifted {
    /// Where the capped read of action details stopped, if the cap cut it:
    /// the branch rule of the last row read (`last_rule`, as stored).
    /// Rows that did not decode count too (they were read, and took a
    /// place under the cap): counting only the decoded ones would miss the
    /// cut and give the rules past it no steps at all. When the last row's
    /// rule id is not a UUID, the last decoded row's rule stands in: the
    /// cut then excludes that rule too, which only sends it to read its
    /// steps from the database.
    fn cut_of_details(
        &self,
        decoded: &[ActionDetail],
        rejected_before: usize,
        last_rule: Option<String>,
        cap: i64,
    ) -> Option<Uuid> {
        let read = decoded.len() + self.rejected.len() - rejected_before;
        if (read as i64) < cap {
            return None;
        }
        last_rule
            .and_then(|text| Uuid::parse_str(&text).ok())
            .or_else(|| decoded.last().map(|detail| detail.branch_rule_id))
    }

    /// Decodes one row; a row that does not decode is set aside as a
    /// [`RejectedRow`] instead of failing the read, so one bad row cannot
    /// keep every other change out of the plan.
    fn sift<R: AnyRow, T>(
        &mut self,
        row: &R,
        decode: impl Fn(&R) -> Result<T, StoreError>,
    ) -> Option<T> {
        match decode(row) {
            Ok(value) => Some(value),
            Err(error) => {
                if let Some(rejected) = rejected_row(row, &error) {
                    self.rejected.push(rejected);
                }
                self.first_error.get_or_insert(error);
                None
            }
        }
    }
}

/// The quarantine record of a row that failed to decode. The reason follows
/// the column, so a window of `abc` counts as a bad window, not a generic
/// decode failure.
fn rejected_row(row: &impl AnyRow, error: &StoreError) -> Option<RejectedRow> {
    let StoreError::Decode {
        table,
        id,
        column,
        message,
    } = error
    else {
        return None;
    };
    let reason = match *column {
        "operation_time_from" | "operation_time_to" => RejectReason::Window,
        "timezone" => RejectReason::Zone,
        "cron_expression" => RejectReason::Cron,
        "policy" => RejectReason::Policy,
        _ => RejectReason::Decode,
    };
    let branch_rule_id = (*table == "action_details")
        .then(|| row.text("branch_rule_id").ok().flatten())
        .flatten()
        .and_then(|text| Uuid::parse_str(&text).ok());
    Some(RejectedRow {
        table: table.to_string(),
        id: id.clone(),
        field: column.to_string(),
        reason,
        message: message.clone(),
        branch_rule_id,
    })
}

impl Store {
    /// Reads brands, branches, rules, brand rules, action templates and all
    /// branch rules (archived ones too: filtering is the plan's job), plus
    /// the first `action_details_cap` action details ordered by
    /// (branch_rule_id, position), all from one consistent snapshot.
    ///
    /// Strict: a row whose stored value does not fit the model fails the
    /// whole load with [`StoreError::Decode`] naming table, id and column.
    /// The service uses [`Store::load_plan`], which sets such rows aside.
    pub async fn load_plan_data(&self, action_details_cap: usize) -> Result<PlanData, StoreError> {
        let (load, first_error) = self.read_plan(action_details_cap, None).await?;
        match first_error {
            Some(error) => Err(error),
            None => Ok(load.data),
        }
    }

    /// Like [`Store::load_plan_data`], but reads only the branch rules whose
    /// `updated_at` is at or after `since` (a trigger bumps it on every
    /// update), plus the table's row count so deletions are noticed. The
    /// other tables are small and always read whole. Strict, like
    /// [`Store::load_plan_data`].
    pub async fn load_plan_changes(
        &self,
        since: Millis,
        action_details_cap: usize,
    ) -> Result<PlanData, StoreError> {
        let (load, first_error) = self.read_plan(action_details_cap, Some(since)).await?;
        match first_error {
            Some(error) => Err(error),
            None => Ok(load.data),
        }
    }

    /// The plan tables as the refresher and `ruled plan` read them: every
    /// table whole, or only the branch rules changed since `since`. A row
    /// that does not decode is left out and listed in
    /// [`PlanLoad::rejected`] with its table, id, column and reason; only a
    /// failed query fails the load.
    pub async fn load_plan(
        &self,
        action_details_cap: usize,
        since: Option<Millis>,
    ) -> Result<PlanLoad, StoreError> {
        Ok(self.read_plan(action_details_cap, since).await?.0)
    }

    async fn read_plan(
        &self,
        action_details_cap: usize,
        since: Option<Millis>,
    ) -> Result<(PlanLoad, Option<StoreError>), StoreError> {
        let cap = i64::try_from(action_details_cap).unwrap_or(i64::MAX);
        let mut sifted = Sifted::default();
        let data = match self {
            Store::Sqlite(pool) => {
                let (data, read) = direct::read_in_snapshot(pool, "load_plan_data", move |db| {
                    let mut sifted = Sifted::default();
                    let data = load_all!(db, cap, since, sifted, sift_direct, count_direct);
                    Ok((data, sifted))
                })
                .await?;
                sifted = read;
                data
            }
            Store::Postgres(pool) => {
                let mut tx = pool
                    .begin_with(BEGIN_PG_SNAPSHOT)
                    .await
                    .map_err(StoreError::query("begin load_plan_data"))?;
                let data = load_all!(&mut *tx, cap, since, sifted, sift_on, count_on);
                tx.commit()
                    .await
                    .map_err(StoreError::query("commit load_plan_data"))?;
                data
            }
        };
        let load = PlanLoad {
            data,
            rejected: sifted.rejected,
        };
        Ok((load, sifted.first_error))
    }
}
