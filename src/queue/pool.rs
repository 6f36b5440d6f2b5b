//! The master's worker bookkeeping (seed 004): which workers live, which
//! wait for a job and which run one. Pure: the master keeps actor
//! references in it, the tests plain numbers.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

use crate::model::Millis;

/// Workers keyed by `K` (an actor id), with a handle `W` each and the job
/// `J` a busy one runs, with when it was handed over.
#[derive(Debug)]
pub struct WorkerPool<K, W, J> {
    capacity: usize,
    /// Multi-job mode: a worker that finished a job takes the next one;
    /// in single-job mode it stops and a fresh one replaces it.
    reuse: bool,
    alive: HashMap<K, W>,
    idle: VecDeque<K>,
    busy: HashMap<K, (J, Millis)>,
    next_number: u64,
}

impl<K: Copy + Eq + Hash, W, J> WorkerPool<K, W, J> {
    pub fn new(capacity: usize, reuse: bool) -> Self {
        WorkerPool {
            capacity,
            reuse,
            alive: HashMap::new(),
            idle: VecDeque::new(),
            busy: HashMap::new(),
            next_number: 1,
        }
    }

    /// Room for one more worker (WORKER_COUNT not reached).
    pub fn has_room(&self) -> bool {
        self.alive.len() < self.capacity
    }

    /// The number the next worker gets (`Worker-N` in the log).
    pub fn next_number(&mut self) -> u64 {
        let number = self.next_number;
        self.next_number += 1;
        number
    }

    /// A worker started and waits for a job.
    pub fn started(&mut self, key: K, handle: W) {
        self.alive.insert(key, handle);
        self.idle.push_back(key);
    }

    /// The longest-waiting idle worker, taken out of the idle line.
    pub fn take_idle(&mut self) -> Option<(K, &W)> {
        while let Some(key) = self.idle.pop_front() {
            if let Some(handle) = self.alive.get(&key) {
                return Some((key, handle));
            }
        }
        None
    }

    /// The worker taken with [`WorkerPool::take_idle`] runs `job` from `at`.
    pub fn assign(&mut self, key: K, job: J, at: Millis) {
        self.busy.insert(key, (job, at));
    }

    /// The worker's job is over: its job, if it had one, and when it was
    /// handed over. In multi-job mode a live worker goes back to the idle
    /// line. Idempotent.
    pub fn job_done(&mut self, key: K) -> Option<(J, Millis)> {
        let done = self.busy.remove(&key)?;
        if self.reuse && self.alive.contains_key(&key) {
            self.idle.push_back(key);
        }
        Some(done)
    }

    /// Whether the worker runs a job.
    pub fn is_busy(&self, key: K) -> bool {
        self.busy.contains_key(&key)
    }

    /// A worker that will stop by itself once its last write commits:
    /// its slot is free now. `false` when it was not alive. A busy worker
    /// stays busy until [`WorkerPool::job_done`].
    pub fn retire(&mut self, key: K) -> bool {
        self.idle.retain(|idle| *idle != key);
        self.alive.remove(&key).is_some()
    }

    /// The worker stopped. `None` when it was not known (a second report);
    /// else whether it held a job, which stays busy until
    /// [`WorkerPool::job_done`] so the caller can record it first.
    pub fn gone(&mut self, key: K) -> Option<Option<&J>> {
        self.alive.remove(&key)?;
        self.idle.retain(|idle| *idle != key);
        Some(self.busy.get(&key).map(|(job, _)| job))
    }

    pub fn handles(&self) -> impl Iterator<Item = &W> {
        self.alive.values()
    }

    /// Each busy worker's handle (if it still lives) and job.
    pub fn busy(&self) -> impl Iterator<Item = (Option<&W>, &J)> {
        self.busy
            .iter()
            .map(|(key, (job, _))| (self.alive.get(key), job))
    }

    pub fn idle_len(&self) -> usize {
        self.idle.len()
    }

    pub fn alive_len(&self) -> usize {
        self.alive.len()
    }

    pub fn busy_len(&self) -> usize {
        self.busy.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_job_workers_are_used_once() {
        let mut pool: WorkerPool<u32, &str, &str> = WorkerPool::new(2, false);
        assert_eq!((pool.next_number(), pool.next_number()), (1, 2));
        pool.started(1, "w1");
        pool.started(2, "w2");
        assert!(!pool.has_room());
        let (key, handle) = pool.take_idle().unwrap();
        assert_eq!((key, *handle), (1, "w1"));
        pool.assign(1, "job-a", 5);
        assert_eq!((pool.idle_len(), pool.busy_len()), (1, 1));
        assert_eq!(pool.job_done(1), Some(("job-a", 5)));
        assert_eq!(pool.job_done(1), None, "a second report changes nothing");
        // Single-job mode: the worker does not come back to the line.
        assert_eq!(pool.take_idle().map(|(k, _)| k), Some(2));
        assert_eq!(pool.take_idle().map(|(k, _)| k), None);
        assert_eq!(pool.gone(1), Some(None));
        assert_eq!(pool.gone(1), None);
        assert!(pool.has_room());
    }

    #[test]
    fn a_retired_worker_frees_its_slot_before_it_stops() {
        let mut pool: WorkerPool<u32, &str, &str> = WorkerPool::new(1, false);
        pool.started(1, "w1");
        let (key, _) = pool.take_idle().unwrap();
        pool.assign(key, "job", 3);
        assert!(pool.is_busy(1));
        assert_eq!(pool.job_done(1), Some(("job", 3)));
        assert!(!pool.is_busy(1));
        assert!(pool.retire(1));
        assert!(pool.has_room(), "its replacement may start");
        assert!(!pool.retire(1));
        pool.started(2, "w2");
        assert!(!pool.has_room());
        // Its stop, when its write has committed, is not news.
        assert_eq!(pool.gone(1), None);
        assert_eq!(pool.take_idle().map(|(k, _)| k), Some(2));
    }

    #[test]
    fn multi_job_workers_return_to_the_line() {
        let mut pool: WorkerPool<u32, &str, &str> = WorkerPool::new(1, true);
        pool.started(7, "w");
        let (key, _) = pool.take_idle().unwrap();
        pool.assign(key, "job", 0);
        pool.job_done(key);
        assert_eq!(pool.take_idle().map(|(k, _)| k), Some(7));
    }

    #[test]
    fn a_worker_that_dies_busy_keeps_its_job_until_recorded() {
        let mut pool: WorkerPool<u32, &str, &str> = WorkerPool::new(3, true);
        pool.started(1, "w1");
        pool.started(2, "w2");
        let (key, _) = pool.take_idle().unwrap();
        pool.assign(key, "job", 0);
        assert_eq!(pool.gone(1), Some(Some(&"job")));
        let busy: Vec<_> = pool.busy().collect();
        assert_eq!(busy, vec![(None, &"job")]);
        // Dead workers never come back to the idle line, even when reused.
        assert_eq!(pool.job_done(1), Some(("job", 0)));
        assert_eq!(pool.take_idle().map(|(k, _)| k), Some(2));
        assert_eq!(pool.take_idle().map(|(k, _)| k), None);
        // An idle worker that dies leaves the line.
        pool.started(3, "w3");
        assert_eq!(pool.gone(3), Some(None));
        assert!(pool.take_idle().is_none());
        assert_eq!(pool.alive_len(), 1);
    }
}
