//! How far ahead of the workers the master claims. Pure: the master says
//! when a worker found the queue empty while a claim was on its way, and
//! how full the queue still was when a claim landed.
//!
//! A claim takes a commit to land, and meanwhile the workers eat into what
//! is queued. Two rounds of work (twice the worker count) cover that for
//! jobs that take a while, and with 50 workers even for instant ones. With
//! ten workers running instant jobs, two rounds last about as long as one
//! commit: the workers waited for every claim, and a 10,000 burst drained
//! at about 4,000 jobs/s on PostgreSQL where the same workers could run
//! 5,000 and more. How deep the queue must be depends on the job length
//! and the commit's, so the depth follows what happens: it doubles when a
//! worker waits for a claim on its way, and gives back a quarter when a
//! claim lands on a queue still more than half full. Two rounds are the
//! floor; the ceiling keeps a claim from being held much longer than the
//! workers need to reach it, since a queued claim is a lease the other
//! instances cannot take. A depth that no wait has called for in a few
//! seconds goes back to the floor: the next burst may be of long jobs,
//! and claiming sixteen rounds of those would hold them from the peers
//! (and, on a crash, leave that many to take over).

use crate::model::Millis;

/// The most rounds of work claimed ahead of the workers.
const MAX_ROUNDS: usize = 16;

/// How long a depth above the floor lasts without a worker waiting for a
/// claim.
const KEEP_DEEP_MS: Millis = 5_000;

#[derive(Debug, Clone)]
pub struct ClaimDepth {
    workers: usize,
    /// Jobs to keep queued or being claimed beyond the idle workers.
    ahead: usize,
    /// The claim on its way took all the room there was, to top up a
    /// queue that still held jobs: not to fill an empty one (a burst's
    /// start), and not the last few ready jobs, which no depth makes more.
    topping_up: bool,
    /// A worker found the queue empty while such a claim was on its way.
    ran_dry: bool,
    /// When a wait last deepened the queue.
    deepened_at: Millis,
}

impl ClaimDepth {
    pub fn new(workers: usize) -> ClaimDepth {
        let workers = workers.max(1);
        ClaimDepth {
            workers,
            ahead: 2 * workers,
            topping_up: false,
            ran_dry: false,
            deepened_at: 0,
        }
    }

    /// Jobs kept queued or being claimed beyond the idle workers.
    pub fn ahead(&self) -> usize {
        self.ahead
    }

    /// How many more jobs the master may claim: enough to keep the idle
    /// workers busy plus the depth. Nothing until a quarter of the depth
    /// has room: topping up one or two jobs at a time walked the plan and
    /// committed a claim for each finished job, and a 10,000 burst with 50
    /// workers drained at 7,000 jobs/s on SQLite and 2,900 on PostgreSQL
    /// instead of 10,000 and 5,600.
    pub fn room(&self, idle_workers: usize, queued_or_claiming: usize) -> usize {
        let room = (idle_workers + self.ahead).saturating_sub(queued_or_claiming);
        if room >= (self.ahead / 4).max(1) {
            room
        } else {
            0
        }
    }

    /// Back to the floor once no wait has called for the depth in
    /// [`KEEP_DEEP_MS`]; the master asks before it looks for work.
    pub fn settle(&mut self, now: Millis) {
        if now - self.deepened_at > KEEP_DEEP_MS {
            self.ahead = 2 * self.workers;
        }
    }

    /// A claim is sent while `queued` jobs wait in the queue; `filled`
    /// when it takes all the room (more were ready).
    pub fn claim_sent(&mut self, queued: usize, filled: bool) {
        self.topping_up = queued > 0 && filled;
    }

    /// A worker is idle, nothing is queued, and a claim is on its way. If
    /// that claim was sent to top the queue up, the queue was too short to
    /// cover its commit. A claim sent to an empty queue (a burst's first,
    /// or the first after a quiet spell), or one that took every ready job,
    /// says nothing of the depth.
    pub fn worker_waits_for_a_claim(&mut self) {
        self.ran_dry |= self.topping_up;
    }

    /// A claim landed at `now` with `still_queued` jobs left from before
    /// it. Deeper if a worker waited for it and it went as claims should
    /// (`clean`: it won rules, and none failed); a claim slowed by an
    /// outage, or lost to a peer, says nothing of the depth. Shallower if
    /// the queue would have lasted twice as long.
    pub fn claim_landed(&mut self, still_queued: usize, clean: bool, now: Millis) {
        let floor = 2 * self.workers;
        if std::mem::take(&mut self.ran_dry) && clean {
            self.ahead = (self.ahead * 2).min(MAX_ROUNDS * self.workers);
            self.deepened_at = now;
        } else if still_queued > self.ahead / 2 {
            self.ahead = (self.ahead - self.ahead / 4).max(floor);
        }
    }

