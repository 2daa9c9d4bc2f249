//! `replay` of one input: the replay, then the interactive view, the
//! summary (as `torch.cuda.memory_summary()` lays it out) or the JSON
//! report (docs/user/json.md), all from one `Replayed`.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{anyhow, Context, Result};

use clap::Args;

use super::args::{parse_capacity, parse_conf, At, InputError, MemoryCap, TorchArg};
use super::io::{color, load_tapped, trace_name};
use super::live::{read_recording, replay_recording};
use crate::alloc::{AllocatorConfig, DeviceStats, Kind, SegmentInfo};
use crate::analysis::categories::Categories;
use crate::analysis::{fragmentation, human_bytes, peak_ratio};
use crate::device::{CUDA_CONTEXT_BYTES, DEFAULT_DEVICE_TOTAL};
use crate::replay::ahead::Ahead;
use crate::replay::model::ReplayModel;
use crate::replay::report::{self, CompareRow, ReplayReport};
use crate::replay::session::{Fidelity, Session, Start};
use crate::replay::whatif::run_requests;
use crate::replay::{OpenError, OpenOptions, Opened, ReplayResult};
use crate::trace::input::{Input, InputKind};
use crate::trace::{self, CallStacks, DeviceTrace, Trace};

/// `replay` of one input, its report written to `so`; `terminal`: the
/// interactive view may open (stdout and stdin are terminals).
pub(crate) fn replay_to(args: &ReplayArgs, so: &mut dyn Write, terminal: bool) -> Result<ExitCode> {
    let started = Instant::now();
    let input = Input::open(&args.trace)?;
    if input.kind() == InputKind::Recording {
        let name = input.name().to_string();
        let snaps = read_recording(input.lines(args.max_unpacked)?, &name)?;
        return replay_recording(&args.trace, snaps, args.json);
    }
    args.cap.check()?;
    let what_if_conf = args.alloc_conf.as_deref().map(parse_conf).transpose()?;
    args.compare.iter().try_for_each(|c| parse_conf(c).map(drop))?;
    // The replay these options open runs behind the decoding where it can
    // (docs/design/trace-decoding.md, "The replay behind the decoder").
    let opts = open_options(args, what_if_conf, args.cap.limit(args.device_total), opens_screen(args, terminal));
    let ahead = opts.ahead();
    let trace = load_tapped(input, args.max_unpacked, true, ahead.as_ref().map(Ahead::tap))?;
    replay_trace(args, &trace, so, terminal, started, ahead.as_ref())
}

/// `replay_to` of a trace already read (`args.trace` names it), its first
/// replay taken from `ahead` where that is it.
fn replay_trace(
    args: &ReplayArgs,
    trace: &Trace,
    so: &mut dyn Write,
    terminal: bool,
    started: Instant,
    ahead: Option<&Ahead>,
) -> Result<ExitCode> {
    let r = match replayed(args, trace, terminal, started, ahead)? {
        Outcome::Viewed(code) => return Ok(code),
        Outcome::Replayed(r) => r,
    };
    if args.json {
        serde_json::to_writer(&mut *so, &r.report())?;
        writeln!(so)?;
    } else {
        r.write_text(so, args.at)?;
    }
    Ok(r.exit_code())
}

/// One replay of a trace already read: its `--json` report as a type, the
/// exit code `replay` would give, and with `text` its summary (several
/// ranks side by side: the table from the reports, then each summary).
pub(crate) fn replay_report(args: &ReplayArgs, trace: &Trace, text: bool) -> Result<(ReplayReport, ExitCode, Vec<u8>)> {
    match replayed(args, trace, false, Instant::now(), None)? {
        Outcome::Replayed(r) => {
            let mut summary = Vec::new();
            if text {
                r.write_text(&mut summary, args.at)?;
            }
            Ok((r.report(), r.exit_code(), summary))
        }
        Outcome::Viewed(code) => {
            Err(anyhow!("{}: replayed on a screen ({code:?}), not into a report", args.trace.display()))
        }
    }
}

/// A replay shown on a screen (its exit code), or ready to be reported.
enum Outcome<'t> {
    Viewed(ExitCode),
    Replayed(Box<Replayed<'t>>),
}

/// The conditions `replay` asks for: a what-if config, a limit, `--torch`,
/// and what `--at` and `--dump-events` need kept.
fn open_options(args: &ReplayArgs, config: Option<AllocatorConfig>, limit: Option<u64>, screen: bool) -> OpenOptions {
    OpenOptions {
        device: args.device,
        device_total: args.device_total,
        config,
        memory_limit: limit,
        torch: args.torch.release,
        keep_events: args.dump_events.is_some() || matches!(args.at, Some(At::Oom)),
        stop_at: match args.at {
            Some(At::Event(i)) => Some(i.saturating_add(1)),
            _ => None,
        },
        // The summary and the screen both show them.
        categories: true,
        scrub_every: screen.then_some(ReplayModel::STEPPING),
    }
}

/// One `--compare` row: the run's requests under `conf`.
fn compare_row(
    reqs: &[crate::replay::whatif::Request],
    label: &str,
    conf: &AllocatorConfig,
    args: &ReplayArgs,
    limit: Option<u64>,
) -> CompareRow {
    let w = run_requests(reqs, conf.clone(), args.device_total, CUDA_CONTEXT_BYTES, limit);
    let mut row = CompareRow::from_stats(label.to_string(), limit, w.allocator.stats());
    (row.new_ooms, row.avoided_ooms) = (Some(w.new_ooms), Some(w.avoided_ooms));
    row
}

