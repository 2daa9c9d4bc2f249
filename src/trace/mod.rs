//! Event streams in and out: PyTorch memory snapshots (a safe pickle
//! decoder), our JSON-lines traces and RAPIDS RMM log CSVs. The format is
//! recognised from the content, gzip by its magic bytes.

pub mod deltas;
pub mod input;
pub mod pickle;
mod prefault;
pub mod printable;
mod rows;
mod snapshot;
pub mod times;

pub use times::Times;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use thiserror::Error;

use crate::alloc::{Action, AllocatorConfig, BlockState, Event, Events};
pub(crate) use snapshot::MAX_SEGMENT_BYTES;
pub use snapshot::{read_snapshot, read_snapshot_limited, read_snapshot_sized};

#[derive(Debug, Error)]
pub enum TraceError {
    #[error("{0}")]
    Pickle(pickle::PickleError),
    #[error("not a PyTorch snapshot: {0}")]
    Schema(String),
    #[error("line {line}: {msg}")]
    Line { line: usize, msg: String },
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("unrecognised format: {0}")]
    Format(String),
    #[error("{0}")]
    Corrupt(String),
}

/// Which call stacks a trace carries (JSON: "per_event", "blocks_only",
/// "none").
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CallStacks {
    /// Allocations have frames: `context="alloc"` or `"all"`.
    PerEvent,
    /// Only the snapshot's blocks: `context="state"`.
    BlocksOnly,
    /// `context=None`, or a format without stacks.
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TraceFormat {
    #[default]
    PytorchSnapshot,
    Jsonl,
    RmmCsv,
    /// `fit --no-gpu`'s recording: a PyTorch snapshot's trace of the
    /// requests a program would make, recorded with CUDA faked; no segment
    /// or address is the device's (docs/user/fit.md "Without a GPU").
    NoGpu,
}

impl TraceFormat {
    pub fn name(self) -> &'static str {
        match self {
            TraceFormat::PytorchSnapshot => "pytorch-snapshot",
            TraceFormat::Jsonl => "jsonl",
            TraceFormat::RmmCsv => "rmm-csv",
            TraceFormat::NoGpu => "gpumem-top-nogpu",
        }
    }
}

