//! The timeline: allocated and reserved over the run (or by category),
//! peaks labelled, iterations ticked, the cursor and the limit.

use ratatui_core::buffer::Buffer;
use ratatui_core::layout::Rect;
use ratatui_core::style::{Color, Style};
use ratatui_core::text::{Line, Span};
use ratatui_core::widgets::Widget;

use crate::analysis::categories::Category;
use crate::analysis::{human_bytes, short_bytes};

use super::chart::{Series, Stroke, TimeChart};
use super::parts::{self, Focus, View};
use super::text::{boxed, duration, longest_fitting, put_row};
use super::theme::{category_color, Theme};

/// The points of a polyline without the inner points of its horizontal
/// runs: the canvas paints the same dots for one long flat segment as for
/// its pieces, and a steady reserved line is one run, not hundreds.
pub(crate) fn flat_runs_joined(pts: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(pts.len());
    for (i, &p) in pts.iter().enumerate() {
        let inner = i > 0 && i + 1 < pts.len() && pts[i - 1].1 == p.1 && pts[i + 1].1 == p.1;
        if !inner {
            out.push(p);
        }
    }
    out
}

/// The fewest points a zoom shows: closer, a column is a few events.
pub(crate) const MIN_ZOOM_POINTS: usize = 64;

/// A zoomed timeline's window: events `lo..hi` of `total` (counted from
/// the timeline's first point), at `level` (each a halving).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Zoom {
    pub(crate) lo: usize,
    pub(crate) hi: usize,
    pub(crate) total: usize,
    pub(crate) level: u8,
}

impl Zoom {
    /// At `level`, 1/2^level of `n` points (never fewer than
    /// `MIN_ZOOM_POINTS`) centred on the cursor; None where that is all
    /// of them.
    pub(crate) fn of(n: usize, cursor: usize, level: u8) -> Option<Zoom> {
        if level == 0 {
            return None;
        }
        let span = n.checked_shr(u32::from(level)).unwrap_or(0).max(MIN_ZOOM_POINTS);
        if span >= n {
            return None;
        }
        let lo = cursor.saturating_sub(span / 2).min(n - span);
        Some(Zoom { lo, hi: lo + span, total: n, level })
    }
}

/// The timeline, whole or (`+`/`-` in a replay) a window of it around the
/// cursor: the marks shifted into the window, the axis saying which part.
pub(crate) fn render_timeline(view: &View, theme: Theme, area: Rect, buf: &mut Buffer) {
    let n = view.marks.timeline.len();
    let zoom = Zoom::of(n, view.marks.cursor, view.sel.timeline_zoom).filter(|_| view.marks.clock.is_none());
    let Some(z) = zoom else { return draw_timeline(view, None, theme, area, buf) };
    let within =
        |v: &[usize]| -> Vec<usize> { v.iter().filter(|&&i| i >= z.lo && i < z.hi).map(|&i| i - z.lo).collect() };
    let (ooms, empty_caches, iterations) =
        (within(view.marks.ooms), within(view.marks.empty_caches), within(view.marks.iterations));
    let points = &view.marks.timeline[z.lo..z.hi];
    let mut zoomed = view.clone();
    zoomed.marks = parts::Marks {
        timeline: points,
        cursor: view.marks.cursor - z.lo,
        peak_at: view.marks.peak(z.lo, z.hi).map(|p| p.at - z.lo),
        ooms: &ooms,
        empty_caches: &empty_caches,
        iterations: &iterations,
        first_event: view.marks.first_event + z.lo,
        maxima: view.marks.maxima.map(|m| parts::Maxima { offset: m.offset + z.lo, ..m }),
        ..view.marks
    };
    // The title counts iterations over the whole run.
    let whole = ZoomOf { zoom: z, first_event: view.marks.first_event, iterations: view.marks.iterations };
    draw_timeline(&zoomed, Some(&whole), theme, area, buf);
}

