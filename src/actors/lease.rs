//! The LeaseActor: this instance's place in the cluster (DESIGN §4, seed
//! 003's distributed lock), on a timer of its own so a slow refresh or a
//! busy master never makes a live instance look dead.
//!
//! Every PARTITION_LEASE_RETRY_SECONDS it
//! - heartbeats and renews its partition leases when a third of
//!   PARTITION_LEASE_TTL_SECONDS has passed since the last renewal;
//! - compares the leases with the fair share of the live instances
//!   ([`cluster::desired_owners`]) and gives back or takes partitions;
//! - takes over instances silent for longer than the TTL: their open
//!   executions become Failed `worker_lost` and their claims are released,
//!   so the occurrences run again at once;
//! - hands the master the cancel and force-stop requests other instances
//!   recorded for the executions this instance runs.
//!
//! When the heartbeat cannot be renewed for nearly a TTL, the instance
//! fences itself: it stops every job it runs and claims nothing, writing
//! nothing, before its peers may call it silent and run those occurrences
//! again. The verdicts are pure functions in [`crate::cluster`].
//!
//! On SQLite there is one instance: it owns every rule and only heartbeats,
//! takes over and forwards cancel requests.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};
use uuid::Uuid;

use crate::actors::{ask_within, master_is_throttled};
use crate::clock::Clock;
use crate::cluster::{self, LiveInstance, Ownership};
use crate::config::{Config, Partition, hostname};
use crate::directory::Directory;
use crate::messages::lease::LeaseStatus;
use crate::messages::{LeaseMsg, MasterMsg, PlanMsg};
use crate::metrics as m;
use crate::model::Millis;
use crate::recovery;
use crate::store::{Backend, InstanceRow, Store, StoreError};

/// The least a heartbeat is given as the fence deadline nears: one that
/// cannot land in time is still worth a try.
const MIN_HEARTBEAT_WAIT_MS: Millis = 500;

pub struct LeaseActor;

pub struct LeaseArgs {
    pub config: Arc<Config>,
    pub clock: Clock,
    pub store: Store,
    pub directory: Directory,
}

pub struct LeaseState {
    args: LeaseArgs,
    ownership: Ownership,
    /// When the last heartbeat that landed was sent (this instance's clock).
    last_ok_sent: Option<Millis>,
    /// Since when this instance is up, for the fence of a first heartbeat
    /// that never lands.
    started_at: Millis,
    fenced: bool,
    /// Instances taken over, counted by the takeover task.
    takeovers: Arc<AtomicU64>,
    /// The takeover in progress, if any: it runs beside the renewals, never
    /// in front of them, since it may wait on a frozen peer's row locks.
    takeover: Option<JoinHandle<()>>,
    /// Cancel requests already handed to the master.
    forwarded: HashSet<Uuid>,
    /// Set by a graceful stop's [`LeaseMsg::ReleaseAll`]: the ticks still
    /// queued or timed must not take the partitions back before the actor
    /// stops (a tick that did left its leases held for a TTL after exit).
    released: bool,
    /// Set by [`LeaseMsg::Leave`] as a graceful stop begins: the ticks go
    /// on heartbeating (the running jobs are still this instance's) but
    /// take no partition and take over nobody.
    leaving: bool,
    /// Memory is short ([`LeaseMsg::MemoryThrottle`]).
    throttled: bool,
    /// Set while throttled with a live peer to take the partitions: the
    /// ticks go on as for `leaving`, until the throttle lifts.
    stepped_aside: bool,
    /// The leaving mark is still to be cleared after a throttle: the peers
    /// deal this instance no share until it is, so it takes none either.
    rejoin_pending: bool,
}