/// One frame of a call stack. Its strings are shared: a snapshot references
/// a few frames from many stacks, and a stack of them costs a pointer pair
/// a frame, not copies of the names (docs/user/input.md, "Bounds").
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Frame {
    pub name: Arc<str>,
    pub filename: Arc<str>,
    pub(crate) line: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedBlock {
    pub(crate) address: u64,
    pub size: u64,
    pub requested_size: u64,
    pub state: BlockState,
    /// Index into `Trace::stacks` + 1; 0 = no frames.
    pub stack: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedSegment {
    pub(crate) device: i32,
    pub address: u64,
    pub total_size: u64,
    pub(crate) stream: u64,
    pub small: bool,
    pub(crate) is_expandable: bool,
    /// `segment_pool_id` (torch 2.x): (0,0) for the default pools.
    pub pool: (u64, u64),
    pub blocks: Vec<RecordedBlock>,
}

/// The events of one device, as columns.
#[derive(Debug, Clone, Default)]
pub struct DeviceTrace {
    pub(crate) device: i32,
    /// Shared: the replay behind the decoding may still be reading them
    /// (docs/design/trace-decoding.md, "The columns shared at the end").
    pub events: Arc<Events>,
    pub time_us: Times,
    /// Per event: index into `Trace::stacks` + 1; 0 = no frames. Shared
    /// as `events` is.
    pub stacks: Arc<Vec<u32>>,
    /// Segments at the time the snapshot was taken.
    pub segments: Vec<RecordedSegment>,
    /// Pre-2.1 `free` entries, each expanded into `free_requested` + `free_completed`.
    pub(crate) legacy_free: usize,
    /// Events of exact-address allocations (`mallocWithAddress`, 2.13+), ascending.
    pub(crate) exact: Vec<usize>,
}

/// One device's columns while a reader makes them: plain, then shared
/// once made, since pushing through `DeviceTrace`'s `Arc`s would cost an
/// atomic exchange an event.
#[derive(Default)]
pub(crate) struct DeviceColumns {
    events: Events,
    time_us: Times,
    stacks: Vec<u32>,
}

impl DeviceColumns {
    pub(crate) fn push(&mut self, e: Event, time_us: i64, stack: u32) {
        self.events.push(e);
        self.time_us.push(time_us);
        self.stacks.push(stack);
    }

    pub(crate) fn len(&self) -> usize {
        self.events.len()
    }

    /// The columns made, shared from now on: events, times, stacks.
    pub(crate) fn shared(self) -> (Arc<Events>, Times, Arc<Vec<u32>>) {
        (Arc::new(self.events), self.time_us, Arc::new(self.stacks))
    }

    /// Device `device`'s trace of these columns.
    pub(crate) fn into_trace(self, device: i32) -> DeviceTrace {
        let (events, time_us, stacks) = self.shared();
        DeviceTrace { device, events, time_us, stacks, ..Default::default() }
    }
}

impl DeviceTrace {
    /// The CUDA device index it was recorded on.
    pub fn device(&self) -> i32 {
        self.device
    }

    /// Which call stacks it carries. Said in replay's output (docs/user/live.md).
    pub fn call_stacks(&self, stacks: &[Vec<crate::trace::Frame>]) -> CallStacks {
        let has = |sid: u32| sid != 0 && stacks.get(sid as usize - 1).is_some_and(|f| !f.is_empty());
        if self.events.iter().zip(self.stacks.iter()).any(|(e, &s)| e.action == crate::alloc::Action::Alloc && has(s)) {
            CallStacks::PerEvent
        } else if self.segments.iter().flat_map(|g| &g.blocks).any(|b| has(b.stack)) {
            CallStacks::BlocksOnly
        } else {
            CallStacks::None
        }
    }

    /// Whether the trace carries segment events, so that it can be replayed
    /// address-exact.
    pub(crate) fn has_segment_events(&self) -> bool {
        self.events.segment_events().next().is_some()
    }

    /// Whether any event maps or unmaps expandable-segment pages.
    pub(crate) fn has_map_events(&self) -> bool {
        self.events.segment_events().any(|i| {
            matches!(self.events.at(i).action, crate::alloc::Action::SegmentMap | crate::alloc::Action::SegmentUnmap)
        })
    }
}

/// `allocator_settings` as recorded (torch 2.3+).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settings {
    pub conf: String,
    pub max_split_size: Option<i64>,
    pub(crate) garbage_collection_threshold: Option<f64>,
    pub expandable_segments: Option<bool>,
    pub(crate) roundup_power2_divisions: Option<[u64; 16]>,
}

impl Settings {
    /// The allocator configuration the recorded run used: the settings
    /// string, overridden by the already-parsed fields PyTorch stored
    /// (docs/design/pytorch-allocator.md §15.2).
    pub fn config(&self) -> AllocatorConfig {
        let mut c = AllocatorConfig::parse(&self.conf)
            .unwrap_or_else(|_| AllocatorConfig { source: self.conf.clone(), ..Default::default() });
        if let Some(m) = self.max_split_size {
            c.max_split_size = if m < 0 { u64::MAX } else { m as u64 };
        }
        if let Some(g) = self.garbage_collection_threshold {
            c.garbage_collection_threshold = g;
        }
        if let Some(e) = self.expandable_segments {
            c.expandable_segments = e;
        }
        if let Some(rp) = self.roundup_power2_divisions {
            c.roundup_power2_divisions = rp;
        }
        c
    }
}

/// An `external_annotations` entry (record_function markers and the like).
/// Its keys and texts are shared: a run of 10,000 steps has 40,000 markers
/// made of four strings (docs/design/trace-decoding.md, "Annotations").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Annotation {
    pub(crate) device: i32,
    pub(crate) time_us: i64,
    pub(crate) fields: Vec<(Arc<str>, Arc<str>)>,
}

impl Annotation {
    /// The text of field `k`, if it has one.
    pub(crate) fn field(&self, k: &str) -> Option<&str> {
        self.fields.iter().find(|(n, _)| &**n == k).map(|(_, v)| &**v)
    }
}

#[derive(Debug, Clone, Default)]
pub struct Trace {
    pub format: TraceFormat,
    pub devices: Vec<DeviceTrace>,
    pub settings: Option<Settings>,
    pub annotations: Vec<Annotation>,
    /// Interned call stacks (innermost frame first).
    pub stacks: Vec<Vec<Frame>>,
    /// What the file says of the PyTorch release that wrote it.
    pub release: ReleaseEvidence,
    /// What `fit --no-gpu`'s recorder says it did or could not see (each
    /// with how many times), for a `NoGpu` trace.
    pub nogpu_notes: Vec<(String, u64)>,
}

