//! The MasterActor (seed 004): finds due work, claims it, queues it and
//! hands it to workers, which it supervises.
//!
//! It wakes at the earliest of: the next due time or window opening in the
//! plan, a plan change, a free worker, and MASTER_FETCH_INTERVAL_SECONDS,
//! so a rule starts within milliseconds of its due time.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::task::JoinSet;
use tracing::{debug, error, info, warn};
use uuid::Uuid;

use crate::actions::ActionRegistry;
use crate::actors::worker::{WorkerActor, WorkerArgs, decided_finish, record_decision};
use crate::actors::{Recorded, ask, ask_within, finish_recorded};
use crate::clock::Clock;
use crate::config::Config;
use crate::directory::Directory;
use crate::lifecycle::{Claim, ClaimRequest, Fence, Finish, SkipRequest, new_execution_id};
use crate::messages::master::{CancelOutcome, DrainReport, ForceStopOutcome, JobReport};
use crate::messages::worker::{CancelReason, Job};
use crate::messages::{LeaseMsg, MasterMsg, MemoryGuardMsg, PlanMsg, RefresherMsg, WorkerMsg};
use crate::metrics as m;
use crate::model::{ExecutionStatus, Millis};
use crate::plan::{Ending, JobSpec, decide_due, job_steps, overlap_due};
use crate::queue::{
    BacklogChange, BacklogTrend, Capacity, ClaimDepth, DedupReason, JobQueue, StartLagHistory,
    WorkerPool,
};
use crate::recovery;
use crate::schedule::Overlap;
use crate::store::{PendingTransition, Store, StoreError, Transition, TransitionBatcher};

pub struct MasterActor;

pub struct MasterArgs {
    pub config: Arc<Config>,
    pub clock: Clock,
    pub store: Store,
    pub batcher: TransitionBatcher,
    pub registry: ActionRegistry,
    pub directory: Directory,
    /// A restart after a failure: the old master's workers went with it.
    pub restarted: bool,
}

struct Drain {
    reply: Option<RpcReplyPort<DrainReport>>,
    report: DrainReport,
    deadline_passed: bool,
}

pub struct MasterState {
    args: MasterArgs,
    queue: JobQueue<Box<Job>>,
    /// How late this incarnation's jobs started, for the console's chart.
    start_lag: StartLagHistory,
    /// The rate the workers sustain, from the jobs' lengths.
    capacity: Capacity,
    /// Whether the ready backlog outgrows that rate.
    backlog: BacklogTrend,
    /// How far ahead of the workers claims go.
    depth: ClaimDepth,
    /// The workers: alive, idle, and busy with their jobs.
    pool: WorkerPool<ActorId, ActorRef<WorkerMsg>, Box<Job>>,
    /// Rules whose claims are in flight, and when each was due: not
    /// fetched again meanwhile, and no job due later starts before them.
    claiming: HashMap<Uuid, Option<Millis>>,
    /// Workers that handed their slot back with their finish still queued,
    /// and the rule each one ran: the plan keeps the rule running, and a
    /// drain waits, until the finish is recorded.
    recording: HashMap<ActorId, Uuid>,
    tick_generation: u64,
    next_tick_at: Option<Millis>,
    started: bool,
    drain: Option<Drain>,
    /// Set while the memory guard holds new work back.
    throttled: bool,
    /// Set by a self-fence, until the recovery after it: a claim that
    /// comes back meanwhile is dropped, not queued.
    fenced: bool,
}

impl Actor for MasterActor {
    type Msg = MasterMsg;
    type State = MasterState;
    type Arguments = MasterArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<MasterMsg>,
        args: MasterArgs,
    ) -> Result<MasterState, ActorProcessingErr> {
        let config = &args.config;
        // Staggered start-up (seed 004): workers do not all load at once.
        for i in 0..config.worker_count {
            myself.send_after(config.worker_stagger * i as u32, || MasterMsg::SpawnWorker);
        }
        metrics::gauge!(m::WORKERS, "state" => "configured").set(config.worker_count as f64);
        info!(
            workers = config.worker_count,
            single_job_mode = config.worker_single_job_mode,
            "👑 Master starting; first fetch in {:?}",
            config.master_grace_period
        );
        let grace = config.master_grace_period;
        // Claims are leases: a queued claim is renewed like a running one
        // (the worker renews that), so a long queue never lets one expire
        // while this instance still means to run it.
        myself.send_interval(config.schedule_lock_timeout / 3, || {
            MasterMsg::RenewQueuedClaims
        });
        myself.send_interval(config.backlog_window / BACKLOG_SAMPLES, || {
            MasterMsg::CheckBacklog
        });
        let throttled = memory_throttled(&args.directory).await;
        let pool = WorkerPool::new(config.worker_count, !config.worker_single_job_mode);
        let mut state = MasterState {
            queue: JobQueue::new(config.recently_processed.as_millis() as Millis),
            start_lag: StartLagHistory::new(),
            capacity: Capacity::new(config.worker_count, rest_after_each_job(config)),
            depth: ClaimDepth::new(config.worker_count),
            backlog: BacklogTrend::new(config.backlog_window.as_millis() as Millis),
            args,
            pool,
            claiming: HashMap::new(),
            recording: HashMap::new(),
            tick_generation: 0,
            next_tick_at: None,
            started: false,
            drain: None,
            throttled,
            fenced: false,
        };
        state.schedule_tick(&myself, grace);
        state.publish_gauges();
        metrics::gauge!(m::CAPACITY_JOBS_PER_SECOND).set(state.capacity.jobs_per_second());
        // The lease actor hears of the throttle from the master only: a
        // master that starts (or restarts) throttled, or finds the throttle
        // lifted while it was away, says where it stands.
        state.tell_the_lease();
        Ok(state)
    }

    async fn post_start(
        &self,
        _myself: ActorRef<MasterMsg>,
        state: &mut MasterState,
    ) -> Result<(), ActorProcessingErr> {
        if state.args.restarted {
            state.recover_after_restart().await;
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<MasterMsg>,
        message: MasterMsg,
        state: &mut MasterState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            MasterMsg::Tick(generation) => {
                if generation != state.tick_generation {
                    return Ok(());
                }
                state.next_tick_at = None;
                state.started = true;
                state.tick(&myself).await;
            }
            MasterMsg::PlanChanged => {
                if state.started {
                    state.schedule_tick(&myself, Duration::ZERO);
                }
            }
            MasterMsg::ClaimsDone(results) => {
                state.claims_done(results).await;
                state.dispatch(&myself).await;
                state.publish_gauges();
            }
            MasterMsg::SpawnWorker => state.spawn_worker(&myself).await,
            MasterMsg::JobHandedBack(report) => state.job_handed_back(&myself, report).await,
            MasterMsg::JobFinished(report) => state.job_finished(&myself, report),
            MasterMsg::Cancel {
                execution_id,
                reply,
            } => {
                let outcome = state.cancel_execution(execution_id).await;
                let _ = reply.send(outcome);
            }
            MasterMsg::ForceStop {
                branch_rule_id,
                reply,
            } => {
                let outcome = state.force_stop(branch_rule_id).await;
                let _ = reply.send(outcome);
            }
            MasterMsg::Stats(reply) => {
                let _ = reply.send(state.stats());
            }
            MasterMsg::JobStarted { at, lag_ms } => state.start_lag.record(at, lag_ms),
            MasterMsg::StartLag(reply) => {
                let _ = reply.send(state.start_lag.series(state.args.clock.now_ms()));
            }
            MasterMsg::Drain { grace, reply } => state.start_drain(&myself, grace, reply).await,
            MasterMsg::DrainDeadline => state.drain_deadline(),
            MasterMsg::MemoryThrottle(status) => {
                state.memory_throttle(&myself, status.throttled).await
            }
            MasterMsg::IsMemoryThrottled(reply) => {
                let _ = reply.send(state.throttled);
            }
            MasterMsg::RenewQueuedClaims => state.renew_queued_claims().await,
            MasterMsg::CheckBacklog => state.check_backlog().await,
            MasterMsg::SelfFence => state.self_fence(),
            MasterMsg::RecoverAfterFence(reply) => {
                let recovered = state.recover_after_fence().await;
                let _ = reply.send(recovered);
            }
            MasterMsg::OverlapDue { execution_id } => state.overlap_due(execution_id),
            MasterMsg::InjectPanic(reason) => panic!("{reason}"),
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<MasterMsg>,
        event: SupervisionEvent,
        state: &mut MasterState,
    ) -> Result<(), ActorProcessingErr> {
        // Workers stop after every job in single-job mode, so a terminated
        // worker is routine; ractor's default would stop the master.
        let (cell, failure) = match event {
            SupervisionEvent::ActorTerminated(cell, _, _) => (cell, None),
            SupervisionEvent::ActorFailed(cell, error) => (cell, Some(error.to_string())),
            _ => return Ok(()),
        };
        state.worker_gone(&myself, cell.get_id(), failure).await;
        Ok(())
    }
}

