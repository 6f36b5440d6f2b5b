//! The `/api/v1` routes: one list of handlers, from which utoipa-axum
//! builds both the router and the OpenAPI 3.1 document, so neither can
//! list a route the other lacks. The document's schemas are the handlers'
//! own input and output types ([`super::schema`], [`super::views`]).
//!
//! What the annotations cannot say once per route is added here, from the
//! same facts: the error responses each operation can give (all in the
//! envelope), the links from each create to what can be done with the
//! created row, and the parts that depend on this service's settings
//! (the action kinds it runs, the longest an action may take).

use std::sync::LazyLock;

use axum::Json;
use axum::extract::State;
use serde_json::{Map, Value, json};
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::ApiState;
use super::catalog::Cascade;
use super::catalog::{self as c, DURATION_KEYS, longest_action_ms};
use super::engine::{self as e, ListOrder, WorkflowSort};
use super::events;
use super::schema::{ErrorEnvelope, JsonObject, JsonValue, json_value_schema};
use super::simulation as sim;

pub const PREFIX: &str = "/api/v1";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "ruled",
        description = "Scheduled business rules: brands, branches, rules, their branch rules \
                       with cron schedules in the branch's zone and daily windows, and every \
                       execution. Reads are open; changes need `Authorization: Bearer <token>` \
                       (API_TOKEN or API_TOKENS). Errors are `{\"error\": {\"code\", \"message\"}}`, \
                       the message in the language of `Accept-Language` (en, ar)."
    ),
    components(schemas(ErrorEnvelope, JsonValue, JsonObject, Cascade, ListOrder, WorkflowSort)),
    modifiers(&BearerScheme)
)]
struct ApiDoc;

struct BearerScheme;

impl utoipa::Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Every `/api/v1` route with its documentation, paths relative to
/// [`PREFIX`].
pub fn api() -> OpenApiRouter<ApiState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(c::create_brand, c::list_brands))
        .routes(routes!(c::get_brand, c::update_brand, c::delete_brand))
        .routes(routes!(c::create_branch, c::list_branches))
        .routes(routes!(c::get_branch, c::update_branch, c::delete_branch))
        .routes(routes!(c::create_rule, c::list_rules))
        .routes(routes!(c::get_rule, c::update_rule, c::delete_rule))
        .routes(routes!(c::create_template, c::list_templates))
        .routes(routes!(
            c::get_template,
            c::update_template,
            c::delete_template
        ))
        .routes(routes!(c::create_branch_rule, c::list_branch_rules))
        .routes(routes!(e::due))
        .routes(routes!(
            c::get_branch_rule,
            c::update_branch_rule,
            c::delete_branch_rules
        ))
        .routes(routes!(e::set_status))
        .routes(routes!(e::run_now))
        .routes(routes!(e::force_stop))
        .routes(routes!(e::preview_runs))
        .routes(routes!(c::create_detail, c::list_details))
        .routes(routes!(c::get_detail, c::update_detail, c::delete_detail))
        .routes(routes!(e::list_executions))
        .routes(routes!(e::get_execution))
        .routes(routes!(e::cancel_execution))
        .routes(routes!(e::instances))
        .routes(routes!(e::plan))
        .routes(routes!(e::plan_ready))
        .routes(routes!(e::plan_workflows))
        .routes(routes!(e::stats))
        .routes(routes!(sim::simulate))
        .routes(routes!(events::events))
        .routes(routes!(openapi_handler))
}

/// The document as the annotations give it, under [`PREFIX`], with the
/// error responses and links added ([`complete`]).
static DOCUMENT: LazyLock<Value> = LazyLock::new(|| {
    let document = OpenApiRouter::new().nest(PREFIX, api()).into_openapi();
    let mut value = serde_json::to_value(document).unwrap_or(Value::Null);
    complete(&mut value);
    value
});

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "meta",
    responses((status = 200, description = "The OpenAPI 3.1 document of this API", body = Object)))]
async fn openapi_handler(State(s): State<ApiState>) -> Json<Value> {
    Json(openapi(&s))
}

