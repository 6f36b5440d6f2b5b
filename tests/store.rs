//! The store on both backends: schema, round trips, constraints, decode errors.

mod common;

use common::TestDb;
use ruled::model::{
    ActionDetail, ActionTemplate, Branch, BranchRule, Brand, BrandRule, PlanData, PlanScope, Rule,
    RuleStatus,
};
use ruled::store::{Backend, Store, StoreError};
use serde_json::json;
use uuid::Uuid;

const CAP: usize = 1500;

/// DESIGN.md §2, plus created_at/updated_at on every table.
/// The catalog tables, which carry `created_by` and `updated_by`.
const CATALOG_TABLES: &[&str] = &[
    "brands",
    "branches",
    "rules",
    "brand_rules",
    "action_templates",
    "branch_rules",
    "action_details",
];

const DESIGN_COLUMNS: &[(&str, &[&str])] = &[
    ("brands", &["id", "name", "settings"]),
    (
        "branches",
        &["id", "brand_id", "name", "timezone", "is_active"],
    ),
    (
        "rules",
        &[
            "id",
            "brand_id",
            "name",
            "status",
            "cron_expression",
            "settings",
            // Issue 13: the scheduling policy (JSON text, NULL for none).
            "policy",
        ],
    ),
    (
        "brand_rules",
        &["id", "brand_id", "rule_id", "settings", "cron_expression"],
    ),
    ("action_templates", &["id", "name", "kind", "config"]),
    (
        "branch_rules",
        &[
            "id",
            "branch_id",
            "rule_id",
            "brand_rule_id",
            "is_active",
            "is_archived",
            "is_force_stopped",
            "is_currently_running",
            "operation_time_from",
            "operation_time_to",
            "next_run_time",
            "last_run_time",
            "lock_holder",
            "lock_time",
            "lock_epoch",
            "params",
            // Issue 13: the policy's overrides and a pending retry.
            "policy",
            "retry_of",
            "failed_attempts",
        ],
    ),
    (
        "action_details",
        &[
            "id",
            "branch_rule_id",
            "action_template_id",
            "position",
            "params",
        ],
    ),
    (
        "executions",
        &[
            "id",
            "branch_rule_id",
            "scheduled_for",
            "status",
            "attempt",
            "owner",
            "lock_epoch",
            "requested_at",
            "scheduled_at",
            "started_at",
            "finished_at",
            "error",
            "output",
            "cancel_requested_at",
        ],
    ),
    (
        "instances",
        &[
            "id",
            "hostname",
            "pid",
            "started_at",
            "heartbeat_at",
            "partition",
        ],
    ),
];

// ---- fixtures ----------------------------------------------------------------

/// Distinct, recognisable ids: `n` in the last group, so failures are readable.
fn id(n: u32) -> Uuid {
    Uuid::parse_str(&format!("00000000-0000-4000-8000-{n:012}")).unwrap()
}

