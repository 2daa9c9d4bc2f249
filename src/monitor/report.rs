//! The live JSON (`gpumem-top --json`, `record` lines' `last`, `replay
//! RECORDING --json`) as types; docs/user/json.md is their schema.

use serde::Serialize;

use super::alerts::Alert;
use super::model::LiveModel;
use super::{GpuSample, Published, Snapshot};
use crate::analysis::Fragmentation;

/// One moment: every GPU, every publishing process, the alerts.
#[derive(Debug, Clone, Serialize)]
pub struct LiveReport {
    /// "nvml", "simulated device", "recording", …
    pub(crate) source: String,
    pub(crate) time: f64,
    pub(crate) gpus: Vec<GpuSample>,
    pub(crate) publishers: Vec<PublisherReport>,
    /// Publisher files ignored, and why.
    pub(crate) ignored: Vec<String>,
    /// PIDs whose process or publisher file went away since the previous sample.
    pub(crate) gone: Vec<u32>,
    pub(crate) alerts: Vec<Alert>,
    /// The distributed jobs among the publishers, their ranks side by side
    /// (docs/user/ranks.md).
    pub(crate) jobs: Vec<super::job::Job>,
}

/// What one PyTorch process published, with its fragmentation figures.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PublisherReport {
    pub(crate) pid: u32,
    pub(crate) gpu: u32,
    pub(crate) cuda_device: u32,
    pub(crate) uuid: Option<String>,
    pub(crate) command: Option<String>,
    /// How every screen names it: "ddp.py rank 1/2" in a job, else the command.
    pub(crate) name: String,
    /// Its place in a distributed job; null outside one.
    pub(crate) job: Option<crate::monitor::publisher::JobPlace>,
    pub(crate) time: f64,
    pub(crate) allocated_bytes: u64,
    pub(crate) reserved_bytes: u64,
    pub(crate) allocated_peak_bytes: u64,
    pub(crate) reserved_peak_bytes: u64,
    pub(crate) num_ooms: u64,
    pub(crate) num_alloc_retries: u64,
    /// Device memory NVML counts for the process (context included).
    pub(crate) nvml_used_bytes: Option<u64>,
    /// NVML's figure less reserved: the CUDA context, NCCL's and other
    /// libraries' allocations, outside the caching allocator.
    pub(crate) outside_allocator_bytes: Option<u64>,
    pub(crate) segments: usize,
    pub(crate) fragmentation: Fragmentation,
    /// What the optimizer held at a recent step's end (docs/user/categories.md
    /// "Live"); null before the first step or without an optimizer.
    pub(crate) categories: Option<crate::monitor::publisher::StepCategories>,
}

impl PublisherReport {
    pub(crate) fn of(p: &Published, nvml_used: Option<u64>) -> Self {
        PublisherReport {
            pid: p.pid,
            gpu: p.device,
            cuda_device: p.cuda_device,
            uuid: p.uuid.clone(),
            command: p.command.clone(),
            name: p.name(),
            job: p.job.clone(),
            time: p.time,
            allocated_bytes: p.allocated(),
            reserved_bytes: p.reserved(),
            allocated_peak_bytes: p.peak_allocated(),
            reserved_peak_bytes: p.peak_reserved(),
            num_ooms: p.stat("num_ooms"),
            num_alloc_retries: p.stat("num_alloc_retries"),
            nvml_used_bytes: nvml_used,
            outside_allocator_bytes: super::job::outside_allocator(nvml_used, p.reserved()),
            segments: p.segments.len(),
            fragmentation: p.fragmentation(),
            categories: p.categories,
        }
    }
}

impl LiveReport {
    pub fn of(snap: &Snapshot, alerts: &[Alert], source: &str) -> Self {
        LiveReport {
            source: source.to_string(),
            time: snap.time,
            gpus: snap.gpus.clone(),
            publishers: snap.publishers.iter().map(|p| PublisherReport::of(p, snap.nvml_used_of(p))).collect(),
            ignored: snap.skipped.clone(),
            gone: snap.gone.clone(),
            alerts: alerts.to_vec(),
            jobs: super::job::jobs_in(snap),
        }
    }
}

