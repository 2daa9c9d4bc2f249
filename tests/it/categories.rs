//! Memory categories against ground truth recorded on an H200
//! (measurements/categories/record.py; docs/user/categories.md): each tensor noted as
//! it became known (parameters and buffers, the batch, every tensor
//! autograd saved, each .grad, each optimizer state tensor), matched to the
//! trace's blocks by address and time.

use crate::common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};

use common::fixture;
use gpumem_top::alloc::Action;
use gpumem_top::analysis::categories::{Category, Evidence};
use gpumem_top::trace;

struct Note {
    t: i64,
    ptr: u64,
    cat: Category,
}

fn notes(name: &str) -> Vec<Note> {
    let f = std::fs::File::open(fixture(&format!("categories/{name}.notes.jsonl.gz"))).unwrap();
    let mut out: Vec<Note> = BufReader::new(flate2::read::GzDecoder::new(f))
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(&l.unwrap()).unwrap();
            let cat = match v["cat"].as_str().unwrap() {
                "parameter" => Category::Parameter,
                "gradient" => Category::Gradient,
                "optimizer_state" => Category::OptimizerState,
                "activation" => Category::Activation,
                "input" => Category::Input,
                c => panic!("category {c}"),
            };
            Note { t: v["t"].as_i64().unwrap(), ptr: v["ptr"].as_u64().unwrap(), cat }
        })
        .collect();
    out.sort_by_key(|n| n.t);
    out
}

/// Per alloc event: the category of the first note inside its block while
/// it is alive (temporary when none is). Python's clock and the trace's
/// differ by a few microseconds: a note may fall up to SLACK µs outside.
fn truth(dev: &trace::DeviceTrace, notes: &[Note]) -> (HashMap<usize, Category>, usize) {
    const SLACK: i64 = 50;
    let mut life: Vec<(usize, u64, u64, i64, i64)> = Vec::new();
    let mut live: HashMap<u64, usize> = HashMap::new();
    for (i, e) in dev.events.iter().enumerate() {
        match e.action {
            Action::Alloc => {
                live.insert(e.addr, life.len());
                life.push((i, e.addr, e.size, dev.time_us.get(i).unwrap(), i64::MAX));
            }
            Action::FreeRequested => {
                if let Some(k) = live.remove(&e.addr) {
                    life[k].4 = dev.time_us.get(i).unwrap();
                }
            }
            _ => {}
        }
    }
    let mut by_start: Vec<usize> = (0..life.len()).collect();
    by_start.sort_by_key(|&k| life[k].1);
    let mut out = HashMap::new();
    let mut unmatched = 0;
    for n in notes {
        // The block holding the pointer, alive at the note, latest made.
        let hi = by_start.partition_point(|&k| life[k].1 <= n.ptr);
        let best = by_start[..hi]
            .iter()
            .rev()
            .filter(|&&k| {
                let (_, a, s, t0, t1) = life[k];
                n.ptr < a + s && t0 <= n.t + SLACK && n.t <= t1.saturating_add(SLACK)
            })
            .max_by_key(|&&k| life[k].3);
        match best {
            Some(&k) => {
                out.entry(life[k].0).or_insert(n.cat);
            }
            // An empty tensor's storage (pointer 0) has no block.
            None if n.ptr == 0 => {}
            None => unmatched += 1,
        }
    }
    (out, unmatched)
}

struct Score {
    peak_bytes: u64,
    right: u64,
    truth: [u64; 7],
    ours: [u64; 7],
    unmatched: usize,
    evidence: Evidence,
}

