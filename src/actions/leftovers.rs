//! What a `command` action leaves running when ruled dies by SIGKILL.
//!
//! The program itself dies with ruled (`PR_SET_PDEATHSIG`), but what it
//! started in its process group does not: the kernel hands it to init. The
//! restart records the run lost and runs the occurrence again, so such a
//! straggler would be a second run of the occurrence at once. While a
//! program runs, it is written down in a small file next to PLAN_FILE; a
//! start kills whatever that file names is still running, before its
//! recovery lets the occurrences run again.
//!
//! Each run is written down twice. Before the fork, a random token, which
//! the program gets in its environment as [`TOKEN_VARIABLE`] and passes on
//! to whatever it starts (even a daemon that left the group): a crash
//! after the fork but before the group was known, when the program may
//! already have started its own, still finds them. After the fork, the
//! group, which also catches what cleared its environment.
//!
//! A group is known by its id and its leader's start time (clock ticks
//! since boot, `/proc/<pid>/stat`). A process counts as left over only if
//! it is in that group and started no earlier than the leader: a group id
//! is not handed out again while any member lives, and a reused one would
//! be younger than every straggler's ruled run, barring a pid wraparound
//! between the crash and the restart.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use crate::persist::write_atomic;

/// The environment variable that carries a run's token to its program and
/// everything the program starts.
pub const TOKEN_VARIABLE: &str = "RULED_COMMAND_TOKEN";

/// The running programs, kept on disk while they run: each run's token,
/// and its group (id, leader's start time) once it is known.
#[derive(Debug)]
pub struct CommandLedger {
    path: PathBuf,
    runs: Mutex<BTreeMap<String, Option<(i32, u64)>>>,
}

/// A process a `command` action of an earlier run of ruled left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leftover {
    pub pid: i32,
    pub group: i32,
    pub command: String,
}

impl CommandLedger {
    /// A ledger kept at `path` (which a start reads with [`kill_leftovers`]).
    pub fn at(path: PathBuf) -> CommandLedger {
        CommandLedger {
            path,
            runs: Mutex::new(BTreeMap::new()),
        }
    }

    /// Writes a run down before its program is forked, and returns the
    /// token to put in the program's environment ([`TOKEN_VARIABLE`]).
    /// The write (an fsync) runs on the blocking pool, and is on disk when
    /// this returns.
    pub async fn starting(self: &Arc<Self>) -> String {
        let token = uuid::Uuid::new_v4().simple().to_string();
        let ledger = Arc::clone(self);
        let written = token.clone();
        let _ = tokio::task::spawn_blocking(move || {
            ledger.change(|runs| runs.insert(written, None).is_none());
        })
        .await;
        token
    }

    /// Adds the group of the run's program, which just started.
    pub fn started(self: &Arc<Self>, token: &str, group: i32) {
        let Some(stat) = process_stat(group) else {
            // Gone already: nothing of it to leave behind but what its
            // group holds, and a group without its leader cannot be told
            // from a reused id. The token still finds those.
            return;
        };
        let token = token.to_string();
        self.change_in_background(move |runs| {
            runs.get_mut(&token)
                .map(|slot| *slot = Some((group, stat.started)))
                .is_some()
        });
    }

    /// Strikes a run whose group was killed or ended.
    pub fn ended(self: &Arc<Self>, token: &str) {
        let token = token.to_string();
        self.change_in_background(move |runs| runs.remove(&token).is_some());
    }

    /// [`CommandLedger::change`] on the blocking pool, not awaited: only a
    /// run's first line must be on disk before anything else happens. The
    /// writes follow one another under the lock, so the file always ends
    /// as the last change left the list.
    fn change_in_background(
        self: &Arc<Self>,
        change: impl FnOnce(&mut BTreeMap<String, Option<(i32, u64)>>) -> bool + Send + 'static,
    ) {
        let ledger = Arc::clone(self);
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn_blocking(move || ledger.change(change));
            }
            Err(_) => ledger.change(change),
        }
    }

    /// Applies `change` and, if it changed anything, saves the list while
    /// still holding the lock.
    fn change(&self, change: impl FnOnce(&mut BTreeMap<String, Option<(i32, u64)>>) -> bool) {
        let mut runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        if change(&mut runs) {
            self.save(&runs);
        }
    }

    /// The whole list, replaced atomically ([`write_atomic`]), so a crash
    /// leaves either list whole. A failed write is logged: the program
    /// still runs, only a crash's cleanup would miss it.
    fn save(&self, runs: &BTreeMap<String, Option<(i32, u64)>>) {
        let text: String = std::iter::once(format!("{}\n", boot_line()))
            .chain(runs.iter().map(|(token, group)| match group {
                Some((group, started)) => format!("run {token} {group} {started}\n"),
                None => format!("run {token}\n"),
            }))
            .collect();
        if let Err(e) = write_atomic(&self.path, text.as_bytes()) {
            tracing::warn!(
                "Cannot write the running command actions' groups down: {e}; a crash now would leave their processes running"
            );
        }
    }
}

