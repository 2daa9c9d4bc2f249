//! The live modes: the TUI beside training (`gpumem-top`), `--json`,
//! `record` and `serve`.

use std::io::{IsTerminal, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Result};
use clap::{Args, ValueEnum};

use super::args::InputError;
use crate::monitor::alerts::{alerts, Thresholds};
use crate::monitor::recorder;
use crate::monitor::sampler::{DemoSource, LiveSource, Sampler, Source};
use crate::monitor::{publisher, GpuQuery, NvmlQuery, Snapshot};

#[derive(Args, Debug, Clone, Default)]
pub struct LiveArgs {
    /// GPU index to watch (repeatable; default: all).
    #[arg(long = "device", value_name = "N")]
    pub(crate) devices: Vec<u32>,
    /// Sampling interval in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 500)]
    pub(crate) interval: u64,
    /// Directory where PyTorch processes publish their allocator state
    /// (default: $GPUMEM_TOP_DIR, $XDG_RUNTIME_DIR/gpumem-top or /tmp/gpumem-top-UID).
    #[arg(long, value_name = "DIR")]
    pub(crate) publish_dir: Option<PathBuf>,
    /// Where samples come from: NVML and the publisher directory, or the
    /// simulated device running the demo's training loop.
    #[arg(long, value_enum, default_value_t = SourceKind::Live)]
    pub(crate) source: SourceKind,
    /// Alert when a GPU's used memory is over this share (0-1).
    #[arg(long, value_name = "F", default_value_t = 0.9)]
    pub(crate) alert_usage: f64,
    /// Alert when allocated at step end grows this many steps in a row.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub(crate) alert_leak_steps: usize,
    /// Alert when, at the peaks, reserved memory that never held tensors is
    /// over this share of peak reserved (`peak_ratio`, 0-1).
    #[arg(long, value_name = "F", default_value_t = 0.25)]
    pub(crate) alert_fragmentation: f64,
    /// Alert when a job's worst rank peaks over its median rank by more
    /// than this share (0.2 is 20%; `imbalance`, docs/user/ranks.md).
    #[arg(long, value_name = "F", default_value_t = 0.2)]
    pub(crate) alert_imbalance: f64,
}

impl LiveArgs {
    pub(crate) fn thresholds(&self) -> Result<Thresholds> {
        for (name, v) in [("--alert-usage", self.alert_usage), ("--alert-fragmentation", self.alert_fragmentation)] {
            if !(0.0..=1.0).contains(&v) {
                return Err(anyhow!(InputError(format!("{name} must be in [0, 1], got {v}"))));
            }
        }
        if !(self.alert_imbalance >= 0.0 && self.alert_imbalance <= 100.0) {
            return Err(anyhow!(InputError(format!(
                "--alert-imbalance must be a share over the median, 0-100 (0.2 is 20%), got {}",
                self.alert_imbalance
            ))));
        }
        Ok(Thresholds {
            device_usage: self.alert_usage,
            leak_steps: self.alert_leak_steps,
            fragmentation: self.alert_fragmentation,
            imbalance: self.alert_imbalance,
            ..Default::default()
        })
    }
    pub(crate) fn interval(&self) -> Result<Duration> {
        if !(10..=3_600_000).contains(&self.interval) {
            return Err(anyhow!(InputError(format!("--interval must be 10..3600000 ms, got {}", self.interval))));
        }
        Ok(Duration::from_millis(self.interval))
    }
    pub(crate) fn dir(&self) -> PathBuf {
        self.publish_dir.clone().unwrap_or_else(publisher::default_dir)
    }
}

/// `gpumem-top [live]`: what is sampled, and how it is shown.
#[derive(Args, Debug, Clone, Default)]
pub struct WatchArgs {
    #[command(flatten)]
    pub(crate) live: LiveArgs,
    /// Draw without colour (also when NO_COLOR is set).
    #[arg(long)]
    pub(crate) no_color: bool,
    /// Print every GPU and process once as JSON, like `gpustat --json`.
    #[arg(long)]
    pub(crate) json: bool,
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
pub(crate) fn open_nvml(devices: &[u32]) -> Result<Option<NvmlQuery>> {
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
        Err(e) => Err(anyhow!(e).context(format!("--device {}", devices[0]))),
    }
}

/// The JSON of one snapshot: every GPU and process, the publishers'
/// allocator figures, what was ignored, the alerts.
pub(crate) fn live_source(args: &LiveArgs) -> Result<Option<Box<dyn Source>>> {
    let Some(q) = open_nvml(&args.devices)? else { return Ok(None) };
    let dir = args.dir();
    // Publishers create it too; make it ours and private if it is missing
    // (one that is not is read by the scanner's own checks, or refused).
    let _ = crate::private::ensure_private_dir(&dir);
    Ok(Some(Box::new(LiveSource::new(Box::new(q), args.devices.clone(), Some(dir)))))
}

