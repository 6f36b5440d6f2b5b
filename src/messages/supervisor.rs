use std::collections::BTreeMap;

use ractor::RpcReplyPort;
use serde::Serialize;

use crate::directory::ActorKind;

/// Messages of the [`RootSupervisor`](crate::supervision::RootSupervisor).
#[derive(Debug)]
pub enum SupervisorMsg {
    /// Respawns a child after its backoff delay.
    Restart(ActorKind),
    /// Restart counts and which children are alive.
    Stats(RpcReplyPort<SupervisorStats>),
    /// Graceful stop: no new work, flush the plan to disk, stop every child
    /// in order. Replies when done.
    Shutdown(RpcReplyPort<()>),
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SupervisorStats {
    pub restarts: BTreeMap<String, u64>,
    pub alive: BTreeMap<String, bool>,
}