impl Actor for LeaseActor {
    type Msg = LeaseMsg;
    type State = LeaseState;
    type Arguments = LeaseArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<LeaseMsg>,
        args: LeaseArgs,
    ) -> Result<LeaseState, ActorProcessingErr> {
        let ownership = initial_ownership(&args.config, args.store.backend());
        // A restart carries the throttle on; a leaving mark a throttled
        // predecessor left is cleared first, and set again at the first
        // tick if memory is still short.
        let throttled = master_is_throttled(&args.directory).await;
        myself.send_message(LeaseMsg::Tick)?;
        let started_at = args.clock.now_ms();
        Ok(LeaseState {
            args,
            ownership,
            last_ok_sent: None,
            started_at,
            fenced: false,
            takeovers: Arc::new(AtomicU64::new(0)),
            takeover: None,
            forwarded: HashSet::new(),
            released: false,
            leaving: false,
            throttled,
            stepped_aside: false,
            rejoin_pending: true,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<LeaseMsg>,
        message: LeaseMsg,
        state: &mut LeaseState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            LeaseMsg::Tick if state.released => {}
            LeaseMsg::Tick => {
                state.tick().await;
                let every = state.args.config.partition_lease_retry;
                myself.send_after(every, || LeaseMsg::Tick);
            }
            LeaseMsg::Status(reply) => {
                let _ = reply.send(LeaseStatus {
                    ownership: state.ownership.clone(),
                    last_heartbeat_at: state.last_ok_sent,
                    fenced: state.fenced,
                    takeovers: state.takeovers.load(Ordering::Relaxed),
                });
            }
            LeaseMsg::Leave(reply) => {
                state.leave().await;
                let _ = reply.send(());
            }
            LeaseMsg::ReleaseAll(reply) => {
                state.release_all().await;
                let _ = reply.send(());
            }
            LeaseMsg::MemoryThrottle { throttled } => state.memory_throttle(throttled).await,
            LeaseMsg::InjectPanic(reason) => panic!("{reason}"),
        }
        Ok(())
    }
}

/// SQLite has one instance, which owns everything; on PostgreSQL an
/// instance owns nothing until it holds a lease.
pub fn initial_ownership(config: &Config, backend: Backend) -> Ownership {
    match backend {
        Backend::Sqlite => Ownership::All,
        Backend::Postgres => Ownership::none(config.partition_count),
    }
}

impl LeaseState {
    fn ttl(&self) -> Duration {
        self.args.config.partition_lease_ttl
    }

    fn ttl_ms(&self) -> Millis {
        self.ttl().as_millis() as Millis
    }

    fn me(&self) -> &str {
        &self.args.config.instance_id
    }

    async fn tick(&mut self) {
        let now = self.args.clock.now_ms();
        // A round that comes this late (the process was paused, a VM
        // frozen) may come after the peers took this instance over, and
        // they run its occurrences again: its jobs stop now, before the
        // heartbeat, whether or not that lands.
        self.fence_if_overdue(now);
        let renewal_due = self
            .last_ok_sent
            .is_none_or(|at| now - at >= self.ttl_ms() / 3);
        if renewal_due && !self.heartbeat_in_time(now).await {
            // Judged at the time the heartbeat gave up, not when it was
            // sent: a slow failure must not delay the fence.
            self.fence_if_overdue(self.args.clock.now_ms());
            self.publish();
            return;
        }
        if self.fenced {
            if !self.recovered_after_fence().await {
                self.publish();
                return;
            }
            info!("💓 Heartbeat renewed: rejoining the cluster");
            self.fenced = false;
        }
        // While memory is short the throttle reads the live instances; the
        // fair share below uses the same rows rather than a second read.
        let live = if self.throttled || self.stepped_aside {
            self.follow_the_throttle().await
        } else {
            None
        };
        if self.leaving || self.stepped_aside || !self.rejoined().await {
            // Only the heartbeat and the cancel requests of the jobs still
            // finishing here.
            self.publish();
            self.forward_cancel_requests().await;
            return;
        }
        if self.args.store.backend() == Backend::Postgres
            && let Err(e) = self.balance(renewal_due, live).await
        {
            metrics::counter!(m::DB_ERRORS_TOTAL, "op" => "leases").increment(1);
            debug!("Partition leases not balanced this round: {e}");
        }
        self.publish();
        // SQLite has one instance: what a predecessor left is recovered at
        // start, and there is no peer to take over while running.
        if self.args.store.backend() == Backend::Postgres {
            self.take_over_silent();
        }
        self.forward_cancel_requests().await;
    }

