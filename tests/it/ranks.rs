//! All ranks of a job (docs/user/ranks.md): one snapshot per rank replayed side
//! by side (H200 ground truth: a 3-rank gloo DDP GPT-2 job on one GPU,
//! each rank's `torch.cuda.max_memory_allocated()`), the live job screen
//! over eight published ranks with one gone, memory outside the allocator,
//! the imbalance alert, Prometheus labels, and a job of real processes
//! over the stand-in torch under `gpumem-top run`.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{bin, fixture, root};
use gpumem_top::monitor::publisher;
use gpumem_top::monitor::{GpuSample, ProcessSample, Snapshot};
use gpumem_top::ui::event::Interactive;
use gpumem_top::ui::live::LiveApp;
use gpumem_top::ui::recording::RecordingApp;
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn rank_files() -> Vec<PathBuf> {
    (0..3).map(|r| fixture(&format!("ranks/rank{r}.pickle.gz"))).collect()
}

fn truth(r: usize) -> Value {
    let p = fixture(&format!("ranks/rank{r}.truth.json"));
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn json_of(args: &[&Path]) -> Value {
    let out = Command::new(bin()).arg("replay").args(args).arg("--json").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `replay rank0 rank1 rank2`: each rank's report is the one `replay`
/// gives it alone (timing aside), its peak what the rank printed on the
/// H200, and the worst rank is judged against the median.
#[test]
fn one_snapshot_per_rank_replays_side_by_side_as_each_alone() {
    let files = rank_files();
    let paths: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let j = json_of(&paths);
    let ranks = j["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 3);
    for (r, rep) in ranks.iter().enumerate() {
        let t = truth(r);
        assert_eq!(rep["rank"], r);
        assert_eq!(rep["fidelity"], "exact");
        assert_eq!(rep["peak"]["allocated_bytes"], t["max_memory_allocated"], "rank {r}");
        assert_eq!(rep["stats"]["reserved_bytes.all.peak"], t["max_memory_reserved"], "rank {r}");
        let mut alone = json_of(&[paths[r]]);
        let mut side = rep.clone();
        for v in [&mut alone, &mut side] {
            let m = v.as_object_mut().unwrap();
            m.remove("elapsed_ms");
            m.remove("rank");
            m.remove("path");
        }
        assert!(alone == side, "rank {r}'s report differs from its replay alone");
    }
    let peak = |r: usize| truth(r)["max_memory_allocated"].as_u64().unwrap();
    let imb = &j["imbalance"];
    assert_eq!(imb["measure"], "peak_allocated");
    assert_eq!(imb["worst_rank"], 2);
    assert_eq!(imb["median_peak_bytes"], peak(1));
    assert_eq!(imb["worst_peak_bytes"], peak(2));
    let over = imb["over_median"].as_f64().unwrap();
    assert!((over - (peak(2) as f64 / peak(1) as f64 - 1.0)).abs() < 1e-12, "{over}");

    // Given out of order, the ranks come from the files' names.
    let shuffled = [paths[2], paths[0], paths[1]];
    let j2 = json_of(&shuffled);
    let order: Vec<u64> = j2["ranks"].as_array().unwrap().iter().map(|r| r["rank"].as_u64().unwrap()).collect();
    assert_eq!(order, [2, 0, 1]);
    assert_eq!(j2["imbalance"]["worst_rank"], 2);

    // The summary: one table row per rank, then each rank's own summary.
    let out = Command::new(bin()).arg("replay").args(&paths).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.starts_with("3 ranks side by side, each replayed alone:\n"), "{text}");
    for (r, row) in [(0, "2.02 GiB"), (1, "2.96 GiB"), (2, "3.90 GiB")] {
        let line = text.lines().find(|l| l.starts_with(&format!("  {r:>4}  rank{r}.pickle.gz"))).expect("row");
        assert!(line.contains(row) && line.ends_with("exact"), "{line}");
        assert_eq!(line.find("exact"), text.lines().nth(1).unwrap().find("replay"), "aligned: {text}");
        assert!(text.contains(&format!("── rank {r}: ")), "{text}");
    }
    assert!(text.contains("median peak allocated: 2.96 GiB; worst rank 2 at 3.90 GiB (+31.8% over the median)"));
    // A recording among them is refused: it holds every rank already.
    let rec = std::env::temp_dir().join(format!("gpumem-top-ranks-rec-{}.jsonl", std::process::id()));
    std::fs::write(&rec, "{\"format\":\"gpumem-top-record\",\"version\":1,\"source\":\"nvml\",\"interval_ms\":500}\n")
        .unwrap();
    let out = Command::new(bin()).arg("replay").arg(paths[0]).arg(&rec).output().unwrap();
    let _ = std::fs::remove_file(&rec);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("a recording holds every rank already"));
}

/// The ranks' screen through its own code: a row per rank, the selected
/// one's map among the maps, every map at one scale, Enter opens a rank.
#[test]
fn the_ranks_screen_shows_every_rank_and_their_maps_side_by_side() {
    use crossterm::event::{KeyCode, KeyEvent};
    let mut app = gpumem_top::cli::ranks_app(&rank_files(), false).unwrap();
    let s = common::render_app(&mut app, 120, 40);
    println!("{s}");
    assert!(s.contains("gpumem-top ─ 3 ranks side by side, each replayed alone"), "{s}");
    let row = |s: &str, r: u32| s.lines().find(|l| l.contains(&format!("rank{r}.pickle.gz"))).unwrap_or("").to_string();
    assert!(row(&s, 0).contains("▶    0") && row(&s, 0).contains("2.02 GiB") && row(&s, 0).contains("-31.7%"), "{s}");
    assert!(row(&s, 2).contains("3.90 GiB") && row(&s, 2).contains("+31.8%"), "{s}");
    assert!(s.contains("median peak allocated 2.96 GiB; worst rank 2 at 3.90 GiB (+31.8%)"), "{s}");
    for (r, p) in [(0, "2.02 GiB"), (1, "2.96 GiB"), (2, "3.90 GiB")] {
        assert!(s.contains(&format!("rank {r} ─ at its peak {p}")), "map of rank {r}: {s}");
    }
    // One scale: rank 2 (4.01 GiB reserved at its peak) fills more cells
    // than rank 0 (2.21 GiB).
    let cells = |s: &str, col: std::ops::Range<usize>| {
        s.lines()
            .skip(8)
            .map(|l| l.chars().skip(col.start).take(col.len()).filter(|c| "█▓▒░·".contains(*c)).count())
            .sum::<usize>()
    };
    assert!(cells(&s, 0..40) * 3 < cells(&s, 80..120) * 2, "{s}");
    app.handle_key(KeyEvent::from(KeyCode::Down));
    app.handle_key(KeyEvent::from(KeyCode::Down));
    let s = common::render_app(&mut app, 120, 40);
    assert!(row(&s, 2).contains("▶    2"), "{s}");
    // Enter opens rank 2's file over the ranks' screen, in the one loop's
    // stack of screens (driven here without a terminal); q comes back.
    let mut open = |o| gpumem_top::cli::open_screen(o, false);
    let mut screens = gpumem_top::ui::event::Screens::new(&mut app, &mut open);
    let key = |k| gpumem_top::ui::event::AppEvent::Key(KeyEvent::from(k));
    assert!(screens.handle(key(KeyCode::Enter)) && screens.settle(|_| {}));
    assert_eq!(screens.depth(), 2);
    let r = common::render_screen(screens.top(), 120, 40);
    assert!(r.contains("replay rank2.pickle.gz ─ event 1578/3609"), "at its peak: {r}");
    assert!(screens.handle(key(KeyCode::Char('q'))) && screens.settle(|_| {}));
    assert_eq!(screens.depth(), 1);
    let s = common::render_screen(screens.top(), 120, 40);
    assert!(s.contains("rank2.pickle.gz (exact") && s.contains(" closed"), "{s}");
    assert!(screens.handle(key(KeyCode::Char('q'))));
    assert!(!screens.settle(|_| {}), "q on the ranks' screen ends the loop");
}

/// Enter opens the selected rank's own file, whatever order the files
/// were named in (the screen lists them by rank).
#[test]
fn enter_opens_the_selected_ranks_file_in_any_order() {
    use crossterm::event::{KeyCode, KeyEvent};
    let mut files = rank_files();
    files.rotate_left(1);
    let mut app = gpumem_top::cli::ranks_app(&files, false).unwrap();
    let mut open = |o| gpumem_top::cli::open_screen(o, false);
    let mut screens = gpumem_top::ui::event::Screens::new(&mut app, &mut open);
    let key = |k| gpumem_top::ui::event::AppEvent::Key(KeyEvent::from(k));
    assert!(screens.handle(key(KeyCode::Enter)) && screens.settle(|_| {}));
    let r = common::render_screen(screens.top(), 120, 40);
    assert!(r.contains("replay rank0.pickle.gz"), "the first row is rank 0: {r}");
}

/// A publisher file of rank `rank` of an 8-rank job on GPU `rank`.
fn rank_file(rank: u32, allocated: u64, peak: u64, reserved: u64) -> Value {
    json!({
        "version": 1, "pid": 1000 + rank, "nspid": [1000 + rank], "device": rank, "time": 100.0 + rank as f64,
        "interval": 0.5, "command": "ddp.py", "uuid": format!("GPU-{rank}"),
        "rank": rank, "local_rank": rank, "world_size": 8, "job": "job-7f3a",
        "stats": {"allocated_bytes.all.current": allocated, "reserved_bytes.all.current": reserved,
                  "allocated_bytes.all.peak": peak, "reserved_bytes.all.peak": reserved,
                  "num_ooms": 0, "num_alloc_retries": rank % 2},
        "segments": [{"address": 0x7f0000000000u64, "total_size": reserved, "stream": 0, "segment_type": "large",
                      "is_expandable": false, "blocks": [[allocated, allocated, 0], [reserved - allocated, 0, 2]]}],
    })
}

fn gpu(index: u32, procs: Vec<ProcessSample>) -> GpuSample {
    let used = procs.iter().filter_map(|p| p.used_bytes).sum::<u64>();
    GpuSample {
        index,
        name: Some("NVIDIA H200".into()),
        uuid: Some(format!("GPU-{index}")),
        total_bytes: Some(140 * GIB),
        used_bytes: Some(used),
        free_bytes: Some(140 * GIB - used),
        utilization_percent: Some(90),
        memory_utilization_percent: Some(40),
        processes: procs,
        mig: vec![],
        errors: vec![],
    }
}

/// Eight ranks, one per GPU; rank 5 peaks 50% over the others and rank 6
/// dies. NVML counts each process 700 MiB over what its allocator reserved.
fn eight_ranks(t: f64, with_six: bool) -> Snapshot {
    let mut publishers = Vec::new();
    let mut gpus = Vec::new();
    for r in 0..8u32 {
        let peak = if r == 5 { 15 * GIB } else { 10 * GIB };
        let reserved = peak + GIB;
        let live = r != 6 || with_six;
        let mut v = rank_file(r, 4 * GIB, peak, reserved);
        v["time"] = json!(t);
        if live {
            publishers.push(publisher::parse_bytes(&serde_json::to_vec(&v).unwrap(), Path::new("x.json")).unwrap());
        }
        let procs = if live {
            vec![ProcessSample {
                pid: 1000 + r,
                local_pid: Some(1000 + r),
                command: Some("python3 -u ddp.py".into()),
                used_bytes: Some(reserved + 700 * MIB),
            }]
        } else {
            vec![]
        };
        gpus.push(gpu(r, procs));
    }
    Snapshot { time: t, gpus, publishers, skipped: vec![], gone: if with_six { vec![] } else { vec![1006] } }
}

/// The job screen at 80×24: eight rows (the dead rank's last state marked
/// gone), the median and the worst, the imbalance verdict; Enter shows the
/// rank's own screens; the JSON, the alert and Prometheus say the same.
#[test]
fn a_job_of_eight_ranks_fits_80x24_with_its_median_worst_and_gone_rank() {
    use crossterm::event::{KeyCode, KeyEvent};
    let mut app = LiveApp::new("nvml".into(), None, false);
    app.ingest(eight_ranks(100.0, true));
    app.ingest(eight_ranks(101.0, false));
    // Names everywhere: the GPU list names the process by script and rank.
    let s = common::render_live(&mut app, 160, 50);
    assert!(s.contains("pid    1000 ddp.py rank 0/8"), "{s}");
    assert!(s.contains("outside 700.00 MiB"), "{s}");
    app.handle_key(KeyEvent::from(KeyCode::Char('j')));
    let s = common::render_live(&mut app, 80, 24);
    println!("{s}");
    assert!(s.contains("Job job-7f3a ─ ddp.py ─ 8 of 8 ranks, 1 gone"), "{s}");
    for r in 0..8 {
        let line =
            s.lines().find(|l| l.contains(&format!(" {r}    {}", 1000 + r))).unwrap_or_else(|| panic!("rank {r}: {s}"));
        let peak = if r == 5 { "15.00 GiB" } else { "10.00 GiB" };
        assert!(line.contains(peak) && line.contains("700.00 MiB"), "{line}");
        assert_eq!(line.contains("gone"), r == 6, "{line}");
    }
    assert!(s.contains("median peak 10.00 GiB ─ worst rank 5 at 15.00 GiB (+50.0%) ⚠ imbalance > 20%"), "{s}");
    let rank5 = s.lines().find(|l| l.contains(" 5    1005")).unwrap();
    assert!(rank5.contains("+50.0%"), "{rank5}");
    // The alert, once, naming the worst rank.
    let imb: Vec<_> = app.watch.model.alerts.iter().filter(|a| a.kind.name() == "imbalance").collect();
    assert_eq!(imb.len(), 1);
    assert!(
        imb[0].message().starts_with(
            "job job-7f3a: rank 5 (pid 1005) peaks at 15.00 GiB, 50% over the median rank's 10.00 GiB (threshold 20%)"
        ),
        "{}",
        imb[0].message()
    );
    // The job screen's own keys: its help lists them, and a key of the
    // screen under it says where it belongs.
    app.handle_key(KeyEvent::from(KeyCode::Char('?')));
    let s = common::render_live(&mut app, 100, 40);
    assert!(
        s.contains("the rank's own map and timeline") && s.contains("back to the GPUs and the selected process"),
        "{s}"
    );
    assert!(!s.contains("pick a GPU"), "the live view's keys are not the job screen's: {s}");
    app.handle_key(KeyEvent::from(KeyCode::Char('?')));
    app.handle_key(KeyEvent::from(KeyCode::Char('n')));
    let s = common::render_live(&mut app, 140, 40);
    assert!(
        s.contains(
            "n (the next publishing process on this GPU) is for the live view and a recording, not the job screen"
        ),
        "{s}"
    );
    assert!(s.contains("Job job-7f3a"), "still the job screen: {s}");
    // Enter on rank 3: its own map and timeline.
    for _ in 0..3 {
        app.handle_key(KeyEvent::from(KeyCode::Down));
    }
    app.handle_key(KeyEvent::from(KeyCode::Enter));
    let s = common::render_live(&mut app, 120, 40);
    assert!(s.contains("pid 1003 ddp.py rank 3/8"), "{s}");

    // --json: names, places, memory outside the allocator, the job.
    let snap = eight_ranks(102.0, false);
    let alerts = gpumem_top::monitor::alerts::alerts(&snap, &Default::default());
    let rep: Value = serde_json::to_value(gpumem_top::monitor::report::LiveReport::of(&snap, &alerts, "nvml")).unwrap();
    let p0 = &rep["publishers"][0];
    assert_eq!(p0["name"], "ddp.py rank 0/8");
    assert_eq!(p0["job"], json!({"job": "job-7f3a", "rank": 0, "local_rank": 0, "world_size": 8}));
    assert_eq!(p0["outside_allocator_bytes"], 700 * MIB);
    assert_eq!(rep["jobs"][0]["worst_rank"], 5);
    assert_eq!(rep["jobs"][0]["median_peak_bytes"], 10 * GIB);
    assert_eq!(rep["jobs"][0]["ranks"].as_array().unwrap().len(), 7, "the dead rank has no file in this sample");
    // A looser threshold: no alert.
    let t = gpumem_top::monitor::alerts::Thresholds { imbalance: 0.6, ..Default::default() };
    assert!(gpumem_top::monitor::alerts::alerts(&snap, &t).iter().all(|a| a.kind.name() != "imbalance"));

    // Prometheus: one label set per process in every family.
    let text = gpumem_top::export::prometheus::exposition(&snap, &alerts);
    let labels = r#"gpu="3",pid="1003",command="ddp.py",rank="3",torch_job="job-7f3a""#;
    for family in
        ["gpumem_process_memory_used_bytes", "gpumem_torch_allocated_bytes", "gpumem_process_outside_allocator_bytes"]
    {
        assert!(text.contains(&format!("{family}{{{labels}}}")), "{family}: {text}");
    }
    assert!(text.contains(&format!("gpumem_process_outside_allocator_bytes{{{labels}}} {}", 700 * MIB)));
    assert!(text.contains(r#"gpumem_job_imbalance_ratio{torch_job="job-7f3a",rank="5"} 0.5"#), "{text}");
    assert!(text.contains(r#"gpumem_alert{kind="imbalance",gpu="5",pid="1005"} 1"#), "{text}");
}

fn have_python() -> bool {
    Command::new("python3").arg("--version").output().is_ok_and(|o| o.status.success())
}

/// Three real processes launched as torchrun launches ranks, over the
/// stand-in torch, under `gpumem-top run`: each publishes its rank and job
/// and is named by them; `snapshot --job` asks all three at once; the one
/// that dies shows as gone with its last state; the imbalance is alerted;
/// each rank's recorded peak is what it printed itself.
#[test]
fn ranks_under_run_are_named_grouped_snapshotted_together_and_a_dead_one_is_gone() {
    if !have_python() {
        return;
    }
    let d = common::TmpDir::new("ranks");
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("out")).unwrap();
    let out = Command::new(bin())
        .arg("run")
        .arg("-o")
        .arg(d.join("rec.jsonl"))
        .arg("--publish-dir")
        .arg(d.join("pub"))
        .arg("--interval")
        .arg("100")
        .arg("--")
        .arg("python3")
        .arg(root().join("tests/scripts/fake_job.py"))
        .env("PYTHONPATH", root().join("tests/fake_torch"))
        .env("GPUMEM_TOP_BIN", bin())
        .env("JOB_OUT", d.join("out"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let script: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {err}"));
    assert_eq!(script["codes"], json!([0, 0, 7]));
    // snapshot --job: one request, every rank's file.
    assert_eq!(script["snapshot_rc"], 0, "{}", script["snapshot_err"]);
    let said = script["snapshot_out"].as_str().unwrap();
    for r in 0..3 {
        assert!(d.join(format!("out/job-rank{r}.pickle")).exists(), "{said}");
        assert!(said.contains(&format!("(fake_job.py rank {r}/3)")), "{said}");
    }
    assert!(said.contains("open them side by side with: gpumem-top replay"), "{said}");

    let rec = d.join("rec.jsonl");
    let j: Value = {
        let o = Command::new(bin()).arg("replay").arg(&rec).arg("--json").output().unwrap();
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let job = &j["jobs"][0];
    assert_eq!(job["job"], "fakejob42");
    assert_eq!(job["world_size"], 3);
    let printed: Vec<u64> =
        script["ranks"].as_array().unwrap().iter().map(|r| r["max_memory_allocated"].as_u64().unwrap()).collect();
    for (r, row) in job["ranks"].as_array().unwrap().iter().enumerate() {
        assert_eq!(row["rank"], r);
        assert_eq!(row["name"], format!("fake_job.py rank {r}/3"));
        assert_eq!(row["peak_allocated_bytes"], printed[r], "rank {r}'s peak is what it printed");
    }
    assert_eq!(job["worst_rank"], 2);
    assert_eq!(job["median_peak_bytes"], printed[1]);
    for p in j["processes"].as_array().unwrap() {
        assert!(p["name"].as_str().unwrap().starts_with("fake_job.py rank "), "{p}");
    }
    // While it ran: a sample where rank 2 is gone and the others are not,
    // with the imbalance alerted while all three published.
    let text = std::fs::read_to_string(&rec).unwrap();
    assert!(text.contains("\"kind\":\"imbalance\""), "no imbalance alert recorded");
    let snaps = gpumem_top::cli::read_recording(std::io::BufReader::new(text.as_bytes()), "rec.jsonl").unwrap();
    let pid2 = script["ranks"][2]["pid"].as_u64().unwrap() as u32;
    let has = |s: &Snapshot, pid: u32| s.publishers.iter().any(|p| p.pid == pid);
    let first2 = snaps.iter().position(|s| has(s, pid2)).expect("rank 2 published");
    let at = (first2..snaps.len())
        .find(|&i| !has(&snaps[i], pid2) && snaps[i].publishers.len() == 2)
        .expect("a sample after rank 2 died, before the others ended");
    let mut app = RecordingApp::new("rec.jsonl", snaps, false);
    app.handle_key(crossterm::event::KeyEvent::from(crossterm::event::KeyCode::Home));
    for _ in 0..at {
        app.handle_key(crossterm::event::KeyEvent::from(crossterm::event::KeyCode::Right));
    }
    app.handle_key(crossterm::event::KeyEvent::from(crossterm::event::KeyCode::Char('j')));
    let s = common::render_live(&mut app, 100, 30);
    assert!(s.contains("Job fakejob42 ─ fake_job.py ─ 3 of 3 ranks, 1 gone"), "{s}");
    let row2 = s.lines().find(|l| l.contains(&format!("{pid2}"))).unwrap();
    assert!(row2.contains("310.00 MiB") && row2.contains("gone"), "{row2}");
    let _ = std::fs::remove_dir_all(&d);
}

/// The publisher's job place, from the variables launchers set.
#[test]
fn the_publisher_reads_its_place_in_a_job_from_the_launchers_variables() {
    if !have_python() {
        return;
    }
    let script = r#"
import json, gpumem_top_publish as g
cases = [
    {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "abc"},
    {"RANK": "2", "WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "none"},
    {"RANK": "0", "WORLD_SIZE": "2", "SLURM_JOB_ID": "991", "SLURM_STEP_ID": "3"},
    {"WORLD_SIZE": "2"},
    {"RANK": "x", "WORLD_SIZE": "2"},
    {},
]
print(json.dumps([g.job_info(c, ppid=77) for c in cases]))
"#;
    let out =
        Command::new("python3").arg("-c").arg(script).env("PYTHONPATH", root().join("assets/python")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v,
        json!([
            {"rank": 1, "local_rank": 1, "world_size": 4, "job": "abc"},
            {"rank": 2, "local_rank": 2, "world_size": 4, "job": "ppid 77"},
            {"rank": 0, "local_rank": 0, "world_size": 2, "job": "slurm 991.3"},
            null, null, null
        ])
    );
}

/// A file claiming an impossible place (rank past the world, a job name
/// of 10,000 characters) is read without one, not trusted.
#[test]
fn an_impossible_place_in_a_job_is_not_trusted() {
    for (rank, world, job) in [(8, 8, "j".to_string()), (0, 8, "j".repeat(10_000)), (0, 1 << 21, "j".into())] {
        let mut v = rank_file(0, GIB, GIB, 2 * GIB);
        v["rank"] = json!(rank);
        v["world_size"] = json!(world);
        v["job"] = json!(job);
        let p = publisher::parse_bytes(&serde_json::to_vec(&v).unwrap(), Path::new("x.json")).unwrap();
        assert!(p.job.is_none());
        assert_eq!(p.name(), "ddp.py");
    }
}

/// The jobs recorded on the H200 under `gpumem-top run` (measurements/ranks/
/// h200.sh: 3-rank DDP and 2-rank FSDP2 with gloo on one GPU, batch
/// 4 × (rank + 1)): each rank's recorded peaks are the ones it printed
/// from `torch.cuda.max_memory_allocated()`/`max_memory_reserved()`, to
/// the byte; the job, names and the imbalance alert are as shown live;
/// memory outside the allocator is NVML's figure less reserved.
#[test]
fn jobs_recorded_on_the_h200_hold_each_ranks_own_peaks() {
    for (job, world, id) in [("gloo3", 3, "ppid 579"), ("fsdp2", 2, "8f7de6a2-fb2e-4e7f-b273-73cf2b263eb0")] {
        let dir = fixture(&format!("ranks/h200_live/{job}"));
        let out = Command::new(bin()).arg("replay").arg(dir.join("rec.jsonl.gz")).arg("--json").output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let j: Value = serde_json::from_slice(&out.stdout).unwrap();
        let row = &j["jobs"][0];
        assert_eq!((row["job"].as_str(), row["world_size"].as_u64()), (Some(id), Some(world)), "{job}");
        let mut peaks = Vec::new();
        for r in 0..world as usize {
            let t: Value =
                serde_json::from_str(&std::fs::read_to_string(dir.join(format!("rank{r}.truth.json"))).unwrap())
                    .unwrap();
            let got = &row["ranks"][r];
            assert_eq!(got["name"], format!("live_job.py rank {r}/{world}"));
            assert_eq!(got["peak_allocated_bytes"], t["max_memory_allocated"], "{job} rank {r}");
            assert_eq!(got["peak_reserved_bytes"], t["max_memory_reserved"], "{job} rank {r}");
            peaks.push(t["max_memory_allocated"].as_u64().unwrap());
        }
        let worst = *peaks.iter().max().unwrap();
        assert_eq!(row["worst_peak_bytes"], worst);
        assert_eq!(row["worst_rank"], world - 1);
        // Both jobs are over 20% imbalanced: the alert was raised while they ran.
        let rec = {
            use std::io::Read;
            let mut s = String::new();
            flate2::read::GzDecoder::new(std::fs::File::open(dir.join("rec.jsonl.gz")).unwrap())
                .read_to_string(&mut s)
                .unwrap();
            s
        };
        assert!(rec.contains(&format!("\"message\":\"job {id}: rank {} (pid", world - 1)), "{job}");
        // `gpumem-top --json` taken mid-run: NVML's figure less reserved.
        let live: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("live.json")).unwrap()).unwrap();
        for p in live["publishers"].as_array().unwrap() {
            let (used, res) = (p["nvml_used_bytes"].as_u64().unwrap(), p["reserved_bytes"].as_u64().unwrap());
            assert_eq!(p["outside_allocator_bytes"].as_u64(), Some(used - res));
            assert!(used - res > 256 * MIB, "a CUDA context and more: {p}");
        }
        // The job screen over the recording, at its last sample.
        let snaps = gpumem_top::cli::read_recording(std::io::BufReader::new(rec.as_bytes()), "rec.jsonl").unwrap();
        // Each process's samples are those it published in (#37 item 19:
        // its steps' points are not samples).
        for p in j["processes"].as_array().unwrap() {
            let pid = p["pid"].as_u64().unwrap() as u32;
            let seen = snaps.iter().filter(|s| s.publishers.iter().any(|x| x.pid == pid)).count();
            assert_eq!(p["samples"].as_u64(), Some(seen as u64), "{job} pid {pid}");
            assert!(seen < snaps.len(), "{job}: the ranks start after the recording does");
        }
        let mut app = RecordingApp::new("rec.jsonl", snaps, false);
        app.handle_key(crossterm::event::KeyEvent::from(crossterm::event::KeyCode::Char('j')));
        let s = common::render_live(&mut app, 80, 24);
        println!("{s}");
        assert!(s.contains(&format!("of {world} ranks")), "{s}");
        assert!(s.contains(&format!("worst rank {} at", world - 1)), "{s}");
    }
}

/// Two unrelated `RANK=0 WORLD_SIZE=1` scripts of one parent publish the
/// same job id ("ppid 7"): they are two jobs of one rank each, not one job
/// with rank 0 twice (which raised an imbalance alert that contradicted
/// itself); a third script claiming another world size under that id is a
/// job of its own too.
#[test]
fn processes_claiming_one_rank_of_one_job_are_jobs_of_their_own() {
    let file = |pid: u32, world: u32, peak: u64| {
        let mut v = rank_file(0, GIB, peak, peak + GIB);
        v["pid"] = json!(pid);
        v["nspid"] = json!([pid]);
        v["device"] = json!(0);
        v["job"] = json!("ppid 7");
        v["world_size"] = json!(world);
        publisher::parse_bytes(&serde_json::to_vec(&v).unwrap(), Path::new("x.json")).unwrap()
    };
    let snap = Snapshot {
        time: 100.0,
        gpus: vec![gpu(0, vec![])],
        publishers: vec![file(2001, 1, 4 * GIB), file(2002, 1, 12 * GIB), file(2003, 2, 5 * GIB)],
        skipped: vec![],
        gone: vec![],
    };
    let alerts = gpumem_top::monitor::alerts::alerts(&snap, &Default::default());
    assert!(alerts.iter().all(|a| a.kind.name() != "imbalance"), "{alerts:?}");
    let rep: Value = serde_json::to_value(gpumem_top::monitor::report::LiveReport::of(&snap, &alerts, "nvml")).unwrap();
    let jobs: Vec<(String, Vec<u64>)> = rep["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            let pids = j["ranks"].as_array().unwrap().iter().map(|r| r["pid"].as_u64().unwrap()).collect();
            (j["job"].as_str().unwrap().to_string(), pids)
        })
        .collect();
    assert_eq!(
        jobs,
        vec![
            ("ppid 7 (world 1) #1".to_string(), vec![2001]),
            ("ppid 7 (world 1) #2".to_string(), vec![2002]),
            ("ppid 7 (world 2)".to_string(), vec![2003]),
        ]
    );
}

/// A message on the ranks screen wraps rather than lose its end, at 120
/// and 200 columns alike.
#[test]
fn a_long_message_on_the_ranks_screen_wraps() {
    use gpumem_top::ui::event::Interactive;
    let msg = "rank2.pickle.gz: the replay diverged at event 1234: PyTorch released the 22.00 MiB segment at 0x7fa000000000 (cudaFree) where we would have kept it cached; try --torch 2.13 or see docs/user/replay.md, \"Conditions\", for runs under a limit";
    for w in [120u16, 200] {
        let mut app = gpumem_top::cli::ranks_app(&rank_files(), false).unwrap();
        app.say(msg.to_string());
        let s = common::render_app(&mut app, w, 40);
        let flat: String = s.lines().map(|l| l.trim_matches('"').trim()).collect::<Vec<_>>().join(" ");
        assert!(flat.contains("for runs under a limit"), "{w} columns: the end of the message is lost\n{s}");
        assert!(flat.contains("rank2.pickle.gz: the replay diverged at event 1234"), "{s}");
    }
}
