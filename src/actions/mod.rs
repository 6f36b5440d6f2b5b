//! Actions: what a branch rule does when it runs (DESIGN.md §4, "Actions").
//!
//! An action detail points at an action template; the template names a
//! `kind` and carries a `config`, the detail carries `params`. A worker turns
//! the pair into an [`ActionCall`] (the config is [`merge_config`]d, params
//! winning) and hands it to the [`ActionRegistry`], which finds the
//! [`ActionHandler`] registered for the kind and runs it.
//!
//! Handlers are shared by every worker through an `Arc`: a library user who
//! registers a kind backed by something heavy (an AI model, a connection
//! pool) loads it once, not once per job. A handler must therefore be
//! `Send + Sync` and take `&self`.
//!
//! # Cancellation
//!
//! The worker races [`ActionRegistry::run`] against its cancel signal and the
//! execution timeout and simply drops the losing future. Every handler must be
//! cancel-safe: dropping its future at any `.await` must leave nothing
//! running. The built-in `command` kind kills the child's whole process group
//! when dropped; `http` closes its connection; `sleep` and `noop` hold
//! nothing.
//!
//! # Built-in kinds and their output
//!
//! Every output is a JSON object. Captured text (an HTTP body, stdout,
//! stderr) is cut to [`OUTPUT_CAP_BYTES`] on a UTF-8 boundary and flagged as
//! truncated; on top of that the registry bounds any handler's whole output,
//! custom ones included, to [`OUTPUT_TOTAL_CAP_BYTES`] (see [`cap_output`]).
//!
//! | kind | config | success output | failure |
//! |---|---|---|---|
//! | `noop` | none | `{}` | never |
//! | `sleep` | `ms` (non-negative integer, required) | `{"slept_ms": ms}` | bad `ms` |
//! | `http` | `method` (GET), `url`, `headers` {}, `body` (string or JSON), `timeout_ms` (30000) | `{"status", "headers", "body", "truncated"}` | non-2xx, refused target, timeout |
//! | `command` | `program`, `args` [], `env` {}, `timeout_ms` (60000) | `{"exit_code", "signal", "stdout", "stderr", "stdout_truncated", "stderr_truncated"}` | non-zero exit, signal, timeout, disabled |
//!
//! `http` output, both for a 2xx and (as [`ActionError::Failed`]'s output)
//! for any other status:
//!
//! ```json
//! {"status": 200,
//!  "headers": {"content-type": "application/json"},
//!  "body": "{\"ok\":true}",
//!  "truncated": false}
//! ```
//!
//! Only a few response headers are kept (content type and length, location,
//! retry-after, etag, last-modified); cookies and the like never reach the
//! database. Redirects are not followed, because the next hop's address was
//! never checked: a 3xx fails with its `location` in `headers`.
//!
//! `command` output, on success and as the output of a non-zero exit:
//!
//! ```json
//! {"exit_code": 0, "signal": null,
//!  "stdout": "hi\n", "stderr": "",
//!  "stdout_truncated": false, "stderr_truncated": false}
//! ```
//!
//! `exit_code` is null when the program was killed by a signal, and `signal`
//! then holds its number. A `*_truncated` flag is also set when a process
//! that escaped the program's process group still held the pipe open two
//! seconds after the program exited: the rest of its output was not waited
//! for.
//!
//! # Safety switches
//!
//! [`ActionSettings`] carries the two operator switches of DESIGN.md §5:
//! `command` actions are refused unless COMMAND_ACTIONS_ENABLED=true, and
//! `http` actions refuse loopback, private, link-local and similar targets
//! unless HTTP_ACTION_ALLOW_PRIVATE=true (see [`address`]).

pub mod address;
mod capture;
pub mod command;
mod fields;
pub mod http;
pub mod leftovers;
pub mod noop;
pub mod panic_report;
mod registry;
pub mod secrets;
pub mod sleep;

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use serde_json::Value;
use uuid::Uuid;

use crate::model::{ActionDetail, ActionTemplate};

pub use registry::ActionRegistry;

/// Longest captured text (HTTP body, stdout, stderr), in bytes.
pub const OUTPUT_CAP_BYTES: usize = 64 * 1024;

/// Longest serialized output of any action, in bytes. A command has two
/// capped streams, and JSON escaping can make text longer than its bytes, so
/// this is a bound on the whole rather than the sum of the parts.
pub const OUTPUT_TOTAL_CAP_BYTES: usize = 4 * OUTPUT_CAP_BYTES;

/// The future a handler returns; borrowed from the handler and the call.
pub type ActionFuture<'a> =
    Pin<Box<dyn Future<Output = Result<ActionOutput, ActionError>> + Send + 'a>>;

