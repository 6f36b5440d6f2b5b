//! The HTTP interface (DESIGN.md §5): health, readiness and metrics outside
//! the `/api/v1` prefix, served by axum on HTTP_ADDR.
//!
//! Handlers never touch actor state directly: they read the database
//! through the [`Store`] and ask actors through the [`Directory`], exactly
//! like any other part of the system, so the API cannot bypass the single
//! writers of plan and job state.

mod catalog;
mod console;
mod engine;
pub mod error;
mod events;
pub mod extract;
mod health;
pub mod i18n;
mod metrics;
pub mod present;
pub mod routes;
pub mod schema;
pub mod simulation;
pub mod views;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{error, info};

use crate::actions::ActionRegistry;
use crate::clock::Clock;
use crate::config::Config;
use crate::directory::Directory;
use crate::store::Store;

/// What every handler shares. Cheap to clone: one `Arc`.
#[derive(Clone)]
pub struct ApiState {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    directory: Directory,
    config: Arc<Config>,
    clock: Clock,
    registry: ActionRegistry,
    metrics: Option<PrometheusHandle>,
    /// Turns true when the server stops: open event streams end then,
    /// instead of holding the graceful shutdown for its whole grace.
    closing: Arc<watch::Sender<bool>>,
}

/// Ends every open event stream; [`HttpServer::stop`] uses it.
#[derive(Clone)]
pub struct StreamCloser(Arc<watch::Sender<bool>>);

impl StreamCloser {
    pub fn close(&self) {
        self.0.send_replace(true);
    }
}

impl ApiState {
    pub fn new(
        store: Store,
        directory: Directory,
        config: Arc<Config>,
        clock: Clock,
        registry: ActionRegistry,
        metrics: Option<PrometheusHandle>,
    ) -> ApiState {
        ApiState {
            inner: Arc::new(Inner {
                store,
                directory,
                config,
                clock,
                registry,
                metrics,
                closing: Arc::new(watch::channel(false).0),
            }),
        }
    }

    /// What the server calls at stop to end the event streams.
    pub fn stream_closer(&self) -> StreamCloser {
        StreamCloser(Arc::clone(&self.inner.closing))
    }

    /// Changes to true when the server stops.
    pub fn closing(&self) -> watch::Receiver<bool> {
        self.inner.closing.subscribe()
    }

    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    pub fn directory(&self) -> &Directory {
        &self.inner.directory
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    pub fn clock(&self) -> Clock {
        self.inner.clock
    }

    pub fn registry(&self) -> &ActionRegistry {
        &self.inner.registry
    }

    pub fn metrics_handle(&self) -> Option<&PrometheusHandle> {
        self.inner.metrics.as_ref()
    }
}

/// Every route of the service: `/api/v1` from [`routes::api`] behind
/// the token check, probes and metrics outside it and open, and every
/// answer through [`error::envelope`], so errors are JSON in the caller's
/// language whoever produced them.
pub fn router(state: ApiState) -> Router {
    let (api, _) = routes::api().split_for_parts();
    let api = api
        .fallback(no_api_route)
        .method_not_allowed_fallback(method_not_allowed)
        .route_layer(axum::middleware::from_fn(extract::refuse_undeclared_query))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            extract::require_token,
        ));
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(metrics::metrics))
        .route("/", get(console::index))
        .route("/console/{file}", get(console::asset))
        .route("/favicon.ico", get(console::favicon))
        .nest(routes::PREFIX, api)
        .fallback(no_route)
        .layer(axum::middleware::from_fn(error::envelope))
        .with_state(state)
}

/// Inside the nest axum hands handlers the path without [`routes::PREFIX`];
/// messages show the one the client sent.
pub(crate) fn full_path(uri: &axum::http::Uri) -> String {
    let path = uri.path();
    if path.starts_with(routes::PREFIX) {
        path.to_string()
    } else {
        format!("{}{path}", routes::PREFIX)
    }
}

async fn no_route(method: axum::http::Method, uri: axum::http::Uri) -> error::ApiError {
    error::ApiError::NoRoute(format!("{method} {}", uri.path()))
}

async fn no_api_route(method: axum::http::Method, uri: axum::http::Uri) -> error::ApiError {
    error::ApiError::NoRoute(format!("{method} {}", full_path(&uri)))
}

/// 405 with `Allow` from the OpenAPI document, built from the same list
/// of handlers as the router, so the two cannot disagree.
async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let Some(allow) = routes::allowed_methods(uri.path()) else {
        return no_route(method, uri).await.into_response();
    };
    let mut response = error::ApiError::MethodNotAllowed {
        method: method.to_string(),
        path: full_path(&uri),
        allow: allow.clone(),
    }
    .into_response();
    if let Ok(value) = axum::http::HeaderValue::from_str(&allow) {
        response
            .headers_mut()
            .insert(axum::http::header::ALLOW, value);
    }
    response
}

/// A running HTTP server; [`HttpServer::stop`] ends it gracefully.
pub struct HttpServer {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
    streams: StreamCloser,
}

/// How long in-flight requests get at shutdown before the server is dropped.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

impl HttpServer {
    /// Serves `router` on an already bound listener, so the caller learns
    /// the port (HTTP_ADDR may say port 0) before anything is served.
    pub fn start(
        listener: TcpListener,
        router: Router,
        streams: StreamCloser,
    ) -> std::io::Result<HttpServer> {
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.await;
            };
            if let Err(e) = axum::serve(listener, router)
                .with_graceful_shutdown(shutdown)
                .await
            {
                error!("HTTP server failed: {e}");
            }
        });
        info!("🌐 HTTP API listening on http://{addr}");
        Ok(HttpServer {
            addr,
            stop,
            task,
            streams,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting connections and waits (bounded) for open requests.
    pub async fn stop(self) {
        self.streams.close();
        let _ = self.stop.send(());
        let mut task = self.task;
        if tokio::time::timeout(STOP_GRACE, &mut task).await.is_err() {
            task.abort();
        }
    }
}
