//! The `ruled` binary: parses the command line and calls into the library.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use ruled::clock::Clock;
use ruled::commands::{demo, plan, preview, prune, simulate};
use ruled::config::{Config, LogFormat};
use ruled::store::Store;

#[derive(Parser)]
#[command(
    name = "ruled",
    version,
    about = "Runs scheduled business rules in each branch's local time, and never loses one.",
    after_help = "Configuration comes from environment variables (and a .env file); see the README."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the service (the default).
    Serve {
        /// Load the demo brands, branches and rules first.
        #[arg(long)]
        demo: bool,
    },
    /// Apply database migrations and exit.
    Migrate,
    /// Load example brands, branches (three time zones), rules and templates. Idempotent.
    Demo,
    /// Load the plan as the service does and list each workflow, its next run and why it is not ready.
    Plan,
    /// Print the next runs of a cron expression in a zone, honouring a window and DST.
    Preview {
        /// A 5-field cron expression, quoted: "30 2 * * *".
        cron: String,
        /// IANA time zone (default: DEFAULT_TIMEZONE).
        #[arg(long)]
        tz: Option<String>,
        /// Daily operation window, HH:MM-HH:MM (may wrap midnight).
        #[arg(long)]
        window: Option<String>,
        /// Start after this RFC 3339 time (default: now).
        #[arg(long)]
        from: Option<String>,
        /// How many runs to print (1 to 1000, as the API's preview).
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1000))]
        count: u64,
        /// A policy object, e.g. '{"misfire":"run_all","start_jitter_seconds":60}':
        /// show what runs under it and which occurrences it skips.
        #[arg(long)]
        policy: Option<String>,
    },
    /// Delete finished executions older than EXECUTION_RETENTION_DAYS, as
    /// the service does every hour.
    Prune {
        /// Only say what would be deleted.
        #[arg(long)]
        dry_run: bool,
    },
    /// Run the scheduling decisions on a logical clock, with no wall clock
    /// and no sleeping, and print each tick's decisions.
    Simulate {
        /// Start (tick 0), RFC 3339 UTC.
        #[arg(long)]
        from: String,
        /// End (exclusive), RFC 3339 UTC.
        #[arg(long)]
        to: String,
        /// Simulate the demo rules instead of the database's.
        #[arg(long)]
        demo: bool,
        /// Milliseconds per tick: 1s, 100ms, 1m.
        #[arg(long, default_value = "1s")]
        resolution: String,
        /// ruled is down for START/DURATION (2026-03-29T01:00Z/PT3H); repeatable.
        #[arg(long)]
        down: Vec<String>,
        /// The share of runs that fail, 0 to 1.
        #[arg(long)]
        fail_rate: Option<f64>,
        /// How long each run takes: 200ms, 90s.
        #[arg(long)]
        duration: Option<String>,
        /// Seed of the failure model.
        #[arg(long)]
        seed: Option<u64>,
        /// table or json.
        #[arg(long, default_value = "table")]
        format: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match Config::from_env() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("ruled: {e}");
            return ExitCode::from(2);
        }
    };
    init_logging(config.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("ruled: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(
        cli.command.unwrap_or(Command::Serve { demo: false }),
        config,
    )) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("ruled: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command, config: Config) -> anyhow::Result<()> {
    match command {
        Command::Serve { demo } => {
            if demo {
                load_demo(&config).await?;
            }
            let handle = ruled::metrics::install().context("installing the metrics recorder")?;
            let options = ruled::service::ServiceOptions::new().metrics(handle);
            ruled::service::serve(config, options).await?;
        }
        Command::Migrate => {
            let store = connect(&config).await?;
            println!(
                "migrations applied to {} ({})",
                redact(&config.database_url),
                store.backend()
            );
            store.close().await;
        }
        Command::Demo => {
            let report = load_demo(&config).await?;
            println!(
                "demo data: {} row(s) inserted, {} already present",
                report.inserted, report.already_present
            );
        }
        Command::Plan => {
            let (loaded, source, owners) = plan::load_plan(&config).await?;
            if let plan::PlanSource::PlanFile {
                saved_at,
                database_error,
            } = &source
            {
                eprintln!(
                    "warning: the database could not be read ({database_error}); showing {} saved at {}",
                    config.plan_file.display(),
                    ruled::clock::millis_to_utc(*saved_at).to_rfc3339()
                );
            }
            let now = Clock::system().now_ms();
            for line in plan::plan_lines(&loaded, now, config.default_timezone, owners.as_ref()) {
                println!("{line}");
            }
        }
        Command::Prune { dry_run } => {
            // A dry run writes nothing: it neither migrates the database
            // nor creates one where there is none.
            let store = if dry_run {
                Store::connect_existing(&config.database_url)
                    .await
                    .with_context(|| format!("connecting to {}", redact(&config.database_url)))?
            } else {
                connect(&config).await?
            };
            let now = Clock::system().now_ms();
            let outcome = prune::prune(&store, &config, now, dry_run).await?;
            for line in prune::prune_lines(&outcome, &config) {
                println!("{line}");
            }
            store.close().await;
        }
        Command::Preview {
            cron,
            tz,
            window,
            from,
            count,
            policy,
        } => {
            let request = preview::PreviewRequest {
                expression: &cron,
                timezone: tz.as_deref(),
                window: window.as_deref(),
                from: from.as_deref(),
                count: count as usize,
                policy: policy.as_deref(),
            };
            for line in
                preview::preview_lines(&request, config.default_timezone, chrono::Utc::now())?
            {
                println!("{line}");
            }
        }
        Command::Simulate {
            from,
            to,
            demo: use_demo,
            resolution,
            down,
            fail_rate,
            duration,
            seed,
            format,
        } => {
            let args = simulate::SimulateArgs {
                from,
                to,
                resolution: Some(resolution),
                down,
                fail_rate,
                duration,
                seed,
            };
            simulate::check_format(&format)?;
            let mut sim = simulate::simulation_of(&args, &config)?;
            let plan = if use_demo {
                ruled::plan::ExecutionPlan::from_data(demo::demo_data(sim.from)?)
            } else {
                sim.plan_read_at = Some(Clock::system().now_ms());
                plan::load_plan(&config).await?.0
            };
            let report = ruled::plan::simulate::simulate(plan, &sim)?;
            let stdout = std::io::BufWriter::new(std::io::stdout().lock());
            simulate::render(&report, &format, stdout)?;
        }
    }
    Ok(())
}

