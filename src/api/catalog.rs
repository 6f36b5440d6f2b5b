//! CRUD for brands, branches, rules, action templates, branch rules and
//! their action details. Every change nudges the refresher so the plan sees
//! it within a second instead of at the next periodic refresh.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::ApiState;
use super::error::{ApiError, ApiResult};
use super::extract::ApiJson;
use super::present::{local_time, parse_time, present};
use crate::messages::RefresherMsg;
use crate::schedule::{CronSchedule, TimeOfDay, next_after_millis, parse_timezone};
use crate::store::rows::{
    ACTION_DETAILS, ACTION_TEMPLATES, BRANCH_RULES, BRANCHES, BRAND_RULES, BRANDS, RULES, TableSpec,
};

type Created = (StatusCode, Json<Value>);

/// Asks for a plan refresh now; the change is already committed, so a
/// refresher that is restarting just picks it up at its first refresh.
pub fn nudge(state: &ApiState) {
    if let Some(refresher) = state.directory().refresher() {
        let _ = refresher.cast(RefresherMsg::RefreshNow);
    }
}

fn parse_id(what: &'static str, text: &str) -> ApiResult<Uuid> {
    Uuid::parse_str(text).map_err(|_| ApiError::not_found(what, text))
}

/// The input struct as a map of only the fields the client sent.
fn to_map<T: Serialize>(input: &T) -> Map<String, Value> {
    match serde_json::to_value(input) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    }
}

fn require(map: &Map<String, Value>, field: &str) -> ApiResult<()> {
    match map.get(field) {
        Some(v) if !v.is_null() => Ok(()),
        _ => Err(ApiError::field(field, "is required")),
    }
}

fn non_empty(map: &Map<String, Value>, field: &str) -> ApiResult<()> {
    match map.get(field).and_then(Value::as_str) {
        Some(s) if s.trim().is_empty() => Err(ApiError::field(field, "must not be empty")),
        _ => Ok(()),
    }
}

fn json_object(map: &Map<String, Value>, field: &str) -> ApiResult<()> {
    match map.get(field) {
        None | Some(Value::Object(_)) => Ok(()),
        Some(_) => Err(ApiError::field(field, "must be a JSON object")),
    }
}

fn check_cron(field: &str, expression: &str) -> ApiResult<CronSchedule> {
    CronSchedule::parse(expression).map_err(|e| ApiError::field(field, e.to_string()))
}

fn check_zone(field: &str, zone: &str) -> ApiResult<Tz> {
    parse_timezone(zone).map_err(|e| ApiError::field(field, e.to_string()))
}

fn check_time_of_day(field: &str, text: &str) -> ApiResult<()> {
    text.parse::<TimeOfDay>()
        .map(drop)
        .map_err(|e| ApiError::field(field, format!("{text:?} is not HH:MM: {e}")))
}

// ---- generic handlers ------------------------------------------------------

async fn get_row(
    state: &ApiState,
    spec: &TableSpec,
    what: &'static str,
    id: &str,
) -> ApiResult<Map<String, Value>> {
    let uuid = parse_id(what, id)?;
    state
        .store()
        .row(spec, uuid)
        .await?
        .ok_or_else(|| ApiError::not_found(what, id))
}

async fn insert_one(
    state: &ApiState,
    spec: &'static TableSpec,
    mut row: Map<String, Value>,
) -> ApiResult<Created> {
    let now = state.clock().now_ms();
    let id = Uuid::new_v4();
    row.insert("id".into(), Value::String(id.to_string()));
    row.insert("created_at".into(), now.into());
    row.insert("updated_at".into(), now.into());
    state.store().insert_rows(&[(spec, row)]).await?;
    nudge(state);
    let row = state
        .store()
        .row(spec, id)
        .await?
        .ok_or_else(|| ApiError::not_found("row", id))?;
    Ok((StatusCode::CREATED, Json(present(row))))
}

