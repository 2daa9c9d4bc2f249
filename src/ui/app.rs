//! The interactive replay: key handling over a scrubber, drawing through
//! `render`. The terminal is restored on every exit path: `q`, `Esc`,
//! Ctrl-C, SIGTERM, and panics (ratatui's hook).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::Frame;

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;

use super::{render, Focus, SegmentOrder, View};
use crate::alloc::{Action, AllocatorConfig, CachingAllocator, Kind, StatePoint};
use crate::analysis::{fragmentation, size_histogram};
use crate::device::{Device, Sim};
use crate::export::picture::{Format, Scene, ViewKind};
use crate::replay::scrub::Scrubber;
use crate::trace::DeviceTrace;
use crate::workload::driver::{Driver, OnOom, Progress};
use crate::workload::{ModelKind, SynthSpec, Synthetic};

pub struct ReplayApp<'a> {
    scrub: Scrubber<'a>,
    stacks: &'a [Vec<crate::trace::Frame>],
    pub screen: Screen,
    points: Vec<StatePoint>,
    name: String,
    pub cursor: usize,
    peak_at: Option<usize>,
    ooms: Vec<usize>,
    empty_caches: Vec<usize>,
    iterations: Vec<usize>,
    color: bool,
    status: String,
    /// The trace is a window of a longer run (its start was rebuilt).
    pub window: bool,
}

impl<'a> ReplayApp<'a> {
    pub fn new(
        scrub: Scrubber<'a>,
        dev: &DeviceTrace,
        stacks: &'a [Vec<crate::trace::Frame>],
        empty_caches: Vec<usize>,
        iterations: Vec<usize>,
        name: String,
        color: bool,
    ) -> Self {
        let points = scrub.points().to_vec();
        // The first event at the highest allocated bytes.
        let peak_at = crate::analysis::peak_index(&points);
        let ooms = dev.events.iter().enumerate().filter(|(_, e)| e.action == Action::Oom).map(|(i, _)| i).collect();
        ReplayApp {
            scrub,
            stacks,
            screen: Screen::default(),
            points,
            name,
            cursor: peak_at.unwrap_or(0),
            peak_at,
            ooms,
            empty_caches,
            iterations,
            color,
            status: String::new(),
            window: false,
        }
    }

    fn last(&self) -> usize {
        self.points.len().saturating_sub(1)
    }

    pub fn handle_key(&mut self, k: KeyEvent) {
        let jump = (self.points.len() / 20).max(1);
        self.status.clear();
        if self.screen.handle_key(k) {
            return;
        }
        match k.code {
            KeyCode::Left => self.cursor = self.cursor.saturating_sub(1),
            KeyCode::Right => self.cursor = (self.cursor + 1).min(self.last()),
            KeyCode::PageUp => self.cursor = self.cursor.saturating_sub(jump),
            KeyCode::PageDown => self.cursor = (self.cursor + jump).min(self.last()),
            KeyCode::Home => self.cursor = 0,
            KeyCode::End => self.cursor = self.last(),
            KeyCode::Char('p') => {
                if let Some(p) = self.peak_at {
                    self.cursor = p;
                    self.status = format!(" peak: event {p}");
                }
            }
            KeyCode::Char('o') => match self.ooms.iter().find(|&&o| o > self.cursor).or(self.ooms.first()) {
                Some(&o) => {
                    self.cursor = o;
                    self.status = format!(" OOM at event {o}");
                }
                None => self.status = " this trace has no OOM".into(),
            },
            KeyCode::Char(' ') => self.status = " a replay has nothing to pause; ←/→ step through it".into(),
            KeyCode::Char('s') => self.status = self.screenshot(),
            KeyCode::Char(c @ '1'..='9') => self.status = format!(" GPU {c}: a replay shows one device"),
            _ => {}
        }
    }

    pub fn draw(&mut self, frame: &mut Frame) {
        let area = frame.area();
        self.draw_into(area, frame.buffer_mut());
    }

    /// `s`: the focused view as SVG in the current directory.
    fn screenshot(&mut self) -> String {
        let view = focused_view(&self.screen);
        let stem = self.name.split('.').next().unwrap_or("trace").to_string();
        let name = screenshot_name(&stem, view, &format!("event{}", self.cursor));
        match self.export(view, Format::Svg, 1600, true) {
            Ok(b) => save(&name, &b),
            Err(e) => format!(" screenshot failed: {e}"),
        }
    }

