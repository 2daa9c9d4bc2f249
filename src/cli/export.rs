//! `export`: one view of a trace (or of a recording's process) at one
//! moment, as SVG, PNG or text.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{anyhow, Result};
use clap::Args;

use super::args::{parse_capacity, At, InputError, TorchArg};
use super::io::{load_tapped, trace_name};
use super::live::read_recording;
use super::replay::{check_at, oom_index};
use crate::replay::ahead::Ahead;
use crate::replay::session::Start;
use crate::replay::OpenOptions;
use crate::trace::input::{Input, InputKind};

#[derive(Args, Debug, Clone)]
pub struct ExportArgs {
    /// A PyTorch memory snapshot that replays exactly (.pickle, .pickle.gz).
    pub(crate) trace: PathBuf,
    #[command(flatten)]
    pub(crate) torch: TorchArg,
    #[arg(long, value_enum)]
    pub(crate) view: crate::export::picture::ViewKind,
    /// The moment shown: an event index, peak (default), oom or end.
    #[arg(long, value_name = "EVENT|peak|oom|end")]
    pub(crate) at: Option<At>,
    #[arg(long, value_enum)]
    pub(crate) format: crate::export::picture::Format,
    /// Where to write (default: TRACE-VIEW-AT.FORMAT here; `-`: stdout).
    #[arg(short = 'o', long = "output", value_name = "PATH")]
    pub(crate) output: Option<PathBuf>,
    /// Picture width in pixels (SVG and PNG; text gets a column per 10).
    #[arg(long, value_name = "PX", default_value_t = 1600)]
    pub(crate) width: u32,
    /// Text without ANSI colours.
    #[arg(long)]
    pub(crate) plain: bool,
    /// Colour the map (and the text timeline) by block state, or by what the
    /// memory is (docs/user/categories.md); the allocated bar is split by
    /// category either way.
    #[arg(long, value_enum, default_value = "state")]
    pub(crate) by: crate::view::parts::ColorBy,
    /// Replace an existing file at the output path (the path itself: a link
    /// there is removed, never followed); without it an existing path is
    /// refused.
    #[arg(long)]
    pub(crate) force: bool,
    /// Per-process memory limit in bytes (as the run had it).
    #[arg(long, value_name = "BYTES", value_parser = parse_capacity)]
    pub(crate) memory_limit: Option<u64>,
    /// Which device of a multi-GPU snapshot (default: the busiest).
    #[arg(long, value_name = "N")]
    pub(crate) device: Option<i32>,
    /// Most bytes a compressed input may unpack to (default: 64 times the
    /// file plus 256 MiB).
    #[arg(long, value_name = "BYTES", value_parser = parse_capacity)]
    pub(crate) max_unpacked: Option<u64>,
    /// With a recording: the process drawn (default: the one that reserved
    /// the most); `--at N` is then sample N as its screen numbers them (1
    /// the first).
    #[arg(long, value_name = "PID")]
    pub(crate) pid: Option<u32>,
}

