//! The fragmentation map: a row per segment (or the compact map), and
//! the zoom into one segment's blocks and call sites.

use ratatui_core::buffer::Buffer;
use ratatui_core::layout::Rect;
use ratatui_core::style::{Color, Modifier, Style};
use ratatui_core::text::{Line, Span};
use ratatui_core::widgets::Widget;
use ratatui_widgets::paragraph::Paragraph;

use crate::alloc::{BlockState, SegmentInfo};
use crate::analysis::categories::{Category, Evidence};
use crate::analysis::{human_bytes, short_bytes};
use crate::trace::Frame;

use super::parts::{ordered_indices, Focus, SegmentOrder, View};
use super::text::{boxed, longest_fitting, put, put_row};
use super::theme::{category_color, category_letter, Theme};
use crate::analysis::BlockClass as Cell;

/// Per cell of a segment's row (as `segment_cells`), the category of the
/// live block holding most of its bytes; none where no live block is.
pub fn segment_categories(seg: &SegmentInfo, width: usize, of: impl Fn(u64) -> Category) -> Vec<Option<Category>> {
    let mut out = Vec::with_capacity(width);
    if width == 0 || seg.total_size == 0 {
        return out;
    }
    let (total, w) = (seg.total_size as u128, width as u128);
    let live: Vec<(u64, u64, Category)> = seg
        .blocks
        .iter()
        .filter(|b| b.state != BlockState::Inactive)
        .map(|b| (b.address - seg.address, b.address - seg.address + b.size, of(b.address)))
        .collect();
    let mut k = 0;
    for c in 0..width as u128 {
        let lo = (total * c / w) as u64;
        let hi = ((total * (c + 1) / w) as u64).max(lo + 1);
        while k < live.len() && live[k].1 <= lo {
            k += 1;
        }
        let mut best: Option<(u64, Category)> = None;
        for &(a, b, cat) in live[k..].iter().take_while(|x| x.0 < hi) {
            let n = b.min(hi) - a.max(lo);
            if best.is_none_or(|x| n > x.0) {
                best = Some((n, cat));
            }
        }
        out.push(best.map(|x| x.1));
    }
    out
}

/// The glyphs and styles of one segment's `n` cells: by block state, or
/// by category where the view shows categories.
pub(crate) fn map_cells(view: &View, theme: Theme, seg: &SegmentInfo, n: usize) -> Vec<(char, Style)> {
    let cells = segment_cells(seg, n);
    match view.sel.color_by.meaning(view.marks.meaning) {
        Some(m) => {
            let cats = segment_categories(seg, n, |a| m.of_block(a));
            cells
                .into_iter()
                .zip(cats)
                .map(|(cell, cat)| match cat {
                    Some(c) if theme.color => (cell.glyph(), theme.fg(category_color(c))),
                    Some(c) => (category_letter(c), Style::default()),
                    None => (cell.glyph(), theme.fg(Color::DarkGray)),
                })
                .collect()
        }
        None => cells.into_iter().map(|c| (c.glyph(), theme.fg(c.color()))).collect(),
    }
}

/// The cells of one segment's row, `width` cells covering the segment to
/// scale: each cell shows the state holding most of its bytes.
pub fn segment_cells(seg: &SegmentInfo, width: usize) -> Vec<Cell> {
    let mut out = Vec::with_capacity(width);
    if width == 0 || seg.total_size == 0 {
        return out;
    }
    let ranges = crate::analysis::class_spans(seg);
    // Cell c covers [total·c/width, total·(c+1)/width): one division per
    // cell, in u64 unless the product could overflow (u128 division is a
    // library call, and this runs for every cell of the map each frame).
    let (total, w) = (seg.total_size, width as u64);
    let edge = |c: u64| match total.checked_mul(c) {
        Some(p) => p / w,
        None => (total as u128 * c as u128 / w as u128) as u64,
    };
    let mut r = 0;
    let mut lo = 0;
    for c in 0..width {
        let next = edge(c as u64 + 1);
        let hi = next.max(lo + 1);
        let mut best = (0u64, Cell::FreeSegment);
        while r < ranges.len() && ranges[r].1 <= lo {
            r += 1;
        }
        let mut k = r;
        let mut weights = [0u64; 5];
        while k < ranges.len() && ranges[k].0 < hi {
            let (a, b, cell) = ranges[k];
            let w = b.min(hi) - a.max(lo);
            weights[cell as usize] += w;
            k += 1;
        }
        for (i, &w) in weights.iter().enumerate() {
            // Ties go to the more telling state (allocated first).
            if w > best.0 {
                best = (w, Cell::LEGEND[i].0);
            }
        }
        out.push(best.1);
        lo = next;
    }
    out
}

