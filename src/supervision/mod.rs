//! The supervision tree: the root supervisor and its restart policy. The
//! directory actors use to find each other lives in [`crate::directory`]
//! and is re-exported here.
//!
//! ractor's default `handle_supervisor_evt` stops the parent whenever a child
//! exits, so the root supervisor overrides it: a failed or stopped child is
//! respawned after an exponential backoff, and more than
//! SUPERVISOR_MAX_RESTARTS failures of one actor within
//! SUPERVISOR_RESTART_WINDOW_SECONDS escalate: the service logs why and the
//! process exits non-zero so systemd or Kubernetes restarts it.

pub mod policy;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::sync::mpsc;
use tracing::{error, info, warn};

pub use crate::directory::{ActorKind, Directory};
pub use policy::{RestartDecision, RestartPolicy, backoff};

use crate::actions::ActionRegistry;
use crate::actors::lease::{LeaseActor, LeaseArgs};
use crate::actors::master::{MasterActor, MasterArgs};
use crate::actors::memory_guard::{MemoryGuardActor, MemoryGuardArgs};
use crate::actors::plan::{PlanActor, PlanArgs};
use crate::actors::pruner::{PrunerActor, PrunerArgs};
use crate::actors::refresher::{RefresherActor, RefresherArgs};
use crate::actors::writer::{WriterActor, WriterArgs};
use crate::actors::{AskError, ask, ask_within};
use crate::clock::Clock;
use crate::config::Config;
use crate::memory::SamplerFactory;
use crate::messages::supervisor::SupervisorStats;
use crate::messages::{LeaseMsg, MasterMsg, PlanMsg, RefresherMsg, SupervisorMsg, WriterMsg};
use crate::metrics as m;
use crate::store::{Store, TransitionBatcher};

/// The master's drain cancels jobs at the end of the grace period; this
/// covers their cancellation being recorded.
const DRAIN_MARGIN: Duration = Duration::from_secs(10);

/// How long the shutdown waits for the lease keeper to leave the cluster
/// before it drains anyway.
const LEAVE_WAIT: Duration = Duration::from_secs(5);

/// The longest a graceful shutdown of the tree may take: leaving the
/// cluster, the drain, and at most four asks of their own (partitions
/// handed back, the outbox's last delivery, the snapshot, the writer's
/// drain). Whoever waits for the shutdown waits this long: waiting less
/// reported a drain that was still going as a supervisor that did not
/// answer (and the process exited 1).
pub fn shutdown_bound(grace: Duration) -> Duration {
    LEAVE_WAIT + grace + DRAIN_MARGIN + 4 * crate::actors::CALL_TIMEOUT
}

/// Why the supervisor gave up: sent to the service, which exits non-zero.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Escalation {
    pub actor: ActorKind,
    pub failures_in_window: usize,
    pub last_failure: String,
}

impl fmt::Display for Escalation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "actor {} failed {} times within the restart window; last failure: {}",
            self.actor, self.failures_in_window, self.last_failure
        )
    }
}

pub struct RootSupervisor;

pub struct SupervisorArgs {
    pub config: Arc<Config>,
    pub clock: Clock,
    pub store: Store,
    pub batcher: TransitionBatcher,
    pub registry: ActionRegistry,
    /// Makes the memory guard's sampler, on every (re)start of the guard.
    pub memory_sampler: SamplerFactory,
    pub directory: Directory,
    pub escalations: mpsc::UnboundedSender<Escalation>,
}

pub struct SupervisorState {
    args: SupervisorArgs,
    policy: RestartPolicy,
    children: HashMap<ActorId, ActorKind>,
    alive: BTreeMap<ActorKind, ActorCell>,
    restarts: BTreeMap<ActorKind, u64>,
    shutting_down: bool,
}

