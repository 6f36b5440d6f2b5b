//! `ruled simulate` (issue 13): the master's and the post-process's
//! decisions, driven on seed 003's logical clock instead of the wall clock.
//!
//! The clock is `tick`, `resolution` (ms per tick) and `epoch` (the
//! simulation's start): time is `epoch + tick · resolution`, and nothing
//! sleeps. The loop jumps from one tick where something can happen to the
//! next (a due time, a window opening, a run's end, a worker freed), so a
//! quiet week costs what its events cost, not 604,800 ticks.
//!
//! Every decision is the production one: the ready filter ([`ready_owned`]:
//! windows, DST, ordering by (due time, id), the per-tick cap, partitions),
//! [`decide_due`] (misfire, catch-up window, start offsets) and
//! [`decide_finish`] (retries, overlap). Actions are replaced by a seeded
//! model of durations and failures: a hash of (seed, rule, occurrence,
//! attempt), so the outcome of a run does not depend on what ran before
//! it, and two runs, hosts or host time zones print the same bytes.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono_tz::Tz;
use serde::Serialize;
use uuid::Uuid;

use super::decide::{Ending, RunEnd, decide_due, decide_finish, overlap_due};
use super::{ExecutionPlan, NotReady, check_ready, job_spec, next_wake, ready_owned};
use crate::clock::millis_to_utc;
use crate::cluster::{Ownership, partition_of, stable_hash};
use crate::lifecycle::RetryUpdate;
use crate::model::Millis;
use crate::schedule::{Overlap, ScheduleCache, SkipReason};

/// What to simulate and with which service settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Simulation {
    /// The epoch (tick 0) and the end (exclusive), UTC ms.
    pub from: Millis,
    pub to: Millis,
    /// Milliseconds per tick (seed 003's `resolution`, default 1000).
    pub resolution_ms: Millis,
    /// Windows `[start, end)` while ruled is down: nothing is fetched, and
    /// a run going when it stops is lost (it runs again as a new attempt).
    pub down: Vec<(Millis, Millis)>,
    /// The share of runs that fail, 0 to 1.
    pub fail_rate: f64,
    /// How long every run takes.
    pub duration_ms: Millis,
    pub seed: u64,
    pub workers: usize,
    /// WORKER_COOLDOWN_SECONDS: a worker slot rests this long after a job.
    pub cooldown_ms: Millis,
    pub max_runs_per_tick: usize,
    pub default_zone: Tz,
    /// PARTITION_COUNT, to show each rule's partition (seed 003).
    pub partition_count: u32,
    /// Past this many ticks or decisions the simulation stops with an error
    /// (the API's bound; the CLI sets none).
    pub max_ticks: Option<u64>,
    pub max_decisions: Option<usize>,
    /// When the plan's state was read (the database's rules or the live
    /// plan): a simulation starting later assumes ruled ran what fell due
    /// in between. `None` (the demo rules, built for `from`) shifts nothing.
    pub plan_read_at: Option<Millis>,
}

