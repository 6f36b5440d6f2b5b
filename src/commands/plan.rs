//! `ruled plan`: the seed's "rules not being picked up" checklist, answered
//! by the tool. Loads the plan the way the service does and says, for each
//! workflow, when it runs next and what holds it back.

use chrono_tz::Tz;
use uuid::Uuid;

use super::CommandError;
use crate::clock::millis_to_utc;
use crate::cluster::PartitionOwners;
use crate::config::Config;
use crate::model::Millis;
use crate::persist::read_plan_file;
use crate::plan::{ExecutionPlan, check_ready, local_text, verdict};
use crate::schedule::EffectivePolicy;
use crate::store::Store;

/// Where the listed plan came from.
#[derive(Debug, Clone, PartialEq)]
pub enum PlanSource {
    Database,
    /// The database failed; the plan file saved at this time was used.
    PlanFile {
        saved_at: Millis,
        database_error: String,
    },
}

/// The database first, as the first refresh does; the plan file when the
/// database cannot be read, with running flags reset as at start-up.
/// With it, who holds each rule's partition (`None` when the plan came from
/// the file: nobody could be asked).
pub async fn load_plan(
    config: &Config,
) -> Result<(ExecutionPlan, PlanSource, Option<PartitionOwners>), CommandError> {
    let from_database = async {
        let store = Store::connect(&config.database_url).await?;
        // Bad rows are set aside and listed, as the service quarantines them.
        let data = store.load_plan(config.plan_action_details_cap, None).await;
        let owners = store
            .partition_owners(config.partition_count, &config.instance_id)
            .await;
        store.close().await;
        Ok::<_, crate::store::StoreError>((data?, owners?))
    }
    .await;
    match from_database {
        Ok((data, owners)) => Ok((
            ExecutionPlan::from_load(data),
            PlanSource::Database,
            Some(owners),
        )),
        Err(database_error) => match read_plan_file(&config.plan_file)? {
            Some(snapshot) => {
                let saved_at = snapshot.saved_at;
                let mut plan = ExecutionPlan::from_snapshot(snapshot);
                plan.reset_running_flags();
                Ok((
                    plan,
                    PlanSource::PlanFile {
                        saved_at,
                        database_error: database_error.to_string(),
                    },
                    None,
                ))
            }
            None => Err(CommandError::NoPlan {
                database: database_error.to_string(),
                plan_file: config.plan_file.display().to_string(),
            }),
        },
    }
}

/// One line per workflow, ordered by (next_run_time, id), unscheduled last,
/// with the instance that holds its partition when `owners` is known. A
/// rule nobody's partition lease covers is not ready anywhere, and says so.
pub fn plan_lines(
    plan: &ExecutionPlan,
    now: Millis,
    default_zone: Tz,
    owners: Option<&PartitionOwners>,
) -> Vec<String> {
    let mut workflows: Vec<_> = plan.workflows().collect();
    workflows.sort_by_key(|w| (w.branch_rule.next_run_time.unwrap_or(Millis::MAX), w.id()));
    let ready_count = workflows
        .iter()
        .filter(|w| check_ready(plan, w, now, default_zone).is_ok())
        .count();
    let mut lines = vec![format!(
        "{} workflow(s), {} ready at {}",
        workflows.len(),
        ready_count,
        millis_to_utc(now).to_rfc3339()
    )];
    lines.extend(quarantine_lines(plan));
    for workflow in workflows {
        let row = &workflow.branch_rule;
        let branch = plan.branch(&row.branch_id);
        let rule = plan.rule(&row.rule_id);
        let zone = plan.zone_of(workflow, default_zone).unwrap_or(default_zone);
        let next = match row.next_run_time {
            Some(ms) => format!(
                "next {} ({} {})",
                millis_to_utc(ms).format("%Y-%m-%dT%H:%M:%SZ"),
                local_text(ms, zone),
                zone.name()
            ),
            None => "next none".to_string(),
        };
        let owner = owners.map(|owners| owners.of(&row.id));
        let (_, verdict) = verdict(plan, workflow, now, default_zone, owner);
        let policy = policy_text(&plan.policy_of(workflow));
        let owned_by = match owner {
            Some((partition, Some(holder))) => format!("  partition {partition} on {holder}"),
            Some((partition, None)) => format!("  partition {partition} unowned"),
            None => String::new(),
        };
        lines.push(format!(
            "{}  {} / {}  {next}{owned_by}{policy}  {verdict}",
            row.id,
            branch.map_or_else(|| unknown(row.branch_id), |b| b.name.clone()),
            rule.map_or_else(|| unknown(row.rule_id), |r| r.name.clone()),
        ));
    }
    lines
}

/// The policy's fields that differ from the defaults, or nothing.
fn policy_text(policy: &EffectivePolicy) -> String {
    let default = EffectivePolicy::default();
    let mut parts = Vec::new();
    if policy.misfire != default.misfire {
        parts.push(format!("misfire={}", policy.misfire.as_str()));
    }
    if let Some(window) = policy.catchup_window_seconds {
        parts.push(format!("catchup_window={window}s"));
    }
    if policy.catchup_max != default.catchup_max {
        parts.push(format!("catchup_max={}", policy.catchup_max));
    }
    if policy.overlap != default.overlap {
        parts.push(format!("overlap={}", policy.overlap.as_str()));
    }
    if policy.max_attempts != default.max_attempts {
        parts.push(format!(
            "max_attempts={} backoff={}s..{}s",
            policy.max_attempts, policy.backoff_seconds, policy.backoff_max_seconds
        ));
    }
    if policy.start_jitter_seconds > 0 {
        parts.push(format!("start_jitter={}s", policy.start_jitter_seconds));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("  policy {}", parts.join(" "))
    }
}