/// The ledger's first line: this boot's id, which the start times count
/// from. Read once: it cannot change while the process lives, and every
/// command's start and end rewrites the ledger.
fn boot_line() -> &'static str {
    static BOOT_LINE: OnceLock<String> = OnceLock::new();
    BOOT_LINE.get_or_init(|| {
        let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        format!("boot {}", id.trim())
    })
}

/// Where the ledger of a service with this plan file lives.
pub fn ledger_path(plan_file: &Path) -> PathBuf {
    plan_file.with_extension("commands")
}

/// What a ledger names: the runs' tokens, and the groups known.
#[derive(Debug, Default, PartialEq, Eq)]
struct Named {
    tokens: BTreeSet<String>,
    /// Group id → its leader's start time.
    groups: BTreeMap<i32, u64>,
}

/// Reads a ledger's lines after the first: `run <token> [<group>
/// <started>]`, or `<group> <started>` as ledgers before the tokens wrote.
fn parse_ledger(text: &str) -> Named {
    let mut named = Named::default();
    for line in text.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let group = match fields.as_slice() {
            ["run", token, rest @ ..] => {
                named.tokens.insert(token.to_string());
                rest
            }
            rest => rest,
        };
        if let [group, started] = group
            && let (Ok(group), Ok(started)) = (group.parse::<i32>(), started.parse::<u64>())
            && group > 1
        {
            named.groups.insert(group, started);
        }
    }
    named
}

/// The run token in a process's environment, if it has one.
fn token_of(pid: i32) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let prefix = format!("{TOKEN_VARIABLE}=");
    environ
        .split(|&byte| byte == 0)
        .find_map(|entry| entry.strip_prefix(prefix.as_bytes()))
        .map(|value| String::from_utf8_lossy(value).into_owned())
}

/// Kills (SIGKILL) every process left in a group the ledger at `path`
/// names, or carrying a run token it names, and empties the ledger.
/// Returns what was killed.
pub fn kill_leftovers(path: &Path) -> Vec<Leftover> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let named = parse_ledger(&text);
    // SAFETY: getpgrp(2) has no preconditions.
    let own_group = unsafe { libc::getpgrp() };
    let own_pid = std::process::id() as i32;
    let mut killed = Vec::new();
    // Start times count from boot: after a reboot they compare nothing,
    // and nothing of the last run survived it anyway. Tokens are random,
    // so they need no such care.
    let same_boot = text.lines().next() == Some(boot_line());
    let groups_count = same_boot && !named.groups.is_empty();
    if groups_count || !named.tokens.is_empty() {
        for (pid, stat) in all_processes() {
            if pid == own_pid || stat.group == own_group {
                continue;
            }
            let in_a_group = groups_count
                && named
                    .groups
                    .get(&stat.group)
                    .is_some_and(|&leader_started| stat.started >= leader_started);
            let left_over = in_a_group
                || (!named.tokens.is_empty()
                    && token_of(pid).is_some_and(|token| named.tokens.contains(&token)));
            if !left_over {
                continue;
            }
            // SAFETY: kill(2) has no memory-safety preconditions.
            if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                killed.push(Leftover {
                    pid,
                    group: stat.group,
                    command: stat.command,
                });
            }
        }
    }
    let _ = std::fs::remove_file(path);
    killed
}

/// The fields of `/proc/<pid>/stat` this module needs.
struct ProcessStat {
    command: String,
    group: i32,
    /// Clock ticks since boot.
    started: u64,
}

