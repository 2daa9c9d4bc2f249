//! `fit` against PyTorch's real peaks (recorded on an H200, torch 2.11):
//! three models from snapshots of 3 training steps at two small batches,
//! predicted at 2–16 times those batches, and the largest batch that ran
//! under a 16 GiB `set_per_process_memory_fraction` cap.

use crate::common;

use std::process::Command;

use common::fixture;
use serde_json::Value;

fn truth() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture("fit/truth.json")).unwrap()).unwrap()
}

fn fit(args: &[String]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem-top")).arg("fit").args(args).arg("--json").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn model_args(t: &Value, model: &str) -> Vec<String> {
    let m = &t["models"][model];
    let mut args: Vec<String> = m["inputs"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(b, f)| format!("{}@{b}", fixture(&format!("fit/{}", f.as_str().unwrap())).display()))
        .collect();
    for b in m["peaks"].as_object().unwrap().keys() {
        args.push("--batch".into());
        args.push(b.clone());
    }
    args.push("--memory-limit".into());
    args.push(m["cap_bytes"].to_string());
    args
}

/// Peak allocated within ±3% and peak reserved within ±5% of PyTorch's at
/// every target batch; the largest batch under the cap within 5%.
#[test]
fn predictions_meet_pytorchs_peaks_and_largest_batch() {
    let t = truth();
    for model in ["gpt2", "bert", "resnet50"] {
        let j = fit(&model_args(&t, model));
        let m = &t["models"][model];
        for p in j["predictions"].as_array().unwrap() {
            let b = p["batch"].to_string();
            let want = &m["peaks"][&b];
            let err = |k: &str, w: &str| p[k].as_f64().unwrap() / want[w].as_f64().unwrap() - 1.0;
            let (ea, er) = (
                err("allocated_peak_bytes", "allocated_bytes.all.peak"),
                err("reserved_peak_bytes", "reserved_bytes.all.peak"),
            );
            assert!(ea.abs() <= 0.03, "{model} batch {b}: allocated {:+.2}%", ea * 100.0);
            assert!(er.abs() <= 0.05, "{model} batch {b}: reserved {:+.2}%", er * 100.0);
        }
        let real = m["max_batch_under_cap"].as_f64().unwrap();
        let got = j["max_batch"].as_f64().unwrap();
        assert!((got / real - 1.0).abs() <= 0.05, "{model}: largest batch {got} against {real}");
        // Every request of the larger sample is aligned with the smaller.
        let a = &j["alignment"];
        assert!(a["aligned"].as_f64().unwrap() >= 0.99 * a["requests"].as_f64().unwrap(), "{a}");
    }
}

/// The transformers' peaks come out to the byte: their request sizes are
/// exactly linear in the batch, and our allocator is PyTorch's.
#[test]
fn transformer_peaks_are_exact() {
    let t = truth();
    for model in ["gpt2", "bert"] {
        let j = fit(&model_args(&t, model));
        for p in j["predictions"].as_array().unwrap() {
            let want = &t["models"][model]["peaks"][&p["batch"].to_string()];
            assert_eq!(p["allocated_peak_bytes"], want["allocated_bytes.all.peak"], "{model} {}", p["batch"]);
            assert_eq!(p["reserved_peak_bytes"], want["reserved_bytes.all.peak"], "{model} {}", p["batch"]);
        }
    }
}

/// A second set recorded later (tests/fixtures/fit/more): four vision
/// models, each predicted from two small batches at a larger one recorded
/// the same way, against that run's own peaks.
#[test]
fn more_models_recorded_later_are_within_bounds() {
    for (m, b1, b2, bt) in
        [("resnet50", 8, 16, 128), ("resnet18", 16, 32, 128), ("efficientnet", 8, 16, 64), ("vit", 4, 8, 32)]
    {
        let snap = |b: u64| fixture(&format!("fit/more/{m}_b{b}.pickle.gz"));
        let out =
            Command::new(env!("CARGO_BIN_EXE_gpumem-top")).args(["replay", "--json"]).arg(snap(bt)).output().unwrap();
        let real: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(real["fidelity"], "exact", "{m}");
        let j = fit(&[
            format!("{}@{b1}", snap(b1).display()),
            format!("{}@{b2}", snap(b2).display()),
            "--batch".into(),
            bt.to_string(),
        ]);
        let p = &j["predictions"][0];
        let err = |k: &str, w: &str| p[k].as_f64().unwrap() / real["stats"][w].as_f64().unwrap() - 1.0;
        let (ea, er) = (
            err("allocated_peak_bytes", "allocated_bytes.all.peak"),
            err("reserved_peak_bytes", "reserved_bytes.all.peak"),
        );
        assert!(ea.abs() <= 0.03, "{m} batch {bt}: allocated {:+.2}%", ea * 100.0);
        assert!(er.abs() <= 0.05, "{m} batch {bt}: reserved {:+.2}%", er * 100.0);
    }
}

/// The largest batch under 16 GiB for EfficientNet-B0 and ViT-B/16 (the
/// field round saw fit 6% and 8% below the real one): within 5% of what
/// bisection over real runs on the H200 found (372 and 222).
#[test]
fn the_largest_batch_of_efficientnet_and_vit_within_five_percent() {
    let truth: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("fit/more/largest_under_16GiB.json")).unwrap()).unwrap();
    for (m, b1, b2) in [("efficientnet", 8, 16), ("vit", 4, 8)] {
        let snap = |b: u64| format!("{}@{b}", fixture(&format!("fit/more/{m}_b{b}.pickle.gz")).display());
        let j = fit(&[snap(b1), snap(b2), "--memory-limit".into(), "17179869184".into()]);
        let (got, real) = (j["max_batch"].as_f64().unwrap(), truth[m].as_f64().unwrap());
        println!("{m}: largest batch under 16 GiB {got} (real {real}, {:+.1}%)", (got / real - 1.0) * 100.0);
        assert!((got / real - 1.0).abs() <= 0.05, "{m}: largest batch {got}, real {real}");
    }
}

