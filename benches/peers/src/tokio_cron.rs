//! tokio-cron-scheduler: `jobs` jobs on an every-second cron in one
//! scheduler, nothing durable.

use tokio_cron_scheduler::{Job, JobScheduler};

use crate::fires::{Fires, LagSummary, until, whole_second_ahead};

pub async fn fires(jobs: usize, seconds: u64) -> LagSummary {
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
    scheduler.start().await.expect("scheduler started");
    let first = whole_second_ahead(1);
    until(first + seconds).await;
    // The last second's fires land within it; half a second more lets the
    // stragglers be seen (and counted late, not lost).
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    scheduler.shutdown().await.expect("scheduler stopped");
    fires.summary(jobs, first, seconds)
}
