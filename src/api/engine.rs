//! Routes that act through the engine's actors: run now, force stop,
//! cancel, the plan and the statistics.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::ApiState;
use super::catalog::{nudge, present_branch_rule, schedule_of_row};
use super::error::{ApiError, ApiResult};
use super::extract::ApiJson;
use super::present::{parse_time, present_execution as present_execution_for, rfc3339};
use crate::actors::ask;
use crate::messages::master::CancelOutcome;
use crate::messages::{MasterMsg, PlanMsg, WriterMsg};
use crate::model::ExecutionStatus;
use crate::plan::ResolveError;
use crate::schedule::{Window, preview};
use crate::store::ExecutionFilter;
use crate::store::rows::BRANCH_RULES;

/// 503 for an actor caught between a failure and its restart.
fn restarting(actor: &str) -> ApiError {
    ApiError::Unavailable(format!("the {actor} is restarting; try again"))
}

fn parse_id(what: &'static str, text: &str) -> ApiResult<Uuid> {
    Uuid::parse_str(text).map_err(|_| ApiError::not_found(what, text))
}

async fn branch_rule(s: &ApiState, id: &str) -> ApiResult<(Uuid, Map<String, Value>)> {
    let uuid = parse_id("branch rule", id)?;
    let row = s
        .store()
        .row(&BRANCH_RULES, uuid)
        .await?
        .ok_or_else(|| ApiError::not_found("branch rule", id))?;
    Ok((uuid, row))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusInput {
    is_active: bool,
}

pub async fn set_status(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    ApiJson(input): ApiJson<StatusInput>,
) -> ApiResult<Json<Value>> {
    let (uuid, _) = branch_rule(&s, &id).await?;
    let mut changes = Map::new();
    changes.insert("is_active".into(), Value::Bool(input.is_active));
    changes.insert("updated_at".into(), s.clock().now_ms().into());
    s.store().update_row(&BRANCH_RULES, uuid, &changes).await?;
    nudge(&s);
    let (_, row) = branch_rule(&s, &id).await?;
    Ok(Json(present_branch_rule(&s, row).await?))
}

/// Run now: the rule becomes due at once and goes through the same claim,
/// queue and worker as a scheduled run, so every rule of the engine (one
/// run at a time, dedup, window, throttling) still holds.
pub async fn run_now(
    State(s): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let (uuid, _) = branch_rule(&s, &id).await?;
    let now = s.clock().now_ms();
    let mut changes = Map::new();
    changes.insert("next_run_time".into(), now.into());
    changes.insert("updated_at".into(), now.into());
    s.store().update_row(&BRANCH_RULES, uuid, &changes).await?;
    nudge(&s);
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "id": uuid, "next_run_time": rfc3339(now) })),
    ))
}

/// Sets the force stop (in the database) and cancels the rule's run: here
/// at once when this instance runs it, else by the instance that does, at
/// its next lease renewal (202, naming it).
pub async fn force_stop(
    State(s): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let (uuid, _) = branch_rule(&s, &id).await?;
    let master = s.directory().master().ok_or_else(|| restarting("master"))?;
    let outcome = ask(&master, |reply| MasterMsg::ForceStop {
        branch_rule_id: uuid,
        reply,
    })
    .await?
    .map_err(ApiError::Unavailable)?;
    nudge(&s);
    let elsewhere = match outcome.cancel {
        CancelOutcome::NotInFlight => s
            .store()
            .open_execution_of(uuid)
            .await?
            .filter(|e| e.owner != s.config().instance_id),
        _ => None,
    };
    Ok(match elsewhere {
        Some(execution) => (
            StatusCode::ACCEPTED,
            Json(json!({
                "id": uuid,
                "is_force_stopped": outcome.flag_set,
                "cancel": "requested",
                "execution_id": execution.id,
                "owner": execution.owner,
            })),
        ),
        None => (
            StatusCode::OK,
            Json(json!({
                "id": uuid,
                "is_force_stopped": outcome.flag_set,
                "cancel": outcome.cancel,
            })),
        ),
    })
}

