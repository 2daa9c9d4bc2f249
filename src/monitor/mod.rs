//! What the driver sees (NVML) and what PyTorch processes publish about
//! their allocator, sampled off the UI thread into `Snapshot`s. The GPU
//! query is a trait so tests inject a fake NVML.

pub mod alerts;
pub mod job;
pub mod model;
pub mod nvml;
pub mod procfs;
pub mod publisher;
pub mod recorder;
pub mod recording;
pub mod report;
pub mod sampler;
pub(crate) mod snapshot;

use serde::{Deserialize, Serialize};

pub use nvml::{NvmlQuery, ProcessMemory};
pub use publisher::{Published, PublisherScan};

/// One process NVML lists on a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessSample {
    /// The PID NVML reports (the host's namespace).
    pub pid: u32,
    /// The PID in our namespace, where the process is visible here.
    pub local_pid: Option<u32>,
    pub command: Option<String>,
    /// Device memory it holds, context included; `None` where NVML cannot say.
    pub used_bytes: Option<u64>,
}

/// A MIG instance of a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigSample {
    pub(crate) index: u32,
    pub(crate) name: Option<String>,
    pub(crate) total_bytes: Option<u64>,
    pub(crate) used_bytes: Option<u64>,
}

/// One GPU at one moment. A field NVML could not give is `None` and its
/// reason is in `errors`; the sample itself never fails.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct GpuSample {
    pub index: u32,
    pub name: Option<String>,
    pub uuid: Option<String>,
    pub total_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
    pub free_bytes: Option<u64>,
    pub utilization_percent: Option<u32>,
    pub memory_utilization_percent: Option<u32>,
    pub processes: Vec<ProcessSample>,
    pub mig: Vec<MigSample>,
    pub errors: Vec<String>,
}

/// NVML could not answer: no driver or library, or no such device. Exit
/// code 2: the machine, not gpumem-top, lacks what was asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    #[error("NVML: {0}")]
    Nvml(String),
    #[error("NVML device {index}: {why}")]
    Device { index: u32, why: String },
}

impl GpuError {
    pub fn exit_code(&self) -> u8 {
        2
    }
}

/// What NVML (or a fake of it) answers.
pub trait GpuQuery: Send {
    fn device_count(&mut self) -> Result<u32, GpuError>;
    /// Every field it can get for GPU `index`.
    fn sample(&mut self, index: u32) -> GpuSample;
}

/// Everything gpumem-top knows at one moment.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Snapshot {
    /// Seconds since the Unix epoch.
    pub time: f64,
    pub gpus: Vec<GpuSample>,
    pub publishers: Vec<Published>,
    /// Publisher files ignored, and why.
    pub skipped: Vec<String>,
    /// PIDs whose publisher file vanished or whose process exited since
    /// the previous snapshot.
    pub gone: Vec<u32>,
}

impl Snapshot {
    /// What process `pid` published for GPU `device` in this sample.
    pub(crate) fn publisher(&self, device: u32, pid: u32) -> Option<&Published> {
        self.publishers.iter().find(|p| p.device == device && p.pid == pid)
    }

    /// The device memory NVML counts for publisher `p`'s process, context
    /// included; None where NVML does not list it or gives no figure.
    pub(crate) fn nvml_used_of(&self, p: &Published) -> Option<u64> {
        self.gpus
            .iter()
            .find(|g| g.index == p.device)
            .and_then(|g| g.processes.iter().find(|x| p.matches(x)))
            .and_then(|x| x.used_bytes)
    }
}

pub fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}
