//! What commands share to read their input and write their output: an
//! input read with a progress line, how a trace is named, escaped
//! standard output, colour or not.

use std::io::IsTerminal;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::analysis::human_bytes;
use crate::trace::input::Input;
use crate::trace::{self, Tap, Trace};

/// Standard output for what a command prints as text or JSON: control
/// characters an input brought are escaped (docs/design/security.md).
pub(crate) fn text_out() -> trace::printable::Escaped<std::io::StdoutLock<'static>> {
    trace::printable::Escaped::new(std::io::stdout().lock())
}

/// Colour on a screen: not with `--no-color`, nor under NO_COLOR (set and not empty).
pub(crate) fn color(no_color: bool) -> bool {
    !no_color && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// How a trace is named on screens and in reports: its file name, or for
/// a pipe (`<(zcat x)` is `/dev/fd/63`) or `-`, "(pipe)" / "(stdin)"
/// rather than a number.
pub(crate) fn trace_name(path: &Path) -> String {
    let s = path.to_string_lossy();
    if s == "-" {
        return "(stdin)".into();
    }
    if s.starts_with("/dev/fd/") || s.starts_with("/proc/self/fd/") {
        return "(pipe)".into();
    }
    path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_else(|| s.into_owned())
}

/// Loads the trace at `path` (`load_input` of it).
pub(crate) fn load_with_progress(path: &Path) -> Result<Trace> {
    load_input(Input::open(path)?, None)
}

/// Loads a trace from an input under the bounds of docs/user/input.md
/// (`max_unpacked`: `--max-unpacked`); when that takes over a second and
/// stderr is a terminal, shows how much of the file has been read.
pub(crate) fn load_input(input: Input, max_unpacked: Option<u64>) -> Result<Trace> {
    load_with(input, max_unpacked, std::io::stderr().is_terminal(), None)
}

/// `load_input` (`progress`: with its line where stderr is a terminal;
/// without, for a screen's own terminal),
/// a PyTorch snapshot's events given to `tap` as they are decoded (a
/// replay behind the decoding: `replay::ahead`).
pub(crate) fn load_tapped(input: Input, max_unpacked: Option<u64>, progress: bool, tap: Option<Tap>) -> Result<Trace> {
    load_with(input, max_unpacked, progress && std::io::stderr().is_terminal(), tap)
}

fn load_with(input: Input, max_unpacked: Option<u64>, show: bool, tap: Option<Tap>) -> Result<Trace> {
    let (total, n) = input.progress();
    let name = input.name().to_string();
    let done = Arc::new(AtomicBool::new(false));
    let progress = show.then(|| {
        let done = done.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            let mut shown = false;
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                if start.elapsed() >= Duration::from_secs(1) && !done.load(Ordering::Relaxed) {
                    let read = n.load(Ordering::Relaxed);
                    match (100 * read).checked_div(total) {
                        Some(pct) => eprint!("\rloading {name}: {pct}% "),
                        // A pipe or FIFO has no size to compare with.
                        None => eprint!("\rloading {name}: {} read ", human_bytes(read)),
                    }
                    shown = true;
                }
            }
            if shown {
                eprint!("\r\x1b[2K");
            }
        })
    });
    let out = input.read_trace_tapped(max_unpacked, tap);
    done.store(true, Ordering::Relaxed);
    if let Some(h) = progress {
        let _ = h.join();
    }
    Ok(out?)
}
