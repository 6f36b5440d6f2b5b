//! The plan as an operator browses it: one summary per workflow with its
//! names, schedule, next run in UTC and local time, and the verdict `ruled
//! plan` prints, filtered and paged. The console's Rules page and
//! `GET /api/v1/plan/workflows` read it; `ruled plan` shares the verdict, so
//! the three cannot disagree on why a rule does not run. Pure: no I/O.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use chrono_tz::Tz;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{ExecutionPlan, NotReady, Workflow, check_ready, decide_due, job_spec};
use crate::clock::millis_to_utc;
use crate::cluster::PartitionOwners;
use crate::model::Millis;
use crate::schedule::ScheduleCache;

/// Where a workflow stands now, coarser than its verdict: what an operator
/// filters by.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum RuleState {
    /// Runs at the next tick.
    Ready,
    /// Waits for its time, its window, its start offset or its retry.
    Waiting,
    Running,
    /// Inactive, archived, or its branch or rule is.
    Inactive,
    ForceStopped,
    /// Needs an operator: a quarantined row, no next run, a bad zone, or a
    /// partition nobody holds.
    Held,
}

impl RuleState {
    pub const ALL: [RuleState; 6] = [
        RuleState::Ready,
        RuleState::Waiting,
        RuleState::Running,
        RuleState::Inactive,
        RuleState::ForceStopped,
        RuleState::Held,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RuleState::Ready => "ready",
            RuleState::Waiting => "waiting",
            RuleState::Running => "running",
            RuleState::Inactive => "inactive",
            RuleState::ForceStopped => "force_stopped",
            RuleState::Held => "held",
        }
    }

    fn of(reason: &NotReady) -> RuleState {
        match reason {
            NotReady::CurrentlyRunning => RuleState::Running,
            NotReady::ForceStopped => RuleState::ForceStopped,
            NotReady::RemovedFromDatabase
            | NotReady::Inactive
            | NotReady::Archived
            | NotReady::BranchInactive
            | NotReady::RuleInactive => RuleState::Inactive,
            NotReady::BranchMissing | NotReady::RuleMissing => RuleState::Held,
            reason if reason.is_held() => RuleState::Held,
            _ => RuleState::Waiting,
        }
    }
}

/// A workflow's state and the sentence that explains it, as `ruled plan`
/// prints it: "READY", "READY: runs the occurrence at …", or
/// "not ready: …". `owner` is the rule's partition and the instance that
/// holds it, when known; a rule nobody's lease covers runs nowhere.
pub fn verdict(
    plan: &ExecutionPlan,
    workflow: &Workflow,
    now: Millis,
    default_zone: Tz,
    owner: Option<(u32, Option<&str>)>,
) -> (RuleState, String) {
    match (check_ready(plan, workflow, now, default_zone), owner) {
        (Err(reason), _) => (RuleState::of(&reason), format!("not ready: {reason}")),
        (Ok(()), Some((partition, None))) => (
            RuleState::Held,
            format!("not ready: partition {partition} has no live owner"),
        ),
        (Ok(()), _) => ready_verdict(plan, workflow, now, default_zone),
    }
}

/// READY, and what the misfire policy does with the due occurrences when
/// more than the plain one is due.
fn ready_verdict(
    plan: &ExecutionPlan,
    workflow: &Workflow,
    now: Millis,
    default_zone: Tz,
) -> (RuleState, String) {
    let ready = |text: String| (RuleState::Ready, text);
    let mut schedules = ScheduleCache::default();
    let Some(spec) = job_spec(plan, &workflow.id(), default_zone, &mut schedules) else {
        return ready("READY".to_string());
    };
    let row = &spec.branch_rule;
    let (Some(due), Some(cadence)) = (row.next_run_time, spec.cadence()) else {
        return ready("READY".to_string());
    };
    let decision = decide_due(&cadence, due, row.retry_of, now);
    if decision.is_plain(due) {
        return ready(match row.retry_of {
            Some(occurrence) if row.failed_attempts == 0 => format!(
                "READY: the occurrence at {} is owed its run (lost or buffered)",
                millis_to_utc(occurrence).to_rfc3339()
            ),
            Some(occurrence) => format!(
                "READY: attempt {} of the occurrence at {}",
                row.failed_attempts.saturating_add(1),
                millis_to_utc(occurrence).to_rfc3339()
            ),
            None => "READY".to_string(),
        });
    }
    let skipped = match decision.skipped.first() {
        Some(first) => format!(
            "{} missed occurrence(s) are recorded skipped ({}: {})",
            decision.skipped.len(),
            first.reason,
            first.detail
        ),
        None => "nothing is skipped".to_string(),
    };
    match decision.run {
        Some(run) => ready(format!(
            "READY: runs the occurrence at {}; {skipped}",
            millis_to_utc(run).to_rfc3339()
        )),
        None => (
            RuleState::Waiting,
            format!(
                "not ready: misfire {}: {skipped}",
                cadence.policy.misfire.as_str()
            ),
        ),
    }
}

