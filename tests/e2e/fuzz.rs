//! A mutation fuzzer over the input formats (pickle snapshots of protocols
//! 0 and 4, our JSON lines, RMM CSV, and `record`'s recordings): real
//! inputs with bytes flipped, inserted, deleted, duplicated, spliced and
//! cut, each read and, when it reads, replayed through the same session
//! every front end uses and exported (the fragmentation map and timeline as
//! SVG and text; recordings into the live model and its report); every
//! 16th that reads also goes through the binary's `tune`, `diff` and
//! `replay` of two inputs. A panic or an execution over 2 s (5 s for a
//! command) fails, and the input is saved.
//!
//! CI runs it for `GPUMEM_FUZZ_SECS` (default 15) seconds; a longer run:
//!
//!     GPUMEM_FUZZ_EXECS=1000000 cargo test --release --test e2e fuzz:: -- --nocapture

use crate::common;

use std::io::Read;
use std::time::{Duration, Instant};

use common::fixture;
use gpumem_top::export::picture::{Format, ViewKind};
use gpumem_top::export::replay::picture;
use gpumem_top::trace;

fn gunzip(path: &str) -> Vec<u8> {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(fixture(path)).unwrap()).read_to_end(&mut raw).unwrap();
    raw
}

/// A real recording (`run` beside GPT-2 on the H200).
const RECORDING: &str = include_str!("../fixtures/live/reset_peaks_gpt2.jsonl");

fn seeds() -> Vec<Vec<u8>> {
    let mut jsonl = String::new();
    for (i, a) in
        ["segment_alloc", "alloc", "alloc", "free_requested", "free_completed", "segment_free"].iter().enumerate()
    {
        let addr = if i == 2 { 140_000_000_001_024u64 } else { 140_000_000_000_000 };
        let size = if a.starts_with("segment") { 2 << 20 } else { 512 };
        jsonl.push_str(&format!("{{\"action\":\"{a}\",\"addr\":{addr},\"size\":{size},\"stream\":0,\"device\":0}}\n"));
    }
    let rmm = "Thread,Time,Action,Pointer,Size,Stream\n\
               1,08:00:00:000001,allocate,0x7f0000000000,5242880,0x0\n\
               1,08:00:00:000002,allocate,0x7f0000500000,3145728,0x0\n\
               1,08:00:00:000003,free,0x7f0000000000,5242880,0x0\n\
               1,08:00:00:000004,allocate failure,0x0,99999999999,0x0\n";
    // A recording's header and first samples (each line a sample with
    // its publishers' files).
    let rec: Vec<&str> = RECORDING.lines().take(6).collect();
    vec![
        (rec.join("\n") + "\n").into_bytes(),
        gunzip("snapshot_kinds/mempools.pickle.gz"),
        gunzip("snapshot_kinds/mempools_protocol0.pickle.gz"),
        gunzip("traces/multistream_pipeline.pickle.gz"),
        std::fs::read(fixture("traces/small_snapshot.pickle")).unwrap(),
        jsonl.into_bytes(),
        rmm.as_bytes().to_vec(),
    ]
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Pickle opcodes worth inserting: containers, marks, memo, strings, ints.
const OPS: &[u8] = b"()]}.NKMJ\x8a\x8c\x94hjqraeust\x85\x86\x87\x88\x89G0(2lVSIdp";

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&seeds[rng.below(seeds.len())]);
    for _ in 0..1 + rng.below(6) {
        if out.is_empty() {
            out.push(0x80);
        }
        let i = rng.below(out.len());
        match rng.below(9) {
            0 => out[i] = rng.next() as u8,
            1 => out[i] ^= 1 << rng.below(8),
            2 => out.insert(i, rng.next() as u8),
            3 => out.insert(i, OPS[rng.below(OPS.len())]),
            4 => {
                let n = rng.below(64).min(out.len() - i);
                out.drain(i..i + n);
            }
            5 => {
                let n = rng.below(256).min(out.len() - i);
                let dup: Vec<u8> = out[i..i + n].to_vec();
                out.splice(i..i, dup);
            }
            6 => {
                let other = &seeds[rng.below(seeds.len())];
                let j = rng.below(other.len());
                let n = rng.below(512).min(other.len() - j);
                out.splice(i..i, other[j..j + n].iter().copied());
            }
            7 => out.truncate(i.max(1)),
            _ => out[i] = [0, 0xff, 0x7f, 0x80, b'-', b'9'][rng.below(6)],
        }
        out.truncate(1 << 20);
    }
}

