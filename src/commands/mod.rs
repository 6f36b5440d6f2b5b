//! The work behind the CLI's subcommands, kept in the library so tests drive
//! the same code the binary runs. `main.rs` only parses arguments.

pub mod demo;
pub mod plan;
pub mod preview;
pub mod prune;
pub mod simulate;

use crate::persist::PersistError;
use crate::schedule::ScheduleError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    #[error(transparent)]
    Persist(#[from] PersistError),
    #[error("invalid {field}: {message}")]
    InvalidArgument {
        field: &'static str,
        message: String,
    },
    #[error("no plan available: the database failed ({database}) and {plan_file} does not exist")]
    NoPlan { database: String, plan_file: String },
}

/// A bad command-line argument, named by its flag.
pub(crate) fn invalid(field: &'static str, message: impl Into<String>) -> CommandError {
    CommandError::InvalidArgument {
        field,
        message: message.into(),
    }
}
