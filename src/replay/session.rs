//! One recorded device, opened, classified and replayed once: what the
//! `replay` summary, `--json`, the TUI and `export` all start from
//! (docs/user/replay.md).
//!
//! A recording is one of three kinds:
//! - from process start: replayed from an empty allocator;
//! - a window (the ring buffer wrapped, or history was enabled mid-run):
//!   the state at its first event is rebuilt from the final segments;
//! - state only (no trace at all): the final segments are the state.
//!
//! Whatever the kind, the state the replay ends in must be the snapshot's
//! own (allocated, reserved and segments); a replay that ends elsewhere is
//! `diverged`, with the reason.

use std::sync::Arc;

use serde::Serialize;

use super::ahead::Ahead;
use super::conditions::{self, LimitFound};
use super::engine::{replay_events, replay_events_from, Divergence, ReplayOptions, ReplayResult};
use super::pools;
use super::scrub::Scrubber;
use super::whatif::{requests_with_events, run_requests, Request, WhatIf};
use super::wrapped::{reconstruct, replay_wrapped, starts_empty};
use crate::alloc::{Action, AllocatorConfig, BlockState, EventsRef, Release, SeedBlock, SeedSegment, SegmentInfo};
use crate::analysis::categories::Categories;
use crate::trace::{DeviceTrace, Frame};

/// Where the recording starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
#[allow(clippy::enum_variant_names)] // "process-start" in JSON reads as meant
pub(crate) enum Start {
    ProcessStart,
    /// A window of a longer run; the state at its first event is rebuilt.
    Window,
    /// No trace: the snapshot's segments alone.
    StateOnly,
}

/// How far our numbers are PyTorch's (docs/user/replay.md "Fidelity").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fidelity {
    /// Every recorded event reproduced from process start.
    Exact,
    /// Every event of a window reproduced from its rebuilt start.
    ExactWindow,
    /// No trace: the snapshot's state, nothing replayed.
    StateOnly,
    /// Another config or limit was asked for: the requests replayed under it.
    WhatIf,
    /// We did not reproduce the recording (see the divergence).
    Diverged,
}

impl Fidelity {
    pub fn name(self) -> &'static str {
        match self {
            Fidelity::Exact => "exact",
            Fidelity::ExactWindow => "exact-window",
            Fidelity::StateOnly => "state-only",
            Fidelity::WhatIf => "what-if",
            Fidelity::Diverged => "diverged",
        }
    }

    /// Whether the state shown is the recorded run's own.
    pub fn is_faithful(self) -> bool {
        matches!(self, Fidelity::Exact | Fidelity::ExactWindow | Fidelity::StateOnly)
    }
}

/// What a replay is asked for.
#[derive(Debug, Clone)]
pub struct Want {
    /// The config to replay under (the recorded one unless a what-if).
    pub config: AllocatorConfig,
    /// Whether `config` or `memory_limit` differ from the recording.
    pub changed: bool,
    pub device_total: u64,
    pub memory_limit: Option<u64>,
    pub keep_events: bool,
    pub stop_at: Option<usize>,
    /// CUDA context bytes assumed by what-if runs.
    pub context_bytes: u64,
    /// Whether the recording holds the allocator's state at its end (a
    /// PyTorch snapshot does; our JSON lines and RMM logs do not): only then
    /// is the end state checked, and a window rebuilt.
    pub recorded_state: bool,
    /// Whose allocator rules to replay under.
    pub release: ReleaseAsk,
}

/// The PyTorch releases a replay may follow, most likely first, and why
/// (docs/user/replay.md, "Which release").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseAsk {
    pub(crate) candidates: Vec<Release>,
    pub(crate) why: String,
    /// Named by the user (`--torch`): not second-guessed.
    pub(crate) forced: bool,
}

impl Default for ReleaseAsk {
    fn default() -> Self {
        ReleaseAsk::forced(Release::V2_11, "")
    }
}

impl ReleaseAsk {
    pub fn forced(r: Release, why: &str) -> ReleaseAsk {
        ReleaseAsk { candidates: vec![r], why: why.into(), forced: true }
    }

    /// What the trace's own fields allow, or `torch` where the user named it:
    /// one release per rule set in the range (2.11, 2.12, 2.13+; the newest
    /// allowed for the last, so its settings are known).
    pub fn of(trace: &crate::trace::Trace, torch: Option<Release>) -> ReleaseAsk {
        if let Some(r) = torch {
            return ReleaseAsk::forced(r, "--torch");
        }
        let (lo, hi, why) = trace.release.bounds();
        let [v11, v12, v13] = Release::DISTINCT;
        let mut candidates = Vec::new();
        if lo.minor <= 11 {
            candidates.push(v11);
        }
        if lo.minor <= 12 && hi.minor >= 12 {
            candidates.push(v12);
        }
        if hi.minor >= 13 {
            candidates.push(hi.max(v13));
        }
        ReleaseAsk { candidates, why, forced: false }
    }
}

impl Want {
    /// The replay of `trace` under the config it recorded, on a device of
    /// `device_total` bytes of which the CUDA context takes its usual share
    /// (what-if runs assume it); its end state checked where the format
    /// records one (a PyTorch snapshot).
    pub fn recorded(trace: &crate::trace::Trace, device_total: u64) -> Want {
        Want {
            config: trace.settings.as_ref().map(|s| s.config()).unwrap_or_default(),
            changed: false,
            device_total,
            memory_limit: None,
            keep_events: false,
            stop_at: None,
            context_bytes: crate::device::CUDA_CONTEXT_BYTES,
            recorded_state: Want::records_state(trace),
            release: ReleaseAsk::of(trace, None),
        }
    }

