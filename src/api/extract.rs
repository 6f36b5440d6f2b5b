//! Request bodies, URLs, authentication and the body size limit: what a
//! request must be before a handler sees it.

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use serde::de::{DeserializeOwned, IgnoredAny};
use tracing::info;

use super::ApiState;
use super::error::ApiError;
use super::i18n::english;
use crate::config::NamedToken;

/// Bodies above this are refused; DESIGN.md's largest object (a branch rule
/// with its action details) fits many times over.
pub const BODY_LIMIT: usize = 64 * 1024;

/// A JSON body read with the size limit enforced while streaming, so a huge
/// body is refused after [`BODY_LIMIT`] bytes rather than buffered whole,
/// and parse errors become 400s that name the field.
///
/// Refused besides what the target type refuses: a Content-Type other than
/// `application/json` (415), anything after the JSON value, a NUL
/// character in a string (PostgreSQL cannot store one in TEXT, SQLite
/// would), and an integer outside i64 (it would be kept as a float).
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, ApiError> {
        let too_large = ApiError::BodyTooLarge { limit: BODY_LIMIT };
        let content_type = content_type(req.headers())?;
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > BODY_LIMIT as u64) {
            return Err(too_large);
        }
        let body = http_body_util::Limited::new(req.into_body(), BODY_LIMIT);
        let bytes: Bytes = match body.collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => return Err(too_large),
            Err(e) => return Err(ApiError::InvalidBody(format!("cannot read the body: {e}"))),
        };
        // Every body this API takes is an object; serde would also read a
        // struct from an array (`[null, null]`), which no client means.
        let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
        if first.is_none() {
            return Err(ApiError::InvalidBody(english(
                "detail.json_object_required",
            )));
        }
        if content_type == ContentType::Missing {
            return Err(ApiError::UnsupportedMediaType(english(
                "detail.no_content_type",
            )));
        }
        // Syntax first, the whole document: `from_slice` refuses trailing
        // characters, which a bare `deserialize` would ignore.
        serde_json::from_slice::<IgnoredAny>(&bytes)
            .map_err(|e| ApiError::InvalidBody(e.to_string()))?;
        check_values(&bytes)?;
        if first != Some(&b'{') {
            return Err(ApiError::InvalidBody(english(
                "detail.json_object_required",
            )));
        }
        let mut deserializer = serde_json::Deserializer::from_slice(&bytes);
        match serde_path_to_error::deserialize(&mut deserializer) {
            Ok(value) => Ok(ApiJson(value)),
            Err(e) => {
                let path = e.path().to_string();
                let inner = e.into_inner().to_string();
                // serde names a missing field in its text: the field is
                // what the client must fix, so the error names it.
                let missing = inner
                    .strip_prefix("missing field `")
                    .and_then(|rest| rest.split_once('`'))
                    .map(|(field, _)| field.to_string());
                let at = |field: String| match path.as_str() {
                    "." | "" => field,
                    parent => format!("{parent}.{field}"),
                };
                match missing {
                    Some(field) => Err(ApiError::field(at(field), "is required")),
                    None if path == "." || path.is_empty() => Err(ApiError::InvalidBody(inner)),
                    None => Err(ApiError::field(path, inner)),
                }
            }
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum ContentType {
    Json,
    Missing,
}

/// `application/json`, with parameters allowed (a charset must be UTF-8,
/// the only encoding JSON has, RFC 8259 §8.1); anything else is a 415.
fn content_type(headers: &HeaderMap) -> Result<ContentType, ApiError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Ok(ContentType::Missing);
    };
    let text = value.to_str().unwrap_or("");
    let refused = || ApiError::UnsupportedMediaType(text.to_string());
    let mut parts = text.split(';');
    let essence = parts.next().unwrap_or("").trim();
    if !essence.eq_ignore_ascii_case("application/json") {
        return Err(refused());
    }
    for parameter in parts {
        if let Some((name, value)) = parameter.split_once('=')
            && name.trim().eq_ignore_ascii_case("charset")
        {
            let charset = value.trim().trim_matches('"');
            if !charset.eq_ignore_ascii_case("utf-8") && !charset.eq_ignore_ascii_case("utf8") {
                return Err(refused());
            }
        }
    }
    Ok(ContentType::Json)
}

