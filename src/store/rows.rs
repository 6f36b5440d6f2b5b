//! Generic row access for the HTTP API's CRUD routes: one table description
//! per resource instead of five near-identical sets of statements.
//!
//! Table and column names come only from the static [`TableSpec`]s below,
//! never from a request; every value is bound.

use serde_json::{Map, Value};
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use super::binds::placeholder_list;
use super::decode::AnyRow;
use super::{Store, StoreError};

/// How a column is stored, so a JSON value can be bound and read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnKind {
    /// TEXT; ids, names, `HH:MM`, zones.
    Text,
    /// BOOLEAN on PostgreSQL, 0/1 INTEGER on SQLite.
    Bool,
    /// BIGINT: epoch milliseconds and counters.
    Int64,
    /// INTEGER (action_details.position).
    Int32,
    /// TEXT holding JSON.
    Json,
    /// TEXT holding JSON, or NULL: a JSON `null` is stored as NULL and NULL
    /// reads back as `null` (a column that may be unset, like `policy`).
    /// A stored text that is not JSON reads as a JSON string of that text.
    NullableJson,
}

#[derive(Debug)]
pub struct TableSpec {
    pub table: &'static str,
    /// Every column, `id` first.
    pub columns: &'static [(&'static str, ColumnKind)],
}

use ColumnKind::*;

pub const BRANDS: TableSpec = TableSpec {
    table: "brands",
    columns: &[
        ("id", Text),
        ("name", Text),
        ("settings", Json),
        ("created_at", Int64),
        ("updated_at", Int64),
        ("created_by", Text),
        ("updated_by", Text),
        ("archived_at", Int64),
    ],
};

pub const BRANCHES: TableSpec = TableSpec {
    table: "branches",
    columns: &[
        ("id", Text),
        ("brand_id", Text),
        ("name", Text),
        ("timezone", Text),
        ("is_active", Bool),
        ("created_at", Int64),
        ("updated_at", Int64),
        ("created_by", Text),
        ("updated_by", Text),
        ("archived_at", Int64),
    ],
};

pub const RULES: TableSpec = TableSpec {
    table: "rules",
    columns: &[
        ("id", Text),
        ("brand_id", Text),
        ("name", Text),
        ("status", Text),
        ("cron_expression", Text),
        ("settings", Json),
        ("policy", NullableJson),
        ("created_at", Int64),
        ("updated_at", Int64),
        ("created_by", Text),
        ("updated_by", Text),
        ("archived_at", Int64),
    ],
};

pub const ACTION_TEMPLATES: TableSpec = TableSpec {
    table: "action_templates",
    columns: &[
        ("id", Text),
        ("name", Text),
        ("kind", Text),
        ("config", Json),
        ("created_at", Int64),
        ("updated_at", Int64),
        ("created_by", Text),
        ("updated_by", Text),
    ],
};

pub const BRANCH_RULES: TableSpec = TableSpec {
    table: "branch_rules",
    columns: &[
        ("id", Text),
        ("branch_id", Text),
        ("rule_id", Text),
        ("brand_rule_id", Text),
        ("is_active", Bool),
        ("is_archived", Bool),
        ("is_force_stopped", Bool),
        ("is_currently_running", Bool),
        ("operation_time_from", Text),
        ("operation_time_to", Text),
        ("next_run_time", Int64),
        ("last_run_time", Int64),
        ("lock_holder", Text),
        ("lock_time", Int64),
        ("lock_epoch", Int64),
        ("params", Json),
        ("policy", NullableJson),
        // Engine state, like next_run_time and the lock columns: the API
        // shows them and never writes them.
        ("retry_of", Int64),
        ("failed_attempts", Int32),
        ("created_at", Int64),
        ("updated_at", Int64),
        ("created_by", Text),
        ("updated_by", Text),
    ],
};

pub const ACTION_DETAILS: TableSpec = TableSpec {
    table: "action_details",
    columns: &[
        ("id", Text),
        ("branch_rule_id", Text),
        ("action_template_id", Text),
        ("position", Int32),
        ("params", Json),
        ("created_at", Int64),
        ("updated_at", Int64),
        ("created_by", Text),
        ("updated_by", Text),
    ],
};