/// The fields each PyTorch release added to snapshots, as found in one
/// file, and what they say of the release that wrote it
/// (docs/design/pytorch-allocator.md, "Releases"; docs/user/replay.md, "Which release").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReleaseEvidence {
    /// Trace entries carry `pool_id` (every entry from 2.12).
    pub(crate) pool_ids: bool,
    /// `allocator_settings` has `max_round_threshold` / `max_cached_size` (2.13+).
    pub(crate) settings_keys_2_13: bool,
    /// The file has `allocator_settings` at all (2.3+).
    pub(crate) settings_recorded: bool,
    /// `mallocWithAddress` in `user_metadata` (2.13, 2.14).
    pub(crate) exact_in_user_metadata: bool,
    /// `annotate` entries (2.14+).
    pub(crate) annotate: bool,
    /// `host_segments` / `host_traces` (2.14+), not replayed.
    pub(crate) host_memory: bool,
    /// `internal_metadata` (2.15+).
    pub(crate) internal_metadata: bool,
    /// `torch.__version__` as our own recorders store it.
    pub(crate) recorded_version: Option<String>,
    /// Entries with an action this reader does not know, skipped: (action, count).
    pub unknown_actions: Vec<(String, usize)>,
    pub(crate) has_entries: bool,
}

impl ReleaseEvidence {
    /// The oldest and newest release the file's fields allow, and why.
    pub fn bounds(&self) -> (crate::alloc::Release, crate::alloc::Release, String) {
        use crate::alloc::Release;
        let r = |m: u16| Release { major: 2, minor: m, patch: 0 };
        if let Some(v) = self.recorded_version.as_deref().and_then(|v| Release::parse(v).ok()) {
            return (v, v, format!("torch.__version__ {v} recorded with the trace"));
        }
        let (lo, why) = if self.internal_metadata {
            (r(15), "trace entries carry internal_metadata (2.15+)")
        } else if self.annotate || self.host_memory {
            (r(14), "the file has annotate entries or host memory (2.14+)")
        } else if self.settings_keys_2_13 || self.exact_in_user_metadata {
            (r(13), "allocator_settings has the 2.13 keys")
        } else if self.pool_ids {
            (r(12), "trace entries carry pool_id (2.12+)")
        } else {
            (r(0), "")
        };
        // What the file lacks bounds it from above, where the release that
        // added it would have written it.
        let hi = if self.has_entries && !self.pool_ids {
            Some((r(11), "trace entries carry no pool_id (2.12 adds it to every entry)"))
        } else if self.settings_recorded && !self.settings_keys_2_13 && lo < r(13) {
            Some((r(12), "allocator_settings lacks 2.13's keys"))
        } else {
            None
        };
        match hi {
            Some((hi, why_hi)) if lo.minor == 0 => (Release::V2_11.min(hi), hi, why_hi.to_string()),
            Some((hi, why_hi)) if hi >= lo => (lo, hi, format!("{why}; {why_hi}")),
            _ if lo.minor == 0 => (Release::V2_11, Release::NEWEST, "the file does not say".into()),
            _ => (lo, Release::NEWEST, why.to_string()),
        }
    }
}

impl Trace {
    /// The device with the most events (device 0 on ties).
    pub fn main_device(&self) -> Option<&DeviceTrace> {
        self.devices.iter().max_by(|a, b| a.events.len().cmp(&b.events.len()).then(b.device.cmp(&a.device)))
    }
}

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// A compressed input may unpack to this many times the bytes of it read …
pub(crate) const UNPACK_RATIO: u64 = 64;
/// … plus this (docs/user/input.md).
pub(crate) const UNPACK_SLACK: u64 = 256 << 20;
/// The longest line of a JSON-lines or CSV input.
pub(crate) const MAX_LINE: usize = 64 << 20;

/// Bounds on reading one input, so that memory and time follow the file
/// (docs/user/input.md "Bounds").
#[derive(Debug, Clone, Default)]
pub struct ReadLimits {
    /// Bytes of the file read so far, counted by the caller's reader: the
    /// pickle decoder's memory allowance and the unpacked-size cap grow with
    /// these. Without it, with the bytes the decoder reads.
    pub(crate) consumed: Option<Arc<AtomicU64>>,
    /// A fixed cap on the unpacked size instead of `UNPACK_RATIO` times the
    /// file plus `UNPACK_SLACK` (`--max-unpacked`).
    pub(crate) max_unpacked: Option<u64>,
    /// Where a PyTorch snapshot's events go as they are decoded.
    pub(crate) tap: Option<Tap>,
}

/// Takes a PyTorch snapshot's trace entries as events (with their call
/// stacks' ids) while the file is decoded, in entry order, and keeps them
/// until the reader takes the whole columns back: work that needs only
/// those (the replay, a screen's scrubber) runs behind the decoding
/// (docs/design/trace-decoding.md, "The replay behind the decoder").
pub(crate) trait EventTap: Send + Sync {
    /// The next events and their call-stack ids, in entry order; the first
    /// carry the room reserved for all of them.
    fn events(&self, chunk: Events, stacks: Vec<u32>);
    /// Every event and stack given, `rest` after them, as one column each:
    /// the decoding is done. `whole`: the device whose events they all
    /// are, in order (`None` where the file's devices share them otherwise).
    /// The columns come back shared: what the tap runs may go on reading
    /// them while the trace is made and opened.
    fn finish(&self, rest: Events, rest_stacks: Vec<u32>, whole: Option<i32>) -> (Arc<Events>, Arc<Vec<u32>>);
}

