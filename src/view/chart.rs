//! The one time chart: series binned into the braille columns of a plot
//! (`column_maxima`) and drawn by `TimeChart`, for the replay timeline,
//! the diff screen's two runs and the job screen's ranks.

use ratatui_core::buffer::Buffer;
use ratatui_core::layout::Rect;
use ratatui_core::style::Color;
use ratatui_core::symbols::Marker;
use ratatui_core::text::Span;
use ratatui_core::widgets::Widget;
use ratatui_widgets::canvas::{Canvas, Line as CanvasLine, Painter, Points, Shape};

/// How a series is stroked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stroke {
    Solid,
    /// Every third point: tells a series apart where colour cannot.
    Dotted,
}

/// One series of a time chart: points in (braille column, value).
pub(crate) struct Series<'a> {
    pub(crate) points: &'a [(f64, f64)],
    pub(crate) color: Color,
    pub(crate) stroke: Stroke,
}

/// A braille time chart, `cols` braille columns wide (two a cell) and
/// `ymax` high: its series in order, a dashed limit, a cursor, then its
/// marks (ticks and labels) printed over the lines.
pub(crate) struct TimeChart<'a> {
    pub(crate) cols: usize,
    pub(crate) ymax: f64,
    pub(crate) series: Vec<Series<'a>>,
    /// A level drawn dashed in red (a per-process memory limit).
    pub(crate) limit: Option<f64>,
    /// The cursor's column and colour.
    pub(crate) cursor: Option<(f64, Color)>,
    /// Text at (column, value), in the order given.
    pub(crate) marks: Vec<(f64, f64, Span<'a>)>,
}

impl Widget for TimeChart<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let TimeChart { cols, ymax, series, limit, cursor, marks } = self;
        let width = cols as f64;
        Canvas::default()
            .marker(Marker::Braille)
            .x_bounds([0.0, width])
            .y_bounds([0.0, ymax])
            .paint(|ctx| {
                for s in &series {
                    match s.stroke {
                        Stroke::Solid => ctx.draw(&Polyline { points: s.points, color: s.color }),
                        Stroke::Dotted => {
                            let dots: Vec<(f64, f64)> = s.points.iter().step_by(3).copied().collect();
                            ctx.draw(&Points { coords: &dots, color: s.color });
                        }
                    }
                }
                if let Some(l) = limit {
                    // Dashed, so it does not read as a series.
                    let mut x = 0.0;
                    while x < width {
                        ctx.draw(&CanvasLine::new(x, l, (x + 3.0).min(width), l, Color::Red));
                        x += 6.0;
                    }
                }
                if let Some((x, c)) = cursor {
                    ctx.draw(&CanvasLine::new(x, 0.0, x, ymax, c));
                }
                for (x, y, text) in &marks {
                    // The canvas keeps what it prints past this frame's borrows.
                    ctx.print(*x, *y, Span::styled(text.content.to_string(), text.style));
                }
            })
            .render(area, buf);
    }
}

/// A series' points joined by lines, painted dot for dot as ratatui's
/// `canvas::Line` paints each segment, with each point placed on the grid
/// once: a frame by category joins a few thousand segments, and a `Line`
/// each (its clipping, both ends placed, a painter made per shape) was a
/// tenth of the frame (docs/measurements/benchmarks.md, "Lines drawn as
/// one shape").
struct Polyline<'p> {
    points: &'p [(f64, f64)],
    color: Color,
}

impl Shape for Polyline<'_> {
    fn draw(&self, painter: &mut Painter) {
        let placed: Vec<Option<(usize, usize)>> = self.points.iter().map(|&(x, y)| painter.get_point(x, y)).collect();
        for (w, p) in self.points.windows(2).zip(placed.windows(2)) {
            match (p[0], p[1]) {
                (Some(a), Some(b)) => line_points(a, b, |x, y| painter.paint(x, y, self.color)),
                // An end outside the bounds: the line clipped to them.
                _ => CanvasLine::new(w[0].0, w[0].1, w[1].0, w[1].1, self.color).draw(painter),
            }
        }
    }
}

/// The grid points of the line from `a` to `b`, as ratatui's
/// `canvas::Line` (Bresenham's, from the end with the lesser coordinate
/// along the longer axis).
fn line_points((x1, y1): (usize, usize), (x2, y2): (usize, usize), mut f: impl FnMut(usize, usize)) {
    let (dx, dy) = (x2.abs_diff(x1), y2.abs_diff(y1));
    if dx == 0 {
        (y1.min(y2)..=y1.max(y2)).for_each(|y| f(x1, y));
    } else if dy == 0 {
        (x1.min(x2)..=x1.max(x2)).for_each(|x| f(x, y1));
    } else if dy < dx {
        along_x((x1, y1), (x2, y2), f);
    } else {
        // Steep: the same walk along y, the axes swapped.
        along_x((y1, x1), (y2, x2), |y, x| f(x, y));
    }
}

/// Bresenham's walk from the end with the lesser `x` to the other, one
/// point per `x` (the longer axis).
fn along_x(a: (usize, usize), b: (usize, usize), mut f: impl FnMut(usize, usize)) {
    let ((x1, y1), (x2, y2)) = if a.0 > b.0 { (b, a) } else { (a, b) };
    let (dx, dy) = (x2.abs_diff(x1) as isize, y2.abs_diff(y1) as isize);
    let mut d = 2 * dy - dx;
    let mut y = y1;
    for x in x1..=x2 {
        f(x, y);
        if d > 0 {
            y = if y1 > y2 { y.saturating_sub(1) } else { y.saturating_add(1) };
            d -= 2 * dx;
        }
        d += 2 * dy;
    }
}

