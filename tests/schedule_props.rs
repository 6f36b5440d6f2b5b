//! Property test: random standard cron expressions in zones with unusual DST
//! (half-hour, 45-minute, midnight transitions), checked against an
//! independent model of the expression.
//!
//! For each generated case the next few occurrences must be strictly
//! increasing, each must be an occurrence by the model (a matching wall-clock
//! minute, or, for fixed-time expressions, the end of a DST gap that hid a
//! matching minute), and no occurrence may be missed between two returned
//! ones. Expressions that can never fire must be rejected at parse time.
//!
//! `PROPTEST_CASES=2000 cargo test --test schedule_props` runs it harder.

use std::time::{Duration, Instant};

use chrono::{
    DateTime, Datelike, LocalResult, NaiveDateTime, Offset, TimeDelta, TimeZone, Timelike, Utc,
};
use chrono_tz::Tz;
use proptest::prelude::*;
use proptest::test_runner::Config;
use ruled::schedule::{CronSchedule, ScheduleError};

const ZONES: [Tz; 9] = [
    chrono_tz::America::New_York,
    chrono_tz::Europe::Berlin,
    chrono_tz::Australia::Lord_Howe,
    chrono_tz::Asia::Riyadh,
    chrono_tz::Asia::Kolkata,
    chrono_tz::UTC,
    chrono_tz::Pacific::Chatham,
    // Transitions at midnight, so a gap or a repeated hour crosses dates.
    chrono_tz::America::Santiago,
    chrono_tz::Asia::Tehran,
];

const MONTHS: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const WEEKDAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

#[derive(Debug, Clone, Copy)]
enum Kind {
    Minute,
    Hour,
    Day,
    Month,
    Weekday,
}

impl Kind {
    fn bounds(self) -> (u32, u32) {
        match self {
            Kind::Minute => (0, 59),
            Kind::Hour => (0, 23),
            Kind::Day => (1, 31),
            Kind::Month => (1, 12),
            Kind::Weekday => (0, 7),
        }
    }

    fn star(self) -> (u32, u32) {
        match self {
            Kind::Weekday => (0, 6),
            other => other.bounds(),
        }
    }

    fn render(self, value: u32, as_name: bool) -> String {
        match self {
            Kind::Month if as_name => MONTHS[value as usize - 1].to_string(),
            Kind::Weekday if as_name && value < 7 => WEEKDAYS[value as usize].to_lowercase(),
            _ => value.to_string(),
        }
    }
}

/// One field: its text and the values it selects, computed independently of
/// the code under test.
#[derive(Debug, Clone)]
struct FieldModel {
    text: String,
    values: Vec<u32>,
    bare_star: bool,
    interval: bool,
}

impl FieldModel {
    fn has(&self, value: u32) -> bool {
        self.values.contains(&value)
    }
}

/// One list item with its values inside `low..=high` (a `*/n` item always
/// spans the whole field).
fn item(kind: Kind, low: u32, high: u32) -> BoxedStrategy<(String, Vec<u32>, bool)> {
    let (star_low, star_high) = kind.star();
    let width = star_high - star_low + 1;
    let stepped = |from: u32, to: u32, step: u32| (from..=to).step_by(step as usize).collect();
    prop_oneof![
        (1..=width).prop_map(move |step| {
            (
                format!("*/{step}"),
                stepped(star_low, star_high, step),
                true,
            )
        }),
        plain_item(kind, low, high),
        (low..=high, low..=high, 1..=width).prop_map(move |(a, b, step)| {
            let (a, b) = (a.min(b), a.max(b));
            (format!("{a}-{b}/{step}"), stepped(a, b, step), true)
        }),
    ]
    .boxed()
}

/// A value or a range: the items of a fixed-time minute or hour field.
fn plain_item(kind: Kind, low: u32, high: u32) -> BoxedStrategy<(String, Vec<u32>, bool)> {
    prop_oneof![
        (low..=high, any::<bool>()).prop_map(move |(v, name)| (
            kind.render(v, name),
            vec![v],
            false
        )),
        (low..=high, low..=high, any::<bool>()).prop_map(move |(a, b, name)| {
            let (a, b) = (a.min(b), a.max(b));
            // SAT-SUN style: a range may end on SUN, meaning 7.
            let end = match kind {
                Kind::Weekday if name && b == 7 && a > 0 => "sun".to_string(),
                _ => kind.render(b, name),
            };
            (
                format!("{}-{end}", kind.render(a, name)),
                (a..=b).collect(),
                false,
            )
        }),
    ]
    .boxed()
}

fn field(kind: Kind, star_weight: u32) -> BoxedStrategy<FieldModel> {
    let (low, high) = kind.bounds();
    field_in(kind, low, high, star_weight)
}

