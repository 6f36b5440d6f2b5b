//! Group commit of lifecycle writes.
//!
//! On SQLite the cost of a write is the commit, not the statement: one
//! transaction per transition caps the engine far below its target rate.
//! [`TransitionBatcher`] funnels the transitions of many concurrent callers
//! into one background task that runs everything pending in ONE transaction
//! and answers each caller with its own result. Every transition keeps its
//! own fence and status guard, so batching changes when writes commit, never
//! what they do; the transitions of one kind run as set-based statements
//! (`grouped`), and one by one (`claims`) when a statement fails, to find
//! the transition at fault. On SQLite the set-based statements run on the
//! connection's own handle, on a blocking thread (`direct`); PostgreSQL runs
//! them through sqlx.
//!
//! There is no flush timer: the task starts a transaction as soon as it has
//! anything and takes whatever queued up meanwhile (up to the bound) into
//! the next, so a lone caller waits one commit and a crowd shares commits.
//!
//! SQLite has one writer, so it has one task. PostgreSQL gets
//! [`POSTGRES_WRITER_LANES`] tasks, each with its own connection and its
//! own share of the branch rules: a rule's transitions always go through
//! the same lane, in the order they were queued, and lanes never touch each
//! other's rows, so their transactions neither wait for nor deadlock with
//! each other.
//!
//! The task keeps one connection between batches (see [`Conn`]) and lets it
//! go when the store is closed, so [`Store::close`] does not wait for it.
//! On SQLite a second task copies the WAL back into the database file after
//! the commits ([`checkpoint_beside_the_writer`]), so no commit does.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::pool::PoolConnection;
use sqlx::{Connection, Postgres, Sqlite};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::claims::postgres as postgres_ops;
use super::claims::sqlite as sqlite_ops;
use super::claims::{SQLITE_BEGIN_WRITE, end_tx};
use super::direct::{DirectFailure, WriterConn};
use super::grouped::{ItemResult, apply_grouped, branch_rule_of};
use super::{Store, StoreError};
use crate::lifecycle::{Claim, ClaimRequest, Fence, Finish};
use crate::model::{BranchRule, Millis};

/// Default bound of one transaction: large enough to amortise a commit over
/// hundreds of writes, small enough that the write lock is held briefly.
pub const DEFAULT_MAX_BATCH: usize = 512;

/// Transactions PostgreSQL's writer keeps in flight at once. One lane spent
/// most of a batch waiting: a batch is six or seven round trips (BEGIN, the
/// claims, their executions, the Scheduled/Running update, the release, the
/// finish, COMMIT), and the server worked on it about 60% of the time, on
/// one of its cores. Two lanes drained bursts 12–20% faster with 10
/// workers (though not the engine bench's default 10-worker burst, where
/// each job waits for its own commit) and 36–45% faster with 50; three did
/// no better than two on a two-core machine (BENCHMARKS.md, *PostgreSQL's
/// writer in two lanes*).
const POSTGRES_WRITER_LANES: usize = 2;

/// One lifecycle write. Serializable so an engine can keep unsent ones in
/// its outbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "transition")]
pub enum Transition {
    /// Pending → Requested ([`Store::claim`]).
    Claim(ClaimRequest),
    /// Requested → Scheduled ([`Store::mark_scheduled`]).
    Scheduled { fence: Fence, now: Millis },
    /// Scheduled → Running ([`Store::mark_running`]).
    Running { fence: Fence, now: Millis },
    /// [`Store::renew_lock`].
    RenewLock { fence: Fence, now: Millis },
    /// → terminal, lock released ([`Store::finish`]).
    Finish { fence: Fence, finish: Finish },
}

/// What a [`Transition`] did, as the matching `Store` method returns it.
// Each outcome is moved once, straight to its caller: boxing the large
// variants would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum TransitionOutcome {
    Claimed(Option<Claim>),
    /// Scheduled, Running, RenewLock: `false` when the fence or status did
    /// not match.
    Applied(bool),
    /// `None` when the fence no longer matched (nothing changed).
    Finished(Option<Released>),
}

