//! The replay and synth apps: a model, a cursor or a running workload, and
//! what the keys selected; each frame is drawn from them as an immutable
//! `View`.

use super::event::{AppEvent, Command, Interactive, Screen};
use crate::device::{Device, Sim};
use crate::export::picture::{Format, ViewKind};
use crate::replay::model::ReplayModel;
use crate::timeline::Step;
use crate::view::parts::{Chrome, ColorBy, Marks};
use crate::view::screen::{ReplayScreen, StateScreen};
use crate::view::Focus;
use crate::workload::driver::{Driver, Progress};
use ratatui_core::widgets::Widget;

pub struct ReplayApp<'a> {
    /// The trace and where its cursor is (`ReplayModel::go`).
    pub(crate) model: ReplayModel<'a>,
    pub(crate) screen: Screen,
    color: bool,
    status: String,
    /// The segments the selection was last kept in, and the event they
    /// are the state after: a frame at that event draws them rather than
    /// walking the allocator again.
    segments: (usize, Vec<crate::alloc::SegmentInfo>),
    /// A move left to the next frame (`go`), which seeks while a helper
    /// draws the timeline; made here before the next key.
    going: Option<usize>,
}

impl<'a> ReplayApp<'a> {
    /// The checked advice for the trace's OOM (`tune::oom_advice`), shown
    /// as the OOM box's last row.
    pub fn set_oom_advice(&mut self, advice: Option<String>) {
        self.model.oom_advice = advice;
    }

    /// Opens at the peak.
    pub fn new(mut model: ReplayModel<'a>, color: bool) -> Self {
        model.go(model.peak_at.unwrap_or(0));
        let mut app = ReplayApp {
            model,
            screen: Screen::default(),
            color,
            status: String::new(),
            segments: (0, Vec::new()),
            going: None,
        };
        app.clamp();
        app
    }

    /// Moves to the state after `event` (after the malloc it is part of).
    /// Where frames are drawn with a helper and the timeline is long, the
    /// next frame makes the move: it seeks while the helper draws the
    /// timeline (`ReplayScreen::going`; docs/measurements/benchmarks.md,
    /// "A jump's seek beside its timeline").
    pub fn go(&mut self, event: usize) {
        if crate::view::beside(self.model.points().len()) {
            self.going = Some(event);
            return;
        }
        self.going = None;
        self.model.go(event);
        self.clamp();
    }

    /// The move left to a frame made, where no frame made it yet, and the
    /// selection kept in its state.
    fn settle(&mut self) {
        if let Some(event) = self.going.take() {
            self.model.go(event);
            self.clamp();
        }
    }

    /// The selection within the state shown (its segment and block exist).
    fn clamp(&mut self) {
        let segs = self.model.now().state().snapshot();
        self.screen.sel = self.screen.sel.clamped(&segs);
        self.segments = (self.model.cursor(), segs);
    }

    /// The event whose state the screen shows (a move left to the next
    /// frame, `go`, once that frame is drawn).
    pub fn cursor(&self) -> usize {
        self.model.cursor()
    }

    /// `s`: the focused view as SVG in the current directory.
    fn screenshot(&mut self) -> String {
        let view = focused_view(&self.screen);
        let stem = self.model.name.split('.').next().unwrap_or("trace").to_string();
        let cursor = self.model.cursor();
        let name = screenshot_name(&stem, view, &format!("event{cursor}"));
        match crate::export::replay::picture(
            &mut self.model,
            cursor,
            view,
            Format::Svg,
            1600,
            true,
            self.screen.sel.color_by,
        ) {
            Ok(b) => save(&name, &b),
            Err(e) => format!(" screenshot failed: {e}"),
        }
    }
}

