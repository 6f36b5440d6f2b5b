//! An in-process ruled service on a test database, with fast intervals.

use std::time::Duration;

use ruled::actors::ask;
use ruled::clock::Clock;
use ruled::config::Config;
use ruled::messages::PlanMsg;
use ruled::service::{Service, ServiceOptions};
use tempfile::TempDir;
use uuid::Uuid;

/// Long enough for a loaded CI machine, short enough to fail fast.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// A started service and the directory holding its plan file and marker.
pub struct RunningService {
    pub service: Service,
    pub dir: TempDir,
}

/// The defaults, with files in `dir` and sub-second refresh and writes.
pub fn test_config(database_url: &str, dir: &std::path::Path) -> Config {
    Config {
        database_url: database_url.to_string(),
        plan_file: dir.join("plan.json"),
        shutdown_marker_file: dir.join("marker.json"),
        plan_refresh_interval: Duration::from_millis(100),
        plan_min_write_interval: Duration::from_millis(50),
        // Many services run at once in one test binary: each takes a free port.
        http_addr: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        ..Config::default()
    }
}

/// Sends the service's logs to the test harness, which shows them only
/// for failing tests. `RUST_LOG` filters as usual (default: info).
pub fn init_logs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .with_ansi(false)
            .try_init();
    });
}

pub async fn start_service(database_url: &str) -> RunningService {
    start_service_with(database_url, |config| config).await
}

/// Starts a service after `adjust` has changed the test config.
pub async fn start_service_with(
    database_url: &str,
    adjust: impl FnOnce(Config) -> Config,
) -> RunningService {
    start_service_with_options(database_url, adjust, ServiceOptions::default()).await
}

/// [`start_service_with`], with a registry or memory sampler of the test's.
pub async fn start_service_with_options(
    database_url: &str,
    adjust: impl FnOnce(Config) -> Config,
    options: ServiceOptions,
) -> RunningService {
    init_logs();
    let dir = tempfile::tempdir().unwrap();
    let config = adjust(test_config(database_url, dir.path()));
    let service = Service::start_with(config, Clock::system(), options)
        .await
        .unwrap();
    RunningService { service, dir }
}

/// How many times the supervisor restarted `kind` (0 while it cannot tell).
pub async fn restarts(service: &Service, kind: ruled::supervision::ActorKind) -> u64 {
    service
        .supervisor_stats()
        .await
        .map(|s| s.restarts[kind.as_str()])
        .unwrap_or(0)
}

/// No grace period, stagger or cooldown: due rules start at once.
pub fn without_delays(config: Config) -> Config {
    Config {
        master_grace_period: Duration::ZERO,
        worker_stagger: Duration::ZERO,
        worker_cooldown: Duration::ZERO,
        ..config
    }
}

/// The plan's ready set, or nothing while the plan actor is restarting.
pub async fn ready_ids(service: &Service) -> Vec<Uuid> {
    match service.directory().plan() {
        Some(plan) => ask(&plan, PlanMsg::Ready).await.unwrap_or_default(),
        None => Vec::new(),
    }
}

/// Starts a service on `clock` (for example `Clock::starting_at(t)`: the
/// service believes it is `t` when it starts, and time then passes at the
/// wall clock's pace), with its plan file and shutdown marker in `dir`, so
/// that a later start in the same `dir` finds them as a restarted install
/// would.
pub async fn start_service_on_clock(
    database_url: &str,
    dir: &std::path::Path,
    clock: Clock,
    adjust: impl FnOnce(Config) -> Config,
) -> Service {
    init_logs();
    let config = adjust(test_config(database_url, dir));
    Service::start_with(config, clock, ServiceOptions::default())
        .await
        .unwrap()
}
