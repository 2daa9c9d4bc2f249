//! The interactive replay: key handling over a scrubber, drawing through
//! `render`. The terminal is restored on every exit path: `q`, `Esc`,
//! Ctrl-C, SIGTERM, and panics (ratatui's hook).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::Frame;

use super::{render, Focus, SegmentOrder, View};
use crate::alloc::{Action, Kind, StatePoint};
use crate::analysis::{fragmentation, size_histogram};
use crate::replay::scrub::Scrubber;
use crate::trace::DeviceTrace;

pub struct ReplayApp<'a> {
    scrub: Scrubber<'a>,
    points: Vec<StatePoint>,
    name: String,
    pub cursor: usize,
    peak_at: Option<usize>,
    ooms: Vec<usize>,
    empty_caches: Vec<usize>,
    order: SegmentOrder,
    scroll: usize,
    focus: Focus,
    help: bool,
    color: bool,
    status: String,
    pub quit: bool,
}

impl<'a> ReplayApp<'a> {
    pub fn new(scrub: Scrubber<'a>, dev: &DeviceTrace, empty_caches: Vec<usize>, name: String, color: bool) -> Self {
        let points = scrub.points().to_vec();
        // The first event at the highest allocated bytes.
        let peak_at = (0..points.len()).max_by_key(|&i| (points[i].allocated, std::cmp::Reverse(i)));
        let ooms = dev.events.iter().enumerate().filter(|(_, e)| e.action == Action::Oom).map(|(i, _)| i).collect();
        ReplayApp {
            scrub,
            points,
            name,
            cursor: peak_at.unwrap_or(0),
            peak_at,
            ooms,
            empty_caches,
            order: SegmentOrder::Address,
            scroll: 0,
            focus: Focus::Map,
            help: false,
            color,
            status: String::new(),
            quit: false,
        }
    }

    fn last(&self) -> usize {
        self.points.len().saturating_sub(1)
    }

    pub fn handle_key(&mut self, k: KeyEvent) {
        let jump = (self.points.len() / 20).max(1);
        self.status.clear();
        match k.code {
            KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => self.quit = true,
            KeyCode::Char('q') | KeyCode::Esc => {
                if self.help {
                    self.help = false;
                } else {
                    self.quit = true;
                }
            }
            KeyCode::Char('?') | KeyCode::Char('h') => self.help = !self.help,
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
            KeyCode::Tab => {
                self.focus = if self.focus == Focus::Map { Focus::Timeline } else { Focus::Map };
            }
            KeyCode::Up => self.scroll = self.scroll.saturating_sub(1),
            KeyCode::Down => self.scroll += 1,
            KeyCode::Char('a') => {
                self.order =
                    if self.order == SegmentOrder::Address { SegmentOrder::Size } else { SegmentOrder::Address };
            }
            KeyCode::Char(' ') => self.status = " a replay has nothing to pause; ←/→ step through it".into(),
            KeyCode::Char('s') => self.status = " screenshots are not built yet".into(),
            KeyCode::Char(c @ '1'..='9') => self.status = format!(" GPU {c}: a replay shows one device"),
            _ => {}
        }
    }

    pub fn draw(&mut self, frame: &mut Frame) {
        let n = self.points.len();
        let a = self.scrub.seek(self.cursor);
        let segs = a.snapshot();
        let stats = a.stats();
        let hist = size_histogram(&segs);
        self.scroll = self.scroll.min(segs.len().saturating_sub(1));
        let view = View {
            device: "recorded device".into(),
            source: format!("replay {}", self.name),
            position: format!("event {}/{n}", self.cursor),
            banner: None,
            allocated: stats.get(Kind::AllocatedBytes, 0).current as u64,
            allocated_peak: stats.get(Kind::AllocatedBytes, 0).peak as u64,
            reserved: stats.get(Kind::ReservedBytes, 0).current as u64,
            reserved_peak: stats.get(Kind::ReservedBytes, 0).peak as u64,
            device_memory: None,
            segments: &segs,
            fragmentation: fragmentation(stats, &segs),
            histogram: &hist,
            timeline: &self.points,
            cursor: self.cursor,
            peak_at: self.peak_at,
            ooms: &self.ooms,
            empty_caches: &self.empty_caches,
            order: self.order,
            scroll: self.scroll,
            focus: self.focus,
            help: self.help,
            color: self.color,
            status: self.status.clone(),
        };
        let area = frame.area();
        render(&view, area, frame.buffer_mut());
    }
}

/// Runs the app in the terminal until it quits. Blocks on input (with a
/// timeout only to notice SIGTERM): an idle screen costs no CPU.
pub fn run(app: &mut ReplayApp) -> std::io::Result<()> {
    let term_flag = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP] {
        signal_hook::flag::register(sig, term_flag.clone())?;
    }
    let mut terminal = ratatui::init();
    let result = (|| -> std::io::Result<()> {
        let mut dirty = true;
        while !app.quit && !term_flag.load(Ordering::Relaxed) {
            if dirty {
                terminal.draw(|f| app.draw(f))?;
                dirty = false;
            }
            if event::poll(Duration::from_millis(250))? {
                match event::read()? {
                    Event::Key(k) if k.kind == KeyEventKind::Press => {
                        app.handle_key(k);
                        dirty = true;
                    }
                    Event::Resize(..) => dirty = true,
                    _ => {}
                }
            }
        }
        Ok(())
    })();
    ratatui::restore();
    result
}