/// One of everything, with every optional column both set and unset and
/// values at the edges (unicode, i64 extremes, nested JSON).
fn fixture() -> PlanData {
    let t0: i64 = 1_795_000_000_000;
    let brands = vec![
        Brand {
            id: id(1),
            name: "Acme".into(),
            settings: json!({"currency": "SAR", "limits": [1, 2.5, -3], "nested": {"on": true, "none": null}}),
            created_at: t0,
            updated_at: t0 + 1,
        },
        Brand {
            id: id(2),
            name: "Café ☕ «Ünïcode» 'quoted' \"double\"".into(),
            settings: json!({}),
            created_at: 0,
            updated_at: i64::MAX,
        },
    ];
    let branches = vec![
        Branch {
            id: id(11),
            brand_id: id(1),
            name: "Riyadh".into(),
            timezone: None,
            is_active: true,
            created_at: t0,
            updated_at: t0,
        },
        Branch {
            id: id(12),
            brand_id: id(2),
            name: "Berlin".into(),
            timezone: Some("Europe/Berlin".into()),
            is_active: false,
            created_at: t0,
            updated_at: t0 + 5,
        },
    ];
    let rules = vec![
        Rule {
            id: id(21),
            brand_id: None,
            name: "global nightly".into(),
            status: RuleStatus::Active,
            cron_expression: "30 2 * * *".into(),
            settings: json!({"big": 9_007_199_254_740_993_i64, "s": "x"}),
            policy: Some(
                serde_json::from_value(
                    json!({"misfire": "run_all", "catchup_max": 3, "max_attempts": 4}),
                )
                .unwrap(),
            ),
            created_at: t0,
            updated_at: t0,
        },
        Rule {
            id: id(22),
            brand_id: Some(id(1)),
            name: "acme quarter-hourly".into(),
            status: RuleStatus::Inactive,
            cron_expression: "*/15 * * * MON-FRI".into(),
            settings: json!([]),
            policy: None,
            created_at: t0,
            updated_at: t0,
        },
    ];
    let brand_rules = vec![
        BrandRule {
            id: id(31),
            brand_id: id(1),
            rule_id: id(21),
            settings: json!({"override": 1}),
            cron_expression: Some("0 9 * * *".into()),
            created_at: t0,
            updated_at: t0,
        },
        BrandRule {
            id: id(32),
            brand_id: id(2),
            rule_id: id(21),
            settings: json!({}),
            cron_expression: None,
            created_at: t0,
            updated_at: t0,
        },
    ];
    let action_templates = vec![
        ActionTemplate {
            id: id(41),
            name: "wait".into(),
            kind: "sleep".into(),
            config: json!({"ms": 10}),
            created_at: t0,
            updated_at: t0,
        },
        ActionTemplate {
            id: id(42),
            name: "ping".into(),
            kind: "http".into(),
            config: json!({"method": "GET", "url": "https://example.com/", "headers": {"a": "b"}}),
            created_at: t0,
            updated_at: t0,
        },
    ];
    let branch_rules = vec![
        BranchRule {
            id: id(51),
            branch_id: id(11),
            rule_id: id(21),
            brand_rule_id: Some(id(31)),
            is_active: true,
            is_archived: false,
            is_force_stopped: true,
            is_currently_running: true,
            operation_time_from: Some("22:00".parse().unwrap()),
            operation_time_to: Some("06:30".parse().unwrap()),
            next_run_time: Some(t0 + 60_000),
            last_run_time: Some(t0 - 60_000),
            lock_holder: Some("host-a".into()),
            lock_time: Some(t0 - 1),
            lock_epoch: i64::MAX,
            params: json!({"k": ["v", 1, null]}),
            policy: Some(serde_json::from_value(json!({"overlap": "buffer_one"})).unwrap()),
            retry_of: Some(t0 - 30_000),
            failed_attempts: i32::MAX,
            created_at: t0,
            updated_at: t0,
        },
        BranchRule {
            id: id(52),
            branch_id: id(12),
            rule_id: id(22),
            brand_rule_id: None,
            is_active: false,
            is_archived: true,
            is_force_stopped: false,
            is_currently_running: false,
            operation_time_from: None,
            operation_time_to: None,
            next_run_time: None,
            last_run_time: None,
            lock_holder: None,
            lock_time: None,
            lock_epoch: 0,
            params: json!({}),
            policy: None,
            retry_of: None,
            failed_attempts: 0,
            created_at: t0,
            updated_at: t0,
        },
    ];
    let action_details = vec![
        detail(61, 51, 41, 0),
        ActionDetail {
            params: json!({"body": "ü", "n": -1}),
            ..detail(62, 51, 42, 1)
        },
        detail(63, 52, 41, -7),
    ];
    PlanData {
        scope: PlanScope::Full,
        brands,
        branches,
        rules,
        brand_rules,
        action_templates,
        branch_rules,
        action_details,
        action_details_cut: None,
    }
}

fn detail(n: u32, branch_rule: u32, template: u32, position: i32) -> ActionDetail {
    ActionDetail {
        id: id(n),
        branch_rule_id: id(branch_rule),
        action_template_id: id(template),
        position,
        params: json!({}),
        created_at: 1,
        updated_at: 2,
    }
}

