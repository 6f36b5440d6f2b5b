//! Crash recovery, takeover and the instance-id check: the database side
//! of "a crash loses nothing" (DESIGN §3, §4), in one place. The verdicts
//! are pure functions in [`crate::cluster`]; this module runs them against
//! the database and acts.
//!
//! - [`claim_instance_id`]: at start, may this process take INSTANCE_ID?
//! - [`recover_at_start`]: the outbox first, then what this instance (and on
//!   SQLite, any instance) left open becomes Failed `worker_lost`.
//! - [`recover_own`]: the same for a restarted master's predecessor.
//! - [`take_over_silent`]: a live instance fails the open executions of a
//!   silent one and releases its claims, so its occurrences run again.

use std::time::Duration;

use tracing::{error, info, warn};

use crate::actors::lease::partition_text;
use crate::clock::millis_to_utc;
use crate::cluster::{self, InstanceIdVerdict, InstanceSeen};
use crate::config::{Config, hostname};
use crate::metrics as m;
use crate::model::{Execution, Millis};
use crate::persist::read_plan_file;
use crate::store::{Backend, Released, Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(
        "INSTANCE_ID {instance_id:?} is in use by a live process (host {hostname}, pid {pid}, \
         heartbeat {seconds_ago} s ago); give this process its own INSTANCE_ID"
    )]
    InstanceInUse {
        instance_id: String,
        hostname: String,
        pid: i64,
        seconds_ago: i64,
    },
}

/// Refuses to start when a live process holds INSTANCE_ID; otherwise takes
/// the id over (a crashed predecessor on this host is recovered at once).
/// The verdict is [`cluster::instance_id_verdict`], on the database's clock.
pub async fn claim_instance_id(
    store: &Store,
    config: &Config,
    now: Millis,
) -> Result<(), RecoveryError> {
    let me = &config.instance_id;
    let hostname = hostname();
    let pid = i64::from(std::process::id());
    let seen = store.instance(me).await?.map(|row| InstanceSeen {
        hostname: row.hostname,
        pid: row.pid,
        heartbeat_at: row.heartbeat_at,
    });
    let db_now = store.db_now().await?;
    match cluster::instance_id_verdict(
        seen.as_ref(),
        &hostname,
        pid,
        db_now,
        config.partition_lease_ttl,
        process_alive,
    ) {
        InstanceIdVerdict::Free => {}
        InstanceIdVerdict::CrashedPredecessor { pid: old } => {
            warn!(instance_id = %me, "Previous process {old} on this host is gone; recovering its work");
        }
        InstanceIdVerdict::InUse {
            hostname,
            pid,
            seconds_ago,
        } => {
            return Err(RecoveryError::InstanceInUse {
                instance_id: me.clone(),
                hostname,
                pid,
                seconds_ago,
            });
        }
    }
    let partition = config.partition.map(partition_text);
    store
        .register_instance(me, &hostname, pid, now, partition.as_deref())
        .await?;
    Ok(())
}