/// One execution: read, and replay and export what reads.
fn execute(input: &[u8], export: bool) {
    if input.starts_with(b"{\"format\":\"gpumem-top-record\"") {
        let Ok(snaps) = gpumem_top::cli::read_recording_with(input, "fuzz", &mut |_| {}) else { return };
        let mut model = gpumem_top::monitor::model::LiveModel::default();
        for s in snaps {
            model.ingest(s);
        }
        let _ = model.procs.len();
        return;
    }
    let Ok(t) = trace::read_any(input) else { return };
    for dev in &t.devices {
        if dev.events.len() > 100_000 {
            continue;
        }
        let opts = gpumem_top::replay::OpenOptions { device: Some(dev.device()), ..Default::default() };
        if let Ok(opened) = gpumem_top::replay::open(&t, "fuzz", &opts) {
            let s = &opened.session;
            let _ = s.exact.allocator.snapshot();
            if s.fidelity.is_faithful() {
                if let Ok(mut sc) = s.scrubber(64) {
                    let _ = sc.seek(dev.events.len() / 2).memory_stats();
                }
                if export {
                    if let Ok(mut m) = opened.model("fuzz".into()) {
                        let at = dev.events.len().saturating_sub(1);
                        for (view, format) in [
                            (ViewKind::Fragmap, Format::Svg),
                            (ViewKind::Timeline, Format::Svg),
                            (ViewKind::Fragmap, Format::Txt),
                        ] {
                            let _ = picture(
                                &mut m,
                                at,
                                view,
                                format,
                                800,
                                true,
                                gpumem_top::view::parts::ColorBy::Category,
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Every 16th execution: the commands that take an input whole, through
/// the binary as a user runs them: `tune`, `diff` against a seed, and
/// `replay` of the input beside a seed (each input read once, replayed as
/// alone). Each must end with 0, 1 or 2, never a panic or a signal.
fn through_binary(input: &[u8], seed_file: &std::path::Path, dir: &std::path::Path, n: u64) -> Result<(), String> {
    let f = dir.join(format!("in{}", n % 4));
    std::fs::write(&f, input).map_err(|e| e.to_string())?;
    let (f, seed) = (f.to_str().unwrap_or_default(), seed_file.to_str().unwrap_or_default());
    let runs: [&[&str]; 3] = [&["tune", f, "--json"], &["diff", seed, f, "--json"], &["replay", f, seed, "--json"]];
    for args in runs {
        let t = Instant::now();
        let o = std::process::Command::new(common::bin()).args(args).output().map_err(|e| e.to_string())?;
        let err = String::from_utf8_lossy(&o.stderr);
        if !matches!(o.status.code(), Some(0..=2)) || err.contains("panicked") {
            return Err(format!("{args:?} ended {:?}: {err}", o.status));
        }
        if t.elapsed() > Duration::from_secs(5) {
            return Err(format!("{args:?} took {:?}", t.elapsed()));
        }
    }
    Ok(())
}

#[test]
fn fuzz_pickle_jsonl_and_rmm_inputs() {
    let secs: u64 = std::env::var("GPUMEM_FUZZ_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(15);
    let execs: Option<u64> = std::env::var("GPUMEM_FUZZ_EXECS").ok().and_then(|s| s.parse().ok());
    let seed: u64 =
        std::env::var("GPUMEM_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x9e37_79b9_7f4a_7c15);
    let seeds = seeds();
    // Every seed reads as it is.
    assert!(gpumem_top::cli::read_recording(&seeds[0][..], "seed").is_ok_and(|s| s.len() == 5));
    for (i, s) in seeds.iter().enumerate().skip(1) {
        assert!(trace::read_any(&s[..]).is_ok(), "seed {i} does not read");
    }
    let mut rng = Rng(seed);
    let mut input = Vec::new();
    let dir = common::TmpDir::new("fuzz");
    std::fs::create_dir_all(&dir).unwrap();
    let seed_file = dir.join("seed.pickle");
    std::fs::write(&seed_file, &seeds[3]).unwrap();
    let mut through = 0u64;
    let start = Instant::now();
    let mut n = 0u64;
    let mut read_ok = 0u64;
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    loop {
        match execs {
            Some(e) if n >= e => break,
            None if start.elapsed() >= Duration::from_secs(secs) => break,
            _ => {}
        }
        mutate(&mut rng, &seeds, &mut input);
        let t = Instant::now();
        // Export (pictures) every 8th execution: it costs more than a read.
        let r = std::panic::catch_unwind(|| execute(&input, n % 8 == 0));
        let took = t.elapsed();
        if r.is_err() || took > Duration::from_secs(2) {
            std::panic::set_hook(prev);
            let p = std::env::temp_dir().join(format!("gpumem-top-fuzz-crash-{n}.bin"));
            std::fs::write(&p, &input).unwrap();
            panic!(
                "execution {n} {} (input saved to {}); replay it with `gpumem-top replay {}`",
                if r.is_err() { "panicked" } else { "took over 2 s" },
                p.display(),
                p.display()
            );
        }
        if trace::read_any(&input[..]).is_ok() {
            read_ok += 1;
            if n % 16 == 0 {
                through += 1;
                if let Err(e) = through_binary(&input, &seed_file, &dir, n) {
                    std::panic::set_hook(prev);
                    let p = std::env::temp_dir().join(format!("gpumem-top-fuzz-crash-{n}.bin"));
                    std::fs::write(&p, &input).unwrap();
                    panic!("execution {n}: {e} (input saved to {})", p.display());
                }
            }
        }
        n += 1;
    }
    std::panic::set_hook(prev);
    eprintln!(
        "fuzz: {n} executions in {:.1} s ({read_ok} read as a trace, {through} of them also through tune, diff and replay of two inputs), seed {seed:#x}, no panic, none over 2 s",
        start.elapsed().as_secs_f64()
    );
    assert!(n > 0);
}
