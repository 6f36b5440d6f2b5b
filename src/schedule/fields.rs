//! Our own reading of a standard 5-field cron expression.
//!
//! croner accepts a superset of standard cron (`L`, `W`, `#`, `+`, `?`, a
//! seconds field when asked). Expressions are stored in the database, so the
//! grammar we accept is part of our contract: validating it here keeps stored
//! rules portable if the engine is ever swapped. The field sets built here
//! also answer questions croner does not expose: whether an expression can
//! ever fire, whether it names fixed wall-clock times (its DST policy), and
//! whether a wall-clock time matches, minute by minute.

use chrono::{Datelike, NaiveDateTime, Timelike};

/// The five fields as bit sets, plus what the DST rules need to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fields {
    minutes: u64,
    hours: u32,
    /// Bit `d` for day of month `d` (1–31).
    days: u32,
    /// Bit `m` for month `m` (1–12).
    months: u16,
    /// Bit `w` for weekday `w`, Sunday = 0; a written 7 lands on bit 0.
    weekdays: u8,
    /// The day-of-month field is exactly `*`. Only a bare `*` makes the other
    /// day field decide alone; `*/2` or `1-31` is a restriction and is OR-ed
    /// with the weekday field, as croner (and POSIX) do.
    any_day: bool,
    any_weekday: bool,
    /// Minute and hour name wall-clock times (numbers, ranges, lists) rather
    /// than an interval (`*` or a step). Decides the DST policy.
    fixed_time: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Minute,
    Hour,
    DayOfMonth,
    Month,
    DayOfWeek,
}

const MONTH_NAMES: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const WEEKDAY_NAMES: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

impl Field {
    const ALL: [Field; 5] = [
        Field::Minute,
        Field::Hour,
        Field::DayOfMonth,
        Field::Month,
        Field::DayOfWeek,
    ];

    fn name(self) -> &'static str {
        match self {
            Field::Minute => "minute",
            Field::Hour => "hour",
            Field::DayOfMonth => "day-of-month",
            Field::Month => "month",
            Field::DayOfWeek => "day-of-week",
        }
    }

    /// Values that may be written. Day-of-week accepts 7 for Sunday.
    fn bounds(self) -> (u32, u32) {
        match self {
            Field::Minute => (0, 59),
            Field::Hour => (0, 23),
            Field::DayOfMonth => (1, 31),
            Field::Month => (1, 12),
            Field::DayOfWeek => (0, 7),
        }
    }

    /// What `*` stands for. Day-of-week stops at 6 so `*/n` never counts
    /// Sunday twice.
    fn star_range(self) -> (u32, u32) {
        match self {
            Field::DayOfWeek => (0, 6),
            other => other.bounds(),
        }
    }

    fn value(self, token: &str) -> Result<u32, String> {
        let (low, high) = self.bounds();
        if !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit()) {
            // Long digit strings would overflow; they are out of range anyway.
            let value = if token.len() > 4 {
                u32::MAX
            } else {
                token.parse().unwrap_or(u32::MAX)
            };
            if value < low || value > high {
                return Err(format!(
                    "{} field: value {token} is out of range {low}-{high}",
                    self.name()
                ));
            }
            return Ok(value);
        }
        let names: &[&str] = match self {
            Field::Month => &MONTH_NAMES,
            Field::DayOfWeek => &WEEKDAY_NAMES,
            _ => &[],
        };
        let offset = if self == Field::Month { 1 } else { 0 };
        if let Some(index) = names.iter().position(|n| n.eq_ignore_ascii_case(token)) {
            return Ok(index as u32 + offset);
        }
        if token.is_empty() {
            return Err(format!("{} field: a value is missing", self.name()));
        }
        let letters = token.trim_matches(|c: char| c.is_ascii_digit());
        if token.contains(['?', '#', '+'])
            || ["L", "W", "LW"]
                .iter()
                .any(|special| letters.eq_ignore_ascii_case(special))
        {
            return Err(format!(
                "{} field: {token:?} is not standard cron (only numbers, names, *, ranges, steps and lists)",
                self.name()
            ));
        }
        Err(format!(
            "{} field: {token:?} is not a valid value",
            self.name()
        ))
    }
}

