//! The screens of docs/design/architecture.md §Screens, drawn from an immutable `View`
//! (`impl Widget for &View`): a header, the
//! allocated/reserved bars, the fragmentation map beside the block-size
//! histogram, the timeline, and a status line. Nothing here computes metrics
//! or owns data; the caller builds the `View` from whatever source it has.

pub(crate) mod chart;
pub(crate) mod diff;
pub(crate) mod job;
pub mod parts;
pub(crate) mod screen;
pub(crate) mod theme;

pub(crate) use parts::{ordered_indices, Focus, Panel, SegmentOrder};
pub(crate) mod ranks;

use ratatui_core::buffer::Buffer;
use ratatui_core::layout::{Constraint, Layout, Rect};
use ratatui_core::style::{Color, Modifier, Style};
use ratatui_core::symbols::Marker;
use ratatui_core::text::{Line, Span};
use ratatui_core::widgets::Widget;
use ratatui_widgets::block::Block;
use ratatui_widgets::borders::Borders;
use ratatui_widgets::canvas::{Canvas, Line as CanvasLine};
use ratatui_widgets::clear::Clear;
use ratatui_widgets::paragraph::{Paragraph, Wrap};

use crate::alloc::{BlockState, SegmentInfo};
use crate::analysis::categories::{Category, CategoryBytes, Evidence};
use crate::analysis::{human_bytes, short_bytes, Fragmentation, SizeBucket};
use crate::trace::Frame;

/// The smallest terminal the screens are drawn in.
pub(crate) const MIN_WIDTH: u16 = 80;
pub(crate) const MIN_HEIGHT: u16 = 24;
/// The allocator screen inside a terminal of at least 80×24: the live view
/// puts its list of GPUs above it (at most a third of the terminal).
const MIN_SCREEN_HEIGHT: u16 = 16;

/// Draws "needs a terminal of at least 80x24" when `area` (the whole
/// terminal) is smaller, and says so.
pub(crate) fn too_small(area: Rect, buf: &mut Buffer) -> bool {
    if area.width >= MIN_WIDTH && area.height >= MIN_HEIGHT {
        return false;
    }
    let msg = format!(
        "gpumem-top needs a terminal of at least {MIN_WIDTH}x{MIN_HEIGHT}; this one is {}x{}.",
        area.width, area.height
    );
    Paragraph::new(msg).wrap(Wrap { trim: true }).render(area, buf);
    true
}

/// Everything one frame shows: the parts a screen is drawn from, as the
/// apps and exports built them (nothing is copied out of them).
#[derive(Debug, Clone)]
pub(crate) struct View<'a> {
    /// The header, banner, status line and call stacks.
    pub(crate) chrome: parts::Chrome<'a>,
    /// The bars' figures.
    pub(crate) totals: parts::Totals,
    /// False for a snapshot without a trace: its peaks are not in the file.
    pub(crate) peaks_known: bool,
    pub(crate) segments: &'a [SegmentInfo],
    pub(crate) fragmentation: Fragmentation,
    pub(crate) histogram: Vec<SizeBucket>,
    /// The timeline (allocated and reserved over events or samples) and
    /// its marks.
    pub(crate) marks: parts::Marks<'a>,
    /// What the keys selected (clamped to `segments`).
    pub(crate) sel: parts::Selection,
}

/// A bordered box with `title` (and `right`, right-aligned) in `area`;
/// returns the inner area.
///
/// The cells `Block::bordered()` draws, drawn by Blocks over the box's
/// edges only: a Block first restyles every cell of its area, which for
/// the default style changes nothing and was a twentieth of a live
/// frame's cost (docs/measurements/benchmarks.md). The top row is the whole Block's
/// top row (its corners come from the side borders, its titles from the
/// same Block); sides and bottom are Blocks one cell thick.
pub(crate) fn boxed(buf: &mut Buffer, area: Rect, title: Line, right: Option<Line>) -> Rect {
    let mut block = Block::bordered().title(title);
    if let Some(r) = right {
        block = block.title(r.right_aligned());
    }
    let inner = block.inner(area);
    let area = area.intersection(buf.area);
    if area.height < 3 || area.width < 3 {
        block.render(area, buf);
        return inner;
    }
    let sides = Borders::LEFT | Borders::RIGHT;
    block.borders(Borders::TOP | sides).render(Rect { height: 1, ..area }, buf);
    Block::new().borders(Borders::BOTTOM | sides).render(Rect { y: area.bottom() - 1, height: 1, ..area }, buf);
    let middle = Rect { y: area.y + 1, height: area.height - 2, ..area };
    Block::new().borders(Borders::LEFT).render(Rect { width: 1, ..middle }, buf);
    Block::new().borders(Borders::RIGHT).render(Rect { x: area.right() - 1, width: 1, ..middle }, buf);
    inner
}

/// A screen's own short help (diff, ranks): `lines` in a box 84 columns
/// wide at most, centred over `area`, what was under it cleared.
pub(crate) fn help_box(lines: Vec<Line>, area: Rect, buf: &mut Buffer) {
    let w = 84.min(area.width);
    let h = (lines.len() as u16 + 2).min(area.height);
    let r = Rect { x: area.x + (area.width - w) / 2, y: area.y + (area.height - h) / 2, width: w, height: h };
    Clear.render(r, buf);
    let inner = boxed(buf, r, Line::from(" help "), None);
    put_rows(buf, inner, lines);
}

/// Lines that fit unwrapped, one per row of `area`.
///
/// `Buffer::set_line` rather than `Paragraph`: the same cells for lines that
/// fit, without a paragraph's style pass over its area and line composer,
/// which made drawing a live frame twice as dear (docs/measurements/benchmarks.md).
pub(crate) fn put_rows(buf: &mut Buffer, area: Rect, lines: Vec<Line>) {
    let area = area.intersection(buf.area);
    for (i, l) in lines.iter().take(area.height as usize).enumerate() {
        set_line(buf, area.x, area.y + i as u16, l, area.width);
    }
}

/// `Buffer::set_line`, the same cells, with spans made only of
/// one-cell characters (`one_cell`) written a character a cell: each such
/// character is a grapheme of its own one cell wide, so the grapheme
/// segmentation ratatui runs on every character, a tenth of a live
/// frame's cost, has nothing to find (docs/measurements/benchmarks.md). Other spans go
/// through ratatui. Nothing is drawn from outside the buffer.
pub(crate) fn set_line(buf: &mut Buffer, x: u16, y: u16, line: &Line, max_width: u16) {
    if !buf.area.contains(ratatui_core::layout::Position { x, y }) {
        return;
    }
    let mut x = x;
    let mut room = max_width.min(buf.area.right().saturating_sub(x));
    for span in line {
        if room == 0 {
            break;
        }
        let style = line.style.patch(span.style);
        if span.content.chars().all(|c| one_cell(c) || c.is_ascii_control()) {
            let start = buf.index_of(x, y);
            let mut cells = buf.content[start..].iter_mut();
            // ASCII controls: ratatui drops them.
            for c in span.content.chars().filter(|c| !c.is_ascii_control()).take(room as usize) {
                let Some(cell) = cells.next() else { break };
                cell.set_char(c).set_style(style);
                x += 1;
                room -= 1;
            }
        } else {
            let (next, _) = buf.set_stringn(x, y, &span.content, room as usize, style);
            room = room.saturating_sub(next - x);
            x = next;
        }
    }
}

/// Characters that are each a grapheme of their own, one cell wide, next
/// to any other of them: printable ASCII, Latin-1's symbols and letters,
/// dashes and quotes, arrows, mathematical operators, box drawing, block
/// elements, geometric shapes but the wide ◽ ◾, and ⚠ ✓ ✗ (the screens' glyphs; none is a
/// combining mark, a joiner or wide, as `set_line_draws_what_ratatuis_draws`
/// checks for every one against ratatui).
fn one_cell(c: char) -> bool {
    matches!(c, ' '..='~'
        | '\u{A1}'..='\u{AC}' | '\u{AE}'..='\u{FF}'
        | '\u{2010}'..='\u{2027}'
        | '\u{2190}'..='\u{22FF}'
        | '\u{2500}'..='\u{25FC}' | '\u{25FF}'
        | '\u{26A0}' | '\u{2713}'..='\u{2717}')
}

/// One line in one row at (x, y), `width` cells.
fn put_row(buf: &mut Buffer, x: u16, y: u16, width: u16, l: Line) {
    put_rows(buf, Rect { x, y, width, height: 1 }, vec![l]);
}

/// Styles, or none at all under NO_COLOR: glyphs carry the meaning either way.
#[derive(Debug, Clone, Copy)]
struct Theme {
    color: bool,
}

impl Theme {
    fn fg(self, c: Color) -> Style {
        if self.color {
            Style::default().fg(c)
        } else {
            Style::default()
        }
    }
    fn bold(self) -> Style {
        Style::default().add_modifier(Modifier::BOLD)
    }
}