    /// A picture of `view` at the cursor: SVG, PNG, or the screen as text
    /// (`cols` × `rows`, ANSI colours unless `plain`).
    pub fn export(&mut self, view: ViewKind, format: Format, width: u32, plain: bool) -> Result<Vec<u8>, String> {
        if format == Format::Txt {
            let (cols, rows) = (160u16, 48u16);
            let mut buf = Buffer::empty(Rect::new(0, 0, cols, rows));
            self.screen.focus = if view == ViewKind::Timeline { super::Focus::Timeline } else { super::Focus::Map };
            let color = self.color;
            self.color = !plain;
            self.draw_into(buf.area, &mut buf);
            self.color = color;
            return Ok(crate::export::text::from_buffer(&buf, !plain).into_bytes());
        }
        let n = self.points.len();
        let cursor = self.cursor;
        let a = self.scrub.seek(cursor);
        let segs = a.snapshot();
        let title = format!(
            "{} · event {cursor} of {n}{}",
            self.name,
            if Some(cursor) == self.peak_at { " (peak)" } else { "" }
        );
        let marks = Marks {
            timeline: &self.points,
            cursor,
            peak_at: self.peak_at,
            ooms: &self.ooms,
            empty_caches: &self.empty_caches,
            iterations: &self.iterations,
        };
        let note = "replayed by gpumem-top through its model of PyTorch's caching allocator";
        let scene = scene_of(a, &segs, title, note, marks);
        let svg = crate::export::picture::svg(&scene, view, width);
        match format {
            Format::Svg => Ok(svg.into_bytes()),
            _ => crate::export::picture::png(&svg),
        }
    }

    pub fn draw_into(&mut self, area: Rect, buf: &mut Buffer) {
        let n = self.points.len();
        let a = self.scrub.seek(self.cursor);
        let chrome = Chrome {
            stacks: self.stacks,
            screen: &mut self.screen,
            device: "recorded device".into(),
            source: format!("replay {}", self.name),
            position: match (n, self.window) {
                (0, _) => "state only: no trace in this snapshot".into(),
                (_, true) => format!("event {}/{n} of a window (peaks since its start)", self.cursor),
                _ => format!("event {}/{n}", self.cursor),
            },
            banner: None,
            color: self.color,
            status: self.status.clone(),
        };
        let marks = Marks {
            timeline: &self.points,
            cursor: self.cursor,
            peak_at: self.peak_at,
            ooms: &self.ooms,
            empty_caches: &self.empty_caches,
            iterations: &self.iterations,
        };
        draw_state_into(a, chrome, marks, area, buf);
    }
}

/// The picture of an allocator's state with the timeline's marks.
fn scene_of<'a, D: Device>(
    a: &CachingAllocator<D>,
    segs: &'a [crate::alloc::SegmentInfo],
    title: String,
    note: &str,
    m: Marks<'a>,
) -> Scene<'a> {
    let stats = a.stats();
    let t = Totals::of(stats);
    let conf = &a.config().source;
    Scene {
        title,
        subtitle: format!("allocator config: {} · {note}", if conf.is_empty() { "default" } else { conf.as_str() }),
        segments: segs,
        allocated: t.allocated,
        allocated_peak: t.allocated_peak,
        reserved: t.reserved,
        reserved_peak: t.reserved_peak,
        fragmentation: fragmentation(stats, segs),
        timeline: m.timeline,
        cursor: m.cursor,
        peak_at: m.peak_at,
        ooms: m.ooms,
        iterations: m.iterations,
        empty_caches: m.empty_caches,
    }
}

/// The view a screenshot shows: the timeline when it has the focus.
pub fn focused_view(sc: &Screen) -> ViewKind {
    if sc.focus == super::Focus::Timeline {
        ViewKind::Timeline
    } else {
        ViewKind::Fragmap
    }
}

/// "gpumem-top-<stem>-<view>-<where>-<unix seconds>.svg"
pub fn screenshot_name(stem: &str, view: ViewKind, at: &str) -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let v = if view == ViewKind::Timeline { "timeline" } else { "fragmap" };
    let clean: String =
        stem.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect();
    format!("gpumem-top-{clean}-{v}-{at}-{secs}.svg")
}

/// Writes a screenshot and returns the status line saying where.
pub fn save(name: &str, bytes: &[u8]) -> String {
    match std::fs::write(name, bytes) {
        Ok(()) => format!(" wrote {name}"),
        Err(e) => format!(" screenshot failed: {name}: {e}"),
    }
}

