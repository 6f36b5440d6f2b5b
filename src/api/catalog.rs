//! CRUD for brands, branches, rules, action templates, branch rules and
//! their action details. Every change nudges the refresher so the plan sees
//! it within a second instead of at the next periodic refresh.
//!
//! Requests are read into typed inputs whose values check themselves
//! ([`super::schema`]); answers are typed views ([`super::views`]). Both
//! are the OpenAPI document's schemas.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use chrono_tz::Tz;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value, json};
use tracing::info;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::{IntoParams, PartialSchema, ToSchema};
use uuid::Uuid;

use super::ApiState;
use super::error::{ApiError, ApiResult};
use super::extract::{ApiJson, Caller};
use super::present::{REDACTED, keep_stored_secrets, local_time};
use super::schema::{
    CronText, JsonObject, Name, ObjectOnly, RequestTime, TimeOfDayText, ZoneName, json_object,
};
use super::views::{
    ActionDetail, ActionTemplate, Archived, Branch, BranchRule, Brand, CancelledRun, Rule,
    RuleStatus, RunCancel, from_row, stored_policy,
};
use crate::actions::secrets;
use crate::actors::ask;
use crate::messages::master::CancelOutcome;
use crate::messages::{MasterMsg, RefresherMsg};
use crate::metrics as m;
use crate::plan::{ResolveError, ScheduleParts, resolve_schedule, resolve_zone};
use crate::schedule::{CronSchedule, EffectivePolicy, Policy, ScheduleCache, next_after_millis};
use crate::store::rows::{
    ACTION_DETAILS, ACTION_TEMPLATES, BRANCH_RULES, BRANCHES, BRAND_RULES, BRANDS, RULES, TableSpec,
};
use crate::store::rows::{PageKey, PageOrder};
use crate::store::{CatalogScope, HistoryDelete};

type Created<T> = (StatusCode, Json<T>);

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

/// For an optional field that may be left out but not sent as `null`: the
/// document says so (not nullable), and a `null` is refused naming it.
fn present_not_null<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(deserializer).map(Some)
}

/// A `policy`: a JSON object (serde alone would also take an array of
/// its fields), or `null` for none.
fn policy_object<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Policy>, D::Error> {
    Option::<ObjectOnly<Policy>>::deserialize(deserializer).map(|p| p.map(|p| p.0))
}

/// A field of an update whose `null` means something (clear it): left out
/// is `None`, `null` is `Some(None)`.
fn null_clears<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(deserializer).map(Some)
}

/// A `policy` of an update, whose `null` means something (clear it): left
/// out is `None`, `null` is `Some(None)`.
fn nullable_policy<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Option<Policy>>, D::Error> {
    policy_object(deserializer).map(Some)
}

/// A JSON object of the caller's own keys (brand and rule `settings`).
pub type Settings = Map<String, Value>;

/// The `policy` column as a create or update writes it: the policy's
/// stored form ([`Policy::to_json_text`]), so an empty policy (`{}`) is
/// stored as none (`NULL`), as `null` is.
fn policy_column(policy: Option<&Policy>) -> Value {
    Policy::to_json_text(policy)
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or(Value::Null)
}

/// `map` with its `policy` (as [`to_map`] copied it) replaced by the
/// stored form: `Some(p)` sets it (`None` inside: clears it), `None` leaves
/// the column alone.
fn with_policy(mut map: Map<String, Value>, policy: Option<Option<&Policy>>) -> Map<String, Value> {
    map.remove("policy");
    if let Some(policy) = policy {
        map.insert("policy".into(), policy_column(policy));
    }
    map
}

/// An action's config or params: any JSON object, with `timeout_ms` (http,
/// command) and `ms` (sleep) whole milliseconds no longer than a job may
/// run (SCHEDULE_EXECUTION_TIMEOUT_SECONDS; the document states this
/// service's bound).
#[derive(Debug, Clone, Default, Serialize)]
#[serde(transparent)]
pub struct ActionConfig(pub Map<String, Value>);

impl<'de> Deserialize<'de> for ActionConfig {
    /// A duration written as a whole float (`1500.0`, an integer to JSON
    /// Schema) is kept as the integer the actions read.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut map = Map::<String, Value>::deserialize(deserializer)?;
        for (key, _) in DURATION_KEYS {
            if let Some(value) = map.get_mut(key)
                && let Some(whole) = value.as_f64().filter(|v| v.fract() == 0.0 && *v >= 0.0)
                && value.as_u64().is_none()
                && whole < u64::MAX as f64
            {
                *value = Value::from(whole as u64);
            }
        }
        Ok(ActionConfig(map))
    }
}

/// A whole number that may be written `3` or `3.0` (JSON Schema calls both
/// integers), within `T`.
fn whole_number<'de, D: Deserializer<'de>, T: TryFrom<i64>>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    use serde::de::Error;
    let Some(number) = Option::<serde_json::Number>::deserialize(deserializer)? else {
        return Ok(None);
    };
    let whole = number.as_i64().or_else(|| {
        number
            .as_f64()
            .filter(|v| v.fract() == 0.0 && v.abs() < 9.2e18)
            .map(|v| v as i64)
    });
    whole
        .and_then(|v| T::try_from(v).ok())
        .map(Some)
        .ok_or_else(|| D::Error::custom(format!("{number} is not a whole number in range")))
}

/// Config keys that are durations in milliseconds, and the least each may
/// be: a zero timeout would fail every run before it starts.
pub const DURATION_KEYS: [(&str, u64); 2] = [("timeout_ms", 1), ("ms", 0)];

/// The bound the document states before it learns this service's timeout.
const DOCUMENTED_LONGEST_ACTION_MS: u64 = 600_000;

impl PartialSchema for ActionConfig {
    fn schema() -> RefOr<Schema> {
        let mut object = json_object().description(Some(
            "Any JSON object; `timeout_ms` and `ms` are whole milliseconds up to \
             SCHEDULE_EXECUTION_TIMEOUT_SECONDS. Header values, body fields, URL \
             credentials and credential-named keys are secret: shown as `***`, and a `***` \
             sent back keeps the stored value.",
        ));
        for (key, least) in DURATION_KEYS {
            object = object.property(
                key,
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .minimum(Some(least as f64))
                    .maximum(Some(DOCUMENTED_LONGEST_ACTION_MS as f64)),
            );
        }
        object
            .examples([
                json!({"url": "https://example.com/hook", "method": "POST", "timeout_ms": 5000}),
            ])
            .into()
    }
}

impl ToSchema for ActionConfig {}

/// `timeout_ms` and `ms` in a template's config or a detail's params:
/// whole milliseconds, no longer than a job may run
/// (SCHEDULE_EXECUTION_TIMEOUT_SECONDS), since the job is timed out then
/// whatever the action waits for. Checked whatever the kind: no action can
/// outlast its job.
/// A template's config or a detail's params, as far as it can be checked
/// before it runs: its durations, and its `secret_keys`, which must not
/// silently protect nothing.
fn check_config(max_ms: u64, prefix: &str, config: Option<&ActionConfig>) -> ApiResult<()> {
    check_durations(max_ms, prefix, config)?;
    if let Some(ActionConfig(config)) = config
        && let Some((field, message)) =
            secrets::misdeclared_secret_keys(&Value::Object(config.clone()), prefix)
    {
        return Err(ApiError::field(field, message));
    }
    Ok(())
}

fn check_durations(max_ms: u64, prefix: &str, config: Option<&ActionConfig>) -> ApiResult<()> {
    let Some(ActionConfig(config)) = config else {
        return Ok(());
    };
    for (key, least) in DURATION_KEYS {
        let Some(value) = config.get(key) else {
            continue;
        };
        if value.as_u64().is_none_or(|ms| ms < least || ms > max_ms) {
            return Err(ApiError::field(
                format!("{prefix}{key}"),
                format!(
                    "{value} is not a whole number of milliseconds from {least} to {max_ms} \
                     (SCHEDULE_EXECUTION_TIMEOUT_SECONDS: a job runs no longer than that)"
                ),
            ));
        }
    }
    Ok(())
}

/// The longest an action may wait: SCHEDULE_EXECUTION_TIMEOUT_SECONDS.
pub(super) fn longest_action_ms(state: &ApiState) -> u64 {
    u64::try_from(state.config().schedule_execution_timeout.as_millis()).unwrap_or(u64::MAX)
}

/// A `***` in a create: there is no stored secret for it to keep, and
/// storing the mask would send it as the secret at every run.
fn refuse_masks(prefix: &str, config: Option<&ActionConfig>) -> ApiResult<()> {
    let Some(ActionConfig(config)) = config else {
        return Ok(());
    };
    let mut value = Value::Object(config.clone());
    if !value.to_string().contains(REDACTED) {
        return Ok(());
    }
    let column = prefix.trim_end_matches('.');
    crate::actions::secrets::restore_masked(None, &mut value, column).map_err(|field| {
        ApiError::field(
            field,
            format!("is {REDACTED:?}, which only keeps a stored secret; send the real value"),
        )
    })
}

/// The row `id` of `spec` a new row is to hang below: 409 naming `field`
/// when there is none or it is archived, so nothing lands under a row that
/// left the catalog.
async fn live_parent(
    state: &ApiState,
    spec: &TableSpec,
    what: &str,
    field: &str,
    id: Uuid,
) -> ApiResult<Map<String, Value>> {
    match state.store().row(spec, id).await? {
        None => Err(ApiError::Conflict(format!(
            "{field}: there is no {what} {id}"
        ))),
        Some(row) if is_archived(&row) => Err(ApiError::Conflict(format!(
            "{field}: {what} {id} is archived"
        ))),
        Some(row) => Ok(row),
    }
}