/// What a browse keeps. Every filter is optional; they combine with AND.
#[derive(Debug, Clone, Default)]
pub struct BrowseQuery {
    pub brand_id: Option<Uuid>,
    pub branch_id: Option<Uuid>,
    pub state: Option<RuleState>,
    /// Case-insensitive part of the rule's, branch's or brand's name.
    pub search: Option<String>,
    /// Only these workflows (a page of executions names its rules).
    pub ids: Option<Vec<Uuid>>,
    pub limit: usize,
    /// The sort key of the last row of the previous page.
    pub after: Option<BrowseKey>,
    /// Soonest next run first (the decision log), instead of by name.
    pub by_next_run: bool,
}

/// The order of a browse: brand, branch and rule name, then id, so pages
/// are stable while names do not change and the id breaks ties; by next
/// run, `first` leads (0 when ordering by name).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BrowseKey {
    pub first: Millis,
    pub brand: String,
    pub branch: String,
    pub rule: String,
    pub id: Uuid,
}

impl BrowseKey {
    /// The cursor a client sends back: the key's fields joined by NUL (which
    /// no name holds) as a [`crate::cursor`].
    pub fn to_cursor(&self) -> String {
        let text = format!(
            "{:020}\0{}\0{}\0{}\0{}",
            // Offset so the digits sort like the numbers, negatives too.
            (self.first as i128 - i64::MIN as i128),
            self.brand,
            self.branch,
            self.rule,
            self.id
        );
        crate::cursor::encode(text.as_bytes())
    }

    /// Any even run of hex digits is a place in the order, as the catalog's
    /// cursors are: what is not a key this API made sorts where its parts
    /// put it, so a cursor never fails for what it holds.
    pub fn from_cursor(cursor: &str) -> Option<BrowseKey> {
        let bytes = crate::cursor::decode(cursor)?;
        let text = String::from_utf8_lossy(&bytes);
        let mut parts = text.split('\0');
        let mut next = || parts.next().unwrap_or_default().to_string();
        let first = next()
            .parse::<i128>()
            .map(|offset| {
                (offset + i64::MIN as i128).clamp(i64::MIN as i128, i64::MAX as i128) as i64
            })
            .unwrap_or(i64::MIN);
        Some(BrowseKey {
            first,
            brand: next(),
            branch: next(),
            rule: next(),
            id: Uuid::parse_str(&next()).unwrap_or(Uuid::nil()),
        })
    }
}

/// One workflow as the Rules page shows it (`GET /api/v1/plan/workflows`):
/// names, schedule, the next run in UTC and on the branch's clock, and the
/// verdict `ruled plan` prints for it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct RuleSummary {
    /// The branch rule's id.
    pub id: Uuid,
    pub brand_id: Option<Uuid>,
    pub brand: Option<String>,
    pub branch_id: Uuid,
    pub branch: Option<String>,
    pub rule_id: Uuid,
    pub rule: Option<String>,
    /// The IANA zone the schedule is evaluated in (the branch's, else the
    /// default).
    pub zone: String,
    pub cron_expression: Option<String>,
    /// `HH:MM-HH:MM` on the branch's clock, when the rule has a window.
    pub window: Option<String>,
    pub is_active: bool,
    pub is_force_stopped: bool,
    pub is_running: bool,
    #[serde(serialize_with = "crate::clock::serialize_rfc3339")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub last_run_time: Option<Millis>,
    #[serde(serialize_with = "crate::clock::serialize_rfc3339")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub next_run_time: Option<Millis>,
    /// The next run on the branch's wall clock as `ruled plan` prints it:
    /// `2027-01-15 03:00 EST`.
    pub next_run_local: Option<String>,
    pub state: RuleState,
    /// "READY", or "not ready: why", as `ruled plan` says it.
    pub verdict: String,
    pub partition: Option<u32>,
    pub partition_owner: Option<String>,
}

