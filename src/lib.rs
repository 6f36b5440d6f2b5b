//! # ruled
//!
//! A long-running service that runs scheduled business rules and never loses
//! one. Brands have branches; each branch applies rules. A branch rule has a
//! cron schedule in the branch's own time zone and an optional daily
//! operation window; when it is due and inside its window, ruled runs it.
//!
//! ## The actor tree
//!
//! ```text
//! RootSupervisor                 supervision/mod.rs      restarts children, escalates
//!  ├─ WriterActor                actors/writer.rs        debounced atomic plan-file writes
//!  ├─ PlanActor                  actors/plan.rs          owns the ExecutionPlan (single writer)
//!  ├─ RefresherActor             actors/refresher.rs     SQL → plan (smart merge), outbox
//!  ├─ LeaseActor                 actors/lease.rs         heartbeat, partition leases, takeover, cancel requests
//!  ├─ MemoryGuardActor           actors/memory_guard.rs  RAM / swap / GPU → throttle, pushed to the master
//!  ├─ MasterActor                actors/master.rs        ready set → claim → queue → dispatch
//!  │   └─ WorkerActor × N        actors/worker.rs        one job, then a fresh actor (single-job mode)
//!  └─ PrunerActor                actors/pruner.rs        deletes finished history past EXECUTION_RETENTION_DAYS
//! ```
//!
//! Actors share no mutable state: they talk through the typed messages in
//! [`messages`], one enum per actor, and find each other by name through
//! the [`directory::Directory`], so a restarted actor is found again.
//!
//! ## Layout
//!
//! | module | what it does |
//! |---|---|
//! | [`actions`] | the handler trait and built-in action kinds |
//! | [`api`] | the HTTP API (axum): health, readiness, metrics, `/api/v1`, server-sent events, and the web console at `/` (`console/`, compiled in) |
//! | [`actors`] | one actor per file; thin shells around the pure modules |
//! | [`messages`] | one message enum per actor |
//! | [`supervision`] | root supervisor, restart policy (pure) |
//! | [`directory`] | `ActorKind` and the `Directory` actors find each other by (leaf) |
//! | [`cluster`] | several instances: partitions, fair share of leases, takeover and instance-id verdicts (pure) |
//! | [`plan`] | `ExecutionPlan`, ready filter, smart merge, local next run, the browse and verdicts of the console and `ruled plan` (pure) |
//! | [`memory`] | memory throttling: thresholds and hysteresis (pure), samplers, cgroup limits |
//! | [`queue`] | the master's job queue: FIFO, dedup, active and recent jobs, start-lag history (pure) |
//! | [`schedule`] | cron, time zones, windows, DST, preview (pure) |
//! | [`lifecycle`] | `Claim`, `ClaimRequest`, `Fence`, `Finish`, execution ids: the lifecycle types (pure) |
//! | [`store`] | sqlx queries and migrations for SQLite and PostgreSQL |
//! | [`persist`] | the plan file and shutdown marker, written atomically |
//! | [`recovery`] | crash recovery, takeover of silent instances, the INSTANCE_ID check |
//! | [`service`] | start-up, graceful shutdown |
//! | [`commands`] | the `ruled plan`, `preview` and `demo` commands |
//! | [`config`], [`clock`], [`metrics`], [`model`], [`cursor`] | configuration, time, metric names, rows, page cursors |

pub mod actions;
pub mod actors;
pub mod api;
pub mod clock;
pub mod cluster;
pub mod commands;
pub mod config;
pub mod cursor;
pub mod directory;
pub mod lifecycle;
pub mod memory;
pub mod messages;
pub mod metrics;
pub mod model;
pub mod persist;
pub mod plan;
pub mod queue;
pub mod recovery;
pub mod schedule;
pub mod service;
pub mod store;
pub mod supervision;
