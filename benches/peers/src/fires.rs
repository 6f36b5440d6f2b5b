//! Start lag and lost fires of a cron peer, measured the same way for each.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Every fire of every job: which job, for which second, how late it
/// started. Jobs fire on the whole second, so when a peer does not say
/// which second a fire was for, it is the floor of its start, and its lag
/// is what is left over. A fire more than a second late would then count
/// for the next second, and show as one lost and one double: `doubles`
/// says whether that happened.
#[derive(Clone, Default)]
pub struct Fires(Arc<Mutex<Vec<(usize, u64, f64)>>>);

impl Fires {
    /// Called first thing in a job's body, when the peer does not say
    /// which second the fire was for.
    pub fn record(&self, job: usize) {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        self.push(job, now.as_secs(), now);
    }

    /// Called first thing in a job's body, with the second it was due.
    pub fn record_due(&self, job: usize, due_second: u64) {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        self.push(job, due_second, now);
    }

    fn push(&self, job: usize, due_second: u64, now: Duration) {
        // A fire that starts before its second (a timer that wakes early)
        // is on time, not negative.
        let lag = now.saturating_sub(Duration::from_secs(due_second));
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
            observed: window.len() as u64,
            lost: expected.saturating_sub(distinct.len() as u64),
            doubles: (window.len() - distinct.len()) as u64,
            p50_ms: percentile(&lags, 0.50),
            p99_ms: percentile(&lags, 0.99),
            max_ms: lags.last().copied().unwrap_or(f64::NAN),
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct LagSummary {
    /// Fires due in the window: jobs × whole seconds.
    pub fires: u64,
    /// Fires that started in the window (a peer's own count; ruled's
    /// child reports none, and this is then `fires - lost`).
    pub observed: u64,
    pub lost: u64,
    /// A job seen twice for one second: zero unless a fire was more than
    /// a second late, or a peer fired twice.
    pub doubles: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// NaN where it is not known (ruled's child does not report it).
    pub max_ms: f64,
}

impl LagSummary {
    pub fn line(&self) -> String {
        format!(
            "fires={} observed={} lost={} doubles={} p50_ms={:.3} p99_ms={:.3} max_ms={:.3}",
            self.fires,
            self.observed,
            self.lost,
            self.doubles,
            self.p50_ms,
            self.p99_ms,
            self.max_ms
        )
    }
}

/// Nearest rank, as ruled's engine bench reads its percentiles.
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

/// Sleeps until `second` (epoch seconds) has begun, and `offset` more.
pub async fn until(second: u64, offset: Duration) {
    let target = UNIX_EPOCH + Duration::from_secs(second) + offset;
    if let Ok(wait) = target.duration_since(SystemTime::now()) {
        tokio::time::sleep(wait).await;
    }
}

/// Epoch seconds now.
pub fn now_second() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}
