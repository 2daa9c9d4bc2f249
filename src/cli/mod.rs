//! Command implementations behind `main`: argument types, the `replay`
//! command and the mapping of errors to exit codes (0 ok, 1 runtime failure
//! or a trace we do not reproduce, 2 bad usage or bad input).

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use clap::Args;
use thiserror::Error;

use crate::alloc::{AllocatorConfig, DeviceStats, Event, Kind};
use crate::analysis::human_bytes;
use crate::replay::model::ReplayModel;
use crate::replay::report;
use crate::replay::session::{Session, Start, Want};
use crate::replay::ReplayResult;
use crate::trace::{self, DeviceTrace, Trace};

mod diff;
mod fit;
mod live;
mod ranks;
mod replay;
mod run;
mod synth;
mod tune;
pub use diff::{diff, diff_app, DiffArgs};
pub use fit::{fit, FitArgs};
pub use live::{
    live, read_recording, read_recording_with, record, replay_recording, serve, LiveArgs, RecordArgs, ServeArgs,
    SourceKind, WatchArgs,
};
pub use ranks::ranks_app;
pub use run::{attach, run, snapshot, AttachArgs, RunArgs, SnapshotArgs};
pub use synth::{synth, SynthArgs};
pub use tune::{tune, TuneArgs};

// The device's figures live with the devices (`device`), for `fit` and
// the replay as for the command line.
pub use crate::device::{CUDA_CONTEXT_BYTES, DEFAULT_DEVICE_TOTAL};

/// Bad usage or bad input: exit code 2.
#[derive(Debug, Error)]
#[error("{0}")]
pub(crate) struct InputError(pub String);

/// Standard output for what a command prints as text or JSON: control
/// characters an input brought are escaped (docs/security.md).
pub(crate) fn text_out() -> trace::printable::Escaped<std::io::StdoutLock<'static>> {
    trace::printable::Escaped::new(std::io::stdout().lock())
}

/// Whether `e` is a write to a closed pipe (stdout piped to `head`).
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            || c.downcast_ref::<serde_json::Error>()
                .is_some_and(|j| j.io_error_kind() == Some(std::io::ErrorKind::BrokenPipe))
    })
}

pub fn exit_code(e: &anyhow::Error) -> u8 {
    if e.chain().any(|c| c.is::<InputError>() || c.is::<trace::TraceError>() || c.is::<crate::alloc::ConfigError>()) {
        2
    } else {
        1
    }
}

/// Where to look in a trace: an event index, the peak, the first OOM or the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum At {
    Event(usize),
    Peak,
    Oom,
    End,
}

impl std::str::FromStr for At {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "peak" => Ok(At::Peak),
            "oom" => Ok(At::Oom),
            "end" => Ok(At::End),
            _ => s.parse().map(At::Event).map_err(|_| format!("expected an event index, peak, oom or end, got {s:?}")),
        }
    }
}

/// `--torch VERSION`: whose caching allocator to follow.
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct TorchArg {
    /// The PyTorch release whose caching allocator to follow (2.11 to 2.15,
    /// e.g. 2.15 or 2.13.0); by default what the snapshot's fields say.
    #[arg(long = "torch", value_name = "VERSION", value_parser = parse_release)]
    pub(crate) release: Option<crate::alloc::Release>,
}

fn parse_release(s: &str) -> Result<crate::alloc::Release, String> {
    crate::alloc::Release::parse(s).map_err(|e| e.to_string())
}

/// PyTorch's per-process memory cap: a byte limit or a share of the device.
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct MemoryCap {
    /// Per-process memory limit (PyTorch's allowed_memory_maximum): bytes,
    /// or 16GiB / 16G (powers of 1024), 16GB (powers of 1000), 1.5e10.
    #[arg(long, value_name = "BYTES", value_parser = parse_capacity, conflicts_with = "memory_fraction")]
    pub(crate) memory_limit: Option<u64>,
    /// Per-process memory fraction of the device, as set_per_process_memory_fraction.
    #[arg(long, value_name = "F")]
    pub(crate) memory_fraction: Option<f64>,
}

impl MemoryCap {
    /// A fraction outside (0, 1] is bad input.
    pub(crate) fn check(&self) -> Result<()> {
        match self.memory_fraction {
            Some(f) if !(f > 0.0 && f <= 1.0) => {
                Err(anyhow!(InputError(format!("--memory-fraction must be in (0, 1], got {f}"))))
            }
            _ => Ok(()),
        }
    }

