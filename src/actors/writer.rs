//! The WriterActor: debounced, crash-safe writes of the plan file: whole
//! snapshots (atomic replace) when the plan actor sends one, and otherwise
//! journal appends of what changed (see `plan::journal`).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::{debug, error, info};

use crate::clock::Clock;
use crate::memory::heap::release_free_heap;
use crate::messages::WriterMsg;
use crate::messages::writer::WriterStats;
use crate::metrics as m;
use crate::model::Millis;
use crate::persist::{append_plan_delta, write_plan_file};
use crate::plan::{PlanDelta, PlanSnapshot};

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
    /// Journal writes not on disk yet, folded into one.
    pending: Option<PlanDelta>,
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
            pending: None,
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
                // The snapshot holds what the changes waiting here hold.
                // Kept, the later changes would fold into them and carry
                // their older states past it (an outbox, say, that the
                // snapshot has since filled).
                if state
                    .pending
                    .as_ref()
                    .is_some_and(|delta| delta.seq <= snapshot.journal_seq)
                {
                    state.pending = None;
                }
                if state.queue.len() >= WRITE_QUEUE_CAPACITY {
                    state.queue.pop_front();
                    state.stats.snapshots_dropped += 1;
                    metrics::counter!(m::PLAN_WRITE_TOTAL, "result" => "dropped").increment(1);
                }
                state.queue.push_back(snapshot);
                state.publish_queue_size();
                state.schedule_flush(&myself);
            }
            WriterMsg::Append(delta) => {
                match state.pending.as_mut() {
                    Some(pending) => pending.absorb(delta),
                    None => state.pending = Some(delta),
                }
                state.publish_queue_size();
                state.schedule_flush(&myself);
            }
            WriterMsg::Flush => {
                state.flush_scheduled = false;
                state.write_newest().await?;
                if !state.queue.is_empty() || state.pending.is_some() {
                    // The write failed and the snapshot was kept: retry later.
                    state.schedule_flush(&myself);
                }
            }
            WriterMsg::Drain(reply) => {
                state.write_newest().await?;
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
            write_queue_size: self.queue.len() + self.pending.is_some() as usize,
            write_queue_full: self.queue.len() >= WRITE_QUEUE_CAPACITY,
            ..self.stats.clone()
        }
    }

    fn publish_queue_size(&self) {
        let waiting = self.queue.len() + self.pending.is_some() as usize;
        metrics::gauge!(m::PLAN_WRITE_QUEUE_SIZE).set(waiting as f64);
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

    /// Writes the newest snapshot (older ones are superseded by it), then
    /// the journal write the snapshot does not hold. On failure what was
    /// not written stays queued for the next attempt.
    async fn write_newest(&mut self) -> Result<(), ActorProcessingErr> {
        if let Some(snapshot) = self.queue.pop_back() {
            self.queue.clear();
            if self
                .pending
                .as_ref()
                .is_some_and(|delta| delta.seq <= snapshot.journal_seq)
            {
                self.pending = None;
            }
            let path = self.path.clone();
            let started = Instant::now();
            let to_write = Arc::clone(&snapshot);
            let result =
                tokio::task::spawn_blocking(move || write_plan_file(&path, &to_write)).await;
            match flatten(result) {
                Ok(bytes) => {
                    self.written("snapshot", bytes, started);
                    self.stats.writes_ok += 1;
                    debug!(
                        bytes,
                        workflows = snapshot.workflows.len(),
                        "💾 Wrote execution plan"
                    );
                    // The snapshot and its JSON were as large as the plan.
                    drop(snapshot);
                    release_free_heap();
                }
                Err(reason) => {
                    self.write_failed(reason);
                    self.queue.push_back(snapshot);
                    self.publish_queue_size();
                    return Ok(());
                }
            }
        }
        if let Some(delta) = self.pending.take() {
            let path = self.path.clone();
            let started = Instant::now();
            let outcome =
                tokio::task::spawn_blocking(move || (append_plan_delta(&path, &delta), delta))
                    .await;
            match outcome {
                Ok((Ok(bytes), _)) => {
                    self.written("journal", bytes, started);
                    self.stats.appends_ok += 1;
                    debug!(bytes, "💾 Appended execution plan changes");
                }
                Ok((Err(e), delta)) => {
                    self.write_failed(e.to_string());
                    self.requeue(delta);
                }
                Err(join_error) => {
                    // The changes went with the write thread: the journal
                    // can no longer be completed. Failing hands the plan
                    // actor a fresh writer, and it sends that one a whole
                    // snapshot first.
                    self.write_failed(join_error.to_string());
                    return Err(format!("a journal write was lost: {join_error}").into());
                }
            }
        }
        self.publish_queue_size();
        Ok(())
    }

    /// Puts a delta that failed to write back before any newer one.
    fn requeue(&mut self, mut delta: PlanDelta) {
        if let Some(newer) = self.pending.take() {
            delta.absorb(newer);
        }
        self.pending = Some(delta);
    }

    fn written(&mut self, kind: &'static str, bytes: usize, started: Instant) {
        self.stats.last_write_at = Some(self.clock.now_ms());
        self.stats.last_error = None;
        self.stats.bytes_written += bytes as u64;
        metrics::counter!(m::PLAN_WRITE_TOTAL, "result" => "ok").increment(1);
        metrics::counter!(m::PLAN_WRITE_BYTES_TOTAL, "kind" => kind).increment(bytes as u64);
        metrics::histogram!(m::PLAN_WRITE_DURATION_SECONDS).record(started.elapsed().as_secs_f64());
    }

    fn write_failed(&mut self, reason: String) {
        error!("❌ Plan file write failed: {reason}");
        self.stats.writes_failed += 1;
        self.stats.last_error = Some(reason);
        // Counted as a write so the failure is also visible without logs.
        self.stats.last_write_at = Some(self.clock.now_ms());
        metrics::counter!(m::PLAN_WRITE_TOTAL, "result" => "error").increment(1);
    }
}

