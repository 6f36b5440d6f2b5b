//! Secrets kept (issue 12): a template and a detail holding every secret
//! form (headers `Authorization`, `X-API-Key`, `Api-Key`; body fields
//! `pass`, `pwd`, `credentials`, `private_key`; URL credentials and an
//! `access_token` query parameter; a `postgres://user:PASS@…` value) are
//! created and run by the real `ruled serve` over loopback HTTP against a
//! local server that echoes the request back. No secret may then appear in
//! any API answer (with or without the token, executions included), in the
//! log (pretty and JSON, at debug) or in `/metrics`; a `***` sent back keeps
//! the stored value (the action still authenticates); the SQLite files are
//! 0600.

mod common;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::api::{Api, Reply, client};
use common::eventually;
use common::http::{read_request, serve};
use common::process::{Install, signal, wait_exit};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const TOKEN: &str = "secrets-test-token";
const DEADLINE: Duration = Duration::from_secs(30);

const AUTHORIZATION: &str = "Bearer AUTHZ-s3cret-v4lue";
const X_API_KEY: &str = "XAPIKEY-s3cret-v4lue";
const API_KEY: &str = "APIKEY-s3cret-v4lue";
const URL_PASSWORD: &str = "URLPW-s3cret-v4lue";
const ACCESS_TOKEN: &str = "QUERYTOKEN-s3cret-v4lue";
const PASS: &str = "PASS-s3cret-v4lue";
const PWD: &str = "PWD-s3cret-v4lue";
const CREDENTIALS: &str = "CRED-s3cret-v4lue";
const PRIVATE_KEY: &str = "PRIVKEY-s3cret-v4lue";
const PG_PASSWORD: &str = "PGPASS-s3cret-v4lue";
const DETAIL_HEADER: &str = "DETAILHDR-s3cret-v4lue";
const NOOP_PASSWORD: &str = "NOOPPW-s3cret-v4lue";
const NOOP_TOKEN: &str = "NOOPTOKEN-s3cret-v4lue";
const SETTINGS_PASSWORD: &str = "SETTINGSPG-s3cret-v4lue";
/// A detail's param that only its template's `secret_keys` names.
const ORDER_REF: &str = "ORDERREF-s3cret-v4lue";

/// Every value that must never be shown; the bearer token's secret part
/// included, since a leak of it alone is a leak.
const SECRETS: &[&str] = &[
    "AUTHZ-s3cret-v4lue",
    X_API_KEY,
    API_KEY,
    URL_PASSWORD,
    ACCESS_TOKEN,
    PASS,
    PWD,
    CREDENTIALS,
    PRIVATE_KEY,
    PG_PASSWORD,
    DETAIL_HEADER,
    NOOP_PASSWORD,
    NOOP_TOKEN,
    SETTINGS_PASSWORD,
    ORDER_REF,
];

fn assert_clean(what: &str, text: &str) {
    for secret in SECRETS {
        assert!(
            !text.contains(secret),
            "{secret} appears in {what}:\n{text}"
        );
    }
}

// ---- a server that echoes the request, and checks its credentials ----------

/// Answers every request with the request itself (head and body), 200 when
/// it carries the expected `Authorization` and `X-API-Key`, else 401: a
/// response that echoes credentials, and a check that they were sent.
async fn echo_server() -> SocketAddr {
    serve(echo).await
}

async fn echo(mut socket: TcpStream) {
    let Some(request) = read_request(&mut socket).await else {
        return;
    };
    let has = |name: &str, value: &str| {
        request.lines().any(|line| {
            line.split_once(':')
                .is_some_and(|(n, v)| n.trim().eq_ignore_ascii_case(name) && v.trim() == value)
        })
    };
    let status = if has("authorization", AUTHORIZATION) && has("x-api-key", X_API_KEY) {
        "200 OK"
    } else {
        "401 Unauthorized"
    };
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        request.len()
    );
    let _ = socket.write_all(head.as_bytes()).await;
    let _ = socket.write_all(request.as_bytes()).await;
    let _ = socket.shutdown().await;
}

// ---- the service -----------------------------------------------------------

/// Every answer the test saw, to be checked for secrets at the end.
#[derive(Default)]
struct Seen(Vec<(String, String)>);

impl Seen {
    fn keep(&mut self, what: impl Into<String>, reply: &Reply) {
        self.0.push((what.into(), reply.text.clone()));
    }
}

async fn ok(seen: &mut Seen, what: &str, reply: Reply) -> Value {
    assert!(
        reply.status.is_success(),
        "{what}: {} {}",
        reply.status,
        reply.text
    );
    seen.keep(what, &reply);
    reply.json
}

async fn executions(api: &Api, branch_rule: &str) -> Vec<Value> {
    let reply = api
        .get(&format!("/api/v1/executions?branch_rule_id={branch_rule}"))
        .await;
    reply.json["items"].as_array().cloned().unwrap_or_default()
}