    /// Whether `trace`'s format records the allocator's state (a PyTorch
    /// snapshot's segments), which the replay is checked against.
    pub fn records_state(trace: &crate::trace::Trace) -> bool {
        trace.format == crate::trace::TraceFormat::PytorchSnapshot
    }

    /// The exact replay of a PyTorch snapshot recorded under `config` on a
    /// device of `device_total` bytes, as `replay` opens one.
    pub fn exact(config: AllocatorConfig, device_total: u64) -> Want {
        Want {
            config,
            changed: false,
            device_total,
            memory_limit: None,
            keep_events: false,
            stop_at: None,
            // Only what-if runs assume a context, and an unchanged replay
            // of a snapshot is never one.
            context_bytes: 0,
            recorded_state: true,
            release: ReleaseAsk::default(),
        }
    }
}

/// Totals of a list of segments, as `torch.cuda.memory_snapshot()` sums them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Totals {
    pub(crate) allocated_bytes: u64,
    pub(crate) reserved_bytes: u64,
    pub(crate) segments: usize,
}

impl Totals {
    pub(crate) fn of_recorded(dev: &DeviceTrace) -> Totals {
        Totals {
            allocated_bytes: dev
                .segments
                .iter()
                .flat_map(|s| &s.blocks)
                .filter(|b| b.state == BlockState::ActiveAllocated)
                .map(|b| b.size)
                .sum(),
            reserved_bytes: dev.segments.iter().map(|s| s.total_size).sum(),
            segments: dev.segments.len(),
        }
    }

    pub(crate) fn of(segs: &[SegmentInfo]) -> Totals {
        Totals {
            allocated_bytes: segs.iter().map(|s| s.allocated_size).sum(),
            reserved_bytes: segs.iter().map(|s| s.total_size).sum(),
            segments: segs.len(),
        }
    }
}

/// A recorded device, replayed.
pub struct Session<'a> {
    pub(crate) dev: &'a DeviceTrace,
    pub(crate) start: Start,
    pub fidelity: Fidelity,
    pub(crate) opts: ReplayOptions,
    /// The state before the first event (empty from process start).
    pub(crate) seed: Vec<SeedSegment>,
    /// The replay with recorded addresses.
    pub exact: ReplayResult<'a>,
    /// The requests under the asked config, when they could not be
    /// replayed with recorded addresses.
    pub(crate) what_if: Option<WhatIf>,
    /// Why a replay is `diverged` when every event was reproduced but the
    /// end state is not the snapshot's.
    pub(crate) end_mismatch: Option<String>,
    /// The snapshot's totals, and ours at the end.
    pub recorded: Totals,
    pub replayed: Totals,
    /// The requests (for `--compare` and what-ifs), made on demand, with
    /// the recorded event each comes from.
    reqs: Option<(Vec<Request>, Vec<usize>)>,
    /// Where the run's allocator settings changed, when its segment events
    /// show it and the replay followed the change.
    pub(crate) settings_changed: Option<SettingsChange>,
    /// Whose rules the replay followed, and why.
    pub release: Release,
    pub(crate) release_note: String,
    /// The per-process limit the run had, found from the trace (none asked).
    pub(crate) limit_found: Option<LimitFound>,
    /// What the search for the run's conditions could not settle.
    pub(crate) conditions_note: Option<String>,
    /// The categories' first half, made beside the replay (`open` with
    /// categories asked for), taken by the first to need them.
    prepared: std::sync::Mutex<Option<crate::analysis::categories::Prepared>>,
    /// The screens' scrubber and its checkpoints' interval, made beside the
    /// replay (`open_beside`), taken by the first to ask for it.
    beside_scrubber: std::sync::Mutex<Option<(usize, Scrubber<'a>)>>,
}

/// A change of the allocator's settings during the run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct SettingsChange {
    /// The first recorded event replayed under the final settings.
    pub(crate) event: usize,
    /// The earliest event the change can have come before: between it and
    /// `event` the trace cannot tell (requests are recorded before rounding
    /// and splitting, which the settings decide), so totals that depend on
    /// them (allocated, active, inactive_split) are uncertain; reserved
    /// bytes and segments are not.
    pub(crate) earliest: usize,
    /// The settings before it (`PYTORCH_CUDA_ALLOC_CONF` syntax).
    pub(crate) from: String,
}

/// What a trace's segment events say about a change of
/// `expandable_segments` the final settings do not show.
struct SegmentKindChange {
    before: AllocatorConfig,
    /// Events at which the change may have happened, most likely first:
    /// the first segment event only the final setting explains, then the
    /// event after the last one the earlier setting made.
    candidates: Vec<usize>,
}

