//! The chaos suite (issue 11): three real `ruled serve` processes on one
//! PostgreSQL database, one fault per scenario, and after each the one
//! invariant checker of `common::cluster` (exactly one completed execution
//! per due occurrence, no overlapping attempts, nothing open or locked,
//! recovery within TTL + 5 s of the fault).
//!
//! ```sh
//! cargo test --test chaos -- --nocapture     # timings on stderr
//! ```
//!
//! Scenarios run one at a time (a shared lock): each starts three debug
//! binaries, and the host may have two cores. Lease TTL 3 s unless a
//! scenario says otherwise, so a fault plays out in seconds. Logs of the
//! last run of each scenario stay in `target/tmp/chaos-logs/<scenario>/`.
//!
//! The scenarios (three instances each): a herd of 10,000 rules due at
//! once; `kill -9` of the busiest instance mid-job; `kill -9` and an
//! immediate restart under the same INSTANCE_ID; SIGSTOP past the TTL, then
//! SIGCONT; SIGSTOP under load, aimed inside an open transaction; one
//! instance cut off the database (its own role: NOLOGIN and its backends
//! terminated) for 60 s; clock skew of +90 s and -90 s (libfaketime), then
//! `kill -9` of the one ahead; a rolling restart; a queue longer than the
//! claim lease, with and without `kill -9`; cancel and force-stop sent to
//! another instance; and a test of the checker itself on a forged history.
//!
//! Knobs (environment of `cargo test`): `CHAOS_HERD_RULES` (10000),
//! `CHAOS_DB_CUT_SECONDS` (60; the whole suite takes about 3 minutes on
//! two cores with it).

mod common;

use std::collections::BTreeSet;
use std::future::Future;
use std::io::Write as _;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use common::TestDb;
use common::cluster::{
    Action, Cluster, Due, Exec, Expect, Occurrence, Options, count_by, faketime_available,
    log_clock_offset_ms, wall_ms,
};

/// One scenario at a time, whatever libtest's thread count.
static SERIAL: Mutex<()> = Mutex::new(());

/// Cluster start-up: three debug binaries, migrations, the first leases.
const READY: Duration = Duration::from_secs(60);

