//! The live modes: the TUI beside training (`gpumem-top`), `--json`,
//! `record` and `serve`.

use std::io::{IsTerminal, Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use clap::{Args, ValueEnum};
use serde_json::{json, Value};

use super::InputError;
use crate::monitor::alerts::{alerts, Alert, Thresholds};
use crate::monitor::sampler::{DemoSource, LiveSource, Sampler, Source};
use crate::monitor::{publisher, GpuQuery, NvmlQuery, Snapshot};

#[derive(Args, Debug, Clone, Default)]
pub struct LiveArgs {
    /// GPU index to watch (repeatable; default: all).
    #[arg(long = "device", value_name = "N")]
    pub devices: Vec<u32>,
    /// Sampling interval in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 500)]
    pub interval: u64,
    /// Directory where PyTorch processes publish their allocator state
    /// (default: $GPUMEM_TOP_DIR, $XDG_RUNTIME_DIR/gpumem-top or /tmp/gpumem-top-UID).
    #[arg(long, value_name = "DIR")]
    pub publish_dir: Option<PathBuf>,
    /// Draw without colour (also when NO_COLOR is set).
    #[arg(long)]
    pub no_color: bool,
    /// Print every GPU and process once as JSON, like `gpustat --json`.
    #[arg(long)]
    pub json: bool,
    /// Where samples come from: NVML and the publisher directory, or the
    /// simulated device running the demo's training loop.
    #[arg(long, value_enum, default_value_t = SourceKind::Live)]
    pub source: SourceKind,
    /// Alert when a GPU's used memory is over this share (0-1).
    #[arg(long, value_name = "F", default_value_t = 0.9)]
    pub alert_usage: f64,
    /// Alert when allocated at step end grows this many steps in a row.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub alert_leak_steps: usize,
    /// Alert when reserved-but-unallocated is over this share of reserved (0-1).
    #[arg(long, value_name = "F", default_value_t = 0.5)]
    pub alert_fragmentation: f64,
}

impl LiveArgs {
    fn thresholds(&self) -> Result<Thresholds> {
        for (name, v) in [("--alert-usage", self.alert_usage), ("--alert-fragmentation", self.alert_fragmentation)] {
            if !(0.0..=1.0).contains(&v) {
                return Err(anyhow!(InputError(format!("{name} must be in [0, 1], got {v}"))));
            }
        }
        Ok(Thresholds {
            device_usage: self.alert_usage,
            leak_steps: self.alert_leak_steps,
            fragmentation: self.alert_fragmentation,
            ..Default::default()
        })
    }
    fn interval(&self) -> Result<Duration> {
        if !(10..=3_600_000).contains(&self.interval) {
            return Err(anyhow!(InputError(format!("--interval must be 10..3600000 ms, got {}", self.interval))));
        }
        Ok(Duration::from_millis(self.interval))
    }
    fn dir(&self) -> PathBuf {
        self.publish_dir.clone().unwrap_or_else(publisher::default_dir)
    }
}

/// Where samples come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum SourceKind {
    /// NVML and the publisher directory.
    #[default]
    Live,
    /// The simulated device running the demo's training loop.
    Demo,
}

/// NVML with at least one GPU, and the `--device` indices valid; `Ok(None)`
/// when there is none and no device was asked for (the caller falls back to
/// the simulated device).
pub fn open_nvml(devices: &[u32]) -> Result<Option<NvmlQuery>> {
    let opened = NvmlQuery::open().and_then(|mut q| q.device_count().map(|n| (q, n)));
    match opened {
        Ok((q, n)) if n > 0 => {
            if let Some(d) = devices.iter().find(|&&d| d >= n) {
                return Err(anyhow!(InputError(format!("--device {d}: this machine has {n} GPU(s) (0..{})", n - 1))));
            }
            Ok(Some(q))
        }
        Ok(_) if devices.is_empty() => Ok(None),
        Err(_) if devices.is_empty() => Ok(None),
        Ok(_) => Err(anyhow!(InputError(format!("--device {}: NVML lists no GPU", devices[0])))),
        Err(e) => Err(anyhow!(InputError(format!("--device {}: {e}", devices[0])))),
    }
}