fn settings_change(rec: EventsRef<'_>, fin: &AllocatorConfig) -> Option<SegmentKindChange> {
    let es_event = |a: Action| matches!(a, Action::SegmentMap | Action::SegmentUnmap);
    let whole_event = |a: Action| matches!(a, Action::SegmentAlloc);
    let (old_kind, new_kind): (&dyn Fn(Action) -> bool, &dyn Fn(Action) -> bool) =
        if fin.expandable_segments { (&whole_event, &es_event) } else { (&es_event, &whole_event) };
    let first_new = rec.iter().position(|e| new_kind(e.action))?;
    let last_old = rec.slice(..first_new).iter().rposition(|e| old_kind(e.action))?;
    let mut before = fin.clone();
    before.expandable_segments = !fin.expandable_segments;
    before.source = if before.expandable_segments { "expandable_segments:True".into() } else { String::new() };
    Some(SegmentKindChange { before, candidates: vec![first_new, last_old + 1] })
}

/// Whether a device's recording holds a trace at all.
fn has_trace(dev: &DeviceTrace) -> bool {
    dev.events.iter().any(|e| e.action != Action::Snapshot)
}

/// The snapshot's segments as they are, for a state-only snapshot.
fn state_seed(dev: &DeviceTrace) -> Vec<SeedSegment> {
    dev.segments
        .iter()
        .map(|s| SeedSegment {
            address: s.address,
            size: s.total_size,
            stream: s.stream,
            small: s.small,
            pool: s.pool,
            expandable: s.is_expandable,
            mapped: Vec::new(),
            blocks: s
                .blocks
                .iter()
                .filter(|b| b.state != BlockState::Inactive)
                .map(|b| SeedBlock {
                    address: b.address,
                    size: b.size,
                    requested: b.requested_size,
                    pending: b.state == BlockState::ActivePendingFree,
                })
                .collect(),
        })
        .collect()
}

/// The conditions the run had that the snapshot does not state: a
/// per-process limit, settings changed mid-run (docs/user/replay.md,
/// "Conditions"). Searched only where the trace shows their marks: a
/// divergence, releases left to `empty_cache()`, an OOM with the device's
/// memory free, or a GC threshold. `exact`: the replay under the recorded
/// settings (stopped early when `stopped`).
fn find_conditions<'a>(
    search: &conditions::Search<'_, 'a>,
    dev: &'a DeviceTrace,
    opts: &ReplayOptions,
    seed: &[SeedSegment],
    exact: &ReplayResult<'a>,
    stopped: bool,
    start: Start,
) -> Result<(Option<conditions::Found>, conditions::Recorded), SessionError> {
    let rec = dev.events.view();
    let mut so = opts.clone();
    so.stop_at = None;
    let failed = || SessionError::NoWindowStart("the replay failed".into());
    let base = if stopped { search.eval(&so).ok_or_else(failed)? } else { conditions::Reach::of(exact) };
    let seed_reserved: u64 =
        seed.iter().map(|s| if s.mapped.is_empty() { s.size } else { s.mapped.iter().map(|m| m.1).sum() }).sum();
    let recd = conditions::Recorded::of(rec, seed_reserved, &opts.config);
    let gc = opts.config.garbage_collection_threshold > 0.0;
    if base.exact && base.inferred == 0 && recd.process_limit_ooms == 0 && !gc {
        return Ok((None, recd));
    }
    if let Some((l, r)) = search.limit(&so, &base, &recd) {
        if r.exact {
            so.memory_limit = Some(l.used_bytes);
            return Ok((Some(conditions::Found { limit: Some(l), switch: None, opts: so }), recd));
        }
    }
    // An exact replay is searched for a change only where a GC threshold
    // (which acts under a limit) may have come mid-run, and kept only if it
    // leaves fewer releases to `empty_cache()`.
    if (base.exact && !(gc && base.inferred > 0)) || start != Start::ProcessStart {
        return Ok((None, recd));
    }
    // Expandable segments leave `segment_map` events, whole ones
    // `segment_alloc`: with one kind only, the earlier settings made that kind.
    let kinds = settings_change(rec, &opts.config);
    let es = match &kinds {
        Some(k) => k.before.expandable_segments,
        None => dev.has_map_events(),
    };
    let befores = conditions::befores(&opts.config, es, opts.release);
    let at = kinds.as_ref().map(|k| k.candidates.clone()).unwrap_or_default();
    Ok((
        search
            .switch(rec, &so, &befores, &at, &recd)
            .filter(|(_, _, r)| !base.exact || r.inferred < base.inferred)
            .map(|(limit, sw, _)| {
                let mut o = so.clone();
                o.config = sw.before.clone();
                o.switch = Some((sw.event, opts.config.clone()));
                o.memory_limit = limit.as_ref().map(|l| l.used_bytes);
                conditions::Found { limit, switch: Some(sw), opts: o }
            }),
        recd,
    ))
}

/// What a search that found nothing says: that it ran out of budget, that
/// the settings changed where the replay could not place it (in the
/// divergence's reason), or that a GC threshold means an unbounded limit.
fn unsettled(
    search: &conditions::Search<'_, '_>,
    rec: EventsRef<'_>,
    conf: &AllocatorConfig,
    exact: &mut ReplayResult<'_>,
    recd: &conditions::Recorded,
) -> Option<String> {
    if search.ran_out() {
        return Some(format!(
            "the search for a memory limit or a change of settings the run had stopped: {} events are too many to replay under every candidate; pass --memory-limit or --alloc-conf to set them",
            rec.len()
        ));
    }
    if let (Some(change), Some(d)) = (settings_change(rec, conf), exact.divergence.as_mut()) {
        d.reason = format!(
            "{}; the allocator settings changed during the run (its segment events are {} before event {}, while the snapshot's final settings say {:?}: torch.cuda.memory._set_allocator_settings), and the replay could not place the change",
            d.reason,
            if change.before.expandable_segments { "expandable segments'" } else { "whole segments'" },
            change.candidates.first().copied().unwrap_or(0),
            conf.source
        );
    }
    (conf.garbage_collection_threshold > 0.0 && exact.divergence.is_none()).then(|| format!(
        "garbage_collection_threshold acts only under a per-process memory limit, so the run had one: at least {} (its peak reserved), and nothing in the trace bounds it above; pass --memory-limit or --memory-fraction to set it",
        crate::analysis::human_bytes(recd.peak_reserved)
    ))
}

