//! Bad rows never do harm (issue 12): rows an operator broke with SQL are
//! quarantined — kept out of the plan, named once in the log, counted,
//! listed by `ruled plan`, `/api/v1/plan` and `/readyz` — while every good
//! rule runs on time; a rule whose schedule cannot be computed is held, and
//! no occurrence runs twice. Through the real binary on both backends.

mod common;

use std::process::{Child, Stdio};
use std::time::Duration;

use common::api::metric_sample;
use common::process::{Install, signal, stdout, wait_exit};
use common::rules::{YEARLY, insert_rule, step, yearly_after};
use common::{TestDb, eventually, wait_for_execution};
use ruled::model::{Execution, ExecutionStatus};
use ruled::store::Store;
use serde_json::{Value, json};
use uuid::Uuid;

/// The issue asks for 1,000; this many keeps the test quick on two cores
/// while still being far more good rows than bad ones. Raise it at will.
const GOOD_RULES: usize = 200;
/// From the service's start to a good rule's start: grace, lease, claim.
const ON_TIME: Duration = Duration::from_secs(30);
const DEADLINE: Duration = Duration::from_secs(60);

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// The branch and rule of a branch rule, read back from the database.
async fn parents(store: &Store, branch_rule: Uuid) -> (Uuid, Uuid) {
    // The lenient read: the database holds bad rows by now.
    let row = store
        .load_plan(100_000, None)
        .await
        .unwrap()
        .data
        .branch_rules
        .into_iter()
        .find(|r| r.id == branch_rule)
        .unwrap();
    (row.branch_id, row.rule_id)
}

async fn sql(store: &Store, text: &str) {
    store
        .execute_sql(text)
        .await
        .unwrap_or_else(|e| panic!("{text}: {e}"));
}

async fn executions(store: &Store, id: Uuid) -> Vec<Execution> {
    store.executions_for(id).await.unwrap()
}

/// `ruled serve` with no start-up delays and no rest between jobs.
fn serve_command(install: &Install) -> std::process::Command {
    let mut command = install.command(&["serve"]);
    command
        .env("MASTER_GRACE_PERIOD_SECONDS", "0")
        .env("WORKER_STAGGER_SECONDS", "0")
        .env("WORKER_COOLDOWN_SECONDS", "0");
    command
}

