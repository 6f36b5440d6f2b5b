//! Scheduling policies (issue 13): what happens to a missed occurrence, to
//! one that falls due while the previous run is still running, to a failed
//! run, and how starts due at one instant are spread. Pure: no I/O.
//!
//! A rule's `policy` holds the defaults and a branch rule's `policy`
//! overrides any field of it; a field set in neither takes the built-in
//! default, which keeps the behaviour ruled had before policies.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};
use uuid::Uuid;

use crate::model::Millis;

/// What runs of the occurrences missed while ruled was down or throttled,
/// the database away, or the operation window closed.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Misfire {
    /// Whatever was missed runs once, now (the latest missed occurrence);
    /// the others are recorded skipped.
    #[default]
    RunOnce,
    /// Nothing missed runs; the next run is computed from now.
    Skip,
    /// Every missed occurrence runs, oldest first, at most `catchup_max`.
    RunAll,
}

/// What an occurrence that falls due while the previous run of the same
/// branch rule is still running does.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// Recorded skipped, reason `overlap`.
    #[default]
    Skip,
    /// The first one runs right after the current run; later ones are
    /// recorded skipped.
    BufferOne,
    /// The running one is cancelled, then the new one starts.
    CancelRunning,
}

impl Misfire {
    pub fn as_str(self) -> &'static str {
        match self {
            Misfire::RunOnce => "run_once",
            Misfire::Skip => "skip",
            Misfire::RunAll => "run_all",
        }
    }
}

impl Overlap {
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::BufferOne => "buffer_one",
            Overlap::CancelRunning => "cancel_running",
        }
    }
}

/// A whole number within `MIN..=MAX`, checked while serde reads it, so a
/// bad value is refused with the field's path (`policy.max_attempts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct Bounded<const MIN: u64, const MAX: u64>(u64);

impl<const MIN: u64, const MAX: u64> Bounded<MIN, MAX> {
    pub fn new(value: u64) -> Result<Self, String> {
        if (MIN..=MAX).contains(&value) {
            Ok(Bounded(value))
        } else {
            Err(format!("must be a whole number from {MIN} to {MAX}"))
        }
    }

    pub fn get(self) -> u64 {
        self.0
    }
}

impl<'de, const MIN: u64, const MAX: u64> Deserialize<'de> for Bounded<MIN, MAX> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let number = serde_json::Number::deserialize(deserializer)?;
        // 30.0 is a whole number to JSON Schema, so it is one here too.
        let whole = number.as_u64().or_else(|| {
            number
                .as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= u64::MAX as f64)
                .map(|f| f as u64)
        });
        whole
            .ok_or_else(|| format!("must be a whole number from {MIN} to {MAX}"))
            .and_then(Bounded::new)
            .map_err(serde::de::Error::custom)
    }
}

impl<const MIN: u64, const MAX: u64> utoipa::PartialSchema for Bounded<MIN, MAX> {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::Integer)
            .minimum(Some(MIN as f64))
            .maximum(Some(MAX as f64))
            .into()
    }
}

impl<const MIN: u64, const MAX: u64> utoipa::ToSchema for Bounded<MIN, MAX> {}

const DAY_SECONDS: u64 = 86_400;

/// The policy object of a rule or a branch rule, as stored and as the API
/// takes it. Every field is optional: an unset field falls back to the
/// rule's policy, then to the default. Unknown keys are refused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// `run_once` (default), `skip` or `run_all`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub misfire: Option<Misfire>,
    /// An occurrence later than this is never run (recorded skipped,
    /// reason `catchup_window`). Unset: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 31_536_000)]
    pub catchup_window_seconds: Option<Bounded<1, { 365 * DAY_SECONDS }>>,
    /// With `run_all`, at most this many missed occurrences run (the most
    /// recent ones); default 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 1000)]
    pub catchup_max: Option<Bounded<1, 1000>>,
    /// `skip` (default), `buffer_one` or `cancel_running`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<Overlap>,
    /// Runs of one occurrence, the first included; default 1 (no retry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 100)]
    pub max_attempts: Option<Bounded<1, 100>>,
    /// The first retry's delay, doubled for each further one; default 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 86_400)]
    pub backoff_seconds: Option<Bounded<0, DAY_SECONDS>>,
    /// The longest retry delay; default 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 604_800)]
    pub backoff_max_seconds: Option<Bounded<0, { 7 * DAY_SECONDS }>>,
    /// Starts of one occurrence are spread over this many seconds, by a
    /// stable hash of the branch rule's id; default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 3_600)]
    pub start_jitter_seconds: Option<Bounded<0, 3_600>>,
}