async fn update_one(
    state: &ApiState,
    spec: &'static TableSpec,
    what: &'static str,
    id: &str,
    mut changes: Map<String, Value>,
) -> ApiResult<Map<String, Value>> {
    let uuid = parse_id(what, id)?;
    changes.insert("updated_at".into(), state.clock().now_ms().into());
    if !state.store().update_row(spec, uuid, &changes).await? {
        return Err(ApiError::not_found(what, id));
    }
    nudge(state);
    state
        .store()
        .row(spec, uuid)
        .await?
        .ok_or_else(|| ApiError::not_found(what, id))
}

/// Deletes `ids` (comma-separated); 404 unless every one existed, and then
/// nothing is deleted.
async fn delete_ids(
    state: &ApiState,
    spec: &'static TableSpec,
    what: &'static str,
    ids: &str,
) -> ApiResult<StatusCode> {
    let mut uuids = Vec::new();
    for part in ids.split(',') {
        let uuid = parse_id(what, part.trim())?;
        if state.store().row(spec, uuid).await?.is_none() {
            return Err(ApiError::not_found(what, part.trim()));
        }
        uuids.push(uuid);
    }
    state.store().delete_rows(spec, &uuids).await?;
    nudge(state);
    Ok(StatusCode::NO_CONTENT)
}

async fn list_all(state: &ApiState, spec: &TableSpec) -> ApiResult<Json<Value>> {
    let rows = state.store().rows(spec, None).await?;
    Ok(Json(Value::Array(rows.into_iter().map(present).collect())))
}

// ---- brands ----------------------------------------------------------------

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BrandInput {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    settings: Option<Value>,
}

fn brand_fields(input: &BrandInput) -> ApiResult<Map<String, Value>> {
    let map = to_map(input);
    non_empty(&map, "name")?;
    json_object(&map, "settings")?;
    Ok(map)
}

pub async fn create_brand(
    State(s): State<ApiState>,
    ApiJson(input): ApiJson<BrandInput>,
) -> ApiResult<Created> {
    let mut map = brand_fields(&input)?;
    require(&map, "name")?;
    map.entry("settings").or_insert(json!({}));
    insert_one(&s, &BRANDS, map).await
}

pub async fn list_brands(State(s): State<ApiState>) -> ApiResult<Json<Value>> {
    list_all(&s, &BRANDS).await
}

pub async fn get_brand(
    State(s): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    Ok(Json(present(get_row(&s, &BRANDS, "brand", &id).await?)))
}

pub async fn update_brand(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    ApiJson(input): ApiJson<BrandInput>,
) -> ApiResult<Json<Value>> {
    let map = brand_fields(&input)?;
    Ok(Json(present(
        update_one(&s, &BRANDS, "brand", &id, map).await?,
    )))
}

pub async fn delete_brand(
    State(s): State<ApiState>,
    Path(ids): Path<String>,
) -> ApiResult<StatusCode> {
    delete_ids(&s, &BRANDS, "brand", &ids).await
}

// ---- branches --------------------------------------------------------------

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BranchInput {
    #[serde(skip_serializing_if = "Option::is_none")]
    brand_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timezone: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    is_active: Option<bool>,
}

fn branch_fields(input: &BranchInput) -> ApiResult<Map<String, Value>> {
    let map = to_map(input);
    non_empty(&map, "name")?;
    if let Some(zone) = &input.timezone {
        check_zone("timezone", zone)?;
    }
    Ok(map)
}

pub async fn create_branch(
    State(s): State<ApiState>,
    ApiJson(input): ApiJson<BranchInput>,
) -> ApiResult<Created> {
    let mut map = branch_fields(&input)?;
    require(&map, "brand_id")?;
    require(&map, "name")?;
    map.entry("is_active").or_insert(Value::Bool(true));
    insert_one(&s, &BRANCHES, map).await
}

pub async fn list_branches(State(s): State<ApiState>) -> ApiResult<Json<Value>> {
    list_all(&s, &BRANCHES).await
}

pub async fn get_branch(
    State(s): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    Ok(Json(present(get_row(&s, &BRANCHES, "branch", &id).await?)))
}

pub async fn update_branch(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    ApiJson(input): ApiJson<BranchInput>,
) -> ApiResult<Json<Value>> {
    let map = branch_fields(&input)?;
    let row = update_one(&s, &BRANCHES, "branch", &id, map).await?;
    if input.timezone.is_some() {
        // A new zone moves every fixed-time occurrence of the branch's rules.
        recompute_next_runs(&s, ("branch_id", &row["id"])).await?;
    }
    Ok(Json(present(row)))
}