/// One process over a recording.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ProcessSummary {
    pub(crate) gpu: u32,
    pub(crate) pid: u32,
    pub(crate) command: Option<String>,
    /// "ddp.py rank 1/2" in a job, else the command.
    pub(crate) name: String,
    pub(crate) job: Option<crate::monitor::publisher::JobPlace>,
    pub(crate) samples: usize,
    /// The highest allocated bytes among the samples.
    pub(crate) peak_allocated_bytes: Option<u64>,
    pub(crate) peak_reserved_bytes: Option<u64>,
    /// Samples at which `num_ooms` rose.
    pub(crate) ooms: usize,
    /// Whether `steps` carry each step's own peaks (`run --step-peaks`).
    pub(crate) step_peaks: bool,
    /// The memory history it recorded (`run --history`), and why it was
    /// less than every stack when it was.
    pub(crate) history: Option<crate::monitor::publisher::HistoryInfo>,
    /// Every optimizer step seen (the most recent 20,000).
    pub(crate) steps: Vec<StepReport>,
}

/// One optimizer step of a recorded process.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StepReport {
    pub(crate) step: u64,
    pub(crate) time: f64,
    /// Its own peaks; null unless the process published them.
    pub(crate) allocated_peak_bytes: Option<u64>,
    pub(crate) reserved_peak_bytes: Option<u64>,
    pub(crate) allocated_end_bytes: u64,
}

/// `replay RECORDING --json`.
/// An alert a recording raised, at the sample (0-based) it first did.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RaisedAlert {
    pub(crate) sample: usize,
    pub(crate) kind: super::alerts::AlertKind,
    pub(crate) gpu: u32,
    pub(crate) pid: Option<u32>,
    pub(crate) message: String,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct RecordingReport {
    pub(crate) trace: String,
    pub(crate) format: String,
    pub(crate) samples: usize,
    pub(crate) processes: Vec<ProcessSummary>,
    /// The last sample, as `--json` reports one.
    pub(crate) last: Option<LiveReport>,
    /// Every alert the recording raised, the first time it did (by kind,
    /// GPU and process).
    pub(crate) alerts_raised: Vec<RaisedAlert>,
    /// Every distributed job recorded, each rank at its last state (a rank
    /// that died with the state it died in).
    pub(crate) jobs: Vec<super::job::Job>,
}

impl RecordingReport {
    pub(crate) fn of(model: &LiveModel, trace: String, format: &str, samples: usize) -> Self {
        let processes = model
            .procs
            .iter()
            .map(|((gpu, pid), h)| ProcessSummary {
                gpu: *gpu,
                pid: *pid,
                command: h.last.command.clone(),
                name: h.last.name(),
                job: h.last.job.clone(),
                samples: h.samples,
                // The true peaks: the series' (samples and steps) and what
                // the publisher kept across resets of PyTorch's counters.
                peak_allocated_bytes: h.series.peak().map(|p| p.allocated.max(h.last.peak_allocated())),
                peak_reserved_bytes: h
                    .series
                    .points()
                    .iter()
                    .map(|p| p.reserved)
                    .max()
                    .map(|r| r.max(h.last.peak_reserved())),
                ooms: h.series.ooms.len(),
                step_peaks: h.last.step_peaks,
                history: h.last.history.clone(),
                steps: h
                    .steps
                    .iter()
                    .map(|s| StepReport {
                        step: s.n,
                        time: s.t,
                        allocated_peak_bytes: s.peak_allocated,
                        reserved_peak_bytes: s.peak_reserved,
                        allocated_end_bytes: s.allocated_end,
                    })
                    .collect(),
            })
            .collect();
        RecordingReport {
            trace,
            format: format.to_string(),
            samples,
            processes,
            last: model.latest_full().map(|s| LiveReport::of(&s, &model.alerts, "recording")),
            alerts_raised: model
                .raised
                .iter()
                .map(|(i, a)| RaisedAlert { sample: *i, kind: a.kind, gpu: a.gpu, pid: a.pid, message: a.message() })
                .collect(),
            jobs: model.jobs(),
        }
    }
}