/// One page of a browse, with how many workflows matched the filters and,
/// for the filter's choices, how many of those (before the state filter)
/// are in each state.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct BrowsePage {
    pub items: Vec<RuleSummary>,
    /// Pass as `cursor` for the next page; `null` on the last.
    pub next_cursor: Option<String>,
    pub matched: usize,
    #[schema(value_type = std::collections::BTreeMap<String, usize>)]
    pub states: BTreeMap<RuleState, usize>,
}

/// Filters, sorts and pages the plan's workflows. Costs one readiness
/// check per workflow that passes the name filters (a few microseconds
/// each) and a summary per row of the page.
pub fn browse(
    plan: &ExecutionPlan,
    now: Millis,
    default_zone: Tz,
    owners: Option<&PartitionOwners>,
    query: &BrowseQuery,
) -> BrowsePage {
    let needle = query.search.as_deref().map(str::to_lowercase);
    let owner_of = |workflow: &Workflow| owners.map(|owners| owners.of(&workflow.id()));
    let mut states = BTreeMap::new();
    let mut matched: Vec<(BrowseKey, &Workflow, RuleState, String)> = Vec::new();
    for workflow in plan.workflows() {
        let row = &workflow.branch_rule;
        if query.ids.as_ref().is_some_and(|ids| !ids.contains(&row.id))
            || query.branch_id.is_some_and(|id| id != row.branch_id)
        {
            continue;
        }
        let branch = plan.branch(&row.branch_id);
        if query.brand_id.is_some() && branch.map(|b| b.brand_id) != query.brand_id {
            continue;
        }
        let key = key_of(plan, workflow, query.by_next_run);
        if let Some(needle) = &needle
            && ![&key.brand, &key.branch, &key.rule]
                .iter()
                .any(|name| name.to_lowercase().contains(needle))
        {
            continue;
        }
        let (state, text) = verdict(plan, workflow, now, default_zone, owner_of(workflow));
        *states.entry(state).or_insert(0) += 1;
        if query.state.is_some_and(|wanted| wanted != state) {
            continue;
        }
        matched.push((key, workflow, state, text));
    }
    let total = matched.len();
    matched.sort_by(|a, b| a.0.cmp(&b.0));
    let start = match &query.after {
        Some(after) => matched.partition_point(|(key, ..)| key.cmp(after) != Ordering::Greater),
        None => 0,
    };
    let page: Vec<_> = matched.into_iter().skip(start).collect();
    let has_more = page.len() > query.limit;
    let mut last_key = None;
    let items = page
        .into_iter()
        .take(query.limit)
        .map(|(key, workflow, state, verdict)| {
            last_key = Some(key);
            summary(
                plan,
                workflow,
                default_zone,
                owner_of(workflow),
                state,
                verdict,
            )
        })
        .collect();
    BrowsePage {
        items,
        next_cursor: last_key.filter(|_| has_more).map(|key| key.to_cursor()),
        matched: total,
        states,
    }
}

fn key_of(plan: &ExecutionPlan, workflow: &Workflow, by_next_run: bool) -> BrowseKey {
    let row = &workflow.branch_rule;
    let branch = plan.branch(&row.branch_id);
    BrowseKey {
        // Unscheduled last, as `ruled plan` lists them.
        first: match by_next_run {
            true => row.next_run_time.unwrap_or(Millis::MAX),
            false => 0,
        },
        brand: branch
            .and_then(|b| plan.brand(&b.brand_id))
            .map(|b| b.name.clone())
            .unwrap_or_default(),
        branch: branch.map(|b| b.name.clone()).unwrap_or_default(),
        rule: plan
            .rule(&row.rule_id)
            .map(|r| r.name.clone())
            .unwrap_or_default(),
        id: row.id,
    }
}

