//! Set-based statements for the batcher: the transitions of one kind in a
//! batch run as one statement per chunk instead of one statement each.
//!
//! A statement is a round trip to the server (PostgreSQL) or a hand-over to
//! another thread (SQLite, see `direct`); at thousands of transitions a
//! second those, not the writes, are the cost. The statements are written
//! once, for any [`GroupedConn`]. Each row still carries its own fence and
//! status guard in the join, and RETURNING tells which rows matched, so
//! every caller gets exactly the answer the one-statement path (`claims`)
//! gives it.
//!
//! Statements are built from fixed text and placeholders only; every value
//! is bound. SQLite reads the rows from `VALUES` with a placeholder a value,
//! in chunks of power-of-two sizes so each connection's statement cache
//! holds a handful of shapes; PostgreSQL reads them from one array a column
//! (`UNNEST`), one prepared statement a kind whatever the batch size.

use std::collections::{HashMap, HashSet};

use uuid::Uuid;

use super::StoreError;
use super::batch::{Released, Transition, TransitionOutcome};
use super::binds::{Bind, bound_query};
use super::decode::{AnyRow, RowReader, id_text};
use super::executions::{
    branch_rule_columns, decode_execution, error_text, execution_columns, lock_held_by,
    open_execution, open_statuses, output_text, touch_branch_rule,
};
use super::workflows::decode_branch_rule;
use crate::lifecycle::{
    Claim, ClaimRequest, Fence, Finish, RetryUpdate, SkipRequest, SkippedOccurrence,
    new_execution_id,
};
use crate::model::{BranchRule, Millis};

pub(super) type ItemResult = Result<TransitionOutcome, StoreError>;

/// How a backend cuts a round into statements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Chunking {
    /// Placeholders a value (`VALUES`): the text changes with the row
    /// count, so chunk sizes are powers of two up to `max`, and each
    /// connection's statement cache holds a handful of shapes.
    PowersOfTwo { max: usize },
    /// Placeholders a column (`UNNEST` of arrays): one text whatever the
    /// row count, so a round goes in as few statements as `max` allows.
    Whole { max: usize },
}

/// The rows of one set-based statement, row after row, `columns` values
/// each: the table `v` its text reads from.
pub(super) struct Table {
    binds: Vec<Bind>,
    columns: usize,
}

impl Table {
    fn rows(&self) -> usize {
        self.binds.len() / self.columns
    }
}

/// The branch rule a transition touches; transitions of different branch
/// rules never touch the same row.
pub(super) fn branch_rule_of(transition: &Transition) -> Uuid {
    match transition {
        Transition::Claim(req) => req.branch_rule_id,
        Transition::Scheduled { fence, .. }
        | Transition::Running { fence, .. }
        | Transition::RenewLock { fence, .. }
        | Transition::Finish { fence, .. } => fence.branch_rule_id,
    }
}

/// Splits the `indices` of a batch into rounds holding at most one
/// transition per branch rule, in arrival order: within a round no two
/// transitions touch the same row, so they may run in any grouping; rounds
/// run one after another, so two transitions of one rule (a finish, then a
/// claim) keep their order.
pub(super) fn rounds(
    transitions: &[&Transition],
    indices: impl Iterator<Item = usize>,
) -> Vec<Vec<usize>> {
    let mut seen: HashMap<Uuid, usize> = HashMap::new();
    let mut rounds: Vec<Vec<usize>> = Vec::new();
    for index in indices {
        let round = seen.entry(branch_rule_of(transitions[index])).or_insert(0);
        if rounds.len() <= *round {
            rounds.push(Vec::new());
        }
        rounds[*round].push(index);
        *round += 1;
    }
    rounds
}

/// Each Running that follows its own execution's Scheduled with nothing of
/// its rule in between (the worker queues it right behind the master's),
/// by the index of that Scheduled. One update takes the row through both:
/// the batch commits both or neither, so nobody could see the step
/// between, and the row is written once instead of twice.
fn running_after_scheduled(transitions: &[&Transition]) -> HashMap<usize, usize> {
    let mut last_of_rule: HashMap<Uuid, usize> = HashMap::new();
    let mut pairs = HashMap::new();
    for (index, transition) in transitions.iter().enumerate() {
        let rule = branch_rule_of(transition);
        if let (Transition::Running { fence, .. }, Some(&before)) =
            (transition, last_of_rule.get(&rule))
            && let Transition::Scheduled {
                fence: scheduled, ..
            } = transitions[before]
            && scheduled == fence
        {
            pairs.insert(before, index);
        }
        last_of_rule.insert(rule, index);
    }
    pairs
}

/// `indices` cut into chunks as `chunking` says, largest first.
pub(super) fn chunks(indices: &[usize], chunking: Chunking) -> Vec<&[usize]> {
    let mut out = Vec::new();
    let mut rest = indices;
    while !rest.is_empty() {
        let size = match chunking {
            Chunking::PowersOfTwo { max } => max.min(1 << rest.len().ilog2()),
            Chunking::Whole { max } => max.min(rest.len()),
        };
        let (chunk, tail) = rest.split_at(size);
        out.push(chunk);
        rest = tail;
    }
    out
}

/// `($1, $2), ($3, $4)` for `rows` rows of `columns` placeholders.
pub(super) fn values(rows: usize, columns: usize) -> String {
    let mut text = String::with_capacity(rows * columns * 5);
    for row in 0..rows {
        if row > 0 {
            text.push_str(", ");
        }
        text.push('(');
        for column in 0..columns {
            if column > 0 {
                text.push_str(", ");
            }
            text.push('$');
            text.push_str(&(row * columns + column + 1).to_string());
        }
        text.push(')');
    }
    text
}

/// A step of an execution's lifecycle [`mark_sql`] writes: from one status
/// to the next, with the times `v` carries after the fence and the columns
/// set from them.
pub(super) struct Step {
    from: &'static str,
    to: &'static str,
    times: &'static str,
    sets: &'static str,
}

