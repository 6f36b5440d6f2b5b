//! The in-memory execution plan (seed 000). Pure: no I/O, no actors.
//!
//! Workflows (branch rules) are kept by id, with their branch, rule, brand
//! rule and brand in lookup tables so a workflow costs a few hundred bytes.
//! A `BTreeSet` over `(next_run_time, id)` is the due index: finding what is
//! ready walks only the entries that are already due, in the deterministic
//! order the master dispatches them.

mod browse;
mod decide;
mod jobs;
mod journal;
mod locks;
mod merge;
mod next_run;
mod quarantine;
mod ready;
mod resolve;
pub mod simulate;

use std::collections::{BTreeSet, HashMap, HashSet};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::cluster::Ownership;
use crate::lifecycle::{Fence, Finish};
use crate::schedule::EffectivePolicy;

use crate::model::{
    ActionDetail, ActionTemplate, Branch, BranchRule, Brand, BrandRule, Millis, PlanData, PlanLoad,
    RejectedRow, Rule,
};

pub use browse::{
    BrowseKey, BrowsePage, BrowseQuery, RuleState, RuleSummary, browse, local_text, verdict,
};
pub use decide::{
    Cadence, DueDecision, Ending, FinishDecision, MAX_OCCURRENCES_PER_DECISION,
    MISFIRE_THRESHOLD_MS, RunEnd, decide_due, decide_finish, overlap_due,
};
pub use jobs::{
    JobSpec, JobStep, job_spec, job_steps, missed_windows, next_wake, next_wake_while_busy,
    next_wake_with_lead,
};
pub use journal::{JournalRead, PlanChanges, PlanDelta, parse_journal};
pub use locks::{StaleLock, lock_is_stale};
pub use merge::{MergeOptions, MergeReport, NextRunChange, merge};
pub use next_run::{PlanError, local_next_run_time, schedule_of};
pub use quarantine::{Quarantine, QuarantineChange, screen};
pub use ready::{NotReady, check_ready, ready, ready_owned, ready_within_lead, take_ready_owned};
pub use resolve::{
    ResolveError, ScheduleParts, next_run, resolve_expression, resolve_schedule, resolve_zone,
};

/// One branch rule as the plan holds it, with the bookkeeping smart merge needs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Workflow {
    pub branch_rule: BranchRule,
    /// When this instance itself last changed the workflow (marked it
    /// running, post-processed it). Merge rule 2 keeps such local values
    /// over database values for one refresh interval.
    #[serde(default)]
    pub locally_updated_at: Option<Millis>,
    /// When the database stopped returning the workflow. From then on it is
    /// never ready; it is pruned after PLAN_WORKFLOW_MAX_AGE_HOURS.
    #[serde(default)]
    pub missing_since: Option<Millis>,
    /// This instance claimed the workflow and its run has not ended here
    /// yet. Merge rule 1 keeps the running flag only for such runs: a flag
    /// another instance's claim set in the database follows the database,
    /// so a run lost with that instance is seen to end.
    #[serde(skip)]
    pub running_here: bool,
    /// The merge generation that last saw this workflow in the database; the
    /// sweep after a merge finds the missing ones without a set of all ids.
    #[serde(skip)]
    seen_generation: u64,
}

/// Equality ignores the merge generation: it is sweep bookkeeping, not state.
impl PartialEq for Workflow {
    fn eq(&self, other: &Self) -> bool {
        self.branch_rule == other.branch_rule
            && self.locally_updated_at == other.locally_updated_at
            && self.missing_since == other.missing_since
    }
}

impl Workflow {
    pub fn new(branch_rule: BranchRule) -> Workflow {
        Workflow {
            branch_rule,
            locally_updated_at: None,
            missing_since: None,
            running_here: false,
            seen_generation: 0,
        }
    }

    pub fn id(&self) -> Uuid {
        self.branch_rule.id
    }
}

/// Counts for the `ruled_plan_workflows{state}` gauge and `GET /plan`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PlanStats {
    pub workflows: usize,
    pub active: usize,
    pub inactive: usize,
    pub running: usize,
    pub removed: usize,
    /// Active workflows held back by a quarantined row or a missing next
    /// run: they need an operator, not time.
    #[serde(default)]
    pub held: usize,
    pub due: usize,
    pub branches: usize,
    pub rules: usize,
    pub brands: usize,
    pub action_templates: usize,
    pub action_details: usize,
}

