//! instances: who is alive, for crash recovery and takeover (DESIGN §3, §4).

use super::decode::{AnyRow, RowReader};
use super::executions::{open_execution, open_statuses};
use super::{Store, StoreError};
use crate::model::Millis;

/// One row of `instances`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceRow {
    /// INSTANCE_ID (the hostname by default), not a UUID.
    pub id: String,
    pub hostname: String,
    pub pid: i64,
    pub started_at: Millis,
    pub heartbeat_at: Millis,
    /// `k/N` when the instance runs a partition.
    pub partition: Option<String>,
}

/// A restart under the same INSTANCE_ID overwrites its predecessor's row:
/// the caller has already decided (DESIGN §3) that the predecessor is dead.
const UPSERT_INSTANCE: &str = "\
INSERT INTO instances (id, hostname, pid, started_at, heartbeat_at, partition, created_at, updated_at) \
VALUES ($1, $2, $3, $4, $4, $5, $4, $4) \
ON CONFLICT (id) DO UPDATE SET hostname = excluded.hostname, pid = excluded.pid, \
started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at, \
partition = excluded.partition, updated_at = excluded.updated_at";

const HEARTBEAT: &str = "UPDATE instances SET heartbeat_at = $2, updated_at = $2 WHERE id = $1";

const SELECT_INSTANCE: &str = "\
SELECT id, hostname, pid, started_at, heartbeat_at, partition FROM instances WHERE id = $1";

/// Silent instances that still hold something to take over. A silent one
/// holding nothing needs no recovery (and may just be stopped).
const STALE_OWNERS: &str = concat!(
    "SELECT i.id FROM instances i WHERE i.heartbeat_at < $1 - $2 \
     AND (EXISTS (SELECT 1 FROM branch_rules b WHERE b.lock_holder = i.id) \
     OR EXISTS (SELECT 1 FROM executions e WHERE e.owner = i.id AND e.",
    open_execution!(),
    " AND e.status IN ",
    open_statuses!(),
    ")) ORDER BY i.id"
);

fn decode_instance(row: &impl AnyRow) -> Result<InstanceRow, StoreError> {
    let r = RowReader::new(row, "instances")?;
    Ok(InstanceRow {
        id: r.text("id")?,
        hostname: r.text("hostname")?,
        pid: r.i64("pid")?,
        started_at: r.i64("started_at")?,
        heartbeat_at: r.i64("heartbeat_at")?,
        partition: r.opt_text("partition")?,
    })
}

impl Store {
    /// Inserts or replaces this instance's row, started and heartbeating at `now`.
    pub async fn register_instance(
        &self,
        id: &str,
        hostname: &str,
        pid: i64,
        now: Millis,
        partition: Option<&str>,
    ) -> Result<(), StoreError> {
        execute!(
            self,
            "register instance",
            UPSERT_INSTANCE,
            id,
            hostname,
            pid,
            now,
            partition
        )
        .map(drop)
    }

    /// `false` when the row is gone (deleted by an operator): register again.
    pub async fn heartbeat(&self, id: &str, now: Millis) -> Result<bool, StoreError> {
        execute!(self, "heartbeat instance", HEARTBEAT, id, now).map(|n| n == 1)
    }

    pub async fn instance(&self, id: &str) -> Result<Option<InstanceRow>, StoreError> {
        let op = "select instance";
        let row = match self {
            Store::Sqlite(pool) => sqlx::query(SELECT_INSTANCE)
                .bind(id)
                .fetch_optional(pool)
                .await
                .map_err(StoreError::query(op))?
                .map(|row| decode_instance(&row)),
            Store::Postgres(pool) => sqlx::query(SELECT_INSTANCE)
                .bind(id)
                .fetch_optional(pool)
                .await
                .map_err(StoreError::query(op))?
                .map(|row| decode_instance(&row)),
        };
        row.transpose()
    }

    /// Ids of instances whose last heartbeat is older than `timeout_ms` and
    /// that still hold a branch rule lock or a non-terminal execution: the
    /// owners to pass to [`Store::recover_owner`].
    pub async fn stale_owners(
        &self,
        now: Millis,
        timeout_ms: Millis,
    ) -> Result<Vec<String>, StoreError> {
        let op = "select stale owners";
        match self {
            Store::Sqlite(pool) => {
                sqlx::query_scalar(STALE_OWNERS)
                    .bind(now)
                    .bind(timeout_ms)
                    .fetch_all(pool)
                    .await
            }
            Store::Postgres(pool) => {
                sqlx::query_scalar(STALE_OWNERS)
                    .bind(now)
                    .bind(timeout_ms)
                    .fetch_all(pool)
                    .await
            }
        }
        .map_err(StoreError::query(op))
    }
}
