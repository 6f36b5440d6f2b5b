//! Starting and stopping the whole system: what `ruled serve` runs, and
//! what integration tests start in-process.

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorRef};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use metrics_exporter_prometheus::PrometheusHandle;

use crate::actions::{ActionRegistry, ActionSettings, leftovers};
use crate::actors::{AskError, ask, ask_within};
use crate::api::{ApiState, HttpServer};
use crate::clock::{Clock, millis_to_utc};
use crate::config::Config;
use crate::directory::{ActorKind, Directory};
use crate::memory::{SamplerFactory, system_sampler_factory};
use crate::messages::SupervisorMsg;
use crate::messages::supervisor::SupervisorStats;
use crate::model::Millis;
use crate::persist::{PersistError, PreviousStop, ShutdownMarker, take_marker, write_marker};
use crate::recovery::{self, RecoveryError};
use crate::store::{Store, StoreError, TransitionBatcher};
use crate::supervision::{Escalation, RootSupervisor, SupervisorArgs, shutdown_bound};

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the actor system did not start: {0}")]
    Spawn(String),
    #[error("escalated: {0}")]
    Escalated(Escalation),
    #[error("RULED_CHAOS_PANIC: {0}")]
    ChaosDrill(String),
    #[error(transparent)]
    Persist(#[from] PersistError),
    #[error("cannot listen on HTTP_ADDR {addr}: {error}")]
    HttpBind {
        addr: std::net::SocketAddr,
        error: std::io::Error,
    },
    #[error("cannot listen for signals: {0}")]
    Signal(std::io::Error),
    #[error("the supervisor did not answer: {0}")]
    Unresponsive(#[from] AskError),
    #[error(transparent)]
    Recovery(#[from] RecoveryError),
}

/// Why [`Service::wait`] returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopCause {
    Signal(&'static str),
    Escalated(Escalation),
}

/// What [`Service::start_with`] takes besides the configuration; each
/// part left out gets the default `ruled serve` uses.
#[derive(Clone, Default)]
pub struct ServiceOptions {
    registry: Option<ActionRegistry>,
    memory_sampler: Option<SamplerFactory>,
    metrics: Option<PrometheusHandle>,
    align_clock: bool,
}

impl ServiceOptions {
    pub fn new() -> ServiceOptions {
        ServiceOptions::default()
    }

    /// The action kinds jobs may use: a library user's own kinds beside
    /// (or instead of) the built-in ones. Default: the built-ins, with
    /// COMMAND_ACTIONS_ENABLED and HTTP_ACTION_ALLOW_PRIVATE applied.
    pub fn registry(mut self, registry: ActionRegistry) -> ServiceOptions {
        self.registry = Some(registry);
        self
    }

    /// Where the memory guard's readings come from. Default: this machine
    /// ([`SystemSampler`](crate::memory::SystemSampler)).
    pub fn memory_sampler(mut self, factory: SamplerFactory) -> ServiceOptions {
        self.memory_sampler = Some(factory);
        self
    }

    /// Re-anchors the clock on the database's at start (`ruled serve` does):
    /// claims, leases and heartbeats are then stamped in the database's
    /// time even on a host whose clock is off. Tests that drive a paused
    /// clock leave it off.
    pub fn align_clock_to_database(mut self) -> ServiceOptions {
        self.align_clock = true;
        self
    }

    /// The recorder `GET /metrics` renders (`ruled serve` installs one with
    /// [`crate::metrics::install`]). Default: none, and `/metrics` says so.
    pub fn metrics(mut self, handle: PrometheusHandle) -> ServiceOptions {
        self.metrics = Some(handle);
        self
    }
}

pub struct Service {
    config: Arc<Config>,
    clock: Clock,
    store: Store,
    directory: Directory,
    supervisor: ActorRef<SupervisorMsg>,
    supervisor_task: JoinHandle<()>,
    escalations: mpsc::UnboundedReceiver<Escalation>,
    http: HttpServer,
}

impl Service {
    /// Panics `kind` every 200 ms until the supervisor gives up on it (see
    /// [`CHAOS_PANIC_VAR`]).
    pub fn start_panic_drill(&self, kind: ActorKind) {
        warn!(actor = %kind, "🧨 {CHAOS_PANIC_VAR}: panicking actor {kind} until the supervisor escalates");
        let directory = self.directory.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(200));
            loop {
                every.tick().await;
                directory.inject_panic(kind, "chaos drill (RULED_CHAOS_PANIC)");
            }
        });
    }

    /// Connects and migrates the database, judges how the last run ended,
    /// and starts the supervision tree. The plan is loaded from PLAN_FILE by
    /// the PlanActor and refreshed from the database at once.
    pub async fn start(config: Config, clock: Clock) -> Result<Service, ServiceError> {
        Service::start_with(config, clock, ServiceOptions::default()).await
    }

    /// Starts with the action registry or memory sampler the caller chose.
    pub async fn start_with(
        config: Config,
        clock: Clock,
        options: ServiceOptions,
    ) -> Result<Service, ServiceError> {
        let command_ledger = leftovers::ledger_path(&config.plan_file);
        let registry = options.registry.unwrap_or_else(|| {
            ActionRegistry::with_builtins(ActionSettings {
                command_actions_enabled: config.command_actions_enabled,
                http_action_allow_private: config.http_action_allow_private,
                command_ledger: Some(command_ledger.clone()),
            })
        });
        let memory_sampler = options
            .memory_sampler
            .unwrap_or_else(system_sampler_factory);
        match take_marker(&config.shutdown_marker_file, &config.plan_file) {
            PreviousStop::FirstStart => info!("First start: no plan file and no shutdown marker"),
            PreviousStop::Clean(marker) => info!(
                "✅ The last stop was clean: {} at {} (pid {})",
                marker.signal,
                millis_to_utc(marker.shutdown_started_at).to_rfc3339(),
                marker.pid
            ),
            PreviousStop::Crash => warn!(
                "💥 The last stop was a crash: no shutdown marker at {}; recovering",
                config.shutdown_marker_file.display()
            ),
            PreviousStop::Unknown(reason) => {
                warn!("⚠️ Cannot tell how the last run ended: {reason}")
            }
        }
        let idle_in_transaction =
            (config.partition_lease_ttl / 3).clamp(Duration::from_secs(1), Duration::from_secs(10));
        let store = Store::connect_with(&config.database_url, idle_in_transaction).await?;
        store.migrate().await?;
        let clock = if options.align_clock {
            align_to_database(&store, clock).await?
        } else {
            clock
        };
        info!(backend = %store.backend(), instance_id = %config.instance_id, "Database ready");
        recovery::claim_instance_id(&store, &config, clock.now_ms()).await?;
        // Before the recovery lets the occurrences of lost runs run again.
        kill_command_leftovers(&command_ledger);
        recovery::recover_at_start(&store, &config, clock.now_ms()).await?;
        let batcher = TransitionBatcher::new(store.clone());
        // Bound before the actors start, so a taken port fails the start
        // rather than leaving a service nobody can reach.
        let listener = tokio::net::TcpListener::bind(config.http_addr)
            .await
            .map_err(|error| ServiceError::HttpBind {
                addr: config.http_addr,
                error,
            })?;

        let config = Arc::new(config);
        let directory = Directory::new();
        let (escalation_tx, escalations) = mpsc::unbounded_channel();
        let args = SupervisorArgs {
            config: Arc::clone(&config),
            clock,
            store: store.clone(),
            batcher,
            registry: registry.clone(),
            memory_sampler,
            directory: directory.clone(),
            escalations: escalation_tx,
        };
        let (supervisor, supervisor_task) =
            Actor::spawn(Some(directory.supervisor_name()), RootSupervisor, args)
                .await
                .map_err(|e| ServiceError::Spawn(e.to_string()))?;
        let api = ApiState::new(
            store.clone(),
            directory.clone(),
            Arc::clone(&config),
            clock,
            registry,
            options.metrics,
        );
        let streams = api.stream_closer();
        let http =
            HttpServer::start(listener, crate::api::router(api), streams).map_err(|error| {
                ServiceError::HttpBind {
                    addr: config.http_addr,
                    error,
                }
            })?;
        info!("🚀 ruled {} started", env!("CARGO_PKG_VERSION"));
        Ok(Service {
            http,
            config,
            clock,
            store,
            directory,
            supervisor,
            supervisor_task,
            escalations,
        })
    }

    pub fn directory(&self) -> &Directory {
        &self.directory
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Where the HTTP API listens: HTTP_ADDR with its port resolved, so
    /// a service started on port 0 can be reached.
    pub fn http_addr(&self) -> std::net::SocketAddr {
        self.http.addr()
    }

    pub async fn supervisor_stats(&self) -> Result<SupervisorStats, AskError> {
        ask(&self.supervisor, SupervisorMsg::Stats).await
    }

    /// Waits for SIGTERM, SIGINT or an escalation.
    pub async fn wait(&mut self) -> Result<StopCause, ServiceError> {
        self.wait_with(&mut StopSignals::listen()?).await
    }

    /// Waits for one of `signals` (including one that arrived before this
    /// call) or an escalation.
    pub async fn wait_with(
        &mut self,
        signals: &mut StopSignals,
    ) -> Result<StopCause, ServiceError> {
        Ok(tokio::select! {
            signal = signals.recv() => StopCause::Signal(signal),
            Some(escalation) = self.escalations.recv() => StopCause::Escalated(escalation),
        })
    }

    /// Graceful stop: the marker first (a stop that began cleanly is not a
    /// crash), then the supervision tree in order, then the pool.
    pub async fn shutdown(self, signal: &str) -> Result<(), ServiceError> {
        info!("🛑 Shutting down on {signal}");
        let marker = ShutdownMarker {
            shutdown_started_at: self.clock.now_ms(),
            pid: std::process::id(),
            signal: signal.to_string(),
        };
        if let Err(e) = write_marker(&self.config.shutdown_marker_file, &marker) {
            error!("Cannot write the shutdown marker: {e}");
        }
        // No new API requests while the engine drains: they could start
        // work (run now) that the drain would only cancel.
        self.http.stop().await;
        let bound = shutdown_bound(self.config.shutdown_grace);
        let stopped = ask_within(&self.supervisor, bound, SupervisorMsg::Shutdown).await;
        self.supervisor.stop(Some("shutdown".into()));
        let _ = self.supervisor_task.await;
        self.store.close().await;
        info!("👋 Stopped");
        stopped.map_err(ServiceError::from)
    }

    /// Stops without the graceful sequence, as after an escalation: the
    /// process is about to exit non-zero and its supervisor restarts it.
    pub async fn abort(self) {
        self.http.stop().await;
        self.supervisor.stop_children(Some("escalated".into()));
        self.supervisor.stop(Some("escalated".into()));
        let _ = self.supervisor_task.await;
        self.store.close().await;
    }
}

