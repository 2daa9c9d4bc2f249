//! The live view: every GPU NVML sees with its processes, and for the
//! selected GPU the allocator screens of the PyTorch process that publishes
//! its state. Snapshots arrive from the sampler thread; this only keeps
//! history and draws.

use std::collections::BTreeMap;

use crossterm::event::{KeyCode, KeyEvent};
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};

use super::app::{draw_parts_into, Chrome, Marks, Screen, Totals};
use crate::analysis::human_bytes;
use crate::monitor::alerts::{alerts, Alert, Thresholds};
use crate::monitor::{GpuSample, Published, Snapshot};
use crate::timeline::{Sample, Series, DAY_AT_1HZ};

/// One publishing process's history.
pub struct ProcHistory {
    pub last: Published,
    pub series: Series,
    pub gone: bool,
    /// In the latest snapshot.
    pub fresh: bool,
    pub nvml_used: Option<u64>,
}

/// Process histories kept at most (gone ones are dropped first). With 8
/// GPUs that is 16 series of at most a day at 1 Hz (2.6 MiB each): the
/// timeline stays under 50 MiB.
pub const MAX_HISTORIES: usize = 8;

pub struct LiveApp {
    pub latest: Option<Snapshot>,
    pub gpu_series: BTreeMap<u32, Series>,
    pub procs: BTreeMap<(u32, u32), ProcHistory>,
    /// Index into the latest snapshot's GPUs.
    pub selected_gpu: usize,
    /// Index among the selected GPU's publishers.
    pub selected_proc: usize,
    pub screen: Screen,
    pub alerts: Vec<Alert>,
    pub thresholds: Thresholds,
    banner: Option<String>,
    source: String,
    color: bool,
    status: String,
    series_cap: usize,
    /// Where snapshots arrive from (the sampler thread).
    pub feed: Option<std::sync::mpsc::Receiver<Snapshot>>,
    /// Readable when the sampler has sent a snapshot.
    pub waker: Option<std::os::unix::net::UnixStream>,
}

impl LiveApp {
    pub fn new(source: String, banner: Option<String>, color: bool) -> Self {
        LiveApp {
            latest: None,
            gpu_series: BTreeMap::new(),
            procs: BTreeMap::new(),
            selected_gpu: 0,
            selected_proc: 0,
            screen: Screen::default(),
            alerts: Vec::new(),
            thresholds: Thresholds::default(),
            banner,
            source,
            color,
            status: String::new(),
            series_cap: DAY_AT_1HZ,
            feed: None,
            waker: None,
        }
    }

    pub fn ingest(&mut self, mut snap: Snapshot) {
        let t = snap.time;
        self.alerts = alerts(&snap, &self.thresholds);
        for g in &snap.gpus {
            let (a, r) = snap
                .publishers
                .iter()
                .filter(|p| p.device == g.index)
                .fold((0, 0), |(a, r), p| (a + p.allocated(), r + p.reserved()));
            let cap = self.series_cap;
            self.gpu_series.entry(g.index).or_insert_with(|| Series::new(cap)).push(Sample {
                t,
                allocated: a,
                reserved: r,
                used: g.used_bytes.unwrap_or(0),
            });
        }
        for h in self.procs.values_mut() {
            h.fresh = false;
        }
        // Publishers move into their histories: their layouts are the
        // biggest thing a sample holds, kept once, not cloned.
        for p in std::mem::take(&mut snap.publishers) {
            let nvml_used = snap
                .gpus
                .iter()
                .find(|g| g.index == p.device)
                .and_then(|g| g.processes.iter().find(|x| p.matches(x)))
                .and_then(|x| x.used_bytes);
            let sample =
                Sample { t: p.time, allocated: p.allocated(), reserved: p.reserved(), used: nvml_used.unwrap_or(0) };
            let (time, ooms) = (p.time, p.stats.get("num_ooms").copied().unwrap_or(0));
            let cap = self.series_cap;
            let h = match self.procs.entry((p.device, p.pid)) {
                std::collections::btree_map::Entry::Occupied(e) => {
                    let h = e.into_mut();
                    h.last = p;
                    h
                }
                std::collections::btree_map::Entry::Vacant(e) => {
                    e.insert(ProcHistory { last: p, series: Series::new(cap), gone: false, fresh: true, nvml_used })
                }
            };
            h.series.push(sample);
            h.series.note_ooms(time, ooms);
            h.gone = false;
            h.fresh = true;
            h.nvml_used = nvml_used;
        }
        for pid in &snap.gone {
            for ((_, p), h) in self.procs.iter_mut() {
                if p == pid {
                    h.gone = true;
                }
            }
        }
        while self.procs.len() > MAX_HISTORIES {
            let victim = self.procs.iter().find(|(_, h)| h.gone).or_else(|| self.procs.iter().next()).map(|(k, _)| *k);
            match victim {
                Some(k) => {
                    self.procs.remove(&k);
                }
                None => break,
            }
        }
        if !snap.skipped.is_empty() && self.status.is_empty() {
            self.status = format!(" ignored: {}", snap.skipped[0]);
        }
        self.selected_gpu = self.selected_gpu.min(snap.gpus.len().saturating_sub(1));
        self.latest = Some(snap);
    }

