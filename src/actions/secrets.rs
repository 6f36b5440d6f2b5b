//! Which parts of an action's config are secret, and keeping them out of
//! everything ruled shows: API answers, logs and stored outputs.
//!
//! The schema is the same for every kind, so a custom kind is covered too:
//!
//! - every value under `headers`, `env` and `body` (the whole body when it
//!   is text), at any depth;
//! - every value under a key that names a credential ([`is_secret_key`]:
//!   `Authorization`, `X-API-Key`, `pass`, `pwd`, `credentials`,
//!   `private_key`, `…token…`, `…secret…` and the like);
//! - every value under a key the config lists in `secret_keys`
//!   (`{"secret_keys": ["X-Tenant", "order_ref"]}`), matched ignoring case;
//! - in any text, the password of a URL (`postgres://user:PASS@host`) and
//!   the values of query parameters that name a credential
//!   (`?access_token=…`, `?key=…`).
//!
//! [`redact_config`] shows a config with those values as [`MASK`];
//! [`restore_masked`] puts stored values back where a client sent a `***`
//! back unchanged; [`Secrets`] collects the actual values of a call so that
//! whatever an action captured (a body that echoes the request, an error
//! naming the URL) is scrubbed before it is stored or logged.

use std::borrow::Cow;

use serde_json::{Map, Value};

/// What a secret value is shown as.
pub const MASK: &str = "***";

/// The config key listing extra secret keys.
pub const SECRET_KEYS_FIELD: &str = "secret_keys";

/// Keys whose every value is secret, whatever they are called inside.
const SECRET_CONTAINERS: &[&str] = &["headers", "env", "body"];

/// Fragments of a key (lower-case, punctuation removed) that name a
/// credential.
const SECRET_FRAGMENTS: &[&str] = &[
    "password",
    "passwd",
    "passphrase",
    "secret",
    "token",
    "authorization",
    "apikey",
    "privatekey",
    "accesskey",
    "credential",
    "cookie",
    "signature",
    "sessionid",
];

/// Whole words of a key that name a credential; too short to be safe as
/// fragments (`pass` is in `compass`).
const SECRET_WORDS: &[&str] = &["pass", "pwd", "pw", "auth"];

/// Query parameter names that are secret beyond [`is_secret_key`]: API
/// keys and signatures travel as `?key=` and `?sig=`.
const SECRET_QUERY_NAMES: &[&str] = &["key", "sig"];

/// Values shorter than this are not scrubbed from captured text: replacing
/// every `1` or `on` would destroy the output and protect nothing.
const MIN_SCRUB_LEN: usize = 4;

/// Whether `key` names a credential, ignoring case and punctuation.
pub fn is_secret_key(key: &str) -> bool {
    let lower = key.to_ascii_lowercase();
    let compact: String = lower
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    SECRET_FRAGMENTS.iter().any(|f| compact.contains(f))
        || lower
            .split(|c: char| !c.is_ascii_alphanumeric())
            .any(|word| SECRET_WORDS.contains(&word))
}

fn is_secret_query_name(name: &str) -> bool {
    let name = percent_decode(name);
    is_secret_key(&name) || SECRET_QUERY_NAMES.contains(&name.to_ascii_lowercase().as_str())
}

/// The config as the API shows it: every secret value (see the module
/// docs) replaced by [`MASK`], keys and structure kept.
pub fn redact_config(config: &Value) -> Value {
    walk(config, &Rules::schema(), false)
}

/// An action detail's params as shown: [`redact_config`], with the keys
/// its template's config lists in `secret_keys` masked too, since a run
/// merges both lists (a detail's list adds to its template's).
pub fn redact_params(params: &Value, template_config: Option<&Value>) -> Value {
    let schema = Rules::schema();
    let rules = match template_config {
        Some(Value::Object(config)) => schema.with_listed(config),
        _ => Cow::Borrowed(&schema),
    };
    walk(params, &rules, false)
}