impl MasterState {
    /// A restarted master starts with an empty queue and no workers: the
    /// old master's workers were stopped with it. Whatever they and its
    /// claims held is recorded Failed `worker_lost` and released, the
    /// recovery a restarted process runs, and the plan's running flags are
    /// rebuilt from the database. Nothing runs twice: an occurrence whose
    /// result landed is terminal and left alone; the others run again as a
    /// new attempt once the grace period is over.
    async fn recover_after_restart(&mut self) {
        self.recover_own_jobs("Master restarted", "the previous master", false)
            .await;
    }

    /// After a self-fence, once nothing of this instance is in flight:
    /// the same recovery as after a restart, for the jobs the fence
    /// stopped and the claims it dropped, all unwritten. While the fence
    /// held, this instance owned no partition and claimed nothing new.
    async fn recover_after_fence(&mut self) -> bool {
        if self.pool.busy_len() > 0
            || !self.claiming.is_empty()
            || !self.recording.is_empty()
            || self.queue.queued_len() > 0
        {
            return false;
        }
        let recovered = self
            .recover_own_jobs("Rejoined after a self-fence", "the fence", true)
            .await;
        if recovered {
            self.fenced = false;
        }
        recovered
    }

    /// Records this instance's open executions Failed `worker_lost` and
    /// releases its claims, after the writes already queued and the
    /// outbox's results have landed. With `all_or_nothing`, nothing is
    /// declared lost unless the outbox was delivered whole first (a result
    /// still in it is a real outcome, and its action must not run again),
    /// and `false` says to try again later; otherwise the recovery goes on
    /// whatever the outbox did, as a restarted master's must.
    async fn recover_own_jobs(
        &mut self,
        event: &str,
        stopped_by: &str,
        all_or_nothing: bool,
    ) -> bool {
        let args = &self.args;
        let instance_id = &args.config.instance_id;
        let now = args.clock.now_ms();
        // The group commit runs each of its queues in order: once the
        // barrier is through every one, so are the claims and writes the
        // old master and its workers queued before they stopped.
        args.batcher.barrier(instance_id, now).await;
        // Results kept in the outbox are real outcomes: they land before
        // the rest is declared lost.
        let undelivered = match args.directory.refresher() {
            Some(refresher) => ask(&refresher, RefresherMsg::DeliverOutbox).await.ok(),
            None => None,
        };
        if all_or_nothing && undelivered != Some(0) {
            info!("{event}: waiting for the outbox's results to land before recovering");
            return false;
        }
        match recovery::recover_own(&args.store, instance_id, now).await {
            Ok(lost) => {
                metrics::counter!(m::JOBS_TOTAL, "outcome" => "failed")
                    .increment(lost.len() as u64);
                info!(
                    "👑 {event}: {} job(s) stopped by {stopped_by} recorded worker_lost",
                    lost.len()
                );
            }
            Err(e) => {
                // Their locks time out (SCHEDULE_LOCK_TIMEOUT_SECONDS) and
                // the occurrences are claimed again then.
                metrics::counter!(m::DB_ERRORS_TOTAL, "op" => "recover_owner").increment(1);
                warn!("{event}; the jobs stopped by {stopped_by} could not be recovered: {e}");
                if all_or_nothing {
                    return false;
                }
            }
        }
        if let Some(plan) = args.directory.plan() {
            let _ = ask(&plan, PlanMsg::ResetRunningFlags).await;
        }
        if let Some(refresher) = args.directory.refresher() {
            let _ = refresher.cast(RefresherMsg::RefreshNow);
        }
        // The jobs the fence stopped and the claims it dropped settled as
        // "recently processed", yet their occurrences are due again: the
        // dedup would hold them back for its whole window (30 s). Every
        // claim checks due-ness in the database, so forgetting is safe.
        self.queue.forget_recent();
        true
    }

    /// Arms the wake-up timer for `after` from now, unless an earlier one is
    /// already armed. Each arming bumps the generation, so only the newest
    /// timer's tick counts.
    fn schedule_tick(&mut self, myself: &ActorRef<MasterMsg>, after: Duration) {
        let at = self.args.clock.now_ms() + after.as_millis() as Millis;
        if self.next_tick_at.is_some_and(|armed| armed <= at) {
            return;
        }
        self.tick_generation += 1;
        self.next_tick_at = Some(at);
        let generation = self.tick_generation;
        myself.send_after(after, move || MasterMsg::Tick(generation));
    }

