//! The API's error domain and its mapping to status codes and the
//! `{"error": {"code", "message"}}` body, in the caller's language.
//!
//! Handlers return [`ApiError`]; [`envelope`] (the outermost layer) then
//! re-renders its message in the locale of `Accept-Language`, and wraps any
//! error the framework produced itself (a path or query rejection, a 405)
//! in the same envelope, so no client ever sees a plain-text error.

use axum::Json;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use serde_json::json;
use tracing::{error, info, warn};

use super::i18n::{Locale, Message, english};
use super::schema::ErrorCode;
use crate::actors::AskError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A field of the request is wrong; the message names it.
    #[error("{field}: {message}")]
    InvalidField { field: String, message: String },
    /// The body is not the JSON the route takes (syntax, unknown field, type).
    #[error("invalid body: {0}")]
    InvalidBody(String),
    /// The path cannot be read (its percent-encoding, a segment's type).
    #[error("invalid path: {0}")]
    InvalidPath(String),
    /// The query string as a whole cannot be read.
    #[error("invalid query string: {0}")]
    InvalidQuery(String),
    /// One query parameter is wrong or unknown.
    #[error("query parameter {parameter}: {message}")]
    InvalidQueryParameter { parameter: String, message: String },
    /// A client error the framework reported in its own words.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("the request body is larger than {limit} bytes")]
    BodyTooLarge { limit: usize },
    /// A body that is not `application/json`; holds what was sent.
    #[error("a request body must be JSON sent with Content-Type: application/json; got {0}")]
    UnsupportedMediaType(String),
    #[error("{what} {id} not found")]
    NotFound { what: &'static str, id: String },
    /// The row was archived (`DELETE …?cascade=archive`): it has left the
    /// catalog for good but its history is kept, so it is gone (410), not
    /// unknown (404). A client that created the row can tell that it was
    /// archived, by itself or with its brand or branch, from a lost id.
    #[error("{what} {id} is archived")]
    Archived { what: &'static str, id: String },
    #[error("no route {0}")]
    NoRoute(String),
    /// `allow` is the `Allow` header: the methods the path does take.
    #[error("{method} is not allowed on {path}; allowed: {allow}")]
    MethodNotAllowed {
        method: String,
        path: String,
        allow: String,
    },
    #[error("{0}")]
    Conflict(String),
    /// A unique constraint refused the write. The database's text (which
    /// names constraints and SQL) goes to the log only.
    #[error("the change conflicts with another row")]
    DuplicateRow(#[source] StoreError),
    /// A foreign key refused the write: a missing parent, or a row still
    /// referenced under `ON DELETE RESTRICT`.
    #[error("the change conflicts with other rows")]
    ReferencedRow(#[source] StoreError),
    #[error("missing or wrong bearer token")]
    Unauthorized,
    #[error(
        "the API is read-only: set API_TOKEN or API_TOKENS and send a token as `Authorization: Bearer <token>` to make changes"
    )]
    ReadOnly,
    #[error("{0}")]
    Unavailable(String),
    #[error("the database is unavailable")]
    DatabaseUnavailable(#[source] StoreError),
    #[error(transparent)]
    Store(StoreError),
    /// A failure of ours that is not the database's (a computation that
    /// panicked, a bug); the log has the text, the client a 500.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    pub fn field(field: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError::InvalidField {
            field: field.into(),
            message: message.into(),
        }
    }

    pub fn not_found(what: &'static str, id: impl ToString) -> ApiError {
        ApiError::NotFound {
            what,
            id: id.to_string(),
        }
    }

    fn status_and_code(&self) -> (StatusCode, &'static str) {
        let (status, code) = self.status_and_error_code();
        (status, code.as_str())
    }

    /// The status and the stable `code` ([`ErrorCode`], one of the
    /// document's enum) of this error.
    fn status_and_error_code(&self) -> (StatusCode, ErrorCode) {
        match self {
            ApiError::InvalidField { .. } => (StatusCode::BAD_REQUEST, ErrorCode::InvalidField),
            ApiError::InvalidBody(_) => (StatusCode::BAD_REQUEST, ErrorCode::InvalidBody),
            ApiError::InvalidPath(_) => (StatusCode::BAD_REQUEST, ErrorCode::InvalidPath),
            ApiError::InvalidQuery(_) | ApiError::InvalidQueryParameter { .. } => {
                (StatusCode::BAD_REQUEST, ErrorCode::InvalidQuery)
            }
            ApiError::InvalidRequest(_) => (StatusCode::BAD_REQUEST, ErrorCode::InvalidRequest),
            ApiError::BodyTooLarge { .. } => {
                (StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::BodyTooLarge)
            }
            ApiError::UnsupportedMediaType(_) => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ErrorCode::UnsupportedMediaType,
            ),
            ApiError::NotFound { .. } => (StatusCode::NOT_FOUND, ErrorCode::NotFound),
            ApiError::Archived { .. } => (StatusCode::GONE, ErrorCode::Archived),
            ApiError::NoRoute(_) => (StatusCode::NOT_FOUND, ErrorCode::NoRoute),
            ApiError::MethodNotAllowed { .. } => {
                (StatusCode::METHOD_NOT_ALLOWED, ErrorCode::MethodNotAllowed)
            }
            ApiError::Conflict(_) | ApiError::DuplicateRow(_) | ApiError::ReferencedRow(_) => {
                (StatusCode::CONFLICT, ErrorCode::Conflict)
            }
            ApiError::Unauthorized => (StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized),
            ApiError::ReadOnly => (StatusCode::FORBIDDEN, ErrorCode::ReadOnly),
            ApiError::Unavailable(_) | ApiError::DatabaseUnavailable(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unavailable)
            }
            ApiError::Store(_) | ApiError::Internal(_) => {
                (StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal)
            }
        }
    }

    /// The message as a catalogue entry (`locale/*.toml`) and its values.
    fn message(&self) -> Message {
        match self {
            ApiError::InvalidField { field, message } => Message::new("invalid_field")
                .arg("field", field)
                .arg("detail", message),
            ApiError::InvalidBody(detail) => Message::new("invalid_body").arg("detail", detail),
            ApiError::InvalidPath(detail) => Message::new("invalid_path").arg("detail", detail),
            ApiError::InvalidQuery(detail) => Message::new("invalid_query").arg("detail", detail),
            ApiError::InvalidQueryParameter { parameter, message } => {
                Message::new("invalid_query_parameter")
                    .arg("parameter", parameter)
                    .arg("detail", message)
            }
            ApiError::InvalidRequest(detail) => {
                Message::new("invalid_request").arg("detail", detail)
            }
            ApiError::BodyTooLarge { limit } => {
                Message::new("body_too_large").arg("limit", limit.to_string())
            }
            ApiError::UnsupportedMediaType(given) => {
                Message::new("unsupported_media_type").arg("content_type", given)
            }
            ApiError::NotFound { what, id } => {
                Message::new("not_found").arg("what", *what).arg("id", id)
            }
            ApiError::Archived { what, id } => {
                Message::new("archived").arg("what", *what).arg("id", id)
            }
            ApiError::NoRoute(route) => Message::new("no_route").arg("route", route),
            ApiError::MethodNotAllowed {
                method,
                path,
                allow,
            } => Message::new("method_not_allowed")
                .arg("method", method)
                .arg("path", path)
                .arg("allow", allow),
            ApiError::Conflict(detail) => Message::new("conflict").arg("detail", detail),
            ApiError::DuplicateRow(_) => Message::new("conflict_duplicate"),
            ApiError::ReferencedRow(_) => Message::new("conflict_reference"),
            ApiError::Unauthorized => Message::new("unauthorized"),
            ApiError::ReadOnly => Message::new("read_only"),
            ApiError::Unavailable(detail) => Message::new("unavailable").arg("detail", detail),
            ApiError::DatabaseUnavailable(_) => Message::new("database_unavailable"),
            ApiError::Store(_) | ApiError::Internal(_) => Message::new("internal"),
        }
    }
}

