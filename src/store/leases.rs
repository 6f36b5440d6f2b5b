//! partition_leases (DESIGN §4, seed 003's distributed lock), and the
//! statements that judge time on the database's clock.
//!
//! Every expiry between instances (a partition lease, a silent instance) is
//! judged by the database's own `now`, never by an instance's: a host whose
//! clock runs 90 s ahead can neither steal a lease early nor keep one late.
//! The two backends spell that `now` differently, so each statement is
//! written once as a macro over the clock expression and instantiated per
//! backend by [`on_each_clock!`].

use super::decode::{AnyRow, RowReader, id_text};
use super::{Store, StoreError};
use crate::cluster::{LeaseRow, PartitionOwners};
use crate::model::Millis;
use uuid::Uuid;

/// One statement, with each backend's spelling of "now in epoch ms".
pub(super) struct DbSql {
    pub(super) sqlite: &'static str,
    pub(super) postgres: &'static str,
}

impl DbSql {
    pub(super) fn for_store(&self, store: &Store) -> &'static str {
        match store {
            Store::Sqlite(_) => self.sqlite,
            Store::Postgres(_) => self.postgres,
        }
    }
}

/// Instantiates a statement macro (`$statement!(now_literal)`) for both
/// backends' clocks.
macro_rules! on_each_clock {
    ($statement:ident) => {
        $crate::store::leases::DbSql {
            sqlite: $statement!("CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"),
            postgres: $statement!("(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT"),
        }
    };
}
pub(super) use on_each_clock;

macro_rules! db_now_sql {
    ($now:literal) => {
        concat!("SELECT ", $now)
    };
}
const DB_NOW: DbSql = on_each_clock!(db_now_sql);

macro_rules! select_leases_sql {
    ($now:literal) => {
        concat!(
            "SELECT partition, holder, epoch, expires_at, ",
            $now,
            " AS db_now FROM partition_leases ORDER BY partition"
        )
    };
}
const SELECT_LEASES: DbSql = on_each_clock!(select_leases_sql);

/// Renews every lease `$1` still holds; an expired one is not renewed here
/// (someone may hold it by now) but may be taken again as a new tenure.
macro_rules! renew_leases_sql {
    ($now:literal) => {
        concat!(
            "UPDATE partition_leases SET expires_at = ",
            $now,
            " + $2 WHERE holder = $1 AND expires_at > ",
            $now,
            " RETURNING partition"
        )
    };
}
const RENEW_LEASES: DbSql = on_each_clock!(renew_leases_sql);

/// Takes a partition that has no row yet, was released, or whose lease
/// ran out; a new tenure gets the next epoch.
macro_rules! acquire_lease_sql {
    ($now:literal) => {
        concat!(
            "INSERT INTO partition_leases (partition, holder, epoch, expires_at) VALUES ($1, $2, 1, ",
            $now,
            " + $3) ON CONFLICT (partition) DO UPDATE SET holder = excluded.holder, \
             epoch = partition_leases.epoch + 1, expires_at = excluded.expires_at \
             WHERE partition_leases.holder IS NULL OR partition_leases.expires_at <= ",
            $now,
            " RETURNING partition, holder, epoch, expires_at"
        )
    };
}
const ACQUIRE_LEASE: DbSql = on_each_clock!(acquire_lease_sql);

/// A released lease keeps its epoch; expires_at 0 makes it free at once.
const RELEASE_LEASE: &str = "UPDATE partition_leases SET holder = NULL, expires_at = 0 WHERE partition = $1 AND holder = $2";

/// Everything `$1` holds, at once: a graceful stop hands its partitions on
/// without making the others wait for the TTL.
const RELEASE_ALL_LEASES: &str =
    "UPDATE partition_leases SET holder = NULL, expires_at = 0 WHERE holder = $1";

/// Cancel through any instance: only an open execution takes a request.
/// Returns the owner, who acts on it.
macro_rules! request_cancel_sql {
    ($now:literal) => {
        concat!(
            "UPDATE executions SET cancel_requested_at = ",
            $now,
            " WHERE id = $1 AND finished_at IS NULL RETURNING owner"
        )
    };
}
const REQUEST_CANCEL: DbSql = on_each_clock!(request_cancel_sql);

/// The open executions of `$1` that someone asked to stop: a cancel
/// request, or a force stop of their branch rule. Every instance runs it
/// each PARTITION_LEASE_RETRY_SECONDS, so it must read only the open
/// executions: ordered by the open-executions index's own order. Ordered by
/// id, SQLite walked the primary key over the whole history instead, and
/// looked every row up (1.4 s a call at 10M finished executions).
pub(super) const CANCEL_REQUESTS: &str = "\
SELECT e.id AS id, e.branch_rule_id AS branch_rule_id, \
CASE WHEN e.cancel_requested_at IS NOT NULL THEN 'cancel' ELSE 'force_stop' END AS reason \
FROM executions e JOIN branch_rules b ON b.id = e.branch_rule_id \
WHERE e.owner = $1 AND e.finished_at IS NULL \
AND (e.cancel_requested_at IS NOT NULL OR b.is_force_stopped) ORDER BY e.requested_at, e.id";

/// What [`Store::partition_leases`] reads: every lease row and the
/// database's clock at the read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    pub db_now: Millis,
    pub leases: Vec<LeaseRow>,
}

/// An open execution of this instance that someone asked to stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelRequest {
    pub execution_id: Uuid,
    pub branch_rule_id: Uuid,
    /// `cancel` or `force_stop`.
    pub reason: String,
}

