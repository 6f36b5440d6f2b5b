//! Configuration from the environment (and `.env`), with every default of
//! DESIGN.md §5 in one place: [`Config::default`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use chrono_tz::Tz;

use crate::schedule::parse_timezone;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid {variable}={value:?}: {reason}")]
pub struct ConfigError {
    pub variable: &'static str,
    pub value: String,
    pub reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Pretty,
    Json,
}

/// `PARTITION=k/N`: this instance only considers rules whose stable id hash
/// modulo `count` equals `index` (seed 003).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    pub index: u32,
    pub count: u32,
}

impl FromStr for Partition {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (index, count) = text
            .split_once('/')
            .ok_or("expected k/N, for example 0/3")?;
        let index: u32 = index
            .trim()
            .parse()
            .map_err(|_| "k is not a whole number")?;
        let count: u32 = count
            .trim()
            .parse()
            .map_err(|_| "N is not a whole number")?;
        if count == 0 || index >= count {
            return Err(format!("need 0 <= k < N, got {index}/{count}"));
        }
        Ok(Partition { index, count })
    }
}

/// One bearer token of API_TOKENS (or API_TOKEN, named [`API_TOKEN_NAME`])
/// and the name recorded as `created_by`/`updated_by` and in the audit log
/// for changes made with it.
#[derive(Clone, PartialEq, Eq)]
pub struct NamedToken {
    pub name: String,
    pub token: String,
}

/// The name API_TOKEN's token goes by, so a single-token install still
/// records who changed a row.
pub const API_TOKEN_NAME: &str = "api";

/// The seed's `f_creator`/`f_updater` are VARCHAR(40).
pub const MAX_TOKEN_NAME_LEN: usize = 40;

impl std::fmt::Debug for NamedToken {
    // A config printed for debugging must not leak a credential.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NamedToken({:?}, ***)", self.name)
    }
}

/// Parses API_TOKENS (`name:token,name:token`). The reason never quotes a
/// token, since start-up errors reach logs.
fn parse_named_tokens(text: &str) -> Result<Vec<NamedToken>, String> {
    let mut tokens: Vec<NamedToken> = Vec::new();
    for (index, entry) in text.split(',').map(str::trim).enumerate() {
        let position = index + 1;
        if entry.is_empty() {
            return Err(format!("entry {position} is empty; expected name:token,…"));
        }
        let Some((name, token)) = entry.split_once(':') else {
            return Err(format!(
                "entry {position} has no ':'; expected name:token,…"
            ));
        };
        let (name, token) = (name.trim(), token.trim());
        if name.is_empty() || name.len() > MAX_TOKEN_NAME_LEN {
            return Err(format!(
                "entry {position}: the name must be 1 to {MAX_TOKEN_NAME_LEN} characters"
            ));
        }
        if !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '@'))
        {
            return Err(format!(
                "entry {position}: the name {name:?} may hold only letters, digits and _ - . @"
            ));
        }
        if token.is_empty() || token.chars().any(char::is_whitespace) {
            return Err(format!(
                "entry {position} ({name}): the token must be non-empty and without spaces"
            ));
        }
        if tokens.iter().any(|t| t.name == name) {
            return Err(format!("the name {name:?} is used twice"));
        }
        if tokens.iter().any(|t| t.token == token) {
            // One token with two names would make `created_by` a guess.
            return Err(format!(
                "entry {position} ({name}) repeats another entry's token"
            ));
        }
        tokens.push(NamedToken {
            name: name.to_string(),
            token: token.to_string(),
        });
    }
    Ok(tokens)
}

/// The longest interval a setting takes. Longer ones mean "never" in
/// practice, and a duration near u64::MAX seconds panics where it is added
/// to an instant.
const MAX_SECONDS: f64 = 10.0 * 365.0 * 86_400.0;

/// A claim made earlier than this would hold a rule's lock, and pass over
/// changes an operator makes, for longer than a start-up lag is worth.
const MAX_CLAIM_LEAD: Duration = Duration::from_secs(10);

/// More partitions than this only cost lease rows and renewals.
pub const MAX_PARTITION_COUNT: u32 = 4096;