impl Interactive for ReplayApp<'_> {
    fn mode(&self) -> crate::keys::Mode {
        // A snapshot without history holds one state: no keys that step.
        if self.model.points().is_empty() {
            crate::keys::Mode::Snapshot
        } else {
            crate::keys::Mode::Replay
        }
    }
    fn say(&mut self, msg: String) {
        self.status = msg;
    }
    fn draw_into(&self, area: ratatui_core::layout::Rect, buf: &mut ratatui_core::buffer::Buffer) {
        let status = self.status.clone();
        let mode = Some(self.mode());
        // The segments clamped against, if the model has not moved since
        // (`model` is the crate's to move).
        let (at, segs) = &self.segments;
        let segments = (*at == self.model.cursor()).then_some(segs.as_slice());
        let going = self.going;
        ReplayScreen { model: &self.model, sel: self.screen.sel, color: self.color, status, mode, segments, going }
            .render(area, buf);
    }

    fn apply(&mut self, a: Command) {
        self.settle();
        self.status.clear();
        if self.screen.apply(a) {
            self.clamp();
            return;
        }
        let cursor = self.model.cursor();
        if let Some(step) = step_of(a) {
            if matches!(step, Step::Previous | Step::Next) {
                self.model.step(step);
                self.clamp();
            } else {
                self.go(self.model.jump(step));
            }
            return;
        }
        match a {
            Command::Peak => {
                if let Some(p) = self.model.peak_at {
                    self.go(p);
                    self.status = format!(" peak: event {p}");
                }
            }
            Command::NextOom => {
                let ooms = &self.model.ooms;
                match ooms.iter().find(|&&o| o > cursor).or(ooms.first()).copied() {
                    Some(o) => {
                        self.go(o);
                        self.status = format!(" OOM at event {o}");
                    }
                    None => self.status = " this trace has no OOM".into(),
                }
            }
            Command::Screenshot => self.status = self.screenshot(),
            Command::Plus | Command::Minus => self.zoom(a == Command::Plus),
            _ => {}
        }
    }

    fn quit(&self) -> bool {
        self.screen.quit
    }
}

impl ReplayApp<'_> {
    /// `+`/`-`: the timeline's window around the cursor halved or doubled,
    /// down to `MIN_ZOOM_POINTS` events, up to the whole run.
    fn zoom(&mut self, closer: bool) {
        let n = self.model.points().len();
        let span = |level: u8| crate::view::Zoom::of(n, 0, level).map_or(n, |w| w.hi - w.lo);
        let z = &mut self.screen.sel.timeline_zoom;
        if closer {
            if span(z.saturating_add(1)) < span(*z) {
                *z += 1;
            } else {
                self.status = format!(" the timeline is as close as it zooms ({} events)", span(*z));
            }
        } else if *z > 0 {
            *z -= 1;
        } else {
            self.status = " the timeline shows the whole run".into();
        }
    }
}

self_cell::self_cell!(
    /// A replay screen that owns its trace (one opened over another
    /// screen: the model borrows the events it replays).
    struct ReplayCell {
        owner: crate::trace::Trace,
        #[not_covariant]
        dependent: ReplayApp,
    }
);

/// A snapshot opened over another screen (the live view's `S`, a rank's
/// Enter): the replay app over its own trace, and what it says as it
/// closes.
pub struct OpenedReplay {
    cell: ReplayCell,
    closed: super::event::Closed,
}

impl OpenedReplay {
    /// `build` makes the app over `trace` (and says what to tell the screen
    /// under it on closing).
    pub(crate) fn new<E>(
        trace: crate::trace::Trace,
        build: impl for<'t> FnOnce(&'t crate::trace::Trace) -> Result<(ReplayApp<'t>, super::event::Closed), E>,
    ) -> Result<Self, E> {
        let mut closed = super::event::Closed::default();
        let cell = ReplayCell::try_new(trace, |t| {
            let (app, c) = build(t)?;
            closed = c;
            Ok(app)
        })?;
        Ok(OpenedReplay { cell, closed })
    }
}

impl Interactive for OpenedReplay {
    fn draw_into(&self, area: ratatui_core::layout::Rect, buf: &mut ratatui_core::buffer::Buffer) {
        self.cell.with_dependent(|_, app| app.draw_into(area, buf));
    }
    fn apply(&mut self, a: Command) {
        self.cell.with_dependent_mut(|_, app| app.apply(a));
    }
    fn mode(&self) -> crate::keys::Mode {
        self.cell.with_dependent(|_, app| app.mode())
    }
    fn say(&mut self, msg: String) {
        self.cell.with_dependent_mut(|_, app| app.say(msg));
    }
    fn quit(&self) -> bool {
        self.cell.with_dependent(|_, app| app.quit())
    }
    fn closing(&mut self) -> super::event::Closed {
        self.closed.clone()
    }
}

