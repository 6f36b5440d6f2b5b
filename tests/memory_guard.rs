//! Memory throttling end to end (seed 004): a service fed memory readings
//! holds due rules back while throttled, lets running jobs finish, and runs
//! every deferred rule once, in due order, when the throttle lifts. Also
//! the real sampler on this machine, and a worker handed a job while
//! throttled.

mod common;

use std::path::Path;
use std::time::Duration;

use common::rules::{Step, YEARLY, insert_rule, step};
use common::service::{
    RunningService, ready_ids, restarts, start_service, start_service_with_options,
};
use common::{TestDb, eventually, sqlite_db};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use ruled::actions::{ActionRegistry, ActionSettings};
use ruled::actors::ask;
use ruled::actors::worker::{WorkerActor, WorkerArgs};
use ruled::clock::Clock;
use ruled::config::Config;
use ruled::memory::{FedSampler, GpuSupport, MemoryReading, MemorySampler, SystemSampler};
use ruled::messages::master::JobReport;
use ruled::messages::memory_guard::MemoryStatus;
use ruled::messages::worker::{CancelReason, Job};
use ruled::messages::{LeaseMsg, MasterMsg, MemoryGuardMsg, WorkerMsg};
use ruled::model::{Execution, ExecutionStatus, Millis};
use ruled::plan::{JobSpec, JobStep};
use ruled::service::{Service, ServiceOptions};
use ruled::store::{ClaimRequest, Store, Transition, TransitionBatcher};
use ruled::supervision::{ActorKind, Directory};
use serde_json::json;
use tokio::sync::mpsc;
use uuid::Uuid;

const DEADLINE: Duration = Duration::from_secs(30);
const CHECK_INTERVAL: Duration = Duration::from_millis(20);
/// Readings the guard takes while a test watches for work that must not
/// start: at 20 ms each, well past the few milliseconds the engine takes
/// to start a due rule when nothing holds it back.
const QUIET_SAMPLES: u64 = 15;

fn now_ms() -> Millis {
    chrono::Utc::now().timestamp_millis()
}

/// No grace period, cooldown or stagger; readings every 20 ms from `feed`.
async fn start(db: &TestDb, feed: &FedSampler, workers: usize) -> RunningService {
    start_service_with_options(
        &db.url,
        |config| Config {
            master_grace_period: Duration::ZERO,
            worker_cooldown: Duration::ZERO,
            worker_stagger: Duration::ZERO,
            worker_count: workers,
            memory_check_interval: CHECK_INTERVAL,
            ..config
        },
        ServiceOptions::new().memory_sampler(feed.factory()),
    )
    .await
}

async fn guard_status(service: &Service) -> Option<MemoryStatus> {
    let guard = service.directory().memory_guard()?;
    ask(&guard, MemoryGuardMsg::Status).await.ok()
}

async fn throttled(service: &Service) -> bool {
    guard_status(service)
        .await
        .is_some_and(|s| s.throttle.throttled)
}

async fn executions(service: &Service, id: Uuid) -> Vec<Execution> {
    service.store().executions_for(id).await.unwrap()
}

async fn status_is(service: &Service, id: Uuid, status: ExecutionStatus) -> bool {
    executions(service, id)
        .await
        .iter()
        .any(|e| e.status == status)
}

/// Watches `QUIET_SAMPLES` readings go by once `ids` are all ready in the
/// plan, failing at once if any of them gets an execution meanwhile.
async fn assert_held_back(service: &Service, ids: &[Uuid], what: &str) {
    let watch_from = std::cell::Cell::new(None);
    eventually(DEADLINE, what, || async {
        for id in ids {
            let runs = executions(service, *id).await;
            assert!(runs.is_empty(), "{id} ran while throttled: {runs:?}");
        }
        let samples = guard_status(service).await.map_or(0, |s| s.samples);
        match watch_from.get() {
            None => {
                let ready = ready_ids(service).await;
                if ids.iter().all(|id| ready.contains(id)) {
                    watch_from.set(Some(samples));
                }
                false
            }
            Some(from) => samples >= from + QUIET_SAMPLES,
        }
    })
    .await;
    assert!(throttled(service).await, "still throttled after {what}");
}

