//! Prometheus text exposition (format 0.0.4) of a snapshot: per GPU, per
//! process on it, and per process that publishes its allocator state.

use std::fmt::Write;

use crate::monitor::alerts::Alert;
use crate::monitor::Snapshot;

/// Escapes a label value: backslash, double quote and newline, the three
/// the format escapes; any other control character (a process's command
/// line is another user's text) is dropped (docs/design/security.md).
fn esc(s: &str) -> String {
    s.chars()
        .filter(|&c| c == '\n' || !c.is_control())
        .collect::<String>()
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Out {
    text: String,
}

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }
    fn sample(&mut self, name: &str, labels: &[(&str, String)], v: f64) {
        let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", esc(v))).collect();
        if v.fract() == 0.0 && v.abs() < 9e15 {
            let _ = writeln!(self.text, "{name}{{{}}} {}", l.join(","), v as i64);
        } else {
            let _ = writeln!(self.text, "{name}{{{}}} {v}", l.join(","));
        }
    }
}

/// The exposition of `snap`; `alerts` become `gpumem_alert` series.
pub fn exposition(snap: &Snapshot, alerts: &[Alert]) -> String {
    let mut o = Out { text: String::new() };
    gpus(&mut o, snap);
    processes(&mut o, snap);
    torch(&mut o, snap);
    jobs(&mut o, snap);
    alerted(&mut o, snap, alerts);
    o.text
}

/// One label set per process, in every family: a publishing process's own
/// (its pid as it knows itself, its program, rank and job); another NVML's,
/// rank and job empty (which Prometheus reads as absent). The job is
/// `torch_job`: Prometheus's `job` is the scrape target's, and ours would
/// arrive renamed `exported_job` (docs/user/ranks.md).
fn process_labels(p: &crate::monitor::Published) -> Vec<(&'static str, String)> {
    vec![
        ("gpu", p.device.to_string()),
        ("pid", p.pid.to_string()),
        ("command", p.command.clone().unwrap_or_default()),
        ("rank", p.job.as_ref().map_or(String::new(), |j| j.rank.to_string())),
        ("torch_job", p.job.as_ref().map_or(String::new(), |j| j.job.clone())),
    ]
}

/// What NVML says of each GPU.
fn gpus(o: &mut Out, snap: &Snapshot) {
    let gpu_l = |g: &crate::monitor::GpuSample| {
        vec![("gpu", g.index.to_string()), ("name", g.name.clone().unwrap_or_default())]
    };
    type GpuField = fn(&crate::monitor::GpuSample) -> Option<f64>;
    let gpu_metrics: [(&str, &str, GpuField); 4] = [
        ("gpumem_gpu_memory_total_bytes", "Device memory (NVML).", |g| g.total_bytes.map(|x| x as f64)),
        ("gpumem_gpu_memory_used_bytes", "Device memory in use, all processes (NVML).", |g| {
            g.used_bytes.map(|x| x as f64)
        }),
        ("gpumem_gpu_memory_free_bytes", "Device memory free (NVML).", |g| g.free_bytes.map(|x| x as f64)),
        ("gpumem_gpu_utilization_ratio", "Share of time a kernel ran, 0-1 (NVML).", |g| {
            g.utilization_percent.map(|x| x as f64 / 100.0)
        }),
    ];
    for (name, help, f) in gpu_metrics {
        o.family(name, "gauge", help);
        for g in &snap.gpus {
            // A field NVML cannot give is left out, not reported as 0.
            if let Some(v) = f(g) {
                o.sample(name, &gpu_l(g), v);
            }
        }
    }
}

