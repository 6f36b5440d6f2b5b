//! `ruled serve` with LOG_FORMAT=json: a rule created over HTTP runs, and
//! every log line about its job is JSON carrying branch_rule_id and
//! execution_id; the action's secret params never reach the log.

mod common;

use common::api::Api;
use common::process::{Install, signal, wait_exit};
use serde_json::{Value, json};

const TOKEN: &str = "log-test-token";
const SECRET: &str = "Bearer do-not-log-me";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_log_lines_are_json_with_both_ids() {
    let install = Install::new();
    let mut child = install.spawn_logged(
        install
            .command(&["serve"])
            .env("LOG_FORMAT", "json")
            .env("API_TOKEN", TOKEN)
            .env("MASTER_GRACE_PERIOD_SECONDS", "0")
            .env("WORKER_STAGGER_SECONDS", "0"),
        "serve.log",
    );
    let api = Api::at(install.listening_addr("serve.log"), Some(TOKEN));
    let post = |path: &'static str, body: Value| {
        let api = &api;
        async move {
            let reply = api.post(path, &body).await;
            assert!(reply.status.is_success(), "{path}: {}", reply.text);
            reply.json["id"].as_str().unwrap().to_string()
        }
    };
    let brand = post("/api/v1/brands", json!({ "name": "b" })).await;
    let branch = post(
        "/api/v1/branches",
        json!({ "brand_id": brand, "name": "x", "timezone": "UTC" }),
    )
    .await;
    let rule = post(
        "/api/v1/rules",
        json!({ "name": "r", "cron_expression": "0 0 1 1 *" }),
    )
    .await;
    let template = post(
        "/api/v1/action-templates",
        json!({ "name": "t", "kind": "noop" }),
    )
    .await;
    let branch_rule = post(
        "/api/v1/branch-rules",
        json!({
            "branch_id": branch, "rule_id": rule,
            "next_run_time": chrono::Utc::now().to_rfc3339(),
            "action_details": [{ "action_template_id": template, "params": { "headers": { "Authorization": SECRET } } }],
        }),
    )
    .await;
    install.wait_for_log("serve.log", "finished job");
    signal(&child, libc::SIGTERM);
    assert!(wait_exit(&mut child).success());

    let log = install.log("serve.log");
    assert!(!log.contains("do-not-log-me"), "a secret reached the log");
    let mut job_lines = 0;
    for line in log.lines() {
        let entry: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        let message = entry["fields"]["message"].as_str().unwrap_or("");
        // A line naming the rule carries its id as a field; a line about a
        // job ("job", not the queue's "jobs" or "job(s)") carries both ids.
        if message.contains(&branch_rule) {
            assert_eq!(
                entry["fields"]["branch_rule_id"],
                branch_rule.as_str(),
                "{line}"
            );
        }
        let about_a_job = !message.contains("job(s)")
            && message
                .split(|c: char| !c.is_alphanumeric())
                .any(|word| word == "job");
        if about_a_job {
            job_lines += 1;
            assert_eq!(
                entry["fields"]["branch_rule_id"],
                branch_rule.as_str(),
                "{line}"
            );
            assert!(
                entry["fields"]["execution_id"]
                    .as_str()
                    .is_some_and(|id| !id.is_empty()),
                "{line}"
            );
        }
    }
    // Added, pulled, finished at least.
    assert!(job_lines >= 3, "only {job_lines} job lines in:\n{log}");
}
