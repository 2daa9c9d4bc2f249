//! `diff BASE NEW` over pairs of GPT-2 runs recorded on an H200 whose
//! difference is known (measurements/diff/pairs.py; docs/user/diff.md).

use crate::common;

use std::process::{Command, Output};

use common::fixture;
use serde_json::Value;

fn diff(base: &str, new: &str, extra: &[&str]) -> Output {
    Command::new(common::bin())
        .arg("diff")
        .arg(fixture(&format!("diff/{base}.pickle.gz")))
        .arg(fixture(&format!("diff/{new}.pickle.gz")))
        .args(extra)
        .output()
        .unwrap()
}

fn json(base: &str, new: &str) -> Value {
    let o = diff(base, new, &["--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn truth(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(&format!("diff/{name}.truth.json"))).unwrap()).unwrap()
}

/// The figures are each snapshot's own: PyTorch's peaks and what was
/// allocated when it was taken.
fn assert_own_figures(d: &Value, base: &str, new: &str) {
    for (side, name) in [("base", base), ("new", new)] {
        let t = truth(name);
        assert_eq!(d[side]["peak_allocated_bytes"], t["allocated_peak_bytes"], "{name}");
        assert_eq!(d[side]["peak_reserved_bytes"], t["reserved_peak_bytes"], "{name}");
        assert_eq!(d[side]["end_allocated_bytes"], t["allocated_end_bytes"], "{name}");
    }
}

#[test]
fn the_same_script_twice_shows_no_change_and_passes_the_gate() {
    let d = json("base", "same");
    assert_own_figures(&d, "base", "same");
    for k in ["allocated", "reserved", "end_allocated"] {
        assert_eq!(d["peak"][k]["delta"], 0, "{k}");
    }
    assert!(d["at_peak"]["by_call_site"].as_array().unwrap().is_empty(), "{d}");
    assert!(d["at_end"]["by_category"].as_array().unwrap().is_empty(), "{d}");
    assert!(d["requests"].as_array().unwrap().is_empty(), "{d}");
    assert_eq!(d["aligned_share"], 1.0);
    let o = diff("base", "same", &["--fail-on-growth", "0%"]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
}

/// A tensor kept per step at one line (pairs.py's LEAK_LINE, line 52): the
/// end grows by exactly those blocks, named by that line, as temporaries
/// (made after backward, kept by the script); the line is new in the
/// requests; a 0.5% gate fires on the end state and a 1% one does not.
#[test]
fn a_leak_is_named_by_its_line() {
    let d = json("base", "leak");
    assert_own_figures(&d, "base", "leak");
    let end = &d["at_end"]["by_call_site"][0];
    assert_eq!(end["call_site"], "pairs.py:52 run", "{d}");
    assert_eq!((end["base_blocks"].as_u64(), end["blocks"].as_u64()), (Some(0), Some(4)));
    assert_eq!(end["delta_bytes"], d["peak"]["end_allocated"]["delta"], "the whole growth of the end state");
    assert_eq!(d["at_end"]["by_category"][0]["category"], "temporary");
    let line = d["requests"].as_array().unwrap().iter().find(|r| r["call_site"] == "pairs.py:52 run").unwrap();
    assert_eq!((line["change"].as_str(), line["new_allocations"].as_u64()), (Some("new"), Some(4)));
    let o = diff("base", "leak", &["--fail-on-growth", "0.5%"]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("allocated at the end grew +0.8% (1005.44 MiB → 1013.44 MiB), more than 0.5%"), "{err}");
    assert!(!err.contains("peak reserved"), "{err}");
    assert_eq!(diff("base", "leak", &["--fail-on-growth", "0.01"]).status.code(), Some(0));
}

/// A copy of the logits made between forward and backward and kept (the
/// pairs.py script edited to add it, so every line below it moved): the
/// growth is temporaries alone at the peak and at the end (before, the
/// first copy was a parameter and the rest the batch), and the one line
/// named is the new one, though the optimizer's line moved onto its number.
#[test]
fn a_leak_between_forward_and_backward_is_a_temporary_at_its_line() {
    let d = json("base", "leak_fwd");
    assert_own_figures(&d, "base", "leak_fwd");
    for at in ["at_peak", "at_end"] {
        let cats = d[at]["by_category"].as_array().unwrap();
        assert_eq!(cats.len(), 1, "{at}: {d}");
        assert_eq!((cats[0]["category"].as_str(), cats[0]["delta_bytes"].as_u64()), (Some("temporary"), Some(8 << 20)));
        let sites = d[at]["by_call_site"].as_array().unwrap();
        assert_eq!(sites.len(), 1, "{at}: {d}");
        assert_eq!(sites[0]["call_site"], "pairs.py:53 run");
        assert_eq!((sites[0]["base_blocks"].as_u64(), sites[0]["blocks"].as_u64()), (Some(0), Some(4)));
    }
    let reqs = d["requests"].as_array().unwrap();
    assert_eq!(reqs.len(), 1, "{d}");
    assert_eq!((reqs[0]["change"].as_str(), reqs[0]["new_allocations"].as_u64()), (Some("new"), Some(4)));
    // The optimizer's line (53 in the base run) is paired with its new
    // number, not with the copy now at 53.
    let moved = d["moved_call_sites"].as_array().unwrap();
    assert!(moved.iter().any(|m| m["base"] == "pairs.py:53 run" && m["new"] == "pairs.py:57 run"), "{moved:?}");
}

/// Batch 8 → 16: the peak grows by activations first, then temporaries,
/// what the model's forward makes; the weights and Adam state do not
/// change; every line's requests double but none is new.
#[test]
fn a_larger_batch_grows_the_activations() {
    let d = json("base", "batch16");
    assert_own_figures(&d, "base", "batch16");
    let cats = d["at_peak"]["by_category"].as_array().unwrap();
    assert_eq!(cats[0]["category"], "activation", "{d}");
    assert_eq!(cats[1]["category"], "temporary", "{d}");
    assert!(!cats.iter().any(|c| c["category"] == "parameter"), "weights unchanged: {d}");
    let reqs = d["requests"].as_array().unwrap();
    assert!(reqs.iter().all(|r| r["change"] == "grew"), "{d}");
    let o = diff("base", "batch16", &["--fail-on-growth", "5%"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("peak allocated grew +72.8%"));
}

/// Gradient checkpointing and AMP shrink the peak: activations shrink
/// most under checkpointing; the gate stays quiet on both.
#[test]
fn checkpointing_and_amp_shrink_and_pass_the_gate() {
    let d = json("base", "ckpt");
    assert_own_figures(&d, "base", "ckpt");
    let cats = d["at_peak"]["by_category"].as_array().unwrap();
    // Every table is ordered by the size of the change, either sign: the
    // largest shrink leads, not a small growth.
    assert_eq!(cats[0]["category"], "activation", "the largest change first: {d}");
    assert!(cats[0]["delta_bytes"].as_i64().unwrap() < -900 << 20, "{}", cats[0]);
    for at in ["at_peak", "at_end"] {
        for table in ["by_category", "by_call_site"] {
            let sizes: Vec<u64> = d[at][table]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["delta_bytes"].as_i64().unwrap().unsigned_abs())
                .collect();
            assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "{at}.{table}: {sizes:?}");
        }
    }
    assert!(
        d["at_peak"]["by_call_site"][0]["delta_bytes"].as_i64().unwrap() < -500 << 20,
        "{}",
        d["at_peak"]["by_call_site"][0]
    );
    assert!(d["peak"]["allocated"]["delta"].as_i64().unwrap() < -1_000_000_000);
    let d = json("base", "amp");
    assert_own_figures(&d, "base", "amp");
    assert!(d["peak"]["allocated"]["delta"].as_i64().unwrap() < 0);
    for new in ["ckpt", "amp"] {
        assert_eq!(diff("base", new, &["--fail-on-growth", "1%"]).status.code(), Some(0), "{new}");
    }
}

/// A larger vocabulary: the weights and Adam state alive at the end grow
/// (the embedding, tied to the head), named by the line that built the
/// model and the optimizer's step.
#[test]
fn a_larger_vocabulary_grows_weights_and_optimizer_state() {
    let d = json("base", "vocab");
    assert_own_figures(&d, "base", "vocab");
    let cats: Vec<&str> =
        d["at_end"]["by_category"].as_array().unwrap().iter().map(|c| c["category"].as_str().unwrap()).collect();
    assert_eq!(cats, ["optimizer_state", "parameter"], "{d}");
    let sites = d["at_end"]["by_call_site"].as_array().unwrap();
    assert!(sites.iter().any(|s| s["call_site"].as_str().unwrap().starts_with("pairs.py:40 run → ")), "{d}");
    // (50,257 − 100,000) × 768 × 4 bytes more of weights: 145 MiB.
    let p = d["at_end"]["by_category"].as_array().unwrap().iter().find(|c| c["category"] == "parameter").unwrap();
    assert_eq!(p["delta_bytes"].as_i64().unwrap(), 152_010_752);
}

/// Two different programs share almost no call site: said, not listed.
#[test]
fn two_different_programs_are_reported_as_such() {
    let o = Command::new(common::bin())
        .arg("diff")
        .arg(fixture("diff/base.pickle.gz"))
        .arg(fixture("categories/resnet50_sgd_fp16.pickle.gz"))
        .arg("--json")
        .output()
        .unwrap();
    let d: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(d["aligned_share"].as_f64().unwrap() < 0.05, "{d}");
    assert!(d["notes"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().contains("two different programs")));
    assert!(d["requests"].as_array().unwrap().is_empty());
    assert!(d["at_peak"]["by_call_site"].as_array().unwrap().is_empty());
    // The totals and categories are still each run's own.
    assert_eq!(d["base"]["peak_allocated_bytes"], truth("base")["allocated_peak_bytes"]);
}

#[test]
fn bad_input_exits_2_with_one_line() {
    for (args, want) in [
        (vec!["--fail-on-growth", "lots"], "is not a share"),
        (vec!["--fail-on-growth=-3%"], "a share must be 0 or more"),
    ] {
        let o = diff("base", "same", &args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains(want), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let o =
        Command::new(common::bin()).args(["diff", "/nonexistent/a.pickle", "/nonexistent/b.pickle"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
}

/// The diff screen through the app's own `draw`: the figures, both
/// timelines on one axis with the cursor at the new run's peak, the growth
/// by category and by call site; `p` moves the cursor to the base's peak.
#[test]
fn the_diff_screen_shows_both_runs_on_one_axis() {
    use gpumem_top::ui::event::{Command, Interactive};
    use ratatui_core::backend::TestBackend;
    use ratatui_core::terminal::Terminal;
    let mut app =
        gpumem_top::cli::diff_app(&fixture("diff/base.pickle.gz"), &fixture("diff/batch16.pickle.gz"), false).unwrap();
    let draw = |app: &mut gpumem_top::ui::diff::DiffApp| {
        let mut t = Terminal::new(TestBackend::new(140, 40)).unwrap();
        t.draw(|f| app.draw(f)).unwrap();
        t.backend().to_string()
    };
    let s = draw(&mut app);
    assert!(s.contains("gpumem-top ─ diff base.pickle.gz → batch16.pickle.gz"), "{s}");
    assert!(s.contains("│ peak allocated        3.61 GiB    6.23 GiB  +2.6G (+72.8%)"), "{s}");
    assert!(s.contains("Allocated ─ both runs, iterations aligned (5 on the axis)"), "{s}");
    // At the new run's peak (iteration 2, as both runs' peaks are).
    let cursor = |s: &str| s.lines().find(|l| l.contains("cursor: iteration")).unwrap_or("").to_string();
    assert!(cursor(&s).contains("new 6.23 GiB"), "{s}");
    assert!(s.contains("+1.4G      1.4G → 2.8G     activations"), "{s}");
    assert!(s.contains("p/P peaks"), "{s}");
    app.dispatch(Command::Peak);
    let s = draw(&mut app);
    assert!(cursor(&s).contains("base 3.61 GiB"), "{s}");
    // Home and End are the axis's ends, numbered as the title counts.
    app.dispatch(Command::Home);
    assert!(cursor(&draw(&mut app)).contains("cursor: iteration 1 of 5, 0% through"));
    app.dispatch(Command::End);
    assert!(cursor(&draw(&mut app)).contains("cursor: iteration 5 of 5, 100% through"));
    // Without colour (this app is drawn without), the base is dotted and
    // the key says which stroke is which.
    assert!(s.contains("┄ base ━ new"), "{s}");
    app.dispatch(Command::Help);
    assert!(draw(&mut app).contains("iteration k of one is over iteration k of the other"));
    app.dispatch(Command::Back);
    assert!(!app.quit() && !draw(&mut app).contains("iteration k of one"));
    // A key of another screen says where it belongs.
    app.dispatch(Command::Compact);
    assert!(draw(&mut app).contains("is for replay"), "the status line names the screens `c` is for");
    // `s` writes both timelines as SVG here, as in every other screen.
    app.dispatch(Command::Screenshot);
    let s = draw(&mut app);
    let name = s
        .lines()
        .find_map(|l| l.split(" wrote ").nth(1))
        .and_then(|r| r.split(|c: char| c.is_whitespace() || c == '│').next())
        .unwrap_or_else(|| panic!("{s}"))
        .to_string();
    let svg = std::fs::read_to_string(&name).unwrap();
    let _ = std::fs::remove_file(&name);
    assert!(name.starts_with("gpumem-top-base-vs-batch16-timeline-diff-"), "{name}");
    assert_eq!(svg.matches("<polyline").count(), 2);
    assert!(svg.contains("peak allocated 3.61 GiB → 6.23 GiB"));
}

/// `--export` writes both timelines on one axis for reports: SVG (or PNG by
/// the name), each run a line, its peak labelled; an existing file is
/// refused without --force.
#[test]
fn the_overlay_exports_for_reports() {
    let dir = std::env::temp_dir().join(format!("gpumem-diff-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("overlay.svg");
    let _ = std::fs::remove_file(&svg);
    let o = diff("base", "batch16", &["--export", svg.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(text.matches("<polyline").count(), 2);
    assert!(text.contains("new peak 6.23 GiB") && text.contains("base peak 3.61 GiB"), "{text}");
    assert!(text.contains("peak allocated 3.61 GiB → 6.23 GiB"));
    let again = diff("base", "batch16", &["--export", svg.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(2));
    let png = dir.join("overlay.png");
    let _ = std::fs::remove_file(&png);
    assert!(diff("base", "batch16", &["--export", png.to_str().unwrap()]).status.success());
    assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Two recordings of `run` (GPT-2 on the H200, one under checkpointing):
/// each run's figures are its training process's own, as `replay
/// RECORDING --json` gives them; a snapshot and a recording together are
/// refused.
#[test]
fn two_recordings_compare_their_processes() {
    let (a, b) = (fixture("live/reset_peaks_gpt2.jsonl"), fixture("live/checkpointed_history_gpt2.jsonl"));
    let o = Command::new(common::bin()).arg("diff").arg(&a).arg(&b).arg("--json").output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let d: Value = serde_json::from_slice(&o.stdout).unwrap();
    for (side, path) in [("base", &a), ("new", &b)] {
        let r = Command::new(common::bin()).arg("replay").arg(path).arg("--json").output().unwrap();
        let r: Value = serde_json::from_slice(&r.stdout).unwrap();
        let p = &r["processes"][0];
        assert_eq!(d[side]["peak_allocated_bytes"], p["peak_allocated_bytes"], "{side}");
        assert_eq!(d[side]["peak_reserved_bytes"], p["peak_reserved_bytes"], "{side}");
        assert_eq!(d[side]["fidelity"], "recording");
    }
    assert_eq!(d["peak"]["allocated"]["delta"], 2_890_449_920i64 - 8_690_289_664i64, "{d}");
    assert!(d["notes"][0].as_str().unwrap().starts_with("two recordings"));
    let o = Command::new(common::bin()).arg("diff").arg(&a).arg(fixture("diff/base.pickle.gz")).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not one of each"));
}

/// A snapshot without history has no peaks or requests: its state stands
/// for both, and a note says so; the figures are still the snapshot's own.
#[test]
fn a_snapshot_without_history_is_compared_by_its_state() {
    let state = fixture("snapshot_kinds/history_less_gpt2.pickle.gz");
    let o = Command::new(common::bin())
        .arg("diff")
        .arg(fixture("diff/base.pickle.gz"))
        .arg(&state)
        .arg("--json")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let d: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(d["new"]["fidelity"], "state-only");
    let r = Command::new(common::bin()).arg("replay").arg(&state).arg("--json").output().unwrap();
    let r: Value = serde_json::from_slice(&r.stdout).unwrap();
    assert_eq!(d["new"]["end_allocated_bytes"], r["recorded_totals"]["allocated_bytes"]);
    assert_eq!(d["new"]["peak_reserved_bytes"], r["recorded_totals"]["reserved_bytes"]);
    let notes: Vec<&str> = d["notes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert!(
        notes.iter().any(|n| n.starts_with("history_less_gpt2.pickle.gz is a snapshot without memory history")),
        "{notes:?}"
    );
    assert!(!notes.iter().any(|n| n.contains("two different programs")), "{notes:?}");
}

/// The overlay of two runs of 100,000 iterations draws what its width can
/// show: iteration lines and labels thinned to one every 60 px (it drew
/// every one: a 16.8 MB SVG; a PNG of 300,000 took 64 s and 2.9 GB).
#[test]
fn the_overlay_of_long_runs_is_thinned_to_its_width() {
    let d = common::TmpDir::new("diffexport");
    std::fs::create_dir_all(&d).unwrap();
    let a = d.join("a.pickle");
    std::fs::write(&a, common::pickler::iterations_snapshot(100_000, |_| 2 << 20)).unwrap();
    let (svg, png) = (d.join("o.svg"), d.join("o.png"));
    let t = std::time::Instant::now();
    let o = Command::new(common::bin())
        .args(["diff", a.to_str().unwrap(), a.to_str().unwrap(), "--json", "--export", svg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    // The last marker follows the last event, so it ends no iteration.
    assert_eq!(j["base"]["iterations"], 99_999, "{j}");
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.len() < 200 << 10, "{} bytes", text.len());
    let lines = text.matches("<line").count();
    assert!((10..100).contains(&lines), "{lines} lines");
    assert!(text.contains(">100000<") || text.contains(">50000<"), "the axis reaches the last iterations");
    let o = Command::new(common::bin())
        .args(["diff", a.to_str().unwrap(), a.to_str().unwrap(), "--export", png.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG"));
    // The timeline picture of one run marks its iterations as thinly.
    let o = Command::new(common::bin())
        .args(["export", a.to_str().unwrap(), "--view", "timeline", "--format", "svg", "-o", "-"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let marks = String::from_utf8_lossy(&o.stdout).matches("stroke-dasharray=\"2 4\"").count();
    assert!((100..2000).contains(&marks), "{marks} iteration marks");
    assert!(t.elapsed() < std::time::Duration::from_secs(20), "{:?}", t.elapsed());
}

/// `--fail-on-growth 5` would be 500%, a gate that never fires: a bare
/// number of 1 or more is refused with what was meant; `5%` and `0.05` are
/// the same gate.
#[test]
fn a_bare_growth_of_one_or_more_is_refused() {
    let o = diff("base", "batch16", &["--fail-on-growth", "5"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("did you mean 5%?"), "{err}");
    let (a, b) =
        (diff("base", "batch16", &["--fail-on-growth", "5%"]), diff("base", "batch16", &["--fail-on-growth", "0.05"]));
    assert_eq!(a.status.code(), b.status.code());
    assert_eq!(a.stdout, b.stdout);
    assert!(diff("base", "batch16", &["--fail-on-growth", "150%"]).status.code().is_some_and(|c| c <= 1));
}

/// One training script edited between two runs on the H200
/// (measurements/diff/edited.py): 21 lines added near the top of its training
/// function move every call site below them, and one new line keeps the
/// last logits each step. Matched across the edit by file, function and
/// library frames, the only change left is that line.
#[test]
fn an_edited_script_is_compared_line_for_line_across_the_edit() {
    let d = json("edit_a", "edit_b");
    assert_own_figures(&d, "edit_a", "edit_b");
    assert!(d["aligned_share"].as_f64().unwrap() > 0.99, "{}", d["aligned_share"]);
    let line = |l: &str| -> i64 { l.split(':').nth(1).unwrap().split(' ').next().unwrap().parse().unwrap() };
    let moved = d["moved_call_sites"].as_array().unwrap();
    assert!(moved.len() >= 20, "{moved:?}");
    for m in moved {
        let (b, n) = (m["base"].as_str().unwrap(), m["new"].as_str().unwrap());
        // Lines above the new one moved by 21, those below it by 22.
        assert!([21, 22].contains(&(line(n) - line(b))), "{b} → {n}");
        assert_eq!(b.split_once(' ').unwrap().1, n.split_once(' ').unwrap().1, "the same function and library frames");
    }
    let reqs = d["requests"].as_array().unwrap();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    assert_eq!(
        (reqs[0]["call_site"].as_str().unwrap(), reqs[0]["change"].as_str().unwrap()),
        ("train.py:38 train", "new")
    );
    let end = d["at_end"]["by_call_site"].as_array().unwrap();
    assert_eq!(end.len(), 1, "{end:?}");
    assert_eq!(end[0]["call_site"], "train.py:38 train");
    assert_eq!(end[0]["delta_bytes"], d["peak"]["end_allocated"]["delta"]);
    let o = diff("edit_a", "edit_b", &[]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("the script was edited between the runs: ") && text.contains("train.py:14 train now at line 35"),
        "{text}"
    );
    assert!(!text.contains("two different programs"), "{text}");
}

/// At 80x24 the diff screen is read as it is at 140x40: category rows keep
/// their names and call sites their lines (the bytes on both sides give
/// way), the title gives way to the key, and figures are never cut.
#[test]
fn the_diff_screen_reads_at_80x24() {
    use gpumem_top::ui::event::Interactive;
    use ratatui_core::backend::TestBackend;
    use ratatui_core::terminal::Terminal;
    let app =
        gpumem_top::cli::diff_app(&fixture("diff/base.pickle.gz"), &fixture("diff/batch16.pickle.gz"), false).unwrap();
    let mut t = Terminal::new(TestBackend::new(80, 24)).unwrap();
    t.draw(|f| app.draw(f)).unwrap();
    let s = t.backend().to_string();
    assert!(s.contains("│   +1.4G activations") && s.contains("│   +1.2G temporaries"), "{s}");
    assert!(s.contains("+576M pairs.py:49 run → activations.py:66 f"), "{s}");
    assert!(s.contains("┌ Allocated, 5 iterations aligned ─") && s.contains("0–6.2G ─ ┄ base ━ new ┐"), "{s}");
    assert!(s.contains("─ new 6.23 GiB "), "the cursor's figures whole: {s}");
    assert!(s.contains("│ retries / OOMs           0 / 0       0 / 0"), "{s}");
}