/// Swin-T (windowed attention) and ConvNeXt-T (depthwise 7×7 convolutions),
/// recorded on the H200 for the fourth field round (#31 item 6): at 4× and
/// 8× the larger sample, peak allocated within 3% of the real runs' and
/// peak reserved −1.0% to +1.5% (13–18% before reductions' buffers were
/// bounded and workspaces kept from outgrowing the batch: docs/user/fit.md
/// "Reductions", "Workspaces"), held here within 3% and 5%; the
/// largest batch under 16 GiB within 5% of what real runs found (233 and
/// 264).
#[test]
fn swin_and_convnext_peaks_at_four_and_eight_times_the_samples() {
    let truth: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("fit/vision4/truth.json")).unwrap()).unwrap();
    for m in ["swin_t", "convnext_t"] {
        // The real run at 64, recorded with its history (a later run of
        // the script, so its stacks do not align with the samples'): the
        // truth's peaks are its own.
        let real64 = fixture(&format!("fit/vision4/{m}_b64_real.pickle.gz"));
        let out =
            Command::new(env!("CARGO_BIN_EXE_gpumem-top")).args(["replay", "--json"]).arg(real64).output().unwrap();
        let r: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(r["fidelity"], "exact", "{m}");
        assert_eq!(r["stats"]["allocated_bytes.all.peak"], truth["models"][m]["real"]["64"][0], "{m}");
        assert_eq!(r["stats"]["reserved_bytes.all.peak"], truth["models"][m]["real"]["64"][1], "{m}");
        let snap = |b: u64| format!("{}@{b}", fixture(&format!("fit/vision4/{m}_b{b}.pickle.gz")).display());
        let j = fit(&[
            snap(8),
            snap(16),
            "--batch".into(),
            "64".into(),
            "--batch".into(),
            "128".into(),
            "--memory-limit".into(),
            "17179869184".into(),
        ]);
        // The largest batch under 16 GiB, against bisection over real runs.
        let (got, real) = (j["max_batch"].as_f64().unwrap(), truth["largest_under_limit"][m].as_f64().unwrap());
        println!("{m}: largest batch under 16 GiB {got} (real {real}, {:+.1}%)", (got / real - 1.0) * 100.0);
        assert!((got / real - 1.0).abs() <= 0.05, "{m}: largest batch {got}, real {real}");
        assert!(j["warnings"].as_array().unwrap().is_empty(), "{m}: {}", j["warnings"]);
        for (i, bt) in ["64", "128"].into_iter().enumerate() {
            let p = &j["predictions"][i];
            let real = &truth["models"][m]["real"][bt];
            let err = |k: &str, r: &Value| p[k].as_f64().unwrap() / r.as_f64().unwrap() - 1.0;
            let (ea, er) = (err("allocated_peak_bytes", &real[0]), err("reserved_peak_bytes", &real[1]));
            println!("{m} batch {bt}: allocated {:+.2}%, reserved {:+.2}%", ea * 100.0, er * 100.0);
            assert!(ea.abs() <= 0.03, "{m} batch {bt}: allocated {:+.2}%", ea * 100.0);
            assert!(er.abs() <= 0.05, "{m} batch {bt}: reserved {:+.2}%", er * 100.0);
        }
    }
}

/// ResNet-50's cuDNN workspaces are found (freed at once, sizes not in
/// proportion to the batch) and predictions away from the samples average
/// replays over their uncertain sizes: the range holds the mean, a sampled
/// batch is one exact replay, and the transformers have no workspaces.
#[test]
fn workspaces_are_averaged_over_away_from_the_samples() {
    let t = truth();
    let mut args = model_args(&t, "resnet50");
    args.extend(["--batch".to_string(), "16".to_string()]);
    let j = fit(&args);
    let w = j["alignment"]["workspaces"].as_u64().unwrap();
    assert!(w > 100 && w < j["alignment"]["scaling"].as_u64().unwrap(), "{}", j["alignment"]);
    for p in j["predictions"].as_array().unwrap() {
        let (lo, hi) =
            (p["reserved_peak_range_bytes"][0].as_u64().unwrap(), p["reserved_peak_range_bytes"][1].as_u64().unwrap());
        let mean = p["reserved_peak_bytes"].as_u64().unwrap();
        if p["batch"] == 16 {
            assert_eq!((p["runs"].as_u64(), lo, hi), (Some(1), mean, mean), "{p}");
            // A sample's own batch: PyTorch's reserved peak in its file.
            let out = Command::new(env!("CARGO_BIN_EXE_gpumem-top"))
                .args(["replay", "--json"])
                .arg(fixture("fit/resnet50_b16.pickle.gz"))
                .output()
                .unwrap();
            let r: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(p["reserved_peak_bytes"], r["stats"]["reserved_bytes.all.peak"], "{p}");
        } else {
            assert_eq!(p["runs"], 16, "{p}");
            assert!(lo < mean && mean < hi, "{p}");
        }
    }
    // The same figures every time: the sizes come from a fixed sequence.
    assert_eq!(fit(&args)["predictions"], j["predictions"]);
    for model in ["gpt2", "bert"] {
        let j = fit(&model_args(&t, model));
        assert_eq!(j["alignment"]["workspaces"], 0, "{model}");
        assert!(j["predictions"].as_array().unwrap().iter().all(|p| p["runs"] == 1), "{model}");
    }
}