/// The OpenAPI document of this service: [`DOCUMENT`] with the action
/// kinds it runs and the longest an action may take here.
pub fn openapi(state: &ApiState) -> Value {
    let mut document = DOCUMENT.clone();
    let mut kinds = state.registry().kinds();
    if !state.config().command_actions_enabled {
        kinds.retain(|kind| kind != "command");
    }
    kinds.sort();
    if let Some(kind) = document.pointer_mut("/components/schemas/ActionKind") {
        kind["enum"] = json!(kinds);
    }
    let longest = longest_action_ms(state);
    for (key, _) in DURATION_KEYS {
        let pointer = format!("/components/schemas/ActionConfig/properties/{key}/maximum");
        if let Some(maximum) = document.pointer_mut(&pointer) {
            *maximum = json!(longest);
        }
    }
    document
}

/// Every operation of the document as (lower-case method, path relative
/// to [`PREFIX`]), in the document's order.
pub fn operations() -> Vec<(String, String)> {
    let Some(paths) = DOCUMENT.get("paths").and_then(Value::as_object) else {
        return Vec::new();
    };
    paths
        .iter()
        .flat_map(|(path, item)| {
            let relative = path.strip_prefix(PREFIX).unwrap_or(path).to_string();
            item.as_object()
                .into_iter()
                .flat_map(|item| item.keys())
                .filter(|method| METHODS.contains(&method.as_str()))
                .map(move |method| (method.clone(), relative.clone()))
        })
        .collect()
}

/// The query parameters the document declares for `method` on the path
/// template `path` (with or without [`PREFIX`]); None for an operation it
/// does not have.
pub fn query_parameters(method: &str, path: &str) -> Option<Vec<String>> {
    let full = if path.starts_with(PREFIX) {
        path.to_string()
    } else {
        format!("{PREFIX}{path}")
    };
    let method = method.to_ascii_lowercase();
    let method = if method == "head" {
        "get".into()
    } else {
        method
    };
    let operation = DOCUMENT.get("paths")?.get(&full)?.get(&method)?;
    Some(
        operation
            .get("parameters")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|p| p["in"] == "query")
            .filter_map(|p| p["name"].as_str().map(String::from))
            .collect(),
    )
}

/// Whether the operation for `method` on the path template `path` (with
/// or without [`PREFIX`]) needs the bearer token: it declares `security`,
/// as every change does and a read or a simulation does not. None for an
/// operation the document does not have.
pub fn requires_token(method: &str, path: &str) -> Option<bool> {
    let full = if path.starts_with(PREFIX) {
        path.to_string()
    } else {
        format!("{PREFIX}{path}")
    };
    let method = method.to_ascii_lowercase();
    let operation = DOCUMENT.get("paths")?.get(&full)?.get(&method)?;
    Some(operation.get("security").is_some())
}

/// The HTTP methods of an operation in a path item.
const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

fn error_response(description: &str) -> Value {
    json!({
        "description": description,
        "content": { "application/json": { "schema": {
            "$ref": "#/components/schemas/ErrorEnvelope"
        } } }
    })
}

/// Adds to every operation the errors it can answer with, and to every
/// create the links to its row's operations.
/// Rewrites every `{"type": [T, "null"], "format": F, …}` (utoipa's
/// `Option<Uuid>`) as `{"oneOf": [{"type": T, "format": F, …}, {"type":
/// "null"}]}`. Both say the same in JSON Schema, where a format constrains
/// strings only; but a fuzzer asked to break the format may send `null`
/// and call its acceptance a bug (Schemathesis did, on a rule's
/// `brand_id`). With the format on the string branch alone, `null` is
/// plainly valid.
fn split_nullable_formats(node: &mut Value) {
    match node {
        Value::Object(map) => {
            let nullable_type = map
                .get("type")
                .and_then(Value::as_array)
                .filter(|types| types.len() == 2 && types.contains(&json!("null")))
                .and_then(|types| types.iter().find(|t| *t != "null").cloned());
            if let (Some(string_type), true) = (nullable_type, map.contains_key("format")) {
                let description = map.remove("description");
                let mut branch = std::mem::take(map);
                branch.insert("type".into(), string_type);
                map.insert("oneOf".into(), json!([branch, {"type": "null"}]));
                if let Some(description) = description {
                    map.insert("description".into(), description);
                }
                return;
            }
            map.values_mut().for_each(split_nullable_formats);
        }
        Value::Array(items) => items.iter_mut().for_each(split_nullable_formats),
        _ => {}
    }
}

