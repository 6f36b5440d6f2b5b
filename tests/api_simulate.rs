//! `POST /api/v1/simulate` and the policy in a branch rule's preview
//! (issue 13), over real loopback HTTP on SQLite and PostgreSQL: the demo
//! rules and the service's own plan simulated, the same body giving the
//! same bytes, outages turning into misfire skips, the bounds refused with
//! a 400 naming the field, no token needed; and a preview showing which
//! occurrences its policy skips.

mod common;

use std::time::Duration;

use common::api::{Api, Reply, id};
use common::service::{RunningService, start_service_with, without_delays};
use common::{TestDb, eventually};
use reqwest::StatusCode;
use ruled::config::Config;
use serde_json::{Value, json};

const TOKEN: &str = "simulate-token";
const DEADLINE: Duration = Duration::from_secs(30);
const SIMULATE: &str = "/api/v1/simulate";

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
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text);
    assert!(
        reply.error_message().contains(field),
        "the message should name {field}: {}",
        reply.text
    );
}

fn decisions(reply: &Reply) -> &Vec<Value> {
    reply.json["decisions"].as_array().expect("decisions")
}

fn ms(text: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(text)
        .unwrap()
        .timestamp_millis()
}

/// Decisions in tick order, each tick its time's: `(at − from) /
/// resolution_ms`.
#[track_caller]
fn assert_in_tick_order(reply: &Reply) {
    let from = ms(reply.json["from"].as_str().unwrap());
    let resolution = reply.json["resolution_ms"].as_i64().unwrap();
    let mut last = (0, i64::MIN);
    for decision in decisions(reply) {
        let tick = decision["tick"].as_i64().unwrap();
        let at = ms(decision["at"].as_str().unwrap());
        assert_eq!(tick, (at - from) / resolution, "{decision}");
        assert!(
            (tick, at) >= last,
            "out of order: {decision} after {last:?}"
        );
        last = (tick, at);
    }
}

fn count_of(reply: &Reply, kind: &str, reason: Option<&str>) -> usize {
    decisions(reply)
        .iter()
        .filter(|d| d["decision"] == kind && reason.is_none_or(|r| d["reason"] == r))
        .count()
}

const DAY: (&str, &str) = ("2026-03-28T00:00:00Z", "2026-03-29T00:00:00Z");

