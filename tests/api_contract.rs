//! The API's contract over real loopback HTTP (issue 12): every error in
//! the `{"error": {"code", "message"}}` envelope with the right status,
//! 405 with `Allow`, the bearer scheme in any case, 409s free of database
//! text, messages in the caller's language, and `created_by`/`updated_by`
//! from named tokens on both backends; and, through the real binary, the
//! pretty console format and the audit line naming the caller.

mod common;

use std::time::Duration;

use common::TestDb;
use common::api::{Api, Reply};
use common::process::{Install, signal, wait_exit};
use common::service::{RunningService, start_service_with};
use reqwest::{Method, StatusCode};
use ruled::config::{Config, NamedToken};
use serde_json::{Value, json};

const ALICE: &str = "alice-token-1";
const BOB: &str = "bob-token-2";

fn named_tokens(config: Config) -> Config {
    Config {
        master_grace_period: Duration::from_secs(3600),
        api_tokens: vec![
            NamedToken {
                name: "alice".into(),
                token: ALICE.into(),
            },
            NamedToken {
                name: "bob".into(),
                token: BOB.into(),
            },
        ],
        ..config
    }
}

async fn start(db: &TestDb) -> (RunningService, Api) {
    let running = start_service_with(&db.url, named_tokens).await;
    let api = Api::new(&running.service).with_token(ALICE);
    (running, api)
}

