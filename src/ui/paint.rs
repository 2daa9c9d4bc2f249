//! Bordered boxes and lines of text written straight into the buffer. They
//! put the same cells as ratatui's `Block` (all borders, plain set) and
//! `Paragraph` (no wrap, left-aligned) — the screen snapshots hold them to
//! that — without what made those the live view's main cost at 2 frames a
//! second: a style pass over every cell of the area and grapheme
//! segmentation of every character. Text outside the fast set (ASCII and the
//! box, block and braille glyphs the screens are drawn with) goes through
//! ratatui's own `set_stringn`.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::{Paragraph, Widget};

/// Glyphs one cell wide that form a grapheme of their own when followed by
/// another of them: printable ASCII, box drawing, block elements, braille,
/// and the few other symbols the screens use (arrows, ▶ ▲, ≤, ✗, ⚠, …).
pub fn narrow(c: char) -> bool {
    matches!(
        c,
        ' '..='~'
            | '·'
            | '×'
            | '–'
            | '—'
            | '…'
            | '\u{2190}'..='\u{21FF}'
            | '≤'
            | '≥'
            | '\u{2500}'..='\u{25FC}'
            | '\u{25FF}'
            | '⚠'
            | '✗'
            | '\u{2800}'..='\u{28FF}'
    )
}

/// Draws `l` in one row as ratatui would (`Paragraph` for text, `Line`
/// for titles); returns nothing. Lines made only of [`narrow`] glyphs are
/// written cell by cell; anything else is left to ratatui.
fn draw(buf: &mut Buffer, x: u16, y: u16, width: u16, l: &Line, title: bool) {
    let area = Rect { x, y, width, height: 1 }.intersection(buf.area);
    if area.is_empty() {
        return;
    }
    if !l.spans.iter().all(|s| s.content.chars().all(narrow)) {
        if title {
            l.render(area, buf);
        } else {
            Paragraph::new(l.clone()).render(area, buf);
        }
        return;
    }
    let row = (area.y - buf.area.y) as usize * buf.area.width as usize;
    let (mut x, end) = (area.x, area.right());
    for span in &l.spans {
        let style = l.style.patch(span.style);
        for c in span.content.chars() {
            if x >= end {
                return;
            }
            buf.content[row + (x - buf.area.x) as usize].set_char(c).set_style(style);
            x += 1;
        }
    }
}

/// `Paragraph::new(l).render(..)` on one row at (x, y), `width` cells.
pub fn line(buf: &mut Buffer, x: u16, y: u16, width: u16, l: &Line) {
    draw(buf, x, y, width, l, false)
}

/// `Paragraph::new(lines).render(area, buf)` for lines that fit unwrapped.
pub fn lines(buf: &mut Buffer, area: Rect, lines: &[Line]) {
    for (i, l) in lines.iter().take(area.height as usize).enumerate() {
        line(buf, area.x, area.y + i as u16, area.width, l);
    }
}

/// `Block::default().borders(Borders::ALL).title(title)` (and `right` as a
/// right-aligned top title) rendered into `area`; returns the inner area.
pub fn boxed(buf: &mut Buffer, area: Rect, title: &Line, right: Option<&Line>) -> Rect {
    let area = area.intersection(buf.area);
    // Block::inner's arithmetic, empty areas included.
    let inner = {
        let x = area.x.saturating_add(1).min(area.right());
        let y = area.y.saturating_add(1).min(area.bottom());
        Rect { x, y, width: area.width.saturating_sub(2), height: area.height.saturating_sub(2) }
    };
    if area.is_empty() {
        return inner;
    }
    let (l, t) = (area.left(), area.top());
    let (r, b) = (area.right() - 1, area.bottom() - 1);
    let w = buf.area.width as usize;
    let (bx, by) = (buf.area.x, buf.area.y);
    let mut set = |x: u16, y: u16, c: char| {
        buf.content[(y - by) as usize * w + (x - bx) as usize].set_char(c);
    };
    // ratatui's order: sides left, top, right, bottom, then the corners.
    for y in t..=b {
        set(l, y, '│');
    }
    for x in l..=r {
        set(x, t, '─');
    }
    for y in t..=b {
        set(r, y, '│');
    }
    for x in l..=r {
        set(x, b, '─');
    }
    set(r, b, '┘');
    set(r, t, '┐');
    set(l, b, '└');
    set(l, t, '┌');
    let titles = Rect { x: l + 1, y: t, width: area.width.saturating_sub(2), height: 1 };
    if !titles.is_empty() {
        draw(buf, titles.x, t, titles.width, title, true);
        if let Some(rt) = right {
            let rw = rt.width().min(u16::MAX as usize) as u16;
            if rw <= titles.width {
                draw(buf, titles.right() - rw, t, rw, rt, true);
            } else {
                // Too narrow: ratatui's own clipping of a right-aligned line.
                let x = titles.right().saturating_sub(rw).max(titles.left());
                rt.clone().right_aligned().render(Rect { x, width: rw.min(titles.width), ..titles }, buf);
            }
        }
    }
    inner
}
