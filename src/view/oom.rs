//! The box at an OOM: the request that failed, what was held, where.

use ratatui_core::buffer::Buffer;
use ratatui_core::layout::Rect;
use ratatui_core::style::{Color, Modifier};
use ratatui_core::text::{Line, Span};
use ratatui_core::widgets::Widget;

use crate::analysis::categories::{CategoryBytes, Evidence};
use crate::analysis::{human_bytes, short_bytes};
use crate::trace::Frame;

use super::parts::{self};
use super::text::{boxed, longest_fitting, put_rows};
use super::theme::{category_letter, Theme};

/// The OOM's request and the stack that made it, innermost first; when the
/// frames do not fit, the program's own innermost frame is kept and what is
/// left out is counted.
pub(crate) fn render_oom(
    theme: Theme,
    o: &parts::OomNote,
    meaning: Option<parts::Meaning>,
    area: Rect,
    buf: &mut Buffer,
) {
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
pub(crate) fn held_text(bytes: &CategoryBytes, width: usize) -> String {
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
pub(crate) enum StackRow {
    Frame(usize),
    /// This many frames left out here.
    Skipped(usize),
    None,
}

/// Which of `frames` fit in `rows`: the innermost ones, then (when it is
/// further out) the program's own innermost frame, with what was left out
/// counted where it was left out.
pub(crate) fn oom_stack_rows(frames: &[Frame], rows: usize) -> Vec<StackRow> {
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
