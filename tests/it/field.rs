//! The snapshots users really bring (recorded on an H200 with torch 2.11,
//! each with the `memory_stats()` PyTorch reported at the end): CUDA graphs,
//! torch.compile's graph trees and MemPools (private pools), a wrapped ring
//! buffer with no segment events, and a snapshot taken without history.

use crate::common;

use std::process::Command;
use std::sync::Arc;

use common::fixture;
use gpumem_top::replay::pools::{self, PoolPlan};
use gpumem_top::replay::session::Fidelity;
use gpumem_top::replay::{replay_events, OpenOptions, ReplayOptions};
use gpumem_top::trace;
use serde_json::Value;

const H200: u64 = 150_109_880_320;

fn truth(name: &str) -> Value {
    let t: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(&format!("snapshot_kinds/{name}.truth.json"))).unwrap())
            .unwrap();
    t["stats"].clone()
}

fn replay_json(file: &str, extra: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem-top"))
        .arg("replay")
        .arg(fixture(&format!("snapshot_kinds/{file}")))
        .arg("--json")
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "{file}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The three numbers every kind must reach: the snapshot's own state.
fn assert_current(name: &str, j: &Value) {
    let t = truth(name);
    for k in ["allocated_bytes.all.current", "reserved_bytes.all.current", "segment.all.current"] {
        assert_eq!(j["stats"][k], t[k], "{name}: {k}");
    }
}

/// Recorded from process start: every peak and counter PyTorch reported,
/// except the one the trace cannot show (an empty_cache() that frees
/// nothing leaves no entry), which the JSON names.
#[test]
fn private_pool_traces_replay_exactly_with_pytorchs_numbers() {
    for name in ["cudagraph_infer_gpt2", "compile_reduce_overhead_train", "mempools"] {
        let j = replay_json(&format!("{name}.pickle.gz"), &[]);
        assert_eq!(j["fidelity"], "exact", "{name}: {}", j["first_divergence"]);
        assert_eq!(j["start"], "process-start");
        assert_eq!(j["directed_releases"], 0, "{name}: our release order is PyTorch's");
        assert_current(name, &j);
        let t = truth(name);
        let mut checked = 0;
        for (k, v) in t.as_object().unwrap() {
            if k == "num_sync_all_streams" {
                continue;
            }
            assert_eq!(&j["stats"][k], v, "{name}: {k}");
            checked += 1;
        }
        assert!(checked >= 20, "{name}: {checked} stats compared");
        assert!(j["not_in_trace"].as_array().unwrap().iter().any(|x| x == "num_sync_all_streams"));
    }
}

#[test]
fn the_json_says_which_pool_each_segment_belongs_to() {
    let pools_of = |name: &str| -> Vec<(Value, u64)> {
        let j = replay_json(&format!("{name}.pickle.gz"), &[]);
        j["pools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["segment_pool_id"].clone(), p["segments"].as_u64().unwrap()))
            .collect()
    };
    let id = |a: u64, b: u64| serde_json::json!([a, b]);
    assert_eq!(pools_of("cudagraph_infer_gpt2"), vec![(id(0, 0), 23), (id(1, 0), 2)]);
    assert_eq!(pools_of("compile_reduce_overhead_train"), vec![(id(0, 0), 3), (id(0, 1), 4)]);
    assert_eq!(pools_of("mempools"), vec![(id(0, 2), 10)]);
    // Per segment, as the snapshot's segment_pool_id says.
    let j = replay_json("cudagraph_infer_gpt2.pickle.gz", &[]);
    let t = trace::load(&fixture("snapshot_kinds/cudagraph_infer_gpt2.pickle.gz")).unwrap();
    for s in &t.devices[0].segments {
        let ours = j["segments"].as_array().unwrap().iter().find(|x| x["address"] == s.address).unwrap();
        assert_eq!(ours["segment_pool_id"], id(s.pool.0, s.pool.1), "segment {:#x}", s.address);
        assert_eq!(ours["private_pool"], s.pool != (0, 0));
    }
}

/// The inference is what makes these exact: with every request in the
/// default pools, each of them diverges where the spec says simpler rules fail.
#[test]
fn without_pool_inference_the_private_pool_traces_diverge() {
    for (name, first_bad) in
        [("mempools", 2usize), ("cudagraph_infer_gpt2", 1915), ("compile_reduce_overhead_train", 160)]
    {
        let t = trace::load(&fixture(&format!("snapshot_kinds/{name}.pickle.gz"))).unwrap();
        let dev = t.main_device().unwrap();
        let conf = t.settings.as_ref().map(|s| s.config()).unwrap_or_default();
        let mut opts = ReplayOptions::new(conf, H200);
        let r = replay_events(dev.events.view(), &opts);
        assert_eq!(r.divergence.as_ref().map(|d| d.event), Some(first_bad), "{name}");
        opts.pools = Arc::new(pools::plan(dev, &t.stacks, gpumem_top::alloc::Release::V2_11));
        let r = replay_events(dev.events.view(), &opts);
        assert!(r.divergence.is_none(), "{name}: {:?}", r.divergence);
        r.allocator.check_invariants().unwrap();
    }
}

/// An empty plan is the old default-pool replay: ordinary traces see no change.
#[test]
fn the_plan_of_an_ordinary_trace_has_no_private_pool() {
    for name in ["gpt2_train", "llama_pressure", "multistream_pipeline"] {
        let t = trace::load(&fixture(&format!("traces/{name}.pickle.gz"))).unwrap();
        let p: PoolPlan = pools::plan(t.main_device().unwrap(), &t.stacks, gpumem_top::alloc::Release::V2_11);
        assert!(!p.any_private, "{name}");
    }
}

#[test]
fn a_wrapped_window_without_segment_events_is_exact_window() {
    let name = "wrapped_steady_resnet50";
    let j = replay_json(&format!("{name}.pickle.gz"), &[]);
    assert_eq!(j["fidelity"], "exact-window", "{}", j["first_divergence"]);
    assert_eq!(j["start"], "window");
    assert_eq!(j["stats_cover"], "window");
    assert_current(name, &j);
    // Every current value PyTorch reported is the end state's.
    let t = truth(name);
    for (k, v) in t.as_object().unwrap() {
        if k.ends_with(".current") {
            assert_eq!(&j["stats"][k], v, "{k}");
        }
    }
    // The peak of the window is at most the run's, and reached in it.
    let peak = j["peak"]["allocated_bytes"].as_u64().unwrap();
    assert!(peak <= t["allocated_bytes.all.peak"].as_u64().unwrap() && peak > 0);
    // --at works on a window.
    let at = replay_json(&format!("{name}.pickle.gz"), &["--at", "100"]);
    assert_eq!(at["fidelity"], "exact-window");
}

#[test]
fn a_snapshot_without_history_is_state_only() {
    for file in ["history_less_gpt2.pickle.gz", "history_less_segment_list.pickle.gz"] {
        let j = replay_json(file, &[]);
        assert_eq!(j["fidelity"], "state-only", "{file}");
        assert_eq!(j["events"], 0);
        assert_current("history_less_gpt2", &j);
        let t = truth("history_less_gpt2");
        for k in ["active_bytes.all.current", "requested_bytes.all.current", "inactive_split_bytes.all.current"] {
            assert_eq!(j["stats"][k], t[k], "{file}: {k}");
        }
        assert_eq!(j["recorded_totals"]["reserved_bytes"], 4_208_984_064u64);
        assert!(j["peak"].is_null());
        assert_eq!(j["fragmentation"]["reserved_unallocated_bytes"], 4_208_984_064u64 - 1_563_807_744);
    }
}

#[test]
fn protocol_0_pickles_replay_like_the_binary_ones() {
    let a = replay_json("mempools.pickle.gz", &[]);
    let b = replay_json("mempools_protocol0.pickle.gz", &[]);
    assert_eq!(b["fidelity"], "exact");
    assert_eq!(a["stats"], b["stats"]);
    assert_eq!(a["segments"], b["segments"]);
}

/// The session is the one thing every front end replays through.
#[test]
fn sessions_classify_each_kind_and_end_in_the_snapshots_state() {
    for (name, want) in [
        ("cudagraph_infer_gpt2", Fidelity::Exact),
        ("compile_reduce_overhead_train", Fidelity::Exact),
        ("mempools", Fidelity::Exact),
        ("wrapped_steady_resnet50", Fidelity::ExactWindow),
        ("history_less_gpt2", Fidelity::StateOnly),
    ] {
        let t = trace::load(&fixture(&format!("snapshot_kinds/{name}.pickle.gz"))).unwrap();
        let opened =
            gpumem_top::replay::open(&t, name, &OpenOptions { device_total: H200, ..Default::default() }).unwrap();
        let (dev, s) = (opened.dev, &opened.session);
        assert_eq!(s.fidelity, want, "{name}");
        // Recorded with torch 2.11: no pool_id on the entries says so.
        if name != "history_less_gpt2" {
            assert_eq!(s.release, gpumem_top::alloc::Release::V2_11, "{name}");
        }
        assert_eq!(s.recorded, s.replayed, "{name}");
        // The scrubber (TUI, export) ends in the same state.
        let mut sc = s.scrubber(256).unwrap();
        let last = dev.events.len().saturating_sub(1);
        assert_eq!(sc.seek(last).memory_stats(), s.exact.allocator.memory_stats(), "{name}");
    }
}

#[test]
fn export_draws_every_field_snapshot() {
    for (name, needle) in [
        ("cudagraph_infer_gpt2", "in private pools (*)"),
        ("compile_reduce_overhead_train", "in private pools (*)"),
        ("mempools", "10 in private pools (*)"),
        ("wrapped_steady_resnet50", "109 segments"),
        ("history_less_gpt2", "139 segments"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_gpumem-top"))
            .arg("export")
            .arg(fixture(&format!("snapshot_kinds/{name}.pickle.gz")))
            .args(["--view", "fragmap", "--format", "txt", "--plain", "--at", "end", "-o", "-"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains(needle), "{name}: no {needle:?} in\n{text}");
    }
}

/// Every recorded snapshot beside its truth (the five above and those
/// `measurements/snapshot_kinds/record_field.py` recorded on the H200: graphs sharing a
/// pool, make_graphed_callables, graph trees with checkpointed pools,
/// MemPools destroyed, expandable segments under graphs, a wrapped window of
/// graph replays, no history): faithful, ending in PyTorch's current state;
/// from process start, every stat PyTorch reported but the syncs a trace
/// cannot show.
#[test]
fn every_field_snapshot_reaches_pytorchs_numbers() {
    let dir = fixture("snapshot_kinds");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let Some(name) = p.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".truth.json")) else {
            continue;
        };
        let j = replay_json(&format!("{name}.pickle.gz"), &[]);
        assert!(
            ["exact", "exact-window", "state-only"].contains(&j["fidelity"].as_str().unwrap()),
            "{name}: {} {}",
            j["fidelity"],
            j["first_divergence"]
        );
        assert_eq!(j["directed_releases"], 0, "{name}");
        assert_current(name, &j);
        if j["start"] == "process-start" {
            for (k, v) in truth(name).as_object().unwrap() {
                if k != "num_sync_all_streams" {
                    assert_eq!(&j["stats"][k], v, "{name}: {k}");
                }
            }
        }
        n += 1;
    }
    assert!(n >= 13, "{n} snapshots");
}

/// A graph tree's checkpoint restore puts blocks back in place, not by
/// best fit: without placing them, that replay diverges.
#[test]
fn checkpointed_graph_tree_pools_are_restored_in_place() {
    let j = replay_json("compile_reduce_overhead_infer_shapes.pickle.gz", &[]);
    assert_eq!(j["fidelity"], "exact");
    assert!(j["placed_allocs"].as_u64().unwrap() > 0);
    assert_eq!(replay_json("compile_reduce_overhead_mlp.pickle.gz", &[])["placed_allocs"], 0);
}

/// Recorded on the H200 for the field round 4 (measurements/snapshot_kinds/record_round4.py):
/// a snapshot without history of GPT-2 training under expandable segments.
/// PyTorch counts its expandable segments in no `segment` statistic and no
/// `inactive_split` one: every current statistic is PyTorch's, and a
/// state-only replay gives no peaks or totals anywhere (JSON, summary).
#[test]
fn a_history_less_snapshot_of_expandable_segments_counts_as_pytorch_does() {
    let snap = fixture("expandable_and_switches/history_less_expandable.pickle.gz");
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem-top")).arg("replay").arg(&snap).arg("--json").output().unwrap();
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["fidelity"], "state-only");
    let truth: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("expandable_and_switches/history_less_expandable.truth.json")).unwrap(),
    )
    .unwrap();
    let mut n = 0;
    for (k, v) in truth["stats"].as_object().unwrap() {
        if k.ends_with(".current") {
            assert_eq!(&j["stats"][k], v, "{k}");
            n += 1;
        } else if k.ends_with(".peak") || k.ends_with(".allocated") || k.ends_with(".freed") {
            assert!(j["stats"].get(k).is_none(), "{k}: a state-only replay has no peaks or totals");
        }
    }
    assert!(n >= 29, "{n} current statistics compared");
    assert_eq!(j["stats"]["segment.all.current"], 0);
    assert!(j["peak"].is_null());
    let text = Command::new(env!("CARGO_BIN_EXE_gpumem-top")).arg("replay").arg(&snap).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    let row = text.lines().find(|l| l.starts_with("| Allocated memory")).unwrap();
    assert!(row.ends_with("|           - |           - |           - |"), "{row}");
}

