//! State published by PyTorch processes (`assets/python/gpumem_top_publish.py`):
//! one JSON file per process and device in a per-user 0700 directory,
//! written atomically. Files we do not own, over the size cap or malformed
//! are ignored with a reason; nothing in them is trusted beyond its shape.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::json::Reader;
use super::{GpuSample, ProcessSample};
use crate::alloc::{BlockInfo, BlockState, SegmentInfo};

/// Files larger than this are not read (a layout of 100k blocks is ~3 MB).
pub const DEFAULT_CAP: u64 = 16 << 20;

/// The directory publishers write to and we read: `$GPUMEM_TOP_DIR`, else
/// `$XDG_RUNTIME_DIR/gpumem-top`, else `/tmp/gpumem-top-<uid>`.
pub fn default_dir() -> PathBuf {
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
    pub nspid: Vec<u32>,
    /// NVML's index of its GPU once a live source has matched it (see
    /// `assign_gpus`); until then the CUDA ordinal it published.
    pub device: u32,
    /// The CUDA ordinal as the process numbers it (under
    /// `CUDA_VISIBLE_DEVICES` not NVML's index).
    pub cuda_device: u32,
    pub uuid: Option<String>,
    pub time: f64,
    pub interval: f64,
    pub command: Option<String>,
    /// `torch.cuda.memory_stats()` as published.
    pub stats: BTreeMap<String, i64>,
    #[serde(skip)]
    pub segments: Vec<SegmentInfo>,
    pub steps: Vec<u64>,
    #[serde(skip)]
    pub path: PathBuf,
}

impl Published {
    pub fn stat(&self, key: &str) -> u64 {
        self.stats.get(key).copied().unwrap_or(0).max(0) as u64
    }
    pub fn allocated(&self) -> u64 {
        self.stat("allocated_bytes.all.current")
    }
    pub fn reserved(&self) -> u64 {
        self.stat("reserved_bytes.all.current")
    }
    /// The fragmentation figures of what it published.
    pub fn fragmentation(&self) -> crate::analysis::Fragmentation {
        crate::analysis::fragmentation_of(
            self.reserved(),
            self.allocated(),
            self.stat("inactive_split_bytes.all.current"),
            self.stat("requested_bytes.all.current"),
            &self.segments,
        )
    }