/// One line per quarantined row, before the workflows: the rows that are
/// kept out of the plan and hold back the rules that depend on them.
fn quarantine_lines(plan: &ExecutionPlan) -> Vec<String> {
    let quarantine = plan.quarantine();
    if quarantine.is_empty() {
        return Vec::new();
    }
    let mut lines = vec![format!(
        "{} row(s) quarantined (kept out of the plan until fixed):",
        quarantine.len()
    )];
    for row in quarantine.rows() {
        lines.push(format!(
            "QUARANTINED  {} {}  {}: {} ({})",
            row.table,
            row.id,
            row.field,
            row.message,
            row.reason.as_str()
        ));
    }
    lines
}

fn unknown(id: Uuid) -> String {
    format!("<missing {id}>")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::fixtures::Fixture;

    #[test]
    fn each_line_says_when_and_why() {
        // 2027-01-15T08:00:00Z, an occurrence of the fixture's */5.
        let now = 1_800_000_000_000;
        let mut fixture = Fixture::due(now);
        fixture.branch.timezone = Some("America/New_York".into());
        let ready_plan = fixture.plan();
        let lines = plan_lines(&ready_plan, now, chrono_tz::Asia::Riyadh, None);
        assert_eq!(
            lines[0],
            format!(
                "1 workflow(s), 1 ready at {}",
                millis_to_utc(now).to_rfc3339()
            )
        );
        assert!(lines[1].ends_with("READY"), "{}", lines[1]);
        assert!(lines[1].contains("America/New_York"), "{}", lines[1]);
        assert!(lines[1].contains("branch / rule"), "{}", lines[1]);

        // An hour late: the misfire policy's answer is on the line.
        let mut late = Fixture::due(now - 3_600_000);
        late.rule.policy =
            crate::schedule::Policy::from_json_text(Some(r#"{"misfire":"skip"}"#)).unwrap();
        let lines = plan_lines(&late.plan(), now, chrono_tz::UTC, None);
        assert!(lines[1].contains("policy misfire=skip"), "{}", lines[1]);
        assert!(
            lines[1].contains("READY: runs the occurrence at 2027-01-15T08:00:00+00:00; 12 missed occurrence(s) are recorded skipped (misfire"),
            "{}",
            lines[1]
        );

        fixture.branch.is_active = false;
        let held = fixture.plan();
        let lines = plan_lines(&held, now, chrono_tz::Asia::Riyadh, None);
        assert!(
            lines[1].ends_with("not ready: branch.is_active is false"),
            "{}",
            lines[1]
        );

        // Nobody holds the rule's partition: not ready anywhere.
        let unowned = PartitionOwners {
            count: 4,
            owners: vec![None; 4],
        };
        let lines = plan_lines(&ready_plan, now, chrono_tz::Asia::Riyadh, Some(&unowned));
        assert!(lines[1].contains("has no live owner"), "{}", lines[1]);
        let single = PartitionOwners::single(4, "me");
        let lines = plan_lines(&ready_plan, now, chrono_tz::Asia::Riyadh, Some(&single));
        assert_eq!(lines.len(), 2, "nothing quarantined, nothing listed");
        let lines = plan_lines(&ready_plan, now, chrono_tz::Asia::Riyadh, Some(&single));
        assert!(
            lines[1].contains(" on me") && lines[1].ends_with("READY"),
            "{}",
            lines[1]
        );
    }

    #[test]
    fn quarantined_rows_and_the_rules_they_hold_are_listed() {
        // 2027-01-15T08:00:00Z, an occurrence of the fixture's */5.
        let now = 1_800_000_000_000;
        let mut fixture = Fixture::due(now);
        fixture.branch.timezone = Some("Mars/Olympus".into());
        let load = crate::model::PlanLoad {
            data: fixture.data(),
            rejected: vec![crate::model::RejectedRow {
                table: "branch_rules".into(),
                id: "not-a-uuid".into(),
                field: "id".into(),
                reason: crate::model::RejectReason::Decode,
                message: "invalid UUID".into(),
                branch_rule_id: None,
            }],
        };
        let plan = ExecutionPlan::from_load(load);
        let lines = plan_lines(&plan, now, chrono_tz::Asia::Riyadh, None);
        let text = lines.join("\n");
        assert!(text.contains("2 row(s) quarantined"), "{text}");
        assert!(
            text.contains("QUARANTINED  branch_rules not-a-uuid  id: invalid UUID (decode)"),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "QUARANTINED  branches {}  timezone: invalid time zone \"Mars/Olympus\" on branch {}",
                fixture.branch.id, fixture.branch.id
            )),
            "{text}"
        );
        let workflow = lines.last().unwrap();
        assert!(
            workflow.contains("not ready: held: branches row") && workflow.contains("Mars/Olympus"),
            "{workflow}"
        );
    }
}