/// A zoom and what the window is a part of.
pub(crate) struct ZoomOf<'a> {
    zoom: Zoom,
    /// The whole timeline's first event.
    first_event: usize,
    /// The whole timeline's iteration ends.
    iterations: &'a [usize],
}

impl ZoomOf<'_> {
    /// "events 1200–1800 of 10000000 (×16, - out) ─ iterations 12–14 of 4000".
    fn said(&self) -> String {
        let z = self.zoom;
        let f = self.first_event;
        let mut s =
            format!("events {}–{} of {} (×{}, - out)", z.lo + f, z.hi + f, z.total + f, 1u64 << z.level.min(63));
        if !self.iterations.is_empty() {
            let it = |i: usize| self.iterations.partition_point(|&m| m <= i) + 1;
            s.push_str(&format!(" ─ iterations {}–{} of {}", it(z.lo), it(z.hi - 1), self.iterations.len() + 1));
        }
        s
    }
}

fn draw_timeline(view: &View, zoom: Option<&ZoomOf>, theme: Theme, area: Rect, buf: &mut Buffer) {
    let n = view.marks.timeline.len();
    let focus = if view.sel.focus == Focus::Timeline { theme.bold() } else { Style::default() };
    let title = timeline_title(view, zoom);
    // A per-process limit is drawn as a line, so the scale reaches it.
    let limit = view.totals.capacity.filter(|c| c.1 == parts::ScaleBy::Limit).map(|c| c.0);
    let top = view.marks.peak(0, n).map_or(0, |p| p.reserved.max(p.allocated)).max(limit.unwrap_or(0));
    let room = (area.width as usize).saturating_sub(title.chars().count() + 4);
    let key = timeline_key(view, theme, room, limit, top);
    let inner = boxed(buf, area, Line::from(Span::styled(title, focus)), key);
    if n == 0 && inner.height > 0 {
        let note = "no timeline: the snapshot was taken without memory history (_record_memory_history), so it holds the state when it was taken and no events";
        put_row(buf, inner.x, inner.y, inner.width, Line::from(note));
    }
    if n == 0 || inner.width < 4 || inner.height < 2 {
        return;
    }
    let plot = Rect { height: inner.height - 1, ..inner };
    // With iterations, the plot's top row holds the peaks' labels and the
    // lines stay below it, so no label covers a line.
    let label_row = !view.marks.iterations.is_empty() && plot.height >= 3;
    let data_top = top.max(1) as f64;
    let ymax = if label_row { data_top * plot.height as f64 / (plot.height - 1) as f64 } else { data_top };
    // The braille column of point i: by event, or by time on a live clock.
    let times = view.marks.clock.map(|c| c.times).filter(|t| t.len() == n);
    let span = times.map_or(1.0, |t| (t[n - 1] - t[0]).max(1e-9));
    let cols = Columns::new(view, n, (plot.width as usize) * 2, times, span);
    let peaks = column_peaks(view, &cols);
    let lines = || stacked_lines(view, &cols, &peaks);
    let rest = || {
        let labels = peak_labels(view, &cols, plot.width as usize, if label_row { Some(ymax) } else { None });
        (series_points(view, &cols, &peaks), labels)
    };
    // A long run's stacked categories (each column's bytes found from its
    // sample) are as much work as the rest of the plot: beside it where a
    // helper is free (docs/measurements/benchmarks.md, "The map's rows on
    // free threads").
    let (stacked, ((alloc, reserved), labels)) =
        if super::parts::beside(n) { rayon::join(lines, rest) } else { (lines(), rest()) };
    let plotted = Plotted { alloc, reserved, stacked, labels, limit, ymax };
    plotted.chart(view, theme, &cols).render(plot, buf);
    let axis = timeline_footer(view, zoom.map(|z| z.zoom.total + z.first_event), times, inner.width as usize);
    buf.set_stringn(inner.x, inner.y + inner.height - 1, axis, inner.width as usize, theme.fg(Color::DarkGray));
}

