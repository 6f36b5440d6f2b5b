//! Memory throttling (seed 004): when RAM, swap or GPU memory runs high, no
//! new work starts until it drops again. Pure: the thresholds, the
//! hysteresis and the reasons logged. Readings come from
//! [`sampler`] (sysinfo, cgroups, NVML, or readings a test feeds); the
//! [`MemoryGuardActor`](crate::actors::memory_guard::MemoryGuardActor) turns
//! them into pushes to the master. [`heap`] gives freed memory back.

pub mod cgroup;
pub mod heap;
pub mod sampler;

use std::fmt;

use serde::Serialize;

pub use sampler::{
    FedSampler, GpuSupport, MemorySampler, SamplerFactory, SystemSampler, system_sampler_factory,
};

use crate::config::Config;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    #[error("cannot read system memory: {0}")]
    System(String),
    #[error("the system reports no RAM; cannot compute a usage ratio")]
    NoRam,
}

/// Bytes in use out of a total.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub used_bytes: u64,
    pub total_bytes: u64,
}

/// The `total_bytes` of [`Usage::percent`]: large enough that any
/// percentage with a few decimals is exact.
const PERCENT_SCALE: u64 = 1_000_000_000;

impl Usage {
    pub fn new(used_bytes: u64, total_bytes: u64) -> Usage {
        Usage {
            used_bytes,
            total_bytes,
        }
    }

    /// `percent` % of an arbitrary total: for fed readings.
    pub fn percent(percent: f64) -> Usage {
        let used = (percent / 100.0 * PERCENT_SCALE as f64).round() as u64;
        Usage::new(used, PERCENT_SCALE)
    }

    /// 0 to 1; nothing to use (no swap configured) counts as unused.
    pub fn ratio(&self) -> f64 {
        if self.total_bytes == 0 {
            return 0.0;
        }
        (self.used_bytes as f64 / self.total_bytes as f64).clamp(0.0, 1.0)
    }

    /// Multiplied before dividing so whole and decimal percentages compare
    /// exactly against the thresholds (91 % of 10^9 is 91.0, not 90.999…).
    pub fn percent_used(&self) -> f64 {
        if self.total_bytes == 0 {
            return 0.0;
        }
        (self.used_bytes as f64 * 100.0 / self.total_bytes as f64).clamp(0.0, 100.0)
    }
}

/// One sample of every resource the guard watches.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryReading {
    /// Under a cgroup memory limit, the cgroup's usage against its limit.
    pub ram: Usage,
    /// Total 0 when the machine has no swap.
    pub swap: Usage,
    /// One entry per NVIDIA device; `None` when GPU checks are off.
    pub gpus: Option<Vec<Usage>>,
}

impl MemoryReading {
    /// RAM at `ram` %, no swap in use, GPU checks off.
    pub fn ram_percent(ram: f64) -> MemoryReading {
        MemoryReading {
            ram: Usage::percent(ram),
            swap: Usage::percent(0.0),
            gpus: None,
        }
    }

    pub fn with_swap_percent(self, swap: f64) -> MemoryReading {
        MemoryReading {
            swap: Usage::percent(swap),
            ..self
        }
    }

    /// One GPU at `gpu` %.
    pub fn with_gpu_percent(self, gpu: f64) -> MemoryReading {
        MemoryReading {
            gpus: Some(vec![Usage::percent(gpu)]),
            ..self
        }
    }

    /// The fullest device: one full GPU is enough to fail a job that lands
    /// on it, however empty the others are.
    pub fn gpu_ratio(&self) -> Option<f64> {
        self.gpus
            .as_ref()
            .and_then(|gpus| gpus.iter().map(Usage::ratio).reduce(f64::max))
    }
}

/// The `resource` label of `ruled_memory_used_ratio`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    Ram,
    Swap,
    Gpu,
}

impl Resource {
    pub fn as_str(self) -> &'static str {
        match self {
            Resource::Ram => "ram",
            Resource::Swap => "swap",
            Resource::Gpu => "gpu",
        }
    }
}

/// Percentages (0–100), as in the environment variables.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    pub ram_throttle: f64,
    pub ram_resume: f64,
    pub gpu_throttle: f64,
    pub gpu_resume: f64,
    /// Swap has no resume level of its own (seed 004): it holds the
    /// throttle while above this, like RAM above its resume level.
    pub swap_throttle: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds::from_config(&Config::default())
    }
}

impl Thresholds {
    pub fn from_config(config: &Config) -> Thresholds {
        Thresholds {
            ram_throttle: config.memory_throttle_threshold,
            ram_resume: config.memory_resume_threshold,
            gpu_throttle: config.gpu_throttle_threshold,
            gpu_resume: config.gpu_resume_threshold,
            swap_throttle: config.swap_throttle_threshold,
        }
    }