fn run<F, Fut>(name: &str, scenario: F)
where
    F: FnOnce(TestDb) -> Fut,
    Fut: Future<Output = ()>,
{
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let ran = runtime.block_on(async {
        let Some(db) = common::postgres_db().await else {
            return false;
        };
        scenario(db).await;
        true
    });
    if ran {
        eprintln!(
            "[{name}] passed in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The occurrences of `due` without a completed execution in `executions`.
fn unfinished(due: &[Occurrence], executions: &[Exec]) -> Vec<Occurrence> {
    let completed: BTreeSet<Occurrence> = executions
        .iter()
        .filter(|e| e.status == "completed")
        .map(Exec::occurrence)
        .collect();
    due.iter()
        .filter(|o| !completed.contains(*o))
        .cloned()
        .collect()
}

/// The open executions owned by `owner`.
fn open_of(executions: &[Exec], owner: &str) -> Vec<Exec> {
    executions
        .iter()
        .filter(|e| e.is_open() && e.owner.as_deref() == Some(owner))
        .cloned()
        .collect()
}

/// Waits until at least `at_least` executions run (and, if given, one on
/// `on`); returns the busiest owner.
async fn wait_until_running(
    cluster: &Cluster,
    at_least: i64,
    on: Option<&str>,
    deadline: Duration,
) -> String {
    cluster
        .poll(&format!("{at_least} jobs run"), deadline, || async {
            let running = cluster.running_by_owner().await;
            let total: i64 = running.values().sum();
            let on_ok = on.is_none_or(|id| running.get(id).copied().unwrap_or(0) > 0);
            if total >= at_least && on_ok {
                Ok(())
            } else {
                Err(format!("running by owner {running:?}"))
            }
        })
        .await;
    let running = cluster.running_by_owner().await;
    running
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(owner, _)| owner.clone())
        .unwrap()
}

/// After a takeover: each lost attempt ended Failed (never Completed), and
/// its occurrence completed as a later attempt on another instance.
fn assert_lost_attempts_rerun(executions: &[Exec], lost: &[Exec], victim: &str) {
    let mut offenders = Vec::new();
    for old in lost {
        let now = executions.iter().find(|e| e.id == old.id).unwrap();
        if now.status != "failed" {
            offenders.push(format!(
                "{}: the lost attempt ended {now}, not failed",
                old.occurrence()
            ));
        }
        let rerun = executions.iter().find(|e| {
            e.occurrence() == old.occurrence()
                && e.attempt > old.attempt
                && e.status == "completed"
                && e.owner.as_deref() != Some(victim)
        });
        if rerun.is_none() {
            let all: Vec<String> = executions
                .iter()
                .filter(|e| e.occurrence() == old.occurrence())
                .map(ToString::to_string)
                .collect();
            offenders.push(format!(
                "{}: no later attempt completed on a survivor: {}",
                old.occurrence(),
                all.join(" ")
            ));
        }
    }
    assert!(
        offenders.is_empty(),
        "{} of {} attempt(s) lost with {victim} were not recorded failed and run again:\n  {}",
        offenders.len(),
        lost.len(),
        offenders.join("\n  ")
    );
    let errors = count_by(lost, |e| {
        executions
            .iter()
            .find(|now| now.id == e.id)
            .and_then(|now| now.error.clone())
            .unwrap_or_default()
    });
    eprintln!("lost attempts of {victim} ended with errors {errors:?}");
}

/// The latest start of a rerun of `lost`, after `fault_ms`.
fn failover_ms(executions: &[Exec], lost: &[Exec], fault_ms: i64) -> i64 {
    lost.iter()
        .filter_map(|old| {
            executions
                .iter()
                .filter(|e| e.occurrence() == old.occurrence() && e.attempt > old.attempt)
                .filter_map(|e| e.started_at)
                .min()
        })
        .max()
        .map_or(-1, |started| started - fault_ms)
}

// ---------------------------------------------------------------------------
// 1. A herd
// ---------------------------------------------------------------------------

/// 10,000 noop rules due at the same instant: each runs exactly once.
#[test]
fn herd_of_rules_due_at_once_runs_each_exactly_once() {
    run("herd", |db| async move {
        let n = env_number("CHAOS_HERD_RULES", 10_000) as usize;
        // A throughput scenario, not a failover one: a lease TTL the loaded
        // host cannot miss. The claim lease is the 6 s of issue 11's report
        // (3,000 rules due, queued claims expired, 449 run twice): the
        // queue takes far longer than that to drain.
        let cluster = Cluster::start(
            &db,
            3,
            &[
                ("PARTITION_LEASE_TTL_SECONDS", "10"),
                ("PARTITION_LEASE_RETRY_SECONDS", "1"),
                ("SCHEDULE_LOCK_TIMEOUT_SECONDS", "6"),
                ("RUST_LOG", "info,ruled::actors::worker=warn"),
            ],
        )
        .await;
        cluster.wait_until_cluster_ready(READY).await;
        let seeding = Instant::now();
        let due = cluster.seed(n, Action::Noop, Due::DbNow(0), 0).await;
        let seeded = seeding.elapsed();
        let expect = Expect::completed(&due);
        let drain = cluster
            .wait_until_all_done(&expect, Duration::from_secs(300))
            .await;
        let executions = cluster.check_invariants(&expect).await;
        eprintln!(
            "[herd] {n} noop rules seeded in {:.1} s, drained by 3 instances in {:.1} s \
             ({:.0} jobs/s); executions by owner {:?}",
            seeded.as_secs_f64(),
            drain.as_secs_f64(),
            n as f64 / drain.as_secs_f64(),
            count_by(&executions, |e| e.owner.clone().unwrap_or_default()),
        );
        assert_eq!(
            executions.len(),
            n,
            "one execution per rule, no retries: {:?}",
            count_by(&executions, |e| (e.status.clone(), e.error.clone()))
        );
    });
}

// ---------------------------------------------------------------------------
// 2. kill -9
// ---------------------------------------------------------------------------

/// `kill -9` of the busiest instance mid-job: the survivors record its
/// attempts Failed (`worker_lost`) and run the occurrences again within
/// TTL + 5 s of the kill.
#[test]
fn kill_9_of_the_busiest_instance_mid_job_fails_over() {
    run("kill9", |db| async move {
        // Enough workers that every rule runs at once, so the takeover, not
        // the queue, decides when the lost ones run again.
        let cluster = Cluster::start(&db, 3, &[("WORKER_COUNT", "30")]).await;
        cluster.wait_until_cluster_ready(READY).await;
        let due = cluster
            .seed(60, Action::Sleep(3_000), Due::DbNow(0), 0)
            .await;
        let expect = Expect::completed(&due);
        let busiest = wait_until_running(&cluster, 40, None, Duration::from_secs(30)).await;
        let victim = cluster.index_of(&busiest);

        let kill_ms = wall_ms();
        cluster.kill9(victim);
        cluster
            .wait_until_quiet(victim, Duration::from_secs(10))
            .await;
        let snapshot = cluster.executions().await;
        let lost = open_of(&snapshot, &busiest);
        assert!(!lost.is_empty(), "{busiest} ran nothing when killed");
        let due_during = unfinished(&due, &snapshot);
        eprintln!(
            "[kill9] killed {busiest} with {} open execution(s); {} occurrence(s) unfinished",
            lost.len(),
            due_during.len()
        );

        cluster
            .wait_until_all_done(&expect, cluster.ttl + Duration::from_secs(40))
            .await;
        let executions = cluster
            .check_invariants(&expect.clone().with_recovery(kill_ms, due_during))
            .await;
        assert_lost_attempts_rerun(&executions, &lost, &busiest);
        eprintln!(
            "[kill9] failover: the last lost occurrence started again {} ms after the kill (TTL {:?})",
            failover_ms(&executions, &lost, kill_ms),
            cluster.ttl
        );
        // The two survivors share every partition.
        cluster
            .wait_until_cluster_ready(cluster.ttl * 3 + Duration::from_secs(5))
            .await;
    });
}

/// `kill -9` and an immediate restart under the same INSTANCE_ID, as a
/// supervisor would do: the new process (recovering its predecessor's
/// work) and the survivors (taking over a silent peer) must not both run
/// a lost occurrence again.
#[test]
fn kill_9_and_immediate_restart_runs_each_lost_occurrence_once() {
    run("kill9_restart", |db| async move {
        let cluster = Cluster::start(&db, 3, &[("WORKER_COUNT", "30")]).await;
        cluster.wait_until_cluster_ready(READY).await;
        let due = cluster
            .seed(60, Action::Sleep(3_000), Due::DbNow(0), 0)
            .await;
        let expect = Expect::completed(&due);
        let busiest = wait_until_running(&cluster, 40, None, Duration::from_secs(30)).await;
        let victim = cluster.index_of(&busiest);
        let kill_ms = wall_ms();
        cluster.kill9(victim);
        cluster
            .wait_until_quiet(victim, Duration::from_secs(10))
            .await;
        let snapshot = cluster.executions().await;
        let lost = open_of(&snapshot, &busiest);
        let due_during = unfinished(&due, &snapshot);
        cluster.restart(victim);
        cluster
            .wait_until_all_done(&expect, cluster.ttl + Duration::from_secs(40))
            .await;
        cluster.wait_until_cluster_ready(READY).await;
        let executions = cluster
            .check_invariants(&expect.clone().with_recovery(kill_ms, due_during))
            .await;
        let mut offenders = Vec::new();
        for old in &lost {
            let now = executions.iter().find(|e| e.id == old.id).unwrap();
            let later: Vec<&Exec> = executions
                .iter()
                .filter(|e| e.occurrence() == old.occurrence() && e.attempt > old.attempt)
                .collect();
            if now.status != "failed" || later.len() != 1 || later[0].status != "completed" {
                let all: Vec<String> = executions
                    .iter()
                    .filter(|e| e.occurrence() == old.occurrence())
                    .map(ToString::to_string)
                    .collect();
                offenders.push(format!("{}: {}", old.occurrence(), all.join(" ")));
            }
        }
        assert!(
            offenders.is_empty(),
            "lost attempts not failed and run again exactly once:\n  {}",
            offenders.join("\n  ")
        );
        eprintln!(
            "[kill9_restart] {busiest} killed with {} job(s) and restarted; the last ran again {} ms after the kill",
            lost.len(),
            failover_ms(&executions, &lost, kill_ms)
        );
    });
}

// ---------------------------------------------------------------------------
// 3. SIGSTOP past the TTL, then SIGCONT
// ---------------------------------------------------------------------------

/// A frozen instance is taken over; when it wakes up its writes change
/// nothing: its old attempts stay Failed, none completes.
#[test]
fn sigstop_past_the_ttl_then_sigcont_changes_nothing() {
    run("sigstop", |db| async move {
        let cluster = Cluster::start(&db, 3, &[("WORKER_COUNT", "30")]).await;
        cluster.wait_until_cluster_ready(READY).await;
        let due = cluster
            .seed(60, Action::Sleep(3_000), Due::DbNow(0), 0)
            .await;
        let expect = Expect::completed(&due);
        let busiest = wait_until_running(&cluster, 40, None, Duration::from_secs(30)).await;
        let victim = cluster.index_of(&busiest);

        let stop_ms = wall_ms();
        cluster.sigstop(victim);
        // A statement sent before the stop still lands; one in a
        // transaction the stopped process never finishes stays "idle in
        // transaction" (and holds its row locks) until SIGCONT.
        cluster
            .wait_until_quiet(victim, Duration::from_secs(10))
            .await;
        let snapshot = cluster.executions().await;
        let stale = open_of(&snapshot, &busiest);
        assert!(!stale.is_empty(), "{busiest} ran nothing when stopped");
        let due_during = unfinished(&due, &snapshot);
        let stale_ids: BTreeSet<String> = stale.iter().map(|e| e.id.clone()).collect();

        let took = cluster
            .poll(
                &format!("the survivors take over from the stopped {busiest}"),
                cluster.ttl + Duration::from_secs(15),
                || async {
                    let executions = cluster.executions().await;
                    let still_open = executions
                        .iter()
                        .filter(|e| stale_ids.contains(&e.id) && e.is_open())
                        .count();
                    let held = cluster.held().await;
                    match (still_open, held.get(&busiest)) {
                        (0, None) => Ok(()),
                        (open, held_by_victim) => Err(format!(
                            "{open} of its {} execution(s) still open, it holds {held_by_victim:?} partition(s); held {held:?}",
                            stale_ids.len()
                        )),
                    }
                },
            )
            .await;
        eprintln!(
            "[sigstop] {busiest} stopped with {} open execution(s); taken over after {:.1} s",
            stale.len(),
            took.as_secs_f64()
        );

        // Wake it once the survivors run the lost occurrences again: its
        // late writes about the old attempts race the new ones.
        cluster
            .poll(
                "every lost occurrence has started again",
                cluster.ttl + Duration::from_secs(15),
                || async {
                    let executions = cluster.executions().await;
                    let waiting = stale
                        .iter()
                        .filter(|old| {
                            !executions.iter().any(|e| {
                                e.occurrence() == old.occurrence()
                                    && e.attempt > old.attempt
                                    && e.started_at.is_some()
                            })
                        })
                        .count();
                    if waiting == 0 {
                        Ok(())
                    } else {
                        Err(format!("{waiting} not started again"))
                    }
                },
            )
            .await;
        cluster.sigcont(victim);
        cluster
            .wait_until_all_done(&expect, cluster.ttl + Duration::from_secs(40))
            .await;
        // The woken instance has caught up (heartbeats again, holds its
        // share): whatever it wanted to write about its old jobs was tried.
        cluster
            .wait_until_cluster_ready(cluster.ttl * 3 + Duration::from_secs(10))
            .await;
        // Woken past its fence deadline, it stopped its stale jobs at its
        // first round, though the heartbeat then landed (the survivors were
        // running them again), and recovered what that stopped itself.
        let log = cluster.log(victim);
        assert!(
            log.contains("🚧 No heartbeat for") && log.contains("Rejoined after a self-fence"),
            "the woken {busiest} did not fence itself:\n{log}"
        );
        let executions = cluster
            .check_invariants(&expect.clone().with_recovery(stop_ms, due_during))
            .await;
        assert_lost_attempts_rerun(&executions, &stale, &busiest);
        let late: Vec<String> = executions
            .iter()
            .filter(|e| {
                e.owner.as_deref() == Some(busiest.as_str())
                    && e.status == "completed"
                    && e.started_at.is_some_and(|s| s < stop_ms)
                    && e.finished_at.is_some_and(|f| f > stop_ms + 1_000)
            })
            .map(|e| format!("{} {e}", e.occurrence()))
            .collect();
        assert!(
            late.is_empty(),
            "the stale instance completed jobs it had lost:\n  {}",
            late.join("\n  ")
        );
    });
}

/// SIGSTOP in the middle of a herd, when the frozen instance is likely to
/// be inside a transaction (its group commit), holding row locks nobody
/// will release until it wakes: the survivors must still close its work
/// within TTL + 5 s, and run everything once. No recovery bound on the
/// whole herd: two instances drain the rest at their own pace.
#[test]
fn sigstop_under_load_is_taken_over_all_the_same() {
    run("sigstop_load", |db| async move {
        let cluster =
            Cluster::start(&db, 3, &[("RUST_LOG", "info,ruled::actors::worker=warn")]).await;
        cluster.wait_until_cluster_ready(READY).await;
        let due = cluster.seed(6_000, Action::Noop, Due::DbNow(0), 0).await;
        let expect = Expect::completed(&due);
        cluster
            .poll(
                "a sixth of the herd has run",
                Duration::from_secs(60),
                || async {
                    let left = unfinished(&due, &cluster.executions().await).len();
                    if left <= due.len() * 5 / 6 {
                        Ok(())
                    } else {
                        Err(format!("{left} left"))
                    }
                },
            )
            .await;
        let snapshot = cluster.executions().await;
        let busiest = count_by(
            &snapshot
                .iter()
                .filter(|e| e.is_open())
                .cloned()
                .collect::<Vec<_>>(),
            |e| e.owner.clone().unwrap_or_default(),
        )
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(owner, _)| owner)
        .expect("open executions");
        let victim = cluster.index_of(&busiest);
        // Aim the stop inside one of its transactions: stop, let what it
        // sent land, and look; if no transaction is left open, wake it and
        // try again (a hundred tries at most; the test goes on either
        // way, the aim only makes the fault nastier).
        let mut stop_ms = 0;
        for attempt in 1..=100 {
            stop_ms = wall_ms();
            cluster.sigstop(victim);
            cluster
                .wait_until_quiet(victim, Duration::from_secs(10))
                .await;
            let states = cluster.backend_states(victim).await;
            let holds_work = !open_of(&cluster.executions().await, &busiest).is_empty();
            if holds_work && states.keys().any(|s| s.starts_with("idle in transaction")) {
                eprintln!("[sigstop_load] stopped inside a transaction at try {attempt}");
                break;
            }
            if attempt == 100 && holds_work {
                eprintln!("[sigstop_load] never caught it inside a transaction; stopped anyway");
                break;
            }
            assert!(
                attempt < 100,
                "{busiest} ran out of work before it could be stopped"
            );
            cluster.sigcont(victim);
        }
        let stale_ids: BTreeSet<String> = cluster
            .executions()
            .await
            .iter()
            .filter(|e| e.is_open() && e.owner.as_deref() == Some(busiest.as_str()))
            .map(|e| e.id.clone())
            .collect();
        let backends = cluster.backend_states(victim).await;
        assert!(!stale_ids.is_empty(), "{busiest} held no work when stopped");
        eprintln!(
            "[sigstop_load] stopped {busiest} with {} open execution(s); its backends by state: {backends:?}",
            stale_ids.len()
        );
        let took = cluster
            .poll(
                &format!("the survivors close the stopped {busiest}'s work"),
                cluster.ttl + Duration::from_secs(5),
                || async {
                    let open = cluster
                        .executions()
                        .await
                        .iter()
                        .filter(|e| e.is_open() && e.owner.as_deref() == Some(busiest.as_str()))
                        .count();
                    if open == 0 {
                        Ok(())
                    } else {
                        Err(format!(
                            "{open} execution(s) of {busiest} still open; leases held {:?}; \
                             backends waiting on a lock:{}",
                            cluster.held().await,
                            cluster.lock_waits().await
                        ))
                    }
                },
            )
            .await;
        eprintln!(
            "[sigstop_load] {busiest}'s work closed {} ms after the stop",
            wall_ms() - stop_ms
        );
        let _ = took;
        cluster.sigcont(victim);
        cluster
            .wait_until_all_done(&expect, Duration::from_secs(120))
            .await;
        cluster
            .wait_until_cluster_ready(cluster.ttl * 3 + Duration::from_secs(10))
            .await;
        cluster.check_invariants(&expect).await;
    });
}

// ---------------------------------------------------------------------------
// 4. One instance's database connections cut
// ---------------------------------------------------------------------------

/// Instance b loses the database for CHAOS_DB_CUT_SECONDS (60, as in the
/// issue; the whole suite still fits in its budget). The others take over
/// its partitions and its jobs within TTL + 5 s and run what falls due
/// meanwhile; when b is back it changes nothing and rejoins.
#[test]
fn one_instance_cut_off_the_database_is_taken_over_and_rejoins() {
    run("db_cut", |db| async move {
        let cut_for = Duration::from_secs(env_number("CHAOS_DB_CUT_SECONDS", 60));
        let cluster =
            Cluster::start_with(&db, 3, &[("WORKER_COUNT", "20")], Options::default()).await;
        cluster.wait_until_cluster_ready(READY).await;
        let victim = 1;
        let b = cluster.id(victim).to_string();
        let wave1 = cluster
            .seed(45, Action::Sleep(3_000), Due::DbNow(0), 0)
            .await;
        wait_until_running(&cluster, 30, Some(&b), Duration::from_secs(30)).await;

        let cut_ms = wall_ms();
        cluster.cut(victim).await;
        let cut_at = Instant::now();
        // Rules falling due while b is away, spread over most of the cut.
        let spread = (cut_for.as_millis() as i64 / 2).clamp(1_000, 30_000);
        let wave2 = cluster
            .seed(30, Action::Noop, Due::DbNow(1_000), spread / 30)
            .await;
        let snapshot = cluster.executions().await;
        let stale = open_of(&snapshot, &b);
        let mut due_during = unfinished(&wave1, &snapshot);
        due_during.extend(wave2.iter().cloned());
        let all: Vec<Occurrence> = wave1.iter().chain(&wave2).cloned().collect();
        let expect = Expect::completed(&all);
        eprintln!(
            "[db_cut] cut {b} off for {cut_for:?} with {} open execution(s)",
            stale.len()
        );

        // The survivors hold every partition within a TTL and a bit.
        let survivors_ready = cluster
            .poll(
                "the survivors hold every partition",
                cluster.ttl + Duration::from_secs(5),
                || async {
                    let leases = cluster.leases().await;
                    let bad: Vec<_> = leases
                        .iter()
                        .filter(|l| !l.live || l.holder.as_deref() == Some(b.as_str()))
                        .map(|l| (l.partition, l.holder.clone(), l.live))
                        .collect();
                    if !leases.is_empty() && bad.is_empty() {
                        Ok(())
                    } else {
                        Err(format!("not held by a survivor: {bad:?}"))
                    }
                },
            )
            .await;
        eprintln!(
            "[db_cut] survivors held every partition {:.1} s after the cut",
            survivors_ready.as_secs_f64()
        );
        // Everything due so far runs while b is still away.
        cluster
            .wait_until_all_done(&expect, cut_for.saturating_sub(cut_at.elapsed()))
            .await;
        // Then the rest of the cut: b stays alive and holds nothing.
        cluster
            .poll(
                "the cut lasts its time",
                cut_for + Duration::from_secs(5),
                || async {
                    if let Some(n) = cluster.held().await.get(&b) {
                        panic!("{b} holds {n} partition(s) while cut off the database");
                    }
                    if cut_at.elapsed() >= cut_for {
                        Ok(())
                    } else {
                        Err(format!("{:?} of the cut left", cut_for - cut_at.elapsed()))
                    }
                },
            )
            .await;

        cluster.restore(victim).await;
        let rejoined = cluster.wait_until_cluster_ready(READY).await;
        eprintln!(
            "[db_cut] {b} rejoined {:.1} s after the database came back",
            rejoined.as_secs_f64()
        );
        cluster
            .wait_until_all_done(&expect, Duration::from_secs(30))
            .await;
        let executions = cluster
            .check_invariants(&expect.clone().with_recovery(cut_ms, due_during))
            .await;
        assert_lost_attempts_rerun(&executions, &stale, &b);
    });
}

// ---------------------------------------------------------------------------
// 5. Clock skew
// ---------------------------------------------------------------------------

/// One instance 90 s ahead, another 90 s behind (libfaketime): rules run
/// exactly once, nobody is taken for dead, and no lease changes hands.
#[test]
fn clock_skew_of_90_s_steals_no_lease_and_runs_each_rule_once() {
    if !faketime_available() {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!(
                "faketime is not installed (CI=true, so this is a failure; apt-get install faketime)"
            );
        }
        let _ = writeln!(
            std::io::stderr(),
            "\n!!! SKIPPING clock skew chaos test: `faketime` is not installed \
             (apt-get install faketime)\n"
        );
        return;
    }
    run("clock_skew", |db| async move {
        let cluster = Cluster::start_with(
            &db,
            3,
            &[("WORKER_COUNT", "20")],
            Options {
                faketime: vec![None, Some("+90s".into()), Some("-90s".into())],
                ..Options::default()
            },
        )
        .await;
        cluster.wait_until_cluster_ready(READY).await;
        for (i, want) in [(0, 0), (1, 90_000), (2, -90_000)] {
            let offset = log_clock_offset_ms(&cluster.log(i))
                .unwrap_or_else(|| panic!("no timestamp in {}'s log", cluster.id(i)));
            assert!(
                (offset - want).abs() < 15_000,
                "{} should run {want} ms off, its log says {offset} ms",
                cluster.id(i)
            );
        }
        let before = cluster.leases().await;
        // Overdue by more than the skew, so every instance sees them due.
        let due = cluster
            .seed(150, Action::Sleep(300), Due::DbNow(-120_000), 0)
            .await;
        let expect = Expect::completed(&due);
        cluster
            .wait_until_all_done(&expect, Duration::from_secs(90))
            .await;
        // Watch the leases through two more TTLs of renewals.
        let ttl_ms = cluster.ttl.as_millis() as i64;
        cluster
            .poll(
                "every lease is renewed through two TTLs",
                cluster.ttl * 4 + Duration::from_secs(10),
                || async {
                    let now = cluster.leases().await;
                    let behind: Vec<i64> = before
                        .iter()
                        .filter(|b| {
                            now.iter()
                                .find(|n| n.partition == b.partition)
                                .is_none_or(|n| {
                                    n.epoch == b.epoch && n.expires_at < b.expires_at + 2 * ttl_ms
                                })
                        })
                        .map(|b| b.partition)
                        .collect();
                    if behind.is_empty() {
                        Ok(())
                    } else {
                        Err(format!("not renewed yet: partitions {behind:?}"))
                    }
                },
            )
            .await;
        let after = cluster.leases().await;
        let moved: Vec<String> = before
            .iter()
            .filter_map(|b| {
                let a = after.iter().find(|a| a.partition == b.partition)?;
                (a.holder != b.holder || a.epoch != b.epoch).then(|| {
                    format!(
                        "partition {}: {:?} epoch {} -> {:?} epoch {}",
                        b.partition, b.holder, b.epoch, a.holder, a.epoch
                    )
                })
            })
            .collect();
        let executions = cluster.check_invariants(&expect).await;
        assert!(
            moved.is_empty(),
            "leases changed hands although nobody died:\n  {}",
            moved.join("\n  ")
        );
        let failed: Vec<String> = executions
            .iter()
            .filter(|e| e.status != "completed" || e.attempt != 1)
            .map(|e| format!("{} {e}", e.occurrence()))
            .collect();
        assert!(
            failed.is_empty(),
            "a skewed clock made an instance look dead or lose a claim:\n  {}",
            failed.join("\n  ")
        );
        eprintln!(
            "[clock_skew] executions by owner {:?}",
            count_by(&executions, |e| e.owner.clone().unwrap_or_default())
        );

        // Nor can a clock 90 s ahead keep a lease (or look alive) late:
        // kill it mid-job and the others take over within TTL + 5 s.
        let ahead = 1;
        let b = cluster.id(ahead).to_string();
        let more = cluster
            .seed(30, Action::Sleep(3_000), Due::DbNow(-120_000), 0)
            .await;
        wait_until_running(&cluster, 1, Some(&b), Duration::from_secs(30)).await;
        let kill_ms = wall_ms();
        cluster.kill9(ahead);
        cluster
            .wait_until_quiet(ahead, Duration::from_secs(10))
            .await;
        let snapshot = cluster.executions().await;
        let lost = open_of(&snapshot, &b);
        let due_during = unfinished(&more, &snapshot);
        let all: Vec<Occurrence> = due.iter().chain(&more).cloned().collect();
        let expect = Expect::completed(&all);
        cluster
            .wait_until_all_done(&expect, cluster.ttl + Duration::from_secs(40))
            .await;
        let executions = cluster
            .check_invariants(&expect.clone().with_recovery(kill_ms, due_during))
            .await;
        assert_lost_attempts_rerun(&executions, &lost, &b);
        eprintln!(
            "[clock_skew] {b} (+90 s) killed with {} job(s): taken over, the last started again {} ms after the kill",
            lost.len(),
            failover_ms(&executions, &lost, kill_ms)
        );
    });
}