/// Says which release's rules a replay followed and why.
fn release_note(ask: &ReleaseAsk, chosen: Release, tried: &[Release], reproduced: bool) -> String {
    let rules = |r: Release| if r.minor >= 13 { format!("{r} (2.13+ rules)") } else { format!("{r}") };
    if ask.forced {
        return format!("{}, as --torch says", rules(chosen));
    }
    if ask.candidates.len() == 1 {
        return format!("{}: {}", rules(chosen), ask.why);
    }
    let list: Vec<String> = ask.candidates.iter().map(|r| r.to_string()).collect();
    let why = if ask.why.is_empty() { String::new() } else { format!(" ({})", ask.why) };
    if reproduced {
        format!(
            "{}: the file cannot tell {}{why}; {} reproduces the trace{}",
            rules(chosen),
            list.join(", "),
            chosen,
            if tried.len() > 1 { format!(" ({} tried)", tried.len()) } else { String::new() }
        )
    } else {
        format!(
            "{}: the file cannot tell {}{why}, and none reproduces the trace; shown under the first",
            rules(chosen),
            list.join(", ")
        )
    }
}

/// Why a device's replay cannot start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error("the snapshot has no trace and no segments")]
    Empty,
    /// A window of a longer run whose start no state the file holds can
    /// make (docs/user/replay.md, "Windows").
    #[error("{0}")]
    NoWindowStart(String),
}

/// The pools' plan under `release`, and where the history starts: two
/// passes over the events that need nothing of each other, so side by
/// side, the plan on a thread of its own where the system gives one.
fn plan_and_start(
    dev: &DeviceTrace,
    stacks: &[Vec<Frame>],
    release: Release,
    recorded_state: bool,
) -> Result<(pools::PoolPlan, Start), SessionError> {
    std::thread::scope(|s| {
        let plan =
            std::thread::Builder::new().name("pools".into()).spawn_scoped(s, || pools::plan(dev, stacks, release)).ok();
        let start = start_of(dev, recorded_state);
        let plan = match plan.map(|h| h.join()) {
            Some(Ok(p)) => p,
            Some(Err(panic)) => std::panic::resume_unwind(panic),
            None => pools::plan(dev, stacks, release),
        };
        Ok((plan, start?))
    })
}

/// Where a recorded device's replay starts: its state alone (no trace),
/// process start, or a window of a longer run (docs/user/replay.md).
fn start_of(dev: &DeviceTrace, recorded_state: bool) -> Result<Start, SessionError> {
    Ok(if !has_trace(dev) {
        if dev.segments.is_empty() {
            return Err(SessionError::Empty);
        }
        Start::StateOnly
    } else if !recorded_state || starts_empty(dev) {
        Start::ProcessStart
    } else {
        Start::Window
    })
}

/// Where `dev`'s replay under `config` starts and the state it starts from,
/// as `Session::open` tries them first (a window's live blocks rebuilt from
/// the snapshot's segments, before any tie or size the window's replay may
/// correct), without replaying; `None` for a snapshot with no trace. For
/// work made beside the session and kept only where it agrees.
pub(crate) fn first_start(
    dev: &DeviceTrace,
    config: &AllocatorConfig,
    device_total: u64,
    recorded_state: bool,
) -> Option<(Start, Vec<SeedSegment>)> {
    let start = start_of(dev, recorded_state).ok().filter(|s| *s != Start::StateOnly)?;
    Some((start, first_seed(dev, start, config, device_total)?))
}

/// The state a replay from `start` begins in, as the session's first
/// replay takes it: nothing from process start, the snapshot's segments
/// when there is no trace, a window's live blocks as `reconstruct` rebuilds
/// them (`None` where it cannot).
fn first_seed(
    dev: &DeviceTrace,
    start: Start,
    config: &AllocatorConfig,
    device_total: u64,
) -> Option<Vec<SeedSegment>> {
    match start {
        Start::ProcessStart => Some(Vec::new()),
        Start::StateOnly => Some(state_seed(dev)),
        Start::Window => reconstruct(dev, config, device_total).ok().map(|(seed, _)| seed),
    }
}

/// The options a scrubber replays under: the session's, over every event,
/// keeping none.
fn scrub_options_of(opts: &ReplayOptions) -> ReplayOptions {
    let mut o = opts.clone();
    o.stop_at = None;
    o.keep_events = false;
    o
}

/// The options of a session's first replay: as `req` asks, under the
/// first release it allows, with the pools' `plan`.
fn first_options(req: &Want, plan: pools::PoolPlan, dev: &DeviceTrace) -> ReplayOptions {
    let mut opts = ReplayOptions::new(req.config.clone(), req.device_total);
    opts.memory_limit = req.memory_limit;
    opts.keep_events = req.keep_events;
    opts.stop_at = req.stop_at;
    opts.pools = Arc::new(plan);
    opts.exact = Arc::from(dev.exact.as_slice());
    opts.release = req.release.candidates[0];
    opts
}

