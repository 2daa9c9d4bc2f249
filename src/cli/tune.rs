//! `tune TRACE`: which `PYTORCH_CUDA_ALLOC_CONF` this run should use, from
//! replays of its requests under each candidate (docs/user/tune.md).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{anyhow, Result};
use clap::Args;
use serde::Serialize;

use super::args::{InputError, MemoryCap};
use super::io::load_tapped;
use crate::alloc::AllocatorConfig;
use crate::analysis::human_bytes;
use crate::device::DEFAULT_DEVICE_TOTAL;
use crate::replay::ahead::Ahead;
use crate::replay::session::{Fidelity, Start, Want};
use crate::replay::{OpenError, OpenOptions, Opened};
use crate::trace::input::{Input, InputKind};
use crate::trace::Trace;
use crate::tune::{search_session, why, Ask, Early, FirstBehind, Outcome};

#[derive(Args, Debug, Clone)]
pub struct TuneArgs {
    /// A PyTorch memory snapshot with history (or our JSONL trace).
    pub(crate) trace: PathBuf,
    #[command(flatten)]
    pub(crate) cap: MemoryCap,
    #[command(flatten)]
    pub(crate) torch: super::args::TorchArg,
    /// Print one JSON object (docs/user/json.md).
    #[arg(long)]
    pub(crate) json: bool,
    /// Settings shown (best first).
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub(crate) top: usize,
    /// totalGlobalMem of the device the run is for.
    #[arg(long, value_name = "BYTES", value_parser = super::args::parse_capacity, default_value_t = DEFAULT_DEVICE_TOTAL)]
    pub(crate) device_total: u64,
    /// Which device of a multi-GPU snapshot (default: the busiest).
    #[arg(long, value_name = "N")]
    pub(crate) device: Option<i32>,
    /// Most bytes a compressed input may unpack to.
    #[arg(long, value_name = "BYTES", value_parser = super::args::parse_capacity)]
    pub(crate) max_unpacked: Option<u64>,
}

/// A candidate as `--json` shows it.
#[derive(Serialize)]
struct Row<'a> {
    #[serde(flatten)]
    outcome: &'a Outcome,
    /// The line to use it.
    export: String,
    /// Why it ranks where it does, against the recorded setting.
    why: String,
}

#[derive(Serialize)]
struct Report<'a> {
    trace: String,
    events: usize,
    /// "process" (the run from its start) or "window" (a window of a longer
    /// run, replayed from the live blocks at its first event).
    covers: &'static str,
    /// Whether the recorded row is the run's own exact replay, or its
    /// setting replayed as the others are (no segment events; a device or
    /// limit smaller than the run used).
    recorded_is_the_run: bool,
    memory_limit_bytes: Option<u64>,
    /// The run's own limit, found from its trace (none was asked).
    memory_limit_found: Option<crate::replay::conditions::LimitFound>,
    device_total_bytes: u64,
    recorded: Row<'a>,
    recommended: Row<'a>,
    candidates: Vec<Row<'a>>,
    replays: usize,
    elapsed_ms: f64,
}

/// The shell line that sets `conf`: a recorded setting is the file's text,
/// so anything but the characters settings are made of is quoted for the
/// shell, and control characters escaped (docs/design/security.md).
fn export_line(conf: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_:.,+-".contains(c);
    if conf.is_empty() {
        "unset PYTORCH_CUDA_ALLOC_CONF".into()
    } else if conf.chars().all(plain) {
        format!("export PYTORCH_CUDA_ALLOC_CONF={conf}")
    } else {
        let quoted = crate::trace::printable::escape(conf).replace('\'', r"'\''");
        format!("export PYTORCH_CUDA_ALLOC_CONF='{quoted}'")
    }
}

