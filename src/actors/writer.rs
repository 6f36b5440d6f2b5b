//! The WriterActor: debounced, atomic writes of the plan file.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::{debug, error, info};

use crate::clock::Clock;
use crate::messages::WriterMsg;
use crate::messages::writer::WriterStats;
use crate::metrics as m;
use crate::model::Millis;
use crate::persist::write_plan_file;
use crate::plan::PlanSnapshot;

/// How many snapshots may wait. Each is a whole plan, so only the newest
/// matters; the bound keeps a slow disk from holding many plans in memory.
pub const WRITE_QUEUE_CAPACITY: usize = 4;

pub struct WriterActor;

pub struct WriterArgs {
    pub path: PathBuf,
    pub min_interval: Duration,
    pub clock: Clock,
}

pub struct WriterState {
    path: PathBuf,
    min_interval: Duration,
    clock: Clock,
    queue: VecDeque<Arc<PlanSnapshot>>,
    flush_scheduled: bool,
    stats: WriterStats,
}

impl Actor for WriterActor {
    type Msg = WriterMsg;
    type State = WriterState;
    type Arguments = WriterArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<WriterMsg>,
        args: WriterArgs,
    ) -> Result<WriterState, ActorProcessingErr> {
        info!("💾 Plan writer started for {}", args.path.display());
        Ok(WriterState {
            path: args.path,
            min_interval: args.min_interval,
            clock: args.clock,
            queue: VecDeque::with_capacity(WRITE_QUEUE_CAPACITY),
            flush_scheduled: false,
            stats: WriterStats {
                write_thread_alive: true,
                write_thread_started: true,
                ..WriterStats::default()
            },
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<WriterMsg>,
        message: WriterMsg,
        state: &mut WriterState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            WriterMsg::Enqueue(snapshot) => {
                if state.queue.len() >= WRITE_QUEUE_CAPACITY {
                    state.queue.pop_front();
                    state.stats.snapshots_dropped += 1;
                    metrics::counter!(m::PLAN_WRITE_TOTAL, "result" => "dropped").increment(1);
                }
                state.queue.push_back(snapshot);
                state.publish_queue_size();
                state.schedule_flush(&myself);
            }
            WriterMsg::Flush => {
                state.flush_scheduled = false;
                state.write_newest().await;
                if !state.queue.is_empty() {
                    // The write failed and the snapshot was kept: retry later.
                    state.schedule_flush(&myself);
                }
            }
            WriterMsg::Drain(reply) => {
                state.write_newest().await;
                let _ = reply.send(state.current_stats());
            }
            WriterMsg::Stats(reply) => {
                let _ = reply.send(state.current_stats());
            }
            WriterMsg::InjectPanic(reason) => panic!("{reason}"),
        }
        Ok(())
    }
}

impl WriterState {
    fn current_stats(&self) -> WriterStats {
        WriterStats {
            write_queue_size: self.queue.len(),
            write_queue_full: self.queue.len() >= WRITE_QUEUE_CAPACITY,
            ..self.stats.clone()
        }
    }

    fn publish_queue_size(&self) {
        metrics::gauge!(m::PLAN_WRITE_QUEUE_SIZE).set(self.queue.len() as f64);
    }

    /// At most one write per `min_interval`: the flush waits out whatever
    /// remains of the interval since the last write.
    fn schedule_flush(&mut self, myself: &ActorRef<WriterMsg>) {
        if self.flush_scheduled {
            return;
        }
        self.flush_scheduled = true;
        let interval = self.min_interval.as_millis() as Millis;
        let now = self.clock.now_ms();
        let wait = self
            .stats
            .last_write_at
            .map_or(0, |at| (at + interval - now).max(0));
        myself.send_after(Duration::from_millis(wait as u64), || WriterMsg::Flush);
    }

