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

pub struct Drain {
    pub jobs: usize,
    pub seconds: f64,
    pub journal_mode: String,
    pub synchronous: String,
    pub settings: String,
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
        progress.all_handled.notify_one();
    }
    Ok(())
}

/// `poll_ms` is how often an idle worker asks the storage for jobs: the
/// storage is polled, so it bounds how fast a drain can go.
pub async fn drain(jobs: usize, workers: usize, poll_ms: u64) -> Drain {
    let poll_interval = Duration::from_millis(poll_ms);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let options = SqliteConnectOptions::new()
        .filename(dir.path().join("apalis.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal);
    // `setup` turns synchronous OFF on the connection it runs on: that pool
    // is closed, so every connection the drain uses is NORMAL.
    let setup = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options.clone())
        .await
        .expect("the setup pool");
    SqliteStorage::setup(&setup)
        .await
        .expect("apalis migrations");
    setup.close().await;
    let pool = SqlitePoolOptions::new()
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

    let config = Config::default().queue("drain").batch_size(workers);
    let mut storage = SqliteStorage::<u32>::new(&pool).with_config(config);
    storage
        .push_bulk((0..jobs as u32).collect())
        .await
        .expect("jobs pushed");

    let progress = Progress {
        handled: Arc::new(AtomicUsize::new(0)),
        total: jobs,
        all_handled: Arc::new(Notify::new()),
    };
    let all_handled = Arc::clone(&progress.all_handled);
    let worker = WorkerBuilder::new("peer-drain")
        .backend(storage.poll_with_interval(poll_interval))
        .concurrency(workers)
        .data(progress)
        .build(noop);
    let started = Instant::now();
    let running = tokio::spawn(worker.run());
    all_handled.notified().await;
    loop {
        let done: i64 = sqlx::query_scalar("SELECT count(*) FROM Jobs WHERE status = 'Done'")
            .fetch_one(&pool)
            .await
            .expect("done count");
        if done as usize >= jobs {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    running.abort();
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
        settings: format!("concurrency {workers}, batch_size {workers}, polled every {poll_ms} ms"),
    }
}
