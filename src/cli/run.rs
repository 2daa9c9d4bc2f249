//! `gpumem-top run -- CMD`: starts a training command with the publisher
//! injected (no code change) and watches it; `gpumem-top snapshot PID`:
//! a PyTorch memory snapshot of a publishing process, headless.
//! docs/user/live.md says how the injection works and what it costs.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use clap::Args;

use super::args::InputError;
use super::live::{LiveArgs, SourceKind};
use crate::launch::{self, forward_signals, shown_command, Hook, PUBLISHER, RUN_SITECUSTOMIZE};
use crate::monitor::publisher;

/// What `run` and `attach` start in the process, and how they watch it.
#[derive(Args, Debug, Clone)]
pub struct PublishArgs {
    #[command(flatten)]
    pub(crate) live: LiveArgs,
    /// Draw without colour (also when NO_COLOR is set).
    #[arg(long)]
    pub(crate) no_color: bool,
    /// Record PyTorch's memory history in the command (this many entries,
    /// Python stacks), so that a snapshot (`S`) holds the whole trace.
    #[arg(long, value_name = "N")]
    pub(crate) history: Option<u64>,
    /// Each optimizer step's own peak allocated and reserved bytes on the
    /// timeline: the default (this flag is kept for scripts that pass it).
    /// PyTorch keeps only all-time peaks, so this resets its peak counters
    /// at every step; torch.cuda.memory_stats(), max_memory_allocated() and
    /// reset_peak_memory_stats() are wrapped so that the script still reads
    /// the values it would have read.
    #[arg(long, overrides_with = "no_step_peaks")]
    pub(crate) step_peaks: bool,
    /// Do not reset PyTorch's peak counters at each step (for C++ code that
    /// reads them directly): steps are then marked at their ends, without
    /// their own peaks.
    #[arg(long, overrides_with = "step_peaks")]
    pub(crate) no_step_peaks: bool,
}

impl PublishArgs {
    /// Per-step peaks: on unless --no-step-peaks (measured at +0.2% of a
    /// GPT-2 step on the H200, docs/user/live.md).
    pub(crate) fn step_peaks(&self) -> bool {
        !self.no_step_peaks
    }

    /// The publisher's settings, writing into `directory`.
    fn settings<'a>(&self, directory: &'a Path) -> launch::PublisherSettings<'a> {
        launch::PublisherSettings {
            directory,
            interval_ms: self.live.interval,
            step_peaks: self.step_peaks(),
            history: self.history,
        }
    }
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
    fn device_count(&mut self) -> Result<u32, crate::monitor::GpuError> {
        Ok(0)
    }
    fn sample(&mut self, index: u32) -> crate::monitor::GpuSample {
        crate::monitor::GpuSample { index, ..Default::default() }
    }
}

/// The publish directory, absolute (a command that changes directory,
/// as Hydra does, still finds it) and private: ours, not a link, writable
/// by nobody else; created if missing.
fn publish_dir(live: &LiveArgs) -> Result<PathBuf> {
    let dir = live.dir();
    let dir = std::path::absolute(&dir).map_err(|e| anyhow!(InputError(format!("{}: {e}", dir.display()))))?;
    let named = live.publish_dir.is_some() || crate::private::dir_named_by_environment();
    let (dir, note) = crate::private::own_dir(&dir, named)
        .map_err(|e| anyhow!(InputError(format!("{e} (choose a directory of your own with --publish-dir)"))))?;
    if let Some(n) = note {
        eprintln!("gpumem-top: {n}");
    }
    Ok(dir)
}

/// A command that could not be started: one line, and the shell's exit
/// codes (127 not found, 126 not executable).
fn not_started(program: &str, e: &std::io::Error) -> ExitCode {
    eprintln!("gpumem-top: {program}: {e}");
    ExitCode::from(if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 })
}

/// Removes a log file we created for a command that never started.
fn logf_guard(log: &Path) {
    if std::fs::metadata(log).is_ok_and(|m| m.len() == 0) {
        let _ = std::fs::remove_file(log);
    }
}