    async fn tick(&mut self, myself: &ActorRef<MasterMsg>) {
        let fetch_interval = self.args.config.master_fetch_interval;
        if self.drain.is_some() || self.throttled {
            return;
        }
        self.depth.settle(self.args.clock.now_ms());
        // A fetch walks the plan and claims in the database; while the queue
        // is nearly full, a free worker only needs the next queued job.
        let next_wake = if self.claim_budget() > 0 {
            self.fetch(myself).await
        } else {
            None
        };
        self.dispatch(myself).await;
        let now = self.args.clock.now_ms();
        let queue_interval = fetch_interval.as_millis() as Millis;
        let wake_in = next_wake.map_or(queue_interval, |at| (at - now).clamp(0, queue_interval));
        self.schedule_tick(myself, Duration::from_millis(wake_in as u64));
        self.queue.prune(now);
        self.publish_gauges();
    }

    /// How many more jobs a fetch may claim now (see [`ClaimDepth`]).
    fn claim_budget(&self) -> usize {
        self.depth.room(
            self.pool.idle_len(),
            self.queue.queued_len() + self.claiming.len(),
        )
    }

    /// Fetches the ready set, deduplicates, claims and queues. Returns when
    /// the plan says to look again. Claims fail closed: with the database
    /// down nothing is queued.
    async fn fetch(&mut self, myself: &ActorRef<MasterMsg>) -> Option<Millis> {
        let plan = self.args.directory.plan()?;
        let budget = self.claim_budget();
        // Rules still being claimed are ready in the plan until their claim
        // is answered, and the dedup below passes over them.
        let limit = budget + self.claiming.len();
        let ready = match ask(&plan, |reply| PlanMsg::ReadyJobs { limit, reply }).await {
            Ok(ready) => ready,
            Err(e) => {
                warn!("Cannot read the ready set: {e}");
                return None;
            }
        };
        let now = self.args.clock.now_ms();
        let mut admitted = Vec::new();
        let mut skip_errors = 0;
        for spec in ready.jobs {
            if admitted.len() >= budget {
                break;
            }
            let row = &spec.branch_rule;
            let id = row.id;
            // Ready only within the claim lead: claimed now, started then.
            let starts_at = ready.starts_at.get(&id).copied();
            let check = if self.claiming.contains_key(&id) {
                Err(DedupReason::Queued)
            } else {
                self.queue
                    .admit(id, now, row.is_currently_running, row.next_run_time)
            };
            match check {
                Ok(()) => match self
                    .apply_misfire_policy(spec, now, starts_at.unwrap_or(now))
                    .await
                {
                    Ok(Some(spec)) => admitted.push((spec, starts_at)),
                    Ok(None) => {}
                    Err(e) => {
                        // Like a failed claim: nothing runs for it now, and
                        // the next fetch decides again. One line per fetch.
                        if skip_errors == 0 {
                            warn!("⚠️ Skipped occurrences not recorded, nothing run for them: {e}");
                        }
                        skip_errors += 1;
                    }
                },
                Err(reason) => {
                    metrics::counter!(m::JOBS_DEDUPLICATED_TOTAL, "reason" => reason.as_str())
                        .increment(1);
                }
            }
        }
        if !admitted.is_empty() {
            let filled = admitted.len() >= budget;
            self.claim(myself, admitted, now, filled);
        }
        ready.next_wake
    }

    /// The misfire policy and catch-up window on a ready rule's due
    /// occurrences (see [`decide_due`]), as they stand when the job starts
    /// (`starts_at`: now, or later for a rule claimed ahead). An occurrence
    /// on time is claimed as it stands, with no write; otherwise the
    /// skipped ones are recorded and next_run_time moved in one write that
    /// holds only if next_run_time is still what the plan showed. Returns
    /// the spec to claim, if anything runs now.
    async fn apply_misfire_policy(
        &mut self,
        mut spec: JobSpec,
        now: Millis,
        starts_at: Millis,
    ) -> Result<Option<JobSpec>, StoreError> {
        let row = &spec.branch_rule;
        let (Some(due), Some(cadence)) = (row.next_run_time, spec.cadence()) else {
            return Ok(Some(spec));
        };
        let decision = decide_due(&cadence, due, row.retry_of, starts_at);
        if decision.is_plain(due) {
            return Ok(Some(spec));
        }
        let id = row.id;
        let request = SkipRequest {
            branch_rule_id: id,
            holder: self.args.config.instance_id.clone(),
            expected_next_run_time: due,
            next_run_time: decision.next_run_time.unwrap_or(due),
            skipped: decision.skipped.clone(),
            now,
            lock_timeout_ms: self.args.config.schedule_lock_timeout.as_millis() as Millis,
        };
        let updated = match self.args.store.skip_occurrences(&request).await {
            Ok(Some(updated)) => updated,
            Ok(None) => {
                debug!(branch_rule_id = %id, "Misfire decision not applied: the rule moved meanwhile");
                return Ok(None);
            }
            Err(e) => {
                metrics::counter!(m::DB_ERRORS_TOTAL, "op" => "skip").increment(1);
                return Err(e);
            }
        };
        for occurrence in &decision.skipped {
            metrics::counter!(m::OCCURRENCES_SKIPPED_TOTAL, "reason" => occurrence.reason.as_str())
                .increment(1);
        }
        if let Some(first) = decision.skipped.first() {
            info!(
                branch_rule_id = %id,
                "⏭️ Skipped {} occurrence(s) of {id} from {} ({}: {}); {}",
                decision.skipped.len(),
                format_time(first.scheduled_for),
                first.reason,
                first.detail,
                match decision.run {
                    Some(run) => format!("runs the occurrence at {}", format_time(run)),
                    None => format!(
                        "next run {}",
                        decision.next_run_time.map_or("none".to_string(), format_time)
                    ),
                }
            );
        }
        if let Some(plan) = self.args.directory.plan() {
            let _ = plan.cast(PlanMsg::PostProcessed(updated.clone()));
        }
        if decision.run.is_none() {
            return Ok(None);
        }
        spec.branch_rule = updated;
        Ok(Some(spec))
    }

