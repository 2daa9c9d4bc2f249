//! The job screen of the live view: one row per rank of a distributed job
//! (allocated, reserved, peak, against the median, memory outside the
//! allocator, OOMs, retries), the median and the worst rank, and every
//! rank's allocated bytes on one time axis (docs/user/ranks.md). Drawn from
//! `&Job` and the ranks' series; nothing here changes them.

use ratatui_core::buffer::Buffer;
use ratatui_core::layout::{Constraint, Layout, Rect};
use ratatui_core::style::{Color, Modifier, Style};
use ratatui_core::text::{Line, Span};
use ratatui_core::widgets::Widget;

use super::chart::{Series as ChartSeries, Stroke, TimeChart};
use super::{boxed, put_rows};
use crate::analysis::{human_bytes, short_bytes};
use crate::monitor::job::{Job, RankRow};
use crate::timeline::Sample;

/// One frame of the job screen.
pub(crate) struct JobView<'m> {
    pub(crate) job: &'m Job,
    /// Each row's samples, in `job.ranks`' order.
    pub(crate) series: Vec<&'m [Sample]>,
    pub(crate) selected: usize,
    /// The imbalance share the alert fires over.
    pub(crate) threshold: f64,
    pub(crate) source: String,
    pub(crate) status: String,
    pub(crate) color: bool,
}

/// Colours of the ranks' lines, in turn.
const RANK_COLORS: [Color; 8] =
    [Color::Cyan, Color::LightRed, Color::Green, Color::Yellow, Color::Magenta, Color::Blue, Color::White, Color::Red];

/// Row `i`'s line colour (each line also ends in its rank's number, so
/// ranks stay apart in monochrome).
fn rank_color(i: usize, color: bool) -> Color {
    if color {
        RANK_COLORS[i % RANK_COLORS.len()]
    } else {
        Color::Reset
    }
}

