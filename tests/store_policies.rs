//! Scheduling policies in the store (issue 13), on both backends: the
//! migration and the `skipped` status, the `policy` columns and their
//! quarantine, pending retries through claim and finish, skipped
//! occurrences recorded by a finish or by the master's misfire decision.

mod common;

use common::TestDb;
use ruled::model::{
    Branch, BranchRule, Brand, Execution, ExecutionStatus, Millis, RejectReason, Rule, RuleStatus,
};
use ruled::schedule::{Policy, SkipReason};
use ruled::store::rows::{BRANCH_RULES, RULES};
use ruled::store::{
    Claim, ClaimRequest, ExecutionFilter, Fence, Finish, RetryUpdate, SkipRequest,
    SkippedOccurrence, Store, StoreError, TransitionBatcher,
};
use serde_json::json;
use sqlx::AssertSqlSafe;
use uuid::Uuid;

const T0: Millis = 1_795_000_000_000;
const TIMEOUT: Millis = 300_000;
const HOLDER: &str = "host-a";
const OTHER: &str = "host-b";
const HOUR: Millis = 3_600_000;

// ---- fixtures ----------------------------------------------------------------

fn id(n: u32) -> Uuid {
    Uuid::parse_str(&format!("00000000-0000-4000-8000-{n:012}")).unwrap()
}

fn policy(value: serde_json::Value) -> Policy {
    serde_json::from_value(value).unwrap()
}

fn rule_row(n: u32, policy: Option<Policy>) -> Rule {
    Rule {
        id: id(n),
        brand_id: None,
        name: format!("rule {n}"),
        status: RuleStatus::Active,
        cron_expression: "0 * * * *".into(),
        settings: json!({}),
        policy,
        created_at: T0,
        updated_at: T0,
    }
}

/// The brand, branch and rule 3 every branch rule hangs off.
async fn seed(store: &Store) {
    store
        .insert_brand(&Brand {
            id: id(1),
            name: "Acme".into(),
            settings: json!({}),
            created_at: T0,
            updated_at: T0,
        })
        .await
        .unwrap();
    store
        .insert_branch(&Branch {
            id: id(2),
            brand_id: id(1),
            name: "Riyadh".into(),
            timezone: None,
            is_active: true,
            created_at: T0,
            updated_at: T0,
        })
        .await
        .unwrap();
    store.insert_rule(&rule_row(3, None)).await.unwrap();
}

/// An active, unlocked branch rule `n` of rule 3, due at `next_run_time`.
fn branch_rule(n: u32, next_run_time: Option<Millis>) -> BranchRule {
    BranchRule {
        id: id(n),
        branch_id: id(2),
        rule_id: id(3),
        brand_rule_id: None,
        is_active: true,
        is_archived: false,
        is_force_stopped: false,
        is_currently_running: false,
        operation_time_from: None,
        operation_time_to: None,
        next_run_time,
        last_run_time: None,
        lock_holder: None,
        lock_time: None,
        lock_epoch: 0,
        params: json!({}),
        policy: None,
        retry_of: None,
        failed_attempts: 0,
        created_at: T0 - 1000,
        updated_at: T0 - 1000,
    }
}

async fn store_with_rules(db: &TestDb, ns: impl IntoIterator<Item = u32>) -> Store {
    let store = db.store().await;
    seed(&store).await;
    for n in ns {
        store
            .insert_branch_rule(&branch_rule(n, Some(T0)))
            .await
            .unwrap();
    }
    store
}

fn request(n: u32, holder: &str, now: Millis) -> ClaimRequest {
    ClaimRequest {
        branch_rule_id: id(n),
        holder: holder.into(),
        now,
        lock_timeout_ms: TIMEOUT,
        execution_id: Uuid::new_v4(),
        run_now: false,
        due_by: None,
    }
}

async fn claim(store: &Store, n: u32, holder: &str, now: Millis) -> Claim {
    store
        .claim(&request(n, holder, now))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{holder} could not claim branch rule {n} at {now}"))
}

async fn rule(store: &Store, n: u32) -> BranchRule {
    store
        .load_plan_data(0)
        .await
        .unwrap()
        .branch_rules
        .into_iter()
        .find(|r| r.id == id(n))
        .unwrap_or_else(|| panic!("branch rule {n} is missing"))
}

fn finish(status: ExecutionStatus, at: Millis, next: Option<Millis>) -> Finish {
    Finish {
        status,
        finished_at: at,
        error: None,
        output: None,
        next_run_time: next,
        advance_last_run: true,
        retry: RetryUpdate::Keep,
        skipped: Vec::new(),
        clear_next_run: false,
    }
}

fn skip(scheduled_for: Millis, reason: SkipReason, detail: &str) -> SkippedOccurrence {
    SkippedOccurrence {
        scheduled_for,
        reason,
        detail: detail.into(),
    }
}

fn skipped_of(executions: &[Execution]) -> Vec<&Execution> {
    executions
        .iter()
        .filter(|e| e.status == ExecutionStatus::Skipped)
        .collect()
}

async fn scalar(store: &Store, sql: String) -> i64 {
    match store {
        Store::Sqlite(pool) => sqlx::query_scalar(AssertSqlSafe(sql))
            .fetch_one(pool)
            .await
            .unwrap(),
        Store::Postgres(pool) => sqlx::query_scalar(AssertSqlSafe(sql))
            .fetch_one(pool)
            .await
            .unwrap(),
    }
}

