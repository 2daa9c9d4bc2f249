//! GPU-only checks of the synthetic mode's CUDA backend (run on the device
//! machine through tools/gpu-bundle.sh; `cargo test` skips them).

use crate::common;

use std::process::{Command, Stdio};
use std::time::Duration;

use gpumem_top::monitor::ProcessMemory;
use gpumem_top::ui::event::Interactive;
use serde_json::Value;

/// The binary: where cargo built it, or the bundle's copy on the GPU machine.
fn bin() -> std::path::PathBuf {
    let built = std::path::PathBuf::from(env!("CARGO_BIN_EXE_gpumem-top"));
    if built.exists() {
        return built;
    }
    let root = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    std::path::Path::new(&root).join(".gpu/gpumem-top")
}

fn synth(args: &[&str]) -> (i32, Value, String) {
    let out = Command::new(bin())
        .arg("synth")
        .args(["--backend", "cuda", "--json"])
        .args(args)
        .output()
        .expect("run gpumem-top");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let v: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout} {stderr}"));
    (out.status.code().unwrap_or(-1), v, stderr)
}

/// The tests here share one GPU, and three of them compare the memory the
/// whole device uses before and after a run: run in parallel, one test's
/// run showed up in another's "after" (2.1 GB on the H200, 2026-12-01).
/// Each test holds this lock for its whole run.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static GPU: std::sync::Mutex<()> = std::sync::Mutex::new(());
    GPU.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} missing in {v}"))
}

