//! Replay of real PyTorch snapshots, recorded on an H200 with torch 2.11,
//! through the `gpumem-top` binary: fidelity, stats against what PyTorch
//! reported, the event stream, the JSON contract and the other input formats.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::fixture;
use gpumem_top::alloc::{Action, BlockState};
use gpumem_top::trace;
use serde_json::Value;

const TRACES: [&str; 5] =
    ["gpt2_train", "gpt2_train_expandable", "resnet50_train", "llama_pressure", "multistream_pipeline"];

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpumem-top"))
}

fn run(args: &[&str]) -> Output {
    Command::new(bin()).args(args).output().expect("run gpumem-top")
}

fn truth(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(&format!("traces/{name}.truth.json"))).unwrap()).unwrap()
}

fn trace_path(name: &str) -> String {
    fixture(&format!("traces/{name}.pickle.gz")).to_string_lossy().to_string()
}

fn replay_json(name: &str, extra: &[&str]) -> Value {
    let t = truth(name);
    let path = trace_path(name);
    let mut args = vec!["replay", path.as_str(), "--json"];
    let limit = t["memory_limit_bytes"].as_u64().map(|l| l.to_string());
    if let Some(l) = &limit {
        args.extend(["--memory-limit", l]);
    }
    args.extend_from_slice(extra);
    let out = run(&args);
    assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{name}: not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn every_trace_replays_exactly_and_reaches_pytorchs_stats() {
    for name in TRACES {
        let j = replay_json(name, &[]);
        let t = truth(name);
        assert_eq!(j["fidelity"], "exact", "{name}: {}", j["first_divergence"]);
        assert_eq!(j["first_divergence"], Value::Null);
        assert_eq!(j["format"], "pytorch-snapshot");
        assert_eq!(j["trace"], format!("{name}.pickle.gz"));
        let stats = j["stats"].as_object().unwrap();
        // All of PyTorch 2.11's memory_stats(): 121 counters and max_split_size.
        assert_eq!(stats.len(), 122, "{name}: all of memory_stats()");
        assert_eq!(stats["max_split_size"], -1, "{name}: unlimited, as PyTorch reports it");
        // Every value PyTorch reported at the end of the run, not only the
        // eight the contract names.
        for (k, want) in t["stats"].as_object().unwrap() {
            assert_eq!(&stats[k], want, "{name}: {k}");
        }
        let peak = &j["peak"];
        assert_eq!(peak["allocated_bytes"], t["stats"]["allocated_bytes.all.peak"], "{name}");
        assert!(peak["time_us"].as_i64().unwrap() > 1_700_000_000_000_000, "{name}: time_us is µs since the epoch");
        let pr = 1.0
            - t["stats"]["allocated_bytes.all.peak"].as_f64().unwrap()
                / t["stats"]["reserved_bytes.all.peak"].as_f64().unwrap();
        assert!((j["fragmentation"]["peak_ratio"].as_f64().unwrap() - pr).abs() < 1e-4, "{name}");
        assert_eq!(
            j["fragmentation"]["at_peak_reserved_minus_allocated_bytes"].as_u64().unwrap(),
            peak["reserved_bytes"].as_u64().unwrap() - peak["allocated_bytes"].as_u64().unwrap()
        );
        assert_eq!(j["compare"], serde_json::json!([]));
    }
}

#[test]
fn gpt2_peak_is_found_at_its_event() {
    let j = replay_json("gpt2_train", &[]);
    assert_eq!(j["events"], 14327);
    assert_eq!(j["peak"]["event"], 4400);
    assert_eq!(j["peak"]["allocated_bytes"], 17_423_266_816u64);
    assert_eq!(j["peak"]["reserved_bytes"], 19_815_989_248u64);
    assert_eq!(j["fragmentation"]["peak_ratio"], 0.1207);
}

#[test]
fn dump_events_equals_the_recorded_trace_event_for_event() {
    let dir = tempdir();
    for name in TRACES {
        let out = dir.join(format!("{name}.jsonl"));
        let out_s = out.to_string_lossy().to_string();
        replay_json(name, &["--dump-events", &out_s]);
        let recorded = trace::load(Path::new(&trace_path(name))).unwrap();
        let dumped = trace::load(&out).unwrap();
        assert_eq!(dumped.format, trace::TraceFormat::Jsonl);
        let (r, d) = (&recorded.devices[0].events, &dumped.devices[0].events);
        assert_eq!(r.len(), d.len(), "{name}");
        for (i, (a, b)) in r.iter().zip(d.iter()).enumerate() {
            // oom entries record cudaMemGetInfo's free bytes, which no replay knows.
            let same = a.action == b.action
                && a.size == b.size
                && a.stream == b.stream
                && (a.action == Action::Oom || a.addr == b.addr);
            assert!(same, "{name} event {i}: recorded {a:?}, dumped {b:?}");
        }
        // Our own JSONL replays exactly too, given the config and limit
        // (JSONL carries events only).
        let t = truth(name);
        let conf = t["alloc_conf"].as_str().unwrap().to_string();
        let limit = t["memory_limit_bytes"].as_u64().map(|l| l.to_string());
        let mut args = vec!["replay", out_s.as_str(), "--json"];
        if !conf.is_empty() {
            args.extend(["--alloc-conf", conf.as_str()]);
        }
        if let Some(l) = &limit {
            args.extend(["--memory-limit", l.as_str()]);
        }
        let j: Value = serde_json::from_slice(&run(&args).stdout).unwrap();
        assert_eq!(j["fidelity"], "exact", "{name} from JSONL: {}", j["first_divergence"]);
        assert_eq!(j["format"], "jsonl");
    }
}

#[test]
fn a_real_snapshot_with_cpp_frames_and_an_oom_decodes_field_by_field() {
    let t = trace::load(&fixture("traces/small_snapshot.pickle")).unwrap();
    assert_eq!(t.devices.len(), 1);
    let d = &t.devices[0];
    assert_eq!(d.events.len(), 17);
    assert_eq!(d.segments.len(), 3);
    let s0 = &d.segments[0];
    assert_eq!((s0.address, s0.total_size, s0.small), (139_826_149_982_208, 31_457_280, false));
    assert_eq!(s0.blocks[0].state, BlockState::ActiveAllocated);
    let frames = &t.stacks[s0.blocks[0].stack as usize - 1];
    assert_eq!(frames.len(), 28);
    assert_eq!(&*frames[0].name, "torch::unwind::unwind()");
    assert_eq!(&*frames[0].filename, "??");
    let s2 = &d.segments[2];
    assert_eq!(
        s2.blocks.iter().map(|b| (b.size, b.requested_size, b.state)).collect::<Vec<_>>(),
        [(20480, 20000, BlockState::ActiveAllocated), (2_076_672, 400, BlockState::Inactive)]
    );
    let oom = d.events.iter().find(|e| e.action == Action::Oom).unwrap();
    // `device_free` goes where PyTorch's other entries keep the address.
    assert_eq!((oom.addr, oom.size), (149_446_328_320, 1_125_899_906_842_624));
    assert_eq!(d.events.iter().filter(|e| e.action == Action::Snapshot).count(), 2);
    let st = t.settings.as_ref().unwrap();
    assert_eq!((st.conf.as_str(), st.max_split_size, st.expandable_segments), ("", Some(-1), Some(false)));
    // It replays exactly, its OOM included.
    let out = run(&["replay", &fixture("traces/small_snapshot.pickle").to_string_lossy(), "--json"]);
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["fidelity"], "exact");
    assert_eq!(j["stats"]["num_ooms"], 1);
}