const SCHEDULED: Step = Step {
    from: "requested",
    to: "scheduled",
    times: "now",
    sets: "scheduled_at = v.now, updated_at = v.now",
};

const RUNNING: Step = Step {
    from: "scheduled",
    to: "running",
    times: "now",
    sets: "started_at = v.now, updated_at = v.now",
};

/// A Scheduled and the Running right behind it in one batch, as one write
/// of the row: see [`running_after_scheduled`].
pub(super) const SCHEDULED_AND_RUNNING: Step = Step {
    from: "requested",
    to: "running",
    times: "s_now, r_now",
    sets: "scheduled_at = v.s_now, started_at = v.r_now, updated_at = v.r_now",
};

/// Requested → Scheduled, Scheduled → Running, or both at once, as `step`
/// says; the execution's own owner and epoch tie it to the claim and the
/// branch rule's tie the claim to the present.
pub(super) fn mark_sql(step: &Step, v: &str) -> String {
    let Step {
        from,
        to,
        times,
        sets,
    } = step;
    format!(
        "WITH v(id, br, holder, epoch, {times}) AS ({v}) \
         UPDATE executions SET status = '{to}', {sets} FROM v \
         WHERE executions.id = v.id AND executions.branch_rule_id = v.br \
         AND executions.owner = v.holder AND executions.lock_epoch = v.epoch \
         AND executions.status = '{from}' \
         AND EXISTS (SELECT 1 FROM branch_rules b \
         WHERE b.id = v.br AND {} AND b.lock_epoch = v.epoch) \
         RETURNING executions.id",
        lock_held_by!("b.", "v.holder")
    )
}

pub(super) fn renew_sql(v: &str) -> String {
    format!(
        "WITH v(br, holder, epoch, now) AS ({v}) \
         UPDATE branch_rules SET lock_time = v.now, {} FROM v \
         WHERE branch_rules.id = v.br AND {} \
         AND branch_rules.lock_epoch = v.epoch RETURNING branch_rules.id",
        touch_branch_rule!("v.now"),
        lock_held_by!("branch_rules.", "v.holder")
    )
}

/// A lock nobody stands behind (seed 001's stale-lock release): no time,
/// not renewed for longer than the timeout, or stamped further ahead than
/// the timeout (a bad row, a clock far off: honoured, it would hold the
/// rule until that time). The plan reads a lock the same way
/// (`plan::lock_is_stale`), so it offers exactly the rules a claim takes.
macro_rules! lock_is_stale {
    ($table:literal, $now:literal, $timeout:literal) => {
        concat!(
            "(",
            $table,
            "lock_time IS NULL OR ",
            $table,
            "lock_time < ",
            $now,
            " - ",
            $timeout,
            " OR ",
            $table,
            "lock_time > ",
            $now,
            " + ",
            $timeout,
            ")"
        )
    };
}

/// The claim of seed 001, plus the epoch that fences every later write:
/// the rule is due (or run now) and runnable, and its lock free or stale
/// ([`lock_is_stale!`]). Rows are taken in id order and, on PostgreSQL, rows another
/// transaction holds are skipped rather than waited for. RETURNING gives
/// the row after the claim (its due time, its new epoch) without a second
/// read; `touch_branch_rule!` is what makes it exact on SQLite too. With
/// `previous_holder` it also returns the holder of each lock it took (NULL
/// when the lock was free), as `c` read it before the update: see
/// [`GroupedConn::CLAIM_RETURNS_PREVIOUS_HOLDER`].
fn claim_sql(v: &str, row_lock: &str, previous_holder: bool) -> String {
    let (read_previous, return_previous) = if previous_holder {
        (", b.lock_holder AS previous_holder", ", c.previous_holder")
    } else {
        ("", "")
    };
    format!(
        "WITH v(br, holder, now, timeout, run_now, due_by) AS ({v}), \
         c AS (SELECT b.id AS cid{read_previous} FROM branch_rules b JOIN v ON b.id = v.br \
         WHERE b.is_active AND NOT b.is_archived AND NOT b.is_force_stopped \
         AND (v.run_now OR b.next_run_time <= v.due_by) \
         AND (b.lock_holder IS NULL OR {}) \
         ORDER BY b.id{row_lock}) \
         UPDATE branch_rules SET lock_holder = v.holder, lock_time = v.now, \
         lock_epoch = lock_epoch + 1, is_currently_running = TRUE, {} FROM v, c \
         WHERE branch_rules.id = c.cid AND v.br = c.cid \
         RETURNING {}{return_previous}",
        lock_is_stale!("b.", "v.now", "v.timeout"),
        touch_branch_rule!("v.now"),
        branch_rule_columns!()
    )
}

/// The claims of a chunk that would take a lock from its holder (held,
/// but stale): the taker closes what that holder left
/// open. Rare, so a cheap look by primary key first, where the claim
/// cannot say it itself.
fn expired_locks_sql(v: &str) -> String {
    format!(
        "WITH v(br, now, timeout) AS ({v}) \
         SELECT b.id AS id, b.lock_holder AS previous_holder FROM branch_rules b JOIN v ON b.id = v.br \
         WHERE b.lock_holder IS NOT NULL AND {}",
        lock_is_stale!("b.", "v.now", "v.timeout")
    )
}

/// The attempt a lost lock left open is Failed by the instance that takes
/// the occurrence over: no execution stays open, and the reason says who
/// took it.
fn close_taken_over_sql(v: &str) -> String {
    format!(
        "WITH v(br, previous, now, taker) AS ({v}) \
         UPDATE executions SET status = 'failed', finished_at = v.now, updated_at = v.now, \
         error = 'lock_lost: the claim of ' || v.previous || ' expired; taken over by ' || v.taker \
         FROM v WHERE executions.owner = v.previous AND executions.branch_rule_id = v.br \
         AND executions.{} AND executions.status IN {} RETURNING executions.id",
        open_execution!(),
        open_statuses!()
    )
}

