//! Column access shared by both backends, with errors that name the row.

use serde_json::Value;
use sqlx::Row;
use sqlx::postgres::PgRow;
use sqlx::sqlite::SqliteRow;
use uuid::Uuid;

use super::StoreError;
use crate::model::RuleStatus;
use crate::schedule::{Policy, TimeOfDay};

/// The few column types the schema uses, read the same way from either
/// backend's row so one decoder per table serves both.
pub(crate) trait AnyRow {
    fn text(&self, column: &str) -> Result<Option<String>, sqlx::Error>;
    fn int64(&self, column: &str) -> Result<Option<i64>, sqlx::Error>;
    fn int32(&self, column: &str) -> Result<Option<i32>, sqlx::Error>;
    fn boolean(&self, column: &str) -> Result<Option<bool>, sqlx::Error>;
    /// The column's bytes, for text that is not UTF-8 (SQLite stores what
    /// SQL gives it).
    fn bytes(&self, column: &str) -> Result<Option<Vec<u8>>, sqlx::Error>;
}

macro_rules! impl_any_row {
    ($row:ty) => {
        impl AnyRow for $row {
            fn text(&self, column: &str) -> Result<Option<String>, sqlx::Error> {
                self.try_get(column)
            }
            fn int64(&self, column: &str) -> Result<Option<i64>, sqlx::Error> {
                self.try_get(column)
            }
            fn int32(&self, column: &str) -> Result<Option<i32>, sqlx::Error> {
                self.try_get(column)
            }
            fn boolean(&self, column: &str) -> Result<Option<bool>, sqlx::Error> {
                self.try_get(column)
            }
            fn bytes(&self, column: &str) -> Result<Option<Vec<u8>>, sqlx::Error> {
                self.try_get_unchecked(column)
            }
        }
    };
}

impl_any_row!(SqliteRow);
impl_any_row!(PgRow);

/// Reads one row of `table`; every error carries the table, the row's id and
/// the column.
pub(crate) struct RowReader<'r, R> {
    row: &'r R,
    table: &'static str,
    id: String,
}

impl<'r, R: AnyRow> RowReader<'r, R> {
    /// Reads the `id` column first so later errors can name the row even when
    /// the id itself is not a valid UUID.
    pub(crate) fn new(row: &'r R, table: &'static str) -> Result<Self, StoreError> {
        let mut reader = RowReader {
            row,
            table,
            id: "?".to_string(),
        };
        reader.id = reader.text("id")?;
        Ok(reader)
    }

    /// For a table keyed by something else than an `id` column: `key`
    /// names the row in errors.
    pub(crate) fn keyed(row: &'r R, table: &'static str, key: String) -> Self {
        RowReader {
            row,
            table,
            id: key,
        }
    }

    fn error(&self, column: &'static str, message: impl ToString) -> StoreError {
        StoreError::Decode {
            table: self.table,
            id: self.id.clone(),
            column,
            message: message.to_string(),
        }
    }

    fn required<T>(&self, column: &'static str, value: Option<T>) -> Result<T, StoreError> {
        value.ok_or_else(|| self.error(column, "unexpected NULL"))
    }

    pub(crate) fn opt_text(&self, column: &'static str) -> Result<Option<String>, StoreError> {
        self.row.text(column).map_err(|e| self.error(column, e))
    }

    pub(crate) fn text(&self, column: &'static str) -> Result<String, StoreError> {
        let value = self.opt_text(column)?;
        self.required(column, value)
    }

    pub(crate) fn opt_i64(&self, column: &'static str) -> Result<Option<i64>, StoreError> {
        self.row.int64(column).map_err(|e| self.error(column, e))
    }

    pub(crate) fn i64(&self, column: &'static str) -> Result<i64, StoreError> {
        let value = self.opt_i64(column)?;
        self.required(column, value)
    }

    pub(crate) fn i32(&self, column: &'static str) -> Result<i32, StoreError> {
        let value = self.row.int32(column).map_err(|e| self.error(column, e))?;
        self.required(column, value)
    }

    pub(crate) fn bool(&self, column: &'static str) -> Result<bool, StoreError> {
        let value = self
            .row
            .boolean(column)
            .map_err(|e| self.error(column, e))?;
        self.required(column, value)
    }

    /// A UUID in the one form ruled writes and binds: lower case, with
    /// hyphens. Another spelling of the same UUID (upper case, braces, a
    /// `urn:uuid:` prefix) would load, yet no claim or lookup by id would
    /// ever match its row, so it is refused here and the row quarantined.
    pub(crate) fn opt_uuid(&self, column: &'static str) -> Result<Option<Uuid>, StoreError> {
        self.opt_text(column)?
            .map(|text| {
                let id = Uuid::parse_str(&text)
                    .map_err(|e| self.error(column, format!("invalid UUID {text:?}: {e}")))?;
                // Compared on the stack: ids are decoded on every claim.
                if id.hyphenated().encode_lower(&mut Uuid::encode_buffer()) != text.as_str() {
                    return Err(self.error(
                        column,
                        format!(
                            "UUID {text:?} is not in the canonical form {:?} (lower case, hyphenated), which every lookup by id uses",
                            id_text(id)
                        ),
                    ));
                }
                Ok(id)
            })
            .transpose()
    }

    pub(crate) fn uuid(&self, column: &'static str) -> Result<Uuid, StoreError> {
        let value = self.opt_uuid(column)?;
        self.required(column, value)
    }

    pub(crate) fn json(&self, column: &'static str) -> Result<Value, StoreError> {
        let text = self.text(column)?;
        serde_json::from_str(&text).map_err(|e| self.error(column, format!("invalid JSON: {e}")))
    }

    pub(crate) fn opt_time_of_day(
        &self,
        column: &'static str,
    ) -> Result<Option<TimeOfDay>, StoreError> {
        self.opt_text(column)?
            .map(|text| text.parse().map_err(|e| self.error(column, e)))
            .transpose()
    }

    /// A stored policy (JSON text, NULL for none). A text the model
    /// refuses is an error on `column` carrying the model's message, which
    /// names the field (`policy.max_attempts: ...`); a plan load
    /// quarantines the row with reason `policy`.
    pub(crate) fn policy(&self, column: &'static str) -> Result<Option<Policy>, StoreError> {
        let text = self.opt_text(column)?;
        Policy::from_json_text(text.as_deref()).map_err(|message| self.error(column, message))
    }

    pub(crate) fn rule_status(&self, column: &'static str) -> Result<RuleStatus, StoreError> {
        let text = self.text(column)?;
        RuleStatus::parse(&text).ok_or_else(|| {
            self.error(
                column,
                format!("unknown status {text:?}: expected active or inactive"),
            )
        })
    }
}

/// The text form of every id column: hyphenated, lower-case.
pub(crate) fn id_text(id: Uuid) -> String {
    id.hyphenated().to_string()
}

pub(crate) fn opt_id_text(id: Option<Uuid>) -> Option<String> {
    id.map(id_text)
}

pub(crate) fn json_text(value: &Value) -> String {
    value.to_string()
}

/// The stored text of a policy: NULL for none (or an empty one).
pub(crate) fn policy_text(policy: Option<&Policy>) -> Option<String> {
    Policy::to_json_text(policy)
}

pub(crate) fn opt_time_text(time: Option<TimeOfDay>) -> Option<String> {
    time.map(|t| t.to_string())
}
