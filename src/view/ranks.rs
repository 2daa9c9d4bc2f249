//! `replay rank0 rank1 …` on a terminal: the ranks' figures in a table
//! and their fragmentation maps side by side, every map at the same bytes
//! per cell so that a rank holding more fills more (docs/user/ranks.md). Drawn
//! from `&RanksModel`; nothing here changes it.

use ratatui_core::buffer::Buffer;
use ratatui_core::layout::{Constraint, Layout, Rect};
use ratatui_core::style::{Color, Modifier, Style};
use ratatui_core::text::{Line, Span};
use ratatui_core::widgets::Widget;

use super::{boxed, put_rows, segment_cells, Cell};
use crate::analysis::human_bytes;
use crate::analysis::ranks::{RankReplay, RanksModel};

pub(crate) struct RanksView<'m> {
    pub(crate) model: &'m RanksModel,
    pub(crate) selected: usize,
    pub(crate) color: bool,
    pub(crate) status: String,
    pub(crate) help: bool,
}

impl RanksView<'_> {
    fn table(&self) -> Vec<Line<'static>> {
        let m = self.model.imbalance.as_ref().map_or(0, |i| i.median_peak_bytes);
        let mut out = vec![Line::from(Span::styled(
            "  rank  file                          peak alloc  peak reserved  vs median  OOMs  replay",
            Style::default().add_modifier(Modifier::BOLD),
        ))];
        for (i, r) in self.model.ranks.iter().enumerate() {
            let fig = self.model.imbalance.as_ref().map_or(r.allocated, |x| r.figure_on(x.measure));
            let vs = if m > 0 { format!("{:+.1}%", (fig as f64 / m as f64 - 1.0) * 100.0) } else { "n/a".into() };
            let s = format!(
                "{}{:>5}  {:<28} {:>11} {:>14} {:>10} {:>5}  {}",
                if i == self.selected { "▶" } else { " " },
                r.rank,
                super::ellipsis(r.name.clone(), 28),
                r.peak_allocated.map_or("n/a".into(), human_bytes),
                r.peak_reserved.map_or("n/a".into(), human_bytes),
                vs,
                r.ooms,
                r.fidelity
            );
            let style =
                if i == self.selected { Style::default().add_modifier(Modifier::REVERSED) } else { Style::default() };
            out.push(Line::from(Span::styled(s, style)));
        }
        if let Some(i) = &self.model.imbalance {
            out.push(Line::from(format!(" {}", i.describe())));
        }
        out
    }

    /// One rank's map in `area`: its segments by address, back to back,
    /// `per_cell` bytes a cell, row after row.
    fn map(&self, r: &RankReplay, per_cell: u64, area: Rect, buf: &mut Buffer) {
        let title = format!(
            " rank {} ─ {} {} ",
            r.rank,
            if r.peak_allocated.is_some() { "at its peak" } else { "in the snapshot" },
            human_bytes(r.figure())
        );
        let inner = boxed(buf, area, Line::from(title), None);
        if inner.width == 0 || inner.height == 0 {
            return;
        }
        let mut segs: Vec<_> = r.segments.iter().collect();
        segs.sort_by_key(|s| s.address);
        let cells: Vec<Cell> = segs
            .iter()
            .flat_map(|s| {
                let n = s.total_size.div_ceil(per_cell.max(1)).max(1) as usize;
                segment_cells(s, n)
            })
            .collect();
        let w = inner.width as usize;
        for (k, c) in cells.iter().take(w * inner.height as usize).enumerate() {
            let (x, y) = (inner.x + (k % w) as u16, inner.y + (k / w) as u16);
            let style = if self.color { Style::default().fg(c.color()) } else { Style::default() };
            if let Some(cell) = buf.cell_mut((x, y)) {
                cell.set_char(c.glyph()).set_style(style);
            }
        }
    }
}

impl Widget for &RanksView<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let m = self.model;
        let rows = self.table();
        let table_h = (rows.len() as u16 + 2).min(area.height / 2);
        // A message wraps (up to three rows) rather than lose its end.
        let said: Vec<String> = if self.status.trim().is_empty() {
            Vec::new()
        } else {
            let mut w = super::text::wrap(self.status.trim_end(), area.width as usize, 1);
            w.truncate(3);
            w
        };
        let [top, maps, legend, status] = Layout::vertical([
            Constraint::Length(table_h),
            Constraint::Min(4),
            Constraint::Length(1),
            Constraint::Length(said.len().max(1) as u16),
        ])
        .areas(area);
        let bold = Style::default().add_modifier(Modifier::BOLD);
        let title = format!(" gpumem-top ─ {} ranks side by side, each replayed alone ", m.ranks.len());
        let inner = boxed(buf, top, Line::from(Span::styled(title, bold)), Some(Line::from(" ? help ")));
        put_rows(buf, inner, rows);
        // Maps: as many columns as fit at 16 cells or more; the selected
        // rank's among them.
        let n = m.ranks.len().max(1);
        let cols = (maps.width as usize / 18).clamp(1, n);
        let first = self.selected.saturating_sub(cols - 1).min(n - cols);
        let shown: Vec<&RankReplay> = m.ranks.iter().skip(first).take(cols).collect();
        let areas = Layout::horizontal(vec![Constraint::Ratio(1, cols as u32); cols]).split(maps);
        // One scale for all: the largest reserved shown fills its map.
        let cell_room =
            areas.iter().map(|a| a.width.saturating_sub(2) as u64 * a.height.saturating_sub(2) as u64).min();
        let most = shown.iter().map(|r| r.segments.iter().map(|s| s.total_size).sum::<u64>()).max().unwrap_or(0);
        let per_cell = most.div_ceil(cell_room.unwrap_or(1).max(1)).max(1);
        for (r, a) in shown.iter().zip(areas.iter()) {
            self.map(r, per_cell, *a, buf);
        }
        let mut key: Vec<Span> = vec![Span::raw(format!(" {} a cell ─", human_bytes(per_cell)))];
        for (c, label) in Cell::LEGEND {
            let style = if self.color { Style::default().fg(c.color()) } else { Style::default() };
            key.push(Span::styled(format!(" {}", c.glyph()), style));
            key.push(Span::raw(format!(" {label}")));
        }
        put_rows(buf, legend, vec![Line::from(key)]);
        let lines: Vec<Line> = if said.is_empty() {
            let hints = crate::keys::hints_within(crate::keys::Mode::Ranks, status.width as usize);
            vec![Line::from(Span::styled(hints, Style::default().fg(Color::DarkGray)))]
        } else {
            said.into_iter().map(Line::from).collect()
        };
        put_rows(buf, status, lines);
        if self.help {
            let lines = vec![
                Line::from(Span::styled("ranks side by side: one snapshot per rank of a job", bold)),
                Line::from("each replayed alone, exactly as `gpumem-top replay FILE` would; the maps"),
                Line::from("show each rank's segments at its peak, at one scale for all (docs/user/ranks.md)"),
                Line::from(""),
                Line::from("↑/↓      select a rank"),
                Line::from("Enter    open it in the replay view; q there comes back here"),
                Line::from("q / Esc  close the help, else quit"),
            ];
            super::help_box(lines, area, buf);
        }
    }
}
