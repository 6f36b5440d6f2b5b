//! The outbox: a post-process the database cannot take is kept, saved with
//! the plan, and delivered once the database is back; the occurrence runs
//! exactly once.

mod common;

use std::time::Duration;

use common::api::Api;
use common::rules::{YEARLY, insert_rule, step};
use common::service::{start_service_with, without_delays};
use common::{TestDb, eventually};
use ruled::actors::ask;
use ruled::config::Config;
use ruled::lifecycle::{ClaimRequest, Finish, RetryUpdate};
use ruled::messages::PlanMsg;
use ruled::model::ExecutionStatus;
use ruled::persist::write_plan_file;
use ruled::plan::{OutboxEntry, PlanSnapshot};
use serde_json::json;
use uuid::Uuid;

const DEADLINE: Duration = Duration::from_secs(40);
const TOKEN: &str = "outbox-token";

both_backends!(
    a_post_process_during_an_outage_lands_later_exactly_once,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let running = start_service_with(&db.url, |config| Config {
            api_token: Some(TOKEN.into()),
            ..without_delays(config)
        })
        .await;
        let service = &running.service;
        let store = service.store();
        let id = insert_rule(
            store,
            YEARLY,
            chrono::Utc::now().timestamp_millis(),
            &[step("sleep", json!({"ms": 5_000}))],
        )
        .await;
        eventually(DEADLINE, "the job runs", || async {
            store
                .executions_for(id)
                .await
                .unwrap()
                .iter()
                .any(|e| e.status == ExecutionStatus::Running)
        })
        .await;

        // The database goes away while the job is still running.
        let outage = db.outage().await;
        let plan = service.directory().plan().unwrap();
        eventually(DEADLINE, "the post-process waits in the outbox", || async {
            ask(&plan, PlanMsg::Outbox)
                .await
                .is_ok_and(|outbox| outbox.len() == 1)
        })
        .await;
        let snapshot = ask(&plan, PlanMsg::Snapshot).await.unwrap();
        assert_eq!(snapshot.outbox.len(), 1, "saved with the plan");
        // `GET /plan` lists it, its output (response captures, program
        // output) only for a caller holding the token, as `/executions`.
        let open = Api::at(service.http_addr(), None).get("/api/v1/plan").await;
        let output = &open.json["outbox"][0]["finish"]["output"];
        assert_eq!(output["hidden"], true, "{}", open.text);
        let with_token = Api::new(service).get("/api/v1/plan").await;
        let output = &with_token.json["outbox"][0]["finish"]["output"];
        assert!(
            output.to_string().contains("slept_ms"),
            "{}",
            with_token.text
        );
        // The overview's figures are this process's own: `/stats` answers,
        // saying only the failures could not be read (SQLite's outage here
        // is a held write lock: reads go on).
        let stats = Api::at(service.http_addr(), None)
            .get("/api/v1/stats")
            .await;
        assert_eq!(stats.status, 200, "{}", stats.text);
        if db.backend == ruled::store::Backend::Postgres {
            assert!(
                stats.json["recent_errors_unavailable"].is_string(),
                "{}",
                stats.text
            );
        }
        assert_eq!(stats.json["queue"]["active_jobs"], 0, "{}", stats.text);
        let workflow = snapshot.workflows.iter().find(|w| w.id() == id).unwrap();
        let now = chrono::Utc::now().timestamp_millis();
        assert!(
            workflow.branch_rule.next_run_time.unwrap() > now,
            "next_run_time computed locally: {workflow:?}"
        );

        outage.restore().await;
        eventually(DEADLINE, "the outbox is delivered", || async {
            let landed = store
                .executions_for(id)
                .await
                .is_ok_and(|runs| runs.iter().any(|e| e.status == ExecutionStatus::Completed));
            let empty = ask(&plan, PlanMsg::Outbox)
                .await
                .is_ok_and(|o| o.is_empty());
            landed && empty
        })
        .await;
        let runs = store.executions_for(id).await.unwrap();
        assert_eq!(runs.len(), 1, "exactly one run of the occurrence: {runs:?}");
        let data = store.load_plan_data(100).await.unwrap();
        let rule = data.branch_rules.iter().find(|r| r.id == id).unwrap();
        assert!(
            !rule.is_currently_running && rule.lock_holder.is_none(),
            "{rule:?}"
        );
        assert!(rule.next_run_time.unwrap() > now, "{rule:?}");
        assert!(rule.last_run_time.is_some());
        running.service.shutdown("test").await.unwrap();
    }
);

/// An outbox entry the database refuses for good (here a trigger) would be
/// refused at every start: the start goes on, the run is recorded lost, and
/// the occurrence runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_entry_refused_for_good_does_not_stop_the_start() {
    let db = common::sqlite_db().await;
    let store = db.store().await;
    let now = chrono::Utc::now().timestamp_millis();
    let id = insert_rule(&store, YEARLY, now, &[step("noop", json!({}))]).await;
    let instance = "refused-outbox";
    let claim = store
        .claim(&ClaimRequest {
            branch_rule_id: id,
            holder: instance.into(),
            now,
            lock_timeout_ms: 300_000,
            execution_id: Uuid::new_v4(),
            run_now: false,
            due_by: None,
        })
        .await
        .unwrap()
        .expect("claimed");
    let fence = claim.fence();
    assert!(store.mark_scheduled(&fence, now).await.unwrap());
    assert!(store.mark_running(&fence, now).await.unwrap());
    store
        .execute_sql(
            "CREATE TRIGGER refuse_the_first_completion BEFORE UPDATE ON executions \
             WHEN NEW.status = 'completed' AND NEW.attempt = 1 \
             BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
        )
        .await
        .unwrap();
    let files = tempfile::tempdir().unwrap();
    let plan_file = files.path().join("plan.json");
    let finish = Finish {
        status: ExecutionStatus::Completed,
        finished_at: now + 1,
        error: None,
        output: None,
        next_run_time: Some(now + 86_400_000),
        advance_last_run: true,
        retry: RetryUpdate::Keep,
        skipped: Vec::new(),
        clear_next_run: false,
    };
    let snapshot = PlanSnapshot {
        saved_at: now + 1,
        outbox: vec![OutboxEntry {
            fence: fence.clone(),
            finish,
            added_at: now + 1,
        }],
        ..PlanSnapshot::default()
    };
    write_plan_file(&plan_file, &snapshot).unwrap();

    let running = start_service_with(&db.url, |config| Config {
        instance_id: instance.into(),
        plan_file,
        ..without_delays(config)
    })
    .await;
    eventually(DEADLINE, "the occurrence runs again", || async {
        store
            .executions_for(id)
            .await
            .unwrap()
            .iter()
            .any(|e| e.attempt == 2 && e.status == ExecutionStatus::Completed)
    })
    .await;
    let first = store.execution(fence.execution_id).await.unwrap().unwrap();
    assert_eq!(first.status, ExecutionStatus::Failed, "{first:?}");
    assert_eq!(first.error.as_deref(), Some("worker_lost"));
    running.service.shutdown("test").await.unwrap();
}
