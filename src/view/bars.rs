//! The bars: allocated and reserved against what can run out, by
//! category where the memory's meaning is known.

use ratatui_core::buffer::Buffer;
use ratatui_core::layout::Rect;
use ratatui_core::style::{Color, Style};
use ratatui_core::text::{Line, Span};

use crate::analysis::categories::{Category, CategoryBytes, Evidence};
use crate::analysis::{human_bytes, short_bytes};

use super::parts::{self, View};
use super::text::{put_rows, MIN_HEIGHT};
use super::theme::{category_color, category_letter, Theme};

pub(crate) fn bar_line(label: &str, value: u64, scale: u64, width: usize, tail: String, style: Style) -> Line<'static> {
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

pub(crate) fn render_bars(view: &View, theme: Theme, area: Rect, buf: &mut Buffer) {
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
pub(crate) fn capacity_text(capacity: Option<(u64, parts::ScaleBy)>) -> (String, String) {
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
pub(crate) fn step_category_line(bytes: &CategoryBytes, step: u64, theme: Theme, width: usize) -> Line<'static> {
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
pub(crate) fn what_line(view: &View, height: u16) -> bool {
    (view.marks.meaning.is_some() || view.totals.step_categories.is_some()) && height > MIN_HEIGHT
}

/// The allocated bar in one colour per category, in `Category::ALL` order.
pub(crate) fn category_bar(
    bytes: &CategoryBytes,
    scale: u64,
    width: usize,
    tail: String,
    theme: Theme,
) -> Line<'static> {
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
pub(crate) fn category_line(bytes: &CategoryBytes, evidence: Evidence, theme: Theme, width: usize) -> Line<'static> {
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

/// " 1.46 GiB   peak 3.82 GiB", or "peak unknown" where the file has none.
/// Sizes take 11 columns, the widest `human_bytes` ("1016.00 MiB"), so the
/// columns stay put as the figures change.
pub(crate) fn peak_text(now: u64, peak: u64, known: bool) -> String {
    if known {
        format!(" {:>11}   peak {:>11}", human_bytes(now), human_bytes(peak))
    } else {
        format!(" {:>11}   peak not in the snapshot", human_bytes(now))
    }
}