pub(crate) fn render_map(view: &View, theme: Theme, area: Rect, buf: &mut Buffer) {
    let order = match view.sel.order {
        SegmentOrder::Address => "address",
        SegmentOrder::Size => "size",
    };
    let focus = if view.sel.focus == Focus::Map { theme.bold() } else { Style::default() };
    let private = view.segments.iter().filter(|s| s.private).count();
    let pools = if private > 0 { format!("─ {private} in private pools (*) ") } else { String::new() };
    let cells_w = (area.width as usize).saturating_sub(2 + ROW_LABEL + 1);
    let scaled = rows_to_scale(view.segments, cells_w) != view.sel.flip_scale;
    let rows = match (view.sel.compact, scaled) {
        (true, _) => "",
        (false, true) => "─ to scale ",
        (false, false) => "─ stretched ",
    };
    let n = crate::analysis::count(view.segments.len(), "segment");
    // The longest title that fits: nothing is cut without a word.
    let room = (area.width as usize).saturating_sub(2);
    let pools_short = if private > 0 { format!("─ {private} private (*) ") } else { String::new() };
    let title = [
        format!(" Fragmentation map ─ {n} ─ by {order} {rows}{pools}"),
        format!(" Fragmentation map ─ {n} ─ by {order} {rows}{pools_short}"),
        format!(" Map ─ {n} ─ by {order} {rows}{pools_short}"),
        format!(" Map ─ {n} ─ {order} {rows}{pools_short}"),
        format!(" Map ─ {} {rows}", view.segments.len()),
    ];
    let title = longest_fitting(title, room).unwrap_or_else(|| " Map ".to_string());
    let title = Line::from(Span::styled(title, focus));
    let inner = boxed(buf, area, title, None);
    if inner.height == 0 {
        return;
    }
    let segs = ordered(view);
    if view.sel.zoom {
        if let Some(seg) = segs.get(view.sel.selected) {
            render_zoom(view, theme, seg, inner, buf);
            return;
        }
    }
    if view.sel.compact {
        render_compact(view, theme, &segs, Rect { height: inner.height - 1, ..inner }, buf);
    } else {
        render_rows(view, theme, &segs, scaled, inner, buf);
    }
    if let Some(m) = view.sel.color_by.meaning(view.marks.meaning) {
        let legend = category_legend(theme, m.evidence(), inner.width as usize);
        put_row(buf, inner.x, inner.y + inner.height - 1, inner.width, legend);
        return;
    }
    // Legend on the last line: the names, or shorter ones where they do
    // not fit.
    let long: usize = Cell::LEGEND.iter().map(|(_, n)| n.chars().count() + 4).sum();
    // The short names are the help's: inactive_split, a free segment.
    let short = ["alloc", "waste", "pending", "split", "empty"];
    let mut spans = Vec::new();
    for (i, (c, name)) in Cell::LEGEND.iter().enumerate() {
        spans.push(Span::styled(c.glyph().to_string(), theme.fg(c.color())));
        spans.push(Span::raw(if long <= inner.width as usize {
            format!(" {name}  ")
        } else {
            format!(" {} ", short[i])
        }));
    }
    put_row(buf, inner.x, inner.y + inner.height - 1, inner.width, Line::from(spans));
}

