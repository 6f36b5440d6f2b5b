//! Routes that act through the engine's actors: run now, force stop,
//! cancel, the plan and the statistics.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::ApiState;
use super::catalog::{
    get_row, mask_every_value, nudge, policies_of, present_branch_rule, present_branch_rules,
    schedule_of_row,
};
use super::error::{ApiError, ApiResult};
use super::extract::ApiJson;
use super::present::rfc3339;
use super::schema::{RequestTime, Timestamp};
use super::simulation::{merged_policy, policy_preview};
use super::views::{
    BranchRule, CancelAccepted, Execution, ExecutionPage, ForceStopped, Instance, Instances,
    MemoryView, PlanReady, PlanView, Preview, PreviewRun, RecentError, RunAccepted, RunCancel,
    Stats,
};
use crate::actions::secrets;
use crate::actors::ask;
use crate::cluster::{PartitionOwners, partition_of};
use crate::messages::master::CancelOutcome;
use crate::messages::memory_guard::MemoryStatus;
use crate::messages::{MasterMsg, MemoryGuardMsg, PlanMsg, WriterMsg};
use crate::model::ExecutionStatus;
use crate::plan::{BrowseKey, BrowsePage, BrowseQuery, ResolveError, RuleState};
use crate::schedule::{EffectivePolicy, Window};
use crate::store::ExecutionFilter;
use crate::store::rows::BRANCH_RULES;

/// 503 for an actor caught between a failure and its restart.
pub(super) fn restarting(actor: &str) -> ApiError {
    ApiError::Unavailable(format!("the {actor} is restarting; try again"))
}

fn parse_id(what: &'static str, text: &str) -> ApiResult<Uuid> {
    Uuid::parse_str(text).map_err(|_| ApiError::not_found(what, text))
}

async fn branch_rule(s: &ApiState, id: &str) -> ApiResult<(Uuid, Map<String, Value>)> {
    let uuid = parse_id("branch rule", id)?;
    Ok((uuid, get_row(s, &BRANCH_RULES, "branch rule", id).await?))
}

/// Activates or deactivates a branch rule: `{"is_active": false}`, or in
/// the words of seed 001's schedules, `{"status": "inactive"}`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum StatusInput {
    Flag(ActiveFlag),
    Word(ActiveWord),
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ActiveFlag {
    is_active: bool,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ActiveWord {
    status: Activity,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Activity {
    Active,
    Inactive,
}

impl StatusInput {
    fn is_active(&self) -> bool {
        match self {
            StatusInput::Flag(flag) => flag.is_active,
            StatusInput::Word(word) => matches!(word.status, Activity::Active),
        }
    }
}

/// By hand rather than `untagged`, whose one message for every mistake
/// ("did not match any variant") names no field.
impl<'de> Deserialize<'de> for StatusInput {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut fields = Map::<String, Value>::deserialize(deserializer)?;
        let (is_active, status) = (fields.remove("is_active"), fields.remove("status"));
        if let Some(unknown) = fields.keys().next() {
            return Err(D::Error::custom(format!(
                "unknown field `{unknown}`, expected `is_active` or `status`"
            )));
        }
        match (is_active, status) {
            (Some(Value::Bool(is_active)), None) => Ok(StatusInput::Flag(ActiveFlag { is_active })),
            (Some(_), None) => Err(D::Error::custom("`is_active` must be true or false")),
            (None, Some(Value::String(word))) if word == "active" => {
                Ok(StatusInput::Word(ActiveWord {
                    status: Activity::Active,
                }))
            }
            (None, Some(Value::String(word))) if word == "inactive" => {
                Ok(StatusInput::Word(ActiveWord {
                    status: Activity::Inactive,
                }))
            }
            (None, Some(_)) => Err(D::Error::custom(
                "`status` must be \"active\" or \"inactive\"",
            )),
            (Some(_), Some(_)) => Err(D::Error::custom("give `is_active` or `status`, not both")),
            // Worded as serde words it, so the error names the field.
            (None, None) => Err(D::Error::missing_field("is_active")),
        }
    }
}

#[utoipa::path(put, path = "/branch-rules/{id}/status", tag = "branch rules",
    request_body = StatusInput,
    params(("id" = Uuid, Path, description = "Branch rule id")),
    responses((status = 200, description = "The branch rule as changed", body = BranchRule)),
    security(("bearer" = [])))]
