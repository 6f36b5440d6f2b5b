//! The HTTP API over real loopback HTTP, on SQLite and PostgreSQL.

mod common;

use std::time::Duration;

use common::api::{Api, Reply, id};
use common::service::{RunningService, start_service_with, without_delays};
use common::{TestDb, eventually};
use reqwest::{Method, StatusCode};
use ruled::config::Config;
use serde_json::{Value, json};

const TOKEN: &str = "test-token-123";
const DEADLINE: Duration = Duration::from_secs(30);

fn fast(config: Config) -> Config {
    Config {
        api_token: Some(TOKEN.into()),
        ..without_delays(config)
    }
}

/// Takes the whole `TestDb` so the closure keeps the database alive.
async fn start(db: &TestDb, adjust: impl FnOnce(Config) -> Config) -> (RunningService, Api) {
    let running = start_service_with(&db.url, |c| adjust(fast(c))).await;
    let api = Api::new(&running.service);
    (running, api)
}

/// brand → branch (in `zone`) → rule → template → branch rule with one
/// action; returns (branch rule id, template id).
async fn create_rule(
    api: &Api,
    zone: &str,
    cron: &str,
    kind: &str,
    config: Value,
    extra: Value,
) -> (String, String) {
    let brand = id(&api.post("/api/v1/brands", &json!({ "name": "Acme" })).await);
    let branch = id(&api
        .post(
            "/api/v1/branches",
            &json!({ "brand_id": brand, "name": "Riyadh", "timezone": zone }),
        )
        .await);
    let rule = id(&api
        .post(
            "/api/v1/rules",
            &json!({ "brand_id": brand, "name": "close", "cron_expression": cron }),
        )
        .await);
    let template = id(&api
        .post(
            "/api/v1/action-templates",
            &json!({ "name": "t", "kind": kind, "config": config }),
        )
        .await);
    let mut body = json!({
        "branch_id": branch,
        "rule_id": rule,
        "action_details": [{ "action_template_id": template, "params": { "headers": { "Authorization": "Bearer hidden" } } }],
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let created = api.post("/api/v1/branch-rules", &body).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text);
    (id(&created), template)
}

fn assert_error(reply: &Reply, status: StatusCode, field: &str) {
    assert_eq!(reply.status, status, "{}", reply.text);
    assert!(!reply.error_code().is_empty(), "error body: {}", reply.text);
    assert!(
        reply.error_message().contains(field),
        "message should name {field}: {}",
        reply.text
    );
}

both_backends!(
    crud_of_every_resource,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api) = start(&db, |c| c).await;
        let (br, template) = create_rule(
            &api,
            "Asia/Riyadh",
            "30 2 * * *",
            "noop",
            json!({}),
            json!({
                "operation_time_from": "01:00", "operation_time_to": "05:00"
            }),
        )
        .await;

        let got = api.get(&format!("/api/v1/branch-rules/{br}")).await;
        assert_eq!(got.status, StatusCode::OK);
        assert_eq!(got.json["id"], br.as_str());
        assert_eq!(got.json["is_active"], true);
        assert_eq!(got.json["operation_time_from"], "01:00");
        assert!(
            got.json["next_run_time"]
                .as_str()
                .unwrap()
                .ends_with("+00:00")
        );
        // 02:30 in Riyadh (UTC+3) is 23:30 UTC.
        assert!(
            got.json["next_run_time"]
                .as_str()
                .unwrap()
                .contains("T23:30:00"),
            "{}",
            got.text
        );
        assert!(
            got.json["next_run_time_local"]
                .as_str()
                .unwrap()
                .contains("T02:30:00+03:00"),
            "{}",
            got.text
        );
        let details = &got.json["action_details"];
        assert_eq!(details.as_array().unwrap().len(), 1);
        assert_eq!(
            details[0]["params"]["headers"]["Authorization"], "***",
            "secrets are redacted"
        );

        // Update and list on each resource.
        for (path, field, value) in [
            ("brands", "name", json!("Acme 2")),
            ("action-templates", "name", json!("renamed")),
        ] {
            let list = api.get(&format!("/api/v1/{path}")).await;
            assert_eq!(list.status, StatusCode::OK);
            let first = list.json[0]["id"].as_str().unwrap().to_string();
            let updated = api
                .put(&format!("/api/v1/{path}/{first}"), &json!({ field: value }))
                .await;
            assert_eq!(updated.status, StatusCode::OK, "{}", updated.text);
            assert_eq!(updated.json[field], value);
            assert_eq!(
                api.get(&format!("/api/v1/{path}/{first}")).await.json[field],
                value
            );
        }
        let rule_id = got.json["rule_id"].as_str().unwrap().to_string();
        let rule = api
            .put(
                &format!("/api/v1/rules/{rule_id}"),
                &json!({ "cron_expression": "0 4 * * *" }),
            )
            .await;
        assert_eq!(rule.status, StatusCode::OK, "{}", rule.text);
        let moved = api.get(&format!("/api/v1/branch-rules/{br}")).await;
        assert!(
            moved.json["next_run_time_local"]
                .as_str()
                .unwrap()
                .contains("T04:00:00+03:00"),
            "{}",
            moved.text
        );
        let branch_id = got.json["branch_id"].as_str().unwrap().to_string();
        assert_eq!(
            api.put(
                &format!("/api/v1/branches/{branch_id}"),
                &json!({ "name": "Jeddah" })
            )
            .await
            .json["name"],
            "Jeddah"
        );
        assert_eq!(
            api.get("/api/v1/rules")
                .await
                .json
                .as_array()
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            api.get("/api/v1/branches")
                .await
                .json
                .as_array()
                .unwrap()
                .len(),
            1
        );

        // Status, preview.
        let off = api
            .put(
                &format!("/api/v1/branch-rules/{br}/status"),
                &json!({ "is_active": false }),
            )
            .await;
        assert_eq!(off.json["is_active"], false, "{}", off.text);
        // Seed 001's words say the same.
        let status = format!("/api/v1/branch-rules/{br}/status");
        let on = api.put(&status, &json!({ "status": "active" })).await;
        assert_eq!(on.json["is_active"], true, "{}", on.text);
        let off = api.put(&status, &json!({ "status": "inactive" })).await;
        assert_eq!(off.json["is_active"], false, "{}", off.text);
        let preview = api
            .get(&format!("/api/v1/branch-rules/{br}/preview?count=3"))
            .await;
        assert_eq!(preview.status, StatusCode::OK, "{}", preview.text);
        let runs = preview.json["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 3);
        assert!(
            runs[0]["local"]
                .as_str()
                .unwrap()
                .contains("T04:00:00+03:00")
        );

        // Nested action details.
        let details_path = format!("/api/v1/branch-rules/{br}/action-details");
        let added = api
            .post(
                &details_path,
                &json!({ "action_template_id": template, "params": { "n": 1 } }),
            )
            .await;
        assert_eq!(added.status, StatusCode::CREATED, "{}", added.text);
        assert_eq!(added.json["position"], 1);
        let detail = id(&added);
        assert_eq!(
            api.get(&details_path).await.json.as_array().unwrap().len(),
            2
        );
        let changed = api
            .put(
                &format!("{details_path}/{detail}"),
                &json!({ "position": 5 }),
            )
            .await;
        assert_eq!(changed.json["position"], 5, "{}", changed.text);
        assert_eq!(
            api.get(&format!("{details_path}/{detail}")).await.json["position"],
            5
        );
        assert_eq!(
            api.delete(&format!("{details_path}/{detail}")).await.status,
            StatusCode::NO_CONTENT
        );
        assert_eq!(
            api.get(&format!("{details_path}/{detail}")).await.status,
            StatusCode::NOT_FOUND
        );

        // 409: the template is still used by the rule's first action.
        let in_use = api
            .delete(&format!("/api/v1/action-templates/{template}"))
            .await;
        assert_error(&in_use, StatusCode::CONFLICT, "conflict");
        // 409: a branch for a brand that does not exist.
        let orphan = api
            .post(
                "/api/v1/branches",
                &json!({ "brand_id": uuid::Uuid::new_v4(), "name": "x" }),
            )
            .await;
        assert_eq!(orphan.status, StatusCode::CONFLICT, "{}", orphan.text);

        // Several ids at once; then 404 for each.
        let (second, _) = create_rule(&api, "UTC", "0 0 1 1 *", "noop", json!({}), json!({})).await;
        let gone = api
            .delete(&format!("/api/v1/branch-rules/{br},{second}"))
            .await;
        assert_eq!(gone.status, StatusCode::NO_CONTENT, "{}", gone.text);
        for id in [&br, &second] {
            assert_error(
                &api.get(&format!("/api/v1/branch-rules/{id}")).await,
                StatusCode::NOT_FOUND,
                id,
            );
        }
        assert_eq!(
            api.delete(&format!("/api/v1/action-templates/{template}"))
                .await
                .status,
            StatusCode::NO_CONTENT
        );
        for path in [
            "brands",
            "branches",
            "rules",
            "action-templates",
            "branch-rules",
            "executions",
        ] {
            let missing = uuid::Uuid::new_v4();
            assert_error(
                &api.get(&format!("/api/v1/{path}/{missing}")).await,
                StatusCode::NOT_FOUND,
                &missing.to_string(),
            );
        }
        let plan = api.get("/api/v1/plan").await;
        assert_eq!(plan.status, StatusCode::OK);
        // Times are RFC 3339 here too, like every other endpoint's.
        let workflow = &plan.json["workflows"][0];
        for time in [
            &plan.json["saved_at"],
            &workflow["branch_rule"]["next_run_time"],
            &workflow["branch_rule"]["created_at"],
        ] {
            let text = time
                .as_str()
                .unwrap_or_else(|| panic!("{time} in {}", plan.text));
            chrono::DateTime::parse_from_rfc3339(text).unwrap();
        }
        assert!(workflow["partition"].is_u64(), "{workflow}");
        assert!(workflow["partition_owner"].is_string(), "{workflow}");
        assert!(api.get("/api/v1/plan/ready").await.json["ready"].is_array());
        let stats = api.get("/api/v1/stats").await;
        assert!(
            stats.json["queue"].is_object()
                && stats.json["writer"]["write_thread_alive"].is_boolean(),
            "{}",
            stats.text
        );
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    refused_requests_save_nothing,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api) = start(&db, |c| c).await;
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
                &json!({ "name": "r", "cron_expression": "* * * * *" }),
            )
            .await);
        let cases: Vec<(&str, Value, &str)> = vec![
            (
                "/api/v1/rules",
                json!({ "name": "r", "cron_expression": "61 * * * *" }),
                "cron_expression",
            ),
            (
                "/api/v1/rules",
                json!({ "name": "r", "cron_expression": "0 0 * * * *" }),
                "cron_expression",
            ),
            (
                "/api/v1/branches",
                json!({ "brand_id": brand, "name": "x", "timezone": "Mars/Olympus" }),
                "timezone",
            ),
            (
                "/api/v1/branch-rules",
                json!({ "branch_id": branch, "rule_id": rule, "operation_time_from": "25:00" }),
                "operation_time_from",
            ),
            (
                "/api/v1/branch-rules",
                json!({ "branch_id": branch, "rule_id": rule, "operation_time_to": "9am" }),
                "operation_time_to",
            ),
            (
                "/api/v1/action-templates",
                json!({ "name": "t", "kind": "teleport" }),
                "kind",
            ),
            (
                "/api/v1/brands",
                json!({ "name": "b", "colour": "red" }),
                "colour",
            ),
            (
                "/api/v1/branches",
                json!({ "brand_id": "not-a-uuid", "name": "x" }),
                "brand_id",
            ),
            (
                "/api/v1/rules",
                json!({ "cron_expression": "* * * * *" }),
                "name",
            ),
        ];
        for (path, body, field) in cases {
            let reply = api.post(path, &body).await;
            assert_error(&reply, StatusCode::BAD_REQUEST, field);
        }
        // Nothing was saved by the refused requests, including the branch rule
        // whose action detail was bad (one transaction).
        let bad_detail = api
            .post(
                "/api/v1/branch-rules",
                &json!({
                    "branch_id": branch, "rule_id": rule,
                    "action_details": [{ "action_template_id": uuid::Uuid::new_v4() }],
                }),
            )
            .await;
        assert_eq!(
            bad_detail.status,
            StatusCode::CONFLICT,
            "{}",
            bad_detail.text
        );
        assert_eq!(
            api.get("/api/v1/rules")
                .await
                .json
                .as_array()
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            api.get("/api/v1/branches")
                .await
                .json
                .as_array()
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            api.get("/api/v1/branch-rules")
                .await
                .json
                .as_array()
                .unwrap()
                .len(),
            0
        );
        assert_eq!(
            api.get("/api/v1/action-templates")
                .await
                .json
                .as_array()
                .unwrap()
                .len(),
            0
        );
        assert_error(
            &api.get("/api/v1/executions?status=sleeping").await,
            StatusCode::BAD_REQUEST,
            "status",
        );
        assert_error(
            &api.get("/api/v1/executions?limit=0").await,
            StatusCode::BAD_REQUEST,
            "limit",
        );
        assert_error(
            &api.get("/api/v1/executions?cursor=zzz").await,
            StatusCode::BAD_REQUEST,
            "cursor",
        );
        running.service.shutdown("test").await.unwrap();
    }
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_mebibyte_body_is_refused_unread() {
    let db = common::sqlite_db().await;
    let (running, api) = start(&db, |c| c).await;
    let huge = format!("{{\"name\": \"{}\"}}", "x".repeat(1024 * 1024));
    let reply = api
        .send(Method::POST, "/api/v1/brands", Some(huge.into_bytes()))
        .await;
    assert_eq!(
        reply.status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        reply.text
    );
    assert_eq!(reply.error_code(), "body_too_large");
    // Without a Content-Length (chunked), the limit holds while streaming:
    // the server answers 413 once 64 KiB arrived, without the rest.
    let status = chunked_post(running.service.http_addr(), 1024 * 1024).await;
    assert!(status.starts_with("HTTP/1.1 413"), "{status}");
    // A client of its own: the server closes a connection whose body it
    // refused unread, and the first client may still hold it in its pool
    // (a reuse then fails with IncompleteMessage, as CI once saw).
    let brands = Api::at(running.service.http_addr(), None)
        .get("/api/v1/brands")
        .await;
    assert_eq!(brands.json.as_array().unwrap().len(), 0, "{}", brands.text);
    running.service.shutdown("test").await.unwrap();
}