/// The JSON's first two keys, a fit's self-check at its own batches, and
/// the table of configs.
#[test]
fn json_shape_and_self_check() {
    let t = truth();
    let mut args = model_args(&t, "gpt2");
    args.extend(["--alloc-conf".to_string(), "expandable_segments:True".to_string()]);
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem-top")).arg("fit").args(&args).arg("--json").output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("{\"predictions\":[{\"batch\":"), "{}", &text[..80]);
    let j: Value = serde_json::from_str(&text).unwrap();
    let keys: Vec<&String> = j.as_object().unwrap().keys().collect();
    assert!(keys.contains(&&"max_batch".to_string()));
    assert_eq!(j["max_batch_by_config"][""], 16);
    assert!(j["max_batch_by_config"]["expandable_segments:True"].as_u64().unwrap() >= 16);
    for c in j["alignment"]["self_check"].as_array().unwrap() {
        assert!(c[1].as_f64().unwrap().abs() < 0.01 && c[2].as_f64().unwrap().abs() < 0.01, "{c}");
    }
    // Bad usage: one sample, a missing batch.
    for bad in [vec!["x.pickle.gz@2"], vec!["x.pickle.gz", "y.pickle.gz@4"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_gpumem-top")).arg("fit").args(&bad).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
    }
}

/// A stand-in `torch` in `d/fake` for `fit --batches`: PyTorch 2.11's
/// version (or $FAKE_TORCH_VERSION), the optimizer-step hook registry (as
/// torch.optim hides it), and a `_snapshot` that gives the recorded GPT-2
/// sample of `_state["batch"]`, after checking history was on and saying
/// with which settings (on stderr).
fn fake_torch(d: &std::path::Path) {
    std::fs::create_dir_all(d.join("fake/torch")).unwrap();
    std::fs::write(
        d.join("fake/torch/__init__.py"),
        format!(
            r#"
import gzip, json, os, pickle, sys
__version__ = os.environ.get("FAKE_TORCH_VERSION", "2.11.0+cu130")
_state = {{"hooks": []}}
class _Memory:
    def _record_memory_history(self, **kw): _state["recording"] = kw
    def _snapshot(self):
        assert _state.get("recording"), "history was not recorded"
        sys.stderr.write("history settings: %s\n" % json.dumps(_state["recording"], sort_keys=True))
        with gzip.open(os.path.join({fixtures:?}, "gpt2_b%d.pickle.gz" % _state["batch"])) as f:
            return pickle.load(f)
class _Cuda:
    memory = _Memory()
    def is_available(self): return True
    def is_initialized(self): return True
    def synchronize(self): pass
cuda = _Cuda()
# As in torch: torch.optim is imported, torch.optim.optimizer is not.
from . import optim
"#,
            fixtures = fixture("fit").display().to_string()
        ),
    )
    .unwrap();
    std::fs::create_dir_all(d.join("fake/torch/optim")).unwrap();
    // As torch 2.11's torch/optim/__init__.py: it imports its submodules
    // and deletes their names, so only an import of the module finds them.
    std::fs::write(d.join("fake/torch/optim/__init__.py"), "from . import optimizer\ndel optimizer\n").unwrap();
    std::fs::write(
        d.join("fake/torch/optim/optimizer.py"),
        "import torch\ndef register_optimizer_step_post_hook(f):\n    torch._state['hooks'].append(f)\n",
    )
    .unwrap();
}

