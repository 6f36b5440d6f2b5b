//! Cron parsing and next-occurrence behaviour through the public API,
//! including the DST cases of DESIGN §3.

use std::time::{Duration, Instant};

use chrono::{DateTime, NaiveDate, TimeDelta, TimeZone, Utc};
use chrono_tz::Tz;
use chrono_tz::{America, Australia, Europe, Pacific};
use ruled::schedule::{CronSchedule, ScheduleError, next_after, next_after_millis, parse_timezone};

fn utc(y: i32, m: u32, d: u32, h: u32, min: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, m, d, h, min, 0).unwrap()
}

fn schedule(expression: &str) -> CronSchedule {
    CronSchedule::parse(expression).unwrap_or_else(|e| panic!("{expression}: {e}"))
}

/// All occurrences in `[from, until)`.
fn occurrences(
    expression: &str,
    tz: Tz,
    from: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Vec<DateTime<Utc>> {
    let schedule = schedule(expression);
    let mut out = Vec::new();
    let mut t = from - TimeDelta::seconds(1);
    loop {
        t = schedule.next_after(tz, t).unwrap();
        if t >= until {
            return out;
        }
        out.push(t);
    }
}

/// Occurrences whose local date in `tz` is the given day.
fn on_local_day(expression: &str, tz: Tz, y: i32, m: u32, d: u32) -> Vec<String> {
    let day = NaiveDate::from_ymd_opt(y, m, d).unwrap();
    let from = utc(y, m, d, 0, 0) - TimeDelta::days(1);
    occurrences(expression, tz, from, from + TimeDelta::days(3))
        .into_iter()
        .map(|t| t.with_timezone(&tz))
        .filter(|t| t.date_naive() == day)
        .map(|t| t.format("%H:%M %Z").to_string())
        .collect()
}

#[test]
fn standard_syntax_names_ranges_lists_and_steps() {
    let from = utc(2026, 6, 1, 0, 0); // a Monday
    let tz = Tz::UTC;
    assert_eq!(
        occurrences("*/20 9-10 * * MON-FRI", tz, from, utc(2026, 6, 2, 0, 0)),
        [
            utc(2026, 6, 1, 9, 0),
            utc(2026, 6, 1, 9, 20),
            utc(2026, 6, 1, 9, 40),
            utc(2026, 6, 1, 10, 0),
            utc(2026, 6, 1, 10, 20),
            utc(2026, 6, 1, 10, 40),
        ]
    );
    let next = next_after("0 12 1,15 jan-MAR *", tz, from).unwrap();
    assert_eq!(next, utc(2027, 1, 1, 12, 0));
    let next = next_after("30 6 * * SAT,SUN", tz, from).unwrap();
    assert_eq!(next, utc(2026, 6, 6, 6, 30));
    let next = next_after("0 0 * * 7", tz, from).unwrap();
    assert_eq!(next, utc(2026, 6, 7, 0, 0));
    let next = next_after("0 0 1-31/10 */3 *", tz, from).unwrap();
    assert_eq!(next, utc(2026, 7, 1, 0, 0));
    assert_eq!(
        next_after("@hourly", tz, from).unwrap(),
        utc(2026, 6, 1, 1, 0)
    );
    assert_eq!(
        next_after("@weekly", tz, from).unwrap(),
        utc(2026, 6, 7, 0, 0)
    );
}

#[test]
fn weekday_names_in_ranges_mean_what_they_say() {
    // croner alone reads SUN-SUN as 0-7, every day.
    let monday = utc(2026, 6, 1, 0, 0);
    assert_eq!(
        next_after("0 0 * * SUN-SUN", Tz::UTC, monday).unwrap(),
        utc(2026, 6, 7, 0, 0)
    );
    assert_eq!(
        next_after("0 0 * * sat-sun", Tz::UTC, monday).unwrap(),
        utc(2026, 6, 6, 0, 0)
    );
    assert_eq!(
        next_after("0 0 * * FRI-7", Tz::UTC, monday).unwrap(),
        utc(2026, 6, 5, 0, 0)
    );
}

#[test]
fn both_day_fields_restricted_means_either_matches() {
    // The 13th, or any Friday: standard cron OR semantics.
    let runs = occurrences(
        "0 0 13 * FRI",
        Tz::UTC,
        utc(2026, 6, 1, 0, 0),
        utc(2026, 6, 20, 0, 0),
    );
    assert_eq!(
        runs,
        [
            utc(2026, 6, 5, 0, 0),
            utc(2026, 6, 12, 0, 0),
            utc(2026, 6, 13, 0, 0),
            utc(2026, 6, 19, 0, 0)
        ]
    );
}

#[test]
fn invalid_expressions_are_rejected_with_the_reason() {
    for (expression, needle) in [
        ("*/0 * * * *", "step"),
        ("61 * * * *", "out of range 0-59"),
        ("0 0 0 * * *", "seconds"),
        ("*/5 0 0 * * *", "found 6"),
        ("0 0 * *", "found 4"),
        ("", "empty"),
        ("0 0 L * *", "not standard cron"),
        ("0 0 ? * MON", "not standard cron"),
        ("0 25 * * *", "hour field"),
        ("0 0 * * FRI-MON", "backwards"),
        ("@reboot", "unknown alias"),
    ] {
        match CronSchedule::parse(expression) {
            Err(ScheduleError::InvalidCron {
                expression: e,
                reason,
            }) => {
                assert_eq!(e, expression);
                assert!(reason.contains(needle), "{expression}: {reason}");
            }
            other => panic!("{expression}: expected InvalidCron, got {other:?}"),
        }
    }
}

#[test]
fn an_expression_that_can_never_fire_is_an_error_at_once() {
    for expression in ["0 0 30 2 *", "0 0 31 4,6,9,11 *", "15 10 30-31 FEB *"] {
        let started = Instant::now();
        let error = CronSchedule::parse(expression).unwrap_err();
        assert!(
            started.elapsed() < Duration::from_millis(50),
            "{expression} took long"
        );
        assert_eq!(error, ScheduleError::NeverFires(expression.to_string()));
        assert!(error.to_string().contains("can never fire"));
        assert!(next_after(expression, Tz::UTC, utc(2026, 1, 1, 0, 0)).is_err());
    }
    // With a weekday too, either field may match, so it does fire.
    assert!(CronSchedule::parse("0 0 30 2 MON").is_ok());
}

#[test]
fn february_29_fires_in_leap_years_only() {
    let s = schedule("0 0 29 2 *");
    let first = s.next_after(Tz::UTC, utc(2026, 6, 1, 0, 0)).unwrap();
    assert_eq!(first, utc(2028, 2, 29, 0, 0));
    assert_eq!(
        s.next_after(Tz::UTC, first).unwrap(),
        utc(2032, 2, 29, 0, 0)
    );
    // 2100 is not a leap year.
    assert_eq!(
        s.next_after(Tz::UTC, utc(2096, 3, 1, 0, 0)).unwrap(),
        utc(2104, 2, 29, 0, 0)
    );
}

#[test]
fn new_york_spring_forward_fixed_time_fires_once_after_the_gap() {
    let ny = America::New_York;
    assert_eq!(on_local_day("30 2 * * *", ny, 2026, 3, 8), ["03:00 EDT"]);
    assert_eq!(
        next_after("30 2 * * *", ny, utc(2026, 3, 7, 12, 0)).unwrap(),
        utc(2026, 3, 8, 7, 0)
    );
    assert_eq!(on_local_day("30 2 * * *", ny, 2026, 3, 9), ["02:30 EDT"]);
    // A list of fixed times gets the same treatment.
    assert_eq!(
        on_local_day("30 2,14 * * *", ny, 2026, 3, 8),
        ["03:00 EDT", "14:30 EDT"]
    );
    assert_eq!(on_local_day("0,30 2 * * *", ny, 2026, 3, 8), ["03:00 EDT"]);
}

#[test]
fn new_york_fall_back_fixed_time_fires_once_on_the_first_pass() {
    let ny = America::New_York;
    assert_eq!(on_local_day("30 1 * * *", ny, 2026, 11, 1), ["01:30 EDT"]);
    assert_eq!(
        on_local_day("0 1,13 * * *", ny, 2026, 11, 1),
        ["01:00 EDT", "13:00 EST"]
    );
    // Starting inside the second pass, the time has already had its run.
    let in_second_pass = utc(2026, 11, 1, 6, 10); // 01:10 EST
    assert_eq!(
        next_after("30 1 * * *", ny, in_second_pass).unwrap(),
        utc(2026, 11, 2, 6, 30)
    );
}

#[test]
fn new_york_fall_back_intervals_follow_real_time() {
    let ny = America::New_York;
    let repeated = occurrences(
        "*/15 * * * *",
        ny,
        utc(2026, 11, 1, 5, 0),
        utc(2026, 11, 1, 7, 0),
    );
    let labels: Vec<String> = repeated
        .iter()
        .map(|t| t.with_timezone(&ny).format("%H:%M %Z").to_string())
        .collect();
    assert_eq!(
        labels,
        [
            "01:00 EDT",
            "01:15 EDT",
            "01:30 EDT",
            "01:45 EDT",
            "01:00 EST",
            "01:15 EST",
            "01:30 EST",
            "01:45 EST"
        ]
    );
    for pair in repeated.windows(2) {
        assert_eq!(pair[1] - pair[0], TimeDelta::minutes(15));
    }
    // Starting in the second pass continues in it.
    let t = next_after("*/15 * * * *", ny, utc(2026, 11, 1, 6, 20)).unwrap();
    assert_eq!(t, utc(2026, 11, 1, 6, 30));
    // Hourly stays hourly: 25 runs on the 25-hour day.
    assert_eq!(on_local_day("0 * * * *", ny, 2026, 11, 1).len(), 25);
    // And 23 on the 23-hour day: 02:00 does not exist for an interval job.
    let spring = on_local_day("0 * * * *", ny, 2026, 3, 8);
    assert_eq!(spring.len(), 23);
    assert_eq!(spring[1..3], ["01:00 EST", "03:00 EDT"]);
}

#[test]
fn berlin_spring_forward_day_is_not_skipped() {
    let berlin = Europe::Berlin;
    assert_eq!(
        on_local_day("30 2 * * *", berlin, 2026, 3, 29),
        ["03:00 CEST"]
    );
    assert_eq!(
        on_local_day("30 2 * * *", berlin, 2026, 3, 28),
        ["02:30 CET"]
    );
    assert_eq!(
        on_local_day("30 2 * * *", berlin, 2026, 3, 30),
        ["02:30 CEST"]
    );
    assert_eq!(
        on_local_day("30 2 * * *", berlin, 2026, 10, 25),
        ["02:30 CEST"]
    );
}

#[test]
fn lord_howe_half_hour_dst() {
    let lh = Australia::Lord_Howe;
    // 2026-10-04: 02:00 +1030 jumps to 02:30 +11.
    assert_eq!(on_local_day("15 2 * * *", lh, 2026, 10, 4), ["02:30 +11"]);
    assert_eq!(
        on_local_day("*/15 2 * * *", lh, 2026, 10, 4),
        ["02:30 +11", "02:45 +11"]
    );
    // 2026-04-05: 02:00 +11 goes back to 01:30 +1030.
    assert_eq!(on_local_day("45 1 * * *", lh, 2026, 4, 5), ["01:45 +11"]);
    assert_eq!(
        on_local_day("*/15 1 * * *", lh, 2026, 4, 5),
        [
            "01:00 +11",
            "01:15 +11",
            "01:30 +11",
            "01:45 +11",
            "01:30 +1030",
            "01:45 +1030"
        ]
    );
}

#[test]
fn chatham_quarter_hour_offset_dst() {
    let chatham = Pacific::Chatham;
    // 2026-09-27: 02:45 +1245 jumps to 03:45 +1345.
    assert_eq!(
        on_local_day("0 3 * * *", chatham, 2026, 9, 27),
        ["03:45 +1345"]
    );
    // 2026-04-05: 03:45 +1345 goes back to 02:45 +1245.
    assert_eq!(
        on_local_day("0 3 * * *", chatham, 2026, 4, 5),
        ["03:00 +1345"]
    );
    assert_eq!(on_local_day("0 3 * * *", chatham, 2026, 4, 5).len(), 1);
}

#[test]
fn next_run_is_recomputed_not_24_hours_later() {
    let ny = America::New_York;
    let s = schedule("0 9 * * *");
    let before = s.next_after(ny, utc(2026, 3, 7, 0, 0)).unwrap();
    assert_eq!(before, utc(2026, 3, 7, 14, 0)); // 09:00 EST
    let after = s.next_after(ny, before).unwrap();
    assert_eq!(after, utc(2026, 3, 8, 13, 0)); // 09:00 EDT, 23 h later
}

#[test]
fn next_after_is_strictly_after() {
    let s = schedule("0 * * * *");
    let on_the_hour = utc(2026, 6, 1, 10, 0);
    assert_eq!(
        s.next_after(Tz::UTC, on_the_hour).unwrap(),
        utc(2026, 6, 1, 11, 0)
    );
    let just_before = on_the_hour - TimeDelta::milliseconds(1);
    assert_eq!(s.next_after(Tz::UTC, just_before).unwrap(), on_the_hour);
    let just_after = on_the_hour + TimeDelta::milliseconds(1);
    assert_eq!(
        s.next_after(Tz::UTC, just_after).unwrap(),
        utc(2026, 6, 1, 11, 0)
    );
}

#[test]
fn epoch_millis_round_trip() {
    let s = schedule("*/5 * * * *");
    let riyadh = parse_timezone("Asia/Riyadh").unwrap();
    let after = utc(2026, 6, 1, 10, 2).timestamp_millis() + 123;
    let next = next_after_millis(&s, riyadh, after).unwrap();
    assert_eq!(next, utc(2026, 6, 1, 10, 5).timestamp_millis());
    assert_eq!(
        next_after_millis(&s, riyadh, i64::MAX),
        Err(ScheduleError::InvalidTimestamp(i64::MAX))
    );
}

#[test]
fn matches_reads_the_local_wall_clock() {
    let s = schedule("30 9 * * MON-FRI");
    let riyadh = parse_timezone("Asia/Riyadh").unwrap();
    // 06:30 UTC is 09:30 in Riyadh (UTC+3) on Monday 2026-06-01.
    assert!(s.matches(riyadh, utc(2026, 6, 1, 6, 30)));
    assert!(s.matches(riyadh, utc(2026, 6, 1, 6, 30) + TimeDelta::seconds(59)));
    assert!(!s.matches(riyadh, utc(2026, 6, 1, 6, 31)));
    assert!(!s.matches(Tz::UTC, utc(2026, 6, 1, 6, 30)));
    assert!(!s.matches(riyadh, utc(2026, 6, 6, 6, 30)), "Saturday");
    // The skipped 02:30 on New York's spring-forward day still matches as a
    // wall-clock time, though no instant has it.
    let skipped = NaiveDate::from_ymd_opt(2026, 3, 8)
        .unwrap()
        .and_hms_opt(2, 30, 0)
        .unwrap();
    assert!(schedule("30 2 * * *").matches_local(skipped));
}

#[test]
fn schedule_keeps_the_expression_and_its_policy() {
    let s = schedule(" 0 1,13 * * * ");
    assert_eq!(s.expression(), "0 1,13 * * *");
    assert!(s.is_fixed_time());
    assert!(!schedule("*/15 * * * *").is_fixed_time());
    assert_eq!(schedule("@daily").expression(), "@daily");
}

#[test]
fn unknown_zone_is_an_error_naming_it() {
    assert_eq!(
        parse_timezone("Europe/Atlantis"),
        Err(ScheduleError::UnknownTimeZone("Europe/Atlantis".into()))
    );
    assert_eq!(parse_timezone("Pacific/Chatham").unwrap(), Pacific::Chatham);
}