/// The JSON of one snapshot: every GPU and process, the publishers'
/// allocator figures, what was ignored, the alerts.
pub fn snapshot_json(snap: &Snapshot, alerts: &[Alert], source: &str) -> Value {
    let pubs: Vec<Value> = snap
        .publishers
        .iter()
        .map(|p| {
            let f = p.fragmentation();
            json!({
                "pid": p.pid, "gpu": p.device, "cuda_device": p.cuda_device, "uuid": p.uuid, "command": p.command, "time": p.time,
                "allocated_bytes": p.allocated(), "reserved_bytes": p.reserved(),
                "allocated_peak_bytes": p.stat("allocated_bytes.all.peak"),
                "reserved_peak_bytes": p.stat("reserved_bytes.all.peak"),
                "num_ooms": p.stat("num_ooms"), "num_alloc_retries": p.stat("num_alloc_retries"),
                "segments": p.segments.len(),
                "fragmentation": {
                    "reserved_unallocated_bytes": f.reserved_unallocated_bytes,
                    "inactive_split_bytes": f.inactive_split_bytes,
                    "external_fragmentation": (f.external_fragmentation * 1e4).round() / 1e4,
                    "rounding_waste_bytes": f.rounding_waste_bytes,
                },
            })
        })
        .collect();
    json!({
        "source": source,
        "time": snap.time,
        "gpus": snap.gpus,
        "publishers": pubs,
        "ignored": snap.skipped,
        "gone": snap.gone,
        "alerts": alerts,
    })
}

fn live_source(args: &LiveArgs) -> Result<Option<Box<dyn Source>>> {
    let Some(q) = open_nvml(&args.devices)? else { return Ok(None) };
    let dir = args.dir();
    // Publishers create it too; make it ours and private if it is missing.
    let _ = publisher::ensure_dir(&dir);
    Ok(Some(Box::new(LiveSource::new(Box::new(q), args.devices.clone(), Some(dir)))))
}

/// `gpumem-top [live]`: the TUI, or `--json` once. Without NVML or a GPU it
/// opens the simulated device under `banner` (unless a device was named).
pub fn live(args: &LiveArgs, no_gpu_banner: &str) -> Result<ExitCode> {
    let thresholds = args.thresholds()?;
    let interval = args.interval()?;
    let source = match args.source {
        SourceKind::Live => live_source(args)?,
        SourceKind::Demo => Some(Box::new(DemoSource::new(42)) as Box<dyn Source>),
    };
    if args.json {
        let (mut src, name): (Box<dyn Source>, &str) = match source {
            Some(s) => (s, if args.source == SourceKind::Demo { "simulated device" } else { "nvml" }),
            None => {
                let mut d = DemoSource::new(42);
                d.advance(3000);
                (Box::new(d), "simulated device (no NVIDIA GPU found)")
            }
        };
        let snap = src.snapshot();
        let a = alerts(&snap, &thresholds);
        let mut so = std::io::stdout().lock();
        serde_json::to_writer(&mut so, &snapshot_json(&snap, &a, name))?;
        writeln!(so)?;
        return Ok(ExitCode::SUCCESS);
    }
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        return Err(anyhow!(InputError(
            "the interactive view needs a terminal (for scripts: `gpumem-top --json`, `record`, `serve`)".into()
        )));
    }
    let color = !args.no_color && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let Some(src) = source else {
        let mut app = crate::ui::app::DemoApp::demo(42, no_gpu_banner.to_string(), color);
        crate::ui::app::run_app(&mut app).map_err(|e| anyhow!("terminal: {e}"))?;
        return Ok(ExitCode::SUCCESS);
    };
    one_malloc_arena();
    // The sampler wakes the UI through a socket pair when a snapshot is sent.
    let (wake_rx, wake_tx) = match std::os::unix::net::UnixStream::pair() {
        Ok((a, b)) if a.set_nonblocking(true).is_ok() && b.set_nonblocking(true).is_ok() => (Some(a), Some(b)),
        _ => (None, None),
    };
    let mut sampler = Sampler::spawn_waking(src, interval, wake_tx);
    let (name, banner) = match args.source {
        SourceKind::Live => ("live (NVML)", None),
        SourceKind::Demo => ("simulated device", Some("demo source: simulated device".to_string())),
    };
    let mut app = crate::ui::live::LiveApp::new(name.into(), banner, color);
    app.thresholds = thresholds;
    app.feed = sampler.take_feed();
    app.waker = wake_rx;
    crate::ui::app::run_app(&mut app).map_err(|e| anyhow!("terminal: {e}"))?;
    Ok(ExitCode::SUCCESS)
}