/// A branch rule's brand rule overrides its own rule's schedule for its
/// own branch's brand; one of another rule or brand would run the branch
/// rule on a schedule nobody meant for it. A conflict with stored rows,
/// so 409.
fn check_brand_rule_fits(
    brand_rule: &Map<String, Value>,
    rule_id: &str,
    branch: &Map<String, Value>,
) -> ApiResult<()> {
    let text = |row: &Map<String, Value>, key: &str| {
        row.get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let id = text(brand_rule, "id");
    let overrides = text(brand_rule, "rule_id");
    if !overrides.eq_ignore_ascii_case(rule_id) {
        return Err(ApiError::Conflict(format!(
            "brand_rule_id: brand rule {id} overrides rule {overrides}, not this branch rule's rule {rule_id}"
        )));
    }
    let (brand, branch_brand) = (text(brand_rule, "brand_id"), text(branch, "brand_id"));
    if !brand.eq_ignore_ascii_case(&branch_brand) {
        return Err(ApiError::Conflict(format!(
            "brand_rule_id: brand rule {id} is brand {brand}'s, and branch {} is brand {branch_brand}'s",
            text(branch, "id")
        )));
    }
    Ok(())
}

/// A branch moving to another brand would take along branch rules bound
/// to its old brand's brand rules, which no create or update of a branch
/// rule allows ([`check_brand_rule_fits`]): refused, naming them, until
/// their `brand_rule_id` is cleared.
async fn check_brand_rules_follow(
    state: &ApiState,
    branch_id: &str,
    brand_id: Uuid,
) -> ApiResult<()> {
    let branch = Value::String(parse_id("branch", branch_id)?.to_string());
    let bound = state
        .store()
        .rows(&BRANCH_RULES, Some(("branch_id", &branch)))
        .await?;
    let new_brand = brand_id.to_string();
    for branch_rule in &bound {
        let Some(brand_rule_id) = branch_rule["brand_rule_id"]
            .as_str()
            .and_then(|id| Uuid::parse_str(id).ok())
        else {
            continue;
        };
        let Some(brand_rule) = state.store().row(&BRAND_RULES, brand_rule_id).await? else {
            continue;
        };
        let owner = brand_rule["brand_id"].as_str().unwrap_or_default();
        if !owner.eq_ignore_ascii_case(&new_brand) {
            return Err(ApiError::Conflict(format!(
                "brand_id: branch rule {} runs on brand rule {brand_rule_id} of brand {owner}; \
                 clear its brand_rule_id (PUT /branch-rules/{} with \"brand_rule_id\": null) \
                 before moving the branch to brand {new_brand}",
                branch_rule["id"].as_str().unwrap_or_default(),
                branch_rule["id"].as_str().unwrap_or_default(),
            )));
        }
    }
    Ok(())
}

/// Refuses a `position` another detail of the branch rule already holds
/// (`except`: the detail being updated), since two details at one
/// position would run in an order nobody chose. A conflict with stored
/// state, so 409.
async fn check_position_free(
    state: &ApiState,
    branch_rule_id: &Value,
    position: i32,
    except: Option<&Value>,
) -> ApiResult<()> {
    let details = state
        .store()
        .rows(&ACTION_DETAILS, Some(("branch_rule_id", branch_rule_id)))
        .await?;
    let holder = details
        .iter()
        .find(|d| d["position"].as_i64() == Some(i64::from(position)) && Some(&d["id"]) != except);
    match holder {
        Some(detail) => Err(ApiError::Conflict(format!(
            "position: {position} is already the position of action detail {}; positions of a \
             branch rule's details are unique",
            detail["id"].as_str().unwrap_or("?")
        ))),
        None => Ok(()),
    }
}

// ---- paging ----------------------------------------------------------------

/// `?limit=&cursor=` of every catalog listing.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// Items per page.
    #[param(minimum = 1, maximum = 1000, default = 100)]
    limit: Option<i64>,
    /// `X-Next-Cursor` of the previous page.
    #[param(pattern = "^([0-9a-f]{2}){1,256}$")]
    cursor: Option<String>,
    /// `true`: only the archived rows (kept for their history), instead
    /// of the live ones.
    #[serde(default)]
    archived: bool,
}

/// The page size when `limit` is not given, and the most one may ask for.
pub(super) const DEFAULT_PAGE_LIMIT: i64 = 100;
pub(super) const MAX_PAGE_LIMIT: i64 = 1000;

/// `limit` checked: 1 to [`MAX_PAGE_LIMIT`], [`DEFAULT_PAGE_LIMIT`] when
/// absent.
pub(super) fn page_limit(limit: Option<i64>) -> ApiResult<i64> {
    let limit = limit.unwrap_or(DEFAULT_PAGE_LIMIT);
    if !(1..=MAX_PAGE_LIMIT).contains(&limit) {
        return Err(ApiError::field(
            "limit",
            format!("must be 1 to {MAX_PAGE_LIMIT}"),
        ));
    }
    Ok(limit)
}

/// A cursor is the hex of the last row's key (`id`, or `position/id`):
/// opaque to clients, safe in a URL, and it takes any stored id, even one
/// that is not a UUID.
fn encode_cursor(key: &PageKey) -> String {
    let text = match key.position {
        Some(position) => format!("{position}/{}", key.id),
        None => key.id.clone(),
    };
    crate::cursor::encode(text.as_bytes())
}

/// Any even run of hex digits is a place in the key order (the rows after
/// it follow), so a cursor never fails for what it holds; text that is
/// not a key this API made sorts where its bytes put it.
fn decode_cursor(order: PageOrder, cursor: &str) -> ApiResult<PageKey> {
    let bad = || ApiError::field("cursor", "is not a cursor this API returned");
    if cursor.is_empty() || cursor.len() > 512 {
        return Err(bad());
    }
    let bytes = crate::cursor::decode(cursor).ok_or_else(bad)?;
    // NUL cannot be bound as text on PostgreSQL; it sorts first anyway.
    let text: String = String::from_utf8_lossy(&bytes).replace('\0', "");
    match order {
        PageOrder::Id => Ok(PageKey {
            position: None,
            id: text,
        }),
        PageOrder::PositionThenId => Ok(match text.split_once('/') {
            Some((position, id)) if position.parse::<i32>().is_ok() => PageKey {
                position: position.parse().ok(),
                id: id.to_string(),
            },
            _ => PageKey {
                position: Some(i32::MIN),
                id: text,
            },
        }),
    }
}

/// One page of a listing: the rows as stored (the caller presents them)
/// and the cursor of the next page, `None` on the last.
async fn page_of(
    state: &ApiState,
    spec: &TableSpec,
    filter: Option<(&str, &Value)>,
    order: PageOrder,
    query: &PageQuery,
) -> ApiResult<(Vec<Map<String, Value>>, Option<String>)> {
    let limit = page_limit(query.limit)?;
    let after = query
        .cursor
        .as_deref()
        .map(|c| decode_cursor(order, c))
        .transpose()?;
    let rows = state
        .store()
        .rows_page(spec, filter, query.archived, order, after.as_ref(), limit)
        .await?;
    let full = i64::try_from(rows.len()).is_ok_and(|n| n >= limit);
    let next = rows.last().filter(|_| full).map(|last| {
        encode_cursor(&PageKey {
            position: match order {
                PageOrder::Id => None,
                PageOrder::PositionThenId => last["position"]
                    .as_i64()
                    .and_then(|p| i32::try_from(p).ok()),
            },
            id: last["id"].as_str().unwrap_or_default().to_string(),
        })
    });
    Ok((rows, next))
}

/// A page as the API answers it: the JSON array of its items (the shape
/// listings always had) and, unless it is the last page, the next page's
/// cursor in `X-Next-Cursor` and as a `Link: <…>; rel="next"` (RFC 8288)
/// to `path` with the same limit and `archived`.
fn paged<T>(path: &str, query: &PageQuery, items: Vec<T>, next: Option<String>) -> Page<T> {
    let mut headers = HeaderMap::new();
    if let Some(cursor) = next {
        let mut link = format!("<{}{path}?", super::routes::PREFIX);
        if let Some(limit) = query.limit {
            link.push_str(&format!("limit={limit}&"));
        }
        // The next page of the same listing: the archived rows again.
        if query.archived {
            link.push_str("archived=true&");
        }
        link.push_str(&format!("cursor={cursor}>; rel=\"next\""));
        // Hex and ASCII paths only: always a valid header value.
        if let (Ok(cursor), Ok(link)) =
            (HeaderValue::from_str(&cursor), HeaderValue::from_str(&link))
        {
            headers.insert(NEXT_CURSOR, cursor);
            headers.insert(header::LINK, link);
        }
    }
    (headers, Json(items))
}

/// The header holding the next page's cursor.
pub const NEXT_CURSOR: &str = "x-next-cursor";

type Page<T> = (HeaderMap, Json<Vec<T>>);

/// Stored rows read into their views.
fn views<T: DeserializeOwned>(rows: Vec<Map<String, Value>>) -> ApiResult<Vec<T>> {
    rows.into_iter().map(from_row).collect()
}

// ---- generic handlers ------------------------------------------------------

/// Whether a row was archived (`archived_at`, or a branch rule's
/// `is_archived`).
fn is_archived(row: &Map<String, Value>) -> bool {
    row.get("archived_at").is_some_and(|v| !v.is_null())
        || row.get("is_archived") == Some(&Value::Bool(true))
}

/// The row `id` of `spec`: 404 when there is none, 410 when it was
/// archived (it has left the catalog; `?archived=true` lists it).
pub(super) async fn get_row(
    state: &ApiState,
    spec: &TableSpec,
    what: &'static str,
    id: &str,
) -> ApiResult<Map<String, Value>> {
    let uuid = parse_id(what, id)?;
    let row = state
        .store()
        .row(spec, uuid)
        .await?
        .ok_or_else(|| ApiError::not_found(what, id))?;
    if is_archived(&row) {
        return Err(ApiError::Archived {
            what,
            id: id.to_string(),
        });
    }
    Ok(row)
}

/// Who created a row is who last changed it, until someone else does.
fn stamp_created(row: &mut Map<String, Value>, caller: &Caller) {
    row.insert("created_by".into(), caller.name().into());
    row.insert("updated_by".into(), caller.name().into());
}

async fn insert_one<T: DeserializeOwned>(
    state: &ApiState,
    spec: &'static TableSpec,
    mut row: Map<String, Value>,
    caller: &Caller,
) -> ApiResult<Created<T>> {
    let now = state.clock().now_ms();
    let id = Uuid::new_v4();
    row.insert("id".into(), Value::String(id.to_string()));
    row.insert("created_at".into(), now.into());
    row.insert("updated_at".into(), now.into());
    stamp_created(&mut row, caller);
    state.store().insert_rows(&[(spec, row)]).await?;
    nudge(state);
    let row = state
        .store()
        .row(spec, id)
        .await?
        .ok_or_else(|| ApiError::not_found("row", id))?;
    Ok((StatusCode::CREATED, Json(from_row(row)?)))
}

async fn update_one(
    state: &ApiState,
    spec: &'static TableSpec,
    what: &'static str,
    id: &str,
    changes: Map<String, Value>,
    caller: &Caller,
) -> ApiResult<Map<String, Value>> {
    let pending = prepare_update(state, spec, what, id, changes, caller).await?;
    save_update(state, pending, Vec::new()).await
}

/// A checked update of one row, not saved yet: the columns it sets, so
/// what follows from it (the next runs a new expression or zone moves)
/// can be computed as if it were saved, and saved with it.
struct PendingUpdate {
    spec: &'static TableSpec,
    what: &'static str,
    id: Uuid,
    changes: Map<String, Value>,
}

