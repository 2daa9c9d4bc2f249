//! GPU-only checks of the synthetic mode's CUDA backend (run on the device
//! machine through ../shared/tools/gpu-bundle.sh; `cargo test` skips them).

use std::process::{Command, Stdio};
use std::time::Duration;

use gpumem_top::monitor::ProcessMemory;
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
    let root = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
    let dir = std::env::temp_dir().join(format!("gpumem-gpu-pub-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
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
    let mut py = Command::new("python3")
        .arg("-c")
        .arg(&script)
        .env("PYTHONPATH", format!("{root}/assets/python"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(py.stdout.take().unwrap()), &mut line).unwrap();
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
