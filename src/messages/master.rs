use std::time::Duration;

use ractor::{ActorId, RpcReplyPort};
use serde::Serialize;
use uuid::Uuid;

use crate::lifecycle::Claim;
use crate::memory::ThrottleStatus;
use crate::model::{ExecutionStatus, Millis};
use crate::plan::JobSpec;
use crate::queue::{QueueStats, StartLagSeries};

/// Messages of the [`MasterActor`](crate::actors::master::MasterActor).
#[derive(Debug)]
pub enum MasterMsg {
    /// `overlap: cancel_running`: the next occurrence of this execution's
    /// rule fell due; cancel the run if it is still going.
    OverlapDue {
        execution_id: Uuid,
    },
    /// Fetch ready rules, claim, queue and dispatch. Carries the generation
    /// of the timer that sent it; a tick superseded by an earlier wake-up is
    /// ignored.
    Tick(u64),
    /// The claims of one fetch came back (sent by the master's claim task).
    ClaimsDone(Vec<(JobSpec, Result<Option<Claim>, String>)>),
    /// The plan changed (a refresh, a finished job): look again now.
    PlanChanged,
    /// Start one worker actor (at start-up, staggered; after a cooldown).
    SpawnWorker,
    /// A worker's actions ended and its finish is queued behind a commit:
    /// its slot is free now, so the next job's Scheduled and Running writes
    /// can share that commit. `JobFinished` follows once it is recorded.
    JobHandedBack(JobReport),
    /// A worker finished its job and recorded it (or had nothing to record).
    JobFinished(JobReport),
    /// Cancels an execution: before the handoff the master records it
    /// Cancelled; after it, the worker is told to cancel.
    Cancel {
        execution_id: Uuid,
        reply: RpcReplyPort<CancelOutcome>,
    },
    /// Sets is_force_stopped on a branch rule and cancels its in-flight run.
    ForceStop {
        branch_rule_id: Uuid,
        reply: RpcReplyPort<Result<ForceStopOutcome, String>>,
    },
    Stats(RpcReplyPort<QueueStats>),
    /// A worker started a job `lag_ms` after its scheduled time.
    JobStarted {
        at: Millis,
        lag_ms: Millis,
    },
    /// The start lag of the last quarter hour, minute by minute.
    StartLag(RpcReplyPort<StartLagSeries>),
    /// Graceful stop: dispatch nothing more, cancel queued jobs, let running
    /// jobs finish within `grace`, then cancel them. Replies when no job is
    /// left in flight.
    Drain {
        grace: Duration,
        reply: RpcReplyPort<DrainReport>,
    },
    /// The drain's grace period is over: cancel what still runs.
    DrainDeadline,
    /// The memory guard's verdict (pushed on every change): while
    /// throttled, nothing is fetched, claimed or handed to a worker.
    MemoryThrottle(ThrottleStatus),
    /// Whether the master holds work back for memory: a restarted memory
    /// guard starts from it, so its hysteresis survives the restart.
    IsMemoryThrottled(RpcReplyPort<bool>),
    /// Renews the claims of queued jobs (every third of
    /// SCHEDULE_LOCK_TIMEOUT_SECONDS); running ones are renewed by their
    /// workers.
    RenewQueuedClaims,
    /// Samples the ready backlog for the capacity watch.
    CheckBacklog,
    /// The lease keeper could not renew the heartbeat for nearly a TTL:
    /// stop every job and drop every queued claim, writing nothing.
    SelfFence,
    /// The heartbeat lands again after a self-fence. No peer takes over an
    /// instance that is live, so the master recovers what the fence
    /// dropped itself: once every fenced job has stopped, their executions
    /// are recorded Failed `worker_lost` and their claims released, and
    /// the occurrences run again. Replies `false` while a job is still
    /// stopping (the lease keeper asks again at its next round).
    RecoverAfterFence(RpcReplyPort<bool>),
    /// Panics inside the actor, for supervision tests and chaos drills.
    InjectPanic(String),
}

/// What a worker reports when its job is recorded.
#[derive(Debug, Clone)]
pub struct JobReport {
    pub worker: ActorId,
    pub branch_rule_id: Uuid,
    pub execution_id: Uuid,
    pub status: ExecutionStatus,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelOutcome {
    /// It was still queued; the master recorded it Cancelled.
    CancelledBeforeHandoff,
    /// A worker runs it and was told to cancel; it records the outcome.
    CancelSentToWorker,
    /// This instance has no such execution in flight.
    NotInFlight,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ForceStopOutcome {
    pub flag_set: bool,
    pub cancel: CancelOutcome,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DrainReport {
    pub cancelled_before_handoff: usize,
    pub finished_in_grace: usize,
    pub cancelled_after_grace: usize,
}