fn skip_request(n: u32, expected: Millis, next: Millis, now: Millis) -> SkipRequest {
    SkipRequest {
        branch_rule_id: id(n),
        holder: HOLDER.into(),
        expected_next_run_time: expected,
        next_run_time: next,
        skipped: vec![
            skip(expected - HOUR, SkipReason::Misfire, "ruled was down"),
            skip(expected, SkipReason::Misfire, "ruled was down"),
        ],
        now,
        lock_timeout_ms: TIMEOUT,
    }
}

// ---- the migration and the skipped status -------------------------------------

both_backends!(
    a_skipped_execution_is_stored_and_read_back,
    |db: TestDb| async move {
        let db = db;
        let store = store_with_rules(&db, [10]).await;
        let row = store
            .skip_occurrences(&skip_request(10, T0, T0 + HOUR, T0 + 5))
            .await
            .unwrap()
            .expect("the compare matches");
        let executions = store.executions_for(id(10)).await.unwrap();
        assert_eq!(executions.len(), 2);
        let e = &executions[1];
        assert_eq!(e.status, ExecutionStatus::Skipped);
        assert!(e.status.is_terminal());
        assert_eq!((e.scheduled_for, e.attempt), (T0, 1));
        assert_eq!((e.owner.as_str(), e.lock_epoch), (HOLDER, row.lock_epoch));
        assert_eq!(
            (e.requested_at, e.finished_at, e.created_at, e.updated_at),
            (T0 + 5, Some(T0 + 5), T0 + 5, T0 + 5)
        );
        assert_eq!((e.scheduled_at, e.started_at), (None, None));
        assert_eq!(e.error.as_deref(), Some("misfire: ruled was down"));
        assert_eq!(store.execution(e.id).await.unwrap().as_ref(), Some(e));

        // Counted and listed as a finished status; never open.
        let counts = store.count_executions_by_status().await.unwrap();
        assert!(
            counts.contains(&(ExecutionStatus::Skipped, 2)),
            "{counts:?}"
        );
        let listed = store
            .list_executions(&ExecutionFilter {
                status: Some(ExecutionStatus::Skipped),
                ..ExecutionFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(listed.len(), 2);
        assert_eq!(store.open_execution_of(id(10)).await.unwrap(), None);

        // The rebuilt table keeps its constraints: an unknown status is
        // refused, the occurrence key holds, and deleting the branch rule
        // still takes its executions along.
        let bad = store
            .execute_sql(&format!(
                "INSERT INTO executions (id, branch_rule_id, scheduled_for, status, attempt, \
                 owner, requested_at) VALUES ('{}', '{}', 1, 'bogus', 1, 'x', 1)",
                Uuid::new_v4(),
                id(10)
            ))
            .await;
        assert!(bad.is_err(), "an unknown status is refused");
        let duplicate = store
            .execute_sql(&format!(
                "INSERT INTO executions (id, branch_rule_id, scheduled_for, status, attempt, \
                 owner, requested_at) VALUES ('{}', '{}', {T0}, 'skipped', 1, 'x', 1)",
                Uuid::new_v4(),
                id(10)
            ))
            .await;
        assert!(
            duplicate.unwrap_err().is_unique_violation(),
            "the occurrence key holds"
        );
        store
            .execute_sql(&format!("DELETE FROM branch_rules WHERE id = '{}'", id(10)))
            .await
            .unwrap();
        assert_eq!(
            scalar(&store, "SELECT COUNT(*) FROM executions".into()).await,
            0
        );
        store.close().await;
    }
);

/// A store on `db` with the SQLite migrations older than `version`
/// applied, to write rows the way an older release left them.
async fn sqlite_migrated_before(db: &TestDb, version: i64) -> Store {
    let store = Store::connect(&db.url).await.unwrap();
    let Store::Sqlite(pool) = &store else {
        unreachable!()
    };
    let mut migrator = sqlx::migrate!("./migrations/sqlite");
    let before: Vec<_> = migrator
        .migrations
        .iter()
        .filter(|m| m.version < version)
        .cloned()
        .collect();
    migrator.migrations = before.into();
    migrator.run(pool).await.unwrap();
    store
}

/// The SQLite rebuild of executions keeps every index the earlier
/// migrations left on it, and a database with history keeps its rows.
#[tokio::test]
async fn the_sqlite_rebuild_keeps_rows_and_indexes() {
    let db = common::sqlite_db().await;
    let Store::Sqlite(pool) = db.store().await else {
        unreachable!()
    };
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'executions' \
         AND name NOT LIKE 'sqlite_autoindex%' ORDER BY name",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        indexes,
        [
            "executions_finished_status_idx",
            "executions_open_idx",
            "executions_requested_at_id_idx"
        ]
    );
    let unique: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM pragma_index_list('executions') WHERE \"unique\" = 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(unique, 2, "the primary key and the occurrence key");
    let triggers: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'executions'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(triggers, 0);
    let foreign_keys: Vec<(String, String)> =
        sqlx::query_as("SELECT \"table\", on_delete FROM pragma_foreign_key_list('executions')")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        foreign_keys,
        [("branch_rules".to_string(), "CASCADE".to_string())]
    );
    pool.close().await;

    // Rows written before the migration survive it.
    let db = common::sqlite_db().await;
    let store = sqlite_migrated_before(&db, 20261123000009).await;
    store
        .execute_sql(&format!(
            "INSERT INTO brands (id, name) VALUES ('{}', 'Acme'); \
             INSERT INTO branches (id, brand_id, name) VALUES ('{}', '{}', 'Riyadh'); \
             INSERT INTO rules (id, name, cron_expression) VALUES ('{}', 'hourly', '0 * * * *'); \
             INSERT INTO branch_rules (id, branch_id, rule_id, next_run_time) \
             VALUES ('{}', '{}', '{}', {T0}); \
             INSERT INTO executions (id, branch_rule_id, scheduled_for, status, attempt, owner, \
             lock_epoch, requested_at, finished_at, error, output, cancel_requested_at) \
             VALUES ('{}', '{}', {T0}, 'failed', 1, 'host-a', 3, {T0}, {}, 'boom', '{{\"a\":1}}', {})",
            id(1),
            id(2),
            id(1),
            id(3),
            id(10),
            id(2),
            id(3),
            id(90),
            id(10),
            T0 + 1,
            T0 + 2
        ))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let e = store.execution(id(90)).await.unwrap().unwrap();
    assert_eq!(
        (e.status, e.attempt, e.owner.as_str(), e.lock_epoch),
        (ExecutionStatus::Failed, 1, "host-a", 3)
    );
    assert_eq!(
        (e.finished_at, e.error.as_deref(), e.output),
        (Some(T0 + 1), Some("boom"), Some(json!({"a": 1})))
    );
    assert_eq!(
        scalar(
            &store,
            "SELECT cancel_requested_at FROM executions".to_string()
        )
        .await,
        T0 + 2
    );
    let loaded = rule(&store, 10).await;
    assert_eq!(
        (loaded.policy, loaded.retry_of, loaded.failed_attempts),
        (None, None, 0)
    );
    store.close().await;
}