fn complete(document: &mut Value) {
    let Some(paths) = document.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for item in paths.values_mut().filter_map(Value::as_object_mut) {
        for (method, operation) in item.iter_mut() {
            if METHODS.contains(&method.as_str()) {
                add_errors(operation);
            }
        }
    }
    if let Some(schema) = document.pointer_mut("/components/schemas/JsonValue") {
        *schema = json_value_schema();
    }
    split_nullable_formats(document);
    // A window is set as a pair (both bounds or neither), which JSON
    // Schema says with `dependentRequired`; utoipa has no attribute for it.
    for input in ["BranchRuleCreate", "BranchRuleUpdate"] {
        if let Some(schema) = document
            .pointer_mut(&format!("/components/schemas/{input}"))
            .and_then(Value::as_object_mut)
        {
            schema.insert(
                "dependentRequired".into(),
                json!({
                    "operation_time_from": ["operation_time_to"],
                    "operation_time_to": ["operation_time_from"],
                }),
            );
            // An update's `null` removes the window, on both bounds or
            // neither.
            if input == "BranchRuleUpdate" {
                schema.insert(
                    "if".into(),
                    json!({
                        "required": ["operation_time_from"],
                        "properties": {"operation_time_from": {"type": "null"}},
                    }),
                );
                schema.insert(
                    "then".into(),
                    json!({"properties": {"operation_time_to": {"type": "null"}}}),
                );
                schema.insert(
                    "else".into(),
                    json!({"properties": {"operation_time_to": {"type": "string"}}}),
                );
            }
        }
    }
    effective_policy_ranges(document);
    // A simulation's range and its down windows run forwards, which JSON
    // Schema cannot say; the examples of their bounds do, so a body made
    // of the properties' examples (a client's, a fuzzer's) is one the
    // server takes. utoipa gives a field holding a `$ref` no examples.
    for (schema, from, to) in [
        (
            "SimulateInput",
            "2026-03-28T00:00:00Z",
            "2026-03-29T00:00:00Z",
        ),
        ("DownWindow", "2026-03-28T01:00:00Z", "2026-03-28T04:00:00Z"),
    ] {
        for (field, example) in [("from", from), ("to", to)] {
            let pointer = format!("/components/schemas/{schema}/properties/{field}");
            if let Some(property) = document.pointer_mut(&pointer) {
                property["examples"] = json!([example]);
            }
        }
    }
    let Some(paths) = document.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    // Executions are made by the engine, not by a create: the listing is
    // where a client finds one to read or cancel.
    if let Some(listed) = paths
        .get_mut(&format!("{PREFIX}/executions"))
        .and_then(|item| item.pointer_mut("/get/responses/200"))
    {
        let first = json!({ "id": "$response.body#/items/0/id" });
        listed["links"] = json!({
            "get_execution": { "operationId": "get_execution", "parameters": first },
            "cancel_execution": { "operationId": "cancel_execution", "parameters": first },
        });
    }
    // Links name operations of other paths, so they are read from a copy.
    let snapshot = Value::Object(paths.clone());
    let templates: Vec<String> = paths.keys().cloned().collect();
    for (path, item) in paths.iter_mut() {
        if let Some(operation) = item.get_mut("post") {
            add_links(path, &templates, operation, &snapshot);
        }
    }
}

