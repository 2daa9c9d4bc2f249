//! Starting the user's Python with our publisher in it: the hook directory
//! Python loads first (`run`, `fit --batches`), injection into a running
//! process (`attach`, PEP 768), and passing signals on to the command
//! (docs/user/live.md "run", docs/design/security.md).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The publisher every hook carries (the pip package's own module).
pub(crate) const PUBLISHER: &str = include_str!("../python/gpumem_top/_publish.py");
/// `run`'s hook: starts the publisher in every Python the command starts.
pub(crate) const RUN_SITECUSTOMIZE: &str = include_str!("../assets/python/run/sitecustomize.py");
/// `fit --batches`' hook: records memory history for a few steps and
/// writes a snapshot.
pub(crate) const RECORD_SITECUSTOMIZE: &str = include_str!("../assets/python/record/sitecustomize.py");
/// `fit --no-gpu`'s hook: CUDA faked, the allocator's requests recorded
/// (docs/user/fit.md "Without a GPU").
pub(crate) const NOGPU_SITECUSTOMIZE: &str = include_str!("../assets/python/nogpu/sitecustomize.py");
pub(crate) const NOGPU_RECORDER: &str = include_str!("../assets/python/nogpu/gpumem_top_nogpu.py");

/// The hook's directory: fresh (a random name made now) inside a private
/// directory, so that nobody else can create it again after we remove it
/// while the command's descendants (DataLoader workers, compile workers,
/// relaunched ranks) still start Python with it on their PYTHONPATH
/// (docs/design/security.md). Removed when dropped.
pub(crate) struct Hook(PathBuf);

impl Hook {
    /// A fresh `PREFIX-…` directory in `private_dir` holding `files`
    /// (name, text), each created new.
    pub(crate) fn new(private_dir: &Path, prefix: &str, files: &[(&str, &str)]) -> std::io::Result<Hook> {
        use std::io::Write;
        let dir = crate::private::fresh_dir(private_dir, prefix).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("cannot create the hook's directory in {}: {e}", private_dir.display()),
            )
        })?;
        let hook = Hook(dir);
        for (name, text) in files {
            crate::private::create_new(&hook.0.join(name))?.write_all(text.as_bytes())?;
        }
        Ok(hook)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Hook {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// PYTHONPATH with `hook` first, then whatever the user had.
pub(crate) fn python_path(hook: &Path) -> OsString {
    let mut path = hook.as_os_str().to_owned();
    if let Some(p) = std::env::var_os("PYTHONPATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(p);
    }
    path
}

/// Passes SIGTERM, SIGHUP and SIGQUIT sent to us (`docker stop`, a
/// scheduler, systemd), and a SIGINT sent by `kill`, on to the command
/// while it runs; a terminal's Ctrl-C already reaches its process group.
/// We keep recording until it exits (`done`).
pub(crate) fn forward_signals(pid: u32, done: Arc<AtomicBool>) -> std::io::Result<signal_hook::iterator::Handle> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
    use signal_hook::iterator::exfiltrator::WithOrigin;
    use signal_hook::iterator::SignalsInfo;
    use signal_hook::low_level::siginfo::Cause;
    let mut signals = SignalsInfo::<WithOrigin>::new([SIGINT, SIGTERM, SIGHUP, SIGQUIT])?;
    let handle = signals.handle();
    std::thread::Builder::new().name("gpumem-signals".into()).spawn(move || {
        for info in signals.forever() {
            if info.signal == SIGINT && !matches!(info.cause, Cause::Sent(_)) {
                continue;
            }
            if done.load(Ordering::Relaxed) {
                continue;
            }
            // SAFETY: kill(2) touches no memory of ours. The pid is the
            // command we started; `done` is set the moment it is reaped,
            // so a signal racing that instant is the only way to reach a
            // reused pid, which the kernel does not hand out that soon.
            unsafe { libc::kill(pid as libc::pid_t, info.signal) };
        }
    })?;
    Ok(handle)
}

/// The command as a status line names it: its first two words without
/// their directories ("python3 train.py …").
pub(crate) fn shown_command(argv: &[String]) -> String {
    let base = |a: &String| Path::new(a).file_name().map_or_else(|| a.clone(), |n| n.to_string_lossy().into_owned());
    let mut s = argv.iter().take(2).map(base).collect::<Vec<_>>().join(" ");
    if argv.len() > 2 {
        s.push_str(" …");
    }
    s
}

/// The exit code that passes a command's on: its own, or 128 + the signal.
pub(crate) fn exit_code_of(st: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => c.clamp(0, 255) as u8,
        (None, Some(s)) => (128 + s).clamp(0, 255) as u8,
        _ => 1,
    }
}

/// What `attach` tells the user to do instead of attaching.
const ATTACH_INSTEAD: &str = "start it with `gpumem-top run -- CMD`, or call gpumem_top.publish() in it";