/// Like [`redact_config`] without the `headers`/`env`/`body` schema, for
/// JSON that is not an action config (settings, outputs): credential-named
/// keys and URL secrets only.
pub fn redact_named(value: &Value) -> Value {
    walk(value, &Rules::named(), false)
}

#[derive(Clone)]
struct Rules {
    containers: bool,
    extra: Vec<String>,
}

impl Rules {
    fn schema() -> Rules {
        Rules {
            containers: true,
            extra: Vec::new(),
        }
    }

    fn named() -> Rules {
        Rules {
            containers: false,
            extra: Vec::new(),
        }
    }

    /// These rules, plus the `secret_keys` an object lists for itself and
    /// everything under it.
    fn with_listed(&self, map: &Map<String, Value>) -> Cow<'_, Rules> {
        match map.get(SECRET_KEYS_FIELD) {
            Some(Value::Array(keys)) if !keys.is_empty() => {
                let mut rules = self.clone();
                rules.extra.extend(
                    keys.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_ascii_lowercase),
                );
                Cow::Owned(rules)
            }
            _ => Cow::Borrowed(self),
        }
    }

    fn masks_all_under(&self, key: &str) -> bool {
        if key == SECRET_KEYS_FIELD {
            return false;
        }
        (self.containers && SECRET_CONTAINERS.contains(&key))
            || is_secret_key(key)
            || self.extra.iter().any(|k| k.eq_ignore_ascii_case(key))
    }
}

/// Where a config or params value lists its secrets in a way that would
/// silently protect nothing: a `secret_keys` that is not a list of key
/// names, or the field under another spelling (`secretKeys`,
/// `SECRET_KEYS`, `secret-keys`). Returns the field's path under `prefix`
/// and what is wrong with it.
pub fn misdeclared_secret_keys(value: &Value, prefix: &str) -> Option<(String, String)> {
    match value {
        Value::Object(map) => map.iter().find_map(|(key, item)| {
            let path = format!("{prefix}{key}");
            if key == SECRET_KEYS_FIELD {
                let names = item
                    .as_array()
                    .is_some_and(|keys| keys.iter().all(Value::is_string));
                if !names {
                    return Some((
                        path,
                        format!("must be a list of key names, like [\"token\"], not {item}"),
                    ));
                }
                return None;
            }
            let folded: String = key
                .chars()
                .filter(|c| !matches!(c, '_' | '-'))
                .collect::<String>()
                .to_ascii_lowercase();
            if folded == "secretkeys" {
                return Some((
                    path,
                    format!("is spelled {SECRET_KEYS_FIELD:?} here: under another name it protects nothing"),
                ));
            }
            // What `headers`, `env` and `body` hold is the payload, sent as
            // it is (an env var named SECRET_KEYS is the program's), and
            // all of it is masked anyway.
            if SECRET_CONTAINERS.contains(&key.as_str()) {
                return None;
            }
            misdeclared_secret_keys(item, &format!("{path}."))
        }),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| misdeclared_secret_keys(item, &format!("{}[{i}].", prefix.trim_end_matches('.')))),
        _ => None,
    }
}

fn walk(value: &Value, rules: &Rules, masked: bool) -> Value {
    match value {
        Value::Object(map) => {
            let rules = rules.with_listed(map);
            Value::Object(
                map.iter()
                    .map(|(k, v)| {
                        let under = masked || rules.masks_all_under(k);
                        (k.clone(), walk(v, &rules, under))
                    })
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(|v| walk(v, rules, masked)).collect()),
        Value::Null => Value::Null,
        _ if masked => Value::String(MASK.into()),
        Value::String(text) => Value::String(mask_urls(text).into_owned()),
        other => other.clone(),
    }
}

/// One URL found in a text: byte ranges of its password and of the values
/// of its secret query parameters.
#[derive(Debug, Default)]
struct UrlSecrets {
    user: Option<(usize, usize)>,
    password: Option<(usize, usize)>,
    query_values: Vec<(usize, usize)>,
}

impl UrlSecrets {
    /// The secret part of the user info: the password, or else a user
    /// given without one. An API key or token is often put there
    /// (`https://TOKEN@host`, `https://KEY:@host`), and HTTP sends it as
    /// Basic credentials all the same.
    fn credential(&self) -> Option<(usize, usize)> {
        self.password.or(self.user.filter(|(a, b)| a < b))
    }

    /// What [`mask_urls`] hides: the credential and the secret query values.
    fn secret_ranges(self) -> impl Iterator<Item = (usize, usize)> {
        self.credential().into_iter().chain(self.query_values)
    }
}

/// Ends a URL inside free text (a log line, JSON, an error message).
fn ends_url(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '`' | '(' | ')' | ',' | '\\')
}