both_backends!(
    deferred_rules_run_once_in_due_order_after_the_release,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let feed = FedSampler::new(MemoryReading::ram_percent(50.0));
        // One worker: jobs start strictly one after another, so their start
        // times show the order they were handed out in.
        let running = start(&db, &feed, 1).await;
        let service = &running.service;

        // A job already running when the throttle comes goes on.
        let long = insert_rule(
            service.store(),
            YEARLY,
            now_ms(),
            &[step("sleep", json!({"ms": 400}))],
        )
        .await;
        eventually(DEADLINE, "the long job runs", || async {
            status_is(service, long, ExecutionStatus::Running).await
        })
        .await;
        feed.set(MemoryReading::ram_percent(91.0));
        eventually(DEADLINE, "the guard throttles", || throttled(service)).await;
        let status = guard_status(service).await.unwrap();
        assert_eq!(status.throttle.reason.as_deref(), Some("RAM at 91.0%"));

        // Rules that fall due while throttled, inserted out of due order.
        let base = now_ms() + 150;
        let mut deferred = Vec::new();
        for offset in [3, 1, 4, 0, 2] {
            let due = base + offset * 30;
            let id = insert_rule(
                service.store(),
                YEARLY,
                due,
                &[step("sleep", json!({"ms": 5}))],
            )
            .await;
            deferred.push((due, id));
        }
        let ids: Vec<Uuid> = deferred.iter().map(|(_, id)| *id).collect();
        assert_held_back(service, &ids, "the deferred rules are held back").await;
        eventually(DEADLINE, "the running job finished", || async {
            status_is(service, long, ExecutionStatus::Completed).await
        })
        .await;
        assert!(throttled(service).await);

        // Between the two levels the throttle holds.
        feed.set(MemoryReading::ram_percent(85.0));
        assert_held_back(service, &ids, "RAM at 85% holds the throttle").await;

        feed.set(MemoryReading::ram_percent(79.0));
        eventually(DEADLINE, "every deferred rule completed", || async {
            for id in &ids {
                if !status_is(service, *id, ExecutionStatus::Completed).await {
                    return false;
                }
            }
            true
        })
        .await;
        assert!(!throttled(service).await);
        deferred.sort();
        let mut started = Vec::new();
        for (due, id) in &deferred {
            let runs = executions(service, *id).await;
            assert_eq!(runs.len(), 1, "exactly one execution of {id}: {runs:?}");
            assert_eq!(runs[0].scheduled_for, *due, "the deferred occurrence");
            assert_eq!(runs[0].attempt, 1);
            started.push(runs[0].started_at.unwrap());
        }
        assert!(
            started.windows(2).all(|pair| pair[0] < pair[1]),
            "started in due order: {started:?}"
        );
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    swap_and_gpu_throttle_too,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let feed = FedSampler::new(MemoryReading::ram_percent(10.0).with_gpu_percent(10.0));
        let running = start(&db, &feed, 2).await;
        let service = &running.service;
        let cases = [
            (
                MemoryReading::ram_percent(10.0)
                    .with_swap_percent(71.0)
                    .with_gpu_percent(10.0),
                "swap at 71.0%",
            ),
            (
                MemoryReading::ram_percent(10.0).with_gpu_percent(86.0),
                "GPU 0 at 86.0%",
            ),
        ];
        for (reading, reason) in cases {
            feed.set(reading);
            eventually(DEADLINE, reason, || throttled(service)).await;
            let status = guard_status(service).await.unwrap();
            assert_eq!(status.throttle.reason.as_deref(), Some(reason));
            let id = insert_rule(
                service.store(),
                YEARLY,
                now_ms(),
                &[step("noop", json!({}))],
            )
            .await;
            assert_held_back(service, &[id], reason).await;
            // GPU at 74% and swap back to 0: below every resume level.
            feed.set(MemoryReading::ram_percent(10.0).with_gpu_percent(74.0));
            eventually(DEADLINE, "the held rule ran after the release", || async {
                status_is(service, id, ExecutionStatus::Completed).await
            })
            .await;
            assert_eq!(executions(service, id).await.len(), 1);
        }
        assert_eq!(
            guard_status(service).await.unwrap().gpu,
            GpuSupport::Devices(1)
        );
        running.service.shutdown("test").await.unwrap();
    }
);