/// A request with exactly these headers and body (the `Api` helper always
/// sends JSON with `Bearer`).
async fn raw(
    api: &Api,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> Reply {
    let mut request = api.client.request(method, format!("{}{path}", api.base));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    if let Some(body) = body {
        request = request.body(body.to_vec());
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let allow = headers
        .get("allow")
        .map(|v| v.to_str().unwrap().to_string());
    let text = response.text().await.unwrap();
    let mut json = serde_json::from_str(&text).unwrap_or(Value::Null);
    if let Some(allow) = allow {
        json["__allow"] = Value::String(allow);
    }
    Reply {
        status,
        headers,
        json,
        text,
    }
}

/// The reply is the envelope with this status and code, and nothing else.
fn assert_envelope(reply: &Reply, status: StatusCode, code: &str) {
    assert_eq!(reply.status, status, "{}", reply.text);
    assert_eq!(reply.error_code(), code, "{}", reply.text);
    assert!(
        !reply.error_message().is_empty(),
        "no message: {}",
        reply.text
    );
    let keys: Vec<&String> = reply.json["error"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["code", "message"], "{}", reply.text);
}

fn auth(token: &str) -> String {
    format!("Bearer {token}")
}

async fn brand_count(api: &Api) -> usize {
    api.get("/api/v1/brands")
        .await
        .json
        .as_array()
        .unwrap()
        .len()
}

both_backends!(
    every_error_is_an_envelope_and_nothing_is_saved,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api) = start(&db).await;
        let bearer = auth(ALICE);
        let json_type = ("content-type", "application/json");
        let with_token = ("authorization", bearer.as_str());

        // Percent-encoding that does not decode, in the path and the query.
        for path in [
            "/api/v1/brands/%ZZ",
            "/api/v1/brands/%FF%FE",
            "/api/v1/brands/a%00b",
        ] {
            let reply = raw(&api, Method::GET, path, &[], None).await;
            assert_envelope(&reply, StatusCode::BAD_REQUEST, "invalid_path");
        }
        let reply = raw(
            &api,
            Method::GET,
            "/api/v1/executions?status=%G0",
            &[],
            None,
        )
        .await;
        assert_envelope(&reply, StatusCode::BAD_REQUEST, "invalid_query");
        assert!(reply.error_message().contains("status"), "{}", reply.text);

        // An unknown query parameter (axum answers these in plain text).
        let reply = raw(
            &api,
            Method::DELETE,
            &format!("/api/v1/brands/{}?bogus=1", uuid::Uuid::new_v4()),
            &[with_token],
            None,
        )
        .await;
        assert_envelope(&reply, StatusCode::BAD_REQUEST, "invalid_query");
        assert!(reply.error_message().contains("bogus"), "{}", reply.text);
        // ...also where the route takes no query at all, and a typo of a
        // parameter it does take.
        for path in [
            format!("/api/v1/brands/{}?bogus=1", uuid::Uuid::new_v4()),
            "/api/v1/stats?bogus=1".to_string(),
            "/api/v1/brands?limt=5".to_string(),
        ] {
            let reply = raw(&api, Method::GET, &path, &[], None).await;
            assert_envelope(&reply, StatusCode::BAD_REQUEST, "invalid_query");
            let name = path.rsplit('?').next().unwrap().split('=').next().unwrap();
            assert!(reply.error_message().contains(name), "{}", reply.text);
        }

        // JSON followed by junk.
        let reply = raw(
            &api,
            Method::POST,
            "/api/v1/brands",
            &[with_token, json_type],
            Some(br#"{"name": "junk"} {"name": "more"}"#),
        )
        .await;
        assert_envelope(&reply, StatusCode::BAD_REQUEST, "invalid_body");

        // A body that is not declared JSON, or not declared at all.
        for content_type in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "application/json; charset=latin1",
        ] {
            let reply = raw(
                &api,
                Method::POST,
                "/api/v1/brands",
                &[with_token, ("content-type", content_type)],
                Some(br#"{"name": "typed"}"#),
            )
            .await;
            assert_envelope(
                &reply,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
            );
        }
        let reply = raw(
            &api,
            Method::POST,
            "/api/v1/brands",
            &[with_token],
            Some(br#"{"name": "untyped"}"#),
        )
        .await;
        assert_envelope(
            &reply,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        );

        // Integers beyond i64 anywhere, even inside free-form settings.
        let reply = raw(
            &api,
            Method::POST,
            "/api/v1/brands",
            &[with_token, json_type],
            Some(br#"{"name": "big", "settings": {"limits": [1, 18446744073709551616]}}"#),
        )
        .await;
        assert_envelope(&reply, StatusCode::BAD_REQUEST, "invalid_field");
        assert!(
            reply.error_message().starts_with("settings.limits[1]:"),
            "{}",
            reply.text
        );

        // A NUL character: PostgreSQL cannot store it, SQLite would.
        let reply = raw(
            &api,
            Method::POST,
            "/api/v1/brands",
            &[with_token, json_type],
            Some(br#"{"name": "a\u0000b"}"#),
        )
        .await;
        assert_envelope(&reply, StatusCode::BAD_REQUEST, "invalid_field");
        assert!(reply.error_message().starts_with("name:"), "{}", reply.text);
        assert!(reply.error_message().contains("NUL"), "{}", reply.text);

        assert_eq!(brand_count(&api).await, 0, "a refused request saved a row");

        // What is accepted still is: a charset parameter, any scheme case.
        for (scheme, name) in [
            ("bearer", "lower"),
            ("BEARER", "upper"),
            ("Bearer", "usual"),
        ] {
            let header = format!("{scheme} {ALICE}");
            let reply = raw(
                &api,
                Method::POST,
                "/api/v1/brands",
                &[
                    ("authorization", header.as_str()),
                    ("content-type", "application/json; charset=UTF-8"),
                ],
                Some(json!({ "name": name }).to_string().as_bytes()),
            )
            .await;
            assert_eq!(
                reply.status,
                StatusCode::CREATED,
                "{scheme}: {}",
                reply.text
            );
        }
        let reply = raw(
            &api,
            Method::POST,
            "/api/v1/brands",
            &[("authorization", "Bearer wrong"), json_type],
            Some(br#"{"name": "x"}"#),
        )
        .await;
        assert_envelope(&reply, StatusCode::UNAUTHORIZED, "unauthorized");

        // Wrong methods: 405 with the path's methods from the route table.
        for (method, path, allow) in [
            (Method::PATCH, "/api/v1/brands", "GET,HEAD,POST"),
            (Method::DELETE, "/api/v1/plan", "GET,HEAD"),
            (Method::PUT, "/api/v1/branch-rules/due", "GET,HEAD"),
            (Method::GET, "/api/v1/branch-rules/x/run", "POST"),
            (Method::POST, "/api/v1/brands/x", "DELETE,GET,HEAD,PUT"),
        ] {
            let reply = raw(&api, method.clone(), path, &[with_token], None).await;
            assert_envelope(&reply, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");
            assert_eq!(reply.json["__allow"], allow, "{method} {path}");
            assert!(reply.error_message().contains(allow), "{}", reply.text);
        }
        // Outside the prefix axum's own 405 gets the envelope too.
        let reply = raw(&api, Method::POST, "/healthz", &[], None).await;
        assert_envelope(&reply, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");
        assert!(reply.json["__allow"].as_str().unwrap().contains("GET"));
        let reply = raw(&api, Method::GET, "/nothing-here", &[], None).await;
        assert_envelope(&reply, StatusCode::NOT_FOUND, "no_route");

        // Conflicts say what is wrong in our words, never the database's.
        let template = api
            .post(
                "/api/v1/action-templates",
                &json!({ "name": "t", "kind": "noop" }),
            )
            .await;
        let template = template.json["id"].as_str().unwrap().to_string();
        let brand = api
            .post("/api/v1/brands", &json!({ "name": "b" }))
            .await
            .json["id"]
            .as_str()
            .unwrap()
            .to_string();
        let branch = api
            .post(
                "/api/v1/branches",
                &json!({ "brand_id": brand, "name": "x", "timezone": "UTC" }),
            )
            .await;
        let rule = api
            .post(
                "/api/v1/rules",
                &json!({ "name": "r", "cron_expression": "0 0 1 1 *" }),
            )
            .await;
        let created = api
            .post(
                "/api/v1/branch-rules",
                &json!({
                    "branch_id": branch.json["id"], "rule_id": rule.json["id"],
                    "action_details": [{ "action_template_id": template }],
                }),
            )
            .await;
        assert_eq!(created.status, StatusCode::CREATED, "{}", created.text);
        let in_use = api
            .delete(&format!("/api/v1/action-templates/{template}"))
            .await;
        let orphan = api
            .post(
                "/api/v1/branches",
                &json!({ "brand_id": uuid::Uuid::new_v4(), "name": "orphan" }),
            )
            .await;
        for reply in [&in_use, &orphan] {
            assert_envelope(reply, StatusCode::CONFLICT, "conflict");
            let text = reply.text.to_lowercase();
            for leak in [
                "constraint",
                "foreign key",
                "violat",
                "sql",
                "line ",
                "action_details",
                "branches",
                "fk",
                "error returned from database",
                "code:",
            ] {
                assert!(!text.contains(leak), "{leak:?} leaked: {}", reply.text);
            }
        }
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    messages_follow_accept_language_and_codes_stay,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api) = start(&db).await;
        let bearer = auth(ALICE);
        let arabic = |text: &str| text.chars().any(|c| ('\u{0600}'..='\u{06FF}').contains(&c));
        let missing = format!("/api/v1/brands/{}", uuid::Uuid::new_v4());
        for (language, expect_arabic) in [
            ("ar", true),
            ("ar-SA", true),
            ("fr, en;q=0.5, ar;q=0.8", true),
            ("ar;q=0.2, en", false),
            ("ar;q=0", false),
            ("de", false),
        ] {
            let reply = raw(
                &api,
                Method::GET,
                &missing,
                &[("accept-language", language)],
                None,
            )
            .await;
            assert_envelope(&reply, StatusCode::NOT_FOUND, "not_found");
            assert_eq!(
                arabic(reply.error_message()),
                expect_arabic,
                "{language}: {}",
                reply.text
            );
        }
        let english = raw(&api, Method::GET, &missing, &[], None).await;
        assert!(
            english.error_message().ends_with("not found"),
            "{}",
            english.text
        );

        // A field error: Arabic text, the field name as sent, the same code.
        let reply = raw(
            &api,
            Method::POST,
            "/api/v1/brands",
            &[
                ("authorization", bearer.as_str()),
                ("content-type", "application/json"),
                ("accept-language", "ar"),
            ],
            Some(br#"{"settings": {}}"#),
        )
        .await;
        assert_envelope(&reply, StatusCode::BAD_REQUEST, "invalid_field");
        assert!(arabic(reply.error_message()), "{}", reply.text);
        assert!(reply.error_message().contains("name"), "{}", reply.text);
        assert_eq!(reply.json["__allow"], Value::Null);

        // Errors the framework produced are translated as well.
        let reply = raw(
            &api,
            Method::PATCH,
            "/api/v1/brands",
            &[("accept-language", "ar")],
            None,
        )
        .await;
        assert_envelope(&reply, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");
        assert!(arabic(reply.error_message()), "{}", reply.text);
        assert_eq!(reply.json["__allow"], "GET,HEAD,POST");
        let reply = raw(
            &api,
            Method::POST,
            "/api/v1/brands",
            &[
                ("accept-language", "ar"),
                ("content-type", "application/json"),
            ],
            Some(b"{}"),
        )
        .await;
        assert_envelope(&reply, StatusCode::UNAUTHORIZED, "unauthorized");
        assert!(arabic(reply.error_message()), "{}", reply.text);
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    created_by_and_updated_by_name_the_token,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, alice) = start(&db).await;
        let bob = alice.with_token(BOB);
        let assert_by = |reply: &Reply, created: &str, updated: &str| {
            assert!(reply.status.is_success(), "{}", reply.text);
            assert_eq!(reply.json["created_by"], created, "{}", reply.text);
            assert_eq!(reply.json["updated_by"], updated, "{}", reply.text);
        };
        let id_of = |reply: &Reply| reply.json["id"].as_str().unwrap().to_string();

        let brand = alice.post("/api/v1/brands", &json!({ "name": "b" })).await;
        assert_by(&brand, "alice", "alice");
        let brand_id = id_of(&brand);
        let updated = bob
            .put(
                &format!("/api/v1/brands/{brand_id}"),
                &json!({ "name": "b2" }),
            )
            .await;
        assert_by(&updated, "alice", "bob");
        assert_by(
            &alice.get(&format!("/api/v1/brands/{brand_id}")).await,
            "alice",
            "bob",
        );

        let branch = alice
            .post(
                "/api/v1/branches",
                &json!({ "brand_id": brand_id, "name": "x", "timezone": "UTC" }),
            )
            .await;
        assert_by(&branch, "alice", "alice");
        let branch_id = id_of(&branch);
        let updated = bob
            .put(
                &format!("/api/v1/branches/{branch_id}"),
                &json!({ "name": "y" }),
            )
            .await;
        assert_by(&updated, "alice", "bob");

        let rule = bob
            .post(
                "/api/v1/rules",
                &json!({ "name": "r", "cron_expression": "0 0 1 1 *" }),
            )
            .await;
        assert_by(&rule, "bob", "bob");
        let rule_id = id_of(&rule);
        let updated = alice
            .put(
                &format!("/api/v1/rules/{rule_id}"),
                &json!({ "name": "r2" }),
            )
            .await;
        assert_by(&updated, "bob", "alice");

        let template = alice
            .post(
                "/api/v1/action-templates",
                &json!({ "name": "t", "kind": "noop" }),
            )
            .await;
        assert_by(&template, "alice", "alice");
        let template_id = id_of(&template);
        let updated = bob
            .put(
                &format!("/api/v1/action-templates/{template_id}"),
                &json!({ "name": "t2" }),
            )
            .await;
        assert_by(&updated, "alice", "bob");

        let branch_rule = alice
            .post(
                "/api/v1/branch-rules",
                &json!({
                    "branch_id": branch_id, "rule_id": rule_id,
                    "action_details": [{ "action_template_id": template_id }],
                }),
            )
            .await;
        assert_by(&branch_rule, "alice", "alice");
        let detail = &branch_rule.json["action_details"][0];
        assert_eq!(detail["created_by"], "alice", "{}", branch_rule.text);
        assert_eq!(detail["updated_by"], "alice", "{}", branch_rule.text);
        let branch_rule_id = id_of(&branch_rule);
        let updated = bob
            .put(
                &format!("/api/v1/branch-rules/{branch_rule_id}"),
                &json!({ "is_active": false }),
            )
            .await;
        assert_by(&updated, "alice", "bob");

        let detail_id = detail["id"].as_str().unwrap();
        let details = format!("/api/v1/branch-rules/{branch_rule_id}/action-details");
        let updated = bob
            .put(&format!("{details}/{detail_id}"), &json!({ "position": 3 }))
            .await;
        assert_by(&updated, "alice", "bob");
        let added = bob
            .post(&details, &json!({ "action_template_id": template_id }))
            .await;
        assert_by(&added, "bob", "bob");

        // Lists show them too.
        let brands = alice.get("/api/v1/brands").await;
        assert_eq!(brands.json[0]["updated_by"], "bob", "{}", brands.text);
        running.service.shutdown("test").await.unwrap();
    }
);

/// A run of 32 hex digits: ractor's service namespace, which the pretty
/// format must not print (UUIDs have hyphens, so they never match).
fn has_32_hex(line: &str) -> bool {
    let mut run = 0;
    for c in line.chars() {
        run = if c.is_ascii_hexdigit() { run + 1 } else { 0 };
        if run >= 32 {
            return true;
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pretty_logs_name_the_actor_and_the_audit_line_names_the_caller() {
    let install = Install::new();
    let mut child = install.spawn_logged(
        install
            .command(&["serve", "--demo"])
            .env("API_TOKENS", format!("alice:{ALICE}"))
            .env("MASTER_GRACE_PERIOD_SECONDS", "0")
            .env("WORKER_STAGGER_SECONDS", "0"),
        "serve.log",
    );
    let api = Api::at(install.listening_addr("serve.log"), Some(ALICE));
    let reply = api
        .post("/api/v1/brands", &json!({ "name": "logged" }))
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
    install.wait_for_log("serve.log", "finished job");
    install.wait_for_log("serve.log", "API change");
    signal(&child, libc::SIGTERM);
    assert!(wait_exit(&mut child).success());

    let log = install.log("serve.log");
    for line in log.lines() {
        assert!(!has_32_hex(line), "a 32-hex span name: {line}");
        assert!(!line.contains("Actor{"), "a raw ractor span: {line}");
    }
    let line_with = |needle: &str| {
        log.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} in:\n{log}"))
            .to_string()
    };
    assert!(line_with("Master fetched").contains(" [master] "), "{log}");
    assert!(
        line_with("Updated execution plan").contains(" [refresher] "),
        "{log}"
    );
    let pulled = line_with("pulled job");
    assert!(pulled.contains(" [worker-"), "{pulled}");
    // Ids stay, as fields.
    assert!(
        pulled.contains("branch_rule_id=") && pulled.contains("execution_id="),
        "{pulled}"
    );
    let audit = line_with("API change");
    assert!(audit.contains("caller=alice"), "{audit}");
    assert!(audit.contains("path=/api/v1/brands"), "{audit}");
    assert!(!log.contains(ALICE), "a token reached the log");
}

#[test]
fn a_bad_api_tokens_stops_start_up_naming_the_variable() {
    let install = Install::new();
    for value in [
        "alice",
        "alice:one-secret,alice:other-secret",
        "a b:secret-token",
    ] {
        let output = install
            .command(&["serve"])
            .env("API_TOKENS", value)
            .output()
            .unwrap();
        assert!(!output.status.success(), "{value}");
        let stderr = common::process::stderr(&output);
        assert!(stderr.contains("API_TOKENS"), "{value}: {stderr}");
        assert!(!stderr.contains("secret"), "{value}: a token in {stderr}");
    }
}
