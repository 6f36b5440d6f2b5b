//! The PlanActor: the single owner and writer of the execution plan.

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::{debug, info, warn};

use crate::clock::{Clock, millis_to_utc};
use crate::cluster::Ownership;
use crate::config::Config;
use crate::directory::Directory;
use crate::lifecycle::RetryUpdate;
use crate::memory::heap::release_free_heap;
use crate::messages::plan::{HeldWorkflow, QuarantineReport, Readiness, ReadyJobs};
use crate::messages::{MasterMsg, PlanMsg, RefresherMsg, WriterMsg};
use crate::metrics as m;
use crate::model::{Millis, PlanScope};
use crate::persist::read_plan_file;
use crate::plan::{
    ExecutionPlan, MergeOptions, MergeReport, PlanStats, QuarantineChange, StaleLock, browse,
    check_ready, job_spec, merge, missed_windows, next_wake, next_wake_while_busy,
    next_wake_with_lead, ready_within_lead, schedule_of, take_ready_owned,
};
use crate::schedule::ScheduleCache;

pub struct PlanActor;

pub struct PlanArgs {
    pub config: Arc<Config>,
    pub clock: Clock,
    pub directory: Directory,
    /// What this instance owns until the lease keeper says otherwise.
    pub ownership: Ownership,
}

pub struct PlanState {
    plan: ExecutionPlan,
    config: Arc<Config>,
    clock: Clock,
    directory: Directory,
    /// Rule 5 of the merge: false until the first merge after this actor
    /// (re)started, which then trusts the database completely.
    merged_once: bool,
    /// Changed since the last snapshot went to the writer.
    dirty: bool,
    flush_scheduled: bool,
    last_enqueued_at: Option<Millis>,
    journal: JournalState,
    schedules: ScheduleCache,
    /// The rules this instance may claim: the partitions whose lease it
    /// holds (seed 003), or all of them on SQLite.
    ownership: Ownership,
}