/// What the keys shared by every source change: selection, zoom, map mode,
/// focus, overlays, quitting.
#[derive(Debug, Default)]
pub struct Screen {
    /// The highlighted segment (index in `order`).
    pub selected: usize,
    /// The highlighted block while zoomed.
    pub block: usize,
    pub zoom: bool,
    pub compact: bool,
    pub order: SegmentOrder,
    pub scroll: usize,
    pub focus: Focus,
    pub help: bool,
    pub quit: bool,
}

impl Screen {
    /// Handles a key every source shares; false for the others.
    pub fn handle_key(&mut self, k: KeyEvent) -> bool {
        match k.code {
            KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => self.quit = true,
            KeyCode::Char('q') | KeyCode::Esc => {
                if self.help {
                    self.help = false;
                } else if self.zoom {
                    self.zoom = false;
                } else {
                    self.quit = true;
                }
            }
            KeyCode::Char('?') | KeyCode::Char('h') => self.help = !self.help,
            KeyCode::Tab => self.focus = if self.focus == Focus::Map { Focus::Timeline } else { Focus::Map },
            KeyCode::Up if self.zoom => self.block = self.block.saturating_sub(1),
            KeyCode::Down if self.zoom => self.block += 1,
            KeyCode::Up => self.select(-1),
            KeyCode::Down => self.select(1),
            KeyCode::Enter => {
                self.zoom = !self.zoom;
                self.block = 0;
            }
            KeyCode::Char('c') => self.compact = !self.compact,
            KeyCode::Char('a') => {
                self.order =
                    if self.order == SegmentOrder::Address { SegmentOrder::Size } else { SegmentOrder::Address };
            }
            _ => return false,
        }
        true
    }

    /// Moves the selected segment by `d`, keeping it within the shown rows
    /// (the map shows at least ten).
    fn select(&mut self, d: isize) {
        self.selected = self.selected.saturating_add_signed(d);
        if self.selected < self.scroll {
            self.scroll = self.selected;
        } else if self.selected >= self.scroll + 10 {
            self.scroll = self.selected - 9;
        }
    }
}

/// What a screen shows besides the allocator's state.
pub struct Chrome<'s> {
    pub stacks: &'s [Vec<crate::trace::Frame>],
    /// What the shared keys changed; clamped to the state drawn.
    pub screen: &'s mut Screen,
    pub device: String,
    pub source: String,
    pub position: String,
    pub banner: Option<String>,
    pub color: bool,
    pub status: String,
}

/// The timeline and its marks.
pub struct Marks<'m> {
    pub timeline: &'m [StatePoint],
    pub cursor: usize,
    pub peak_at: Option<usize>,
    pub ooms: &'m [usize],
    pub empty_caches: &'m [usize],
    pub iterations: &'m [usize],
}

/// Builds the `View` of an allocator's state and draws it.
pub fn draw_state<D: Device>(frame: &mut Frame, a: &CachingAllocator<D>, chrome: Chrome, marks: Marks) {
    let area = frame.area();
    draw_state_into(a, chrome, marks, area, frame.buffer_mut());
}

/// As `draw_state`, into any buffer (tests, exports).
pub fn draw_state_into<D: Device>(a: &CachingAllocator<D>, chrome: Chrome, marks: Marks, area: Rect, buf: &mut Buffer) {
    let segs = a.snapshot();
    let stats = a.stats();
    draw_parts_into(&segs, Totals::of(stats), fragmentation(stats, &segs), chrome, marks, area, buf);
}

/// The bar figures of one allocator.
#[derive(Debug, Clone, Copy, Default)]
pub struct Totals {
    pub allocated: u64,
    pub allocated_peak: u64,
    pub reserved: u64,
    pub reserved_peak: u64,
    /// NVML's (used, total), where known.
    pub device_memory: Option<(u64, u64)>,
}

impl Totals {
    /// The figures of our allocator's `memory_stats()`.
    pub fn of(stats: &crate::alloc::DeviceStats) -> Self {
        Totals {
            allocated: stats.get(Kind::AllocatedBytes, 0).current as u64,
            allocated_peak: stats.get(Kind::AllocatedBytes, 0).peak as u64,
            reserved: stats.get(Kind::ReservedBytes, 0).current as u64,
            reserved_peak: stats.get(Kind::ReservedBytes, 0).peak as u64,
            device_memory: None,
        }
    }
}