/// An `EventTap` a reader is given, and how many events it takes at a
/// time (`Tap::CHUNK`: 1 MiB of them; tests take fewer).
#[derive(Clone)]
pub(crate) struct Tap {
    pub(crate) to: Arc<dyn EventTap>,
    pub(crate) chunk: usize,
}

impl Tap {
    pub(crate) const CHUNK: usize = 1 << 16;
}

impl std::fmt::Debug for Tap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tap")
    }
}

/// Opens a trace file of any supported format, gzip-compressed or not.
pub fn load(path: &Path) -> Result<Trace, TraceError> {
    let f = std::fs::File::open(path)?;
    read_any_compressed(BufReader::with_capacity(1 << 16, f))
}

/// The gzipped pickles of `tests/fixtures/FOLDER`, in name order, each
/// read: what the unit tests that ask a pass over every fixture go over.
#[cfg(test)]
pub(crate) fn fixture_traces(folder: &str) -> Vec<(std::path::PathBuf, Trace)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(folder);
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".pickle.gz"))
        .collect();
    paths.sort();
    paths.into_iter().map(|p| (p.clone(), load(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))).collect()
}

/// Reads a trace of any supported format, recognising gzip by its magic bytes.
/// Decompression runs on its own thread, ahead of the parser.
pub(crate) fn read_any_compressed<R: BufRead + Send + 'static>(r: R) -> Result<Trace, TraceError> {
    read_any_compressed_sized(r, 0)
}

/// As `read_any_compressed`, with the unpacked size if known (for gzip, the
/// trailer's ISIZE; see `gzip_unpacked_size`).
pub(crate) fn read_any_compressed_sized<R: BufRead + Send + 'static>(r: R, unpacked: u64) -> Result<Trace, TraceError> {
    let n = Arc::new(AtomicU64::new(0));
    let counted = BufReader::with_capacity(1 << 16, Counted { inner: r, n: n.clone() });
    read_limited(counted, unpacked, ReadLimits { consumed: Some(n), max_unpacked: None, tap: None })
}

/// Counts the bytes read through it.
pub(crate) struct Counted<R> {
    pub(crate) inner: R,
    pub(crate) n: Arc<AtomicU64>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let k = self.inner.read(buf)?;
        self.n.fetch_add(k as u64, Ordering::Relaxed);
        Ok(k)
    }
}

/// Stops a decompressor once it has produced more than the limits allow.
struct Capped<R> {
    inner: R,
    produced: u64,
    limits: ReadLimits,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let k = self.inner.read(buf)?;
        self.produced += k as u64;
        let cap = match (self.limits.max_unpacked, &self.limits.consumed) {
            (Some(m), _) => m,
            (None, Some(c)) => c.load(Ordering::Relaxed).saturating_mul(UNPACK_RATIO).saturating_add(UNPACK_SLACK),
            (None, None) => u64::MAX,
        };
        if self.produced > cap {
            let how = match self.limits.max_unpacked {
                Some(_) => "the --max-unpacked limit".to_string(),
                None => format!("{UNPACK_RATIO} times the compressed bytes read plus 256 MiB; --max-unpacked BYTES raises the limit"),
            };
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("gzip data unpacks to more than {cap} bytes ({how})"),
            ));
        }
        Ok(k)
    }
}

/// Reads a trace of any format from `r` under `limits`: the pickle decoder's
/// memory and a compressed input's unpacked size grow with the bytes of the
/// file read, lines are bounded, and a gzip member's CRC and size are
/// checked to the end.
pub(crate) fn read_limited<R: BufRead + Send + 'static>(
    mut r: R,
    unpacked: u64,
    limits: ReadLimits,
) -> Result<Trace, TraceError> {
    if r.fill_buf()?.starts_with(&GZIP_MAGIC) {
        let capped = Capped { inner: flate2::bufread::MultiGzDecoder::new(r), produced: 0, limits: limits.clone() };
        let pipe = Prefetch::ahead(capped);
        let mut r = BufReader::with_capacity(1 << 16, pipe);
        let t = read_any_sized(&mut r, unpacked, &limits)?;
        // A pickle ends at STOP, before gzip's trailer: read to the end so
        // the CRC-32 and size are checked.
        std::io::copy(&mut r, &mut std::io::sink())
            .map_err(|e| TraceError::Corrupt(format!("gzip stream after the trace: {e}")))?;
        Ok(t)
    } else {
        // Read on the decoding thread: read ahead on a thread of its own,
        // as gzip is, it was slower on two cores (docs/design/trace-decoding.md,
        // "Reading ahead").
        read_any_sized(r, unpacked, &limits)
    }
}

