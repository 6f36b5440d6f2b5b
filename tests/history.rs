//! History is kept (issue 12): deleting a brand, branch, rule or branch
//! rule with executions is refused with 409; `?cascade=archive` archives
//! instead (hidden from listings and the plan, history kept) and cancels a
//! running job below it. Rows without executions are still deleted. Real
//! HTTP on a loopback port, a real service, SQLite and PostgreSQL.

mod common;

use std::time::Duration;

use common::api::Api;
use common::eventually;
use common::service::{ready_ids, start_service_with, without_delays};
use ruled::config::Config;
use serde_json::{Value, json};
use uuid::Uuid;

const TOKEN: &str = "history-token";
const DEADLINE: Duration = Duration::from_secs(20);

fn with_token(config: Config) -> Config {
    Config {
        api_token: Some(TOKEN.into()),
        ..without_delays(config)
    }
}

async fn create(api: &Api, path: &str, body: Value) -> String {
    let reply = api.post(path, &body).await;
    assert!(reply.status.is_success(), "{path}: {}", reply.text);
    reply.json["id"].as_str().unwrap().to_string()
}

/// A brand with one branch, a brand-owned rule and a branch rule due now
/// whose one action is `action`.
struct Tree {
    brand: String,
    branch: String,
    rule: String,
    branch_rule: String,
}

async fn tree(api: &Api, kind: &str, config: Value) -> Tree {
    tree_due_at(api, kind, config, chrono::Utc::now()).await
}

/// [`tree`], with the branch rule's next run at `due`.
async fn tree_due_at(
    api: &Api,
    kind: &str,
    config: Value,
    due: chrono::DateTime<chrono::Utc>,
) -> Tree {
    let brand = create(api, "/api/v1/brands", json!({"name": "history"})).await;
    let branch = create(
        api,
        "/api/v1/branches",
        json!({"brand_id": brand, "name": "b", "timezone": "UTC"}),
    )
    .await;
    let rule = create(
        api,
        "/api/v1/rules",
        json!({"brand_id": brand, "name": "r", "cron_expression": "0 0 1 1 *"}),
    )
    .await;
    let template = create(
        api,
        "/api/v1/action-templates",
        json!({"name": "t", "kind": kind, "config": config}),
    )
    .await;
    let branch_rule = create(
        api,
        "/api/v1/branch-rules",
        json!({
            "branch_id": branch, "rule_id": rule,
            "next_run_time": due.to_rfc3339(),
            "action_details": [{"action_template_id": template}],
        }),
    )
    .await;
    Tree {
        brand,
        branch,
        rule,
        branch_rule,
    }
}

async fn executions(api: &Api, branch_rule: &str) -> Vec<Value> {
    let reply = api
        .get(&format!("/api/v1/executions?branch_rule_id={branch_rule}"))
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    reply.json["items"].as_array().unwrap().clone()
}

async fn wait_for_status(api: &Api, branch_rule: &str, status: &str) -> Value {
    eventually(DEADLINE, &format!("an execution {status}"), || async {
        executions(api, branch_rule)
            .await
            .iter()
            .any(|e| e["status"] == status)
    })
    .await;
    executions(api, branch_rule)
        .await
        .into_iter()
        .find(|e| e["status"] == status)
        .unwrap()
}

fn listed(list: &Value, id: &str) -> bool {
    list.as_array()
        .unwrap()
        .iter()
        .any(|row| row["id"].as_str() == Some(id))
}