impl Simulation {
    pub fn new(from: Millis, to: Millis) -> Simulation {
        Simulation {
            from,
            to,
            resolution_ms: 1000,
            down: Vec::new(),
            fail_rate: 0.0,
            duration_ms: 200,
            seed: 0,
            workers: 10,
            cooldown_ms: 0,
            max_runs_per_tick: 500,
            default_zone: chrono_tz::Asia::Riyadh,
            partition_count: 1,
            max_ticks: None,
            max_decisions: None,
            plan_read_at: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimulationError {
    #[error("to must be after from")]
    EmptyRange,
    #[error("resolution must be at least 1 ms")]
    Resolution,
    #[error("fail_rate must be from 0 to 1")]
    FailRate,
    #[error("the simulation spans {ticks} ticks, more than the limit of {limit}")]
    TooManyTicks { ticks: u64, limit: u64 },
    #[error("the simulation makes more than {limit} decisions; shorten the range")]
    TooManyDecisions { limit: usize },
}

/// One decision, as printed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub tick: u64,
    /// UTC ms of the tick.
    pub at: Millis,
    pub branch_rule_id: Uuid,
    pub partition: u32,
    /// The branch's zone, for the local time.
    pub zone: String,
    /// The occurrence decided about (its due time).
    pub occurrence: Millis,
    pub attempt: i64,
    #[serde(flatten)]
    pub kind: DecisionKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum DecisionKind {
    /// Claimed and started.
    Run,
    /// Recorded skipped.
    Skipped { reason: SkipReason, detail: String },
    /// Due, but the window is closed; runs once it opens.
    HeldByWindow { opens: Millis },
    /// Fell due while the previous run ran; runs right after it.
    Buffered,
    /// The run failed; this attempt runs at `retry_at`.
    Retry { retry_at: Millis },
    /// The run ended.
    Finished { status: String },
    /// Ruled stopped while it ran: recorded worker_lost, runs again.
    Lost,
}

impl DecisionKind {
    fn label(&self) -> String {
        match self {
            DecisionKind::Run => "run".into(),
            DecisionKind::Skipped { reason, detail } => format!("skipped {reason}: {detail}"),
            DecisionKind::HeldByWindow { opens } => {
                format!("held by window until {}", utc_text(*opens))
            }
            DecisionKind::Buffered => "buffered".into(),
            DecisionKind::Retry { retry_at } => format!("retry at {}", utc_text(*retry_at)),
            DecisionKind::Finished { status } => status.clone(),
            DecisionKind::Lost => "lost (worker_lost), runs again".into(),
        }
    }
}

/// The whole outcome: the decisions in order, and totals.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    pub decisions: Vec<Decision>,
    pub runs: usize,
    pub skipped: usize,
    pub retries: usize,
    /// Ticks the clock stopped at (where something could happen).
    pub ticks_visited: usize,
}

struct Running {
    occurrence: Millis,
    claimed_at: Millis,
    ends_at: Millis,
    attempt: i64,
    failed_attempts: i32,
    outcome_failed: bool,
    /// `cancel_running`: when the next occurrence falls due.
    cancel_at: Option<Millis>,
}

/// Runs the simulation over `plan` (which it changes as the service
/// would change its own).
pub fn simulate(mut plan: ExecutionPlan, sim: &Simulation) -> Result<Report, SimulationError> {
    if sim.to <= sim.from {
        return Err(SimulationError::EmptyRange);
    }
    if sim.resolution_ms < 1 {
        return Err(SimulationError::Resolution);
    }
    if !(0.0..=1.0).contains(&sim.fail_rate) {
        return Err(SimulationError::FailRate);
    }
    let ticks = ((sim.to - sim.from) as u64).div_ceil(sim.resolution_ms as u64);
    if let Some(limit) = sim.max_ticks
        && ticks > limit
    {
        return Err(SimulationError::TooManyTicks { ticks, limit });
    }
    plan.reset_running_flags();
    let mut state = State {
        sim,
        report: Report::default(),
        running: BTreeMap::new(),
        attempts: HashMap::new(),
        held: BTreeSet::new(),
        free_workers: sim.workers.max(1),
        resting: BTreeMap::new(),
        schedules: ScheduleCache::default(),
        zones: HashMap::new(),
    };
    state.start_behind_rules_at_from(&mut plan);
    let mut now = sim.from;
    while now < sim.to {
        state.report.ticks_visited += 1;
        state.wake_workers(now);
        if let Some(&(_, end)) = sim
            .down
            .iter()
            .find(|(start, end)| *start <= now && now < *end)
        {
            state.lose_running(&mut plan, now);
            now = state.on_tick(end);
            continue;
        }
        state.finish_due(&mut plan, now);
        state.start_ready(&mut plan, now)?;
        let Some(next) = state.next_event(&plan, now) else {
            break;
        };
        now = state.on_tick(next.max(now + 1));
    }
    Ok(state.report)
}

struct State<'s> {
    sim: &'s Simulation,
    report: Report,
    /// Runs going, by (end, rule).
    running: BTreeMap<Uuid, Running>,
    /// The highest attempt of each (rule, occurrence).
    attempts: HashMap<(Uuid, Millis), i64>,
    /// (rule, occurrence) already reported held by its window.
    held: BTreeSet<(Uuid, Millis)>,
    free_workers: usize,
    /// Worker slots resting after a job, by when they are free again.
    resting: BTreeMap<Millis, usize>,
    schedules: ScheduleCache,
    zones: HashMap<Uuid, Tz>,
}

impl State<'_> {
    /// The first tick at or after `at`.
    fn on_tick(&self, at: Millis) -> Millis {
        let res = self.sim.resolution_ms;
        let offset = (at - self.sim.from).max(0);
        self.sim.from + (offset + res - 1) / res * res
    }

