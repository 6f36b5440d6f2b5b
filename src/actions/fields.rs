//! Reading typed fields out of a merged config, with errors that name the
//! field so an operator can fix the template or the params.
//!
//! A `null` field counts as absent: [`merge_config`](super::merge_config)
//! lets params set a key to `null`, and that should mean "use the default".

use serde_json::Value;

use super::ActionError;

fn get<'a>(config: &'a Value, field: &str) -> Result<Option<&'a Value>, ActionError> {
    match config {
        Value::Object(map) => Ok(map.get(field).filter(|v| !v.is_null())),
        Value::Null => Ok(None),
        other => Err(ActionError::invalid(
            "config",
            format!("must be a JSON object, not {}", type_name(other)),
        )),
    }
}

pub(crate) fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub(crate) fn opt_u64(config: &Value, field: &str) -> Result<Option<u64>, ActionError> {
    match get(config, field)? {
        None => Ok(None),
        Some(value) => value.as_u64().map(Some).ok_or_else(|| {
            ActionError::invalid(
                field,
                format!("must be a non-negative integer, not {value}"),
            )
        }),
    }
}

/// A timeout: positive, since zero would fail every run before it starts.
pub(crate) fn timeout_ms(config: &Value, default: u64) -> Result<u64, ActionError> {
    match opt_u64(config, "timeout_ms") {
        Ok(Some(0)) | Err(_) => Err(ActionError::invalid(
            "timeout_ms",
            "must be a positive integer number of milliseconds",
        )),
        Ok(Some(ms)) => Ok(ms),
        Ok(None) => Ok(default),
    }
}

pub(crate) fn opt_str<'a>(config: &'a Value, field: &str) -> Result<Option<&'a str>, ActionError> {
    match get(config, field)? {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(ActionError::invalid(
            field,
            format!("must be a string, not {}", type_name(other)),
        )),
    }
}

pub(crate) fn req_str<'a>(config: &'a Value, field: &str) -> Result<&'a str, ActionError> {
    match opt_str(config, field)? {
        Some(s) if !s.is_empty() => Ok(s),
        _ => Err(ActionError::invalid(field, "is required")),
    }
}

pub(crate) fn string_list(config: &Value, field: &str) -> Result<Vec<String>, ActionError> {
    match get(config, field)? {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                scalar_text(item).ok_or_else(|| {
                    ActionError::invalid(
                        field,
                        format!("item {i} must be a string, not {}", type_name(item)),
                    )
                })
            })
            .collect(),
        Some(other) => Err(ActionError::invalid(
            field,
            format!("must be an array of strings, not {}", type_name(other)),
        )),
    }
}

/// A string-to-string object. The error names the key but never shows a
/// value: these maps hold headers and environment variables, i.e. secrets.
pub(crate) fn string_map(
    config: &Value,
    field: &str,
) -> Result<Vec<(String, String)>, ActionError> {
    match get(config, field)? {
        None => Ok(Vec::new()),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(key, value)| {
                scalar_text(value).map(|v| (key.clone(), v)).ok_or_else(|| {
                    ActionError::invalid(
                        field,
                        format!("`{key}` must be a string, not {}", type_name(value)),
                    )
                })
            })
            .collect(),
        Some(other) => Err(ActionError::invalid(
            field,
            format!("must be an object of strings, not {}", type_name(other)),
        )),
    }
}

/// Numbers and booleans are accepted where text is expected, because JSON
/// editors and API clients turn `"8080"` into `8080` without asking.
fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

pub(crate) fn raw<'a>(config: &'a Value, field: &str) -> Result<Option<&'a Value>, ActionError> {
    get(config, field)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field_of(err: ActionError) -> String {
        match err {
            ActionError::InvalidConfig { field, .. } => field,
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn nulls_are_absent_and_types_are_checked() {
        let c = json!({"a": null, "n": 3, "s": "x", "neg": -1, "list": ["p", 2], "m": {"k": true}});
        assert_eq!(opt_u64(&c, "a").unwrap(), None);
        assert_eq!(opt_u64(&c, "n").unwrap(), Some(3));
        assert_eq!(field_of(opt_u64(&c, "neg").unwrap_err()), "neg");
        assert_eq!(field_of(opt_u64(&c, "s").unwrap_err()), "s");
        assert_eq!(field_of(req_str(&c, "a").unwrap_err()), "a");
        assert_eq!(string_list(&c, "list").unwrap(), vec!["p", "2"]);
        assert_eq!(
            string_map(&c, "m").unwrap(),
            vec![("k".into(), "true".into())]
        );
        assert_eq!(field_of(string_map(&c, "list").unwrap_err()), "list");
        assert_eq!(field_of(opt_str(&json!([1]), "x").unwrap_err()), "config");
        assert_eq!(opt_str(&Value::Null, "x").unwrap(), None);
    }

    #[test]
    fn map_errors_do_not_echo_values() {
        let c = json!({"headers": {"Authorization": ["secret-token"]}});
        let err = string_map(&c, "headers").unwrap_err().to_string();
        assert!(err.contains("Authorization"), "{err}");
        assert!(!err.contains("secret-token"), "{err}");
    }

    #[test]
    fn timeouts_must_be_positive() {
        assert_eq!(timeout_ms(&json!({}), 7).unwrap(), 7);
        assert_eq!(timeout_ms(&json!({"timeout_ms": 5}), 7).unwrap(), 5);
        assert_eq!(
            field_of(timeout_ms(&json!({"timeout_ms": 0}), 7).unwrap_err()),
            "timeout_ms"
        );
        assert_eq!(
            field_of(timeout_ms(&json!({"timeout_ms": "x"}), 7).unwrap_err()),
            "timeout_ms"
        );
    }
}
