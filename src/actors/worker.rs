//! The WorkerActor: runs one job's actions and records the outcome. In
//! single-job mode (the default) it stops after one job and the master
//! starts a fresh one, so nothing a job leaves behind outlives it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::actions::panic_report::{self, Scrubber};
use crate::actions::secrets::Secrets;
use crate::actions::{ActionCall, ActionError, ActionRegistry};
use crate::actors::{Recorded, finish_recorded, record_finish};
use crate::clock::Clock;
use crate::config::Config;
use crate::directory::Directory;
use crate::lifecycle::SkippedOccurrence;
use crate::lifecycle::{Fence, Finish};
use crate::messages::master::JobReport;
use crate::messages::worker::{CancelReason, Job, JobOutcome};
use crate::messages::{MasterMsg, PlanMsg, WorkerMsg};
use crate::metrics as m;
use crate::model::{ExecutionStatus, Millis};
use crate::plan::{Ending, FinishDecision, JobStep, RunEnd, decide_finish, job_steps};
use crate::schedule::CronSchedule;
use crate::store::{
    BatchError, PendingTransition, Store, StoreError, Transition, TransitionBatcher,
};
use chrono_tz::Tz;
use uuid::Uuid;

/// The whole output of a job is capped too, whatever each action returns.
pub const JOB_OUTPUT_CAP_BYTES: usize = 64 * 1024;

pub struct WorkerActor;

pub struct WorkerArgs {
    /// Worker-N in the logs.
    pub number: u64,
    pub config: Arc<Config>,
    pub clock: Clock,
    pub store: Store,
    pub batcher: TransitionBatcher,
    pub registry: ActionRegistry,
    pub directory: Directory,
    pub master: ActorRef<MasterMsg>,
}

struct CurrentJob {
    job: Box<Job>,
    cancel: Option<oneshot::Sender<CancelReason>>,
    cancel_reason: Option<CancelReason>,
    renewal: JoinHandle<()>,
    started: Instant,
}

/// A job handed over while memory was short: its lock is kept fresh until
/// it can start.
struct HeldJob {
    job: Box<Job>,
    renewal: JoinHandle<()>,
}

pub struct WorkerState {
    args: WorkerArgs,
    id: ActorId,
    current: Option<CurrentJob>,
    /// Set by the master while the memory guard holds new work back.
    throttled: bool,
    held: Option<HeldJob>,
}

