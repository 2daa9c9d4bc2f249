//! A per-event change of a byte count in 4 bytes: almost every change fits
//! an `i32`, and the few that do not (a single block of 2 GiB or more) are
//! kept beside. A ten-million-event replay keeps one per event
//! (docs/measurements/benchmarks.md, "Ten million events").

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Deltas {
    small: Vec<i32>,
    /// (index, change) of the changes past `i32`, ascending; `small` has
    /// `WIDE` there.
    wide: Vec<(usize, i64)>,
}

const WIDE: i32 = i32::MIN;

impl Deltas {
    pub(crate) fn with_capacity(n: usize) -> Self {
        Deltas { small: Vec::with_capacity(n), wide: Vec::new() }
    }

    /// Reserves room for `n` more, if the memory is there.
    pub(crate) fn try_reserve(&mut self, n: usize) -> Result<(), std::collections::TryReserveError> {
        self.small.try_reserve(n)
    }

    pub(crate) fn push(&mut self, d: i64) {
        match i32::try_from(d) {
            Ok(v) if v != WIDE => self.small.push(v),
            _ => {
                self.wide.push((self.small.len(), d));
                self.small.push(WIDE);
            }
        }
    }

    /// The change at `i` (0 past the end).
    pub(crate) fn get(&self, i: usize) -> i64 {
        match self.small.get(i) {
            None => 0,
            Some(&WIDE) => self.wide.binary_search_by_key(&i, |w| w.0).map_or(0, |k| self.wide[k].1),
            Some(&v) => i64::from(v),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.small.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.small.is_empty()
    }

    /// The changes at `r` (those past the end left out): a walk over a
    /// stretch reads the small ones in order rather than asking each.
    pub(crate) fn range(&self, r: std::ops::Range<usize>) -> impl Iterator<Item = i64> + '_ {
        let r = r.start.min(self.small.len())..r.end.min(self.small.len());
        let mut wide = self.wide[self.wide.partition_point(|w| w.0 < r.start)..].iter();
        self.small[r].iter().map(move |&v| if v == WIDE { wide.next().map_or(0, |w| w.1) } else { i64::from(v) })
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = i64> + '_ {
        self.range(0..self.small.len())
    }
}

impl FromIterator<i64> for Deltas {
    fn from_iter<I: IntoIterator<Item = i64>>(it: I) -> Self {
        let it = it.into_iter();
        let mut out = Deltas::with_capacity(it.size_hint().0);
        it.for_each(|d| out.push(d));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_of_any_size_come_back_as_pushed() {
        let vals =
            [0, 1, -1, 512, i64::from(i32::MAX), i64::from(i32::MIN), 3 << 31, -(5 << 33), i64::MAX, i64::MIN, 7];
        let mut d = Deltas::with_capacity(2);
        for &v in &vals {
            d.push(v);
        }
        assert_eq!(d.len(), vals.len());
        assert_eq!(d.iter().collect::<Vec<_>>(), vals);
        for (i, &v) in vals.iter().enumerate() {
            assert_eq!(d.get(i), v, "{i}");
        }
        assert_eq!(d.get(vals.len()), 0);
        for lo in 0..vals.len() {
            for hi in lo..vals.len() + 2 {
                let want: Vec<i64> = (lo..hi.min(vals.len())).map(|i| d.get(i)).collect();
                assert_eq!(d.range(lo..hi).collect::<Vec<_>>(), want, "{lo}..{hi}");
            }
        }
        // Four bytes each, and the wide ones beside.
        assert_eq!(d.wide.len(), 5);
    }
}
