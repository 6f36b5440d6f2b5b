//! Cron schedules evaluated in a time zone, with the DST rules of DESIGN §3.
//!
//! DST policy, decided per expression:
//!
//! - **Fixed time** (minute and hour are numbers, ranges or lists, e.g.
//!   `30 2 * * *`, `0 1,13 * * *`): each matching wall-clock time fires once.
//!   Inside a spring-forward gap it fires at the first valid instant after
//!   the gap; inside a repeated autumn hour it fires at its first occurrence.
//! - **Interval** (minute or hour uses `*` or a step, e.g. `*/15 * * * *`):
//!   follows real elapsed time. Both passes of a repeated hour fire; matches
//!   inside a gap do not exist and are skipped.
//!
//! croner does the calendar search. It applies the same rules natively, but
//! treats only single-valued minute and hour as fixed time, so `0 1,13 * * *`
//! would run twice on fall-back night and `30 2,14 * * *` would skip its
//! 02:30 run on spring-forward day. Fixed-time expressions therefore walk
//! wall-clock time with croner and resolve each match in the zone here.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use chrono::{DateTime, LocalResult, NaiveDateTime, TimeZone, Utc};
use chrono_tz::{GapInfo, Tz};

use croner::Cron;
use croner::parser::{CronParser, Seconds};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::ScheduleError;
use super::fields::Fields;

/// Upper bound on wall-clock matches a fixed-time search may pass over. It
/// only skips the second pass of a repeated hour (at most 60 matches per
/// repeated hour), so hitting it means something is badly wrong, not slow.
const MAX_SKIPPED_MATCHES: usize = 4 * 24 * 60;

/// A parsed, validated 5-field cron expression.
///
/// Two schedules are equal when their expressions are written the same way.
///
/// Shared, not copied: every job spec and every next-run computation takes
/// its rule's schedule, and a parsed `Cron` is several vectors deep (a deep
/// clone was 3% of a drain's CPU).
#[derive(Clone)]
pub struct CronSchedule(Arc<Parsed>);

struct Parsed {
    expression: String,
    fields: Fields,
    engine: Cron,
}

impl CronSchedule {
    /// Parses a standard 5-field expression (minute hour day-of-month month
    /// day-of-week) with names (`JAN`, `MON`), ranges, lists and steps, or one
    /// of `@yearly @annually @monthly @weekly @daily @midnight @hourly`.
    ///
    /// A bare `*` in one day field lets the other decide alone; otherwise a
    /// day matches when either day field matches. An expression no calendar
    /// day can satisfy (`0 0 30 2 *`) is [`ScheduleError::NeverFires`].
    pub fn parse(expression: &str) -> Result<CronSchedule, ScheduleError> {
        let invalid = |reason: String| ScheduleError::InvalidCron {
            expression: expression.to_string(),
            reason,
        };
        let (fields, normalized) = Fields::parse(expression).map_err(invalid)?;
        if !fields.can_fire() {
            return Err(ScheduleError::NeverFires(expression.to_string()));
        }
        let engine = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .build()
            .parse(&normalized)
            .map_err(|e| invalid(e.to_string()))?;
        Ok(CronSchedule(Arc::new(Parsed {
            expression: expression.trim().to_string(),
            fields,
            engine,
        })))
    }

    /// The expression as written (surrounding whitespace removed).
    pub fn expression(&self) -> &str {
        &self.0.expression
    }

    /// Whether the expression names fixed wall-clock times (fires once per
    /// matching wall time across DST) rather than an interval (follows real
    /// elapsed time). See the module documentation.
    pub fn is_fixed_time(&self) -> bool {
        self.0.fields.is_fixed_time()
    }

    /// Next occurrence strictly after `after`, evaluated in `tz`.
    ///
    /// Every call searches the calendar afresh, so the result never drifts
    /// the way adding 24 h does across DST. The search is bounded: an
    /// expression with no occurrence left (before year 5000) is an error.
    pub fn next_after(&self, tz: Tz, after: DateTime<Utc>) -> Result<DateTime<Utc>, ScheduleError> {
        let next = if self.0.fields.is_fixed_time() {
            self.next_fixed_time(tz, after)
        } else {
            self.0
                .engine
                .find_next_occurrence(&after.with_timezone(&tz), false)
                .ok()
                .map(|next| next.with_timezone(&Utc))
        };
        match next {
            // The guard keeps callers that loop on the result (preview, the
            // plan) finite even if the engine ever returned a time not ahead.
            Some(next) if next > after => Ok(next),
            _ => Err(ScheduleError::NoOccurrence {
                expression: self.0.expression.clone(),
                tz,
                after,
            }),
        }
    }