/// POSTs `total` bytes of a JSON string in 16 KiB chunks over a raw
/// socket; returns the response's status line.
async fn chunked_post(addr: std::net::SocketAddr, total: usize) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /api/v1/brands HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\n\
         content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    let chunk = vec![b'x'; 16 * 1024];
    let mut sent = 0;
    while sent < total {
        let mut frame = format!("{:x}\r\n", chunk.len()).into_bytes();
        frame.extend_from_slice(&chunk);
        frame.extend_from_slice(b"\r\n");
        // The server may answer and close before everything is sent.
        if socket.write_all(&frame).await.is_err() {
            break;
        }
        sent += chunk.len();
    }
    let _ = socket.write_all(b"0\r\n\r\n").await;
    let mut response = vec![0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(10), socket.read(&mut response))
        .await
        .unwrap()
        .unwrap_or(0);
    String::from_utf8_lossy(&response[..n])
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

both_backends!(
    mutations_need_the_token,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api) = start(&db, |c| c).await;
        let body = json!({ "name": "b" });
        let missing = api.without_token().post("/api/v1/brands", &body).await;
        assert_error(&missing, StatusCode::UNAUTHORIZED, "token");
        let wrong = api
            .with_token("test-token-124")
            .post("/api/v1/brands", &body)
            .await;
        assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
        for refused in [&missing, &wrong] {
            let challenge = refused.headers["www-authenticate"].to_str().unwrap();
            assert!(challenge.starts_with("Bearer"), "{challenge}");
        }
        assert_eq!(
            api.without_token().get("/api/v1/brands").await.status,
            StatusCode::OK
        );
        assert_eq!(
            api.get("/api/v1/brands")
                .await
                .json
                .as_array()
                .unwrap()
                .len(),
            0
        );
        running.service.shutdown("test").await.unwrap();

        // Without API_TOKEN: read-only, and the 403 says how to enable writes.
        let (running, api) = start(&db, |c| Config {
            api_token: None,
            ..c
        })
        .await;
        let refused = api
            .with_token("anything")
            .post("/api/v1/brands", &body)
            .await;
        assert_error(&refused, StatusCode::FORBIDDEN, "API_TOKEN");
        assert_eq!(api.get("/api/v1/brands").await.status, StatusCode::OK);
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    a_rule_created_through_the_api_runs_within_two_seconds_of_due,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        // Seed 004's dedup skips a rule finished within RECENTLY_PROCESSED_SECONDS,
        // run now included; off here so the second run need not wait 30 s.
        let (running, api) = start(&db, |c| Config {
            recently_processed: Duration::ZERO,
            ..c
        })
        .await;
        let due = chrono::Utc::now() + chrono::Duration::milliseconds(1500);
        let (br, _) = create_rule(
            &api,
            "UTC",
            "0 0 1 1 *",
            "noop",
            json!({}),
            json!({
                "next_run_time": due.to_rfc3339()
            }),
        )
        .await;
        let path = format!("/api/v1/executions?branch_rule_id={br}&status=completed");
        eventually(DEADLINE, "the rule's run completed", || async {
            !api.get(&path).await.json["items"]
                .as_array()
                .unwrap()
                .is_empty()
        })
        .await;
        let execution = api.get(&path).await.json["items"][0].clone();
        let started =
            chrono::DateTime::parse_from_rfc3339(execution["started_at"].as_str().unwrap())
                .unwrap();
        let lag = started.signed_duration_since(due);
        assert!(
            lag < chrono::Duration::seconds(2),
            "started {lag} after due"
        );
        let one = api
            .get(&format!(
                "/api/v1/executions/{}",
                execution["id"].as_str().unwrap()
            ))
            .await;
        assert_eq!(one.json["status"], "completed", "{}", one.text);
        // Run now makes it run again at once.
        let run = api
            .post_empty(&format!("/api/v1/branch-rules/{br}/run"))
            .await;
        assert_eq!(run.status, StatusCode::ACCEPTED, "{}", run.text);
        eventually(DEADLINE, "the run-now run completed", || async {
            api.get(&path).await.json["items"].as_array().unwrap().len() == 2
        })
        .await;
        // Paging: one per page, the cursor leads to the second.
        let first = api
            .get(&format!("/api/v1/executions?branch_rule_id={br}&limit=1"))
            .await;
        let cursor = first.json["next_cursor"].as_str().unwrap().to_string();
        let second = api
            .get(&format!(
                "/api/v1/executions?branch_rule_id={br}&limit=1&cursor={cursor}"
            ))
            .await;
        assert_ne!(first.json["items"][0]["id"], second.json["items"][0]["id"]);
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    cancel_before_and_after_the_handoff,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        // One worker: the first rule's long sleep holds it, so the second
        // rule's job stays queued (before the handoff).
        let (running, api) = start(&db, |c| Config {
            worker_count: 1,
            ..c
        })
        .await;
        let now = chrono::Utc::now().to_rfc3339();
        let (busy, _) = create_rule(
            &api,
            "UTC",
            "0 0 1 1 *",
            "sleep",
            json!({ "ms": 60_000 }),
            json!({ "next_run_time": now }),
        )
        .await;
        let running_of = |br: String, status: &'static str| {
            let api = &api;
            async move {
                let reply = api
                    .get(&format!(
                        "/api/v1/executions?branch_rule_id={br}&status={status}"
                    ))
                    .await;
                reply.json["items"].as_array().unwrap().first().cloned()
            }
        };
        eventually(DEADLINE, "the sleep job runs", || async {
            running_of(busy.clone(), "running").await.is_some()
        })
        .await;
        let (queued, _) = create_rule(
            &api,
            "UTC",
            "0 0 1 1 *",
            "noop",
            json!({}),
            json!({ "next_run_time": now }),
        )
        .await;
        eventually(DEADLINE, "the second job is requested", || async {
            running_of(queued.clone(), "requested").await.is_some()
        })
        .await;

        let waiting = running_of(queued.clone(), "requested").await.unwrap();
        let cancel = api
            .post_empty(&format!(
                "/api/v1/executions/{}/cancel",
                waiting["id"].as_str().unwrap()
            ))
            .await;
        assert_eq!(cancel.status, StatusCode::ACCEPTED, "{}", cancel.text);
        assert_eq!(cancel.json["outcome"], "cancelled_before_handoff");
        let cancelled = running_of(queued.clone(), "cancelled")
            .await
            .expect("recorded Cancelled");
        assert!(
            cancelled["started_at"].is_null(),
            "never handed to a worker: {cancelled}"
        );

        let sleeping = running_of(busy.clone(), "running").await.unwrap();
        let cancel = api
            .post_empty(&format!(
                "/api/v1/executions/{}/cancel",
                sleeping["id"].as_str().unwrap()
            ))
            .await;
        assert_eq!(cancel.status, StatusCode::ACCEPTED, "{}", cancel.text);
        assert_eq!(cancel.json["outcome"], "cancel_sent_to_worker");
        eventually(DEADLINE, "the worker records Cancelled", || async {
            running_of(busy.clone(), "cancelled").await.is_some()
        })
        .await;
        let done = running_of(busy.clone(), "cancelled").await.unwrap();
        assert!(
            !done["started_at"].is_null(),
            "the worker had started it: {done}"
        );
        // A second cancel of an ended execution conflicts.
        let again = api
            .post_empty(&format!(
                "/api/v1/executions/{}/cancel",
                sleeping["id"].as_str().unwrap()
            ))
            .await;
        assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.text);
        let stop = api
            .post_empty(&format!("/api/v1/branch-rules/{busy}/force-stop"))
            .await;
        assert_eq!(stop.status, StatusCode::OK, "{}", stop.text);
        assert_eq!(
            api.get(&format!("/api/v1/branch-rules/{busy}")).await.json["is_force_stopped"],
            true
        );
        // An update resumes it; `null` on both bounds removes a window, and
        // on one alone is refused, naming the other.
        let path = format!("/api/v1/branch-rules/{busy}");
        let windowed = api
            .put(
                &path,
                &json!({"operation_time_from": "22:00", "operation_time_to": "06:00"}),
            )
            .await;
        assert_eq!(windowed.status, StatusCode::OK, "{}", windowed.text);
        assert_eq!(windowed.json["operation_time_to"], "06:00");
        let half = api.put(&path, &json!({"operation_time_from": null})).await;
        assert_eq!(half.status, StatusCode::BAD_REQUEST, "{}", half.text);
        assert!(half.text.contains("operation_time_to"), "{}", half.text);
        let resumed = api
            .put(
                &path,
                &json!({
                    "is_force_stopped": false,
                    "operation_time_from": null,
                    "operation_time_to": null
                }),
            )
            .await;
        assert_eq!(resumed.status, StatusCode::OK, "{}", resumed.text);
        assert_eq!(resumed.json["is_force_stopped"], false);
        assert_eq!(resumed.json["operation_time_from"], Value::Null);
        assert_eq!(resumed.json["operation_time_to"], Value::Null);
        let stored = api.get(&path).await.json;
        assert_eq!(stored["is_force_stopped"], false, "{stored}");
        // Run now on a rule that would not run is a 409 naming the flag.
        let inactive = api
            .put(&format!("{path}/status"), &json!({"is_active": false}))
            .await;
        assert_eq!(inactive.status, StatusCode::OK, "{}", inactive.text);
        let refused = api.post_empty(&format!("{path}/run")).await;
        assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.text);
        assert!(refused.text.contains("is_active"), "{}", refused.text);
        assert_eq!(stored["operation_time_from"], Value::Null, "{stored}");
        assert_eq!(
            api.get("/api/v1/branch-rules/due").await.status,
            StatusCode::OK
        );
        running.service.shutdown("test").await.unwrap();
    }
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_lists_exactly_the_routes_served() {
    let db = common::sqlite_db().await;
    let (running, api) = start(&db, |c| c).await;
    let doc = api.get("/api/v1/openapi.json").await.json;
    let paths = doc["paths"].as_object().unwrap();
    // The served document is the one the router was built with.
    let table = ruled::api::routes::operations();
    for (method, path) in &table {
        let full = format!("{}{path}", ruled::api::routes::PREFIX);
        assert!(
            paths.get(&full).and_then(|p| p.get(method)).is_some(),
            "{method} {full} undocumented"
        );
    }
    // Document → router: every documented operation is answered by a
    // handler, not the no-route fallback.
    let mut operations = 0;
    for (path, methods) in paths {
        for method in methods.as_object().unwrap().keys() {
            operations += 1;
            let concrete = path
                .replace("{id}", &uuid::Uuid::new_v4().to_string())
                .replace("{detail_id}", &uuid::Uuid::new_v4().to_string());
            let method: Method = method.to_uppercase().parse().unwrap();
            if path.ends_with("/events") {
                // A stream of events never ends: its head is the answer.
                let response = api
                    .client
                    .get(format!("{}{path}", api.base))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), StatusCode::OK, "{path}");
                continue;
            }
            let reply = api
                .send(method.clone(), &concrete, Some(b"{}".to_vec()))
                .await;
            assert_ne!(
                reply.error_code(),
                "no_route",
                "{method} {path} is documented but not routed"
            );
            assert_ne!(
                reply.status,
                StatusCode::METHOD_NOT_ALLOWED,
                "{method} {path}"
            );
        }
    }
    assert_eq!(operations, table.len());
    // And the fallback does answer no_route for what is not routed.
    assert_eq!(
        api.get("/api/v1/nothing-here").await.error_code(),
        "no_route"
    );
    // A routed path with a method it does not take: 405, naming the ones it does.
    let wrong_method = api.delete("/api/v1/plan").await;
    assert_eq!(wrong_method.error_code(), "method_not_allowed");
    running.service.shutdown("test").await.unwrap();
}