/// A kind of action. Shared by all workers (Arc), so heavy resources (an AI
/// model) load once.
///
/// `run` must be cancel-safe: the worker drops the future on cancellation or
/// timeout, and nothing the handler started may outlive it.
pub trait ActionHandler: Send + Sync + 'static {
    /// The name templates use in their `kind` column.
    fn kind(&self) -> &str;
    fn run<'a>(&'a self, call: &'a ActionCall) -> ActionFuture<'a>;
}

/// One action of one execution, ready to run.
#[derive(Clone, PartialEq)]
pub struct ActionCall {
    pub execution_id: Uuid,
    pub branch_rule_id: Uuid,
    pub action_detail_id: Uuid,
    pub position: i32,
    pub kind: String,
    /// the template's config with the detail's params merged over it (object keys of params win)
    pub config: Value,
}

impl ActionCall {
    /// The call for one action detail of an execution; this is where the
    /// template's config and the detail's params are merged.
    pub fn new(execution_id: Uuid, template: &ActionTemplate, detail: &ActionDetail) -> ActionCall {
        ActionCall {
            execution_id,
            branch_rule_id: detail.branch_rule_id,
            action_detail_id: detail.id,
            position: detail.position,
            kind: template.kind.clone(),
            config: merged_with_secret_keys(&template.config, &detail.params),
        }
    }
}

/// [`merge_config`], except that the `secret_keys` of both sides are kept:
/// a detail listing its own must not unmark the template's.
fn merged_with_secret_keys(template_config: &Value, params: &Value) -> Value {
    let mut merged = merge_config(template_config, params);
    let listed = |v: &Value| -> Vec<Value> {
        v.get(secrets::SECRET_KEYS_FIELD)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let mut keys = listed(template_config);
    for key in listed(params) {
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    if !keys.is_empty()
        && let Value::Object(map) = &mut merged
    {
        map.insert(secrets::SECRET_KEYS_FIELD.into(), Value::Array(keys));
    }
    merged
}

/// Configs carry secrets (HTTP headers, bodies, command env, URL
/// credentials), and a `{:?}` in a log line must not leak them.
impl fmt::Debug for ActionCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ActionCall")
            .field("execution_id", &self.execution_id)
            .field("branch_rule_id", &self.branch_rule_id)
            .field("action_detail_id", &self.action_detail_id)
            .field("position", &self.position)
            .field("kind", &self.kind)
            .field("config", &secrets::redact_config(&self.config))
            .finish()
    }
}

/// What a successful action produced; bounded by [`OUTPUT_TOTAL_CAP_BYTES`]
/// once it has come through [`ActionRegistry::run`].
#[derive(Debug, Clone, PartialEq)]
pub struct ActionOutput(pub Value);

/// Why an action did not succeed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ActionError {
    #[error("unknown action kind `{0}`: no handler is registered for it")]
    UnknownKind(String),
    #[error("`{kind}` actions are disabled; {how_to_enable}")]
    Disabled { kind: String, how_to_enable: String },
    #[error("refused: {reason}")]
    Refused { reason: String },
    #[error("invalid action config `{field}`: {message}")]
    InvalidConfig { field: String, message: String },
    #[error("{message}")]
    Failed {
        message: String,
        output: Option<Value>,
    },
    #[error("action timed out after {after_ms} ms")]
    TimedOut { after_ms: u64 },
}

impl ActionError {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> ActionError {
        ActionError::InvalidConfig {
            field: field.into(),
            message: message.into(),
        }
    }

    pub fn failed(message: impl Into<String>) -> ActionError {
        ActionError::Failed {
            message: message.into(),
            output: None,
        }
    }

    /// A short, bounded name for metrics labels and log fields.
    pub fn code(&self) -> &'static str {
        match self {
            ActionError::UnknownKind(_) => "unknown_kind",
            ActionError::Disabled { .. } => "disabled",
            ActionError::Refused { .. } => "refused",
            ActionError::InvalidConfig { .. } => "invalid_config",
            ActionError::Failed { .. } => "failed",
            ActionError::TimedOut { .. } => "timed_out",
        }
    }

    /// What the action captured before it failed, if anything.
    pub fn output(&self) -> Option<&Value> {
        match self {
            ActionError::Failed { output, .. } => output.as_ref(),
            _ => None,
        }
    }
}

