//! Input validation of the catalog (times, windows, zones, positions,
//! action kinds and durations), keyset paging of every catalog listing,
//! and the SSRF guard on a job that really runs: all over real loopback
//! HTTP, on SQLite and PostgreSQL where the database plays a part.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::api::{Api, Reply, id};
use common::service::{RunningService, start_service_with, without_delays};
use common::{TestDb, eventually};
use reqwest::StatusCode;
use ruled::config::Config;
use ruled::store::Backend;
use serde_json::{Value, json};

const TOKEN: &str = "inputs-token";
const DEADLINE: Duration = Duration::from_secs(30);

fn fast(config: Config) -> Config {
    Config {
        api_token: Some(TOKEN.into()),
        ..without_delays(config)
    }
}

async fn start(db: &TestDb, adjust: impl FnOnce(Config) -> Config) -> (RunningService, Api) {
    let running = start_service_with(&db.url, |c| adjust(fast(c))).await;
    let api = Api::new(&running.service);
    (running, api)
}

/// A 400 whose message names `field`.
#[track_caller]
fn assert_400(reply: &Reply, field: &str) {
    assert_status(reply, StatusCode::BAD_REQUEST, field);
}

/// A 409: the request conflicts with stored rows (or with itself), and the
/// message names the field.
fn assert_409(reply: &Reply, field: &str) {
    assert_status(reply, StatusCode::CONFLICT, field);
}

fn assert_status(reply: &Reply, status: StatusCode, field: &str) {
    assert_eq!(reply.status, status, "{}", reply.text);
    assert!(
        reply.error_message().contains(field),
        "the message should name {field}: {}",
        reply.text
    );
}

/// One valid brand → branch → rule → noop template.
struct Fixture {
    branch: String,
    rule: String,
    template: String,
}

async fn fixture(api: &Api) -> Fixture {
    let brand = id(&api.post("/api/v1/brands", &json!({ "name": "b" })).await);
    let branch = id(&api
        .post(
            "/api/v1/branches",
            &json!({ "brand_id": brand, "name": "x", "timezone": "Asia/Riyadh" }),
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
    Fixture {
        branch,
        rule,
        template,
    }
}

/// A branch rule of the fixture, with `extra` fields.
async fn branch_rule(api: &Api, f: &Fixture, extra: Value) -> String {
    let mut body = json!({ "branch_id": f.branch, "rule_id": f.rule });
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    id(&api.post("/api/v1/branch-rules", &body).await)
}

/// Every catalog row, through the listings: what a refused request must
/// leave as it was.
async fn everything(api: &Api) -> Vec<Value> {
    let mut all = Vec::new();
    for path in [
        "brands",
        "branches",
        "rules",
        "action-templates",
        "branch-rules",
    ] {
        let reply = api.get(&format!("/api/v1/{path}?limit=1000")).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        all.push(reply.json);
    }
    all
}

// ---- times -----------------------------------------------------------------

both_backends!(
    next_run_time_is_bounded_to_1970_through_9999,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api) = start(&db, |c| c).await;
        let f = fixture(&api).await;
        let existing = branch_rule(&api, &f, json!({})).await;
        let before = everything(&api).await;
        for bad in [
            "0000-01-01T00:00:00Z",
            "0001-06-01T12:00:00+03:00",
            "1969-12-31T23:59:59.999Z",
            // 9999-12-31 23:59:59 at -01:00 is already year 10000 in UTC.
            "9999-12-31T23:59:59-01:00",
        ] {
            let body = json!({ "branch_id": f.branch, "rule_id": f.rule, "next_run_time": bad });
            assert_400(
                &api.post("/api/v1/branch-rules", &body).await,
                "next_run_time",
            );
            let path = format!("/api/v1/branch-rules/{existing}");
            let update = json!({ "next_run_time": bad });
            assert_400(&api.put(&path, &update).await, "next_run_time");
        }
        assert_eq!(
            everything(&api).await,
            before,
            "a refused request saved something"
        );

        for good in ["1970-01-01T00:00:00Z", "9999-12-31T23:59:59.999Z"] {
            let created = branch_rule(&api, &f, json!({ "next_run_time": good })).await;
            let got = api.get(&format!("/api/v1/branch-rules/{created}")).await;
            let shown = got.json["next_run_time"].as_str().unwrap();
            let shown = chrono::DateTime::parse_from_rfc3339(shown).unwrap();
            let sent = chrono::DateTime::parse_from_rfc3339(good).unwrap();
            assert_eq!(shown, sent);
        }
        running.service.shutdown("test").await.unwrap();
    }
);

// ---- windows ---------------------------------------------------------------

both_backends!(
    a_window_needs_both_bounds,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api) = start(&db, |c| c).await;
        let f = fixture(&api).await;
        let windowless = branch_rule(&api, &f, json!({})).await;
        let windowed = branch_rule(
            &api,
            &f,
            json!({ "operation_time_from": "22:00", "operation_time_to": "06:00" }),
        )
        .await;
        let before = everything(&api).await;

        let only_from =
            json!({ "branch_id": f.branch, "rule_id": f.rule, "operation_time_from": "09:00" });
        assert_400(
            &api.post("/api/v1/branch-rules", &only_from).await,
            "operation_time_to",
        );
        let only_to =
            json!({ "branch_id": f.branch, "rule_id": f.rule, "operation_time_to": "17:00" });
        assert_400(
            &api.post("/api/v1/branch-rules", &only_to).await,
            "operation_time_from",
        );
        // An update completes the window with what is stored, so half a
        // window on a rule without one is refused...
        let path = format!("/api/v1/branch-rules/{windowless}");
        let reply = api
            .put(&path, &json!({ "operation_time_from": "09:00" }))
            .await;
        assert_400(&reply, "operation_time_to");
        assert_eq!(
            everything(&api).await,
            before,
            "a refused request saved something"
        );

        // A window is changed as a pair, even when one end stays, so the
        // document can say which bodies are valid without the stored row.
        let path = format!("/api/v1/branch-rules/{windowed}");
        let one_end = api
            .put(&path, &json!({ "operation_time_to": "05:30" }))
            .await;
        assert_400(&one_end, "operation_time_from");
        let moved = api
            .put(
                &path,
                &json!({ "operation_time_from": "22:00", "operation_time_to": "05:30" }),
            )
            .await;
        assert_eq!(moved.status, StatusCode::OK, "{}", moved.text);
        assert_eq!(moved.json["operation_time_from"], "22:00");
        assert_eq!(moved.json["operation_time_to"], "05:30");
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    window_bounds_are_two_digit_hh_mm,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api) = start(&db, |c| c).await;
        let f = fixture(&api).await;
        let windowed = branch_rule(
            &api,
            &f,
            json!({ "operation_time_from": "09:00", "operation_time_to": "17:00" }),
        )
        .await;
        let before = everything(&api).await;
        for bad in [
            "+9:00",
            "09:+5",
            "-1:00",
            " 9:00",
            "9:00",
            "09:00 ",
            "24:00",
            "٠٩:٠٠",
        ] {
            let body = json!({
                "branch_id": f.branch, "rule_id": f.rule,
                "operation_time_from": bad, "operation_time_to": "17:00",
            });
            assert_400(
                &api.post("/api/v1/branch-rules", &body).await,
                "operation_time_from",
            );
            let path = format!("/api/v1/branch-rules/{windowed}");
            let reply = api.put(&path, &json!({ "operation_time_to": bad })).await;
            assert_400(&reply, "operation_time_to");
        }
        assert_eq!(
            everything(&api).await,
            before,
            "a refused request saved something"
        );
        running.service.shutdown("test").await.unwrap();
    }
);