// Claims queued when the throttle comes are given back (another instance
// may run them); at the release they are claimed again at once, not held
// back for the recently-processed window (30 s) as if they had run.
both_backends!(
    claims_queued_at_the_throttle_run_promptly_after_the_release,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let feed = FedSampler::new(MemoryReading::ram_percent(50.0));
        let running = start(&db, &feed, 1).await;
        let service = &running.service;
        let now = now_ms();
        // Due first, so the one worker takes it and the others queue.
        let long = insert_rule(
            service.store(),
            YEARLY,
            now - 1_000,
            &[step("sleep", json!({"ms": 1_500}))],
        )
        .await;
        // Two: one worker claims at most two rounds of one ahead.
        let mut queued = Vec::new();
        for _ in 0..2 {
            queued
                .push(insert_rule(service.store(), YEARLY, now, &[step("noop", json!({}))]).await);
        }
        eventually(
            DEADLINE,
            "the long job runs and the others are claimed",
            || async {
                if !status_is(service, long, ExecutionStatus::Running).await {
                    return false;
                }
                for id in &queued {
                    if !status_is(service, *id, ExecutionStatus::Requested).await {
                        return false;
                    }
                }
                true
            },
        )
        .await;
        feed.set(MemoryReading::ram_percent(91.0));
        eventually(DEADLINE, "the queued claims are given back", || async {
            for id in &queued {
                if !status_is(service, *id, ExecutionStatus::Cancelled).await {
                    return false;
                }
            }
            true
        })
        .await;
        feed.set(MemoryReading::ram_percent(50.0));
        // Well inside the 30 s the dedup window would have held them.
        eventually(
            Duration::from_secs(10),
            "the given-back occurrences ran",
            || async {
                for id in &queued {
                    if !status_is(service, *id, ExecutionStatus::Completed).await {
                        return false;
                    }
                }
                true
            },
        )
        .await;
        for id in &queued {
            let runs = executions(service, *id).await;
            let brief: Vec<(i64, ExecutionStatus)> =
                runs.iter().map(|e| (e.attempt, e.status)).collect();
            assert_eq!(
                brief,
                vec![
                    (1, ExecutionStatus::Cancelled),
                    (2, ExecutionStatus::Completed)
                ],
                "{runs:?}"
            );
            assert_eq!(runs[0].scheduled_for, runs[1].scheduled_for);
            assert!(
                runs[0]
                    .error
                    .as_deref()
                    .is_some_and(|e| e.contains("memory is short")),
                "{:?}",
                runs[0].error
            );
        }
        running.service.shutdown("test").await.unwrap();
    }
);