    /// The limit in bytes on a device of `total` bytes (a fraction of 1 is none).
    pub(crate) fn limit(&self, total: u64) -> Option<u64> {
        self.memory_limit.or(self.memory_fraction.filter(|f| *f < 1.0).map(|f| (f * total as f64) as u64))
    }
}

#[derive(Args, Debug, Clone)]
pub struct ReplayArgs {
    /// A PyTorch memory snapshot (.pickle, .pickle.gz), our JSONL trace, or an RMM log CSV.
    pub(crate) trace: PathBuf,
    /// More snapshots, one per rank of a job (`snapshot --job` writes
    /// them): each replayed alone, reported side by side (docs/ranks.md).
    #[arg(value_name = "MORE")]
    pub(crate) more: Vec<PathBuf>,
    /// Replay under this allocator config instead of the recorded one (PyTorch's
    /// PYTORCH_CUDA_ALLOC_CONF syntax, e.g. expandable_segments:True).
    #[arg(long, value_name = "CONF")]
    pub(crate) alloc_conf: Option<String>,
    #[command(flatten)]
    pub(crate) cap: MemoryCap,
    #[command(flatten)]
    pub(crate) torch: TorchArg,
    /// Also run the trace's requests under this config (repeatable) and compare.
    #[arg(long = "compare", value_name = "CONF")]
    pub(crate) compare: Vec<String>,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
    /// Write the replayed events as JSON lines to PATH (a new file; see
    /// --force).
    #[arg(long, value_name = "PATH")]
    pub(crate) dump_events: Option<PathBuf>,
    /// With --dump-events: replace an existing file (the path itself: a
    /// link there is removed, never followed).
    #[arg(long, requires = "dump_events")]
    pub(crate) force: bool,
    /// Report the state at this point: an event index, peak, oom or end.
    #[arg(long, value_name = "EVENT|peak|oom|end")]
    pub(crate) at: Option<At>,
    /// totalGlobalMem of the recorded device (sizes expandable-segment
    /// reservations and memory fractions).
    #[arg(long, value_name = "BYTES", value_parser = parse_capacity, default_value_t = DEFAULT_DEVICE_TOTAL)]
    pub(crate) device_total: u64,
    /// Which device of a multi-GPU snapshot to replay (default: the busiest).
    #[arg(long, value_name = "N")]
    pub(crate) device: Option<i32>,
    /// Most bytes a compressed input may unpack to (default: 64 times the
    /// file plus 256 MiB).
    #[arg(long, value_name = "BYTES", value_parser = parse_capacity)]
    pub(crate) max_unpacked: Option<u64>,
    /// Draw without colour (also when NO_COLOR is set).
    #[arg(long)]
    pub(crate) no_color: bool,
}

/// An input's bytes from the first: the head already read, then the rest.
pub(crate) type InputReader = std::io::BufReader<std::io::Chain<std::io::Cursor<Vec<u8>>, Box<dyn Read + Send>>>;

/// One input, opened and read once: a file, a FIFO, `<(…)` or `-` (stdin).
/// The first line is kept so the format can be told without reading again.
pub(crate) struct Input {
    name: String,
    head: Vec<u8>,
    rest: Box<dyn Read + Send>,
    /// The file's size (0 when unknown: a pipe).
    size: u64,
    /// A gzip file's unpacked size from its trailer (a hint), else 0.
    unpacked: u64,
    /// Bytes of the file read so far.
    read: Arc<AtomicU64>,
}