/// The event whose state `--at` shows (none: a snapshot's own state).
fn at_event(at: At, session: &Session, dev: &DeviceTrace, exact_ok: bool) -> Option<usize> {
    let last = dev.events.len().checked_sub(1);
    match at {
        // Where the replay stopped: a request's segment events and its
        // allocation are one malloc (see `at_text`).
        At::Event(i) => Some(i).filter(|_| last.is_some()).map(|i| {
            let rested = if exact_ok { session.exact.reproduced.saturating_sub(1).max(i) } else { i };
            rested.min(last.unwrap_or(0))
        }),
        At::Peak => exact_ok.then_some(session.exact.peak.event).or(last),
        At::Oom => oom_index(dev.events.view()).or(last),
        At::End => last,
    }
}

/// The replay of `trace` as `args` ask; on a terminal the interactive view.
/// Whether `replay` opens its interactive view: on a terminal, where
/// nothing asks for a report; scripts and pipes get the summary.
fn opens_screen(args: &ReplayArgs, terminal: bool) -> bool {
    !args.json
        && args.dump_events.is_none()
        && args.compare.is_empty()
        && terminal
        && std::io::stdout().is_terminal()
        && std::io::stdin().is_terminal()
}

fn replayed<'t>(
    args: &ReplayArgs,
    trace: &'t Trace,
    terminal: bool,
    started: Instant,
    ahead: Option<&Ahead>,
) -> Result<Outcome<'t>> {
    args.cap.check()?;
    let what_if_conf = args.alloc_conf.as_deref().map(parse_conf).transpose()?;
    let compare_confs: Vec<(String, AllocatorConfig)> =
        args.compare.iter().map(|c| parse_conf(c).map(|p| (c.clone(), p))).collect::<Result<_>>()?;
    check_at(args.at, crate::replay::open::device(trace, &args.trace.display().to_string(), args.device)?)?;
    let recorded_conf = trace.settings.as_ref().map(|s| s.config()).unwrap_or_default();
    let limit = args.cap.limit(args.device_total);

    let interactive = opens_screen(args, terminal);
    // One replay with the recorded config (or the one asked for, which may
    // equal it) and addresses from the recording.
    let opts = open_options(args, what_if_conf.clone(), limit, interactive);
    let Opened { dev, session, want, .. } =
        crate::replay::open_ahead(trace, &args.trace.display().to_string(), &opts, ahead)?;
    let mut session = session;
    let exact_conf = want.config;
    let fidelity = session.fidelity;
    // The run's own limit, where the trace shows it, unless one was asked.
    let limit = limit.or(session.memory_limit());
    if session.start == Start::StateOnly && (!compare_confs.is_empty() || what_if_conf.is_some()) {
        return Err(anyhow!(InputError(format!(
            "{}: --compare and --alloc-conf replay a run's requests, and a snapshot without memory history has none: they need a trace with history (torch.cuda.memory._record_memory_history before the run)",
            args.trace.display()
        ))));
    }
    let advice = match &session.what_if {
        // A what-if that runs out: which setting avoids it under the same
        // config's limit, checked as tune checks it.
        Some(w) if w.new_ooms > 0 => what_if_advice(&mut session, &exact_conf.source, args, limit),
        Some(_) => None,
        None if what_if_conf.is_none() => oom_advice(&mut session, dev, &recorded_conf, args, limit),
        None => None,
    };

    if interactive && !fidelity.is_faithful() {
        // Said, not silently swapped for the summary.
        eprintln!(
            "gpumem-top: {}: the replay is {} here, and the interactive view shows only exact replays; the summary below says where it parts from the recording",
            args.trace.display(),
            fidelity.name()
        );
    }
    if interactive && fidelity.is_faithful() {
        return open_view(args, &session, trace, dev, advice).map(Outcome::Viewed);
    }

    if let Some(path) = &args.dump_events {
        let f = crate::private::open_new(path, args.force)
            .map_err(|e| anyhow!(InputError(format!("{}: {e}", path.display()))))?;
        trace::write_jsonl(std::io::BufWriter::new(f), &session.exact.events)
            .with_context(|| format!("writing {}", path.display()))?;
    }

    let exact_ok = session.replayed_history();
    let (stats, segments) = state_shown(args, &session, dev, exact_ok)?;
    let replayed_label = if fidelity.is_faithful() { "recorded" } else { "replayed" };
    let label = if what_if_conf.is_some() || limit.is_some() { &exact_conf.source } else { &recorded_conf.source };
    let mut rows = vec![CompareRow::from_stats(
        format!("{} (as {replayed_label})", if label.is_empty() { "default" } else { label }),
        limit,
        &stats,
    )];
    if !compare_confs.is_empty() {
        let reqs = session.requests().to_vec();
        rows.extend(compare_confs.iter().map(|(label, conf)| compare_row(&reqs, label, conf, args, limit)));
    }
    let cats = session.categories(&trace.stacks, &trace.annotations);
    let last = dev.events.len().checked_sub(1);
    let at_event = args.at.map(|at| at_event(at, &session, dev, exact_ok));
    let new_oom = new_oom_report(&session, trace, dev);
    let r = Replayed {
        name: trace_name(&args.trace),
        trace,
        dev,
        recorded_ooms: report::RecordedOomReport::all(dev, &trace.stacks),
        session,
        conf: exact_conf,
        limit,
        stats,
        segments,
        rows,
        compared: !compare_confs.is_empty(),
        cats,
        exact_ok,
        at_event,
        last,
        new_oom,
        advice,
        elapsed_ms: started.elapsed().as_secs_f64() * 1000.0,
    };
    Ok(Outcome::Replayed(Box::new(r)))
}

