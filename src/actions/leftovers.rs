//! What a `command` action leaves running when ruled dies by SIGKILL.
//!
//! The program itself dies with ruled (`PR_SET_PDEATHSIG`), but what it
//! started in its process group does not: the kernel hands it to init. The
//! restart records the run lost and runs the occurrence again, so such a
//! straggler would be a second run of the occurrence at once. While a
//! program runs, its group is written down in a small file next to
//! PLAN_FILE; a start kills whatever is still running in the groups that
//! file names, before its recovery lets the occurrences run again.
//!
//! A group is known by its id and its leader's start time (clock ticks
//! since boot, `/proc/<pid>/stat`). A process counts as left over only if
//! it is in that group and started no earlier than the leader: a group id
//! is not handed out again while any member lives, and a reused one would
//! be younger than every straggler's ruled run, barring a pid wraparound
//! between the crash and the restart.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use crate::persist::write_atomic;

/// The running programs' groups, kept on disk while they run.
#[derive(Debug)]
pub struct CommandLedger {
    path: PathBuf,
    groups: Mutex<BTreeMap<i32, u64>>,
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
            groups: Mutex::new(BTreeMap::new()),
        }
    }

    /// Writes the group of a program that just started down.
    pub fn started(&self, group: i32) {
        let Some(stat) = process_stat(group) else {
            // Gone already: nothing of it to leave behind but what its
            // group holds, and a group without its leader cannot be told
            // from a reused id.
            return;
        };
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        groups.insert(group, stat.started);
        self.save(&groups);
    }

    /// Strikes the group of a program whose group was killed or ended.
    pub fn ended(&self, group: i32) {
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        if groups.remove(&group).is_some() {
            self.save(&groups);
        }
    }

    /// The whole list, replaced atomically ([`write_atomic`]), so a crash
    /// leaves either list whole. A failed write is logged: the program
    /// still runs, only a crash's cleanup would miss it.
    fn save(&self, groups: &BTreeMap<i32, u64>) {
        let text: String = std::iter::once(format!("{}\n", boot_line()))
            .chain(
                groups
                    .iter()
                    .map(|(group, started)| format!("{group} {started}\n")),
            )
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

/// Kills (SIGKILL) every process left in a group the ledger at `path`
/// names, and empties the ledger. Returns what was killed.
pub fn kill_leftovers(path: &Path) -> Vec<Leftover> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let groups: BTreeMap<i32, u64> = text
        .lines()
        .filter_map(|line| {
            let (group, started) = line.split_once(' ')?;
            Some((group.parse().ok()?, started.parse().ok()?))
        })
        .filter(|&(group, _)| group > 1)
        .collect();
    // SAFETY: getpgrp(2) has no preconditions.
    let own_group = unsafe { libc::getpgrp() };
    let mut killed = Vec::new();
    // Start times count from boot: after a reboot they compare nothing,
    // and nothing of the last run survived it anyway.
    let same_boot = text.lines().next() == Some(boot_line());
    if same_boot && !groups.is_empty() {
        for (pid, stat) in all_processes() {
            let Some(&leader_started) = groups.get(&stat.group) else {
                continue;
            };
            if stat.started < leader_started || stat.group == own_group {
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

    #[test]
    fn a_ledger_lists_the_running_groups_and_a_missing_one_kills_nothing() {
        let files = tempfile::tempdir().unwrap();
        let path = ledger_path(&files.path().join("plan.json"));
        let ledger = CommandLedger::at(path.clone());
        let me = std::process::id() as i32;
        ledger.started(me);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text,
            format!(
                "{}\n{me} {}\n",
                boot_line(),
                process_stat(me).unwrap().started
            )
        );
        ledger.ended(me);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            format!("{}\n", boot_line())
        );
        // This process is in its own group: never a leftover of itself.
        ledger.started(me);
        assert!(kill_leftovers(&path).is_empty());
        assert!(!path.exists(), "the ledger is emptied");
        assert!(kill_leftovers(&files.path().join("none.commands")).is_empty());
    }
}
