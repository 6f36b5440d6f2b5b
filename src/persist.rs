//! The files ruled keeps beside its database: the plan file and the
//! shutdown marker. Every write is atomic: temp file in the same directory,
//! fsync, rename, fsync of the directory, mode 0600. A reader therefore sees
//! the old file or the new one, never a torn mix, even after SIGKILL or
//! power loss.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use tracing::warn;

use crate::model::Millis;
use crate::plan::{PlanDelta, PlanSnapshot, parse_journal};

#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("{path} is not a valid {what}: {source}")]
    Corrupt {
        path: PathBuf,
        what: &'static str,
        source: serde_json::Error,
    },
}

/// The directory holding `path`: `.` for a bare file name.
fn directory_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Writes `bytes` to `path` atomically with mode 0600.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), PersistError> {
    let fail = |source| PersistError::Write {
        path: path.to_path_buf(),
        source,
    };
    let directory = directory_of(path);
    fs::create_dir_all(&directory).map_err(fail)?;
    let file_name = path
        .file_name()
        .map_or_else(|| "plan".into(), |name| name.to_string_lossy().into_owned());
    // One fixed temp name per target: a write killed midway leaves one stale
    // temp file that the next write truncates, instead of one per crash.
    let temp = directory.join(format!(".{file_name}.tmp"));
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temp)?;
        // The mode above applies only to a file the open creates: a temp
        // file left by a crash keeps whatever mode it had.
        file.set_permissions(fs::Permissions::from_mode(0o600))?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&temp, path)?;
        // The rename is only durable once the directory entry is on disk.
        File::open(&directory)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result.map_err(fail)
}

/// The plan file's journal: the changes since its snapshot, one JSON line
/// per write, beside it as `<PLAN_FILE>.journal`.
pub fn journal_path(plan_path: &Path) -> PathBuf {
    let mut name = plan_path.as_os_str().to_owned();
    name.push(".journal");
    PathBuf::from(name)
}

/// Writes the plan snapshot to `path` atomically, then empties the journal
/// beside it: the snapshot holds all the journal held. A crash between the
/// two leaves journal lines the snapshot already holds, which a read skips
/// by their sequence numbers. Returns the bytes written.
pub fn write_plan_file(path: &Path, snapshot: &PlanSnapshot) -> Result<usize, PersistError> {
    let bytes = snapshot.to_json();
    write_atomic(path, &bytes)?;
    let journal = journal_path(path);
    if journal.exists() {
        write_atomic(&journal, b"")?;
    }
    Ok(bytes.len())
}

/// Appends `delta` to the journal beside the plan file at `path` and
/// syncs it. Returns the bytes written.
///
/// A failed append (disk full, an I/O error) is cut back off, and an
/// append finds the journal ending in a whole line or cuts it back to the
/// last one: the writer retries a failed delta, and a retry glued to the
/// fragment of the first try would be one unreadable line, at which a read
/// stops, losing it and every later change (outbox and running flags too).
pub fn append_plan_delta(path: &Path, delta: &PlanDelta) -> Result<usize, PersistError> {
    let journal = journal_path(path);
    let fail = |source| PersistError::Write {
        path: journal.clone(),
        source,
    };
    let line = delta.to_json_line();
    let created = !journal.exists();
    let mut file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o600)
        .open(&journal)
        .map_err(fail)?;
    let meta = file.metadata().map_err(fail)?;
    // As for the plan file: a journal made by hand or an older version may
    // be readable by others, and it holds action configs.
    if meta.permissions().mode() & 0o077 != 0 {
        file.set_permissions(fs::Permissions::from_mode(0o600))
            .map_err(fail)?;
    }
    let whole = end_of_last_whole_line(&file, meta.len()).map_err(fail)?;
    if whole < meta.len() {
        file.set_len(whole).map_err(fail)?;
    }
    let appended = file.write_all(&line).and_then(|()| file.sync_data());
    if let Err(source) = appended {
        // Best effort: if this fails too, the next append cuts it back.
        let _ = file.set_len(whole);
        return Err(fail(source));
    }
    if created {
        // A new file's directory entry is only durable once synced.
        File::open(directory_of(&journal))
            .and_then(|d| d.sync_all())
            .map_err(fail)?;
    }
    Ok(line.len())
}