/// A replay's start (a window's, or a state-only snapshot's) and result.
type Replayed<'a> = (Vec<SeedSegment>, ReplayResult<'a>);

/// A scrubber made beside the first replay, from `seed`.
struct Beside<'a> {
    seed: Vec<SeedSegment>,
    every: usize,
    made: Result<Scrubber<'a>, Divergence>,
}

impl<'a> Beside<'a> {
    fn kept(self) -> Option<(usize, Scrubber<'a>)> {
        self.made.ok().map(|s| (self.every, s))
    }
}

type Run<'r, 'a> = dyn Fn(&ReplayOptions) -> Result<Replayed<'a>, SessionError> + Sync + 'r;

/// The first replay (`run` under `opts`), and beside it, where `every`
/// asks, the screens' scrubber from where that replay starts (a window's
/// live blocks as rebuilt before any correction): both need only the
/// options and the start, so a screen's first frame waits for one pass
/// over the events, not two (docs/measurements/benchmarks.md). Where the
/// replay ran behind the decoding (`ahead`) and is this one, from process
/// start, it is taken instead, with the scrubber its pass kept
/// (docs/design/trace-decoding.md, "The replay behind the decoder", "The
/// screen behind the decoding").
fn first_run<'a>(
    run: &Run<'_, 'a>,
    opts: &ReplayOptions,
    dev: &'a DeviceTrace,
    start: Start,
    every: Option<usize>,
    ahead: Option<&Ahead>,
) -> Result<(Replayed<'a>, Option<Beside<'a>>), SessionError> {
    let behind = ahead.filter(|_| start == Start::ProcessStart);
    if behind.is_none() {
        // A window's replay starts elsewhere: the one behind the decoding
        // would only take a core from it.
        ahead.inspect(|a| a.cancel());
    }
    if let Some((r, scrubbed)) = behind.and_then(|a| a.take_for(dev, opts, every)) {
        let beside = every.zip(scrubbed).map(|(every, made)| Beside { seed: Vec::new(), every, made });
        return Ok(((Vec::new(), r), beside));
    }
    let Some(every) = every else { return Ok((run(opts)?, None)) };
    let so = scrub_options_of(opts);
    let scrub = move || {
        let seed = first_seed(dev, start, &so.config, so.device_total)?;
        let made = Scrubber::tagged(dev.events.view(), &dev.stacks, &so, &seed, every);
        Some(Beside { seed, every, made })
    };
    std::thread::scope(|s| {
        // A thread the system will not give means no scrubber beside: the
        // screen makes it after.
        let beside = std::thread::Builder::new().name("scrubber".into()).spawn_scoped(s, scrub).ok();
        let first = run(opts);
        let beside = beside.and_then(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
        Ok((first?, beside))
    })
}

/// Every event reproduced, but not the snapshot's end state: said with both.
fn end_mismatch(replayed: Totals, recorded: Totals) -> String {
    format!(
        "every event was reproduced, but the end state is not the snapshot's: ours {} B allocated, {} B reserved in {} segments; the snapshot's {} B, {} B in {}",
        replayed.allocated_bytes,
        replayed.reserved_bytes,
        replayed.segments,
        recorded.allocated_bytes,
        recorded.reserved_bytes,
        recorded.segments
    )
}

/// The age of segments made before a window decides ties from 2.12 and is
/// not in the recording: how the replay ranked them.
fn window_age_note(seeded: usize, ties_resolved: usize) -> String {
    format!(
        "; the {seeded} segments made before the window are ranked by age from {ties_resolved} tie{} the window resolved, the rest by address (their age is not in the recording)",
        if ties_resolved == 1 { "" } else { "s" }
    )
}

/// A replay's fidelity from what it was and how it went.
fn fidelity_of(requests_only: bool, faithful: bool, start: Start, changed: bool) -> Fidelity {
    match (requests_only, faithful, start) {
        (true, _, _) => Fidelity::WhatIf,
        (false, true, Start::StateOnly) => Fidelity::StateOnly,
        (false, true, Start::Window) => Fidelity::ExactWindow,
        (false, true, Start::ProcessStart) => Fidelity::Exact,
        (false, false, _) if changed => Fidelity::WhatIf,
        (false, false, _) => Fidelity::Diverged,
    }
}

impl<'a> Session<'a> {
    /// Opens `dev` (of a trace whose interned stacks are `stacks`) and
    /// replays it once as `req` asks.
    pub fn open(dev: &'a DeviceTrace, stacks: &[Vec<Frame>], req: &Want) -> Result<Session<'a>, SessionError> {
        Self::open_beside(dev, stacks, req, None, None)
    }

    /// As `open`, taking the first replay from `ahead` (run behind the
    /// decoding) where it is the one this session would run; with
    /// `scrub_every`, for a screen or an export, the scrubber it steps
    /// through (a checkpoint every so many events) is made beside the
    /// replay or taken from behind the decoding, and `scrubber` hands it
    /// over where the replay kept its first options and start.
    pub(crate) fn open_beside(
        dev: &'a DeviceTrace,
        stacks: &[Vec<Frame>],
        req: &Want,
        scrub_every: Option<usize>,
        ahead: Option<&Ahead>,
    ) -> Result<Session<'a>, SessionError> {
        let rec: EventsRef<'a> = dev.events.view();
        let (plan, start) = plan_and_start(dev, stacks, req.release.candidates[0], req.recorded_state)?;
        let mut opts = first_options(req, plan, dev);
        let run = |opts: &ReplayOptions| -> Result<Replayed<'a>, SessionError> {
            Ok(match start {
                Start::ProcessStart => (Vec::new(), replay_events(rec, opts)),
                Start::StateOnly => {
                    let seed = state_seed(dev);
                    let r = replay_events_from(rec, opts, &seed);
                    (seed, r)
                }
                Start::Window => {
                    let (r, seed) = replay_wrapped(rec, opts, dev, 256).map_err(SessionError::NoWindowStart)?;
                    (seed, r)
                }
            })
        };
        // Each release the file allows, until one reproduces the trace.
        let ask = &req.release;
        let ((mut seed, mut exact), beside) = first_run(&run, &opts, dev, start, scrub_every, ahead)?;
        // Whether the replay kept the first run's options (the scrubber
        // made beside it is then the one asked for).
        let mut first_kept = true;
        let mut tried = vec![opts.release];
        // Requests alone (no segment events, no state) are a what-if on a
        // simulated device whatever the release: nothing to tell them apart.
        let tell_apart = req.recorded_state || dev.has_segment_events();
        for &r in ask.candidates.iter().skip(1).filter(|_| tell_apart) {
            if exact.divergence.is_none() {
                break;
            }
            let mut o = opts.clone();
            o.release = r;
            o.pools = Arc::new(pools::plan(dev, stacks, r));
            let (s2, e2) = run(&o)?;
            tried.push(r);
            if e2.divergence.is_none() {
                (seed, exact, opts) = (s2, e2, o);
                first_kept = false;
            }
        }
        let chosen = opts.release;
        let mut release_note = release_note(ask, chosen, &tried, exact.divergence.is_none());
        if start == Start::Window && chosen.tie_break() != crate::alloc::TieBreak::Address && seed.len() > 1 {
            release_note.push_str(&window_age_note(seed.len(), exact.ties_resolved));
        }
        // The conditions the run had that the snapshot does not state: a
        // per-process limit, settings changed mid-run (docs/user/replay.md,
        // "Conditions"). Searched only where the trace shows their marks.
        let mut settings_changed = None;
        let mut limit_found = None;
        let mut conditions_note = None;
        if req.memory_limit.is_none() && !req.changed && req.recorded_state && start != Start::StateOnly {
            let started = |o: &ReplayOptions| run(o).ok();
            let search = conditions::Search::new(&started, rec.len(), req.device_total);
            let (found, recd) = find_conditions(&search, dev, &opts, &seed, &exact, req.stop_at.is_some(), start)?;
            match found {
                Some(f) => {
                    let mut o = f.opts;
                    o.stop_at = req.stop_at;
                    (seed, exact) = run(&o)?;
                    opts = o;
                    first_kept = false;
                    settings_changed = f.switch.map(|s| SettingsChange {
                        event: s.event,
                        earliest: s.earliest,
                        from: s.before.source,
                    });
                    limit_found = f.limit;
                }
                None => conditions_note = unsettled(&search, rec, &opts.config, &mut exact, &recd),
            }
        }
        let recorded = Totals::of_recorded(dev);
        let replayed = Totals::of(&exact.allocator.snapshot());
        let complete = req.recorded_state && req.stop_at.is_none_or(|s| s >= rec.len());
        let end_mismatch =
            (exact.divergence.is_none() && complete && replayed != recorded).then(|| end_mismatch(replayed, recorded));
        let faithful = exact.divergence.is_none() && end_mismatch.is_none();
        // Requests alone (no segment events, no state): replayed on the
        // simulated device, which is a what-if of PyTorch's allocator.
        let fidelity = fidelity_of(!req.recorded_state && !dev.has_segment_events(), faithful, start, req.changed);
        let scrubber = beside.filter(|b| first_kept && b.seed == seed).and_then(Beside::kept);
        let mut s = Session {
            dev,
            start,
            fidelity,
            opts,
            seed,
            exact,
            what_if: None,
            end_mismatch,
            recorded,
            replayed,
            reqs: None,
            settings_changed,
            release: chosen,
            release_note,
            limit_found,
            conditions_note,
            prepared: Default::default(),
            beside_scrubber: std::sync::Mutex::new(scrubber),
        };
        if fidelity == Fidelity::WhatIf {
            let w =
                run_requests(s.requests(), req.config.clone(), req.device_total, req.context_bytes, req.memory_limit);
            s.what_if = Some(w);
        }
        Ok(s)
    }

    /// Whether the replay ran the recorded history to its end exactly (a
    /// snapshot without history has none).
    pub fn replayed_history(&self) -> bool {
        self.exact.divergence.is_none() && self.start != Start::StateOnly
    }

    /// What each block of the recorded run is (docs/user/categories.md),
    /// from the replay's own allocation order where it ran the history
    /// exactly; `stacks` and `annotations` are the trace's.
    pub(crate) fn categories(&self, stacks: &[Vec<Frame>], annotations: &[crate::trace::Annotation]) -> Categories {
        let order = self.replayed_history().then_some((&self.exact.allocated, self.exact.allocated_before));
        self.categories_sized_by(stacks, annotations, order)
    }

    /// `categories` with the blocks' sizes from `order` (how allocated bytes
    /// changed at each event, and before the first), the first half taken
    /// from beside the replay where it was made there.
    pub(crate) fn categories_sized_by(
        &self,
        stacks: &[Vec<Frame>],
        annotations: &[crate::trace::Annotation],
        order: Option<(&Arc<crate::trace::deltas::Deltas>, u64)>,
    ) -> Categories {
        let start = crate::analysis::categories::start_blocks(self.dev, &self.seed);
        let prepared = self.take_prepared().unwrap_or_else(|| Categories::prepare(self.dev, stacks, annotations));
        Categories::finish(prepared, self.dev, stacks, &start, order)
    }

    /// Keeps what `Categories::prepare` made of this session's trace (the
    /// trace's own stacks and annotations) for `categories`.
    pub(crate) fn set_prepared(&mut self, p: crate::analysis::categories::Prepared) {
        if p.fits(self.dev.events.len()) {
            *self.prepared.get_mut().unwrap_or_else(|e| e.into_inner()) = Some(p);
        }
    }

    /// The prepared categories, once.
    fn take_prepared(&self) -> Option<crate::analysis::categories::Prepared> {
        self.prepared.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// The limit replayed under: the one asked for, or the run's own as
    /// found from the trace.
    pub fn memory_limit(&self) -> Option<u64> {
        self.opts.memory_limit
    }

    /// Where the exact replay inferred `empty_cache()` calls, if it ran to
    /// the end (the requests' `EmptyCache`s).
    pub(crate) fn empty_cache_at(&self) -> &[usize] {
        if self.exact.divergence.is_none() {
            &self.exact.empty_cache_at
        } else {
            &[]
        }
    }

    /// The trace's requests, with the inferred `empty_cache()` calls.
    pub(crate) fn requests(&mut self) -> &[Request] {
        if self.reqs.is_none() {
            let at = self.empty_cache_at().to_vec();
            self.reqs = Some(requests_with_events(self.dev.events.view(), &at));
        }
        self.reqs.as_ref().map_or(&[], |(r, _)| r.as_slice())
    }

    /// The recorded event of the first allocation that a what-if run could
    /// not make though the recording did, with how many failed in all.
    pub(crate) fn first_new_oom(&self) -> Option<(usize, u64)> {
        let w = self.what_if.as_ref()?;
        // The what-if ran on `requests()`, which keeps each one's event.
        let (_, events) = self.reqs.as_ref()?;
        Some((events.get(w.first_new_oom?).copied()?, w.new_ooms))
    }

    /// A what-if's peak: the recorded event whose request first reached the
    /// highest allocated bytes under the asked config, and the reserved
    /// bytes then.
    pub(crate) fn what_if_peak(&self) -> Option<super::engine::Peak> {
        let (i, allocated, reserved) = self.what_if.as_ref()?.peak?;
        let (_, events) = self.reqs.as_ref()?;
        Some(super::engine::Peak { event: *events.get(i)?, allocated, reserved })
    }

    /// The divergence to report: the first event not reproduced, or the
    /// end state that is not the snapshot's.
    pub(crate) fn divergence(&self) -> Option<Divergence> {
        if self.fidelity != Fidelity::Diverged {
            return None;
        }
        self.exact.divergence.clone().or_else(|| {
            self.end_mismatch.as_ref().map(|reason| Divergence {
                event: self.dev.events.len(),
                expected: None,
                got: None,
                reason: reason.clone(),
            })
        })
    }

    /// A scrubber over the recording (for the TUI and `export`), with call
    /// stacks as block tags. Only for a faithful replay.
    pub fn scrubber(&self, every: usize) -> Result<Scrubber<'a>, Divergence> {
        let made = self.beside_scrubber.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((_, s)) = made.filter(|(e, _)| *e == every) {
            return Ok(s);
        }
        Scrubber::tagged(self.dev.events.view(), &self.dev.stacks, &self.scrub_options(), &self.seed, every)
    }

    fn scrub_options(&self) -> ReplayOptions {
        scrub_options_of(&self.opts)
    }

    /// The state after the last event as a scrubber seeking there gives it
    /// (each live block tagged with its allocation's call stack), taken
    /// from the exact replay's end instead of a second pass: the blocks'
    /// tags from the last allocation at each live address, found going
    /// back from the end. `None` where the replay did not run every event.
    pub(crate) fn end_state(&self) -> Option<Vec<SegmentInfo>> {
        let rec = self.dev.events.view();
        if !self.replayed_history() || self.exact.reproduced != rec.len() {
            return None;
        }
        let mut segs = self.exact.allocator.snapshot();
        let live = |b: &crate::alloc::BlockInfo| b.state != BlockState::Inactive;
        let mut tags: std::collections::HashMap<u64, Option<u32>, crate::trace::pickle::FastHash> =
            segs.iter().flat_map(|s| &s.blocks).filter(|b| live(b)).map(|b| (b.address, None)).collect();
        let mut left = tags.len();
        for i in (0..rec.len()).rev() {
            if left == 0 {
                break;
            }
            let e = rec.at(i);
            if e.action != Action::Alloc {
                continue;
            }
            if let Some(t @ None) = tags.get_mut(&e.addr) {
                *t = Some(self.dev.stacks.get(i).copied().unwrap_or(0));
                left -= 1;
            }
        }
        // A block live since before a window has no allocation in it.
        for b in segs.iter_mut().flat_map(|s| &mut s.blocks).filter(|b| live(b)) {
            b.tag = tags.get(&b.address).copied().flatten().unwrap_or(0);
        }
        Some(segs)
    }

    /// A scrubber without checkpoints, to read a few states in event order
    /// (a report's state at the peak, at an OOM, at the end): each seek
    /// goes on from the last, and neither allocator states nor the
    /// timeline are kept (at ten million events the screens' checkpoints
    /// are hundreds of MB, the timeline 160 MB).
    pub fn forward_scrubber(&self) -> Result<Scrubber<'a>, Divergence> {
        match &self.exact.divergence {
            Some(d) => Err(d.clone()),
            // The exact replay reproduced every event: a seek cannot fail.
            None if self.exact.reproduced == self.dev.events.len() => {
                Scrubber::forward(self.dev.events.view(), &self.dev.stacks, &self.scrub_options(), &self.seed)
            }
            None => self.scrubber(usize::MAX),
        }
    }

    /// As `forward_scrubber`, with the timeline (one pass first).
    pub fn forward_scrubber_with_timeline(&self) -> Result<Scrubber<'a>, Divergence> {
        self.scrubber(usize::MAX)
    }
}

