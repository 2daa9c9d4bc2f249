//! The ranks of a distributed job side by side: each publishing process's
//! place in a job (torchrun's `RANK`, `WORLD_SIZE`, …), grouped by job, with
//! the median and the worst rank's peak (docs/ranks.md). The live view's
//! job screen, its `imbalance` alert, `--json` and Prometheus read this.

use serde::Serialize;

use super::model::LiveModel;
use super::{Published, Snapshot};

/// One rank as the job screen shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankRow {
    pub rank: u32,
    pub local_rank: u32,
    /// NVML's index of its GPU.
    pub gpu: u32,
    pub pid: u32,
    /// "ddp.py rank 1/2".
    pub name: String,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    /// The true peak allocated since it started publishing (steps' own
    /// peaks and samples, across every reset of PyTorch's counters): what
    /// the imbalance is judged on.
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// The latest optimizer step's own peak allocated, when it publishes step peaks.
    pub step_peak_bytes: Option<u64>,
    pub num_ooms: u64,
    pub num_alloc_retries: u64,
    /// Device memory NVML counts for the process beyond what its caching
    /// allocator reserved: the CUDA context, NCCL's and other libraries'
    /// buffers; None where NVML gives no per-process figure.
    pub outside_allocator_bytes: Option<u64>,
    /// Its process exited or stopped publishing: the row is its last state.
    pub gone: bool,
}

impl RankRow {
    fn of(p: &Published, nvml_used: Option<u64>, gone: bool) -> Option<RankRow> {
        let j = p.job.as_ref()?;
        Some(RankRow {
            rank: j.rank,
            local_rank: j.local_rank,
            gpu: p.device,
            pid: p.pid,
            name: p.name(),
            allocated_bytes: p.allocated(),
            reserved_bytes: p.reserved(),
            peak_allocated_bytes: p.peak_allocated(),
            peak_reserved_bytes: p.peak_reserved(),
            step_peak_bytes: if p.step_peaks { p.step_log.last().and_then(|s| s.peak_allocated()) } else { None },
            num_ooms: p.stat("num_ooms"),
            num_alloc_retries: p.stat("num_alloc_retries"),
            outside_allocator_bytes: outside_allocator(nvml_used, p.reserved()),
            gone,
        })
    }
}

/// NVML's figure for a process less what its allocator reserved.
pub(crate) fn outside_allocator(nvml_used: Option<u64>, reserved: u64) -> Option<u64> {
    nvml_used.map(|u| u.saturating_sub(reserved))
}

/// The ranks of one job that publish.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Job {
    /// torchrun's run id, "slurm JOB.STEP" or "ppid N" (docs/ranks.md).
    pub job: String,
    pub world_size: u32,
    /// By rank; a rank that publishes on several devices once per device.
    pub ranks: Vec<RankRow>,
    /// The median of the ranks' peak allocated bytes.
    pub median_peak_bytes: u64,
    /// The rank with the highest peak (the lowest rank among equals).
    pub worst_rank: u32,
    pub worst_peak_bytes: u64,
    /// How far the worst peak is over the median: 0.2 is 20%.
    pub imbalance: f64,
}

impl Job {
    /// The program's name the ranks share ("ddp.py"), from the first rank's.
    pub fn program(&self) -> String {
        self.ranks.first().map_or(String::new(), |r| match r.name.rsplit_once(" rank ") {
            Some((p, _)) => p.to_string(),
            None => r.name.clone(),
        })
    }

    fn of(job: String, mut ranks: Vec<RankRow>) -> Job {
        ranks.sort_by_key(|r| (r.rank, r.gpu, r.pid));
        let world_size = ranks.iter().map(|r| r.rank + 1).max().unwrap_or(0);
        // The rule `replay RANK0 RANK1 …` judges snapshots by, on peaks.
        let peaks: Vec<(u32, u64)> = ranks.iter().map(|r| (r.rank, r.peak_allocated_bytes)).collect();
        let i = crate::analysis::ranks::Imbalance::of(&peaks, "peak_allocated");
        Job {
            job,
            world_size,
            ranks,
            median_peak_bytes: i.as_ref().map_or(0, |i| i.median_peak_bytes),
            worst_rank: i.as_ref().map_or(0, |i| i.worst_rank),
            worst_peak_bytes: i.as_ref().map_or(0, |i| i.worst_peak_bytes),
            imbalance: i.as_ref().map_or(0.0, |i| i.over_median),
        }
    }
}

/// Groups rows by job, jobs in order of their names; the world size is the
/// one the ranks published where they agree.
fn group(rows: Vec<(String, u32, RankRow)>) -> Vec<Job> {
    let mut by: std::collections::BTreeMap<String, (u32, Vec<RankRow>)> = Default::default();
    for (job, world, row) in rows {
        let e = by.entry(job).or_insert((world, Vec::new()));
        e.0 = e.0.max(world);
        e.1.push(row);
    }
    by.into_iter()
        .map(|(id, (world, ranks))| {
            let mut j = Job::of(id, ranks);
            j.world_size = j.world_size.max(world);
            j
        })
        .collect()
}

/// The jobs among one snapshot's publishers (those that publish a place in one).
pub(crate) fn jobs_in(s: &Snapshot) -> Vec<Job> {
    let rows = s
        .publishers
        .iter()
        .filter_map(|p| {
            let j = p.job.as_ref()?;
            Some((j.job.clone(), j.world_size, RankRow::of(p, s.nvml_used_of(p), false)?))
        })
        .collect();
    group(rows)
}

/// The jobs among the model's histories: every rank seen, a gone one with
/// its last state.
pub fn jobs(m: &LiveModel) -> Vec<Job> {
    let rows = m
        .procs
        .values()
        .filter_map(|h| {
            let j = h.last.job.as_ref()?;
            Some((j.job.clone(), j.world_size, RankRow::of(&h.last, h.nvml_used, h.gone)?))
        })
        .collect();
    group(rows)
}
