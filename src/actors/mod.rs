//! One actor per file. Each is a thin shell: its logic lives in the pure
//! modules (`plan`, `schedule`, `memory`, `supervision::policy`), so the
//! actors only own state, receive messages and do I/O.

pub mod lease;
pub mod master;
pub mod memory_guard;
pub mod plan;
pub mod pruner;
pub mod refresher;
pub mod worker;
pub mod writer;

use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{ActorRef, Message, RpcReplyPort};

use crate::directory::Directory;
use crate::lifecycle::{Fence, Finish};
use crate::messages::{MasterMsg, PlanMsg, RefresherMsg};
use crate::metrics as m;
use crate::model::Millis;
use crate::plan::OutboxEntry;
use crate::store::{BatchError, PendingTransition, Released, TransitionBatcher};

/// How long one actor waits for another's reply before giving up. Generous,
/// because a merge of a million workflows takes a while, yet bounded so a
/// wedged actor is noticed rather than waited on forever.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AskError {
    #[error("the actor is not running")]
    NotRunning,
    #[error("the actor did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the actor stopped before answering")]
    Dropped,
}

/// Sends a query and waits up to [`CALL_TIMEOUT`] for the answer.
pub async fn ask<M: Message, T: Send + 'static>(
    actor: &ActorRef<M>,
    build: impl FnOnce(RpcReplyPort<T>) -> M,
) -> Result<T, AskError> {
    ask_within(actor, CALL_TIMEOUT, build).await
}

pub async fn ask_within<M: Message, T: Send + 'static>(
    actor: &ActorRef<M>,
    timeout: Duration,
    build: impl FnOnce(RpcReplyPort<T>) -> M,
) -> Result<T, AskError> {
    match actor.call(build, Some(timeout)).await {
        Ok(CallResult::Success(value)) => Ok(value),
        Ok(CallResult::Timeout) => Err(AskError::Timeout(timeout)),
        Ok(CallResult::SenderError) => Err(AskError::Dropped),
        Err(_) => Err(AskError::NotRunning),
    }
}

/// How a job's terminal write went.
#[derive(Debug)]
pub(crate) enum Recorded {
    Landed,
    /// The fence no longer matched: the claim is someone else's now.
    TakenOver,
    /// The database could not take it; it waits in the plan's outbox.
    InOutbox(BatchError),
}

/// A job's terminal write, through the group commit; the branch rule's new
/// row goes back to the plan. If the database cannot take it, the write
/// waits in the plan's outbox (saved with the plan, retried until it lands)
/// and the plan computes the next run itself, so nothing is lost.
pub(crate) async fn record_finish(
    batcher: &TransitionBatcher,
    directory: &Directory,
    fence: &Fence,
    finish: Finish,
    now: Millis,
) -> Recorded {
    let pending = batcher.queue_finish(fence, &finish).await;
    finish_recorded(pending, directory, fence, finish, now).await
}

/// The second half of [`record_finish`], for a caller that queued the
/// finish itself and had something to do before its commit.
pub(crate) async fn finish_recorded(
    pending: PendingTransition,
    directory: &Directory,
    fence: &Fence,
    finish: Finish,
    now: Millis,
) -> Recorded {
    let plan = directory.plan();
    match pending.released().await {
        Ok(Some(Released::Row(row))) => {
            if let Some(plan) = plan {
                let _ = plan.cast(PlanMsg::PostProcessed(row));
            }
            Recorded::Landed
        }
        Ok(Some(Released::Unreadable(problem))) => {
            released_unreadable(directory, fence, &finish, &problem);
            Recorded::Landed
        }
        Ok(None) => Recorded::TakenOver,
        Err(error) => {
            metrics::counter!(m::DB_ERRORS_TOTAL, "op" => "finish").increment(1);
            if let Some(plan) = plan {
                let local = finished_locally(fence, &finish);
                let entry = OutboxEntry {
                    fence: fence.clone(),
                    finish,
                    added_at: now,
                };
                let _ = plan.cast(PlanMsg::AddOutbox(Box::new(entry)));
                if let Some(local) = local {
                    let _ = plan.cast(local);
                }
            }
            Recorded::InOutbox(error)
        }
    }
}

/// A finish landed, but the branch rule it released no longer reads (an
/// operator's SQL broke the row while the run ran). The plan keeps the
/// finish's outcome locally, as it does for a write in the outbox, and a
/// refresh now quarantines the row and names the column.
pub(crate) fn released_unreadable(
    directory: &Directory,
    fence: &Fence,
    finish: &Finish,
    problem: &str,
) {
    metrics::counter!(m::DB_ERRORS_TOTAL, "op" => "finish_row").increment(1);
    tracing::warn!(
        branch_rule_id = %fence.branch_rule_id,
        execution_id = %fence.execution_id,
        "🩹 Recorded the finish of execution {}, but its branch rule no longer reads: {problem}; the next refresh quarantines it",
        fence.execution_id
    );
    if let Some(plan) = directory.plan()
        && let Some(local) = finished_locally(fence, finish)
    {
        let _ = plan.cast(local);
    }
    if let Some(refresher) = directory.refresher() {
        let _ = refresher.cast(RefresherMsg::RefreshNow);
    }
}

/// The finish's outcome for the plan to keep locally, when the database
/// did not hand back the row: `None` when the finish leaves next_run_time
/// as it was.
fn finished_locally(fence: &Fence, finish: &Finish) -> Option<PlanMsg> {
    (finish.next_run_time.is_some() || finish.clear_next_run).then(|| PlanMsg::FinishedLocally {
        id: fence.branch_rule_id,
        next_run_time: finish.next_run_time,
        retry: finish.retry,
    })
}

/// How long a restarted actor waits for the master to say whether memory
/// is short: briefly, since a master starting at the same time may be
/// asking the restarted actor in turn.
const MASTER_ANSWER: Duration = Duration::from_secs(2);

/// Whether a master is running and holds work back for memory: what a
/// restarted memory guard or lease actor resumes from.
pub async fn master_is_throttled(directory: &Directory) -> bool {
    match directory.master() {
        Some(master) => ask_within(&master, MASTER_ANSWER, MasterMsg::IsMemoryThrottled)
            .await
            .unwrap_or(false),
        None => false,
    }
}
