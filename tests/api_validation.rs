//! One test per validation rule: each bad field is a 400 whose message
//! names the field, on create and on update, and nothing is saved.

mod common;

use std::time::Duration;

use common::TestDb;
use common::api::{Api, id};
use common::service::{RunningService, start_service_with};
use reqwest::{Method, StatusCode};
use ruled::config::Config;
use serde_json::{Value, json};

/// Ids of one valid brand → branch → rule → template → branch rule.
struct Fixture {
    brand: String,
    branch: String,
    rule: String,
    template: String,
    branch_rule: String,
}

async fn start(db: &TestDb) -> (RunningService, Api, Fixture) {
    let running = start_service_with(&db.url, |c| Config {
        api_token: Some("t0ken".into()),
        master_grace_period: Duration::from_secs(600),
        ..c
    })
    .await;
    let api = Api::new(&running.service);
    let brand = id(&api.post("/api/v1/brands", &json!({ "name": "b" })).await);
    let branch = id(&api
        .post(
            "/api/v1/branches",
            &json!({ "brand_id": brand, "name": "x" }),
        )
        .await);
    let rule = id(&api
        .post(
            "/api/v1/rules",
            &json!({ "name": "r", "cron_expression": "0 3 * * *" }),
        )
        .await);
    let template = id(&api
        .post(
            "/api/v1/action-templates",
            &json!({ "name": "t", "kind": "noop" }),
        )
        .await);
    let branch_rule = id(&api
        .post(
            "/api/v1/branch-rules",
            &json!({ "branch_id": branch, "rule_id": rule }),
        )
        .await);
    let fixture = Fixture {
        brand,
        branch,
        rule,
        template,
        branch_rule,
    };
    (running, api, fixture)
}

/// Sends the request built from the fixture, expects a 400 naming
/// `field`, and checks the fixture's rows are unchanged.
async fn expect_400(
    db: TestDb,
    field: &str,
    request: impl Fn(&Fixture) -> (Method, String, Value),
) {
    let (running, api, fixture) = start(&db).await;
    let before = snapshot(&api).await;
    let (method, path, body) = request(&fixture);
    let reply = api
        .send(method, &path, Some(serde_json::to_vec(&body).unwrap()))
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text);
    assert!(!reply.error_code().is_empty(), "{}", reply.text);
    assert!(
        reply.error_message().contains(field),
        "the message should name {field}: {}",
        reply.text
    );
    assert_eq!(
        snapshot(&api).await,
        before,
        "a refused request changed something"
    );
    running.service.shutdown("test").await.unwrap();
}

async fn snapshot(api: &Api) -> Vec<Value> {
    let mut all = Vec::new();
    for path in [
        "brands",
        "branches",
        "rules",
        "action-templates",
        "branch-rules",
    ] {
        all.push(api.get(&format!("/api/v1/{path}")).await.json);
    }
    all
}

macro_rules! rejects {
    ($name:ident, $field:expr, |$f:ident| $request:expr) => {
        both_backends!(
            $name,
            tokio::test(flavor = "multi_thread", worker_threads = 2),
            |db: TestDb| async move {
                expect_400(db, $field, |$f: &Fixture| $request).await;
            }
        );
    };
}

rejects!(cron_with_a_bad_minute, "cron_expression", |f| (
    Method::POST,
    "/api/v1/rules".into(),
    json!({ "brand_id": f.brand, "name": "r", "cron_expression": "61 * * * *" })
));

rejects!(cron_with_a_seconds_field, "cron_expression", |f| (
    Method::PUT,
    format!("/api/v1/rules/{}", f.rule),
    json!({ "cron_expression": "0 0 3 * * *" })
));

rejects!(unknown_time_zone_on_create, "timezone", |f| (
    Method::POST,
    "/api/v1/branches".into(),
    json!({ "brand_id": f.brand, "name": "x", "timezone": "Mars/Olympus" })
));

rejects!(unknown_time_zone_on_update, "timezone", |f| (
    Method::PUT,
    format!("/api/v1/branches/{}", f.branch),
    json!({ "timezone": "Europe/Atlantis" })
));

rejects!(window_start_not_hh_mm, "operation_time_from", |f| (
    Method::POST,
    "/api/v1/branch-rules".into(),
    json!({ "branch_id": f.branch, "rule_id": f.rule, "operation_time_from": "25:00" })
));

rejects!(window_end_not_hh_mm, "operation_time_to", |f| (
    Method::PUT,
    format!("/api/v1/branch-rules/{}", f.branch_rule),
    json!({ "operation_time_to": "9am" })
));