/// `gpumem-top [live]`: the TUI, or `--json` once. Without NVML or a GPU it
/// opens the simulated device under `banner` (unless a device was named).
pub fn live(watch: &WatchArgs, no_gpu_banner: &str) -> Result<ExitCode> {
    let args = &watch.live;
    let thresholds = args.thresholds()?;
    let interval = args.interval()?;
    if watch.json {
        // Scripts get real numbers or an error, never the simulated device
        // unless they ask for it (`--source demo`), as `record` and `serve`.
        let (mut src, name) = source_for(args.source, args)?;
        let snap = src.snapshot();
        let a = alerts(&snap, &thresholds);
        let mut so = super::io::text_out();
        serde_json::to_writer(&mut so, &crate::monitor::report::LiveReport::of(&snap, &a, name))?;
        writeln!(so)?;
        return Ok(ExitCode::SUCCESS);
    }
    let source = match args.source {
        SourceKind::Live => live_source(args)?,
        SourceKind::Demo => Some(Box::new(DemoSource::new(42)) as Box<dyn Source>),
    };
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        return Err(anyhow!(InputError(
            "the interactive view needs a terminal (for scripts: `gpumem-top --json`, `record`, `serve`)".into()
        )));
    }
    let color = super::io::color(watch.no_color);
    use crate::ui::event::{run_app, Events};
    let Some(src) = source else {
        let mut app = crate::ui::app::DemoApp::demo(42, no_gpu_banner.to_string(), color);
        run_app(&mut app, crate::ui::event::Events::new()).map_err(|e| anyhow!("terminal: {e}"))?;
        return Ok(ExitCode::SUCCESS);
    };
    one_malloc_arena();
    let events = Events::new();
    let mut app = match args.source {
        SourceKind::Live => crate::ui::live::LiveApp::new("live (NVML)".into(), None, color),
        SourceKind::Demo => crate::ui::live::LiveApp::of_demo(color),
    };
    app.watch.model.thresholds = thresholds;
    app.snapshots = args.source == SourceKind::Live;
    live_loop(&mut app, src, interval, events)?;
    Ok(ExitCode::SUCCESS)
}

/// The live view of `src`'s samples until the user quits; each snapshot
/// taken with `S` opens in the replay view over it, and `q` there comes
/// back. The sampler runs until it returns.
pub(crate) fn live_loop(
    app: &mut crate::ui::live::LiveApp,
    src: Box<dyn Source>,
    interval: Duration,
    events: crate::ui::event::Events,
) -> Result<()> {
    let _sampler = sample_into(src, interval, &events);
    let color = app.watch.color;
    crate::ui::event::run_screens(app, events, &mut |o| super::screen::open_screen(o, color))
        .map_err(|e| anyhow!("terminal: {e}"))
}

/// Sends each sample of `src` to the UI's channel; one the UI has no room
/// for is dropped (the next comes within an interval).
fn sample_into(src: Box<dyn Source>, interval: Duration, events: &crate::ui::event::Events) -> Sampler {
    let tx = events.sender();
    Sampler::spawn_into(src, interval, move |s| {
        !matches!(
            tx.try_send(crate::ui::event::AppEvent::Sample(Box::new(s))),
            Err(std::sync::mpsc::TrySendError::Disconnected(_))
        )
    })
}

/// A monitor runs for days beside training, so its heap stays small: one
/// malloc arena (the sampler thread would otherwise hold a second heap), and
/// a fixed mmap threshold so large buffers go back to the system when freed
/// instead of raising the threshold and staying in the heap.
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: glibc's mallopt takes no pointers; called before the
        // sampler thread exists.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
            libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 10);
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
    pub(crate) live: LiveArgs,
    /// The JSON-lines file to write (one snapshot per line after a header).
    #[arg(short = 'o', long = "output", value_name = "PATH.jsonl")]
    pub(crate) output: PathBuf,
    /// Stop after this many samples (default: until Ctrl-C or SIGTERM).
    #[arg(long, value_name = "N")]
    pub(crate) count: Option<u64>,
    /// Replace an existing file (the path itself: a symbolic link there is
    /// removed, never followed).
    #[arg(long, conflicts_with = "append")]
    pub(crate) force: bool,
    /// Add samples to an existing recording.
    #[arg(long)]
    pub(crate) append: bool,
}