/// Where the journal (`len` bytes) ends its last complete line: at `len`,
/// unless an append that failed left part of a line behind.
fn end_of_last_whole_line(file: &File, len: u64) -> io::Result<u64> {
    use std::os::unix::fs::FileExt;
    if len == 0 {
        return Ok(0);
    }
    let mut last = [0u8; 1];
    file.read_exact_at(&mut last, len - 1)?;
    if last[0] == b'\n' {
        return Ok(len);
    }
    // Rare (a failed append that could not be cut back): read it all.
    let mut bytes = Vec::new();
    io::Read::read_to_end(&mut &*file, &mut bytes)?;
    Ok(bytes
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |newline| newline as u64 + 1))
}

/// Reads the plan file and replays its journal. `Ok(None)` when there is
/// no plan file; a corrupt snapshot is an error the caller logs and
/// ignores (the database rebuilds the plan). A journal line cut short by a
/// crash mid-append is dropped with a warning: the write it held never
/// completed, so nothing had relied on it.
pub fn read_plan_file(path: &Path) -> Result<Option<PlanSnapshot>, PersistError> {
    let Some(bytes) = read_if_present(path)? else {
        return Ok(None);
    };
    let mut snapshot = PlanSnapshot::from_json(&bytes).map_err(|source| PersistError::Corrupt {
        path: path.to_path_buf(),
        what: "plan file",
        source,
    })?;
    let journal = journal_path(path);
    if let Some(bytes) = read_if_present(&journal)? {
        let read = parse_journal(&bytes);
        if read.torn {
            warn!(
                "⚠️ The plan journal {} ends in a partial write (a crash mid-append); it is ignored",
                journal.display()
            );
        }
        if !read.corrupt.is_empty() {
            warn!(
                "⚠️ The plan journal {} has damaged line(s) {:?}; they are skipped, the lines after them applied, and the database corrects the rest",
                journal.display(),
                read.corrupt
            );
        }
        snapshot.apply(read.deltas);
    }
    Ok(Some(snapshot))
}

fn read_if_present(path: &Path) -> Result<Option<Vec<u8>>, PersistError> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(PersistError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Seed 000's marker: written when a graceful shutdown begins. Finding it at
/// the next start means the last stop was clean; its absence means a crash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShutdownMarker {
    pub shutdown_started_at: Millis,
    pub pid: u32,
    pub signal: String,
}

pub fn write_marker(path: &Path, marker: &ShutdownMarker) -> Result<(), PersistError> {
    let bytes = serde_json::to_vec_pretty(marker).expect("marker serializes");
    write_atomic(path, &bytes)
}

/// How the previous run ended, judged from the marker file.
#[derive(Debug, Clone, PartialEq)]
pub enum PreviousStop {
    /// No marker and no plan file: nothing ran here before.
    FirstStart,
    Clean(ShutdownMarker),
    /// A plan file exists but no marker: the process died without a
    /// graceful shutdown.
    Crash,
    /// The marker exists but cannot be read.
    Unknown(String),
}

