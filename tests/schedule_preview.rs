//! Previews: cron occurrences with the operation window applied, as the
//! service would run them.

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::{America, Asia, Tz};
use ruled::schedule::{CronSchedule, Window, preview};

fn utc(y: i32, m: u32, d: u32, h: u32, min: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, m, d, h, min, 0).unwrap()
}

fn window(text: &str) -> Option<Window> {
    Some(text.parse().unwrap())
}

fn hourly() -> CronSchedule {
    CronSchedule::parse("0 * * * *").unwrap()
}

fn local(runs: &[DateTime<Utc>], tz: Tz) -> Vec<String> {
    runs.iter()
        .map(|t| t.with_timezone(&tz).format("%d %H:%M").to_string())
        .collect()
}

#[test]
fn hourly_inside_a_business_day_window() {
    let runs = preview(
        &hourly(),
        Tz::UTC,
        window("09:00-17:00"),
        utc(2026, 6, 1, 0, 0),
        10,
    )
    .unwrap();
    assert_eq!(
        local(&runs, Tz::UTC),
        [
            "01 09:00", "01 10:00", "01 11:00", "01 12:00", "01 13:00", "01 14:00", "01 15:00",
            "01 16:00", "02 09:00", "02 10:00"
        ]
    );
}

#[test]
fn overnight_window_runs_across_midnight() {
    let riyadh = Asia::Riyadh;
    let from = utc(2026, 6, 1, 9, 0); // 12:00 local
    let runs = preview(&hourly(), riyadh, window("22:00-06:00"), from, 10).unwrap();
    assert_eq!(
        local(&runs, riyadh),
        [
            "01 22:00", "01 23:00", "02 00:00", "02 01:00", "02 02:00", "02 03:00", "02 04:00",
            "02 05:00", "02 22:00", "02 23:00"
        ]
    );
}

#[test]
fn without_a_window_runs_are_the_plain_occurrences() {
    let schedule = CronSchedule::parse("*/20 * * * *").unwrap();
    let from = utc(2026, 6, 1, 10, 5);
    let runs = preview(&schedule, Tz::UTC, None, from, 4).unwrap();
    assert_eq!(
        runs,
        [
            utc(2026, 6, 1, 10, 20),
            utc(2026, 6, 1, 10, 40),
            utc(2026, 6, 1, 11, 0),
            utc(2026, 6, 1, 11, 20)
        ]
    );
    let mut after = from;
    for run in &runs {
        assert_eq!(*run, schedule.next_after(Tz::UTC, after).unwrap());
        after = *run;
    }
}

#[test]
fn deferred_run_is_followed_by_the_next_occurrence_after_it() {
    // Daily at 07:00 with a 09:00 window: the run waits for 09:00 each day.
    let schedule = CronSchedule::parse("0 7 * * *").unwrap();
    let runs = preview(
        &schedule,
        Tz::UTC,
        window("09:00-17:00"),
        utc(2026, 6, 1, 0, 0),
        3,
    )
    .unwrap();
    assert_eq!(
        runs,
        [
            utc(2026, 6, 1, 9, 0),
            utc(2026, 6, 2, 9, 0),
            utc(2026, 6, 3, 9, 0)
        ]
    );
}

#[test]
fn runs_are_strictly_increasing_across_dst() {
    let ny = America::New_York;
    let schedule = CronSchedule::parse("*/30 * * * *").unwrap();
    let runs = preview(
        &schedule,
        ny,
        window("01:00-03:00"),
        utc(2026, 10, 31, 12, 0),
        12,
    )
    .unwrap();
    assert!(runs.windows(2).all(|pair| pair[0] < pair[1]));
    // 01:00-02:00 happens twice on fall-back night, and the window is open
    // on both passes.
    assert_eq!(
        local(&runs, ny),
        [
            "01 01:00", "01 01:30", "01 01:00", "01 01:30", "01 02:00", "01 02:30", "02 01:00",
            "02 01:30", "02 02:00", "02 02:30", "03 01:00", "03 01:30"
        ]
    );
}

#[test]
fn zero_count_is_empty() {
    assert!(
        preview(&hourly(), Tz::UTC, None, utc(2026, 6, 1, 0, 0), 0)
            .unwrap()
            .is_empty()
    );
}

mod properties {
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::Config;
    use ruled::schedule::{TimeOfDay, local_time_of_day, window_contains};

    const EXPRESSIONS: [&str; 6] = [
        "*/15 * * * *",
        "0 * * * *",
        "30 2 * * *",
        "0 1,13 * * MON-FRI",
        "5 */3 1-10 * *",
        "0 0 29 2 *",
    ];
    const ZONES: [Tz; 4] = [
        America::New_York,
        Asia::Riyadh,
        chrono_tz::Australia::Lord_Howe,
        chrono_tz::Europe::Berlin,
    ];

    proptest! {
        #![proptest_config(Config { cases: 128, failure_persistence: None, ..Config::default() })]

        /// Runs increase, sit inside the window, and each is the window's
        /// opening at or after the occurrence that follows the previous run.
        #[test]
        fn runs_increase_and_respect_the_window(
            expression in 0..EXPRESSIONS.len(),
            zone in 0..ZONES.len(),
            bounds in proptest::option::of((0u32..1440, 0u32..1440)),
            start_secs in 946_684_800i64..2_240_524_800,
        ) {
            let schedule = CronSchedule::parse(EXPRESSIONS[expression]).unwrap();
            let tz = ZONES[zone];
            let w = bounds.map(|(from, to)| Window {
                from: TimeOfDay::new(from / 60, from % 60).unwrap(),
                to: TimeOfDay::new(to / 60, to % 60).unwrap(),
            });
            let from = DateTime::from_timestamp(start_secs, 0).unwrap();
            let runs = preview(&schedule, tz, w, from, 6).unwrap();
            prop_assert_eq!(runs.len(), 6);
            let mut after = from;
            for run in runs {
                prop_assert!(run > after);
                prop_assert!(window_contains(w, local_time_of_day(tz, run)));
                let occurrence = schedule.next_after(tz, after).unwrap();
                prop_assert!(run >= occurrence);
                after = run;
            }
        }
    }
}