/// `kind` panics while the throttle holds, memory then at `meanwhile` %;
/// once it is back, a due rule is still held back, and runs when RAM falls
/// under the resume level.
async fn an_actor_restarted_while_throttled_keeps_the_throttle(kind: ActorKind, meanwhile: f64) {
    let db = sqlite_db().await;
    let feed = FedSampler::new(MemoryReading::ram_percent(95.0));
    let running = start(&db, &feed, 2).await;
    let service = &running.service;
    eventually(DEADLINE, "the guard throttles", || throttled(service)).await;
    feed.set(MemoryReading::ram_percent(meanwhile));
    assert!(
        service
            .directory()
            .inject_panic(kind, &format!("test: {kind} panics"))
    );
    eventually(DEADLINE, &format!("the {kind} was restarted"), || async {
        restarts(service, kind).await == 1
            && service
                .supervisor_stats()
                .await
                .is_ok_and(|stats| stats.alive[kind.as_str()])
    })
    .await;
    let id = insert_rule(
        service.store(),
        YEARLY,
        now_ms(),
        &[step("noop", json!({}))],
    )
    .await;
    assert_held_back(
        service,
        &[id],
        &format!("the throttle holds after the {kind} restarted"),
    )
    .await;
    feed.set(MemoryReading::ram_percent(79.0));
    eventually(DEADLINE, "the rule ran after the release", || async {
        status_is(service, id, ExecutionStatus::Completed).await
    })
    .await;
    running.service.shutdown("test").await.unwrap();
}

/// The guard pushes only changes, so a master restarted during a throttle
/// must ask for the state itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_restarted_while_throttled_stays_throttled() {
    an_actor_restarted_while_throttled_keeps_the_throttle(ActorKind::Master, 95.0).await;
}

/// A guard restarted while throttled keeps the hysteresis: RAM between the
/// resume (80 %) and throttle (90 %) levels holds the throttle, as it does
/// without the restart. A fresh gate used to start released and lift it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_guard_restarted_while_throttled_keeps_the_throttle() {
    an_actor_restarted_while_throttled_keeps_the_throttle(ActorKind::MemoryGuard, 85.0).await;
}