/// What NVML says of each process, and what a publisher holds outside its
/// caching allocator.
fn processes(o: &mut Out, snap: &Snapshot) {
    let pl = process_labels;
    o.family("gpumem_process_memory_used_bytes", "gauge", "Device memory a process holds, context included (NVML).");
    for g in &snap.gpus {
        for p in &g.processes {
            if let Some(u) = p.used_bytes {
                let l = match snap.publishers.iter().find(|x| x.device == g.index && x.matches(p)) {
                    Some(x) => pl(x),
                    None => vec![
                        ("gpu", g.index.to_string()),
                        ("pid", p.local_pid.unwrap_or(p.pid).to_string()),
                        ("command", p.command.clone().unwrap_or_default()),
                        ("rank", String::new()),
                        ("torch_job", String::new()),
                    ],
                };
                o.sample("gpumem_process_memory_used_bytes", &l, u as f64);
            }
        }
    }
    o.family(
        "gpumem_process_outside_allocator_bytes",
        "gauge",
        "Device memory NVML counts for a publishing process beyond what its caching allocator reserved: the CUDA context, NCCL and other libraries' allocations.",
    );
    for p in &snap.publishers {
        if let Some(v) = crate::monitor::job::outside_allocator(snap.nvml_used_of(p), p.reserved()) {
            o.sample("gpumem_process_outside_allocator_bytes", &pl(p), v as f64);
        }
    }
}

/// What each publisher's allocator says (`torch.cuda.memory_stats()`), the
/// figures derived from it, and its categories.
fn torch(o: &mut Out, snap: &Snapshot) {
    let pl = process_labels;
    let torch: [(&str, &str, &str, &str); 13] = [
        ("gpumem_torch_allocated_bytes", "gauge", "allocated_bytes.all.current", "Bytes in live tensors."),
        ("gpumem_torch_allocated_peak_bytes", "gauge", "allocated_bytes.all.peak", "Peak of allocated bytes."),
        ("gpumem_torch_reserved_bytes", "gauge", "reserved_bytes.all.current", "Bytes the caching allocator holds."),
        ("gpumem_torch_reserved_peak_bytes", "gauge", "reserved_bytes.all.peak", "Peak of reserved bytes."),
        ("gpumem_torch_active_bytes", "gauge", "active_bytes.all.current", "Allocated plus pending-free bytes."),
        (
            "gpumem_torch_inactive_split_bytes",
            "gauge",
            "inactive_split_bytes.all.current",
            "Free bytes in segments that also hold live blocks.",
        ),
        ("gpumem_torch_requested_bytes", "gauge", "requested_bytes.all.current", "Bytes asked for (before rounding)."),
        ("gpumem_torch_segments", "gauge", "segment.all.current", "Segments held."),
        ("gpumem_torch_num_ooms_total", "counter", "num_ooms", "Out-of-memory errors raised."),
        (
            "gpumem_torch_num_alloc_retries_total",
            "counter",
            "num_alloc_retries",
            "Allocations that freed the cache and retried.",
        ),
        (
            "gpumem_torch_num_device_alloc_total",
            "counter",
            "num_device_alloc",
            "cudaMalloc calls (or page-range maps).",
        ),
        ("gpumem_torch_num_device_free_total", "counter", "num_device_free", "cudaFree calls (or unmaps)."),
        (
            "gpumem_torch_num_oom_rejections_total",
            "counter",
            "num_oom_rejections",
            "Allocations throw_on_cudamalloc_oom refused before any retry (PyTorch 2.12+).",
        ),
    ];
    for (name, kind, key, help) in torch {
        o.family(name, kind, &format!("{help} (torch.cuda.memory_stats {key})"));
        for p in &snap.publishers {
            if let Some(&v) = p.stats.get(key) {
                // Peaks are the true ones, kept across resets of PyTorch's
                // counters (docs/user/live.md).
                let v = match key {
                    "allocated_bytes.all.peak" => p.peak_allocated() as f64,
                    "reserved_bytes.all.peak" => p.peak_reserved() as f64,
                    _ => v as f64,
                };
                o.sample(name, &pl(p), v);
            }
        }
    }
    private_pools(o, snap);
    type Derived = fn(&crate::analysis::Fragmentation, &crate::monitor::Published) -> f64;
    let derived: [(&str, &str, Derived); 4] = [
        ("gpumem_torch_reserved_unallocated_bytes", "Reserved minus allocated, now.", |f, _| {
            f.reserved_unallocated_bytes as f64
        }),
        ("gpumem_torch_rounding_waste_bytes", "Allocated minus requested, now.", |f, _| f.rounding_waste_bytes as f64),
        ("gpumem_torch_external_fragmentation_ratio", "1 - largest free block / free bytes, now.", |f, _| {
            f.external_fragmentation
        }),
        ("gpumem_torch_peak_ratio", "1 - peak allocated / peak reserved.", |_, p| {
            crate::analysis::peak_ratio_of(p.peak_allocated(), p.peak_reserved())
        }),
    ];
    let frags: Vec<_> = snap.publishers.iter().map(|p| p.fragmentation()).collect();
    for (name, help, f) in derived {
        o.family(name, "gauge", help);
        for (p, fr) in snap.publishers.iter().zip(&frags) {
            o.sample(name, &pl(p), f(fr, p));
        }
    }
    o.family(
        "gpumem_torch_step_end_allocated_bytes",
        "gauge",
        "Allocated bytes at the end of the latest optimizer step (the leak judgement's input).",
    );
    for p in &snap.publishers {
        if let Some(&v) = p.steps.last() {
            o.sample("gpumem_torch_step_end_allocated_bytes", &pl(p), v as f64);
        }
    }
    o.family(
        "gpumem_torch_category_bytes",
        "gauge",
        "What the optimizer held at a recent step's end, by category: parameter, gradient, optimizer_state, and rest (allocated then, less those); docs/user/categories.md.",
    );
    for p in &snap.publishers {
        if let Some(c) = p.categories {
            let rest = c.bytes().get(crate::analysis::categories::Category::Unknown);
            for (cat, v) in [
                ("parameter", c.parameter),
                ("gradient", c.gradient),
                ("optimizer_state", c.optimizer_state),
                ("rest", rest),
            ] {
                let mut l = pl(p);
                l.push(("category", cat.to_string()));
                o.sample("gpumem_torch_category_bytes", &l, v as f64);
            }
        }
    }
}

