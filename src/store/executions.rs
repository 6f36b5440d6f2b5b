//! executions: the statements on the table, and its reads.
//!
//! Writes that change an execution's state live in `claims` (claim, the
//! fenced transitions, finish) and `batch` (the same writes, group-committed);
//! this file holds what they share and the operator-facing reads. The types
//! of the lifecycle API live in [`crate::lifecycle`].

use serde_json::Value;
use sqlx::Connection as _;
use uuid::Uuid;

use super::binds::Bind;
use super::decode::{AnyRow, RowReader, id_text};
use super::{Store, StoreError};
use crate::lifecycle::Fence;
use crate::model::{Execution, ExecutionStatus, Millis};

/// Stored output above this many bytes of JSON text is replaced by a
/// summary (DESIGN §2: "output (json, capped)"): one chatty action must not
/// bloat every listing and the plan's memory.
pub const OUTPUT_CAP_BYTES: usize = 64 * 1024;
/// How much of an oversized output the summary keeps, as a string preview.
const OUTPUT_PREVIEW_BYTES: usize = 4 * 1024;
/// Error texts (a command's stderr, an HTTP body) are cut to this many bytes.
pub const ERROR_CAP_BYTES: usize = 8 * 1024;

/// The error recorded on executions failed by [`Store::recover_owner`].
pub const WORKER_LOST: &str = "worker_lost";

/// Which executions [`Store::list_executions`] returns, ordered by
/// (requested_at, id) ascending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionFilter {
    pub branch_rule_id: Option<Uuid>,
    pub status: Option<ExecutionStatus>,
    /// requested_at >= from.
    pub from: Option<Millis>,
    /// requested_at < to.
    pub to: Option<Millis>,
    /// At most this many rows (negative counts as 0).
    pub limit: i64,
    /// Keyset cursor: only rows after this (requested_at, id), i.e. the last
    /// row of the previous page.
    pub after: Option<(Millis, Uuid)>,
    /// (requested_at, id) descending: a live list shows the latest first,
    /// and its cursor walks back in time.
    pub newest_first: bool,
}

impl Default for ExecutionFilter {
    fn default() -> Self {
        ExecutionFilter {
            branch_rule_id: None,
            status: None,
            from: None,
            to: None,
            limit: 100,
            after: None,
            newest_first: false,
        }
    }
}

impl ExecutionFilter {
    /// The cursor for the page after `page` (its last row), or `None` when
    /// `page` is shorter than the limit and so was the last one.
    pub fn next_cursor(&self, page: &[Execution]) -> Option<(Millis, Uuid)> {
        let full = i64::try_from(page.len()).is_ok_and(|n| n >= self.limit.max(1));
        page.last()
            .filter(|_| full)
            .map(|last| (last.requested_at, last.id))
    }
}

// ---- statements --------------------------------------------------------------

macro_rules! execution_columns {
    () => {
        "id, branch_rule_id, scheduled_for, status, attempt, owner, lock_epoch, \
         requested_at, scheduled_at, started_at, finished_at, error, output, created_at, updated_at"
    };
}
pub(super) use execution_columns;

macro_rules! branch_rule_columns {
    () => {
        "id, branch_id, rule_id, brand_rule_id, \
         is_active, is_archived, is_force_stopped, is_currently_running, \
         operation_time_from, operation_time_to, next_run_time, last_run_time, \
         lock_holder, lock_time, lock_epoch, params, policy, retry_of, failed_attempts, \
         created_at, updated_at"
    };
}
pub(super) use branch_rule_columns;

/// `updated_at = $now` on a branch rule, except that it always moves
/// forward: when the row already says `$now` or later (same millisecond,
/// or another instance's clock ahead), it becomes the old value + 1.
/// Two reasons: the plan's incremental refresh reads `updated_at >= since`
/// and must never see a change move backwards, and a changed updated_at
/// keeps the touch trigger (migration ..02) from overwriting it with the
/// wall clock after the fact, which SQLite's RETURNING would not show.
macro_rules! touch_branch_rule {
    ($now:literal) => {
        concat!(
            "updated_at = CASE WHEN updated_at < ",
            $now,
            " THEN ",
            $now,
            " ELSE updated_at + 1 END"
        )
    };
}
pub(super) use touch_branch_rule;

