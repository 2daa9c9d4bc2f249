//! One moment of a replayed trace, or of any allocator, as a picture (SVG,
//! PNG) or as the screen in text: `export`, and the screens' `s` key.

use ratatui_core::buffer::Buffer;
use ratatui_core::layout::Rect;

use super::picture::{Format, Scene, ViewKind};
use crate::alloc::{CachingAllocator, SegmentInfo};
use crate::analysis::fragmentation;
use crate::device::Device;
use crate::replay::model::ReplayModel;
use crate::view::parts::{ColorBy, Marks, Selection, Totals};
use crate::view::screen::ReplayScreen;
use crate::view::{Focus, Panel};
use ratatui_core::widgets::Widget;

/// The picture of an allocator's state with the timeline's marks.
pub(crate) fn scene_of<'a, D: Device>(
    a: &CachingAllocator<D>,
    segs: &'a [SegmentInfo],
    title: String,
    note: &str,
    m: Marks<'a>,
) -> Scene<'a> {
    let stats = a.stats();
    let conf = &a.config().source;
    Scene {
        title,
        subtitle: format!(
            "allocator config: {}{} · {note}",
            if conf.is_empty() { "default" } else { conf.as_str() },
            a.memory_limit()
                .map(|l| format!(" · memory limit {}", crate::analysis::human_bytes(l)))
                .unwrap_or_default()
        ),
        memory_limit: a.memory_limit(),
        segments: segs,
        totals: Totals::of(stats),
        fragmentation: fragmentation(stats, segs),
        marks: m,
        color_by: ColorBy::State,
    }
}

/// `view` of `model` after event `cursor`: SVG, PNG, or that panel of the
/// screen as text (one column per 10 pixels of `width`: 160 for the
/// default 1600; ANSI colours unless `plain`).
pub fn picture(
    model: &mut ReplayModel,
    cursor: usize,
    view: ViewKind,
    format: Format,
    width: u32,
    plain: bool,
    color_by: ColorBy,
) -> Result<Vec<u8>, String> {
    // The state after `cursor`; the title and marks name `cursor` as asked.
    model.go(cursor);
    if format == Format::Txt {
        let cols = (width / 10).clamp(80, 800) as u16;
        let (panel, rows) = match view {
            ViewKind::Bars => (Panel::Bars, 7),
            // Every segment a row (up to 60), the histogram beside them.
            ViewKind::Fragmap => (Panel::Map, (model.now().state().snapshot().len() as u16 + 5).clamp(25, 65)),
            ViewKind::Timeline => (Panel::Timeline, 17),
        };
        let mut buf = Buffer::empty(Rect::new(0, 0, cols, rows));
        let focus = if view == ViewKind::Timeline { Focus::Timeline } else { Focus::Map };
        let sel = Selection { focus, panel: Some(panel), color_by, ..Selection::default() };
        let area = buf.area;
        ReplayScreen { model, sel, color: !plain, status: String::new(), mode: None, segments: None, going: None }
            .render(area, &mut buf);
        return Ok(super::text::from_buffer(&buf, !plain).into_bytes());
    }
    let n = model.points().len();
    let (name, peak_at) = (model.name.clone(), model.peak_at);
    // At a recorded OOM: the request that failed, and where it was made.
    let oom = model.oom_at(cursor).map(|o| {
        let site =
            if o.frames.is_empty() { String::new() } else { format!(" at {}", crate::analysis::call_site(o.frames)) };
        format!(" (OOM: {} requested on stream {}{site})", crate::analysis::human_bytes(o.size), o.stream)
    });
    let at = model.now();
    let marks = Marks::of(&at.marks, cursor, peak_at);
    let a = at.state();
    let segs = a.snapshot();
    let mark = match (&oom, Some(cursor) == peak_at) {
        (Some(o), _) => o.clone(),
        (None, true) => " (peak)".to_string(),
        (None, false) => String::new(),
    };
    let title = format!("{name} · event {cursor} of {n}{mark}");
    let note = "replayed by gpumem-top through its model of PyTorch's caching allocator";
    let scene = Scene { color_by, ..scene_of(a, &segs, title, note, marks) };
    let svg = super::picture::svg(&scene, view, width);
    match format {
        Format::Svg => Ok(svg.into_bytes()),
        _ => super::picture::png(&svg),
    }
}