pub async fn set_status(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    ApiJson(input): ApiJson<StatusInput>,
) -> ApiResult<Json<BranchRule>> {
    let (uuid, _) = branch_rule(&s, &id).await?;
    let mut changes = Map::new();
    changes.insert("is_active".into(), Value::Bool(input.is_active()));
    changes.insert("updated_at".into(), s.clock().now_ms().into());
    s.store().update_row(&BRANCH_RULES, uuid, &changes).await?;
    nudge(&s);
    let (_, row) = branch_rule(&s, &id).await?;
    Ok(Json(present_branch_rule(&s, row).await?))
}

/// Run now: the rule becomes due at once and goes through the same claim,
/// queue and worker as a scheduled run, so every rule of the engine (one
/// run at a time, dedup, window, throttling) still holds. A rule switched
/// off or force-stopped would never run: a 409 says which flag to change,
/// rather than a 202 for a run that cannot come.
#[utoipa::path(post, path = "/branch-rules/{id}/run", tag = "branch rules",
    params(("id" = Uuid, Path, description = "Branch rule id")),
    responses((status = 202, description = "Due now; it runs through the usual claim and window", body = RunAccepted)),
    security(("bearer" = [])))]
pub async fn run_now(
    State(s): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, Json<RunAccepted>)> {
    let (uuid, row) = branch_rule(&s, &id).await?;
    let flag = |name: &str| row.get(name).and_then(Value::as_bool);
    if flag("is_active") == Some(false) {
        return Err(ApiError::Conflict(
            "is_active is false: activate it (PUT /branch-rules/{id}/status) to run it".into(),
        ));
    }
    if flag("is_force_stopped") == Some(true) {
        return Err(ApiError::Conflict(
            "is_force_stopped is true: resume it (PUT /branch-rules/{id} with \
             \"is_force_stopped\": false) to run it"
                .into(),
        ));
    }
    let now = s.clock().now_ms();
    let mut changes = Map::new();
    changes.insert("next_run_time".into(), now.into());
    changes.insert("updated_at".into(), now.into());
    s.store().update_row(&BRANCH_RULES, uuid, &changes).await?;
    nudge(&s);
    Ok((
        StatusCode::ACCEPTED,
        Json(RunAccepted {
            id: uuid,
            next_run_time: Timestamp(now),
        }),
    ))
}

/// Sets the force stop (in the database) and cancels the rule's run: here
/// at once when this instance runs it, else by the instance that does, at
/// its next lease renewal (202, naming it).
#[utoipa::path(post, path = "/branch-rules/{id}/force-stop", tag = "branch rules",
    params(("id" = Uuid, Path, description = "Branch rule id")),
    responses((status = 200, description = "Stopped here", body = ForceStopped),
        (status = 202, description = "Stopped; its run on another instance is cancelled by that instance", body = ForceStopped)),
    security(("bearer" = [])))]
pub async fn force_stop(
    State(s): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, Json<ForceStopped>)> {
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
            Json(ForceStopped {
                id: uuid,
                is_force_stopped: outcome.flag_set,
                cancel: RunCancel::Requested,
                execution_id: Some(execution.id),
                owner: Some(execution.owner),
            }),
        ),
        None => (
            StatusCode::OK,
            Json(ForceStopped {
                id: uuid,
                is_force_stopped: outcome.flag_set,
                cancel: outcome.cancel.into(),
                execution_id: None,
                owner: None,
            }),
        ),
    })
}