/// `export`: one view of a trace at one moment, as SVG, PNG or text.
pub fn export(args: &ExportArgs) -> Result<ExitCode> {
    if !(400..=8000).contains(&args.width) {
        return Err(anyhow!(InputError(format!("--width must be 400..8000 pixels, got {}", args.width))));
    }
    let input = Input::open(&args.trace)?;
    if input.kind() == InputKind::Recording {
        let name = input.name().to_string();
        let snaps = read_recording(input.lines(args.max_unpacked)?, &name)?;
        return export_recording(args, snaps);
    }
    if args.pid.is_some() {
        return Err(anyhow!(InputError(format!(
            "--pid picks a process of a recording; {} is a trace of one process",
            args.trace.display()
        ))));
    }
    let opts = OpenOptions {
        device: args.device,
        memory_limit: args.memory_limit,
        torch: args.torch.release,
        // Every picture colours blocks by category.
        categories: true,
        scrub_every: Some(crate::replay::model::ReplayModel::STILL),
        ..OpenOptions::default()
    };
    // The replay and the timeline's pass run behind the decoding where
    // they can (docs/design/trace-decoding.md).
    let ahead = opts.ahead();
    let trace = load_tapped(input, args.max_unpacked, true, ahead.as_ref().map(Ahead::tap))?;
    check_at(args.at, crate::replay::open::device(&trace, &args.trace.display().to_string(), args.device)?)?;
    let opened = crate::replay::open_ahead(&trace, &args.trace.display().to_string(), &opts, ahead.as_ref())?;
    opened.require_exact("export draws runs that replay exactly")?;
    // A snapshot without history has no timeline: an empty chart would
    // say nothing.
    if opened.session.start == Start::StateOnly && args.view == crate::export::picture::ViewKind::Timeline {
        return Err(anyhow!(InputError(format!(
            "{}: the snapshot has no timeline (it was taken without memory history, so it holds its state only); export --view fragmap or bars, or record with torch.cuda.memory._record_memory_history",
            args.trace.display()
        ))));
    }
    // One picture: the cursor goes to one event, forwards.
    let mut model = opened.still_model(trace_name(&args.trace))?;
    let dev = opened.dev;
    let last = dev.events.len().saturating_sub(1);
    let at = args.at.unwrap_or(At::Peak);
    let cursor = match at {
        At::Event(i) => i.min(last),
        At::End => last,
        At::Oom => oom_index(dev.events.view())
            .ok_or_else(|| anyhow!(InputError(format!("--at oom: {} has no OOM", args.trace.display()))))?,
        At::Peak => model.peak_at.unwrap_or(0),
    };
    let bytes =
        crate::export::replay::picture(&mut model, cursor, args.view, args.format, args.width, args.plain, args.by)
            .map_err(|e| anyhow!(e))?;
    write_export(args, &bytes, &format!("{cursor}"), &format!("event {cursor}"))
}

/// Writes an export to `-o` (`-`: stdout), else to
/// `STEM-VIEW-WHERE.FORMAT` here, STEM the letters, digits, '_' and '-' of
/// the input's name before its first dot ("(pipe)": "pipe"); never over an
/// existing file without `--force`.
fn write_export(args: &ExportArgs, bytes: &[u8], place: &str, said: &str) -> Result<ExitCode> {
    use crate::export::picture::Format;
    let ext = match args.format {
        Format::Svg => "svg",
        Format::Png => "png",
        Format::Txt => "txt",
    };
    let view = format!("{:?}", args.view).to_lowercase();
    let stem: String = trace_name(&args.trace)
        .split('.')
        .next()
        .unwrap_or("")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .collect();
    let stem = if stem.is_empty() { "trace".to_string() } else { stem };
    let out = args.output.clone().unwrap_or_else(|| PathBuf::from(format!("{stem}-{view}-{place}.{ext}")));
    // `x.svg` holding PNG bytes opens nowhere: a known picture extension
    // must agree with the format.
    let named = out.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    if let Some(named) = named.filter(|n| ["svg", "png", "txt"].contains(&n.as_str()) && n != ext) {
        return Err(anyhow!(InputError(format!(
            "{}: the name says {named} but --format is {ext}; name it .{ext} or pass --format {named}",
            out.display()
        ))));
    }
    if out.as_os_str() == "-" {
        // The text export's own colours are escapes; what an input brought
        // into its cells was dropped when they were drawn (view::set_line).
        std::io::stdout().lock().write_all(bytes)?;
    } else {
        crate::private::write_report(&out, bytes, args.force)
            .map_err(|e| anyhow!(InputError(format!("{}: {e}", out.display()))))?;
        eprintln!("gpumem-top: wrote {} ({} bytes, {said})", out.display(), bytes.len());
    }
    Ok(ExitCode::SUCCESS)
}