// ---------------------------------------------------------------------------
// 6. Rolling restart
// ---------------------------------------------------------------------------

/// SIGTERM each instance in turn (exit 0), start it again, wait until it
/// holds its share, next; rules keep falling due all along. Every
/// occurrence runs once, within TTL + 5 s of its due time, and a graceful
/// stop loses no attempt.
#[test]
fn rolling_restart_of_all_three_loses_and_repeats_nothing() {
    rolling_restart("rolling_restart", &[("WORKER_COUNT", "10")]);
}

/// The same with claims made half a second ahead of their due time: each
/// stop finds some claimed and not due yet, and withdraws them rather than
/// recording them cancelled (which left a second attempt behind each).
#[test]
fn rolling_restart_with_claims_made_ahead_loses_and_repeats_nothing() {
    rolling_restart(
        "rolling_restart_ahead",
        &[("WORKER_COUNT", "10"), ("MASTER_CLAIM_LEAD_SECONDS", "0.5")],
    );
}

fn rolling_restart(name: &'static str, env: &'static [(&'static str, &'static str)]) {
    run(name, |db| async move {
        let cluster = Cluster::start(&db, 3, env).await;
        cluster.wait_until_cluster_ready(READY).await;
        // One due every 350 ms for ~31 s: across the whole restart.
        let due = cluster
            .seed(90, Action::Sleep(500), Due::DbNow(1_000), 350)
            .await;
        let expect = Expect::completed(&due);
        let roll_ms = wall_ms();
        for i in 0..cluster.len() {
            let id = cluster.id(i).to_string();
            // Spread the restarts over the due period, and stop each
            // instance while it runs a job.
            let progress = 25 * i;
            cluster
                .poll(
                    &format!("{progress} occurrences completed"),
                    Duration::from_secs(40),
                    || async {
                        let done = due.len() - unfinished(&due, &cluster.executions().await).len();
                        if done >= progress {
                            Ok(())
                        } else {
                            Err(format!("{done} completed"))
                        }
                    },
                )
                .await;
            wait_until_running(&cluster, 1, Some(&id), Duration::from_secs(20)).await;
            let stopping = Instant::now();
            let status = cluster.sigterm_and_wait(i, Duration::from_secs(40));
            assert_eq!(
                status.code(),
                Some(0),
                "{id} did not stop cleanly: {status}"
            );
            let stopped = stopping.elapsed();
            // A graceful stop hands its partitions on at once.
            let held = cluster.held().await;
            assert!(
                !held.contains_key(&id),
                "{id} still holds leases after a graceful stop: {held:?}"
            );
            cluster.restart(i);
            let back = cluster.wait_until_cluster_ready(READY).await;
            eprintln!(
                "[{name}] {id}: stopped mid-job in {:.1} s, back with its share {:.1} s later",
                stopped.as_secs_f64(),
                back.as_secs_f64()
            );
        }
        cluster
            .wait_until_all_done(&expect, Duration::from_secs(60))
            .await;
        let executions = cluster
            .check_invariants(&expect.clone().with_recovery(roll_ms, due.clone()))
            .await;
        let not_clean: Vec<String> = executions
            .iter()
            .filter(|e| e.status != "completed" || e.attempt != 1)
            .map(|e| format!("{} {e}", e.occurrence()))
            .collect();
        assert!(
            not_clean.is_empty(),
            "a graceful stop lost or repeated attempts:\n  {}",
            not_clean.join("\n  ")
        );
    });
}