impl Policy {
    /// Reads a stored policy (JSON text; `NULL` and `{}` are no policy).
    pub fn from_json_text(text: Option<&str>) -> Result<Option<Policy>, String> {
        let Some(text) = text
            .map(str::trim)
            .filter(|t| !t.is_empty() && *t != "null")
        else {
            return Ok(None);
        };
        let deserializer = &mut serde_json::Deserializer::from_str(text);
        let policy: Policy = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner().to_string();
            if path == "." {
                format!("policy: {inner}")
            } else {
                format!("policy.{path}: {inner}")
            }
        })?;
        Ok((policy != Policy::default()).then_some(policy))
    }

    /// The stored form: `None` for no policy.
    pub fn to_json_text(policy: Option<&Policy>) -> Option<String> {
        policy
            .filter(|p| **p != Policy::default())
            .map(|p| serde_json::to_string(p).expect("a policy serializes"))
    }

    /// `self` with every field `over` sets replaced.
    pub fn overridden_by(&self, over: &Policy) -> Policy {
        Policy {
            misfire: over.misfire.or(self.misfire),
            catchup_window_seconds: over.catchup_window_seconds.or(self.catchup_window_seconds),
            catchup_max: over.catchup_max.or(self.catchup_max),
            overlap: over.overlap.or(self.overlap),
            max_attempts: over.max_attempts.or(self.max_attempts),
            backoff_seconds: over.backoff_seconds.or(self.backoff_seconds),
            backoff_max_seconds: over.backoff_max_seconds.or(self.backoff_max_seconds),
            start_jitter_seconds: over.start_jitter_seconds.or(self.start_jitter_seconds),
        }
    }
}

pub const DEFAULT_CATCHUP_MAX: u32 = 10;
pub const DEFAULT_MAX_ATTEMPTS: u32 = 1;
pub const DEFAULT_BACKOFF_SECONDS: u64 = 10;
pub const DEFAULT_BACKOFF_MAX_SECONDS: u64 = 600;

/// The policy in force for one branch rule: its own fields, then its
/// rule's, then the defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct EffectivePolicy {
    pub misfire: Misfire,
    /// `None`: no limit.
    pub catchup_window_seconds: Option<u64>,
    pub catchup_max: u32,
    pub overlap: Overlap,
    pub max_attempts: u32,
    pub backoff_seconds: u64,
    pub backoff_max_seconds: u64,
    pub start_jitter_seconds: u64,
}

impl Default for EffectivePolicy {
    fn default() -> Self {
        EffectivePolicy::resolve(None, None)
    }
}

impl EffectivePolicy {
    pub fn resolve(rule: Option<&Policy>, branch_rule: Option<&Policy>) -> EffectivePolicy {
        let merged = match (rule, branch_rule) {
            (Some(rule), Some(own)) => rule.overridden_by(own),
            (Some(one), None) | (None, Some(one)) => one.clone(),
            (None, None) => Policy::default(),
        };
        EffectivePolicy {
            misfire: merged.misfire.unwrap_or_default(),
            catchup_window_seconds: merged.catchup_window_seconds.map(Bounded::get),
            catchup_max: merged
                .catchup_max
                .map_or(DEFAULT_CATCHUP_MAX, |b| b.get() as u32),
            overlap: merged.overlap.unwrap_or_default(),
            max_attempts: merged
                .max_attempts
                .map_or(DEFAULT_MAX_ATTEMPTS, |b| b.get() as u32),
            backoff_seconds: merged
                .backoff_seconds
                .map_or(DEFAULT_BACKOFF_SECONDS, Bounded::get),
            backoff_max_seconds: merged
                .backoff_max_seconds
                .map_or(DEFAULT_BACKOFF_MAX_SECONDS, Bounded::get),
            start_jitter_seconds: merged.start_jitter_seconds.map_or(0, Bounded::get),
        }
    }

    /// The start offset of every occurrence of `branch_rule_id`, in
    /// `0..start_jitter_seconds` s: a stable hash of the id, so every
    /// instance and every run agrees on it.
    pub fn jitter_ms(&self, branch_rule_id: &Uuid) -> Millis {
        let span = self.start_jitter_seconds.saturating_mul(1000);
        if span == 0 {
            return 0;
        }
        (mix(crate::cluster::stable_hash(branch_rule_id)) % span) as Millis
    }

    /// The delay before retry number `retry` (1 for the first), in ms:
    /// `backoff_seconds · 2^(retry-1)`, capped at `backoff_max_seconds`,
    /// less up to a fifth of it by a stable hash of the occurrence, so
    /// retries of many rules failing together do not land together, and
    /// every run of the same history retries at the same time.
    pub fn backoff_ms(&self, branch_rule_id: &Uuid, occurrence: Millis, retry: u32) -> Millis {
        let base = self.backoff_seconds.saturating_mul(1000);
        let grown = base.saturating_mul(1u64 << retry.saturating_sub(1).min(40));
        let capped = grown.min(self.backoff_max_seconds.saturating_mul(1000));
        let spread = capped / 5;
        let jitter = if spread == 0 {
            0
        } else {
            let seed = crate::cluster::stable_hash(branch_rule_id)
                ^ (occurrence as u64).rotate_left(17)
                ^ u64::from(retry).rotate_left(41);
            mix(seed) % spread
        };
        (capped - jitter) as Millis
    }
}

