//! The screens drawn from parts: an allocator's (`StateScreen`, the demo
//! and synth) and a replay's (`ReplayScreen`), each building the `View` of
//! one frame from its model and the parts (`view::parts`), then drawing it.

use ratatui_core::buffer::Buffer;
use ratatui_core::layout::Rect;
use ratatui_core::widgets::Widget;

use super::parts::{Chrome, Marks, ScaleBy, Selection, Totals};
use super::View;
use crate::alloc::{CachingAllocator, SegmentInfo};
use crate::analysis::{fragmentation, size_histogram, Fragmentation};
use crate::device::Device;

impl<'a> View<'a> {
    /// The screen of an allocator's parts (ours, or what a PyTorch process
    /// published), the selection clamped to `segments`.
    pub(crate) fn new(
        chrome: Chrome<'a>,
        totals: Totals,
        segments: &'a [SegmentInfo],
        fragmentation: Fragmentation,
        marks: Marks<'a>,
        sel: Selection,
    ) -> Self {
        // A replay with no events is a snapshot without a trace: no peaks.
        let peaks_known = !(marks.timeline.is_empty() && chrome.source.starts_with("replay "));
        View {
            chrome,
            totals,
            peaks_known,
            segments,
            fragmentation,
            histogram: size_histogram(segments),
            marks,
            sel: sel.clamped(segments),
        }
    }
}

/// The screen of one of our allocators' state: a running workload's, or a
/// replay's at its cursor.
pub(crate) struct StateScreen<'a, D: Device> {
    pub(crate) alloc: &'a CachingAllocator<D>,
    /// A replay of a trace, whose device is assumed: its bars are to the
    /// trace's own peak reserved (over all of it, not up to the cursor;
    /// "peak") or a state-only snapshot's reserved ("snapshot"), and say
    /// so; none: the device the run is on.
    pub(crate) recorded_scale: Option<(u64, ScaleBy)>,
    pub(crate) chrome: Chrome<'a>,
    pub(crate) marks: Marks<'a>,
    pub(crate) sel: Selection,
    /// `alloc`'s segments where the caller has them (`snapshot`), else
    /// taken here.
    pub(crate) segments: Option<&'a [SegmentInfo]>,
}

impl<D: Device> Widget for StateScreen<'_, D> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        self.with_view(|v| v.render(area, buf));
    }
}

impl<D: Device> StateScreen<'_, D> {
    /// The frame's `View`, handed to `draw` (it borrows the segments,
    /// which may be taken here).
    fn with_view<R>(self, draw: impl FnOnce(&View) -> R) -> R {
        let a = self.alloc;
        let taken;
        let segs = match self.segments {
            Some(s) => s,
            None => {
                taken = a.snapshot();
                &taken
            }
        };
        let stats = a.stats();
        let capacity = capacity(a.memory_limit(), self.recorded_scale, || a.device().total_memory());
        let totals = Totals { capacity: Some(capacity), ..Totals::of(stats) };
        let frag = fragmentation(stats, segs);
        draw(&View::new(self.chrome, totals, segs, frag, self.marks, self.sel))
    }
}

/// What the bars are to the scale of: what can run out. The limit the run
/// had; else a replay's own peak (the device it ran on is not in the
/// trace: an assumed 140 GiB made a 541 MiB trace's bars empty), a running
/// workload's device.
fn capacity(limit: Option<u64>, recorded: Option<(u64, ScaleBy)>, device: impl FnOnce() -> u64) -> (u64, ScaleBy) {
    match (limit, recorded) {
        (Some(l), _) => (l, ScaleBy::Limit),
        (None, Some(p)) => p,
        (None, None) => (device(), ScaleBy::Device),
    }
}

