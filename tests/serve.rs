//! `ruled serve` as a real process against SQLite and PostgreSQL: the demo
//! quick start, SIGKILL mid-job and recovery, SIGTERM with jobs in flight,
//! and INSTANCE_ID ownership.

mod common;

use std::time::{Duration, Instant};

use common::TestDb;
use common::process::{DEADLINE, Install, signal, wait_exit, wait_exit_within};
use common::rules::{YEARLY, insert_rule, step};
use ruled::model::{Execution, ExecutionStatus};
use ruled::store::Store;
use serde_json::json;
use uuid::Uuid;

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Polls an async condition against the database with a deadline.
async fn until<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + DEADLINE;
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn executions(store: &Store, id: Uuid) -> Vec<Execution> {
    store.executions_for(id).await.unwrap()
}

/// Until the rule's job runs.
async fn until_running(store: &Store, id: Uuid) {
    until("the job runs", || async {
        executions(store, id)
            .await
            .iter()
            .any(|e| e.status == ExecutionStatus::Running)
    })
    .await;
}

/// An install on the test's database with a fast engine.
fn install(db: &TestDb) -> Install {
    Install::with_database(&db.url)
}

fn serve(install: &Install, log: &str, extra: &[(&str, &str)]) -> std::process::Child {
    let mut command = install.command(&["serve"]);
    command
        .env("MASTER_GRACE_PERIOD_SECONDS", "0")
        .env("WORKER_STAGGER_SECONDS", "0")
        .env("WORKER_COOLDOWN_SECONDS", "0")
        .env("INSTANCE_ID", "serve-test")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(install.path(log)).unwrap());
    for (name, value) in extra {
        command.env(name, value);
    }
    command.spawn().unwrap()
}

both_backends!(
    a_job_killed_with_sigkill_is_recovered_and_runs_again,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let store = db.store().await;
        let install = install(&db);
        let id = insert_rule(
            &store,
            YEARLY,
            now_ms(),
            &[step("sleep", json!({"ms": 5_000}))],
        )
        .await;

        let mut first = serve(&install, "first.log", &[]);
        until_running(&store, id).await;
        first.kill().unwrap(); // SIGKILL, mid-job
        first.wait().unwrap();

        let mut second = serve(&install, "second.log", &[]);
        until("attempt 2 completes", || async {
            executions(&store, id)
                .await
                .iter()
                .any(|e| e.attempt == 2 && e.status == ExecutionStatus::Completed)
        })
        .await;
        let runs = executions(&store, id).await;
        assert_eq!(runs.len(), 2, "{runs:?}");
        assert_eq!(runs[0].status, ExecutionStatus::Failed);
        assert_eq!(runs[0].error.as_deref(), Some("worker_lost"));
        assert_eq!(
            runs[0].scheduled_for, runs[1].scheduled_for,
            "the same occurrence"
        );
        until("the rule is released", || async {
            let data = store.load_plan_data(100).await.unwrap();
            let rule = data.branch_rules.iter().find(|r| r.id == id).unwrap();
            !rule.is_currently_running && rule.lock_holder.is_none()
        })
        .await;
        assert!(
            install.log("second.log").contains("worker_lost"),
            "{}",
            install.log("second.log")
        );
        signal(&second, libc::SIGTERM);
        assert_eq!(wait_exit(&mut second).code(), Some(0));
    }
);

both_backends!(
    sigterm_with_jobs_in_flight_exits_cleanly,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let store = db.store().await;
        let install = install(&db);
        let mut ids = Vec::new();
        for _ in 0..5 {
            ids.push(
                insert_rule(
                    &store,
                    YEARLY,
                    now_ms(),
                    &[step("sleep", json!({"ms": 4_000}))],
                )
                .await,
            );
        }
        let mut server = serve(&install, "serve.log", &[("SHUTDOWN_GRACE_SECONDS", "10")]);
        until("five jobs run", || async {
            let mut running = 0;
            for id in &ids {
                running += executions(&store, *id)
                    .await
                    .iter()
                    .filter(|e| e.status == ExecutionStatus::Running)
                    .count();
            }
            running == 5
        })
        .await;
        signal(&server, libc::SIGTERM);
        let status = wait_exit(&mut server);
        assert_eq!(status.code(), Some(0), "{}", install.log("serve.log"));
        assert!(install.path("marker.json").exists());
        for id in &ids {
            let runs = executions(&store, *id).await;
            assert_eq!(runs.len(), 1);
            assert!(runs[0].status.is_terminal(), "{:?}", runs[0]);
            assert_eq!(
                runs[0].status,
                ExecutionStatus::Completed,
                "finished within the grace period"
            );
        }
    }
);