    /// Does the local wall time of `t` in `tz` match the expression (minute
    /// resolution)? This is about the wall clock only: the second pass of a
    /// repeated hour matches too, even where a fixed-time schedule does not
    /// fire on it.
    pub fn matches(&self, tz: Tz, t: DateTime<Utc>) -> bool {
        self.0.fields.matches(t.with_timezone(&tz).naive_local())
    }

    /// Does a wall-clock time match (minute resolution)? Unlike
    /// [`CronSchedule::matches`] this can ask about a time that a zone skips.
    pub fn matches_local(&self, local: NaiveDateTime) -> bool {
        self.0.fields.matches(local)
    }

    /// Walks wall-clock matches after `after`'s wall time and resolves each
    /// in `tz`: a single instant fires; a repeated time fires on its earlier
    /// pass only; a skipped time fires when the gap ends.
    fn next_fixed_time(&self, tz: Tz, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let mut wall = after.with_timezone(&tz).naive_local();
        for _ in 0..MAX_SKIPPED_MATCHES {
            wall = self.0.engine.find_next_occurrence(&wall, false).ok()?;
            let instant = match tz.from_local_datetime(&wall) {
                LocalResult::Single(instant) => Some(instant),
                // The later pass is skipped even when the earlier one lies
                // before `after`: that wall time has already had its run.
                LocalResult::Ambiguous(earlier, _) => Some(earlier),
                LocalResult::None => GapInfo::new(&wall, &tz).and_then(|gap| gap.end),
            };
            if let Some(instant) = instant.map(|i| i.with_timezone(&Utc))
                && instant > after
            {
                return Some(instant);
            }
        }
        None
    }
}

/// Parsed schedules by expression. A burst of jobs shares a handful of
/// expressions, and parsing one costs far more than copying it: the plan
/// parses each expression once instead of once per job.
#[derive(Debug, Default)]
pub struct ScheduleCache {
    parsed: HashMap<String, Result<CronSchedule, ScheduleError>>,
}

/// Distinct expressions kept before the cache starts over, so a plan with
/// ever-new expressions cannot grow it without bound.
const SCHEDULE_CACHE_LIMIT: usize = 1024;

impl ScheduleCache {
    /// [`CronSchedule::parse`], remembered.
    pub fn parse(&mut self, expression: &str) -> Result<CronSchedule, ScheduleError> {
        if let Some(parsed) = self.parsed.get(expression) {
            return parsed.clone();
        }
        if self.parsed.len() >= SCHEDULE_CACHE_LIMIT {
            self.parsed.clear();
        }
        let parsed = CronSchedule::parse(expression);
        self.parsed.insert(expression.to_string(), parsed.clone());
        parsed
    }
}

impl fmt::Debug for CronSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CronSchedule")
            .field(&self.0.expression)
            .finish()
    }
}

impl fmt::Display for CronSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.expression)
    }
}

impl PartialEq for CronSchedule {
    fn eq(&self, other: &Self) -> bool {
        self.0.expression == other.0.expression
    }
}

impl Eq for CronSchedule {}

impl FromStr for CronSchedule {
    type Err = ScheduleError;

    fn from_str(expression: &str) -> Result<Self, Self::Err> {
        CronSchedule::parse(expression)
    }
}

impl Serialize for CronSchedule {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0.expression)
    }
}