/// A finish's branch rule after the release.
// Moved once, straight to its caller, like [`TransitionOutcome`].
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Released {
    /// The row as the release left it, for the plan.
    Row(BranchRule),
    /// Released and recorded, but the row no longer reads as a branch rule:
    /// an operator's SQL broke it while the run ran. The finish still
    /// commits (the action ran; it must not run again), and the plan's next
    /// refresh quarantines the row. The text names the column.
    Unreadable(String),
}

impl Released {
    /// The row, or the error that says why it cannot be read, for callers
    /// that need the row itself.
    pub fn into_row(self) -> Result<BranchRule, StoreError> {
        match self {
            Released::Row(row) => Ok(row),
            Released::Unreadable(message) => Err(StoreError::ReleasedUnreadable(message)),
        }
    }
}

/// The error a batched caller gets. Shared because one failed commit is
/// every member's failure; `is_transient()` and the message are the
/// store's own, reachable through `Deref`.
pub type BatchError = Arc<StoreError>;

struct Request {
    transition: Transition,
    reply: oneshot::Sender<Result<TransitionOutcome, BatchError>>,
}

/// A handle to the group-commit tasks, one a lane. Cheap to clone; the
/// tasks end when the last handle is dropped.
#[derive(Debug, Clone)]
pub struct TransitionBatcher {
    lanes: Arc<[mpsc::Sender<Request>]>,
}

impl TransitionBatcher {
    /// Spawns the tasks on the current tokio runtime with
    /// [`DEFAULT_MAX_BATCH`]. Panics outside a tokio runtime.
    pub fn new(store: Store) -> TransitionBatcher {
        TransitionBatcher::with_max_batch(store, DEFAULT_MAX_BATCH)
    }

    /// Spawns the tasks; at most `max_batch` (at least 1) transitions share
    /// a transaction.
    pub fn with_max_batch(store: Store, max_batch: usize) -> TransitionBatcher {
        let max_batch = max_batch.max(1);
        let lanes = match &store {
            Store::Sqlite(_) => 1,
            Store::Postgres(_) => POSTGRES_WRITER_LANES,
        };
        let lanes = (0..lanes)
            .map(|_| {
                // Callers wait for room beyond a few batches: backpressure
                // instead of an unbounded queue when the database is slower
                // than the engine.
                let (requests, receiver) = mpsc::channel(max_batch * 4);
                tokio::spawn(run(store.clone(), receiver, max_batch));
                requests
            })
            .collect();
        TransitionBatcher { lanes }
    }

    /// The lane of a transition: its branch rule's, so that rule's
    /// transitions keep their order and no two lanes write the same row.
    fn lane(&self, transition: &Transition) -> &mpsc::Sender<Request> {
        let (high, low) = branch_rule_of(transition).as_u64_pair();
        // Both halves: a v7 id's high half is its time, a hand-made id's
        // low half may be a counter.
        let lane = (high ^ low) % self.lanes.len() as u64;
        &self.lanes[lane as usize]
    }

    /// Submits any transition and waits for its own result.
    ///
    /// Item-level errors (a refused constraint, a bad status) reach only
    /// their caller; the rest of the batch is re-run without them. Errors
    /// of the transaction itself (database unreachable, busy, commit
    /// failed) reach every member of that batch: the engine's outbox
    /// retries, and a commit that failed in flight may have landed, so the
    /// batcher does not guess. Only a PostgreSQL deadlock or serialization
    /// victim, rolled back whole, is re-run here.
    pub async fn submit(&self, transition: Transition) -> Result<TransitionOutcome, BatchError> {
        self.enqueue(transition).await.outcome().await
    }

    /// Queues a transition without waiting for its commit: it waits only
    /// for room in the queue. Transitions of one branch rule enqueued one
    /// after another commit in that order (they share a lane, and the same
    /// batch keeps a rule's transitions in order), so a caller can queue a
    /// write that depends on an earlier one before the earlier one has
    /// committed. Transitions of different rules may commit in any order.
    pub async fn enqueue(&self, transition: Transition) -> PendingTransition {
        enqueue_on(self.lane(&transition), transition).await
    }

