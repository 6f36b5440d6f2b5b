//! The `ruled` binary as an operator runs it: real processes, real signals,
//! a real SQLite file.

mod common;

use std::path::Path;

use common::process::{Install, signal, stderr, stdout, wait_exit, wait_until};

#[test]
fn help_lists_every_command() {
    let install = Install::new();
    let output = install.run(&["--help"]);
    assert!(output.status.success());
    let text = stdout(&output);
    for command in ["serve", "migrate", "demo", "plan", "preview"] {
        assert!(text.contains(command), "{command} missing from:\n{text}");
    }
}

#[test]
fn a_bad_variable_stops_start_up_and_is_named() {
    let install = Install::new();
    for (variable, value) in [
        ("WORKER_COUNT", "many"),
        ("DEFAULT_TIMEZONE", "Europe/Atlantis"),
        ("DATABASE_URL", "mysql://nope"),
        // With the default 30 s TTL: a lease would expire before three
        // renewals were tried.
        ("PARTITION_LEASE_RETRY_SECONDS", "11"),
    ] {
        let output = install
            .command(&["plan"])
            .env(variable, value)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{variable}");
        assert!(
            stderr(&output).contains(variable),
            "{variable}: {}",
            stderr(&output)
        );
    } // `serve` refuses the same settings before it starts anything.
    let output = install
        .command(&["serve"])
        .env("PARTITION_LEASE_TTL_SECONDS", "3")
        .env("PARTITION_LEASE_RETRY_SECONDS", "2")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("PARTITION_LEASE_RETRY_SECONDS"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn preview_prints_runs_in_utc_and_local_time_across_dst() {
    let install = Install::new();
    let output = install.run(&[
        "preview",
        "30 2 * * *",
        "--tz",
        "America/New_York",
        "--from",
        "2026-03-07T12:00:00Z",
        "--count",
        "2",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(
        stdout(&output),
        "2026-03-08T07:00:00Z  2026-03-08T03:00:00-04:00 EDT\n\
         2026-03-09T06:30:00Z  2026-03-09T02:30:00-04:00 EDT\n"
    );
    let output = install.run(&[
        "preview",
        "0 * * * *",
        "--tz",
        "Asia/Riyadh",
        "--window",
        "22:00-06:00",
        "--from",
        "2026-06-01T12:00:00Z",
        "--count",
        "3",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    // 12:00 UTC is 15:00 in Riyadh: the first run waits for the window.
    assert!(
        stdout(&output).starts_with("2026-06-01T19:00:00Z  2026-06-01T22:00:00+03:00"),
        "{}",
        stdout(&output)
    );

    let output = install.run(&["preview", "0 0 30 2 *"]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("0 0 30 2 *"),
        "{}",
        stderr(&output)
    );

    // Each bad argument is named, and none panics (exit 101) or tries to
    // allocate what it was asked for.
    for (args, flag) in [
        (&["--tz", "Mars/Olympus"][..], "--tz"),
        (&["--window", "9-17"][..], "--window"),
        (&["--count", "0"][..], "--count"),
        (&["--count", "18446744073709551615"][..], "--count"),
        (&["--count", "1001"][..], "--count"),
    ] {
        let mut command = vec!["preview", "* * * * *"];
        command.extend_from_slice(args);
        let output = install.run(&command);
        assert!(!output.status.success(), "{args:?}");
        assert_ne!(output.status.code(), Some(101), "{args:?}: a panic");
        assert!(
            stderr(&output).contains(flag),
            "{args:?}: {}",
            stderr(&output)
        );
    }
}

#[test]
fn demo_is_idempotent_and_plan_explains_each_workflow() {
    let install = Install::new();
    let first = install.run(&["demo"]);
    assert!(first.status.success(), "{}", stderr(&first));
    assert!(
        !stdout(&first).contains(" 0 row(s) inserted"),
        "{}",
        stdout(&first)
    );
    let second = install.run(&["demo"]);
    assert!(second.status.success(), "{}", stderr(&second));
    assert!(
        stdout(&second).contains(" 0 row(s) inserted"),
        "{}",
        stdout(&second)
    );

    let output = install.run(&["plan"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("9 workflow(s)"), "{text}");
    for line in &lines[1..] {
        assert!(line.contains("next 20"), "{line}");
        // "READY: …" when a minute turned between `demo` and `plan`: the
        // heartbeat then has a missed occurrence to explain.
        assert!(
            line.ends_with("READY") || line.contains("  READY: ") || line.contains("not ready: "),
            "{line}"
        );
    }
    for zone in ["Asia/Riyadh", "America/New_York", "Australia/Sydney"] {
        assert!(text.contains(zone), "{zone} missing:\n{text}");
    }
}

#[test]
fn plan_falls_back_to_the_plan_file_when_the_database_is_unreachable() {
    let install = Install::new();
    assert!(install.run(&["demo"]).status.success());
    // A served instance writes the plan file; stop it cleanly.
    let mut server = install.serve("serve.log");
    wait_until(
        || install.path("plan.json").exists(),
        "the plan file is written",
    );
    signal(&server, libc::SIGTERM);
    assert!(wait_exit(&mut server).success());

    let output = install
        .command(&["plan"])
        .env(
            "DATABASE_URL",
            "postgres://postgres@127.0.0.1:1/unreachable",
        )
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("plan.json saved at"),
        "{}",
        stderr(&output)
    );
    assert!(
        stdout(&output).starts_with("9 workflow(s)"),
        "{}",
        stdout(&output)
    );
}

#[test]
fn sigterm_writes_the_marker_and_the_next_start_knows_a_clean_stop_from_a_crash() {
    let install = Install::new();
    assert!(install.run(&["demo"]).status.success());

    let mut first = install.serve("first.log");
    install.wait_for_log("first.log", "Updated execution plan");
    wait_until(
        || install.path("plan.json").exists(),
        "the plan file is written",
    );
    signal(&first, libc::SIGTERM);
    let status = wait_exit(&mut first);
    assert_eq!(status.code(), Some(0), "{}", install.log("first.log"));
    let marker: serde_json::Value =
        serde_json::from_slice(&std::fs::read(install.path("marker.json")).unwrap()).unwrap();
    assert_eq!(marker["signal"], "SIGTERM");
    assert_eq!(marker["pid"], first.id());
    assert!(marker["shutdown_started_at"].as_i64().unwrap() > 0);

    let mut second = install.serve("second.log");
    install.wait_for_log("second.log", "last stop was clean: SIGTERM");
    install.wait_for_log(
        "second.log",
        "Reset 0 workflow(s) is_currently_running flag",
    );
    install.wait_for_log("second.log", "Updated execution plan");
    second.kill().unwrap(); // SIGKILL: no marker
    second.wait().unwrap();
    assert!(!install.path("marker.json").exists());

    let mut third = install.serve("third.log");
    install.wait_for_log("third.log", "last stop was a crash");
    signal(&third, libc::SIGINT);
    assert_eq!(wait_exit(&mut third).code(), Some(0));
    assert!(read_marker_signal(&install.path("marker.json")).contains("SIGINT"));
}

fn read_marker_signal(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[test]
fn a_corrupt_plan_file_is_ignored_with_a_warning() {
    let install = Install::new();
    assert!(install.run(&["demo"]).status.success());
    std::fs::write(install.path("plan.json"), b"{\"workflows\": [{\"torn").unwrap();
    let mut server = install.serve("serve.log");
    install.wait_for_log("serve.log", "Ignoring the plan file");
    install.wait_for_log("serve.log", "9 added");
    signal(&server, libc::SIGTERM);
    assert_eq!(wait_exit(&mut server).code(), Some(0));
    let snapshot = ruled::persist::read_plan_file(&install.path("plan.json"))
        .unwrap()
        .unwrap();
    assert_eq!(snapshot.workflows.len(), 9);
}