both_backends!(
    the_demo_rules_simulated_for_a_day_without_a_token,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api) = start(&db, |c| c).await;
        // A simulation changes nothing: no token needed, as for reads.
        let anonymous = api.without_token();
        let body = json!({ "from": DAY.0, "to": DAY.1, "demo": true });
        let reply = anonymous.post(SIMULATE, &body).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        let runs = reply.json["runs"].as_u64().unwrap();
        assert!(runs > 0, "{}", reply.text);
        assert_eq!(
            runs as usize,
            count_of(&reply, "run", None),
            "the totals count the decisions"
        );
        assert_eq!(reply.json["resolution_ms"], 1000);
        assert_in_tick_order(&reply);
        let first = &decisions(&reply)[0];
        for field in [
            "tick",
            "at",
            "utc",
            "local",
            "branch_rule_id",
            "partition",
            "zone",
            "occurrence",
            "attempt",
            "decision",
        ] {
            assert!(first.get(field).is_some(), "{field} missing: {first}");
        }
        // The demo's three branches, each in its own zone.
        let zones: std::collections::BTreeSet<&str> = decisions(&reply)
            .iter()
            .filter_map(|d| d["zone"].as_str())
            .collect();
        assert_eq!(
            zones.into_iter().collect::<Vec<_>>(),
            ["America/New_York", "Asia/Riyadh", "Australia/Sydney"]
        );
        // The same body, the same bytes; a token changes nothing.
        let again = api.post(SIMULATE, &body).await;
        assert_eq!(again.status, StatusCode::OK, "{}", again.text);
        assert_eq!(again.text, reply.text);
        // Failures, seeded: the same seed gives the same report, another
        // seed another one.
        let failing = |seed: u64| {
            json!({
                "from": DAY.0, "to": "2026-03-28T02:00:00Z", "demo": true,
                "fail_rate": 0.5, "seed": seed,
            })
        };
        let seven = anonymous.post(SIMULATE, &failing(7)).await;
        assert_eq!(seven.status, StatusCode::OK, "{}", seven.text);
        assert!(
            decisions(&seven)
                .iter()
                .any(|d| d["decision"] == "finished" && d["status"] == "failed"),
            "{}",
            seven.text
        );
        assert_eq!(anonymous.post(SIMULATE, &failing(7)).await.text, seven.text);
        assert_ne!(anonymous.post(SIMULATE, &failing(8)).await.text, seven.text);
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    the_services_own_plan_is_simulated,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api) = start(&db, |c| c).await;
        let brand = id(&api.post("/api/v1/brands", &json!({ "name": "b" })).await);
        let branch = id(&api
            .post(
                "/api/v1/branches",
                &json!({ "brand_id": brand, "name": "x", "timezone": "Europe/Berlin" }),
            )
            .await);
        let rule = id(&api
            .post(
                "/api/v1/rules",
                &json!({ "name": "r", "cron_expression": "*/15 * * * *" }),
            )
            .await);
        let from = chrono::Utc::now() + chrono::Duration::hours(1);
        let created = api
            .post(
                "/api/v1/branch-rules",
                &json!({
                    "branch_id": branch, "rule_id": rule,
                    "next_run_time": from.to_rfc3339(),
                }),
            )
            .await;
        let branch_rule = id(&created);
        // Simulated from the plan, which takes the new row within a moment.
        let body = json!({
            "from": from.to_rfc3339(),
            "to": (from + chrono::Duration::hours(2)).to_rfc3339(),
        });
        let anonymous = api.without_token();
        let runs_of_mine = |reply: &Reply| {
            decisions(reply)
                .iter()
                .filter(|d| d["branch_rule_id"] == branch_rule.as_str() && d["decision"] == "run")
                .count()
        };
        eventually(DEADLINE, "the new rule in the simulation", || async {
            let reply = anonymous.post(SIMULATE, &body).await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
            runs_of_mine(&reply) > 0
        })
        .await;
        let reply = anonymous.post(SIMULATE, &body).await;
        // Due at `from`, then every quarter hour of the two hours.
        let runs = runs_of_mine(&reply);
        assert!((8..=9).contains(&runs), "{runs}: {}", reply.text);
        assert_in_tick_order(&reply);
        let mine = decisions(&reply)
            .iter()
            .find(|d| d["branch_rule_id"] == branch_rule.as_str())
            .unwrap();
        assert_eq!(mine["zone"], "Europe/Berlin");
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    an_outage_turns_into_misfire_skips,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api) = start(&db, |c| c).await;
        let plain = api
            .post(
                SIMULATE,
                &json!({ "from": DAY.0, "to": DAY.1, "demo": true }),
            )
            .await;
        let down = api
            .post(
                SIMULATE,
                &json!({
                    "from": DAY.0, "to": DAY.1, "demo": true,
                    "down": [{ "from": "2026-03-28T01:00:00Z", "to": "2026-03-28T04:00:00Z" }],
                }),
            )
            .await;
        assert_eq!(down.status, StatusCode::OK, "{}", down.text);
        assert_in_tick_order(&down);
        assert_eq!(
            count_of(&plain, "skipped", Some("misfire")),
            0,
            "{}",
            plain.text
        );
        // The heartbeat (every minute, three branches) misses three hours;
        // run_once runs the latest and records the rest skipped.
        let misfires = count_of(&down, "skipped", Some("misfire"));
        assert!(misfires >= 3 * 170, "{misfires}: {}", down.text);
        assert!(
            down.json["runs"].as_u64().unwrap() < plain.json["runs"].as_u64().unwrap(),
            "nothing runs while ruled is down"
        );
        let outage = (ms("2026-03-28T01:00:00Z"), ms("2026-03-28T04:00:00Z"));
        assert!(
            decisions(&down)
                .iter()
                .filter(|d| d["decision"] == "run")
                .all(|d| !(outage.0..outage.1).contains(&ms(d["at"].as_str().unwrap()))),
            "a run during the outage"
        );
        let skipped = decisions(&down)
            .iter()
            .find(|d| d["reason"] == "misfire")
            .unwrap();
        assert!(skipped["detail"].is_string(), "{skipped}");
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    bounds_and_bad_values_are_400s_naming_the_field,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api) = start(&db, |c| c).await;
        let api = api.without_token();
        // 40 days at one second: 3,456,000 ticks, past 2,678,400.
        let long = api
            .post(
                SIMULATE,
                &json!({ "from": "2026-03-01T00:00:00Z", "to": "2026-04-10T00:00:00Z" }),
            )
            .await;
        assert_400(&long, "to");
        assert!(
            long.error_message().contains("resolution_ms"),
            "{}",
            long.text
        );
        assert_eq!(long.error_code(), "invalid_field");
        // The demo rules over 31 days make more decisions than allowed.
        let busy = api
            .post(
                SIMULATE,
                &json!({
                    "from": "2026-03-01T00:00:00Z", "to": "2026-04-01T00:00:00Z", "demo": true,
                }),
            )
            .await;
        assert_400(&busy, "decisions");
        for (body, field) in [
            (
                json!({ "from": DAY.0, "to": DAY.1, "fail_rate": 2 }),
                "fail_rate",
            ),
            (
                json!({ "from": DAY.0, "to": DAY.1, "fail_rate": -0.1 }),
                "fail_rate",
            ),
            (json!({ "from": DAY.1, "to": DAY.0 }), "to"),
            (json!({ "from": DAY.0, "to": DAY.0 }), "to"),
            (json!({ "from": DAY.0 }), "to"),
            (
                json!({ "from": DAY.0, "to": DAY.1, "resolution_ms": 0 }),
                "resolution_ms",
            ),
            (
                json!({ "from": DAY.0, "to": DAY.1, "duration_ms": 0 }),
                "duration_ms",
            ),
            (json!({ "from": DAY.0, "to": DAY.1, "seed": -1 }), "seed"),
            (json!({ "from": DAY.0, "to": DAY.1, "demo": "yes" }), "demo"),
            (json!({ "from": "yesterday", "to": DAY.1 }), "from"),
            (
                json!({ "from": DAY.0, "to": DAY.1, "down": [{ "from": DAY.1, "to": DAY.0 }] }),
                "down[0].to",
            ),
            (
                json!({ "from": DAY.0, "to": DAY.1, "down": [{ "from": DAY.0 }] }),
                "down[0].to",
            ),
            (
                json!({ "from": DAY.0, "to": DAY.1, "down": [{ "from": DAY.0, "to": DAY.1, "why": 1 }] }),
                "why",
            ),
            // Unknown keys are refused, not ignored.
            (
                json!({ "from": DAY.0, "to": DAY.1, "format": "json" }),
                "format",
            ),
        ] {
            let reply = api.post(SIMULATE, &body).await;
            assert_400(&reply, field);
        }
        let too_many_windows: Vec<Value> = (0..101)
            .map(|_| json!({ "from": DAY.0, "to": DAY.1 }))
            .collect();
        let reply = api
            .post(
                SIMULATE,
                &json!({ "from": DAY.0, "to": DAY.1, "down": too_many_windows }),
            )
            .await;
        assert_400(&reply, "down");
        // The same range is fine at a coarser clock.
        let coarse = api
            .post(
                SIMULATE,
                &json!({
                    "from": "2026-03-01T00:00:00Z", "to": "2026-04-10T00:00:00Z",
                    "resolution_ms": 60000,
                }),
            )
            .await;
        assert_eq!(coarse.status, StatusCode::OK, "{}", coarse.text);
        running.service.shutdown("test").await.unwrap();
    }
);