impl Actor for RootSupervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<SupervisorMsg>,
        args: SupervisorArgs,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        let mut state = SupervisorState {
            policy: RestartPolicy::new(
                args.config.supervisor_max_restarts,
                args.config.supervisor_restart_window,
            ),
            args,
            children: HashMap::new(),
            alive: BTreeMap::new(),
            restarts: BTreeMap::new(),
            shutting_down: false,
        };
        // A child that cannot start at all is a configuration problem:
        // fail loudly now rather than restart it in a loop.
        for kind in ActorKind::START_ORDER {
            state.spawn_child(&myself, kind, false).await?;
        }
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<SupervisorMsg>,
        message: SupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SupervisorMsg::Restart(kind) => {
                if state.shutting_down || state.alive.contains_key(&kind) {
                    return Ok(());
                }
                if let Err(e) = state.spawn_child(&myself, kind, true).await {
                    state.child_failed(&myself, kind, format!("restart failed: {e}"));
                } else {
                    *state.restarts.entry(kind).or_default() += 1;
                    metrics::counter!(m::ACTOR_RESTARTS_TOTAL, "actor" => kind.as_str())
                        .increment(1);
                    info!(actor = %kind, "♻️ Restarted actor {kind}");
                    if kind == ActorKind::Writer {
                        state.resend_plan_to_writer();
                    }
                }
            }
            SupervisorMsg::Stats(reply) => {
                let _ = reply.send(state.stats());
            }
            SupervisorMsg::Shutdown(reply) => {
                state.shutdown().await;
                let _ = reply.send(());
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<SupervisorMsg>,
        event: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, reason) = match event {
            SupervisionEvent::ActorFailed(cell, error) => (cell, format!("failed: {error}")),
            SupervisionEvent::ActorTerminated(cell, _, reason) => (
                cell,
                format!(
                    "stopped: {}",
                    reason.unwrap_or_else(|| "no reason given".into())
                ),
            ),
            _ => return Ok(()),
        };
        let Some(kind) = state.children.remove(&cell.get_id()) else {
            return Ok(());
        };
        state.alive.remove(&kind);
        metrics::gauge!(m::ACTOR_ALIVE, "actor" => kind.as_str()).set(0.0);
        if state.shutting_down {
            return Ok(());
        }
        // A long-lived actor never stops on its own, so a normal stop is a
        // failure too.
        state.child_failed(&myself, kind, reason);
        Ok(())
    }
}

impl SupervisorState {
    async fn spawn_child(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        kind: ActorKind,
        restart: bool,
    ) -> Result<(), ActorProcessingErr> {
        let name = Some(self.args.directory.name_of(kind));
        let supervisor = myself.get_cell();
        let a = &self.args;
        let cell = match kind {
            ActorKind::Writer => {
                let args = WriterArgs {
                    path: a.config.plan_file.clone(),
                    min_interval: a.config.plan_min_write_interval,
                    clock: a.clock,
                };
                Actor::spawn_linked(name, WriterActor, args, supervisor)
                    .await?
                    .0
                    .get_cell()
            }
            ActorKind::Plan => {
                let args = PlanArgs {
                    config: Arc::clone(&a.config),
                    clock: a.clock,
                    directory: a.directory.clone(),
                    ownership: crate::actors::lease::initial_ownership(
                        &a.config,
                        a.store.backend(),
                    ),
                };
                Actor::spawn_linked(name, PlanActor, args, supervisor)
                    .await?
                    .0
                    .get_cell()
            }
            ActorKind::Refresher => {
                let args = RefresherArgs {
                    store: a.store.clone(),
                    config: Arc::clone(&a.config),
                    clock: a.clock,
                    directory: a.directory.clone(),
                };
                Actor::spawn_linked(name, RefresherActor, args, supervisor)
                    .await?
                    .0
                    .get_cell()
            }
            ActorKind::Lease => {
                let args = LeaseArgs {
                    config: Arc::clone(&a.config),
                    clock: a.clock,
                    store: a.store.clone(),
                    directory: a.directory.clone(),
                };
                Actor::spawn_linked(name, LeaseActor, args, supervisor)
                    .await?
                    .0
                    .get_cell()
            }
            ActorKind::MemoryGuard => {
                let args = MemoryGuardArgs {
                    config: Arc::clone(&a.config),
                    sampler: Arc::clone(&a.memory_sampler),
                    directory: a.directory.clone(),
                };
                Actor::spawn_linked(name, MemoryGuardActor, args, supervisor)
                    .await?
                    .0
                    .get_cell()
            }
            ActorKind::Pruner => {
                let args = PrunerArgs {
                    config: Arc::clone(&a.config),
                    clock: a.clock,
                    store: a.store.clone(),
                };
                Actor::spawn_linked(name, PrunerActor, args, supervisor)
                    .await?
                    .0
                    .get_cell()
            }
            ActorKind::Master => {
                let args = MasterArgs {
                    config: Arc::clone(&a.config),
                    clock: a.clock,
                    store: a.store.clone(),
                    batcher: a.batcher.clone(),
                    registry: a.registry.clone(),
                    directory: a.directory.clone(),
                    restarted: restart,
                };
                Actor::spawn_linked(name, MasterActor, args, supervisor)
                    .await?
                    .0
                    .get_cell()
            }
        };
        self.children.insert(cell.get_id(), kind);
        self.alive.insert(kind, cell);
        metrics::gauge!(m::ACTOR_ALIVE, "actor" => kind.as_str()).set(1.0);
        Ok(())
    }

    fn child_failed(&mut self, myself: &ActorRef<SupervisorMsg>, kind: ActorKind, reason: String) {
        match self.policy.on_failure(kind, self.args.clock.now_ms()) {
            RestartDecision::Restart {
                delay,
                restarts_in_window,
            } => {
                warn!(
                    actor = %kind,
                    "⚠️ Actor {kind} {reason}; restarting in {delay:?} ({restarts_in_window} in the window)"
                );
                myself.send_after(delay, move || SupervisorMsg::Restart(kind));
            }
            RestartDecision::Escalate { failures_in_window } => {
                let escalation = Escalation {
                    actor: kind,
                    failures_in_window,
                    last_failure: reason,
                };
                error!(actor = %kind, "🚨 Escalating: {escalation}");
                self.shutting_down = true;
                let _ = self.args.escalations.send(escalation);
            }
        }
    }