/// The fence's test that `$holder` still holds a branch rule's lock, for
/// statements that find the rule by its id. Written so that it cannot use
/// the lock holder's index: the statistics PostgreSQL keeps say almost no
/// lock is held (any moment between bursts), so a generic plan took that
/// index for `lock_holder = $holder` and stepped over every lock the
/// instance held, for each row. In a burst of 10,000 that was 60 ms for a
/// release of 100 rules instead of 4 (BENCHMARKS.md, 2026-11-29
/// afternoon). The holder is never NULL, so the two forms agree.
macro_rules! lock_held_by {
    ($table:literal, $holder:literal) => {
        concat!($table, "lock_holder IS NOT DISTINCT FROM ", $holder)
    };
}
pub(super) use lock_held_by;

/// An open execution, in the form the partial indexes on executions are
/// written in (`finished_at` is set exactly when the status becomes
/// terminal); `open_execution!(NOT)` is a finished one.
macro_rules! open_execution {
    () => {
        "finished_at IS NULL"
    };
    (NOT) => {
        "finished_at IS NOT NULL"
    };
}
pub(super) use open_execution;

/// The statuses a transition may still leave, as an SQL list: the open
/// ones. `skipped`, like every other terminal status, is never among them
/// (a skipped execution is written finished).
macro_rules! open_statuses {
    () => {
        "('requested', 'scheduled', 'running')"
    };
}
pub(super) use open_statuses;

const SELECT_EXECUTION: &str = concat!(
    "SELECT ",
    execution_columns!(),
    " FROM executions WHERE id = $1"
);

const SELECT_EXECUTIONS_FOR: &str = concat!(
    "SELECT ",
    execution_columns!(),
    " FROM executions WHERE branch_rule_id = $1 ORDER BY scheduled_for, attempt"
);

/// The open executions, oldest first, from the open-executions index.
pub(super) const SELECT_OPEN_EXECUTIONS: &str = concat!(
    "SELECT ",
    execution_columns!(),
    " FROM executions WHERE ",
    open_execution!(),
    " ORDER BY requested_at, id LIMIT $1"
);

/// In two halves so each reads its partial index, not the table: the
/// finished executions by status, and the few open ones.
const COUNT_BY_STATUS: &str = "\
SELECT status, COUNT(*) AS n FROM executions WHERE finished_at IS NOT NULL GROUP BY status \
UNION ALL \
SELECT status, COUNT(*) AS n FROM executions WHERE finished_at IS NULL GROUP BY status";

/// Branch rules first, then executions: the order claim and finish lock
/// them in, so on PostgreSQL a recovery and a finishing owner queue behind
/// each other instead of deadlocking across the two tables. Leaves
/// next_run_time alone: the occurrence is claimed again and becomes a new
/// attempt. The lost occurrence is owed its run: it is marked as a pending
/// retry of itself (no failure counted), which the misfire policy and the
/// catch-up window leave alone. Without the mark, a run lost to a crash
/// and found more than a minute late was recorded skipped under `misfire:
/// skip` and never ran again.
const RELEASE_OWNER_LOCKS: &str = concat!(
    "UPDATE branch_rules SET lock_holder = NULL, lock_time = NULL, is_currently_running = FALSE, ",
    "retry_of = CASE WHEN retry_of IS NULL AND EXISTS (SELECT 1 FROM executions e \
     WHERE e.branch_rule_id = branch_rules.id AND e.owner = $1 \
     AND e.scheduled_for = branch_rules.next_run_time AND e.",
    open_execution!(),
    ") THEN next_run_time ELSE retry_of END, ",
    touch_branch_rule!("$2"),
    " WHERE lock_holder = $1"
);

/// The owner's `instances` row, if it is still silent (`$2` ms on the
/// database's clock). PostgreSQL locks it until the takeover commits;
/// SQLite's write transaction already excludes every other writer.
macro_rules! still_silent_sql {
    ($now:literal) => {
        concat!(
            "SELECT id FROM instances WHERE id = $1 AND heartbeat_at < ",
            $now,
            " - $2"
        )
    };
}
macro_rules! still_silent_locked_sql {
    ($now:literal) => {
        concat!(still_silent_sql!($now), " FOR UPDATE")
    };
}
const STILL_SILENT: super::leases::DbSql = super::leases::DbSql {
    sqlite: super::leases::on_each_clock!(still_silent_sql).sqlite,
    postgres: super::leases::on_each_clock!(still_silent_locked_sql).postgres,
};

pub(super) const FAIL_OWNER_EXECUTIONS: &str = concat!(
    "UPDATE executions SET status = 'failed', error = $3, finished_at = $2, updated_at = $2 \
     WHERE owner = $1 AND ",
    open_execution!(),
    " AND status IN ",
    open_statuses!(),
    " RETURNING ",
    execution_columns!()
);

