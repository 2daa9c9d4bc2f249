//! `gpumem-top run -- CMD`: starts a training command with the publisher
//! injected (no code change) and watches it; `gpumem-top snapshot PID`:
//! a PyTorch memory snapshot of a publishing process, headless.
//! docs/live.md says how the injection works and what it costs.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use clap::Args;

use super::live::{LiveArgs, SourceKind};
use super::InputError;
use crate::monitor::publisher;

/// What `run` and `attach` start in the process, and how they watch it.
#[derive(Args, Debug, Clone)]
pub struct PublishArgs {
    #[command(flatten)]
    pub(crate) live: LiveArgs,
    /// Record PyTorch's memory history in the command (this many entries,
    /// Python stacks), so that a snapshot (`S`) holds the whole trace.
    #[arg(long, value_name = "N")]
    pub(crate) history: Option<u64>,
    /// Each optimizer step's own peak allocated and reserved bytes on the
    /// timeline. PyTorch keeps only all-time peaks, so this resets its peak
    /// counters at every step; torch.cuda.memory_stats(),
    /// max_memory_allocated() and reset_peak_memory_stats() are wrapped so
    /// that the script still reads the values it would have read.
    #[arg(long)]
    pub(crate) step_peaks: bool,
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    #[command(flatten)]
    pub(crate) publish: PublishArgs,
    /// Record samples of the command to this JSON-lines file, headless,
    /// until it exits (`replay FILE` shows them).
    #[arg(short = 'o', long = "output", value_name = "PATH.jsonl")]
    pub(crate) output: Option<PathBuf>,
    /// Where the command's output goes while the view is open (default:
    /// gpumem-top-run-PID.log here).
    #[arg(long, value_name = "PATH")]
    pub(crate) log: Option<PathBuf>,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub(crate) command: Vec<String>,
}

/// NVML's answer where there is none: no GPU.
struct NoGpus;

impl crate::monitor::GpuQuery for NoGpus {
    fn device_count(&mut self) -> Result<u32, String> {
        Ok(0)
    }
    fn sample(&mut self, index: u32) -> crate::monitor::GpuSample {
        crate::monitor::GpuSample { index, ..Default::default() }
    }
}

/// The hook Python loads first, and the publisher it starts.
const SITECUSTOMIZE: &str = include_str!("../../assets/python/run/sitecustomize.py");
const PUBLISHER: &str = include_str!("../../assets/python/gpumem_top_publish.py");

/// A private directory holding the hook; removed when dropped.
struct Hook(PathBuf);