/// A graceful stop hands its partitions to its peers as its drain begins,
/// not a TTL after it ends: while its own jobs finish (it keeps
/// heartbeating, so nobody takes it over), the peer serves every
/// partition, and nothing runs twice.
#[test]
fn a_graceful_stop_hands_its_partitions_on_while_its_jobs_finish() {
    run("graceful_handover", |db| async move {
        let cluster = Cluster::start(&db, 2, &[("WORKER_COUNT", "4")]).await;
        cluster.wait_until_cluster_ready(READY).await;
        let due = cluster
            .seed(8, Action::Sleep(8_000), Due::DbNow(500), 0)
            .await;
        let leaving = cluster.id(0).to_string();
        let staying = cluster.id(1).to_string();
        wait_until_running(&cluster, 1, Some(&leaving), Duration::from_secs(20)).await;
        cluster.sigterm(0);
        cluster
            .poll(
                "the peer holds every partition",
                Duration::from_secs(6),
                || async {
                    let held = cluster.held().await;
                    if held.get(&staying) == Some(&24) && !held.contains_key(&leaving) {
                        Ok(())
                    } else {
                        Err(format!("{held:?}"))
                    }
                },
            )
            .await;
        assert!(
            cluster.is_running(0),
            "{leaving} exited before the handover was seen: its 8 s job should still be draining"
        );
        let status = cluster.wait_exit(0, Duration::from_secs(40));
        assert_eq!(
            status.code(),
            Some(0),
            "{leaving} did not stop cleanly: {status}"
        );
        let expect = Expect::completed(&due);
        cluster
            .wait_until_all_done(&expect, Duration::from_secs(60))
            .await;
        let executions = cluster.check_invariants(&expect).await;
        // Claims still queued when the drain began are given back unrun
        // (cancelled, never started) and run on the peer as the next
        // attempt; every run that started completed, once.
        let repeated: Vec<String> = executions
            .iter()
            .filter(|e| {
                e.status != "completed" && !(e.status == "cancelled" && e.started_at.is_none())
            })
            .map(|e| format!("{} {e:?}", e.occurrence()))
            .collect();
        assert!(
            repeated.is_empty(),
            "a graceful stop lost or repeated a run:\n  {}",
            repeated.join("\n  ")
        );
    });
}