    /// Claims in the background: the claims share the store's group commit
    /// with the other lifecycle writes, and the master keeps dispatching
    /// meanwhile. The results come back as [`MasterMsg::ClaimsDone`].
    /// `filled`: the claim takes all the room there is (see [`ClaimDepth`]).
    /// `specs` pairs each spec with the instant its job starts when it was
    /// claimed ahead of it (see [`ReadyJobs::starts_at`](crate::messages::plan::ReadyJobs::starts_at)).
    fn claim(
        &mut self,
        myself: &ActorRef<MasterMsg>,
        specs: Vec<(JobSpec, Option<Millis>)>,
        now: Millis,
        filled: bool,
    ) {
        let holder = self.args.config.instance_id.clone();
        let lock_timeout_ms = self.args.config.schedule_lock_timeout.as_millis() as Millis;
        self.depth.claim_sent(self.queue.queued_len(), filled);
        let mut claims = JoinSet::new();
        let (specs, starts): (Vec<JobSpec>, Vec<Option<Millis>>) = specs.into_iter().unzip();
        for (index, (spec, starts_at)) in specs.iter().zip(starts).enumerate() {
            // The queue's order: when the job may start.
            self.claiming.insert(
                spec.branch_rule.id,
                starts_at.or(spec.branch_rule.next_run_time),
            );
            let request = ClaimRequest {
                branch_rule_id: spec.branch_rule.id,
                holder: holder.clone(),
                now,
                lock_timeout_ms,
                execution_id: new_execution_id(now),
                run_now: false,
                due_by: starts_at,
            };
            let batcher = self.args.batcher.clone();
            claims.spawn(async move { (index, batcher.claim(&request).await) });
        }
        let master = myself.clone();
        let store = self.args.store.clone();
        tokio::spawn(async move {
            let mut outcomes: Vec<Result<Option<Claim>, String>> =
                vec![Err("the claim task was lost".to_string()); specs.len()];
            while let Some(joined) = claims.join_next().await {
                if let Ok((index, outcome)) = joined {
                    outcomes[index] = outcome.map_err(|e| e.to_string());
                }
            }
            let mut results: Vec<_> = specs.into_iter().zip(outcomes).collect();
            read_uncached_steps(&store, &mut results).await;
            let _ = master.cast(MasterMsg::ClaimsDone(results));
        });
    }

    /// Queues what the claims won. During a drain, won claims are released
    /// instead (recorded Cancelled, not advanced), so they run after the
    /// restart.
    async fn claims_done(&mut self, results: Vec<(JobSpec, Result<Option<Claim>, String>)>) {
        let holder = self.args.config.instance_id.clone();
        let still_queued = self.queue.queued_len();
        let mut won = 0;
        let mut claimed_ids = Vec::new();
        let mut landed_in_drain = Vec::new();
        let mut errors = 0;
        for (spec, outcome) in results {
            let id = spec.branch_rule.id;
            let due = self.claiming.remove(&id).flatten();
            let claim = match outcome {
                Ok(Some(claim)) => claim,
                Ok(None) => {
                    metrics::counter!(m::LOCK_CLAIMS_TOTAL, "result" => "lost").increment(1);
                    debug!(branch_rule_id = %id, "Claim lost to another instance");
                    continue;
                }
                Err(e) => {
                    metrics::counter!(m::LOCK_CLAIMS_TOTAL, "result" => "error").increment(1);
                    metrics::counter!(m::DB_ERRORS_TOTAL, "op" => "claim").increment(1);
                    if errors == 0 {
                        warn!("⚠️ Claims failed, nothing dispatched for them: {e}");
                    }
                    errors += 1;
                    continue;
                }
            };
            metrics::counter!(m::LOCK_CLAIMS_TOTAL, "result" => "won").increment(1);
            won += 1;
            let execution_id = claim.execution.id;
            let job = Box::new(Job {
                fence: Fence {
                    execution_id,
                    branch_rule_id: id,
                    holder: holder.clone(),
                    epoch: claim.execution.lock_epoch,
                },
                lock_renewed_at: claim.execution.requested_at,
                execution: claim.execution,
                spec,
            });
            if self.drain.is_some() {
                landed_in_drain.push((due, job));
                continue;
            }
            // A claim that was on its way when the fence came: it is
            // dropped unwritten like the queued ones, and the recovery
            // after the fence records it lost and releases it.
            if self.fenced {
                debug!(branch_rule_id = %id, %execution_id, "Claim dropped: this instance is fenced");
                continue;
            }
            if self.queue.push(id, due, job).is_ok() {
                claimed_ids.push(id);
                info!(branch_rule_id = %id, %execution_id, "📥 Added job {id}");
            }
        }
        if !landed_in_drain.is_empty() {
            self.give_back(landed_in_drain, "cancelled at shutdown before the handoff")
                .await;
        }
        let ahead = self.depth.ahead();
        let clean = won > 0 && errors == 0;
        self.depth
            .claim_landed(still_queued, clean, self.args.clock.now_ms());
        if self.depth.ahead() != ahead {
            debug!(
                "Claims now go {} job(s) ahead of the workers (were {ahead})",
                self.depth.ahead()
            );
        }
        if !claimed_ids.is_empty() {
            info!("👑 Master fetched {} jobs", claimed_ids.len());
            if let Some(plan) = self.args.directory.plan() {
                let _ = plan.cast(PlanMsg::Claimed(claimed_ids));
            }
        }
        self.finish_drain_if_done();
    }

    /// Hands queued jobs to idle workers. The Scheduled write is queued in
    /// the store's group commit before the handoff, not awaited: the worker
    /// queues its Running write behind it at once (the batcher keeps the
    /// order) and checks both outcomes, so neither the master nor the job
    /// waits for a commit of its own between the two states.
    async fn dispatch(&mut self, myself: &ActorRef<MasterMsg>) {
        let now = self.args.clock.now_ms();
        // Each fetch's claims commit on their own, so a later fetch's can
        // come back first: a job waits while a rule due before it is still
        // being claimed, so jobs start in due order. Jobs due together (a
        // burst) never wait for each other.
        let earliest_claiming = self.claiming.values().flatten().min().copied();
        while !self.throttled && self.pool.idle_len() > 0 && self.queue.queued_len() > 0 {
            if let Some(next) = self.queue.next_due() {
                if earliest_claiming.is_some_and(|claiming| claiming < next) {
                    break;
                }
                // Claimed ahead (MASTER_CLAIM_LEAD_SECONDS): it starts when
                // it falls due, and so does everything queued behind it.
                if next > now {
                    self.schedule_tick(myself, Duration::from_millis((next - now) as u64));
                    break;
                }
            }
            let Some((key, worker)) = self.pool.take_idle() else {
                break;
            };
            let worker = worker.clone();
            let (_, job) = self
                .queue
                .start_next(|job| job.execution_id())
                .expect("checked non-empty");
            let fence = job.fence.clone();
            let scheduled = self
                .args
                .batcher
                .enqueue(Transition::Scheduled { fence, now })
                .await;
            let run = WorkerMsg::Run {
                job: job.clone(),
                scheduled,
            };
            if worker.cast(run).is_ok() {
                self.arm_overlap_cancel(myself, &job);
                self.pool.assign(key, job, now);
            } else {
                // The worker died between being idle and the handoff; its
                // supervision event brings a fresh one.
                warn!(branch_rule_id = %job.branch_rule_id(), execution_id = %job.execution_id(), "Worker gone at the handoff; the job is released");
                // Its occurrence stays due: claimed again at once.
                self.queue.forget(job.branch_rule_id());
                self.release(job, "worker gone at the handoff").await;
            }
        }
        if !self.throttled
            && !self.fenced
            && self.drain.is_none()
            && self.pool.idle_len() > 0
            && self.queue.queued_len() == 0
            && !self.claiming.is_empty()
        {
            self.depth.worker_waits_for_a_claim();
        }
    }

