//! `POST /simulate` (issue 13): `ruled simulate` over HTTP, on this
//! service's plan or the demo rules; and the policy part of a branch
//! rule's preview. Both run the engine's own decisions on the simulator's
//! logical clock ([`crate::plan::simulate`]), never the wall clock.
//!
//! A simulation is CPU work whose size the caller chooses, so it is
//! bounded before it starts (at most [`MAX_TICKS`] ticks) and while it
//! runs (at most [`MAX_DECISIONS`] decisions), runs on the blocking pool
//! rather than on the runtime's workers, at most [`CONCURRENT`] at a time.
//!
//! It changes nothing (no row, no plan, no job), so like the reads it
//! needs no token: its operation declares no `security`, and
//! [`super::extract::require_token`] asks the document which operations
//! do.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use chrono::SecondsFormat;
use chrono_tz::Tz;
use serde::Deserialize;
use tokio::sync::Semaphore;
use utoipa::ToSchema;
use uuid::Uuid;

use super::ApiState;
use super::error::{ApiError, ApiResult};
use super::extract::ApiJson;
use super::schema::{ErrorEnvelope, LATEST_TIME_MS, RequestTime, Share, Timestamp};
use super::views::{
    PolicyStep, SimulatedDecision, SimulatedDecisionKind, SimulationReport, StepDecision,
};
use crate::actors::ask;
use crate::clock::millis_to_utc;
use crate::commands::CommandError;
use crate::commands::demo::demo_data;
use crate::commands::simulate::{SimulateArgs, simulation_of};
use crate::config::Config;
use crate::messages::PlanMsg;
use crate::model::Millis;
use crate::plan::ExecutionPlan;
use crate::plan::simulate::{
    DecisionKind, Report, Simulation, SimulationError, preview_under_policy, simulate as run,
    single_rule_plan,
};
use crate::schedule::{Bounded, CronSchedule, Policy, Window, next_after_millis};

/// The most ticks one simulation spans: 31 days at the default resolution
/// of one second.
pub const MAX_TICKS: u64 = 2_678_400;
/// The most decisions one simulation makes before it gives up.
pub const MAX_DECISIONS: usize = 100_000;
/// The most `down` windows one simulation takes.
pub const MAX_DOWN_WINDOWS: usize = 100;
/// Simulations running at once; more wait for one to end.
pub const CONCURRENT: usize = 2;
/// The coarsest clock: a tick of a day.
const MAX_RESOLUTION_MS: u64 = 86_400_000;
/// The longest simulated run: 31 days.
const MAX_DURATION_MS: u64 = 2_678_400_000;
/// The largest seed: JSON's largest safe integer, so every client reads
/// it back as it was sent.
const MAX_SEED: u64 = 9_007_199_254_740_991;

static SIMULATIONS: LazyLock<Arc<Semaphore>> =
    LazyLock::new(|| Arc::new(Semaphore::new(CONCURRENT)));

fn default_resolution() -> Bounded<1, MAX_RESOLUTION_MS> {
    Bounded::new(1000).expect("1000 ms is a resolution")
}

fn default_duration() -> Bounded<1, MAX_DURATION_MS> {
    Bounded::new(200).expect("200 ms is a duration")
}

fn no_seed() -> Bounded<0, MAX_SEED> {
    Bounded::new(0).expect("0 is a seed")
}