both_backends!(
    delete_with_history_is_refused_and_archive_cancels_the_running_job,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: common::TestDb| async move {
        // The whole TestDb, not only its url: dropping it drops the database.
        let db = db;
        let running = start_service_with(&db.url, with_token).await;
        let api = Api::new(&running.service);
        let t = tree(&api, "sleep", json!({"ms": 30_000})).await;
        let job = wait_for_status(&api, &t.branch_rule, "running").await;

        // Every level refuses while history exists, and nothing is deleted.
        for path in [
            format!("/api/v1/brands/{}", t.brand),
            format!("/api/v1/branches/{}", t.branch),
            format!("/api/v1/rules/{}", t.rule),
            format!("/api/v1/branch-rules/{}", t.branch_rule),
        ] {
            let reply = api.delete(&path).await;
            assert_eq!(reply.status, 409, "{path}: {}", reply.text);
            assert!(
                reply.error_message().contains("?cascade=archive"),
                "{path}: {}",
                reply.text
            );
            assert_eq!(api.get(&path).await.status, 200, "{path} survived");
        }
        let bad = api
            .delete(&format!("/api/v1/brands/{}?cascade=erase", t.brand))
            .await;
        assert_eq!(bad.status, 400, "{}", bad.text);
        assert!(bad.text.contains("cascade"), "{}", bad.text);

        // Archive the brand: the running 30 s sleep ends cancelled.
        let archived = api
            .delete(&format!("/api/v1/brands/{}?cascade=archive", t.brand))
            .await;
        assert_eq!(archived.status, 200, "{}", archived.text);
        assert_eq!(
            archived.json["branch_rules_archived"],
            json!([t.branch_rule])
        );
        assert_eq!(
            archived.json["cancelled"][0]["execution_id"], job["id"],
            "{}",
            archived.text
        );
        let started = std::time::Instant::now();
        let cancelled = wait_for_status(&api, &t.branch_rule, "cancelled").await;
        assert_eq!(cancelled["id"], job["id"]);
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the sleep ran on"
        );

        // History kept; the rows have left the catalog (gone by id: a 410
        // that says so, where a row never created is a 404) and the plan,
        // and are listed with ?archived=true, with the time they were
        // archived.
        assert_eq!(executions(&api, &t.branch_rule).await.len(), 1);
        for (list, id, change) in [
            ("/api/v1/brands", &t.brand, json!({"name": "renamed"})),
            ("/api/v1/branches", &t.branch, json!({"name": "renamed"})),
            ("/api/v1/rules", &t.rule, json!({"name": "renamed"})),
            (
                "/api/v1/branch-rules",
                &t.branch_rule,
                json!({"is_active": false}),
            ),
        ] {
            assert!(!listed(&api.get(list).await.json, id), "{list} lists {id}");
            let row = api.get(&format!("{list}/{id}")).await;
            assert_eq!(row.status, 410, "{}", row.text);
            assert_eq!(row.error_code(), "archived", "{}", row.text);
            assert!(row.error_message().contains("archived"), "{}", row.text);
            // Nor can it be changed: the same 410, and nothing written.
            let put = api.put(&format!("{list}/{id}"), &change).await;
            assert_eq!(put.status, 410, "PUT {list}/{id}: {}", put.text);
            assert_eq!(put.error_code(), "archived", "{}", put.text);
            let archived = api.get(&format!("{list}?archived=true")).await.json;
            assert!(listed(&archived, id), "{list}?archived=true omits {id}");
            let shown = archived
                .as_array()
                .unwrap()
                .iter()
                .find(|row| row["id"] == id.as_str())
                .unwrap();
            for (field, refused) in change.as_object().unwrap() {
                assert_ne!(&shown[field], refused, "PUT {list}/{id} wrote {field}");
            }
            assert!(
                shown["archived_at"].is_string() || shown["is_archived"] == true,
                "{shown}"
            );
        }
        let id = Uuid::parse_str(&t.branch_rule).unwrap();
        assert!(!ready_ids(&running.service).await.contains(&id));
        // A row without history is deleted as before.
        let empty = create(&api, "/api/v1/brands", json!({"name": "no history"})).await;
        let path = format!("/api/v1/brands/{empty}");
        assert_eq!(api.delete(&path).await.status, 204);
        assert_eq!(api.get(&path).await.status, 404);

        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    a_rule_with_finished_runs_is_archived_not_erased,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: common::TestDb| async move {
        // The whole TestDb, not only its url: dropping it drops the database.
        let db = db;
        let running = start_service_with(&db.url, with_token).await;
        let api = Api::new(&running.service);
        let t = tree(&api, "noop", json!({})).await;
        wait_for_status(&api, &t.branch_rule, "completed").await;

        let path = format!("/api/v1/rules/{}", t.rule);
        let refused = api.delete(&path).await;
        assert_eq!(refused.status, 409, "{}", refused.text);
        let archived = api.delete(&format!("{path}?cascade=archive")).await;
        assert_eq!(archived.status, 200, "{}", archived.text);
        assert_eq!(archived.json["cancelled"], json!([]));
        assert!(!listed(&api.get("/api/v1/rules").await.json, &t.rule));
        // The brand and branch are untouched; the branch rule is archived.
        assert!(listed(&api.get("/api/v1/brands").await.json, &t.brand));
        assert!(listed(&api.get("/api/v1/branches").await.json, &t.branch));
        let archived = api.get("/api/v1/branch-rules?archived=true").await.json;
        assert!(listed(&archived, &t.branch_rule), "{archived}");
        let history = executions(&api, &t.branch_rule).await;
        assert_eq!(history.len(), 1);
        assert_eq!(history[0]["status"], "completed");

        running.service.shutdown("test").await.unwrap();
    }
);