/// `@daily` and friends, as Vixie cron spells them.
fn expand_alias(expression: &str) -> Result<Option<&'static str>, String> {
    let Some(alias) = expression.strip_prefix('@') else {
        return Ok(None);
    };
    let expanded = match alias.to_ascii_lowercase().as_str() {
        "yearly" | "annually" => "0 0 1 1 *",
        "monthly" => "0 0 1 * *",
        "weekly" => "0 0 * * 0",
        "daily" | "midnight" => "0 0 * * *",
        "hourly" => "0 * * * *",
        _ => {
            return Err(format!(
                "unknown alias @{alias} (use @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly)"
            ));
        }
    };
    Ok(Some(expanded))
}

/// Parses one field into a bit set. Also reports whether it used `*` or a
/// step anywhere, which makes minute/hour fields interval-style.
fn parse_field(field: Field, text: &str) -> Result<(u64, bool), String> {
    let mut bits = 0u64;
    let mut interval = false;
    for item in text.split(',') {
        if item.is_empty() {
            return Err(format!(
                "{} field: empty item in list {text:?}",
                field.name()
            ));
        }
        let (range, step) = match item.split_once('/') {
            Some((range, step)) => (range, Some(step)),
            None => (item, None),
        };
        let (low, high) = if range == "*" {
            interval = true;
            field.star_range()
        } else if let Some((low, high)) = range.split_once('-') {
            let (low_value, mut high_value) = (field.value(low)?, field.value(high)?);
            // SUN is 0, but as the end of a range it means the week's end
            // (SAT-SUN is the weekend), except in SUN-SUN.
            if field == Field::DayOfWeek
                && high_value == 0
                && low_value > 0
                && high.eq_ignore_ascii_case("SUN")
            {
                high_value = 7;
            }
            if low_value > high_value {
                return Err(format!(
                    "{} field: range {range} runs backwards",
                    field.name()
                ));
            }
            (low_value, high_value)
        } else {
            let value = field.value(range)?;
            if step.is_some() {
                return Err(format!(
                    "{} field: a step needs * or a range before it (write */{} or {range}-{}/{})",
                    field.name(),
                    step.unwrap_or_default(),
                    field.bounds().1,
                    step.unwrap_or_default(),
                ));
            }
            (value, value)
        };
        let step = match step {
            None => 1,
            Some(step) => {
                interval = true;
                let (star_low, star_high) = field.star_range();
                let widest = star_high - star_low + 1;
                let digits = step.bytes().all(|b| b.is_ascii_digit());
                let value = if digits && !step.is_empty() && step.len() <= 4 {
                    step.parse::<u32>().ok()
                } else {
                    None
                };
                match value {
                    Some(value) if (1..=widest).contains(&value) => value,
                    _ => {
                        return Err(format!(
                            "{} field: step {step:?} must be a number from 1 to {widest}",
                            field.name()
                        ));
                    }
                }
            }
        };
        let mut value = low;
        while value <= high {
            // Sunday is both 0 and 7; one bit for it keeps matching simple.
            let bit = if field == Field::DayOfWeek && value == 7 {
                0
            } else {
                value
            };
            bits |= 1 << bit;
            value += step;
        }
    }
    Ok((bits, interval))
}