/// The attempt of a branch rule still in flight, if any (at most one: the
/// claim's row lock allows one at a time).
pub(super) const OPEN_EXECUTION_OF: &str = concat!(
    "SELECT ",
    execution_columns!(),
    " FROM executions WHERE branch_rule_id = $1 AND ",
    open_execution!(),
    " ORDER BY requested_at DESC LIMIT 1"
);

const SET_FORCE_STOPPED: &str = concat!(
    "UPDATE branch_rules SET is_force_stopped = $2, ",
    touch_branch_rule!("$3"),
    " WHERE id = $1"
);

/// Claims [`Store::withdraw_claims`] gives back in one transaction, each
/// under a savepoint of its own. PostgreSQL keeps the ids of 64
/// subtransactions per backend in shared memory; beyond that every other
/// session checking whether a row is visible looks them up in
/// `pg_subtrans` while the transaction stays open, so no transaction takes
/// more.
pub const WITHDRAWALS_PER_TRANSACTION: usize = 64;

/// See [`Store::withdraw_claims`].
pub(super) const FREE_WITHDRAWN_LOCK: &str = concat!(
    "UPDATE branch_rules SET lock_holder = NULL, lock_time = NULL, is_currently_running = FALSE, ",
    touch_branch_rule!("$4"),
    " WHERE id = $1 AND ",
    lock_held_by!("", "$2"),
    " AND lock_epoch = $3"
);
const DELETE_WITHDRAWN_EXECUTION: &str =
    "DELETE FROM executions WHERE id = $1 AND owner = $2 AND status = 'requested'";

pub(super) fn decode_execution(row: &impl AnyRow) -> Result<Execution, StoreError> {
    let r = RowReader::new(row, "executions")?;
    let id = r.uuid("id")?;
    let decode_error = |column: &'static str, message: String| StoreError::Decode {
        table: "executions",
        id: id.hyphenated().to_string(),
        column,
        message,
    };
    let status_text = r.text("status")?;
    let status = ExecutionStatus::parse(&status_text)
        .ok_or_else(|| decode_error("status", format!("unknown status {status_text:?}")))?;
    // ruled writes `output` as JSON and `owner` always; a row written by
    // hand may have neither, and one such row must not break every listing
    // it is on: text that is not JSON is shown as a JSON string, and no
    // owner as an empty one (no instance has that name, so no fence or
    // recovery matches it).
    let output = r
        .opt_text("output")?
        .map(|text| serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)));
    Ok(Execution {
        id,
        branch_rule_id: r.uuid("branch_rule_id")?,
        scheduled_for: r.i64("scheduled_for")?,
        status,
        attempt: r.i64("attempt")?,
        owner: r.opt_text("owner")?.unwrap_or_default(),
        lock_epoch: r.i64("lock_epoch")?,
        requested_at: r.i64("requested_at")?,
        scheduled_at: r.opt_i64("scheduled_at")?,
        started_at: r.opt_i64("started_at")?,
        finished_at: r.opt_i64("finished_at")?,
        error: r.opt_text("error")?,
        output,
        created_at: r.i64("created_at")?,
        updated_at: r.i64("updated_at")?,
    })
}