/// `r` as plain bytes: gunzipped (every member, under the same unpacked-size
/// cap as traces) when it starts with gzip's magic, else as it is. For
/// inputs read as lines (recordings) rather than as a trace.
pub(crate) fn plain<R: BufRead + Send + 'static>(
    mut r: R,
    limits: ReadLimits,
) -> std::io::Result<Box<dyn BufRead + Send>> {
    if r.fill_buf()?.starts_with(&GZIP_MAGIC) {
        let capped = Capped { inner: flate2::bufread::MultiGzDecoder::new(r), produced: 0, limits };
        Ok(Box::new(BufReader::with_capacity(1 << 16, capped)))
    } else {
        Ok(Box::new(r))
    }
}

/// The first line of `head` (the first bytes of an input) as text: gunzipped
/// when it is gzip (as far as those bytes go), without a byte order mark or
/// leading blank lines.
pub(crate) fn first_line(head: &[u8]) -> String {
    let mut bytes = Vec::new();
    if head.starts_with(&GZIP_MAGIC) {
        use std::io::Read;
        let mut d = flate2::read::MultiGzDecoder::new(head).take(64 << 10);
        // A prefix of the stream ends in an error; what came before it counts.
        let mut buf = [0u8; 4096];
        while let Ok(k) = d.read(&mut buf) {
            if k == 0 {
                break;
            }
            bytes.extend_from_slice(&buf[..k]);
        }
    } else {
        bytes.extend_from_slice(head);
    }
    let t = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(&bytes);
    let start = t.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(t.len());
    let line = t[start..].split(|&b| b == b'\n').next().unwrap_or(&[]);
    String::from_utf8_lossy(line).into_owned()
}

/// The unpacked size a gzip file's trailer records (modulo 4 GiB, and
/// whatever a truncated or hostile file holds there, so only a hint, capped
/// at 16 times the file's size), or its own size for a file that is not gzip.
pub(crate) fn gzip_unpacked_size(f: &mut std::fs::File) -> u64 {
    use std::io::{Read, Seek, SeekFrom};
    let mut head = [0u8; 2];
    let mut tail = [0u8; 4];
    let size = f.metadata().map(|m| m.len()).unwrap_or(0);
    let hint = (|| {
        f.seek(SeekFrom::Start(0)).ok()?;
        f.read_exact(&mut head).ok()?;
        if head != GZIP_MAGIC {
            return Some(size);
        }
        f.seek(SeekFrom::End(-4)).ok()?;
        f.read_exact(&mut tail).ok()?;
        Some((u32::from_le_bytes(tail) as u64).min(size.saturating_mul(16)))
    })();
    let _ = f.seek(SeekFrom::Start(0));
    hint.unwrap_or(0)
}

/// A reader filled by a background thread in large chunks, so that reading
/// (and decompressing) overlaps with parsing. Errors arrive in order. The
/// chunks read come back to be filled again, so the thread touches no fresh
/// pages after the first few.
struct Prefetch {
    rx: std::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>,
    back: std::sync::mpsc::SyncSender<Vec<u8>>,
    cur: Vec<u8>,
    pos: usize,
    done: bool,
}

impl Prefetch {
    /// Bytes a chunk holds, and chunks read ahead: a few MiB, each chunk
    /// small enough to be still in the cache when it is copied out.
    const CHUNK: usize = 256 << 10;
    const AHEAD: usize = 8;