/// A monitor runs for days beside training, so its heap stays small: one
/// malloc arena (the sampler thread would otherwise hold a second heap), and
/// a fixed mmap threshold so large buffers go back to the system when freed
/// instead of raising the threshold and staying in the heap.
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn mallopt(param: i32, value: i32) -> i32;
        }
        const M_ARENA_MAX: i32 = -8;
        const M_MMAP_THRESHOLD: i32 = -3;
        // SAFETY: glibc's mallopt, called before the sampler thread exists.
        unsafe {
            mallopt(M_ARENA_MAX, 1);
            mallopt(M_MMAP_THRESHOLD, 64 << 10);
        }
    }
}

fn source_for(kind: SourceKind, args: &LiveArgs) -> Result<(Box<dyn Source>, &'static str)> {
    match kind {
        SourceKind::Demo => Ok((Box::new(DemoSource::new(42)), "simulated device")),
        SourceKind::Live => match live_source(args)? {
            Some(s) => Ok((s, "nvml")),
            None => Err(anyhow!(InputError(
                "no NVIDIA GPU or NVML library found (use --source demo for the simulated device)".into()
            ))),
        },
    }
}

#[derive(Args, Debug, Clone)]
pub struct RecordArgs {
    #[command(flatten)]
    pub live: LiveArgs,
    /// The JSON-lines file to write (one snapshot per line after a header).
    #[arg(short = 'o', long = "output", value_name = "PATH.jsonl")]
    pub output: PathBuf,
    /// Stop after this many samples (default: until Ctrl-C or SIGTERM).
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// Replace an existing file (the path itself: a symbolic link there is
    /// removed, never followed).
    #[arg(long, conflicts_with = "append")]
    pub force: bool,
    /// Add samples to an existing recording.
    #[arg(long)]
    pub append: bool,
}

/// Opens `record`'s output: a new file, never through a symbolic link;
/// an existing path only with `--force` (replaced) or `--append` (a
/// recording, added to). Returns the file and whether it needs a header.
fn open_recording(args: &RecordArgs) -> Result<(std::fs::File, bool)> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = &args.output;
    let bad = |e: std::io::Error| anyhow!(InputError(format!("{}: {e}", path.display())));
    if args.append {
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(bad)?;
        if !f.metadata().map_err(bad)?.is_file() {
            return Err(anyhow!(InputError(format!("{}: not a regular file", path.display()))));
        }
        let mut head = [0u8; 256];
        let n = f.read(&mut head).map_err(bad)?;
        if n == 0 {
            return Ok((f, true));
        }
        if !String::from_utf8_lossy(&head[..n]).contains(RECORD_FORMAT) {
            return Err(anyhow!(InputError(format!(
                "{}: not a gpumem-top recording; --append adds only to one",
                path.display()
            ))));
        }
        return Ok((f, false));
    }
    if args.force {
        // Only a file or a link is replaced: never a directory, a device
        // (`-o /dev/null --force` as root), a FIFO or a socket.
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.is_file() || m.file_type().is_symlink() => std::fs::remove_file(path).map_err(bad)?,
            Ok(_) => {
                return Err(anyhow!(InputError(format!(
                    "{}: not a regular file; --force replaces only files and links",
                    path.display()
                ))))
            }
            Err(_) => {}
        }
    }
    // O_CREAT|O_EXCL: fails on any existing path, a symbolic link included.
    match std::fs::OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(f) => Ok((f, true)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(anyhow!(InputError(format!(
            "{}: already exists; --force replaces it, --append adds to a recording",
            path.display()
        )))),
        Err(e) => Err(bad(e)),
    }
}