/// The replay screen of `model` where it stands (`ReplayModel::go`), or
/// where it goes first (`going`).
pub(crate) struct ReplayScreen<'m, 'a> {
    pub(crate) model: &'m crate::replay::model::ReplayModel<'a>,
    pub(crate) sel: Selection,
    pub(crate) color: bool,
    pub(crate) status: String,
    /// The keys' mode (none in exports).
    pub(crate) mode: Option<crate::keys::Mode>,
    /// The segments of the state at the model's cursor, where the caller
    /// took them already (`ReplayApp` does, to keep its selection in
    /// them), else taken here.
    pub(crate) segments: Option<&'m [SegmentInfo]>,
    /// An event the frame moves the model to before drawing it (a jump
    /// the app left to its frame, `ReplayApp::go`): the seek and the
    /// timeline then take one time, not two.
    pub(crate) going: Option<usize>,
}

impl Widget for ReplayScreen<'_, '_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        match self.going {
            Some(to) => self.going(to, area, buf),
            None => self.with_state(self.model.cursor(), |v| v.render(area, buf)),
        }
    }
}

impl<'m> ReplayScreen<'m, '_> {
    /// The header of the frame at `cursor`.
    fn chrome(&self, cursor: usize) -> Chrome<'m> {
        let model = self.model;
        let (device, source) =
            model.label.clone().unwrap_or_else(|| ("recorded device".into(), format!("replay {}", model.name)));
        Chrome {
            stacks: model.stacks,
            device,
            source,
            position: model.position(cursor),
            banner: None,
            color: self.color,
            status: self.status.clone(),
            mode: self.mode,
            oom: model.oom_at(cursor),
        }
    }

    /// A state-only snapshot has no peak: its bars are to its reserved.
    fn scale(&self) -> (u64, ScaleBy) {
        let model = self.model;
        (model.peak_reserved().max(1), if model.points().is_empty() { ScaleBy::Snapshot } else { ScaleBy::Peak })
    }

    /// The screen at the model's cursor, `cursor` (the event whose state is
    /// drawn, so that the header, the bars and the timeline's footer all
    /// speak of one moment), drawn from the state it holds locked.
    fn with_state<R>(&self, cursor: usize, draw: impl FnOnce(&View) -> R) -> R {
        let model = self.model;
        let at = model.now();
        let marks = Marks::of(&at.marks, cursor, model.peak_at);
        let segments = self.segments.filter(|_| self.going.is_none());
        StateScreen {
            alloc: at.state(),
            recorded_scale: Some(self.scale()),
            chrome: self.chrome(cursor),
            marks,
            sel: self.sel,
            segments,
        }
        .with_view(draw)
    }

    /// A jump's frame: one thread seeks `to` and draws the rest while the
    /// other draws the timeline at `to`, which needs no state
    /// (docs/measurements/benchmarks.md, "A jump's seek beside its
    /// timeline"). Where the seek shows another event (`to` begins a
    /// malloc whose state is its last event's) or the rows differ, the
    /// timeline is drawn again after it.
    fn going(self, to: usize, area: Rect, buf: &mut Buffer) {
        let model = self.model;
        let limit = model.now().state().memory_limit();
        let capacity = capacity(limit, Some(self.scale()), || 0);
        let totals = Totals { capacity: Some(capacity), ..Totals::default() };
        let ahead = model.marks_at(to);
        let timeline =
            View::new(self.chrome(to), totals, &[], Default::default(), Marks::of(&ahead, to, model.peak_at), self.sel);
        let Some(bottom) = super::timeline_area(&timeline, area).map(|b| b.intersection(buf.area)) else {
            let shown = model.go_shared(to);
            return self.with_state(shown, |v| v.render(area, buf));
        };
        let (apart, kept) = rayon::join(
            || super::timeline_apart(&timeline, bottom),
            || {
                let shown = model.go_shared(to);
                self.with_state(shown, |v| {
                    let same = shown == to
                        && v.totals.capacity == timeline.totals.capacity
                        && super::timeline_area(v, area).map(|b| b.intersection(buf.area)) == Some(bottom);
                    if same {
                        super::draw_but_timeline(v, area, buf);
                    } else {
                        v.render(area, buf);
                    }
                    same
                })
            },
        );
        if kept {
            super::put_buffer(buf, apart);
        }
    }
}