    /// Writes the newest snapshot; older ones are superseded by it. On
    /// failure the snapshot stays queued for the next attempt.
    async fn write_newest(&mut self) {
        let Some(snapshot) = self.queue.pop_back() else {
            return;
        };
        self.queue.clear();
        let path = self.path.clone();
        let started = Instant::now();
        let to_write = Arc::clone(&snapshot);
        let result = tokio::task::spawn_blocking(move || write_plan_file(&path, &to_write)).await;
        let elapsed = started.elapsed();
        match result {
            Ok(Ok(bytes)) => {
                self.stats.writes_ok += 1;
                self.stats.last_write_at = Some(self.clock.now_ms());
                self.stats.last_error = None;
                metrics::counter!(m::PLAN_WRITE_TOTAL, "result" => "ok").increment(1);
                metrics::histogram!(m::PLAN_WRITE_DURATION_SECONDS).record(elapsed.as_secs_f64());
                debug!(
                    bytes,
                    workflows = snapshot.workflows.len(),
                    "💾 Wrote execution plan"
                );
            }
            Ok(Err(e)) => self.write_failed(snapshot, e.to_string()),
            Err(join_error) => self.write_failed(snapshot, join_error.to_string()),
        }
        self.publish_queue_size();
    }

    fn write_failed(&mut self, snapshot: Arc<PlanSnapshot>, reason: String) {
        error!("❌ Plan file write failed: {reason}");
        self.stats.writes_failed += 1;
        self.stats.last_error = Some(reason);
        // Counted as a write so the failure is also visible without logs.
        self.stats.last_write_at = Some(self.clock.now_ms());
        metrics::counter!(m::PLAN_WRITE_TOTAL, "result" => "error").increment(1);
        self.queue.push_back(snapshot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::ask;
    use crate::persist::read_plan_file;

    fn snapshot(saved_at: Millis) -> Arc<PlanSnapshot> {
        Arc::new(PlanSnapshot {
            saved_at,
            ..PlanSnapshot::default()
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_drops_the_oldest_and_writes_at_most_once_per_interval() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plan.json");
        let args = WriterArgs {
            path: path.clone(),
            min_interval: Duration::from_secs(1),
            clock: Clock::starting_at(1_000_000),
        };
        let (writer, handle) = Actor::spawn(None, WriterActor, args).await.unwrap();

        for saved_at in 0..10 {
            writer.cast(WriterMsg::Enqueue(snapshot(saved_at))).unwrap();
        }
        let stats = ask(&writer, WriterMsg::Stats).await.unwrap();
        assert!(stats.write_thread_started && stats.write_thread_alive);
        assert_eq!(stats.write_queue_size, WRITE_QUEUE_CAPACITY);
        assert!(stats.write_queue_full);
        assert_eq!(stats.snapshots_dropped, 6);

        // The first flush is immediate and writes only the newest snapshot.
        while ask(&writer, WriterMsg::Stats).await.unwrap().writes_ok == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(read_plan_file(&path).unwrap().unwrap().saved_at, 9);
        let stats = ask(&writer, WriterMsg::Stats).await.unwrap();
        assert_eq!((stats.writes_ok, stats.write_queue_size), (1, 0));

        // The next one waits out the interval since the last write.
        writer.cast(WriterMsg::Enqueue(snapshot(10))).unwrap();
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert_eq!(ask(&writer, WriterMsg::Stats).await.unwrap().writes_ok, 1);
        assert_eq!(read_plan_file(&path).unwrap().unwrap().saved_at, 9);
        while ask(&writer, WriterMsg::Stats).await.unwrap().writes_ok == 1 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(read_plan_file(&path).unwrap().unwrap().saved_at, 10);

        writer.stop(None);
        handle.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_write_is_retried_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the file should be: every write fails.
        let path = dir.path().join("blocked");
        std::fs::create_dir(&path).unwrap();
        let args = WriterArgs {
            path: path.clone(),
            min_interval: Duration::from_millis(100),
            clock: Clock::starting_at(0),
        };
        let (writer, handle) = Actor::spawn(None, WriterActor, args).await.unwrap();
        writer.cast(WriterMsg::Enqueue(snapshot(1))).unwrap();
        while ask(&writer, WriterMsg::Stats).await.unwrap().writes_failed < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let stats = ask(&writer, WriterMsg::Stats).await.unwrap();
        assert_eq!(
            stats.write_queue_size, 1,
            "the snapshot is kept for the retry"
        );
        assert!(stats.last_error.unwrap().contains("blocked"));

        std::fs::remove_dir(&path).unwrap();
        while ask(&writer, WriterMsg::Stats).await.unwrap().writes_ok == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(read_plan_file(&path).unwrap().unwrap().saved_at, 1);
        writer.stop(None);
        handle.await.unwrap();
    }
}
