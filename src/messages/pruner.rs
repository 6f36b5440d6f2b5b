use ractor::RpcReplyPort;
use serde::Serialize;

use crate::model::Millis;

/// Messages of the [`PrunerActor`](crate::actors::pruner::PrunerActor).
#[derive(Debug)]
pub enum PrunerMsg {
    /// Starts a prune of the history older than EXECUTION_RETENTION_DAYS,
    /// unless one is under way (sent by the actor's timers).
    Prune,
    /// Deletes the next batch of the prune under way (sent by the actor to
    /// itself, after a pause that lets the engine's writes through).
    NextBatch,
    /// Reads the oldest execution kept into its gauge: at start, so the
    /// gauge is there before the first prune, and every interval when
    /// nothing is pruned (EXECUTION_RETENTION_DAYS=0).
    ReadOldestKept,
    Stats(RpcReplyPort<PrunerStats>),
    /// Panics inside the actor, for supervision tests and chaos drills.
    InjectPanic(String),
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PrunerStats {
    /// Prunes that ran to the end.
    pub prunes_done: u64,
    pub prunes_failed: u64,
    /// Executions deleted since start.
    pub pruned: u64,
    /// The cutoff of the last prune: finished executions requested before
    /// it are gone.
    pub last_cutoff: Option<Millis>,
    /// The oldest execution kept, after the last prune.
    pub oldest_kept: Option<Millis>,
    pub last_error: Option<String>,
}
