//! The synthetic workloads against real PyTorch runs on an H200
//! (measurements/calibration/measure.py; the table is tests/fixtures/calibration).

use gpumem_top::alloc::{AllocatorConfig, CachingAllocator, Kind};
use gpumem_top::device::Sim;
use gpumem_top::workload::driver::{Driver, OnOom, Progress};
use gpumem_top::workload::{Checkpoint, ModelKind, Optimizer, SynthSpec, Synthetic};

fn run(spec: SynthSpec) -> (u64, u64, Driver<Sim>) {
    let alloc = CachingAllocator::new(AllocatorConfig::default(), Sim::h200());
    let mut d = Driver::new(alloc, Synthetic::new(spec), OnOom::Stop);
    assert_eq!(d.run(), &Progress::Finished);
    let s = d.alloc.stats();
    (s.get(Kind::AllocatedBytes, 0).peak as u64, s.get(Kind::ReservedBytes, 0).peak as u64, d)
}

struct Real {
    name: String,
    spec: SynthSpec,
    peak_allocated: u64,
    peak_reserved: u64,
}

/// The calibration tables: the first (16 runs) and a second recorded
/// 2026-12-01 with configurations the first lacks (other batches, HF
/// checkpointing, gradient accumulation, a smaller Llama, large MLP batches);
/// the fourth (2026-12-02): GPT-2 under `torch.optim.Adam` with
/// accumulation at short sequences, and the same loop with the loss taken
/// from the model's `labels` and with Adam's L2 weight decay, which synth
/// does not model apart and which came out the same to the byte in reserved.
fn table() -> Vec<Real> {
    let mut out = Vec::new();
    for file in ["h200.jsonl", "h200-set2.jsonl", "h200-set3.jsonl", "h200-set4.jsonl"] {
        let path = format!("{}/tests/fixtures/calibration/{file}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).expect("calibration table");
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).expect("json line");
            let c = &v["config"];
            let model = match c[0].as_str().unwrap() {
                "resnet50" => ModelKind::Resnet50,
                "gpt2" => ModelKind::Gpt2,
                "bert" => ModelKind::Bert,
                "llama" => ModelKind::Llama,
                "mlp" => ModelKind::Mlp,
                m => panic!("model {m}"),
            };
            let mut spec = SynthSpec::new(model);
            let x = &v["extra"];
            if let Some(l) = x.get("llama") {
                let n = |k: &str| l[k].as_u64().unwrap();
                spec = spec.with_shape(
                    n("num_hidden_layers"),
                    n("hidden_size"),
                    n("num_attention_heads"),
                    n("num_key_value_heads"),
                    n("intermediate_size"),
                    n("vocab_size"),
                );
            }
            spec.batch = c[1].as_u64().unwrap();
            spec.seq = c[2].as_u64().unwrap();
            spec.amp = c[3].as_bool().unwrap();
            spec.iterations = Some(3);
            spec.accum = x.get("accum").and_then(|a| a.as_u64()).unwrap_or(1);
            if x.get("ckpt").and_then(|c| c.as_bool()) == Some(true) {
                spec.checkpoint = Checkpoint::Layer;
            }
            match c[4].as_str().unwrap() {
                "sgd" => spec.optimizer = Optimizer::Sgd,
                "adam" => spec.optimizer = Optimizer::Adam,
                "adamw" => spec.optimizer = Optimizer::AdamW,
                _ => spec.inference = true,
            }
            out.push(Real {
                name: v["name"].as_str().unwrap().to_string(),
                spec,
                peak_allocated: v["allocated_bytes.all.peak"].as_u64().unwrap(),
                peak_reserved: v["reserved_bytes.all.peak"].as_u64().unwrap(),
            });
        }
    }
    out
}

/// Every run's peak allocated and peak reserved within ±5% of PyTorch's.
#[test]
fn every_recorded_configuration_is_within_five_percent_allocated_and_reserved() {
    let (mut worst_a, mut worst_r) = (0.0f64, 0.0f64);
    let rows = table();
    assert_eq!(rows.len(), 51);
    for r in rows {
        let (a, res, _) = run(r.spec.clone());
        let ea = a as f64 / r.peak_allocated as f64 - 1.0;
        let er = res as f64 / r.peak_reserved as f64 - 1.0;
        println!(
            "{:32} allocated real {:>14} ours {:>14} {:+6.2}%   reserved real {:>14} ours {:>14} {:+6.2}%",
            r.name,
            r.peak_allocated,
            a,
            ea * 100.0,
            r.peak_reserved,
            res,
            er * 100.0
        );
        for (what, err) in [("allocated", ea), ("reserved", er)] {
            assert!(err.abs() <= 0.05, "{}: peak {what} {:+.2}%", r.name, err * 100.0);
        }
        worst_a = worst_a.max(ea.abs());
        worst_r = worst_r.max(er.abs());
    }
    println!("worst |error|: allocated {:.2}%, reserved {:.2}%", worst_a * 100.0, worst_r * 100.0);
}

