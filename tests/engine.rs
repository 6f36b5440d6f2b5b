//! The execution engine end to end, in-process: master, per-job workers,
//! actions and the execution lifecycle against real SQLite and PostgreSQL.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::rules::{Step, YEARLY, insert_rule, step};
use common::service::{RunningService, start_service_with, without_delays};
use common::{TestDb, eventually, sqlite_db};
use ruled::actors::ask;
use ruled::config::Config;
use ruled::messages::MasterMsg;
use ruled::messages::master::CancelOutcome;
use ruled::model::{Execution, ExecutionStatus, Millis};
use ruled::persist::read_plan_file;
use ruled::service::Service;
use serde_json::json;
use uuid::Uuid;

const DEADLINE: Duration = Duration::from_secs(30);

fn now_ms() -> Millis {
    chrono::Utc::now().timestamp_millis()
}

/// Engine settings for tests: no grace period, no cooldown, no stagger.
fn fast(config: Config) -> Config {
    Config {
        worker_count: 10,
        ..without_delays(config)
    }
}

async fn start(db: &TestDb, adjust: impl FnOnce(Config) -> Config) -> RunningService {
    start_service_with(&db.url, |config| adjust(fast(config))).await
}

/// A yearly rule due now, running `steps`: it runs once while a test lasts.
async fn due_now(service: &Service, steps: &[Step]) -> Uuid {
    insert_rule(service.store(), YEARLY, now_ms(), steps).await
}

async fn executions(service: &Service, id: Uuid) -> Vec<Execution> {
    service.store().executions_for(id).await.unwrap()
}

async fn wait_for_status(service: &Service, id: Uuid, status: ExecutionStatus) -> Execution {
    let find = || async {
        executions(service, id)
            .await
            .into_iter()
            .find(|e| e.status == status)
    };
    eventually(
        DEADLINE,
        &format!("an execution of {id} is {status:?}"),
        || async { find().await.is_some() },
    )
    .await;
    find().await.unwrap()
}

async fn queue_stats(service: &Service) -> ruled::queue::QueueStats {
    let master = service.directory().master().unwrap();
    ask(&master, MasterMsg::Stats).await.unwrap()
}

/// Every state of one execution was written, in order.
fn assert_full_lifecycle(execution: &Execution) {
    assert_eq!(
        execution.status,
        ExecutionStatus::Completed,
        "{execution:?}"
    );
    assert_eq!(execution.attempt, 1);
    let scheduled = execution.scheduled_at.expect("scheduled_at written");
    let started = execution.started_at.expect("started_at written");
    let finished = execution.finished_at.expect("finished_at written");
    assert!(execution.requested_at <= scheduled, "{execution:?}");
    assert!(scheduled <= started && started <= finished, "{execution:?}");
}

both_backends!(
    staggered_rules_each_run_exactly_once,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        // Seeded before the start, due one every 3 ms from a second after
        // it: the lag measures the engine, not the seeding.
        let store = db.store().await;
        let mut ids = Vec::new();
        for i in 0..1_000 {
            ids.push(insert_rule(&store, YEARLY, i * 3, &[step("noop", json!({}))]).await);
        }
        let base = now_ms() + 1_000;
        store
            .execute_sql(&format!(
                "UPDATE branch_rules SET next_run_time = next_run_time + {base}"
            ))
            .await
            .unwrap();
        let running = start(&db, |c| c).await;
        let service = &running.service;
        eventually(DEADLINE, "all 1,000 occurrences completed", || async {
            let counts = service.store().count_executions_by_status().await.unwrap();
            counts
                .iter()
                .find(|(status, _)| *status == ExecutionStatus::Completed)
                .is_some_and(|(_, n)| *n == 1_000)
        })
        .await;
        let mut lags = Vec::new();
        for id in &ids {
            let runs = executions(service, *id).await;
            assert_eq!(runs.len(), 1, "exactly one execution for {id}");
            assert_full_lifecycle(&runs[0]);
            lags.push(runs[0].started_at.unwrap() - runs[0].scheduled_for);
        }
        lags.sort();
        println!(
            "start lag over 1,000 staggered rules ({}, debug build): p50 {} ms, p99 {} ms, max {} ms",
            db.backend, lags[500], lags[989], lags[999]
        );
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    single_job_mode_uses_a_fresh_worker_per_job,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let running = start(&db, |c| c).await;
        let service = &running.service;
        let due = now_ms();
        let mut ids = Vec::new();
        for _ in 0..50 {
            ids.push(
                insert_rule(
                    service.store(),
                    YEARLY,
                    due,
                    &[step("sleep", json!({"ms": 20}))],
                )
                .await,
            );
        }
        let mut workers = HashSet::new();
        for id in &ids {
            let done = wait_for_status(service, *id, ExecutionStatus::Completed).await;
            let worker = done
                .output
                .as_ref()
                .and_then(|o| o["worker"].as_str())
                .map(str::to_string);
            workers.insert(worker.expect("the worker is recorded in the output"));
        }
        assert_eq!(workers.len(), 50, "each job ran on its own worker actor");
        eventually(DEADLINE, "alive_workers is back to 10", || async {
            let stats = queue_stats(service).await;
            stats.alive_workers == 10 && stats.active_jobs == 0
        })
        .await;
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    a_job_longer_than_its_timeout_times_out,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let running = start(&db, |c| Config {
            schedule_execution_timeout: Duration::from_millis(300),
            ..c
        })
        .await;
        let service = &running.service;
        let id = due_now(service, &[step("sleep", json!({"ms": 10_000}))]).await;
        let timed_out = wait_for_status(service, id, ExecutionStatus::TimedOut).await;
        assert!(timed_out.error.unwrap().contains("timed out"));
        let row = service.store().load_plan_data(10).await.unwrap();
        let rule = row.branch_rules.iter().find(|r| r.id == id).unwrap();
        assert!(
            !rule.is_currently_running && rule.lock_holder.is_none(),
            "{rule:?}"
        );
        running.service.shutdown("test").await.unwrap();
    }
);