/// The step a key makes through a timeline (a replay, a paused synth's
/// run, a recording): ←/→, PgUp/PgDn, Home and End; none for another key.
pub(super) fn step_of(a: Command) -> Option<Step> {
    Some(match a {
        Command::Left => Step::Previous,
        Command::Right => Step::Next,
        Command::PageUp => Step::PageBack,
        Command::PageDown => Step::PageOn,
        Command::Home => Step::First,
        Command::End => Step::Last,
        _ => return None,
    })
}

/// The view a screenshot shows: the timeline when it has the focus.
pub(crate) fn focused_view(sc: &Screen) -> ViewKind {
    if sc.sel.focus == Focus::Timeline {
        ViewKind::Timeline
    } else {
        ViewKind::Fragmap
    }
}

/// "gpumem-top-<stem>-<view>-<where>-<unix seconds>.svg"
pub(crate) fn screenshot_name(stem: &str, view: ViewKind, at: &str) -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let v = if view == ViewKind::Timeline { "timeline" } else { "fragmap" };
    let clean: String =
        stem.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect();
    format!("gpumem-top-{clean}-{v}-{at}-{secs}.svg")
}

/// Writes a screenshot and returns the status line saying where.
pub(crate) fn save(name: &str, bytes: &[u8]) -> String {
    // A new file only: never over one, never through a link.
    match crate::private::write_report(std::path::Path::new(name), bytes, false) {
        Ok(()) => format!(" wrote {name}"),
        Err(e) => format!(" screenshot failed: {name}: {e}"),
    }
}

/// A synthetic training loop driving the caching allocator live, on the
/// simulated device (`demo`, and `synth` without a GPU) or a real one.
pub struct SynthApp<D: Device> {
    pub(crate) driver: Driver<D>,
    pub(crate) screen: Screen,
    stacks: Vec<Vec<crate::trace::Frame>>,
    source: String,
    banner: Option<String>,
    pub(crate) paused: bool,
    /// Times `BASE_SPEED` requests run per 50 ms tick (`+` doubles, `-` halves).
    pub(crate) speed: f64,
    /// Requests owed to the workload: below ×1/40 a tick runs less than one.
    owed: f64,
    color: bool,
    status: String,
    /// The allocator's latest events (at most `HISTORY_EVENTS`): what a
    /// pause can step back through.
    /// Each with the call site its block was allocated at (a tag).
    recent: std::collections::VecDeque<(crate::alloc::Event, u32)>,
    /// While paused: the run so far as a recording, and where its cursor is.
    history: Option<History>,
}

/// The latest events a paused run can step back through.
const HISTORY_EVENTS: usize = 20_000;

/// What a paused run's recording owns: its latest events as a trace, the
/// call sites its blocks were allocated at, and where its iterations end.
struct HistoryData {
    trace: crate::trace::DeviceTrace,
    stacks: Vec<Vec<crate::trace::Frame>>,
    iterations: Vec<usize>,
}

self_cell::self_cell!(
    /// A paused run's recording with the replay's model over it, built
    /// once when the run pauses (the model borrows the events it replays).
    struct HistoryCell {
        owner: HistoryData,
        #[not_covariant]
        dependent: ReplayModel,
    }
);

/// A paused run as a recording: its latest events and the state they end
/// in, replayed (as a window, exactly: they are our allocator's own) by the
/// replay's model, with their call sites and iteration ends.
struct History {
    cell: HistoryCell,
}