/// Ends the authority (`user:password@host:port`) of a URL in free text.
/// Looser than [`ends_url`]: a password may hold `(`, `)`, `,` or `'`
/// (URL parsers take them there), and the URL must not be taken to end
/// before its `@`, which would leave the password in clear.
fn ends_authority(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '<' | '>' | '`' | '\\' | '/' | '?' | '#')
}

/// Every `scheme://…` in `text`, with the ranges of its secret parts.
fn scan_urls(text: &str) -> Vec<UrlSecrets> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find("://") {
        let start = from + at + 3;
        let authority_end = text[start..]
            .find(ends_authority)
            .map_or(text.len(), |i| start + i);
        // Past the user info, if there is one: the URL ends after it.
        let after_user = text[start..authority_end]
            .rfind('@')
            .map_or(start, |at_sign| start + at_sign + 1);
        let end = text[after_user..]
            .find(ends_url)
            .map_or(text.len(), |i| after_user + i);
        let url = &text[start..end];
        let authority_end = url.find(['/', '?', '#']).unwrap_or(url.len());
        let mut secrets = UrlSecrets::default();
        if let Some(at_sign) = url[..authority_end].rfind('@') {
            let userinfo = &url[..at_sign];
            match userinfo.find(':') {
                Some(colon) => {
                    secrets.user = Some((start, start + colon));
                    if colon + 1 < at_sign {
                        secrets.password = Some((start + colon + 1, start + at_sign));
                    }
                }
                None => secrets.user = Some((start, start + at_sign)),
            }
        }
        if let Some(q) = url[authority_end..].find('?') {
            let query_start = authority_end + q + 1;
            let query_end = url[query_start..]
                .find('#')
                .map_or(url.len(), |i| query_start + i);
            let mut offset = query_start;
            for pair in url[query_start..query_end].split('&') {
                if let Some((name, value)) = pair.split_once('=')
                    && !value.is_empty()
                    && is_secret_query_name(name)
                {
                    let value_start = start + offset + name.len() + 1;
                    secrets
                        .query_values
                        .push((value_start, value_start + value.len()));
                }
                offset += pair.len() + 1;
            }
        }
        found.push(secrets);
        from = end.max(start);
    }
    found
}

/// `text` with URL credentials (a password, or a user given without one)
/// and secret query values replaced by [`MASK`].
pub fn mask_urls(text: &str) -> Cow<'_, str> {
    mask_url_ranges(text, UrlSecrets::secret_ranges)
}

/// A database URL as a log or an error may show it: its password, in the
/// user info or the query (`?password=…`), replaced by [`MASK`]. Its user
/// is kept: a database user without a password is a name, not a secret.
pub fn mask_database_url(url: &str) -> String {
    mask_url_ranges(url, |u| u.password.into_iter().chain(u.query_values)).into_owned()
}

fn mask_url_ranges<I: Iterator<Item = (usize, usize)>>(
    text: &str,
    secret: impl Fn(UrlSecrets) -> I,
) -> Cow<'_, str> {
    if !text.contains("://") {
        return Cow::Borrowed(text);
    }
    let mut ranges: Vec<(usize, usize)> = scan_urls(text)
        .into_iter()
        .flat_map(secret)
        .filter(|&(a, b)| &text[a..b] != MASK)
        .collect();
    if ranges.is_empty() {
        return Cow::Borrowed(text);
    }
    ranges.sort_unstable();
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for (a, b) in ranges {
        if a < last {
            continue;
        }
        out.push_str(&text[last..a]);
        out.push_str(MASK);
        last = b;
    }
    out.push_str(&text[last..]);
    Cow::Owned(out)
}