// ---- zones -----------------------------------------------------------------

both_backends!(
    zones_with_white_space_around_them_are_refused,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api) = start(&db, |c| c).await;
        let brand = id(&api.post("/api/v1/brands", &json!({ "name": "b" })).await);
        let branch = id(&api
            .post(
                "/api/v1/branches",
                &json!({ "brand_id": brand, "name": "x", "timezone": "Asia/Riyadh" }),
            )
            .await);
        let before = everything(&api).await;
        for bad in [" Asia/Riyadh", "Asia/Riyadh ", "\tAsia/Riyadh\n"] {
            let body = json!({ "brand_id": brand, "name": "y", "timezone": bad });
            let reply = api.post("/api/v1/branches", &body).await;
            assert_400(&reply, "timezone");
            assert!(
                reply.error_message().contains("\"Asia/Riyadh\""),
                "{}",
                reply.text
            );
            let path = format!("/api/v1/branches/{branch}");
            assert_400(
                &api.put(&path, &json!({ "timezone": bad })).await,
                "timezone",
            );
        }
        assert_eq!(
            everything(&api).await,
            before,
            "a refused request saved something"
        );
        let changed = api
            .put(
                &format!("/api/v1/branches/{branch}"),
                &json!({ "timezone": "America/New_York" }),
            )
            .await;
        assert_eq!(changed.status, StatusCode::OK, "{}", changed.text);
        assert_eq!(changed.json["timezone"], "America/New_York");
        running.service.shutdown("test").await.unwrap();
    }
);

// ---- schedule changes ------------------------------------------------------

/// Makes the database refuse every write of a branch rule's next run, as a
/// constraint or a failing disk would: the write after a schedule change.
async fn refuse_next_run_writes(running: &RunningService, db: &TestDb) {
    let sql = match db.backend {
        Backend::Sqlite => {
            "CREATE TRIGGER refuse_next_run BEFORE UPDATE OF next_run_time ON branch_rules \
             BEGIN SELECT RAISE(ABORT, 'next runs refused'); END"
        }
        Backend::Postgres => {
            "CREATE FUNCTION refuse_next_run() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'next runs refused'; END $$; \
             CREATE TRIGGER refuse_next_run BEFORE UPDATE OF next_run_time ON branch_rules \
             FOR EACH ROW EXECUTE FUNCTION refuse_next_run()"
        }
    };
    running.service.store().execute_sql(sql).await.unwrap();
}

both_backends!(
    a_schedule_change_is_saved_with_the_next_runs_it_moves_or_not_at_all,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api) = start(&db, |c| c).await;
        let f = fixture(&api).await;
        // Yearly, so nothing falls due (and writes a next run) meanwhile.
        let yearly = |cron: &str| json!({ "name": "y", "cron_expression": cron });
        let rule = id(&api.post("/api/v1/rules", &yearly("0 3 1 1 *")).await);
        let other = id(&api.post("/api/v1/rules", &yearly("0 5 1 3 *")).await);
        let body = json!({ "branch_id": f.branch, "rule_id": rule });
        let branch_rule = id(&api.post("/api/v1/branch-rules", &body).await);
        let branch_rule_path = format!("/api/v1/branch-rules/{branch_rule}");

        refuse_next_run_writes(&running, &db).await;
        let before = everything(&api).await;
        let changes = [
            (
                format!("/api/v1/rules/{rule}"),
                json!({ "cron_expression": "0 4 1 2 *" }),
            ),
            (
                format!("/api/v1/branches/{}", f.branch),
                json!({ "timezone": "America/New_York" }),
            ),
            (branch_rule_path.clone(), json!({ "rule_id": other })),
        ];
        for (path, change) in &changes {
            let reply = api.put(path, change).await;
            assert!(
                reply.status.is_server_error(),
                "PUT {path} {change}: {} {}",
                reply.status,
                reply.text
            );
            assert_eq!(
                everything(&api).await,
                before,
                "PUT {path} {change} saved its change without the next runs it moves"
            );
        }

        running
            .service
            .store()
            .execute_sql("DROP TRIGGER refuse_next_run ON branch_rules")
            .await
            .or(running
                .service
                .store()
                .execute_sql("DROP TRIGGER refuse_next_run")
                .await)
            .unwrap();
        let (path, change) = &changes[0];
        let reply = api.put(path, change).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        let shown = api.get(&branch_rule_path).await;
        let next_run = shown.json["next_run_time"].as_str().unwrap_or_default();
        // 1 February 04:00 in Asia/Riyadh (UTC+3).
        assert!(next_run.contains("-02-01T01:00:00"), "{}", shown.text);
        running.service.shutdown("test").await.unwrap();
    }
);

// ---- action details --------------------------------------------------------

