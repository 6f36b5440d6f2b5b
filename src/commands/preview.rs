//! `ruled preview <cron> [--tz Z] [--window HH:MM-HH:MM] [--from T] [--count N]`

use chrono::{DateTime, Utc};
use chrono_tz::Tz;

use super::{CommandError, invalid};
use crate::model::Millis;
use crate::plan::simulate::{preview_under_policy, single_rule_plan};
use crate::schedule::{CronSchedule, Policy, Window, next_after_millis, parse_timezone, preview};

pub struct PreviewRequest<'a> {
    pub expression: &'a str,
    pub timezone: Option<&'a str>,
    pub window: Option<&'a str>,
    /// RFC 3339; `None` means now.
    pub from: Option<&'a str>,
    pub count: usize,
    /// A policy object (JSON): the preview then shows what runs under it,
    /// and which occurrences it skips.
    pub policy: Option<&'a str>,
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
        Some(name) => parse_timezone(name).map_err(|e| invalid("--tz", e.to_string()))?,
        None => default_zone,
    };
    let window = request
        .window
        .map(str::parse::<Window>)
        .transpose()
        .map_err(|e| invalid("--window", e.to_string()))?;
    let from = match request.from {
        Some(text) => DateTime::parse_from_rfc3339(text)
            .map_err(|e| invalid("--from", format!("{text:?} is not an RFC 3339 time ({e})")))?
            .with_timezone(&Utc),
        None => now,
    };
    if let Some(text) = request.policy {
        return policy_lines(&schedule, zone, window, text, from, request.count);
    }
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

/// The preview under a policy: each run with its start time, and each
/// skipped occurrence with the reason, in order.
fn policy_lines(
    schedule: &CronSchedule,
    zone: Tz,
    window: Option<Window>,
    policy_text: &str,
    from: DateTime<Utc>,
    count: usize,
) -> Result<Vec<String>, CommandError> {
    let policy = Policy::from_json_text(Some(policy_text))
        .map_err(|message| invalid("--policy", message))?;
    let from_ms = from.timestamp_millis();
    let first = next_after_millis(schedule, zone, from_ms - 1)?;
    let plan = single_rule_plan(
        uuid::Uuid::nil(),
        schedule.expression(),
        zone,
        window,
        policy,
        first,
    );
    let (steps, _) = preview_under_policy(&plan, from_ms, count, zone, Millis::MAX);
    let text = |at: i64| {
        let utc = crate::clock::millis_to_utc(at);
        let local = utc.with_timezone(&zone);
        format!(
            "{}  {} {}",
            utc.format("%Y-%m-%dT%H:%M:%SZ"),
            local.format("%Y-%m-%dT%H:%M:%S%:z"),
            local.format("%Z")
        )
    };
    Ok(steps
        .into_iter()
        .map(|step| match step.starts_at {
            Some(start) if start == step.occurrence => text(start),
            Some(start) => format!("{}  (occurrence {})", text(start), text(step.occurrence)),
            None => format!("{}  skipped: {}", text(step.occurrence), step.decision),
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
            policy: None,
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
            policy: None,
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

    #[test]
    fn a_policy_shows_what_runs_and_what_is_skipped() {
        let preview = |policy: &str| {
            let request = PreviewRequest {
                expression: "0 * * * *",
                timezone: Some("UTC"),
                window: Some("09:00-11:00"),
                from: Some("2026-06-01T08:00:00Z"),
                count: 3,
                policy: Some(policy),
            };
            preview_lines(&request, chrono_tz::UTC, Utc::now()).unwrap()
        };
        // 08:00 falls before the window (run_once: skipped, 09:00 runs);
        // 11:00 … 08:00 the next day fall outside it.
        let once = preview("{}");
        assert_eq!(
            once[..3],
            [
                "2026-06-01T08:00:00Z  2026-06-01T08:00:00+00:00 UTC  skipped: outside_window",
                "2026-06-01T09:00:00Z  2026-06-01T09:00:00+00:00 UTC",
                "2026-06-01T10:00:00Z  2026-06-01T10:00:00+00:00 UTC",
            ]
        );
        assert_eq!(once.len(), 3 + 22 + 1);
        assert_eq!(
            once[25],
            "2026-06-02T09:00:00Z  2026-06-02T09:00:00+00:00 UTC"
        );
        let all = preview(r#"{"misfire":"run_all"}"#);
        assert_eq!(
            all[0],
            "2026-06-01T09:00:00Z  2026-06-01T09:00:00+00:00 UTC  (occurrence 2026-06-01T08:00:00Z  2026-06-01T08:00:00+00:00 UTC)"
        );
        let request = PreviewRequest {
            expression: "0 * * * *",
            timezone: Some("UTC"),
            window: None,
            from: None,
            count: 1,
            policy: Some(r#"{"max_attempts":0}"#),
        };
        let error = preview_lines(&request, chrono_tz::UTC, Utc::now()).unwrap_err();
        assert!(error.to_string().contains("policy.max_attempts"), "{error}");
    }
}