/// Only the claimer of the occurrence inserts, under the branch rule's row
/// lock, so max(attempt) + 1 cannot race (the unique key backs that up);
/// one round holds one claim per branch rule, so the attempts computed in
/// one statement cannot collide.
pub(super) fn insert_sql(v: &str) -> String {
    format!(
        "WITH v(id, br, sf, holder, epoch, now) AS ({v}) \
         INSERT INTO executions (id, branch_rule_id, scheduled_for, status, attempt, owner, \
         lock_epoch, requested_at, created_at, updated_at) \
         SELECT v.id, v.br, v.sf, 'requested', \
         (SELECT COALESCE(MAX(e.attempt), 0) + 1 FROM executions e \
         WHERE e.branch_rule_id = v.br AND e.scheduled_for = v.sf), \
         v.holder, v.epoch, v.now, v.now, v.now FROM v RETURNING {}",
        execution_columns!()
    )
}

/// First step of the post-process: it takes PostgreSQL's row lock on the
/// branch rule, so nobody can take the lock over before the transaction
/// ends, and the execution update after it needs no further fence. The
/// pending retry is set as the finish's [`RetryUpdate`] says: `r_keep`
/// leaves it, otherwise it becomes `r_of` / `r_failed` (NULL / 0 to clear).
pub(super) fn release_sql(v: &str) -> String {
    format!(
        "WITH v(br, holder, epoch, advance, fin, nrt, r_keep, r_of, r_failed, n_clear) AS ({v}) \
         UPDATE branch_rules SET \
         last_run_time = CASE WHEN v.advance THEN v.fin ELSE last_run_time END, \
         next_run_time = CASE WHEN v.n_clear THEN NULL ELSE COALESCE(v.nrt, next_run_time) END, \
         retry_of = CASE WHEN v.r_keep THEN retry_of ELSE v.r_of END, \
         failed_attempts = CASE WHEN v.r_keep THEN failed_attempts ELSE v.r_failed END, \
         is_currently_running = FALSE, lock_holder = NULL, lock_time = NULL, {} FROM v \
         WHERE branch_rules.id = v.br AND {} \
         AND branch_rules.lock_epoch = v.epoch RETURNING {}",
        touch_branch_rule!("v.fin"),
        lock_held_by!("branch_rules.", "v.holder"),
        branch_rule_columns!()
    )
}

/// The execution to its terminal state, for executions whose branch rule
/// was just released in this transaction. 0 rows means it was already
/// terminal (a cancel through the API): terminal states are final.
pub(super) fn finish_sql(v: &str) -> String {
    format!(
        "WITH v(id, br, holder, epoch, o_status, o_at, o_error, o_output) AS ({v}) \
         UPDATE executions SET status = v.o_status, finished_at = v.o_at, error = v.o_error, \
         output = v.o_output, updated_at = v.o_at FROM v \
         WHERE executions.id = v.id AND executions.branch_rule_id = v.br \
         AND executions.owner = v.holder AND executions.lock_epoch = v.epoch \
         AND executions.status IN {}",
        open_statuses!()
    )
}

/// Skipped executions (terminal at once: finished_at set, never open),
/// each the next attempt of its occurrence, unless that occurrence already
/// has a skipped one: a redelivered finish or a repeated skip records it
/// once. The caller holds the branch rule (its fence, or the compare-and-set
/// of [`SKIP_SQL`]) and gives at most one row per occurrence.
pub(super) fn skipped_sql(v: &str) -> String {
    format!(
        "WITH v(id, br, sf, holder, epoch, at, err) AS ({v}) \
         INSERT INTO executions (id, branch_rule_id, scheduled_for, status, attempt, owner, \
         lock_epoch, requested_at, finished_at, error, created_at, updated_at) \
         SELECT v.id, v.br, v.sf, 'skipped', \
         (SELECT COALESCE(MAX(e.attempt), 0) + 1 FROM executions e \
         WHERE e.branch_rule_id = v.br AND e.scheduled_for = v.sf), \
         v.holder, v.epoch, v.at, v.at, v.err, v.at, v.at FROM v \
         WHERE NOT EXISTS (SELECT 1 FROM executions e WHERE e.branch_rule_id = v.br \
         AND e.scheduled_for = v.sf AND e.status = 'skipped')",
    )
}

/// The master's misfire decision ([`SkipRequest`]): a compare-and-set of
/// next_run_time on a branch rule with no retry pending and no live lock
/// (free, or stale, as a claim sees it).
const SKIP_SQL: &str = concat!(
    "UPDATE branch_rules SET next_run_time = $3, ",
    touch_branch_rule!("$4"),
    " WHERE id = $1 AND next_run_time = $2 AND retry_of IS NULL \
     AND (lock_holder IS NULL OR ",
    lock_is_stale!("", "$4", "$5"),
    ") RETURNING ",
    branch_rule_columns!()
);

/// One skipped execution to insert.
struct SkipRow {
    id: Uuid,
    branch_rule_id: Uuid,
    scheduled_for: Millis,
    owner: String,
    lock_epoch: i64,
    at: Millis,
    error: Option<String>,
}

/// The rows for `skipped` of one branch rule, one per occurrence (the
/// first entry wins), all recorded at `at` by `owner` under `lock_epoch`.
fn skip_rows(
    branch_rule_id: Uuid,
    owner: &str,
    lock_epoch: i64,
    at: Millis,
    skipped: &[SkippedOccurrence],
) -> Vec<SkipRow> {
    let mut seen = HashSet::with_capacity(skipped.len());
    skipped
        .iter()
        .filter(|skip| seen.insert(skip.scheduled_for))
        .map(|skip| SkipRow {
            id: new_execution_id(at),
            branch_rule_id,
            scheduled_for: skip.scheduled_for,
            owner: owner.to_string(),
            lock_epoch,
            at,
            error: error_text(Some(&skip.error())),
        })
        .collect()
}