/// A job still running when a grace period longer than an actor call's
/// 30 s runs out is cancelled, and the stop is still a clean exit 0: the
/// wait for the supervisor used to give up at 30 s while the drain went
/// on, and the process exited 1 ("the supervisor did not answer").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_past_a_long_grace_period_still_exits_0() {
    let db = common::sqlite_db().await;
    let store = db.store().await;
    let install = install(&db);
    let id = insert_rule(
        &store,
        YEARLY,
        now_ms(),
        &[step("sleep", json!({"ms": 600_000}))],
    )
    .await;
    let mut server = serve(&install, "serve.log", &[("SHUTDOWN_GRACE_SECONDS", "32")]);
    until_running(&store, id).await;
    signal(&server, libc::SIGTERM);
    let status = wait_exit_within(&mut server, Duration::from_secs(32) + DEADLINE);
    assert_eq!(status.code(), Some(0), "{}", install.log("serve.log"));
    let runs = executions(&store, id).await;
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].status, ExecutionStatus::Cancelled, "{:?}", runs[0]);
}

/// A SIGKILL of ruled takes its command action's program with it: the
/// restart records the run lost and runs the occurrence again, and the old
/// program still at work beside it would be a second run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_action_dies_with_a_service_killed_by_sigkill() {
    let db = common::sqlite_db().await;
    let store = db.store().await;
    let install = install(&db);
    let program = json!({"program": "sleep", "args": ["600"], "timeout_ms": 600_000});
    let id = insert_rule(&store, YEARLY, now_ms(), &[step("command", program)]).await;
    let mut server = serve(
        &install,
        "serve.log",
        &[("COMMAND_ACTIONS_ENABLED", "true")],
    );
    until_running(&store, id).await;
    let sleep = poll_for(&install, "serve.log", "the program starts", || {
        children(server.id()).first().copied()
    });
    server.kill().unwrap(); // SIGKILL: no guard of ruled's runs
    server.wait().unwrap();
    until_dead(sleep, || {
        format!("the command action's program {sleep} outlived ruled's SIGKILL")
    });
}

/// Polls `found` until it finds something, for at most [`DEADLINE`].
fn poll_for<T>(
    install: &Install,
    log: &str,
    what: &str,
    mut found: impl FnMut() -> Option<T>,
) -> T {
    let started = Instant::now();
    loop {
        if let Some(value) = found() {
            return value;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "{what}: not within {DEADLINE:?}: {}",
            install.log(log)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits up to [`DEADLINE`] for `pid` to die; kills it and fails with
/// `why` if it does not.
fn until_dead(pid: i32, why: impl FnOnce() -> String) {
    let started = Instant::now();
    while alive(pid) && started.elapsed() < DEADLINE {
        std::thread::sleep(Duration::from_millis(20));
    }
    if alive(pid) {
        // SAFETY: kill(2) on a pid the test found alive.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        panic!("{}", why());
    }
}

/// What the program started in its process group outlives ruled's SIGKILL
/// (only the program itself gets the kernel's parent-death signal), and the
/// restart runs the occurrence again: the start kills those stragglers
/// first, so the occurrence never runs twice at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_command_action_started_is_killed_by_the_restart_after_a_sigkill() {
    let db = common::sqlite_db().await;
    let store = db.store().await;
    let install = install(&db);
    let pid_file = install.path("worker.pid");
    let script = format!("sleep 600 & echo $! > {}; wait", pid_file.display());
    let program = json!({"program": "sh", "args": ["-c", script], "timeout_ms": 600_000});
    let id = insert_rule(&store, YEARLY, now_ms(), &[step("command", program)]).await;
    let enabled = [("COMMAND_ACTIONS_ENABLED", "true")];
    let mut server = serve(&install, "serve.log", &enabled);
    until_running(&store, id).await;
    let read_pid = || {
        std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|text| text.trim().parse::<i32>().ok())
    };
    let straggler = poll_for(
        &install,
        "serve.log",
        "the program starts its own",
        read_pid,
    );
    server.kill().unwrap(); // SIGKILL: no guard of ruled's runs
    server.wait().unwrap();
    assert!(
        alive(straggler),
        "what the program started outlives the SIGKILL"
    );

    let mut again = serve(
        &install,
        "again.log",
        &[enabled[0], ("SHUTDOWN_GRACE_SECONDS", "1")],
    );
    until_dead(straggler, || {
        format!(
            "{straggler} outlived the restart: {}",
            install.log("again.log")
        )
    });
    until("the occurrence runs again", || async {
        executions(&store, id)
            .await
            .iter()
            .any(|e| e.attempt == 2 && e.status == ExecutionStatus::Running)
    })
    .await;
    let log = install.log("again.log");
    assert!(
        log.contains(&format!("🧹 Killed process {straggler} (sleep)")),
        "{log}"
    );
    // The first attempt is recorded lost before the second one starts.
    let runs = executions(&store, id).await;
    let first = runs.iter().find(|e| e.attempt == 1).unwrap();
    assert_eq!(first.status, ExecutionStatus::Failed, "{runs:?}");
    signal(&again, libc::SIGTERM);
    let status = wait_exit(&mut again);
    assert_eq!(status.code(), Some(0), "{}", install.log("again.log"));
    if let Some(pid) = read_pid().filter(|&pid| pid != straggler) {
        assert!(
            !alive(pid),
            "the second attempt's process is stopped with it"
        );
    }
}

/// The pids whose parent is `parent`, from /proc.
fn children(parent: u32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| proc_stat(pid).is_some_and(|(_, ppid)| ppid == parent as i32))
        .collect()
}

