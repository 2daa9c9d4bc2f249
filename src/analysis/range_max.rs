//! Maxima over any range of a timeline without reading every point: the
//! most allocated (its first point) and the most reserved of each block of
//! 32 points, of each 256 and of each 4,096. A frame of a ten-million-event
//! replay bins its timeline into a few hundred columns and asks each
//! column's and iteration's peak: read point by point that is the whole
//! trace per frame, and read by blocks of 256 alone, the partial blocks at
//! each column's ends were most of a frame's reading
//! (docs/measurements/benchmarks.md, "Ten million events").

use crate::alloc::StatePoint;

/// Points an item of each level summarises, each a multiple of the one
/// before: a query reads at most 31 points at either end, then at most
/// 7 and 15 items of the first two levels at either end, and the whole
/// items of the last level between.
const LEVELS: [usize; 3] = [32, 256, 4096];

/// The largest block whose items answer a range aligned to it, at most an
/// eighth of `span` points; 1 for a span under 256. A frame's columns of
/// `span` points each, their ends moved to multiples of it, read no
/// partial block below it: at ten million events the points themselves
/// and the first level were half of a column's reads
/// (docs/measurements/benchmarks.md, "Columns on the blocks' boundaries").
pub(crate) fn grain(span: usize) -> usize {
    LEVELS.iter().rev().copied().find(|&b| b * 8 <= span).unwrap_or(1)
}

/// The most allocated (first such point) and the most reserved of a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Peak {
    pub(crate) at: usize,
    pub(crate) allocated: u64,
    pub(crate) reserved: u64,
}

/// The block maxima of one timeline (24 bytes per 256 points), and each
/// iteration's peak (they do not change as the cursor moves).
#[derive(Debug, Default)]
pub(crate) struct RangeMax {
    /// Per level (`LEVELS`), each item's peak: 1.2 bytes a point in all.
    levels: Vec<Vec<Peak>>,
    /// Per iteration `marks` delimit: (its first point, the point after
    /// its last, its peak).
    iterations: Vec<(usize, usize, Peak)>,
    /// `iterations`' indices, highest peak first (equal peaks earliest
    /// first): the order the timeline labels them in, sorted once rather
    /// than in every frame of a run of thousands of iterations.
    by_height: Vec<usize>,
    /// The whole timeline's (every frame scales to it).
    whole: Option<Peak>,
}

impl RangeMax {
    /// The index of `points`, whose iterations end at `marks`.
    pub(crate) fn of(points: &[StatePoint], marks: &[usize]) -> RangeMax {
        let mut levels =
            vec![points.chunks(LEVELS[0]).enumerate().filter_map(|(b, c)| scan(c, b * LEVELS[0])).collect()];
        for w in LEVELS.windows(2) {
            let below: &Vec<Peak> = &levels[levels.len() - 1];
            let above = below.chunks(w[1] / w[0]).filter_map(|c| c.iter().copied().reduce(merge)).collect();
            levels.push(above);
        }
        let mut index = RangeMax { levels, ..RangeMax::default() };
        index.whole = index.query(points, 0, points.len());
        let mut bounds = vec![0];
        bounds.extend(marks.iter().copied().filter(|&m| m > 0 && m < points.len()));
        bounds.push(points.len());
        index.iterations =
            bounds.windows(2).filter_map(|w| Some((w[0], w[1], index.query(points, w[0], w[1])?))).collect();
        let peak = |i: usize| index.iterations[i].2;
        index.by_height = (0..index.iterations.len()).collect();
        index.by_height.sort_unstable_by(|&a, &b| peak(b).allocated.cmp(&peak(a).allocated).then(a.cmp(&b)));
        index
    }

    /// The peak of the iteration that starts at point `start`, if one does.
    pub(crate) fn iteration_from(&self, start: usize) -> Option<Peak> {
        let i = self.iterations.binary_search_by_key(&start, |x| x.0).ok()?;
        Some(self.iterations[i].2)
    }

