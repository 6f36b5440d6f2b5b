//! instances: who is alive, for crash recovery and takeover (DESIGN §3, §4).
//!
//! Heartbeats are stamped, and silence judged, on the database's clock
//! (see `leases`), so a skewed host neither looks dead nor keeps a dead
//! peer alive.

use super::decode::{AnyRow, RowReader};
use super::executions::{open_execution, open_statuses};
use super::leases::on_each_clock;
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
macro_rules! upsert_instance_sql {
    ($now:literal) => {
        concat!(
            "INSERT INTO instances (id, hostname, pid, started_at, heartbeat_at, partition, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, ",
            $now,
            ", $5, $4, $4) \
             ON CONFLICT (id) DO UPDATE SET hostname = excluded.hostname, pid = excluded.pid, \
             started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at, \
             partition = excluded.partition, leaving_at = NULL, updated_at = excluded.updated_at"
        )
    };
}
const UPSERT_INSTANCE: super::leases::DbSql = on_each_clock!(upsert_instance_sql);

macro_rules! heartbeat_sql {
    ($now:literal) => {
        concat!(
            "UPDATE instances SET heartbeat_at = ",
            $now,
            ", updated_at = $2 WHERE id = $1 RETURNING heartbeat_at"
        )
    };
}
const HEARTBEAT: super::leases::DbSql = on_each_clock!(heartbeat_sql);

macro_rules! live_instances_sql {
    ($now:literal) => {
        concat!(
            "SELECT id, hostname, pid, started_at, heartbeat_at, partition FROM instances \
             WHERE leaving_at IS NULL AND heartbeat_at > ",
            $now,
            " - $1 ORDER BY id"
        )
    };
}
const LIVE_INSTANCES: super::leases::DbSql = on_each_clock!(live_instances_sql);

/// A graceful stop under way: no share of the partitions is dealt to it.
const MARK_LEAVING: &str = "UPDATE instances SET leaving_at = $2, updated_at = $2 WHERE id = $1";

/// Back from a throttle: dealt a share again. Only a mark left by a
/// throttle is cleared: a graceful stop never comes back.
const MARK_BACK: &str = "UPDATE instances SET leaving_at = NULL, updated_at = $2 WHERE id = $1 AND leaving_at IS NOT NULL";

const ALL_INSTANCES: &str = "\
SELECT id, hostname, pid, started_at, heartbeat_at, partition FROM instances ORDER BY id";

const SELECT_INSTANCE: &str = "\
SELECT id, hostname, pid, started_at, heartbeat_at, partition FROM instances WHERE id = $1";

/// Silent instances that still hold something to take over. A silent one
/// holding nothing needs no recovery (and may just be stopped). `$1` is the
/// silence in ms; a negative one counts every instance as silent.
macro_rules! stale_owners_sql {
    ($now:literal) => {
        concat!(
            "SELECT i.id FROM instances i WHERE i.heartbeat_at < ",
            $now,
            " - $1 \
             AND (EXISTS (SELECT 1 FROM branch_rules b WHERE b.lock_holder = i.id) \
             OR EXISTS (SELECT 1 FROM executions e WHERE e.owner = i.id AND e.",
            open_execution!(),
            " AND e.status IN ",
            open_statuses!(),
            ")) ORDER BY i.id"
        )
    };
}
pub(super) const STALE_OWNERS: super::leases::DbSql = on_each_clock!(stale_owners_sql);

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
    /// Inserts or replaces this instance's row, started at `now` and
    /// heartbeating at the database's now.
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
            UPSERT_INSTANCE.for_store(self),
            id,
            hostname,
            pid,
            now,
            partition
        )
        .map(drop)
    }

    /// Marks this instance as leaving (a graceful stop has begun): the
    /// live instances dealt partitions leave it out, while its heartbeat
    /// goes on until its jobs have finished.
    pub async fn mark_instance_leaving(&self, id: &str, now: Millis) -> Result<(), StoreError> {
        execute!(self, "mark instance leaving", MARK_LEAVING, id, now).map(drop)
    }

    /// Clears the leaving mark of a throttle that lifted; `true` when there
    /// was one.
    pub async fn mark_instance_back(&self, id: &str, now: Millis) -> Result<bool, StoreError> {
        execute!(self, "mark instance back", MARK_BACK, id, now).map(|rows| rows > 0)
    }

    /// Stamps this instance's heartbeat with the database's now and returns
    /// it; `None` when the row is gone (deleted by an operator): register
    /// again. `now` (the instance's clock) only goes to `updated_at`.
    pub async fn heartbeat(&self, id: &str, now: Millis) -> Result<Option<Millis>, StoreError> {
        let sql = HEARTBEAT.for_store(self);
        let op = "heartbeat instance";
        match self {
            Store::Sqlite(pool) => {
                sqlx::query_scalar(sql)
                    .bind(id)
                    .bind(now)
                    .fetch_optional(pool)
                    .await
            }
            Store::Postgres(pool) => {
                sqlx::query_scalar(sql)
                    .bind(id)
                    .bind(now)
                    .fetch_optional(pool)
                    .await
            }
        }
        .map_err(StoreError::query(op))
    }

    /// Instances whose heartbeat is younger than `silence_ms` on the
    /// database's clock, by id.
    pub async fn live_instances(&self, silence_ms: Millis) -> Result<Vec<InstanceRow>, StoreError> {
        let sql = LIVE_INSTANCES.for_store(self);
        fetch_all!(
            self,
            "select live instances",
            decode_instance,
            sql,
            silence_ms
        )
    }

    /// Every row of `instances`, by id.
    pub async fn instances(&self) -> Result<Vec<InstanceRow>, StoreError> {
        fetch_all!(self, "select instances", decode_instance, ALL_INSTANCES)
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

    /// Ids of instances whose last heartbeat is older than `silence_ms` on
    /// the database's clock and that still hold a branch rule lock or a
    /// non-terminal execution: the owners to pass to
    /// [`Store::recover_owner`]. A negative silence lists every such owner.
    pub async fn stale_owners(&self, silence_ms: Millis) -> Result<Vec<String>, StoreError> {
        let op = "select stale owners";
        let sql = STALE_OWNERS.for_store(self);
        match self {
            Store::Sqlite(pool) => {
                sqlx::query_scalar(sql)
                    .bind(silence_ms)
                    .fetch_all(pool)
                    .await
            }
            Store::Postgres(pool) => {
                sqlx::query_scalar(sql)
                    .bind(silence_ms)
                    .fetch_all(pool)
                    .await
            }
        }
        .map_err(StoreError::query(op))
    }
}
