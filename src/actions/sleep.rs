//! `sleep` {ms}: waits on tokio's clock, so tests and `ruled simulate` on a
//! paused clock pass through it instantly and deterministically.

use std::time::Duration;

use serde_json::json;

use super::{ActionCall, ActionError, ActionFuture, ActionHandler, ActionOutput, fields};

#[derive(Debug, Default)]
pub struct SleepAction;

impl ActionHandler for SleepAction {
    fn kind(&self) -> &str {
        "sleep"
    }

    fn run<'a>(&'a self, call: &'a ActionCall) -> ActionFuture<'a> {
        Box::pin(async move {
            let ms = fields::opt_u64(&call.config, "ms")?
                .ok_or_else(|| ActionError::invalid("ms", "is required"))?;
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(ActionOutput(json!({ "slept_ms": ms })))
        })
    }
}