impl Actor for PlanActor {
    type Msg = PlanMsg;
    type State = PlanState;
    type Arguments = PlanArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<PlanMsg>,
        args: PlanArgs,
    ) -> Result<PlanState, ActorProcessingErr> {
        let path = args.config.plan_file.clone();
        let loaded = tokio::task::spawn_blocking(move || read_plan_file(&path)).await?;
        let mut journal_seq = 0;
        let mut plan = match loaded {
            Ok(Some(snapshot)) => {
                journal_seq = snapshot.journal_seq;
                info!(
                    workflows = snapshot.workflows.len(),
                    saved_at = %millis_to_utc(snapshot.saved_at).to_rfc3339(),
                    "📂 Loaded execution plan from {}",
                    args.config.plan_file.display()
                );
                ExecutionPlan::from_snapshot(snapshot)
            }
            Ok(None) => {
                info!(
                    "No plan file at {}; the database will fill the plan",
                    args.config.plan_file.display()
                );
                ExecutionPlan::new()
            }
            Err(e) => {
                warn!("⚠️ Ignoring the plan file: {e}; the database will rebuild the plan");
                ExecutionPlan::new()
            }
        };
        // Nothing can be running in an actor that has just started: any flag
        // set is left over from a crash (seed 000 crash recovery).
        let reset = plan.reset_running_flags();
        info!("🔄 Reset {reset} workflow(s) is_currently_running flag");
        // Ask for the database's view now rather than at the next tick.
        if let Some(refresher) = args.directory.refresher() {
            let _ = refresher.cast(RefresherMsg::RefreshNow);
        }
        let mut state = PlanState {
            plan,
            config: args.config,
            clock: args.clock,
            directory: args.directory,
            merged_once: false,
            dirty: false,
            flush_scheduled: false,
            last_enqueued_at: None,
            journal: JournalState {
                // Above anything an earlier incarnation of this actor may
                // still have queued at the writer (it wrote at most once
                // per PLAN_MIN_WRITE_INTERVAL, far less than 1,000 times a
                // millisecond), so the writer never takes its stale
                // journal writes for newer than this actor's snapshot.
                seq: journal_seq.max(args.clock.now_ms().max(0) as u64 * 1_000),
                ..JournalState::default()
            },
            schedules: ScheduleCache::default(),
            ownership: args.ownership,
        };
        publish_gauges(&state.plan.stats(state.clock.now_ms()));
        state.publish_readiness(state.clock.now_ms());
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<PlanMsg>,
        message: PlanMsg,
        state: &mut PlanState,
    ) -> Result<(), ActorProcessingErr> {
        let now = state.clock.now_ms();
        match message {
            PlanMsg::Ready(reply) => {
                let _ = reply.send(state.ready_now(now));
            }
            PlanMsg::ReadyJobs { limit, reply } => {
                let zone = state.config.default_timezone;
                // At least one, so an empty answer still tells a busy plan
                // from an idle one (and picks the next wake accordingly).
                let ready = state.ready_up_to(now, limit.max(1));
                let lead = state.config.master_claim_lead.as_millis() as Millis;
                let ahead = ready_within_lead(
                    &state.plan,
                    now,
                    lead,
                    limit
                        .min(state.config.max_runs_per_tick)
                        .saturating_sub(ready.len()),
                    zone,
                    &state.ownership,
                );
                let jobs = ready
                    .iter()
                    .take(limit)
                    .chain(ahead.iter().map(|(id, _)| id))
                    .filter_map(|id| job_spec(&state.plan, id, zone, &mut state.schedules))
                    .collect();
                let next_wake = if ready.is_empty() {
                    next_wake(&state.plan, now, zone, &state.ownership)
                } else {
                    Some(next_wake_while_busy(&state.plan, now, &state.ownership))
                };
                let _ = reply.send(ReadyJobs {
                    jobs,
                    starts_at: ahead.into_iter().collect(),
                    next_wake: next_wake_with_lead(
                        next_wake,
                        &state.plan,
                        now,
                        lead,
                        &state.ownership,
                    ),
                });
            }
            PlanMsg::Ownership(ownership) => {
                if ownership != state.ownership {
                    let gained = match (&state.ownership, &ownership) {
                        (
                            Ownership::Partitions { held: before, .. },
                            Ownership::Partitions { held, .. },
                        ) => held.iter().any(|p| !before.contains(p)),
                        _ => true,
                    };
                    state.ownership = ownership;
                    state.publish_readiness(now);
                    if gained {
                        state.notify_master();
                    }
                }
            }
            PlanMsg::RunEnded(id) => {
                if state.plan.run_ended_here(&id) {
                    state.mark_dirty(&myself);
                    state.notify_master();
                }
            }
            PlanMsg::Claimed(ids) => {
                for id in &ids {
                    state.plan.mark_running(id, now);
                }
                state.mark_dirty(&myself);
            }
            PlanMsg::AddOutbox(entry) => {
                warn!(
                    branch_rule_id = %entry.fence.branch_rule_id,
                    execution_id = %entry.fence.execution_id,
                    "📮 Post-process kept in the outbox until the database is back"
                );
                state.plan.add_to_outbox(*entry);
                state.mark_dirty(&myself);
            }
            PlanMsg::Outbox(reply) => {
                let _ = reply.send(state.plan.outbox().to_vec());
            }
            PlanMsg::OutboxDelivered { execution_id, row } => {
                if state.plan.remove_from_outbox(&execution_id) {
                    if let Some(row) = row {
                        info!(branch_rule_id = %row.id, %execution_id, "📬 Outbox entry delivered");
                        state.plan.apply_post_process(row, now);
                    }
                    state.mark_dirty(&myself);
                    state.notify_master();
                }
            }
            PlanMsg::MarkRunning(id, reply) => {
                let known = state.plan.mark_running(&id, now);
                if known {
                    state.mark_dirty(&myself);
                }
                let _ = reply.send(known);
            }
            PlanMsg::PostProcessed(row) => {
                let id = row.id;
                // A misfire skip leaves a stale lock where it found it: the
                // plan keeps offering the rule, as it did before the skip.
                let mut rows = [row];
                let freed = state.free_stale_locks(&mut rows, now, false);
                log_stale_locks(&freed, now, state.config.schedule_lock_timeout);
                let [row] = rows;
                state.plan.apply_post_process(row, now);
                info!(branch_rule_id = %id, "✅ Updated execution plan: workflow {id}");
                state.mark_dirty(&myself);
                state.notify_master();
            }
            PlanMsg::FinishedLocally {
                id,
                next_run_time,
                retry,
            } => {
                let before = state
                    .plan
                    .get(&id)
                    .and_then(|w| w.branch_rule.next_run_time);
                state.plan.update(&id, |w| {
                    w.branch_rule.next_run_time = next_run_time;
                    w.locally_updated_at = Some(now);
                    w.branch_rule.is_currently_running = false;
                    w.running_here = false;
                    match retry {
                        RetryUpdate::Keep => {}
                        RetryUpdate::Clear => {
                            w.branch_rule.retry_of = None;
                            w.branch_rule.failed_attempts = 0;
                        }
                        RetryUpdate::Pending {
                            of,
                            failed_attempts,
                        } => {
                            w.branch_rule.retry_of = Some(of);
                            w.branch_rule.failed_attempts = failed_attempts;
                        }
                    }
                });
                info!(
                    branch_rule_id = %id,
                    "🔄 Updated workflow {id}: next_run_time {} → {} (computed locally)",
                    format_time(before),
                    format_time(next_run_time)
                );
                state.mark_dirty(&myself);
            }
            PlanMsg::Merge(load, reply)
                if !state.merged_once && load.data.scope != PlanScope::Full =>
            {
                // Rule 5 needs the whole database: a delta cannot be the
                // first refresh of a (re)started plan.
                let report = MergeReport {
                    full_refresh_needed: true,
                    ..MergeReport::default()
                };
                let _ = reply.send(report);
            }
            PlanMsg::Merge(load, reply) => {
                let mut load = *load;
                let change = state.plan.quarantine_bad_rows(&mut load, now);
                log_quarantine(&change);
                let first_read = !state.merged_once;
                let freed = state.free_stale_locks(&mut load.data.branch_rules, now, first_read);
                log_stale_locks(&freed, now, state.config.schedule_lock_timeout);
                let large = load.data.scope == PlanScope::Full
                    || load.data.branch_rules.len() >= LARGE_READ_ROWS;
                let (report, turned_stale) = state.merge(load.data, now);
                if large {
                    // The rows read are dropped now: for a whole table of
                    // a million rules, gigabytes the allocator would keep.
                    release_free_heap();
                }
                if !report.is_empty() || report.preserved > 0 || !turned_stale.is_empty() {
                    state.mark_dirty(&myself);
                }
                // A row released from the quarantine, or a branch or rule
                // switched on, can make due rules ready without a change
                // of their own rows.
                let released = report.released > 0 || !change.released.is_empty();
                if !report.is_empty() || released || !turned_stale.is_empty() {
                    state.notify_master();
                }
                let _ = reply.send(report);
            }
            PlanMsg::ScheduleOf { id, reply } => {
                let zone = state.config.default_timezone;
                let schedule = schedule_of(&state.plan, &id, zone, &mut state.schedules);
                let _ = reply.send(schedule);
            }
            PlanMsg::Quarantine(reply) => {
                let _ = reply.send(state.quarantine_report(now));
            }
            PlanMsg::ResetRunningFlags(reply) => {
                let reset = state.plan.reset_running_flags();
                info!("🔄 Reset {reset} workflow(s) is_currently_running flag");
                if reset > 0 {
                    state.mark_dirty(&myself);
                }
                let _ = reply.send(reset);
            }
            PlanMsg::Snapshot(reply) => {
                let _ = reply.send(state.plan.snapshot(now));
            }
            PlanMsg::SnapshotToWriter(reply) => {
                let _ = reply.send(state.send_snapshot(now));
            }
            PlanMsg::Stats(reply) => {
                let _ = reply.send(state.plan.stats(now));
            }
            PlanMsg::Readiness(reply) => {
                let _ = reply.send(state.publish_readiness(now));
            }
            PlanMsg::Browse {
                query,
                owners,
                reply,
            } => {
                let zone = state.config.default_timezone;
                let _ = reply.send(browse(&state.plan, now, zone, owners.as_ref(), &query));
            }
            PlanMsg::FlushToWriter => state.flush_to_writer(&myself, now),
            PlanMsg::InjectPanic(reason) => panic!("{reason}"),
        }
        Ok(())
    }
}