/// Kills what the command actions of a run that died by SIGKILL left
/// running ([`leftovers`]): their occurrences are about to run again.
fn kill_command_leftovers(ledger: &std::path::Path) {
    for leftover in leftovers::kill_leftovers(ledger) {
        metrics::counter!(crate::metrics::COMMAND_LEFTOVERS_KILLED_TOTAL).increment(1);
        warn!(
            pid = leftover.pid,
            group = leftover.group,
            "🧹 Killed process {} ({}), left running by a command action when ruled last died; its occurrence runs again",
            leftover.pid,
            leftover.command
        );
    }
}

/// The clock anchored on the database's: the offset is measured once,
/// halfway through a round trip, and the clock then runs on this host's
/// monotonic time, so a step of the host's wall clock later moves nothing.
async fn align_to_database(store: &Store, clock: Clock) -> Result<Clock, ServiceError> {
    let sent = clock.now_ms();
    let db_now = store.db_now().await?;
    let received = clock.now_ms();
    let offset = db_now - (sent + received) / 2;
    if offset.abs() > CLOCK_SKEW_WARNING_MS {
        warn!(
            offset_ms = offset,
            "⏱️ This host's clock is {:.1} s off the database's; ruled keeps the database's time",
            offset as f64 / 1000.0
        );
    }
    Ok(Clock::starting_at(clock.now_ms() + offset))
}

