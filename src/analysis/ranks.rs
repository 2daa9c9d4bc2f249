//! Several ranks of one job side by side: the median and the worst rank,
//! for `replay rank0 rank1 …` (docs/user/ranks.md). The live job screen's rows
//! are `monitor::job`'s; the rule (worst over median) is the same.

use serde::Serialize;

use super::{human_bytes, median};
use crate::alloc::SegmentInfo;

/// What the ranks are compared on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Measure {
    /// Their peaks allocated.
    PeakAllocated,
    /// What each snapshot holds allocated (snapshots without history have
    /// no peaks).
    AllocatedInSnapshot,
}

impl Measure {
    /// How a summary names it.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Measure::PeakAllocated => "peak allocated",
            Measure::AllocatedInSnapshot => "allocated (no history: no peaks)",
        }
    }
}

/// How the ranks compare: the median and the worst on their measure.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Imbalance {
    pub(crate) measure: Measure,
    pub(crate) worst_rank: u32,
    pub(crate) median_peak_bytes: u64,
    pub(crate) worst_peak_bytes: u64,
    /// How far the worst is over the median: 0.2 is 20%.
    pub(crate) over_median: f64,
}

impl Imbalance {
    /// Over (rank, bytes) pairs; none for no ranks.
    pub(crate) fn of(ranks: &[(u32, u64)], measure: Measure) -> Option<Imbalance> {
        let v: Vec<u64> = ranks.iter().map(|r| r.1).collect();
        let m = median(&v);
        // The highest, the lowest rank among equals.
        let &(worst_rank, worst) = ranks.iter().rev().max_by_key(|r| r.1)?;
        let over = if m > 0 { worst as f64 / m as f64 - 1.0 } else { 0.0 };
        Some(Imbalance { measure, worst_rank, median_peak_bytes: m, worst_peak_bytes: worst, over_median: over })
    }

    /// "median peak allocated X; worst rank r at Y (+Z%)".
    pub(crate) fn describe(&self) -> String {
        let what = self.measure.describe();
        format!(
            "median {what} {}; worst rank {} at {} ({:+.1}%)",
            human_bytes(self.median_peak_bytes),
            self.worst_rank,
            human_bytes(self.worst_peak_bytes),
            self.over_median * 100.0
        )
    }
}

/// One rank's snapshot, replayed alone.
#[derive(Debug, Clone)]
pub(crate) struct RankReplay {
    pub(crate) rank: u32,
    /// The file's name.
    pub(crate) name: String,
    /// The file (Enter opens it in the replay view).
    pub(crate) path: std::path::PathBuf,
    pub(crate) fidelity: &'static str,
    /// None for a snapshot without history (or a replay that diverged).
    pub(crate) peak_allocated: Option<u64>,
    pub(crate) peak_reserved: Option<u64>,
    /// At the trace's end (or in the snapshot).
    pub(crate) allocated: u64,
    pub(crate) ooms: usize,
    /// At the peak, else at the end.
    pub(crate) segments: Vec<SegmentInfo>,
}

impl RankReplay {
    /// The figure it is compared on (see `Imbalance::measure`).
    pub(crate) fn figure(&self) -> u64 {
        self.peak_allocated.unwrap_or(self.allocated)
    }

    /// Its figure on `measure`.
    pub(crate) fn figure_on(&self, measure: Measure) -> u64 {
        match measure {
            Measure::PeakAllocated => self.figure(),
            Measure::AllocatedInSnapshot => self.allocated,
        }
    }
}

/// The ranks, by rank, and how they compare.
#[derive(Debug, Clone)]
pub(crate) struct RanksModel {
    pub(crate) ranks: Vec<RankReplay>,
    pub(crate) imbalance: Option<Imbalance>,
}

impl RanksModel {
    pub(crate) fn new(mut ranks: Vec<RankReplay>) -> Self {
        ranks.sort_by_key(|r| r.rank);
        let measure = if ranks.iter().all(|r| r.peak_allocated.is_some()) {
            Measure::PeakAllocated
        } else {
            Measure::AllocatedInSnapshot
        };
        let pairs: Vec<(u32, u64)> = ranks.iter().map(|r| (r.rank, r.figure_on(measure))).collect();
        RanksModel { imbalance: Imbalance::of(&pairs, measure), ranks }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_rank_is_judged_against_the_median() {
        let i = Imbalance::of(&[(0, 100), (1, 300), (2, 200)], Measure::PeakAllocated).unwrap();
        assert_eq!((i.worst_rank, i.median_peak_bytes, i.worst_peak_bytes), (1, 200, 300));
        assert!((i.over_median - 0.5).abs() < 1e-12);
        // Equal peaks: the lowest rank.
        assert_eq!(Imbalance::of(&[(0, 5), (1, 5)], Measure::PeakAllocated).unwrap().worst_rank, 0);
        assert!(Imbalance::of(&[], Measure::PeakAllocated).is_none());
    }
}