/// The policy in force takes each number from a policy or the default,
/// which lies in the same range: the document says so with the policy's
/// own bounds and descriptions, which the derived schema of
/// [`crate::schedule::EffectivePolicy`] (plain integers) cannot.
fn effective_policy_ranges(document: &mut Value) {
    let Some(policy) = document
        .pointer("/components/schemas/Policy/properties")
        .and_then(Value::as_object)
        .cloned()
    else {
        return;
    };
    let Some(effective) = document
        .pointer_mut("/components/schemas/EffectivePolicy/properties")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    for (name, property) in effective.iter_mut() {
        let Some(set) = policy.get(name) else {
            continue;
        };
        for key in ["minimum", "maximum", "description"] {
            let value = set
                .get(key)
                .or_else(|| set.pointer(&format!("/oneOf/0/{key}")));
            if let Some(value) = value {
                property[key] = value.clone();
            }
        }
    }
}

fn add_errors(operation: &mut Value) {
    let has_body = operation.get("requestBody").is_some();
    // Changes need the token; reads and the simulation do not.
    let guarded = operation.get("security").is_some();
    let previews = operation.get("operationId").and_then(Value::as_str) == Some("preview_runs");
    let names_a_row = operation
        .get("parameters")
        .and_then(Value::as_array)
        .is_some_and(|parameters| parameters.iter().any(|p| p["in"] == "path"));
    let Some(responses) = operation
        .get_mut("responses")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    let mut errors: Vec<(&str, &str)> = vec![
        (
            "400",
            "A path, query or body value is wrong; the message names it",
        ),
        ("404", "No such row, or no such route"),
        ("500", "An internal error; the log says more"),
        (
            "503",
            "The database or an actor is unavailable for now; try again",
        ),
    ];
    if guarded {
        errors.extend([
            ("401", "No token, or not one of API_TOKEN or API_TOKENS"),
            ("403", "The API is read-only: the service has no API token"),
            (
                "409",
                "The change conflicts with stored rows (the message says which)",
            ),
        ]);
    }
    if has_body {
        errors.extend([
            ("413", "The body is larger than 64 KiB"),
            ("415", "The body is not application/json"),
        ]);
    }
    if previews {
        errors.push(("409", "The stored schedule cannot be computed"));
    }
    if names_a_row {
        errors.push((
            "410",
            "The row was archived (`?cascade=archive`); `?archived=true` lists it",
        ));
    }
    for (status, description) in errors {
        responses
            .entry(status)
            .or_insert_with(|| error_response(description));
    }
    // hyper refuses a request line past its limit before any route runs,
    // so this one comes without the envelope.
    responses.entry("414").or_insert_with(|| {
        json!({ "description": "The URL is longer than the server reads (64 KiB); the body is empty" })
    });
}

/// The path parameters of a path template, in order.
fn parameters_of(template: &str) -> Vec<&str> {
    template
        .split('/')
        .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
        .collect()
}

/// Links from the 201 of a create at `path` to every operation on the
/// created row (`path/{x}` and below): `x` is the created body's `id`,
/// the other parameters are the create's own.
fn add_links(path: &str, templates: &[String], operation: &mut Value, paths: &Value) {
    let Some(created) = operation.pointer_mut("/responses/201") else {
        return;
    };
    let own = parameters_of(path);
    let mut links = Map::new();
    for template in templates {
        let Some(rest) = template.strip_prefix(&format!("{path}/{{")) else {
            continue;
        };
        let Some((new_parameter, _)) = rest.split_once('}') else {
            continue;
        };
        let parameters: Map<String, Value> = parameters_of(template)
            .into_iter()
            .map(|name| {
                let source = if name == new_parameter {
                    "$response.body#/id".to_string()
                } else if own.contains(&name) {
                    format!("$request.path.{name}")
                } else {
                    return (name.to_string(), Value::Null);
                };
                (name.to_string(), Value::String(source))
            })
            .collect();
        if parameters.values().any(Value::is_null) {
            continue;
        }
        let Some(item) = paths.get(template).and_then(Value::as_object) else {
            continue;
        };
        for (method, target) in item {
            let Some(operation_id) = target.get("operationId").and_then(Value::as_str) else {
                continue;
            };
            if !METHODS.contains(&method.as_str()) {
                continue;
            }
            links.insert(
                operation_id.to_string(),
                json!({ "operationId": operation_id, "parameters": parameters }),
            );
        }
    }
    if !links.is_empty() {
        created["links"] = Value::Object(links);
    }
}