/// The calibration targets: the shared traces' runs.
#[test]
fn resnet50_and_gpt2_peaks_are_within_ten_percent_of_the_recorded_runs() {
    let cases = [
        (ModelKind::Resnet50, 64, 0, Optimizer::Sgd, 5_855_043_584u64),
        (ModelKind::Gpt2, 8, 1024, Optimizer::AdamW, 17_423_266_816),
    ];
    for (model, batch, seq, opt, real) in cases {
        let mut spec = SynthSpec::new(model);
        (spec.batch, spec.seq, spec.optimizer) = (batch, seq, opt);
        let (ours, _, d) = run(spec);
        let err = ours as f64 / real as f64 - 1.0;
        assert!(err.abs() < 0.10, "{model:?}: ours {ours}, real {real} ({:+.1}%)", err * 100.0);
        // Four iterations, each marked.
        assert_eq!(d.iterations.len(), 4);
    }
}

fn spec(model: ModelKind, f: impl FnOnce(&mut SynthSpec)) -> SynthSpec {
    let mut s = SynthSpec::new(model);
    f(&mut s);
    s
}

/// What stays between iterations: parameters, AdamW's two states each, the
/// forward and backward cuBLAS workspaces (32 MiB + 1 MiB, 32 MiB), leaks.
#[test]
fn each_iteration_frees_all_it_allocated_but_state_and_leaks() {
    let (_, _, d) = run(spec(ModelKind::Gpt2, |s| s.iterations = Some(3)));
    let params: u64 = Synthetic::new(SynthSpec::new(ModelKind::Gpt2)).graph(1, 1024).params.iter().sum();
    assert_eq!(params, 497_759_232, "GPT-2 small's 124.4M fp32 parameters (tied head)");
    // Bytes asked for: exactly what persists; nothing of the steps is left.
    let requested = d.alloc.stats().value("requested_bytes.all.current").unwrap() as u64;
    assert_eq!(requested, 3 * params + (65 << 20));
    let allocated = d.alloc.stats().get(Kind::AllocatedBytes, 0).current as u64;
    let leak = 64 << 20;
    let (_, _, l) = run(spec(ModelKind::Gpt2, |s| {
        s.iterations = Some(3);
        s.leak = leak;
    }));
    assert_eq!(l.alloc.stats().get(Kind::AllocatedBytes, 0).current as u64, allocated + 3 * leak);
}

#[test]
fn checkpointing_amp_and_accumulation_cut_the_peak_as_expected() {
    let base = run(spec(ModelKind::Gpt2, |_| {})).0;
    let ckpt = run(spec(ModelKind::Gpt2, |s| s.checkpoint = Checkpoint::Sqrt)).0;
    let amp = run(spec(ModelKind::Gpt2, |s| s.amp = true)).0;
    let accum = run(spec(ModelKind::Gpt2, |s| {
        s.batch = 4;
        s.accum = 2;
    }))
    .0;
    let b4 = run(spec(ModelKind::Gpt2, |s| s.batch = 4)).0;
    println!("gpt2 b8 peak {base}; checkpoint {ckpt}; amp {amp}; b4×accum2 {accum}; b4 {b4}");
    // 12 layers in segments of 4: three boundaries plus one segment's
    // activations instead of twelve layers' (the logits dominate the rest).
    assert!(ckpt < base * 6 / 10, "{ckpt} vs {base}");
    assert!(amp < base && amp > base * 7 / 10, "{amp} vs {base}");
    // Accumulating two batches of 4 peaks like one batch of 4 plus the
    // gradients the first micro-step left.
    assert!(accum > b4 && accum < base, "{accum}: b4 {b4}, b8 {base}");
    let resnet = run(spec(ModelKind::Resnet50, |_| {})).0;
    let resnet_ckpt = run(spec(ModelKind::Resnet50, |s| s.checkpoint = Checkpoint::Sqrt)).0;
    // Segments of 4 blocks: the recomputed first one (layer1, 56x56) and
    // the gradients flowing back through it dominate; cuDNN's workspaces
    // (conv1's: 263 MB in its backward) do not shrink.
    assert!(resnet_ckpt < resnet * 3 / 4, "{resnet_ckpt} vs {resnet}");
}