fn flatten<T>(
    result: Result<Result<T, crate::persist::PersistError>, tokio::task::JoinError>,
) -> Result<T, String> {
    match result {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(e.to_string()),
        Err(join_error) => Err(join_error.to_string()),
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

    fn workflow(n: u128, next_run: Millis) -> crate::plan::Workflow {
        let (branch, rule) = (uuid::Uuid::from_u128(0xB), uuid::Uuid::from_u128(0xC));
        crate::plan::Workflow::new(crate::plan::fixtures::branch_rule(
            uuid::Uuid::from_u128(n),
            branch,
            rule,
            next_run,
        ))
    }

    fn delta(seq: u64, n: u128, next_run: Millis) -> PlanDelta {
        PlanDelta {
            seq,
            saved_at: seq as Millis,
            workflows: [(uuid::Uuid::from_u128(n), Some(workflow(n, next_run)))].into(),
            outbox: None,
        }
    }

    /// A writer on a fresh directory that has written its first snapshot:
    /// journal_seq 10, workflows 1 and 2 due at 100 and 200.
    async fn writer_after_a_snapshot(
        min_interval: Duration,
    ) -> (
        tempfile::TempDir,
        PathBuf,
        ActorRef<WriterMsg>,
        tokio::task::JoinHandle<()>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plan.json");
        let args = WriterArgs {
            path: path.clone(),
            min_interval,
            clock: Clock::starting_at(0),
        };
        let (writer, handle) = Actor::spawn(None, WriterActor, args).await.unwrap();
        let base = PlanSnapshot {
            journal_seq: 10,
            workflows: vec![workflow(1, 100), workflow(2, 200)],
            ..PlanSnapshot::default()
        };
        writer.cast(WriterMsg::Enqueue(Arc::new(base))).unwrap();
        assert_eq!(written(&writer).await, (1, 0));
        (dir, path, writer, handle)
    }

    async fn written(writer: &ActorRef<WriterMsg>) -> (u64, u64) {
        let stats = ask(writer, WriterMsg::Drain).await.unwrap();
        (stats.writes_ok, stats.appends_ok)
    }

    #[tokio::test(start_paused = true)]
    async fn changes_are_appended_to_the_journal_and_a_snapshot_starts_it_again() {
        let (_dir, path, writer, handle) =
            writer_after_a_snapshot(Duration::from_millis(100)).await;
        let snapshot_bytes = std::fs::metadata(&path).unwrap().len();

        // Two writes' changes, folded while they wait, cost one short line.
        writer.cast(WriterMsg::Append(delta(11, 1, 101))).unwrap();
        writer.cast(WriterMsg::Append(delta(12, 3, 300))).unwrap();
        assert_eq!(written(&writer).await, (1, 1));
        let journal = crate::persist::journal_path(&path);
        let journal_bytes = std::fs::metadata(&journal).unwrap().len();
        assert!(journal_bytes < snapshot_bytes, "{journal_bytes} B");
        let read = read_plan_file(&path).unwrap().unwrap();
        let next_runs: Vec<_> = read
            .workflows
            .iter()
            .map(|w| w.branch_rule.next_run_time.unwrap())
            .collect();
        assert_eq!(next_runs, vec![101, 200, 300]);
        assert_eq!(read.journal_seq, 12);

        // A snapshot holds the journal: the journal is emptied, and a
        // change queued behind the snapshot is kept after it.
        writer
            .cast(WriterMsg::Enqueue(Arc::new(PlanSnapshot {
                journal_seq: 13,
                workflows: vec![workflow(1, 101), workflow(3, 300)],
                ..PlanSnapshot::default()
            })))
            .unwrap();
        writer.cast(WriterMsg::Append(delta(14, 3, 301))).unwrap();
        assert_eq!(written(&writer).await, (2, 2));
        let read = read_plan_file(&path).unwrap().unwrap();
        assert_eq!(read.workflows.len(), 2);
        assert_eq!(read.workflows[1].branch_rule.next_run_time, Some(301));
        assert_eq!(
            std::fs::read(&journal).unwrap(),
            delta(14, 3, 301).to_json_line()
        );

        // A write older than the snapshot on disk (from a plan actor that
        // has since restarted) changes nothing when read back.
        writer.cast(WriterMsg::Append(delta(5, 1, 7))).unwrap();
        written(&writer).await;
        let read = read_plan_file(&path).unwrap().unwrap();
        assert_eq!(read.workflows[0].branch_rule.next_run_time, Some(101));
        writer.stop(None);
        handle.await.unwrap();
    }

    /// Changes queued before a snapshot, then changes after it: the first
    /// are in the snapshot, and folded into the later ones they would be
    /// replayed over it with their older states.
    #[tokio::test(start_paused = true)]
    async fn changes_older_than_a_queued_snapshot_are_not_replayed_over_it() {
        let (_dir, path, writer, handle) =
            writer_after_a_snapshot(Duration::from_secs(3_600)).await;

        let kept = crate::plan::fixtures::outbox_entry(uuid::Uuid::from_u128(0xE));
        // The next write waits out the hour: all three wait together.
        let emptied = PlanDelta {
            outbox: Some(Vec::new()),
            ..delta(11, 1, 101)
        };
        writer.cast(WriterMsg::Append(emptied)).unwrap();
        let snapshot = PlanSnapshot {
            journal_seq: 12,
            workflows: vec![workflow(1, 102), workflow(2, 200)],
            outbox: vec![kept.clone()],
            ..PlanSnapshot::default()
        };
        writer.cast(WriterMsg::Enqueue(Arc::new(snapshot))).unwrap();
        writer.cast(WriterMsg::Append(delta(13, 2, 201))).unwrap();
        written(&writer).await;

        let read = read_plan_file(&path).unwrap().unwrap();
        assert_eq!(read.outbox, vec![kept]);
        let next_runs: Vec<_> = read
            .workflows
            .iter()
            .map(|w| w.branch_rule.next_run_time.unwrap())
            .collect();
        assert_eq!(next_runs, vec![102, 201]);
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
