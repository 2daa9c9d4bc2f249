//! Bounded history of live samples. A series keeps at most `cap` points;
//! when full, neighbouring pairs merge (keeping each one's maxima), so a
//! day at 1 Hz fits in 86,400 points (2.6 MiB) and longer runs coarsen
//! instead of growing.

use serde::Serialize;

use crate::alloc::StatePoint;

#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Sample {
    /// Seconds since the Unix epoch.
    pub(crate) t: f64,
    pub(crate) allocated: u64,
    pub(crate) reserved: u64,
    /// NVML's used bytes (device or process).
    pub(crate) used: u64,
}

/// Where a step key moves a cursor over a timeline's points (a replay's
/// events, a recording's samples).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    Previous,
    Next,
    /// Back or on by a page (a twentieth of the timeline).
    PageBack,
    PageOn,
    First,
    Last,
}

impl Step {
    /// Where the step goes from point `at` over points `0..=last`, a page
    /// being `page` points; the previous and next point are one away.
    pub(crate) fn from(self, at: usize, last: usize, page: usize) -> usize {
        match self {
            Step::Previous => at.saturating_sub(1),
            Step::Next => at.saturating_add(1).min(last),
            Step::PageBack => at.saturating_sub(page),
            Step::PageOn => at.saturating_add(page).min(last),
            Step::First => 0,
            Step::Last => last,
        }
    }
}

/// 24 hours at 1 Hz.
pub(crate) const DAY_AT_1HZ: usize = 86_400;

#[derive(Debug, Clone)]
pub struct Series {
    cap: usize,
    points: Vec<Sample>,
    peak: Option<Sample>,
    /// Times of OOMs (a publisher's `num_ooms` rising).
    pub(crate) ooms: Vec<f64>,
    /// Times of the points that end an optimizer step (their values are
    /// the step's peaks, or its end); at most `cap`, the oldest dropped.
    steps: Vec<f64>,
    last_ooms: Option<i64>,
}

impl Series {
    pub fn new(cap: usize) -> Self {
        Series { cap: cap.max(4), points: Vec::new(), peak: None, ooms: Vec::new(), last_ooms: None, steps: Vec::new() }
    }

    pub(crate) fn push(&mut self, s: Sample) {
        if self.peak.is_none_or(|p| s.allocated > p.allocated) {
            self.peak = Some(s);
        }
        if self.points.len() >= self.cap {
            let merged: Vec<Sample> = self
                .points
                .chunks(2)
                .map(|c| Sample {
                    t: c[0].t,
                    allocated: c.iter().map(|x| x.allocated).max().unwrap_or(0),
                    reserved: c.iter().map(|x| x.reserved).max().unwrap_or(0),
                    used: c.iter().map(|x| x.used).max().unwrap_or(0),
                })
                .collect();
            self.points = merged;
        }
        // Grow by hand so the capacity never passes `cap` (doubling would
        // take up to twice the bound).
        if self.points.len() == self.points.capacity() {
            let extra = self.points.len().max(64).min(self.cap - self.points.len()).max(1);
            self.points.reserve_exact(extra);
        }
        self.points.push(s);
    }

    /// Notes the publisher's `num_ooms` at time `t`; a rise is an OOM.
    pub(crate) fn note_ooms(&mut self, t: f64, num_ooms: i64) {
        if self.last_ooms.is_some_and(|l| num_ooms > l) {
            self.ooms.push(t);
        }
        self.last_ooms = Some(num_ooms);
    }

    pub fn points(&self) -> &[Sample] {
        &self.points
    }
    /// The time of the latest point.
    pub(crate) fn last_time(&self) -> Option<f64> {
        self.points.last().map(|p| p.t)
    }
    /// The points' times, for a time axis.
    pub(crate) fn times(&self) -> Vec<f64> {
        self.points.iter().map(|p| p.t).collect()
    }
    /// Pushes a point that ends an optimizer step.
    pub(crate) fn push_step(&mut self, s: Sample) {
        if self.steps.len() >= self.cap {
            self.steps.drain(..self.cap / 2);
        }
        self.steps.push(s.t);
        self.push(s);
    }
    /// Indices of the points that end a step (after merging, the point
    /// that holds it).
    pub(crate) fn step_indices(&self) -> Vec<usize> {
        let first = self.points.first().map_or(f64::MAX, |p| p.t);
        let mut v: Vec<usize> = self.steps.iter().filter(|&&t| t >= first).map(|&t| self.index_at(t)).collect();
        v.dedup();
        v
    }
    /// The highest allocated sample ever seen (also before merging).
    pub(crate) fn peak(&self) -> Option<Sample> {
        self.peak
    }
    pub(crate) fn state_points(&self) -> Vec<StatePoint> {
        self.points.iter().map(|p| StatePoint { allocated: p.allocated, reserved: p.reserved }).collect()
    }
    /// Index of the last point at or before time `t` (the first point when none is).
    pub(crate) fn index_upto(&self, t: f64) -> usize {
        self.points.partition_point(|p| p.t <= t).saturating_sub(1)
    }
    /// Index of the point at or after time `t`.
    pub(crate) fn index_at(&self, t: f64) -> usize {
        self.points.partition_point(|p| p.t < t).min(self.points.len().saturating_sub(1))
    }
}

#[cfg(test)]
impl Series {
    /// Bytes the points take.
    fn memory_bytes(&self) -> usize {
        self.points.capacity() * std::mem::size_of::<Sample>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_series_merges_pairs_keeping_maxima_and_the_peak() {
        let mut s = Series::new(8);
        for i in 0..8u64 {
            s.push(Sample { t: i as f64, allocated: if i == 3 { 100 } else { i }, reserved: 10 * i, used: 0 });
        }
        assert_eq!(s.points().len(), 8);
        s.push(Sample { t: 8.0, allocated: 1, reserved: 1, used: 0 });
        let a: Vec<u64> = s.points().iter().map(|p| p.allocated).collect();
        assert_eq!(a, vec![1, 100, 5, 7, 1]);
        assert_eq!(s.points()[1].t, 2.0);
        assert_eq!(s.peak().unwrap().allocated, 100);
        assert_eq!(s.index_at(4.5), 3);
    }

    #[test]
    fn a_day_at_1hz_stays_within_its_bound() {
        let mut s = Series::new(DAY_AT_1HZ);
        for i in 0..3 * DAY_AT_1HZ {
            s.push(Sample { t: i as f64, allocated: i as u64, reserved: 0, used: 0 });
        }
        assert!(s.points().len() <= DAY_AT_1HZ);
        assert!(s.memory_bytes() <= DAY_AT_1HZ * std::mem::size_of::<Sample>());
        assert!(s.memory_bytes() <= 2_800_000, "{}", s.memory_bytes());
        assert_eq!(s.points().last().unwrap().allocated, 3 * DAY_AT_1HZ as u64 - 1);
    }

    #[test]
    fn rising_num_ooms_marks_an_oom() {
        let mut s = Series::new(8);
        s.note_ooms(1.0, 2);
        s.note_ooms(2.0, 2);
        s.note_ooms(3.0, 3);
        assert_eq!(s.ooms, vec![3.0]);
    }
}