/// Recorded on the H200 (measurements/snapshot_kinds/record_round4.py): training under
/// PyTorch's defaults, then `torch.cuda.memory._set_allocator_settings(
/// "expandable_segments:True")` and more steps. The snapshot's settings are
/// the final ones; replaying from the start with them ran out of memory at
/// event 0, which the run never did. Now the change is found in the segment
/// events and followed: every event reproduced, and reserved bytes and
/// segments are PyTorch's; where the change fell between two events is
/// said, since totals that depend on splitting do.
#[test]
fn settings_changed_during_the_run_are_found_and_followed() {
    let snap = fixture("expandable_and_switches/settings_changed.pickle.gz");
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem-top")).arg("replay").arg(&snap).arg("--json").output().unwrap();
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["fidelity"], "exact", "{}", j["first_divergence"]);
    assert_eq!(j["settings_changed"], serde_json::json!({"event": 3779, "earliest": 1551, "from": ""}));
    let truth: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("expandable_and_switches/settings_changed.truth.json")).unwrap(),
    )
    .unwrap();
    for (k, v) in truth["stats"].as_object().unwrap() {
        if k.starts_with("reserved_bytes")
            || k.starts_with("segment.")
            || k.ends_with(".current")
            || k.starts_with("num_")
        {
            assert_eq!(&j["stats"][k], v, "{k}");
        }
    }
    let text = Command::new(env!("CARGO_BIN_EXE_gpumem-top")).arg("replay").arg(&snap).output().unwrap();
    assert!(String::from_utf8_lossy(&text.stdout).contains("allocator settings changed during the run"));
}

/// `--compare` (and `--alloc-conf`) on a snapshot without history: one
/// clear line and exit 2, not a table that contradicts itself.
#[test]
fn compare_on_a_history_less_snapshot_says_it_needs_history() {
    for flag in ["--compare", "--alloc-conf"] {
        let out = Command::new(env!("CARGO_BIN_EXE_gpumem-top"))
            .arg("replay")
            .arg(fixture("snapshot_kinds/history_less_gpt2.pickle.gz"))
            .args([flag, "expandable_segments:True"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("need a trace with history") && err.lines().count() == 1, "{err}");
        assert!(out.stdout.is_empty());
    }
}