    /// `overlap: cancel_running`: when the next occurrence falls due while
    /// this job still runs, the job is cancelled and that occurrence runs.
    fn arm_overlap_cancel(&self, myself: &ActorRef<MasterMsg>, job: &Job) {
        let Some(cadence) = job.spec.cadence() else {
            return;
        };
        if cadence.policy.overlap != Overlap::CancelRunning {
            return;
        }
        let execution = &job.execution;
        let Some(at) = overlap_due(&cadence, execution.scheduled_for, execution.requested_at)
        else {
            return;
        };
        let after = (at - self.args.clock.now_ms()).max(0) as u64;
        let execution_id = execution.id;
        myself.send_after(Duration::from_millis(after), move || {
            MasterMsg::OverlapDue { execution_id }
        });
    }

    fn overlap_due(&self, execution_id: Uuid) {
        let busy = self
            .pool
            .busy()
            .find(|(_, job)| job.execution_id() == execution_id);
        if let Some((Some(worker), job)) = busy {
            info!(
                branch_rule_id = %job.branch_rule_id(), %execution_id,
                "⏭️ The next occurrence fell due while this run still runs; overlap cancel_running cancels it"
            );
            let _ = worker.cast(WorkerMsg::Cancel {
                execution_id,
                reason: CancelReason::Overlap,
            });
        }
    }

    async fn spawn_worker(&mut self, myself: &ActorRef<MasterMsg>) {
        if self.drain.is_some() || !self.pool.has_room() {
            return;
        }
        let number = self.pool.next_number();
        let args = WorkerArgs {
            number,
            config: Arc::clone(&self.args.config),
            clock: self.args.clock,
            store: self.args.store.clone(),
            batcher: self.args.batcher.clone(),
            registry: self.args.registry.clone(),
            directory: self.args.directory.clone(),
            master: myself.clone(),
        };
        let name = Some(self.args.directory.worker_name(number));
        match Actor::spawn_linked(name, WorkerActor, args, myself.get_cell()).await {
            Ok((worker, _)) => {
                if self.throttled {
                    let _ = worker.cast(WorkerMsg::MemoryThrottle { throttled: true });
                }
                self.pool.started(worker.get_id(), worker);
                if self.started {
                    // A claimed job may be waiting for exactly this worker:
                    // hand it over now rather than at the next tick.
                    self.dispatch(myself).await;
                    self.schedule_tick(myself, Duration::ZERO);
                }
            }
            Err(e) => {
                error!("Worker-{number} did not start: {e}; retrying after the cooldown");
                myself.send_after(self.args.config.worker_cooldown, || MasterMsg::SpawnWorker);
            }
        }
        self.publish_gauges();
    }

    fn tell_the_lease(&self) {
        if let Some(lease) = self.args.directory.lease() {
            let _ = lease.cast(LeaseMsg::MemoryThrottle {
                throttled: self.throttled,
            });
        }
    }

    /// Seed 004's throttle: no fetch and no handoff while set; running jobs
    /// go on. Workers hear it too. On release the deferred rules are all
    /// due, so the master looks at once.
    async fn memory_throttle(&mut self, myself: &ActorRef<MasterMsg>, throttled: bool) {
        if self.throttled == throttled {
            return;
        }
        self.throttled = throttled;
        for worker in self.pool.handles() {
            let _ = worker.cast(WorkerMsg::MemoryThrottle { throttled });
        }
        self.tell_the_lease();
        if throttled {
            // A throttle may last long: queued claims go back, so another
            // instance with memory to spare may run those occurrences.
            // Their occurrences stay due, so they are claimed again as soon
            // as the throttle lifts (the recently-processed dedup would hold
            // them back for its whole window).
            let queued: Vec<_> = self
                .queue
                .drain_queued_with_due()
                .into_iter()
                .map(|(id, due, job)| {
                    self.queue.forget(id);
                    (due, job)
                })
                .collect();
            self.depth.queue_emptied();
            let count = queued.len();
            self.give_back(queued, "released while memory is short")
                .await;
            info!(
                "👑 Master holds new work back while memory is short; {count} queued claim(s) released"
            );
        } else if self.started {
            self.schedule_tick(myself, Duration::ZERO);
        }
    }

    /// The worker's finish is queued: its slot takes the next job now. In
    /// single-job mode the worker stops once the commit answers, so its
    /// replacement starts here rather than then.
    async fn job_handed_back(&mut self, myself: &ActorRef<MasterMsg>, report: JobReport) {
        if !self.pool.is_busy(report.worker) {
            // Its stop overtook this message and settled the job already.
            return;
        }
        self.recording.insert(report.worker, report.branch_rule_id);
        self.free_slot(myself, report.worker, report.branch_rule_id);
        if self.args.config.worker_single_job_mode && self.pool.retire(report.worker) {
            self.replace_worker(myself).await;
        }
    }

    fn job_finished(&mut self, myself: &ActorRef<MasterMsg>, report: JobReport) {
        if self.recording.remove(&report.worker).is_some() {
            self.finish_recorded(report.branch_rule_id);
        } else {
            self.settle(myself, report.worker, report.branch_rule_id);
        }
    }

    /// A handed-back job's finish has its answer from the database (or
    /// waits in the outbox): the rule's run is over here.
    fn finish_recorded(&mut self, branch_rule_id: Uuid) {
        self.run_ended(branch_rule_id);
        self.finish_drain_if_done();
        self.publish_gauges();
    }

    /// Bookkeeping once a worker's job is recorded. Idempotent: a worker
    /// that stops after its job reports twice (its message and its
    /// termination), in either order.
    fn settle(&mut self, myself: &ActorRef<MasterMsg>, worker: ActorId, branch_rule_id: Uuid) {
        if self.free_slot(myself, worker, branch_rule_id) {
            self.run_ended(branch_rule_id);
        }
    }

    /// The job leaves the worker's slot; `false` when it had left already.
    fn free_slot(
        &mut self,
        myself: &ActorRef<MasterMsg>,
        worker: ActorId,
        branch_rule_id: Uuid,
    ) -> bool {
        let Some((_, handed_over_at)) = self.pool.job_done(worker) else {
            return false;
        };
        let now = self.args.clock.now_ms();
        self.capacity.job_done(now - handed_over_at);
        self.queue.finish(branch_rule_id, now);
        if let Some(drain) = self.drain.as_mut() {
            if drain.deadline_passed {
                drain.report.cancelled_after_grace += 1;
            } else {
                drain.report.finished_in_grace += 1;
            }
        }
        self.finish_drain_if_done();
        if self.started && self.drain.is_none() {
            self.schedule_tick(myself, Duration::ZERO);
        }
        self.publish_gauges();
        true
    }