    /// `r` read on a thread of its own, or as it is where the system gives
    /// no thread: the reader is handed over once the thread is there.
    fn ahead<R: std::io::Read + Send + 'static>(r: R) -> Box<dyn std::io::Read + Send> {
        let (tx, rx) = std::sync::mpsc::sync_channel(Self::AHEAD);
        let (back, returned) = std::sync::mpsc::sync_channel::<Vec<u8>>(Self::AHEAD + 2);
        let (give, given) = std::sync::mpsc::sync_channel::<R>(1);
        let read = move || {
            if let Ok(mut r) = given.recv() {
                Self::fill(&mut r, &tx, &returned);
            }
        };
        if std::thread::Builder::new().name("read".into()).spawn(read).is_err() {
            return Box::new(r);
        }
        match give.send(r) {
            Ok(()) => Box::new(Prefetch { rx, back, cur: Vec::new(), pos: 0, done: false }),
            Err(std::sync::mpsc::SendError(r)) => Box::new(r),
        }
    }

    /// Chunks of `r` sent in order until its end or its error.
    fn fill<R: std::io::Read>(
        r: &mut R,
        tx: &std::sync::mpsc::SyncSender<std::io::Result<Vec<u8>>>,
        returned: &std::sync::mpsc::Receiver<Vec<u8>>,
    ) {
        loop {
            let mut buf = returned.try_recv().unwrap_or_default();
            buf.resize(Self::CHUNK, 0);
            let mut n = 0;
            // Fill the chunk, so the parser sees few, large pieces.
            let res = loop {
                match r.read(&mut buf[n..]) {
                    Ok(0) => break Ok(()),
                    Ok(k) => {
                        n += k;
                        if n == buf.len() {
                            break Ok(());
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => break Err(e),
                }
            };
            buf.truncate(n);
            let last = n == 0 || res.is_err();
            let msg = match res {
                Ok(()) if n > 0 => Ok(buf),
                Ok(()) => Ok(Vec::new()),
                Err(e) if n > 0 => {
                    // Deliver what was read before the error, then the error.
                    if tx.send(Ok(buf)).is_err() {
                        return;
                    }
                    Err(e)
                }
                Err(e) => Err(e),
            };
            if tx.send(msg).is_err() || last {
                return;
            }
        }
    }
}

impl std::io::Read for Prefetch {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.pos == self.cur.len() {
            if self.done {
                return Ok(0);
            }
            match self.rx.recv() {
                Ok(Ok(chunk)) => {
                    if chunk.is_empty() {
                        self.done = true;
                    }
                    // The chunk read goes back to be filled again (or is
                    // dropped if the thread has enough).
                    let _ = self.back.try_send(std::mem::replace(&mut self.cur, chunk));
                    self.pos = 0;
                }
                Ok(Err(e)) => {
                    self.done = true;
                    return Err(e);
                }
                Err(_) => {
                    self.done = true;
                    return Ok(0);
                }
            }
        }
        let k = out.len().min(self.cur.len() - self.pos);
        out[..k].copy_from_slice(&self.cur[self.pos..self.pos + k]);
        self.pos += k;
        Ok(k)
    }
}

/// Reads a trace of any supported format from an uncompressed stream.
pub fn read_any<R: BufRead>(r: R) -> Result<Trace, TraceError> {
    read_any_sized(r, 0, &ReadLimits::default())
}

fn read_any_sized<R: BufRead>(mut r: R, unpacked: u64, limits: &ReadLimits) -> Result<Trace, TraceError> {
    let head = r.fill_buf()?;
    if head.is_empty() {
        return Err(TraceError::Format("the file is empty".into()));
    }
    // A text file may start with a UTF-8 byte order mark or blank lines.
    let text_start = {
        let t = head.strip_prefix(b"\xef\xbb\xbf").unwrap_or(head);
        t.iter().find(|b| !b.is_ascii_whitespace()).copied()
    };
    if text_start.is_none() && head.iter().all(|b| b.is_ascii_whitespace() || b"\xef\xbb\xbf".contains(b)) {
        // Nothing but blank lines in the buffer: read past them (however
        // many; at most one line's bound), keeping them so that lines keep
        // their numbers, then tell the format by what follows.
        let mut blank = Vec::new();
        loop {
            let buf = r.fill_buf()?;
            if buf.is_empty() {
                return Err(TraceError::Format("the file holds only blank lines".into()));
            }
            let skip = if blank.is_empty() && buf.starts_with(b"\xef\xbb\xbf") { 3 } else { 0 };
            let k = buf[skip..].iter().position(|b| !b.is_ascii_whitespace()).map(|k| k + skip);
            let take = k.unwrap_or(buf.len());
            blank.extend_from_slice(&buf[..take]);
            r.consume(take);
            if blank.len() > MAX_LINE {
                return Err(TraceError::Line { line: 1, msg: format!("blank lines longer than {MAX_LINE} bytes") });
            }
            if k.is_some() {
                break;
            }
        }
        if r.fill_buf()?.first() != Some(&b'{') {
            return Err(TraceError::Format("blank lines, then neither JSON lines nor an RMM log CSV".into()));
        }
        return read_jsonl_limited(BufReader::new(std::io::Cursor::new(blank).chain(r)), limits);
    }
    match head[0] {
        0x80 => read_snapshot_limited(r, unpacked, limits),
        _ if text_start == Some(b'{') => read_jsonl_limited(r, limits),
        _ if head.starts_with(b"Thread,") || head.starts_with(b"\xef\xbb\xbfThread,") => {
            read_rmm_csv_limited(r, limits)
        }
        // Protocol 0/1 pickles start with a container or MARK opcode.
        b'(' | b']' | b'}' | b'l' | b'd' => read_snapshot_limited(r, unpacked, limits),
        b => {
            Err(TraceError::Format(format!("first byte 0x{b:02x} is neither a pickle, JSON lines, nor an RMM log CSV")))
        }
    }
}

