//! State published by PyTorch processes (`assets/python/gpumem_top_publish.py`):
//! one JSON file per process and device in a per-user 0700 directory,
//! written atomically. Files we do not own, over the size cap or malformed
//! are ignored with a reason; nothing in them is trusted beyond its shape.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{GpuSample, ProcessSample};
use crate::alloc::{BlockInfo, BlockState, SegmentInfo};

/// Files larger than this are not read (a layout of 100k blocks is ~3 MB).
pub const DEFAULT_CAP: u64 = 16 << 20;

/// The directory publishers write to and we read: `$GPUMEM_TOP_DIR`, else
/// `$XDG_RUNTIME_DIR/gpumem-top`, else `/tmp/gpumem-top-<uid>`.
pub(crate) fn default_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("GPUMEM_TOP_DIR").filter(|d| !d.is_empty()) {
        return d.into();
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return Path::new(&d).join("gpumem-top");
    }
    PathBuf::from(format!("/tmp/gpumem-top-{}", current_uid()))
}

pub fn current_uid() -> u32 {
    // The owner of a file we create is our effective uid; /proc/self tells it without libc.
    std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(u32::MAX)
}

/// One process's published allocator state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Published {
    /// Its pid as we see it: the one it published, or, for a process in
    /// another pid namespace (a container's pid 1), the one its start time
    /// finds in ours (`Sampler`; docs/user/cluster.md).
    pub pid: u32,
    /// The pid it knows itself by (its file's): snapshot requests name it.
    #[serde(skip)]
    pub(crate) own_pid: u32,
    /// See `RawFile::instance`.
    #[serde(skip)]
    pub(crate) instance: Option<String>,
    #[serde(skip)]
    pub(crate) start_ticks: Option<u64>,
    #[serde(skip)]
    pub(crate) pid_ns: Option<u64>,
    /// Its PIDs in nested namespaces, outermost first (from its /proc/self/status).
    pub(crate) nspid: Vec<u32>,
    /// NVML's index of its GPU once a live source has matched it (see
    /// `assign_gpus`); until then the CUDA ordinal it published.
    pub device: u32,
    /// The CUDA ordinal as the process numbers it (under
    /// `CUDA_VISIBLE_DEVICES` not NVML's index).
    pub cuda_device: u32,
    pub(crate) uuid: Option<String>,
    pub(crate) time: f64,
    pub(crate) interval: f64,
    pub command: Option<String>,
    /// `torch.cuda.memory_stats()` as published.
    pub stats: BTreeMap<String, i64>,
    /// Shared with the scanner's cache: a layout that did not change
    /// between samples is parsed once (docs/measurements/benchmarks.md).
    #[serde(skip)]
    pub segments: Arc<Vec<SegmentInfo>>,
    pub steps: Vec<u64>,
    /// True when the process resets PyTorch's peaks at each step (`run
    /// --step-peaks`): `step_log`'s peaks are then each step's own.
    pub(crate) step_peaks: bool,
    /// Recent optimizer steps, oldest first.
    pub(crate) step_log: Vec<StepRecord>,
    /// With step peaks on and no optimizer step yet: the peaks since the
    /// previous sample (time, allocated, reserved).
    pub(crate) window_peak: Option<(f64, Option<u64>, Option<u64>)>,
    /// When its layout was taken (it is kept between samples while the
    /// allocator's counters do not move or its time budget is spent).
    pub(crate) layout_time: Option<f64>,
    /// The process's last file, written at its exit and left for us.
    pub last_words: bool,
    /// How it records PyTorch's memory history, when it does (`run --history`).
    pub(crate) history: Option<HistoryInfo>,
    /// Its peaks kept across resets of PyTorch's counters (allocated,
    /// reserved); see `peak_allocated`.
    pub(crate) true_peaks: Option<(Option<u64>, Option<u64>)>,
    /// What the optimizer held at a recent step's end.
    pub(crate) categories: Option<StepCategories>,
    /// Its place in a distributed job (torchrun's `RANK`, `WORLD_SIZE`,
    /// …), when it is in one.
    pub job: Option<JobPlace>,
    #[serde(skip)]
    pub(crate) path: PathBuf,
}

/// A process's place in a distributed job, as the launcher's environment
/// gives it (docs/user/ranks.md): `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, and the
/// job it belongs to (torchrun's `TORCHELASTIC_RUN_ID`, else a Slurm job
/// step, else "ppid N", the launching parent).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct JobPlace {
    pub job: String,
    pub rank: u32,
    pub local_rank: u32,
    pub world_size: u32,
}

impl JobPlace {
    /// The place a file claims, if it is one: a rank below the world size
    /// (at most 2^20 ranks), a job named in at most 128 printable characters.
    fn of(rank: Option<u32>, local_rank: Option<u32>, world_size: Option<u32>, job: Option<String>) -> Option<Self> {
        let (rank, world_size, job) = (rank?, world_size?, job?);
        if rank >= world_size || world_size > 1 << 20 || job.is_empty() || job.chars().count() > 128 {
            return None;
        }
        let job = job.chars().filter(|c| !c.is_control()).collect();
        Some(JobPlace { job, rank, local_rank: local_rank.unwrap_or(rank), world_size })
    }
}

