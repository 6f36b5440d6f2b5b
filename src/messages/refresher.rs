use ractor::RpcReplyPort;
use serde::Serialize;

use crate::model::Millis;

/// Messages of the [`RefresherActor`](crate::actors::refresher::RefresherActor).
#[derive(Debug)]
pub enum RefresherMsg {
    /// The periodic refresh, every EXECUTION_PLAN_REFRESH_SECONDS.
    Tick,
    /// Refresh now rather than at the next tick: the API changed a rule, or
    /// the plan was rebuilt and wants the database's view.
    RefreshNow,
    /// The coalesced refresh that nudges asked for (sent by the refresher
    /// to itself once per burst of [`RefresherMsg::RefreshNow`]).
    RefreshPending,
    /// Delivers the plan's outbox now; replies with how many entries are
    /// still pending (graceful shutdown).
    DeliverOutbox(RpcReplyPort<usize>),
    Stats(RpcReplyPort<RefresherStats>),
    /// Panics inside the actor, for supervision tests and chaos drills.
    InjectPanic(String),
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RefresherStats {
    pub refreshes_ok: u64,
    pub refreshes_failed: u64,
    pub last_success_at: Option<Millis>,
    pub last_error: Option<String>,
    pub outbox_delivered: u64,
}