async fn insert_all(store: &Store, data: &PlanData) {
    for brand in &data.brands {
        store.insert_brand(brand).await.unwrap();
    }
    for branch in &data.branches {
        store.insert_branch(branch).await.unwrap();
    }
    for rule in &data.rules {
        store.insert_rule(rule).await.unwrap();
    }
    for brand_rule in &data.brand_rules {
        store.insert_brand_rule(brand_rule).await.unwrap();
    }
    for template in &data.action_templates {
        store.insert_action_template(template).await.unwrap();
    }
    for branch_rule in &data.branch_rules {
        store.insert_branch_rule(branch_rule).await.unwrap();
    }
    for detail in &data.action_details {
        store.insert_action_detail(detail).await.unwrap();
    }
}

fn sorted_by_id<T: Clone>(items: &[T], key: impl Fn(&T) -> Uuid) -> Vec<T> {
    let mut items = items.to_vec();
    items.sort_by_key(|item| key(item).hyphenated().to_string());
    items
}

async fn column_names(store: &Store, table: &str) -> Vec<String> {
    let mut names: Vec<String> = match store {
        Store::Sqlite(pool) => sqlx::query_scalar("SELECT name FROM pragma_table_info($1)")
            .bind(table)
            .fetch_all(pool)
            .await
            .unwrap(),
        Store::Postgres(pool) => sqlx::query_scalar(
            "SELECT column_name::text FROM information_schema.columns \
             WHERE table_schema = current_schema() AND table_name = $1",
        )
        .bind(table)
        .fetch_all(pool)
        .await
        .unwrap(),
    };
    names.sort();
    names
}

async fn count(store: &Store, sql: &'static str) -> i64 {
    match store {
        Store::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
        Store::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
    }
}

fn expect_decode_error(result: Result<PlanData, StoreError>, table: &str, row: &str, column: &str) {
    match result {
        Err(StoreError::Decode {
            table: t,
            id,
            column: c,
            message,
        }) => {
            assert_eq!((t, id.as_str(), c), (table, row, column), "{message}");
        }
        other => panic!("expected a decode error on {table}.{column}, got {other:?}"),
    }
}

// ---- schema ------------------------------------------------------------------

both_backends!(migrations_are_idempotent, |db: TestDb| async move {
    let store = db.store().await;
    store.migrate().await.unwrap();
    // A second instance starting against the same database.
    let other = db.store().await;
    other.migrate().await.unwrap();
    let migrations = std::fs::read_dir(format!("migrations/{}", db.backend))
        .unwrap()
        .count() as i64;
    assert_eq!(
        count(&store, "SELECT COUNT(*) FROM _sqlx_migrations").await,
        migrations,
        "each migration recorded once"
    );
    assert_eq!(store.backend(), db.backend);
    other.close().await;
    store.close().await;
});

both_backends!(
    every_table_has_the_design_columns,
    |db: TestDb| async move {
        let store = db.store().await;
        for (table, columns) in DESIGN_COLUMNS {
            let mut expected: Vec<String> = columns.iter().map(|c| c.to_string()).collect();
            expected.extend(["created_at".to_string(), "updated_at".to_string()]);
            // DESIGN §5: who changed each catalog row; brands, branches and
            // rules with history are archived, not deleted.
            if CATALOG_TABLES.contains(table) {
                expected.extend(["created_by".to_string(), "updated_by".to_string()]);
            }
            if ["brands", "branches", "rules"].contains(table) {
                expected.push("archived_at".to_string());
            }
            // A graceful stop under way: dealt no partitions, still
            // heartbeating (README, "A graceful stop").
            if *table == "instances" {
                expected.push("leaving_at".to_string());
            }
            expected.sort();
            assert_eq!(column_names(&store, table).await, expected, "table {table}");
        }
        store.close().await;
    }
);