/// One glyph per block class, readable without colour.
pub use crate::analysis::BlockClass as Cell;

impl Cell {
    pub fn glyph(self) -> char {
        match self {
            Cell::Allocated => '█',
            Cell::RoundingWaste => '▓',
            Cell::PendingFree => '▒',
            Cell::FreeInUsedSegment => '░',
            Cell::FreeSegment => '·',
        }
    }
    pub(crate) fn color(self) -> Color {
        theme::block(self).term
    }
    pub(crate) const LEGEND: [(Cell, &'static str); 5] = [
        (Cell::Allocated, "allocated"),
        (Cell::RoundingWaste, "rounding"),
        (Cell::PendingFree, "pending free"),
        (Cell::FreeInUsedSegment, "free in used segment"),
        (Cell::FreeSegment, "free segment"),
    ];
}

/// A category's colour on screens and in pictures, and its letter where
/// there is no colour (docs/user/categories.md).
pub(crate) fn category_color(c: Category) -> Color {
    theme::category(c).term
}

pub(crate) fn category_letter(c: Category) -> char {
    match c {
        Category::Parameter => 'P',
        Category::Gradient => 'G',
        Category::OptimizerState => 'O',
        Category::Activation => 'A',
        Category::Input => 'I',
        Category::Temporary => 'T',
        Category::Unknown => '?',
    }
}

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
fn map_cells(view: &View, theme: Theme, seg: &SegmentInfo, n: usize) -> Vec<(char, Style)> {
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

/// `panel` alone in `area`; the map and the timeline under a line saying
/// what and when (the bars' box says it in its title).
fn draw_panel(view: &View, panel: Panel, area: Rect, buf: &mut Buffer) {
    let theme = Theme { color: view.chrome.color };
    let title = format!(" gpumem-top ─ {} ─ {} ─ {} ", view.chrome.device, view.chrome.source, view.chrome.position);
    let area = if panel == Panel::Bars || area.height < 2 {
        area
    } else {
        let [caption, rest] = Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(area);
        put_rows(buf, caption, vec![Line::from(Span::styled(title.clone(), theme.bold()))]);
        rest
    };
    match panel {
        Panel::Bars => {
            let inner = boxed(buf, area, Line::from(Span::styled(title, theme.bold())), None);
            render_bars(view, theme, inner, buf);
        }
        Panel::Map => {
            let [map, hist] = Layout::horizontal([Constraint::Percentage(62), Constraint::Percentage(38)]).areas(area);
            render_map(view, theme, map, buf);
            render_histogram(view, theme, hist, buf);
        }
        Panel::Timeline => render_timeline(view, theme, area, buf),
    }
}

impl Widget for &View<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        draw(self, area, buf)
    }
}

/// Draws the whole screen.
fn draw(view: &View, area: Rect, buf: &mut Buffer) {
    if let Some(p) = view.sel.panel {
        return draw_panel(view, p, area, buf);
    }
    let theme = Theme { color: view.chrome.color };
    if area.width < MIN_WIDTH || area.height < MIN_SCREEN_HEIGHT {
        let msg = format!(
            "gpumem-top needs a terminal of at least {MIN_WIDTH}x{MIN_HEIGHT}; this pane is {}x{}.",
            area.width, area.height
        );
        Paragraph::new(msg).wrap(Wrap { trim: true }).render(area, buf);
        return;
    }
    let banner_h = u16::from(view.chrome.banner.is_some());
    // A message longer than the screen is wide wraps onto up to three rows
    // (taken from the map): its advice is at its end.
    let suffix = if view.chrome.mode.is_some() { "   q quit  ? help" } else { "" };
    let status_lines = if view.chrome.status.trim().is_empty() {
        Vec::new()
    } else {
        let mut l = wrap(&format!("{}{suffix}", view.chrome.status.trim_end()), area.width as usize, 1);
        l.truncate(3);
        l
    };
    let status_h = (status_lines.len() as u16).max(1);
    let [banner, top, middle, bottom, status] = Layout::vertical([
        Constraint::Length(banner_h),
        // The bars, and with categories the line saying what they are.
        // (At 24 rows the bar alone, split by category, says it.)
        Constraint::Length(6 + u16::from(what_line(view, area.height))),
        Constraint::Min(if area.height < MIN_HEIGHT { 4 } else { 8 }),
        // Below 24 rows (the live view's pane at 80x24) the timeline gives up rows first.
        Constraint::Length(if area.height < MIN_HEIGHT { 5 } else { (area.height / 4).max(7) }),
        Constraint::Length(status_h),
    ])
    .areas(area);
    if let Some(b) = &view.chrome.banner {
        put_rows(
            buf,
            banner,
            vec![Line::from(Span::styled(format!(" {b} "), theme.fg(Color::Yellow).add_modifier(Modifier::REVERSED)))],
        );
    }
    // The help is a key: exports, which have none, do not offer it.
    let help = view.chrome.mode.map(|_| Line::from(" ? help "));
    // The longest title that fits: the device goes first, then our name;
    // where the trace is and which moment stay.
    let room = (top.width as usize).saturating_sub(4 + if help.is_some() { 9 } else { 0 });
    let title = [
        format!(" gpumem-top ─ {} ─ {} ─ {} ", view.chrome.device, view.chrome.source, view.chrome.position),
        format!(" gpumem-top ─ {} ─ {} ", view.chrome.source, view.chrome.position),
        format!(" {} ─ {} ", view.chrome.source, view.chrome.position),
    ];
    let title = longest_fitting(title, room).unwrap_or_else(|| format!(" {} ", view.chrome.position));
    let inner = boxed(buf, top, Line::from(Span::styled(title, theme.bold())), help);
    render_bars(view, theme, inner, buf);

    let [map, hist] = Layout::horizontal([Constraint::Percentage(62), Constraint::Percentage(38)]).areas(middle);
    render_map(view, theme, map, buf);
    if let Some(o) = view.chrome.oom.as_ref().filter(|_| !view.sel.zoom && !view.sel.compact) {
        // Over the lower part of the map: the state is still the one the
        // request met, above it. A zoomed or compact map is the user's
        // choice to see the segments, and keeps the whole pane.
        let h = (map.height / 2).max(4).min(map.height);
        render_oom(theme, o, view.marks.meaning, Rect { y: map.bottom() - h, height: h, ..map }, buf);
    }
    render_histogram(view, theme, hist, buf);
    render_timeline(view, theme, bottom, buf);
    // A message (a written file, an alert) goes first: it matters more than
    // the key hints, which shrink to make room.
    let hints = view.chrome.mode.map(|m| crate::keys::hints_within(m, status.width as usize)).unwrap_or_default();
    let lines = if status_lines.is_empty() {
        vec![Line::from(Span::styled(hints, theme.fg(Color::DarkGray)))]
    } else if status_lines.len() == 1 {
        // One row: the message, then the two keys that always work, greyed.
        let l = &status_lines[0];
        let cut = l.len() - suffix.len().min(l.len());
        vec![Line::from(vec![
            Span::raw(l[..cut].to_string()),
            Span::styled(l[cut..].to_string(), theme.fg(Color::DarkGray)),
        ])]
    } else {
        status_lines.into_iter().map(Line::from).collect()
    };
    put_rows(buf, status, lines);
    if let (true, Some(mode)) = (view.sel.help, view.chrome.mode) {
        help_overlay(theme.color, mode, view.marks.meaning.is_some(), view.sel.help_scroll, area, buf);
    }
}

/// The OOM's request and the stack that made it, innermost first; when the
/// frames do not fit, the program's own innermost frame is kept and what is
/// left out is counted.
fn render_oom(theme: Theme, o: &parts::OomNote, meaning: Option<parts::Meaning>, area: Rect, buf: &mut Buffer) {
    ratatui_widgets::clear::Clear.render(area, buf);
    // The longest title that fits the box's top edge.
    let (size, room) = (human_bytes(o.size), (area.width as usize).saturating_sub(4));
    let title = [
        format!(" out of memory at event {}: a request of {size} on stream {} ", o.event, o.stream),
        format!(" OOM at event {}: {size} on stream {} ", o.event, o.stream),
        format!(" OOM at event {}: {size} ", o.event),
        format!(" OOM: {size} "),
    ];
    let title = longest_fitting(title, room).unwrap_or_default();
    let title = Line::from(Span::styled(title, theme.fg(Color::Red).add_modifier(Modifier::BOLD)));
    let inner = boxed(buf, area, title, None);
    // The checked advice is the last row at any size; what held the memory
    // when the request failed is the first where a frame fits besides.
    let advice = o.advice.as_deref().filter(|_| inner.height >= 1);
    let held = meaning
        .filter(|m| m.evidence() != Evidence::None)
        .filter(|_| inner.height as usize >= 2 + usize::from(advice.is_some()));
    let rows = (inner.height as usize).saturating_sub(usize::from(advice.is_some()) + usize::from(held.is_some()));
    let mut lines: Vec<Line> = oom_stack_rows(o.frames, rows)
        .into_iter()
        .map(|r| match r {
            StackRow::Frame(i) => Line::from(format!(" {}", crate::analysis::frame_label(&o.frames[i]))),
            StackRow::Skipped(n) => Line::from(Span::styled(
                format!(" … {}", crate::analysis::count(n, "frame")),
                theme.fg(Color::DarkGray),
            )),
            StackRow::None => Line::from(Span::styled(" no Python frames recorded for it", theme.fg(Color::DarkGray))),
        })
        .collect();
    if let Some(m) = held {
        lines.insert(0, Line::from(held_text(&m.bytes(), inner.width as usize)));
    }
    if let Some(a) = advice {
        lines.resize(inner.height as usize - 1, Line::default());
        lines.push(Line::from(Span::styled(format!(" ⇒ {a}"), theme.fg(Color::Green).add_modifier(Modifier::BOLD))));
    }
    put_rows(buf, inner, lines);
}

