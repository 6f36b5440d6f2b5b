use ractor::RpcReplyPort;
use uuid::Uuid;

use crate::model::{BranchRule, Millis, PlanData};
use crate::plan::{MergeReport, PlanError, PlanSnapshot, PlanStats};

/// Messages of the [`PlanActor`](crate::actors::plan::PlanActor), the single
/// writer of plan state.
#[derive(Debug)]
pub enum PlanMsg {
    /// The ids ready at the clock's now, in (next_run_time, id) order,
    /// capped at MAX_RUNS_PER_TICK.
    Ready(RpcReplyPort<Vec<Uuid>>),
    /// Marks a workflow as running; replies false when it is unknown.
    MarkRunning(Uuid, RpcReplyPort<bool>),
    /// The branch rule row the database returned after a job's post-process.
    PostProcessed(BranchRule),
    /// The database could not be updated after a job: compute the next run
    /// from the cron expression strictly after the given time, keep it
    /// locally and clear the running flag (seed 000).
    ComputeNextRunLocally {
        id: Uuid,
        after: Millis,
        reply: RpcReplyPort<Result<Millis, PlanError>>,
    },
    /// Folds a fresh read of the database into the plan (smart merge).
    Merge(Box<PlanData>, RpcReplyPort<MergeReport>),
    /// Clears every running flag; replies with how many were set.
    ResetRunningFlags(RpcReplyPort<usize>),
    /// A full copy of the plan, as the plan file holds it.
    Snapshot(RpcReplyPort<PlanSnapshot>),
    Stats(RpcReplyPort<PlanStats>),
    /// Hands a snapshot to the writer if the plan changed since the last one.
    /// Sent by the actor to itself so writes are debounced.
    FlushToWriter,
    /// Panics inside the actor: the supervision tests and chaos drills use
    /// it to prove a failed PlanActor is rebuilt.
    InjectPanic(String),
}