impl History {
    /// `events`: the latest events with their blocks' tags, the last of
    /// them the allocator's event number `end`; `iteration_events`: the
    /// allocator's event numbers where iterations ended.
    fn of<D: Device>(
        a: &crate::alloc::CachingAllocator<D>,
        events: Vec<(crate::alloc::Event, u32)>,
        end: u64,
        iteration_events: &std::collections::VecDeque<u64>,
        stacks: Vec<Vec<crate::trace::Frame>>,
    ) -> Result<History, String> {
        let n = events.len();
        let first = end.saturating_sub(n as u64);
        let iterations: Vec<usize> =
            iteration_events.iter().filter(|&&e| e > first && e < end).map(|&e| (e - first) as usize).collect();
        let segments = a
            .snapshot()
            .iter()
            .map(|s| crate::trace::RecordedSegment {
                device: 0,
                address: s.address,
                total_size: s.total_size,
                stream: s.stream,
                small: s.segment_type == "small",
                is_expandable: s.is_expandable,
                pool: s.pool.unwrap_or((0, 0)),
                blocks: s
                    .blocks
                    .iter()
                    .map(|b| crate::trace::RecordedBlock {
                        address: b.address,
                        size: b.size,
                        requested_size: b.requested_size,
                        state: b.state,
                        stack: b.tag,
                    })
                    .collect(),
            })
            .collect();
        // A block's tag is its call site's index, and site i is stack i
        // (1-based, 0 none), as the trace's stack ids are.
        let (events, tags): (Vec<_>, Vec<_>) = events.into_iter().unzip();
        let trace = crate::trace::DeviceTrace {
            events: std::sync::Arc::new(events.into()),
            time_us: std::iter::repeat_n(0, n).collect(),
            stacks: std::sync::Arc::new(tags),
            segments,
            ..Default::default()
        };
        let want = crate::replay::session::Want {
            config: a.config().clone(),
            changed: false,
            device_total: a.device().total_memory(),
            memory_limit: a.memory_limit(),
            keep_events: false,
            stop_at: None,
            context_bytes: 0,
            recorded_state: true,
            release: crate::replay::session::ReleaseAsk::forced(a.release(), "the simulated run's"),
        };
        let label = (a.device().describe(), format!("paused: the last {n} events run"));
        let data = HistoryData { trace, stacks, iterations };
        let cell = HistoryCell::try_new(data, |d| {
            let s = crate::replay::session::Session::open(&d.trace, &d.stacks, &want).map_err(|e| e.to_string())?;
            if !s.fidelity.is_faithful() {
                return Err(format!("its events do not replay ({})", s.fidelity.name()));
            }
            // The synthetic model's trace carries no markers the categories
            // rest on: they are not shown (the running view has its own).
            let mut m =
                ReplayModel::open_uncategorized(&s, &d.trace, &d.stacks, &[], "the last events of this run".into())
                    .map_err(|d| d.reason)?;
            m.iterations = d.iterations.clone();
            m.label = Some(label);
            Ok(m)
        })?;
        let mut h = History { cell };
        h.go(n.saturating_sub(1));
        Ok(h)
    }

    /// Moves to the state after event `cursor`; returns the event shown.
    fn go(&mut self, cursor: usize) -> usize {
        self.cell.with_dependent_mut(|_, m| m.go(cursor))
    }

    fn cursor(&self) -> usize {
        self.cell.with_dependent(|_, m| m.cursor())
    }

    fn events(&self) -> usize {
        self.cell.borrow_owner().trace.events.len()
    }
}

/// "tried to allocate 20.00 MiB" out of PyTorch's OOM message.
fn tried_to_allocate(message: &str) -> Option<String> {
    // throw_on_cudamalloc_oom's refusal (2.12+) names the request at its end.
    if let Some(at) = message.find("preemptively rejected") {
        let size = message[at..].rsplit("Requested size: ").next().filter(|_| message.contains("Requested size: "))?;
        return Some(format!("was refused before any retry (throw_on_cudamalloc_oom) for {size}"));
    }
    let at = message.find("Tried to allocate ")?;
    let rest = &message[at..];
    let end = rest.find(". ").unwrap_or(rest.len());
    let s = rest[..end].trim_end_matches('.');
    Some(format!("t{}", &s[1..]))
}

/// The timeline of a running workload, its cursor at the newest request.
fn run_marks<D: Device>(d: &Driver<D>) -> Marks<'_> {
    Marks {
        timeline: &d.points,
        cursor: d.points.len().saturating_sub(1),
        peak_at: d.peak_at(),
        ooms: &d.ooms,
        empty_caches: &d.empty_caches,
        iterations: &d.iterations,
        clock: None,
        first_event: d.dropped,
        unit: "request",
        meaning: Some(crate::view::parts::Meaning::Known { blocks: &d.block_categories, now: d.categories }),
        maxima: None,
    }
}

/// The simulated device with the demo's workload.
pub type DemoApp = SynthApp<Sim>;

/// The timeline keeps at most this many points, dropping the oldest half
/// when full: a live run can go on for days.
const LIVE_POINTS: usize = 20_000;

/// Requests per tick at `--speed 1`: a GPT-2 iteration (about 4,300
/// requests) takes about 5 s, so the timeline is readable.
pub(crate) const BASE_SPEED: usize = 40;

