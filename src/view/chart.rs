//! The one time chart: series binned into the braille columns of a plot
//! (`column_maxima`) and drawn by `TimeChart`, for the replay timeline,
//! the diff screen's two runs and the job screen's ranks.

use ratatui_core::buffer::Buffer;
use ratatui_core::layout::Rect;
use ratatui_core::style::Color;
use ratatui_core::symbols::Marker;
use ratatui_core::text::Span;
use ratatui_core::widgets::Widget;
use ratatui_widgets::canvas::{Canvas, Line as CanvasLine, Points};

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
                        Stroke::Solid => {
                            for w in s.points.windows(2) {
                                ctx.draw(&CanvasLine::new(w[0].0, w[0].1, w[1].0, w[1].1, s.color));
                            }
                        }
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
