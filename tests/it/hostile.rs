//! Hostile and broken inputs: each ends with exit code 2 and one line on
//! stderr naming the file and the position, with no panic, nothing executed
//! and bounded memory. Plus fuzzing of the decoder over random bytes and
//! mutated real snapshots.

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::fixture;
use gpumem_top::trace;
use proptest::prelude::*;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpumem-top"))
}

/// `bytes` in a file `name` of its own directory, removed at the test's end.
fn scratch(name: &str, bytes: &[u8]) -> common::TmpFile {
    let p = common::TmpFile::new("hostile", name);
    std::fs::File::create(&*p).unwrap().write_all(bytes).unwrap();
    p
}

/// Runs `replay FILE --json`, with the address space capped so that a
/// decoder that tried to honour a lying length would fail, and returns the
/// single stderr line.
fn rejects(path: &Path, expect: &[&str]) -> String {
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("ulimit -v 1048576; exec '{}' replay '{}' --json", bin().display(), path.display()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{}: {err}", path.display());
    assert!(out.stdout.is_empty(), "no JSON for a bad file");
    assert_eq!(err.lines().count(), 1, "one line, no backtrace: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains(&path.display().to_string()), "names the file: {err}");
    for e in expect {
        assert!(err.contains(e), "{err} should contain {e:?}");
    }
    err
}

#[test]
fn a_pickle_whose_reduce_would_call_os_system_is_refused_and_nothing_runs() {
    let marker = Path::new("/tmp/gpumem-top-pwned");
    let _ = std::fs::remove_file(marker);
    let err =
        rejects(&fixture("hostile/reduce_os_system.pickle"), &["byte 64: refusing opcode STACK_GLOBAL", "only data"]);
    assert!(!marker.exists(), "os.system ran: {err}");
}

#[test]
fn every_code_opcode_is_refused_with_its_name_and_offset() {
    for (op, name) in [
        (b'c', "GLOBAL"),
        (0x93, "STACK_GLOBAL"),
        (b'R', "REDUCE"),
        (b'b', "BUILD"),
        (b'i', "INST"),
        (b'o', "OBJ"),
        (0x81, "NEWOBJ"),
        (0x92, "NEWOBJ_EX"),
        (b'P', "PERSID"),
        (b'Q', "BINPERSID"),
        (0x82, "EXT1"),
        (0x83, "EXT2"),
        (0x84, "EXT4"),
    ] {
        let p = scratch(&format!("op_{op:02x}.pickle"), &[0x80, 0x04, b'N', op, b'.']);
        rejects(&p, &[&format!("byte 3: refusing opcode {name}:")]);
    }
}

#[test]
fn truncated_files_are_reported_with_the_offset() {
    let gz = std::fs::read(fixture("traces/gpt2_train.pickle.gz")).unwrap();
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut raw).unwrap();
    let half = scratch("half.pickle", &raw[..raw.len() / 2]);
    rejects(&half, &["file ends inside", &format!("byte {}", raw.len() / 2)]);
    // A gzip stream cut short is an error from the decompressor, not a panic.
    let cut = scratch("cut.pickle.gz", &gz[..gz.len() / 3]);
    rejects(&cut, &[]);
    let empty = scratch("empty.pickle", b"");
    rejects(&empty, &["empty"]);
}

use std::io::Read;

#[test]
fn random_bytes_are_not_a_trace() {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let bytes: Vec<u8> = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    rejects(&scratch("random.bin", &bytes), &["neither a pickle"]);
    let mut as_pickle = vec![0x80, 0x04];
    as_pickle.extend_from_slice(&bytes);
    rejects(&scratch("random.pickle", &as_pickle), &["byte "]);
}

#[test]
fn half_a_million_nested_lists_are_decoded_without_recursion_and_rejected_as_a_snapshot() {
    let mut p = vec![0x80, 0x04];
    p.extend(std::iter::repeat_n(b']', 500_000));
    p.extend(std::iter::repeat_n(b'a', 499_999));
    p.push(b'.');
    rejects(&scratch("nested.pickle", &p), &["not a PyTorch snapshot"]);
}

#[test]
fn a_memo_index_out_of_range_is_an_error() {
    rejects(&fixture("hostile/memo_out_of_range.pickle"), &["byte 16: memo index 200 was never stored"]);
}

#[test]
fn a_string_claiming_10_gb_allocates_nothing_of_the_sort() {
    rejects(&fixture("hostile/string_claims_10gb.pickle"), &["file ends inside BINUNICODE8"]);
}

#[test]
fn memory_is_bounded_by_a_multiple_of_the_input() {
    // 4 MB of EMPTY_DICT + DUP: each byte asks for a new value.
    let mut p = vec![0x80, 0x04];
    p.extend(std::iter::repeat_n(b'}', 4 << 20));
    let e = trace::pickle::decode(&p[..], &mut (), trace::pickle::Limits { slack: 1 << 20, ..Default::default() })
        .unwrap_err();
    assert!(e.to_string().contains("exceeds the decoder's limit"), "{e}");
}

#[test]
fn bad_usage_exits_2_with_one_line() {
    for args in [
        vec!["replay", "/nonexistent/trace.pickle"],
        vec!["replay", "x", "--alloc-conf", "expandable_segments:maybe"],
        vec!["replay", "x", "--memory-fraction", "1.5"],
        vec!["replay", "--bogus-flag"],
        vec!["synth", "--batch", "-1"],
        vec!["replay", "x", "--memory-fraction", "-0.5"],
        vec!["diff", "a", "b", "--fail-on-growth", "5"],
        // A capacity of 0 bytes holds nothing: refused, not every request an OOM.
        vec!["replay", "x", "--memory-limit", "0"],
        vec!["replay", "x", "--device-total", "0"],
        vec!["tune", "x", "--device-total", "0GiB"],
        vec!["fit", "a@2", "b@4", "--device-total", "0"],
        // A flag the model has no use for is said, not ignored.
        vec!["synth", "--model", "resnet50", "--seq", "512"],
        vec!["synth", "--model", "mlp", "--heads", "8"],
    ] {
        let out = Command::new(bin()).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        // One line, clap's errors too (they spanned three with a usage block).
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("gpumem-top: "), "{args:?}: {err}");
    }
}

