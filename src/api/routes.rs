//! The one table of `/api/v1` routes: the router and the OpenAPI document
//! are both built from it, so neither can list a route the other lacks.

use axum::Json;
use axum::routing::{MethodRouter, delete, get, post, put};
use serde_json::{Map, Value, json};

use super::ApiState;
use super::catalog as c;
use super::engine as e;

pub const PREFIX: &str = "/api/v1";

pub struct Route {
    pub method: &'static str,
    /// Relative to [`PREFIX`], in OpenAPI's `{param}` syntax (axum's too).
    pub path: &'static str,
    pub summary: &'static str,
    pub handler: MethodRouter<ApiState>,
}

fn r(
    method: &'static str,
    path: &'static str,
    summary: &'static str,
    handler: MethodRouter<ApiState>,
) -> Route {
    Route {
        method,
        path,
        summary,
        handler,
    }
}

pub fn table() -> Vec<Route> {
    vec![
        r("post", "/brands", "Create a brand", post(c::create_brand)),
        r("get", "/brands", "List brands", get(c::list_brands)),
        r("get", "/brands/{id}", "Get a brand", get(c::get_brand)),
        r(
            "put",
            "/brands/{id}",
            "Update a brand",
            put(c::update_brand),
        ),
        r(
            "delete",
            "/brands/{id}",
            "Delete brands (comma-separated ids)",
            delete(c::delete_brand),
        ),
        r(
            "post",
            "/branches",
            "Create a branch",
            post(c::create_branch),
        ),
        r("get", "/branches", "List branches", get(c::list_branches)),
        r("get", "/branches/{id}", "Get a branch", get(c::get_branch)),
        r(
            "put",
            "/branches/{id}",
            "Update a branch",
            put(c::update_branch),
        ),
        r(
            "delete",
            "/branches/{id}",
            "Delete branches (comma-separated ids)",
            delete(c::delete_branch),
        ),
        r("post", "/rules", "Create a rule", post(c::create_rule)),
        r("get", "/rules", "List rules", get(c::list_rules)),
        r("get", "/rules/{id}", "Get a rule", get(c::get_rule)),
        r("put", "/rules/{id}", "Update a rule", put(c::update_rule)),
        r(
            "delete",
            "/rules/{id}",
            "Delete rules (comma-separated ids)",
            delete(c::delete_rule),
        ),
        r(
            "post",
            "/action-templates",
            "Create an action template",
            post(c::create_template),
        ),
        r(
            "get",
            "/action-templates",
            "List action templates",
            get(c::list_templates),
        ),
        r(
            "get",
            "/action-templates/{id}",
            "Get an action template",
            get(c::get_template),
        ),
        r(
            "put",
            "/action-templates/{id}",
            "Update an action template",
            put(c::update_template),
        ),
        r(
            "delete",
            "/action-templates/{id}",
            "Delete action templates (409 while in use)",
            delete(c::delete_template),
        ),
        r(
            "post",
            "/branch-rules",
            "Create a branch rule, with its action details in one transaction",
            post(c::create_branch_rule),
        ),
        r(
            "get",
            "/branch-rules",
            "List branch rules",
            get(c::list_branch_rules),
        ),
        r(
            "get",
            "/branch-rules/due",
            "Branch rules ready to run now",
            get(e::due),
        ),
        r(
            "get",
            "/branch-rules/{id}",
            "Get a branch rule",
            get(c::get_branch_rule),
        ),
        r(
            "put",
            "/branch-rules/{id}",
            "Update a branch rule",
            put(c::update_branch_rule),
        ),
        r(
            "delete",
            "/branch-rules/{id}",
            "Delete branch rules (comma-separated ids)",
            delete(c::delete_branch_rules),
        ),
        r(
            "put",
            "/branch-rules/{id}/status",
            "Activate or deactivate a branch rule",
            put(e::set_status),
        ),
        r(
            "post",
            "/branch-rules/{id}/run",
            "Run a branch rule now",
            post(e::run_now),
        ),
        r(
            "post",
            "/branch-rules/{id}/force-stop",
            "Force-stop a branch rule and cancel its run",
            post(e::force_stop),
        ),
        r(
            "get",
            "/branch-rules/{id}/preview",
            "Next runs (count=N), honouring window, zone and DST",
            get(e::preview_runs),
        ),
        r(
            "post",
            "/branch-rules/{id}/action-details",
            "Add an action detail",
            post(c::create_detail),
        ),
        r(
            "get",
            "/branch-rules/{id}/action-details",
            "List a branch rule's action details",
            get(c::list_details),
        ),
        r(
            "get",
            "/branch-rules/{id}/action-details/{detail_id}",
            "Get an action detail",
            get(c::get_detail),
        ),
        r(
            "put",
            "/branch-rules/{id}/action-details/{detail_id}",
            "Update an action detail",
            put(c::update_detail),
        ),
        r(
            "delete",
            "/branch-rules/{id}/action-details/{detail_id}",
            "Delete an action detail",
            delete(c::delete_detail),
        ),
        r(
            "get",
            "/executions",
            "List executions (branch_rule_id, status, from, to, limit, cursor)",
            get(e::list_executions),
        ),
        r(
            "get",
            "/executions/{id}",
            "Get an execution",
            get(e::get_execution),
        ),
        r(
            "post",
            "/executions/{id}/cancel",
            "Cancel an execution",
            post(e::cancel_execution),
        ),
        r(
            "get",
            "/instances",
            "Instances sharing the database, with their partition leases",
            get(e::instances),
        ),
        r("get", "/plan", "The execution plan", get(e::plan)),
        r(
            "get",
            "/plan/ready",
            "Ids of the workflows ready now",
            get(e::plan_ready),
        ),
        r(
            "get",
            "/stats",
            "Queue, writer and plan statistics",
            get(e::stats),
        ),
        r(
            "get",
            "/openapi.json",
            "This document",
            get(openapi_handler),
        ),
    ]
}

