//! The plan file survives SIGKILL at any moment: a child process writes the
//! plan in a loop through the real write path (a snapshot, then journal
//! appends of changes) and is killed 200 times, half at random moments and
//! half aimed at a snapshot write in progress; every time, the snapshot
//! and its journal read back as one whole plan, never older than before.
//!
//! The child is this same test binary, re-run with only the ignored
//! `child_writes_plans_forever` test selected.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ruled::model::{BranchRule, Millis};
use ruled::persist::{append_plan_delta, read_plan_file, write_plan_file};
use ruled::plan::{PlanDelta, PlanSnapshot, Workflow};
use uuid::Uuid;

const KILLS: usize = 200;
/// Journal writes after each snapshot.
const APPENDS: u64 = 20;
/// Write `g`'s snapshot has sequence number `g * SEQ_PER_GENERATION`, its
/// appends the numbers after it.
const SEQ_PER_GENERATION: u64 = 100;
const CHILD_ENV: &str = "RULED_CRASH_SAFETY_PLAN_FILE";

/// Generation `g` of the plan: large enough (about 1 MB) that a kill often
/// lands mid-write, and fully determined by `g` so a torn file cannot pass.
fn plan_generation(generation: i64) -> PlanSnapshot {
    let workflows = (0..2_000)
        .map(|i| {
            Workflow::new(BranchRule {
                id: Uuid::from_u128(i as u128 + 1),
                branch_id: Uuid::from_u128(0xB),
                rule_id: Uuid::from_u128(0xC),
                brand_rule_id: None,
                is_active: true,
                is_archived: false,
                is_force_stopped: false,
                is_currently_running: generation % 2 == 0,
                operation_time_from: None,
                operation_time_to: None,
                next_run_time: Some(generation * 1_000 + i),
                last_run_time: Some(generation),
                lock_holder: Some(format!("generation-{generation}")),
                lock_time: None,
                lock_epoch: generation,
                params: serde_json::json!({"generation": generation, "i": i}),
                policy: None,
                retry_of: None,
                failed_attempts: 0,
                created_at: 0,
                updated_at: generation,
            })
        })
        .collect();
    PlanSnapshot {
        saved_at: generation as Millis,
        journal_seq: generation as u64 * SEQ_PER_GENERATION,
        workflows,
        ..PlanSnapshot::default()
    }
}

/// The `k`th change after generation `g`'s snapshot: workflow `k` moves.
fn moved(generation: i64, k: u64, workflow: &Workflow) -> Workflow {
    let mut workflow = workflow.clone();
    workflow.branch_rule.next_run_time = Some(-(generation * 1_000 + k as i64));
    workflow
}

fn generation_delta(generation: i64, base: &PlanSnapshot, k: u64) -> PlanDelta {
    let workflow = moved(generation, k, &base.workflows[k as usize - 1]);
    PlanDelta {
        seq: base.journal_seq + k,
        saved_at: generation as Millis,
        workflows: [(workflow.id(), Some(workflow))].into(),
        outbox: None,
    }
}

/// What write `seq` leaves on disk: its generation with the first `k`
/// changes made.
fn expected_at(seq: u64) -> PlanSnapshot {
    let generation = (seq / SEQ_PER_GENERATION) as i64;
    let k = seq % SEQ_PER_GENERATION;
    let mut plan = plan_generation(generation);
    for i in 1..=k {
        plan.workflows[i as usize - 1] = moved(generation, i, &plan.workflows[i as usize - 1]);
    }
    plan.journal_seq = seq;
    plan
}

#[test]
#[ignore = "the child process of plan_file_survives_sigkill; started by it"]
fn child_writes_plans_forever() {
    let path = PathBuf::from(std::env::var(CHILD_ENV).expect("run by the parent test"));
    let mut generation = read_plan_file(&path)
        .ok()
        .flatten()
        .map_or(0, |s| (s.journal_seq / SEQ_PER_GENERATION) as i64)
        + 1;
    loop {
        let snapshot = plan_generation(generation);
        write_plan_file(&path, &snapshot).unwrap();
        for k in 1..=APPENDS {
            append_plan_delta(&path, &generation_delta(generation, &snapshot, k)).unwrap();
        }
        generation += 1;
    }
}

/// xorshift: random kill moments without another dependency, reproducible
/// from the printed seed.
struct Random(u64);

impl Random {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound
    }
}

fn start_child(path: &Path) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child_writes_plans_forever",
            "--nocapture",
        ])
        .env(CHILD_ENV, path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn plan_file_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("execution_plan.json");
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    println!("random seed {seed}");
    let mut random = Random(seed);
    let mut last_seq = 0;
    // A temp file left after the kill means the kill interrupted a write.
    let temp = dir.path().join(".execution_plan.json.tmp");
    let mut interrupted_writes = 0;
    for kill in 0..KILLS {
        let mut child = start_child(&path);
        // Wait for at least one new generation so every kill can interrupt a
        // write in progress, then a random extra moment.
        let deadline = Instant::now() + Duration::from_secs(30);
        while read_plan_file(&path)
            .ok()
            .flatten()
            .map_or(0, |s| s.journal_seq)
            <= last_seq
        {
            assert!(
                Instant::now() < deadline,
                "the child wrote nothing (kill {kill})"
            );
            std::thread::yield_now();
        }
        if kill % 2 == 0 {
            // A random moment of the write cycle. Building and serializing
            // the next generation can take longer than the write itself, so
            // these kills alone may all miss the write.
            std::thread::sleep(Duration::from_micros(random.below(20_000)));
        } else {
            // Aim at the write: wait for its temp file, then a moment that
            // falls inside the write, its fsync or just after the rename.
            while !temp.exists() {
                assert!(
                    Instant::now() < deadline,
                    "the child never started a write (kill {kill})"
                );
                std::thread::yield_now();
            }
            std::thread::sleep(Duration::from_micros(random.below(500)));
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();

        let snapshot = read_plan_file(&path)
            .unwrap_or_else(|e| panic!("kill {kill}: the plan file does not parse: {e}"))
            .expect("the plan file exists");
        let seq = snapshot.journal_seq;
        assert!(seq > last_seq, "kill {kill}: the file went backwards");
        assert_eq!(
            snapshot,
            expected_at(seq),
            "kill {kill}: the file is not a whole write"
        );
        interrupted_writes += temp.exists() as usize;
        last_seq = seq;
        // The plan file, its journal, and at most one temp file of each.
        let leftovers = std::fs::read_dir(dir.path()).unwrap().count();
        assert!(leftovers <= 4, "temp files pile up: {leftovers} entries");
    }
    println!("{KILLS} kills, {interrupted_writes} of them mid-write, final write {last_seq}");
    assert!(
        interrupted_writes > 0,
        "no kill landed mid-write: the test proved nothing"
    );
}
