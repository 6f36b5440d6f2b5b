//! The root supervisor rebuilds failed actors and escalates when one keeps
//! failing. Real actors, a real SQLite database, the real restart path.

mod common;

use std::time::Duration;

use common::rules::{YEARLY, insert_rule, step};
use common::service::{
    DEADLINE, ready_ids, restarts, start_service, start_service_with, start_service_with_options,
};
use common::{eventually, sqlite_db};
use ruled::actors::ask;
use ruled::cluster::Ownership;
use ruled::config::Config;
use ruled::memory::{FedSampler, MemoryReading};
use ruled::messages::{LeaseMsg, MemoryGuardMsg, PlanMsg, RefresherMsg, WriterMsg};
use ruled::model::ExecutionStatus;
use ruled::service::{Service, ServiceOptions, StopCause};
use ruled::supervision::ActorKind;
use uuid::Uuid;

async fn insert_due_rule(service: &Service) -> Uuid {
    let demo = ruled::commands::demo::load_demo(service.store(), 0)
        .await
        .unwrap();
    assert!(demo.inserted > 0);
    // Every demo rule was due at the epoch; the heartbeat rule has no window.
    let row = service
        .store()
        .load_plan_data(1500)
        .await
        .unwrap()
        .branch_rules
        .into_iter()
        .find(|r| r.operation_time_from.is_none())
        .unwrap();
    row.id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_plan_actor_is_restarted_and_serves_again() {
    let db = sqlite_db().await;
    let running = start_service(&db.url).await;
    let service = running.service;
    let id = insert_due_rule(&service).await;
    eventually(DEADLINE, "the rule is ready", || async {
        ready_ids(&service).await.contains(&id)
    })
    .await;
    assert_eq!(restarts(&service, ActorKind::Plan).await, 0);

    let plan = service.directory().plan().unwrap();
    plan.cast(PlanMsg::InjectPanic("test: plan actor panics".into()))
        .unwrap();

    eventually(DEADLINE, "the plan actor was restarted once", || async {
        restarts(&service, ActorKind::Plan).await == 1
    })
    .await;
    eventually(
        DEADLINE,
        "the restarted plan serves the ready set",
        || async { ready_ids(&service).await.contains(&id) },
    )
    .await;
    let stats = service.supervisor_stats().await.unwrap();
    assert!(stats.alive.values().all(|&alive| alive), "{stats:?}");
    assert_eq!(restarts(&service, ActorKind::Plan).await, 1);
    service.shutdown("test").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_and_refresher_are_restarted_too() {
    let db = sqlite_db().await;
    let running = start_service(&db.url).await;
    let service = running.service;
    let directory = service.directory().clone();
    directory
        .writer()
        .unwrap()
        .cast(WriterMsg::InjectPanic("test: writer panics".into()))
        .unwrap();
    directory
        .refresher()
        .unwrap()
        .cast(RefresherMsg::InjectPanic("test: refresher panics".into()))
        .unwrap();
    eventually(DEADLINE, "both were restarted", || async {
        restarts(&service, ActorKind::Writer).await == 1
            && restarts(&service, ActorKind::Refresher).await == 1
    })
    .await;
    // The restarted refresher still feeds the plan, the writer still writes.
    let id = insert_due_rule(&service).await;
    eventually(DEADLINE, "a new rule reaches the plan", || async {
        ready_ids(&service).await.contains(&id)
    })
    .await;
    let writer = directory.writer().unwrap();
    eventually(DEADLINE, "the restarted writer wrote the plan", || async {
        ask(&writer, WriterMsg::Stats)
            .await
            .is_ok_and(|s| s.writes_ok > 0 && s.write_thread_alive)
    })
    .await;
    service.shutdown("test").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_memory_guard_is_restarted_and_its_first_reading_releases_the_master() {
    let db = sqlite_db().await;
    let feed = FedSampler::new(MemoryReading::ram_percent(95.0));
    // One reading per guard incarnation: only a restarted guard sees what
    // the feed says next.
    let running = start_service_with_options(
        &db.url,
        |config| Config {
            master_grace_period: Duration::ZERO,
            worker_stagger: Duration::ZERO,
            memory_check_interval: Duration::from_secs(3600),
            ..config
        },
        ServiceOptions::new().memory_sampler(feed.factory()),
    )
    .await;
    let service = running.service;
    let guard = service.directory().memory_guard().unwrap();
    let status = ask(&guard, MemoryGuardMsg::Status).await.unwrap();
    assert!(status.throttle.throttled, "{status:?}");
    let id = insert_rule(
        service.store(),
        YEARLY,
        chrono::Utc::now().timestamp_millis(),
        &[step("noop", serde_json::json!({}))],
    )
    .await;
    eventually(DEADLINE, "the rule is ready", || async {
        ready_ids(&service).await.contains(&id)
    })
    .await;
    assert!(service.store().executions_for(id).await.unwrap().is_empty());

    feed.set(MemoryReading::ram_percent(50.0));
    guard
        .cast(MemoryGuardMsg::InjectPanic(
            "test: memory guard panics".into(),
        ))
        .unwrap();
    eventually(DEADLINE, "the memory guard was restarted once", || async {
        restarts(&service, ActorKind::MemoryGuard).await == 1
    })
    .await;
    // Its first reading is below every level and changes nothing in its
    // own fresh gate, yet it must reach the master, which was held back.
    eventually(DEADLINE, "the held rule runs", || async {
        service
            .store()
            .executions_for(id)
            .await
            .unwrap()
            .iter()
            .any(|e| e.status == ExecutionStatus::Completed)
    })
    .await;
    let stats = service.supervisor_stats().await.unwrap();
    assert!(stats.alive.values().all(|&alive| alive), "{stats:?}");
    assert_eq!(stats.restarts["memory_guard"], 1);
    service.shutdown("test").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actor_failing_past_the_limit_escalates() {
    let db = sqlite_db().await;
    let running = start_service_with(&db.url, |config| Config {
        supervisor_max_restarts: 2,
        ..config
    })
    .await;
    let mut service = running.service;
    let directory = service.directory().clone();
    let panicker = tokio::spawn(async move {
        // Panic every incarnation as soon as it is registered again.
        for _ in 0..3 {
            let plan = loop {
                if let Some(plan) = directory.plan() {
                    break plan;
                }
                tokio::task::yield_now().await;
            };
            let _ = plan.cast(PlanMsg::InjectPanic("test: keeps failing".into()));
            let _ = plan.wait(None).await;
        }
    });
    let cause = tokio::time::timeout(DEADLINE, service.wait())
        .await
        .expect("escalation within the deadline")
        .unwrap();
    match cause {
        StopCause::Escalated(escalation) => {
            assert_eq!(escalation.actor, ActorKind::Plan);
            assert_eq!(escalation.failures_in_window, 3);
            assert!(
                escalation.last_failure.contains("keeps failing"),
                "{escalation}"
            );
        }
        other => panic!("expected an escalation, got {other:?}"),
    }
    panicker.await.unwrap();
    service.abort().await;
}

/// A graceful stop gives the partitions back, and a lease tick that comes
/// after that (queued, or its timer firing before the actor stops) must
/// not take them again: the stopped instance would hold them for a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_after_the_release_takes_no_partition_back() {
    let Some(db) = common::postgres_db().await else {
        return;
    };
    let running = start_service(&db.url).await;
    let service = running.service;
    let lease = service.directory().lease().unwrap();
    let holds_some = || async {
        ask(&lease, LeaseMsg::Status).await.is_ok_and(|status| {
            matches!(status.ownership, Ownership::Partitions { ref held, .. } if !held.is_empty())
        })
    };
    eventually(DEADLINE, "the instance holds partitions", holds_some).await;

    ask(&lease, LeaseMsg::ReleaseAll).await.unwrap();
    lease.cast(LeaseMsg::Tick).unwrap();
    assert!(!holds_some().await, "a tick took partitions back");
    let store = db.store().await;
    let view = store.partition_leases().await.unwrap();
    let me = service.config().instance_id.as_str();
    let held: Vec<_> = view
        .leases
        .iter()
        .filter(|lease| lease.live_holder(view.db_now) == Some(me))
        .collect();
    assert!(held.is_empty(), "leases held after the release: {held:?}");
    service.shutdown("test").await.unwrap();
    store.close().await;
}
