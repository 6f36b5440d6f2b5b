//! The metrics and the shipped Prometheus and Grafana files against the
//! real tools: a running `ruled serve --demo` exports every metric name of
//! DESIGN.md §5; promtool checks the scrape config and alert rules and runs
//! the alerts' unit tests; the dashboard and alerts name only metrics
//! `src/metrics.rs` has; and a real Prometheus scraping a real ruled
//! answers every query of the dashboard with data.
//!
//! `promtool` and `prometheus` come from Debian's `prometheus` package.
//! Without them those tests are skipped with a loud notice, unless
//! `CI=true`, where they fail.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::api::client;
use common::process::{DEADLINE, Install, signal, wait_exit};
use reqwest::StatusCode;
use serde_json::Value;

/// The metric names DESIGN.md §5 lists, written out here so that renaming
/// a constant in `src/metrics.rs` fails this test.
const DESIGN_METRICS: &[&str] = &[
    "ruled_plan_workflows",
    "ruled_plan_refresh_total",
    "ruled_plan_refresh_duration_seconds",
    "ruled_plan_merge_changes_total",
    "ruled_plan_write_total",
    "ruled_plan_write_duration_seconds",
    "ruled_plan_write_queue_size",
    "ruled_queue_size",
    "ruled_active_jobs",
    "ruled_workers",
    "ruled_jobs_total",
    "ruled_job_duration_seconds",
    "ruled_dispatch_lag_seconds",
    "ruled_jobs_deduplicated_total",
    "ruled_memory_used_ratio",
    "ruled_memory_throttle_active",
    "ruled_actor_restarts_total",
    "ruled_lock_claims_total",
    "ruled_db_errors_total",
    "ruled_build_info",
];

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A program of the `prometheus` package on PATH, or `None` after a loud
/// notice outside CI.
fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|path| path.is_file())
    });
    if found.is_none() {
        let test = std::thread::current()
            .name()
            .unwrap_or("<unnamed>")
            .to_string();
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!(
                "{test}: {name} is not on PATH (CI=true, so this is a failure; \
                 .ci/run installs Debian's prometheus package)"
            );
        }
        // Straight to the stderr handle: libtest captures `eprintln!` of
        // passing tests, and a silent skip would read as a pass.
        let _ = writeln!(
            std::io::stderr(),
            "\n!!! SKIPPING {test}: {name} is not on PATH\n\
             !!! install it (Debian: apt-get install prometheus) to run this test\n"
        );
    }
    found
}

#[test]
fn promtool_accepts_the_scrape_config_and_the_alert_rules_and_their_tests_pass() {
    let Some(promtool) = tool("promtool") else {
        return;
    };
    for args in [
        ["check", "config", "prometheus/prometheus.yml"],
        ["check", "rules", "prometheus/alerts.yml"],
        ["test", "rules", "prometheus/alerts_test.yml"],
    ] {
        let output = Command::new(&promtool)
            .args(args)
            .current_dir(repo(""))
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "promtool {} failed:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

fn dashboard() -> Value {
    serde_json::from_str(&read("grafana/dashboards/ruled.json")).expect("the dashboard is JSON")
}

/// `(panel title, expression)` for every query of every panel.
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        if panel["type"] == "row" {
            continue;
        }
        let title = panel["title"].as_str().expect("a panel title").to_string();
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {title:?} has no query");
        for target in targets {
            let expr = target["expr"].as_str().expect("a PromQL expr");
            assert!(
                !expr.trim().is_empty(),
                "panel {title:?} has an empty query"
            );
            queries.push((title.clone(), expr.to_string()));
        }
    }
    queries
}

/// Every `ruled_…` name in `text`, as written.
fn metric_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("ruled_") {
        let boundary = rest[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if boundary {
            names.push(name.clone());
        }
        rest = &rest[at + name.len()..];
    }
    names
}

/// The metric a series name belongs to: histograms add `_bucket`, `_sum`
/// and `_count`.
fn metric_of(series: &str) -> Option<&'static str> {
    let base = ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|suffix| series.strip_suffix(suffix))
        .filter(|base| ruled::metrics::ALL.contains(base))
        .unwrap_or(series);
    ruled::metrics::ALL.iter().copied().find(|m| *m == base)
}

