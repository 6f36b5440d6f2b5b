//! Smart merge (seed 000): folds what the database says into the local plan
//! without losing what only this instance knows yet.

use std::time::Duration;

use serde::Serialize;
use uuid::Uuid;

use super::{ExecutionPlan, Workflow, indexed_time};
use crate::model::{Millis, PlanData, PlanScope};

#[derive(Debug, Clone, Copy)]
pub struct MergeOptions {
    /// Rule 5: the first refresh after start trusts the database completely.
    pub first_refresh: bool,
    /// Rule 2: local changes younger than this (the refresh interval) win.
    pub recent_window: Duration,
    /// Rule 4: workflows missing from the database are dropped after this.
    pub max_age: Duration,
}

impl Default for MergeOptions {
    fn default() -> Self {
        MergeOptions {
            first_refresh: false,
            recent_window: Duration::from_secs(20),
            max_age: Duration::from_secs(24 * 3600),
        }
    }
}

/// A changed next_run_time, for seed 000's
/// `🔄 Updated workflow {id}: next_run_time X → Y` line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NextRunChange {
    pub id: Uuid,
    pub from: Option<Millis>,
    pub to: Option<Millis>,
}

/// The one-line diff each refresh logs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MergeReport {
    /// Rule 3: new in the database.
    pub added: usize,
    /// Database values taken over local ones.
    pub updated: usize,
    /// Rule 4: newly missing from the database; no longer ready.
    pub removed: usize,
    /// Rules 1 and 2: local values kept over the database's.
    pub preserved: usize,
    /// Rule 4: missing for longer than the max age and dropped from memory.
    pub pruned: usize,
    /// At most [`MergeReport::NEXT_RUN_CHANGES_LOGGED`] of the next-run changes.
    pub next_run_changes: Vec<NextRunChange>,
    /// An incremental merge found the plan and the table disagree on how
    /// many branch rules exist (a delete, or an insert the delta missed):
    /// the caller should follow up with a full read.
    pub full_refresh_needed: bool,
    /// Workflows parked for their window or set aside behind another row
    /// that a change of the lookup tables put back among the due ones (a
    /// branch switched on, a zone changed): no branch rule row changed, yet
    /// the master has to look again.
    pub released: usize,
}

impl MergeReport {
    /// Enough to debug with, bounded so a mass change cannot flood the log.
    pub const NEXT_RUN_CHANGES_LOGGED: usize = 20;

    /// Nothing changed in the plan (preserved local values change nothing).
    pub fn is_empty(&self) -> bool {
        self.added + self.updated + self.removed + self.pruned == 0
    }

    /// Adds a follow-up merge (the full read after a delta) to this report.
    pub fn absorb(&mut self, later: MergeReport) {
        self.added += later.added;
        self.updated += later.updated;
        self.removed += later.removed;
        self.preserved += later.preserved;
        self.pruned += later.pruned;
        for change in later.next_run_changes {
            self.note_next_run_change(change.id, change.from, change.to);
        }
        self.full_refresh_needed = later.full_refresh_needed;
        self.released += later.released;
    }

    fn note_next_run_change(&mut self, id: Uuid, from: Option<Millis>, to: Option<Millis>) {
        if from != to && self.next_run_changes.len() < Self::NEXT_RUN_CHANGES_LOGGED {
            self.next_run_changes.push(NextRunChange { id, from, to });
        }
    }
}

