//! The `ruled` binary as a child process: scratch installs, signals and
//! polling with a deadline (never a fixed sleep).

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_ruled");
pub const DEADLINE: Duration = Duration::from_secs(30);

/// A scratch directory with the environment a fresh install would have.
pub struct Install {
    dir: tempfile::TempDir,
    database_url: String,
}

impl Install {
    /// A fresh install on its own SQLite file.
    pub fn new() -> Install {
        let dir = tempfile::tempdir().unwrap();
        let database_url = format!("sqlite://{}", dir.path().join("ruled.db").display());
        Install { dir, database_url }
    }

    /// A fresh install on an existing database (a test's PostgreSQL one).
    pub fn with_database(database_url: &str) -> Install {
        Install {
            dir: tempfile::tempdir().unwrap(),
            database_url: database_url.to_string(),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(BIN);
        command
            .args(args)
            .current_dir(self.dir.path())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("DATABASE_URL", &self.database_url)
            .env("PLAN_FILE", self.path("plan.json"))
            .env("SHUTDOWN_MARKER_FILE", self.path("marker.json"))
            .env("EXECUTION_PLAN_REFRESH_SECONDS", "0.2")
            .env("HTTP_ADDR", "127.0.0.1:0")
            .env("RUST_LOG", "info");
        command
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// Starts `ruled serve` with stderr going to `log_name`.
    pub fn serve(&self, log_name: &str) -> Child {
        self.spawn_logged(&mut self.command(&["serve"]), log_name)
    }

    /// Starts `command` (from [`Install::command`], with the test's own
    /// arguments and settings) with stderr going to `log_name`.
    pub fn spawn_logged(&self, command: &mut Command, log_name: &str) -> Child {
        let log = std::fs::File::create(self.path(log_name)).unwrap();
        command.stdout(Stdio::null()).stderr(log).spawn().unwrap()
    }

    pub fn log(&self, log_name: &str) -> String {
        std::fs::read_to_string(self.path(log_name)).unwrap_or_default()
    }

    /// The address `ruled serve` logged it listens on, once it has (its
    /// log is `log_name`).
    pub fn listening_addr(&self, log_name: &str) -> std::net::SocketAddr {
        const NEEDLE: &str = "HTTP API listening on http://";
        self.wait_for_log(log_name, NEEDLE);
        let log = self.log(log_name);
        let rest = &log[log.find(NEEDLE).unwrap() + NEEDLE.len()..];
        let addr: String = rest
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
            .collect();
        addr.parse()
            .unwrap_or_else(|_| panic!("the log names no address: {addr:?}"))
    }

    pub fn wait_for_log(&self, log_name: &str, needle: &str) {
        let deadline = Instant::now() + DEADLINE;
        while !self.log(log_name).contains(needle) {
            assert!(
                Instant::now() < deadline,
                "{needle:?} never appeared in the log:\n{}",
                self.log(log_name)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

pub fn signal(child: &Child, signal: i32) {
    // SAFETY: kill(2) on a pid we spawned and have not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
}

pub fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    wait_exit_within(child, DEADLINE)
}

pub fn wait_exit_within(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "the process did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn wait_until(condition: impl Fn() -> bool, what: &str) {
    let deadline = Instant::now() + DEADLINE;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