    /// The latest snapshot with its publishers (which `ingest` moved into
    /// the histories).
    pub fn latest_full(&self) -> Option<Snapshot> {
        let mut s = self.latest.clone()?;
        s.publishers = self.procs.values().filter(|h| h.fresh).map(|h| h.last.clone()).collect();
        Some(s)
    }

    /// The publisher in the latest snapshot that is NVML's process `p` on GPU `gpu`.
    fn publisher_of(&self, gpu: u32, p: &crate::monitor::ProcessSample) -> Option<&Published> {
        self.procs.iter().find(|((d, _), h)| *d == gpu && h.fresh && h.last.matches(p)).map(|(_, h)| &h.last)
    }

    fn gpu(&self) -> Option<&GpuSample> {
        self.latest.as_ref().and_then(|s| s.gpus.get(self.selected_gpu))
    }

    /// Histories of the selected GPU's publishers, live ones first.
    fn publishers(&self) -> Vec<&ProcHistory> {
        let Some(g) = self.gpu() else { return Vec::new() };
        let mut v: Vec<&ProcHistory> = self.procs.iter().filter(|((d, _), _)| *d == g.index).map(|(_, h)| h).collect();
        v.sort_by_key(|h| (h.gone, h.last.pid));
        v
    }

    pub fn handle_key(&mut self, k: KeyEvent) {
        self.status.clear();
        if self.screen.handle_key(k) {
            return;
        }
        match k.code {
            KeyCode::Char(c @ '1'..='9') => {
                let i = c as usize - '1' as usize;
                let n = self.latest.as_ref().map_or(0, |s| s.gpus.len());
                if i < n {
                    self.selected_gpu = i;
                    self.selected_proc = 0;
                    self.screen.selected = 0;
                    self.screen.zoom = false;
                } else {
                    self.status = format!(" there is no GPU {c} (keys 1–{n})");
                }
            }
            KeyCode::Char('n') => {
                let n = self.publishers().len();
                if n > 0 {
                    self.selected_proc = (self.selected_proc + 1) % n;
                    self.screen.selected = 0;
                }
            }
            KeyCode::Char('s') => self.status = self.screenshot(),
            _ => {}
        }
    }

    /// `s`: the focused view of the selected publisher, as SVG here.
    fn screenshot(&mut self) -> String {
        let view = super::app::focused_view(&self.screen);
        let pubs = self.publishers();
        let Some(h) = pubs.get(self.selected_proc.min(pubs.len().saturating_sub(1))) else {
            return " nothing to screenshot: no process publishes its allocator state on this GPU".into();
        };
        let p = &h.last;
        let points = h.series.state_points();
        let peak_at = crate::analysis::peak_index(&points);
        let ooms: Vec<usize> = h.series.ooms.iter().map(|&t| h.series.index_at(t)).collect();
        let scene = crate::export::picture::Scene {
            title: format!("pid {} {} · GPU {}", p.pid, p.command.clone().unwrap_or_default(), p.device),
            subtitle: "published by the process (torch.cuda.memory_stats and memory_snapshot)".into(),
            segments: &p.segments,
            allocated: p.allocated(),
            allocated_peak: p.stat("allocated_bytes.all.peak"),
            reserved: p.reserved(),
            reserved_peak: p.stat("reserved_bytes.all.peak"),
            fragmentation: p.fragmentation(),
            timeline: &points,
            cursor: points.len().saturating_sub(1),
            peak_at,
            ooms: &ooms,
            iterations: &[],
            empty_caches: &[],
        };
        let svg = crate::export::picture::svg(&scene, view, 1600);
        let name = super::app::screenshot_name(&format!("pid{}", p.pid), view, "live");
        super::app::save(&name, svg.as_bytes())
    }

