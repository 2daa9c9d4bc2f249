//! The block-size histogram, the fragmentation figures, and the live
//! bytes by call site.

use ratatui_core::buffer::Buffer;
use ratatui_core::layout::Rect;
use ratatui_core::style::Color;
use ratatui_core::text::{Line, Span};

use crate::analysis::{human_bytes, short_bytes, Fragmentation, SizeBucket};

use super::parts::View;
use super::text::{boxed, ellipsis, longest_fitting, put_rows};
use super::theme::Theme;

/// The histogram's two lines of fragmentation figures: in full, or by
/// their short names where they do not fit in `w` columns.
pub(crate) fn fragmentation_lines(f: &Fragmentation, w: usize) -> [Line<'static>; 2] {
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

pub(crate) fn render_histogram(view: &View, theme: Theme, area: Rect, buf: &mut Buffer) {
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
