//! Hostile and broken inputs: each ends with exit code 2 and one line on
//! stderr naming the file and the position, with no panic, nothing executed
//! and bounded memory. Plus fuzzing of the decoder over random bytes and
//! mutated real snapshots.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::fixture;
use gpumem_top::trace;
use proptest::prelude::*;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpumem-top"))
}

fn scratch(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpumem-top-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::File::create(&p).unwrap().write_all(bytes).unwrap();
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
fn a_million_nested_lists_are_decoded_without_recursion_and_rejected_as_a_snapshot() {
    let mut p = vec![0x80, 0x04];
    p.extend(std::iter::repeat_n(b']', 1_000_000));
    p.extend(std::iter::repeat_n(b'a', 999_999));
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
    ] {
        let out = Command::new(bin()).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
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
                let _ = gpumem_top::replay::replay_events(&d.events, &opts, ());
            }
        }
    }
}