/// "Timeline ─ allocated / reserved ─ peak … @ event N (iteration K)".
pub(crate) fn timeline_title(view: &View, zoom: Option<&ZoomOf>) -> String {
    let n = view.marks.timeline.len();
    let peak = view.marks.peak_at.and_then(|p| view.marks.timeline.get(p).map(|v| (p, v.allocated)));
    let t0 = view.marks.clock.and_then(|c| c.times.first().copied()).unwrap_or(0.0);
    let title = match peak {
        Some((p, v)) if zoom.is_some() => format!(
            " Timeline ─ {} ─ peak in view {} @ {} {} ",
            zoom.map(ZoomOf::said).unwrap_or_default(),
            human_bytes(v),
            view.marks.unit,
            p + view.marks.first_event
        ),
        Some((p, v)) if view.marks.clock.is_some() => {
            let at = view.marks.clock.and_then(|c| c.times.get(p).copied()).unwrap_or(t0);
            let step = if view.marks.iterations.is_empty() {
                String::new()
            } else {
                format!(", step {}", view.marks.iterations.partition_point(|&m| m < p) + 1)
            };
            format!(" Timeline ─ allocated / reserved ─ peak {} at {}{step} ", human_bytes(v), duration(at - t0))
        }
        // A run's timeline keeps its latest events only: its peak is the
        // shown window's, which the bars' all-time peak may exceed.
        Some((p, v)) if view.marks.first_event > 0 => {
            let u = view.marks.unit;
            format!(" Timeline ─ last {n} {u}s ─ peak in view {} @ {u} {} ", human_bytes(v), p + view.marks.first_event)
        }
        Some((p, v)) if !view.marks.iterations.is_empty() => format!(
            " Timeline ─ allocated / reserved ─ peak {} @ {} {p} (iteration {}) ",
            human_bytes(v),
            view.marks.unit,
            view.marks.iterations.partition_point(|&m| m <= p) + 1
        ),
        Some((p, v)) => {
            format!(" Timeline ─ allocated / reserved ─ peak {} @ {} {p} ", human_bytes(v), view.marks.unit)
        }
        None => " Timeline ─ allocated / reserved ".to_string(),
    };
    title
}

/// The scale and which line is which (reserved is never below allocated,
/// so without colour it is the upper line): what fits in `room` beside
/// the title of the scale, the key and the limit line's, or none.
pub(crate) fn timeline_key(
    view: &View,
    theme: Theme,
    room: usize,
    limit: Option<u64>,
    top: u64,
) -> Option<Line<'static>> {
    let n = view.marks.timeline.len();
    // The limit is the scale's top when the run kept under it.
    let scale = match limit {
        Some(l) if l == top => format!(" 0–{} ┄ the limit ", short_bytes(top)),
        _ => format!(" 0–{} ", short_bytes(top)),
    };
    let long = " ━ allocated under ━ reserved ";
    let limit_key = match limit {
        Some(l) if l != top => format!("┄ limit {} ", short_bytes(l)),
        _ => String::new(),
    };
    let (scale_w, long_w, limit_w) = (scale.chars().count(), long.chars().count(), limit_key.chars().count());
    // What fits beside the title: scale and key (with the limit line's),
    // the scale and the limit, the scale, or nothing.
    let key = match n {
        0 => None,
        _ if stacked_meaning(view).is_some() && scale_w + 36 <= room => Some(Line::from(vec![
            Span::raw(format!("{}─", scale)),
            Span::raw(" allocated stacked by category "),
            Span::styled("━ reserved ", theme.fg(Color::Blue)),
        ])),
        _ if scale_w + long_w + limit_w <= room => Some(Line::from(vec![
            Span::raw(format!("{}─", scale)),
            Span::styled(" ━ allocated", theme.fg(Color::Green)),
            Span::raw(" under "),
            Span::styled("━ reserved ", theme.fg(Color::Blue)),
            Span::styled(limit_key, theme.fg(Color::Red)),
        ])),
        _ if scale_w + limit_w <= room => {
            Some(Line::from(vec![Span::raw(scale), Span::styled(limit_key, theme.fg(Color::Red))]))
        }
        _ if scale_w <= room => Some(Line::from(scale)),
        _ => None,
    };
    key
}