#[test]
fn the_system_sampler_reads_this_machine() {
    let mut sampler = SystemSampler::new().unwrap();
    let reading = sampler.sample().unwrap();
    assert!(reading.ram.total_bytes > 0 && reading.ram.used_bytes > 0);
    for ratio in [reading.ram.ratio(), reading.swap.ratio()] {
        assert!((0.0..=1.0).contains(&ratio), "{reading:?}");
    }
    match sampler.gpu() {
        GpuSupport::Off(reason) => {
            assert!(reading.gpus.is_none(), "{reading:?}");
            assert!(!reason.is_empty());
        }
        GpuSupport::Devices(count) => {
            let gpus = reading.gpus.as_ref().expect("devices are read");
            assert!(gpus.len() <= count as usize);
            assert!(gpus.iter().all(|g| (0.0..=1.0).contains(&g.ratio())));
        }
    }
    // Without the kernel driver there is nothing for NVML to talk to.
    if !Path::new("/proc/driver/nvidia").exists() {
        assert!(
            matches!(sampler.gpu(), GpuSupport::Off(_)),
            "{:?}",
            sampler.gpu()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_starts_with_the_system_sampler() {
    let db = sqlite_db().await;
    let running = start_service(&db.url).await;
    let service = &running.service;
    let status = guard_status(service).await.expect("the guard answers");
    assert!(status.samples >= 1, "{status:?}");
    let reading = status.last_reading.clone().expect("a reading was taken");
    assert!((0.0..=1.0).contains(&reading.ram.ratio()), "{reading:?}");
    assert!((0.0..=1.0).contains(&reading.swap.ratio()), "{reading:?}");
    if !Path::new("/proc/driver/nvidia").exists() {
        assert!(matches!(status.gpu, GpuSupport::Off(_)), "{status:?}");
        assert!(reading.gpus.is_none());
    }
    let stats = service.supervisor_stats().await.unwrap();
    assert!(stats.alive.values().all(|&alive| alive), "{stats:?}");
    assert!(stats.alive.contains_key("memory_guard"), "{stats:?}");
    running.service.shutdown("test").await.unwrap();
}

/// Stands in for the master of a worker built by hand: passes on what the
/// worker reports.
struct ReportProbe;

impl Actor for ReportProbe {
    type Msg = MasterMsg;
    type State = mpsc::UnboundedSender<JobReport>;
    type Arguments = mpsc::UnboundedSender<JobReport>;

    async fn pre_start(
        &self,
        _myself: ActorRef<MasterMsg>,
        reports: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(reports)
    }

    async fn handle(
        &self,
        _myself: ActorRef<MasterMsg>,
        message: MasterMsg,
        reports: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let MasterMsg::JobFinished(report) = message {
            let _ = reports.send(report);
        }
        Ok(())
    }
}

/// A due rule claimed and marked Scheduled, as the master hands it over,
/// and a worker (told the memory is short) to hand it to.
struct Handoff {
    store: Store,
    worker: ActorRef<WorkerMsg>,
    job: Box<Job>,
    reports: mpsc::UnboundedReceiver<JobReport>,
    lock_time: Millis,
}

async fn throttled_worker_with_a_job(db: &TestDb) -> Handoff {
    worker_with_a_job(db, &[step("noop", json!({}))], Handover::Throttled).await
}

/// How [`worker_with_a_job`] hands its job over.
#[derive(PartialEq)]
enum Handover {
    /// To a worker told memory is short, the Scheduled write committed.
    Throttled,
    /// To a worker free to start, the claim taken over in the database
    /// between the claim and the handoff.
    ClaimTakenOver,
}

async fn worker_with_a_job(db: &TestDb, steps: &[Step], handover: Handover) -> Handoff {
    let store = db.store().await;
    let id = insert_rule(&store, YEARLY, now_ms(), steps).await;
    let claim = store
        .claim(&ClaimRequest {
            branch_rule_id: id,
            holder: "test".into(),
            now: now_ms(),
            lock_timeout_ms: 300_000,
            execution_id: Uuid::new_v4(),
            run_now: false,
            due_by: None,
        })
        .await
        .unwrap()
        .expect("the claim is won");
    let data = store.load_plan_data(100).await.unwrap();
    let steps = data
        .action_details
        .iter()
        .filter(|d| d.branch_rule_id == id)
        .map(|detail| JobStep {
            detail: detail.clone(),
            template: data
                .action_templates
                .iter()
                .find(|t| t.id == detail.action_template_id)
                .cloned(),
        })
        .collect();
    let job = Box::new(Job {
        fence: claim.fence(),
        lock_renewed_at: claim.execution.requested_at,
        execution: claim.execution.clone(),
        spec: JobSpec {
            branch_rule: claim.branch_rule.clone(),
            steps: Some(steps),
            schedule: Err("not needed here".into()),
            policy: Default::default(),
        },
    });
    if handover == Handover::ClaimTakenOver {
        store
            .execute_sql(&format!(
                "UPDATE branch_rules SET lock_holder = 'peer', lock_epoch = lock_epoch + 1 \
                 WHERE id = '{id}'"
            ))
            .await
            .unwrap();
    }
    let batcher = TransitionBatcher::new(store.clone());
    let scheduled = batcher
        .enqueue(Transition::Scheduled {
            fence: job.fence.clone(),
            now: now_ms(),
        })
        .await;
    // Commits after the Scheduled write (the batcher keeps the order), so
    // the handoff below starts from a committed Scheduled state.
    let renewed_at = now_ms();
    if handover == Handover::Throttled {
        assert!(batcher.renew_lock(&job.fence, renewed_at).await.unwrap());
    }

    let (reports_tx, reports) = mpsc::unbounded_channel();
    let (master, _) = Actor::spawn(None, ReportProbe, reports_tx).await.unwrap();
    let config = match handover {
        Handover::Throttled => Config {
            // Renewals every 100 ms show the held job's lock is kept.
            schedule_lock_timeout: Duration::from_millis(300),
            ..Config::default()
        },
        // The defaults: a claim up to a second old starts at once.
        Handover::ClaimTakenOver => Config::default(),
    };
    let args = WorkerArgs {
        number: 1,
        config: std::sync::Arc::new(config),
        clock: Clock::system(),
        store: store.clone(),
        batcher,
        registry: ActionRegistry::with_builtins(ActionSettings::default()),
        directory: Directory::new(),
        master,
    };
    let (worker, _) = Actor::spawn(None, WorkerActor, args).await.unwrap();
    if handover == Handover::Throttled {
        worker
            .cast(WorkerMsg::MemoryThrottle { throttled: true })
            .unwrap();
    }
    worker
        .cast(WorkerMsg::Run {
            job: job.clone(),
            scheduled,
        })
        .unwrap();
    Handoff {
        store,
        worker,
        lock_time: renewed_at,
        job,
        reports,
    }
}

async fn execution(store: &Store, job: &Job) -> Execution {
    store
        .executions_for(job.branch_rule_id())
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.id == job.execution_id())
        .unwrap()
}

/// Waits until the held job's lock was renewed, checking at every look
/// that it has not started.
async fn wait_for_a_renewal_while_held(handoff: &Handoff) {
    let (store, job) = (&handoff.store, &handoff.job);
    eventually(DEADLINE, "the held job's lock is renewed", || async {
        let current = execution(store, job).await;
        assert_eq!(current.status, ExecutionStatus::Scheduled, "{current:?}");
        let rules = store.load_plan_data(100).await.unwrap().branch_rules;
        let rule = rules.iter().find(|r| r.id == job.branch_rule_id()).unwrap();
        rule.lock_time.unwrap() > handoff.lock_time
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_handed_a_job_while_throttled_starts_it_on_the_release() {
    let db = sqlite_db().await;
    let mut handoff = throttled_worker_with_a_job(&db).await;
    wait_for_a_renewal_while_held(&handoff).await;
    assert!(handoff.reports.try_recv().is_err());

    handoff
        .worker
        .cast(WorkerMsg::MemoryThrottle { throttled: false })
        .unwrap();
    let report = tokio::time::timeout(DEADLINE, handoff.reports.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(report.status, ExecutionStatus::Completed);
    let done = execution(&handoff.store, &handoff.job).await;
    assert_eq!(done.status, ExecutionStatus::Completed);
    assert!(done.started_at.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_job_cancelled_never_starts() {
    let db = sqlite_db().await;
    let mut handoff = throttled_worker_with_a_job(&db).await;
    wait_for_a_renewal_while_held(&handoff).await;
    handoff
        .worker
        .cast(WorkerMsg::Cancel {
            execution_id: handoff.job.execution_id(),
            reason: CancelReason::Shutdown,
        })
        .unwrap();
    let report = tokio::time::timeout(DEADLINE, handoff.reports.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(report.status, ExecutionStatus::Cancelled);
    let cancelled = execution(&handoff.store, &handoff.job).await;
    assert_eq!(cancelled.status, ExecutionStatus::Cancelled);
    assert_eq!(cancelled.started_at, None);
    assert!(
        cancelled.error.unwrap().contains("before it started"),
        "the reason is recorded"
    );
    // At shutdown the occurrence is not consumed: it runs after the restart.
    let rules = handoff
        .store
        .load_plan_data(100)
        .await
        .unwrap()
        .branch_rules;
    let rule = rules
        .iter()
        .find(|r| r.id == handoff.job.branch_rule_id())
        .unwrap();
    assert_eq!(
        rule.next_run_time,
        handoff.job.spec.branch_rule.next_run_time
    );
    assert_eq!(rule.last_run_time, None);
    assert!(rule.lock_holder.is_none() && !rule.is_currently_running);
    handoff.worker.wait(Some(DEADLINE)).await.unwrap();
}

/// The partitions `service` holds a lease on now.
async fn partitions_held(service: &Service) -> usize {
    let Some(lease) = service.directory().lease() else {
        return 0;
    };
    ask(&lease, LeaseMsg::Status)
        .await
        .map_or(0, |status| status.ownership.held_count().unwrap_or(0))
}

/// On PostgreSQL a throttled instance claims nothing, so it hands its
/// partitions to a peer with memory to spare, which runs what falls due
/// meanwhile; once the throttle lifts it takes its share again. Before,
/// the rules of its partitions waited for its memory while the peer idled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_instance_hands_its_partitions_to_a_peer_until_it_recovers() {
    let Some(db) = common::postgres_db().await else {
        return;
    };
    let instance = |id: &'static str, feed: &FedSampler| {
        let options = ServiceOptions::new().memory_sampler(feed.factory());
        let db = &db;
        async move {
            start_service_with_options(
                &db.url,
                |config| Config {
                    instance_id: id.into(),
                    partition_lease_retry: Duration::from_millis(200),
                    master_grace_period: Duration::ZERO,
                    worker_cooldown: Duration::ZERO,
                    worker_stagger: Duration::ZERO,
                    worker_count: 2,
                    memory_check_interval: CHECK_INTERVAL,
                    ..config
                },
                options,
            )
            .await
        }
    };
    let short_feed = FedSampler::new(MemoryReading::ram_percent(50.0));
    let roomy_feed = FedSampler::new(MemoryReading::ram_percent(50.0));
    let short = instance("short-of-memory", &short_feed).await;
    let roomy = instance("roomy", &roomy_feed).await;
    let count = short.service.config().partition_count as usize;
    eventually(DEADLINE, "both instances hold a share", || async {
        partitions_held(&short.service).await > 0 && partitions_held(&roomy.service).await > 0
    })
    .await;

    short_feed.set(MemoryReading::ram_percent(95.0));
    eventually(DEADLINE, "the peer holds every partition", || async {
        partitions_held(&short.service).await == 0 && partitions_held(&roomy.service).await == count
    })
    .await;
    let store = roomy.service.store();
    let mut ids = Vec::new();
    for _ in 0..20 {
        ids.push(insert_rule(store, YEARLY, now_ms(), &[step("noop", json!({}))]).await);
    }
    eventually(DEADLINE, "every rule ran", || async {
        for id in &ids {
            if !status_is(&roomy.service, *id, ExecutionStatus::Completed).await {
                return false;
            }
        }
        true
    })
    .await;
    for id in &ids {
        let runs = executions(&roomy.service, *id).await;
        assert_eq!(runs.len(), 1, "{runs:?}");
        assert_eq!(runs[0].owner, "roomy", "{runs:?}");
    }
    assert!(throttled(&short.service).await, "still throttled");

    short_feed.set(MemoryReading::ram_percent(50.0));
    eventually(
        DEADLINE,
        "the recovered instance takes its share again",
        || async { partitions_held(&short.service).await > 0 },
    )
    .await;
    short.service.shutdown("test").await.unwrap();
    roomy.service.shutdown("test").await.unwrap();
}

/// A fresh claim's job starts before its Scheduled and Running writes
/// commit. Should they find the claim taken over meanwhile, the actions
/// already started are cancelled at once, as on a lost lock renewal,
/// rather than running on beside the new owner's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_started_on_a_claim_taken_over_meanwhile_stops_at_once() {
    let db = sqlite_db().await;
    let long = [step("sleep", json!({"ms": 600_000}))];
    let mut handoff = worker_with_a_job(&db, &long, Handover::ClaimTakenOver).await;
    let report = tokio::time::timeout(DEADLINE, handoff.reports.recv())
        .await
        .expect("the job stops well before its sleep ends")
        .unwrap();
    assert_eq!(report.status, ExecutionStatus::Cancelled);
    let row = execution(&handoff.store, &handoff.job).await;
    assert_eq!(
        row.status,
        ExecutionStatus::Requested,
        "nothing of the lost claim is written: {row:?}"
    );
}