rejects!(unknown_template_kind, "kind", |f| (
    Method::PUT,
    format!("/api/v1/action-templates/{}", f.template),
    json!({ "kind": "teleport" })
));

rejects!(secret_keys_that_are_not_a_list, "config.secret_keys", |f| (
    Method::PUT,
    format!("/api/v1/action-templates/{}", f.template),
    json!({ "config": { "secret_keys": "tenant", "tenant": "T0K" } })
));

rejects!(
    secret_keys_under_another_spelling,
    "params.secretKeys",
    |f| (
        Method::POST,
        format!("/api/v1/branch-rules/{}/action-details", f.branch_rule),
        json!({
            "action_template_id": f.template,
            "params": { "secretKeys": ["tenant"], "tenant": "T0K" },
        })
    )
);

rejects!(unknown_field, "colour", |f| (
    Method::PUT,
    format!("/api/v1/brands/{}", f.brand),
    json!({ "colour": "red" })
));

rejects!(unknown_field_in_an_action_detail, "colour", |f| (
    Method::POST,
    "/api/v1/branch-rules".into(),
    json!({
        "branch_id": f.branch, "rule_id": f.rule,
        "action_details": [{ "action_template_id": f.template, "colour": "red" }],
    })
));

rejects!(id_that_is_not_a_uuid, "brand_id", |_f| (
    Method::POST,
    "/api/v1/branches".into(),
    json!({ "brand_id": "not-a-uuid", "name": "x" })
));

rejects!(missing_required_field, "name", |_f| (
    Method::POST,
    "/api/v1/rules".into(),
    json!({ "cron_expression": "* * * * *" })
));

rejects!(wrong_json_type, "is_active", |f| (
    Method::PUT,
    format!("/api/v1/branch-rules/{}/status", f.branch_rule),
    json!({ "is_active": "yes" })
));

rejects!(branch_rule_status_outside_its_set, "status", |f| (
    Method::PUT,
    format!("/api/v1/branch-rules/{}/status", f.branch_rule),
    json!({ "status": "paused" })
));

rejects!(branch_rule_status_without_a_field, "is_active", |f| (
    Method::PUT,
    format!("/api/v1/branch-rules/{}/status", f.branch_rule),
    json!({})
));

rejects!(rule_status_outside_its_set, "status", |f| (
    Method::PUT,
    format!("/api/v1/rules/{}", f.rule),
    json!({ "status": "paused" })
));

rejects!(next_run_time_not_rfc3339, "next_run_time", |f| (
    Method::PUT,
    format!("/api/v1/branch-rules/{}", f.branch_rule),
    json!({ "next_run_time": "tomorrow" })
));

rejects!(policy_attempts_below_one, "policy.max_attempts", |_f| (
    Method::POST,
    "/api/v1/rules".into(),
    json!({ "name": "r", "cron_expression": "* * * * *", "policy": { "max_attempts": 0 } })
));

rejects!(policy_with_an_unknown_key, "policy.retries", |f| (
    Method::PUT,
    format!("/api/v1/branch-rules/{}", f.branch_rule),
    json!({ "policy": { "retries": 1 } })
));

rejects!(policy_misfire_outside_its_set, "policy.misfire", |f| (
    Method::PUT,
    format!("/api/v1/rules/{}", f.rule),
    json!({ "policy": { "misfire": "sometimes" } })
));

rejects!(policy_that_is_not_an_object, "policy", |f| (
    Method::POST,
    "/api/v1/branch-rules".into(),
    json!({ "branch_id": f.branch, "rule_id": f.rule, "policy": [] })
));

