//! Set-based statements for the batcher: the transitions of one kind in a
//! batch run as one statement per chunk instead of one statement each.
//!
//! With sqlx every statement is a round trip to the connection's worker
//! thread (SQLite) or the server (PostgreSQL); at thousands of transitions a
//! second those round trips, not the writes, are the cost. Each row still
//! carries its own fence and status guard in the join, and RETURNING tells
//! which rows matched, so every caller gets exactly the answer the
//! one-statement path (`claims`) gives it.
//!
//! Statements are built from fixed text and placeholders only; every value
//! is bound. Chunk sizes are powers of two so each connection's statement
//! cache holds a handful of shapes, not one per batch size.

use std::collections::{HashMap, HashSet};

use uuid::Uuid;

use super::StoreError;
use super::batch::{Transition, TransitionOutcome};
use super::executions::{
    Claim, ClaimRequest, Fence, Finish, branch_rule_columns, execution_columns, open_statuses,
    touch_branch_rule,
};

pub(super) type ItemResult = Result<TransitionOutcome, StoreError>;

/// Largest number of rows one statement carries (at most 8 parameters a
/// row, far below either backend's limit).
const MAX_CHUNK: usize = 64;

/// The branch rule a transition touches; transitions of different branch
/// rules never touch the same row.
fn branch_rule_of(transition: &Transition) -> Uuid {
    match transition {
        Transition::Claim(req) => req.branch_rule_id,
        Transition::Scheduled { fence, .. }
        | Transition::Running { fence, .. }
        | Transition::RenewLock { fence, .. }
        | Transition::Finish { fence, .. } => fence.branch_rule_id,
    }
}

/// Splits a batch into rounds holding at most one transition per branch
/// rule, in arrival order: within a round no two transitions touch the same
/// row, so they may run in any grouping; rounds run one after another, so
/// two transitions of one rule (a finish, then a claim) keep their order.
pub(super) fn rounds(transitions: &[&Transition]) -> Vec<Vec<usize>> {
    let mut seen: HashMap<Uuid, usize> = HashMap::new();
    let mut rounds: Vec<Vec<usize>> = Vec::new();
    for (index, transition) in transitions.iter().enumerate() {
        let round = seen.entry(branch_rule_of(transition)).or_insert(0);
        if rounds.len() <= *round {
            rounds.push(Vec::new());
        }
        rounds[*round].push(index);
        *round += 1;
    }
    rounds
}

/// `indices` cut into chunks of power-of-two sizes, largest first.
pub(super) fn chunks(indices: &[usize]) -> Vec<&[usize]> {
    let mut out = Vec::new();
    let mut rest = indices;
    while !rest.is_empty() {
        let size = MAX_CHUNK.min(1 << rest.len().ilog2());
        let (chunk, tail) = rest.split_at(size);
        out.push(chunk);
        rest = tail;
    }
    out
}