/// The refusal and the delete are one step: a claim another instance has
/// in flight when the delete comes (its branch rule locked, its execution
/// inserted, not yet committed) either lands before the count, which then
/// sees its execution, or not at all. Checked first and deleted after, the
/// delete waited for the claim's row lock and then let the cascade erase
/// the execution the claim had just committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_in_flight_during_a_delete_is_not_erased_by_it() {
    let Some(db) = common::postgres_db().await else {
        return;
    };
    let running = start_service_with(&db.url, with_token).await;
    let api = Api::new(&running.service);
    let next_year = chrono::Utc::now() + chrono::Duration::days(365);
    let t = tree_due_at(&api, "noop", json!({}), next_year).await;
    let store = db.store().await;
    let ruled::store::Store::Postgres(pool) = &store else {
        unreachable!("a PostgreSQL test database")
    };

    // Another instance's claim, half done: the rule locked and its
    // execution inserted in a transaction not yet committed.
    let now = chrono::Utc::now().timestamp_millis();
    let mut peer = pool.begin().await.unwrap();
    let peer_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *peer)
        .await
        .unwrap();
    sqlx::query(
        "UPDATE branch_rules SET lock_holder = 'peer', lock_time = $1, \
         lock_epoch = lock_epoch + 1, is_currently_running = TRUE WHERE id = $2",
    )
    .bind(now)
    .bind(&t.branch_rule)
    .execute(&mut *peer)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO executions (id, branch_rule_id, scheduled_for, status, attempt, owner, \
         lock_epoch, requested_at, created_at, updated_at) \
         VALUES ($1, $2, $3, 'requested', 1, 'peer', 1, $3, $3, $3)",
    )
    .bind(Uuid::new_v4().to_string())
    .bind(&t.branch_rule)
    .bind(now)
    .execute(&mut *peer)
    .await
    .unwrap();

    let deleter = api.with_token(TOKEN);
    let path = format!("/api/v1/branches/{}", t.branch);
    let delete = tokio::spawn(async move { deleter.delete(&path).await });
    eventually(
        DEADLINE,
        "the delete waiting for the claim's row lock",
        || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND $1 = ANY(pg_blocking_pids(pid))",
            )
            .bind(peer_pid)
            .fetch_one(pool)
            .await
            .unwrap();
            waiting > 0
        },
    )
    .await;
    peer.commit().await.unwrap();

    let reply = delete.await.unwrap();
    assert_eq!(reply.status, 409, "{}", reply.text);
    assert!(
        reply.error_message().contains("1 execution"),
        "{}",
        reply.text
    );
    let kept: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM executions WHERE branch_rule_id = $1")
        .bind(&t.branch_rule)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(kept, 1, "the claim's execution was erased");
    let branch = api.get(&format!("/api/v1/branches/{}", t.branch)).await;
    assert_eq!(branch.status, 200, "{}", branch.text);

    running.service.shutdown("test").await.unwrap();
}