/// True while any process has `marker` in its command line.
fn process_with_arg_exists(marker: &str) -> bool {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|entry| {
            std::fs::read(entry.path().join("cmdline"))
                .map(|cmdline| {
                    cmdline
                        .split(|&b| b == 0)
                        .any(|arg| arg == marker.as_bytes())
                })
                .unwrap_or(false)
        })
}

both_backends!(
    a_cancelled_command_leaves_no_process_behind,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let running = start(&db, |c| Config {
            command_actions_enabled: true,
            ..c
        })
        .await;
        let service = &running.service;
        // A distinctive duration marks our child among the machine's processes.
        let marker = format!("30.{}", std::process::id());
        let id = due_now(
            service,
            &[step(
                "command",
                json!({"program": "sleep", "args": [marker]}),
            )],
        )
        .await;
        let started = wait_for_status(service, id, ExecutionStatus::Running).await;
        eventually(DEADLINE, "the sleep process runs", || async {
            process_with_arg_exists(&marker)
        })
        .await;
        let master = service.directory().master().unwrap();
        let outcome = ask(&master, |reply| MasterMsg::Cancel {
            execution_id: started.id,
            reply,
        })
        .await
        .unwrap();
        assert_eq!(outcome, CancelOutcome::CancelSentToWorker);
        let cancelled = wait_for_status(service, id, ExecutionStatus::Cancelled).await;
        assert_eq!(cancelled.id, started.id);
        eventually(DEADLINE, "no sleep process is left", || async {
            !process_with_arg_exists(&marker)
        })
        .await;
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    action_failures_are_recorded_with_a_clear_error,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let running = start(&db, |c| c).await;
        let service = &running.service;
        let command = due_now(service, &[step("command", json!({"program": "true"}))]).await;
        let private = due_now(
            service,
            &[step("http", json!({"url": "http://127.0.0.1:9/"}))],
        )
        .await;
        let failed = wait_for_status(service, command, ExecutionStatus::Failed).await;
        assert!(failed.error.unwrap().contains("COMMAND_ACTIONS_ENABLED"));
        let failed = wait_for_status(service, private, ExecutionStatus::Failed).await;
        let error = failed.error.unwrap();
        assert!(
            error.contains("127.0.0.1") && error.contains("HTTP_ACTION_ALLOW_PRIVATE"),
            "{error}"
        );
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    a_cancel_before_the_handoff_is_recorded_by_the_master,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        // One worker, busy with a long job: the second job waits in the queue.
        let running = start(&db, |c| Config {
            worker_count: 1,
            ..c
        })
        .await;
        let service = &running.service;
        let busy = due_now(service, &[step("sleep", json!({"ms": 5_000}))]).await;
        wait_for_status(service, busy, ExecutionStatus::Running).await;
        let waiting = due_now(service, &[step("noop", json!({}))]).await;
        let requested = wait_for_status(service, waiting, ExecutionStatus::Requested).await;
        let master = service.directory().master().unwrap();
        let outcome = ask(&master, |reply| MasterMsg::Cancel {
            execution_id: requested.id,
            reply,
        })
        .await
        .unwrap();
        assert_eq!(outcome, CancelOutcome::CancelledBeforeHandoff);
        let cancelled = wait_for_status(service, waiting, ExecutionStatus::Cancelled).await;
        assert_eq!(cancelled.started_at, None, "it never reached a worker");
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    multi_job_mode_reuses_its_workers,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let running = start(&db, |c| Config {
            worker_single_job_mode: false,
            worker_count: 2,
            ..c
        })
        .await;
        let service = &running.service;
        let mut ids = Vec::new();
        for _ in 0..10 {
            ids.push(due_now(service, &[step("noop", json!({}))]).await);
        }
        let mut workers = HashSet::new();
        for id in &ids {
            let done = wait_for_status(service, *id, ExecutionStatus::Completed).await;
            workers.insert(done.output.unwrap()["worker"].as_str().unwrap().to_string());
        }
        assert!(
            workers.len() <= 2,
            "ten jobs on at most two workers: {workers:?}"
        );
        let stats = queue_stats(service).await;
        assert_eq!((stats.alive_workers, stats.total_workers), (2, 2));
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    force_stop_cancels_the_running_job_and_holds_the_rule,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let running = start(&db, |c| c).await;
        let service = &running.service;
        // Every minute: without the force-stop it would run again soon.
        let id = insert_rule(
            service.store(),
            "* * * * *",
            now_ms(),
            &[step("sleep", json!({"ms": 30_000}))],
        )
        .await;
        wait_for_status(service, id, ExecutionStatus::Running).await;
        let master = service.directory().master().unwrap();
        let outcome = ask(&master, |reply| MasterMsg::ForceStop {
            branch_rule_id: id,
            reply,
        })
        .await
        .unwrap()
        .unwrap();
        assert!(outcome.flag_set);
        assert_eq!(outcome.cancel, CancelOutcome::CancelSentToWorker);
        wait_for_status(service, id, ExecutionStatus::Cancelled).await;
        let plan = service.directory().plan().unwrap();
        eventually(DEADLINE, "the plan holds the rule back", || async {
            let snapshot = ask(&plan, ruled::messages::PlanMsg::Snapshot)
                .await
                .unwrap();
            snapshot
                .workflows
                .iter()
                .any(|w| w.id() == id && w.branch_rule.is_force_stopped)
        })
        .await;
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    a_rule_past_the_action_details_cap_reads_its_steps_from_the_database,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        // A cap of one: the plan caches at most one detail, so this rule's
        // two steps are not in the plan and the worker reads them.
        let running = start(&db, |c| Config {
            plan_action_details_cap: 1,
            ..c
        })
        .await;
        let service = &running.service;
        let id = due_now(
            service,
            &[step("noop", json!({})), step("sleep", json!({"ms": 1}))],
        )
        .await;
        let done = wait_for_status(service, id, ExecutionStatus::Completed).await;
        let steps = done.output.unwrap()["steps"].as_array().unwrap().clone();
        let kinds: Vec<&str> = steps.iter().map(|s| s["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, vec!["noop", "sleep"]);
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    a_broken_action_detail_costs_only_its_own_rule_and_runs_it_at_most_once,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        // Three rules of two steps each, by id: the cap of three caches the
        // first rule whole and cuts in the second. Broken with SQL: a
        // detail of the first (cached: its rule is held) and one of the
        // third (past the cut: the plan cannot see it).
        let store = db.store().await;
        let two_steps = [step("noop", json!({})), step("sleep", json!({"ms": 1}))];
        let mut ids = Vec::new();
        for _ in 0..3 {
            ids.push(insert_rule(&store, YEARLY, now_ms(), &two_steps).await);
        }
        ids.sort();
        let [held, whole, broken] = [ids[0], ids[1], ids[2]];
        for (rule, position) in [(held, 0), (broken, 1)] {
            store
                .execute_sql(&format!(
                    "UPDATE action_details SET params = '{{not json' \
                     WHERE branch_rule_id = '{rule}' AND position = {position}"
                ))
                .await
                .unwrap();
        }
        let running = start(&db, |c| Config {
            plan_action_details_cap: 3,
            ..c
        })
        .await;
        let service = &running.service;

        // The rejected detail still took its place under the cap: the rule
        // past the cut runs both its steps, read from the database, rather
        // than none from a cache that only looked complete.
        let done = wait_for_status(service, whole, ExecutionStatus::Completed).await;
        let steps = done.output.unwrap()["steps"].as_array().unwrap().len();
        assert_eq!(steps, 2, "both steps of the rule past the cut ran");

        // The rule whose broken detail the plan cannot see fails once, and
        // its next run moves on: it does not come back every few seconds.
        let failed = wait_for_status(service, broken, ExecutionStatus::Failed).await;
        let error = failed.error.unwrap_or_default();
        assert!(error.contains("cannot read the action details"), "{error}");
        assert!(error.contains("action_details.params"), "{error}");
        eventually(DEADLINE, "the broken rule's next run moved on", || async {
            let rules = store.load_plan(3, None).await.unwrap().data.branch_rules;
            rules
                .iter()
                .find(|rule| rule.id == broken)
                .is_some_and(|rule| {
                    rule.next_run_time
                        .is_some_and(|next| next > now_ms() + 86_400_000)
                        && rule.lock_holder.is_none()
                })
        })
        .await;
        assert_eq!(executions(service, broken).await.len(), 1);
        assert!(
            executions(service, held).await.is_empty(),
            "the cached rule with a broken detail is held"
        );
        running.service.shutdown("test").await.unwrap();
        store.close().await;
    }
);

/// A tiny HTTP/1.1 server on loopback: `/ok` answers 200, anything else
/// 500. Returns its base URL; it serves until the test ends.
async fn http_server() -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = vec![0u8; 4096];
                let read = socket.read(&mut request).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&request[..read]);
                let (status, body) = if head.starts_with("GET /ok ") {
                    ("200 OK", "fine")
                } else {
                    ("500 Internal Server Error", "broken")
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
            });
        }
    });
    format!("http://{address}")
}

