//! What a screen is drawn from besides the allocator's state: the totals for
//! the bars, the timeline's marks, the header's texts and what the keys
//! selected. The apps (`ui`) and the text export build these; drawing only
//! reads them.

pub(crate) use crate::replay::model::{Meaning, OomNote};

use crate::alloc::{Kind, SegmentInfo, StatePoint};
use crate::analysis::{Fragmentation, SizeBucket};
use crate::trace::Frame;

/// What the keys shared by every screen select. Drawing reads a clamped
/// copy; only actions change it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Selection {
    /// The highlighted segment (index in `order`).
    pub(crate) selected: usize,
    /// The highlighted block while zoomed.
    pub(crate) block: usize,
    pub(crate) zoom: bool,
    pub(crate) compact: bool,
    pub(crate) order: SegmentOrder,
    /// First segment row shown.
    pub(crate) scroll: usize,
    pub(crate) focus: Focus,
    pub(crate) help: bool,
    /// The help's first line shown (it scrolls when taller than the screen;
    /// drawing clamps it).
    pub(crate) help_scroll: usize,
    /// The histogram sums bytes instead of counting blocks.
    pub(crate) hist_bytes: bool,
    /// The map's rows the other way than their default (to one scale, or
    /// each stretched to the width; `rows_to_scale` picks the default).
    pub(crate) flip_scale: bool,
    /// One panel only (a text export of one view); None: the whole screen.
    pub(crate) panel: Option<Panel>,
    /// What the map's and the timeline's colours say.
    pub(crate) color_by: ColorBy,
    /// The timeline zoomed in this many halvings around the cursor (`+`/`-`
    /// in a replay; 0: the whole run).
    pub(crate) timeline_zoom: u8,
}

/// What a drawing's colours say (`--by`, the key `w`): one choice carried
/// from the command line to every layer that colours blocks, the
/// terminal's and the pictures'.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ColorBy {
    /// Allocated, rounding, pending free, free.
    #[default]
    State,
    /// Parameter, gradient, optimizer state, activation, input, temporary.
    Category,
}

impl ColorBy {
    /// The other colouring (the key `w`).
    pub(crate) fn toggled(self) -> ColorBy {
        match self {
            ColorBy::State => ColorBy::Category,
            ColorBy::Category => ColorBy::State,
        }
    }

    /// What each block is, where the drawing colours by it; none where it
    /// colours by block state.
    pub(crate) fn meaning<'m>(self, m: Option<Meaning<'m>>) -> Option<Meaning<'m>> {
        match self {
            ColorBy::State => None,
            ColorBy::Category => m,
        }
    }
}

impl Selection {
    /// Within `segs`: the selected segment and block exist.
    pub(crate) fn clamped(mut self, segs: &[SegmentInfo]) -> Selection {
        self.scroll = self.scroll.min(segs.len().saturating_sub(1));
        self.selected = self.selected.min(segs.len().saturating_sub(1));
        let in_order = ordered_indices(segs, self.order);
        let blocks = in_order.get(self.selected).map_or(0, |&i| segs[i].blocks.len());
        self.block = self.block.min(blocks.saturating_sub(1));
        self
    }

    /// Moves the selected segment by `d`, keeping it within the shown rows
    /// (the map shows at least ten).
    pub(crate) fn select(&mut self, d: isize) {
        self.selected = self.selected.saturating_add_signed(d);
        if self.selected < self.scroll {
            self.scroll = self.selected;
        } else if self.selected >= self.scroll + 10 {
            self.scroll = self.selected - 9;
        }
    }
}

/// The bar figures of one allocator.
#[derive(Debug, Clone, Copy, Default)]
pub struct Totals {
    pub(crate) allocated: u64,
    pub(crate) allocated_peak: u64,
    pub(crate) reserved: u64,
    pub(crate) reserved_peak: u64,
    /// The device's (used, total), where known, and who says so ("NVML",
    /// or "simulated" for the demo's device).
    pub(crate) device_memory: Option<(u64, u64, &'static str)>,
    /// Without NVML: what the bars are scaled to, and what it is.
    pub(crate) capacity: Option<(u64, ScaleBy)>,
    /// Live: what the optimizer held at a step's end (parameters,
    /// gradients, optimizer state, the rest as `Unknown`) and that step.
    pub(crate) step_categories: Option<(crate::analysis::categories::CategoryBytes, u64)>,
}

impl Totals {
    /// The figures of our allocator's `memory_stats()`.
    pub(crate) fn of(stats: &crate::alloc::DeviceStats) -> Self {
        Totals {
            allocated: stats.get(Kind::AllocatedBytes, 0).current as u64,
            allocated_peak: stats.get(Kind::AllocatedBytes, 0).peak as u64,
            reserved: stats.get(Kind::ReservedBytes, 0).current as u64,
            reserved_peak: stats.get(Kind::ReservedBytes, 0).peak as u64,
            device_memory: None,
            capacity: None,
            step_categories: None,
        }
    }
}

impl Totals {
    /// What a PyTorch process published (`memory_stats()`), with the
    /// categories its optimizer held at a step's end.
    pub(crate) fn of_published(p: &crate::monitor::Published) -> Self {
        Totals {
            allocated: p.allocated(),
            allocated_peak: p.peak_allocated(),
            reserved: p.reserved(),
            reserved_peak: p.peak_reserved(),
            device_memory: None,
            capacity: None,
            step_categories: p.categories.map(|c| (c.bytes(), c.step)),
        }
    }
}

/// The timeline and its marks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Marks<'m> {
    pub(crate) timeline: &'m [StatePoint],
    pub(crate) cursor: usize,
    pub(crate) peak_at: Option<usize>,
    pub(crate) ooms: &'m [usize],
    pub(crate) empty_caches: &'m [usize],
    pub(crate) iterations: &'m [usize],
    /// A live timeline: its x axis is time, not events.
    pub(crate) clock: Option<Clock<'m>>,
    /// The event the first point is (0 unless older points were dropped).
    pub(crate) first_event: usize,
    /// What a point is: an allocator `event` (a replay), or a workload's
    /// `request` (a running synth, a point per malloc or free it made).
    pub(crate) unit: &'static str,
    /// What each block is, where the screen knows (a replay, or the
    /// synthetic model's own).
    pub(crate) meaning: Option<Meaning<'m>>,
    /// The timeline's block maxima (a replay's), so that a frame need not
    /// read every point.
    pub(crate) maxima: Option<Maxima<'m>>,
}