/// A point of the plot: braille column, bytes.
pub(crate) type Point = (f64, f64);

/// Where points go across the plot: by event, or by time on a live clock.
pub(crate) struct Columns<'t> {
    /// Points.
    n: usize,
    /// Braille columns.
    cols: usize,
    times: Option<&'t [f64]>,
    span: f64,
    /// By event, each column's first point moved down to a multiple of
    /// `grain` points counted from `origin` points before the first (the
    /// block maxima's own boundaries: `range_max::grain`); 1 where not.
    grain: usize,
    origin: usize,
}

impl<'t> Columns<'t> {
    /// `cols` braille columns over `view`'s timeline of `n` points, by
    /// event or (`times`, `span` seconds) on a clock.
    fn new(view: &View, n: usize, cols: usize, times: Option<&'t [f64]>, span: f64) -> Columns<'t> {
        let grain = match view.marks.maxima {
            Some(_) if times.is_none() => crate::analysis::range_max::grain(n / cols.max(1)),
            _ => 1,
        };
        Columns { n, cols, times, span, grain, origin: view.marks.maxima.map_or(0, |m| m.offset) }
    }

    /// The braille column of point `i`.
    fn col(&self, i: usize) -> f64 {
        let i = i.min(self.n - 1);
        match self.times {
            Some(t) => (((t[i] - t[0]) / self.span * self.cols as f64) as usize).min(self.cols - 1) as f64,
            None if self.grain == 1 => (i * self.cols / self.n) as f64,
            None => {
                // A column's first point moved down by less than a column:
                // `i` is in the column it falls in unmoved, or the next.
                let c = i * self.cols / self.n;
                (if c + 1 < self.cols && i >= self.start(c + 1) { c + 1 } else { c }) as f64
            }
        }
    }

    /// The first point of braille column `c`, by event.
    fn start(&self, c: usize) -> usize {
        let at = c * self.n / self.cols;
        if self.grain == 1 {
            return at;
        }
        // Columns of at least eight grains: moved down, still after the
        // one before.
        ((at + self.origin) / self.grain * self.grain).saturating_sub(self.origin)
    }

    /// The points braille column `c` bins, by event (not on a clock).
    fn range(&self, c: usize) -> (usize, usize) {
        let lo = self.start(c);
        let hi = if c + 1 >= self.cols { self.n } else { self.start(c + 1) };
        (lo, hi.max(lo + 1).min(self.n))
    }
}

/// Each braille column's peak, binned by event (none on a clock): asked
/// once a frame, for the lines and the stacked categories both.
pub(crate) fn column_peaks(view: &View, c: &Columns) -> Vec<Option<crate::analysis::range_max::Peak>> {
    if c.times.is_some() {
        return Vec::new();
    }
    (0..c.cols).map(|col| c.range(col)).map(|(lo, hi)| view.marks.peak(lo, hi)).collect()
}

/// Per braille column, the highest value of each series in its points; on
/// a clock a column without points holds the value before it.
pub(crate) fn series_points(
    view: &View,
    c: &Columns,
    peaks: &[Option<crate::analysis::range_max::Peak>],
) -> (Vec<Point>, Vec<Point>) {
    let (cols, times) = (c.cols, c.times);
    let col = |i| c.col(i);
    let mut alloc_pts = Vec::with_capacity(cols);
    let mut resv_pts = Vec::with_capacity(cols);
    if times.is_some() {
        let mut cells: Vec<Option<(u64, u64)>> = vec![None; cols];
        for (i, p) in view.marks.timeline.iter().enumerate() {
            let c = &mut cells[col(i) as usize];
            *c = Some(c.map_or((p.allocated, p.reserved), |(a, r)| (a.max(p.allocated), r.max(p.reserved))));
        }
        let mut held = (0, 0);
        for (c, cell) in cells.into_iter().enumerate() {
            held = cell.unwrap_or(held);
            alloc_pts.push((c as f64, held.0 as f64));
            resv_pts.push((c as f64, held.1 as f64));
        }
    } else {
        for (c, p) in peaks.iter().enumerate() {
            let (a, r) = p.map_or((0, 0), |p| (p.allocated, p.reserved));
            alloc_pts.push((c as f64, a as f64));
            resv_pts.push((c as f64, r as f64));
        }
    }
    (flat_runs_joined(&alloc_pts), flat_runs_joined(&resv_pts))
}

/// The categories the timeline stacks, where `w` asks for them and their
/// history is kept (a running synthetic run keeps none: its map alone).
pub(crate) fn stacked_meaning<'v>(view: &View<'v>) -> Option<parts::Meaning<'v>> {
    view.sel.color_by.meaning(view.marks.meaning).filter(|m| m.keeps_history())
}