/// One step of the path to a value, for naming it as serde_path_to_error
/// does (`action_details[0].params.url`).
enum Step {
    Key(String),
    Index(usize),
}

fn path_text(path: &[Step]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Step::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// Walks a syntactically valid JSON document (checked before) for the
/// values serde_json accepts but the stores cannot keep faithfully, and
/// names the first one's field.
fn check_values(bytes: &[u8]) -> Result<(), ApiError> {
    let mut walker = Walker {
        bytes,
        at: 0,
        path: Vec::new(),
        free_form: 0,
    };
    walker.value()
}

struct Walker<'a> {
    bytes: &'a [u8],
    at: usize,
    path: Vec<Step>,
    /// How many free-form objects (settings, config, params) enclose the
    /// current value: they are stored as JSON text, where a NUL is the
    /// escape `\u0000`, so it may appear there.
    free_form: usize,
}

/// The fields whose value is the caller's own JSON object.
const FREE_FORM_FIELDS: [&str; 3] = ["settings", "config", "params"];

impl Walker<'_> {
    fn peek(&self) -> u8 {
        self.bytes.get(self.at).copied().unwrap_or(0)
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), b' ' | b'\t' | b'\n' | b'\r') {
            self.at += 1;
        }
    }

    fn refuse(&self, detail: &str) -> ApiError {
        let path = path_text(&self.path);
        if path.is_empty() {
            ApiError::InvalidBody(english(detail))
        } else {
            ApiError::field(path, english(detail))
        }
    }

    fn value(&mut self) -> Result<(), ApiError> {
        self.skip_whitespace();
        match self.peek() {
            b'{' => {
                self.at += 1;
                loop {
                    self.skip_whitespace();
                    if self.peek() == b'}' {
                        self.at += 1;
                        return Ok(());
                    }
                    if self.peek() == b',' {
                        self.at += 1;
                        self.skip_whitespace();
                    }
                    let key = self.string()?;
                    self.skip_whitespace();
                    self.at += 1; // ':'
                    let nul = key.contains('\0');
                    let free_form = FREE_FORM_FIELDS.contains(&key.as_str());
                    self.path.push(Step::Key(key));
                    if nul && self.free_form == 0 {
                        return Err(self.refuse("detail.nul_key"));
                    }
                    self.free_form += usize::from(free_form);
                    self.value()?;
                    self.free_form -= usize::from(free_form);
                    self.path.pop();
                }
            }
            b'[' => {
                self.at += 1;
                let mut index = 0;
                loop {
                    self.skip_whitespace();
                    match self.peek() {
                        b']' => {
                            self.at += 1;
                            return Ok(());
                        }
                        b',' => self.at += 1,
                        _ => {
                            self.path.push(Step::Index(index));
                            self.value()?;
                            self.path.pop();
                            index += 1;
                        }
                    }
                }
            }
            b'"' => {
                if self.string()?.contains('\0') && self.free_form == 0 {
                    return Err(self.refuse("detail.nul"));
                }
                Ok(())
            }
            b'-' | b'0'..=b'9' => {
                let start = self.at;
                while matches!(self.peek(), b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') {
                    self.at += 1;
                }
                let literal = &self.bytes[start..self.at];
                // JSON Schema counts any number without a fraction as an
                // integer (1e300, 2.0): those beyond i64 are refused, as
                // serde_json would keep them only as lossy floats.
                let text = std::str::from_utf8(literal).unwrap_or_default();
                let plain = !literal.iter().any(|b| matches!(b, b'.' | b'e' | b'E'));
                let refused = if plain {
                    text.parse::<i64>().is_err()
                } else {
                    let integral = text
                        .parse::<f64>()
                        .is_ok_and(|v| v.fract() == 0.0 || !v.is_finite());
                    integral && !within_i64(text)
                };
                if refused {
                    return Err(self.refuse("detail.integer_range"));
                }
                Ok(())
            }
            _ => {
                // true, false, null
                while self.peek().is_ascii_alphabetic() {
                    self.at += 1;
                }
                Ok(())
            }
        }
    }

    /// The string starting at the current `"`, unescaped.
    fn string(&mut self) -> Result<String, ApiError> {
        let start = self.at;
        self.at += 1;
        while self.at < self.bytes.len() {
            match self.bytes[self.at] {
                b'\\' => self.at += 2,
                b'"' => {
                    self.at += 1;
                    return serde_json::from_slice(&self.bytes[start..self.at])
                        .map_err(|e| ApiError::InvalidBody(e.to_string()));
                }
                _ => self.at += 1,
            }
        }
        Err(ApiError::InvalidBody("unterminated string".into()))
    }
}