fn summary(
    plan: &ExecutionPlan,
    workflow: &Workflow,
    default_zone: Tz,
    owner: Option<(u32, Option<&str>)>,
    state: RuleState,
    verdict: String,
) -> RuleSummary {
    let row = &workflow.branch_rule;
    let branch = plan.branch(&row.branch_id);
    let brand = branch.and_then(|b| plan.brand(&b.brand_id));
    let rule = plan.rule(&row.rule_id);
    let zone = plan.zone_of(workflow, default_zone).ok();
    let zone_name = match (zone, branch.and_then(|b| b.timezone.as_deref())) {
        (Some(zone), _) => zone.name().to_string(),
        // An unknown zone is shown as written: it is the reason it is held.
        (None, Some(written)) => written.to_string(),
        (None, None) => default_zone.name().to_string(),
    };
    let window = match (row.operation_time_from, row.operation_time_to) {
        (Some(from), Some(to)) => Some(format!("{from}-{to}")),
        _ => None,
    };
    RuleSummary {
        id: row.id,
        brand_id: branch.map(|b| b.brand_id),
        brand: brand.map(|b| b.name.clone()),
        branch_id: row.branch_id,
        branch: branch.map(|b| b.name.clone()),
        rule_id: row.rule_id,
        rule: rule.map(|r| r.name.clone()),
        zone: zone_name,
        cron_expression: rule.map(|r| r.cron_expression.clone()),
        window,
        is_active: row.is_active,
        is_force_stopped: row.is_force_stopped,
        is_running: row.is_currently_running,
        last_run_time: row.last_run_time,
        next_run_time: row.next_run_time,
        next_run_local: row
            .next_run_time
            .zip(zone)
            .map(|(ms, zone)| local_text(ms, zone)),
        state,
        verdict,
        partition: owner.map(|(partition, _)| partition),
        partition_owner: owner.and_then(|(_, holder)| holder.map(str::to_string)),
    }
}