both_backends!(defaults_fill_omitted_columns, |db: TestDb| async move {
    let store = db.store().await;
    insert_all(&store, &fixture()).await;
    let new = id(99);
    store
        .execute_sql(&format!(
            "INSERT INTO branch_rules (id, branch_id, rule_id) VALUES ('{new}', '{}', '{}')",
            id(11),
            id(21)
        ))
        .await
        .unwrap();
    let data = store.load_plan_data(CAP).await.unwrap();
    let row = data.branch_rules.iter().find(|r| r.id == new).unwrap();
    assert!(row.is_active);
    assert!(!row.is_archived && !row.is_force_stopped && !row.is_currently_running);
    assert_eq!(row.lock_epoch, 0);
    assert_eq!(row.params, json!({}));
    assert_eq!(
        (&row.policy, row.retry_of, row.failed_attempts),
        (&None, None, 0)
    );
    assert!(row.created_at > 1_700_000_000_000 && row.updated_at >= row.created_at);
    store.close().await;
});

// ---- round trips -------------------------------------------------------------

both_backends!(
    insert_and_load_round_trip_every_model,
    |db: TestDb| async move {
        let store = db.store().await;
        let data = fixture();
        insert_all(&store, &data).await;

        let loaded = store.load_plan_data(CAP).await.unwrap();
        assert_eq!(loaded.brands, sorted_by_id(&data.brands, |x| x.id));
        assert_eq!(loaded.branches, sorted_by_id(&data.branches, |x| x.id));
        assert_eq!(loaded.rules, sorted_by_id(&data.rules, |x| x.id));
        assert_eq!(
            loaded.brand_rules,
            sorted_by_id(&data.brand_rules, |x| x.id)
        );
        assert_eq!(
            loaded.action_templates,
            sorted_by_id(&data.action_templates, |x| x.id)
        );
        // Archived ones included: filtering is the plan's job.
        assert_eq!(
            loaded.branch_rules,
            sorted_by_id(&data.branch_rules, |x| x.id)
        );
        assert_eq!(loaded.action_details, data.action_details);
        store.close().await;
    }
);

both_backends!(empty_database_loads_empty_plan, |db: TestDb| async move {
    let store = db.store().await;
    assert_eq!(
        store.load_plan_data(CAP).await.unwrap(),
        PlanData::default()
    );
    store.close().await;
});

both_backends!(
    action_steps_of_many_rules_come_in_one_answer_in_position_order,
    |db: TestDb| async move {
        let store = db.store().await;
        let data = fixture();
        insert_all(&store, &data).await;
        let template = |n: u32| {
            data.action_templates
                .iter()
                .find(|t| t.id == id(n))
                .cloned()
        };
        let detail_of = |n: u32| {
            data.action_details
                .iter()
                .find(|d| d.id == id(n))
                .cloned()
                .unwrap()
        };
        // 1,200 ids: the statement binds each id, so they go in chunks;
        // 51 and 52 sit in different ones, among ids with no details.
        let mut asked: Vec<Uuid> = (1_000..2_200).map(id).collect();
        asked[0] = id(52);
        asked[1_100] = id(51);
        let steps = store.action_steps_of(&asked).await.unwrap();

        assert_eq!(steps.len(), asked.len(), "every id asked for is answered");
        assert_eq!(
            steps[&id(51)],
            vec![(detail_of(61), template(41)), (detail_of(62), template(42))]
        );
        assert_eq!(steps[&id(52)], vec![(detail_of(63), template(41))]);
        assert!(steps[&id(1_001)].is_empty());
        assert_eq!(store.action_steps(id(51)).await.unwrap(), steps[&id(51)]);
        assert!(store.action_steps(id(9_999)).await.unwrap().is_empty());
        assert!(store.action_steps_of(&[]).await.unwrap().is_empty());
        store.close().await;
    }
);