/// The branch rules ready to run now, as the plan sees them.
#[utoipa::path(get, path = "/branch-rules/due", tag = "branch rules",
    responses((status = 200, description = "Branch rules ready to run now", body = Vec<BranchRule>)))]
pub async fn due(State(s): State<ApiState>) -> ApiResult<Json<Vec<BranchRule>>> {
    let plan = s.directory().plan().ok_or_else(|| restarting("plan"))?;
    let ids = ask(&plan, PlanMsg::Ready).await?;
    let mut rows = Vec::new();
    for id in ids {
        if let Some(row) = s.store().row(&BRANCH_RULES, id).await? {
            rows.push(row);
        }
    }
    Ok(Json(present_branch_rules(&s, rows).await?))
}

/// The most runs one preview shows.
const PREVIEW_MAX: usize = 1000;

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PreviewQuery {
    /// How many runs.
    #[param(minimum = 1, maximum = 1000, default = 10)]
    count: Option<usize>,
    /// Runs after this time; default: now.
    #[param(value_type = Option<RequestTime>)]
    from: Option<RequestTime>,
}

/// The next runs as the service would make them: the cron expression in
/// the branch's zone, each occurrence outside the window deferred to its
/// opening, DST handled by the schedule module; and what the branch
/// rule's policy does on the way to them (which occurrences run, when
/// they start, which are skipped and why), as the engine decides it.
#[utoipa::path(get, path = "/branch-rules/{id}/preview", tag = "branch rules",
    params(("id" = Uuid, Path, description = "Branch rule id"), PreviewQuery),
    responses((status = 200, description = "The next runs, honouring window, zone and DST, and the policy's decisions", body = Preview)))]
pub async fn preview_runs(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    Query(query): Query<PreviewQuery>,
) -> ApiResult<Json<Preview>> {
    let count = query.count.unwrap_or(10);
    if count == 0 || count > PREVIEW_MAX {
        return Err(ApiError::field(
            "count",
            format!("must be 1 to {PREVIEW_MAX}"),
        ));
    }
    let (uuid, row) = branch_rule(&s, &id).await?;
    let from = query.from.map_or_else(|| s.clock().now_ms(), |t| t.0);
    // The one resolver the plan and the worker use: a stored zone or
    // expression that is invalid is a 409 naming the row.
    let (schedule, zone) = match schedule_of_row(&s, &row).await? {
        Ok(resolved) => resolved,
        Err(ResolveError::Missing { .. }) => {
            return Err(ApiError::Conflict("the branch rule has no rule".into()));
        }
        Err(e) => return Err(ApiError::Conflict(e.to_string())),
    };
    let text = |key: &str| row.get(key).and_then(Value::as_str).map(String::from);
    let bound = |key: &str| -> ApiResult<_> {
        text(key)
            .map(|t| {
                t.parse()
                    .map_err(|_| ApiError::Conflict(format!("stored {key} {t:?} is not HH:MM")))
            })
            .transpose()
    };
    let (window_from, window_to) = (bound("operation_time_from")?, bound("operation_time_to")?);
    // One bound alone (written with SQL) is a row the plan quarantines: a
    // preview without a window would show runs that never happen.
    if window_from.is_some() != window_to.is_some() {
        let missing = if window_from.is_some() {
            "operation_time_to"
        } else {
            "operation_time_from"
        };
        return Err(ApiError::Conflict(format!(
            "the stored window has one bound, {missing} is missing: the plan holds this branch \
             rule until both are set or neither is"
        )));
    }
    let window = Window::from_bounds(window_from, window_to);
    let from_ms = from;
    let from = chrono::DateTime::from_timestamp_millis(from)
        .ok_or_else(|| ApiError::field("from", "out of range"))?;
    let runs = crate::schedule::preview_runs(&schedule, zone, window, from, count)
        .map_err(|e| ApiError::Conflict(e.to_string()))?;
    // The policy as the plan reads it: a stored one that is not a policy
    // is shown with why, and nothing is decided under it.
    let (policy, policy_error, decisions, decisions_truncated) = match policies_of(&s, &row).await?
    {
        Ok((rule, own)) => {
            let effective = EffectivePolicy::resolve(rule.as_ref(), own.as_ref());
            let merged = merged_policy(rule.as_ref(), own.as_ref());
            let (steps, truncated) =
                policy_preview(uuid, &schedule, zone, window, merged, from_ms, count).await?;
            (Some(effective), None, steps, truncated)
        }
        Err(problem) => (None, Some(problem), Vec::new(), true),
    };
    Ok(Json(Preview {
        cron_expression: schedule.expression().to_string(),
        timezone: zone.name().to_string(),
        operation_time_from: text("operation_time_from"),
        operation_time_to: text("operation_time_to"),
        runs: runs
            .iter()
            .map(|run| PreviewRun {
                utc: run.at.to_rfc3339(),
                local: run.at.with_timezone(&zone).to_rfc3339(),
                dst: run.in_dst(zone),
                deferred_from: run.deferred().then(|| run.occurrence.to_rfc3339()),
            })
            .collect(),
        policy,
        policy_error,
        decisions,
        decisions_truncated,
    }))
}