/// PyTorch 2.13's `reserved_bytes_by_private_pools.<a>_<b>.all.*`: a
/// series per process and private pool (a CUDA graph's, a `MemPool`'s).
fn private_pools(o: &mut Out, snap: &Snapshot) {
    for (name, field, help) in [
        ("gpumem_torch_private_pool_reserved_bytes", "current", "Bytes a private pool holds"),
        ("gpumem_torch_private_pool_reserved_peak_bytes", "peak", "Peak of the bytes a private pool held"),
    ] {
        o.family(
            name,
            "gauge",
            &format!(
                "{help} (torch.cuda.memory_stats reserved_bytes_by_private_pools.<pool>.all.{field}, PyTorch 2.13+)."
            ),
        );
        for p in &snap.publishers {
            for (k, &v) in &p.stats {
                let Some(pool) = k
                    .strip_prefix("reserved_bytes_by_private_pools.")
                    .and_then(|r| r.strip_suffix(&format!(".all.{field}") as &str))
                else {
                    continue;
                };
                let mut l = process_labels(p);
                l.push(("pool", pool.to_string()));
                o.sample(name, &l, v as f64);
            }
        }
    }
}

/// Each distributed job's median rank and imbalance.
fn jobs(o: &mut Out, snap: &Snapshot) {
    let jobs = crate::monitor::job::jobs_in(snap);
    o.family(
        "gpumem_job_median_peak_bytes",
        "gauge",
        "The median of a distributed job's ranks' peak allocated bytes (docs/user/ranks.md).",
    );
    for j in &jobs {
        o.sample("gpumem_job_median_peak_bytes", &[("torch_job", j.job.clone())], j.median_peak_bytes as f64);
    }
    o.family(
        "gpumem_job_imbalance_ratio",
        "gauge",
        "How far a job's worst rank's peak allocated is over its median rank's (0.2 is 20%); rank is the worst.",
    );
    for j in &jobs {
        let l = [("torch_job", j.job.clone()), ("rank", j.worst_rank.to_string())];
        o.sample("gpumem_job_imbalance_ratio", &l, j.imbalance);
    }
}