/// A time on a zone's wall clock as `ruled plan` prints it:
/// `2027-01-15 03:00 EST`.
pub fn local_text(ms: Millis, zone: Tz) -> String {
    millis_to_utc(ms)
        .with_timezone(&zone)
        .format("%Y-%m-%d %H:%M %Z")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::fixtures::Fixture;

    const NOW: Millis = 1_800_000_000_000;

    fn query(limit: usize) -> BrowseQuery {
        BrowseQuery {
            limit,
            ..BrowseQuery::default()
        }
    }

    #[test]
    fn a_due_rule_is_ready_and_shows_its_local_time() {
        let mut fixture = Fixture::due(NOW);
        fixture.branch.timezone = Some("America/New_York".into());
        let plan = fixture.plan();
        let page = browse(&plan, NOW, chrono_tz::UTC, None, &query(10));
        assert_eq!(page.matched, 1);
        let item = &page.items[0];
        assert_eq!(item.state, RuleState::Ready);
        assert_eq!(item.verdict, "READY");
        assert_eq!(item.zone, "America/New_York");
        assert_eq!(item.next_run_local.as_deref(), Some("2027-01-15 03:00 EST"));
        assert_eq!(page.states.get(&RuleState::Ready), Some(&1));
        assert!(page.next_cursor.is_none());
    }

    #[test]
    fn states_follow_the_not_ready_reason() {
        let mut fixture = Fixture::due(NOW);
        fixture.branch_rule.is_force_stopped = true;
        let page = browse(&fixture.plan(), NOW, chrono_tz::UTC, None, &query(10));
        assert_eq!(page.items[0].state, RuleState::ForceStopped);
        assert_eq!(page.items[0].verdict, "not ready: is_force_stopped is true");

        let mut fixture = Fixture::due(NOW);
        fixture.branch.is_active = false;
        let page = browse(&fixture.plan(), NOW, chrono_tz::UTC, None, &query(10));
        assert_eq!(page.items[0].state, RuleState::Inactive);

        let fixture = Fixture::due(NOW + 60_000);
        let page = browse(&fixture.plan(), NOW, chrono_tz::UTC, None, &query(10));
        assert_eq!(page.items[0].state, RuleState::Waiting);

        let unowned = PartitionOwners {
            count: 2,
            owners: vec![None; 2],
        };
        let page = browse(
            &Fixture::due(NOW).plan(),
            NOW,
            chrono_tz::UTC,
            Some(&unowned),
            &query(10),
        );
        assert_eq!(page.items[0].state, RuleState::Held);
        assert!(page.items[0].verdict.contains("has no live owner"));
    }

    #[test]
    fn filters_combine_and_the_state_filter_keeps_the_counts() {
        let plan = Fixture::many(NOW, 5);
        let all = browse(&plan, NOW, chrono_tz::UTC, None, &query(100));
        assert_eq!(all.matched, 5);
        let waiting = browse(
            &plan,
            NOW,
            chrono_tz::UTC,
            None,
            &BrowseQuery {
                state: Some(RuleState::Waiting),
                ..query(100)
            },
        );
        assert_eq!(waiting.matched, 0);
        assert_eq!(waiting.states, all.states);
        let one = all.items[2].id;
        let by_id = browse(
            &plan,
            NOW,
            chrono_tz::UTC,
            None,
            &BrowseQuery {
                ids: Some(vec![one]),
                ..query(100)
            },
        );
        assert_eq!(by_id.items.len(), 1);
        assert_eq!(by_id.items[0].id, one);
        let searched = browse(
            &plan,
            NOW,
            chrono_tz::UTC,
            None,
            &BrowseQuery {
                search: Some("NO SUCH".into()),
                ..query(100)
            },
        );
        assert_eq!(searched.matched, 0);
    }

    #[test]
    fn cursors_page_through_every_row_once() {
        let plan = Fixture::many(NOW, 7);
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let page = browse(
                &plan,
                NOW,
                chrono_tz::UTC,
                None,
                &BrowseQuery {
                    after: after.clone(),
                    ..query(3)
                },
            );
            seen.extend(page.items.iter().map(|item| item.id));
            match page.next_cursor {
                Some(cursor) => after = Some(BrowseKey::from_cursor(&cursor).unwrap()),
                None => break,
            }
        }
        let mut expected: Vec<Uuid> = plan.workflows().map(|w| w.id()).collect();
        expected.sort();
        assert_eq!(seen, expected, "same names: the id orders them");
        let mut soonest_first = BrowseQuery {
            by_next_run: true,
            ..query(100)
        };
        let mut late = Fixture::many(NOW, 3);
        let last = Uuid::from_u128(0xC000);
        late.set_next_run_time(&last, NOW + 60_000, NOW);
        let ordered = browse(&late, NOW, chrono_tz::UTC, None, &soonest_first);
        assert_eq!(ordered.items.last().map(|item| item.id), Some(last));
        soonest_first.limit = 2;
        let first_page = browse(&late, NOW, chrono_tz::UTC, None, &soonest_first);
        soonest_first.after = first_page
            .next_cursor
            .as_deref()
            .and_then(BrowseKey::from_cursor);
        let second_page = browse(&late, NOW, chrono_tz::UTC, None, &soonest_first);
        assert_eq!(second_page.items.len(), 1);
        assert_eq!(second_page.items[0].id, last);
        assert_eq!(BrowseKey::from_cursor("zz"), None);
        assert_eq!(BrowseKey::from_cursor("abc"), None);
        // Hex that no page made is still a place in the order.
        let anywhere = BrowseKey::from_cursor("00").unwrap();
        assert_eq!(anywhere.first, i64::MIN);
        let key = BrowseKey {
            first: -5,
            brand: "b".into(),
            branch: "r".into(),
            rule: "x".into(),
            id: Uuid::from_u128(7),
        };
        assert_eq!(BrowseKey::from_cursor(&key.to_cursor()), Some(key));
    }
}
