//! Issue 4: a database outage while rules fall due. PostgreSQL is taken
//! away for 60 s (its connections terminated and the database renamed, so
//! every reconnect fails); SQLite is locked by another connection for 30 s.
//! Throughout, the service keeps its plan, dispatches nothing (claims fail
//! closed) and nothing panics; once the database is back, every occurrence
//! that fell due runs exactly once.

mod common;

use std::time::{Duration, Instant};

use common::rules::{YEARLY, insert_rule, step};
use common::service::{RunningService, start_service_with, without_delays};
use common::{TestDb, eventually, wait_for_execution};
use ruled::actors::ask;
use ruled::messages::{LeaseMsg, MasterMsg, PlanMsg};
use ruled::model::ExecutionStatus;
use ruled::store::Backend;
use serde_json::json;
use uuid::Uuid;

const DEADLINE: Duration = Duration::from_secs(60);
const RULES: usize = 4;

fn outage_length(db: &TestDb) -> Duration {
    if db.url.starts_with("sqlite") {
        Duration::from_secs(30)
    } else {
        Duration::from_secs(60)
    }
}

both_backends!(
    every_occurrence_due_during_an_outage_runs_once_after_it,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let running = start_service_with(&db.url, without_delays).await;
        let service = &running.service;
        let store = service.store();
        let due = chrono::Utc::now().timestamp_millis() + 2_000;
        let mut ids: Vec<Uuid> = Vec::new();
        for _ in 0..RULES {
            ids.push(insert_rule(store, YEARLY, due, &[step("noop", json!({}))]).await);
        }
        let plan = service.directory().plan().unwrap();
        eventually(DEADLINE, "the rules are in the plan", || async {
            ask(&plan, PlanMsg::Snapshot).await.is_ok_and(|snapshot| {
                ids.iter()
                    .all(|id| snapshot.workflows.iter().any(|w| w.id() == *id))
            })
        })
        .await;

        let outage = db.outage().await;
        let master = service.directory().master().unwrap();
        let started = Instant::now();
        while started.elapsed() < outage_length(&db) {
            // Due and ready in the kept plan, yet nothing is dispatched
            // without a claim.
            let stats = ask(&master, MasterMsg::Stats).await.unwrap();
            assert_eq!(
                (stats.queue_size, stats.active_jobs),
                (0, 0),
                "dispatched during the outage: {stats:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let snapshot = ask(&plan, PlanMsg::Snapshot).await.unwrap();
        assert!(
            ids.iter()
                .all(|id| snapshot.workflows.iter().any(|w| w.id() == *id)),
            "the plan was kept through the outage"
        );
        outage.restore().await;

        eventually(DEADLINE, "every occurrence ran", || async {
            let mut completed = 0;
            for &id in &ids {
                let Ok(runs) = store.executions_for(id).await else {
                    return false;
                };
                completed += runs
                    .iter()
                    .filter(|e| e.status == ExecutionStatus::Completed)
                    .count();
            }
            completed == RULES
        })
        .await;
        for &id in &ids {
            let runs = store.executions_for(id).await.unwrap();
            assert_eq!(runs.len(), 1, "exactly once: {runs:?}");
        }
        let stats = service.supervisor_stats().await.unwrap();
        assert!(
            stats.restarts.values().all(|&n| n == 0) && stats.alive.values().all(|&a| a),
            "no actor failed: {stats:?}"
        );
        running.service.shutdown("test").await.unwrap();
    }
);

/// A single instance on PostgreSQL whose database goes away for longer
/// than its lease TTL fences itself: its running job is stopped, unwritten.
/// No peer will ever take over a live instance, so when the database is
/// back the instance recovers what its fence stopped before it claims
/// again: the stopped attempt is recorded `worker_lost` and the occurrence
/// runs again, rather than staying locked and marked running for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_stopped_by_a_self_fence_runs_again_when_the_database_is_back() {
    let Some(db) = common::postgres_db().await else {
        return;
    };
    let running = start_service_with(&db.url, |config| ruled::config::Config {
        partition_lease_ttl: Duration::from_secs(3),
        partition_lease_retry: Duration::from_millis(500),
        recently_processed: Duration::ZERO,
        ..without_delays(config)
    })
    .await;
    let service = &running.service;
    let store = service.store();
    let now = chrono::Utc::now().timestamp_millis();
    let id = insert_rule(store, YEARLY, now, &[step("sleep", json!({"ms": 4_000}))]).await;
    wait_for_execution(store, id, ExecutionStatus::Running, DEADLINE).await;

    let outage = db.outage().await;
    let lease = service.directory().lease().unwrap();
    eventually(DEADLINE, "the instance fenced itself", || async {
        ask(&lease, LeaseMsg::Status)
            .await
            .is_ok_and(|status| status.fenced)
    })
    .await;
    outage.restore().await;

    // The occurrence ran again and completed.
    wait_for_execution(store, id, ExecutionStatus::Completed, DEADLINE).await;
    let runs = store.executions_for(id).await.unwrap();
    assert_eq!(runs.len(), 2, "{runs:?}");
    let stopped = runs
        .iter()
        .find(|e| e.status == ExecutionStatus::Failed)
        .unwrap_or_else(|| panic!("the fenced attempt is recorded: {runs:?}"));
    assert_eq!(
        stopped.error.as_deref(),
        Some(ruled::store::WORKER_LOST),
        "{runs:?}"
    );
    let status = ask(&lease, LeaseMsg::Status).await.unwrap();
    assert!(!status.fenced, "{status:?}");
    running.service.shutdown("test").await.unwrap();
}