/// Without any token configured the API is read-only, and a simulation,
/// which changes nothing, still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_api_still_simulates() {
    let db = common::sqlite_db().await;
    let (running, api) = start(&db, |c| Config {
        api_token: None,
        ..c
    })
    .await;
    let reply = api
        .post(
            SIMULATE,
            &json!({ "from": DAY.0, "to": "2026-03-28T01:00:00Z", "demo": true }),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let change = api.post("/api/v1/brands", &json!({ "name": "b" })).await;
    assert_eq!(change.status, StatusCode::FORBIDDEN, "{}", change.text);
    running.service.shutdown("test").await.unwrap();
}

both_backends!(
    the_preview_shows_what_the_policy_skips,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let (running, api) = start(&db, |c| c).await;
        let brand = id(&api.post("/api/v1/brands", &json!({ "name": "b" })).await);
        let branch = id(&api
            .post(
                "/api/v1/branches",
                &json!({ "brand_id": brand, "name": "x", "timezone": "UTC" }),
            )
            .await);
        // The rule says run_all; the branch rule overrides it with skip.
        let rule = id(&api
            .post(
                "/api/v1/rules",
                &json!({
                    "name": "hourly", "cron_expression": "0 * * * *",
                    "policy": { "misfire": "run_all", "max_attempts": 3 },
                }),
            )
            .await);
        let skip = id(&api
            .post(
                "/api/v1/branch-rules",
                &json!({
                    "branch_id": branch, "rule_id": rule,
                    "operation_time_from": "09:00", "operation_time_to": "11:00",
                    "policy": { "misfire": "skip" },
                }),
            )
            .await);
        let preview = api
            .get(&format!(
                "/api/v1/branch-rules/{skip}/preview?count=3&from=2026-06-01T08:00:00Z"
            ))
            .await;
        assert_eq!(preview.status, StatusCode::OK, "{}", preview.text);
        let shown = &preview.json;
        // The runs as before: the window's opening for 08:00, then 10:00 …
        let runs: Vec<&str> = shown["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["utc"].as_str().unwrap())
            .collect();
        assert_eq!(
            runs,
            [
                "2026-06-01T09:00:00+00:00",
                "2026-06-01T10:00:00+00:00",
                "2026-06-02T09:00:00+00:00"
            ]
        );
        // … and the policy in force, its own field over its rule's.
        assert_eq!(shown["policy"]["misfire"], "skip");
        assert_eq!(shown["policy"]["max_attempts"], 3);
        assert_eq!(shown["decisions_truncated"], false);
        let steps = shown["decisions"].as_array().unwrap();
        let ran: Vec<&str> = steps
            .iter()
            .filter(|s| s["decision"] == "run")
            .map(|s| s["starts_at"].as_str().unwrap())
            .collect();
        assert_eq!(
            ran,
            [
                "2026-06-01T09:00:00+00:00",
                "2026-06-01T10:00:00+00:00",
                "2026-06-02T09:00:00+00:00"
            ]
        );
        assert_eq!(
            steps[0],
            json!({
                "occurrence": "2026-06-01T08:00:00+00:00",
                "starts_at": null,
                "decision": "outside_window",
            })
        );
        // 11:00 … 08:00 the next day fall outside the window, skipped.
        let skipped: Vec<&Value> = steps.iter().filter(|s| s["decision"] != "run").collect();
        assert_eq!(skipped.len(), 1 + 22, "{}", preview.text);
        assert!(
            skipped
                .iter()
                .all(|s| s["decision"] == "outside_window" && s["starts_at"].is_null())
        );
        // With the rule's run_all (the branch rule's override cleared) the
        // missed 08:00 runs late at the window's opening instead.
        let cleared = api
            .put(
                &format!("/api/v1/branch-rules/{skip}"),
                &json!({ "policy": null }),
            )
            .await;
        assert_eq!(cleared.status, StatusCode::OK, "{}", cleared.text);
        let run_all = api
            .get(&format!(
                "/api/v1/branch-rules/{skip}/preview?count=1&from=2026-06-01T08:00:00Z"
            ))
            .await;
        assert_eq!(run_all.json["policy"]["misfire"], "run_all");
        assert_eq!(
            run_all.json["decisions"],
            json!([{
                "occurrence": "2026-06-01T08:00:00+00:00",
                "starts_at": "2026-06-01T09:00:00+00:00",
                "decision": "run",
            }])
        );
        running.service.shutdown("test").await.unwrap();
    }
);

