//! How rows leave the API: secrets redacted, a branch rule's next run also
//! in its branch's zone, execution outputs only for callers holding the
//! token ([`super::views`] holds the shapes).
//!
//! Secret fields of action configs and params are write-only: they are
//! shown as `***` ([`crate::actions::secrets`] says which fields), and a
//! `***` sent back on update keeps the stored value
//! ([`keep_stored_secrets`]).

use chrono::DateTime;
use chrono_tz::Tz;
use serde_json::{Map, Value};

use super::error::ApiError;
use crate::actions::secrets;
use crate::clock::millis_to_utc;

pub use crate::actions::secrets::{MASK as REDACTED, is_secret_key};

/// A copy of `value` with every secret hidden at any depth, by the action
/// config schema (`headers`, `env`, `body`, credential-named keys, listed
/// `secret_keys`, URL passwords and secret query values): the plan
/// snapshot nests action params and templates' configs.
pub fn redact(value: &Value) -> Value {
    secrets::redact_config(value)
}

pub fn rfc3339(ms: i64) -> Value {
    Value::String(millis_to_utc(ms).to_rfc3339())
}

/// `next_run_time` (epoch ms) in `zone`, with its offset; `null` when that
/// wall-clock time has no RFC 3339 form. A client may set any time up to
/// 9999-12-31T23:59:59Z, and east of UTC its last hours are already in
/// the year 10000, which chrono writes `+10000-…`: no `date-time` a client
/// can parse (Schemathesis found it).
pub fn local_time(ms: i64, zone: Tz) -> Value {
    use chrono::Datelike;
    match DateTime::from_timestamp_millis(ms).map(|t| t.with_timezone(&zone)) {
        Some(local) if (0..=9999).contains(&local.year()) => Value::String(local.to_rfc3339()),
        _ => Value::Null,
    }
}

/// Columns whose JSON holds action secrets, write-only through the API.
const SECRET_COLUMNS: &[&str] = &["config", "params"];

/// Before an update: wherever `changes` sends a `***` back for a secret of
/// the stored row (see [`secrets::restore_masked`]), the stored value is
/// kept. A `***` with nothing stored behind it is a 400 naming the field,
/// and nothing is saved.
pub fn keep_stored_secrets(
    stored: &Map<String, Value>,
    changes: &mut Map<String, Value>,
) -> Result<(), ApiError> {
    for column in SECRET_COLUMNS {
        if let Some(value) = changes.get_mut(*column) {
            let old = stored.get(*column);
            let sent = value.clone();
            secrets::restore_masked(old, value, column).map_err(|field| {
                ApiError::field(
                    field,
                    format!(
                        "is {REDACTED:?} but no value is stored there to keep; send the real value \
                         (a URL may carry `***` only when sent back unchanged)"
                    ),
                )
            })?;
            if *value != sent
                && let Some((field, message)) = secrets::unsafe_to_keep(old, &sent, value, column)
            {
                return Err(ApiError::field(field, message));
            }
        }
    }
    Ok(())
}

/// What replaces an execution's output for a caller without the token.
pub fn output_needs_token() -> Value {
    serde_json::json!({
        "hidden": true,
        "reason": "execution output (response captures, stdout, stderr) is shown only to \
                   requests carrying the API token: Authorization: Bearer <API_TOKEN>",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_local_time_past_the_year_9999_is_null_not_a_five_digit_year() {
        let last_evening_utc = 253_402_294_767_000; // 9999-12-31T22:19:27Z
        let sydney: Tz = "Australia/Sydney".parse().unwrap();
        assert_eq!(local_time(last_evening_utc, sydney), Value::Null);
        assert_eq!(
            local_time(last_evening_utc, chrono_tz::UTC),
            json!("9999-12-31T22:19:27+00:00")
        );
        let new_york: Tz = "America/New_York".parse().unwrap();
        assert_eq!(
            local_time(last_evening_utc, new_york),
            json!("9999-12-31T17:19:27-05:00")
        );
    }

    #[test]
    fn secrets_are_redacted_at_any_depth() {
        let params = json!({
            "url": "https://example.com",
            "method": "POST",
            "headers": { "Authorization": "Bearer x", "X-Trace": "1" },
            "env": { "DB_PASSWORD": "p", "API_TOKEN": "t", "client_secret": "s" },
            "list": [{ "token": "t" }],
        });
        let shown = redact(&params);
        assert_eq!(shown["url"], "https://example.com");
        assert_eq!(shown["headers"]["Authorization"], REDACTED);
        // Every header value is write-only, not only credential-named ones.
        assert_eq!(shown["headers"]["X-Trace"], REDACTED);
        assert_eq!(shown["method"], "POST");
        assert_eq!(shown["env"]["DB_PASSWORD"], REDACTED);
        assert_eq!(shown["env"]["API_TOKEN"], REDACTED);
        assert_eq!(shown["env"]["client_secret"], REDACTED);
        assert_eq!(shown["list"][0]["token"], REDACTED);
    }
}