/// What memory history a publisher records: `context` as given to
/// `_record_memory_history` ("all", "alloc", "state" or "none"), and why,
/// when that is less than everything (docs/user/live.md, "Memory history and
/// PyTorch 2.11").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct HistoryInfo {
    pub(crate) context: String,
    #[serde(default)]
    pub(crate) max_entries: u64,
    #[serde(default)]
    pub(crate) note: Option<String>,
}

/// What the optimizer held at a step's end (the publisher's
/// `_note_categories`; docs/user/categories.md "Live"): its parameters, their
/// gradients and its state, in bytes rounded up to the allocator's 512,
/// beside allocated then.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StepCategories {
    pub(crate) step: u64,
    #[serde(default)]
    pub(crate) allocated: u64,
    pub(crate) parameter: u64,
    pub(crate) gradient: u64,
    pub(crate) optimizer_state: u64,
}

impl StepCategories {
    /// As bytes per category: the rest of allocated (activations, the
    /// batch, temporaries) under `Unknown`, which the live view calls "rest".
    pub(crate) fn bytes(&self) -> crate::analysis::categories::CategoryBytes {
        use crate::analysis::categories::{Category, CategoryBytes};
        let mut b = [0u64; 7];
        b[Category::Parameter as usize] = self.parameter;
        b[Category::Gradient as usize] = self.gradient;
        b[Category::OptimizerState as usize] = self.optimizer_state;
        b[Category::Unknown as usize] = self
            .allocated
            .saturating_sub(self.parameter.saturating_add(self.gradient).saturating_add(self.optimizer_state));
        CategoryBytes(b)
    }
}

/// One optimizer step as the publisher logged it: its number, when it
/// ended, the device, allocated and reserved bytes at its end, and (with
/// step peaks on) its peak allocated and reserved bytes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) struct StepRecord(
    pub(crate) u64,
    pub(crate) f64,
    pub(crate) u32,
    pub(crate) u64,
    pub(crate) Option<u64>,
    pub(crate) Option<u64>,
    pub(crate) Option<u64>,
);

impl StepRecord {
    pub(crate) fn n(&self) -> u64 {
        self.0
    }
    pub(crate) fn time(&self) -> f64 {
        self.1
    }
    pub(crate) fn allocated_end(&self) -> u64 {
        self.3
    }
    pub(crate) fn reserved_end(&self) -> Option<u64> {
        self.4
    }
    pub(crate) fn peak_allocated(&self) -> Option<u64> {
        self.5
    }
    pub(crate) fn peak_reserved(&self) -> Option<u64> {
        self.6
    }
}

impl Published {
    /// How its files name it: `<pid>-<instance>` as it knows itself, or the
    /// pid alone for a publisher from before instances.
    pub(crate) fn key(&self) -> String {
        match &self.instance {
            Some(i) => format!("{}-{i}", self.own_pid),
            None => self.own_pid.to_string(),
        }
    }

    /// How every screen, report and metric names it: the program
    /// (`ddp.py`) and, in a job, its rank (`ddp.py rank 1/2`).
    pub fn name(&self) -> String {
        let command = self.command.as_deref().unwrap_or("python");
        match &self.job {
            Some(j) => format!("{command} rank {}/{}", j.rank, j.world_size),
            None => command.to_string(),
        }
    }
    pub(crate) fn stat(&self, key: &str) -> u64 {
        self.stats.get(key).copied().unwrap_or(0).max(0) as u64
    }
    pub fn allocated(&self) -> u64 {
        self.stat("allocated_bytes.all.current")
    }
    pub fn reserved(&self) -> u64 {
        self.stat("reserved_bytes.all.current")
    }
    /// The true peak allocated bytes since it started publishing: PyTorch's
    /// counter, raised to what the publisher kept across every reset of it
    /// (its own at steps, the script's per-step `reset_peak_memory_stats()`).
    /// Every peak shown or judged is this one (docs/user/live.md).
    pub fn peak_allocated(&self) -> u64 {
        self.stat("allocated_bytes.all.peak").max(self.true_peaks.and_then(|t| t.0).unwrap_or(0))
    }
    /// As `peak_allocated`, for reserved bytes.
    pub fn peak_reserved(&self) -> u64 {
        self.stat("reserved_bytes.all.peak").max(self.true_peaks.and_then(|t| t.1).unwrap_or(0))
    }
    /// The fragmentation figures of what it published.
    pub(crate) fn fragmentation(&self) -> crate::analysis::Fragmentation {
        crate::analysis::fragmentation_of(
            self.reserved(),
            self.allocated(),
            self.stat("inactive_split_bytes.all.current"),
            self.stat("requested_bytes.all.current"),
            &self.segments,
        )
    }

    /// True when NVML's process is this publisher.
    pub(crate) fn matches(&self, p: &ProcessSample) -> bool {
        let ids = [Some(p.pid), p.local_pid];
        ids.iter().flatten().any(|&id| id == self.pid || self.nspid.contains(&id))
    }
}