/// By category: each column's most allocated point, stacked in
/// `Category::ALL` order (the top line is allocated); none unless asked.
pub(crate) fn stacked_lines(
    view: &View,
    c: &Columns,
    peaks: &[Option<crate::analysis::range_max::Peak>],
) -> Vec<(Color, Vec<(f64, f64)>)> {
    let (cols, times) = (c.cols, c.times);
    let stacked: Vec<(Color, Vec<(f64, f64)>)> = match stacked_meaning(view).filter(|_| times.is_none()) {
        Some(m) => {
            let mut lines: Vec<Vec<(f64, f64)>> = vec![Vec::with_capacity(cols); Category::ALL.len()];
            let tops: Vec<usize> = (0..cols)
                .map(|col| peaks.get(col).copied().flatten().map_or(c.range(col).0, |p| p.at) + view.marks.first_event)
                .collect();
            let bytes = m.bytes_after_each(&tops).unwrap_or_default();
            for (c, b) in bytes.into_iter().enumerate() {
                let mut sum = 0u64;
                for (k, cat) in Category::ALL.into_iter().enumerate() {
                    sum += b.get(cat);
                    lines[k].push((c as f64, sum as f64));
                }
            }
            Category::ALL
                .into_iter()
                .zip(lines)
                .filter(|(_, l)| l.windows(2).any(|w| w[0] != w[1]) || l.iter().any(|p| p.1 > 0.0))
                .map(|(cat, l)| (category_color(cat), flat_runs_joined(&l)))
                .collect()
        }
        None => Vec::new(),
    };
    stacked
}

/// Per-iteration peaks, labelled highest first where the labels do not
/// overlap, so the global peak always gets its label: on the plot's top
/// row (`top_row`, its height) or at the peak.
pub(crate) fn peak_labels(view: &View, c: &Columns, width: usize, top_row: Option<f64>) -> Vec<(f64, f64, String)> {
    use crate::analysis::short_bytes_key;
    let mut labels: Vec<(f64, f64, String)> = Vec::new();
    if view.marks.iterations.is_empty() {
        return labels;
    }
    let mut taken: Vec<(usize, usize)> = Vec::new();
    let mut said: Vec<(usize, u64, u64)> = Vec::new();
    // Highest first, so equal peaks come together and so do equal labels:
    // each label's text is made once, and past the top few a label said
    // already skips the rest of its run (a long run has thousands of
    // iterations and few labels).
    let mut last: Option<(u64, (usize, u64, u64), String)> = None;
    let mut skip = None;
    for (i, v) in view.marks.iteration_peaks_by_height() {
        match last.as_mut() {
            Some(l) if l.0 == v => {}
            Some(l) if l.1 == short_bytes_key(v) => l.0 = v,
            _ => last = Some((v, short_bytes_key(v), format!("▲{}", short_bytes(v)))),
        }
        let Some((_, key, text)) = last.as_ref() else { continue };
        if skip == Some(*key) {
            continue;
        }
        // Past the top few, a peak the same as one labelled already says
        // nothing new: a long run of equal iterations gets a few labels,
        // not a row of them.
        if labels.len() >= TOP_LABELS && said.contains(key) {
            skip = Some(*key);
            continue;
        }
        let w = text.chars().count();
        let cell = (c.col(i) as usize / 2).min(width.saturating_sub(w));
        if taken.iter().all(|&(a, b)| cell + w < a || cell > b) {
            said.push(*key);
            taken.push((cell, cell + w));
            labels.push(((cell * 2) as f64, top_row.unwrap_or(v as f64), text.clone()));
        }
    }
    labels
}