both_backends!(
    action_positions_are_not_negative_and_unique,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api) = start(&db, |c| c).await;
        let f = fixture(&api).await;
        let t = &f.template;
        let before = everything(&api).await;
        let create = |details: Value| json!({ "branch_id": f.branch, "rule_id": f.rule, "action_details": details });
        let reply = api
            .post(
                "/api/v1/branch-rules",
                &create(json!([{ "action_template_id": t, "position": -1 }])),
            )
            .await;
        assert_400(&reply, "action_details[0].position");
        let reply = api
            .post(
                "/api/v1/branch-rules",
                &create(json!([
                    { "action_template_id": t, "position": 3 },
                    { "action_template_id": t, "position": 3 },
                ])),
            )
            .await;
        assert_409(&reply, "action_details[1].position");
        // A detail without a position takes its index: [1, (1)] collide.
        let reply = api
            .post(
                "/api/v1/branch-rules",
                &create(json!([
                    { "action_template_id": t, "position": 1 },
                    { "action_template_id": t },
                ])),
            )
            .await;
        assert_409(&reply, "action_details[1].position");
        assert_eq!(
            everything(&api).await,
            before,
            "a refused request saved something"
        );

        let rule = id(&api
            .post(
                "/api/v1/branch-rules",
                &create(json!([
                    { "action_template_id": t, "position": 0 },
                    { "action_template_id": t, "position": 5 },
                ])),
            )
            .await);
        let details = format!("/api/v1/branch-rules/{rule}/action-details");
        let listed = api.get(&details).await.json;
        let first = listed[0]["id"].as_str().unwrap().to_string();
        assert_400(
            &api.post(
                &details,
                &json!({ "action_template_id": t, "position": -2 }),
            )
            .await,
            "position",
        );
        // Taken by a stored detail: a conflict with stored state.
        assert_409(
            &api.post(&details, &json!({ "action_template_id": t, "position": 5 }))
                .await,
            "position",
        );
        let path = format!("{details}/{first}");
        assert_409(&api.put(&path, &json!({ "position": 5 })).await, "position");
        assert_400(
            &api.put(&path, &json!({ "position": -7 })).await,
            "position",
        );
        assert_eq!(
            api.get(&details).await.json,
            listed,
            "a refused request saved something"
        );

        // Its own position, or a free one, is fine.
        let same = api.put(&path, &json!({ "position": 0 })).await;
        assert_eq!(same.status, StatusCode::OK, "{}", same.text);
        let moved = api.put(&path, &json!({ "position": 9 })).await;
        assert_eq!(moved.status, StatusCode::OK, "{}", moved.text);
        let added = api
            .post(&details, &json!({ "action_template_id": t }))
            .await;
        assert_eq!(added.status, StatusCode::CREATED, "{}", added.text);
        assert_eq!(added.json["position"], 10);
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    command_templates_need_command_actions_enabled,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api) = start(&db, |c| c).await;
        let before = everything(&api).await;
        let command = json!({ "name": "c", "kind": "command", "config": { "program": "true" } });
        let reply = api.post("/api/v1/action-templates", &command).await;
        assert_400(&reply, "kind");
        assert!(
            reply
                .error_message()
                .contains("COMMAND_ACTIONS_ENABLED=true"),
            "{}",
            reply.text
        );
        let noop = id(&api
            .post(
                "/api/v1/action-templates",
                &json!({ "name": "n", "kind": "noop" }),
            )
            .await);
        let path = format!("/api/v1/action-templates/{noop}");
        assert_400(&api.put(&path, &json!({ "kind": "command" })).await, "kind");
        let after: Vec<Value> = everything(&api).await;
        assert_eq!(
            after[3].as_array().unwrap().len(),
            1,
            "only the noop template"
        );
        assert_eq!(after[..3], before[..3]);
        running.service.shutdown("test").await.unwrap();

        let (running, api) = start(&db, |c| Config {
            command_actions_enabled: true,
            ..c
        })
        .await;
        let created = api.post("/api/v1/action-templates", &command).await;
        assert_eq!(created.status, StatusCode::CREATED, "{}", created.text);
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    action_durations_are_bounded_by_the_job_timeout,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api) = start(&db, |c| Config {
            schedule_execution_timeout: Duration::from_secs(5),
            ..c
        })
        .await;
        let f = fixture(&api).await;
        let before = everything(&api).await;
        // u64::MAX itself is refused before this check, as an integer beyond
        // i64; the largest integer that gets this far must be refused too.
        let huge = i64::MAX;
        for (kind, config, field) in [
            (
                "http",
                json!({ "url": "https://example.com", "timeout_ms": huge }),
                "timeout_ms",
            ),
            (
                "http",
                json!({ "url": "https://example.com", "timeout_ms": 5001 }),
                "timeout_ms",
            ),
            (
                "http",
                json!({ "url": "https://example.com", "timeout_ms": 0 }),
                "timeout_ms",
            ),
            ("sleep", json!({ "ms": huge }), "ms"),
            ("sleep", json!({ "ms": 5001 }), "ms"),
            ("sleep", json!({ "ms": -1 }), "ms"),
            ("sleep", json!({ "ms": "100" }), "ms"),
        ] {
            let body = json!({ "name": "t", "kind": kind, "config": config });
            let reply = api.post("/api/v1/action-templates", &body).await;
            assert_400(&reply, &format!("config.{field}"));
            assert!(reply.error_message().contains("5000"), "{}", reply.text);
            let beyond = json!({ "name": "t", "kind": kind, "config": { field: u64::MAX } });
            let reply = api.post("/api/v1/action-templates", &beyond).await;
            assert_400(&reply, &format!("config.{field}"));
            let path = format!("/api/v1/action-templates/{}", f.template);
            assert_400(&api.put(&path, &json!({ "config": config })).await, field);
        }
        // A detail's params are merged over the template's config: the same
        // bound holds there.
        let body = json!({
            "branch_id": f.branch, "rule_id": f.rule,
            "action_details": [{ "action_template_id": f.template, "params": { "ms": huge } }],
        });
        let reply = api.post("/api/v1/branch-rules", &body).await;
        assert_400(&reply, "action_details[0].params.ms");
        assert_eq!(
            everything(&api).await,
            before,
            "a refused request saved something"
        );

        let rule = branch_rule(&api, &f, json!({})).await;
        let details = format!("/api/v1/branch-rules/{rule}/action-details");
        let body = json!({ "action_template_id": f.template, "params": { "timeout_ms": huge } });
        assert_400(&api.post(&details, &body).await, "params.timeout_ms");

        // Up to the job's own timeout is fine.
        let sleep = json!({ "name": "s", "kind": "sleep", "config": { "ms": 5000 } });
        let created = api.post("/api/v1/action-templates", &sleep).await;
        assert_eq!(created.status, StatusCode::CREATED, "{}", created.text);
        let body = json!({ "action_template_id": f.template, "params": { "timeout_ms": 5000 } });
        let created = api.post(&details, &body).await;
        assert_eq!(created.status, StatusCode::CREATED, "{}", created.text);
        running.service.shutdown("test").await.unwrap();
    }
);

