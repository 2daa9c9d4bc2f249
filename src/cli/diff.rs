//! `diff BASE NEW`: two runs of one program on one axis, what grew and
//! where, and a memory regression gate for CI (docs/user/diff.md).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{anyhow, Context, Result};
use clap::Args;

use super::args::InputError;
use super::io::trace_name;
use crate::alloc::Kind;
use crate::analysis::diff::{
    align, growth, requests_by_site, signed, Change, DiffReport, Growth, Holdings, Pair, Peaks, RunReport, Series,
};
use crate::analysis::human_bytes;
use crate::replay::ahead::Ahead;
use crate::replay::session::Start;
use crate::trace::input::{Input, InputKind};
use crate::trace::Trace;

#[derive(Args, Debug, Clone)]
pub struct DiffArgs {
    /// Draw without colour (also when NO_COLOR is set).
    #[arg(long)]
    pub(crate) no_color: bool,
    /// The run before the change: a PyTorch memory snapshot with history.
    pub(crate) base: PathBuf,
    /// The run after it.
    pub(crate) new: PathBuf,
    #[command(flatten)]
    pub(crate) torch: super::args::TorchArg,
    /// Print one JSON object (docs/user/json.md).
    #[arg(long)]
    pub(crate) json: bool,
    /// Exit 1 when the peak allocated, the peak reserved or what is alive at
    /// the end grew by more than this (`5%` or `0.05`; a bare number of 1 or
    /// more is refused): a memory regression gate for CI.
    #[arg(long, value_name = "PCT", value_parser = parse_share)]
    pub(crate) fail_on_growth: Option<f64>,
    /// Also write both timelines on one axis as a picture: SVG, or PNG when
    /// PATH ends in .png (for reports).
    #[arg(long, value_name = "PATH")]
    pub(crate) export: Option<PathBuf>,
    /// Replace an existing file at the --export path.
    #[arg(long)]
    pub(crate) force: bool,
    /// Rows of each table in the summary.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub(crate) top: usize,
    /// Most bytes a compressed input may unpack to.
    #[arg(long, value_name = "BYTES", value_parser = super::args::parse_capacity)]
    pub(crate) max_unpacked: Option<u64>,
}

/// "5%", "5 %" or "0.05" as 0.05.
fn parse_share(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let v = match t.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|x| x / 100.0),
        None => t.parse::<f64>(),
    }
    .map_err(|_| format!("{s:?} is not a share: give 5% or 0.05"))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("{s:?}: a share must be 0 or more"));
    }
    // `5` as 500% would make a CI gate that never fires: a bare number is a
    // share below 1, and anything larger must say its percent sign.
    if !t.ends_with('%') && v >= 1.0 {
        return Err(format!(
            "{s:?}: a bare number is a share (0.05 is 5%); did you mean {t}%? (write 100% or more with its sign)"
        ));
    }
    Ok(v)
}

/// One run replayed: its figures and what it held at its peak and end.
struct Replayed {
    report: RunReport,
    at_peak: Holdings,
    at_end: Holdings,
    requests: std::collections::BTreeMap<String, (u64, u64)>,
    window: bool,
    /// A snapshot without history: its state stands for peak and end.
    state_only: bool,
    series: Series,
}

/// How a side of a diff is opened: as recorded, the categories wanted.
fn open_options(torch: Option<crate::alloc::Release>) -> crate::replay::OpenOptions {
    crate::replay::OpenOptions { torch, categories: true, ..Default::default() }
}