/// What to simulate: `ruled simulate`'s arguments as a body.
///
/// Past what JSON Schema can say, the server refuses (400 naming the
/// field) a `to` not after `from`, a range of more than 2,678,400 ticks
/// of `resolution_ms` (31 days at one second), a simulation that makes
/// more than 100,000 decisions, and a `down` window whose `to` is not
/// after its `from`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({
    "from": "2026-03-28T00:00:00Z",
    "to": "2026-03-29T00:00:00Z",
    "demo": true,
    "resolution_ms": 1000,
    "down": [{ "from": "2026-03-28T01:00:00Z", "to": "2026-03-28T04:00:00Z" }],
    "fail_rate": 0.1,
    "duration_ms": 200,
    "seed": 7
})))]
pub struct SimulateInput {
    /// Tick 0: where the simulation starts.
    from: RequestTime,
    /// Where it ends (exclusive); after `from`.
    to: RequestTime,
    /// The demo rules of `ruled demo`, every branch rule due at `from`,
    /// instead of this service's plan as it is now.
    #[serde(default)]
    #[schema(default = false)]
    demo: bool,
    /// Milliseconds per tick (seed 003's resolution).
    #[serde(default = "default_resolution")]
    #[schema(value_type = u64, minimum = 1, maximum = 86_400_000, default = 1000)]
    resolution_ms: Bounded<1, MAX_RESOLUTION_MS>,
    /// Windows while ruled is down: nothing is fetched, and a run going
    /// when it stops is lost and runs again.
    #[serde(default)]
    #[schema(max_items = 100)]
    down: Vec<DownWindow>,
    /// The share of runs that fail, from 0 to 1 (a seeded draw per run).
    #[serde(default)]
    #[schema(default = 0.0)]
    fail_rate: Share,
    /// How long every run takes, in milliseconds.
    #[serde(default = "default_duration")]
    #[schema(value_type = u64, minimum = 1, maximum = 2_678_400_000_u64, default = 200)]
    duration_ms: Bounded<1, MAX_DURATION_MS>,
    /// The seed of the failures' draw: the same seed, the same report.
    #[serde(default = "no_seed")]
    #[schema(value_type = u64, minimum = 0, maximum = 9_007_199_254_740_991_u64, default = 0)]
    seed: Bounded<0, MAX_SEED>,
}

/// A time ruled is down: `[from, to)`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DownWindow {
    /// Ruled stops.
    from: RequestTime,
    /// Ruled is back; after `from`.
    to: RequestTime,
}