impl PlanState {
    /// [`ExecutionPlan::free_stale_locks`] with this instance's id and
    /// SCHEDULE_LOCK_TIMEOUT_SECONDS.
    fn free_stale_locks(
        &mut self,
        rows: &mut [crate::model::BranchRule],
        now: Millis,
        first_read: bool,
    ) -> Vec<StaleLock> {
        let config = &self.config;
        self.plan.free_stale_locks(
            rows,
            &config.instance_id,
            now,
            config.schedule_lock_timeout.as_millis() as Millis,
            first_read,
        )
    }

    /// [`ExecutionPlan::free_locks_turned_stale`] with this instance's id
    /// and SCHEDULE_LOCK_TIMEOUT_SECONDS.
    fn free_locks_turned_stale(&mut self, now: Millis) -> Vec<StaleLock> {
        let config = &self.config;
        self.plan.free_locks_turned_stale(
            &config.instance_id,
            now,
            config.schedule_lock_timeout.as_millis() as Millis,
        )
    }

    /// This instance's ready set, at most MAX_RUNS_PER_TICK, in due order.
    fn ready_now(&mut self, now: Millis) -> Vec<uuid::Uuid> {
        self.ready_up_to(now, usize::MAX)
    }

    /// The first `limit` ready rules, never more than MAX_RUNS_PER_TICK.
    /// The walk stops there: a fetch in a burst of 100,000 due rules costs
    /// what the master can claim, not the tick's cap of ready checks (6% of
    /// a 10-worker drain's samples went to checks whose rules were dropped).
    fn ready_up_to(&mut self, now: Millis, limit: usize) -> Vec<uuid::Uuid> {
        let config = &self.config;
        take_ready_owned(
            &mut self.plan,
            now,
            limit.min(config.max_runs_per_tick),
            config.default_timezone,
            &self.ownership,
        )
    }