fn process_stat(pid: i32) -> Option<ProcessStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// `pid (comm) state ppid pgrp … starttime …`: the command may hold spaces
/// and parentheses, so the fields are counted from its last `)`.
fn parse_stat(text: &str) -> Option<ProcessStat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let command = text.get(open + 1..close)?.to_string();
    let fields: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    Some(ProcessStat {
        command,
        group: fields.get(2)?.parse().ok()?,
        started: fields.get(19)?.parse().ok()?,
    })
}

fn all_processes() -> Vec<(i32, ProcessStat)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, process_stat(pid)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let line = "4242 (odd) name (x)) S 1 4240 4240 0 -1 4194560 96 0 0 0 0 0 0 0 20 0 1 0 \
                    987654 2449408 131 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0";
        let stat = parse_stat(line).unwrap();
        assert_eq!(stat.command, "odd) name (x)");
        assert_eq!(stat.group, 4240);
        assert_eq!(stat.started, 987_654);
    }

    #[test]
    fn this_process_reads_as_its_own_group_member() {
        let me = std::process::id() as i32;
        let stat = process_stat(me).unwrap();
        // SAFETY: getpgrp(2) has no preconditions.
        assert_eq!(stat.group, unsafe { libc::getpgrp() });
        assert!(stat.started > 0);
    }

    /// Reads the ledger once a background write made it `expected`.
    fn until_ledger_reads(path: &Path, expected: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            if text == expected {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{text:?} is not {expected:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_ledger_lists_the_running_programs_and_a_missing_one_kills_nothing() {
        let files = tempfile::tempdir().unwrap();
        let path = ledger_path(&files.path().join("plan.json"));
        let ledger = Arc::new(CommandLedger::at(path.clone()));
        let me = std::process::id() as i32;
        let token = ledger.starting().await;
        // On disk before the fork: no waiting here.
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            format!("{}\nrun {token}\n", boot_line())
        );
        ledger.started(&token, me);
        let started = process_stat(me).unwrap().started;
        until_ledger_reads(
            &path,
            &format!("{}\nrun {token} {me} {started}\n", boot_line()),
        );
        ledger.ended(&token);
        until_ledger_reads(&path, &format!("{}\n", boot_line()));
        // This process is in its own group: never a leftover of itself.
        let token = ledger.starting().await;
        ledger.started(&token, me);
        until_ledger_reads(
            &path,
            &format!("{}\nrun {token} {me} {started}\n", boot_line()),
        );
        assert!(kill_leftovers(&path).is_empty());
        assert!(!path.exists(), "the ledger is emptied");
        assert!(kill_leftovers(&files.path().join("none.commands")).is_empty());
    }

    /// A crash between the fork and the group's line: the program may
    /// already have started its own, and only the token written before the
    /// fork names them. Before the tokens, such a straggler outlived the
    /// restart (a CI run saw it in tests/serve.rs).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_program_forked_before_its_group_was_written_down_is_still_found() {
        use std::os::unix::process::{CommandExt, ExitStatusExt};
        let files = tempfile::tempdir().unwrap();
        let path = ledger_path(&files.path().join("plan.json"));
        let ledger = Arc::new(CommandLedger::at(path.clone()));
        let token = ledger.starting().await;
        let spawn = |token: &str| {
            std::process::Command::new("sleep")
                .arg("600")
                .env(TOKEN_VARIABLE, token)
                .process_group(0)
                .spawn()
                .unwrap()
        };
        let mut straggler = spawn(&token);
        let mut stranger = spawn("a token of no ledger");
        let killed = kill_leftovers(&path);
        assert_eq!(
            killed,
            [Leftover {
                pid: straggler.id() as i32,
                group: straggler.id() as i32,
                command: "sleep".into(),
            }]
        );
        assert_eq!(straggler.wait().unwrap().signal(), Some(libc::SIGKILL));
        assert_eq!(stranger.try_wait().unwrap(), None, "not named: left alone");
        stranger.kill().unwrap();
        stranger.wait().unwrap();
    }

    #[test]
    fn ledgers_of_either_format_name_their_runs() {
        let text = "boot x\nrun abc\nrun def 4242 99\n4300 100\n1 5\nnonsense\n";
        assert_eq!(
            parse_ledger(text),
            Named {
                tokens: ["abc".to_string(), "def".to_string()].into(),
                groups: [(4242, 99), (4300, 100)].into(),
            }
        );
    }
}