/// The served document states this service's own settings: the action
/// kinds it runs (`command` only when enabled) and the longest an action
/// may wait (SCHEDULE_EXECUTION_TIMEOUT_SECONDS), and the server holds to
/// what it states.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_states_this_services_kinds_and_timeout() {
    for commands in [false, true] {
        let db = common::sqlite_db().await;
        let (running, api) = start(&db, |c| Config {
            command_actions_enabled: commands,
            schedule_execution_timeout: Duration::from_secs(42),
            ..c
        })
        .await;
        let doc = api.get("/api/v1/openapi.json").await.json;
        let kinds: Vec<&str> = doc["components"]["schemas"]["ActionKind"]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap())
            .collect();
        assert_eq!(kinds.contains(&"command"), commands, "{kinds:?}");
        assert!(
            kinds.contains(&"http") && kinds.contains(&"sleep"),
            "{kinds:?}"
        );
        let timeout = &doc["components"]["schemas"]["ActionConfig"]["properties"]["timeout_ms"];
        assert_eq!(timeout["maximum"], 42_000, "{timeout}");
        // The server refuses exactly past the stated bound.
        let template = |ms: u64| json!({ "name": "t", "kind": "sleep", "config": { "ms": ms } });
        let at = api
            .post("/api/v1/action-templates", &template(42_000))
            .await;
        assert_eq!(at.status, StatusCode::CREATED, "{}", at.text);
        let past = api
            .post("/api/v1/action-templates", &template(42_001))
            .await;
        assert_eq!(past.status, StatusCode::BAD_REQUEST, "{}", past.text);
        let command = api
            .post(
                "/api/v1/action-templates",
                &json!({ "name": "c", "kind": "command", "config": {} }),
            )
            .await;
        assert_eq!(command.status.is_success(), commands, "{}", command.text);
        running.service.shutdown("test").await.unwrap();
    }
}