both_backends!(
    action_details_are_capped_in_order,
    |db: TestDb| async move {
        let store = db.store().await;
        let mut data = fixture();
        data.action_details.clear();
        insert_all(&store, &data).await;
        // Inserted out of order so only ORDER BY can produce the expected list.
        let mut details = Vec::new();
        for (branch_rule, base) in [(52, 200), (51, 100)] {
            for position in (0..5).rev() {
                details.push(detail(
                    base + position as u32,
                    branch_rule,
                    41,
                    position * 10,
                ));
            }
        }
        for d in &details {
            store.insert_action_detail(d).await.unwrap();
        }
        let mut expected = details.clone();
        expected.sort_by_key(|d| (d.branch_rule_id.hyphenated().to_string(), d.position));

        let all = store.load_plan_data(CAP).await.unwrap();
        assert_eq!(all.action_details, expected);
        assert_eq!(all.action_details_cut, None, "nothing was cut");
        let capped = store.load_plan_data(7).await.unwrap();
        assert_eq!(capped.action_details, expected[..7]);
        assert_eq!(
            capped.action_details_cut,
            Some(expected[6].branch_rule_id),
            "the cut falls in the second rule's details"
        );

        // A row under the cap that does not decode still took its place:
        // the cut is where it was, not missed (which would leave the rules
        // past it with no steps at all).
        store
            .execute_sql(&format!(
                "UPDATE action_details SET params = '{{not json' WHERE id = '{}'",
                expected[0].id
            ))
            .await
            .unwrap();
        let with_a_bad_row = store.load_plan(7, None).await.unwrap();
        assert_eq!(with_a_bad_row.data.action_details, expected[1..7]);
        assert_eq!(with_a_bad_row.rejected.len(), 1);
        assert_eq!(
            with_a_bad_row.data.action_details_cut,
            Some(expected[6].branch_rule_id)
        );
        assert!(
            store
                .load_plan_data(0)
                .await
                .unwrap()
                .action_details
                .is_empty()
        );
        store.close().await;
    }
);

both_backends!(
    concurrent_writers_and_readers_do_not_collide,
    tokio::test(flavor = "multi_thread", worker_threads = 4),
    |db: TestDb| async move {
        let store = db.store().await;
        let mut tasks = Vec::new();
        for writer in 0..8u32 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                for n in 0..25u32 {
                    let brand = Brand {
                        id: id(1000 + writer * 100 + n),
                        name: format!("w{writer}-{n}"),
                        settings: json!({}),
                        created_at: 1,
                        updated_at: 1,
                    };
                    store.insert_brand(&brand).await.unwrap();
                }
            }));
        }
        for _ in 0..4 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..10 {
                    store.load_plan_data(CAP).await.unwrap();
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(store.load_plan_data(CAP).await.unwrap().brands.len(), 200);
        store.close().await;
    }
);

// ---- constraints -------------------------------------------------------------

both_backends!(
    executions_unique_key_rejects_a_duplicate,
    |db: TestDb| async move {
        let store = db.store().await;
        insert_all(&store, &fixture()).await;
        let insert = |execution: Uuid, attempt: i64| {
            format!(
                "INSERT INTO executions (id, branch_rule_id, scheduled_for, status, attempt, owner, requested_at) \
             VALUES ('{execution}', '{}', 1000, 'requested', {attempt}, 'host-a', 1000)",
                id(51)
            )
        };
        assert_eq!(store.execute_sql(&insert(id(71), 1)).await.unwrap(), 1);
        let error = store.execute_sql(&insert(id(72), 1)).await.unwrap_err();
        assert!(error.is_unique_violation(), "{error}");
        assert!(!error.is_transient());
        // The retry of a lost occurrence is a new attempt, which is allowed.
        assert_eq!(store.execute_sql(&insert(id(73), 2)).await.unwrap(), 1);
        store.close().await;
    }
);