impl Input {
    pub fn open(path: &Path) -> Result<Input> {
        let bad = |e: std::io::Error| anyhow!(InputError(format!("{}: {e}", path.display())));
        let (name, raw, size, unpacked): (String, Box<dyn Read + Send>, u64, u64) = if path.as_os_str() == "-" {
            ("stdin".into(), Box::new(std::io::stdin()), 0, 0)
        } else {
            let mut f = std::fs::File::open(path).map_err(bad)?;
            let meta = f.metadata().map_err(bad)?;
            if meta.is_dir() {
                return Err(anyhow!(InputError(format!("{}: is a directory", path.display()))));
            }
            // Only a regular file can be measured and read twice.
            let (size, unpacked) =
                if meta.is_file() { (meta.len(), trace::gzip_unpacked_size(&mut f)) } else { (0, 0) };
            (path.display().to_string(), Box::new(f), size, unpacked)
        };
        let read = Arc::new(AtomicU64::new(0));
        let mut rest: Box<dyn Read + Send> = Box::new(trace::Counted { inner: raw, n: read.clone() });
        // The first line, or 4 KiB of it.
        let mut head = Vec::new();
        let mut byte = [0u8; 512];
        while head.len() < 4096 && !head.contains(&b'\n') {
            match rest.read(&mut byte) {
                Ok(0) => break,
                Ok(k) => head.extend_from_slice(&byte[..k]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(anyhow!(InputError(format!("{name}: {e}")))),
            }
        }
        Ok(Input { name, head, rest, size, unpacked, read })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the input is a `record` recording (JSON lines of samples),
    /// gzipped or not, after a byte order mark or blank lines.
    pub(crate) fn is_recording(&self) -> bool {
        let first = trace::first_line(&self.head);
        first.starts_with('{') && first.contains(live::RECORD_FORMAT)
    }

    /// The input as plain lines (gunzipped under the trace's unpacked-size
    /// cap), for a recording.
    pub(crate) fn lines(self, max_unpacked: Option<u64>) -> Result<Box<dyn std::io::BufRead + Send>> {
        let (name, read) = (self.name.clone(), self.read.clone());
        let limits = trace::ReadLimits { consumed: Some(read), max_unpacked };
        trace::plain(self.reader(), limits).map_err(|e| anyhow!(InputError(format!("{name}: {e}"))))
    }

    /// The whole input, from its first byte.
    pub(crate) fn reader(self) -> InputReader {
        std::io::BufReader::with_capacity(1 << 16, std::io::Cursor::new(self.head).chain(self.rest))
    }
}

/// Loads a trace; when that takes over a second and stderr is a terminal,
/// shows how much of the file has been read.
pub(crate) fn load_with_progress(path: &Path) -> Result<Trace> {
    load_input(Input::open(path)?, None)
}

/// Loads a trace from an input under the bounds of docs/input.md
/// (`max_unpacked`: `--max-unpacked`).
pub(crate) fn load_input(input: Input, max_unpacked: Option<u64>) -> Result<Trace> {
    load_with(input, max_unpacked, std::io::stderr().is_terminal())
}

/// `load_input` without the progress line (the terminal is a screen's).
fn load_quietly(input: Input, max_unpacked: Option<u64>) -> Result<Trace> {
    load_with(input, max_unpacked, false)
}

/// `load_input`, with a progress line on stderr after a second when `show`.
fn load_with(input: Input, max_unpacked: Option<u64>, show: bool) -> Result<Trace> {
    let (total, unpacked, n, name) = (input.size, input.unpacked, input.read.clone(), input.name.clone());
    let done = Arc::new(AtomicBool::new(false));
    let progress = show.then(|| {
        let (n, done, name) = (n.clone(), done.clone(), name.clone());
        std::thread::spawn(move || {
            let start = Instant::now();
            let mut shown = false;
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                if start.elapsed() >= Duration::from_secs(1) && !done.load(Ordering::Relaxed) {
                    let read = n.load(Ordering::Relaxed);
                    match (100 * read).checked_div(total) {
                        Some(pct) => eprint!("\rloading {name}: {pct}% "),
                        // A pipe or FIFO has no size to compare with.
                        None => eprint!("\rloading {name}: {} read ", human_bytes(read)),
                    }
                    shown = true;
                }
            }
            if shown {
                eprint!("\r\x1b[2K");
            }
        })
    });
    let limits = trace::ReadLimits { consumed: Some(n), max_unpacked };
    let out = trace::read_limited(input.reader(), unpacked, limits);
    done.store(true, Ordering::Relaxed);
    if let Some(h) = progress {
        let _ = h.join();
    }
    out.map_err(|e| anyhow!(e).context(name))
}

/// `--at EVENT` must name an event of the trace: the same rule for `replay`
/// and `export`.
fn check_at(at: Option<At>, dev: &DeviceTrace) -> Result<()> {
    match at {
        Some(At::Event(i)) if i >= dev.events.len() && !dev.events.is_empty() => Err(anyhow!(InputError(format!(
            "--at {i}: the trace has {} events (0 to {})",
            dev.events.len(),
            dev.events.len() - 1
        )))),
        _ => Ok(()),
    }
}

fn pick_device(t: &Trace, want: Option<i32>) -> Result<&DeviceTrace> {
    match want {
        Some(d) => t
            .devices
            .iter()
            .find(|x| x.device == d)
            .ok_or_else(|| anyhow!(InputError(format!("the trace has no device {d}")))),
        None => t.main_device().ok_or_else(|| anyhow!(InputError("the trace has no events and no segments".into()))),
    }
}

/// `torch.cuda.memory_stats()`: the 121 counters and, as PyTorch 2.11
/// adds, the config's `max_split_size` (-1 when unlimited).
pub(crate) fn stats_map(
    s: &DeviceStats,
    conf: &AllocatorConfig,
    release: crate::alloc::Release,
) -> std::collections::BTreeMap<String, i64> {
    let mut m: std::collections::BTreeMap<String, i64> = s.flat_for(release).into_iter().collect();
    let mss = conf.max_split_size;
    m.insert("max_split_size".into(), if mss == crate::alloc::config::UNLIMITED { -1 } else { mss as i64 });
    m
}

/// The index of the first `oom` event.
fn oom_index(events: &[Event]) -> Option<usize> {
    events.iter().position(|e| e.action == crate::alloc::Action::Oom)
}

/// How a trace is named on screens and in reports: its file name, or for
/// a pipe (`<(zcat x)` is `/dev/fd/63`) or `-`, "(pipe)" / "(stdin)"
/// rather than a number.
/// Colour on a screen: not with `--no-color`, nor under NO_COLOR (set and not empty).
pub(crate) fn color(no_color: bool) -> bool {
    !no_color && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

pub(crate) fn trace_name(path: &Path) -> String {
    let s = path.to_string_lossy();
    if s == "-" {
        return "(stdin)".into();
    }
    if s.starts_with("/dev/fd/") || s.starts_with("/proc/self/fd/") {
        return "(pipe)".into();
    }
    path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_else(|| s.into_owned())
}

/// A size flag's value: bytes (`9006592819`, `1.5e10`), or with a unit:
/// `K`/`KiB`, `M`/`MiB`, `G`/`GiB`, `T`/`TiB` are powers of 1024; `KB`,
/// `MB`, `GB`, `TB` powers of 1000 (case-insensitive, a space allowed).
/// `parse_size` for a capacity (a memory limit, a device's total, an
/// unpacked-size cap): 0 bytes holds nothing, so it is refused rather than
/// answered with every request an OOM.
pub(crate) fn parse_capacity(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        0 => Err(format!("{s:?}: a capacity of 0 bytes holds nothing; give the size in bytes (e.g. 16GiB)")),
        n => Ok(n),
    }
}

pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E').unwrap_or(t.len());
    let (num, unit) = (t[..split].trim(), t[split..].trim().to_ascii_lowercase());
    let scale: f64 = match unit.as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => {
            return Err(format!(
            "{s:?}: unknown unit {unit:?} (bytes, or K/M/G/T[iB] for powers of 1024, KB/MB/GB/TB for powers of 1000)"
        ))
        }
    };
    let v: f64 = num.parse().map_err(|_| format!("{s:?} is not a size (e.g. 9006592819, 8GiB, 8G, 8GB, 1.5e10)"))?;
    let bytes = v * scale;
    if !bytes.is_finite() || !(0.0..1.8e19).contains(&bytes) {
        return Err(format!("{s:?} is not a size in bytes"));
    }
    Ok(bytes.round() as u64)
}

