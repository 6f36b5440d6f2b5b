//! The API's error domain and its mapping to status codes and the
//! `{"error": {"code", "message"}}` body.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tracing::error;

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
    #[error("the request body is larger than {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("{what} {id} not found")]
    NotFound { what: &'static str, id: String },
    #[error("no route {0}")]
    NoRoute(String),
    #[error("{0}")]
    Conflict(String),
    #[error("missing or wrong bearer token")]
    Unauthorized,
    #[error(
        "the API is read-only: set API_TOKEN and send it as `Authorization: Bearer <token>` to make changes"
    )]
    ReadOnly,
    #[error("{0}")]
    Unavailable(String),
    #[error(transparent)]
    Store(StoreError),
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
        match self {
            ApiError::InvalidField { .. } => (StatusCode::BAD_REQUEST, "invalid_field"),
            ApiError::InvalidBody(_) => (StatusCode::BAD_REQUEST, "invalid_body"),
            ApiError::BodyTooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large"),
            ApiError::NotFound { .. } => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::NoRoute(_) => (StatusCode::NOT_FOUND, "no_route"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            ApiError::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::ReadOnly => (StatusCode::FORBIDDEN, "read_only"),
            ApiError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            ApiError::Store(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl From<StoreError> for ApiError {
    /// Constraint violations are the client's conflict (a template still in
    /// use, a parent that does not exist, a duplicate); the rest is ours.
    fn from(e: StoreError) -> ApiError {
        if e.is_foreign_key_violation() || e.is_unique_violation() {
            ApiError::Conflict(format!("the change conflicts with other rows: {e}"))
        } else if e.is_transient() {
            ApiError::Unavailable(format!("the database is unavailable: {e}"))
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

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let message = match &self {
            // Internal details go to the log, not to the client.
            ApiError::Store(e) => {
                error!("API request failed: {e}");
                "internal error; see the service log".to_string()
            }
            other => other.to_string(),
        };
        (
            status,
            Json(json!({ "error": { "code": code, "message": message } })),
        )
            .into_response()
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