fn raw_fixture() -> Vec<u8> {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(fixture("traces/multistream_pipeline.pickle.gz")).unwrap())
        .read_to_end(&mut raw)
        .unwrap();
    raw
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, .. ProptestConfig::default() })]

    /// Arbitrary bytes after a pickle header: an error or a value, never a
    /// panic or a hang.
    #[test]
    fn fuzz_arbitrary_bytes(body in prop::collection::vec(any::<u8>(), 0..2048)) {
        let mut p = vec![0x80, 0x04];
        p.extend(body);
        let _ = trace::read_any(&p[..]);
    }

    /// A real snapshot with bytes flipped, cut, or inserted.
    #[test]
    fn fuzz_mutated_real_snapshots(muts in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..8)) {
        let mut p = raw_fixture();
        for (at, byte, kind) in muts {
            let i = at.index(p.len());
            match kind {
                0 => p[i] = byte,
                1 => p.truncate(i.max(2)),
                _ => p.insert(i, byte),
            }
        }
        if let Ok(t) = trace::read_any(&p[..]) {
            // Whatever decodes must replay without panicking either.
            if let Some(d) = t.main_device() {
                let opts = gpumem_top::replay::ReplayOptions::new(Default::default(), 150_109_880_320);
                let _ = gpumem_top::replay::replay_events(d.events.view(), &opts);
            }
        }
    }
}

/// Runs a shell command line with the address space capped at 2 GiB.
fn capped(cmd: &str) -> (Option<i32>, String, String, std::time::Duration) {
    let t = std::time::Instant::now();
    let out = Command::new("bash").arg("-c").arg(format!("ulimit -v 2097152; {cmd}")).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
        t.elapsed(),
    )
}

fn gzip(bytes: impl Iterator<Item = Vec<u8>>) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    for chunk in bytes {
        e.write_all(&chunk).unwrap();
    }
    e.finish().unwrap()
}

/// A segment's `device` is an index, not a length: 2^31-1 costs nothing.
#[test]
fn a_huge_device_index_allocates_nothing() {
    let p = fixture("hostile/device_2147483647.pickle");
    let (code, out, err, _) = capped(&format!("exec '{}' replay '{}' --json", bin().display(), p.display()));
    assert_eq!(code, Some(0), "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["device"], 2147483647);
    assert_eq!(j["fidelity"], "state-only");
    let (code, _, err, _) =
        capped(&format!("exec '{}' export '{}' --view fragmap --format txt -o -", bin().display(), p.display()));
    assert_eq!(code, Some(0), "{err}");
}

/// A gzip bomb (600 MB of NONE POP from well under 1 MB) ends with exit 2
/// in bounded memory and time: memory follows the file, not the unpacked bytes.
#[test]
fn a_gzip_bomb_is_refused_in_bounded_memory_and_time() {
    let mut head = vec![0x80, 0x04];
    head.extend(b"N0".repeat(1 << 20));
    let body = std::iter::once(head).chain((0..300).map(|_| b"N0".repeat(1 << 20)));
    let gz = gzip(body);
    assert!(gz.len() < 4 << 20, "{}", gz.len());
    let p = scratch("bomb.pickle.gz", &gz);
    let (code, _, err, took) = capped(&format!("exec '{}' replay '{}' --json", bin().display(), p.display()));
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("bomb.pickle.gz") && err.contains("limit"), "{err}");
    assert!(took < std::time::Duration::from_secs(20), "{took:?}");
}

/// A plain pickle of 20 M empty tuples (each a real allocation) is refused
/// before it outgrows 24 times its size.
#[test]
fn empty_containers_are_charged_what_they_cost() {
    for op in [b')', 0x8f] {
        let mut p = vec![0x80, 0x04];
        p.extend(std::iter::repeat_n(op, 20 << 20));
        p.push(b'.');
        let path = scratch(&format!("empties_{op:02x}.pickle"), &p);
        let (code, _, err, _) = capped(&format!("exec '{}' replay '{}' --json", bin().display(), path.display()));
        assert_eq!(code, Some(2), "{err}");
        assert!(err.contains("exceeds the decoder's limit"), "{err}");
    }
}

/// One line longer than 64 MiB in a JSON-lines trace is an error naming the
/// line, read in bounded memory.
#[test]
fn a_huge_jsonl_line_is_an_error() {
    let mut p = b"{\"action\":\"alloc\",\"addr\":1,\"size\":5,\"pad\":\"".to_vec();
    p.extend(std::iter::repeat_n(b'x', 80 << 20));
    p.extend(b"\"}\n");
    let path = scratch("long.jsonl", &p);
    let (code, _, err, _) = capped(&format!("exec '{}' replay '{}' --json", bin().display(), path.display()));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("line 1") && err.contains("longer than"), "{err}");
    // The same for an RMM log.
    let mut p = b"Thread,Time,Action,Pointer,Size,Stream\n1,".to_vec();
    p.extend(std::iter::repeat_n(b'7', 80 << 20));
    p.extend(b",allocate,0x0,5,0x0\n");
    let path = scratch("long.csv", &p);
    let (code, _, err, _) = capped(&format!("exec '{}' replay '{}' --json", bin().display(), path.display()));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("line 2") && err.contains("longer than"), "{err}");
}

/// gzip's CRC-32 is checked: altered data (stored, so it still inflates)
/// or a wrong checksum is exit 2, not an exact replay of something else.
#[test]
fn a_gzip_checksum_mismatch_is_bad_input() {
    let raw = {
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(std::fs::File::open(fixture("snapshot_kinds/mempools.pickle.gz")).unwrap())
            .read_to_end(&mut raw)
            .unwrap();
        raw
    };
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::none());
    e.write_all(&raw).unwrap();
    let mut gz = e.finish().unwrap();
    let at = gz.windows(14).position(|w| w == b"collect_round2").unwrap();
    gz[at] = b'C';
    rejects(&scratch("altered.pickle.gz", &gz), &["checksum"]);
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(&raw).unwrap();
    let mut gz = e.finish().unwrap();
    let n = gz.len();
    gz[n - 8] ^= 0xff;
    rejects(&scratch("badcrc.pickle.gz", &gz), &["checksum"]);
}