impl From<StoreError> for ApiError {
    /// Constraint violations are the client's conflict (a template still in
    /// use, a parent that does not exist, a duplicate); the rest is ours.
    fn from(e: StoreError) -> ApiError {
        if e.is_unique_violation() {
            ApiError::DuplicateRow(e)
        } else if e.is_foreign_key_violation() {
            ApiError::ReferencedRow(e)
        } else if e.is_transient() {
            ApiError::DatabaseUnavailable(e)
        } else {
            ApiError::Store(e)
        }
    }
}

impl From<AskError> for ApiError {
    fn from(e: AskError) -> ApiError {
        ApiError::Unavailable(format!("the engine did not answer: {e}"))
    }
}

/// Rides on an error response from [`ApiError::into_response`] to
/// [`envelope`], which knows the caller's locale.
#[derive(Debug, Clone)]
struct Localizable {
    code: &'static str,
    message: Message,
}

fn body(code: &str, message: &str) -> Json<serde_json::Value> {
    Json(json!({ "error": { "code": code, "message": message } }))
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        // Database text names constraints, tables and SQL: the operator
        // gets it in the log, the client a message of ours.
        match &self {
            ApiError::Store(e) => error!("API request failed: {e}"),
            ApiError::Internal(e) => error!("API request failed: {e}"),
            ApiError::DuplicateRow(e) | ApiError::ReferencedRow(e) => {
                info!("API change refused by a constraint: {e}")
            }
            ApiError::DatabaseUnavailable(e) => {
                warn!("API request failed, database unavailable: {e}")
            }
            _ => {}
        }
        let message = self.message();
        let text = message
            .render(Locale::En)
            .unwrap_or_else(|| self.to_string());
        let mut response = (status, body(code, &text)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            // RFC 9110 §11.6.1: a 401 names the scheme that would do.
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer realm=\"ruled\""),
            );
        }
        response
            .extensions_mut()
            .insert(Localizable { code, message });
        response
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// Error bodies of the framework's own above this are cut, not buffered.
const FOREIGN_ERROR_LIMIT: usize = 4096;

