//! `ruled simulate --from T --to T [--demo] [--resolution 1s]
//! [--down T/PT3H] [--fail-rate F --duration D --seed N] [--format table|json]`
//!
//! Parses the arguments into a [`Simulation`] and prints the report; the
//! simulation itself is pure ([`crate::plan::simulate`]).

use chrono::{DateTime, NaiveDateTime, Utc};

use super::{CommandError, invalid};
use crate::config::Config;
use crate::model::Millis;
use crate::plan::simulate::{Report, Simulation};

/// The command line's values, as text, before they are checked.
#[derive(Debug, Clone, Default)]
pub struct SimulateArgs {
    pub from: String,
    pub to: String,
    pub resolution: Option<String>,
    pub down: Vec<String>,
    pub fail_rate: Option<f64>,
    pub duration: Option<String>,
    pub seed: Option<u64>,
}

/// The simulation the arguments describe, with this service's settings
/// (workers, cooldown, per-tick cap, default zone, partitions).
pub fn simulation_of(args: &SimulateArgs, config: &Config) -> Result<Simulation, CommandError> {
    let from = parse_time("--from", &args.from)?;
    let to = parse_time("--to", &args.to)?;
    if to <= from {
        return Err(invalid("--to", format!("{} is not after --from", args.to)));
    }
    let mut sim = Simulation::new(from, to);
    if let Some(text) = &args.resolution {
        sim.resolution_ms = parse_duration("--resolution", text)?.max(1);
    }
    if let Some(text) = &args.duration {
        sim.duration_ms = parse_duration("--duration", text)?;
    }
    if let Some(rate) = args.fail_rate {
        if !(0.0..=1.0).contains(&rate) {
            return Err(invalid("--fail-rate", format!("{rate} is not from 0 to 1")));
        }
        sim.fail_rate = rate;
    }
    sim.seed = args.seed.unwrap_or(0);
    for text in &args.down {
        sim.down.push(parse_down(text)?);
    }
    sim.down.sort();
    sim.workers = config.worker_count;
    sim.cooldown_ms = if config.worker_single_job_mode {
        config.worker_cooldown.as_millis() as Millis
    } else {
        0
    };
    sim.max_runs_per_tick = config.max_runs_per_tick;
    sim.default_zone = config.default_timezone;
    sim.partition_count = config.partition_count;
    Ok(sim)
}

/// Writes the report in the chosen format to `out`, as it is made.
pub fn render<W: std::io::Write>(
    report: &Report,
    format: &str,
    out: W,
) -> Result<(), CommandError> {
    let written = match format {
        "table" => report.write_table(out),
        "json" => report.write_json(out),
        other => {
            return Err(invalid(
                "--format",
                format!("{other:?}: expected table or json"),
            ));
        }
    };
    written.map_err(|e| invalid("--format", format!("the report could not be written: {e}")))
}

/// The format, checked before anything runs.
pub fn check_format(format: &str) -> Result<(), CommandError> {
    match format {
        "table" | "json" => Ok(()),
        other => Err(invalid(
            "--format",
            format!("{other:?}: expected table or json"),
        )),
    }
}

/// RFC 3339, or the same without seconds (`2026-03-29T01:00Z`).
pub fn parse_time(field: &'static str, text: &str) -> Result<Millis, CommandError> {
    if let Ok(time) = DateTime::parse_from_rfc3339(text) {
        return Ok(time.with_timezone(&Utc).timestamp_millis());
    }
    let trimmed = text.strip_suffix('Z').unwrap_or(text);
    NaiveDateTime::parse_from_str(trimmed, "%Y-%m-%dT%H:%M")
        .ok()
        .filter(|_| text.ends_with('Z'))
        .map(|naive| naive.and_utc().timestamp_millis())
        .ok_or_else(|| {
            invalid(
                field,
                format!("{text:?} is not an RFC 3339 UTC time such as 2026-03-29T01:00:00Z"),
            )
        })
}

/// `200ms`, `1s`, `90s`, `15m`, `3h`, `1d`, or ISO 8601 `PT3H`, `PT1H30M`,
/// `P1DT2H`.
pub fn parse_duration(field: &'static str, text: &str) -> Result<Millis, CommandError> {
    let bad = || {
        invalid(
            field,
            format!("{text:?} is not a duration such as 200ms, 1s, 15m, 3h or PT3H"),
        )
    };
    let upper = text.trim().to_ascii_uppercase();
    if let Some(iso) = upper.strip_prefix('P') {
        let (days, time) = match iso.split_once('T') {
            Some((days, time)) => (days, time),
            None => (iso, ""),
        };
        let mut total: Millis = 0;
        for (part, units) in [
            (days, &[('D', 86_400_000)][..]),
            (time, &[('H', 3_600_000), ('M', 60_000), ('S', 1000)][..]),
        ] {
            let mut rest = part;
            for (unit, ms) in units {
                if let Some((number, after)) = rest.split_once(*unit) {
                    let number: f64 = number.parse().map_err(|_| bad())?;
                    total += (number * *ms as f64).round() as Millis;
                    rest = after;
                }
            }
            if !rest.is_empty() {
                return Err(bad());
            }
        }
        return if total > 0 { Ok(total) } else { Err(bad()) };
    }
    let lower = text.trim().to_ascii_lowercase();
    let split = lower
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(bad)?;
    let (number, unit) = lower.split_at(split);
    let number: f64 = number.parse().map_err(|_| bad())?;
    let unit_ms = match unit {
        "ms" => 1.0,
        "s" => 1000.0,
        "m" | "min" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        _ => return Err(bad()),
    };
    Ok((number * unit_ms).round() as Millis)
}

/// `START/DURATION` (`2026-03-29T01:00Z/PT3H`) or `START/END`.
pub fn parse_down(text: &str) -> Result<(Millis, Millis), CommandError> {
    let (start, rest) = text.split_once('/').ok_or_else(|| {
        invalid(
            "--down",
            format!("{text:?}: expected START/DURATION such as 2026-03-29T01:00Z/PT3H"),
        )
    })?;
    let start = parse_time("--down", start)?;
    let end = match parse_duration("--down", rest) {
        Ok(length) => start + length,
        Err(_) => parse_time("--down", rest)?,
    };
    if end <= start {
        return Err(invalid(
            "--down",
            format!("{text:?}: the end is not after the start"),
        ));
    }
    Ok((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_times_in_the_forms_the_cli_takes() {
        assert_eq!(parse_duration("d", "200ms").unwrap(), 200);
        assert_eq!(parse_duration("d", "1s").unwrap(), 1000);
        assert_eq!(parse_duration("d", "PT3H").unwrap(), 3 * 3_600_000);
        assert_eq!(parse_duration("d", "PT1H30M").unwrap(), 5_400_000);
        assert_eq!(parse_duration("d", "P1DT2H").unwrap(), 93_600_000);
        assert!(parse_duration("d", "soon").is_err());
        assert!(parse_duration("d", "PT").is_err());
        let start = parse_time("t", "2026-03-29T01:00Z").unwrap();
        assert_eq!(start, parse_time("t", "2026-03-29T01:00:00Z").unwrap());
        assert_eq!(
            parse_down("2026-03-29T01:00Z/PT3H").unwrap(),
            (start, start + 3 * 3_600_000)
        );
        assert!(parse_time("t", "2026-03-29T01:00").is_err());
        let error = parse_down("2026-03-29T01:00Z").unwrap_err().to_string();
        assert!(error.contains("--down"), "{error}");
    }
}
