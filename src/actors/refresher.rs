//! The RefresherActor: reads the plan from SQL and hands it to the
//! PlanActor for a smart merge, every EXECUTION_PLAN_REFRESH_SECONDS, and
//! delivers the outbox. Heartbeats and takeovers have their own timer, in
//! the [`LeaseActor`](crate::actors::lease).

use std::sync::Arc;
use std::time::Instant;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::{debug, error, info, warn};

use crate::actors::{ask, released_unreadable};
use crate::clock::Clock;
use crate::config::Config;
use crate::directory::Directory;
use crate::messages::refresher::RefresherStats;
use crate::messages::{PlanMsg, RefresherMsg};
use crate::metrics as m;
use crate::model::Millis;
use crate::plan::MergeReport;
use crate::store::{Released, Store};

pub struct RefresherActor;

pub struct RefresherArgs {
    pub store: Store,
    pub config: Arc<Config>,
    pub clock: Clock,
    pub directory: Directory,
}

/// How far before the newest `updated_at` already seen an incremental read
/// starts. Covers transactions that commit after a later one and writers
/// whose clocks lag; anything slower is caught by the next full refresh.
pub const CHANGE_WINDOW_SLACK_MS: Millis = 30_000;

pub struct RefresherState {
    store: Store,
    config: Arc<Config>,
    clock: Clock,
    directory: Directory,
    stats: RefresherStats,
    /// The newest branch-rule `updated_at` merged so far; `None` until the
    /// first full read, which every (re)start begins with.
    watermark: Option<Millis>,
    last_full_at: Option<Millis>,
    /// A refresh is asked for and queued behind what the mailbox holds: any
    /// number of nudges meanwhile (5,000 API creates) add nothing to it.
    refresh_pending: bool,
}

impl Actor for RefresherActor {
    type Msg = RefresherMsg;
    type State = RefresherState;
    type Arguments = RefresherArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<RefresherMsg>,
        args: RefresherArgs,
    ) -> Result<RefresherState, ActorProcessingErr> {
        // The first refresh runs at once; each tick schedules the next, so a
        // slow database never stacks refreshes up in the mailbox.
        myself.send_message(RefresherMsg::Tick)?;
        Ok(RefresherState {
            store: args.store,
            config: args.config,
            clock: args.clock,
            directory: args.directory,
            stats: RefresherStats::default(),
            watermark: None,
            last_full_at: None,
            refresh_pending: false,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<RefresherMsg>,
        message: RefresherMsg,
        state: &mut RefresherState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            RefresherMsg::Tick => {
                state.deliver_outbox().await;
                state.refresh().await;
                myself.send_after(state.config.plan_refresh_interval, || RefresherMsg::Tick);
            }
            RefresherMsg::RefreshNow => {
                // Coalesce: one refresh after the nudges already queued,
                // however many there are.
                if !state.refresh_pending {
                    state.refresh_pending = true;
                    myself.send_message(RefresherMsg::RefreshPending)?;
                }
            }
            RefresherMsg::RefreshPending => {
                state.refresh_pending = false;
                state.refresh().await;
            }
            RefresherMsg::DeliverOutbox(reply) => {
                let pending = state.deliver_outbox().await;
                let _ = reply.send(pending);
            }
            RefresherMsg::Stats(reply) => {
                let _ = reply.send(state.stats.clone());
            }
            RefresherMsg::InjectPanic(reason) => panic!("{reason}"),
        }
        Ok(())
    }
}

impl RefresherState {
    /// Sends post-process writes the database refused earlier. Stops at the
    /// first transient failure: the database is still away. An entry the
    /// database refuses for good (a constraint, a value it rejects) stays
    /// pending, logged, and the entries behind it are still delivered.
    /// Returns what is pending.
    async fn deliver_outbox(&mut self) -> usize {
        let Some(plan) = self.directory.plan() else {
            return 0;
        };
        let Ok(entries) = ask(&plan, PlanMsg::Outbox).await else {
            return 0;
        };
        let mut pending = entries.len();
        for entry in entries {
            match self
                .store
                .finish_released(&entry.fence, &entry.finish)
                .await
            {
                Ok(released) => {
                    pending -= 1;
                    let row = match released {
                        Some(Released::Row(row)) => Some(row),
                        Some(Released::Unreadable(problem)) => {
                            released_unreadable(
                                &self.directory,
                                &entry.fence,
                                &entry.finish,
                                &problem,
                            );
                            None
                        }
                        None => {
                            warn!(
                                execution_id = %entry.fence.execution_id,
                                "📮 Outbox entry fenced out: the claim was taken over meanwhile"
                            );
                            None
                        }
                    };
                    self.stats.outbox_delivered += 1;
                    let _ = plan.cast(PlanMsg::OutboxDelivered {
                        execution_id: entry.fence.execution_id,
                        row,
                    });
                }
                Err(e) if e.is_transient() => {
                    metrics::counter!(m::DB_ERRORS_TOTAL, "op" => "outbox").increment(1);
                    debug!("Outbox delivery waits for the database: {e}");
                    break;
                }
                Err(e) => {
                    metrics::counter!(m::DB_ERRORS_TOTAL, "op" => "outbox").increment(1);
                    error!(
                        execution_id = %entry.fence.execution_id,
                        "📮 The database refused an outbox entry; it stays in the outbox: {e}"
                    );
                }
            }
        }
        pending
    }