fn parse_conf(s: &str) -> Result<AllocatorConfig> {
    AllocatorConfig::parse(s).map_err(|e| anyhow!(InputError(e.to_string())))
}

/// A screen another asks to open over itself: a snapshot's replay (the
/// live view's `S`, a rank's Enter), built quietly (the terminal is the
/// screens'); what it says as it closes is its fidelity and events, and
/// what tuning found. An error is the status line's.
pub fn open_screen(
    what: crate::ui::event::Open,
    color: bool,
) -> std::result::Result<Box<dyn crate::ui::event::Interactive>, String> {
    let crate::ui::event::Open::Replay(path) = what;
    let input = Input::open(&path).map_err(|e| format!(" {e:#}"))?;
    let trace = load_quietly(input, None).map_err(|e| format!(" {e:#}"))?;
    let opened = crate::ui::app::OpenedReplay::new(trace, |trace| open_replay(&path, trace, color));
    match opened {
        Ok(screen) => Ok(Box::new(screen)),
        Err(e) => Err(format!(" {e:#}")),
    }
}

/// The replay app over `trace` (read from `path`), and what it tells the
/// screen under it on closing.
fn open_replay<'t>(
    path: &Path,
    trace: &'t Trace,
    color: bool,
) -> Result<(crate::ui::app::ReplayApp<'t>, crate::ui::event::Closed)> {
    let dev = pick_device(trace, None)?;
    let want = Want::recorded(trace, DEFAULT_DEVICE_TOTAL);
    let mut session = Session::open(dev, &trace.stacks, &want)
        .map_err(|e| anyhow!(InputError(format!("{}: {e}", path.display()))))?;
    let fidelity = session.fidelity;
    if !fidelity.is_faithful() {
        return Err(anyhow!(
            "{}: replay is {} here; `gpumem-top replay` on it says why",
            path.display(),
            fidelity.name()
        ));
    }
    // What the live view's alerts quote from now on, instead of a hint no
    // replay checked (docs/tune.md).
    let tuned = (session.start != Start::StateOnly).then(|| {
        let conf = &want.config.source;
        crate::tune::verdict(&crate::tune::search_session(
            &mut session,
            conf,
            DEFAULT_DEVICE_TOTAL,
            CUDA_CONTEXT_BYTES,
            None,
        ))
    });
    let model = ReplayModel::open(&session, dev, &trace.stacks, &trace.annotations, trace_name(path))
        .map_err(|d| anyhow!("{}: replay diverged at {d}", path.display()))?;
    let mut note = format!(" {} ({}, {} events) closed", path.display(), fidelity.name(), dev.events.len());
    if let Some(t) = &tuned {
        note.push_str(&format!("; {t}"));
    }
    Ok((crate::ui::app::ReplayApp::new(model, color), crate::ui::event::Closed { note, tuned }))
}

