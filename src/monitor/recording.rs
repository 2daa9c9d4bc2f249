//! A recording (`record`, `run -o`): its lines as typed records, written
//! and read back, and the model `replay RECORDING.jsonl` steps through
//! (docs/user/live.md). The file is a header line, then one line per sample:
//! the live report with each publisher's file as it wrote it (docs/user/json.md).

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::alerts::Alert;
use super::model::LiveModel;
use super::{publisher, GpuSample, Snapshot};
use crate::timeline::Step;

pub(crate) use crate::trace::input::RECORD_FORMAT;

/// A recording's first line.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct RecordHeader<'a> {
    pub(crate) format: std::borrow::Cow<'a, str>,
    #[serde(default)]
    pub(crate) version: u32,
    #[serde(default)]
    pub(crate) source: std::borrow::Cow<'a, str>,
    #[serde(default)]
    pub(crate) interval_ms: u64,
}

/// One recorded sample as written: the live report plus each publisher's
/// file as it wrote it (so `replay` can draw the fragmentation map).
#[derive(Serialize)]
pub(crate) struct RecordLine {
    #[serde(flatten)]
    report: super::report::LiveReport,
    published: Vec<publisher::RawFile>,
}

impl RecordLine {
    pub(crate) fn of(snap: &Snapshot, a: &[Alert]) -> Self {
        RecordLine {
            report: super::report::LiveReport::of(snap, a, ""),
            published: snap.publishers.iter().map(publisher::RawFile::of).collect(),
        }
    }
}

/// One recorded sample as read back: what a snapshot is made of. The
/// report's derived figures are not read (they are the publishers' own,
/// recomputed); each publisher's file is read as the live monitor reads
/// one, straight from its text in the line.
#[derive(Deserialize)]
struct ReadLine<'a> {
    #[serde(default)]
    time: f64,
    #[serde(borrow)]
    gpus: &'a RawValue,
    #[serde(default, borrow)]
    published: Vec<&'a RawValue>,
    /// Lenient, as it always was: a damaged list of gone processes loses
    /// only that list.
    #[serde(default, borrow)]
    gone: Option<&'a RawValue>,
}

/// A line of a recording that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{name}: line {line}: {msg}")]
pub struct RecordingError {
    pub(crate) name: String,
    /// 1-based.
    pub(crate) line: usize,
    pub(crate) msg: String,
}

impl RecordingError {
    /// 2: the file is not a recording we can read.
    pub fn exit_code(&self) -> u8 {
        2
    }
}