pub async fn delete_branch(
    State(s): State<ApiState>,
    Path(ids): Path<String>,
) -> ApiResult<StatusCode> {
    delete_ids(&s, &BRANCHES, "branch", &ids).await
}

// ---- rules -----------------------------------------------------------------

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RuleInput {
    #[serde(skip_serializing_if = "Option::is_none")]
    brand_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cron_expression: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    settings: Option<Value>,
}

fn rule_fields(input: &RuleInput) -> ApiResult<Map<String, Value>> {
    let map = to_map(input);
    non_empty(&map, "name")?;
    json_object(&map, "settings")?;
    if let Some(expression) = &input.cron_expression {
        check_cron("cron_expression", expression)?;
    }
    if let Some(status) = &input.status
        && status != "active"
        && status != "inactive"
    {
        return Err(ApiError::field(
            "status",
            format!("{status:?} is neither \"active\" nor \"inactive\""),
        ));
    }
    Ok(map)
}

pub async fn create_rule(
    State(s): State<ApiState>,
    ApiJson(input): ApiJson<RuleInput>,
) -> ApiResult<Created> {
    let mut map = rule_fields(&input)?;
    require(&map, "name")?;
    require(&map, "cron_expression")?;
    map.entry("status")
        .or_insert(Value::String("active".into()));
    map.entry("settings").or_insert(json!({}));
    insert_one(&s, &RULES, map).await
}

pub async fn list_rules(State(s): State<ApiState>) -> ApiResult<Json<Value>> {
    list_all(&s, &RULES).await
}

pub async fn get_rule(State(s): State<ApiState>, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    Ok(Json(present(get_row(&s, &RULES, "rule", &id).await?)))
}

pub async fn update_rule(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    ApiJson(input): ApiJson<RuleInput>,
) -> ApiResult<Json<Value>> {
    let map = rule_fields(&input)?;
    let row = update_one(&s, &RULES, "rule", &id, map).await?;
    if input.cron_expression.is_some() {
        recompute_next_runs(&s, ("rule_id", &row["id"])).await?;
    }
    Ok(Json(present(row)))
}

pub async fn delete_rule(
    State(s): State<ApiState>,
    Path(ids): Path<String>,
) -> ApiResult<StatusCode> {
    delete_ids(&s, &RULES, "rule", &ids).await
}

// ---- action templates ------------------------------------------------------

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateInput {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    config: Option<Value>,
}

fn template_fields(state: &ApiState, input: &TemplateInput) -> ApiResult<Map<String, Value>> {
    let map = to_map(input);
    non_empty(&map, "name")?;
    json_object(&map, "config")?;
    if let Some(kind) = &input.kind {
        let mut kinds = state.registry().kinds();
        if !kinds.contains(kind) {
            kinds.sort();
            return Err(ApiError::field(
                "kind",
                format!("unknown kind {kind:?}; known kinds: {}", kinds.join(", ")),
            ));
        }
    }
    Ok(map)
}

pub async fn create_template(
    State(s): State<ApiState>,
    ApiJson(input): ApiJson<TemplateInput>,
) -> ApiResult<Created> {
    let mut map = template_fields(&s, &input)?;
    require(&map, "name")?;
    require(&map, "kind")?;
    map.entry("config").or_insert(json!({}));
    insert_one(&s, &ACTION_TEMPLATES, map).await
}

pub async fn list_templates(State(s): State<ApiState>) -> ApiResult<Json<Value>> {
    list_all(&s, &ACTION_TEMPLATES).await
}

pub async fn get_template(
    State(s): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    Ok(Json(present(
        get_row(&s, &ACTION_TEMPLATES, "action template", &id).await?,
    )))
}

pub async fn update_template(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    ApiJson(input): ApiJson<TemplateInput>,
) -> ApiResult<Json<Value>> {
    let map = template_fields(&s, &input)?;
    Ok(Json(present(
        update_one(&s, &ACTION_TEMPLATES, "action template", &id, map).await?,
    )))
}