impl TableSpec {
    fn kind_of(&self, column: &str) -> Option<ColumnKind> {
        self.columns
            .iter()
            .find(|(name, _)| *name == column)
            .map(|(_, kind)| *kind)
    }

    fn column_list(&self) -> String {
        self.columns
            .iter()
            .map(|(name, _)| *name)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// One bound value.
#[derive(Debug, Clone)]
enum Param {
    Text(Option<String>),
    Bool(Option<bool>),
    Int64(Option<i64>),
    Int32(Option<i32>),
}

fn param(spec: &TableSpec, column: &str, value: &Value) -> Result<Param, StoreError> {
    let kind = spec.kind_of(column).ok_or_else(|| StoreError::Decode {
        table: spec.table,
        id: String::new(),
        column: "?",
        message: format!("no column {column}"),
    })?;
    let mismatch = || StoreError::Decode {
        table: spec.table,
        id: String::new(),
        column: "?",
        message: format!("column {column} cannot hold {value}"),
    };
    Ok(match (kind, value) {
        (Text, Value::Null) => Param::Text(None),
        (Text, Value::String(s)) => Param::Text(Some(s.clone())),
        (Bool, Value::Null) => Param::Bool(None),
        (Bool, Value::Bool(b)) => Param::Bool(Some(*b)),
        (Int64, Value::Null) => Param::Int64(None),
        (Int64, Value::Number(n)) => Param::Int64(Some(n.as_i64().ok_or_else(mismatch)?)),
        (Int32, Value::Null) => Param::Int32(None),
        (Int32, Value::Number(n)) => Param::Int32(Some(
            n.as_i64()
                .and_then(|n| i32::try_from(n).ok())
                .ok_or_else(mismatch)?,
        )),
        (Json, v) => Param::Text(Some(v.to_string())),
        (NullableJson, Value::Null) => Param::Text(None),
        (NullableJson, v) => Param::Text(Some(v.to_string())),
        _ => return Err(mismatch()),
    })
}

fn decode_row(spec: &TableSpec, row: &impl AnyRow) -> Result<Map<String, Value>, StoreError> {
    let mut out = Map::new();
    for (column, kind) in spec.columns {
        let error = |e: sqlx::Error| StoreError::Decode {
            table: spec.table,
            id: String::new(),
            column,
            message: e.to_string(),
        };
        // A value written with SQL that the column's type cannot hold is
        // shown as near as it can be, with `{column}_error` saying what is
        // wrong, so one such row does not turn a whole listing into a 500
        // and can be fixed with a PUT (the plan holds it meanwhile).
        let mut unreadable = |problem: String| {
            out.insert(
                format!("{column}_error"),
                Value::String(format!(
                    "{column}: {problem}; a PUT with a new {column} replaces it"
                )),
            );
        };
        let value = match kind {
            Text => match row.text(column) {
                Ok(text) => text.map(Value::String),
                // SQLite keeps text that is not UTF-8 if SQL wrote it so.
                Err(e) => match row.bytes(column) {
                    Ok(bytes) => {
                        unreadable(format!("the stored text is not UTF-8 ({e})"));
                        bytes.map(|b| Value::String(String::from_utf8_lossy(&b).into_owned()))
                    }
                    Err(_) => return Err(error(e)),
                },
            },
            Bool => row.boolean(column).map_err(error)?.map(Value::Bool),
            Int64 => row.int64(column).map_err(error)?.map(Value::from),
            // SQLite's INTEGER holds 64 bits where ruled takes 32.
            Int32 => match row.int32(column) {
                Ok(n) => n.map(Value::from),
                Err(e) => match row.int64(column) {
                    Ok(n) => {
                        unreadable(format!("the stored number is out of range ({e})"));
                        n.map(Value::from)
                    }
                    Err(_) => return Err(error(e)),
                },
            },
            // Written with SQL, the text may not be JSON at all: the row
            // still reads, the text as a JSON string, so the API (which
            // validates such a column itself) can say what is wrong with
            // it instead of failing the whole listing.
            NullableJson => row
                .text(column)
                .map_err(error)?
                .map(|text| serde_json::from_str(&text).unwrap_or(Value::String(text))),
            // The same, but the text is not shown: a config broken with SQL
            // may hold secrets the masking cannot find in it. The column
            // reads as `{}` and `{column}_error` says what is wrong, so the
            // row can still be listed, shown and fixed with a PUT.
            Json => match row.text(column).map_err(error)? {
                Some(text) => match serde_json::from_str(&text) {
                    Ok(value) => Some(value),
                    Err(e) => {
                        out.insert(
                            format!("{column}_error"),
                            Value::String(format!(
                                "{column}: the stored text is not JSON ({e}); a PUT with a new {column} replaces it"
                            )),
                        );
                        Some(Value::Object(Map::new()))
                    }
                },
                None => None,
            },
        };
        out.insert(column.to_string(), value.unwrap_or(Value::Null));
    }
    Ok(out)
}

macro_rules! bind_all {
    ($query:expr, $params:expr) => {{
        let mut query = $query;
        for p in $params {
            query = match p {
                Param::Text(v) => query.bind(v),
                Param::Bool(v) => query.bind(v),
                Param::Int64(v) => query.bind(v),
                Param::Int32(v) => query.bind(v),
            };
        }
        query
    }};
}

macro_rules! fetch_rows {
    ($conn:expr, $op:expr, $spec:expr, $sql:expr, $params:expr) => {{
        let query = bind_all!(sqlx::query(AssertSqlSafe($sql)), $params);
        match query.fetch_all($conn).await {
            Ok(rows) => rows.iter().map(|row| decode_row($spec, row)).collect(),
            Err(error) => Err(StoreError::Query { op: $op, error }),
        }
    }};
}

macro_rules! exec_rows {
    ($conn:expr, $op:expr, $sql:expr, $params:expr) => {{
        let query = bind_all!(sqlx::query(AssertSqlSafe($sql)), $params);
        query
            .execute($conn)
            .await
            .map(|done| done.rows_affected())
            .map_err(|error| StoreError::Query { op: $op, error })
    }};
}

fn insert_sql(
    spec: &TableSpec,
    row: &Map<String, Value>,
) -> Result<(String, Vec<Param>), StoreError> {
    let mut columns = Vec::new();
    let mut params = Vec::new();
    for (column, value) in row {
        params.push(param(spec, column, value)?);
        columns.push(column.as_str());
    }
    Ok((
        format!(
            "INSERT INTO {} ({}) VALUES ({})",
            spec.table,
            columns.join(", "),
            placeholder_list(params.len())
        ),
        params,
    ))
}

/// `UPDATE … SET` the given columns of one row (at least one).
fn update_sql(
    spec: &TableSpec,
    id: Uuid,
    changes: &Map<String, Value>,
) -> Result<(String, Vec<Param>), StoreError> {
    let mut sets = Vec::new();
    let mut params = Vec::new();
    for (column, value) in changes {
        params.push(param(spec, column, value)?);
        sets.push(format!("{column} = ${}", params.len()));
    }
    params.push(Param::Text(Some(id.hyphenated().to_string())));
    Ok((
        format!(
            "UPDATE {} SET {} WHERE id = ${}",
            spec.table,
            sets.join(", "),
            params.len()
        ),
        params,
    ))
}

impl Store {
    /// One row by id, its columns as JSON (times as epoch milliseconds).
    pub async fn row(
        &self,
        spec: &TableSpec,
        id: Uuid,
    ) -> Result<Option<Map<String, Value>>, StoreError> {
        let sql = format!(
            "SELECT {} FROM {} WHERE id = $1",
            spec.column_list(),
            spec.table
        );
        let params = vec![Param::Text(Some(id.hyphenated().to_string()))];
        let rows: Vec<Map<String, Value>> = match self {
            Store::Sqlite(pool) => fetch_rows!(pool, "select row", spec, sql, params),
            Store::Postgres(pool) => fetch_rows!(pool, "select row", spec, sql, params),
        }?;
        Ok(rows.into_iter().next())
    }

    /// Every row, optionally only those whose `column` equals `value`,
    /// ordered by (created_at, id). Without a filter (a listing), archived
    /// rows are left out: they are kept for their history, not for use.
    pub async fn rows(
        &self,
        spec: &TableSpec,
        filter: Option<(&str, &Value)>,
    ) -> Result<Vec<Map<String, Value>>, StoreError> {
        let mut sql = format!("SELECT {} FROM {}", spec.column_list(), spec.table);
        let mut params = Vec::new();
        if let Some((column, value)) = filter {
            params.push(param(spec, column, value)?);
            // The column name was checked against the spec by `param`.
            sql.push_str(&format!(" WHERE {column} = $1"));
        } else if spec.kind_of("archived_at").is_some() {
            sql.push_str(" WHERE archived_at IS NULL");
        }
        sql.push_str(" ORDER BY created_at, id");
        match self {
            Store::Sqlite(pool) => fetch_rows!(pool, "select rows", spec, sql, params),
            Store::Postgres(pool) => fetch_rows!(pool, "select rows", spec, sql, params),
        }
    }

    /// Inserts rows of possibly different tables in one transaction: all or
    /// nothing (a branch rule with its action details).
    pub async fn insert_rows(
        &self,
        rows: &[(&TableSpec, Map<String, Value>)],
    ) -> Result<(), StoreError> {
        let mut statements = Vec::new();
        for (spec, row) in rows {
            statements.push(insert_sql(spec, row)?);
        }
        self.execute_in_one_transaction("insert row", statements)
            .await
            .map(drop)
    }

    /// Sets the given columns of one row; false when no row has this id.
    pub async fn update_row(
        &self,
        spec: &TableSpec,
        id: Uuid,
        changes: &Map<String, Value>,
    ) -> Result<bool, StoreError> {
        if changes.is_empty() {
            return Ok(self.row(spec, id).await?.is_some());
        }
        Ok(self.update_rows(&[(spec, id, changes.clone())]).await?[0])
    }

    /// Sets the given columns of each row in one transaction: all or
    /// nothing (a rule's new expression with the next runs it moves). For
    /// each update, whether a row had its id; one that had none changes
    /// nothing and does not undo the others. Every update sets at least
    /// one column.
    pub async fn update_rows(
        &self,
        updates: &[(&TableSpec, Uuid, Map<String, Value>)],
    ) -> Result<Vec<bool>, StoreError> {
        let mut statements = Vec::new();
        for (spec, id, changes) in updates {
            debug_assert!(
                !changes.is_empty(),
                "an update of {} sets nothing",
                spec.table
            );
            statements.push(update_sql(spec, *id, changes)?);
        }
        let affected = self
            .execute_in_one_transaction("update row", statements)
            .await?;
        Ok(affected.into_iter().map(|rows| rows > 0).collect())
    }

    /// Runs `statements` in one transaction, all or nothing; returns the
    /// rows each one affected.
    async fn execute_in_one_transaction(
        &self,
        op: &'static str,
        statements: Vec<(String, Vec<Param>)>,
    ) -> Result<Vec<u64>, StoreError> {
        macro_rules! run {
            ($pool:expr) => {{
                let mut tx = $pool
                    .begin()
                    .await
                    .map_err(|error| StoreError::Query { op: "begin", error })?;
                let mut affected = Vec::with_capacity(statements.len());
                for (sql, params) in statements {
                    affected.push(exec_rows!(&mut *tx, op, sql, params)?);
                }
                tx.commit().await.map_err(|error| StoreError::Query {
                    op: "commit",
                    error,
                })?;
                Ok(affected)
            }};
        }
        match self {
            Store::Sqlite(pool) => run!(pool),
            Store::Postgres(pool) => run!(pool),
        }
    }

    /// Deletes the rows with these ids in one transaction; returns how many
    /// were deleted.
    pub async fn delete_rows(&self, spec: &TableSpec, ids: &[Uuid]) -> Result<u64, StoreError> {
        let params: Vec<Param> = ids
            .iter()
            .map(|id| Param::Text(Some(id.hyphenated().to_string())))
            .collect();
        let sql = format!(
            "DELETE FROM {} WHERE id IN ({})",
            spec.table,
            placeholder_list(ids.len())
        );
        match self {
            Store::Sqlite(pool) => exec_rows!(pool, "delete rows", sql, params),
            Store::Postgres(pool) => exec_rows!(pool, "delete rows", sql, params),
        }
    }
}

/// Read only, for the expression a branch rule inherits from its brand rule.
pub const BRAND_RULES: TableSpec = TableSpec {
    table: "brand_rules",
    columns: &[
        ("id", Text),
        ("brand_id", Text),
        ("rule_id", Text),
        ("settings", Json),
        ("cron_expression", Text),
        ("created_at", Int64),
        ("updated_at", Int64),
        ("created_by", Text),
        ("updated_by", Text),
    ],
};

// ---- keyset pages for the API's listings ------------------------------------

/// The order a listing is paged in. A keyset page costs a walk of its own
/// rows through an index, however deep the page, where OFFSET would read
/// and drop every row before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageOrder {
    /// By id (the primary key).
    Id,
    /// By position, then id: a branch rule's action details, in the order
    /// they run.
    PositionThenId,
}

/// Where a page starts: the key of the last row of the previous one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageKey {
    /// Only in [`PageOrder::PositionThenId`].
    pub position: Option<i32>,
    pub id: String,
}