/// Inserts the skipped executions, a chunk to a statement.
async fn insert_skipped<C: GroupedConn>(conn: &mut C, rows: &[SkipRow]) -> Result<(), StoreError> {
    let indices: Vec<usize> = (0..rows.len()).collect();
    for part in chunks(&indices, C::CHUNKING) {
        let mut binds = Vec::with_capacity(part.len() * 7);
        for &index in part {
            let row = &rows[index];
            binds.extend([
                Bind::Text(id_text(row.id)),
                Bind::Text(id_text(row.branch_rule_id)),
                Bind::Int(row.scheduled_for),
                Bind::Text(row.owner.clone()),
                Bind::Int(row.lock_epoch),
                Bind::Int(row.at),
                Bind::OptText(row.error.clone()),
            ]);
        }
        let table = Table { binds, columns: 7 };
        let sql = skipped_sql(&C::rows_of(&table));
        conn.fetch_table("insert skipped executions", sql, table)
            .await?;
    }
    Ok(())
}

/// [`Store::skip_occurrences`](super::Store::skip_occurrences) on one
/// connection, inside a write transaction the caller owns and commits
/// when this returns a row.
pub(super) async fn skip_occurrences<C: GroupedConn>(
    conn: &mut C,
    req: &SkipRequest,
) -> Result<Option<BranchRule>, StoreError> {
    let binds = vec![
        Bind::Text(id_text(req.branch_rule_id)),
        Bind::Int(req.expected_next_run_time),
        Bind::Int(req.next_run_time),
        Bind::Int(req.now),
        Bind::Int(req.lock_timeout_ms),
    ];
    let op = "skip occurrences";
    let rows = conn.fetch(op, SKIP_SQL.to_string(), binds).await?;
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let rule = decode_branch_rule(row)?;
    let skips = skip_rows(rule.id, &req.holder, rule.lock_epoch, req.now, &req.skipped);
    insert_skipped(conn, &skips).await?;
    Ok(Some(rule))
}

fn fence_and_now(transition: &Transition) -> (&Fence, i64) {
    match transition {
        Transition::Scheduled { fence, now }
        | Transition::Running { fence, now }
        | Transition::RenewLock { fence, now } => (fence, *now),
        other => unreachable!("not a fenced mark: {other:?}"),
    }
}

fn claim_request(transition: &Transition) -> &ClaimRequest {
    match transition {
        Transition::Claim(req) => req,
        other => unreachable!("not a claim: {other:?}"),
    }
}

fn fence_and_finish(transition: &Transition) -> (&Fence, &Finish) {
    match transition {
        Transition::Finish { fence, finish } => (fence, finish),
        other => unreachable!("not a finish: {other:?}"),
    }
}

/// The transitions of one round, by kind.
#[derive(Default)]
pub(super) struct Round {
    pub(super) claims: Vec<usize>,
    pub(super) scheduled: Vec<usize>,
    pub(super) running: Vec<usize>,
    pub(super) renewals: Vec<usize>,
    pub(super) finishes: Vec<usize>,
}

/// Sorts one round by kind; a finish with a non-terminal status is
/// answered at once (nothing to write) and left out.
pub(super) fn sort_round(
    transitions: &[&Transition],
    indices: &[usize],
    results: &mut [Option<ItemResult>],
) -> Round {
    let mut round = Round::default();
    for &index in indices {
        match transitions[index] {
            Transition::Claim(_) => round.claims.push(index),
            Transition::Scheduled { .. } => round.scheduled.push(index),
            Transition::Running { .. } => round.running.push(index),
            Transition::RenewLock { .. } => round.renewals.push(index),
            Transition::Finish { finish, .. } if !finish.status.is_terminal() => {
                results[index] = Some(Err(super::claims::not_terminal(finish)));
            }
            Transition::Finish { .. } => round.finishes.push(index),
        }
    }
    round
}

/// A connection the set-based statements run on: PostgreSQL's through
/// sqlx, or the SQLite writer's direct handle (`direct`). Each call runs
/// one statement and returns its rows.
pub(super) trait GroupedConn {
    type Row: AnyRow;

    /// How a claim locks the rows it is about to take: PostgreSQL skips
    /// rows another transaction holds (so claims of several instances never
    /// wait on each other, let alone deadlock); SQLite has one writer.
    const CLAIM_ROW_LOCK: &'static str;

    /// Whether the claim's `RETURNING` can name the holder each lock was
    /// taken from, saving the look-up before it ([`expired_locks_sql`]): a
    /// round trip for every batch of claims on PostgreSQL. SQLite's
    /// `RETURNING` may name only the updated table's columns.
    const CLAIM_RETURNS_PREVIOUS_HOLDER: bool = false;

    const CHUNKING: Chunking = Chunking::PowersOfTwo { max: 64 };

    async fn fetch(
        &mut self,
        op: &'static str,
        sql: String,
        binds: Vec<Bind>,
    ) -> Result<Vec<Self::Row>, StoreError>;

    /// The text of `table` as the rows of a `WITH v(…) AS (…)`.
    fn rows_of(table: &Table) -> String {
        format!("VALUES {}", values(table.rows(), table.columns))
    }

    /// Runs `sql`, which reads `table` through [`GroupedConn::rows_of`].
    async fn fetch_table(
        &mut self,
        op: &'static str,
        sql: String,
        table: Table,
    ) -> Result<Vec<Self::Row>, StoreError> {
        self.fetch(op, sql, table.binds).await
    }
}