#[derive(Debug, Clone)]
pub struct Config {
    /// EXECUTION_PLAN_REFRESH_SECONDS, default 20.
    pub plan_refresh_interval: Duration,
    /// PLAN_FULL_REFRESH_SECONDS, default 300: between these, refreshes read
    /// only the branch rules changed since the last read.
    pub plan_full_refresh_interval: Duration,
    /// PLAN_MIN_WRITE_INTERVAL_SECONDS, default 1.
    pub plan_min_write_interval: Duration,
    /// PLAN_ACTION_DETAILS_CAP, default 1500.
    pub plan_action_details_cap: usize,
    /// PLAN_WORKFLOW_MAX_AGE_HOURS, default 24.
    pub plan_workflow_max_age: Duration,
    /// MASTER_FETCH_INTERVAL_SECONDS, default 60.
    pub master_fetch_interval: Duration,
    /// MASTER_GRACE_PERIOD_SECONDS, default 15.
    pub master_grace_period: Duration,
    /// MASTER_CLAIM_LEAD_SECONDS, default 0 (claims once due, as seed 004
    /// says): how long before an occurrence is due the master claims it,
    /// so the claim's commit is done when it falls due and the job starts
    /// on time.
    pub master_claim_lead: Duration,
    /// WORKER_COUNT, default max(10, 90% of CPU cores).
    pub worker_count: usize,
    /// WORKER_SINGLE_JOB_MODE, default true.
    pub worker_single_job_mode: bool,
    /// WORKER_STAGGER_SECONDS, default 1.
    pub worker_stagger: Duration,
    /// WORKER_COOLDOWN_SECONDS, default 10.
    pub worker_cooldown: Duration,
    /// RECENTLY_PROCESSED_SECONDS, default 30.
    pub recently_processed: Duration,
    /// EXECUTION_RETENTION_DAYS, default 30: finished executions older
    /// than this are pruned; 0 keeps the history forever.
    pub execution_retention_days: usize,
    /// How often the pruner looks for history to prune (not a setting: the
    /// first look is ten seconds after start, then one an hour).
    pub prune_interval: Duration,
    /// Rows one prune statement deletes at most: short enough that the
    /// engine's writes never wait long behind it.
    pub prune_batch: usize,
    /// BACKLOG_WINDOW_SECONDS, default 60: the master's backlog watch
    /// samples the ready backlog six times a window, and a lowest point
    /// that rises from one window to the next is a WARN.
    pub backlog_window: Duration,
    /// MEMORY_THROTTLE_THRESHOLD, default 90 (%).
    pub memory_throttle_threshold: f64,
    /// MEMORY_RESUME_THRESHOLD, default 80 (%).
    pub memory_resume_threshold: f64,
    /// GPU_THROTTLE_THRESHOLD, default 85 (%).
    pub gpu_throttle_threshold: f64,
    /// GPU_RESUME_THRESHOLD, default 75 (%).
    pub gpu_resume_threshold: f64,
    /// SWAP_THROTTLE_THRESHOLD, default 70 (%).
    pub swap_throttle_threshold: f64,
    /// MEMORY_CHECK_INTERVAL, default 5 (seconds).
    pub memory_check_interval: Duration,
    /// SCHEDULE_LOCK_TIMEOUT_SECONDS, default 300.
    pub schedule_lock_timeout: Duration,
    /// SCHEDULE_EXECUTION_TIMEOUT_SECONDS, default 600.
    pub schedule_execution_timeout: Duration,
    /// MAX_RUNS_PER_TICK, default 500.
    pub max_runs_per_tick: usize,
    /// DEFAULT_TIMEZONE, default Asia/Riyadh (the seed's KSA).
    pub default_timezone: Tz,
    /// DATABASE_URL, default sqlite://data/ruled.db.
    pub database_url: String,
    /// PLAN_FILE, default data/execution_plan.json.
    pub plan_file: PathBuf,
    /// SHUTDOWN_MARKER_FILE, default data/shutdown_marker.json.
    pub shutdown_marker_file: PathBuf,
    /// HTTP_ADDR, default 127.0.0.1:8080.
    pub http_addr: SocketAddr,
    /// API_TOKEN, default unset (the API is read-only). Its changes are
    /// recorded as made by [`API_TOKEN_NAME`].
    pub api_token: Option<String>,
    /// API_TOKENS (`name:token,…`), default empty: more bearer tokens, each
    /// with the name recorded as `created_by`/`updated_by` and in the audit
    /// log. See [`Config::tokens`].
    pub api_tokens: Vec<NamedToken>,
    /// INSTANCE_ID, default the hostname.
    pub instance_id: String,
    /// PARTITION, default unset: with a static `k/N` this instance prefers
    /// the partitions `p` with `p mod N = k`, and still covers partitions no
    /// live instance prefers.
    pub partition: Option<Partition>,
    /// PARTITION_COUNT, default 64: rules fall into this many partitions by a
    /// stable hash of their id; each has one lease holder at a time.
    pub partition_count: u32,
    /// PARTITION_LEASE_TTL_SECONDS, default 30: a partition lease (and an
    /// instance's heartbeat) not renewed for this long has expired.
    pub partition_lease_ttl: Duration,
    /// PARTITION_LEASE_RETRY_SECONDS, default 1: how often an instance looks
    /// for partitions to take; leases are renewed every third of the TTL.
    pub partition_lease_retry: Duration,
    /// LOG_FORMAT, default pretty.
    pub log_format: LogFormat,
    /// COMMAND_ACTIONS_ENABLED, default false.
    pub command_actions_enabled: bool,
    /// HTTP_ACTION_ALLOW_PRIVATE, default false.
    pub http_action_allow_private: bool,
    /// SHUTDOWN_GRACE_SECONDS, default 30: how long running jobs may finish
    /// after SIGTERM before they are cancelled.
    pub shutdown_grace: Duration,
    /// SUPERVISOR_MAX_RESTARTS, default 5.
    pub supervisor_max_restarts: u32,
    /// SUPERVISOR_RESTART_WINDOW_SECONDS, default 60.
    pub supervisor_restart_window: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            plan_refresh_interval: Duration::from_secs(20),
            plan_full_refresh_interval: Duration::from_secs(300),
            plan_min_write_interval: Duration::from_secs(1),
            plan_action_details_cap: 1500,
            plan_workflow_max_age: Duration::from_secs(24 * 3600),
            master_fetch_interval: Duration::from_secs(60),
            master_grace_period: Duration::from_secs(15),
            master_claim_lead: Duration::ZERO,
            worker_count: default_worker_count(),
            worker_single_job_mode: true,
            worker_stagger: Duration::from_secs(1),
            worker_cooldown: Duration::from_secs(10),
            recently_processed: Duration::from_secs(30),
            backlog_window: Duration::from_secs(60),
            execution_retention_days: 30,
            prune_interval: Duration::from_secs(3_600),
            prune_batch: 1_000,
            memory_throttle_threshold: 90.0,
            memory_resume_threshold: 80.0,
            gpu_throttle_threshold: 85.0,
            gpu_resume_threshold: 75.0,
            swap_throttle_threshold: 70.0,
            memory_check_interval: Duration::from_secs(5),
            schedule_lock_timeout: Duration::from_secs(300),
            schedule_execution_timeout: Duration::from_secs(600),
            max_runs_per_tick: 500,
            default_timezone: chrono_tz::Asia::Riyadh,
            database_url: "sqlite://data/ruled.db".to_string(),
            plan_file: PathBuf::from("data/execution_plan.json"),
            shutdown_marker_file: PathBuf::from("data/shutdown_marker.json"),
            http_addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            api_token: None,
            api_tokens: Vec::new(),
            instance_id: hostname(),
            partition: None,
            partition_count: 64,
            partition_lease_ttl: Duration::from_secs(30),
            partition_lease_retry: Duration::from_secs(1),
            log_format: LogFormat::Pretty,
            command_actions_enabled: false,
            http_action_allow_private: false,
            shutdown_grace: Duration::from_secs(30),
            supervisor_max_restarts: 5,
            supervisor_restart_window: Duration::from_secs(60),
        }
    }
}