#[test]
fn the_dashboard_shows_every_metric_and_names_only_real_ones() {
    let dashboard = dashboard();
    let queries = dashboard_queries(&dashboard);
    assert!(queries.len() >= 20, "{} queries", queries.len());

    let mut shown = std::collections::BTreeSet::new();
    for (title, expr) in &queries {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{title:?}: {expr} reads no ruled metric");
        for name in names {
            let metric = metric_of(&name)
                .unwrap_or_else(|| panic!("{title:?}: {name} is not in src/metrics.rs"));
            shown.insert(metric);
        }
    }
    for metric in ruled::metrics::ALL {
        assert!(shown.contains(metric), "no panel shows {metric}");
    }

    // Each panel is drawn from the provisioned datasource, with its own id.
    let datasources = read("grafana/provisioning/datasources/prometheus.yml");
    let mut ids = std::collections::HashSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        assert!(ids.insert(panel["id"].as_u64().expect("a panel id")));
        if panel["type"] != "row" {
            let uid = panel["datasource"]["uid"].as_str().expect("a datasource");
            assert!(
                datasources.contains(&format!("uid: {uid}\n")),
                "{uid} is not provisioned"
            );
        }
    }
    let provider = read("grafana/provisioning/dashboards/ruled.yml");
    assert!(provider.contains("path: /var/lib/grafana/dashboards\n"));
    assert!(read("grafana/README.md").contains("grafana/dashboards:/var/lib/grafana/dashboards"));
}

#[test]
fn the_alerts_name_only_real_metrics_and_cover_each_concern() {
    let alerts = read("prometheus/alerts.yml");
    let names = metric_names(&alerts);
    assert!(names.len() >= 6, "{names:?}");
    for name in names {
        assert!(
            metric_of(&name).is_some(),
            "{name} is not in src/metrics.rs"
        );
    }
    for alert in [
        "RuledRuleMissedWindow",
        "RuledDispatchLagHigh",
        "RuledMemoryThrottleStuck",
        "RuledPlanWriterDown",
        "RuledActorsRestarting",
        "RuledPlanRefreshFailing",
        "RuledCapacityExceeded",
    ] {
        assert!(alerts.contains(&format!("- alert: {alert}\n")), "{alert}");
    }
    // Every alert, not only the listed ones, has a promtool test.
    let tests = read("prometheus/alerts_test.yml");
    for alert in alerts
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- alert: "))
    {
        assert!(
            tests.contains(&format!("alertname: {alert}\n")),
            "no promtool test for {alert}"
        );
    }
}

/// A child process killed when the test ends, passing or not.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn free_loopback_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `ruled serve --demo` on `http_addr`, logging to `serve.log`. The master
/// waits `grace` before its first fetch.
fn serve_demo(install: &Install, http_addr: &str, grace: &str) -> Reaped {
    let child = install.spawn_logged(
        install
            .command(&["serve", "--demo"])
            .env("HTTP_ADDR", http_addr)
            .env("MASTER_GRACE_PERIOD_SECONDS", grace)
            .env("WORKER_STAGGER_SECONDS", "0")
            .env("WORKER_COOLDOWN_SECONDS", "0"),
        "serve.log",
    );
    Reaped(child)
}

/// The address the service logged it listens on.
fn listening_on(install: &Install) -> String {
    install.listening_addr("serve.log").to_string()
}

fn stop(install: &Install, mut server: Reaped) {
    signal(&server.0, libc::SIGTERM);
    let status = wait_exit(&mut server.0);
    assert_eq!(status.code(), Some(0), "{}", install.log("serve.log"));
}