/// A timeline's block maxima and the points they were built over, of which
/// the marks' timeline starts at `offset` (a zoomed window).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Maxima<'m> {
    pub(crate) index: &'m crate::analysis::range_max::RangeMax,
    pub(crate) all: &'m [StatePoint],
    pub(crate) offset: usize,
}

/// The x axis of a live timeline: each point's time (seconds since the
/// epoch), and whether its step points carry the steps' own peaks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock<'m> {
    pub(crate) times: &'m [f64],
    pub(crate) step_peaks: bool,
    /// A recording: the footer reads the cursor, not the latest sample.
    pub(crate) recorded: bool,
}

impl<'m> Marks<'m> {
    /// The marks of a replay at `cursor`.
    pub(crate) fn of(at: &crate::replay::model::ReplayMarks<'m>, cursor: usize, peak_at: Option<usize>) -> Self {
        Marks {
            timeline: at.points,
            cursor,
            peak_at,
            ooms: at.ooms,
            empty_caches: at.empty_caches,
            iterations: at.iterations,
            clock: None,
            first_event: 0,
            unit: "event",
            meaning: at.meaning,
            maxima: at.maxima.map(|index| Maxima { index, all: at.points, offset: 0 }),
        }
    }

    /// Each iteration's peak in the timeline (a zoomed window's edges cut
    /// theirs to the window), as (point, allocated bytes), highest first
    /// and equal ones earliest first: the order labels are given in.
    pub(crate) fn iteration_peaks_by_height(&self) -> Vec<(usize, u64)> {
        let n = self.timeline.len();
        let Some(m) = self.maxima.filter(|m| m.offset + n <= m.all.len()) else {
            let mut peaks = crate::analysis::iteration_peaks_by(n, self.iterations, |lo, hi| {
                self.peak(lo, hi).map(|p| (p.at, p.allocated))
            });
            peaks.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            return peaks;
        };
        // Iterations whole in the window come in order from the index; at
        // most the two the window's edges cut are asked of the maxima.
        let (lo, hi) = (m.offset, m.offset + n);
        let mut peaks: Vec<(usize, u64)> =
            m.index.iterations_by_height(lo, hi).map(|p| (p.at - lo, p.allocated)).collect();
        let starts = |p: usize| p == 0 || p == m.all.len() || m.index.iteration_from(p).is_some();
        let mut inner = self.iterations.iter().copied().filter(|&i| i > 0 && i < n);
        let first = inner.next().unwrap_or(n);
        let last = inner.next_back().unwrap_or(first);
        let mut cut = Vec::new();
        if first == n {
            if !starts(lo) || !starts(hi) {
                cut.push((0, n));
            }
        } else {
            if !starts(lo) {
                cut.push((0, first));
            }
            if !starts(hi) {
                cut.push((last, n));
            }
        }
        for p in cut.into_iter().filter_map(|(a, b)| self.peak(a, b)) {
            let at = peaks.partition_point(|&(i, v)| v > p.allocated || (v == p.allocated && i < p.at));
            peaks.insert(at, (p.at, p.allocated));
        }
        peaks
    }

    /// The peak of `timeline[lo..hi]`: from the block maxima where there
    /// are, else read point by point.
    pub(crate) fn peak(&self, lo: usize, hi: usize) -> Option<crate::analysis::range_max::Peak> {
        use crate::analysis::range_max::{scan, Peak};
        match self.maxima {
            Some(m) => m.index.query(m.all, lo + m.offset, hi + m.offset).map(|p| Peak { at: p.at - m.offset, ..p }),
            None => scan(self.timeline.get(lo..hi.min(self.timeline.len()))?, lo),
        }
    }
}