/// " held: activations 5.21 GiB (66%), …": as many whole categories as fit
/// (two at least), else the bars' letters ("held: A 5.2G O 1.3G …"):
/// nothing is cut mid-word.
fn held_text(bytes: &CategoryBytes, width: usize) -> String {
    let full = format!(" held: {}", bytes.describe());
    if full.chars().count() <= width {
        return full;
    }
    // As many whole categories as fit with "…" after them, the largest
    // first; else the letters.
    let parts = bytes.parts();
    for k in (2..parts.len()).rev() {
        let cut = format!(" held: {}, …", parts[..k].join(", "));
        if cut.chars().count() <= width {
            return cut;
        }
    }
    let mut o = " held:".to_string();
    for (c, b) in bytes.largest_first() {
        let part = format!(" {} {}", category_letter(c), short_bytes(b));
        if o.chars().count() + part.chars().count() > width {
            break;
        }
        o.push_str(&part);
    }
    o
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StackRow {
    Frame(usize),
    /// This many frames left out here.
    Skipped(usize),
    None,
}

/// Which of `frames` fit in `rows`: the innermost ones, then (when it is
/// further out) the program's own innermost frame, with what was left out
/// counted where it was left out.
fn oom_stack_rows(frames: &[Frame], rows: usize) -> Vec<StackRow> {
    if rows == 0 {
        return Vec::new();
    }
    if frames.is_empty() {
        return vec![StackRow::None];
    }
    if frames.len() <= rows {
        return (0..frames.len()).map(StackRow::Frame).collect();
    }
    match crate::analysis::script_frame(frames) {
        // The program's frame comes after those shown: keep it, and say
        // how many were skipped before and after it.
        Some(k) if k + 1 > rows.saturating_sub(1) && rows >= 4 => {
            let after = frames.len() - k - 1;
            let tail = if after > 0 { 1 } else { 0 };
            let head = rows - 2 - tail;
            let mut v: Vec<StackRow> = (0..head).map(StackRow::Frame).collect();
            v.push(StackRow::Skipped(k - head));
            v.push(StackRow::Frame(k));
            if after > 0 {
                v.push(StackRow::Skipped(after));
            }
            v
        }
        _ => {
            let mut v: Vec<StackRow> = (0..rows - 1).map(StackRow::Frame).collect();
            v.push(StackRow::Skipped(frames.len() - (rows - 1)));
            v
        }
    }
}

fn bar_line(label: &str, value: u64, scale: u64, width: usize, tail: String, style: Style) -> Line<'static> {
    let eighths = if scale == 0 { 0 } else { (value as u128 * width as u128 * 8 / scale as u128) as usize };
    let full = (eighths / 8).min(width);
    let part = if full < width { eighths % 8 } else { 0 };
    let mut bar: String = "█".repeat(full);
    if part > 0 {
        bar.push([' ', '▏', '▎', '▍', '▌', '▋', '▊', '▉'][part]);
    }
    let pad = width.saturating_sub(full + usize::from(part > 0));
    Line::from(vec![
        Span::raw(format!(" {label:<10}")),
        Span::styled(bar, style),
        Span::raw(" ".repeat(pad)),
        Span::raw(tail),
    ])
}

fn render_bars(view: &View, theme: Theme, area: Rect, buf: &mut Buffer) {
    let scale = view
        .totals
        .device_memory
        .map(|(_, t, _)| t)
        .or(view.totals.capacity.map(|c| c.0))
        .unwrap_or(view.totals.reserved_peak)
        .max(view.totals.reserved_peak)
        .max(1);
    let width = (area.width as usize).saturating_sub(56).max(10);
    let gap = view.totals.reserved.saturating_sub(view.totals.allocated);
    let pct = |a: u64, b: u64| if b == 0 { 0.0 } else { 100.0 * a as f64 / b as f64 };
    let split = view.marks.meaning.filter(|m| m.evidence() != Evidence::None).map(|m| m.bytes());
    let allocated_bar = match split {
        Some(b) => category_bar(
            &b,
            scale,
            width,
            peak_text(view.totals.allocated, view.totals.allocated_peak, view.peaks_known),
            theme,
        ),
        None => bar_line(
            "allocated",
            view.totals.allocated,
            scale,
            width,
            peak_text(view.totals.allocated, view.totals.allocated_peak, view.peaks_known),
            theme.fg(Color::Green),
        ),
    };
    let mut lines = vec![
        allocated_bar,
        bar_line(
            "reserved",
            view.totals.reserved,
            scale,
            width,
            peak_text(view.totals.reserved, view.totals.reserved_peak, view.peaks_known),
            theme.fg(Color::Blue),
        ),
    ];
    let ratio = if !view.peaks_known {
        "n/a (no peaks in the snapshot)".to_string()
    } else {
        format!("{:.4}", crate::analysis::peak_ratio_of(view.totals.allocated_peak, view.totals.reserved_peak))
    };
    let unallocated = format!(
        " reserved but unallocated {} ({:.1}% of reserved)   peak_ratio {ratio}",
        human_bytes(gap),
        pct(gap, view.totals.reserved),
    );
    let w = area.width as usize;
    // Four rows where the third is a sentence (no device bar): the legend
    // of the bars' letters takes its place, and what the bars are scaled
    // to shrinks into the unallocated row where it fits.
    let fold = area.height < 5 && view.totals.device_memory.is_none();
    let what = if area.height >= 5 || fold {
        if let Some(m) = view.marks.meaning {
            Some(category_line(&m.bytes(), m.evidence(), theme, w))
        } else {
            view.totals.step_categories.map(|(b, step)| step_category_line(&b, step, theme, w))
        }
    } else {
        None
    };
    match view.totals.device_memory {
        Some((used, total, by)) => {
            lines.push(bar_line(
                "device",
                used,
                scale,
                width,
                format!(" {:>11} / {} ({by})", human_bytes(used), human_bytes(total)),
                theme.fg(Color::Cyan),
            ));
            lines.push(Line::from(unallocated));
        }
        None => {
            let (words, sentence) = capacity_text(view.totals.capacity);
            let short = format!(
                " unallocated {} ({:.1}%)   peak_ratio {ratio}   bars: {words}",
                human_bytes(gap),
                pct(gap, view.totals.reserved)
            );
            if fold && what.is_some() {
                lines.push(Line::from(if short.chars().count() <= w { short } else { unallocated }));
            } else {
                lines.push(Line::from(sentence));
                lines.push(Line::from(unallocated));
            }
        }
    }
    lines.extend(what);
    put_rows(buf, area, lines);
}

/// What the bars are scaled to where no device bar says it: a few words
/// ("limit 8.39 GiB") and the sentence of a header row.
fn capacity_text(capacity: Option<(u64, parts::ScaleBy)>) -> (String, String) {
    use parts::ScaleBy;
    let Some((bytes, what)) = capacity else {
        return (
            "device (no NVML reading for this source)".into(),
            " device     (no NVML reading for this source)".into(),
        );
    };
    let b = human_bytes(bytes);
    match what {
        ScaleBy::Limit => {
            (format!("limit {b}"), format!(" limit     {b}: the per-process memory limit, the bars' full width"))
        }
        ScaleBy::Snapshot => {
            (format!("scale {b}"), format!(" scale     {b}: the snapshot's reserved, the bars' full width"))
        }
        ScaleBy::Peak => {
            (format!("scale {b}"), format!(" scale     {b}: the trace's peak reserved, the bars' full width"))
        }
        ScaleBy::Device => {
            (format!("device {b}"), format!(" device    {b}: its memory, the bars' full width (no NVML reading here)"))
        }
    }
}

