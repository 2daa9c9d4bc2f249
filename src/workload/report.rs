//! `synth --json` as types; docs/json.md is the schema. The keys a replay
//! report shares (`stats`, `peak`, `fragmentation`, …) mean the same here.

use std::collections::BTreeMap;

use serde::Serialize;

use super::driver::{OnOom, OomRecord};
use super::SynthSpec;
use crate::analysis::{round4, Fragmentation};

#[derive(Debug, Clone, Serialize)]
pub(crate) struct SynthReport {
    /// Always null: a synthetic run has no trace.
    pub(crate) trace: Option<String>,
    /// "synthetic".
    pub(crate) format: &'static str,
    pub(crate) workload: SynthSpec,
    /// "sim" or "cuda".
    pub(crate) backend: &'static str,
    pub(crate) device: String,
    pub(crate) events: u64,
    pub(crate) requests: usize,
    pub(crate) iterations: usize,
    /// "finished", "stopped by OOM" or "interrupted".
    pub(crate) outcome: &'static str,
    pub(crate) alloc_conf: String,
    pub(crate) memory_limit_bytes: Option<u64>,
    /// "synthetic": nothing recorded to be faithful to.
    pub(crate) fidelity: &'static str,
    pub(crate) first_divergence: Option<()>,
    pub(crate) compare: Vec<()>,
    pub(crate) on_oom: OnOom,
    pub(crate) ooms: Vec<OomRecord>,
    pub(crate) stats: BTreeMap<String, i64>,
    pub(crate) peak: Option<SynthPeak>,
    pub(crate) fragmentation: SynthFragmentation,
    pub(crate) nvml_device: Option<NvmlDevice>,
    pub(crate) cuda_context_bytes: Option<u64>,
    pub(crate) nvml_used_bytes_at_peak: Option<u64>,
    pub(crate) reserved_bytes_at_nvml_sample: Option<u64>,
    pub(crate) device_maps: Option<DeviceMaps>,
    pub(crate) device_bytes_held_after_release: Option<u64>,
    #[serde(serialize_with = "round4")]
    pub(crate) elapsed_ms: f64,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct SynthPeak {
    /// The allocator event at the peak.
    pub(crate) event: Option<u64>,
    /// The request (counted from the start of the run) at the peak.
    pub(crate) request: usize,
    pub(crate) allocated_bytes: u64,
    pub(crate) reserved_bytes: u64,
    /// 1-based.
    pub(crate) iteration: u64,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct SynthFragmentation {
    #[serde(serialize_with = "round4")]
    pub(crate) peak_ratio: f64,
    #[serde(flatten)]
    pub(crate) now: Fragmentation,
}

/// Which GPU NVML watched: CUDA's ordinal, its UUID and NVML's index.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct NvmlDevice {
    pub(crate) cuda_index: usize,
    pub(crate) uuid: Option<String>,
    pub(crate) nvml_index: u32,
}

/// Expandable segments on the CUDA backend: address-range and page maps.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct DeviceMaps {
    pub(crate) range_maps: u64,
    pub(crate) page_maps: u64,
}
