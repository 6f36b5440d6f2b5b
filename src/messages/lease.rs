use ractor::RpcReplyPort;
use serde::Serialize;

use crate::cluster::Ownership;
use crate::model::Millis;

/// Messages of the [`LeaseActor`](crate::actors::lease::LeaseActor), which
/// keeps this instance's heartbeat and partition leases.
#[derive(Debug)]
pub enum LeaseMsg {
    /// The loop, every PARTITION_LEASE_RETRY_SECONDS: heartbeat and renew
    /// when a third of the TTL has passed, take or give back partitions,
    /// take over silent peers, act on cancel requests.
    Tick,
    /// What this instance holds now.
    Status(RpcReplyPort<LeaseStatus>),
    /// A graceful stop begins: give every partition back and say this
    /// instance is leaving, so the peers take its share while its running
    /// jobs finish; the heartbeat goes on, so they are not taken over.
    /// Replies when done.
    Leave(RpcReplyPort<()>),
    /// Graceful stop: give every partition back so the peers take them at
    /// once instead of after the TTL, and stop. Replies when done.
    ReleaseAll(RpcReplyPort<()>),
    /// The memory throttle, from the master: a throttled instance claims
    /// nothing, so it hands its partitions to its peers (marked leaving, as
    /// a graceful stop is) and takes its share again when it lifts.
    MemoryThrottle { throttled: bool },
    /// Panics inside the actor, for supervision tests and chaos drills.
    InjectPanic(String),
}

/// The answer to [`LeaseMsg::Status`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LeaseStatus {
    pub ownership: Ownership,
    /// When the last heartbeat that landed was sent (this instance's clock).
    pub last_heartbeat_at: Option<Millis>,
    /// Set while the heartbeat cannot be renewed and this instance has
    /// stopped its own jobs.
    pub fenced: bool,
    pub takeovers: u64,
}