/// The operator's switches for the built-in kinds; both off by default
/// because each opens a door (running programs, reaching the internal
/// network) that an operator should open on purpose.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ActionSettings {
    /// COMMAND_ACTIONS_ENABLED
    pub command_actions_enabled: bool,
    /// HTTP_ACTION_ALLOW_PRIVATE
    pub http_action_allow_private: bool,
    /// Where `command` actions write their running groups down, so a
    /// start after a crash kills what they left ([`leftovers`]); `None`
    /// keeps no such list.
    pub command_ledger: Option<std::path::PathBuf>,
}

/// The template's config with the detail's params merged over it.
///
/// Where both sides hold an object at the same place, the objects are merged
/// key by key, recursively, so a detail can add one header without restating
/// the template's others. Anywhere else the params' value wins, arrays and
/// `null` included (a handler treats a `null` field as absent). `null` params
/// as a whole mean "no params".
pub fn merge_config(template_config: &Value, params: &Value) -> Value {
    match (template_config, params) {
        (base, Value::Null) => base.clone(),
        (Value::Object(base), Value::Object(over)) => {
            let mut merged = base.clone();
            for (key, value) in over {
                let next = match merged.get(key) {
                    Some(existing @ Value::Object(_)) if value.is_object() => {
                        merge_config(existing, value)
                    }
                    _ => value.clone(),
                };
                merged.insert(key.clone(), next);
            }
            Value::Object(merged)
        }
        (_, over) => over.clone(),
    }
}

/// Bounds a handler's output: anything whose JSON is longer than
/// [`OUTPUT_TOTAL_CAP_BYTES`] is replaced by
/// `{"truncated": true, "original_bytes": n, "preview": "<start of the JSON>"}`
/// so the executions table never receives an unbounded blob.
pub fn cap_output(value: Value) -> Value {
    let text = match serde_json::to_string(&value) {
        Ok(text) => text,
        Err(_) => return value,
    };
    if text.len() <= OUTPUT_TOTAL_CAP_BYTES {
        return value;
    }
    let (preview, _) = capture::utf8_prefix(text.as_bytes(), OUTPUT_CAP_BYTES);
    serde_json::json!({
        "truncated": true,
        "original_bytes": text.len(),
        "preview": preview,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn params_win_and_objects_merge_deeply() {
        let template = json!({
            "url": "https://a.example/x",
            "method": "POST",
            "headers": {"Authorization": "Bearer t", "Accept": "text/plain"},
            "args": ["a", "b"],
        });
        let params = json!({
            "url": "https://b.example/y",
            "headers": {"Accept": "application/json", "X-Extra": "1"},
            "args": ["c"],
        });
        assert_eq!(
            merge_config(&template, &params),
            json!({
                "url": "https://b.example/y",
                "method": "POST",
                "headers": {
                    "Authorization": "Bearer t",
                    "Accept": "application/json",
                    "X-Extra": "1",
                },
                "args": ["c"],
            })
        );
    }

    #[test]
    fn null_params_keep_the_template_and_null_keys_win() {
        let template = json!({"ms": 5});
        assert_eq!(merge_config(&template, &Value::Null), template);
        assert_eq!(merge_config(&template, &json!({})), template);
        assert_eq!(
            merge_config(&template, &json!({"ms": null})),
            json!({"ms": null})
        );
        assert_eq!(
            merge_config(&Value::Null, &json!({"ms": 1})),
            json!({"ms": 1})
        );
        assert_eq!(
            merge_config(&json!({"body": {"a": 1}}), &json!({"body": "text"})),
            json!({"body": "text"})
        );
    }

    #[test]
    fn debug_hides_header_and_env_values() {
        let call = ActionCall {
            execution_id: Uuid::nil(),
            branch_rule_id: Uuid::nil(),
            action_detail_id: Uuid::nil(),
            position: 0,
            kind: "http".into(),
            config: json!({
                "url": "https://x.example",
                "headers": {"Authorization": "Bearer s3cret"},
                "env": {"TOKEN": "hunter2"},
            }),
        };
        let shown = format!("{call:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("Authorization"), "{shown}");
    }

    #[test]
    fn oversized_output_becomes_a_bounded_preview() {
        let small = json!({"a": "b"});
        assert_eq!(cap_output(small.clone()), small);

        let huge = json!({"blob": "\u{0}".repeat(OUTPUT_TOTAL_CAP_BYTES)});
        let capped = cap_output(huge);
        assert_eq!(capped["truncated"], json!(true));
        assert!(capped["original_bytes"].as_u64().unwrap() > OUTPUT_TOTAL_CAP_BYTES as u64);
        assert!(serde_json::to_string(&capped).unwrap().len() <= OUTPUT_TOTAL_CAP_BYTES);
    }
}
