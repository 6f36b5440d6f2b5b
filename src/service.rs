//! Starting and stopping the whole system: what `ruled serve` runs, and
//! what integration tests start in-process.

use std::sync::Arc;

use ractor::{Actor, ActorRef};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use crate::actors::{AskError, ask};
use crate::clock::{Clock, millis_to_utc};
use crate::config::Config;
use crate::messages::SupervisorMsg;
use crate::messages::supervisor::SupervisorStats;
use crate::persist::{PersistError, PreviousStop, ShutdownMarker, take_marker, write_marker};
use crate::store::{Store, StoreError};
use crate::supervision::{Directory, Escalation, RootSupervisor, SupervisorArgs};

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the actor system did not start: {0}")]
    Spawn(String),
    #[error("escalated: {0}")]
    Escalated(Escalation),
    #[error(transparent)]
    Persist(#[from] PersistError),
    #[error("cannot listen for signals: {0}")]
    Signal(std::io::Error),
    #[error("the supervisor did not answer: {0}")]
    Unresponsive(#[from] AskError),
}

/// Why [`Service::wait`] returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopCause {
    Signal(&'static str),
    Escalated(Escalation),
}

pub struct Service {
    config: Arc<Config>,
    clock: Clock,
    store: Store,
    directory: Directory,
    supervisor: ActorRef<SupervisorMsg>,
    supervisor_task: JoinHandle<()>,
    escalations: mpsc::UnboundedReceiver<Escalation>,
}

impl Service {
    /// Connects and migrates the database, judges how the last run ended,
    /// and starts the supervision tree. The plan is loaded from PLAN_FILE by
    /// the PlanActor and refreshed from the database at once.
    pub async fn start(config: Config, clock: Clock) -> Result<Service, ServiceError> {
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
        let store = Store::connect(&config.database_url).await?;
        store.migrate().await?;
        info!(backend = %store.backend(), instance_id = %config.instance_id, "Database ready");

        let config = Arc::new(config);
        let directory = Directory::new();
        let (escalation_tx, escalations) = mpsc::unbounded_channel();
        let args = SupervisorArgs {
            config: Arc::clone(&config),
            clock,
            store: store.clone(),
            directory: directory.clone(),
            escalations: escalation_tx,
        };
        let (supervisor, supervisor_task) =
            Actor::spawn(Some(directory.supervisor_name()), RootSupervisor, args)
                .await
                .map_err(|e| ServiceError::Spawn(e.to_string()))?;
        info!("🚀 ruled {} started", env!("CARGO_PKG_VERSION"));
        Ok(Service {
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

    pub async fn supervisor_stats(&self) -> Result<SupervisorStats, AskError> {
        ask(&self.supervisor, SupervisorMsg::Stats).await
    }

    /// Waits for SIGTERM, SIGINT or an escalation.
    pub async fn wait(&mut self) -> Result<StopCause, ServiceError> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate = signal(SignalKind::terminate()).map_err(ServiceError::Signal)?;
        let mut interrupt = signal(SignalKind::interrupt()).map_err(ServiceError::Signal)?;
        Ok(tokio::select! {
            _ = terminate.recv() => StopCause::Signal("SIGTERM"),
            _ = interrupt.recv() => StopCause::Signal("SIGINT"),
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
        let stopped = ask(&self.supervisor, SupervisorMsg::Shutdown).await;
        self.supervisor.stop(Some("shutdown".into()));
        let _ = self.supervisor_task.await;
        self.store.close().await;
        info!("👋 Stopped");
        stopped.map_err(ServiceError::from)
    }

    /// Stops without the graceful sequence, as after an escalation: the
    /// process is about to exit non-zero and its supervisor restarts it.
    pub async fn abort(self) {
        self.supervisor.stop_children(Some("escalated".into()));
        self.supervisor.stop(Some("escalated".into()));
        let _ = self.supervisor_task.await;
        self.store.close().await;
    }
}

/// `ruled serve`: runs until a signal (exit 0) or an escalation (error).
pub async fn serve(config: Config) -> Result<(), ServiceError> {
    let mut service = Service::start(config, Clock::system()).await?;
    match service.wait().await? {
        StopCause::Signal(signal) => service.shutdown(signal).await,
        StopCause::Escalated(escalation) => {
            error!("🚨 Exiting so the process supervisor restarts ruled: {escalation}");
            service.abort().await;
            Err(ServiceError::Escalated(escalation))
        }
    }
}
