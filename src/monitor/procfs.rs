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

/// The process's command: its command line's program name and first
/// argument (`python train.py`), or `comm`.
pub(crate) fn command(pid: u32) -> Option<String> {
    if let Ok(c) = std::fs::read(format!("/proc/{pid}/cmdline")) {
        let parts: Vec<String> = c
            .split(|&b| b == 0)
            .filter(|p| !p.is_empty())
            .take(2)
            .map(|p| {
                let s = String::from_utf8_lossy(p);
                s.rsplit('/').next().unwrap_or(&s).to_string()
            })
            .collect();
        if !parts.is_empty() {
            return Some(parts.join(" "));
        }
    }
    std::fs::read_to_string(format!("/proc/{pid}/comm")).ok().map(|s| s.trim().to_string())
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