/// Refuses a path or query string whose percent-encoding is broken or
/// decodes to a NUL, before routing: the extractors would otherwise answer
/// in plain text, or pass on a `%ZZ` or a NUL that PostgreSQL refuses.
pub fn check_url(uri: &Uri) -> Result<(), ApiError> {
    if let Err(problem) = percent_decode(uri.path()) {
        return Err(ApiError::InvalidPath(english(match problem {
            UrlProblem::Encoding => "detail.path_bad_percent",
            UrlProblem::Nul => "detail.path_nul",
        })));
    }
    for pair in uri.query().unwrap_or("").split('&') {
        if let Err(problem) = percent_decode(pair) {
            let name = pair.split_once('=').map_or(pair, |(name, _)| name);
            return Err(ApiError::InvalidQueryParameter {
                parameter: percent_decode(name).unwrap_or_else(|_| name.to_string()),
                message: english(match problem {
                    UrlProblem::Encoding => "detail.bad_percent",
                    UrlProblem::Nul => "detail.nul_in_url",
                }),
            });
        }
    }
    Ok(())
}

#[derive(Debug, PartialEq, Eq)]
enum UrlProblem {
    Encoding,
    Nul,
}

fn percent_decode(text: &str) -> Result<String, UrlProblem> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).ok_or(UrlProblem::Encoding)?;
            let hex = std::str::from_utf8(hex).map_err(|_| UrlProblem::Encoding)?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| UrlProblem::Encoding)?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    if out.contains(&0) {
        return Err(UrlProblem::Nul);
    }
    String::from_utf8(out).map_err(|_| UrlProblem::Encoding)
}

/// Who made a change: the name of the bearer token it came with
/// (API_TOKENS, or `api` for API_TOKEN). Mutating handlers take it as an
/// argument; [`require_token`] has put it on every request that reaches
/// them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller(pub String);

impl Caller {
    pub fn name(&self) -> &str {
        &self.0
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or(ApiError::Unauthorized)
    }
}

/// The name of the token in `Authorization: Bearer <token>` (the scheme in
/// any case, RFC 9110 §11.1), if it is one of `tokens`.
pub fn caller_of(tokens: &[NamedToken], headers: &HeaderMap) -> Option<Caller> {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map_or("", |(_, token)| token.trim());
    // Every token is compared, so the time taken says nothing about which
    // one matched or how much of it.
    let mut found = None;
    for token in tokens {
        if constant_time_eq(given.as_bytes(), token.token.as_bytes()) && !given.is_empty() {
            found = Some(Caller(token.name.clone()));
        }
    }
    found
}