both_backends!(
    preview_count_out_of_range,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api, f) = start(&db).await;
        for count in ["0", "100000"] {
            let reply = api
                .get(&format!(
                    "/api/v1/branch-rules/{}/preview?count={count}",
                    f.branch_rule
                ))
                .await;
            assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text);
            assert!(reply.error_message().contains("count"), "{}", reply.text);
        }
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    missing_ids_are_404_for_every_verb,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api, f) = start(&db).await;
        let missing = uuid::Uuid::new_v4();
        let body = json!({});
        for path in [
            "brands",
            "branches",
            "rules",
            "action-templates",
            "branch-rules",
        ] {
            let url = format!("/api/v1/{path}/{missing}");
            assert_eq!(
                api.put(&url, &body).await.status,
                StatusCode::NOT_FOUND,
                "PUT {url}"
            );
            assert_eq!(
                api.delete(&url).await.status,
                StatusCode::NOT_FOUND,
                "DELETE {url}"
            );
        }
        for (method, url) in [
            (Method::POST, format!("/api/v1/branch-rules/{missing}/run")),
            (
                Method::POST,
                format!("/api/v1/branch-rules/{missing}/force-stop"),
            ),
            (
                Method::PUT,
                format!("/api/v1/branch-rules/{missing}/status"),
            ),
            (
                Method::GET,
                format!("/api/v1/branch-rules/{missing}/preview"),
            ),
            (
                Method::GET,
                format!("/api/v1/branch-rules/{missing}/action-details"),
            ),
            (
                Method::GET,
                format!(
                    "/api/v1/branch-rules/{}/action-details/{missing}",
                    f.branch_rule
                ),
            ),
            (Method::POST, format!("/api/v1/executions/{missing}/cancel")),
        ] {
            let body = if method == Method::PUT {
                Some(b"{\"is_active\": true}".to_vec())
            } else {
                None
            };
            let reply = api.send(method.clone(), &url, body).await;
            assert_eq!(
                reply.status,
                StatusCode::NOT_FOUND,
                "{method} {url}: {}",
                reply.text
            );
        }
        // Deleting several ids where one is missing deletes none.
        let both = format!("/api/v1/branch-rules/{},{missing}", f.branch_rule);
        assert_eq!(api.delete(&both).await.status, StatusCode::NOT_FOUND);
        assert_eq!(
            api.get(&format!("/api/v1/branch-rules/{}", f.branch_rule))
                .await
                .status,
            StatusCode::OK
        );
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    every_mutation_needs_the_token,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api, f) = start(&db).await;
        let anonymous = api.without_token();
        // The document says which operations take the token: every change,
        // and nothing else (a simulation is a POST that changes nothing).
        let (guarded, open): (Vec<_>, Vec<_>) = ruled::api::routes::operations()
            .into_iter()
            .filter(|(method, _)| method != "get")
            .partition(|(method, path)| {
                ruled::api::routes::requires_token(method, path) == Some(true)
            });
        assert_eq!(open, [("post".to_string(), "/simulate".to_string())]);
        for (method, path) in guarded {
            let url = format!("/api/v1{path}")
                .replace("{id}", &f.branch_rule)
                .replace("{detail_id}", &f.template);
            let method: Method = method.to_uppercase().parse().unwrap();
            let reply = anonymous
                .send(method.clone(), &url, Some(b"{}".to_vec()))
                .await;
            assert_eq!(
                reply.status,
                StatusCode::UNAUTHORIZED,
                "{method} {url}: {}",
                reply.text
            );
        }
        assert_eq!(
            api.get(&format!("/api/v1/branch-rules/{}", f.branch_rule))
                .await
                .status,
            StatusCode::OK
        );
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    a_masked_secret_sent_back_is_kept_only_where_it_was_going_and_still_secret,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api, _f) = start(&db).await;
        let config = json!({
            "method": "POST",
            "url": "https://api.example/hook",
            "headers": { "Authorization": "Bearer s3cr3t-value" },
            "secret_keys": ["tenant"],
            "tenant": "T0K-tenant",
        });
        let template = id(&api
            .post(
                "/api/v1/action-templates",
                &json!({ "name": "hook", "kind": "http", "config": config }),
            )
            .await);
        let path = format!("/api/v1/action-templates/{template}");
        let shown = api.get(&path).await.json["config"].clone();
        assert_eq!(shown["tenant"], "***", "{shown}");

        // The masked values sent back with another url, or without the
        // declaration that hides one of them: 400 naming the field.
        let mut elsewhere = shown.clone();
        elsewhere["url"] = json!("https://attacker.example/collect");
        let mut undeclared = shown.clone();
        undeclared.as_object_mut().unwrap().remove("secret_keys");
        for (body, field) in [
            (elsewhere, "config.url"),
            (undeclared, "config.secret_keys"),
        ] {
            let reply = api.put(&path, &json!({ "config": body })).await;
            assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text);
            assert!(reply.error_message().starts_with(field), "{}", reply.text);
        }
        // Nothing was saved: the secret is still stored, and still hidden.
        let after = api.get(&path).await.json["config"].clone();
        assert_eq!(after, shown);
        // Sent back as shown, it is kept.
        let same = api.put(&path, &json!({ "config": shown })).await;
        assert_eq!(same.status, StatusCode::OK, "{}", same.text);
        assert!(!same.text.contains("T0K-tenant") && !same.text.contains("s3cr3t-value"));
        running.service.shutdown("test").await.unwrap();
    }
);
