//! One input, as every command and screen opens it: a file, a FIFO,
//! `<(…)` or `-` (stdin), read once from its first byte, its kind told from
//! its first line (docs/user/input.md).

use std::io::Read;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use thiserror::Error;

use super::{ReadLimits, Trace, TraceError};

/// The first line's `format` of a recording (`record`, `run -o`).
pub(crate) const RECORD_FORMAT: &str = "gpumem-top-record";

/// An input that cannot be opened or read: bad input, exit code 2.
#[derive(Debug, Error)]
pub enum InputError {
    #[error("{name}: {error}")]
    Io { name: String, error: std::io::Error },
    #[error("{name}: is a directory")]
    Directory { name: String },
    #[error("{name}: {error}")]
    Trace { name: String, error: TraceError },
}

impl InputError {
    /// Every input error is the user's file: exit code 2.
    pub fn exit_code(&self) -> u8 {
        2
    }
}

/// An input's bytes from the first: the head already read, then the rest.
pub(crate) type InputReader = std::io::BufReader<std::io::Chain<std::io::Cursor<Vec<u8>>, Box<dyn Read + Send>>>;

/// What an input holds, told from its first line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputKind {
    /// A PyTorch snapshot, our JSON-lines trace or an RMM log.
    Trace,
    /// A `record` recording (JSON lines of samples), gzipped or not.
    Recording,
}

/// One input, opened and read once. The first line is kept so the format
/// can be told without reading again.
pub struct Input {
    name: String,
    head: Vec<u8>,
    rest: Box<dyn Read + Send>,
    /// The file's size (0 when unknown: a pipe).
    size: u64,
    /// A gzip file's unpacked size from its trailer (a hint), else 0.
    unpacked: u64,
    /// Bytes of the file read so far.
    read: Arc<AtomicU64>,
}

impl Input {
    pub fn open(path: &Path) -> Result<Input, InputError> {
        let name = path.display().to_string();
        let io = |error: std::io::Error| InputError::Io { name: name.clone(), error };
        let (name, raw, size, unpacked): (String, Box<dyn Read + Send>, u64, u64) = if path.as_os_str() == "-" {
            ("stdin".into(), Box::new(std::io::stdin()), 0, 0)
        } else {
            let mut f = std::fs::File::open(path).map_err(io)?;
            let meta = f.metadata().map_err(io)?;
            if meta.is_dir() {
                return Err(InputError::Directory { name });
            }
            // Only a regular file can be measured and read twice.
            let (size, unpacked) =
                if meta.is_file() { (meta.len(), super::gzip_unpacked_size(&mut f)) } else { (0, 0) };
            (name.clone(), Box::new(f), size, unpacked)
        };
        let read = Arc::new(AtomicU64::new(0));
        let mut rest: Box<dyn Read + Send> = Box::new(super::Counted { inner: raw, n: read.clone() });
        // The first line, or 4 KiB of it.
        let mut head = Vec::new();
        let mut byte = [0u8; 512];
        while head.len() < 4096 && !head.contains(&b'\n') {
            match rest.read(&mut byte) {
                Ok(0) => break,
                Ok(k) => head.extend_from_slice(&byte[..k]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(error) => return Err(InputError::Io { name, error }),
            }
        }
        Ok(Input { name, head, rest, size, unpacked, read })
    }

    /// The input as errors name it: the path given, or "stdin".
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The file's size in bytes (0 for a pipe), and a counter of the bytes
    /// read so far: what a progress line compares.
    pub fn progress(&self) -> (u64, Arc<AtomicU64>) {
        (self.size, self.read.clone())
    }

    /// A recording's first line is a JSON object naming our format, after a
    /// byte order mark or blank lines; anything else is read as a trace.
    pub fn kind(&self) -> InputKind {
        let first = super::first_line(&self.head);
        if first.starts_with('{') && first.contains(RECORD_FORMAT) {
            InputKind::Recording
        } else {
            InputKind::Trace
        }
    }

    /// The input as plain lines (gunzipped under the trace's unpacked-size
    /// cap), for a recording.
    pub fn lines(self, max_unpacked: Option<u64>) -> Result<Box<dyn std::io::BufRead + Send>, InputError> {
        let (name, read) = (self.name.clone(), self.read.clone());
        let limits = ReadLimits { consumed: Some(read), max_unpacked, tap: None };
        super::plain(self.reader(), limits).map_err(|error| InputError::Io { name, error })
    }

    /// The trace the input holds, read under the bounds of docs/user/input.md
    /// (`max_unpacked`: `--max-unpacked`).
    pub fn read_trace(self, max_unpacked: Option<u64>) -> Result<Trace, InputError> {
        self.read_trace_tapped(max_unpacked, None)
    }

    /// `read_trace`, a PyTorch snapshot's events given to `tap` as they are
    /// decoded.
    pub(crate) fn read_trace_tapped(
        self,
        max_unpacked: Option<u64>,
        tap: Option<super::Tap>,
    ) -> Result<Trace, InputError> {
        let (name, unpacked) = (self.name.clone(), self.unpacked);
        let limits = ReadLimits { consumed: Some(self.read.clone()), max_unpacked, tap };
        super::read_limited(self.reader(), unpacked, limits).map_err(|error| InputError::Trace { name, error })
    }

    /// The whole input, from its first byte.
    pub(crate) fn reader(self) -> InputReader {
        std::io::BufReader::with_capacity(1 << 16, std::io::Cursor::new(self.head).chain(self.rest))
    }
}