    /// Merges a read, then frees the locks that turned stale since they
    /// were read (returned, already logged): the gauges count them freed.
    fn merge(
        &mut self,
        data: crate::model::PlanData,
        now: Millis,
    ) -> (MergeReport, Vec<StaleLock>) {
        let options = MergeOptions {
            first_refresh: !self.merged_once,
            recent_window: self.config.plan_refresh_interval,
            max_age: self.config.plan_workflow_max_age,
        };
        let report = merge(&mut self.plan, data, now, options);
        self.merged_once = true;
        let turned_stale = self.free_locks_turned_stale(now);
        log_stale_locks(&turned_stale, now, self.config.schedule_lock_timeout);
        for change in &report.next_run_changes {
            debug!(
                branch_rule_id = %change.id,
                "🔄 Updated workflow {}: next_run_time {} → {}",
                change.id,
                format_time(change.from),
                format_time(change.to)
            );
        }
        let stats = self.plan.stats(now);
        publish_gauges(&stats);
        self.publish_readiness(now);
        (report, turned_stale)
    }

    /// The ready and missed-window gauges, at start and after each merge
    /// (the master's fetches also set the ready gauge). Both walk only the
    /// due part of the index.
    fn publish_readiness(&mut self, now: Millis) -> Readiness {
        let readiness = self.readiness(now);
        metrics::gauge!(m::PLAN_READY_WORKFLOWS).set(readiness.ready as f64);
        metrics::gauge!(m::PLAN_MISSED_WINDOW_WORKFLOWS).set(readiness.missed_window as f64);
        readiness
    }