/// A job's post-process the database could not take (seed 000: "if the
/// database update fails"). Kept in the plan, saved with the plan file, and
/// delivered by the refresher once the database is back. The fence makes a
/// late delivery harmless: if the claim was lost meanwhile, it changes nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutboxEntry {
    pub fence: Fence,
    pub finish: Finish,
    pub added_at: Millis,
}

/// What the plan file holds: the plan's tables as lists, so the file is
/// readable and stable across versions of the in-memory layout.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PlanSnapshot {
    pub saved_at: Millis,
    /// The newest journal write this snapshot holds (see [`PlanDelta`]);
    /// 0 in files written before the journal.
    #[serde(default)]
    pub journal_seq: u64,
    /// Post-process writes still to deliver; see [`OutboxEntry`].
    #[serde(default)]
    pub outbox: Vec<OutboxEntry>,
    pub workflows: Vec<Workflow>,
    pub brands: Vec<Brand>,
    pub branches: Vec<Branch>,
    pub rules: Vec<Rule>,
    pub brand_rules: Vec<BrandRule>,
    pub action_templates: Vec<ActionTemplate>,
    pub action_details: Vec<ActionDetail>,
}

impl PlanSnapshot {
    pub fn to_json(&self) -> Vec<u8> {
        // Serializing plain data structures to a Vec cannot fail.
        serde_json::to_vec(self).expect("plan snapshot serializes")
    }

    pub fn from_json(bytes: &[u8]) -> Result<PlanSnapshot, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

#[derive(Debug, Clone, Default)]
pub struct ExecutionPlan {
    workflows: HashMap<Uuid, Workflow>,
    due_index: BTreeSet<(Millis, Uuid)>,
    branches: HashMap<Uuid, Branch>,
    rules: HashMap<Uuid, Rule>,
    brands: HashMap<Uuid, Brand>,
    brand_rules: HashMap<Uuid, BrandRule>,
    action_templates: HashMap<Uuid, ActionTemplate>,
    /// Seed 000's workflow cache: action details by branch rule, in position order.
    action_details: HashMap<Uuid, Vec<ActionDetail>>,
    merge_generation: u64,
    /// Set when the last read hit PLAN_ACTION_DETAILS_CAP: the branch rule
    /// the cut fell in. Only the rules whose details the read holds, less
    /// this one, are cached whole.
    action_details_cut_at: Option<Uuid>,
    /// Undelivered post-process writes, oldest first.
    outbox: Vec<OutboxEntry>,
    /// How many workflows have `missing_since` set, kept so an incremental
    /// refresh can compare the plan's size with the table's in O(1).
    missing: usize,
    /// Rows kept out of the plan; rules that depend on one are held.
    quarantine: Quarantine,
    /// What changed since the plan file last took a write.
    changes: PlanChanges,
    /// Due workflows a ready walk found waiting for their operation window,
    /// keyed in the due index at the window's next opening instead of
    /// their indexed time: a day of rules that only run at night would
    /// otherwise be walked past, and their zones and windows computed, on
    /// every fetch (122 ms a fetch with 100,000 of them). Any change of the
    /// workflow, of the branches (their zones) or of the start offsets puts
    /// it back at its indexed time, and so does the opening itself: from
    /// then on it keeps its place in due order. Due workflows held back by
    /// another row (a branch or rule that is inactive or gone, a bad zone,
    /// a quarantined row they depend on) are parked the same way at
    /// [`HELD_BACK`], until a refresh changes the catalog or releases a
    /// row from quarantine: a branch switched off with 100,000 rules was
    /// otherwise walked past on every fetch. Never saved: a new plan walks
    /// again.
    parked: ParkedSet,
    /// Rules read as running under another holder's live lock: the ones to
    /// look at again when a lock may have turned stale without its row
    /// changing (see [`ExecutionPlan::free_locks_turned_stale`]). Kept
    /// loosely: an id whose row has moved on since is dropped at the next
    /// look, so only the reads have to add to it.
    foreign_locks: HashSet<Uuid>,
}

/// Where a due workflow held back by another row is parked in the due
/// index: after every time, so neither a walk of the due part nor the
/// master's next wake reaches it. Only a change of the catalog (or of the
/// quarantine) brings it back.
pub(crate) const HELD_BACK: Millis = Millis::MAX;

/// Where a parked workflow sits in the due index, and whether its window
/// opened and closed again since it fell due (see [`missed_windows`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Parked {
    until: Millis,
    missed: bool,
}