    /// A worker stopped. A normal stop comes after its job was recorded
    /// (single-job mode), and may overtake its JobFinished message, since
    /// supervision events have priority. A failure (panic, error) while it
    /// held a job means the job was never recorded: it is recorded Failed
    /// with the reason, and its lock released. Either way a fresh worker
    /// follows the cooldown.
    async fn worker_gone(
        &mut self,
        myself: &ActorRef<MasterMsg>,
        id: ActorId,
        failure: Option<String>,
    ) {
        if let Some(branch_rule_id) = self.recording.remove(&id) {
            // It stopped with its finish queued (a normal stop overtaking
            // its JobFinished, or a failure while it waited): the finish
            // commits without it.
            if let Some(reason) = &failure {
                error!(%branch_rule_id, "💥 Worker failed while its finish was committing: {reason}");
            }
            self.finish_recorded(branch_rule_id);
        }
        let Some(job) = self.pool.gone(id) else {
            return;
        };
        match (failure, job.cloned()) {
            (None, Some(job)) => self.settle(myself, id, job.branch_rule_id()),
            (Some(reason), Some(job)) => {
                error!(
                    branch_rule_id = %job.branch_rule_id(),
                    execution_id = %job.execution_id(),
                    "💥 Worker failed during its job: {reason}"
                );
                self.record_lost_job(&job, &reason).await;
                metrics::counter!(m::JOBS_TOTAL, "outcome" => "failed").increment(1);
                self.settle(myself, id, job.branch_rule_id());
            }
            (Some(reason), None) => error!("💥 Idle worker failed: {reason}"),
            (None, None) => {}
        }
        self.replace_worker(myself).await;
        self.publish_gauges();
    }

    /// A fresh worker for a slot left free, after the cooldown.
    async fn replace_worker(&mut self, myself: &ActorRef<MasterMsg>) {
        if self.drain.is_some() {
            return;
        }
        let cooldown = self.args.config.worker_cooldown;
        if cooldown.is_zero() {
            // A zero-length timer still waits for the timer wheel's next
            // millisecond, idling this worker slot for that long after
            // every job.
            self.spawn_worker(myself).await;
        } else {
            myself.send_after(cooldown, || MasterMsg::SpawnWorker);
        }
    }

    /// Records a job whose worker died as Failed, acting for the worker
    /// (its owner is gone); the fence keeps this from touching a claim
    /// someone else holds by now.
    async fn record_lost_job(&mut self, job: &Job, reason: &str) {
        let now = self.args.clock.now_ms();
        let decision = decided_finish(job, &job.spec.schedule, Ending::Failed, now);
        let (skipped, retry) = (decision.skipped.clone(), decision.retry_at());
        let finish = decision.finish(
            ExecutionStatus::Failed,
            now,
            Some(format!("worker failed: {reason}")),
            None,
            true,
        );
        if self.write_finish(job, finish).await {
            record_decision(job, &skipped, retry);
        }
    }

    /// The terminal write for a job that never reached a worker: the
    /// occurrence is not advanced, so it runs again (as a new attempt).
    async fn release(&mut self, job: Box<Job>, reason: &str) {
        self.give_back(vec![(None, job)], reason).await;
    }

    /// Gives back claims whose jobs will not start here. One claimed ahead
    /// and not due yet (`due` after now) is withdrawn, as if never made,
    /// since nothing ran and nothing was late; any other is released:
    /// recorded Cancelled for `reason`, its occurrence left due, so it
    /// runs again as a new attempt. The withdrawals share one transaction
    /// and the releases one group commit, so a stop with hundreds of
    /// queued claims waits for two commits, not one each. Returns how many
    /// were released rather than withdrawn.
    async fn give_back(&mut self, jobs: Vec<(Option<Millis>, Box<Job>)>, reason: &str) -> usize {
        let now = self.args.clock.now_ms();
        let (ahead, mut released): (Vec<_>, Vec<_>) = jobs
            .into_iter()
            .partition(|(due, _)| due.is_some_and(|due| due > now));
        if !ahead.is_empty() {
            let fences: Vec<Fence> = ahead.iter().map(|(_, job)| job.fence.clone()).collect();
            match self.args.store.withdraw_claims(&fences, now).await {
                Ok(withdrawn) => {
                    for ((due, job), withdrawn) in ahead.into_iter().zip(withdrawn) {
                        if !withdrawn {
                            released.push((due, job));
                            continue;
                        }
                        metrics::counter!(m::LOCK_CLAIMS_TOTAL, "result" => "withdrawn")
                            .increment(1);
                        info!(
                            branch_rule_id = %job.branch_rule_id(),
                            execution_id = %job.execution_id(),
                            "↩️ Claim withdrawn before its due time, nothing run: {reason}"
                        );
                        self.run_ended(job.branch_rule_id());
                    }
                }
                Err(e) => {
                    metrics::counter!(m::DB_ERRORS_TOTAL, "op" => "withdraw_claim").increment(1);
                    warn!(
                        "Cannot withdraw {} claim(s) made ahead: {e}; recording them cancelled",
                        ahead.len()
                    );
                    released.extend(ahead);
                }
            }
        }
        // All queued before any is awaited, so they share a commit.
        let mut pending = Vec::with_capacity(released.len());
        for (_, job) in &released {
            let finish = Finish::leaving_due(ExecutionStatus::Cancelled, now, reason.to_string());
            let queued = self.args.batcher.queue_finish(&job.fence, &finish).await;
            pending.push((queued, finish));
        }
        for ((_, job), (queued, finish)) in released.iter().zip(pending) {
            self.finish_landed(job, queued, finish, now).await;
        }
        released.len()
    }

    /// True when the write landed.
    async fn write_finish(&mut self, job: &Job, finish: Finish) -> bool {
        let now = self.args.clock.now_ms();
        let queued = self.args.batcher.queue_finish(&job.fence, &finish).await;
        self.finish_landed(job, queued, finish, now).await
    }

    /// Waits for a queued terminal write; true when it landed.
    async fn finish_landed(
        &self,
        job: &Job,
        queued: PendingTransition,
        finish: Finish,
        now: Millis,
    ) -> bool {
        let args = &self.args;
        let recorded = finish_recorded(queued, &args.directory, &job.fence, finish, now).await;
        if let Recorded::InOutbox(e) = &recorded {
            warn!(branch_rule_id = %job.branch_rule_id(), execution_id = %job.execution_id(), "Terminal write kept in the outbox: {e}");
        }
        matches!(recorded, Recorded::Landed)
    }

