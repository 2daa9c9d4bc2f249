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
    /// At the peaks, reserved never allocated over this share of peak
    /// reserved (`peak_ratio`)...
    pub fragmentation: f64,
    /// ...once the reserved peak is at least this much.
    pub fragmentation_min_reserved: u64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds { device_usage: 0.90, leak_steps: 5, fragmentation: 0.25, fragmentation_min_reserved: 1 << 30 }
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
    pub message: String,
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
        // Judged at the peaks, not now: between steps a caching allocator
        // rightly holds most of what it reserved as cache. What runs out is
        // the reserved peak; what it holds beyond the allocated peak never
        // held a tensor at once (docs/cluster.md, the same rule in Prometheus).
        let (a, r) = (p.stat("allocated_bytes.all.peak"), p.stat("reserved_bytes.all.peak"));
        if r >= t.fragmentation_min_reserved {
            let share = crate::analysis::peak_ratio_of(a, r);
            if share > t.fragmentation {
                out.push(Alert {
                    kind: "fragmentation",
                    gpu: p.device,
                    pid: Some(p.pid),
                    value: share,
                    message: format!(
                        "pid {}: at the peaks {:.0}% of reserved never held tensors (peak reserved {}, peak allocated {})",
                        p.pid,
                        share * 100.0,
                        crate::analysis::human_bytes(r),
                        crate::analysis::human_bytes(a)
                    ),
                });
            }
        }
    }
    out
}