/// Draws the screens from an allocator's parts: ours, or what a PyTorch
/// process published.
pub fn draw_parts_into(
    segs: &[crate::alloc::SegmentInfo],
    totals: Totals,
    frag: crate::analysis::Fragmentation,
    chrome: Chrome,
    marks: Marks,
    area: Rect,
    buf: &mut Buffer,
) {
    let hist = size_histogram(segs);
    let sc = chrome.screen;
    sc.scroll = sc.scroll.min(segs.len().saturating_sub(1));
    sc.selected = sc.selected.min(segs.len().saturating_sub(1));
    let in_order = crate::ui::ordered_indices(segs, sc.order);
    let blocks = in_order.get(sc.selected).map_or(0, |&i| segs[i].blocks.len());
    sc.block = sc.block.min(blocks.saturating_sub(1));
    // A replay with no events is a snapshot without a trace: no peaks.
    let peaks_known = !(marks.timeline.is_empty() && chrome.source.starts_with("replay "));
    let view = View {
        peaks_known,
        device: chrome.device,
        source: chrome.source,
        position: chrome.position,
        banner: chrome.banner,
        allocated: totals.allocated,
        allocated_peak: totals.allocated_peak,
        reserved: totals.reserved,
        reserved_peak: totals.reserved_peak,
        device_memory: totals.device_memory,
        segments: segs,
        fragmentation: frag,
        histogram: &hist,
        timeline: marks.timeline,
        cursor: marks.cursor,
        peak_at: marks.peak_at,
        ooms: marks.ooms,
        empty_caches: marks.empty_caches,
        iterations: marks.iterations,
        order: sc.order,
        scroll: sc.scroll,
        selected: sc.selected,
        zoom: sc.zoom,
        block: sc.block,
        compact: sc.compact,
        stacks: chrome.stacks,
        focus: sc.focus,
        help: sc.help,
        color: chrome.color,
        status: chrome.status,
    };
    render(&view, area, buf);
}

/// A synthetic training loop driving the caching allocator live, on the
/// simulated device (`demo`, and `synth` without a GPU) or a real one.
pub struct SynthApp<D: Device> {
    pub driver: Driver<D>,
    pub screen: Screen,
    stacks: Vec<Vec<crate::trace::Frame>>,
    source: String,
    banner: Option<String>,
    pub paused: bool,
    /// Requests run per 50 ms tick.
    pub speed: usize,
    color: bool,
    status: String,
}

/// The simulated device with the demo's workload.
pub type DemoApp = SynthApp<Sim>;

/// The timeline keeps at most this many points, dropping the oldest half
/// when full: a live run can go on for days.
const LIVE_POINTS: usize = 20_000;

/// Requests per tick at `--speed 1`: a GPT-2 iteration (about 4,300
/// requests) takes about 5 s, so the timeline is readable.
pub const BASE_SPEED: usize = 40;

impl DemoApp {
    /// `demo`: GPT-2 small, batch up to 8 × up to 1024 tokens varying every
    /// step (`--varlen`), AdamW, on the simulated H200, forever.
    pub fn demo(seed: u64, banner: String, color: bool) -> Self {
        let mut spec = SynthSpec::new(ModelKind::Gpt2);
        spec.varlen = true;
        spec.seed = seed;
        spec.iterations = None;
        let alloc = CachingAllocator::new(AllocatorConfig::default(), Sim::h200());
        let driver = Driver::new(alloc, Synthetic::new(spec), OnOom::Continue);
        SynthApp::new(driver, "demo: synthetic GPT-2 training loop".into(), Some(banner), color)
    }
}

impl<D: Device> SynthApp<D> {
    pub fn new(mut driver: Driver<D>, source: String, banner: Option<String>, color: bool) -> Self {
        driver.alloc.set_recording(false);
        let driver = driver.bounded(LIVE_POINTS);
        SynthApp {
            driver,
            screen: Screen::default(),
            stacks: Vec::new(),
            source,
            banner,
            paused: false,
            speed: BASE_SPEED,
            color,
            status: String::new(),
        }
    }

    /// Runs `n` requests of the workload.
    pub fn advance(&mut self, n: usize) {
        let was = self.driver.oom_log.len();
        self.driver.advance(n);
        if let Some(o) = self.driver.oom_log.get(was..).and_then(|l| l.last()) {
            let first = o.message.split(". ").next().unwrap_or(&o.message);
            self.status = format!(" OOM in iteration {} (batch {}): {first}; {}", o.iteration, o.batch, o.action);
        }
    }