    /// Cancellation (seed 002): before the handoff the master owns the
    /// execution and records it Cancelled; after it, the worker does.
    async fn cancel_execution(&mut self, execution_id: Uuid) -> CancelOutcome {
        let queued = self
            .queue
            .find_queued(|job| job.execution_id() == execution_id);
        if let Some((branch_rule_id, job)) =
            queued.and_then(|id| self.queue.remove_queued(id).map(|job| (id, job)))
        {
            let now = self.args.clock.now_ms();
            let decision = decided_finish(&job, &job.spec.schedule, Ending::Cancelled, now);
            let (skipped, retry) = (decision.skipped.clone(), decision.retry_at());
            let finish = decision.finish(
                ExecutionStatus::Cancelled,
                now,
                Some("cancelled before the handoff".to_string()),
                None,
                false,
            );
            if self.write_finish(&job, finish).await {
                record_decision(&job, &skipped, retry);
            }
            self.queue.finish(branch_rule_id, now);
            metrics::counter!(m::JOBS_TOTAL, "outcome" => "cancelled").increment(1);
            info!(%branch_rule_id, %execution_id, "🛑 Cancelled before the handoff");
            return CancelOutcome::CancelledBeforeHandoff;
        }
        let busy = self
            .pool
            .busy()
            .find(|(_, job)| job.execution_id() == execution_id);
        if let Some((worker, job)) = busy {
            if let Some(worker) = worker {
                let _ = worker.cast(WorkerMsg::Cancel {
                    execution_id,
                    reason: CancelReason::Requested,
                });
            }
            info!(branch_rule_id = %job.branch_rule_id(), %execution_id, "🛑 Cancel sent to the worker");
            return CancelOutcome::CancelSentToWorker;
        }
        CancelOutcome::NotInFlight
    }

    async fn force_stop(&mut self, branch_rule_id: Uuid) -> Result<ForceStopOutcome, String> {
        let now = self.args.clock.now_ms();
        let flag_set = self
            .args
            .store
            .set_force_stopped(branch_rule_id, true, now)
            .await
            .map_err(|e| e.to_string())?;
        let in_flight = self.queue.active_execution(&branch_rule_id).or_else(|| {
            self.queue
                .queued(&branch_rule_id)
                .map(|job| job.execution_id())
        });
        let cancel = match in_flight {
            Some(execution_id) => self.cancel_execution(execution_id).await,
            None => CancelOutcome::NotInFlight,
        };
        if let Some(refresher) = self.args.directory.refresher() {
            let _ = refresher.cast(crate::messages::RefresherMsg::RefreshNow);
        }
        Ok(ForceStopOutcome { flag_set, cancel })
    }

    /// Tells the plan this instance's run of a rule is over, so a run that
    /// ended without a row from the database does not stay "running".
    fn run_ended(&self, branch_rule_id: Uuid) {
        if let Some(plan) = self.args.directory.plan() {
            let _ = plan.cast(PlanMsg::RunEnded(branch_rule_id));
        }
    }

    /// Renews every queued claim; one found gone (taken over while this
    /// instance could not renew it) leaves the queue unwritten: the
    /// occurrence is someone else's now.
    async fn renew_queued_claims(&mut self) {
        let now = self.args.clock.now_ms();
        let pending: Vec<_> = self
            .queue
            .queued_jobs()
            .map(|job| {
                let fence = job.fence.clone();
                let batcher = self.args.batcher.clone();
                async move {
                    let renewed = batcher.renew_lock(&fence, now).await;
                    (fence, renewed)
                }
            })
            .collect();
        let mut renewed_fences = HashSet::new();
        for (fence, renewed) in futures_join_all(pending).await {
            match renewed {
                Ok(true) => {
                    renewed_fences.insert(fence);
                }
                Ok(false) => {
                    if self.queue.remove_queued(fence.branch_rule_id).is_some() {
                        warn!(branch_rule_id = %fence.branch_rule_id, execution_id = %fence.execution_id, "🔒 Queued claim lost before the handoff; dropped unwritten");
                        self.queue.finish(fence.branch_rule_id, now);
                        self.run_ended(fence.branch_rule_id);
                    }
                }
                Err(e) => {
                    metrics::counter!(m::DB_ERRORS_TOTAL, "op" => "renew_lock").increment(1);
                    debug!(branch_rule_id = %fence.branch_rule_id, "Queued claim not renewed: {e}");
                }
            }
        }
        // One pass stamps them all: a search of the queue for each would
        // cost a deep queue's length squared.
        if !renewed_fences.is_empty() {
            for job in self.queue.queued_jobs_mut() {
                if renewed_fences.contains(&job.fence) {
                    job.lock_renewed_at = now;
                }
            }
        }
        self.publish_gauges();
    }

    /// The lease keeper could not renew the heartbeat: peers may soon take
    /// this instance over. Every job stops and every queued claim is
    /// dropped, all unwritten: the fences would refuse the writes, and the
    /// peer that takes over records these attempts.
    fn self_fence(&mut self) {
        self.fenced = true;
        let now = self.args.clock.now_ms();
        let queued = self.queue.drain_queued();
        self.depth.queue_emptied();
        for (id, _) in &queued {
            self.queue.finish(*id, now);
            self.run_ended(*id);
        }
        self.cancel_running(CancelReason::LockLost);
        warn!(
            "🚧 Self-fenced: {} running job(s) cancelled, {} queued claim(s) dropped, all unwritten",
            self.pool.busy_len(),
            queued.len()
        );
        self.publish_gauges();
    }

    /// Samples the ready backlog; says when it outgrows the workers, and
    /// when they have caught up.
    async fn check_backlog(&mut self) {
        let capacity = self.capacity.jobs_per_second();
        metrics::gauge!(m::CAPACITY_JOBS_PER_SECOND).set(capacity);
        let Some(plan) = self.args.directory.plan() else {
            return;
        };
        let backlog = match ask(&plan, PlanMsg::Readiness).await {
            Ok(readiness) => readiness.ready,
            Err(e) => {
                debug!("Cannot read the ready backlog: {e}");
                return;
            }
        };
        let now = self.args.clock.now_ms();
        let config = &self.args.config;
        match self.backlog.sample(now, backlog) {
            Some(BacklogChange::Growing {
                lowest_before,
                lowest_now,
                backlog,
            }) => {
                let mean_job = self.capacity.mean_job_ms().map_or_else(
                    || "none finished yet".to_string(),
                    |ms| format!("{ms:.0} ms"),
                );
                warn!(
                    backlog,
                    lowest_before,
                    lowest_now,
                    capacity_jobs_per_second = capacity,
                    "📈 Ready backlog growing: {backlog} rule(s) due and waiting, never fewer than {lowest_now} in the last {:?} (up from {lowest_before}); the workers run about {capacity:.2} jobs/s (WORKER_COUNT={}, WORKER_COOLDOWN_SECONDS={}, WORKER_SINGLE_JOB_MODE={}, mean job {mean_job}). Raise WORKER_COUNT, lower WORKER_COOLDOWN_SECONDS or set WORKER_SINGLE_JOB_MODE=false.",
                    config.backlog_window,
                    config.worker_count,
                    config.worker_cooldown.as_secs_f64(),
                    config.worker_single_job_mode,
                );
            }
            Some(BacklogChange::CaughtUp) => {
                info!("📉 Ready backlog worked off: the workers caught up");
            }
            None => {}
        }
        metrics::gauge!(m::READY_BACKLOG_GROWING).set(if self.backlog.is_growing() {
            1.0
        } else {
            0.0
        });
    }