fn field_in(kind: Kind, low: u32, high: u32, star_weight: u32) -> BoxedStrategy<FieldModel> {
    prop_oneof![
        star_weight => Just(star(kind)),
        10 => list_of(kind, item(kind, low, high)),
    ]
    .boxed()
}

/// A field of values and ranges only, never `*` or a step.
fn plain_field_in(kind: Kind, low: u32, high: u32) -> BoxedStrategy<FieldModel> {
    list_of(kind, plain_item(kind, low, high))
}

fn list_of(kind: Kind, item: BoxedStrategy<(String, Vec<u32>, bool)>) -> BoxedStrategy<FieldModel> {
    prop::collection::vec(item, 1..=3)
        .prop_map(move |items| {
            let text = items
                .iter()
                .map(|i| i.0.as_str())
                .collect::<Vec<_>>()
                .join(",");
            let mut values: Vec<u32> = items.iter().flat_map(|i| i.1.clone()).collect();
            if let Kind::Weekday = kind {
                values.iter_mut().for_each(|v| *v %= 7);
            }
            values.sort_unstable();
            values.dedup();
            let interval = items.iter().any(|i| i.2);
            FieldModel {
                text,
                values,
                bare_star: false,
                interval,
            }
        })
        .boxed()
}

#[derive(Debug, Clone)]
struct Model {
    minute: FieldModel,
    hour: FieldModel,
    day: FieldModel,
    month: FieldModel,
    weekday: FieldModel,
}

impl Model {
    fn expression(&self) -> String {
        [
            &self.minute,
            &self.hour,
            &self.day,
            &self.month,
            &self.weekday,
        ]
        .map(|f| f.text.as_str())
        .join(" ")
    }

    fn fixed_time(&self) -> bool {
        !self.minute.interval && !self.hour.interval
    }

    fn never_fires(&self) -> bool {
        let longest = |m: u32| match m {
            2 => 29,
            4 | 6 | 9 | 11 => 30,
            _ => 31,
        };
        self.weekday.bare_star
            && !self.day.bare_star
            && !self
                .month
                .values
                .iter()
                .any(|&m| self.day.values.iter().any(|&d| d <= longest(m)))
    }

    fn matches(&self, local: NaiveDateTime) -> bool {
        let day = self.day.has(local.day());
        let weekday = self.weekday.has(local.weekday().num_days_from_sunday());
        let day_ok = if self.day.bare_star {
            weekday
        } else if self.weekday.bare_star {
            day
        } else {
            day || weekday
        };
        day_ok
            && self.minute.has(local.minute())
            && self.hour.has(local.hour())
            && self.month.has(local.month())
    }
}

fn star(kind: Kind) -> FieldModel {
    let (low, high) = kind.star();
    FieldModel {
        text: "*".into(),
        values: (low..=high).collect(),
        bare_star: true,
        interval: true,
    }
}

/// Three mixes: anything; hours where zones change their clocks (00–03,
/// and 22–23 for zones that turn midnight back to 23:00) on every day; and
/// late days of short months, which is where expressions can never fire.
fn model() -> impl Strategy<Value = Model> {
    let build = |(minute, hour, day, month, weekday)| Model {
        minute,
        hour,
        day,
        month,
        weekday,
    };
    let anything = (
        field(Kind::Minute, 3),
        field(Kind::Hour, 4),
        field(Kind::Day, 8),
        field(Kind::Month, 10),
        field(Kind::Weekday, 8),
    )
        .prop_map(build);
    let dst_hours = (
        prop_oneof![field(Kind::Minute, 3), plain_field_in(Kind::Minute, 0, 59)],
        prop_oneof![
            2 => field_in(Kind::Hour, 0, 3, 0),
            2 => plain_field_in(Kind::Hour, 0, 3),
            1 => plain_field_in(Kind::Hour, 22, 23),
        ],
        Just(star(Kind::Day)),
        Just(star(Kind::Month)),
        field(Kind::Weekday, 20),
    )
        .prop_map(build);
    let short_months =
        prop::sample::subsequence(vec![1u32, 2, 4, 6, 9, 11], 1..=3).prop_map(|months| {
            FieldModel {
                text: months
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
                values: months,
                bare_star: false,
                interval: false,
            }
        });
    let late_days = (
        field(Kind::Minute, 3),
        field(Kind::Hour, 4),
        field_in(Kind::Day, 28, 31, 0),
        short_months,
        prop_oneof![4 => Just(star(Kind::Weekday)), 1 => field(Kind::Weekday, 0)],
    )
        .prop_map(build);
    prop_oneof![2 => anything, 2 => dst_hours, 1 => late_days]
}

fn offset(tz: Tz, t: DateTime<Utc>) -> i64 {
    i64::from(
        tz.offset_from_utc_datetime(&t.naive_utc())
            .fix()
            .local_minus_utc(),
    )
}