/// Puts stored values back into `incoming` wherever the client sent a
/// [`MASK`] back: a `***` value takes the stored value at the same place,
/// and a URL whose password or query values are `***` takes the stored URL
/// if it is otherwise unchanged. Err names the field (below `field`) that
/// holds a `***` with nothing stored to keep.
pub fn restore_masked(
    stored: Option<&Value>,
    incoming: &mut Value,
    field: &str,
) -> Result<(), String> {
    match incoming {
        Value::String(text) if text == MASK => match stored {
            Some(value) if !value.is_null() => {
                *incoming = value.clone();
                Ok(())
            }
            _ => Err(field.to_string()),
        },
        Value::String(text) if text.contains(MASK) && text.contains("://") => {
            let masked_url = scan_urls(text)
                .into_iter()
                .any(|u| u.secret_ranges().any(|(a, b)| &text[a..b] == MASK));
            if !masked_url {
                return Ok(());
            }
            match stored {
                Some(Value::String(old)) if mask_urls(old) == text.as_str() => {
                    *incoming = Value::String(old.clone());
                    Ok(())
                }
                _ => Err(field.to_string()),
            }
        }
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                let old = stored.and_then(|s| s.get(key));
                restore_masked(old, value, &format!("{field}.{key}"))?;
            }
            Ok(())
        }
        Value::Array(items) => {
            for (i, value) in items.iter_mut().enumerate() {
                let old = stored.and_then(|s| s.get(i));
                restore_masked(old, value, &format!("{field}[{i}]"))?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Why a `***` sent back may not keep its stored secret, naming the field
/// (below `field`) at fault: when the request also moves where the secret
/// goes (a changed `url` would send kept headers or credentials to another
/// host) or stops declaring it secret (a name dropped from a `secret_keys`
/// list would make the kept value readable by anyone). Checked only when
/// something was kept: `stored` and `kept` are the values before and after
/// [`restore_masked`].
pub fn unsafe_to_keep(
    stored: Option<&Value>,
    sent: &Value,
    kept: &Value,
    field: &str,
) -> Option<(String, String)> {
    let stored = stored?;
    if let (Some(old), Some(new)) = (stored.get("url"), kept.get("url"))
        && old != new
    {
        return Some((
            format!("{field}.url"),
            format!(
                "changes while {MASK:?} keeps stored secrets; send them again with the new url"
            ),
        ));
    }
    let mut declared = Vec::new();
    secret_key_lists(stored, field, &mut declared);
    let mut still = Vec::new();
    secret_key_lists(kept, field, &mut still);
    let mut restored = Vec::new();
    restored_paths(sent, kept, field, &mut restored);
    // A name dropped matters only where a value kept sits under it.
    let keeps_under = |list_path: &str, name: &str| {
        let object = list_path
            .strip_suffix(SECRET_KEYS_FIELD)
            .unwrap_or(list_path);
        restored.iter().any(|path| {
            path.strip_prefix(object).is_some_and(|rest| {
                let key = rest.split(['.', '[']).next().unwrap_or_default();
                key.eq_ignore_ascii_case(name)
            })
        })
    };
    declared
        .into_iter()
        .find(|entry| !still.contains(entry) && keeps_under(&entry.0, &entry.1))
        .map(|(path, name)| {
            (
                path,
                format!(
                    "drops {name:?} while {MASK:?} keeps stored secrets; send their values to stop \
                     declaring them secret"
                ),
            )
        })
}

/// The paths (as [`secret_key_lists`] writes them) where `sent` held a
/// [`MASK`] that [`restore_masked`] replaced with a stored value.
fn restored_paths(sent: &Value, kept: &Value, path: &str, out: &mut Vec<String>) {
    match (sent, kept) {
        (Value::String(text), kept)
            if text.contains(MASK) && kept.as_str() != Some(text.as_str()) =>
        {
            out.push(path.to_string());
        }
        (Value::Object(sent), Value::Object(kept)) => {
            for (key, item) in sent {
                if let Some(kept_item) = kept.get(key) {
                    restored_paths(item, kept_item, &format!("{path}.{key}"), out);
                }
            }
        }
        (Value::Array(sent), Value::Array(kept)) => {
            for (i, (item, kept_item)) in sent.iter().zip(kept).enumerate() {
                restored_paths(item, kept_item, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// Every `(path of a secret_keys list, name it lists)` in `value`.
fn secret_key_lists(value: &Value, path: &str, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) => {
            for (key, item) in map {
                let here = format!("{path}.{key}");
                if key == SECRET_KEYS_FIELD {
                    let names = item
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_str);
                    out.extend(names.map(|name| (here.clone(), name.to_ascii_lowercase())));
                } else {
                    secret_key_lists(item, &here, out);
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                secret_key_lists(item, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// The secret values of one action call, in every form they may take in
/// captured text (as sent, JSON-escaped, percent-decoded, the token after
/// an auth scheme, HTTP Basic's base64 of `user:password`).
#[derive(Debug, Clone, Default)]
pub struct Secrets {
    /// Longest first, so a value is replaced before any part of it.
    values: Vec<String>,
}

impl Secrets {
    /// The secret values of `config`, located by the same rules as
    /// [`redact_config`].
    pub fn of(config: &Value) -> Secrets {
        let mut raw = Vec::new();
        collect(config, &redact_config(config), &mut raw);
        let mut values = Vec::new();
        for value in raw {
            let escaped = serde_json::to_string(&value).unwrap_or_default();
            let escaped = escaped.trim_matches('"').to_string();
            let decoded = percent_decode(&value);
            if let Some((scheme, token)) = value.split_once(' ')
                && !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-')
            {
                values.push(token.trim().to_string());
            }
            values.push(escaped);
            values.push(decoded.into_owned());
            values.push(value);
        }
        values.retain(|v| v.len() >= MIN_SCRUB_LEN && v != MASK);
        values.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        values.dedup();
        Secrets { values }
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// `text` with every secret value, and any URL secret, masked.
    pub fn scrub_text(&self, text: &str) -> String {
        let mut out = mask_urls(text).into_owned();
        for value in &self.values {
            if out.contains(value.as_str()) {
                out = out.replace(value.as_str(), MASK);
            }
        }
        out
    }

    /// `value` with [`Secrets::scrub_text`] applied to every string. A key
    /// is masked only when it is a secret as a whole (a captured header map
    /// could be keyed by one): masking parts of keys would turn an output's
    /// `exit_code` into `***_code` for an env value of `exit`.
    pub fn scrub(&self, value: &Value) -> Value {
        match value {
            Value::String(text) => Value::String(self.scrub_text(text)),
            Value::Array(items) => Value::Array(items.iter().map(|v| self.scrub(v)).collect()),
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| {
                        let key = if self.values.iter().any(|secret| secret == k) {
                            MASK.to_string()
                        } else {
                            k.clone()
                        };
                        (key, self.scrub(v))
                    })
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}

/// Pairs the config with its redacted form and collects what was hidden.
fn collect(original: &Value, shown: &Value, out: &mut Vec<String>) {
    match (original, shown) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                if let Some(shown) = b.get(key) {
                    collect(value, shown, out);
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for (value, shown) in a.iter().zip(b) {
                collect(value, shown, out);
            }
        }
        (Value::String(text), _) => {
            if shown.as_str() == Some(MASK) {
                out.push(text.clone());
            }
            for url in scan_urls(text) {
                // HTTP Basic's base64 of `user:password` (`user:` alone
                // when the user is the credential).
                if let Some((ua, ub)) = url.user
                    && url.credential().is_some()
                {
                    let password = url
                        .password
                        .map_or(Cow::Borrowed(""), |(pa, pb)| percent_decode(&text[pa..pb]));
                    let pair = format!("{}:{password}", percent_decode(&text[ua..ub]));
                    out.push(base64(pair.as_bytes()));
                }
                for (a, b) in url.secret_ranges() {
                    out.push(text[a..b].to_string());
                }
            }
        }
        (Value::Number(n), _) if shown.as_str() == Some(MASK) => out.push(n.to_string()),
        (Value::Bool(b), _) if shown.as_str() == Some(MASK) => out.push(b.to_string()),
        _ => {}
    }
}

fn percent_decode(text: &str) -> Cow<'_, str> {
    if !text.contains('%') {
        return Cow::Borrowed(text);
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

/// Standard base64 with padding, as HTTP Basic uses it.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &b)| acc | (u32::from(b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn credential_names_are_recognised() {
        for key in [
            "Authorization",
            "X-API-Key",
            "Api-Key",
            "apiKey",
            "pass",
            "pwd",
            "credentials",
            "private_key",
            "access_token",
            "DB_PASSWORD",
            "client_secret",
            "Cookie",
            "x-auth",
        ] {
            assert!(is_secret_key(key), "{key}");
        }
        for key in [
            "url", "method", "compass", "Accept", "author", "ms", "keyboard",
        ] {
            assert!(!is_secret_key(key), "{key}");
        }
    }

    #[test]
    fn the_schema_hides_headers_body_env_and_url_secrets() {
        let config = json!({
            "method": "POST",
            "url": "https://user:pw-1@host/x?access_token=abc123&page=2",
            "headers": {"Accept": "text/plain", "X-API-Key": "k-123"},
            "body": {"pass": "p-1", "nested": {"n": 5}, "list": ["a"]},
            "env": {"HOME": "/root"},
            "timeout_ms": 1000,
            "dsn": "postgres://app:PGPASS@db:5432/x",
            "tenant": "t-1",
            "secret_keys": ["Tenant"],
        });
        let shown = redact_config(&config);
        assert_eq!(shown["method"], "POST");
        assert_eq!(
            shown["url"],
            "https://user:***@host/x?access_token=***&page=2"
        );
        assert_eq!(shown["headers"], json!({"Accept": MASK, "X-API-Key": MASK}));
        assert_eq!(
            shown["body"],
            json!({"pass": MASK, "nested": {"n": MASK}, "list": [MASK]})
        );
        assert_eq!(shown["env"]["HOME"], MASK);
        assert_eq!(shown["timeout_ms"], 1000);
        assert_eq!(shown["dsn"], "postgres://app:***@db:5432/x");
        assert_eq!(shown["tenant"], MASK);
        assert_eq!(shown["secret_keys"], json!(["Tenant"]));
        assert_eq!(redact_config(&json!({"body": "text"}))["body"], MASK);
        // Outside an action config only names and URLs count.
        let named = redact_named(&json!({"headers": {"content-type": "x"}, "token": "t"}));
        assert_eq!(
            named,
            json!({"headers": {"content-type": "x"}, "token": MASK})
        );
    }

    #[test]
    fn urls_in_free_text_are_masked() {
        assert_eq!(
            mask_urls("error sending request for url (http://u:p%40ss@h:1/x?key=abc#f): boom"),
            "error sending request for url (http://u:***@h:1/x?key=***#f): boom"
        );
        assert_eq!(
            mask_urls("see https://example.com/a?b=c"),
            "see https://example.com/a?b=c"
        );
        assert_eq!(mask_urls("no url"), "no url");
        assert_eq!(
            mask_urls("a postgres://x:1@h/d and redis://:pw@r/0"),
            "a postgres://x:***@h/d and redis://:***@r/0"
        );
        // A password with characters that end a URL in free text.
        for password in ["Pa(ss)w0rd", "pa,ss", "it's", "a)b"] {
            let text = format!("url (https://svc:{password}@api.example/x), then");
            assert_eq!(
                mask_urls(&text),
                "url (https://svc:***@api.example/x), then",
                "{password}"
            );
            assert_eq!(
                mask_database_url(&format!("postgres://app:{password}@db/x")),
                "postgres://app:***@db/x"
            );
        }
        assert_eq!(
            mask_urls("(see http://host) and a@b.c"),
            "(see http://host) and a@b.c"
        );
    }

    #[test]
    fn masks_sent_back_keep_the_stored_values() {
        let stored = json!({
            "url": "https://user:pw@host/x?access_token=abc",
            "headers": {"Authorization": "Bearer t0k3n", "Accept": "x"},
            "body": "raw",
        });
        let mut incoming = redact_config(&stored);
        incoming["headers"]["Accept"] = json!("y");
        restore_masked(Some(&stored), &mut incoming, "config").unwrap();
        assert_eq!(incoming["url"], stored["url"]);
        assert_eq!(incoming["headers"]["Authorization"], "Bearer t0k3n");
        assert_eq!(incoming["headers"]["Accept"], "y");
        assert_eq!(incoming["body"], "raw");

        let mut unknown = json!({"headers": {"X-New": MASK}});
        assert_eq!(
            restore_masked(Some(&stored), &mut unknown, "config").unwrap_err(),
            "config.headers.X-New"
        );
        let mut moved = json!({"url": "https://user:***@other/x"});
        assert_eq!(
            restore_masked(Some(&stored), &mut moved, "config").unwrap_err(),
            "config.url"
        );
    }

    #[test]
    fn captured_text_loses_every_form_of_a_secret() {
        let config = json!({
            "url": "http://user:pw-s3cret@127.0.0.1:1/x?access_token=tok-abc",
            "headers": {"Authorization": "Bearer hdr-s3cret"},
            "body": {"private_key": "line1\nline2"},
        });
        let secrets = Secrets::of(&config);
        let echo = format!(
            "GET /x?access_token=tok-abc\r\nauthorization: Basic {}\r\nx: hdr-s3cret\r\n\r\n{}",
            base64(b"user:pw-s3cret"),
            serde_json::to_string(&json!({"private_key": "line1\nline2"})).unwrap()
        );
        let scrubbed = secrets.scrub_text(&echo);
        for secret in [
            "tok-abc",
            "hdr-s3cret",
            "line1",
            "pw-s3cret",
            &base64(b"user:pw-s3cret"),
        ] {
            assert!(!scrubbed.contains(secret), "{secret} in {scrubbed}");
        }
        let value = secrets.scrub(&json!({"body": echo}));
        assert!(!value.to_string().contains("hdr-s3cret"));
    }

    /// A token given as the URL's user (`https://TOKEN@host`,
    /// `https://KEY:@host`) is the credential: shown masked, restored from
    /// a `***`, and scrubbed as sent (itself and Basic's `KEY:`).
    #[test]
    fn a_user_without_a_password_is_the_credential() {
        let config = json!({
            "url": "https://ghp_tok3n@api.example/x",
            "hook": "https://sk_live_k3y:@pay.example/charge",
        });
        let shown = redact_config(&config);
        assert_eq!(shown["url"], "https://***@api.example/x");
        assert_eq!(shown["hook"], "https://***:@pay.example/charge");
        let mut back = shown.clone();
        restore_masked(Some(&config), &mut back, "config").unwrap();
        assert_eq!(back, config);

        let secrets = Secrets::of(&config);
        let echo = format!(
            "authorization: Basic {} for ghp_tok3n and sk_live_k3y",
            base64(b"sk_live_k3y:")
        );
        let scrubbed = secrets.scrub_text(&echo);
        for secret in ["ghp_tok3n", "sk_live_k3y", &base64(b"sk_live_k3y:")] {
            assert!(!scrubbed.contains(secret), "{secret} in {scrubbed}");
        }
    }

    /// A database user is a name and stays; its password goes, in the
    /// user info or in the query.
    #[test]
    fn a_database_url_loses_its_password_only() {
        for (url, shown) in [
            ("postgres://app:s3cret@db/x", "postgres://app:***@db/x"),
            ("postgres://app@db/x", "postgres://app@db/x"),
            (
                "postgres://app@db/x?password=s3cret&sslmode=disable",
                "postgres://app@db/x?password=***&sslmode=disable",
            ),
            ("sqlite://ruled.db", "sqlite://ruled.db"),
        ] {
            assert_eq!(mask_database_url(url), shown);
        }
    }

    #[test]
    fn a_templates_secret_keys_mask_its_details_params() {
        let template = json!({"url": "https://x/y", "secret_keys": ["order_ref"]});
        let params =
            json!({"order_ref": "S3CR3T", "page": 2, "secret_keys": ["Tenant"], "tenant": "t"});
        assert_eq!(
            redact_params(&params, Some(&template)),
            json!({"order_ref": MASK, "page": 2, "secret_keys": ["Tenant"], "tenant": MASK})
        );
        assert_eq!(redact_params(&params, None)["order_ref"], "S3CR3T");
    }

    #[test]
    fn a_kept_secret_may_not_change_its_destination_or_lose_its_declaration() {
        let stored = json!({
            "url": "https://api.example/x",
            "headers": {"Authorization": "Bearer s3cr3t"},
            "secret_keys": ["tenant"],
            "tenant": "T0K",
        });
        let keep = |body: Value| {
            let mut kept = body.clone();
            restore_masked(Some(&stored), &mut kept, "config").unwrap();
            unsafe_to_keep(Some(&stored), &body, &kept, "config").map(|(field, _)| field)
        };
        let same = json!({
            "url": "https://api.example/x",
            "headers": {"Authorization": "***"},
            "secret_keys": ["tenant", "more"],
            "tenant": "***",
        });
        assert_eq!(keep(same), None);
        let elsewhere = json!({
            "url": "https://attacker.example/",
            "headers": {"Authorization": "***"},
            "secret_keys": ["tenant"],
            "tenant": "***",
        });
        assert_eq!(keep(elsewhere).as_deref(), Some("config.url"));
        let undeclared = json!({
            "url": "https://api.example/x",
            "headers": {"Authorization": "***"},
            "tenant": "***",
        });
        assert_eq!(keep(undeclared).as_deref(), Some("config.secret_keys"));
        // Dropping a name whose value is sent in clear, while another
        // secret is kept, is fine.
        let resent = json!({
            "url": "https://api.example/x",
            "headers": {"Authorization": "***"},
            "tenant": "T0K-now-public",
        });
        assert_eq!(keep(resent), None);
    }

    #[test]
    fn secret_keys_that_would_protect_nothing_are_named() {
        let ok = json!({"secret_keys": ["tenant"], "tenant": "T0K", "nested": {"secret_keys": []}});
        assert_eq!(misdeclared_secret_keys(&ok, "config."), None);
        let payload = json!({"env": {"SECRET_KEYS": "a,b"}, "body": {"secretKeys": "x"}});
        assert_eq!(misdeclared_secret_keys(&payload, "config."), None);
        for (value, field) in [
            (json!({"secret_keys": "tenant"}), "config.secret_keys"),
            (json!({"secret_keys": [1]}), "config.secret_keys"),
            (json!({"secretKeys": ["tenant"]}), "config.secretKeys"),
            (
                json!({"auth": {"SECRET-KEYS": ["x"]}}),
                "config.auth.SECRET-KEYS",
            ),
            (
                json!({"steps": [{}, {"secret_keys": {}}]}),
                "config.steps[1].secret_keys",
            ),
        ] {
            let (path, message) = misdeclared_secret_keys(&value, "config.").unwrap();
            assert_eq!(path, field, "{value}: {message}");
        }
    }

    #[test]
    fn base64_matches_the_standard() {
        assert_eq!(base64(b"user:pw"), "dXNlcjpwdw==");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b"abc"), "YWJj");
        assert_eq!(base64(b""), "");
    }
}
