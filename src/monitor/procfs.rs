//! Process names and PID namespaces from /proc. NVML reports PIDs in the
//! host's namespace; inside a container the same process has another PID,
//! found through the `NSpid:` line of /proc/<pid>/status (outermost first).

use std::collections::HashMap;
use std::path::Path;

/// NVML PID → PID visible here.
#[derive(Debug, Default, Clone)]
pub(crate) struct PidMap {
    outer_to_local: HashMap<u32, u32>,
    scanned: Option<std::time::Instant>,
}

/// A PID from another container stays invisible: rescan /proc for it at
/// most this often.
const RESCAN_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// The PIDs of `status` text's NSpid line, outermost first.
pub(crate) fn nspids(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map(|r| r.split_whitespace().filter_map(|p| p.parse().ok()).collect())
        .unwrap_or_default()
}

impl PidMap {
    /// Rescans /proc when a PID is neither visible nor mapped.
    pub(crate) fn refresh_if_missing(&mut self, pids: impl Iterator<Item = u32>) {
        if self.scanned.is_some_and(|t| t.elapsed() < RESCAN_EVERY) {
            return;
        }
        let missing = pids.into_iter().any(|p| !self.outer_to_local.contains_key(&p) && !exists(p));
        if missing {
            self.scanned = Some(std::time::Instant::now());
            self.rescan(Path::new("/proc"));
        }
    }

    pub(crate) fn rescan(&mut self, proc_root: &Path) {
        self.outer_to_local.clear();
        let Ok(rd) = std::fs::read_dir(proc_root) else { return };
        for e in rd.flatten() {
            let Some(local) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            let Ok(st) = std::fs::read_to_string(e.path().join("status")) else { continue };
            let ns = nspids(&st);
            // The outermost PID we can see is the first; NVML's is the
            // host's, which is that one when we run on the host.
            if let Some(&outer) = ns.first() {
                if outer != local {
                    self.outer_to_local.insert(outer, local);
                }
            }
        }
    }

    /// The PID here of NVML's `pid`, if the process is visible.
    pub(crate) fn local(&self, pid: u32) -> Option<u32> {
        self.outer_to_local.get(&pid).copied().or_else(|| exists(pid).then_some(pid))
    }
}

fn exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Field 22 of /proc/PID/stat: when the process started, in clock ticks
/// since boot (the same number from every pid namespace), if it is running
/// (not a zombie).
pub(crate) fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command's closing parenthesis (the name itself
    // may hold one): state is the first, start time the twentieth.
    let rest = &stat[stat.iter().rposition(|&b| b == b')')? + 1..];
    let mut fields = rest.split(|b| b.is_ascii_whitespace()).filter(|f| !f.is_empty());
    if matches!(fields.next(), Some(b"Z" | b"X")) {
        return None;
    }
    std::str::from_utf8(fields.nth(18)?).ok()?.parse().ok()
}

/// The inode of a process's pid namespace (`/proc/PID/ns/pid` reads
/// `pid:[4026531836]`): the same number from every namespace.
pub(crate) fn pid_ns(pid: u32) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()?;
    link.to_str()?.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
}

/// What a publisher's file says of its writer: the pid it knows itself by,
/// its start time, and its pid namespace's inode when it gave one.
pub(crate) struct Writer {
    pub(crate) inner: u32,
    pub(crate) ticks: u64,
    pub(crate) pid_ns: Option<u64>,
}

impl Writer {
    /// Whether `pid` here is a running process of the writer's start time
    /// and pid namespace: two containers' trainers may start in one tick
    /// (on the H200 machine, two pods started together did).
    pub(crate) fn started(&self, pid: u32) -> bool {
        start_ticks(pid) == Some(self.ticks) && self.pid_ns.is_none_or(|n| pid_ns(pid) == Some(n))
    }

    /// `started`, and `pid` knows itself as the writer does (the innermost
    /// of its NSpid).
    pub(crate) fn is(&self, pid: u32) -> bool {
        self.started(pid)
            && std::fs::read_to_string(format!("/proc/{pid}/status"))
                .is_ok_and(|st| nspids(&st).last().is_some_and(|&q| q == self.inner))
    }

    /// The writer's pid in our namespace (a container's pid 1 seen from the
    /// host): one pass over /proc.
    pub(crate) fn find(&self) -> Option<u32> {
        let rd = std::fs::read_dir("/proc").ok()?;
        rd.flatten().filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok()).find(|&pid| self.is(pid))
    }
}

/// The process's name as its publisher gives it (`program_name` of its
/// command line), or `comm`.
pub(crate) fn command(pid: u32) -> Option<String> {
    if let Ok(c) = std::fs::read(format!("/proc/{pid}/cmdline")) {
        let args: Vec<String> = c
            .split(|&b| b == 0)
            .filter(|p| !p.is_empty())
            .take(64)
            .map(|p| String::from_utf8_lossy(p).into())
            .collect();
        if !args.is_empty() {
            return Some(printable(&program_name(&args)));
        }
    }
    std::fs::read_to_string(format!("/proc/{pid}/comm")).ok().map(|s| printable(s.trim()))
}

/// Another user's command line without the control characters a terminal
/// or a scraper would act on (docs/design/security.md).
fn printable(s: &str) -> String {
    s.chars().filter(|c| !c.is_control()).collect()
}

fn base(s: &str) -> &str {
    s.rsplit('/').next().unwrap_or(s)
}

