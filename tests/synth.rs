//! The synthetic workloads against real PyTorch runs on an H200
//! (benches/calibration/measure.py; the table is tests/fixtures/calibration).

use gpumem_top::alloc::{AllocatorConfig, CachingAllocator, Kind};
use gpumem_top::device::Sim;
use gpumem_top::workload::driver::{Driver, OnOom, Progress};
use gpumem_top::workload::{ModelKind, Optimizer, SynthSpec, Synthetic};

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

fn table() -> Vec<Real> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/calibration/h200.jsonl"))
        .expect("calibration table");
    let mut out = Vec::new();
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
        spec.batch = c[1].as_u64().unwrap();
        spec.seq = c[2].as_u64().unwrap();
        spec.amp = c[3].as_bool().unwrap();
        spec.iterations = Some(3);
        match c[4].as_str().unwrap() {
            "sgd" => spec.optimizer = Optimizer::Sgd,
            "adamw" => spec.optimizer = Optimizer::Adam,
            _ => spec.inference = true,
        }
        out.push(Real {
            name: v["name"].as_str().unwrap().to_string(),
            spec,
            peak_allocated: v["allocated_bytes.all.peak"].as_u64().unwrap(),
            peak_reserved: v["reserved_bytes.all.peak"].as_u64().unwrap(),
        });
    }
    out
}

#[test]
fn print_calibration() {
    for r in table() {
        let (a, res, _) = run(r.spec.clone());
        println!(
            "{:24} real {:>14} ours {:>14} {:+6.1}%   reserved real {:>14} ours {:>14} {:+6.1}%",
            r.name,
            r.peak_allocated,
            a,
            (a as f64 / r.peak_allocated as f64 - 1.0) * 100.0,
            r.peak_reserved,
            res,
            (res as f64 / r.peak_reserved as f64 - 1.0) * 100.0
        );
    }
}

/// The calibration targets: the shared traces' runs.
#[test]
fn resnet50_and_gpt2_peaks_are_within_ten_percent_of_the_recorded_runs() {
    let cases = [
        (ModelKind::Resnet50, 64, 0, Optimizer::Sgd, 5_855_043_584u64),
        (ModelKind::Gpt2, 8, 1024, Optimizer::Adam, 17_423_266_816),
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