both_backends!(
    check_constraints_refuse_unknown_statuses,
    |db: TestDb| async move {
        let store = db.store().await;
        insert_all(&store, &fixture()).await;
        let error = store
        .execute_sql("INSERT INTO rules (id, name, status, cron_expression) VALUES ('r', 'n', 'paused', '* * * * *')")
        .await
        .unwrap_err();
        assert_eq!(
            error.db_error_kind(),
            Some(sqlx::error::ErrorKind::CheckViolation),
            "{error}"
        );
        let error = store
            .execute_sql(&format!(
                "INSERT INTO executions (id, branch_rule_id, scheduled_for, status, requested_at) \
             VALUES ('e', '{}', 1, 'done', 1)",
                id(51)
            ))
            .await
            .unwrap_err();
        assert_eq!(
            error.db_error_kind(),
            Some(sqlx::error::ErrorKind::CheckViolation),
            "{error}"
        );
        store.close().await;
    }
);

both_backends!(deleting_a_template_in_use_fails, |db: TestDb| async move {
    let store = db.store().await;
    insert_all(&store, &fixture()).await;
    let delete_template = format!("DELETE FROM action_templates WHERE id = '{}'", id(42));
    let error = store.execute_sql(&delete_template).await.unwrap_err();
    assert!(error.is_foreign_key_violation(), "{error}");
    assert!(error.to_string().contains("execute_sql"), "{error}");

    store
        .execute_sql(&format!(
            "DELETE FROM action_details WHERE id = '{}'",
            id(62)
        ))
        .await
        .unwrap();
    assert_eq!(store.execute_sql(&delete_template).await.unwrap(), 1);
    store.close().await;
});

both_backends!(deletes_cascade_or_set_null, |db: TestDb| async move {
    let store = db.store().await;
    insert_all(&store, &fixture()).await;

    store
        .execute_sql(&format!("DELETE FROM brand_rules WHERE id = '{}'", id(31)))
        .await
        .unwrap();
    let data = store.load_plan_data(CAP).await.unwrap();
    let kept = data.branch_rules.iter().find(|r| r.id == id(51)).unwrap();
    assert_eq!(kept.brand_rule_id, None);

    store
        .execute_sql(&format!("DELETE FROM brands WHERE id = '{}'", id(1)))
        .await
        .unwrap();
    let data = store.load_plan_data(CAP).await.unwrap();
    let ids = |v: Vec<Uuid>| v.into_iter().map(|u| u.to_string()).collect::<Vec<_>>();
    assert_eq!(
        ids(data.brands.iter().map(|x| x.id).collect()),
        ids(vec![id(2)])
    );
    assert_eq!(
        ids(data.branches.iter().map(|x| x.id).collect()),
        ids(vec![id(12)])
    );
    // The brand's own rule goes; the global rule stays.
    assert_eq!(
        ids(data.rules.iter().map(|x| x.id).collect()),
        ids(vec![id(21)])
    );
    // Branch rule 52 used rule 22 (brand 1), 51 used branch 11 (brand 1).
    assert!(data.branch_rules.is_empty());
    assert!(data.action_details.is_empty());
    assert_eq!(data.action_templates.len(), 2);
    store.close().await;
});

// ---- decode errors -----------------------------------------------------------

both_backends!(
    bad_stored_values_name_table_row_and_column,
    |db: TestDb| async move {
        let store = db.store().await;
        insert_all(&store, &fixture()).await;
        let row = id(51).to_string();

        store
            .execute_sql(&format!(
                "UPDATE branch_rules SET operation_time_to = '25:99' WHERE id = '{row}'"
            ))
            .await
            .unwrap();
        let result = store.load_plan_data(CAP).await;
        let message = result.as_ref().unwrap_err().to_string();
        assert!(
            message.contains("branch_rules.operation_time_to")
                && message.contains(&row)
                && message.contains("25:99"),
            "{message}"
        );
        expect_decode_error(result, "branch_rules", &row, "operation_time_to");
        store
            .execute_sql(&format!(
                "UPDATE branch_rules SET operation_time_to = NULL WHERE id = '{row}'"
            ))
            .await
            .unwrap();

        store
            .execute_sql(&format!(
                "UPDATE branch_rules SET params = '{{not json' WHERE id = '{row}'"
            ))
            .await
            .unwrap();
        expect_decode_error(
            store.load_plan_data(CAP).await,
            "branch_rules",
            &row,
            "params",
        );
        store
            .execute_sql(&format!(
                "UPDATE branch_rules SET params = '{{}}' WHERE id = '{row}'"
            ))
            .await
            .unwrap();

        store
            .execute_sql(
                "INSERT INTO action_templates (id, name, kind) VALUES ('not-a-uuid', 'x', 'noop')",
            )
            .await
            .unwrap();
        let result = store.load_plan_data(CAP).await;
        assert!(
            result
                .as_ref()
                .unwrap_err()
                .to_string()
                .contains("not-a-uuid")
        );
        expect_decode_error(result, "action_templates", "not-a-uuid", "id");
        store
            .execute_sql("DELETE FROM action_templates WHERE id = 'not-a-uuid'")
            .await
            .unwrap();

        assert!(store.load_plan_data(CAP).await.is_ok());
        store.close().await;
    }
);