/// `run -o FILE`: the command keeps the terminal (and gets Ctrl-C as it
/// would alone); we record until it exits, and pass its exit code on.
fn record_run(
    args: &RunArgs,
    mut cmd: std::process::Command,
    src: Box<dyn crate::monitor::sampler::Source>,
    thresholds: crate::monitor::alerts::Thresholds,
    interval: Duration,
    shown: &str,
) -> Result<ExitCode> {
    let out = args.output.clone().unwrap_or_default();
    let file = crate::private::create_new(&out).map_err(|e| anyhow!(InputError(format!("{}: {e}", out.display()))))?;
    let output = crate::monitor::recorder::Output { file, header: true, dropped: None };
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let _ = std::fs::remove_file(&out);
            return Ok(not_started(&args.command[0], &e));
        }
    };
    let pid = child.id();
    let stop = Arc::new(AtomicBool::new(false));
    let forwarding = forward_signals(pid, stop.clone())?;
    let waiter = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let st = child.wait();
            // The recorder takes its last sample now (the file the
            // process wrote at exit), then returns.
            stop.store(true, Ordering::Relaxed);
            st
        })
    };
    let rec = crate::monitor::recorder::Recorder {
        output,
        path: &out,
        source: "nvml",
        interval_ms: args.publish.live.interval,
    };
    let n = rec.run(src, thresholds, interval, &stop, None)?;
    forwarding.close();
    let st = waiter.join().map_err(|_| anyhow!("waiting for {shown}"))??;
    eprintln!(
        "gpumem-top: `{shown}` {st}; recorded {} to {}",
        crate::analysis::count(n as usize, "sample"),
        out.display()
    );
    Ok(ExitCode::from(launch::exit_code_of(st)))
}