    fn stats(&self) -> crate::queue::QueueStats {
        self.queue
            .stats(self.args.config.worker_count, self.pool.alive_len())
    }

    fn publish_gauges(&self) {
        metrics::gauge!(m::QUEUE_SIZE).set(self.queue.queued_len() as f64);
        metrics::gauge!(m::ACTIVE_JOBS).set(self.queue.active_len() as f64);
        metrics::gauge!(m::WORKERS, "state" => "alive").set(self.pool.alive_len() as f64);
        metrics::gauge!(m::WORKERS, "state" => "busy").set(self.pool.busy_len() as f64);
    }

    async fn start_drain(
        &mut self,
        myself: &ActorRef<MasterMsg>,
        grace: Duration,
        reply: RpcReplyPort<DrainReport>,
    ) {
        info!(
            "👑 Master draining: no new dispatch; {} job(s) running",
            self.pool.busy_len()
        );
        let mut report = DrainReport::default();
        let queued: Vec<_> = self
            .queue
            .drain_queued_with_due()
            .into_iter()
            .map(|(_, due, job)| (due, job))
            .collect();
        if !queued.is_empty() {
            let (count, started) = (queued.len(), std::time::Instant::now());
            let released = self
                .give_back(queued, "cancelled at shutdown before the handoff")
                .await;
            report.cancelled_before_handoff += released;
            info!(
                "👑 Master gave back {count} queued claim(s) in {} ms: {released} recorded cancelled, {} withdrawn",
                started.elapsed().as_millis(),
                count - released
            );
        }
        self.drain = Some(Drain {
            reply: Some(reply),
            report,
            deadline_passed: false,
        });
        if self.pool.busy_len() > 0 {
            myself.send_after(grace, || MasterMsg::DrainDeadline);
        }
        self.finish_drain_if_done();
    }

    fn drain_deadline(&mut self) {
        let Some(drain) = self.drain.as_mut() else {
            return;
        };
        drain.deadline_passed = true;
        warn!(
            "Grace period over: cancelling {} running job(s)",
            self.pool.busy_len()
        );
        self.cancel_running(CancelReason::Shutdown);
    }

    /// Tells every busy worker to cancel its job.
    fn cancel_running(&self, reason: CancelReason) {
        for (worker, job) in self.pool.busy() {
            if let Some(worker) = worker {
                let _ = worker.cast(WorkerMsg::Cancel {
                    execution_id: job.execution_id(),
                    reason,
                });
            }
        }
    }

    fn finish_drain_if_done(&mut self) {
        let Some(drain) = self.drain.as_mut() else {
            return;
        };
        if self.pool.busy_len() > 0 || !self.claiming.is_empty() || !self.recording.is_empty() {
            return;
        }
        if let Some(reply) = drain.reply.take() {
            info!("👑 Master drained: {:?}", drain.report);
            let _ = reply.send(drain.report.clone());
        }
    }
}

/// Runs the futures concurrently (they share the batcher's group commit)
/// and returns their outputs in order.
/// Backlog samples per [`Config::backlog_window`].
const BACKLOG_SAMPLES: u32 = 6;

/// How long a worker slot rests after each job: single-job mode replaces
/// the worker after the cooldown; a reused worker takes the next job at once.
fn rest_after_each_job(config: &Config) -> Millis {
    if config.worker_single_job_mode {
        config.worker_cooldown.as_millis() as Millis
    } else {
        0
    }
}

/// Reads in one go the action steps of the won claims whose rules the
/// plan's capped cache does not hold. If the read fails they stay `None`
/// and each worker reads its own (recording the occurrence failed, and due
/// again, if that fails too).
async fn read_uncached_steps(
    store: &Store,
    results: &mut [(JobSpec, Result<Option<Claim>, String>)],
) {
    let uncached: Vec<Uuid> = results
        .iter()
        .filter(|(spec, outcome)| spec.steps.is_none() && matches!(outcome, Ok(Some(_))))
        .map(|(spec, _)| spec.branch_rule.id)
        .collect();
    if uncached.is_empty() {
        return;
    }
    match store.action_steps_of(&uncached).await {
        Ok(mut read) => {
            for (spec, _) in results.iter_mut() {
                if spec.steps.is_none()
                    && let Some(steps) = read.remove(&spec.branch_rule.id)
                {
                    spec.steps = Some(job_steps(steps));
                }
            }
        }
        Err(e) => {
            metrics::counter!(m::DB_ERRORS_TOTAL, "op" => "action_steps").increment(1);
            warn!(
                "⚠️ Action details of {} claimed rule(s) not read for their batch; each worker reads its own: {e}",
                uncached.len()
            );
        }
    }
}

async fn futures_join_all<F: std::future::Future + Send + 'static>(
    futures: Vec<F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let mut set = JoinSet::new();
    for (index, future) in futures.into_iter().enumerate() {
        set.spawn(async move { (index, future.await) });
    }
    let mut outputs: Vec<Option<F::Output>> = (0..set.len()).map(|_| None).collect();
    while let Some(joined) = set.join_next().await {
        if let Ok((index, output)) = joined {
            outputs[index] = Some(output);
        }
    }
    outputs.into_iter().flatten().collect()
}

fn format_time(at: Millis) -> String {
    crate::clock::millis_to_utc(at).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// How long a starting master waits for the memory guard's status.
const GUARD_STATUS_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether the memory guard holds work back now: a restarted master must
/// not run what the guard is deferring. No guard (actors built by hand,
/// or the guard restarting, which publishes its first verdict) means no.
async fn memory_throttled(directory: &Directory) -> bool {
    let Some(guard) = directory.memory_guard() else {
        return false;
    };
    match ask_within(&guard, GUARD_STATUS_TIMEOUT, MemoryGuardMsg::Status).await {
        Ok(status) => status.throttle.throttled,
        Err(e) => {
            warn!("The memory guard did not give its status ({e}); starting unthrottled");
            false
        }
    }
}