fn decode_lease(row: &impl AnyRow) -> Result<LeaseRow, StoreError> {
    let partition = row.int64("partition").ok().flatten().unwrap_or(-1);
    let r = RowReader::keyed(row, "partition_leases", partition.to_string());
    Ok(LeaseRow {
        partition: u32::try_from(r.i64("partition")?).unwrap_or(u32::MAX),
        holder: r.opt_text("holder")?,
        epoch: r.i64("epoch")?,
        expires_at: r.i64("expires_at")?,
    })
}

fn decode_db_now(row: &impl AnyRow) -> Result<Millis, StoreError> {
    RowReader::keyed(row, "partition_leases", "db_now".to_string()).i64("db_now")
}

fn decode_partition(row: &impl AnyRow) -> Result<u32, StoreError> {
    let r = RowReader::keyed(row, "partition_leases", "?".to_string());
    Ok(u32::try_from(r.i64("partition")?).unwrap_or(u32::MAX))
}

fn decode_cancel_request(row: &impl AnyRow) -> Result<CancelRequest, StoreError> {
    let r = RowReader::new(row, "executions")?;
    Ok(CancelRequest {
        execution_id: r.uuid("id")?,
        branch_rule_id: r.uuid("branch_rule_id")?,
        reason: r.text("reason")?,
    })
}

impl Store {
    /// The database's clock, epoch ms.
    pub async fn db_now(&self) -> Result<Millis, StoreError> {
        let sql = DB_NOW.for_store(self);
        let op = "select db now";
        match self {
            Store::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
            Store::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
        }
        .map_err(StoreError::query(op))
    }

    /// Every lease row, in partition order, with the database's clock.
    pub async fn partition_leases(&self) -> Result<LeaseView, StoreError> {
        let sql = SELECT_LEASES.for_store(self);
        let rows = fetch_all!(
            self,
            "select partition leases",
            |row| Ok((decode_lease(row)?, decode_db_now(row)?)),
            sql
        )?;
        let db_now = match rows.first() {
            Some((_, now)) => *now,
            None => self.db_now().await?,
        };
        let leases = rows.into_iter().map(|(lease, _)| lease).collect();
        Ok(LeaseView { db_now, leases })
    }

    /// Who holds each of `count` partitions now; on SQLite, `instance_id`
    /// (the only instance) holds them all.
    pub async fn partition_owners(
        &self,
        count: u32,
        instance_id: &str,
    ) -> Result<PartitionOwners, StoreError> {
        if let Store::Sqlite(_) = self {
            return Ok(PartitionOwners::single(count, instance_id));
        }
        let view = self.partition_leases().await?;
        let mut owners = vec![None; count as usize];
        for lease in &view.leases {
            if let Some(slot) = owners.get_mut(lease.partition as usize) {
                *slot = lease.live_holder(view.db_now).map(str::to_string);
            }
        }
        Ok(PartitionOwners { count, owners })
    }

    /// Extends every lease `holder` still holds by `ttl_ms` from the
    /// database's now; returns the partitions renewed.
    pub async fn renew_partition_leases(
        &self,
        holder: &str,
        ttl_ms: Millis,
    ) -> Result<Vec<u32>, StoreError> {
        let sql = RENEW_LEASES.for_store(self);
        fetch_all!(
            self,
            "renew partition leases",
            decode_partition,
            sql,
            holder,
            ttl_ms
        )
    }

    /// Takes partition `partition` for `holder` if it is free; `None` when
    /// someone else holds it.
    pub async fn acquire_partition_lease(
        &self,
        partition: u32,
        holder: &str,
        ttl_ms: Millis,
    ) -> Result<Option<LeaseRow>, StoreError> {
        let sql = ACQUIRE_LEASE.for_store(self);
        let rows = fetch_all!(
            self,
            "acquire partition lease",
            decode_lease,
            sql,
            i64::from(partition),
            holder,
            ttl_ms
        )?;
        Ok(rows.into_iter().next())
    }

    /// Gives a partition back; `false` when `holder` did not hold it.
    pub async fn release_partition_lease(
        &self,
        partition: u32,
        holder: &str,
    ) -> Result<bool, StoreError> {
        execute!(
            self,
            "release partition lease",
            RELEASE_LEASE,
            i64::from(partition),
            holder
        )
        .map(|n| n == 1)
    }

    /// Gives back every partition `holder` holds; returns how many.
    pub async fn release_all_partition_leases(&self, holder: &str) -> Result<u64, StoreError> {
        execute!(self, "release partition leases", RELEASE_ALL_LEASES, holder)
    }

    /// Records a request to cancel an open execution, for the instance
    /// that owns it. Returns the owner, or `None` when the execution is
    /// unknown or already finished.
    pub async fn request_cancel(&self, execution_id: Uuid) -> Result<Option<String>, StoreError> {
        let sql = REQUEST_CANCEL.for_store(self);
        let op = "request cancel";
        match self {
            Store::Sqlite(pool) => {
                sqlx::query_scalar(sql)
                    .bind(id_text(execution_id))
                    .fetch_optional(pool)
                    .await
            }
            Store::Postgres(pool) => {
                sqlx::query_scalar(sql)
                    .bind(id_text(execution_id))
                    .fetch_optional(pool)
                    .await
            }
        }
        .map_err(StoreError::query(op))
    }

    /// The open executions of `owner` with a cancel request or a force
    /// stop on their branch rule.
    pub async fn cancel_requests(&self, owner: &str) -> Result<Vec<CancelRequest>, StoreError> {
        fetch_all!(
            self,
            "select cancel requests",
            decode_cancel_request,
            CANCEL_REQUESTS,
            owner
        )
    }
}
