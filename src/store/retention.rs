//! Execution history retention: finished executions older than
//! EXECUTION_RETENTION_DAYS are deleted in small batches.
//!
//! Age is `requested_at`, the claim: the (status, requested_at, id) index
//! the executions page already uses finds a batch without a scan, and a
//! row still has to be finished before its cutoff too. Open executions
//! (requested, scheduled, running) are never touched, however old: they
//! are recovery's, not retention's.
//!
//! Nothing reads old finished executions to decide what runs: a rule's
//! next occurrence comes from its `next_run_time`, which only moves
//! forward past what ran, so deleting history cannot make an occurrence
//! run again. The attempts of an occurrence with a retry pending are kept
//! until it is done, since the retry numbers itself after them.

use super::{Store, StoreError};
use crate::model::{ExecutionStatus, Millis};

/// Finished, claimed before `$1` and finished before it, and not an
/// attempt of an occurrence still waiting for its retry: the retry's
/// attempt number counts the attempts on record, and a long backoff (or a
/// rule stopped for a month) must not make it attempt 1 again.
const PRUNABLE: &str = "status IN ('completed', 'failed', 'cancelled', 'timed_out', 'skipped') \
     AND requested_at < $1 AND (finished_at IS NULL OR finished_at < $1) \
     AND NOT EXISTS (SELECT 1 FROM branch_rules b WHERE b.id = executions.branch_rule_id \
     AND b.retry_of = executions.scheduled_for)";

/// One prune batch on SQLite: at most `$2` prunable rows at cutoff `$1`.
pub(super) fn sqlite_prune_sql() -> String {
    format!(
        "DELETE FROM executions WHERE rowid IN \
         (SELECT rowid FROM executions WHERE {PRUNABLE} LIMIT $2)"
    )
}

/// What a prune at a cutoff would delete.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PruneSummary {
    /// Rows per status, in [`ExecutionStatus::ALL`] order, terminal ones only.
    pub by_status: Vec<(ExecutionStatus, i64)>,
    /// The oldest and newest `requested_at` among them.
    pub oldest: Option<Millis>,
    pub newest: Option<Millis>,
}

impl PruneSummary {
    pub fn total(&self) -> i64 {
        self.by_status.iter().map(|(_, n)| n).sum()
    }
}

impl Store {
    /// What [`Store::prune_executions`] would delete at `cutoff`, deleting
    /// nothing.
    pub async fn prunable_executions(&self, cutoff: Millis) -> Result<PruneSummary, StoreError> {
        let op = "count prunable executions";
        let sql = format!(
            "SELECT status, count(*), min(requested_at), max(requested_at) \
             FROM executions WHERE {PRUNABLE} GROUP BY status"
        );
        let sql = sqlx::AssertSqlSafe(sql);
        let rows: Vec<(String, i64, Option<i64>, Option<i64>)> = match self {
            Store::Sqlite(pool) => sqlx::query_as(sql).bind(cutoff).fetch_all(pool).await,
            Store::Postgres(pool) => sqlx::query_as(sql).bind(cutoff).fetch_all(pool).await,
        }
        .map_err(StoreError::query(op))?;
        let mut summary = PruneSummary {
            by_status: ExecutionStatus::ALL
                .into_iter()
                .filter(|s| s.is_terminal())
                .map(|s| (s, 0))
                .collect(),
            ..PruneSummary::default()
        };
        for (status, count, oldest, newest) in rows {
            if let Some(slot) = summary
                .by_status
                .iter_mut()
                .find(|(s, _)| s.as_str() == status)
            {
                slot.1 = count;
            }
            summary.oldest = summary.oldest.into_iter().chain(oldest).min();
            summary.newest = summary.newest.into_iter().chain(newest).max();
        }
        Ok(summary)
    }

    /// Deletes at most `limit` prunable executions at `cutoff` in one short
    /// statement; returns how many. Call again until it returns less than
    /// `limit`. On PostgreSQL rows another instance is deleting are
    /// skipped, not waited for, so several pruners never block each other.
    pub async fn prune_executions(&self, cutoff: Millis, limit: i64) -> Result<u64, StoreError> {
        let op = "prune executions";
        match self {
            Store::Sqlite(pool) => {
                let sql = sqlx::AssertSqlSafe(sqlite_prune_sql());
                execute_on!(pool, op, sql, cutoff, limit)
            }
            Store::Postgres(pool) => {
                let sql = sqlx::AssertSqlSafe(format!(
                    "DELETE FROM executions WHERE id IN \
                     (SELECT id FROM executions WHERE {PRUNABLE} LIMIT $2 FOR UPDATE SKIP LOCKED)"
                ));
                execute_on!(pool, op, sql, cutoff, limit)
            }
        }
    }

    /// The `requested_at` of the oldest execution kept, if any.
    pub async fn oldest_execution(&self) -> Result<Option<Millis>, StoreError> {
        let op = "oldest execution";
        const SQL: &str = "SELECT min(requested_at) FROM executions";
        match self {
            Store::Sqlite(pool) => sqlx::query_scalar(SQL).fetch_one(pool).await,
            Store::Postgres(pool) => sqlx::query_scalar(SQL).fetch_one(pool).await,
        }
        .map_err(StoreError::query(op))
    }
}