// The database refuses the lock renewals of a running job while it still
// takes everything else (heartbeats, claims, finishes): here a trigger.
/// A trigger that fails every renewal of a claimed rule's lock (an update
/// by the same holder that moves only its lock time), as a database that
/// takes reads and claims but not that write would.
async fn refuse_renewals(store: &ruled::store::Store, backend: Backend) {
    let refusal = match backend {
        Backend::Sqlite => vec![
            "CREATE TRIGGER refuse_renewals BEFORE UPDATE ON branch_rules \
             WHEN NEW.lock_holder = OLD.lock_holder AND NEW.is_currently_running \
             AND NEW.lock_time <> OLD.lock_time \
             BEGIN SELECT RAISE(ABORT, 'renewal refused by the test'); END",
        ],
        Backend::Postgres => vec![
            "CREATE FUNCTION refuse_renewals() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'renewal refused by the test'; END $$",
            "CREATE TRIGGER refuse_renewals BEFORE UPDATE ON branch_rules FOR EACH ROW \
             WHEN (NEW.lock_holder = OLD.lock_holder AND NEW.is_currently_running \
             AND NEW.lock_time <> OLD.lock_time) EXECUTE FUNCTION refuse_renewals()",
        ],
    };
    for statement in refusal {
        store.execute_sql(statement).await.unwrap();
    }
}

/// A service whose locks are renewed every second and stale after three
/// (with `worker_count` workers, or the default), on a database that
/// refuses every renewal ([`refuse_renewals`]).
async fn service_refusing_renewals(db: &TestDb, worker_count: Option<usize>) -> RunningService {
    let running = start_service_with(&db.url, |config| ruled::config::Config {
        schedule_lock_timeout: Duration::from_secs(3),
        worker_count: worker_count.unwrap_or(config.worker_count),
        ..without_delays(config)
    })
    .await;
    refuse_renewals(running.service.store(), db.backend).await;
    running
}

async fn allow_renewals(store: &ruled::store::Store, backend: Backend) {
    let drop = match backend {
        Backend::Sqlite => "DROP TRIGGER refuse_renewals",
        Backend::Postgres => "DROP TRIGGER refuse_renewals ON branch_rules",
    };
    store.execute_sql(drop).await.unwrap();
}