/// sqlx's own connections: the one-transition path (`claims`) on both
/// backends and the batcher on PostgreSQL.
macro_rules! sqlx_grouped_conn {
    ($conn:ty, $row:ty, $row_lock:expr $(, $extra:item)*) => {
        impl GroupedConn for $conn {
            type Row = $row;
            const CLAIM_ROW_LOCK: &'static str = $row_lock;

            async fn fetch(
                &mut self,
                op: &'static str,
                sql: String,
                binds: Vec<Bind>,
            ) -> Result<Vec<Self::Row>, StoreError> {
                bound_query!(sql, binds)
                    .fetch_all(self)
                    .await
                    .map_err(StoreError::query(op))
            }

            $($extra)*
        }
    };
}

sqlx_grouped_conn!(sqlx::SqliteConnection, sqlx::sqlite::SqliteRow, "");

// PostgreSQL reads a statement's rows from one array a column (`UNNEST`):
// the text is the same for any number of rows, so each kind of transition
// is prepared once per connection and a whole round goes in one
// statement, where `VALUES` took a statement a power of two and a parse
// for every new shape.
sqlx_grouped_conn!(
    sqlx::PgConnection,
    sqlx::postgres::PgRow,
    " FOR UPDATE OF b SKIP LOCKED",
    const CLAIM_RETURNS_PREVIOUS_HOLDER: bool = true;,
    const CHUNKING: Chunking = Chunking::Whole { max: 4096 };,
    fn rows_of(table: &Table) -> String {
        let arrays: Vec<String> = table.binds[..table.columns]
            .iter()
            .enumerate()
            .map(|(column, bind)| format!("${}::{}[]", column + 1, array_type(bind)))
            .collect();
        format!("SELECT * FROM UNNEST({})", arrays.join(", "))
    },
    async fn fetch_table(
        &mut self,
        op: &'static str,
        sql: String,
        table: Table,
    ) -> Result<Vec<Self::Row>, StoreError> {
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for column in columns_of(table) {
            query = match column {
                Column::Texts(values) => query.bind(values),
                Column::Ints(values) => query.bind(values),
                Column::Bools(values) => query.bind(values),
            };
        }
        query.fetch_all(self).await.map_err(StoreError::query(op))
    }
);

/// PostgreSQL's array type for a column whose first value is `bind`.
fn array_type(bind: &Bind) -> &'static str {
    match bind {
        Bind::Text(_) | Bind::OptText(_) => "text",
        Bind::Int(_) | Bind::OptInt(_) => "int8",
        Bind::Bool(_) => "bool",
    }
}

/// One column of a [`Table`], as the array PostgreSQL unnests.
#[derive(Debug, PartialEq)]
enum Column {
    Texts(Vec<Option<String>>),
    Ints(Vec<Option<i64>>),
    Bools(Vec<bool>),
}

/// The table's values column by column. Every row has its column's type:
/// the rows come from one `row_binds` closure.
fn columns_of(table: Table) -> Vec<Column> {
    let rows = table.rows();
    let mut columns: Vec<Column> = table.binds[..table.columns]
        .iter()
        .map(|bind| match bind {
            Bind::Text(_) | Bind::OptText(_) => Column::Texts(Vec::with_capacity(rows)),
            Bind::Int(_) | Bind::OptInt(_) => Column::Ints(Vec::with_capacity(rows)),
            Bind::Bool(_) => Column::Bools(Vec::with_capacity(rows)),
        })
        .collect();
    for (index, bind) in table.binds.into_iter().enumerate() {
        match (&mut columns[index % table.columns], bind) {
            (Column::Texts(values), Bind::Text(value)) => values.push(Some(value)),
            (Column::Texts(values), Bind::OptText(value)) => values.push(value),
            (Column::Ints(values), Bind::Int(value)) => values.push(Some(value)),
            (Column::Ints(values), Bind::OptInt(value)) => values.push(value),
            (Column::Bools(values), Bind::Bool(value)) => values.push(value),
            (column, bind) => unreachable!("a {bind:?} in a column of {column:?}"),
        }
    }
    columns
}

/// Runs every transition of a batch with set-based statements on one
/// connection, inside a transaction the caller owns. `Err` means a
/// statement failed: the transaction must be rolled back, and the caller
/// finds the culprit by running the transitions one by one.
pub(super) async fn apply_grouped<C: GroupedConn>(
    conn: &mut C,
    transitions: &[&Transition],
) -> Result<Vec<ItemResult>, StoreError> {
    let mut results: Vec<Option<ItemResult>> = transitions.iter().map(|_| None).collect();
    let then_running = running_after_scheduled(transitions);
    let joined: HashSet<usize> = then_running.values().copied().collect();
    let alone = (0..transitions.len()).filter(|index| !joined.contains(index));
    for indices in rounds(transitions, alone) {
        let round = sort_round(transitions, &indices, &mut results);
        for chunk in chunks(&round.claims, C::CHUNKING) {
            claim_many(conn, transitions, chunk, &mut results).await?;
        }
        let (paired, alone): (Vec<usize>, Vec<usize>) = round
            .scheduled
            .iter()
            .partition(|index| then_running.contains_key(index));
        for chunk in chunks(&alone, C::CHUNKING) {
            mark_many(conn, &SCHEDULED, transitions, chunk, &mut results).await?;
        }
        for chunk in chunks(&paired, C::CHUNKING) {
            mark_through_running(conn, transitions, chunk, &then_running, &mut results).await?;
        }
        for chunk in chunks(&round.running, C::CHUNKING) {
            mark_many(conn, &RUNNING, transitions, chunk, &mut results).await?;
        }
        for chunk in chunks(&round.renewals, C::CHUNKING) {
            renew_many(conn, transitions, chunk, &mut results).await?;
        }
        for chunk in chunks(&round.finishes, C::CHUNKING) {
            finish_many(conn, transitions, chunk, &mut results).await?;
        }
    }
    Ok(results
        .into_iter()
        .map(|result| result.expect("every transition answered"))
        .collect())
}