#[cfg(test)]
mod tests {
    use crate::replay::model::ReplayModel;
    use crate::replay::{open, OpenOptions};

    /// The end state taken from the exact replay is the one a scrubber
    /// seeking to the last event reaches, tags included: from process
    /// start, a window (blocks live before it untagged), private pools.
    #[test]
    fn the_end_state_is_the_scrubbers_without_a_second_pass() {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        for name in [
            "traces/resnet50_train.pickle.gz",
            "traces/gpt2_train_wrapped.pickle.gz",
            "snapshot_kinds/wrapped_steady_resnet50.pickle.gz",
            "snapshot_kinds/mempools.pickle.gz",
            "snapshot_kinds/graphed_mlp_train.pickle.gz",
            "conditions/switch_split.pickle.gz",
        ] {
            let tagged = ["resnet50_train", "graphed_mlp", "switch_split"].iter().any(|k| name.contains(k));
            let t = crate::trace::load(&root.join(name)).unwrap();
            let a = open(&t, name, &OpenOptions::default()).unwrap();
            let end = a.session.end_state().expect(name);
            let n = a.dev.events.len();
            let scrubbed = a.session.forward_scrubber().unwrap().seek(n - 1).snapshot();
            let tags = |s: &[crate::alloc::SegmentInfo]| -> Vec<u32> {
                s.iter().flat_map(|s| &s.blocks).map(|b| b.tag).collect()
            };
            assert_eq!(tags(&end).iter().any(|&t| t > 0), tagged, "{name}: some block is tagged");
            assert_eq!(tags(&end), tags(&scrubbed), "{name}");
            assert_eq!(end, scrubbed, "{name}");
        }
        // Stopped early, the replay's end is not the trace's.
        let t = crate::trace::load(&root.join("traces/resnet50_train.pickle.gz")).unwrap();
        let a = open(&t, "", &OpenOptions { stop_at: Some(100), ..OpenOptions::default() }).unwrap();
        assert!(a.session.end_state().is_none());
    }

