//! The screens of docs/design/architecture.md §Screens, drawn from an immutable `View`
//! (`impl Widget for &View`): a header, the
//! allocated/reserved bars, the fragmentation map beside the block-size
//! histogram, the timeline, and a status line. Nothing here computes metrics
//! or owns data; the caller builds the `View` from whatever source it has.

mod bars;
pub(crate) mod chart;
pub(crate) mod diff;
mod help;
mod histogram;
pub(crate) mod job;
pub(crate) mod live;
mod map;
mod oom;
pub mod parts;
pub(crate) mod ranks;
pub(crate) mod screen;
mod text;
pub(crate) mod theme;
mod timeline;

pub(crate) use help::help_box;
pub(crate) use help::help_overlay;
pub use map::{segment_categories, segment_cells};
pub(crate) use parts::{beside, Focus, Panel, SegmentOrder, View};
pub(crate) use text::{boxed, duration, ellipsis, put_rows, too_small, MIN_HEIGHT, MIN_WIDTH};
pub(crate) use timeline::Zoom;

use bars::{render_bars, what_line};
use histogram::render_histogram;
use map::render_map;
use oom::render_oom;
use text::{longest_fitting, wrap, MIN_SCREEN_HEIGHT};
use theme::Theme;
use timeline::render_timeline;

use ratatui_core::buffer::Buffer;
use ratatui_core::layout::{Constraint, Layout, Rect};
use ratatui_core::style::{Color, Modifier};
use ratatui_core::text::{Line, Span};
use ratatui_core::widgets::Widget;
use ratatui_widgets::paragraph::{Paragraph, Wrap};

/// One glyph per block class, readable without colour.
pub use crate::analysis::BlockClass as Cell;

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
    draw_screen(view, area, buf, true);
}

/// The rows of the whole screen (`draw_screen`), and the status line's
/// text; none in a terminal too small for them.
struct Rows {
    banner: Rect,
    top: Rect,
    middle: Rect,
    bottom: Rect,
    status: Rect,
    status_lines: Vec<String>,
    suffix: &'static str,
}