impl DemoApp {
    /// `demo`: GPT-2 small, batch up to 8 × up to 1024 tokens varying every
    /// step (`--varlen`), AdamW, on the simulated H200, forever.
    pub fn demo(seed: u64, banner: String, color: bool) -> Self {
        SynthApp::new(
            crate::workload::driver::demo(seed),
            "demo: synthetic GPT-2 training loop".into(),
            Some(banner),
            color,
        )
    }
}

impl<D: Device> SynthApp<D> {
    pub fn new(mut driver: Driver<D>, source: String, banner: Option<String>, color: bool) -> Self {
        // Events are kept for stepping back (`recent`, bounded); the
        // allocator's own list is drained after every advance.
        driver.alloc.set_recording(true);
        driver.alloc.set_recording_tags(true);
        let _ = driver.alloc.take_events();
        let driver = driver.bounded(LIVE_POINTS);
        SynthApp {
            driver,
            screen: Screen::default(),
            stacks: Vec::new(),
            source,
            banner,
            paused: false,
            speed: 1.0,
            owed: 0.0,
            color,
            status: String::new(),
            recent: std::collections::VecDeque::new(),
            history: None,
        }
    }

    /// Runs `n` requests of the workload.
    pub fn advance(&mut self, n: usize) {
        let was = self.driver.oom_log.len();
        self.driver.advance(n);
        self.recent.extend(self.driver.alloc.take_tagged_events());
        let over = self.recent.len().saturating_sub(HISTORY_EVENTS);
        self.recent.drain(..over);
        if let Some(o) = self.driver.oom_log.get(was..).and_then(|l| l.last()) {
            let first = o.message.split(". ").next().unwrap_or(&o.message);
            self.status = format!(" OOM in iteration {} (batch {}): {first}; {}", o.iteration, o.batch, o.action);
        }
        self.refresh_stacks();
    }

    /// `s`: the focused view of the run now, as SVG in the current directory.
    fn screenshot(&mut self) -> String {
        let view = focused_view(&self.screen);
        // Paused: the moment on the screen, not the run's newest.
        if let Some(h) = &mut self.history {
            let spec = &self.driver.workload.spec;
            let cursor = h.cursor();
            let fmt = crate::export::picture::Format::Svg;
            let svg = h.cell.with_dependent_mut(|_, m| {
                crate::export::replay::picture(m, cursor, view, fmt, 1600, false, ColorBy::State)
            });
            return match svg {
                Ok(svg) => save(&screenshot_name(spec.model.name(), view, &format!("event{cursor}")), &svg),
                Err(e) => format!(" screenshot: {e}"),
            };
        }
        let d = &self.driver;
        let segs = d.alloc.snapshot();
        let spec = &d.workload.spec;
        let marks = run_marks(d);
        let title = format!("{} · iteration {}", self.source, d.workload.iteration());
        let scene = crate::export::replay::scene_of(&d.alloc, &segs, title, &d.alloc.device().describe(), marks);
        let svg = crate::export::picture::svg(&scene, view, 1600);
        let name = screenshot_name(spec.model.name(), view, &format!("iteration{}", d.workload.iteration()));
        save(&name, svg.as_bytes())
    }

    fn refresh_stacks(&mut self) {
        // Block tags are call-site indices; site 0 means none.
        let sites = self.driver.workload.sites();
        if self.stacks.len() + 1 != sites.len() {
            self.stacks = sites
                .iter()
                .skip(1)
                .map(|s| vec![crate::trace::Frame { name: s.as_str().into(), filename: "".into(), line: 0 }])
                .collect();
        }
    }

    fn running(&self) -> bool {
        !self.paused && *self.driver.progress() == Progress::Running
    }
}