/// Puts each publisher on NVML's GPU: the one with its UUID; else the one
/// GPU whose processes include it; else the GPU numbered as its CUDA
/// ordinal (right only when both orders agree and nothing hides devices).
/// A publisher whose UUID names a GPU not among `gpus` (filtered out by
/// `--device`) is dropped.
pub fn assign_gpus(publishers: &mut Vec<Published>, gpus: &[GpuSample], all_gpus: bool) {
    publishers.retain_mut(|p| {
        if let Some(u) = &p.uuid {
            if let Some(g) = gpus.iter().find(|g| g.uuid.as_deref() == Some(u.as_str())) {
                p.device = g.index;
                return true;
            }
            if !all_gpus {
                return false;
            }
        }
        let mut on = gpus.iter().filter(|g| g.processes.iter().any(|x| p.matches(x)));
        if let (Some(g), None) = (on.next(), on.next()) {
            p.device = g.index;
        }
        true
    });
}

/// What one scan of the directory found.
#[derive(Debug, Clone, Default)]
pub struct PublisherScan {
    pub published: Vec<Published>,
    pub skipped: Vec<String>,
}

/// A segment as a publisher file carries it.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct RawSegment {
    pub(crate) address: u64,
    pub(crate) total_size: u64,
    #[serde(default)]
    pub(crate) stream: u64,
    #[serde(default)]
    pub(crate) segment_type: String,
    #[serde(default)]
    pub(crate) is_expandable: bool,
    #[serde(default)]
    pub(crate) segment_pool_id: (u64, u64),
    /// [size, requested_size, state] with state 0 allocated, 1 pending free, 2 inactive.
    pub(crate) blocks: Vec<(u64, u64, u8)>,
}

/// A publisher file (`assets/python/gpumem_top_publish.py` writes it;
/// docs/user/json.md has its schema). Read with its segments left as text
/// (`S = &RawValue`), so that a layout seen before is not parsed again.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct RawFile<S = Vec<RawSegment>> {
    pub(crate) version: u32,
    pub(crate) pid: u32,
    #[serde(default)]
    pub(crate) nspid: Vec<u32>,
    /// Drawn at random when it started publishing: processes of one pid in
    /// other namespaces (containers) are told apart by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) instance: Option<String>,
    /// Its start time in clock ticks since boot (the same from every
    /// namespace): which process of that pid wrote the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) start_ticks: Option<u64>,
    /// The inode of its pid namespace (the same from every namespace): two
    /// containers' trainers started in one clock tick are told apart by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) pid_ns: Option<u64>,
    pub(crate) device: u32,
    /// The GPU's UUID as NVML spells it ("GPU-…"); absent from older publishers.
    #[serde(default)]
    pub(crate) uuid: Option<String>,
    pub(crate) time: f64,
    #[serde(default)]
    pub(crate) interval: f64,
    #[serde(default)]
    pub(crate) command: Option<String>,
    pub(crate) stats: BTreeMap<String, i64>,
    #[serde(default)]
    pub(crate) segments: S,
    /// allocated_bytes.all.current at the end of recent optimizer steps.
    #[serde(default)]
    pub(crate) steps: Vec<u64>,
    #[serde(default)]
    pub(crate) step_peaks: bool,
    #[serde(default)]
    pub(crate) step_log: Vec<StepRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) window_peak: Option<(f64, Option<u64>, Option<u64>)>,
    #[serde(default)]
    pub(crate) layout_time: Option<f64>,
    /// Written at exit: read once, then removed by the reader.
    #[serde(default, rename = "final")]
    pub(crate) last_words: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) history: Option<HistoryInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) true_peaks: Option<(Option<u64>, Option<u64>)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) categories: Option<StepCategories>,
    /// Its place in a distributed job (docs/user/ranks.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rank: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) local_rank: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) world_size: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) job: Option<String>,
}

impl RawFile {
    /// `p` as its publisher wrote it (a recording keeps this, so that
    /// `replay` reads it back with `parse_bytes`).
    pub(crate) fn of(p: &Published) -> RawFile {
        RawFile {
            version: 1,
            pid: p.pid,
            nspid: p.nspid.clone(),
            instance: p.instance.clone(),
            start_ticks: p.start_ticks,
            pid_ns: p.pid_ns,
            device: p.device,
            uuid: p.uuid.clone(),
            time: p.time,
            interval: p.interval,
            command: p.command.clone(),
            stats: p.stats.clone(),
            segments: p
                .segments
                .iter()
                .map(|s| RawSegment {
                    address: s.address,
                    total_size: s.total_size,
                    stream: s.stream,
                    segment_type: s.segment_type.to_string(),
                    is_expandable: s.is_expandable,
                    segment_pool_id: s.pool.unwrap_or((0, 0)),
                    blocks: s
                        .blocks
                        .iter()
                        .map(|b| {
                            let state = match b.state {
                                BlockState::ActiveAllocated => 0,
                                BlockState::ActivePendingFree => 1,
                                BlockState::Inactive => 2,
                            };
                            (b.size, b.requested_size, state)
                        })
                        .collect(),
                })
                .collect(),
            steps: p.steps.clone(),
            step_peaks: p.step_peaks,
            step_log: p.step_log.clone(),
            window_peak: p.window_peak,
            layout_time: p.layout_time,
            last_words: p.last_words,
            history: p.history.clone(),
            true_peaks: p.true_peaks,
            categories: p.categories,
            rank: p.job.as_ref().map(|j| j.rank),
            local_rank: p.job.as_ref().map(|j| j.local_rank),
            world_size: p.job.as_ref().map(|j| j.world_size),
            job: p.job.as_ref().map(|j| j.job.clone()),
        }
    }
}

