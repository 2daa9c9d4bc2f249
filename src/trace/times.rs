//! When each event happened, in 4 bytes an event: an offset in
//! microseconds from the first time of its run of `RUN` events (a run spans
//! milliseconds, not the 35 minutes an `i32` holds), kept as `Deltas` keep
//! changes, so that an offset that does not fit is kept whole beside. A
//! ten-million-event trace keeps 40 MB of them, not 80
//! (docs/measurements/benchmarks.md, "Ten million events").

use super::deltas::Deltas;

/// Events per base time.
const RUN: usize = 4096;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Times {
    /// Per run of `RUN` events, its first event's time.
    base: Vec<i64>,
    /// Each time less its run's base (wrapping: a hostile time still comes
    /// back exactly).
    off: Deltas,
}

impl Times {
    pub(crate) fn try_reserve(&mut self, n: usize) -> Result<(), std::collections::TryReserveError> {
        self.off.try_reserve(n)?;
        self.base.try_reserve(n / RUN + 1)
    }

    pub fn push(&mut self, t: i64) {
        let i = self.off.len();
        if i % RUN == 0 {
            self.base.push(t);
        }
        self.off.push(t.wrapping_sub(self.base[i / RUN]));
    }

    pub fn len(&self) -> usize {
        self.off.len()
    }

    pub fn is_empty(&self) -> bool {
        self.off.is_empty()
    }

    /// The time of event `i`.
    #[inline]
    pub fn get(&self, i: usize) -> Option<i64> {
        (i < self.len()).then(|| self.base[i / RUN].wrapping_add(self.off.get(i)))
    }

    pub fn first(&self) -> Option<i64> {
        self.get(0)
    }

    /// The first index whose time is not `pred` (times in order, as a
    /// trace records them), as `slice::partition_point`.
    pub fn partition_point(&self, pred: impl FnMut(i64) -> bool) -> usize {
        self.partition_point_from(0, pred)
    }

    /// `partition_point` where the first `from` times are known to hold
    /// `pred`: searched onwards from there, the step doubling, then within
    /// the last step. Points asked for in order (a trace's markers) read
    /// times near each other, rather than from the middle of 40 MB each
    /// time (20,000 markers of a 10M trace took 31 ms, most of it the
    /// cache and page misses of a column just decoded on another core).
    pub fn partition_point_from(&self, from: usize, mut pred: impl FnMut(i64) -> bool) -> usize {
        let n = self.len();
        let (mut lo, mut step) = (from.min(n), 1);
        // Every time before `lo` holds; `probe`, if in range, does not.
        let mut probe = lo;
        while probe < n && self.get(probe).is_some_and(&mut pred) {
            lo = probe + 1;
            probe = lo.saturating_add(step);
            step = step.saturating_mul(2);
        }
        let mut hi = probe.min(n);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.get(mid).is_some_and(&mut pred) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = i64> + ExactSizeIterator + '_ {
        (0..self.len()).map(|i| self.get(i).unwrap_or(0))
    }

    /// The times before `at` are dropped.
    pub fn drain_front(&mut self, at: usize) {
        let kept: Vec<i64> = self.iter().skip(at).collect();
        *self = kept.into_iter().collect();
    }
}

impl FromIterator<i64> for Times {
    fn from_iter<I: IntoIterator<Item = i64>>(it: I) -> Self {
        let mut out = Times::default();
        it.into_iter().for_each(|t| out.push(t));
        out
    }
}

impl From<Vec<i64>> for Times {
    fn from(v: Vec<i64>) -> Self {
        v.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_come_back_as_pushed() {
        let mut v: Vec<i64> = (0..10_000).map(|i| 1_700_000_000_000_000 + i * 37).collect();
        // A step back, a gap of an hour, and the extremes.
        v[5000] = v[4999] - 3;
        v[4096] = v[4095] + 3_600_000_000;
        v.extend([i64::MIN, i64::MAX, 0, -5]);
        let t: Times = v.iter().copied().collect();
        assert_eq!(t.len(), v.len());
        assert_eq!(t.iter().collect::<Vec<_>>(), v);
        assert_eq!(t.get(v.len()), None);
        let sorted: Times = (0..9000i64).map(|i| i * 2).collect();
        assert_eq!(sorted.partition_point(|x| x <= 101), 51);
        assert_eq!(sorted.partition_point(|x| x < 0), 0);
        assert_eq!(sorted.partition_point(|_| true), 9000);
        // Across runs, at their edges, and with times repeated, as a slice.
        let v: Vec<i64> = (0..3 * RUN as i64 + 77).map(|i| i / 3 * 5).collect();
        let t: Times = v.iter().copied().collect();
        for x in [-1, 0, 4, 5, 6, 6825, 6826, 6830, 6831, 20_478, 20_479, 20_480, 20_600, 99_999] {
            for (lt, want) in [(true, v.partition_point(|&y| y < x)), (false, v.partition_point(|&y| y <= x))] {
                let pred = |y: i64| if lt { y < x } else { y <= x };
                assert_eq!(t.partition_point(pred), want, "{x} {lt}");
                // From anywhere at or before the answer.
                for from in [0, 1.min(want), want / 3, want.saturating_sub(5), want.saturating_sub(1), want] {
                    assert_eq!(t.partition_point_from(from, pred), want, "{x} {lt} from {from}");
                }
            }
        }
        let mut d = t.clone();
        d.drain_front(4097);
        assert_eq!(d.iter().collect::<Vec<_>>(), v[4097..].to_vec());
    }
}
