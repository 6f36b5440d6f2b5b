//! `command` {program, args, env, timeout_ms}: runs one program, never
//! through a shell, and only when COMMAND_ACTIONS_ENABLED=true.
//!
//! The program gets an empty environment plus PATH plus the config's `env`
//! (the scheduler's own secrets, such as DATABASE_URL, stay out), a null
//! stdin, and captured stdout and stderr. It runs in a process group of its
//! own so that everything it starts can be killed together: when the action
//! is cancelled or times out, and also when the program exits, since a job
//! that leaves processes behind would keep working after ruled recorded it
//! as finished.

use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::process::{Child, Command};

use super::capture::{Captured, drain_into};
use super::leftovers::{CommandLedger, TOKEN_VARIABLE};
use super::{
    ActionCall, ActionError, ActionFuture, ActionHandler, ActionOutput, OUTPUT_CAP_BYTES, fields,
};

pub const DEFAULT_TIMEOUT_MS: u64 = 60_000;

/// Used when ruled itself runs without PATH, so `program: "echo"` still works.
const FALLBACK_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// After the program exits, how long its output pipes may stay open. A
/// process that escaped the group (setsid) can hold them forever; the exit
/// status is what counts, so stop waiting for such a straggler.
const PIPE_GRACE: Duration = Duration::from_secs(2);

#[derive(Debug)]
pub struct CommandAction {
    enabled: bool,
    /// Where running programs' groups are written down, if anywhere
    /// ([`super::leftovers`]).
    ledger: Option<Arc<CommandLedger>>,
}

impl CommandAction {
    pub fn new(enabled: bool, ledger: Option<Arc<CommandLedger>>) -> CommandAction {
        CommandAction { enabled, ledger }
    }
}

impl ActionHandler for CommandAction {
    fn kind(&self) -> &str {
        "command"
    }

    fn run<'a>(&'a self, call: &'a ActionCall) -> ActionFuture<'a> {
        Box::pin(async move {
            if !self.enabled {
                return Err(ActionError::Disabled {
                    kind: "command".into(),
                    how_to_enable: "set COMMAND_ACTIONS_ENABLED=true to allow them".into(),
                });
            }
            let spec = Spec::parse(&call.config)?;
            run_program(&spec, self.ledger.clone()).await
        })
    }
}

#[derive(Debug)]
struct Spec {
    program: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    timeout_ms: u64,
}

impl Spec {
    fn parse(config: &Value) -> Result<Spec, ActionError> {
        let program = fields::req_str(config, "program")?.to_string();
        if program.contains('\0') {
            return Err(ActionError::invalid("program", "contains a NUL byte"));
        }
        let args = fields::string_list(config, "args")?;
        if args.iter().any(|a| a.contains('\0')) {
            return Err(ActionError::invalid(
                "args",
                "an argument contains a NUL byte",
            ));
        }
        let env = fields::string_map(config, "env")?;
        for (key, value) in &env {
            if key.is_empty() || key.contains('=') || key.contains('\0') || value.contains('\0') {
                return Err(ActionError::invalid(
                    "env",
                    format!("`{key}` is not a valid environment variable"),
                ));
            }
        }
        Ok(Spec {
            program,
            args,
            env,
            timeout_ms: fields::timeout_ms(config, DEFAULT_TIMEOUT_MS)?,
        })
    }
}

async fn run_program(
    spec: &Spec,
    ledger: Option<Arc<CommandLedger>>,
) -> Result<ActionOutput, ActionError> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| FALLBACK_PATH.into());
    let mut command = Command::new(&spec.program);
    command
        .args(&spec.args)
        .env_clear()
        .env("PATH", path)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        // Backstop only: it reaches the child, not its descendants; the
        // group guard below does the real work.
        .kill_on_drop(true);
    die_with_the_service(&mut command);
    // Written down before the fork, so a crash at any moment after it
    // leaves nothing the restart cannot find.
    let run = match &ledger {
        Some(ledger) => {
            let token = ledger.starting().await;
            command.env(TOKEN_VARIABLE, &token);
            Some((Arc::clone(ledger), token))
        }
        None => None,
    };
    let child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            if let Some((ledger, token)) = &run {
                ledger.ended(token);
            }
            return Err(ActionError::failed(format!(
                "could not start `{}`: {e}",
                spec.program
            )));
        }
    };
    let mut group = GroupGuard::new(child, run);
    tracing::debug!(program = %spec.program, pid = group.pgid, "command action started");

    let mut stdout = Captured::new(OUTPUT_CAP_BYTES);
    let mut stderr = Captured::new(OUTPUT_CAP_BYTES);
    let after_ms = spec.timeout_ms;
    let finished = tokio::time::timeout(
        Duration::from_millis(after_ms),
        collect(&mut group, &mut stdout, &mut stderr),
    )
    .await;
    let status = match finished {
        Ok(Ok(status)) => status,
        Ok(Err(e)) => {
            group.kill_and_reap().await;
            return Err(ActionError::failed(format!(
                "waiting for `{}` failed: {e}",
                spec.program
            )));
        }
        Err(_) => {
            group.kill_and_reap().await;
            return Err(ActionError::TimedOut { after_ms });
        }
    };
    group.disarm();

    let (stdout, stdout_truncated) = stdout.into_text();
    let (stderr, stderr_truncated) = stderr.into_text();
    let output = json!({
        "exit_code": status.code(),
        "signal": status.signal(),
        "stdout": stdout,
        "stderr": stderr,
        "stdout_truncated": stdout_truncated,
        "stderr_truncated": stderr_truncated,
    });
    if status.success() {
        return Ok(ActionOutput(output));
    }
    let how = match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}{}", signal_name(signal)),
        (None, None) => format!("ended with {status}"),
    };
    Err(ActionError::Failed {
        message: format!("command `{}` {how}", spec.program),
        output: Some(output),
    })
}