/// The parked workflows, by id and by window opening: the ones whose
/// window has opened are found without a walk over the rest.
#[derive(Debug, Clone, Default)]
struct ParkedSet {
    by_id: HashMap<Uuid, Parked>,
    by_opening: BTreeSet<(Millis, Uuid)>,
}

impl ParkedSet {
    fn get(&self, id: &Uuid) -> Option<&Parked> {
        self.by_id.get(id)
    }

    fn insert(&mut self, id: Uuid, parked: Parked) {
        if let Some(old) = self.by_id.insert(id, parked) {
            self.by_opening.remove(&(old.until, id));
        }
        self.by_opening.insert((parked.until, id));
    }

    fn remove(&mut self, id: &Uuid) -> Option<Parked> {
        let parked = self.by_id.remove(id)?;
        self.by_opening.remove(&(parked.until, *id));
        Some(parked)
    }

    fn len(&self) -> usize {
        self.by_id.len()
    }

    fn take(&mut self) -> HashMap<Uuid, Parked> {
        self.by_opening.clear();
        std::mem::take(&mut self.by_id)
    }

    fn iter(&self) -> impl Iterator<Item = (&Uuid, &Parked)> {
        self.by_id.iter()
    }

    /// The ids held back by another row ([`HELD_BACK`]).
    fn held_back(&self) -> Vec<Uuid> {
        self.by_opening
            .range((HELD_BACK, Uuid::nil())..)
            .map(|&(_, id)| id)
            .collect()
    }

    /// The ids whose window opened at or before `now`.
    fn opened(&self, now: Millis) -> Vec<Uuid> {
        self.by_opening
            .range(..=(now, Uuid::max()))
            .map(|&(_, id)| id)
            .collect()
    }
}

fn by_id<T>(items: Vec<T>, id: impl Fn(&T) -> Uuid) -> HashMap<Uuid, T> {
    items.into_iter().map(|item| (id(&item), item)).collect()
}

impl ExecutionPlan {
    pub fn new() -> ExecutionPlan {
        ExecutionPlan::default()
    }

    /// A plan that trusts `data` completely, as the first refresh does.
    pub fn from_data(data: PlanData) -> ExecutionPlan {
        let mut plan = ExecutionPlan::new();
        merge(
            &mut plan,
            data,
            0,
            MergeOptions {
                first_refresh: true,
                ..MergeOptions::default()
            },
        );
        plan
    }

    /// [`ExecutionPlan::from_data`] for a read that may carry bad rows:
    /// they are quarantined, as a refresh does.
    pub fn from_load(load: PlanLoad) -> ExecutionPlan {
        let mut plan = ExecutionPlan::new();
        let mut load = load;
        plan.quarantine_bad_rows(&mut load, 0);
        merge(
            &mut plan,
            load.data,
            0,
            MergeOptions {
                first_refresh: true,
                ..MergeOptions::default()
            },
        );
        plan
    }

    pub fn from_snapshot(snapshot: PlanSnapshot) -> ExecutionPlan {
        let mut plan = ExecutionPlan::new();
        plan.replace_tables(
            snapshot.brands,
            snapshot.branches,
            snapshot.rules,
            snapshot.brand_rules,
            snapshot.action_templates,
            snapshot.action_details,
        );
        for workflow in snapshot.workflows {
            plan.insert(workflow);
        }
        plan.outbox = snapshot.outbox;
        // Everything just read is on disk already.
        plan.forget_changes();
        plan
    }