/// Bytes one event takes in a `DeviceTrace`'s columns, with room for the
/// columns' growth.
const EVENT_COST: u64 = 96;

/// Whether `events` events fit the memory the limits allow (docs/user/input.md):
/// 24 times the bytes of the file read, plus 64 MiB.
fn events_fit(events: u64, limits: &ReadLimits, read: u64) -> bool {
    let read = limits.consumed.as_ref().map(|c| c.load(Ordering::Relaxed)).unwrap_or(read);
    let allowance = match limits.max_unpacked {
        Some(m) => m.saturating_mul(24),
        None => read.saturating_mul(24),
    };
    events.saturating_mul(EVENT_COST) <= allowance.saturating_add(64 << 20)
}

fn read_jsonl_limited<R: BufRead>(r: R, limits: &ReadLimits) -> Result<Trace, TraceError> {
    let mut devices: Vec<DeviceColumns> = Vec::new();
    let (mut n_events, mut read) = (0u64, 0u64);
    for (n, line) in bounded_lines(r).enumerate() {
        let line = line?;
        read += line.len() as u64 + 1;
        let line = line.strip_prefix('\u{feff}').unwrap_or(&line);
        if line.trim().is_empty() {
            continue;
        }
        n_events += 1;
        if !events_fit(n_events, limits, read) {
            return Err(TraceError::Line {
                line: n + 1,
                msg: "the events exceed 24 times the file's bytes plus 64 MiB (--max-unpacked raises it for a compressed file)".into(),
            });
        }
        let err = |msg: String| TraceError::Line { line: n + 1, msg };
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| err(format!("not JSON: {e}")))?;
        let action = v["action"].as_str().ok_or_else(|| {
            // gpumem-top's own reports are JSON too: said as that.
            let report = ["fidelity", "candidates", "predictions", "at_peak", "recommended"];
            match report.iter().find(|k| v.get(**k).is_some()) {
                Some(k) => err(format!(
                    "this is a gpumem-top --json report (it has {k:?}), not a trace: give the snapshot or recording it was made from"
                )),
                None => err("missing \"action\"".into()),
            }
        })?;
        let action = Action::from_name(action).ok_or_else(|| err(format!("unknown action {action:?}")))?;
        let num = |k: &str| -> Result<u64, TraceError> {
            v[k].as_u64()
                .ok_or_else(|| TraceError::Line { line: n + 1, msg: format!("\"{k}\" must be a non-negative integer") })
        };
        let addr = if v.get("addr").is_some() { num("addr")? } else { 0 };
        let e = Event::new(action, addr, num("size")?, if v.get("stream").is_some() { num("stream")? } else { 0 });
        let device = match v.get("device") {
            None => 0,
            Some(d) => match d.as_u64() {
                Some(d) if d <= 1024 => d as usize,
                _ => return Err(err(format!("\"device\" must be a device index 0..=1024, got {d}"))),
            },
        };
        while devices.len() <= device {
            devices.push(DeviceColumns::default());
        }
        devices[device].push(e, v["time_us"].as_i64().unwrap_or(0), 0);
    }
    let devices = devices.into_iter().enumerate().map(|(d, c)| c.into_trace(d as i32)).collect();
    Ok(Trace { format: TraceFormat::Jsonl, devices, ..Default::default() })
}

/// Lines of at most `MAX_LINE` bytes: a longer one is an error naming it,
/// not a buffer the size of the file.
pub(crate) fn bounded_lines<R: BufRead>(mut r: R) -> impl Iterator<Item = Result<String, TraceError>> {
    let mut n = 0usize;
    let mut done = false;
    std::iter::from_fn(move || {
        if done {
            return None;
        }
        n += 1;
        let mut buf = Vec::new();
        match (&mut r).take(MAX_LINE as u64 + 1).read_until(b'\n', &mut buf) {
            Ok(0) => {
                done = true;
                None
            }
            Ok(_) if buf.len() > MAX_LINE => {
                done = true;
                Some(Err(TraceError::Line { line: n, msg: format!("is longer than {MAX_LINE} bytes") }))
            }
            Ok(_) => {
                if buf.last() == Some(&b'\n') {
                    buf.pop();
                    if buf.last() == Some(&b'\r') {
                        buf.pop();
                    }
                }
                match String::from_utf8(buf) {
                    Ok(s) => Some(Ok(s)),
                    Err(_) => {
                        done = true;
                        Some(Err(TraceError::Line { line: n, msg: "is not UTF-8".into() }))
                    }
                }
            }
            Err(e) => {
                done = true;
                Some(Err(TraceError::Io(e)))
            }
        }
    })
}