impl<D: Device> Interactive for SynthApp<D> {
    fn mode(&self) -> crate::keys::Mode {
        crate::keys::Mode::Synth
    }
    fn say(&mut self, msg: String) {
        self.status = msg;
    }
    fn draw_into(&self, area: ratatui_core::layout::Rect, buf: &mut ratatui_core::buffer::Buffer) {
        if let Some(h) = &self.history {
            let status = if self.status.trim().is_empty() {
                format!(" paused: event {} of the last {} ─ space resumes", h.cursor(), h.events())
            } else {
                self.status.clone()
            };
            let (sel, color, mode) = (self.screen.sel, self.color, Some(crate::keys::Mode::Synth));
            h.cell.with_dependent(|_, model| {
                ReplayScreen { model, sel, color, status, mode, segments: None, going: None }.render(area, buf)
            });
            return;
        }
        let d = &self.driver;
        let state = match d.progress() {
            Progress::Running if self.paused => " (paused)".to_string(),
            Progress::Running => String::new(),
            Progress::Finished => " (finished)".to_string(),
            // What could not be had, in PyTorch's words.
            Progress::Stopped => match d.oom_log.last().and_then(|r| tried_to_allocate(&r.message)) {
                Some(what) => format!(" (stopped by OOM: {what})"),
                None => " (stopped by OOM)".to_string(),
            },
        };
        let shape =
            if d.seq > 0 { format!("batch {} × seq {}", d.batch, d.seq) } else { format!("batch {}", d.batch) };
        let chrome = Chrome {
            stacks: &self.stacks,
            device: d.alloc.device().describe(),
            source: self.source.clone(),
            // Stopped by an OOM: the iteration it happened in, as the
            // status line says (the failed step was abandoned since).
            position: format!(
                "iteration {} · {shape}{state}",
                match d.progress() {
                    Progress::Stopped => d.oom_log.last().map_or(d.workload.iteration(), |o| o.iteration),
                    _ => d.workload.iteration(),
                }
            ),
            banner: self.banner.clone(),
            color: self.color,
            status: self.status.clone(),
            mode: Some(crate::keys::Mode::Synth),
            oom: None,
        };
        let marks = run_marks(d);
        StateScreen { alloc: &d.alloc, recorded_scale: None, chrome, marks, sel: self.screen.sel, segments: None }
            .render(area, buf);
    }

    fn apply(&mut self, a: Command) {
        if self.screen.apply(a) {
            self.screen.sel = self.screen.sel.clamped(&self.driver.alloc.snapshot());
            // Paused, the screen replays the latest events, which carry no
            // categories: say so rather than change nothing.
            if a == Command::ByCategory && self.history.is_some() && self.screen.sel.color_by == ColorBy::Category {
                self.status =
                    " w: the map shows categories while the run runs (space); the paused events carry none".into();
            }
            return;
        }
        match a {
            Command::Pause => {
                self.paused = !self.paused;
                // Nothing run yet: nothing to step back through.
                let d = &self.driver;
                let history = (self.paused && !self.recent.is_empty()).then(|| {
                    let events = self.recent.iter().copied().collect();
                    History::of(&d.alloc, events, d.alloc.emitted(), &d.iteration_events, self.stacks.clone())
                });
                self.status = match (self.paused, &history) {
                    (true, Some(Ok(_))) => " paused: ←/→ PgUp/PgDn Home/End step back through what has run".into(),
                    (true, Some(Err(e))) => format!(" paused; cannot step back: {e}"),
                    (true, None) => " paused (nothing has run yet)".into(),
                    (false, _) => " running".into(),
                };
                self.history = history.and_then(Result::ok);
            }
            Command::Peak => match &mut self.history {
                Some(h) => match h.cell.with_dependent(|_, m| m.peak_at) {
                    Some(p) => {
                        let shown = h.go(p);
                        self.status = format!(" the peak of what has run: event {shown}");
                    }
                    None => self.status = " nothing has run to have a peak".into(),
                },
                None => self.status = " pause (space) first: p then jumps to the peak of what has run".into(),
            },
            Command::Left | Command::Right | Command::PageUp | Command::PageDown | Command::Home | Command::End => {
                match &mut self.history {
                    Some(h) => {
                        // The status line then says where the cursor is.
                        self.status.clear();
                        if let Some(step) = step_of(a) {
                            h.cell.with_dependent_mut(|_, m| m.step(step));
                        }
                    }
                    None if self.paused => self.status = " nothing has run yet to step back through".into(),
                    None => self.status = " pause (space) to step back through what has run".into(),
                }
            }
            // Doubling and halving, so `+` after `-` is back where it was.
            Command::Plus => {
                self.speed = (self.speed * 2.0).min(1024.0);
                self.status = format!(" speed ×{}", self.speed);
            }
            Command::Minus => {
                self.speed = (self.speed / 2.0).max(1.0 / 64.0);
                self.status = format!(" speed ×{}", self.speed);
            }
            Command::Screenshot => self.status = self.screenshot(),
            _ => {}
        }
    }