    pub fn snapshot(&self, saved_at: Millis) -> PlanSnapshot {
        let mut workflows: Vec<Workflow> = self.workflows.values().cloned().collect();
        // Sorted so two saves of the same plan are byte-identical.
        workflows.sort_by_key(Workflow::id);
        PlanSnapshot {
            saved_at,
            journal_seq: 0,
            outbox: self.outbox.clone(),
            workflows,
            brands: sorted_values(&self.brands, |b| b.id),
            branches: sorted_values(&self.branches, |b| b.id),
            rules: sorted_values(&self.rules, |r| r.id),
            brand_rules: sorted_values(&self.brand_rules, |r| r.id),
            action_templates: sorted_values(&self.action_templates, |t| t.id),
            action_details: {
                let mut details: Vec<ActionDetail> =
                    self.action_details.values().flatten().cloned().collect();
                details.sort_by_key(|d| (d.branch_rule_id, d.position, d.id));
                details
            },
        }
    }

    /// Takes the database's lookup tables. Returns how many parked or
    /// set-aside workflows the change put back in the due part of the
    /// index, for the master to look at again.
    pub(crate) fn replace_tables(
        &mut self,
        brands: Vec<Brand>,
        branches: Vec<Branch>,
        rules: Vec<Rule>,
        brand_rules: Vec<BrandRule>,
        action_templates: Vec<ActionTemplate>,
        action_details: Vec<ActionDetail>,
    ) -> usize {
        let parked_before = self.parked.len();
        let brands = by_id(brands, |b| b.id);
        let branches = by_id(branches, |b| b.id);
        let brand_rules = by_id(brand_rules, |r| r.id);
        let action_templates = by_id(action_templates, |t| t.id);
        let rules = by_id(rules, |r| r.id);
        let mut grouped: HashMap<Uuid, Vec<ActionDetail>> = HashMap::new();
        for detail in action_details {
            grouped
                .entry(detail.branch_rule_id)
                .or_default()
                .push(detail);
        }
        for details in grouped.values_mut() {
            details.sort_by_key(|d| (d.position, d.id));
        }
        // A refresh hands over every table each time; only a real change
        // costs the plan file a snapshot.
        let branches_changed = branches != self.branches;
        let others_changed = brands != self.brands
            || rules != self.rules
            || brand_rules != self.brand_rules
            || action_templates != self.action_templates
            || grouped != self.action_details;
        self.changes.tables |= branches_changed || others_changed;
        self.brands = brands;
        if branches_changed {
            // A zone may have changed, and with it every window opening.
            self.unpark_all();
        }
        self.branches = branches;
        let offsets_changed = rules.len() != self.rules.len()
            || rules
                .iter()
                .any(|(id, rule)| self.rules.get(id).map(start_jitter) != Some(start_jitter(rule)));
        self.rules = rules;
        if offsets_changed {
            self.rebuild_due_index();
        }
        self.brand_rules = brand_rules;
        self.action_templates = action_templates;
        self.action_details = grouped;
        if others_changed {
            // A rule switched on, or a row a held rule waited for.
            self.release_held_back();
        }
        parked_before - self.parked.len()
    }

    /// Every workflow's index entry again: a rule's start offset changed,
    /// which moves all its branch rules. Rare (a policy edit), so a full
    /// rebuild rather than tracking which workflows belong to which rule.
    fn rebuild_due_index(&mut self) {
        self.parked.take();
        self.due_index = self
            .workflows
            .values()
            .filter_map(|w| indexed_time(&self.rules, w).map(|at| (at, w.id())))
            .collect();
    }

    /// The policy in force for a workflow: its own fields over its rule's.
    pub fn policy_of(&self, workflow: &Workflow) -> EffectivePolicy {
        let row = &workflow.branch_rule;
        let rule = self.rules.get(&row.rule_id).and_then(|r| r.policy.as_ref());
        EffectivePolicy::resolve(rule, row.policy.as_ref())
    }

    /// When the workflow's next occurrence may start: next_run_time plus
    /// its start offset (a pending retry has none).
    pub fn start_time(&self, workflow: &Workflow) -> Option<Millis> {
        let row = &workflow.branch_rule;
        row.next_run_time
            .map(|at| at + start_offset(self.rules.get(&row.rule_id), row))
    }

    pub fn len(&self) -> usize {
        self.workflows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.workflows.is_empty()
    }

