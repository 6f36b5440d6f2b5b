//! The `ruled` binary: parses the command line and calls into the library.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use ruled::clock::Clock;
use ruled::commands::{demo, plan, preview};
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
        /// How many runs to print.
        #[arg(long, default_value_t = 10)]
        count: usize,
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
        Command::Preview {
            cron,
            tz,
            window,
            from,
            count,
        } => {
            let request = preview::PreviewRequest {
                expression: &cron,
                timezone: tz.as_deref(),
                window: window.as_deref(),
                from: from.as_deref(),
                count,
            };
            for line in
                preview::preview_lines(&request, config.default_timezone, chrono::Utc::now())?
            {
                println!("{line}");
            }
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
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let credentials = &url[scheme_end + 3..at];
            match credentials.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme_end + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Pretty => builder.init(),
    }
}
