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
        // Bars to the scale of what can run out: the limit the run had; else a
        // replay's own peak (the device it ran on is not in the trace: an
        // assumed 140 GiB made a 541 MiB trace's bars empty, #37 item 2), a
        // running workload's device.
        let capacity = match a.memory_limit() {
            Some(l) => (l, ScaleBy::Limit),
            None => match self.recorded_scale {
                Some(p) => p,
                None => (a.device().total_memory(), ScaleBy::Device),
            },
        };
        let totals = Totals { capacity: Some(capacity), ..Totals::of(stats) };
        let frag = fragmentation(stats, segs);
        View::new(self.chrome, totals, segs, frag, self.marks, self.sel).render(area, buf);
    }
}

/// The replay screen of `model` where it stands (`ReplayModel::go`).
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
}

impl Widget for ReplayScreen<'_, '_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let model = self.model;
        // The event whose state is drawn, so that the header, the bars and the
        // timeline's footer all speak of one moment.
        let cursor = model.cursor();
        let (device, source) =
            model.label.clone().unwrap_or_else(|| ("recorded device".into(), format!("replay {}", model.name)));
        let chrome = Chrome {
            stacks: model.stacks,
            device,
            source,
            position: model.position(cursor),
            banner: None,
            color: self.color,
            status: self.status,
            mode: self.mode,
            oom: model.oom_at(cursor),
        };
        // A state-only snapshot has no peak: its bars are to its reserved.
        let scale =
            (model.peak_reserved().max(1), if model.points().is_empty() { ScaleBy::Snapshot } else { ScaleBy::Peak });
        let at = model.now();
        let marks = Marks::of(&at, cursor, model.peak_at);
        let segments = self.segments;
        StateScreen { alloc: at.state, recorded_scale: Some(scale), chrome, marks, sel: self.sel, segments }
            .render(area, buf);
    }
}