impl<'de> Deserialize<'de> for CronSchedule {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        CronSchedule::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// Parses `expression` and returns its next occurrence strictly after `after`.
pub fn next_after(
    expression: &str,
    tz: Tz,
    after: DateTime<Utc>,
) -> Result<DateTime<Utc>, ScheduleError> {
    CronSchedule::parse(expression)?.next_after(tz, after)
}

/// [`CronSchedule::next_after`] on UTC epoch milliseconds, the unit stored in
/// the database.
pub fn next_after_millis(
    schedule: &CronSchedule,
    tz: Tz,
    after_ms: i64,
) -> Result<i64, ScheduleError> {
    let after = DateTime::from_timestamp_millis(after_ms)
        .ok_or(ScheduleError::InvalidTimestamp(after_ms))?;
    Ok(schedule.next_after(tz, after)?.timestamp_millis())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeDelta;

    #[test]
    fn the_schedule_cache_answers_as_parse_does_and_stays_bounded() {
        let mut cache = ScheduleCache::default();
        for _ in 0..2 {
            assert_eq!(
                cache.parse("*/15 * * * *"),
                CronSchedule::parse("*/15 * * * *")
            );
            assert_eq!(cache.parse("0 0 30 2 *"), CronSchedule::parse("0 0 30 2 *"));
            assert!(matches!(
                cache.parse("61 * * * *"),
                Err(ScheduleError::InvalidCron { .. })
            ));
        }
        assert_eq!(cache.parsed.len(), 3);
        for minute in 0..60 {
            for hour in 0..24 {
                cache.parse(&format!("{minute} {hour} * * *")).unwrap();
            }
        }
        assert!(cache.parsed.len() <= SCHEDULE_CACHE_LIMIT);
        let again = cache.parse("5 5 * * *").unwrap();
        assert_eq!(
            again.next_after(chrono_tz::UTC, Utc.timestamp_opt(0, 0).unwrap()),
            CronSchedule::parse("5 5 * * *")
                .unwrap()
                .next_after(chrono_tz::UTC, Utc.timestamp_opt(0, 0).unwrap())
        );
    }

    /// For single-valued fixed times croner applies our DST rules natively;
    /// our wall-clock walk must agree with it wherever both apply.
    #[test]
    fn fixed_time_walk_agrees_with_croner_for_single_times() {
        let zones: [Tz; 5] = [
            chrono_tz::America::New_York,
            chrono_tz::Europe::Berlin,
            chrono_tz::Australia::Lord_Howe,
            chrono_tz::Pacific::Chatham,
            chrono_tz::America::Santiago,
        ];
        let expressions = [
            "30 2 * * *",
            "30 1 * * *",
            "15 2 * * *",
            "45 1 * * *",
            "0 3 * * *",
            "50 2 * * SUN",
            "0 0 * * *",
        ];
        let start = Utc.with_ymd_and_hms(2025, 12, 31, 0, 0, 0).unwrap();
        for tz in zones {
            for expression in expressions {
                let schedule = CronSchedule::parse(expression).unwrap();
                assert!(schedule.is_fixed_time());
                let (mut ours, mut native) = (start, start.with_timezone(&tz));
                for _ in 0..400 {
                    ours = schedule.next_after(tz, ours).unwrap();
                    native = schedule
                        .0
                        .engine
                        .find_next_occurrence(&native, false)
                        .unwrap();
                    assert_eq!(ours, native, "{expression} in {tz}");
                }
            }
        }
    }

    #[test]
    fn lists_of_fixed_times_fire_once_across_dst() {
        let ny = chrono_tz::America::New_York;
        let schedule = CronSchedule::parse("0 1,13 * * *").unwrap();
        let from = Utc.with_ymd_and_hms(2026, 11, 1, 0, 0, 0).unwrap();
        let first = schedule.next_after(ny, from).unwrap();
        assert_eq!(first, Utc.with_ymd_and_hms(2026, 11, 1, 5, 0, 0).unwrap());
        let second = schedule.next_after(ny, first).unwrap();
        assert_eq!(second, Utc.with_ymd_and_hms(2026, 11, 1, 18, 0, 0).unwrap());
        // croner alone would also fire at 01:00 EST.
        let native = schedule
            .0
            .engine
            .find_next_occurrence(&first.with_timezone(&ny), false)
            .unwrap();
        assert_eq!(native.with_timezone(&Utc), first + TimeDelta::hours(1));
    }

    #[test]
    fn schedules_can_be_shared_between_actors() {
        fn assert_send_sync<T: Send + Sync + 'static>() {}
        assert_send_sync::<CronSchedule>();
        assert_send_sync::<ScheduleError>();
    }

    #[test]
    fn debug_and_display_show_the_expression_only() {
        let schedule = CronSchedule::parse("  */5 * * * *  ").unwrap();
        assert_eq!(format!("{schedule:?}"), "CronSchedule(\"*/5 * * * *\")");
        assert_eq!(schedule.to_string(), "*/5 * * * *");
        assert_eq!(schedule, "*/5 * * * *".parse().unwrap());
        let json = serde_json::to_string(&schedule).unwrap();
        assert_eq!(json, "\"*/5 * * * *\"");
        let back: CronSchedule = serde_json::from_str(&json).unwrap();
        assert_eq!(back, schedule);
        assert!(serde_json::from_str::<CronSchedule>("\"*/0 * * * *\"").is_err());
    }
}
