//! What the time charts share: a series binned into the braille columns
//! of a chart (the diff screen's two runs, the job screen's ranks).

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
    use super::column_maxima;

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