/// What the replay found of the run's own limit.
pub(crate) fn limit_found_line(l: &crate::replay::conditions::LimitFound) -> String {
    format!(
        "memory limit: the run's own, found from the trace ({}): it replays exactly under any per-process limit from {} to {} ({} to {} B); replayed under {}. Pass --memory-limit or --memory-fraction to set another",
        l.evidence,
        human_bytes(l.lo_bytes),
        human_bytes(l.hi_bytes),
        l.lo_bytes,
        l.hi_bytes,
        human_bytes(l.used_bytes)
    )
}

/// A run that ran out of memory: what to set, only as a replay of this run
/// under every setting found it (docs/user/tune.md).
fn oom_advice(
    session: &mut Session,
    dev: &DeviceTrace,
    recorded_conf: &AllocatorConfig,
    args: &ReplayArgs,
    limit: Option<u64>,
) -> Option<String> {
    let first_oom = oom_index(dev.events.view())?;
    if !session.fidelity.is_faithful() || session.start == Start::StateOnly {
        return None;
    }
    if let Err(e) = AllocatorConfig::parse(&recorded_conf.source) {
        return Some(format!(
            "no setting checked: the recorded PYTORCH_CUDA_ALLOC_CONF cannot be read ({}), so no change of it could be replayed",
            trace::printable::escape(&e.to_string())
        ));
    }
    let ask = crate::tune::Ask::of_run(&recorded_conf.source, args.device_total, limit);
    let s = crate::tune::search_session(session, &ask, None);
    // By how much the first failed request overshot: allocated just before
    // it, plus the request, less what the process could have.
    let overshoot = (|| {
        let cap = limit.unwrap_or(args.device_total.saturating_sub(CUDA_CONTEXT_BYTES));
        let mut sc = session.forward_scrubber().ok()?;
        let allocated = sc.seek(first_oom.saturating_sub(1)).stats().get(Kind::AllocatedBytes, 0).current;
        (allocated.max(0) as u64 + dev.events.at(first_oom).size).checked_sub(cap)
    })();
    crate::tune::oom_advice(&s, overshoot)
}

/// A what-if that ran out of memory where the run did not: the settings
/// that avoid it under the same device and limit, each a replay of the
/// run's requests (docs/user/tune.md).
fn what_if_advice(session: &mut Session, conf: &str, args: &ReplayArgs, limit: Option<u64>) -> Option<String> {
    AllocatorConfig::parse(conf).ok()?;
    let s = crate::tune::search(session.requests(), conf, args.device_total, CUDA_CONTEXT_BYTES, limit, None);
    crate::tune::oom_advice(&s, None)
}

/// The interactive view of a faithful replay, at `--at` (else its peak).
fn open_view<'t>(
    args: &ReplayArgs,
    session: &Session<'t>,
    trace: &'t Trace,
    dev: &DeviceTrace,
    advice: Option<String>,
) -> Result<ExitCode> {
    let name = trace_name(&args.trace);
    let mut model = ReplayModel::open(session, dev, &trace.stacks, &trace.annotations, name)
        .map_err(|d| OpenError::diverged(&args.trace.display().to_string(), &d))?;
    model.oom_advice = advice;
    let mut app = crate::ui::app::ReplayApp::new(model, color(args.no_color));
    if let Some(at) = args.at {
        let to = match at {
            At::Event(i) => i.min(dev.events.len().saturating_sub(1)),
            At::End => dev.events.len().saturating_sub(1),
            At::Oom => oom_index(dev.events.view()).unwrap_or(app.cursor()),
            At::Peak => app.cursor(),
        };
        app.go(to);
    }
    crate::ui::event::run_app(&mut app, crate::ui::event::Events::new()).context("terminal")?;
    Ok(ExitCode::SUCCESS)
}

/// The state the table shows: with `--at peak|oom`, that event's (as
/// `--at N` stops there), else where the replay ended.
fn state_shown(
    args: &ReplayArgs,
    session: &Session,
    dev: &DeviceTrace,
    exact_ok: bool,
) -> Result<(DeviceStats, Vec<SegmentInfo>)> {
    let at_state = match args.at {
        Some(At::Peak) if exact_ok && session.what_if.is_none() => Some(session.exact.peak.event),
        Some(At::Oom) if exact_ok && session.what_if.is_none() => oom_index(dev.events.view()),
        _ => None,
    };
    Ok(match (&session.what_if, at_state) {
        (Some(w), _) => (w.allocator.stats().clone(), w.allocator.snapshot()),
        (None, Some(i)) => {
            let mut sc =
                session.forward_scrubber().map_err(|d| OpenError::diverged(&args.trace.display().to_string(), &d))?;
            let st = sc.seek(i);
            (st.stats().clone(), st.snapshot())
        }
        (None, None) => (session.exact.allocator.stats().clone(), session.exact.allocator.snapshot()),
    })
}

/// Where a what-if first ran out of memory where the recording did not.
fn new_oom_report(session: &Session, trace: &Trace, dev: &DeviceTrace) -> Option<report::NewOomReport> {
    session.first_new_oom().map(|(event, failing)| {
        let e = &dev.events.at(event);
        let frames = dev.stacks.get(event).and_then(|&sid| trace.stacks.get((sid as usize).wrapping_sub(1)));
        let call_site = frames.map(|f| crate::analysis::call_site(f)).unwrap_or_default();
        report::NewOomReport {
            event,
            requested_bytes: e.size,
            stream: e.stream,
            script_site: frames.and_then(|f| crate::analysis::script_site(f)).filter(|s| *s != call_site),
            call_site,
            failing_allocations: failing,
        }
    })
}