#[test]
fn varlen_is_seeded_and_changes_the_shapes() {
    let a = run(spec(ModelKind::Gpt2, |s| {
        s.varlen = true;
        s.seed = 3;
    }));
    let b = run(spec(ModelKind::Gpt2, |s| {
        s.varlen = true;
        s.seed = 3;
    }));
    let c = run(spec(ModelKind::Gpt2, |s| {
        s.varlen = true;
        s.seed = 4;
    }));
    assert_eq!(a.2.points, b.2.points);
    assert_ne!(a.2.points, c.2.points);
    assert!(a.0 < run(spec(ModelKind::Gpt2, |_| {})).0);
}

#[test]
fn shrink_retries_smaller_and_continue_skips() {
    let mk = |on_oom| {
        let mut alloc = CachingAllocator::new(AllocatorConfig::default(), Sim::h200());
        alloc.set_memory_limit(Some(12_000_000_000));
        let mut d = Driver::new(alloc, Synthetic::new(spec(ModelKind::Gpt2, |s| s.iterations = Some(2))), on_oom);
        d.run();
        d
    };
    let d = mk(OnOom::Shrink);
    assert_eq!(d.progress(), &Progress::Finished);
    let batches: Vec<(u64, u64, &str)> = d.oom_log.iter().map(|o| (o.iteration, o.batch, o.action.name())).collect();
    assert_eq!(
        batches,
        [(1, 8, "retry"), (1, 7, "retry"), (1, 6, "retry"), (2, 8, "retry"), (2, 7, "retry"), (2, 6, "retry")]
    );
    assert_eq!(d.ooms.len(), 6);
    assert_eq!(d.empty_caches.len(), 6, "each retry empties the cache, visibly");
    assert!(d.oom_log[0].message.starts_with("CUDA out of memory. Tried to allocate"));
    assert_eq!(d.alloc.stats().value("num_ooms"), Some(6));
    let d = mk(OnOom::Continue);
    assert_eq!(d.progress(), &Progress::Finished);
    assert!(
        d.oom_log.iter().all(|o| o.action == gpumem_top::workload::driver::OomAction::Skip) && d.oom_log.len() == 2
    );
    let d = mk(OnOom::Stop);
    assert_eq!(d.progress(), &Progress::Stopped);
    assert_eq!(d.oom_log.len(), 1);
}

fn cli(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_gpumem-top")).arg("synth").args(args).output().unwrap()
}