/// RFC 3339 in UTC to the millisecond, as the command line reads it.
fn time_text(ms: Millis) -> String {
    millis_to_utc(ms).to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The body's field for one of `ruled simulate`'s options.
fn field_of(option: &str) -> String {
    match option {
        "--resolution" => "resolution_ms".into(),
        "--duration" => "duration_ms".into(),
        other => other.trim_start_matches('-').replace('-', "_"),
    }
}

fn from_command(error: CommandError) -> ApiError {
    match error {
        CommandError::InvalidArgument { field, message } => {
            ApiError::field(field_of(field), message)
        }
        other => ApiError::Internal(other.to_string()),
    }
}

fn too_many_ticks(ticks: u64, resolution_ms: u64) -> ApiError {
    ApiError::field(
        "to",
        format!(
            "the range from `from` to `to` is {ticks} ticks of resolution_ms {resolution_ms}, \
             more than the limit of {MAX_TICKS}; bring `to` closer to `from` or raise \
             resolution_ms"
        ),
    )
}

fn too_many_decisions() -> ApiError {
    ApiError::field(
        "to",
        format!(
            "the simulation makes more than {MAX_DECISIONS} decisions, the limit; bring `to` \
             closer to `from` (or use `ruled simulate`, which has no limit)"
        ),
    )
}

/// The simulator's refusals, naming the body's fields.
fn refusal(error: SimulationError, sim: &Simulation) -> ApiError {
    match error {
        SimulationError::EmptyRange => ApiError::field("to", "must be after `from`"),
        SimulationError::Resolution => ApiError::field("resolution_ms", error.to_string()),
        SimulationError::FailRate => ApiError::field("fail_rate", error.to_string()),
        SimulationError::TooManyTicks { ticks, .. } => {
            too_many_ticks(ticks, sim.resolution_ms as u64)
        }
        SimulationError::TooManyDecisions { .. } => too_many_decisions(),
    }
}

impl SimulateInput {
    /// The simulation the body describes, with this service's settings
    /// (workers, cooldown, per-tick cap, default zone, partitions), as
    /// `ruled simulate` sets it up: the body is read into the command
    /// line's arguments and [`simulation_of`] does the rest, so the two
    /// cannot differ. The bounds are checked here first, before any work.
    fn simulation(&self, config: &Config) -> ApiResult<Simulation> {
        let (from, to) = (self.from.0, self.to.0);
        if to <= from {
            return Err(ApiError::field("to", "must be after `from`"));
        }
        if self.down.len() > MAX_DOWN_WINDOWS {
            return Err(ApiError::field(
                "down",
                format!("at most {MAX_DOWN_WINDOWS} windows"),
            ));
        }
        for (index, window) in self.down.iter().enumerate() {
            if window.to.0 <= window.from.0 {
                return Err(ApiError::field(
                    format!("down[{index}].to"),
                    format!("must be after down[{index}].from"),
                ));
            }
        }
        let resolution = self.resolution_ms.get();
        let ticks = ((to - from) as u64).div_ceil(resolution);
        if ticks > MAX_TICKS {
            return Err(too_many_ticks(ticks, resolution));
        }
        let args = SimulateArgs {
            from: time_text(from),
            to: time_text(to),
            resolution: Some(format!("{resolution}ms")),
            down: self
                .down
                .iter()
                .map(|w| format!("{}/{}", time_text(w.from.0), time_text(w.to.0)))
                .collect(),
            fail_rate: Some(self.fail_rate.0),
            duration: Some(format!("{}ms", self.duration_ms.get())),
            seed: Some(self.seed.get()),
        };
        let mut sim = simulation_of(&args, config).map_err(from_command)?;
        sim.max_ticks = Some(MAX_TICKS);
        sim.max_decisions = Some(MAX_DECISIONS);
        Ok(sim)
    }
}

/// Runs a simulation (seed 003's logical clock, the engine's own
/// decisions, actions replaced by a seeded model of durations and
/// failures) over this service's plan as it is now, or over the demo
/// rules, and answers every decision in order. The same body gives the
/// same answer, byte for byte; nothing is changed, so no token is needed.
#[utoipa::path(post, path = "/simulate", tag = "plan",
    request_body = SimulateInput,
    responses(
        (status = 200, description = "Every decision of the simulation, in order, and the totals", body = SimulationReport),
        (status = 400, description = "A body value is wrong, or the simulation is past its bounds: \
            `to` not after `from`, more than 2,678,400 ticks, more than 100,000 decisions, a `down` \
            window that ends before it starts; the message names the field", body = ErrorEnvelope)))]
pub async fn simulate(
    State(s): State<ApiState>,
    ApiJson(input): ApiJson<SimulateInput>,
) -> ApiResult<Response> {
    let mut sim = input.simulation(s.config())?;
    let plan = if input.demo {
        let data =
            demo_data(sim.from).map_err(|e| ApiError::Internal(format!("the demo rules: {e}")))?;
        ExecutionPlan::from_data(data)
    } else {
        let actor = s
            .directory()
            .plan()
            .ok_or_else(|| super::engine::restarting("plan"))?;
        let snapshot = ask(&actor, PlanMsg::Snapshot).await?;
        sim.plan_read_at = Some(s.clock().now_ms());
        ExecutionPlan::from_snapshot(snapshot)
    };
    let permit = Arc::clone(&SIMULATIONS)
        .acquire_owned()
        .await
        .map_err(|e| ApiError::Internal(format!("the simulations' semaphore: {e}")))?;
    let body = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let report = run(plan, &sim).map_err(|e| refusal(e, &sim))?;
        // The simulator checks its bound before each start; what a tick
        // decides besides may take it a little past.
        if report.decisions.len() > MAX_DECISIONS {
            return Err(too_many_decisions());
        }
        serde_json::to_vec(&report_view(report, &sim))
            .map_err(|e| ApiError::Internal(format!("the report: {e}")))
    })
    .await
    .map_err(|e| ApiError::Internal(format!("the simulation failed: {e}")))??;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// A time for the view; `None` past what RFC 3339 can write (a retry or a