impl PendingUpdate {
    /// The stored `row` of `spec` and `id` as this update leaves it.
    fn apply_to(&self, spec: &TableSpec, id: Uuid, row: &mut Map<String, Value>) {
        if self.spec.table == spec.table && self.id == id {
            row.extend(self.changes.clone());
        }
    }
}

async fn prepare_update(
    state: &ApiState,
    spec: &'static TableSpec,
    what: &'static str,
    id: &str,
    mut changes: Map<String, Value>,
    caller: &Caller,
) -> ApiResult<PendingUpdate> {
    let uuid = parse_id(what, id)?;
    let stored = get_row(state, spec, what, id).await?;
    keep_stored_secrets(&stored, &mut changes)?;
    changes.insert("updated_at".into(), state.clock().now_ms().into());
    changes.insert("updated_by".into(), caller.name().into());
    Ok(PendingUpdate {
        spec,
        what,
        id: uuid,
        changes,
    })
}

/// Saves `pending` and the updates that follow from it in one transaction:
/// a crash or a refused write between them would otherwise leave, say, a
/// rule's new expression with its branch rules' next runs from the old one.
async fn save_update(
    state: &ApiState,
    pending: PendingUpdate,
    follow_ups: Vec<RowUpdate>,
) -> ApiResult<Map<String, Value>> {
    let PendingUpdate {
        spec,
        what,
        id,
        changes,
    } = pending;
    let mut updates = vec![(spec, id, changes)];
    updates.extend(follow_ups);
    if !state.store().update_rows(&updates).await?[0] {
        return Err(ApiError::not_found(what, id));
    }
    nudge(state);
    state
        .store()
        .row(spec, id)
        .await?
        .ok_or_else(|| ApiError::not_found(what, id))
}

/// Saves `pending`, a change of a rule or a branch, with the next runs it
/// moves of the branch rules whose `column` names its row, when it moves
/// them (`Some`), in one transaction.
async fn save_update_with_next_runs(
    state: &ApiState,
    pending: PendingUpdate,
    column: Option<&str>,
) -> ApiResult<Map<String, Value>> {
    let moved = match column {
        Some(column) => {
            let id = Value::String(pending.id.to_string());
            next_runs_moved_by(state, &pending, (column, &id)).await?
        }
        None => Vec::new(),
    };
    save_update(state, pending, moved).await
}

/// One row's update: its table, its id and the columns it sets.
type RowUpdate = (&'static TableSpec, Uuid, Map<String, Value>);

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

/// `?cascade=archive` on the deletes of rows with history (DESIGN §5).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DeleteQuery {
    /// `archive`: hide the rows from listings and the plan, cancel their
    /// running jobs and keep their history, instead of a 409 when they
    /// have executions.
    cascade: Option<Cascade>,
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Cascade {
    Archive,
}

/// Deletes brands, branches, rules or branch rules, keeping history: a row
/// with executions below it is refused (409, saying how to archive) and
/// nothing is deleted, since the cascades would erase them. With
/// `?cascade=archive` the rows are archived instead: hidden from listings
/// and the plan, history kept, and every running job below them
/// cancelled.
async fn delete_keeping_history(
    state: &ApiState,
    spec: &'static TableSpec,
    what: &'static str,
    scope: CatalogScope,
    ids: &str,
    query: DeleteQuery,
) -> ApiResult<Response> {
    let archive = matches!(query.cascade, Some(Cascade::Archive));
    let mut uuids = Vec::new();
    for part in ids.split(',') {
        let uuid = parse_id(what, part.trim())?;
        if state.store().row(spec, uuid).await?.is_none() {
            return Err(ApiError::not_found(what, part.trim()));
        }
        uuids.push(uuid);
    }
    if !archive {
        return match state.store().delete_without_history(scope, &uuids).await? {
            HistoryDelete::Deleted => {
                nudge(state);
                Ok(StatusCode::NO_CONTENT.into_response())
            }
            HistoryDelete::Gone(id) => Err(ApiError::not_found(what, id)),
            HistoryDelete::Refused { id, executions } => {
                info!(%what, %id, executions, "🗄️ Delete refused: the {what} has execution history");
                metrics::counter!(m::CATALOG_DELETES_REFUSED_TOTAL, "table" => spec.table)
                    .increment(1);
                Err(ApiError::Conflict(format!(
                    "{what} {id} has {executions} execution(s) in its history, which deleting \
                     it would erase; nothing was deleted. Archive it instead with \
                     DELETE {}/{}/{ids}?cascade=archive: it leaves listings and the plan, \
                     its running jobs are cancelled and its history is kept",
                    super::routes::PREFIX,
                    spec.table.replace('_', "-"),
                )))
            }
        };
    }
    let now = state.clock().now_ms();
    let branch_rules = state.store().archive(scope, &uuids, now).await?;
    for uuid in &uuids {
        info!(%what, id = %uuid, branch_rules = branch_rules.len(), "🗄️ Archived {what} {uuid}; its history is kept");
    }
    metrics::counter!(m::CATALOG_ARCHIVED_TOTAL, "table" => spec.table)
        .increment(uuids.len() as u64);
    nudge(state);
    let cancelled = cancel_running(state, &branch_rules).await?;
    Ok((
        StatusCode::OK,
        Json(Archived {
            archived: uuids,
            branch_rules_archived: branch_rules,
            cancelled,
        }),
    )
        .into_response())
}

/// Cancels the open execution of each branch rule, wherever it runs: here
/// through the master, on another instance through the recorded request
/// its owner acts on at its next lease round.
async fn cancel_running(state: &ApiState, branch_rules: &[Uuid]) -> ApiResult<Vec<CancelledRun>> {
    let mut cancelled = Vec::new();
    for branch_rule_id in branch_rules {
        let Some(execution) = state.store().open_execution_of(*branch_rule_id).await? else {
            continue;
        };
        let outcome = match state.directory().master() {
            Some(master) => {
                ask(&master, |reply| MasterMsg::Cancel {
                    execution_id: execution.id,
                    reply,
                })
                .await?
            }
            None => CancelOutcome::NotInFlight,
        };
        let outcome = if outcome == CancelOutcome::NotInFlight {
            match state.store().request_cancel(execution.id).await? {
                Some(_) => RunCancel::CancelRequested,
                None => continue,
            }
        } else {
            outcome.into()
        };
        info!(%branch_rule_id, execution_id = %execution.id, "🛑 Cancelling the running job of an archived branch rule");
        cancelled.push(CancelledRun {
            branch_rule_id: *branch_rule_id,
            execution_id: execution.id,
            owner: execution.owner,
            outcome,
        });
    }
    Ok(cancelled)
}

/// One page of a top-level listing (archived rows left out), by id.
async fn list_all<T: DeserializeOwned>(
    state: &ApiState,
    spec: &TableSpec,
    query: PageQuery,
) -> ApiResult<Page<T>> {
    let (rows, next) = page_of(state, spec, None, PageOrder::Id, &query).await?;
    let path = format!("/{}", spec.table.replace('_', "-"));
    Ok(paged(&path, &query, views(rows)?, next))
}

// ---- brands ----------------------------------------------------------------

#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BrandCreate {
    name: Name,
    /// Defaults to `{}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<JsonObject>)]
    settings: Option<Settings>,
}

/// Fields left out (or `null`) keep their stored values.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BrandUpdate {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<Name>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<JsonObject>)]
    settings: Option<Settings>,
}

#[utoipa::path(post, path = "/brands", tag = "brands", request_body = BrandCreate,
    responses((status = 201, description = "Created", body = Brand)), security(("bearer" = [])))]
pub async fn create_brand(
    State(s): State<ApiState>,
    caller: Caller,
    ApiJson(input): ApiJson<BrandCreate>,
) -> ApiResult<Created<Brand>> {
    let mut map = to_map(&input);
    map.entry("settings").or_insert(json!({}));
    insert_one(&s, &BRANDS, map, &caller).await
}

#[utoipa::path(get, path = "/brands", tag = "brands", params(PageQuery),
    responses((status = 200, description = "A page of brands, by id", body = Vec<Brand>,
        headers(("x-next-cursor" = String, description = "The next page's cursor; absent on the last page"),
                ("link" = String, description = "rel=\"next\": the next page's URL")))))]
pub async fn list_brands(
    State(s): State<ApiState>,
    Query(query): Query<PageQuery>,
) -> ApiResult<Page<Brand>> {
    list_all(&s, &BRANDS, query).await
}

#[utoipa::path(get, path = "/brands/{id}", tag = "brands",
    params(("id" = Uuid, Path, description = "Brand id")),
    responses((status = 200, description = "The brand", body = Brand)))]
pub async fn get_brand(
    State(s): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Brand>> {
    Ok(Json(from_row(get_row(&s, &BRANDS, "brand", &id).await?)?))
}

#[utoipa::path(put, path = "/brands/{id}", tag = "brands", request_body = BrandUpdate,
    params(("id" = Uuid, Path, description = "Brand id")),
    responses((status = 200, description = "The brand as changed", body = Brand)),
    security(("bearer" = [])))]
pub async fn update_brand(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    caller: Caller,
    ApiJson(input): ApiJson<BrandUpdate>,
) -> ApiResult<Json<Brand>> {
    let row = update_one(&s, &BRANDS, "brand", &id, to_map(&input), &caller).await?;
    Ok(Json(from_row(row)?))
}

#[utoipa::path(delete, path = "/brands/{id}", tag = "brands",
    params(("id" = String, Path, description = "One brand id, or several separated by commas"), DeleteQuery),
    responses((status = 204, description = "Deleted"),
        (status = 200, description = "Archived (`?cascade=archive`)", body = Archived)),
    security(("bearer" = [])))]
pub async fn delete_brand(
    State(s): State<ApiState>,
    Path(ids): Path<String>,
    Query(query): Query<DeleteQuery>,
) -> ApiResult<Response> {
    delete_keeping_history(&s, &BRANDS, "brand", CatalogScope::Brand, &ids, query).await
}

// ---- branches --------------------------------------------------------------

#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BranchCreate {
    brand_id: Uuid,
    name: Name,
    /// `null` or left out: DEFAULT_TIMEZONE.
    #[serde(skip_serializing_if = "Option::is_none")]
    timezone: Option<ZoneName>,
    /// Defaults to `true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    is_active: Option<bool>,
}

/// Fields left out (or `null`) keep their stored values, but for
/// `timezone`, which `null` clears.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BranchUpdate {
    #[serde(skip_serializing_if = "Option::is_none")]
    brand_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<Name>,
    /// `null` clears it: DEFAULT_TIMEZONE applies again, as on a branch
    /// created without one.
    #[serde(
        default,
        deserialize_with = "null_clears",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<ZoneName>)]
    timezone: Option<Option<ZoneName>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    is_active: Option<bool>,
}