/// `record`: headless sampling into JSON lines that `replay` shows later.
pub fn record(args: &RecordArgs) -> Result<ExitCode> {
    let thresholds = args.live.thresholds()?;
    let interval = args.live.interval()?;
    let (src, name) = source_for(args.live.source, &args.live)?;
    let (mut file, header) = open_recording(args)?;
    let out = args.output.display().to_string();
    // Each line goes out in one write, so a kill leaves whole lines (and a
    // full disk at most one cut line, which `replay` drops with a warning).
    let put = |file: &mut std::fs::File, v: &Value| -> Result<()> {
        let mut line = serde_json::to_vec(v)?;
        line.push(b'\n');
        file.write_all(&line).with_context(|| format!("writing {out}"))
    };
    if header {
        put(
            &mut file,
            &json!({"format": RECORD_FORMAT, "version": 1, "source": name, "interval_ms": args.live.interval}),
        )?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let sampler = Sampler::spawn(src, interval);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) && args.count.is_none_or(|c| n < c) {
        let Ok(snap) = sampler.rx.recv_timeout(Duration::from_millis(100)) else { continue };
        let a = alerts(&snap, &thresholds);
        put(&mut file, &record_line(&snap, &a))?;
        n += 1;
    }
    eprintln!("gpumem-top: recorded {n} samples to {}", args.output.display());
    Ok(ExitCode::SUCCESS)
}

/// The first line's `format` of a recording.
pub const RECORD_FORMAT: &str = "gpumem-top-record";