/// The categories' key: each one's glyph (or letter) and short name.
pub(crate) fn category_legend(theme: Theme, evidence: Evidence, width: usize) -> Line<'static> {
    let mut spans = Vec::new();
    for c in Category::ALL.into_iter().filter(|&c| c != Category::Unknown || evidence != Evidence::Stacks) {
        let (glyph, style) =
            if theme.color { ('█', theme.fg(category_color(c))) } else { (category_letter(c), Style::default()) };
        spans.push(Span::styled(glyph.to_string(), style));
        spans.push(Span::raw(format!(" {} ", c.label())));
    }
    if evidence != Evidence::Stacks && width > 80 {
        spans.push(Span::styled(format!("─ {}", evidence.name()), theme.fg(Color::DarkGray)));
    }
    Line::from(spans)
}

/// The map row's label: address and size.
pub(crate) const ROW_LABEL: usize = 23;

/// Whether rows to one scale (the largest segment's) read well: most
/// segments still get enough cells to show their blocks. Segments of very
/// different sizes (2 MiB beside 1.5 GiB) read better stretched, each to the
/// width, and the title says which is shown.
pub(crate) fn rows_to_scale(segs: &[SegmentInfo], cells: usize) -> bool {
    let max = segs.iter().map(|s| s.total_size).max().unwrap_or(0).max(1);
    let readable = segs.iter().filter(|s| s.total_size as u128 * cells as u128 >= 8 * max as u128).count();
    !segs.is_empty() && 2 * readable >= segs.len()
}

pub(crate) fn render_rows(
    view: &View,
    theme: Theme,
    segs: &[&SegmentInfo],
    scaled: bool,
    inner: Rect,
    buf: &mut Buffer,
) {
    let label_w = ROW_LABEL;
    let cells_w = (inner.width as usize).saturating_sub(label_w + 1);
    let max = view.segments.iter().map(|s| s.total_size).max().unwrap_or(0).max(1);
    let rows = inner.height as usize - 1;
    let x0 = inner.x + label_w as u16 + 1;
    let room = buf.area.right().saturating_sub(x0) as usize;
    // To scale: the largest segment is the full width.
    let width = |seg: &SegmentInfo| {
        let n = if scaled {
            ((seg.total_size as u128 * cells_w as u128).div_ceil(max as u128) as usize).max(1)
        } else {
            cells_w
        };
        n.min(room)
    };
    let shown: Vec<(u16, &SegmentInfo)> = (inner.y..)
        .zip(segs.iter().skip(view.sel.scroll).take(rows).copied())
        .filter(|&(y, _)| buf.area.contains(ratatui_core::layout::Position { x: x0, y }))
        .collect();
    // Each row's cells are its own work: beside a long timeline (a jump's
    // frame draws the map after its seek) they are found on every free
    // thread (docs/measurements/benchmarks.md, "The map's rows on free
    // threads").
    let cells: Vec<Vec<(char, Style)>> = if super::parts::beside(view.marks.timeline.len()) {
        use rayon::prelude::*;
        shown.par_iter().map(|&(_, seg)| map_cells(view, theme, seg, width(seg))).collect()
    } else {
        shown.iter().map(|&(_, seg)| map_cells(view, theme, seg, width(seg))).collect()
    };
    for (row, seg) in segs.iter().skip(view.sel.scroll).take(rows).enumerate() {
        let y = inner.y + row as u16;
        // `*`: the segment belongs to a private pool (CUDA graph, MemPool).
        let mark = if seg.private { '*' } else { ' ' };
        let label = format!("{:#014x} {:>7}{mark}", seg.address, short_bytes(seg.total_size));
        let style = if view.sel.scroll + row == view.sel.selected {
            Style::default().add_modifier(Modifier::REVERSED)
        } else {
            Style::default()
        };
        put_row(buf, inner.x, y, label_w as u16, Line::styled(label, style));
    }
    // Cells are written directly: set_string would segment graphemes for
    // every one-glyph string, most of a frame's cost.
    for (&(y, _), row) in shown.iter().zip(cells) {
        let at = buf.index_of(x0, y);
        for (cell, (glyph, style)) in buf.content[at..].iter_mut().zip(row) {
            cell.set_char(glyph).set_style(style);
        }
    }
}