// ---------------------------------------------------------------------------
// 7. A queue longer than the claim lease
// ---------------------------------------------------------------------------

/// Two workers per instance, 1 s jobs, a 3 s claim lease and 60 rules due
/// at once: ten seconds of queue. Claims are renewed (or not taken beyond
/// what can start soon), so no occurrence gets two started executions.
#[test]
fn a_queue_longer_than_the_claim_lease_runs_nothing_twice() {
    run("long_queue", |db| async move {
        let cluster = Cluster::start(
            &db,
            3,
            &[
                ("WORKER_COUNT", "2"),
                ("SCHEDULE_LOCK_TIMEOUT_SECONDS", "3"),
            ],
        )
        .await;
        cluster.wait_until_cluster_ready(READY).await;
        let due = cluster
            .seed(60, Action::Sleep(1_000), Due::DbNow(0), 0)
            .await;
        let expect = Expect::completed(&due);
        let drain = cluster
            .wait_until_all_done(&expect, Duration::from_secs(90))
            .await;
        let executions = cluster.check_invariants(&expect).await;
        let twice: Vec<String> = due
            .iter()
            .filter_map(|o| {
                let started: Vec<String> = executions
                    .iter()
                    .filter(|e| &e.occurrence() == o && e.started_at.is_some())
                    .map(ToString::to_string)
                    .collect();
                (started.len() > 1).then(|| format!("{o}: {}", started.join(" ")))
            })
            .collect();
        assert!(
            twice.is_empty(),
            "occurrences started more than once:\n  {}",
            twice.join("\n  ")
        );
        eprintln!(
            "[long_queue] drained in {:.1} s; {} execution(s) for {} occurrence(s), by status {:?}",
            drain.as_secs_f64(),
            executions.len(),
            due.len(),
            count_by(&executions, |e| e.status.clone())
        );
    });
}

