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

use super::batch::{Released, Transition, TransitionOutcome};
use super::grouped::{apply_grouped, skip_occurrences};
use super::{Store, StoreError};
use crate::lifecycle::{Claim, ClaimRequest, Fence, Finish, SkipRequest};
use crate::model::{BranchRule, Millis};

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

/// One transition on one connection (inside a transaction the caller
/// owns), through the same set-based statements the batcher runs: a
/// lifecycle statement is written once, in `grouped`, for one row or many.
macro_rules! lifecycle_ops {
    ($conn_type:ty) => {
        use super::*;

        pub(in crate::store) async fn apply(
            conn: &mut $conn_type,
            transition: &Transition,
        ) -> Result<TransitionOutcome, StoreError> {
            let mut results = apply_grouped(conn, &[transition]).await?;
            results.pop().expect("one transition, one answer")
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

impl Store {
    /// Claims a due branch rule for one occurrence: one conditional UPDATE
    /// (locks it, increments lock_epoch) and, only if that matched, the
    /// Requested execution row, in one transaction. `None` when the rule is
    /// not due, not runnable (inactive, archived, force-stopped) or locked
    /// by someone with a live lock: stamped within `lock_timeout_ms` of
    /// `req.now`, either way (`plan::lock_is_stale`).
    pub async fn claim(&self, req: &ClaimRequest) -> Result<Option<Claim>, StoreError> {
        match self.apply(&Transition::Claim(req.clone())).await? {
            TransitionOutcome::Claimed(claim) => Ok(claim),
            other => unreachable!("a claim answered {other:?}"),
        }
    }

    /// Several claims in one transaction (one commit). An error in any of
    /// them rolls all back.
    pub async fn claim_batch(
        &self,
        requests: &[ClaimRequest],
    ) -> Result<Vec<Option<Claim>>, StoreError> {
        let transitions: Vec<Transition> =
            requests.iter().cloned().map(Transition::Claim).collect();
        let refs: Vec<&Transition> = transitions.iter().collect();
        let outcomes = match self {
            Store::Sqlite(pool) => {
                let mut tx = begin_sqlite_write(pool, "begin claim batch").await?;
                let out = apply_grouped(&mut *tx, &refs).await?;
                end_tx(tx, true).await?;
                out
            }
            Store::Postgres(pool) => {
                let mut tx = pool
                    .begin()
                    .await
                    .map_err(StoreError::query("begin claim batch"))?;
                let out = apply_grouped(&mut *tx, &refs).await?;
                end_tx(tx, true).await?;
                out
            }
        };
        outcomes
            .into_iter()
            .map(|outcome| match outcome? {
                TransitionOutcome::Claimed(claim) => Ok(claim),
                other => unreachable!("a claim answered {other:?}"),
            })
            .collect()
    }

    /// Requested → Scheduled (the master's handoff), setting scheduled_at.
    /// `false`: the lock is lost or the execution is not Requested.
    pub async fn mark_scheduled(&self, fence: &Fence, now: Millis) -> Result<bool, StoreError> {
        let transition = Transition::Scheduled {
            fence: fence.clone(),
            now,
        };
        self.apply(&transition).await.map(applied)
    }

    /// Scheduled → Running (the worker starts), setting started_at.
    /// `false`: the lock is lost or the execution is not Scheduled.
    pub async fn mark_running(&self, fence: &Fence, now: Millis) -> Result<bool, StoreError> {
        let transition = Transition::Running {
            fence: fence.clone(),
            now,
        };
        self.apply(&transition).await.map(applied)
    }

    /// Moves the lock's time to `now` while it is still ours. `false`: the
    /// lock was taken over or released; the job should be cancelled.
    pub async fn renew_lock(&self, fence: &Fence, now: Millis) -> Result<bool, StoreError> {
        let transition = Transition::RenewLock {
            fence: fence.clone(),
            now,
        };
        self.apply(&transition).await.map(applied)
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
        self.finish_released(fence, finish)
            .await?
            .map(Released::into_row)
            .transpose()
    }

    /// [`Store::finish`], with a released row that no longer decodes as an
    /// outcome rather than an error: the finish landed all the same.
    pub async fn finish_released(
        &self,
        fence: &Fence,
        finish: &Finish,
    ) -> Result<Option<Released>, StoreError> {
        let transition = Transition::Finish {
            fence: fence.clone(),
            finish: finish.clone(),
        };
        match self.apply(&transition).await? {
            TransitionOutcome::Finished(released) => Ok(released),
            other => unreachable!("a finish answered {other:?}"),
        }
    }

    /// The master's misfire decision, in one write transaction (not
    /// through the batcher: it is rare). Moves the branch rule's
    /// next_run_time from `req.expected_next_run_time` to
    /// `req.next_run_time` — only while it still says the expected value,
    /// no retry is pending and no live lock is on it (free, or stale by
    /// `req.lock_timeout_ms`) — and, only if that matched, records each of
    /// `req.skipped` as a `skipped` execution (owner `req.holder`, the
    /// row's lock_epoch, at `req.now`; an occurrence already recorded
    /// skipped is not recorded again). Returns the updated branch rule, or
    /// `None` when the compare failed and nothing was written: another
    /// instance (or a claim) got there first.
    pub async fn skip_occurrences(
        &self,
        req: &SkipRequest,
    ) -> Result<Option<BranchRule>, StoreError> {
        let op = "begin skip occurrences";
        match self {
            Store::Sqlite(pool) => {
                let mut tx = begin_sqlite_write(pool, op).await?;
                let out = skip_occurrences(&mut *tx, req).await?;
                end_tx(tx, out.is_some()).await?;
                Ok(out)
            }
            Store::Postgres(pool) => {
                let mut tx = pool.begin().await.map_err(StoreError::query(op))?;
                let out = skip_occurrences(&mut *tx, req).await?;
                end_tx(tx, out.is_some()).await?;
                Ok(out)
            }
        }
    }

    /// Applies one transition without batching (e.g. replaying an outbox),
    /// in a transaction of its own.
    pub async fn apply(&self, transition: &Transition) -> Result<TransitionOutcome, StoreError> {
        in_write_tx!(
            self,
            "begin transition",
            apply(transition),
            |out: &TransitionOutcome| !matches!(out, TransitionOutcome::Claimed(None))
        )
    }
}

fn applied(outcome: TransitionOutcome) -> bool {
    match outcome {
        TransitionOutcome::Applied(applied) => applied,
        other => unreachable!("a fenced mark answered {other:?}"),
    }
}
