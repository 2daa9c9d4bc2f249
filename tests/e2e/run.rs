//! `gpumem-top run -- CMD` and `gpumem-top snapshot PID` without a GPU: the
//! publisher injected into CPython over the stand-in torch of
//! tests/fake_torch, recorded headless, and read back.

use crate::common;

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

const MIB: u64 = 1 << 20;

fn have_python() -> bool {
    Command::new("python3").arg("--version").output().is_ok_and(|o| o.status.success())
}

fn tmpdir(tag: &str) -> common::TmpDir {
    common::TmpDir::new(&format!("run-{tag}"))
}

/// The binary: where cargo built it, or the GPU bundle's copy.
fn bin() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_BIN_EXE_gpumem-top"));
    if built.exists() {
        return built;
    }
    common::root().join(".gpu/gpumem-top")
}

/// `gpumem-top run ARGS -o DIR/rec.jsonl --publish-dir DIR/pub --
/// python3 tests/scripts/fake_train.py` over the stand-in torch.
fn run_fake_train(d: &std::path::Path, args: &[&str]) -> std::process::Output {
    run_fake_train_with(d, args, &[])
}

/// As `run_fake_train`, with more environment for the command.
fn run_fake_train_with(d: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    Command::new(bin())
        .arg("run")
        .args(args)
        .arg("-o")
        .arg(d.join("rec.jsonl"))
        .arg("--publish-dir")
        .arg(d.join("pub"))
        .arg("--")
        .arg("python3")
        .arg(common::root().join("tests/scripts/fake_train.py"))
        .env("PYTHONPATH", common::root().join("tests/fake_torch"))
        .env("GPUMEM_TOP_BIN", bin())
        .env("SNAP_DIR", d)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn replay_json(rec: &std::path::Path) -> Value {
    let out = Command::new(bin()).arg("replay").arg(rec).arg("--json").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The done-when of the live issue, on the stand-in: each step's own peak
/// reaches the recording exactly, the script's own readings are what they
/// would be without us, the hook starts only once CUDA is initialised,
/// survives a fork, and answers a snapshot request.
#[test]
fn run_injects_the_publisher_and_records_each_steps_own_peak() {
    if !have_python() {
        return;
    }
    let d = tmpdir("steps");
    let (publish, rec) = (d.join("pub"), d.join("rec.jsonl"));
    // Step peaks are the default: no flag.
    let out = run_fake_train(&d, &["--history", "5000", "--interval", "40"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let script: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {err}"));
    // Nothing before CUDA is initialised; publishing right after.
    assert_eq!((script["before_init"].as_bool(), script["after_init"].as_bool()), (Some(false), Some(true)));
    // The script's max_memory_allocated() after each step: the running
    // maximum, as if nobody reset the peaks (step 3's own peak is 202 MiB;
    // 150 MiB came and went before step 1).
    let reads: Vec<u64> = script["reads"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(reads, [150 * MIB, 301 * MIB, 301 * MIB, 403 * MIB]);
    assert_eq!(script["reserved_read"], 403 * MIB);
    // Its own reset still works: the peak is then what is allocated.
    assert_eq!(script["after_reset"], 4 * MIB);
    // The forked child left the parent's file.
    let files: Vec<&str> = script["files"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(files.iter().any(|f| f.ends_with("-0.json")), "{files:?}");
    // The snapshot it asked of itself: torch.cuda.memory._snapshot() with
    // the history recorded as --history said.
    assert_eq!(script["snapshot_rc"], 0, "{}", script["snapshot_out"]);
    assert!(script["snapshot_out"].as_str().unwrap().contains("open it with: gpumem-top replay"));
    assert_eq!(script["snapshot"]["history"]["max_entries"], 5000);
    // The stand-in says it is PyTorch 2.11, whose history with stacks at
    // frees crashes activation checkpointing: stacks at allocations only.
    assert_eq!(script["snapshot"]["history"]["context"], "alloc");
    assert_eq!(script["snapshot"]["history"]["stacks"], "python");
    assert!(err.contains("pytorch #179536") && err.contains("context='alloc'"), "{err}");
    assert_eq!(script["snapshot"]["device_traces"][0][0]["size"], 4 * MIB);
    // Layouts never took the full snapshot (with the history): in PyTorch
    // 2.11 that imports torch._inductor, which from the publisher's thread
    // can deadlock with the training thread's own imports.
    assert_eq!(script["full_snapshots"], serde_json::json!([]));

    // The recording: each step's own peaks, exactly; step 1's includes the
    // transient the publisher's sampling windows saw before it, and the
    // last steps come from the final file the process wrote at exit.
    let j = replay_json(&rec);
    let procs = j["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 1, "{j}");
    let p = &procs[0];
    assert_eq!(p["step_peaks"], true);
    // The recording says what history was recorded, and why it was less.
    assert_eq!(p["history"]["context"], "alloc");
    assert_eq!(p["history"]["max_entries"], 5000);
    assert!(p["history"]["note"].as_str().unwrap().contains("pytorch #179536"), "{p}");
    let steps = p["steps"].as_array().unwrap();
    let col = |k: &str| -> Vec<u64> { steps.iter().map(|s| s[k].as_u64().unwrap()).collect() };
    assert_eq!(col("step"), [1, 2, 3, 4]);
    assert_eq!(col("allocated_peak_bytes"), [150 * MIB, 301 * MIB, 202 * MIB, 403 * MIB]);
    assert_eq!(col("reserved_peak_bytes"), [150 * MIB, 301 * MIB, 301 * MIB, 403 * MIB]);
    assert_eq!(col("allocated_end_bytes"), [MIB, 2 * MIB, 3 * MIB, 4 * MIB]);
    assert_eq!(p["peak_allocated_bytes"], 403 * MIB);
    // The final file, once read, was removed.
    assert!(std::fs::read_dir(&publish)
        .unwrap()
        .flatten()
        .all(|e| !e.file_name().to_string_lossy().ends_with(".json")));
    std::fs::remove_dir_all(&d).unwrap();
}

/// The history settings follow the PyTorch release: every stack before
/// 2.11, stacks at allocations only from 2.11 (pytorch #179536), and what
/// $GPUMEM_TOP_HISTORY_CONTEXT asks for over either, said on stderr.
#[test]
fn history_settings_follow_the_pytorch_release() {
    if !have_python() {
        return;
    }
    for (version, over, context, warns) in [
        ("2.10.1+cu128", "", "all", false),
        ("2.11.0+cu130", "", "alloc", true),
        ("2.12.0a0+git1234", "", "alloc", true),
        // The checkpointing crash is not known fixed in any later release:
        // the safe setting stays (docs/user/live.md).
        ("2.13.0+cu130", "", "alloc", true),
        ("2.14.1", "", "alloc", true),
        ("2.15.0+cu132", "", "alloc", true),
        ("2.11.0", "state", "state", true),
        ("2.11.0", "all", "all", true),
        ("2.10.0", "none", "none", true),
    ] {
        let d = tmpdir(&format!("hist-{context}-{}", over.len()));
        let env = [("FAKE_TORCH_VERSION", version), ("GPUMEM_TOP_HISTORY_CONTEXT", over)];
        let out = run_fake_train_with(&d, &["--history", "500", "--interval", "40"], &env);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        let script: Value = serde_json::from_slice(&out.stdout).unwrap();
        let h = &script["snapshot"]["history"];
        let got = if h["context"].is_null() { "none" } else { h["context"].as_str().unwrap() };
        assert_eq!(got, context, "torch {version}, override {over:?}: {h}");
        let p = &replay_json(&d.join("rec.jsonl"))["processes"][0];
        assert_eq!(p["history"]["context"], context, "{p}");
        assert_eq!(p["history"]["note"].is_string(), warns, "torch {version}, override {over:?}: {p}");
        assert_eq!(err.contains("gpumem_top_publish: "), warns, "{err}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}

/// The snapshots the publisher takes (the live monitor's `S`, `gpumem-top
/// snapshot`) carry `torch.__version__`, so a replay follows that release's
/// allocator (docs/user/replay.md, "Which release").
#[test]
fn published_snapshots_carry_the_torch_version() {
    if !have_python() {
        return;
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for version in ["2.11.0+cu130", "2.12.1", "2.13.0+cu130", "2.15.0+cu132"] {
        let out = Command::new("python3")
            .args(["-c", "import torch, gpumem_top_publish as g; s = g.snapshot_with_version(torch); print(s['torch_version'], sorted(s))"])
            .env("PYTHONPATH", format!("{}:{}", root.join("assets/python").display(), root.join("tests/fake_torch").display()))
            .env("FAKE_TORCH_VERSION", version)
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("{version} ['device_traces', 'history', 'segments', 'torch_version']"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Against a real PyTorch (`$GPUMEM_TOP_TORCH_PYTHON`, a python with torch:
/// .ci/run installs PyPI's 2.15, which runs on a CPU): every torch API the
/// publisher and the hooks use is where they look for it, and `run` over a
/// CPU training leaves it training. Without the variable there is nothing
/// to run against (the GPU machine has 2.11 only: tests/e2e/gpu.rs).
#[test]
fn the_python_side_works_against_a_real_torch() {
    let Some(py) = std::env::var_os("GPUMEM_TOP_TORCH_PYTHON") else {
        return;
    };
    let root = common::root();
    // torch writes caches (torchinductor_$USER) under $TMPDIR: ours, removed.
    let d = tmpdir("realtorch");
    let out = Command::new(&py)
        .arg(root.join("tests/scripts/torch_api.py"))
        .env("PYTHONPATH", root.join("assets/python"))
        .env("TMPDIR", &d)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.trim_end().ends_with("\nok"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(
        d.join("train.py"),
        "import torch\nm = torch.nn.Linear(8, 8)\no = torch.optim.AdamW(m.parameters())\nfor i in range(5):\n    m(torch.randn(4, 8)).sum().backward()\n    o.step()\n    o.zero_grad()\nprint('trained', torch.__version__)\n",
    )
    .unwrap();
    let out = Command::new(bin())
        .args(["run", "-o"])
        .arg(d.join("rec.jsonl"))
        .arg("--publish-dir")
        .arg(d.join("pub"))
        .arg("--")
        .arg(&py)
        .arg(d.join("train.py"))
        .env("TMPDIR", &d)
        .output()
        .unwrap();
    let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{all}");
    assert!(all.contains("trained 2."), "{all}");
    assert!(all.contains("exit status: 0"), "{all}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// With --no-step-peaks nothing is reset: the steps are logged at their
/// ends with no peaks of their own, and the script reads PyTorch's own
/// counters untouched. The script's own reset (fake_train.py resets the
/// peaks after its steps, as per-step logging does) does not lower the
/// peak shown: the publisher kept the true one across it.
#[test]
fn without_step_peaks_steps_are_their_ends_and_nothing_is_reset() {
    if !have_python() {
        return;
    }
    let d = tmpdir("nopeaks");
    let rec = d.join("rec.jsonl");
    let out = run_fake_train(&d, &["--interval", "40", "--no-step-peaks"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let script: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(script["reads"], serde_json::json!([150 * MIB, 301 * MIB, 301 * MIB, 403 * MIB]));
    assert_eq!(script["after_reset"], 4 * MIB, "the script's reset still works for the script");
    // No history asked for: none recorded.
    assert_eq!(script["snapshot"]["history"], serde_json::json!({}));
    let j = replay_json(&rec);
    let p = &j["processes"][0];
    assert_eq!(p["step_peaks"], false);
    let steps = p["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 4);
    assert!(steps.iter().all(|s| s["allocated_peak_bytes"].is_null()));
    // The true peak, though the script reset PyTorch's counters to 4 MiB:
    // in the process summary and in the last sample the bars draw from.
    assert_eq!(p["peak_allocated_bytes"], 403 * MIB, "{p}");
    let text = std::fs::read_to_string(&rec).unwrap();
    let lines: Vec<Value> = text.lines().skip(1).map(|l| serde_json::from_str(l).unwrap()).collect();
    let last = lines.iter().rev().find_map(|l| l["publishers"].get(0)).unwrap();
    assert_eq!(last["allocated_peak_bytes"], 403 * MIB, "{last}");
    assert_eq!(last["reserved_peak_bytes"], 403 * MIB, "{last}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// A Python process that imports torch and never initialises CUDA (a
/// launcher, a data worker) publishes nothing and never loads the
/// publisher; the command's exit status is `run`'s.
#[test]
fn a_process_that_never_touches_cuda_publishes_nothing() {
    if !have_python() {
        return;
    }
    let d = tmpdir("nocuda");
    let publish = d.join("pub");
    let out = Command::new(bin())
        .args(["run", "--interval", "20", "-o"])
        .arg(d.join("rec.jsonl"))
        .arg("--publish-dir")
        .arg(&publish)
        .args(["--", "python3", "-c"])
        .arg(
            "import os, sys, time, torch; time.sleep(0.3); \
             print(sorted(f for f in os.listdir(os.environ['GPUMEM_TOP_DIR']) if not f.startswith('run-')), 'gpumem_top_publish' in sys.modules); sys.exit(7)",
        )
        .env("PYTHONPATH", common::root().join("tests/fake_torch"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[] False");
    let j = replay_json(&d.join("rec.jsonl"));
    assert_eq!(j["processes"], serde_json::json!([]));
    std::fs::remove_dir_all(&d).unwrap();
}

/// Bad usage gets one line and exit 2: no command, a snapshot of a process
/// that does not publish, an output that exists; the help offers only what
/// `run` accepts.
#[test]
fn run_and_snapshot_refuse_bad_usage() {
    let help = Command::new(bin()).args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--step-peaks") && !help.contains("--json") && !help.contains("--source"), "{help}");
    let d = tmpdir("bad");
    let out = Command::new(bin()).args(["run", "-o"]).arg(d.join("x.jsonl")).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(bin()).args(["snapshot", "1", "--publish-dir"]).arg(&d).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("pid 1 does not publish its allocator state"), "{err}");
    std::fs::write(d.join("x.jsonl"), "").unwrap();
    let out = Command::new(bin()).args(["run", "-o"]).arg(d.join("x.jsonl")).args(["--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("x.jsonl: File exists"));
    std::fs::remove_dir_all(&d).unwrap();
}

/// `attach` needs Python 3.14's sys.remote_exec: an older interpreter, a
/// program that is not Python, a process that does not exist each get one
/// line saying so and what to do instead, exit 2.
#[test]
fn attach_says_plainly_when_it_cannot() {
    if !have_python() {
        return;
    }
    let mut py = Command::new("python3").args(["-c", "import time; time.sleep(20)"]).spawn().unwrap();
    // Between fork and exec the child is still this test's binary: under a
    // loaded CI, attach could look at it then and rightly say it is no
    // Python. Wait (up to 10 s) until it is one.
    let exe = format!("/proc/{}/exe", py.id());
    let t0 = std::time::Instant::now();
    while !std::fs::read_link(&exe)
        .is_ok_and(|e| e.file_name().is_some_and(|n| n.to_string_lossy().starts_with("python")))
        && t0.elapsed() < std::time::Duration::from_secs(10)
    {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let v = Command::new("python3").args(["-c", "import sys; print(sys.version_info >= (3, 14))"]).output().unwrap();
    if String::from_utf8_lossy(&v.stdout).trim() == "False" {
        let out = Command::new(bin()).args(["attach", &py.id().to_string()]).output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("attaching needs Python 3.14 or later (sys.remote_exec)"), "{err}");
        assert!(err.contains("gpumem-top run -- CMD"), "{err}");
    }
    let _ = py.kill();
    let _ = py.wait();
    let mut sleep = Command::new("sleep").arg("20").spawn().unwrap();
    let out = Command::new(bin()).args(["attach", &sleep.id().to_string()]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a Python we can ask"));
    let _ = sleep.kill();
    let _ = sleep.wait();
    let out = Command::new(bin()).args(["attach", "4000000000"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// A command that does not exist: the shell's 127, one line, and no `-o`
/// file left behind (so the retry does not say "File exists").
#[test]
fn a_command_that_does_not_exist_exits_127_and_leaves_nothing() {
    let d = tmpdir("missing");
    let rec = d.join("rec.jsonl");
    let out = Command::new(bin())
        .args(["run", "-o"])
        .arg(&rec)
        .arg("--publish-dir")
        .arg(d.join("pub"))
        .args(["--", "no-such-command-gpumem-top"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.lines().last(),
        Some("gpumem-top: no-such-command-gpumem-top: No such file or directory (os error 2)"),
        "{err}"
    );
    assert!(!rec.exists());
    std::fs::remove_dir_all(&d).unwrap();
}

/// `run -o` passes a SIGTERM sent to it (docker stop, a scheduler) on to
/// the command, finishes the recording once the command has exited, and
/// returns at once after it rather than two intervals later.
#[test]
fn run_forwards_sigterm_and_returns_when_the_command_ends() {
    if !have_python() {
        return;
    }
    let d = tmpdir("sigterm");
    let rec = d.join("rec.jsonl");
    let script = "import signal, sys, time\n\
                  def bye(*a):\n    print('got SIGTERM', flush=True); sys.exit(7)\n\
                  signal.signal(signal.SIGTERM, bye)\n\
                  print('ready', flush=True)\n\
                  time.sleep(60)\n";
    let mut child = Command::new(bin())
        .args(["run", "--interval", "3000", "-o"])
        .arg(&rec)
        .arg("--publish-dir")
        .arg(d.join("pub"))
        .args(["--", "python3", "-c", script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let sent = std::time::Instant::now();
    // SAFETY: kill(2) on the child we spawned and have not reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let took = sent.elapsed();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert!(rest.contains("got SIGTERM"), "{rest}");
    assert_eq!(out.status.code(), Some(7), "{}", String::from_utf8_lossy(&out.stderr));
    // Not 2 × 3 s: the last sample is taken when the command exits.
    assert!(took < std::time::Duration::from_millis(2500), "{took:?}");
    let text = std::fs::read_to_string(&rec).unwrap();
    assert!(text.lines().count() >= 3, "a header and two samples at least: {text}");
    assert!(text.lines().all(|l| serde_json::from_str::<Value>(l).is_ok()));
    std::fs::remove_dir_all(&d).unwrap();
}

/// A relative `--publish-dir` reaches the command as an absolute path, so
/// a command that changes directory (Hydra does) is still recorded.
#[test]
fn a_relative_publish_dir_survives_a_change_of_directory() {
    if !have_python() {
        return;
    }
    let d = tmpdir("relative");
    let script = format!(
        "import os, runpy, sys; os.chdir('/'); sys.argv = ['fake_train.py']; runpy.run_path({:?}, run_name='__main__')",
        common::root().join("tests/scripts/fake_train.py").display().to_string()
    );
    let out = Command::new(bin())
        .current_dir(&d)
        .args(["run", "--interval", "40", "-o", "rec.jsonl", "--publish-dir", "pub", "--", "python3", "-c", &script])
        .env("PYTHONPATH", common::root().join("tests/fake_torch"))
        .env("GPUMEM_TOP_BIN", bin())
        .env("SNAP_DIR", &d)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j = replay_json(&d.join("rec.jsonl"));
    assert_eq!(j["processes"].as_array().map(Vec::len), Some(1), "{j}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// Recorded on the H200 (measurements/never_crash/h200.sh): `run` beside GPT-2
/// training whose script logs `max_memory_allocated()` and calls
/// `reset_peak_memory_stats()` after every step. Every peak the recording
/// shows is the true one, 8,690,289,664 B as the script itself printed at
/// steps 2–6; the bars' peak in the last sample too, and no fragmentation
/// alert judged on a reset counter.
#[test]
fn a_script_that_resets_its_peaks_still_shows_the_true_ones() {
    let rec = common::fixture("live/reset_peaks_gpt2.jsonl");
    let j = replay_json(&rec);
    let p = &j["processes"][0];
    assert_eq!(p["peak_allocated_bytes"], 8_690_289_664u64, "{p}");
    assert_eq!(p["peak_reserved_bytes"], 9_378_463_744u64);
    let steps: Vec<u64> =
        p["steps"].as_array().unwrap().iter().map(|s| s["allocated_peak_bytes"].as_u64().unwrap()).collect();
    assert_eq!(steps, [7_642_577_920, 8_690_289_664, 8_690_289_664, 8_690_289_664, 8_690_289_664, 8_690_289_664]);
    let text = std::fs::read_to_string(&rec).unwrap();
    for l in text.lines().skip(1) {
        let v: Value = serde_json::from_str(l).unwrap();
        assert!(v["alerts"].as_array().unwrap().iter().all(|a| a["kind"] != "fragmentation"), "{}", v["alerts"]);
    }
    let last = text
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find_map(|v| v["publishers"].get(0).cloned())
        .unwrap();
    assert_eq!(last["allocated_peak_bytes"], 8_690_289_664u64);
    assert_eq!(last["reserved_peak_bytes"], 9_378_463_744u64);
}

/// `snapshot`: a destination in a missing directory is refused before the
/// process is asked (no request left behind), and a process that is gone
/// is said at once, not after the 60 s timeout.
#[test]
fn snapshot_checks_the_destination_first_and_notices_a_dead_process() {
    let d = tmpdir("snapdead");
    let publish = d.join("pub");
    std::fs::create_dir_all(&publish).unwrap();
    std::fs::set_permissions(&publish, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    // A publisher file of a pid that no longer exists (its process died
    // without its final file).
    let pid = 3_999_999_999u32;
    std::fs::write(
        publish.join(format!("{pid}-0.json")),
        format!("{{\"version\":1,\"pid\":{pid},\"device\":0,\"time\":1.0,\"stats\":{{}}}}"),
    )
    .unwrap();
    let snap = |out: &std::path::Path| {
        Command::new(bin())
            .args(["snapshot", &pid.to_string(), "--publish-dir"])
            .arg(&publish)
            .arg("-o")
            .arg(out)
            .output()
            .unwrap()
    };
    let o = snap(&d.join("missing/dir/x.pickle"));
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("missing/dir: no such directory"));
    assert!(!publish.join(format!("{pid}.snapshot-request")).exists(), "nothing asked");
    let start = std::time::Instant::now();
    let o = snap(&d.join("x.pickle"));
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("exited before answering"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(start.elapsed() < std::time::Duration::from_secs(5));
    assert!(!publish.join(format!("{pid}.snapshot-request")).exists(), "the request was withdrawn");
    std::fs::remove_dir_all(&d).unwrap();
}

/// What the publisher counts of an optimizer at a step's end
/// (docs/user/categories.md "Live"): its parameters, their gradients and its
/// state on the device, each storage once (a view of a parameter is not
/// counted twice), rounded up to the allocator's 512 bytes; tensors on
/// another device, on the CPU and plain numbers are not counted.
#[test]
fn the_publisher_counts_what_the_optimizer_holds() {
    let code = r#"
import json, torch, gpumem_top_publish as g
T = torch.Tensor
shared = T(0x1000, 3000)
view = T(0, 0, storage=shared.untyped_storage())
params = [T(0x10000, 4096, grad=T(0x20000, 4096)), T(0x11000, 1000), T(0x12000, 64, device=None),
          T(0x13000, 2048, device=1, grad=T(0x14000, 2048, device=1)), shared, view]
class Opt: pass
o = Opt()
o.param_groups = [{"params": params[:3]}, {"params": params[3:]}]
o.state = {0: {"exp_avg": T(0x30000, 4096), "exp_avg_sq": T(0x31000, 4096), "step": 3}, 1: {"momentum_buffer": T(0x32000, 700)}}
print(json.dumps(g._optimizer_bytes(torch, o, 0)))
g._state["interval"] = 0.5
g._note_categories(torch, o, 0, 7, 1 << 20)
g._note_categories(torch, o, 0, 8, 2 << 20)  # within the interval: not taken again
print(json.dumps(g._state["categories"]))
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", code])
        .env(
            "PYTHONPATH",
            format!(
                "{}:{}",
                common::root().join("assets/python").display(),
                common::root().join("tests/fake_torch").display()
            ),
        )
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("[8192, 4096, 9216]"));
    let c: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!((c["step"].as_u64(), c["allocated"].as_u64()), (Some(7), Some(1 << 20)));
    assert_eq!(
        (c["parameter"].as_u64(), c["gradient"].as_u64(), c["optimizer_state"].as_u64()),
        (Some(8192), Some(4096), Some(9216))
    );
}