/// Live: " at step 12's end  P params 313M  G grads 313M  O optim 626M  ░ rest 2.1G":
/// what the optimizer held, from the publisher.
fn step_category_line(bytes: &CategoryBytes, step: u64, theme: Theme, width: usize) -> Line<'static> {
    let mut spans = vec![Span::raw(format!(" at step {step}'s end "))];
    for c in [Category::Parameter, Category::Gradient, Category::OptimizerState, Category::Unknown] {
        let (label, glyph) = match c {
            Category::Unknown => ("rest", '░'),
            _ => (c.label(), if theme.color { '█' } else { category_letter(c) }),
        };
        spans.push(Span::styled(glyph.to_string(), theme.fg(category_color(c))));
        spans.push(Span::raw(format!(" {label} {}  ", short_bytes(bytes.get(c)))));
    }
    let mut line = Line::from(spans);
    if line.width() > width {
        line = Line::from(format!(
            " step {step}: params {} grads {} optim {}",
            short_bytes(bytes.get(Category::Parameter)),
            short_bytes(bytes.get(Category::Gradient)),
            short_bytes(bytes.get(Category::OptimizerState))
        ));
    }
    line
}

/// Whether the bars' box has the line saying what the memory is: with
/// categories, on a screen taller than the smallest.
fn what_line(view: &View, height: u16) -> bool {
    (view.marks.meaning.is_some() || view.totals.step_categories.is_some()) && height > MIN_HEIGHT
}

/// The allocated bar in one colour per category, in `Category::ALL` order.
fn category_bar(bytes: &CategoryBytes, scale: u64, width: usize, tail: String, theme: Theme) -> Line<'static> {
    let mut spans = vec![Span::raw(format!(" {:<10}", "allocated"))];
    let cells = |b: u64| if scale == 0 { 0 } else { (b as u128 * width as u128 / scale as u128) as usize };
    let (mut used, mut sum) = (0usize, 0u64);
    for c in Category::ALL {
        let b = bytes.get(c);
        if b == 0 {
            continue;
        }
        // Cumulative, so rounding never adds up past the total's cells.
        sum = sum.saturating_add(b);
        let n = cells(sum).min(width).saturating_sub(used);
        used += n;
        let glyph = if theme.color { '█' } else { category_letter(c) };
        spans.push(Span::styled(glyph.to_string().repeat(n), theme.fg(category_color(c))));
    }
    spans.push(Span::raw(" ".repeat(width - used)));
    spans.push(Span::raw(tail));
    Line::from(spans)
}

/// " what it is  █ activ 2.9 GiB  █ temp 1.6 GiB …": the categories of
/// what is allocated, largest first, as many as fit.
fn category_line(bytes: &CategoryBytes, evidence: Evidence, theme: Theme, width: usize) -> Line<'static> {
    let mut spans = vec![Span::raw(" what it is ")];
    if evidence == Evidence::None {
        spans.push(Span::styled(
            "unknown: no call stacks and no optimizer markers in this trace",
            theme.fg(Color::DarkGray),
        ));
        return Line::from(spans);
    }
    let mut used = 12;
    for (c, b) in bytes.largest_first() {
        let text = format!(" {} {}  ", c.label(), short_bytes(b));
        if used + 1 + text.chars().count() > width {
            break;
        }
        used += 1 + text.chars().count();
        let glyph = if theme.color { '█' } else { category_letter(c) };
        spans.push(Span::styled(glyph.to_string(), theme.fg(category_color(c))));
        spans.push(Span::raw(text));
    }
    Line::from(spans)
}

fn render_map(view: &View, theme: Theme, area: Rect, buf: &mut Buffer) {
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
fn category_legend(theme: Theme, evidence: Evidence, width: usize) -> Line<'static> {
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
const ROW_LABEL: usize = 23;

/// Whether rows to one scale (the largest segment's) read well: most
/// segments still get enough cells to show their blocks. Segments of very
/// different sizes (2 MiB beside 1.5 GiB) read better stretched, each to the
/// width, and the title says which is shown.
pub(crate) fn rows_to_scale(segs: &[SegmentInfo], cells: usize) -> bool {
    let max = segs.iter().map(|s| s.total_size).max().unwrap_or(0).max(1);
    let readable = segs.iter().filter(|s| s.total_size as u128 * cells as u128 >= 8 * max as u128).count();
    !segs.is_empty() && 2 * readable >= segs.len()
}

fn render_rows(view: &View, theme: Theme, segs: &[&SegmentInfo], scaled: bool, inner: Rect, buf: &mut Buffer) {
    let label_w = ROW_LABEL;
    let cells_w = (inner.width as usize).saturating_sub(label_w + 1);
    let max = view.segments.iter().map(|s| s.total_size).max().unwrap_or(0).max(1);
    let rows = inner.height as usize - 1;
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
        // Cells are written directly: set_string would segment graphemes
        // for every one-glyph string, most of a frame's cost.
        let x0 = inner.x + label_w as u16 + 1;
        if buf.area.contains(ratatui_core::layout::Position { x: x0, y }) {
            let row = buf.index_of(x0, y);
            let room = (buf.area.right() - x0) as usize;
            // To scale: the largest segment is the full width.
            let n = if scaled {
                ((seg.total_size as u128 * cells_w as u128).div_ceil(max as u128) as usize).max(1)
            } else {
                cells_w
            };
            for (cell, (glyph, style)) in buf.content[row..].iter_mut().zip(map_cells(view, theme, seg, n.min(room))) {
                cell.set_char(glyph).set_style(style);
            }
        }
    }
}