#[utoipa::path(post, path = "/branches", tag = "branches", request_body = BranchCreate,
    responses((status = 201, description = "Created", body = Branch)), security(("bearer" = [])))]
pub async fn create_branch(
    State(s): State<ApiState>,
    caller: Caller,
    ApiJson(input): ApiJson<BranchCreate>,
) -> ApiResult<Created<Branch>> {
    live_parent(&s, &BRANDS, "brand", "brand_id", input.brand_id).await?;
    let mut map = to_map(&input);
    map.entry("is_active").or_insert(Value::Bool(true));
    insert_one(&s, &BRANCHES, map, &caller).await
}

#[utoipa::path(get, path = "/branches", tag = "branches", params(PageQuery),
    responses((status = 200, description = "A page of branches, by id", body = Vec<Branch>,
        headers(("x-next-cursor" = String, description = "The next page's cursor; absent on the last page"),
                ("link" = String, description = "rel=\"next\": the next page's URL")))))]
pub async fn list_branches(
    State(s): State<ApiState>,
    Query(query): Query<PageQuery>,
) -> ApiResult<Page<Branch>> {
    list_all(&s, &BRANCHES, query).await
}

#[utoipa::path(get, path = "/branches/{id}", tag = "branches",
    params(("id" = Uuid, Path, description = "Branch id")),
    responses((status = 200, description = "The branch", body = Branch)))]
pub async fn get_branch(
    State(s): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Branch>> {
    Ok(Json(from_row(
        get_row(&s, &BRANCHES, "branch", &id).await?,
    )?))
}

#[utoipa::path(put, path = "/branches/{id}", tag = "branches", request_body = BranchUpdate,
    params(("id" = Uuid, Path, description = "Branch id")),
    responses((status = 200, description = "The branch as changed", body = Branch)),
    security(("bearer" = [])))]
pub async fn update_branch(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    caller: Caller,
    ApiJson(input): ApiJson<BranchUpdate>,
) -> ApiResult<Json<Branch>> {
    if let Some(brand_id) = input.brand_id {
        live_parent(&s, &BRANDS, "brand", "brand_id", brand_id).await?;
        check_brand_rules_follow(&s, &id, brand_id).await?;
    }
    let pending = prepare_update(&s, &BRANCHES, "branch", &id, to_map(&input), &caller).await?;
    // A new zone moves every fixed-time occurrence of the branch's rules.
    let moves = input.timezone.is_some().then_some("branch_id");
    let row = save_update_with_next_runs(&s, pending, moves).await?;
    Ok(Json(from_row(row)?))
}

#[utoipa::path(delete, path = "/branches/{id}", tag = "branches",
    params(("id" = String, Path, description = "One branch id, or several separated by commas"), DeleteQuery),
    responses((status = 204, description = "Deleted"),
        (status = 200, description = "Archived (`?cascade=archive`)", body = Archived)),
    security(("bearer" = [])))]
pub async fn delete_branch(
    State(s): State<ApiState>,
    Path(ids): Path<String>,
    Query(query): Query<DeleteQuery>,
) -> ApiResult<Response> {
    delete_keeping_history(&s, &BRANCHES, "branch", CatalogScope::Branch, &ids, query).await
}

// ---- rules -----------------------------------------------------------------

#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RuleCreate {
    /// The brand owning the rule; `null` for a rule every brand may use.
    #[serde(skip_serializing_if = "Option::is_none")]
    brand_id: Option<Uuid>,
    name: Name,
    /// Defaults to `active`.
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<RuleStatus>,
    cron_expression: CronText,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<JsonObject>)]
    settings: Option<Settings>,
    /// The scheduling policy of its branch rules, each of which may
    /// override any field; `null`, `{}` or left out: none (the defaults).
    #[serde(
        default,
        deserialize_with = "policy_object",
        skip_serializing_if = "Option::is_none"
    )]
    policy: Option<Policy>,
}

/// Fields left out (or `null`) keep their stored values, except `policy`,
/// which `null` clears.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RuleUpdate {
    /// `null` clears it: the rule becomes global, for every brand.
    #[serde(
        default,
        deserialize_with = "null_clears",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<Uuid>)]
    brand_id: Option<Option<Uuid>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<Name>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<RuleStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cron_expression: Option<CronText>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<JsonObject>)]
    settings: Option<Settings>,
    /// Replaces the stored policy whole; `null` or `{}` clears it, left
    /// out keeps it.
    #[serde(
        default,
        deserialize_with = "nullable_policy",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<Policy>)]
    policy: Option<Option<Policy>>,
}

#[utoipa::path(post, path = "/rules", tag = "rules", request_body = RuleCreate,
    responses((status = 201, description = "Created", body = Rule)), security(("bearer" = [])))]
pub async fn create_rule(
    State(s): State<ApiState>,
    caller: Caller,
    ApiJson(input): ApiJson<RuleCreate>,
) -> ApiResult<Created<Rule>> {
    if let Some(brand_id) = input.brand_id {
        live_parent(&s, &BRANDS, "brand", "brand_id", brand_id).await?;
    }
    let mut map = with_policy(to_map(&input), input.policy.as_ref().map(Some));
    map.entry("status")
        .or_insert(Value::String("active".into()));
    map.entry("settings").or_insert(json!({}));
    insert_one(&s, &RULES, map, &caller).await
}

#[utoipa::path(get, path = "/rules", tag = "rules", params(PageQuery),
    responses((status = 200, description = "A page of rules, by id", body = Vec<Rule>,
        headers(("x-next-cursor" = String, description = "The next page's cursor; absent on the last page"),
                ("link" = String, description = "rel=\"next\": the next page's URL")))))]
pub async fn list_rules(
    State(s): State<ApiState>,
    Query(query): Query<PageQuery>,
) -> ApiResult<Page<Rule>> {
    list_all(&s, &RULES, query).await
}

#[utoipa::path(get, path = "/rules/{id}", tag = "rules",
    params(("id" = Uuid, Path, description = "Rule id")),
    responses((status = 200, description = "The rule", body = Rule)))]
pub async fn get_rule(State(s): State<ApiState>, Path(id): Path<String>) -> ApiResult<Json<Rule>> {
    Ok(Json(from_row(get_row(&s, &RULES, "rule", &id).await?)?))
}

#[utoipa::path(put, path = "/rules/{id}", tag = "rules", request_body = RuleUpdate,
    params(("id" = Uuid, Path, description = "Rule id")),
    responses((status = 200, description = "The rule as changed", body = Rule)),
    security(("bearer" = [])))]
pub async fn update_rule(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    caller: Caller,
    ApiJson(input): ApiJson<RuleUpdate>,
) -> ApiResult<Json<Rule>> {
    if let Some(Some(brand_id)) = input.brand_id {
        live_parent(&s, &BRANDS, "brand", "brand_id", brand_id).await?;
    }
    let map = with_policy(to_map(&input), input.policy.as_ref().map(Option::as_ref));
    let pending = prepare_update(&s, &RULES, "rule", &id, map, &caller).await?;
    let moves = input.cron_expression.is_some().then_some("rule_id");
    let row = save_update_with_next_runs(&s, pending, moves).await?;
    Ok(Json(from_row(row)?))
}

#[utoipa::path(delete, path = "/rules/{id}", tag = "rules",
    params(("id" = String, Path, description = "One rule id, or several separated by commas"), DeleteQuery),
    responses((status = 204, description = "Deleted"),
        (status = 200, description = "Archived (`?cascade=archive`)", body = Archived)),
    security(("bearer" = [])))]
pub async fn delete_rule(
    State(s): State<ApiState>,
    Path(ids): Path<String>,
    Query(query): Query<DeleteQuery>,
) -> ApiResult<Response> {
    delete_keeping_history(&s, &RULES, "rule", CatalogScope::Rule, &ids, query).await
}

// ---- action templates ------------------------------------------------------

/// An action kind this service runs; the document lists this service's
/// (`command` only with COMMAND_ACTIONS_ENABLED=true).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ActionKind(pub String);

impl PartialSchema for ActionKind {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(["http", "sleep", "noop"]))
            .examples(["http"])
            .into()
    }
}

impl ToSchema for ActionKind {}

#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateCreate {
    name: Name,
    kind: ActionKind,
    /// Defaults to `{}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    config: Option<ActionConfig>,
}

/// Fields left out (or `null`) keep their stored values.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateUpdate {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<Name>,
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<ActionKind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    config: Option<ActionConfig>,
}

/// The kind is one this service runs, and the config's durations fit.
fn check_template(
    state: &ApiState,
    kind: Option<&ActionKind>,
    config: Option<&ActionConfig>,
) -> ApiResult<()> {
    if let Some(ActionKind(kind)) = kind {
        let mut kinds = state.registry().kinds();
        if !kinds.contains(kind) {
            kinds.sort();
            return Err(ApiError::field(
                "kind",
                format!("unknown kind {kind:?}; known kinds: {}", kinds.join(", ")),
            ));
        }
        // Stored, it would only fail at every run; say so now.
        if kind == "command" && !state.config().command_actions_enabled {
            return Err(ApiError::field(
                "kind",
                "command actions are disabled on this service: start it with \
                 COMMAND_ACTIONS_ENABLED=true to allow \"command\" templates",
            ));
        }
    }
    check_config(longest_action_ms(state), "config.", config)
}

#[utoipa::path(post, path = "/action-templates", tag = "action templates",
    request_body = TemplateCreate,
    responses((status = 201, description = "Created", body = ActionTemplate)),
    security(("bearer" = [])))]
pub async fn create_template(
    State(s): State<ApiState>,
    caller: Caller,
    ApiJson(input): ApiJson<TemplateCreate>,
) -> ApiResult<Created<ActionTemplate>> {
    check_template(&s, Some(&input.kind), input.config.as_ref())?;
    refuse_masks("config", input.config.as_ref())?;
    let mut map = to_map(&input);
    map.entry("config").or_insert(json!({}));
    insert_one(&s, &ACTION_TEMPLATES, map, &caller).await
}

#[utoipa::path(get, path = "/action-templates", tag = "action templates", params(PageQuery),
    responses((status = 200, description = "A page of action templates, by id", body = Vec<ActionTemplate>,
        headers(("x-next-cursor" = String, description = "The next page's cursor; absent on the last page"),
                ("link" = String, description = "rel=\"next\": the next page's URL")))))]
pub async fn list_templates(
    State(s): State<ApiState>,
    Query(query): Query<PageQuery>,
) -> ApiResult<Page<ActionTemplate>> {
    list_all(&s, &ACTION_TEMPLATES, query).await
}

#[utoipa::path(get, path = "/action-templates/{id}", tag = "action templates",
    params(("id" = Uuid, Path, description = "Action template id")),
    responses((status = 200, description = "The action template", body = ActionTemplate)))]
