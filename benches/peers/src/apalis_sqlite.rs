//! apalis with its SQLite storage: a drain of noop jobs pushed before the
//! workers start, every connection in WAL with synchronous=NORMAL, as
//! ruled's are.
//!
//! What makes apalis-sqlite 1.0 fast or slow here, found on this machine
//! (2 cores) with 10,000 jobs:
//!
//! - One worker with concurrency 50 drains at ~580 jobs/s whatever its
//!   batch size or poll interval: its ack is an `UPDATE … FROM
//!   json_each(?)` that SQLite plans as a walk over every job that worker
//!   ever locked, re-parsing the JSON for each, so each ack batch costs
//!   time in proportion to the jobs already done.
//! - Several workers on sqlx's default pool (several connections) are
//!   often ended by `database is locked` (SQLITE_BUSY) from each other's
//!   write transactions; a dead worker's fetched jobs then wait a minute
//!   for another worker's heartbeat to take them back as orphans.
//! - One worker per unit of concurrency (50 workers, concurrency 1 each),
//!   every one on one shared connection, batch 50: ~7,000–10,000 jobs/s,
//!   and no errors. That is the default here.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use apalis::prelude::*;
use apalis_sqlite::{Config, SqliteConnectOptions, SqlitePoolOptions, SqliteStorage};
use sqlx::sqlite::{SqliteJournalMode, SqliteSynchronous};
use tokio::sync::Notify;

/// How apalis is set up for the drain.
#[derive(Debug, Clone, Copy)]
pub struct Tuning {
    /// Jobs in flight at once, over all workers: ruled's worker count.
    pub concurrency: usize,
    /// apalis workers sharing that concurrency, each with its own name,
    /// fetch loop and event writer.
    pub workers: usize,
    /// Tasks a worker fetches per query; its lock/ack event channel holds
    /// four times as many.
    pub batch_size: usize,
    /// How often an idle worker is woken to fetch again; 0 leaves it to
    /// the storage's own wake-ups (no poll strategy).
    pub poll_ms: u64,
    /// The pool's connections, shared by all workers; 0 keeps sqlx's
    /// default.
    pub max_connections: u32,
    /// `ANALYZE` once the jobs are in, before the clock starts: apalis's
    /// `setup` runs `PRAGMA optimize` on empty tables only.
    pub analyze: bool,
}

impl Tuning {
    pub fn describe(&self) -> String {
        let poll = match self.poll_ms {
            0 => "no poll strategy".to_string(),
            ms => format!("poll_with_interval {ms} ms"),
        };
        let pool = match self.max_connections {
            0 => "sqlx's default pool".to_string(),
            1 => "one pooled connection shared by all".to_string(),
            n => format!("a pool of {n} connections"),
        };
        format!(
            "{} worker(s) sharing concurrency {}, batch_size {}, {poll}, {pool}, {}; lock_tasks and \
             persist_results on (the defaults: Queued, Running and Done are each written)",
            self.workers,
            self.concurrency,
            self.batch_size,
            if self.analyze {
                "ANALYZE after the push"
            } else {
                "no ANALYZE"
            },
        )
    }
}

pub struct Drain {
    pub jobs: usize,
    pub seconds: f64,
    pub journal_mode: String,
    pub synchronous: String,
    /// Workers that ended during the drain, and why.
    pub errors: Vec<String>,
}

impl Drain {
    pub fn jobs_per_second(&self) -> f64 {
        self.jobs as f64 / self.seconds
    }
}

/// The handlers' count: the drain is over when the storage says every job
/// is done, but the count says when to start looking.
#[derive(Clone)]
struct Progress {
    handled: Arc<AtomicUsize>,
    total: usize,
    all_handled: Arc<Notify>,
}

async fn noop(_job: u32, progress: Data<Progress>) -> Result<(), BoxDynError> {
    if progress.handled.fetch_add(1, Ordering::SeqCst) + 1 == progress.total {
        // notify_one keeps the permit if nobody waits yet.
        progress.all_handled.notify_one();
    }
    Ok(())
}