    /// Returns once everything queued before the call has committed or
    /// failed, on every lane: a write that matches no row (a lock renewal
    /// of the nil branch rule) is queued on each lane and waited for. Each
    /// lane runs its queue in order, and a barrier routed like a
    /// transition would wait for one lane only. `holder` and `now` only
    /// fill the write.
    pub async fn barrier(&self, holder: &str, now: Millis) {
        let fence = Fence {
            execution_id: Uuid::nil(),
            branch_rule_id: Uuid::nil(),
            holder: holder.to_owned(),
            epoch: -1,
        };
        let mut pending = Vec::with_capacity(self.lanes.len());
        for lane in self.lanes.iter() {
            let transition = Transition::RenewLock {
                fence: fence.clone(),
                now,
            };
            pending.push(enqueue_on(lane, transition).await);
        }
        for lane in pending {
            let _ = lane.outcome().await;
        }
    }

    /// [`Store::claim`], group-committed.
    pub async fn claim(&self, req: &ClaimRequest) -> Result<Option<Claim>, BatchError> {
        match self.submit(Transition::Claim(req.clone())).await? {
            TransitionOutcome::Claimed(claim) => Ok(claim),
            other => unreachable!("claim answered with {other:?}"),
        }
    }

    /// [`Store::mark_scheduled`], group-committed.
    pub async fn mark_scheduled(&self, fence: &Fence, now: Millis) -> Result<bool, BatchError> {
        let fence = fence.clone();
        self.applied(Transition::Scheduled { fence, now }).await
    }

    /// [`Store::mark_running`], group-committed.
    pub async fn mark_running(&self, fence: &Fence, now: Millis) -> Result<bool, BatchError> {
        let fence = fence.clone();
        self.applied(Transition::Running { fence, now }).await
    }

    /// [`Store::renew_lock`], group-committed.
    pub async fn renew_lock(&self, fence: &Fence, now: Millis) -> Result<bool, BatchError> {
        let fence = fence.clone();
        self.applied(Transition::RenewLock { fence, now }).await
    }

    /// [`Store::finish`], group-committed.
    pub async fn finish(
        &self,
        fence: &Fence,
        finish: &Finish,
    ) -> Result<Option<BranchRule>, BatchError> {
        self.queue_finish(fence, finish).await.finished().await
    }

    /// [`TransitionBatcher::finish`] without waiting for the commit; see
    /// [`PendingTransition::finished`].
    pub async fn queue_finish(&self, fence: &Fence, finish: &Finish) -> PendingTransition {
        let transition = Transition::Finish {
            fence: fence.clone(),
            finish: finish.clone(),
        };
        self.enqueue(transition).await
    }

    async fn applied(&self, transition: Transition) -> Result<bool, BatchError> {
        self.enqueue(transition).await.applied().await
    }
}

/// Queues `transition` on `lane`. If the lane's task is gone the request,
/// and its reply sender, drop here: the pending outcome then reads as
/// closed.
async fn enqueue_on(lane: &mpsc::Sender<Request>, transition: Transition) -> PendingTransition {
    let (reply, answer) = oneshot::channel();
    let _ = lane.send(Request { transition, reply }).await;
    PendingTransition { answer }
}

/// A transition queued by [`TransitionBatcher::enqueue`]: its outcome once
/// its batch has committed.
#[derive(Debug)]
pub struct PendingTransition {
    answer: oneshot::Receiver<Result<TransitionOutcome, BatchError>>,
}

impl PendingTransition {
    pub async fn outcome(self) -> Result<TransitionOutcome, BatchError> {
        self.answer
            .await
            .unwrap_or_else(|_| Err(Arc::new(closed())))
    }

    /// The outcome of a Finish: the branch rule after it, `None` when the
    /// fence no longer matched.
    pub async fn released(self) -> Result<Option<Released>, BatchError> {
        match self.outcome().await? {
            TransitionOutcome::Finished(released) => Ok(released),
            other => unreachable!("finish answered with {other:?}"),
        }
    }

