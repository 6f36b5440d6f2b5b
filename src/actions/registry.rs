//! The kinds ruled knows, by name.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use super::command::CommandAction;
use super::http::HttpAction;
use super::leftovers::CommandLedger;
use super::noop::NoopAction;
use super::secrets::Secrets;
use super::sleep::SleepAction;
use super::{ActionCall, ActionError, ActionHandler, ActionOutput, ActionSettings, cap_output};

/// Handlers by kind. Cloning is cheap and every clone shares the same
/// handler instances, so each worker can hold its own copy.
///
/// Register everything before handing clones out: a clone taken earlier
/// keeps the set it was taken with.
#[derive(Clone, Default)]
pub struct ActionRegistry {
    handlers: Arc<HashMap<String, Arc<dyn ActionHandler>>>,
}

impl ActionRegistry {
    /// A registry with no kinds at all.
    pub fn new() -> ActionRegistry {
        ActionRegistry::default()
    }

    /// `noop`, `sleep`, `http` and `command`, configured by the operator's
    /// switches.
    pub fn with_builtins(settings: ActionSettings) -> ActionRegistry {
        let mut registry = ActionRegistry::new();
        registry.register(Arc::new(NoopAction));
        registry.register(Arc::new(SleepAction));
        registry.register(Arc::new(HttpAction::new(
            settings.http_action_allow_private,
        )));
        let ledger = settings
            .command_ledger
            .map(|path| Arc::new(CommandLedger::at(path)));
        registry.register(Arc::new(CommandAction::new(
            settings.command_actions_enabled,
            ledger,
        )));
        registry
    }

    /// Adds `handler` under its kind, replacing any handler of the same name
    /// (a library user may swap out a built-in).
    pub fn register(&mut self, handler: Arc<dyn ActionHandler>) {
        let kind = handler.kind().to_string();
        Arc::make_mut(&mut self.handlers).insert(kind, handler);
    }

    pub fn get(&self, kind: &str) -> Option<Arc<dyn ActionHandler>> {
        self.handlers.get(kind).cloned()
    }

    /// The registered kinds, sorted.
    pub fn kinds(&self) -> Vec<String> {
        let mut kinds: Vec<String> = self.handlers.keys().cloned().collect();
        kinds.sort();
        kinds
    }

    /// Runs `call` on the handler for its kind; unknown kind ->
    /// [`ActionError::UnknownKind`]. The merge of template config and detail
    /// params happened when the call was built ([`ActionCall::new`], which
    /// uses [`merge_config`](super::merge_config)).
    ///
    /// Whatever the handler returns, its output (also a failure's output) is
    /// bounded by [`cap_output`], and every secret of the call's config is
    /// scrubbed from it and from the error text ([`Secrets`]): a response
    /// that echoes the request, or an error naming the URL, would otherwise
    /// carry credentials into the executions table and the log. Cancel by
    /// dropping the future.
    pub async fn run(&self, call: &ActionCall) -> Result<ActionOutput, ActionError> {
        let handler = self
            .get(&call.kind)
            .ok_or_else(|| ActionError::UnknownKind(call.kind.clone()))?;
        let started = Instant::now();
        let result = scrub(&Secrets::of(&call.config), handler.run(call).await);
        let elapsed_ms = started.elapsed().as_millis() as u64;
        match &result {
            Ok(_) => tracing::debug!(
                kind = %call.kind,
                execution_id = %call.execution_id,
                position = call.position,
                elapsed_ms,
                "action succeeded"
            ),
            Err(error) => tracing::debug!(
                kind = %call.kind,
                execution_id = %call.execution_id,
                position = call.position,
                elapsed_ms,
                outcome = error.code(),
                %error,
                "action did not succeed"
            ),
        }
        match result {
            Ok(ActionOutput(value)) => Ok(ActionOutput(cap_output(value))),
            Err(ActionError::Failed { message, output }) => Err(ActionError::Failed {
                message,
                output: output.map(cap_output),
            }),
            Err(other) => Err(other),
        }
    }
}

fn scrub(
    secrets: &Secrets,
    result: Result<ActionOutput, ActionError>,
) -> Result<ActionOutput, ActionError> {
    match result {
        Ok(ActionOutput(value)) => Ok(ActionOutput(secrets.scrub(&value))),
        Err(ActionError::Failed { message, output }) => Err(ActionError::Failed {
            message: secrets.scrub_text(&message),
            output: output.map(|o| secrets.scrub(&o)),
        }),
        Err(ActionError::Refused { reason }) => Err(ActionError::Refused {
            reason: secrets.scrub_text(&reason),
        }),
        Err(ActionError::InvalidConfig { field, message }) => Err(ActionError::InvalidConfig {
            field,
            message: secrets.scrub_text(&message),
        }),
        Err(other) => Err(other),
    }
}

impl fmt::Debug for ActionRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ActionRegistry")
            .field("kinds", &self.kinds())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_are_registered() {
        let registry = ActionRegistry::with_builtins(ActionSettings::default());
        assert_eq!(registry.kinds(), vec!["command", "http", "noop", "sleep"]);
        assert!(ActionRegistry::new().kinds().is_empty());
    }
}