/// Device memory used by every process, settled (the driver frees a dead
/// process's memory asynchronously).
fn settled_device_used(nv: &ProcessMemory, want_at_most: u64) -> u64 {
    let mut used = nv.device_used().expect("NVML device used");
    for _ in 0..50 {
        if used <= want_at_most {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        used = nv.device_used().expect("NVML device used");
    }
    used
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn nvml_sees_our_reserved_bytes_plus_the_context_and_all_of_it_returns() {
    let _gpu = one_at_a_time();
    let nv = ProcessMemory::open(0).expect("NVML");
    let before = nv.device_used().unwrap();
    for (model, extra) in [("gpt2", vec![]), ("resnet50", vec!["--touch"])] {
        let mut args = vec!["--model", model, "--iterations", "2"];
        args.extend(extra);
        let (rc, v, err) = synth(&args);
        assert_eq!(rc, 0, "{err}");
        assert_eq!(v["backend"], "cuda");
        let ctx = u(&v, "cuda_context_bytes");
        let nvml = u(&v, "nvml_used_bytes_at_peak");
        let reserved = u(&v, "reserved_bytes_at_nvml_sample");
        let peak_reserved = v["stats"]["reserved_bytes.all.peak"].as_u64().unwrap();
        assert_eq!(reserved, peak_reserved, "NVML was sampled at the reserved peak");
        let expect = reserved + ctx;
        let err_pct = (nvml as f64 / expect as f64 - 1.0) * 100.0;
        println!(
            "{model}: NVML used {nvml} B at the peak; reserved {reserved} + context {ctx} = {expect} ({err_pct:+.3}%)"
        );
        assert!(err_pct.abs() < 1.0, "{model}: NVML {nvml} vs reserved+context {expect}");
        assert_eq!(u(&v, "device_bytes_held_after_release"), 0);
        // After exit the device is back where it was (within 2 MiB of other noise).
        let after = settled_device_used(&nv, before + (2 << 20));
        println!("{model}: device used before {before} B, after exit {after} B");
        assert!(after <= before + (2 << 20), "{model}: {after} used after exit, {before} before");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn expandable_segments_map_page_ranges_one_device_alloc_each() {
    let _gpu = one_at_a_time();
    let (rc, v, err) = synth(&["--model", "gpt2", "--iterations", "2", "--alloc-conf", "expandable_segments:True"]);
    assert_eq!(rc, 0, "{err}");
    let maps = &v["device_maps"];
    let n = v["stats"]["num_device_alloc"].as_u64().unwrap();
    println!(
        "expandable: num_device_alloc {n}, range maps {}, pages {}, reserved peak {}",
        maps["range_maps"], maps["page_maps"], v["stats"]["reserved_bytes.all.peak"]
    );
    assert!(n > 0);
    assert_eq!(Some(n), maps["range_maps"].as_u64());
    // Every mapped page is a 2 MiB (small pool) or 20 MiB (large pool) page.
    let reserved = v["stats"]["reserved_bytes.all.peak"].as_u64().unwrap();
    let pages = maps["page_maps"].as_u64().unwrap();
    assert!(pages * (2 << 20) <= reserved && reserved <= pages * (20 << 20), "{pages} pages for {reserved} B");
    // Compare with the simulated device: same stats, addresses aside.
    let sim = Command::new(bin())
        .args(["synth", "--backend", "sim", "--json", "--model", "gpt2", "--iterations", "2"])
        .args(["--alloc-conf", "expandable_segments:True"])
        .output()
        .unwrap();
    let s: Value = serde_json::from_slice(&sim.stdout).unwrap();
    assert_eq!(s["stats"], v["stats"], "CUDA and Sim backends give the same memory_stats()");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn an_injected_limit_takes_the_shrink_path_and_returns_everything() {
    let _gpu = one_at_a_time();
    let nv = ProcessMemory::open(0).expect("NVML");
    let before = nv.device_used().unwrap();
    let (rc, v, err) =
        synth(&["--model", "gpt2", "--iterations", "2", "--memory-limit", "12000000000", "--on-oom", "shrink"]);
    assert_eq!(rc, 0, "{err}");
    let ooms = v["ooms"].as_array().unwrap();
    let batches: Vec<u64> = ooms.iter().map(|o| o["batch"].as_u64().unwrap()).collect();
    println!("shrink: {} OOMs at batches {batches:?}, outcome {}", ooms.len(), v["outcome"]);
    assert!(!ooms.is_empty() && ooms.iter().all(|o| o["action"] == "retry"));
    assert_eq!(v["outcome"], "finished");
    assert!(batches.windows(2).any(|w| w[1] < w[0]), "each retry is smaller: {batches:?}");
    assert!(v["stats"]["reserved_bytes.all.peak"].as_u64().unwrap() <= 12_000_000_000);
    // Out of retries: stop, exit 1 with PyTorch's message, memory returned.
    let (rc, v, err) = synth(&["--model", "gpt2", "--memory-limit", "4000000000", "--on-oom", "shrink"]);
    assert_eq!(rc, 1);
    assert!(err.contains("CUDA out of memory. Tried to allocate"), "{err}");
    assert_eq!(v["outcome"], "stopped by OOM");
    assert_eq!(u(&v, "device_bytes_held_after_release"), 0);
    let after = settled_device_used(&nv, before + (2 << 20));
    assert!(after <= before + (2 << 20), "{after} used after exit, {before} before");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn ctrl_c_returns_every_byte() {
    let _gpu = one_at_a_time();
    let nv = ProcessMemory::open(0).expect("NVML");
    let before = nv.device_used().unwrap();
    let child = Command::new(bin())
        .args(["synth", "--backend", "cuda", "--json", "--model", "gpt2", "--iterations", "100000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(4));
    let during = nv.device_used().unwrap();
    // SAFETY: signalling our own child.
    unsafe { libc_kill(child.id() as i32, 2) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["outcome"], "interrupted");
    assert_eq!(u(&v, "device_bytes_held_after_release"), 0);
    let after = settled_device_used(&nv, before + (2 << 20));
    println!("Ctrl-C: device used before {before}, during {during}, after {after}");
    assert!(during > before + (1 << 30), "the run held memory: {during} vs {before}");
    assert!(after <= before + (2 << 20));
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

/// A real PyTorch process publishing beside `gpumem-top record`: every
/// sample equals what `torch.cuda.memory_stats()` said in that phase, and
/// NVML's per-process used memory covers the reserved bytes.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_pytorch_process_publishes_what_torch_reports() {
    let _gpu = one_at_a_time();
    let dir = std::env::temp_dir().join(format!("gpumem-gpu-pub-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // The publisher writes only into our own private directory.
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let log = dir.join("phases.log");
    // Memory holds still within each phase: what torch reports at its start
    // is what any reading inside it must see.
    let script = format!(
        r#"
import os, sys, time, torch, gpumem_top_publish as g
d = {dir:?}
g.start(interval=0.2, directory=d)
keep = []
out = open({log:?}, "w")
print("ready", flush=True)
for k in range(8):
    keep.append(torch.empty((k + 1) * (96 << 20), dtype=torch.uint8, device="cuda"))
    if k % 3 == 2:
        del keep[0]
    torch.cuda.synchronize()
    s = torch.cuda.memory_stats()
    t0 = time.time()
    time.sleep(1.0)
    t1 = time.time()
    out.write("%f %f %d %d\n" % (t0, t1, s["allocated_bytes.all.current"], s["reserved_bytes.all.current"]))
    out.flush()
"#,
        dir = dir.display().to_string(),
        log = log.display().to_string()
    );
    let (mut py, line) = python(&script);
    assert_eq!(line.trim(), "ready");
    let rec = dir.join("rec.jsonl");
    let out = Command::new(bin())
        .args(["record", "--interval", "250", "--count", "30", "--publish-dir"])
        .arg(&dir)
        .arg("-o")
        .arg(&rec)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let pid = py.id();
    assert!(py.wait().unwrap().success());
    let phases: Vec<(f64, f64, u64, u64)> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f[0].parse().unwrap(), f[1].parse().unwrap(), f[2].parse().unwrap(), f[3].parse().unwrap())
        })
        .collect();
    let text = std::fs::read_to_string(&rec).unwrap();
    let (mut matched, mut nvml_checked) = (0, 0);
    for l in text.lines().skip(1) {
        let v: Value = serde_json::from_str(l).unwrap();
        let Some(p) = v["publishers"].as_array().and_then(|a| a.iter().find(|p| p["pid"] == pid)) else { continue };
        let t = p["time"].as_f64().unwrap();
        let (a, r) = (u(p, "allocated_bytes"), u(p, "reserved_bytes"));
        if let Some(ph) = phases.iter().find(|ph| t > ph.0 + 0.01 && t < ph.1 - 0.01) {
            assert_eq!((a, r), (ph.2, ph.3), "sample at {t} in phase {ph:?}");
            matched += 1;
        }
        let used = v["gpus"][0]["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["pid"] == pid)
            .and_then(|q| q["used_bytes"].as_u64());
        if let Some(used) = used {
            assert!(used >= r, "NVML {used} < reserved {r}");
            nvml_checked += 1;
        }
    }
    println!("publisher: {matched} samples equal torch.cuda.memory_stats() of their phase; NVML >= reserved in {nvml_checked}; phases {phases:?}");
    assert!(matched >= 8, "{matched} samples matched");
    assert!(nvml_checked >= 8);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Python process with the publisher on its path; stdin stays open (closing
/// it can end the script); returns it and the first line it printed.
fn python(script: &str) -> (std::process::Child, String) {
    let mut py = Command::new("python3")
        .arg("-c")
        .arg(script)
        .env("PYTHONPATH", common::root().join("assets/python"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(py.stdout.take().unwrap()), &mut line).unwrap();
    (py, line)
}

fn live_json(extra: &[&str]) -> Value {
    let out = Command::new(bin()).arg("--json").args(extra).output().expect("gpumem-top --json");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("--json output")
}

fn gpus_of(v: &Value) -> Vec<Value> {
    v["gpus"].as_array().expect("gpus").clone()
}

fn pid_on(v: &Value, pid: u32) -> Vec<(u64, u64)> {
    gpus_of(v)
        .iter()
        .filter_map(|g| {
            let p = g["processes"].as_array()?.iter().find(|p| p["pid"] == pid)?;
            Some((g["index"].as_u64()?, p["used_bytes"].as_u64()?))
        })
        .collect()
}

fn render_live(app: &mut gpumem_top::ui::live::LiveApp) -> String {
    common::render_live(app, 160, 50)
}

/// Issue 8, on a machine with several GPUs: `--json` lists them all; a
/// `synth --backend cuda --device 1` run shows up on that GPU only, with
/// NVML's bytes equal to our reserved bytes plus the context; a PyTorch
/// publisher on cuda:1 lands on GPU 1; `serve` has one series per GPU; the
/// live view lists every GPU with its bar and `1`–`9` switch between them.
#[test]
#[ignore = "needs several NVIDIA GPUs"]
#[allow(clippy::too_many_lines, reason = "one scenario on a multi-GPU machine, each step needing the one before")]
fn multi_gpu_every_gpu_listed_and_a_run_on_gpu_1_seen_there_only() {
    let _gpu = one_at_a_time();
    use gpumem_top::monitor::sampler::{LiveSource, Source};
    use gpumem_top::monitor::GpuQuery;
    let mut q = gpumem_top::monitor::NvmlQuery::open().expect("NVML");
    let n = q.device_count().expect("device count");
    // `.gpu/run.sh` runs every ignored test on whatever machine it gets: on
    // one GPU there is nothing to check (say so, do not fail the run); set
    // GPUMEM_TOP_MULTI_GPU=1 to make one GPU a failure.
    if n < 2 && std::env::var_os("GPUMEM_TOP_MULTI_GPU").is_none() {
        println!("multi-GPU checks not run: NVML lists {n} GPU(s)");
        return;
    }
    assert!(n >= 2, "this test needs two GPUs or more; NVML lists {n}");
    let before = live_json(&[]);
    let gs = gpus_of(&before);
    assert_eq!(gs.len(), n as usize);
    for (i, g) in gs.iter().enumerate() {
        assert_eq!(g["index"], i as u64);
        assert!(g["total_bytes"].as_u64().unwrap() > 0 && g["uuid"].as_str().unwrap().starts_with("GPU-"));
        println!("before: GPU {i} {} used {} of {}", g["uuid"], g["used_bytes"], g["total_bytes"]);
    }
    let used_before: Vec<u64> = gs.iter().map(|g| g["used_bytes"].as_u64().unwrap()).collect();

    // A PyTorch process publishing on cuda:1, and our synth run on CUDA device 1.
    let dir = std::env::temp_dir().join(format!("gpumem-multi-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // The publisher writes only into our own private directory.
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let script = format!(
        r#"
import sys, torch, gpumem_top_publish as g
torch.cuda.set_device(1)
x = torch.empty(768 << 20, dtype=torch.uint8, device="cuda")
y = torch.empty(100 << 20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
g.start(interval=0.2, directory={dir:?})
s = torch.cuda.memory_stats()
print("ready", s["allocated_bytes.all.current"], s["reserved_bytes.all.current"], flush=True)
sys.stdin.read()
"#,
        dir = dir.display().to_string()
    );
    let (mut py, line) = python(&script);
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(f.first(), Some(&"ready"), "{line}");
    let (torch_alloc, torch_reserved): (u64, u64) = (f[1].parse().unwrap(), f[2].parse().unwrap());
    let child = Command::new(bin())
        .args(["synth", "--backend", "cuda", "--device", "1", "--json", "--model", "gpt2", "--iterations", "100000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // Wait until NVML holds the run's steady state (reserved stops growing
    // after the first iteration): two equal readings in a row.
    let mut last = 0;
    let mut during = before.clone();
    for _ in 0..60 {
        std::thread::sleep(Duration::from_millis(500));
        during = live_json(&["--publish-dir", dir.to_str().unwrap()]);
        let on = pid_on(&during, pid);
        if on.len() == 1 && on[0].1 > (1 << 30) && on[0].1 == last {
            break;
        }
        last = on.first().map_or(0, |x| x.1);
    }
    let on = pid_on(&during, pid);
    println!("synth pid {pid} is on (GPU, used bytes) {on:?}");
    assert_eq!(on.len(), 1, "the run is on exactly one GPU");
    let (g1, used_by_run) = on[0];
    for (i, g) in gpus_of(&during).iter().enumerate() {
        let u = g["used_bytes"].as_u64().unwrap();
        println!("during: GPU {i} used {u} (before {})", used_before[i]);
        if i as u64 != g1 {
            assert!(u.abs_diff(used_before[i]) <= 16 << 20, "GPU {i} changed: {} -> {u}", used_before[i]);
        }
    }
    // The publisher is on GPU 1 (by its UUID) with what torch reported.
    let pubs = during["publishers"].as_array().unwrap();
    let p = pubs.iter().find(|p| p["pid"] == py.id()).expect("the publisher is listed");
    println!("publisher: {p}");
    assert_eq!(p["gpu"], 1);
    assert_eq!(
        (p["allocated_bytes"].as_u64(), p["reserved_bytes"].as_u64()),
        (Some(torch_alloc), Some(torch_reserved))
    );
    assert_eq!(pid_on(&during, py.id()).len(), 1);

    // serve: one series per GPU.
    let mut srv = Command::new(bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--interval", "200", "--publish-dir"])
        .arg(&dir)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut l = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(srv.stderr.take().unwrap()), &mut l).unwrap();
    let addr = l.split("http://").nth(1).and_then(|r| r.split('/').next()).expect(&l).to_string();
    std::thread::sleep(Duration::from_millis(800));
    let body = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
        let mut r = String::new();
        s.read_to_string(&mut r).unwrap();
        r.split_once("\r\n\r\n").unwrap().1.to_string()
    };
    // SAFETY: kill(2) touches no memory of ours; the pid is a child we
    // started and have not yet waited for.
    unsafe { libc_kill(srv.id() as i32, 15) };
    let _ = srv.wait();
    let used_series: Vec<&str> = body.lines().filter(|l| l.starts_with("gpumem_gpu_memory_used_bytes{")).collect();
    println!("serve: {used_series:#?}");
    assert_eq!(used_series.len(), n as usize, "one used-bytes series per GPU");
    for i in 0..n {
        assert!(used_series.iter().any(|l| l.contains(&format!("gpu=\"{i}\""))), "no series for GPU {i}");
    }
    let run_series = body
        .lines()
        .find(|l| l.starts_with("gpumem_process_memory_used_bytes{") && l.contains(&format!("pid=\"{pid}\"")))
        .expect("the run's process series");
    println!("serve: {run_series}");
    assert!(run_series.contains(&format!("gpu=\"{g1}\"")));
    let torch_series = body
        .lines()
        .find(|l| l.starts_with("gpumem_torch_reserved_bytes{") && l.contains(&format!("pid=\"{}\"", py.id())))
        .expect("the publisher's series");
    println!("serve: {torch_series}");
    assert!(torch_series.contains("gpu=\"1\"") && torch_series.ends_with(&format!(" {torch_reserved}")));

    // The live view, drawn from real NVML samples.
    let mut src = LiveSource::new(Box::new(q), Vec::new(), Some(dir.clone()));
    let mut app = gpumem_top::ui::live::LiveApp::new("live (NVML)".into(), None, false);
    app.ingest(src.snapshot());
    let screen = render_live(&mut app);
    println!("{screen}");
    for i in 0..n.min(9) {
        let row = screen.lines().find(|l| l.contains(&format!("{} GPU {i} ", i + 1))).expect("a row per GPU");
        assert!(row.contains('█') || row.contains('░'), "GPU {i} has its bar: {row}");
    }
    assert!(screen.contains("▶1 GPU 0") && screen.contains("No process on GPU 0 publishes"));
    // The run's pid is listed under its GPU's row only.
    let rows: Vec<&str> = screen.lines().collect();
    let gpu_row = |i: u64| rows.iter().position(|l| l.contains(&format!("{} GPU {i} ", i + 1))).unwrap();
    let pid_row = rows.iter().position(|l| l.contains(&format!("pid {pid:>7}"))).expect("the run is listed");
    assert!(pid_row > gpu_row(g1) && (g1 + 1 == n as u64 || pid_row < gpu_row(g1 + 1)));
    app.handle_key(crossterm::event::KeyEvent::from(crossterm::event::KeyCode::Char('2')));
    app.ingest(src.snapshot());
    let screen = render_live(&mut app);
    println!("{screen}");
    assert!(screen.contains("▶2 GPU 1"));
    assert!(screen.contains(&format!("pid {} python3", py.id())), "GPU 1 shows the publisher's allocator");
    app.handle_key(crossterm::event::KeyEvent::from(crossterm::event::KeyCode::Char('1')));
    assert!(render_live(&mut app).contains("▶1 GPU 0"));

    // Stop the run: its own NVML reading matches reserved + context, and
    // what `--json` saw on GPU 1 was the same.
    // SAFETY: as above: our own child, not yet waited for.
    unsafe { libc_kill(pid as i32, 2) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    println!("synth nvml_device {}", v["nvml_device"]);
    assert_eq!(v["nvml_device"]["cuda_index"], 1);
    assert_eq!(v["nvml_device"]["nvml_index"], g1);
    let ctx = u(&v, "cuda_context_bytes");
    let reserved = v["stats"]["reserved_bytes.all.peak"].as_u64().unwrap();
    let at_peak = u(&v, "nvml_used_bytes_at_peak");
    println!(
        "synth on GPU {g1}: reserved peak {reserved} + context {ctx} = {}; NVML at the peak {at_peak}; --json saw {used_by_run}",
        reserved + ctx
    );
    assert!((at_peak as f64 / (reserved + ctx) as f64 - 1.0).abs() < 0.01);
    assert!((used_by_run as f64 / (reserved + ctx) as f64 - 1.0).abs() < 0.01);
    drop(py.stdin.take());
    assert!(py.wait().unwrap().success());
    std::thread::sleep(Duration::from_millis(500));
    let after = live_json(&[]);
    for (i, g) in gpus_of(&after).iter().enumerate() {
        let u = g["used_bytes"].as_u64().unwrap();
        println!("after: GPU {i} used {u} (before {})", used_before[i]);
    }
    assert!(pid_on(&after, pid).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `gpumem-top run --step-peaks --history` beside a real PyTorch loop whose
/// batch varies per step: every step's recorded peaks equal the script's
/// own max_memory_allocated()/max_memory_reserved() at the step's end (it
/// resets them before each step), and the snapshot it asked for mid-run
/// replays exactly.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn run_records_each_steps_own_peaks_of_a_real_pytorch_loop() {
    let _gpu = one_at_a_time();
    let dir = std::env::temp_dir().join(format!("gpumem-gpu-run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (rec, steps, snap) = (dir.join("rec.jsonl"), dir.join("steps.json"), dir.join("snap.pickle"));
    let out = Command::new(bin())
        .args(["run", "--step-peaks", "--history", "100000", "--interval", "200", "-o"])
        .arg(&rec)
        .arg("--publish-dir")
        .arg(dir.join("pub"))
        .args(["--", "python3"])
        .arg(common::root().join("tests/scripts/torch_steps.py"))
        .arg(&steps)
        .env("GPUMEM_TOP_BIN", bin())
        .env("SNAPSHOT_OUT", &snap)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let script: Value = serde_json::from_str(&std::fs::read_to_string(&steps).unwrap()).unwrap();
    let out = Command::new(bin()).arg("replay").arg(&rec).arg("--json").output().unwrap();
    let rep: Value = serde_json::from_slice(&out.stdout).unwrap();
    let p =
        rep["processes"].as_array().unwrap().iter().find(|p| p["pid"] == script["pid"]).expect("the script's process");
    let ours = p["steps"].as_array().unwrap();
    let rows = script["rows"].as_array().unwrap();
    assert_eq!(ours.len(), rows.len(), "every step recorded");
    for (o, r) in ours.iter().zip(rows) {
        assert_eq!(o["step"], r["step"]);
        assert_eq!(
            (&o["allocated_peak_bytes"], &o["reserved_peak_bytes"]),
            (&r["max_allocated"], &r["max_reserved"]),
            "step {}",
            r["step"]
        );
    }
    let distinct: std::collections::BTreeSet<u64> =
        ours.iter().map(|o| o["allocated_peak_bytes"].as_u64().unwrap()).collect();
    assert!(distinct.len() >= 6, "the batches give different peaks: {distinct:?}");
    assert_eq!(rows[19]["snapshot_rc"], 0);
    let out = Command::new(bin()).arg("replay").arg(&snap).arg("--json").output().unwrap();
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(j["fidelity"] == "exact" || j["fidelity"] == "exact-window", "{}", j["fidelity"]);
    println!(
        "run --step-peaks: {} steps equal the script's readings (peaks {:?}); snapshot at step 20: {} events, {}",
        ours.len(),
        distinct,
        j["events"],
        j["fidelity"]
    );
    let _ = std::fs::remove_dir_all(&dir);
}
