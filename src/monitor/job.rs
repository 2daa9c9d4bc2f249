//! The ranks of a distributed job side by side: each publishing process's
//! place in a job (torchrun's `RANK`, `WORLD_SIZE`, …), grouped by job, with
//! the median and the worst rank's peak (docs/user/ranks.md). The live view's
//! job screen, its `imbalance` alert, `--json` and Prometheus read this.

use serde::Serialize;

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
    pub(crate) fn of(p: &Published, nvml_used: Option<u64>, gone: bool) -> Option<RankRow> {
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
    /// torchrun's run id, "slurm JOB.STEP" or "ppid N" (docs/user/ranks.md).
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
        let i = crate::analysis::ranks::Imbalance::of(&peaks, crate::analysis::ranks::Measure::PeakAllocated);
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

/// Groups rows by job (`job_ids`), jobs in order of their names.
fn group(rows: Vec<(String, u32, RankRow)>) -> Vec<Job> {
    let places: Vec<(&str, u32, u32, u32)> = rows.iter().map(|(j, w, r)| (j.as_str(), *w, r.rank, r.pid)).collect();
    let ids = job_ids(&places);
    let mut by: std::collections::BTreeMap<String, (u32, Vec<RankRow>)> = Default::default();
    for (id, (_, world, row)) in ids.into_iter().zip(rows) {
        let e = by.entry(id).or_insert((world, Vec::new()));
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

/// The job of each place `(job, world size, rank, pid)`: a job is the ranks
/// that publish one job id and agree on its world size. Where ids repeat
/// with other world sizes, each world size is its own job ("ppid 7 (world
/// 2)"); where two processes claim one rank of a job (two unrelated
/// `RANK=0 WORLD_SIZE=1` scripts of one parent), the k-th process of each
/// rank, in pid order, is in the k-th job ("ppid 7 #2"), so no job has a
/// rank twice (docs/user/ranks.md).
pub(crate) fn job_ids(places: &[(&str, u32, u32, u32)]) -> Vec<String> {
    use std::collections::{BTreeMap, BTreeSet};
    let mut worlds: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
    let mut pids: BTreeMap<(&str, u32, u32), BTreeSet<u32>> = BTreeMap::new();
    for &(job, world, rank, pid) in places {
        worlds.entry(job).or_default().insert(world);
        pids.entry((job, world, rank)).or_default().insert(pid);
    }
    let shared = |job: &str, world: u32| pids.iter().any(|(&(j, w, _), p)| j == job && w == world && p.len() > 1);
    places
        .iter()
        .map(|&(job, world, rank, pid)| {
            let mut id = job.to_string();
            if worlds.get(job).is_some_and(|w| w.len() > 1) {
                id.push_str(&format!(" (world {world})"));
            }
            if shared(job, world) {
                let k = pids.get(&(job, world, rank)).map_or(0, |p| p.iter().position(|&q| q == pid).unwrap_or(0));
                id.push_str(&format!(" #{}", k + 1));
            }
            id
        })
        .collect()
}

/// The jobs among one snapshot's publishers (those that publish a place in one).
pub(crate) fn jobs_in(s: &Snapshot) -> Vec<Job> {
    jobs_of(s.publishers.iter().filter_map(|p| {
        let j = p.job.as_ref()?;
        Some((j.job.clone(), j.world_size, RankRow::of(p, s.nvml_used_of(p), false)))
    }))
}

/// The jobs of rows (job, world size, rank row), each rank seen once:
/// what `jobs_in` reads from one snapshot and `LiveModel::jobs` from the
/// model's histories.
pub(crate) fn jobs_of(rows: impl IntoIterator<Item = (String, u32, Option<RankRow>)>) -> Vec<Job> {
    group(rows.into_iter().filter_map(|(j, w, r)| Some((j, w, r?))).collect())
}