    pub fn get(&self, id: &Uuid) -> Option<&Workflow> {
        self.workflows.get(id)
    }

    pub fn workflows(&self) -> impl Iterator<Item = &Workflow> {
        self.workflows.values()
    }

    pub fn branch(&self, id: &Uuid) -> Option<&Branch> {
        self.branches.get(id)
    }

    pub fn rule(&self, id: &Uuid) -> Option<&Rule> {
        self.rules.get(id)
    }

    pub fn brand(&self, id: &Uuid) -> Option<&Brand> {
        self.brands.get(id)
    }

    pub fn brand_rule(&self, id: &Uuid) -> Option<&BrandRule> {
        self.brand_rules.get(id)
    }

    pub fn action_template(&self, id: &Uuid) -> Option<&ActionTemplate> {
        self.action_templates.get(id)
    }

    /// Whether the cache holds every action detail of `branch_rule_id`.
    /// After a cut read, only the rules whose details it read, less the one
    /// it stopped in: the read's order is the database's text order, which
    /// is not the ids' order once an id was written in upper case, so no
    /// comparison with the cut can tell which rules came before it.
    pub fn has_all_action_details(&self, branch_rule_id: &Uuid) -> bool {
        self.action_details_cut_at.is_none_or(|cut| {
            *branch_rule_id != cut && self.action_details.contains_key(branch_rule_id)
        })
    }

    /// The cached action details of a branch rule, in position order.
    pub fn action_details(&self, branch_rule_id: &Uuid) -> &[ActionDetail] {
        self.action_details
            .get(branch_rule_id)
            .map_or(&[], Vec::as_slice)
    }

    /// Workflows the database still has (not marked missing).
    pub fn present_len(&self) -> usize {
        self.workflows.len() - self.missing
    }

    /// The rows kept out of the plan.
    pub fn quarantine(&self) -> &Quarantine {
        &self.quarantine
    }

    /// The first step of every refresh: takes the rows whose cron, zone or
    /// window is invalid out of `load` ([`screen`]), files them with the
    /// rows that did not decode, and stops running branch rules that are
    /// quarantined now (a delta leaves their last good version in place
    /// otherwise). Returns what entered and left the quarantine.
    pub fn quarantine_bad_rows(&mut self, load: &mut PlanLoad, now: Millis) -> QuarantineChange {
        let mut rejected: Vec<RejectedRow> = std::mem::take(&mut load.rejected);
        rejected.extend(screen(&mut load.data));
        let decoded = load.data.branch_rules.iter().map(|row| row.id);
        let change = self.quarantine.apply(rejected, decoded, load.data.scope);
        if !change.released.is_empty() {
            self.release_held_back();
        }
        let held: Vec<Uuid> = self.quarantine.branch_rule_ids().collect();
        for id in held {
            if self.get(&id).is_some_and(|w| w.missing_since.is_none()) {
                self.update(&id, |w| w.missing_since = Some(now));
            }
        }
        change
    }

    /// Branch rules in the table the plan does not hold: the quarantined
    /// ones. An incremental refresh adds them to the plan's size before
    /// comparing it with the table's.
    pub(crate) fn quarantined_branch_rules(&self) -> usize {
        self.quarantine.count(quarantine::BRANCH_RULES)
    }

    /// Inserts or replaces a workflow, keeping the due index in step.
    pub(crate) fn insert(&mut self, workflow: Workflow) {
        let id = workflow.id();
        self.changes.workflows.insert(id);
        let index_at = indexed_time(&self.rules, &workflow);
        self.missing += workflow.missing_since.is_some() as usize;
        if let Some(old) = self.workflows.insert(id, workflow) {
            self.forget(id, &old);
        }
        if let Some(at) = index_at {
            self.due_index.insert((at, id));
        }
    }

    pub(crate) fn remove(&mut self, id: &Uuid) -> Option<Workflow> {
        let workflow = self.workflows.remove(id)?;
        self.changes.workflows.insert(*id);
        self.forget(*id, &workflow);
        Some(workflow)
    }

