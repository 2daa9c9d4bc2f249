//! `diff BASE NEW`: two runs of one program on one axis, what grew and
//! where, and a memory regression gate for CI (docs/diff.md).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{anyhow, Result};
use clap::Args;
use serde::Serialize;

use super::{load_input, pick_device, trace_name, Input, InputError, DEFAULT_DEVICE_TOTAL};
use crate::alloc::Kind;
use crate::analysis::categories::{start_blocks, Categories};
use crate::analysis::diff::{align, growth, requests_by_site, Growth, Holdings, RequestRow};
use crate::analysis::human_bytes;
use crate::replay::session::{Session, Start, Want};
use crate::trace::Trace;

#[derive(Args, Debug, Clone)]
pub struct DiffArgs {
    /// The run before the change: a PyTorch memory snapshot with history.
    pub(crate) base: PathBuf,
    /// The run after it.
    pub(crate) new: PathBuf,
    /// Print one JSON object (docs/json.md).
    #[arg(long)]
    pub(crate) json: bool,
    /// Exit 1 when the peak allocated, the peak reserved or what is alive at
    /// the end grew by more than this (`5%` or `0.05`): a memory regression
    /// gate for CI.
    #[arg(long, value_name = "PCT", value_parser = parse_share)]
    pub(crate) fail_on_growth: Option<f64>,
    /// Rows of each table in the summary.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub(crate) top: usize,
    /// Most bytes a compressed input may unpack to.
    #[arg(long, value_name = "BYTES", value_parser = super::parse_size)]
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
    Ok(v)
}

/// One run's own figures, as its own replay gives them.
#[derive(Debug, Clone, Serialize)]
struct RunReport {
    trace: String,
    events: usize,
    /// "exact" or "exact-window"; a window's peaks are the window's.
    fidelity: &'static str,
    /// Optimizer steps seen (its `Optimizer.step` markers).
    iterations: usize,
    peak_allocated_bytes: u64,
    peak_reserved_bytes: u64,
    /// Allocated at the end of the trace: what is still alive.
    end_allocated_bytes: u64,
    num_alloc_retries: i64,
    num_ooms: i64,
}

/// A figure in both runs.
#[derive(Debug, Clone, Copy, Serialize)]
struct Pair {
    base: u64,
    new: u64,
    delta: i64,
    /// new / base − 1 (null when base is 0).
    growth: Option<f64>,
}

impl Pair {
    fn of(base: u64, new: u64) -> Pair {
        let g = growth(base, new);
        Pair { base, new, delta: new as i64 - base as i64, growth: g.is_finite().then_some(g) }
    }
}

#[derive(Debug, Clone, Serialize)]
struct Peaks {
    allocated: Pair,
    reserved: Pair,
    end_allocated: Pair,
    num_alloc_retries: [i64; 2],
    num_ooms: [i64; 2],
}

#[derive(Debug, Serialize)]
struct DiffReport {
    base: RunReport,
    new: RunReport,
    peak: Peaks,
    at_peak: Growth,
    at_end: Growth,
    /// Requests aligned by call site: new, gone, grown or shrunk lines.
    requests: Vec<RequestRow>,
    /// Share of the requested bytes whose call site both runs have.
    aligned_share: f64,
    /// What the comparison covers, and its limits.
    notes: Vec<String>,
    /// With `--fail-on-growth`: what grew past it (empty: the gate passes).
    regressions: Vec<String>,
}

/// One run replayed: its figures and what it held at its peak and end.
struct Replayed {
    report: RunReport,
    at_peak: Holdings,
    at_end: Holdings,
    requests: std::collections::BTreeMap<String, (u64, u64)>,
    window: bool,
}