    /// [`PendingTransition::released`], for callers that need the row: a
    /// row that no longer reads is an error here, though the finish landed.
    pub async fn finished(self) -> Result<Option<BranchRule>, BatchError> {
        self.released()
            .await?
            .map(|released| released.into_row().map_err(Arc::new))
            .transpose()
    }

    /// The outcome of a Scheduled, Running or RenewLock transition.
    pub async fn applied(self) -> Result<bool, BatchError> {
        match self.outcome().await? {
            TransitionOutcome::Applied(applied) => Ok(applied),
            other => unreachable!("transition answered with {other:?}"),
        }
    }
}

/// The task is gone: the runtime is shutting down or the store was closed.
fn closed() -> StoreError {
    StoreError::Query {
        op: "transition batch",
        error: sqlx::Error::PoolClosed,
    }
}

async fn run(store: Store, mut receiver: mpsc::Receiver<Request>, max_batch: usize) {
    let mut closed = std::pin::pin!(match &store {
        Store::Sqlite(pool) => pool.close_event(),
        Store::Postgres(pool) => pool.close_event(),
    });
    // Capacity 1: commits while a checkpoint runs ask for one more, not
    // one each. The checkpointer ends with this task.
    let checkpoints = match &store {
        Store::Sqlite(pool) => {
            let (commits, committed) = mpsc::channel(1);
            tokio::spawn(checkpoint_beside_the_writer(pool.clone(), committed));
            Some(commits)
        }
        Store::Postgres(_) => None,
    };
    let mut writer = Writer { store, conn: None };
    let mut batch = Vec::with_capacity(max_batch);
    loop {
        let first = tokio::select! {
            biased;
            // Store::close waits for every checked-out connection, the one
            // kept here too: let it go rather than hang the shutdown.
            () = &mut closed, if writer.conn.is_some() => {
                writer.conn = None;
                continue;
            }
            request = receiver.recv() => match request {
                Some(request) => request,
                None => break,
            },
        };
        batch.push(first);
        drain(&mut receiver, &mut batch, max_batch);
        if batch.len() < max_batch {
            // Callers just answered by the previous commit are runnable and
            // about to submit their next transition; one turn of the
            // scheduler lets them join this batch instead of forming a
            // straggler batch of their own. Not a timer: when nobody else
            // is runnable this returns at once.
            tokio::task::yield_now().await;
            drain(&mut receiver, &mut batch, max_batch);
        }
        // A caller that stopped waiting (timed out, cancelled) must not have
        // its write land behind its back: it may already be in its outbox.
        batch.retain(|request| !request.reply.is_closed());
        writer.run_batch(&mut batch).await;
        batch.clear();
        if let Some(commits) = &checkpoints {
            let _ = commits.try_send(());
        }
    }
}

/// How long the checkpointer lets commits gather before it copies them.
/// One checkpoint per commit (as before) synced the WAL and the database
/// file every 1–2 ms in a drain and copied the same hot pages (the branch
/// rules' indexes, the executions' newest leaves) again each time: a fifth
/// of all CPU in a 10-worker drain (`walCheckpoint` in a DWARF profile).
/// Spaced 25 ms apart, drains spent a quarter to a third less system time and
/// a 100,000 drain ran 2–19% faster (BENCHMARKS.md, *Checkpoints spaced*).
/// A commit never waits for this: it only bounds how far the database file
/// trails the WAL.
const CHECKPOINT_SPACING: Duration = Duration::from_millis(25);