async fn returned_ids<C: GroupedConn>(
    conn: &mut C,
    op: &'static str,
    sql: String,
    table: Table,
) -> Result<HashSet<String>, StoreError> {
    let rows = conn.fetch_table(op, sql, table).await?;
    rows.iter()
        .map(|row| {
            row.text("id")
                .map_err(StoreError::query(op))
                .map(Option::unwrap_or_default)
        })
        .collect()
}

/// The binds of one statement: `row`'s values for each transition of
/// `indices`, row after row as `values` numbers them.
fn row_binds<const N: usize>(
    transitions: &[&Transition],
    indices: &[usize],
    row: impl Fn(&Transition) -> [Bind; N],
) -> Table {
    let mut binds = Vec::with_capacity(indices.len() * N);
    for &index in indices {
        binds.extend(row(transitions[index]));
    }
    Table { binds, columns: N }
}

/// The branch rules a release returned, by id. A row that no longer
/// decodes was released all the same: it must not roll back the finishes
/// of its batch (their actions ran), so it is kept as unreadable.
async fn released_by_id<C: GroupedConn>(
    conn: &mut C,
    sql: String,
    table: Table,
) -> Result<HashMap<Uuid, Released>, StoreError> {
    let rows = conn.fetch_table("release branch_rules", sql, table).await?;
    let mut by_id = HashMap::with_capacity(rows.len());
    for row in &rows {
        match decode_branch_rule(row) {
            Ok(rule) => by_id.insert(rule.id, Released::Row(rule)),
            Err(error) => {
                let id = RowReader::new(row, "branch_rules")?.uuid("id")?;
                by_id.insert(id, Released::Unreadable(error.to_string()))
            }
        };
    }
    Ok(by_id)
}

/// Scheduled or Running: `(from, to, stamp)` as [`mark_sql`] takes them.
async fn mark_many<C: GroupedConn>(
    conn: &mut C,
    step: &Step,
    transitions: &[&Transition],
    chunk: &[usize],
    results: &mut [Option<ItemResult>],
) -> Result<(), StoreError> {
    let binds = row_binds(transitions, chunk, |transition| {
        let (fence, now) = fence_and_now(transition);
        [
            Bind::Text(id_text(fence.execution_id)),
            Bind::Text(id_text(fence.branch_rule_id)),
            Bind::Text(fence.holder.clone()),
            Bind::Int(fence.epoch),
            Bind::Int(now),
        ]
    });
    let sql = mark_sql(step, &C::rows_of(&binds));
    let marked = returned_ids(conn, "mark executions", sql, binds).await?;
    for &index in chunk {
        let (fence, _) = fence_and_now(transitions[index]);
        let applied = marked.contains(&id_text(fence.execution_id));
        results[index] = Some(Ok(TransitionOutcome::Applied(applied)));
    }
    Ok(())
}

/// Scheduled transitions of `chunk` and the Running each is followed by
/// (`then_running`), in one update a row; both get its answer.
async fn mark_through_running<C: GroupedConn>(
    conn: &mut C,
    transitions: &[&Transition],
    chunk: &[usize],
    then_running: &HashMap<usize, usize>,
    results: &mut [Option<ItemResult>],
) -> Result<(), StoreError> {
    let mut binds = Vec::with_capacity(chunk.len() * 6);
    for &index in chunk {
        let (fence, scheduled_at) = fence_and_now(transitions[index]);
        let (_, started_at) = fence_and_now(transitions[then_running[&index]]);
        binds.extend([
            Bind::Text(id_text(fence.execution_id)),
            Bind::Text(id_text(fence.branch_rule_id)),
            Bind::Text(fence.holder.clone()),
            Bind::Int(fence.epoch),
            Bind::Int(scheduled_at),
            Bind::Int(started_at),
        ]);
    }
    let table = Table { binds, columns: 6 };
    let sql = mark_sql(&SCHEDULED_AND_RUNNING, &C::rows_of(&table));
    let marked = returned_ids(conn, "mark executions", sql, table).await?;
    for &index in chunk {
        let (fence, _) = fence_and_now(transitions[index]);
        let applied = marked.contains(&id_text(fence.execution_id));
        for answered in [index, then_running[&index]] {
            results[answered] = Some(Ok(TransitionOutcome::Applied(applied)));
        }
    }
    Ok(())
}

async fn renew_many<C: GroupedConn>(
    conn: &mut C,
    transitions: &[&Transition],
    chunk: &[usize],
    results: &mut [Option<ItemResult>],
) -> Result<(), StoreError> {
    let binds = row_binds(transitions, chunk, |transition| {
        let (fence, now) = fence_and_now(transition);
        [
            Bind::Text(id_text(fence.branch_rule_id)),
            Bind::Text(fence.holder.clone()),
            Bind::Int(fence.epoch),
            Bind::Int(now),
        ]
    });
    let sql = renew_sql(&C::rows_of(&binds));
    let renewed = returned_ids(conn, "renew locks", sql, binds).await?;
    for &index in chunk {
        let (fence, _) = fence_and_now(transitions[index]);
        let applied = renewed.contains(&id_text(fence.branch_rule_id));
        results[index] = Some(Ok(TransitionOutcome::Applied(applied)));
    }
    Ok(())
}

