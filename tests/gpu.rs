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