fn replay_run(path: &std::path::Path, trace: &Trace) -> Result<Replayed> {
    let bad = |e: String| anyhow!(InputError(format!("{}: {e}", path.display())));
    let dev = pick_device(trace, None)?;
    let conf = trace.settings.as_ref().map(|s| s.config()).unwrap_or_default();
    let session = Session::open(dev, &trace.stacks, &Want::exact(conf, DEFAULT_DEVICE_TOTAL)).map_err(bad)?;
    if session.start == Start::StateOnly {
        return Err(bad("a snapshot without memory history has no peak or requests to compare; record with torch.cuda.memory._record_memory_history(context=\"alloc\", stacks=\"python\")".into()));
    }
    if !session.fidelity.is_faithful() {
        let why = session.divergence().map(|d| format!(" at event {}: {}", d.event, d.reason)).unwrap_or_default();
        return Err(bad(format!(
            "its replay is {}{why}; diff compares runs that replay exactly",
            session.fidelity.name()
        )));
    }
    let cats = Categories::of(
        dev,
        &trace.stacks,
        &trace.annotations,
        &start_blocks(dev, &session.seed),
        Some(session.exact.allocated.as_slice()),
    );
    let peak = session.exact.peak;
    let last = dev.events.len().checked_sub(1);
    let mut scrub = session.scrubber(1024).map_err(|d| bad(d.reason))?;
    let peak_segments = scrub.seek(peak.event).snapshot();
    let end_segments = scrub.seek(last.unwrap_or(0)).snapshot();
    let st = session.exact.allocator.stats();
    let iterations = crate::analysis::iteration_marks(&dev.time_us, &trace.annotations, dev.device).len();
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
    })
}

fn load(path: &std::path::Path, max_unpacked: Option<u64>) -> Result<Trace> {
    let input = Input::open(path)?;
    if input.is_recording() {
        return Err(anyhow!(InputError(format!(
            "{}: a recording of samples has no allocations to align; diff two snapshots taken with memory history",
            path.display()
        ))));
    }
    load_input(input, max_unpacked)
}

pub fn diff(args: &DiffArgs) -> Result<ExitCode> {
    let (bt, nt) = (load(&args.base, args.max_unpacked)?, load(&args.new, args.max_unpacked)?);
    let (b, n) = (replay_run(&args.base, &bt)?, replay_run(&args.new, &nt)?);
    let (requests, aligned_share) = align(&b.requests, &n.requests);
    let mut notes = Vec::new();
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
    let unrelated = aligned_share < 0.5;
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
    let mut regressions = Vec::new();
    if let Some(limit) = args.fail_on_growth {
        for (what, p) in [
            ("peak allocated", peak.allocated),
            ("peak reserved", peak.reserved),
            ("allocated at the end", peak.end_allocated),
        ] {
            let g = growth(p.base, p.new);
            if g > limit {
                regressions.push(format!(
                    "{what} grew {} ({} → {}), more than {:.1}%",
                    if g.is_finite() { format!("{:+.1}%", g * 100.0) } else { "from nothing".into() },
                    human_bytes(p.base),
                    human_bytes(p.new),
                    limit * 100.0
                ));
            }
        }
    }
    let mut report = DiffReport {
        at_peak: Growth::between(&b.at_peak, &n.at_peak),
        at_end: Growth::between(&b.at_end, &n.at_end),
        base: b.report,
        new: n.report,
        peak,
        requests: if unrelated { Vec::new() } else { requests },
        aligned_share,
        notes,
        regressions,
    };
    if unrelated {
        report.at_peak.by_call_site.clear();
        report.at_end.by_call_site.clear();
    }
    let mut so = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer(&mut so, &report)?;
        writeln!(so)?;
    } else {
        write!(so, "{}", summary(&report, args.top))?;
    }
    drop(so);
    if report.regressions.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    for r in &report.regressions {
        eprintln!("gpumem-top diff: {r}");
    }
    Ok(ExitCode::from(1))
}

fn signed(d: i64) -> String {
    let s = human_bytes(d.unsigned_abs());
    if d < 0 {
        format!("-{s}")
    } else {
        format!("+{s}")
    }
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
            format!("{}{g}", signed(p.delta))
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
                    signed(c.delta_bytes),
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
                    signed(c.delta_bytes),
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
                ("new", _) => format!("new: {} in {} allocations", human_bytes(q.new_bytes), q.new_allocations),
                ("gone", _) => format!("gone: was {} in {} allocations", human_bytes(q.base_bytes), q.base_allocations),
                (_, Some(x)) => format!(
                    "{} {:.2}×: {} → {} ({} → {} allocations)",
                    q.change,
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