pub fn tune(args: &TuneArgs) -> Result<ExitCode> {
    let started = Instant::now();
    args.cap.check()?;
    let input = Input::open(&args.trace)?;
    if input.kind() == InputKind::Recording {
        return Err(anyhow!(InputError(format!(
            "{}: a recording of samples has no allocation requests to replay; tune a snapshot taken with memory history (`S` in the live view, or `gpumem-top snapshot PID`)",
            args.trace.display()
        ))));
    }
    // The run's requests come from its exact replay, under the conditions it
    // had: without a limit, or under the one asked for where the run had it
    // (a run that OOMed under its limit replays only under it). Every
    // setting, the recorded one included, then runs under the limit asked
    // for (docs/user/tune.md).
    let opts = OpenOptions {
        device: args.device,
        device_total: args.device_total,
        torch: args.torch.release,
        ..OpenOptions::default()
    };
    let (trace, ahead, first_behind) = load_behind(input, args, &opts)?;
    if let Some(Err(e)) = trace.settings.as_ref().map(|s| crate::alloc::AllocatorConfig::parse(&s.conf)) {
        return Err(anyhow!(InputError(format!(
            "{}: the recorded PYTORCH_CUDA_ALLOC_CONF cannot be read ({}): tune replays the run under its own setting and each change of it, so it has nothing to compare with",
            args.trace.display(),
            crate::trace::printable::escape(&e.to_string())
        ))));
    }
    let recorded = trace.settings.as_ref().map(|s| s.config()).unwrap_or_default();
    let limit = args.cap.limit(args.device_total);
    let name = args.trace.display().to_string();
    let asked = ask_for(args, &recorded.source);
    let (opened, early) =
        open_beside_first_stage(&trace, &name, &opts, (&asked, &recorded), ahead.as_ref(), first_behind);
    let mut opened = opened?;
    // The run's own limit, found from its trace, unless one was asked.
    let found = opened.session.limit_found.clone();
    let limit = limit.or(found.as_ref().map(|l| l.used_bytes));
    if opened.session.fidelity == Fidelity::Diverged && limit.is_some() {
        let under = opened.reopened_under(limit)?;
        if under.session.fidelity != Fidelity::Diverged {
            opened = under;
        }
    }
    let (dev, mut session) = (opened.dev, opened.session);
    match session.fidelity {
        Fidelity::StateOnly => {
            return Err(anyhow!(InputError(format!(
                "{}: a snapshot without memory history holds no requests to replay, so it cannot be tuned; record with torch.cuda.memory._record_memory_history(context=\"alloc\", stacks=\"python\") and snapshot again",
                args.trace.display()
            ))))
        }
        Fidelity::Diverged => {
            let why = session.divergence().map(|d| d.to_string()).unwrap_or_default();
            return Err(anyhow!("{}: the replay diverged at {why}; tune needs a run we reproduce", args.trace.display()));
        }
        _ => {}
    }
    let window = session.start == Start::Window;
    let ask = Ask { limit, ..asked };
    let s = search_session(&mut session, &ask, early);
    let best = s.best();
    let rec_row = Row {
        outcome: &s.recorded,
        export: export_line(&s.recorded.alloc_conf),
        why: why(&s.recorded, &s.recorded, limit),
    };
    let best_row = Row { outcome: best, export: export_line(&best.alloc_conf), why: why(best, &s.recorded, limit) };
    let name = super::io::trace_name(&args.trace);
    if args.json {
        let report = Report {
            trace: name,
            events: dev.events.len(),
            covers: if window { "window" } else { "process" },
            recorded_is_the_run: s.recorded_is_the_run,
            memory_limit_bytes: limit,
            memory_limit_found: found.clone().filter(|_| args.cap.limit(args.device_total).is_none()),
            device_total_bytes: args.device_total,
            recorded: rec_row,
            recommended: best_row,
            candidates: s
                .candidates
                .iter()
                .map(|o| Row { outcome: o, export: export_line(&o.alloc_conf), why: why(o, &s.recorded, limit) })
                .collect(),
            replays: s.replays,
            elapsed_ms: started.elapsed().as_secs_f64() * 1000.0,
        };
        let mut so = super::io::text_out();
        serde_json::to_writer(&mut so, &report)?;
        writeln!(so)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut text = summary(args, &name, (dev.events.len(), dev.has_segment_events()), window, limit, &s, started);
    if let (Some(l), None) = (&found, args.cap.limit(args.device_total)) {
        // Said under the heading: every figure is under the run's own limit.
        let at = text.find('\n').map_or(text.len(), |i| i + 1);
        text.insert_str(at, &format!("{}\n", super::replay::limit_found_line(l)));
    }
    super::io::text_out().write_all(text.as_bytes())?;
    Ok(ExitCode::SUCCESS)
}

/// What tune asks of a run recorded under `recorded`: the device, the
/// CUDA context and the limit asked for.
fn ask_for(args: &TuneArgs, recorded: &str) -> Ask {
    Ask::of_run(recorded, args.device_total, args.cap.limit(args.device_total))
}

/// The trace read, with the run's replay behind its decoding where it can
/// be (docs/design/trace-decoding.md, "The replay behind the decoder"), and
/// the search's first stage too, for the setting the events show.
fn load_behind(
    input: Input,
    args: &TuneArgs,
    opts: &OpenOptions,
) -> Result<(Trace, Option<Ahead>, Option<FirstBehind>)> {
    let args_now = args.clone();
    let (first_behind, follower) = FirstBehind::start(move |recorded| ask_for(&args_now, recorded)).unzip();
    let ahead = opts.ahead_followed(follower);
    let trace = load_tapped(input, args.max_unpacked, true, ahead.as_ref().map(Ahead::tap))?;
    // A reader that did not tap the events (not a PyTorch snapshot) leaves
    // the first stage waiting: told the events are over, it made none.
    ahead.as_ref().inspect(|a| a.unfollow());
    Ok((trace, ahead, first_behind))
}

/// `trace` opened as `opts` asks, and the search's first stage for `asked`:
/// it needs only the requests, so it ran behind the decoding (`behind`) or
/// runs beside the run's own replay, from where that replay most likely
/// starts; the search keeps it only where the replay agrees
/// (docs/user/tune.md).
fn open_beside_first_stage<'t>(
    trace: &'t Trace,
    name: &str,
    opts: &OpenOptions,
    (asked, recorded): (&Ask, &AllocatorConfig),
    ahead: Option<&Ahead>,
    behind: Option<FirstBehind>,
) -> (Result<Opened<'t>, OpenError>, Option<Early>) {
    let recorded_state = Want::records_state(trace);
    std::thread::scope(|s| {
        let early = crate::replay::open::device(trace, name, opts.device).ok().and_then(|dev| {
            let ask = asked.clone();
            let early =
                move || behind.and_then(|b| b.take_for(dev)).or_else(|| Early::run(dev, ask, recorded, recorded_state));
            std::thread::Builder::new().name("tune".into()).spawn_scoped(s, early).ok()
        });
        let opened = crate::replay::open_ahead(trace, name, opts, ahead);
        // A first stage that failed is made again by the search.
        (opened, early.and_then(|h| h.join().ok()).flatten())
    })
}

