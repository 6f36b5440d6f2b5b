//! `ruled prune [--dry-run]`: the pruner's work on demand. The dry run says
//! what would go and deletes nothing.

use crate::clock::millis_to_utc;
use crate::config::Config;
use crate::model::Millis;
use crate::store::{PruneSummary, Store};

use super::CommandError;

const DAY_MS: Millis = 86_400_000;

/// What `ruled prune` found or did.
#[derive(Debug, Clone, PartialEq)]
pub enum PruneOutcome {
    /// EXECUTION_RETENTION_DAYS=0: nothing is ever pruned.
    KeptForever,
    /// What would go, or went: the summary taken before deleting.
    Pruned {
        cutoff: Millis,
        summary: PruneSummary,
        /// Rows deleted; 0 on a dry run.
        deleted: u64,
        dry_run: bool,
    },
}

/// Prunes (or with `dry_run` only counts) the finished executions older
/// than EXECUTION_RETENTION_DAYS at `now`, in the pruner's batches.
pub async fn prune(
    store: &Store,
    config: &Config,
    now: Millis,
    dry_run: bool,
) -> Result<PruneOutcome, CommandError> {
    let days = config.execution_retention_days;
    if days == 0 {
        return Ok(PruneOutcome::KeptForever);
    }
    let cutoff = now - days as Millis * DAY_MS;
    let summary = store.prunable_executions(cutoff).await?;
    let mut deleted = 0;
    if !dry_run {
        let batch = config.prune_batch.max(1);
        loop {
            let n = store.prune_executions(cutoff, batch as i64).await?;
            deleted += n;
            if (n as usize) < batch {
                break;
            }
        }
    }
    Ok(PruneOutcome::Pruned {
        cutoff,
        summary,
        deleted,
        dry_run,
    })
}

/// The report, one fact per line.
pub fn prune_lines(outcome: &PruneOutcome, config: &Config) -> Vec<String> {
    let PruneOutcome::Pruned {
        cutoff,
        summary,
        deleted,
        dry_run,
    } = outcome
    else {
        return vec![
            "EXECUTION_RETENTION_DAYS=0: execution history is kept forever; nothing to prune"
                .to_string(),
        ];
    };
    let days = config.execution_retention_days;
    let cutoff = millis_to_utc(*cutoff).to_rfc3339();
    let mut lines = vec![format!(
        "retention: {days} day(s) (EXECUTION_RETENTION_DAYS); cutoff {cutoff}"
    )];
    let total = summary.total();
    let verb = if *dry_run { "would prune" } else { "pruning" };
    lines.push(format!(
        "{verb} {total} finished execution(s) requested before the cutoff"
    ));
    for (status, count) in &summary.by_status {
        if *count > 0 {
            lines.push(format!("  {}: {count}", status.as_str()));
        }
    }
    if let (Some(oldest), Some(newest)) = (summary.oldest, summary.newest) {
        lines.push(format!(
            "  requested from {} to {}",
            millis_to_utc(oldest).to_rfc3339(),
            millis_to_utc(newest).to_rfc3339()
        ));
    }
    if *dry_run {
        lines.push("dry run: nothing deleted".to_string());
    } else {
        lines.push(format!("deleted {deleted} execution(s)"));
    }
    lines
}