async fn claim_many<C: GroupedConn>(
    conn: &mut C,
    transitions: &[&Transition],
    chunk: &[usize],
    results: &mut [Option<ItemResult>],
) -> Result<(), StoreError> {
    let binds = row_binds(transitions, chunk, |transition| {
        let req = claim_request(transition);
        [
            Bind::Text(id_text(req.branch_rule_id)),
            Bind::Text(req.holder.clone()),
            Bind::Int(req.now),
            Bind::Int(req.lock_timeout_ms),
            Bind::Bool(req.run_now),
            Bind::Int(req.due_by.unwrap_or(req.now)),
        ]
    });
    let mut previous_holders = HashMap::new();
    if !C::CLAIM_RETURNS_PREVIOUS_HOLDER {
        let expired_binds = row_binds(transitions, chunk, |transition| {
            let req = claim_request(transition);
            [
                Bind::Text(id_text(req.branch_rule_id)),
                Bind::Int(req.now),
                Bind::Int(req.lock_timeout_ms),
            ]
        });
        let expired = conn
            .fetch_table(
                "select expired locks",
                expired_locks_sql(&C::rows_of(&expired_binds)),
                expired_binds,
            )
            .await?;
        for row in &expired {
            let read = |column| {
                row.text(column)
                    .map_err(StoreError::query("select expired locks"))
                    .map(Option::unwrap_or_default)
            };
            previous_holders.insert(read("id")?, read("previous_holder")?);
        }
    }
    let op = "claim branch_rules";
    let sql = claim_sql(
        &C::rows_of(&binds),
        C::CLAIM_ROW_LOCK,
        C::CLAIM_RETURNS_PREVIOUS_HOLDER,
    );
    let rows = conn.fetch_table(op, sql, binds).await?;
    let mut claimed = HashMap::with_capacity(rows.len());
    for row in &rows {
        let rule = decode_branch_rule(row)?;
        // The claim took only a free lock or one past its timeout, so a
        // previous holder here is one whose claim expired.
        if C::CLAIM_RETURNS_PREVIOUS_HOLDER
            && let Some(previous) = row.text("previous_holder").map_err(StoreError::query(op))?
        {
            previous_holders.insert(id_text(rule.id), previous);
        }
        claimed.insert(rule.id, rule);
    }
    let taken_over: Vec<usize> = chunk
        .iter()
        .copied()
        .filter(|&index| {
            let id = claim_request(transitions[index]).branch_rule_id;
            claimed.contains_key(&id) && previous_holders.contains_key(&id_text(id))
        })
        .collect();
    for part in chunks(&taken_over, C::CHUNKING) {
        let binds = row_binds(transitions, part, |transition| {
            let req = claim_request(transition);
            [
                Bind::Text(id_text(req.branch_rule_id)),
                Bind::Text(previous_holders[&id_text(req.branch_rule_id)].clone()),
                Bind::Int(req.now),
                Bind::Text(req.holder.clone()),
            ]
        });
        let closed = conn
            .fetch_table(
                "close taken-over executions",
                close_taken_over_sql(&C::rows_of(&binds)),
                binds,
            )
            .await?;
        if !closed.is_empty() {
            tracing::warn!(
                "🔒 Took over {} expired claim(s); the attempts they left open are recorded failed (lock_lost)",
                closed.len()
            );
        }
    }
    let won: Vec<usize> = chunk
        .iter()
        .copied()
        .filter(|&index| claimed.contains_key(&claim_request(transitions[index]).branch_rule_id))
        .collect();
    let mut executions = HashMap::with_capacity(won.len());
    for part in chunks(&won, C::CHUNKING) {
        let binds = row_binds(transitions, part, |transition| {
            let req = claim_request(transition);
            let rule = &claimed[&req.branch_rule_id];
            // Not run-now: the occurrence a pending retry retries, so every
            // attempt of it shares (branch_rule_id, scheduled_for) and the
            // attempt grows; else the due time (next_run_time <= now held,
            // so it is set).
            let scheduled_for = match (req.run_now, rule.retry_of.or(rule.next_run_time)) {
                (false, Some(due)) => due,
                _ => req.now,
            };
            [
                Bind::Text(id_text(req.execution_id)),
                Bind::Text(id_text(req.branch_rule_id)),
                Bind::Int(scheduled_for),
                Bind::Text(req.holder.clone()),
                Bind::Int(rule.lock_epoch),
                Bind::Int(req.now),
            ]
        });
        let sql = insert_sql(&C::rows_of(&binds));
        let rows = conn.fetch_table("insert executions", sql, binds).await?;
        for row in &rows {
            let execution = decode_execution(row)?;
            executions.insert(execution.id, execution);
        }
    }
    for &index in chunk {
        let req = claim_request(transitions[index]);
        let claim = match claimed.remove(&req.branch_rule_id) {
            Some(branch_rule) => {
                let execution =
                    executions
                        .remove(&req.execution_id)
                        .ok_or_else(|| StoreError::Query {
                            op: "insert executions",
                            error: sqlx::Error::RowNotFound,
                        })?;
                Some(Claim {
                    execution,
                    branch_rule,
                })
            }
            None => None,
        };
        results[index] = Some(Ok(TransitionOutcome::Claimed(claim)));
    }
    Ok(())
}

