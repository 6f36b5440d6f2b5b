//! `ruled preview <cron> [--tz Z] [--window HH:MM-HH:MM] [--from T] [--count N]`

use chrono::{DateTime, Utc};
use chrono_tz::Tz;

use super::CommandError;
use crate::schedule::{CronSchedule, Window, parse_timezone, preview};

pub struct PreviewRequest<'a> {
    pub expression: &'a str,
    pub timezone: Option<&'a str>,
    pub window: Option<&'a str>,
    /// RFC 3339; `None` means now.
    pub from: Option<&'a str>,
    pub count: usize,
}

/// The next runs, one line each: UTC, then local time with the zone's
/// abbreviation, so a DST shift is visible at a glance.
pub fn preview_lines(
    request: &PreviewRequest<'_>,
    default_zone: Tz,
    now: DateTime<Utc>,
) -> Result<Vec<String>, CommandError> {
    let schedule = CronSchedule::parse(request.expression)?;
    let zone = match request.timezone {
        Some(name) => parse_timezone(name)?,
        None => default_zone,
    };
    let window = request.window.map(str::parse::<Window>).transpose()?;
    let from = match request.from {
        Some(text) => DateTime::parse_from_rfc3339(text)
            .map_err(|e| CommandError::InvalidArgument {
                field: "--from",
                message: format!("{text:?} is not an RFC 3339 time ({e})"),
            })?
            .with_timezone(&Utc),
        None => now,
    };
    let runs = preview(&schedule, zone, window, from, request.count)?;
    Ok(runs
        .into_iter()
        .map(|run| {
            let local = run.with_timezone(&zone);
            format!(
                "{}  {} {}",
                run.format("%Y-%m-%dT%H:%M:%SZ"),
                local.format("%Y-%m-%dT%H:%M:%S%:z"),
                local.format("%Z")
            )
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(
        expression: &str,
        tz: &str,
        window: Option<&str>,
        from: &str,
        count: usize,
    ) -> Vec<String> {
        let request = PreviewRequest {
            expression,
            timezone: Some(tz),
            window,
            from: Some(from),
            count,
        };
        preview_lines(&request, chrono_tz::UTC, Utc::now()).unwrap()
    }

    #[test]
    fn shows_utc_and_local_time_across_a_dst_gap() {
        let out = lines(
            "30 2 * * *",
            "America/New_York",
            None,
            "2026-03-07T12:00:00Z",
            3,
        );
        assert_eq!(
            out,
            vec![
                // 02:30 does not exist that night: the first valid instant after it.
                "2026-03-08T07:00:00Z  2026-03-08T03:00:00-04:00 EDT",
                "2026-03-09T06:30:00Z  2026-03-09T02:30:00-04:00 EDT",
                "2026-03-10T06:30:00Z  2026-03-10T02:30:00-04:00 EDT",
            ]
        );
    }

    #[test]
    fn bad_arguments_name_the_field() {
        let request = PreviewRequest {
            expression: "* * * * *",
            timezone: None,
            window: None,
            from: Some("yesterday"),
            count: 1,
        };
        let err = preview_lines(&request, chrono_tz::UTC, Utc::now()).unwrap_err();
        assert!(err.to_string().contains("--from"), "{err}");
        let request = PreviewRequest {
            expression: "61 * * * *",
            from: None,
            ..request
        };
        assert!(preview_lines(&request, chrono_tz::UTC, Utc::now()).is_err());
    }
}
