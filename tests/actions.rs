//! The actions module as its users see it: the worker (registry, calls,
//! cancellation by drop) and a library user registering a kind of their own.
//!
//! HTTP tests talk to a tiny HTTP/1.1 responder on 127.0.0.1:0 started by
//! each test; command tests find their processes through a unique
//! environment marker in /proc, so parallel tests never see each other's.

mod common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::http::{read_request, serve};
use ruled::actions::{
    ActionCall, ActionError, ActionFuture, ActionHandler, ActionOutput, ActionRegistry,
    ActionSettings, OUTPUT_CAP_BYTES, OUTPUT_TOTAL_CAP_BYTES, merge_config,
};
use ruled::model::{ActionDetail, ActionTemplate};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use uuid::Uuid;

const PERMISSIVE: ActionSettings = ActionSettings {
    command_actions_enabled: true,
    http_action_allow_private: true,
    command_ledger: None,
};

fn call(kind: &str, config: Value) -> ActionCall {
    ActionCall {
        execution_id: Uuid::new_v4(),
        branch_rule_id: Uuid::new_v4(),
        action_detail_id: Uuid::new_v4(),
        position: 0,
        kind: kind.to_string(),
        config,
    }
}

fn invalid_field(result: Result<ActionOutput, ActionError>) -> String {
    match result {
        Err(ActionError::InvalidConfig { field, .. }) => field,
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
}

// ---------------------------------------------------------------- calls

#[test]
fn a_call_merges_the_detail_params_over_the_template_config() {
    let template = ActionTemplate {
        id: Uuid::new_v4(),
        name: "notify".into(),
        kind: "http".into(),
        config: json!({
            "method": "POST",
            "url": "https://hooks.example/default",
            "headers": {"Authorization": "Bearer t", "Accept": "text/plain"},
        }),
        created_at: 0,
        updated_at: 0,
    };
    let detail = ActionDetail {
        id: Uuid::new_v4(),
        branch_rule_id: Uuid::new_v4(),
        action_template_id: template.id,
        position: 3,
        params: json!({"url": "https://hooks.example/branch-7", "headers": {"Accept": "application/json"}}),
        created_at: 0,
        updated_at: 0,
    };
    let execution_id = Uuid::new_v4();
    let call = ActionCall::new(execution_id, &template, &detail);
    assert_eq!(call.execution_id, execution_id);
    assert_eq!(call.branch_rule_id, detail.branch_rule_id);
    assert_eq!(call.action_detail_id, detail.id);
    assert_eq!(call.position, 3);
    assert_eq!(call.kind, "http");
    assert_eq!(
        call.config,
        json!({
            "method": "POST",
            "url": "https://hooks.example/branch-7",
            "headers": {"Authorization": "Bearer t", "Accept": "application/json"},
        })
    );
    assert_eq!(call.config, merge_config(&template.config, &detail.params));
}

#[test]
fn merge_config_edge_cases() {
    assert_eq!(
        merge_config(&json!({"ms": 1}), &Value::Null),
        json!({"ms": 1})
    );
    assert_eq!(
        merge_config(&json!({"args": ["a", "b"]}), &json!({"args": ["c"]})),
        json!({"args": ["c"]})
    );
    assert_eq!(
        merge_config(&json!({"env": {"A": "1"}}), &json!({"env": {"B": "2"}})),
        json!({"env": {"A": "1", "B": "2"}})
    );
}

// ------------------------------------------------------------- registry

struct Fixed {
    kind: &'static str,
    output: Value,
}

impl ActionHandler for Fixed {
    fn kind(&self) -> &str {
        self.kind
    }

    fn run<'a>(&'a self, _call: &'a ActionCall) -> ActionFuture<'a> {
        Box::pin(async move { Ok(ActionOutput(self.output.clone())) })
    }
}

#[tokio::test]
async fn registry_registers_replaces_and_rejects_unknown_kinds() {
    let mut registry = ActionRegistry::with_builtins(ActionSettings::default());
    assert_eq!(registry.kinds(), vec!["command", "http", "noop", "sleep"]);
    assert!(registry.get("report").is_none());

    registry.register(Arc::new(Fixed {
        kind: "report",
        output: json!({"rows": 3}),
    }));
    assert_eq!(
        registry.kinds(),
        vec!["command", "http", "noop", "report", "sleep"]
    );
    assert_eq!(
        registry.run(&call("report", json!({}))).await.unwrap().0,
        json!({"rows": 3})
    );

    // Same name: the new handler replaces the built-in.
    registry.register(Arc::new(Fixed {
        kind: "noop",
        output: json!({"replaced": true}),
    }));
    assert_eq!(registry.kinds().len(), 5);
    assert_eq!(
        registry.run(&call("noop", json!({}))).await.unwrap().0,
        json!({"replaced": true})
    );

    match registry.run(&call("nope", json!({}))).await {
        Err(ActionError::UnknownKind(kind)) => assert_eq!(kind, "nope"),
        other => panic!("expected UnknownKind, got {other:?}"),
    }
    let message = ActionError::UnknownKind("nope".into()).to_string();
    assert!(message.contains("nope"), "{message}");
}

#[tokio::test]
async fn the_registry_bounds_a_custom_handlers_output() {
    let mut registry = ActionRegistry::new();
    registry.register(Arc::new(Fixed {
        kind: "chatty",
        output: json!({"text": "y".repeat(OUTPUT_TOTAL_CAP_BYTES * 2)}),
    }));
    let output = registry.run(&call("chatty", json!({}))).await.unwrap().0;
    assert_eq!(output["truncated"], json!(true));
    assert!(serde_json::to_string(&output).unwrap().len() <= OUTPUT_TOTAL_CAP_BYTES);
}

/// A library user's kind backed by something expensive to load.
static MODELS_LOADED: AtomicUsize = AtomicUsize::new(0);

struct Classifier {
    calls: AtomicUsize,
    /// Released only when `expected` calls are inside `run` at once, so the
    /// test cannot pass unless one instance serves them concurrently.
    all_in_flight: tokio::sync::Barrier,
}

impl Classifier {
    fn load(expected: usize) -> Classifier {
        MODELS_LOADED.fetch_add(1, Ordering::SeqCst);
        Classifier {
            calls: AtomicUsize::new(0),
            all_in_flight: tokio::sync::Barrier::new(expected),
        }
    }
}

impl ActionHandler for Classifier {
    fn kind(&self) -> &str {
        "classify"
    }

    fn run<'a>(&'a self, call: &'a ActionCall) -> ActionFuture<'a> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.all_in_flight.wait().await;
            let text = call.config["text"].as_str().unwrap_or_default();
            Ok(ActionOutput(
                json!({"label": if text.contains('!') { "urgent" } else { "normal" }}),
            ))
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shared_handler_instance_serves_many_concurrent_calls() {
    const CALLS: usize = 16;
    let mut registry = ActionRegistry::with_builtins(ActionSettings::default());
    let classifier = Arc::new(Classifier::load(CALLS));
    registry.register(classifier.clone());

    let mut workers = tokio::task::JoinSet::new();
    for i in 0..CALLS {
        // Each worker holds its own clone, as the worker actors do.
        let registry = registry.clone();
        workers.spawn(async move {
            let text = if i % 2 == 0 { "hello!" } else { "hello" };
            registry.run(&call("classify", json!({"text": text}))).await
        });
    }
    let results = tokio::time::timeout(Duration::from_secs(10), workers.join_all())
        .await
        .expect("every call got in at once");
    for result in &results {
        let label = &result.as_ref().unwrap().0["label"];
        assert!(label == "urgent" || label == "normal", "{label}");
    }

    assert_eq!(results.len(), CALLS);
    assert_eq!(
        MODELS_LOADED.load(Ordering::SeqCst),
        1,
        "the model loaded once"
    );
    assert_eq!(
        classifier.calls.load(Ordering::SeqCst),
        CALLS,
        "all calls on that one instance"
    );
    let shared = registry.get("classify").unwrap();
    assert!(Arc::ptr_eq(
        &shared,
        &registry.clone().get("classify").unwrap()
    ));
}

// ----------------------------------------------------------- noop, sleep

#[tokio::test]
async fn noop_succeeds_with_an_empty_object() {
    let registry = ActionRegistry::with_builtins(ActionSettings::default());
    assert_eq!(
        registry.run(&call("noop", json!({}))).await.unwrap().0,
        json!({})
    );
    assert_eq!(
        registry.run(&call("noop", Value::Null)).await.unwrap().0,
        json!({})
    );
}

#[tokio::test(start_paused = true)]
async fn sleep_waits_on_tokios_clock() {
    let registry = ActionRegistry::with_builtins(ActionSettings::default());
    let virtual_start = tokio::time::Instant::now();
    let real_start = std::time::Instant::now();

    let output = registry
        .run(&call("sleep", json!({"ms": 3_600_000})))
        .await
        .unwrap();

    assert_eq!(output.0, json!({"slept_ms": 3_600_000}));
    assert!(virtual_start.elapsed() >= Duration::from_secs(3600));
    assert!(
        real_start.elapsed() < Duration::from_secs(5),
        "the paused clock skipped ahead"
    );
}

#[tokio::test(start_paused = true)]
async fn sleep_is_cancelled_by_a_timeout() {
    let registry = ActionRegistry::with_builtins(ActionSettings::default());
    let sleep_call = call("sleep", json!({"ms": 10_000}));
    let result = tokio::time::timeout(Duration::from_secs(1), registry.run(&sleep_call)).await;
    assert!(result.is_err(), "the worker's timeout wins");
}

#[tokio::test]
async fn sleep_needs_a_non_negative_ms() {
    let registry = ActionRegistry::with_builtins(ActionSettings::default());
    assert_eq!(
        invalid_field(registry.run(&call("sleep", json!({}))).await),
        "ms"
    );
    assert_eq!(
        invalid_field(registry.run(&call("sleep", json!({"ms": -5}))).await),
        "ms"
    );
    assert_eq!(
        invalid_field(registry.run(&call("sleep", json!({"ms": "soon"}))).await),
        "ms"
    );
    let message = registry
        .run(&call("sleep", json!({"ms": -5})))
        .await
        .unwrap_err()
        .to_string();
    assert!(message.contains("`ms`"), "{message}");
}

// ------------------------------------------------------------------ http

/// A minimal HTTP/1.1 responder, one response per connection. It counts
/// connections so a test can show a refused target was never contacted.
struct TestServer {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
}

async fn start_server() -> TestServer {
    let connections = Arc::new(AtomicUsize::new(0));
    let counter = connections.clone();
    let addr = serve(move |socket| {
        counter.fetch_add(1, Ordering::SeqCst);
        respond(socket)
    })
    .await;
    TestServer { addr, connections }
}

async fn respond(mut socket: TcpStream) {
    let Some(request) = read_request(&mut socket).await else {
        return;
    };
    let path = request.split_whitespace().nth(1).unwrap_or("/").to_string();
    let (status, extra, body): (&str, &str, Vec<u8>) = match path.as_str() {
        "/ok" => (
            "200 OK",
            "content-type: text/plain\r\nset-cookie: session=abc\r\n",
            b"hello".to_vec(),
        ),
        "/fail" => ("500 Internal Server Error", "", b"boom".to_vec()),
        "/big" => ("200 OK", "", vec![b'x'; OUTPUT_CAP_BYTES * 3]),
        "/echo" => ("200 OK", "", request.into_bytes()),
        "/moved" => ("302 Found", "location: /ok\r\n", Vec::new()),
        "/hang" => {
            // Never answers; the client's timeout has to end the action.
            tokio::time::sleep(Duration::from_secs(60)).await;
            return;
        }
        _ => ("404 Not Found", "", Vec::new()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n{extra}\r\n",
        body.len()
    );
    let _ = socket.write_all(head.as_bytes()).await;
    // The client may stop reading a big body early; that is the point.
    let _ = socket.write_all(&body).await;
    let _ = socket.shutdown().await;
}

/// The request head and body as text.
fn http(url: String) -> ActionCall {
    call("http", json!({ "url": url }))
}

#[tokio::test]
async fn http_2xx_succeeds_with_the_response_captured() {
    let server = start_server().await;
    let registry = ActionRegistry::with_builtins(PERMISSIVE);
    let output = registry
        .run(&http(format!("http://{}/ok", server.addr)))
        .await
        .unwrap()
        .0;
    assert_eq!(output["status"], 200);
    assert_eq!(output["body"], "hello");
    assert_eq!(output["truncated"], false);
    assert_eq!(output["headers"]["content-type"], "text/plain");
    assert!(
        output["headers"].get("set-cookie").is_none(),
        "cookies are not stored"
    );
}

#[tokio::test]
async fn http_sends_method_headers_and_json_body() {
    let server = start_server().await;
    let registry = ActionRegistry::with_builtins(PERMISSIVE);
    let echo = call(
        "http",
        json!({
            "method": "put",
            "url": format!("http://{}/echo", server.addr),
            "headers": {"X-Token": "abc123"},
            "body": {"branch": 7},
        }),
    );
    let request = registry.run(&echo).await.unwrap().0["body"]
        .as_str()
        .unwrap()
        .to_lowercase();
    assert!(request.starts_with("put /echo http/1.1"), "{request}");
    // The header went out; the echo of it is scrubbed before it is kept
    // (header values are secret by default, issue 12).
    assert!(request.contains("x-token: ***"), "{request}");
    assert!(!request.contains("abc123"), "{request}");
    assert!(
        request.contains("content-type: application/json"),
        "{request}"
    );
    assert!(request.ends_with(r#"{"branch":7}"#), "{request}");
}

#[tokio::test]
async fn http_non_2xx_fails_with_the_status_and_the_response() {
    let server = start_server().await;
    let registry = ActionRegistry::with_builtins(PERMISSIVE);
    match registry
        .run(&http(format!("http://{}/fail", server.addr)))
        .await
    {
        Err(ActionError::Failed { message, output }) => {
            assert!(message.contains("500"), "{message}");
            let output = output.expect("the response is kept");
            assert_eq!(output["status"], 500);
            assert_eq!(output["body"], "boom");
        }
        other => panic!("expected Failed, got {other:?}"),
    }
}

#[tokio::test]
async fn http_redirects_are_not_followed() {
    let server = start_server().await;
    let registry = ActionRegistry::with_builtins(PERMISSIVE);
    match registry
        .run(&http(format!("http://{}/moved", server.addr)))
        .await
    {
        Err(ActionError::Failed { message, output }) => {
            assert!(message.contains("302"), "{message}");
            assert_eq!(output.unwrap()["headers"]["location"], "/ok");
        }
        other => panic!("expected Failed, got {other:?}"),
    }
}

#[tokio::test]
async fn http_large_body_is_truncated_and_marked() {
    let server = start_server().await;
    let registry = ActionRegistry::with_builtins(PERMISSIVE);
    let output = registry
        .run(&http(format!("http://{}/big", server.addr)))
        .await
        .unwrap()
        .0;
    assert_eq!(output["truncated"], true);
    assert_eq!(output["body"].as_str().unwrap().len(), OUTPUT_CAP_BYTES);
}

#[tokio::test]
async fn http_to_loopback_is_refused_without_the_flag() {
    let server = start_server().await;
    let registry = ActionRegistry::with_builtins(ActionSettings {
        http_action_allow_private: false,
        ..PERMISSIVE
    });
    match registry
        .run(&http(format!("http://{}/ok", server.addr)))
        .await
    {
        Err(ActionError::Refused { reason }) => {
            assert!(reason.contains("127.0.0.1"), "{reason}");
            assert!(reason.contains("loopback"), "{reason}");
            assert!(reason.contains("HTTP_ACTION_ALLOW_PRIVATE"), "{reason}");
        }
        other => panic!("expected Refused, got {other:?}"),
    }
    assert_eq!(
        server.connections.load(Ordering::SeqCst),
        0,
        "never contacted"
    );

    // A name is resolved and its addresses checked the same way.
    let url = format!("http://localhost:{}/ok", server.addr.port());
    match registry.run(&http(url)).await {
        Err(ActionError::Refused { reason }) => {
            assert!(reason.contains("localhost"), "{reason}");
            assert!(reason.contains("HTTP_ACTION_ALLOW_PRIVATE"), "{reason}");
        }
        other => panic!("expected Refused, got {other:?}"),
    }
    for blocked in [
        "http://169.254.169.254/latest/meta-data/",
        "http://10.1.2.3/",
        "http://[fd00::1]/",
    ] {
        let result = registry.run(&http(blocked.to_string())).await;
        assert!(
            matches!(result, Err(ActionError::Refused { .. })),
            "{blocked}: {result:?}"
        );
    }
    assert_eq!(server.connections.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn http_bad_urls_name_the_field() {
    let registry = ActionRegistry::with_builtins(PERMISSIVE);
    for config in [
        json!({}),
        json!({"url": "not a url"}),
        json!({"url": "ftp://example.com/file"}),
        json!({"url": "unix:/var/run/docker.sock"}),
        json!({"url": 42}),
    ] {
        let result = registry.run(&call("http", config.clone())).await;
        assert_eq!(invalid_field(result), "url", "{config}");
    }
    let message = registry
        .run(&call("http", json!({"url": "ftp://example.com/"})))
        .await
        .unwrap_err()
        .to_string();
    assert!(message.contains("`url`"), "{message}");
}

#[tokio::test]
async fn http_timeout_ms_times_out() {
    let server = start_server().await;
    let registry = ActionRegistry::with_builtins(PERMISSIVE);
    let slow = call(
        "http",
        json!({"url": format!("http://{}/hang", server.addr), "timeout_ms": 200}),
    );
    match registry.run(&slow).await {
        Err(ActionError::TimedOut { after_ms }) => assert_eq!(after_ms, 200),
        other => panic!("expected TimedOut, got {other:?}"),
    }
}

// --------------------------------------------------------------- command

/// Config for a command whose processes carry `marker` in their environment.
fn command(marker: &str, program: &str, args: &[&str]) -> ActionCall {
    call(
        "command",
        json!({"program": program, "args": args, "env": {"RULED_TEST_MARKER": marker}}),
    )
}

/// Live (not zombie) processes whose environment holds the marker.
fn marked_pids(marker: &str) -> HashSet<i32> {
    let needle = format!("RULED_TEST_MARKER={marker}");
    let mut pids = HashSet::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if environ
            .split(|&b| b == 0)
            .any(|var| var == needle.as_bytes())
            && is_running(pid)
        {
            pids.insert(pid);
        }
    }
    pids
}

/// The process's state letter from /proc, or `None` if it no longer exists.
fn state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses; the state follows
    // the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Exists and is not a zombie. A zombie whose parent is not us (an orphaned
/// grandchild waiting for a PID 1 that may never reap) has nonetheless
/// stopped running, which is what matters for "nothing left behind".
fn is_running(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence.
    let exists = unsafe { libc::kill(pid, 0) } == 0;
    exists && !matches!(state(pid), None | Some('Z') | Some('X'))
}

/// Fully gone: not even a zombie. Used for our direct child, which only we
/// can reap.
fn is_gone(pid: i32) -> bool {
    state(pid).is_none()
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls `run` until `count` marked processes are up, then returns their
/// pids with the future still running.
async fn start_and_find(
    run: &mut std::pin::Pin<Box<impl Future<Output = Result<ActionOutput, ActionError>>>>,
    marker: &str,
    count: usize,
) -> HashSet<i32> {
    let find = async {
        let mut pids = HashSet::new();
        wait_until("the command's processes started", || {
            pids = marked_pids(marker);
            pids.len() >= count
        })
        .await;
        pids
    };
    tokio::select! {
        result = run.as_mut() => panic!("the command ended early: {result:?}"),
        pids = find => pids,
    }
}

#[tokio::test]
async fn command_is_disabled_unless_enabled() {
    let registry = ActionRegistry::with_builtins(ActionSettings::default());
    match registry.run(&command("x", "echo", &["hi"])).await {
        Err(error @ ActionError::Disabled { .. }) => {
            let message = error.to_string();
            assert!(
                message.contains("COMMAND_ACTIONS_ENABLED=true"),
                "{message}"
            );
        }
        other => panic!("expected Disabled, got {other:?}"),
    }
}

#[tokio::test]
async fn command_output_is_captured() {
    let registry = ActionRegistry::with_builtins(PERMISSIVE);
    let output = registry
        .run(&command("echo", "echo", &["hi"]))
        .await
        .unwrap()
        .0;
    assert_eq!(output["stdout"], "hi\n");
    assert_eq!(output["stderr"], "");
    assert_eq!(output["exit_code"], 0);
    assert_eq!(output["signal"], Value::Null);
    assert_eq!(output["stdout_truncated"], false);
}

#[tokio::test]
async fn command_arguments_are_not_interpreted_by_a_shell() {
    let registry = ActionRegistry::with_builtins(PERMISSIVE);
    let output = registry
        .run(&command("argv", "echo", &["$HOME", "a;b", "*"]))
        .await
        .unwrap()
        .0;
    assert_eq!(output["stdout"], "$HOME a;b *\n");
}

#[tokio::test]
async fn command_non_zero_exit_fails_with_the_code() {
    let registry = ActionRegistry::with_builtins(PERMISSIVE);
    match registry
        .run(&command(
            "exit",
            "sh",
            &["-c", "echo partial; echo oops >&2; exit 3"],
        ))
        .await
    {
        Err(ActionError::Failed { message, output }) => {
            assert!(message.contains("code 3"), "{message}");
            let output = output.expect("the captured output is kept");
            assert_eq!(output["exit_code"], 3);
            assert_eq!(output["stdout"], "partial\n");
            assert_eq!(output["stderr"], "oops\n");
        }
        other => panic!("expected Failed, got {other:?}"),
    }
}

#[tokio::test]
async fn command_stdout_is_capped() {
    let registry = ActionRegistry::with_builtins(PERMISSIVE);
    // About 590 KB: the program must not block on a full pipe once the cap
    // is reached.
    let output = registry
        .run(&command("cap", "seq", &["1", "100000"]))
        .await
        .unwrap()
        .0;
    assert_eq!(output["stdout_truncated"], true);
    assert_eq!(output["stdout"].as_str().unwrap().len(), OUTPUT_CAP_BYTES);
    assert!(output["stdout"].as_str().unwrap().starts_with("1\n2\n3\n"));
    assert_eq!(output["exit_code"], 0);
}

#[tokio::test]
async fn a_cancelled_command_leaves_no_process_behind() {
    let registry = ActionRegistry::with_builtins(PERMISSIVE);
    let marker = Uuid::new_v4().to_string();
    let sleeper = command(&marker, "sleep", &["30"]);
    let mut run = Box::pin(registry.run(&sleeper));
    let pids = start_and_find(&mut run, &marker, 1).await;
    let child = *pids.iter().next().unwrap();

    // The worker's timeout: it drops the future when the time is up.
    let timed = tokio::time::timeout(Duration::from_millis(50), run.as_mut()).await;
    assert!(timed.is_err(), "sleep 30 cannot finish in 50 ms");
    drop(run);

    // Killed and reaped: not even a zombie remains.
    wait_until("the child is gone", || is_gone(child)).await;
    assert!(marked_pids(&marker).is_empty());
}

#[tokio::test]
async fn a_cancelled_command_takes_its_grandchildren_with_it() {
    let registry = ActionRegistry::with_builtins(PERMISSIVE);
    let marker = Uuid::new_v4().to_string();
    // `sh` is the program under test here: it starts a grandchild.
    let parent = command(&marker, "sh", &["-c", "sleep 30 & wait"]);
    let mut run = Box::pin(registry.run(&parent));
    let pids = start_and_find(&mut run, &marker, 2).await;
    assert_eq!(pids.len(), 2, "sh and its background sleep");

    drop(run);

    wait_until("the whole group is gone", || {
        pids.iter().all(|&pid| !is_running(pid))
    })
    .await;
    assert!(marked_pids(&marker).is_empty());
}

#[tokio::test]
async fn command_timeout_ms_times_out_and_kills_the_group() {
    let registry = ActionRegistry::with_builtins(PERMISSIVE);
    let marker = Uuid::new_v4().to_string();
    let mut slow = command(&marker, "sh", &["-c", "sleep 30 & wait"]);
    slow.config["timeout_ms"] = json!(300);
    let mut run = Box::pin(registry.run(&slow));
    let pids = start_and_find(&mut run, &marker, 2).await;

    match run.await {
        Err(ActionError::TimedOut { after_ms }) => assert_eq!(after_ms, 300),
        other => panic!("expected TimedOut, got {other:?}"),
    }
    // The action reaps its child before returning; the grandchild goes to
    // PID 1 and may take a moment.
    wait_until("the whole group is gone", || {
        pids.iter().all(|&pid| !is_running(pid))
    })
    .await;
    assert!(marked_pids(&marker).is_empty());
}

#[tokio::test]
async fn command_processes_left_running_at_exit_are_killed() {
    let registry = ActionRegistry::with_builtins(PERMISSIVE);
    let marker = Uuid::new_v4().to_string();
    // The background sleep closes its copy of stdout so the pipes do not
    // keep the action waiting; it would otherwise outlive the job.
    let output = registry
        .run(&command(
            &marker,
            "sh",
            &["-c", "sleep 30 >/dev/null 2>&1 & echo started"],
        ))
        .await
        .unwrap()
        .0;
    assert_eq!(output["stdout"], "started\n");
    wait_until("the leftover sleep is gone", || {
        marked_pids(&marker).is_empty()
    })
    .await;
}
