//! The live screen (and a recording of it): the GPUs NVML lists with their
//! processes above the selected publisher's allocator screens, or, while
//! no process publishes, what is awaited. Drawn from `LiveScreen`, which
//! the live and recording apps build from their model and selection.

use std::path::Path;

use ratatui_core::buffer::Buffer;
use ratatui_core::layout::{Constraint, Layout, Rect};
use ratatui_core::style::{Color, Modifier, Style};
use ratatui_core::text::{Line, Span};
use ratatui_core::widgets::Widget;
use ratatui_widgets::paragraph::{Paragraph, Wrap};

use super::parts::{Chrome, Clock, Marks, Selection, Totals};
use super::View;
use crate::analysis::{human_bytes, short_bytes};
use crate::keys::Mode;
use crate::monitor::model::{LiveModel, ProcHistory};
use crate::monitor::GpuSample;

/// What the screen says while no process publishes.
pub(crate) enum Awaited<'a> {
    /// The command `run` started (or `attach` follows), still running.
    Child { command: &'a str, pid: u32, log: Option<&'a Path> },
    /// That command ended without publishing.
    Ended { command: &'a str },
    /// No command: how to start one.
    Nothing,
}

/// Where the shown sample is: now, or one sample of a recording.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Position {
    Live { now: f64 },
    Recording { at: usize, of: usize, elapsed: f64 },
}

/// The live screen, as its app selected it.
pub(crate) struct LiveScreen<'a> {
    pub(crate) model: &'a LiveModel,
    /// Index into the latest sample's GPUs.
    pub(crate) gpu: usize,
    /// The selected GPU's publishers, live ones first.
    pub(crate) publishers: Vec<&'a ProcHistory>,
    /// Index among them.
    pub(crate) proc: usize,
    pub(crate) sel: Selection,
    pub(crate) source: &'a str,
    pub(crate) banner: Option<String>,
    pub(crate) color: bool,
    /// The samples come from the simulated device.
    pub(crate) simulated: bool,
    pub(crate) mode: Mode,
    /// The answer to the last key.
    pub(crate) status: &'a str,
    /// About the child and a pending snapshot.
    pub(crate) notes: String,
    /// The alerts, as the status line says them.
    pub(crate) alerts: Vec<String>,
    pub(crate) awaited: Awaited<'a>,
    pub(crate) position: Position,
}

