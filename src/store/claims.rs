//! The claim and the fenced writes of one occurrence (DESIGN §4, seeds 001
//! and 002): claim → Requested, handoff → Scheduled, worker start → Running,
//! post-process → terminal, plus lock renewal.
//!
//! Each write is one statement (the claim and the post-process are one
//! transaction each) and carries the fence `lock_holder = holder AND
//! lock_epoch = epoch`, plus a guard on the status it leaves, so a lost lock
//! or a repeated transition changes nothing and reports `false`/`None`.
//!
//! The per-connection steps are written once in `lifecycle_ops!` and
//! instantiated for each backend's connection type. [`Store`] methods run
//! them; the [`TransitionBatcher`](super::TransitionBatcher) runs their
//! set-based twins (`grouped`) and falls back to these, many to a
//! transaction, to single out a transition whose statement fails.

use sqlx::{Database, Transaction};

use super::batch::{Transition, TransitionOutcome};
use super::decode::id_text;
use super::executions::{
    Claim, ClaimRequest, Fence, Finish, branch_rule_columns, decode_execution, error_text,
    execution_columns, open_statuses, output_text, touch_branch_rule,
};
use super::workflows::decode_branch_rule;
use super::{Store, StoreError};
use crate::model::{BranchRule, Millis};

/// The claim of seed 001, plus the epoch that fences every later write.
/// A lock without a time (operator SQL) counts as abandoned. RETURNING gives
/// the row after the claim (its due time, its new epoch) without a second
/// read; `touch_branch_rule!` is what makes it exact on SQLite too.
const CLAIM_BRANCH_RULE: &str = concat!(
    "UPDATE branch_rules SET lock_holder = $2, lock_time = $3, lock_epoch = lock_epoch + 1, \
     is_currently_running = TRUE, ",
    touch_branch_rule!("$3"),
    " WHERE id = $1 AND is_active AND NOT is_archived AND NOT is_force_stopped \
     AND ($5 OR next_run_time <= $3) \
     AND (lock_holder IS NULL OR lock_time IS NULL OR lock_time < $3 - $4) \
     RETURNING ",
    branch_rule_columns!()
);

/// Only the claimer of the occurrence inserts, under the branch rule's row
/// lock, so max(attempt) + 1 cannot race; the unique key backs that up.
const INSERT_EXECUTION: &str = concat!(
    "INSERT INTO executions (id, branch_rule_id, scheduled_for, status, attempt, owner, \
     lock_epoch, requested_at, created_at, updated_at) \
     VALUES ($1, $2, $3, 'requested', \
     (SELECT COALESCE(MAX(attempt), 0) + 1 FROM executions WHERE branch_rule_id = $2 AND scheduled_for = $3), \
     $4, $5, $6, $6, $6) RETURNING ",
    execution_columns!()
);

/// `$1` execution, `$2` branch rule, `$3` holder, `$4` epoch, `$5` now.
/// The execution's own owner/epoch tie it to this claim; the branch rule's
/// tie the claim to the present.
const MARK_SCHEDULED: &str = "\
UPDATE executions SET status = 'scheduled', scheduled_at = $5, updated_at = $5 \
WHERE id = $1 AND branch_rule_id = $2 AND owner = $3 AND lock_epoch = $4 AND status = 'requested' \
AND EXISTS (SELECT 1 FROM branch_rules WHERE id = $2 AND lock_holder = $3 AND lock_epoch = $4)";

const MARK_RUNNING: &str = "\
UPDATE executions SET status = 'running', started_at = $5, updated_at = $5 \
WHERE id = $1 AND branch_rule_id = $2 AND owner = $3 AND lock_epoch = $4 AND status = 'scheduled' \
AND EXISTS (SELECT 1 FROM branch_rules WHERE id = $2 AND lock_holder = $3 AND lock_epoch = $4)";

const RENEW_LOCK: &str = concat!(
    "UPDATE branch_rules SET lock_time = $4, ",
    touch_branch_rule!("$4"),
    " WHERE id = $1 AND lock_holder = $2 AND lock_epoch = $3"
);