    /// Drops the index entry and missing count of a workflow no longer held.
    fn forget(&mut self, id: Uuid, old: &Workflow) {
        if let Some(at) = self.index_key(id, old) {
            self.due_index.remove(&(at, id));
        }
        self.parked.remove(&id);
        self.missing -= old.missing_since.is_some() as usize;
    }

    /// Changes one workflow through `change`, re-indexing it afterwards.
    /// Returns false when the id is unknown.
    pub(crate) fn update(&mut self, id: &Uuid, change: impl FnOnce(&mut Workflow)) -> bool {
        let Some(workflow) = self.workflows.get_mut(id) else {
            return false;
        };
        self.changes.workflows.insert(*id);
        let before = self
            .parked
            .remove(id)
            .map(|parked| parked.until)
            .or_else(|| indexed_time(&self.rules, workflow));
        let was_missing = workflow.missing_since.is_some();
        change(workflow);
        let after = indexed_time(&self.rules, workflow);
        self.missing =
            self.missing + workflow.missing_since.is_some() as usize - was_missing as usize;
        if before != after {
            self.reindex(*id, before, after);
        }
        true
    }

    /// Where a workflow's entry sits in the due index: its indexed time, or
    /// the window opening it is parked at.
    fn index_key(&self, id: Uuid, workflow: &Workflow) -> Option<Millis> {
        let at = indexed_time(&self.rules, workflow)?;
        Some(self.parked.get(&id).map_or(at, |parked| parked.until))
    }

    /// Parks a due workflow waiting for its operation window until `until`,
    /// the window's next opening; `missed` when the window opened and
    /// closed again since it fell due.
    pub(crate) fn park(&mut self, id: Uuid, until: Millis, missed: bool) {
        let Some(at) = self.get(&id).and_then(|w| self.index_key(id, w)) else {
            return;
        };
        if until <= at {
            return;
        }
        self.due_index.remove(&(at, id));
        self.due_index.insert((until, id));
        self.parked.insert(id, Parked { until, missed });
    }

    /// Parks a due workflow that another row holds back ([`HELD_BACK`]).
    pub(crate) fn hold_back(&mut self, id: Uuid) {
        self.park(id, HELD_BACK, false);
    }

    /// Every workflow held back by another row back at its indexed time,
    /// for the next walk to check again.
    fn release_held_back(&mut self) {
        for id in self.parked.held_back() {
            if let Some(parked) = self.parked.remove(&id) {
                self.back_to_indexed_time(id, parked);
            }
        }
    }

    /// Every parked workflow back at its indexed time.
    fn unpark_all(&mut self) {
        for (id, parked) in self.parked.take() {
            self.back_to_indexed_time(id, parked);
        }
    }

    /// Moves the entry of a workflow no longer parked from its window
    /// opening back to its indexed time.
    fn back_to_indexed_time(&mut self, id: Uuid, parked: Parked) {
        self.due_index.remove(&(parked.until, id));
        if let Some(at) = self.get(&id).and_then(|w| indexed_time(&self.rules, w)) {
            self.due_index.insert((at, id));
        }
    }

    /// Parked workflows of `ownership` whose window was missed, not yet
    /// back in the due part of the index at `now`.
    pub(crate) fn parked_missed(&self, now: Millis, ownership: &Ownership) -> usize {
        self.parked
            .iter()
            .filter(|(id, parked)| parked.missed && parked.until > now && ownership.owns(id))
            .count()
    }

    /// The parked workflows whose window opened by `now`, back at their
    /// indexed time: a rule due at 09:00 that waited for 22:00 is again
    /// ahead of the ones due at 21:59, as it was before it was parked.
    pub(crate) fn unpark_opened(&mut self, now: Millis) {
        for id in self.parked.opened(now) {
            if let Some(parked) = self.parked.remove(&id) {
                self.back_to_indexed_time(id, parked);
            }
        }
    }

    /// Moves a workflow's due-index entry after its indexed time changed.
    pub(crate) fn reindex(&mut self, id: Uuid, before: Option<Millis>, after: Option<Millis>) {
        if let Some(at) = before {
            self.due_index.remove(&(at, id));
        }
        if let Some(at) = after {
            self.due_index.insert((at, id));
        }
    }