/// The program is killed when ruled dies, even by SIGKILL, where no guard
/// runs: after a crash the restart records the run lost and runs the
/// occurrence again, so a program left running would be a second run at
/// once. This reaches the program itself; what it started in its group
/// outlives a SIGKILL of ruled.
///
/// Linux ties the signal to the thread that forked, not the process: tokio
/// forks on the runtime thread polling the action, and its worker threads
/// live as long as the runtime. (A handler of a library user's that calls
/// `block_in_place` hands its thread to the blocking pool, which may end it
/// while a program forked there still runs, killing that program; and the
/// kernel clears the setting for a setuid or file-capability program.)
fn die_with_the_service(command: &mut Command) {
    let service = std::process::id();
    // SAFETY: between fork and exec the closure only makes async-signal-safe
    // calls (prctl, getppid, _exit) and allocates nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // ruled died before the prctl: the signal will never come.
            if u32::try_from(libc::getppid()).ok() != Some(service) {
                libc::_exit(137);
            }
            Ok(())
        });
    }
}

/// Waits for the program while draining both pipes (a child blocked on a
/// full pipe never exits), then kills whatever it left in its group and
/// gives the pipes a moment to close.
async fn collect(
    group: &mut GroupGuard,
    stdout: &mut Captured,
    stderr: &mut Captured,
) -> std::io::Result<ExitStatus> {
    let out_pipe = group.child.as_mut().and_then(|c| c.stdout.take());
    let err_pipe = group.child.as_mut().and_then(|c| c.stderr.take());
    let (status, pipes_closed) = {
        let drain = async {
            tokio::join!(
                async {
                    if let Some(pipe) = out_pipe {
                        drain_into(pipe, &mut *stdout).await;
                    }
                },
                async {
                    if let Some(pipe) = err_pipe {
                        drain_into(pipe, &mut *stderr).await;
                    }
                },
            )
        };
        tokio::pin!(drain);

        let child = group
            .child
            .as_mut()
            .expect("the child is held until disarmed");
        let mut drained = false;
        let status = loop {
            tokio::select! {
                status = child.wait() => break status?,
                _ = &mut drain, if !drained => drained = true,
            }
        };
        group.kill_group();
        let pipes_closed = drained || tokio::time::timeout(PIPE_GRACE, &mut drain).await.is_ok();
        (status, pipes_closed)
    };
    if !pipes_closed {
        stdout.mark_truncated();
        stderr.mark_truncated();
    }
    Ok(status)
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGHUP => " (SIGHUP)",
        libc::SIGINT => " (SIGINT)",
        libc::SIGQUIT => " (SIGQUIT)",
        libc::SIGABRT => " (SIGABRT)",
        libc::SIGKILL => " (SIGKILL)",
        libc::SIGSEGV => " (SIGSEGV)",
        libc::SIGPIPE => " (SIGPIPE)",
        libc::SIGTERM => " (SIGTERM)",
        libc::SIGBUS => " (SIGBUS)",
        libc::SIGFPE => " (SIGFPE)",
        _ => "",
    }
}

/// Owns the child and, until disarmed, kills its whole process group when
/// dropped. This is what makes the action cancel-safe: the worker cancels by
/// dropping the future, and `kill_on_drop` alone would spare grandchildren.
struct GroupGuard {
    child: Option<Child>,
    /// The child's pid, which `process_group(0)` made its group id.
    pgid: Option<i32>,
    armed: bool,
    /// Holds the run (its token, then its group) while it may run; struck
    /// off when the guard goes, by then the group was killed or ended.
    run: Option<(Arc<CommandLedger>, String)>,
}