/// The name people call a program by: for a Python interpreter the
/// script's file name (`ddp.py` for `python3 -u ddp.py --lr 1`, as the
/// publisher names itself from `sys.argv[0]`) or the module of `-m`; for
/// anything else the program and its first argument (`torchrun ddp.py`).
pub(crate) fn program_name(args: &[String]) -> String {
    let Some(first) = args.first() else { return String::new() };
    let prog = base(first);
    if !prog.starts_with("python") {
        return args.iter().take(2).map(|a| base(a)).collect::<Vec<_>>().join(" ");
    }
    let mut it = args[1..].iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            // Options that take the next word.
            "-X" | "-W" | "--check-hash-based-pycs" => {
                it.next();
            }
            "-m" => return it.next().map_or(prog.to_string(), |m| m.clone()),
            "-c" => return format!("{prog} -c"),
            "-" => return prog.to_string(),
            o if o.starts_with('-') => {}
            script => return base(script).to_string(),
        }
    }
    prog.to_string()
}

/// The parent of `pid` (field 4 of /proc/PID/stat, after the command's
/// closing parenthesis, which the command itself may contain).
fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// True when `pid` is `ancestor` or one of its descendants (the ranks
/// `torchrun` starts under the command `run` started).
pub(crate) fn descends_from(pid: u32, ancestor: u32) -> bool {
    let mut p = pid;
    for _ in 0..64 {
        if p == ancestor {
            return true;
        }
        match parent(p) {
            Some(q) if q > 1 && q != p => p = q,
            _ => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn we_descend_from_our_parent_and_not_it_from_us() {
        let me = std::process::id();
        let parent = super::parent(me).unwrap();
        assert!(super::descends_from(me, me));
        assert!(super::descends_from(me, parent));
        assert!(!super::descends_from(parent, me));
    }

    #[test]
    fn a_python_process_is_named_by_its_script_or_module() {
        let name = |a: &[&str]| program_name(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(name(&["/usr/bin/python3", "-u", "/w/ddp.py", "--lr", "1"]), "ddp.py");
        assert_eq!(name(&["python3.11", "-X", "faulthandler", "-W", "ignore", "train.py"]), "train.py");
        assert_eq!(name(&["python", "-m", "torch.distributed.run", "ddp.py"]), "torch.distributed.run");
        assert_eq!(name(&["python3", "-c", "import torch"]), "python3 -c");
        assert_eq!(name(&["python3"]), "python3");
        assert_eq!(name(&["/opt/bin/torchrun", "--nproc_per_node", "2"]), "torchrun --nproc_per_node");
        assert_eq!(name(&["/usr/bin/nvidia-smi"]), "nvidia-smi");
    }

    /// Another user's command line (argv, from /proc) reaches labels and
    /// screens without its control characters.
    #[test]
    fn a_command_line_with_escapes_is_read_without_them() {
        use std::os::unix::process::CommandExt;
        let mut child =
            std::process::Command::new("sleep").arg0("\u{1b}]0;pwned\u{7}evil\u{9b}2J").arg("30").spawn().unwrap();
        // Until the exec is done, /proc shows the parent's command line.
        let mut got = None;
        for _ in 0..200 {
            got = command(child.id());
            if got.as_deref().is_some_and(|g| g.contains("pwned")) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        let got = got.unwrap();
        assert!(!got.chars().any(char::is_control), "{got:?}");
        assert!(got.contains("]0;pwnedevil"), "{got:?}");
    }

    /// A writer is the process of its start time in its pid namespace:
    /// the same start time in another namespace (two pods started in one
    /// tick) is another process.
    #[test]
    fn a_writer_is_told_by_start_time_and_pid_namespace() {
        let me = std::process::id();
        let (t, ns) = (start_ticks(me).unwrap(), pid_ns(me).unwrap());
        assert!(Writer { inner: me, ticks: t, pid_ns: Some(ns) }.is(me));
        assert!(Writer { inner: me, ticks: t, pid_ns: None }.is(me));
        assert!(!Writer { inner: me, ticks: t, pid_ns: Some(ns + 1) }.started(me));
        assert!(!Writer { inner: me, ticks: t + 1, pid_ns: Some(ns) }.started(me));
        assert!(!Writer { inner: me + 1, ticks: t, pid_ns: Some(ns) }.is(me));
    }

    #[test]
    fn nspid_lines_give_the_outermost_pid_first() {
        assert_eq!(nspids("Name:\tpython\nNSpid:\t48213\t7\nUid:\t0"), vec![48213, 7]);
        assert_eq!(nspids("NSpid:\t12\n"), vec![12]);
        assert!(nspids("Name: x\n").is_empty());
    }

    #[test]
    fn a_fake_proc_tree_maps_host_pids_to_ours() {
        let d = std::env::temp_dir().join(format!("gpumem-procfs-{}", std::process::id()));
        for (local, ns) in [(7u32, "48213\t7"), (9, "9")] {
            std::fs::create_dir_all(d.join(local.to_string())).unwrap();
            std::fs::write(d.join(local.to_string()).join("status"), format!("NSpid:\t{ns}\n")).unwrap();
        }
        let mut m = PidMap::default();
        m.rescan(&d);
        assert_eq!(m.outer_to_local.get(&48213), Some(&7));
        assert_eq!(m.outer_to_local.len(), 1);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