/// First step of the post-process: it takes PostgreSQL's row lock on the
/// branch rule, so nobody can take the lock over before this transaction
/// ends, and the execution update below needs no further fence.
const RELEASE_BRANCH_RULE: &str = concat!(
    "UPDATE branch_rules SET \
     last_run_time = CASE WHEN $4 THEN $5 ELSE last_run_time END, \
     next_run_time = COALESCE($6, next_run_time), \
     is_currently_running = FALSE, lock_holder = NULL, lock_time = NULL, ",
    touch_branch_rule!("$5"),
    " WHERE id = $1 AND lock_holder = $2 AND lock_epoch = $3 RETURNING ",
    branch_rule_columns!()
);

const FINISH_EXECUTION: &str = concat!(
    "UPDATE executions SET status = $5, finished_at = $6, error = $7, output = $8, updated_at = $6 \
     WHERE id = $1 AND branch_rule_id = $2 AND owner = $3 AND lock_epoch = $4 AND status IN ",
    open_statuses!()
);

/// SQLite write transactions take the write lock up front: a deferred one
/// that read first could not upgrade once another connection committed
/// (SQLITE_BUSY_SNAPSHOT, which the busy timeout does not retry).
pub(super) const SQLITE_BEGIN_WRITE: &str = "BEGIN IMMEDIATE";

pub(super) async fn begin_sqlite_write(
    pool: &sqlx::SqlitePool,
    op: &'static str,
) -> Result<Transaction<'static, sqlx::Sqlite>, StoreError> {
    pool.begin_with(SQLITE_BEGIN_WRITE)
        .await
        .map_err(StoreError::query(op))
}

pub(super) async fn end_tx<DB: Database>(
    tx: Transaction<'_, DB>,
    commit: bool,
) -> Result<(), StoreError> {
    if commit {
        tx.commit().await.map_err(StoreError::query("commit"))
    } else {
        tx.rollback().await.map_err(StoreError::query("rollback"))
    }
}

pub(super) fn not_terminal(finish: &Finish) -> StoreError {
    StoreError::Query {
        op: "finish execution",
        error: sqlx::Error::InvalidArgument(format!(
            "status {} is not terminal",
            finish.status.as_str()
        )),
    }
}