impl LiveScreen<'_> {
    fn gpu(&self) -> Option<&GpuSample> {
        self.model.latest.as_ref().and_then(|s| s.gpus.get(self.gpu))
    }

    /// No publishing process to show yet: what is awaited (the command `run`
    /// started, or how to start one), the status, the key hints and the help.
    fn draw_waiting(&self, area: Rect, buf: &mut Buffer) {
        // The answer to a key and the alerts; what is awaited is said below.
        let status = if self.alerts.is_empty() {
            self.status.to_string()
        } else {
            format!("{} ⚠ {}", self.status.trim_end(), self.alerts.join("; "))
        };
        let on = self.gpu().map_or(String::new(), |g| format!(" on GPU {}", g.index));
        let mut lines = vec![Line::from("")];
        match self.awaited {
            Awaited::Child { command, pid, log } => {
                lines.push(Line::from(format!(
                    " Waiting for `{command}` (pid {pid}): it appears here once it initialises CUDA{}.",
                    log.map_or(String::new(), |l| format!("; its output goes to {}", l.display()))
                )));
                lines.push(Line::from(
                    " Processes that never touch CUDA publish nothing (torchrun's launcher itself, a data loader).",
                ));
            }
            Awaited::Ended { command } => {
                lines.push(Line::from(format!(" `{command}` ended without publishing its allocator state{on}.")));
            }
            Awaited::Nothing => {
                lines.push(Line::from(format!(" No process{on} publishes its allocator state.")));
                lines.push(Line::from(""));
                lines.push(Line::from(
                    " Start training under gpumem-top (no code change):  gpumem-top run -- python3 train.py",
                ));
                lines.push(Line::from(" or in the script (pip install gpumem-top, or a clone's pip install .):"));
                lines.push(Line::from("     import gpumem_top; gpumem_top.publish()"));
            }
        }
        let [body, foot] = Layout::vertical([Constraint::Min(0), Constraint::Length(1)]).areas(area);
        let inner = super::boxed(buf, body, Line::from(" Allocator "), Some(Line::from(" ? help ")));
        if !status.trim().is_empty() {
            lines.push(Line::from(""));
            lines.push(Line::from(format!(" {}", status.trim())));
        }
        // Long lines wrap here: the advice is at their end.
        Paragraph::new(lines).wrap(Wrap { trim: false }).render(inner, buf);
        let hints = crate::keys::hints_within(self.mode, foot.width as usize);
        let style = if self.color { Style::default().fg(Color::DarkGray) } else { Style::default() };
        super::put_rows(buf, foot, vec![Line::from(Span::styled(hints, style))]);
        if self.sel.help {
            super::help_overlay(self.color, self.mode, false, self.sel.help_scroll, area, buf);
        }
    }

    /// The GPU list, as wide as `width`: below 100 columns shorter bars,
    /// names and figures, so that nothing is cut at 80.
    fn gpu_lines(&self, width: usize) -> Vec<Line<'static>> {
        let narrow = width < 100;
        let Some(snap) = &self.model.latest else { return vec![Line::from(" waiting for the first sample…")] };
        let mut lines = Vec::new();
        if snap.gpus.is_empty() {
            lines.push(Line::from(" NVML lists no GPU"));
        }
        for (i, g) in snap.gpus.iter().enumerate() {
            lines.push(self.gpu_line(i, g, narrow));
            for p in &g.processes {
                lines.push(self.process_line(g.index, p, narrow));
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

    /// A GPU's line: its memory bar, figures and utilisation.
    fn gpu_line(&self, i: usize, g: &GpuSample, narrow: bool) -> Line<'static> {
        let sel = i == self.gpu;
        let na = "N/A".to_string();
        let mem = match (g.used_bytes, g.total_bytes) {
            (Some(u), Some(t)) => {
                let w = if narrow { 10usize } else { 20 };
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
        Line::from(vec![
            Span::styled(
                format!(
                    "{}{} GPU {} {:<22} {mem}  util {util}{}",
                    if sel { "▶" } else { " " },
                    i + 1,
                    g.index,
                    super::ellipsis(g.name.clone().unwrap_or(na.clone()), 22),
                    if alert { "  ⚠" } else { "" }
                ),
                style,
            ),
            Span::raw(if g.errors.is_empty() { String::new() } else { format!("  ({} field(s) N/A)", g.errors.len()) }),
        ])
    }

    /// A process's line under its GPU: NVML's figure, and PyTorch's where
    /// it publishes.
    fn process_line(&self, gpu: u32, p: &crate::monitor::ProcessSample, narrow: bool) -> Line<'static> {
        let publ = self.model.publisher_of(gpu, p);
        // What NVML counts beyond the allocator's reserve: the context,
        // NCCL's and other libraries' buffers (docs/user/ranks.md).
        let outside = publ.and_then(|x| crate::monitor::job::outside_allocator(p.used_bytes, x.reserved()));
        let extra = match (publ, narrow) {
            (Some(x), false) => format!(
                "  torch: allocated {} reserved {}{}",
                human_bytes(x.allocated()),
                human_bytes(x.reserved()),
                outside.map_or(String::new(), |o| format!(" outside {}", human_bytes(o)))
            ),
            (Some(x), true) => format!(
                "  alloc {} res {}{}",
                short_bytes(x.allocated()),
                short_bytes(x.reserved()),
                outside.map_or(String::new(), |o| format!(" out {}", short_bytes(o)))
            ),
            (None, _) => String::new(),
        };
        let name = publ.map(|x| x.name()).or_else(|| p.command.clone()).unwrap_or_else(|| "(not visible here)".into());
        let used = p.used_bytes.map_or("N/A".into(), human_bytes);
        Line::from(if narrow {
            format!("  pid {:>7} {:<22} {used:>10}{extra}", p.pid, super::ellipsis(name, 22))
        } else {
            format!("      pid {:>7} {:<28} {used:>10}{extra}", p.pid, name)
        })
    }

    /// The status line: the answer to a key first, then the alerts, which
    /// stay until they clear.
    fn status_line(&self) -> String {
        let status = format!("{}{}", self.notes, self.status);
        match (self.alerts.is_empty(), status.trim().is_empty()) {
            (true, _) => status,
            (false, true) => format!(" ⚠ {}", self.alerts.join("; ")),
            (false, false) => format!("{} ─ ⚠ {}", status.trim_end(), self.alerts.join("; ")),
        }
    }

    /// The selected publisher's allocator screens.
    fn draw_process(&self, h: &ProcHistory, area: Rect, buf: &mut Buffer) {
        let p = &h.last;
        let totals = Totals {
            device_memory: self
                .gpu()
                .and_then(|g| Some((g.used_bytes?, g.total_bytes?, if self.simulated { "simulated" } else { "NVML" }))),
            ..Totals::of_published(p)
        };
        let points = h.series.state_points();
        let ooms: Vec<usize> = h.series.ooms.iter().map(|&t| h.series.index_at(t)).collect();
        let peak_at = crate::analysis::peak_index(&points);
        // A recording shows one sample: the cursor is there, not at the end.
        let (cursor, position) = match self.position {
            Position::Recording { at, of, elapsed } => {
                (h.series.index_upto(p.time), format!("sample {} of {of}, {} in", at + 1, super::duration(elapsed)))
            }
            Position::Live { now } => {
                let age = now - h.series.points().last().map_or(0.0, |s| s.t);
                let last = points.len().saturating_sub(1);
                (last, if h.gone { format!("gone {age:.0} s ago") } else { format!("{age:.1} s ago") })
            }
        };
        let n = self.publishers.len();
        let chrome = Chrome {
            stacks: &[],
            device: self
                .gpu()
                .map_or("GPU".into(), |g| format!("{} #{}", g.name.clone().unwrap_or("GPU".into()), g.index)),
            source: format!(
                "pid {} {}{}",
                p.pid,
                p.name(),
                if n > 1 { format!(" ({}/{n})", self.proc + 1) } else { String::new() }
            ),
            position,
            banner: self.banner.clone(),
            color: self.color,
            status: self.status_line(),
            mode: Some(self.mode),
            oom: None,
        };
        let times = h.series.times();
        let steps = h.series.step_indices();
        let recorded = matches!(self.position, Position::Recording { .. });
        let marks = Marks {
            timeline: &points,
            cursor,
            peak_at,
            ooms: &ooms,
            empty_caches: &[],
            iterations: &steps,
            clock: Some(Clock { times: &times, step_peaks: p.step_peaks, recorded }),
            first_event: 0,
            unit: "event",
            meaning: None,
            maxima: None,
        };
        View::new(chrome, totals, &p.segments, p.fragmentation(), marks, self.sel).render(area, buf);
    }
}

impl Widget for &LiveScreen<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let lines = self.gpu_lines(area.width.saturating_sub(2) as usize);
        let top_h = (lines.len() as u16 + 2).min(area.height / 3).max(3);
        let [top, rest] = Layout::vertical([Constraint::Length(top_h), Constraint::Min(0)]).areas(area);
        let title = Line::from(format!(" GPUs ─ {} ─ 1–9 pick, n next process ", self.source));
        let inner = super::boxed(buf, top, title, None);
        super::put_rows(buf, inner, lines);
        match self.publishers.get(self.proc) {
            Some(h) => self.draw_process(h, rest, buf),
            None => self.draw_waiting(rest, buf),
        }
    }
}
