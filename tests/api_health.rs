//! Health, readiness and metrics over real HTTP on a loopback port.

mod common;

use std::time::Duration;

use common::api::Api;
use common::service::{DEADLINE, RunningService, start_service, start_service_with_options};
use common::{TestDb, eventually};
use reqwest::StatusCode;
use ruled::service::ServiceOptions;

/// Takes the whole `TestDb`: a closure that only touched `db.url` would
/// capture just that field and drop the database under the service.
async fn start(db: &TestDb) -> RunningService {
    start_service(&db.url).await
}

both_backends!(
    healthz_answers_and_readyz_turns_ready,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let running = start(&db).await;
        let api = Api::new(&running.service);

        let health = api.get("/healthz").await;
        assert_eq!(health.status, StatusCode::OK, "{}", health.text);
        assert_eq!(health.json["status"], "ok");

        eventually(DEADLINE, "/readyz answers 200", || async {
            api.get("/readyz").await.status == StatusCode::OK
        })
        .await;
        let ready = api.get("/readyz").await;
        assert_eq!(ready.json["checks"]["database"], true, "{}", ready.text);
        assert_eq!(ready.json["checks"]["plan_loaded"], true);
        assert_eq!(ready.json["checks"]["actors_alive"], true);
        running.service.shutdown("test").await.unwrap();
    }
);

both_backends!(
    readyz_fails_without_the_database,
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    |db: TestDb| async move {
        let running = start(&db).await;
        let api = Api::new(&running.service);
        eventually(DEADLINE, "/readyz answers 200", || async {
            api.get("/readyz").await.status == StatusCode::OK
        })
        .await;

        // A closed pool is a database the service cannot reach.
        running.service.store().close().await;
        let reply = api.get("/readyz").await;
        assert_eq!(
            reply.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{}",
            reply.text
        );
        assert_eq!(reply.json["checks"]["database"], false);
        assert!(
            reply.json["problems"][0]
                .as_str()
                .unwrap()
                .contains("database")
        );
        // Liveness does not depend on the database.
        assert_eq!(api.get("/healthz").await.status, StatusCode::OK);
        running.service.abort().await;
    }
);

#[tokio::test]
async fn metrics_renders_the_handle_it_was_given() {
    let db = common::sqlite_db().await;
    // A recorder of this test's own, not installed globally, so tests in
    // this binary do not fight over the process-wide one.
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        metrics::counter!("ruled_test_probe_total").increment(3);
    });
    let running = start_service_with_options(
        &db.url,
        |config| config,
        ServiceOptions::new().metrics(handle),
    )
    .await;
    let api = Api::new(&running.service);
    let reply = api.get("/metrics").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(
        reply.text.contains("ruled_test_probe_total 3"),
        "{}",
        reply.text
    );
    running.service.shutdown("test").await.unwrap();
}

#[tokio::test]
async fn metrics_without_a_recorder_is_404() {
    let db = common::sqlite_db().await;
    let running = start(&db).await;
    let reply = Api::new(&running.service).get("/metrics").await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert!(reply.text.contains("no metrics recorder"));
    running.service.shutdown("test").await.unwrap();
}

#[tokio::test]
async fn the_port_is_released_at_shutdown() {
    let db = common::sqlite_db().await;
    let running = start(&db).await;
    let addr = running.service.http_addr();
    running.service.shutdown("test").await.unwrap();
    let refused =
        tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
            .await
            .unwrap();
    assert!(refused.is_err(), "still accepting on {addr} after shutdown");
}