/// `fit --batches 2,4 -- CMD --batch-size {batch}` runs the command per
/// batch with history recorded by the hook gpumem-top puts on PYTHONPATH
/// (here over a stand-in torch that writes the recorded GPT-2 snapshots),
/// and predicts as from the files.
#[test]
fn fit_records_its_samples_by_running_the_training_command() {
    if !Command::new("python3").arg("--version").output().is_ok_and(|o| o.status.success()) {
        return;
    }
    let d = common::TmpDir::new("fitrec");
    let _ = std::fs::remove_dir_all(&d);
    fake_torch(&d);
    // The user's own sitecustomize (on their PYTHONPATH): the recorded runs
    // must be the real ones, so it still runs under fit's hook.
    std::fs::write(d.join("fake/sitecustomize.py"), "import os\nos.environ['USER_SITE'] = 'ran'\n").unwrap();
    std::fs::write(
        d.join("train.py"),
        r#"
import os, sys, torch
torch._state["batch"] = int(sys.argv[sys.argv.index("--batch-size") + 1])
print("user sitecustomize:", os.environ.get("USER_SITE"), flush=True)
print("training at batch", torch._state["batch"], flush=True)
for step in range(100):
    for h in torch._state["hooks"]:
        h(None, (), {})
print("never reached: the hook stops the run after its steps")
sys.exit(3)
"#,
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem-top"))
        .args(["fit", "--batches", "2,4", "--steps", "3", "--batch", "8", "--batch", "16", "--json", "--record-dir"])
        .arg(d.join("rec"))
        .arg("--")
        .args(["python3", d.join("train.py").to_str().unwrap(), "--batch-size", "{batch}"])
        .env("PYTHONPATH", d.join("fake"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("never reached"));
    // The script's own output goes to stderr; stdout is the JSON alone.
    assert!(err.contains("training at batch 2") && err.contains("training at batch 4"), "{err}");
    assert_eq!(err.matches("user sitecustomize: ran").count(), 2, "{err}");
    // PyTorch 2.11: stacks at allocations only, so that activation
    // checkpointing cannot crash (pytorch #179536), said once per run, and
    // an entry limit.
    assert!(
        err.contains(r#"history settings: {"context": "alloc", "max_entries": 2000000, "stacks": "python"}"#),
        "{err}"
    );
    assert_eq!(err.matches("pytorch #179536").count(), 2, "{err}");
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    let direct = fit(&[
        format!("{}@2", fixture("fit/gpt2_b2.pickle.gz").display()),
        format!("{}@4", fixture("fit/gpt2_b4.pickle.gz").display()),
        "--batch".into(),
        "8".into(),
        "--batch".into(),
        "16".into(),
    ]);
    assert_eq!(j["predictions"], direct["predictions"]);
    assert!(d.join("rec/batch2.pickle").exists() && d.join("rec/batch4.pickle").exists());
    // The recording says which release made it, and replay follows it.
    let rep = Command::new(env!("CARGO_BIN_EXE_gpumem-top"))
        .args(["replay", d.join("rec/batch2.pickle").to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    let rep: Value = serde_json::from_slice(&rep.stdout).unwrap();
    assert_eq!(rep["torch_release"]["rules"], "2.11.0");
    assert_eq!(rep["torch_release"]["why"], "2.11.0: torch.__version__ 2.11.0 recorded with the trace");
    assert_eq!(rep["fidelity"], "exact");
    // Without `{batch}` in the command: bad usage.
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem-top"))
        .args(["fit", "--batches", "2,4", "--", "python3", "train.py"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// A 10-batch search over a pair of ~10,000-event snapshots takes well
/// under a second (docs/user/fit.md has the measured figure).
#[test]
fn a_fit_and_its_search_are_fast() {
    let t = truth();
    let start = std::time::Instant::now();
    let j = fit(&model_args(&t, "gpt2"));
    assert!(j["max_batch"].as_u64().unwrap() > 0);
    assert!(start.elapsed() < std::time::Duration::from_secs(5), "{:?}", start.elapsed());
}

/// Hugging Face models with activation checkpointing, recorded by `fit
/// --batches 2,4` on the H200 under the history settings it chose for
/// PyTorch 2.11 (stacks at allocations only: with stacks at frees the same
/// training crashed, pytorch #179536), predicted at 8 and 16 against the
/// real runs' peaks (tests/fixtures/fit/checkpointed/truth.json).
#[test]
fn checkpointed_models_recorded_under_the_safe_history_settings_are_predicted() {
    let t: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("fit/checkpointed/truth.json")).unwrap()).unwrap();
    for model in ["gpt2", "bert"] {
        let snap = |b: u64| format!("{}@{b}", fixture(&format!("fit/checkpointed/{model}_b{b}.pickle.gz")).display());
        let j = fit(&[snap(2), snap(4), "--batch".into(), "8".into(), "--batch".into(), "16".into()]);
        assert_eq!(j["alignment"]["call_stacks"], true, "alloc stacks were recorded");
        for p in j["predictions"].as_array().unwrap() {
            let want = &t["models"][model][p["batch"].to_string()];
            let err = |k: &str, i: usize| p[k].as_f64().unwrap() / want[i].as_f64().unwrap() - 1.0;
            let (ea, er) = (err("allocated_peak_bytes", 0), err("reserved_peak_bytes", 1));
            assert!(ea.abs() <= 0.001, "{model} batch {}: allocated {:+.3}%", p["batch"], ea * 100.0);
            assert!(er.abs() <= 0.001, "{model} batch {}: reserved {:+.3}%", p["batch"], er * 100.0);
        }
    }
}

/// The same GPT-2 samples as `context="state"` records them (the trace's
/// frames removed, the blocks' kept): replay says which stacks it has, and
/// `fit` says it aligned without them and predicts the same peaks.
#[test]
fn samples_recorded_without_per_event_stacks_say_so_and_predict_the_same() {
    let bin = env!("CARGO_BIN_EXE_gpumem-top");
    let state = fixture("fit/checkpointed/gpt2_b2_state.pickle.gz");
    let out = Command::new(bin).args(["replay", "--json"]).arg(&state).output().unwrap();
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((j["call_stacks"].as_str(), j["fidelity"].as_str()), (Some("blocks_only"), Some("exact")));
    let full = Command::new(bin).args(["replay", "--json"]).arg(fixture("fit/checkpointed/gpt2_b2.pickle.gz")).output();
    let full: Value = serde_json::from_slice(&full.unwrap().stdout).unwrap();
    assert_eq!(full["call_stacks"], "per_event");
    let summary = Command::new(bin).arg("replay").arg(&state).output().unwrap();
    assert!(String::from_utf8_lossy(&summary.stdout).contains("call stacks: the snapshot's blocks only"));
    let snap =
        |b: u64, tag: &str| format!("{}@{b}", fixture(&format!("fit/checkpointed/gpt2_b{b}{tag}.pickle.gz")).display());
    let args =
        |tag: &str| vec![snap(2, tag), snap(4, tag), "--batch".into(), "8".into(), "--batch".into(), "16".into()];
    let (with, without) = (fit(&args("")), fit(&args("_state")));
    assert_eq!(without["alignment"]["call_stacks"], false);
    assert_eq!(with["predictions"], without["predictions"]);
    let text = Command::new(bin).arg("fit").args(args("_state")).output().unwrap();
    assert!(String::from_utf8_lossy(&text.stdout).contains("the samples carry no call stacks"));
}

/// Batches no run can have are refused, the search stays bounded, and a
/// prediction whose requests no device holds does not fit; samples without
/// the requests from process start (no history, a wrapped window) are
/// refused with what to record instead.
#[test]
fn impossible_batches_and_samples_are_refused() {
    let bin = env!("CARGO_BIN_EXE_gpumem-top");
    let s = |b: u64| format!("{}@{b}", fixture(&format!("fit/gpt2_b{b}.pickle.gz")).display());
    let run = |extra: &[&str]| {
        let o = Command::new(bin).arg("fit").arg(s(2)).arg(s(4)).args(extra).output().unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).to_string(),
            String::from_utf8_lossy(&o.stderr).to_string(),
        )
    };
    for bad in [
        &["--max-batch", "0"][..],
        &["--max-batch", "18446744073709551615"],
        &["--batch", "0"],
        &["--batch", "4294967297"],
    ] {
        let (code, _, err) = run(bad);
        assert_eq!(code, Some(2), "{bad:?}: {err}");
        assert!(err.contains("a batch must be from 1 to 4294967296"), "{err}");
    }
    // The largest batch the search may answer, and a prediction there: its
    // requests are far past any device: it does not fit.
    let start = std::time::Instant::now();
    let j = fit(&[s(2), s(4), "--max-batch".into(), "4294967296".into(), "--batch".into(), "4294967296".into()]);
    assert_eq!(j["max_batch"], 149, "as without the bound");
    assert_eq!(j["predictions"][0]["fits"], false);
    assert!(j["predictions"][0]["ooms"].as_u64().unwrap() > 0);
    assert!(start.elapsed().as_secs() < 10);
    for (snap, says) in [
        ("snapshot_kinds/history_less_gpt2.pickle.gz", "a snapshot without memory history"),
        ("snapshot_kinds/wrapped_steady_resnet50.pickle.gz", "a window of a longer run"),
    ] {
        let o = Command::new(bin).arg("fit").arg(s(2)).arg(format!("{}@4", fixture(snap).display())).output().unwrap();
        assert_eq!(o.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&o.stderr).contains(says), "{}", String::from_utf8_lossy(&o.stderr));
    }
}

/// Samples that cannot be one program at their batches are refused with
/// what is wrong, exit 2, not turned into a confident answer (#37 item 5):
/// labels swapped (GPT-2's batch-2 run labelled 4 and its batch-4 run 2,
/// which answered "largest batch 2885"), and two models (GPT-2 and BERT).
/// The same script's samples, vision models with cuDNN workspaces
/// included, pass with no warning.
#[test]
fn samples_that_cannot_be_right_are_refused() {
    let bin = env!("CARGO_BIN_EXE_gpumem-top");
    let at = |name: &str, b: u64| format!("{}@{b}", fixture(&format!("fit/{name}.pickle.gz")).display());
    let run = |a: String, b: String| {
        let o = Command::new(bin).args(["fit", &a, &b]).output().unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).to_string(),
            String::from_utf8_lossy(&o.stderr).to_string(),
        )
    };
    let (code, out, err) = run(at("gpt2_b2", 4), at("gpt2_b4", 2));
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(out.is_empty(), "nothing predicted: {out}");
    assert!(
        err.contains("(batch 4) peaked at 3.13 GiB allocated, below") && err.contains("are the @BATCH labels swapped?"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    let (code, out, err) = run(at("gpt2_b2", 2), at("bert_b4", 4));
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(err.contains("only 2141 of 3776 requests align across the samples (57%"), "{err}");
    for (a, b) in [(at("resnet50_b8", 8), at("resnet50_b16", 16)), (at("more/vit_b4", 4), at("more/vit_b8", 8))] {
        let (code, out, err) = run(a, b);
        assert_eq!(code, Some(0), "{err}");
        assert!(!out.contains("warning:"), "{out}");
        // What the reserved range is: a spread, said to be no bound.
        assert!(
            out.contains("spread of the draws: the lowest and highest peak reserved of the 16 replays")
                && out.contains("not a bound on the real one"),
            "{out}"
        );
    }
}

/// Several processes of one command (ranks, workers) that record: the first
/// to finish writes the batch's snapshot, each other its own `…PID` beside
/// it (none overwrites another), and `fit` says which it used.
#[test]
fn several_recording_processes_of_one_command_do_not_overwrite_each_other() {
    if !Command::new("python3").arg("--version").output().is_ok_and(|o| o.status.success()) {
        return;
    }
    let d = common::TmpDir::new("fitranks");
    let _ = std::fs::remove_dir_all(&d);
    fake_torch(&d);
    // Rank 0 starts rank 1 (the same script), as a launcher's ranks are.
    std::fs::write(
        d.join("train.py"),
        r#"
import os, subprocess, sys, torch
torch._state["batch"] = int(sys.argv[1])
child = None
if len(sys.argv) == 2:
    child = subprocess.Popen([sys.executable, __file__, sys.argv[1], "rank1"])
    child.wait()
for step in range(10):
    for h in torch._state["hooks"]:
        h(None, (), {})
"#,
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem-top"))
        .args(["fit", "--batches", "2,4", "--batch", "8", "--json", "--record-dir"])
        .arg(d.join("rec"))
        .arg("--")
        .args(["python3", d.join("train.py").to_str().unwrap(), "{batch}"])
        .env("PYTHONPATH", d.join("fake"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("batch 2: 2 processes of the command recorded; the first to finish is used"), "{err}");
    assert!(err.contains("batch 4: 2 processes of the command recorded"), "{err}");
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["predictions"][0]["batch"], 8);
    std::fs::remove_dir_all(&d).unwrap();
}

/// `fit` reports the largest batch under the setting `tune` recommends for
/// the run at its largest batch, beside the recorded setting's.
#[test]
fn fit_reports_the_largest_batch_under_tunes_pick() {
    let t = truth();
    let j = fit(&model_args(&t, "gpt2"));
    let pick = j["recommended_alloc_conf"].as_str().unwrap();
    assert_eq!(pick, "expandable_segments:True");
    let by = &j["max_batch_by_config"];
    assert_eq!(by[""], j["max_batch"]);
    assert!(by[pick].as_u64().unwrap() >= by[""].as_u64().unwrap(), "{by}");
    assert!(j["peak_at_max_batch_by_config"][pick]["fits"].as_bool().unwrap());
}

/// What grows with the batch (docs/user/fit.md "Categories"): per category, the
/// bytes at each sample's peak as `replay --json` gives them, weights and
/// optimizer state fixed at the largest sample's, activations and
/// temporaries on a line; at each predicted batch the categories add up to
/// within 5% of the predicted peak (and the prediction was within 3% of
/// PyTorch's, above).
#[test]
fn predictions_say_what_grows_with_the_batch() {
    let t = truth();
    let v = fit(&model_args(&t, "gpt2"));
    let cats = v["categories"].as_array().unwrap();
    let get = |name: &str| cats.iter().find(|c| c["category"] == name).unwrap_or_else(|| panic!("{name}: {v}"));
    for (i, s) in v["samples"].as_array().unwrap().iter().enumerate() {
        let out = Command::new(env!("CARGO_BIN_EXE_gpumem-top"))
            .args(["replay", "--json", s["snapshot"].as_str().unwrap()])
            .output()
            .unwrap();
        let r: Value = serde_json::from_slice(&out.stdout).unwrap();
        for c in cats {
            let name = c["category"].as_str().unwrap();
            assert_eq!(c["at_samples"][i][1], r["categories"]["at_peak"]["bytes"][name], "{name} at sample {i}");
        }
    }
    let (p, o, a) = (get("parameter"), get("optimizer_state"), get("activation"));
    assert_eq!(p["bytes_per_batch_item"], 0.0);
    assert_eq!(p["at_samples"][0][1], p["at_samples"][1][1], "GPT-2's weights, whatever the batch");
    assert_eq!(o["bytes_per_batch_item"], 0.0);
    assert!(a["bytes_per_batch_item"].as_f64().unwrap() > 100e6, "activations grow with the batch: {a}");
    for (k, pred) in v["predictions"].as_array().unwrap().iter().enumerate() {
        let sum: u64 = cats.iter().map(|c| c["predicted_bytes"][k].as_u64().unwrap()).sum();
        let peak = pred["allocated_peak_bytes"].as_f64().unwrap();
        assert!((sum as f64 / peak - 1.0).abs() < 0.05, "batch {}: categories {sum} vs peak {peak}", pred["batch"]);
    }
}

/// Samples that cannot be a fit's are refused in one line (exit 2): one
/// snapshot given at two batches, or a copy of it, and a sample that ran
/// out of memory while recorded (its peak is what it held when it failed,
/// which is no batch's need and was blamed on swapped labels). A batch
/// over the device shows what it needs, as on a device it fits.
#[test]
fn one_run_twice_or_one_that_ran_out_is_refused_and_a_batch_over_the_device_shows_its_need() {
    let run = |args: &[String]| Command::new(env!("CARGO_BIN_EXE_gpumem-top")).arg("fit").args(args).output().unwrap();
    let b2 = fixture("fit/gpt2_b2.pickle.gz");
    let copy = std::env::temp_dir().join(format!("gpumem-fit-copy-{}.pickle.gz", std::process::id()));
    std::fs::copy(&b2, &copy).unwrap();
    for second in [&b2, &copy] {
        let o = run(&[format!("{}@2", b2.display()), format!("{}@4", second.display())]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(
            err.contains("(batch 2) are the same snapshot: the samples must be runs at their own batches"),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    let _ = std::fs::remove_file(&copy);
    let oom = fixture("categories/gpt2_oom_first_step.pickle.gz");
    let o = run(&[format!("{}@2", b2.display()), format!("{}@8", oom.display())]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("(batch 8) ran out of memory while it was recorded (1 OOM): its peak, 2.54 GiB, is what it held when it failed"), "{err}");
    assert!(!err.contains("swapped"), "{err}");
    let samples = [format!("{}@2", b2.display()), format!("{}@4", fixture("fit/gpt2_b4.pickle.gz").display())];
    let at = |extra: &[&str]| {
        let args: Vec<String> =
            samples.iter().cloned().chain(["--batch", "64"].iter().chain(extra).map(|s| s.to_string())).collect();
        fit(&args)["predictions"][0].clone()
    };
    let (small, whole) = (at(&["--device-total", "24GiB"]), at(&[]));
    assert_eq!(small["fits"], false);
    assert!(small["allocated_peak_bytes"].as_u64().unwrap() > 24 << 30, "{small}");
    assert_eq!(small["allocated_peak_bytes"], whole["allocated_peak_bytes"], "the need does not depend on the device");
}

/// The table of what the peak is, by category, never contradicts the
/// prediction above it: where the lines through each category add up to
/// the predicted peaks (GPT-2, within 5% at every batch) it is shown, and
/// where the samples peak in different phases (ViT at 4 and 8: the lines
/// sum to 2.88 GiB at 16 beside a predicted 2.24 GiB) it is left out,
/// saying why, in the summary and in --json.
#[test]
fn the_category_table_adds_up_to_the_prediction_or_is_left_out() {
    let pair = |a: &str, b: &str| {
        vec![
            format!("{}", fixture(&format!("fit/{a}")).display()),
            format!("{}", fixture(&format!("fit/{b}")).display()),
        ]
    };
    let j = fit(&pair("gpt2_b2.pickle.gz@2", "gpt2_b4.pickle.gz@4"));
    assert!(j["categories_note"].is_null());
    let cats = j["categories"].as_array().unwrap();
    for (i, p) in j["predictions"].as_array().unwrap().iter().enumerate() {
        let sum: u64 = cats.iter().map(|c| c["predicted_bytes"][i].as_u64().unwrap()).sum();
        let want = p["allocated_peak_bytes"].as_u64().unwrap() as f64;
        assert!((sum as f64 / want - 1.0).abs() <= 0.05, "batch {}: {sum} vs {want}", p["batch"]);
    }
    let j = fit(&pair("more/vit_b4.pickle.gz@4", "more/vit_b8.pickle.gz@8"));
    assert!(j["categories"].as_array().unwrap().is_empty());
    let note = j["categories_note"].as_str().unwrap();
    assert!(note.contains("sums to 2.88 GiB at batch 16, not the predicted 2.24 GiB"), "{note}");
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem-top"))
        .arg("fit")
        .args(pair("more/vit_b4.pickle.gz@4", "more/vit_b8.pickle.gz@8"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("what the peak is, by category: not shown: a line through each category's bytes"), "{text}");
    assert!(!text.contains("0 B per batch item"), "{text}");
}

/// Far beyond the samples (measurements/fit/reach.sh, H200): three vision
/// models fitted from batches 8 and 16. The largest batch under 16 GiB
/// within what `reach` says of bisection over real runs (2.2%; MobileNetV3
/// 740 against 728 once cuDNN's batch-split buffers stop at 128, 725
/// before); peak allocated within 2% at 4,
/// 8 and 16 times the samples; peak reserved within what `reach` says real
/// runs measured at that reach (low, by cuDNN's large-batch workspaces),
/// which names the third sample that settles it; and with that sample
/// (MobileNetV3 at 128) the prediction at 256 within 0.5%.
#[test]
fn far_from_the_samples_the_reach_is_said_and_a_third_sample_settles_it() {
    let t: Value = serde_json::from_str(&std::fs::read_to_string(fixture("fit/reach/truth.json")).unwrap()).unwrap();
    let sample = |m: &str, b: u64| format!("{}@{b}", fixture(&format!("fit/reach/{m}_b{b}.pickle.gz")).display());
    for m in ["efficientnet", "mobilenet", "densenet"] {
        let truth = &t["models"][m];
        let mut args = vec![sample(m, 8), sample(m, 16), "--memory-limit".into(), "16GiB".into()];
        for b in ["64", "128", "256"] {
            args.extend(["--batch".into(), b.to_string()]);
        }
        let j = fit(&args);
        let (got, real) = (j["max_batch"].as_f64().unwrap(), truth["largest_under_limit"].as_f64().unwrap());
        println!("{m}: largest batch under 16 GiB {got} (real {real}, {:+.1}%)", (got / real - 1.0) * 100.0);
        let reach = &j["reach"];
        let said = reach["measured_largest_error"].as_f64().unwrap();
        assert!((got / real - 1.0).abs() <= said, "{m}: largest batch {got}, real {real}, said {said}");
        assert_eq!(reach["largest_sample"], 16, "{m}: {reach}");
        let farthest = j["max_batch"].as_u64().unwrap().max(256);
        assert_eq!(reach["farthest"].as_u64(), Some(farthest), "{m}: {reach}");
        assert_eq!(reach["third_sample"].as_u64(), Some(farthest / 2), "{m}: {reach}");
        let bound = reach["measured_reserved_error"].as_f64().unwrap();
        for p in j["predictions"].as_array().unwrap() {
            let want = &truth["peaks"][&p["batch"].to_string()];
            let err = |k: &str, w: &str| p[k].as_f64().unwrap() / want[w].as_f64().unwrap() - 1.0;
            let (ea, er) = (
                err("allocated_peak_bytes", "allocated_bytes.all.peak"),
                err("reserved_peak_bytes", "reserved_bytes.all.peak"),
            );
            println!("{m} at {}: allocated {:+.2}%, reserved {:+.2}%", p["batch"], ea * 100.0, er * 100.0);
            assert!(ea.abs() <= 0.02, "{m} at {}: allocated {:+.2}%", p["batch"], ea * 100.0);
            assert!(er <= 0.005 && -er <= bound, "{m} at {}: reserved {:+.2}%, said {bound}", p["batch"], er * 100.0);
        }
    }
    // The third sample: MobileNetV3 at 128 (a real run's snapshot).
    let args = vec![
        sample("mobilenet", 8),
        sample("mobilenet", 16),
        format!("{}@128", fixture("fit/reach/mobilenet_b128_real.pickle.gz").display()),
        "--batch".into(),
        "256".into(),
    ];
    let j = fit(&args);
    let want = &t["models"]["mobilenet"]["peaks"]["256"];
    let p = &j["predictions"][0];
    let er = p["reserved_peak_bytes"].as_f64().unwrap() / want["reserved_bytes.all.peak"].as_f64().unwrap() - 1.0;
    println!("mobilenet at 256 with a third sample at 128: reserved {:+.2}%", er * 100.0);
    assert!(er.abs() <= 0.005, "reserved {:+.2}%", er * 100.0);
    assert_eq!(j["reach"]["largest_sample"], 128, "{}", j["reach"]);
}

/// Under the conditions users train with (bf16 instead of fp16,
/// `cudnn.benchmark`, fp32; recorded on the H200, `measurements/fit/reach.sh`),
/// from samples at 8 and 16: the largest batch under 16 GiB within what
/// `reach` says of the real one (EfficientNet-B0 under bf16: 369 where real
/// runs reach 372; 350 while cuDNN's batch-split buffers were extrapolated
/// in proportion to the batch), and peak allocated at 128 within 2%
/// (within 0.01% for the bf16 run, +2.81% before), peak reserved there
/// within what `reach` says (fp32: +7.0%, cuDNN's large-batch workspaces).
#[test]
fn the_reach_says_how_far_below_the_real_largest_batch_fit_may_come_out() {
    let t: Value = serde_json::from_str(&std::fs::read_to_string(fixture("fit/reach/truth.json")).unwrap()).unwrap();
    let sample = |m: &str, b: u64| format!("{}@{b}", fixture(&format!("fit/reach/{m}_b{b}.pickle.gz")).display());
    let mut worst: f64 = 0.0;
    for m in ["effnet_bf16", "effnet_bench", "effnet_fp32", "mobilenet_bench"] {
        let truth = &t["conditions"]["models"][m];
        let args =
            vec![sample(m, 8), sample(m, 16), "--memory-limit".into(), "16GiB".into(), "--batch".into(), "128".into()];
        let j = fit(&args);
        let (got, real) = (j["max_batch"].as_f64().unwrap(), truth["largest_under_limit"].as_f64().unwrap());
        let off = got / real - 1.0;
        println!("{m}: largest batch under 16 GiB {got} (real {real}, {:+.1}%)", off * 100.0);
        let said = j["reach"]["measured_largest_error"].as_f64().unwrap();
        assert!(off.abs() <= said, "{m}: {:+.1}%, reach says within {:.1}%", off * 100.0, said * 100.0);
        worst = worst.max(off.abs());
        let p = &j["predictions"][0];
        let want = truth["peaks"]["128"]["allocated_bytes.all.peak"].as_f64().unwrap();
        let ea = p["allocated_peak_bytes"].as_f64().unwrap() / want - 1.0;
        let wr = truth["peaks"]["128"]["reserved_bytes.all.peak"].as_f64().unwrap();
        let er = p["reserved_peak_bytes"].as_f64().unwrap() / wr - 1.0;
        println!("{m} at 128: allocated {:+.2}%, reserved {:+.2}%", ea * 100.0, er * 100.0);
        assert!(ea.abs() <= 0.02, "{m} at 128: allocated {:+.2}%", ea * 100.0);
        let bound = j["reach"]["measured_reserved_error"].as_f64().unwrap();
        assert!(er.abs() <= bound, "{m} at 128: reserved {:+.2}%, reach says within {bound}", er * 100.0);
    }
    // `cudnn.benchmark`'s EfficientNet is the one that far off: the figure
    // the summary gives.
    assert!(worst > 0.02, "{worst}");
    let args = vec![sample("effnet_bf16", 8), sample("effnet_bf16", 16), "--memory-limit".into(), "16GiB".into()];
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem-top")).arg("fit").args(&args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("the largest batch under a limit within 2.2% of the real one (above or below)"), "{text}");
}

/// EfficientNet-B0 under bf16 autocast on the H200 (`fit --batches 32,128`,
/// measurements/h200_2026-12-03b.sh): the 1280×320 convolution's weight
/// gradient split over the batch takes 409,600 fp32 values per item at 32
/// and is done another way at 128 (docs/user/fit.md "Batch-split buffers").
/// From samples at 8, 16 and the real 32, the prediction at 128 meets the
/// real run's peaks within 0.5% allocated and 1.5% reserved (+2.8% allocated
/// while the buffer grew on its line).
#[test]
fn a_batch_split_buffer_is_not_extrapolated_past_where_cudnn_splits() {
    let real = |b: u64| fixture(&format!("fit/reach/effnet_bf16_b{b}_real.pickle.gz"));
    let peaks = |b: u64| {
        let out =
            Command::new(env!("CARGO_BIN_EXE_gpumem-top")).arg("replay").arg(real(b)).arg("--json").output().unwrap();
        let j: Value = serde_json::from_slice(&out.stdout).unwrap();
        (
            j["stats"]["allocated_bytes.all.peak"].as_f64().unwrap(),
            j["stats"]["reserved_bytes.all.peak"].as_f64().unwrap(),
        )
    };
    let (a128, r128) = peaks(128);
    assert_eq!((a128, r128), (5_916_524_544.0, 6_585_057_280.0));
    let sample = |b: u64| format!("{}@{b}", fixture(&format!("fit/reach/effnet_bf16_b{b}.pickle.gz")).display());
    let j = fit(&[sample(8), sample(16), format!("{}@32", real(32).display()), "--batch".into(), "128".into()]);
    let p = &j["predictions"][0];
    let (ea, er) = (
        p["allocated_peak_bytes"].as_f64().unwrap() / a128 - 1.0,
        p["reserved_peak_bytes"].as_f64().unwrap() / r128 - 1.0,
    );
    println!("effnet_bf16 from 8, 16, 32 at 128: allocated {:+.2}%, reserved {:+.2}%", ea * 100.0, er * 100.0);
    assert!(ea.abs() <= 0.005 && er.abs() <= 0.015, "allocated {:+.2}%, reserved {:+.2}%", ea * 100.0, er * 100.0);
}

/// The third sample `reach` names, taken past where cuDNN changes kernels
/// (EfficientNet-B0 fp32: three backward workspaces of 34 to 91 MB at 16
/// take under 2 MB at 128, measurements/h200_2026-12-03e.sh): its sizes are
/// off any line through the three, so they are read between neighbouring
/// samples, not refused as "not one program" (self-check at 8 was +13.5%
/// reserved through a least-squares line). At 128 the prediction is the
/// real run's peaks; the largest batch under 16 GiB within 1.1% of 189.
#[test]
fn a_third_sample_past_a_kernel_change_is_read_between_the_samples() {
    let t: Value = serde_json::from_str(&std::fs::read_to_string(fixture("fit/reach/truth.json")).unwrap()).unwrap();
    let truth = &t["conditions"]["models"]["effnet_fp32"];
    let f = |name: &str, b: u64| format!("{}@{b}", fixture(&format!("fit/reach/{name}.pickle.gz")).display());
    let args = vec![
        f("effnet_fp32_b8", 8),
        f("effnet_fp32_b16", 16),
        f("effnet_fp32_b128_real", 128),
        "--batch".into(),
        "128".into(),
        "--memory-limit".into(),
        "16GiB".into(),
    ];
    let j = fit(&args);
    let p = &j["predictions"][0];
    let want = &truth["peaks"]["128"];
    assert_eq!(p["allocated_peak_bytes"], want["allocated_bytes.all.peak"]);
    assert_eq!(p["reserved_peak_bytes"], want["reserved_bytes.all.peak"]);
    let (got, real) = (j["max_batch"].as_f64().unwrap(), truth["largest_under_limit"].as_f64().unwrap());
    println!("effnet_fp32 from 8, 16, 128: largest {got} (real {real}), nonlinear {}", j["alignment"]["nonlinear"]);
    assert!((got / real - 1.0).abs() <= 0.011, "largest {got}, real {real}");
    assert!(j["alignment"]["nonlinear"].as_u64().unwrap() > 0);
}