/// The SQLite rebuild of branch_rules in id order (migration ..10) keeps
/// every rule with its columns, and the actions and history that point at
/// it: with foreign keys on, dropping the old table would have deleted
/// them by cascade. Afterwards the references hold and cascade as before,
/// and the indexes and the updated_at trigger are back.
#[tokio::test]
async fn the_sqlite_branch_rules_rebuild_keeps_what_points_at_them() {
    let db = common::sqlite_db().await;
    let store = sqlite_migrated_before(&db, 20261127000010).await;
    let Store::Sqlite(pool) = &store else {
        unreachable!()
    };
    store
        .execute_sql(&format!(
            "INSERT INTO brands (id, name) VALUES ('{brand}', 'Acme'); \
             INSERT INTO branches (id, brand_id, name) VALUES ('{branch}', '{brand}', 'Riyadh'); \
             INSERT INTO rules (id, name, cron_expression) VALUES ('{rule}', 'hourly', '0 * * * *'); \
             INSERT INTO branch_rules (id, branch_id, rule_id, next_run_time, lock_holder, \
             lock_time, lock_epoch, policy, retry_of, failed_attempts, created_by, \
             updated_at) VALUES ('{br}', '{branch}', '{rule}', {T0}, 'host-a', {T0}, 7, \
             '{{\"max_attempts\":3}}', {T0}, 2, 'ops', 1), \
             ('{other}', '{branch}', '{rule}', NULL, NULL, NULL, 0, NULL, NULL, 0, NULL, 1); \
             INSERT INTO action_templates (id, name, kind) VALUES ('{template}', 't', 'noop'); \
             INSERT INTO action_details (id, branch_rule_id, action_template_id, position) \
             VALUES ('{detail}', '{br}', '{template}', 0); \
             INSERT INTO executions (id, branch_rule_id, scheduled_for, status, attempt, owner, \
             lock_epoch, requested_at, finished_at) \
             VALUES ('{execution}', '{br}', {T0}, 'completed', 1, 'host-a', 7, {T0}, {T0})",
            brand = id(1),
            branch = id(2),
            rule = id(3),
            br = id(10),
            other = id(11),
            template = id(20),
            detail = id(21),
            execution = id(90),
        ))
        .await
        .unwrap();

    store.migrate().await.unwrap();

    let count = |table: &str| scalar(&store, format!("SELECT COUNT(*) FROM {table}"));
    assert_eq!(count("branch_rules").await, 2);
    assert_eq!(count("action_details").await, 1, "the actions survive");
    assert_eq!(count("executions").await, 1, "the history survives");
    let loaded = rule(&store, 10).await;
    assert_eq!(
        (
            loaded.next_run_time,
            loaded.lock_holder.as_deref(),
            loaded.lock_epoch,
            loaded.retry_of,
            loaded.failed_attempts,
        ),
        (Some(T0), Some("host-a"), 7, Some(T0), 2)
    );
    assert_eq!(loaded.policy, Some(policy(json!({"max_attempts": 3}))));
    let without_rowid: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM sqlite_master WHERE name = 'branch_rules' \
         AND sql LIKE '%WITHOUT ROWID'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(without_rowid, 1, "the table is kept in id order");
    let schema: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE tbl_name = 'branch_rules' \
         AND type IN ('index', 'trigger') ORDER BY name",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(
        schema,
        [
            "branch_rules_branch_id_idx",
            "branch_rules_brand_rule_id_idx",
            "branch_rules_lock_holder_idx",
            "branch_rules_next_run_time_idx",
            "branch_rules_rule_id_idx",
            "branch_rules_touch_updated_at",
            "branch_rules_updated_at_idx",
        ]
    );

    // The references hold and cascade; the trigger still bumps updated_at.
    let orphan = store
        .execute_sql(&format!(
            "INSERT INTO executions (id, branch_rule_id, scheduled_for, status, attempt, \
             owner, requested_at) VALUES ('{}', '{}', {T0}, 'completed', 1, 'x', {T0})",
            id(91),
            id(99)
        ))
        .await;
    assert!(orphan.is_err(), "an execution of no branch rule is refused");
    store
        .execute_sql(&format!(
            "UPDATE branch_rules SET is_active = 0 WHERE id = '{}'",
            id(11)
        ))
        .await
        .unwrap();
    let updated_at = |n: u32| {
        scalar(
            &store,
            format!("SELECT updated_at FROM branch_rules WHERE id = '{}'", id(n)),
        )
    };
    assert!(updated_at(11).await > 1, "the trigger bumped it");
    assert_eq!(updated_at(10).await, 1);
    store
        .execute_sql(&format!("DELETE FROM branch_rules WHERE id = '{}'", id(10)))
        .await
        .unwrap();
    assert_eq!(count("action_details").await, 0);
    assert_eq!(count("executions").await, 0);
    store.close().await;
}