pub async fn delete_template(
    State(s): State<ApiState>,
    Path(ids): Path<String>,
) -> ApiResult<StatusCode> {
    delete_ids(&s, &ACTION_TEMPLATES, "action template", &ids).await
}

// ---- branch rules ----------------------------------------------------------

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BranchRuleInput {
    #[serde(skip_serializing_if = "Option::is_none")]
    branch_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rule_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    brand_rule_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    is_active: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    is_archived: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    operation_time_from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    operation_time_to: Option<String>,
    /// RFC 3339; default: the next cron occurrence in the branch's zone.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_run_time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    params: Option<Value>,
    /// Only on create: the rule's actions, inserted in the same
    /// transaction so the rule never runs without them.
    #[serde(skip_serializing)]
    action_details: Option<Vec<ActionDetailInput>>,
}

fn branch_rule_fields(input: &BranchRuleInput) -> ApiResult<Map<String, Value>> {
    let mut map = to_map(input);
    json_object(&map, "params")?;
    for field in ["operation_time_from", "operation_time_to"] {
        if let Some(text) = map.get(field).and_then(Value::as_str) {
            check_time_of_day(field, text)?;
        }
    }
    if let Some(text) = &input.next_run_time {
        map.insert(
            "next_run_time".into(),
            parse_time("next_run_time", text)?.into(),
        );
    }
    Ok(map)
}

/// The branch's zone (or DEFAULT_TIMEZONE) of a branch rule row.
async fn zone_of_branch(state: &ApiState, branch_id: &Value) -> ApiResult<Tz> {
    let id = branch_id.as_str().and_then(|s| Uuid::parse_str(s).ok());
    let branch = match id {
        Some(id) => state.store().row(&BRANCHES, id).await?,
        None => None,
    };
    let zone = branch
        .as_ref()
        .and_then(|b| b.get("timezone"))
        .and_then(Value::as_str)
        .and_then(|z| parse_timezone(z).ok());
    Ok(zone.unwrap_or(state.config().default_timezone))
}

/// The expression a branch rule runs on: its brand rule's, else its rule's.
async fn expression_of(state: &ApiState, row: &Map<String, Value>) -> ApiResult<Option<String>> {
    let id = |v: Option<&Value>| {
        v.and_then(Value::as_str)
            .and_then(|s| Uuid::parse_str(s).ok())
    };
    if let Some(brand_rule) = id(row.get("brand_rule_id")) {
        let expression = state
            .store()
            .row(&BRAND_RULES, brand_rule)
            .await?
            .and_then(|r| {
                r.get("cron_expression")
                    .and_then(Value::as_str)
                    .map(String::from)
            });
        if expression.is_some() {
            return Ok(expression);
        }
    }
    let Some(rule_id) = id(row.get("rule_id")) else {
        return Ok(None);
    };
    Ok(state.store().row(&RULES, rule_id).await?.and_then(|r| {
        r.get("cron_expression")
            .and_then(Value::as_str)
            .map(String::from)
    }))
}

async fn next_run_of(state: &ApiState, row: &Map<String, Value>) -> ApiResult<Option<i64>> {
    let Some(expression) = expression_of(state, row).await? else {
        return Ok(None);
    };
    let zone = zone_of_branch(state, row.get("branch_id").unwrap_or(&Value::Null)).await?;
    let schedule = check_cron("cron_expression", &expression)?;
    Ok(next_after_millis(&schedule, zone, state.clock().now_ms()).ok())
}

/// After a rule's cron or a branch's zone changed: every affected branch
/// rule's next run, recomputed from the expression (never shifted).
async fn recompute_next_runs(state: &ApiState, filter: (&str, &Value)) -> ApiResult<()> {
    for row in state.store().rows(&BRANCH_RULES, Some(filter)).await? {
        let Some(id) = row
            .get("id")
            .and_then(Value::as_str)
            .and_then(|s| Uuid::parse_str(s).ok())
        else {
            continue;
        };
        let mut changes = Map::new();
        changes.insert(
            "next_run_time".into(),
            next_run_of(state, &row)
                .await?
                .map_or(Value::Null, Value::from),
        );
        changes.insert("updated_at".into(), state.clock().now_ms().into());
        state
            .store()
            .update_row(&BRANCH_RULES, id, &changes)
            .await?;
    }
    nudge(state);
    Ok(())
}