/// The alerts raised now, and the publisher files ignored.
fn alerted(o: &mut Out, snap: &Snapshot, alerts: &[Alert]) {
    // One series per kind, 0 when quiet, so dashboards and rules see a
    // steady series rather than one that appears and vanishes.
    o.family("gpumem_alerts_active", "gauge", "Alerts raised now, per kind (0 when none).");
    for kind in crate::monitor::alerts::AlertKind::ALL {
        let n = alerts.iter().filter(|a| a.kind == kind).count();
        o.sample("gpumem_alerts_active", &[("kind", kind.name().to_string())], n as f64);
    }
    o.family(
        "gpumem_alert",
        "gauge",
        &format!(
            "1 for each alert raised now (kind: {}).",
            crate::monitor::alerts::AlertKind::ALL.map(|k| k.name()).join(", ")
        ),
    );
    for a in alerts {
        let l = [
            ("kind", a.kind.name().to_string()),
            ("gpu", a.gpu.to_string()),
            ("pid", a.pid.map_or(String::new(), |p| p.to_string())),
        ];
        o.sample("gpumem_alert", &l, 1.0);
    }
    o.family(
        "gpumem_publisher_files_ignored",
        "gauge",
        "Publisher files ignored in the last scan (foreign, oversized, malformed).",
    );
    o.sample("gpumem_publisher_files_ignored", &[], snap.skipped.len() as f64);
}

#[cfg(test)]
mod tests {
    /// The statistics 2.12 and 2.13 added are exposed under their
    /// PyTorch names; a process on an older release just has no series.
    #[test]
    fn later_releases_statistics_are_exposed() {
        let file = r#"{"version":1,"pid":7,"device":0,"time":1.0,"interval":0.5,"stats":{
            "num_oom_rejections":3,
            "reserved_bytes_by_private_pools.1_0.all.current":20971520,
            "reserved_bytes_by_private_pools.1_0.all.peak":41943040,
            "reserved_bytes_by_private_pools.0_2.all.current":0,
            "reserved_bytes_by_private_pools.0_2.all.peak":2097152}}"#;
        let p = crate::monitor::publisher::parse_bytes(file.as_bytes(), std::path::Path::new("7-0.json")).unwrap();
        let snap = crate::monitor::Snapshot { time: 1.0, publishers: vec![p], ..Default::default() };
        let text = super::exposition(&snap, &[]);
        let line = |prefix: &str| {
            text.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("{prefix}\n{text}")).to_string()
        };
        assert!(line("gpumem_torch_num_oom_rejections_total{").ends_with(" 3"));
        assert!(text.contains("# TYPE gpumem_torch_private_pool_reserved_bytes gauge"));
        assert!(line("gpumem_torch_private_pool_reserved_bytes{").contains("pool=\"0_2\""));
        let s = |pool: &str, name: &str| {
            text.lines()
                .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(&format!("pool=\"{pool}\"")))
                .map(|l| l.rsplit(' ').next().unwrap().to_string())
        };
        assert_eq!(s("1_0", "gpumem_torch_private_pool_reserved_bytes").as_deref(), Some("20971520"));
        assert_eq!(s("1_0", "gpumem_torch_private_pool_reserved_peak_bytes").as_deref(), Some("41943040"));
        assert_eq!(s("0_2", "gpumem_torch_private_pool_reserved_peak_bytes").as_deref(), Some("2097152"));
    }

    #[test]
    fn label_values_carry_no_control_characters() {
        assert_eq!(super::esc("a\u{1b}]0;x\u{7}\"q\"\\\nb\u{9b}"), "a]0;x\\\"q\\\"\\\\\\nb");
    }
}