/// The same queue, and `kill -9` of the busiest instance in the middle of
/// it: its running jobs and its queued claims are all closed by a survivor
/// (Failed, never left open) and run again, each once. No recovery bound
/// here: with two workers an instance the survivors' queue, not the
/// takeover, decides when a lost occurrence starts again.
#[test]
fn kill_9_in_a_queue_of_claims_loses_and_repeats_nothing() {
    run("kill9_queue", |db| async move {
        let cluster = Cluster::start(
            &db,
            3,
            &[
                ("WORKER_COUNT", "3"),
                ("SCHEDULE_LOCK_TIMEOUT_SECONDS", "3"),
            ],
        )
        .await;
        cluster.wait_until_cluster_ready(READY).await;
        let due = cluster
            .seed(120, Action::Sleep(500), Due::DbNow(0), 0)
            .await;
        let expect = Expect::completed(&due);
        cluster
            .poll(
                "a quarter of the queue has run",
                Duration::from_secs(30),
                || async {
                    let left = unfinished(&due, &cluster.executions().await).len();
                    if left <= due.len() * 3 / 4 {
                        Ok(())
                    } else {
                        Err(format!("{left} left"))
                    }
                },
            )
            .await;
        let busiest = wait_until_running(&cluster, 1, None, Duration::from_secs(10)).await;
        let victim = cluster.index_of(&busiest);
        cluster.kill9(victim);
        cluster
            .wait_until_quiet(victim, Duration::from_secs(10))
            .await;
        let snapshot = cluster.executions().await;
        let lost = open_of(&snapshot, &busiest);
        eprintln!(
            "[kill9_queue] killed {busiest} with {} open execution(s) by status {:?}",
            lost.len(),
            count_by(&lost, |e| e.status.clone())
        );
        assert!(!lost.is_empty(), "{busiest} held nothing when killed");
        cluster
            .wait_until_all_done(&expect, Duration::from_secs(60))
            .await;
        let executions = cluster.check_invariants(&expect).await;
        assert_lost_attempts_rerun(&executions, &lost, &busiest);
        let twice: Vec<String> = due
            .iter()
            .filter_map(|o| {
                let started: Vec<String> = executions
                    .iter()
                    .filter(|e| &e.occurrence() == o && e.started_at.is_some())
                    .map(ToString::to_string)
                    .collect();
                let lost_one = lost
                    .iter()
                    .any(|l| &l.occurrence() == o && l.started_at.is_some());
                (started.len() > 1 + usize::from(lost_one))
                    .then(|| format!("{o}: {}", started.join(" ")))
            })
            .collect();
        assert!(
            twice.is_empty(),
            "occurrences started more often than the kill explains:\n  {}",
            twice.join("\n  ")
        );
    });
}

