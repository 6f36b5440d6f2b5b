//! Execution-plan benchmarks (issue: ready query, refresh merge, memory).
//!
//! `cargo bench --bench plan` — prints one table row per plan size. Sizes
//! can be narrowed with `RULED_BENCH_SIZES=10000,100000`.
//!
//! Not a timed test: nothing here asserts; the figures go to BENCHMARKS.md.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use ruled::cluster::Ownership;
use ruled::model::*;
use ruled::plan::{ExecutionPlan, MergeOptions, merge, ready, take_ready_owned};
use ruled::schedule::TimeOfDay;
use serde_json::json;
use uuid::Uuid;

/// Counts live heap bytes so memory per workflow is measured, not guessed.
struct CountingAllocator;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const NOW: Millis = 1_800_000_000_000;
const READY_COUNT: usize = 500;
const ZONES: [&str; 3] = ["Asia/Riyadh", "America/New_York", "Australia/Lord_Howe"];

/// `n` workflows over 300 branches in three zones and 20 rules; exactly
/// READY_COUNT are due, the rest fall due over the next day. A third have
/// an operation window that is open at NOW in every zone (00:00–23:59).
fn plan_data(n: usize) -> PlanData {
    let brand = Brand {
        id: Uuid::from_u128(1),
        name: "bench".into(),
        settings: json!({}),
        created_at: 0,
        updated_at: 0,
    };
    let branches: Vec<Branch> = (0..300u128)
        .map(|i| Branch {
            id: Uuid::from_u128(1_000 + i),
            brand_id: brand.id,
            name: format!("branch {i}"),
            timezone: Some(ZONES[i as usize % 3].to_string()),
            is_active: true,
            created_at: 0,
            updated_at: 0,
        })
        .collect();
    let rules: Vec<Rule> = (0..20u128)
        .map(|i| Rule {
            id: Uuid::from_u128(2_000 + i),
            brand_id: Some(brand.id),
            name: format!("rule {i}"),
            status: RuleStatus::Active,
            cron_expression: "*/5 * * * *".into(),
            settings: json!({}),
            policy: None,
            created_at: 0,
            updated_at: 0,
        })
        .collect();
    let open_from: TimeOfDay = "00:00".parse().unwrap();
    let open_to: TimeOfDay = "23:59".parse().unwrap();
    let branch_rules = (0..n)
        .map(|i| {
            let due = if i % (n / READY_COUNT) == 0 {
                NOW - 1 - (i as Millis % 60_000)
            } else {
                NOW + 1 + (i as Millis * 7919) % 86_400_000
            };
            let windowed = i % 3 == 0;
            BranchRule {
                id: Uuid::from_u128(
                    0x1_0000_0000 + (i as u128).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                ),
                branch_id: branches[i % branches.len()].id,
                rule_id: rules[i % rules.len()].id,
                brand_rule_id: None,
                is_active: true,
                is_archived: false,
                is_force_stopped: false,
                is_currently_running: false,
                operation_time_from: windowed.then_some(open_from),
                operation_time_to: windowed.then_some(open_to),
                next_run_time: Some(due),
                last_run_time: Some(due - 300_000),
                lock_holder: None,
                lock_time: None,
                lock_epoch: 0,
                params: json!({}),
                policy: None,
                retry_of: None,
                failed_attempts: 0,
                created_at: 0,
                updated_at: 0,
            }
        })
        .collect();
    PlanData {
        brands: vec![brand],
        branches,
        rules,
        branch_rules,
        ..PlanData::default()
    }
}

/// Changes 1% of the branch rules in place, as a refresh after that many
/// jobs finished would see it; each round changes a different 1%. Returns
/// what an incremental read would return: the small tables and the changed
/// rows.
fn change_one_percent(data: &mut PlanData, round: i64) -> PlanData {
    let step = 100;
    let mut changed = Vec::new();
    for (i, row) in data.branch_rules.iter_mut().enumerate() {
        if i % step == round as usize % step {
            row.next_run_time = row.next_run_time.map(|t| t + 300_000 * (round + 1));
            row.last_run_time = Some(NOW);
            row.updated_at = NOW + round;
            changed.push(row.clone());
        }
    }
    PlanData {
        scope: PlanScope::Changes {
            since: NOW + round,
            total_branch_rules: data.branch_rules.len() as u64,
        },
        brands: data.brands.clone(),
        branches: data.branches.clone(),
        rules: data.rules.clone(),
        branch_rules: changed,
        ..PlanData::default()
    }
}

/// [`plan_data`] with every workflow that is not ready turned into one due
/// an hour ago but waiting for its operation window (19:30–20:00, closed
/// at NOW in all three zones): a day of rules that only run at night. They
/// sort before the ready ones, so a fetch meets all of them first.
fn window_waiting_data(n: usize) -> PlanData {
    let mut data = plan_data(n);
    let from: TimeOfDay = "19:30".parse().unwrap();
    let to: TimeOfDay = "20:00".parse().unwrap();
    for (i, row) in data.branch_rules.iter_mut().enumerate() {
        if i % (n / READY_COUNT) == 0 {
            row.operation_time_from = None;
            row.operation_time_to = None;
        } else {
            row.next_run_time = Some(NOW - 3_600_000 - (i as Millis % 60_000));
            row.operation_time_from = Some(from);
            row.operation_time_to = Some(to);
        }
    }
    data
}