/// The next instant within ~400 days at which `tz` changes offset.
fn next_transition(tz: Tz, from: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let base = offset(tz, from);
    let mut low = from;
    for _ in 0..400 {
        let high = low + TimeDelta::days(1);
        if offset(tz, high) != base {
            let (mut low, mut high) = (low.timestamp(), high.timestamp());
            while high - low > 1 {
                let middle = (low + high) / 2;
                if offset(tz, DateTime::from_timestamp(middle, 0)?) == base {
                    low = middle;
                } else {
                    high = middle;
                }
            }
            return DateTime::from_timestamp(high, 0);
        }
        low = high;
    }
    None
}

/// Is `t` an instant at which the schedule should run, by the model?
fn is_occurrence(model: &Model, tz: Tz, t: DateTime<Utc>) -> bool {
    let local = t.with_timezone(&tz).naive_local();
    if local.second() != 0 || local.nanosecond() != 0 {
        return false;
    }
    if model.matches(local) {
        // A fixed time runs on the first pass of a repeated hour only.
        let later_pass = matches!(
            tz.from_local_datetime(&local),
            LocalResult::Ambiguous(earlier, later) if later == t && earlier != t
        );
        return !(model.fixed_time() && later_pass);
    }
    gap_shifted(model, tz, t)
}

/// A fixed time skipped by a spring-forward gap runs when the gap ends.
fn gap_shifted(model: &Model, tz: Tz, t: DateTime<Utc>) -> bool {
    let jump = offset(tz, t) - offset(tz, t - TimeDelta::seconds(1));
    if !model.fixed_time() || jump <= 0 {
        return false;
    }
    let local = t.with_timezone(&tz).naive_local();
    (1..=jump / 60).any(|minutes| model.matches(local - TimeDelta::minutes(minutes)))
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(256)
}

proptest! {
    #![proptest_config(Config { cases: cases(), failure_persistence: None, ..Config::default() })]

    #[test]
    fn occurrences_are_increasing_complete_and_match(
        model in model(),
        zone in 0..ZONES.len(),
        start_secs in 946_684_800i64..2_240_524_800, // 2000-01-01 .. 2041-01-01
        near_transition in prop::bool::weighted(0.75),
        lead_minutes in 0i64..240,
    ) {
        let tz = ZONES[zone];
        let expression = model.expression();
        let mut start = DateTime::from_timestamp(start_secs, 0).unwrap();
        if near_transition && let Some(change) = next_transition(tz, start) {
            start = change - TimeDelta::minutes(lead_minutes);
        }
        let context = format!("{expression:?} in {tz} from {start}");

        let schedule = match CronSchedule::parse(&expression) {
            Ok(schedule) => schedule,
            Err(ScheduleError::NeverFires(_)) => {
                prop_assert!(model.never_fires(), "wrongly rejected: {}", context);
                return Ok(());
            }
            Err(other) => return Err(TestCaseError::fail(format!("{context}: {other}"))),
        };
        prop_assert!(!model.never_fires(), "accepted but can never fire: {}", context);
        prop_assert_eq!(schedule.is_fixed_time(), model.fixed_time(), "{}", &context);

        let mut previous = start;
        for _ in 0..5 {
            let started = Instant::now();
            let next = schedule.next_after(tz, previous);
            prop_assert!(started.elapsed() < Duration::from_secs(2), "slow: {}", context);
            let next = match next {
                Ok(next) => next,
                Err(e) => return Err(TestCaseError::fail(format!("{context}: {e}"))),
            };
            let local = next.with_timezone(&tz);
            prop_assert!(next > previous, "{}: {} not after {}", context, next, previous);
            prop_assert!(
                is_occurrence(&model, tz, next),
                "{}: {} ({}) is not an occurrence", context, next, local
            );
            prop_assert_eq!(
                schedule.matches(tz, next),
                model.matches(local.naive_local()),
                "{}: matches() at {}", &context, local
            );
            // Nothing skipped in between (checked minute by minute when short).
            if next - previous <= TimeDelta::hours(36) {
                let mut t = DateTime::from_timestamp(previous.timestamp() - previous.timestamp().rem_euclid(60) + 60, 0).unwrap();
                while t < next {
                    prop_assert!(
                        !is_occurrence(&model, tz, t),
                        "{}: missed {} ({}) before {}", context, t, t.with_timezone(&tz), local
                    );
                    prop_assert_eq!(
                        schedule.matches(tz, t),
                        model.matches(t.with_timezone(&tz).naive_local()),
                        "{}: matches() at {}", &context, t
                    );
                    t += TimeDelta::minutes(1);
                }
            }
            previous = next;
        }
    }
}