// ---- the policy columns --------------------------------------------------------

both_backends!(
    policies_round_trip_through_inserts_and_the_plan_load,
    |db: TestDb| async move {
        let db = db;
        let store = db.store().await;
        seed(&store).await;
        let rule_policy = policy(json!({
            "misfire": "run_all", "catchup_window_seconds": 3600, "catchup_max": 5,
            "overlap": "cancel_running", "max_attempts": 3, "backoff_seconds": 0,
            "backoff_max_seconds": 60, "start_jitter_seconds": 30
        }));
        store
            .insert_rule(&rule_row(4, Some(rule_policy.clone())))
            .await
            .unwrap();
        let own = BranchRule {
            rule_id: id(4),
            policy: Some(policy(json!({"max_attempts": 5}))),
            retry_of: Some(T0 - HOUR),
            failed_attempts: 2,
            ..branch_rule(10, Some(T0))
        };
        store.insert_branch_rule(&own).await.unwrap();
        let data = store.load_plan_data(0).await.unwrap();
        let loaded_rule = data.rules.iter().find(|r| r.id == id(4)).unwrap();
        assert_eq!(loaded_rule.policy, Some(rule_policy));
        assert_eq!(
            data.rules.iter().find(|r| r.id == id(3)).unwrap().policy,
            None
        );
        assert_eq!(data.branch_rules, std::slice::from_ref(&own));
        // Changed-since reads decode the same columns.
        let delta = store.load_plan_changes(T0 - 1000, 0).await.unwrap();
        assert_eq!(delta.branch_rules, std::slice::from_ref(&own));

        // Stored as JSON text; no policy (or an empty one) is NULL.
        store
            .insert_rule(&rule_row(5, Some(Policy::default())))
            .await
            .unwrap();
        assert_eq!(
            scalar(
                &store,
                format!(
                    "SELECT COUNT(*) FROM rules WHERE policy IS NULL AND id IN ('{}', '{}')",
                    id(3),
                    id(5)
                )
            )
            .await,
            2
        );

        // The API's generic rows: policy is JSON, retry state is readable.
        let row = store.row(&RULES, id(4)).await.unwrap().unwrap();
        assert_eq!(row["policy"]["misfire"], json!("run_all"));
        let row = store.row(&BRANCH_RULES, id(10)).await.unwrap().unwrap();
        assert_eq!(row["policy"], json!({"max_attempts": 5}));
        assert_eq!(row["retry_of"], json!(T0 - HOUR));
        assert_eq!(row["failed_attempts"], json!(2));
        let row = store.row(&RULES, id(3)).await.unwrap().unwrap();
        assert_eq!(row["policy"], json!(null));

        // Written through the rows API: an object is stored, null clears it.
        let mut changes = serde_json::Map::new();
        changes.insert("policy".into(), json!({"overlap": "buffer_one"}));
        assert!(
            store
                .update_row(&BRANCH_RULES, id(10), &changes)
                .await
                .unwrap()
        );
        assert_eq!(
            rule(&store, 10).await.policy,
            Some(policy(json!({"overlap": "buffer_one"})))
        );
        changes.insert("policy".into(), json!(null));
        assert!(
            store
                .update_row(&BRANCH_RULES, id(10), &changes)
                .await
                .unwrap()
        );
        assert_eq!(rule(&store, 10).await.policy, None);
        assert_eq!(
            scalar(
                &store,
                format!(
                    "SELECT COUNT(*) FROM branch_rules WHERE policy IS NULL AND id = '{}'",
                    id(10)
                )
            )
            .await,
            1,
            "a JSON null is stored as NULL, not as the text null"
        );
        let mut rule_changes = serde_json::Map::new();
        rule_changes.insert("policy".into(), json!({"misfire": "skip"}));
        assert!(
            store
                .update_row(&RULES, id(3), &rule_changes)
                .await
                .unwrap()
        );
        let data = store.load_plan_data(0).await.unwrap();
        let loaded = data.rules.iter().find(|r| r.id == id(3)).unwrap();
        assert_eq!(loaded.policy, Some(policy(json!({"misfire": "skip"}))));
        store.close().await;
    }
);