both_backends!(
    http_actions_succeed_on_2xx_and_fail_otherwise,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let base = http_server().await;
        let running = start(&db, |c| Config {
            http_action_allow_private: true,
            ..c
        })
        .await;
        let service = &running.service;
        let ok = due_now(
            service,
            &[step("http", json!({"url": format!("{base}/ok")}))],
        )
        .await;
        let broken = due_now(
            service,
            &[step("http", json!({"url": format!("{base}/broken")}))],
        )
        .await;
        let done = wait_for_status(service, ok, ExecutionStatus::Completed).await;
        assert_eq!(done.output.unwrap()["steps"][0]["output"]["status"], 200);
        let failed = wait_for_status(service, broken, ExecutionStatus::Failed).await;
        assert!(failed.error.unwrap().contains("500"));
        running.service.shutdown("test").await.unwrap();
    }
);

/// A worker hands its slot back once its finish is queued, before the
/// commit, so the next job's writes share that commit. Shutdown must still
/// wait for the commit: an action that ran and whose finish was lost would
/// run again after the restart. The database's write lock, held from
/// outside, keeps the finish from committing while the shutdown starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_a_handed_back_finish_to_commit() {
    let db = sqlite_db().await;
    let running = start(&db, |c| c).await;
    let id = due_now(&running.service, &[step("sleep", json!({"ms": 400}))]).await;
    wait_for_status(&running.service, id, ExecutionStatus::Running).await;
    let lock = db.outage().await;
    eventually(DEADLINE, "the worker handed its slot back", || async {
        queue_stats(&running.service).await.active_jobs == 0
    })
    .await;
    let plan_file = running.dir.path().join("plan.json");
    let shutdown = tokio::spawn(running.service.shutdown("test"));
    // Well inside the batcher's 5 s busy timeout, after which the finish
    // would go to the outbox and the shutdown could rightly go on.
    let gave_up_waiting = std::time::Instant::now() + Duration::from_millis(1_500);
    while std::time::Instant::now() < gave_up_waiting {
        assert!(
            !shutdown.is_finished(),
            "the shutdown returned while a finish was still committing"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    lock.restore().await;
    shutdown.await.unwrap().unwrap();
    let store = db.store().await;
    let runs = store.executions_for(id).await.unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0].status, ExecutionStatus::Completed, "{runs:?}");
    assert!(runs[0].finished_at.is_some(), "{runs:?}");
    // The plan saved at the exit took the finish in too: it was not cut
    // off while it waited for the commit.
    let data = store.load_plan_data(10_000).await.unwrap();
    let next_run = data
        .branch_rules
        .iter()
        .find(|r| r.id == id)
        .unwrap()
        .next_run_time;
    let saved = read_plan_file(&plan_file).unwrap().unwrap();
    let workflow = saved.workflows.iter().find(|w| w.id() == id).unwrap();
    assert_eq!(workflow.branch_rule.next_run_time, next_run);
    assert!(!workflow.branch_rule.is_currently_running);
}

