use uuid::Uuid;

use crate::lifecycle::Fence;
use crate::model::Execution;
use crate::plan::JobSpec;
use crate::store::PendingTransition;

/// One claimed occurrence handed to a worker: after this message the worker
/// owns the execution's state (seed 002's handoff).
#[derive(Debug, Clone)]
pub struct Job {
    /// The execution row as the claim inserted it.
    pub execution: Execution,
    /// Proof of the claim; every write the job makes carries it.
    pub fence: Fence,
    pub spec: JobSpec,
    /// When the lock was last stamped, as far as this instance knows: the
    /// claim, then each renewal that landed (the master's while the job is
    /// queued, the worker's while it runs). A peer may take the lock over
    /// once it is SCHEDULE_LOCK_TIMEOUT_SECONDS old
    /// ([`CancelReason::LockExpiring`]).
    pub lock_renewed_at: crate::model::Millis,
}

impl Job {
    pub fn branch_rule_id(&self) -> Uuid {
        self.spec.branch_rule.id
    }

    pub fn execution_id(&self) -> Uuid {
        self.execution.id
    }
}

/// Why a running job is being cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelReason {
    /// An operator asked (API, force-stop).
    Requested,
    /// The service is stopping and the grace period is over.
    Shutdown,
    /// Lock renewal found the lock gone: another owner may run it.
    LockLost,
    /// Lock renewals have failed for two of their intervals in a row (the
    /// database refused them, while it may still take the heartbeats): a
    /// third would find the lock stale, and a peer free to take it over
    /// and run the occurrence beside this job. The job stops first; its
    /// finish is recorded, and leaves the occurrence to run again.
    LockExpiring,
    /// The next occurrence fell due and the policy is `cancel_running`.
    Overlap,
}

impl CancelReason {
    /// How the occurrence ends for the policy decisions when this cancel
    /// asked for it to go; `None` for cancels that are not about the
    /// occurrence (shutdown, a lost lock).
    pub fn ending(self) -> Option<crate::plan::Ending> {
        match self {
            CancelReason::Requested => Some(crate::plan::Ending::Cancelled),
            CancelReason::Overlap => Some(crate::plan::Ending::CancelledByOverlap),
            CancelReason::Shutdown | CancelReason::LockLost | CancelReason::LockExpiring => None,
        }
    }
}

/// The result of a job's actions, before it is recorded.
#[derive(Debug, Clone)]
pub struct JobOutcome {
    pub status: crate::model::ExecutionStatus,
    pub error: Option<String>,
    pub output: serde_json::Value,
}

/// Messages of the [`WorkerActor`](crate::actors::worker::WorkerActor).
#[derive(Debug)]
pub enum WorkerMsg {
    /// The handoff. The master's Scheduled write is queued, not yet
    /// committed: `scheduled` says how it went. The worker queues Running
    /// behind it; it starts a fresh claim's job at once and an older
    /// one's only once both applied.
    Run {
        job: Box<Job>,
        scheduled: PendingTransition,
    },
    Cancel {
        execution_id: Uuid,
        reason: CancelReason,
    },
    /// Renew the claim's lock_time (every third of the lock timeout).
    RenewLock,
    /// The memory guard's state, from the master: a job handed over while
    /// throttled waits for the release before it starts; a running one
    /// goes on.
    MemoryThrottle { throttled: bool },
    /// The actions finished (sent by the worker's own job task).
    ActionsDone(Box<JobOutcome>),
    /// A job started on a fresh claim before its Scheduled and Running
    /// writes committed, and they found the claim gone: its actions stop.
    ClaimLost { execution_id: Uuid },
}