impl Fields {
    /// Parses `expression` (5 fields or an alias). Returns the fields and the
    /// plain 5-field text to hand to the engine.
    pub(crate) fn parse(expression: &str) -> Result<(Fields, String), String> {
        let trimmed = expression.trim();
        if trimmed.is_empty() {
            return Err("the expression is empty".to_string());
        }
        let text = expand_alias(trimmed)?.unwrap_or(trimmed);
        let parts: Vec<&str> = text.split_whitespace().collect();
        if parts.len() != 5 {
            let hint = if parts.len() > 5 {
                "; seconds and year fields are not supported"
            } else {
                ""
            };
            return Err(format!(
                "expected 5 fields (minute hour day-of-month month day-of-week), found {}{hint}",
                parts.len()
            ));
        }
        let mut sets = [0u64; 5];
        let mut interval = [false; 5];
        for (index, (field, part)) in Field::ALL.iter().zip(&parts).enumerate() {
            (sets[index], interval[index]) = parse_field(*field, part)?;
        }
        let fields = Fields {
            minutes: sets[0],
            hours: sets[1] as u32,
            days: sets[2] as u32,
            months: sets[3] as u16,
            weekdays: sets[4] as u8,
            any_day: parts[2] == "*",
            any_weekday: parts[4] == "*",
            fixed_time: !interval[0] && !interval[1],
        };
        // Month and weekday go to the engine as plain value lists. croner
        // rewrites names by text substitution, which misreads some ranges
        // (`SUN-SUN` becomes `0-7`, every day); a list cannot be misread, and
        // neither field affects the engine's DST policy.
        let list = |text: &str, bits: u64| {
            if text == "*" {
                return text.to_string();
            }
            (0..64)
                .filter(|bit| bits & (1 << bit) != 0)
                .map(|bit: u32| bit.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        // A bare `*` inside a list (`*,5`) is every value, which croner
        // refuses to read in some fields: it gets the field's full range
        // instead, which means the same and keeps the day fields' "either
        // matches" rule (a lone `*` is the only wildcard).
        let whole = |field: Field, text: &str| {
            if text != "*" && text.split(',').any(|item| item == "*") {
                let (low, high) = field.star_range();
                format!("{low}-{high}")
            } else {
                text.to_string()
            }
        };
        let normalized = [
            whole(Field::ALL[0], parts[0]),
            whole(Field::ALL[1], parts[1]),
            whole(Field::ALL[2], parts[2]),
            list(parts[3], sets[3]),
            list(parts[4], sets[4]),
        ]
        .join(" ");
        Ok((fields, normalized))
    }

    pub(crate) fn is_fixed_time(&self) -> bool {
        self.fixed_time
    }

    /// Whether any calendar day can satisfy the day fields. Only a
    /// day-of-month restriction with `*` weekdays can fail (`30 2`, `31 4`):
    /// any restricted weekday field is OR-ed in and every weekday occurs in
    /// every month. February counts 29 days because leap years exist.
    pub(crate) fn can_fire(&self) -> bool {
        if !self.any_weekday || self.any_day {
            return true;
        }
        (1..=12u32)
            .filter(|month| self.months & (1 << month) != 0)
            .any(|month| {
                let longest = match month {
                    2 => 29,
                    4 | 6 | 9 | 11 => 30,
                    _ => 31,
                };
                (1..=longest).any(|day| self.days & (1 << day) != 0)
            })
    }

    /// Whether a wall-clock time matches, ignoring seconds.
    pub(crate) fn matches(&self, local: NaiveDateTime) -> bool {
        let day = self.days & (1 << local.day()) != 0;
        let weekday = self.weekdays & (1 << local.weekday().num_days_from_sunday()) != 0;
        let day_matches = match (self.any_day, self.any_weekday) {
            (true, _) => weekday,
            (false, true) => day,
            (false, false) => day || weekday,
        };
        day_matches
            && self.minutes & (1 << local.minute()) != 0
            && self.hours & (1 << local.hour()) != 0
            && self.months & (1 << local.month()) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::NaiveDate;

    fn fields(expression: &str) -> Fields {
        Fields::parse(expression)
            .unwrap_or_else(|e| panic!("{expression}: {e}"))
            .0
    }

    fn error(expression: &str) -> String {
        Fields::parse(expression).expect_err(expression)
    }

    fn at(y: i32, m: u32, d: u32, h: u32, min: u32) -> NaiveDateTime {
        NaiveDate::from_ymd_opt(y, m, d)
            .unwrap()
            .and_hms_opt(h, min, 0)
            .unwrap()
    }

    #[test]
    fn steps_ranges_and_lists_build_the_expected_sets() {
        let f = fields("*/15 9-17/4 1,15 JAN-mar MON-FRI");
        assert_eq!(f.minutes, 1 | 1 << 15 | 1 << 30 | 1 << 45);
        assert_eq!(f.hours, 1 << 9 | 1 << 13 | 1 << 17);
        assert_eq!(f.days, 1 << 1 | 1 << 15);
        assert_eq!(f.months, 0b1110);
        assert_eq!(f.weekdays, 0b11_1110);
        assert!(!f.any_day && !f.any_weekday);
    }

    #[test]
    fn months_and_weekdays_reach_the_engine_as_value_lists() {
        let (_, normalized) = Fields::parse("*/5 1-3 */10 jan-MAR,dec sun-sun").unwrap();
        assert_eq!(normalized, "*/5 1-3 */10 1,2,3,12 0");
        let (_, normalized) = Fields::parse("0 0 1 * SAT-7").unwrap();
        assert_eq!(normalized, "0 0 1 * 0,6");
        let (_, normalized) = Fields::parse("0 0 1 * fri-sun").unwrap();
        assert_eq!(normalized, "0 0 1 * 0,5,6");
        assert!(Fields::parse("0 0 1 * 6-0").is_err());
    }

    #[test]
    fn sunday_is_zero_and_seven() {
        assert_eq!(fields("0 0 * * 7").weekdays, 1);
        assert_eq!(fields("0 0 * * 5-7").weekdays, 1 | 1 << 5 | 1 << 6);
        assert_eq!(fields("0 0 * * */2").weekdays, 1 | 1 << 2 | 1 << 4 | 1 << 6);
        assert_eq!(fields("0 0 * * SUN").weekdays, 1);
    }

    #[test]
    fn only_plain_minute_and_hour_values_are_fixed_times() {
        for fixed in ["30 2 * * *", "0 1,13 * * *", "0,30 2 * * *", "0 9-17 * * *"] {
            assert!(fields(fixed).is_fixed_time(), "{fixed}");
        }
        for interval in [
            "*/15 * * * *",
            "0 * * * *",
            "0 */2 * * *",
            "0-59/15 1 * * *",
        ] {
            assert!(!fields(interval).is_fixed_time(), "{interval}");
        }
    }

    #[test]
    fn aliases_expand_to_five_fields() {
        assert_eq!(Fields::parse("@daily").unwrap().1, "0 0 * * *");
        assert_eq!(Fields::parse("@HOURLY").unwrap().1, "0 * * * *");
        assert_eq!(Fields::parse("@weekly").unwrap().1, "0 0 * * 0");
        assert!(error("@reboot").contains("unknown alias"));
    }

    #[test]
    fn malformed_fields_name_the_problem() {
        assert!(error("*/0 * * * *").contains("step"));
        // A `*` in a list is every value, in every field.
        for expression in ["*,5 * * * *", "*/12,* * * * *", "* 9 *,6-18,3 * *"] {
            assert!(
                crate::schedule::CronSchedule::parse(expression).is_ok(),
                "{expression}"
            );
        }
        assert!(error("61 * * * *").contains("minute field: value 61 is out of range 0-59"));
        assert!(error("0 0 0 * *").contains("day-of-month"));
        assert!(error("0 0 * 13 *").contains("month"));
        assert!(error("0 0 * * 8").contains("day-of-week"));
        assert!(error("0 0 0 * * *").contains("seconds"));
        assert!(error("0 0 * *").contains("found 4"));
        assert!(error("").contains("empty"));
        assert!(error("   ").contains("empty"));
        assert!(error("5/2 * * * *").contains("a step needs * or a range"));
        assert!(error("0 0 * * FRI-MON").contains("runs backwards"));
        assert!(error("0 0 1,,2 * *").contains("empty item"));
        assert!(error("0 0 1, * *").contains("empty item"));
        assert!(error("0 0 ? * MON").contains("not standard cron"));
        assert!(error("0 0 L * *").contains("not standard cron"));
        assert!(error("0 0 15W * *").contains("not standard cron"));
        assert!(error("0 0 * * 5#2").contains("not standard cron"));
        assert!(error("0 0 * * +MON").contains("not standard cron"));
        assert!(error("0 0 * * MONDAY").contains("not a valid value"));
        assert!(error("JAN 0 * * *").contains("minute field"));
        assert!(error("99999999999 * * * *").contains("out of range"));
        assert!(error("*/61 * * * *").contains("from 1 to 60"));
        assert!(error("*/+5 * * * *").contains("from 1 to 60"));
        assert!(error("0 0 * * */8").contains("from 1 to 7"));
        assert!(error("- * * * *").contains("missing"));
    }

    #[test]
    fn impossible_dates_are_detected_statically() {
        assert!(!fields("0 0 30 2 *").can_fire());
        assert!(!fields("0 0 31 4,6,9,11 *").can_fire());
        assert!(!fields("0 0 30-31 FEB *").can_fire());
        // February 29 exists in leap years.
        assert!(fields("0 0 29 2 *").can_fire());
        // A restricted weekday is OR-ed in, so the day still comes round.
        assert!(fields("0 0 30 2 MON").can_fire());
        assert!(fields("0 0 31 * *").can_fire());
        assert!(fields("0 0 * 2 *").can_fire());
    }

    #[test]
    fn day_fields_follow_or_semantics_unless_one_is_a_bare_star() {
        // 2026-06-01 is a Monday, 2026-06-02 a Tuesday.
        let either = fields("0 0 1-31/2 * MON");
        assert!(either.matches(at(2026, 6, 3, 0, 0)), "odd day");
        assert!(either.matches(at(2026, 6, 8, 0, 0)), "Monday");
        assert!(!either.matches(at(2026, 6, 2, 0, 0)));
        let mondays = fields("0 0 * * MON");
        assert!(mondays.matches(at(2026, 6, 1, 0, 0)));
        assert!(!mondays.matches(at(2026, 6, 2, 0, 0)));
        let firsts = fields("0 0 1 * *");
        assert!(firsts.matches(at(2026, 6, 1, 0, 0)));
        assert!(!firsts.matches(at(2026, 6, 8, 0, 0)));
        assert!(!firsts.matches(at(2026, 6, 1, 0, 1)), "minute");
        assert!(firsts.matches(at(2026, 6, 1, 0, 0) + chrono::TimeDelta::seconds(59)));
    }

    #[test]
    fn a_step_over_every_weekday_still_restricts_the_day_fields() {
        // `*/1` names every weekday but is not a bare `*`, so the day fields
        // are OR-ed: the 1st, or any weekday, which is every day. Vixie cron
        // reads a field starting with `*` as unrestricted (the 1st only);
        // README says which rule ruled follows.
        let every_day = fields("0 0 1 * */1");
        assert!(every_day.matches(at(2026, 6, 1, 0, 0)));
        assert!(every_day.matches(at(2026, 6, 2, 0, 0)));
        let firsts_or_sundays = fields("0 0 1 * */7");
        assert!(firsts_or_sundays.matches(at(2026, 6, 1, 0, 0)), "the 1st");
        assert!(firsts_or_sundays.matches(at(2026, 6, 7, 0, 0)), "a Sunday");
        assert!(!firsts_or_sundays.matches(at(2026, 6, 2, 0, 0)));
    }
}
