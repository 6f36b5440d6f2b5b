//! apalis-cron: `jobs` apalis workers, each on its own every-second
//! `CronScheduler`, nothing durable.

use std::str::FromStr;

use apalis::prelude::*;
use apalis_cron::{CronScheduler, Tick};

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

pub async fn fires(jobs: usize, seconds: u64) -> LagSummary {
    let schedule = cron::Schedule::from_str("* * * * * *").expect("an every-second schedule");
    let fires = Fires::default();
    let mut workers = Vec::with_capacity(jobs);
    for index in 0..jobs {
        let worker = WorkerBuilder::new(format!("peer-cron-{index}"))
            .backend(CronScheduler::new(schedule.clone()))
            .data(CronJob {
                index,
                fires: fires.clone(),
            })
            .build(on_tick);
        workers.push(tokio::spawn(worker.run()));
    }
    let first = whole_second_ahead(1);
    until(first + seconds).await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    for worker in workers {
        worker.abort();
    }
    fires.summary(jobs, first, seconds)
}
