//! Operation windows read through a zone's local time, and window openings
//! across DST.

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use chrono_tz::{America, Asia, Australia};
use ruled::schedule::{TimeOfDay, Window, local_time_of_day, next_window_open, window_contains};

fn utc(y: i32, m: u32, d: u32, h: u32, min: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, m, d, h, min, 0).unwrap()
}

fn tod(text: &str) -> TimeOfDay {
    text.parse().unwrap()
}

fn window(text: &str) -> Option<Window> {
    Some(text.parse().unwrap())
}

/// Is `window` open at the UTC instant `t` in `zone`?
fn open(window: Option<Window>, zone: chrono_tz::Tz, t: DateTime<Utc>) -> bool {
    window_contains(window, local_time_of_day(zone, t))
}

#[test]
fn riyadh_local_time_is_utc_plus_three_all_year() {
    let riyadh = Asia::Riyadh;
    assert_eq!(
        local_time_of_day(riyadh, utc(2026, 1, 15, 5, 59)),
        tod("08:59")
    );
    assert_eq!(
        local_time_of_day(riyadh, utc(2026, 7, 15, 6, 0)),
        tod("09:00")
    );
    assert_eq!(
        local_time_of_day(riyadh, utc(2026, 7, 15, 22, 30)),
        tod("01:30")
    );
    let business = window("09:00-17:00");
    assert!(!open(business, riyadh, utc(2026, 7, 15, 5, 59)));
    assert!(open(business, riyadh, utc(2026, 7, 15, 6, 0)));
    assert!(open(business, riyadh, utc(2026, 7, 15, 13, 59)));
    assert!(!open(business, riyadh, utc(2026, 7, 15, 14, 0)));
}

#[test]
fn new_york_local_time_follows_dst() {
    let ny = America::New_York;
    // 14:00 UTC is 09:00 EST in winter and 10:00 EDT in summer.
    assert_eq!(local_time_of_day(ny, utc(2026, 1, 15, 14, 0)), tod("09:00"));
    assert_eq!(local_time_of_day(ny, utc(2026, 7, 15, 14, 0)), tod("10:00"));
    let early = window("09:00-09:30");
    assert!(open(early, ny, utc(2026, 1, 15, 14, 0)));
    assert!(!open(early, ny, utc(2026, 7, 15, 14, 0)));
    // Both passes of the repeated hour read 01:xx.
    assert_eq!(local_time_of_day(ny, utc(2026, 11, 1, 5, 30)), tod("01:30"));
    assert_eq!(local_time_of_day(ny, utc(2026, 11, 1, 6, 30)), tod("01:30"));
    let overnight = window("22:00-06:00");
    assert!(open(overnight, ny, utc(2026, 11, 1, 6, 30)));
    assert!(!open(overnight, ny, utc(2026, 11, 1, 12, 0)));
}

#[test]
fn lord_howe_half_hour_offsets() {
    let lh = Australia::Lord_Howe;
    // +10:30 in winter, +11 in summer.
    assert_eq!(local_time_of_day(lh, utc(2026, 7, 1, 0, 0)), tod("10:30"));
    assert_eq!(local_time_of_day(lh, utc(2026, 1, 1, 0, 0)), tod("11:00"));
    let late_morning = window("10:30-11:00");
    assert!(open(late_morning, lh, utc(2026, 7, 1, 0, 0)));
    assert!(!open(late_morning, lh, utc(2026, 1, 1, 0, 0)));
}

#[test]
fn no_window_or_inside_it_opens_now() {
    let t = utc(2026, 6, 1, 10, 17) + TimeDelta::milliseconds(5);
    assert_eq!(next_window_open(None, Asia::Riyadh, t), t);
    assert_eq!(next_window_open(window("09:00-17:00"), Asia::Riyadh, t), t);
    // 17:00 local is outside a 09:00-17:00 window.
    let closing = utc(2026, 6, 1, 14, 0);
    assert_eq!(
        next_window_open(window("09:00-17:00"), Asia::Riyadh, closing),
        utc(2026, 6, 2, 6, 0)
    );
}

#[test]
fn opens_later_today_or_tomorrow() {
    let riyadh = Asia::Riyadh;
    let w = window("09:00-17:00");
    // 07:30 local: opens at 09:00 today.
    assert_eq!(
        next_window_open(w, riyadh, utc(2026, 6, 1, 4, 30)),
        utc(2026, 6, 1, 6, 0)
    );
    // 08:59:59.5 local: half a second to wait.
    let almost = utc(2026, 6, 1, 5, 59) + TimeDelta::milliseconds(59_500);
    assert_eq!(next_window_open(w, riyadh, almost), utc(2026, 6, 1, 6, 0));
    // 18:00 local: tomorrow 09:00.
    assert_eq!(
        next_window_open(w, riyadh, utc(2026, 6, 1, 15, 0)),
        utc(2026, 6, 2, 6, 0)
    );
}

#[test]
fn overnight_window_opens_across_midnight() {
    let riyadh = Asia::Riyadh;
    let w = window("22:00-06:00");
    assert_eq!(
        next_window_open(w, riyadh, utc(2026, 6, 1, 9, 0)),
        utc(2026, 6, 1, 19, 0)
    );
    let at_two = utc(2026, 6, 1, 23, 0); // 02:00 local
    assert_eq!(next_window_open(w, riyadh, at_two), at_two);
    // 06:00 local is outside: next opening 22:00 the same local day.
    assert_eq!(
        next_window_open(w, riyadh, utc(2026, 6, 2, 3, 0)),
        utc(2026, 6, 2, 19, 0)
    );
}