// ---- connection --------------------------------------------------------------

both_backends!(ping_backend_and_close, |db: TestDb| async move {
    let store = db.store().await;
    store.ping().await.unwrap();
    assert_eq!(store.backend(), db.backend);
    let expected = match db.backend {
        Backend::Sqlite => "sqlite",
        Backend::Postgres => "postgres",
    };
    assert_eq!(store.backend().to_string(), expected);
    let clone = store.clone();
    store.close().await;
    assert!(clone.ping().await.is_err());
});

#[tokio::test]
async fn connect_rejects_unknown_schemes_by_name() {
    for (url, scheme) in [
        ("mysql://root@localhost/db", "mysql"),
        ("data/ruled.db", ""),
    ] {
        match Store::connect(url).await {
            Err(error @ StoreError::InvalidUrl { .. }) => {
                let StoreError::InvalidUrl { scheme: named } = &error else {
                    unreachable!()
                };
                assert_eq!(named, scheme);
                assert!(
                    error.to_string().contains(&format!("{scheme:?}")),
                    "{error}"
                );
            }
            other => panic!("{url}: expected InvalidUrl, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn postgres_connect_errors_mask_the_password() {
    // An unknown role is refused at once (an unreachable server would be
    // retried until the acquire timeout, still failing the same way).
    let error = Store::connect("postgres://ruled_no_such_role:hunter2@127.0.0.1:5432/test")
        .await
        .unwrap_err();
    let message = error.to_string();
    assert!(
        matches!(
            error,
            StoreError::Connect {
                backend: Backend::Postgres,
                ..
            }
        ),
        "{message}"
    );
    assert!(
        !message.contains("hunter2") && message.contains("ruled_no_such_role:***@127.0.0.1:5432"),
        "{message}"
    );
}

#[tokio::test]
async fn sqlite_file_store_creates_directories_and_sets_pragmas() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a/b/ruled.db");
    let store = Store::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    assert!(path.exists());
    let Store::Sqlite(pool) = &store else {
        panic!("expected SQLite")
    };
    let journal_mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(journal_mode, "wal");
    let pragma = |name: &'static str| async move {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(format!("PRAGMA {name}")))
            .fetch_one(pool)
            .await
            .unwrap()
    };
    assert_eq!(pragma("foreign_keys").await, 1);
    assert_eq!(pragma("synchronous").await, 1); // NORMAL
    assert_eq!(pragma("busy_timeout").await, 5000);
    store.close().await;
}

/// SQL can store text that is not UTF-8 in SQLite. The plan's read sets
/// such a row aside with its column named, as it does any row that does
/// not decode, and reads the rest: it must neither fail the whole read nor
/// bring the process down.
#[tokio::test]
async fn sqlite_text_that_is_not_utf8_sets_its_row_aside() {
    let db = common::sqlite_db().await;
    let store = db.store().await;
    insert_all(&store, &fixture()).await;
    let broken = id(51);
    store
        .execute_sql(&format!(
            "UPDATE branch_rules SET params = CAST(x'7bff7d' AS TEXT) WHERE id = '{broken}'"
        ))
        .await
        .unwrap();
    let load = store.load_plan(CAP, None).await.unwrap();
    let rejected: Vec<_> = load
        .rejected
        .iter()
        .map(|row| (row.table.as_str(), row.id.as_str(), row.field.as_str()))
        .collect();
    assert_eq!(
        rejected,
        [("branch_rules", broken.to_string().as_str(), "params")]
    );
    assert!(load.data.branch_rules.iter().all(|r| r.id != broken));
    assert_eq!(
        load.data.branch_rules.len(),
        fixture().branch_rules.len() - 1,
        "every other branch rule is read"
    );
    expect_decode_error(
        store.load_plan_data(CAP).await,
        "branch_rules",
        &broken.to_string(),
        "params",
    );
    store.close().await;
}

#[tokio::test]
async fn sqlite_memory_stores_are_private_and_usable() {
    let a = Store::connect("sqlite::memory:").await.unwrap();
    let b = Store::connect("sqlite::memory:").await.unwrap();
    a.migrate().await.unwrap();
    b.migrate().await.unwrap();
    let data = fixture();
    insert_all(&a, &data).await;
    assert_eq!(a.load_plan_data(CAP).await.unwrap().brands.len(), 2);
    assert!(b.load_plan_data(CAP).await.unwrap().brands.is_empty());
}

#[test]
fn test_database_urls_replace_only_the_database() {
    use common::with_database;
    assert_eq!(
        with_database("postgres://postgres@127.0.0.1:5432/test", "x"),
        "postgres://postgres@127.0.0.1:5432/x"
    );
    assert_eq!(
        with_database("postgresql://u:p@h/db?sslmode=disable", "x"),
        "postgresql://u:p@h/x?sslmode=disable"
    );
    assert_eq!(with_database("postgres://h:1", "x"), "postgres://h:1/x");
}

both_backends!(
    incremental_reads_return_changed_branch_rules_and_the_count,
    |db: TestDb| async move {
        let store = db.store().await;
        let data = fixture();
        insert_all(&store, &data).await;
        let total = data.branch_rules.len() as u64;
        let newest = data
            .branch_rules
            .iter()
            .map(|r| r.updated_at)
            .max()
            .unwrap();

        let delta = store.load_plan_changes(newest + 1, 1500).await.unwrap();
        assert!(
            delta.branch_rules.is_empty(),
            "nothing changed after the newest row"
        );
        assert_eq!(
            delta.scope,
            PlanScope::Changes {
                since: newest + 1,
                total_branch_rules: total
            }
        );
        assert_eq!(
            delta.branches.len(),
            data.branches.len(),
            "small tables are read whole"
        );

        // An UPDATE that does not mention updated_at still moves it forward.
        let target = data.branch_rules[0].id;
        store
            .execute_sql(&format!(
                "UPDATE branch_rules SET is_active = FALSE WHERE id = '{target}'"
            ))
            .await
            .unwrap();
        let delta = store.load_plan_changes(newest + 1, 1500).await.unwrap();
        assert_eq!(delta.branch_rules.len(), 1);
        assert_eq!(delta.branch_rules[0].id, target);
        assert!(!delta.branch_rules[0].is_active);

        // An update that sets updated_at itself keeps its value.
        store
            .execute_sql(&format!(
                "UPDATE branch_rules SET updated_at = 5 WHERE id = '{target}'"
            ))
            .await
            .unwrap();
        let full = store.load_plan_data(1500).await.unwrap();
        assert_eq!(full.scope, PlanScope::Full);
        let row = full.branch_rules.iter().find(|r| r.id == target).unwrap();
        assert_eq!(row.updated_at, 5);

        store
            .execute_sql(&format!("DELETE FROM branch_rules WHERE id = '{target}'"))
            .await
            .unwrap();
        let delta = store.load_plan_changes(0, 1500).await.unwrap();
        assert_eq!(
            delta.scope,
            PlanScope::Changes {
                since: 0,
                total_branch_rules: total - 1
            }
        );
    }
);