/// `record`: headless sampling into JSON lines that `replay` shows later.
pub fn record(args: &RecordArgs) -> Result<ExitCode> {
    let thresholds = args.live.thresholds()?;
    let interval = args.live.interval()?;
    let (src, name) = source_for(args.live.source, &args.live)?;
    let mode = match (args.force, args.append) {
        (_, true) => recorder::Mode::Append,
        (true, false) => recorder::Mode::Replace,
        (false, false) => recorder::Mode::New,
    };
    let output = recorder::open(&args.output, mode)?;
    if let Some(n) = output.dropped {
        eprintln!(
            "gpumem-top: {}: its last line was cut short ({n} bytes): dropped before appending",
            args.output.display()
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let rec = recorder::Recorder { output, path: &args.output, source: name, interval_ms: args.live.interval };
    let n = rec.run(src, thresholds, interval, &stop, args.count)?;
    eprintln!("gpumem-top: recorded {} to {}", crate::analysis::count(n as usize, "sample"), args.output.display());
    Ok(ExitCode::SUCCESS)
}

pub(crate) use crate::monitor::recording::RECORD_FORMAT;

/// Reads a recording back into snapshots. Every complete line is read; a
/// last line cut short (a kill or a full disk during `record`) is dropped
/// with a warning, any other bad line is an error naming it.
pub fn read_recording<R: std::io::BufRead>(r: R, name: &str) -> Result<Vec<Snapshot>> {
    read_recording_with(r, name, &mut |w| eprintln!("gpumem-top: warning: {w}"))
}

/// As `read_recording`, handing its warning (a last line cut short) to
/// `warn` instead of stderr.
pub fn read_recording_with<R: std::io::BufRead>(
    r: R,
    name: &str,
    warn: &mut dyn FnMut(String),
) -> Result<Vec<Snapshot>> {
    crate::monitor::recording::read(r, name, warn).map_err(anyhow::Error::from)
}

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    pub(crate) live: LiveArgs,
    /// Address to listen on (port 0: any free port, printed on stderr).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9400")]
    pub(crate) listen: String,
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
            // The sampler runs until it is dropped with this thread's closure.
            let (_sampler, rx) = Sampler::spawn(src, interval);
            while !stop.load(Ordering::Relaxed) {
                let Ok(s) = rx.recv_timeout(Duration::from_millis(200)) else { continue };
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
    let name = super::io::trace_name(path);
    let n = snaps.len();
    let interactive = !json_out && std::io::stdout().is_terminal() && std::io::stdin().is_terminal();
    if !interactive {
        let mut model = crate::monitor::model::LiveModel::default();
        for s in snaps {
            model.ingest(s);
        }
        let report = crate::monitor::report::RecordingReport::of(&model, name, RECORD_FORMAT, n);
        let mut so = super::io::text_out();
        if json_out {
            serde_json::to_writer(&mut so, &report)?;
            writeln!(so)?;
        } else {
            write!(so, "{}", recording_summary(&report))?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut app = crate::ui::recording::RecordingApp::new(&name, snaps, true);
    crate::ui::event::run_app(&mut app, crate::ui::event::Events::new()).map_err(|e| anyhow!("terminal: {e}"))?;
    Ok(ExitCode::SUCCESS)
}

/// The text summary of a recording (`replay RECORDING` into a pipe).
fn recording_summary(r: &crate::monitor::report::RecordingReport) -> String {
    use crate::analysis::count;
    use crate::analysis::human_bytes;
    let mut out = format!(
        "{}: {} ({}), {}\n",
        r.trace,
        count(r.samples, "sample"),
        r.format,
        if r.processes.len() == 1 { "1 process".to_string() } else { format!("{} processes", r.processes.len()) }
    );
    for p in &r.processes {
        out.push_str(&format!(
            "  GPU {} pid {} {}: {}, peak allocated {}, peak reserved {}, {}\n",
            p.gpu,
            p.pid,
            p.name,
            count(p.samples, "sample"),
            p.peak_allocated_bytes.map_or("n/a".into(), human_bytes),
            p.peak_reserved_bytes.map_or("n/a".into(), human_bytes),
            count(p.ooms, "OOM")
        ));
    }
    for j in &r.jobs {
        out.push_str(&job_line(j));
    }
    if let Some(l) = &r.last {
        for a in &l.alerts {
            out.push_str(&format!("  alert at the last sample: {}\n", a.message()));
        }
    }
    out
}

/// A job in one line: its ranks' median and worst peak.
pub(crate) fn job_line(j: &crate::monitor::job::Job) -> String {
    use crate::analysis::human_bytes;
    let gone = j.ranks.iter().filter(|r| r.gone).count();
    format!(
        "  job {} ({}, {} of {} ranks{}): median rank's peak allocated {}, worst rank {} at {} ({:+.1}%)\n",
        j.job,
        j.program(),
        j.ranks.len(),
        j.world_size,
        if gone > 0 { format!(", {gone} gone") } else { String::new() },
        human_bytes(j.median_peak_bytes),
        j.worst_rank,
        human_bytes(j.worst_peak_bytes),
        j.imbalance * 100.0
    )
}