/// `replay PATH --json --at AT`, which must succeed.
fn replay_json(path: &std::path::Path, at: &str) -> serde_json::Value {
    let out = std::process::Command::new(common::bin())
        .arg("replay")
        .arg(path)
        .args(["--json", "--at", at])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Scores `replay --json --at peak`: each block alive at the peak, with
/// the category replay gives it, against the truth of the allocation that
/// made it.
fn score(name: &str) -> Score {
    score_file(name, &fixture(&format!("categories/{name}.pickle.gz")))
}

/// `score` of the recording at `path`, against `name`'s notes.
fn score_file(name: &str, path: &std::path::Path) -> Score {
    let t = trace::load(path).unwrap();
    let dev = t.main_device().unwrap();
    let (truth, unmatched) = truth(dev, &notes(name));
    let r = replay_json(path, "peak");
    let at = r["peak"]["event"].as_u64().unwrap() as usize;
    let peak_bytes = r["peak"]["allocated_bytes"].as_u64().unwrap();
    let recorded: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(&format!("categories/{name}.truth.json"))).unwrap())
            .unwrap();
    assert_eq!(peak_bytes, recorded["allocated_peak_bytes"].as_u64().unwrap(), "{name}: PyTorch's peak");
    // The allocation that made each block alive at the peak.
    let mut made: HashMap<u64, usize> = HashMap::new();
    for (i, e) in dev.events.iter().enumerate().take(at + 1) {
        match e.action {
            Action::Alloc => {
                made.insert(e.addr, i);
            }
            Action::FreeRequested => {
                made.remove(&e.addr);
            }
            _ => {}
        }
    }
    let evidence = match r["categories"]["evidence"].as_str().unwrap() {
        "stacks" => Evidence::Stacks,
        "markers" => Evidence::Markers,
        "block_stacks" => Evidence::BlockStacks,
        _ => Evidence::None,
    };
    let mut s = Score { peak_bytes, right: 0, truth: [0; 7], ours: [0; 7], unmatched, evidence };
    let index = |c: &str| Category::ALL.iter().position(|k| k.name() == c).unwrap();
    for b in r["segments"].as_array().unwrap().iter().flat_map(|g| g["blocks"].as_array().unwrap()) {
        if b["state"] == "inactive" {
            assert!(b["category"].is_null());
            continue;
        }
        let (addr, size) = (b["address"].as_u64().unwrap(), b["size"].as_u64().unwrap());
        let i = made[&addr];
        let want = truth.get(&i).copied().unwrap_or(Category::Temporary) as usize;
        let got = index(b["category"].as_str().unwrap());
        s.truth[want] += size;
        s.ours[got] += size;
        if want == got {
            s.right += size;
        }
    }
    // The report's bytes per category are its blocks', and sum to the peak.
    let reported: Vec<u64> =
        Category::ALL.iter().map(|c| r["categories"]["at_peak"]["bytes"][c.name()].as_u64().unwrap()).collect();
    assert_eq!(reported, s.ours, "{name}: bytes per category at the peak disagree with the blocks'");
    assert_eq!(reported.iter().sum::<u64>(), peak_bytes, "{name}: categories sum to the peak");
    s
}

const WORKLOADS: [&str; 9] = [
    "gpt2_adamw_fp32",
    "gpt2_adamw_bf16_accum2",
    "bert_adamw_fp16",
    "llama_adamw_fused_bf16",
    "resnet50_sgd_fp16",
    "convnext_adamw_fp32",
    "resnet18_sgd_fp32_nostacks",
    "vit_adamw_bf16_nostacks",
    "mlp_sgd_fp32_nostacks",
];

/// Recorded after the rules were fixed (measurements/categories/record.py
/// --held-out) and scored without changing them.
const HELD_OUT: [&str; 9] = [
    "t5_adafactor_fp32",
    "gpt2_oom_second_step",
    "gpt2_oom_first_step",
    "efficientnet_rmsprop_bf16",
    "gpt2_ckpt_adam_fp32",
    "distilbert_nesterov_keepgrads",
    "swin_adamw_fp16_nostacks",
    "resnet34_adagrad_nostacks",
    "mobilenet_adamw_accum3_nostacks",
];

/// Recorded later still (measurements/categories/record.py --llama-family):
/// Llama-family models (GQA, SwiGLU, RMSNorm) without stacks, and a script
/// that keeps a copy of each step's logits made between forward and
/// backward, with stacks and without.
const LLAMA_FAMILY_AND_LEAK: [&str; 5] = [
    "mistral_adamw_bf16_nostacks",
    "llama_sgd_fp32_nostacks",
    "qwen2_adamw_bf16_accum2_nostacks",
    "gpt2_leak_fp32",
    "gpt2_leak_fp32_nostacks",
];

