//! The diff screen: two runs' figures, both timelines on one axis
//! (iterations aligned) and what grew at the peak (docs/user/diff.md). Drawn
//! from `&DiffModel` and the cursor; nothing here changes them.

use ratatui_core::buffer::Buffer;
use ratatui_core::layout::{Constraint, Layout, Rect};
use ratatui_core::style::{Color, Modifier, Style};
use ratatui_core::text::{Line, Span};
use ratatui_core::widgets::Widget;

use super::chart::{Series as ChartSeries, Stroke, TimeChart};
use super::{boxed, put_rows};
use crate::analysis::diff::{signed, DiffModel, GrowthRow, Series};
use crate::analysis::{human_bytes, short_bytes};

/// One frame: `cursor` on the shared axis (iterations).
pub(crate) struct DiffView<'m> {
    pub(crate) model: &'m DiffModel,
    pub(crate) cursor: f64,
    pub(crate) color: bool,
    pub(crate) status: String,
    pub(crate) help: bool,
}

const BASE: Color = super::theme::RUN_BASE.term;
const NEW: Color = super::theme::RUN_NEW.term;

impl Widget for &DiffView<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let m = self.model;
        let fg = |c: Color| if self.color { Style::default().fg(c) } else { Style::default() };
        let bold = Style::default().add_modifier(Modifier::BOLD);
        let [top, mid, bottom, status] = Layout::vertical([
            Constraint::Length(7),
            Constraint::Min(8),
            Constraint::Length((area.height / 3).max(8)),
            Constraint::Length(1),
        ])
        .areas(area);
        // The figures, each the run's own.
        let r = &m.report;
        let title = format!(" gpumem-top ─ diff {} → {} ", r.base.trace, r.new.trace);
        let inner = boxed(buf, top, Line::from(Span::styled(title, bold)), Some(Line::from(" ? help ")));
        let row = |what: &str, p: &crate::analysis::diff::Pair| {
            let g = p.growth.map(|g| format!(" ({:+.1}%)", g * 100.0)).unwrap_or_default();
            let style = if p.delta > 0 { fg(Color::Red) } else { fg(Color::Green) };
            Line::from(vec![
                Span::raw(format!(" {what:<18}{:>12}{:>12}  ", human_bytes(p.base), human_bytes(p.new))),
                Span::styled(
                    format!("{}{g}", signed(p.delta, short_bytes)),
                    if p.delta == 0 { Style::default() } else { style },
                ),
            ])
        };
        let mut lines = vec![
            Line::from(vec![
                Span::raw(format!(" {:<18}", "")),
                Span::styled(format!("{:>12}", "base"), fg(BASE)),
                Span::styled(format!("{:>12}", "new"), fg(NEW)),
                Span::raw("  change"),
            ]),
            row("peak allocated", &r.peak.allocated),
            row("peak reserved", &r.peak.reserved),
            row("alive at the end", &r.peak.end_allocated),
        ];
        let note = r.notes.first().cloned().unwrap_or_else(|| {
            // In the figures' columns.
            format!(
                " {:<18}{:>12}{:>12}",
                "retries / OOMs",
                format!("{} / {}", r.peak.num_alloc_retries[0], r.peak.num_ooms[0]),
                format!("{} / {}", r.peak.num_alloc_retries[1], r.peak.num_ooms[1])
            )
        });
        lines.push(Line::from(note));
        put_rows(buf, inner, lines);
        self.timeline(mid, buf);
        self.table(bottom, buf);
        let hints = if self.status.trim().is_empty() {
            crate::keys::hints_within(crate::keys::Mode::Diff, status.width as usize)
        } else {
            self.status.clone()
        };
        put_rows(buf, status, vec![Line::from(Span::styled(hints, fg(Color::DarkGray)))]);
        if self.help {
            let lines = vec![
                Line::from(Span::styled("diff: two runs of one program", bold)),
                Line::from("the timelines: allocated bytes of each run over iterations, aligned so that"),
                Line::from("iteration k of one is over iteration k of the other (Optimizer.step markers)"),
                Line::from(""),
                Line::from("←/→ PgUp/PgDn   move the cursor; its line reads both runs there"),
                Line::from("p / P           the base's / the new run's peak"),
                Line::from("Home / End      the start / the end"),
                Line::from("q / Esc         close the help, else quit"),
                Line::from(""),
                Line::from("the table: what grew at the peaks, by category and by call site"),
                Line::from("(docs/user/diff.md, docs/user/categories.md)"),
            ];
            super::help_box(lines, area, buf);
        }
    }
}