async fn finish_many<C: GroupedConn>(
    conn: &mut C,
    transitions: &[&Transition],
    chunk: &[usize],
    results: &mut [Option<ItemResult>],
) -> Result<(), StoreError> {
    let binds = row_binds(transitions, chunk, |transition| {
        let (fence, finish) = fence_and_finish(transition);
        let (keep, retry_of, failed_attempts) = match finish.retry {
            RetryUpdate::Keep => (true, None, 0),
            RetryUpdate::Clear => (false, None, 0),
            RetryUpdate::Pending {
                of,
                failed_attempts,
            } => (false, Some(of), i64::from(failed_attempts)),
        };
        [
            Bind::Text(id_text(fence.branch_rule_id)),
            Bind::Text(fence.holder.clone()),
            Bind::Int(fence.epoch),
            Bind::Bool(finish.advance_last_run),
            Bind::Int(finish.finished_at),
            Bind::OptInt(finish.next_run_time),
            Bind::Bool(keep),
            Bind::OptInt(retry_of),
            Bind::Int(failed_attempts),
            Bind::Bool(finish.clear_next_run),
        ]
    });
    let sql = release_sql(&C::rows_of(&binds));
    let mut released = released_by_id(conn, sql, binds).await?;
    // Only executions whose lock was still held: the release above is
    // their fence.
    let owned: Vec<usize> = chunk
        .iter()
        .copied()
        .filter(|&index| {
            released.contains_key(&fence_and_finish(transitions[index]).0.branch_rule_id)
        })
        .collect();
    for part in chunks(&owned, C::CHUNKING) {
        let binds = row_binds(transitions, part, |transition| {
            let (fence, finish) = fence_and_finish(transition);
            [
                Bind::Text(id_text(fence.execution_id)),
                Bind::Text(id_text(fence.branch_rule_id)),
                Bind::Text(fence.holder.clone()),
                Bind::Int(fence.epoch),
                Bind::Text(finish.status.as_str().to_string()),
                Bind::Int(finish.finished_at),
                Bind::OptText(error_text(finish.error.as_deref())),
                Bind::OptText(output_text(finish.output.as_ref())),
            ]
        });
        let sql = finish_sql(&C::rows_of(&binds));
        conn.fetch_table("finish executions", sql, binds).await?;
    }
    // The occurrences these finishes skipped, under the same fences.
    let skips: Vec<SkipRow> = owned
        .iter()
        .flat_map(|&index| {
            let (fence, finish) = fence_and_finish(transitions[index]);
            skip_rows(
                fence.branch_rule_id,
                &fence.holder,
                fence.epoch,
                finish.finished_at,
                &finish.skipped,
            )
        })
        .collect();
    insert_skipped(conn, &skips).await?;
    for &index in chunk {
        let (fence, _) = fence_and_finish(transitions[index]);
        let row = released.remove(&fence.branch_rule_id);
        results[index] = Some(Ok(TransitionOutcome::Finished(row)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_powers_of_two_largest_first() {
        let chunking = Chunking::PowersOfTwo { max: 64 };
        let indices: Vec<usize> = (0..50).collect();
        let sizes: Vec<usize> = chunks(&indices, chunking).iter().map(|c| c.len()).collect();
        assert_eq!(sizes, [32, 16, 2]);
        let indices: Vec<usize> = (0..200).collect();
        let sizes: Vec<usize> = chunks(&indices, chunking).iter().map(|c| c.len()).collect();
        assert_eq!(sizes, [64, 64, 64, 8]);
        assert!(chunks(&[], chunking).is_empty());
    }

    #[test]
    fn a_running_right_behind_its_scheduled_joins_it() {
        let fence = |execution: u128, epoch: i64| Fence {
            execution_id: Uuid::from_u128(execution),
            branch_rule_id: Uuid::from_u128(execution % 10),
            holder: "h".into(),
            epoch,
        };
        let scheduled = |f: Fence| Transition::Scheduled { fence: f, now: 1 };
        let running = |f: Fence| Transition::Running { fence: f, now: 2 };
        let t = [
            scheduled(fence(1, 1)),
            scheduled(fence(2, 1)),
            running(fence(1, 1)),
            // Rule 3: a renewal between its Scheduled and Running.
            scheduled(fence(3, 1)),
            Transition::RenewLock {
                fence: fence(3, 1),
                now: 1,
            },
            running(fence(3, 1)),
            // Rule 4: another claim's Running (another epoch).
            scheduled(fence(4, 1)),
            running(fence(4, 2)),
            running(fence(2, 1)),
        ];
        let refs: Vec<&Transition> = t.iter().collect();
        let pairs = running_after_scheduled(&refs);
        assert_eq!(pairs, HashMap::from([(0, 2), (1, 8)]));
    }

    #[test]
    fn whole_chunks_take_a_round_at_once_up_to_the_bound() {
        let chunking = Chunking::Whole { max: 64 };
        let indices: Vec<usize> = (0..200).collect();
        let sizes: Vec<usize> = chunks(&indices, chunking).iter().map(|c| c.len()).collect();
        assert_eq!(sizes, [64, 64, 64, 8]);
        let sizes: Vec<usize> = chunks(&indices[..50], chunking)
            .iter()
            .map(|c| c.len())
            .collect();
        assert_eq!(sizes, [50]);
    }

    #[test]
    fn postgres_reads_a_table_column_by_column() {
        let table = Table {
            binds: vec![
                Bind::Text("a".into()),
                Bind::OptInt(None),
                Bind::Bool(true),
                Bind::Text("b".into()),
                Bind::OptInt(Some(7)),
                Bind::Bool(false),
            ],
            columns: 3,
        };
        assert_eq!(
            <sqlx::PgConnection as GroupedConn>::CHUNKING,
            Chunking::Whole { max: 4096 }
        );
        assert_eq!(
            <sqlx::PgConnection as GroupedConn>::rows_of(&table),
            "SELECT * FROM UNNEST($1::text[], $2::int8[], $3::bool[])"
        );
        assert_eq!(
            columns_of(table),
            [
                Column::Texts(vec![Some("a".into()), Some("b".into())]),
                Column::Ints(vec![None, Some(7)]),
                Column::Bools(vec![true, false]),
            ]
        );
    }

    #[test]
    fn values_number_placeholders_row_by_row() {
        assert_eq!(values(2, 3), "($1, $2, $3), ($4, $5, $6)");
    }

    #[test]
    fn rounds_hold_one_transition_per_branch_rule_in_order() {
        let fence = |n: u128| Fence {
            execution_id: Uuid::from_u128(n),
            branch_rule_id: Uuid::from_u128(n % 10),
            holder: "h".into(),
            epoch: 1,
        };
        let t: Vec<Transition> = [1, 2, 11, 3, 21, 12]
            .into_iter()
            .map(|n| Transition::RenewLock {
                fence: fence(n),
                now: 0,
            })
            .collect();
        let refs: Vec<&Transition> = t.iter().collect();
        assert_eq!(
            rounds(&refs, 0..refs.len()),
            [vec![0, 1, 3], vec![2, 5], vec![4]]
        );
        assert_eq!(
            rounds(&refs, [0, 2, 4].into_iter()),
            [vec![0], vec![2], vec![4]]
        );
    }
}
