//! Issue 13: a pending retry is durable. A real `ruled serve` runs a rule
//! whose job fails once, then succeeds (`max_attempts` 2, `backoff_seconds`
//! 5); it is killed with SIGKILL while the retry waits out its backoff, and
//! restarted: the retry still runs, exactly once, and nothing else runs
//! for that occurrence.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::TestDb;
use common::cluster::http_request;
use common::http::{read_request, serve};
use common::process::{DEADLINE, Install, signal, wait_exit};
use common::rules::{RuleOptions, YEARLY, insert_rule_with, policy, step, yearly_after};
use ruled::model::{BranchRule, Execution, ExecutionStatus};
use ruled::store::Store;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use uuid::Uuid;

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Polls an async condition with a deadline (never a fixed sleep).
async fn until<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + DEADLINE;
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn executions(store: &Store, id: Uuid) -> Vec<Execution> {
    store.executions_for(id).await.unwrap()
}

async fn branch_rule(store: &Store, id: Uuid) -> BranchRule {
    let data = store.load_plan_data(100).await.unwrap();
    data.branch_rules.into_iter().find(|r| r.id == id).unwrap()
}

fn serve_ruled(install: &Install, log: &str) -> std::process::Child {
    let mut command = install.command(&["serve"]);
    command
        .env("MASTER_GRACE_PERIOD_SECONDS", "0")
        .env("WORKER_STAGGER_SECONDS", "0")
        .env("WORKER_COOLDOWN_SECONDS", "0")
        .env("INSTANCE_ID", "policies-process-test")
        // The job calls the test's loopback server.
        .env("HTTP_ACTION_ALLOW_PRIVATE", "true")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(install.path(log)).unwrap());
    command.spawn().unwrap()
}

/// A loopback server answering 500 to the first request and 200 to the
/// others; counts them.
async fn fails_once() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let requests = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&requests);
    let addr = serve(move |mut socket| {
        let seen = Arc::clone(&seen);
        async move {
            if read_request(&mut socket).await.is_none() {
                return;
            }
            let status = match seen.fetch_add(1, Ordering::SeqCst) {
                0 => "500 Internal Server Error",
                _ => "200 OK",
            };
            let reply =
                format!("HTTP/1.1 {status}\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
            let _ = socket.write_all(reply.as_bytes()).await;
            let _ = socket.shutdown().await;
        }
    })
    .await;
    (addr, requests)
}

/// `ruled_retries_total` on the service's `/metrics`.
fn retries_total(addr: &str) -> f64 {
    let reply = http_request(addr, "GET", "/metrics", None);
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply
        .body
        .lines()
        .find_map(|line| line.strip_prefix("ruled_retries_total "))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0.0)
}

fn describe(runs: &[Execution]) -> String {
    runs.iter()
        .map(|e| {
            format!(
                "\n  {} attempt {} {} requested {} finished {:?} {}",
                e.scheduled_for,
                e.attempt,
                e.status.as_str(),
                e.requested_at,
                e.finished_at,
                e.error.as_deref().unwrap_or("")
            )
        })
        .collect()
}

both_backends!(
    a_retry_pending_across_a_sigkill_runs_once_after_the_restart,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let db = db;
        let store = db.store().await;
        let install = Install::with_database(&db.url);
        let (addr, requests) = fails_once().await;
        let occurrence = now_ms();
        let id = insert_rule_with(
            &store,
            YEARLY,
            occurrence,
            &[step(
                "http",
                json!({"url": format!("http://{addr}/job"), "timeout_ms": 5_000}),
            )],
            &RuleOptions {
                policy: Some(policy(json!({"max_attempts": 2, "backoff_seconds": 5}))),
                ..RuleOptions::default()
            },
        )
        .await;

        let mut first = serve_ruled(&install, "first.log");
        until("attempt 1 failed and its retry is pending", || async {
            let runs = executions(&store, id).await;
            let row = branch_rule(&store, id).await;
            runs.len() == 1
                && runs[0].status == ExecutionStatus::Failed
                && row.retry_of == Some(occurrence)
                && row.failed_attempts == 1
                && row.lock_holder.is_none()
        })
        .await;
        let row = branch_rule(&store, id).await;
        let failed = executions(&store, id).await.remove(0);
        let retry_at = row.next_run_time.unwrap();
        let backoff = retry_at - failed.finished_at.unwrap();
        assert!(
            (4_000..=5_000).contains(&backoff),
            "5 s less up to a fifth: {backoff} ms"
        );
        let api = install.listening_addr("first.log").to_string();
        assert_eq!(retries_total(&api), 1.0, "the retry is counted");
        // SIGKILL while the retry waits out its backoff.
        assert!(
            now_ms() < retry_at,
            "the backoff was over before the kill: this machine is too slow for the test"
        );
        first.kill().unwrap();
        first.wait().unwrap();
        let killed_at = now_ms();
        assert!(killed_at < retry_at, "killed during the backoff");
        assert_eq!(executions(&store, id).await.len(), 1);
        assert_eq!(requests.load(Ordering::SeqCst), 1);

        let mut second = serve_ruled(&install, "second.log");
        until("attempt 2 completed", || async {
            executions(&store, id)
                .await
                .iter()
                .any(|e| e.status == ExecutionStatus::Completed)
        })
        .await;
        until("the rule is released with no retry pending", || async {
            let row = branch_rule(&store, id).await;
            row.lock_holder.is_none() && !row.is_currently_running && row.retry_of.is_none()
        })
        .await;
        signal(&second, libc::SIGTERM);
        assert!(
            wait_exit(&mut second).success(),
            "{}",
            install.log("second.log")
        );

        let runs = executions(&store, id).await;
        let brief: Vec<(i64, i64, ExecutionStatus)> = runs
            .iter()
            .map(|e| (e.scheduled_for, e.attempt, e.status))
            .collect();
        assert_eq!(
            brief,
            vec![
                (occurrence, 1, ExecutionStatus::Failed),
                (occurrence, 2, ExecutionStatus::Completed),
            ],
            "the retry ran exactly once, nothing else for the occurrence:{}",
            describe(&runs)
        );
        assert!(
            runs[1].requested_at >= retry_at,
            "the retry waited out its backoff:{}",
            describe(&runs)
        );
        assert_eq!(
            requests.load(Ordering::SeqCst),
            2,
            "the job ran twice in all"
        );
        let row = branch_rule(&store, id).await;
        assert_eq!((row.retry_of, row.failed_attempts), (None, 0), "{row:?}");
        assert_eq!(
            row.next_run_time,
            Some(yearly_after(occurrence)),
            "the schedule goes on"
        );
        let log = install.log("second.log");
        assert!(!log.contains("worker_lost"), "nothing was lost: {log}");
    }
);