/// The steps on one connection (inside a transaction the caller owns),
/// instantiated once per backend below.
macro_rules! lifecycle_ops {
    ($conn_type:ty) => {
        use super::*;

        type Conn = $conn_type;

        pub(in crate::store) async fn claim(
            conn: &mut Conn,
            req: &ClaimRequest,
        ) -> Result<Option<Claim>, StoreError> {
            let op = "claim branch_rule";
            let claimed = sqlx::query(CLAIM_BRANCH_RULE)
                .bind(id_text(req.branch_rule_id))
                .bind(req.holder.as_str())
                .bind(req.now)
                .bind(req.lock_timeout_ms)
                .bind(req.run_now)
                .fetch_optional(&mut *conn)
                .await
                .map_err(StoreError::query(op))?;
            let Some(row) = claimed else {
                return Ok(None);
            };
            let branch_rule = decode_branch_rule(&row)?;
            // Not run-now means next_run_time <= now held, so it is set.
            let scheduled_for = match (req.run_now, branch_rule.next_run_time) {
                (false, Some(due)) => due,
                _ => req.now,
            };
            let inserted = sqlx::query(INSERT_EXECUTION)
                .bind(id_text(req.execution_id))
                .bind(id_text(req.branch_rule_id))
                .bind(scheduled_for)
                .bind(req.holder.as_str())
                .bind(branch_rule.lock_epoch)
                .bind(req.now)
                .fetch_one(&mut *conn)
                .await
                .map_err(StoreError::query("insert execution"))?;
            let execution = decode_execution(&inserted)?;
            Ok(Some(Claim {
                execution,
                branch_rule,
            }))
        }

        pub(in crate::store) async fn mark(
            conn: &mut Conn,
            op: &'static str,
            sql: &'static str,
            fence: &Fence,
            now: Millis,
        ) -> Result<bool, StoreError> {
            execute_on!(
                &mut *conn,
                op,
                sql,
                id_text(fence.execution_id),
                id_text(fence.branch_rule_id),
                fence.holder.as_str(),
                fence.epoch,
                now
            )
            .map(|n| n == 1)
        }

        pub(in crate::store) async fn renew_lock(
            conn: &mut Conn,
            fence: &Fence,
            now: Millis,
        ) -> Result<bool, StoreError> {
            execute_on!(
                &mut *conn,
                "renew lock",
                RENEW_LOCK,
                id_text(fence.branch_rule_id),
                fence.holder.as_str(),
                fence.epoch,
                now
            )
            .map(|n| n == 1)
        }

        /// Writes nothing and returns `None` when the fence fails; the
        /// caller may commit either way.
        pub(in crate::store) async fn finish(
            conn: &mut Conn,
            fence: &Fence,
            finish: &Finish,
        ) -> Result<Option<BranchRule>, StoreError> {
            if !finish.status.is_terminal() {
                return Err(not_terminal(finish));
            }
            let released = sqlx::query(RELEASE_BRANCH_RULE)
                .bind(id_text(fence.branch_rule_id))
                .bind(fence.holder.as_str())
                .bind(fence.epoch)
                .bind(finish.advance_last_run)
                .bind(finish.finished_at)
                .bind(finish.next_run_time)
                .fetch_optional(&mut *conn)
                .await
                .map_err(StoreError::query("release branch_rule"))?;
            let Some(row) = released else {
                return Ok(None);
            };
            let branch_rule = decode_branch_rule(&row)?;
            // 0 rows here means the execution was already terminal (e.g. a
            // cancel through the API): it stays as it is, terminal states
            // are final, but the lock is still released.
            execute_on!(
                &mut *conn,
                "finish execution",
                FINISH_EXECUTION,
                id_text(fence.execution_id),
                id_text(fence.branch_rule_id),
                fence.holder.as_str(),
                fence.epoch,
                finish.status.as_str(),
                finish.finished_at,
                error_text(finish.error.as_deref()),
                output_text(finish.output.as_ref())
            )?;
            Ok(Some(branch_rule))
        }

        pub(in crate::store) async fn apply(
            conn: &mut Conn,
            transition: &Transition,
        ) -> Result<TransitionOutcome, StoreError> {
            Ok(match transition {
                Transition::Claim(req) => TransitionOutcome::Claimed(claim(conn, req).await?),
                Transition::Scheduled { fence, now } => TransitionOutcome::Applied(
                    mark(conn, "mark scheduled", MARK_SCHEDULED, fence, *now).await?,
                ),
                Transition::Running { fence, now } => TransitionOutcome::Applied(
                    mark(conn, "mark running", MARK_RUNNING, fence, *now).await?,
                ),
                Transition::RenewLock { fence, now } => {
                    TransitionOutcome::Applied(renew_lock(conn, fence, *now).await?)
                }
                Transition::Finish { fence, finish: f } => {
                    TransitionOutcome::Finished(finish(conn, fence, f).await?)
                }
            })
        }
    };
}

pub(super) mod sqlite {
    lifecycle_ops!(sqlx::SqliteConnection);
}

pub(super) mod postgres {
    lifecycle_ops!(sqlx::PgConnection);
}

/// Runs `$f` from the backend's ops module on `$store` in one write
/// transaction, committed when `$commit(&result)` says so.
macro_rules! in_write_tx {
    ($store:expr, $op:expr, $f:ident($($arg:expr),*), $commit:expr) => {
        match $store {
            Store::Sqlite(pool) => {
                let mut tx = begin_sqlite_write(pool, $op).await?;
                let out = sqlite::$f(&mut tx, $($arg),*).await?;
                end_tx(tx, $commit(&out)).await?;
                Ok(out)
            }
            Store::Postgres(pool) => {
                let mut tx = pool.begin().await.map_err(StoreError::query($op))?;
                let out = postgres::$f(&mut tx, $($arg),*).await?;
                end_tx(tx, $commit(&out)).await?;
                Ok(out)
            }
        }
    };
}

/// Runs a single-statement step from the backend's ops module on a pooled
/// connection (autocommit).
macro_rules! on_pool {
    ($store:expr, $op:expr, $f:ident($($arg:expr),*)) => {
        match $store {
            Store::Sqlite(pool) => {
                let mut conn = pool.acquire().await.map_err(StoreError::query($op))?;
                sqlite::$f(&mut conn, $($arg),*).await
            }
            Store::Postgres(pool) => {
                let mut conn = pool.acquire().await.map_err(StoreError::query($op))?;
                postgres::$f(&mut conn, $($arg),*).await
            }
        }
    };
}

