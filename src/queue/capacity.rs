//! How much work the workers can take, and whether the ready backlog
//! outgrows it. Pure: the master feeds in job durations and backlog
//! samples, and logs and publishes what comes out.
//!
//! The seed's defaults (10 workers, a 10 s cooldown after every job in
//! single-job mode) run about one job a second in all. That is a choice an
//! operator can live with, but not one they should discover by finding
//! rules that ran late: the capacity is a gauge, and a backlog that keeps
//! rising says so.

use crate::model::Millis;

/// How much a new job duration moves the running mean: recent jobs count
/// most, and one odd job does not swing the figure.
const SMOOTHING: f64 = 0.1;

/// The steady rate the worker slots can sustain.
#[derive(Debug, Clone)]
pub struct Capacity {
    workers: usize,
    /// The rest a slot takes after each job before it runs another.
    rest_ms: Millis,
    mean_job_ms: Option<f64>,
}

impl Capacity {
    /// `rest_ms`: the cooldown in single-job mode, where each job's worker
    /// stops and a fresh one follows the cooldown; 0 when workers are reused.
    pub fn new(workers: usize, rest_ms: Millis) -> Capacity {
        Capacity {
            workers,
            rest_ms,
            mean_job_ms: None,
        }
    }

    /// A job held its worker for `duration_ms`.
    pub fn job_done(&mut self, duration_ms: Millis) {
        let duration = duration_ms.max(0) as f64;
        self.mean_job_ms = Some(match self.mean_job_ms {
            Some(mean) => mean + SMOOTHING * (duration - mean),
            None => duration,
        });
    }

    /// The mean time a job holds its worker, once a job has finished.
    pub fn mean_job_ms(&self) -> Option<f64> {
        self.mean_job_ms
    }

    /// Jobs per second with every slot busy: each slot runs a job of the
    /// mean length, then rests. Before any job finished, jobs count as
    /// instant, so the figure is the cooldown's bound. A millisecond floor
    /// keeps instant jobs with no cooldown finite.
    pub fn jobs_per_second(&self) -> f64 {
        let cycle_ms = self.mean_job_ms.unwrap_or(0.0) + self.rest_ms as f64;
        self.workers as f64 * 1000.0 / cycle_ms.max(1.0)
    }
}

/// What a closed window of backlog samples changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BacklogChange {
    /// The lowest backlog of the window just closed is above the lowest of
    /// the window before, which was above zero: the workers did not catch
    /// up once in two windows and fell further behind.
    Growing {
        lowest_before: usize,
        lowest_now: usize,
        backlog: usize,
    },
    /// After growing, the backlog reached zero in a window.
    CaughtUp,
}

/// Watches the ready backlog for growth that the workers never work off.
///
/// Bursts are normal: a thousand rules due at the top of the hour make a
/// backlog that drains. What matters is a backlog whose floor keeps
/// rising, so each window keeps its lowest sample, and growth is a floor
/// above the previous window's nonzero floor.
#[derive(Debug, Clone)]
pub struct BacklogTrend {
    window_ms: Millis,
    window_start: Option<Millis>,
    lowest_in_window: usize,
    lowest_before: Option<usize>,
    growing: bool,
}

impl BacklogTrend {
    pub fn new(window_ms: Millis) -> BacklogTrend {
        BacklogTrend {
            window_ms: window_ms.max(1),
            window_start: None,
            lowest_in_window: 0,
            lowest_before: None,
            growing: false,
        }
    }

    /// Whether the backlog is growing (from [`BacklogChange::Growing`]
    /// until [`BacklogChange::CaughtUp`]).
    pub fn is_growing(&self) -> bool {
        self.growing
    }