/// Merges the database's view into `plan` at `now` following seed 000's five
/// rules, and reports what changed.
pub fn merge(
    plan: &mut ExecutionPlan,
    server: PlanData,
    now: Millis,
    options: MergeOptions,
) -> MergeReport {
    let mut report = MergeReport::default();
    let scope = server.scope;
    let generation = plan.next_generation();
    let recent_ms = options.recent_window.as_millis() as Millis;
    let max_age_ms = options.max_age.as_millis() as Millis;

    // The details are read ordered by branch rule id: when the cap cut the
    // read, the last rule in it may be partial and later ones are absent.
    plan.action_details_cut_at = server.action_details_cut;
    // Lookup tables carry no local state: the database is always right.
    report.released = plan.replace_tables(
        server.brands,
        server.branches,
        server.rules,
        server.brand_rules,
        server.action_templates,
        server.action_details,
    );

    for row in server.branch_rules {
        let id = row.id;
        // One hash lookup per row: a refresh of a million workflows where
        // one percent changed is mostly this loop finding nothing to do.
        let Some(local) = plan.workflows.get_mut(&id) else {
            let mut workflow = Workflow::new(row);
            workflow.seen_generation = generation;
            plan.insert(workflow);
            report.added += 1;
            continue;
        };
        let indexed_before = indexed_time(&plan.rules, local);
        // Where its entry sits: its indexed time, or the window opening it
        // is parked at.
        let entry_before = plan
            .parked
            .get(&id)
            .map_or(indexed_before, |parked| Some(parked.until));
        local.seen_generation = generation;
        let reappeared = local.missing_since.take().is_some();
        plan.missing -= reappeared as usize;
        let mut changed = reappeared;

        let recently_changed_here = local
            .locally_updated_at
            .is_some_and(|at| now - at < recent_ms);
        if options.first_refresh {
            // Rule 5: nothing local survives the first refresh.
            changed |= local.locally_updated_at.take().is_some();
        }
        if !options.first_refresh && recently_changed_here {
            // Rule 2: the database has not caught up with our own write yet.
            if local.branch_rule != row {
                report.preserved += 1;
            }
        } else if !options.first_refresh && local.running_here && !row.is_currently_running {
            // Rule 1: a job this instance started is in flight; the database
            // has not heard yet. A flag set by another instance's claim is
            // not ours to keep: it follows the database.
            report.preserved += 1;
            report.note_next_run_change(id, local.branch_rule.next_run_time, row.next_run_time);
            changed |= local.branch_rule != row;
            local.branch_rule = row;
            local.branch_rule.is_currently_running = true;
        } else if local.branch_rule != row || reappeared {
            report.updated += 1;
            report.note_next_run_change(id, local.branch_rule.next_run_time, row.next_run_time);
            changed = true;
            local.branch_rule = row;
        }

        let indexed_after = indexed_time(&plan.rules, local);
        // A changed row waits at its indexed time again, parked or not; an
        // unchanged one stays where it is.
        let entry_after = if !changed && indexed_after == indexed_before {
            entry_before
        } else {
            plan.parked.remove(&id);
            indexed_after
        };
        if entry_before != entry_after {
            plan.reindex(id, entry_before, entry_after);
        }
        if changed {
            plan.note_changed(id);
        }
    }

    if let PlanScope::Changes {
        total_branch_rules, ..
    } = scope
    {
        // Rows outside the delta are unchanged by definition: no sweep.
        let known = plan.present_len() + plan.quarantined_branch_rules();
        report.full_refresh_needed = known as u64 != total_branch_rules;
        return report;
    }

    // Sweep for workflows the database no longer returned (rule 4).
    let mut newly_missing = Vec::new();
    let mut to_prune = Vec::new();
    for workflow in plan.workflows.values() {
        if workflow.seen_generation == generation {
            continue;
        }
        let running = workflow.branch_rule.is_currently_running;
        match workflow.missing_since {
            _ if options.first_refresh => to_prune.push(workflow.id()),
            None => newly_missing.push(workflow.id()),
            // A job still in flight keeps its workflow until it finishes.
            Some(since) if now - since >= max_age_ms && !running => to_prune.push(workflow.id()),
            Some(_) => {}
        }
    }
    for id in newly_missing {
        plan.update(&id, |w| w.missing_since = Some(now));
        report.removed += 1;
    }
    for id in to_prune {
        let was_visible = plan.remove(&id).is_some_and(|w| w.missing_since.is_none());
        if was_visible {
            report.removed += 1;
        }
        report.pruned += 1;
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::fixtures::*;
    use crate::plan::ready;
    use chrono_tz::Asia::Riyadh;

    const NOW: Millis = 1_800_000_000_000;
    const HOUR: Millis = 3_600_000;

    fn options() -> MergeOptions {
        MergeOptions {
            first_refresh: false,
            recent_window: Duration::from_secs(20),
            max_age: Duration::from_secs(24 * 3600),
        }
    }

    #[test]
    fn rule_1_a_locally_running_workflow_stays_running() {
        let fixture = Fixture::due(NOW - 1);
        let mut plan = fixture.plan();
        let id = fixture.workflow_id;
        // Marked long enough ago that rule 2 no longer applies.
        plan.mark_running(&id, NOW - 60_000);
        let mut server = fixture.data();
        server.branch_rules[0].last_run_time = Some(NOW - 5);
        let report = merge(&mut plan, server, NOW, options());
        assert_eq!(report.preserved, 1);
        let workflow = plan.get(&id).unwrap();
        assert!(workflow.branch_rule.is_currently_running);
        assert_eq!(
            workflow.branch_rule.last_run_time,
            Some(NOW - 5),
            "other fields follow the database"
        );
        assert!(ready(&plan, NOW, 500, Riyadh).is_empty());
    }

    #[test]
    fn rule_2_recent_local_updates_win_for_one_refresh_interval() {
        let fixture = Fixture::due(NOW - 1);
        let mut plan = fixture.plan();
        let id = fixture.workflow_id;
        let mut row = fixture.branch_rule.clone();
        row.next_run_time = Some(NOW + HOUR);
        plan.apply_post_process(row, NOW - 5_000);

        // The database still has the old next_run_time: stale, ignored.
        let report = merge(&mut plan, fixture.data(), NOW, options());
        assert_eq!(report.preserved, 1);
        assert_eq!(report.updated, 0);
        assert_eq!(
            plan.get(&id).unwrap().branch_rule.next_run_time,
            Some(NOW + HOUR)
        );

        // A refresh interval later the database is trusted again.
        let report = merge(&mut plan, fixture.data(), NOW + 20_000, options());
        assert_eq!(report.updated, 1);
        assert_eq!(
            plan.get(&id).unwrap().branch_rule.next_run_time,
            Some(NOW - 1)
        );
        assert_eq!(
            report.next_run_changes,
            vec![NextRunChange {
                id,
                from: Some(NOW + HOUR),
                to: Some(NOW - 1)
            }]
        );
    }

    #[test]
    fn rule_3_new_workflows_are_added() {
        let fixture = Fixture::due(NOW - 1);
        let mut plan = fixture.plan();
        let mut server = fixture.data();
        let new_id = Uuid::from_u128(0xA11);
        server.branch_rules.push(branch_rule(
            new_id,
            fixture.branch.id,
            fixture.rule.id,
            NOW - 2,
        ));
        let report = merge(&mut plan, server, NOW, options());
        assert_eq!((report.added, report.updated, report.removed), (1, 0, 0));
        assert_eq!(
            ready(&plan, NOW, 500, Riyadh),
            vec![new_id, fixture.workflow_id]
        );
    }

    #[test]
    fn rule_4_missing_workflows_stop_being_ready_at_once_and_are_pruned_later() {
        let fixture = Fixture::due(NOW - 1);
        let mut plan = fixture.plan();
        let id = fixture.workflow_id;
        let mut server = fixture.data();
        server.branch_rules.clear();

        let report = merge(&mut plan, server.clone(), NOW, options());
        assert_eq!(report.removed, 1);
        assert_eq!(report.pruned, 0);
        assert!(plan.get(&id).is_some(), "kept in memory for now");
        assert!(ready(&plan, NOW, 500, Riyadh).is_empty(), "but never ready");

        let report = merge(&mut plan, server.clone(), NOW + 23 * HOUR, options());
        assert_eq!((report.removed, report.pruned), (0, 0));
        assert!(plan.get(&id).is_some());

        let report = merge(&mut plan, server, NOW + 24 * HOUR, options());
        assert_eq!(report.pruned, 1);
        assert!(plan.get(&id).is_none());
        assert!(plan.is_empty());
    }

    #[test]
    fn rule_4_a_running_workflow_is_not_pruned_until_it_finishes() {
        let fixture = Fixture::due(NOW - 1);
        let mut plan = fixture.plan();
        let id = fixture.workflow_id;
        plan.mark_running(&id, NOW - HOUR);
        let mut server = fixture.data();
        server.branch_rules.clear();
        merge(&mut plan, server.clone(), NOW, options());
        let report = merge(&mut plan, server, NOW + 25 * HOUR, options());
        assert_eq!(report.pruned, 0);
        assert!(plan.get(&id).is_some());
    }

    #[test]
    fn rule_4_a_workflow_that_reappears_is_ready_again() {
        let fixture = Fixture::due(NOW - 1);
        let mut plan = fixture.plan();
        let mut empty = fixture.data();
        empty.branch_rules.clear();
        merge(&mut plan, empty, NOW, options());
        let report = merge(&mut plan, fixture.data(), NOW + 1_000, options());
        assert_eq!(report.updated, 1);
        assert_eq!(
            ready(&plan, NOW + 1_000, 500, Riyadh),
            vec![fixture.workflow_id]
        );
    }

    #[test]
    fn rule_5_the_first_refresh_trusts_the_database_completely() {
        let fixture = Fixture::due(NOW - 1);
        let mut plan = fixture.plan();
        let id = fixture.workflow_id;
        plan.mark_running(&id, NOW);
        let mut stale = fixture.branch_rule.clone();
        stale.id = Uuid::from_u128(0xDEAD);
        plan.insert(Workflow::new(stale));

        let first = MergeOptions {
            first_refresh: true,
            ..options()
        };
        let report = merge(&mut plan, fixture.data(), NOW, first);
        let workflow = plan.get(&id).unwrap();
        assert!(
            !workflow.branch_rule.is_currently_running,
            "running flag from the database"
        );
        assert_eq!(workflow.locally_updated_at, None);
        assert!(
            plan.get(&Uuid::from_u128(0xDEAD)).is_none(),
            "gone at once, no grace period"
        );
        assert_eq!((report.updated, report.removed, report.pruned), (1, 1, 1));
        assert_eq!(ready(&plan, NOW, 500, Riyadh), vec![id]);
    }

    fn changes_only(mut data: PlanData, since: Millis, total: u64) -> PlanData {
        data.scope = PlanScope::Changes {
            since,
            total_branch_rules: total,
        };
        data
    }

    #[test]
    fn an_incremental_merge_touches_only_the_rows_it_carries() {
        let fixture = Fixture::due(NOW - 1);
        let mut plan = fixture.plan();
        let other = Uuid::from_u128(0x0E);
        let mut full = fixture.data();
        full.branch_rules.push(branch_rule(
            other,
            fixture.branch.id,
            fixture.rule.id,
            NOW + HOUR,
        ));
        merge(&mut plan, full.clone(), NOW, options());

        // Only `other` changed; the fixture's row is absent from the delta
        // and must not be taken for deleted.
        let mut delta = changes_only(full, NOW, 2);
        delta.branch_rules.retain(|r| r.id == other);
        delta.branch_rules[0].next_run_time = Some(NOW - 5);
        let report = merge(&mut plan, delta, NOW + 1_000, options());
        assert_eq!((report.updated, report.removed, report.added), (1, 0, 0));
        assert!(!report.full_refresh_needed);
        assert_eq!(
            ready(&plan, NOW + 1_000, 500, Riyadh),
            vec![other, fixture.workflow_id]
        );
    }

    #[test]
    fn an_incremental_merge_notices_a_delete_by_the_row_count() {
        let fixture = Fixture::due(NOW - 1);
        let mut plan = fixture.plan();
        let mut delta = changes_only(fixture.data(), NOW, 0);
        delta.branch_rules.clear();
        let report = merge(&mut plan, delta, NOW, options());
        assert!(report.full_refresh_needed);
        assert_eq!(plan.present_len(), 1, "nothing is removed on a guess");

        // The full read that follows removes it.
        let mut full = fixture.data();
        full.branch_rules.clear();
        let report = merge(&mut plan, full, NOW, options());
        assert_eq!(report.removed, 1);
        assert_eq!(plan.present_len(), 0);
        assert!(ready(&plan, NOW, 500, Riyadh).is_empty());
    }

    #[test]
    fn an_unchanged_database_changes_nothing() {
        let fixture = Fixture::due(NOW - 1);
        let mut plan = fixture.plan();
        let before = plan.snapshot(0);
        let report = merge(&mut plan, fixture.data(), NOW, options());
        assert!(report.is_empty(), "{report:?}");
        assert_eq!(plan.snapshot(0), before);
    }

    #[test]
    fn lookup_tables_follow_the_database() {
        let mut fixture = Fixture::due(NOW - 1);
        let mut plan = fixture.plan();
        fixture.branch.is_active = false;
        merge(&mut plan, fixture.data(), NOW, options());
        assert!(ready(&plan, NOW, 500, Riyadh).is_empty());
    }

    #[test]
    fn snapshots_round_trip() {
        let fixture = Fixture::due(NOW - 1);
        let mut plan = fixture.plan();
        plan.mark_running(&fixture.workflow_id, NOW);
        let snapshot = plan.snapshot(NOW);
        let bytes = snapshot.to_json();
        let restored = crate::plan::PlanSnapshot::from_json(&bytes).unwrap();
        assert_eq!(restored, snapshot);
        let mut rebuilt = ExecutionPlan::from_snapshot(restored);
        assert_eq!(rebuilt.snapshot(NOW), snapshot);
        assert_eq!(rebuilt.reset_running_flags(), 1);
        assert_eq!(ready(&rebuilt, NOW, 500, Riyadh), vec![fixture.workflow_id]);
    }
}