/// `timeline`: keep the run's timeline (16 bytes an event), which only the
/// screen and the picture draw. `ahead`: the replay run behind the
/// decoding of `trace`, if one was.
fn replay_run(
    path: &std::path::Path,
    trace: &Trace,
    torch: Option<crate::alloc::Release>,
    timeline: bool,
    ahead: Option<&Ahead>,
) -> Result<Replayed> {
    let opened = crate::replay::open_ahead(trace, &path.display().to_string(), &open_options(torch), ahead)?;
    let (dev, session) = (opened.dev, &opened.session);
    if session.start == Start::StateOnly {
        // No history: the state when it was taken stands for peak and end.
        let cats = opened.categories();
        let held = Holdings::of_recorded(&dev.segments, &trace.stacks, &cats);
        let t = session.recorded;
        let point = crate::alloc::StatePoint { allocated: t.allocated_bytes, reserved: t.reserved_bytes };
        return Ok(Replayed {
            report: RunReport {
                trace: trace_name(path),
                events: 0,
                fidelity: "state-only",
                iterations: 0,
                peak_allocated_bytes: t.allocated_bytes,
                peak_reserved_bytes: t.reserved_bytes,
                end_allocated_bytes: t.allocated_bytes,
                num_alloc_retries: 0,
                num_ooms: 0,
            },
            at_peak: held.clone(),
            at_end: held,
            requests: std::collections::BTreeMap::new(),
            window: false,
            state_only: true,
            series: Series::new(vec![point], &[]),
        });
    }
    opened.require_exact("diff compares runs that replay exactly")?;
    let cats = opened.categories();
    let peak = session.exact.peak;
    let last = dev.events.len().checked_sub(1);
    // Two states are read: the peak's forwards, the end's from the exact
    // replay's end (a pass over the events fewer:
    // docs/measurements/benchmarks.md).
    let mut scrub = if timeline { session.forward_scrubber_with_timeline() } else { session.forward_scrubber() }
        .map_err(|d| opened.diverged(&d))?;
    let peak_segments = scrub.seek(peak.event).snapshot();
    let end_segments = match session.end_state() {
        Some(end) => end,
        None => scrub.seek(last.unwrap_or(0)).snapshot(),
    };
    let st = session.exact.allocator.stats();
    let marks = crate::analysis::iteration_marks(&dev.time_us, &trace.annotations, dev.device);
    let iterations = marks.len();
    let series = Series::new(if timeline { scrub.into_points() } else { Vec::new() }, &marks);
    Ok(Replayed {
        report: RunReport {
            trace: trace_name(path),
            events: dev.events.len(),
            fidelity: session.fidelity.name(),
            iterations,
            peak_allocated_bytes: peak.allocated,
            peak_reserved_bytes: st.get(Kind::ReservedBytes, 0).peak as u64,
            end_allocated_bytes: st.get(Kind::AllocatedBytes, 0).current as u64,
            num_alloc_retries: st.num_alloc_retries,
            num_ooms: st.num_ooms,
        },
        at_peak: Holdings::of(&peak_segments, &trace.stacks, &cats, Some(peak.event)),
        at_end: Holdings::of(&end_segments, &trace.stacks, &cats, last),
        requests: requests_by_site(dev, &trace.stacks),
        window: session.start == Start::Window,
        state_only: false,
        series,
    })
}

/// One side of a diff: a snapshot loaded and replayed, or a recording of
/// `run`/`record` read (samples of the live view); true for a recording.
/// `progress`: the loading line on a terminal (one side only says it).
fn run_of(
    input: Input,
    path: &std::path::Path,
    max_unpacked: Option<u64>,
    torch: Option<crate::alloc::Release>,
    progress: bool,
    timeline: bool,
    loaded: impl FnOnce(),
) -> Result<(Replayed, bool)> {
    if input.kind() == InputKind::Recording {
        let name = input.name().to_string();
        let snaps = super::live::read_recording(input.lines(max_unpacked)?, &name)?;
        return Ok((recorded_run(path, &snaps)?, true));
    }
    // The replay runs behind the decoding where it can
    // (docs/design/trace-decoding.md, "The replay behind the decoder").
    let ahead = open_options(torch).ahead();
    let tap = ahead.as_ref().map(Ahead::tap);
    let trace = super::io::load_tapped(input, max_unpacked, progress, tap)?;
    loaded();
    Ok((replay_run(path, &trace, torch, timeline, ahead.as_ref())?, false))
}