    pub fn handle_key(&mut self, k: KeyEvent) {
        if self.screen.handle_key(k) {
            return;
        }
        match k.code {
            KeyCode::Char(' ') => {
                self.paused = !self.paused;
                self.status = if self.paused { " paused".into() } else { " running".into() };
            }
            KeyCode::Char('+') => {
                self.speed = (self.speed * 2).min(BASE_SPEED << 10);
                self.status = format!(" speed ×{}", self.speed as f64 / BASE_SPEED as f64);
            }
            KeyCode::Char('-') => {
                self.speed = (self.speed / 2).max(1);
                self.status = format!(" speed ×{}", self.speed as f64 / BASE_SPEED as f64);
            }
            KeyCode::Char('s') => self.status = self.screenshot(),
            _ => {}
        }
    }

    /// `s`: the focused view of the run now, as SVG in the current directory.
    fn screenshot(&mut self) -> String {
        let view = focused_view(&self.screen);
        let d = &self.driver;
        let segs = d.alloc.snapshot();
        let spec = &d.workload.spec;
        let marks = Marks {
            timeline: &d.points,
            cursor: d.points.len().saturating_sub(1),
            peak_at: d.peak_at(),
            ooms: &d.ooms,
            empty_caches: &d.empty_caches,
            iterations: &d.iterations,
        };
        let title = format!("{} · iteration {}", self.source, d.workload.iteration());
        let scene = scene_of(&d.alloc, &segs, title, &d.alloc.device().describe(), marks);
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
                .map(|s| vec![crate::trace::Frame { name: s.clone(), filename: String::new(), line: 0 }])
                .collect();
        }
    }

    pub fn draw_into(&mut self, area: Rect, buf: &mut Buffer) {
        self.refresh_stacks();
        let d = &self.driver;
        let peak_at = d.peak_at();
        let state = match d.progress() {
            Progress::Running if self.paused => " (paused)",
            Progress::Running => "",
            Progress::Finished => " (finished)",
            Progress::Stopped => " (stopped by OOM)",
        };
        let shape =
            if d.seq > 0 { format!("batch {} × seq {}", d.batch, d.seq) } else { format!("batch {}", d.batch) };
        let chrome = Chrome {
            stacks: &self.stacks,
            screen: &mut self.screen,
            device: d.alloc.device().describe(),
            source: self.source.clone(),
            position: format!("iteration {} · {shape}{state}", d.workload.iteration()),
            banner: self.banner.clone(),
            color: self.color,
            status: self.status.clone(),
        };
        let marks = Marks {
            timeline: &d.points,
            cursor: d.points.len().saturating_sub(1),
            peak_at,
            ooms: &d.ooms,
            empty_caches: &d.empty_caches,
            iterations: &d.iterations,
        };
        draw_state_into(&d.alloc, chrome, marks, area, buf);
    }
}

/// An app the terminal loop drives.
pub trait Interactive {
    fn draw_into(&mut self, area: Rect, buf: &mut Buffer);
    fn handle_key(&mut self, k: KeyEvent);
    fn quit(&self) -> bool;
    /// How long to wait for input before `tick`.
    fn wait(&self) -> Duration {
        Duration::from_millis(250)
    }
    /// Runs when no input came within `wait`, or `wake_fd` became
    /// readable; true when the screen changed.
    fn tick(&mut self) -> bool {
        false
    }
    /// A descriptor that becomes readable when `tick` has work.
    fn wake_fd(&self) -> Option<i32> {
        None
    }
}

/// What the terminal did while we waited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Input {
    Ready,
    Timeout,
    /// The terminal is gone.
    HangUp,
}