/// Parses one publisher file's bytes: a field missing, duplicated or of
/// the wrong type, or a layout whose blocks do not add up, is an error
/// saying where.
pub fn parse_bytes(bytes: &[u8], path: &Path) -> Result<Published, FileError> {
    parse_reusing(bytes, path, None).map(|(p, _)| p)
}

/// A file's `segments` as its text, unparsed; `None` when absent. A
/// `null` is text too, and fails to parse as segments, as any other value
/// of the wrong type does.
#[derive(Debug, Default)]
struct SegmentsText<'a>(Option<&'a serde_json::value::RawValue>);

impl<'de: 'a, 'a> Deserialize<'de> for SegmentsText<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&serde_json::value::RawValue>::deserialize(d).map(|r| SegmentsText(Some(r)))
    }
}

/// A layout as a file carried it: its text and what it parsed to.
#[derive(Debug)]
struct Layout {
    device: u32,
    /// Its allocation is reused for the next layout of the same file: a
    /// fresh one a layout (58 KB for GPT-2) left the heap in pieces.
    text: String,
    segments: Arc<Vec<SegmentInfo>>,
}

/// Why a publisher file is not read: what the scanner says of a file it
/// skips, and a recording of a line it cannot take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileError {
    /// Not the JSON a publisher writes, at "line L column C".
    #[error("{0}")]
    Json(String),
    #[error("version {0} (this gpumem-top reads 1)")]
    Version(u32),
    /// A segment whose blocks do not make it.
    #[error("segment {address:#x}: {why}")]
    Segment { address: u64, why: String },
}

/// "line L column C: what" for an error `offset` bytes into `bytes`, as
/// every reader of ours says where.
fn located(e: &serde_json::Error, bytes: &[u8], offset: usize) -> FileError {
    let m = e.to_string();
    let what = m.rsplit_once(" at line ").map_or(m.as_str(), |x| x.0);
    let before = &bytes[..offset.min(bytes.len())];
    let line0 = before.iter().filter(|&&b| b == b'\n').count();
    let col0 = before.len() - before.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let (line, column) = if e.line() <= 1 { (line0 + 1, col0 + e.column()) } else { (line0 + e.line(), e.column()) };
    FileError::Json(format!("line {line} column {column}: {what}"))
}

/// Parses a file, reusing `known` (kept as it is, its text not copied
/// again) when the file carries the same layout text for the same device
/// (a publisher keeps its layout between samples while its allocator's
/// counters do not move, and the segments are most of a file and of the
/// cost of reading it). Returns the file's layout for next time.
fn parse_reusing(bytes: &[u8], path: &Path, known: Option<Layout>) -> Result<(Published, Layout), FileError> {
    let raw: RawFile<SegmentsText> = serde_json::from_slice(bytes).map_err(|e| located(&e, bytes, 0))?;
    if raw.version != 1 {
        return Err(FileError::Version(raw.version));
    }
    let text = raw.segments.0.map_or("[]", |r| r.get());
    let layout = match known {
        Some(k) if k.device == raw.device && k.text == text => k,
        known => {
            // The text lies inside `bytes`: its offset places an error in the file.
            let offset = (text.as_ptr() as usize).saturating_sub(bytes.as_ptr() as usize);
            let segs: Vec<RawSegment> = serde_json::from_str(text).map_err(|e| located(&e, bytes, offset))?;
            let segments = Arc::new(segments_of(segs, raw.device)?);
            let mut kept = known.map(|k| k.text).unwrap_or_default();
            kept.clear();
            // Exact: doubling would put a layout's text past the mmap threshold.
            kept.reserve_exact(text.len());
            kept.push_str(text);
            Layout { device: raw.device, text: kept, segments }
        }
    };
    let segments = Arc::clone(&layout.segments);
    let p = Published {
        pid: raw.pid,
        own_pid: raw.pid,
        nspid: raw.nspid,
        instance: raw.instance.filter(|i| !i.is_empty() && i.len() <= 32 && i.bytes().all(|b| b.is_ascii_hexdigit())),
        start_ticks: raw.start_ticks,
        pid_ns: raw.pid_ns,
        device: raw.device,
        cuda_device: raw.device,
        uuid: raw.uuid.filter(|u| u.len() <= 96),
        time: raw.time,
        interval: raw.interval,
        command: raw.command.map(|c| c.chars().filter(|c| !c.is_control()).take(200).collect()),
        stats: raw.stats,
        segments,
        steps: raw.steps,
        step_peaks: raw.step_peaks,
        step_log: raw.step_log.into_iter().filter(|s| s.2 == raw.device).collect(),
        window_peak: raw.window_peak,
        layout_time: raw.layout_time,
        last_words: raw.last_words,
        history: raw.history.map(|h| HistoryInfo {
            context: h.context.chars().filter(|c| !c.is_control()).take(16).collect(),
            max_entries: h.max_entries,
            note: h.note.map(|n| n.chars().filter(|c| !c.is_control()).take(400).collect()),
        }),
        true_peaks: raw.true_peaks,
        categories: raw.categories,
        job: JobPlace::of(raw.rank, raw.local_rank, raw.world_size, raw.job),
        path: path.to_path_buf(),
    };
    Ok((p, layout))
}

