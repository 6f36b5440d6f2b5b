//! The master's job queue (seed 004): due order, FIFO among jobs due
//! together, O(1) dedup, active-job tracking and the recently-processed
//! window. Pure: no actors, no I/O.

mod capacity;
mod depth;
mod pool;
mod start_lag;

pub use capacity::{BacklogChange, BacklogTrend, Capacity};
pub use depth::ClaimDepth;
pub use pool::WorkerPool;
pub use start_lag::{LagPoint, StartLagHistory, StartLagSeries};

use std::collections::{HashMap, HashSet, VecDeque};

use serde::Serialize;
use uuid::Uuid;

use crate::model::Millis;

/// Why a ready rule was not queued: the `reason` label of
/// `ruled_jobs_deduplicated_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DedupReason {
    /// Already waiting in the queue.
    Queued,
    /// A worker is running it.
    Active,
    /// Finished within RECENTLY_PROCESSED_SECONDS, and the plan still
    /// shows the occurrence it ran as due.
    Recent,
    /// The plan says it is running.
    Running,
}

impl DedupReason {
    pub const ALL: [DedupReason; 4] = [
        DedupReason::Queued,
        DedupReason::Active,
        DedupReason::Recent,
        DedupReason::Running,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DedupReason::Queued => "queued",
            DedupReason::Active => "active",
            DedupReason::Recent => "recent",
            DedupReason::Running => "running",
        }
    }
}

/// Seed 004's queue statistics.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct QueueStats {
    pub queue_size: usize,
    pub active_jobs: usize,
    pub active_job_ids: Vec<Uuid>,
    pub queued_job_ids: Vec<Uuid>,
    pub total_workers: usize,
    pub alive_workers: usize,
}

/// Jobs keyed by branch rule id. `J` is whatever the master queues.
#[derive(Debug)]
pub struct JobQueue<J> {
    queued: VecDeque<(Uuid, J)>,
    queued_ids: HashSet<Uuid>,
    active: HashMap<Uuid, Uuid>,
    /// The due time each queued or active job was claimed at.
    claimed_due: HashMap<Uuid, Millis>,
    /// When each job finished, and the due time it was claimed at.
    recently_processed: HashMap<Uuid, (Millis, Option<Millis>)>,
    /// The same finishes in the order they came, so pruning reads only
    /// the expired ones: walking the whole map on every tick cost a
    /// 100,000 burst, whose window holds tens of thousands of finishes,
    /// a fifth of the master's time.
    finish_order: VecDeque<(Millis, Uuid)>,
    recent_window_ms: Millis,
}

impl<J> JobQueue<J> {
    pub fn new(recent_window_ms: Millis) -> JobQueue<J> {
        JobQueue {
            queued: VecDeque::new(),
            queued_ids: HashSet::new(),
            active: HashMap::new(),
            claimed_due: HashMap::new(),
            recently_processed: HashMap::new(),
            finish_order: VecDeque::new(),
            recent_window_ms,
        }
    }

    /// The four checks of seed 004, cheapest first. `Ok` means the rule may
    /// be claimed and queued. The recent check guards against a plan that
    /// has not caught up with a finish: it refuses only while the plan still
    /// shows the due time the finished job was claimed at (`due`). A new
    /// due time (a retry, a buffered overlap, a catch-up run) is the
    /// finish's own answer and runs at once.
    pub fn admit(
        &self,
        id: Uuid,
        now: Millis,
        running_in_plan: bool,
        due: Option<Millis>,
    ) -> Result<(), DedupReason> {
        if self.queued_ids.contains(&id) {
            return Err(DedupReason::Queued);
        }
        if self.active.contains_key(&id) {
            return Err(DedupReason::Active);
        }
        if self.recently_processed.get(&id).is_some_and(|&(at, ran)| {
            now - at < self.recent_window_ms && (ran.is_none() || ran == due)
        }) {
            return Err(DedupReason::Recent);
        }
        if running_in_plan {
            return Err(DedupReason::Running);
        }
        Ok(())
    }