/// The header, banner and status line of a screen.
#[derive(Debug, Clone)]
pub(crate) struct Chrome<'s> {
    pub(crate) stacks: &'s [Vec<Frame>],
    pub(crate) device: String,
    pub(crate) source: String,
    pub(crate) position: String,
    pub(crate) banner: Option<String>,
    pub(crate) color: bool,
    pub(crate) status: String,
    /// The mode whose keys the status line hints and the help lists; none
    /// in exports.
    pub(crate) mode: Option<crate::keys::Mode>,
    /// The request that ran out of memory, when the event shown is an OOM.
    pub(crate) oom: Option<OomNote<'s>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum SegmentOrder {
    #[default]
    Address,
    Size,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Focus {
    #[default]
    Map,
    Timeline,
}

/// One panel of the screen, as `export --format txt --view` writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Panel {
    /// The header with the allocated / reserved / device bars.
    Bars,
    /// The fragmentation map with the block-size histogram.
    Map,
    Timeline,
}

/// Indices into `segments` in `order` (size order: largest first, then by
/// address).
pub(crate) fn ordered_indices(segments: &[SegmentInfo], order: SegmentOrder) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..segments.len()).collect();
    if order == SegmentOrder::Size {
        idx.sort_by(|&a, &b| {
            let (a, b) = (&segments[a], &segments[b]);
            b.total_size.cmp(&a.total_size).then(a.address.cmp(&b.address))
        });
    }
    idx
}

/// What a screen's bars are scaled to where no device bar says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScaleBy {
    /// The per-process memory limit the run had.
    Limit,
    /// A state-only snapshot's reserved.
    Snapshot,
    /// A trace's peak reserved (the device it ran on is not in the trace).
    Peak,
    /// The device a running workload is on.
    Device,
}

/// Everything one frame shows: the parts a screen is drawn from, as the
/// apps and exports built them (nothing is copied out of them).
#[derive(Debug, Clone)]
pub(crate) struct View<'a> {
    /// The header, banner, status line and call stacks.
    pub(crate) chrome: Chrome<'a>,
    /// The bars' figures.
    pub(crate) totals: Totals,
    /// False for a snapshot without a trace: its peaks are not in the file.
    pub(crate) peaks_known: bool,
    pub(crate) segments: &'a [SegmentInfo],
    pub(crate) fragmentation: Fragmentation,
    pub(crate) histogram: Vec<SizeBucket>,
    /// The timeline (allocated and reserved over events or samples) and
    /// its marks.
    pub(crate) marks: Marks<'a>,
    /// What the keys selected (clamped to `segments`).
    pub(crate) sel: Selection,
}

/// Whether a frame whose timeline holds `points` is drawn on several
/// threads (its timeline beside the other panes, the map's rows and the
/// stacked categories apart): the timeline is long, and the frame is drawn
/// on a thread with helpers (`ui::event::share_frames`).
pub(crate) fn beside(points: usize) -> bool {
    rayon::current_thread_index().is_some() && points >= PARALLEL_TIMELINE_POINTS
}

/// Timelines of fewer points are drawn on the frame's own thread: handing
/// work to another costs tens of microseconds, more than they take. Unit
/// tests, whose traces are small, draw every timeline beside the panes.
const PARALLEL_TIMELINE_POINTS: usize = if cfg!(test) { 1 } else { 1 << 18 };

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::StatePoint;

    /// Iteration peaks from the index, whole and in zoomed windows (edges
    /// cutting iterations, on a boundary, inside one iteration), are those
    /// found range by range and sorted.
    #[test]
    fn iteration_peaks_from_the_index_are_those_found_range_by_range() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let all: Vec<StatePoint> = (0..30_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Few values: equal peaks across iterations.
                StatePoint { allocated: x % 40, reserved: 50 }
            })
            .collect();
        let marks: Vec<usize> = (1..60).map(|i| i * 487 + (i * i) % 113).collect();
        let index = crate::analysis::range_max::RangeMax::of(&all, &marks);
        let windows = [(0, 30_000), (0, 1000), (487, 5000), (500, 4100), (600, 700), (974, 1461), (25_000, 30_000)];
        for (lo, hi) in windows.into_iter().chain((0..29_000).step_by(1733).map(|lo| (lo, lo + 977))) {
            let within: Vec<usize> = marks.iter().filter(|&&m| m >= lo && m < hi).map(|&m| m - lo).collect();
            let window = |maxima| Marks {
                timeline: &all[lo..hi],
                cursor: 0,
                peak_at: None,
                ooms: &[],
                empty_caches: &[],
                iterations: &within,
                clock: None,
                first_event: 0,
                unit: "event",
                meaning: None,
                maxima,
            };
            let indexed = window(Some(Maxima { index: &index, all: &all, offset: lo })).iteration_peaks_by_height();
            assert_eq!(indexed, window(None).iteration_peaks_by_height(), "{lo}..{hi}");
            assert_eq!(indexed.len(), within.iter().filter(|&&m| m > 0).count() + 1, "{lo}..{hi}");
        }
    }
}