    /// The time by which this instance fences itself without a heartbeat.
    fn fence_deadline(&self) -> Millis {
        let since = self.last_ok_sent.unwrap_or(self.started_at);
        cluster::self_fence_deadline(since, self.ttl())
    }

    /// [`Self::heartbeat`], given up at the fence deadline (and after a
    /// third of the TTL at most): a database that does not answer, a
    /// connection into a black hole, must not hold the fence back.
    async fn heartbeat_in_time(&mut self, sent_at: Millis) -> bool {
        // Fenced, there is no deadline left to keep, and a heartbeat after
        // an outage may need a new connection, slow to open: it gets the
        // full third of the TTL.
        let limit = if self.fenced {
            self.ttl() / 3
        } else {
            let until_fence = (self.fence_deadline() - sent_at).max(MIN_HEARTBEAT_WAIT_MS);
            Duration::from_millis(until_fence as u64).min(self.ttl() / 3)
        };
        match tokio::time::timeout(limit, self.heartbeat(sent_at)).await {
            Ok(landed) => landed,
            Err(_) => {
                metrics::counter!(m::DB_ERRORS_TOTAL, "op" => "heartbeat").increment(1);
                warn!("💔 Heartbeat failed: no answer within {limit:?}");
                false
            }
        }
    }

    /// `true` when the heartbeat landed (re-registering if an operator
    /// deleted the row).
    async fn heartbeat(&mut self, sent_at: Millis) -> bool {
        let store = &self.args.store;
        let outcome = match store.heartbeat(self.me(), sent_at).await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => {
                warn!("This instance's row in `instances` is gone; registering again");
                let config = &self.args.config;
                store
                    .register_instance(
                        self.me(),
                        &hostname(),
                        i64::from(std::process::id()),
                        sent_at,
                        config.partition.map(partition_text).as_deref(),
                    )
                    .await
            }
            Err(e) => Err(e),
        };
        match outcome {
            Ok(()) => {
                self.last_ok_sent = Some(sent_at);
                true
            }
            Err(e) => {
                metrics::counter!(m::DB_ERRORS_TOTAL, "op" => "heartbeat").increment(1);
                warn!("💔 Heartbeat failed: {e}");
                false
            }
        }
    }

    /// Whether the master has recovered what the fence stopped, so this
    /// instance may own partitions again. Its peers take over only silent
    /// instances: without this, the rules whose jobs the fence stopped
    /// would stay locked and marked running by a live instance, and never
    /// run again until it restarted.
    async fn recovered_after_fence(&self) -> bool {
        let Some(master) = self.args.directory.master() else {
            debug!("Still fenced: no master to recover the fenced jobs yet");
            return false;
        };
        match ask_within(&master, self.ttl(), MasterMsg::RecoverAfterFence).await {
            Ok(true) => true,
            Ok(false) => {
                info!("🚧 Heartbeat renewed; still fenced until the fenced jobs have stopped");
                false
            }
            Err(e) => {
                debug!("Still fenced: the master did not answer: {e}");
                false
            }
        }
    }

    /// Stops this instance's jobs once its peers may soon call it silent.
    fn fence_if_overdue(&mut self, now: Millis) {
        if self.fenced || self.args.store.backend() == Backend::Sqlite {
            // One instance on SQLite: nobody else would run its rules.
            return;
        }
        let since = self.last_ok_sent.unwrap_or(self.started_at);
        if !cluster::must_self_fence(since, now, self.ttl()) {
            return;
        }
        self.fenced = true;
        metrics::counter!(m::SELF_FENCES_TOTAL).increment(1);
        if let Some(held) = self.ownership.held_count()
            && held > 0
        {
            metrics::counter!(m::PARTITION_LEASE_CHANGES_TOTAL, "change" => "lost")
                .increment(held as u64);
        }
        self.ownership = Ownership::none(self.args.config.partition_count);
        self.publish();
        error!(
            "🚧 No heartbeat for {} ms: this instance's peers may take it over; stopping its jobs and claiming nothing until the database answers",
            now - since
        );
        if let Some(master) = self.args.directory.master() {
            let _ = master.cast(MasterMsg::SelfFence);
        }
    }

    /// One round of the fair share: renew, give back, take. `live`: the
    /// live instances if this round read them already.
    async fn balance(
        &mut self,
        renew: bool,
        live: Option<Vec<InstanceRow>>,
    ) -> Result<(), StoreError> {
        let store = &self.args.store;
        let config = &self.args.config;
        let ttl_ms = self.ttl_ms();
        let count = config.partition_count;
        let me = config.instance_id.clone();
        let rows = match live {
            Some(rows) => rows,
            None => store.live_instances(ttl_ms).await?,
        };
        let live: Vec<LiveInstance> = rows
            .into_iter()
            .map(|row| LiveInstance {
                preferred: row.partition.as_deref().and_then(|p| p.parse().ok()),
                id: row.id,
            })
            .chain(std::iter::once(LiveInstance {
                id: me.clone(),
                preferred: config.partition,
            }))
            .collect();
        let view = store.partition_leases().await?;
        let desired = cluster::desired_owners(&live, count);
        let moves = cluster::lease_moves(&me, &desired, &view.leases, view.db_now);
        let mut held: Vec<u32> = if renew {
            store.renew_partition_leases(&me, ttl_ms).await?
        } else {
            moves.keep.iter().chain(&moves.release).copied().collect()
        };
        held.retain(|p| *p < count);
        for p in &moves.release {
            if store.release_partition_lease(*p, &me).await? {
                metrics::counter!(m::PARTITION_LEASE_CHANGES_TOTAL, "change" => "released")
                    .increment(1);
            }
            held.retain(|h| h != p);
        }
        let mut acquired = Vec::new();
        for p in &moves.acquire {
            if let Some(lease) = store.acquire_partition_lease(*p, &me, ttl_ms).await? {
                metrics::counter!(m::PARTITION_LEASE_CHANGES_TOTAL, "change" => "acquired")
                    .increment(1);
                acquired.push((lease.partition, lease.epoch));
                held.push(lease.partition);
            }
        }
        held.sort_unstable();
        held.dedup();
        let before = match &self.ownership {
            Ownership::Partitions { held, .. } => held.clone(),
            Ownership::All => Vec::new(),
        };
        let lost: Vec<u32> = before
            .iter()
            .filter(|p| !held.contains(p) && !moves.release.contains(p))
            .copied()
            .collect();
        if !lost.is_empty() {
            metrics::counter!(m::PARTITION_LEASE_CHANGES_TOTAL, "change" => "lost")
                .increment(lost.len() as u64);
            warn!("🔓 Lost partition lease(s) {lost:?}: they expired before a renewal landed");
        }
        if !moves.release.is_empty() {
            info!(
                "🔓 Released partition(s) {:?} to rebalance across {} live instance(s)",
                moves.release,
                live_count(&live)
            );
        }
        if !acquired.is_empty() {
            info!(
                "🔑 Acquired partition(s) {:?} (epochs {:?}); holding {} of {count} across {} live instance(s)",
                acquired.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
                acquired.iter().map(|(_, e)| *e).collect::<Vec<_>>(),
                held.len(),
                live_count(&live)
            );
            // The plan may still read rules of these partitions as they
            // were: running under a peer that another instance has since
            // taken over, its claims released. It reads them afresh now,
            // not at its next periodic refresh (20 s by default), so their
            // occurrences run again within the takeover's bound.
            if let Some(refresher) = self.args.directory.refresher() {
                let _ = refresher.cast(crate::messages::RefresherMsg::RefreshNow);
            }
        }
        self.ownership = Ownership::Partitions { count, held };
        Ok(())
    }

    /// Tells the plan what this instance owns, every round: a restarted
    /// plan hears it within one retry interval.
    fn publish(&self) {
        if let Some(held) = self.ownership.held_count() {
            metrics::gauge!(m::PARTITION_LEASES_HELD).set(held as f64);
        }
        if let Some(plan) = self.args.directory.plan() {
            let _ = plan.cast(PlanMsg::Ownership(self.ownership.clone()));
        }
    }

    /// Fails the open executions of instances silent for longer than the
    /// TTL and releases their claims, so their occurrences run again now.
    /// Runs as a task of its own, one at a time: a frozen peer's open
    /// transaction can hold its rows until the database ends it, and the
    /// renewals must go on meanwhile or every lease would lapse.
    fn take_over_silent(&mut self) {
        if self
            .takeover
            .as_ref()
            .is_some_and(|task| !task.is_finished())
        {
            return;
        }
        let store = self.args.store.clone();
        let directory = self.args.directory.clone();
        let me = self.me().to_string();
        let ttl = self.ttl();
        let now = self.args.clock.now_ms();
        let takeovers = Arc::clone(&self.takeovers);
        self.takeover = Some(tokio::spawn(async move {
            match recovery::take_over_silent(&store, &me, ttl, now).await {
                Ok(taken) if !taken.is_empty() => {
                    takeovers.fetch_add(taken.len() as u64, Ordering::Relaxed);
                    metrics::counter!(m::FAILOVERS_TOTAL).increment(taken.len() as u64);
                    if let Some(refresher) = directory.refresher() {
                        let _ = refresher.cast(crate::messages::RefresherMsg::RefreshNow);
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    metrics::counter!(m::DB_ERRORS_TOTAL, "op" => "takeover").increment(1);
                    debug!("Cannot take over silent instances: {e}");
                }
            }
        }));
    }

    /// Cancel and force-stop requests recorded through any instance's API
    /// for executions this instance runs.
    async fn forward_cancel_requests(&mut self) {
        let requests = match self.args.store.cancel_requests(self.me()).await {
            Ok(requests) => requests,
            Err(e) => {
                metrics::counter!(m::DB_ERRORS_TOTAL, "op" => "cancel_requests").increment(1);
                debug!("Cannot read cancel requests: {e}");
                return;
            }
        };
        let open: HashSet<Uuid> = requests.iter().map(|r| r.execution_id).collect();
        self.forwarded.retain(|id| open.contains(id));
        let Some(master) = self.args.directory.master() else {
            return;
        };
        for request in requests {
            if !self.forwarded.insert(request.execution_id) {
                continue;
            }
            let execution_id = request.execution_id;
            // Cast, not ask: a busy master must not hold up the renewals.
            let (reply, answer) = tokio::sync::oneshot::channel();
            let sent = master.cast(MasterMsg::Cancel {
                execution_id,
                reply: reply.into(),
            });
            if sent.is_err() {
                self.forwarded.remove(&execution_id);
                continue;
            }
            let branch_rule_id = request.branch_rule_id;
            let reason = request.reason;
            tokio::spawn(async move {
                if let Ok(outcome) = answer.await {
                    info!(
                        %branch_rule_id,
                        %execution_id,
                        "🛑 Acted on a {reason} request recorded in the database: {outcome:?}"
                    );
                }
            });
        }
    }

    /// A graceful stop begins: this instance says it is leaving, so its
    /// peers deal its share among themselves, and gives its partitions
    /// back, so they take them at their next retry (within a second by
    /// default) rather than a TTL after the drain. Before this, the
    /// partitions of an instance draining its jobs went unserved for the
    /// whole drain and a TTL after it.
    async fn leave(&mut self) {
        if self.leaving || self.args.store.backend() != Backend::Postgres {
            return;
        }
        self.leaving = true;
        let now = self.args.clock.now_ms();
        match self.args.store.mark_instance_leaving(self.me(), now).await {
            Ok(()) => info!(
                "👋 Leaving the cluster: the peers take this instance's partitions while its jobs finish"
            ),
            Err(e) => {
                metrics::counter!(m::DB_ERRORS_TOTAL, "op" => "leave").increment(1);
                warn!(
                    "Could not mark this instance as leaving; its peers take its partitions after the TTL: {e}"
                );
            }
        }
        self.release_leases().await;
    }

    async fn memory_throttle(&mut self, throttled: bool) {
        self.throttled = throttled;
        // The next tick reads the live instances afresh.
        let _ = self.follow_the_throttle().await;
    }

    /// A throttled instance claims nothing, so the partitions it holds
    /// would wait for its memory while a peer may have room: with a live
    /// peer, it steps aside as a leaving instance does (heartbeat and
    /// running jobs go on) and takes its share again when the throttle
    /// lifts, or when no peer is left to serve it. A lone instance keeps
    /// its partitions: nobody else would serve them, and its plan still
    /// shows what waits for memory.
    ///
    /// Returns the live instances it read, if it read them.
    async fn follow_the_throttle(&mut self) -> Option<Vec<InstanceRow>> {
        if self.leaving || self.released || self.args.store.backend() != Backend::Postgres {
            return None;
        }
        // A database that cannot say whether a peer is live changes nothing.
        if self.throttled && !self.stepped_aside {
            let live = self.live_instances().await;
            if live.as_deref().is_some_and(|rows| self.peers(rows) > 0) {
                self.step_aside().await;
            }
            live
        } else if self.stepped_aside {
            let live = if self.throttled {
                self.live_instances().await
            } else {
                None
            };
            let alone = live.as_deref().is_some_and(|rows| self.peers(rows) == 0);
            if !self.throttled || alone {
                self.stepped_aside = false;
                self.rejoin_pending = true;
                self.rejoined().await;
            }
            live
        } else {
            None
        }
    }

    /// Live instances that are not leaving; `None` when the database cannot
    /// say.
    async fn live_instances(&self) -> Option<Vec<InstanceRow>> {
        match self.args.store.live_instances(self.ttl_ms()).await {
            Ok(live) => Some(live),
            Err(e) => {
                metrics::counter!(m::DB_ERRORS_TOTAL, "op" => "leases").increment(1);
                debug!("Live instances not read: {e}");
                None
            }
        }
    }

    /// How many of `live` are not this instance.
    fn peers(&self, live: &[InstanceRow]) -> usize {
        live.iter().filter(|row| row.id != self.me()).count()
    }

    async fn step_aside(&mut self) {
        let now = self.args.clock.now_ms();
        if let Err(e) = self.args.store.mark_instance_leaving(self.me(), now).await {
            // Unmarked, the peers would keep leaving this instance its
            // share: its partitions stay with it, served once memory is back.
            metrics::counter!(m::DB_ERRORS_TOTAL, "op" => "leave").increment(1);
            warn!("Could not hand the partitions to the peers while memory is short: {e}");
            return;
        }
        self.stepped_aside = true;
        self.rejoin_pending = false;
        warn!("🫸 Memory is short: the peers take this instance's partitions until it recovers");
        self.release_leases().await;
    }

    /// Clears the leaving mark a throttle left, if any is pending: `false`
    /// while it cannot be (the next tick tries again).
    async fn rejoined(&mut self) -> bool {
        if !self.rejoin_pending || self.args.store.backend() != Backend::Postgres {
            self.rejoin_pending = false;
            return true;
        }
        let now = self.args.clock.now_ms();
        match self.args.store.mark_instance_back(self.me(), now).await {
            Ok(true) => {
                self.rejoin_pending = false;
                info!("This instance takes its share of the partitions again");
                true
            }
            Ok(false) => {
                self.rejoin_pending = false;
                true
            }
            Err(e) => {
                metrics::counter!(m::DB_ERRORS_TOTAL, "op" => "leave").increment(1);
                warn!("Could not take a share of the partitions again: {e}");
                false
            }
        }
    }

    /// Graceful stop: the peers take the partitions at their next retry.
    async fn release_all(&mut self) {
        self.released = true;
        if self.args.store.backend() != Backend::Postgres {
            return;
        }
        self.release_leases().await;
    }

    async fn release_leases(&mut self) {
        match self
            .args
            .store
            .release_all_partition_leases(self.me())
            .await
        {
            Ok(n) => {
                info!("🔓 Released {n} partition lease(s) for the peers");
                metrics::counter!(m::PARTITION_LEASE_CHANGES_TOTAL, "change" => "released")
                    .increment(n);
            }
            Err(e) => {
                warn!("Could not release the partition leases; they expire after the TTL: {e}")
            }
        }
        self.ownership = Ownership::none(self.args.config.partition_count);
        self.publish();
    }
}

fn live_count(live: &[LiveInstance]) -> usize {
    live.iter()
        .map(|i| i.id.as_str())
        .collect::<HashSet<_>>()
        .len()
}

/// `k/N`, as the `instances.partition` column keeps it.
pub fn partition_text(partition: Partition) -> String {
    format!("{}/{}", partition.index, partition.count)
}
