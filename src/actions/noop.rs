//! `noop`: succeeds at once. Useful for wiring tests and for rules that exist
//! only to be scheduled and recorded.

use serde_json::json;

use super::{ActionCall, ActionFuture, ActionHandler, ActionOutput};

#[derive(Debug, Default)]
pub struct NoopAction;

impl ActionHandler for NoopAction {
    fn kind(&self) -> &str {
        "noop"
    }

    fn run<'a>(&'a self, _call: &'a ActionCall) -> ActionFuture<'a> {
        Box::pin(async { Ok(ActionOutput(json!({}))) })
    }
}