    /// What is over its throttle level, e.g. "RAM at 91.0%"; empty when
    /// nothing is.
    fn over_throttle(&self, reading: &MemoryReading) -> Vec<String> {
        let mut over = Vec::new();
        let ram = reading.ram.percent_used();
        if ram > self.ram_throttle {
            over.push(format!("RAM at {ram:.1}%"));
        }
        let swap = reading.swap.percent_used();
        if swap > self.swap_throttle {
            over.push(format!("swap at {swap:.1}%"));
        }
        for (index, gpu) in reading.gpus.iter().flatten().enumerate() {
            let gpu = gpu.percent_used();
            if gpu > self.gpu_throttle {
                over.push(format!("GPU {index} at {gpu:.1}%"));
            }
        }
        over
    }

    /// Whether everything is back below its resume level.
    fn all_resumed(&self, reading: &MemoryReading) -> bool {
        reading.ram.percent_used() < self.ram_resume
            && reading.swap.percent_used() <= self.swap_throttle
            && reading
                .gpus
                .iter()
                .flatten()
                .all(|gpu| gpu.percent_used() < self.gpu_resume)
    }
}

/// What the guard tells the master (and the master its workers).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct ThrottleStatus {
    pub throttled: bool,
    /// Why, while throttled: "RAM at 91.0%".
    pub reason: Option<String>,
}

/// A state change of the gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ThrottleChange {
    Throttled { reason: String },
    Released,
}

impl fmt::Display for ThrottleChange {
    /// Seed 004's log lines, word for word.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ThrottleChange::Throttled { reason } => {
                write!(f, "🚨 MEMORY THROTTLE ACTIVE: {reason}")
            }
            ThrottleChange::Released => f.write_str("✅ MEMORY THROTTLE RELEASED"),
        }
    }
}

/// Hysteresis over readings: throttles when any resource goes above its
/// throttle level, releases only once every resource is below its resume
/// level, so a value hovering near one threshold does not flap.
#[derive(Debug, Clone)]
pub struct ThrottleGate {
    thresholds: Thresholds,
    reason: Option<String>,
}

impl ThrottleGate {
    /// Starts released: nothing is known to be high yet.
    pub fn new(thresholds: Thresholds) -> ThrottleGate {
        ThrottleGate {
            thresholds,
            reason: None,
        }
    }

    /// Starts throttled, as an earlier gate left it: only a reading under
    /// every resume level releases it.
    pub fn still_throttled(thresholds: Thresholds, reason: String) -> ThrottleGate {
        ThrottleGate {
            thresholds,
            reason: Some(reason),
        }
    }

    pub fn is_throttled(&self) -> bool {
        self.reason.is_some()
    }

    pub fn status(&self) -> ThrottleStatus {
        ThrottleStatus {
            throttled: self.is_throttled(),
            reason: self.reason.clone(),
        }
    }