pub async fn drain(jobs: usize, tuning: Tuning) -> Drain {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let options = SqliteConnectOptions::new()
        .filename(dir.path().join("apalis.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal);
    let config = Config::default()
        .queue("drain")
        .batch_size(tuning.batch_size);

    // Migrations, the push and ANALYZE go through a connection of their
    // own, closed before the drain: SQLite reads statistics when a
    // connection opens.
    let setup = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options.clone())
        .await
        .expect("the setup pool");
    SqliteStorage::setup(&setup)
        .await
        .expect("apalis migrations");
    // `setup` turns synchronous OFF on its connection; back to NORMAL, so
    // that no connection here writes less durably than ruled's do.
    sqlx::query("PRAGMA synchronous = NORMAL")
        .execute(&setup)
        .await
        .expect("synchronous NORMAL");
    SqliteStorage::<u32>::new(&setup)
        .with_config(config.clone())
        .push_bulk((0..jobs as u32).collect())
        .await
        .expect("jobs pushed");
    if tuning.analyze {
        sqlx::query("ANALYZE")
            .execute(&setup)
            .await
            .expect("ANALYZE");
    }
    setup.close().await;

    let mut pool_options = SqlitePoolOptions::new();
    if tuning.max_connections > 0 {
        pool_options = pool_options.max_connections(tuning.max_connections);
    }
    let pool = pool_options
        .connect_with(options.clone())
        .await
        .expect("the drain pool");
    let journal_mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&pool)
        .await
        .expect("journal_mode");
    let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&pool)
        .await
        .expect("synchronous");
    // Counting done jobs must not take a connection from the workers.
    let watch = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .expect("the watching pool");
    let storage = SqliteStorage::<u32>::new(&pool).with_config(config);

    let progress = Progress {
        handled: Arc::new(AtomicUsize::new(0)),
        total: jobs,
        all_handled: Arc::new(Notify::new()),
    };
    let all_handled = Arc::clone(&progress.all_handled);
    let shares: Vec<usize> = (0..tuning.workers)
        .map(|i| {
            tuning.concurrency / tuning.workers
                + usize::from(i < tuning.concurrency % tuning.workers)
        })
        .collect();
    let started = Instant::now();
    let running: Vec<_> = shares
        .into_iter()
        .enumerate()
        .map(|(i, share)| {
            let name = format!("peer-drain-{i}");
            if tuning.poll_ms == 0 {
                let worker = WorkerBuilder::new(name)
                    .backend(storage.clone())
                    .concurrency(share)
                    .data(progress.clone())
                    .build(noop);
                tokio::spawn(worker.run())
            } else {
                let interval = Duration::from_millis(tuning.poll_ms);
                let worker = WorkerBuilder::new(name)
                    .backend(storage.clone().poll_with_interval(interval))
                    .concurrency(share)
                    .data(progress.clone())
                    .build(noop);
                tokio::spawn(worker.run())
            }
        })
        .collect();
    all_handled.notified().await;
    // A job is done for apalis when its ack is written, after the handler
    // returned.
    loop {
        let done: i64 = sqlx::query_scalar("SELECT count(*) FROM Jobs WHERE status = 'Done'")
            .fetch_one(&watch)
            .await
            .expect("done count");
        if done as usize >= jobs {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let seconds = started.elapsed().as_secs_f64();

    // A worker that ended before the drain did hit an error (a storage
    // error ends an apalis worker).
    let mut errors = Vec::new();
    for worker in running {
        if worker.is_finished() {
            match worker.await {
                Ok(Ok(())) => errors.push("ended early without an error".to_string()),
                Ok(Err(e)) => errors.push(e.to_string()),
                Err(e) => errors.push(e.to_string()),
            }
        } else {
            worker.abort();
            let _ = worker.await;
        }
    }
    watch.close().await;
    pool.close().await;
    Drain {
        jobs,
        seconds,
        journal_mode,
        synchronous: match synchronous {
            0 => "OFF".to_string(),
            1 => "NORMAL".to_string(),
            2 => "FULL".to_string(),
            other => other.to_string(),
        },
        errors,
    }
}