both_backends!(
    a_change_reaches_the_plan_within_a_second,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        // The periodic refresh and the master are far off: only the API's
        // nudge can bring the new rule into the plan this fast.
        let (running, api) = start(&db, |c| Config {
            plan_refresh_interval: Duration::from_secs(600),
            master_grace_period: Duration::from_secs(600),
            ..c
        })
        .await;
        eventually(DEADLINE, "the first refresh", || async {
            api.get("/readyz").await.status == StatusCode::OK
        })
        .await;
        let (br, _) = create_rule(
            &api,
            "UTC",
            "0 0 1 1 *",
            "noop",
            json!({}),
            json!({
                "next_run_time": chrono::Utc::now().to_rfc3339()
            }),
        )
        .await;
        eventually(
            Duration::from_secs(1),
            "the new rule is ready in the plan",
            || async {
                api.get("/api/v1/plan/ready").await.json["ready"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|id| id == br.as_str())
            },
        )
        .await;
        let due = api.get("/api/v1/branch-rules/due").await;
        assert_eq!(due.json[0]["id"], br.as_str(), "{}", due.text);
        // Deactivated through the API, it leaves the ready set as fast.
        api.put(
            &format!("/api/v1/branch-rules/{br}/status"),
            &json!({ "is_active": false }),
        )
        .await;
        eventually(
            Duration::from_secs(1),
            "the rule leaves the ready set",
            || async {
                api.get("/api/v1/plan/ready").await.json["ready"]
                    .as_array()
                    .unwrap()
                    .is_empty()
            },
        )
        .await;
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    preview_honours_zone_window_and_dst,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api) = start(&db, |c| Config {
            master_grace_period: Duration::from_secs(600),
            ..c
        })
        .await;
        // 02:30 does not exist in Berlin on 2026-03-29 (spring forward at 02:00):
        // it fires once, at the first valid instant after the gap.
        let (gap, _) = create_rule(
            &api,
            "Europe/Berlin",
            "30 2 * * *",
            "noop",
            json!({}),
            json!({}),
        )
        .await;
        let reply = api
            .get(&format!(
                "/api/v1/branch-rules/{gap}/preview?count=3&from=2026-03-27T12:00:00Z"
            ))
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        let local: Vec<&str> = reply.json["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["local"].as_str().unwrap())
            .collect();
        assert_eq!(
            local,
            [
                "2026-03-28T02:30:00+01:00",
                "2026-03-29T03:00:00+02:00",
                "2026-03-30T02:30:00+02:00"
            ]
        );
        assert_eq!(reply.json["timezone"], "Europe/Berlin");

        // An occurrence before the window opens runs at the opening, in the
        // branch's zone (Riyadh, UTC+3).
        let (windowed, _) = create_rule(
            &api,
            "Asia/Riyadh",
            "0 1 * * *",
            "noop",
            json!({}),
            json!({
                "operation_time_from": "03:00", "operation_time_to": "05:00"
            }),
        )
        .await;
        let reply = api
            .get(&format!(
                "/api/v1/branch-rules/{windowed}/preview?count=2&from=2026-06-01T00:00:00Z"
            ))
            .await;
        let runs = reply.json["runs"].as_array().unwrap();
        assert_eq!(
            runs[0]["local"], "2026-06-02T03:00:00+03:00",
            "{}",
            reply.text
        );
        assert_eq!(runs[0]["utc"], "2026-06-02T00:00:00+00:00");
        assert_eq!(runs.len(), 2);

        // One bound left by SQL: the plan holds the rule, and the preview
        // says why rather than show runs that never happen.
        let sql =
            format!("UPDATE branch_rules SET operation_time_to = NULL WHERE id = '{windowed}'");
        assert_eq!(running.service.store().execute_sql(&sql).await.unwrap(), 1);
        let reply = api
            .get(&format!("/api/v1/branch-rules/{windowed}/preview?count=2"))
            .await;
        assert_eq!(reply.status, StatusCode::CONFLICT, "{}", reply.text);
        assert!(reply.text.contains("operation_time_to"), "{}", reply.text);
        running.service.shutdown("test").await.unwrap();
    }
);

