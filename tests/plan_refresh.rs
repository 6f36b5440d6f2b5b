//! The plan follows the database: rows written with plain SQL reach the
//! ready set at the next refresh, on SQLite and PostgreSQL.

mod common;

use std::time::Duration;

use common::service::{
    DEADLINE, RunningService, ready_ids, start_service, start_service_with, without_delays,
};
use common::{TestDb, eventually, wait_for_execution};
use ruled::actors::ask;
use ruled::messages::PlanMsg;
use ruled::model::ExecutionStatus;
use ruled::service::Service;
use uuid::Uuid;

/// Inserts a brand, a branch, an active rule and a branch rule due a minute
/// ago, all with plain SQL as an operator or another system would.
async fn insert_due_rule(service: &Service, branch_is_active: bool) -> (Uuid, Uuid) {
    let store = service.store();
    let (brand, branch, rule, branch_rule) = (
        Uuid::new_v4(),
        Uuid::new_v4(),
        Uuid::new_v4(),
        Uuid::new_v4(),
    );
    let now = chrono::Utc::now().timestamp_millis();
    let due = now - 60_000;
    for sql in [
        format!(
            "INSERT INTO brands (id, name, settings, created_at, updated_at) \
             VALUES ('{brand}', 'sql brand', '{{}}', {now}, {now})"
        ),
        format!(
            "INSERT INTO branches (id, brand_id, name, timezone, is_active, created_at, updated_at) \
             VALUES ('{branch}', '{brand}', 'sql branch', 'America/New_York', {branch_is_active}, {now}, {now})"
        ),
        format!(
            "INSERT INTO rules (id, brand_id, name, status, cron_expression, settings, created_at, updated_at) \
             VALUES ('{rule}', '{brand}', 'sql rule', 'active', '*/5 * * * *', '{{}}', {now}, {now})"
        ),
        format!(
            "INSERT INTO branch_rules (id, branch_id, rule_id, is_active, is_archived, is_force_stopped, \
             is_currently_running, next_run_time, lock_epoch, params, created_at, updated_at) \
             VALUES ('{branch_rule}', '{branch}', '{rule}', TRUE, FALSE, FALSE, FALSE, {due}, 0, '{{}}', {now}, {now})"
        ),
    ] {
        store.execute_sql(&sql).await.unwrap();
    }
    (branch, branch_rule)
}

async fn wait_until_ready(service: &Service, id: Uuid, expected: bool, what: &str) {
    eventually(DEADLINE, what, || async {
        ready_ids(service).await.contains(&id) == expected
    })
    .await;
}

/// A service with one due branch rule, inserted with SQL and seen ready.
/// Returns the service, the branch id and the branch rule id.
async fn service_with_a_ready_rule(db: &TestDb) -> (RunningService, Uuid, Uuid) {
    let running = start_service(&db.url).await;
    let (branch, id) = insert_due_rule(&running.service, true).await;
    wait_until_ready(
        &running.service,
        id,
        true,
        "the inserted branch rule is ready",
    )
    .await;
    (running, branch, id)
}

/// Runs `sql` as an operator would and waits until `id` is no longer ready.
async fn after_sql_not_ready(service: &Service, sql: &str, id: Uuid, what: &str) {
    service.store().execute_sql(sql).await.unwrap();
    wait_until_ready(service, id, false, what).await;
}

both_backends!(
    a_rule_inserted_with_sql_becomes_ready,
    |db: TestDb| async move {
        let (running, _, _) = service_with_a_ready_rule(&db).await;
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    a_rule_deleted_in_sql_stops_being_ready,
    |db: TestDb| async move {
        let (running, _, id) = service_with_a_ready_rule(&db).await;
        after_sql_not_ready(
            &running.service,
            &format!("DELETE FROM branch_rules WHERE id = '{id}'"),
            id,
            "the deleted branch rule is no longer ready",
        )
        .await;
        running.service.shutdown("test").await.unwrap();
    }
);

// The fetch that finds a rule held back by its branch sets it aside, out
// of every later walk; the refresh that reads the branch switched on again
// brings it back, still due, and ready.
both_backends!(
    a_deactivated_branch_stops_its_rules_until_it_is_switched_on,
    |db: TestDb| async move {
        let (running, branch, id) = service_with_a_ready_rule(&db).await;
        let service = &running.service;
        after_sql_not_ready(
            service,
            &format!("UPDATE branches SET is_active = FALSE WHERE id = '{branch}'"),
            id,
            "rules of an inactive branch are not ready",
        )
        .await;
        service
            .store()
            .execute_sql(&format!(
                "UPDATE branches SET is_active = TRUE WHERE id = '{branch}'"
            ))
            .await
            .unwrap();
        wait_until_ready(service, id, true, "the branch switched on: ready again").await;
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    the_plan_file_is_written_and_reloaded,
    |db: TestDb| async move {
        let (running, _, id) = service_with_a_ready_rule(&db).await;
        let plan_file = running.service.config().plan_file.clone();
        eventually(DEADLINE, "the plan file holds the branch rule", || async {
            ruled::persist::read_plan_file(&plan_file)
                .ok()
                .flatten()
                .is_some_and(|s| s.workflows.iter().any(|w| w.id() == id))
        })
        .await;
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    a_rule_updated_in_sql_without_touching_updated_at_is_seen,
    |db: TestDb| async move {
        let (running, _, id) = service_with_a_ready_rule(&db).await;
        let service = &running.service;
        // Incremental refreshes read rows by updated_at; the database's trigger
        // bumps it even when the statement does not.
        let sql = format!("UPDATE branch_rules SET is_active = FALSE WHERE id = '{id}'");
        let what = "the deactivated branch rule is no longer ready";
        after_sql_not_ready(service, &sql, id, what).await;
        let refresher = service.directory().refresher().unwrap();
        let stats = ask(&refresher, ruled::messages::RefresherMsg::Stats)
            .await
            .unwrap();
        assert!(stats.refreshes_ok >= 2, "{stats:?}");
        assert_eq!(stats.refreshes_failed, 0, "{stats:?}");
        running.service.shutdown("test").await.unwrap();
    }
);

// A rule due on a switched-off branch is set aside by the fetch that finds
// it. Switching the branch on changes no branch rule row, yet the refresh
// that reads it wakes the master, which runs the rule at once rather than
// at its next tick (MASTER_FETCH_INTERVAL_SECONDS, a minute here).
both_backends!(
    a_branch_switched_on_runs_its_due_rules_at_once,
    |db: TestDb| async move {
        // The whole of `db`, not only its url, lives to the end.
        let db = db;
        let running = start_service_with(&db.url, without_delays).await;
        let service = &running.service;
        assert_eq!(
            service.config().master_fetch_interval,
            Duration::from_secs(60)
        );
        let (branch, id) = insert_due_rule(service, false).await;
        eventually(DEADLINE, "the rule is in the plan", || async {
            let plan = service.directory().plan().unwrap();
            ask(&plan, PlanMsg::Stats)
                .await
                .is_ok_and(|stats| stats.workflows == 1)
        })
        .await;
        // The plan's own fetch sets it aside.
        wait_until_ready(service, id, false, "not ready on a switched-off branch").await;
        let store = service.store();
        store
            .execute_sql(&format!(
                "UPDATE branches SET is_active = TRUE WHERE id = '{branch}'"
            ))
            .await
            .unwrap();
        wait_for_execution(store, id, ExecutionStatus::Completed, DEADLINE).await;
        running.service.shutdown("test").await.unwrap();
    }
);