/// One glyph into one cell (no-op outside the buffer).
fn put(buf: &mut Buffer, x: u16, y: u16, glyph: char, style: Style) {
    if let Some(cell) = buf.cell_mut((x, y)) {
        cell.set_char(glyph).set_style(style);
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

fn render_compact(view: &View, theme: Theme, segs: &[&SegmentInfo], area: Rect, buf: &mut Buffer) {
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

/// " 1.46 GiB   peak 3.82 GiB", or "peak unknown" where the file has none.
/// Sizes take 11 columns, the widest `human_bytes` ("1016.00 MiB"), so the
/// columns stay put as the figures change.
fn peak_text(now: u64, peak: u64, known: bool) -> String {
    if known {
        format!(" {:>11}   peak {:>11}", human_bytes(now), human_bytes(peak))
    } else {
        format!(" {:>11}   peak not in the snapshot", human_bytes(now))
    }
}

/// The segments in the view's order.
pub(crate) fn ordered<'v>(view: &View<'v>) -> Vec<&'v SegmentInfo> {
    ordered_indices(view.segments, view.sel.order).into_iter().map(|i| &view.segments[i]).collect()
}

fn render_zoom(view: &View, theme: Theme, seg: &SegmentInfo, area: Rect, buf: &mut Buffer) {
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

/// The histogram's two lines of fragmentation figures: in full, or by
/// their short names where they do not fit in `w` columns.
fn fragmentation_lines(f: &Fragmentation, w: usize) -> [Line<'static>; 2] {
    let full = [
        format!(
            "largest free {}  external_fragmentation {:.2}",
            human_bytes(f.largest_free_block_bytes),
            f.external_fragmentation
        ),
        format!(
            "inactive_split {}  rounding_waste {}",
            human_bytes(f.inactive_split_bytes),
            human_bytes(f.rounding_waste_bytes)
        ),
    ];
    if full.iter().all(|l| l.chars().count() <= w) {
        return full.map(Line::from);
    }
    [
        Line::from(format!(
            "largest free {} ext {:.2}",
            short_bytes(f.largest_free_block_bytes),
            f.external_fragmentation
        )),
        Line::from(format!(
            "split {} waste {}",
            short_bytes(f.inactive_split_bytes),
            short_bytes(f.rounding_waste_bytes)
        )),
    ]
}

fn render_histogram(view: &View, theme: Theme, area: Rect, buf: &mut Buffer) {
    let (long, short) = if view.sel.hist_bytes {
        (" Block sizes ─ bytes (b: counts) ", " Sizes ─ bytes ")
    } else {
        (" Block sizes ─ counts (b: bytes) ", " Sizes ─ counts ")
    };
    let title = longest_fitting([long, short], (area.width as usize).saturating_sub(2)).unwrap_or(short);
    let inner = boxed(buf, area, Line::from(title), None);
    // Below 36 columns the bars go and the figures stay.
    let bars = inner.width >= 36;
    let f = &view.fragmentation;
    let mut lines = Vec::new();
    let bytes = view.sel.hist_bytes;
    let alloc = |b: &SizeBucket| if bytes { b.allocated_bytes } else { b.allocated_count };
    let free = |b: &SizeBucket| if bytes { b.free_bytes } else { b.free_count };
    let figure = |n: u64| if view.sel.hist_bytes { short_bytes(n) } else { n.to_string() };
    // Where the live bytes came from, when the source recorded stacks: the
    // question that follows "why is this so big?".
    let sites = if view.chrome.stacks.is_empty() {
        Vec::new()
    } else {
        crate::analysis::live_by_call_site(view.segments, view.chrome.stacks, crate::analysis::call_site)
    };
    // The sizes that hold any block.
    let mut shown: Vec<SizeBucket> =
        view.histogram.iter().filter(|b| b.allocated_count + b.free_count > 0).copied().collect();
    let shown_n = shown.len();
    let height = inner.height as usize;
    // The column heads take a row and the two figure lines two more; the
    // call sites (a heading and at least two) get what the sizes leave, a
    // third of the pane at least, but never push the sizes below two rows.
    let fixed = 3;
    let spare = height.saturating_sub(fixed + shown_n.min(2));
    let site_rows = if sites.is_empty() || spare < 3 {
        0
    } else {
        (sites.len() + 1).min(height.saturating_sub(fixed + shown_n).max(height / 3)).clamp(3, spare)
    };
    let rows = height.saturating_sub(fixed + site_rows);
    // Too many sizes for the rows: the smallest fold into the first row
    // shown, whose "≤" label then covers them all (nothing is dropped).
    let skip = shown.len().saturating_sub(rows.max(1));
    if skip > 0 {
        let merged =
            shown[..=skip].iter().fold(SizeBucket { hi: shown[skip].hi, ..Default::default() }, |m, b| SizeBucket {
                hi: m.hi,
                allocated_count: m.allocated_count + b.allocated_count,
                allocated_bytes: m.allocated_bytes + b.allocated_bytes,
                free_count: m.free_count + b.free_count,
                free_bytes: m.free_bytes + b.free_bytes,
            });
        shown[skip] = merged;
    }
    let max = shown.iter().map(|b| alloc(b).max(free(b))).max().unwrap_or(0).max(1);
    let spark = |n: u64| -> String {
        let w = ((n as f64 / max as f64) * 8.0).ceil() as usize;
        "▇".repeat(w.min(8))
    };
    let head = if bars {
        format!("{:<7}{:>14} {:>14}", "size", "allocated", "free")
    } else {
        format!("{:<7}{:>9} {:>6}", "size", "allocated", "free")
    };
    lines.push(Line::from(Span::styled(head, theme.fg(Color::DarkGray))));
    for b in shown.iter().skip(skip) {
        lines.push(if bars {
            Line::from(vec![
                Span::raw(format!("≤{:<6}", short_bytes(b.hi))),
                Span::styled(format!("{:<8}", spark(alloc(b))), theme.fg(Color::Green)),
                Span::raw(format!("{:>6} ", figure(alloc(b)))),
                Span::styled(format!("{:<8}", spark(free(b))), theme.fg(Color::Red)),
                Span::raw(format!("{:>6}", figure(free(b)))),
            ])
        } else {
            Line::from(vec![
                Span::raw(format!("≤{:<6}", short_bytes(b.hi))),
                Span::styled(format!("{:>9} ", figure(alloc(b))), theme.fg(Color::Green)),
                Span::styled(format!("{:>6}", figure(free(b))), theme.fg(Color::Red)),
            ])
        });
    }
    let w = inner.width as usize;
    lines.extend(fragmentation_lines(f, w));
    if site_rows >= 3 {
        // A blank line before the sites where the pane has room for it.
        if height > fixed + rows.min(shown.len()) + site_rows {
            lines.push(Line::from(""));
        }
        lines.push(Line::from(Span::styled("live bytes by call site", theme.bold())));
        for (site, bytes, n) in sites.iter().take(site_rows - 1) {
            if !bars {
                // Narrow: the bytes and the line of code, not the count.
                lines.push(Line::from(ellipsis(format!("{:>5} {site}", short_bytes(*bytes)), w)));
                continue;
            }
            lines.push(Line::from(ellipsis(format!("{:>6} ×{:<3} {site}", short_bytes(*bytes), n), w)));
        }
    }
    put_rows(buf, inner, lines);
}

/// The first of `candidates` (longest first) that fits in `room` columns:
/// a line that cannot show everything says less instead of being cut.
fn longest_fitting<S: AsRef<str>>(candidates: impl IntoIterator<Item = S>, room: usize) -> Option<S> {
    candidates.into_iter().find(|t| t.as_ref().chars().count() <= room)
}

/// `s` in `width` columns: cut with "…" at the end where it does not fit,
/// so a cut line says so.
pub(crate) fn ellipsis(s: String, width: usize) -> String {
    if s.chars().count() <= width || width == 0 {
        return s;
    }
    let mut t: String = s.chars().take(width - 1).collect();
    t.push('…');
    t
}

/// The points of a polyline without the inner points of its horizontal
/// runs: the canvas paints the same dots for one long flat segment as for
/// its pieces, and a steady reserved line is one run, not hundreds.
fn flat_runs_joined(pts: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(pts.len());
    for (i, &p) in pts.iter().enumerate() {
        let inner = i > 0 && i + 1 < pts.len() && pts[i - 1].1 == p.1 && pts[i + 1].1 == p.1;
        if !inner {
            out.push(p);
        }
    }
    out
}

fn render_timeline(view: &View, theme: Theme, area: Rect, buf: &mut Buffer) {
    let n = view.marks.timeline.len();
    let focus = if view.sel.focus == Focus::Timeline { theme.bold() } else { Style::default() };
    let title = timeline_title(view);
    // A per-process limit is drawn as a line, so the scale reaches it.
    let limit = view.totals.capacity.filter(|c| c.1 == parts::ScaleBy::Limit).map(|c| c.0);
    let top =
        view.marks.timeline.iter().map(|p| p.reserved.max(p.allocated)).max().unwrap_or(0).max(limit.unwrap_or(0));
    let room = (area.width as usize).saturating_sub(title.chars().count() + 4);
    let key = timeline_key(view, theme, room, limit, top);
    let inner = boxed(buf, area, Line::from(Span::styled(title, focus)), key);
    if n == 0 && inner.height > 0 {
        let note = "no timeline: the snapshot was taken without memory history (_record_memory_history), so it holds the state when it was taken and no events";
        put_row(buf, inner.x, inner.y, inner.width, Line::from(note));
    }
    if n == 0 || inner.width < 4 || inner.height < 2 {
        return;
    }
    let plot = Rect { height: inner.height - 1, ..inner };
    // With iterations, the plot's top row holds the peaks' labels and the
    // lines stay below it, so no label covers a line.
    let label_row = !view.marks.iterations.is_empty() && plot.height >= 3;
    let data_top = top.max(1) as f64;
    let ymax = if label_row { data_top * plot.height as f64 / (plot.height - 1) as f64 } else { data_top };
    // The braille column of point i: by event, or by time on a live clock.
    let times = view.marks.clock.map(|c| c.times).filter(|t| t.len() == n);
    let span = times.map_or(1.0, |t| (t[n - 1] - t[0]).max(1e-9));
    let cols = Columns { n, cols: (plot.width as usize) * 2, times, span };
    let (alloc, reserved) = series_points(view, &cols);
    let stacked = stacked_lines(view, &cols);
    let labels = peak_labels(view, &cols, plot.width as usize, if label_row { Some(ymax) } else { None });
    let plotted = Plotted { alloc, reserved, stacked, labels, limit, ymax };
    plotted.canvas(view, theme, &cols).render(plot, buf);
    let axis = timeline_footer(view, times, inner.width as usize);
    buf.set_stringn(inner.x, inner.y + inner.height - 1, axis, inner.width as usize, theme.fg(Color::DarkGray));
}

/// "Timeline ─ allocated / reserved ─ peak … @ event N (iteration K)".
fn timeline_title(view: &View) -> String {
    let n = view.marks.timeline.len();
    let peak = view.marks.peak_at.and_then(|p| view.marks.timeline.get(p).map(|v| (p, v.allocated)));
    let t0 = view.marks.clock.and_then(|c| c.times.first().copied()).unwrap_or(0.0);
    let title = match peak {
        Some((p, v)) if view.marks.clock.is_some() => {
            let at = view.marks.clock.and_then(|c| c.times.get(p).copied()).unwrap_or(t0);
            let step = if view.marks.iterations.is_empty() {
                String::new()
            } else {
                format!(", step {}", view.marks.iterations.partition_point(|&m| m < p) + 1)
            };
            format!(" Timeline ─ allocated / reserved ─ peak {} at {}{step} ", human_bytes(v), duration(at - t0))
        }
        // A run's timeline keeps its latest events only: its peak is the
        // shown window's, which the bars' all-time peak may exceed.
        Some((p, v)) if view.marks.first_event > 0 => {
            let u = view.marks.unit;
            format!(" Timeline ─ last {n} {u}s ─ peak in view {} @ {u} {} ", human_bytes(v), p + view.marks.first_event)
        }
        Some((p, v)) if !view.marks.iterations.is_empty() => format!(
            " Timeline ─ allocated / reserved ─ peak {} @ {} {p} (iteration {}) ",
            human_bytes(v),
            view.marks.unit,
            view.marks.iterations.partition_point(|&m| m <= p) + 1
        ),
        Some((p, v)) => {
            format!(" Timeline ─ allocated / reserved ─ peak {} @ {} {p} ", human_bytes(v), view.marks.unit)
        }
        None => " Timeline ─ allocated / reserved ".to_string(),
    };
    title
}

/// The scale and which line is which (reserved is never below allocated,
/// so without colour it is the upper line): what fits in `room` beside
/// the title of the scale, the key and the limit line's, or none.
fn timeline_key(view: &View, theme: Theme, room: usize, limit: Option<u64>, top: u64) -> Option<Line<'static>> {
    let n = view.marks.timeline.len();
    // The limit is the scale's top when the run kept under it.
    let scale = match limit {
        Some(l) if l == top => format!(" 0–{} ┄ the limit ", short_bytes(top)),
        _ => format!(" 0–{} ", short_bytes(top)),
    };
    let long = " ━ allocated under ━ reserved ";
    let limit_key = match limit {
        Some(l) if l != top => format!("┄ limit {} ", short_bytes(l)),
        _ => String::new(),
    };
    let (scale_w, long_w, limit_w) = (scale.chars().count(), long.chars().count(), limit_key.chars().count());
    // What fits beside the title: scale and key (with the limit line's),
    // the scale and the limit, the scale, or nothing.
    let key = match n {
        0 => None,
        _ if stacked_meaning(view).is_some() && scale_w + 36 <= room => Some(Line::from(vec![
            Span::raw(format!("{}─", scale)),
            Span::raw(" allocated stacked by category "),
            Span::styled("━ reserved ", theme.fg(Color::Blue)),
        ])),
        _ if scale_w + long_w + limit_w <= room => Some(Line::from(vec![
            Span::raw(format!("{}─", scale)),
            Span::styled(" ━ allocated", theme.fg(Color::Green)),
            Span::raw(" under "),
            Span::styled("━ reserved ", theme.fg(Color::Blue)),
            Span::styled(limit_key, theme.fg(Color::Red)),
        ])),
        _ if scale_w + limit_w <= room => {
            Some(Line::from(vec![Span::raw(scale), Span::styled(limit_key, theme.fg(Color::Red))]))
        }
        _ if scale_w <= room => Some(Line::from(scale)),
        _ => None,
    };
    key
}

/// A point of the plot: braille column, bytes.
type Point = (f64, f64);

/// Where points go across the plot: by event, or by time on a live clock.
struct Columns<'t> {
    /// Points.
    n: usize,
    /// Braille columns.
    cols: usize,
    times: Option<&'t [f64]>,
    span: f64,
}