/// Crash recovery in the database, in the order that loses nothing: first
/// the plan file's outbox (finished jobs whose result never landed), then
/// every execution this instance left non-terminal becomes Failed
/// `worker_lost` and its lock is released, so the occurrence runs again as
/// a new attempt. On SQLite there is only ever one instance, so every
/// non-terminal execution found is ours.
pub async fn recover_at_start(
    store: &Store,
    config: &Config,
    now: Millis,
) -> Result<(), RecoveryError> {
    if let Ok(Some(snapshot)) = read_plan_file(&config.plan_file) {
        for entry in &snapshot.outbox {
            let delivered = match store.finish_released(&entry.fence, &entry.finish).await {
                Ok(delivered) => delivered,
                // Refused for good (its values), it would be refused at every
                // start: a service that never starts again runs nothing at
                // all. The run is recorded lost below and runs again.
                Err(e) if e.is_refused_data() => {
                    metrics::counter!(m::DB_ERRORS_TOTAL, "op" => "outbox").increment(1);
                    error!(
                        execution_id = %entry.fence.execution_id,
                        "📮 The database refused an outbox entry; its run is recorded lost (worker_lost) and runs again: {e}"
                    );
                    continue;
                }
                // Anything else (the database away, a timeout) may pass at
                // the next start; starting now would run again what the
                // outbox says already ran.
                Err(e) => return Err(e.into()),
            };
            match delivered {
                Some(Released::Row(_)) => {
                    info!(execution_id = %entry.fence.execution_id, "📬 Delivered a result kept in the outbox")
                }
                // The plan reads the row afresh and quarantines it.
                Some(Released::Unreadable(problem)) => {
                    warn!(execution_id = %entry.fence.execution_id, "📬 Delivered a result kept in the outbox; its branch rule no longer reads: {problem}")
                }
                None => {
                    warn!(execution_id = %entry.fence.execution_id, "📮 Outbox entry fenced out")
                }
            }
        }
    }
    let mut owners = vec![config.instance_id.clone()];
    if store.backend() == Backend::Sqlite {
        owners.extend(store.stale_owners(-1).await?);
    }
    owners.dedup();
    for owner in owners {
        let failed = store.recover_owner(&owner, now).await?;
        if !failed.is_empty() {
            warn!(
                instance_id = %owner,
                "💥 {} execution(s) left unfinished by a crash marked failed (worker_lost); they run again",
                failed.len()
            );
            for execution in failed {
                info!(
                    execution_id = %execution.id,
                    branch_rule_id = %execution.branch_rule_id,
                    "worker_lost: attempt {} of the occurrence at {}",
                    execution.attempt,
                    millis_to_utc(execution.scheduled_for).to_rfc3339()
                );
            }
        }
    }
    Ok(())
}

/// Recovers what a restarted master's predecessor held under this
/// instance's id: its open executions become Failed `worker_lost` and its
/// claims are released; their occurrences run again as new attempts.
pub async fn recover_own(
    store: &Store,
    instance_id: &str,
    now: Millis,
) -> Result<Vec<Execution>, StoreError> {
    let lost = store.recover_owner(instance_id, now).await?;
    for execution in &lost {
        warn!(
            branch_rule_id = %execution.branch_rule_id,
            execution_id = %execution.id,
            "💥 Job lost with the previous master (worker_lost); it runs again"
        );
    }
    Ok(lost)
}

/// Takes over every instance silent for longer than `silence` (on the
/// database's clock) that still holds claims or open executions, except
/// `me`. Returns the owners taken over, with what was failed; an owner
/// whose takeover failed is left for the next round.
pub async fn take_over_silent(
    store: &Store,
    me: &str,
    silence: Duration,
    now: Millis,
) -> Result<Vec<(String, Vec<Execution>)>, StoreError> {
    let silence_ms = silence.as_millis() as Millis;
    let stale = store.stale_owners(silence_ms).await?;
    let mut taken = Vec::new();
    for owner in stale.into_iter().filter(|owner| owner != me) {
        // Checked again inside the takeover's transaction: listed stale,
        // the owner may have come back (a long pause, a slow network)
        // before its locks were released.
        match store.recover_silent_owner(&owner, silence_ms, now).await {
            Ok(None) => info!(
                instance_id = %owner,
                "💓 Instance {owner} heartbeated again before its takeover; it keeps its work"
            ),
            Ok(Some(failed)) => {
                warn!(
                    instance_id = %owner,
                    "🧹 Took over from silent instance {owner}: {} execution(s) failed worker_lost; their occurrences run again",
                    failed.len()
                );
                taken.push((owner, failed));
            }
            Err(e) => warn!("Takeover of {owner} failed: {e}"),
        }
    }
    Ok(taken)
}

fn process_alive(pid: i64) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}