/// Iteration peaks labelled whatever their value; past them, only values
/// not labelled yet.
pub(crate) const TOP_LABELS: usize = 3;

/// The least distance between two iteration ticks drawn, in the canvas's
/// units (two a cell): four cells, so that the canvas's rounding of where
/// text lands never leaves fewer than three.
pub(crate) const TICK_SPACING: f64 = 8.0;

/// What the timeline's plot draws.
pub(crate) struct Plotted {
    alloc: Vec<(f64, f64)>,
    reserved: Vec<(f64, f64)>,
    stacked: Vec<(Color, Vec<(f64, f64)>)>,
    labels: Vec<(f64, f64, String)>,
    limit: Option<u64>,
    ymax: f64,
}

impl Plotted {
    /// The series, the limit, the cursor and the marks as a time chart.
    fn chart<'p>(&'p self, view: &View, theme: Theme, c: &Columns) -> TimeChart<'p> {
        let paint = |color: Color| if theme.color { color } else { Color::Reset };
        let solid =
            |points: &'p [(f64, f64)], color: Color| Series { points, color: paint(color), stroke: Stroke::Solid };
        let mut series = vec![solid(&self.reserved, Color::Blue)];
        if self.stacked.is_empty() {
            series.push(solid(&self.alloc, Color::Green));
        }
        series.extend(self.stacked.iter().map(|(color, pts)| solid(pts, *color)));
        // Iteration ends at least three cells apart: denser, they are a comb
        // (the title counts them all).
        let mut iters: Vec<f64> = Vec::new();
        for x in view.marks.iterations.iter().map(|&e| c.col(e)) {
            if iters.last().is_none_or(|&l| x - l >= TICK_SPACING) {
                iters.push(x);
            }
        }
        let mut marks: Vec<(f64, f64, Span<'p>)> =
            iters.into_iter().map(|x| (x, 0.0, Span::styled("╵", theme.fg(Color::Magenta)))).collect();
        marks.extend(self.labels.iter().map(|(x, y, t)| (*x, *y, Span::styled(t.as_str(), theme.fg(Color::Magenta)))));
        marks
            .extend(view.marks.empty_caches.iter().map(|&e| (c.col(e), 0.0, Span::styled("E", theme.fg(Color::Cyan)))));
        // On the floor, with the step ticks: at the top an OOM would cover
        // the peak's label.
        marks.extend(view.marks.ooms.iter().map(|&o| (c.col(o), 0.0, Span::styled("✗", theme.fg(Color::Red)))));
        TimeChart {
            cols: c.cols,
            ymax: self.ymax,
            series,
            limit: self.limit.map(|l| l as f64),
            cursor: Some((c.col(view.marks.cursor), paint(Color::Yellow))),
            marks,
        }
    }
}