/// The outermost layer: every error leaves in the envelope and in the
/// caller's language (`Accept-Language`), whoever produced it.
pub async fn envelope(req: Request, next: Next) -> Response {
    let locale = Locale::negotiate(req.headers());
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let response = match super::extract::check_url(req.uri()) {
        Err(e) => e.into_response(),
        Ok(()) => next.run(req).await,
    };
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let (mut parts, original) = response.into_parts();
    let (code, message) = match parts.extensions.remove::<Localizable>() {
        // Already rendered in English by `into_response`.
        Some(_) if locale == Locale::En => return Response::from_parts(parts, original),
        Some(Localizable { code, message }) => (code, message),
        // A JSON body of our own (`/readyz`'s checks, an envelope built by
        // hand) says more than a re-rendered message would.
        None if is_json(&parts.headers) => return Response::from_parts(parts, original),
        None => {
            let text = match original.collect().await {
                Ok(collected) => {
                    let bytes = collected.to_bytes();
                    String::from_utf8_lossy(&bytes[..bytes.len().min(FOREIGN_ERROR_LIMIT)])
                        .into_owned()
                }
                Err(_) => String::new(),
            };
            let allow = parts
                .headers
                .get(header::ALLOW)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let error = foreign_error(status, text.trim(), &method, &path, allow);
            (error.status_and_code().1, error.message())
        }
    };
    let text = message
        .render(locale)
        .or_else(|| message.render(Locale::En))
        .unwrap_or_default();
    let mut localized = (status, body(code, &text)).into_response();
    // Keep what the original said besides its body (`Allow` on a 405,
    // `WWW-Authenticate`), but not its length or type.
    for (name, value) in parts.headers.iter() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            localized.headers_mut().insert(name.clone(), value.clone());
        }
    }
    localized.headers_mut().insert(
        header::CONTENT_LANGUAGE,
        HeaderValue::from_static(locale.tag()),
    );
    localized
        .headers_mut()
        .append(header::VARY, HeaderValue::from_static("accept-language"));
    localized
}

fn is_json(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"))
}

