//! `GET /metrics`: the Prometheus text exposition of the installed recorder.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::ApiState;

pub async fn metrics(State(state): State<ApiState>) -> Response {
    match state.metrics_handle() {
        Some(handle) => {
            // Histograms are summarised lazily; upkeep before rendering keeps
            // a scrape from seeing stale buckets when no other task ran it.
            handle.run_upkeep();
            (
                [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                handle.render(),
            )
                .into_response()
        }
        // Library users and tests start the service without a recorder:
        // say so rather than serve an empty page that looks healthy.
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(serde_json::json!({ "error": {
                "code": "no_metrics_recorder",
                "message": "no metrics recorder is installed in this process",
            } })),
        )
            .into_response(),
    }
}