pub async fn get_template(
    State(s): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<Json<ActionTemplate>> {
    Ok(Json(from_row(
        get_row(&s, &ACTION_TEMPLATES, "action template", &id).await?,
    )?))
}

#[utoipa::path(put, path = "/action-templates/{id}", tag = "action templates",
    request_body = TemplateUpdate,
    params(("id" = Uuid, Path, description = "Action template id")),
    responses((status = 200, description = "The action template as changed", body = ActionTemplate)),
    security(("bearer" = [])))]
pub async fn update_template(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    caller: Caller,
    ApiJson(input): ApiJson<TemplateUpdate>,
) -> ApiResult<Json<ActionTemplate>> {
    check_template(&s, input.kind.as_ref(), input.config.as_ref())?;
    let row = update_one(
        &s,
        &ACTION_TEMPLATES,
        "action template",
        &id,
        to_map(&input),
        &caller,
    )
    .await?;
    Ok(Json(from_row(row)?))
}

#[utoipa::path(delete, path = "/action-templates/{id}", tag = "action templates",
    params(("id" = String, Path, description = "One action template id, or several separated by commas")),
    responses((status = 204, description = "Deleted")),
    security(("bearer" = [])))]
pub async fn delete_template(
    State(s): State<ApiState>,
    Path(ids): Path<String>,
) -> ApiResult<StatusCode> {
    delete_ids(&s, &ACTION_TEMPLATES, "action template", &ids).await
}

// ---- branch rules ----------------------------------------------------------

/// The daily operation window is set as a pair: both bounds or neither.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BranchRuleCreate {
    branch_id: Uuid,
    rule_id: Uuid,
    /// A brand rule whose cron expression overrides the rule's.
    #[serde(skip_serializing_if = "Option::is_none")]
    brand_rule_id: Option<Uuid>,
    /// Defaults to `true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    is_active: Option<bool>,
    /// Opens the window, `HH:MM` in the branch's zone (with
    /// `operation_time_to`; a window may cross midnight).
    #[serde(
        default,
        deserialize_with = "present_not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = TimeOfDayText)]
    operation_time_from: Option<TimeOfDayText>,
    #[serde(
        default,
        deserialize_with = "present_not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = TimeOfDayText)]
    operation_time_to: Option<TimeOfDayText>,
    /// Default: the next cron occurrence in the branch's zone.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_run_time: Option<RequestTime>,
    #[serde(skip_serializing_if = "Option::is_none")]
    params: Option<ActionConfig>,
    /// Overrides fields of its rule's policy; `null`, `{}` or left out:
    /// the rule's policy as it is.
    #[serde(
        default,
        deserialize_with = "policy_object",
        skip_serializing_if = "Option::is_none"
    )]
    policy: Option<Policy>,
    /// The rule's actions, inserted in the same transaction so the rule
    /// never runs without them. A detail without a position takes its
    /// index in the list.
    #[serde(skip_serializing)]
    action_details: Option<Vec<ActionDetailCreate>>,
}

/// Fields left out (or `null`) keep their stored values, except `policy`,
/// `brand_rule_id` and the window, which `null` clears; the window is
/// changed as a pair.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BranchRuleUpdate {
    #[serde(skip_serializing_if = "Option::is_none")]
    branch_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rule_id: Option<Uuid>,
    /// `null` clears it: the rule's own expression applies again (needed
    /// to move a branch rule to a rule or brand its brand rule is not of).
    #[serde(
        default,
        deserialize_with = "null_clears",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<Uuid>)]
    brand_rule_id: Option<Option<Uuid>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    is_active: Option<bool>,
    /// `false` resumes a force-stopped rule (its missed occurrences go by
    /// its misfire policy). `true` force-stops it, as
    /// `POST /branch-rules/{id}/force-stop` does: a run in progress is
    /// cancelled by the instance running it.
    #[serde(skip_serializing_if = "Option::is_none")]
    is_force_stopped: Option<bool>,
    /// Changed as a pair with `operation_time_to`; `null` on both removes
    /// the window.
    #[serde(
        default,
        deserialize_with = "null_clears",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<TimeOfDayText>)]
    operation_time_from: Option<Option<TimeOfDayText>>,
    #[serde(
        default,
        deserialize_with = "null_clears",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<TimeOfDayText>)]
    operation_time_to: Option<Option<TimeOfDayText>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_run_time: Option<RequestTime>,
    #[serde(skip_serializing_if = "Option::is_none")]
    params: Option<ActionConfig>,
    /// Replaces its stored policy whole; `null` or `{}` clears it (the
    /// rule's policy applies as it is), left out keeps it.
    #[serde(
        default,
        deserialize_with = "nullable_policy",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<Policy>)]
    policy: Option<Option<Policy>>,
}

/// A window has both bounds or neither: one alone would silently mean no
/// window at all.
/// An update's window: both bounds set, both `null` (no window), or both
/// left out.
fn check_window_update(
    from: Option<Option<&TimeOfDayText>>,
    to: Option<Option<&TimeOfDayText>>,
) -> ApiResult<()> {
    match (from, to) {
        (Some(None), Some(None)) | (None, None) => Ok(()),
        (Some(None), _) | (_, Some(None)) => Err(ApiError::field(
            if from == Some(None) {
                "operation_time_to"
            } else {
                "operation_time_from"
            },
            "must be null with the other window bound: `null` on both \
             operation_time_from and operation_time_to removes the window",
        )),
        (from, to) => check_window(from.flatten(), to.flatten()),
    }
}

fn check_window(from: Option<&TimeOfDayText>, to: Option<&TimeOfDayText>) -> ApiResult<()> {
    let missing = match (from, to) {
        (Some(_), None) => "operation_time_to",
        (None, Some(_)) => "operation_time_from",
        _ => return Ok(()),
    };
    Err(ApiError::field(
        missing,
        "is required with the other window bound: a window needs both \
         operation_time_from and operation_time_to (HH:MM), or neither for no window",
    ))
}

/// The next_run_time a client set, as the epoch ms the row holds. A time
/// set by hand reschedules the rule: a pending retry (or an occurrence
/// owed its run) ends with it, or the run at that time would be labelled
/// an attempt of the old occurrence.
fn with_next_run(mut map: Map<String, Value>, next: Option<RequestTime>) -> Map<String, Value> {
    if let Some(RequestTime(ms)) = next {
        map.insert("next_run_time".into(), ms.into());
        map.insert("retry_of".into(), Value::Null);
        map.insert("failed_attempts".into(), 0.into());
    }
    map
}

/// The branch's zone (or DEFAULT_TIMEZONE) of a branch rule row, by the
/// one resolver: a stored zone that is not an IANA name is an error, never
/// the default.
async fn zone_of_branch(
    state: &ApiState,
    branch_id: &Value,
) -> ApiResult<Result<Tz, ResolveError>> {
    let default_zone = state.config().default_timezone;
    let Some(id) = branch_id.as_str().and_then(|s| Uuid::parse_str(s).ok()) else {
        return Ok(Ok(default_zone));
    };
    let branch = state.store().row(&BRANCHES, id).await?;
    let timezone = branch
        .as_ref()
        .and_then(|b| b.get("timezone"))
        .and_then(Value::as_str);
    Ok(resolve_zone(id, timezone, default_zone))
}

/// The stored values a branch rule's schedule is made of: its branch and
/// zone, its rule and expression (`None`: no such rule), and its brand
/// rule's override when it sets one.
type StoredSchedule = (
    (Uuid, Option<String>),
    (Uuid, Option<String>),
    Option<(Uuid, String)>,
);

/// Reads [`StoredSchedule`] for a branch rule row, as `pending` leaves the
/// rows it is read from; the one resolver ([`resolve_schedule`]) decides
/// what it means.
async fn expression_of(
    state: &ApiState,
    row: &Map<String, Value>,
    pending: Option<&PendingUpdate>,
) -> ApiResult<StoredSchedule> {
    let id = |key: &str| {
        row.get(key)
            .and_then(Value::as_str)
            .and_then(|s| Uuid::parse_str(s).ok())
    };
    let text = |row: Option<Map<String, Value>>, column: &str| {
        row.and_then(|r| r.get(column).and_then(Value::as_str).map(String::from))
    };
    let read = async |spec: &'static TableSpec, id: Uuid| -> ApiResult<_> {
        let mut row = state.store().row(spec, id).await?;
        if let (Some(row), Some(pending)) = (row.as_mut(), pending) {
            pending.apply_to(spec, id, row);
        }
        Ok(row)
    };
    let branch_id = id("branch_id").unwrap_or_default();
    let timezone = match id("branch_id") {
        Some(branch) => text(read(&BRANCHES, branch).await?, "timezone"),
        None => None,
    };
    let rule_id = id("rule_id").unwrap_or_default();
    let rule = match id("rule_id") {
        Some(rule) => text(read(&RULES, rule).await?, "cron_expression"),
        None => None,
    };
    let brand_rule = match id("brand_rule_id") {
        Some(brand_rule) => text(read(&BRAND_RULES, brand_rule).await?, "cron_expression")
            .map(|expression| (brand_rule, expression)),
        None => None,
    };
    Ok(((branch_id, timezone), (rule_id, rule), brand_rule))
}

/// The cron schedule and zone of a branch rule row, by the one resolver
/// the plan and the worker use.
pub(super) async fn schedule_of_row(
    state: &ApiState,
    row: &Map<String, Value>,
) -> ApiResult<Result<(CronSchedule, Tz), ResolveError>> {
    schedule_as_pending_leaves_it(state, row, None).await
}

/// [`schedule_of_row`] as `pending` leaves the rows it is made of.
async fn schedule_as_pending_leaves_it(
    state: &ApiState,
    row: &Map<String, Value>,
    pending: Option<&PendingUpdate>,
) -> ApiResult<Result<(CronSchedule, Tz), ResolveError>> {
    let ((branch_id, timezone), (rule_id, rule), brand_rule) =
        expression_of(state, row, pending).await?;
    let parts = ScheduleParts {
        branch: (branch_id, timezone.as_deref()),
        rule: (rule_id, rule.as_deref()),
        brand_rule: brand_rule.as_ref().map(|(id, e)| (*id, e.as_str())),
    };
    let default_zone = state.config().default_timezone;
    Ok(resolve_schedule(
        &parts,
        default_zone,
        &mut ScheduleCache::default(),
    ))
}

/// The next run of a branch rule row after now. No rule yet means none (the
/// insert then names the missing rule); a stored zone or expression that is
/// invalid is a 409 naming the row, and nothing is saved.
async fn next_run_of(
    state: &ApiState,
    row: &Map<String, Value>,
    pending: Option<&PendingUpdate>,
) -> ApiResult<Option<i64>> {
    match schedule_as_pending_leaves_it(state, row, pending).await? {
        Ok((schedule, zone)) => Ok(next_after_millis(&schedule, zone, state.clock().now_ms()).ok()),
        Err(ResolveError::Missing { .. }) => Ok(None),
        Err(e) => Err(ApiError::Conflict(format!("no next run: {e}"))),
    }
}

