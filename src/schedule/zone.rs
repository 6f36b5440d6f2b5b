//! Time zone helpers: zone names, local time of day, window openings.

use chrono::{DateTime, TimeDelta, TimeZone, Timelike, Utc};
use chrono_tz::Tz;

use super::{ScheduleError, TimeOfDay, Window};

const NANOS_PER_DAY: i64 = 86_400 * 1_000_000_000;

/// Parses an IANA zone name such as `Asia/Riyadh` (exact spelling and
/// case).
///
/// White space around the name is ignored here, so an env file's trailing
/// blank or a row stored before the API checked does not stop a branch.
/// The API refuses such a name with a 400 rather than storing it, so what
/// it stores is the exact name.
pub fn parse_timezone(name: &str) -> Result<Tz, ScheduleError> {
    name.trim()
        .parse()
        .map_err(|_| ScheduleError::UnknownTimeZone(name.to_string()))
}

/// The wall-clock time of day of `t` in `tz`, to the minute.
pub fn local_time_of_day(tz: Tz, t: DateTime<Utc>) -> TimeOfDay {
    TimeOfDay::from(t.with_timezone(&tz).time())
}

/// The first instant at or after `t` whose local time of day in `tz` is
/// inside `window`: `t` itself when already inside or when there is no
/// window.
///
/// DST is followed: a window start that falls in a spring-forward gap opens
/// at the first valid instant after the gap (if that is still inside the
/// window; otherwise the window does not exist that day), and a clock turned
/// back into the window reopens it at the moment it turns back.
pub fn next_window_open(window: Option<Window>, tz: Tz, t: DateTime<Utc>) -> DateTime<Utc> {
    let Some(window) = window else {
        return t;
    };
    // Between two offset changes the wall clock runs like UTC, so the
    // opening is plain arithmetic; each offset change starts a new stretch
    // that is checked afresh. A window opens at least once in any two days,
    // whatever a zone's transitions do, so a few stretches always suffice.
    let mut start = t;
    for _ in 0..16 {
        let local = start.with_timezone(&tz).time();
        if window.contains(TimeOfDay::from(local)) {
            return start;
        }
        let now = i64::from(local.num_seconds_from_midnight()) * 1_000_000_000
            + i64::from(local.nanosecond());
        let opens = i64::from(window.from.minutes_since_midnight()) * 60 * 1_000_000_000;
        let candidate = start + TimeDelta::nanoseconds((opens - now).rem_euclid(NANOS_PER_DAY));
        match next_offset_change(tz, start, candidate) {
            None => return candidate,
            Some(change) => start = change,
        }
    }
    debug_assert!(false, "window {window} never opened in {tz} after {t}");
    start
}

/// The zone's UTC offset in seconds at `t`.
fn offset_seconds(tz: Tz, t: DateTime<Utc>) -> i32 {
    use chrono::Offset;
    tz.offset_from_utc_datetime(&t.naive_utc())
        .fix()
        .local_minus_utc()
}

/// The first instant in `(from, until]` at which `tz`'s offset differs from
/// its offset at `from`, if any.
///
/// Probes hourly, then bisects to the second (tz data changes offsets on
/// whole seconds). Two changes that cancel within one hour would be missed;
/// no zone does that.
pub(crate) fn next_offset_change(
    tz: Tz,
    from: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let base = offset_seconds(tz, from);
    let mut before = from;
    while before < until {
        let probe = (before + TimeDelta::hours(1)).min(until);
        if offset_seconds(tz, probe) != base {
            // Invariant: offset at `low` is `base`, at `high` it is not.
            let mut low = before.timestamp();
            let mut high = probe.timestamp() + i64::from(probe.nanosecond() > 0);
            while high - low > 1 {
                let middle = low + (high - low) / 2;
                let at = DateTime::from_timestamp(middle, 0)?;
                if offset_seconds(tz, at) == base {
                    low = middle;
                } else {
                    high = middle;
                }
            }
            return DateTime::from_timestamp(high, 0);
        }
        before = probe;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(y: i32, m: u32, d: u32, h: u32, min: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, m, d, h, min, 0).unwrap()
    }

    #[test]
    fn finds_offset_changes_to_the_second() {
        let ny = chrono_tz::America::New_York;
        // 2026-03-08 02:00 EST = 07:00 UTC; 2026-11-01 02:00 EDT = 06:00 UTC.
        assert_eq!(
            next_offset_change(ny, utc(2026, 3, 7, 12, 0), utc(2026, 3, 9, 0, 0)),
            Some(utc(2026, 3, 8, 7, 0))
        );
        assert_eq!(
            next_offset_change(ny, utc(2026, 11, 1, 5, 59), utc(2026, 11, 1, 6, 0)),
            Some(utc(2026, 11, 1, 6, 0))
        );
        assert_eq!(
            next_offset_change(ny, utc(2026, 3, 9, 0, 0), utc(2026, 3, 12, 0, 0)),
            None
        );
        let sub_second = utc(2026, 3, 8, 6, 59) + TimeDelta::milliseconds(59_500);
        assert_eq!(
            next_offset_change(ny, sub_second, utc(2026, 3, 8, 8, 0)),
            Some(utc(2026, 3, 8, 7, 0))
        );
    }

    #[test]
    fn unknown_zone_is_named_in_the_error() {
        let error = parse_timezone("Mars/Olympus").unwrap_err();
        assert_eq!(error, ScheduleError::UnknownTimeZone("Mars/Olympus".into()));
        assert!(error.to_string().contains("Mars/Olympus"));
        assert_eq!(
            parse_timezone("Asia/Riyadh").unwrap(),
            chrono_tz::Asia::Riyadh
        );
        assert_eq!(
            parse_timezone(" Asia/Riyadh\t").unwrap(),
            chrono_tz::Asia::Riyadh
        );
        assert!(parse_timezone("asia/riyadh").is_err());
        assert!(parse_timezone("").is_err());
    }
}
