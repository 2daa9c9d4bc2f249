//! Alerts raised from a snapshot: a GPU nearly full, a suspected leak, a
//! cache fragmented at its peaks, cudaMalloc retries, out-of-memory errors,
//! a job whose worst rank peaks far over its median rank.
//! Shown in the status line, in JSON and as Prometheus metrics; the rules
//! are in docs/user/live.md.

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
    /// A job's worst rank's peak allocated over its median rank's by more
    /// than this share (docs/user/ranks.md).
    pub imbalance: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            device_usage: 0.90,
            leak_steps: 5,
            fragmentation: 0.25,
            fragmentation_min_reserved: 1 << 30,
            imbalance: 0.20,
        }
    }
}

/// What an alert is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertKind {
    DeviceUsage,
    Leak,
    Fragmentation,
    Retries,
    Oom,
    Imbalance,
}

impl AlertKind {
    /// Every kind, in the order metrics list them.
    pub const ALL: [AlertKind; 6] = [
        AlertKind::DeviceUsage,
        AlertKind::Leak,
        AlertKind::Fragmentation,
        AlertKind::Retries,
        AlertKind::Oom,
        AlertKind::Imbalance,
    ];

    /// As JSON and Prometheus name it.
    pub fn name(self) -> &'static str {
        match self {
            AlertKind::DeviceUsage => "device_usage",
            AlertKind::Leak => "leak",
            AlertKind::Fragmentation => "fragmentation",
            AlertKind::Retries => "retries",
            AlertKind::Oom => "oom",
            AlertKind::Imbalance => "imbalance",
        }
    }

    /// Whether the allocator's settings may be what runs out, so that what
    /// tuning a snapshot found is the hint (docs/user/tune.md).
    pub fn settings_may_help(self) -> bool {
        matches!(self, AlertKind::Fragmentation | AlertKind::Retries | AlertKind::Oom)
    }
}

/// What to do when the allocator's settings may be what runs out: no
/// setting is named until a replay of this run checked it (the live view
/// quotes what tuning the snapshot found, once it was taken: docs/user/tune.md).
const TRY_TUNE: &str = "press S to snapshot it and tune (gpumem-top tune SNAPSHOT replays it under every setting)";

/// An alert: what was seen (`fact`) and what to do about it (`hint`).
/// JSON carries both, and `message`, the two as one line.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(into = "AlertJson")]
pub struct Alert {
    pub kind: AlertKind,
    pub(crate) gpu: u32,
    pub(crate) pid: Option<u32>,
    pub value: f64,
    pub fact: String,
    pub hint: Option<String>,
}

impl Alert {
    /// The fact and the hint, as the status line shows them.
    pub fn message(&self) -> String {
        match &self.hint {
            Some(h) => format!("{}; {h}", self.fact),
            None => self.fact.clone(),
        }
    }
}

/// An alert as JSON writes it (docs/user/json.md).
#[derive(Serialize)]
struct AlertJson {
    kind: AlertKind,
    gpu: u32,
    pid: Option<u32>,
    value: f64,
    message: String,
    hint: Option<String>,
}

impl From<Alert> for AlertJson {
    fn from(a: Alert) -> AlertJson {
        let message = a.message();
        AlertJson { kind: a.kind, gpu: a.gpu, pid: a.pid, value: a.value, message, hint: a.hint }
    }
}

pub fn alerts(s: &Snapshot, t: &Thresholds) -> Vec<Alert> {
    let mut out = Vec::new();
    for g in &s.gpus {
        if let (Some(used), Some(total)) = (g.used_bytes, g.total_bytes) {
            let r = used as f64 / total.max(1) as f64;
            if r > t.device_usage {
                out.push(Alert {
                    kind: AlertKind::DeviceUsage,
                    gpu: g.index,
                    pid: None,
                    value: r,
                    fact: format!(
                        "GPU {} is {:.1}% full (threshold {:.0}%)",
                        g.index,
                        r * 100.0,
                        t.device_usage * 100.0
                    ),
                    hint: None,
                });
            }
        }
    }
    for p in &s.publishers {
        if let Some((steps, grew)) = leak(&p.steps, t.leak_steps) {
            out.push(Alert {
                kind: AlertKind::Leak,
                gpu: p.device,
                pid: Some(p.pid),
                value: grew as f64,
                fact: format!(
                    "{}: allocated at step end grew {} steps in a row (+{}), beyond the run's own variation",
                    who(p),
                    steps,
                    crate::analysis::human_bytes(grew)
                ),
                hint: None,
            });
        }
        // Judged at the peaks, not now: between steps a caching allocator
        // rightly holds most of what it reserved as cache. What runs out is
        // the reserved peak; what it holds beyond the allocated peak never
        // held a tensor at once (docs/user/cluster.md, the same rule in Prometheus).
        let (a, r) = (p.peak_allocated(), p.peak_reserved());
        if r >= t.fragmentation_min_reserved {
            let share = crate::analysis::peak_ratio_of(a, r);
            if share > t.fragmentation {
                out.push(Alert {
                    kind: AlertKind::Fragmentation,
                    gpu: p.device,
                    pid: Some(p.pid),
                    value: share,
                    fact: format!(
                        "{}: at the peaks {:.0}% of reserved never held tensors (peak reserved {}, peak allocated {})",
                        who(p),
                        share * 100.0,
                        crate::analysis::human_bytes(r),
                        crate::analysis::human_bytes(a)
                    ),
                    hint: Some(TRY_TUNE.into()),
                });
            }
        }
        // A retry is a cudaMalloc that failed until the allocator freed its
        // cache (a device-wide synchronisation each time): the process ran
        // into the device's limit. PyTorch's counters only grow, so the
        // alert stays for the rest of the run.
        let (retries, ooms) = (p.stat("num_alloc_retries"), p.stat("num_ooms"));
        let cached = r.saturating_sub(a);
        let advice = if r > 0 && crate::analysis::peak_ratio_of(a, r) > t.fragmentation {
            format!("{} reserved at the peak never held tensors; {TRY_TUNE}", crate::analysis::human_bytes(cached))
        } else {
            format!(
                "the peaks themselves do not fit ({} allocated of {} reserved): a smaller batch, activation checkpointing or mixed precision",
                crate::analysis::human_bytes(a),
                crate::analysis::human_bytes(r)
            )
        };
        if ooms > 0 {
            out.push(Alert {
                kind: AlertKind::Oom,
                gpu: p.device,
                pid: Some(p.pid),
                value: ooms as f64,
                fact: format!("{}: CUDA out of memory ({})", who(p), crate::analysis::count(ooms as usize, "time")),
                hint: Some(advice),
            });
        } else if retries > 0 {
            out.push(Alert {
                kind: AlertKind::Retries,
                gpu: p.device,
                pid: Some(p.pid),
                value: retries as f64,
                fact: format!(
                    "{}: {retries} allocation {} (cudaMalloc failed until the cache was freed, a device synchronisation each)",
                    who(p),
                    if retries == 1 { "retry" } else { "retries" }
                ),
                hint: Some(advice),
            });
        }
    }
    out.extend(imbalance(s, t));
    out
}

