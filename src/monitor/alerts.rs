//! Alerts raised from a snapshot: a GPU nearly full, a suspected leak, a
//! fragmented cache. Shown in the status line and in JSON.

use serde::Serialize;

use super::Snapshot;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// Device used / total above this (the seeds advise 90%).
    pub device_usage: f64,
    /// Allocated bytes at the end of this many optimizer steps in a row,
    /// each higher than the one before.
    pub leak_steps: usize,
    /// Reserved-but-unallocated over this share of reserved...
    pub fragmentation: f64,
    /// ...once at least this much is reserved.
    pub fragmentation_min_reserved: u64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds { device_usage: 0.90, leak_steps: 5, fragmentation: 0.5, fragmentation_min_reserved: 1 << 30 }
    }
}

/// Every kind an alert can have.
pub(crate) const KINDS: [&str; 3] = ["device_usage", "leak", "fragmentation"];

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Alert {
    /// "device_usage", "leak" or "fragmentation".
    pub kind: &'static str,
    pub(crate) gpu: u32,
    pub(crate) pid: Option<u32>,
    pub value: f64,
    pub(crate) message: String,
}

pub fn alerts(s: &Snapshot, t: &Thresholds) -> Vec<Alert> {
    let mut out = Vec::new();
    for g in &s.gpus {
        if let (Some(used), Some(total)) = (g.used_bytes, g.total_bytes) {
            let r = used as f64 / total.max(1) as f64;
            if r > t.device_usage {
                out.push(Alert {
                    kind: "device_usage",
                    gpu: g.index,
                    pid: None,
                    value: r,
                    message: format!(
                        "GPU {} is {:.1}% full (threshold {:.0}%)",
                        g.index,
                        r * 100.0,
                        t.device_usage * 100.0
                    ),
                });
            }
        }
    }
    for p in &s.publishers {
        let n = t.leak_steps;
        if n > 0 && p.steps.len() > n {
            let tail = &p.steps[p.steps.len() - n - 1..];
            if tail.windows(2).all(|w| w[1] > w[0]) {
                let grew = tail[n] - tail[0];
                out.push(Alert {
                    kind: "leak",
                    gpu: p.device,
                    pid: Some(p.pid),
                    value: grew as f64,
                    message: format!(
                        "pid {}: allocated at step end grew {} steps in a row (+{})",
                        p.pid,
                        n,
                        crate::analysis::human_bytes(grew)
                    ),
                });
            }
        }
        let (a, r) = (p.allocated(), p.reserved());
        if r >= t.fragmentation_min_reserved {
            let share = (r - a.min(r)) as f64 / r as f64;
            if share > t.fragmentation {
                out.push(Alert {
                    kind: "fragmentation",
                    gpu: p.device,
                    pid: Some(p.pid),
                    value: share,
                    message: format!(
                        "pid {}: {:.0}% of reserved is unallocated ({})",
                        p.pid,
                        share * 100.0,
                        crate::analysis::human_bytes(r - a.min(r))
                    ),
                });
            }
        }
    }
    out
}
