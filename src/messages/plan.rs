use std::collections::HashMap;

use ractor::RpcReplyPort;
use uuid::Uuid;

use chrono_tz::Tz;

use crate::cluster::{Ownership, PartitionOwners};
use crate::lifecycle::RetryUpdate;
use crate::model::{BranchRule, Millis, PlanLoad, RejectedRow};
use crate::plan::{
    BrowsePage, BrowseQuery, JobSpec, MergeReport, OutboxEntry, PlanError, PlanSnapshot, PlanStats,
};
use crate::schedule::CronSchedule;

/// Messages of the [`PlanActor`](crate::actors::plan::PlanActor), the single
/// writer of plan state.
#[derive(Debug)]
pub enum PlanMsg {
    /// The ids ready at the clock's now, in (next_run_time, id) order,
    /// capped at MAX_RUNS_PER_TICK.
    Ready(RpcReplyPort<Vec<Uuid>>),
    /// The first `limit` ready workflows as job specs, in (next_run_time,
    /// id) order within this instance's partition, then those ready within
    /// the claim lead, and when the master should look next. A spec is a
    /// deep copy (rule, steps, templates): the master asks only for as many
    /// as it can claim.
    ReadyJobs {
        limit: usize,
        reply: RpcReplyPort<ReadyJobs>,
    },
    /// What this instance owns now (from the lease keeper, every round):
    /// only those rules are ready here.
    Ownership(Ownership),
    /// These workflows were just claimed: mark them running so no fetch
    /// hands them out again (seed 000 "Marking jobs as running").
    Claimed(Vec<Uuid>),
    /// This instance's run of the workflow is over (sent by the master for
    /// every job that ends): if no post-processed row cleared its running
    /// flag (the result was fenced out, the lock lost, the job dropped
    /// unwritten), clear it now.
    RunEnded(Uuid),
    /// Marks a workflow as running; replies false when it is unknown.
    MarkRunning(Uuid, RpcReplyPort<bool>),
    /// The branch rule row the database returned after a job's post-process.
    PostProcessed(BranchRule),
    /// The database could not be updated after a job: keep the finish's
    /// next run and retry locally and clear the running flag (seed 000).
    FinishedLocally {
        id: Uuid,
        /// `None`: no next run could be computed; the rule is held.
        next_run_time: Option<Millis>,
        retry: RetryUpdate,
    },
    /// A post-process write the database refused: keep it (saved with the
    /// plan file) until the refresher delivers it.
    AddOutbox(Box<OutboxEntry>),
    /// The pending post-process writes, oldest first.
    Outbox(RpcReplyPort<Vec<OutboxEntry>>),
    /// An outbox entry landed (with the row the database returned) or was
    /// fenced out (`None`): drop it.
    OutboxDelivered {
        execution_id: Uuid,
        row: Option<BranchRule>,
    },
    /// Folds a fresh read of the database into the plan: its bad rows are
    /// quarantined (one WARN each, on entry), the rest is smart-merged.
    Merge(Box<PlanLoad>, RpcReplyPort<MergeReport>),
    /// The cron schedule and zone a workflow runs on now, from the plan's
    /// current rows (the worker's finish: a value fixed or broken while
    /// the job ran counts). Changes nothing.
    ScheduleOf {
        id: Uuid,
        reply: RpcReplyPort<Result<(CronSchedule, Tz), PlanError>>,
    },
    /// The quarantined rows and the workflows held back, with why.
    Quarantine(RpcReplyPort<QuarantineReport>),
    /// Clears every running flag; replies with how many were set.
    ResetRunningFlags(RpcReplyPort<usize>),
    /// A full copy of the plan, as the plan file holds it.
    Snapshot(RpcReplyPort<PlanSnapshot>),
    /// Hands the whole plan to the writer now (graceful shutdown), in line
    /// with the journal writes before it; false when no writer took it.
    SnapshotToWriter(RpcReplyPort<bool>),
    Stats(RpcReplyPort<PlanStats>),
    /// How many workflows are ready at the clock's now (capped at
    /// MAX_RUNS_PER_TICK, as a fetch takes them) and how many missed their
    /// window: the two readiness gauges, asked.
    Readiness(RpcReplyPort<Readiness>),
    /// A filtered page of the workflows with each one's verdict (the
    /// console's Rules page). `owners` says who holds each partition.
    Browse {
        query: Box<BrowseQuery>,
        owners: Option<PartitionOwners>,
        reply: RpcReplyPort<BrowsePage>,
    },
    /// Hands a snapshot to the writer if the plan changed since the last one.
    /// Sent by the actor to itself so writes are debounced.
    FlushToWriter,
    /// Panics inside the actor: the supervision tests and chaos drills use
    /// it to prove a failed PlanActor is rebuilt.
    InjectPanic(String),
}

/// The answer to [`PlanMsg::Readiness`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct Readiness {
    /// Workflows ready to run now, all of them: a fetch takes at most
    /// MAX_RUNS_PER_TICK of these.
    pub ready: usize,
    /// Due workflows whose window was open since they fell due and is closed
    /// now: they wait for the next opening.
    pub missed_window: usize,
}

/// The answer to [`PlanMsg::ReadyJobs`].
#[derive(Debug, Clone, Default)]
pub struct ReadyJobs {
    pub jobs: Vec<JobSpec>,
    /// The jobs among `jobs` not ready yet but ready within the claim lead
    /// (MASTER_CLAIM_LEAD_SECONDS), each with the instant it becomes ready:
    /// claimed now, started then.
    pub starts_at: HashMap<Uuid, Millis>,
    /// When the master should fetch again: the earliest time something
    /// not ready now may become ready, less the claim lead.
    pub next_wake: Option<Millis>,
}

/// The answer to [`PlanMsg::Quarantine`].
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct QuarantineReport {
    /// Rows kept out of the plan, by table and id.
    pub rows: Vec<RejectedRow>,
    /// Workflows held back by a quarantined row or a missing next run.
    pub held: Vec<HeldWorkflow>,
}

/// One held workflow and the reason `ruled plan` gives for it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HeldWorkflow {
    pub id: Uuid,
    pub reason: String,
}