/// The line under the plot: the cursor's (or now's) figures and the marks'
/// counts, the longest that fits in `width`.
/// `of`: the whole timeline's last event where a zoom shows part of it.
pub(crate) fn timeline_footer(view: &View, of: Option<usize>, times: Option<&[f64]>, width: usize) -> String {
    let n = view.marks.timeline.len();
    let axis = match (view.marks.clock, times) {
        (Some(c), Some(t)) => {
            let at = if c.recorded { view.marks.cursor.min(n - 1) } else { n - 1 };
            let p = &view.marks.timeline[at];
            let when = if c.recorded {
                format!("cursor at {} of {}", duration(t[at] - t[0]), duration(t[n - 1] - t[0]))
            } else {
                format!("now (+{})", duration(t[n - 1] - t[0]))
            };
            format!(
                " {} ─── {when} ─ allocated {} ─ reserved {} ─ ✗ {} ─ ╵ {} {}",
                duration(0.0),
                human_bytes(p.allocated),
                human_bytes(p.reserved),
                crate::analysis::count(view.marks.ooms.len(), "OOM"),
                crate::analysis::count(view.marks.iterations.len(), "step"),
                if view.marks.iterations.is_empty() {
                    "(no optimizer step seen) "
                } else if c.step_peaks {
                    "▲ each step's own peak "
                } else {
                    "at their ends (no per-step peaks: run without --no-step-peaks) "
                }
            )
        }
        _ => {
            let (at, of) = (view.marks.cursor + view.marks.first_event, of.unwrap_or(n + view.marks.first_event));
            let u = view.marks.unit;
            let p = &view.marks.timeline[view.marks.cursor.min(n - 1)];
            let (a, r) = (human_bytes(p.allocated), human_bytes(p.reserved));
            let (ooms, ecs, its) = (view.marks.ooms.len(), view.marks.empty_caches.len(), view.marks.iterations.len());
            // The longest that fits: every mark's count stays, in short.
            let footers = [
                format!(
                    " cursor: {u} {at} of {of} ─ allocated {a} ─ reserved {r} ─ ✗ {} ─ E {ecs} empty_cache ─ ╵ {} ▲ peaks ",
                    crate::analysis::count(ooms, "OOM"),
                    crate::analysis::count(its, "iteration")
                ),
                format!(" {u} {at}/{of} ─ allocated {a} ─ reserved {r} ─ ✗ {ooms} ─ E {ecs} ─ ╵ {its} "),
                format!(" {at}/{of} ─ {} / {} ─ ✗{ooms} E{ecs} ╵{its} ", short_bytes(p.allocated), short_bytes(p.reserved)),
            ];
            longest_fitting(footers, width).unwrap_or_default()
        }
    };
    axis
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Columns whose first points are moved to the block maxima's
    /// boundaries still cover every point once and in order, less than a
    /// grain from where they were, each point in the column `col` names.
    #[test]
    fn columns_on_the_blocks_boundaries_cover_every_point_once() {
        let cases =
            [(10_000_000, 396, 0, 256), (312_500, 396, 4_843_767, 32), (9_999_353, 398, 0, 256), (70_000, 396, 5, 1)];
        for (n, cols, origin, grain) in cases {
            assert_eq!(crate::analysis::range_max::grain(n / cols), grain, "{n} points, {cols} columns");
            let c = Columns { n, cols, times: None, span: 1.0, grain, origin };
            let mut next = 0;
            for col in 0..cols {
                let (lo, hi) = c.range(col);
                assert!(lo == next && hi > lo, "column {col}: {lo}..{hi} after {next}");
                assert!(col * n / cols - lo < grain, "column {col}");
                if grain > 1 {
                    assert!(col == 0 || (lo + origin) % grain == 0, "column {col}");
                    for i in [lo, lo + 1, (lo + hi) / 2, hi - 1] {
                        assert_eq!(c.col(i) as usize, col, "point {i}");
                    }
                }
                next = hi;
            }
            assert_eq!(next, n);
        }
    }
}