// ---- scheduling policies ---------------------------------------------------

/// Whether `table`'s row `id` holds SQL NULL in `policy`, read with SQL.
async fn policy_is_null(running: &RunningService, table: &str, id: &str) -> bool {
    use ruled::store::Store;
    let sql = format!("SELECT policy FROM {table} WHERE id = '{id}'");
    let sql = sqlx::AssertSqlSafe(sql);
    let policy: Option<String> = match running.service.store() {
        Store::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
        Store::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
    };
    policy.is_none()
}

both_backends!(
    policies_are_stored_resolved_and_cleared,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api) = start(&db, |c| c).await;
        let f = fixture(&api).await;
        let rule_policy = json!({
            "misfire": "run_all", "catchup_max": 5, "max_attempts": 3, "backoff_seconds": 30,
        });
        let created = api
            .post(
                "/api/v1/rules",
                &json!({ "name": "p", "cron_expression": "0 3 * * *", "policy": rule_policy }),
            )
            .await;
        assert_eq!(created.status, StatusCode::CREATED, "{}", created.text);
        assert_eq!(created.json["policy"], rule_policy);
        let rule = id(&created);
        let path = format!("/api/v1/rules/{rule}");
        assert_eq!(api.get(&path).await.json["policy"], rule_policy);

        // A branch rule overriding one field: its own policy as sent, the
        // one in force field by field, no retry pending.
        let body = json!({
            "branch_id": f.branch, "rule_id": rule, "policy": { "max_attempts": 5 },
        });
        let created = api.post("/api/v1/branch-rules", &body).await;
        assert_eq!(created.status, StatusCode::CREATED, "{}", created.text);
        let overriding = id(&created);
        let br_path = format!("/api/v1/branch-rules/{overriding}");
        let shown = api.get(&br_path).await.json;
        assert_eq!(shown["policy"], json!({ "max_attempts": 5 }));
        assert_eq!(
            shown["effective_policy"],
            json!({
                "misfire": "run_all", "catchup_window_seconds": null, "catchup_max": 5,
                "overlap": "skip", "max_attempts": 5, "backoff_seconds": 30,
                "backoff_max_seconds": 600, "start_jitter_seconds": 0,
            })
        );
        assert_eq!(shown["retry_of"], Value::Null);
        assert_eq!(shown["failed_attempts"], 0);
        assert_eq!(created.json["effective_policy"], shown["effective_policy"]);
        let listed = api.get("/api/v1/branch-rules?limit=1000").await.json;
        let listed = listed
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == overriding.as_str())
            .unwrap()
            .clone();
        assert_eq!(listed["effective_policy"], shown["effective_policy"]);

        // Another field changed: the policy is kept.
        let renamed = api.put(&path, &json!({ "name": "p2" })).await;
        assert_eq!(renamed.status, StatusCode::OK, "{}", renamed.text);
        assert_eq!(renamed.json["policy"], rule_policy);

        // A new rule policy replaces the old one whole, and every branch
        // rule of the rule resolves against it.
        let replaced = api
            .put(&path, &json!({ "policy": { "overlap": "buffer_one" } }))
            .await;
        assert_eq!(replaced.status, StatusCode::OK, "{}", replaced.text);
        assert_eq!(replaced.json["policy"], json!({ "overlap": "buffer_one" }));
        let effective = api.get(&br_path).await.json["effective_policy"].clone();
        assert_eq!(effective["misfire"], "run_once");
        assert_eq!(effective["overlap"], "buffer_one");
        assert_eq!(effective["max_attempts"], 5);
        assert_eq!(effective["backoff_seconds"], 10);

        // `null` clears, stored as NULL; the rule's policy applies as it is.
        let cleared = api.put(&br_path, &json!({ "policy": null })).await;
        assert_eq!(cleared.status, StatusCode::OK, "{}", cleared.text);
        assert_eq!(cleared.json["policy"], Value::Null);
        assert_eq!(cleared.json["effective_policy"]["max_attempts"], 1);
        assert_eq!(cleared.json["effective_policy"]["overlap"], "buffer_one");
        assert!(policy_is_null(&running, "branch_rules", &overriding).await);
        // An empty policy is none too.
        let emptied = api.put(&path, &json!({ "policy": {} })).await;
        assert_eq!(emptied.status, StatusCode::OK, "{}", emptied.text);
        assert_eq!(emptied.json["policy"], Value::Null);
        assert!(policy_is_null(&running, "rules", &rule).await);
        let effective = api.get(&br_path).await.json["effective_policy"].clone();
        assert_eq!(effective["overlap"], "skip");

        // Created without one: NULL, the defaults in force.
        let plain = branch_rule(&api, &f, json!({ "policy": null })).await;
        assert!(policy_is_null(&running, "branch_rules", &plain).await);
        let shown = api.get(&format!("/api/v1/branch-rules/{plain}")).await.json;
        assert_eq!(shown["policy"], Value::Null);
        assert_eq!(shown["effective_policy"]["misfire"], "run_once");
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    a_bad_policy_is_refused_naming_its_field_and_nothing_is_saved,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api) = start(&db, |c| c).await;
        let f = fixture(&api).await;
        let existing = branch_rule(&api, &f, json!({ "policy": { "max_attempts": 2 } })).await;
        let rule_path = format!("/api/v1/rules/{}", f.rule);
        let br_path = format!("/api/v1/branch-rules/{existing}");
        let before = everything(&api).await;
        for (policy, field) in [
            (json!({ "max_attempts": 0 }), "policy.max_attempts"),
            (json!({ "max_attempts": 101 }), "policy.max_attempts"),
            (json!({ "backoff_seconds": 1.5 }), "policy.backoff_seconds"),
            (
                json!({ "catchup_window_seconds": -1 }),
                "policy.catchup_window_seconds",
            ),
            (
                json!({ "start_jitter_seconds": "60" }),
                "policy.start_jitter_seconds",
            ),
            (json!({ "retries": 1 }), "retries"),
            (json!({ "misfire": "sometimes" }), "policy.misfire"),
            (json!({ "overlap": "queue" }), "policy.overlap"),
            (json!([]), "policy"),
            (json!("run_all"), "policy"),
        ] {
            let rule = json!({ "name": "r", "cron_expression": "* * * * *", "policy": policy });
            assert_400(&api.post("/api/v1/rules", &rule).await, field);
            assert_400(
                &api.put(&rule_path, &json!({ "policy": policy })).await,
                field,
            );
            let body = json!({ "branch_id": f.branch, "rule_id": f.rule, "policy": policy });
            assert_400(&api.post("/api/v1/branch-rules", &body).await, field);
            assert_400(
                &api.put(&br_path, &json!({ "policy": policy })).await,
                field,
            );
        }
        // The unknown key is named where it is.
        let reply = api
            .put(&br_path, &json!({ "policy": { "retries": 1 } }))
            .await;
        assert!(
            reply.error_message().starts_with("policy.retries:"),
            "{}",
            reply.text
        );
        assert_eq!(
            everything(&api).await,
            before,
            "a refused policy changed something"
        );
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    a_stored_policy_that_is_not_one_is_shown_with_why,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api) = start(&db, |c| c).await;
        let f = fixture(&api).await;
        let branch_rule = branch_rule(&api, &f, json!({})).await;
        // Written with SQL, around the API's checks.
        let sql = format!(
            "UPDATE rules SET policy = '{{\"max_attempts\": 0}}' WHERE id = '{}'",
            f.rule
        );
        assert_eq!(running.service.store().execute_sql(&sql).await.unwrap(), 1);
        let rule = api.get(&format!("/api/v1/rules/{}", f.rule)).await;
        assert_eq!(rule.status, StatusCode::OK, "{}", rule.text);
        assert_eq!(rule.json["policy"], Value::Null);
        let why = rule.json["policy_error"].as_str().unwrap_or_default();
        assert!(why.starts_with("policy.max_attempts"), "{}", rule.text);
        let shown = api
            .get(&format!("/api/v1/branch-rules/{branch_rule}"))
            .await;
        assert_eq!(shown.status, StatusCode::OK, "{}", shown.text);
        assert_eq!(shown.json["effective_policy"], Value::Null);
        let why = shown.json["policy_error"].as_str().unwrap_or_default();
        assert!(
            why.contains(&f.rule) && why.contains("policy.max_attempts"),
            "{}",
            shown.text
        );
        // Text that is not JSON at all: the listing still answers.
        let sql =
            format!("UPDATE branch_rules SET policy = 'retry twice' WHERE id = '{branch_rule}'");
        assert_eq!(running.service.store().execute_sql(&sql).await.unwrap(), 1);
        let listed = api.get("/api/v1/branch-rules").await;
        assert_eq!(listed.status, StatusCode::OK, "{}", listed.text);
        let shown = api
            .get(&format!("/api/v1/branch-rules/{branch_rule}"))
            .await;
        assert_eq!(shown.status, StatusCode::OK, "{}", shown.text);
        assert_eq!(shown.json["policy"], Value::Null);
        assert_eq!(shown.json["effective_policy"], Value::Null);
        let why = shown.json["policy_error"].as_str().unwrap_or_default();
        assert!(why.starts_with("policy"), "{}", shown.text);
        let cleared = api
            .put(
                &format!("/api/v1/branch-rules/{branch_rule}"),
                &json!({ "policy": null }),
            )
            .await;
        assert_eq!(cleared.status, StatusCode::OK, "{}", cleared.text);
        // Fixed through the API, it is in force again.
        let fixed = api
            .put(
                &format!("/api/v1/rules/{}", f.rule),
                &json!({ "policy": { "max_attempts": 4 } }),
            )
            .await;
        assert_eq!(fixed.status, StatusCode::OK, "{}", fixed.text);
        assert!(fixed.json.get("policy_error").is_none(), "{}", fixed.text);
        let shown = api
            .get(&format!("/api/v1/branch-rules/{branch_rule}"))
            .await
            .json;
        assert_eq!(shown["effective_policy"]["max_attempts"], 4);
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    executions_are_listed_by_status_skipped_included,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api) = start(&db, |c| c).await;
        let f = fixture(&api).await;
        let branch_rule = branch_rule(&api, &f, json!({})).await;
        // As the master records an occurrence a policy did not run.
        let skipped = uuid::Uuid::new_v4();
        let completed = uuid::Uuid::new_v4();
        for (id, status, at, error) in [
            (
                skipped,
                "skipped",
                1_000_000,
                "'misfire: a later occurrence ran in its place'",
            ),
            (completed, "completed", 2_000_000, "NULL"),
        ] {
            let sql = format!(
                "INSERT INTO executions (id, branch_rule_id, scheduled_for, status, attempt, \
                 owner, lock_epoch, requested_at, finished_at, error) \
                 VALUES ('{id}', '{branch_rule}', {at}, '{status}', 1, 'test', 0, {at}, {at}, {error})"
            );
            assert_eq!(running.service.store().execute_sql(&sql).await.unwrap(), 1);
        }
        let reply = api.get("/api/v1/executions?status=skipped").await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        let items = reply.json["items"].as_array().unwrap().clone();
        assert_eq!(items.len(), 1, "{}", reply.text);
        assert_eq!(items[0]["id"], skipped.to_string());
        assert_eq!(items[0]["status"], "skipped");
        assert!(
            items[0]["error"].as_str().unwrap().starts_with("misfire"),
            "{}",
            reply.text
        );
        let reply = api
            .get(&format!(
                "/api/v1/executions?status=completed&branch_rule_id={branch_rule}"
            ))
            .await;
        let items = reply.json["items"].as_array().unwrap().clone();
        assert_eq!(items.len(), 1, "{}", reply.text);
        assert_eq!(items[0]["id"], completed.to_string());
        let one = api.get(&format!("/api/v1/executions/{skipped}")).await;
        assert_eq!(one.json["status"], "skipped", "{}", one.text);
        // A terminal run: nothing to cancel.
        let cancel = api
            .post_empty(&format!("/api/v1/executions/{skipped}/cancel"))
            .await;
        assert_eq!(cancel.status, StatusCode::CONFLICT, "{}", cancel.text);
        running.service.shutdown("test").await.unwrap();
    }
);