/// window opening after 9999-12-31).
fn shown_time(ms: Millis) -> Option<Timestamp> {
    (ms <= LATEST_TIME_MS).then_some(Timestamp(ms))
}

/// The report as the API shows it: times as RFC 3339, and UTC and local
/// time written out as `ruled simulate` prints them.
fn report_view(report: Report, sim: &Simulation) -> SimulationReport {
    let mut zones: HashMap<String, Tz> = HashMap::new();
    let decisions = report
        .decisions
        .into_iter()
        .map(|d| {
            let zone = match zones.get(&d.zone) {
                Some(zone) => *zone,
                None => {
                    let zone = d.zone.parse().unwrap_or(chrono_tz::UTC);
                    zones.insert(d.zone.clone(), zone);
                    zone
                }
            };
            let at = millis_to_utc(d.at);
            let mut view = SimulatedDecision {
                tick: d.tick,
                at: Timestamp(d.at),
                // The formats of `Report::to_table`.
                utc: at.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
                local: at
                    .with_timezone(&zone)
                    .format("%Y-%m-%d %H:%M:%S %Z")
                    .to_string(),
                branch_rule_id: d.branch_rule_id,
                partition: d.partition,
                zone: d.zone,
                occurrence: Timestamp(d.occurrence),
                attempt: d.attempt,
                decision: SimulatedDecisionKind::Run,
                reason: None,
                detail: None,
                opens: None,
                retry_at: None,
                status: None,
            };
            match d.kind {
                DecisionKind::Run => {}
                DecisionKind::Skipped { reason, detail } => {
                    view.decision = SimulatedDecisionKind::Skipped;
                    view.reason = Some(reason);
                    view.detail = Some(detail);
                }
                DecisionKind::HeldByWindow { opens } => {
                    view.decision = SimulatedDecisionKind::HeldByWindow;
                    view.opens = shown_time(opens);
                }
                DecisionKind::Buffered => view.decision = SimulatedDecisionKind::Buffered,
                DecisionKind::Retry { retry_at } => {
                    view.decision = SimulatedDecisionKind::Retry;
                    view.retry_at = shown_time(retry_at);
                }
                DecisionKind::Finished { status } => {
                    view.decision = SimulatedDecisionKind::Finished;
                    view.status = Some(status);
                }
                DecisionKind::Lost => view.decision = SimulatedDecisionKind::Lost,
            }
            view
        })
        .collect();
    SimulationReport {
        from: Timestamp(sim.from),
        to: Timestamp(sim.to),
        resolution_ms: sim.resolution_ms,
        runs: report.runs,
        skipped: report.skipped,
        retries: report.retries,
        ticks_visited: report.ticks_visited,
        decisions,
    }
}

// ---- the policy in a preview -------------------------------------------------

/// A rule's policy with its branch rule's fields over it: what the plan
/// runs a branch rule under.
pub fn merged_policy(rule: Option<&Policy>, own: Option<&Policy>) -> Option<Policy> {
    match (rule, own) {
        (Some(rule), Some(own)) => Some(rule.overridden_by(own)),
        (Some(one), None) | (None, Some(one)) => Some(one.clone()),
        (None, None) => None,
    }
}

/// What one branch rule's policy does from `from` until its `count`-th
/// run: each run with its start, each skipped occurrence with the reason.
/// The second value is `true` when the steps stop short of `count` runs.
pub async fn policy_preview(
    id: Uuid,
    schedule: &CronSchedule,
    zone: Tz,
    window: Option<Window>,
    policy: Option<Policy>,
    from: Millis,
    count: usize,
) -> ApiResult<(Vec<PolicyStep>, bool)> {
    let Ok(first) = next_after_millis(schedule, zone, from.saturating_sub(1)) else {
        return Ok((Vec::new(), true));
    };
    let plan = single_rule_plan(id, schedule.expression(), zone, window, policy, first);
    tokio::task::spawn_blocking(move || steps_under_policy(&plan, from, count, zone))
        .await
        .map_err(|e| ApiError::Internal(format!("the policy preview failed: {e}")))
}

