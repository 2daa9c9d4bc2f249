//! The live view with an injected fake NVML and fake publisher files, the
//! Prometheus endpoint over real HTTP, `--json`, `record` and its replay, and
//! the Python publisher against a stand-in `torch`.

use crate::common;

use common::{bin, http_get, start_serve};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use gpumem_top::monitor::alerts::{alerts, Thresholds};
use gpumem_top::monitor::publisher::{self, scan};
use gpumem_top::monitor::sampler::{LiveSource, Source};
use gpumem_top::monitor::{GpuQuery, GpuSample, ProcessSample};
use gpumem_top::ui::event::Interactive;
use gpumem_top::ui::live::LiveApp;
use gpumem_top::ui::recording::RecordingApp;
use serde_json::{json, Value};

const GIB: u64 = 1 << 30;

/// A scripted NVML: GPUs with processes; a field that fails; processes that
/// can disappear between samples.
/// Shared with the test, which changes what it answers between samples.
#[derive(Clone)]
struct FakeNvml {
    gpus: std::sync::Arc<std::sync::Mutex<Vec<GpuSample>>>,
}

impl FakeNvml {
    fn new(gpus: Vec<GpuSample>) -> Self {
        FakeNvml { gpus: std::sync::Arc::new(std::sync::Mutex::new(gpus)) }
    }
}

impl GpuQuery for FakeNvml {
    fn device_count(&mut self) -> Result<u32, gpumem_top::monitor::GpuError> {
        Ok(self.gpus.lock().unwrap().len() as u32)
    }
    fn sample(&mut self, index: u32) -> GpuSample {
        self.gpus.lock().unwrap()[index as usize].clone()
    }
}

fn gpu(index: u32, used: u64, procs: Vec<ProcessSample>) -> GpuSample {
    GpuSample {
        index,
        name: Some("NVIDIA H200".into()),
        uuid: Some(format!("GPU-{index}")),
        total_bytes: Some(140 * GIB),
        used_bytes: Some(used),
        free_bytes: Some(140 * GIB - used),
        utilization_percent: Some(50 + index),
        memory_utilization_percent: Some(10),
        processes: procs,
        mig: Vec::new(),
        errors: Vec::new(),
    }
}

fn proc_(pid: u32, cmd: &str, used: u64) -> ProcessSample {
    ProcessSample { pid, local_pid: Some(pid), command: Some(cmd.into()), used_bytes: Some(used) }
}

