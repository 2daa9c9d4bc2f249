//! Memory categories against ground truth recorded on an H200
//! (benches/categories/record.py; docs/categories.md): each tensor noted as
//! it became known (parameters and buffers, the batch, every tensor
//! autograd saved, each .grad, each optimizer state tensor), matched to the
//! trace's blocks by address and time.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};

use common::fixture;
use gpumem_top::alloc::Action;
use gpumem_top::analysis::categories::{Categories, Category, Evidence};
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
                life.push((i, e.addr, e.size, dev.time_us[i], i64::MAX));
            }
            Action::FreeRequested => {
                if let Some(k) = live.remove(&e.addr) {
                    life[k].4 = dev.time_us[i];
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

fn score(name: &str) -> Score {
    let t = trace::load(&fixture(&format!("categories/{name}.pickle.gz"))).unwrap();
    let dev = t.main_device().unwrap();
    let cats = Categories::of(dev, &t.stacks, &t.annotations, &[]);
    let (truth, unmatched) = truth(dev, &notes(name));
    // The peak: the first event with the most allocated bytes.
    let (mut allocated, mut best, mut at) = (0u64, 0u64, 0usize);
    for (i, e) in dev.events.iter().enumerate() {
        match e.action {
            Action::Alloc => allocated += e.size,
            Action::FreeRequested => allocated -= e.size,
            _ => {}
        }
        if allocated > best {
            (best, at) = (allocated, i);
        }
    }
    let mut live: HashMap<u64, usize> = HashMap::new();
    for (i, e) in dev.events.iter().enumerate().take(at + 1) {
        match e.action {
            Action::Alloc => {
                live.insert(e.addr, i);
            }
            Action::FreeRequested => {
                live.remove(&e.addr);
            }
            _ => {}
        }
    }
    let mut s = Score { peak_bytes: best, right: 0, truth: [0; 7], ours: [0; 7], unmatched, evidence: cats.evidence };
    for (&addr, &i) in &live {
        let size = dev.events[i].size;
        let want = truth.get(&i).copied().unwrap_or(Category::Temporary);
        let got = cats.of_block(addr, Some(at));
        s.truth[want as usize] += size;
        s.ours[got as usize] += size;
        if want == got {
            s.right += size;
        }
    }
    let by_cat = cats.bytes_after(&dev.events, Some(at));
    assert_eq!(by_cat.0, s.ours, "{name}: bytes per category at the peak disagree with the blocks'");
    assert_eq!(by_cat.total(), best, "{name}: categories sum to the peak");
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

#[test]
fn categories_at_the_peak_match_the_truth() {
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!("| workload | evidence | peak allocated | right | truth (param/grad/optim/activ/input/temp) MiB | ours MiB |");
    let mut failures = Vec::new();
    for w in WORKLOADS {
        let s = score(w);
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
