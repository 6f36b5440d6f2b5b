//! Where memory readings come from: the machine ([`SystemSampler`]) or a
//! test ([`FedSampler`]). The guard only sees the [`MemorySampler`] trait.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use nvml_wrapper::Nvml;
use serde::Serialize;
use sysinfo::System;
use tracing::{info, warn};

use super::cgroup::CgroupMemory;
use super::{MemoryError, MemoryReading, Usage};

/// A source of readings. Sampling is synchronous and quick (a few small
/// files and driver calls), so the guard calls it from its handler.
pub trait MemorySampler: Send {
    /// Whether GPU memory is checked, and if not, why.
    fn gpu(&self) -> GpuSupport;

    fn sample(&mut self) -> Result<MemoryReading, MemoryError>;
}

/// Makes the guard's sampler on every (re)start of the guard: a sampler
/// holds driver handles, which die with the actor that owns them.
pub type SamplerFactory =
    Arc<dyn Fn() -> Result<Box<dyn MemorySampler>, MemoryError> + Send + Sync>;

/// The service's default: [`SystemSampler`].
pub fn system_sampler_factory() -> SamplerFactory {
    Arc::new(|| Ok(Box::new(SystemSampler::new()?) as Box<dyn MemorySampler>))
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuSupport {
    /// GPU memory is checked on this many NVIDIA devices.
    Devices(u32),
    /// GPU checks are off, for this reason.
    Off(String),
}

impl fmt::Display for GpuSupport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuSupport::Devices(n) => write!(f, "{n} NVIDIA device(s)"),
            GpuSupport::Off(reason) => write!(f, "off: {reason}"),
        }
    }
}

/// RAM and swap from sysinfo, RAM measured against the cgroup limit when
/// there is one, GPU memory from NVML on every device.
pub struct SystemSampler {
    system: System,
    cgroup: CgroupMemory,
    /// `None` when the driver library is missing or has no device: NVML is
    /// loaded at run time, so a machine without it runs with GPU checks off.
    nvml: Option<Nvml>,
    gpu: GpuSupport,
    /// Devices whose last query failed: a broken device is logged when it
    /// breaks and when it answers again, not at every sample.
    failing: BTreeSet<u32>,
}

impl SystemSampler {
    pub fn new() -> Result<SystemSampler, MemoryError> {
        let system = System::new().map_err(|e| MemoryError::System(e.to_string()))?;
        let (nvml, gpu) = match Nvml::init() {
            Err(e) => (None, GpuSupport::Off(format!("no NVIDIA driver ({e})"))),
            Ok(nvml) => match nvml.device_count() {
                Ok(0) => (
                    None,
                    GpuSupport::Off("the NVIDIA driver reports no device".into()),
                ),
                Ok(n) => (Some(nvml), GpuSupport::Devices(n)),
                Err(e) => (
                    None,
                    GpuSupport::Off(format!("cannot count NVIDIA devices: {e}")),
                ),
            },
        };
        Ok(SystemSampler {
            system,
            cgroup: CgroupMemory::of_this_process(),
            nvml,
            gpu,
            failing: BTreeSet::new(),
        })
    }

    fn gpus(&mut self) -> Option<Vec<Usage>> {
        let nvml = self.nvml.as_ref()?;
        let GpuSupport::Devices(count) = self.gpu else {
            return None;
        };
        let mut gpus = Vec::with_capacity(count as usize);
        for index in 0..count {
            match nvml
                .device_by_index(index)
                .and_then(|device| device.memory_info())
            {
                Ok(memory) => {
                    if self.failing.remove(&index) {
                        info!("GPU {index} memory readable again");
                    }
                    gpus.push(Usage::new(memory.used, memory.total));
                }
                Err(e) => {
                    if self.failing.insert(index) {
                        warn!(
                            "⚠️ GPU {index} memory unreadable, not counted until it answers: {e}"
                        );
                    }
                }
            }
        }
        Some(gpus)
    }
}

impl MemorySampler for SystemSampler {
    fn gpu(&self) -> GpuSupport {
        self.gpu.clone()
    }

    fn sample(&mut self) -> Result<MemoryReading, MemoryError> {
        self.system.refresh_memory();
        let total = self.system.total_memory();
        if total == 0 {
            return Err(MemoryError::NoRam);
        }
        let host = Usage::new(total.saturating_sub(self.system.available_memory()), total);
        let ram = match self.cgroup.usage() {
            // A limit at or above the machine's RAM never binds first.
            Some(cgroup) if cgroup.limit_bytes < total => {
                Usage::new(cgroup.used_bytes, cgroup.limit_bytes)
            }
            _ => host,
        };
        let swap = Usage::new(self.system.used_swap(), self.system.total_swap());
        Ok(MemoryReading {
            ram,
            swap,
            gpus: self.gpus(),
        })
    }
}

/// Readings a test sets: every sampler made by [`FedSampler::factory`]
/// reads the same feed, so a restarted guard sees what the test set.
#[derive(Debug, Clone)]
pub struct FedSampler {
    reading: Arc<Mutex<MemoryReading>>,
}

impl FedSampler {
    pub fn new(initial: MemoryReading) -> FedSampler {
        FedSampler {
            reading: Arc::new(Mutex::new(initial)),
        }
    }

    /// What the next sample returns.
    pub fn set(&self, reading: MemoryReading) {
        *self.reading.lock().unwrap_or_else(PoisonError::into_inner) = reading;
    }

    pub fn current(&self) -> MemoryReading {
        self.reading
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn factory(&self) -> SamplerFactory {
        let feed = self.clone();
        Arc::new(move || Ok(Box::new(feed.clone()) as Box<dyn MemorySampler>))
    }
}

impl MemorySampler for FedSampler {
    fn gpu(&self) -> GpuSupport {
        match &self.current().gpus {
            Some(gpus) => GpuSupport::Devices(gpus.len() as u32),
            None => GpuSupport::Off("no GPU in the fed readings".into()),
        }
    }

    fn sample(&mut self) -> Result<MemoryReading, MemoryError> {
        Ok(self.current())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sampler_of_a_feed_reads_what_was_set_last() {
        let feed = FedSampler::new(MemoryReading::ram_percent(10.0));
        let factory = feed.factory();
        let mut first = factory().unwrap();
        let mut second = factory().unwrap();
        assert_eq!(first.sample().unwrap(), MemoryReading::ram_percent(10.0));
        assert!(matches!(first.gpu(), GpuSupport::Off(_)));
        feed.set(MemoryReading::ram_percent(91.0).with_gpu_percent(5.0));
        assert_eq!(
            second.sample().unwrap(),
            MemoryReading::ram_percent(91.0).with_gpu_percent(5.0)
        );
        assert_eq!(first.gpu(), GpuSupport::Devices(1));
    }
}
