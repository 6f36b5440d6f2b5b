//! Cron, time zones, windows and DST. Pure: no I/O, no actors.
//!
//! The cron engine (croner) stays behind [`CronSchedule`]; nothing here
//! exposes its types, so it can be swapped without touching callers.

mod cron;
mod fields;
mod preview;
mod window;
mod zone;

pub use cron::{CronSchedule, next_after, next_after_millis};
pub use preview::preview;
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
