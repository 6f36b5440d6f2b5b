use ractor::RpcReplyPort;
use serde::Serialize;

use crate::memory::{GpuSupport, MemoryReading, ThrottleStatus};

/// Messages of the [`MemoryGuardActor`](crate::actors::memory_guard::MemoryGuardActor).
#[derive(Debug)]
pub enum MemoryGuardMsg {
    /// Take a reading, publish a throttle change, and schedule the next
    /// reading MEMORY_CHECK_INTERVAL later. Sent by the guard to itself.
    Sample,
    /// The throttle state and the last reading.
    Status(RpcReplyPort<MemoryStatus>),
    /// Panics inside the actor, for supervision tests and chaos drills.
    InjectPanic(String),
}

/// The answer to [`MemoryGuardMsg::Status`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryStatus {
    pub throttle: ThrottleStatus,
    /// `None` until the first reading succeeds.
    pub last_reading: Option<MemoryReading>,
    pub gpu: GpuSupport,
    /// Readings taken by this incarnation of the guard.
    pub samples: u64,
    /// Why the last reading failed, while readings fail.
    pub last_error: Option<String>,
}