/// A branch rule as the API shows it, with `next_run_time_local` and its
/// action details.
pub async fn present_branch_rule(state: &ApiState, row: Map<String, Value>) -> ApiResult<Value> {
    let zone = zone_of_branch(state, row.get("branch_id").unwrap_or(&Value::Null)).await?;
    let next = row.get("next_run_time").and_then(Value::as_i64);
    let id = row.get("id").cloned().unwrap_or(Value::Null);
    let details = state
        .store()
        .rows(&ACTION_DETAILS, Some(("branch_rule_id", &id)))
        .await?;
    let mut shown = present(row);
    shown["next_run_time_local"] = next.map_or(Value::Null, |ms| local_time(ms, zone));
    shown["timezone"] = Value::String(zone.name().to_string());
    let mut details: Vec<Value> = details.into_iter().map(present).collect();
    details.sort_by_key(|d| d["position"].as_i64());
    shown["action_details"] = Value::Array(details);
    Ok(shown)
}

pub async fn create_branch_rule(
    State(s): State<ApiState>,
    ApiJson(input): ApiJson<BranchRuleInput>,
) -> ApiResult<Created> {
    let mut map = branch_rule_fields(&input)?;
    require(&map, "branch_id")?;
    require(&map, "rule_id")?;
    let now = s.clock().now_ms();
    let id = Uuid::new_v4();
    map.insert("id".into(), Value::String(id.to_string()));
    map.entry("is_active").or_insert(Value::Bool(true));
    map.entry("params").or_insert(json!({}));
    map.insert("created_at".into(), now.into());
    map.insert("updated_at".into(), now.into());
    if !map.contains_key("next_run_time") {
        let next = next_run_of(&s, &map).await?;
        map.insert(
            "next_run_time".into(),
            next.map_or(Value::Null, Value::from),
        );
    }
    let mut rows = vec![(&BRANCH_RULES, map)];
    for (index, detail) in input.action_details.iter().flatten().enumerate() {
        let field = format!("action_details[{index}]");
        let mut detail_map = detail_fields(&field, detail)?;
        require(&detail_map, "action_template_id")
            .map_err(|_| ApiError::field(format!("{field}.action_template_id"), "is required"))?;
        detail_map.insert("id".into(), Value::String(Uuid::new_v4().to_string()));
        detail_map.insert("branch_rule_id".into(), Value::String(id.to_string()));
        detail_map
            .entry("position")
            .or_insert(Value::from(index as i64));
        detail_map.entry("params").or_insert(json!({}));
        detail_map.insert("created_at".into(), now.into());
        detail_map.insert("updated_at".into(), now.into());
        rows.push((&ACTION_DETAILS, detail_map));
    }
    s.store().insert_rows(&rows).await?;
    nudge(&s);
    let row = s
        .store()
        .row(&BRANCH_RULES, id)
        .await?
        .ok_or_else(|| ApiError::not_found("branch rule", id))?;
    Ok((
        StatusCode::CREATED,
        Json(present_branch_rule(&s, row).await?),
    ))
}

pub async fn list_branch_rules(State(s): State<ApiState>) -> ApiResult<Json<Value>> {
    let mut out = Vec::new();
    for row in s.store().rows(&BRANCH_RULES, None).await? {
        out.push(present_branch_rule(&s, row).await?);
    }
    Ok(Json(Value::Array(out)))
}

pub async fn get_branch_rule(
    State(s): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let row = get_row(&s, &BRANCH_RULES, "branch rule", &id).await?;
    Ok(Json(present_branch_rule(&s, row).await?))
}