/// A preview whose policy skips nearly everything (a minute cron in a
/// one-minute window) answers quickly, its decisions cut short and said
/// so, its runs in full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_that_skips_too_much_is_cut_short() {
    let db = common::sqlite_db().await;
    let (running, api) = start(&db, |c| c).await;
    let brand = id(&api.post("/api/v1/brands", &json!({ "name": "b" })).await);
    let branch = id(&api
        .post(
            "/api/v1/branches",
            &json!({ "brand_id": brand, "name": "x", "timezone": "UTC" }),
        )
        .await);
    let rule = id(&api
        .post(
            "/api/v1/rules",
            &json!({ "name": "r", "cron_expression": "* * * * *" }),
        )
        .await);
    let narrow = id(&api
        .post(
            "/api/v1/branch-rules",
            &json!({
                "branch_id": branch, "rule_id": rule,
                "operation_time_from": "00:00", "operation_time_to": "00:01",
                "policy": { "misfire": "skip" },
            }),
        )
        .await);
    let started = std::time::Instant::now();
    let preview = api
        .get(&format!(
            "/api/v1/branch-rules/{narrow}/preview?count=1000&from=2026-06-01T08:00:00Z"
        ))
        .await;
    assert_eq!(preview.status, StatusCode::OK, "{}", preview.text);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(preview.json["runs"].as_array().unwrap().len(), 1000);
    assert_eq!(preview.json["decisions_truncated"], true);
    let steps = preview.json["decisions"].as_array().unwrap();
    assert!(!steps.is_empty());
    assert!(steps.iter().any(|s| s["decision"] == "outside_window"));
    running.service.shutdown("test").await.unwrap();
}