/// A replay done: what the summary and the JSON report are written from.
struct Replayed<'t> {
    name: String,
    trace: &'t Trace,
    dev: &'t DeviceTrace,
    session: Session<'t>,
    /// The config replayed (the recorded one, or `--alloc-conf`).
    conf: AllocatorConfig,
    limit: Option<u64>,
    /// The state shown (`state_shown`).
    stats: DeviceStats,
    segments: Vec<SegmentInfo>,
    /// The replay's row, then one per `--compare`.
    rows: Vec<CompareRow>,
    compared: bool,
    cats: Categories,
    /// The exact replay reproduced the run (its peaks and events are the run's).
    exact_ok: bool,
    /// The event `--at` shows (`Some(None)`: a snapshot's own state).
    at_event: Option<Option<usize>>,
    last: Option<usize>,
    new_oom: Option<report::NewOomReport>,
    recorded_ooms: Vec<report::RecordedOomReport>,
    advice: Option<String>,
    elapsed_ms: f64,
}

impl Replayed<'_> {
    /// 1 where the replay diverged, or a what-if runs out of memory where
    /// the recording did not: the run it stands for fails (docs/user/json.md,
    /// exit codes).
    fn exit_code(&self) -> ExitCode {
        if self.session.fidelity == Fidelity::Diverged || self.new_oom.is_some() {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        }
    }

    /// The run's peak, or a what-if's under the config and limit asked.
    fn peak(&self) -> Option<crate::replay::Peak> {
        match &self.session.what_if {
            Some(_) => self.session.what_if_peak(),
            None => self.exact_ok.then_some(self.session.exact.peak),
        }
    }

    /// `--json` (docs/user/json.md).
    fn report(&self) -> ReplayReport {
        let (session, dev, peak, cats) = (&self.session, self.dev, self.peak(), &self.cats);
        let state_only = session.start == Start::StateOnly;
        ReplayReport {
            trace: self.name.clone(),
            format: self.trace.format.name(),
            device: dev.device,
            events: dev.events.len(),
            alloc_conf: self.conf.source.clone(),
            start: session.start,
            memory_limit_bytes: self.limit,
            memory_limit_found: session.limit_found.clone(),
            conditions_note: session.conditions_note.clone(),
            fidelity: session.fidelity.name(),
            torch_release: report::TorchReleaseReport {
                rules: session.release.to_string(),
                why: session.release_note.clone(),
                unknown_actions: self.trace.release.unknown_actions.iter().cloned().collect(),
                annotations: annotate_notes(self.trace, dev.device)
                    .take(100)
                    .map(|(time_us, addr, text)| report::AnnotationReport {
                        time_us,
                        addr: addr.into(),
                        text: text.into(),
                    })
                    .collect(),
            },
            stats_cover: report::covers(session.start),
            first_divergence: session.divergence().as_ref().map(|d| report::DivergenceReport {
                event: d.event,
                expected: d.expected.as_ref().map(report::EventReport::of),
                got: d.got.as_ref().map(report::EventReport::of),
                reason: d.reason.clone(),
            }),
            first_new_oom: self.new_oom.clone(),
            recorded_ooms: self.recorded_ooms.clone(),
            inferred_empty_cache_calls: if self.exact_ok { session.exact.empty_cache_at.len() } else { 0 },
            directed_releases: session.exact.directed,
            retries_or_empty_cache: if self.exact_ok { session.exact.burst_retries } else { 0 },
            placed_allocs: session.exact.placed,
            recorded_totals: session.recorded,
            call_stacks: dev.call_stacks(&self.trace.stacks),
            oom_advice: self.advice.clone(),
            settings_changed: session.settings_changed.clone(),
            not_in_trace: not_in_trace(session.start),
            // A snapshot without history has no peaks or totals: none are
            // given (only what its state holds).
            stats: self
                .stats
                .memory_stats(&self.conf, session.release)
                .into_iter()
                .filter(|(k, _)| {
                    !state_only || !(k.ends_with(".peak") || k.ends_with(".allocated") || k.ends_with(".freed"))
                })
                .collect(),
            peak: peak.map(|p| report::PeakReport {
                event: p.event,
                time_us: dev.time_us.get(p.event),
                allocated_bytes: p.allocated,
                reserved_bytes: p.reserved,
            }),
            categories: report::CategoriesReport {
                evidence: cats.evidence.name(),
                method: cats.evidence.describe(),
                at_peak: peak
                    .map(|p| report::CategoryPoint { event: Some(p.event), bytes: cats.bytes_after(Some(p.event)) }),
                at: self.at_event.map(|e| report::CategoryPoint { event: e, bytes: cats.bytes_after(e) }),
                at_end: report::CategoryPoint { event: self.last, bytes: cats.bytes_after(self.last) },
            },
            fragmentation: report::FragmentationReport {
                at_peak_reserved_minus_allocated_bytes: peak.map(|p| p.reserved - p.allocated),
                peak_ratio: (!state_only).then(|| peak_ratio(&self.stats)),
                now: fragmentation(&self.stats, &self.segments),
            },
            pools: crate::analysis::pool_usage(&self.segments),
            segments: match self.at_event {
                // With --at: the state there (`segments` is already that
                // state), each block with its category.
                Some(e) if session.what_if.is_none() => {
                    self.segments.iter().map(|g| report::SegmentReport::with_blocks(g, cats, e)).collect()
                }
                _ => self.segments.iter().map(report::SegmentReport::of).collect(),
            },
            compare: if self.compared { self.rows.clone() } else { Vec::new() },
            elapsed_ms: self.elapsed_ms,
        }
    }

    /// The summary: notes, the memory_summary()-style table, the OOMs,
    /// what the memory is, and what `--at` asked for.
    fn write_text(&self, so: &mut dyn Write, at: Option<At>) -> Result<()> {
        let (session, dev, cats) = (&self.session, self.dev, &self.cats);
        match session.start {
            Start::Window => writeln!(so, "note: the trace does not start at process start (its ring buffer wrapped, or history was enabled mid-run); the state at its first event was rebuilt from the final segments, so peaks and counters cover the recorded window only")?,
            Start::StateOnly => writeln!(so, "note: the snapshot has no trace (history was not recorded): it shows the state when it was taken; peaks and counters are that state's, not the run's")?,
            Start::ProcessStart => {}
        }
        let state_at = self.at_event.flatten().filter(|_| self.exact_ok && session.what_if.is_none());
        write!(so, "{}{}{}", self.heading(), self.table(), self.tail(state_at))?;
        for o in self.recorded_ooms.iter().take(5) {
            writeln!(so, "OOM recorded at {}", o.describe())?;
        }
        if self.recorded_ooms.len() > 5 {
            writeln!(so, "… and {} more OOMs recorded (replay --json lists them all)", self.recorded_ooms.len() - 5)?;
        }
        if let Some(a) = &self.advice {
            writeln!(so, "the OOM: {a}")?;
        }
        let point = match session.start {
            Start::StateOnly => Some(("in the snapshot", None)),
            _ => self.peak().map(|p| ("at the peak", Some(p.event))),
        };
        if let Some((label, e)) = point {
            writeln!(
                so,
                "what the memory is {label}: {} (categories: {}; docs/user/categories.md)",
                cats.bytes_after(e).describe(),
                cats.evidence.describe()
            )?;
        }
        if let Some(at) = at {
            writeln!(so, "{}", at_text(at, self.exact_ok.then_some(&session.exact), dev))?;
            // The OOM's own request and the stack that made it.
            if let (At::Oom, Some(o)) = (at, self.recorded_ooms.first()) {
                writeln!(so, "  the recorded OOM: {}", o.describe())?;
                for f in o.frames.iter().take(16) {
                    writeln!(so, "    {f}")?;
                }
                if o.frames.len() > 16 {
                    writeln!(so, "    … {} more frames", o.frames.len() - 16)?;
                }
            }
            if let Some(e) = self.at_event.filter(|_| session.start != Start::StateOnly) {
                writeln!(so, "  there: {}", cats.bytes_after(e).describe())?;
            }
        }
        if let Some(o) = &self.new_oom {
            writeln!(so, "{}", new_oom_text(o, dev))?;
        }
        Ok(())
    }

    /// What was replayed, under which config, and how faithfully.
    fn heading(&self) -> String {
        let (trace, dev, conf, session) = (self.trace, self.dev, &self.conf, &self.session);
        let mut o = String::new();
        o.push_str(&format!(
            "gpumem-top replay: {} ({}, device {}, {} events)\n",
            self.name,
            trace.format.name(),
            dev.device,
            dev.events.len()
        ));
        o.push_str(&format!(
            "allocator config: {}{}\n",
            if conf.source.is_empty() { "default".to_string() } else { format!("{:?}", conf.source) },
            self.limit.map(|l| format!(", memory limit {}", human_bytes(l))).unwrap_or_default()
        ));
        if let Some(l) = &session.limit_found {
            o.push_str(&format!("{}\n", limit_found_line(l)));
        }
        if let Some(n) = &session.conditions_note {
            o.push_str(&format!("note: {n}\n"));
        }
        if let Some(c) = session.settings_changed.as_ref().filter(|c| c.event >= dev.events.len()) {
            let from = if c.from.is_empty() { "PyTorch's defaults".to_string() } else { format!("{:?}", c.from) };
            let place = if c.earliest < dev.events.len() {
                format!("came at event {} or later (nothing after it tells them apart)", c.earliest)
            } else {
                "is not placed by anything the trace records".to_string()
            };
            o.push_str(&format!(
                "allocator settings changed during the run (torch.cuda.memory._set_allocator_settings): {from} explain every event, so the change to {:?} {place}; replayed under the earlier settings\n",
                conf.source
            ));
        } else if let Some(c) = &session.settings_changed {
            o.push_str(&format!(
                "allocator settings changed during the run (torch.cuda.memory._set_allocator_settings): {} until between events {} and {}, {:?} after; replayed with the change at event {} (the first only the later settings explain). Reserved bytes and segments are exact; allocated, active and inactive_split totals and peaks depend on where in that range it happened\n",
                if c.from.is_empty() { "PyTorch's defaults".to_string() } else { format!("{:?}", c.from) },
                c.earliest,
                c.event,
                conf.source,
                c.event
            ));
        }
        match dev.call_stacks(&trace.stacks) {
            CallStacks::PerEvent => {}
            CallStacks::BlocksOnly => o.push_str(
                "call stacks: the snapshot's blocks only (history recorded with context=\"state\"): events carry none\n",
            ),
            CallStacks::None => o.push_str("call stacks: none recorded (context=None, or a format without them): no call sites\n"),
        }
        o.push_str(&format!("PyTorch release: {}\n", session.release_note));
        if !trace.release.unknown_actions.is_empty() {
            let list: Vec<String> = trace.release.unknown_actions.iter().map(|(a, n)| format!("{n} {:?}", a)).collect();
            o.push_str(&format!(
                "skipped: trace entries with actions this release of gpumem-top does not know: {}\n",
                list.join(", ")
            ));
        }
        let notes: Vec<_> = annotate_notes(trace, dev.device).collect();
        if let Some((_, addr, text)) = notes.first() {
            o.push_str(&format!(
                "annotations (torch.cuda.memory._annotate_tensor): {}; the first {:?} on the block at {addr}\n",
                notes.len(),
                text
            ));
        }
        if trace.release.host_memory {
            o.push_str("host memory: the snapshot's pinned host segments and traces (torch 2.14+) are not replayed: this is device memory only\n");
        }
        o.push_str(&fidelity_line(session));
        let private: Vec<&SegmentInfo> = self.segments.iter().filter(|s| s.private).collect();
        if !private.is_empty() {
            let mut ids: Vec<String> = private
                .iter()
                .map(|s| s.pool.map(|p| format!("({},{})", p.0, p.1)).unwrap_or_else(|| "(id not recorded)".into()))
                .collect();
            ids.dedup();
            o.push_str(&format!(
                "private pools: {}, {} reserved, in {}\n",
                crate::analysis::count(private.len(), "segment"),
                human_bytes(private.iter().map(|s| s.total_size).sum()),
                ids.join(", ")
            ));
        }
        o
    }

    /// The table `torch.cuda.memory_summary()` prints, of the state shown.
    fn table(&self) -> String {
        let (s, state_only) = (&self.stats, self.session.start == Start::StateOnly);
        let mut o = String::new();
        let bar = format!("|{}|\n", "=".repeat(81));
        let sep = format!("|{}|\n", "-".repeat(81));
        o.push_str(&bar);
        o.push_str(&format!("|{:^81}|\n", "PyTorch CUDA memory summary, replayed by gpumem-top"));
        o.push_str(&sep);
        o.push_str(&format!(
            "| {:<24}| {:>11} | {:>11} | {:>11} | {:>11} |\n",
            "Metric", "Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed"
        ));
        o.push_str(&sep);
        for (label, kind, bytes) in [
            ("Allocated memory", Kind::AllocatedBytes, true),
            ("Active memory", Kind::ActiveBytes, true),
            ("Requested memory", Kind::RequestedBytes, true),
            ("GPU reserved memory", Kind::ReservedBytes, true),
            ("Non-releasable memory", Kind::InactiveSplitBytes, true),
            ("Allocations", Kind::Allocation, false),
            ("Active allocs", Kind::Active, false),
            ("GPU reserved segments", Kind::Segment, false),
            ("Non-releasable allocs", Kind::InactiveSplit, false),
        ] {
            stat_line(&mut o, label, s, kind, bytes, state_only);
            o.push_str(&sep);
        }
        let h = |v: i64| if state_only { "-".to_string() } else { v.to_string() };
        for (label, st) in
            [("Oversize allocations", &s.oversize_allocations), ("Oversize GPU segments", &s.oversize_segments)]
        {
            o.push_str(&format!(
                "| {:<24}| {:>11} | {:>11} | {:>11} | {:>11} |\n",
                label,
                st.current,
                h(st.peak),
                h(st.allocated),
                h(st.freed)
            ));
        }
        o.push_str(&sep);
        let counters = format!(
            "cudaMalloc/map: {}   cudaFree/unmap: {}   retries: {}   OOMs: {}",
            s.num_device_alloc, s.num_device_free, s.num_alloc_retries, s.num_ooms
        );
        o.push_str(&format!("| {counters:<80}|\n"));
        o.push_str(&bar);
        o
    }

    /// The peak, the fragmentation figures at `state_at` (else the end),
    /// and the `--compare` table.
    fn tail(&self, state_at: Option<usize>) -> String {
        let (s, session, dev) = (&self.stats, &self.session, self.dev);
        let mut o = String::new();
        let r = &session.exact;
        if let (Some(p), Some(w)) = (self.peak().filter(|_| session.what_if.is_some()), &session.what_if) {
            let t = dev.time_us.get(p.event).unwrap_or(0);
            let t0 = dev.time_us.first().unwrap_or(0);
            let reserved_peak = w.allocator.stats().get(crate::alloc::Kind::ReservedBytes, 0).peak.max(0) as u64;
            o.push_str(&format!(
                "peak (what-if): at the request of event {} ({:.3} s in), allocated {}, reserved {} then, reserved but unallocated {}; peak reserved {}\n",
                p.event,
                (t - t0) as f64 / 1e6,
                human_bytes(p.allocated),
                human_bytes(p.reserved),
                human_bytes(p.reserved.saturating_sub(p.allocated)),
                human_bytes(reserved_peak)
            ));
        } else if r.divergence.is_none() && session.start != Start::StateOnly {
            let t = dev.time_us.get(r.peak.event).unwrap_or(0);
            let t0 = dev.time_us.first().unwrap_or(0);
            // Reserved at the allocated peak is not the reserved peak: both
            // are said, as synth says them.
            let reserved_peak = r.allocator.stats().get(crate::alloc::Kind::ReservedBytes, 0).peak.max(0) as u64;
            o.push_str(&format!(
                "peak: event {} ({:.3} s in), allocated {}, reserved {} then, reserved but unallocated {}; peak reserved {}\n",
                r.peak.event,
                (t - t0) as f64 / 1e6,
                human_bytes(r.peak.allocated),
                human_bytes(r.peak.reserved),
                human_bytes(r.peak.reserved - r.peak.allocated),
                human_bytes(reserved_peak)
            ));
        }
        let f = fragmentation(s, &self.segments);
        o.push_str(&format!(
            "fragmentation: peak_ratio {}; {}: reserved_unallocated_bytes {}, inactive_split_bytes {}, external_fragmentation {:.4}, rounding_waste_bytes {}\n",
            if session.start == Start::StateOnly { "n/a (no peaks in the snapshot)".into() } else { format!("{:.4}", peak_ratio(s)) },
            state_at.map(|e| format!("at event {e}")).unwrap_or_else(|| "at the end".into()),
            human_bytes(f.reserved_unallocated_bytes),
            human_bytes(f.inactive_split_bytes),
            f.external_fragmentation,
            human_bytes(f.rounding_waste_bytes)
        ));
        if self.compared {
            o.push_str("\ncompare (the same requests under each config, simulated addresses after the first row):\n");
            o.push_str(&format!(
                "{:<48} {:>12} {:>12} {:>10} {:>8} {:>6}\n",
                "alloc_conf", "peak alloc", "peak resv", "peak_ratio", "retries", "OOMs"
            ));
            for r in &self.rows {
                o.push_str(&format!(
                    "{:<48} {:>12} {:>12} {:>10.4} {:>8} {:>6}\n",
                    r.alloc_conf,
                    human_bytes(r.peak_allocated_bytes.max(0) as u64),
                    human_bytes(r.peak_reserved_bytes.max(0) as u64),
                    r.peak_ratio,
                    r.num_alloc_retries,
                    r.num_ooms
                ));
            }
        }
        o
    }
}

