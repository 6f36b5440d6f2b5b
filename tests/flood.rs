//! A flood of API changes (issue 12): 5,000 creates from 4 clients. Each
//! change nudges the refresher; the nudges coalesce, so `/readyz` stays 200
//! throughout and every rule reaches the plan within two refresh intervals
//! of the last create.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::TestDb;
use common::api::{Api, id};
use common::service::start_service_with;
use reqwest::StatusCode;
use ruled::actors::ask;
use ruled::config::Config;
use ruled::messages::PlanMsg;
use serde_json::json;

const TOKEN: &str = "flood-token";
const CREATES: usize = 5_000;
const CLIENTS: usize = 4;
const REFRESH: Duration = Duration::from_secs(2);

both_backends!(
    a_flood_of_creates_never_takes_the_instance_out_of_service,
    tokio::test(flavor = "multi_thread", worker_threads = 4),
    |db: TestDb| async move {
        // The whole TestDb, not just its url: it drops the database with it.
        let db = db;
        let running = start_service_with(&db.url, |config| Config {
            api_token: Some(TOKEN.into()),
            plan_refresh_interval: REFRESH,
            // No job may start: the rules are due next year.
            master_grace_period: Duration::from_secs(3600),
            ..config
        })
        .await;
        let service = &running.service;
        let api = Api::new(service);
        let brand = id(&api
            .post("/api/v1/brands", &json!({ "name": "Flood" }))
            .await);
        let branch = id(&api
            .post(
                "/api/v1/branches",
                &json!({ "brand_id": brand, "name": "b", "timezone": "UTC" }),
            )
            .await);
        let rule = id(&api
            .post(
                "/api/v1/rules",
                &json!({ "brand_id": brand, "name": "yearly", "cron_expression": "0 0 1 1 *" }),
            )
            .await);
        let template = id(&api
            .post(
                "/api/v1/action-templates",
                &json!({ "name": "noop", "kind": "noop", "config": {} }),
            )
            .await);

        // /readyz, polled all along the flood.
        let flooding = Arc::new(AtomicBool::new(true));
        let probes = Arc::new(AtomicUsize::new(0));
        let probe = {
            let api = api.without_token();
            let flooding = Arc::clone(&flooding);
            let probes = Arc::clone(&probes);
            tokio::spawn(async move {
                while flooding.load(Ordering::SeqCst) {
                    let ready = api.get("/readyz").await;
                    assert_eq!(
                        ready.status,
                        StatusCode::OK,
                        "/readyz during the flood: {}",
                        ready.text
                    );
                    probes.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        };

        let per_client = CREATES / CLIENTS;
        let mut clients = Vec::new();
        for _ in 0..CLIENTS {
            let api = Api::new(service);
            let body = json!({
                "branch_id": branch,
                "rule_id": rule,
                "action_details": [{ "action_template_id": template, "params": {} }],
            });
            clients.push(tokio::spawn(async move {
                for _ in 0..per_client {
                    let created = api.post("/api/v1/branch-rules", &body).await;
                    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text);
                }
            }));
        }
        for client in clients {
            client.await.unwrap();
        }
        let last_create = Instant::now();
        flooding.store(false, Ordering::SeqCst);
        probe.await.unwrap();
        assert!(
            probes.load(Ordering::SeqCst) > 0,
            "/readyz was never probed"
        );

        // Within two refresh intervals (plus the time a refresh of this size
        // takes in a debug build) every created rule is in the plan.
        let plan = service.directory().plan().unwrap();
        let deadline = last_create + 2 * REFRESH + Duration::from_secs(3);
        loop {
            let stats = ask(&plan, PlanMsg::Stats).await.unwrap();
            if stats.workflows >= CREATES {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "only {} of {CREATES} rules in the plan {:?} after the last create",
                stats.workflows,
                last_create.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
);