/// When a rule's cron, a branch's zone or a branch rule's rule, branch or
/// brand rule changes (`pending`): the next run of every branch rule
/// `filter` selects, recomputed from the expression as `pending` leaves it
/// (never shifted), as updates to save with it.
async fn next_runs_moved_by(
    state: &ApiState,
    pending: &PendingUpdate,
    filter: (&str, &Value),
) -> ApiResult<Vec<RowUpdate>> {
    let mut moved = Vec::new();
    for mut row in state.store().rows(&BRANCH_RULES, Some(filter)).await? {
        let Some(id) = row
            .get("id")
            .and_then(Value::as_str)
            .and_then(|s| Uuid::parse_str(s).ok())
        else {
            continue;
        };
        pending.apply_to(&BRANCH_RULES, id, &mut row);
        // A pending retry (or an occurrence owed its run) keeps its time:
        // moved to the new schedule's first occurrence, a retry due in a
        // minute waited up to a day. The finish after it computes the next
        // run from the new schedule.
        if row.get("retry_of").is_some_and(|v| !v.is_null()) {
            tracing::info!(branch_rule_id = %id, "Next run kept: a retry is pending; the schedule applies after it");
            continue;
        }
        // A rule another row keeps from scheduling (a branch with a bad
        // zone) keeps its next run and stays held in the plan until that
        // row is fixed; the change itself is saved.
        let next = match next_run_of(state, &row, Some(pending)).await {
            Ok(next) => next,
            Err(ApiError::Conflict(problem)) => {
                tracing::warn!(branch_rule_id = %id, "Next run not recomputed: {problem}");
                continue;
            }
            Err(e) => return Err(e),
        };
        let mut changes = Map::new();
        changes.insert(
            "next_run_time".into(),
            next.map_or(Value::Null, Value::from),
        );
        changes.insert("updated_at".into(), state.clock().now_ms().into());
        moved.push((&BRANCH_RULES, id, changes));
    }
    Ok(moved)
}

/// The stored policies of a branch rule row, its rule's and its own (each
/// `None` when it has none); or why one of them is not a policy.
pub(super) async fn policies_of(
    state: &ApiState,
    row: &Map<String, Value>,
) -> ApiResult<Result<(Option<Policy>, Option<Policy>), String>> {
    let own = match stored_policy(row.get("policy")) {
        Ok(own) => own,
        Err(problem) => return Ok(Err(problem)),
    };
    let rule_id = row
        .get("rule_id")
        .and_then(Value::as_str)
        .and_then(|s| Uuid::parse_str(s).ok());
    let rule = match rule_id {
        Some(rule_id) => state.store().row(&RULES, rule_id).await?,
        None => None,
    };
    match stored_policy(rule.as_ref().and_then(|r| r.get("policy"))) {
        Ok(rules) => Ok(Ok((rules, own))),
        Err(problem) => {
            let rule_id = rule_id.map(|id| id.to_string()).unwrap_or_default();
            Ok(Err(format!("its rule {rule_id}'s {problem}")))
        }
    }
}

/// The policy in force for a branch rule row, by the one resolver the
/// plan uses: its own fields over its rule's over the defaults; or why a
/// stored policy, its own or its rule's, is not one.
async fn effective_policy_of(
    state: &ApiState,
    row: &Map<String, Value>,
) -> ApiResult<Result<EffectivePolicy, String>> {
    Ok(policies_of(state, row)
        .await?
        .map(|(rule, own)| EffectivePolicy::resolve(rule.as_ref(), own.as_ref())))
}

/// A branch rule as the API shows it, with `next_run_time_local`, the
/// policy in force and its action details.
pub async fn present_branch_rule(
    state: &ApiState,
    row: Map<String, Value>,
) -> ApiResult<BranchRule> {
    present_branch_rule_with(state, row, &mut TemplateConfigs::default()).await
}

/// Branch rules as the API shows them, for a listing: a template their
/// details share is read once for the whole page, not once per rule.
pub async fn present_branch_rules(
    state: &ApiState,
    rows: impl IntoIterator<Item = Map<String, Value>>,
) -> ApiResult<Vec<BranchRule>> {
    let mut templates = TemplateConfigs::default();
    let mut out = Vec::new();
    for row in rows {
        out.push(present_branch_rule_with(state, row, &mut templates).await?);
    }
    Ok(out)
}

async fn present_branch_rule_with(
    state: &ApiState,
    row: Map<String, Value>,
    templates: &mut TemplateConfigs,
) -> ApiResult<BranchRule> {
    let zone = zone_of_branch(state, row.get("branch_id").unwrap_or(&Value::Null)).await?;
    let policy = effective_policy_of(state, &row).await?;
    let id = row.get("id").cloned().unwrap_or(Value::Null);
    let details = state
        .store()
        .rows(&ACTION_DETAILS, Some(("branch_rule_id", &id)))
        .await?;
    let mut shown: BranchRule = from_row(row)?;
    match policy {
        Ok(policy) => shown.effective_policy = Some(policy),
        // Shown, not guessed, as a bad schedule is.
        Err(problem) => {
            shown.effective_policy = None;
            shown.policy_error = Some(problem);
        }
    }
    match zone {
        Ok(zone) => {
            shown.next_run_time_local = shown
                .next_run_time
                .and_then(|t| local_time(t.0, zone).as_str().map(String::from));
            shown.timezone = Some(zone.name().to_string());
        }
        // Shown, not guessed: the plan holds the rule until it is fixed.
        Err(e) => {
            shown.next_run_time_local = None;
            shown.timezone = None;
            shown.schedule_error = Some(e.to_string());
        }
    }
    let mut details: Vec<ActionDetail> = views(details)?;
    templates.mask(state, &mut details).await?;
    details.sort_by_key(|d| d.position);
    shown.action_details = details;
    Ok(shown)
}

/// Details as the API shows them: their params masked by the `secret_keys`
/// of their template too, which a run merges with their own.
async fn masked_by_templates(state: &ApiState, details: &mut [ActionDetail]) -> ApiResult<()> {
    TemplateConfigs::default().mask(state, details).await
}

/// The templates' configs one response has read, by template id, so that a
/// listing reads each template once; `None` for a template that is gone.
#[derive(Default)]
struct TemplateConfigs(HashMap<String, Option<TemplateConfig>>);

enum TemplateConfig {
    Read(Value),
    /// Not JSON (written with SQL): its `secret_keys` cannot be read, so
    /// every param of its details is masked.
    Unreadable,
}

impl TemplateConfigs {
    async fn mask(&mut self, state: &ApiState, details: &mut [ActionDetail]) -> ApiResult<()> {
        for detail in details {
            let id = &detail.action_template_id;
            if !self.0.contains_key(id) {
                let config = match Uuid::parse_str(id) {
                    Ok(uuid) => state
                        .store()
                        .row(&ACTION_TEMPLATES, uuid)
                        .await?
                        .map(|mut row| {
                            if row.contains_key("config_error") {
                                TemplateConfig::Unreadable
                            } else {
                                TemplateConfig::Read(row.remove("config").unwrap_or(Value::Null))
                            }
                        }),
                    Err(_) => None,
                };
                self.0.insert(id.clone(), config);
            }
            match &self.0[id] {
                Some(TemplateConfig::Read(config)) => {
                    detail.params = secrets::redact_params(&detail.params, Some(config));
                }
                Some(TemplateConfig::Unreadable) => {
                    detail.params = mask_every_value(&detail.params)
                }
                None => {}
            }
        }
        Ok(())
    }
}

/// `params` with every value shown as `***`, its keys kept.
pub(super) fn mask_every_value(params: &Value) -> Value {
    match params {
        Value::Object(map) => Value::Object(
            map.keys()
                .map(|key| (key.clone(), Value::String(secrets::MASK.into())))
                .collect(),
        ),
        _ => Value::String(secrets::MASK.into()),
    }
}

#[utoipa::path(post, path = "/branch-rules", tag = "branch rules",
    request_body = BranchRuleCreate,
    responses((status = 201, description = "Created, with its action details", body = BranchRule)),
    security(("bearer" = [])))]
pub async fn create_branch_rule(
    State(s): State<ApiState>,
    caller: Caller,
    ApiJson(input): ApiJson<BranchRuleCreate>,
) -> ApiResult<Created<BranchRule>> {
    check_window(
        input.operation_time_from.as_ref(),
        input.operation_time_to.as_ref(),
    )?;
    check_config(longest_action_ms(&s), "params.", input.params.as_ref())?;
    refuse_masks("params", input.params.as_ref())?;
    let mut details = Vec::new();
    let mut positions = Vec::new();
    for (index, detail) in input.action_details.iter().flatten().enumerate() {
        let field = format!("action_details[{index}]");
        check_position(detail.position)
            .map_err(|_| ApiError::field(format!("{field}.position"), "must be 0 or more"))?;
        check_detail(&s, &field, detail.params.as_ref())?;
        let position = detail
            .position
            .unwrap_or_else(|| i32::try_from(index).unwrap_or(i32::MAX));
        if positions.contains(&position) {
            return Err(ApiError::Conflict(format!(
                "{field}.position: {position} is already the position of an earlier action \
                 detail; positions of a branch rule's details are unique (a detail without \
                 one takes its index in the list)"
            )));
        }
        positions.push(position);
        details.push((detail, position));
    }
    let branch = live_parent(&s, &BRANCHES, "branch", "branch_id", input.branch_id).await?;
    live_parent(&s, &RULES, "rule", "rule_id", input.rule_id).await?;
    if let Some(brand_rule) = input.brand_rule_id {
        let brand_rule =
            live_parent(&s, &BRAND_RULES, "brand rule", "brand_rule_id", brand_rule).await?;
        check_brand_rule_fits(&brand_rule, &input.rule_id.to_string(), &branch)?;
    }
    for (index, (detail, _)) in details.iter().enumerate() {
        let field = format!("action_details[{index}].action_template_id");
        live_parent(
            &s,
            &ACTION_TEMPLATES,
            "action template",
            &field,
            detail.action_template_id,
        )
        .await?;
    }
    let now = s.clock().now_ms();
    let id = Uuid::new_v4();
    let map = with_policy(to_map(&input), input.policy.as_ref().map(Some));
    let mut map = with_next_run(map, input.next_run_time);
    map.insert("id".into(), Value::String(id.to_string()));
    map.entry("is_active").or_insert(Value::Bool(true));
    map.entry("params").or_insert(json!({}));
    map.insert("created_at".into(), now.into());
    map.insert("updated_at".into(), now.into());
    stamp_created(&mut map, &caller);
    if !map.contains_key("next_run_time") {
        let next = next_run_of(&s, &map, None).await?;
        map.insert(
            "next_run_time".into(),
            next.map_or(Value::Null, Value::from),
        );
    }
    let mut rows = vec![(&BRANCH_RULES, map)];
    for (detail, position) in details {
        let mut detail_map = to_map(detail);
        detail_map.insert("id".into(), Value::String(Uuid::new_v4().to_string()));
        detail_map.insert("branch_rule_id".into(), Value::String(id.to_string()));
        detail_map.insert("position".into(), position.into());
        detail_map.entry("params").or_insert(json!({}));
        detail_map.insert("created_at".into(), now.into());
        detail_map.insert("updated_at".into(), now.into());
        stamp_created(&mut detail_map, &caller);
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

#[utoipa::path(get, path = "/branch-rules", tag = "branch rules", params(PageQuery),
    responses((status = 200, description = "A page of branch rules, by id", body = Vec<BranchRule>,
        headers(("x-next-cursor" = String, description = "The next page's cursor; absent on the last page"),
                ("link" = String, description = "rel=\"next\": the next page's URL")))))]