/// The metric names in a Prometheus text exposition with at least one
/// sample each (a histogram's samples are its `_bucket`, `_sum`, `_count`).
fn exported_names(text: &str) -> Vec<String> {
    let typed: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    typed
        .into_iter()
        .filter(|name| {
            text.lines().filter(|l| !l.starts_with('#')).any(|l| {
                let series = l.split(['{', ' ']).next().unwrap_or("");
                series == *name
                    || ["_bucket", "_sum", "_count"]
                        .iter()
                        .any(|suffix| series.strip_suffix(suffix) == Some(*name))
            })
        })
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_lists_every_design_metric_soon_after_start() {
    let install = Install::new();
    // Port 0: the service binds a free port and logs it. The master holds
    // off long enough that every name has to be there before any job ran.
    let server = serve_demo(&install, "127.0.0.1:0", "30");
    let url = format!("http://{}/metrics", listening_on(&install));
    let http = client();
    let deadline = Instant::now() + DEADLINE;
    let missing = loop {
        let response = http.get(&url).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let text = response.text().await.unwrap();
        let exported = exported_names(&text);
        let missing: Vec<&str> = DESIGN_METRICS
            .iter()
            .copied()
            .filter(|name| !exported.iter().any(|e| e == name))
            .collect();
        if missing.is_empty() {
            break missing;
        }
        if Instant::now() > deadline {
            break missing;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        missing.is_empty(),
        "not in /metrics within {DEADLINE:?}: {missing:?}\n{}",
        install.log("serve.log")
    );
    assert!(
        !install.log("serve.log").contains("👷 Worker-"),
        "a job ran, so the names were not shown to be there from the start"
    );
    stop(&install, server);
}

/// Grafana's variables, as the dashboard's defaults would fill them: every
/// instance, and a rate window of a minute.
fn as_grafana_would_send(expr: &str) -> String {
    let query = expr
        .replace("$__rate_interval", "1m")
        .replace("$instance", ".*");
    assert!(!query.contains('$'), "an unknown variable in {expr}");
    query
}

/// Prometheus's HTTP API: `data` of a successful answer, or a panic with
/// the error (a query Prometheus refuses will not get better by waiting).
async fn prometheus_api(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    query: &[(&str, &str)],
) -> Value {
    let url = reqwest::Url::parse_with_params(&format!("{base}{path}"), query).unwrap();
    let response = http.get(url).send().await.unwrap();
    let text = response.text().await.unwrap();
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    assert_eq!(body["status"], "success", "{path} {query:?}: {text}");
    body["data"].clone()
}

/// True when an instant query's result has a series with a finite value: a
/// panel with something to draw.
fn has_data(data: &Value) -> bool {
    data["result"].as_array().is_some_and(|series| {
        series.iter().any(|s| {
            s["value"][1]
                .as_str()
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(f64::is_finite)
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scraping_the_demo_answers_every_dashboard_query() {
    let Some(prometheus) = tool("prometheus") else {
        return;
    };
    let install = Install::new();
    let ruled_addr = format!("127.0.0.1:{}", free_loopback_port());
    let prometheus_addr = format!("127.0.0.1:{}", free_loopback_port());

    // Prometheus first, so it scrapes from the service's first second on.
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - {alerts}\n\
         scrape_configs:\n  - job_name: ruled\n    static_configs:\n      - targets: [\"{ruled_addr}\"]\n",
        alerts = repo("prometheus/alerts.yml").display()
    );
    std::fs::write(install.path("prometheus.yml"), config).unwrap();
    let _prometheus = Reaped(
        Command::new(prometheus)
            .arg(format!(
                "--config.file={}",
                install.path("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                install.path("tsdb").display()
            ))
            .arg(format!("--web.listen-address={prometheus_addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(install.path("prometheus.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let base = format!("http://{prometheus_addr}");
    let http = client();
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Ok(r) = http.get(format!("{base}/-/ready")).send().await
            && r.status() == StatusCode::OK
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus did not get ready:\n{}",
            install.log("prometheus.log")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Prometheus starts its scrape loops a few seconds after it is ready;
    // wait for the first (failed) scrape of the not yet started service.
    let deadline = Instant::now() + DEADLINE;
    loop {
        let data = prometheus_api(&http, &base, "/api/v1/targets", &[]).await;
        let scraped = data["activeTargets"]
            .as_array()
            .is_some_and(|targets| targets.iter().any(|t| t["health"] == "down"));
        if scraped {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus never scraped: {data}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The demo rules are due at once; the master's grace period lets a few
    // scrapes see the counters at 0 before the first jobs move them, so the
    // rates and quantiles have something to show from the start.
    let server = serve_demo(&install, &ruled_addr, "3");
    assert_eq!(listening_on(&install), ruled_addr);

    let queries: Vec<(String, String)> = dashboard_queries(&dashboard())
        .into_iter()
        .map(|(title, expr)| (title, as_grafana_would_send(&expr)))
        .collect();
    let mut waiting: BTreeMap<usize, Value> =
        (0..queries.len()).map(|i| (i, Value::Null)).collect();
    let deadline = Instant::now() + 2 * DEADLINE;
    while !waiting.is_empty() && Instant::now() < deadline {
        for (i, last) in waiting.iter_mut() {
            *last =
                prometheus_api(&http, &base, "/api/v1/query", &[("query", &queries[*i].1)]).await;
        }
        waiting.retain(|_, data| !has_data(data));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let empty: Vec<String> = waiting
        .iter()
        .map(|(i, data)| {
            format!(
                "{:?}: {}\n  last answer: {data}",
                queries[*i].0, queries[*i].1
            )
        })
        .collect();
    assert!(
        empty.is_empty(),
        "dashboard queries without data after {:?} (now {:?}):\n{}\n--- ruled:\n{}\n--- prometheus:\n{}",
        2 * DEADLINE,
        std::time::SystemTime::now(),
        empty.join("\n"),
        install.log("serve.log"),
        install.log("prometheus.log")
    );

    // The alert rules ran against the real series without an error.
    let deadline = Instant::now() + DEADLINE;
    loop {
        let data = prometheus_api(&http, &base, "/api/v1/rules", &[]).await;
        let rules: Vec<&Value> = data["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap())
            .collect();
        assert!(rules.len() >= 7, "{data}");
        for rule in &rules {
            assert_ne!(rule["health"], "err", "{rule}");
        }
        if rules.iter().all(|r| r["health"] == "ok") {
            break;
        }
        assert!(Instant::now() < deadline, "rules never evaluated: {data}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    stop(&install, server);
}