pub fn replay(args: &ReplayArgs) -> Result<ExitCode> {
    if !args.more.is_empty() {
        return ranks::replay_ranks(args);
    }
    replay::replay_to(args, &mut text_out(), true)
}

/// "would run out of memory at event N (request X at file:line)".
fn new_oom_text(o: &report::NewOomReport, dev: &DeviceTrace) -> String {
    let t0 = dev.time_us.first().copied().unwrap_or(0);
    let when = dev.time_us.get(o.event).map(|t| format!(", {:.3} s in", (t - t0) as f64 / 1e6)).unwrap_or_default();
    let site = match (&o.call_site, &o.script_site) {
        (c, _) if c.is_empty() => "a place no Python frame was recorded for".to_string(),
        (c, Some(s)) => format!("{c}, called from {s}"),
        (c, None) => c.clone(),
    };
    let more = match o.failing_allocations {
        0 | 1 => String::new(),
        n => format!("; {} more allocations after it would fail too, if the program went on", n - 1),
    };
    format!(
        "would run out of memory at event {} of {}{when}: a request of {} on stream {} at {site}{more}",
        o.event,
        dev.events.len(),
        human_bytes(o.requested_bytes),
        o.stream
    )
}

/// Counters a replay cannot know from the trace alone, by kind of start.
fn not_in_trace(start: Start) -> Vec<&'static str> {
    match start {
        // An empty_cache() that frees nothing leaves no trace entry, nor does
        // a CUDA-graph capture's own empty_cache (docs/replay.md).
        // A request throw_on_cudamalloc_oom refuses (2.12+) leaves none either.
        Start::ProcessStart => vec!["num_sync_all_streams", "num_oom_rejections"],
        Start::Window | Start::StateOnly => {
            vec![
                "num_sync_all_streams",
                "num_oom_rejections",
                "peaks",
                "allocated/freed totals",
                "num_alloc_retries",
                "num_ooms",
                "num_device_alloc",
                "num_device_free",
            ]
        }
    }
}

fn at_text(at: At, exact: Option<&ReplayResult>, dev: &DeviceTrace) -> String {
    let Some(r) = exact else { return "--at needs a trace with segment events".into() };
    match at {
        At::Peak => format!(
            "at the peak: event {} of {}, allocated {}, reserved {}: the table above is the state there",
            r.peak.event,
            dev.events.len(),
            human_bytes(r.peak.allocated),
            human_bytes(r.peak.reserved)
        ),
        At::Oom => match oom_index(&r.events) {
            Some(i) => format!(
                "first OOM: event {i}, request of {} (rounded): the table above is the state there",
                human_bytes(r.events[i].size)
            ),
            None => "the trace has no OOM".into(),
        },
        // Events are numbered from 0, as everywhere (the screen, --json, --at N).
        At::End => format!(
            "at the end: event {} (the last of {} events, numbered from 0)",
            dev.events.len().saturating_sub(1),
            dev.events.len()
        ),
        // One malloc makes a request's segment events and its allocation
        // together: the allocator never rests between them, so a stop on
        // such a segment event shows the state after its request, and says so.
        At::Event(i) => match r.reproduced.checked_sub(1).filter(|&last| last > i) {
            Some(last) => format!(
                "stopped after event {last}: event {i} ({}) is made by the same malloc as event {last}, and the allocator rests only after both; the table above is the state there",
                dev.events.get(i).map_or("", |e| e.action.name())
            ),
            None => format!("stopped after event {i}: the table above is the state there"),
        },
    }
}