/// The `Allow` header for `path` (relative to [`PREFIX`] or not): the
/// methods of the document's path that axum would pick for it, HEAD with
/// GET as axum serves it. None when no route matches, so the answer is a
/// 404.
///
/// Routing prefers a literal segment over a `{param}` one at the first
/// place they differ (matchit's rule), so `/branch-rules/due` allows only
/// GET, not the methods of `/branch-rules/{id}`.
pub fn allowed_methods(path: &str) -> Option<String> {
    let path = path.strip_prefix(PREFIX).unwrap_or(path);
    let segments: Vec<&str> = path.split('/').collect();
    let paths = DOCUMENT.get("paths")?.as_object()?;
    let (_, item) = paths
        .iter()
        .filter_map(|(template, item)| {
            let template = template.strip_prefix(PREFIX)?;
            let parts: Vec<&str> = template.split('/').collect();
            if parts.len() != segments.len() {
                return None;
            }
            let mut literal = Vec::with_capacity(parts.len());
            for (t, s) in parts.iter().zip(&segments) {
                let is_param = t.starts_with('{') && t.ends_with('}');
                if (is_param && s.is_empty()) || (!is_param && t != s) {
                    return None;
                }
                literal.push(!is_param);
            }
            Some((literal, item))
        })
        .max_by(|a, b| a.0.cmp(&b.0))?;
    let mut methods: Vec<String> = Vec::new();
    for method in item.as_object()?.keys() {
        if !METHODS.contains(&method.as_str()) {
            continue;
        }
        methods.push(method.to_ascii_uppercase());
        if method == "get" {
            methods.push("HEAD".to_string());
        }
    }
    methods.sort();
    methods.dedup();
    Some(methods.join(","))
}

#[cfg(test)]
mod tests {
    /// `null` must plainly fit every optional field with a format: the
    /// format sits on the string branch of a `oneOf`, never beside a
    /// nullable type (see `split_nullable_formats`).
    #[test]
    fn no_format_sits_beside_a_nullable_type() {
        fn walk(node: &Value, at: &str, found: &mut Vec<String>) {
            match node {
                Value::Object(map) => {
                    let nullable = map
                        .get("type")
                        .and_then(Value::as_array)
                        .is_some_and(|types| types.contains(&json!("null")));
                    if nullable && map.contains_key("format") {
                        found.push(at.to_string());
                    }
                    for (key, value) in map {
                        walk(value, &format!("{at}/{key}"), found);
                    }
                }
                Value::Array(items) => {
                    for (index, item) in items.iter().enumerate() {
                        walk(item, &format!("{at}/{index}"), found);
                    }
                }
                _ => {}
            }
        }
        let mut found = Vec::new();
        walk(&DOCUMENT, "", &mut found);
        assert!(found.is_empty(), "{found:?}");
        let brand_id = &DOCUMENT["components"]["schemas"]["RuleCreate"]["properties"]["brand_id"];
        assert_eq!(brand_id["oneOf"][0]["format"], "uuid", "{brand_id}");
        assert_eq!(brand_id["oneOf"][1]["type"], "null", "{brand_id}");
    }

    use super::*;

    /// Every `$ref` in the document, with where it sits.
    fn references<'a>(value: &'a Value, at: String, found: &mut Vec<(String, &'a str)>) {
        match value {
            Value::Object(map) => {
                for (key, inner) in map {
                    match (key.as_str(), inner) {
                        ("$ref", Value::String(target)) => found.push((at.clone(), target)),
                        _ => references(inner, format!("{at}/{key}"), found),
                    }
                }
            }
            Value::Array(items) => {
                for (index, inner) in items.iter().enumerate() {
                    references(inner, format!("{at}/{index}"), found);
                }
            }
            _ => {}
        }
    }