/// Alive and not a zombie (a container's init may never reap an orphan).
fn alive(pid: i32) -> bool {
    proc_stat(pid).is_some_and(|(state, _)| state != 'Z')
}

/// A process's state and parent pid, from /proc/<pid>/stat.
fn proc_stat(pid: i32) -> Option<(char, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name in parentheses may hold spaces; the fields after it do not.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_quick_start_shows_the_engine_at_work() {
    let install = Install::new();
    let mut server = install
        .command(&["serve", "--demo"])
        .env("MASTER_GRACE_PERIOD_SECONDS", "0")
        .env("WORKER_STAGGER_SECONDS", "0")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(install.path("demo.log")).unwrap())
        .spawn()
        .unwrap();
    for line in [
        "👑 Master fetched",
        "📥 Added job",
        "👷 Worker-",
        "✅ Worker-",
        "✅ Updated execution plan",
        "💾 Queued execution plan write",
    ] {
        install.wait_for_log("demo.log", line);
    }
    signal(&server, libc::SIGINT);
    assert_eq!(wait_exit(&mut server).code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_with_the_same_instance_id_is_refused() {
    let install = Install::new();
    let mut first = install
        .command(&["serve"])
        .env("INSTANCE_ID", "only-one")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(install.path("first.log")).unwrap())
        .spawn()
        .unwrap();
    install.wait_for_log("first.log", "started");
    let second = install
        .command(&["serve"])
        .env("INSTANCE_ID", "only-one")
        .env("PLAN_FILE", install.path("other-plan.json"))
        .output()
        .unwrap();
    assert!(!second.status.success());
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains("INSTANCE_ID") && stderr.contains("only-one"),
        "{stderr}"
    );
    signal(&first, libc::SIGTERM);
    assert_eq!(wait_exit(&mut first).code(), Some(0));
}

/// An actor that keeps failing past SUPERVISOR_MAX_RESTARTS makes the
/// process exit non-zero, naming the actor, so systemd or Kubernetes
/// restarts it. RULED_CHAOS_PANIC panics the master over and over.
#[test]
fn an_actor_failing_past_the_restart_limit_exits_the_process_non_zero() {
    let install = Install::new();
    let mut command = install.command(&["serve"]);
    command
        .env("RULED_CHAOS_PANIC", "master")
        .env("SUPERVISOR_MAX_RESTARTS", "3")
        .env("SUPERVISOR_RESTART_WINDOW_SECONDS", "60")
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(install.path("chaos.log")).unwrap());
    let mut child = command.spawn().unwrap();
    let status = wait_exit(&mut child);
    let log = install.log("chaos.log");
    assert!(!status.success(), "exit status {status:?}\n{log}");
    assert!(
        log.contains("actor master failed 4 times within the restart window"),
        "the log names the actor:\n{log}"
    );
}