/// `text` cut to at most `max` bytes on a char boundary.
pub(super) fn truncate_utf8(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The stored text of an execution's output, summarised when too large.
pub(super) fn output_text(output: Option<&Value>) -> Option<String> {
    let text = output?.to_string();
    if text.len() <= OUTPUT_CAP_BYTES {
        return Some(text);
    }
    let summary = serde_json::json!({
        "truncated": true,
        "bytes": text.len(),
        "preview": truncate_utf8(&text, OUTPUT_PREVIEW_BYTES),
    });
    Some(summary.to_string())
}

/// PostgreSQL's text refuses NUL, and a finish it refuses would stay in the
/// outbox for good: a NUL (from a handler's message, say) is stored as
/// U+FFFD on both backends.
pub(super) fn error_text(error: Option<&str>) -> Option<String> {
    error.map(|e| truncate_utf8(e, ERROR_CAP_BYTES).replace('\0', "\u{FFFD}"))
}

impl Store {
    pub async fn execution(&self, id: Uuid) -> Result<Option<Execution>, StoreError> {
        let op = "select execution";
        let row = match self {
            Store::Sqlite(pool) => sqlx::query(SELECT_EXECUTION)
                .bind(id_text(id))
                .fetch_optional(pool)
                .await
                .map_err(StoreError::query(op))?
                .map(|row| decode_execution(&row)),
            Store::Postgres(pool) => sqlx::query(SELECT_EXECUTION)
                .bind(id_text(id))
                .fetch_optional(pool)
                .await
                .map_err(StoreError::query(op))?
                .map(|row| decode_execution(&row)),
        };
        row.transpose()
    }

    /// Every attempt at every occurrence of one branch rule, ordered by
    /// (scheduled_for, attempt).
    pub async fn executions_for(&self, branch_rule_id: Uuid) -> Result<Vec<Execution>, StoreError> {
        let op = "select executions of branch_rule";
        let id = id_text(branch_rule_id);
        match self {
            Store::Sqlite(pool) => {
                fetch_all_on!(pool, op, decode_execution, SELECT_EXECUTIONS_FOR, id)
            }
            Store::Postgres(pool) => {
                fetch_all_on!(pool, op, decode_execution, SELECT_EXECUTIONS_FOR, id)
            }
        }
    }

    /// Up to `limit` executions not yet finished (requested, scheduled,
    /// running), oldest first: the few rows a live view watches change.
    pub async fn open_executions(&self, limit: i64) -> Result<Vec<Execution>, StoreError> {
        let op = "select open executions";
        match self {
            Store::Sqlite(pool) => {
                fetch_all_on!(pool, op, decode_execution, SELECT_OPEN_EXECUTIONS, limit)
            }
            Store::Postgres(pool) => {
                fetch_all_on!(pool, op, decode_execution, SELECT_OPEN_EXECUTIONS, limit)
            }
        }
    }

    /// How many executions are in each status: every status of
    /// [`ExecutionStatus::ALL`], in that order, zeros included, so a metrics
    /// gauge can be set without remembering which statuses it saw before.
    pub async fn count_executions_by_status(
        &self,
    ) -> Result<Vec<(ExecutionStatus, i64)>, StoreError> {
        let op = "count executions by status";
        let rows: Vec<(String, i64)> = match self {
            Store::Sqlite(pool) => sqlx::query_as(COUNT_BY_STATUS).fetch_all(pool).await,
            Store::Postgres(pool) => sqlx::query_as(COUNT_BY_STATUS).fetch_all(pool).await,
        }
        .map_err(StoreError::query(op))?;
        let mut counts: Vec<(ExecutionStatus, i64)> =
            ExecutionStatus::ALL.iter().map(|&s| (s, 0)).collect();
        for (text, n) in rows {
            let status = ExecutionStatus::parse(&text).ok_or_else(|| StoreError::Decode {
                table: "executions",
                id: "*".to_string(),
                column: "status",
                message: format!("unknown status {text:?}"),
            })?;
            if let Some(slot) = counts.iter_mut().find(|(s, _)| *s == status) {
                slot.1 += n;
            }
        }
        Ok(counts)
    }

    /// One page of executions matching `filter`, ordered by (requested_at,
    /// id), ascending unless `newest_first`; pass the last row's
    /// (requested_at, id) as `after` for the next.
    pub async fn list_executions(
        &self,
        filter: &ExecutionFilter,
    ) -> Result<Vec<Execution>, StoreError> {
        let mut conditions: Vec<String> = Vec::new();
        let mut binds: Vec<Bind> = Vec::new();
        // Only placeholders and fixed text are spliced in; every value is bound.
        fn placeholder(bind: Bind, binds: &mut Vec<Bind>) -> String {
            binds.push(bind);
            format!("${}", binds.len())
        }
        if let Some(id) = filter.branch_rule_id {
            let p = placeholder(Bind::Text(id_text(id)), &mut binds);
            conditions.push(format!("branch_rule_id = {p}"));
        }
        if let Some(status) = filter.status {
            let p = placeholder(Bind::Text(status.as_str().to_string()), &mut binds);
            // The status is bound, so the planner cannot tell which partial
            // index holds it; the fixed term tells it.
            let finished = if status.is_terminal() {
                open_execution!(NOT)
            } else {
                open_execution!()
            };
            conditions.push(format!("status = {p} AND {finished}"));
        }
        if let Some(from) = filter.from {
            let p = placeholder(Bind::Int(from), &mut binds);
            conditions.push(format!("requested_at >= {p}"));
        }
        if let Some(to) = filter.to {
            let p = placeholder(Bind::Int(to), &mut binds);
            conditions.push(format!("requested_at < {p}"));
        }
        if let Some((at, id)) = filter.after {
            let p_at = placeholder(Bind::Int(at), &mut binds);
            let p_id = placeholder(Bind::Text(id_text(id)), &mut binds);
            // Written so both planners can range-scan (requested_at, id).
            conditions.push(if filter.newest_first {
                format!("requested_at <= {p_at} AND (requested_at < {p_at} OR id < {p_id})")
            } else {
                format!("requested_at >= {p_at} AND (requested_at > {p_at} OR id > {p_id})")
            });
        }
        let p_limit = placeholder(Bind::Int(filter.limit.max(0)), &mut binds);
        let mut sql = format!("SELECT {} FROM executions", execution_columns!());
        if !conditions.is_empty() {
            sql.push_str(" WHERE ");
            sql.push_str(&conditions.join(" AND "));
        }
        let order = if filter.newest_first {
            "requested_at DESC, id DESC"
        } else {
            "requested_at, id"
        };
        sql.push_str(&format!(" ORDER BY {order} LIMIT {p_limit}"));

        fetch_bound!(self, "list executions", decode_execution, sql, binds)
    }

    /// Crash recovery and takeover, in one transaction: every non-terminal
    /// execution owned by `holder` becomes Failed (`worker_lost`, finished
    /// at `now`), and every branch rule it holds is unlocked and no longer
    /// running. next_run_time is untouched, so the occurrence is claimed
    /// again as a new attempt. Returns the executions it failed.
    pub async fn recover_owner(
        &self,
        holder: &str,
        now: Millis,
    ) -> Result<Vec<Execution>, StoreError> {
        Ok(self
            .recover_owner_guarded(holder, None, now)
            .await?
            .unwrap_or_default())
    }

    /// [`Store::recover_owner`] for a takeover: only if `holder` is still
    /// silent for `silence_ms` on the database's clock when the
    /// transaction runs (`None` otherwise, and nothing is changed). Its
    /// `instances` row is locked first, so its heartbeat cannot land
    /// between the check and the release: an owner that came back after
    /// it was listed stale keeps what it holds.
    pub async fn recover_silent_owner(
        &self,
        holder: &str,
        silence_ms: Millis,
        now: Millis,
    ) -> Result<Option<Vec<Execution>>, StoreError> {
        self.recover_owner_guarded(holder, Some(silence_ms), now)
            .await
    }

    async fn recover_owner_guarded(
        &self,
        holder: &str,
        silent_for_ms: Option<Millis>,
        now: Millis,
    ) -> Result<Option<Vec<Execution>>, StoreError> {
        macro_rules! recover {
            ($tx:ident, $still_silent:expr) => {{
                if let Some(silence_ms) = silent_for_ms {
                    let silent: Option<String> = sqlx::query_scalar($still_silent)
                        .bind(holder)
                        .bind(silence_ms)
                        .fetch_optional(&mut *$tx)
                        .await
                        .map_err(StoreError::query("check owner still silent"))?;
                    if silent.is_none() {
                        $tx.rollback()
                            .await
                            .map_err(StoreError::query("rollback recover_owner"))?;
                        return Ok(None);
                    }
                }
                execute_on!(
                    &mut *$tx,
                    "release owner locks",
                    RELEASE_OWNER_LOCKS,
                    holder,
                    now
                )?;
                let failed = fetch_all_on!(
                    &mut *$tx,
                    "fail owner executions",
                    decode_execution,
                    FAIL_OWNER_EXECUTIONS,
                    holder,
                    now,
                    WORKER_LOST
                )?;
                $tx.commit()
                    .await
                    .map_err(StoreError::query("commit recover_owner"))?;
                Ok(Some(failed))
            }};
        }
        match self {
            Store::Sqlite(pool) => {
                let mut tx = super::claims::begin_sqlite_write(pool, "begin recover_owner").await?;
                recover!(tx, STILL_SILENT.sqlite)
            }
            Store::Postgres(pool) => {
                let mut tx = pool
                    .begin()
                    .await
                    .map_err(StoreError::query("begin recover_owner"))?;
                recover!(tx, STILL_SILENT.postgres)
            }
        }
    }

    /// The execution of `branch_rule_id` still in flight, wherever it runs.
    pub async fn open_execution_of(
        &self,
        branch_rule_id: Uuid,
    ) -> Result<Option<Execution>, StoreError> {
        let rows = fetch_all!(
            self,
            "select open execution",
            decode_execution,
            OPEN_EXECUTION_OF,
            id_text(branch_rule_id)
        )?;
        Ok(rows.into_iter().next())
    }

    /// Gives back claims made ahead of their due time whose jobs never
    /// started (MASTER_CLAIM_LEAD_SECONDS; a graceful stop or a memory
    /// throttle before they fell due): each lock is freed and its
    /// `requested` execution deleted, fenced like every write after the
    /// claim. Nothing ran and nothing was yet due, so nothing is recorded
    /// as an attempt: each occurrence is claimed again, here after a
    /// restart or by another instance, as the attempt it would have been.
    /// In commits of [`WITHDRAWALS_PER_TRANSACTION`], so a stop with
    /// hundreds of claims made ahead gives them back in a few. Each claim
    /// is withdrawn whole or not at all (a savepoint apiece): one no
    /// longer this instance's (taken over) or whose execution moved on is
    /// left as it was, answered `false`, and the caller records it
    /// Cancelled as any claim given back. The answer is in the order
    /// given; the rows are locked in branch rule id order, as every other
    /// write that locks several takes them.
    pub async fn withdraw_claims(
        &self,
        fences: &[Fence],
        now: Millis,
    ) -> Result<Vec<bool>, StoreError> {
        macro_rules! withdraw {
            ($pool:expr) => {{
                let mut withdrawn = vec![false; fences.len()];
                let mut in_lock_order: Vec<usize> = (0..fences.len()).collect();
                in_lock_order.sort_by_key(|&index| fences[index].branch_rule_id);
                for transaction in in_lock_order.chunks(WITHDRAWALS_PER_TRANSACTION) {
                    let mut tx = $pool
                        .begin()
                        .await
                        .map_err(StoreError::query("begin withdraw claims"))?;
                    let mut any = false;
                    for &index in transaction {
                        let fence = &fences[index];
                        let mut one = tx
                            .begin()
                            .await
                            .map_err(StoreError::query("withdraw claim: savepoint"))?;
                        // Branch rules first, then executions, as claims lock them.
                        let freed = execute_on!(
                            &mut *one,
                            "withdraw claim: free the lock",
                            FREE_WITHDRAWN_LOCK,
                            id_text(fence.branch_rule_id),
                            fence.holder.clone(),
                            fence.epoch,
                            now
                        )?;
                        let deleted = if freed == 1 {
                            execute_on!(
                                &mut *one,
                                "withdraw claim: delete the requested execution",
                                DELETE_WITHDRAWN_EXECUTION,
                                id_text(fence.execution_id),
                                fence.holder.clone()
                            )?
                        } else {
                            0
                        };
                        let whole = freed == 1 && deleted == 1;
                        if whole {
                            one.commit()
                                .await
                                .map_err(StoreError::query("withdraw claim: release savepoint"))?;
                        } else {
                            one.rollback().await.map_err(StoreError::query(
                                "withdraw claim: roll back to savepoint",
                            ))?;
                        }
                        withdrawn[index] = whole;
                        any |= whole;
                    }
                    if any {
                        tx.commit()
                            .await
                            .map_err(StoreError::query("commit withdraw claims"))?;
                    }
                }
                Ok(withdrawn)
            }};
        }
        match self {
            Store::Sqlite(pool) => withdraw!(pool),
            Store::Postgres(pool) => withdraw!(pool),
        }
    }

    /// Sets or clears a branch rule's force stop. `false` when no such rule.
    pub async fn set_force_stopped(
        &self,
        branch_rule_id: Uuid,
        stopped: bool,
        now: Millis,
    ) -> Result<bool, StoreError> {
        execute!(
            self,
            "set branch_rule force stop",
            SET_FORCE_STOPPED,
            id_text(branch_rule_id),
            stopped,
            now
        )
        .map(|n| n == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_whole_characters() {
        assert_eq!(truncate_utf8("abc", 5), "abc");
        assert_eq!(truncate_utf8("aé", 2), "a");
        assert_eq!(truncate_utf8("aé", 3), "aé");
    }

    #[test]
    fn large_outputs_are_summarised_as_valid_json() {
        let big = Value::String("x".repeat(OUTPUT_CAP_BYTES + 10));
        let text = output_text(Some(&big)).unwrap();
        let summary: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(summary["truncated"], true);
        assert!(text.len() < OUTPUT_CAP_BYTES);
        let small = serde_json::json!({"ok": 1});
        assert_eq!(output_text(Some(&small)).unwrap(), r#"{"ok":1}"#);
        assert_eq!(output_text(None), None);
    }
}
