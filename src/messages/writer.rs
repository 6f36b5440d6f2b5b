use std::sync::Arc;

use ractor::RpcReplyPort;
use serde::Serialize;

use crate::model::Millis;
use crate::plan::{PlanDelta, PlanSnapshot};

/// Messages of the [`WriterActor`](crate::actors::writer::WriterActor).
#[derive(Debug)]
pub enum WriterMsg {
    /// Queues a snapshot for writing. The queue is bounded: when full, the
    /// oldest snapshot is dropped, since a newer one supersedes it.
    Enqueue(Arc<PlanSnapshot>),
    /// Queues a journal write: the changes since the last write. Never
    /// dropped: queued ones are folded into one, which holds the newest
    /// state of everything they touched.
    Append(PlanDelta),
    /// Writes the newest queued snapshot. Sent by the actor to itself so
    /// writes happen at most once per PLAN_MIN_WRITE_INTERVAL_SECONDS.
    Flush,
    /// Writes whatever is queued now, ignoring the debounce, and replies
    /// when it is on disk (graceful shutdown).
    Drain(RpcReplyPort<WriterStats>),
    Stats(RpcReplyPort<WriterStats>),
    /// Panics inside the actor, for supervision tests and chaos drills.
    InjectPanic(String),
}

/// Seed 000's write-thread status, plus counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct WriterStats {
    pub write_thread_alive: bool,
    pub write_thread_started: bool,
    pub write_queue_size: usize,
    pub write_queue_full: bool,
    pub writes_ok: u64,
    pub writes_failed: u64,
    pub snapshots_dropped: u64,
    /// Journal writes (deltas appended), beside `writes_ok` for snapshots.
    pub appends_ok: u64,
    /// Bytes written to the plan file and its journal since start.
    pub bytes_written: u64,
    pub last_write_at: Option<Millis>,
    pub last_error: Option<String>,
}