// ---- SSRF ------------------------------------------------------------------

/// The guard works on the address a job connects to, whatever the
/// database; SQLite is enough to run the jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn special_purpose_targets_are_refused_when_a_job_runs() {
    let db = common::sqlite_db().await;
    let (running, api) = start(&db, |c| c).await;
    let f = fixture(&api).await;
    let targets = [
        ("[::127.0.0.1]", "reserved"),
        ("[::ffff:127.0.0.1]", "loopback"),
        ("[64:ff9b::7f00:1]", "loopback"),
        ("[64:ff9b::a9fe:a9fe]", "link-local"),
        ("[2002:a00:1::1]", "private"),
        ("[2001:db8::1]", "documentation"),
        ("[fd00::1]", "unique local"),
        ("198.18.0.1", "benchmarking"),
        ("100.64.0.1", "shared address space"),
        ("192.0.0.1", "reserved"),
        ("192.0.2.1", "documentation"),
        ("240.0.0.1", "reserved"),
        ("0.0.0.0", "unspecified"),
    ];
    let mut rules = Vec::new();
    for (host, class) in targets {
        let template = id(&api
            .post(
                "/api/v1/action-templates",
                &json!({ "name": host, "kind": "http", "config": { "url": format!("http://{host}:9/") } }),
            )
            .await);
        let rule = branch_rule(
            &api,
            &f,
            json!({ "action_details": [{ "action_template_id": template }] }),
        )
        .await;
        let run = api
            .post_empty(&format!("/api/v1/branch-rules/{rule}/run"))
            .await;
        assert_eq!(run.status, StatusCode::ACCEPTED, "{}", run.text);
        rules.push((rule, host, class));
    }
    for (rule, host, class) in &rules {
        let path = format!("/api/v1/executions?branch_rule_id={rule}");
        eventually(DEADLINE, &format!("the job for {host} ends"), || async {
            let items = api.get(&path).await.json["items"].clone();
            items[0]["finished_at"].is_string()
        })
        .await;
        let execution = api.get(&path).await.json["items"][0].clone();
        assert_eq!(execution["status"], "failed", "{host}: {execution}");
        let error = execution["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(class) && error.contains("HTTP_ACTION_ALLOW_PRIVATE"),
            "{host} should be refused as {class}: {error}"
        );
    }
    running.service.shutdown("test").await.unwrap();
}