/// Waits for the terminal (stdin) to have input, or `wake` to be
/// readable, up to `timeout`. Our own poll(2): crossterm 0.29's tty source
/// polls with the leftover time cut to whole milliseconds and so spins
/// through the last millisecond of every wait (0.5% of a core at 5 waits a
/// second).
fn wait_input(timeout: Duration, wake: Option<i32>) -> Input {
    #[repr(C)]
    struct PollFd {
        fd: i32,
        events: i16,
        revents: i16,
    }
    extern "C" {
        fn poll(fds: *mut PollFd, nfds: std::ffi::c_ulong, timeout: i32) -> i32;
    }
    const POLLIN: i16 = 1;
    const POLLERR: i16 = 8;
    const POLLHUP: i16 = 16;
    const POLLNVAL: i16 = 32;
    let mut fds =
        [PollFd { fd: 0, events: POLLIN, revents: 0 }, PollFd { fd: wake.unwrap_or(-1), events: POLLIN, revents: 0 }];
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: valid pollfds for the duration of the call (a negative fd is
    // ignored by poll).
    let n = unsafe { poll(fds.as_mut_ptr(), 2, ms) };
    let p = &fds[0];
    if n <= 0 {
        // EINTR (a signal) counts as a timeout: the caller checks its flags.
        Input::Timeout
    } else if p.revents & POLLIN != 0 {
        Input::Ready
    } else if p.revents & (POLLHUP | POLLERR | POLLNVAL) != 0 {
        Input::HangUp
    } else {
        Input::Timeout
    }
}

/// Runs an app in the terminal until it quits, SIGTERM or SIGHUP: draws
/// only when something changed (input, new data, a resize), so an idle
/// screen costs no CPU. The terminal is restored on every way out (panics:
/// ratatui's hook).
pub fn run_app(app: &mut impl Interactive) -> std::io::Result<()> {
    let term_flag = Arc::new(AtomicBool::new(false));
    // SIGINT and SIGQUIT from outside (kill, or a key outside raw mode) end
    // the loop too, so the terminal is restored on those ways out as well.
    for sig in [
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGQUIT,
    ] {
        signal_hook::flag::register(sig, term_flag.clone())?;
    }
    let winch = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGWINCH, winch.clone())?;
    // ratatui's init: raw mode, alternate screen, and a panic hook that
    // restores the terminal. Its Stdout backend is replaced by one writing a
    // whole frame at once (Stdout's line buffer made dozens of writes a
    // frame); 16 KiB holds a live frame's changes (about 5 KB), a full
    // redraw takes a few writes.
    drop(ratatui::init());
    let backend =
        ratatui::backend::CrosstermBackend::new(std::io::BufWriter::with_capacity(1 << 14, std::io::stdout()));
    let result = (|| -> std::io::Result<()> {
        let mut terminal = super::term::Frames::new(backend)?;
        let mut dirty = true;
        while !app.quit() && !term_flag.load(Ordering::Relaxed) {
            // SIGWINCH interrupts the wait below; the next draw resizes.
            if winch.swap(false, Ordering::Relaxed) {
                terminal.resized();
                dirty = true;
            }
            if dirty {
                terminal.draw(|area, buf| app.draw_into(area, buf))?;
                dirty = false;
            }
            match wait_input(app.wait(), app.wake_fd()) {
                Input::HangUp => break,
                Input::Ready => {
                    // Input is there: crossterm returns at once. Then take
                    // whatever else it parsed from the same read.
                    let mut timeout = Duration::from_millis(1);
                    while event::poll(timeout)? {
                        match event::read()? {
                            Event::Key(k) if k.kind == KeyEventKind::Press => {
                                app.handle_key(k);
                                dirty = true;
                            }
                            Event::Resize(..) => {
                                terminal.resized();
                                dirty = true;
                            }
                            _ => {}
                        }
                        // Not zero: crossterm only looks at what its parser holds when it may wait.
                        timeout = Duration::from_micros(1);
                    }
                }
                Input::Timeout => dirty |= app.tick(),
            }
        }
        Ok(())
    })();
    ratatui::restore();
    // restore() leaves raw mode and the alternate screen; our frame writer
    // hid the cursor, so show it again.
    let _ = crossterm::execute!(std::io::stdout(), crossterm::cursor::Show);
    result
}

impl Interactive for ReplayApp<'_> {
    fn draw_into(&mut self, area: Rect, buf: &mut Buffer) {
        ReplayApp::draw_into(self, area, buf)
    }
    fn handle_key(&mut self, k: KeyEvent) {
        ReplayApp::handle_key(self, k)
    }
    fn quit(&self) -> bool {
        self.screen.quit
    }
}

impl<D: Device> Interactive for SynthApp<D> {
    fn draw_into(&mut self, area: Rect, buf: &mut Buffer) {
        SynthApp::draw_into(self, area, buf)
    }
    fn handle_key(&mut self, k: KeyEvent) {
        SynthApp::handle_key(self, k)
    }
    fn quit(&self) -> bool {
        self.screen.quit
    }
    /// 50 ms ticks while running; paused or done, input alone.
    fn wait(&self) -> Duration {
        if self.running() {
            Duration::from_millis(50)
        } else {
            Duration::from_millis(250)
        }
    }
    fn tick(&mut self) -> bool {
        if !self.running() {
            return false;
        }
        let n = self.speed;
        self.advance(n);
        true
    }
}

impl<D: Device> SynthApp<D> {
    fn running(&self) -> bool {
        !self.paused && *self.driver.progress() == Progress::Running
    }
}
