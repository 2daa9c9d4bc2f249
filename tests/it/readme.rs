//! The README shows what the binary does (#37 items 3 and 22): every
//! screen in it is drawn here through the app's own code and must equal
//! the README's block; every example with output is run through a shell,
//! as a user would type it in a clone, and must print what the README
//! says; every command listed alone must succeed. Blocks are marked
//! `<!-- screen NAME: … -->`, `<!-- output: … -->` or `<!-- commands: … -->`
//! above a fenced `text` block.
//!
//! `GPUMEM_TOP_UPDATE_README=1 cargo test --release --test it readme::`
//! regenerates the screens and outputs in README.md and docs/user/guide.md (the
//! manual, which holds most of them) from the binary.

use crate::common;

use common::{fixture, render_app, replay_app, replay_app_with, root, TmpDir};
use crossterm::event::{KeyCode, KeyEvent};
use gpumem_top::ui::event::Interactive;
use gpumem_top::ui::recording::RecordingApp;

/// A marked block: its kind and name, and the lines between its fences.
struct Block {
    kind: String,
    name: String,
    /// Index of the first line inside the fence and one past the last.
    body: std::ops::Range<usize>,
}

fn blocks(lines: &[&str]) -> Vec<Block> {
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let Some(mark) = l.strip_prefix("<!-- ").and_then(|m| m.strip_suffix(" -->")) else { continue };
        let head = mark.split(':').next().unwrap_or("");
        let mut words = head.split_whitespace();
        let kind = words.next().unwrap_or("").to_string();
        if !["screen", "output", "commands"].contains(&kind.as_str()) {
            continue;
        }
        assert_eq!(lines.get(i + 1), Some(&"```text"), "README line {}: a fenced text block follows {l}", i + 2);
        let end = (i + 2..lines.len()).find(|&j| lines[j] == "```").expect("the block's closing fence");
        out.push(Block { kind, name: words.next().unwrap_or("").to_string(), body: i + 2..end });
    }
    out
}