// ---------------------------------------------------------------------------
// 8. Cancel and force-stop through another instance
// ---------------------------------------------------------------------------

/// A 30 s job runs on X; cancel (and, for a second rule, force-stop) is
/// sent to Y: 202, and the job is cancelled within one lease renewal.
#[test]
fn cancel_and_force_stop_through_another_instance() {
    run("cancel", |db| async move {
        let cluster = Cluster::start(&db, 3, &[("WORKER_COUNT", "4")]).await;
        cluster.wait_until_cluster_ready(READY).await;
        let due = cluster
            .seed(2, Action::Sleep(30_000), Due::DbNow(0), 0)
            .await;
        let expect = Expect::completed(&due).with_cancelled(due.clone());
        let running = |o: &Occurrence| {
            let o = o.clone();
            let cluster = &cluster;
            async move {
                cluster
                    .executions()
                    .await
                    .into_iter()
                    .find(|e| e.occurrence() == o && e.status == "running")
            }
        };
        cluster
            .poll("both jobs run", Duration::from_secs(30), || async {
                for o in &due {
                    if running(o).await.is_none() {
                        return Err(format!("{o} is not running"));
                    }
                }
                Ok(())
            })
            .await;
        let budget = cluster.ttl / 3 + Duration::from_secs(2);

        // Cancel.
        let job = running(&due[0]).await.unwrap();
        let x = cluster.index_of(job.owner.as_deref().unwrap());
        let y = (x + 1) % cluster.len();
        let reply = cluster.http(y, "POST", &format!("/api/v1/executions/{}/cancel", job.id));
        assert_eq!(
            reply.status,
            202,
            "cancel of {}'s job sent to {}: {reply:?}",
            cluster.id(x),
            cluster.id(y)
        );
        assert!(
            reply.body.contains(&job.id),
            "the answer names the execution: {reply:?}"
        );
        let took = cluster
            .poll(
                "the job is cancelled",
                budget + Duration::from_secs(30),
                || async {
                    let now = cluster.executions().await;
                    let e = now.iter().find(|e| e.id == job.id).unwrap();
                    if e.status == "cancelled" {
                        Ok(())
                    } else {
                        Err(e.to_string())
                    }
                },
            )
            .await;
        eprintln!(
            "[cancel] cancel sent to {} reached {}'s job in {:.2} s (budget {budget:?})",
            cluster.id(y),
            cluster.id(x),
            took.as_secs_f64()
        );
        let cancel_took = took;

        // Force-stop.
        let job = running(&due[1]).await.unwrap();
        let x = cluster.index_of(job.owner.as_deref().unwrap());
        let y = (x + 2) % cluster.len();
        let reply = cluster.http(
            y,
            "POST",
            &format!("/api/v1/branch-rules/{}/force-stop", due[1].rule),
        );
        assert!(
            (200..300).contains(&reply.status),
            "force-stop of {}'s job sent to {}: {reply:?}",
            cluster.id(x),
            cluster.id(y)
        );
        if reply.status != 202 {
            eprintln!(
                "[cancel] note: force-stop answered {} (not 202): {}",
                reply.status, reply.body
            );
        }
        let took = cluster
            .poll(
                "the force-stopped job is cancelled",
                budget + Duration::from_secs(30),
                || async {
                    let now = cluster.executions().await;
                    let e = now.iter().find(|e| e.id == job.id).unwrap();
                    let stopped: bool = sqlx::query_scalar(
                        "SELECT is_force_stopped FROM branch_rules WHERE id = $1",
                    )
                    .bind(&due[1].rule)
                    .fetch_one(&cluster.pool)
                    .await
                    .unwrap();
                    if e.status == "cancelled" && stopped {
                        Ok(())
                    } else {
                        Err(format!("{e}, is_force_stopped={stopped}"))
                    }
                },
            )
            .await;
        eprintln!(
            "[cancel] force-stop sent to {} reached {}'s job in {:.2} s (budget {budget:?})",
            cluster.id(y),
            cluster.id(x),
            took.as_secs_f64()
        );

        cluster
            .wait_until_all_done(&expect, Duration::from_secs(20))
            .await;
        cluster.check_invariants(&expect).await;
        assert!(
            cancel_took <= budget && took <= budget,
            "cancel took {cancel_took:?} and force-stop {took:?}: more than one lease renewal \
             plus a little ({budget:?})"
        );
    });
}