fn serve(install: &Install) -> Child {
    let log = std::fs::File::create(install.path("serve.log")).unwrap();
    serve_command(install)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

fn listening_on(install: &Install) -> String {
    install.listening_addr("serve.log").to_string()
}

async fn get(client: &reqwest::Client, url: &str) -> (u16, String) {
    let response = client.get(url).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

/// Log lines that quarantine the row `id`: one, whatever the refreshes.
fn quarantine_warnings(log: &str, id: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("🚫 Quarantined") && l.contains(&format!(" row {id}:")))
        .count()
}

both_backends!(
    bad_rows_are_quarantined_and_good_rules_run_on_time,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let store = db.store().await;
        let due = now_ms() - 1_000;
        let noop = || vec![step("noop", json!({}))];

        let mut good = Vec::with_capacity(GOOD_RULES);
        for _ in 0..GOOD_RULES {
            good.push(insert_rule(&store, YEARLY, due, &noop()).await);
        }

        // A branch an operator moved to Mars.
        let on_mars = insert_rule(&store, YEARLY, due, &noop()).await;
        let (mars_branch, _) = parents(&store, on_mars).await;
        sql(
            &store,
            &format!("UPDATE branches SET timezone = 'Mars/Olympus' WHERE id = '{mars_branch}'"),
        )
        .await;
        // A rule whose cron became */0.
        let zero_step = insert_rule(&store, YEARLY, due, &noop()).await;
        let (_, zero_rule) = parents(&store, zero_step).await;
        sql(
            &store,
            &format!("UPDATE rules SET cron_expression = '*/0 * * * *' WHERE id = '{zero_rule}'"),
        )
        .await;
        // An action detail whose params are not JSON: its rule must not run
        // without that step.
        let bad_detail_rule = insert_rule(&store, YEARLY, due, &noop()).await;
        sql(&store, &format!("UPDATE action_details SET params = '{{not json' WHERE branch_rule_id = '{bad_detail_rule}'")).await;
        // A template under an id that is not a UUID.
        sql(
            &store,
            "INSERT INTO action_templates (id, name, kind) VALUES ('tmpl-not-a-uuid', 'x', 'noop')",
        )
        .await;
        // A rule that runs (slowly) and whose zone breaks while it runs.
        // Yearly, not every minute: a run that straddles a minute boundary
        // would rightly record that minute's occurrence as an overlap skip,
        // and this test counts the runs. Eight seconds: the broken zone must
        // reach the plan (a refresh away) before the run ends.
        let breaks_while_running =
            insert_rule(&store, YEARLY, due, &[step("sleep", json!({"ms": 8000}))]).await;
        let (running_branch, _) = parents(&store, breaks_while_running).await;

        let install = Install::with_database(&db.url);
        let started = now_ms();
        let mut server = serve(&install);
        let base = format!("http://{}", listening_on(&install));
        let client = common::api::client();

        // Bad branch rules arriving while it runs: the incremental refresh
        // meets them.
        let (branch_id, rule_id) = parents(&store, good[0]).await;
        let window_abc = Uuid::new_v4();
        let t = now_ms();
        sql(&store, &format!(
            "INSERT INTO branch_rules (id, branch_id, rule_id, operation_time_from, operation_time_to, next_run_time, created_at, updated_at) \
             VALUES ('{window_abc}', '{branch_id}', '{rule_id}', 'abc', '06:00', {due}, {t}, {t})"
        )).await;
        sql(&store, &format!(
            "INSERT INTO branch_rules (id, branch_id, rule_id, next_run_time, created_at, updated_at) \
             VALUES ('br-not-a-uuid', '{branch_id}', '{rule_id}', {due}, {t}, {t})"
        )).await;

        // The zone breaks while the slow rule runs: that execution records
        // why it has no next run, and the rule is held.
        wait_for_execution(
            &store,
            breaks_while_running,
            ExecutionStatus::Running,
            DEADLINE,
        )
        .await;
        sql(
            &store,
            &format!("UPDATE branches SET timezone = 'Mars/Olympus' WHERE id = '{running_branch}'"),
        )
        .await;
        eventually(DEADLINE, "the slow rule's execution to end", || async {
            executions(&store, breaks_while_running)
                .await
                .iter()
                .all(|e| e.status.is_terminal())
        })
        .await;
        let ran = executions(&store, breaks_while_running).await;
        assert_eq!(ran.len(), 1, "{ran:?}");
        let error = ran[0].error.clone().unwrap_or_default();
        assert!(
            error.contains(&format!(
                "no next run: invalid time zone \"Mars/Olympus\" on branch {running_branch}"
            )),
            "{error}"
        );

        // Every good rule runs, once, on time; so does one added later.
        let late = insert_rule(&store, YEARLY, now_ms() - 1_000, &noop()).await;
        good.push(late);
        for id in &good {
            eventually(DEADLINE, "every good rule to complete", || async {
                executions(&store, *id)
                    .await
                    .iter()
                    .any(|e| e.status == ExecutionStatus::Completed)
            })
            .await;
        }
        for id in &good {
            let runs = executions(&store, *id).await;
            assert_eq!(runs.len(), 1, "rule {id} ran {} times", runs.len());
            let began = runs[0].started_at.unwrap();
            assert!(
                began - started.max(runs[0].scheduled_for) <= ON_TIME.as_millis() as i64,
                "rule {id} started {} ms late",
                began - started
            );
        }

        // Each bad row is listed, with the rules it holds.
        let bad_rows = [
            ("branches", mars_branch.to_string(), "zone"),
            ("branches", running_branch.to_string(), "zone"),
            ("rules", zero_rule.to_string(), "cron"),
            ("branch_rules", window_abc.to_string(), "window"),
            ("branch_rules", "br-not-a-uuid".to_string(), "decode"),
            ("action_templates", "tmpl-not-a-uuid".to_string(), "decode"),
        ];
        let held = [on_mars, zero_step, bad_detail_rule, breaks_while_running];

        let plan = install.run(&["plan"]);
        let listing = stdout(&plan);
        assert!(plan.status.success(), "{listing}");
        for (table, id, _) in &bad_rows {
            assert!(
                listing.contains(&format!("QUARANTINED  {table} {id}")),
                "{table} {id} not listed:\n{listing}"
            );
        }
        assert!(
            listing.contains("QUARANTINED  action_details "),
            "{listing}"
        );
        for id in held {
            let line = listing
                .lines()
                .find(|l| l.starts_with(&id.to_string()))
                .unwrap();
            assert!(line.contains("not ready: held:"), "{line}");
        }

        let (status, body) = get(&client, &format!("{base}/api/v1/plan")).await;
        assert_eq!(status, 200, "{body}");
        let plan: Value = serde_json::from_str(&body).unwrap();
        let quarantined = plan["quarantined"].as_array().unwrap();
        for (table, id, reason) in &bad_rows {
            assert!(
                quarantined
                    .iter()
                    .any(|r| r["table"] == *table && r["id"] == *id && r["reason"] == *reason),
                "{table} {id} not in /api/v1/plan: {quarantined:?}"
            );
        }
        let workflows = plan["workflows"].as_array().unwrap();
        let held_reason = |id: Uuid| {
            workflows
                .iter()
                .find(|w| w["branch_rule"]["id"] == id.to_string())
                .map(|w| w["held"].clone())
                .unwrap_or(Value::Null)
        };
        assert!(
            held_reason(on_mars)
                .as_str()
                .is_some_and(|r| r.contains("Mars/Olympus")),
            "{:?}",
            held_reason(on_mars)
        );
        assert_eq!(held_reason(good[1]), Value::Null);

        let (status, body) = get(&client, &format!("{base}/readyz")).await;
        assert_eq!(status, 200, "{body}");
        let ready: Value = serde_json::from_str(&body).unwrap();
        let warnings = ready["warnings"].as_array().unwrap();
        for (table, id, _) in &bad_rows {
            assert!(
                warnings
                    .iter()
                    .any(|w| w.as_str().unwrap().contains(&format!("{table} row {id}"))),
                "{table} {id} not warned in /readyz: {warnings:?}"
            );
        }

        // Counted once each, and warned once each, however many refreshes.
        let refreshes_now = |text: &str| {
            metric_sample(text, "ruled_plan_refresh_total", &[("result", "ok")]).unwrap_or(0.0)
        };
        let (_, metrics) = get(&client, &format!("{base}/metrics")).await;
        let later = refreshes_now(&metrics) + 10.0;
        eventually(DEADLINE, "ten more refreshes", || async {
            let (_, text) = get(&client, &format!("{base}/metrics")).await;
            refreshes_now(&text) >= later
        })
        .await;
        let (_, metrics) = get(&client, &format!("{base}/metrics")).await;
        let rejected = |table: &str, reason: &str| {
            metric_sample(
                &metrics,
                "ruled_plan_rows_rejected_total",
                &[("table", table), ("reason", reason)],
            )
            .unwrap_or(0.0)
        };
        assert_eq!(rejected("branches", "zone"), 2.0, "{metrics}");
        assert_eq!(rejected("rules", "cron"), 1.0);
        assert_eq!(rejected("branch_rules", "window"), 1.0);
        assert_eq!(rejected("branch_rules", "decode"), 1.0);
        assert_eq!(rejected("action_templates", "decode"), 1.0);
        assert_eq!(rejected("action_details", "decode"), 1.0);
        let log = install.log("serve.log");
        for (_, id, _) in &bad_rows {
            assert_eq!(
                quarantine_warnings(&log, id),
                1,
                "warnings for {id}:\n{log}"
            );
        }

        // Held rules never ran; fixing the value resumes them by themselves.
        for id in [on_mars, zero_step, bad_detail_rule] {
            assert!(
                executions(&store, id).await.is_empty(),
                "held rule {id} ran"
            );
        }
        sql(
            &store,
            &format!("UPDATE branches SET timezone = 'UTC' WHERE id = '{mars_branch}'"),
        )
        .await;
        sql(
            &store,
            &format!("UPDATE rules SET cron_expression = '{YEARLY}' WHERE id = '{zero_rule}'"),
        )
        .await;
        for id in [on_mars, zero_step] {
            eventually(DEADLINE, "a fixed rule to run", || async {
                executions(&store, id)
                    .await
                    .iter()
                    .any(|e| e.status == ExecutionStatus::Completed)
            })
            .await;
        }
        install.wait_for_log(
            "serve.log",
            &format!("branches row {mars_branch} is no longer quarantined"),
        );

        // No occurrence ran twice: the slow rule, held since its zone broke,
        // ran once, and no rule has two executions of one occurrence.
        assert_eq!(executions(&store, breaks_while_running).await.len(), 1);
        let mut every = good.clone();
        every.extend([on_mars, zero_step, bad_detail_rule, breaks_while_running]);
        for id in every {
            let runs = executions(&store, id).await;
            let mut occurrences: Vec<i64> = runs.iter().map(|e| e.scheduled_for).collect();
            occurrences.sort();
            occurrences.dedup();
            assert_eq!(
                occurrences.len(),
                runs.len(),
                "rule {id} repeated an occurrence: {runs:?}"
            );
        }

        signal(&server, libc::SIGTERM);
        let status = wait_exit(&mut server);
        assert_eq!(status.code(), Some(0), "{}", install.log("serve.log"));
        store.close().await;
    }
);