pub async fn update_branch_rule(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    ApiJson(input): ApiJson<BranchRuleInput>,
) -> ApiResult<Json<Value>> {
    if input.action_details.is_some() {
        return Err(ApiError::field(
            "action_details",
            "is only accepted on create; use /branch-rules/{id}/action-details",
        ));
    }
    let map = branch_rule_fields(&input)?;
    let schedule_changed =
        input.rule_id.is_some() || input.branch_id.is_some() || input.brand_rule_id.is_some();
    let row = update_one(&s, &BRANCH_RULES, "branch rule", &id, map).await?;
    let row = if schedule_changed && input.next_run_time.is_none() {
        recompute_next_runs(&s, ("id", &row["id"])).await?;
        get_row(&s, &BRANCH_RULES, "branch rule", &id).await?
    } else {
        row
    };
    Ok(Json(present_branch_rule(&s, row).await?))
}

pub async fn delete_branch_rules(
    State(s): State<ApiState>,
    Path(ids): Path<String>,
) -> ApiResult<StatusCode> {
    delete_ids(&s, &BRANCH_RULES, "branch rule", &ids).await
}

// ---- action details (nested) -----------------------------------------------

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ActionDetailInput {
    #[serde(skip_serializing_if = "Option::is_none")]
    action_template_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    position: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    params: Option<Value>,
}

fn detail_fields(prefix: &str, input: &ActionDetailInput) -> ApiResult<Map<String, Value>> {
    let map = to_map(input);
    json_object(&map, "params")
        .map_err(|_| ApiError::field(format!("{prefix}params"), "must be a JSON object"))?;
    Ok(map)
}

/// The detail `detail_id` of branch rule `id`, or 404 for either.
async fn nested_detail(s: &ApiState, id: &str, detail_id: &str) -> ApiResult<Map<String, Value>> {
    get_row(s, &BRANCH_RULES, "branch rule", id).await?;
    let detail = get_row(s, &ACTION_DETAILS, "action detail", detail_id).await?;
    let owner = detail
        .get("branch_rule_id")
        .and_then(Value::as_str)
        .and_then(|s| Uuid::parse_str(s).ok());
    if owner != Uuid::parse_str(id).ok() {
        return Err(ApiError::not_found("action detail", detail_id));
    }
    Ok(detail)
}

pub async fn create_detail(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    ApiJson(input): ApiJson<ActionDetailInput>,
) -> ApiResult<Created> {
    let rule = get_row(&s, &BRANCH_RULES, "branch rule", &id).await?;
    let mut map = detail_fields("", &input)?;
    require(&map, "action_template_id")?;
    if !map.contains_key("position") {
        let existing = s
            .store()
            .rows(&ACTION_DETAILS, Some(("branch_rule_id", &rule["id"])))
            .await?;
        let next = existing
            .iter()
            .filter_map(|d| d["position"].as_i64())
            .max()
            .map_or(0, |p| p + 1);
        map.insert("position".into(), next.into());
    }
    map.insert("branch_rule_id".into(), rule["id"].clone());
    map.entry("params").or_insert(json!({}));
    insert_one(&s, &ACTION_DETAILS, map).await
}

pub async fn list_details(
    State(s): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let rule = get_row(&s, &BRANCH_RULES, "branch rule", &id).await?;
    let mut rows = s
        .store()
        .rows(&ACTION_DETAILS, Some(("branch_rule_id", &rule["id"])))
        .await?;
    rows.sort_by_key(|d| d["position"].as_i64());
    Ok(Json(Value::Array(rows.into_iter().map(present).collect())))
}

pub async fn get_detail(
    State(s): State<ApiState>,
    Path((id, detail_id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    Ok(Json(present(nested_detail(&s, &id, &detail_id).await?)))
}

pub async fn update_detail(
    State(s): State<ApiState>,
    Path((id, detail_id)): Path<(String, String)>,
    ApiJson(input): ApiJson<ActionDetailInput>,
) -> ApiResult<Json<Value>> {
    nested_detail(&s, &id, &detail_id).await?;
    let map = detail_fields("", &input)?;
    Ok(Json(present(
        update_one(&s, &ACTION_DETAILS, "action detail", &detail_id, map).await?,
    )))
}

pub async fn delete_detail(
    State(s): State<ApiState>,
    Path((id, detail_id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    nested_detail(&s, &id, &detail_id).await?;
    delete_ids(&s, &ACTION_DETAILS, "action detail", &detail_id).await
}