    /// Takes a reading; returns the change it causes, if any.
    pub fn observe(&mut self, reading: &MemoryReading) -> Option<ThrottleChange> {
        if self.is_throttled() {
            if self.thresholds.all_resumed(reading) {
                self.reason = None;
                return Some(ThrottleChange::Released);
            }
            return None;
        }
        let over = self.thresholds.over_throttle(reading);
        if over.is_empty() {
            return None;
        }
        let reason = over.join(", ");
        self.reason = Some(reason.clone());
        Some(ThrottleChange::Throttled { reason })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ram(percent: f64) -> MemoryReading {
        MemoryReading::ram_percent(percent)
    }

    fn throttled(reason: &str) -> Option<ThrottleChange> {
        Some(ThrottleChange::Throttled {
            reason: reason.to_string(),
        })
    }

    /// Each case feeds its readings in order to a fresh gate with the
    /// seed's thresholds and checks the change after every one.
    #[test]
    fn hysteresis_table() {
        type Step = (MemoryReading, Option<ThrottleChange>, bool);
        let released = Some(ThrottleChange::Released);
        let cases: Vec<(&str, Vec<Step>)> = vec![
            (
                "RAM 91 throttles, 85 holds, 79 releases",
                vec![
                    (ram(50.0), None, false),
                    (ram(91.0), throttled("RAM at 91.0%"), true),
                    (ram(85.0), None, true),
                    (ram(95.0), None, true),
                    (ram(80.0), None, true),
                    (ram(79.0), released.clone(), false),
                    (ram(85.0), None, false),
                ],
            ),
            (
                "at the throttle level is not above it",
                vec![
                    (ram(90.0), None, false),
                    (ram(90.1), throttled("RAM at 90.1%"), true),
                ],
            ),
            (
                "swap 71 throttles, releases at its own level",
                vec![
                    (ram(10.0).with_swap_percent(70.0), None, false),
                    (
                        ram(10.0).with_swap_percent(71.0),
                        throttled("swap at 71.0%"),
                        true,
                    ),
                    (ram(10.0).with_swap_percent(70.5), None, true),
                    (ram(10.0).with_swap_percent(70.0), released.clone(), false),
                ],
            ),
            (
                "GPU 86 throttles, 80 holds, 74 releases",
                vec![
                    (ram(10.0).with_gpu_percent(85.0), None, false),
                    (
                        ram(10.0).with_gpu_percent(86.0),
                        throttled("GPU 0 at 86.0%"),
                        true,
                    ),
                    (ram(10.0).with_gpu_percent(80.0), None, true),
                    (ram(10.0).with_gpu_percent(75.0), None, true),
                    (ram(10.0).with_gpu_percent(74.0), released.clone(), false),
                ],
            ),
            (
                "every resource must be back below its resume level",
                vec![
                    (
                        ram(91.0).with_gpu_percent(86.0),
                        throttled("RAM at 91.0%, GPU 0 at 86.0%"),
                        true,
                    ),
                    (ram(70.0).with_gpu_percent(80.0), None, true),
                    (ram(85.0).with_gpu_percent(50.0), None, true),
                    (ram(70.0).with_gpu_percent(50.0), released.clone(), false),
                ],
            ),
            (
                "one full device of several is enough",
                vec![(
                    MemoryReading {
                        gpus: Some(vec![Usage::percent(10.0), Usage::percent(99.0)]),
                        ..ram(10.0)
                    },
                    throttled("GPU 1 at 99.0%"),
                    true,
                )],
            ),
            (
                "no GPU and no swap never throttle",
                vec![(
                    MemoryReading {
                        swap: Usage::new(0, 0),
                        ..ram(10.0)
                    },
                    None,
                    false,
                )],
            ),
        ];
        for (name, steps) in cases {
            let mut gate = ThrottleGate::new(Thresholds::default());
            for (i, (reading, change, after)) in steps.into_iter().enumerate() {
                assert_eq!(gate.observe(&reading), change, "{name}, step {i}");
                assert_eq!(gate.is_throttled(), after, "{name}, step {i}");
                assert_eq!(gate.status().throttled, after, "{name}, step {i}");
            }
        }
    }

    #[test]
    fn thresholds_come_from_the_config() {
        let config = Config {
            memory_throttle_threshold: 60.0,
            memory_resume_threshold: 50.0,
            ..Config::default()
        };
        let mut gate = ThrottleGate::new(Thresholds::from_config(&config));
        assert_eq!(gate.observe(&ram(61.0)), throttled("RAM at 61.0%"));
        assert_eq!(gate.observe(&ram(55.0)), None);
        assert_eq!(gate.observe(&ram(49.0)), Some(ThrottleChange::Released));
        assert_eq!(
            Thresholds::default(),
            Thresholds {
                ram_throttle: 90.0,
                ram_resume: 80.0,
                gpu_throttle: 85.0,
                gpu_resume: 75.0,
                swap_throttle: 70.0,
            }
        );
    }

    #[test]
    fn the_status_carries_the_reason() {
        let mut gate = ThrottleGate::new(Thresholds::default());
        gate.observe(&ram(97.24));
        assert_eq!(
            gate.status(),
            ThrottleStatus {
                throttled: true,
                reason: Some("RAM at 97.2%".to_string()),
            }
        );
    }

    #[test]
    fn log_lines_are_the_seeds() {
        let active = ThrottleChange::Throttled {
            reason: "RAM at 91.0%".into(),
        };
        assert_eq!(
            active.to_string(),
            "🚨 MEMORY THROTTLE ACTIVE: RAM at 91.0%"
        );
        assert_eq!(
            ThrottleChange::Released.to_string(),
            "✅ MEMORY THROTTLE RELEASED"
        );
    }

    #[test]
    fn ratios_stay_between_zero_and_one() {
        assert_eq!(Usage::new(0, 0).ratio(), 0.0);
        assert_eq!(Usage::new(5, 0).percent_used(), 0.0);
        assert_eq!(Usage::new(3, 4).ratio(), 0.75);
        // A cgroup's usage can exceed its limit for a moment.
        assert_eq!(Usage::new(5, 4).ratio(), 1.0);
        assert_eq!(Usage::percent(91.0).percent_used(), 91.0);
        let reading = MemoryReading {
            gpus: Some(vec![Usage::percent(20.0), Usage::percent(60.0)]),
            ..ram(10.0)
        };
        assert_eq!(reading.gpu_ratio(), Some(0.6));
        assert_eq!(ram(10.0).gpu_ratio(), None);
    }
}