/// max(10, 90% of the CPU cores): jobs mostly wait on I/O, so even a small
/// machine gets ten workers.
pub fn default_worker_count() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores * 9 / 10).max(10)
}

/// This machine's host name (INSTANCE_ID's default).
pub fn hostname() -> String {
    let mut buffer = [0u8; 256];
    // SAFETY: the buffer is valid for its whole length and gethostname writes
    // at most that many bytes.
    let rc = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) };
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    match std::str::from_utf8(&buffer[..end]) {
        Ok(name) if rc == 0 && !name.is_empty() => name.to_string(),
        _ => "ruled".to_string(),
    }
}

impl Config {
    /// Every accepted bearer token with its name: API_TOKENS, then
    /// API_TOKEN as [`API_TOKEN_NAME`]. Empty means the API is read-only.
    pub fn tokens(&self) -> Vec<NamedToken> {
        let mut tokens = self.api_tokens.clone();
        if let Some(token) = &self.api_token {
            tokens.push(NamedToken {
                name: API_TOKEN_NAME.to_string(),
                token: token.clone(),
            });
        }
        tokens
    }

    /// Reads `.env` if present, then the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        // A missing .env is the normal case; a malformed one is not worth
        // refusing to start over, the variables it defines are then unset.
        let _ = dotenvy::dotenv();
        Config::from_lookup(|name| std::env::var(name).ok())
    }

    /// Builds a config from explicit variables (tests, `ruled simulate`).
    pub fn from_map(vars: &HashMap<String, String>) -> Result<Config, ConfigError> {
        Config::from_lookup(|name| vars.get(name).cloned())
    }

    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let env = Env { lookup: &lookup };
        let mut c = Config::default();
        env.seconds(
            "EXECUTION_PLAN_REFRESH_SECONDS",
            &mut c.plan_refresh_interval,
            true,
        )?;
        env.seconds(
            "PLAN_FULL_REFRESH_SECONDS",
            &mut c.plan_full_refresh_interval,
            true,
        )?;
        env.seconds(
            "PLAN_MIN_WRITE_INTERVAL_SECONDS",
            &mut c.plan_min_write_interval,
            false,
        )?;
        env.number("PLAN_ACTION_DETAILS_CAP", &mut c.plan_action_details_cap)?;
        let mut max_age_hours = c.plan_workflow_max_age.as_secs_f64() / 3600.0;
        env.float(
            "PLAN_WORKFLOW_MAX_AGE_HOURS",
            &mut max_age_hours,
            0.0,
            MAX_SECONDS / 3600.0,
        )?;
        c.plan_workflow_max_age = Duration::from_secs_f64(max_age_hours * 3600.0);
        env.seconds(
            "MASTER_FETCH_INTERVAL_SECONDS",
            &mut c.master_fetch_interval,
            true,
        )?;
        env.seconds(
            "MASTER_GRACE_PERIOD_SECONDS",
            &mut c.master_grace_period,
            false,
        )?;
        env.seconds("MASTER_CLAIM_LEAD_SECONDS", &mut c.master_claim_lead, false)?;
        if c.master_claim_lead > MAX_CLAIM_LEAD {
            return Err(env.error(
                "MASTER_CLAIM_LEAD_SECONDS",
                &format!("must be at most {} seconds", MAX_CLAIM_LEAD.as_secs()),
            ));
        }
        env.number("WORKER_COUNT", &mut c.worker_count)?;
        if c.worker_count == 0 {
            return Err(env.error("WORKER_COUNT", "must be at least 1"));
        }
        env.boolean("WORKER_SINGLE_JOB_MODE", &mut c.worker_single_job_mode)?;
        env.seconds("WORKER_STAGGER_SECONDS", &mut c.worker_stagger, false)?;
        env.seconds("WORKER_COOLDOWN_SECONDS", &mut c.worker_cooldown, false)?;
        env.seconds("BACKLOG_WINDOW_SECONDS", &mut c.backlog_window, true)?;
        env.seconds(
            "RECENTLY_PROCESSED_SECONDS",
            &mut c.recently_processed,
            false,
        )?;
        env.float(
            "MEMORY_THROTTLE_THRESHOLD",
            &mut c.memory_throttle_threshold,
            0.0,
            100.0,
        )?;
        env.float(
            "MEMORY_RESUME_THRESHOLD",
            &mut c.memory_resume_threshold,
            0.0,
            100.0,
        )?;
        env.float(
            "GPU_THROTTLE_THRESHOLD",
            &mut c.gpu_throttle_threshold,
            0.0,
            100.0,
        )?;
        env.float(
            "GPU_RESUME_THRESHOLD",
            &mut c.gpu_resume_threshold,
            0.0,
            100.0,
        )?;
        env.float(
            "SWAP_THROTTLE_THRESHOLD",
            &mut c.swap_throttle_threshold,
            0.0,
            100.0,
        )?;
        // Hysteresis needs a gap; equal thresholds would flap every sample.
        // The values go in the message: either side may be a default the
        // operator never wrote down.
        if c.memory_resume_threshold >= c.memory_throttle_threshold {
            return Err(env.error(
                "MEMORY_RESUME_THRESHOLD",
                &format!(
                    "{} must be below MEMORY_THROTTLE_THRESHOLD ({})",
                    c.memory_resume_threshold, c.memory_throttle_threshold
                ),
            ));
        }
        if c.gpu_resume_threshold >= c.gpu_throttle_threshold {
            return Err(env.error(
                "GPU_RESUME_THRESHOLD",
                &format!(
                    "{} must be below GPU_THROTTLE_THRESHOLD ({})",
                    c.gpu_resume_threshold, c.gpu_throttle_threshold
                ),
            ));
        }
        env.seconds("MEMORY_CHECK_INTERVAL", &mut c.memory_check_interval, true)?;
        env.seconds(
            "SCHEDULE_LOCK_TIMEOUT_SECONDS",
            &mut c.schedule_lock_timeout,
            true,
        )?;
        env.seconds(
            "SCHEDULE_EXECUTION_TIMEOUT_SECONDS",
            &mut c.schedule_execution_timeout,
            true,
        )?;
        env.number("EXECUTION_RETENTION_DAYS", &mut c.execution_retention_days)?;
        if c.execution_retention_days > 36_500 {
            return Err(env.error(
                "EXECUTION_RETENTION_DAYS",
                "at most 36500 (100 years); 0 keeps the history forever",
            ));
        }
        env.number("MAX_RUNS_PER_TICK", &mut c.max_runs_per_tick)?;
        if c.max_runs_per_tick == 0 {
            return Err(env.error("MAX_RUNS_PER_TICK", "must be at least 1"));
        }
        if let Some(zone) = env.get("DEFAULT_TIMEZONE") {
            c.default_timezone =
                parse_timezone(&zone).map_err(|e| env.error("DEFAULT_TIMEZONE", &e.to_string()))?;
        }
        if let Some(url) = env.get("DATABASE_URL") {
            validate_database_url(&url).map_err(|reason| ConfigError {
                variable: "DATABASE_URL",
                // Not env.error: its value may hold a password.
                value: crate::actions::secrets::mask_database_url(&url),
                reason: reason.to_string(),
            })?;
            c.database_url = url;
        }
        env.path("PLAN_FILE", &mut c.plan_file)?;
        env.path("SHUTDOWN_MARKER_FILE", &mut c.shutdown_marker_file)?;
        env.parsed("HTTP_ADDR", &mut c.http_addr)?;
        c.api_token = env.get("API_TOKEN");
        if let Some(text) = env.get("API_TOKENS") {
            // Not env.error: its value would quote every token.
            let hidden = |reason: String| ConfigError {
                variable: "API_TOKENS",
                value: "***".to_string(),
                reason,
            };
            c.api_tokens = parse_named_tokens(&text).map_err(hidden)?;
            if let Some(token) = &c.api_token {
                if c.api_tokens.iter().any(|t| t.name == API_TOKEN_NAME) {
                    return Err(hidden(format!(
                        "the name {API_TOKEN_NAME:?} is API_TOKEN's; choose another"
                    )));
                }
                if c.api_tokens.iter().any(|t| &t.token == token) {
                    return Err(hidden("an entry repeats API_TOKEN's token".to_string()));
                }
            }
        }
        if let Some(id) = env.get("INSTANCE_ID") {
            c.instance_id = id;
        }
        if let Some(partition) = env.get("PARTITION") {
            c.partition = Some(
                partition
                    .parse()
                    .map_err(|e: String| env.error("PARTITION", &e))?,
            );
        }
        env.parsed("PARTITION_COUNT", &mut c.partition_count)?;
        if !(1..=MAX_PARTITION_COUNT).contains(&c.partition_count) {
            return Err(env.error(
                "PARTITION_COUNT",
                &format!("must be between 1 and {MAX_PARTITION_COUNT}"),
            ));
        }
        if let Some(partition) = c.partition
            && partition.count > c.partition_count
        {
            return Err(env.error(
                "PARTITION",
                &format!(
                    "N must be at most PARTITION_COUNT ({}): each k/N prefers the partitions p with p mod N = k",
                    c.partition_count
                ),
            ));
        }
        env.seconds(
            "PARTITION_LEASE_TTL_SECONDS",
            &mut c.partition_lease_ttl,
            true,
        )?;
        env.seconds(
            "PARTITION_LEASE_RETRY_SECONDS",
            &mut c.partition_lease_retry,
            true,
        )?;
        // A lease is renewed every third of its TTL and the renewal loop runs
        // every retry interval: a retry interval longer than a third would let
        // a lease run out before three renewals were even tried.
        if c.partition_lease_retry * 3 > c.partition_lease_ttl {
            return Err(env.error(
                "PARTITION_LEASE_RETRY_SECONDS",
                &format!(
                    "must be at most a third of PARTITION_LEASE_TTL_SECONDS ({:?}), so a lease is renewed three times before it expires",
                    c.partition_lease_ttl
                ),
            ));
        }
        if let Some(format) = env.get("LOG_FORMAT") {
            c.log_format = match format.to_ascii_lowercase().as_str() {
                "pretty" => LogFormat::Pretty,
                "json" => LogFormat::Json,
                _ => return Err(env.error("LOG_FORMAT", "expected pretty or json")),
            };
        }
        env.boolean("COMMAND_ACTIONS_ENABLED", &mut c.command_actions_enabled)?;
        env.boolean(
            "HTTP_ACTION_ALLOW_PRIVATE",
            &mut c.http_action_allow_private,
        )?;
        env.seconds("SHUTDOWN_GRACE_SECONDS", &mut c.shutdown_grace, false)?;
        env.parsed("SUPERVISOR_MAX_RESTARTS", &mut c.supervisor_max_restarts)?;
        env.seconds(
            "SUPERVISOR_RESTART_WINDOW_SECONDS",
            &mut c.supervisor_restart_window,
            true,
        )?;
        Ok(c)
    }
}