/// splitmix64's finalizer: spreads the bits of a hash, so the jitter does
/// not follow the partition (the same hash modulo the partition count).
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Why an occurrence did not run; the label of
/// `ruled_occurrences_skipped_total{reason}` and the start of the skipped
/// execution's `error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// Missed (ruled down or throttled, the database away); `misfire` is
    /// `skip`, or `run_once` ran a later occurrence in its place.
    Misfire,
    /// It fell outside the operation window, and the policy does not run it.
    OutsideWindow,
    /// Older than `catchup_window_seconds`.
    CatchupWindow,
    /// `run_all` had more missed occurrences than `catchup_max`.
    CatchupMax,
    /// It fell due while the previous run was still running.
    Overlap,
}

impl SkipReason {
    pub const ALL: [SkipReason; 5] = [
        SkipReason::Misfire,
        SkipReason::OutsideWindow,
        SkipReason::CatchupWindow,
        SkipReason::CatchupMax,
        SkipReason::Overlap,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::Misfire => "misfire",
            SkipReason::OutsideWindow => "outside_window",
            SkipReason::CatchupWindow => "catchup_window",
            SkipReason::CatchupMax => "catchup_max",
            SkipReason::Overlap => "overlap",
        }
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_keep_the_behaviour_before_policies() {
        let policy = EffectivePolicy::default();
        assert_eq!(policy.misfire, Misfire::RunOnce);
        assert_eq!(policy.overlap, Overlap::Skip);
        assert_eq!(policy.max_attempts, 1);
        assert_eq!(policy.catchup_max, 10);
        assert_eq!(policy.catchup_window_seconds, None);
        assert_eq!(policy.jitter_ms(&Uuid::from_u128(7)), 0);
    }

    #[test]
    fn a_branch_rule_overrides_its_rule_field_by_field() {
        let rule: Policy =
            serde_json::from_str(r#"{"misfire":"run_all","max_attempts":3}"#).unwrap();
        let own: Policy = serde_json::from_str(r#"{"max_attempts":5}"#).unwrap();
        let policy = EffectivePolicy::resolve(Some(&rule), Some(&own));
        assert_eq!(policy.misfire, Misfire::RunAll);
        assert_eq!(policy.max_attempts, 5);
        assert_eq!(policy.overlap, Overlap::Skip);
    }

    #[test]
    fn bad_values_and_unknown_keys_are_refused_naming_the_field() {
        let error = Policy::from_json_text(Some(r#"{"max_attempts":0}"#)).unwrap_err();
        assert!(error.starts_with("policy.max_attempts:"), "{error}");
        let error = Policy::from_json_text(Some(r#"{"misfire":"sometimes"}"#)).unwrap_err();
        assert!(error.starts_with("policy.misfire:"), "{error}");
        let error = Policy::from_json_text(Some(r#"{"retries":2}"#)).unwrap_err();
        assert!(error.contains("retries"), "{error}");
        let error = Policy::from_json_text(Some(r#"{"backoff_seconds":1.5}"#)).unwrap_err();
        assert!(error.starts_with("policy.backoff_seconds:"), "{error}");
        assert_eq!(Policy::from_json_text(Some("{}")), Ok(None));
        assert_eq!(Policy::from_json_text(None), Ok(None));
        let whole = Policy::from_json_text(Some(r#"{"catchup_max":3.0}"#)).unwrap();
        assert_eq!(whole.unwrap().catchup_max.unwrap().get(), 3);
    }

    #[test]
    fn jitter_is_stable_and_spreads_over_the_span() {
        let policy = EffectivePolicy {
            start_jitter_seconds: 60,
            ..EffectivePolicy::default()
        };
        let offsets: Vec<Millis> = (0..10_000u128)
            .map(|n| policy.jitter_ms(&Uuid::from_u128(n)))
            .collect();
        assert!(offsets.iter().all(|o| (0..60_000).contains(o)));
        // Every 6-second slice of the minute gets a share.
        let mut slices = [0usize; 10];
        for offset in &offsets {
            slices[(*offset / 6_000) as usize] += 1;
        }
        assert!(slices.iter().all(|n| (800..1200).contains(n)), "{slices:?}");
        assert_eq!(
            policy.jitter_ms(&Uuid::from_u128(42)),
            policy.jitter_ms(&Uuid::from_u128(42))
        );
    }

    #[test]
    fn backoff_grows_exponentially_up_to_the_cap() {
        let policy = EffectivePolicy {
            backoff_seconds: 10,
            backoff_max_seconds: 60,
            ..EffectivePolicy::default()
        };
        let id = Uuid::from_u128(9);
        let delays: Vec<Millis> = (1..=5).map(|n| policy.backoff_ms(&id, 0, n)).collect();
        assert!((8_000..=10_000).contains(&delays[0]), "{delays:?}");
        assert!((16_000..=20_000).contains(&delays[1]), "{delays:?}");
        assert!((32_000..=40_000).contains(&delays[2]), "{delays:?}");
        assert!((48_000..=60_000).contains(&delays[3]), "{delays:?}");
        assert!((48_000..=60_000).contains(&delays[4]), "{delays:?}");
    }
}