impl Store {
    /// At most `limit` rows after `after` in `order`, filtered as
    /// [`Store::rows`] filters. Without a filter (a listing) the live rows
    /// are listed, or with `archived` only the archived ones (`archived_at`
    /// set, or a branch rule's `is_archived`).
    pub async fn rows_page(
        &self,
        spec: &TableSpec,
        filter: Option<(&str, &Value)>,
        archived: bool,
        order: PageOrder,
        after: Option<&PageKey>,
        limit: i64,
    ) -> Result<Vec<Map<String, Value>>, StoreError> {
        let mut clauses = Vec::new();
        let mut params = Vec::new();
        if let Some((column, value)) = filter {
            params.push(param(spec, column, value)?);
            // The column name was checked against the spec by `param`.
            clauses.push(format!("{column} = ${}", params.len()));
        } else if spec.kind_of("archived_at").is_some() {
            clauses.push(
                if archived {
                    "archived_at IS NOT NULL"
                } else {
                    "archived_at IS NULL"
                }
                .to_string(),
            );
        } else if spec.kind_of("is_archived").is_some() {
            params.push(Param::Bool(Some(archived)));
            clauses.push(format!("is_archived = ${}", params.len()));
        }
        let order_by = match order {
            PageOrder::Id => "id",
            PageOrder::PositionThenId => "position, id",
        };
        if let Some(key) = after {
            params.push(Param::Text(Some(key.id.clone())));
            let id = params.len();
            match (order, key.position) {
                (PageOrder::PositionThenId, Some(position)) => {
                    params.push(Param::Int32(Some(position)));
                    let p = params.len();
                    clauses.push(format!(
                        "(position > ${p} OR (position = ${p} AND id > ${id}))"
                    ));
                }
                _ => clauses.push(format!("id > ${id}")),
            }
        }
        let mut sql = format!("SELECT {} FROM {}", spec.column_list(), spec.table);
        if !clauses.is_empty() {
            sql.push_str(&format!(" WHERE {}", clauses.join(" AND ")));
        }
        params.push(Param::Int64(Some(limit.max(0))));
        sql.push_str(&format!(" ORDER BY {order_by} LIMIT ${}", params.len()));
        match self {
            Store::Sqlite(pool) => fetch_rows!(pool, "select page", spec, sql, params),
            Store::Postgres(pool) => fetch_rows!(pool, "select page", spec, sql, params),
        }
    }
}
