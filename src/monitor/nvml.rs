//! NVML through nvml-wrapper (libnvidia-ml.so.1 loaded at run time).

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

use super::{procfs, GpuQuery, GpuSample, MigSample, ProcessSample};

/// The real NVML.
pub struct NvmlQuery {
    nvml: Nvml,
    pids: procfs::PidMap,
}

impl NvmlQuery {
    pub fn open() -> Result<Self, String> {
        let nvml = Nvml::init().map_err(|e| format!("NVML: {e}"))?;
        Ok(NvmlQuery { nvml, pids: procfs::PidMap::default() })
    }
}

fn used(m: UsedGpuMemory) -> Option<u64> {
    match m {
        UsedGpuMemory::Used(b) => Some(b),
        UsedGpuMemory::Unavailable => None,
    }
}

impl GpuQuery for NvmlQuery {
    fn device_count(&mut self) -> Result<u32, String> {
        self.nvml.device_count().map_err(|e| format!("NVML: {e}"))
    }

    fn sample(&mut self, index: u32) -> GpuSample {
        let mut s = GpuSample { index, ..Default::default() };
        let dev = match self.nvml.device_by_index(index) {
            Ok(d) => d,
            Err(e) => {
                s.errors.push(format!("device {index}: {e}"));
                return s;
            }
        };
        let mut note = |what: &str, e: NvmlError| s.errors.push(format!("{what}: {e}"));
        let name = dev.name().map_err(|e| note("name", e)).ok();
        let uuid = dev.uuid().map_err(|e| note("uuid", e)).ok();
        let mem = dev.memory_info().map_err(|e| note("memory", e)).ok();
        let util = dev.utilization_rates().map_err(|e| note("utilization", e)).ok();
        let mut procs = Vec::new();
        match dev.running_compute_processes() {
            Ok(p) => procs.extend(p),
            Err(e) => note("processes", e),
        }
        if let Ok(p) = dev.running_graphics_processes() {
            for g in p {
                if !procs.iter().any(|c| c.pid == g.pid) {
                    procs.push(g);
                }
            }
        }
        let mig_on = dev.mig_mode().map(|m| m.current == 1).unwrap_or(false);
        let mut mig = Vec::new();
        if mig_on {
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
        s.name = name;
        s.uuid = uuid;
        if let Some(m) = mem {
            (s.total_bytes, s.used_bytes, s.free_bytes) = (Some(m.total), Some(m.used), Some(m.free));
        }
        if let Some(u) = util {
            (s.utilization_percent, s.memory_utilization_percent) = (Some(u.gpu), Some(u.memory));
        }
        s.mig = mig;
        self.pids.refresh_if_missing(procs.iter().map(|p| p.pid));
        s.processes = procs
            .into_iter()
            .map(|p| {
                let local = self.pids.local(p.pid);
                ProcessSample {
                    pid: p.pid,
                    local_pid: local,
                    command: local.and_then(procfs::command),
                    used_bytes: used(p.used_gpu_memory),
                }
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
    pub fn open(index: u32) -> Result<Self, String> {
        let nvml = Nvml::init().map_err(|e| format!("NVML: {e}"))?;
        nvml.device_by_index(index).map_err(|e| format!("NVML device {index}: {e}"))?;
        Ok(ProcessMemory { nvml, index })
    }

    /// Bytes `pid` holds on the GPU (context included), as `nvidia-smi`
    /// shows it; `None` when NVML does not list it or cannot say.
    pub fn used_by(&self, pid: u32) -> Option<u64> {
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