    /// True when NVML's process is this publisher.
    pub fn matches(&self, p: &ProcessSample) -> bool {
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

/// Parses one publisher file's bytes with `json::Reader` (the tests hold it
/// to `parse_bytes_serde`, the same schema read through serde_json's derive).
pub fn parse_bytes(bytes: &[u8], path: &Path) -> Result<Published, String> {
    let mut r = Reader::new(bytes);
    let mut f = Fields::default();
    let (mut version, mut pid, mut device, mut time) = (None, None, None, None);
    let (mut nspid, mut uuid, mut interval, mut command, mut steps) = (Vec::new(), None, 0.0, None, Vec::new());
    let mut stats = None;
    let mut segments = None;
    // The first error in the layout's meaning, reported after the version check as before.
    let mut bad = None;
    r.object(|r, key| {
        match f.first(r, &key, FILE_KEYS)? {
            Some("version") => version = Some(r.u32()?),
            Some("pid") => pid = Some(r.u32()?),
            Some("nspid") => r.array(|r| {
                nspid.push(r.u32()?);
                Ok(())
            })?,
            Some("device") => device = Some(r.u32()?),
            Some("uuid") => uuid = if r.null()? { None } else { Some(r.string()?.into_owned()) },
            Some("time") => time = Some(r.f64()?),
            Some("interval") => interval = r.f64()?,
            Some("command") => command = if r.null()? { None } else { Some(r.string()?.into_owned()) },
            Some("stats") => {
                let mut m = BTreeMap::new();
                r.object(|r, k| {
                    m.insert(k.into_owned(), r.i64()?);
                    Ok(())
                })?;
                stats = Some(m);
            }
            Some("segments") => {
                let mut v = Vec::new();
                r.array(|r| {
                    v.push(segment(r, &mut bad)?);
                    Ok(())
                })?;
                segments = Some(v);
            }
            Some("steps") => r.array(|r| {
                steps.push(r.u64()?);
                Ok(())
            })?,
            _ => r.skip()?,
        }
        Ok(())
    })?;
    r.end()?;
    let version = need(&r, version, "version")?;
    let pid = need(&r, pid, "pid")?;
    let device = need(&r, device, "device")?;
    let time = need(&r, time, "time")?;
    let stats = need(&r, stats, "stats")?;
    let mut segments = segments.unwrap_or_default();
    if version != 1 {
        return Err(format!("version {version} (this gpumem-top reads 1)"));
    }
    if let Some(e) = bad {
        return Err(e);
    }
    for s in &mut segments {
        s.device = device as i32;
    }
    Ok(Published {
        pid,
        nspid,
        device,
        cuda_device: device,
        uuid: uuid.filter(|u| u.len() <= 96),
        time,
        interval,
        command: command.map(|c| c.chars().filter(|c| !c.is_control()).take(200).collect()),
        stats,
        segments,
        steps,
        path: path.to_path_buf(),
    })
}

const FILE_KEYS: &[&str] =
    &["version", "pid", "nspid", "device", "uuid", "time", "interval", "command", "stats", "segments", "steps"];
const SEGMENT_KEYS: &[&str] =
    &["address", "total_size", "stream", "segment_type", "is_expandable", "blocks", "segment_pool_id"];

fn need<T>(r: &Reader, v: Option<T>, key: &str) -> Result<T, String> {
    v.map_or_else(|| r.error(format_args!("missing field `{key}`")), Ok)
}

/// Which of an object's known keys were seen: a second one is an error, as
/// serde's derive has it.
#[derive(Default)]
struct Fields(u32);

impl Fields {
    /// `key` as one of `known` (None for a key to skip).
    fn first(&mut self, r: &Reader, key: &str, known: &[&'static str]) -> Result<Option<&'static str>, String> {
        let Some(n) = known.iter().position(|k| *k == key) else { return Ok(None) };
        if self.0 & (1 << n) != 0 {
            return r.error(format_args!("duplicate field `{key}`"));
        }
        self.0 |= 1 << n;
        Ok(Some(known[n]))
    }
}

/// One segment: its blocks laid out from its address, with the sums
/// PyTorch's snapshot carries. A state or size that makes no sense is
/// noted in `bad` (the first one) and the segment kept.
fn segment(r: &mut Reader, bad: &mut Option<String>) -> Result<SegmentInfo, String> {
    let mut f = Fields::default();
    let (mut address, mut total_size, mut stream, mut segment_type, mut is_expandable) =
        (None, None, 0, "large", false);
    let mut pool = (0u64, 0u64);
    // Blocks are read with addresses from 0 (the segment's address may come
    // after them) and moved into place once it is known.
    let mut blocks: Option<Vec<BlockInfo>> = None;
    let mut odd_state = None;
    r.object(|r, key| {
        match f.first(r, &key, SEGMENT_KEYS)? {
            Some("address") => address = Some(r.u64()?),
            Some("total_size") => total_size = Some(r.u64()?),
            Some("stream") => stream = r.u64()?,
            Some("segment_type") => segment_type = if r.string()? == "small" { "small" } else { "large" },
            Some("is_expandable") => is_expandable = r.bool()?,
            Some("segment_pool_id") => {
                let mut n = 0;
                r.array(|r| {
                    let v = r.u64()?;
                    match n {
                        0 => pool.0 = v,
                        1 => pool.1 = v,
                        _ => return r.error("segment_pool_id is [a, b]"),
                    }
                    n += 1;
                    Ok(())
                })?;
            }
            Some("blocks") => {
                let mut v = Vec::new();
                r.array(|r| {
                    let mut t = [0u64; 3];
                    let mut n = 0;
                    r.array(|r| {
                        if n == 3 {
                            return r.error("a block is [size, requested_size, state]");
                        }
                        t[n] = if n == 2 {
                            u64::from(u8::try_from(r.u64()?).or_else(|_| r.error("state out of range"))?)
                        } else {
                            r.u64()?
                        };
                        n += 1;
                        Ok(())
                    })?;
                    if n != 3 {
                        return r.error("a block is [size, requested_size, state]");
                    }
                    let state = match t[2] {
                        0 => BlockState::ActiveAllocated,
                        1 => BlockState::ActivePendingFree,
                        2 => BlockState::Inactive,
                        x => {
                            odd_state.get_or_insert((v.len(), x));
                            BlockState::Inactive
                        }
                    };
                    v.push(BlockInfo { address: 0, size: t[0], requested_size: t[1], state, tag: 0 });
                    Ok(())
                })?;
                blocks = Some(v);
            }
            _ => r.skip()?,
        }
        Ok(())
    })?;
    let address = need(r, address, "address")?;
    let total_size = need(r, total_size, "total_size")?;
    let mut blocks = need(r, blocks, "blocks")?;
    let (mut addr, mut allocated, mut active, mut requested) = (address, 0u64, 0u64, 0u64);
    for (i, b) in blocks.iter_mut().enumerate() {
        if let Some((_, x)) = odd_state.filter(|&(at, _)| at == i) {
            bad.get_or_insert_with(|| format!("segment {address:#x}: block state {x}"));
            break;
        }
        if b.state != BlockState::Inactive {
            active = active.wrapping_add(b.size);
        }
        if b.state == BlockState::ActiveAllocated {
            allocated = allocated.wrapping_add(b.size);
            requested = requested.wrapping_add(b.requested_size);
        }
        b.address = addr;
        match addr.checked_add(b.size) {
            Some(a) => addr = a,
            None => {
                bad.get_or_insert_with(|| "block addresses overflow".into());
                break;
            }
        }
    }
    if addr - address != total_size {
        bad.get_or_insert_with(|| {
            format!("segment {address:#x}: blocks sum to {} of {total_size} bytes", addr - address)
        });
    }
    Ok(SegmentInfo {
        device: 0,
        address,
        total_size,
        allocated_size: allocated,
        active_size: active,
        requested_size: requested,
        stream,
        segment_type,
        is_expandable,
        pool: Some(pool),
        private: pool != (0, 0),
        blocks,
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
pub fn fallback_dirs(uid: u32) -> Vec<PathBuf> {
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
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    struct RawSegment {
        address: u64,
        total_size: u64,
        #[serde(default)]
        stream: u64,
        #[serde(default)]
        segment_type: String,
        #[serde(default)]
        is_expandable: bool,
        #[serde(default)]
        segment_pool_id: (u64, u64),
        /// [size, requested_size, state] with state 0 allocated, 1 pending free, 2 inactive.
        blocks: Vec<(u64, u64, u8)>,
    }

    #[derive(Debug, Deserialize)]
    struct RawFile {
        version: u32,
        pid: u32,
        #[serde(default)]
        nspid: Vec<u32>,
        device: u32,
        /// The GPU's UUID as NVML spells it ("GPU-…"); absent from older publishers.
        #[serde(default)]
        uuid: Option<String>,
        time: f64,
        #[serde(default)]
        interval: f64,
        #[serde(default)]
        command: Option<String>,
        stats: BTreeMap<String, i64>,
        #[serde(default)]
        segments: Vec<RawSegment>,
        /// allocated_bytes.all.current at the end of recent optimizer steps.
        #[serde(default)]
        steps: Vec<u64>,
    }

    /// `parse_bytes` through serde_json's derive (the tests' oracle).
    fn parse_bytes_serde(bytes: &[u8], path: &Path) -> Result<Published, String> {
        let raw: RawFile =
            serde_json::from_slice(bytes).map_err(|e| format!("line {} column {}: {e}", e.line(), e.column()))?;
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
            path: path.to_path_buf(),
        })
    }

    /// A random publisher file: fields in any order, some left out, unknown
    /// keys with nested values, escapes, odd spacing and number forms, block
    /// states and sizes that are sometimes wrong.
    fn random_file(seed: u64) -> String {
        let mut x = seed | 1;
        let mut rnd = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n.max(1)
        };
        fn ws(rnd: &mut impl FnMut(u64) -> u64) -> &'static str {
            ["", "", "", " ", "\n  ", "\t", "\r\n"][rnd(7) as usize]
        }
        fn string(rnd: &mut impl FnMut(u64) -> u64) -> String {
            let parts = ["a", "small", "large", "é", "\u{1F600}", "\"", "\\", "\n", "\u{1}", "/", "GPU-1234"];
            let s: String = (0..rnd(4)).map(|_| parts[rnd(parts.len() as u64) as usize]).collect();
            serde_json::to_string(&s).unwrap()
        }
        fn value(rnd: &mut impl FnMut(u64) -> u64, depth: u32) -> String {
            match rnd(if depth > 3 { 5 } else { 7 }) {
                0 => "null".into(),
                1 => ["true", "false"][rnd(2) as usize].into(),
                2 => ["0", "-1", "1.5e3", "-0", "12345678901234567890", "1E-2", "-0.25"][rnd(7) as usize].into(),
                3 | 4 => string(rnd),
                5 => format!("[{}]", (0..rnd(4)).map(|_| value(rnd, depth + 1)).collect::<Vec<_>>().join(",")),
                _ => format!(
                    "{{{}}}",
                    (0..rnd(4))
                        .map(|_| format!("{}:{}", string(rnd), value(rnd, depth + 1)))
                        .collect::<Vec<_>>()
                        .join(",")
                ),
            }
        }
        fn int(rnd: &mut impl FnMut(u64) -> u64, big: u64) -> String {
            match rnd(80) {
                0 => "-3".into(),
                1 => "2.0".into(),
                2 => "1e3".into(),
                3 => "18446744073709551616".into(),
                _ => rnd(big).to_string(),
            }
        }
        fn object(rnd: &mut impl FnMut(u64) -> u64, mut fields: Vec<(String, String)>, unknown: bool) -> String {
            // Shuffle, drop one now and then, add unknown keys, repeat one rarely.
            for i in (1..fields.len()).rev() {
                fields.swap(i, rnd(i as u64 + 1) as usize);
            }
            if rnd(40) == 0 && !fields.is_empty() {
                fields.remove(rnd(fields.len() as u64) as usize);
            }
            for _ in 0..if unknown { rnd(3) } else { 0 } {
                let v = value(rnd, 1);
                fields.push((string(rnd), v));
            }
            if rnd(30) == 0 && !fields.is_empty() {
                let f = fields[0].clone();
                fields.push(f);
            }
            let body: Vec<String> =
                fields.iter().map(|(k, v)| format!("{}{k}{}:{}{v}", ws(rnd), ws(rnd), ws(rnd))).collect();
            format!("{{{}{}}}", body.join(","), ws(rnd))
        }
        let q = |s: &str| format!("\"{s}\"");
        let mut segments = Vec::new();
        for _ in 0..rnd(4) {
            let sizes: Vec<u64> = (0..rnd(4)).map(|_| (rnd(5) + 1) << 20).collect();
            let total: u64 = sizes.iter().sum::<u64>() + if rnd(40) == 0 { 512 } else { 0 };
            let blocks: Vec<String> = sizes
                .iter()
                .map(|s| {
                    let state = if rnd(100) == 0 { 3 + rnd(300) } else { rnd(3) };
                    if rnd(150) == 0 {
                        format!("[{s},{}]", s - 7)
                    } else {
                        format!("[{s},{},{state}]", s - rnd(512))
                    }
                })
                .collect();
            let mut fields = vec![
                (q("address"), int(&mut rnd, 1 << 47)),
                (q("total_size"), total.to_string()),
                (q("blocks"), format!("[{}]", blocks.join(","))),
            ];
            if rnd(2) == 0 {
                fields.push((q("stream"), int(&mut rnd, 4)));
            }
            if rnd(2) == 0 {
                fields.push((
                    q("segment_type"),
                    ["\"small\"", "\"large\"", "\"sm\\u0061ll\"", "7"][if rnd(40) == 0 { 3 } else { rnd(3) as usize }]
                        .into(),
                ));
            }
            if rnd(2) == 0 {
                fields.push((
                    q("is_expandable"),
                    ["true", "false", "0"][if rnd(40) == 0 { 2 } else { rnd(2) as usize }].into(),
                ));
            }
            segments.push(object(&mut rnd, fields, true));
        }
        let stats: Vec<(String, String)> = (0..rnd(6))
            .map(|i| {
                let k =
                    ["allocated_bytes.all.current", "reserved_bytes.all.current", "num_ooms", "a\\\"b"][i as usize % 4];
                (q(k), if rnd(60) == 0 { "1.5".into() } else { (rnd(1 << 40) as i64 - (1 << 30)).to_string() })
            })
            .collect();
        let odd_stats = rnd(20) == 0;
        let fields = vec![
            (q("version"), ["1", "2"][usize::from(rnd(30) == 0)].into()),
            (q("pid"), int(&mut rnd, 1 << 22)),
            (q("nspid"), format!("[{}]", (0..rnd(3)).map(|_| int(&mut rnd, 1 << 22)).collect::<Vec<_>>().join(","))),
            (q("device"), int(&mut rnd, 8)),
            (q("uuid"), if rnd(3) == 0 { "null".into() } else { string(&mut rnd) }),
            (q("time"), format!("{}.{}", rnd(1 << 31), rnd(1000))),
            (q("interval"), ["0.5", "1", "2e-1"][rnd(3) as usize].into()),
            (q("command"), if rnd(3) == 0 { "null".into() } else { string(&mut rnd) }),
            (q("stats"), object(&mut rnd, stats, odd_stats)),
            (q("segments"), format!("[{}]", segments.join(","))),
            (q("steps"), format!("[{}]", (0..rnd(3)).map(|_| int(&mut rnd, 1 << 40)).collect::<Vec<_>>().join(","))),
        ];
        object(&mut rnd, fields, true)
    }

    /// The same verdict and, when good, the same state as serde_json's derive.
    fn agree(bytes: &[u8]) -> Result<bool, String> {
        let path = Path::new("x.json");
        match (parse_bytes(bytes, path), parse_bytes_serde(bytes, path)) {
            (Ok(a), Ok(b)) if a == b => Ok(true),
            (Err(_), Err(_)) => Ok(false),
            (a, b) => Err(format!("{}\nours {a:?}\nserde {b:?}", String::from_utf8_lossy(bytes))),
        }
    }

    #[test]
    fn reader_agrees_with_serde_on_random_and_corrupted_files() {
        let (mut good, mut bad) = (0, 0);
        for seed in 1..4000u64 {
            let doc = random_file(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            match agree(doc.as_bytes()) {
                Ok(true) => good += 1,
                Ok(false) => bad += 1,
                Err(e) => panic!("seed {seed}: {e}"),
            }
            // One ASCII byte deleted, replaced or inserted somewhere.
            let mut b = doc.into_bytes();
            let at = (seed as usize * 7919) % b.len();
            let alphabet = b"{}[],:\"\\ 0-1.eE+nultrfa";
            let c = alphabet[(seed as usize / 3) % alphabet.len()];
            match seed % 3 {
                0 => drop(b.remove(at)),
                1 => b[at] = c,
                _ => b.insert(at, c),
            }
            agree(&b).unwrap_or_else(|e| panic!("seed {seed}, corrupted: {e}"));
            agree(&b[..at]).unwrap_or_else(|e| panic!("seed {seed}, cut at {at}: {e}"));
        }
        // Both kinds were exercised.
        assert!(good > 1000 && bad > 1000, "{good} good, {bad} rejected");
    }

    #[test]
    fn reader_errors_say_where() {
        let path = Path::new("x.json");
        assert_eq!(
            parse_bytes(b"{\"version\": 1,\n \"pid\": x}", path).unwrap_err(),
            "line 2 column 9: expected a number"
        );
        assert_eq!(
            parse_bytes(b"{\"version\": 1, \"version\": 1}", path).unwrap_err(),
            "line 1 column 26: duplicate field `version`"
        );
        assert_eq!(parse_bytes(b"{\"version\": 1} x", path).unwrap_err(), "line 1 column 16: trailing characters");
        // Hostile nesting in an unknown key: an error, not a stack overflow.
        let deep = format!("{{\"x\": {}{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(parse_bytes(deep.as_bytes(), path).unwrap_err().contains("recursion limit exceeded"));
    }
}