    /// Runs `speed` requests a tick while running; paused or done, nothing.
    fn update(&mut self, e: AppEvent) -> bool {
        if !matches!(e, AppEvent::Tick) || !self.running() {
            return false;
        }
        self.owed += BASE_SPEED as f64 * self.speed;
        let n = self.owed.floor();
        self.owed -= n;
        if n >= 1.0 {
            self.advance(n as usize);
        }
        true
    }

    fn quit(&self) -> bool {
        self.screen.quit
    }

    fn tick_every(&self) -> Option<std::time::Duration> {
        Some(std::time::Duration::from_millis(50))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speed_halves_and_doubles_back_to_one_and_runs_what_it_says() {
        let mut app = DemoApp::demo(42, String::new(), false);
        let said = |app: &mut DemoApp, a| {
            app.apply(a);
            app.status.clone()
        };
        let down: Vec<String> = (0..4).map(|_| said(&mut app, Command::Minus)).collect();
        assert_eq!(down, [" speed ×0.5", " speed ×0.25", " speed ×0.125", " speed ×0.0625"]);
        let up: Vec<String> = (0..4).map(|_| said(&mut app, Command::Plus)).collect();
        assert_eq!(up, [" speed ×0.125", " speed ×0.25", " speed ×0.5", " speed ×1"]);
        // At ×1/16 a tick owes 2.5 requests: two ticks run 5.
        app.speed = 1.0 / 16.0;
        let before = app.driver.points.len();
        assert!(app.update(AppEvent::Tick) && app.update(AppEvent::Tick));
        assert_eq!(app.driver.points.len() - before, 5);
    }
}

#[cfg(test)]
mod replay_tests {
    use super::*;

    /// A frame draws the segments the selection was kept in while the
    /// cursor is where they were taken, and the state itself once the
    /// model moved without the app: each the same as a screen that takes
    /// its own snapshot.
    #[test]
    fn frames_draw_the_state_at_the_cursor_whoever_moved_it() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/traces/gpt2_train.pickle.gz");
        let t = crate::trace::load(&path).unwrap();
        let opened = crate::replay::open(&t, "gpt2", &Default::default()).unwrap();
        let mut app = ReplayApp::new(opened.model("gpt2".into()).unwrap(), false);
        let area = ratatui_core::layout::Rect::new(0, 0, 160, 50);
        let fresh = |app: &ReplayApp| {
            let mut buf = ratatui_core::buffer::Buffer::empty(area);
            let (model, sel) = (&app.model, app.screen.sel);
            let mode = Some(app.mode());
            ReplayScreen { model, sel, color: false, status: String::new(), mode, segments: None, going: None }
                .render(area, &mut buf);
            buf
        };
        let drawn = |app: &ReplayApp| {
            let mut buf = ratatui_core::buffer::Buffer::empty(area);
            app.draw_into(area, &mut buf);
            buf
        };
        app.go(4400);
        app.apply(Command::Right);
        assert_eq!(app.segments.0, app.model.cursor());
        assert_eq!(drawn(&app), fresh(&app));
        // Moved behind the app's back: its segments are of another event.
        app.model.go(9000);
        let at_9000 = fresh(&app);
        assert_ne!(at_9000, {
            app.model.go(4401);
            fresh(&app)
        });
        app.model.go(9000);
        assert_eq!(drawn(&app), at_9000);
    }

    /// `app`'s frame at 200x60, drawn through `draw_into` on this thread.
    fn drawn(app: &ReplayApp) -> ratatui_core::buffer::Buffer {
        let area = ratatui_core::layout::Rect::new(0, 0, 200, 60);
        let mut buf = ratatui_core::buffer::Buffer::empty(area);
        app.draw_into(area, &mut buf);
        buf
    }