    /// The peaks of the iterations whole within points `lo..hi`, highest
    /// first, equal ones earliest first.
    pub(crate) fn iterations_by_height(&self, lo: usize, hi: usize) -> impl Iterator<Item = Peak> + '_ {
        let first = self.iterations.partition_point(|it| it.0 < lo);
        let end = self.iterations.partition_point(|it| it.1 <= hi);
        self.by_height.iter().filter(move |&&i| i >= first && i < end).map(|&i| self.iterations[i].2)
    }

    /// The peak of `points[lo..hi]` (`points` the timeline this was made
    /// of); None for an empty range.
    pub(crate) fn query(&self, points: &[StatePoint], lo: usize, hi: usize) -> Option<Peak> {
        let hi = hi.min(points.len());
        if lo >= hi {
            return None;
        }
        if (lo, hi) == (0, points.len()) && self.whole.is_some() {
            return self.whole;
        }
        let b = LEVELS[0];
        let first_full = lo.div_ceil(b);
        let last_full = hi / b;
        if first_full >= last_full || self.levels.first().is_none_or(|l| l.len() < last_full) {
            return scan(&points[lo..hi], lo);
        }
        let head = scan(&points[lo..first_full * b], lo);
        let body = self.over(0, first_full, last_full);
        let tail = scan(&points[last_full * b..hi], last_full * b);
        [head, body, tail].into_iter().flatten().reduce(merge)
    }

    /// The peak of items `i0..i1` of level `k`, each whole: the whole
    /// items of the level above among them read as one each.
    fn over(&self, k: usize, i0: usize, i1: usize) -> Option<Peak> {
        let items = &self.levels[k];
        if let Some(above) = self.levels.get(k + 1) {
            let r = LEVELS[k + 1] / LEVELS[k];
            let (first, last) = (i0.div_ceil(r), i1 / r);
            if first < last && above.len() >= last {
                let head = items[i0..first * r].iter().copied().reduce(merge);
                let body = self.over(k + 1, first, last);
                let tail = items[last * r..i1].iter().copied().reduce(merge);
                return [head, body, tail].into_iter().flatten().reduce(merge);
            }
        }
        items[i0..i1].iter().copied().reduce(merge)
    }
}

/// `a` then `b` (later points): the first most-allocated point wins.
fn merge(a: Peak, b: Peak) -> Peak {
    let first = if b.allocated > a.allocated { b } else { a };
    Peak { reserved: a.reserved.max(b.reserved), ..first }
}

/// The peak of `points`, the first at index `offset`, read point by point.
pub(crate) fn scan(points: &[StatePoint], offset: usize) -> Option<Peak> {
    points
        .iter()
        .enumerate()
        .map(|(i, p)| Peak { at: offset + i, allocated: p.allocated, reserved: p.reserved })
        .reduce(merge)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every range of a pseudo-random timeline (partial blocks, whole ones,
    /// ties) answers as reading it point by point does.
    #[test]
    fn block_maxima_answer_every_range_as_a_scan() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let points: Vec<StatePoint> = (0..20_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Few distinct values: many ties for the first-point rule.
                StatePoint { allocated: x % 50, reserved: (x >> 20) % 1000 }
            })
            .collect();
        let index = RangeMax::of(&points, &[700, 1500]);
        let mut ranges =
            vec![(0, 2000), (0, 1), (3, 700), (256, 512), (255, 513), (1000, 1999), (700, 700), (1990, 5000)];
        // Across super-blocks (4,096 points): whole ones, partial ones at
        // either end, and past the end.
        ranges.extend([(0, 20_000), (4096, 8192), (4095, 12_289), (300, 4000), (5000, 19_999), (8000, 30_000)]);
        ranges.extend((0..20_000).step_by(997).flat_map(|lo| (lo..20_500).step_by(1231).map(move |hi| (lo, hi))));
        for (lo, hi) in ranges {
            assert_eq!(index.query(&points, lo, hi), scan(&points[lo.min(20_000)..hi.min(20_000)], lo), "{lo}..{hi}");
        }
        let whole = index.query(&points, 0, 20_000).unwrap();
        assert_eq!(whole.allocated, 49);
        assert_eq!(whole.at, points.iter().position(|p| p.allocated == 49).unwrap());
        assert_eq!(index.iteration_from(700), scan(&points[700..1500], 700));
        assert_eq!(index.iteration_from(1500), scan(&points[1500..], 1500));
        assert_eq!(index.iteration_from(701), None);
        // Highest first, whole iterations only: 0..700 ends inside 0..1000.
        let by_height = |lo, hi| index.iterations_by_height(lo, hi).map(|p| p.at).collect::<Vec<_>>();
        let mut all = [(0, 700), (700, 1500), (1500, 20_000)].map(|(lo, hi)| scan(&points[lo..hi], lo).unwrap());
        all.sort_by_key(|p| (std::cmp::Reverse(p.allocated), p.at));
        assert_eq!(by_height(0, 20_000), all.map(|p| p.at).to_vec());
        assert_eq!(by_height(0, 1000), vec![all.iter().find(|p| p.at < 700).unwrap().at]);
        assert_eq!(by_height(600, 1600), vec![all.iter().find(|p| (700..1500).contains(&p.at)).unwrap().at]);
        assert!(by_height(701, 1499).is_empty());
    }

    /// Equal iteration peaks come earliest first: a long run's identical
    /// iterations are labelled from the left.
    #[test]
    fn equal_iteration_peaks_come_earliest_first() {
        let points: Vec<StatePoint> =
            [1, 5, 2, 5, 3, 7, 1, 5].iter().map(|&a| StatePoint { allocated: a, reserved: 9 }).collect();
        let index = RangeMax::of(&points, &[2, 4, 6]);
        let got: Vec<(usize, u64)> = index.iterations_by_height(0, 8).map(|p| (p.at, p.allocated)).collect();
        assert_eq!(got, vec![(5, 7), (1, 5), (3, 5), (7, 5)]);
    }
}