// ---- executions ------------------------------------------------------------

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ExecutionQuery {
    /// Only this branch rule's runs.
    branch_rule_id: Option<Uuid>,
    #[param(value_type = Option<ExecutionStatus>)]
    status: Option<ExecutionStatus>,
    /// Runs requested (claimed) at or after this time: `requested_at`, the
    /// order the list pages in. A run held for its window is requested
    /// when it is claimed, not when it fell due.
    #[param(value_type = Option<RequestTime>)]
    from: Option<RequestTime>,
    /// Runs requested before this time (`requested_at`).
    #[param(value_type = Option<RequestTime>)]
    to: Option<RequestTime>,
    /// Items per page.
    #[param(minimum = 1, maximum = 1000, default = 100)]
    limit: Option<i64>,
    /// `next_cursor` of the previous page.
    #[param(
        pattern = "^-?[0-9]{1,18}_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
    )]
    cursor: Option<String>,
    /// `asc`: oldest request first (the default); `desc`: newest first, as
    /// the console's live list shows them. The cursor keeps the order.
    #[param(value_type = Option<ListOrder>)]
    order: Option<ListOrder>,
}

/// The order of a listing by request time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ListOrder {
    #[default]
    Asc,
    Desc,
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

/// Whether the request carries a token: execution outputs hold response
/// captures and program output, which can echo credentials.
fn holds_token(s: &ApiState, headers: &HeaderMap) -> bool {
    super::extract::caller_of(&s.config().tokens(), headers).is_some()
}

#[utoipa::path(get, path = "/executions", tag = "executions", params(ExecutionQuery),
    responses((status = 200, description = "A page of executions in request order (`order`)", body = ExecutionPage)))]
pub async fn list_executions(
    State(s): State<ApiState>,
    headers: HeaderMap,
    Query(q): Query<ExecutionQuery>,
) -> ApiResult<Json<ExecutionPage>> {
    let with_token = holds_token(&s, &headers);
    // The same page sizes as every catalog listing.
    let limit = super::catalog::page_limit(q.limit)?;
    let filter = ExecutionFilter {
        branch_rule_id: q.branch_rule_id,
        status: q.status,
        from: q.from.map(|t| t.0),
        to: q.to.map(|t| t.0),
        limit,
        after: q.cursor.as_deref().map(decode_cursor).transpose()?,
        newest_first: q.order == Some(ListOrder::Desc),
    };
    let page = s.store().list_executions(&filter).await?;
    Ok(Json(ExecutionPage {
        items: page
            .iter()
            .map(|e| Execution::shown(e, with_token))
            .collect(),
        next_cursor: filter.next_cursor(&page).map(encode_cursor),
    }))
}

