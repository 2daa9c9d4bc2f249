//! State published by PyTorch processes (`assets/python/gpumem_top_publish.py`):
//! one JSON file per process and device in a per-user 0700 directory,
//! written atomically. Files we do not own, over the size cap or malformed
//! are ignored with a reason; nothing in them is trusted beyond its shape.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

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
    pub pid: u32,
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
    #[serde(skip)]
    pub segments: Vec<SegmentInfo>,
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
    #[serde(skip)]
    pub(crate) path: PathBuf,
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
    pub(crate) fn stat(&self, key: &str) -> u64 {
        self.stats.get(key).copied().unwrap_or(0).max(0) as u64
    }
    pub fn allocated(&self) -> u64 {
        self.stat("allocated_bytes.all.current")
    }
    pub fn reserved(&self) -> u64 {
        self.stat("reserved_bytes.all.current")
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
/// docs/json.md has its schema).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct RawFile {
    pub(crate) version: u32,
    pub(crate) pid: u32,
    #[serde(default)]
    pub(crate) nspid: Vec<u32>,
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
    pub(crate) segments: Vec<RawSegment>,
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
}

impl RawFile {
    /// `p` as its publisher wrote it (a recording keeps this, so that
    /// `replay` reads it back with `parse_bytes`).
    pub(crate) fn of(p: &Published) -> RawFile {
        RawFile {
            version: 1,
            pid: p.pid,
            nspid: p.nspid.clone(),
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
        }
    }
}

/// Parses one publisher file's bytes: a field missing, duplicated or of
/// the wrong type, or a layout whose blocks do not add up, is an error
/// saying where.
pub fn parse_bytes(bytes: &[u8], path: &Path) -> Result<Published, String> {
    let raw: RawFile = serde_json::from_slice(bytes).map_err(|e| {
        // "line L column C: what", as every reader of ours says where.
        let m = e.to_string();
        let what = m.rsplit_once(" at line ").map_or(m.as_str(), |x| x.0);
        format!("line {} column {}: {what}", e.line(), e.column())
    })?;
    if raw.version != 1 {
        return Err(format!("version {} (this gpumem-top reads 1)", raw.version));
    }
    let mut segments = Vec::with_capacity(raw.segments.len());
    for s in raw.segments {
        let mut addr = s.address;
        let mut blocks = Vec::with_capacity(s.blocks.len());
        let (mut allocated, mut active, mut requested) = (0, 0, 0);
        for (size, req, st) in s.blocks {
            let state = match st {
                0 => BlockState::ActiveAllocated,
                1 => BlockState::ActivePendingFree,
                2 => BlockState::Inactive,
                x => return Err(format!("segment {:#x}: block state {x}", s.address)),
            };
            if state != BlockState::Inactive {
                active += size;
            }
            if state == BlockState::ActiveAllocated {
                allocated += size;
                requested += req;
            }
            blocks.push(BlockInfo { address: addr, size, requested_size: req, state, tag: 0 });
            addr = addr.checked_add(size).ok_or("block addresses overflow")?;
        }
        if addr - s.address != s.total_size {
            return Err(format!(
                "segment {:#x}: blocks sum to {} of {} bytes",
                s.address,
                addr - s.address,
                s.total_size
            ));
        }
        let segment_type = if s.segment_type == "small" { "small" } else { "large" };
        segments.push(SegmentInfo {
            device: raw.device as i32,
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
    Ok(Published {
        pid: raw.pid,
        nspid: raw.nspid,
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
        path: path.to_path_buf(),
    })
}

/// Reads every `<pid>-<device>.json` in `dir` that `uid` owns and is at
/// most `cap` bytes.
pub fn scan(dir: &Path, uid: u32, cap: u64) -> PublisherScan {
    let mut out = PublisherScan::default();
    scan_into(dir, uid, cap, &mut out);
    // Where the publisher falls back when the usual directory is not
    // usable (another user made it, say): private mkdtemp directories.
    for d in fallback_dirs(uid) {
        if d != dir {
            scan_into(&d, uid, cap, &mut out);
        }
    }
    dedupe(&mut out);
    out
}

/// The publisher's fallback directories: `$TMPDIR/gpumem-top-<uid>-*`.
pub(crate) fn fallback_dirs(uid: u32) -> Vec<PathBuf> {
    let tmp = std::env::temp_dir();
    let prefix = format!("gpumem-top-{uid}-");
    let Ok(rd) = std::fs::read_dir(&tmp) else { return Vec::new() };
    let mut v: Vec<PathBuf> = rd
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with(&prefix)))
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

/// One file per (process, device): the newest, when a process has files in
/// two directories or under two names.
fn dedupe(out: &mut PublisherScan) {
    out.published.sort_by(|a, b| (a.pid, a.cuda_device).cmp(&(b.pid, b.cuda_device)).then(b.time.total_cmp(&a.time)));
    let mut kept: Vec<Published> = Vec::with_capacity(out.published.len());
    for p in out.published.drain(..) {
        match kept.last() {
            Some(k) if (k.pid, k.cuda_device) == (p.pid, p.cuda_device) => {
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

fn scan_into(dir: &Path, uid: u32, cap: u64, out: &mut PublisherScan) {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // The directory itself, not what a link there points to.
    let Ok(meta) = std::fs::symlink_metadata(dir) else { return };
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
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
        let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(&path);
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
        let mut bytes = Vec::new();
        match (&mut f).take(cap + 1).read_to_end(&mut bytes) {
            Ok(n) if n as u64 > cap => {
                out.skipped.push(format!("{}: over the {cap} byte cap", path.display()));
            }
            Ok(_) => match parse_bytes(&bytes, &path) {
                Ok(p) => out.published.push(p),
                Err(e) => out.skipped.push(format!("{}: malformed: {e}", path.display())),
            },
            Err(e) => out.skipped.push(format!("{}: {e}", path.display())),
        }
    }
}

/// Creates `dir` (mode 0700) if missing.
pub fn ensure_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).recursive(true).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_where() {
        let path = Path::new("x.json");
        assert_eq!(
            parse_bytes(b"{\"version\": 1,\n \"pid\": x}", path).unwrap_err(),
            "line 2 column 9: expected value"
        );
        assert_eq!(
            parse_bytes(b"{\"version\": 1, \"version\": 1}", path).unwrap_err(),
            "line 1 column 24: duplicate field `version`"
        );
        assert_eq!(parse_bytes(b"{\"version\": 1}", path).unwrap_err(), "line 1 column 14: missing field `pid`");
        let whole = b"{\"version\": 1, \"pid\": 1, \"device\": 0, \"time\": 0, \"stats\": {}} x";
        assert_eq!(parse_bytes(whole, path).unwrap_err(), "line 1 column 63: trailing characters");
        // Hostile nesting in an unknown key: an error, not a stack overflow.
        let deep = format!("{{\"x\": {}{}}}", "[".repeat(100_000), "]".repeat(100_000));
        let e = parse_bytes(deep.as_bytes(), path).unwrap_err();
        assert!(e.contains("recursion limit exceeded") || e.ends_with("missing field `version`"), "{e}");
    }
}
