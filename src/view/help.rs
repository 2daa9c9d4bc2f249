//! The help overlay, written from the key table (`keys`).

use ratatui_core::buffer::Buffer;
use ratatui_core::layout::Rect;
use ratatui_core::text::{Line, Span};
use ratatui_core::widgets::Widget;
use ratatui_widgets::clear::Clear;

use crate::analysis::categories::Category;

use super::text::{boxed, put_rows, wrap};
use super::theme::{category_color, category_letter, Theme};

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