pub fn run(args: &RunArgs) -> Result<ExitCode> {
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
    let dir = publish_dir(&args.publish.live)?;
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
    let hook =
        Hook::new(&dir, "run", &[("sitecustomize.py", RUN_SITECUSTOMIZE), ("gpumem_top_publish.py", PUBLISHER)])?;
    let mut cmd = std::process::Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .env("PYTHONPATH", launch::python_path(hook.path()))
        .envs(args.publish.settings(&dir).environment());
    let shown = shown_command(&args.command);
    if !interactive {
        return record_run(args, cmd, src, thresholds, interval, &shown);
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
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            logf_guard(&log);
            return Ok(not_started(&args.command[0], &e));
        }
    };
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
                let _ = tx.send(crate::ui::event::AppEvent::Exited(st));
            }
        })?;
    }
    let color = super::io::color(args.publish.no_color);
    let mut app = crate::ui::live::LiveApp::new("live (NVML)".into(), None, color);
    app.watch.model.thresholds = thresholds;
    app.snapshots = true;
    app.follow(crate::ui::live::RunChild {
        pid,
        command: shown.clone(),
        log: Some(log.clone()),
        exited: None,
        found: false,
        ours: true,
    });
    super::live::live_loop(&mut app, src, interval, events)?;
    let st = status.lock().ok().and_then(|s| *s);
    match st {
        Some(st) => {
            eprintln!("gpumem-top: `{shown}` {st}; its output is in {}", log.display());
            Ok(ExitCode::from(launch::exit_code_of(st)))
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
    /// (started with `gpumem-top run`, or calling gpumem_top.publish()).
    #[arg(value_name = "PID")]
    pub(crate) pid: u32,
    /// Where to write it (default: gpumem-top-snapshot-PID-TIME.pickle here);
    /// with --job, the start of each rank's file name (FILE-rank0.pickle, …).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub(crate) output: Option<PathBuf>,
    /// Ask every rank of PID's distributed job at once (the ranks that
    /// publish the same job: docs/user/ranks.md), one file per rank.
    #[arg(long)]
    pub(crate) job: bool,
    /// Directory where it publishes (default: as the live view).
    #[arg(long, value_name = "DIR")]
    pub(crate) publish_dir: Option<PathBuf>,
    /// Seconds to wait for the answer.
    #[arg(long, value_name = "S", default_value_t = 60)]
    pub(crate) timeout: u64,
}

/// One process asked for a snapshot, and where its answer goes.
struct Asked {
    /// How its files name it (`Published::key`).
    who: String,
    /// Its pids here and in the namespace it publishes from.
    pids: Vec<u32>,
    dir: PathBuf,
    dest: PathBuf,
    label: String,
}

/// Asks every one of `asked` at once and waits for all: per process, the
/// size of the snapshot delivered, or why none was.
fn ask_all(asked: &[Asked], timeout: Duration) -> Vec<Result<u64, String>> {
    use crate::monitor::snapshot::{deliver, RequestState, SnapshotRequest};
    let requests: Vec<Result<SnapshotRequest, String>> = asked
        .iter()
        .map(|a| SnapshotRequest::ask(&a.dir, &a.who, timeout).map_err(|e| format!("{}: {e}", a.dir.display())))
        .collect();
    let mut out: Vec<Option<Result<u64, String>>> =
        requests.iter().map(|r| r.as_ref().err().map(|e| Err(e.clone()))).collect();
    while out.iter().any(Option::is_none) {
        for ((a, r), o) in asked.iter().zip(&requests).zip(out.iter_mut()).filter(|(_, o)| o.is_none()) {
            let Ok(r) = r else { continue };
            let alive = a.pids.iter().any(|q| Path::new(&format!("/proc/{q}")).exists());
            *o = match r.poll(alive) {
                RequestState::Ready(from) => Some(
                    deliver(&from, &a.dest)
                        .map(|()| std::fs::metadata(&a.dest).map(|m| m.len()).unwrap_or(0))
                        .map_err(|e| format!("{}: {e}", a.dest.display())),
                ),
                RequestState::Failed(why) => Some(Err(why.to_string())),
                RequestState::Waiting => None,
            };
        }
        if out.iter().any(Option::is_none) {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    out.into_iter().map(|o| o.unwrap_or_else(|| Err("no answer".into()))).collect()
}

/// `gpumem-top snapshot PID -o FILE`, and with `--job` every rank of its job.
pub fn snapshot(args: &SnapshotArgs) -> Result<ExitCode> {
    let dir = args.publish_dir.clone().unwrap_or_else(publisher::default_dir);
    let uid = publisher::current_uid();
    let mut scan = publisher::scan(&dir, uid, publisher::DEFAULT_CAP);
    // Each by its pid as we see it: a container's trainer is its pid 1,
    // here the host's pid (docs/user/cluster.md).
    for p in &mut scan.published {
        p.pid = crate::monitor::sampler::resolve(p).0;
    }
    let Some(p) = scan.published.iter().find(|p| p.pid == args.pid) else {
        return Err(anyhow!(InputError(format!(
            "pid {} does not publish its allocator state in {} (start it with `gpumem-top run -- CMD`, or call gpumem_top.publish() in it)",
            args.pid,
            dir.display()
        ))));
    };
    let now = crate::monitor::now();
    let asked_of = |q: &crate::monitor::Published, dest: PathBuf| Asked {
        who: q.key(),
        pids: std::iter::once(q.pid).chain(q.nspid.first().copied()).collect(),
        dir: q.path.parent().map(Path::to_path_buf).unwrap_or(dir.clone()),
        dest,
        label: format!("pid {} ({})", q.pid, q.name()),
    };
    let asked: Vec<Asked> = if args.job {
        if p.job.is_none() {
            return Err(anyhow!(InputError(format!(
                "pid {} ({}) is in no distributed job: it publishes no rank (RANK and WORLD_SIZE, as torchrun sets them)",
                args.pid,
                p.name()
            ))));
        }
        let stem = args
            .output
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("gpumem-top-snapshot-job-{}-{}", args.pid, now as u64)));
        // The job as the live view groups it: two processes claiming one
        // rank are two jobs, and only PID's is asked.
        let placed: Vec<&crate::monitor::Published> = scan.published.iter().filter(|q| q.job.is_some()).collect();
        let places: Vec<(&str, u32, u32, u32)> = placed
            .iter()
            .filter_map(|q| q.job.as_ref().map(|j| (j.job.as_str(), j.world_size, j.rank, q.pid)))
            .collect();
        let ids = crate::monitor::job::job_ids(&places);
        let mine = placed.iter().position(|q| q.pid == args.pid).map(|i| ids[i].clone());
        let mut ranks: Vec<&crate::monitor::Published> =
            placed.iter().zip(&ids).filter(|(_, id)| Some(*id) == mine.as_ref()).map(|(q, _)| *q).collect();
        ranks.sort_by_key(|q| (q.job.as_ref().map(|j| j.rank), q.device, q.pid));
        // One file per process (a rank publishing on two devices is one process).
        ranks.dedup_by_key(|q| q.pid);
        ranks
            .into_iter()
            .map(|q| {
                let r = q.job.as_ref().map_or(0, |j| j.rank);
                asked_of(q, PathBuf::from(format!("{}-rank{r}.pickle", stem.display())))
            })
            .collect()
    } else {
        let dest = args.output.clone().unwrap_or_else(|| crate::monitor::snapshot::default_name(args.pid, now));
        vec![asked_of(p, dest)]
    };
    for a in &asked {
        if std::fs::symlink_metadata(&a.dest).is_ok() {
            return Err(anyhow!(InputError(format!("{}: already exists", a.dest.display()))));
        }
        // Where the answer goes, checked before the process is asked (a full
        // `_snapshot()` costs it seconds of training).
        let parent = a.dest.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        if !parent.is_dir() {
            return Err(anyhow!(InputError(format!("{}: no such directory", parent.display()))));
        }
    }
    let answers = ask_all(&asked, Duration::from_secs(args.timeout));
    let mut failed = Vec::new();
    for (a, r) in asked.iter().zip(&answers) {
        match r {
            Ok(size) => println!(
                "{}: snapshot of {} ({}){}",
                a.dest.display(),
                a.label,
                crate::analysis::human_bytes(*size),
                if args.job {
                    String::new()
                } else {
                    format!("; open it with: gpumem-top replay {}", a.dest.display())
                }
            ),
            Err(why) => failed.push(format!("{} {why}", a.label)),
        }
    }
    let done: Vec<String> =
        asked.iter().zip(&answers).filter(|(_, r)| r.is_ok()).map(|(a, _)| a.dest.display().to_string()).collect();
    if args.job && done.len() > 1 {
        println!("open them side by side with: gpumem-top replay {}", done.join(" "));
    }
    match (failed.is_empty(), done.is_empty()) {
        (true, _) => Ok(ExitCode::SUCCESS),
        // The one process asked: its own error, as before.
        (false, true) if !args.job => Err(anyhow!(InputError(failed.join("; ")))),
        _ => Err(anyhow!(InputError(format!(
            "{} of {} did not answer (the others' files are written): {}",
            failed.len(),
            asked.len(),
            failed.join("; ")
        )))),
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

/// `gpumem-top attach PID`: injects the publisher into a running Python
/// 3.14+ process of our own through `sys.remote_exec` (PEP 768) and watches
/// it. It never runs the target's binary, and refuses another user's
/// process, root's included (docs/design/security.md).
pub fn attach(args: &AttachArgs) -> Result<ExitCode> {
    let pid = args.pid;
    let exe = launch::attach_owner(pid)?;
    // Where the hook will go: ours and private, or nothing happens.
    let dir = publish_dir(&args.publish.live)?;
    let python = launch::attach_python(pid, &exe)?;
    let thresholds = args.publish.live.thresholds()?;
    let interval = args.publish.live.interval()?;
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        return Err(anyhow!(InputError("attach opens the live view, which needs a terminal".into())));
    }
    // NVML before anything is injected: a target left publishing for a
    // view that never opened is what we must not do.
    let src = super::live::live_source(&args.publish.live)?
        .ok_or_else(|| anyhow!(InputError("no NVIDIA GPU or NVML library found".into())))?;
    // The target imports from here at its next safe point, after we have
    // returned: a fresh directory in the private publish directory, its
    // files created by us now (none planted can be there), removed when
    // we leave.
    let hook = Hook::new(&dir, "attach", &[("gpumem_top_publish.py", PUBLISHER)])?;
    let script = hook.path().join("start.py");
    {
        use std::io::Write;
        let text = args.publish.settings(&dir).attach_script(hook.path());
        crate::private::create_new(&script)?.write_all(text.as_bytes())?;
    }
    let st = std::process::Command::new(&python)
        .args(["-I", "-c", &format!("import sys; sys.remote_exec({pid}, {:?})", script.display().to_string())])
        .status()
        .with_context(|| format!("running {}", python.display()))?;
    if !st.success() {
        return Err(launch::AttachError::RemoteExec { pid, status: st.to_string() }.into());
    }
    let color = super::io::color(args.publish.no_color);
    let mut app = crate::ui::live::LiveApp::new("live (NVML)".into(), None, color);
    app.watch.model.thresholds = thresholds;
    app.snapshots = true;
    let command = crate::monitor::procfs::command(pid).unwrap_or_else(|| exe.display().to_string());
    app.follow(crate::ui::live::RunChild { pid, command, log: None, exited: None, found: false, ours: false });
    let events = crate::ui::event::Events::new();
    super::live::live_loop(&mut app, src, interval, events)?;
    Ok(ExitCode::SUCCESS)
}