// ---------------------------------------------------------------------------
// The checker itself
// ---------------------------------------------------------------------------

/// The invariant checker finds each kind of violation (and passes a clean
/// history): a checker that cannot fail proves nothing.
#[test]
fn the_invariant_checker_catches_each_violation() {
    run("checker", |db| async move {
        let cluster = Cluster::start(&db, 0, &[]).await;
        let t = wall_ms() - 600_000;
        let due = cluster.seed(7, Action::Noop, Due::At(t), 0).await;
        let insert =
            |o: &Occurrence, attempt: i64, status: &str, span: (Option<i64>, Option<i64>)| {
                let (o, status) = (o.clone(), status.to_string());
                let pool = cluster.pool.clone();
                async move {
                    sqlx::query(
                    "INSERT INTO executions (id, branch_rule_id, scheduled_for, status, attempt, \
                     owner, requested_at, started_at, finished_at) \
                     VALUES (gen_random_uuid()::text, $1, $2, $3, $4, 'chaos-x', $2, $5, $6)",
                )
                .bind(&o.rule)
                .bind(o.due)
                .bind(&status)
                .bind(attempt)
                .bind(span.0)
                .bind(span.1)
                .execute(&pool)
                .await
                .unwrap();
                }
            };
        let at = |from: i64, to: i64| (Some(t + from), Some(t + to));
        // A clean history passes.
        for o in &due {
            insert(o, 1, "completed", at(100, 200)).await;
        }
        let clean = Expect::completed(&due).with_recovery(t, due.clone());
        cluster
            .violations(&clean)
            .await
            .unwrap_or_else(|report| panic!("a clean history fails the checker:\n{report}"));

        sqlx::query("DELETE FROM executions")
            .execute(&cluster.pool)
            .await
            .unwrap();
        // due[0]: fine. due[1]: completed twice. due[2]: never ran.
        // due[3]: overlapping attempts. due[4]: left running. due[5]: ran
        // a minute late. due[6]: fine, but its rule is still locked. And an
        // execution of an occurrence nobody seeded.
        insert(&due[0], 1, "completed", at(100, 200)).await;
        insert(&due[1], 1, "completed", at(100, 200)).await;
        insert(&due[1], 2, "completed", at(300, 400)).await;
        insert(&due[3], 1, "failed", at(100, 3_000)).await;
        insert(&due[3], 2, "completed", at(2_000, 4_000)).await;
        insert(&due[4], 1, "running", (Some(t + 100), None)).await;
        insert(&due[5], 1, "completed", at(60_000, 60_100)).await;
        insert(&due[6], 1, "completed", at(100, 200)).await;
        let stray = Occurrence {
            rule: due[0].rule.clone(),
            due: due[0].due + 1,
        };
        insert(&stray, 1, "completed", at(100, 200)).await;
        sqlx::query("UPDATE branch_rules SET lock_holder = 'chaos-x' WHERE id = $1")
            .bind(&due[6].rule)
            .execute(&cluster.pool)
            .await
            .unwrap();
        let report = cluster
            .violations(&clean)
            .await
            .expect_err("the checker passed a broken history");
        eprintln!("[checker] on a broken history the checker says:\n{report}");
        for (needle, what) in [
            ("invariant 1 ", "invariant 1"),
            ("invariant 2 ", "invariant 2"),
            ("invariant 3 ", "invariant 3"),
            ("invariant 4 ", "invariant 4"),
            (due[1].rule.as_str(), "the occurrence completed twice"),
            (due[2].rule.as_str(), "the occurrence that never ran"),
            (due[3].rule.as_str(), "the overlapping attempts"),
            (due[4].rule.as_str(), "the open execution"),
            (due[5].rule.as_str(), "the late run"),
            (due[6].rule.as_str(), "the lock left held"),
            ("was never seeded", "the stray execution"),
        ] {
            assert!(
                report.contains(needle),
                "the report misses {what}:\n{report}"
            );
        }
        assert!(
            !report.contains(&format!("{}: ", due[0])),
            "the report blames a clean occurrence:\n{report}"
        );
    });
}

// ---------------------------------------------------------------------------
// A static partition alone
// ---------------------------------------------------------------------------

/// Only `PARTITION=0/2` runs (issue 11, defect 4): it prefers the even
/// partitions, but nobody prefers the odd ones, so it covers them too and
/// every rule runs, once.
#[test]
fn a_lone_static_partition_runs_every_rule() {
    run("lone_static", |db| async move {
        let cluster = Cluster::start(&db, 1, &[("PARTITION", "0/2")]).await;
        cluster.wait_until_cluster_ready(READY).await;
        let due = cluster.seed(64, Action::Noop, Due::DbNow(0), 0).await;
        let expect = Expect::completed(&due);
        cluster
            .wait_until_all_done(&expect, Duration::from_secs(60))
            .await;
        let executions = cluster.check_invariants(&expect).await;
        assert_eq!(executions.len(), due.len(), "one execution per rule");
    });
}