/// One row per pool; `state_only`: a snapshot without history has no peaks
/// or totals, and shows none ("-").
fn stat_line(out: &mut String, label: &str, s: &DeviceStats, kind: Kind, bytes: bool, state_only: bool) {
    let f = |v: i64| if bytes { human_bytes(v.max(0) as u64) } else { v.to_string() };
    let h = |v: i64| if state_only { "-".to_string() } else { f(v) };
    for (pool, name) in
        [(0, label.to_string()), (2, "      from large pool".into()), (1, "      from small pool".into())]
    {
        let st = s.get(kind, pool);
        out.push_str(&format!(
            "| {:<24}| {:>11} | {:>11} | {:>11} | {:>11} |\n",
            name,
            f(st.current),
            h(st.peak),
            h(st.allocated),
            h(st.freed)
        ));
    }
}

#[derive(Args, Debug, Clone)]
pub struct ExportArgs {
    /// A PyTorch memory snapshot that replays exactly (.pickle, .pickle.gz).
    pub(crate) trace: PathBuf,
    #[command(flatten)]
    pub(crate) torch: TorchArg,
    #[arg(long, value_enum)]
    pub(crate) view: crate::export::picture::ViewKind,
    /// The moment shown: an event index, peak (default), oom or end.
    #[arg(long, value_name = "EVENT|peak|oom|end")]
    pub(crate) at: Option<At>,
    #[arg(long, value_enum)]
    pub(crate) format: crate::export::picture::Format,
    /// Where to write (default: TRACE-VIEW-AT.FORMAT here; `-`: stdout).
    #[arg(short = 'o', long = "output", value_name = "PATH")]
    pub(crate) output: Option<PathBuf>,
    /// Picture width in pixels (SVG and PNG; text gets a column per 10).
    #[arg(long, value_name = "PX", default_value_t = 1600)]
    pub(crate) width: u32,
    /// Text without ANSI colours.
    #[arg(long)]
    pub(crate) plain: bool,
    /// Colour the map (and the text timeline) by block state, or by what the
    /// memory is (docs/categories.md); the allocated bar is split by
    /// category either way.
    #[arg(long, value_enum, default_value = "state")]
    pub(crate) by: ColorBy,
    /// Replace an existing file at the output path (the path itself: a link
    /// there is removed, never followed); without it an existing path is
    /// refused.
    #[arg(long)]
    pub(crate) force: bool,
    /// Per-process memory limit in bytes (as the run had it).
    #[arg(long, value_name = "BYTES", value_parser = parse_capacity)]
    pub(crate) memory_limit: Option<u64>,
    /// Which device of a multi-GPU snapshot (default: the busiest).
    #[arg(long, value_name = "N")]
    pub(crate) device: Option<i32>,
    /// Most bytes a compressed input may unpack to (default: 64 times the
    /// file plus 256 MiB).
    #[arg(long, value_name = "BYTES", value_parser = parse_capacity)]
    pub(crate) max_unpacked: Option<u64>,
    /// With a recording: the process drawn (default: the one that reserved
    /// the most); `--at N` is then sample N as its screen numbers them (1
    /// the first).
    #[arg(long, value_name = "PID")]
    pub(crate) pid: Option<u32>,
}

/// What the map's colours say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ColorBy {
    /// Allocated, rounding, pending free, free.
    State,
    /// Parameter, gradient, optimizer state, activation, input, temporary.
    Category,
}