// ---- paging ----------------------------------------------------------------

/// A listing page: its items, `X-Next-Cursor` and `Link`.
struct Page {
    items: Vec<Value>,
    cursor: Option<String>,
    link: Option<String>,
}

async fn page(api: &Api, path: &str) -> Page {
    let response = api
        .client
        .get(format!("{}{path}", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK, "{path}");
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    let cursor = header("x-next-cursor");
    let link = header("link");
    let items = serde_json::from_str::<Value>(&response.text().await.unwrap()).unwrap();
    Page {
        items: items.as_array().expect("a listing is a JSON array").clone(),
        cursor,
        link,
    }
}

/// Walks a listing `limit` at a time; returns the ids in order and the
/// number of pages.
async fn walk(api: &Api, path: &str, limit: usize) -> (Vec<String>, usize) {
    let mut ids = Vec::new();
    let mut pages = 0;
    let mut next = format!("{path}?limit={limit}");
    loop {
        let got = page(api, &next).await;
        pages += 1;
        assert!(
            got.items.len() <= limit,
            "{next}: {} items",
            got.items.len()
        );
        ids.extend(
            got.items
                .iter()
                .map(|i| i["id"].as_str().unwrap().to_string()),
        );
        let Some(cursor) = got.cursor else {
            assert!(got.link.is_none(), "a Link without a cursor on {next}");
            return (ids, pages);
        };
        assert_eq!(got.items.len(), limit, "only a full page has a next one");
        let link = got.link.expect("a Link next to the cursor");
        assert_eq!(
            link,
            format!("<{path}?limit={limit}&cursor={cursor}>; rel=\"next\"")
        );
        next = format!("{path}?limit={limit}&cursor={cursor}");
        assert!(pages < 1000, "the walk does not end");
    }
}

both_backends!(
    every_catalog_listing_is_paged_with_a_cursor,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api) = start(&db, |c| c).await;
        let f = fixture(&api).await;
        for n in 0..104 {
            id(&api
                .post("/api/v1/brands", &json!({ "name": format!("brand {n}") }))
                .await);
        }
        for n in 0..6 {
            branch_rule(&api, &f, json!({ "params": { "n": n } })).await;
        }

        // No limit: 100 and a cursor; the rest (105 brands) after it.
        let first = page(&api, "/api/v1/brands").await;
        assert_eq!(first.items.len(), 100);
        let cursor = first.cursor.expect("a next page");
        assert_eq!(
            first.link.unwrap(),
            format!("</api/v1/brands?cursor={cursor}>; rel=\"next\"")
        );
        let second = page(&api, &format!("/api/v1/brands?cursor={cursor}")).await;
        assert_eq!(second.items.len(), 5);
        assert!(second.cursor.is_none() && second.link.is_none());

        // Walking a page at a time sees every row once, in id order.
        for (path, count) in [
            ("/api/v1/brands", 105),
            ("/api/v1/branches", 1),
            ("/api/v1/rules", 1),
            ("/api/v1/action-templates", 1),
            ("/api/v1/branch-rules", 6),
        ] {
            let everything = page(&api, &format!("{path}?limit=1000")).await;
            assert_eq!(everything.items.len(), count, "{path}");
            assert!(everything.cursor.is_none());
            for limit in [1, 2, 5] {
                let (ids, pages) = walk(&api, path, limit).await;
                assert_eq!(ids.len(), count, "{path} by {limit}");
                assert_eq!(ids.iter().collect::<HashSet<_>>().len(), count);
                let mut sorted = ids.clone();
                sorted.sort();
                assert_eq!(ids, sorted, "{path} is in id order");
                // A count that fills its last page exactly ends with an
                // empty one.
                assert_eq!(pages, count / limit + 1, "{path} by {limit}");
            }
        }

        // The next page of the archived rows is of the archived rows.
        running
            .service
            .store()
            .execute_sql("UPDATE branch_rules SET is_archived = TRUE")
            .await
            .unwrap();
        let archived = page(&api, "/api/v1/branch-rules?archived=true&limit=2").await;
        let cursor = archived.cursor.expect("a next page of archived rows");
        assert_eq!(
            archived.link.unwrap(),
            format!("</api/v1/branch-rules?limit=2&archived=true&cursor={cursor}>; rel=\"next\"")
        );

        // Action details page in the order they run.
        let details: Vec<Value> = [40, 10, 30, 0, 20]
            .iter()
            .map(|p| json!({ "action_template_id": f.template, "position": p }))
            .collect();
        let rule = branch_rule(&api, &f, json!({ "action_details": details })).await;
        let path = format!("/api/v1/branch-rules/{rule}/action-details");
        let (ids, pages) = walk(&api, &path, 2).await;
        assert_eq!(pages, 3);
        let all = page(&api, &path).await.items;
        let positions: Vec<i64> = all
            .iter()
            .map(|d| d["position"].as_i64().unwrap())
            .collect();
        assert_eq!(positions, [0, 10, 20, 30, 40]);
        let in_order: Vec<String> = all
            .iter()
            .map(|d| d["id"].as_str().unwrap().into())
            .collect();
        assert_eq!(ids, in_order);

        // Bad limits and cursors name the parameter.
        for bad in ["limit=0", "limit=1001", "limit=-5"] {
            assert_400(
                &api.get(&format!("/api/v1/branch-rules?{bad}")).await,
                "limit",
            );
        }
        for bad in ["zz", "abc", "not-a-cursor"] {
            assert_400(
                &api.get(&format!("/api/v1/rules?cursor={bad}")).await,
                "cursor",
            );
        }
        assert_400(&api.get(&format!("{path}?limit=0")).await, "limit");
        // /executions takes the same limits.
        assert_400(&api.get("/api/v1/executions?limit=1001").await, "limit");
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    json_broken_with_sql_is_shown_as_broken_and_fixed_with_a_put,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api) = start(&db, |c| c).await;
        let f = fixture(&api).await;
        // A second rule on the template, whose param is secret only by the
        // template's secret_keys: with the config unreadable, every param
        // of its details is masked.
        let secret_by_template = branch_rule(
            &api,
            &f,
            json!({"action_details": [{"action_template_id": f.template, "params": {"order_ref": "o-s3cret"}}]}),
        )
        .await;
        let branch_rule = branch_rule(
            &api,
            &f,
            json!({"action_details": [{"action_template_id": f.template, "params": {"n": 1}}]}),
        )
        .await;
        let store = running.service.store();
        // Written with SQL, around the API's checks: JSON cut short, with
        // a secret in it that no masking could find in broken text.
        for sql in [
            format!(
                "UPDATE action_templates SET config = '{{\"api_key\": \"k-s3cret\", \"secret_keys\": [\"order_ref\"]' WHERE id = '{}'",
                f.template
            ),
            format!(
                "UPDATE rules SET settings = '{{oops' WHERE id = '{}'",
                f.rule
            ),
            format!(
                "UPDATE action_details SET params = 'not json' WHERE branch_rule_id = '{branch_rule}'"
            ),
        ] {
            assert_eq!(store.execute_sql(&sql).await.unwrap(), 1, "{sql}");
        }
        // Every listing and view still answers, saying what is wrong and
        // showing nothing of the broken text.
        for path in [
            "/api/v1/action-templates".to_string(),
            format!("/api/v1/action-templates/{}", f.template),
            "/api/v1/rules".to_string(),
            "/api/v1/branch-rules".to_string(),
            format!("/api/v1/branch-rules/{branch_rule}"),
            format!("/api/v1/branch-rules/{branch_rule}/action-details"),
            format!("/api/v1/branch-rules/{secret_by_template}"),
            format!("/api/v1/branch-rules/{secret_by_template}/action-details"),
        ] {
            let reply = api.get(&path).await;
            assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.text);
            assert!(!reply.text.contains("s3cret"), "{path}: {}", reply.text);
        }
        let template = api
            .get(&format!("/api/v1/action-templates/{}", f.template))
            .await;
        assert_eq!(template.json["config"], json!({}), "{}", template.text);
        let why = template.json["config_error"].as_str().unwrap_or_default();
        assert!(
            why.starts_with("config: the stored text is not JSON"),
            "{}",
            template.text
        );
        let rule = api.get(&format!("/api/v1/rules/{}", f.rule)).await;
        assert!(rule.json["settings_error"].is_string(), "{}", rule.text);
        let shown = api
            .get(&format!("/api/v1/branch-rules/{branch_rule}"))
            .await;
        assert!(
            shown.json["action_details"][0]["params_error"].is_string(),
            "{}",
            shown.text
        );

        // Fixed through the API, the row is whole again.
        let fixed = api
            .put(
                &format!("/api/v1/action-templates/{}", f.template),
                &json!({"config": {}}),
            )
            .await;
        assert_eq!(fixed.status, StatusCode::OK, "{}", fixed.text);
        assert!(fixed.json.get("config_error").is_none(), "{}", fixed.text);
        let fixed = api
            .put(
                &format!("/api/v1/rules/{}", f.rule),
                &json!({"settings": {"region": "eu"}}),
            )
            .await;
        assert_eq!(fixed.status, StatusCode::OK, "{}", fixed.text);
        assert_eq!(fixed.json["settings"], json!({"region": "eu"}));
        let detail = shown.json["action_details"][0]["id"].as_str().unwrap();
        let fixed = api
            .put(
                &format!("/api/v1/branch-rules/{branch_rule}/action-details/{detail}"),
                &json!({"params": {"n": 2}}),
            )
            .await;
        assert_eq!(fixed.status, StatusCode::OK, "{}", fixed.text);
        assert!(fixed.json.get("params_error").is_none(), "{}", fixed.text);
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    a_brand_rule_of_another_rule_or_brand_is_refused,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api) = start(&db, |c| c).await;
        let f = fixture(&api).await;
        let brand = api
            .get(&format!("/api/v1/branches/{}", f.branch))
            .await
            .json["brand_id"]
            .as_str()
            .unwrap()
            .to_string();
        let other_brand = id(&api.post("/api/v1/brands", &json!({ "name": "o" })).await);
        let other_rule = id(&api
            .post(
                "/api/v1/rules",
                &json!({ "name": "o", "cron_expression": "0 4 * * *" }),
            )
            .await);
        // Brand rules are written with SQL: this brand's override of the
        // fixture's rule, of another rule, and another brand's.
        let [fits, of_another_rule, of_another_brand] = [
            (&brand, &f.rule),
            (&brand, &other_rule),
            (&other_brand, &f.rule),
        ]
        .map(|(brand, rule)| {
            (
                uuid::Uuid::new_v4().to_string(),
                brand.clone(),
                rule.clone(),
            )
        });
        for (id, brand, rule) in [&fits, &of_another_rule, &of_another_brand] {
            let sql = format!(
                "INSERT INTO brand_rules (id, brand_id, rule_id, cron_expression, created_at, updated_at) \
                 VALUES ('{id}', '{brand}', '{rule}', '0 5 * * *', 0, 0)"
            );
            running.service.store().execute_sql(&sql).await.unwrap();
        }
        let before = everything(&api).await;
        for (brand_rule, names) in [
            (&of_another_rule, &other_rule),
            (&of_another_brand, &other_brand),
        ] {
            let body =
                json!({"branch_id": f.branch, "rule_id": f.rule, "brand_rule_id": brand_rule.0});
            let refused = api.post("/api/v1/branch-rules", &body).await;
            assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.text);
            assert!(refused.text.contains("brand_rule_id"), "{}", refused.text);
            assert!(refused.text.contains(names.as_str()), "{}", refused.text);
        }
        assert_eq!(
            everything(&api).await,
            before,
            "a refused request saved something"
        );

        let created = branch_rule(&api, &f, json!({"brand_rule_id": fits.0})).await;
        // Moving it to another rule leaves the brand rule behind: refused.
        let moved = api
            .put(
                &format!("/api/v1/branch-rules/{created}"),
                &json!({"rule_id": other_rule}),
            )
            .await;
        assert_eq!(moved.status, StatusCode::CONFLICT, "{}", moved.text);
        assert!(moved.text.contains("brand_rule_id"), "{}", moved.text);
        let moved = api
            .put(
                &format!("/api/v1/branch-rules/{created}"),
                &json!({"rule_id": other_rule, "brand_rule_id": of_another_rule.0}),
            )
            .await;
        assert_eq!(moved.status, StatusCode::OK, "{}", moved.text);
        // Or moved back with its brand rule cleared: `null` clears it.
        let moved = api
            .put(
                &format!("/api/v1/branch-rules/{created}"),
                &json!({"rule_id": f.rule, "brand_rule_id": null}),
            )
            .await;
        assert_eq!(moved.status, StatusCode::OK, "{}", moved.text);
        assert_eq!(moved.json["brand_rule_id"], Value::Null, "{}", moved.text);

        // Its branch moving to another brand would take the brand rule
        // along: refused, naming the branch rule, until it is cleared.
        let rebound = api
            .put(
                &format!("/api/v1/branch-rules/{created}"),
                &json!({"brand_rule_id": fits.0}),
            )
            .await;
        assert_eq!(rebound.status, StatusCode::OK, "{}", rebound.text);
        let branch = format!("/api/v1/branches/{}", f.branch);
        let refused = api.put(&branch, &json!({"brand_id": other_brand})).await;
        assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.text);
        assert!(refused.text.contains("brand_id"), "{}", refused.text);
        assert!(refused.text.contains(created.as_str()), "{}", refused.text);
        let same = api.put(&branch, &json!({"brand_id": brand})).await;
        assert_eq!(same.status, StatusCode::OK, "{}", same.text);
        let cleared = api
            .put(
                &format!("/api/v1/branch-rules/{created}"),
                &json!({"brand_rule_id": null}),
            )
            .await;
        assert_eq!(cleared.status, StatusCode::OK, "{}", cleared.text);
        let moved = api.put(&branch, &json!({"brand_id": other_brand})).await;
        assert_eq!(moved.status, StatusCode::OK, "{}", moved.text);
        running.service.shutdown("test").await.unwrap();
    }
);