/// Copies committed WAL pages back into the database file on a pooled
/// connection, after the writer's commits, so the writer's own
/// commits never do it. With SQLite's automatic checkpoint the commit that
/// crossed the threshold copied thousands of pages and synced the file
/// before its callers got their answers; every job of that batch waited,
/// and with a long history those pages lie all over a large file. A
/// PASSIVE checkpoint never waits for, nor blocks, the writer or readers;
/// what it cannot copy yet waits for the next one. A pool with no free
/// connection (an in-memory database has only the writer's) skips a round,
/// and the writer's own threshold ([`SQLITE_WRITER_PRAGMAS`]) remains the
/// backstop. At most one checkpoint runs per [`CHECKPOINT_SPACING`].
async fn checkpoint_beside_the_writer(pool: sqlx::SqlitePool, mut committed: mpsc::Receiver<()>) {
    while committed.recv().await.is_some() {
        // The commits of the next few milliseconds join this checkpoint.
        tokio::time::sleep(CHECKPOINT_SPACING).await;
        let Some(mut conn) = pool.try_acquire() else {
            continue;
        };
        match sqlx::query_as::<_, (i64, i64, i64)>("PRAGMA wal_checkpoint(PASSIVE)")
            .fetch_one(&mut *conn)
            .await
        {
            Ok((busy, frames, copied)) => {
                tracing::trace!(busy, frames, copied, "WAL checkpoint beside the writer")
            }
            Err(error) => tracing::debug!("WAL checkpoint beside the writer: {error}"),
        }
    }
}

fn drain(receiver: &mut mpsc::Receiver<Request>, batch: &mut Vec<Request>, max_batch: usize) {
    while batch.len() < max_batch {
        match receiver.try_recv() {
            Ok(request) => batch.push(request),
            Err(_) => break,
        }
    }
}

/// How one attempt at a whole batch ended. The transaction was rolled back
/// in every case.
enum Failure {
    /// A set-based statement failed; which transition caused it is unknown.
    Group(StoreError),
    /// Transition `index` failed (one-by-one mode).
    Item { index: usize, error: StoreError },
    /// Acquire, begin or commit failed.
    Transaction(StoreError),
}

impl Failure {
    fn error(&self) -> &StoreError {
        match self {
            Failure::Group(error) | Failure::Item { error, .. } | Failure::Transaction(error) => {
                error
            }
        }
    }

    /// The connection may be broken: do not keep it.
    fn suspect(&self) -> bool {
        matches!(self, Failure::Transaction(_)) || self.error().is_transient()
    }

    /// PostgreSQL chose this transaction as a deadlock or serialization
    /// victim and rolled all of it back: running it again is safe. (Two
    /// instances' batches may lock the same branch rules in different
    /// orders.) Not for a failed commit, whose outcome is unknown.
    fn retry_safe(&self) -> bool {
        let (Failure::Group(error) | Failure::Item { error, .. }) = self else {
            return false;
        };
        error.is_rollback_victim()
    }
}

/// How many times a batch is re-run after a deadlock or serialization
/// failure before its callers get the error.
const RETRIES: usize = 2;

/// Statement by statement, or set-based (see `grouped`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Grouped,
    OneByOne,
}

/// The batcher's own connection, kept from batch to batch. SQLite keeps a
/// page cache per connection and drops it when another connection wrote
/// since; taking whichever pooled connection is free meant re-reading the
/// hot pages from the file on almost every batch.
enum Conn {
    Sqlite(WriterConn),
    Postgres(PoolConnection<Postgres>),
}

/// Settings for the one connection that does nearly all lifecycle writes.
/// A batch touches pages all over the tables and indexes (ids are random
/// UUIDs): a 64 MiB cache keeps them instead of re-reading them each batch;
/// statement journals of the set-based statements stay in memory. The WAL
/// is checkpointed beside the writer ([`checkpoint_beside_the_writer`]);
/// the writer checkpoints itself only if the WAL reaches 16,000 pages
/// (64 MiB), which happens only when that cannot keep up. The connection
/// is closed rather than returned to the pool, so these stay with it.
const SQLITE_WRITER_PRAGMAS: &str =
    "PRAGMA cache_size = -65536; PRAGMA temp_store = MEMORY; PRAGMA wal_autocheckpoint = 16000";

async fn tune_sqlite(
    conn: Result<PoolConnection<Sqlite>, sqlx::Error>,
) -> Result<WriterConn, sqlx::Error> {
    let mut conn = conn?;
    conn.close_on_drop();
    sqlx::raw_sql(SQLITE_WRITER_PRAGMAS)
        .execute(&mut *conn)
        .await?;
    Ok(WriterConn::new(conn))
}