/// `export`: one view of a trace at one moment, as SVG, PNG or text.
pub fn export(args: &ExportArgs) -> Result<ExitCode> {
    if !(400..=8000).contains(&args.width) {
        return Err(anyhow!(InputError(format!("--width must be 400..8000 pixels, got {}", args.width))));
    }
    let input = Input::open(&args.trace)?;
    if input.is_recording() {
        let name = input.name().to_string();
        let snaps = read_recording(input.lines(args.max_unpacked)?, &name)?;
        return export_recording(args, snaps);
    }
    if args.pid.is_some() {
        return Err(anyhow!(InputError(format!(
            "--pid picks a process of a recording; {} is a trace of one process",
            args.trace.display()
        ))));
    }
    let trace = load_input(input, args.max_unpacked)?;
    let dev = pick_device(&trace, args.device)?;
    check_at(args.at, dev)?;
    let conf = trace.settings.as_ref().map(|s| s.config()).unwrap_or_default();
    let want = Want {
        config: conf,
        memory_limit: args.memory_limit,
        release: crate::replay::session::ReleaseAsk::of(&trace, args.torch.release),
        ..Want::recorded(&trace, DEFAULT_DEVICE_TOTAL)
    };
    let session = Session::open(dev, &trace.stacks, &want)
        .map_err(|e| anyhow!(InputError(format!("{}: {e}", args.trace.display()))))?;
    if !session.fidelity.is_faithful() {
        let why = session.divergence().map(|d| d.to_string()).unwrap_or_default();
        return Err(anyhow!("{}: replay diverged at {why}", args.trace.display()));
    }
    // A snapshot without history has no timeline: an empty chart would
    // say nothing (#37 item 9).
    if session.start == Start::StateOnly && args.view == crate::export::picture::ViewKind::Timeline {
        return Err(anyhow!(InputError(format!(
            "{}: the snapshot has no timeline (it was taken without memory history, so it holds its state only); export --view fragmap or bars, or record with torch.cuda.memory._record_memory_history",
            args.trace.display()
        ))));
    }
    let name = trace_name(&args.trace);
    let mut model = ReplayModel::open(&session, dev, &trace.stacks, &trace.annotations, name.clone())
        .map_err(|d| anyhow!("{}: replay diverged at {d}", args.trace.display()))?;
    let last = dev.events.len().saturating_sub(1);
    let at = args.at.unwrap_or(At::Peak);
    let cursor = match at {
        At::Event(i) => i.min(last),
        At::End => last,
        At::Oom => oom_index(&dev.events)
            .ok_or_else(|| anyhow!(InputError(format!("--at oom: {} has no OOM", args.trace.display()))))?,
        At::Peak => model.peak_at.unwrap_or(0),
    };
    let bytes = crate::export::replay::picture(
        &mut model,
        cursor,
        args.view,
        args.format,
        args.width,
        args.plain,
        args.by == ColorBy::Category,
    )
    .map_err(|e| anyhow!(e))?;
    write_export(args, &bytes, &format!("{cursor}"), &format!("event {cursor}"))
}

/// Writes an export to `-o` (`-`: stdout), else to
/// `STEM-VIEW-WHERE.FORMAT` here, STEM the letters, digits, '_' and '-' of
/// the input's name before its first dot ("(pipe)": "pipe"); never over an
/// existing file without `--force`.
fn write_export(args: &ExportArgs, bytes: &[u8], place: &str, said: &str) -> Result<ExitCode> {
    use crate::export::picture::Format;
    let ext = match args.format {
        Format::Svg => "svg",
        Format::Png => "png",
        Format::Txt => "txt",
    };
    let view = format!("{:?}", args.view).to_lowercase();
    let stem: String = trace_name(&args.trace)
        .split('.')
        .next()
        .unwrap_or("")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .collect();
    let stem = if stem.is_empty() { "trace".to_string() } else { stem };
    let out = args.output.clone().unwrap_or_else(|| PathBuf::from(format!("{stem}-{view}-{place}.{ext}")));
    // `x.svg` holding PNG bytes opens nowhere: a known picture extension
    // must agree with the format.
    let named = out.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    if let Some(named) = named.filter(|n| ["svg", "png", "txt"].contains(&n.as_str()) && n != ext) {
        return Err(anyhow!(InputError(format!(
            "{}: the name says {named} but --format is {ext}; name it .{ext} or pass --format {named}",
            out.display()
        ))));
    }
    if out.as_os_str() == "-" {
        // The text export's own colours are escapes; what an input brought
        // into its cells was dropped when they were drawn (view::set_line).
        std::io::stdout().lock().write_all(bytes)?;
    } else {
        crate::private::write_report(&out, bytes, args.force)
            .map_err(|e| anyhow!(InputError(format!("{}: {e}", out.display()))))?;
        eprintln!("gpumem-top: wrote {} ({} bytes, {said})", out.display(), bytes.len());
    }
    Ok(ExitCode::SUCCESS)
}

