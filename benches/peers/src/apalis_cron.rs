//! apalis-cron: `jobs` apalis workers, each on its own every-second
//! `CronScheduler`, nothing durable; registered in one `Monitor` (apalis's
//! way to run many workers and stop them together), or each spawned on its
//! own task.

use std::str::FromStr;
use std::time::Duration;

use apalis::prelude::*;
use apalis_cron::{CronScheduler, Tick};
use tokio::sync::watch;

use crate::fires::{Fires, LagSummary, until, whole_second_ahead};

/// What each worker's ticks report to.
#[derive(Clone)]
struct CronJob {
    index: usize,
    fires: Fires,
}

async fn on_tick(tick: Tick, job: Data<CronJob>) {
    // The tick says which second it was for: its lag is measured from
    // there, not guessed from the clock.
    job.fires.record_due(job.index, tick.get_timestamp());
}

/// `monitored`: all workers in one `Monitor`, whose workers are polled
/// together by the monitor's one future; otherwise each worker is a tokio
/// task of its own, which the runtime spreads over the cores.
pub async fn fires(jobs: usize, seconds: u64, monitored: bool) -> LagSummary {
    let schedule = cron::Schedule::from_str("* * * * * *").expect("an every-second schedule");
    let fires = Fires::default();
    let worker = {
        let fires = fires.clone();
        move |index: usize| {
            WorkerBuilder::new(format!("peer-cron-{index}"))
                .backend(CronScheduler::new(schedule.clone()))
                .data(CronJob {
                    index,
                    fires: fires.clone(),
                })
                .build(on_tick)
        }
    };
    let (stop, stopped) = watch::channel(false);
    let running: Vec<tokio::task::JoinHandle<Result<(), String>>> = if monitored {
        let monitor = Monitor::new()
            .shutdown_timeout(Duration::from_secs(5))
            .register_n(jobs, move |index, _restarts| worker(index));
        let mut stopped = stopped.clone();
        vec![tokio::spawn(async move {
            monitor
                .run_with_signal(async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                    Ok(())
                })
                .await
                .map_err(|e| e.to_string())
        })]
    } else {
        (0..jobs)
            .map(|index| {
                let mut stopped = stopped.clone();
                let worker = worker(index);
                tokio::spawn(async move {
                    worker
                        .run_until(async move {
                            let _ = stopped.wait_for(|stop| *stop).await;
                            Ok::<(), WorkerError>(())
                        })
                        .await
                        .map_err(|e| e.to_string())
                })
            })
            .collect()
    };
    let first = whole_second_ahead(1);
    until(first + seconds, Duration::ZERO).await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    stop.send_replace(true);
    for worker in running {
        match tokio::time::timeout(Duration::from_secs(10), worker).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => eprintln!("  apalis-cron stopped with an error: {e}"),
            Ok(Err(e)) => eprintln!("  apalis-cron task failed: {e}"),
            Err(_) => eprintln!("  apalis-cron did not stop within 10 s"),
        }
    }
    fires.summary(jobs, first, seconds)
}
