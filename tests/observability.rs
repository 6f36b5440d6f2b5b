//! The shipped Prometheus and Grafana files against the real tools: promtool
//! checks the scrape config and alert rules and runs the alerts' unit tests,
//! and the dashboard and alerts name only metrics `src/metrics.rs` has.
//!
//! `promtool` comes from Debian's `prometheus` package. Without it these
//! tests are skipped with a loud notice, unless `CI=true`, where they fail.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

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
    ] {
        assert!(alerts.contains(&format!("- alert: {alert}\n")), "{alert}");
        let tests = read("prometheus/alerts_test.yml");
        assert!(
            tests.contains(&format!("alertname: {alert}\n")),
            "no promtool test for {alert}"
        );
    }
}