/// The branch rules ready to run now, as the plan sees them.
pub async fn due(State(s): State<ApiState>) -> ApiResult<Json<Value>> {
    let plan = s.directory().plan().ok_or_else(|| restarting("plan"))?;
    let ids = ask(&plan, PlanMsg::Ready).await?;
    let mut out = Vec::new();
    for id in ids {
        if let Some(row) = s.store().row(&BRANCH_RULES, id).await? {
            out.push(present_branch_rule(&s, row).await?);
        }
    }
    Ok(Json(Value::Array(out)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreviewQuery {
    count: Option<usize>,
    from: Option<String>,
}

const PREVIEW_MAX: usize = 1000;

/// The next runs as the service would make them: the cron expression in
/// the branch's zone, each occurrence outside the window deferred to its
/// opening, DST handled by the schedule module.
pub async fn preview_runs(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    Query(query): Query<PreviewQuery>,
) -> ApiResult<Json<Value>> {
    let (_, row) = branch_rule(&s, &id).await?;
    let count = query.count.unwrap_or(10);
    if count == 0 || count > PREVIEW_MAX {
        return Err(ApiError::field(
            "count",
            format!("must be 1 to {PREVIEW_MAX}"),
        ));
    }
    let from = match &query.from {
        Some(text) => parse_time("from", text)?,
        None => s.clock().now_ms(),
    };
    // The one resolver the plan and the worker use: a stored zone or
    // expression that is invalid is a 409 naming the row.
    let (schedule, zone) = match schedule_of_row(&s, &row).await? {
        Ok(resolved) => resolved,
        Err(ResolveError::Missing { .. }) => {
            return Err(ApiError::Conflict("the branch rule has no rule".into()));
        }
        Err(e) => return Err(ApiError::Conflict(e.to_string())),
    };
    let bound = |key: &str| -> ApiResult<_> {
        row.get(key)
            .and_then(Value::as_str)
            .map(|t| {
                t.parse()
                    .map_err(|_| ApiError::Conflict(format!("stored {key} {t:?} is not HH:MM")))
            })
            .transpose()
    };
    let window = Window::from_bounds(bound("operation_time_from")?, bound("operation_time_to")?);
    let from = chrono::DateTime::from_timestamp_millis(from)
        .ok_or_else(|| ApiError::field("from", "out of range"))?;
    let runs = preview(&schedule, zone, window, from, count)
        .map_err(|e| ApiError::Conflict(e.to_string()))?;
    Ok(Json(json!({
        "cron_expression": schedule.expression(),
        "timezone": zone.name(),
        "operation_time_from": row.get("operation_time_from"),
        "operation_time_to": row.get("operation_time_to"),
        "runs": runs.iter().map(|t| json!({
            "utc": t.to_rfc3339(),
            "local": t.with_timezone(&zone).to_rfc3339(),
        })).collect::<Vec<_>>(),
    })))
}

// ---- executions ------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutionQuery {
    branch_rule_id: Option<String>,
    status: Option<String>,
    from: Option<String>,
    to: Option<String>,
    limit: Option<i64>,
    cursor: Option<String>,
}

fn encode_cursor((at, id): (i64, Uuid)) -> String {
    format!("{at}_{id}")
}

fn decode_cursor(text: &str) -> ApiResult<(i64, Uuid)> {
    let bad = || ApiError::field("cursor", "is not a cursor this API returned");
    let (at, id) = text.split_once('_').ok_or_else(bad)?;
    Ok((
        at.parse().map_err(|_| bad())?,
        Uuid::parse_str(id).map_err(|_| bad())?,
    ))
}

/// Outputs hold response captures and program output, which can echo
/// credentials: only token holders read them.
fn present_execution(execution: &crate::model::Execution, with_token: bool) -> Value {
    match serde_json::to_value(execution) {
        Ok(Value::Object(map)) => present_execution_for(map, with_token),
        _ => Value::Null,
    }
}

pub async fn list_executions(
    State(s): State<ApiState>,
    headers: HeaderMap,
    Query(q): Query<ExecutionQuery>,
) -> ApiResult<Json<Value>> {
    let with_token = super::extract::caller_of(&s.config().tokens(), &headers).is_some();
    let branch_rule_id = q
        .branch_rule_id
        .as_deref()
        .map(|t| {
            Uuid::parse_str(t)
                .map_err(|_| ApiError::field("branch_rule_id", format!("{t:?} is not a UUID")))
        })
        .transpose()?;
    let status = q
        .status
        .as_deref()
        .map(|t| {
            ExecutionStatus::parse(t)
                .ok_or_else(|| ApiError::field("status", format!("unknown status {t:?}")))
        })
        .transpose()?;
    // The same page sizes as every catalog listing.
    let limit = super::catalog::page_limit(q.limit)?;
    let filter = ExecutionFilter {
        branch_rule_id,
        status,
        from: q
            .from
            .as_deref()
            .map(|t| parse_time("from", t))
            .transpose()?,
        to: q.to.as_deref().map(|t| parse_time("to", t)).transpose()?,
        limit,
        after: q.cursor.as_deref().map(decode_cursor).transpose()?,
    };
    let page = s.store().list_executions(&filter).await?;
    Ok(Json(json!({
        "items": page.iter().map(|e| present_execution(e, with_token)).collect::<Vec<_>>(),
        "next_cursor": filter.next_cursor(&page).map(encode_cursor),
    })))
}

pub async fn get_execution(
    State(s): State<ApiState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let with_token = super::extract::caller_of(&s.config().tokens(), &headers).is_some();
    let uuid = parse_id("execution", &id)?;
    let execution = s
        .store()
        .execution(uuid)
        .await?
        .ok_or_else(|| ApiError::not_found("execution", &id))?;
    Ok(Json(present_execution(&execution, with_token)))
}

/// Cancels through the master: before the handoff it records Cancelled
/// itself; after it, the worker that owns the job does (seed 002).
pub async fn cancel_execution(
    State(s): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let uuid = parse_id("execution", &id)?;
    let execution = s
        .store()
        .execution(uuid)
        .await?
        .ok_or_else(|| ApiError::not_found("execution", &id))?;
    if execution.status.is_terminal() {
        return Err(ApiError::Conflict(format!(
            "execution {id} already ended: {}",
            execution.status.as_str()
        )));
    }
    let master = s.directory().master().ok_or_else(|| restarting("master"))?;
    let outcome = ask(&master, |reply| MasterMsg::Cancel {
        execution_id: uuid,
        reply,
    })
    .await?;
    if outcome != CancelOutcome::NotInFlight {
        return Ok((
            StatusCode::ACCEPTED,
            Json(json!({ "id": uuid, "outcome": outcome, "owner": s.config().instance_id })),
        ));
    }
    // Another instance runs it (or is about to): the request is recorded
    // and its owner acts on it at its next lease renewal.
    match s.store().request_cancel(uuid).await? {
        Some(owner) => Ok((
            StatusCode::ACCEPTED,
            Json(json!({ "id": uuid, "outcome": "cancel_requested", "owner": owner })),
        )),
        None => Err(ApiError::Conflict(format!("execution {id} already ended"))),
    }
}

/// The instances sharing the database: heartbeat, liveness (on the
/// database's clock), static partition and the partition leases held.
pub async fn instances(State(s): State<ApiState>) -> ApiResult<Json<Value>> {
    let store = s.store();
    let ttl_ms = s.config().partition_lease_ttl.as_millis() as i64;
    let view = store.partition_leases().await?;
    let rows = store.instances().await?;
    let out: Vec<Value> = rows
        .into_iter()
        .map(|row| {
            let held: Vec<u32> = view
                .leases
                .iter()
                .filter(|lease| lease.live_holder(view.db_now) == Some(row.id.as_str()))
                .map(|lease| lease.partition)
                .collect();
            json!({
                "id": row.id,
                "hostname": row.hostname,
                "pid": row.pid,
                "started_at": rfc3339(row.started_at),
                "heartbeat_at": rfc3339(row.heartbeat_at),
                "live": view.db_now - row.heartbeat_at <= ttl_ms,
                "partition": row.partition,
                "partitions_held": held,
                "this_instance": row.id == s.config().instance_id,
            })
        })
        .collect();
    Ok(Json(json!({
        "partition_count": s.config().partition_count,
        "instances": out,
    })))
}

// ---- plan and statistics ---------------------------------------------------

pub async fn plan(State(s): State<ApiState>) -> ApiResult<Json<Value>> {
    let actor = s.directory().plan().ok_or_else(|| restarting("plan"))?;
    let snapshot = ask(&actor, PlanMsg::Snapshot).await?;
    let quarantine = ask(&actor, PlanMsg::Quarantine).await?;
    let config = s.config();
    let owners = s
        .store()
        .partition_owners(config.partition_count, &config.instance_id)
        .await?;
    let held: std::collections::HashMap<Uuid, &str> = quarantine
        .held
        .iter()
        .map(|h| (h.id, h.reason.as_str()))
        .collect();
    let mut value = serde_json::to_value(&snapshot).unwrap_or(Value::Null);
    if let Some(workflows) = value.get_mut("workflows").and_then(Value::as_array_mut) {
        for workflow in workflows {
            let id = workflow
                .pointer("/branch_rule/id")
                .and_then(Value::as_str)
                .and_then(|id| Uuid::parse_str(id).ok());
            if let (Some(id), Some(object)) = (id, workflow.as_object_mut()) {
                let (partition, owner) = owners.of(&id);
                object.insert("partition".into(), json!(partition));
                object.insert("partition_owner".into(), json!(owner));
                // Why an operator must act before it runs again, if so.
                object.insert("held".into(), json!(held.get(&id)));
            }
        }
    }
    if let Some(object) = value.as_object_mut() {
        object.insert("quarantined".into(), json!(quarantine.rows));
    }
    // Action params live in the snapshot too.
    value = super::present::redact(&value);
    times_as_rfc3339(&mut value);
    Ok(Json(value))
}

/// Epoch-millisecond times in the plan snapshot, at any depth, as RFC 3339
/// strings like every other endpoint's: a key ending in `_at` or `_time`, or
/// `scheduled_for`.
fn times_as_rfc3339(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                let is_time =
                    key.ends_with("_at") || key.ends_with("_time") || key == "scheduled_for";
                match value.as_i64() {
                    Some(ms) if is_time => *value = rfc3339(ms),
                    _ => times_as_rfc3339(value),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(times_as_rfc3339),
        _ => {}
    }
}

pub async fn plan_ready(State(s): State<ApiState>) -> ApiResult<Json<Value>> {
    let actor = s.directory().plan().ok_or_else(|| restarting("plan"))?;
    let ids = ask(&actor, PlanMsg::Ready).await?;
    Ok(Json(json!({ "ready": ids })))
}

/// Seed 004's queue statistics, seed 000's writer status, the plan's size.
pub async fn stats(State(s): State<ApiState>) -> ApiResult<Json<Value>> {
    let master = s.directory().master().ok_or_else(|| restarting("master"))?;
    let writer = s.directory().writer().ok_or_else(|| restarting("writer"))?;
    let plan = s.directory().plan().ok_or_else(|| restarting("plan"))?;
    let queue = ask(&master, MasterMsg::Stats).await?;
    let writer = ask(&writer, WriterMsg::Stats).await?;
    let plan = ask(&plan, PlanMsg::Stats).await?;
    Ok(Json(
        json!({ "queue": queue, "writer": writer, "plan": plan }),
    ))
}