/// The bytes one cell stands for in compact mode: the smallest power of two
/// (at least 512 KiB) at which every segment, each given at least one cell,
/// fits in `capacity` cells; the largest tried when none does.
pub(crate) fn compact_scale(segs: &[&SegmentInfo], capacity: usize) -> u64 {
    let mut b: u64 = 512 << 10;
    while b < 1 << 50 {
        if compact_cells(segs, b) <= capacity {
            break;
        }
        b *= 2;
    }
    b
}

/// Cells the segments take at `per_cell` bytes a cell.
pub(crate) fn compact_cells(segs: &[&SegmentInfo], per_cell: u64) -> usize {
    segs.iter().map(|s| s.total_size.div_ceil(per_cell).max(1) as usize).sum()
}

pub(crate) fn render_compact(view: &View, theme: Theme, segs: &[&SegmentInfo], area: Rect, buf: &mut Buffer) {
    if area.height < 2 || area.width == 0 {
        return;
    }
    let width = area.width as usize;
    let rows = area.height as usize - 1;
    let per_cell = compact_scale(segs, width * rows);
    let mut i = 0usize;
    let mut shown = 0usize;
    for (k, seg) in segs.iter().enumerate() {
        let n = seg.total_size.div_ceil(per_cell).max(1) as usize;
        if i + n > width * rows {
            break;
        }
        let selected = k == view.sel.selected;
        for (glyph, mut style) in map_cells(view, theme, seg, n) {
            let (x, y) = ((i % width) as u16, (i / width) as u16);
            if selected {
                style = style.add_modifier(Modifier::REVERSED);
            }
            put(buf, area.x + x, area.y + y, glyph, style);
            i += 1;
        }
        shown += 1;
    }
    let hidden = segs.len() - shown;
    let order = if view.sel.order == SegmentOrder::Size { "size" } else { "address" };
    let cell = short_bytes(per_cell);
    let sel = segs.get(view.sel.selected).map(|g| (format!("{:#x}", g.address), short_bytes(g.total_size)));
    // The longest form that fits: the scale first, then what is hidden,
    // then the selection, then the order.
    let forms = [
        [
            format!("compact: 1 cell = {cell} ─ segments back to back by {order}"),
            format!(" ─ {hidden} not shown"),
            sel.as_ref().map(|(a, b)| format!(" ─ selected {a} {b}")).unwrap_or_default(),
        ],
        [
            format!("1 cell = {cell} ─ by {order}"),
            format!(" ─ {hidden} not shown"),
            sel.as_ref().map(|(a, b)| format!(" ─ sel {a} {b}")).unwrap_or_default(),
        ],
        [
            format!("1 cell = {cell}"),
            format!(" ─ {hidden} hidden"),
            sel.as_ref().map(|(a, b)| format!(" ─ {a} {b}")).unwrap_or_default(),
        ],
    ];
    let join = |f: &[String; 3]| format!("{}{}{}", f[0], if hidden > 0 { f[1].as_str() } else { "" }, f[2]);
    let footer = forms.iter().map(join).find(|t| t.chars().count() <= width).unwrap_or_else(|| forms[2][0].clone());
    buf.set_stringn(area.x, area.y + area.height - 1, footer, width, theme.fg(Color::DarkGray));
}

/// ` of private pool (1,0)` for a private pool's segment, else nothing.
pub(crate) fn pool_name(seg: &SegmentInfo) -> String {
    match (seg.private, seg.pool) {
        (false, _) => String::new(),
        (true, Some((a, b))) => format!(" of private pool ({a},{b})"),
        (true, None) => " of a private pool (id not recorded)".into(),
    }
}

/// The segments in the view's order.
pub(crate) fn ordered<'v>(view: &View<'v>) -> Vec<&'v SegmentInfo> {
    ordered_indices(view.segments, view.sel.order).into_iter().map(|i| &view.segments[i]).collect()
}