/// SQLite keeps what SQL writes: a number past 32 bits in a 32-bit column,
/// text that is not UTF-8. Such a row is listed as near as it reads, with
/// `{column}_error` on its own, not a 500 for the whole listing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_sql_broke_beyond_its_types_is_listed_not_a_500() {
    let db = common::sqlite_db().await;
    let running = start_service_with(&db.url, without_delays).await;
    let service = &running.service;
    let store = service.store();
    let rule = common::rules::insert_rule(
        store,
        common::rules::YEARLY,
        chrono::Utc::now().timestamp_millis() + 86_400_000,
        &[common::rules::step("noop", json!({}))],
    )
    .await;
    store
        .execute_sql(&format!(
            "UPDATE branch_rules SET failed_attempts = 3000000000 WHERE id = '{rule}'"
        ))
        .await
        .unwrap();
    store
        .execute_sql("UPDATE branches SET name = CAST(X'4142C3' AS TEXT)")
        .await
        .unwrap();
    let api = Api::new(service);
    let branch_rules = api.get("/api/v1/branch-rules").await;
    assert_eq!(branch_rules.status, StatusCode::OK, "{}", branch_rules.text);
    let listed = branch_rules.json.as_array().unwrap();
    assert_eq!(listed[0]["failed_attempts"], 3_000_000_000_i64);
    let branches = api.get("/api/v1/branches").await;
    assert_eq!(branches.status, StatusCode::OK, "{}", branches.text);
    assert_eq!(branches.json[0]["name"], "AB\u{FFFD}");
    let one = api.get(&format!("/api/v1/branch-rules/{rule}")).await;
    assert_eq!(one.status, StatusCode::OK, "{}", one.text);
    running.service.shutdown("test").await.unwrap();
}