/// The `annotate` entries of `device`: (time_us, block address, text).
fn annotate_notes(trace: &Trace, device: i32) -> impl Iterator<Item = (i64, &str, &str)> + '_ {
    let notes = trace.annotations.iter().filter(move |a| a.device == device && a.field("action") == Some("annotate"));
    notes.map(|a| (a.time_us, a.field("addr").unwrap_or(""), a.field("name").unwrap_or("")))
}

/// "fidelity: exact, all N events reproduced …"
fn fidelity_line(session: &Session) -> String {
    let r = &session.exact;
    let inferred = if r.inferred_empty_cache > 0 {
        format!("; {} empty_cache() calls inferred", r.inferred_empty_cache)
    } else {
        String::new()
    };
    match session.fidelity {
        Fidelity::Exact => format!(
            "fidelity: exact, all {} events reproduced (action, address, size, stream){inferred}\n",
            r.reproduced
        ),
        Fidelity::ExactWindow => format!(
            "fidelity: exact-window, all {} events of the window reproduced from its rebuilt start{inferred}\n",
            r.reproduced
        ),
        Fidelity::StateOnly => format!(
            "fidelity: state-only, {} as the snapshot holds them (no trace to replay)\n",
            crate::analysis::count(session.recorded.segments, "segment")
        ),
        Fidelity::Diverged => match session.divergence() {
            Some(d) => format!(
                "fidelity: DIVERGED at {d}\n  to try: a run under a memory limit (set_per_process_memory_fraction) the trace does not bound replays exactly with --memory-limit BYTES or --memory-fraction F; a change of settings mid-run is followed where the trace places it (docs/user/replay.md, \"Conditions\")\n"
            ),
            None => String::new(),
        },
        Fidelity::WhatIf => "fidelity: what-if (the trace's requests under this config, simulated addresses)\n".into(),
    }
}

