//! Snapshots recorded on the H200 under conditions the file does not state
//! (measurements/conditions/record.py, torch 2.11, each with the
//! `memory_stats()` PyTorch reported at the end, the limit it ran under and
//! the trace entry at which it changed its settings): a per-process limit,
//! `_set_allocator_settings` mid-run, and both. The replay finds them
//! (docs/user/replay.md, "Conditions"), and its figures are PyTorch's.

use crate::common;

use std::process::Command;

use common::fixture;
use serde_json::Value;

fn truth(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(&format!("conditions/{name}.truth.json"))).unwrap()).unwrap()
}

fn json(cmd: &str, file: &std::path::Path, extra: &[&str]) -> Value {
    let out =
        Command::new(env!("CARGO_BIN_EXE_gpumem-top")).arg(cmd).arg(file).arg("--json").args(extra).output().unwrap();
    assert!(out.status.success(), "{}: {}", file.display(), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn text(cmd: &str, file: &std::path::Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem-top")).arg(cmd).arg(file).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// PyTorch's counters and reserved peaks, which no uncertainty of where a
/// change fell touches.
fn assert_pytorchs(name: &str, j: &Value, t: &Value) {
    for k in [
        "reserved_bytes.all.peak",
        "reserved_bytes.all.current",
        "allocated_bytes.all.current",
        "segment.all.current",
        "num_alloc_retries",
        "num_ooms",
        "num_device_alloc",
        "num_device_free",
    ] {
        assert_eq!(j["stats"][k], t["stats"][k], "{name}: {k}");
    }
}

/// Runs under `set_per_process_memory_fraction`: their retries, GC releases
/// and OOMs bound the limit, which is found as a range holding the real one,
/// said, and replayed under, with no flag.
#[test]
fn the_limit_a_run_had_is_found_from_its_snapshot() {
    for name in ["limit_retries", "limit_oom", "limit_oom_stop", "limit_split_gc", "limit_es_gc"] {
        let t = truth(name);
        let real = t["memory_limit_bytes"].as_u64().unwrap();
        let snap = fixture(&format!("conditions/{name}.pickle.gz"));
        let j = json("replay", &snap, &[]);
        assert_eq!(j["fidelity"], "exact", "{name}: {}", j["first_divergence"]);
        let f = &j["memory_limit_found"];
        let (lo, hi, used) =
            (f["lo_bytes"].as_u64().unwrap(), f["hi_bytes"].as_u64().unwrap(), f["used_bytes"].as_u64().unwrap());
        assert!(lo <= real && real <= hi, "{name}: the real limit {real} is not in {lo}..={hi}");
        assert!(lo <= used && used <= hi && j["memory_limit_bytes"] == used, "{name}: {f}");
        // Under any limit in the range the replay is exact: the ends too.
        for l in [lo, hi] {
            let k = json("replay", &snap, &["--memory-limit", &l.to_string()]);
            assert_eq!(k["fidelity"], "exact", "{name} under {l}: {}", k["first_divergence"]);
        }
        assert_eq!(j["inferred_empty_cache_calls"], 0, "{name}: every release is the limit's");
        assert_pytorchs(name, &j, &t);
        // A report that reads a state follows the change too: the state at
        // the peak is the peak's.
        let p = json("replay", &snap, &["--at", "peak"]);
        assert_eq!(p["stats"]["allocated_bytes.all.current"], j["peak"]["allocated_bytes"], "{name}");
        let s = text("replay", &snap);
        assert!(s.contains("memory limit: the run's own, found from the trace ("), "{name}: {s}");
    }
    // A GC threshold acts only under a limit: said, though this run never
    // reached it, so nothing bounds it.
    let j = json("replay", &fixture("conditions/limit_gc.pickle.gz"), &[]);
    assert!(j["memory_limit_found"].is_null());
    assert!(j["conditions_note"].as_str().unwrap().starts_with("garbage_collection_threshold acts only under a per-process memory limit, so the run had one: at least 3.51 GiB"), "{}", j["conditions_note"]);
}

/// `_set_allocator_settings` mid-run, for each setting and several at once,
/// with and without a limit: the change is placed in a window holding the
/// real one (the trace entry recorded when it was called), the settings
/// before it are found where the trace tells them, and every counter and
/// reserved peak is PyTorch's.
#[test]
fn settings_changed_mid_run_are_found_and_followed() {
    for name in [
        "switch_split_roundup",
        "switch_roundup",
        "switch_split",
        "switch_es_split",
        "switch_from_env",
        "switch_es_limit",
        "switch_gc_split_limit",
    ] {
        let t = truth(name);
        let real = t["switch_event"].as_u64().unwrap();
        let snap = fixture(&format!("conditions/{name}.pickle.gz"));
        let j = json("replay", &snap, &[]);
        assert_eq!(j["fidelity"], "exact", "{name}: {}", j["first_divergence"]);
        let c = &j["settings_changed"];
        let (earliest, event) = (c["earliest"].as_u64().unwrap(), c["event"].as_u64().unwrap());
        assert!(earliest <= real && real <= event, "{name}: the change at {real} is not in {earliest}..={event}");
        if name != "switch_gc_split_limit" {
            assert_eq!(c["from"], t["alloc_conf"], "{name}");
        } else {
            // The GC threshold acted before the split size showed: the
            // trace cannot tell whether it came with it or before.
            assert!(!c["from"].as_str().unwrap().contains("max_split_size_mb"), "{name}: {c}");
            let real_limit = t["memory_limit_bytes"].as_u64().unwrap();
            let f = &j["memory_limit_found"];
            assert!(f["lo_bytes"].as_u64().unwrap() <= real_limit && real_limit <= f["hi_bytes"].as_u64().unwrap());
        }
        assert_pytorchs(name, &j, &t);
        // A report that reads a state follows the change too: the state at
        // the peak is the peak's.
        let p = json("replay", &snap, &["--at", "peak"]);
        assert_eq!(p["stats"]["allocated_bytes.all.current"], j["peak"]["allocated_bytes"], "{name}");
        let s = text("replay", &snap);
        assert!(s.contains("allocator settings changed during the run"), "{name}");
        assert!(!s.contains("private pools"), "{name}: no private pool in this run");
    }
    // A GC threshold set mid-run under a limit: its limit is found (the
    // run's retry is one), and PyTorch's defaults under it explain every
    // event, so nothing places the change, which is said.
    let t = truth("switch_gc_limit");
    let snap = fixture("conditions/switch_gc_limit.pickle.gz");
    let j = json("replay", &snap, &[]);
    assert_eq!(j["fidelity"], "exact");
    assert_eq!(j["settings_changed"]["from"], "");
    let real = t["memory_limit_bytes"].as_u64().unwrap();
    let f = &j["memory_limit_found"];
    assert!(f["lo_bytes"].as_u64().unwrap() <= real && real <= f["hi_bytes"].as_u64().unwrap(), "{f}");
    assert_pytorchs("switch_gc_limit", &j, &t);
    assert!(text("replay", &snap).contains("PyTorch's defaults explain every event, so the change to \"garbage_collection_threshold:0.7\" is not placed by anything the trace records"));
}

/// tune on a run that OOMed under its limit ranks every setting under that
/// limit, found from the snapshot: none is above it, and the run's own row
/// is its exact replay.
#[test]
fn tune_ranks_under_the_limit_the_run_had() {
    let snap = fixture("traces/llama_pressure.pickle.gz");
    let j = json("tune", &snap, &[]);
    let limit = j["memory_limit_bytes"].as_u64().unwrap();
    let f = &j["memory_limit_found"];
    assert!(f["lo_bytes"].as_u64().unwrap() <= 9_006_592_819 && 9_006_592_819 <= f["hi_bytes"].as_u64().unwrap());
    assert!(j["recorded_is_the_run"].as_bool().unwrap());
    assert_eq!(j["recorded"]["num_ooms"], 1);
    for c in j["candidates"].as_array().unwrap() {
        assert!(c["reserved_peak_bytes"].as_u64().unwrap() <= limit, "{c}");
    }
    let t = text("tune", &snap);
    assert!(t.lines().nth(1).unwrap().starts_with("memory limit: the run's own, found from the trace"), "{t}");
}

/// tune on a window: the recorded row is the window's exact replay, as
/// `replay` prints it, and savings are measured from it.
#[test]
fn tune_on_a_window_states_the_replays_own_figures() {
    let snap = fixture("traces/gpt2_train_wrapped.pickle.gz");
    let r = json("replay", &snap, &[]);
    assert_eq!(r["fidelity"], "exact-window");
    let j = json("tune", &snap, &[]);
    assert_eq!(j["covers"], "window");
    assert!(j["recorded_is_the_run"].as_bool().unwrap());
    assert_eq!(j["recorded"]["reserved_peak_bytes"], r["stats"]["reserved_bytes.all.peak"]);
    assert_eq!(j["recorded"]["allocated_peak_bytes"], r["stats"]["allocated_bytes.all.peak"]);
}