    #[test]
    fn every_reference_in_the_document_resolves() {
        // A dangling reference makes Schemathesis skip that parameter, so
        // its values would go untested.
        let mut found = Vec::new();
        references(&DOCUMENT, String::new(), &mut found);
        assert!(found.len() > 50, "{}", found.len());
        for (at, target) in found {
            let pointer = target.strip_prefix('#').unwrap_or(target);
            assert!(DOCUMENT.pointer(pointer).is_some(), "{at}: {target}");
        }
    }

    #[test]
    fn free_text_query_parameters_declare_that_a_url_holds_no_nul() {
        // check_url refuses a NUL anywhere in a URL, so a document that
        // allowed one would promise what the API refuses.
        for (path, operation) in DOCUMENT["paths"].as_object().unwrap() {
            let Some(get) = operation.get("get") else {
                continue;
            };
            for parameter in get["parameters"].as_array().into_iter().flatten() {
                let schema = &parameter["schema"];
                let string = schema["type"] == "string"
                    || schema["type"]
                        .as_array()
                        .is_some_and(|t| t.contains(&json!("string")));
                let free_text =
                    string && schema.get("format").is_none() && schema.get("enum").is_none();
                if parameter["in"] == "query" && free_text {
                    let pattern = schema["pattern"].as_str();
                    assert!(
                        pattern.is_some_and(|p| p.contains("u0000") || !p.contains('.')),
                        "{path} {}: {schema}",
                        parameter["name"]
                    );
                }
            }
        }
    }

    #[test]
    fn allow_lists_the_methods_of_the_matching_route() {
        assert_eq!(allowed_methods("/brands").as_deref(), Some("GET,HEAD,POST"));
        assert_eq!(
            allowed_methods("/api/v1/brands/abc").as_deref(),
            Some("DELETE,GET,HEAD,PUT")
        );
        assert_eq!(
            allowed_methods("/branch-rules/due").as_deref(),
            Some("GET,HEAD")
        );
        assert_eq!(
            allowed_methods("/branch-rules/x/run").as_deref(),
            Some("POST")
        );
        assert_eq!(
            allowed_methods("/branch-rules/x/action-details/y").as_deref(),
            Some("DELETE,GET,HEAD,PUT")
        );
        assert_eq!(allowed_methods("/plan").as_deref(), Some("GET,HEAD"));
        assert_eq!(allowed_methods("/nothing"), None);
        assert_eq!(allowed_methods("/brands//"), None);
    }

    #[test]
    fn every_operation_documents_its_errors_in_the_envelope() {
        let paths = DOCUMENT["paths"].as_object().unwrap();
        assert!(paths.len() >= 20, "{}", paths.len());
        for (path, item) in paths {
            for (method, operation) in item.as_object().unwrap() {
                let responses = operation["responses"].as_object().unwrap();
                for status in ["400", "404", "500"] {
                    assert_eq!(
                        responses[status]["content"]["application/json"]["schema"]["$ref"],
                        "#/components/schemas/ErrorEnvelope",
                        "{method} {path} {status}"
                    );
                }
                let too_long = &responses["414"];
                assert!(too_long.get("content").is_none(), "{method} {path} 414");
                // Whatever names a row by its path may find it archived.
                assert_eq!(
                    responses.contains_key("410"),
                    path.contains('{'),
                    "{method} {path} 410"
                );
                // Every method but GET changes something, except the
                // simulation, which only computes.
                let mutation = method != "get" && operation["operationId"] != "simulate";
                assert_eq!(
                    operation.get("security").is_some(),
                    mutation,
                    "{method} {path}: only changes need the token"
                );
                assert_eq!(
                    requires_token(method, path),
                    Some(mutation),
                    "{method} {path}"
                );
                for status in ["401", "403"] {
                    assert_eq!(
                        responses.contains_key(status),
                        mutation,
                        "{method} {path} {status}: only operations that take the token refuse one"
                    );
                }
            }
        }
    }