/// Settings for PostgreSQL's writer connection. Every statement of a batch
/// finds its rows by key (an execution's id, a branch rule's id, an
/// occurrence), so a sequential scan is never the right plan for them, but
/// PostgreSQL chose one: sqlx prepares each statement once per connection,
/// and after five runs PostgreSQL keeps a generic plan costed on the table
/// as it was then. On a database whose `executions` has not been analyzed
/// yet (a new one, until autovacuum's first analyze, or for good where
/// autovacuum is off) the planner sized that table at its floor of ten
/// pages, the kept plan scanned it, and every Scheduled and finish of a
/// burst read the whole table: 1 ms a statement at 10,000 rows, against
/// 0.2 ms by key. Seq scans are priced out on this one connection, which is
/// closed rather than returned to the pool, so the settings stay with it.
/// With scans out of the running the generic plan is also the one wanted,
/// and forcing it saves re-planning at every bind (0.16 ms a run for the
/// release, measured).
const POSTGRES_WRITER_SETTINGS: &str =
    "SET enable_seqscan = off; SET plan_cache_mode = force_generic_plan";

async fn tune_postgres(
    conn: Result<PoolConnection<Postgres>, sqlx::Error>,
) -> Result<PoolConnection<Postgres>, sqlx::Error> {
    let mut conn = conn?;
    conn.close_on_drop();
    sqlx::raw_sql(POSTGRES_WRITER_SETTINGS)
        .execute(&mut *conn)
        .await?;
    Ok(conn)
}

struct Writer {
    store: Store,
    conn: Option<Conn>,
}

impl Writer {
    /// Answers every request of `batch`. Set-based first; if a statement
    /// fails for a reason of its own, the batch is run again one transition
    /// at a time, where a failing transition is answered with its error and
    /// the others are run again without it.
    async fn run_batch(&mut self, batch: &mut Vec<Request>) {
        let mut mode = Mode::Grouped;
        while !batch.is_empty() {
            match self.try_batch(batch, mode).await {
                Ok(results) => {
                    for (request, result) in batch.drain(..).zip(results) {
                        let _ = request.reply.send(result.map_err(Arc::new));
                    }
                    return;
                }
                Err(Failure::Group(error)) if !error.is_transient() => {
                    tracing::warn!(
                        "transition batch: {error}; running its {} transition(s) one by one",
                        batch.len()
                    );
                    mode = Mode::OneByOne;
                }
                Err(Failure::Item { index, error }) if !error.is_transient() => {
                    tracing::warn!(
                        "transition batch: {error}; running the other {} transition(s) again",
                        batch.len() - 1
                    );
                    let request = batch.remove(index);
                    let _ = request.reply.send(Err(Arc::new(error)));
                }
                Err(failure) => {
                    let error = Arc::new(match failure {
                        Failure::Group(error)
                        | Failure::Item { error, .. }
                        | Failure::Transaction(error) => error,
                    });
                    for request in batch.drain(..) {
                        let _ = request.reply.send(Err(Arc::clone(&error)));
                    }
                    return;
                }
            }
        }
    }

    async fn try_batch(
        &mut self,
        batch: &[Request],
        mode: Mode,
    ) -> Result<Vec<ItemResult>, Failure> {
        let mut retries = 0;
        let mut fresh_connection_tried = false;
        loop {
            let kept = self.conn.is_some();
            let failure = match self.try_batch_once(batch, mode).await {
                Ok(results) => return Ok(results),
                Err(failure) => failure,
            };
            if failure.suspect() {
                self.conn = None;
            }
            // A kept connection may have died while idle (server restart,
            // idle timeout); nothing ran if even BEGIN failed, so one more
            // try on a fresh connection is safe.
            let stale_connection = kept
                && !fresh_connection_tried
                && matches!(failure, Failure::Transaction(_))
                && self.conn.is_none();
            if stale_connection {
                fresh_connection_tried = true;
                continue;
            }
            if failure.retry_safe() && retries < RETRIES {
                retries += 1;
                continue;
            }
            return Err(failure);
        }
    }

