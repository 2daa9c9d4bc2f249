//! Traces whose ring buffer wrapped: simulated by dropping the first events of
//! real traces (what `max_entries` does). The starting state is rebuilt from
//! the final segments; the replay must then reproduce every remaining event
//! and end in PyTorch's current values.

mod common;

use common::fixture;
use gpumem_top::replay::wrapped::{reconstruct, replay_wrapped, starts_empty};
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
        dev.events.drain(..cut);
        dev.time_us.drain(..cut);
        dev.stacks.drain(..cut);
        assert!(!starts_empty(&dev), "{name} cut at {cut}: detected as wrapped");
        let (r, _) =
            replay_wrapped(&dev.events, &opts, &dev, 64).unwrap_or_else(|e| panic!("{name} cut at {cut}: {e}"));
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

#[test]
fn expandable_segments_say_they_cannot_be_rebuilt() {
    let t = trace::load(&fixture("traces/gpt2_train_expandable.pickle.gz")).unwrap();
    let mut dev = t.devices[0].clone();
    dev.events.drain(..1000);
    let e = reconstruct(&dev, &t.settings.as_ref().unwrap().config()).unwrap_err();
    assert!(e.contains("expandable segments is not supported"), "{e}");
}