/// The allocator's segments from a file's: blocks placed back to back,
/// which must fill their segment.
fn segments_of(raw: Vec<RawSegment>, device: u32) -> Result<Vec<SegmentInfo>, FileError> {
    let mut segments = Vec::with_capacity(raw.len());
    for s in raw {
        let bad = |why: String| FileError::Segment { address: s.address, why };
        if s.total_size > crate::trace::MAX_SEGMENT_BYTES {
            return Err(bad(format!("{} bytes is more than any device holds", s.total_size)));
        }
        let mut addr = s.address;
        let mut blocks = Vec::with_capacity(s.blocks.len());
        let (mut allocated, mut active, mut requested) = (0, 0, 0);
        for (size, req, st) in s.blocks {
            let state = match st {
                0 => BlockState::ActiveAllocated,
                1 => BlockState::ActivePendingFree,
                2 => BlockState::Inactive,
                x => return Err(bad(format!("block state {x}"))),
            };
            if state != BlockState::Inactive {
                active += size;
            }
            if state == BlockState::ActiveAllocated {
                allocated += size;
                requested += req;
            }
            blocks.push(BlockInfo { address: addr, size, requested_size: req, state, tag: 0 });
            addr = addr.checked_add(size).ok_or_else(|| bad("block addresses overflow".into()))?;
        }
        if addr - s.address != s.total_size {
            return Err(bad(format!("blocks sum to {} of {} bytes", addr - s.address, s.total_size)));
        }
        let segment_type = if s.segment_type == "small" { "small" } else { "large" };
        segments.push(SegmentInfo {
            device: device as i32,
            address: s.address,
            total_size: s.total_size,
            allocated_size: allocated,
            active_size: active,
            requested_size: requested,
            stream: s.stream,
            segment_type,
            is_expandable: s.is_expandable,
            pool: Some(s.segment_pool_id),
            private: s.segment_pool_id != (0, 0),
            blocks,
        });
    }
    Ok(segments)
}

/// Reads the publisher directories sample after sample, keeping what
/// does not change between samples: each file's parsed layout (reused
/// while its text is the same), and the list of fallback directories
/// (listed again only when the temporary directory changes).
#[derive(Debug)]
pub struct Scanner {
    uid: u32,
    cap: u64,
    layouts: std::collections::HashMap<PathBuf, Layout>,
    /// `$TMPDIR`, where the fallback directories are.
    tmp: PathBuf,
    /// What the last file read held.
    buf: Vec<u8>,
    fallbacks: Option<Fallbacks>,
}

/// `$TMPDIR`'s fallback directories as listed, and the directory's
/// modification time then.
#[derive(Debug)]
struct Fallbacks {
    mtime: std::time::SystemTime,
    /// The listing may be trusted while the time stays: it was taken at
    /// least a second after the directory last changed (a coarse clock
    /// could otherwise hide a change made in the same tick).
    settled: bool,
    dirs: Vec<PathBuf>,
    /// Entries of that name that are not ours, or past the cap.
    ignored: usize,
}

impl Scanner {
    pub fn new(uid: u32, cap: u64) -> Scanner {
        Scanner { uid, cap, layouts: Default::default(), tmp: std::env::temp_dir(), buf: Vec::new(), fallbacks: None }
    }

    /// Reads every `<pid>-<device>.json` in `dir`, and in the fallback
    /// directories, that our uid owns and is at most `cap` bytes.
    pub fn scan(&mut self, dir: &Path) -> PublisherScan {
        let mut out = PublisherScan::default();
        let mut seen = std::collections::HashMap::new();
        self.scan_into(dir, &mut out, &mut seen);
        // Where the publisher falls back when the usual directory is not
        // usable (another user made it, say): private mkdtemp directories.
        let (fallbacks, ignored) = self.fallback_dirs();
        for d in fallbacks {
            if d != dir {
                self.scan_into(&d, &mut out, &mut seen);
            }
        }
        if ignored > 0 {
            out.skipped.push(format!(
                "{}: {ignored} directories named gpumem-top-{}-* not read (not our own 0700 directories, or past the newest {MAX_FALLBACK_DIRS})",
                self.tmp.display(),
                self.uid
            ));
        }
        // Only the files read this time are kept: bounded by what is there.
        self.layouts = seen;
        // A large file read once does not hold its memory for good.
        if self.buf.capacity() > 1 << 20 {
            self.buf = Vec::new();
        }
        dedupe(&mut out);
        bound_skipped(&mut out.skipped);
        out
    }

