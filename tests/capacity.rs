//! Capacity you can see: `ruled serve` with too few workers for the work
//! that falls due says so in its log and its metrics, names the settings
//! to change, and says again when it has caught up.

mod common;

use std::time::{Duration, Instant};

use common::api::{Api, metric_sample};
use common::process::{DEADLINE, Install, signal, wait_exit};
use common::rules::{YEARLY, insert_many_rules, step};
use ruled::store::Store;
use serde_json::json;

/// One worker resting a second after each job: about one job a second.
const SETTINGS: &[(&str, &str)] = &[
    ("WORKER_COUNT", "1"),
    ("WORKER_COOLDOWN_SECONDS", "1"),
    ("WORKER_STAGGER_SECONDS", "0"),
    ("MASTER_GRACE_PERIOD_SECONDS", "0"),
    ("BACKLOG_WINDOW_SECONDS", "1"),
];

async fn metric(api: &Api, name: &str) -> Option<f64> {
    metric_sample(&api.get("/metrics").await.text, name, &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_the_workers_cannot_work_off_is_a_warning_and_a_gauge() {
    let install = Install::new();
    let mut command = install.command(&["serve"]);
    for (name, value) in SETTINGS {
        command.env(name, value);
    }
    let mut child = install.spawn_logged(&mut command, "serve.log");
    let api = Api::at(install.listening_addr("serve.log"), None);
    let capacity = metric(&api, "ruled_capacity_jobs_per_second").await;
    assert_eq!(capacity, Some(1.0), "one worker, one second's rest");
    assert_eq!(metric(&api, "ruled_ready_backlog_growing").await, Some(0.0));

    // Work falls due faster than one a second: a few rules every 200 ms.
    let url = format!("sqlite://{}", install.path("ruled.db").display());
    let store = Store::connect(&url).await.unwrap();
    let noop = step("noop", json!({}));
    let deadline = Instant::now() + DEADLINE;
    while !install.log("serve.log").contains("Ready backlog growing") {
        assert!(
            Instant::now() < deadline,
            "no backlog warning:\n{}",
            install.log("serve.log")
        );
        let now = chrono::Utc::now().timestamp_millis();
        insert_many_rules(&store, 4, YEARLY, now, &noop, None).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let log = install.log("serve.log");
    let warning = log
        .lines()
        .find(|line| line.contains("Ready backlog growing"))
        .unwrap();
    for named in [
        "WARN",
        "WORKER_COUNT=1",
        "WORKER_COOLDOWN_SECONDS=1",
        "Raise WORKER_COUNT",
    ] {
        assert!(warning.contains(named), "{named} missing: {warning}");
    }
    assert_eq!(metric(&api, "ruled_ready_backlog_growing").await, Some(1.0));
    // Noop jobs take milliseconds: the rest dominates each slot's cycle.
    let capacity = metric(&api, "ruled_capacity_jobs_per_second")
        .await
        .unwrap();
    assert!((0.5..=1.0).contains(&capacity), "{capacity}");

    // Nothing more falls due, and what waits is switched off: caught up.
    store
        .execute_sql("UPDATE branch_rules SET is_active = 0")
        .await
        .unwrap();
    install.wait_for_log("serve.log", "Ready backlog worked off");
    common::eventually(DEADLINE, "the backlog gauge is 0 again", || async {
        metric(&api, "ruled_ready_backlog_growing").await == Some(0.0)
    })
    .await;
    signal(&child, libc::SIGTERM);
    assert!(wait_exit(&mut child).success());
}
