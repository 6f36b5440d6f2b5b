//! Cron, time zones, windows and DST. Pure: no I/O, no actors.
//!
//! The cron engine (croner) stays behind [`CronSchedule`]; nothing here
//! exposes its types, so it can be swapped without touching callers.
//!
//! A fixed local time inside a spring-forward gap fires once, at the first
//! valid instant after it:
//!
//! ```
//! use chrono::{TimeZone, Utc};
//! use ruled::schedule::{CronSchedule, parse_timezone};
//!
//! let nightly = CronSchedule::parse("30 2 * * *").unwrap();
//! let new_york = parse_timezone("America/New_York").unwrap();
//! let after = Utc.with_ymd_and_hms(2026, 3, 7, 12, 0, 0).unwrap();
//! let next = nightly.next_after(new_york, after).unwrap();
//! // 02:30 does not exist on 2026-03-08: it runs at 03:00 EDT.
//! assert_eq!(next, Utc.with_ymd_and_hms(2026, 3, 8, 7, 0, 0).unwrap());
//! ```
//!
//! An occurrence outside the operation window runs when the window opens:
//!
//! ```
//! use chrono::{TimeZone, Utc};
//! use ruled::schedule::{CronSchedule, Window, parse_timezone, preview};
//!
//! let hourly = CronSchedule::parse("0 * * * *").unwrap();
//! let riyadh = parse_timezone("Asia/Riyadh").unwrap();
//! let window: Window = "22:00-06:00".parse().unwrap();
//! let noon_utc = Utc.with_ymd_and_hms(2026, 6, 1, 12, 0, 0).unwrap(); // 15:00 in Riyadh
//! let runs = preview(&hourly, riyadh, Some(window), noon_utc, 2).unwrap();
//! assert_eq!(runs[0], Utc.with_ymd_and_hms(2026, 6, 1, 19, 0, 0).unwrap()); // 22:00 local
//! assert_eq!(runs[1], Utc.with_ymd_and_hms(2026, 6, 1, 20, 0, 0).unwrap());
//! ```

mod cron;
mod fields;
mod policy;
mod preview;
mod window;
mod zone;

pub use cron::{CronSchedule, ScheduleCache, next_after, next_after_millis};
pub use policy::{
    Bounded, DEFAULT_BACKOFF_MAX_SECONDS, DEFAULT_BACKOFF_SECONDS, DEFAULT_CATCHUP_MAX,
    DEFAULT_MAX_ATTEMPTS, EffectivePolicy, Misfire, Overlap, Policy, SkipReason,
};
pub use preview::{PreviewedRun, preview, preview_runs};
pub use window::{TimeOfDay, Window, window_contains};
pub use zone::{local_time_of_day, next_window_open, parse_timezone};

use chrono::{DateTime, Utc};
use chrono_tz::Tz;

#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone)]
pub enum ScheduleError {
    #[error("invalid time of day {0:?}: expected HH:MM (00:00 to 23:59)")]
    InvalidTimeOfDay(String),
    #[error("invalid window {0:?}: expected HH:MM-HH:MM")]
    InvalidWindow(String),
    #[error("invalid cron expression {expression:?}: {reason}")]
    InvalidCron { expression: String, reason: String },
    #[error(
        "cron expression {0:?} can never fire: none of its months has a day of the month it allows"
    )]
    NeverFires(String),
    #[error("unknown time zone {0:?}: expected an IANA name such as Asia/Riyadh")]
    UnknownTimeZone(String),
    #[error("cron expression {expression:?} has no occurrence in {tz} after {after}")]
    NoOccurrence {
        expression: String,
        tz: Tz,
        after: DateTime<Utc>,
    },
    #[error("timestamp {0} ms is outside the supported date range")]
    InvalidTimestamp(i64),
}