impl Columns<'_> {
    /// The braille column of point `i`.
    fn col(&self, i: usize) -> f64 {
        let i = i.min(self.n - 1);
        match self.times {
            Some(t) => (((t[i] - t[0]) / self.span * self.cols as f64) as usize).min(self.cols - 1) as f64,
            None => (i * self.cols / self.n) as f64,
        }
    }
}

/// Per braille column, the highest value of each series in its points; on
/// a clock a column without points holds the value before it.
fn series_points(view: &View, c: &Columns) -> (Vec<Point>, Vec<Point>) {
    let (n, cols, times) = (c.n, c.cols, c.times);
    let col = |i| c.col(i);
    let mut alloc_pts = Vec::with_capacity(cols);
    let mut resv_pts = Vec::with_capacity(cols);
    if times.is_some() {
        let mut cells: Vec<Option<(u64, u64)>> = vec![None; cols];
        for (i, p) in view.marks.timeline.iter().enumerate() {
            let c = &mut cells[col(i) as usize];
            *c = Some(c.map_or((p.allocated, p.reserved), |(a, r)| (a.max(p.allocated), r.max(p.reserved))));
        }
        let mut held = (0, 0);
        for (c, cell) in cells.into_iter().enumerate() {
            held = cell.unwrap_or(held);
            alloc_pts.push((c as f64, held.0 as f64));
            resv_pts.push((c as f64, held.1 as f64));
        }
    } else {
        for c in 0..cols {
            let lo = c * n / cols;
            let hi = ((c + 1) * n / cols).max(lo + 1).min(n);
            let slice = &view.marks.timeline[lo..hi];
            let a = slice.iter().map(|p| p.allocated).max().unwrap_or(0) as f64;
            let r = slice.iter().map(|p| p.reserved).max().unwrap_or(0) as f64;
            alloc_pts.push((c as f64, a));
            resv_pts.push((c as f64, r));
        }
    }
    (flat_runs_joined(&alloc_pts), flat_runs_joined(&resv_pts))
}

/// The categories the timeline stacks, where `w` asks for them and their
/// history is kept (a running synthetic run keeps none: its map alone).
fn stacked_meaning<'v>(view: &View<'v>) -> Option<parts::Meaning<'v>> {
    view.sel.color_by.meaning(view.marks.meaning).filter(|m| m.keeps_history())
}

/// By category: each column's most allocated point, stacked in
/// `Category::ALL` order (the top line is allocated); none unless asked.
fn stacked_lines(view: &View, c: &Columns) -> Vec<(Color, Vec<(f64, f64)>)> {
    let (n, cols, times) = (c.n, c.cols, c.times);
    let stacked: Vec<(Color, Vec<(f64, f64)>)> = match stacked_meaning(view).filter(|_| times.is_none()) {
        Some(m) => {
            let mut lines: Vec<Vec<(f64, f64)>> = vec![Vec::with_capacity(cols); Category::ALL.len()];
            for c in 0..cols {
                let lo = c * n / cols;
                let hi = ((c + 1) * n / cols).max(lo + 1).min(n);
                let top =
                    (lo..hi).max_by_key(|&i| (view.marks.timeline[i].allocated, std::cmp::Reverse(i))).unwrap_or(lo);
                let b = m.bytes_after(top + view.marks.first_event).unwrap_or_default();
                let mut sum = 0u64;
                for (k, cat) in Category::ALL.into_iter().enumerate() {
                    sum += b.get(cat);
                    lines[k].push((c as f64, sum as f64));
                }
            }
            Category::ALL
                .into_iter()
                .zip(lines)
                .filter(|(_, l)| l.windows(2).any(|w| w[0] != w[1]) || l.iter().any(|p| p.1 > 0.0))
                .map(|(cat, l)| (category_color(cat), flat_runs_joined(&l)))
                .collect()
        }
        None => Vec::new(),
    };
    stacked
}

/// Per-iteration peaks, labelled highest first where the labels do not
/// overlap, so the global peak always gets its label: on the plot's top
/// row (`top_row`, its height) or at the peak.
fn peak_labels(view: &View, c: &Columns, width: usize, top_row: Option<f64>) -> Vec<(f64, f64, String)> {
    let mut labels: Vec<(f64, f64, String)> = Vec::new();
    if !view.marks.iterations.is_empty() {
        let mut peaks = crate::analysis::iteration_peaks(view.marks.timeline, view.marks.iterations);
        peaks.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut taken: Vec<(usize, usize)> = Vec::new();
        let mut said: std::collections::HashSet<String> = std::collections::HashSet::new();
        for (i, v) in peaks {
            let text = format!("▲{}", short_bytes(v));
            // Past the top few, a peak the same as one labelled already says
            // nothing new: a long run of equal iterations gets a few labels,
            // not a row of them.
            if labels.len() >= TOP_LABELS && said.contains(&text) {
                continue;
            }
            let w = text.chars().count();
            let cell = (c.col(i) as usize / 2).min(width.saturating_sub(w));
            if taken.iter().all(|&(a, b)| cell + w < a || cell > b) {
                said.insert(text.clone());
                taken.push((cell, cell + w));
                labels.push(((cell * 2) as f64, top_row.unwrap_or(v as f64), text));
            }
        }
    }
    labels
}

/// Iteration peaks labelled whatever their value; past them, only values
/// not labelled yet.
const TOP_LABELS: usize = 3;

/// The least distance between two iteration ticks drawn, in the canvas's
/// units (two a cell): four cells, so that the canvas's rounding of where
/// text lands never leaves fewer than three.
const TICK_SPACING: f64 = 8.0;

/// What the timeline's plot draws.
struct Plotted {
    alloc: Vec<(f64, f64)>,
    reserved: Vec<(f64, f64)>,
    stacked: Vec<(Color, Vec<(f64, f64)>)>,
    labels: Vec<(f64, f64, String)>,
    limit: Option<u64>,
    ymax: f64,
}