both_backends!(
    rows_broken_in_ways_that_look_valid_neither_stall_rules_nor_lose_a_finish,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let store = db.store().await;
        let due = now_ms() - 1_000;
        let noop = || vec![step("noop", json!({}))];

        // A branch rule under an upper-case id: it parses as a UUID, but no
        // claim or lookup by id (they bind the lower-case form) can match it.
        let neighbour = insert_rule(&store, YEARLY, yearly_after(due), &noop()).await;
        let (branch_id, rule_id) = parents(&store, neighbour).await;
        let upper = Uuid::new_v4().to_string().to_uppercase();
        let t = now_ms();
        sql(&store, &format!(
            "INSERT INTO branch_rules (id, branch_id, rule_id, next_run_time, created_at, updated_at) \
             VALUES ('{upper}', '{branch_id}', '{rule_id}', {due}, {t}, {t})"
        )).await;
        // A running flag no lock stands behind.
        let flagged = insert_rule(&store, YEARLY, due, &noop()).await;
        sql(
            &store,
            &format!("UPDATE branch_rules SET is_currently_running = TRUE WHERE id = '{flagged}'"),
        )
        .await;
        // A row stamped in the year 2100.
        let from_the_future = insert_rule(&store, YEARLY, yearly_after(due), &noop()).await;
        sql(
            &store,
            &format!(
                "UPDATE branch_rules SET updated_at = 4102444800000 WHERE id = '{from_the_future}'"
            ),
        )
        .await;
        // A due rule switched off, to be switched on while the service runs.
        let switched_on_later = insert_rule(&store, YEARLY, due, &noop()).await;
        sql(
            &store,
            &format!("UPDATE branch_rules SET is_active = FALSE WHERE id = '{switched_on_later}'"),
        )
        .await;
        // A rule whose row an operator breaks while it runs.
        let broken_while_running =
            insert_rule(&store, YEARLY, due, &[step("sleep", json!({"ms": 3000}))]).await;

        let install = Install::with_database(&db.url);
        let mut command = serve_command(&install);
        command
            // Only the incremental refreshes may bring what changes below.
            .env("PLAN_FULL_REFRESH_SECONDS", "3600");
        let mut server = install.spawn_logged(&mut command, "serve.log");
        let base = format!("http://{}", listening_on(&install));
        let client = common::api::client();

        wait_for_execution(&store, flagged, ExecutionStatus::Completed, DEADLINE).await;

        wait_for_execution(
            &store,
            broken_while_running,
            ExecutionStatus::Running,
            DEADLINE,
        )
        .await;
        sql(
            &store,
            &format!(
                "UPDATE branch_rules SET params = '{{not json' WHERE id = '{broken_while_running}'"
            ),
        )
        .await;
        // Its action ran: the finish lands, the lock is released, and the
        // row is quarantined, not left running or retried.
        wait_for_execution(
            &store,
            broken_while_running,
            ExecutionStatus::Completed,
            DEADLINE,
        )
        .await;
        install.wait_for_log("serve.log", "its branch rule no longer reads");
        let released = store
            .execute_sql(&format!(
                "UPDATE branch_rules SET lock_epoch = lock_epoch WHERE id = '{broken_while_running}' \
                 AND lock_holder IS NULL AND NOT is_currently_running"
            ))
            .await
            .unwrap();
        assert_eq!(released, 1, "the lock of the broken rule was released");

        // The future updated_at does not hide a later change from the
        // incremental refresh.
        let t = now_ms();
        sql(&store, &format!(
            "UPDATE branch_rules SET is_active = TRUE, updated_at = {t} WHERE id = '{switched_on_later}'"
        )).await;
        wait_for_execution(
            &store,
            switched_on_later,
            ExecutionStatus::Completed,
            DEADLINE,
        )
        .await;

        let (status, body) = get(&client, &format!("{base}/api/v1/plan")).await;
        assert_eq!(status, 200, "{body}");
        let plan: Value = serde_json::from_str(&body).unwrap();
        let quarantined = plan["quarantined"].as_array().unwrap();
        let listed = |id: &str| {
            quarantined
                .iter()
                .find(|r| r["table"] == "branch_rules" && r["id"] == id)
                .cloned()
        };
        let upper_row = listed(&upper).unwrap_or_else(|| panic!("{upper}: {quarantined:?}"));
        assert_eq!(upper_row["reason"], "decode");
        assert!(
            upper_row["message"]
                .as_str()
                .unwrap()
                .contains("canonical form"),
            "{upper_row}"
        );
        let broken = listed(&broken_while_running.to_string())
            .unwrap_or_else(|| panic!("{broken_while_running}: {quarantined:?}"));
        assert_eq!(broken["field"], "params", "{broken}");

        // An execution written by hand, without an owner and with output
        // that is not JSON, is listed with the rest instead of failing the
        // page.
        let by_hand = Uuid::new_v4();
        let t = now_ms();
        sql(&store, &format!(
            "INSERT INTO executions (id, branch_rule_id, scheduled_for, status, attempt, requested_at, finished_at, output, created_at, updated_at) \
             VALUES ('{by_hand}', '{neighbour}', {t}, 'completed', 1, {t}, {t}, 'done by hand', {t}, {t})"
        )).await;
        let (status, body) = get(
            &client,
            &format!("{base}/api/v1/executions?branch_rule_id={neighbour}"),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let listed: Value = serde_json::from_str(&body).unwrap();
        let item = listed["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["id"] == by_hand.to_string())
            .unwrap_or_else(|| panic!("{body}"))
            .clone();
        assert_eq!(item["owner"], "", "{item}");
        let read = executions(&store, neighbour).await;
        let read = read.iter().find(|e| e.id == by_hand).unwrap();
        assert_eq!(read.output, Some(json!("done by hand")));
        let (status, body) = get(&client, &format!("{base}/api/v1/executions/{by_hand}")).await;
        assert_eq!(status, 200, "{body}");

        // Each ran once; the service stops cleanly and starts again.
        for id in [flagged, switched_on_later, broken_while_running] {
            assert_eq!(executions(&store, id).await.len(), 1, "rule {id}");
        }
        signal(&server, libc::SIGTERM);
        let status = wait_exit(&mut server);
        assert_eq!(status.code(), Some(0), "{}", install.log("serve.log"));
        let mut again = install.spawn_logged(&mut install.command(&["serve"]), "again.log");
        let _ = install.listening_addr("again.log");
        signal(&again, libc::SIGTERM);
        let status = wait_exit(&mut again);
        assert_eq!(status.code(), Some(0), "{}", install.log("again.log"));
        store.close().await;
    }
);

both_backends!(
    a_lock_no_live_holder_renews_is_taken_over_once_it_is_stale,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        const LOCK_TIMEOUT_MS: i64 = 6_000;
        let store = db.store().await;
        let due = now_ms() - 1_000;
        let noop = || vec![step("noop", json!({}))];
        // Locks no `instances` row stands behind, so no takeover of a
        // silent instance ever reaches them: written with SQL, left by
        // another deployment, restored from a backup.
        let lock = |id: Uuid, holder: &str, lock_time: Option<i64>| {
            let lock_time = lock_time.map_or("NULL".to_string(), |t| t.to_string());
            format!(
                "UPDATE branch_rules SET lock_holder = '{holder}', lock_time = {lock_time}, \
                 lock_epoch = 7, is_currently_running = TRUE WHERE id = '{id}'"
            )
        };
        // A pod that died long ago, with its attempt left running.
        let crashed = insert_rule(&store, YEARLY, due, &noop()).await;
        sql(
            &store,
            &lock(crashed, "pod-gone", Some(due - 10 * LOCK_TIMEOUT_MS)),
        )
        .await;
        let left_open = Uuid::new_v4();
        sql(&store, &format!(
            "INSERT INTO executions (id, branch_rule_id, scheduled_for, status, attempt, owner, lock_epoch, \
             requested_at, scheduled_at, started_at, created_at, updated_at) \
             VALUES ('{left_open}', '{crashed}', {due}, 'running', 1, 'pod-gone', 7, {due}, {due}, {due}, {due}, {due})"
        )).await;
        // A lock stamped in the year 2100: honoured, it would hold the rule
        // for 74 years.
        let ahead = insert_rule(&store, YEARLY, due, &noop()).await;
        sql(&store, &lock(ahead, "pod-ahead", Some(4_102_444_800_000))).await;
        // A lock with no time at all.
        let timeless = insert_rule(&store, YEARLY, due, &noop()).await;
        sql(&store, &lock(timeless, "pod-timeless", None)).await;
        // A lock taken a moment ago: live until the timeout has passed.
        let fresh = insert_rule(&store, YEARLY, due, &noop()).await;
        let fresh_at = now_ms();
        sql(&store, &lock(fresh, "pod-busy", Some(fresh_at))).await;
        // Its row was last touched a minute ago, beyond the slack of the
        // incremental reads: none of them brings it again.
        sql(
            &store,
            &format!(
                "UPDATE branch_rules SET updated_at = {} WHERE id = '{fresh}'",
                fresh_at - 60_000
            ),
        )
        .await;
        // A lock its holder keeps renewing, as a live peer's worker does
        // (a renewal touches the row): never stale while renewed.
        let alive = insert_rule(&store, YEARLY, due, &noop()).await;
        sql(&store, &lock(alive, "pod-alive", Some(now_ms()))).await;
        let renew = move |at: i64| {
            format!(
                "UPDATE branch_rules SET lock_time = {at}, updated_at = {at} WHERE id = '{alive}'"
            )
        };
        let renewals = {
            let store = store.clone();
            tokio::spawn(async move {
                let mut every =
                    tokio::time::interval(Duration::from_millis(LOCK_TIMEOUT_MS as u64 / 3));
                loop {
                    every.tick().await;
                    sql(&store, &renew(now_ms())).await;
                }
            })
        };

        let install = Install::with_database(&db.url);
        let mut command = serve_command(&install);
        command
            .env(
                "SCHEDULE_LOCK_TIMEOUT_SECONDS",
                (LOCK_TIMEOUT_MS / 1_000).to_string(),
            )
            // The fresh lock turns stale without its row changing, so no
            // incremental read brings it again: the plan sees it turn stale
            // by itself, long before the next full read (an hour away).
            .env("EXECUTION_PLAN_REFRESH_SECONDS", "1")
            .env("PLAN_FULL_REFRESH_SECONDS", "3600");
        let mut server = install.spawn_logged(&mut command, "serve.log");
        let base = format!("http://{}", listening_on(&install));
        let client = common::api::client();

        for id in [crashed, ahead, timeless, fresh] {
            wait_for_execution(&store, id, ExecutionStatus::Completed, DEADLINE).await;
        }
        assert!(
            executions(&store, alive).await.is_empty(),
            "a lock renewed in time is never taken over"
        );
        // The holder stops renewing: a timeout later its lock is stale too.
        renewals.abort();
        let _ = renewals.await;
        let last_renewal = now_ms();
        sql(&store, &renew(last_renewal)).await;
        wait_for_execution(&store, alive, ExecutionStatus::Completed, DEADLINE).await;
        let run = &executions(&store, alive).await[0];
        assert!(
            run.requested_at >= last_renewal + LOCK_TIMEOUT_MS,
            "claimed {} ms after the last renewal",
            run.requested_at - last_renewal
        );
        let log = install.log("serve.log");

        // The dead pod's attempt is closed by the claim that took its lock
        // over, and the occurrence ran again as the next attempt.
        let runs = executions(&store, crashed).await;
        let closed = runs.iter().find(|e| e.id == left_open).unwrap();
        assert_eq!(closed.status, ExecutionStatus::Failed, "{runs:?}");
        let reason = closed.error.clone().unwrap_or_default();
        assert!(
            reason.contains("lock_lost") && reason.contains("pod-gone"),
            "{reason}"
        );
        let rerun = runs.iter().find(|e| e.id != left_open).unwrap();
        assert_eq!((rerun.scheduled_for, rerun.attempt), (due, 2), "{runs:?}");

        // The live lock was honoured until it was stale.
        let run = &executions(&store, fresh).await[0];
        assert!(
            run.requested_at >= fresh_at + LOCK_TIMEOUT_MS,
            "claimed {} ms after a lock live for {LOCK_TIMEOUT_MS} ms",
            run.requested_at - fresh_at
        );

        // Each stale lock is named once, with its holder, and counted.
        for (id, holder) in [
            (crashed, "pod-gone"),
            (ahead, "pod-ahead"),
            (timeless, "pod-timeless"),
            (fresh, "pod-busy"),
            (alive, "pod-alive"),
        ] {
            let named = log
                .lines()
                .filter(|l| l.contains(&format!("🔓 Branch rule {id}: the lock of {holder} ")))
                .count();
            assert_eq!(named, 1, "{holder}:\n{log}");
            assert_eq!(
                executions(&store, id)
                    .await
                    .iter()
                    .filter(|e| e.status == ExecutionStatus::Completed)
                    .count(),
                1
            );
        }
        let (_, metrics) = get(&client, &format!("{base}/metrics")).await;
        assert_eq!(
            metric_sample(&metrics, "ruled_stale_locks_total", &[]),
            Some(5.0),
            "{metrics}"
        );
        let released = store
            .execute_sql(&format!(
                "UPDATE branch_rules SET lock_epoch = lock_epoch WHERE id IN ('{crashed}', '{ahead}', '{timeless}', '{fresh}', '{alive}') \
                 AND lock_holder IS NULL AND NOT is_currently_running"
            ))
            .await
            .unwrap();
        assert_eq!(released, 5, "every lock is released after its run");

        signal(&server, libc::SIGTERM);
        let status = wait_exit(&mut server);
        assert_eq!(status.code(), Some(0), "{}", install.log("serve.log"));
        store.close().await;
    }
);