fn rows(view: &View, area: Rect) -> Option<Rows> {
    if area.width < MIN_WIDTH || area.height < MIN_SCREEN_HEIGHT {
        return None;
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
    Some(Rows { banner, top, middle, bottom, status, status_lines, suffix })
}

/// Where the whole screen `view` draws in `area` puts its timeline, where
/// nothing is drawn over it (no single panel, no help) and it is drawn
/// beside the rest (`beside`): a frame may then draw it apart
/// (`timeline_apart`) while it makes the rest (`draw_but_timeline`).
pub(crate) fn timeline_area(view: &View, area: Rect) -> Option<Rect> {
    if view.sel.panel.is_some() || view.sel.help || !beside(view.marks.timeline.len()) {
        return None;
    }
    rows(view, area).map(|r| r.bottom)
}

/// `view`'s timeline alone in `area` (`timeline_area`), in a buffer of
/// its own for `put_buffer`.
pub(crate) fn timeline_apart(view: &View, area: Rect) -> Buffer {
    apart(area, |own| render_timeline(view, Theme { color: view.chrome.color }, area, own))
}

/// What `draw` draws in `area`, in a buffer of its own (drawn beside the
/// rest of a frame on another thread, then moved in with `put_buffer`).
fn apart(area: Rect, draw: impl FnOnce(&mut Buffer)) -> Buffer {
    let mut own = Buffer::empty(area);
    draw(&mut own);
    own
}

/// The whole screen but its timeline, which the caller draws
/// (`timeline_area`).
pub(crate) fn draw_but_timeline(view: &View, area: Rect, buf: &mut Buffer) {
    draw_screen(view, area, buf, false);
}

/// The whole screen, its timeline where `timeline` says so.
fn draw_screen(view: &View, area: Rect, buf: &mut Buffer, timeline: bool) {
    let theme = Theme { color: view.chrome.color };
    let Some(Rows { banner, top, middle, bottom, status, status_lines, suffix }) = rows(view, area) else {
        let msg = format!(
            "gpumem-top needs a terminal of at least {MIN_WIDTH}x{MIN_HEIGHT}; this pane is {}x{}.",
            area.width, area.height
        );
        Paragraph::new(msg).wrap(Wrap { trim: true }).render(area, buf);
        return;
    };
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
    let [map, hist] = Layout::horizontal([Constraint::Percentage(62), Constraint::Percentage(38)]).areas(middle);
    let bars_and_map = |buf: &mut Buffer| {
        let inner = boxed(buf, top, Line::from(Span::styled(title, theme.bold())), help);
        render_bars(view, theme, inner, buf);
        render_map(view, theme, map, buf);
        if let Some(o) = view.chrome.oom.as_ref().filter(|_| !view.sel.zoom && !view.sel.compact) {
            // Over the lower part of the map: the state is still the one the
            // request met, above it. A zoomed or compact map is the user's
            // choice to see the segments, and keeps the whole pane.
            let h = (map.height / 2).max(4).min(map.height);
            render_oom(theme, o, view.marks.meaning, Rect { y: map.bottom() - h, height: h, ..map }, buf);
        }
    };
    // Beside a long timeline the histogram is drawn apart too, into its own
    // buffer, so that the bars and the map go to whichever thread is free
    // first (a jump's frame seeks before these panes while the other draws
    // the timeline: docs/measurements/benchmarks.md, "A jump's seek beside
    // its timeline").
    let panes = |buf: &mut Buffer| {
        if beside(view.marks.timeline.len()) {
            let hist = hist.intersection(buf.area);
            let (own, ()) =
                rayon::join(|| apart(hist, |own| render_histogram(view, theme, hist, own)), || bars_and_map(buf));
            put_buffer(buf, own);
        } else {
            bars_and_map(buf);
            render_histogram(view, theme, hist, buf);
        }
    };
    // A long run's timeline (its columns' peaks, stacked bytes, lines) is
    // as much work as the other panes together: where the frame is drawn
    // on a thread with a helper (`ui::event::share_frames`), it is drawn
    // beside them into its own buffer, then moved into place
    // (docs/measurements/benchmarks.md, "The timeline beside the other panes").
    if !timeline {
        panes(buf);
    } else if !beside(view.marks.timeline.len()) {
        panes(buf);
        render_timeline(view, theme, bottom, buf);
    } else {
        let bottom = bottom.intersection(buf.area);
        let (timeline, ()) = rayon::join(|| timeline_apart(view, bottom), || panes(buf));
        put_buffer(buf, timeline);
    }
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

/// `part`'s cells moved into `buf` (whose area holds `part`'s).
pub(crate) fn put_buffer(buf: &mut Buffer, mut part: Buffer) {
    let a = part.area;
    for y in a.top()..a.bottom() {
        let (to, from) = (buf.index_of(a.x, y), part.index_of(a.x, y));
        let w = a.width as usize;
        buf.content[to..to + w].swap_with_slice(&mut part.content[from..from + w]);
    }
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
                super::text::set_line(&mut b, x, y, line, w);
                assert_eq!(a, b, "{line:?} at ({x}, {y}) width {w}");
            }
        }
        // Every character taken as one cell, alone and after each other,
        // is drawn as ratatui draws it; one that is not goes through ratatui.
        let all: String = (0..0x3000u32).filter_map(char::from_u32).filter(|&c| super::text::one_cell(c)).collect();
        assert_eq!(all.chars().count(), 95 + 94 + 24 + 368 + 254 + 6);
        let wide = Rect::new(0, 0, 1000, 1);
        for text in [all.clone(), all.chars().rev().collect(), format!("a{all}\u{301}"), format!("{all}☔x")] {
            let line = Line::from(vec![Span::raw("ab "), Span::styled(text.clone(), red)]);
            let mut a = Buffer::empty(wide);
            let mut b = a.clone();
            a.set_line(0, 0, &line, 1000);
            super::text::set_line(&mut b, 0, 0, &line, 1000);
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
        assert!(super::map::rows_to_scale(&[seg(44), seg(118), seg(126)], 36));
        assert!(!super::map::rows_to_scale(&[seg(304), seg(2), seg(2), seg(2)], 36));
        // Wider rows give small segments their cells.
        assert!(super::map::rows_to_scale(&[seg(304), seg(20), seg(20)], 200));
        assert!(!super::map::rows_to_scale(&[], 36));
    }

    #[test]
    fn an_oom_stack_keeps_the_programs_own_frame() {
        use super::oom::{oom_stack_rows, StackRow};
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
            .map(|&b| super::bars::peak_text(b, b, true).chars().count())
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