impl Plotted {
    /// The series, the limit, the cursor and the marks on a braille canvas.
    fn canvas<'p>(
        &'p self,
        view: &'p View,
        theme: Theme,
        c: &Columns,
    ) -> Canvas<'p, impl Fn(&mut ratatui_widgets::canvas::Context) + 'p> {
        let cols = c.cols;
        let cursor_x = c.col(view.marks.cursor);
        let marks: Vec<f64> = view.marks.ooms.iter().map(|&o| c.col(o)).collect();
        let cleared: Vec<f64> = view.marks.empty_caches.iter().map(|&e| c.col(e)).collect();
        // Iteration ends at least three cells apart: denser, they are a comb
        // (the title counts them all).
        let mut iters: Vec<f64> = Vec::new();
        for x in view.marks.iterations.iter().map(|&e| c.col(e)) {
            if iters.last().is_none_or(|&l| x - l >= TICK_SPACING) {
                iters.push(x);
            }
        }
        let (ymax, limit) = (self.ymax, self.limit);
        let (resv_pts, alloc_pts, stacked, labels) = (&self.reserved, &self.alloc, &self.stacked, &self.labels);
        Canvas::default().marker(Marker::Braille).x_bounds([0.0, cols as f64]).y_bounds([0.0, ymax]).paint(move |ctx| {
            for w in resv_pts.windows(2) {
                ctx.draw(&CanvasLine::new(
                    w[0].0,
                    w[0].1,
                    w[1].0,
                    w[1].1,
                    if theme.color { Color::Blue } else { Color::Reset },
                ));
            }
            if stacked.is_empty() {
                for w in alloc_pts.windows(2) {
                    ctx.draw(&CanvasLine::new(
                        w[0].0,
                        w[0].1,
                        w[1].0,
                        w[1].1,
                        if theme.color { Color::Green } else { Color::Reset },
                    ));
                }
            }
            for (color, pts) in stacked {
                for w in pts.windows(2) {
                    let color = if theme.color { *color } else { Color::Reset };
                    ctx.draw(&CanvasLine::new(w[0].0, w[0].1, w[1].0, w[1].1, color));
                }
            }
            if let Some(l) = limit {
                // Dashed, so it does not read as a series.
                let mut x = 0.0;
                while x < cols as f64 {
                    let end = (x + 3.0).min(cols as f64);
                    ctx.draw(&CanvasLine::new(x, l as f64, end, l as f64, Color::Red));
                    x += 6.0;
                }
            }
            ctx.draw(&CanvasLine::new(
                cursor_x,
                0.0,
                cursor_x,
                ymax,
                if theme.color { Color::Yellow } else { Color::Reset },
            ));
            for &x in &iters {
                ctx.print(x, 0.0, Span::styled("╵", theme.fg(Color::Magenta)));
            }
            for (x, y, t) in labels {
                ctx.print(*x, *y, Span::styled(t.clone(), theme.fg(Color::Magenta)));
            }
            for &x in &cleared {
                ctx.print(x, 0.0, Span::styled("E", theme.fg(Color::Cyan)));
            }
            for &x in &marks {
                // On the floor, with the step ticks: at the top an OOM
                // would cover the peak's label.
                ctx.print(x, 0.0, Span::styled("✗", theme.fg(Color::Red)));
            }
        })
    }
}

/// The line under the plot: the cursor's (or now's) figures and the marks'
/// counts, the longest that fits in `width`.
fn timeline_footer(view: &View, times: Option<&[f64]>, width: usize) -> String {
    let n = view.marks.timeline.len();
    let axis = match (view.marks.clock, times) {
        (Some(c), Some(t)) => {
            let at = if c.recorded { view.marks.cursor.min(n - 1) } else { n - 1 };
            let p = &view.marks.timeline[at];
            let when = if c.recorded {
                format!("cursor at {} of {}", duration(t[at] - t[0]), duration(t[n - 1] - t[0]))
            } else {
                format!("now (+{})", duration(t[n - 1] - t[0]))
            };
            format!(
                " {} ─── {when} ─ allocated {} ─ reserved {} ─ ✗ {} ─ ╵ {} {}",
                duration(0.0),
                human_bytes(p.allocated),
                human_bytes(p.reserved),
                crate::analysis::count(view.marks.ooms.len(), "OOM"),
                crate::analysis::count(view.marks.iterations.len(), "step"),
                if view.marks.iterations.is_empty() {
                    "(no optimizer step seen) "
                } else if c.step_peaks {
                    "▲ each step's own peak "
                } else {
                    "at their ends (no per-step peaks: run without --no-step-peaks) "
                }
            )
        }
        _ => {
            let (at, of) = (view.marks.cursor + view.marks.first_event, n + view.marks.first_event);
            let u = view.marks.unit;
            let p = &view.marks.timeline[view.marks.cursor.min(n - 1)];
            let (a, r) = (human_bytes(p.allocated), human_bytes(p.reserved));
            let (ooms, ecs, its) = (view.marks.ooms.len(), view.marks.empty_caches.len(), view.marks.iterations.len());
            // The longest that fits: every mark's count stays, in short.
            let footers = [
                format!(
                    " cursor: {u} {at} of {of} ─ allocated {a} ─ reserved {r} ─ ✗ {} ─ E {ecs} empty_cache ─ ╵ {} ▲ peaks ",
                    crate::analysis::count(ooms, "OOM"),
                    crate::analysis::count(its, "iteration")
                ),
                format!(" {u} {at}/{of} ─ allocated {a} ─ reserved {r} ─ ✗ {ooms} ─ E {ecs} ─ ╵ {its} "),
                format!(" {at}/{of} ─ {} / {} ─ ✗{ooms} E{ecs} ╵{its} ", short_bytes(p.allocated), short_bytes(p.reserved)),
            ];
            longest_fitting(footers, width).unwrap_or_default()
        }
    };
    axis
}

/// Seconds as a short duration: "42 s", "4m 12s", "2h 03m".
pub(crate) fn duration(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{}m {:02}s", s / 60, s % 60),
        _ => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
    }
}

/// `text` in lines of at most `width` characters, broken at the last
/// space that fits (its own spacing kept), the lines after the first
/// indented by `indent` (under the text of a `key  what` row).
fn wrap(text: &str, width: usize, indent: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest: String = text.to_string();
    while rest.chars().count() > width {
        let head: String = rest.chars().take(width + 1).collect();
        // A break after the indent, so that a line always advances.
        let Some(at) = head.rfind(' ').filter(|&i| i > indent) else { break };
        out.push(rest[..at].trim_end().to_string());
        rest = format!("{}{}", " ".repeat(indent), rest[at..].trim_start());
    }
    out.push(rest);
    out
}

/// The help overlay over `area`: `mode`'s keys (from the table the app
/// dispatches on) and the figures, wrapped to the overlay's width, from line
/// `scroll` on (clamped so that the last line is at the bottom); its title
/// says how to scroll when it does not fit.
pub(crate) fn help_overlay(
    color: bool,
    mode: crate::keys::Mode,
    categories: bool,
    scroll: usize,
    area: Rect,
    buf: &mut Buffer,
) {
    let theme = Theme { color };
    let w = 110.min(area.width);
    let text = (w as usize).saturating_sub(2).max(20);
    let mut lines = vec![Line::from(Span::styled("keys", theme.bold()))];
    for (k, what) in crate::keys::help_rows(mode) {
        lines.extend(wrap(&format!("{k:<12} {what}"), text, 13).into_iter().map(Line::from));
    }
    lines.push(Line::from(""));
    lines.push(Line::from(Span::styled("figures", theme.bold())));
    for (k, what) in crate::keys::FIGURES {
        lines.extend(wrap(&format!("{k:<25} {what}"), text, 26).into_iter().map(Line::from));
    }
    if categories {
        lines.push(Line::from(""));
        lines.push(Line::from(Span::styled("what the memory is (w: the map and timeline by it)", theme.bold())));
        for c in Category::ALL {
            let glyph = if theme.color { '█' } else { category_letter(c) };
            let row = wrap(&format!(" {:<16} {}", c.name(), c.meaning()), text.saturating_sub(1), 18);
            for (i, l) in row.into_iter().enumerate() {
                let mark = if i == 0 { glyph.to_string() } else { " ".into() };
                lines.push(Line::from(vec![Span::styled(mark, theme.fg(category_color(c))), Span::raw(l)]));
            }
        }
    }
    let h = (lines.len() as u16 + 2).min(area.height);
    let r = Rect { x: area.x + (area.width - w) / 2, y: area.y + (area.height - h) / 2, width: w, height: h };
    Clear.render(r, buf);
    let room = h.saturating_sub(2) as usize;
    let top = scroll.min(lines.len().saturating_sub(room));
    let title = if lines.len() > room {
        format!(
            " help ─ lines {}–{} of {} ─ ↑/↓ PgUp/PgDn scroll, q closes ",
            top + 1,
            (top + room).min(lines.len()),
            lines.len()
        )
    } else {
        " help ─ q closes ".to_string()
    };
    let inner = boxed(buf, r, Line::from(title), None);
    put_rows(buf, inner, lines.into_iter().skip(top).collect());
}

#[cfg(test)]
mod tests {
    use ratatui_core::buffer::Buffer;
    use ratatui_core::layout::Rect;
    use ratatui_core::style::{Color, Modifier, Style};
    use ratatui_core::text::{Line, Span};