async fn wait_finished(api: &Api, branch_rule: &str, count: usize) -> Vec<Value> {
    let terminal = ["completed", "failed", "cancelled", "timed_out"];
    eventually(
        DEADLINE,
        &format!("{count} finished execution(s)"),
        || async {
            let list = executions(api, branch_rule).await;
            list.len() >= count
                && list
                    .iter()
                    .all(|e| terminal.contains(&e["status"].as_str().unwrap_or("")))
        },
    )
    .await;
    executions(api, branch_rule).await
}

async fn secrets_stay_hidden(log_format: &str) {
    let echo = echo_server().await;
    let install = Install::new();
    let mut child = install.spawn_logged(
        install
            .command(&["serve"])
            .env("LOG_FORMAT", log_format)
            .env("RUST_LOG", "debug")
            .env("API_TOKEN", TOKEN)
            .env("HTTP_ACTION_ALLOW_PRIVATE", "true")
            .env("MASTER_GRACE_PERIOD_SECONDS", "0")
            .env("WORKER_STAGGER_SECONDS", "0")
            .env("WORKER_COOLDOWN_SECONDS", "0")
            .env("RECENTLY_PROCESSED_SECONDS", "0"),
        "serve.log",
    );
    let api = Api::at(install.listening_addr("serve.log"), Some(TOKEN));
    let anonymous = api.without_token();
    let mut seen = Seen::default();

    // ---- catalog with every secret form --------------------------------
    let brand = ok(
        &mut seen,
        "create brand",
        api.post("/api/v1/brands", &json!({"name": "s"})).await,
    )
    .await;
    let branch = ok(
        &mut seen,
        "create branch",
        api.post(
            "/api/v1/branches",
            &json!({"brand_id": brand["id"], "name": "b", "timezone": "UTC"}),
        )
        .await,
    )
    .await;
    let rule = ok(
        &mut seen,
        "create rule",
        api.post(
            "/api/v1/rules",
            &json!({
                "name": "r", "cron_expression": "0 0 1 1 *",
                "settings": {"dsn": format!("postgres://app:{SETTINGS_PASSWORD}@db:5432/x")},
            }),
        )
        .await,
    )
    .await;
    let http_config = json!({
        "method": "POST",
        "url": format!("http://user:{URL_PASSWORD}@{echo}/x?access_token={ACCESS_TOKEN}&page=1"),
        "headers": {
            "Authorization": AUTHORIZATION,
            "X-API-Key": X_API_KEY,
            "Api-Key": API_KEY,
        },
        "body": {
            "pass": PASS,
            "pwd": PWD,
            "credentials": CREDENTIALS,
            "private_key": PRIVATE_KEY,
            "database_url": format!("postgres://user:{PG_PASSWORD}@db:5432/app"),
        },
        "timeout_ms": 5000,
    });
    let http_template = ok(
        &mut seen,
        "create http template",
        api.post(
            "/api/v1/action-templates",
            &json!({"name": "echo", "kind": "http", "config": http_config}),
        )
        .await,
    )
    .await;
    let noop_template = ok(
        &mut seen,
        "create noop template",
        api.post(
            "/api/v1/action-templates",
            &json!({"name": "n", "kind": "noop", "config": {
                "url": format!("https://user:{NOOP_PASSWORD}@host/x?access_token={NOOP_TOKEN}"),
                "secret_keys": ["order_ref"],
            }}),
        )
        .await,
    )
    .await;
    let branch_rule = ok(
        &mut seen,
        "create branch rule",
        api.post(
            "/api/v1/branch-rules",
            &json!({
                "branch_id": branch["id"], "rule_id": rule["id"],
                "next_run_time": chrono::Utc::now().to_rfc3339(),
                "action_details": [
                    {"action_template_id": http_template["id"],
                     "params": {"headers": {"X-Detail": DETAIL_HEADER}}},
                    {"action_template_id": noop_template["id"],
                     "params": {"order_ref": ORDER_REF}},
                ],
            }),
        )
        .await,
    )
    .await;
    // A second rule on the same template: a listing reads the template
    // once, and must mask both rules' details by it.
    ok(
        &mut seen,
        "create a second branch rule sharing the template",
        api.post(
            "/api/v1/branch-rules",
            &json!({
                "branch_id": branch["id"], "rule_id": rule["id"],
                "action_details": [
                    {"action_template_id": noop_template["id"],
                     "params": {"order_ref": ORDER_REF}},
                ],
            }),
        )
        .await,
    )
    .await;
    let br = branch_rule["id"].as_str().unwrap().to_string();
    let template_id = http_template["id"].as_str().unwrap().to_string();

    // What the API shows of the secrets: `***`, structure kept.
    assert_eq!(http_template["config"]["headers"]["X-API-Key"], "***");
    assert_eq!(http_template["config"]["body"]["private_key"], "***");
    assert_eq!(
        http_template["config"]["url"],
        format!("http://user:***@{echo}/x?access_token=***&page=1")
    );
    assert_eq!(rule["settings"]["dsn"], "postgres://app:***@db:5432/x");

    // ---- the run authenticates, and its output is scrubbed -------------
    let first = wait_finished(&api, &br, 1).await;
    assert_eq!(first[0]["status"], "completed", "{first:?}");
    let output = first[0]["output"].to_string();
    assert!(output.contains("POST /x?access_token=***"), "{output}");

    // ---- `***` sent back keeps the stored values -----------------------
    let shown = ok(
        &mut seen,
        "get template",
        api.get(&format!("/api/v1/action-templates/{template_id}"))
            .await,
    )
    .await;
    let mut config = shown["config"].clone();
    config["timeout_ms"] = json!(6000);
    ok(
        &mut seen,
        "put template with ***",
        api.put(
            &format!("/api/v1/action-templates/{template_id}"),
            &json!({"config": config}),
        )
        .await,
    )
    .await;
    let details = ok(
        &mut seen,
        "list details",
        api.get(&format!("/api/v1/branch-rules/{br}/action-details"))
            .await,
    )
    .await;
    let detail = &details[0];
    ok(
        &mut seen,
        "put detail with ***",
        api.put(
            &format!(
                "/api/v1/branch-rules/{br}/action-details/{}",
                detail["id"].as_str().unwrap()
            ),
            &json!({"params": detail["params"]}),
        )
        .await,
    )
    .await;
    // A `***` where nothing is stored is refused, naming the field.
    let refused = api
        .put(
            &format!("/api/v1/action-templates/{template_id}"),
            &json!({"config": {"headers": {"X-New": "***"}}}),
        )
        .await;
    assert_eq!(refused.status, 400, "{}", refused.text);
    assert!(
        refused.text.contains("config.headers.X-New"),
        "{}",
        refused.text
    );
    seen.keep("refused put", &refused);

    ok(
        &mut seen,
        "run now",
        api.post_empty(&format!("/api/v1/branch-rules/{br}/run"))
            .await,
    )
    .await;
    let both = wait_finished(&api, &br, 2).await;
    assert!(
        both.iter().all(|e| e["status"] == "completed"),
        "after the *** round trip the action must still authenticate: {both:?}"
    );

    // ---- every answer, with and without the token ----------------------
    let execution = both[0]["id"].as_str().unwrap().to_string();
    let paths = [
        "/api/v1/brands".to_string(),
        "/api/v1/branches".to_string(),
        "/api/v1/rules".to_string(),
        format!("/api/v1/rules/{}", rule["id"].as_str().unwrap()),
        "/api/v1/action-templates".to_string(),
        format!("/api/v1/action-templates/{template_id}"),
        "/api/v1/branch-rules".to_string(),
        format!("/api/v1/branch-rules/{br}"),
        format!("/api/v1/branch-rules/{br}/action-details"),
        format!(
            "/api/v1/branch-rules/{br}/action-details/{}",
            detail["id"].as_str().unwrap()
        ),
        "/api/v1/branch-rules/due".to_string(),
        "/api/v1/executions".to_string(),
        format!("/api/v1/executions?branch_rule_id={br}"),
        format!("/api/v1/executions/{execution}"),
        "/api/v1/plan".to_string(),
        "/api/v1/plan/ready".to_string(),
        "/api/v1/stats".to_string(),
    ];
    for path in &paths {
        for (who, client) in [("with token", &api), ("without token", &anonymous)] {
            let reply = client.get(path).await;
            assert!(reply.status.is_success(), "{path} {who}: {}", reply.text);
            seen.keep(format!("GET {path} {who}"), &reply);
        }
    }
    let hidden = anonymous
        .get(&format!("/api/v1/executions/{execution}"))
        .await;
    assert_eq!(hidden.json["output"]["hidden"], true, "{}", hidden.text);
    assert!(hidden.text.contains("token"), "{}", hidden.text);
    let shown = api.get(&format!("/api/v1/executions/{execution}")).await;
    assert!(shown.json["output"]["steps"].is_array(), "{}", shown.text);

    let metrics = client()
        .get(format!("{}/metrics", api.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("ruled_jobs_total"), "{metrics}");
    assert_clean("/metrics", &metrics);
    for (what, text) in &seen.0 {
        assert_clean(what, text);
    }

    // ---- the log, at debug ----------------------------------------------
    signal(&child, libc::SIGTERM);
    assert!(wait_exit(&mut child).success());
    let log = install.log("serve.log");
    assert!(log.contains("finished job"), "{log}");
    assert_clean(&format!("the {log_format} log"), &log);
    if log_format == "json" {
        for line in log.lines() {
            serde_json::from_str::<Value>(line)
                .unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        }
    }

    // ---- the database and its WAL files are the owner's only ------------
    for name in ["ruled.db", "ruled.db-wal", "ruled.db-shm"] {
        let path = install.path(name);
        if let Ok(meta) = std::fs::metadata(&path) {
            assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{name}");
        } else {
            assert_ne!(name, "ruled.db", "the database file is missing");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_in_api_pretty_logs_or_metrics() {
    secrets_stay_hidden("pretty").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_in_api_json_logs_or_metrics() {
    secrets_stay_hidden("json").await;
}