/// [`plan_data`] with every workflow that is not ready turned into one due
/// an hour ago on a branch an operator switched off: rules the service
/// cannot run until that row changes, sorted before the ready ones.
fn branch_off_data(n: usize) -> PlanData {
    let mut data = plan_data(n);
    let off = Branch {
        id: Uuid::from_u128(999),
        name: "switched off".into(),
        is_active: false,
        ..data.branches[0].clone()
    };
    for (i, row) in data.branch_rules.iter_mut().enumerate() {
        if i % (n / READY_COUNT) != 0 {
            row.next_run_time = Some(NOW - 3_600_000 - (i as Millis % 60_000));
            row.branch_id = off.id;
        }
    }
    data.branches.push(off);
    data
}

/// One row of a set-aside table: the fetch of 500 that checks every
/// not-ready due rule, the service's first fetch (which sets them aside)
/// and the fetches after it.
fn set_aside_row(data: PlanData, n: usize) {
    let zone = chrono_tz::Asia::Riyadh;
    let mut plan = ExecutionPlan::from_data(data);
    let ready_set = ready(&plan, NOW, 500, zone);
    let checked = timed_ready(&plan, 20);
    let started = Instant::now();
    let first = take_ready_owned(&mut plan, NOW, 500, zone, &Ownership::All);
    let setting_aside = started.elapsed();
    assert_eq!(first, ready_set, "setting aside changes no answer");
    let after: Vec<Duration> = (0..200)
        .map(|_| {
            let started = Instant::now();
            black_box(take_ready_owned(
                black_box(&mut plan),
                NOW,
                500,
                zone,
                &Ownership::All,
            ));
            started.elapsed()
        })
        .collect();
    println!(
        "| {} | {} | {:.3} ms | {:.3} ms | {:.3} ms |",
        n - READY_COUNT,
        ready_set.len(),
        checked.as_secs_f64() * 1e3,
        setting_aside.as_secs_f64() * 1e3,
        median(after).as_secs_f64() * 1e3,
    );
}

/// The median of `rounds` runs of the ready query (cap 500) at NOW.
fn timed_ready(plan: &ExecutionPlan, rounds: usize) -> Duration {
    let zone = chrono_tz::Asia::Riyadh;
    let samples = (0..rounds)
        .map(|_| {
            let started = Instant::now();
            black_box(ready(black_box(plan), NOW, 500, zone));
            started.elapsed()
        })
        .collect();
    median(samples)
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn main() {
    let sizes = sizes_from("RULED_BENCH_SIZES", &[10_000, 100_000, 1_000_000]);
    let zone = chrono_tz::Asia::Riyadh;
    println!(
        "| workflows | ready set | ready query (median) | incremental merge, 1% changed (median) | per changed workflow | full-refresh merge, 1% changed | memory per workflow |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for n in sizes {
        let mut data = plan_data(n);

        let before = LIVE_BYTES.load(Ordering::Relaxed);
        let mut plan = ExecutionPlan::from_data(data.clone());
        let plan_bytes = LIVE_BYTES.load(Ordering::Relaxed) - before;

        let ready_set = ready(&plan, NOW, 500, zone);
        let ready_time = timed_ready(&plan, 200);

        let options = MergeOptions::default();
        let mut merge_samples = Vec::new();
        let mut changed_count = 0;
        for round in 0..7 {
            let delta = change_one_percent(&mut data, round);
            changed_count = delta.branch_rules.len();
            let started = Instant::now();
            let report = merge(&mut plan, delta, NOW + round, options);
            merge_samples.push(started.elapsed());
            assert_eq!(report.updated, changed_count, "the merge saw every change");
            assert!(!report.full_refresh_needed);
        }
        let merge_time = median(merge_samples);

        // The periodic full refresh: every row compared, 1% changed.
        change_one_percent(&mut data, 7);
        let full = data.clone();
        let started = Instant::now();
        let report = merge(&mut plan, full, NOW + 7, options);
        let full_time = started.elapsed();
        assert_eq!(report.updated, changed_count);

        println!(
            "| {n} | {} | {:.3} ms | {:.2} ms | {:.2} µs | {:.0} ms | {} B |",
            ready_set.len(),
            ready_time.as_secs_f64() * 1e3,
            merge_time.as_secs_f64() * 1e3,
            merge_time.as_secs_f64() * 1e6 / changed_count as f64,
            full_time.as_secs_f64() * 1e3,
            plan_bytes / n as isize,
        );
    }

    println!();
    println!(
        "| workflows waiting for their window | ready set | fetch of 500, every waiting rule checked (`ready`, median) | the service's fetch (`take_ready_owned`): first, which parks them | then (median) |"
    );
    println!("|---:|---:|---:|---:|---:|");
    let waiting_sizes = sizes_from("RULED_BENCH_WAITING_SIZES", &[10_000, 100_000]);
    for &n in &waiting_sizes {
        set_aside_row(window_waiting_data(n), n);
    }

    println!();
    println!(
        "| workflows due on a switched-off branch | ready set | fetch of 500, every held rule checked (`ready`, median) | the service's fetch (`take_ready_owned`): first, which sets them aside | then (median) |"
    );
    println!("|---:|---:|---:|---:|---:|");
    for &n in &waiting_sizes {
        set_aside_row(branch_off_data(n), n);
    }
}

/// The sizes listed in the variable `name` (comma-separated), or `default`.
fn sizes_from(name: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(name).ok().map_or_else(
        || default.to_vec(),
        |s| {
            s.split(',')
                .map(|n| n.trim().parse().expect("a size"))
                .collect()
        },
    )
}
