//! Writing a recording (`record`, `run -o`): the file opened as asked (new,
//! replaced, or appended to), then samples written one whole line at a time
//! until told to stop. Its reader is `monitor::recording` (docs/user/live.md,
//! "Recordings").

use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use thiserror::Error;

use super::alerts::{alerts, Thresholds};
use super::recording::{RecordHeader, RecordLine, RECORD_FORMAT};
use super::sampler::{Sampler, Source};
use super::Snapshot;

/// How the output path is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A new file; an existing path is refused.
    New,
    /// An existing file or link is removed first (never followed).
    Replace,
    /// Added to an existing recording (a new or empty file gets a header).
    Append,
}

/// A recording that could not be opened or written.
#[derive(Debug, Error)]
pub enum RecorderError {
    #[error("{path}: {error}")]
    Open { path: String, error: std::io::Error },
    #[error("{path}: {why}")]
    Refused { path: String, why: &'static str },
    #[error("writing {path}: {error}")]
    Write { path: String, error: std::io::Error },
}

impl RecorderError {
    /// A path we may not write is the user's (2); a write that fails, ours (1).
    pub fn exit_code(&self) -> u8 {
        match self {
            RecorderError::Open { .. } | RecorderError::Refused { .. } => 2,
            RecorderError::Write { .. } => 1,
        }
    }
}

/// An output opened for a recording.
pub struct Output {
    pub(crate) file: std::fs::File,
    /// The file is new (or empty): it needs the header line.
    pub(crate) header: bool,
    /// Bytes of a last line cut short (a kill, a full disk) that appending
    /// dropped first: written after, it would make the whole file unreadable.
    pub dropped: Option<u64>,
}

/// Opens `path` for a recording: never through a symbolic link; an existing
/// path only to replace it or append to a recording.
pub fn open(path: &Path, mode: Mode) -> Result<Output, RecorderError> {
    use std::os::unix::fs::OpenOptionsExt;
    let name = path.display().to_string();
    let bad = |error: std::io::Error| RecorderError::Open { path: name.clone(), error };
    let refused = |why| RecorderError::Refused { path: name.clone(), why };
    if mode == Mode::Append {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(bad)?;
        let meta = f.metadata().map_err(bad)?;
        if !meta.is_file() {
            return Err(refused("not a regular file"));
        }
        let len = meta.len();
        if len == 0 {
            return Ok(Output { file: f, header: true, dropped: None });
        }
        // A recording starts with its header line: one JSON object whose
        // `format` is ours (any file merely containing the word is not).
        let mut head = Vec::new();
        std::io::BufRead::read_until(&mut std::io::BufReader::new((&f).take(64 << 10)), b'\n', &mut head)
            .map_err(bad)?;
        let header: Option<RecordHeader> = serde_json::from_slice(head.trim_ascii_end()).ok();
        if !head.ends_with(b"\n") || header.is_none_or(|h| h.format != RECORD_FORMAT) {
            return Err(refused(
                "not a gpumem-top recording (its first line is not a recording's header); --append adds only to one",
            ));
        }
        let mut last = [0u8; 1];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut last, len - 1).map_err(bad)?;
        let mut dropped = None;
        if last[0] != b'\n' {
            let keep = last_newline(&f, len).map_err(bad)?;
            f.set_len(keep).map_err(bad)?;
            dropped = Some(len - keep);
        }
        return Ok(Output { file: f, header: false, dropped });
    }
    if mode == Mode::Replace {
        // Only a file or a link is replaced: never a directory, a device
        // (`-o /dev/null --force` as root), a FIFO or a socket.
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.is_file() || m.file_type().is_symlink() => std::fs::remove_file(path).map_err(bad)?,
            Ok(_) => return Err(refused("not a regular file; --force replaces only files and links")),
            Err(_) => {}
        }
    }
    // O_CREAT|O_EXCL: fails on any existing path, a symbolic link included.
    match std::fs::OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(file) => Ok(Output { file, header: true, dropped: None }),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            Err(refused("already exists; --force replaces it, --append adds to a recording"))
        }
        Err(e) => Err(bad(e)),
    }
}

/// The length of `f` up to and including its last newline (of `len` bytes).
fn last_newline(f: &std::fs::File, len: u64) -> std::io::Result<u64> {
    let mut end = len;
    let mut buf = vec![0u8; 64 << 10];
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let chunk = &mut buf[..(end - start) as usize];
        std::os::unix::fs::FileExt::read_exact_at(f, chunk, start)?;
        if let Some(i) = chunk.iter().rposition(|&b| b == b'\n') {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

/// Writes samples to a recording until `stop` is set or `count` are written.
pub struct Recorder<'a> {
    pub(crate) output: Output,
    pub(crate) path: &'a Path,
    /// What the samples come from, as the header names it ("nvml", "demo").
    pub(crate) source: &'a str,
    pub(crate) interval_ms: u64,
}

impl Recorder<'_> {
    /// Samples `src` every `interval` into the file; returns how many
    /// samples were written.
    pub fn run(
        mut self,
        src: Box<dyn Source>,
        thresholds: Thresholds,
        interval: Duration,
        stop: &AtomicBool,
        count: Option<u64>,
    ) -> Result<u64, RecorderError> {
        let path = self.path.display().to_string();
        if self.output.header {
            let h = RecordHeader {
                format: RECORD_FORMAT.into(),
                version: 1,
                source: self.source.into(),
                interval_ms: self.interval_ms,
            };
            put(&mut self.output.file, &path, &h)?;
        }
        // The sampler runs until it is dropped at the end of this function.
        let (sampler, rx) = Sampler::spawn(src, interval);
        let mut n = 0u64;
        let write = |file: &mut std::fs::File, snap: &Snapshot| {
            put(file, &path, &RecordLine::of(snap, &alerts(snap, &thresholds)))
        };
        while !stop.load(Ordering::Relaxed) && count.is_none_or(|c| n < c) {
            let Ok(snap) = rx.recv_timeout(Duration::from_millis(100)) else { continue };
            write(&mut self.output.file, &snap)?;
            n += 1;
        }
        if count.is_some_and(|c| n >= c) {
            return Ok(n);
        }
        // Stopped (the command exited, or a signal): one last sample taken
        // now, so that what a process wrote at its exit (its last steps, the
        // OOM that ended it) is in, at once rather than an interval later.
        let since = super::now();
        sampler.sample_now();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while let Ok(snap) = rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())) {
            write(&mut self.output.file, &snap)?;
            n += 1;
            if snap.time >= since {
                break;
            }
        }
        Ok(n)
    }
}

/// Writes one line in one write, so a kill leaves whole lines (and a full
/// disk at most one cut line, which `replay` drops with a warning).
fn put(file: &mut std::fs::File, path: &str, v: &impl serde::Serialize) -> Result<(), RecorderError> {
    let write = |error| RecorderError::Write { path: path.to_string(), error };
    let mut line = serde_json::to_vec(v).map_err(|e| write(e.into()))?;
    line.push(b'\n');
    file.write_all(&line).map_err(write)
}
