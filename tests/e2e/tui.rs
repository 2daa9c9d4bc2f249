//! End to end: the real binary in a terminal (a tmux pane), driven by keys,
//! with the screen read back after each one, and the terminal checked after
//! it exits.

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::fixture;

struct Pane {
    name: String,
}

impl Pane {
    fn start(cmd: &str, w: u16, h: u16) -> Pane {
        // Unique per pane: tests run in parallel threads of one process.
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("gpumem-top-test-{}-{w}-{n}", std::process::id());
        // Sessions started in parallel can race the tmux server's own start
        // ("server exited unexpectedly"): try again briefly.
        let mut err = String::new();
        for _ in 0..10 {
            // Run in the temporary directory: screenshots land there.
            let dir = std::env::temp_dir();
            let out = Command::new("tmux")
                .args(["new-session", "-d", "-s", &name, "-c"])
                .arg(&dir)
                .args(["-x", &w.to_string(), "-y", &h.to_string(), cmd])
                .output()
                .expect("tmux is part of the machine image; .ci/run installs it where missing");
            if out.status.success() {
                return Pane { name };
            }
            err = String::from_utf8_lossy(&out.stderr).to_string();
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("tmux new-session: {err}");
    }

    fn screen(&self) -> String {
        let out = Command::new("tmux").args(["capture-pane", "-p", "-t", &self.name]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// Waits until the screen shows `text`; returns the screen.
    fn wait_for(&self, text: &str) -> String {
        let start = Instant::now();
        loop {
            let s = self.screen();
            if s.contains(text) {
                return s;
            }
            assert!(start.elapsed() < Duration::from_secs(20), "waited for {text:?}; the screen is:\n{s}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the screen no longer shows `text`.
    fn wait_gone(&self, text: &str) {
        let start = Instant::now();
        while self.screen().contains(text) {
            assert!(start.elapsed() < Duration::from_secs(10), "{text:?} stays on screen");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", &self.name];
        args.extend_from_slice(keys);
        assert!(Command::new("tmux").args(&args).status().unwrap().success());
    }
}

impl Drop for Pane {
    fn drop(&mut self) {
        let _ = Command::new("tmux").args(["kill-session", "-t", &self.name]).status();
    }
}

#[test]
fn keys_drive_the_replay_and_the_terminal_is_restored() {
    let bin = env!("CARGO_BIN_EXE_gpumem-top");
    let trace = fixture("traces/llama_pressure.pickle.gz");
    let cmd = format!(
        "'{bin}' replay '{}' --memory-limit 9006592819; echo EXITED rc=$?; stty -a | grep -oE '(-)?icanon( |$)'; sleep 60",
        trace.display()
    );
    let p = Pane::start(&cmd, 120, 34);
    // It opens at the peak.
    let s = p.wait_for("event 3815/4547");
    assert!(s.contains("Fragmentation map ─ 202 segments ─ by address"), "{s}");
    assert!(s.contains("reserved but unallocated 423.02 MiB"), "{s}");

    p.keys(&["o"]);
    let s = p.wait_for("OOM at event 3816");
    assert!(s.contains("event 3816/4547"), "{s}");
    p.keys(&["Right", "Right"]);
    p.wait_for("event 3818/4547");
    p.keys(&["Left"]);
    p.wait_for("event 3817/4547");
    p.keys(&["PgUp"]);
    // A twentieth back lands on event 3590, a segment_alloc whose alloc
    // replays with it: the screen shows (and says) the state after 3591.
    p.wait_for(&format!("event {}/4547", 3817 - 4547 / 20 + 1));
    p.keys(&["p"]);
    p.wait_for("peak: event 3815");
    p.keys(&["a"]);
    p.wait_for("by size");
    // The largest segment's blocks, then back; then the compact map.
    p.keys(&["Enter"]);
    let s = p.wait_for("call stack of the block at +0B");
    assert!(s.contains("segment 0x7fc71c000000: 126.00 MiB large pool, stream 0"), "{s}");
    p.keys(&["Down"]);
    p.wait_for("call stack of the block at +42.6M");
    p.keys(&["Escape"]);
    p.wait_gone("call stack of the block");
    p.wait_for("202 segments ─ by size");
    p.keys(&["c"]);
    p.wait_for("1 cell = ");
    p.keys(&["c"]);
    // A screenshot of the fragmentation map, written where the program runs.
    p.keys(&["s"]);
    let s = p.wait_for("wrote gpumem-top-llama_pressure-fragmap-event3815-");
    let name = s.split("wrote ").nth(1).and_then(|r| r.split_whitespace().next()).unwrap().to_string();
    let shot = std::env::temp_dir().join(&name);
    let svg = std::fs::read_to_string(&shot).unwrap_or_else(|e| panic!("{}: {e}", shot.display()));
    assert!(svg.starts_with("<svg") && svg.contains("llama_pressure.pickle.gz · event 3815 of 4547 (peak)"));
    let _ = std::fs::remove_file(&shot);
    p.keys(&["Tab", "?"]);
    let s = p.wait_for("jump to the peak");
    assert!(s.contains("┌ help"), "{s}");
    p.keys(&["q"]);
    p.wait_gone("jump to the peak");
    p.keys(&["q"]);
    let s = p.wait_for("EXITED rc=0");
    // The alternate screen is gone and the terminal is back in canonical mode.
    assert!(!s.contains("Fragmentation map"), "{s}");
    let s = p.wait_for("icanon");
    assert!(!s.contains("-icanon"), "raw mode left on:\n{s}");
}

#[test]
fn ctrl_c_quits_and_a_small_terminal_gets_a_message() {
    let bin = env!("CARGO_BIN_EXE_gpumem-top");
    let trace = fixture("traces/gpt2_train.pickle.gz");
    let cmd = format!("'{bin}' replay '{}'; echo EXITED rc=$?; sleep 60", trace.display());
    let p = Pane::start(&cmd, 70, 20);
    p.wait_for("gpumem-top needs a terminal of at least 80x24; this one is 70x20.");
    p.keys(&["C-c"]);
    p.wait_for("EXITED rc=0");
}

/// SIGTERM (what `kill`, systemd and tmux send) restores the terminal too;
/// the demo runs in real time, so this also checks it keeps drawing.
#[test]
fn sigterm_restores_the_terminal() {
    let bin = env!("CARGO_BIN_EXE_gpumem-top");
    let dir = std::env::temp_dir().join(format!("gpumem-top-sigterm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pidfile = dir.join("pid");
    let cmd = format!(
        "sh -c 'echo $$ > {}; exec {bin} demo'; echo EXITED rc=$?; stty -a | grep -oE '(-)?icanon( |$)'; sleep 60",
        pidfile.display()
    );
    let p = Pane::start(&cmd, 110, 32);
    p.wait_for("demo: simulated device");
    // The workload advances on its own: the iteration count moves.
    let first = p.wait_for("Timeline");
    let start = Instant::now();
    while p.screen() == first {
        assert!(start.elapsed() < Duration::from_secs(10), "the demo does not advance");
        std::thread::sleep(Duration::from_millis(50));
    }
    // `s` in the running demo writes its fragmentation map.
    p.keys(&["s"]);
    let s = p.wait_for("wrote gpumem-top-gpt2-fragmap-iteration");
    let name = s.split("wrote ").nth(1).and_then(|r| r.split_whitespace().next()).unwrap().to_string();
    let shot = std::env::temp_dir().join(&name);
    let svg = std::fs::read_to_string(&shot).unwrap_or_else(|e| panic!("{}: {e}", shot.display()));
    assert!(svg.contains("Fragmentation map ─ demo: synthetic GPT-2 training loop · iteration"), "{}", &svg[..400]);
    let _ = std::fs::remove_file(&shot);
    let pid = std::fs::read_to_string(&pidfile).unwrap().trim().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let s = p.wait_for("EXITED rc=0");
    assert!(!s.contains("Timeline"), "{s}");
    let s = p.wait_for("icanon");
    assert!(!s.contains("-icanon"), "raw mode left on:\n{s}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A terminal that goes away (tmux or ssh closed) ends the program instead of
/// leaving it spinning on end-of-file, as crossterm's default input source did.
#[test]
fn a_closed_terminal_ends_the_program() {
    let bin = env!("CARGO_BIN_EXE_gpumem-top");
    let trace = fixture("traces/llama_pressure.pickle.gz");
    let dir = std::env::temp_dir().join(format!("gpumem-top-hangup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pidfile = dir.join("pid");
    let cmd = format!("sh -c 'echo $$ > {}; exec {bin} replay {}'", pidfile.display(), trace.display());
    let p = Pane::start(&cmd, 100, 30);
    p.wait_for("event 3815/4547");
    let pid = std::fs::read_to_string(&pidfile).unwrap().trim().to_string();
    drop(p);
    let proc_dir = std::path::PathBuf::from(format!("/proc/{pid}"));
    let start = Instant::now();
    while proc_dir.exists() {
        assert!(start.elapsed() < Duration::from_secs(10), "gpumem-top (pid {pid}) outlived its terminal");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The live view redraws when the sampler sends a sample (it wakes the UI
/// through a socket pair; its own timer is 5 s): at `--interval 100` the
/// timeline gains samples several times a second.
#[test]
fn the_live_view_redraws_as_samples_arrive() {
    let bin = env!("CARGO_BIN_EXE_gpumem-top");
    let p = Pane::start(&format!("{bin} live --source demo --interval 100"), 160, 45);
    // The live timeline's x axis is time: its footer says how long it
    // covers and how many optimizer steps it shows.
    let covered = |s: &str| -> (f64, usize) {
        let at = s.find("─── now (+").unwrap_or_else(|| panic!("no timeline footer:\n{s}"));
        let rest = &s[at + "─── now (+".len()..];
        let secs: f64 = rest.split(' ').next().unwrap().parse().unwrap();
        let st = rest.find("╵ ").unwrap();
        let steps = rest[st + "╵ ".len()..].split(' ').next().unwrap().parse().unwrap();
        (secs, steps)
    };
    let first = covered(&p.wait_for("s) ─ allocated"));
    std::thread::sleep(Duration::from_millis(2500));
    let later = covered(&p.screen());
    assert!(later.0 >= first.0 + 2.0 && later.1 > first.1, "{first:?}, then {later:?} 2.5 s later");
    p.keys(&["q"]);
}

/// The screen follows the terminal's size: the size is asked again only
/// after SIGWINCH, so a resize must still redraw at the new size.
#[test]
fn a_resized_terminal_is_redrawn_at_its_new_size() {
    let bin = env!("CARGO_BIN_EXE_gpumem-top");
    let trace = fixture("traces/llama_pressure.pickle.gz");
    let p = Pane::start(&format!("'{bin}' replay '{}'", trace.display()), 100, 30);
    p.wait_for("event 3815/4547");
    let width = |s: &str| s.lines().map(|l| l.chars().count()).max().unwrap_or(0);
    let rows = |s: &str| s.lines().filter(|l| !l.trim().is_empty()).count();
    let s = p.screen();
    assert_eq!((width(&s), rows(&s) <= 30), (100, true), "{s}");
    assert!(Command::new("tmux")
        .args(["resize-window", "-t", &p.name, "-x", "160", "-y", "45"])
        .status()
        .unwrap()
        .success());
    let start = Instant::now();
    loop {
        let s = p.screen();
        // The border reaches the new right edge and the status line the new bottom.
        let top = s.lines().find(|l| l.contains("gpumem-top ─")).unwrap_or("");
        if top.chars().count() == 160 && top.ends_with('┐') && rows(&s) > 40 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "not redrawn at 160x45:\n{s}");
        std::thread::sleep(Duration::from_millis(50));
    }
    p.keys(&["q"]);
}

/// The snapshots users bring open like any trace: a history-less snapshot
/// as its state, a CUDA-graph trace with its private-pool segments marked.
#[test]
fn field_snapshots_open_in_the_tui() {
    let bin = env!("CARGO_BIN_EXE_gpumem-top");
    let trace = fixture("snapshot_kinds/history_less_gpt2.pickle.gz");
    let cmd = format!("'{bin}' replay '{}'; echo EXITED rc=$?; sleep 60", trace.display());
    let p = Pane::start(&cmd, 160, 50);
    // The last text drawn, so that the capture is not of a half-drawn frame.
    let s = p.wait_for("no timeline: the snapshot was taken without memory history");
    assert!(s.contains("state only: no trace in this snapshot"), "{s}");
    assert!(s.contains("Fragmentation map ─ 139 segments"), "{s}");
    assert!(s.contains("3.92 GiB"), "reserved is the snapshot's: {s}");
    p.keys(&["Right", "End", "p"]);
    p.keys(&["q"]);
    p.wait_for("EXITED rc=0");

    let trace = fixture("snapshot_kinds/cudagraph_infer_gpt2.pickle.gz");
    let cmd = format!("'{bin}' replay '{}' --at end; echo EXITED rc=$?; sleep 60", trace.display());
    let p = Pane::start(&cmd, 160, 50);
    let s = p.wait_for("Fragmentation map ─ 25 segments ─ by address ─ to scale ─ 2 in private pools (*)");
    assert!(s.contains("event 3037/3038"), "{s}");
    p.keys(&["a"]);
    p.wait_for("by size");
    p.keys(&["Enter"]);
    p.wait_for("Enter/Esc back");
    p.keys(&["Escape"]);
    p.wait_gone("Enter/Esc back");
    p.keys(&["q"]);
    p.wait_for("EXITED rc=0");
}

impl Pane {
    /// tmux's view of the terminal: (alternate screen on, cursor visible).
    fn modes(&self) -> (bool, bool) {
        let out = Command::new("tmux")
            .args(["display-message", "-p", "-t", &self.name, "#{alternate_on} #{cursor_flag}"])
            .output()
            .unwrap();
        let s = String::from_utf8_lossy(&out.stdout).to_string();
        let mut it = s.split_whitespace();
        (it.next() == Some("1"), it.next() == Some("1"))
    }
}

/// After `q`, SIGINT or SIGQUIT from outside, the alternate screen is off
/// and the cursor is visible again.
#[test]
fn every_way_out_restores_the_terminal() {
    let bin = env!("CARGO_BIN_EXE_gpumem-top");
    let trace = fixture("snapshot_kinds/mempools.pickle.gz");
    for (i, how) in ["q", "INT", "QUIT", "TERM"].into_iter().enumerate() {
        let pidfile = std::env::temp_dir().join(format!("gpumem-top-tui-pid-{}-{i}", std::process::id()));
        let _ = std::fs::remove_file(&pidfile);
        let cmd = format!(
            "sh -c 'echo $$ > {}; exec {bin} replay {}'; echo EXITED; sleep 60",
            pidfile.display(),
            trace.display()
        );
        let p = Pane::start(&cmd, 120, 40);
        // The map's title (shortened to "Map ─" where the pane is narrow).
        p.wait_for("Map ─ 20 segments ─ by address");
        assert_eq!(p.modes(), (true, false), "full screen, cursor hidden");
        if how == "q" {
            p.keys(&["q"]);
        } else {
            let pid = std::fs::read_to_string(&pidfile).unwrap();
            assert!(Command::new("kill").args([&format!("-{how}"), pid.trim()]).status().unwrap().success());
        }
        p.wait_for("EXITED");
        assert_eq!(p.modes(), (false, true), "after {how}: the alternate screen is off and the cursor shown");
        let _ = std::fs::remove_file(&pidfile);
    }
}

/// In the real binary's loop: the demo paused with `space` steps back with
/// Home and →, and `space` resumes the running loop.
#[test]
fn the_paused_demo_steps_back_in_a_terminal() {
    let bin = env!("CARGO_BIN_EXE_gpumem-top");
    let p = Pane::start(&format!("'{bin}' demo; echo EXITED rc=$?; sleep 60"), 140, 40);
    // Something has run: the timeline has a peak.
    p.wait_for("Timeline ─ allocated / reserved ─ peak");
    p.keys(&["Space"]);
    p.wait_for("step back through what has run");
    p.keys(&["Home"]);
    // The first whole state: the demo's first malloc is a segment_alloc
    // (event 0) and its alloc (event 1), which show one state.
    p.wait_for("paused: event 1 of the last");
    p.keys(&["Right"]);
    p.wait_gone("paused: event 1 of the last");
    p.wait_for("paused: event ");
    p.keys(&["End", "Space"]);
    p.wait_for(" running");
    p.keys(&["q"]);
    p.wait_for("EXITED rc=0");
}