/// The `Allow` header for `path` (relative to [`PREFIX`] or not): the
/// methods of the table's route that axum would pick for it, HEAD with GET
/// as axum serves it. None when no route matches, so the answer is a 404.
///
/// Routing prefers a literal segment over a `{param}` one at the first
/// place they differ (matchit's rule), so `/branch-rules/due` allows only
/// GET, not the methods of `/branch-rules/{id}`.
pub fn allowed_methods(path: &str) -> Option<String> {
    let path = path.strip_prefix(PREFIX).unwrap_or(path);
    let segments: Vec<&str> = path.split('/').collect();
    let table = table();
    let best = table
        .iter()
        .filter_map(|route| {
            let template: Vec<&str> = route.path.split('/').collect();
            if template.len() != segments.len() {
                return None;
            }
            let mut literal = Vec::with_capacity(template.len());
            for (t, s) in template.iter().zip(&segments) {
                let is_param = t.starts_with('{') && t.ends_with('}');
                if (is_param && s.is_empty()) || (!is_param && t != s) {
                    return None;
                }
                literal.push(!is_param);
            }
            Some((literal, route.path))
        })
        .max_by(|a, b| a.0.cmp(&b.0))?
        .1;
    let mut methods: Vec<String> = Vec::new();
    for route in table.iter().filter(|r| r.path == best) {
        methods.push(route.method.to_ascii_uppercase());
        if route.method == "get" {
            methods.push("HEAD".to_string());
        }
    }
    methods.sort();
    methods.dedup();
    Some(methods.join(","))
}

async fn openapi_handler() -> Json<Value> {
    Json(openapi())
}

/// The OpenAPI 3.1 document of [`table`].
pub fn openapi() -> Value {
    let mut paths: Map<String, Value> = Map::new();
    for route in table() {
        let full = format!("{PREFIX}{}", route.path);
        let params: Vec<Value> = route
            .path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(|name| json!({ "name": name, "in": "path", "required": true, "schema": { "type": "string" } }))
            .collect();
        let mut op = json!({
            "summary": route.summary,
            "parameters": params,
            "responses": {
                "200": { "description": "success" },
                "400": { "$ref": "#/components/responses/Error" },
                "404": { "$ref": "#/components/responses/Error" },
                "405": { "$ref": "#/components/responses/Error" },
            },
        });
        if route.method != "get" {
            op["security"] = json!([{ "bearer": [] }]);
            op["responses"]["401"] = json!({ "$ref": "#/components/responses/Error" });
            op["responses"]["403"] = json!({ "$ref": "#/components/responses/Error" });
            op["responses"]["409"] = json!({ "$ref": "#/components/responses/Error" });
        }
        if matches!(route.method, "post" | "put") {
            op["responses"]["413"] = json!({ "$ref": "#/components/responses/Error" });
            op["responses"]["415"] = json!({ "$ref": "#/components/responses/Error" });
            op["requestBody"] =
                json!({ "content": { "application/json": { "schema": { "type": "object" } } } });
        }
        let entry = paths.entry(full).or_insert_with(|| json!({}));
        entry[route.method] = op;
    }
    json!({
        "openapi": "3.1.0",
        "info": { "title": "ruled", "version": env!("CARGO_PKG_VERSION") },
        "paths": paths,
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
            "responses": {
                "Error": {
                    "description": "{\"error\": {\"code\", \"message\"}}",
                    "content": { "application/json": { "schema": {
                        "type": "object",
                        "properties": { "error": { "type": "object", "properties": {
                            "code": { "type": "string" }, "message": { "type": "string" }
                        } } }
                    } } }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::allowed_methods;

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
}