#[utoipa::path(get, path = "/executions/{id}", tag = "executions",
    params(("id" = Uuid, Path, description = "Execution id")),
    responses((status = 200, description = "The execution", body = Execution)))]
pub async fn get_execution(
    State(s): State<ApiState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Json<Execution>> {
    let with_token = holds_token(&s, &headers);
    let uuid = parse_id("execution", &id)?;
    let execution = s
        .store()
        .execution(uuid)
        .await?
        .ok_or_else(|| ApiError::not_found("execution", &id))?;
    Ok(Json(Execution::shown(&execution, with_token)))
}

/// Cancels through the master: before the handoff it records Cancelled
/// itself; after it, the worker that owns the job does (seed 002).
#[utoipa::path(post, path = "/executions/{id}/cancel", tag = "executions",
    params(("id" = Uuid, Path, description = "Execution id")),
    responses((status = 202, description = "Cancelled here, or recorded for the instance that runs it", body = CancelAccepted)),
    security(("bearer" = [])))]
pub async fn cancel_execution(
    State(s): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, Json<CancelAccepted>)> {
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
            Json(CancelAccepted {
                id: uuid,
                outcome: outcome.into(),
                owner: s.config().instance_id.clone(),
            }),
        ));
    }
    // Another instance runs it (or is about to): the request is recorded
    // and its owner acts on it at its next lease renewal.
    match s.store().request_cancel(uuid).await? {
        Some(owner) => Ok((
            StatusCode::ACCEPTED,
            Json(CancelAccepted {
                id: uuid,
                outcome: RunCancel::CancelRequested,
                owner,
            }),
        )),
        None => Err(ApiError::Conflict(format!("execution {id} already ended"))),
    }
}

/// The instances sharing the database: heartbeat, liveness (on the
/// database's clock), static partition and the partition leases held.
#[utoipa::path(get, path = "/instances", tag = "cluster",
    responses((status = 200, description = "Instances sharing the database, with their partition leases", body = Instances)))]
pub async fn instances(State(s): State<ApiState>) -> ApiResult<Json<Instances>> {
    let store = s.store();
    let ttl_ms = s.config().partition_lease_ttl.as_millis() as i64;
    let view = store.partition_leases().await?;
    let rows = store.instances().await?;
    let instances = rows
        .into_iter()
        .map(|row| {
            let partitions_held: Vec<u32> = view
                .leases
                .iter()
                .filter(|lease| lease.live_holder(view.db_now) == Some(row.id.as_str()))
                .map(|lease| lease.partition)
                .collect();
            Instance {
                live: view.db_now - row.heartbeat_at <= ttl_ms,
                this_instance: row.id == s.config().instance_id,
                id: row.id,
                hostname: row.hostname,
                pid: row.pid,
                started_at: Timestamp(row.started_at),
                heartbeat_at: Timestamp(row.heartbeat_at),
                partition: row.partition,
                partitions_held,
            }
        })
        .collect();
    Ok(Json(Instances {
        partition_count: s.config().partition_count,
        instances,
    }))
}

// ---- plan and statistics ---------------------------------------------------

#[utoipa::path(get, path = "/plan", tag = "plan",
    responses((status = 200, description = "The execution plan, with quarantined rows and held workflows", body = PlanView)))]