#[test]
fn a_3000_allocation_fixture_with_python_frames_replays_exactly() {
    let t = trace::load(&fixture("traces/fixture_py3000.pickle.gz")).unwrap();
    let d = t.main_device().unwrap();
    assert_eq!(d.events.len(), 8916);
    assert!(d.stacks.iter().filter(|&&s| s != 0).count() > 8000);
    let out = run(&["replay", &fixture("traces/fixture_py3000.pickle.gz").to_string_lossy(), "--json"]);
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["fidelity"], "exact", "{}", j["first_divergence"]);
}

#[test]
fn what_if_and_compare_answer_the_expandable_segments_question() {
    let path = trace_path("gpt2_train");
    let out = run(&[
        "replay",
        &path,
        "--json",
        "--compare",
        "expandable_segments:True",
        "--compare",
        "max_split_size_mb:128",
    ]);
    assert!(out.status.success());
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    let c = j["compare"].as_array().unwrap();
    assert_eq!(c.len(), 3);
    // The first row is the run as recorded.
    assert_eq!(c[0]["peak_reserved_bytes"], 19_815_989_248u64);
    assert_eq!(c[0]["peak_allocated_bytes"], 17_423_266_816u64);
    assert_eq!(c[1]["alloc_conf"], "expandable_segments:True");
    // From the default run's requests alone, the what-if reaches the peaks
    // PyTorch itself reported when the same training ran with expandable
    // segments (gpt2_train_expandable.truth.json), to the byte.
    let es = truth("gpt2_train_expandable");
    assert_eq!(c[1]["peak_reserved_bytes"], es["stats"]["reserved_bytes.all.peak"]);
    assert_eq!(c[1]["peak_allocated_bytes"], es["stats"]["allocated_bytes.all.peak"]);
    assert_eq!(c[2]["alloc_conf"], "max_split_size_mb:128");
    for row in c {
        assert_eq!(row["num_ooms"], 0);
    }

    let out = run(&["replay", &path, "--json", "--alloc-conf", "expandable_segments:True"]);
    let w: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(w["fidelity"], "what-if");
    assert_eq!(w["alloc_conf"], "expandable_segments:True");
    assert_eq!(w["stats"]["reserved_bytes.all.peak"], c[1]["peak_reserved_bytes"]);

    // A memory limit below what the run needs turns allocations into OOMs.
    let out = run(&["replay", &path, "--json", "--memory-limit", "8000000000"]);
    let l: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(l["fidelity"], "what-if");
    assert!(l["stats"]["num_ooms"].as_u64().unwrap() > 0);
    assert!(l["stats"]["reserved_bytes.all.peak"].as_u64().unwrap() <= 8_000_000_000);
    // It says where the run would stop, and fails as that run would.
    assert_eq!(out.status.code(), Some(1));
    let o = &l["first_new_oom"];
    assert_eq!(o["event"], 737, "{o}");
    assert_eq!(o["requested_bytes"], 100_663_296, "{o}");
    assert_eq!(o["call_site"], "activations.py:66 forward", "{o}");
    assert_eq!(o["script_site"], "train_workloads.py:16 loop", "{o}");
    assert_eq!(o["failing_allocations"], l["stats"]["num_ooms"], "{o}");
    let out = run(&["replay", &path, "--memory-limit", "8000000000"]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("would run out of memory at event 737 of 14327, 0.344 s in: a request of 96.00 MiB on stream 0 at activations.py:66 forward, called from train_workloads.py:16 loop;"),
        "{text}"
    );
    // Under a limit it fits in: replayed exactly, no OOM, exit 0.
    let out = run(&["replay", &path, "--json", "--memory-limit", "20000000000"]);
    assert_eq!(out.status.code(), Some(0));
    let l: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((l["fidelity"].as_str(), l["first_new_oom"].is_null()), (Some("exact"), true));
}