/// The 10:00 UTC that [`around_ten`] runs its rules around.
fn ten_o_clock() -> Millis {
    chrono::DateTime::parse_from_rfc3339("2031-03-04T10:00:00Z")
        .unwrap()
        .timestamp_millis()
}

/// Runs three rules around 10:00 UTC on a service whose clock starts three
/// seconds before it, with MASTER_CLAIM_LEAD_SECONDS at `lead_seconds`:
/// one due at 10:00, one due since 09:30 whose window opens at 10:00, and
/// one due at 10:00 whose window closes then. Returns the first two's
/// executions once both completed, and the third's.
async fn around_ten(db: &TestDb, lead_seconds: f64) -> (Execution, Execution, Vec<Execution>) {
    use common::rules::{RuleOptions, insert_rule_with};
    use common::service::start_service_on_clock;
    use ruled::clock::Clock;

    let store = db.store().await;
    let ten = ten_o_clock();
    let start = ten - 3_000;
    let options = |window: Option<(&str, &str)>| RuleOptions {
        window: window.map(|(from, to)| (from.to_string(), to.to_string())),
        now: Some(start),
        ..RuleOptions::default()
    };
    let noop = [step("noop", json!({}))];
    let on_time = insert_rule_with(&store, "0 10 * * *", ten, &noop, &options(None)).await;
    let window_opens = insert_rule_with(
        &store,
        "30 9 * * *",
        ten - 30 * 60_000,
        &noop,
        &options(Some(("10:00", "11:00"))),
    )
    .await;
    let window_closes = insert_rule_with(
        &store,
        "0 10 * * *",
        ten,
        &noop,
        &options(Some(("09:00", "10:00"))),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let service =
        start_service_on_clock(&db.url, dir.path(), Clock::starting_at(start), |c| Config {
            master_claim_lead: Duration::from_secs_f64(lead_seconds),
            ..fast(c)
        })
        .await;
    let on_time = wait_for_status(&service, on_time, ExecutionStatus::Completed).await;
    let window_opens = wait_for_status(&service, window_opens, ExecutionStatus::Completed).await;
    // Claimed ahead, it would have been in the same fetch as the other two
    // (its due index key is 10:00 too), so its claim has landed by now.
    let window_closes = executions(&service, window_closes).await;
    service.shutdown("test").await.unwrap();
    (on_time, window_opens, window_closes)
}

// MASTER_CLAIM_LEAD_SECONDS: a rule due at 10:00 is claimed before 10:00, so
// the claim's commit is not in its start lag, and starts at 10:00, never
// before; so does a rule waiting for its window to open at 10:00. A rule
// whose window closes at 10:00 is not claimed ahead: it would not have been
// ready at 10:00. With the lead at 0 every claim is made once due.
both_backends!(
    rules_are_claimed_ahead_and_start_when_due_never_before,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let ten = ten_o_clock();
        let (on_time, window_opens, window_closes) = around_ten(&db, 0.5).await;
        for execution in [&on_time, &window_opens] {
            assert_full_lifecycle(execution);
            assert!(
                execution.requested_at < ten,
                "claimed ahead of 10:00: {execution:?}"
            );
            assert!(
                execution.scheduled_at.unwrap() >= ten && execution.started_at.unwrap() >= ten,
                "started at 10:00 or after, never before: {execution:?}"
            );
        }
        assert_eq!(on_time.scheduled_for, ten);
        assert_eq!(window_opens.scheduled_for, ten - 30 * 60_000);
        assert!(
            window_closes.is_empty(),
            "outside its window at 10:00, so neither claimed ahead nor run: {window_closes:?}"
        );
    }
);