/// The table of the settings tried, best first, and what to set.
fn summary(
    args: &TuneArgs,
    name: &str,
    (events, segment_events): (usize, bool),
    window: bool,
    limit: Option<u64>,
    s: &crate::tune::Search,
    started: Instant,
) -> String {
    let best = s.best();
    let mut o = String::new();
    o.push_str(&format!(
        "gpumem-top tune: {name} ({} events{}), {}\n",
        events,
        if window {
            ", a window of a longer run: tuned over its window, from the blocks live at its first event"
        } else {
            ", from process start"
        },
        match limit {
            Some(l) => format!("memory limit {}", human_bytes(l)),
            None => "no memory limit (garbage_collection_threshold acts only under one: --memory-fraction F)".into(),
        }
    ));
    o.push_str(&format!(
        "{} settings replayed in {:.1} s; each figure is the run's own requests under that setting (docs/user/tune.md)\n",
        s.replays,
        started.elapsed().as_secs_f64()
    ));
    if !s.recorded_is_the_run {
        o.push_str(if segment_events {
            "the recorded setting's row too is a replay, on the device or under the limit asked about: the run itself used more\n"
        } else {
            "the recorded setting's row too is a replay on the simulated device: this trace has no segment events to check a replay against\n"
        });
    }
    o.push('\n');
    let label = |c: &str| {
        if c.is_empty() {
            "PyTorch's defaults".to_string()
        } else {
            crate::trace::printable::escape(c).into_owned()
        }
    };
    let shown: Vec<&Outcome> = s.candidates.iter().take(args.top.max(1)).collect();
    let w = shown.iter().chain(std::iter::once(&&s.recorded)).map(|c| label(&c.alloc_conf).len()).max().unwrap_or(7);
    o.push_str(&format!(
        "  {:<w$} {:>13} {:>9} {:>8} {:>5} {:>10}\n",
        "setting", "peak reserved", "vs yours", "retries", "OOMs", "cudaMalloc"
    ));
    let line = |mark: &str, x: &Outcome| {
        let delta = if x.alloc_conf == s.recorded.alloc_conf {
            "yours".to_string()
        } else {
            format!(
                "{:+.1}%",
                100.0 * (x.reserved_peak_bytes as f64 / s.recorded.reserved_peak_bytes.max(1) as f64 - 1.0)
            )
        };
        format!(
            "{mark} {:<w$} {:>13} {:>9} {:>8} {:>5} {:>10}\n",
            label(&x.alloc_conf),
            human_bytes(x.reserved_peak_bytes),
            delta,
            x.num_alloc_retries,
            x.num_ooms,
            x.num_device_alloc
        )
    };
    for (i, c) in shown.iter().enumerate() {
        o.push_str(&line(if i == 0 { "★" } else { " " }, c));
    }
    if !shown.iter().any(|c| c.alloc_conf == s.recorded.alloc_conf) {
        o.push_str(&line(" ", &s.recorded));
    }
    o.push('\n');
    if best.alloc_conf == s.recorded.alloc_conf || !best.beats(&s.recorded) {
        o.push_str(&format!(
            "Keep {}: none of the {} settings tried does better on this run.\n",
            label(&s.recorded.alloc_conf),
            s.replays
        ));
    } else {
        o.push_str(&format!(
            "Use:\n\n    {}\n\nWhy: {}.\n",
            export_line(&best.alloc_conf),
            why(best, &s.recorded, limit)
        ));
        if let Some(second) = s.candidates.get(1) {
            o.push_str(&format!(
                "Runner-up: {} ({}).\n",
                label(&second.alloc_conf),
                human_bytes(second.reserved_peak_bytes)
            ));
        }
    }
    if best.num_ooms > 0 {
        o.push_str(&format!(
            "No setting tried avoids every OOM: the peaks themselves exceed the limit (the best still fails {} allocation{}); a smaller batch, activation checkpointing or mixed precision lowers them.\n",
            best.num_ooms,
            if best.num_ooms == 1 { "" } else { "s" }
        ));
    }
    o
}