/// Why `attach` will not or cannot ask a process to publish. Exit code 2:
/// the process is not one we may or can attach to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    #[error("pid {pid}: {why} (no such process, or not ours)")]
    NoProcess { pid: u32, why: String },
    #[error("pid {pid} runs as uid {uid}, not as us (uid {me}): attach only to your own processes (run gpumem-top as that user); {ATTACH_INSTEAD}")]
    NotOurs { pid: u32, uid: u32, me: u32 },
    #[error("pid {pid} ({exe}) is not a Python we can ask; {ATTACH_INSTEAD}")]
    NotPython { pid: u32, exe: String },
    #[error("pid {pid} runs Python {major}.{minor} ({exe}); attaching needs Python 3.14 or later (sys.remote_exec); {ATTACH_INSTEAD}")]
    OldPython { pid: u32, major: u32, minor: u32, exe: String },
    #[error("pid {pid} runs Python {major}.{minor}: attaching needs python{major}.{minor} on our PATH (the target's own binary is never run); {ATTACH_INSTEAD}")]
    NoPythonHere { pid: u32, major: u32, minor: u32 },
    #[error("sys.remote_exec into pid {pid} failed ({status}): debugging another process needs ptrace permission (/proc/sys/kernel/yama/ptrace_scope); {ATTACH_INSTEAD}")]
    RemoteExec { pid: u32, status: String },
}

impl AttachError {
    pub fn exit_code(&self) -> u8 {
        2
    }
}

/// Checks `pid` for `attach`: a process of our own uid (root's refused
/// too, docs/design/security.md); its executable.
pub(crate) fn attach_owner(pid: u32) -> Result<PathBuf, AttachError> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map_err(|e| AttachError::NoProcess { pid, why: e.to_string() })?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    match process_uid(pid) {
        Some(uid) if uid == me => Ok(exe),
        Some(uid) => Err(AttachError::NotOurs { pid, uid, me }),
        None => Err(AttachError::NoProcess { pid, why: "no such process".into() }),
    }
}

/// Our own interpreter of the Python that `pid` (running `exe`) runs, 3.14
/// or later, to ask it with `sys.remote_exec`; never the target's binary.
pub(crate) fn attach_python(pid: u32, exe: &Path) -> Result<PathBuf, AttachError> {
    let shown = exe.display().to_string();
    let Some((major, minor)) = target_python(pid, exe) else {
        return Err(AttachError::NotPython { pid, exe: shown });
    };
    if (major, minor) < (3, 14) {
        return Err(AttachError::OldPython { pid, major, minor, exe: shown });
    }
    our_python((major, minor)).ok_or(AttachError::NoPythonHere { pid, major, minor })
}

/// The Python version a process runs, as (major, minor), read from what it
/// mapped (`libpythonX.Y`) or its executable's name (`pythonX.Y`): never by
/// running its binary, which another user may have written.
pub(crate) fn target_python(pid: u32, exe: &Path) -> Option<(u32, u32)> {
    fn version_in(s: &str, word: &str) -> Option<(u32, u32)> {
        let rest = &s[s.find(word)? + word.len()..];
        let (major, rest) = rest.split_once('.')?;
        let minor: String = rest.chars().take_while(char::is_ascii_digit).collect();
        Some((major.parse().ok()?, minor.parse().ok()?))
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    maps.lines()
        .find_map(|l| version_in(l.rsplit('/').next().unwrap_or(""), "libpython"))
        .or_else(|| version_in(&exe.file_name()?.to_string_lossy(), "python"))
}

/// The uid a process runs as (its real uid, from /proc/PID/status).
pub(crate) fn process_uid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|l| l.split_whitespace().next()?.parse().ok())
}

/// `pythonX.Y` on our own PATH: the interpreter that asks the target to
/// run the publisher (sys.remote_exec needs the target's version).
pub(crate) fn our_python(version: (u32, u32)) -> Option<PathBuf> {
    let name = format!("python{}.{}", version.0, version.1);
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(&name)).find(|p| p.is_file())
}

/// How a publisher is started: where it writes and what it publishes.
pub(crate) struct PublisherSettings<'a> {
    pub(crate) directory: &'a Path,
    pub(crate) interval_ms: u64,
    pub(crate) step_peaks: bool,
    pub(crate) history: Option<u64>,
}

impl PublisherSettings<'_> {
    /// The environment `run`'s hook reads.
    pub(crate) fn environment(&self) -> Vec<(&'static str, OsString)> {
        vec![
            ("GPUMEM_TOP_RUN", "1".into()),
            ("GPUMEM_TOP_DIR", self.directory.as_os_str().to_owned()),
            ("GPUMEM_TOP_INTERVAL", format!("{}", self.interval_ms as f64 / 1000.0).into()),
            ("GPUMEM_TOP_STEP_PEAKS", if self.step_peaks { "1" } else { "0" }.into()),
            ("GPUMEM_TOP_HISTORY", self.history.unwrap_or(0).to_string().into()),
        ]
    }

    /// The script `attach` has the target run at its next safe point:
    /// import the publisher from `hook` and start it once CUDA is.
    pub(crate) fn attach_script(&self, hook: &Path) -> String {
        format!(
            "import sys\nsys.path.insert(0, {hook:?})\nimport gpumem_top_publish as g, torch\n\
             torch.cuda._lazy_call(lambda: g.start(interval={interval}, directory={dir:?}, step_peaks={peaks}, history={history}))\n",
            hook = hook.display().to_string(),
            interval = self.interval_ms as f64 / 1000.0,
            dir = self.directory.display().to_string(),
            peaks = if self.step_peaks { "True" } else { "False" },
            history = self.history.map_or("None".to_string(), |h| h.to_string()),
        )
    }
}