/// `($1, $2), ($3, $4)` for `rows` rows of `columns` placeholders.
fn values(rows: usize, columns: usize) -> String {
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

/// Requested → Scheduled or Scheduled → Running; `stamp` is the column
/// set to `now`. Same guards as `claims::MARK_SCHEDULED`.
fn mark_sql(from: &str, to: &str, stamp: &str, rows: usize) -> String {
    format!(
        "WITH v(id, br, holder, epoch, now) AS (VALUES {}) \
         UPDATE executions SET status = '{to}', {stamp} = v.now, updated_at = v.now FROM v \
         WHERE executions.id = v.id AND executions.branch_rule_id = v.br \
         AND executions.owner = v.holder AND executions.lock_epoch = v.epoch \
         AND executions.status = '{from}' \
         AND EXISTS (SELECT 1 FROM branch_rules b \
         WHERE b.id = v.br AND b.lock_holder = v.holder AND b.lock_epoch = v.epoch) \
         RETURNING executions.id",
        values(rows, 5)
    )
}

fn renew_sql(rows: usize) -> String {
    format!(
        "WITH v(br, holder, epoch, now) AS (VALUES {}) \
         UPDATE branch_rules SET lock_time = v.now, {} FROM v \
         WHERE branch_rules.id = v.br AND branch_rules.lock_holder = v.holder \
         AND branch_rules.lock_epoch = v.epoch RETURNING branch_rules.id",
        values(rows, 4),
        touch_branch_rule!("v.now")
    )
}

/// Same conditions as `claims::CLAIM_BRANCH_RULE`.
fn claim_sql(rows: usize) -> String {
    format!(
        "WITH v(br, holder, now, timeout, run_now) AS (VALUES {}) \
         UPDATE branch_rules SET lock_holder = v.holder, lock_time = v.now, \
         lock_epoch = lock_epoch + 1, is_currently_running = TRUE, {} FROM v \
         WHERE branch_rules.id = v.br AND is_active AND NOT is_archived AND NOT is_force_stopped \
         AND (v.run_now OR next_run_time <= v.now) \
         AND (lock_holder IS NULL OR lock_time IS NULL OR lock_time < v.now - v.timeout) \
         RETURNING {}",
        values(rows, 5),
        touch_branch_rule!("v.now"),
        branch_rule_columns!()
    )
}

/// Same as `claims::INSERT_EXECUTION`: one round holds one claim per
/// branch rule, so the attempts computed in one statement cannot collide.
fn insert_sql(rows: usize) -> String {
    format!(
        "WITH v(id, br, sf, holder, epoch, now) AS (VALUES {}) \
         INSERT INTO executions (id, branch_rule_id, scheduled_for, status, attempt, owner, \
         lock_epoch, requested_at, created_at, updated_at) \
         SELECT v.id, v.br, v.sf, 'requested', \
         (SELECT COALESCE(MAX(e.attempt), 0) + 1 FROM executions e \
         WHERE e.branch_rule_id = v.br AND e.scheduled_for = v.sf), \
         v.holder, v.epoch, v.now, v.now, v.now FROM v RETURNING {}",
        values(rows, 6),
        execution_columns!()
    )
}

/// Same as `claims::RELEASE_BRANCH_RULE`.
fn release_sql(rows: usize) -> String {
    format!(
        "WITH v(br, holder, epoch, advance, fin, nrt) AS (VALUES {}) \
         UPDATE branch_rules SET \
         last_run_time = CASE WHEN v.advance THEN v.fin ELSE last_run_time END, \
         next_run_time = COALESCE(v.nrt, next_run_time), \
         is_currently_running = FALSE, lock_holder = NULL, lock_time = NULL, {} FROM v \
         WHERE branch_rules.id = v.br AND branch_rules.lock_holder = v.holder \
         AND branch_rules.lock_epoch = v.epoch RETURNING {}",
        values(rows, 6),
        touch_branch_rule!("v.fin"),
        branch_rule_columns!()
    )
}

/// Same as `claims::FINISH_EXECUTION`, for executions whose branch rule
/// was just released in this transaction.
fn finish_sql(rows: usize) -> String {
    format!(
        "WITH v(id, br, holder, epoch, o_status, o_at, o_error, o_output) AS (VALUES {}) \
         UPDATE executions SET status = v.o_status, finished_at = v.o_at, error = v.o_error, \
         output = v.o_output, updated_at = v.o_at FROM v \
         WHERE executions.id = v.id AND executions.branch_rule_id = v.br \
         AND executions.owner = v.holder AND executions.lock_epoch = v.epoch \
         AND executions.status IN {}",
        values(rows, 8),
        open_statuses!()
    )
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

/// Runs every transition of a batch with set-based statements on one
/// connection, inside a transaction the caller owns. `Err` means a
/// statement failed: the transaction must be rolled back, and the caller
/// finds the culprit by running the transitions one by one.
macro_rules! grouped_ops {
    ($conn_type:ty) => {
        use super::*;
        use crate::store::decode::{AnyRow, id_text};
        use crate::store::executions::{decode_execution, error_text, output_text};
        use crate::store::workflows::decode_branch_rule;
        use sqlx::AssertSqlSafe;

        type Conn = $conn_type;

        pub(in crate::store) async fn apply_grouped(
            conn: &mut Conn,
            transitions: &[&Transition],
        ) -> Result<Vec<ItemResult>, StoreError> {
            let mut results: Vec<Option<ItemResult>> = transitions.iter().map(|_| None).collect();
            for indices in rounds(transitions) {
                let round = sort_round(transitions, &indices, &mut results);
                for chunk in chunks(&round.claims) {
                    claim_many(conn, transitions, chunk, &mut results).await?;
                }
                for chunk in chunks(&round.scheduled) {
                    let sql = mark_sql("requested", "scheduled", "scheduled_at", chunk.len());
                    mark_many(conn, sql, transitions, chunk, &mut results).await?;
                }
                for chunk in chunks(&round.running) {
                    let sql = mark_sql("scheduled", "running", "started_at", chunk.len());
                    mark_many(conn, sql, transitions, chunk, &mut results).await?;
                }
                for chunk in chunks(&round.renewals) {
                    renew_many(conn, transitions, chunk, &mut results).await?;
                }
                for chunk in chunks(&round.finishes) {
                    finish_many(conn, transitions, chunk, &mut results).await?;
                }
            }
            Ok(results
                .into_iter()
                .map(|result| result.expect("every transition answered"))
                .collect())
        }

        async fn returned_ids(
            conn: &mut Conn,
            op: &'static str,
            query: sqlx::query::Query<'_, Db, Args>,
        ) -> Result<HashSet<String>, StoreError> {
            let rows = query
                .fetch_all(&mut *conn)
                .await
                .map_err(StoreError::query(op))?;
            rows.iter()
                .map(|row| {
                    row.text("id")
                        .map_err(StoreError::query(op))
                        .map(Option::unwrap_or_default)
                })
                .collect()
        }

        async fn mark_many(
            conn: &mut Conn,
            sql: String,
            transitions: &[&Transition],
            chunk: &[usize],
            results: &mut [Option<ItemResult>],
        ) -> Result<(), StoreError> {
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for &index in chunk {
                let (fence, now) = fence_and_now(transitions[index]);
                query = query
                    .bind(id_text(fence.execution_id))
                    .bind(id_text(fence.branch_rule_id))
                    .bind(fence.holder.as_str())
                    .bind(fence.epoch)
                    .bind(now);
            }
            let marked = returned_ids(conn, "mark executions", query).await?;
            for &index in chunk {
                let (fence, _) = fence_and_now(transitions[index]);
                let applied = marked.contains(&id_text(fence.execution_id));
                results[index] = Some(Ok(TransitionOutcome::Applied(applied)));
            }
            Ok(())
        }

        async fn renew_many(
            conn: &mut Conn,
            transitions: &[&Transition],
            chunk: &[usize],
            results: &mut [Option<ItemResult>],
        ) -> Result<(), StoreError> {
            let mut query = sqlx::query(AssertSqlSafe(renew_sql(chunk.len())));
            for &index in chunk {
                let (fence, now) = fence_and_now(transitions[index]);
                query = query
                    .bind(id_text(fence.branch_rule_id))
                    .bind(fence.holder.as_str())
                    .bind(fence.epoch)
                    .bind(now);
            }
            let renewed = returned_ids(conn, "renew locks", query).await?;
            for &index in chunk {
                let (fence, _) = fence_and_now(transitions[index]);
                let applied = renewed.contains(&id_text(fence.branch_rule_id));
                results[index] = Some(Ok(TransitionOutcome::Applied(applied)));
            }
            Ok(())
        }

        async fn claim_many(
            conn: &mut Conn,
            transitions: &[&Transition],
            chunk: &[usize],
            results: &mut [Option<ItemResult>],
        ) -> Result<(), StoreError> {
            let op = "claim branch_rules";
            let mut query = sqlx::query(AssertSqlSafe(claim_sql(chunk.len())));
            for &index in chunk {
                let req = claim_request(transitions[index]);
                query = query
                    .bind(id_text(req.branch_rule_id))
                    .bind(req.holder.as_str())
                    .bind(req.now)
                    .bind(req.lock_timeout_ms)
                    .bind(req.run_now);
            }
            let rows = query
                .fetch_all(&mut *conn)
                .await
                .map_err(StoreError::query(op))?;
            let mut claimed = HashMap::with_capacity(rows.len());
            for row in &rows {
                let rule = decode_branch_rule(row)?;
                claimed.insert(rule.id, rule);
            }
            let won: Vec<usize> = chunk
                .iter()
                .copied()
                .filter(|&index| {
                    claimed.contains_key(&claim_request(transitions[index]).branch_rule_id)
                })
                .collect();
            let mut executions = HashMap::with_capacity(won.len());
            for part in chunks(&won) {
                let mut insert = sqlx::query(AssertSqlSafe(insert_sql(part.len())));
                for &index in part {
                    let req = claim_request(transitions[index]);
                    let rule = &claimed[&req.branch_rule_id];
                    // Not run-now means next_run_time <= now held, so it is set.
                    let scheduled_for = match (req.run_now, rule.next_run_time) {
                        (false, Some(due)) => due,
                        _ => req.now,
                    };
                    insert = insert
                        .bind(id_text(req.execution_id))
                        .bind(id_text(req.branch_rule_id))
                        .bind(scheduled_for)
                        .bind(req.holder.as_str())
                        .bind(rule.lock_epoch)
                        .bind(req.now);
                }
                let rows = insert
                    .fetch_all(&mut *conn)
                    .await
                    .map_err(StoreError::query("insert executions"))?;
                for row in &rows {
                    let execution = decode_execution(row)?;
                    executions.insert(execution.id, execution);
                }
            }
            for &index in chunk {
                let req = claim_request(transitions[index]);
                let claim = match claimed.remove(&req.branch_rule_id) {
                    Some(branch_rule) => {
                        let execution = executions.remove(&req.execution_id).ok_or_else(|| {
                            StoreError::Query {
                                op: "insert executions",
                                error: sqlx::Error::RowNotFound,
                            }
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

        async fn finish_many(
            conn: &mut Conn,
            transitions: &[&Transition],
            chunk: &[usize],
            results: &mut [Option<ItemResult>],
        ) -> Result<(), StoreError> {
            let op = "release branch_rules";
            let mut query = sqlx::query(AssertSqlSafe(release_sql(chunk.len())));
            for &index in chunk {
                let (fence, finish) = fence_and_finish(transitions[index]);
                query = query
                    .bind(id_text(fence.branch_rule_id))
                    .bind(fence.holder.as_str())
                    .bind(fence.epoch)
                    .bind(finish.advance_last_run)
                    .bind(finish.finished_at)
                    .bind(finish.next_run_time);
            }
            let rows = query
                .fetch_all(&mut *conn)
                .await
                .map_err(StoreError::query(op))?;
            let mut released = HashMap::with_capacity(rows.len());
            for row in &rows {
                let rule = decode_branch_rule(row)?;
                released.insert(rule.id, rule);
            }
            // Only executions whose lock was still held: the release above
            // is their fence.
            let owned: Vec<usize> = chunk
                .iter()
                .copied()
                .filter(|&index| {
                    released.contains_key(&fence_and_finish(transitions[index]).0.branch_rule_id)
                })
                .collect();
            for part in chunks(&owned) {
                let mut update = sqlx::query(AssertSqlSafe(finish_sql(part.len())));
                for &index in part {
                    let (fence, finish) = fence_and_finish(transitions[index]);
                    update = update
                        .bind(id_text(fence.execution_id))
                        .bind(id_text(fence.branch_rule_id))
                        .bind(fence.holder.as_str())
                        .bind(fence.epoch)
                        .bind(finish.status.as_str())
                        .bind(finish.finished_at)
                        .bind(error_text(finish.error.as_deref()))
                        .bind(output_text(finish.output.as_ref()));
                }
                update
                    .execute(&mut *conn)
                    .await
                    .map_err(StoreError::query("finish executions"))?;
            }
            for &index in chunk {
                let (fence, _) = fence_and_finish(transitions[index]);
                let row = released.remove(&fence.branch_rule_id);
                results[index] = Some(Ok(TransitionOutcome::Finished(row)));
            }
            Ok(())
        }
    };
}

pub(super) mod sqlite {
    type Db = sqlx::Sqlite;
    type Args = sqlx::sqlite::SqliteArguments;
    grouped_ops!(sqlx::SqliteConnection);
}

pub(super) mod postgres {
    type Db = sqlx::Postgres;
    type Args = sqlx::postgres::PgArguments;
    grouped_ops!(sqlx::PgConnection);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_powers_of_two_largest_first() {
        let indices: Vec<usize> = (0..50).collect();
        let sizes: Vec<usize> = chunks(&indices).iter().map(|c| c.len()).collect();
        assert_eq!(sizes, [32, 16, 2]);
        let indices: Vec<usize> = (0..200).collect();
        let sizes: Vec<usize> = chunks(&indices).iter().map(|c| c.len()).collect();
        assert_eq!(sizes, [64, 64, 64, 8]);
        assert!(chunks(&[]).is_empty());
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
        assert_eq!(rounds(&refs), [vec![0, 1, 3], vec![2, 5], vec![4]]);
    }
}