/// A recording's training process (the one that allocated most) as a run:
/// its true peaks, what it had allocated at the last sample, its retries
/// and OOMs, what its optimizer held at its last step's end, and its
/// samples as a timeline with its steps (docs/user/diff.md "Recordings").
fn recorded_run(path: &std::path::Path, snaps: &[crate::monitor::Snapshot]) -> Result<Replayed> {
    use crate::analysis::categories::Category;
    let pid = snaps.iter().flat_map(|s| &s.publishers).max_by_key(|p| p.peak_allocated()).map(|p| p.pid).ok_or_else(
        || {
            anyhow!(InputError(format!(
                "{}: the recording has no process that published its allocator",
                path.display()
            )))
        },
    )?;
    let mine: Vec<&crate::monitor::Published> =
        snaps.iter().filter_map(|s| s.publishers.iter().find(|p| p.pid == pid)).collect();
    let last = mine.last().copied().ok_or_else(|| anyhow!(InputError(format!("{}: no samples", path.display()))))?;
    let mut points = Vec::with_capacity(mine.len());
    let mut steps = Vec::new();
    let mut seen = 0u64;
    for (i, p) in mine.iter().enumerate() {
        points.push(crate::alloc::StatePoint { allocated: p.allocated(), reserved: p.reserved() });
        if let Some(s) = p.step_log.last() {
            if s.0 > seen {
                seen = s.0;
                steps.push(i);
            }
        }
    }
    let mut at_end = Holdings::default();
    if let Some(c) = last.categories {
        let b = c.bytes();
        for cat in Category::ALL {
            if b.get(cat) > 0 {
                at_end.by_category.insert(cat, (b.get(cat), 0));
            }
        }
    }
    let series = Series::new(points, &steps);
    Ok(Replayed {
        report: RunReport {
            trace: trace_name(path),
            events: mine.len(),
            fidelity: "recording",
            iterations: seen as usize,
            peak_allocated_bytes: mine.iter().map(|p| p.peak_allocated()).max().unwrap_or(0),
            peak_reserved_bytes: mine.iter().map(|p| p.peak_reserved()).max().unwrap_or(0),
            end_allocated_bytes: last.allocated(),
            num_alloc_retries: last.stat("num_alloc_retries") as i64,
            num_ooms: last.stat("num_ooms") as i64,
        },
        at_peak: Holdings::default(),
        at_end,
        requests: std::collections::BTreeMap::new(),
        window: false,
        state_only: false,
        series,
    })
}

/// The diff screen's app over two snapshots, as `diff` opens it on a
/// terminal.
pub fn diff_app(base: &std::path::Path, new: &std::path::Path, color: bool) -> Result<crate::ui::diff::DiffApp> {
    let model = compare(base, new, None, None, None, true)?;
    Ok(crate::ui::diff::DiffApp::new(model, color))
}

pub fn diff(args: &DiffArgs) -> Result<ExitCode> {
    use std::io::IsTerminal;
    let interactive = !args.json && std::io::stdout().is_terminal() && std::io::stdin().is_terminal();
    let timeline = interactive || args.export.is_some();
    let model = compare(&args.base, &args.new, args.fail_on_growth, args.max_unpacked, args.torch.release, timeline)?;
    let regressions = model.report.regressions.clone();
    if let Some(path) = &args.export {
        let svg = crate::export::picture::diff_svg(&model, 1600);
        let bytes = if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("png")) {
            crate::export::picture::png(&svg).map_err(|e| anyhow!("{}: {e}", path.display()))?
        } else {
            svg.into_bytes()
        };
        crate::private::write_report(path, &bytes, args.force)
            .map_err(|e| anyhow!(InputError(format!("{}: {e}", path.display()))))?;
        eprintln!("gpumem-top: wrote {} ({} bytes)", path.display(), bytes.len());
    }
    if interactive {
        let color = super::io::color(args.no_color);
        let mut app = crate::ui::diff::DiffApp::new(model, color);
        crate::ui::event::run_app(&mut app, crate::ui::event::Events::new()).context("terminal")?;
        return Ok(gate(&regressions));
    }
    let mut so = super::io::text_out();
    if args.json {
        serde_json::to_writer(&mut so, &model.report)?;
        writeln!(so)?;
    } else {
        write!(so, "{}", summary(&model.report, args.top))?;
    }
    drop(so);
    Ok(gate(&regressions))
}