/// One recorded sample: the snapshot JSON plus each publisher's full
/// stats and layout (so `replay` can draw the fragmentation map).
fn record_line(snap: &Snapshot, a: &[Alert]) -> Value {
    let mut v = snapshot_json(snap, a, "");
    let full: Vec<Value> = snap
        .publishers
        .iter()
        .map(|p| {
            json!({
                "version": 1, "pid": p.pid, "nspid": p.nspid, "device": p.device, "uuid": p.uuid, "time": p.time,
                "interval": p.interval, "command": p.command, "stats": p.stats, "steps": p.steps,
                "segments": p.segments.iter().map(|s| json!({
                    "address": s.address, "total_size": s.total_size, "stream": s.stream,
                    "segment_type": s.segment_type, "is_expandable": s.is_expandable,
                    "segment_pool_id": s.pool.map(|p| [p.0, p.1]).unwrap_or([0, 0]),
                    "blocks": s.blocks.iter().map(|b| (b.size, b.requested_size, match b.state {
                        crate::alloc::BlockState::ActiveAllocated => 0,
                        crate::alloc::BlockState::ActivePendingFree => 1,
                        crate::alloc::BlockState::Inactive => 2,
                    })).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    v["published"] = Value::Array(full);
    v
}

/// True when `path` starts like a recording (its header line).
/// Reads a recording back into snapshots. Every complete line is read; a
/// last line cut short (a kill or a full disk during `record`) is dropped
/// with a warning, any other bad line is an error naming it.
pub fn read_recording<R: std::io::BufRead>(r: R, name: &str) -> Result<Vec<Snapshot>> {
    let mut lines = crate::trace::bounded_lines(r).enumerate().peekable();
    let bad = |n: usize, m: String| anyhow!(InputError(format!("{name}: line {}: {m}", n + 1)));
    let Some((_, first)) = lines.next() else { return Ok(Vec::new()) };
    let first = first.map_err(|e| bad(0, e.to_string()))?;
    let head: Value = serde_json::from_str(&first).map_err(|e| bad(0, e.to_string()))?;
    if head["format"] != RECORD_FORMAT {
        return Err(bad(0, "not a gpumem-top recording".into()));
    }
    let mut out = Vec::new();
    while let Some((i, l)) = lines.next() {
        let last = lines.peek().is_none();
        let parsed = l.map_err(|e| bad(i, e.to_string())).and_then(|l| {
            if l.trim().is_empty() {
                return Ok(None);
            }
            let v: Value = serde_json::from_str(&l).map_err(|e| bad(i, e.to_string()))?;
            let mut snap: Snapshot = Snapshot {
                time: v["time"].as_f64().unwrap_or(0.0),
                gpus: serde_json::from_value(v["gpus"].clone()).map_err(|e| bad(i, format!("gpus: {e}")))?,
                ..Default::default()
            };
            for p in v["published"].as_array().into_iter().flatten() {
                let bytes = serde_json::to_vec(p)?;
                snap.publishers
                    .push(publisher::parse_bytes(&bytes, std::path::Path::new(name)).map_err(|m| bad(i, m))?);
            }
            snap.gone = serde_json::from_value(v["gone"].clone()).unwrap_or_default();
            Ok(Some(snap))
        });
        match parsed {
            Ok(Some(s)) => out.push(s),
            Ok(None) => {}
            Err(e) if last && !out.is_empty() => {
                eprintln!(
                    "gpumem-top: warning: {e:#}: the last line is cut short (a kill or a full disk during record); replaying the {} complete samples before it",
                    out.len()
                );
            }
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    pub live: LiveArgs,
    /// Address to listen on (port 0: any free port, printed on stderr).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9400")]
    pub listen: String,
}

/// `serve`: Prometheus text exposition on /metrics, sampled every interval.
pub fn serve(args: &ServeArgs) -> Result<ExitCode> {
    let thresholds = args.live.thresholds()?;
    let interval = args.live.interval()?;
    let (src, name) = source_for(args.live.source, &args.live)?;
    one_malloc_arena();
    let listener =
        TcpListener::bind(&args.listen).map_err(|e| anyhow!(InputError(format!("--listen {}: {e}", args.listen))))?;
    let addr = listener.local_addr()?;
    eprintln!("gpumem-top: serving {name} metrics on http://{addr}/metrics");
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    // Samples become the exposition once, off the thread that answers.
    let body: crate::export::http::Body = Arc::default();
    let collector = {
        let (body, stop) = (body.clone(), stop.clone());
        std::thread::Builder::new().name("gpumem-collect".into()).spawn(move || {
            let sampler = Sampler::spawn(src, interval);
            while !stop.load(Ordering::Relaxed) {
                let Ok(s) = sampler.rx.recv_timeout(Duration::from_millis(200)) else { continue };
                let a = alerts(&s, &thresholds);
                let text = Arc::new(crate::export::prometheus::exposition(&s, &a));
                if let Ok(mut b) = body.lock() {
                    *b = Some(text);
                }
            }
        })?
    };
    let served = crate::export::http::serve(listener, body, stop.clone());
    stop.store(true, Ordering::Relaxed);
    let _ = collector.join();
    served?;
    Ok(ExitCode::SUCCESS)
}

/// `replay RECORDING.jsonl`: the live view over what was recorded, or with
/// `--json` a summary per publishing process.
pub fn replay_recording(path: &std::path::Path, snaps: Vec<Snapshot>, json_out: bool) -> Result<ExitCode> {
    let name = path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
    let mut app = crate::ui::live::LiveApp::new(format!("recording {name}"), None, true);
    let n = snaps.len();
    for s in snaps {
        app.ingest(s);
    }
    if json_out {
        let procs: Vec<Value> = app
            .procs
            .iter()
            .map(|((gpu, pid), h)| {
                let peak = h.series.peak();
                json!({
                    "gpu": gpu, "pid": pid, "command": h.last.command, "samples": h.series.points().len(),
                    "peak_allocated_bytes": peak.map(|p| p.allocated),
                    "peak_reserved_bytes": h.series.points().iter().map(|p| p.reserved).max(),
                    "ooms": h.series.ooms.len(),
                })
            })
            .collect();
        let out = json!({"trace": name, "format": RECORD_FORMAT, "samples": n, "processes": procs,
            "last": app.latest_full().map(|s| snapshot_json(&s, &app.alerts, "recording"))});
        let mut so = std::io::stdout().lock();
        serde_json::to_writer(&mut so, &out)?;
        writeln!(so)?;
        return Ok(ExitCode::SUCCESS);
    }
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        return Err(anyhow!(InputError(
            "the interactive view needs a terminal (for scripts: `replay FILE --json`)".into()
        )));
    }
    crate::ui::app::run_app(&mut app).map_err(|e| anyhow!("terminal: {e}"))?;
    Ok(ExitCode::SUCCESS)
}
