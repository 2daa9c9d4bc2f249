//! What the driver sees, through NVML (libnvidia-ml loaded at run time).
//! For now: the memory one process holds on one GPU, which the synthetic
//! mode's CUDA backend compares with its own reserved bytes.

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;

/// An NVML session watching one GPU.
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
        procs.into_iter().find(|p| p.pid == pid).and_then(|p| match p.used_gpu_memory {
            UsedGpuMemory::Used(b) => Some(b),
            UsedGpuMemory::Unavailable => None,
        })
    }

    /// The device's used bytes (all processes).
    pub fn device_used(&self) -> Option<u64> {
        let dev = self.nvml.device_by_index(self.index).ok()?;
        dev.memory_info().ok().map(|m| m.used)
    }
}
