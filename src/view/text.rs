//! Text primitives every screen draws with: boxes, rows that never
//! spill, an ellipsis, the longest of several phrasings that fits, the
//! smallest terminal a screen draws on.

use ratatui_core::buffer::Buffer;
use ratatui_core::layout::Rect;
use ratatui_core::style::Style;
use ratatui_core::text::Line;
use ratatui_core::widgets::Widget;
use ratatui_widgets::block::Block;
use ratatui_widgets::borders::Borders;
use ratatui_widgets::paragraph::{Paragraph, Wrap};

/// The smallest terminal the screens are drawn in.
pub(crate) const MIN_WIDTH: u16 = 80;
pub(crate) const MIN_HEIGHT: u16 = 24;
/// The allocator screen inside a terminal of at least 80×24: the live view
/// puts its list of GPUs above it (at most a third of the terminal).
pub(crate) const MIN_SCREEN_HEIGHT: u16 = 16;

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
pub(crate) fn one_cell(c: char) -> bool {
    matches!(c, ' '..='~'
        | '\u{A1}'..='\u{AC}' | '\u{AE}'..='\u{FF}'
        | '\u{2010}'..='\u{2027}'
        | '\u{2190}'..='\u{22FF}'
        | '\u{2500}'..='\u{25FC}' | '\u{25FF}'
        | '\u{26A0}' | '\u{2713}'..='\u{2717}')
}

/// One line in one row at (x, y), `width` cells.
pub(crate) fn put_row(buf: &mut Buffer, x: u16, y: u16, width: u16, l: Line) {
    put_rows(buf, Rect { x, y, width, height: 1 }, vec![l]);
}

/// One glyph into one cell (no-op outside the buffer).
pub(crate) fn put(buf: &mut Buffer, x: u16, y: u16, glyph: char, style: Style) {
    if let Some(cell) = buf.cell_mut((x, y)) {
        cell.set_char(glyph).set_style(style);
    }
}

/// The first of `candidates` (longest first) that fits in `room` columns:
/// a line that cannot show everything says less instead of being cut.
pub(crate) fn longest_fitting<S: AsRef<str>>(candidates: impl IntoIterator<Item = S>, room: usize) -> Option<S> {
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
pub(crate) fn wrap(text: &str, width: usize, indent: usize) -> Vec<String> {
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