#[derive(Args, Debug, Clone)]
pub struct ReplayArgs {
    /// A PyTorch memory snapshot (.pickle, .pickle.gz), our JSONL trace, or an RMM log CSV.
    pub(crate) trace: PathBuf,
    /// More snapshots, one per rank of a job (`snapshot --job` writes
    /// them): each replayed alone, reported side by side (docs/user/ranks.md).
    #[arg(value_name = "MORE")]
    pub(crate) more: Vec<PathBuf>,
    /// Replay under this allocator config instead of the recorded one (PyTorch's
    /// PYTORCH_CUDA_ALLOC_CONF syntax, e.g. expandable_segments:True).
    #[arg(long, value_name = "CONF")]
    pub(crate) alloc_conf: Option<String>,
    #[command(flatten)]
    pub(crate) cap: MemoryCap,
    #[command(flatten)]
    pub(crate) torch: TorchArg,
    /// Also run the trace's requests under this config (repeatable) and compare.
    #[arg(long = "compare", value_name = "CONF")]
    pub(crate) compare: Vec<String>,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
    /// Write the replayed events as JSON lines to PATH (a new file; see
    /// --force).
    #[arg(long, value_name = "PATH")]
    pub(crate) dump_events: Option<PathBuf>,
    /// With --dump-events: replace an existing file (the path itself: a
    /// link there is removed, never followed).
    #[arg(long, requires = "dump_events")]
    pub(crate) force: bool,
    /// Report the state at this point: an event index, peak, oom or end.
    #[arg(long, value_name = "EVENT|peak|oom|end")]
    pub(crate) at: Option<At>,
    /// totalGlobalMem of the recorded device (sizes expandable-segment
    /// reservations and memory fractions).
    #[arg(long, value_name = "BYTES", value_parser = parse_capacity, default_value_t = DEFAULT_DEVICE_TOTAL)]
    pub(crate) device_total: u64,
    /// Which device of a multi-GPU snapshot to replay (default: the busiest).
    #[arg(long, value_name = "N")]
    pub(crate) device: Option<i32>,
    /// Most bytes a compressed input may unpack to (default: 64 times the
    /// file plus 256 MiB).
    #[arg(long, value_name = "BYTES", value_parser = parse_capacity)]
    pub(crate) max_unpacked: Option<u64>,
    /// Draw without colour (also when NO_COLOR is set).
    #[arg(long)]
    pub(crate) no_color: bool,
}

