//! How late jobs start, minute by minute over the last quarter hour: the
//! console's start-lag chart. Prometheus has the full histogram
//! (`ruled_dispatch_lag_seconds`); this is the in-process view for an
//! operator without Prometheus at hand. Constant memory whatever the job
//! rate: each minute keeps a log-scale histogram, not samples. Pure.

use serde::Serialize;

use crate::model::Millis;

/// Minutes kept, the current one included.
pub const WINDOW_MINUTES: usize = 15;
const MINUTE_MS: Millis = 60_000;
/// Each bucket's upper bound is this much above the previous one, so a
/// percentile is known within 10%.
const GROWTH: f64 = 1.1;
/// Buckets from 1 ms up to past an hour; a longer lag lands in the last.
const BUCKETS: usize = 162;

#[derive(Debug, Clone)]
struct Minute {
    /// `at / MINUTE_MS` of the starts counted here.
    index: i64,
    counts: [u32; BUCKETS],
    max_ms: Millis,
}

impl Minute {
    fn new(index: i64) -> Minute {
        Minute {
            index,
            counts: [0; BUCKETS],
            max_ms: 0,
        }
    }

    fn total(&self) -> u64 {
        self.counts.iter().map(|&c| u64::from(c)).sum()
    }
}

/// One minute of the chart (or the whole window, for the summary).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct LagPoint {
    /// The minute's start, epoch milliseconds (the whole window's, for the
    /// summary).
    pub minute: Millis,
    /// Jobs that started in it.
    pub starts: u64,
    pub p50_ms: Option<Millis>,
    pub p99_ms: Option<Millis>,
}

/// The chart's data: one point per minute, oldest first, and the whole
/// window's percentiles.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct StartLagSeries {
    pub minutes: Vec<LagPoint>,
    pub window: LagPoint,
}

#[derive(Debug, Clone, Default)]
pub struct StartLagHistory {
    /// By minute index modulo the window.
    minutes: Vec<Option<Minute>>,
}

/// Bucket 0 holds on-time starts; bucket `b` the lags up to `GROWTH^(b-1)`.
fn bucket_of(lag_ms: Millis) -> usize {
    if lag_ms <= 0 {
        return 0;
    }
    let index = 1 + ((lag_ms as f64).ln() / GROWTH.ln()).ceil() as usize;
    index.min(BUCKETS - 1)
}

fn upper_bound(bucket: usize) -> Millis {
    match bucket {
        0 => 0,
        // The last bucket has no bound: the largest lag seen is its answer.
        b if b == BUCKETS - 1 => Millis::MAX,
        b => GROWTH.powi(b as i32 - 1).ceil() as Millis,
    }
}

impl StartLagHistory {
    pub fn new() -> StartLagHistory {
        StartLagHistory {
            minutes: vec![None; WINDOW_MINUTES],
        }
    }

    /// A job started `lag_ms` after its scheduled time, at `at`.
    pub fn record(&mut self, at: Millis, lag_ms: Millis) {
        let index = at.div_euclid(MINUTE_MS);
        let slot = &mut self.minutes[index.rem_euclid(WINDOW_MINUTES as i64) as usize];
        if slot.as_ref().is_none_or(|minute| minute.index != index) {
            if slot.as_ref().is_some_and(|minute| minute.index > index) {
                // Older than the window the slot already shows.
                return;
            }
            *slot = Some(Minute::new(index));
        }
        if let Some(minute) = slot {
            let lag_ms = lag_ms.max(0);
            minute.counts[bucket_of(lag_ms)] += 1;
            minute.max_ms = minute.max_ms.max(lag_ms);
        }
    }

    /// The last [`WINDOW_MINUTES`] minutes up to `now`, a point for each
    /// (empty minutes included, so the chart's axis is time).
    pub fn series(&self, now: Millis) -> StartLagSeries {
        let current = now.div_euclid(MINUTE_MS);
        let first = current - WINDOW_MINUTES as i64 + 1;
        let mut whole = Minute::new(first);
        let minutes = (first..=current)
            .map(|index| {
                let slot = &self.minutes[index.rem_euclid(WINDOW_MINUTES as i64) as usize];
                match slot.as_ref().filter(|minute| minute.index == index) {
                    Some(minute) => {
                        for (sum, count) in whole.counts.iter_mut().zip(minute.counts) {
                            *sum += count;
                        }
                        whole.max_ms = whole.max_ms.max(minute.max_ms);
                        point(minute, index * MINUTE_MS)
                    }
                    None => point(&Minute::new(index), index * MINUTE_MS),
                }
            })
            .collect();
        StartLagSeries {
            minutes,
            window: point(&whole, first * MINUTE_MS),
        }
    }
}

fn point(minute: &Minute, start: Millis) -> LagPoint {
    let starts = minute.total();
    LagPoint {
        minute: start,
        starts,
        p50_ms: percentile(minute, starts, 0.50),
        p99_ms: percentile(minute, starts, 0.99),
    }
}

/// The bucket's upper bound holding the `q` quantile, no more than the
/// largest lag seen (so one 3 ms start reads 3, not the bucket's 3.1).
fn percentile(minute: &Minute, starts: u64, q: f64) -> Option<Millis> {
    if starts == 0 {
        return None;
    }
    let rank = ((starts as f64) * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (bucket, &count) in minute.counts.iter().enumerate() {
        seen += u64::from(count);
        if seen >= rank {
            return Some(upper_bound(bucket).min(minute.max_ms));
        }
    }
    Some(minute.max_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Millis = 1_800_000_000_000;

    #[test]
    fn percentiles_are_within_ten_percent() {
        let mut history = StartLagHistory::new();
        for lag in 1..=1000 {
            history.record(T0, lag);
        }
        let series = history.series(T0);
        let window = series.window;
        assert_eq!(window.starts, 1000);
        let p50 = window.p50_ms.unwrap();
        let p99 = window.p99_ms.unwrap();
        assert!((500..=550).contains(&p50), "{p50}");
        assert!((990..=1000).contains(&p99), "{p99}");
        assert_eq!(series.minutes.len(), WINDOW_MINUTES);
        assert_eq!(series.minutes.last().unwrap().starts, 1000);
    }

    #[test]
    fn old_minutes_fall_out_of_the_window() {
        let mut history = StartLagHistory::new();
        history.record(T0, 5_000);
        history.record(T0 + 20 * MINUTE_MS, 7);
        let series = history.series(T0 + 20 * MINUTE_MS);
        assert_eq!(series.window.starts, 1);
        assert_eq!(series.window.p99_ms, Some(7));
        // A start recorded late, for a minute the slot has moved past.
        history.record(T0 + 5 * MINUTE_MS, 1);
        assert_eq!(history.series(T0 + 20 * MINUTE_MS).window.starts, 1);
        // Nothing recent: no percentiles, but every minute is on the axis.
        let quiet = history.series(T0 + 60 * MINUTE_MS);
        assert_eq!(quiet.window.starts, 0);
        assert_eq!(quiet.window.p50_ms, None);
        assert_eq!(quiet.minutes.len(), WINDOW_MINUTES);
    }

    #[test]
    fn a_huge_lag_lands_in_the_last_bucket() {
        let mut history = StartLagHistory::new();
        history.record(T0, 10 * 3_600_000);
        history.record(T0, -5);
        let window = history.series(T0).window;
        assert_eq!(window.starts, 2);
        assert_eq!(window.p99_ms, Some(10 * 3_600_000));
        assert_eq!(window.p50_ms, Some(0));
    }
}