// Left running, the job's lock would turn stale under it, and a peer
// could take it over and run the occurrence beside it. The job stops
// two missed renewals in, its finish is recorded and names why, and the
// occurrence runs again once renewals land.
both_backends!(
    a_job_whose_lock_cannot_be_renewed_stops_before_the_lock_turns_stale,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        const ACTION_MS: i64 = 8_000;
        // The whole of `db`, not only the fields used, lives to the end.
        let db = db;
        let running = service_refusing_renewals(&db, None).await;
        let store = running.service.store();
        let due = chrono::Utc::now().timestamp_millis();
        let id = insert_rule(
            store,
            YEARLY,
            due,
            &[step("sleep", json!({"ms": ACTION_MS}))],
        )
        .await;

        wait_for_execution(store, id, ExecutionStatus::Cancelled, DEADLINE).await;
        allow_renewals(store, db.backend).await;
        let stopped = store.executions_for(id).await.unwrap().remove(0);
        assert_eq!((stopped.attempt, stopped.scheduled_for), (1, due));
        let error = stopped.error.clone().unwrap_or_default();
        assert!(
            error.contains("SCHEDULE_LOCK_TIMEOUT_SECONDS") && error.contains("runs again"),
            "{stopped:?}"
        );
        let ran_for = stopped.finished_at.unwrap() - stopped.started_at.unwrap();
        assert!(
            ran_for < ACTION_MS,
            "stopped part-way, not after {ran_for} ms"
        );

        // Once renewals land again, the occurrence runs to its end.
        wait_for_execution(store, id, ExecutionStatus::Completed, DEADLINE).await;
        let runs = store.executions_for(id).await.unwrap();
        let completed = runs
            .iter()
            .find(|run| run.status == ExecutionStatus::Completed)
            .unwrap();
        assert_eq!(completed.scheduled_for, due);
        assert!(completed.attempt > 1, "{completed:?}");
        assert!(
            runs.iter().all(|run| run.id == completed.id
                || (run.status == ExecutionStatus::Cancelled && run.scheduled_for == due)),
            "{runs:?}"
        );
        running.service.shutdown("test").await.unwrap();
    }
);

// One worker and two rules: while the first job runs, the second's claim
// waits in the queue, and the database refuses its renewals as well. By the
// time the worker is free that lock is close to stale, so the job is not
// started on it: the worker renews first, and when that fails too the job
// is given back unstarted (no Running write, no action), Cancelled with
// the occurrence left to run again. Once renewals land, both run.
both_backends!(
    a_queued_claim_whose_lock_cannot_be_renewed_is_given_back_unstarted,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        const ACTION_MS: i64 = 8_000;
        let db = db;
        let running = service_refusing_renewals(&db, Some(1)).await;
        let store = running.service.store();
        let due = chrono::Utc::now().timestamp_millis();
        let steps = [step("sleep", json!({"ms": ACTION_MS}))];
        let ids = [
            insert_rule(store, YEARLY, due, &steps).await,
            insert_rule(store, YEARLY, due, &steps).await,
        ];

        let given_back_unstarted = || async move {
            for id in ids {
                let runs = store.executions_for(id).await.unwrap_or_default();
                let unstarted = runs.into_iter().find(|run| {
                    run.status == ExecutionStatus::Cancelled && run.started_at.is_none()
                });
                if unstarted.is_some() {
                    return unstarted;
                }
            }
            None
        };
        eventually(DEADLINE, "a queued claim given back unstarted", || async {
            given_back_unstarted().await.is_some()
        })
        .await;
        let given_back = given_back_unstarted().await.unwrap();
        allow_renewals(store, db.backend).await;
        assert_eq!(given_back.scheduled_for, due, "{given_back:?}");
        let error = given_back.error.clone().unwrap_or_default();
        assert!(
            error.contains("before it started") && error.contains("LockExpiring"),
            "{given_back:?}"
        );

        for id in ids {
            wait_for_execution(store, id, ExecutionStatus::Completed, DEADLINE).await;
            let runs = store.executions_for(id).await.unwrap();
            let completed: Vec<_> = runs
                .iter()
                .filter(|run| run.status == ExecutionStatus::Completed)
                .collect();
            assert_eq!(completed.len(), 1, "{runs:?}");
            assert_eq!(completed[0].scheduled_for, due);
        }
        running.service.shutdown("test").await.unwrap();
    }
);