impl JobView<'_> {
    /// The table's header and one line per rank, as wide as `width` allows:
    /// 78 columns for the figures every rank has, the GPU from 84, the
    /// latest step's own peak from 95.
    pub(crate) fn rows(&self, width: usize) -> Vec<Line<'static>> {
        let (gpu, step) = (width >= 84, width >= 95);
        let mut head = String::from("rank");
        if gpu {
            head.push_str(" GPU");
        }
        head.push_str("     pid  allocated   reserved");
        if step {
            head.push_str("  step peak");
        }
        head.push_str("       peak vs median    outside OOM retry");
        let mut out = vec![Line::from(Span::styled(head, Style::default().add_modifier(Modifier::BOLD)))];
        let m = self.job.median_peak_bytes;
        for (i, r) in self.job.ranks.iter().enumerate() {
            out.push(self.row(i, r, m, gpu, step));
        }
        out
    }

    fn row(&self, i: usize, r: &RankRow, median: u64, gpu: bool, step: bool) -> Line<'static> {
        let sel = i == self.selected;
        let vs = if median > 0 {
            format!("{:+.1}%", (r.peak_allocated_bytes as f64 / median as f64 - 1.0) * 100.0)
        } else {
            "n/a".into()
        };
        let mut s = format!("{}{:>3}", if sel { "▶" } else { " " }, r.rank);
        if gpu {
            s.push_str(&format!(" {:>3}", r.gpu));
        }
        s.push_str(&format!(
            " {:>7} {:>10} {:>10}",
            r.pid,
            human_bytes(r.allocated_bytes),
            human_bytes(r.reserved_bytes)
        ));
        if step {
            s.push_str(&format!(" {:>10}", r.step_peak_bytes.map_or("–".into(), human_bytes)));
        }
        s.push_str(&format!(
            " {:>10} {:>7} {:>10} {:>3} {:>4}",
            human_bytes(r.peak_allocated_bytes),
            vs,
            r.outside_allocator_bytes.map_or("N/A".into(), human_bytes),
            r.num_ooms,
            r.num_alloc_retries
        ));
        if r.gone {
            s.push_str(" gone");
        }
        let worst = r.rank == self.job.worst_rank && self.job.ranks.len() > 1;
        let mut style = Style::default();
        if sel {
            style = style.add_modifier(Modifier::REVERSED);
        }
        if r.gone {
            style = style.add_modifier(Modifier::DIM);
        }
        let mark = Span::styled(if worst { "▲" } else { "" }, style.fg(rank_color(i, self.color)));
        Line::from(vec![Span::styled(s, style), mark])
    }

    /// The line under the table: median, worst, and the alert's verdict.
    pub(crate) fn verdict(&self) -> String {
        let j = self.job;
        let over = j.ranks.len() > 1 && j.imbalance > self.threshold;
        format!(
            " median peak {} ─ worst rank {} at {} ({:+.1}%){}",
            human_bytes(j.median_peak_bytes),
            j.worst_rank,
            human_bytes(j.worst_peak_bytes),
            j.imbalance * 100.0,
            if over {
                format!(" ⚠ imbalance > {:.0}%", self.threshold * 100.0)
            } else {
                format!(" ─ within {:.0}%", self.threshold * 100.0)
            }
        )
    }

    fn chart(&self, area: Rect, buf: &mut Buffer) {
        let t0 = self.series.iter().filter_map(|s| s.first()).map(|p| p.t).fold(f64::INFINITY, f64::min);
        let t1 = self.series.iter().filter_map(|s| s.last()).map(|p| p.t).fold(f64::NEG_INFINITY, f64::max);
        let top = self.series.iter().flat_map(|s| s.iter().map(|p| p.allocated)).max().unwrap_or(0).max(1);
        let mut key = vec![Span::raw(format!(" 0–{} ─", short_bytes(top)))];
        for (i, r) in self.job.ranks.iter().enumerate() {
            key.push(Span::styled(format!(" ━{}", r.rank), Style::default().fg(rank_color(i, self.color))));
        }
        key.push(Span::raw(" "));
        let span = if t1 > t0 { t1 - t0 } else { 1.0 };
        let title = format!(" Allocated ─ every rank on one axis ({}) ", crate::view::duration(span));
        let inner = boxed(buf, area, Line::from(title), Some(Line::from(key)));
        if inner.height < 2 || inner.width < 8 || !t0.is_finite() {
            return;
        }
        let cols = inner.width as usize * 2;
        // Per braille column, each rank's most allocated sample in it; a
        // column without samples holds the one before.
        let line_of =
            |s: &[Sample]| super::chart::column_maxima(s.iter().map(|p| ((p.t - t0) / span, p.allocated)), cols, false);
        let lines: Vec<Vec<(f64, f64)>> = self.series.iter().map(|s| line_of(s)).collect();
        let series = lines
            .iter()
            .enumerate()
            .map(|(i, points)| ChartSeries { points, color: rank_color(i, self.color), stroke: Stroke::Solid })
            .collect();
        // Each rank's number at its line's end, printed over the lines.
        let marks = lines
            .iter()
            .zip(&self.job.ranks)
            .enumerate()
            .filter_map(|(i, (pts, r))| {
                let &(x, y) = pts.last()?;
                Some((x, y, Span::styled(r.rank.to_string(), Style::default().fg(rank_color(i, self.color)))))
            })
            .collect();
        TimeChart { cols, ymax: top as f64, series, limit: None, cursor: None, marks }.render(inner, buf);
    }
}

impl Widget for &JobView<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let j = self.job;
        let table_h = (j.ranks.len() as u16 + 4).min(area.height.saturating_sub(5)).max(4);
        let [table, chart, status] =
            Layout::vertical([Constraint::Length(table_h), Constraint::Min(3), Constraint::Length(1)]).areas(area);
        let gone = j.ranks.iter().filter(|r| r.gone).count();
        let title = format!(
            " Job {} ─ {} ─ {} of {} ranks{} ─ {} ",
            j.job,
            j.program(),
            j.ranks.len(),
            j.world_size,
            if gone > 0 { format!(", {gone} gone") } else { String::new() },
            self.source
        );
        let bold = Style::default().add_modifier(Modifier::BOLD);
        let inner = boxed(buf, table, Line::from(Span::styled(title, bold)), None);
        let mut lines = self.rows(inner.width as usize);
        let room = inner.height as usize;
        // The verdict stays on screen; rows past the room are cut from the end.
        let verdict = Line::from(self.verdict());
        if lines.len() + 1 > room {
            let keep = room.saturating_sub(1).max(1);
            // Keep the selected row in view.
            let first = (self.selected + 2).saturating_sub(keep).min(lines.len().saturating_sub(keep));
            let head = lines.remove(0);
            lines = std::iter::once(head).chain(lines.into_iter().skip(first).take(keep.saturating_sub(1))).collect();
        }
        lines.push(verdict);
        put_rows(buf, inner, lines);
        self.chart(chart, buf);
        let hints = if self.status.trim().is_empty() {
            " ↑/↓ rank  Enter its map and timeline  j back  q quit".to_string()
        } else {
            self.status.clone()
        };
        put_rows(buf, status, vec![Line::from(Span::styled(hints, Style::default().fg(Color::DarkGray)))]);
    }
}