    /// A frame drawn on a thread with a helper (its timeline beside the
    /// other panes, in its own buffer) is the frame drawn on one thread:
    /// whole and zoomed, by state and by category, at the peak and at the
    /// ends.
    #[test]
    fn frames_drawn_with_a_helper_are_frames_drawn_alone() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/traces/gpt2_train.pickle.gz");
        let t = crate::trace::load(&path).unwrap();
        let opened = crate::replay::open(&t, "gpt2", &Default::default()).unwrap();
        let mut app = ReplayApp::new(opened.model("gpt2".into()).unwrap(), true);
        // Two threads (a 2-core machine) and four (`FRAME_THREADS`, where
        // the map's rows and the stacked categories go apart as well).
        let pools = [2, 4].map(|n| rayon::ThreadPoolBuilder::new().num_threads(n).build().unwrap());
        let last = app.model.last();
        let mut frames = 0;
        for by_category in [false, true] {
            if by_category {
                app.apply(Command::ByCategory);
            }
            for at in [0, 4400, last] {
                app.go(at);
                for zoom in 0..3 {
                    if zoom > 0 {
                        app.apply(Command::Plus);
                    }
                    let alone = drawn(&app);
                    for pool in &pools {
                        let (helped, in_pool) = pool.install(|| (drawn(&app), rayon::current_thread_index().is_some()));
                        assert!(in_pool);
                        let threads = pool.current_num_threads();
                        assert_eq!(helped, alone, "at {at}, zoom {zoom}, by category {by_category}, {threads} threads");
                        frames += 1;
                    }
                }
                for _ in 1..3 {
                    app.apply(Command::Minus);
                }
            }
        }
        assert_eq!(frames, 36);
    }

    /// A jump left to its frame (the seek on the frame's thread, the
    /// timeline beside it at the event asked for) draws the frame of the
    /// move made first: pages, ends, the peak, a click-like `go`, zoomed
    /// and by category, to an event that begins a malloc (the frame shows
    /// its last event: the timeline is drawn again) and under the help
    /// (drawn over the timeline: nothing is drawn apart).
    #[test]
    fn jumps_drawn_while_seeking_are_the_frames_of_moves_made_first() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/traces/gpt2_train.pickle.gz");
        let t = crate::trace::load(&path).unwrap();
        let opened = crate::replay::open(&t, "gpt2", &Default::default()).unwrap();
        let events = &t.main_device().unwrap().events;
        let segment =
            (1000..events.len()).find(|&i| events.at(i).action == crate::alloc::Action::SegmentAlloc).unwrap();
        let mut moved = ReplayApp::new(opened.model("gpt2".into()).unwrap(), true);
        let mut going = ReplayApp::new(opened.model("gpt2".into()).unwrap(), true);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        enum Do {
            Key(Command),
            Go(usize),
        }
        let script = [
            Do::Key(Command::PageDown),
            Do::Go(segment),
            Do::Key(Command::Plus),
            Do::Key(Command::PageDown),
            Do::Go(4400),
            Do::Key(Command::ByCategory),
            Do::Key(Command::End),
            Do::Key(Command::PageUp),
            Do::Key(Command::Help),
            // Keys under the help scroll it.
            Do::Go(0),
            Do::Key(Command::Help),
            Do::Key(Command::Home),
            Do::Key(Command::Peak),
            Do::Key(Command::Left),
            Do::Go(segment),
        ];
        let (mut deferred, mut redrawn) = (0, 0);
        for (k, d) in script.iter().enumerate() {
            match *d {
                Do::Key(c) => {
                    moved.apply(c);
                    pool.install(|| going.apply(c));
                }
                Do::Go(e) => {
                    moved.go(e);
                    pool.install(|| going.go(e));
                }
            }
            deferred += usize::from(going.going.is_some());
            let helped = pool.install(|| drawn(&going));
            assert_eq!(helped, drawn(&moved), "step {k}");
            assert_eq!(going.model.cursor(), moved.model.cursor(), "step {k}");
            redrawn += usize::from(going.going.is_some_and(|e| e != going.model.cursor()));
        }
        // Every move but the step left was left to its frame; four went to
        // an event that begins a malloc (the segment's, the first) and
        // showed its last.
        assert_eq!((deferred, redrawn), (10, 4));
    }
}

#[cfg(test)]
mod oom_tests {
    #[test]
    fn the_stopped_status_names_what_could_not_be_had() {
        let msg = "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 8.00 GiB of which 4.00 MiB is free.";
        assert_eq!(super::tried_to_allocate(msg).as_deref(), Some("tried to allocate 20.00 MiB"));
        assert_eq!(
            super::tried_to_allocate("CUDA out of memory. Tried to allocate 1.50 GiB.").as_deref(),
            Some("tried to allocate 1.50 GiB")
        );
        assert_eq!(super::tried_to_allocate("out of memory"), None);
        assert_eq!(
            super::tried_to_allocate("CUDA out of memory. Allocation was preemptively rejected because it would exceed per_process_memory_fraction limit. Requested size: 1.00 GiB").as_deref(),
            Some("was refused before any retry (throw_on_cudamalloc_oom) for 1.00 GiB")
        );
    }
}