pub async fn list_branch_rules(
    State(s): State<ApiState>,
    Query(query): Query<PageQuery>,
) -> ApiResult<Page<BranchRule>> {
    let (rows, next) = page_of(&s, &BRANCH_RULES, None, PageOrder::Id, &query).await?;
    let out = present_branch_rules(&s, rows).await?;
    Ok(paged("/branch-rules", &query, out, next))
}

#[utoipa::path(get, path = "/branch-rules/{id}", tag = "branch rules",
    params(("id" = Uuid, Path, description = "Branch rule id")),
    responses((status = 200, description = "The branch rule", body = BranchRule)))]
pub async fn get_branch_rule(
    State(s): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<Json<BranchRule>> {
    let row = get_row(&s, &BRANCH_RULES, "branch rule", &id).await?;
    Ok(Json(present_branch_rule(&s, row).await?))
}

#[utoipa::path(put, path = "/branch-rules/{id}", tag = "branch rules",
    request_body = BranchRuleUpdate,
    params(("id" = Uuid, Path, description = "Branch rule id")),
    responses((status = 200, description = "The branch rule as changed", body = BranchRule)),
    security(("bearer" = [])))]
pub async fn update_branch_rule(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    caller: Caller,
    ApiJson(input): ApiJson<BranchRuleUpdate>,
) -> ApiResult<Json<BranchRule>> {
    check_window_update(
        input.operation_time_from.as_ref().map(Option::as_ref),
        input.operation_time_to.as_ref().map(Option::as_ref),
    )?;
    check_config(longest_action_ms(&s), "params.", input.params.as_ref())?;
    let stored = get_row(&s, &BRANCH_RULES, "branch rule", &id).await?;
    let branch = match input.branch_id {
        Some(branch_id) => {
            Some(live_parent(&s, &BRANCHES, "branch", "branch_id", branch_id).await?)
        }
        None => None,
    };
    if let Some(rule_id) = input.rule_id {
        live_parent(&s, &RULES, "rule", "rule_id", rule_id).await?;
    }
    // The brand rule, branch and rule the update leaves must still fit
    // together, when it changes any of them.
    let brand_rule = match input.brand_rule_id {
        Some(Some(brand_rule)) => {
            Some(live_parent(&s, &BRAND_RULES, "brand rule", "brand_rule_id", brand_rule).await?)
        }
        // Cleared: nothing left to fit.
        Some(None) => None,
        None if branch.is_some() || input.rule_id.is_some() => {
            match stored.get("brand_rule_id").and_then(Value::as_str) {
                Some(stored_id) => {
                    s.store()
                        .row(&BRAND_RULES, Uuid::parse_str(stored_id).unwrap_or_default())
                        .await?
                }
                None => None,
            }
        }
        None => None,
    };
    if let Some(brand_rule) = brand_rule {
        let branch = match branch {
            Some(branch) => Some(branch),
            None => match stored.get("branch_id").and_then(Value::as_str) {
                Some(branch_id) => {
                    s.store()
                        .row(&BRANCHES, Uuid::parse_str(branch_id).unwrap_or_default())
                        .await?
                }
                None => None,
            },
        };
        let rule_id = match input.rule_id {
            Some(rule_id) => rule_id.to_string(),
            None => stored
                .get("rule_id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
        };
        if let Some(branch) = branch {
            check_brand_rule_fits(&brand_rule, &rule_id, &branch)?;
        }
    }
    let map = with_policy(to_map(&input), input.policy.as_ref().map(Option::as_ref));
    let map = with_next_run(map, input.next_run_time);
    let schedule_changed =
        input.rule_id.is_some() || input.branch_id.is_some() || input.brand_rule_id.is_some();
    let mut pending = prepare_update(&s, &BRANCH_RULES, "branch rule", &id, map, &caller).await?;
    if schedule_changed && input.next_run_time.is_none() {
        let id = Value::String(pending.id.to_string());
        let moved = next_runs_moved_by(&s, &pending, ("id", &id)).await?;
        // The branch rule's own row: its next run is one more column of
        // the same update.
        for (_, _, next_run) in moved {
            pending.changes.extend(next_run);
        }
    }
    let row = save_update(&s, pending, Vec::new()).await?;
    Ok(Json(present_branch_rule(&s, row).await?))
}

#[utoipa::path(delete, path = "/branch-rules/{id}", tag = "branch rules",
    params(("id" = String, Path, description = "One branch rule id, or several separated by commas"), DeleteQuery),
    responses((status = 204, description = "Deleted"),
        (status = 200, description = "Archived (`?cascade=archive`)", body = Archived)),
    security(("bearer" = [])))]
pub async fn delete_branch_rules(
    State(s): State<ApiState>,
    Path(ids): Path<String>,
    Query(query): Query<DeleteQuery>,
) -> ApiResult<Response> {
    delete_keeping_history(
        &s,
        &BRANCH_RULES,
        "branch rule",
        CatalogScope::BranchRule,
        &ids,
        query,
    )
    .await
}

// ---- action details (nested) -----------------------------------------------

#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ActionDetailCreate {
    action_template_id: Uuid,
    /// Where it runs among its branch rule's details, unique among them;
    /// default: after the last.
    #[serde(
        default,
        deserialize_with = "whole_number",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(minimum = 0, maximum = 2147483647)]
    position: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    params: Option<ActionConfig>,
}

/// Fields left out (or `null`) keep their stored values.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ActionDetailUpdate {
    #[serde(skip_serializing_if = "Option::is_none")]
    action_template_id: Option<Uuid>,
    #[serde(
        default,
        deserialize_with = "whole_number",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(minimum = 0, maximum = 2147483647)]
    position: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    params: Option<ActionConfig>,
}

/// An action detail's params and position; `prefix` names where it sits
/// in the request (`action_details[2]` inside a branch rule, "" on its
/// own).
fn check_detail(state: &ApiState, prefix: &str, params: Option<&ActionConfig>) -> ApiResult<()> {
    let path = |field: &str| match prefix {
        "" => field.to_string(),
        _ => format!("{prefix}.{field}"),
    };
    check_config(longest_action_ms(state), &path("params."), params)?;
    refuse_masks(&path("params"), params)
}

/// A detail's position: 0 or more.
fn check_position(position: Option<i32>) -> ApiResult<()> {
    match position {
        Some(p) if p < 0 => Err(ApiError::field("position", "must be 0 or more")),
        _ => Ok(()),
    }
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

#[utoipa::path(post, path = "/branch-rules/{id}/action-details", tag = "branch rules",
    request_body = ActionDetailCreate,
    params(("id" = Uuid, Path, description = "Branch rule id")),
    responses((status = 201, description = "Created", body = ActionDetail)),
    security(("bearer" = [])))]
pub async fn create_detail(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    caller: Caller,
    ApiJson(input): ApiJson<ActionDetailCreate>,
) -> ApiResult<Created<ActionDetail>> {
    check_position(input.position)?;
    check_detail(&s, "", input.params.as_ref())?;
    let rule = get_row(&s, &BRANCH_RULES, "branch rule", &id).await?;
    live_parent(
        &s,
        &ACTION_TEMPLATES,
        "action template",
        "action_template_id",
        input.action_template_id,
    )
    .await?;
    let mut map = to_map(&input);
    if let Some(position) = input.position {
        check_position_free(&s, &rule["id"], position, None).await?;
    } else {
        let existing = s
            .store()
            .rows(&ACTION_DETAILS, Some(("branch_rule_id", &rule["id"])))
            .await?;
        let last = existing.iter().filter_map(|d| d["position"].as_i64()).max();
        let next = match last {
            None => 0,
            Some(last) => i32::try_from(last + 1).map_err(|_| {
                ApiError::Conflict(format!(
                    "position: the branch rule's last detail is at {last}, the highest                      position there is; give this one a free position explicitly"
                ))
            })?,
        };
        map.insert("position".into(), next.into());
    }
    map.insert("branch_rule_id".into(), rule["id"].clone());
    map.entry("params").or_insert(json!({}));
    let (status, Json(mut detail)) = insert_one(&s, &ACTION_DETAILS, map, &caller).await?;
    masked_by_templates(&s, std::slice::from_mut(&mut detail)).await?;
    Ok((status, Json(detail)))
}

/// A branch rule's action details in the order they run (position, then
/// id), paged like every listing.
#[utoipa::path(get, path = "/branch-rules/{id}/action-details", tag = "branch rules",
    params(("id" = Uuid, Path, description = "Branch rule id"), PageQuery),
    responses((status = 200, description = "A page of the branch rule's action details, in the order they run",
        body = Vec<ActionDetail>,
        headers(("x-next-cursor" = String, description = "The next page's cursor; absent on the last page"),
                ("link" = String, description = "rel=\"next\": the next page's URL")))))]
pub async fn list_details(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    Query(query): Query<PageQuery>,
) -> ApiResult<Page<ActionDetail>> {
    let rule = get_row(&s, &BRANCH_RULES, "branch rule", &id).await?;
    let filter = Some(("branch_rule_id", &rule["id"]));
    let (rows, next) = page_of(
        &s,
        &ACTION_DETAILS,
        filter,
        PageOrder::PositionThenId,
        &query,
    )
    .await?;
    let path = format!(
        "/branch-rules/{}/action-details",
        rule["id"].as_str().unwrap_or(&id)
    );
    let mut details: Vec<ActionDetail> = views(rows)?;
    masked_by_templates(&s, &mut details).await?;
    Ok(paged(&path, &query, details, next))
}