    /// Queues a job; a rule already queued or active is refused (and the job
    /// handed back) so a race between two fetches cannot double it.
    pub fn push(&mut self, id: Uuid, due: Option<Millis>, job: J) -> Result<(), J> {
        if self.queued_ids.contains(&id) || self.active.contains_key(&id) {
            return Err(job);
        }
        self.queued_ids.insert(id);
        // Claims come back in whatever order their commits finish: a job
        // goes in behind every queued one due no later than it, so the
        // queue stays in due order and first come first served among
        // equals (a burst's jobs simply go to the back).
        let mut at = self.queued.len();
        if let Some(due) = due {
            self.claimed_due.insert(id, due);
            while at > 0
                && self
                    .due_of(self.queued[at - 1].0)
                    .is_some_and(|before| before > due)
            {
                at -= 1;
            }
        }
        self.queued.insert(at, (id, job));
        Ok(())
    }

    /// When the next queued job was due, if it was claimed for a due time.
    pub fn next_due(&self) -> Option<Millis> {
        self.queued.front().and_then(|(id, _)| self.due_of(*id))
    }

    fn due_of(&self, id: Uuid) -> Option<Millis> {
        self.claimed_due.get(&id).copied()
    }

    /// Takes the oldest job and marks it active under `execution_id`.
    pub fn start_next(&mut self, execution_id: impl FnOnce(&J) -> Uuid) -> Option<(Uuid, J)> {
        let (id, job) = self.queued.pop_front()?;
        self.queued_ids.remove(&id);
        self.active.insert(id, execution_id(&job));
        Some((id, job))
    }

    /// Takes a queued job out before it started (cancellation before the
    /// handoff). Returns it so its execution can be recorded Cancelled.
    pub fn remove_queued(&mut self, id: Uuid) -> Option<J> {
        if !self.queued_ids.remove(&id) {
            return None;
        }
        let position = self.queued.iter().position(|(queued, _)| *queued == id)?;
        self.queued.remove(position).map(|(_, job)| job)
    }

    /// The queued job of a rule, if any.
    pub fn queued(&self, id: &Uuid) -> Option<&J> {
        if !self.queued_ids.contains(id) {
            return None;
        }
        self.queued
            .iter()
            .find(|(queued, _)| queued == id)
            .map(|(_, job)| job)
    }

    /// Every queued job, oldest first, to change in place.
    pub fn queued_jobs_mut(&mut self) -> impl Iterator<Item = &mut J> {
        self.queued.iter_mut().map(|(_, job)| job)
    }

    /// The rule of the first queued job matching `matches`.
    pub fn find_queued(&self, matches: impl Fn(&J) -> bool) -> Option<Uuid> {
        self.queued
            .iter()
            .find(|(_, job)| matches(job))
            .map(|(id, _)| *id)
    }

    /// Every queued job, oldest first.
    pub fn queued_jobs(&self) -> impl Iterator<Item = &J> {
        self.queued.iter().map(|(_, job)| job)
    }

    /// Every queued job, oldest first, emptying the queue (shutdown).
    pub fn drain_queued(&mut self) -> Vec<(Uuid, J)> {
        self.drain_queued_with_due()
            .into_iter()
            .map(|(id, _, job)| (id, job))
            .collect()
    }

    /// [`drain_queued`](Self::drain_queued), each job with when it is due
    /// to start (after now for a claim made ahead of its due time).
    pub fn drain_queued_with_due(&mut self) -> Vec<(Uuid, Option<Millis>, J)> {
        self.queued_ids.clear();
        let claimed_due = &mut self.claimed_due;
        self.queued
            .drain(..)
            .map(|(id, job)| (id, claimed_due.remove(&id), job))
            .collect()
    }

    /// The claim of `id` was given back unrun (its occurrence stays due):
    /// unlike [`finish`](Self::finish), it may be admitted again at once.
    pub fn forget(&mut self, id: Uuid) {
        self.active.remove(&id);
        self.claimed_due.remove(&id);
    }

    /// Forgets every recently-processed entry: after a recovery released
    /// this instance's claims, their occurrences are due again at once.
    pub fn forget_recent(&mut self) {
        self.recently_processed.clear();
        self.finish_order.clear();
    }

    /// The job of `id` finished at `now`; it is not admitted again within
    /// the recent window.
    pub fn finish(&mut self, id: Uuid, now: Millis) -> bool {
        let was_active = self.active.remove(&id).is_some();
        let due = self.claimed_due.remove(&id);
        self.recently_processed.insert(id, (now, due));
        self.finish_order.push_back((now, id));
        was_active
    }