    /// A simulation starting after the plan's state was read assumes
    /// ruled was up in between: a stored next_run_time behind `from`
    /// (rules read now, `from` tomorrow) made every occurrence in between a
    /// misfire at tick 0, for time the simulation does not cover. Such a
    /// rule starts at its first occurrence from `from` on; `down` is how a
    /// simulation says ruled was away. A pending retry keeps its time, and
    /// a simulation starting when the state was read (or before) keeps
    /// every stored time: what is overdue then is real pending work.
    fn start_behind_rules_at_from(&mut self, plan: &mut ExecutionPlan) {
        let from = self.sim.from;
        if self.sim.plan_read_at.is_none_or(|read| from <= read) {
            return;
        }
        let behind: Vec<Uuid> = plan
            .workflows()
            .filter(|w| {
                let row = &w.branch_rule;
                row.retry_of.is_none() && row.next_run_time.is_some_and(|at| at < from)
            })
            .map(|w| w.id())
            .collect();
        for id in behind {
            let Some(spec) = job_spec(plan, &id, self.sim.default_zone, &mut self.schedules) else {
                continue;
            };
            let Some(next) = spec.cadence().and_then(|c| c.next_after(from - 1)) else {
                continue;
            };
            plan.update(&id, |w| w.branch_rule.next_run_time = Some(next));
        }
    }

    fn tick_of(&self, at: Millis) -> u64 {
        ((at - self.sim.from) / self.sim.resolution_ms) as u64
    }

    fn zone_of(&mut self, plan: &ExecutionPlan, id: Uuid) -> Tz {
        let default_zone = self.sim.default_zone;
        *self.zones.entry(id).or_insert_with(|| {
            plan.get(&id)
                .and_then(|w| plan.zone_of(w, default_zone).ok())
                .unwrap_or(default_zone)
        })
    }

    fn push(
        &mut self,
        plan: &ExecutionPlan,
        at: Millis,
        id: Uuid,
        occurrence: Millis,
        attempt: i64,
        kind: DecisionKind,
    ) {
        match &kind {
            DecisionKind::Run => self.report.runs += 1,
            DecisionKind::Skipped { .. } => self.report.skipped += 1,
            DecisionKind::Retry { .. } => self.report.retries += 1,
            _ => {}
        }
        let zone = self.zone_of(plan, id);
        self.report.decisions.push(Decision {
            tick: self.tick_of(at),
            at,
            branch_rule_id: id,
            partition: partition_of(&id, self.sim.partition_count),
            zone: zone.name().to_string(),
            occurrence,
            attempt,
            kind,
        });
    }

    fn wake_workers(&mut self, now: Millis) {
        let rested: Vec<Millis> = self.resting.range(..=now).map(|(at, _)| *at).collect();
        for at in rested {
            self.free_workers += self.resting.remove(&at).unwrap_or(0);
        }
    }

    fn release_worker(&mut self, at: Millis) {
        if self.sim.cooldown_ms == 0 {
            self.free_workers += 1;
        } else {
            *self.resting.entry(at + self.sim.cooldown_ms).or_default() += 1;
        }
    }

    /// Ruled stops: every run going is lost; its occurrence stays due and
    /// runs again as the next attempt, without using the retry budget.
    fn lose_running(&mut self, plan: &mut ExecutionPlan, now: Millis) {
        let lost: Vec<(Uuid, Running)> = std::mem::take(&mut self.running).into_iter().collect();
        for (id, run) in lost {
            plan.update(&id, |w| {
                let row = &mut w.branch_rule;
                row.is_currently_running = false;
                w.running_here = false;
                // As recovery marks it (`Store::recover_owner`): owed its run.
                if row.retry_of.is_none() && row.next_run_time == Some(run.occurrence) {
                    row.retry_of = Some(run.occurrence);
                }
            });
            self.push(
                plan,
                now,
                id,
                run.occurrence,
                run.attempt,
                DecisionKind::Lost,
            );
            self.release_worker(now);
        }
    }