#[test]
fn window_start_in_a_dst_gap_opens_when_the_gap_ends() {
    let ny = America::New_York;
    // 2026-03-08 02:30 does not exist; the window opens at 03:00 EDT.
    let w = window("02:30-06:00");
    assert_eq!(
        next_window_open(w, ny, utc(2026, 3, 8, 5, 0)),
        utc(2026, 3, 8, 7, 0)
    );
    // A window wholly inside the gap does not exist that day.
    let gone = window("02:00-02:45");
    assert_eq!(
        next_window_open(gone, ny, utc(2026, 3, 8, 5, 0)),
        utc(2026, 3, 9, 6, 0)
    );
    // Lord Howe skips 02:00-02:30.
    let lh = Australia::Lord_Howe;
    let w = window("02:15-05:00");
    let before = utc(2026, 10, 3, 14, 0); // 00:30 +10:30
    assert_eq!(next_window_open(w, lh, before), utc(2026, 10, 3, 15, 30)); // 02:30 +11
}

#[test]
fn clock_turned_back_into_the_window_reopens_it() {
    let ny = America::New_York;
    // 01:45 EDT; at 02:00 EDT the clock goes back to 01:00 EST, inside.
    let w = window("00:30-01:30");
    assert_eq!(
        next_window_open(w, ny, utc(2026, 11, 1, 5, 45)),
        utc(2026, 11, 1, 6, 0)
    );
    // A start inside the repeated hour is met again on the second pass.
    let w = window("01:15-01:30");
    assert_eq!(
        next_window_open(w, ny, utc(2026, 11, 1, 5, 45)),
        utc(2026, 11, 1, 6, 15)
    );
}

#[test]
fn opening_is_computed_from_the_zone_not_by_adding_a_day() {
    let ny = America::New_York;
    let w = window("09:00-17:00");
    // After Saturday's window, Sunday 09:00 is EDT: 23 hours of clock later.
    let saturday_evening = utc(2026, 3, 7, 23, 0); // 18:00 EST
    assert_eq!(
        next_window_open(w, ny, saturday_evening),
        utc(2026, 3, 8, 13, 0)
    );
}

mod properties {
    use super::*;
    use chrono_tz::Tz;
    use proptest::prelude::*;
    use proptest::test_runner::Config;

    const ZONES: [Tz; 6] = [
        America::New_York,
        Australia::Lord_Howe,
        Asia::Riyadh,
        chrono_tz::Europe::Berlin,
        chrono_tz::Pacific::Chatham,
        chrono_tz::America::Santiago,
    ];

    fn offset(tz: Tz, secs: i64) -> i32 {
        use chrono::Offset;
        let t = DateTime::from_timestamp(secs, 0).unwrap();
        tz.offset_from_utc_datetime(&t.naive_utc())
            .fix()
            .local_minus_utc()
    }

    /// The next second (within ~400 days) at which `tz` changes offset.
    fn next_offset_change(tz: Tz, from: i64) -> Option<i64> {
        let base = offset(tz, from);
        let day = 86_400;
        let mut low = (0..400)
            .map(|n| from + n * day)
            .find(|&s| offset(tz, s + day) != base)?;
        let mut high = low + day;
        while high - low > 1 {
            let middle = (low + high) / 2;
            if offset(tz, middle) == base {
                low = middle;
            } else {
                high = middle;
            }
        }
        Some(high)
    }

    fn cases() -> u32 {
        std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|cases| cases.parse().ok())
            .unwrap_or(256)
    }

    proptest! {
        #![proptest_config(Config { cases: cases(), failure_persistence: None, ..Config::default() })]

        /// The opening is inside the window, and no minute before it (from
        /// `t`) is.
        #[test]
        fn opening_is_the_first_instant_inside(
            from in 0u32..1440,
            to in 0u32..1440,
            zone in 0..ZONES.len(),
            start_secs in 946_684_800i64..2_240_524_800,
            millis in 0i64..60_000,
            near_transition in prop::bool::weighted(0.75),
            lead_minutes in 0i64..1500,
        ) {
            let tz = ZONES[zone];
            let mut start_secs = start_secs;
            if near_transition && let Some(change) = next_offset_change(tz, start_secs) {
                start_secs = change - lead_minutes * 60;
            }
            let w = Window {
                from: TimeOfDay::new(from / 60, from % 60).unwrap(),
                to: TimeOfDay::new(to / 60, to % 60).unwrap(),
            };
            let t = DateTime::from_timestamp(start_secs, 0).unwrap() + TimeDelta::milliseconds(millis);
            let open = next_window_open(Some(w), tz, t);
            prop_assert!(open >= t);
            prop_assert!(open - t <= TimeDelta::hours(48), "{} {} {}", w, tz, t);
            prop_assert!(w.contains(local_time_of_day(tz, open)), "{} {} {} -> {}", w, tz, t, open);
            if open > t {
                // Openings fall on whole seconds; just before one, outside.
                prop_assert_eq!(open.timestamp_subsec_nanos(), 0);
                prop_assert!(!w.contains(local_time_of_day(tz, open - TimeDelta::seconds(1))));
                let mut m = DateTime::from_timestamp(t.timestamp() - t.timestamp().rem_euclid(60) + 60, 0).unwrap();
                while m < open {
                    prop_assert!(!w.contains(local_time_of_day(tz, m)), "{} {} {}: {} inside before {}", w, tz, t, m, open);
                    m += TimeDelta::minutes(1);
                }
            }
        }
    }
}
