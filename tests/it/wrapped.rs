//! Traces whose ring buffer wrapped: simulated by dropping the first events of
//! real traces (what `max_entries` does). The starting state is rebuilt from
//! the final segments; the replay must then reproduce every remaining event
//! and end in PyTorch's current values.

use crate::common;

use common::fixture;
use gpumem_top::replay::wrapped::{replay_wrapped, starts_empty};
use gpumem_top::replay::ReplayOptions;
use gpumem_top::trace;
use serde_json::Value;

const CURRENT: [&str; 9] = [
    "allocated_bytes.all.current",
    "reserved_bytes.all.current",
    "active_bytes.all.current",
    "requested_bytes.all.current",
    "inactive_split_bytes.all.current",
    "allocation.all.current",
    "active.all.current",
    "segment.all.current",
    "inactive_split.all.current",
];

/// Cuts the trace at 19 points spread over it (not round fractions, so cuts
/// land inside mallocs, retries and iterations alike).
fn check(name: &str) -> usize {
    let t = trace::load(&fixture(&format!("traces/{name}.pickle.gz"))).unwrap();
    let truth: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(&format!("traces/{name}.truth.json"))).unwrap()).unwrap();
    let full = &t.devices[0];
    assert!(starts_empty(full), "{name}: the full trace starts at process start");
    let mut opts = ReplayOptions::new(t.settings.as_ref().unwrap().config(), 150_109_880_320);
    opts.memory_limit = truth["memory_limit_bytes"].as_u64();
    let mut checked = 0;
    for k in 1..20 {
        let cut = (full.events.len() * k / 20 + k * 7).min(full.events.len() - 1);
        let mut dev = full.clone();
        std::sync::Arc::make_mut(&mut dev.events).drain_front(cut);
        dev.time_us.drain_front(cut);
        std::sync::Arc::make_mut(&mut dev.stacks).drain(..cut);
        assert!(!starts_empty(&dev), "{name} cut at {cut}: detected as wrapped");
        let (r, _) =
            replay_wrapped(dev.events.view(), &opts, &dev, 64).unwrap_or_else(|e| panic!("{name} cut at {cut}: {e}"));
        assert!(r.divergence.is_none(), "{name} cut at {cut}: {:?}", r.divergence);
        assert_eq!(r.reproduced, dev.events.len());
        r.allocator.check_invariants().unwrap();
        let s = r.allocator.stats();
        for k in CURRENT {
            assert_eq!(Some(s.value(k).unwrap()), truth["stats"][k].as_i64(), "{name} cut at {cut}: {k}");
        }
        checked += 1;
    }
    checked
}

#[test]
fn gpt2_from_19_cuts() {
    assert_eq!(check("gpt2_train"), 19);
}

#[test]
fn resnet50_from_19_cuts() {
    assert_eq!(check("resnet50_train"), 19);
}

#[test]
fn llama_under_a_memory_limit_with_retries_and_an_oom_from_19_cuts() {
    assert_eq!(check("llama_pressure"), 19);
}

#[test]
fn two_streams_with_pending_frees_from_19_cuts() {
    assert_eq!(check("multistream_pipeline"), 19);
}

/// Expandable segments (#31 item 1): each reservation's mapped pages at
/// the window's start are its final ones with the window's maps and unmaps
/// undone; cut at 19 points, every window replays exactly and ends in
/// PyTorch's current values.
#[test]
fn gpt2_with_expandable_segments_from_19_cuts() {
    assert_eq!(check("gpt2_train_expandable"), 19);
}

/// A GPT-2 run recorded on the H200 with `expandable_segments:True` and
/// `max_entries=3000`: its ring buffer really wrapped. It replays as
/// `exact-window` and ends in every current value PyTorch reported.
#[test]
fn a_real_wrapped_snapshot_of_expandable_segments_replays_exactly() {
    let out = std::process::Command::new(common::bin())
        .args([
            "replay",
            &fixture("expandable_and_switches/wrapped_expandable_gpt2.pickle.gz").to_string_lossy(),
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    let truth: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("expandable_and_switches/wrapped_expandable_gpt2.truth.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(j["fidelity"], "exact-window");
    assert_eq!(j["events"], 3000);
    let mut compared = 0;
    for (k, v) in truth["stats"].as_object().unwrap() {
        if k.ends_with(".current") {
            assert_eq!(&j["stats"][k], v, "{k}");
            compared += 1;
        }
    }
    assert_eq!(compared, 29);
    // Expandable segments count in no segment statistic, as in PyTorch.
    assert_eq!(j["stats"]["segment.all.current"], 0);
    assert!(j["segments"].as_array().unwrap().iter().all(|s| s["is_expandable"] == true));
}
