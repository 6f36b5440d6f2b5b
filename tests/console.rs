//! The web console in a real headless Chromium, driven through WebDriver
//! (Debian's `chromium` and `chromium-driver`), against a real `ruled serve
//! --demo` on SQLite: every page loads without a console error and shows
//! what the API and `ruled plan` say; run now, cancel and force stop work
//! from the buttons; the token rules hold; nothing overflows at 360 px or
//! 1280 px; and each page's screenshot is written for the README.
//!
//! Without Chromium the tests skip with a loud notice; with `CI=true` they
//! fail (`.ci/run` installs it).

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use common::api::client;
use common::chromium::Browser;
use common::process::Install;
use serde_json::{Value, json};

const TOKEN: &str = "console-token";
/// Long enough for a loaded machine; the 2 s promise is checked apart.
const DEADLINE: Duration = Duration::from_secs(20);
const DESKTOP: (u32, u32) = (1280, 900);
const PHONE: (u32, u32) = (360, 780);

/// A `ruled serve --demo` child, killed when dropped.
struct Server {
    child: Child,
    base: String,
    install: Install,
    token: Option<&'static str>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start(token: Option<&'static str>) -> Server {
        Server::start_on(Install::new(), &["serve", "--demo"], token)
    }

    fn start_on(install: Install, args: &[&str], token: Option<&'static str>) -> Server {
        let mut command = install.command(args);
        command.env("WORKER_STAGGER_SECONDS", "0");
        if let Some(token) = token {
            command.env("API_TOKEN", token);
        }
        let child = install.spawn_logged(&mut command, "serve.log");
        let addr = install.listening_addr("serve.log");
        Server {
            child,
            base: format!("http://{addr}"),
            install,
            token,
        }
    }

    fn url(&self, fragment: &str) -> String {
        format!("{}/#{fragment}", self.base)
    }

    async fn request(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = client().request(method.clone(), format!("{}/api/v1{path}", self.base));
        if let Some(token) = self.token {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        if let Some(body) = body {
            request = request
                .header("Content-Type", "application/json")
                .body(serde_json::to_vec(&body).unwrap());
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        assert!(status.is_success(), "{method} {path}: {status} {text}");
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    async fn get(&self, path: &str) -> Value {
        self.request(reqwest::Method::GET, path, None).await
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.request(reqwest::Method::POST, path, Some(body)).await
    }

    /// The demo's branch rules as `/plan/workflows` lists them.
    async fn workflows(&self) -> Vec<Value> {
        self.get("/plan/workflows?limit=1000").await["items"]
            .as_array()
            .unwrap()
            .clone()
    }

    /// A branch rule on the demo's first branch and rule that sleeps
    /// `ms` and is not due for a year: it runs only when asked.
    async fn sleeping_rule(&self, name: &str, ms: u64) -> String {
        let first = &self.workflows().await[0];
        let template = self
            .post(
                "/action-templates",
                json!({"name": name, "kind": "sleep", "config": {"ms": ms}}),
            )
            .await;
        let rule = self
            .post(
                "/rules",
                json!({"name": name, "brand_id": first["brand_id"], "cron_expression": "0 0 1 1 *"}),
            )
            .await;
        let branch_rule = self
            .post(
                "/branch-rules",
                json!({"branch_id": first["branch_id"], "rule_id": rule["id"]}),
            )
            .await;
        let id = branch_rule["id"].as_str().unwrap().to_string();
        self.post(
            &format!("/branch-rules/{id}/action-details"),
            json!({"action_template_id": template["id"], "params": {}}),
        )
        .await;
        // In the plan (the next refresh) before a page asks for it.
        let deadline = Instant::now() + DEADLINE;
        while self.get(&format!("/plan/workflows?ids={id}")).await["matched"] != 1 {
            assert!(
                Instant::now() < deadline,
                "the new rule never reached the plan"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        id
    }
}

/// Where the screenshots go: `RULED_SCREENSHOT_DIR`, else
/// `target/console-screenshots` (the README's come from there).
fn screenshot_dir() -> PathBuf {
    std::env::var_os("RULED_SCREENSHOT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots")
        })
}

/// Loads a console page by its fragment and waits until it rendered.
async fn open(browser: &Browser, server: &Server, fragment: &str) {
    browser.goto(&server.url(fragment)).await;
    wait_loaded(browser).await;
}

async fn wait_loaded(browser: &Browser) {
    browser
        .wait_until(
            "the page to render",
            DEADLINE,
            "return document.querySelector('main').dataset.loaded === 'true' \
             && !document.querySelector('main').textContent.startsWith('Loading');",
        )
        .await;
}

/// The page logged no error (failed request, script error, CSP refusal).
async fn assert_no_console_errors(browser: &Browser, page: &str) {
    let errors = browser.console_errors().await;
    assert!(errors.is_empty(), "{page}: console errors: {errors:#?}");
}

/// The `data-field` figures of the overview, by field.
async fn figures(browser: &Browser) -> BTreeMap<String, String> {
    let value = browser
        .execute(
            "const out = {}; for (const e of document.querySelectorAll('[data-field]')) \
             out[e.dataset.field] = e.dataset.value ?? e.textContent; return out;",
            vec![],
        )
        .await;
    serde_json::from_value(value).unwrap()
}

/// Every row of the Rules table: id → (next run local, verdict, state).
async fn rule_rows(browser: &Browser) -> BTreeMap<String, (String, String, String)> {
    let value = browser
        .execute(
            "const out = {}; for (const row of document.querySelectorAll('tr[data-rule]')) { \
               const next = row.querySelector('[data-next-local]'); \
               out[row.dataset.rule] = [next.dataset.nextLocal, \
                 row.querySelector('.verdict').textContent, row.dataset.state]; } return out;",
            vec![],
        )
        .await;
    serde_json::from_value(value).unwrap()
}

/// `ruled plan`'s line for each branch rule: id → (local next run, verdict).
fn plan_lines(server: &Server) -> BTreeMap<String, (String, String)> {
    let output = server.install.run(&["plan"]);
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "ruled plan failed: {text}");
    let line = regex::Regex::new(
        r"^(\S{36})  .*  next \S+ \((\d{4}-\d\d-\d\d \d\d:\d\d \S+) \S+\).*  ((?:READY|not ready).*)$",
    )
    .unwrap();
    text.lines()
        .filter_map(|l| line.captures(l))
        .map(|c| (c[1].to_string(), (c[2].to_string(), c[3].to_string())))
        .collect()
}

async fn assert_fits(browser: &Browser, page: &str, width: u32) {
    if let Some(overflow) = browser.horizontal_overflow().await {
        panic!("{page} at {width} px overflows horizontally: {overflow}");
    }
}

async fn enter_token(browser: &Browser, token: &str) {
    let input = browser.wait_for("#token-input", DEADLINE).await;
    input.clear().await;
    input.send_keys(token).await;
    browser.wait_for("#token-use", DEADLINE).await.click().await;
}

/// Clicks the enabled button `selector` in the page itself: live updates
/// re-render tables and buttons, so a WebDriver element found a moment
/// earlier may be gone by the time a click reaches it.
async fn click(browser: &Browser, selector: &str) {
    browser
        .wait_until(
            &format!("an enabled {selector}"),
            DEADLINE,
            &format!(
                "const b = document.querySelector({selector:?}); \
                 if (!b || b.disabled) return false; b.click(); return true;"
            ),
        )
        .await;
}

/// Clicks the button with `data-action` and waits for the notice.
async fn act(browser: &Browser, action: &str) -> String {
    // The click clears the last notice before it sends anything.
    click(browser, &format!("button[data-action='{action}']")).await;
    let notice = browser
        .wait_until(
            "the action's notice",
            DEADLINE,
            "const n = document.getElementById('notice'); return !n.hidden && n.textContent;",
        )
        .await;
    notice.as_str().unwrap_or_default().to_string()
}

/// Whether the `data-action` button is enabled, and its title, read in
/// one step (live updates replace buttons between WebDriver calls).
async fn button(browser: &Browser, action: &str) -> (bool, String) {
    let state = browser
        .wait_until(
            &format!("the {action} button"),
            DEADLINE,
            &format!(
                "const b = document.querySelector(\"button[data-action='{action}']\"); \
                 return b ? [!b.disabled, b.title] : null;"
            ),
        )
        .await;
    (
        state[0].as_bool().unwrap(),
        state[1].as_str().unwrap_or_default().to_string(),
    )
}

/// The text of the first `selector`, once there is one.
async fn text_of(browser: &Browser, selector: &str) -> String {
    browser
        .wait_until(
            selector,
            DEADLINE,
            &format!("const e = document.querySelector({selector:?}); return e && e.textContent;"),
        )
        .await
        .as_str()
        .unwrap_or_default()
        .to_string()
}

async fn execution_status(browser: &Browser, execution: &str) -> Option<String> {
    browser
        .execute(
            "const row = document.querySelector(`tr[data-execution='${arguments[0]}']`); \
             return row ? row.dataset.status : null;",
            vec![json!(execution)],
        )
        .await
        .as_str()
        .map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_shows_what_the_api_says_and_every_button_works() {
    let Some(browser) = Browser::start(DESKTOP.0, DESKTOP.1).await else {
        return;
    };
    let server = Server::start(Some(TOKEN));
    let shots = screenshot_dir();
    let workflows = server.workflows().await;
    assert_eq!(workflows.len(), 9, "the demo's branch rules");

    // Overview: its figures are /stats' and /instances'.
    open(&browser, &server, "/").await;
    let shown = figures(&browser).await;
    let stats = server.get("/stats").await;
    for field in ["queue.total_workers", "plan.workflows", "memory.throttled"] {
        let (group, name) = field.split_once('.').unwrap();
        assert_eq!(
            shown.get(field).map(String::as_str),
            Some(stats[group][name].to_string().as_str()),
            "overview {field}"
        );
    }
    let instances = server.get("/instances").await;
    let rows = browser.find_all("tr[data-instance]").await;
    assert_eq!(rows.len(), instances["instances"].as_array().unwrap().len());
    assert!(
        browser.find("svg.chart").await.is_some(),
        "the start-lag chart"
    );
    assert_no_console_errors(&browser, "overview").await;

    // Rules: each demo rule's local next run and verdict, as `ruled plan`
    // prints them. The engine moves on meanwhile (the heartbeat runs every
    // minute, the window verdicts name the local minute), so the two are
    // compared on a reading that held still while `ruled plan` ran.
    open(&browser, &server, "/rules").await;
    let mut attempts = 0;
    loop {
        attempts += 1;
        let before = rule_rows(&browser).await;
        let plan = plan_lines(&server);
        browser
            .execute("location.reload(); return 1;", vec![])
            .await;
        wait_loaded(&browser).await;
        let after = rule_rows(&browser).await;
        assert_eq!(after.len(), 9, "every demo rule on the page");
        let agree = after.iter().all(|(id, (local, verdict, _))| {
            plan.get(id) == Some(&(local.clone(), verdict.clone()))
        });
        if before == after && agree {
            break;
        }
        assert!(
            attempts < 6,
            "the Rules page and `ruled plan` disagree:\npage {after:#?}\nplan {plan:#?}"
        );
    }
    assert_no_console_errors(&browser, "rules").await;
    browser.full_page_screenshot(&shots.join("rules.png")).await;

    // Paging with the cursor: 9 rules, 4 a page, each seen once, and back.
    open(&browser, &server, "/rules?limit=4").await;
    let mut seen = Vec::new();
    let mut pages = 0;
    loop {
        pages += 1;
        let page: Vec<String> = rule_rows(&browser).await.into_keys().collect();
        assert!(page.len() <= 4);
        seen.extend(page);
        // Read and clicked in the page: a live refresh may re-render the
        // table and its buttons between two WebDriver calls.
        let first_before = browser
            .execute(
                "const next = document.querySelector(\"button[data-action='next-page']\"); \
                 return next && !next.disabled \
                   ? document.querySelector('tr[data-rule]').dataset.rule : null;",
                vec![],
            )
            .await;
        let Some(first_before) = first_before.as_str() else {
            break;
        };
        click(&browser, "button[data-action='next-page']").await;
        browser
            .wait_until(
                "the next page",
                DEADLINE,
                &format!(
                    "const row = document.querySelector('tr[data-rule]'); \
                     return row && row.dataset.rule !== {first_before:?};"
                ),
            )
            .await;
    }
    assert_eq!(pages, 3);
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 9, "every rule once across the pages");

    // Filters: by state and by name.
    open(&browser, &server, "/rules?q=nightly").await;
    let nightly = rule_rows(&browser).await;
    assert_eq!(nightly.len(), 3, "the three branches' nightly close-out");

    // Plan: the decision log, soonest next run first.
    open(&browser, &server, "/plan").await;
    assert!(browser.find("[data-field='plan.summary']").await.is_some());
    assert_eq!(rule_rows(&browser).await.len(), 9);
    assert_no_console_errors(&browser, "plan").await;
    browser.full_page_screenshot(&shots.join("plan.png")).await;

    // Run now: the Executions page, left open, shows the run completed
    // without a reload, within 2 s of the run's end.
    let heartbeat = workflows
        .iter()
        .find(|w| w["rule"] == "Heartbeat every minute")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    open(
        &browser,
        &server,
        &format!("/executions?branch_rule_id={heartbeat}"),
    )
    .await;
    browser
        .execute("window.notReloaded = true; return 1;", vec![])
        .await;
    let known: Vec<String> = browser
        .execute(
            "return [...document.querySelectorAll('tr[data-execution]')].map(r => r.dataset.execution);",
            vec![],
        )
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    server
        .post(&format!("/branch-rules/{heartbeat}/run"), json!({}))
        .await;
    let started = Instant::now();
    let completed = loop {
        let page = server
            .get(&format!(
                "/executions?branch_rule_id={heartbeat}&order=desc&limit=5"
            ))
            .await;
        let new = page["items"].as_array().unwrap().iter().find(|e| {
            e["status"] == "completed" && !known.contains(&e["id"].as_str().unwrap().to_string())
        });
        if let Some(new) = new {
            break new["id"].as_str().unwrap().to_string();
        }
        assert!(started.elapsed() < DEADLINE, "the run never completed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let ended = Instant::now();
    while execution_status(&browser, &completed).await.as_deref() != Some("completed") {
        assert!(
            ended.elapsed() < Duration::from_secs(2),
            "the Executions page did not show run {completed} completed within 2 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        browser
            .execute("return window.notReloaded === true;", vec![])
            .await,
        json!(true),
        "the page was reloaded"
    );
    assert_no_console_errors(&browser, "executions").await;

    // Rule detail, without a token: the buttons are off and say why.
    let sleeper = server.sleeping_rule("Long pause", 30_000).await;
    open(&browser, &server, &format!("/rules/{sleeper}")).await;
    let (run_now_enabled, _) = button(&browser, "run-now").await;
    assert!(!run_now_enabled, "run now without a token");
    let why = text_of(&browser, "[data-why='actions']").await;
    assert!(why.contains("API token"), "{why}");

    // A wrong token: the action fails with the 401 shown.
    enter_token(&browser, "not-the-token").await;
    let refused = act(&browser, "run-now").await;
    assert!(refused.contains("401"), "{refused}");
    // The browser logs the refused request itself; that one is expected.
    for error in browser.console_errors().await {
        assert!(error.contains("401"), "{error}");
    }

    // The right token: run now, cancel the running 30 s sleep from the
    // history, and see it cancelled.
    enter_token(&browser, TOKEN).await;
    let accepted = act(&browser, "run-now").await;
    assert!(accepted.contains("Run requested"), "{accepted}");
    let running = browser
        .wait_until(
            "the run to show running",
            DEADLINE,
            "const row = document.querySelector(\"tr[data-status='running']\"); \
             return row && row.dataset.execution;",
        )
        .await;
    let running = running.as_str().unwrap().to_string();
    click(
        &browser,
        &format!("tr[data-execution='{running}'] button[data-action='cancel']"),
    )
    .await;
    let deadline = Instant::now() + DEADLINE;
    while execution_status(&browser, &running).await.as_deref() != Some("cancelled") {
        assert!(
            Instant::now() < deadline,
            "the cancelled run never showed cancelled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stored = server.get(&format!("/executions/{running}")).await;
    assert_eq!(stored["status"], "cancelled");
    assert_no_console_errors(&browser, "rule detail").await;
    browser.full_page_screenshot(&shots.join("rule.png")).await;

    // Force stop: the rule shows stopped, as the API says.
    let stopped = act(&browser, "force-stop").await;
    assert!(stopped.contains("Force-stopped"), "{stopped}");
    browser
        .wait_until(
            "the rule to show force-stopped",
            DEADLINE,
            "const f = document.querySelector(\"[data-field='is_force_stopped']\"); \
             return f && f.textContent === 'yes' && !!document.querySelector('.badge.force_stopped');",
        )
        .await;
    assert_eq!(
        server.get(&format!("/branch-rules/{sleeper}")).await["is_force_stopped"],
        true
    );
    // The skip link moves the focus and leaves the route alone: the page
    // goes on showing this rule, with no error at the next reloads.
    let route = browser.execute("return location.hash;", vec![]).await;
    click(&browser, "a.skip").await;
    assert_eq!(
        browser.execute("return location.hash;", vec![]).await,
        route
    );
    assert_eq!(
        browser
            .execute("return document.activeElement.id;", vec![])
            .await,
        json!("main")
    );
    // Resume: the console lifts the force stop it set.
    let resumed = act(&browser, "resume").await;
    assert!(resumed.contains("Resumed"), "{resumed}");
    browser
        .wait_until(
            "the rule to show resumed",
            DEADLINE,
            "const f = document.querySelector(\"[data-field='is_force_stopped']\"); \
             return f && f.textContent === 'no' && !!document.querySelector(\"button[data-action='force-stop']\");",
        )
        .await;
    assert_eq!(
        server.get(&format!("/branch-rules/{sleeper}")).await["is_force_stopped"],
        false
    );
    let notice = browser
        .execute("const n = document.getElementById('notice'); return n.hidden || !n.classList.contains('error');", vec![])
        .await;
    assert_eq!(notice, json!(true), "an error after the skip link");

    // The Executions page lists what the database holds: the rule's runs,
    // newest first, each with its status.
    open(
        &browser,
        &server,
        &format!("/executions?branch_rule_id={sleeper}"),
    )
    .await;
    let shown = browser
        .execute(
            "return [...document.querySelectorAll('tr[data-execution]')] \
               .map(r => [r.dataset.execution, r.dataset.status]);",
            vec![],
        )
        .await;
    let stored: Vec<Value> = server
        .get(&format!("/executions?branch_rule_id={sleeper}&order=desc"))
        .await["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| json!([e["id"], e["status"]]))
        .collect();
    assert_eq!(
        shown,
        Value::Array(stored),
        "the Executions page against the database"
    );

    // Nothing overflows sideways, on a phone or a desktop.
    for fragment in [
        "/",
        "/rules",
        &format!("/rules/{sleeper}"),
        "/executions",
        "/plan",
    ] {
        for (width, height) in [PHONE, DESKTOP] {
            browser.set_window_size(width, height).await;
            open(&browser, &server, fragment).await;
            assert_fits(&browser, fragment, width).await;
        }
    }
    browser.set_window_size(PHONE.0, PHONE.1).await;
    open(&browser, &server, "/rules").await;
    browser
        .full_page_screenshot(&shots.join("rules-phone.png"))
        .await;
    // The README's overview and executions, once runs have happened.
    browser.set_window_size(DESKTOP.0, DESKTOP.1).await;
    open(&browser, &server, "/").await;
    browser
        .full_page_screenshot(&shots.join("overview.png"))
        .await;
    open(&browser, &server, "/executions").await;
    browser
        .full_page_screenshot(&shots.join("executions.png"))
        .await;
    assert_no_console_errors(&browser, "every page at both widths").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_api_token_the_console_is_read_only_and_says_so() {
    let Some(browser) = Browser::start(DESKTOP.0, DESKTOP.1).await else {
        return;
    };
    let server = Server::start(None);
    let rule = server.workflows().await[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    open(&browser, &server, &format!("/rules/{rule}")).await;
    let mode = text_of(&browser, "#mode").await;
    assert!(mode.contains("Read-only"), "{mode}");
    for action in ["run-now", "deactivate", "force-stop"] {
        let (enabled, title) = button(&browser, action).await;
        assert!(!enabled, "{action} is enabled read-only");
        assert!(title.contains("API_TOKEN"), "{action}: {title}");
    }
    let why = text_of(&browser, "[data-why='actions']").await;
    assert!(why.contains("API_TOKEN"), "{why}");
    // A token typed anyway changes nothing: the service refuses changes.
    enter_token(&browser, "anything").await;
    wait_loaded(&browser).await;
    let (enabled, _) = button(&browser, "run-now").await;
    assert!(!enabled, "run now is enabled after a token, read-only");
    assert_no_console_errors(&browser, "read-only rule detail").await;
}

#[tokio::test]
async fn every_asset_is_served_with_its_type_and_no_outside_origin() {
    let server = Server::start(None);
    for (path, kind) in [
        ("/", "text/html"),
        ("/console/app.js", "text/javascript"),
        ("/console/app.css", "text/css"),
        ("/console/icon.svg", "image/svg+xml"),
        ("/favicon.ico", "image/svg+xml"),
    ] {
        let response = client()
            .get(format!("{}{path}", server.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let headers = response.headers();
        let content_type = headers["content-type"].to_str().unwrap();
        assert!(content_type.starts_with(kind), "{path}: {content_type}");
        let policy = headers["content-security-policy"].to_str().unwrap();
        assert!(policy.contains("default-src 'self'"), "{path}: {policy}");
    }
    let missing = client()
        .get(format!("{}/console/nothing.js", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
}

/// Reads server-sent events from a response until `wanted` accepts one;
/// returns every (event, data) read.
async fn read_events(
    response: &mut reqwest::Response,
    wanted: impl Fn(&str, &Value) -> bool,
) -> Vec<(String, Value)> {
    let mut buffer = String::new();
    let mut events = Vec::new();
    let deadline = Instant::now() + DEADLINE;
    loop {
        let chunk = tokio::time::timeout_at(deadline.into(), response.chunk())
            .await
            .expect("no wanted event before the deadline")
            .unwrap()
            .expect("the stream ended");
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let mut name = String::new();
            let mut data = String::new();
            for line in block.lines() {
                if let Some(rest) = line.strip_prefix("event:") {
                    name = rest.trim().to_string();
                } else if let Some(rest) = line.strip_prefix("data:") {
                    data.push_str(rest.trim());
                }
            }
            if name.is_empty() {
                continue;
            }
            let data: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
            let done = wanted(&name, &data);
            events.push((name, data));
            if done {
                return events;
            }
        }
    }
}

#[tokio::test]
async fn the_event_stream_reports_each_state_of_a_run_from_the_database() {
    let server = Server::start(Some(TOKEN));
    let rule = server.sleeping_rule("Short sleep", 1_500).await;
    let mut response = client()
        .get(format!("{}/api/v1/events", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let hello = read_events(&mut response, |name, _| name == "hello").await;
    assert_eq!(hello[0].1["poll_interval_ms"], 500);
    let throttle = read_events(&mut response, |name, _| name == "throttle").await;
    assert_eq!(throttle.last().unwrap().1["throttled"], false);
    server
        .post(&format!("/branch-rules/{rule}/run"), json!({}))
        .await;
    let events = read_events(&mut response, |name, data| {
        name == "execution"
            && data["branch_rule_id"] == rule.as_str()
            && data["status"] == "completed"
    })
    .await;
    let statuses: Vec<&str> = events
        .iter()
        .filter(|(name, data)| name == "execution" && data["branch_rule_id"] == rule.as_str())
        .map(|(_, data)| data["status"].as_str().unwrap())
        .collect();
    // The 1.5 s sleep spans several looks: running is seen, then the end,
    // each once and in order.
    assert!(statuses.contains(&"running"), "{statuses:?}");
    assert_eq!(statuses.last(), Some(&"completed"));
    let mut deduped = statuses.clone();
    deduped.dedup();
    assert_eq!(deduped, statuses, "a status reported twice");
}

/// Completed executions written straight into the install's database,
/// each `requested_at` given: runs that began and ended between two looks.
async fn insert_completed_runs(server: &Server, rule: &str, requested: &[i64]) {
    let url = format!("sqlite://{}", server.install.path("ruled.db").display());
    let store = ruled::store::Store::connect(&url).await.unwrap();
    let rows: Vec<String> = requested
        .iter()
        .map(|at| {
            format!(
                "('{}', '{rule}', {at}, 'completed', 1, 'test', 1, {at}, {at}, {at}, {at}, {at}, {at})",
                uuid::Uuid::new_v4()
            )
        })
        .collect();
    store
        .execute_sql(&format!(
            "INSERT INTO executions (id, branch_rule_id, scheduled_for, status, attempt, owner, \
             lock_epoch, requested_at, scheduled_at, started_at, finished_at, created_at, \
             updated_at) VALUES {}",
            rows.join(", ")
        ))
        .await
        .unwrap();
    store.close().await;
}

/// More runs within the lookback than one read holds (issue 14's soak has
/// 1,000 a minute): a run that starts and ends after them is still news.
/// The read of new rows used to start at a fixed 30 s back and return the
/// same oldest page forever.
#[tokio::test]
async fn the_event_stream_keeps_up_with_more_runs_than_a_page() {
    let server = Server::start(Some(TOKEN));
    let rule = server.sleeping_rule("Busy", 10).await;
    let now = chrono::Utc::now().timestamp_millis();
    let burst: Vec<i64> = (0..1_200).map(|n| now - 20_000 + n * 10).collect();
    insert_completed_runs(&server, &rule, &burst).await;
    let mut response = client()
        .get(format!("{}/api/v1/events", server.base))
        .send()
        .await
        .unwrap();
    read_events(&mut response, |name, _| name == "hello").await;
    // Runs keep coming; the first look only primes the feed, so any of
    // those after it must be reported.
    let mut marker_at = now;
    let reported = loop {
        marker_at = marker_at.max(chrono::Utc::now().timestamp_millis()) + 1;
        insert_completed_runs(&server, &rule, &[marker_at]).await;
        let wanted = tokio::time::timeout(
            Duration::from_millis(1_500),
            read_events(&mut response, |name, data| {
                name == "execution" && data["branch_rule_id"] == rule.as_str()
            }),
        )
        .await;
        if let Ok(events) = wanted {
            break events;
        }
        assert!(
            chrono::Utc::now().timestamp_millis() < now + DEADLINE.as_millis() as i64,
            "no run after the burst was ever reported"
        );
    };
    let (_, data) = reported.last().unwrap();
    assert_eq!(data["status"], "completed");
    let burst_end = now - 20_000 + 1_200 * 10;
    let at = chrono::DateTime::parse_from_rfc3339(data["requested_at"].as_str().unwrap())
        .unwrap()
        .timestamp_millis();
    assert!(
        at >= burst_end,
        "a run of the primed burst was reported: {data}"
    );
}

/// Times, in the browser, from navigation until the page rendered.
async fn render_ms(browser: &Browser, fragment: &str) -> f64 {
    let script = "const done = arguments[arguments.length - 1]; \
        const main = document.querySelector('main'); \
        main.dataset.loaded = 'false'; \
        const started = performance.now(); \
        location.hash = arguments[0]; \
        const check = () => main.dataset.loaded === 'true' \
          ? done(performance.now() - started) : requestAnimationFrame(check); \
        check();";
    browser
        .execute_async(script, vec![json!(fragment)])
        .await
        .as_f64()
        .unwrap()
}

/// The Rules and Executions pages over 1,000 rules and 10,000 executions:
/// how long each takes to render, first page and next page, in Chromium.
/// A benchmark, not a test (BENCHMARKS.md):
/// `cargo test --release --test console -- --ignored --nocapture bench_`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run it by name"]
async fn bench_console_pages_with_1000_rules_and_10000_executions() {
    let Some(browser) = Browser::start(DESKTOP.0, DESKTOP.1).await else {
        return;
    };
    let install = Install::new();
    let url = format!("sqlite://{}", install.path("ruled.db").display());
    let store = ruled::store::Store::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    let now = chrono::Utc::now().timestamp_millis();
    let year = 365 * 86_400_000;
    let noop = common::rules::step("noop", json!({}));
    let ids =
        common::rules::insert_many_rules(&store, 1_000, "0 0 1 1 *", now + year, &noop, None).await;
    store
        .execute_sql("UPDATE branch_rules SET is_active = TRUE")
        .await
        .unwrap();
    for chunk in 0..20 {
        let rows: Vec<String> = (0..500)
            .map(|i| {
                let n = chunk * 500 + i;
                let at = now - (10_000 - n) * 60_000;
                let (status, error) = match n % 10 {
                    0 => ("failed", "'exit status 1'"),
                    1 => ("cancelled", "NULL"),
                    _ => ("completed", "NULL"),
                };
                format!(
                    "('{}', '{}', {at}, '{status}', 1, 'bench', 1, {at}, {at}, {at}, {}, {error}, {at}, {at})",
                    uuid::Uuid::new_v4(),
                    ids[n as usize % ids.len()],
                    at + 1_500
                )
            })
            .collect();
        store
            .execute_sql(&format!(
                "INSERT INTO executions (id, branch_rule_id, scheduled_for, status, attempt, owner, \
                 lock_epoch, requested_at, scheduled_at, started_at, finished_at, error, created_at, \
                 updated_at) VALUES {}",
                rows.join(", ")
            ))
            .await
            .unwrap();
    }
    store.close().await;
    let server = Server::start_on(install, &["serve"], Some(TOKEN));
    let deadline = Instant::now() + DEADLINE;
    while server.get("/plan/workflows?limit=1").await["matched"] != 1_000 {
        assert!(
            Instant::now() < deadline,
            "the 1,000 rules never reached the plan"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Each measure navigates to another page first: a fragment set to
    // itself changes nothing.
    open(&browser, &server, "/plan").await;
    let mut report = Vec::new();
    for (page, fragment, rows) in [
        ("Rules", "/rules", "tr[data-rule]"),
        ("Executions", "/executions", "tr[data-execution]"),
    ] {
        let mut first = Vec::new();
        let mut next = Vec::new();
        for _ in 0..5 {
            render_ms(&browser, "/").await;
            first.push(render_ms(&browser, fragment).await);
            assert_eq!(
                browser.find_all(rows).await.len(),
                50,
                "{page}: a full page"
            );
            let before = browser.find(rows).await.unwrap().text().await;
            let started = Instant::now();
            click(&browser, "button[data-action='next-page']").await;
            browser
                .wait_until(
                    "the next page",
                    DEADLINE,
                    &format!(
                        "const row = document.querySelector({rows:?}); \
                         return row && row.textContent !== {before:?} \
                           && document.querySelector('main').dataset.loaded === 'true';"
                    ),
                )
                .await;
            next.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        first.sort_by(f64::total_cmp);
        next.sort_by(f64::total_cmp);
        report.push(format!(
            "{page}: first page median {:.0} ms (max {:.0}), next page median {:.0} ms (max {:.0})",
            first[2], first[4], next[2], next[4]
        ));
    }
    assert_no_console_errors(&browser, "bench").await;
    println!(
        "\nconsole over 1,000 rules and 10,000 executions:\n{}",
        report.join("\n")
    );
}