/// A FIFO, a process substitution and stdin (`-`) are read once, whole.
#[test]
fn pipes_fifos_and_stdin_are_read_once() {
    let f = fixture("snapshot_kinds/mempools.pickle.gz");
    let b = bin();
    let dir = common::TmpDir::new("fifo");
    let fifo = dir.join("fifo");
    for cmd in [
        format!("cat '{}' | '{}' replay - --json", f.display(), b.display()),
        format!("'{}' replay <(cat '{}') --json", b.display(), f.display()),
        format!(
            "mkfifo '{0}' && (cat '{1}' > '{0}' &) && timeout 20 '{2}' replay '{0}' --json; rm -f '{0}'",
            fifo.display(),
            f.display(),
            b.display()
        ),
    ] {
        let (code, out, err, _) = capped(&cmd);
        assert_eq!(code, Some(0), "{cmd}: {err}");
        let j: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{cmd}: {e}: {out}"));
        assert_eq!(j["fidelity"], "exact", "{cmd}");
        assert_eq!(j["events"], 138, "{cmd}");
    }
    // Several inputs: each read once, so two FIFOs, two `<(…)` and stdin
    // beside a file all replay (two FIFOs hung, the others were
    // "unrecognised format" on a second reading).
    let (f1, f2) = (dir.join("fifo1"), dir.join("fifo2"));
    for cmd in [
        format!("cat '{0}' | timeout 20 '{1}' replay - '{0}' --json", f.display(), b.display()),
        format!("timeout 20 '{1}' replay <(cat '{0}') <(cat '{0}') --json", f.display(), b.display()),
        format!(
            "mkfifo '{0}' '{1}' && (cat '{2}' > '{0}' &) && (cat '{2}' > '{1}' &) && timeout 20 '{3}' replay '{0}' '{1}' --json; rm -f '{0}' '{1}'",
            f1.display(),
            f2.display(),
            f.display(),
            b.display()
        ),
    ] {
        let (code, out, err, _) = capped(&cmd);
        assert_eq!(code, Some(0), "{cmd}: {err}");
        let j: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{cmd}: {e}: {out}"));
        let ranks = j["ranks"].as_array().unwrap_or_else(|| panic!("{cmd}: {out}"));
        assert_eq!(ranks.len(), 2, "{cmd}");
        for r in ranks {
            assert_eq!((&r["fidelity"], &r["events"]), (&"exact".into(), &138.into()), "{cmd}");
        }
    }
    // The same text summaries too (each rank's replay printed after the table).
    let (code, out, err, _) =
        capped(&format!("timeout 20 '{1}' replay <(cat '{0}') <(cat '{0}')", f.display(), b.display()));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.matches("fidelity: exact").count(), 2, "{out}");
    // diff reads each of its two inputs once as well.
    let (code, out, err, _) =
        capped(&format!("cat '{0}' | timeout 20 '{1}' diff - <(cat '{0}') --json", f.display(), b.display()));
    assert_eq!(code, Some(0), "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    for side in ["base", "new"] {
        assert_eq!((&j[side]["fidelity"], &j[side]["events"]), (&"exact".into(), &138.into()), "{out}");
    }
    assert_eq!(j["base"]["peak_allocated_bytes"], j["new"]["peak_allocated_bytes"], "{out}");
}

