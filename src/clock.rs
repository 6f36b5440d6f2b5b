//! The one source of time for the service.
//!
//! UTC wall time is derived from tokio's `Instant`: a base wall time taken
//! once plus the elapsed monotonic time. Under tokio's paused clock
//! (`start_paused = true`, `time::advance`) everything that asks the `Clock`
//! moves in lockstep with the timers, so tests and `ruled simulate` are
//! deterministic (seed 003's logical clock).

use chrono::{DateTime, TimeZone, Utc};
use tokio::time::Instant;

use crate::model::Millis;

#[derive(Debug, Clone, Copy)]
pub struct Clock {
    base_wall_ms: Millis,
    base_instant: Instant,
}

impl Clock {
    /// Anchored at the system's current wall time.
    pub fn system() -> Clock {
        Clock::starting_at(Utc::now().timestamp_millis())
    }

    /// Anchored at `wall_ms` now; under a paused runtime time only moves
    /// when tokio's clock is advanced.
    pub fn starting_at(wall_ms: Millis) -> Clock {
        Clock {
            base_wall_ms: wall_ms,
            base_instant: Instant::now(),
        }
    }

    pub fn now_ms(&self) -> Millis {
        let elapsed = Instant::now().saturating_duration_since(self.base_instant);
        self.base_wall_ms + elapsed.as_millis() as Millis
    }

    pub fn now(&self) -> DateTime<Utc> {
        millis_to_utc(self.now_ms())
    }
}

/// Epoch milliseconds to a UTC time; out-of-range values clamp to the epoch
/// rather than panic, since they only ever come from corrupt input.
pub fn millis_to_utc(ms: Millis) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}

/// `#[serde(serialize_with)]` for an optional epoch-millisecond time shown
/// as RFC 3339, as every API time is.
pub fn serialize_rfc3339<S: serde::Serializer>(
    ms: &Option<Millis>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match ms {
        Some(ms) => serializer.serialize_str(&millis_to_utc(*ms).to_rfc3339()),
        None => serializer.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn follows_the_paused_clock_exactly() {
        let clock = Clock::starting_at(1_000_000);
        assert_eq!(clock.now_ms(), 1_000_000);
        tokio::time::advance(Duration::from_millis(1_500)).await;
        assert_eq!(clock.now_ms(), 1_001_500);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(clock.now_ms(), 1_061_500);
    }
}