/// The recordings with stacks above, their stacks removed
/// (measurements/categories/remove_stacks.py): the rules without stacks scored
/// on the same models, with the same notes.
const STACKS_REMOVED: [&str; 11] = [
    "gpt2_adamw_fp32",
    "gpt2_adamw_bf16_accum2",
    "bert_adamw_fp16",
    "llama_adamw_fused_bf16",
    "resnet50_sgd_fp16",
    "convnext_adamw_fp32",
    "t5_adafactor_fp32",
    "efficientnet_rmsprop_bf16",
    "gpt2_ckpt_adam_fp32",
    "distilbert_nesterov_keepgrads",
    "gpt2_leak_fp32",
];

#[test]
fn categories_at_the_peak_match_the_truth() {
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "| workload | evidence | peak allocated | right | truth (param/grad/optim/activ/input/temp) MiB | ours MiB |"
    );
    let mut failures = Vec::new();
    let removed: Vec<String> = STACKS_REMOVED.iter().map(|w| format!("{w} (stacks removed)")).collect();
    let all = WORKLOADS.iter().chain(&HELD_OUT).chain(&LLAMA_FAMILY_AND_LEAK).copied();
    for (w, s) in all.map(|w| (w, score(w))).chain(STACKS_REMOVED.iter().zip(&removed).map(|(w, label)| {
        (label.as_str(), score_file(w, &fixture(&format!("categories/stacks_removed/{w}.pickle.gz"))))
    })) {
        let share = s.right as f64 / s.peak_bytes as f64;
        let f = |a: [u64; 7]| a.iter().take(6).map(|&b| format!("{:.0}", mib(b))).collect::<Vec<_>>().join("/");
        println!(
            "| {w} | {} | {:.0} MiB | {:.1}% | {} | {} (unknown {:.0}) | unmatched notes {}",
            s.evidence.name(),
            mib(s.peak_bytes),
            share * 100.0,
            f(s.truth),
            f(s.ours),
            mib(s.ours[6]),
            s.unmatched
        );
        let goal = if s.evidence == Evidence::Stacks { 0.95 } else { 0.90 };
        assert_eq!(s.unmatched, 0, "{w}: notes that fall in no block");
        if share < goal {
            failures.push(format!("{w}: {:.1}% < {:.0}%", share * 100.0, goal * 100.0));
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// The replay app on a categories fixture at its peak, driven by `actions`,
/// drawn through its own `Interactive::draw` without colour.
fn screen(name: &str, w: u16, h: u16, actions: &[gpumem_top::ui::event::Command]) -> String {
    use gpumem_top::ui::app::ReplayApp;
    use gpumem_top::ui::event::Interactive;
    use ratatui_core::backend::TestBackend;
    use ratatui_core::terminal::Terminal;
    let t: &'static trace::Trace =
        Box::leak(Box::new(trace::load(&fixture(&format!("categories/{name}.pickle.gz"))).unwrap()));
    let opened = gpumem_top::replay::open(t, name, &Default::default()).unwrap();
    let mut app = ReplayApp::new(opened.model(format!("{name}.pickle.gz")).unwrap(), false);
    for &a in actions {
        app.dispatch(a);
    }
    let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
    term.draw(|f| app.draw(f)).unwrap();
    term.backend().to_string()
}

#[test]
fn the_replay_screen_says_what_the_memory_is() {
    use gpumem_top::ui::event::Command;
    // At the peak of GPT-2 under AdamW (5.46 GiB allocated): the allocated
    // bar in category letters, and the line naming the categories, largest
    // first, in the figures `replay --json` gives. The input is the batch
    // alone (32 KiB): the scalar the script divides the loss into after the
    // forward is a temporary, as the recording's notes say.
    let s = screen("gpt2_adamw_fp32", 160, 40, &[]);
    assert!(s.contains(" what it is A activ 2.9G  T temp 1.6G  O optim 634M  P params 313M  I input 32.0K"), "{s}");
    // To the trace's peak reserved: the bar is mostly activations.
    assert!(s.contains("│ allocated PPPPPOOOOOOOOOOOAAAAAAAA"), "{s}");
    // `w`: the map by category, with its key; each category's letter.
    let s = screen("gpt2_adamw_fp32", 160, 40, &[Command::ByCategory]);
    assert!(s.contains("P params G grads O optim A activ I input T temp"), "{s}");
    // The two 786M segments of temporaries, then optimizer state and
    // activations sharing one.
    assert!(s.contains("0x7f4962000000    786M  TTTTTTTTTT"), "{s}");
    assert!(s.contains("0x7f49d6000000    786M  OOOOOOOOOOOOOOTTTOOOO"), "{s}");
    assert!(s.contains("allocated stacked by category"), "{s}");
    // The block list names each block's category.
    let s = screen("gpt2_adamw_fp32", 160, 40, &[Command::Order, Command::Zoom]);
    assert!(s.contains("allocated    temp    "), "{s}");
    // The help defines them.
    let s = screen("gpt2_adamw_fp32", 160, 50, &[Command::Help]);
    assert!(s.contains("optimizer_state  made in the optimizer's step and kept after it"), "{s}");
    // Without stacks the screen says what the categories rest on.
    let s = screen("vit_adamw_bf16_nostacks", 160, 40, &[Command::ByCategory]);
    assert!(s.contains("U unknown ─ markers") || s.contains("? unknown ─ markers"), "{s}");
}

/// synth reports the same categories as replay, from what its model knows
/// each tensor is: on the configuration of a run recorded on the H200
/// (GPT-2, 6 layers, batch 8 × 512, AdamW, fp32), its parameters and AdamW
/// state at the peak are the replay's to the byte, its activations within
/// 5%; and its categories sum to its own peak.
#[test]
fn synth_and_replay_compare_category_by_category() {
    let json = |args: &[&str]| -> serde_json::Value {
        let out = std::process::Command::new(common::bin()).args(args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let synth = json(&[
        "synth",
        "--backend",
        "sim",
        "--json",
        "--model",
        "gpt2",
        "--layers",
        "6",
        "--batch",
        "8",
        "--seq",
        "512",
        "--iterations",
        "3",
        "--optimizer",
        "adam",
    ]);
    let path = fixture("categories/gpt2_adamw_fp32.pickle.gz");
    let replay = json(&["replay", path.to_str().unwrap(), "--json"]);
    let (s, r) = (&synth["categories"]["at_peak"], &replay["categories"]["at_peak"]["bytes"]);
    assert_eq!(synth["categories"]["evidence"], "model");
    let total: u64 = Category::ALL.iter().map(|c| s[c.name()].as_u64().unwrap()).sum();
    assert_eq!(total, synth["peak"]["allocated_bytes"].as_u64().unwrap());
    assert_eq!(s["parameter"], r["parameter"]);
    assert_eq!(s["optimizer_state"], r["optimizer_state"]);
    let (a, b) = (s["activation"].as_f64().unwrap(), r["activation"].as_f64().unwrap());
    assert!((a / b - 1.0).abs() < 0.05, "activations: synth {a}, replay {b}");
    let end: u64 = Category::ALL.iter().map(|c| synth["categories"]["at_end"][c.name()].as_u64().unwrap()).sum();
    assert_eq!(end, synth["stats"]["allocated_bytes.all.current"].as_u64().unwrap());
}

/// A snapshot without history (`enabled="state"`, `context="state"`): only
/// the live blocks' own stacks. Taken on the H200 at a step's forward end
/// (measurements/categories/record_state.py), with every parameter, optimizer
/// state tensor, and that step's batch and saved tensors noted: a block
/// takes the category of the first note inside it, else temporary.
#[test]
fn a_snapshot_without_history_is_categorized_by_its_blocks_stacks() {
    let path = fixture("categories/gpt2_state_only.pickle.gz");
    let r = replay_json(&path, "end");
    assert_eq!(r["categories"]["evidence"], "block_stacks");
    let f = std::fs::File::open(fixture("categories/gpt2_state_only.notes.jsonl.gz")).unwrap();
    let notes: Vec<(u64, String)> = BufReader::new(flate2::read::GzDecoder::new(f))
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(&l.unwrap()).unwrap();
            (v["ptr"].as_u64().unwrap(), v["cat"].as_str().unwrap().to_string())
        })
        .collect();
    let (mut right, mut total, mut unknown) = (0u64, 0u64, 0u64);
    for b in r["segments"].as_array().unwrap().iter().flat_map(|g| g["blocks"].as_array().unwrap()) {
        if b["state"] == "inactive" {
            continue;
        }
        let (a, size) = (b["address"].as_u64().unwrap(), b["size"].as_u64().unwrap());
        let want = notes.iter().find(|(p, _)| (a..a + size).contains(p)).map_or("temporary", |n| n.1.as_str());
        total += size;
        right += size * u64::from(b["category"] == want);
        unknown += size * u64::from(b["category"] == "unknown");
    }
    let share = right as f64 / total as f64;
    println!("state-only GPT-2: {:.1}% of {} MiB right, {} MiB unknown", share * 100.0, total >> 20, unknown >> 20);
    assert!(share >= 0.95, "{share}");
    // What had no stack to tell by is counted as unknown, not guessed.
    assert_eq!(r["categories"]["at_end"]["bytes"]["unknown"].as_u64().unwrap(), unknown);
}

/// The categories' first half runs beside the replay when a command asks
/// for them (`OpenOptions::categories`): what comes out equals the
/// categories made after it, block by block and byte by byte, for a window
/// (blocks alive at the start) and a trace from process start.
#[test]
fn categories_made_beside_the_replay_equal_those_made_after_it() {
    for name in ["snapshot_kinds/wrapped_steady_resnet50.pickle.gz", "categories/bert_adamw_fp16.pickle.gz"] {
        let path = fixture(name);
        let t = trace::load(&path).unwrap();
        let plain = gpumem_top::replay::open(&t, name, &Default::default()).unwrap();
        let opts = gpumem_top::replay::OpenOptions { categories: true, ..Default::default() };
        let beside = gpumem_top::replay::open(&t, name, &opts).unwrap();
        let (a, b) = (plain.categories(), beside.categories());
        assert_eq!(a.evidence, b.evidence, "{name}");
        let n = plain.dev.events.len();
        assert!(n > 1000, "{name}: {n} events");
        let mut blocks = 0;
        for i in (0..n).step_by(97).chain([n - 1]) {
            assert_eq!(a.bytes_after(Some(i)), b.bytes_after(Some(i)), "{name}: after event {i}");
            let e = plain.dev.events.at(i);
            assert_eq!(a.of_block(e.addr, Some(i)), b.of_block(e.addr, Some(i)), "{name}: event {i}");
            blocks += usize::from(a.of_block(e.addr, Some(i)) != Category::Unknown);
        }
        assert!(blocks > 0, "{name}: every block unknown");
        // Before the first event: a window's blocks alive at the start,
        // told by when they end.
        assert_eq!(a.bytes_after(None), b.bytes_after(None), "{name}: at the start");
        // Many points at once (a timeline's columns), each going on from
        // the one before where it can: as each asked alone. Points a few
        // events apart, a sample or more apart, repeated, past the end.
        let mut points: Vec<usize> =
            (0..n).step_by(7).chain((0..n).step_by(300)).chain([n - 1, n - 1, n + 5]).collect();
        points.sort();
        let each = a.bytes_after_each(&points);
        assert_eq!(each.len(), points.len());
        for (&i, got) in points.iter().zip(&each) {
            assert_eq!(*got, a.bytes_after(Some(i)), "{name}: after event {i}, with the others");
        }
    }
}