/// Writes events as our JSON lines, one `{"action","addr","size","stream"}` per event.
pub(crate) fn write_jsonl<W: Write>(mut w: W, events: &[Event]) -> std::io::Result<()> {
    for e in events {
        writeln!(w, "{{\"action\":\"{}\",\"addr\":{},\"size\":{},\"stream\":{}}}", e.action, e.addr, e.size, e.stream)?;
    }
    w.flush()
}

fn read_rmm_csv_limited<R: BufRead>(r: R, limits: &ReadLimits) -> Result<Trace, TraceError> {
    let mut dt = DeviceColumns::default();
    let mut read = 0u64;
    let mut lines = bounded_lines(r).enumerate();
    let header = lines.next().map(|(_, l)| l).transpose()?.unwrap_or_default();
    let header = header.strip_prefix('\u{feff}').unwrap_or(&header).to_string();
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    let col = |name: &str| {
        cols.iter()
            .position(|c| c.eq_ignore_ascii_case(name))
            .ok_or_else(|| TraceError::Line { line: 1, msg: format!("RMM log header has no {name} column") })
    };
    let (c_action, c_ptr, c_size, c_stream) = (col("Action")?, col("Pointer")?, col("Size")?, col("Stream")?);
    for (n, line) in lines {
        let line = line?;
        read += line.len() as u64 + 1;
        if line.trim().is_empty() {
            continue;
        }
        let err = |msg: String| TraceError::Line { line: n + 1, msg };
        if !events_fit(dt.len() as u64 + 2, limits, read + header.len() as u64) {
            return Err(err(
                "the events exceed 24 times the file's bytes plus 64 MiB (--max-unpacked raises it for a compressed file)"
                    .into(),
            ));
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let get =
            |i: usize| f.get(i).copied().ok_or_else(|| err(format!("has {} fields, expected {}", f.len(), cols.len())));
        let hex = |s: &str| -> Result<u64, TraceError> {
            let t = s.trim_start_matches("0x").trim_start_matches("0X");
            u64::from_str_radix(t, 16).or_else(|_| s.parse()).map_err(|_| err(format!("bad pointer or stream {s:?}")))
        };
        let size: u64 = get(c_size)?.parse().map_err(|_| err(format!("bad size {:?}", f.get(c_size))))?;
        let (ptr, stream) = (hex(get(c_ptr)?)?, hex(get(c_stream)?)?);
        let action = get(c_action)?.to_ascii_lowercase();
        match action.as_str() {
            "allocate" => dt.push(Event::new(Action::Alloc, ptr, size, stream), 0, 0),
            "free" => {
                dt.push(Event::new(Action::FreeRequested, ptr, size, stream), 0, 0);
                dt.push(Event::new(Action::FreeCompleted, ptr, size, stream), 0, 0);
            }
            "allocate failure" | "allocate_failure" => dt.push(Event::new(Action::Oom, 0, size, stream), 0, 0),
            other => return Err(err(format!("unknown RMM action {other:?}"))),
        }
    }
    Ok(Trace { format: TraceFormat::RmmCsv, devices: vec![dt.into_trace(0)], ..Default::default() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gives its bytes a few thousand at a time, then ends or fails.
    struct Trickle {
        bytes: Vec<u8>,
        at: usize,
        fail: bool,
    }

    impl Read for Trickle {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            if self.at == self.bytes.len() {
                return if self.fail { Err(std::io::Error::other("the disk went away")) } else { Ok(0) };
            }
            let k = out.len().min(7_777).min(self.bytes.len() - self.at);
            out[..k].copy_from_slice(&self.bytes[self.at..self.at + k]);
            self.at += k;
            Ok(k)
        }
    }

    /// Read ahead on its thread, the bytes come in order across chunks
    /// filled again after use, and a failure comes after the bytes read
    /// before it.
    #[test]
    fn reading_ahead_gives_the_bytes_in_order_then_the_error() {
        let bytes: Vec<u8> = (0..3 * Prefetch::CHUNK + 12_345).map(|i| (i * 31 % 251) as u8).collect();
        for fail in [false, true] {
            let mut r = Prefetch::ahead(Trickle { bytes: bytes.clone(), at: 0, fail });
            let (mut got, mut buf) = (Vec::new(), vec![0u8; 100_000]);
            let end = loop {
                match r.read(&mut buf) {
                    Ok(0) => break Ok(()),
                    Ok(k) => got.extend_from_slice(&buf[..k]),
                    Err(e) => break Err(e.to_string()),
                }
            };
            assert!(got == bytes, "{} bytes of {}", got.len(), bytes.len());
            assert_eq!(end, if fail { Err("the disk went away".to_string()) } else { Ok(()) });
        }
    }
}
