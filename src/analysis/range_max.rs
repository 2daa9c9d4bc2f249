//! Maxima over any range of a timeline without reading every point: per
//! block of `BLOCK` points, the most allocated (its first point) and the
//! most reserved. A frame of a ten-million-event replay bins its timeline
//! into a few hundred columns and asks each iteration's peak: read point by
//! point that is the whole trace per frame (docs/measurements/benchmarks.md,
//! "Ten million events").

use crate::alloc::StatePoint;

/// Points a block summarises: a query reads at most two partial blocks.
const BLOCK: usize = 256;

#[derive(Debug, Clone, Copy)]
struct Block {
    allocated: u64,
    /// The block's first point with `allocated`.
    at: usize,
    reserved: u64,
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
    blocks: Vec<Block>,
    /// Per iteration `marks` delimit: (its first point, its peak).
    iterations: Vec<(usize, Peak)>,
    /// The whole timeline's (every frame scales to it).
    whole: Option<Peak>,
}

impl RangeMax {
    /// The index of `points`, whose iterations end at `marks`.
    pub(crate) fn of(points: &[StatePoint], marks: &[usize]) -> RangeMax {
        let mut index = RangeMax { blocks: Self::blocks(points), iterations: Vec::new(), whole: None };
        index.whole = index.query(points, 0, points.len());
        let mut bounds = vec![0];
        bounds.extend(marks.iter().copied().filter(|&m| m > 0 && m < points.len()));
        bounds.push(points.len());
        index.iterations = bounds.windows(2).filter_map(|w| Some((w[0], index.query(points, w[0], w[1])?))).collect();
        index
    }

    /// The peak of the iteration that starts at point `start`, if one does.
    pub(crate) fn iteration_from(&self, start: usize) -> Option<Peak> {
        let i = self.iterations.binary_search_by_key(&start, |x| x.0).ok()?;
        Some(self.iterations[i].1)
    }

    fn blocks(points: &[StatePoint]) -> Vec<Block> {
        points
            .chunks(BLOCK)
            .enumerate()
            .filter_map(|(b, c)| {
                let p = scan(c, 0)?;
                Some(Block { allocated: p.allocated, at: b * BLOCK + p.at, reserved: p.reserved })
            })
            .collect()
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
        let first_full = lo.div_ceil(BLOCK);
        let last_full = hi / BLOCK;
        if first_full >= last_full || self.blocks.len() < last_full {
            return scan(&points[lo..hi], lo);
        }
        let head = scan(&points[lo..first_full * BLOCK], lo);
        let body = self.blocks[first_full..last_full]
            .iter()
            .map(|b| Peak { at: b.at, allocated: b.allocated, reserved: b.reserved })
            .reduce(merge);
        let tail = scan(&points[last_full * BLOCK..hi], last_full * BLOCK);
        [head, body, tail].into_iter().flatten().reduce(merge)
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
        let points: Vec<StatePoint> = (0..2_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Few distinct values: many ties for the first-point rule.
                StatePoint { allocated: x % 50, reserved: (x >> 20) % 1000 }
            })
            .collect();
        let index = RangeMax::of(&points, &[700, 1500]);
        for (lo, hi) in [(0, 2000), (0, 1), (3, 700), (256, 512), (255, 513), (1000, 1999), (700, 700), (1990, 5000)] {
            assert_eq!(index.query(&points, lo, hi), scan(&points[lo.min(2000)..hi.min(2000)], lo), "{lo}..{hi}");
        }
        let whole = index.query(&points, 0, 2000).unwrap();
        assert_eq!(whole.allocated, 49);
        assert_eq!(whole.at, points.iter().position(|p| p.allocated == 49).unwrap());
        assert_eq!(index.iteration_from(700), scan(&points[700..1500], 700));
        assert_eq!(index.iteration_from(1500), scan(&points[1500..], 1500));
        assert_eq!(index.iteration_from(701), None);
    }
}