pub(crate) fn render_zoom(view: &View, theme: Theme, seg: &SegmentInfo, area: Rect, buf: &mut Buffer) {
    let es = if seg.is_expandable { ", expandable" } else { "" };
    // The longest heading that fits: the segment's address and size first.
    let heading = longest_fitting(
        [
            format!(
                "segment {:#x}: {} {} pool{}, stream {}{es} ─ ↑/↓ block  Enter/Esc back",
                seg.address,
                human_bytes(seg.total_size),
                seg.segment_type,
                pool_name(seg),
                seg.stream
            ),
            format!(
                "segment {:#x}: {} {} pool{}, stream {}{es}",
                seg.address,
                human_bytes(seg.total_size),
                seg.segment_type,
                pool_name(seg),
                seg.stream
            ),
            format!("{:#x}: {} {}{es}", seg.address, human_bytes(seg.total_size), seg.segment_type),
        ],
        area.width as usize,
    )
    .unwrap_or_else(|| format!("{:#x}", seg.address));
    let mut lines = vec![Line::from(Span::styled(heading, theme.bold()))];
    // Narrow panes drop the requested size and shorten the figures, so that
    // the state and what the block is stay.
    let narrow = (area.width as usize) < 64;
    let stack_of = |b: &crate::alloc::BlockInfo| -> Option<&Vec<Frame>> {
        if b.tag > 0 && b.state != BlockState::Inactive {
            view.chrome.stacks.get(b.tag as usize - 1)
        } else {
            None
        }
    };
    let sel = view.sel.block.min(seg.blocks.len().saturating_sub(1));
    let frames: &[Frame] = seg.blocks.get(sel).and_then(stack_of).map_or(&[], |f| f.as_slice());
    let h = area.height as usize;
    // The selected block's stack takes at most half the pane.
    let stack_rows = if frames.is_empty() { 0 } else { (frames.len() + 1).min(h / 2) };
    let list_rows = h.saturating_sub(1 + stack_rows).max(1);
    let first = (sel + 1).saturating_sub(list_rows);
    for (i, b) in seg.blocks.iter().enumerate().skip(first).take(list_rows) {
        let (state, cell) = match b.state {
            BlockState::ActiveAllocated => ("allocated", Cell::Allocated),
            BlockState::ActivePendingFree => ("pending free", Cell::PendingFree),
            BlockState::Inactive => ("free", Cell::FreeInUsedSegment),
        };
        let site = stack_of(b).map(|f| crate::analysis::call_site(f)).unwrap_or_default();
        let requested = if b.state == BlockState::Inactive {
            String::new()
        } else {
            format!("req {:>10}", human_bytes(b.requested_size))
        };
        let style = if i == sel { Style::default().add_modifier(Modifier::REVERSED) } else { Style::default() };
        // What the block is, where the screen knows.
        let what = match view.marks.meaning {
            Some(m) if b.state != BlockState::Inactive => format!("{:<8}", m.of_block(b.address).label()),
            Some(_) => " ".repeat(8),
            None => String::new(),
        };
        let row = if narrow {
            format!(
                " +{:<6} {:>6} {:<9} {what}{site}",
                short_bytes(b.address - seg.address),
                short_bytes(b.size),
                state
            )
        } else {
            format!(
                " +{:<10} {:>10} {:<15} {:<12} {what}{site}",
                short_bytes(b.address - seg.address),
                human_bytes(b.size),
                requested,
                state
            )
        };
        lines.push(Line::from(vec![
            Span::styled(cell.glyph().to_string(), theme.fg(cell.color())),
            Span::styled(row, style),
        ]));
    }
    if stack_rows > 0 {
        let list_end = 1 + seg.blocks.len().min(list_rows);
        lines.resize(h.saturating_sub(stack_rows).max(list_end), Line::from(""));
        lines.push(Line::from(Span::styled(
            format!(
                "call stack of the block at +{} (innermost first)",
                short_bytes(seg.blocks[sel].address - seg.address)
            ),
            theme.bold(),
        )));
        for f in frames.iter().take(stack_rows - 1) {
            let at = if f.line > 0 { format!("{}:{}", f.filename, f.line) } else { f.filename.to_string() };
            lines.push(Line::from(format!("  {}  {at}", f.name)));
        }
    }
    Paragraph::new(lines).render(area, buf);
}
