//! The plan file as a snapshot and a journal, through the real service:
//! finished jobs cost the journal a few hundred bytes each instead of a
//! whole plan, and what the journal holds is there after a crash.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::rules::{YEARLY, insert_many_rules, step};
use common::service::{start_service_with, without_delays};
use common::{TestDb, eventually};
use ruled::actors::ask;
use ruled::messages::WriterMsg;
use ruled::model::{ExecutionStatus, Millis};
use ruled::persist::{journal_path, read_plan_file};
use serde_json::json;
use uuid::Uuid;

const DEADLINE: Duration = Duration::from_secs(30);
const RULES: usize = 40;
/// The budget for what a finished job may cost the plan file.
const BYTES_PER_JOB: u64 = 4_096;

fn now_ms() -> Millis {
    chrono::Utc::now().timestamp_millis()
}

/// Each rule's next run as the database has it.
async fn next_runs_in_database(db: &TestDb, ids: &[Uuid]) -> HashMap<Uuid, Option<Millis>> {
    let store = db.store().await;
    let data = store.load_plan_data(10_000).await.unwrap();
    store.close().await;
    data.branch_rules
        .into_iter()
        .filter(|row| ids.contains(&row.id))
        .map(|row| (row.id, row.next_run_time))
        .collect()
}

async fn journal_keeps_every_finished_job(db: TestDb) {
    let running = start_service_with(&db.url, |config| {
        without_delays(ruled::config::Config {
            worker_count: 4,
            ..config
        })
    })
    .await;
    let plan_file = running.dir.path().join("plan.json");
    let store = db.store().await;
    // The service has written its first snapshot of the empty plan, or
    // will; the rules come after, so their runs are journal writes.
    let noop = step("noop", json!({}));
    let ids = insert_many_rules(&store, RULES, YEARLY, now_ms() - 1_000, &noop, None).await;
    eventually(DEADLINE, "every rule ran", || async {
        let counts = store.count_executions_by_status().await.unwrap();
        counts
            .iter()
            .any(|(status, n)| *status == ExecutionStatus::Completed && *n == RULES as i64)
    })
    .await;
    let expected = next_runs_in_database(&db, &ids).await;
    assert!(expected.values().all(|at| at.unwrap() > now_ms()));

    // The plan file catches up: every rule's next run is the database's.
    eventually(DEADLINE, "the plan file holds every run", || async {
        read_plan_file(&plan_file).unwrap().is_some_and(|snapshot| {
            let on_disk: HashMap<Uuid, Option<Millis>> = snapshot
                .workflows
                .iter()
                .map(|w| (w.id(), w.branch_rule.next_run_time))
                .collect();
            ids.iter().all(|id| on_disk.get(id) == expected.get(id))
        })
    })
    .await;
    let writer = running.service.directory().writer().unwrap();
    let stats = ask(&writer, WriterMsg::Stats).await.unwrap();
    assert!(stats.appends_ok > 0, "{stats:?}");
    let journal_bytes = std::fs::metadata(journal_path(&plan_file))
        .map(|m| m.len())
        .unwrap_or(0);
    let snapshot_bytes = std::fs::metadata(&plan_file).unwrap().len();
    // Snapshots are taken when the catalog changes (the rules' brand and
    // branch arrive with them) and by compaction; the journal holds the
    // rest, and stays within the budget per job.
    assert!(
        journal_bytes <= BYTES_PER_JOB * RULES as u64,
        "{journal_bytes} B of journal for {RULES} jobs (snapshot {snapshot_bytes} B, {stats:?})"
    );

    // A crash: no graceful snapshot. The file and its journal hold it all.
    let dir = running.dir;
    running.service.abort().await;
    let snapshot = read_plan_file(&dir.path().join("plan.json"))
        .unwrap()
        .unwrap();
    for id in &ids {
        let workflow = snapshot.workflows.iter().find(|w| w.id() == *id).unwrap();
        assert_eq!(
            workflow.branch_rule.next_run_time, expected[id],
            "{id} after the crash"
        );
    }
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_journal_keeps_every_finished_job() {
    journal_keeps_every_finished_job(common::sqlite_db().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_journal_keeps_every_finished_job() {
    let Some(db) = common::postgres_db().await else {
        return;
    };
    journal_keeps_every_finished_job(db).await;
}
