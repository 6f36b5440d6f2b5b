//! How rows leave the API: times as RFC 3339, secrets redacted, a branch
//! rule's next run also in its branch's zone.

use chrono::DateTime;
use chrono_tz::Tz;
use serde_json::{Map, Value};

use crate::clock::millis_to_utc;

/// Columns holding epoch milliseconds, shown as RFC 3339.
const TIME_COLUMNS: &[&str] = &[
    "created_at",
    "updated_at",
    "next_run_time",
    "last_run_time",
    "lock_time",
    "scheduled_for",
    "requested_at",
    "scheduled_at",
    "started_at",
    "finished_at",
    "heartbeat_at",
];

/// Key fragments that mark a value as a secret, compared lower-case.
const SECRET_KEYS: &[&str] = &[
    "authorization",
    "token",
    "secret",
    "password",
    "passwd",
    "api_key",
    "apikey",
    "cookie",
];

pub const REDACTED: &str = "***";

pub fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    SECRET_KEYS.iter().any(|s| key.contains(s))
}

/// A copy of `value` with every secret-looking key's value replaced, at
/// any depth (action params nest headers and env maps).
pub fn redact(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = if is_secret_key(k) && !v.is_null() {
                        Value::String(REDACTED.into())
                    } else {
                        redact(v)
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(redact).collect()),
        other => other.clone(),
    }
}

pub fn rfc3339(ms: i64) -> Value {
    Value::String(millis_to_utc(ms).to_rfc3339())
}

/// A row as the API shows it.
pub fn present(mut row: Map<String, Value>) -> Value {
    for (key, value) in row.iter_mut() {
        if TIME_COLUMNS.contains(&key.as_str()) {
            if let Some(ms) = value.as_i64() {
                *value = rfc3339(ms);
            }
        } else if matches!(key.as_str(), "params" | "config" | "settings" | "output") {
            *value = redact(value);
        }
    }
    Value::Object(row)
}

/// `next_run_time` (epoch ms) in `zone`, with its offset.
pub fn local_time(ms: i64, zone: Tz) -> Value {
    match DateTime::from_timestamp_millis(ms) {
        Some(t) => Value::String(t.with_timezone(&zone).to_rfc3339()),
        None => Value::Null,
    }
}

/// Parses an RFC 3339 request field into epoch milliseconds.
pub fn parse_time(field: &str, text: &str) -> Result<i64, super::error::ApiError> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp_millis())
        .map_err(|e| {
            super::error::ApiError::field(field, format!("{text:?} is not an RFC 3339 time: {e}"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secrets_are_redacted_at_any_depth() {
        let params = json!({
            "url": "https://example.com",
            "headers": { "Authorization": "Bearer x", "X-Trace": "1" },
            "env": { "DB_PASSWORD": "p", "API_TOKEN": "t", "client_secret": "s" },
            "list": [{ "token": "t" }],
        });
        let shown = redact(&params);
        assert_eq!(shown["url"], "https://example.com");
        assert_eq!(shown["headers"]["Authorization"], REDACTED);
        assert_eq!(shown["headers"]["X-Trace"], "1");
        assert_eq!(shown["env"]["DB_PASSWORD"], REDACTED);
        assert_eq!(shown["env"]["API_TOKEN"], REDACTED);
        assert_eq!(shown["env"]["client_secret"], REDACTED);
        assert_eq!(shown["list"][0]["token"], REDACTED);
    }
}