/// The least growth a leak alert takes: step-end allocated moves by a few
/// MiB with the shapes of each step (the optimizer's temporaries, the last
/// batch's leftovers: +6 MiB on 2.6 GB over five steps of varying-shape
/// GPT-2 training), which is no leak.
const LEAK_FLOOR: u64 = 64 << 20;

/// A leak in step-end allocated bytes (oldest first): the longest run of
/// rises ending now, at least `n` steps, that grew more than the floor and
/// more than twice the spread of the steps before it (the run's own
/// variation). Returns the steps it rose and by how much (docs/user/live.md,
/// "Alerts").
pub(crate) fn leak(ends: &[u64], n: usize) -> Option<(usize, u64)> {
    if n == 0 || ends.len() <= n {
        return None;
    }
    let rises = ends.windows(2).rev().take_while(|w| w[1] > w[0]).count();
    if rises < n {
        return None;
    }
    let start = ends.len() - 1 - rises;
    let grew = ends[ends.len() - 1] - ends[start];
    let before = &ends[start.saturating_sub(4 * n)..start];
    let spread = before.iter().max().zip(before.iter().min()).map_or(0, |(a, b)| a - b);
    (grew > LEAK_FLOOR.max(spread.saturating_mul(2))).then_some((rises, grew))
}

/// "pid 606 (ddp.py rank 1/2)" in a job, else "pid 606".
fn who(p: &super::Published) -> String {
    match &p.job {
        Some(_) => format!("pid {} ({})", p.pid, p.name()),
        None => format!("pid {}", p.pid),
    }
}

/// A job whose worst rank's peak allocated is over its median rank's by
/// more than `t.imbalance`: that rank runs out first, and the others' memory
/// cannot help it (docs/user/ranks.md).
fn imbalance(s: &Snapshot, t: &Thresholds) -> Vec<Alert> {
    let mut out = Vec::new();
    for j in super::job::jobs_in(s) {
        let Some(w) = j.ranks.iter().find(|r| r.rank == j.worst_rank) else { continue };
        if j.ranks.len() < 2 || j.imbalance <= t.imbalance {
            continue;
        }
        out.push(Alert {
            kind: AlertKind::Imbalance,
            gpu: w.gpu,
            pid: Some(w.pid),
            value: j.imbalance,
            hint: Some("give it less work or more memory".into()),
            fact: format!(
                "job {}: rank {} (pid {}) peaks at {}, {:.0}% over the median rank's {} (threshold {:.0}%): it runs out first",
                j.job,
                w.rank,
                w.pid,
                crate::analysis::human_bytes(w.peak_allocated_bytes),
                j.imbalance * 100.0,
                crate::analysis::human_bytes(j.median_peak_bytes),
                t.imbalance * 100.0
            ),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::leak;

    #[test]
    fn a_few_mib_of_step_to_step_variation_is_no_leak() {
        // Varying-shape GPT-2 training as users reported it: five rises in a
        // row, +9.1 MiB on 2.6 GB.
        let ends = [2_597_605_888, 2_598_000_000, 2_600_500_000, 2_603_000_000, 2_605_000_000, 2_607_193_600];
        assert_eq!(leak(&ends, 5), None);
        // 32 MiB kept every step: a leak at the fifth rise.
        let ends: Vec<u64> = (0..6).map(|k| 1_381_155_840 + k * (34 << 20)).collect();
        assert_eq!(leak(&ends, 5), Some((5, 5 * (34 << 20))));
        assert_eq!(leak(&ends[..5], 5), None, "four rises are not five");
    }

    #[test]
    fn a_rise_within_the_runs_own_spread_is_no_leak() {
        // Steps that swing by 200 MiB, then six rises of 15 MiB each: 90 MiB
        // is over the floor but inside what the run did before.
        let mut ends: Vec<u64> = (0..20).map(|k| (4 << 30) + if k % 2 == 0 { 0 } else { 200 << 20 }).collect();
        let base = ends[19];
        ends.extend((1..=6).map(|k| base + k * (15 << 20)));
        assert_eq!(leak(&ends, 5), None);
        // The same rises after a steady run are a leak.
        let mut steady: Vec<u64> = vec![4 << 30; 20];
        steady.extend((1..=6).map(|k| (4 << 30) + k * (15 << 20)));
        assert_eq!(leak(&steady, 5), Some((6, 90 << 20)));
    }
}