    /// A worker's wait no longer counts: the queue was emptied on purpose
    /// (a fence, a drain, the memory guard), not eaten by the workers.
    pub fn queue_emptied(&mut self) {
        self.ran_dry = false;
        self.topping_up = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_wait_for_a_quarter_of_the_depth_then_fill_it() {
        let depth = ClaimDepth::new(50);
        // Nothing queued, all 50 idle: the free workers and two rounds.
        assert_eq!(depth.room(50, 0), 150);
        // Busy workers, two rounds queued: nothing to claim.
        assert_eq!(depth.room(0, 100), 0);
        // A few jobs short of full: wait, do not walk the plan for them.
        assert_eq!(depth.room(0, 76), 0);
        // Half a round short: top up all the way.
        assert_eq!(depth.room(0, 75), 25);
        assert_eq!(depth.room(3, 60), 43);
        // One worker still claims one job at a time.
        let one = ClaimDepth::new(1);
        assert_eq!(one.room(1, 0), 3);
        assert_eq!(one.room(0, 1), 1);
        assert_eq!(one.room(0, 2), 0);
    }

    /// One claim that a worker waited for.
    fn waited_for(depth: &mut ClaimDepth, now: Millis) {
        depth.claim_sent(1, true);
        depth.worker_waits_for_a_claim();
        depth.claim_landed(0, true, now);
    }

    #[test]
    fn the_depth_doubles_when_a_worker_waited_for_a_claim_up_to_sixteen_rounds() {
        let mut depth = ClaimDepth::new(10);
        assert_eq!(depth.ahead(), 20);
        depth.claim_sent(0, true);
        depth.worker_waits_for_a_claim();
        depth.claim_landed(0, true, 0);
        assert_eq!(
            depth.ahead(),
            20,
            "a claim sent to an empty queue is no measure"
        );
        depth.claim_sent(3, false);
        depth.worker_waits_for_a_claim();
        depth.claim_landed(0, true, 0);
        assert_eq!(depth.ahead(), 20, "nor one that took every ready job");
        depth.claim_sent(3, true);
        depth.worker_waits_for_a_claim();
        depth.claim_landed(0, false, 0);
        assert_eq!(depth.ahead(), 20, "nor one that failed or was lost");
        depth.claim_sent(3, true);
        depth.worker_waits_for_a_claim();
        depth.queue_emptied();
        depth.claim_landed(0, true, 0);
        assert_eq!(depth.ahead(), 20, "nor a queue emptied on purpose");
        depth.claim_sent(3, true);
        depth.worker_waits_for_a_claim();
        depth.worker_waits_for_a_claim();
        depth.claim_landed(0, true, 0);
        assert_eq!(
            depth.ahead(),
            40,
            "one doubling per claim, however many waited"
        );
        depth.claim_sent(3, true);
        depth.claim_landed(0, true, 0);
        assert_eq!(depth.ahead(), 40, "nobody waited, the queue ran low: kept");
        depth.claim_sent(3, true);
        depth.worker_waits_for_a_claim();
        depth.claim_sent(2, true);
        depth.claim_landed(0, true, 0);
        assert_eq!(
            depth.ahead(),
            80,
            "a wait counts though the next claim left meanwhile"
        );
        depth.claim_landed(0, true, 0);
        assert_eq!(depth.ahead(), 80, "once");
        for _ in 0..10 {
            waited_for(&mut depth, 0);
        }
        assert_eq!(depth.ahead(), 160);
        assert_eq!(depth.room(10, 0), 170);
    }

    #[test]
    fn the_depth_gives_back_a_quarter_while_claims_land_on_a_full_queue_down_to_two_rounds() {
        let mut depth = ClaimDepth::new(10);
        for _ in 0..3 {
            waited_for(&mut depth, 0);
        }
        assert_eq!(depth.ahead(), 160);
        depth.claim_landed(81, true, 0);
        assert_eq!(depth.ahead(), 120);
        depth.claim_landed(60, true, 0);
        assert_eq!(depth.ahead(), 120, "half full is not more than half");
        for _ in 0..20 {
            depth.claim_landed(1_000, true, 0);
        }
        assert_eq!(depth.ahead(), 20);
    }

    #[test]
    fn a_depth_no_wait_called_for_in_five_seconds_goes_back_to_two_rounds() {
        let mut depth = ClaimDepth::new(10);
        for _ in 0..3 {
            waited_for(&mut depth, 1_000);
        }
        depth.settle(6_000);
        assert_eq!(depth.ahead(), 160, "five seconds since the last wait: kept");
        waited_for(&mut depth, 6_000);
        depth.settle(11_000);
        assert_eq!(depth.ahead(), 160);
        depth.settle(11_001);
        assert_eq!(depth.ahead(), 20);
    }
}