/// The note of an edited script: how many call sites moved, the first three.
fn moved_note(moved: &[crate::analysis::diff::Moved]) -> String {
    let first: Vec<String> = moved
        .iter()
        .take(3)
        .map(|m| {
            let line = m.new.split(':').nth(1).and_then(|t| t.split(' ').next()).unwrap_or("?");
            format!("{} now at line {line}", m.base)
        })
        .collect();
    format!(
        "the script was edited between the runs: {} call site{} moved and {} compared as one (the same file, function and library frames; {}{})",
        moved.len(),
        if moved.len() == 1 { "" } else { "s" },
        if moved.len() == 1 { "is" } else { "are" },
        first.join("; "),
        if moved.len() > 3 { "; …" } else { "" }
    )
}

/// What grew more than `limit` (a fraction) between the runs' peaks and
/// ends, said as `--fail-on-growth` reports it.
fn regressions(peak: &Peaks, limit: f64) -> Vec<String> {
    let mut out = Vec::new();
    for (what, p) in [
        ("peak allocated", peak.allocated),
        ("peak reserved", peak.reserved),
        ("allocated at the end", peak.end_allocated),
    ] {
        let g = growth(p.base, p.new);
        if g > limit {
            out.push(format!(
                "{what} grew {} ({} → {}), more than {:.1}%",
                if g.is_finite() { format!("{:+.1}%", g * 100.0) } else { "from nothing".into() },
                human_bytes(p.base),
                human_bytes(p.new),
                limit * 100.0
            ));
        }
    }
    out
}