/// `--at EVENT` must name an event of the trace: the same rule for `replay`
/// and `export`.
pub(super) fn check_at(at: Option<At>, dev: &DeviceTrace) -> Result<()> {
    match at {
        Some(At::Event(i)) if i >= dev.events.len() && !dev.events.is_empty() => Err(anyhow!(InputError(format!(
            "--at {i}: the trace has {} events (0 to {})",
            dev.events.len(),
            dev.events.len() - 1
        )))),
        _ => Ok(()),
    }
}

/// The index of the first `oom` event.
pub(super) fn oom_index(events: crate::alloc::EventsRef<'_>) -> Option<usize> {
    events.ooms().next()
}

/// "would run out of memory at event N (request X at file:line)".
fn new_oom_text(o: &report::NewOomReport, dev: &DeviceTrace) -> String {
    let t0 = dev.time_us.first().unwrap_or(0);
    let when = dev.time_us.get(o.event).map(|t| format!(", {:.3} s in", (t - t0) as f64 / 1e6)).unwrap_or_default();
    let site = match (&o.call_site, &o.script_site) {
        (c, _) if c.is_empty() => "a place no Python frame was recorded for".to_string(),
        (c, Some(s)) => format!("{c}, called from {s}"),
        (c, None) => c.clone(),
    };
    let more = match o.failing_allocations {
        0 | 1 => String::new(),
        n => format!("; {} more allocations after it would fail too, if the program went on", n - 1),
    };
    format!(
        "would run out of memory at event {} of {}{when}: a request of {} on stream {} at {site}{more}",
        o.event,
        dev.events.len(),
        human_bytes(o.requested_bytes),
        o.stream
    )
}