/// The one rule's steps, as the API shows them; nothing after
/// 9999-12-31, which RFC 3339 cannot write.
fn steps_under_policy(
    plan: &ExecutionPlan,
    from: Millis,
    count: usize,
    zone: Tz,
) -> (Vec<PolicyStep>, bool) {
    let (steps, truncated) = preview_under_policy(plan, from, count, zone, LATEST_TIME_MS);
    let steps = steps
        .into_iter()
        .map(|s| PolicyStep {
            occurrence: Timestamp(s.occurrence),
            starts_at: s.starts_at.map(Timestamp),
            decision: StepDecision(s.decision),
        })
        .collect();
    (steps, truncated)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::TimeOfDay;
    use chrono::{TimeZone, Utc};

    fn at(d: u32, h: u32) -> Millis {
        Utc.with_ymd_and_hms(2026, 6, d, h, 0, 0)
            .unwrap()
            .timestamp_millis()
    }

    fn plan(cron: &str, window: Option<(&str, &str)>, policy: &str, from: Millis) -> ExecutionPlan {
        let schedule = CronSchedule::parse(cron).unwrap();
        let window = window.and_then(|(a, b)| {
            Window::from_bounds(
                Some(a.parse::<TimeOfDay>().unwrap()),
                Some(b.parse::<TimeOfDay>().unwrap()),
            )
        });
        let first = next_after_millis(&schedule, chrono_tz::UTC, from - 1).unwrap();
        single_rule_plan(
            Uuid::from_u128(42),
            cron,
            chrono_tz::UTC,
            window,
            Policy::from_json_text(Some(policy)).unwrap(),
            first,
        )
    }

    /// A rule that skips nearly everything (a minute cron in a one-minute
    /// window) gives up at the bound, quickly, with the steps it had.
    #[test]
    fn a_preview_that_skips_too_much_stops_at_the_bound() {
        let from = at(1, 8);
        let plan = plan(
            "* * * * *",
            Some(("00:00", "00:01")),
            r#"{"misfire":"skip"}"#,
            from,
        );
        let started = std::time::Instant::now();
        let (steps, truncated) = steps_under_policy(&plan, from, 1000, chrono_tz::UTC);
        assert!(truncated);
        assert!(
            !steps.is_empty() && steps.len() <= crate::plan::simulate::PREVIEW_DECISIONS_MAX + 1000
        );
        assert!(steps.iter().any(|s| s.decision.0 == "outside_window"));
        assert!(started.elapsed() < std::time::Duration::from_secs(30));
    }

    fn input(body: serde_json::Value) -> Result<SimulateInput, String> {
        serde_json::from_value(body).map_err(|e| e.to_string())
    }

    #[test]
    fn the_body_becomes_the_command_lines_simulation() {
        let config = Config::default();
        let sim = input(serde_json::json!({
            "from": "2026-03-28T00:00:00Z",
            "to": "2026-03-29T00:00:00.250Z",
            "resolution_ms": 250,
            "down": [{ "from": "2026-03-28T01:00:00Z", "to": "2026-03-28T04:00:00Z" }],
            "fail_rate": 0.25,
            "duration_ms": 90000,
            "seed": 9_007_199_254_740_991_u64,
        }))
        .unwrap()
        .simulation(&config)
        .unwrap();
        let from = Utc
            .with_ymd_and_hms(2026, 3, 28, 0, 0, 0)
            .unwrap()
            .timestamp_millis();
        assert_eq!((sim.from, sim.to), (from, from + 86_400_250));
        assert_eq!(sim.resolution_ms, 250);
        assert_eq!(sim.down, vec![(from + 3_600_000, from + 4 * 3_600_000)]);
        assert_eq!((sim.fail_rate, sim.duration_ms), (0.25, 90_000));
        assert_eq!(sim.seed, 9_007_199_254_740_991);
        assert_eq!(sim.workers, config.worker_count);
        assert_eq!(sim.default_zone, config.default_timezone);
        assert_eq!(sim.partition_count, config.partition_count);
        assert_eq!(
            (sim.max_ticks, sim.max_decisions),
            (Some(MAX_TICKS), Some(MAX_DECISIONS))
        );
        let defaults = input(serde_json::json!({
            "from": "2026-03-28T00:00:00Z", "to": "2026-03-28T01:00:00Z"
        }))
        .unwrap()
        .simulation(&config)
        .unwrap();
        assert_eq!(
            (defaults.resolution_ms, defaults.duration_ms, defaults.seed),
            (1000, 200, 0)
        );
        assert_eq!(defaults.fail_rate, 0.0);
    }

    #[test]
    fn bounds_and_bad_values_name_the_field() {
        let config = Config::default();
        let refused = |body: serde_json::Value| match input(body) {
            Err(text) => text,
            Ok(input) => input.simulation(&config).unwrap_err().to_string(),
        };
        let day = |d: u32| format!("2026-03-{d:02}T00:00:00Z");
        assert!(refused(serde_json::json!({"from": day(2), "to": day(2)})).starts_with("to:"));
        let long = refused(serde_json::json!({"from": day(1), "to": "2026-05-01T00:00:00Z"}));
        assert!(
            long.starts_with("to:") && long.contains("resolution_ms"),
            "{long}"
        );
        // The same range is fine at a coarser clock.
        assert!(
            input(serde_json::json!({
                "from": day(1), "to": "2026-05-01T00:00:00Z", "resolution_ms": 60000
            }))
            .unwrap()
            .simulation(&config)
            .is_ok()
        );
        let down = refused(serde_json::json!({
            "from": day(1), "to": day(2), "down": [{"from": day(2), "to": day(1)}]
        }));
        assert!(down.starts_with("down[0].to:"), "{down}");
        for bad in [
            serde_json::json!({"from": day(1), "to": day(2), "fail_rate": 2}),
            serde_json::json!({"from": day(1), "to": day(2), "resolution_ms": 0}),
            serde_json::json!({"from": day(1), "to": day(2), "seed": -1}),
            serde_json::json!({"from": day(1), "to": day(2), "format": "json"}),
        ] {
            assert!(input(bad.clone()).is_err(), "{bad}");
        }
        let mut simulation = Simulation::new(0, 1);
        simulation.resolution_ms = 7;
        assert!(
            refusal(
                SimulationError::TooManyTicks { ticks: 9, limit: 8 },
                &simulation
            )
            .to_string()
            .contains("resolution_ms 7")
        );
    }

    #[test]
    fn a_report_reads_as_the_command_line_prints_it() {
        let from = Utc
            .with_ymd_and_hms(2026, 3, 28, 0, 0, 0)
            .unwrap()
            .timestamp_millis();
        let plan = ExecutionPlan::from_data(demo_data(from).unwrap());
        let mut sim = Simulation::new(from, from + 3_600_000);
        sim.fail_rate = 0.5;
        sim.seed = 3;
        let report = run(plan, &sim).unwrap();
        let table = report.to_table();
        let view = report_view(report.clone(), &sim);
        assert_eq!(view.decisions.len(), report.decisions.len());
        for (shown, decision) in view.decisions.iter().zip(&report.decisions) {
            assert!(
                table.contains(&format!("{}  {:<24}", shown.utc, shown.local)),
                "{} {} not in the table",
                shown.utc,
                shown.local
            );
            assert_eq!(shown.branch_rule_id, decision.branch_rule_id);
        }
        assert!(view.runs > 0, "{table}");
        let json = serde_json::to_value(&view).unwrap();
        let decisions = json["decisions"].as_array().unwrap();
        let of = |kind: &str| decisions.iter().find(|d| d["decision"] == kind).unwrap();
        let held = of("held_by_window");
        assert!(held["opens"].is_string(), "{held}");
        assert!(
            held.get("reason").is_none() && held.get("status").is_none(),
            "{held}"
        );
        let failed = decisions
            .iter()
            .find(|d| d["decision"] == "finished" && d["status"] == "failed");
        assert!(failed.is_some(), "{table}");
    }
}
