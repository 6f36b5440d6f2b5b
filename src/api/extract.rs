//! Request bodies, authentication and the body size limit.

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;
use tracing::info;

use super::ApiState;
use super::error::ApiError;

/// Bodies above this are refused; DESIGN.md's largest object (a branch rule
/// with its action details) fits many times over.
pub const BODY_LIMIT: usize = 64 * 1024;

/// A JSON body read with the size limit enforced while streaming, so a huge
/// body is refused after [`BODY_LIMIT`] bytes rather than buffered whole,
/// and parse errors become 400s that name the field.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, ApiError> {
        let too_large = ApiError::BodyTooLarge { limit: BODY_LIMIT };
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
        if bytes.is_empty() {
            return Err(ApiError::InvalidBody("a JSON object is required".into()));
        }
        let mut deserializer = serde_json::Deserializer::from_slice(&bytes);
        match serde_path_to_error::deserialize(&mut deserializer) {
            Ok(value) => Ok(ApiJson(value)),
            Err(e) => {
                let path = e.path().to_string();
                let inner = e.into_inner();
                if path == "." || path.is_empty() {
                    Err(ApiError::InvalidBody(inner.to_string()))
                } else {
                    Err(ApiError::field(path, inner.to_string()))
                }
            }
        }
    }
}

/// Mutations (anything but GET and HEAD) need `Authorization: Bearer
/// $API_TOKEN`; without API_TOKEN the API is read-only.
pub async fn require_token(
    State(state): State<ApiState>,
    req: Request<Body>,
    next: Next,
) -> Response {
    if matches!(*req.method(), Method::GET | Method::HEAD) {
        return next.run(req).await;
    }
    let Some(expected) = state.config().api_token.as_deref() else {
        return ApiError::ReadOnly.into_response();
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let response = if constant_time_eq(given.as_bytes(), expected.as_bytes()) {
        next.run(req).await
    } else {
        ApiError::Unauthorized.into_response()
    };
    // An audit trail of changes; bodies stay out of the log, since they
    // may carry secrets in action params.
    info!(%method, %path, status = response.status().as_u16(), "🔧 API change");
    response
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
    use super::constant_time_eq;

    #[test]
    fn tokens_compare_exactly() {
        assert!(constant_time_eq(b"s3cret", b"s3cret"));
        assert!(!constant_time_eq(b"s3cret", b"s3cres"));
        assert!(!constant_time_eq(b"s3cret", b"s3cre"));
        assert!(!constant_time_eq(b"", b"x"));
    }
}