/// `record -o` never truncates or follows what is there: an existing path
/// is refused (exit 2) unless `--force` (which replaces the link, not its
/// target) or `--append` (a recording only).
#[test]
fn record_refuses_existing_paths_and_symlinks() {
    let dir = common::TmpDir::new("record");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let rec = |args: &[&str]| {
        let out = Command::new(bin())
            .args(["record", "--source", "demo", "--interval", "20", "--count", "2"])
            .args(args)
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).to_string())
    };
    let out = dir.join("run.jsonl");
    let o = out.to_str().unwrap();
    assert_eq!(rec(&["-o", o]).0, Some(0));
    let before = std::fs::read(&out).unwrap();
    let (code, err) = rec(&["-o", o]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("already exists"), "{err}");
    assert_eq!(std::fs::read(&out).unwrap(), before, "nothing lost");
    assert_eq!(rec(&["-o", o, "--append"]).0, Some(0));
    assert_eq!(std::fs::read_to_string(&out).unwrap().lines().count(), 5, "header + 2 + 2");
    // A symbolic link planted at the path: refused, then replaced by --force;
    // its target is never written.
    let victim = dir.join("victim");
    std::fs::write(&victim, "precious").unwrap();
    let link = dir.join("link.jsonl");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let l = link.to_str().unwrap();
    assert_eq!(rec(&["-o", l]).0, Some(2));
    assert_eq!(rec(&["-o", l, "--append"]).0, Some(2));
    assert_eq!(rec(&["-o", l, "--force"]).0, Some(0));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert!(!std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    // Not a recording: --append refuses to add to it, also a text file
    // that merely names the format in its first bytes.
    assert_eq!(rec(&["-o", victim.to_str().unwrap(), "--append"]).0, Some(2));
    let text = dir.join("notes.txt");
    std::fs::write(&text, "my notes about gpumem-top-record files\nmore\n").unwrap();
    let (code, err) = rec(&["-o", text.to_str().unwrap(), "--append"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("not a gpumem-top recording"), "{err}");
    assert_eq!(std::fs::read_to_string(&text).unwrap().len(), 44, "nothing written");
    // A recording whose last line was cut (a kill): the cut line is
    // dropped, the new samples follow the last whole one, and every
    // sample replays.
    let whole = std::fs::read_to_string(&out).unwrap();
    std::fs::write(&out, format!("{whole}{{\"time\": 17, \"gpus\": [")).unwrap();
    let (code, err) = rec(&["-o", o, "--append"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("its last line was cut short (22 bytes): dropped before appending"), "{err}");
    let after = std::fs::read_to_string(&out).unwrap();
    assert!(after.starts_with(&whole) && after.lines().count() == 7, "{after}");
    let r = Command::new(bin()).arg("replay").arg(&out).arg("--json").output().unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let j: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    assert_eq!(j["samples"], 6);
    // --force never removes a directory, a device or a FIFO.
    let fifo = dir.join("fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    for p in [dir.to_str().unwrap(), fifo.to_str().unwrap(), "/dev/null"] {
        let (code, err) = rec(&["-o", p, "--force"]);
        assert_eq!(code, Some(2), "{p}: {err}");
        assert!(std::fs::symlink_metadata(p).is_ok(), "{p} is still there");
    }
}

/// A recording cut inside its last line (a kill, a full disk) replays every
/// complete sample and warns about the rest.
#[test]
fn a_torn_recording_replays_its_complete_lines() {
    let dir = common::TmpDir::new("torn");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("run.jsonl");
    let _ = std::fs::remove_file(&out);
    let st = Command::new(bin())
        .args(["record", "--source", "demo", "--interval", "20", "--count", "4", "-o"])
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success());
    let full = std::fs::read(&out).unwrap();
    let torn = dir.join("torn.jsonl");
    std::fs::write(&torn, &full[..full.len() - 200]).unwrap();
    let o = Command::new(bin()).args(["replay", torn.to_str().unwrap(), "--json"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("cut short") && err.contains("3 complete samples"), "{err}");
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["format"], "gpumem-top-record");
    // A bad line in the middle is an error naming it.
    let mut mid = full.clone();
    let second = mid.iter().enumerate().filter(|(_, &b)| b == b'\n').nth(1).unwrap().0;
    mid[second + 1] = b'x';
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, &mid).unwrap();
    let o = Command::new(bin()).args(["replay", bad.to_str().unwrap(), "--json"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("line 3"));
    // A gzipped recording that unpacks past the cap is refused, naming the
    // cap: its tail is not a cut line (it exited 0 with the tail dropped).
    let gz = dir.join("run.jsonl.gz");
    std::fs::write(&gz, gzip(std::iter::once(full.clone()))).unwrap();
    let cap = (full.len() - 300).to_string();
    let o =
        Command::new(bin()).args(["replay", gz.to_str().unwrap(), "--json", "--max-unpacked", &cap]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(o.stdout.is_empty() && err.lines().count() == 1, "{err}");
    assert!(err.contains("run.jsonl.gz") && err.contains(&format!("more than {cap} bytes")), "{err}");
    // Under a cap it fits, every sample.
    let o = Command::new(bin()).args(["replay", gz.to_str().unwrap(), "--json"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// The mempools snapshot with its allocator config replaced by `conf`.
fn with_conf(conf: &str) -> Vec<u8> {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(fixture("snapshot_kinds/mempools.pickle.gz")).unwrap())
        .read_to_end(&mut raw)
        .unwrap();
    let key = b"PYTORCH_CUDA_ALLOC_CONF\x94";
    let at = raw.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    assert_eq!(&raw[at..at + 2], b"hX", "the value is a memo reference to ''");
    let mut v = vec![b'X'];
    v.extend((conf.len() as u32).to_le_bytes());
    v.extend(conf.as_bytes());
    raw.splice(at..at + 2, v);
    raw
}

/// Control characters in a config (or a name) make no invalid SVG, and a
/// 2 MB config string is cut, so PNG export stays fast and small.
#[test]
fn control_characters_and_huge_strings_export_cleanly() {
    let p = scratch("ctl.pickle", &with_conf("expandable_segments:\u{1}\u{1b}[31m<&\"'>"));
    let svg = Command::new(bin())
        .args(["export", p.to_str().unwrap(), "--view", "bars", "--format", "svg", "-o", "-"])
        .output()
        .unwrap();
    assert!(svg.status.success(), "{}", String::from_utf8_lossy(&svg.stderr));
    let text = String::from_utf8(svg.stdout).unwrap();
    assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "control characters in the SVG");
    assert!(text.contains("&lt;&amp;&quot;'&gt;"), "escaped");
    let png = Command::new(bin())
        .args(["export", p.to_str().unwrap(), "--view", "bars", "--format", "png", "-o", "-"])
        .output()
        .unwrap();
    assert!(png.status.success() && png.stdout.starts_with(b"\x89PNG"));
    let big = scratch("big.pickle", &with_conf(&"x".repeat(2 << 20)));
    let (code, out, err, took) =
        capped(&format!("exec '{}' export '{}' --view bars --format png -o - | wc -c", bin().display(), big.display()));
    assert_eq!(code, Some(0), "{err}");
    assert!(out.trim().parse::<u64>().unwrap() < 1 << 20, "{out}");
    assert!(took < std::time::Duration::from_secs(20), "{took:?}");
}

/// One line per error, once, with the right exit code.
#[test]
fn messages_say_each_thing_once_and_bad_input_is_exit_2() {
    let dir = common::TmpDir::new("msg");
    std::fs::create_dir_all(dir.join("a.pickle")).unwrap();
    let out = Command::new(bin()).args(["replay", dir.join("a.pickle").to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(err.matches("directory").count(), 1, "{err}");
    // A negative size says so.
    let neg = scratch("neg.jsonl", b"{\"action\":\"alloc\",\"addr\":1,\"size\":-5}\n");
    rejects(&neg, &["line 1", "\"size\" must be a non-negative integer"]);
    // A byte order mark and blank lines before a JSON-lines trace are fine.
    let bom = scratch("bom.jsonl", b"\xef\xbb\xbf\n\n{\"action\":\"alloc\",\"addr\":1,\"size\":5,\"stream\":0}\n");
    let out = Command::new(bin()).args(["replay", bom.to_str().unwrap(), "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Device -1 is an error, not device 0.
    rejects(&scratch("dev.jsonl", b"{\"action\":\"alloc\",\"addr\":1,\"size\":5,\"device\":-1}\n"), &["\"device\""]);
}

/// A gzip of short JSON lines or RMM rows (each line an event) is held to
/// the same bound as a pickle: events are charged against 24 times the
/// compressed bytes plus 64 MiB.
#[test]
fn compressed_text_traces_are_bounded_by_the_file() {
    let line = b"{\"action\":\"oom\",\"size\":0}\n".to_vec();
    let gz = gzip((0..200).map(|_| line.repeat(40_000)));
    let p = scratch("many.jsonl.gz", &gz);
    let (code, _, err, _) = capped(&format!("exec '{}' replay '{}' --json", bin().display(), p.display()));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("exceed 24 times"), "{err}");
    let mut csv = b"Thread,Time,Action,Pointer,Size,Stream\n".to_vec();
    csv.extend(b"1,t,free,0,0,0\n".repeat(200_000));
    let gz = gzip((0..60).map(|i| if i == 0 { csv.clone() } else { b"1,t,free,0,0,0\n".repeat(200_000) }));
    let p = scratch("many.csv.gz", &gz);
    let (code, _, err, _) = capped(&format!("exec '{}' replay '{}' --json", bin().display(), p.display()));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("exceed 24 times"), "{err}");
}

/// `export` and `replay --dump-events` write a new file only, as `record`
/// does: an existing path is refused (exit 2, nothing written), a link is
/// never written through, and `--force` replaces a regular file or the link
/// itself, never a directory or a device.
#[test]
fn export_and_dump_events_never_overwrite_or_follow_links() {
    let dir = common::TmpDir::new("exportw");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let trace = fixture("traces/small_snapshot.pickle");
    let export = |out: &std::path::Path, force: bool| {
        let mut c = Command::new(bin());
        c.arg("export").arg(&trace).args(["--view", "fragmap", "--format", "txt", "--plain", "-o"]).arg(out);
        if force {
            c.arg("--force");
        }
        let o = c.output().unwrap();
        (o.status.code(), String::from_utf8_lossy(&o.stderr).to_string())
    };
    let dump = |out: &std::path::Path, force: bool| {
        let mut c = Command::new(bin());
        c.arg("replay").arg(&trace).arg("--json").arg("--dump-events").arg(out);
        if force {
            c.arg("--force");
        }
        let o = c.output().unwrap();
        (o.status.code(), String::from_utf8_lossy(&o.stderr).to_string())
    };
    for (name, run) in
        [("export", &export as &dyn Fn(&std::path::Path, bool) -> (Option<i32>, String)), ("dump", &dump)]
    {
        let out = dir.join(format!("{name}.out"));
        std::fs::write(&out, "precious").unwrap();
        let (code, err) = run(&out, false);
        assert_eq!(code, Some(2), "{name}: {err}");
        assert!(err.contains("already exists (--force replaces it)"), "{name}: {err}");
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "precious");
        assert_eq!(run(&out, true).0, Some(0), "{name}");
        assert_ne!(std::fs::read_to_string(&out).unwrap(), "precious");
        let victim = dir.join(format!("{name}.victim"));
        std::fs::write(&victim, "precious").unwrap();
        let link = dir.join(format!("{name}.link"));
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        assert_eq!(run(&link, false).0, Some(2), "{name}");
        assert_eq!(run(&link, true).0, Some(0), "{name}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious", "{name}: written through the link");
        assert!(!std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        let (code, err) = run(&dir, true);
        assert_eq!(code, Some(2), "{name}: {err}");
        assert!(dir.is_dir());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A state-only snapshot built by Python's pickle from `segments` (a Python
/// expression); None without python3.
fn state_only(name: &str, segments: &str) -> Option<common::TmpFile> {
    let p = common::TmpFile::new("hostile", name);
    let code = format!(
        "import pickle, sys\nB = lambda size, state='active_allocated': {{'size': size, 'requested_size': size, 'state': state}}\n\
         S = lambda addr, total, blocks: {{'address': addr, 'total_size': total, 'stream': 0, 'segment_type': 'large', 'blocks': blocks}}\n\
         pickle.dump({{'segments': {segments}, 'device_traces': []}}, open(sys.argv[1], 'wb'))"
    );
    let ok = Command::new("python3").arg("-c").arg(code).arg(&*p).status().ok()?.success();
    ok.then_some(p)
}

/// Sizes no device holds (one 7·2^61 B segment: a tick loop in the picture
/// code once wrapped past u64::MAX and never ended) and layouts no
/// allocator makes (blocks covering 512 B of 2 MiB, overlapping or repeated
/// segments) are refused, naming where, in replay and export alike.
#[test]
fn impossible_state_only_layouts_are_refused() {
    let cases = [
        ("huge.pickle", "[S(0x10000000, 7 << 61, [B(7 << 61)])]", "more than any device holds"),
        ("short.pickle", "[S(0x10000000, 2 << 20, [B(512)])]", "its blocks cover 512 of its 2097152 bytes"),
        ("long.pickle", "[S(0x10000000, 2 << 20, [B(2 << 20), B(512)])]", "runs past the end of its segment"),
        (
            "overlap.pickle",
            "[S(0x10000000, 4 << 20, [B(4 << 20)]), S(0x10200000, 2 << 20, [B(2 << 20)])]",
            "segments[1]: overlaps segments[0]",
        ),
        ("twice.pickle", "[S(0x10000000, 2 << 20, [B(2 << 20)])] * 2", "overlaps"),
    ];
    for (name, segs, says) in cases {
        let Some(p) = state_only(name, segs) else { return };
        rejects(&p, &[says]);
        let out = Command::new(bin())
            .arg("export")
            .arg(&p)
            .args(["--view", "fragmap", "--format", "svg", "-o", "-"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{name}");
        assert!(String::from_utf8_lossy(&out.stderr).contains(says));
    }
}

/// 100,000 ordinary segments (a 200 KB gzip): the PNG is bounded as the
/// decoder is (the largest 1,000 drawn, the rest counted), not a 1600 ×
/// 300,000 px canvas.
#[test]
fn a_picture_of_a_hundred_thousand_segments_is_bounded() {
    let dir = common::TmpDir::new("hostile");
    std::fs::create_dir_all(&dir).unwrap();
    let snap = dir.join("many.pickle.gz");
    let code = "import gzip, pickle, sys\n\
        B = lambda n, s: {'size': n, 'requested_size': n, 'state': s}\n\
        segs = [{'address': 0x7f0000000000 + i * (2 << 20), 'total_size': 2 << 20, 'stream': 0, 'segment_type': 'large',\n\
                 'blocks': [B(1 << 20, 'active_allocated'), B(1 << 20, 'inactive')]} for i in range(100000)]\n\
        pickle.dump({'segments': segs, 'device_traces': []}, gzip.open(sys.argv[1], 'wb'))";
    if !Command::new("python3").arg("-c").arg(code).arg(&snap).status().is_ok_and(|s| s.success()) {
        return;
    }
    let png = dir.join("many.png");
    let start = std::time::Instant::now();
    let out = Command::new(bin())
        .arg("export")
        .arg(&snap)
        .args(["--max-unpacked", "200000000", "--view", "fragmap", "--format", "png", "-o"])
        .arg(&png)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(start.elapsed() < std::time::Duration::from_secs(10));
    let bytes = std::fs::read(&png).unwrap();
    let (w, h) =
        (u32::from_be_bytes(bytes[16..20].try_into().unwrap()), u32::from_be_bytes(bytes[20..24].try_into().unwrap()));
    assert_eq!(w, 1600);
    assert!(h <= 4000, "{h} px tall");
    let svg = Command::new(bin())
        .arg("export")
        .arg(&snap)
        .args(["--max-unpacked", "200000000", "--view", "fragmap", "--format", "svg", "-o", "-"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&svg.stdout);
    assert!(text.contains("the 1000 largest segments drawn, in address order; 99000 more (193.36 GiB) not drawn"));
}

/// A recording whose samples claim 400,000 GPUs, or 100,000 publishing
/// processes, replays in bounded memory and time: series for at most 64
/// GPUs, the 256 largest publishers of a sample taken, histories evicted in
/// one pass.
#[test]
fn a_recording_of_impossibly_many_gpus_and_processes_is_bounded() {
    let dir = common::TmpDir::new("hostile");
    std::fs::create_dir_all(&dir).unwrap();
    let rec = dir.join("many.jsonl");
    let mut text =
        String::from("{\"format\":\"gpumem-top-record\",\"version\":1,\"source\":\"nvml\",\"interval_ms\":500}\n");
    let gpus: Vec<String> =
        (0..400_000).map(|i| format!("{{\"index\":{i},\"processes\":[],\"mig\":[],\"errors\":[]}}")).collect();
    text.push_str(&format!(
        "{{\"time\":1.0,\"gpus\":[{}],\"publishers\":[],\"ignored\":[],\"gone\":[],\"alerts\":[],\"published\":[]}}\n",
        gpus.join(",")
    ));
    let pubs: Vec<String> = (0..100_000)
        .map(|i| {
            format!(
                "{{\"version\":1,\"pid\":{},\"device\":0,\"time\":2.0,\"stats\":{{\"reserved_bytes.all.current\":{i}}}}}",
                i + 1
            )
        })
        .collect();
    text.push_str(&format!(
        "{{\"time\":2.0,\"gpus\":[],\"publishers\":[],\"ignored\":[],\"gone\":[],\"alerts\":[],\"published\":[{}]}}\n",
        pubs.join(",")
    ));
    std::fs::write(&rec, text).unwrap();
    let (code, out, err, took) = capped(&format!("exec '{}' replay '{}' --json", bin().display(), rec.display()));
    assert_eq!(code, Some(0), "{err}");
    assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    let procs = j["processes"].as_array().unwrap();
    assert_eq!(procs.len(), gpumem_top::monitor::model::MAX_HISTORIES);
    // The largest publishers are the ones kept.
    assert!(procs.iter().all(|p| p["pid"].as_u64().unwrap() > 99_000), "{procs:?}");
}

/// A recording gzipped, or after a byte order mark and blank lines, is
/// read as a recording (not as a trace: "missing action"); a JSON-lines
/// trace after 1,000 blank lines is read with its lines numbered as in the
/// file.
#[test]
fn recordings_gzipped_or_with_a_bom_and_traces_after_blank_lines_are_read() {
    let dir = common::TmpDir::new("hostile");
    std::fs::create_dir_all(&dir).unwrap();
    let rec = std::fs::read(fixture("live/reset_peaks_gpt2.jsonl")).unwrap();
    let replay = |p: &std::path::Path| {
        let o = Command::new(bin()).arg("replay").arg(p).arg("--json").output().unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).to_string(),
            String::from_utf8_lossy(&o.stderr).to_string(),
        )
    };
    let gz = dir.join("rec.jsonl.gz");
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(&rec).unwrap();
    std::fs::write(&gz, e.finish().unwrap()).unwrap();
    let bom = dir.join("rec-bom.jsonl");
    std::fs::write(&bom, [&b"\xef\xbb\xbf\n\n"[..], &rec].concat()).unwrap();
    for p in [&gz, &bom] {
        let (code, out, err) = replay(p);
        assert_eq!(code, Some(0), "{}: {err}", p.display());
        let j: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(j["format"], "gpumem-top-record", "{}", p.display());
        assert_eq!(j["processes"][0]["peak_allocated_bytes"], 8_690_289_664u64);
    }
    let events = "{\"action\":\"segment_alloc\",\"addr\":1048576,\"size\":2097152,\"stream\":0}\n\
                  {\"action\":\"alloc\",\"addr\":1048576,\"size\":512,\"stream\":0}\n";
    let blank = dir.join("blank.jsonl");
    std::fs::write(&blank, format!("{}{events}", "\n".repeat(1000))).unwrap();
    let (code, out, err) = replay(&blank);
    assert_eq!(code, Some(0), "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["events"], 2);
    std::fs::write(&blank, format!("{}{events}{{\"action\": 7}}\n", "\n".repeat(1000))).unwrap();
    let (code, _, err) = replay(&blank);
    assert_eq!(code, Some(2));
    assert!(err.contains("line 1003"), "{err}");
}

/// Counts read as English: "recorded 1 sample", "1 process", "1 OOM" /
/// "0 OOMs".
#[test]
fn counts_of_one_are_singular() {
    let dir = common::TmpDir::new("hostile");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("one.jsonl");
    let _ = std::fs::remove_file(&out);
    let o = Command::new(bin())
        .args(["record", "--source", "demo", "--interval", "20", "--count", "1", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("recorded 1 sample to"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r = Command::new(bin()).arg("replay").arg(&out).output().unwrap();
    let text = String::from_utf8_lossy(&r.stdout);
    let first = text.lines().next().unwrap();
    assert!(first.ends_with(": 1 sample (gpumem-top-record), 1 process"), "{first}");
    assert!(text.lines().nth(1).unwrap().contains(": 1 sample, peak allocated"), "{text}");
    assert!(text.lines().nth(1).unwrap().ends_with(", 0 OOMs"), "{text}");
    let s =
        Command::new(bin()).arg("replay").arg(fixture("snapshot_kinds/history_less_gpt2.pickle.gz")).output().unwrap();
    assert!(
        String::from_utf8_lossy(&s.stdout).contains("fidelity: state-only, 139 segments as the snapshot holds them")
    );
}

/// A trace read from a process substitution (`<(zcat x)`, /dev/fd/N) is
/// named as a pipe, not as the descriptor's number.
#[test]
fn a_pipe_is_named_a_pipe() {
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "'{}' replay <(zcat '{}') --json",
            bin().display(),
            fixture("traces/resnet50_train.pickle.gz").display()
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["trace"], "(pipe)");
    assert_eq!(j["fidelity"], "exact");
}

/// 16 frames with 4 KiB names, referenced by memo from `entries` stacks of
/// `depth` frames each (every stack different): a small file that names
/// gigabytes of frames when each reference copies its strings.
fn shared_frames(entries: u64, depth: u64) -> Vec<u8> {
    use common::pickler::{entry, frame, segment, snapshot};
    let mut slots = Vec::new();
    let base = 0x7f00_0000_0000;
    snapshot(
        "",
        |p| segment(p, base, 2 << 20, true, &[(2 << 20, "inactive")]),
        |p| {
            entry(p, "segment_alloc", base, 2 << 20, 0, |_| {});
            for i in 0..entries {
                entry(p, "alloc", base + i * 512, 512, 0, |p| {
                    for j in 0..depth {
                        let k = ((j + i / 16 + (j == i % depth) as u64) % 16) as usize;
                        if slots.len() <= k {
                            frame(p, &format!("f{k}{}", "n".repeat(4096)), &"/x.py".repeat(800), k as u64);
                            slots.push(p.memoize());
                        } else {
                            p.get(slots[k]);
                        }
                    }
                });
            }
            for i in 0..entries {
                entry(p, "free_requested", base + i * 512, 512, 0, |_| {});
                entry(p, "free_completed", base + i * 512, 512, 0, |_| {});
            }
        },
    )
}

/// Frame references share their strings, and what the stacks cost is
/// charged to the decoder's allowance: a plain pickle of 2,000 stacks of
/// 1,000 references opens in bounded memory (it took 819 MB), and the same
/// gzipped to a few KB (which asked for ~16 GB and aborted) is refused with
/// one line, neither aborting.
#[test]
fn frame_references_cost_what_they_share() {
    let raw = shared_frames(2_000, 1_000);
    let plain = scratch("frames.pickle", &raw);
    let (code, out, err, took) = capped(&format!("exec '{}' replay '{}' --json", bin().display(), plain.display()));
    assert_eq!(code, Some(0), "{err} {}", &out[..out.len().min(900)]);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!((&j["events"], &j["fidelity"]), (&6_001.into(), &"exact".into()), "{out}");
    assert!(took < std::time::Duration::from_secs(20), "{took:?}");
    let gz = gzip(std::iter::once(raw));
    assert!(gz.len() < 64 << 10, "{}", gz.len());
    let packed = scratch("frames.pickle.gz", &gz);
    let (code, _, err, took) = capped(&format!("exec '{}' replay '{}' --json", bin().display(), packed.display()));
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("frames.pickle.gz") && err.contains("frame references"), "{err}");
    assert!(took < std::time::Duration::from_secs(20), "{took:?}");
}

/// A trace with a stream per allocation (each a 2 MiB segment of its own,
/// cached when freed): the allocator's streams are a map and a stream's
/// free list spans only the bins it uses, so time and memory follow the
/// events. 10,000 streams took `tune` 18 s and 1.46 GB before.
#[test]
fn a_stream_per_allocation_costs_what_its_events_cost() {
    let streams = 60_000u64;
    let lines = (0..streams).map(|i| {
        let a = 0x7f00_0000_0000u64 + i * (2 << 20);
        let mut s = String::new();
        for (act, size) in
            [("segment_alloc", 2u64 << 20), ("alloc", 512), ("free_requested", 512), ("free_completed", 512)]
        {
            s.push_str(&format!("{{\"action\":\"{act}\",\"addr\":{a},\"size\":{size},\"stream\":{}}}\n", i + 1));
        }
        s.into_bytes()
    });
    let gz = gzip(lines);
    assert!(gz.len() < 2 << 20, "{}", gz.len());
    let p = scratch("streams.jsonl.gz", &gz);
    let (code, out, err, took) = capped(&format!("exec '{}' replay '{}' --json", bin().display(), p.display()));
    assert_eq!(code, Some(0), "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!((&j["events"], &j["fidelity"]), (&(4 * streams).into(), &"exact".into()));
    assert_eq!(j["stats"]["segment.all.current"], streams);
    assert!(took < std::time::Duration::from_secs(10), "replay took {took:?}");
    let (code, out, err, took) = capped(&format!("exec '{}' tune '{}'", bin().display(), p.display()));
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("Keep PyTorch's defaults"), "{out}");
    assert!(took < std::time::Duration::from_secs(20), "tune took {took:?}");
}

/// A snapshot without history whose 20,000 live blocks share one stack of
/// 20,000 frames (one memoized list): what a block's stack says is read
/// once per stack, not once per block (replay took 12.9 s, diff a minute).
fn blocks_sharing_one_deep_stack() -> Vec<u8> {
    use common::pickler::{frame, Pickler};
    let (n, depth) = (20_000u64, 20_000u64);
    let total = 20u64 << 20;
    let mut p = Pickler::default();
    let mut stack = None;
    p.dict(|p| {
        p.kv("segments", |p| {
            p.list(|p| {
                p.dict(|p| {
                    p.kv("address", |p| {
                        p.int(0x7f00_0000_0000);
                    })
                    .kv("total_size", |p| {
                        p.int(total);
                    })
                    .kv("stream", |p| {
                        p.int(0);
                    })
                    .kv("segment_type", |p| {
                        p.str("large");
                    })
                    .kv("blocks", |p| {
                        p.list(|p| {
                            for i in 0..=n {
                                let (size, state) =
                                    if i < n { (512, "active_allocated") } else { (total - 512 * n, "inactive") };
                                p.dict(|p| {
                                    p.kv("size", |p| {
                                        p.int(size);
                                    })
                                    .kv("state", |p| {
                                        p.str(state);
                                    })
                                    .kv("frames", |p| match stack {
                                        Some(s) => {
                                            p.get(s);
                                        }
                                        None => {
                                            // C++ frames: none is a Python file's, so finding
                                            // the call site reads all of them.
                                            p.list(|p| (0..depth).for_each(|k| frame(p, &format!("op{k}"), "??", 0)));
                                            stack = Some(p.memoize());
                                        }
                                    });
                                });
                            }
                        });
                    });
                });
            });
        })
        .kv("device_traces", |p| {
            p.list(|_| {});
        });
    });
    p.finish()
}

#[test]
fn blocks_sharing_a_stack_are_read_once_per_stack() {
    let gz = gzip(std::iter::once(blocks_sharing_one_deep_stack()));
    assert!(gz.len() < 256 << 10, "{}", gz.len());
    let p = scratch("shared_stack.pickle.gz", &gz);
    let b = bin();
    for cmd in [
        format!("exec '{}' replay '{}' --json", b.display(), p.display()),
        format!("exec '{}' export '{}' --view fragmap --format svg -o -", b.display(), p.display()),
        format!("exec '{0}' diff '{1}' '{1}' --json", b.display(), p.display()),
    ] {
        let (code, out, err, took) = capped(&cmd);
        assert_eq!(code, Some(0), "{cmd}: {err}");
        assert!(took < std::time::Duration::from_secs(5), "{cmd}: {took:?}");
        if cmd.contains("replay") {
            let j: serde_json::Value = serde_json::from_str(&out).unwrap();
            assert_eq!(j["stats"]["active_bytes.all.current"], 512 * 20_000, "{out}");
        }
    }
}

/// 200,000 recorded OOMs of more than any expandable segment spans: each
/// leaves a reservation behind (as PyTorch's do), and the scan of them no
/// longer runs for a request none can hold; OOM messages are made only
/// when shown. 16,000 took replay 15 s and tune 18 s; 200,000 never ended.
#[test]
fn many_recorded_ooms_cost_what_their_events_cost() {
    let n = 200_000u64;
    let head = b"{\"action\":\"segment_alloc\",\"addr\":139637976727552,\"size\":20971520,\"stream\":0}\n\
                 {\"action\":\"alloc\",\"addr\":139637976727552,\"size\":2097152,\"stream\":0}\n"
        .to_vec();
    let ooms =
        (0..n).map(|i| format!("{{\"action\":\"oom\",\"addr\":0,\"size\":{},\"stream\":0}}\n", (1u64 << 40) + i * 512));
    let gz = gzip(std::iter::once(head).chain(ooms.map(String::into_bytes)));
    assert!(gz.len() < 1 << 20, "{}", gz.len());
    let p = scratch("ooms.jsonl.gz", &gz);
    let (code, out, err, took) = capped(&format!("exec '{}' replay '{}' --json", bin().display(), p.display()));
    assert_eq!(code, Some(0), "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!((&j["fidelity"], &j["stats"]["num_ooms"]), (&"exact".into(), &n.into()));
    assert!(took < std::time::Duration::from_secs(15), "replay took {took:?}");
    let (code, out, err, took) = capped(&format!("exec '{}' tune '{}'", bin().display(), p.display()));
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("200000"), "{out}");
    assert!(took < std::time::Duration::from_secs(15), "tune took {took:?}");
}

/// Output piped to a reader that stops (`replay X | head`) ends quietly:
/// it printed "Broken pipe (os error 32)" on stderr.
#[test]
fn a_closed_pipe_ends_quietly() {
    let f = fixture("traces/gpt2_train.pickle.gz");
    for args in ["--json", ""] {
        let cmd = format!("set -o pipefail; '{}' replay '{}' {args} | true", bin().display(), f.display());
        let out = Command::new("bash").arg("-c").arg(&cmd).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{cmd}: {err}");
        assert!(err.is_empty(), "{cmd}: {err}");
    }
}

/// A snapshot a script re-pickled (each frame's strings its own objects,
/// not shared: the pickle spells every one out) unpacks to many times its
/// compressed size and decodes to several times that: it opens, as
/// docs/user/input.md's bound in unpacked bytes allows, where the allowance used
/// to follow the compressed bytes and refused it.
#[test]
fn a_snapshot_re_pickled_without_shared_strings_opens() {
    use common::pickler::{entry, frame, segment, snapshot};
    const BASE: u64 = 0x7f00_0000_0000;
    let n = 60_000;
    let raw = snapshot(
        "",
        |p| segment(p, BASE, 20 << 20, false, &[(20 << 20, "inactive")]),
        |p| {
            entry(p, "segment_alloc", BASE, 20 << 20, 0, |_| {});
            for i in 0..n {
                let f = |p: &mut common::pickler::Pickler| {
                    for d in 0..4 {
                        frame(
                            p,
                            &format!("forward_{i}"),
                            &format!("/home/user/project/models/layer_{d}/block_{}.py", i % 997),
                            100 + (i * 7 + d) % 5000,
                        );
                    }
                };
                entry(p, "alloc", BASE, 2 << 20, 0, f);
                entry(p, "free_requested", BASE, 2 << 20, 0, f);
                entry(p, "free_completed", BASE, 2 << 20, 0, f);
            }
        },
    );
    let gz = gzip(std::iter::once(raw.clone()));
    // About 39 times: decoding takes several bytes per unpacked byte, past
    // 24 times the compressed bytes plus 64 MiB (the old allowance, 127 MB).
    assert!(raw.len() > 30 * gz.len() && raw.len() < 50 * gz.len(), "{} {}", raw.len(), gz.len());
    let path = scratch("repickled.pickle.gz", &gz);
    let (code, out, err, _) = capped(&format!("exec '{}' replay '{}' --json", bin().display(), path.display()));
    assert_eq!(code, Some(0), "{} B packed, {} B unpacked: {err}", gz.len(), raw.len());
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["fidelity"], "exact");
    assert_eq!(j["events"], 3 * n + 1);
}

/// A truncated gzip is said as that (the offset the decoder reached is in
/// the unpacked data, which the user never sees), and the tool's own
/// `--json` report fed back to it is named as a report, not a trace
/// missing "action".
#[test]
fn a_truncated_gzip_and_our_own_report_are_said_as_what_they_are() {
    let bytes = std::fs::read(fixture("traces/gpt2_train.pickle.gz")).unwrap();
    let cut = scratch("cut.pickle.gz", &bytes[..bytes.len() / 2]);
    let err = rejects(&cut, &["the compressed data ends early or is damaged", "the file is truncated or corrupt"]);
    assert!(!err.contains("byte 1"), "{err}");
    let report = Command::new(bin())
        .args(["replay", fixture("traces/resnet50_train.pickle.gz").to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    let own = scratch("own.json", &report.stdout);
    rejects(&own, &["line 1: this is a gpumem-top --json report (it has \"fidelity\"), not a trace"]);
}