pub async fn plan(State(s): State<ApiState>, headers: HeaderMap) -> ApiResult<Json<PlanView>> {
    let actor = s.directory().plan().ok_or_else(|| restarting("plan"))?;
    let snapshot = ask(&actor, PlanMsg::Snapshot).await?;
    let quarantine = ask(&actor, PlanMsg::Quarantine).await?;
    let owners = owners_if_reachable(&s).await;
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
                let (partition, owner) = match &owners {
                    Some(owners) => owners.of(&id),
                    None => (partition_of(&id, s.config().partition_count), None),
                };
                object.insert("partition".into(), json!(partition));
                object.insert("partition_owner".into(), json!(owner));
                object.insert("held".into(), json!(held.get(&id)));
            }
        }
    }
    if let Some(object) = value.as_object_mut() {
        object.insert("quarantined".into(), json!(quarantine.rows));
    }
    // Action params live in the snapshot too.
    value = super::present::redact(&value);
    let mut view: PlanView = super::views::from_value(value)?;
    mask_details_by_templates(&mut view);
    hide_outbox_outputs(&mut view, holds_token(&s, &headers));
    // The free-form parts (the catalog copies) show times like the rest.
    for list in [
        &mut view.outbox,
        &mut view.brands,
        &mut view.branches,
        &mut view.rules,
        &mut view.brand_rules,
        &mut view.action_templates,
        &mut view.action_details,
    ] {
        list.iter_mut().for_each(times_as_rfc3339);
    }
    for workflow in &mut view.workflows {
        times_as_rfc3339(&mut workflow.branch_rule);
    }
    Ok(Json(view))
}

/// Which instance holds each partition, for the plan's views; `None`
/// while the database is away. The plan is in memory and most worth
/// seeing during an outage, so its views answer without the owners.
async fn owners_if_reachable(s: &ApiState) -> Option<PartitionOwners> {
    let config = s.config();
    match s
        .store()
        .partition_owners(config.partition_count, &config.instance_id)
        .await
    {
        Ok(owners) => Some(owners),
        Err(e) => {
            metrics::counter!(crate::metrics::DB_ERRORS_TOTAL, "op" => "leases").increment(1);
            tracing::debug!("the plan is shown without its partition owners: {e}");
            None
        }
    }
}

/// The outbox's results as `GET /executions` shows them: their output
/// (response captures, program output) only to callers holding the token,
/// and URL credentials masked in their error.
fn hide_outbox_outputs(view: &mut PlanView, with_token: bool) {
    for entry in &mut view.outbox {
        let Some(finish) = entry.get_mut("finish").and_then(Value::as_object_mut) else {
            continue;
        };
        if let Some(output) = finish.get_mut("output").filter(|output| !output.is_null()) {
            *output = super::views::shown_output(output, with_token);
        }
        if let Some(Value::String(error)) = finish.get_mut("error") {
            *error = secrets::mask_urls(error).into_owned();
        }
    }
}

/// The snapshot's action details with their params masked by their
/// template's `secret_keys` too, as the catalog's endpoints show them. A
/// detail whose template is not in the plan (quarantined: its config, and
/// so its `secret_keys`, cannot be read) has every value masked.
fn mask_details_by_templates(view: &mut PlanView) {
    let configs: HashMap<&str, &Value> = view
        .action_templates
        .iter()
        .filter_map(|template| Some((template.get("id")?.as_str()?, template.get("config")?)))
        .collect();
    for detail in &mut view.action_details {
        let template = detail
            .get("action_template_id")
            .and_then(Value::as_str)
            .and_then(|id| configs.get(id).copied());
        if let Some(params) = detail.get_mut("params") {
            *params = match template {
                Some(config) => secrets::redact_params(params, Some(config)),
                None => mask_every_value(params),
            };
        }
    }
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

#[utoipa::path(get, path = "/plan/ready", tag = "plan",
    responses((status = 200, description = "Ids of the workflows ready now", body = PlanReady)))]
pub async fn plan_ready(State(s): State<ApiState>) -> ApiResult<Json<PlanReady>> {
    let actor = s.directory().plan().ok_or_else(|| restarting("plan"))?;
    let ready = ask(&actor, PlanMsg::Ready).await?;
    Ok(Json(PlanReady { ready }))
}

/// Seed 004's queue statistics, seed 000's writer status, the plan's size,
/// and the console overview's figures: readiness, memory, start lag and the
/// latest failures.
#[utoipa::path(get, path = "/stats", tag = "plan",
    responses((status = 200, description = "Queue, writer, plan, readiness, memory and start-lag statistics", body = Stats)))]