#[test]
fn the_human_summary_names_fidelity_peak_and_fragmentation() {
    let out = run(&["replay", &trace_path("llama_pressure"), "--memory-limit", "9006592819"]);
    assert!(out.status.success());
    let s = String::from_utf8(out.stdout).unwrap();
    assert!(s.contains("fidelity: exact, all 4547 events reproduced"), "{s}");
    assert!(s.contains("| Allocated memory        |   64.00 MiB |    7.87 GiB |   14.40 GiB |   14.34 GiB |"), "{s}");
    assert!(s.lines().filter(|l| l.starts_with('|')).all(|l| l.chars().count() == 83), "{s}");
    assert!(s.contains("OOMs: 1"), "{s}");
    assert!(s.contains("peak: event 3815"), "{s}");
    // The reserved at the allocated peak is said as that, and the reserved
    // peak beside it, equal to the table's.
    let table_peak = s
        .lines()
        .find(|l| l.starts_with("| GPU reserved memory"))
        .unwrap()
        .split('|')
        .nth(3)
        .unwrap()
        .trim()
        .to_string();
    let peak = s.lines().find(|l| l.starts_with("peak: event")).unwrap();
    assert!(
        peak.contains(" then, reserved but unallocated ") && peak.ends_with(&format!("; peak reserved {table_peak}")),
        "{peak}"
    );
    assert!(s.contains("peak_ratio 0.0552"), "{s}");
}