    fn stats(&self) -> SupervisorStats {
        SupervisorStats {
            restarts: ActorKind::START_ORDER
                .iter()
                .map(|k| (k.to_string(), self.restarts.get(k).copied().unwrap_or(0)))
                .collect(),
            alive: ActorKind::START_ORDER
                .iter()
                .map(|k| (k.to_string(), self.alive.contains_key(k)))
                .collect(),
        }
    }

    /// Stops the children in reverse start order, putting the plan on disk
    /// before the writer goes.
    async fn shutdown(&mut self) {
        self.shutting_down = true;
        if let Some(lease) = self.args.directory.lease() {
            // The peers take this instance's partitions while its jobs
            // finish; its heartbeat goes on, so they are not taken over.
            // Bounded: a lease round stuck on the database must not hold
            // the drain back (the message stays queued and is acted on).
            let _ = ask_within(&lease, LEAVE_WAIT, LeaseMsg::Leave).await;
        }
        if let Some(master) = self.args.directory.master() {
            info!("Stopping dispatch; waiting for running jobs");
            let grace = self.args.config.shutdown_grace;
            let wait = grace + DRAIN_MARGIN;
            match ask_within(&master, wait, |reply| MasterMsg::Drain { grace, reply }).await {
                Ok(report) => info!(
                    "Jobs settled: {} finished, {} cancelled after the grace period, {} cancelled before the handoff",
                    report.finished_in_grace,
                    report.cancelled_after_grace,
                    report.cancelled_before_handoff
                ),
                Err(e) => warn!("⚠️ The master did not drain: {e}"),
            }
        }
        if let Some(lease) = self.args.directory.lease() {
            // Nothing runs here any more: the peers may take the partitions
            // now rather than after the TTL.
            let _ = ask(&lease, LeaseMsg::ReleaseAll).await;
        }
        if let Some(cell) = self.alive.get(&ActorKind::Lease) {
            info!("Stopping the lease keeper");
            let _ = cell.stop_and_wait(Some("shutdown".into()), None).await;
        }
        if let Some(refresher) = self.args.directory.refresher() {
            // One last delivery attempt for the outbox before the plan is saved.
            let _ = ask(&refresher, RefresherMsg::DeliverOutbox).await;
        }
        if let Some(refresher) = self.alive.get(&ActorKind::Refresher) {
            info!("Stopping the refresher");
            let _ = refresher.stop_and_wait(Some("shutdown".into()), None).await;
        }
        match self.flush_plan().await {
            Ok(()) => info!(
                "💾 Execution plan written to {}",
                self.args.config.plan_file.display()
            ),
            Err(e) => warn!("⚠️ Could not write the plan at shutdown: {e}"),
        }
        for kind in [
            ActorKind::Pruner,
            ActorKind::Master,
            ActorKind::MemoryGuard,
            ActorKind::Plan,
            ActorKind::Writer,
        ] {
            if let Some(cell) = self.alive.get(&kind) {
                info!("Stopping the {kind} actor");
                let _ = cell.stop_and_wait(Some("shutdown".into()), None).await;
            }
        }
    }

    /// A restarted writer lost the write it was holding back (at most a
    /// PLAN_MIN_WRITE_INTERVAL's worth): the plan sends it a whole
    /// snapshot, so an outbox entry made just before the panic reaches the
    /// file without waiting for the plan's next change.
    fn resend_plan_to_writer(&self) {
        let Some(plan) = self.args.directory.plan() else {
            return;
        };
        tokio::spawn(async move {
            if let Err(e) = ask(&plan, PlanMsg::SnapshotToWriter).await {
                warn!("⚠️ The plan was not sent to the restarted writer: {e}");
            }
        });
    }

    async fn flush_plan(&self) -> Result<(), AskError> {
        let directory = &self.args.directory;
        let plan = directory.plan().ok_or(AskError::NotRunning)?;
        let writer = directory.writer().ok_or(AskError::NotRunning)?;
        // Through the plan actor, so the snapshot queues behind the journal
        // writes it already sent.
        if !ask(&plan, PlanMsg::SnapshotToWriter).await? {
            return Err(AskError::NotRunning);
        }
        let stats = ask(&writer, WriterMsg::Drain).await?;
        match stats.last_error {
            Some(reason) if stats.write_queue_size > 0 => {
                warn!("⚠️ The plan file could not be written: {reason}");
            }
            _ => {}
        }
        Ok(())
    }
}