both_backends!(
    a_bad_policy_quarantines_its_row_and_the_load_goes_on,
    |db: TestDb| async move {
        let db = db;
        let store = store_with_rules(&db, [10, 11]).await;
        store.insert_rule(&rule_row(4, None)).await.unwrap();
        store
            .insert_branch_rule(&BranchRule {
                rule_id: id(4),
                ..branch_rule(12, Some(T0))
            })
            .await
            .unwrap();
        store
            .execute_sql(&format!(
                "UPDATE rules SET policy = '{{\"max_attempts\": 0}}' WHERE id = '{}'; \
                 UPDATE branch_rules SET policy = 'not json' WHERE id = '{}'",
                id(4),
                id(11)
            ))
            .await
            .unwrap();

        for since in [None, Some(0)] {
            let load = store.load_plan(0, since).await.unwrap();
            let rule_ids: Vec<Uuid> = load.data.rules.iter().map(|r| r.id).collect();
            assert_eq!(rule_ids, [id(3)]);
            let branch_rule_ids: Vec<Uuid> = load.data.branch_rules.iter().map(|r| r.id).collect();
            assert_eq!(branch_rule_ids, [id(10), id(12)], "the others still load");
            let mut rejected = load.rejected.clone();
            rejected.sort_by(|a, b| a.table.cmp(&b.table));
            assert_eq!(rejected.len(), 2, "{rejected:?}");
            let (branch_rule, rule) = (&rejected[0], &rejected[1]);
            assert_eq!(
                (branch_rule.table.as_str(), branch_rule.id.clone()),
                ("branch_rules", id(11).to_string())
            );
            assert_eq!(
                (rule.table.as_str(), rule.id.clone()),
                ("rules", id(4).to_string())
            );
            for row in &rejected {
                assert_eq!(row.reason, RejectReason::Policy, "{row:?}");
                assert_eq!(row.field, "policy");
                assert!(row.message.starts_with("policy"), "{}", row.message);
            }
            assert!(
                rule.message.starts_with("policy.max_attempts:"),
                "the message names the field: {}",
                rule.message
            );
        }
        // The API's generic rows still read them: the bad JSON text as a
        // JSON string, the bad policy as it is, for the API to judge.
        let row = store.row(&BRANCH_RULES, id(11)).await.unwrap().unwrap();
        assert_eq!(row["policy"], json!("not json"));
        let row = store.row(&RULES, id(4)).await.unwrap().unwrap();
        assert_eq!(row["policy"], json!({"max_attempts": 0}));
        assert_eq!(store.rows(&BRANCH_RULES, None).await.unwrap().len(), 3);

        // The strict read names the first bad row.
        match store.load_plan_data(0).await {
            Err(StoreError::Decode { column, .. }) => assert_eq!(column, "policy"),
            other => panic!("expected a decode error, got {other:?}"),
        }
        store.close().await;
    }
);

// ---- retries -------------------------------------------------------------------

