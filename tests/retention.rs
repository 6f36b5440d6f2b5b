//! Execution history retention on real SQLite and PostgreSQL: finished
//! executions older than EXECUTION_RETENTION_DAYS go in small batches,
//! open ones and recent ones stay; `ruled prune --dry-run` says what would
//! go and deletes nothing; the running service's pruner does it on its own,
//! and its /metrics show it.

mod common;

use std::time::Duration;

use common::api::{Api, metric_sample};
use common::process::{Install, signal, stderr, stdout, wait_exit};
use common::rules::{YEARLY, insert_many_rules, step};
use common::service::start_service_with;
use common::{TestDb, eventually, execution_count};
use ruled::actors::ask;
use ruled::config::Config;
use ruled::messages::PrunerMsg;
use ruled::model::Millis;
use ruled::store::Store;
use serde_json::json;
use uuid::Uuid;

const DAY: Millis = 86_400_000;
const DEADLINE: Duration = Duration::from_secs(30);

fn now_ms() -> Millis {
    chrono::Utc::now().timestamp_millis()
}

/// The history the tests prune: per status, `old` rows requested 40 days
/// ago and 2 rows requested yesterday, for one branch rule.
struct History {
    old_finished: i64,
    kept: i64,
}

async fn write_history(store: &Store, old: i64) -> History {
    let rule = insert_many_rules(
        store,
        1,
        YEARLY,
        now_ms() + DAY,
        &step("noop", json!({})),
        None,
    )
    .await[0];
    let now = now_ms();
    let mut values = Vec::new();
    let mut n = 0;
    let mut row = |status: &str, requested_at: Millis, finished: bool| {
        n += 1;
        let finished_at = if finished {
            (requested_at + 1_000).to_string()
        } else {
            "NULL".to_string()
        };
        values.push(format!(
            "('{}', '{rule}', {n}, '{status}', 1, 'test', 1, {requested_at}, {finished_at})",
            Uuid::new_v4()
        ));
    };
    let statuses = ["completed", "failed", "cancelled", "timed_out", "skipped"];
    for status in statuses {
        for i in 0..old {
            row(status, now - 40 * DAY - i, true);
        }
        for i in 0..2 {
            row(status, now - DAY - i, true);
        }
    }
    // Open executions are recovery's, however old.
    for status in ["requested", "scheduled", "running"] {
        row(status, now - 90 * DAY, false);
    }
    store
        .execute_sql(&format!(
            "INSERT INTO executions (id, branch_rule_id, scheduled_for, status, attempt, owner, \
             lock_epoch, requested_at, finished_at) VALUES {}",
            values.join(", ")
        ))
        .await
        .unwrap();
    History {
        old_finished: old * statuses.len() as i64,
        kept: 2 * statuses.len() as i64 + 3,
    }
}

async fn prunes_old_finished_history_in_batches(db: TestDb) {
    let store = db.store().await;
    let history = write_history(&store, 7).await;
    let cutoff = now_ms() - 30 * DAY;

    let summary = store.prunable_executions(cutoff).await.unwrap();
    assert_eq!(summary.total(), history.old_finished);
    for (status, count) in &summary.by_status {
        assert_eq!(*count, 7, "{status:?}");
    }
    assert!(summary.oldest.unwrap() < summary.newest.unwrap());
    assert!(summary.newest.unwrap() < cutoff);
    assert_eq!(
        execution_count(&store).await,
        history.old_finished + history.kept
    );

    // Batches of 4: as many statements as it takes, none larger.
    let mut batches = Vec::new();
    loop {
        let deleted = store.prune_executions(cutoff, 4).await.unwrap();
        batches.push(deleted);
        if deleted < 4 {
            break;
        }
    }
    assert!(batches.iter().all(|&n| n <= 4), "{batches:?}");
    assert_eq!(batches.iter().sum::<u64>() as i64, history.old_finished);
    assert_eq!(execution_count(&store).await, history.kept);
    let counts = store.count_executions_by_status().await.unwrap();
    for (status, count) in counts {
        let expected = if status.is_terminal() { 2 } else { 1 };
        assert_eq!(count, expected, "{status:?} kept");
    }
    let oldest = store.oldest_execution().await.unwrap().unwrap();
    assert!(
        oldest < now_ms() - 80 * DAY,
        "the open rows stay the oldest"
    );
    assert_eq!(store.prunable_executions(cutoff).await.unwrap().total(), 0);
    store.close().await;
}