impl GroupGuard {
    fn new(child: Child, run: Option<(Arc<CommandLedger>, String)>) -> GroupGuard {
        let pgid = child.id().and_then(|pid| i32::try_from(pid).ok());
        if let (Some((ledger, token)), Some(pgid)) = (&run, pgid) {
            ledger.started(token, pgid);
        }
        GroupGuard {
            child: Some(child),
            pgid,
            armed: true,
            run,
        }
    }

    /// SIGKILL to every process in the group.
    ///
    /// While the child is unreaped its pid cannot be reused, so the group id
    /// is ours. After `collect` reaps it, the id stays ours as long as any
    /// member lives (the kernel keeps a group id in use); with no member
    /// left the signal finds nobody, barring a pid wraparound within
    /// microseconds.
    fn kill_group(&self) {
        if let Some(pgid) = self.pgid.filter(|&p| p > 1) {
            // SAFETY: kill(2) has no memory-safety preconditions; a negative
            // pid addresses the process group.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
    }

    async fn kill_and_reap(&mut self) {
        self.kill_group();
        if let Some(child) = self.child.as_mut() {
            let _ = child.wait().await;
        }
        self.armed = false;
    }

    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if self.armed {
            self.kill_group();
        }
        if let Some((ledger, token)) = &self.run {
            ledger.ended(token);
        }
        if !self.armed {
            return;
        }
        let Some(mut child) = self.child.take() else {
            return;
        };
        // Reap it, or it lingers as a zombie. Drop cannot await, so the wait
        // moves to a task; SIGKILL makes it short.
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    let _ = child.wait().await;
                });
            }
            // No runtime (it is shutting down): dropping the child hands it
            // to tokio's orphan queue, which reaps it when it can.
            Err(_) => drop(child),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid_field(config: Value) -> String {
        match Spec::parse(&config) {
            Err(ActionError::InvalidConfig { field, .. }) => field,
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn parses_defaults() {
        let spec = Spec::parse(&json!({"program": "echo"})).unwrap();
        assert_eq!(spec.program, "echo");
        assert!(spec.args.is_empty());
        assert!(spec.env.is_empty());
        assert_eq!(spec.timeout_ms, DEFAULT_TIMEOUT_MS);
    }

    #[test]
    fn bad_fields_are_named() {
        assert_eq!(invalid_field(json!({})), "program");
        assert_eq!(invalid_field(json!({"program": ""})), "program");
        assert_eq!(
            invalid_field(json!({"program": "x", "args": "a b"})),
            "args"
        );
        assert_eq!(
            invalid_field(json!({"program": "x", "args": [{"a": 1}]})),
            "args"
        );
        assert_eq!(
            invalid_field(json!({"program": "x", "env": {"A=B": "1"}})),
            "env"
        );
        assert_eq!(invalid_field(json!({"program": "x", "env": ["A"]})), "env");
        assert_eq!(
            invalid_field(json!({"program": "x", "timeout_ms": -1})),
            "timeout_ms"
        );
    }

    #[tokio::test]
    async fn environment_is_only_path_and_the_given_env() {
        let spec = Spec::parse(&json!({
            "program": "env",
            "env": {"GREETING": "hello"},
        }))
        .unwrap();
        let output = run_program(&spec, None).await.unwrap();
        let stdout = output.0["stdout"].as_str().unwrap();
        let mut names: Vec<&str> = stdout.lines().filter_map(|l| l.split('=').next()).collect();
        names.sort();
        assert_eq!(names, vec!["GREETING", "PATH"], "{stdout}");
        assert!(stdout.contains("GREETING=hello"));
    }

    #[tokio::test]
    async fn a_missing_program_fails_to_start() {
        let spec = Spec::parse(&json!({"program": "/nonexistent/ruled-test-program"})).unwrap();
        let err = run_program(&spec, None).await.unwrap_err().to_string();
        assert!(err.contains("could not start"), "{err}");
    }

    #[tokio::test]
    async fn a_signal_is_reported() {
        let spec = Spec::parse(&json!({"program": "sh", "args": ["-c", "kill -TERM $$"]})).unwrap();
        match run_program(&spec, None).await {
            Err(ActionError::Failed { message, output }) => {
                assert!(message.contains("signal 15 (SIGTERM)"), "{message}");
                let output = output.unwrap();
                assert_eq!(output["signal"], 15);
                assert_eq!(output["exit_code"], Value::Null);
            }
            other => panic!("expected Failed, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn stderr_is_captured_separately() {
        let spec = Spec::parse(&json!({"program": "sh", "args": ["-c", "echo out; echo err >&2"]}))
            .unwrap();
        let output = run_program(&spec, None).await.unwrap();
        assert_eq!(output.0["stdout"], "out\n");
        assert_eq!(output.0["stderr"], "err\n");
    }
}