    fn readiness(&mut self, now: Millis) -> Readiness {
        let config = &self.config;
        // The count parks what waits for its window, so the missed-window
        // walk after it passes over those too.
        let ready = take_ready_owned(
            &mut self.plan,
            now,
            usize::MAX,
            config.default_timezone,
            &self.ownership,
        )
        .len();
        Readiness {
            ready,
            missed_window: missed_windows(
                &self.plan,
                now,
                config.default_timezone,
                &self.ownership,
            ),
        }
    }

    /// The quarantined rows and the held workflows with their reasons.
    fn quarantine_report(&self, now: Millis) -> QuarantineReport {
        let zone = self.config.default_timezone;
        let mut held: Vec<HeldWorkflow> = self
            .plan
            .workflows()
            .filter_map(|w| match check_ready(&self.plan, w, now, zone) {
                Err(reason) if reason.is_held() => Some(HeldWorkflow {
                    id: w.id(),
                    reason: reason.to_string(),
                }),
                _ => None,
            })
            .collect();
        held.sort_by_key(|h| h.id);
        QuarantineReport {
            rows: self.plan.quarantine().rows().cloned().collect(),
            held,
        }
    }

    /// Tells the master to look again: something may have become ready.
    fn notify_master(&self) {
        if let Some(master) = self.directory.master() {
            let _ = master.cast(MasterMsg::PlanChanged);
        }
    }

    /// Debounces snapshots: at most one goes to the writer per
    /// PLAN_MIN_WRITE_INTERVAL_SECONDS, however busy the plan is.
    fn mark_dirty(&mut self, myself: &ActorRef<PlanMsg>) {
        self.dirty = true;
        if self.flush_scheduled {
            return;
        }
        self.flush_scheduled = true;
        let interval = self.config.plan_min_write_interval.as_millis() as Millis;
        let now = self.clock.now_ms();
        let wait = self
            .last_enqueued_at
            .map_or(0, |at| (at + interval - now).max(0));
        myself.send_after(Duration::from_millis(wait as u64), || {
            PlanMsg::FlushToWriter
        });
    }

    fn flush_to_writer(&mut self, myself: &ActorRef<PlanMsg>, now: Millis) {
        self.flush_scheduled = false;
        if !self.dirty {
            return;
        }
        let Some(writer) = self.directory.writer() else {
            // The writer is being restarted; try again after the interval.
            self.last_enqueued_at = Some(now);
            self.mark_dirty(myself);
            return;
        };
        let sent = if self.journal.wants_snapshot(writer.get_id(), &self.plan) {
            self.send_snapshot(now)
        } else {
            self.journal.seq += 1;
            let delta = self.plan.take_delta(self.journal.seq, now);
            let changed = delta.len();
            let sent = delta.is_empty() || writer.cast(WriterMsg::Append(delta)).is_ok();
            if sent {
                self.journal.changes_since_snapshot += changed;
                info!(changed, "💾 Queued execution plan write");
            } else {
                // The changes were taken but never reached a writer: only
                // a whole snapshot can make up for them.
                self.journal.writer = None;
            }
            sent
        };
        if sent {
            self.dirty = false;
        }
        self.last_enqueued_at = Some(now);
        if self.dirty {
            self.mark_dirty(myself);
        }
    }

    /// Hands the whole plan to the writer: it replaces the plan file, and
    /// the journal starts again. False when there is no writer to take it.
    fn send_snapshot(&mut self, now: Millis) -> bool {
        let Some(writer) = self.directory.writer() else {
            return false;
        };
        self.journal.seq += 1;
        let mut snapshot = self.plan.snapshot(now);
        snapshot.journal_seq = self.journal.seq;
        if writer.cast(WriterMsg::Enqueue(Arc::new(snapshot))).is_err() {
            return false;
        }
        self.plan.forget_changes();
        self.journal.changes_since_snapshot = 0;
        self.journal.writer = Some(writer.get_id());
        self.dirty = false;
        info!("💾 Queued execution plan write (whole plan)");
        true
    }
}