    #[test]
    fn the_simulation_is_documented_with_its_bounds_and_needs_no_token() {
        let operation = &DOCUMENT["paths"]["/api/v1/simulate"]["post"];
        assert_eq!(operation["operationId"], "simulate");
        assert!(operation.get("security").is_none(), "{operation}");
        assert_eq!(requires_token("post", "/simulate"), Some(false));
        assert_eq!(allowed_methods("/simulate").as_deref(), Some("POST"));
        let responses = &operation["responses"];
        assert_eq!(
            responses["200"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/SimulationReport"
        );
        let refused = responses["400"]["description"].as_str().unwrap();
        assert!(
            refused.contains("ticks") && refused.contains("decisions"),
            "{refused}"
        );
        for status in ["413", "415", "500", "503"] {
            assert!(responses.get(status).is_some(), "{status}");
        }
        let schemas = &DOCUMENT["components"]["schemas"];
        let input = &schemas["SimulateInput"];
        assert_eq!(input["additionalProperties"], false, "{input}");
        assert_eq!(input["required"], json!(["from", "to"]), "{input}");
        let properties = &input["properties"];
        assert_eq!(
            properties["fail_rate"]["$ref"],
            "#/components/schemas/Share"
        );
        let share = &schemas["Share"];
        assert_eq!(
            (share["minimum"].as_f64(), share["maximum"].as_f64()),
            (Some(0.0), Some(1.0))
        );
        for (field, minimum, maximum) in [
            ("resolution_ms", 1.0, 86_400_000.0),
            ("duration_ms", 1.0, 2_678_400_000.0),
            ("seed", 0.0, 9_007_199_254_740_991.0),
        ] {
            let property = &properties[field];
            assert_eq!(
                property["minimum"].as_f64(),
                Some(minimum),
                "{field}: {property}"
            );
            assert_eq!(
                property["maximum"].as_f64(),
                Some(maximum),
                "{field}: {property}"
            );
        }
        assert_eq!(properties["resolution_ms"]["default"], 1000);
        assert_eq!(properties["duration_ms"]["default"], 200);
        assert_eq!(properties["down"]["maxItems"], 100);
        assert_eq!(schemas["DownWindow"]["additionalProperties"], false);
        // The examples of a range run forwards.
        for schema in ["SimulateInput", "DownWindow"] {
            let example = |field: &str| {
                let text = schemas[schema]["properties"][field]["examples"][0].as_str();
                crate::api::schema::RequestTime::parse(text.unwrap())
                    .unwrap()
                    .0
            };
            assert!(example("from") < example("to"), "{schema}");
        }
        let decision = &schemas["SimulatedDecision"]["properties"];
        for field in [
            "tick",
            "at",
            "utc",
            "local",
            "branch_rule_id",
            "partition",
            "zone",
        ] {
            assert!(decision.get(field).is_some(), "{field}");
        }
        assert_eq!(
            schemas["SimulatedDecisionKind"]["enum"],
            json!([
                "run",
                "skipped",
                "held_by_window",
                "buffered",
                "retry",
                "finished",
                "lost"
            ])
        );
    }

    #[test]
    fn the_preview_shows_the_policy_and_its_decisions() {
        let schemas = &DOCUMENT["components"]["schemas"];
        let preview = &schemas["Preview"]["properties"];
        assert_eq!(
            preview["policy"]["oneOf"][0]["$ref"],
            "#/components/schemas/EffectivePolicy"
        );
        assert!(preview.get("runs").is_some() && preview.get("decisions").is_some());
        assert_eq!(
            schemas["PolicyStep"]["properties"]["decision"]["$ref"],
            "#/components/schemas/StepDecision"
        );
        let choices = &schemas["StepDecision"]["enum"];
        let mut expected = vec!["run"];
        expected.extend(crate::schedule::SkipReason::ALL.iter().map(|r| r.as_str()));
        assert_eq!(choices, &json!(expected));
    }

    #[test]
    fn the_policy_is_described_with_its_bounds_and_choices() {
        let schemas = &DOCUMENT["components"]["schemas"];
        let policy = &schemas["Policy"];
        assert_eq!(policy["additionalProperties"], false, "{policy}");
        for (field, minimum, maximum) in [
            ("catchup_window_seconds", 1, 31_536_000),
            ("catchup_max", 1, 1000),
            ("max_attempts", 1, 100),
            ("backoff_seconds", 0, 86_400),
            ("backoff_max_seconds", 0, 604_800),
            ("start_jitter_seconds", 0, 3_600),
        ] {
            // A nullable number states its bounds on its number branch.
            let property = &policy["properties"][field];
            let property = property.pointer("/oneOf/0").unwrap_or(property);
            assert_eq!(property["minimum"], minimum, "{field}: {property}");
            assert_eq!(property["maximum"], maximum, "{field}: {property}");
            let effective = &schemas["EffectivePolicy"]["properties"][field];
            assert_eq!(effective["minimum"], minimum, "{field}: {effective}");
            assert_eq!(effective["maximum"], maximum, "{field}: {effective}");
        }
        assert_eq!(
            schemas["Misfire"]["enum"],
            json!(["run_once", "skip", "run_all"])
        );
        assert_eq!(
            schemas["Overlap"]["enum"],
            json!(["skip", "buffer_one", "cancel_running"])
        );
        // Taken by both inputs of rules and branch rules, `null` allowed
        // (none on a create, clear on an update); shown on both views.
        for input in [
            "RuleCreate",
            "RuleUpdate",
            "BranchRuleCreate",
            "BranchRuleUpdate",
        ] {
            let field = &schemas[input]["properties"]["policy"]["oneOf"];
            assert_eq!(field[0]["$ref"], "#/components/schemas/Policy", "{input}");
            assert_eq!(field[1]["type"], "null", "{input}");
        }
        for view in ["Rule", "BranchRule"] {
            let field = &schemas[view]["properties"]["policy"]["oneOf"];
            assert_eq!(field[0]["$ref"], "#/components/schemas/Policy", "{view}");
        }
        let branch_rule = &schemas["BranchRule"]["properties"];
        assert_eq!(
            branch_rule["effective_policy"]["oneOf"][0]["$ref"],
            "#/components/schemas/EffectivePolicy"
        );
        for field in ["retry_of", "failed_attempts"] {
            assert!(branch_rule.get(field).is_some(), "{field}");
        }
    }

    #[test]
    fn executions_are_listed_by_every_status_skipped_included() {
        let statuses = &DOCUMENT["components"]["schemas"]["ExecutionStatus"]["enum"];
        let statuses: Vec<&str> = statuses
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let all: Vec<&str> = crate::model::ExecutionStatus::ALL
            .iter()
            .map(|s| s.as_str())
            .collect();
        assert_eq!(statuses, all);
        assert!(statuses.contains(&"skipped"));
        let parameters = &DOCUMENT["paths"]["/api/v1/executions"]["get"]["parameters"];
        let status = parameters
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "status")
            .unwrap();
        assert_eq!(
            status["schema"]["$ref"],
            "#/components/schemas/ExecutionStatus"
        );
    }

    #[test]
    fn creates_link_to_the_operations_on_what_they_created() {
        let links = &DOCUMENT["paths"]["/api/v1/brands"]["post"]["responses"]["201"]["links"];
        for operation in ["get_brand", "update_brand", "delete_brand"] {
            assert_eq!(
                links[operation]["parameters"]["id"], "$response.body#/id",
                "{links}"
            );
        }
        let nested = &DOCUMENT["paths"]["/api/v1/branch-rules/{id}/action-details"]["post"]["responses"]
            ["201"]["links"]["get_detail"]["parameters"];
        assert_eq!(nested["id"], "$request.path.id");
        assert_eq!(nested["detail_id"], "$response.body#/id");
        let branch_rule =
            &DOCUMENT["paths"]["/api/v1/branch-rules"]["post"]["responses"]["201"]["links"];
        assert!(branch_rule.get("run_now").is_some(), "{branch_rule}");
    }
}
