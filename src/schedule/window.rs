//! Daily operation windows in a branch's local time.

use std::fmt;
use std::str::FromStr;

use chrono::{NaiveTime, Timelike};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::ScheduleError;

/// A wall-clock time of day with minute precision, written `HH:MM`.
///
/// Stored as minutes since local midnight so a workflow's window costs four
/// bytes in memory and compares without parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TimeOfDay(u16);

impl TimeOfDay {
    pub const MIDNIGHT: TimeOfDay = TimeOfDay(0);

    /// `hour` 0–23 and `minute` 0–59; anything else is rejected.
    pub fn new(hour: u32, minute: u32) -> Option<TimeOfDay> {
        (hour < 24 && minute < 60).then(|| TimeOfDay((hour * 60 + minute) as u16))
    }

    pub fn hour(self) -> u32 {
        u32::from(self.0) / 60
    }

    pub fn minute(self) -> u32 {
        u32::from(self.0) % 60
    }

    pub fn minutes_since_midnight(self) -> u16 {
        self.0
    }
}

/// The minute a wall-clock time falls in; seconds are dropped, matching the
/// minute precision of windows.
impl From<NaiveTime> for TimeOfDay {
    fn from(time: NaiveTime) -> TimeOfDay {
        TimeOfDay((time.hour() * 60 + time.minute()) as u16)
    }
}

impl fmt::Display for TimeOfDay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:02}:{:02}", self.hour(), self.minute())
    }
}

impl FromStr for TimeOfDay {
    type Err = ScheduleError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || ScheduleError::InvalidTimeOfDay(text.to_string());
        let (hour, minute) = text.split_once(':').ok_or_else(invalid)?;
        // Exactly two ASCII digits each: "9:00" or "09:5" are typos we refuse
        // rather than guess, and `u32::from_str` alone would take "+9".
        let two_digits = |part: &str| part.len() == 2 && part.bytes().all(|b| b.is_ascii_digit());
        if !two_digits(hour) || !two_digits(minute) {
            return Err(invalid());
        }
        let hour: u32 = hour.parse().map_err(|_| invalid())?;
        let minute: u32 = minute.parse().map_err(|_| invalid())?;
        TimeOfDay::new(hour, minute).ok_or_else(invalid)
    }
}

impl Serialize for TimeOfDay {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TimeOfDay {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A daily operation window `from`–`to` in local time.
///
/// `from < to` is a same-day window containing `from <= t < to`; `from > to`
/// wraps past midnight (22:00–06:00 contains `t >= from || t < to`);
/// `from == to` is treated as open all day, since an empty window would
/// silently stop a rule forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    pub from: TimeOfDay,
    pub to: TimeOfDay,
}

impl Window {
    /// Builds a window from the two optional columns of a branch rule. Both
    /// must be set for a window to exist. A single bound is never stored
    /// through the API (a 400 names the missing one) and a row written with
    /// SQL that has one is quarantined before it reaches the plan, so here it
    /// only ever means no window.
    pub fn from_bounds(from: Option<TimeOfDay>, to: Option<TimeOfDay>) -> Option<Window> {
        match (from, to) {
            (Some(from), Some(to)) => Some(Window { from, to }),
            _ => None,
        }
    }

    pub fn contains(&self, t: TimeOfDay) -> bool {
        use std::cmp::Ordering::*;
        match self.from.cmp(&self.to) {
            Less => self.from <= t && t < self.to,
            Greater => t >= self.from || t < self.to,
            Equal => true,
        }
    }
}

/// `None` (no window) is always open.
pub fn window_contains(window: Option<Window>, t: TimeOfDay) -> bool {
    window.is_none_or(|w| w.contains(t))
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.from, self.to)
    }
}

impl FromStr for Window {
    type Err = ScheduleError;

    /// Parses `HH:MM-HH:MM`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (from, to) = text
            .split_once('-')
            .ok_or_else(|| ScheduleError::InvalidWindow(text.to_string()))?;
        Ok(Window {
            from: from.trim().parse()?,
            to: to.trim().parse()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(text: &str) -> TimeOfDay {
        text.parse().unwrap()
    }

    #[test]
    fn same_day_window_is_half_open() {
        let w: Window = "09:00-17:00".parse().unwrap();
        assert!(w.contains(t("09:00")));
        assert!(w.contains(t("16:59")));
        assert!(!w.contains(t("17:00")));
        assert!(!w.contains(t("08:59")));
    }

    #[test]
    fn overnight_window_wraps_midnight() {
        let w: Window = "22:00-06:00".parse().unwrap();
        assert!(w.contains(t("22:00")));
        assert!(w.contains(t("23:59")));
        assert!(w.contains(t("00:00")));
        assert!(w.contains(t("05:59")));
        assert!(!w.contains(t("06:00")));
        assert!(!w.contains(t("21:59")));
    }

    #[test]
    fn wall_clock_times_truncate_to_the_minute() {
        let time = NaiveTime::from_hms_nano_opt(23, 59, 59, 999_999_999).unwrap();
        assert_eq!(TimeOfDay::from(time), t("23:59"));
        assert_eq!(TimeOfDay::from(NaiveTime::MIN), TimeOfDay::MIDNIGHT);
    }

    #[test]
    fn a_window_whose_bounds_are_equal_is_open_all_day() {
        let all_day = Window {
            from: t("09:00"),
            to: t("09:00"),
        };
        for time in ["00:00", "08:59", "09:00", "09:01", "23:59"] {
            assert!(all_day.contains(t(time)), "{time}");
        }
    }

    #[test]
    fn no_window_is_always_open() {
        assert!(window_contains(None, t("03:17")));
        assert_eq!(Window::from_bounds(Some(t("01:00")), None), None);
    }

    #[test]
    fn malformed_times_are_rejected() {
        for bad in [
            "24:00",
            "12:60",
            "9:00",
            "09:5",
            "0900",
            "ab:cd",
            "",
            "+9:00",
            "09:+5",
            "-1:00",
            " 9:00",
            "09: 5",
            "٠٩:٠٠",
            "09:00:00",
            "09:00 ",
        ] {
            assert!(
                bad.parse::<TimeOfDay>().is_err(),
                "{bad} should be rejected"
            );
        }
        assert!("09:00".parse::<Window>().is_err());
        assert!("+9:00-17:00".parse::<Window>().is_err());
    }

    #[test]
    fn every_valid_time_round_trips() {
        for hour in 0..24 {
            for minute in 0..60 {
                let text = format!("{hour:02}:{minute:02}");
                let time: TimeOfDay = text.parse().unwrap();
                assert_eq!((time.hour(), time.minute()), (hour, minute));
                assert_eq!(time.to_string(), text);
            }
        }
    }
}