    /// The publisher's fallback directories: `$TMPDIR/gpumem-top-<uid>-*`
    /// that are ours and private, the `MAX_FALLBACK_DIRS` newest. Anyone
    /// can create such names: another user's (20,000 of them, say) are
    /// counted, never listed or read (docs/design/security.md).
    fn fallback_dirs(&mut self) -> (Vec<PathBuf>, usize) {
        let tmp = &self.tmp;
        let Ok(mtime) = std::fs::metadata(tmp).and_then(|m| m.modified()) else { return (Vec::new(), 0) };
        if let Some(f) = &self.fallbacks {
            if f.settled && f.mtime == mtime {
                return (f.dirs.clone(), f.ignored);
            }
        }
        let prefix = format!("gpumem-top-{}-", self.uid);
        let mut found: Vec<(std::time::SystemTime, PathBuf)> = Vec::new();
        let mut ignored = 0;
        if let Ok(rd) = std::fs::read_dir(tmp) {
            for e in rd.flatten() {
                if !e.file_name().to_str().is_some_and(|n| n.starts_with(&prefix)) {
                    continue;
                }
                // The entry itself, not what a link there points to.
                match std::fs::symlink_metadata(e.path()) {
                    Ok(m) if readable_dir(&m, self.uid) => {
                        found.push((m.modified().unwrap_or(std::time::UNIX_EPOCH), e.path()))
                    }
                    _ => ignored += 1,
                }
            }
        }
        // Newest first; past the cap, counted.
        found.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        ignored += found.len().saturating_sub(MAX_FALLBACK_DIRS);
        let mut dirs: Vec<PathBuf> = found.into_iter().take(MAX_FALLBACK_DIRS).map(|(_, p)| p).collect();
        dirs.sort();
        let settled = mtime.elapsed().is_ok_and(|age| age >= std::time::Duration::from_secs(1));
        self.fallbacks = Some(Fallbacks { mtime, settled, dirs: dirs.clone(), ignored });
        (dirs, ignored)
    }
}

/// A directory the scanner reads: `uid`'s own, mode 0700 (no one else may
/// even list it), not a link (the metadata is the entry's own).
fn readable_dir(m: &std::fs::Metadata, uid: u32) -> bool {
    m.is_dir() && m.uid() == uid && m.mode() & 0o077 == 0
}

/// Fallback directories read at most (a publisher makes one only when its
/// usual directory is unusable: a few at most on a sane machine).
const MAX_FALLBACK_DIRS: usize = 16;

/// Lines of `PublisherScan::skipped` kept; the rest are counted in one.
const MAX_SKIPPED: usize = 16;

/// Keeps the first `MAX_SKIPPED` reasons and says how many more there were,
/// so that a directory full of junk cannot make every sample (and every
/// recorded line, `--json` and the alert line) grow with it.
fn bound_skipped(skipped: &mut Vec<String>) {
    if skipped.len() > MAX_SKIPPED {
        let more = skipped.len() - (MAX_SKIPPED - 1);
        skipped.truncate(MAX_SKIPPED - 1);
        skipped.push(format!("… and {more} more files or directories not read"));
    }
}

/// Reads every `<pid>-<device>.json` in `dir` that `uid` owns and is at
/// most `cap` bytes (once; a live source keeps a `Scanner`).
pub fn scan(dir: &Path, uid: u32, cap: u64) -> PublisherScan {
    Scanner::new(uid, cap).scan(dir)
}

/// One file per (process, device): the newest, when a process has files in
/// two directories or under two names.
fn dedupe(out: &mut PublisherScan) {
    let id = |p: &Published| (p.pid, p.instance.clone(), p.cuda_device);
    out.published.sort_by(|a, b| id(a).cmp(&id(b)).then(b.time.total_cmp(&a.time)));
    let mut kept: Vec<Published> = Vec::with_capacity(out.published.len());
    for p in out.published.drain(..) {
        match kept.last() {
            Some(k) if id(k) == id(&p) => {
                out.skipped.push(format!(
                    "{}: an older file of pid {} device {}",
                    p.path.display(),
                    p.pid,
                    p.cuda_device
                ));
            }
            _ => kept.push(p),
        }
    }
    out.published = kept;
}