fn validate_database_url(url: &str) -> Result<(), &'static str> {
    let (scheme, rest) = url
        .split_once(':')
        .ok_or("expected sqlite://PATH, sqlite::memory: or postgres://USER@HOST/DB")?;
    match scheme {
        "sqlite" if !rest.trim_start_matches('/').is_empty() => Ok(()),
        "postgres" | "postgresql" if rest.starts_with("//") && rest.len() > 2 => Ok(()),
        "sqlite" | "postgres" | "postgresql" => Err("the URL has no path or host"),
        _ => Err("unsupported scheme: expected sqlite or postgres"),
    }
}

/// Reads one variable at a time so every error names its variable.
struct Env<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
}

impl Env<'_> {
    /// Unset and empty are the same: `FOO=` in a .env file means "default".
    fn get(&self, name: &str) -> Option<String> {
        (self.lookup)(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    fn error(&self, variable: &'static str, reason: &str) -> ConfigError {
        ConfigError {
            variable,
            value: self.get(variable).unwrap_or_default(),
            reason: reason.to_string(),
        }
    }

    fn parsed<T: FromStr>(&self, name: &'static str, slot: &mut T) -> Result<(), ConfigError> {
        if let Some(text) = self.get(name) {
            *slot = text
                .parse()
                .map_err(|_| self.error(name, "not a valid value"))?;
        }
        Ok(())
    }

    fn number(&self, name: &'static str, slot: &mut usize) -> Result<(), ConfigError> {
        if let Some(text) = self.get(name) {
            *slot = text
                .parse()
                .map_err(|_| self.error(name, "expected a whole number"))?;
        }
        Ok(())
    }

    fn float(
        &self,
        name: &'static str,
        slot: &mut f64,
        min: f64,
        max: f64,
    ) -> Result<(), ConfigError> {
        if let Some(text) = self.get(name) {
            let value: f64 = text
                .parse()
                .map_err(|_| self.error(name, "expected a number"))?;
            if !(min..=max).contains(&value) {
                return Err(self.error(name, &format!("must be between {min} and {max}")));
            }
            *slot = value;
        }
        Ok(())
    }

    /// Seconds, fractions allowed so tests can run with sub-second intervals.
    fn seconds(
        &self,
        name: &'static str,
        slot: &mut Duration,
        positive: bool,
    ) -> Result<(), ConfigError> {
        if let Some(text) = self.get(name) {
            let value: f64 = text
                .parse()
                .map_err(|_| self.error(name, "expected a number of seconds"))?;
            if !value.is_finite() || value < 0.0 || (positive && value == 0.0) {
                let bound = if positive {
                    "greater than 0"
                } else {
                    "0 or more"
                };
                return Err(self.error(name, &format!("must be {bound} seconds")));
            }
            if value > MAX_SECONDS {
                return Err(self.error(
                    name,
                    &format!("must be at most {MAX_SECONDS} seconds (ten years)"),
                ));
            }
            *slot = Duration::from_secs_f64(value);
        }
        Ok(())
    }

    fn boolean(&self, name: &'static str, slot: &mut bool) -> Result<(), ConfigError> {
        if let Some(text) = self.get(name) {
            *slot = match text.to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" | "on" => true,
                "false" | "0" | "no" | "off" => false,
                _ => return Err(self.error(name, "expected true or false")),
            };
        }
        Ok(())
    }

    fn path(&self, name: &'static str, slot: &mut PathBuf) -> Result<(), ConfigError> {
        if let Some(text) = self.get(name) {
            *slot = PathBuf::from(text);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let vars = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_map(&vars)
    }

    #[test]
    fn defaults_match_the_design() {
        let c = config(&[]).unwrap();
        assert_eq!(c.plan_refresh_interval, Duration::from_secs(20));
        assert_eq!(c.master_fetch_interval, Duration::from_secs(60));
        assert_eq!(c.master_grace_period, Duration::from_secs(15));
        assert_eq!(c.master_claim_lead, Duration::ZERO);
        assert!(c.worker_count >= 10);
        assert!(c.worker_single_job_mode);
        assert_eq!(c.worker_cooldown, Duration::from_secs(10));
        assert_eq!(c.backlog_window, Duration::from_secs(60));
        assert_eq!(c.execution_retention_days, 30);
        assert_eq!(c.recently_processed, Duration::from_secs(30));
        assert_eq!(c.memory_throttle_threshold, 90.0);
        assert_eq!(c.memory_resume_threshold, 80.0);
        assert_eq!(c.gpu_throttle_threshold, 85.0);
        assert_eq!(c.gpu_resume_threshold, 75.0);
        assert_eq!(c.swap_throttle_threshold, 70.0);
        assert_eq!(c.memory_check_interval, Duration::from_secs(5));
        assert_eq!(c.schedule_lock_timeout, Duration::from_secs(300));
        assert_eq!(c.schedule_execution_timeout, Duration::from_secs(600));
        assert_eq!(c.max_runs_per_tick, 500);
        assert_eq!(c.default_timezone, chrono_tz::Asia::Riyadh);
        assert_eq!(c.database_url, "sqlite://data/ruled.db");
        assert_eq!(c.plan_action_details_cap, 1500);
        assert_eq!(c.plan_workflow_max_age, Duration::from_secs(86_400));
        assert_eq!(c.plan_full_refresh_interval, Duration::from_secs(300));
        let c = config(&[("PLAN_FULL_REFRESH_SECONDS", "42")]).unwrap();
        assert_eq!(c.plan_full_refresh_interval, Duration::from_secs(42));
        assert_eq!(c.http_addr.to_string(), "127.0.0.1:8080");
        assert_eq!(c.api_token, None);
        assert!(!c.instance_id.is_empty());
    }

    #[test]
    fn every_bad_value_names_its_variable() {
        let cases = [
            ("EXECUTION_PLAN_REFRESH_SECONDS", "soon"),
            ("EXECUTION_PLAN_REFRESH_SECONDS", "0"),
            ("WORKER_COUNT", "-3"),
            ("WORKER_SINGLE_JOB_MODE", "maybe"),
            ("DEFAULT_TIMEZONE", "Mars/Olympus"),
            ("DATABASE_URL", "mysql://x/y"),
            ("DATABASE_URL", "not a url"),
            ("HTTP_ADDR", "localhost"),
            ("PARTITION", "3/3"),
            ("LOG_FORMAT", "xml"),
            ("MEMORY_THROTTLE_THRESHOLD", "120"),
            ("MAX_RUNS_PER_TICK", "0"),
            ("BACKLOG_WINDOW_SECONDS", "0"),
            ("EXECUTION_RETENTION_DAYS", "-1"),
            ("EXECUTION_RETENTION_DAYS", "36501"),
            // Past what a Duration holds: an error, not a panic.
            ("EXECUTION_PLAN_REFRESH_SECONDS", "1e20"),
            ("SHUTDOWN_GRACE_SECONDS", "99999999999999999999"),
            ("PLAN_WORKFLOW_MAX_AGE_HOURS", "1e16"),
            ("PLAN_FULL_REFRESH_SECONDS", "0"),
            ("MASTER_CLAIM_LEAD_SECONDS", "-0.1"),
            ("MASTER_CLAIM_LEAD_SECONDS", "11"),
        ];
        for (variable, value) in cases {
            let err = config(&[(variable, value)]).unwrap_err();
            assert_eq!(err.variable, variable, "{value}");
            assert!(err.to_string().contains(variable), "{err}");
        }
    }

    #[test]
    fn a_refused_database_url_is_shown_without_its_password() {
        let err = config(&[("DATABASE_URL", "mysql://app:s3cret@db/x?password=t0p")]).unwrap_err();
        assert_eq!(err.variable, "DATABASE_URL");
        let text = err.to_string();
        assert!(!text.contains("s3cret") && !text.contains("t0p"), "{text}");
        assert!(text.contains("mysql://app:***@db/x"), "{text}");
    }

    #[test]
    fn resume_must_be_below_throttle() {
        let err = config(&[("MEMORY_RESUME_THRESHOLD", "95")]).unwrap_err();
        assert_eq!(err.variable, "MEMORY_RESUME_THRESHOLD");
        assert!(
            err.to_string()
                .contains("95 must be below MEMORY_THROTTLE_THRESHOLD (90)"),
            "{err}"
        );
        let err = config(&[("GPU_THROTTLE_THRESHOLD", "70")]).unwrap_err();
        assert_eq!(err.variable, "GPU_RESUME_THRESHOLD");
        assert!(
            err.to_string()
                .contains("75 must be below GPU_THROTTLE_THRESHOLD (70)"),
            "{err}"
        );
        // Equal levels would throttle and release on the same reading.
        let err = config(&[
            ("MEMORY_THROTTLE_THRESHOLD", "85"),
            ("MEMORY_RESUME_THRESHOLD", "85"),
        ])
        .unwrap_err();
        assert_eq!(err.variable, "MEMORY_RESUME_THRESHOLD");
        let err = config(&[("GPU_RESUME_THRESHOLD", "85")]).unwrap_err();
        assert_eq!(err.variable, "GPU_RESUME_THRESHOLD");
    }

    #[test]
    fn memory_thresholds_are_read() {
        let c = config(&[
            ("MEMORY_THROTTLE_THRESHOLD", "70"),
            ("MEMORY_RESUME_THRESHOLD", "60.5"),
            ("GPU_THROTTLE_THRESHOLD", "50"),
            ("GPU_RESUME_THRESHOLD", "40"),
            ("SWAP_THROTTLE_THRESHOLD", "30"),
            ("MEMORY_CHECK_INTERVAL", "0.5"),
        ])
        .unwrap();
        assert_eq!(
            (
                c.memory_throttle_threshold,
                c.memory_resume_threshold,
                c.gpu_throttle_threshold,
                c.gpu_resume_threshold,
                c.swap_throttle_threshold,
            ),
            (70.0, 60.5, 50.0, 40.0, 30.0)
        );
        assert_eq!(c.memory_check_interval, Duration::from_millis(500));
        for (variable, value) in [
            ("SWAP_THROTTLE_THRESHOLD", "101"),
            ("GPU_RESUME_THRESHOLD", "-1"),
            ("MEMORY_CHECK_INTERVAL", "0"),
        ] {
            assert_eq!(config(&[(variable, value)]).unwrap_err().variable, variable);
        }
    }

    #[test]
    fn values_are_read() {
        let c = config(&[
            ("EXECUTION_PLAN_REFRESH_SECONDS", "0.25"),
            ("PARTITION", "1/3"),
            ("DEFAULT_TIMEZONE", "America/New_York"),
            ("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"),
            ("LOG_FORMAT", "json"),
            ("API_TOKEN", "s3cret"),
            ("EMPTY_IS_DEFAULT", ""),
            ("WORKER_COUNT", ""),
        ])
        .unwrap();
        assert_eq!(c.plan_refresh_interval, Duration::from_millis(250));
        assert_eq!(c.partition, Some(Partition { index: 1, count: 3 }));
        assert_eq!(c.default_timezone, chrono_tz::America::New_York);
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(c.api_token.as_deref(), Some("s3cret"));
        assert!(c.worker_count >= 10);
    }

    #[test]
    fn named_tokens_are_read_with_api_token_as_api() {
        let c = config(&[
            ("API_TOKENS", " alice:a-1 , bob:b:2"),
            ("API_TOKEN", "legacy"),
        ])
        .unwrap();
        let tokens: Vec<(String, String)> =
            c.tokens().into_iter().map(|t| (t.name, t.token)).collect();
        assert_eq!(
            tokens,
            [
                ("alice".to_string(), "a-1".to_string()),
                ("bob".to_string(), "b:2".to_string()),
                ("api".to_string(), "legacy".to_string()),
            ]
        );
        assert!(!format!("{c:?}").contains("a-1"), "Debug leaks a token");
        assert!(config(&[]).unwrap().tokens().is_empty());
    }

    #[test]
    fn bad_api_tokens_name_the_variable_and_hide_the_tokens() {
        for (value, reason) in [
            ("alice", "no ':'"),
            ("alice:", "non-empty"),
            (":secret-x", "1 to 40"),
            ("al ice:secret-x", "only letters"),
            ("alice:secret-x,,bob:y", "entry 2 is empty"),
            ("alice:secret-x,alice:y", "used twice"),
            ("alice:secret-x,bob:secret-x", "repeats"),
            ("api:secret-x", "API_TOKEN's"),
        ] {
            let err = config(&[("API_TOKENS", value), ("API_TOKEN", "t")]).unwrap_err();
            assert_eq!(err.variable, "API_TOKENS", "{value}");
            let text = err.to_string();
            assert!(text.contains(reason), "{value}: {text}");
            assert!(!text.contains("secret-x"), "{value}: {text}");
        }
    }
}
