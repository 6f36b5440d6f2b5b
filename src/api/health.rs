//! `/healthz` (the process answers) and `/readyz` (it can do its job).

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::ApiState;
use crate::actors::ask_within;
use crate::messages::{PlanMsg, SupervisorMsg};

/// A readiness probe must answer well within a kubelet's timeout even when
/// an actor is wedged.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Warnings never fail the probe, so they must not hold it up either.
const WARNINGS_TIMEOUT: Duration = Duration::from_millis(500);

/// Quarantined plan rows, one warning each: the service runs everything
/// else, so it stays ready, but an operator has rows to fix.
async fn quarantine_warnings(state: &ApiState) -> Vec<String> {
    let Some(plan) = state.directory().plan() else {
        return Vec::new();
    };
    match ask_within(&plan, WARNINGS_TIMEOUT, PlanMsg::Quarantine).await {
        Ok(report) => report
            .rows
            .iter()
            .map(|row| {
                format!(
                    "quarantined {} row {}: {}: {} ({})",
                    row.table,
                    row.id,
                    row.field,
                    row.message,
                    row.reason.as_str()
                )
            })
            .collect(),
        Err(e) => vec![format!("quarantine: the plan did not answer: {e}")],
    }
}

pub async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// Ready when the database answers, the plan has been loaded from it at
/// least once, and every supervised actor is alive. Each failed check is
/// named so an operator sees why without reading logs.
pub async fn readyz(State(state): State<ApiState>) -> Response {
    let mut problems: Vec<String> = Vec::new();

    let database = match tokio::time::timeout(PROBE_TIMEOUT, state.store().ping()).await {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            problems.push(format!("database: {e}"));
            false
        }
        Err(_) => {
            problems.push(format!("database: no answer within {PROBE_TIMEOUT:?}"));
            false
        }
    };

    // Published by the refresher after each refresh: a refresher busy with
    // a long refresh (or a mailbox of nudges) never makes this probe wait.
    let plan_loaded = state
        .directory()
        .refresher_stats()
        .last_success_at
        .is_some();
    if !plan_loaded {
        problems.push("plan: not yet loaded from the database".into());
    }

    let actors = match state.directory().supervisor() {
        Some(supervisor) => {
            match ask_within(&supervisor, PROBE_TIMEOUT, SupervisorMsg::Stats).await {
                Ok(stats) => {
                    let dead: Vec<&String> = stats
                        .alive
                        .iter()
                        .filter(|(_, alive)| !**alive)
                        .map(|(name, _)| name)
                        .collect();
                    if !dead.is_empty() {
                        problems.push(format!("actors not alive: {dead:?}"));
                    }
                    dead.is_empty() && !stats.alive.is_empty()
                }
                Err(e) => {
                    problems.push(format!("actors: the supervisor did not answer: {e}"));
                    false
                }
            }
        }
        None => {
            problems.push("actors: the supervisor is not running".into());
            false
        }
    };

    let ready = database && plan_loaded && actors;
    let body = json!({
        "status": if ready { "ready" } else { "not_ready" },
        "checks": { "database": database, "plan_loaded": plan_loaded, "actors_alive": actors },
        "problems": problems,
        "warnings": quarantine_warnings(&state).await,
    });
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}
