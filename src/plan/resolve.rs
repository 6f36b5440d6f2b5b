//! The one schedule resolver: "the brand rule's expression, else the
//! rule's; the branch's zone, else DEFAULT_TIMEZONE". The plan, the worker,
//! the API's next-run computation and its preview all call this, so a bad
//! zone or expression means the same thing everywhere: an error naming the
//! row, never a silent default.

use chrono_tz::Tz;
use uuid::Uuid;

use crate::model::{Millis, RejectReason};
use crate::schedule::{
    CronSchedule, ScheduleCache, ScheduleError, next_after_millis, parse_timezone,
};

/// What a branch rule's schedule is made of, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduleParts<'a> {
    /// The branch and its zone name; `None` means DEFAULT_TIMEZONE.
    pub branch: (Uuid, Option<&'a str>),
    /// The rule and its expression; `None` when the rule is missing.
    pub rule: (Uuid, Option<&'a str>),
    /// The brand rule and its override, when the branch rule has a brand
    /// rule and it sets an expression.
    pub brand_rule: Option<(Uuid, &'a str)>,
}

/// Why a branch rule has no schedule (and so no next run).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("invalid time zone {zone:?} on branch {branch_id}")]
    InvalidZone { branch_id: Uuid, zone: String },
    /// `table` is `rule` or `brand rule`: whose expression it is.
    #[error("{source} on {table} {id}")]
    InvalidCron {
        table: &'static str,
        id: Uuid,
        source: ScheduleError,
    },
    #[error("{table} {id} is missing")]
    Missing { table: &'static str, id: Uuid },
    /// A row the schedule depends on was kept out of the plan; `message`
    /// is the quarantine's own (e.g. the invalid zone and its branch).
    #[error("{message}")]
    Quarantined {
        table: String,
        id: String,
        reason: RejectReason,
        message: String,
    },
    #[error("{0}")]
    NoOccurrence(ScheduleError),
}

impl ResolveError {
    /// The quarantine reason this error amounts to, if it is about a value.
    pub fn reject_reason(&self) -> Option<RejectReason> {
        match self {
            ResolveError::InvalidZone { .. } => Some(RejectReason::Zone),
            ResolveError::InvalidCron { .. } => Some(RejectReason::Cron),
            ResolveError::Quarantined { reason, .. } => Some(*reason),
            ResolveError::Missing { .. } | ResolveError::NoOccurrence(_) => None,
        }
    }
}

/// The zone alone: the branch's, or `default_zone` when it has none.
pub fn resolve_zone(
    branch_id: Uuid,
    timezone: Option<&str>,
    default_zone: Tz,
) -> Result<Tz, ResolveError> {
    match timezone {
        None => Ok(default_zone),
        Some(name) => parse_timezone(name).map_err(|_| ResolveError::InvalidZone {
            branch_id,
            zone: name.to_string(),
        }),
    }
}

/// The expression alone: the brand rule's override, else the rule's.
pub fn resolve_expression<'a>(
    parts: &ScheduleParts<'a>,
) -> Result<(&'static str, Uuid, &'a str), ResolveError> {
    if let Some((id, expression)) = parts.brand_rule {
        return Ok(("brand rule", id, expression));
    }
    match parts.rule {
        (id, Some(expression)) => Ok(("rule", id, expression)),
        (id, None) => Err(ResolveError::Missing { table: "rule", id }),
    }
}

/// The cron schedule and zone a branch rule runs on. `schedules` only
/// remembers parses; the answer depends on `parts` and `default_zone` alone.
pub fn resolve_schedule(
    parts: &ScheduleParts<'_>,
    default_zone: Tz,
    schedules: &mut ScheduleCache,
) -> Result<(CronSchedule, Tz), ResolveError> {
    let (table, id, expression) = resolve_expression(parts)?;
    let schedule = schedules
        .parse(expression)
        .map_err(|source| ResolveError::InvalidCron { table, id, source })?;
    let zone = resolve_zone(parts.branch.0, parts.branch.1, default_zone)?;
    Ok((schedule, zone))
}

/// The next run strictly after `after`, always recomputed from the
/// expression in the zone (never by adding a period, which DST breaks).
pub fn next_run(
    parts: &ScheduleParts<'_>,
    default_zone: Tz,
    after: Millis,
    schedules: &mut ScheduleCache,
) -> Result<Millis, ResolveError> {
    let (schedule, zone) = resolve_schedule(parts, default_zone, schedules)?;
    next_after_millis(&schedule, zone, after).map_err(ResolveError::NoOccurrence)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    const RIYADH: Tz = chrono_tz::Asia::Riyadh;
    const BRANCH: Uuid = Uuid::from_u128(1);
    const RULE: Uuid = Uuid::from_u128(2);
    const BRAND_RULE: Uuid = Uuid::from_u128(3);

    fn parts<'a>(
        zone: Option<&'a str>,
        rule: &'a str,
        brand: Option<&'a str>,
    ) -> ScheduleParts<'a> {
        ScheduleParts {
            branch: (BRANCH, zone),
            rule: (RULE, Some(rule)),
            brand_rule: brand.map(|e| (BRAND_RULE, e)),
        }
    }

    fn resolve(parts: ScheduleParts<'_>) -> Result<(String, Tz), ResolveError> {
        resolve_schedule(&parts, RIYADH, &mut ScheduleCache::default())
            .map(|(s, z)| (s.expression().to_string(), z))
    }

    fn utc_ms(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> Millis {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0)
            .unwrap()
            .timestamp_millis()
    }

    #[test]
    fn the_brand_rule_overrides_the_rule_and_the_branch_zone_the_default() {
        assert_eq!(
            resolve(parts(None, "0 9 * * *", None)),
            Ok(("0 9 * * *".into(), RIYADH))
        );
        assert_eq!(
            resolve(parts(
                Some("America/New_York"),
                "0 9 * * *",
                Some("*/5 * * * *")
            )),
            Ok(("*/5 * * * *".into(), chrono_tz::America::New_York))
        );
    }

    #[test]
    fn a_bad_zone_is_an_error_naming_the_branch_never_the_default() {
        let err = resolve(parts(Some("Mars/Olympus"), "0 9 * * *", None)).unwrap_err();
        assert_eq!(
            err,
            ResolveError::InvalidZone {
                branch_id: BRANCH,
                zone: "Mars/Olympus".into()
            }
        );
        assert_eq!(
            err.to_string(),
            format!("invalid time zone \"Mars/Olympus\" on branch {BRANCH}")
        );
        assert_eq!(err.reject_reason(), Some(RejectReason::Zone));
    }

    #[test]
    fn a_bad_expression_names_whose_it_is() {
        let err = resolve(parts(None, "*/0 * * * *", None)).unwrap_err();
        assert!(matches!(err, ResolveError::InvalidCron { table: "rule", id, .. } if id == RULE));
        assert!(err.to_string().contains("*/0 * * * *"), "{err}");
        assert!(
            err.to_string().ends_with(&format!("on rule {RULE}")),
            "{err}"
        );
        // A bad override is the brand rule's fault even when the rule is fine.
        let err = resolve(parts(None, "0 9 * * *", Some("61 * * * *"))).unwrap_err();
        assert!(matches!(
            err,
            ResolveError::InvalidCron {
                table: "brand rule",
                ..
            }
        ));
        assert_eq!(err.reject_reason(), Some(RejectReason::Cron));
    }

    #[test]
    fn a_missing_rule_has_no_schedule() {
        let none = ScheduleParts {
            branch: (BRANCH, None),
            rule: (RULE, None),
            brand_rule: None,
        };
        assert!(matches!(
            resolve(none),
            Err(ResolveError::Missing {
                table: "rule",
                id: RULE
            })
        ));
    }

    #[test]
    fn next_run_is_strictly_after_and_in_the_zone() {
        // 02:30 in Riyadh (UTC+3) is 23:30 UTC the day before.
        let at = utc_ms(2026, 6, 1, 0, 0);
        let mut cache = ScheduleCache::default();
        let p = parts(None, "30 2 * * *", None);
        assert_eq!(
            next_run(&p, RIYADH, at, &mut cache),
            Ok(utc_ms(2026, 6, 1, 23, 30))
        );
        let again = next_run(&p, RIYADH, utc_ms(2026, 6, 1, 23, 30), &mut cache);
        assert_eq!(again, Ok(utc_ms(2026, 6, 2, 23, 30)));
        let p = parts(Some("Mars/Olympus"), "30 2 * * *", None);
        assert!(next_run(&p, RIYADH, at, &mut cache).is_err());
    }
}