    /// Runs that end by `now` (or are cancelled by an overlap), in (end,
    /// rule) order.
    fn finish_due(&mut self, plan: &mut ExecutionPlan, now: Millis) {
        let mut ending: Vec<(Millis, Uuid, Ending)> = self
            .running
            .iter()
            .filter_map(|(id, run)| match run.cancel_at {
                Some(cancel) if cancel < run.ends_at && cancel <= now => {
                    Some((cancel, *id, Ending::CancelledByOverlap))
                }
                _ if run.ends_at <= now => Some((
                    run.ends_at,
                    *id,
                    if run.outcome_failed {
                        Ending::Failed
                    } else {
                        Ending::Completed
                    },
                )),
                _ => None,
            })
            .collect();
        ending.sort_by_key(|(at, id, _)| (*at, *id));
        for (ended_at, id, how) in ending {
            let run = self.running.remove(&id).expect("listed above");
            self.release_worker(ended_at);
            let Some(spec) = job_spec(plan, &id, self.sim.default_zone, &mut self.schedules) else {
                continue;
            };
            let cadence = spec.cadence();
            let end = RunEnd {
                branch_rule_id: id,
                occurrence: run.occurrence,
                failed_attempts: run.failed_attempts,
                claimed_at: run.claimed_at,
                finished_at: ended_at,
                ending: how,
            };
            let decision = decide_finish(cadence.as_ref(), &spec.policy, &end);
            let status = match how {
                Ending::Completed => "completed",
                Ending::Failed => "failed",
                Ending::Cancelled | Ending::CancelledByOverlap => "cancelled",
            };
            self.push(
                plan,
                ended_at,
                id,
                run.occurrence,
                run.attempt,
                DecisionKind::Finished {
                    status: status.into(),
                },
            );
            self.push_skipped(plan, ended_at, id, &decision.skipped);
            if let Some((retry_at, _)) = decision.retry_at() {
                self.push(
                    plan,
                    ended_at,
                    id,
                    run.occurrence,
                    run.attempt + 1,
                    DecisionKind::Retry { retry_at },
                );
            } else if let Some(next) = decision.next_run_time
                && next <= ended_at
                && (how == Ending::CancelledByOverlap
                    || cadence.is_some_and(|c| c.policy.overlap == Overlap::BufferOne))
                && next > run.claimed_at
            {
                self.push(plan, ended_at, id, next, 0, DecisionKind::Buffered);
            }
            plan.update(&id, |w| {
                let row = &mut w.branch_rule;
                row.is_currently_running = false;
                w.running_here = false;
                row.last_run_time = Some(ended_at);
                if let Some(next) = decision.next_run_time {
                    row.next_run_time = Some(next);
                }
                match decision.retry {
                    RetryUpdate::Keep => {}
                    RetryUpdate::Clear => {
                        row.retry_of = None;
                        row.failed_attempts = 0;
                    }
                    RetryUpdate::Pending {
                        of,
                        failed_attempts,
                    } => {
                        row.retry_of = Some(of);
                        row.failed_attempts = failed_attempts;
                    }
                }
            });
        }
    }

    /// Records skipped occurrences as the store does: each its own attempt.
    fn push_skipped(
        &mut self,
        plan: &ExecutionPlan,
        at: Millis,
        id: Uuid,
        skipped: &[crate::lifecycle::SkippedOccurrence],
    ) {
        for occurrence in skipped {
            let attempt = self.next_attempt(id, occurrence.scheduled_for);
            self.push(
                plan,
                at,
                id,
                occurrence.scheduled_for,
                attempt,
                DecisionKind::Skipped {
                    reason: occurrence.reason,
                    detail: occurrence.detail.clone(),
                },
            );
        }
    }

    fn next_attempt(&mut self, id: Uuid, occurrence: Millis) -> i64 {
        let attempt = self.attempts.entry((id, occurrence)).or_insert(0);
        *attempt += 1;
        *attempt
    }

    /// The master's fetch: the ready set in (due, id) order, each sorted by
    /// the misfire policy, claimed while workers are free.
    fn start_ready(
        &mut self,
        plan: &mut ExecutionPlan,
        now: Millis,
    ) -> Result<(), SimulationError> {
        let zone = self.sim.default_zone;
        self.note_held_by_window(plan, now);
        loop {
            if self.free_workers == 0 {
                return Ok(());
            }
            let cap = self.sim.max_runs_per_tick.min(self.free_workers);
            let ready = ready_owned(plan, now, cap, zone, &Ownership::All);
            if ready.is_empty() {
                return Ok(());
            }
            for id in ready {
                if let Some(limit) = self.sim.max_decisions
                    && self.report.decisions.len() > limit
                {
                    return Err(SimulationError::TooManyDecisions { limit });
                }
                self.start_one(plan, id, now);
            }
        }
    }