/// Per column of `cols`, the largest value of the points (`x` in [0, 1]
/// of the chart's width) that fall in it; a column without points holds
/// the one before. `whole_width`: from the first column to the last
/// (holding 0 before the first point and the last value after it), else
/// only from the first point's column to the last point's.
pub(crate) fn column_maxima(
    points: impl IntoIterator<Item = (f64, u64)>,
    cols: usize,
    whole_width: bool,
) -> Vec<(f64, f64)> {
    if cols == 0 {
        return Vec::new();
    }
    let mut v: Vec<Option<u64>> = vec![None; cols];
    let (mut first, mut last) = (cols, 0);
    for (x, y) in points {
        let c = ((x * cols as f64).max(0.0) as usize).min(cols - 1);
        v[c] = Some(v[c].map_or(y, |m| m.max(y)));
        (first, last) = (first.min(c), last.max(c));
    }
    let range = if whole_width { 0..cols } else { first..(last.max(first) + 1).min(cols) };
    let mut held = 0;
    range
        .map(|c| {
            if let Some(x) = v[c] {
                held = x;
            }
            (c as f64, held as f64)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A polyline paints every cell and colour a `canvas::Line` per
    /// segment does: steep, shallow, flat and vertical segments either
    /// way, and ends past the bounds (clipped).
    #[test]
    fn a_polyline_paints_as_its_segments_drawn_one_by_one() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for round in 0..40 {
            let n = 2 + next(60) as usize;
            let mut points: Vec<(f64, f64)> = Vec::new();
            for i in 0..n {
                // Mostly a column apart, some jumps back and some far
                // beyond the bounds (x 0..80, y 0..100).
                let px = if next(7) == 0 { next(120) as f64 - 20.0 } else { (i * 80 / n) as f64 };
                let py = if next(5) == 0 { next(300) as f64 - 100.0 } else { next(101) as f64 };
                points.push((px, py));
            }
            let paint = |one_shape: bool| {
                let mut buf = Buffer::empty(Rect::new(0, 0, 40, 12));
                Canvas::default()
                    .marker(Marker::Braille)
                    .x_bounds([0.0, 80.0])
                    .y_bounds([0.0, 100.0])
                    .paint(|ctx| {
                        if one_shape {
                            ctx.draw(&Polyline { points: &points, color: Color::Green });
                        } else {
                            for w in points.windows(2) {
                                ctx.draw(&CanvasLine::new(w[0].0, w[0].1, w[1].0, w[1].1, Color::Green));
                            }
                        }
                        ctx.draw(&CanvasLine::new(3.0, 0.0, 70.0, 100.0, Color::Red));
                    })
                    .render(buf.area, &mut buf);
                buf
            };
            assert_eq!(paint(true), paint(false), "round {round}: {points:?}");
        }
    }

    fn rows(chart: TimeChart, w: u16, h: u16) -> Vec<String> {
        let mut buf = Buffer::empty(Rect::new(0, 0, w, h));
        chart.render(buf.area, &mut buf);
        (0..h).map(|y| (0..w).map(|x| buf[(x, y)].symbol().to_string()).collect()).collect()
    }

    /// A solid series is a line through its points, a dotted one every
    /// third point, the limit dashed, the cursor a column, and the marks
    /// print over them all.
    #[test]
    fn a_time_chart_draws_its_series_limit_cursor_and_marks() {
        let floor = [(0.0, 0.0), (7.0, 0.0)];
        let top: Vec<(f64, f64)> = (0..8).map(|x| (x as f64, 4.0)).collect();
        let chart = TimeChart {
            cols: 8,
            ymax: 4.0,
            series: vec![
                Series { points: &floor, color: Color::Reset, stroke: Stroke::Solid },
                Series { points: &top, color: Color::Reset, stroke: Stroke::Dotted },
            ],
            limit: None,
            cursor: None,
            marks: vec![(4.0, 0.0, Span::raw("✗"))],
        };
        // Dots at points 0, 3 and 6 on the top row (the canvas maps
        // [0, 8] onto its 8 dot columns as 0..=7); the floor to point 7,
        // but where the mark is.
        assert_eq!(rows(chart, 4, 2), ["⠁⠈⠈ ", "⣀✗⣀⡀"]);
        let chart = TimeChart {
            cols: 8,
            ymax: 4.0,
            series: vec![],
            limit: Some(2.0),
            cursor: Some((1.0, Color::Reset)),
            marks: vec![],
        };
        // Dashes of three points every six: 0–3 and 6–8.
        assert_eq!(rows(chart, 4, 2), ["⢸   ", "⢹⠉⠈⠉"], "a column at the cursor, the limit dashed");
    }

    #[test]
    fn columns_keep_their_largest_and_hold_across_gaps() {
        let pts = [(0.0, 5), (0.05, 9), (0.55, 3), (0.99, 7)];
        assert_eq!(
            column_maxima(pts, 4, true),
            [(0.0, 9.0), (1.0, 9.0), (2.0, 3.0), (3.0, 7.0)],
            "the first column keeps 9 of its two points; the second, empty, holds it"
        );
        // From the first point's column to the last's only.
        assert_eq!(column_maxima([(0.3, 4), (0.6, 2)], 10, false), [(3.0, 4.0), (4.0, 4.0), (5.0, 4.0), (6.0, 2.0)]);
        // Before the first point the whole width holds 0.
        assert_eq!(column_maxima([(0.5, 4)], 4, true), [(0.0, 0.0), (1.0, 0.0), (2.0, 4.0), (3.0, 4.0)]);
        assert!(column_maxima([(0.5, 4)], 0, true).is_empty());
    }
}