both_backends!(
    without_a_claim_lead_rules_are_claimed_once_due,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let ten = ten_o_clock();
        let (on_time, window_opens, window_closes) = around_ten(&db, 0.0).await;
        for execution in [&on_time, &window_opens] {
            assert_full_lifecycle(execution);
            assert!(execution.requested_at >= ten, "{execution:?}");
        }
        assert!(window_closes.is_empty(), "{window_closes:?}");
    }
);

// A stop with claims queued behind busy workers gives them all back at
// once: those claimed ahead and not due yet are withdrawn (no attempt
// recorded), those already due are recorded Cancelled with their
// occurrence left due. After a restart every one of them runs.
both_backends!(
    a_graceful_stop_gives_back_every_queued_claim_ahead_or_due,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let store = db.store().await;
        let lead = |c: Config| Config {
            worker_count: 3,
            master_claim_lead: Duration::from_secs(8),
            ..c
        };
        let running = start(&db, lead).await;
        let service = &running.service;
        for _ in 0..3 {
            let busy = due_now(service, &[step("sleep", json!({"ms": 4_000}))]).await;
            wait_for_status(service, busy, ExecutionStatus::Running).await;
        }
        let mut due = Vec::new();
        for _ in 0..2 {
            due.push(due_now(service, &[step("noop", json!({}))]).await);
        }
        let later = now_ms() + 5_000;
        let mut ahead = Vec::new();
        for _ in 0..2 {
            ahead.push(insert_rule(&store, YEARLY, later, &[step("noop", json!({}))]).await);
        }
        for id in due.iter().chain(&ahead) {
            wait_for_status(service, *id, ExecutionStatus::Requested).await;
        }
        // The drain gives the queue back as it begins; the stop then waits
        // for the long jobs.
        assert!(
            now_ms() < later - 1_000,
            "the stop came too close to the due time: the test proves nothing"
        );
        running.service.shutdown("test").await.unwrap();
        let rows = store.load_plan_data(0).await.unwrap().branch_rules;
        let row = |id: Uuid| rows.iter().find(|r| r.id == id).unwrap().clone();
        for id in &ahead {
            assert_eq!(store.executions_for(*id).await.unwrap(), [], "withdrawn");
            assert_eq!(row(*id).lock_holder, None);
            assert_eq!(row(*id).next_run_time, Some(later));
        }
        for id in &due {
            let given_back = store.executions_for(*id).await.unwrap();
            assert_eq!(given_back.len(), 1, "{given_back:?}");
            assert_eq!(given_back[0].status, ExecutionStatus::Cancelled);
            assert_eq!(given_back[0].started_at, None, "it never reached a worker");
            assert_eq!(
                given_back[0].error.as_deref(),
                Some("cancelled at shutdown before the handoff")
            );
            assert_eq!(row(*id).lock_holder, None);
            assert_eq!(row(*id).next_run_time, Some(given_back[0].scheduled_for));
        }

        let again = start(&db, lead).await;
        for id in &ahead {
            let run = wait_for_status(&again.service, *id, ExecutionStatus::Completed).await;
            assert_eq!((run.attempt, run.scheduled_for), (1, later));
            assert!(run.started_at.unwrap() >= later, "{run:?}");
        }
        for id in &due {
            let run = wait_for_status(&again.service, *id, ExecutionStatus::Completed).await;
            assert_eq!(run.attempt, 2, "{run:?}");
        }
        again.service.shutdown("test").await.unwrap();
    }
);