    /// Records the backlog seen at `now`. Reports a change when a window
    /// closes: growth each window it goes on, and the catch-up once.
    pub fn sample(&mut self, now: Millis, backlog: usize) -> Option<BacklogChange> {
        let Some(start) = self.window_start else {
            self.window_start = Some(now);
            self.lowest_in_window = backlog;
            return None;
        };
        self.lowest_in_window = self.lowest_in_window.min(backlog);
        if now - start < self.window_ms {
            return None;
        }
        let lowest_now = self.lowest_in_window;
        let change = match self.lowest_before {
            Some(lowest_before) if lowest_before > 0 && lowest_now > lowest_before => {
                self.growing = true;
                Some(BacklogChange::Growing {
                    lowest_before,
                    lowest_now,
                    backlog,
                })
            }
            _ if self.growing && lowest_now == 0 => {
                self.growing = false;
                Some(BacklogChange::CaughtUp)
            }
            _ => None,
        };
        self.lowest_before = Some(lowest_now);
        self.window_start = Some(now);
        // The sample that closes a window opens the next one.
        self.lowest_in_window = backlog;
        change
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Millis = 60_000;

    /// Samples every 10 s from `from`, with the backlog `at(t)`.
    fn run(
        trend: &mut BacklogTrend,
        from: Millis,
        to: Millis,
        at: impl Fn(Millis) -> usize,
    ) -> Vec<(Millis, BacklogChange)> {
        (from..to)
            .step_by(10_000)
            .filter_map(|t| trend.sample(t, at(t)).map(|change| (t, change)))
            .collect()
    }

    #[test]
    fn the_seed_defaults_run_about_one_job_a_second() {
        let mut capacity = Capacity::new(10, 10_000);
        assert_eq!(capacity.jobs_per_second(), 1.0);
        for _ in 0..100 {
            capacity.job_done(2_000);
        }
        let rate = capacity.jobs_per_second();
        assert!((rate - 10.0 / 12.0).abs() < 0.01, "{rate}");
    }

    #[test]
    fn reused_workers_are_bound_by_the_job_length_and_instant_jobs_stay_finite() {
        let mut capacity = Capacity::new(4, 0);
        assert_eq!(capacity.jobs_per_second(), 4_000.0);
        capacity.job_done(500);
        assert_eq!(capacity.jobs_per_second(), 8.0);
        assert_eq!(capacity.mean_job_ms(), Some(500.0));
    }

    #[test]
    fn one_long_job_moves_the_mean_a_little() {
        let mut capacity = Capacity::new(1, 0);
        capacity.job_done(100);
        capacity.job_done(10_100);
        assert_eq!(capacity.mean_job_ms(), Some(1_100.0));
    }

    #[test]
    fn a_burst_that_drains_is_not_growth() {
        let mut trend = BacklogTrend::new(MINUTE);
        // 5,000 rules at once, worked off at 10 a second.
        let changes = run(&mut trend, 0, 20 * MINUTE, |t| {
            5_000usize.saturating_sub((t / 100) as usize)
        });
        assert_eq!(changes, vec![]);
        assert!(!trend.is_growing());
    }

    #[test]
    fn bursts_that_arrive_faster_than_they_drain_are_growth() {
        let mut trend = BacklogTrend::new(MINUTE);
        // 5,000 rules every 5 minutes, worked off at 10 a second: 3,000 a
        // period, so 2,000 more remain after each.
        let backlog = |t: Millis| {
            let bursts = (t / (5 * MINUTE) + 1) as usize;
            (bursts * 5_000).saturating_sub((t / 100) as usize)
        };
        let changes = run(&mut trend, 0, 20 * MINUTE, backlog);
        let (first_at, first) = changes[0];
        assert!(first_at <= 7 * MINUTE, "seen at {first_at}");
        assert!(
            matches!(first, BacklogChange::Growing { lowest_before, lowest_now, .. } if lowest_now > lowest_before && lowest_before > 0),
            "{first:?}"
        );
        assert!(trend.is_growing());
    }

    #[test]
    fn a_steady_rise_is_growth_and_draining_to_zero_ends_it() {
        let mut trend = BacklogTrend::new(MINUTE);
        let rising = run(&mut trend, 0, 4 * MINUTE + 1, |t| 10 + (t / 1_000) as usize);
        assert!(
            rising
                .iter()
                .all(|(_, c)| matches!(c, BacklogChange::Growing { .. }))
        );
        assert!(
            !rising.is_empty() && rising[0].0 <= 2 * MINUTE,
            "{rising:?}"
        );
        // Shrinking but never empty: still behind, nothing new to say.
        let shrinking = run(&mut trend, 4 * MINUTE, 6 * MINUTE, |t| {
            (250 - (t - 4 * MINUTE) / 1_000) as usize
        });
        assert_eq!(shrinking, vec![]);
        assert!(trend.is_growing());
        let drained = run(&mut trend, 6 * MINUTE, 9 * MINUTE, |_| 0);
        assert_eq!(drained.len(), 1);
        assert_eq!(drained[0].1, BacklogChange::CaughtUp);
        assert!(!trend.is_growing());
    }

    #[test]
    fn an_idle_service_never_reports() {
        let mut trend = BacklogTrend::new(MINUTE);
        assert_eq!(run(&mut trend, 0, 60 * MINUTE, |_| 0), vec![]);
    }

    #[test]
    fn a_constant_backlog_is_behind_but_not_growing() {
        let mut trend = BacklogTrend::new(MINUTE);
        assert_eq!(run(&mut trend, 0, 10 * MINUTE, |_| 40), vec![]);
    }
}
