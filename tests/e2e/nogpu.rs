//! `fit --no-gpu` against a real PyTorch on a CPU (`$GPUMEM_TOP_TORCH_PYTHON`:
//! .ci/run installs PyPI's 2.15): the training script runs with CUDA
//! faked, its recording is the H200 run's requests, and a script that
//! cannot run under the fake device gets one line (docs/user/fit.md
//! "Without a GPU"). Without the variable there is no torch to run.

use std::process::Command;

use serde_json::Value;

use crate::common;
use gpumem_top::alloc::Action;

fn torch_python() -> Option<std::ffi::OsString> {
    std::env::var_os("GPUMEM_TOP_TORCH_PYTHON")
}

fn bin() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_gpumem-top"))
}

/// `fit --no-gpu FIT_ARGS --record-dir D/rec -- PYTHON SCRIPT SCRIPT_ARGS`,
/// its temporary files under `d`: the output and where it recorded.
fn fit_no_gpu<S: AsRef<std::ffi::OsStr>>(
    d: &common::TmpDir,
    py: &std::ffi::OsStr,
    fit_args: &[&str],
    script: &str,
    script_args: impl IntoIterator<Item = S>,
) -> (std::process::Output, std::path::PathBuf) {
    let rec = d.as_path().join("rec");
    let out = Command::new(bin())
        .args(["fit", "--no-gpu"])
        .args(fit_args)
        .arg("--record-dir")
        .arg(&rec)
        .arg("--")
        .arg(py)
        .arg(common::root().join(script))
        .args(script_args)
        .env("TMPDIR", d.as_path())
        .output()
        .unwrap();
    (out, rec)
}

fn allocs(path: &std::path::Path) -> Vec<u64> {
    let t = gpumem_top::trace::load(path).unwrap();
    t.devices[0].events.iter().filter(|e| e.action == Action::Alloc).map(|e| e.size).collect()
}

/// The MLP loop recorded on the H200 (fixture traces/small_loop, 12 AdamW
/// steps at batch 32) recorded again here with no GPU: the same requests,
/// and fit's prediction at 32 is PyTorch's peaks on the H200. The largest
/// batch under the limit is recorded too, and fits when replayed there.
#[test]
fn fit_without_a_gpu_predicts_the_h200_run() {
    let Some(py) = torch_python() else {
        return;
    };
    let d = common::TmpDir::new("nogpu-fit");
    let unused = d.as_path().join("unused.pickle");
    let (out, rec) = fit_no_gpu(
        &d,
        &py,
        &["--batches", "32,64", "--batch", "32", "--steps", "12", "--memory-limit", "1GiB", "--json"],
        "measurements/ten_million/record_loop.py",
        [unused.as_os_str()]
            .into_iter()
            .chain(["--model", "mlp", "--steps", "12", "--batch", "{batch}"].map(std::ffi::OsStr::new)),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(allocs(&rec.join("batch32.pickle")), allocs(&common::fixture("traces/small_loop.pickle.gz")));
    assert_eq!(j["predictions"][0]["batch"], 32);
    assert_eq!(j["predictions"][0]["allocated_peak_bytes"], 99_929_600);
    assert_eq!(j["predictions"][0]["reserved_peak_bytes"], 111_149_056);
    let mb = j["max_batch"].as_u64().unwrap();
    assert!(mb > 64, "{j}");
    // The answer and the batch above it were recorded themselves: it fits
    // under the limit and the next does not.
    let recorded: Vec<u64> =
        j["no_gpu"]["recorded_batches"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap()).collect();
    assert!(recorded.contains(&mb) && recorded.contains(&(mb + 1)), "{j}");
    assert!(rec.join(format!("batch{mb}.pickle")).exists());
    let at = &j["peak_at_max_batch_by_config"][""];
    assert_eq!(at["fits"], true, "{j}");
    assert!(at["reserved_peak_bytes"].as_u64().unwrap() <= 1 << 30, "{j}");
    assert_eq!(j["no_gpu"]["assumed_device"], "NVIDIA H200");
}

/// One attention call as T5 makes it (bf16 autocast, a learned fp32 bias
/// as the mask, dropout; `measurements/nogpu/sdpa_ops.py`) takes ATen's
/// math path, recorded as CUDA runs it: the steps the H200's T5 traces
/// show at batch 16 after the scores' matmul (softmax's output, the
/// `-inf` test and its rows' `all`, a scalar, dropout's one-byte mask
/// and output, the probabilities in bf16), not the meta run's (the mask
/// added out of place, a dropout mask of fp32).
#[test]
fn math_attention_is_recorded_as_cuda_runs_it() {
    let Some(py) = torch_python() else {
        return;
    };
    let d = common::TmpDir::new("nogpu-sdpa");
    let (out, rec) = fit_no_gpu(
        &d,
        &py,
        &["--batches", "16", "--batch", "16", "--max-batch", "16", "--json"],
        "measurements/nogpu/sdpa_ops.py",
        ["--batch-size", "{batch}"],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let sizes = allocs(&rec.join("batch16.pickle"));
    let step: [u64; 7] = [33_554_432, 8_388_608, 32_768, 4, 8_388_608, 33_554_432, 16_777_216];
    assert_eq!(sizes.windows(7).filter(|w| *w == step).count(), 1, "{sizes:?}");
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["no_gpu"]["recorder_notes"]["attention: math"], 1, "{j}");
}

/// A script that needs a value on the GPU to go on (a data-dependent
/// shape) stops under the fake device: one line naming the operation and
/// the script's line, exit 2.
#[test]
fn a_script_the_fake_device_cannot_run_gets_one_line() {
    let Some(py) = torch_python() else {
        return;
    };
    let d = common::TmpDir::new("nogpu-fail");
    let script = d.as_path().join("train.py");
    std::fs::write(
        &script,
        "import sys, torch\nb = int(sys.argv[1])\nx = torch.randn(b, 8, device='cuda')\nkeep = torch.nonzero(x > 0)\nprint(keep.shape)\n",
    )
    .unwrap();
    let out = Command::new(bin())
        .args(["fit", "--no-gpu", "--"])
        .arg(&py)
        .arg(&script)
        .arg("{batch}")
        .env("TMPDIR", d.as_path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(last.contains("batch 2: the command stopped under the fake device"), "{err}");
    assert!(last.contains("aten.nonzero"), "{err}");
    assert!(last.contains(&format!("{}:4", script.display())), "{err}");
}