/// An error response that did not come from an [`ApiError`] (an axum
/// extractor's rejection, a method router's 405) as one.
fn foreign_error(
    status: StatusCode,
    text: &str,
    method: &str,
    path: &str,
    allow: String,
) -> ApiError {
    const QUERY: &str = "Failed to deserialize query string: ";
    match status {
        StatusCode::METHOD_NOT_ALLOWED => ApiError::MethodNotAllowed {
            method: method.to_string(),
            path: path.to_string(),
            allow,
        },
        StatusCode::NOT_FOUND => ApiError::NoRoute(format!("{method} {path}")),
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::BodyTooLarge {
            limit: super::extract::BODY_LIMIT,
        },
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::UnsupportedMediaType(text.to_string()),
        s if s.is_client_error() => {
            if let Some(detail) = text.strip_prefix(QUERY) {
                match unknown_field(detail) {
                    Some(parameter) => ApiError::InvalidQueryParameter {
                        parameter,
                        message: english("detail.unknown_parameter"),
                    },
                    None => ApiError::InvalidQuery(detail.to_string()),
                }
            } else if let Some(detail) = text.strip_prefix("Invalid URL: ") {
                ApiError::InvalidPath(detail.to_string())
            } else {
                ApiError::InvalidRequest(text.to_string())
            }
        }
        // A 5xx of the framework's (a timeout layer, say) is worth a retry;
        // what a handler means as internal is an `ApiError::Store` and
        // never gets here.
        _ => ApiError::Unavailable(if text.is_empty() {
            status.canonical_reason().unwrap_or("error").to_string()
        } else {
            text.to_string()
        }),
    }
}

/// The name in serde's "unknown field `name`, expected …".
fn unknown_field(detail: &str) -> Option<String> {
    let rest = detail.strip_prefix("unknown field `")?;
    Some(rest.split_once('`')?.0.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framework_rejections_get_codes_and_name_the_parameter() {
        let e = foreign_error(
            StatusCode::BAD_REQUEST,
            "Failed to deserialize query string: unknown field `bogus`, expected `cascade`",
            "DELETE",
            "/brands/x",
            String::new(),
        );
        assert_eq!(e.status_and_code().1, "invalid_query");
        assert!(e.to_string().contains("bogus"), "{e}");
        let e = foreign_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "",
            "PATCH",
            "/api/v1/brands",
            "GET,HEAD,POST".into(),
        );
        assert_eq!(
            e.status_and_code(),
            (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed")
        );
        assert!(e.to_string().contains("GET,HEAD,POST"));
        let e = foreign_error(
            StatusCode::BAD_REQUEST,
            "Invalid URL: Cannot parse `x` to a `u32`",
            "GET",
            "/x",
            String::new(),
        );
        assert_eq!(e.status_and_code().1, "invalid_path");
    }

    #[test]
    fn every_message_key_is_in_the_catalogue() {
        let errors = [
            ApiError::field("f", "m"),
            ApiError::InvalidBody("x".into()),
            ApiError::InvalidPath("x".into()),
            ApiError::InvalidQuery("x".into()),
            ApiError::InvalidQueryParameter {
                parameter: "p".into(),
                message: "m".into(),
            },
            ApiError::InvalidRequest("x".into()),
            ApiError::BodyTooLarge { limit: 1 },
            ApiError::UnsupportedMediaType("text/plain".into()),
            ApiError::not_found("brand", "x"),
            ApiError::Archived {
                what: "brand",
                id: "x".into(),
            },
            ApiError::NoRoute("x".into()),
            ApiError::MethodNotAllowed {
                method: "PUT".into(),
                path: "/".into(),
                allow: "GET".into(),
            },
            ApiError::Conflict("x".into()),
            ApiError::Unauthorized,
            ApiError::ReadOnly,
            ApiError::Unavailable("x".into()),
            ApiError::Internal("x".into()),
        ];
        for error in errors {
            for locale in Locale::ALL {
                let text = error.message().render(locale);
                assert!(text.is_some(), "{error:?} has no {} message", locale.tag());
                assert!(!text.unwrap().contains('{'), "{error:?} left a placeholder");
            }
        }
    }

    #[test]
    fn english_messages_match_display() {
        for error in [
            ApiError::field("name", "is required"),
            ApiError::not_found("branch rule", "x"),
            ApiError::Unauthorized,
            ApiError::ReadOnly,
            ApiError::BodyTooLarge { limit: 10 },
        ] {
            assert_eq!(
                error.message().render(Locale::En).unwrap(),
                error.to_string()
            );
        }
    }
}