impl Hook {
    fn new() -> Result<Hook> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = std::env::temp_dir().join(format!("gpumem-top-run-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        std::fs::write(dir.join("sitecustomize.py"), SITECUSTOMIZE)?;
        std::fs::write(dir.join("gpumem_top_publish.py"), PUBLISHER)?;
        Ok(Hook(dir))
    }
}

impl Drop for Hook {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The command with the hook first on its PYTHONPATH and the publisher's
/// settings in its environment.
fn command(args: &RunArgs, hook: &Path, dir: &Path) -> std::process::Command {
    let mut path = hook.as_os_str().to_owned();
    if let Some(p) = std::env::var_os("PYTHONPATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(p);
    }
    let mut c = std::process::Command::new(&args.command[0]);
    c.args(&args.command[1..])
        .env("PYTHONPATH", path)
        .env("GPUMEM_TOP_RUN", "1")
        .env("GPUMEM_TOP_DIR", dir)
        .env("GPUMEM_TOP_INTERVAL", format!("{}", args.publish.live.interval as f64 / 1000.0))
        .env("GPUMEM_TOP_STEP_PEAKS", if args.publish.step_peaks { "1" } else { "0" })
        .env("GPUMEM_TOP_HISTORY", args.publish.history.unwrap_or(0).to_string());
    c
}

/// The command as the status line names it: its first two words without
/// their directories ("python3 train.py …").
fn shown_command(argv: &[String]) -> String {
    let base = |a: &String| Path::new(a).file_name().map_or_else(|| a.clone(), |n| n.to_string_lossy().into_owned());
    let mut s = argv.iter().take(2).map(base).collect::<Vec<_>>().join(" ");
    if argv.len() > 2 {
        s.push_str(" …");
    }
    s
}

/// The exit code that passes the command's on: its own, or 128 + the signal.
fn exit_code_of(st: std::process::ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => ExitCode::from(c.clamp(0, 255) as u8),
        (None, Some(s)) => ExitCode::from((128 + s).clamp(0, 255) as u8),
        _ => ExitCode::from(1),
    }
}

pub fn run(args: &RunArgs) -> Result<ExitCode> {
    if args.publish.live.json {
        return Err(anyhow!(InputError(
            "run has no --json: record with -o FILE.jsonl, then `replay FILE --json`".into()
        )));
    }
    if args.publish.live.source != SourceKind::Live {
        return Err(anyhow!(InputError("run watches the command it starts: --source demo does not apply".into())));
    }
    if args.publish.history == Some(0) {
        return Err(anyhow!(InputError("--history needs a number of entries, e.g. --history 100000".into())));
    }
    let thresholds = args.publish.live.thresholds()?;
    let interval = args.publish.live.interval()?;
    let interactive = args.output.is_none();
    if interactive && (!std::io::stdout().is_terminal() || !std::io::stdin().is_terminal()) {
        return Err(anyhow!(InputError(
            "the interactive view needs a terminal; without one, record: gpumem-top run -o FILE.jsonl -- CMD".into()
        )));
    }
    let dir = args.publish.live.dir();
    publisher::ensure_dir(&dir).map_err(|e| anyhow!(InputError(format!("{}: {e}", dir.display()))))?;
    let src = match super::live::live_source(&args.publish.live)? {
        Some(s) => s,
        None => {
            // What the command publishes is still worth having; the GPU
            // totals and per-process NVML figures are not there.
            eprintln!("gpumem-top: no NVIDIA GPU or NVML library found: showing only what the command publishes");
            Box::new(crate::monitor::sampler::LiveSource::new(Box::new(NoGpus), Vec::new(), Some(dir.clone())))
                as Box<dyn crate::monitor::sampler::Source>
        }
    };
    let hook = Hook::new()?;
    let mut cmd = command(args, &hook.0, &dir);
    let shown = shown_command(&args.command);
    if !interactive {
        // Headless: the command keeps the terminal (and gets Ctrl-C as it
        // would alone); we record until it exits.
        let out = args.output.clone().unwrap_or_default();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&out)
            .map_err(|e| anyhow!(InputError(format!("{}: {e}", out.display()))))?;
        let mut child = cmd.spawn().map_err(|e| anyhow!(InputError(format!("{}: {e}", args.command[0]))))?;
        let stop = Arc::new(AtomicBool::new(false));
        // Ctrl-C reaches the command too; we keep recording until it ends.
        let interrupted = Arc::new(AtomicBool::new(false));
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            signal_hook::flag::register(sig, interrupted.clone())?;
        }
        let waiter = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let st = child.wait();
                // Two more samples: the final file it wrote at exit (its
                // last steps, an OOM that ended it) is read, then removed.
                std::thread::sleep(interval * 2 + Duration::from_millis(100));
                stop.store(true, Ordering::Relaxed);
                st
            })
        };
        let rec = super::live::Recorder {
            file,
            header: true,
            out: &out,
            source: "nvml",
            interval_ms: args.publish.live.interval,
        };
        let n = rec.run(src, thresholds, interval, &stop, None)?;
        let st = waiter.join().map_err(|_| anyhow!("waiting for {shown}"))??;
        eprintln!("gpumem-top: `{shown}` {st}; recorded {n} samples to {}", out.display());
        return Ok(exit_code_of(st));
    }
    // The view owns the terminal: the command's output goes to a log, and
    // it runs in its own process group so that it outlives us if the user
    // leaves it running.
    let log = args.log.clone().unwrap_or_else(|| PathBuf::from(format!("gpumem-top-run-{}.log", std::process::id())));
    let logf = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&log)
        .map_err(|e| anyhow!(InputError(format!("{}: {e}", log.display()))))?;
    use std::os::unix::process::CommandExt;
    cmd.stdin(std::process::Stdio::null()).stdout(logf.try_clone()?).stderr(logf).process_group(0);
    let mut child = cmd.spawn().map_err(|e| anyhow!(InputError(format!("{}: {e}", args.command[0]))))?;
    let pid = child.id();
    let events = crate::ui::event::Events::new();
    let tx = events.sender();
    let status = Arc::new(std::sync::Mutex::new(None));
    {
        let status = status.clone();
        std::thread::Builder::new().name("gpumem-child".into()).spawn(move || {
            if let Ok(st) = child.wait() {
                if let Ok(mut s) = status.lock() {
                    *s = Some(st);
                }
                let _ = tx.send(crate::ui::event::Event::Exited(st));
            }
        })?;
    }
    let color = args.publish.live.color();
    let mut app = crate::ui::live::LiveApp::new("live (NVML)".into(), None, color);
    app.model.thresholds = thresholds;
    app.snapshots = true;
    app.follow(crate::ui::live::RunChild {
        pid,
        command: shown.clone(),
        log: Some(log.clone()),
        exited: None,
        found: false,
        ours: true,
    });
    super::live::live_loop(&mut app, src, interval, &events)?;
    let st = status.lock().ok().and_then(|s| *s);
    match st {
        Some(st) => {
            eprintln!("gpumem-top: `{shown}` {st}; its output is in {}", log.display());
            Ok(exit_code_of(st))
        }
        None => {
            eprintln!(
                "gpumem-top: `{shown}` (pid {pid}) is still running; its output goes to {} (stop it with: kill {pid})",
                log.display()
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct SnapshotArgs {
    /// The process to ask: one that publishes its allocator state
    /// (started with `gpumem-top run`, or calling gpumem_top_publish.start()).
    #[arg(value_name = "PID")]
    pub(crate) pid: u32,
    /// Where to write it (default: gpumem-top-snapshot-PID-TIME.pickle here).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub(crate) output: Option<PathBuf>,
    /// Directory where it publishes (default: as the live view).
    #[arg(long, value_name = "DIR")]
    pub(crate) publish_dir: Option<PathBuf>,
    /// Seconds to wait for the answer.
    #[arg(long, value_name = "S", default_value_t = 60)]
    pub(crate) timeout: u64,
}

/// `gpumem-top snapshot PID -o FILE`.
pub fn snapshot(args: &SnapshotArgs) -> Result<ExitCode> {
    use crate::monitor::snapshot::{deliver, poll, request, withdraw, Answer};
    let dir = args.publish_dir.clone().unwrap_or_else(publisher::default_dir);
    let uid = publisher::current_uid();
    let scan = publisher::scan(&dir, uid, publisher::DEFAULT_CAP);
    let Some(p) = scan.published.iter().find(|p| p.pid == args.pid) else {
        return Err(anyhow!(InputError(format!(
            "pid {} does not publish its allocator state in {} (start it with `gpumem-top run -- CMD`, or call gpumem_top_publish.start() in it)",
            args.pid,
            dir.display()
        ))));
    };
    let pdir = p.path.parent().map(Path::to_path_buf).unwrap_or(dir);
    let dest =
        args.output.clone().unwrap_or_else(|| crate::monitor::snapshot::default_name(args.pid, crate::monitor::now()));
    if std::fs::symlink_metadata(&dest).is_ok() {
        return Err(anyhow!(InputError(format!("{}: already exists", dest.display()))));
    }
    request(&pdir, args.pid).map_err(|e| anyhow!(InputError(format!("{}: {e}", pdir.display()))))?;
    let start = Instant::now();
    loop {
        match poll(&pdir, args.pid) {
            Answer::Ready(from) => {
                deliver(&from, &dest).map_err(|e| anyhow!(InputError(format!("{}: {e}", dest.display()))))?;
                let size = std::fs::metadata(&dest).map(|m| m.len()).unwrap_or(0);
                println!(
                    "{}: snapshot of pid {} ({}); open it with: gpumem-top replay {}",
                    dest.display(),
                    args.pid,
                    crate::analysis::human_bytes(size),
                    dest.display()
                );
                return Ok(ExitCode::SUCCESS);
            }
            Answer::Failed(why) => return Err(anyhow!("pid {} could not take a snapshot: {why}", args.pid)),
            Answer::Pending if start.elapsed() > Duration::from_secs(args.timeout) => {
                withdraw(&pdir, args.pid);
                return Err(anyhow!(InputError(format!(
                    "pid {} did not answer in {} s (its publisher predates snapshots, or it is stuck)",
                    args.pid, args.timeout
                ))));
            }
            Answer::Pending => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct AttachArgs {
    /// The running Python process (3.14 or later) to start publishing in.
    #[arg(value_name = "PID")]
    pub(crate) pid: u32,
    #[command(flatten)]
    pub(crate) publish: PublishArgs,
}

/// The Python version of the interpreter at `exe`, as (major, minor).
fn python_version(exe: &Path) -> Option<(u32, u32)> {
    let out = std::process::Command::new(exe)
        .args(["-I", "-c", "import sys; print('%d %d' % sys.version_info[:2])"])
        .stdin(std::process::Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text.split_whitespace().map(|w| w.parse().ok());
    Some((it.next()??, it.next()??))
}

/// `gpumem-top attach PID`: injects the publisher into a running Python
/// 3.14+ process through `sys.remote_exec` (PEP 768) and watches it.
pub fn attach(args: &AttachArgs) -> Result<ExitCode> {
    let pid = args.pid;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map_err(|e| anyhow!(InputError(format!("pid {pid}: {e} (no such process, or not ours)"))))?;
    let how = "start it with `gpumem-top run -- CMD`, or call gpumem_top_publish.start() in it";
    // Only an interpreter is asked its version: another program is never
    // run with arguments it may read differently.
    let python = exe.file_name().is_some_and(|n| n.to_string_lossy().starts_with("python"));
    let version = if python { python_version(&exe) } else { None };
    let Some((major, minor)) = version else {
        return Err(anyhow!(InputError(format!("pid {pid} ({}) is not a Python we can ask; {how}", exe.display()))));
    };
    if (major, minor) < (3, 14) {
        return Err(anyhow!(InputError(format!(
            "pid {pid} runs Python {major}.{minor} ({}); attaching needs Python 3.14 or later (sys.remote_exec); {how}",
            exe.display()
        ))));
    }
    let thresholds = args.publish.live.thresholds()?;
    let interval = args.publish.live.interval()?;
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        return Err(anyhow!(InputError("attach opens the live view, which needs a terminal".into())));
    }
    let dir = args.publish.live.dir();
    publisher::ensure_dir(&dir).map_err(|e| anyhow!(InputError(format!("{}: {e}", dir.display()))))?;
    // The target imports from here at its next safe point, after we have
    // returned: the directory stays (in the user's private publish dir).
    let hook = dir.join(format!("attach-{pid}"));
    std::fs::create_dir_all(&hook)?;
    std::fs::write(hook.join("gpumem_top_publish.py"), PUBLISHER)?;
    let script = hook.join("start.py");
    std::fs::write(
        &script,
        format!(
            "import sys\nsys.path.insert(0, {hook:?})\nimport gpumem_top_publish as g, torch\n\
             torch.cuda._lazy_call(lambda: g.start(interval={interval}, directory={dir:?}, step_peaks={peaks}, history={history}))\n",
            hook = hook.display().to_string(),
            interval = args.publish.live.interval as f64 / 1000.0,
            dir = dir.display().to_string(),
            peaks = if args.publish.step_peaks { "True" } else { "False" },
            history = args.publish.history.map_or("None".to_string(), |h| h.to_string()),
        ),
    )?;
    let st = std::process::Command::new(&exe)
        .args(["-I", "-c", &format!("import sys; sys.remote_exec({pid}, {:?})", script.display().to_string())])
        .status()
        .with_context(|| format!("running {}", exe.display()))?;
    if !st.success() {
        return Err(anyhow!(InputError(format!(
            "sys.remote_exec into pid {pid} failed ({st}): debugging another process needs ptrace permission (/proc/sys/kernel/yama/ptrace_scope); {how}"
        ))));
    }
    let src = super::live::live_source(&args.publish.live)?
        .ok_or_else(|| anyhow!(InputError("no NVIDIA GPU or NVML library found".into())))?;
    let color = args.publish.live.color();
    let mut app = crate::ui::live::LiveApp::new("live (NVML)".into(), None, color);
    app.model.thresholds = thresholds;
    app.snapshots = true;
    let command = crate::monitor::procfs::command(pid).unwrap_or_else(|| exe.display().to_string());
    app.follow(crate::ui::live::RunChild { pid, command, log: None, exited: None, found: false, ours: false });
    let events = crate::ui::event::Events::new();
    super::live::live_loop(&mut app, src, interval, &events)?;
    Ok(ExitCode::SUCCESS)
}