// `null` clears what a create may leave out: a branch's zone (the default
// applies again) and a rule's brand (it becomes global); left out keeps it.
both_backends!(
    null_clears_a_branch_zone_and_a_rule_brand,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api) = start(&db, |c| c).await;
        let f = fixture(&api).await;
        let branch = format!("/api/v1/branches/{}", f.branch);
        let kept = api.put(&branch, &json!({ "name": "y" })).await;
        assert_eq!(kept.json["timezone"], "Asia/Riyadh", "{}", kept.text);
        let cleared = api.put(&branch, &json!({ "timezone": null })).await;
        assert_eq!(cleared.status, StatusCode::OK, "{}", cleared.text);
        assert_eq!(cleared.json["timezone"], Value::Null, "{}", cleared.text);

        let brand = id(&api.post("/api/v1/brands", &json!({ "name": "own" })).await);
        let rule = format!("/api/v1/rules/{}", f.rule);
        let owned = api.put(&rule, &json!({ "brand_id": brand })).await;
        assert_eq!(owned.json["brand_id"], brand.as_str(), "{}", owned.text);
        let global = api.put(&rule, &json!({ "brand_id": null })).await;
        assert_eq!(global.status, StatusCode::OK, "{}", global.text);
        assert_eq!(global.json["brand_id"], Value::Null, "{}", global.text);
        running.service.shutdown("test").await.unwrap();
    }
);
