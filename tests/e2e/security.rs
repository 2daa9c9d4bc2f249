//! Another local user must not get code run as us through `fit --batches`,
//! `run` or `attach` (docs/design/security.md). These tests create a second
//! account when they run as root (CI does) and say they are skipped
//! otherwise; what needs no second account is tested either way.

use crate::common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpumem-top"))
}

fn have_python() -> bool {
    Command::new("python3").arg("--version").output().is_ok_and(|o| o.status.success())
}

/// The second account's (uid, gid), made if missing; None (with the reason
/// printed) when we are not root or cannot make it.
fn other_user() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: creating a second account needs root");
        return None;
    }
    let name = "gpumemtop-other";
    let _ =
        Command::new("useradd").args(["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name]).output();
    let id = |flag: &str| -> Option<u32> {
        let o = Command::new("id").args([flag, name]).output().ok()?;
        String::from_utf8_lossy(&o.stdout).trim().parse().ok()
    };
    match (id("-u"), id("-g")) {
        (Some(u), Some(g)) if u != 0 => Some((u, g)),
        _ => {
            eprintln!("skipped: useradd could not create {name}");
            None
        }
    }
}

/// A scratch directory like /tmp: anyone may create entries (sticky).
fn shared_tmp(tag: &str) -> common::TmpDir {
    let d = common::TmpDir::new(&format!("test-sec-{tag}"));
    std::fs::set_permissions(&*d, std::fs::Permissions::from_mode(0o1777)).unwrap();
    d
}

/// Runs `sh -c script` as the other user.
fn as_other(user: (u32, u32), script: &str) -> std::process::Output {
    Command::new("sh").args(["-c", script]).uid(user.0).gid(user.1).output().unwrap()
}

/// The attacker's plant: a directory named as ours would be, world-writable,
/// holding a `torch.py` and a `sitecustomize.py` that leave a marker when
/// imported.
fn plant(user: (u32, u32), dir: &Path, marker: &Path) {
    let code = format!("open({:?}, 'w').write('ran')\n", marker.display().to_string());
    let out = Command::new("sh")
        .args([
            "-c",
            "mkdir -p \"$D\" && printf %s \"$CODE\" > \"$D/torch.py\" && cp \"$D/torch.py\" \"$D/sitecustomize.py\" && chmod -R 777 \"$D\"",
        ])
        .env("D", dir)
        .env("CODE", &code)
        .uid(user.0)
        .gid(user.1)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::metadata(dir).unwrap().uid(), user.0);
}