impl Store {
    /// Claims a due branch rule for one occurrence: one conditional UPDATE
    /// (locks it, increments lock_epoch) and, only if that matched, the
    /// Requested execution row, in one transaction. `None` when the rule is
    /// not due, not runnable (inactive, archived, force-stopped) or locked
    /// by someone with a lock younger than `lock_timeout_ms`.
    pub async fn claim(&self, req: &ClaimRequest) -> Result<Option<Claim>, StoreError> {
        in_write_tx!(self, "begin claim", claim(req), |out: &Option<Claim>| out
            .is_some())
    }

    /// Several claims in one transaction (one commit). An error in any of
    /// them rolls all back.
    pub async fn claim_batch(
        &self,
        requests: &[ClaimRequest],
    ) -> Result<Vec<Option<Claim>>, StoreError> {
        macro_rules! claim_all {
            ($ops:ident, $tx:ident) => {{
                let mut claims = Vec::with_capacity(requests.len());
                for req in requests {
                    claims.push($ops::claim(&mut $tx, req).await?);
                }
                let any = claims.iter().any(Option::is_some);
                end_tx($tx, any).await?;
                Ok(claims)
            }};
        }
        match self {
            Store::Sqlite(pool) => {
                let mut tx = begin_sqlite_write(pool, "begin claim batch").await?;
                claim_all!(sqlite, tx)
            }
            Store::Postgres(pool) => {
                let mut tx = pool
                    .begin()
                    .await
                    .map_err(StoreError::query("begin claim batch"))?;
                claim_all!(postgres, tx)
            }
        }
    }

    /// Requested → Scheduled (the master's handoff), setting scheduled_at.
    /// `false`: the lock is lost or the execution is not Requested.
    pub async fn mark_scheduled(&self, fence: &Fence, now: Millis) -> Result<bool, StoreError> {
        on_pool!(
            self,
            "mark scheduled",
            mark("mark scheduled", MARK_SCHEDULED, fence, now)
        )
    }

    /// Scheduled → Running (the worker starts), setting started_at.
    /// `false`: the lock is lost or the execution is not Scheduled.
    pub async fn mark_running(&self, fence: &Fence, now: Millis) -> Result<bool, StoreError> {
        on_pool!(
            self,
            "mark running",
            mark("mark running", MARK_RUNNING, fence, now)
        )
    }

    /// Moves the lock's time to `now` while it is still ours. `false`: the
    /// lock was taken over or released; the job should be cancelled.
    pub async fn renew_lock(&self, fence: &Fence, now: Millis) -> Result<bool, StoreError> {
        on_pool!(self, "renew lock", renew_lock(fence, now))
    }

    /// The post-process, in one transaction: the execution to its terminal
    /// state (only from a non-terminal one), and the branch rule unlocked,
    /// not running, with last_run_time (if `advance_last_run`) and
    /// next_run_time (if set) — only while the fence holds. Returns the
    /// updated branch rule, or `None` when the fence failed (nothing
    /// changed). If the execution was already terminal it stays as it was
    /// and the lock is still released.
    ///
    /// A non-terminal `finish.status` is refused with an `InvalidArgument`
    /// query error before anything is written.
    pub async fn finish(
        &self,
        fence: &Fence,
        finish: &Finish,
    ) -> Result<Option<BranchRule>, StoreError> {
        in_write_tx!(
            self,
            "begin finish",
            finish(fence, finish),
            |out: &Option<BranchRule>| out.is_some()
        )
    }

    /// Applies one transition without batching (e.g. replaying an outbox).
    pub async fn apply(&self, transition: &Transition) -> Result<TransitionOutcome, StoreError> {
        match transition {
            Transition::Claim(req) => self.claim(req).await.map(TransitionOutcome::Claimed),
            Transition::Scheduled { fence, now } => self
                .mark_scheduled(fence, *now)
                .await
                .map(TransitionOutcome::Applied),
            Transition::Running { fence, now } => self
                .mark_running(fence, *now)
                .await
                .map(TransitionOutcome::Applied),
            Transition::RenewLock { fence, now } => self
                .renew_lock(fence, *now)
                .await
                .map(TransitionOutcome::Applied),
            Transition::Finish { fence, finish } => self
                .finish(fence, finish)
                .await
                .map(TransitionOutcome::Finished),
        }
    }
}