/// Reads and removes the marker, so the next start judges this run.
pub fn take_marker(marker_path: &Path, plan_path: &Path) -> PreviousStop {
    let stop = match fs::read(marker_path) {
        Ok(bytes) => match serde_json::from_slice(&bytes) {
            Ok(marker) => PreviousStop::Clean(marker),
            Err(e) => PreviousStop::Unknown(format!("{}: {e}", marker_path.display())),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if plan_path.exists() {
                PreviousStop::Crash
            } else {
                PreviousStop::FirstStart
            }
        }
        Err(e) => PreviousStop::Unknown(format!("{}: {e}", marker_path.display())),
    };
    let _ = fs::remove_file(marker_path);
    stop
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn atomic_write_replaces_the_file_with_mode_0600() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/plan.json");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let leftovers: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty());

        // A temp file a crash left, and a journal, both readable by others:
        // the next writes leave the plan file and the journal 0600.
        let loose = fs::Permissions::from_mode(0o644);
        let temp = path.with_file_name(".plan.json.tmp");
        fs::write(&temp, b"stale").unwrap();
        fs::set_permissions(&temp, loose.clone()).unwrap();
        let journal = journal_path(&path);
        fs::write(&journal, b"").unwrap();
        fs::set_permissions(&journal, loose).unwrap();
        write_atomic(&path, b"three").unwrap();
        append_plan_delta(&path, &PlanDelta::default()).unwrap();
        for file in [&path, &journal] {
            let mode = fs::metadata(file).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", file.display());
        }
    }

    #[test]
    fn a_corrupt_plan_file_is_an_error_and_a_missing_one_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plan.json");
        assert!(read_plan_file(&path).unwrap().is_none());
        fs::write(&path, b"{\"workflows\": [tru").unwrap();
        let err = read_plan_file(&path).unwrap_err();
        assert!(err.to_string().contains("plan.json"), "{err}");
        let snapshot = PlanSnapshot {
            saved_at: 42,
            ..PlanSnapshot::default()
        };
        write_plan_file(&path, &snapshot).unwrap();
        assert_eq!(read_plan_file(&path).unwrap(), Some(snapshot));
    }

    /// The writer retries a delta whose append failed. If that append left
    /// part of its line behind, the retry must not be glued to it: a read
    /// stops at the first unreadable line and would lose the retry and
    /// every change after it.
    #[test]
    fn a_retried_append_is_not_glued_to_the_fragment_of_a_failed_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plan.json");
        write_plan_file(&path, &PlanSnapshot::default()).unwrap();
        let delta = |seq: u64| PlanDelta {
            seq,
            saved_at: seq as Millis * 1_000,
            outbox: Some(Vec::new()),
            ..PlanDelta::default()
        };
        append_plan_delta(&path, &delta(1)).unwrap();
        let second = delta(2).to_json_line();
        OpenOptions::new()
            .append(true)
            .open(journal_path(&path))
            .unwrap()
            .write_all(&second[..second.len() / 2])
            .unwrap();
        append_plan_delta(&path, &delta(2)).unwrap();
        append_plan_delta(&path, &delta(3)).unwrap();

        let read = read_plan_file(&path).unwrap().unwrap();
        assert_eq!((read.journal_seq, read.saved_at), (3, 3_000));
        let journal = fs::read(journal_path(&path)).unwrap();
        assert_eq!(
            journal,
            [delta(1), delta(2), delta(3)]
                .iter()
                .flat_map(PlanDelta::to_json_line)
                .collect::<Vec<u8>>()
        );
    }

    #[test]
    fn the_marker_tells_a_clean_stop_from_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("marker.json");
        let plan = dir.path().join("plan.json");
        assert_eq!(take_marker(&marker, &plan), PreviousStop::FirstStart);
        fs::write(&plan, b"{}").unwrap();
        assert_eq!(take_marker(&marker, &plan), PreviousStop::Crash);
        let written = ShutdownMarker {
            shutdown_started_at: 7,
            pid: 99,
            signal: "SIGTERM".into(),
        };
        write_marker(&marker, &written).unwrap();
        assert_eq!(take_marker(&marker, &plan), PreviousStop::Clean(written));
        assert!(
            !marker.exists(),
            "taken, so the next start judges the next stop"
        );
        assert_eq!(take_marker(&marker, &plan), PreviousStop::Crash);
    }
}
