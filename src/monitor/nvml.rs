//! NVML through nvml-wrapper (libnvidia-ml.so.1 loaded at run time).

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use std::collections::HashMap;

use super::{procfs, GpuError, GpuQuery, GpuSample, MigSample, ProcessSample};

/// What rarely changes about a GPU, asked for once a minute rather than at
/// every sample (each NVML call is a driver round trip).
#[derive(Default)]
struct Fixed {
    name: Option<String>,
    uuid: Option<String>,
    mig: bool,
    asked: Option<std::time::Instant>,
}

/// The real NVML. The library stays loaded for the life of the process
/// (leaked on purpose), so device handles are looked up once and kept.
pub struct NvmlQuery {
    nvml: &'static Nvml,
    /// GPUs do not come and go under a running driver: counted once a minute.
    count: Option<(u32, std::time::Instant)>,
    devices: HashMap<u32, Device<'static>>,
    fixed: HashMap<u32, Fixed>,
    pids: procfs::PidMap,
    /// Command lines by PID, read once per process.
    commands: HashMap<u32, Option<String>>,
}

const FIXED_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

impl NvmlQuery {
    pub fn open() -> Result<Self, GpuError> {
        let nvml = Nvml::init().map_err(|e| GpuError::Nvml(e.to_string()))?;
        Ok(NvmlQuery {
            nvml: Box::leak(Box::new(nvml)),
            count: None,
            devices: HashMap::new(),
            fixed: HashMap::new(),
            pids: procfs::PidMap::default(),
            commands: HashMap::new(),
        })
    }
}

fn used(m: UsedGpuMemory) -> Option<u64> {
    match m {
        UsedGpuMemory::Used(b) => Some(b),
        UsedGpuMemory::Unavailable => None,
    }
}

impl GpuQuery for NvmlQuery {
    fn device_count(&mut self) -> Result<u32, GpuError> {
        if let Some((n, at)) = self.count {
            if at.elapsed() < FIXED_EVERY {
                return Ok(n);
            }
        }
        let n = self.nvml.device_count().map_err(|e| GpuError::Nvml(e.to_string()))?;
        self.count = Some((n, std::time::Instant::now()));
        Ok(n)
    }

    fn sample(&mut self, index: u32) -> GpuSample {
        let mut s = GpuSample { index, ..Default::default() };
        if let std::collections::hash_map::Entry::Vacant(e) = self.devices.entry(index) {
            match self.nvml.device_by_index(index) {
                Ok(d) => {
                    e.insert(d);
                }
                Err(err) => {
                    s.errors.push(format!("device {index}: {err}"));
                    return s;
                }
            }
        }
        let dev = &self.devices[&index];
        let mut errors = Vec::new();
        let mut note = |what: &str, e: NvmlError| errors.push(format!("{what}: {e}"));
        let fixed = self.fixed.entry(index).or_default();
        if fixed.asked.is_none_or(|t| t.elapsed() > FIXED_EVERY) {
            fixed.name = dev.name().map_err(|e| note("name", e)).ok();
            fixed.uuid = dev.uuid().map_err(|e| note("uuid", e)).ok();
            fixed.mig = dev.mig_mode().map(|m| m.current == 1).unwrap_or(false);
            fixed.asked = Some(std::time::Instant::now());
        }
        let mem = dev.memory_info().map_err(|e| note("memory", e)).ok();
        let util = dev.utilization_rates().map_err(|e| note("utilization", e)).ok();
        let mut procs = Vec::new();
        match dev.running_compute_processes() {
            Ok(p) => procs.extend(p),
            Err(e) => note("processes", e),
        }
        let mut mig = Vec::new();
        if fixed.mig {
            for i in 0..dev.mig_device_count().unwrap_or(0) {
                if let Ok(m) = dev.mig_device_by_index(i) {
                    let mem = m.memory_info().ok();
                    mig.push(MigSample {
                        index: i,
                        name: m.name().ok(),
                        total_bytes: mem.as_ref().map(|x| x.total),
                        used_bytes: mem.as_ref().map(|x| x.used),
                    });
                }
            }
        }
        s.name = fixed.name.clone();
        s.uuid = fixed.uuid.clone();
        s.errors = errors;
        if let Some(m) = mem {
            (s.total_bytes, s.used_bytes, s.free_bytes) = (Some(m.total), Some(m.used), Some(m.free));
        }
        if let Some(u) = util {
            (s.utilization_percent, s.memory_utilization_percent) = (Some(u.gpu), Some(u.memory));
        }
        s.mig = mig;
        self.pids.refresh_if_missing(procs.iter().map(|p| p.pid));
        // Forget processes that are gone, so a reused PID is read afresh.
        self.commands.retain(|pid, _| procs.iter().any(|p| p.pid == *pid));
        s.processes = procs
            .into_iter()
            .map(|p| {
                let local = self.pids.local(p.pid);
                let command = self.commands.entry(p.pid).or_insert_with(|| local.and_then(procfs::command)).clone();
                ProcessSample { pid: p.pid, local_pid: local, command, used_bytes: used(p.used_gpu_memory) }
            })
            .collect();
        s
    }
}

/// An NVML session watching one GPU's per-process memory.
pub struct ProcessMemory {
    nvml: Nvml,
    index: u32,
}

impl ProcessMemory {
    /// `index`: NVML's device index (equal to CUDA's where
    /// `CUDA_DEVICE_ORDER=PCI_BUS_ID` or on one-GPU machines).
    pub fn open(index: u32) -> Result<Self, GpuError> {
        let nvml = Nvml::init().map_err(|e| GpuError::Nvml(e.to_string()))?;
        nvml.device_by_index(index).map_err(|e| GpuError::Device { index, why: e.to_string() })?;
        Ok(ProcessMemory { nvml, index })
    }

    /// The GPU with this UUID (how CUDA's device N is found in NVML, whose
    /// order can differ), else NVML's device `index`.
    pub(crate) fn open_uuid(uuid: Option<&str>, index: u32) -> Result<Self, GpuError> {
        let nvml = Nvml::init().map_err(|e| GpuError::Nvml(e.to_string()))?;
        let found = uuid.and_then(|u| nvml.device_by_uuid(u).ok()).and_then(|d| d.index().ok());
        let index = found.unwrap_or(index);
        nvml.device_by_index(index).map_err(|e| GpuError::Device { index, why: e.to_string() })?;
        Ok(ProcessMemory { nvml, index })
    }

    /// NVML's index of the GPU watched.
    pub(crate) fn index(&self) -> u32 {
        self.index
    }

    /// Bytes `pid` holds on the GPU (context included), as `nvidia-smi`
    /// shows it; `None` when NVML does not list it or cannot say.
    pub(crate) fn used_by(&self, pid: u32) -> Option<u64> {
        let dev = self.nvml.device_by_index(self.index).ok()?;
        let procs = dev.running_compute_processes().ok()?;
        procs.into_iter().find(|p| p.pid == pid).and_then(|p| used(p.used_gpu_memory))
    }

    /// The device's used bytes (all processes).
    pub fn device_used(&self) -> Option<u64> {
        let dev = self.nvml.device_by_index(self.index).ok()?;
        dev.memory_info().ok().map(|m| m.used)
    }
}
