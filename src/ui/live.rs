//! The live view: every GPU NVML sees with its processes, and for the
//! selected GPU the allocator screens of the PyTorch process that publishes
//! its state. Samples arrive as events from the sampler thread into the
//! `LiveModel`; this keeps only what the keys selected, and draws.

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Widget};

use super::event::{Action, Event, Interactive, Screen};
use crate::analysis::human_bytes;
use crate::monitor::model::{LiveModel, ProcHistory};
use crate::monitor::{GpuSample, Published, Snapshot};
use crate::view::parts::{draw_parts, Chrome, Clock, Marks, Totals};

pub struct LiveApp {
    pub model: LiveModel,
    /// Index into the latest snapshot's GPUs.
    pub selected_gpu: usize,
    /// Index among the selected GPU's publishers.
    pub(crate) selected_proc: usize,
    pub(crate) screen: Screen,
    banner: Option<String>,
    source: String,
    color: bool,
    status: String,
}

impl LiveApp {
    pub fn new(source: String, banner: Option<String>, color: bool) -> Self {
        LiveApp {
            model: LiveModel::default(),
            selected_gpu: 0,
            selected_proc: 0,
            screen: Screen::default(),
            banner,
            source,
            color,
            status: String::new(),
        }
    }

    /// Takes a sample into the model.
    pub fn ingest(&mut self, snap: Snapshot) {
        self.model.ingest(snap);
        if self.status.is_empty() {
            if let Some(why) = &self.model.ignored {
                self.status = format!(" ignored: {why}");
            }
        }
        let gpus = self.model.latest.as_ref().map_or(0, |s| s.gpus.len());
        self.selected_gpu = self.selected_gpu.min(gpus.saturating_sub(1));
    }

    fn gpu(&self) -> Option<&GpuSample> {
        self.model.latest.as_ref().and_then(|s| s.gpus.get(self.selected_gpu))
    }

    /// Histories of the selected GPU's publishers, live ones first.
    fn publishers(&self) -> Vec<&ProcHistory> {
        self.gpu().map_or_else(Vec::new, |g| self.model.publishers_on(g.index))
    }

    fn publisher_of(&self, gpu: u32, p: &crate::monitor::ProcessSample) -> Option<&Published> {
        self.model.publisher_of(gpu, p)
    }

    /// `s`: the focused view of the selected publisher, as SVG here.
    fn screenshot(&self) -> String {
        let view = super::app::focused_view(&self.screen);
        let pubs = self.publishers();
        let Some(h) = pubs.get(self.selected_proc.min(pubs.len().saturating_sub(1))) else {
            return " nothing to screenshot: no process publishes its allocator state on this GPU".into();
        };
        let p = &h.last;
        let points = h.series.state_points();
        let peak_at = crate::analysis::peak_index(&points);
        let ooms: Vec<usize> = h.series.ooms.iter().map(|&t| h.series.index_at(t)).collect();
        let steps = h.series.step_indices();
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
            iterations: &steps,
            empty_caches: &[],
        };
        let svg = crate::export::picture::svg(&scene, view, 1600);
        let name = super::app::screenshot_name(&format!("pid{}", p.pid), view, "live");
        super::app::save(&name, svg.as_bytes())
    }

    fn gpu_lines(&self) -> Vec<Line<'static>> {
        let Some(snap) = &self.model.latest else { return vec![Line::from(" waiting for the first sample…")] };
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
            let alert = self.model.alerts.iter().any(|a| a.gpu == g.index);
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
}

impl Interactive for LiveApp {
    fn draw_into(&mut self, area: Rect, buf: &mut Buffer) {
        let lines = self.gpu_lines();
        let top_h = (lines.len() as u16 + 2).min(area.height / 3).max(3);
        let [top, rest] = Layout::vertical([Constraint::Length(top_h), Constraint::Min(0)]).areas(area);
        let title = Line::from(format!(" GPUs ─ {} ─ 1–9 pick, n next process ", self.source));
        let block = Block::bordered().title(title);
        let inner = block.inner(top);
        block.render(top, buf);
        crate::view::put_rows(buf, inner, lines);
        let alerts: Vec<String> = self.model.alerts.iter().map(|a| a.message.clone()).collect();
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
            Paragraph::new(msg).block(Block::bordered().title(" Allocator ")).render(rest, buf);
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
            keys: crate::view::LIVE_KEYS,
        };
        let times = h.series.times();
        let steps = h.series.step_indices();
        let marks = Marks {
            timeline: &points,
            cursor: points.len().saturating_sub(1),
            peak_at,
            ooms: &ooms,
            empty_caches: &[],
            iterations: &steps,
            clock: Some(Clock { times: &times, step_peaks: p.step_peaks }),
        };
        draw_parts(segs, totals, frag, chrome, marks, self.screen.sel, rest, buf);
    }

    fn apply(&mut self, a: Action) {
        self.status.clear();
        if self.screen.apply(a) {
            let pubs = self.publishers();
            if let Some(h) = pubs.get(self.selected_proc.min(pubs.len().saturating_sub(1))) {
                let sel = self.screen.sel.clamped(&h.last.segments);
                self.screen.sel = sel;
            }
            return;
        }
        match a {
            Action::Gpu(i) => {
                let n = self.model.latest.as_ref().map_or(0, |s| s.gpus.len());
                if i < n {
                    self.selected_gpu = i;
                    self.selected_proc = 0;
                    self.screen.sel.selected = 0;
                    self.screen.sel.zoom = false;
                } else {
                    self.status = format!(" there is no GPU {} (keys 1–{n})", i + 1);
                }
            }
            Action::NextProcess => {
                let n = self.publishers().len();
                if n > 0 {
                    self.selected_proc = (self.selected_proc + 1) % n;
                    self.screen.sel.selected = 0;
                }
            }
            Action::Screenshot => self.status = self.screenshot(),
            _ => {}
        }
    }

    /// A sample from the sampler: into the model, and redraw.
    fn update(&mut self, e: Event) -> bool {
        match e {
            Event::Sample(s) => {
                self.ingest(*s);
                true
            }
            _ => false,
        }
    }

    fn quit(&self) -> bool {
        self.screen.quit
    }
}