/// Reads a recording back into snapshots. Every complete line is read; a
/// last line cut short (a kill or a full disk during `record`) is dropped
/// and `warn` is told; any other bad line is an error naming it.
pub(crate) fn read<R: std::io::BufRead>(
    r: R,
    name: &str,
    warn: &mut dyn FnMut(String),
) -> Result<Vec<Snapshot>, RecordingError> {
    let mut lines = crate::trace::bounded_lines(r).enumerate().peekable();
    let bad = |n: usize, msg: String| RecordingError { name: name.to_string(), line: n + 1, msg };
    // A line the reader refused says its own number: kept once.
    let line_err = |n: usize, e: crate::trace::TraceError| match e {
        crate::trace::TraceError::Line { msg, .. } => bad(n, msg),
        other => bad(n, other.to_string()),
    };
    // The header: the first line that is not blank (a byte order mark
    // before it is allowed, as in any text file).
    let (at, first) = loop {
        let Some((i, l)) = lines.next() else { return Ok(Vec::new()) };
        let l = l.map_err(|e| line_err(i, e))?;
        let l = l.strip_prefix('\u{feff}').map(str::to_string).unwrap_or(l);
        if !l.trim().is_empty() {
            break (i, l);
        }
    };
    let head: RecordHeader = serde_json::from_str(&first).map_err(|e| bad(at, at_column(&e, &first, &first)))?;
    if head.format != RECORD_FORMAT {
        return Err(bad(at, "not a gpumem-top recording".into()));
    }
    let mut out = Vec::new();
    while let Some((i, l)) = lines.next() {
        let last = lines.peek().is_none();
        // A read that failed (the unpacked-size cap, a corrupt gzip) is no
        // cut line: what follows it was never seen.
        if let Err(crate::trace::TraceError::Io(e)) = &l {
            return Err(bad(i, e.to_string()));
        }
        let parsed = l.map_err(|e| line_err(i, e)).and_then(|l| {
            if l.trim().is_empty() {
                return Ok(None);
            }
            sample(&l, name).map(Some).map_err(|m| bad(i, m))
        });
        match parsed {
            Ok(Some(s)) => out.push(s),
            Ok(None) => {}
            Err(e) if last && !out.is_empty() => warn(format!(
                "{e}: the last line is cut short (a kill or a full disk during record); replaying the {} complete {} before it",
                out.len(),
                if out.len() == 1 { "sample" } else { "samples" }
            )),
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// One sample line.
fn sample(line: &str, name: &str) -> Result<Snapshot, String> {
    let l: ReadLine = serde_json::from_str(line).map_err(|e| at_column(&e, line, line))?;
    let gpus: Vec<GpuSample> =
        serde_json::from_str(l.gpus.get()).map_err(|e| format!("gpus: {}", at_column(&e, line, l.gpus.get())))?;
    let mut publishers = Vec::with_capacity(l.published.len());
    for (k, p) in l.published.iter().enumerate() {
        // Its position is within that file's text, as the line carries it.
        let f = publisher::parse_bytes(p.get().as_bytes(), std::path::Path::new(name))
            .map_err(|m| format!("published file {k}: {m}"))?;
        publishers.push(f);
    }
    let gone = l.gone.and_then(|g| serde_json::from_str(g.get()).ok()).unwrap_or_default();
    Ok(Snapshot { time: l.time, gpus, publishers, gone, ..Default::default() })
}

/// serde's message for an error in `part` (a slice of the one-line
/// `line`), placed by its column in the line: serde counts from the
/// part's start and calls the line 1, whatever line of the file it is.
fn at_column(e: &serde_json::Error, line: &str, part: &str) -> String {
    let m = e.to_string();
    let what = m.rsplit_once(" at line ").map_or(m.as_str(), |x| x.0);
    let offset = (part.as_ptr() as usize).saturating_sub(line.as_ptr() as usize);
    format!("{what}, at column {}", offset + e.column())
}

/// `replay RECORDING.jsonl`: every sample, and the one shown. The live
/// screens draw `now` (the model as it stood at that sample, with the
/// histories whole).
pub(crate) struct Recording {
    snaps: Vec<Snapshot>,
    /// The model over all of them: its histories are the timeline.
    full: LiveModel,
    /// The sample shown.
    at: usize,
}

impl Recording {
    /// At the last sample.
    pub(crate) fn new(snaps: Vec<Snapshot>) -> Self {
        let mut full = LiveModel::default();
        for s in &snaps {
            full.ingest(s.clone());
        }
        let at = snaps.len().saturating_sub(1);
        Recording { snaps, full, at }
    }

    /// The sample shown (0-based) and how many there are.
    pub(crate) fn at(&self) -> (usize, usize) {
        (self.at, self.snaps.len())
    }

    /// Seconds from the first sample to the one shown.
    pub(crate) fn elapsed(&self) -> f64 {
        let t0 = self.snaps.first().map_or(0.0, |s| s.time);
        self.snaps.get(self.at).map_or(t0, |s| s.time) - t0
    }

    /// Shows sample `at` (clamped); the model as it stood then.
    pub(crate) fn show(&mut self, at: usize) -> LiveModel {
        self.at = at.min(self.snaps.len().saturating_sub(1));
        self.full.as_of(&self.snaps, self.at)
    }

    /// The sample `step` goes to from the one shown.
    pub(crate) fn step(&self, step: Step) -> usize {
        let last = self.snaps.len().saturating_sub(1);
        step.from(self.at, last, (last / 20).max(1))
    }

    /// What process `key` ((GPU, pid)) published in sample `i`.
    fn published(&self, key: (u32, u32), i: usize) -> Option<&super::Published> {
        self.snaps.get(i)?.publisher(key.0, key.1)
    }

    /// The sample that first shows the timeline's peak, at `peak_time`, of
    /// the process `key` (a step's own peak falls between samples); the
    /// last when none does.
    pub(crate) fn peak(&self, key: (u32, u32), peak_time: f64) -> usize {
        let last = self.snaps.len().saturating_sub(1);
        (0..=last).find(|&i| self.published(key, i).is_some_and(|p| p.time >= peak_time)).unwrap_or(last)
    }

    /// The next sample after the one shown where process `key`'s OOM count
    /// rose, if any.
    pub(crate) fn next_oom(&self, key: (u32, u32)) -> Option<usize> {
        let ooms = |i: usize| self.published(key, i).map(|p| p.stats.get("num_ooms").copied().unwrap_or(0));
        let mut before = (0..=self.at).rev().find_map(ooms);
        for i in self.at + 1..self.snaps.len() {
            if let Some(n) = ooms(i) {
                if before.is_some_and(|b| n > b) {
                    return Some(i);
                }
                before = Some(n);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> Vec<Snapshot> {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/live/reset_peaks_gpt2.jsonl");
        let f = std::io::BufReader::new(std::fs::File::open(p).unwrap());
        read(f, "reset_peaks_gpt2.jsonl", &mut |w| panic!("{w}")).unwrap()
    }

    /// A real recording (GPT-2 on the H200) read typed: every sample, its
    /// publisher's files parsed as the monitor parses them; stepping shows
    /// the model at a sample without copying a series.
    #[test]
    fn a_recording_reads_typed_and_steps_without_copying_its_series() {
        let snaps = fixture();
        assert_eq!(snaps.len(), 31);
        let with = snaps.iter().filter(|s| !s.publishers.is_empty()).count();
        assert_eq!(with, 6, "samples with a publisher");
        let first = snaps.iter().position(|s| !s.publishers.is_empty()).unwrap();
        let key = (snaps[first].publishers[0].device, snaps[first].publishers[0].pid);
        let mut rec = Recording::new(snaps);
        assert_eq!(rec.at(), (30, 31));
        let m = rec.show(first);
        assert_eq!(rec.at(), (first, 31));
        let h = &m.procs[&key];
        assert!(std::sync::Arc::ptr_eq(&h.series, &rec.full.procs[&key].series), "shared, not copied");
        assert_eq!(rec.step(Step::Previous), first - 1);
        assert_eq!(rec.step(Step::Last), 30);
        assert_eq!(rec.step(Step::PageOn), first + 1);
        let peak_time = m.procs[&key].peak_time().unwrap();
        assert!(rec.peak(key, peak_time) >= first, "a sample where the process published");
        assert_eq!(rec.next_oom(key), None, "the run had no OOM");
    }

    /// A bad line names itself; a last line cut short is dropped with a
    /// warning; a header of another format is refused.
    #[test]
    fn bad_lines_are_named_and_a_cut_last_line_is_dropped() {
        let head = r#"{"format":"gpumem-top-record","version":1,"source":"nvml","interval_ms":500}"#;
        let ok = r#"{"time":1.0,"gpus":[],"published":[]}"#;
        let e = read(format!("{head}\n{ok}\n{{\"time\": 1, \"gpus\": 5}}\n{ok}\n").as_bytes(), "r.jsonl", &mut |_| {})
            .unwrap_err();
        assert!(e.to_string().starts_with("r.jsonl: line 3: gpus: invalid type: integer `5`"), "{e}");
        // The column is the line's: `5` is its 21st character.
        assert!(e.to_string().ends_with(", expected a sequence, at column 21"), "{e}");
        let mut warned = Vec::new();
        let s = read(format!("{head}\n{ok}\n{ok}\n{{\"time\": 2, \"gp").as_bytes(), "r.jsonl", &mut |w| warned.push(w))
            .unwrap();
        assert_eq!(s.len(), 2);
        assert!(warned[0].contains("line 4") && warned[0].contains("2 complete samples"), "{warned:?}");
        let e = read(r#"{"format":"other"}"#.as_bytes(), "r.jsonl", &mut |_| {}).unwrap_err();
        assert_eq!(e.to_string(), "r.jsonl: line 1: not a gpumem-top recording");
    }
}
