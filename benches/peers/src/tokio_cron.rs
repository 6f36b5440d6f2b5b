//! tokio-cron-scheduler: `jobs` jobs on an every-second cron in one
//! scheduler, nothing durable.
//!
//! Its scheduler looks for due jobs every 500 ms, counted from `start()`
//! (a sleep in a loop, not configurable in 0.15): how late a fire starts
//! is mostly where that half-second tick falls against the second. A
//! start at a random moment gives lags spread over 0–500 ms; starting it
//! `phase` after a whole second puts its tick just past each second, the
//! best this peer can do, and what the table compares ruled with.

use std::time::Duration;

use tokio_cron_scheduler::{Job, JobScheduler};

use crate::fires::{Fires, LagSummary, now_second, until, whole_second_ahead};

pub async fn fires(jobs: usize, seconds: u64, phase: Duration) -> LagSummary {
    let mut scheduler = JobScheduler::new().await.expect("a tokio-cron-scheduler");
    let fires = Fires::default();
    for job in 0..jobs {
        let fires = fires.clone();
        let every_second = Job::new_async("* * * * * *", move |_id, _scheduler| {
            let fires = fires.clone();
            Box::pin(async move { fires.record(job) })
        })
        .expect("an every-second job");
        scheduler.add(every_second).await.expect("job added");
    }
    until(now_second() + 1, phase).await;
    scheduler.start().await.expect("scheduler started");
    let first = whole_second_ahead(1);
    until(first + seconds, Duration::ZERO).await;
    // The last second's fires start within its first half; more than a
    // second lets every straggler be seen (and counted late, not lost).
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    scheduler.shutdown().await.expect("scheduler stopped");
    fires.summary(jobs, first, seconds)
}
