//! A publishing process as a picture: the live view's `s`, and `export` of
//! a recording (`gpumem-top run -o`, `record`).

use super::picture::{Scene, ViewKind};
use crate::monitor::model::ProcHistory;
use crate::monitor::Published;
use crate::view::parts::Marks;

/// `view` of `p` (what the process published at one sample) over `h`'s
/// timeline, the cursor at `p`'s sample; SVG `width` pixels wide.
pub(crate) fn process_svg(h: &ProcHistory, p: &Published, view: ViewKind, width: u32, title_note: &str) -> String {
    let points = h.series.state_points();
    let peak_at = crate::analysis::peak_index(&points);
    let ooms: Vec<usize> = h.series.ooms.iter().map(|&t| h.series.index_at(t)).collect();
    let steps = h.series.step_indices();
    let scene = Scene {
        title: format!("pid {} {} · GPU {}{title_note}", p.pid, p.name(), p.device),
        subtitle: "published by the process (torch.cuda.memory_stats and memory_snapshot)".into(),
        segments: &p.segments,
        totals: crate::view::parts::Totals::of_published(p),
        fragmentation: p.fragmentation(),
        marks: Marks {
            timeline: &points,
            cursor: h.series.index_upto(p.time).min(points.len().saturating_sub(1)),
            peak_at,
            ooms: &ooms,
            empty_caches: &[],
            iterations: &steps,
            clock: None,
            first_event: 0,
            unit: "event",
            meaning: None,
            maxima: None,
        },
        // memory_stats() does not carry set_per_process_memory_fraction.
        memory_limit: None,
        color_by: crate::view::parts::ColorBy::State,
    };
    super::picture::svg(&scene, view, width)
}
