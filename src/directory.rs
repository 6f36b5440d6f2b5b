//! The long-lived actors' names ([`ActorKind`]) and how actors find each
//! other across restarts ([`Directory`]).
//!
//! A restarted actor has a new `ActorRef`, so nobody keeps one: each actor
//! is registered under a name unique to its service instance and looked up
//! at send time. Several services can live in one process (tests), hence
//! the per-instance prefix.

use std::fmt;
use std::sync::Arc;

use ractor::{ActorRef, Message};
use serde::Serialize;
use tokio::sync::watch;

use crate::messages::refresher::RefresherStats;
use crate::messages::{
    LeaseMsg, MasterMsg, MemoryGuardMsg, PlanMsg, PrunerMsg, RefresherMsg, SupervisorMsg, WriterMsg,
};

/// The long-lived actors under the root supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ActorKind {
    Plan,
    Writer,
    Refresher,
    Lease,
    MemoryGuard,
    Master,
    Pruner,
}

impl ActorKind {
    /// Start order: the writer before the plan (the plan hands it snapshots),
    /// the plan before the refresher (the refresher merges into it) and the
    /// lease keeper (which tells it what this instance owns), the memory
    /// guard before the master (which asks it whether to hold work back),
    /// and the master: it dispatches from the plan. The pruner, which
    /// needs only the database, comes after: history can wait.
    pub const START_ORDER: [ActorKind; 7] = [
        ActorKind::Writer,
        ActorKind::Plan,
        ActorKind::Refresher,
        ActorKind::Lease,
        ActorKind::MemoryGuard,
        ActorKind::Master,
        ActorKind::Pruner,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ActorKind::Plan => "plan",
            ActorKind::Writer => "writer",
            ActorKind::Refresher => "refresher",
            ActorKind::Lease => "lease",
            ActorKind::MemoryGuard => "memory_guard",
            ActorKind::Master => "master",
            ActorKind::Pruner => "pruner",
        }
    }
}

impl std::str::FromStr for ActorKind {
    type Err = String;

    fn from_str(name: &str) -> Result<ActorKind, String> {
        ActorKind::START_ORDER
            .into_iter()
            .find(|kind| kind.as_str() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = ActorKind::START_ORDER.iter().map(|k| k.as_str()).collect();
                format!("unknown actor {name:?}; one of {}", names.join(", "))
            })
    }
}

impl fmt::Display for ActorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone)]
pub struct Directory {
    prefix: Arc<str>,
    /// The refresher's latest statistics, published after every refresh:
    /// `/readyz` reads them without queueing behind a busy refresher's
    /// mailbox, and a restarted refresher publishes into the same channel.
    refresher_stats: Arc<watch::Sender<RefresherStats>>,
}

impl fmt::Debug for Directory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Directory({})", self.prefix)
    }
}

impl Default for Directory {
    fn default() -> Self {
        Directory::new()
    }
}

impl Directory {
    pub fn new() -> Directory {
        Directory {
            prefix: format!("ruled-{}", uuid::Uuid::new_v4().simple()).into(),
            refresher_stats: Arc::new(watch::channel(RefresherStats::default()).0),
        }
    }

    /// The refresher's statistics as of its last refresh.
    pub fn refresher_stats(&self) -> RefresherStats {
        self.refresher_stats.borrow().clone()
    }

    /// Called by the refresher after each refresh.
    pub fn publish_refresher_stats(&self, stats: &RefresherStats) {
        self.refresher_stats.send_replace(stats.clone());
    }

    pub fn name_of(&self, kind: ActorKind) -> String {
        format!("{}/{kind}", self.prefix)
    }

    /// `Worker-N`'s name: unique within the service (numbers only grow),
    /// and what the log names it by.
    pub fn worker_name(&self, number: u64) -> String {
        format!("{}/worker-{number}", self.prefix)
    }

    pub fn supervisor_name(&self) -> String {
        format!("{}/supervisor", self.prefix)
    }

    fn find<M: Message>(&self, kind: ActorKind) -> Option<ActorRef<M>> {
        ActorRef::where_is(self.name_of(kind))
    }

    pub fn plan(&self) -> Option<ActorRef<PlanMsg>> {
        self.find(ActorKind::Plan)
    }

    pub fn writer(&self) -> Option<ActorRef<WriterMsg>> {
        self.find(ActorKind::Writer)
    }

    pub fn refresher(&self) -> Option<ActorRef<RefresherMsg>> {
        self.find(ActorKind::Refresher)
    }

    pub fn pruner(&self) -> Option<ActorRef<PrunerMsg>> {
        self.find(ActorKind::Pruner)
    }

    pub fn lease(&self) -> Option<ActorRef<LeaseMsg>> {
        self.find(ActorKind::Lease)
    }

    pub fn master(&self) -> Option<ActorRef<MasterMsg>> {
        self.find(ActorKind::Master)
    }

    pub fn memory_guard(&self) -> Option<ActorRef<MemoryGuardMsg>> {
        self.find(ActorKind::MemoryGuard)
    }

    pub fn supervisor(&self) -> Option<ActorRef<SupervisorMsg>> {
        ActorRef::where_is(self.supervisor_name())
    }

    /// Makes the actor panic with `reason` (supervision tests and chaos
    /// drills). `false` when it is not running, e.g. between a failure
    /// and its restart.
    pub fn inject_panic(&self, kind: ActorKind, reason: &str) -> bool {
        let reason = reason.to_string();
        match kind {
            ActorKind::Plan => self
                .plan()
                .is_some_and(|a| a.cast(PlanMsg::InjectPanic(reason)).is_ok()),
            ActorKind::Writer => self
                .writer()
                .is_some_and(|a| a.cast(WriterMsg::InjectPanic(reason)).is_ok()),
            ActorKind::Refresher => self
                .refresher()
                .is_some_and(|a| a.cast(RefresherMsg::InjectPanic(reason)).is_ok()),
            ActorKind::Lease => self
                .lease()
                .is_some_and(|a| a.cast(LeaseMsg::InjectPanic(reason)).is_ok()),
            ActorKind::MemoryGuard => self
                .memory_guard()
                .is_some_and(|a| a.cast(MemoryGuardMsg::InjectPanic(reason)).is_ok()),
            ActorKind::Master => self
                .master()
                .is_some_and(|a| a.cast(MasterMsg::InjectPanic(reason)).is_ok()),
            ActorKind::Pruner => self
                .pruner()
                .is_some_and(|a| a.cast(PrunerMsg::InjectPanic(reason)).is_ok()),
        }
    }
}