    /// Our `set_line` leaves every cell as ratatui's does: ASCII, controls,
    /// wide and combining characters, lines cut at the width or at the
    /// buffer's edge, line and span styles, over cells already drawn.
    #[test]
    fn set_line_draws_what_ratatuis_draws() {
        let red = Style::default().fg(Color::Red);
        let lines = [
            Line::from("plain ascii, longer than the width of the row it is put in"),
            Line::from(vec![Span::styled("0x7f3a ", red), Span::raw(" 20.0M*"), Span::raw("█▓▒░·")]),
            Line::from(vec![Span::raw("tab\there\r\n bell\x07"), Span::styled("é e\u{301} 漢字 ok", red)]),
            Line::from(vec![Span::raw("ab"), Span::styled("漢字漢字漢字漢字漢字", red), Span::raw("cd")]),
            Line::from(vec![Span::raw("x\u{301}y"), Span::raw("")])
                .style(Style::default().add_modifier(Modifier::BOLD)),
            Line::styled("styled line, raw spans", Style::default().bg(Color::Blue)),
        ];
        let area = Rect::new(2, 1, 24, 3);
        for line in &lines {
            for (x, y, w) in [(2, 1, 24), (3, 2, 10), (20, 3, 30), (25, 1, 5), (0, 0, 5), (2, 9, 5), (4, 2, 0)] {
                let mut a = Buffer::filled(area, ratatui_core::buffer::Cell::new("#"));
                let mut b = a.clone();
                if area.contains(ratatui_core::layout::Position { x, y }) {
                    a.set_line(x, y, line, w);
                }
                super::set_line(&mut b, x, y, line, w);
                assert_eq!(a, b, "{line:?} at ({x}, {y}) width {w}");
            }
        }
        // Every character taken as one cell, alone and after each other,
        // is drawn as ratatui draws it; one that is not goes through ratatui.
        let all: String = (0..0x3000u32).filter_map(char::from_u32).filter(|&c| super::one_cell(c)).collect();
        assert_eq!(all.chars().count(), 95 + 94 + 24 + 368 + 254 + 6);
        let wide = Rect::new(0, 0, 1000, 1);
        for text in [all.clone(), all.chars().rev().collect(), format!("a{all}\u{301}"), format!("{all}☔x")] {
            let line = Line::from(vec![Span::raw("ab "), Span::styled(text.clone(), red)]);
            let mut a = Buffer::empty(wide);
            let mut b = a.clone();
            a.set_line(0, 0, &line, 1000);
            super::set_line(&mut b, 0, 0, &line, 1000);
            assert_eq!(a, b, "{text}");
        }
    }

    /// `boxed` leaves every cell as `Block::bordered()` with its titles
    /// does, for boxes of every size, in and partly outside the buffer,
    /// over cells already drawn and styled.
    #[test]
    fn a_box_is_drawn_as_ratatuis_block_draws_it() {
        use ratatui_core::widgets::Widget;
        use ratatui_widgets::block::Block;
        let red = Style::default().fg(Color::Red).add_modifier(Modifier::BOLD);
        let titles = [
            (Line::from(" Timeline ─ allocated / reserved "), Some(Line::from(vec![Span::styled(" 0–2G ", red)]))),
            (
                Line::from(Span::styled(" a title wider than most of the boxes it is put on ", red)),
                Some(Line::from(" right side ")),
            ),
            (Line::from(""), None),
        ];
        let screen = Rect::new(0, 0, 40, 12);
        for (title, right) in &titles {
            for area in [
                Rect::new(0, 0, 40, 12),
                Rect::new(3, 2, 20, 5),
                Rect::new(5, 5, 1, 1),
                Rect::new(5, 5, 2, 2),
                Rect::new(5, 5, 3, 3),
                Rect::new(1, 1, 10, 1),
                Rect::new(30, 8, 20, 10),
                Rect::new(0, 0, 0, 4),
            ] {
                let mut a = Buffer::filled(screen, ratatui_core::buffer::Cell::new("x"));
                a.set_style(Rect::new(0, 0, 40, 6), Style::default().bg(Color::Blue));
                let mut b = a.clone();
                let mut block = Block::bordered().title(title.clone());
                if let Some(r) = right {
                    block = block.title(r.clone().right_aligned());
                }
                let want = block.inner(area);
                block.render(area, &mut a);
                let inner = super::boxed(&mut b, area, title.clone(), right.clone());
                assert_eq!(a, b, "{area:?} {title:?}");
                assert_eq!(inner, want);
            }
        }
    }

    #[test]
    fn rows_read_to_scale_when_most_segments_get_cells() {
        use crate::alloc::SegmentInfo;
        let seg = |mib: u64| SegmentInfo {
            device: 0,
            address: 0,
            total_size: mib << 20,
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: 0,
            segment_type: "large",
            is_expandable: false,
            pool: None,
            private: false,
            blocks: Vec::new(),
        };
        // Similar sizes: to scale; a few giants among many 2 MiB: stretched.
        assert!(super::rows_to_scale(&[seg(44), seg(118), seg(126)], 36));
        assert!(!super::rows_to_scale(&[seg(304), seg(2), seg(2), seg(2)], 36));
        // Wider rows give small segments their cells.
        assert!(super::rows_to_scale(&[seg(304), seg(20), seg(20)], 200));
        assert!(!super::rows_to_scale(&[], 36));
    }

    #[test]
    fn an_oom_stack_keeps_the_programs_own_frame() {
        use super::{oom_stack_rows, StackRow};
        use crate::trace::Frame;
        let f = |file: &str| Frame { name: "f".into(), filename: file.into(), line: 1 };
        let mut frames = vec![f("site-packages/torch/nn/functional.py")];
        frames.extend((0..20).map(|_| f("site-packages/torch/nn/modules/module.py")));
        frames.extend([f("train.py"), f("site-packages/x/runner.py"), f("site-packages/x/cli.py")]);
        use StackRow::{Frame as F, Skipped as S};
        // Six rows: three innermost, the 18 skipped, the script's, 2 after.
        assert_eq!(oom_stack_rows(&frames, 6), vec![F(0), F(1), F(2), S(18), F(21), S(2)]);
        // All fit: all shown; none recorded: said.
        assert_eq!(oom_stack_rows(&frames[..3], 6), vec![F(0), F(1), F(2)]);
        assert_eq!(oom_stack_rows(&[], 6), vec![StackRow::None]);
        // The script's frame among the first rows: the rest counted.
        let short = [f("train.py"), f("a.py"), f("b.py"), f("c.py")];
        assert_eq!(oom_stack_rows(&short, 3), vec![F(0), F(1), S(2)]);
        // Every row accounts for frames: shown plus skipped is the stack.
        for rows in 1..30 {
            let n: usize = oom_stack_rows(&frames, rows)
                .iter()
                .map(|r| match r {
                    F(_) => 1,
                    S(k) => *k,
                    StackRow::None => 0,
                })
                .sum();
            assert_eq!(n, frames.len(), "{rows} rows");
        }
    }

    use crate::analysis::short_bytes;

    /// The float formatting `short_bytes` replaced.
    fn short_bytes_f64(n: u64) -> String {
        const UNITS: [&str; 5] = ["B", "K", "M", "G", "T"];
        let mut v = n as f64;
        let mut u = 0;
        while v >= 1024.0 && u < UNITS.len() - 1 {
            v /= 1024.0;
            u += 1;
        }
        if v >= 100.0 || u == 0 {
            format!("{v:.0}{}", UNITS[u])
        } else {
            format!("{v:.1}{}", UNITS[u])
        }
    }

    #[test]
    fn the_bars_figures_keep_their_columns() {
        let widths: Vec<usize> = [1016 << 20, 8 << 30, 512, 1023 << 30]
            .iter()
            .map(|&b| super::peak_text(b, b, true).chars().count())
            .collect();
        assert_eq!(widths, [31, 31, 31, 31]);
    }

    /// The OOM box ends with the checked advice when a replay found it, and
    /// keeps the program's own frame above it.
    #[test]
    fn the_oom_box_ends_with_the_checked_advice() {
        let f = |file: &str| crate::trace::Frame { filename: file.into(), line: 3, name: "f".into() };
        let frames = [f("site-packages/torch/nn/functional.py"), f("train.py")];
        let note = super::parts::OomNote {
            event: 7,
            size: 96 << 20,
            stream: 0,
            frames: &frames,
            advice: Some("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True avoids it".into()),
        };
        let mut buf = Buffer::empty(Rect::new(0, 0, 80, 5));
        super::render_oom(super::Theme { color: false }, &note, None, buf.area, &mut buf);
        let rows: Vec<String> =
            (0..5).map(|y| (0..80).map(|x| buf[(x, y)].symbol().to_string()).collect::<String>()).collect();
        assert!(rows[1].contains("functional.py:3 f"), "{rows:?}");
        assert!(rows[2].contains("train.py:3 f"), "{rows:?}");
        assert!(rows[3].contains("⇒ PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True avoids it"), "{rows:?}");
    }

    #[test]
    fn short_bytes_prints_what_float_formatting_did() {
        for n in crate::analysis::byte_values() {
            assert_eq!(short_bytes(n), short_bytes_f64(n), "{n}");
        }
    }
}