/// Where the plan file's journal stands, from the plan actor's side.
#[derive(Debug, Default)]
struct JournalState {
    /// The sequence number of the last write handed to the writer.
    seq: u64,
    /// Workflow states journaled since the last snapshot.
    changes_since_snapshot: usize,
    /// The writer the last snapshot went to. A journal only extends the
    /// snapshot its own writer wrote: after a start, a writer restart or a
    /// lost write, the next write is a whole snapshot.
    writer: Option<ractor::ActorId>,
}

/// A read of this many branch rules or more (a full refresh, or a bulk
/// change such as a million rules inserted at once) is handed back to the
/// OS once merged.
const LARGE_READ_ROWS: usize = 10_000;

/// Journal writes before the journal is compacted into a snapshot, at
/// least; above that, as many as the plan has workflows, so compaction
/// costs at most as much again as the journal did.
const MIN_CHANGES_PER_SNAPSHOT: usize = 1_000;

impl JournalState {
    fn wants_snapshot(&self, writer: ractor::ActorId, plan: &ExecutionPlan) -> bool {
        self.writer != Some(writer)
            || plan.changes().tables
            || self.changes_since_snapshot >= plan.len().max(MIN_CHANGES_PER_SNAPSHOT)
    }
}

fn format_time(ms: Option<Millis>) -> String {
    ms.map_or_else(|| "none".to_string(), |ms| millis_to_utc(ms).to_rfc3339())
}

/// One WARN per lock when the plan stops holding its rule as running (not
/// one per refresh), counted.
fn log_stale_locks(freed: &[StaleLock], now: Millis, timeout: Duration) {
    for lock in freed {
        metrics::counter!(m::STALE_LOCKS_TOTAL).increment(1);
        let age = match lock.lock_time {
            None => "has no lock_time".to_string(),
            Some(at) if at > now => format!(
                "is stamped {} s ahead ({})",
                (at - now) / 1_000,
                format_time(Some(at))
            ),
            Some(at) => format!(
                "was last renewed {} s ago ({})",
                (now - at) / 1_000,
                format_time(Some(at))
            ),
        };
        warn!(
            branch_rule_id = %lock.branch_rule_id,
            holder = %lock.holder,
            "🔓 Branch rule {}: the lock of {} {age}, beyond SCHEDULE_LOCK_TIMEOUT_SECONDS ({} s); \
             stale, so the rule is offered again and its claim takes the lock over",
            lock.branch_rule_id,
            lock.holder,
            timeout.as_secs()
        );
    }
}

/// One WARN per row when it enters the quarantine (not one per refresh),
/// counted by table and reason; one INFO when it leaves.
fn log_quarantine(change: &QuarantineChange) {
    for row in &change.entered {
        metrics::counter!(
            m::PLAN_ROWS_REJECTED_TOTAL,
            "table" => quarantine_table_label(&row.table),
            "reason" => row.reason.as_str()
        )
        .increment(1);
        warn!(
            table = %row.table,
            id = %row.id,
            field = %row.field,
            reason = row.reason.as_str(),
            "🚫 Quarantined {} row {}: {}: {}; kept out of the plan until it is fixed",
            row.table,
            row.id,
            row.field,
            row.message
        );
    }
    for row in &change.released {
        info!(
            table = %row.table,
            id = %row.id,
            "✅ {} row {} is no longer quarantined",
            row.table,
            row.id
        );
    }
}

/// Table names are a bounded set; anything else (never expected) is
/// counted as `other` so a label cannot grow without bound.
fn quarantine_table_label(table: &str) -> &'static str {
    m::PLAN_TABLES
        .iter()
        .find(|known| **known == table)
        .copied()
        .unwrap_or("other")
}

fn publish_gauges(stats: &PlanStats) {
    for (state, count) in [
        ("active", stats.active),
        ("held", stats.held),
        ("inactive", stats.inactive),
        ("running", stats.running),
        ("removed", stats.removed),
    ] {
        metrics::gauge!(m::PLAN_WORKFLOWS, "state" => state).set(count as f64);
    }
}
