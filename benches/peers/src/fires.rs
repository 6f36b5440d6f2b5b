//! Start lag and lost fires of a cron peer, measured the same way for each.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// Every fire of every job: which job, for which second, how late it
/// started. Jobs fire on the whole second, so a fire's second is the floor
/// of its start, and its lag is what is left over (a fire more than a
/// second late would count for the next second, and show as one lost and
/// one extra — none was seen).
#[derive(Clone, Default)]
pub struct Fires(Arc<Mutex<Vec<(usize, u64, f64)>>>);

impl Fires {
    /// Called first thing in a job's body, when the peer does not say
    /// which second the fire was for.
    pub fn record(&self, job: usize) {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        self.record_due(job, now.as_secs());
    }

    /// Called first thing in a job's body, with the second it was due.
    pub fn record_due(&self, job: usize, due_second: u64) {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let lag = now.saturating_sub(std::time::Duration::from_secs(due_second));
        let lag_ms = lag.as_secs_f64() * 1_000.0;
        self.0.lock().unwrap().push((job, due_second, lag_ms));
    }

    /// The figures over the whole seconds `[first, first + seconds)`.
    pub fn summary(&self, jobs: usize, first: u64, seconds: u64) -> LagSummary {
        let fires = self.0.lock().unwrap();
        let window: Vec<&(usize, u64, f64)> = fires
            .iter()
            .filter(|(_, second, _)| (first..first + seconds).contains(second))
            .collect();
        let distinct: HashSet<(usize, u64)> = window.iter().map(|(j, s, _)| (*j, *s)).collect();
        let mut lags: Vec<f64> = window.iter().map(|(_, _, lag)| *lag).collect();
        lags.sort_by(f64::total_cmp);
        let expected = jobs as u64 * seconds;
        LagSummary {
            fires: expected,
            lost: expected.saturating_sub(distinct.len() as u64),
            p50_ms: percentile(&lags, 0.50),
            p99_ms: percentile(&lags, 0.99),
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct LagSummary {
    pub fires: u64,
    pub lost: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// The next whole second at least `lead` seconds ahead: where a measured
/// window starts, once every job is registered and has fired once.
pub fn whole_second_ahead(lead: u64) -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + lead
        + 1
}

/// Sleeps until `second` (epoch seconds) has begun.
pub async fn until(second: u64) {
    let target = UNIX_EPOCH + std::time::Duration::from_secs(second);
    if let Ok(wait) = target.duration_since(SystemTime::now()) {
        tokio::time::sleep(wait).await;
    }
}