    /// Marks a workflow as running the moment a job is claimed, so no other
    /// fetch hands it out again (seed 000 "Marking jobs as running").
    pub fn mark_running(&mut self, id: &Uuid, now: Millis) -> bool {
        self.update(id, |w| {
            w.branch_rule.is_currently_running = true;
            w.running_here = true;
            w.locally_updated_at = Some(now);
        })
    }

    /// This instance's run of a workflow ended without a row from the
    /// database (its result was fenced out, its lock lost, or it was
    /// dropped unwritten): the workflow is no longer running here. The next
    /// refresh brings whatever the database says.
    pub fn run_ended_here(&mut self, id: &Uuid) -> bool {
        let running_here = self.get(id).is_some_and(|w| w.running_here);
        if running_here {
            self.update(id, |w| {
                w.running_here = false;
                w.branch_rule.is_currently_running = false;
            });
        }
        running_here
    }

    /// Takes the row the database returned after a job's post-process, so the
    /// local plan matches the database (seed 000 "After job completion").
    pub fn apply_post_process(&mut self, row: BranchRule, now: Millis) {
        let id = row.id;
        let mut workflow = self
            .workflows
            .get(&id)
            .cloned()
            .unwrap_or_else(|| Workflow::new(row.clone()));
        workflow.branch_rule = row;
        workflow.running_here = false;
        workflow.locally_updated_at = Some(now);
        self.insert(workflow);
    }

    /// Sets a next run computed locally (the database could not be updated).
    pub fn set_next_run_time(&mut self, id: &Uuid, next_run_time: Millis, now: Millis) -> bool {
        self.update(id, |w| {
            w.branch_rule.next_run_time = Some(next_run_time);
            w.locally_updated_at = Some(now);
        })
    }

    pub fn outbox(&self) -> &[OutboxEntry] {
        &self.outbox
    }

    /// Keeps a post-process write for later delivery. A second entry for the
    /// same execution replaces the first: only the latest outcome counts.
    pub fn add_to_outbox(&mut self, entry: OutboxEntry) {
        self.outbox
            .retain(|e| e.fence.execution_id != entry.fence.execution_id);
        self.outbox.push(entry);
        self.changes.outbox = true;
    }

    /// Drops a delivered (or fenced-out) entry; true if it was there.
    pub fn remove_from_outbox(&mut self, execution_id: &Uuid) -> bool {
        let before = self.outbox.len();
        self.outbox
            .retain(|e| e.fence.execution_id != *execution_id);
        let removed = self.outbox.len() != before;
        self.changes.outbox |= removed;
        removed
    }

    /// What changed since the last [`ExecutionPlan::take_delta`] or
    /// [`ExecutionPlan::forget_changes`].
    pub fn changes(&self) -> &PlanChanges {
        &self.changes
    }

    /// A workflow was changed in place (by the merge).
    pub(crate) fn note_changed(&mut self, id: Uuid) {
        self.changes.workflows.insert(id);
    }

    /// The changed workflows' states and the outbox if it changed, as
    /// journal write `seq`; the changes are then forgotten. Lookup-table
    /// changes are not in a delta: the caller writes a snapshot for those.
    pub fn take_delta(&mut self, seq: u64, saved_at: Millis) -> PlanDelta {
        let changes = std::mem::take(&mut self.changes);
        PlanDelta {
            seq,
            saved_at,
            workflows: changes
                .workflows
                .into_iter()
                .map(|id| (id, self.workflows.get(&id).cloned()))
                .collect(),
            outbox: changes.outbox.then(|| self.outbox.clone()),
        }
    }

    /// A snapshot holds everything: nothing is pending any more.
    pub fn forget_changes(&mut self) {
        self.changes = PlanChanges::default();
    }

    /// Crash recovery: nothing runs in a process that has just started.
    /// Returns how many flags were reset.
    pub fn reset_running_flags(&mut self) -> usize {
        let running: Vec<Uuid> = self
            .workflows
            .values()
            .filter(|w| w.branch_rule.is_currently_running)
            .map(Workflow::id)
            .collect();
        for id in &running {
            self.update(id, |w| {
                w.branch_rule.is_currently_running = false;
                w.running_here = false;
            });
        }
        running.len()
    }