// A graceful stop gives back a claim made ahead of its due time unrun, as
// if never made: no Cancelled attempt, the lock free, and the next start
// runs the occurrence as attempt 1. (Recorded Cancelled, a rolling restart
// left a second attempt behind each such claim.)
both_backends!(
    a_graceful_stop_withdraws_what_it_claimed_ahead,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let store = db.store().await;
        let due = now_ms() + 4_000;
        let id = insert_rule(&store, YEARLY, due, &[step("noop", json!({}))]).await;
        let lead = |c: Config| Config {
            master_claim_lead: Duration::from_secs(8),
            ..c
        };
        let running = start(&db, lead).await;
        let claimed = wait_for_status(&running.service, id, ExecutionStatus::Requested).await;
        assert_eq!(claimed.scheduled_for, due);
        running.service.shutdown("test").await.unwrap();
        assert!(
            now_ms() < due,
            "the stop came after the due time: the test proves nothing"
        );
        assert_eq!(store.executions_for(id).await.unwrap(), []);
        let row = store
            .load_plan_data(0)
            .await
            .unwrap()
            .branch_rules
            .into_iter()
            .find(|r| r.id == id)
            .unwrap();
        assert_eq!(row.lock_holder, None);
        assert!(!row.is_currently_running);
        assert_eq!(row.next_run_time, Some(due));

        let again = start(&db, lead).await;
        let run = wait_for_status(&again.service, id, ExecutionStatus::Completed).await;
        assert_full_lifecycle(&run);
        assert_eq!(run.scheduled_for, due);
        assert!(run.started_at.unwrap() >= due, "{run:?}");
        again.service.shutdown("test").await.unwrap();
    }
);
