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
    Ok(preview_runs(schedule, tz, window, from, count)?
        .into_iter()
        .map(|run| run.at)
        .collect())
}

/// One run of [`preview_runs`]: when it happens and the occurrence it
/// stands for, later when the window deferred it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreviewedRun {
    pub at: DateTime<Utc>,
    pub occurrence: DateTime<Utc>,
}

impl PreviewedRun {
    /// The window moved it to its opening.
    pub fn deferred(&self) -> bool {
        self.at != self.occurrence
    }

    /// The zone keeps daylight-saving time at the run.
    pub fn in_dst(&self, tz: Tz) -> bool {
        use chrono_tz::OffsetComponents;
        !self.at.with_timezone(&tz).offset().dst_offset().is_zero()
    }
}

/// [`preview`], with each run's occurrence.
pub fn preview_runs(
    schedule: &CronSchedule,
    tz: Tz,
    window: Option<Window>,
    from: DateTime<Utc>,
    count: usize,
) -> Result<Vec<PreviewedRun>, ScheduleError> {
    let mut runs = Vec::with_capacity(count);
    let mut after = from;
    while runs.len() < count {
        let occurrence = schedule.next_after(tz, after)?;
        let at = next_window_open(window, tz, occurrence);
        runs.push(PreviewedRun { at, occurrence });
        after = at;
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().to_utc()
    }

    #[test]
    fn marks_daylight_time_and_window_deferrals() {
        let tz = chrono_tz::America::New_York;
        let daily = CronSchedule::parse("0 3 * * *").unwrap();
        // Across the spring change (2027-03-14): EST, then EDT.
        let runs = preview_runs(&daily, tz, None, at("2027-03-12T12:00:00Z"), 3).unwrap();
        let dst: Vec<bool> = runs.iter().map(|run| run.in_dst(tz)).collect();
        assert_eq!(dst, [false, true, true]);
        assert!(runs.iter().all(|run| !run.deferred()));

        // 03:00 lies outside 09:00-17:00: each run waits for the opening.
        let window: Window = "09:00-17:00".parse().unwrap();
        let runs = preview_runs(&daily, tz, Some(window), at("2027-03-12T12:00:00Z"), 1).unwrap();
        assert!(runs[0].deferred());
        assert_eq!(runs[0].occurrence, at("2027-03-13T08:00:00Z"));
        assert_eq!(runs[0].at, at("2027-03-13T14:00:00Z"));
    }
}
