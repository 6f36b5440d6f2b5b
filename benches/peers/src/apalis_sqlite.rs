//! apalis with its SQLite storage: a drain of noop jobs pushed before the
//! worker starts, every connection in WAL with synchronous=NORMAL, as
//! ruled's are.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use apalis::prelude::*;
use apalis_sqlite::{Config, SqliteConnectOptions, SqlitePoolOptions, SqliteStorage};
use sqlx::sqlite::{SqliteJournalMode, SqliteSynchronous};
use tokio::sync::Notify;

/// How apalis is set up for the drain; the defaults are the fastest found
/// on this machine (see `BENCHMARKS.md` and the crate's doc comment).
#[derive(Debug, Clone, Copy)]
pub struct Tuning {
    /// Jobs in flight at once, over all workers: ruled's worker count.
    pub concurrency: usize,
    /// apalis workers sharing that concurrency.
    pub workers: usize,
    /// Tasks fetched per query; the storage's event channel is four times
    /// this, so it also bounds how many lock/ack events wait for a write.
    pub batch_size: usize,
    /// How often an idle worker is woken to fetch again; 0 leaves the
    /// storage to its own wake-ups (no poll strategy).
    pub poll_ms: u64,
    /// The pool's connections; 0 keeps sqlx's default.
    pub max_connections: u32,
}

impl Tuning {
    pub fn describe(&self) -> String {
        let poll = match self.poll_ms {
            0 => "no poll strategy".to_string(),
            ms => format!("poll_with_interval {ms} ms"),
        };
        let pool = match self.max_connections {
            0 => "sqlx's default pool".to_string(),
            n => format!("pool of {n}"),
        };
        format!(
            "{} worker(s) sharing concurrency {}, batch_size {}, {poll}, {pool}, lock_tasks and persist_results on (the defaults: \
             Queued, Running and Done are all written)",
            self.workers, self.concurrency, self.batch_size
        )
    }
}

pub struct Drain {
    pub analyzed: bool,
    pub jobs: usize,
    pub seconds: f64,
    pub journal_mode: String,
    pub synchronous: String,
}

impl Drain {
    pub fn jobs_per_second(&self) -> f64 {
        self.jobs as f64 / self.seconds
    }
}

/// The handler's count: the drain is over when the storage says every job
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

/// `analyze`: run SQLite's `ANALYZE` once the jobs are in, before the
/// clock starts. apalis's `setup` runs `PRAGMA optimize` on empty tables,
/// so without statistics SQLite plans the lock and ack updates as scans
/// (of every pending job, of every job this worker ever locked): each
/// batch of events then costs time in proportion to the table, and the
/// drain slows as it goes. With statistics both go through the id index.
pub async fn drain(jobs: usize, tuning: Tuning, analyze: bool) -> Drain {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let options = SqliteConnectOptions::new()
        .filename(dir.path().join("apalis.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal);
    let config = Config::default()
        .queue("drain")
        .batch_size(tuning.batch_size);
    // Migrations, the push and ANALYZE go through a pool of their own,
    // closed before the drain: SQLite loads statistics when a connection
    // opens, so only connections opened after ANALYZE plan with them.
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
    if analyze {
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
        .connect_with(options)
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
    let storage = SqliteStorage::<u32>::new(&pool).with_config(config);
    if std::env::var("PEERS_DEBUG_PLAN").is_ok() {
        let v: String = sqlx::query_scalar("select sqlite_version()").fetch_one(&pool).await.unwrap();
        eprintln!("sqlite {v}");
        for q in [include_str!("/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/apalis-sqlite-1.0.0/queries/task/ack.sql"), include_str!("/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/apalis-sqlite-1.0.0/queries/task/lock.sql")] {
            let rows: Vec<(i64, i64, i64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {q}"))).bind("[]").bind("w").fetch_all(&pool).await.unwrap();
            for r in rows { eprintln!("{r:?}"); }
        }
    }

    let progress = Progress {
        handled: Arc::new(AtomicUsize::new(0)),
        total: jobs,
        all_handled: Arc::new(Notify::new()),
    };
    let all_handled = Arc::clone(&progress.all_handled);
    // The total concurrency is split over `tuning.workers` apalis workers,
    // each with its own name, fetch loop and event writer.
    let shares: Vec<usize> = (0..tuning.workers)
        .map(|i| tuning.concurrency / tuning.workers + usize::from(i < tuning.concurrency % tuning.workers))
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
                let worker = WorkerBuilder::new(name)
                    .backend(
                        storage
                            .clone()
                            .poll_with_interval(Duration::from_millis(tuning.poll_ms)),
                    )
                    .concurrency(share)
                    .data(progress.clone())
                    .build(noop);
                tokio::spawn(worker.run())
            }
        })
        .collect();
    all_handled.notified().await;
    // A job is done for apalis when its ack is written, which follows the
    // handler's return.
    loop {
        let done: i64 = sqlx::query_scalar("SELECT count(*) FROM Jobs WHERE status = 'Done'")
            .fetch_one(&pool)
            .await
            .expect("done count");
        if done as usize >= jobs {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    for worker in running {
        worker.abort();
        let _ = worker.await;
    }
    pool.close().await;
    Drain {
        analyzed: analyze,
        jobs,
        seconds,
        journal_mode,
        synchronous: match synchronous {
            0 => "OFF".to_string(),
            1 => "NORMAL".to_string(),
            2 => "FULL".to_string(),
            other => other.to_string(),
        },
    }
}
