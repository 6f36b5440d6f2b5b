//! The PrunerActor: deletes finished executions older than
//! EXECUTION_RETENTION_DAYS, ten seconds after start and then every hour, in
//! batches of a thousand rows with a pause between them. Each batch is one
//! message, so the actor answers (and stops) between batches however much
//! history a first prune finds.

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::{debug, info, warn};

use crate::clock::{Clock, millis_to_utc};
use crate::config::Config;
use crate::messages::pruner::{PrunerMsg, PrunerStats};
use crate::metrics as m;
use crate::model::Millis;
use crate::store::Store;

/// The first prune waits this long after start (or one interval, if that
/// is shorter): start-up reads and writes first.
const FIRST_PRUNE_AFTER: Duration = Duration::from_secs(10);
/// The pause between batches: the engine's writes get the database in
/// between (on SQLite, the single writer's lock).
const BATCH_PAUSE: Duration = Duration::from_millis(20);
const DAY_MS: Millis = 86_400_000;

pub struct PrunerActor;

pub struct PrunerArgs {
    pub config: Arc<Config>,
    pub clock: Clock,
    pub store: Store,
}

pub struct PrunerState {
    args: PrunerArgs,
    /// The prune under way: its cutoff, rows so far, and when it began.
    run: Option<PruneRun>,
    stats: PrunerStats,
}

struct PruneRun {
    cutoff: Millis,
    pruned: u64,
    started_at: Millis,
}

impl Actor for PrunerActor {
    type Msg = PrunerMsg;
    type State = PrunerState;
    type Arguments = PrunerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<PrunerMsg>,
        args: PrunerArgs,
    ) -> Result<PrunerState, ActorProcessingErr> {
        let days = args.config.execution_retention_days;
        let _ = myself.send_message(PrunerMsg::ReadOldestKept);
        if days == 0 {
            info!("🧹 Execution history is kept forever (EXECUTION_RETENTION_DAYS=0)");
            myself.send_interval(args.config.prune_interval, || PrunerMsg::ReadOldestKept);
        } else {
            let interval = args.config.prune_interval;
            info!("🧹 Pruning finished executions older than {days} day(s) every {interval:?}");
            myself.send_after(FIRST_PRUNE_AFTER.min(interval), || PrunerMsg::Prune);
            myself.send_interval(interval, || PrunerMsg::Prune);
        }
        Ok(PrunerState {
            args,
            run: None,
            stats: PrunerStats::default(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<PrunerMsg>,
        message: PrunerMsg,
        state: &mut PrunerState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            PrunerMsg::Prune => {
                if state.run.is_none() {
                    state.start();
                    state.next_batch(&myself).await;
                }
            }
            PrunerMsg::NextBatch => state.next_batch(&myself).await,
            PrunerMsg::ReadOldestKept => state.read_oldest_kept().await,
            PrunerMsg::Stats(reply) => {
                let _ = reply.send(state.stats.clone());
            }
            PrunerMsg::InjectPanic(reason) => panic!("{reason}"),
        }
        Ok(())
    }
}

impl PrunerState {
    fn start(&mut self) {
        let now = self.args.clock.now_ms();
        let cutoff = now - self.args.config.execution_retention_days as Millis * DAY_MS;
        debug!(
            "🧹 Pruning finished executions requested before {}",
            millis_to_utc(cutoff).to_rfc3339()
        );
        self.run = Some(PruneRun {
            cutoff,
            pruned: 0,
            started_at: now,
        });
    }

    async fn next_batch(&mut self, myself: &ActorRef<PrunerMsg>) {
        let Some(run) = self.run.as_mut() else {
            return;
        };
        let batch = self.args.config.prune_batch.max(1);
        match self
            .args
            .store
            .prune_executions(run.cutoff, batch as i64)
            .await
        {
            Ok(deleted) => {
                run.pruned += deleted;
                self.stats.pruned += deleted;
                metrics::counter!(m::EXECUTIONS_PRUNED_TOTAL).increment(deleted);
                if deleted as usize >= batch {
                    myself.send_after(BATCH_PAUSE, || PrunerMsg::NextBatch);
                } else {
                    self.finish().await;
                }
            }
            Err(e) => {
                metrics::counter!(m::DB_ERRORS_TOTAL, "op" => "prune").increment(1);
                warn!(
                    pruned = run.pruned,
                    "⚠️ Pruning execution history failed: {e}; trying again at the next interval"
                );
                self.stats.prunes_failed += 1;
                self.stats.last_error = Some(e.to_string());
                self.run = None;
            }
        }
    }

    async fn finish(&mut self) {
        let Some(run) = self.run.take() else {
            return;
        };
        let took_ms = self.args.clock.now_ms() - run.started_at;
        let cutoff = millis_to_utc(run.cutoff).to_rfc3339();
        // At INFO even when nothing went: once an hour, and the only sign
        // at the default level that the pruner runs at all.
        info!(
            pruned = run.pruned,
            "🧹 Pruned {} finished execution(s) requested before {cutoff} (EXECUTION_RETENTION_DAYS={}) in {took_ms} ms",
            run.pruned,
            self.args.config.execution_retention_days
        );
        self.stats.prunes_done += 1;
        self.stats.last_cutoff = Some(run.cutoff);
        self.stats.last_error = None;
        self.read_oldest_kept().await;
    }

    async fn read_oldest_kept(&mut self) {
        match self.args.store.oldest_execution().await {
            Ok(oldest) => {
                self.stats.oldest_kept = oldest;
                // No history at all: nothing older than now is kept.
                let oldest = oldest.unwrap_or_else(|| self.args.clock.now_ms());
                metrics::gauge!(m::EXECUTIONS_OLDEST_KEPT_TIMESTAMP_SECONDS)
                    .set(oldest as f64 / 1000.0);
            }
            Err(e) => debug!("Cannot read the oldest execution: {e}"),
        }
    }
}