#[test]
fn synth_json_on_the_simulated_device() {
    let out = cli(&["--backend", "sim", "--json", "--model", "resnet50", "--iterations", "2"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["format"], "synthetic");
    assert_eq!(v["backend"], "sim");
    assert_eq!(v["workload"]["model"], "resnet50");
    assert_eq!(v["workload"]["batch"], 64);
    assert_eq!(v["iterations"], 2);
    assert_eq!(v["outcome"], "finished");
    assert_eq!(v["stats"]["allocated_bytes.all.peak"], 5_854_930_944u64);
    assert_eq!(v["peak"]["allocated_bytes"], 5_854_930_944u64);
    assert_eq!(v["peak"]["iteration"], 2);
    // What the model includes, and leaves out, for this workload.
    let effect = |v: &serde_json::Value, name: &str| {
        v["effects"].as_array().unwrap().iter().find(|e| e["effect"] == name).map(|e| e["modelled"].clone())
    };
    assert_eq!(effect(&v, "cudnn_workspaces"), Some(serde_json::json!(true)));
    assert_eq!(effect(&v, "cudnn_benchmark"), Some(serde_json::json!(false)));
    assert_eq!(effect(&v, "module_variables"), Some(serde_json::json!(true)));
    assert_eq!(effect(&v, "checkpointing"), None);
    let out =
        cli(&["--backend", "sim", "--json", "--model", "gpt2", "--iterations", "1", "--seq", "128", "--checkpoint"]);
    let g: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(g["workload"]["checkpoint"], "layer");
    assert_eq!(effect(&g, "checkpointing"), Some(serde_json::json!(true)));
    assert_eq!(effect(&g, "cudnn_workspaces"), None);
    assert_eq!(effect(&g, "module_variables"), Some(serde_json::json!(true)));
    // The peak's index in the allocator's event stream: the alloc that made it.
    let ev = v["peak"]["event"].as_u64().unwrap();
    assert!(ev > 0 && ev < v["events"].as_u64().unwrap(), "{ev}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("backend sim"));
    // An OOM under --on-oom stop: PyTorch's message, exit 1, JSON still printed.
    let out = cli(&["--backend", "sim", "--json", "--memory-limit", "4000000000"]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["outcome"], "stopped by OOM");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate")
    );
}

#[test]
fn bad_synth_flags_exit_2_with_one_line() {
    for args in [
        &["--json", "--batch", "0"][..],
        &["--json", "--model", "gpt2", "--hidden", "100", "--heads", "12"],
        &["--json", "--alloc-conf", "max_split_size_mb:5"],
        &["--json", "--memory-fraction", "1.5"],
        &["--json", "--backend", "cuda", "--device", "99"],
        &["--json", "--batch", "100000000000"],
        &["--json", "--model", "llama", "--batch", "1000000", "--seq", "4000000"],
    ] {
        let out = cli(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(out.stdout.is_empty());
        assert_eq!(err.trim_end().lines().filter(|l| l.starts_with("gpumem-top:")).count(), 1, "{args:?}: {err}");
    }
}

/// `synth` into a pipe summarises as `replay` does (not "needs a terminal"),
/// and an OOM's iteration is the same in the screen's title and its status
/// line, which shows the batch once (#37 item 17).
#[test]
fn synth_into_a_pipe_summarises_and_an_ooms_iteration_agrees_on_screen() {
    use std::process::Command;
    let bin = env!("CARGO_BIN_EXE_gpumem-top");
    let out = Command::new(bin).args(["synth", "--backend", "sim", "--iterations", "2"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        text.starts_with(
            "gpumem-top synth gpt2 batch 8 × seq 1024, AdamW on simulated NVIDIA H200 (sim): 2 iterations, "
        ),
        "{text}"
    );
    assert!(text.lines().any(|l| l.starts_with("peak: allocated 16.23 GiB")), "{text}");
    let out = Command::new(bin)
        .args(["synth", "--backend", "sim", "--batch", "64", "--memory-limit", "8GiB"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "an OOM that stops the run exits 1");
    assert!(
        text.contains(", stopped by OOM\n")
            && text.contains("OOM in iteration 1 (batch 64), stop: CUDA out of memory."),
        "{text}"
    );

    // On screen: the run stopped by the OOM.
    let mut alloc = CachingAllocator::new(AllocatorConfig::default(), Sim::h200());
    alloc.set_memory_limit(Some(8 << 30));
    let d = Driver::new(alloc, Synthetic::new(spec(ModelKind::Gpt2, |s| s.batch = 64)), OnOom::Stop);
    let mut app = gpumem_top::ui::app::SynthApp::new(d, "synth gpt2, AdamW".into(), None, false);
    app.advance(100_000);
    let mut t = ratatui_core::terminal::Terminal::new(ratatui_core::backend::TestBackend::new(160, 40)).unwrap();
    t.draw(|f| gpumem_top::ui::event::Interactive::draw_into(&app, f.area(), f.buffer_mut())).unwrap();
    let s = t.backend().to_string();
    let title = s.lines().find(|l| l.contains("synth gpt2, AdamW")).unwrap();
    assert!(title.contains("iteration 1 · batch 64 × seq 1024 (stopped by OOM"), "{title}");
    assert_eq!(title.matches("batch").count(), 1, "{title}");
    assert!(s.contains("OOM in iteration 1 (batch 64)"), "{s}");
}

/// The summary names the optimizer asked for: Adam and AdamW keep the same
/// memory, but a user who asked for one reads that one.
#[test]
fn the_summary_names_the_optimizer_asked_for() {
    for (arg, said) in [("adam", ", Adam on"), ("adamw", ", AdamW on"), ("sgd", ", SGD on")] {
        let o = cli(&[
            "--model",
            "gpt2",
            "--layers",
            "2",
            "--batch",
            "1",
            "--seq",
            "64",
            "--iterations",
            "1",
            "--optimizer",
            arg,
        ]);
        let s = String::from_utf8_lossy(&o.stdout);
        assert!(s.lines().next().unwrap().contains(said), "{arg}: {s}");
    }
    let o = cli(&["--model", "gpt2", "--layers", "2", "--batch", "1", "--seq", "64", "--iterations", "1"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains(", AdamW on"), "a transformer trains with AdamW unless told");
}