/// A screen of the README, drawn through the app's own code.
fn screen(name: &str) -> String {
    let (app, w, h): (fn(u16, u16) -> String, u16, u16) = match name {
        // `replay … --at end`, 120×40.
        "cudagraph-end" => (
            |w, h| {
                let (mut app, d) = replay_app("snapshot_kinds/cudagraph_infer_gpt2.pickle.gz");
                app.go(d.events.len() - 1);
                render_app(&mut app, w, h)
            },
            120,
            40,
        ),
        "history-less" => {
            (|w, h| render_app(&mut replay_app("snapshot_kinds/history_less_gpt2.pickle.gz").0, w, h), 120, 30)
        }
        // `replay … --memory-limit 9006592819`, then `o`.
        "llama-oom" => (
            |w, h| {
                let (mut app, _) = replay_app_with("traces/llama_pressure.pickle.gz", Some(9_006_592_819));
                app.handle_key(KeyEvent::from(KeyCode::Char('o')));
                render_app(&mut app, w, h)
            },
            100,
            30,
        ),
        // The H200 job's recording at its last sample where every rank
        // published and NVML listed it, then `j`.
        "job-gloo3" => (job_screen, 80, 24),
        other => panic!("the README names a screen this test does not draw: {other}"),
    };
    app(w, h)
        .lines()
        .map(|l| l.trim_start_matches('"').trim_end_matches('"').trim_end().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

fn job_screen(w: u16, h: u16) -> String {
    use std::io::Read;
    let mut rec = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(fixture("ranks/h200_live/gloo3/rec.jsonl.gz")).unwrap())
        .read_to_string(&mut rec)
        .unwrap();
    let snaps = gpumem_top::cli::read_recording(std::io::BufReader::new(rec.as_bytes()), "rec.jsonl.gz").unwrap();
    let at = snaps.iter().rposition(|s| s.publishers.len() == 3 && s.gpus[0].processes.len() == 3).unwrap();
    let mut app = RecordingApp::new("rec.jsonl.gz", snaps, false);
    let key = |app: &mut RecordingApp, k| app.handle_key(KeyEvent::from(k));
    key(&mut app, KeyCode::Home);
    for _ in 0..at {
        key(&mut app, KeyCode::Right);
    }
    key(&mut app, KeyCode::Char('j'));
    render_app(&mut app, w, h)
}

/// A directory to run examples in, where `tests/` is this repository's
/// (so the README's paths work) and what they write is thrown away.
fn workdir() -> TmpDir {
    let d = TmpDir::new("readme");
    std::os::unix::fs::symlink(root().join("tests"), d.join("tests")).unwrap();
    d
}

/// `cmd` through `sh -c` in `dir`, with the built `gpumem-top` first on
/// PATH: (exit code, stdout).
fn sh(cmd: &str, dir: &std::path::Path) -> (i32, String) {
    let bin = std::path::PathBuf::from(common::bin());
    let path = format!("{}:{}", bin.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .current_dir(dir)
        .env("PATH", path)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// What may differ between two runs: how long a search took.
fn steady(text: &str) -> String {
    text.lines()
        .map(|l| match (l.find(" replayed in "), l.find(" s; ")) {
            (Some(a), Some(b)) if b > a => format!("{} replayed in … s; {}", &l[..a], &l[b + 4..]),
            _ => l.trim_end().to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        .trim_end()
        .to_string()
}

/// The command of an output block (its `$` line and `\` continuations)
/// and the number of lines it takes.
fn command(body: &[&str]) -> (String, usize) {
    let mut cmd = String::new();
    for (k, l) in body.iter().enumerate() {
        let l = if k == 0 { l.strip_prefix("$ ").expect("an output block starts with `$ `") } else { l.trim_start() };
        match l.strip_suffix('\\') {
            Some(more) => cmd.push_str(more),
            None => {
                cmd.push_str(l);
                return (cmd, k + 1);
            }
        }
    }
    panic!("a command that never ends: {body:?}")
}

/// The files whose examples and screens are the binary's: the README and
/// the manual.
const DOCS: [&str; 2] = ["README.md", "docs/user/guide.md"];

#[test]
fn the_readmes_screens_and_examples_are_what_the_binary_prints() {
    let update = std::env::var_os("GPUMEM_TOP_UPDATE_README").is_some();
    let mut failures = Vec::new();
    let (mut screens, mut outputs, mut commands) = (0, 0, 0);
    let dir = workdir();
    for doc in DOCS {
        let path = root().join(doc);
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let mut fresh: Vec<(std::ops::Range<usize>, Vec<String>)> = Vec::new();
        for b in blocks(&lines) {
            let body = &lines[b.body.clone()];
            match b.kind.as_str() {
                "screen" => {
                    screens += 1;
                    let drawn = screen(&b.name);
                    if body.join("\n") != drawn {
                        failures.push(format!("{doc}: screen {}:\n{drawn}", b.name));
                        fresh.push((b.body.clone(), drawn.lines().map(String::from).collect()));
                    }
                }
                "output" => {
                    outputs += 1;
                    let (cmd, n) = command(body);
                    let (_, got) = sh(&cmd, &dir);
                    let shown = body[n..].join("\n");
                    if steady(&shown) != steady(&got) {
                        failures.push(format!("{doc}: `{cmd}` printed:\n{got}"));
                        let mut new: Vec<String> = body[..n].iter().map(|l| l.to_string()).collect();
                        new.extend(got.trim_end().lines().map(|l| l.trim_end().to_string()));
                        fresh.push((b.body.clone(), new));
                    }
                }
                _ => {
                    for l in body {
                        commands += 1;
                        let cmd = l.strip_prefix("$ ").expect("a command block's lines start with `$ `");
                        let (code, out) = sh(cmd, &dir);
                        // Those that print print something; those that write a
                        // file are checked for it below.
                        let writes = cmd.contains("export") && !cmd.contains("-o -");
                        if code != 0 || out.is_empty() != writes {
                            failures.push(format!("{doc}: `{cmd}` exited {code}, printing {} bytes", out.len()));
                        }
                    }
                }
            }
        }
        if update && !fresh.is_empty() {
            let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
            for (range, new) in fresh.into_iter().rev() {
                out.splice(range, new);
            }
            std::fs::write(&path, out.join("\n") + "\n").unwrap();
        }
    }
    // What the commands wrote where the manual says.
    for f in ["events.jsonl", "resnet50.png", "llama_pressure-timeline-3816.png"] {
        if !dir.join(f).is_file() {
            failures.push(format!("no {f} written"));
        }
    }
    assert!(screens >= 4 && outputs >= 6 && commands >= 9, "{screens} screens, {outputs} outputs, {commands} commands");
    if update {
        return;
    }
    assert!(
        failures.is_empty(),
        "the README or the manual differs from the binary (GPUMEM_TOP_UPDATE_README=1 regenerates them):\n{}",
        failures.join("\n\n")
    );
}

/// Every screen-like block in the README and the manual (a frame drawn
/// with box corners) is a marked one, so none can go stale unseen.
#[test]
fn every_screen_in_the_readme_is_checked() {
    for doc in DOCS {
        let text = std::fs::read_to_string(root().join(doc)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let marked: Vec<std::ops::Range<usize>> = blocks(&lines).into_iter().map(|b| b.body).collect();
        for (i, l) in lines.iter().enumerate() {
            if l.starts_with('┌') {
                assert!(marked.iter().any(|r| r.contains(&i)), "{doc} line {}: a screen no test draws", i + 1);
            }
        }
    }
}

/// The guide's figure for what `max_split_size_mb` (the setting PyTorch's
/// OOM message suggests) costs is the example's own: the range of its
/// max_split_size_mb rows in `tune --json` on the run shown under it.
#[test]
fn the_guides_max_split_figure_is_its_examples() {
    let guide = std::fs::read_to_string(common::root().join("docs/user/guide.md")).unwrap();
    let at = guide.find("it makes the peak reserved ").expect("the figure");
    let said: String = guide[at + 27..].chars().take_while(|c| *c != '%').collect();
    let out = std::process::Command::new(common::bin())
        .args([
            "tune",
            common::fixture("tune/mlp_limit.pickle.gz").to_str().unwrap(),
            "--memory-limit",
            "5368709120",
            "--json",
        ])
        .output()
        .unwrap();
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let base = j["recorded"]["reserved_peak_bytes"].as_f64().unwrap();
    let worse: Vec<f64> = j["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| {
            c["alloc_conf"].as_str().unwrap().starts_with("max_split_size_mb:")
                && !c["alloc_conf"].as_str().unwrap().contains(',')
        })
        .map(|c| (c["reserved_peak_bytes"].as_f64().unwrap() / base - 1.0) * 100.0)
        .collect();
    let (lo, hi) = worse.iter().fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
    assert_eq!(said.replace('–', "-"), format!("{lo:.1}-{hi:.1}"), "{worse:?}");
}