fn tmpdir(tag: &str) -> common::TmpDir {
    let d = std::env::temp_dir().join(format!("gpumem-live-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    gpumem_top::private::ensure_private_dir(&d).unwrap();
    common::TmpDir::of(d)
}

/// A publisher file: one segment of 20 MiB with an allocated 8 MiB block,
/// a pending-free 2 MiB block and 10 MiB free.
fn published(pid: u32, device: u32, allocated: u64, reserved: u64, steps: &[u64]) -> Value {
    json!({
        "version": 1, "pid": pid, "nspid": [pid], "device": device, "time": gpumem_top::monitor::now(),
        "interval": 0.5, "command": "python train.py",
        "stats": {"allocated_bytes.all.current": allocated, "reserved_bytes.all.current": reserved,
                  "allocated_bytes.all.peak": allocated, "reserved_bytes.all.peak": reserved,
                  "requested_bytes.all.current": allocated - 512, "inactive_split_bytes.all.current": 10 << 20,
                  "num_ooms": 0, "num_alloc_retries": 0, "active_bytes.all.current": allocated + (2 << 20)},
        "segments": [{"address": 0x7f0000000000u64, "total_size": 20 << 20, "stream": 0, "segment_type": "large",
                      "is_expandable": false, "blocks": [[8 << 20, (8 << 20) - 512, 0], [2 << 20, 2 << 20, 1], [10 << 20, 0, 2]]}],
        "steps": steps,
    })
}

fn write(dir: &Path, name: &str, v: &Value) {
    std::fs::write(dir.join(name), serde_json::to_vec(v).unwrap()).unwrap();
}

fn render(app: &mut impl gpumem_top::ui::event::Interactive, w: u16, h: u16) -> String {
    common::render_live(app, w, h)
}

#[test]
fn publisher_files_good_foreign_oversized_and_malformed() {
    let d = tmpdir("scan");
    let me = publisher::current_uid();
    let pid = std::process::id();
    write(&d, &format!("{pid}-0.json"), &published(pid, 0, 8 << 20, 20 << 20, &[]));
    write(&d, "4242-0.json", &published(4242, 0, 1, 2, &[]));
    // Foreign: owned by another user (as root we can make it so; otherwise
    // scan as if we were someone else, which reaches the same check).
    let foreign_uid =
        if std::os::unix::fs::chown(d.join("4242-0.json"), Some(4242), None).is_ok() { me } else { me + 1 };
    let mut big = published(77, 0, 1, 2, &[]);
    big["command"] = json!("x".repeat(5000));
    write(&d, "77-0.json", &big);
    std::fs::write(d.join("88-0.json"), b"{\"version\": 1, \"pid\": 88,").unwrap();
    write(&d, "99-0.json", &json!({"version": 2, "pid": 99, "device": 0, "time": 0.0, "stats": {}}));
    std::fs::write(d.join(".tmp-partial.json"), b"{").unwrap();
    let s = scan(&d, foreign_uid, 4000);
    let why = s.skipped.join("\n");
    if foreign_uid == me {
        assert_eq!(s.published.len(), 1, "{why}");
        let p = &s.published[0];
        assert_eq!((p.pid, p.allocated(), p.reserved()), (pid, 8 << 20, 20 << 20));
        assert_eq!(p.segments.len(), 1);
        let blocks: Vec<(u64, u64)> =
            p.segments[0].blocks.iter().map(|b| (b.address - p.segments[0].address, b.size)).collect();
        assert_eq!(blocks, [(0, 8 << 20), (8 << 20, 2 << 20), (10 << 20, 10 << 20)]);
        assert_eq!((p.segments[0].allocated_size, p.segments[0].active_size), (8 << 20, 10 << 20));
        assert!(why.contains("4242-0.json: owned by uid 4242, not us"), "{why}");
    }
    assert!(why.contains("77-0.json: ") && why.contains("over the 4000 byte cap"), "{why}");
    assert!(why.contains("88-0.json: malformed: line 1 column"), "{why}");
    assert!(why.contains("99-0.json: malformed: version 2"), "{why}");
    assert!(!why.contains("partial"), "temporary files of writers are not read: {why}");
    // A directory others can read is refused whole.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    let s = scan(&d, me, publisher::DEFAULT_CAP);
    assert!(s.published.is_empty() && s.skipped[0].contains("it must be our own 0700 directory"), "{:?}", s.skipped);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn the_live_view_shows_every_gpu_its_processes_and_a_publisher_and_survives_failures() {
    let d = tmpdir("view");
    let me = std::process::id();
    let fake = FakeNvml::new(vec![
        gpu(0, 30 * GIB, vec![proc_(me, "python train.py", 21 * GIB), proc_(31337, "python eval.py", 9 * GIB)]),
        gpu(1, 2 * GIB, vec![]),
        gpu(2, 139 * GIB, vec![proc_(4000, "big job", 139 * GIB)]),
    ]);
    // GPU 1's utilization cannot be read.
    {
        let mut g = fake.gpus.lock().unwrap();
        g[1].utilization_percent = None;
        g[1].errors.push("utilization: Not Supported".into());
    }
    // Step ends rising 40 MiB a step: a leak.
    let steps: Vec<u64> = (0..6).map(|k| GIB + k * (40 << 20)).collect();
    write(&d, &format!("{me}-0.json"), &published(me, 0, 8 << 20, 20 << 20, &steps));
    let mut src = LiveSource::new(Box::new(fake.clone()), Vec::new(), Some(d.clone()));
    let mut app = LiveApp::new("live (fake NVML)".into(), None, false);
    let first = src.snapshot();
    assert_eq!(first.publishers.len(), 1, "{:?} {:?}", first.skipped, first.gone);
    app.ingest(first);
    let s = render(&mut app, 140, 40);
    assert!(s.contains("▶1 GPU 0 NVIDIA H200"), "{s}");
    assert!(s.contains(" 2 GPU 1 NVIDIA H200") && s.contains("util N/A") && s.contains("(1 field(s) N/A)"), "{s}");
    assert!(s.contains(" 3 GPU 2") && s.contains("139.00 GiB / 140.00 GiB") && s.contains("⚠"), "{s}");
    assert!(s.contains(&format!("pid {me:>7} python train.py")), "{s}");
    assert!(s.contains("torch: allocated 8.00 MiB reserved 20.00 MiB"), "{s}");
    assert!(s.contains("pid   31337 python eval.py"), "{s}");
    // The publisher's allocator screens: bars and its one segment.
    assert!(s.contains(&format!("pid {me} python train.py")), "{s}");
    assert!(s.contains("1 segments") || s.contains("1 segment"), "{s}");
    // Alerts: GPU 2 is 99% full; pid me leaked 5 steps in a row.
    let kinds: Vec<&str> = app.watch.model.alerts.iter().map(|a| a.kind.name()).collect();
    assert_eq!(kinds, ["device_usage", "leak"], "{:?}", app.watch.model.alerts);
    assert!(s.contains("GPU 2 is 99.3% full"), "{s}");
    // Key 2 picks GPU 1: nobody publishes there.
    app.handle_key(crossterm::event::KeyEvent::from(crossterm::event::KeyCode::Char('2')));
    let s = render(&mut app, 140, 40);
    assert!(s.contains("▶2 GPU 1") && s.contains("No process on GPU 1 publishes its allocator state"), "{s}");
    app.handle_key(crossterm::event::KeyEvent::from(crossterm::event::KeyCode::Char('9')));
    assert_eq!(app.watch.selected_gpu, 1);
    app.handle_key(crossterm::event::KeyEvent::from(crossterm::event::KeyCode::Char('1')));
    // The eval process disappears and the publisher's file goes: history stays, marked gone.
    fake.gpus.lock().unwrap()[0].processes.truncate(1);
    std::fs::remove_file(d.join(format!("{me}-0.json"))).unwrap();
    // The same source: it remembers who published before.
    let snap = src.snapshot();
    assert_eq!(snap.gone, vec![me]);
    app.ingest(snap);
    let s = render(&mut app, 140, 40);
    assert!(!s.contains("python eval.py"), "{s}");
    assert!(s.contains("gone"), "{s}");
    assert_eq!(app.watch.model.procs[&(0, me)].series.points().len(), 1, "its history is kept");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn eight_gpus_fit_and_are_picked_by_number() {
    let fake =
        FakeNvml::new((0..8).map(|i| gpu(i, (i as u64 + 1) * GIB, vec![proc_(1000 + i, "worker", GIB)])).collect());
    let mut src = LiveSource::new(Box::new(fake), Vec::new(), None);
    let mut app = LiveApp::new("live".into(), None, false);
    let snap = src.snapshot();
    let j = serde_json::to_value(gpumem_top::monitor::report::LiveReport::of(
        &snap,
        &alerts(&snap, &Thresholds::default()),
        "nvml",
    ))
    .unwrap();
    assert_eq!(j["gpus"].as_array().unwrap().len(), 8);
    assert_eq!(j["gpus"][7]["processes"][0]["pid"], 1007);
    app.ingest(snap);
    let s = render(&mut app, 140, 60);
    for i in 0..8 {
        assert!(s.contains(&format!("{} GPU {i} NVIDIA H200", i + 1)), "{s}");
    }
    app.handle_key(crossterm::event::KeyEvent::from(crossterm::event::KeyCode::Char('8')));
    assert_eq!(app.watch.selected_gpu, 7);
    assert!(render(&mut app, 140, 60).contains("▶8 GPU 7"));
    // Watching only GPUs 3 and 5.
    let fake = FakeNvml::new((0..8).map(|i| gpu(i, GIB, vec![])).collect());
    let snap = LiveSource::new(Box::new(fake), vec![3, 5], None).snapshot();
    assert_eq!(snap.gpus.iter().map(|g| g.index).collect::<Vec<_>>(), [3, 5]);
}

#[test]
fn fragmentation_alert_is_judged_at_the_peaks_with_a_gib_reserved() {
    let d = tmpdir("frag");
    let me = std::process::id();
    write(&d, &format!("{me}-0.json"), &published(me, 0, 8 << 20, 20 << 20, &[]));
    let snap = LiveSource::new(Box::new(FakeNvml::new(vec![gpu(0, GIB, vec![])])), vec![], Some(d.clone())).snapshot();
    assert!(alerts(&snap, &Thresholds::default()).is_empty(), "20 MiB reserved is too little to alarm anyone");
    let t = Thresholds { fragmentation_min_reserved: 1 << 20, ..Default::default() };
    let a = alerts(&snap, &t);
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].kind.name(), "fragmentation");
    assert!((a[0].value - 0.6).abs() < 1e-9);
    // Between steps: 1 GiB allocated of 10 GiB reserved, but at the peaks
    // 9.5 GiB of 10 GiB held tensors: a cache doing its job, no alert.
    let mut v = published(me, 0, GIB, 10 * GIB, &[]);
    v["stats"]["allocated_bytes.all.peak"] = json!(19 * GIB / 2);
    v["segments"] = json!([]);
    write(&d, &format!("{me}-0.json"), &v);
    let nvml = || Box::new(FakeNvml::new(vec![gpu(0, GIB, vec![])]));
    let snap = LiveSource::new(nvml(), vec![], Some(d.clone())).snapshot();
    assert!(alerts(&snap, &Thresholds::default()).is_empty(), "{:?}", alerts(&snap, &Thresholds::default()));
    // The same loop whose peaks are 6 of 10 GiB: 40% never held tensors.
    v["stats"]["allocated_bytes.all.peak"] = json!(6 * GIB);
    write(&d, &format!("{me}-0.json"), &v);
    let snap = LiveSource::new(nvml(), vec![], Some(d.clone())).snapshot();
    let a = alerts(&snap, &Thresholds::default());
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(
        a[0].message(),
        format!("pid {me}: at the peaks 40% of reserved never held tensors (peak reserved 10.00 GiB, peak allocated 6.00 GiB); press S to snapshot it and tune (gpumem-top tune SNAPSHOT replays it under every setting)")
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// Retries and OOMs are alerts of their own, with what to try: the
/// expandable-segments hint only when reserved-but-never-allocated memory
/// at the peaks is what ran out, else the peaks themselves.
#[test]
fn retries_and_ooms_raise_alerts_that_say_what_to_try() {
    let d = tmpdir("retries");
    let me = std::process::id();
    let nvml = || Box::new(FakeNvml::new(vec![gpu(0, GIB, vec![])]));
    let check = |v: &Value| {
        write(&d, &format!("{me}-0.json"), v);
        let snap = LiveSource::new(nvml(), vec![], Some(d.clone())).snapshot();
        alerts(&snap, &Thresholds::default())
    };
    // A fixed-shape loop: peaks 9.5 of 10 GiB, no retry: nothing.
    let mut v = published(me, 0, GIB, 10 * GIB, &[]);
    v["stats"]["allocated_bytes.all.peak"] = json!(19 * GIB / 2);
    v["segments"] = json!([]);
    assert!(check(&v).is_empty());
    // Retries with the peaks tight: the peaks do not fit.
    v["stats"]["num_alloc_retries"] = json!(3);
    let a = check(&v);
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!((a[0].kind.name(), a[0].value), ("retries", 3.0));
    assert_eq!(
        a[0].message(),
        format!("pid {me}: 3 allocation retries (cudaMalloc failed until the cache was freed, a device synchronisation each); the peaks themselves do not fit (9.50 GiB allocated of 10.00 GiB reserved): a smaller batch, activation checkpointing or mixed precision")
    );
    // An OOM with 4 GiB reserved that never held tensors at the peak: the
    // OOM alert (not the retries one) and the fragmentation one.
    v["stats"]["num_ooms"] = json!(1);
    v["stats"]["allocated_bytes.all.peak"] = json!(6 * GIB);
    let a = check(&v);
    let kinds: Vec<&str> = a.iter().map(|a| a.kind.name()).collect();
    assert_eq!(kinds, ["fragmentation", "oom"]);
    assert_eq!(
        a[1].message(),
        format!("pid {me}: CUDA out of memory (1 time); 4.00 GiB reserved at the peak never held tensors; press S to snapshot it and tune (gpumem-top tune SNAPSHOT replays it under every setting)")
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn serve_demo_exposes_prometheus_metrics_over_http() {
    let (mut child, addr) = start_serve("100");
    std::thread::sleep(Duration::from_millis(400));
    let (head, body) = http_get(&addr, "/metrics");
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(head.contains("Content-Type: text/plain; version=0.0.4"), "{head}");
    // Every sample line belongs to a family declared with HELP and TYPE.
    let mut families = std::collections::HashMap::new();
    let mut values = std::collections::HashMap::new();
    for l in body.lines() {
        if let Some(r) = l.strip_prefix("# TYPE ") {
            let mut it = r.split(' ');
            let (n, k) = (it.next().unwrap(), it.next().unwrap());
            assert!(["gauge", "counter"].contains(&k), "{l}");
            families.insert(n.to_string(), k.to_string());
        } else if !l.starts_with('#') && !l.is_empty() {
            let (series, v) = l.rsplit_once(' ').unwrap();
            let name = series.split('{').next().unwrap();
            assert!(families.contains_key(name), "{name} has no TYPE");
            assert!(series.ends_with('}'), "{l}");
            values.insert(name.to_string(), v.parse::<f64>().unwrap_or_else(|_| panic!("{l}")));
        }
    }
    assert_eq!(families["gpumem_torch_num_ooms_total"], "counter");
    // The alert family's help names every kind it can carry (#37 item 21).
    assert!(
        body.contains(
            "# HELP gpumem_alert 1 for each alert raised now (kind: device_usage, leak, fragmentation, retries, oom, imbalance)."
        ),
        "{body}"
    );
    assert_eq!(values["gpumem_gpu_memory_total_bytes"], 150_109_880_320.0);
    let (a, r) = (values["gpumem_torch_allocated_bytes"], values["gpumem_torch_reserved_bytes"]);
    assert!(a > 0.0 && a <= r, "allocated {a}, reserved {r}");
    assert_eq!(values["gpumem_torch_reserved_unallocated_bytes"], r - a);
    assert!(values["gpumem_gpu_memory_used_bytes"] >= r, "NVML-side used covers reserved");
    assert!((0.0..=1.0).contains(&values["gpumem_torch_external_fragmentation_ratio"]));
    // What the optimizer held at the latest step's end (docs/user/categories.md
    // "Live"): the synthetic GPT-2's own parameters, gradients and Adam
    // state, and the rest, summing to allocated at that step's end.
    // (Published at the first step's end: asked again until it has run.)
    let mut body = body;
    for _ in 0..100 {
        if body.contains("gpumem_torch_category_bytes{") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        body = http_get(&addr, "/metrics").1;
    }
    let step_end = body
        .lines()
        .find_map(|l| l.strip_prefix("gpumem_torch_step_end_allocated_bytes{"))
        .and_then(|l| l.rsplit_once(' '))
        .map(|(_, v)| v.parse::<f64>().unwrap())
        .unwrap_or(-1.0);
    let cats: std::collections::HashMap<String, f64> = body
        .lines()
        .filter(|l| l.starts_with("gpumem_torch_category_bytes{"))
        .map(|l| {
            let (series, v) = l.rsplit_once(' ').unwrap();
            let cat = series.split("category=\"").nth(1).unwrap().trim_end_matches("\"}").to_string();
            (cat, v.parse().unwrap())
        })
        .collect();
    assert_eq!(cats.len(), 4, "{body}");
    assert_eq!(cats["parameter"], 498_558_976.0, "GPT-2 small's parameters as the synthetic model places them");
    assert!(cats["gradient"] > 0.0 && cats["optimizer_state"] >= 2.0 * cats["gradient"] - 1e6, "{cats:?}");
    assert_eq!(cats.values().sum::<f64>(), step_end, "{cats:?}");
    let (head, _) = http_get(&addr, "/nope");
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    // SIGTERM ends it cleanly.
    // SAFETY: kill(2) touches no memory of ours; the pid is a child we
    // started and have not yet waited for.
    unsafe { kill(child.id() as i32, 15) };
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(0));
}

extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

/// `/metrics` within 1 s while 200 idle and 10 dripping connections are
/// open, for longer than any one of them may live; `HEAD` answers the
/// headers alone; the server's memory stays flat.
#[test]
fn serve_stays_prompt_beside_idle_and_dripping_clients() {
    let (mut child, addr) = start_serve("50");
    std::thread::sleep(Duration::from_millis(300));
    let idle: Vec<std::net::TcpStream> = (0..200).map(|_| std::net::TcpStream::connect(&addr).unwrap()).collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let drippers: Vec<_> = (0..10)
        .map(|_| {
            let (addr, stop) = (addr.clone(), stop.clone());
            std::thread::spawn(move || {
                // A new connection whenever the server drops the last one.
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let Ok(mut s) = std::net::TcpStream::connect(&addr) else { continue };
                    for b in b"GET /metrics HTTP/1.1\r\n".iter().cycle() {
                        if stop.load(std::sync::atomic::Ordering::Relaxed) || s.write_all(&[*b]).is_err() {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(300));
                    }
                }
            })
        })
        .collect();
    let rss = |pid: u32| -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        s.lines().find(|l| l.starts_with("VmRSS:")).unwrap().split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    let rss0 = rss(child.id());
    let start = std::time::Instant::now();
    let mut slowest = Duration::ZERO;
    while start.elapsed() < Duration::from_secs(5) {
        let t = std::time::Instant::now();
        let (head, body) = http_get(&addr, "/metrics");
        slowest = slowest.max(t.elapsed());
        assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
        assert!(body.contains("gpumem_gpu_memory_total_bytes"));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(slowest < Duration::from_secs(1), "slowest /metrics took {slowest:?}");
    // HEAD: the same headers, no body.
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    write!(s, "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut r = String::new();
    s.read_to_string(&mut r).unwrap();
    assert!(r.starts_with("HTTP/1.1 200 OK") && r.contains("Content-Length: ") && r.ends_with("\r\n\r\n"), "{r}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for d in drippers {
        d.join().unwrap();
    }
    drop(idle);
    assert!(rss(child.id()) < rss0 + 20_000, "RSS grew from {rss0} kB to {} kB", rss(child.id()));
    // SAFETY: signals our own child.
    unsafe { kill(child.id() as i32, 15) };
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

/// At a 256-descriptor limit, 600 idle connections: `serve` keeps as many
/// as its descriptors allow (dropping the oldest), backs off when it runs
/// out instead of spinning on `accept`, and `/metrics` stays prompt.
#[test]
fn serve_at_its_descriptor_limit_neither_spins_nor_stalls() {
    let (mut child, addr) = common::start_serve_with_fds("100", Some(256));
    std::thread::sleep(Duration::from_millis(300));
    let idle: Vec<std::net::TcpStream> = (0..600).filter_map(|_| std::net::TcpStream::connect(&addr).ok()).collect();
    assert!(idle.len() >= 500);
    let cpu = |pid: u32| -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let f: Vec<&str> = s.rsplit_once(')').unwrap().1.split_whitespace().collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    };
    let (c0, t0) = (cpu(child.id()), std::time::Instant::now());
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        let t = std::time::Instant::now();
        let (head, _) = common::http_get(&addr, "/metrics");
        slowest = slowest.max(t.elapsed());
        assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
        std::thread::sleep(Duration::from_millis(150));
    }
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let share = (cpu(child.id()) - c0) as f64 / hz / t0.elapsed().as_secs_f64();
    assert!(slowest < Duration::from_secs(1), "slowest /metrics took {slowest:?}");
    assert!(share < 0.5, "serve used {:.0}% of a core", share * 100.0);
    drop(idle);
    // SAFETY: signals our own child.
    unsafe { kill(child.id() as i32, 15) };
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

#[test]
fn json_without_a_gpu_is_an_error_and_the_simulated_device_only_when_asked() {
    let out = Command::new(bin()).args(["--json"]).env("GPUMEM_TOP_DIR", tmpdir("json")).output().unwrap();
    if out.status.success() {
        // A machine with a GPU: NVML's numbers.
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["source"], "nvml");
    } else {
        assert_eq!(out.status.code(), Some(2));
        assert!(out.stdout.is_empty(), "nothing simulated printed");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            err.trim_end(),
            "gpumem-top: no NVIDIA GPU or NVML library found (use --source demo for the simulated device)"
        );
    }
    let out = Command::new(bin())
        .args(["--json", "--source", "demo"])
        .env("GPUMEM_TOP_DIR", tmpdir("json"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["source"], "simulated device");
    assert_eq!(v["gpus"][0]["name"], "simulated NVIDIA H200");
    let out = Command::new(bin()).args(["--json", "--device", "3"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("gpumem-top: --device 3: ") && err.lines().count() == 1, "{err}");
}

#[test]
fn record_then_replay_the_recording() {
    let d = tmpdir("rec");
    let f = d.join("run.jsonl");
    let out = Command::new(bin())
        .args(["record", "--source", "demo", "--interval", "50", "--count", "4", "-o"])
        .arg(&f)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&f).unwrap();
    assert_eq!(text.lines().count(), 5);
    assert!(text.lines().next().unwrap().contains("\"format\":\"gpumem-top-record\""));
    let out = Command::new(bin()).arg("replay").arg(&f).arg("--json").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["samples"], 4);
    assert_eq!(v["processes"][0]["samples"], 4);
    let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(v["last"]["publishers"][0]["allocated_bytes"], last["publishers"][0]["allocated_bytes"]);
    assert_eq!(v["last"]["publishers"][0]["segments"], last["published"][0]["segments"].as_array().unwrap().len());
    // A damaged line is named.
    std::fs::write(&f, format!("{}\n{{\"time\": 1, \"gpus\": 5}}\n", text.lines().next().unwrap())).unwrap();
    let out = Command::new(bin()).arg("replay").arg(&f).arg("--json").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("run.jsonl: line 2: gpus:"));
    std::fs::remove_dir_all(&d).unwrap();
}

/// The publisher module, run by CPython against a stand-in `torch` that
/// answers memory_stats()/memory_snapshot() like PyTorch: its file is what
/// the scanner reads.
#[test]
fn the_python_publisher_writes_what_the_scanner_reads() {
    let Ok(py) = Command::new("python3").arg("--version").output() else { return };
    if !py.status.success() {
        return;
    }
    let d = tmpdir("py");
    let fake = fake_torch(&d);
    let script = r#"
import sys, time, torch, gpumem_top_publish as g
import torch.optim.optimizer
g.start(interval=0.05)
torch.optim.optimizer.hooks[0](None, (), {})
time.sleep(0.3)
print("published")
sys.stdout.flush()
time.sleep(0.5)
"#;
    let root = common::root();
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(script)
        .env("PYTHONPATH", format!("{}:{}", fake.display(), root.join("assets/python").display()))
        .env("GPUMEM_TOP_DIR", &d)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "published");
    let s = scan(&d, publisher::current_uid(), publisher::DEFAULT_CAP);
    assert!(s.skipped.is_empty(), "{:?}", s.skipped);
    assert_eq!(s.published.len(), 1);
    let p = &s.published[0];
    assert_eq!(p.pid, child.id());
    assert_eq!((p.allocated(), p.reserved()), (8 << 20, 20 << 20));
    assert_eq!(p.segments.len(), 1, "only device 0's segments");
    assert_eq!(p.segments[0].blocks.len(), 2);
    assert_eq!(p.steps, vec![8 << 20]);
    assert!(p.command.as_deref().unwrap_or("").starts_with("python3"));
    child.wait().unwrap();
    // At exit the publisher leaves a final file; a live source reads it
    // once (the process shows as gone) and removes it.
    let s = scan(&d, publisher::current_uid(), publisher::DEFAULT_CAP);
    assert_eq!(s.published.len(), 1);
    assert!(s.published[0].last_words);
    let nvml = Box::new(FakeNvml::new(vec![gpu(0, GIB, vec![])]));
    let mut src = LiveSource::new(nvml, vec![], Some(d.clone()));
    let snap = src.snapshot();
    assert_eq!((snap.publishers.len(), snap.gone.clone()), (1, vec![child.id()]));
    assert!(scan(&d, publisher::current_uid(), publisher::DEFAULT_CAP).published.is_empty());
    assert!(src.snapshot().publishers.is_empty());
    std::fs::remove_dir_all(&d).unwrap();
}

/// A stand-in `torch` package that answers memory_stats()/memory_snapshot()
/// like PyTorch, for the publisher run by CPython.
fn fake_torch(d: &Path) -> PathBuf {
    let fake = d.join("fake");
    std::fs::create_dir_all(fake.join("torch")).unwrap();
    std::fs::write(
        fake.join("torch/__init__.py"),
        r#"
class _Cuda:
    def current_device(self): return 0
    def memory_allocated(self, d=None): return 8 << 20
    def memory_stats(self, d=None):
        return {"allocated_bytes.all.current": 8 << 20, "reserved_bytes.all.current": 20 << 20, "num_ooms": 0}
    def memory_snapshot(self):
        return [{"device": 0, "address": 140000000000000, "total_size": 20 << 20, "stream": 0,
                 "segment_type": "large", "allocated_size": 8 << 20, "active_size": 8 << 20,
                 "blocks": [{"size": 8 << 20, "requested_size": 8 << 20, "state": "active_allocated"},
                            {"size": 12 << 20, "requested_size": 0, "state": "inactive"}]},
                {"device": 1, "address": 5, "total_size": 2 << 20, "stream": 0, "segment_type": "small", "blocks": []}]
cuda = _Cuda()
# As in torch: a torch.optim package whose optimizer module is imported
# by name (the publisher imports the function from it).
from . import optim
"#,
    )
    .unwrap();
    std::fs::create_dir_all(fake.join("torch/optim")).unwrap();
    std::fs::write(fake.join("torch/optim/__init__.py"), "").unwrap();
    std::fs::write(
        fake.join("torch/optim/optimizer.py"),
        "hooks = []\nclass _Hook:\n    def remove(self): pass\ndef register_optimizer_step_post_hook(f):\n    hooks.append(f)\n    return _Hook()\n",
    )
    .unwrap();
    fake
}

fn have_python() -> bool {
    Command::new("python3").arg("--version").output().is_ok_and(|o| o.status.success())
}

/// Runs `script` with the publisher and the stand-in torch; returns its
/// exit status, stdout and stderr.
fn run_publisher(d: &Path, dir: &Path, script: &str) -> (bool, String, String) {
    let fake = fake_torch(d);
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .env("PYTHONPATH", format!("{}:{}", fake.display(), common::root().join("assets/python").display()))
        .env("GPUMEM_TOP_DIR", dir)
        .env("TMPDIR", d)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// A symbolic link planted where the publisher's directory goes, a
/// directory someone else made, or one that is not private: the publisher
/// never writes or chmods there, warns once, publishes to a fresh private
/// directory gpumem-top also reads, and training goes on.
#[test]
fn the_publisher_never_harms_training_or_follows_what_it_did_not_make() {
    use std::os::unix::fs::PermissionsExt;
    if !have_python() {
        return;
    }
    let script = r#"
import os, time, torch, gpumem_top_publish as g
g.start(interval=0.05)
time.sleep(0.3)
import glob
print("training goes on", os.getpid())
print("files", sorted(glob.glob(os.path.join(os.environ["TMPDIR"], "gpumem-top-*", "*.json"))))
"#;
    // 1. A symbolic link to a victim directory.
    let d = tmpdir("pub-link");
    let victim = d.join("victim");
    std::fs::create_dir_all(&victim).unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o755)).unwrap();
    let link = d.join("pubdir");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let (ok, out, err) = run_publisher(&d, &link, script);
    assert!(ok && out.contains("training goes on"), "{out}{err}");
    assert_eq!(err.matches("gpumem_top_publish:").count(), 1, "one warning: {err}");
    assert!(err.contains("not a directory") && err.contains("publishing to"), "{err}");
    assert_eq!(std::fs::metadata(&victim).unwrap().permissions().mode() & 0o777, 0o755, "never chmod-ed");
    assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 0, "nothing written there");
    assert!(out.contains(".json"), "published to the fallback: {out}");
    // 2. Our own directory, but open to others: refused, not chmod-ed.
    let d = tmpdir("pub-open");
    let open = d.join("pubdir");
    std::fs::create_dir_all(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (ok, _, err) = run_publisher(&d, &open, script);
    assert!(ok, "{err}");
    assert!(err.contains("mode 777"), "{err}");
    assert_eq!(std::fs::metadata(&open).unwrap().permissions().mode() & 0o777, 0o777);
    // 3. Made by another user (only root can arrange that here).
    if publisher::current_uid() == 0 {
        let d = tmpdir("pub-other");
        let theirs = d.join("pubdir");
        std::fs::create_dir_all(&theirs).unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
        let c = std::ffi::CString::new(theirs.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path; chown changes only its owner.
        assert_eq!(unsafe { libc::chown(c.as_ptr(), 65534, 65534) }, 0);
        let (ok, out, err) = run_publisher(&d, &theirs, script);
        assert!(ok && out.contains("training goes on"), "{err}");
        assert!(err.contains("belongs to uid 65534"), "{err}");
    }
}

/// The scanner reads at most the cap of a file however large it is, finds
/// the publisher's fallback directories, and keeps one file per process and
/// device (the newest).
#[test]
fn the_scanner_caps_reads_and_keeps_one_file_per_process() {
    use std::os::unix::fs::PermissionsExt;
    let d = tmpdir("scan-dups");
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    let me = std::process::id();
    let mut old = published(me, 0, 8 << 20, 20 << 20, &[]);
    old["time"] = json!(100.0);
    let mut new = published(me, 0, 9 << 20, 20 << 20, &[]);
    new["time"] = json!(200.0);
    std::fs::write(d.join(format!("{me}-0.json")), serde_json::to_vec(&old).unwrap()).unwrap();
    std::fs::write(d.join(format!("{me}-0b.json")), serde_json::to_vec(&new).unwrap()).unwrap();
    // Over the cap: skipped, and not read whole.
    std::fs::write(d.join("big.json"), vec![b' '; 4096]).unwrap();
    let s = scan(&d, publisher::current_uid(), 1024);
    assert_eq!(s.published.len(), 1, "{:?}", s.skipped);
    assert_eq!(s.published[0].allocated(), 9 << 20, "the newest");
    assert!(s.skipped.iter().any(|x| x.contains("older file")), "{:?}", s.skipped);
    assert!(s.skipped.iter().any(|x| x.contains("big.json: over the 1024 byte cap")), "{:?}", s.skipped);
}

#[test]
fn histories_are_capped_and_gone_processes_leave_first() {
    use gpumem_top::monitor::publisher::parse_bytes;
    let mut app = LiveApp::new("live".into(), None, false);
    let mk = |pid: u32| {
        let v = published(pid, 0, 8 << 20, 20 << 20, &[]);
        parse_bytes(&serde_json::to_vec(&v).unwrap(), Path::new("x")).unwrap()
    };
    let rounds = gpumem_top::monitor::model::MAX_HISTORIES as u32 + 4;
    for round in 0..rounds {
        let snap = gpumem_top::monitor::Snapshot {
            time: round as f64,
            gpus: vec![gpu(0, GIB, vec![])],
            publishers: vec![mk(1000 + round)],
            skipped: vec![],
            // Every earlier process is gone by the next round except pid 1000.
            gone: if round > 0 && round != 1 { vec![1000 + round - 1] } else { vec![] },
        };
        app.ingest(snap);
    }
    assert_eq!(app.watch.model.procs.len(), gpumem_top::monitor::model::MAX_HISTORIES);
    assert!(app.watch.model.procs.contains_key(&(0, 1000)), "the live one stays");
    assert!(app.watch.model.procs.contains_key(&(0, 1000 + rounds - 1)), "the newest stays");
}

/// Under `CUDA_VISIBLE_DEVICES=1` a process calls NVML's GPU 1 `cuda:0`:
/// publishers are put on NVML's GPU by UUID, else by where NVML lists the
/// process, else by their CUDA ordinal.
#[test]
fn publishers_land_on_nvmls_gpu_by_uuid_then_by_process_then_by_ordinal() {
    let mk = |pid: u32, uuid: Option<&str>| {
        let mut v = published(pid, 0, 8 << 20, 20 << 20, &[]);
        if let Some(u) = uuid {
            v["uuid"] = json!(u);
        }
        publisher::parse_bytes(&serde_json::to_vec(&v).unwrap(), Path::new("x.json")).unwrap()
    };
    let gpus = vec![
        gpu(0, GIB, vec![proc_(30, "both", GIB), proc_(40, "one", GIB)]),
        gpu(1, GIB, vec![proc_(20, "python", GIB), proc_(30, "both", GIB)]),
    ];
    // 10: UUID of GPU 1 (not listed by NVML yet); 20: listed on GPU 1 only;
    // 30: on both (a stray context), so its ordinal decides; 50: nowhere.
    let mut ps = vec![mk(10, Some("GPU-1")), mk(20, None), mk(30, None), mk(50, Some("GPU-unknown"))];
    publisher::assign_gpus(&mut ps, &gpus, true);
    let got: Vec<(u32, u32, u32)> = ps.iter().map(|p| (p.pid, p.device, p.cuda_device)).collect();
    assert_eq!(got, vec![(10, 1, 0), (20, 1, 0), (30, 0, 0), (50, 0, 0)]);
    // Watching GPU 1 only (`--device 1`): a UUID naming another GPU is dropped.
    let mut ps = vec![mk(10, Some("GPU-1")), mk(60, Some("GPU-0"))];
    publisher::assign_gpus(&mut ps, &gpus[1..], false);
    assert_eq!(ps.iter().map(|p| (p.pid, p.device)).collect::<Vec<_>>(), vec![(10, 1)]);
    // The view shows process 10's allocator on GPU 1 and not on GPU 0.
    let mut app = LiveApp::new("fake".into(), None, false);
    let mut s = gpumem_top::monitor::Snapshot { time: gpumem_top::monitor::now(), ..Default::default() };
    s.gpus = gpus.clone();
    s.publishers = vec![mk(10, Some("GPU-1"))];
    publisher::assign_gpus(&mut s.publishers, &s.gpus, true);
    app.ingest(s);
    assert!(render(&mut app, 140, 40).contains("No process on GPU 0 publishes"));
    app.handle_key(crossterm::event::KeyEvent::from(crossterm::event::KeyCode::Char('2')));
    let screen = render(&mut app, 140, 40);
    assert!(screen.contains("▶2 GPU 1") && screen.contains("pid 10 python train.py"), "{screen}");
}

/// An 80x24 terminal is enough for the live view: the list of GPUs above,
/// the allocator screen of the publishing process below; smaller says so.
#[test]
fn the_live_view_fits_80x24() {
    let d = tmpdir("small");
    let me = std::process::id();
    write(&d, &format!("{me}-0.json"), &published(me, 0, 8 << 20, 20 << 20, &[]));
    let nvml = FakeNvml::new(vec![gpu(0, GIB, vec![proc_(me, "python train.py", GIB)])]);
    let mut app = LiveApp::new("live".into(), None, false);
    app.ingest(LiveSource::new(Box::new(nvml), vec![], Some(d.clone())).snapshot());
    let draw = |app: &mut LiveApp, w, h| {
        let mut t = ratatui_core::terminal::Terminal::new(ratatui_core::backend::TestBackend::new(w, h)).unwrap();
        t.draw(|f| app.draw(f)).unwrap();
        t.backend().to_string()
    };
    let s = draw(&mut app, 80, 24);
    assert!(!s.contains("needs a terminal"), "{s}");
    assert!(s.contains("GPU 0"), "{s}");
    assert!(s.contains("allocated ") && s.contains("8.00 MiB"), "the publisher's bars: {s}");
    assert!(s.contains("Map ─ 1 segment ─ by address"), "{s}");
    let s = draw(&mut app, 80, 20);
    assert!(s.contains("gpumem-top needs a terminal of at least 80x24; this one is 80x20."), "{s}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// `replay RECORDING.jsonl` steps through what was recorded: each key goes
/// to a sample and the screens show that sample, the timeline whole with
/// the cursor on it; processes not yet publishing are not shown, ones that
/// stopped are gone.
#[test]
fn a_recording_steps_back_and_forth_through_its_samples() {
    use crossterm::event::{KeyCode, KeyEvent};
    use gpumem_top::ui::event::Interactive;
    let mk = |pid: u32, t: f64, allocated: u64, ooms: i64| {
        let mut v = published(pid, 0, allocated, 64 << 20, &[]);
        v["time"] = json!(t);
        v["stats"]["num_ooms"] = json!(ooms);
        publisher::parse_bytes(&serde_json::to_vec(&v).unwrap(), Path::new("x.json")).unwrap()
    };
    const MIB: u64 = 1 << 20;
    let seven = [(8, 0), (16, 0), (40, 0), (12, 1), (10, 1)];
    let snaps: Vec<gpumem_top::monitor::Snapshot> = (0..6)
        .map(|i| {
            let t = 100.0 + i as f64;
            let mut publishers = Vec::new();
            if let Some(&(a, o)) = seven.get(i) {
                publishers.push(mk(7, t, a * MIB, o));
            }
            if i >= 4 {
                publishers.push(mk(9, t, 30 * MIB, 0));
            }
            gpumem_top::monitor::Snapshot {
                time: t,
                gpus: vec![gpu(0, GIB, vec![proc_(7, "python train.py", GIB)])],
                publishers,
                skipped: vec![],
                gone: if i == 5 { vec![7] } else { vec![] },
            }
        })
        .collect();
    let mut app = RecordingApp::new("run.jsonl", snaps, false);
    let key = |app: &mut RecordingApp, k: KeyCode| app.handle_key(KeyEvent::from(k));
    let s = render(&mut app, 160, 44);
    assert!(s.contains("pid 9 python train.py (1/2) ─ sample 6 of 6, 5 s in"), "the live process, at the end: {s}");
    // Its own timeline, from its first sample.
    assert!(s.contains("cursor at 1 s of 1 s ─ allocated 30.00 MiB"), "{s}");
    // The first sample: process 9 had not started.
    key(&mut app, KeyCode::Home);
    let s = render(&mut app, 160, 44);
    assert!(s.contains("pid 7 python train.py ─ sample 1 of 6, 0 s in"), "{s}");
    assert!(!s.contains("pid 9"), "{s}");
    assert!(s.contains("cursor at 0 s of 4 s ─ allocated 8.00 MiB"), "process 7's own timeline: {s}");
    // p: its peak; o: its OOM; o again: none after.
    key(&mut app, KeyCode::Char('p'));
    assert!(render(&mut app, 160, 44).contains("sample 3 of 6, 2 s in"));
    key(&mut app, KeyCode::Char('o'));
    let s = render(&mut app, 160, 44);
    assert!(s.contains("sample 4 of 6, 3 s in") && s.contains("allocated 12.00 MiB"), "{s}");
    key(&mut app, KeyCode::Char('o'));
    let s = render(&mut app, 160, 44);
    assert!(s.contains("no OOM of this process after this sample"), "{s}");
    // →, → to the end, where process 7 is gone and still selected: it
    // shows what it last published.
    key(&mut app, KeyCode::Right);
    key(&mut app, KeyCode::Right);
    let s = render(&mut app, 160, 44);
    assert!(s.contains("pid 7 python train.py (2/2) ─ sample 6 of 6"), "{s}");
    assert!(s.contains("allocated 10.00 MiB"), "{s}");
    // ← once: back to sample 5, both publishing.
    key(&mut app, KeyCode::Left);
    assert!(render(&mut app, 160, 44).contains("pid 7 python train.py (1/2) ─ sample 5 of 6, 4 s in"));
    // The live view has no samples to step through, and says so.
    let mut live = LiveApp::new("live".into(), None, false);
    live.handle_key(KeyEvent::from(KeyCode::Left));
    assert!(render(&mut live, 160, 44).contains(
        "←/→ (one event back / forward) is for replay, synth and the demo and a recording, not the live view"
    ));
}

/// The demo source says it is simulated where NVML would be named, `S` says
/// why there is no snapshot (not "a recording"), a GPU key past the one GPU
/// says so plainly, and the GPU list fits 80 columns (#37 item 18).
#[test]
fn the_demo_source_names_itself_and_its_lines_fit_80_columns() {
    use gpumem_top::monitor::sampler::DemoSource;
    let mut src = DemoSource::new(42);
    src.advance(3000);
    let mut app = LiveApp::of_demo(false);
    app.ingest(src.snapshot());
    let s = render(&mut app, 80, 24);
    let lines: Vec<&str> = s.lines().collect();
    assert!(lines[1].contains("GPU 0 simulated NVIDIA H200") && lines[1].contains("util N/A"), "{s}");
    assert!(lines[2].contains("gpumem-top demo (synt…") && lines[2].contains("alloc 4.1G res 11.6G out "), "{s}");
    // Nothing cut: each row's last figure is whole inside the box (the
    // simulated process holds a CUDA context of 590 MiB beyond reserved).
    assert!(lines[1].ends_with("util N/A   │\""), "{}", lines[1]);
    assert!(lines[2].ends_with(" out 590M│\""), "{}", lines[2]);
    assert!(s.contains("12.13 GiB / 139.80 GiB (simulated)"), "{s}");
    assert!(!s.contains("(NVML)"), "{s}");
    app.handle_key(crossterm::event::KeyEvent::from(crossterm::event::KeyCode::Char('2')));
    assert!(render(&mut app, 80, 24).contains("there is no GPU 2: one GPU is listed (key 1)"));
    app.handle_key(crossterm::event::KeyEvent::from(crossterm::event::KeyCode::Char('S')));
    assert!(render(&mut app, 80, 24).contains("the demo's process is simulated: it has no PyTorch to snapshot"));
}

/// Two containers' trainers, each pid 1 of its own pid namespace, publish
/// into one shared directory (the DaemonSet of docs/user/cluster.md): two files,
/// two processes told apart by their start times and shown under their
/// pids here, each with its own figures; one killed is gone at the next
/// sample although pid 1 here lives on. They collided in `1-0.json`: one
/// process flipping between the two pods' figures, the other lost.
#[test]
fn trainers_of_two_containers_are_two_processes() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !have_python() {
        eprintln!("skipped: pid namespaces need root (CI runs as root)");
        return;
    }
    let probe = Command::new("unshare").args(["--pid", "--fork", "--mount-proc", "true"]).status();
    if !probe.is_ok_and(|s| s.success()) {
        // A container that forbids new namespaces (CI's machine allows them).
        eprintln!("skipped: unshare --pid is not permitted here");
        return;
    }
    let d = tmpdir("pods");
    let dir = d.join("shared");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let fake = fake_torch(&d);
    let script = r#"
import os, time, torch, gpumem_top_publish as g
a = int(os.environ["ALLOC"])
torch.cuda.memory_stats = lambda d=None: {"allocated_bytes.all.current": a, "reserved_bytes.all.current": 20 << 20, "num_ooms": 0}
g.start(interval=0.05)
time.sleep(0.3)
print("published as pid", os.getpid(), flush=True)
time.sleep(60)
"#;
    // Both started at once, as a launcher starts its pods: their start
    // times may fall in one clock tick (they did on the H200 machine).
    let pod = |alloc: u64| {
        Command::new("unshare")
            .args(["--pid", "--fork", "--kill-child", "--mount-proc", "python3", "-c", script])
            .env("PYTHONPATH", format!("{}:{}", fake.display(), common::root().join("assets/python").display()))
            .env("GPUMEM_TOP_DIR", &dir)
            .env("ALLOC", alloc.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (mut a, mut b) = (pod(3 << 20), pod(5 << 20));
    for c in [&mut a, &mut b] {
        let mut line = String::new();
        BufReader::new(c.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "published as pid 1", "each trainer is pid 1 of its namespace");
    }
    let files: Vec<String> =
        std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(files.iter().filter(|f| f.starts_with("1-") && f.ends_with("-0.json")).count(), 2, "{files:?}");
    let mut src = LiveSource::new(Box::new(FakeNvml::new(vec![gpu(0, GIB, vec![])])), vec![], Some(dir.clone()));
    let snap = src.snapshot();
    let mut seen: Vec<(u32, u64)> = snap.publishers.iter().map(|p| (p.pid, p.allocated())).collect();
    seen.sort_by_key(|s| s.1);
    assert_eq!(seen.len(), 2, "{seen:?} {:?}", snap.skipped);
    assert_ne!(seen[0].0, seen[1].0);
    assert_eq!((seen[0].1, seen[1].1), (3 << 20, 5 << 20));
    for (pid, _) in &seen {
        assert_ne!(*pid, 1);
        let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let ns = st.lines().find(|l| l.starts_with("NSpid:")).unwrap();
        assert!(ns.trim_end().ends_with("\t1"), "pid {pid} is a pid 1 inside: {ns}");
    }
    // The first pod ends (SIGKILL: no final file): gone at once, the other
    // stays, though pid 1 here is alive.
    a.kill().unwrap();
    a.wait().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let snap = src.snapshot();
    let live: Vec<(u32, u64)> = snap.publishers.iter().map(|p| (p.pid, p.allocated())).collect();
    assert_eq!(live, vec![seen[1]], "{:?}", snap.gone);
    assert!(snap.gone.contains(&seen[0].0), "{:?}", snap.gone);
    b.kill().unwrap();
    b.wait().unwrap();
    std::fs::remove_dir_all(&d).unwrap();
}

/// GPT-2 training with the sequence length drawn every step, recorded on
/// the H200 under `run -o` (measurements/live/h200_round.sh): step-end allocated
/// moves by a few MiB with the shapes, and a sequence-length warmup too;
/// neither is a leak. The same run keeping 32 MiB a step is, and is said.
#[test]
fn the_leak_alert_fires_on_a_leak_and_not_on_a_runs_own_variation() {
    for (name, leak) in [("varying", false), ("warmup", false), ("leak", true)] {
        let rec = common::fixture(&format!("live/steps_{name}.jsonl.gz"));
        let out = std::process::Command::new(common::bin()).arg("replay").arg(&rec).arg("--json").output().unwrap();
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let j: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(j["processes"][0]["steps"].as_array().unwrap().len(), 40, "{name}");
        let leaks: Vec<&Value> =
            j["alerts_raised"].as_array().unwrap().iter().filter(|a| a["kind"] == "leak").collect();
        assert_eq!(!leaks.is_empty(), leak, "{name}: {:?}", j["alerts_raised"]);
        if leak {
            let m = leaks[0]["message"].as_str().unwrap();
            assert!(m.contains("allocated at step end grew") && m.contains("beyond the run's own variation"), "{m}");
        }
    }
}