    fn start_one(&mut self, plan: &mut ExecutionPlan, id: Uuid, now: Millis) {
        let Some(spec) = job_spec(plan, &id, self.sim.default_zone, &mut self.schedules) else {
            return;
        };
        let row = &spec.branch_rule;
        let Some(due) = row.next_run_time else {
            return;
        };
        let (retry_of, failed_attempts) = (row.retry_of, row.failed_attempts);
        let decision = match spec.cadence() {
            Some(cadence) => decide_due(&cadence, due, retry_of, now),
            None => super::DueDecision {
                skipped: Vec::new(),
                run: Some(due),
                next_run_time: Some(due),
            },
        };
        self.push_skipped(plan, now, id, &decision.skipped);
        let Some(run) = decision.run else {
            plan.update(&id, |w| {
                w.branch_rule.next_run_time = decision.next_run_time
            });
            return;
        };
        let occurrence = retry_of.unwrap_or(run);
        let attempt = self.next_attempt(id, occurrence);
        let duration = self.sim.duration_ms.max(1);
        let outcome_failed = self.fails(id, occurrence, attempt);
        let cancel_at = spec
            .cadence()
            .filter(|c| c.policy.overlap == Overlap::CancelRunning)
            .and_then(|c| overlap_due(&c, occurrence, now));
        plan.update(&id, |w| {
            w.branch_rule.next_run_time = Some(run);
            w.branch_rule.is_currently_running = true;
        });
        self.free_workers -= 1;
        self.running.insert(
            id,
            Running {
                occurrence,
                claimed_at: now,
                ends_at: now + duration,
                attempt,
                failed_attempts,
                outcome_failed,
                cancel_at,
            },
        );
        self.push(plan, now, id, occurrence, attempt, DecisionKind::Run);
    }

    /// Due rules the window holds back, reported once per occurrence.
    fn note_held_by_window(&mut self, plan: &ExecutionPlan, now: Millis) {
        let zone = self.sim.default_zone;
        let held: Vec<(Uuid, Millis, Millis)> = plan
            .due_ids(now)
            .filter_map(|id| {
                let workflow = plan.get(&id)?;
                let Err(NotReady::OutsideWindow { window, .. }) =
                    check_ready(plan, workflow, now, zone)
                else {
                    return None;
                };
                let due = workflow.branch_rule.next_run_time?;
                let zone = plan.zone_of(workflow, zone).unwrap_or(zone);
                let opens =
                    crate::schedule::next_window_open(Some(window), zone, millis_to_utc(now))
                        .timestamp_millis();
                Some((id, due, opens))
            })
            .filter(|(id, due, _)| !self.held.contains(&(*id, *due)))
            .collect();
        for (id, due, opens) in held {
            self.held.insert((id, due));
            self.push(plan, now, id, due, 0, DecisionKind::HeldByWindow { opens });
        }
    }

    /// The next moment something can happen: a run ends or is cancelled, a
    /// worker is rested, something falls due or a window opens, ruled goes
    /// down.
    fn next_event(&self, plan: &ExecutionPlan, now: Millis) -> Option<Millis> {
        let ends = self
            .running
            .values()
            .map(|r| r.cancel_at.map_or(r.ends_at, |c| c.min(r.ends_at)))
            .min();
        let rested = self.resting.keys().next().copied();
        let wake = next_wake(plan, now, self.sim.default_zone, &Ownership::All);
        let down = self
            .sim
            .down
            .iter()
            .map(|(start, _)| *start)
            .filter(|start| *start > now)
            .min();
        [ends, rested, wake, down].into_iter().flatten().min()
    }

    fn draw(&self, id: Uuid, occurrence: Millis, attempt: i64, salt: u64) -> f64 {
        let mut z = self.sim.seed
            ^ stable_hash(&id)
            ^ (occurrence as u64).rotate_left(21)
            ^ (attempt as u64).rotate_left(42)
            ^ salt;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    fn fails(&self, id: Uuid, occurrence: Millis, attempt: i64) -> bool {
        self.sim.fail_rate > 0.0 && self.draw(id, occurrence, attempt, 0xfa11) < self.sim.fail_rate
    }
}

/// One step of a policy-aware preview: an occurrence and what happens to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct PreviewStep {
    /// The occurrence (its due time), UTC ms.
    pub occurrence: Millis,
    /// When it starts (its start offset and window applied); `None` when
    /// it does not run.
    pub starts_at: Option<Millis>,
    /// `run`, or the skip reason.
    pub decision: String,
}

