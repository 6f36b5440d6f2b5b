//! The plan file as a snapshot plus a journal of changes. Pure: the plan
//! records what changed, [`PlanDelta`] carries it to the writer, and
//! [`PlanSnapshot::apply`] replays it when the file is read back.
//!
//! Writing the whole plan after every finished job costs bytes in
//! proportion to the plan: at a million rules, half a gigabyte a second.
//! A delta holds only the workflows that changed (their whole new state,
//! or their removal) and the outbox when it changed, so a finished job
//! costs a few hundred bytes. Each delta carries a sequence number; a
//! snapshot records the last one it includes, so replaying a journal over
//! a newer snapshot skips what the snapshot already holds.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{OutboxEntry, PlanSnapshot, Workflow};
use crate::model::Millis;

/// What changed in the plan since the last write was taken.
#[derive(Debug, Clone, Default)]
pub struct PlanChanges {
    /// Workflows inserted, changed or removed.
    pub workflows: HashSet<Uuid>,
    /// The lookup tables (brands, branches, rules, brand rules, templates,
    /// action details) changed: only a snapshot records those.
    pub tables: bool,
    pub outbox: bool,
}

impl PlanChanges {
    pub fn is_empty(&self) -> bool {
        self.workflows.is_empty() && !self.tables && !self.outbox
    }
}

/// The changes of one or more plan writes, as one journal line.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PlanDelta {
    /// The sequence number of the newest write folded in.
    pub seq: u64,
    pub saved_at: Millis,
    /// Each changed workflow's state now; `None` once it left the plan.
    pub workflows: BTreeMap<Uuid, Option<Workflow>>,
    /// The whole outbox, when it changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outbox: Option<Vec<OutboxEntry>>,
}

impl PlanDelta {
    /// Folds a later delta in: its states replace this one's. A folded
    /// delta holds the newest state of every workflow either touched, so
    /// it may be replayed over any snapshot older than its `seq`.
    pub fn absorb(&mut self, later: PlanDelta) {
        self.seq = later.seq;
        self.saved_at = later.saved_at;
        self.workflows.extend(later.workflows);
        if later.outbox.is_some() {
            self.outbox = later.outbox;
        }
    }

    /// Workflow states (and removals) it carries.
    pub fn len(&self) -> usize {
        self.workflows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.workflows.is_empty() && self.outbox.is_none()
    }

    pub fn to_json_line(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).expect("plan delta serializes");
        line.push(b'\n');
        line
    }
}

impl PlanSnapshot {
    /// Replays `deltas` in order. Returns how many were applied: those not
    /// newer than the snapshot (`seq <= journal_seq`) are skipped.
    pub fn apply(&mut self, deltas: impl IntoIterator<Item = PlanDelta>) -> usize {
        let mut by_id: Option<HashMap<Uuid, Workflow>> = None;
        let mut applied = 0;
        for delta in deltas {
            if delta.seq <= self.journal_seq {
                continue;
            }
            let workflows = by_id.get_or_insert_with(|| {
                std::mem::take(&mut self.workflows)
                    .into_iter()
                    .map(|w| (w.id(), w))
                    .collect()
            });
            for (id, state) in delta.workflows {
                match state {
                    Some(workflow) => workflows.insert(id, workflow),
                    None => workflows.remove(&id),
                };
            }
            if let Some(outbox) = delta.outbox {
                self.outbox = outbox;
            }
            self.journal_seq = delta.seq;
            self.saved_at = self.saved_at.max(delta.saved_at);
            applied += 1;
        }
        if let Some(workflows) = by_id {
            self.workflows = workflows.into_values().collect();
            self.workflows.sort_by_key(Workflow::id);
        }
        applied
    }
}

/// A journal's lines, parsed. A line cut short by a crash in the middle of
/// an append can only be the last: it is dropped, and `torn` says so. A
/// bad line with whole lines after it is not a torn append (each append
/// cuts a partial line back first) but damage: it is skipped, its number
/// kept in `corrupt`, and the lines after it still apply, since each holds
/// the whole state of what it touched.
#[derive(Debug, Default)]
pub struct JournalRead {
    pub deltas: Vec<PlanDelta>,
    pub torn: bool,
    /// 1-based line numbers of bad lines before the last.
    pub corrupt: Vec<usize>,
}