/// Both runs replayed and compared.
fn compare(
    base: &std::path::Path,
    new: &std::path::Path,
    fail_on_growth: Option<f64>,
    max_unpacked: Option<u64>,
    torch: Option<crate::alloc::Release>,
    timeline: bool,
) -> Result<crate::analysis::diff::DiffModel> {
    let (bi, ni) = (Input::open(base)?, Input::open(new)?);
    if bi.kind() != ni.kind() {
        return Err(anyhow!(InputError(format!(
            "{} and {}: diff compares two snapshots, or two recordings of run/record, not one of each",
            base.display(),
            new.display()
        ))));
    }
    // Each run is replayed on a thread of its own, the second loaded once a
    // third of the first's file is read: the first's decoding then holds a
    // third of what it will, so the two peaks do not meet (the first is
    // done when the second is two thirds through), and the decodings (each
    // bound by one thread) overlap by two thirds
    // (docs/measurements/benchmarks.md, "diff's decodings overlapping",
    // "diff's second decoding from a third").
    let (first_loaded, wait) = std::sync::mpsc::channel::<()>();
    let (size, read) = bi.progress();
    let (b, n) = std::thread::scope(|s| {
        let n = s.spawn(move || {
            // Err: the first run ended (or failed) before it said so. A
            // file of unknown size (a pipe) is waited for whole.
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                wait.recv_timeout(std::time::Duration::from_millis(10))
            {
                if size > 0 && read.load(std::sync::atomic::Ordering::Relaxed) >= size / 3 {
                    break;
                }
            }
            run_of(ni, new, max_unpacked, torch, false, timeline, || {})
        });
        let b = run_of(bi, base, max_unpacked, torch, true, timeline, move || {
            let _ = first_loaded.send(());
        });
        (b, n.join())
    });
    let (b, recordings) = b?;
    let (n, _) = n.map_err(|_| anyhow!("{}: its replay stopped with a panic", new.display()))??;
    // An edit of the script moves its lines: the call sites that moved are
    // compared as one (docs/user/diff.md, "Edited scripts").
    let (mut b, n) = (b, n);
    fn labels(r: &Replayed) -> std::collections::BTreeSet<&str> {
        let all = r.requests.keys().chain(r.at_peak.by_call_site.keys()).chain(r.at_end.by_call_site.keys());
        all.map(String::as_str).collect()
    }
    let moved = crate::analysis::diff::moved_sites(&labels(&b), &labels(&n), |in_new, l| {
        let r = if in_new { &n.requests } else { &b.requests };
        r.get(l).copied().unwrap_or_default()
    });
    if !moved.is_empty() {
        use crate::analysis::diff::relabel;
        b.requests = relabel(std::mem::take(&mut b.requests), &moved);
        b.at_peak.by_call_site = relabel(std::mem::take(&mut b.at_peak.by_call_site), &moved);
        b.at_end.by_call_site = relabel(std::mem::take(&mut b.at_end.by_call_site), &moved);
    }
    let (requests, aligned_share) = align(&b.requests, &n.requests);
    let mut notes = Vec::new();
    for r in [&b, &n].into_iter().filter(|r| r.state_only) {
        notes.push(format!(
            "{} is a snapshot without memory history: its figures are its state when taken (no peaks, requests, retries or OOMs), so \"peak\" compares that state, and its categories come from its blocks' own stacks",
            r.report.trace
        ));
    }
    if !moved.is_empty() {
        notes.push(moved_note(&moved));
    }
    if recordings {
        notes.push("two recordings: peaks are each training process's true peaks, the end its last sample; a recording carries no call sites, and its categories are what the optimizer held at its last step's end (parameters, gradients, optimizer state, the rest)".to_string());
    }
    if b.window || n.window {
        notes.push("a trace is a window of a longer run (its ring buffer wrapped): its peaks and requests are the window's, not the whole run's".to_string());
    }
    if b.report.iterations != n.report.iterations {
        notes.push(format!(
            "the runs saw {} and {} optimizer steps: request totals differ by that too",
            b.report.iterations, n.report.iterations
        ));
    }
    // Little in common: two different programs, said rather than listed.
    // (A run with no requests, state only or an empty window, tells nothing.)
    let unrelated = aligned_share < 0.5 && !b.requests.is_empty() && !n.requests.is_empty();
    if unrelated {
        notes.push(format!(
            "only {:.0}% of the requested bytes come from call sites both runs have: these look like two different programs, and a line-by-line comparison would be noise",
            aligned_share * 100.0
        ));
    }
    let peak = Peaks {
        allocated: Pair::of(b.report.peak_allocated_bytes, n.report.peak_allocated_bytes),
        reserved: Pair::of(b.report.peak_reserved_bytes, n.report.peak_reserved_bytes),
        end_allocated: Pair::of(b.report.end_allocated_bytes, n.report.end_allocated_bytes),
        num_alloc_retries: [b.report.num_alloc_retries, n.report.num_alloc_retries],
        num_ooms: [b.report.num_ooms, n.report.num_ooms],
    };
    let regressions = fail_on_growth.map(|limit| regressions(&peak, limit)).unwrap_or_default();
    let mut report = DiffReport {
        at_peak: Growth::between(&b.at_peak, &n.at_peak),
        at_end: Growth::between(&b.at_end, &n.at_end),
        base: b.report,
        new: n.report,
        peak,
        requests: if unrelated { Vec::new() } else { requests },
        aligned_share,
        moved_call_sites: moved,
        notes,
        regressions,
    };
    if unrelated {
        report.at_peak.by_call_site.clear();
        report.at_end.by_call_site.clear();
    }
    Ok(crate::analysis::diff::DiffModel { report, base: b.series, new: n.series })
}