#[test]
fn an_rmm_log_replays_its_requests() {
    let dir = tempdir();
    let p = dir.join("rmm.csv");
    std::fs::write(
        &p,
        "Thread,Time,Action,Pointer,Size,Stream\n\
         1,08:00:00:000001,allocate,0x7f0000000000,5242880,0x0\n\
         1,08:00:00:000002,allocate,0x7f0000500000,3145728,0x0\n\
         1,08:00:00:000003,free,0x7f0000000000,5242880,0x0\n",
    )
    .unwrap();
    let out = run(&["replay", &p.to_string_lossy(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["format"], "rmm-csv");
    assert_eq!(j["fidelity"], "what-if");
    // 5 MiB and 3 MiB share one 20 MiB segment; the 5 MiB block is free again.
    assert_eq!(j["stats"]["reserved_bytes.all.current"], 20 << 20);
    assert_eq!(j["stats"]["allocated_bytes.all.current"], 3 << 20);
    assert_eq!(j["stats"]["allocated_bytes.all.peak"], 8 << 20);
}

pub fn tempdir() -> common::TmpDir {
    common::TmpDir::new(&format!("test-{}", rand_suffix()))
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed) * 1000
        + std::time::SystemTime::now().elapsed().map(|d| d.as_nanos() as u64 % 1000).unwrap_or(0)
}

/// The same GPT-2 snapshot with its first 3,000 trace entries dropped, as a
/// ring buffer of `max_entries` would (made with CPython's pickle).
#[test]
fn a_wrapped_trace_is_rebuilt_from_its_final_segments_and_says_so() {
    let out = run(&["replay", &fixture("traces/gpt2_train_wrapped.pickle.gz").to_string_lossy(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["start"], "window");
    assert_eq!(j["fidelity"], "exact-window", "{}", j["first_divergence"]);
    assert_eq!(j["events"], 14327 - 3000);
    let t = truth("gpt2_train");
    for k in [
        "allocated_bytes.all.current",
        "reserved_bytes.all.current",
        "segment.all.current",
        "inactive_split_bytes.all.current",
    ] {
        assert_eq!(j["stats"][k], t["stats"][k], "{k}");
    }
    let text = run(&["replay", &fixture("traces/gpt2_train_wrapped.pickle.gz").to_string_lossy()]);
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.starts_with("note: the trace does not start at process start (its ring buffer wrapped"), "{text}");
    assert_eq!(replay_json("gpt2_train", &[])["start"], "process-start");
}

/// A run that ran out of memory: `--json` lists the OOM as the trace
/// recorded it (the request, what the device had free, its stack), the
/// summary names it, and `--at oom` prints the stack (#37 item 4). The
/// H200 Llama run under a memory fraction of 0.06: PyTorch's own message
/// said "130.78 GiB is free … 8.39 GiB allowed".
#[test]
fn a_recorded_oom_is_reported_with_its_request_free_memory_and_stack() {
    let j = replay_json("llama_pressure", &[]);
    let ooms = j["recorded_ooms"].as_array().unwrap();
    assert_eq!(ooms.len(), 1);
    let o = &ooms[0];
    assert_eq!(
        (o["event"].as_u64(), o["size_bytes"].as_u64(), o["stream"].as_u64()),
        (Some(3816), Some(122_732_544), Some(0))
    );
    assert_eq!(o["device_free_bytes"], 140_428_574_720u64);
    assert!(truth("llama_pressure")["ended_in_oom"].as_str().unwrap().contains("of which 130.78 GiB is free"));
    assert_eq!(o["cause"], "process_limit");
    assert_eq!(o["call_site"], "activations.py:103 forward");
    assert_eq!(o["frames"][0], "site-packages/torch/nn/functional.py:2397 silu");
    assert_eq!(o["frames"].as_array().unwrap().len(), 23);
    let out = run(&["replay", &trace_path("llama_pressure")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("OOM recorded at event 3816 (0.656 s in): a request of 117.05 MiB on stream 0 with 130.78 GiB free on the device (room enough: a per-process memory limit refused it), at activations.py:103 forward"), "{text}");
    let out = run(&["replay", &trace_path("llama_pressure"), "--at", "oom"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("  the recorded OOM: event 3816"), "{text}");
    assert!(text.contains("\n    site-packages/transformers/activations.py:103 forward\n"), "{text}");
    // A run without one lists none.
    assert_eq!(replay_json("gpt2_train", &[])["recorded_ooms"], serde_json::json!([]));
}

/// `--at peak` and `--at oom` print the state there, as `--at N` does,
/// not the end state under a line naming another event (#37 item 16).
#[test]
fn the_summary_table_is_the_state_at_the_moment_asked_for() {
    let table = |extra: &[&str]| {
        let path = trace_path("gpt2_train");
        let mut args = vec!["replay", path.as_str()];
        args.extend_from_slice(extra);
        let out = run(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let row = |text: &str, label: &str| -> Vec<String> {
        let l = text.lines().find(|l| l.starts_with(&format!("| {label}"))).unwrap_or_else(|| panic!("{text}"));
        l.split('|').skip(2).map(|c| c.trim().to_string()).filter(|c| !c.is_empty()).collect()
    };
    let end = table(&[]);
    let peak = table(&["--at", "peak"]);
    let j = replay_json("gpt2_train", &[]);
    let p = j["peak"]["event"].as_u64().unwrap();
    // At the peak, current is the peak: 16.23 GiB allocated, 18.46 GiB reserved.
    let alloc = row(&peak, "Allocated memory");
    assert_eq!(alloc[0], alloc[1], "{peak}");
    assert_eq!(alloc[0], "16.23 GiB");
    assert_ne!(row(&end, "Allocated memory")[0], alloc[0]);
    assert!(peak.contains(&format!("; at event {p}: reserved_unallocated_bytes")), "{peak}");
    assert!(peak.contains(&format!("at the peak: event {p} of 14327")), "{peak}");
    // The same table as stopping at that event by number.
    let by_number = table(&["--at", &p.to_string()]);
    for label in ["Allocated memory", "GPU reserved memory", "Allocations", "Non-releasable memory"] {
        assert_eq!(row(&by_number, label), row(&peak, label), "{label}");
    }
    // The OOM: allocated just before the failed request, as PyTorch's message had it.
    let path = trace_path("llama_pressure");
    let oom = run(&["replay", &path, "--memory-limit", "9006592819", "--at", "oom"]);
    let oom = String::from_utf8_lossy(&oom.stdout);
    assert_eq!(row(&oom, "Allocated memory")[0], "7.87 GiB", "{oom}");
    assert!(oom.contains("first OOM: event 3816") && oom.contains("; at event 3816: "), "{oom}");
}

/// A replay that parts from the recording says so in one sentence: the
/// event, what PyTorch did and what we would have done, in words and sizes,
/// and what to try; no Rust debug output (it printed `recorded Some(Event
/// { action: … })`), in every command that replays.
#[test]
fn a_divergence_is_one_readable_sentence_everywhere() {
    let d = common::TmpDir::new("diverge");
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join("moved.jsonl");
    std::fs::write(
        &p,
        "{\"action\":\"segment_alloc\",\"addr\":139637976727552,\"size\":20971520,\"stream\":0}\n\
         {\"action\":\"alloc\",\"addr\":139637976731648,\"size\":2097152,\"stream\":0}\n",
    )
    .unwrap();
    let f = p.to_str().unwrap();
    let said = "event 1: PyTorch allocated 2.00 MiB at 0x7f0000001000 where we would have allocated 2.00 MiB at 0x7f0000000000";
    let runs: [&[&str]; 4] = [
        &["replay", f],
        &["tune", f],
        &["export", f, "--view", "fragmap", "--format", "txt", "-o", "-"],
        &["diff", f, f],
    ];
    for args in runs {
        let o = std::process::Command::new(common::bin()).args(args).output().unwrap();
        let all = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(all.contains(said), "{args:?}: {all}");
        assert!(!all.contains("Some(") && !all.contains("Event {"), "{args:?}: {all}");
    }
    let o = std::process::Command::new(common::bin()).args(["replay", f]).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("to try: a run under a memory limit"));
}

/// A what-if replay (`--alloc-conf`) states its own peak, as the table
/// does: the `peak (what-if):` line, and `peak` and `categories.at_peak` in
/// `--json`, at the request that first reached the table's allocated peak;
/// the categories there are the tensors then alive.
#[test]
fn a_what_if_states_its_peak_and_what_the_memory_is_there() {
    let args = ["replay", &trace_path("gpt2_train"), "--alloc-conf", "expandable_segments:True"];
    let out = run(&[&args[..], &["--json"]].concat());
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["fidelity"], "what-if");
    let peak = &j["peak"];
    assert_eq!(peak["allocated_bytes"], j["stats"]["allocated_bytes.all.peak"], "{peak}");
    assert_eq!(j["categories"]["at_peak"]["event"], peak["event"]);
    let sum: u64 = j["categories"]["at_peak"]["bytes"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    let allocated = peak["allocated_bytes"].as_u64().unwrap();
    // Requested bytes against blocks: within the 512 B rounding of each.
    assert!(sum <= allocated && allocated - sum < 1 << 20, "{sum} vs {allocated}");
    let text = String::from_utf8(run(&args).stdout).unwrap();
    let line = text.lines().find(|l| l.starts_with("peak (what-if): at the request of event ")).expect("a peak line");
    assert!(line.contains(&format!("event {} (", peak["event"])), "{line}");
    assert!(text.contains("what the memory is at the peak: activations"), "{text}");
}

/// A what-if that runs out of memory where the run did not says which
/// setting avoids it, checked as tune checks it: GPT-2 with varying
/// lengths under 5 GiB OOMs with PyTorch's defaults, and not with
/// expandable segments, as the real runs under that limit did
/// (tests/fixtures/tune/limit_5gib.jsonl: 1 OOM, then 0 at 4.84 GiB).
#[test]
fn a_what_if_that_runs_out_names_the_setting_that_avoids_it() {
    let f = common::fixture("tune/gpt2_varying.pickle.gz");
    let out = run(&["replay", f.to_str().unwrap(), "--memory-limit", "5GiB", "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["fidelity"], "what-if");
    assert_eq!(j["stats"]["num_ooms"], 1);
    assert_eq!(
        j["oom_advice"],
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True avoids it (peak reserved 4.84 GiB; checked by replaying this run under 49 settings: gpumem-top tune)"
    );
}

/// One numbering for a stop inside a malloc: event 0 of resnet50_train is
/// the segment_alloc its first allocation (event 1) makes in the same
/// malloc, so `replay --at 0`, its `--json` and `export --at 0` all show
/// and name the state after event 1, and say why; `there:` is never empty.
#[test]
fn a_stop_inside_a_malloc_names_the_event_it_shows() {
    let t = trace_path("resnet50_train");
    let text = String::from_utf8(run(&["replay", &t, "--at", "0"]).stdout).unwrap();
    assert!(
        text.contains("stopped after event 1: event 0 (segment_alloc) is made by the same malloc as event 1"),
        "{text}"
    );
    assert!(text.contains("  there: parameters 36.75 KiB (100%)"), "{text}");
    let j: serde_json::Value = serde_json::from_slice(&run(&["replay", &t, "--at", "0", "--json"]).stdout).unwrap();
    assert_eq!(j["categories"]["at"]["event"], 1);
    let pic =
        String::from_utf8(run(&["export", &t, "--at", "0", "--view", "fragmap", "--format", "txt", "-o", "-"]).stdout)
            .unwrap();
    assert!(pic.lines().next().unwrap().contains("event 1/9789"), "{pic}");
    // A stop on an allocation is that event.
    let text = String::from_utf8(run(&["replay", &t, "--at", "2"]).stdout).unwrap();
    assert!(text.contains("stopped after event 2: the table above is the state there"), "{text}");
}

/// A device the trace does not have: one line naming the file and the
/// devices it has, exit code 2, for replay and tune alike.
#[test]
fn a_missing_device_is_named_with_the_file_and_the_devices_it_has() {
    let f = fixture("ranks/rank0.pickle.gz");
    for cmd in ["replay", "tune"] {
        let out = Command::new(bin()).arg(cmd).arg(&f).args(["--device", "7"]).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{cmd}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err, format!("gpumem-top: {}: the trace has no device 7 (it has: 0)\n", f.display()), "{cmd}");
    }
}

/// tools/big-snapshot.py makes a long trace from a short real one (an MLP
/// trained 12 steps on the H200, `measurements/ten_million/record_loop.py`):
/// its steady iteration repeated, which replays exactly with the peak
/// PyTorch printed for the real run, its iterations marked (12 + 46), and
/// its frames shared, so it costs no more bytes per event than the
/// recording did.
#[test]
fn the_big_snapshot_generator_repeats_a_steady_iteration_exactly() {
    let d = common::TmpDir::new("big");
    let out = d.0.join("long.pickle");
    let src = fixture("traces/small_loop.pickle.gz");
    let gen = Command::new("python3")
        .arg(common::root().join("tools/big-snapshot.py"))
        .args([src.to_str().unwrap(), out.to_str().unwrap(), "--events", "5000"])
        .output()
        .expect("python3 runs the generator");
    let said = String::from_utf8_lossy(&gen.stdout);
    assert!(gen.status.success(), "{}", String::from_utf8_lossy(&gen.stderr));
    assert!(
        said.contains("device 0, 5,072 events (1,070 recorded; events 965..1,052, 87 a period, repeated 46 times)"),
        "{said}"
    );
    // Made again over it: refused without --force, the file kept.
    let made = std::fs::read(&out).unwrap();
    let again = Command::new("python3")
        .arg(common::root().join("tools/big-snapshot.py"))
        .args([src.to_str().unwrap(), out.to_str().unwrap(), "--events", "2000"])
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&again.stderr),
        format!("big-snapshot: {}: already exists (--force replaces it)\n", out.display())
    );
    assert_eq!(std::fs::read(&out).unwrap(), made);
    let o = run(&["replay", out.to_str().unwrap(), "--json"]);
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["fidelity"], "exact");
    assert_eq!(j["events"], 5072);
    // What the recording script printed from torch.cuda.memory_stats().
    assert_eq!(j["peak"]["allocated_bytes"], 99_929_600);
    assert_eq!(j["peak"]["reserved_bytes"], 111_149_056);
    let txt = d.0.join("t.txt");
    run(&[
        "export",
        out.to_str().unwrap(),
        "--view",
        "timeline",
        "--format",
        "txt",
        "--plain",
        "-o",
        txt.to_str().unwrap(),
    ]);
    assert!(std::fs::read_to_string(&txt).unwrap().contains("╵ 58 iterations"));
    let mut unpacked = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(std::fs::File::open(&src).unwrap()), &mut unpacked)
        .unwrap();
    let per_event = |bytes: usize, events: usize| bytes as f64 / events as f64;
    let made = std::fs::metadata(&out).unwrap().len() as usize;
    assert!(per_event(made, 5072) <= per_event(unpacked.len(), 1070), "{made} bytes for 5,072 events");
}
