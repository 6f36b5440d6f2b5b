//! Settings and the clock, shared by ruled's benches and `benches/peers`
//! (which includes this file by path: it cannot depend on ruled).

/// The setting `name` from the environment, or `default`; a value that
/// does not parse stops the bench rather than measuring something else.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(value) => value
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?}: not a number")),
        Err(_) => default,
    }
}

/// Now, in the epoch milliseconds the tables store.
pub fn wall_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