/// The exit status of the gate, its reasons on stderr.
fn gate(regressions: &[String]) -> ExitCode {
    if regressions.is_empty() {
        return ExitCode::SUCCESS;
    }
    for r in regressions {
        eprintln!("gpumem-top diff: {r}");
    }
    ExitCode::from(1)
}

fn summary(r: &DiffReport, top: usize) -> String {
    let mut o = String::new();
    o.push_str(&format!("gpumem-top diff: {} → {}\n", r.base.trace, r.new.trace));
    for n in &r.notes {
        o.push_str(&format!("note: {n}\n"));
    }
    o.push_str(&format!("\n{:<24}{:>14}{:>14}{:>22}\n", "", "base", "new", "change"));
    let row = |o: &mut String, what: &str, p: &Pair| {
        let g = p.growth.map(|g| format!(" ({:+.1}%)", g * 100.0)).unwrap_or_default();
        o.push_str(&format!(
            "{what:<24}{:>14}{:>14}{:>22}\n",
            human_bytes(p.base),
            human_bytes(p.new),
            format!("{}{g}", signed(p.delta, human_bytes))
        ));
    };
    row(&mut o, "peak allocated", &r.peak.allocated);
    row(&mut o, "peak reserved", &r.peak.reserved);
    row(&mut o, "alive at the end", &r.peak.end_allocated);
    o.push_str(&format!(
        "{:<24}{:>14}{:>14}\n",
        "retries / OOMs",
        format!("{} / {}", r.peak.num_alloc_retries[0], r.peak.num_ooms[0]),
        format!("{} / {}", r.peak.num_alloc_retries[1], r.peak.num_ooms[1])
    ));
    for (title, g) in [("at the peak", &r.at_peak), ("at the end (what is still alive)", &r.at_end)] {
        if !g.by_category.is_empty() {
            o.push_str(&format!("\n{title}, by category:\n"));
            for c in g.by_category.iter().take(top) {
                let name = c.category.map_or("", |c| c.plural());
                o.push_str(&format!(
                    "  {:>12}  {name:<16} {} → {}\n",
                    signed(c.delta_bytes, human_bytes),
                    human_bytes(c.base_bytes),
                    human_bytes(c.new_bytes)
                ));
            }
        }
        if !g.by_call_site.is_empty() {
            o.push_str(&format!("{title}, by call site:\n"));
            for c in g.by_call_site.iter().take(top) {
                o.push_str(&format!(
                    "  {:>12}  {} ({} → {} blocks)\n",
                    signed(c.delta_bytes, human_bytes),
                    c.call_site.as_deref().unwrap_or(""),
                    c.base_blocks,
                    c.blocks
                ));
            }
        }
    }
    if !r.requests.is_empty() {
        o.push_str("\nrequests by call site (whole runs):\n");
        for q in r.requests.iter().take(top) {
            let what = match (q.change, q.ratio) {
                (Change::New, _) => format!("new: {} in {} allocations", human_bytes(q.new_bytes), q.new_allocations),
                (Change::Gone, _) => {
                    format!("gone: was {} in {} allocations", human_bytes(q.base_bytes), q.base_allocations)
                }
                (_, Some(x)) => format!(
                    "{} {:.2}×: {} → {} ({} → {} allocations)",
                    q.change.name(),
                    x,
                    human_bytes(q.base_bytes),
                    human_bytes(q.new_bytes),
                    q.base_allocations,
                    q.new_allocations
                ),
                _ => String::new(),
            };
            o.push_str(&format!("  {}  {what}\n", q.call_site));
        }
    }
    if !r.regressions.is_empty() {
        o.push_str("\nregressions past --fail-on-growth:\n");
        for x in &r.regressions {
            o.push_str(&format!("  {x}\n"));
        }
    }
    o
}