    /// Ids whose next_run_time is at or before `now`, in (next_run_time, id)
    /// order: the candidates of the ready filter.
    pub(crate) fn due_ids(&self, now: Millis) -> impl Iterator<Item = Uuid> + '_ {
        self.due_index
            .range(..=(now, Uuid::max()))
            .map(|&(_, id)| id)
    }

    /// The earliest next_run_time in the index, for the master's wake-up.
    pub fn earliest_due(&self) -> Option<Millis> {
        self.due_index
            .first()
            .map(|&(at, _)| at)
            .filter(|&at| at != HELD_BACK)
    }

    pub fn stats(&self, now: Millis) -> PlanStats {
        let mut stats = PlanStats {
            workflows: self.workflows.len(),
            // A parked workflow is due, only waiting for its window.
            due: self.due_index.range(..=(now, Uuid::max())).count()
                + self.parked.iter().filter(|(_, p)| p.until > now).count(),
            branches: self.branches.len(),
            rules: self.rules.len(),
            brands: self.brands.len(),
            action_templates: self.action_templates.len(),
            action_details: self.action_details.values().map(Vec::len).sum(),
            ..PlanStats::default()
        };
        for workflow in self.workflows.values() {
            let row = &workflow.branch_rule;
            if workflow.missing_since.is_some() {
                stats.removed += 1;
            } else if row.is_currently_running {
                stats.running += 1;
            } else if row.is_active && !row.is_archived && self.is_held(workflow) {
                stats.held += 1;
            } else if row.is_active && !row.is_archived {
                stats.active += 1;
            } else {
                stats.inactive += 1;
            }
        }
        stats
    }

    /// Held for a quarantined row, a missing branch or rule, or a next run
    /// that could not be computed (see [`NotReady::is_held`]), whatever
    /// the time.
    fn is_held(&self, workflow: &Workflow) -> bool {
        let row = &workflow.branch_rule;
        row.next_run_time.is_none()
            || !self.branches.contains_key(&row.branch_id)
            || !self.rules.contains_key(&row.rule_id)
            || (!self.quarantine.is_empty() && self.quarantined_dependency(workflow).is_some())
    }

    pub(crate) fn next_generation(&mut self) -> u64 {
        self.merge_generation += 1;
        self.merge_generation
    }
}

/// Only workflows that could become ready without a change are indexed:
/// archived, inactive, force-stopped, removed and running ones would only
/// lengthen the walk (a burst of claimed jobs would be walked past on
/// every fetch until they finish).
///
/// Where a workflow sits in the due index: when it may start (its
/// next_run_time plus its start offset), while it could run at all.
pub(crate) fn indexed_time(rules: &HashMap<Uuid, Rule>, workflow: &Workflow) -> Option<Millis> {
    let row = &workflow.branch_rule;
    let could_run = row.is_active
        && !row.is_archived
        && !row.is_force_stopped
        && !row.is_currently_running
        && workflow.missing_since.is_none();
    let at = row.next_run_time.filter(|_| could_run)?;
    Some(at + start_offset(rules.get(&row.rule_id), row))
}

/// The start offset (`start_jitter_seconds`) of a branch rule's
/// occurrences; a pending retry keeps its own time.
pub(crate) fn start_offset(rule: Option<&Rule>, row: &BranchRule) -> Millis {
    if row.retry_of.is_some() {
        return 0;
    }
    let rule_policy = rule.and_then(|r| r.policy.as_ref());
    if rule_policy.is_none() && row.policy.is_none() {
        return 0;
    }
    EffectivePolicy::resolve(rule_policy, row.policy.as_ref()).jitter_ms(&row.id)
}

fn start_jitter(rule: &Rule) -> Option<u64> {
    rule.policy
        .as_ref()
        .and_then(|p| p.start_jitter_seconds)
        .map(|s| s.get())
}

fn sorted_values<T: Clone>(map: &HashMap<Uuid, T>, id: impl Fn(&T) -> Uuid) -> Vec<T> {
    let mut values: Vec<T> = map.values().cloned().collect();
    values.sort_by_key(|v| id(v));
    values
}

#[cfg(test)]
pub(crate) mod fixtures;
