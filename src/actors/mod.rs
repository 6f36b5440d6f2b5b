//! One actor per file. Each is a thin shell: its logic lives in the pure
//! modules (`plan`, `schedule`, `memory`, `supervision::policy`), so the
//! actors only own state, receive messages and do I/O.

pub mod master;
pub mod memory_guard;
pub mod plan;
pub mod refresher;
pub mod worker;
pub mod writer;

use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{ActorRef, Message, RpcReplyPort};

/// How long one actor waits for another's reply before giving up. Generous,
/// because a merge of a million workflows takes a while, yet bounded so a
/// wedged actor is noticed rather than waited on forever.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AskError {
    #[error("the actor is not running")]
    NotRunning,
    #[error("the actor did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the actor stopped before answering")]
    Dropped,
}

/// Sends a query and waits up to [`CALL_TIMEOUT`] for the answer.
pub async fn ask<M: Message, T: Send + 'static>(
    actor: &ActorRef<M>,
    build: impl FnOnce(RpcReplyPort<T>) -> M,
) -> Result<T, AskError> {
    ask_within(actor, CALL_TIMEOUT, build).await
}

pub async fn ask_within<M: Message, T: Send + 'static>(
    actor: &ActorRef<M>,
    timeout: Duration,
    build: impl FnOnce(RpcReplyPort<T>) -> M,
) -> Result<T, AskError> {
    match actor.call(build, Some(timeout)).await {
        Ok(CallResult::Success(value)) => Ok(value),
        Ok(CallResult::Timeout) => Err(AskError::Timeout(timeout)),
        Ok(CallResult::SenderError) => Err(AskError::Dropped),
        Err(_) => Err(AskError::NotRunning),
    }
}