async fn connect(config: &Config) -> anyhow::Result<Store> {
    let store = Store::connect(&config.database_url)
        .await
        .with_context(|| format!("connecting to {}", redact(&config.database_url)))?;
    store.migrate().await.context("applying migrations")?;
    Ok(store)
}

async fn load_demo(config: &Config) -> anyhow::Result<demo::DemoReport> {
    let store = connect(config).await?;
    let report = demo::load_demo(&store, Clock::system().now_ms()).await?;
    store.close().await;
    Ok(report)
}

/// Hides a password in a database URL before it reaches a log.
fn redact(url: &str) -> String {
    ruled::actions::secrets::mask_database_url(url)
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        // JSON is for machines: every span and field, as tracing has them.
        LogFormat::Json => builder.json().init(),
        LogFormat::Pretty => builder.event_format(pretty::ActorFormat).init(),
    }
}

/// The console format. ractor wraps every actor's work in `Actor{id name}`
/// spans whose names carry the service's 32-hex namespace, nested once
/// per supervisor level; printed as they are they push the message off
/// the screen. This format prints the innermost actor's short name
/// (`[master]`, `[lease]`, `[worker#0.7]` for an unnamed one) instead, and
/// every other span and field as the default format does.
mod pretty {
    use std::fmt;

    use tracing::{Event, Level, Subscriber};
    use tracing_subscriber::fmt::format::Writer;
    use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
    use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
    use tracing_subscriber::registry::LookupSpan;