    fn gpu_lines(&self) -> Vec<Line<'static>> {
        let Some(snap) = &self.latest else { return vec![Line::from(" waiting for the first sample…")] };
        let mut lines = Vec::new();
        if snap.gpus.is_empty() {
            lines.push(Line::from(" NVML lists no GPU"));
        }
        for (i, g) in snap.gpus.iter().enumerate() {
            let sel = i == self.selected_gpu;
            let na = "N/A".to_string();
            let mem = match (g.used_bytes, g.total_bytes) {
                (Some(u), Some(t)) => {
                    let w = 20usize;
                    let fill = ((u as f64 / t.max(1) as f64) * w as f64).round() as usize;
                    format!(
                        "{}{} {} / {}",
                        "█".repeat(fill.min(w)),
                        "░".repeat(w - fill.min(w)),
                        human_bytes(u),
                        human_bytes(t)
                    )
                }
                _ => format!("memory {na}"),
            };
            let util = g.utilization_percent.map_or(na.clone(), |u| format!("{u}%"));
            let alert = self.alerts.iter().any(|a| a.gpu == g.index);
            let style =
                if sel { Style::default().add_modifier(Modifier::BOLD | Modifier::REVERSED) } else { Style::default() };
            lines.push(Line::from(vec![
                Span::styled(
                    format!(
                        "{}{} GPU {} {:<22} {mem}  util {util}{}",
                        if sel { "▶" } else { " " },
                        i + 1,
                        g.index,
                        g.name.clone().unwrap_or(na.clone()),
                        if alert { "  ⚠" } else { "" }
                    ),
                    style,
                ),
                Span::raw(if g.errors.is_empty() {
                    String::new()
                } else {
                    format!("  ({} field(s) N/A)", g.errors.len())
                }),
            ]));
            for p in &g.processes {
                let publ = self.publisher_of(g.index, p);
                let extra = match publ {
                    Some(x) => {
                        format!(
                            "  torch: allocated {} reserved {}",
                            human_bytes(x.allocated()),
                            human_bytes(x.reserved())
                        )
                    }
                    None => String::new(),
                };
                lines.push(Line::from(format!(
                    "      pid {:>7} {:<28} {:>10}{extra}",
                    p.pid,
                    p.command.clone().unwrap_or_else(|| "(not visible here)".into()),
                    p.used_bytes.map_or("N/A".into(), human_bytes),
                )));
            }
            for m in &g.mig {
                lines.push(Line::from(format!(
                    "      MIG {} {:<20} {} / {}",
                    m.index,
                    m.name.clone().unwrap_or_default(),
                    m.used_bytes.map_or("N/A".into(), human_bytes),
                    m.total_bytes.map_or("N/A".into(), human_bytes)
                )));
            }
        }
        lines
    }

    pub fn draw_into(&mut self, area: Rect, buf: &mut Buffer) {
        // The screen state is lent to the drawing while histories are borrowed.
        let mut screen_slot = std::mem::take(&mut self.screen);
        self.draw_with(&mut screen_slot, area, buf);
        self.screen = screen_slot;
    }

    fn draw_with(&self, screen_slot: &mut Screen, area: Rect, buf: &mut Buffer) {
        let lines = self.gpu_lines();
        let top_h = (lines.len() as u16 + 2).min(area.height / 3).max(3);
        let [top, rest] = Layout::vertical([Constraint::Length(top_h), Constraint::Min(0)]).areas(area);
        let title = Line::from(format!(" GPUs ─ {} ─ 1–9 pick, n next process ", self.source));
        let inner = super::paint::boxed(buf, top, &title, None);
        super::paint::lines(buf, inner, &lines);
        let alerts: Vec<String> = self.alerts.iter().map(|a| a.message.clone()).collect();
        let status =
            if alerts.is_empty() { self.status.clone() } else { format!(" ⚠ {}{}", alerts.join("; "), self.status) };
        let pubs = self.publishers();
        let sel = self.selected_proc.min(pubs.len().saturating_sub(1));
        let Some(h) = pubs.get(sel) else {
            let gpu = self.gpu().map_or("no GPU".into(), |g| format!("GPU {}", g.index));
            let msg = vec![
                Line::from(format!(" No process on {gpu} publishes its allocator state.")),
                Line::from(""),
                Line::from(" In the training script (assets/python/gpumem_top_publish.py on PYTHONPATH):"),
                Line::from("     import gpumem_top_publish; gpumem_top_publish.start()"),
                Line::from(""),
                Line::from(format!(" {status}")),
            ];
            let inner = super::paint::boxed(buf, rest, &Line::from(" Allocator "), None);
            super::paint::lines(buf, inner, &msg);
            return;
        };
        let p = &h.last;
        let segs = &p.segments;
        let totals = Totals {
            allocated: p.allocated(),
            allocated_peak: p.stat("allocated_bytes.all.peak"),
            reserved: p.reserved(),
            reserved_peak: p.stat("reserved_bytes.all.peak"),
            device_memory: self.gpu().and_then(|g| Some((g.used_bytes?, g.total_bytes?))),
        };
        let frag = p.fragmentation();
        let points = h.series.state_points();
        let ooms: Vec<usize> = h.series.ooms.iter().map(|&t| h.series.index_at(t)).collect();
        let peak_at = crate::analysis::peak_index(&points);
        let when = h.series.points().last().map_or(0.0, |s| s.t);
        let age = crate::monitor::now() - when;
        let chrome = Chrome {
            stacks: &[],
            screen: screen_slot,
            device: self
                .gpu()
                .map_or("GPU".into(), |g| format!("{} #{}", g.name.clone().unwrap_or("GPU".into()), g.index)),
            source: format!(
                "pid {} {}{}",
                p.pid,
                p.command.clone().unwrap_or_default(),
                if pubs.len() > 1 { format!(" ({}/{})", sel + 1, pubs.len()) } else { String::new() }
            ),
            position: if h.gone { format!("gone {age:.0} s ago") } else { format!("{age:.1} s ago") },
            banner: self.banner.clone(),
            color: self.color,
            status,
        };
        let marks = Marks {
            timeline: &points,
            cursor: points.len().saturating_sub(1),
            peak_at,
            ooms: &ooms,
            empty_caches: &[],
            iterations: &[],
        };
        draw_parts_into(segs, totals, frag, chrome, marks, rest, buf);
    }
}