/// A plan holding one branch rule: `expression` in `zone`, with `window`
/// and `policy`, first due at `next_run_time`. What a policy preview runs.
pub fn single_rule_plan(
    id: Uuid,
    expression: &str,
    zone: Tz,
    window: Option<crate::schedule::Window>,
    policy: Option<crate::schedule::Policy>,
    next_run_time: Millis,
) -> ExecutionPlan {
    use crate::model::{Branch, BranchRule, Brand, PlanData, Rule, RuleStatus};
    let brand = Brand {
        id: Uuid::from_u128(1),
        name: "preview".into(),
        settings: serde_json::Value::Null,
        created_at: 0,
        updated_at: 0,
    };
    let branch = Branch {
        id: Uuid::from_u128(2),
        brand_id: brand.id,
        name: "preview".into(),
        timezone: Some(zone.name().to_string()),
        is_active: true,
        created_at: 0,
        updated_at: 0,
    };
    let rule = Rule {
        id: Uuid::from_u128(3),
        brand_id: Some(brand.id),
        name: "preview".into(),
        status: RuleStatus::Active,
        cron_expression: expression.to_string(),
        settings: serde_json::Value::Null,
        policy,
        created_at: 0,
        updated_at: 0,
    };
    let branch_rule = BranchRule {
        id,
        branch_id: branch.id,
        rule_id: rule.id,
        brand_rule_id: None,
        is_active: true,
        is_archived: false,
        is_force_stopped: false,
        is_currently_running: false,
        operation_time_from: window.map(|w| w.from),
        operation_time_to: window.map(|w| w.to),
        next_run_time: Some(next_run_time),
        last_run_time: None,
        lock_holder: None,
        lock_time: None,
        lock_epoch: 0,
        params: serde_json::Value::Null,
        policy: None,
        retry_of: None,
        failed_attempts: 0,
        created_at: 0,
        updated_at: 0,
    };
    ExecutionPlan::from_data(PlanData {
        brands: vec![brand],
        branches: vec![branch],
        rules: vec![rule],
        branch_rules: vec![branch_rule],
        ..PlanData::default()
    })
}

/// At most this many decisions in one pass of a policy preview: a rule
/// that skips nearly everything (a minute cron in a one-minute window)
/// gives up here rather than simulating years.
pub const PREVIEW_DECISIONS_MAX: usize = 10_000;

/// The next `count` runs of one branch rule under its policy, with the
/// occurrences the policy skips on the way (a window's closed hours under
/// `run_once` or `skip`, the ones past `catchup_max`): the simulation of
/// that one rule, with ruled up throughout and every run instant, over a
/// span growing from a day to 1,024 days (and never past `until`) until
/// `count` runs are in it. The second value is `true` when the steps stop
/// short of `count` runs: a pass made more than [`PREVIEW_DECISIONS_MAX`]
/// decisions, or the span ran out; the steps are then those of the last
/// pass that did not give up, a prefix of the full answer (what the
/// simulation decides by a time does not depend on where it ends).
pub fn preview_under_policy(
    plan_of_one: &ExecutionPlan,
    from: Millis,
    count: usize,
    default_zone: Tz,
    until: Millis,
) -> (Vec<PreviewStep>, bool) {
    const FIRST_SPAN_MS: Millis = 86_400_000;
    const LAST_SPAN_MS: Millis = 1024 * 86_400_000;
    let mut span = FIRST_SPAN_MS;
    let mut shown = Vec::new();
    loop {
        let end = from.saturating_add(span).min(until.saturating_add(1));
        let mut sim = Simulation::new(from, end);
        sim.duration_ms = 1;
        sim.workers = 1;
        sim.default_zone = default_zone;
        sim.max_decisions = Some(PREVIEW_DECISIONS_MAX);
        let Ok(report) = simulate(plan_of_one.clone(), &sim) else {
            return (shown, true);
        };
        let mut steps = Vec::new();
        let mut runs = 0;
        for decision in &report.decisions {
            let step = match &decision.kind {
                DecisionKind::Run => {
                    runs += 1;
                    PreviewStep {
                        occurrence: decision.occurrence,
                        starts_at: Some(decision.at),
                        decision: "run".into(),
                    }
                }
                DecisionKind::Skipped { reason, .. } => PreviewStep {
                    occurrence: decision.occurrence,
                    starts_at: None,
                    decision: reason.as_str().into(),
                },
                _ => continue,
            };
            steps.push(step);
            if runs == count {
                return (steps, false);
            }
        }
        shown = steps;
        if span >= LAST_SPAN_MS || end > until {
            return (shown, true);
        }
        span *= 4;
    }
}