/// `fit --batches` never imports from a directory another user made: with
/// `$TMPDIR/gpumem-top-<uid>` (our usual place without XDG_RUNTIME_DIR)
/// and the old per-pid names planted, it refuses, names the directory and
/// runs nothing; with a private XDG_RUNTIME_DIR it records from a fresh
/// directory there.
#[test]
fn fit_never_imports_what_another_user_planted() {
    let Some(user) = other_user() else { return };
    if !have_python() {
        return;
    }
    let tmp = shared_tmp("fit");
    let marker = tmp.join("marker");
    plant(user, &tmp.join("gpumem-top-0"), &marker);
    // The names the old code used, for the next pids.
    let me = std::process::id();
    for pid in me..me + 200 {
        plant(user, &tmp.join(format!("gpumem-top-fit-{pid}/hook")), &marker);
    }
    let cmd =
        ["python3", "-c", "import os, sys; print('PYTHONPATH=' + os.environ['PYTHONPATH']); import torch", "{batch}"];
    let out = Command::new(bin())
        .args(["fit", "--batches", "2,4", "--"])
        .args(cmd)
        .env("TMPDIR", &tmp)
        .env("GPUMEM_TOP_DIR", tmp.join("gpumem-top-0"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("{}/gpumem-top-0: belongs to uid {}", tmp.display(), user.0)), "{err}");
    assert!(!err.contains("PYTHONPATH="), "the command ran: {err}");
    assert!(!marker.exists());

    // With a private runtime directory: a fresh hook there, nothing planted
    // imported (the command's `import torch` fails: no snapshot, exit 1).
    let xdg = tmp.join("xdg");
    std::fs::create_dir(&xdg).unwrap();
    std::fs::set_permissions(&xdg, std::fs::Permissions::from_mode(0o700)).unwrap();
    let out = Command::new(bin())
        .args(["fit", "--batches", "2,4", "--"])
        .args(cmd)
        .env("TMPDIR", &tmp)
        .env("XDG_RUNTIME_DIR", &xdg)
        .env_remove("GPUMEM_TOP_DIR")
        .env_remove("PYTHONPATH")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let hook = err.lines().find_map(|l| l.strip_prefix("PYTHONPATH=")).unwrap_or_else(|| panic!("{err}"));
    assert!(hook.starts_with(&format!("{}/gpumem-top/fit-", xdg.display())), "{hook}");
    assert!(!marker.exists(), "a planted module ran");
    assert_eq!(out.status.code(), Some(1), "{err}");
    // Nothing recorded: the fresh directory is gone, hook and all.
    assert!(!Path::new(hook).exists());
    assert_eq!(std::fs::read_dir(xdg.join("gpumem-top")).unwrap().count(), 0, "{err}");
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// `run`'s hook lives in a fresh directory inside our private publish
/// directory: after we exit (while the command's descendants may still start
/// Python with it on their path) the other user cannot create it again.
#[test]
fn runs_hook_cannot_be_recreated_by_another_user() {
    let Some(user) = other_user() else { return };
    if !have_python() {
        return;
    }
    let tmp = shared_tmp("run");
    let publish = tmp.join("pub");
    let out = Command::new(bin())
        .args(["run", "-o"])
        .arg(tmp.join("rec.jsonl"))
        .arg("--publish-dir")
        .arg(&publish)
        .args(["--", "python3", "-c", "import os; print('PYTHONPATH=' + os.environ['PYTHONPATH'])"])
        .env_remove("PYTHONPATH")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let hook = PathBuf::from(text.lines().find_map(|l| l.strip_prefix("PYTHONPATH=")).unwrap());
    assert_eq!(hook.parent(), Some(publish.as_path()));
    assert!(hook.file_name().unwrap().to_string_lossy().starts_with("run-"));
    assert!(!hook.exists(), "removed at exit");
    let m = std::fs::metadata(&publish).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o700));
    let o = as_other(user, &format!("mkdir '{}'", hook.display()));
    assert!(!o.status.success(), "the other user re-created the hook directory");
    assert!(String::from_utf8_lossy(&o.stderr).contains("Permission denied"));
    // A publish directory the other user made is refused, not used.
    let theirs = tmp.join("theirs");
    let marker = tmp.join("marker");
    plant(user, &theirs, &marker);
    let out = Command::new(bin())
        .args(["run", "-o"])
        .arg(tmp.join("rec2.jsonl"))
        .arg("--publish-dir")
        .arg(&theirs)
        .args(["--", "python3", "-c", "import torch"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("belongs to uid {}", user.0)) && err.contains("--publish-dir"), "{err}");
    assert!(!marker.exists() && !tmp.join("rec2.jsonl").exists());
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// `attach` refuses another user's process (root attaching to a user's
/// included) without running its binary, and refuses a publish directory
/// another user made before writing anything the target would execute.
#[test]
fn attach_refuses_other_users_and_their_directories() {
    let Some(user) = other_user() else { return };
    let tmp = shared_tmp("attach");
    // Their process, an executable of theirs named like an interpreter.
    let fake = tmp.join("python3.14");
    std::fs::copy("/bin/sleep", &fake).unwrap();
    std::os::unix::fs::chown(&fake, Some(user.0), Some(user.1)).unwrap();
    let mut theirs = Command::new(&fake).arg("30").uid(user.0).gid(user.1).spawn().unwrap();
    let out = Command::new(bin()).args(["attach", &theirs.id().to_string()]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("runs as uid {}, not as us (uid 0)", user.0)), "{err}");
    let _ = theirs.kill();
    let _ = theirs.wait();

    // Our own process, with the usual directory made by them first.
    let marker = tmp.join("marker");
    plant(user, &tmp.join("gpumem-top-0"), &marker);
    let mut ours = Command::new("sleep").arg("30").spawn().unwrap();
    let out = Command::new(bin())
        .args(["attach", &ours.id().to_string()])
        .env("GPUMEM_TOP_DIR", tmp.join("gpumem-top-0"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("belongs to uid {}", user.0)), "{err}");
    assert!(!tmp.join("gpumem-top-0").read_dir().unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .starts_with("attach")));
    let _ = ours.kill();
    let _ = ours.wait();
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// A program that is not ours to run: attach reads the target's Python
/// version from its mappings or its executable's name, never by running
/// it; a version it cannot find is said plainly.
#[test]
fn attach_never_runs_the_targets_binary() {
    let tmp = shared_tmp("exe");
    let marker = tmp.join("ran");
    // A "python3.14" that would leave a marker if anyone ran it with -I.
    let fake = tmp.join("python3.14");
    std::fs::write(&fake, format!("#!/bin/sh\n[ \"$1\" = -I ] && touch '{}'\nexec sleep 30\n", marker.display()))
        .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Its exe is the shell; `python3.14` lives only in its command line.
    let mut p = Command::new(&fake).spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let out = Command::new(bin()).args(["attach", &p.id().to_string()]).env("XDG_RUNTIME_DIR", &tmp).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(!marker.exists(), "the target's binary was run");
    let _ = p.kill();
    let _ = p.wait();
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// The shared default `/tmp/gpumem-top-UID` made first by someone else (here
/// root, for the second account): `run` neither uses it nor refuses to
/// start; it publishes into a fresh private `$TMPDIR/gpumem-top-UID-…` (as
/// the publisher falls back), says so, and nothing planted is imported.
#[test]
fn a_hijacked_default_directory_neither_runs_code_nor_stops_run() {
    let Some(user) = other_user() else { return };
    if !have_python() {
        return;
    }
    let tmp = shared_tmp("default");
    let default = PathBuf::from(format!("/tmp/gpumem-top-{}", user.0));
    let _ = std::fs::remove_dir_all(&default);
    let marker = tmp.join("marker");
    std::fs::create_dir(&default).unwrap();
    std::fs::write(
        default.join("sitecustomize.py"),
        format!("open({:?}, 'w').write('ran')\n", marker.display().to_string()),
    )
    .unwrap();
    std::fs::set_permissions(&default, std::fs::Permissions::from_mode(0o777)).unwrap();
    let rec = tmp.join("rec.jsonl");
    // The second account runs a copy of the binary: the build directory may
    // sit where it cannot reach (a clone in a 0700 mktemp directory).
    let exe = tmp.join("gpumem-top");
    std::fs::copy(bin(), &exe).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(&exe)
        .args(["run", "-o"])
        .arg(&rec)
        .args(["--", "python3", "-c", "import os; print('PYTHONPATH=' + os.environ['PYTHONPATH'])"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap())
        .env("TMPDIR", &tmp)
        .env("HOME", &tmp)
        .uid(user.0)
        .gid(user.1)
        .output()
        .unwrap();
    let (stdout, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&default);
    assert!(out.status.success(), "{err}");
    assert!(err.contains(&format!("{}: belongs to uid 0", default.display())) && err.contains("instead"), "{err}");
    let hook = stdout.lines().find_map(|l| l.strip_prefix("PYTHONPATH=")).unwrap();
    assert!(hook.starts_with(&format!("{}/gpumem-top-{}-", tmp.display(), user.0)), "{hook}");
    assert!(!marker.exists(), "the planted sitecustomize ran");
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// `s` without `ESC [ digits;… m` colour sequences.
fn strip_sgr(s: &str) -> String {
    let mut out = String::new();
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\u{1b}' && it.peek() == Some(&'[') {
            let rest: String = it.clone().skip(1).take_while(|c| c.is_ascii_digit() || *c == ';').collect();
            if it.clone().nth(1 + rest.len()) == Some('m') {
                for _ in 0..rest.len() + 2 {
                    it.next();
                }
                continue;
            }
        }
        out.push(c);
    }
    out
}

/// What a hostile snapshot's text may try on a terminal: set the title,
/// write the clipboard (OSC 52), clear the screen, start a forged line, and
/// a C1 CSI.
const EVIL: &str = "step\u{1b}]0;pwned\u{7}\u{1b}]52;c;cHduZWQ=\u{7}\u{1b}[2J\nFORGED line\u{9b}31m";

/// A snapshot whose frames, file names and recorded setting carry `EVIL`:
/// one allocation from a call site named so, then an OOM from it.
fn evil_snapshot(name: &str, size: u64, conf: &str) -> common::TmpFile {
    use common::pickler::{entry, frame, segment, snapshot};
    let base = 0x7f00_0000_0000u64;
    let raw = snapshot(
        conf,
        |p| segment(p, base, 20 << 20, false, &[(size, "active_allocated"), ((20 << 20) - size, "inactive")]),
        |p| {
            let frames = |p: &mut common::pickler::Pickler| {
                frame(p, EVIL, &format!("/home/u/{EVIL}.py"), 7);
                frame(p, "main", "/home/u/train.py", 3);
            };
            entry(p, "segment_alloc", base, 20 << 20, 0, |_| {});
            entry(p, "alloc", base, size, 0, frames);
            entry(p, "oom", 0, 1 << 50, 0, frames);
        },
    );
    let p = common::TmpFile::new("security", name);
    std::fs::write(&*p, raw).unwrap();
    p
}

/// Nothing a snapshot holds reaches the terminal as a control character:
/// every text output (replay at the OOM, diff's tables, tune's table and
/// its advice, the text export, the error line) shows them escaped, and no
/// line of output is one the file wrote.
#[test]
fn control_characters_from_a_snapshot_never_reach_the_terminal() {
    let a = evil_snapshot("evil_a.pickle", 2 << 20, "");
    let b = evil_snapshot("evil_b.pickle", 3 << 20, "");
    let c = evil_snapshot("evil_c.pickle", 3 << 20, &format!("max_split_size_mb:64{EVIL}"));
    let (a, b, c) = (a.to_str().unwrap(), b.to_str().unwrap(), c.to_str().unwrap());
    let runs: [&[&str]; 8] = [
        &["replay", a, "--at", "oom"],
        &["replay", a],
        &["diff", a, b],
        &["tune", a],
        &["export", a, "--view", "fragmap", "--format", "txt", "-o", "-"],
        &["replay", a, "--alloc-conf", EVIL],
        &["replay", c],
        &["tune", c],
    ];
    for args in runs {
        let o = Command::new(bin()).args(args).output().unwrap();
        let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        let all = format!("{out}{err}");
        assert!(!all.is_empty(), "{args:?} printed nothing");
        // The text export colours its cells with SGR sequences of its own.
        let all = if args[0] == "export" { strip_sgr(&all) } else { all };
        let bad: Vec<char> = all.chars().filter(|&c| c.is_control() && c != '\n' && c != '\t').collect();
        assert!(bad.is_empty(), "{args:?}: control characters {bad:?} in\n{all}");
        assert!(!all.lines().any(|l| l.starts_with("FORGED")), "{args:?}: a forged line in\n{all}");
    }
    // What it shows is the name, escaped, not nothing.
    let o = Command::new(bin()).args(["replay", a, "--at", "oom"]).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("step\\u001b]0;pwned\\u0007"), "{o:?}");
}