pub async fn stats(State(s): State<ApiState>) -> ApiResult<Json<Stats>> {
    let directory = s.directory();
    let master = directory.master().ok_or_else(|| restarting("master"))?;
    let writer = directory.writer().ok_or_else(|| restarting("writer"))?;
    let plan = directory.plan().ok_or_else(|| restarting("plan"))?;
    let guard = directory
        .memory_guard()
        .ok_or_else(|| restarting("memory guard"))?;
    let queue = ask(&master, MasterMsg::Stats).await?;
    let start_lag = ask(&master, MasterMsg::StartLag).await?;
    let writer = ask(&writer, WriterMsg::Stats).await?;
    let readiness = ask(&plan, PlanMsg::Readiness).await?;
    let plan = ask(&plan, PlanMsg::Stats).await?;
    let memory = ask(&guard, MemoryGuardMsg::Status).await?;
    // The failures are read from the database; everything else is in this
    // process. During an outage, when an operator most needs the
    // overview, the rest still answers.
    let (recent_errors, recent_errors_unavailable) = match recent_errors(&s).await {
        Ok(errors) => (errors, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    Ok(Json(Stats {
        queue,
        writer: writer.into(),
        plan,
        readiness,
        memory: memory_view(memory, s.config()),
        start_lag: start_lag.into(),
        recent_errors,
        recent_errors_unavailable,
        now: Timestamp(s.clock().now_ms()),
        instance_id: s.config().instance_id.clone(),
        read_only: s.config().tokens().is_empty(),
    }))
}

/// How many failures the overview lists.
const RECENT_ERRORS: usize = 10;

/// The latest failed and timed-out executions, newest first: one keyset
/// read per status on the finished-status index.
async fn recent_errors(s: &ApiState) -> Result<Vec<RecentError>, crate::store::StoreError> {
    let mut failures = Vec::new();
    for status in [ExecutionStatus::Failed, ExecutionStatus::TimedOut] {
        let filter = ExecutionFilter {
            status: Some(status),
            limit: RECENT_ERRORS as i64,
            newest_first: true,
            ..ExecutionFilter::default()
        };
        failures.extend(s.store().list_executions(&filter).await?);
    }
    failures.sort_by_key(|e| std::cmp::Reverse((e.requested_at, e.id)));
    failures.truncate(RECENT_ERRORS);
    Ok(failures
        .into_iter()
        .map(|e| RecentError {
            id: e.id,
            branch_rule_id: e.branch_rule_id,
            status: e.status,
            attempt: e.attempt,
            requested_at: Timestamp(e.requested_at),
            finished_at: e.finished_at.map(Timestamp),
            error: e.error,
        })
        .collect())
}

fn memory_view(status: MemoryStatus, config: &crate::config::Config) -> MemoryView {
    let reading = status.last_reading.as_ref();
    MemoryView {
        throttled: status.throttle.throttled,
        reason: status.throttle.reason,
        ram_ratio: reading.map(|r| r.ram.ratio()),
        swap_ratio: reading.map(|r| r.swap.ratio()),
        gpu_ratio: reading
            .and_then(|r| r.gpus.as_ref())
            .and_then(|gpus| gpus.iter().map(|g| g.ratio()).reduce(f64::max)),
        gpu: status.gpu.to_string(),
        memory_throttle_threshold: config.memory_throttle_threshold,
        memory_resume_threshold: config.memory_resume_threshold,
        swap_throttle_threshold: config.swap_throttle_threshold,
        gpu_throttle_threshold: config.gpu_throttle_threshold,
        gpu_resume_threshold: config.gpu_resume_threshold,
        last_error: status.last_error,
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WorkflowQuery {
    /// Only this brand's branch rules.
    brand_id: Option<Uuid>,
    /// Only this branch's.
    branch_id: Option<Uuid>,
    #[param(value_type = Option<RuleState>)]
    state: Option<RuleState>,
    /// Part of the rule's, branch's or brand's name, any case. No NUL: the
    /// API refuses one anywhere in a URL.
    #[param(max_length = 200, pattern = r"^[^\u0000]*$")]
    q: Option<String>,
    /// Only these branch rules: ids separated by commas (at most 1,000).
    #[param(
        max_length = 37000,
        pattern = "^([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}(,[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})*)?$"
    )]
    ids: Option<String>,
    /// Items per page.
    #[param(minimum = 1, maximum = 1000, default = 100)]
    limit: Option<i64>,
    /// `next_cursor` of the previous page.
    #[param(pattern = "^([0-9a-f]{2})+$", max_length = 4000)]
    cursor: Option<String>,
    /// `name` (brand, branch, rule; the default) or `next_run` (soonest
    /// first, unscheduled last: the decision log).
    #[param(value_type = Option<WorkflowSort>)]
    sort: Option<WorkflowSort>,
}

/// The order of the plan's workflows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WorkflowSort {
    #[default]
    Name,
    NextRun,
}

/// Bounds of `GET /plan/workflows`, as its document states them.
const MAX_WORKFLOW_IDS: usize = 1000;
const MAX_SEARCH_CHARS: usize = 200;
const MAX_CURSOR_CHARS: usize = 4000;

/// The plan's workflows with their names, next run in UTC and local time,
/// and the verdict `ruled plan` gives, filtered and paged in (brand,
/// branch, rule name, id) order: the console's Rules page.
#[utoipa::path(get, path = "/plan/workflows", tag = "plan", params(WorkflowQuery),
    responses((status = 200, description = "A page of the plan's workflows", body = BrowsePage)))]