impl DiffView<'_> {
    fn timeline(&self, area: Rect, buf: &mut Buffer) {
        let m = self.model;
        let span = m.span();
        let top = [&m.base, &m.new].iter().flat_map(|s| s.points.iter().map(|p| p.allocated)).max().unwrap_or(0).max(1);
        let key = Line::from(vec![
            Span::raw(format!(" 0–{} ─", short_bytes(top))),
            // Without colour the base is dotted, the new run solid.
            Span::styled(
                if self.color { " ━ base" } else { " ┄ base" },
                Style::default().fg(if self.color { BASE } else { Color::Reset }),
            ),
            Span::styled(" ━ new ", Style::default().fg(if self.color { NEW } else { Color::Reset })),
        ]);
        // The longest title that leaves the key its room on the top edge.
        let room = (area.width as usize).saturating_sub(key.width() + 4);
        let title = super::text::longest_fitting(
            [
                format!(" Allocated ─ both runs, iterations aligned ({span} on the axis) "),
                format!(" Allocated, {span} iterations aligned "),
                " Allocated ".to_string(),
            ],
            room,
        )
        .unwrap_or_default();
        let inner = boxed(buf, area, Line::from(title), Some(key));
        if inner.height < 3 || inner.width < 8 {
            return;
        }
        let plot = Rect { height: inner.height - 1, ..inner };
        let cols = plot.width as usize * 2;
        // Per braille column, each run's most allocated point in it.
        let line_of = |s: &Series| {
            let pts = s.points.iter().enumerate().map(|(i, p)| (s.x_of(i) / span, p.allocated));
            super::chart::column_maxima(pts, cols, true)
        };
        let (b, n) = (line_of(&m.base), line_of(&m.new));
        let cx = (self.cursor / span * cols as f64).min(cols as f64 - 1.0);
        let paint = |c: Color| if self.color { c } else { Color::Reset };
        // Without colour the base is dotted, so the two runs are told apart
        // by their stroke where they cannot be by colour.
        let base_stroke = if self.color { Stroke::Solid } else { Stroke::Dotted };
        TimeChart {
            cols,
            ymax: top as f64,
            series: vec![
                ChartSeries { points: &b, color: paint(BASE), stroke: base_stroke },
                ChartSeries { points: &n, color: paint(NEW), stroke: Stroke::Solid },
            ],
            limit: None,
            cursor: Some((cx, paint(Color::Yellow))),
            marks: (1..span as usize).map(|k| (k as f64 * cols as f64 / span, 0.0, Span::raw("╵"))).collect(),
        }
        .render(plot, buf);
        let (bi, ni) = (m.base.at_x(self.cursor), m.new.at_x(self.cursor));
        let a = |s: &Series, i: usize| s.points.get(i).map_or(0, |p| p.allocated);
        // The iteration the cursor is in, numbered as the title counts them
        // (End is the last one's end, not one past it).
        let k = (self.cursor.floor() as usize + 1).min(span.ceil().max(1.0) as usize);
        let through = ((self.cursor - (k - 1) as f64).clamp(0.0, 1.0) * 100.0).round();
        let (n, bb, nb) = (span.ceil().max(1.0) as usize, human_bytes(a(&m.base, bi)), human_bytes(a(&m.new, ni)));
        // The longest that fits: figures are never cut.
        let footer = super::text::longest_fitting(
            [
                format!(" cursor: iteration {k} of {n}, {through:.0}% through ─ base {bb} (event {bi}) ─ new {nb} (event {ni}) ─ ╵ iteration ends"),
                format!(" cursor: iteration {k} of {n}, {through:.0}% through ─ base {bb} (event {bi}) ─ new {nb} (event {ni})"),
                format!(" cursor: iteration {k} of {n}, {through:.0}% through ─ base {bb} ─ new {nb}"),
                format!(" iteration {k}/{n} ─ base {bb} ─ new {nb}"),
            ],
            inner.width as usize,
        )
        .unwrap_or_default();
        buf.set_stringn(inner.x, inner.y + inner.height - 1, footer, inner.width as usize, Style::default());
    }

    fn table(&self, area: Rect, buf: &mut Buffer) {
        let r = &self.model.report;
        let [left, right] = Layout::horizontal([Constraint::Percentage(40), Constraint::Percentage(60)]).areas(area);
        // Each row: the change, both runs' bytes, and what it is; where the
        // pane is too narrow for a readable name beside them, the change and
        // the name alone (the name is what a reader needs first).
        let rows = |g: &[GrowthRow], label: &dyn Fn(&GrowthRow) -> String, h: usize, w: u16| -> Vec<Line<'static>> {
            if g.is_empty() {
                return vec![Line::from(" no change")];
            }
            let full = (w as usize).saturating_sub(32) >= 16;
            g.iter()
                .take(h)
                .map(|x| {
                    let d = signed(x.delta_bytes, short_bytes);
                    Line::from(if full {
                        format!(
                            " {d:>9}  {:>8} → {:<8} {}",
                            short_bytes(x.base_bytes),
                            short_bytes(x.new_bytes),
                            label(x)
                        )
                    } else {
                        format!(" {d:>7} {}", label(x))
                    })
                })
                .collect()
        };
        let h = area.height.saturating_sub(2) as usize;
        let inner = boxed(buf, left, Line::from(" At the peaks, by category "), None);
        let cat = |x: &GrowthRow| x.category.map_or(String::new(), |c| c.plural().to_string());
        put_rows(buf, inner, rows(&r.at_peak.by_category, &cat, h, inner.width));
        let inner = boxed(buf, right, Line::from(" At the peaks, by call site "), None);
        let site = |x: &GrowthRow| x.call_site.clone().unwrap_or_default();
        let lines = if r.at_peak.by_call_site.is_empty() && r.aligned_share < 0.5 {
            vec![Line::from(" two different programs: call sites not compared")]
        } else {
            rows(&r.at_peak.by_call_site, &site, h, inner.width)
        };
        put_rows(buf, inner, lines);
    }
}
