//! The runs the service would really make: cron occurrences, each deferred to
//! the window's next opening when it falls outside the window.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;

use super::{CronSchedule, ScheduleError, Window, next_window_open};

/// The first `count` runs after `from`, strictly increasing.
///
/// An occurrence outside the window runs when the window next opens, and the
/// following occurrence is searched strictly after that run, as the service
/// recomputes `next_run_time` after each run. Several occurrences outside
/// the window therefore collapse into the single run at the opening.
pub fn preview(
    schedule: &CronSchedule,
    tz: Tz,
    window: Option<Window>,
    from: DateTime<Utc>,
    count: usize,
) -> Result<Vec<DateTime<Utc>>, ScheduleError> {
    let mut runs = Vec::with_capacity(count);
    let mut after = from;
    while runs.len() < count {
        let occurrence = schedule.next_after(tz, after)?;
        let run = next_window_open(window, tz, occurrence);
        runs.push(run);
        after = run;
    }
    Ok(runs)
}