    async fn try_batch_once(
        &mut self,
        batch: &[Request],
        mode: Mode,
    ) -> Result<Vec<ItemResult>, Failure> {
        /// Runs `$apply` for the batch inside `$tx` and ends the
        /// transaction: committed if everything ran, rolled back (none of
        /// it stays) at the first error.
        macro_rules! in_tx {
            ($tx:ident, $apply:expr) => {{
                match $apply {
                    Ok(results) => {
                        end_tx($tx, true).await.map_err(Failure::Transaction)?;
                        Ok(results)
                    }
                    Err(failure) => {
                        let _ = end_tx($tx, false).await;
                        Err(failure)
                    }
                }
            }};
        }
        macro_rules! one_by_one {
            ($ops:ident, $tx:ident) => {{
                let mut results = Vec::with_capacity(batch.len());
                let mut failure = None;
                for (index, request) in batch.iter().enumerate() {
                    match $ops::apply(&mut $tx, &request.transition).await {
                        Ok(outcome) => results.push(Ok(outcome)),
                        Err(error) => {
                            failure = Some(Failure::Item { index, error });
                            break;
                        }
                    }
                }
                failure.map_or(Ok(results), Err)
            }};
        }
        let op = "begin transition batch";
        if self.conn.is_none() {
            let conn = match &self.store {
                Store::Sqlite(pool) => tune_sqlite(pool.acquire().await).await.map(Conn::Sqlite),
                Store::Postgres(pool) => tune_postgres(pool.acquire().await)
                    .await
                    .map(Conn::Postgres),
            };
            self.conn = Some(
                conn.map_err(StoreError::query(op))
                    .map_err(Failure::Transaction)?,
            );
        }
        let transitions = || batch.iter().map(|request| &request.transition);
        match (self.conn.as_mut(), mode) {
            (Some(Conn::Sqlite(_)), Mode::Grouped) => {
                self.run_sqlite_direct(transitions().cloned().collect())
                    .await
            }
            (Some(Conn::Sqlite(conn)), Mode::OneByOne) => {
                let mut tx = conn
                    .sqlx()
                    .begin_with(SQLITE_BEGIN_WRITE)
                    .await
                    .map_err(StoreError::query(op))
                    .map_err(Failure::Transaction)?;
                in_tx!(tx, one_by_one!(sqlite_ops, tx))
            }
            (Some(Conn::Postgres(conn)), mode) => {
                let mut tx = conn
                    .begin()
                    .await
                    .map_err(StoreError::query(op))
                    .map_err(Failure::Transaction)?;
                match mode {
                    Mode::Grouped => {
                        let transitions: Vec<&Transition> = transitions().collect();
                        // PostgreSQL has aborted the transaction after a
                        // failed statement; rolled back either way.
                        in_tx!(
                            tx,
                            apply_grouped(&mut *tx, &transitions)
                                .await
                                .map_err(Failure::Group)
                        )
                    }
                    Mode::OneByOne => in_tx!(tx, one_by_one!(postgres_ops, tx)),
                }
            }
            (None, _) => unreachable!("acquired above"),
        }
    }

    /// The grouped batch on the SQLite connection's own handle (`direct`),
    /// on a blocking thread: SQLite works, and may wait for the write lock,
    /// there rather than on the runtime.
    async fn run_sqlite_direct(
        &mut self,
        transitions: Vec<Transition>,
    ) -> Result<Vec<ItemResult>, Failure> {
        let Some(Conn::Sqlite(mut conn)) = self.conn.take() else {
            unreachable!("called with a SQLite connection")
        };
        let runtime = tokio::runtime::Handle::current();
        let joined = tokio::task::spawn_blocking(move || {
            let transitions: Vec<&Transition> = transitions.iter().collect();
            let outcome = runtime.block_on(conn.run_grouped(&transitions));
            (conn, outcome)
        })
        .await;
        let (conn, outcome) = match joined {
            Ok(done) => done,
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            // The runtime is shutting down; the connection went with it.
            Err(_) => return Err(Failure::Transaction(closed())),
        };
        self.conn = Some(Conn::Sqlite(conn));
        outcome.map_err(|failure| match failure {
            DirectFailure::Group(error) => Failure::Group(error),
            DirectFailure::Transaction(error) => Failure::Transaction(error),
        })
    }
}