fn utc_text(at: Millis) -> String {
    millis_to_utc(at)
        .format("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string()
}

fn local_text(at: Millis, zone: &str) -> String {
    let zone: Tz = zone.parse().unwrap_or(chrono_tz::UTC);
    millis_to_utc(at)
        .with_timezone(&zone)
        .format("%Y-%m-%d %H:%M:%S %Z")
        .to_string()
}

impl Report {
    /// One line per decision: tick, UTC, local time, branch rule,
    /// partition, occurrence, attempt, decision. Fixed columns; only the
    /// zone database decides the local time, never the host's zone.
    pub fn to_table(&self) -> String {
        let mut out = Vec::with_capacity(self.decisions.len() * 160);
        self.write_table(&mut out)
            .expect("writing to memory cannot fail");
        String::from_utf8(out).expect("the table is UTF-8")
    }

    /// [`Report::to_table`], written as it is made: a week of a thousand
    /// rules is hundreds of megabytes of text.
    pub fn write_table<W: std::io::Write>(&self, mut out: W) -> std::io::Result<()> {
        writeln!(
            out,
            "{:>8}  {:<24}  {:<24}  {:<36}  {:>4}  {:<24}  {:>7}  decision",
            "tick", "utc", "local", "branch_rule", "part", "occurrence", "attempt"
        )?;
        for d in &self.decisions {
            writeln!(
                out,
                "{:>8}  {:<24}  {:<24}  {:<36}  {:>4}  {:<24}  {:>7}  {}",
                d.tick,
                utc_text(d.at),
                local_text(d.at, &d.zone),
                d.branch_rule_id,
                d.partition,
                utc_text(d.occurrence),
                if d.attempt > 0 {
                    d.attempt.to_string()
                } else {
                    "-".into()
                },
                d.kind.label()
            )?;
        }
        writeln!(
            out,
            "{} run(s), {} skipped, {} retr{}, {} tick(s) visited",
            self.runs,
            self.skipped,
            self.retries,
            if self.retries == 1 { "y" } else { "ies" },
            self.ticks_visited
        )
    }

    /// One JSON document: the totals and every decision, each with its
    /// UTC and local times written out as the table shows them.
    pub fn to_json(&self) -> String {
        let mut out = Vec::with_capacity(self.decisions.len() * 300);
        self.write_json(&mut out)
            .expect("writing to memory cannot fail");
        String::from_utf8(out).expect("JSON is UTF-8")
    }

    /// [`Report::to_json`], one decision per line as it is made, so memory
    /// stays that of one decision whatever the length of the report.
    pub fn write_json<W: std::io::Write>(&self, mut out: W) -> std::io::Result<()> {
        writeln!(
            out,
            "{{\"runs\":{},\"skipped\":{},\"retries\":{},\"ticks_visited\":{},\"decisions\":[",
            self.runs, self.skipped, self.retries, self.ticks_visited
        )?;
        for (index, d) in self.decisions.iter().enumerate() {
            let mut value = serde_json::to_value(d).expect("a decision serializes");
            value["utc"] = utc_text(d.at).into();
            value["local"] = local_text(d.at, &d.zone).into();
            value["occurrence_utc"] = utc_text(d.occurrence).into();
            if index > 0 {
                out.write_all(b",\n")?;
            }
            serde_json::to_writer(&mut out, &value)?;
        }
        out.write_all(b"\n]}\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::fixtures::Fixture;
    use crate::schedule::Policy;
    use chrono::{TimeZone, Utc};

    fn at(d: u32, h: u32, m: u32) -> Millis {
        Utc.with_ymd_and_hms(2026, 6, d, h, m, 0)
            .unwrap()
            .timestamp_millis()
    }

    fn plan_with(policy: &str, cron: &str, next: Millis) -> ExecutionPlan {
        let mut fixture = Fixture::due(next);
        fixture.rule.cron_expression = cron.into();
        fixture.branch.timezone = Some("UTC".into());
        fixture.rule.policy = Policy::from_json_text(Some(policy)).unwrap();
        fixture.plan()
    }

    fn kinds(report: &Report) -> Vec<String> {
        report
            .decisions
            .iter()
            .map(|d| format!("{} {}", utc_text(d.occurrence), d.kind.label()))
            .collect()
    }

    #[test]
    fn an_outage_under_each_misfire_policy() {
        let mut sim = Simulation::new(at(1, 0, 0), at(1, 5, 0));
        sim.down = vec![(at(1, 1, 0) - 1000, at(1, 4, 5))];
        let count = |policy: &str| {
            let report = simulate(plan_with(policy, "*/15 * * * *", at(1, 0, 0)), &sim).unwrap();
            (report.runs, report.skipped)
        };
        // 00:00 … 00:45 run; 01:00 … 04:00 are missed; 04:15 … 04:45 run.
        assert_eq!(count(r#"{"misfire":"run_once"}"#), (4 + 1 + 3, 12));
        assert_eq!(count(r#"{"misfire":"skip"}"#), (4 + 3, 13));
        assert_eq!(
            count(r#"{"misfire":"run_all","catchup_max":5}"#),
            (4 + 5 + 3, 8)
        );
    }

    #[test]
    fn a_rule_behind_the_start_starts_at_its_first_occurrence_from_there() {
        // Stored next run a day before the simulated period: nothing of
        // that day is a misfire of the period.
        let mut sim = Simulation::new(at(2, 0, 0), at(2, 1, 0));
        sim.plan_read_at = Some(at(1, 0, 0));
        let plan = || plan_with(r#"{"misfire":"skip"}"#, "*/15 * * * *", at(1, 0, 0));
        let report = simulate(plan(), &sim).unwrap();
        assert_eq!(
            (report.runs, report.skipped),
            (4, 0),
            "{:?}",
            kinds(&report)
        );
        // Read when the simulation starts: the day behind is real backlog,
        // sorted by the misfire policy as the service would.
        sim.plan_read_at = Some(at(2, 0, 0));
        let report = simulate(plan(), &sim).unwrap();
        assert!(report.skipped > 0, "{:?}", kinds(&report));
    }

    #[test]
    fn overlaps_by_policy() {
        let mut sim = Simulation::new(at(1, 0, 0), at(1, 0, 10) - 1);
        sim.duration_ms = 90_000;
        let run =
            |policy: &str| simulate(plan_with(policy, "* * * * *", at(1, 0, 0)), &sim).unwrap();
        let skip = run(r#"{"overlap":"skip"}"#);
        assert_eq!((skip.runs, skip.skipped), (5, 5), "{:#?}", kinds(&skip));
        let buffer = run(r#"{"overlap":"buffer_one"}"#);
        assert_eq!(
            (buffer.runs, buffer.skipped),
            (7, 3),
            "{:#?}",
            kinds(&buffer)
        );
        // The buffered occurrence is owed its run, late as it is by then:
        // neither `misfire: skip` nor a catch-up window drops it.
        let buffer_skipping =
            run(r#"{"overlap":"buffer_one","misfire":"skip","catchup_window_seconds":10}"#);
        assert_eq!(
            (buffer_skipping.runs, buffer_skipping.skipped),
            (7, 3),
            "{:#?}",
            kinds(&buffer_skipping)
        );
        let cancel = run(r#"{"overlap":"cancel_running"}"#);
        assert_eq!(cancel.runs, 10, "{:#?}", kinds(&cancel));
        assert!(
            cancel
                .decisions
                .iter()
                .filter(|d| matches!(&d.kind, DecisionKind::Finished { status } if status == "cancelled"))
                .count()
                >= 8
        );
    }

    #[test]
    fn retries_then_success_and_the_output_is_deterministic() {
        let mut sim = Simulation::new(at(1, 0, 0), at(1, 2, 0));
        sim.fail_rate = 0.5;
        sim.seed = 7;
        let plan = plan_with(
            r#"{"max_attempts":3,"backoff_seconds":10}"#,
            "*/15 * * * *",
            at(1, 0, 0),
        );
        let first = simulate(plan.clone(), &sim).unwrap();
        assert!(first.retries > 0, "{:#?}", kinds(&first));
        let second = simulate(plan, &sim).unwrap();
        assert_eq!(first.to_table(), second.to_table());
        assert_eq!(first.to_json(), second.to_json());
    }

    #[test]
    fn bounds_are_errors() {
        let mut sim = Simulation::new(at(1, 0, 0), at(2, 0, 0));
        sim.max_ticks = Some(1000);
        assert!(matches!(
            simulate(plan_with("{}", "* * * * *", at(1, 0, 0)), &sim),
            Err(SimulationError::TooManyTicks { .. })
        ));
        let sim = Simulation::new(at(1, 0, 0), at(1, 0, 0));
        assert_eq!(
            simulate(ExecutionPlan::new(), &sim),
            Err(SimulationError::EmptyRange)
        );
    }
}