/// Counters a replay cannot know from the trace alone, by kind of start.
fn not_in_trace(start: Start) -> Vec<&'static str> {
    match start {
        // An empty_cache() that frees nothing leaves no trace entry, nor does
        // a CUDA-graph capture's own empty_cache (docs/user/replay.md).
        // A request throw_on_cudamalloc_oom refuses (2.12+) leaves none either.
        Start::ProcessStart => vec!["num_sync_all_streams", "num_oom_rejections"],
        Start::Window | Start::StateOnly => {
            vec![
                "num_sync_all_streams",
                "num_oom_rejections",
                "peaks",
                "allocated/freed totals",
                "num_alloc_retries",
                "num_ooms",
                "num_device_alloc",
                "num_device_free",
            ]
        }
    }
}

fn at_text(at: At, exact: Option<&ReplayResult>, dev: &DeviceTrace) -> String {
    let Some(r) = exact else { return "--at needs a trace with segment events".into() };
    match at {
        At::Peak => format!(
            "at the peak: event {} of {}, allocated {}, reserved {}: the table above is the state there",
            r.peak.event,
            dev.events.len(),
            human_bytes(r.peak.allocated),
            human_bytes(r.peak.reserved)
        ),
        At::Oom => match r.events.iter().position(|e| e.action == crate::alloc::Action::Oom) {
            Some(i) => format!(
                "first OOM: event {i}, request of {} (rounded): the table above is the state there",
                human_bytes(r.events[i].size)
            ),
            None => "the trace has no OOM".into(),
        },
        // Events are numbered from 0, as everywhere (the screen, --json, --at N).
        At::End => format!(
            "at the end: event {} (the last of {} events, numbered from 0)",
            dev.events.len().saturating_sub(1),
            dev.events.len()
        ),
        // One malloc makes a request's segment events and its allocation
        // together: the allocator never rests between them, so a stop on
        // such a segment event shows the state after its request, and says so.
        At::Event(i) => match r.reproduced.checked_sub(1).filter(|&last| last > i) {
            Some(last) => format!(
                "stopped after event {last}: event {i} ({}) is made by the same malloc as event {last}, and the allocator rests only after both; the table above is the state there",
                dev.events.get(i).map_or("", |e| e.action.name())
            ),
            None => format!("stopped after event {i}: the table above is the state there"),
        },
    }
}

/// One row per pool; `state_only`: a snapshot without history has no peaks
/// or totals, and shows none ("-").
fn stat_line(out: &mut String, label: &str, s: &DeviceStats, kind: Kind, bytes: bool, state_only: bool) {
    let f = |v: i64| if bytes { human_bytes(v.max(0) as u64) } else { v.to_string() };
    let h = |v: i64| if state_only { "-".to_string() } else { f(v) };
    for (pool, name) in
        [(0, label.to_string()), (2, "      from large pool".into()), (1, "      from small pool".into())]
    {
        let st = s.get(kind, pool);
        out.push_str(&format!(
            "| {:<24}| {:>11} | {:>11} | {:>11} | {:>11} |\n",
            name,
            f(st.current),
            h(st.peak),
            h(st.allocated),
            h(st.freed)
        ));
    }
}