pub fn parse_journal(bytes: &[u8]) -> JournalRead {
    let mut read = JournalRead::default();
    let lines: Vec<(usize, &[u8])> = bytes
        .split(|b| *b == b'\n')
        .enumerate()
        .filter(|(_, line)| !line.iter().all(u8::is_ascii_whitespace))
        .collect();
    let last = lines.len().saturating_sub(1);
    for (position, (index, line)) in lines.into_iter().enumerate() {
        match serde_json::from_slice::<PlanDelta>(line) {
            Ok(delta) => read.deltas.push(delta),
            Err(_) if position == last => read.torn = true,
            Err(_) => read.corrupt.push(index + 1),
        }
    }
    read
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::fixtures::*;

    fn workflow(n: u128, next_run: Millis) -> Workflow {
        let (branch, rule) = (Uuid::from_u128(0xB), Uuid::from_u128(0xC));
        Workflow::new(branch_rule(Uuid::from_u128(n), branch, rule, next_run))
    }

    fn delta(seq: u64, changes: &[(u128, Option<Millis>)]) -> PlanDelta {
        PlanDelta {
            seq,
            saved_at: seq as Millis,
            workflows: changes
                .iter()
                .map(|&(n, at)| (Uuid::from_u128(n), at.map(|at| workflow(n, at))))
                .collect(),
            outbox: None,
        }
    }

    fn next_runs(snapshot: &PlanSnapshot) -> Vec<(u128, Option<Millis>)> {
        snapshot
            .workflows
            .iter()
            .map(|w| (w.id().as_u128(), w.branch_rule.next_run_time))
            .collect()
    }

    #[test]
    fn replay_applies_changes_and_removals_in_order() {
        let mut snapshot = PlanSnapshot {
            workflows: vec![workflow(1, 10), workflow(2, 20)],
            journal_seq: 3,
            ..PlanSnapshot::default()
        };
        let applied = snapshot.apply([
            delta(2, &[(1, Some(999))]),
            delta(4, &[(1, Some(11)), (3, Some(30))]),
            delta(5, &[(2, None), (1, Some(12))]),
        ]);
        assert_eq!(applied, 2, "the delta the snapshot holds is skipped");
        assert_eq!(next_runs(&snapshot), vec![(1, Some(12)), (3, Some(30))]);
        assert_eq!(snapshot.journal_seq, 5);
    }

    #[test]
    fn a_folded_delta_replays_to_the_same_plan_as_its_parts() {
        let base = PlanSnapshot {
            workflows: vec![workflow(1, 10), workflow(2, 20)],
            ..PlanSnapshot::default()
        };
        let parts = vec![
            delta(1, &[(1, Some(11))]),
            delta(2, &[(2, None), (3, Some(30))]),
            delta(3, &[(1, Some(12)), (2, Some(21))]),
        ];
        let mut one_by_one = base.clone();
        one_by_one.apply(parts.clone());
        let mut folded = parts[0].clone();
        for part in parts[1..].iter().cloned() {
            folded.absorb(part);
        }
        let mut at_once = base;
        at_once.apply([folded]);
        assert_eq!(at_once, one_by_one);
    }

    #[test]
    fn the_outbox_is_replaced_only_by_deltas_that_carry_it() {
        let entry = outbox_entry(Uuid::from_u128(7));
        let mut snapshot = PlanSnapshot::default();
        let mut with_outbox = delta(1, &[]);
        with_outbox.outbox = Some(vec![entry.clone()]);
        snapshot.apply([with_outbox, delta(2, &[(1, Some(5))])]);
        assert_eq!(snapshot.outbox, vec![entry]);
        let mut emptied = delta(3, &[]);
        emptied.outbox = Some(Vec::new());
        snapshot.apply([emptied]);
        assert!(snapshot.outbox.is_empty());
    }

    #[test]
    fn a_torn_last_line_is_dropped() {
        let mut bytes = delta(1, &[(1, Some(5))]).to_json_line();
        bytes.extend(delta(2, &[(2, Some(6))]).to_json_line());
        let whole = parse_journal(&bytes);
        assert_eq!((whole.deltas.len(), whole.torn), (2, false));
        let cut = bytes.len() - 20;
        let torn = parse_journal(&bytes[..cut]);
        assert_eq!((torn.deltas.len(), torn.torn), (1, true));
        assert_eq!(torn.deltas[0].seq, 1);
    }

    #[test]
    fn a_damaged_line_before_the_last_is_skipped_and_the_rest_applies() {
        let mut bytes = delta(1, &[(1, Some(5))]).to_json_line();
        bytes.extend(b"{\"seq\": 2, garbage\n");
        bytes.extend(delta(3, &[(2, Some(6))]).to_json_line());
        let read = parse_journal(&bytes);
        assert!(!read.torn);
        assert_eq!(read.corrupt, vec![2]);
        let seqs: Vec<u64> = read.deltas.iter().map(|d| d.seq).collect();
        assert_eq!(seqs, vec![1, 3]);
    }
}