#[utoipa::path(get, path = "/branch-rules/{id}/action-details/{detail_id}", tag = "branch rules",
    params(("id" = Uuid, Path, description = "Branch rule id"),
           ("detail_id" = Uuid, Path, description = "Action detail id")),
    responses((status = 200, description = "The action detail", body = ActionDetail)))]
pub async fn get_detail(
    State(s): State<ApiState>,
    Path((id, detail_id)): Path<(String, String)>,
) -> ApiResult<Json<ActionDetail>> {
    let mut detail: ActionDetail = from_row(nested_detail(&s, &id, &detail_id).await?)?;
    masked_by_templates(&s, std::slice::from_mut(&mut detail)).await?;
    Ok(Json(detail))
}

#[utoipa::path(put, path = "/branch-rules/{id}/action-details/{detail_id}", tag = "branch rules",
    request_body = ActionDetailUpdate,
    params(("id" = Uuid, Path, description = "Branch rule id"),
           ("detail_id" = Uuid, Path, description = "Action detail id")),
    responses((status = 200, description = "The action detail as changed", body = ActionDetail)),
    security(("bearer" = [])))]
pub async fn update_detail(
    State(s): State<ApiState>,
    Path((id, detail_id)): Path<(String, String)>,
    caller: Caller,
    ApiJson(input): ApiJson<ActionDetailUpdate>,
) -> ApiResult<Json<ActionDetail>> {
    check_position(input.position)?;
    check_config(longest_action_ms(&s), "params.", input.params.as_ref())?;
    let detail = nested_detail(&s, &id, &detail_id).await?;
    if let Some(template) = input.action_template_id {
        live_parent(
            &s,
            &ACTION_TEMPLATES,
            "action template",
            "action_template_id",
            template,
        )
        .await?;
    }
    if let Some(position) = input.position {
        check_position_free(&s, &detail["branch_rule_id"], position, Some(&detail["id"])).await?;
    }
    let row = update_one(
        &s,
        &ACTION_DETAILS,
        "action detail",
        &detail_id,
        to_map(&input),
        &caller,
    )
    .await?;
    let mut detail: ActionDetail = from_row(row)?;
    masked_by_templates(&s, std::slice::from_mut(&mut detail)).await?;
    Ok(Json(detail))
}

#[utoipa::path(delete, path = "/branch-rules/{id}/action-details/{detail_id}", tag = "branch rules",
    params(("id" = Uuid, Path, description = "Branch rule id"),
           ("detail_id" = Uuid, Path, description = "Action detail id")),
    responses((status = 204, description = "Deleted")),
    security(("bearer" = [])))]
pub async fn delete_detail(
    State(s): State<ApiState>,
    Path((id, detail_id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    nested_detail(&s, &id, &detail_id).await?;
    delete_ids(&s, &ACTION_DETAILS, "action detail", &detail_id).await
}

#[cfg(test)]
mod input_tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_any_hex_is_a_place_in_the_order() {
        for key in [
            PageKey {
                position: None,
                id: Uuid::nil().to_string(),
            },
            PageKey {
                position: None,
                id: "not-a-uuid/with ünïcode".into(),
            },
        ] {
            assert_eq!(
                decode_cursor(PageOrder::Id, &encode_cursor(&key)).unwrap(),
                key
            );
        }
        let detail = PageKey {
            position: Some(-3),
            id: "abc".into(),
        };
        let cursor = encode_cursor(&detail);
        assert!(cursor.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(
            decode_cursor(PageOrder::PositionThenId, &cursor).unwrap(),
            detail
        );
        for bad in ["", "a", "zz", &"ab".repeat(300)] {
            assert!(decode_cursor(PageOrder::Id, bad).is_err(), "{bad}");
        }
        // A NUL is dropped (PostgreSQL cannot bind it); bytes that are not
        // UTF-8 still place the page.
        assert_eq!(decode_cursor(PageOrder::Id, "00").unwrap().id, "");
        assert!(decode_cursor(PageOrder::Id, "c3").is_ok());
        // An id cursor read as a position/id one starts before every
        // position.
        let id_only = encode_cursor(&PageKey {
            position: None,
            id: "abc".into(),
        });
        assert_eq!(
            decode_cursor(PageOrder::PositionThenId, &id_only)
                .unwrap()
                .position,
            Some(i32::MIN)
        );
    }

    #[test]
    fn limits_default_to_100_and_stay_within_1_to_1000() {
        assert_eq!(page_limit(None).unwrap(), 100);
        assert_eq!(page_limit(Some(1)).unwrap(), 1);
        assert_eq!(page_limit(Some(1000)).unwrap(), 1000);
        for bad in [0, -1, 1001, i64::MAX] {
            assert!(
                page_limit(Some(bad))
                    .unwrap_err()
                    .to_string()
                    .contains("limit")
            );
        }
    }

    #[test]
    fn a_window_has_both_bounds_or_neither() {
        let t = TimeOfDayText("09:00".into());
        assert!(check_window(None, None).is_ok());
        assert!(check_window(Some(&t), Some(&t)).is_ok());
        let missing_to = check_window(Some(&t), None).unwrap_err();
        assert!(missing_to.to_string().starts_with("operation_time_to"));
        let missing_from = check_window(None, Some(&t)).unwrap_err();
        assert!(missing_from.to_string().starts_with("operation_time_from"));
    }

    #[test]
    fn an_update_sets_both_window_bounds_clears_both_or_leaves_both() {
        let check = |body: &str| {
            let update = serde_json::from_str::<BranchRuleUpdate>(body).unwrap();
            check_window_update(
                update.operation_time_from.as_ref().map(Option::as_ref),
                update.operation_time_to.as_ref().map(Option::as_ref),
            )
            .map(|()| to_map(&update))
            .map_err(|e| e.to_string())
        };
        assert_eq!(check(r#"{}"#).unwrap().get("operation_time_from"), None);
        let set = check(r#"{"operation_time_from": "22:00", "operation_time_to": "06:00"}"#);
        assert_eq!(set.unwrap()["operation_time_from"], json!("22:00"));
        let cleared = check(r#"{"operation_time_from": null, "operation_time_to": null}"#);
        let cleared = cleared.unwrap();
        assert_eq!(cleared["operation_time_from"], Value::Null);
        assert_eq!(cleared["operation_time_to"], Value::Null);
        for (body, field) in [
            (r#"{"operation_time_from": null}"#, "operation_time_to"),
            (r#"{"operation_time_to": null}"#, "operation_time_from"),
            (
                r#"{"operation_time_from": null, "operation_time_to": "06:00"}"#,
                "operation_time_to",
            ),
            (r#"{"operation_time_from": "22:00"}"#, "operation_time_to"),
        ] {
            let error = check(body).unwrap_err();
            assert!(error.starts_with(field), "{body}: {error}");
        }
    }

    /// The error a body gets, as the API reads it (serde_path_to_error).
    fn refusal<T: DeserializeOwned + std::fmt::Debug>(body: &str) -> String {
        let deserializer = &mut serde_json::Deserializer::from_str(body);
        let error = serde_path_to_error::deserialize::<_, T>(deserializer).unwrap_err();
        format!("{}: {}", error.path(), error.inner())
    }

    #[test]
    fn a_policy_is_set_kept_or_cleared_on_update() {
        let read = |body: &str| serde_json::from_str::<RuleUpdate>(body).unwrap();
        let column = |update: RuleUpdate| {
            with_policy(to_map(&update), update.policy.as_ref().map(Option::as_ref))
                .get("policy")
                .cloned()
        };
        assert_eq!(column(read(r#"{"name": "r"}"#)), None, "left out: kept");
        assert_eq!(column(read(r#"{"policy": null}"#)), Some(Value::Null));
        assert_eq!(column(read(r#"{"policy": {}}"#)), Some(Value::Null));
        assert_eq!(
            column(read(
                r#"{"policy": {"max_attempts": 3.0, "misfire": "skip"}}"#
            )),
            Some(json!({"misfire": "skip", "max_attempts": 3}))
        );
        let branch_rule = serde_json::from_str::<BranchRuleUpdate>(r#"{"policy": null}"#).unwrap();
        assert_eq!(branch_rule.policy, Some(None));
    }

    #[test]
    fn a_bad_policy_is_refused_naming_its_field() {
        let error = refusal::<RuleCreate>(
            r#"{"name": "r", "cron_expression": "* * * * *", "policy": {"max_attempts": 0}}"#,
        );
        assert!(error.starts_with("policy.max_attempts: "), "{error}");
        let error = refusal::<BranchRuleUpdate>(r#"{"policy": {"retries": 1}}"#);
        assert!(
            error.starts_with("policy.retries: unknown field `retries`"),
            "{error}"
        );
        let error = refusal::<RuleUpdate>(r#"{"policy": {"misfire": "sometimes"}}"#);
        assert!(
            error.starts_with("policy.misfire: unknown variant"),
            "{error}"
        );
        // An array is not an object, though serde would read one as a struct.
        for body in [
            r#"{"policy": []}"#,
            r#"{"policy": ["skip"]}"#,
            r#"{"policy": 3}"#,
        ] {
            let error = refusal::<RuleUpdate>(body);
            assert!(error.starts_with("policy: invalid type"), "{body}: {error}");
        }
    }

    #[test]
    fn durations_are_whole_milliseconds_up_to_the_job_timeout() {
        let check = |config: Value| {
            let Value::Object(map) = config else {
                unreachable!()
            };
            check_durations(600_000, "config.", Some(&ActionConfig(map)))
        };
        assert!(check(json!({"timeout_ms": 1, "ms": 0})).is_ok());
        assert!(check(json!({"timeout_ms": 600_000, "ms": 600_000})).is_ok());
        assert!(check(json!({"other": u64::MAX})).is_ok());
        for (config, field) in [
            (json!({"timeout_ms": u64::MAX}), "config.timeout_ms"),
            (json!({"timeout_ms": 0}), "config.timeout_ms"),
            (json!({"timeout_ms": 600_001}), "config.timeout_ms"),
            (json!({"timeout_ms": "5"}), "config.timeout_ms"),
            (json!({"timeout_ms": null}), "config.timeout_ms"),
            (json!({"ms": u64::MAX}), "config.ms"),
            (json!({"ms": -1}), "config.ms"),
            (json!({"ms": 1.5}), "config.ms"),
        ] {
            let error = check(config.clone()).unwrap_err().to_string();
            assert!(error.starts_with(field), "{config}: {error}");
        }
    }

    #[test]
    fn a_mask_on_create_is_refused_naming_its_field() {
        let Value::Object(map) = json!({"headers": {"X-Api-Key": REDACTED}}) else {
            unreachable!()
        };
        let error = refuse_masks("params", Some(&ActionConfig(map)))
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("params.headers.X-Api-Key"), "{error}");
    }
}