    /// One refresh. Every failure is logged and counted, and the last plan
    /// stays in place: a database outage must never stop the refresher.
    async fn refresh(&mut self) {
        self.refresh_and_count().await;
        self.directory.publish_refresher_stats(&self.stats);
    }

    async fn refresh_and_count(&mut self) {
        let started = Instant::now();
        match self.try_refresh().await {
            Ok(report) => {
                let elapsed = started.elapsed();
                self.stats.refreshes_ok += 1;
                self.stats.last_success_at = Some(self.clock.now_ms());
                self.stats.last_error = None;
                metrics::counter!(m::PLAN_REFRESH_TOTAL, "result" => "ok").increment(1);
                metrics::histogram!(m::PLAN_REFRESH_DURATION_SECONDS).record(elapsed.as_secs_f64());
                for (kind, count) in [
                    ("added", report.added),
                    ("updated", report.updated),
                    ("removed", report.removed),
                    ("preserved", report.preserved),
                    ("pruned", report.pruned),
                ] {
                    metrics::counter!(m::PLAN_MERGE_CHANGES_TOTAL, "kind" => kind)
                        .increment(count as u64);
                }
                let line = format!(
                    "✅ Updated execution plan: {} added, {} updated, {} removed, {} preserved, {} pruned in {} ms",
                    report.added,
                    report.updated,
                    report.removed,
                    report.preserved,
                    report.pruned,
                    elapsed.as_millis()
                );
                // The first refresh is always worth a line: it says the
                // database is reachable and the plan is loaded.
                let quiet = report.is_empty() && report.preserved == 0;
                if quiet && self.stats.refreshes_ok > 1 {
                    debug!("{line}");
                } else {
                    info!("{line}");
                }
            }
            Err(reason) => {
                self.stats.refreshes_failed += 1;
                self.stats.last_error = Some(reason.clone());
                metrics::counter!(m::PLAN_REFRESH_TOTAL, "result" => "error").increment(1);
                warn!("⚠️ Plan refresh failed, keeping the last plan: {reason}");
            }
        }
    }

    /// Reads only what changed since the last read, unless a full read is
    /// due (first refresh, PLAN_FULL_REFRESH_SECONDS elapsed) or the delta
    /// shows the plan and the table disagree.
    async fn try_refresh(&mut self) -> Result<MergeReport, String> {
        let now = self.clock.now_ms();
        let full_interval = self.config.plan_full_refresh_interval.as_millis() as Millis;
        let since = match (self.watermark, self.last_full_at) {
            (Some(watermark), Some(last_full)) if now - last_full < full_interval => {
                Some(watermark - CHANGE_WINDOW_SLACK_MS)
            }
            _ => None,
        };
        let mut report = self.read_and_merge(since).await?;
        if since.is_some() && report.full_refresh_needed {
            debug!("the incremental read disagrees with the plan; reading everything");
            let full = self.read_and_merge(None).await?;
            report.absorb(full);
        }
        Ok(report)
    }

    async fn read_and_merge(&mut self, since: Option<Millis>) -> Result<MergeReport, String> {
        let cap = self.config.plan_action_details_cap;
        let started_at = self.clock.now_ms();
        // Rows that do not decode come back set aside, not as an error: the
        // plan quarantines them and everything else refreshes.
        let load = self.store.load_plan(cap, since).await.map_err(|e| {
            metrics::counter!(m::DB_ERRORS_TOTAL, "op" => "refresh").increment(1);
            e.to_string()
        })?;
        // A row stamped in the future (an operator's SQL, a clock far
        // ahead) must not carry the watermark past now: every change made
        // meanwhile would wait for the next full read.
        let newest = load
            .data
            .branch_rules
            .iter()
            .map(|r| r.updated_at.min(started_at))
            .max();
        let plan = self
            .directory
            .plan()
            .ok_or("the plan actor is restarting")?;
        let report = ask(&plan, |reply| PlanMsg::Merge(Box::new(load), reply))
            .await
            .map_err(|e| format!("the plan actor did not merge: {e}"))?;
        if since.is_none() && !report.full_refresh_needed {
            self.last_full_at = Some(started_at);
        }
        if report.full_refresh_needed && since.is_none() {
            return Err("the plan refused a full read".to_string());
        }
        if !report.full_refresh_needed {
            self.watermark = self.watermark.max(newest).or(Some(started_at));
        }
        Ok(report)
    }
}