impl Scanner {
    /// Reads `dir`'s files into `out`; the layouts parsed go into `seen`.
    fn scan_into(
        &mut self,
        dir: &Path,
        out: &mut PublisherScan,
        seen: &mut std::collections::HashMap<PathBuf, Layout>,
    ) {
        use std::io::Read;
        let (uid, cap) = (self.uid, self.cap);
        use std::os::unix::fs::OpenOptionsExt;
        // The directory itself, not what a link there points to.
        let Ok(meta) = std::fs::symlink_metadata(dir) else { return };
        if !readable_dir(&meta, uid) {
            out.skipped.push(format!(
                "{}: not read (a {}, owned by uid {}, mode {:o}; it must be our own 0700 directory)",
                dir.display(),
                if meta.file_type().is_symlink() {
                    "symbolic link"
                } else if meta.is_dir() {
                    "directory"
                } else {
                    "file"
                },
                meta.uid(),
                meta.mode() & 0o777
            ));
            return;
        }
        let Ok(rd) = std::fs::read_dir(dir) else { return };
        let mut names: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
        names.sort();
        for path in names {
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
            // Temporary files of writers mid-rename start with '.'.
            if name.starts_with('.') || !name.ends_with(".json") {
                continue;
            }
            // Opened without following a link; checked and read through the
            // one descriptor, at most `cap` bytes however much the file grows.
            let f =
                std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(&path);
            let mut f = match f {
                Ok(f) => f,
                Err(e) => {
                    out.skipped.push(format!("{}: not opened ({e})", path.display()));
                    continue;
                }
            };
            let Ok(m) = f.metadata() else { continue };
            if !m.file_type().is_file() {
                out.skipped.push(format!("{}: not a regular file", path.display()));
                continue;
            }
            if m.uid() != uid {
                out.skipped.push(format!("{}: owned by uid {}, not us", path.display(), m.uid()));
                continue;
            }
            // One buffer for every file and sample: a fresh one grew past
            // malloc's mmap threshold for a large layout, which cost page
            // faults on every read.
            self.buf.clear();
            match (&mut f).take(cap + 1).read_to_end(&mut self.buf) {
                Ok(n) if n as u64 > cap => {
                    out.skipped.push(format!("{}: over the {cap} byte cap", path.display()));
                }
                Ok(_) => match parse_reusing(&self.buf, &path, self.layouts.remove(&path)) {
                    Ok((p, layout)) => {
                        out.published.push(p);
                        seen.insert(path, layout);
                    }
                    Err(e) => out.skipped.push(format!("{}: malformed: {e}", path.display())),
                },
                Err(e) => out.skipped.push(format!("{}: {e}", path.display())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_where() {
        let path = Path::new("x.json");
        assert_eq!(
            parse_bytes(b"{\"version\": 1,\n \"pid\": x}", path).unwrap_err().to_string(),
            "line 2 column 9: expected value"
        );
        assert_eq!(
            parse_bytes(b"{\"version\": 1, \"version\": 1}", path).unwrap_err().to_string(),
            "line 1 column 24: duplicate field `version`"
        );
        assert_eq!(
            parse_bytes(b"{\"version\": 1}", path).unwrap_err().to_string(),
            "line 1 column 14: missing field `pid`"
        );
        let whole = b"{\"version\": 1, \"pid\": 1, \"device\": 0, \"time\": 0, \"stats\": {}} x";
        assert_eq!(parse_bytes(whole, path).unwrap_err().to_string(), "line 1 column 63: trailing characters");
        // Hostile nesting in an unknown key: an error, not a stack overflow.
        let deep = format!("{{\"x\": {}{}}}", "[".repeat(100_000), "]".repeat(100_000));
        let e = parse_bytes(deep.as_bytes(), path).unwrap_err().to_string();
        assert!(e.contains("recursion limit exceeded") || e.ends_with("missing field `version`"), "{e}");
        // Inside the segments (parsed apart from the rest): still the
        // file's line and column, as reading the file whole places it.
        let head = "{\"version\": 1, \"pid\": 1, \"device\": 0, \"time\": 0, \"stats\": {},\n \"segments\": ";
        for segs in [
            "null",
            "[{\"address\": \"x\"}]",
            "[\n  {\"address\": 0, \"total_size\": 1,\n   \"blocks\": [[1, 1, -1]]}]",
        ] {
            let bytes = format!("{head}{segs}}}");
            let whole = serde_json::from_slice::<RawFile>(bytes.as_bytes()).unwrap_err();
            let ours = parse_bytes(bytes.as_bytes(), path).unwrap_err().to_string();
            assert_eq!(ours, located(&whole, bytes.as_bytes(), 0).to_string(), "{bytes}");
            assert!(ours.starts_with(&format!("line {} column {}: ", whole.line(), whole.column())), "{ours}");
        }
        // Hostile nesting inside the segments: an error, not a stack overflow.
        let deep = format!("{head}{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
        let e = parse_bytes(deep.as_bytes(), path).unwrap_err().to_string();
        assert!(e.starts_with("line 2 column 15: "), "{e}");
    }

    fn file(device: u32, blocks: &[(u64, u64, u8)]) -> String {
        let total: u64 = blocks.iter().map(|b| b.0).sum();
        serde_json::json!({"version": 1, "pid": 1, "device": device, "time": 0, "stats": {},
            "segments": [{"address": 1 << 30, "total_size": total, "blocks": blocks}]})
        .to_string()
    }

    /// A layout whose text did not change is not parsed again; any change
    /// of it, or of the device, is.
    #[test]
    fn a_scanner_reuses_a_layout_only_while_its_text_is_the_same() {
        use std::os::unix::fs::PermissionsExt;
        let d = std::env::temp_dir().join(format!("gpumem-layouts-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        let mut sc = Scanner::new(current_uid(), DEFAULT_CAP);
        let f = d.join("1-0.json");
        let mut read = |text: &str| {
            std::fs::write(&f, text).unwrap();
            let s = sc.scan(&d);
            assert!(s.skipped.is_empty(), "{:?}", s.skipped);
            Arc::clone(&s.published[0].segments)
        };
        let a = read(&file(0, &[(512, 500, 0), (512, 0, 2)]));
        let b = read(&file(0, &[(512, 500, 0), (512, 0, 2)]));
        assert!(Arc::ptr_eq(&a, &b), "the same text: parsed once");
        let c = read(&file(0, &[(512, 500, 0), (512, 0, 1)]));
        assert!(!Arc::ptr_eq(&b, &c));
        assert_eq!(c[0].blocks[1].state, BlockState::ActivePendingFree);
        assert_eq!((c[0].allocated_size, c[0].active_size, c[0].requested_size), (512, 1024, 500));
        let e = read(&file(1, &[(512, 500, 0), (512, 0, 1)]));
        assert_eq!((e[0].device, c[0].device), (1, 0), "another device: parsed again");
        std::fs::remove_file(&f).unwrap();
        assert!(sc.scan(&d).published.is_empty());
        assert!(sc.layouts.is_empty(), "a file gone takes its layout with it");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A fallback directory made after the scanner listed `$TMPDIR` is read
    /// from the next scan on.
    #[test]
    fn a_scanner_finds_a_fallback_directory_made_between_scans() {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let tmp = std::env::temp_dir().join(format!("gpumem-tmp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir(&tmp).unwrap();
        let main = tmp.join("main");
        std::fs::DirBuilder::new().mode(0o700).create(&main).unwrap();
        std::fs::set_permissions(&main, std::fs::Permissions::from_mode(0o700)).unwrap();
        let uid = current_uid();
        let mut sc = Scanner::new(uid, DEFAULT_CAP);
        sc.tmp = tmp.clone();
        assert!(sc.scan(&main).published.is_empty());
        for round in 0..3 {
            let fb = tmp.join(format!("gpumem-top-{uid}-{round}"));
            std::fs::create_dir(&fb).unwrap();
            std::fs::set_permissions(&fb, std::fs::Permissions::from_mode(0o700)).unwrap();
            std::fs::write(
                fb.join(format!("{round}-0.json")),
                file(0, &[(512, 512, 0)]).replace("\"pid\":1", &format!("\"pid\":{}", 10 + round)),
            )
            .unwrap();
            let s = sc.scan(&main);
            let pids: Vec<u32> = s.published.iter().map(|p| p.pid).collect();
            assert_eq!(pids, (10..11 + round).collect::<Vec<_>>(), "{:?}", s.skipped);
        }
        // A listing taken when `$TMPDIR` had been still for a while is
        // reused while its time stays; a change of the time lists it again.
        let set = |t: std::time::SystemTime| std::fs::File::open(&tmp).unwrap().set_modified(t).unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(10);
        set(old);
        assert_eq!(sc.scan(&main).published.len(), 3);
        let x = tmp.join(format!("gpumem-top-{uid}-x"));
        std::fs::create_dir(&x).unwrap();
        std::fs::set_permissions(&x, std::fs::Permissions::from_mode(0o700)).unwrap();
        set(old);
        assert!(sc.fallbacks.as_ref().is_some_and(|f| f.settled));
        assert_eq!(sc.fallback_dirs().0.len(), 3, "the time did not move: the listing is kept");
        set(std::time::SystemTime::now());
        assert_eq!(sc.fallback_dirs().0.len(), 4);
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    /// 2,000 junk names in `$TMPDIR` (directories others may write, files,
    /// links) and 40 of our own empty fallback directories: the files of
    /// the one that publishes are still read, at most 16 fallbacks are, and
    /// what a sample carries about the rest is a few lines, not one each.
    #[test]
    fn junk_in_tmpdir_is_counted_not_listed() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = std::env::temp_dir().join(format!("gpumem-top-test-junk-{}", std::process::id()));
        let main = tmp.join("main");
        std::fs::create_dir_all(&main).unwrap();
        std::fs::set_permissions(&main, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(main.join("1-0.json"), file(0, &[(512, 512, 0)])).unwrap();
        let uid = current_uid();
        for i in 0..2000 {
            let p = tmp.join(format!("gpumem-top-{uid}-junk{i}"));
            match i % 3 {
                0 => {
                    std::fs::create_dir(&p).unwrap();
                    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777)).unwrap();
                }
                1 => std::fs::write(&p, "x").unwrap(),
                _ => std::os::unix::fs::symlink(&main, &p).unwrap(),
            }
        }
        for i in 0..40 {
            let p = tmp.join(format!("gpumem-top-{uid}-ours{i}"));
            std::fs::create_dir(&p).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        let mut sc = Scanner::new(uid, DEFAULT_CAP);
        sc.tmp = tmp.clone();
        let s = sc.scan(&main);
        assert_eq!(s.published.iter().map(|p| p.pid).collect::<Vec<_>>(), [1]);
        assert_eq!(sc.fallback_dirs().0.len(), MAX_FALLBACK_DIRS);
        assert!(s.skipped.len() <= MAX_SKIPPED, "{:?}", s.skipped);
        assert!(s.skipped.iter().any(|l| l.contains("2024 directories named")), "{:?}", s.skipped);
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