/// `export RECORDING`: one process of a recording at one sample, drawn as
/// the live view drew it (docs/user/live.md "Recordings").
fn export_recording(args: &ExportArgs, snaps: Vec<crate::monitor::Snapshot>) -> Result<ExitCode> {
    use crate::export::picture::Format;
    let bad = |m: String| anyhow!(InputError(format!("{}: {m}", args.trace.display())));
    let mut full = crate::monitor::model::LiveModel::default();
    for s in &snaps {
        full.ingest(s.clone());
    }
    let key = match args.pid {
        Some(pid) => full.procs.keys().copied().find(|k| k.1 == pid).ok_or_else(|| {
            let pids: Vec<String> = full.procs.keys().map(|k| k.1.to_string()).collect();
            bad(format!("no process {pid} in the recording (it has: {})", pids.join(", ")))
        })?,
        None => full
            .procs
            .iter()
            .max_by_key(|(k, h)| (h.last.peak_reserved(), std::cmp::Reverse(**k)))
            .map(|(k, _)| *k)
            .ok_or_else(|| bad("no process published its allocator state in the recording".into()))?,
    };
    let (dev, pid) = key;
    let of = |i: usize| snaps.get(i).and_then(|s| s.publisher(dev, pid));
    let seen: Vec<usize> = (0..snaps.len()).filter(|&i| of(i).is_some()).collect();
    let (first, last) = match (seen.first(), seen.last()) {
        (Some(&f), Some(&l)) => (f, l),
        _ => return Err(bad(format!("pid {pid} published nothing"))),
    };
    let h = &full.procs[&key];
    let sample = match args.at.unwrap_or(At::Peak) {
        At::Event(n) if (1..=snaps.len()).contains(&n) => n - 1,
        At::Event(n) => {
            return Err(bad(format!(
                "--at {n}: the recording has samples 1 to {} (as its screen numbers them)",
                snaps.len()
            )))
        }
        At::End => last,
        // The first sample that shows the timeline's peak (a step's own
        // peak falls between samples), as `p` on the screen.
        At::Peak => h
            .peak_time()
            .and_then(|t| seen.iter().copied().find(|&i| of(i).is_some_and(|p| p.time >= t)))
            .unwrap_or(last),
        At::Oom => {
            let ooms = |i: usize| of(i).map_or(0, |p| p.stat("num_ooms"));
            seen.iter()
                .copied()
                .find(|&i| i > first && ooms(i) > ooms(first))
                .or((ooms(first) > 0).then_some(first))
                .ok_or_else(|| bad(format!("--at oom: pid {pid} had no OOM")))?
        }
    };
    let n = snaps.len();
    let model = full.as_of(&snaps, sample);
    let Some(hist) = model.procs.get(&key) else {
        return Err(bad(format!("pid {pid} had not published by sample {}", sample + 1)));
    };
    let note = format!(" · sample {} of {}", sample + 1, snaps.len());

    let bytes = match args.format {
        Format::Svg => crate::export::live::process_svg(hist, &hist.last, args.view, args.width, &note).into_bytes(),
        Format::Png => crate::export::picture::png(&crate::export::live::process_svg(
            hist, &hist.last, args.view, args.width, &note,
        ))
        .map_err(|e| anyhow!(e))?,
        Format::Txt => {
            // The live view's screen at that sample, as the terminal shows it.
            let mut app = crate::ui::recording::RecordingApp::new(&trace_name(&args.trace), snaps, !args.plain);
            app.show_process(sample, dev, pid);
            let cols = (args.width / 10).clamp(80, 800) as u16;
            let mut buf = ratatui_core::buffer::Buffer::empty(ratatui_core::layout::Rect::new(0, 0, cols, 50));
            let area = buf.area;
            crate::ui::event::Interactive::draw_into(&app, area, &mut buf);
            crate::export::text::from_buffer(&buf, !args.plain).into_bytes()
        }
    };
    write_export(
        args,
        &bytes,
        &format!("pid{pid}-sample{}", sample + 1),
        &format!("pid {pid}, sample {} of {n}", sample + 1),
    )
}