/// Skew worth a line in the log: beyond it, a host without the database's
/// time would misjudge claims and leases.
const CLOCK_SKEW_WARNING_MS: Millis = 1_000;

/// SIGTERM and SIGINT, caught from the moment this is created: a signal
/// that arrives before anyone waits is kept, not lost to the default action
/// (which would kill the process with no marker).
pub struct StopSignals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl StopSignals {
    pub fn listen() -> Result<StopSignals, ServiceError> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(StopSignals {
            terminate: signal(SignalKind::terminate()).map_err(ServiceError::Signal)?,
            interrupt: signal(SignalKind::interrupt()).map_err(ServiceError::Signal)?,
        })
    }

    /// The name of the next signal.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.terminate.recv() => "SIGTERM",
            _ = self.interrupt.recv() => "SIGINT",
        }
    }
}

/// `ruled serve`: runs until a signal (exit 0) or an escalation (error).
pub async fn serve(config: Config, options: ServiceOptions) -> Result<(), ServiceError> {
    // Before start-up, which takes a while (migrations, recovery, the first
    // plan read): a stop requested meanwhile is graceful too.
    let mut signals = StopSignals::listen()?;
    let options = options.align_clock_to_database();
    let mut service = Service::start_with(config, Clock::system(), options).await?;
    if let Some(kind) = chaos_panic_drill()? {
        service.start_panic_drill(kind);
    }
    match service.wait_with(&mut signals).await? {
        StopCause::Signal(signal) => service.shutdown(signal).await,
        StopCause::Escalated(escalation) => {
            error!("🚨 Exiting so the process supervisor restarts ruled: {escalation}");
            service.abort().await;
            Err(ServiceError::Escalated(escalation))
        }
    }
}

/// RULED_CHAOS_PANIC names an actor to panic over and over: a drill of the
/// escalation path (the process must exit non-zero, naming the actor).
/// Never set in production.
pub const CHAOS_PANIC_VAR: &str = "RULED_CHAOS_PANIC";

fn chaos_panic_drill() -> Result<Option<ActorKind>, ServiceError> {
    match std::env::var(CHAOS_PANIC_VAR) {
        Ok(name) if !name.is_empty() => name.parse().map(Some).map_err(ServiceError::ChaosDrill),
        _ => Ok(None),
    }
}