pub async fn plan_workflows(
    State(s): State<ApiState>,
    Query(q): Query<WorkflowQuery>,
) -> ApiResult<Json<BrowsePage>> {
    let limit = super::catalog::page_limit(q.limit)? as usize;
    let ids = q
        .ids
        .as_deref()
        .map(|text| {
            text.split(',')
                .filter(|id| !id.is_empty())
                .map(|id| {
                    Uuid::parse_str(id.trim())
                        .map_err(|_| ApiError::field("ids", format!("{id:?} is not a UUID")))
                })
                .collect::<ApiResult<Vec<Uuid>>>()
        })
        .transpose()?
        // `ids=` names none: no filter, like leaving it out.
        .filter(|ids| !ids.is_empty());
    if ids.as_ref().is_some_and(|ids| ids.len() > MAX_WORKFLOW_IDS) {
        return Err(ApiError::field(
            "ids",
            format!("names more than {MAX_WORKFLOW_IDS} branch rules"),
        ));
    }
    if q.q
        .as_ref()
        .is_some_and(|text| text.chars().count() > MAX_SEARCH_CHARS)
    {
        return Err(ApiError::field(
            "q",
            format!("is longer than {MAX_SEARCH_CHARS} characters"),
        ));
    }
    let after = q
        .cursor
        .as_deref()
        .map(|cursor| {
            let lower_hex = cursor
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
            (lower_hex && !cursor.is_empty() && cursor.len() <= MAX_CURSOR_CHARS)
                .then(|| BrowseKey::from_cursor(cursor))
                .flatten()
                .ok_or_else(|| ApiError::field("cursor", "is not a cursor this API returned"))
        })
        .transpose()?;
    let query = BrowseQuery {
        brand_id: q.brand_id,
        branch_id: q.branch_id,
        state: q.state,
        search: q.q.filter(|text| !text.trim().is_empty()),
        ids,
        limit,
        after,
        by_next_run: q.sort == Some(WorkflowSort::NextRun),
    };
    let owners = owners_if_reachable(&s).await;
    let actor = s.directory().plan().ok_or_else(|| restarting("plan"))?;
    let page = ask(&actor, |reply| PlanMsg::Browse {
        query: Box::new(query),
        owners,
        reply,
    })
    .await?;
    Ok(Json(page))
}