/// Mutations need `Authorization: Bearer <token>` with a token of
/// API_TOKENS or API_TOKEN; without either the API is read-only. The
/// token's name goes on the request as a [`Caller`] and into the audit
/// line.
///
/// Which operations are mutations the OpenAPI document says (they declare
/// `security`): every method but GET and HEAD, except `POST /simulate`,
/// which computes a report and changes nothing, so it is as open as the
/// reads.
pub async fn require_token(
    State(state): State<ApiState>,
    mut req: Request<Body>,
    next: Next,
) -> Response {
    if matches!(*req.method(), Method::GET | Method::HEAD) || !routed(&req) || !guarded(&req) {
        return next.run(req).await;
    }
    let tokens = state.config().tokens();
    if tokens.is_empty() {
        return ApiError::ReadOnly.into_response();
    }
    let caller = caller_of(&tokens, req.headers());
    let method = req.method().clone();
    let path = super::full_path(req.uri());
    let response = match &caller {
        Some(caller) => {
            req.extensions_mut().insert(caller.clone());
            next.run(req).await
        }
        None => ApiError::Unauthorized.into_response(),
    };
    // An audit trail of changes; bodies stay out of the log, since they
    // may carry secrets in action params.
    let caller = caller.as_ref().map_or("-", Caller::name);
    info!(%method, %path, caller = %caller, status = response.status().as_u16(), "🔧 API change by {caller}");
    response
}

/// Refuses a query parameter the operation does not declare (400 naming
/// it), on every route: a route without query parameters would otherwise
/// ignore it, and a client's typo (`?limt=5`) would pass unnoticed.
pub async fn refuse_undeclared_query(req: Request<Body>, next: Next) -> Response {
    let declared = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .and_then(|matched| {
            super::routes::query_parameters(req.method().as_str(), matched.as_str())
        });
    if let (Some(declared), Some(query)) = (declared, req.uri().query()) {
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let name = pair.split_once('=').map_or(pair, |(name, _)| name);
            let name = percent_decode(&name.replace('+', " ")).unwrap_or_else(|_| name.into());
            if !declared.contains(&name) {
                return ApiError::InvalidQueryParameter {
                    parameter: name,
                    message: english("detail.unknown_parameter"),
                }
                .into_response();
            }
        }
    }
    next.run(req).await
}

/// Whether the routed operation needs the token, as the document says;
/// one it does not list (none should be) does, when it is not a read.
fn guarded(req: &Request<Body>) -> bool {
    req.extensions()
        .get::<axum::extract::MatchedPath>()
        .and_then(|matched| super::routes::requires_token(req.method().as_str(), matched.as_str()))
        .unwrap_or(true)
}

/// Whether the path takes this method; if not, the request goes on to the
/// 405 (with `Allow`) without a token, since it can change nothing.
fn routed(req: &Request<Body>) -> bool {
    let method = req.method().as_str();
    super::routes::allowed_methods(req.uri().path())
        .is_none_or(|allow| allow.split(',').any(|m| m == method))
}

/// Whether an integral number written with a fraction or exponent (`2.0`,
/// `1e3`) lies within i64.
fn within_i64(text: &str) -> bool {
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    text.parse::<f64>()
        .is_ok_and(|v| v.is_finite() && (-LIMIT..LIMIT).contains(&v))
}