    /// The name ractor gives its spans.
    const ACTOR_SPAN: &str = "Actor";

    pub struct ActorFormat;

    impl<S, N> FormatEvent<S, N> for ActorFormat
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
        N: for<'a> FormatFields<'a> + 'static,
    {
        fn format_event(
            &self,
            ctx: &FmtContext<'_, S, N>,
            mut writer: Writer<'_>,
            event: &Event<'_>,
        ) -> fmt::Result {
            let ansi = writer.has_ansi_escapes();
            SystemTime.format_time(&mut writer)?;
            let level = *event.metadata().level();
            if ansi {
                write!(writer, " {}{level:>5}\x1b[0m ", color(level))?;
            } else {
                write!(writer, " {level:>5} ")?;
            }
            let mut actor = None;
            if let Some(scope) = ctx.event_scope() {
                for span in scope.from_root() {
                    let extensions = span.extensions();
                    let fields = extensions
                        .get::<FormattedFields<N>>()
                        .map(|f| f.fields.as_str())
                        .unwrap_or("");
                    if span.name() == ACTOR_SPAN {
                        actor = Some(short_name(fields, event.metadata().target()));
                    } else if fields.is_empty() {
                        write!(writer, "{}: ", span.name())?;
                    } else {
                        write!(writer, "{}{{{fields}}}: ", span.name())?;
                    }
                }
            }
            if let Some(actor) = actor {
                write!(writer, "[{actor}] ")?;
            }
            write!(writer, "{}: ", event.metadata().target())?;
            ctx.field_format().format_fields(writer.by_ref(), event)?;
            writeln!(writer)
        }
    }

    fn color(level: Level) -> &'static str {
        match level {
            Level::ERROR => "\x1b[31m",
            Level::WARN => "\x1b[33m",
            Level::INFO => "\x1b[32m",
            Level::DEBUG => "\x1b[34m",
            Level::TRACE => "\x1b[35m",
        }
    }

    /// `master` from `id="0.6" name="ruled-<32 hex>/master"`; an actor
    /// without a name is its module (the event's target) and ractor id.
    pub fn short_name(fields: &str, target: &str) -> String {
        let fields = strip_ansi(fields);
        if let Some(name) = quoted(&fields, "name=") {
            return name.rsplit('/').next().unwrap_or(&name).to_string();
        }
        let module = target.rsplit("::").next().unwrap_or(target);
        match quoted(&fields, "id=") {
            Some(id) => format!("{module}#{id}"),
            None => module.to_string(),
        }
    }

    fn quoted(fields: &str, key: &str) -> Option<String> {
        let start = fields
            .match_indices(key)
            .find(|(i, _)| *i == 0 || fields.as_bytes()[i - 1] == b' ')?
            .0
            + key.len();
        let rest = fields[start..].strip_prefix('"')?;
        Some(rest.split('"').next()?.to_string())
    }

    /// Span fields are stored already formatted, with colour codes when
    /// the console has colour.
    fn strip_ansi(text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut chars = text.chars();
        while let Some(c) = chars.next() {
            if c == '\x1b' {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            } else {
                out.push(c);
            }
        }
        out
    }

    #[cfg(test)]
    mod tests {
        use super::short_name;

        #[test]
        fn actors_are_named_briefly() {
            let named = r#"id="0.6" name="ruled-0518cb699b994d71b5334ce722b1d7d7/master""#;
            assert_eq!(short_name(named, "ruled::actors::master"), "master");
            assert_eq!(
                short_name(r#"id="0.7""#, "ruled::actors::worker"),
                "worker#0.7"
            );
            let coloured = "\x1b[3mid\x1b[0m\x1b[2m=\x1b[0m\"0.3\" \x1b[3mname\x1b[0m\x1b[2m=\x1b[0m\"ns/lease\"";
            assert_eq!(short_name(coloured, "x"), "lease");
        }
    }
}