/// `export RECORDING`: one process of a recording at one sample, drawn as
/// the live view drew it (docs/live.md "Recordings").
fn export_recording(args: &ExportArgs, snaps: Vec<crate::monitor::Snapshot>) -> Result<ExitCode> {
    use crate::export::picture::Format;
    let bad = |m: String| anyhow!(InputError(format!("{}: {m}", args.trace.display())));
    let mut full = crate::monitor::model::LiveModel::default();
    for s in &snaps {
        full.ingest(s.clone());
    }
    let key = match args.pid {
        Some(pid) => full.procs.keys().copied().find(|k| k.1 == pid).ok_or_else(|| {
            let pids: Vec<String> = full.procs.keys().map(|k| k.1.to_string()).collect();
            bad(format!("no process {pid} in the recording (it has: {})", pids.join(", ")))
        })?,
        None => full
            .procs
            .iter()
            .max_by_key(|(k, h)| (h.last.peak_reserved(), std::cmp::Reverse(**k)))
            .map(|(k, _)| *k)
            .ok_or_else(|| bad("no process published its allocator state in the recording".into()))?,
    };
    let (dev, pid) = key;
    let of = |i: usize| snaps.get(i).and_then(|s| s.publisher(dev, pid));
    let seen: Vec<usize> = (0..snaps.len()).filter(|&i| of(i).is_some()).collect();
    let (first, last) = match (seen.first(), seen.last()) {
        (Some(&f), Some(&l)) => (f, l),
        _ => return Err(bad(format!("pid {pid} published nothing"))),
    };
    let h = &full.procs[&key];
    let sample = match args.at.unwrap_or(At::Peak) {
        At::Event(n) if (1..=snaps.len()).contains(&n) => n - 1,
        At::Event(n) => {
            return Err(bad(format!(
                "--at {n}: the recording has samples 1 to {} (as its screen numbers them)",
                snaps.len()
            )))
        }
        At::End => last,
        // The first sample that shows the timeline's peak (a step's own
        // peak falls between samples), as `p` on the screen.
        At::Peak => h
            .peak_time()
            .and_then(|t| seen.iter().copied().find(|&i| of(i).is_some_and(|p| p.time >= t)))
            .unwrap_or(last),
        At::Oom => {
            let ooms = |i: usize| of(i).map_or(0, |p| p.stat("num_ooms"));
            seen.iter()
                .copied()
                .find(|&i| i > first && ooms(i) > ooms(first))
                .or((ooms(first) > 0).then_some(first))
                .ok_or_else(|| bad(format!("--at oom: pid {pid} had no OOM")))?
        }
    };
    let n = snaps.len();
    let model = full.as_of(&snaps, sample);
    let Some(hist) = model.procs.get(&key) else {
        return Err(bad(format!("pid {pid} had not published by sample {}", sample + 1)));
    };
    let note = format!(" · sample {} of {}", sample + 1, snaps.len());

    let bytes = match args.format {
        Format::Svg => crate::export::live::process_svg(hist, &hist.last, args.view, args.width, &note).into_bytes(),
        Format::Png => crate::export::picture::png(&crate::export::live::process_svg(
            hist, &hist.last, args.view, args.width, &note,
        ))
        .map_err(|e| anyhow!(e))?,
        Format::Txt => {
            // The live view's screen at that sample, as the terminal shows it.
            let mut app = crate::ui::live::LiveApp::of_recording(&trace_name(&args.trace), snaps, !args.plain);
            app.show_process(sample, dev, pid);
            let cols = (args.width / 10).clamp(80, 800) as u16;
            let mut buf = ratatui_core::buffer::Buffer::empty(ratatui_core::layout::Rect::new(0, 0, cols, 50));
            let area = buf.area;
            crate::ui::event::Interactive::draw_into(&app, area, &mut buf);
            crate::export::text::from_buffer(&buf, !args.plain).into_bytes()
        }
    };
    write_export(
        args,
        &bytes,
        &format!("pid{pid}-sample{}", sample + 1),
        &format!("pid {pid}, sample {} of {n}", sample + 1),
    )
}

#[cfg(test)]
mod size_tests {
    use super::parse_size;

    /// Every size flag takes units and exponents (`--memory-limit 8GB`,
    /// `8.39GiB`, `9e9`), and says what a unit it does not know is.
    #[test]
    fn sizes_take_units_and_exponents() {
        assert_eq!(parse_size("9006592819"), Ok(9_006_592_819));
        assert_eq!(parse_size("16GiB"), Ok(16 << 30));
        assert_eq!(parse_size("16G"), Ok(16 << 30));
        assert_eq!(parse_size("16 gb"), Ok(16_000_000_000));
        assert_eq!(parse_size("8.39GiB"), Ok((8.39 * (1u64 << 30) as f64).round() as u64));
        assert_eq!(parse_size("1.5e10"), Ok(15_000_000_000));
        assert_eq!(parse_size("9e9"), Ok(9_000_000_000));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert!(parse_size("8 parsecs").unwrap_err().contains("unknown unit"));
        assert!(parse_size("-1").is_err());
        assert!(parse_size("1e30").is_err());
    }
}