/// Compares without an early exit, so the time taken says nothing about
/// how much of the token matched. The length is not secret.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn tokens_compare_exactly() {
        assert!(constant_time_eq(b"s3cret", b"s3cret"));
        assert!(!constant_time_eq(b"s3cret", b"s3cres"));
        assert!(!constant_time_eq(b"s3cret", b"s3cre"));
        assert!(!constant_time_eq(b"", b"x"));
    }

    fn error_of(body: &str) -> Option<String> {
        serde_json::from_str::<IgnoredAny>(body).unwrap();
        check_values(body.as_bytes()).err().map(|e| e.to_string())
    }

    #[test]
    fn nul_and_oversized_integers_are_refused_by_field() {
        assert_eq!(
            error_of(r#"{"name": "ok", "n": [1, -2, 3.5, 2.0, 1e3]}"#),
            None
        );
        // A whole number is an integer however it is written.
        let e = error_of(r#"{"n": 3.5e300}"#).unwrap();
        assert!(e.starts_with("n: is an integer outside"), "{e}");
        // The caller's own objects are stored as JSON text, where a NUL is
        // an escape: allowed there, in keys and values.
        assert_eq!(
            error_of(r#"{"settings": {"k\u0000": "v\u0000"}, "params": ["\u0000"]}"#),
            None
        );
        assert_eq!(
            error_of(r#"{"n": 9223372036854775807, "m": -9223372036854775808}"#),
            None
        );
        let e = error_of(r#"{"name": "a\u0000b"}"#).unwrap();
        assert!(e.starts_with("name: must not contain a NUL"), "{e}");
        let e = error_of(r#"{"a": {"b": [0, {"c": 9223372036854775808}]}}"#).unwrap();
        assert!(e.starts_with("a.b[1].c: is an integer outside"), "{e}");
        let e = error_of(r#"{"name": {"x\u0000": 1}}"#).unwrap();
        assert!(e.contains("field name must not contain a NUL"), "{e}");
        let e = error_of(r#"{"k": "\\u0000 is text, not NUL", "s": "\"}"}"#);
        assert_eq!(e, None);
        let e = error_of(r#"[1, -99999999999999999999]"#).unwrap();
        assert!(e.starts_with("[1]: is an integer outside"), "{e}");
        assert!(error_of(r#""\u0000""#).unwrap().starts_with("invalid body"));
    }

    #[test]
    fn content_types_other_than_json_are_refused() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_str(value).unwrap());
            content_type(&headers).is_ok()
        };
        assert!(with("application/json"));
        assert!(with("Application/JSON; charset=UTF-8"));
        assert!(with("application/json;charset=\"utf-8\""));
        assert!(!with("application/json; charset=latin1"));
        assert!(!with("text/plain"));
        assert!(!with("application/jsonx"));
        assert!(!with("multipart/form-data; boundary=x"));
        assert_eq!(
            content_type(&HeaderMap::new()).unwrap(),
            ContentType::Missing
        );
    }

    #[test]
    fn urls_with_broken_percent_encoding_or_nul_are_refused() {
        let check = |text: &str| check_url(&text.parse::<Uri>().unwrap());
        assert!(check("/api/v1/brands/abc%20d?x=%C3%A9&y").is_ok());
        assert!(matches!(check("/a/%ZZ"), Err(ApiError::InvalidPath(_))));
        assert!(matches!(check("/a/%FF"), Err(ApiError::InvalidPath(_))));
        assert!(matches!(check("/a/%00"), Err(ApiError::InvalidPath(_))));
        assert!(matches!(check("/a/%4"), Err(ApiError::InvalidPath(_))));
        match check("/a?ok=1&status=%G1") {
            Err(ApiError::InvalidQueryParameter { parameter, .. }) => {
                assert_eq!(parameter, "status")
            }
            other => panic!("{other:?}"),
        }
        assert!(check("/a?cursor=%00").is_err());
    }

    #[test]
    fn the_bearer_scheme_ignores_case_and_names_the_caller() {
        let tokens = [
            NamedToken {
                name: "alice".into(),
                token: "a-token".into(),
            },
            NamedToken {
                name: "bob".into(),
                token: "b-token".into(),
            },
        ];
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
            caller_of(&tokens, &headers).map(|c| c.0)
        };
        assert_eq!(with("Bearer a-token").as_deref(), Some("alice"));
        assert_eq!(with("bearer b-token").as_deref(), Some("bob"));
        assert_eq!(with("BEARER  a-token").as_deref(), Some("alice"));
        assert_eq!(with("Basic a-token"), None);
        assert_eq!(with("Bearer c-token"), None);
        assert_eq!(with("Bearer "), None);
        assert_eq!(caller_of(&tokens, &HeaderMap::new()), None);
    }
}