impl super::app::Interactive for LiveApp {
    fn draw_into(&mut self, area: Rect, buf: &mut Buffer) {
        LiveApp::draw_into(self, area, buf)
    }
    fn handle_key(&mut self, k: KeyEvent) {
        LiveApp::handle_key(self, k)
    }
    fn quit(&self) -> bool {
        self.screen.quit
    }
    /// With a waker the sampler says when to look; without one, look
    /// five times a second.
    fn wait(&self) -> std::time::Duration {
        std::time::Duration::from_millis(if self.waker.is_some() { 5000 } else { 200 })
    }
    fn wake_fd(&self) -> Option<i32> {
        self.waker.as_ref().map(std::os::fd::AsRawFd::as_raw_fd)
    }
    /// Takes what the sampler sent; redraws only when something came.
    fn tick(&mut self) -> bool {
        if let Some(w) = &self.waker {
            let mut sink = [0u8; 64];
            loop {
                match std::io::Read::read(&mut &*w, &mut sink) {
                    Ok(n) if n > 0 => continue,
                    // The sampler is gone (its end closed): stop polling a
                    // descriptor that would stay readable, look on a timer.
                    Ok(_) => self.waker = None,
                    Err(_) => {}
                }
                break;
            }
        }
        let got: Vec<Snapshot> = self.feed.as_ref().map(|rx| rx.try_iter().collect()).unwrap_or_default();
        let changed = !got.is_empty();
        for s in got {
            self.ingest(s);
        }
        changed
    }
}