both_backends!(
    a_pending_retry_claims_its_occurrence_again,
    |db: TestDb| async move {
        let db = db;
        let store = store_with_rules(&db, [10]).await;
        let first = claim(&store, 10, HOLDER, T0).await;
        assert_eq!(
            (first.execution.scheduled_for, first.execution.attempt),
            (T0, 1)
        );

        // Failed: a retry of T0 is pending at T0 + 10 s.
        let failed = Finish {
            retry: RetryUpdate::Pending {
                of: T0,
                failed_attempts: 1,
            },
            ..finish(ExecutionStatus::Failed, T0 + 100, Some(T0 + 10_000))
        };
        let row = store
            .finish(&first.fence(), &failed)
            .await
            .unwrap()
            .expect("the owner finishes");
        assert_eq!(
            (row.retry_of, row.failed_attempts, row.next_run_time),
            (Some(T0), 1, Some(T0 + 10_000))
        );
        assert_eq!(row, rule(&store, 10).await);
        assert!(
            store
                .claim(&request(10, HOLDER, T0 + 5_000))
                .await
                .unwrap()
                .is_none()
        );

        // The retry is the next attempt of the same occurrence.
        let second = claim(&store, 10, HOLDER, T0 + 10_000).await;
        assert_eq!(
            (second.execution.scheduled_for, second.execution.attempt),
            (T0, 2)
        );
        assert_eq!(second.branch_rule.retry_of, Some(T0));

        // Keep leaves the retry state as it is.
        let kept = store
            .finish(
                &second.fence(),
                &finish(ExecutionStatus::Failed, T0 + 10_100, Some(T0 + 20_000)),
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!((kept.retry_of, kept.failed_attempts), (Some(T0), 1));
        let third = claim(&store, 10, HOLDER, T0 + 20_000).await;
        assert_eq!(
            (third.execution.scheduled_for, third.execution.attempt),
            (T0, 3)
        );

        // Clear ends it: the next claim is the next occurrence, attempt 1.
        let cleared = Finish {
            retry: RetryUpdate::Clear,
            ..finish(ExecutionStatus::Completed, T0 + 20_100, Some(T0 + HOUR))
        };
        let row = store
            .finish(&third.fence(), &cleared)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((row.retry_of, row.failed_attempts), (None, 0));
        let next = claim(&store, 10, HOLDER, T0 + HOUR).await;
        assert_eq!(
            (next.execution.scheduled_for, next.execution.attempt),
            (T0 + HOUR, 1)
        );

        // A run-now claim uses its own time even with a retry pending.
        let pending = Finish {
            retry: RetryUpdate::Pending {
                of: T0 + HOUR,
                failed_attempts: 1,
            },
            ..finish(ExecutionStatus::Failed, T0 + HOUR + 1, Some(T0 + 2 * HOUR))
        };
        store
            .finish(&next.fence(), &pending)
            .await
            .unwrap()
            .unwrap();
        let now = ClaimRequest {
            run_now: true,
            ..request(10, HOLDER, T0 + HOUR + 50)
        };
        let run_now = store.claim(&now).await.unwrap().unwrap();
        assert_eq!(run_now.execution.scheduled_for, T0 + HOUR + 50);

        // A stale fence changes nothing.
        let stale = Finish {
            retry: RetryUpdate::Clear,
            ..finish(ExecutionStatus::Completed, T0 + HOUR + 60, None)
        };
        assert_eq!(store.finish(&first.fence(), &stale).await.unwrap(), None);
        let row = rule(&store, 10).await;
        assert_eq!((row.retry_of, row.failed_attempts), (Some(T0 + HOUR), 1));
        store.close().await;
    }
);

both_backends!(
    the_batcher_writes_the_retry_state_of_each_finish,
    |db: TestDb| async move {
        let db = db;
        let store = store_with_rules(&db, [10, 11, 12]).await;
        store
            .execute_sql(&format!(
                "UPDATE branch_rules SET retry_of = {}, failed_attempts = 4 WHERE id = '{}'",
                T0 - HOUR,
                id(12)
            ))
            .await
            .unwrap();
        let batcher = TransitionBatcher::new(store.clone());
        let claims: Vec<Claim> = futures_all([10, 11, 12].map(|n| {
            let batcher = batcher.clone();
            async move {
                batcher
                    .claim(&request(n, HOLDER, T0))
                    .await
                    .unwrap()
                    .unwrap()
            }
        }))
        .await;
        assert_eq!(claims[2].execution.scheduled_for, T0 - HOUR);
        assert_eq!(claims[2].execution.attempt, 1);
        let pending = Finish {
            retry: RetryUpdate::Pending {
                of: T0,
                failed_attempts: 7,
            },
            ..finish(ExecutionStatus::Failed, T0 + 1, Some(T0 + 60_000))
        };
        let clear = Finish {
            retry: RetryUpdate::Clear,
            ..finish(ExecutionStatus::Completed, T0 + 1, Some(T0 + HOUR))
        };
        let keep = finish(ExecutionStatus::Completed, T0 + 1, Some(T0 + HOUR));
        let fences: Vec<Fence> = claims.iter().map(Claim::fence).collect();
        let (a, b, c) = tokio::join!(
            batcher.finish(&fences[0], &pending),
            batcher.finish(&fences[1], &clear),
            batcher.finish(&fences[2], &keep),
        );
        let (a, b, c) = (
            a.unwrap().unwrap(),
            b.unwrap().unwrap(),
            c.unwrap().unwrap(),
        );
        assert_eq!((a.retry_of, a.failed_attempts), (Some(T0), 7));
        assert_eq!((b.retry_of, b.failed_attempts), (None, 0));
        assert_eq!((c.retry_of, c.failed_attempts), (Some(T0 - HOUR), 4));
        for (n, returned) in [(10, a), (11, b), (12, c)] {
            assert_eq!(returned, rule(&store, n).await);
        }
        store.close().await;
    }
);

async fn futures_all<F: std::future::Future>(futures: [F; 3]) -> Vec<F::Output> {
    let [a, b, c] = futures;
    let (a, b, c) = tokio::join!(a, b, c);
    vec![a, b, c]
}

// ---- skipped occurrences recorded by a finish ----------------------------------

both_backends!(
    a_finish_records_its_skipped_occurrences_once,
    |db: TestDb| async move {
        let db = db;
        let store = store_with_rules(&db, [10]).await;
        let first = claim(&store, 10, HOLDER, T0).await;
        let long_detail = "x".repeat(20_000);
        let with_skips = Finish {
            skipped: vec![
                skip(
                    T0 + HOUR,
                    SkipReason::Overlap,
                    "the previous run was still running",
                ),
                skip(T0 + 2 * HOUR, SkipReason::Overlap, &long_detail),
                // The same occurrence twice in one finish is recorded once.
                skip(T0 + HOUR, SkipReason::Overlap, "again"),
            ],
            ..finish(
                ExecutionStatus::Completed,
                T0 + 2 * HOUR + 5,
                Some(T0 + 3 * HOUR),
            )
        };
        store
            .finish(&first.fence(), &with_skips)
            .await
            .unwrap()
            .expect("the owner finishes");
        let executions = store.executions_for(id(10)).await.unwrap();
        let skipped = skipped_of(&executions);
        assert_eq!(skipped.len(), 2, "{executions:?}");
        let (one, two) = (skipped[0], skipped[1]);
        assert_eq!((one.scheduled_for, one.attempt), (T0 + HOUR, 1));
        assert_eq!(
            one.error.as_deref(),
            Some("overlap: the previous run was still running")
        );
        assert_eq!(
            (one.owner.as_str(), one.lock_epoch),
            (HOLDER, first.execution.lock_epoch)
        );
        assert_eq!(
            (one.requested_at, one.finished_at, one.updated_at),
            (
                T0 + 2 * HOUR + 5,
                Some(T0 + 2 * HOUR + 5),
                T0 + 2 * HOUR + 5
            )
        );
        assert_eq!(two.scheduled_for, T0 + 2 * HOUR);
        let error = two.error.as_deref().unwrap();
        assert!(error.starts_with("overlap: xxx"));
        assert_eq!(
            error.len(),
            ruled::store::ERROR_CAP_BYTES,
            "cut like any error"
        );

        // Delivered again (an outbox replay): the fence fails, nothing more.
        assert_eq!(
            store.finish(&first.fence(), &with_skips).await.unwrap(),
            None
        );
        assert_eq!(store.executions_for(id(10)).await.unwrap(), executions);

        // A later owner skipping an occurrence already recorded skipped
        // records only what is new; one sharing an occurrence with another
        // attempt becomes its next attempt.
        let second = claim(&store, 10, HOLDER, T0 + 3 * HOUR).await;
        let later = Finish {
            skipped: vec![
                skip(T0 + HOUR, SkipReason::Overlap, "repeated"),
                skip(T0, SkipReason::Misfire, "shares T0 with the first run"),
            ],
            ..finish(
                ExecutionStatus::Completed,
                T0 + 3 * HOUR + 5,
                Some(T0 + 4 * HOUR),
            )
        };
        store
            .finish(&second.fence(), &later)
            .await
            .unwrap()
            .unwrap();
        let executions = store.executions_for(id(10)).await.unwrap();
        let skipped = skipped_of(&executions);
        assert_eq!(skipped.len(), 3, "{executions:?}");
        let at_t0 = skipped.iter().find(|e| e.scheduled_for == T0).unwrap();
        assert_eq!(at_t0.attempt, 2);
        assert_eq!(at_t0.lock_epoch, second.execution.lock_epoch);

        // A finish whose fence fails records nothing.
        let third = claim(&store, 10, HOLDER, T0 + 4 * HOUR).await;
        let stale = Fence {
            epoch: third.execution.lock_epoch - 1,
            ..third.fence()
        };
        let lost = Finish {
            skipped: vec![skip(T0 + 9 * HOUR, SkipReason::Overlap, "lost")],
            ..finish(ExecutionStatus::Completed, T0 + 4 * HOUR + 5, None)
        };
        assert_eq!(store.finish(&stale, &lost).await.unwrap(), None);
        assert_eq!(
            skipped_of(&store.executions_for(id(10)).await.unwrap()).len(),
            3
        );
        store.close().await;
    }
);

both_backends!(
    the_batcher_records_skips_on_both_of_its_paths,
    |db: TestDb| async move {
        let db = db;
        let store = store_with_rules(&db, [10, 11, 12, 13]).await;
        let batcher = TransitionBatcher::new(store.clone());
        let claims: Vec<Claim> = futures_all([10, 11, 12].map(|n| {
            let batcher = batcher.clone();
            async move {
                batcher
                    .claim(&request(n, HOLDER, T0))
                    .await
                    .unwrap()
                    .unwrap()
            }
        }))
        .await;
        let skipping = |at: Millis| Finish {
            skipped: vec![
                skip(at + HOUR, SkipReason::Overlap, "busy"),
                skip(at + 2 * HOUR, SkipReason::Overlap, "busy"),
            ],
            ..finish(ExecutionStatus::Completed, T0 + 1, Some(T0 + 3 * HOUR))
        };

        // Grouped: two finishes in one batch.
        let fences: Vec<Fence> = claims.iter().map(Claim::fence).collect();
        let skips = skipping(T0);
        let (a, b) = tokio::join!(
            batcher.finish(&fences[0], &skips),
            batcher.finish(&fences[1], &skips),
        );
        a.unwrap().unwrap();
        b.unwrap().unwrap();
        for n in [10, 11] {
            let executions = store.executions_for(id(n)).await.unwrap();
            assert_eq!(skipped_of(&executions).len(), 2, "rule {n}: {executions:?}");
        }

        // One by one: a claim that fails in the same batch sends the batch
        // down the fallback path, where the finish still records its skips.
        let mut clash = request(13, HOLDER, T0);
        clash.execution_id = claims[0].execution.id;
        let (clashed, finished) =
            tokio::join!(batcher.claim(&clash), batcher.finish(&fences[2], &skips),);
        assert!(clashed.unwrap_err().is_unique_violation());
        finished.unwrap().expect("the owner finishes");
        let executions = store.executions_for(id(12)).await.unwrap();
        assert_eq!(skipped_of(&executions).len(), 2, "{executions:?}");
        store.close().await;
    }
);

// ---- the master's misfire decision ---------------------------------------------

both_backends!(
    skip_occurrences_moves_next_run_time_once,
    |db: TestDb| async move {
        let db = db;
        let store = store_with_rules(&db, [10]).await;
        let before = rule(&store, 10).await;
        let req = skip_request(10, T0, T0 + HOUR, T0 + 30_000);
        let row = store
            .skip_occurrences(&req)
            .await
            .unwrap()
            .expect("the compare matches");
        assert_eq!(row.next_run_time, Some(T0 + HOUR));
        assert!(row.updated_at > before.updated_at);
        assert_eq!(row.lock_epoch, before.lock_epoch, "no lock is taken");
        assert_eq!(
            (row.lock_holder.as_deref(), row.is_currently_running),
            (None, false)
        );
        assert_eq!(row, rule(&store, 10).await);
        let executions = store.executions_for(id(10)).await.unwrap();
        let at: Vec<(Millis, i64)> = executions
            .iter()
            .map(|e| (e.scheduled_for, e.attempt))
            .collect();
        assert_eq!(at, [(T0 - HOUR, 1), (T0, 1)]);
        assert!(
            executions
                .iter()
                .all(|e| e.status == ExecutionStatus::Skipped
                    && e.owner == HOLDER
                    && e.requested_at == T0 + 30_000)
        );

        // The same decision again, or another instance's: the compare
        // fails and nothing is written.
        assert_eq!(store.skip_occurrences(&req).await.unwrap(), None);
        let other = SkipRequest {
            holder: OTHER.into(),
            ..req.clone()
        };
        assert_eq!(store.skip_occurrences(&other).await.unwrap(), None);
        assert_eq!(rule(&store, 10).await, row);
        assert_eq!(store.executions_for(id(10)).await.unwrap(), executions);
        store.close().await;
    }
);

both_backends!(
    skip_occurrences_leaves_locked_and_retrying_rules_alone,
    |db: TestDb| async move {
        let db = db;
        let store = store_with_rules(&db, [10, 11]).await;

        // Claimed (a live lock): not moved.
        let claimed = claim(&store, 10, OTHER, T0).await;
        let req = skip_request(10, T0, T0 + HOUR, T0 + 1_000);
        assert_eq!(store.skip_occurrences(&req).await.unwrap(), None);
        assert!(store.executions_for(id(10)).await.unwrap().len() == 1);
        // Its lock expired: the decision may move it.
        let late = SkipRequest {
            now: T0 + TIMEOUT + 1,
            ..req.clone()
        };
        let row = store.skip_occurrences(&late).await.unwrap().unwrap();
        assert_eq!(row.next_run_time, Some(T0 + HOUR));
        let skipped: Vec<Execution> = store
            .executions_for(id(10))
            .await
            .unwrap()
            .into_iter()
            .filter(|e| e.status == ExecutionStatus::Skipped)
            .collect();
        // T0 already has the claimed attempt: the skip is attempt 2.
        let at: Vec<(Millis, i64, i64)> = skipped
            .iter()
            .map(|e| (e.scheduled_for, e.attempt, e.lock_epoch))
            .collect();
        assert_eq!(
            at,
            [
                (T0 - HOUR, 1, claimed.execution.lock_epoch),
                (T0, 2, claimed.execution.lock_epoch)
            ]
        );

        // A pending retry: not moved.
        store
            .execute_sql(&format!(
                "UPDATE branch_rules SET retry_of = {} WHERE id = '{}'",
                T0 - HOUR,
                id(11)
            ))
            .await
            .unwrap();
        let req = skip_request(11, T0, T0 + HOUR, T0 + 1_000);
        assert_eq!(store.skip_occurrences(&req).await.unwrap(), None);
        assert_eq!(rule(&store, 11).await.next_run_time, Some(T0));
        assert!(store.executions_for(id(11)).await.unwrap().is_empty());
        store.close().await;
    }
);

both_backends!(
    two_instances_deciding_one_misfire_write_it_once,
    tokio::test(flavor = "multi_thread", worker_threads = 4),
    |db: TestDb| async move {
        let db = db;
        let first = store_with_rules(&db, 10..30).await;
        let second = db.store().await;
        let mut tasks = Vec::new();
        for n in 10..30 {
            for (store, holder) in [(first.clone(), HOLDER), (second.clone(), OTHER)] {
                tasks.push(tokio::spawn(async move {
                    let req = SkipRequest {
                        holder: holder.into(),
                        ..skip_request(n, T0, T0 + HOUR, T0 + 1_000)
                    };
                    store.skip_occurrences(&req).await.unwrap().is_some()
                }));
            }
        }
        let mut won = Vec::new();
        for task in tasks {
            won.push(task.await.unwrap());
        }
        for (n, pair) in (10..30).zip(won.chunks(2)) {
            assert_eq!(
                pair.iter().filter(|w| **w).count(),
                1,
                "rule {n}: exactly one decision lands"
            );
            let executions = first.executions_for(id(n)).await.unwrap();
            assert_eq!(executions.len(), 2, "rule {n}: {executions:?}");
        }
        second.close().await;
        first.close().await;
    }
);