    /// Forgets recently-processed entries older than the window, so the map
    /// stays as small as the jobs of the last few seconds.
    pub fn prune(&mut self, now: Millis) {
        while let Some(&(at, id)) = self.finish_order.front() {
            if now - at < self.recent_window_ms {
                break;
            }
            self.finish_order.pop_front();
            // A rule that finished again since keeps its later finish.
            if self
                .recently_processed
                .get(&id)
                .is_some_and(|&(latest, _)| latest == at)
            {
                self.recently_processed.remove(&id);
            }
        }
    }

    pub fn active_execution(&self, id: &Uuid) -> Option<Uuid> {
        self.active.get(id).copied()
    }

    pub fn is_active(&self, id: &Uuid) -> bool {
        self.active.contains_key(id)
    }

    pub fn queued_len(&self) -> usize {
        self.queued.len()
    }

    pub fn active_len(&self) -> usize {
        self.active.len()
    }

    pub fn is_idle(&self) -> bool {
        self.queued.is_empty() && self.active.is_empty()
    }

    pub fn stats(&self, total_workers: usize, alive_workers: usize) -> QueueStats {
        let mut active_job_ids: Vec<Uuid> = self.active.keys().copied().collect();
        active_job_ids.sort();
        QueueStats {
            queue_size: self.queued.len(),
            active_jobs: self.active.len(),
            active_job_ids,
            queued_job_ids: self.queued.iter().map(|(id, _)| *id).collect(),
            total_workers,
            alive_workers,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    #[test]
    fn each_dedup_check_on_its_own() {
        let mut queue: JobQueue<&str> = JobQueue::new(30_000);
        assert_eq!(queue.admit(id(1), 0, false, None), Ok(()));
        assert_eq!(queue.admit(id(1), 0, true, None), Err(DedupReason::Running));

        queue.push(id(1), None, "one").unwrap();
        assert_eq!(queue.admit(id(1), 0, false, None), Err(DedupReason::Queued));

        let (started, job) = queue.start_next(|_| id(100)).unwrap();
        assert_eq!((started, job), (id(1), "one"));
        assert_eq!(queue.admit(id(1), 0, false, None), Err(DedupReason::Active));
        assert_eq!(queue.active_execution(&id(1)), Some(id(100)));

        assert!(queue.finish(id(1), 1_000));
        assert_eq!(
            queue.admit(id(1), 30_999, false, None),
            Err(DedupReason::Recent)
        );
        assert_eq!(queue.admit(id(1), 31_000, false, None), Ok(()));
    }

    #[test]
    fn jobs_start_in_due_order_however_their_claims_come_back() {
        let mut queue: JobQueue<&str> = JobQueue::new(30_000);
        // A burst: due together, first come first served.
        queue.push(id(1), Some(1_000), "a").unwrap();
        queue.push(id(2), Some(1_000), "b").unwrap();
        // Claims of later fetches, come back out of due order.
        queue.push(id(3), Some(1_120), "e").unwrap();
        queue.push(id(4), Some(1_030), "c").unwrap();
        queue.push(id(5), Some(1_090), "d").unwrap();
        queue.push(id(6), None, "run now").unwrap();
        assert_eq!(queue.next_due(), Some(1_000));
        let order: Vec<&str> =
            std::iter::from_fn(|| queue.start_next(|_| id(100)).map(|(_, job)| job)).collect();
        assert_eq!(order, ["a", "b", "c", "d", "e", "run now"]);
        assert_eq!(queue.next_due(), None);
    }

    #[test]
    fn a_new_due_time_after_a_finish_is_admitted_at_once() {
        let mut queue: JobQueue<&str> = JobQueue::new(30_000);
        queue.push(id(1), Some(60_000), "one").unwrap();
        queue.start_next(|_| id(100));
        queue.finish(id(1), 61_000);
        // The plan has not caught up: the occurrence that ran is refused.
        assert_eq!(
            queue.admit(id(1), 61_500, false, Some(60_000)),
            Err(DedupReason::Recent)
        );
        // A retry or a buffered occurrence is the finish's own answer.
        assert_eq!(queue.admit(id(1), 61_500, false, Some(62_000)), Ok(()));
    }

    #[test]
    fn a_claim_given_back_or_recovered_is_admitted_at_once() {
        let mut queue: JobQueue<&str> = JobQueue::new(30_000);
        queue.push(id(1), Some(60_000), "one").unwrap();
        queue.drain_queued();
        queue.forget(id(1));
        assert_eq!(queue.admit(id(1), 60_100, false, Some(60_000)), Ok(()));
        queue.push(id(2), Some(60_000), "two").unwrap();
        queue.start_next(|_| id(200));
        queue.finish(id(2), 61_000);
        assert_eq!(
            queue.admit(id(2), 61_500, false, Some(60_000)),
            Err(DedupReason::Recent)
        );
        queue.forget_recent();
        assert_eq!(queue.admit(id(2), 61_500, false, Some(60_000)), Ok(()));
    }

    #[test]
    fn fifo_order_and_no_doubles() {
        let mut queue: JobQueue<u32> = JobQueue::new(0);
        for n in 1..=3 {
            queue.push(id(n), None, n as u32).unwrap();
        }
        assert_eq!(queue.push(id(2), None, 99), Err(99));
        let order: Vec<u32> =
            std::iter::from_fn(|| queue.start_next(|_| Uuid::nil()).map(|(_, j)| j)).collect();
        assert_eq!(order, vec![1, 2, 3]);
        assert_eq!(queue.push(id(1), None, 7), Err(7), "active: refused");
    }

    #[test]
    fn cancel_before_start_and_drain() {
        let mut queue: JobQueue<u32> = JobQueue::new(0);
        for n in 1..=4 {
            queue.push(id(n), None, n as u32).unwrap();
        }
        assert_eq!(queue.queued(&id(3)), Some(&3));
        assert_eq!(queue.find_queued(|&job| job == 4), Some(id(4)));
        assert_eq!(queue.find_queued(|&job| job == 9), None);
        assert_eq!(queue.remove_queued(id(2)), Some(2));
        assert_eq!(queue.remove_queued(id(2)), None);
        assert_eq!(queue.admit(id(2), 0, false, None), Ok(()));
        let drained: Vec<u32> = queue.drain_queued().into_iter().map(|(_, j)| j).collect();
        assert_eq!(drained, vec![1, 3, 4]);
        assert!(queue.is_idle());
    }

    #[test]
    fn stats_and_pruning() {
        let mut queue: JobQueue<u32> = JobQueue::new(10);
        queue.push(id(1), None, 1).unwrap();
        queue.push(id(2), None, 2).unwrap();
        queue.start_next(|_| id(50));
        let stats = queue.stats(10, 9);
        assert_eq!(stats.queue_size, 1);
        assert_eq!(stats.active_jobs, 1);
        assert_eq!(stats.active_job_ids, vec![id(1)]);
        assert_eq!(stats.queued_job_ids, vec![id(2)]);
        assert_eq!((stats.total_workers, stats.alive_workers), (10, 9));
        queue.finish(id(1), 0);
        queue.prune(10);
        assert_eq!(queue.admit(id(1), 10, false, None), Ok(()));
        assert!(queue.recently_processed.is_empty());
    }

    #[test]
    fn pruning_forgets_only_finishes_older_than_the_window() {
        let mut queue: JobQueue<u32> = JobQueue::new(10);
        queue.finish(id(1), 0);
        queue.finish(id(2), 4);
        // Rule 1 finished again: its first finish expiring must not make
        // the rule admissible while its second is recent.
        queue.finish(id(1), 8);
        queue.prune(12);
        assert_eq!(
            queue.admit(id(1), 12, false, None),
            Err(DedupReason::Recent)
        );
        assert_eq!(
            queue.admit(id(2), 12, false, None),
            Err(DedupReason::Recent)
        );
        assert_eq!(queue.recently_processed.len(), 2);
        queue.prune(14);
        assert_eq!(queue.admit(id(2), 14, false, None), Ok(()));
        assert_eq!(
            queue.admit(id(1), 14, false, None),
            Err(DedupReason::Recent)
        );
        assert_eq!(queue.recently_processed.len(), 1);
        queue.prune(18);
        assert!(queue.recently_processed.is_empty());
        assert!(queue.finish_order.is_empty());
    }
}