impl Actor for WorkerActor {
    type Msg = WorkerMsg;
    type State = WorkerState;
    type Arguments = WorkerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<WorkerMsg>,
        args: WorkerArgs,
    ) -> Result<WorkerState, ActorProcessingErr> {
        panic_report::install_hook();
        Ok(WorkerState {
            args,
            id: myself.get_id(),
            current: None,
            throttled: false,
            held: None,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<WorkerMsg>,
        message: WorkerMsg,
        state: &mut WorkerState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            WorkerMsg::Run { job, scheduled } => state.take_over(&myself, job, scheduled).await,
            WorkerMsg::Cancel {
                execution_id,
                reason,
            } => {
                let held = state.held.as_ref().map(|held| held.job.execution_id());
                if held == Some(execution_id) {
                    state.drop_held(&myself, reason).await;
                } else if let Some(current) = state
                    .current
                    .as_mut()
                    .filter(|current| current.job.execution_id() == execution_id)
                {
                    current.cancel(reason);
                }
            }
            WorkerMsg::RenewLock if state.current.is_none() => {
                state.renew_held_lock(&myself).await;
            }
            WorkerMsg::RenewLock => state.renew_lock().await,
            WorkerMsg::MemoryThrottle { throttled } => {
                state.throttled = throttled;
                if !throttled && let Some(held) = state.held.take() {
                    held.renewal.abort();
                    let (running, at) = state.queue_running(&held.job).await;
                    let check = StartCheck::Awaited(running);
                    state.start(&myself, held.job, check, at).await;
                }
            }
            WorkerMsg::ClaimLost { execution_id } => {
                let number = state.args.number;
                if let Some(current) = state
                    .current
                    .as_mut()
                    .filter(|current| current.job.execution_id() == execution_id)
                {
                    warn!(branch_rule_id = %current.job.branch_rule_id(), %execution_id, "Worker-{number} lost the claim as its job started; cancelling it");
                    current.cancel(CancelReason::LockLost);
                }
            }
            WorkerMsg::ActionsDone(outcome) => {
                state.finish(*outcome).await;
                if state.args.config.worker_single_job_mode {
                    myself.stop(Some("single-job mode: job done".into()));
                }
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<WorkerMsg>,
        state: &mut WorkerState,
    ) -> Result<(), ActorProcessingErr> {
        // Dropping the job task's cancel sender stops its actions; a stop
        // with a job still running is the supervisor's business, not ours.
        if let Some(current) = state.current.take() {
            current.renewal.abort();
        }
        if let Some(held) = state.held.take() {
            held.renewal.abort();
        }
        Ok(())
    }
}

impl CurrentJob {
    fn cancel(&mut self, reason: CancelReason) {
        if let Some(cancel) = self.cancel.take() {
            self.cancel_reason = Some(reason);
            let _ = cancel.send(reason);
        }
    }
}

/// How a job's start is checked against its Scheduled and Running writes.
enum StartCheck {
    /// Scheduled has applied; Running is awaited before the actions start.
    Awaited(PendingTransition),
    /// A fresh claim: the actions start at once and both writes are checked
    /// as they commit, in the same group commit as the last job's finish.
    /// Only a takeover can move a claim's lock, and none can come within
    /// the freshness bound: a peer takes over a claim only once this
    /// instance has been silent for a lease TTL (and it fences itself
    /// before that), or once the lock is older than the lock timeout. Waiting
    /// for the commit first cost each job a commit of its own, which with
    /// few workers set the rate. Should the writes still find the claim
    /// gone, the actions are cancelled as on a lost renewal.
    InFlight {
        scheduled: PendingTransition,
        running: PendingTransition,
    },
}

/// The longest a claim may have waited and still start before its
/// Scheduled and Running writes commit: a tenth of the shorter of the lease
/// TTL and the lock timeout, and a second at most.
fn freshness_bound(config: &Config) -> Millis {
    let bound = config
        .partition_lease_ttl
        .min(config.schedule_lock_timeout)
        .min(Duration::from_secs(10))
        / 10;
    bound.as_millis() as Millis
}

/// How often a claimed job's lock is renewed: a third of
/// SCHEDULE_LOCK_TIMEOUT_SECONDS, so one failed renewal leaves it live.
fn renewal_interval(config: &Config) -> Duration {
    config.schedule_lock_timeout / 3
}

/// Whether a lock last stamped at `renewed_at` has missed two renewals by
/// `now`: a third would find it stale, and a peer free to take it over
/// ([`CancelReason::LockExpiring`]).
fn lock_expiring(config: &Config, renewed_at: Millis, now: Millis) -> bool {
    let interval = renewal_interval(config).as_millis() as Millis;
    now - renewed_at > interval * 3 / 2
}

/// A lock older than one renewal interval is renewed as its job starts or
/// is held, instead of an interval later: a claim that waited in the queue
/// may be close to stale.
fn renew_now(config: &Config, renewed_at: Millis, now: Millis) -> bool {
    now - renewed_at > renewal_interval(config).as_millis() as Millis
}

/// The two writes a job's start is checked against.
#[derive(Clone, Copy)]
enum StartWrite {
    /// The master's, at the handoff.
    Scheduled,
    /// The worker's, as it starts.
    Running,
}

/// A start write's outcome: `false` when it found the claim gone (lock
/// taken over, or cancelled): the occurrence is someone else's now. A
/// database error does not stop the job: the claim holds, and the terminal
/// write records the outcome (or goes to the outbox).
fn claim_held(
    write: StartWrite,
    number: u64,
    (branch_rule_id, execution_id): (Uuid, Uuid),
    outcome: Result<bool, BatchError>,
) -> bool {
    let (op, state) = match write {
        StartWrite::Scheduled => ("mark_scheduled", "Scheduled"),
        StartWrite::Running => ("mark_running", "Running"),
    };
    match outcome {
        Ok(true) => true,
        Ok(false) => {
            match write {
                StartWrite::Scheduled => {
                    warn!(%branch_rule_id, %execution_id, "Claim lost before the handoff")
                }
                StartWrite::Running => {
                    warn!(%branch_rule_id, %execution_id, "Worker-{number} lost the claim before starting")
                }
            }
            false
        }
        Err(e) => {
            metrics::counter!(m::DB_ERRORS_TOTAL, "op" => op).increment(1);
            warn!(%branch_rule_id, %execution_id, "{state} state not recorded: {e}");
            true
        }
    }
}

/// The Running write's outcome ([`claim_held`]). Running applies only over
/// a recorded Scheduled, so when the Scheduled write itself failed (a
/// database error, which does not stop the job) a Running that found
/// nothing is no sign the claim is gone: the lock says which.
async fn running_held(
    batcher: &TransitionBatcher,
    fence: &Fence,
    number: u64,
    outcome: Result<bool, BatchError>,
    now: Millis,
) -> bool {
    let ids = (fence.branch_rule_id, fence.execution_id);
    if matches!(outcome, Ok(false)) && matches!(batcher.renew_lock(fence, now).await, Ok(true)) {
        metrics::counter!(m::DB_ERRORS_TOTAL, "op" => "mark_running").increment(1);
        warn!(branch_rule_id = %ids.0, execution_id = %ids.1, "Running state not recorded: the Scheduled write before it was not; the claim holds");
        return true;
    }
    claim_held(StartWrite::Running, number, ids, outcome)
}

/// Logs and counts a renewal the database refused. Returns whether the
/// job must stop: the lock is about to turn stale ([`lock_expiring`]).
/// Until then the lock stays ours and the next renewal tries again.
fn renewal_failed(config: &Config, job: &Job, now: Millis, error: &BatchError) -> bool {
    metrics::counter!(m::DB_ERRORS_TOTAL, "op" => "renew_lock").increment(1);
    let (branch_rule_id, execution_id) = (job.branch_rule_id(), job.execution_id());
    let expiring = lock_expiring(config, job.lock_renewed_at, now);
    if expiring {
        warn!(
            %branch_rule_id, %execution_id,
            "🔒 Lock renewal failed: {error}; the lock was last renewed {} s ago, and a peer may take it over at {} s (SCHEDULE_LOCK_TIMEOUT_SECONDS): stopping the job first",
            (now - job.lock_renewed_at) / 1_000,
            config.schedule_lock_timeout.as_secs()
        );
    } else {
        warn!(%branch_rule_id, %execution_id, "Lock renewal failed: {error}");
    }
    expiring
}

impl WorkerState {
    /// A job from the master, its Scheduled write queued. Running is
    /// queued at once, right behind it, so both commit together; it
    /// applies only if Scheduled did. A fresh claim starts at once
    /// ([`StartCheck::InFlight`]); an older one once both writes landed; a
    /// job held back by the memory guard queues Running when it starts.
    async fn take_over(
        &mut self,
        myself: &ActorRef<WorkerMsg>,
        job: Box<Job>,
        scheduled: PendingTransition,
    ) {
        let Some(job) = self.with_live_lock(myself, job).await else {
            return;
        };
        let running = if self.throttled {
            None
        } else {
            let (running, at) = self.queue_running(&job).await;
            if self.claim_is_fresh(&job, at) {
                let check = StartCheck::InFlight { scheduled, running };
                self.start(myself, job, check, at).await;
                return;
            }
            Some((running, at))
        };
        if !self.handoff_confirmed(&job, scheduled).await {
            self.report(&job, ExecutionStatus::Cancelled);
            myself.stop(Some("claim lost before the handoff".into()));
            return;
        }
        match running {
            Some((running, at)) => {
                let check = StartCheck::Awaited(running);
                self.start(myself, job, check, at).await
            }
            None => self.hold(myself, job),
        }
    }

    /// A claim that waited in the queue while the database refused its
    /// renewals may be close to stale: started, it would run while a peer
    /// is free to take it over. Its lock is renewed first, and the job is
    /// given back unstarted (Cancelled, the occurrence left to run again)
    /// when that fails too, or dropped when the claim is gone.
    async fn with_live_lock(
        &mut self,
        myself: &ActorRef<WorkerMsg>,
        mut job: Box<Job>,
    ) -> Option<Box<Job>> {
        let now = self.args.clock.now_ms();
        if !lock_expiring(&self.args.config, job.lock_renewed_at, now) {
            return Some(job);
        }
        match self.args.batcher.renew_lock(&job.fence, now).await {
            Ok(true) => {
                job.lock_renewed_at = now;
                Some(job)
            }
            Ok(false) => {
                warn!(branch_rule_id = %job.branch_rule_id(), execution_id = %job.execution_id(), "🔒 Worker-{} found its claim taken over before it started; dropped unwritten", self.args.number);
                self.report(&job, ExecutionStatus::Cancelled);
                myself.stop(Some("claim lost before start".into()));
                None
            }
            Err(e) => {
                renewal_failed(&self.args.config, &job, now, &e);
                self.give_back_unstarted(myself, job, CancelReason::LockExpiring)
                    .await;
                None
            }
        }
    }

    /// Waits for the master's Scheduled write ([`claim_held`]).
    async fn handoff_confirmed(&self, job: &Job, scheduled: PendingTransition) -> bool {
        let ids = (job.branch_rule_id(), job.execution_id());
        let outcome = scheduled.applied().await;
        claim_held(StartWrite::Scheduled, self.args.number, ids, outcome)
    }

    /// Whether the job's claim is recent enough to start before its writes
    /// commit ([`StartCheck::InFlight`]).
    fn claim_is_fresh(&self, job: &Job, now: Millis) -> bool {
        now - job.execution.requested_at <= freshness_bound(&self.args.config)
    }

    /// Queues the job's Running write, stamped now.
    async fn queue_running(&self, job: &Job) -> (PendingTransition, Millis) {
        let now = self.args.clock.now_ms();
        let running = Transition::Running {
            fence: job.fence.clone(),
            now,
        };
        (self.args.batcher.enqueue(running).await, now)
    }

    async fn start(
        &mut self,
        myself: &ActorRef<WorkerMsg>,
        job: Box<Job>,
        check: StartCheck,
        now: Millis,
    ) {
        let args = &self.args;
        let execution_id = job.execution_id();
        let branch_rule_id = job.branch_rule_id();
        info!(
            %branch_rule_id, %execution_id,
            "👷 Worker-{} pulled job {branch_rule_id}", args.number
        );
        let in_flight = match check {
            StartCheck::Awaited(running) => {
                let outcome = running.applied().await;
                if !running_held(&args.batcher, &job.fence, args.number, outcome, now).await {
                    self.report(&job, ExecutionStatus::Cancelled);
                    myself.stop(Some("claim lost before start".into()));
                    return;
                }
                None
            }
            StartCheck::InFlight { scheduled, running } => Some((scheduled, running)),
        };
        let lag_ms = (now - job.execution.scheduled_for).max(0);
        metrics::histogram!(m::DISPATCH_LAG_SECONDS).record(lag_ms as f64 / 1000.0);
        let _ = args.master.cast(MasterMsg::JobStarted { at: now, lag_ms });

        // Why the steps cannot be run, when a row of them is unreadable.
        let mut unreadable = None;
        let steps = match job.spec.steps.clone() {
            Some(steps) => steps,
            // Past the plan's action-details cap: read them now.
            None => match args.store.action_steps(branch_rule_id).await {
                Ok(rows) => job_steps(rows),
                // A row that does not decode (a detail or template broken
                // with SQL) fails every read until an operator fixes it, so
                // leaving the occurrence due would fail it again every few
                // seconds, for ever. The plan holds only the rules whose
                // details it caches; this one fails as a failing action
                // would, and its policy (retries, next run) applies.
                Err(e @ StoreError::Decode { .. }) => {
                    warn!(%branch_rule_id, %execution_id, "🚫 Worker-{} cannot run the occurrence: its action details are unreadable: {e}; fix the row", args.number);
                    unreadable = Some(format!(
                        "cannot read the action details: {e}; nothing ran; fix the row"
                    ));
                    Vec::new()
                }
                Err(e) => {
                    // Nothing ran: the occurrence is not consumed. It is
                    // recorded Failed with the reason and, its next run
                    // left as it was, claimed again as the next attempt.
                    metrics::counter!(m::DB_ERRORS_TOTAL, "op" => "action_steps").increment(1);
                    warn!(%branch_rule_id, %execution_id, "Worker-{} could not read the action details; the occurrence runs again: {e}", args.number);
                    let finish = Finish::leaving_due(
                        ExecutionStatus::Failed,
                        now,
                        format!(
                            "cannot read the action details: {e}; nothing ran, the occurrence runs again"
                        ),
                    );
                    let recorded =
                        record_finish(&args.batcher, &args.directory, &job.fence, finish, now)
                            .await;
                    if let Recorded::InOutbox(e) = recorded {
                        warn!(%branch_rule_id, %execution_id, "Failure kept in the outbox: {e}");
                    }
                    metrics::counter!(m::JOBS_TOTAL, "outcome" => "failed").increment(1);
                    self.report(&job, ExecutionStatus::Failed);
                    myself.stop(Some("action details unreadable".into()));
                    return;
                }
            },
        };
        let (cancel_tx, cancel_rx) = oneshot::channel();
        let registry = args.registry.clone();
        let timeout = args.config.schedule_execution_timeout;
        let execution_id = job.execution_id();
        let worker = myself.clone();
        let steps = Arc::new(steps);
        let scrub: Scrubber = {
            let steps = steps.clone();
            Arc::new(move |text| without_secrets(&steps, execution_id, text))
        };
        let report_scrub = scrub.clone();
        tokio::spawn(async move {
            // The actions run in a task of their own so that a panicking
            // action is seen here as a failed job, with its message, instead
            // of a job that never reports back.
            let actions = async move {
                match unreadable {
                    Some(error) => failed(error),
                    None => run_steps(&registry, execution_id, &steps, timeout, cancel_rx).await,
                }
            };
            let outcome = tokio::spawn(panic_report::scrubbed(actions, report_scrub))
                .await
                .unwrap_or_else(|e| {
                    failed(scrub(format!("action panicked: {}", panic_message(e))))
                });
            let _ = worker.cast(WorkerMsg::ActionsDone(Box::new(outcome)));
        });
        if let Some((scheduled, running)) = in_flight {
            let (worker, number, ids) =
                (myself.clone(), args.number, (branch_rule_id, execution_id));
            let (batcher, fence) = (args.batcher.clone(), job.fence.clone());
            tokio::spawn(async move {
                let held =
                    claim_held(
                        StartWrite::Scheduled,
                        number,
                        ids,
                        scheduled.applied().await,
                    ) && running_held(&batcher, &fence, number, running.applied().await, now).await;
                if !held {
                    let _ = worker.cast(WorkerMsg::ClaimLost { execution_id });
                }
            });
        }
        let renewal = myself.send_interval(renewal_interval(&args.config), || WorkerMsg::RenewLock);
        if renew_now(&args.config, job.lock_renewed_at, now) {
            let _ = myself.cast(WorkerMsg::RenewLock);
        }
        self.current = Some(CurrentJob {
            job,
            cancel: Some(cancel_tx),
            cancel_reason: None,
            renewal,
            started: Instant::now(),
        });
    }

    fn hold(&mut self, myself: &ActorRef<WorkerMsg>, job: Box<Job>) {
        info!(
            branch_rule_id = %job.branch_rule_id(),
            execution_id = %job.execution_id(),
            "👷 Worker-{} waits for memory before starting its job", self.args.number
        );
        let config = &self.args.config;
        let renewal = myself.send_interval(renewal_interval(config), || WorkerMsg::RenewLock);
        if renew_now(config, job.lock_renewed_at, self.args.clock.now_ms()) {
            let _ = myself.cast(WorkerMsg::RenewLock);
        }
        self.held = Some(HeldJob { job, renewal });
    }

    async fn renew_held_lock(&mut self, myself: &ActorRef<WorkerMsg>) {
        let Some(held) = self.held.as_mut() else {
            return;
        };
        let now = self.args.clock.now_ms();
        match self.args.batcher.renew_lock(&held.job.fence, now).await {
            Ok(true) => held.job.lock_renewed_at = now,
            Ok(false) => self.drop_held(myself, CancelReason::LockLost).await,
            Err(e) => {
                if renewal_failed(&self.args.config, &held.job, now, &e) {
                    self.drop_held(myself, CancelReason::LockExpiring).await;
                }
            }
        }
    }

    /// A held job never started, so it ends as one cancelled before the
    /// handoff does (seed 002): Cancelled, the occurrence not consumed
    /// unless an operator asked; at shutdown it runs after the restart.
    /// With the lock lost there is nothing of ours left to write.
    async fn drop_held(&mut self, myself: &ActorRef<WorkerMsg>, reason: CancelReason) {
        let Some(held) = self.held.take() else {
            return;
        };
        held.renewal.abort();
        self.give_back_unstarted(myself, held.job, reason).await;
    }

    /// Ends a job that never started ([`drop_held`](Self::drop_held)).
    async fn give_back_unstarted(
        &mut self,
        myself: &ActorRef<WorkerMsg>,
        job: Box<Job>,
        reason: CancelReason,
    ) {
        let (branch_rule_id, execution_id) = (job.branch_rule_id(), job.execution_id());
        warn!(%branch_rule_id, %execution_id, "🛑 Worker-{} dropped its job before it started: {reason:?}", self.args.number);
        if reason != CancelReason::LockLost {
            let now = self.args.clock.now_ms();
            let finish = match reason.ending() {
                // Nothing ran, and nothing asked for the occurrence to go:
                // it runs again after the restart.
                None => Finish::leaving_due(
                    ExecutionStatus::Cancelled,
                    now,
                    format!("cancelled before it started: {reason:?}"),
                ),
                Some(ending) => decided_finish(&job, &job.spec.schedule, ending, now).finish(
                    ExecutionStatus::Cancelled,
                    now,
                    Some(format!("cancelled before it started: {reason:?}")),
                    None,
                    false,
                ),
            };
            let args = &self.args;
            let recorded =
                record_finish(&args.batcher, &args.directory, &job.fence, finish, now).await;
            if let Recorded::InOutbox(e) = recorded {
                warn!(%branch_rule_id, %execution_id, "Cancellation kept in the outbox: {e}");
            }
            metrics::counter!(m::JOBS_TOTAL, "outcome" => "cancelled").increment(1);
        }
        self.report(&job, ExecutionStatus::Cancelled);
        myself.stop(Some("job dropped before it started".into()));
    }

    async fn renew_lock(&mut self) {
        let Some(current) = self.current.as_mut() else {
            return;
        };
        let now = self.args.clock.now_ms();
        match self.args.batcher.renew_lock(&current.job.fence, now).await {
            Ok(true) => current.job.lock_renewed_at = now,
            Ok(false) => {
                warn!(
                    branch_rule_id = %current.job.branch_rule_id(),
                    execution_id = %current.job.execution_id(),
                    "🔒 Lock lost while running; cancelling the job"
                );
                current.cancel(CancelReason::LockLost);
            }
            Err(e) => {
                if renewal_failed(&self.args.config, &current.job, now, &e) {
                    current.cancel(CancelReason::LockExpiring);
                }
            }
        }
    }

    /// The post-process: terminal state, last and next run, lock released,
    /// in one write; the database's row goes back to the plan. If the
    /// database cannot take it, the plan computes the next run locally and
    /// keeps the write in its outbox.
    async fn finish(&mut self, outcome: JobOutcome) {
        let Some(current) = self.current.take() else {
            return;
        };
        current.renewal.abort();
        let job = current.job;
        let args = &self.args;
        let now = args.clock.now_ms();
        let execution_id = job.execution_id();
        let branch_rule_id = job.branch_rule_id();
        if current.cancel_reason == Some(CancelReason::LockLost) {
            // Another owner holds the occurrence; our write would be fenced
            // out anyway, so do not pretend to record it.
            warn!(%branch_rule_id, %execution_id, "Result dropped: the lock was lost");
            self.report(&job, outcome.status);
            return;
        }
        let output = Some(json!({
            "worker": format!("Worker-{}", args.number),
            "steps": outcome.output,
        }));
        let stopped_unrenewed = outcome.status == ExecutionStatus::Cancelled
            && current.cancel_reason == Some(CancelReason::LockExpiring);
        let (finish, retry) = if stopped_unrenewed {
            // Stopped part-way, so it runs again as the next attempt, here
            // or on the peer that takes the lock over once it is stale: no
            // policy decides anything (no retry, no next run), so none is
            // asked for.
            let why = format!(
                "stopped: the lock was last renewed {} s ago and a peer may take it over at {} s (SCHEDULE_LOCK_TIMEOUT_SECONDS); the occurrence runs again",
                (now - job.lock_renewed_at) / 1_000,
                args.config.schedule_lock_timeout.as_secs()
            );
            let finish = Finish {
                output,
                ..Finish::leaving_due(outcome.status, now, why)
            };
            (finish, None)
        } else {
            let ending = match (outcome.status, current.cancel_reason) {
                (ExecutionStatus::Cancelled, Some(reason)) => {
                    reason.ending().unwrap_or(Ending::Cancelled)
                }
                (status, _) => Ending::of(status),
            };
            let (decision, no_next_run) =
                decide_at_finish(&args.directory, &job, ending, now).await;
            let error = match (&outcome.error, &no_next_run) {
                (error, None) => error.clone(),
                (None, Some(problem)) => Some(problem.clone()),
                (Some(error), Some(problem)) => Some(format!("{error}; {problem}")),
            };
            if let Some(problem) = &no_next_run {
                warn!(%branch_rule_id, %execution_id, "⏸️ {problem}");
            }
            let retry = decision.retry_at();
            (
                decision.finish(outcome.status, now, error, output, true),
                retry,
            )
        };
        let elapsed = current.started.elapsed();
        let finish_skipped = finish.skipped.clone();
        // The slot is handed back as soon as the finish is queued: the next
        // job's Scheduled and Running writes then share its commit, instead
        // of each job waiting for two commits in turn. This actor lives on
        // until the commit answers, and the master's drain waits for it, so
        // shutdown still records every finish an action earned.
        let pending = args.batcher.queue_finish(&job.fence, &finish).await;
        let _ = args.master.cast(MasterMsg::JobHandedBack(job_report(
            self.id,
            &job,
            outcome.status,
        )));
        match finish_recorded(pending, &args.directory, &job.fence, finish, now).await {
            Recorded::Landed => {
                record_decision(&job, &finish_skipped, retry);
            }
            Recorded::TakenOver => {
                warn!(%branch_rule_id, %execution_id, "Result not recorded: the claim was taken over");
            }
            Recorded::InOutbox(e) => {
                warn!(%branch_rule_id, %execution_id, "Post-process failed, keeping it in the outbox: {e}");
            }
        }
        metrics::counter!(m::JOBS_TOTAL, "outcome" => outcome.status.as_str()).increment(1);
        metrics::histogram!(m::JOB_DURATION_SECONDS).record(elapsed.as_secs_f64());
        let detail = outcome.error.as_deref().unwrap_or("");
        info!(
            %branch_rule_id, %execution_id,
            "✅ Worker-{} finished job {branch_rule_id}: {} in {} ms {detail}",
            args.number,
            outcome.status.as_str(),
            elapsed.as_millis()
        );
        self.report(&job, outcome.status);
    }

    fn report(&self, job: &Job, status: ExecutionStatus) {
        let _ = self
            .args
            .master
            .cast(MasterMsg::JobFinished(job_report(self.id, job, status)));
    }
}

fn job_report(worker: ActorId, job: &Job, status: ExecutionStatus) -> JobReport {
    JobReport {
        worker,
        branch_rule_id: job.branch_rule_id(),
        execution_id: job.execution_id(),
        status,
    }
}

/// The finish decision for a job from the schedule given (the plan's
/// current one, or the one the job was fetched with) and the job's policy.
pub fn decided_finish(
    job: &Job,
    schedule: &Result<(CronSchedule, Tz), String>,
    ending: Ending,
    now: Millis,
) -> FinishDecision {
    let spec = &job.spec;
    let cadence = schedule
        .as_ref()
        .ok()
        .map(|(schedule, zone)| spec.cadence_with(schedule, *zone));
    let run = RunEnd {
        branch_rule_id: spec.branch_rule.id,
        occurrence: job.execution.scheduled_for,
        failed_attempts: spec.branch_rule.failed_attempts,
        claimed_at: job.execution.requested_at,
        finished_at: now,
        ending,
    };
    decide_finish(cadence.as_ref(), &spec.policy, &run)
}

/// Logs and counts what a landed finish decided: the occurrences it
/// recorded skipped and the retry it scheduled.
pub(crate) fn record_decision(
    job: &Job,
    skipped: &[SkippedOccurrence],
    retry: Option<(Millis, i32)>,
) {
    let (branch_rule_id, execution_id) = (job.branch_rule_id(), job.execution_id());
    for occurrence in skipped {
        metrics::counter!(m::OCCURRENCES_SKIPPED_TOTAL, "reason" => occurrence.reason.as_str())
            .increment(1);
        info!(
            %branch_rule_id, %execution_id,
            "⏭️ Skipped the occurrence at {} of {branch_rule_id}: {}: {}",
            format_time(occurrence.scheduled_for), occurrence.reason, occurrence.detail
        );
    }
    if let Some((at, number)) = retry {
        metrics::counter!(m::RETRIES_TOTAL).increment(1);
        info!(
            %branch_rule_id, %execution_id,
            "🔁 Retry {number} of the occurrence at {} of {branch_rule_id} at {}",
            format_time(job.execution.scheduled_for),
            format_time(at)
        );
    }
}

fn format_time(at: Millis) -> String {
    crate::clock::millis_to_utc(at).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// How long a finish waits for the plan before it uses the schedule the
/// job was fetched with: the write must not wait on a busy plan actor.
const PLAN_SCHEDULE_TIMEOUT: Duration = Duration::from_secs(2);

/// The finish decision, and the problem to record when the rule's current
/// values give no next run (`no next run: invalid time zone …`).
///
/// The plan's current rows decide, so a zone or cron changed while the
/// job ran counts. When they give no schedule, the rule is held by the plan
/// (quarantine) until they are fixed, and the schedule the job ran under
/// still supplies the next run written: the occurrence that ran is never
/// left due, and the rule resumes by itself once fixed. With neither, the
/// finish clears next_run_time and the rule waits for an operator.
async fn decide_at_finish(
    directory: &Directory,
    job: &Job,
    ending: Ending,
    now: Millis,
) -> (FinishDecision, Option<String>) {
    let id = job.branch_rule_id();
    let current = match directory.plan() {
        Some(plan) => crate::actors::ask_within(&plan, PLAN_SCHEDULE_TIMEOUT, |reply| {
            PlanMsg::ScheduleOf { id, reply }
        })
        .await
        .ok(),
        None => None,
    };
    let (schedule, problem) = match current {
        Some(Ok(schedule)) => (Ok(schedule), None),
        Some(Err(e)) => (
            job.spec.schedule.clone(),
            Some(
                e.schedule_error()
                    .map_or_else(|| e.to_string(), ToString::to_string),
            ),
        ),
        // The plan is restarting or busy: the schedule the job was fetched
        // with stands in.
        None => (job.spec.schedule.clone(), None),
    };
    let decision = decided_finish(job, &schedule, ending, now);
    let retrying = decision.retry_at().is_some();
    let problem = match (&schedule, problem) {
        _ if retrying => None,
        (Ok(_), None) => None,
        (Ok(_), Some(problem)) => Some(format!(
            "no next run: {problem}; the rule is held until it is fixed"
        )),
        (Err(fetched), problem) => Some(format!(
            "no next run: {}; the rule is held until it is fixed",
            problem.unwrap_or_else(|| fetched.clone())
        )),
    };
    (decision, problem)
}

/// Runs the job's steps in position order; the first failure fails the
/// job. The whole job is bounded by `timeout` and stops at once when
/// `cancel` fires: dropping the step's future is what stops it (a command's
/// process group is killed by its guard).
fn failed(error: String) -> JobOutcome {
    JobOutcome {
        status: ExecutionStatus::Failed,
        error: Some(error),
        output: Value::Array(Vec::new()),
    }
}

/// The text a task panicked with, as `panic!` formats it.
fn panic_message(error: tokio::task::JoinError) -> String {
    if !error.is_panic() {
        return error.to_string();
    }
    let payload = error.into_panic();
    payload
        .downcast_ref::<&str>()
        .map(|text| text.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

/// `text` without the secrets of any of `steps`' calls. The registry
/// scrubs what an action returns, but a panic unwinds past it, and a
/// handler's panic message may quote its config.
fn without_secrets(steps: &[JobStep], execution_id: Uuid, text: String) -> String {
    steps
        .iter()
        .filter_map(|step| {
            let template = step.template.as_ref()?;
            Some(ActionCall::new(execution_id, template, &step.detail))
        })
        .fold(text, |text, call| {
            Secrets::of(&call.config).scrub_text(&text)
        })
}

pub async fn run_steps(
    registry: &ActionRegistry,
    execution_id: Uuid,
    steps: &[JobStep],
    timeout: Duration,
    cancel: oneshot::Receiver<CancelReason>,
) -> JobOutcome {
    let mut outputs = Vec::with_capacity(steps.len());
    let steps = async {
        for step in steps {
            let Some(template) = &step.template else {
                return Err(format!(
                    "step {}: action template {} is missing",
                    step.detail.position, step.detail.action_template_id
                ));
            };
            let call = ActionCall::new(execution_id, template, &step.detail);
            match registry.run(&call).await {
                Ok(output) => outputs.push(json!({
                    "position": call.position, "kind": call.kind, "output": output.0
                })),
                Err(error) => {
                    let mut entry = json!({
                        "position": call.position, "kind": call.kind, "error": error.to_string()
                    });
                    if let ActionError::Failed {
                        output: Some(output),
                        ..
                    } = &error
                    {
                        entry["output"] = output.clone();
                    }
                    outputs.push(entry);
                    return Err(format!("step {} ({}): {error}", call.position, call.kind));
                }
            }
        }
        Ok(())
    };
    let (status, error) = tokio::select! {
        result = steps => match result {
            Ok(()) => (ExecutionStatus::Completed, None),
            Err(message) => (ExecutionStatus::Failed, Some(message)),
        },
        reason = cancel => match reason {
            Ok(reason) => (ExecutionStatus::Cancelled, Some(format!("cancelled: {reason:?}"))),
            // The worker went away without cancelling: record it as lost.
            Err(_) => (ExecutionStatus::Failed, Some("worker_lost".to_string())),
        },
        _ = tokio::time::sleep(timeout) => (
            ExecutionStatus::TimedOut,
            Some(format!("timed out after {} s (SCHEDULE_EXECUTION_TIMEOUT_SECONDS)", timeout.as_secs_f64())),
        ),
    };
    JobOutcome {
        status,
        error,
        output: cap_output(Value::Array(outputs)),
    }
}

/// Keeps the stored output bounded: past the cap only a marker remains.
fn cap_output(output: Value) -> Value {
    let size = serde_json::to_vec(&output).map_or(0, |bytes| bytes.len());
    if size <= JOB_OUTPUT_CAP_BYTES {
        output
    } else {
        json!({"truncated": true, "bytes": size, "cap": JOB_OUTPUT_CAP_BYTES})
    }
}