#[tokio::test]
async fn sqlite_prunes_old_finished_history_in_batches() {
    prunes_old_finished_history_in_batches(common::sqlite_db().await).await;
}

#[tokio::test]
async fn postgres_prunes_old_finished_history_in_batches() {
    let Some(db) = common::postgres_db().await else {
        return;
    };
    prunes_old_finished_history_in_batches(db).await;
}

// An occurrence still waiting for its retry keeps its failed attempts,
// however old: the retry numbers itself after them.
both_backends!(
    the_attempts_of_an_occurrence_with_a_retry_pending_are_kept,
    |db: TestDb| async move {
        let store = db.store().await;
        let history = write_history(&store, 3).await;
        store
            .execute_sql(
                "UPDATE branch_rules SET retry_of = (SELECT scheduled_for FROM executions \
                 WHERE status = 'failed' ORDER BY requested_at LIMIT 1)",
            )
            .await
            .unwrap();
        let cutoff = now_ms() - 30 * DAY;
        let summary = store.prunable_executions(cutoff).await.unwrap();
        assert_eq!(summary.total(), history.old_finished - 1);
        while store.prune_executions(cutoff, 100).await.unwrap() > 0 {}
        assert_eq!(execution_count(&store).await, history.kept + 1);
        store.close().await;
    }
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_pruners_side_by_side_delete_each_row_once() {
    let Some(db) = common::postgres_db().await else {
        return;
    };
    let store = db.store().await;
    let history = write_history(&store, 400).await;
    let cutoff = now_ms() - 30 * DAY;
    let pruner = |store: Store| async move {
        let mut deleted = 0;
        loop {
            let n = store.prune_executions(cutoff, 50).await.unwrap();
            deleted += n;
            if n < 50 {
                return deleted;
            }
        }
    };
    let (a, b, c) = tokio::join!(
        tokio::spawn(pruner(db.store().await)),
        tokio::spawn(pruner(db.store().await)),
        tokio::spawn(pruner(db.store().await)),
    );
    let deleted = a.unwrap() + b.unwrap() + c.unwrap();
    // SKIP LOCKED may leave a few rows for the next round: never double counted.
    assert!(deleted as i64 <= history.old_finished);
    let rest = pruner(store.clone()).await;
    assert_eq!((deleted + rest) as i64, history.old_finished);
    assert_eq!(execution_count(&store).await, history.kept);
    store.close().await;
}

both_backends!(
    ruled_prune_dry_run_says_what_would_go_then_prune_deletes_it,
    |db: TestDb| async move {
        let install = Install::with_database(&db.url);
        if db.sqlite_dir().is_some() {
            // A dry run writes nothing, not even a new database where none is.
            let nowhere = install.run(&["prune", "--dry-run"]);
            assert!(!nowhere.status.success(), "{nowhere:?}");
            assert!(
                stderr(&nowhere).contains("no database file at"),
                "{nowhere:?}"
            );
            assert!(!db.sqlite_dir().unwrap().join("ruled.db").exists());
        }
        let migrate = install.run(&["migrate"]);
        assert!(migrate.status.success(), "{migrate:?}");
        let store = db.store().await;
        let history = write_history(&store, 3).await;

        let dry = install.run(&["prune", "--dry-run"]);
        assert!(dry.status.success(), "{dry:?}");
        let text = stdout(&dry);
        assert!(text.contains("retention: 30 day(s)"), "{text}");
        assert!(
            text.contains(&format!("would prune {} finished", history.old_finished)),
            "{text}"
        );
        assert!(text.contains("  timed_out: 3"), "{text}");
        assert!(text.contains("dry run: nothing deleted"), "{text}");
        let before = execution_count(&store).await;
        assert_eq!(before, history.old_finished + history.kept);

        let pruned = install.run(&["prune"]);
        assert!(pruned.status.success(), "{pruned:?}");
        let text = stdout(&pruned);
        assert!(
            text.contains(&format!("deleted {} execution(s)", history.old_finished)),
            "{text}"
        );
        assert_eq!(execution_count(&store).await, history.kept);

        let forever = install
            .command(&["prune"])
            .env("EXECUTION_RETENTION_DAYS", "0")
            .output()
            .unwrap();
        assert!(stdout(&forever).contains("kept forever"), "{forever:?}");
        let bad = install
            .command(&["prune"])
            .env("EXECUTION_RETENTION_DAYS", "a month")
            .output()
            .unwrap();
        assert!(!bad.status.success());
        assert!(stderr(&bad).contains("EXECUTION_RETENTION_DAYS"), "{bad:?}");
        store.close().await;
    }
);

// `ruled serve` prunes on its own, and says so where operators look: its
// /metrics, scraped over HTTP, count the rows pruned and show the oldest
// execution kept.
both_backends!(
    ruled_serve_shows_its_pruning_in_its_metrics,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let store = db.store().await;
        let history = write_history(&store, 4).await;
        let install = Install::with_database(&db.url);
        let mut child = install.serve("serve.log");
        let api = Api::at(install.listening_addr("serve.log"), None);
        // The first prune comes ten seconds after start.
        let deadline = std::time::Instant::now() + DEADLINE;
        loop {
            let metrics = api.get("/metrics").await.text;
            let pruned = metric_sample(&metrics, "ruled_executions_pruned_total", &[]);
            let oldest_kept = metric_sample(
                &metrics,
                "ruled_executions_oldest_kept_timestamp_seconds",
                &[],
            );
            let oldest = store.oldest_execution().await.unwrap().unwrap() as f64 / 1000.0;
            let done = pruned.is_some_and(|n| n >= history.old_finished as f64)
                && oldest_kept.is_some_and(|kept| (kept - oldest).abs() < 0.001);
            if done {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "pruned {pruned:?} of {}, oldest kept {oldest_kept:?} (the oldest row: {oldest}):\n{}",
                history.old_finished,
                install.log("serve.log")
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(
            install.log("serve.log").contains("🧹 Pruned"),
            "{}",
            install.log("serve.log")
        );
        assert_eq!(
            store
                .prunable_executions(now_ms() - 30 * DAY)
                .await
                .unwrap()
                .total(),
            0
        );
        signal(&child, libc::SIGTERM);
        assert!(wait_exit(&mut child).success());
        store.close().await;
    }
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_prunes_on_its_own_and_keeps_the_rest() {
    let db = common::sqlite_db().await;
    let store = db.store().await;
    let history = write_history(&store, 25).await;
    let running = start_service_with(&db.url, |config| Config {
        prune_interval: Duration::from_millis(200),
        prune_batch: 10,
        ..config
    })
    .await;
    let pruner = running.service.directory().pruner().unwrap();
    let cutoff = now_ms() - 30 * DAY;
    eventually(DEADLINE, "the pruner has pruned", || async {
        store.prunable_executions(cutoff).await.unwrap().total() == 0
            && ask(&pruner, PrunerMsg::Stats)
                .await
                .is_ok_and(|stats| stats.prunes_done >= 1)
    })
    .await;
    let stats = ask(&pruner, PrunerMsg::Stats).await.unwrap();
    // The open rows belong to no live instance: recovery may finish them,
    // and then they are old finished history too.
    assert!(stats.pruned as i64 >= history.old_finished, "{stats:?}");
    assert!(stats.oldest_kept.is_some());
    let recent = store
        .list_executions(&ruled::store::ExecutionFilter {
            from: Some(now_ms() - 2 * DAY),
            limit: 100,
            ..ruled::store::ExecutionFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(
        recent.len() as i64,
        history.kept - 3,
        "yesterday's runs stay"
    );
    running.service.shutdown("test").await.unwrap();
    store.close().await;
}

/// The oldest-kept gauge is there from the start, before any prune, and
/// with EXECUTION_RETENTION_DAYS=0, when no prune ever runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oldest_kept_is_read_at_start_even_when_history_is_kept_forever() {
    let db = common::sqlite_db().await;
    let store = db.store().await;
    write_history(&store, 2).await;
    let oldest = store.oldest_execution().await.unwrap();
    assert!(oldest.is_some());
    let running = start_service_with(&db.url, |config| Config {
        execution_retention_days: 0,
        ..config
    })
    .await;
    let pruner = running.service.directory().pruner().unwrap();
    eventually(
        DEADLINE,
        "the pruner has read the oldest execution",
        || async {
            ask(&pruner, PrunerMsg::Stats)
                .await
                .is_ok_and(|stats| stats.oldest_kept == oldest)
        },
    )
    .await;
    let stats = ask(&pruner, PrunerMsg::Stats).await.unwrap();
    assert_eq!((stats.prunes_done, stats.pruned), (0, 0), "{stats:?}");
    running.service.shutdown("test").await.unwrap();
    store.close().await;
}