    /// A screen's scrubber made beside the replay is the one made after
    /// it: the same timeline, the same state at every event sought. It is
    /// kept where the replay kept its first options and start (a run from
    /// process start, a window), and made after where the replay found
    /// the run's conditions and replayed again under them (a limit, a
    /// change of settings).
    #[test]
    fn the_scrubber_made_beside_the_replay_is_the_one_made_after() {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        for (name, kept) in [
            ("traces/resnet50_train.pickle.gz", true),
            ("snapshot_kinds/wrapped_steady_resnet50.pickle.gz", true),
            ("snapshot_kinds/mempools.pickle.gz", true),
            ("conditions/limit_retries.pickle.gz", false),
            ("conditions/limit_es_gc.pickle.gz", false),
            ("conditions/switch_split.pickle.gz", false),
        ] {
            let t = crate::trace::load(&root.join(name)).unwrap();
            let beside = OpenOptions { scrub_every: Some(ReplayModel::STEPPING), ..OpenOptions::default() };
            let a = open(&t, name, &beside).unwrap();
            let b = open(&t, name, &OpenOptions::default()).unwrap();
            assert!(a.session.fidelity.is_faithful(), "{name}: {:?}", a.session.fidelity);
            let made = a.session.beside_scrubber.lock().unwrap().is_some();
            assert_eq!(made, kept, "{name}");
            let (mut sa, mut sb) = (
                a.session.scrubber(ReplayModel::STEPPING).unwrap(),
                b.session.scrubber(ReplayModel::STEPPING).unwrap(),
            );
            assert!(a.session.beside_scrubber.lock().unwrap().is_none(), "{name}: handed over once");
            assert_eq!(sa.points(), sb.points(), "{name}");
            let n = a.dev.events.len();
            for e in [n - 1, n / 2, 3, n - 2, a.session.exact.peak.event] {
                assert_eq!(sa.seek(e).snapshot(), sb.seek(e).snapshot(), "{name}: event {e}");
                assert_eq!(sa.seek(e).memory_stats(), sb.seek(e).memory_stats(), "{name}: event {e}");
            }
        }
    }
}
