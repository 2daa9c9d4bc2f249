//! Pictures of the views for reports: SVG drawn from the same state the
//! screens show, PNG rendered from that SVG with the bundled font (so a
//! machine with no fonts renders the same pixels), and text as the terminal
//! shows it. Output depends only on the input: the same trace and options
//! give byte-identical files.

use std::fmt::Write;

use crate::alloc::{SegmentInfo, StatePoint};
use crate::analysis::categories::Category;
use crate::analysis::{human_bytes, Fragmentation};
use crate::view::theme;

/// Which view to draw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ViewKind {
    Fragmap,
    Timeline,
    Bars,
}

/// The file format of an export.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Svg,
    Png,
    Txt,
}

/// Everything a picture shows.
#[derive(Debug, Clone)]
pub(crate) struct Scene<'a> {
    /// "gpt2_train.pickle.gz · event 4400 of 14327 (peak)"
    pub(crate) title: String,
    /// Allocator config and device.
    pub(crate) subtitle: String,
    pub(crate) segments: &'a [SegmentInfo],
    /// The bars' figures (the terminal's).
    pub(crate) totals: crate::view::parts::Totals,
    pub(crate) fragmentation: Fragmentation,
    /// The timeline and its marks (the terminal's); with `meaning`, what
    /// each block is (a replay): the allocated bar is split by it, and with
    /// `color_by` the map is coloured by it.
    pub(crate) marks: crate::view::parts::Marks<'a>,
    /// The per-process memory limit the run had, drawn where it is.
    pub(crate) memory_limit: Option<u64>,
    pub(crate) color_by: crate::view::parts::ColorBy,
}

/// A category's fill: the terminal's colour for it (`view::theme`).
fn category_fill(c: Category) -> &'static str {
    theme::category(c).hex
}

/// Free space in a map coloured by category: grey, so only the categories
/// carry colour.
const FREE_BY_CATEGORY: &str = "#edf2f7";

/// The bundled font: every PNG is drawn with it and nothing else. In a
/// section of its own, so the linker does not lay its 742 KB among the
/// strings and tables every command reads: the kernel maps 64 KiB around
/// each page read, and the live monitor carried the font's edges, about
/// 100 KB, in its RSS (docs/measurements/benchmarks.md, "Smaller cells").
#[link_section = ".gpumem_font"]
pub(crate) static FONT: [u8; include_bytes!("../../assets/fonts/DejaVuSans.ttf").len()] =
    *include_bytes!("../../assets/fonts/DejaVuSans.ttf");
const FAMILY: &str = "DejaVu Sans";

/// The longest text a picture shows (a title, a config string): a longer
/// one is cut, so a hostile name cannot make a picture slow or huge.
const MAX_TEXT: usize = 200;

/// Text for SVG: XML's special characters escaped, control characters
/// (invalid in XML 1.0) dropped, and cut at `MAX_TEXT` characters.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(MAX_TEXT * 6));
    for (n, c) in s.chars().filter(|c| !c.is_control()).enumerate() {
        if n == MAX_TEXT {
            out.push('…');
            break;
        }
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

/// Fills and patterns per block state, readable in greyscale: solid dark,
/// cross-hatched, diagonal, dotted, white.
const DEFS: &str = r##"<defs>
<pattern id="waste" width="6" height="6" patternUnits="userSpaceOnUse"><rect width="6" height="6" fill="#ecc94b"/><path d="M0 0L6 6M6 0L0 6" stroke="#744210" stroke-width="1"/></pattern>
<pattern id="pending" width="6" height="6" patternUnits="userSpaceOnUse"><rect width="6" height="6" fill="#ed64a6"/><path d="M0 6L6 0" stroke="#702459" stroke-width="1.5"/></pattern>
<pattern id="inactive" width="5" height="5" patternUnits="userSpaceOnUse"><rect width="5" height="5" fill="#fc8181"/><circle cx="2.5" cy="2.5" r="0.9" fill="#742a2a"/></pattern>
</defs>"##;

fn fill(state: usize) -> &'static str {
    use crate::analysis::BlockClass;
    [
        theme::block(BlockClass::Allocated).hex,
        "url(#waste)",
        "url(#pending)",
        "url(#inactive)",
        theme::block(BlockClass::FreeSegment).hex,
    ][state]
}

/// The colour under each state's fill: the hues of the terminal's map
/// (`view::Cell`), green, yellow, magenta, red and blue, so a picture pasted
/// in a report reads like the screen it came from.
#[cfg(test)]
const BASE: [&str; 5] = [
    theme::block(crate::analysis::BlockClass::Allocated).hex,
    theme::block(crate::analysis::BlockClass::RoundingWaste).hex,
    theme::block(crate::analysis::BlockClass::PendingFree).hex,
    theme::block(crate::analysis::BlockClass::FreeInUsedSegment).hex,
    theme::block(crate::analysis::BlockClass::FreeSegment).hex,
];

/// The series colours: the terminal's allocated green and reserved blue.
const ALLOCATED: &str = theme::ALLOCATED.hex;
const RESERVED: &str = theme::RESERVED.hex;
const LEGEND: [&str; 5] =
    ["allocated", "rounding waste", "pending free", "free in a used segment", "free segment (releasable)"];

/// Tick step for `max` over about `n` ticks: 1, 2 or 5 times a power of two
/// of bytes (so ticks land on round MiB/GiB).
fn tick_step(max: u64, n: u64) -> u64 {
    let raw = (max / n.max(1)).max(1);
    let mut p = 1u64;
    // Saturating: a size near u64::MAX once wrapped this loop forever.
    while p.saturating_mul(8) < raw {
        p *= 8;
    }
    for m in [1, 2, 4, 8, 16, 32] {
        if p.saturating_mul(m) >= raw {
            return p.saturating_mul(m);
        }
    }
    p.saturating_mul(64)
}

/// Step for about `n` labels over counts `0..=span`: 1, 2 or 5 times a
/// power of ten (iterations, events).
fn count_step(span: u64, n: u64) -> u64 {
    let raw = span.div_ceil(n.max(1)).max(1);
    let mut p = 1u64;
    loop {
        for m in [1, 2, 5] {
            if p.saturating_mul(m) >= raw {
                return p.saturating_mul(m);
            }
        }
        p = p.saturating_mul(10);
    }
}

/// Marks at x positions, one per pixel column at most: a picture of
/// 100,000 iterations draws what its width can show (docs/user/input.md).
fn thinned(xs: impl Iterator<Item = f64>) -> impl Iterator<Item = f64> {
    let mut last = f64::NEG_INFINITY;
    xs.filter(move |&x| {
        let keep = x - last >= 2.0;
        if keep {
            last = x;
        }
        keep
    })
}

/// Rows the fragmentation map picture draws at most.
const MAX_ROWS: usize = 1000;

/// The `n` largest segments (ties by address), in address order.
fn largest_in_order(segments: &[SegmentInfo], n: usize) -> Vec<&SegmentInfo> {
    if segments.len() <= n {
        return segments.iter().collect();
    }
    let mut by_size: Vec<&SegmentInfo> = segments.iter().collect();
    by_size.sort_by(|a, b| b.total_size.cmp(&a.total_size).then(a.address.cmp(&b.address)));
    by_size.truncate(n);
    by_size.sort_by_key(|g| (g.device, g.address));
    by_size
}

/// The ticks 0, step, 2·step, … up to `max`: at most 64, none wrapping.
fn ticks(max: u64, step: u64) -> impl Iterator<Item = u64> {
    (0..64u64).map_while(move |i| i.checked_mul(step.max(1)).filter(|&t| t <= max))
}

fn short(n: u64) -> String {
    // Ticks: "512 MiB", "2 GiB" without needless decimals.
    let s = human_bytes(n);
    s.replace(".00 ", " ")
}

struct Svg {
    out: String,
    w: f64,
}

impl Svg {
    fn text(&mut self, x: f64, y: f64, size: f64, anchor: &str, s: &str, extra: &str) {
        let _ = writeln!(
            self.out,
            r#"<text x="{x:.1}" y="{y:.1}" font-size="{size}" text-anchor="{anchor}"{extra}>{}</text>"#,
            esc(s)
        );
    }
    fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: &str, stroke: &str) {
        let _ = writeln!(
            self.out,
            r#"<rect x="{x:.2}" y="{y:.2}" width="{:.2}" height="{:.2}" fill="{fill}" stroke="{stroke}" stroke-width="0.5"/>"#,
            w.max(0.0),
            h.max(0.0)
        );
    }
    fn line(&mut self, x1: f64, y1: f64, x2: f64, y2: f64, style: &str) {
        let _ = writeln!(self.out, r#"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" {style}/>"#);
    }
    fn header(&mut self, scene: &Scene, view: &str) -> f64 {
        self.text(24.0, 36.0, 22.0, "start", &format!("{view} ─ {}", scene.title), r#" font-weight="bold""#);
        self.text(24.0, 60.0, 14.0, "start", &scene.subtitle, r##" fill="#4a5568""##);
        84.0
    }
    /// `parts` joined by " ─ " on as many lines as the picture's width
    /// needs (13-unit text, about 7.2 units a character); returns the y
    /// below them.
    fn parts_line(&mut self, y: f64, parts: &[String]) -> f64 {
        let room = ((self.w - 48.0) / 7.2) as usize;
        let mut lines: Vec<String> = Vec::new();
        for p in parts {
            match lines.last_mut() {
                Some(l) if l.chars().count() + 3 + p.chars().count() <= room => {
                    l.push_str(" ─ ");
                    l.push_str(p);
                }
                _ => lines.push(p.clone()),
            }
        }
        let mut y = y;
        for l in &lines {
            self.text(24.0, y, 13.0, "start", l, "");
            y += 18.0;
        }
        y
    }
    /// The categories' key, wrapped to the picture's width.
    fn category_legend(&mut self, y: f64, bytes: Option<&crate::analysis::categories::CategoryBytes>) -> f64 {
        let (mut x, mut y) = (24.0, y);
        for c in Category::ALL {
            let name = match bytes {
                Some(b) => format!("{} {}", c.plural(), human_bytes(b.get(c))),
                None => c.plural().to_string(),
            };
            let w = 40.0 + name.len() as f64 * 7.2;
            if x > 24.0 && x + w > self.w - 24.0 {
                (x, y) = (24.0, y + 22.0);
            }
            self.rect(x, y - 11.0, 22.0, 14.0, category_fill(c), "#1a202c");
            self.text(x + 28.0, y, 13.0, "start", &name, "");
            x += w;
        }
        y + 16.0
    }
    fn legend(&mut self, y: f64) -> f64 {
        let mut x = 24.0;
        for (i, name) in LEGEND.iter().enumerate() {
            self.rect(x, y - 11.0, 22.0, 14.0, fill(i), "#1a202c");
            self.text(x + 28.0, y, 13.0, "start", name, "");
            x += 40.0 + name.len() as f64 * 7.2;
        }
        y + 16.0
    }
    fn finish(self, h: f64) -> String {
        format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h:.0}\" viewBox=\"0 0 {w} {h:.0}\" font-family=\"{FAMILY}\">\n{DEFS}\n<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n{}</svg>\n",
            self.out,
            w = self.w
        )
    }
}

fn fragmap(scene: &Scene, width: f64) -> String {
    let mut s = Svg { out: String::new(), w: width };
    let mut y = s.header(scene, "Fragmentation map");
    let f = &scene.fragmentation;
    let parts = [
        crate::analysis::count(scene.segments.len(), "segment"),
        format!("allocated {}", human_bytes(scene.totals.allocated)),
        format!("reserved {}", human_bytes(scene.totals.reserved)),
        format!("reserved but unallocated {}", human_bytes(f.reserved_unallocated_bytes)),
        format!("inactive_split {}", human_bytes(f.inactive_split_bytes)),
        format!("largest free block {}", human_bytes(f.largest_free_block_bytes)),
        format!("external_fragmentation {:.2}", f.external_fragmentation),
    ];
    y = s.parts_line(y, &parts);
    // A bound on the picture as decoding has one on the input: past
    // MAX_ROWS segments the largest are drawn (in address order) and the
    // rest counted, so 100,000 segments make a 3,000 px picture, not a
    // 300,000 px one (docs/user/input.md).
    let shown = largest_in_order(scene.segments, MAX_ROWS);
    let n = shown.len().max(1) as f64;
    let row = (720.0 / n).clamp(3.0, 16.0);
    let labels = row >= 10.0;
    let x0 = if labels { 200.0 } else { 60.0 };
    let plot_w = width - x0 - 40.0;
    let max = scene.segments.iter().map(|g| g.total_size).max().unwrap_or(1).max(1);
    let scale = plot_w / max as f64;
    if shown.len() < scene.segments.len() {
        let rest: u64 =
            scene.segments.iter().map(|g| g.total_size).sum::<u64>() - shown.iter().map(|g| g.total_size).sum::<u64>();
        s.text(
            24.0,
            y + 4.0,
            13.0,
            "start",
            &format!(
                "the {} largest segments drawn, in address order; {} more ({}) not drawn",
                shown.len(),
                scene.segments.len() - shown.len(),
                human_bytes(rest)
            ),
            "",
        );
        y += 18.0;
    }
    for seg in shown {
        if labels {
            s.text(
                x0 - 8.0,
                y + row * 0.78,
                (row * 0.75).min(12.0),
                "end",
                &format!("{:#x} {}{}", seg.address, short(seg.total_size), if seg.private { " *" } else { "" }),
                "",
            );
        }
        match scene.color_by.meaning(scene.marks.meaning) {
            // Live blocks in their category's colour, the rest grey.
            Some(m) => {
                s.rect(x0, y, seg.total_size as f64 * scale, row - 1.0, FREE_BY_CATEGORY, "none");
                for b in seg.blocks.iter().filter(|b| b.state != crate::alloc::BlockState::Inactive) {
                    let fill = category_fill(m.of_block(b.address));
                    s.rect(
                        x0 + (b.address - seg.address) as f64 * scale,
                        y,
                        b.size as f64 * scale,
                        row - 1.0,
                        fill,
                        "none",
                    );
                }
            }
            None => {
                for (start, end, class) in crate::analysis::class_spans(seg) {
                    let w = (end - start) as f64 * scale;
                    s.rect(x0 + start as f64 * scale, y, w, row - 1.0, fill(class as usize), "none");
                }
            }
        }
        // The segment's outline, so free segments show their extent.
        let _ = writeln!(
            s.out,
            r##"<rect x="{x0:.2}" y="{y:.2}" width="{:.2}" height="{:.2}" fill="none" stroke="#1a202c" stroke-width="0.6"/>"##,
            seg.total_size as f64 * scale,
            row - 1.0
        );
        y += row;
    }
    // Byte axis: rows are drawn to one scale, the largest segment's.
    y += 4.0;
    s.line(x0, y, x0 + plot_w, y, r##"stroke="#1a202c""##);
    let step = tick_step(max, 8);
    for t in ticks(max, step) {
        let x = x0 + t as f64 * scale;
        s.line(x, y, x, y + 5.0, r##"stroke="#1a202c""##);
        s.text(x, y + 18.0, 11.0, "middle", &short(t), "");
    }
    s.text(x0 + plot_w / 2.0, y + 36.0, 12.0, "middle", "offset within the segment (all rows to one scale)", "");
    let y = s.map_legend(scene, y + 62.0);
    s.finish(y + 12.0)
}

impl Svg {
    /// The map's legend at `y`: the categories (and how they were told)
    /// where it is coloured by them, else the block states; returns the y
    /// below it.
    fn map_legend(&mut self, scene: &Scene, y: f64) -> f64 {
        match scene.color_by.meaning(scene.marks.meaning) {
            Some(m) => {
                let b = m.bytes();
                let y = self.category_legend(y, Some(&b));
                self.text(
                    24.0,
                    y + 6.0,
                    12.0,
                    "start",
                    &format!("categories {}", m.evidence().describe()),
                    r##" fill="#4a5568""##,
                );
                y + 18.0
            }
            None => self.legend(y),
        }
    }

    /// The bars' row of what is reserved but unallocated (the gap users
    /// fight), at `y`, `xf` placing bytes; returns the y below it.
    fn gap_row(&mut self, scene: &Scene, x0: f64, y: f64, xf: &dyn Fn(u64) -> f64) -> f64 {
        let gap = scene.totals.reserved.saturating_sub(scene.totals.allocated);
        self.text(x0 - 12.0, y + 22.0, 15.0, "end", "reserved but unallocated", "");
        self.rect(
            xf(scene.totals.allocated),
            y,
            xf(scene.totals.reserved) - xf(scene.totals.allocated),
            32.0,
            fill(3),
            "#1a202c",
        );
        self.text(
            xf(scene.totals.reserved) + 8.0,
            y + 22.0,
            14.0,
            "start",
            &format!(
                "{} ({:.1}% of reserved)",
                human_bytes(gap),
                if scene.totals.reserved == 0 { 0.0 } else { gap as f64 * 100.0 / scene.totals.reserved as f64 }
            ),
            "",
        );
        y + 50.0
    }
}

fn timeline(scene: &Scene, width: f64) -> String {
    let mut s = Svg { out: String::new(), w: width };
    let top = s.header(scene, "Timeline");
    let (x0, x1, y0, y1) = (110.0, width - 40.0, top + 30.0, top + 430.0);
    let n = scene.marks.timeline.len().max(2);
    let max = scene.marks.timeline.iter().map(|p| p.reserved.max(p.allocated)).max().unwrap_or(1).max(1);
    let max = max.max(scene.memory_limit.unwrap_or(0));
    let step = tick_step(max, 6);
    let top_v = max.div_ceil(step).saturating_mul(step);
    let xf = |i: usize| x0 + (x1 - x0) * i as f64 / (n - 1) as f64;
    let yf = |v: u64| y1 - (y1 - y0) * v as f64 / top_v as f64;
    // Axes and grid.
    for v in ticks(top_v, step) {
        let y = yf(v);
        s.line(x0, y, x1, y, r##"stroke="#e2e8f0""##);
        s.text(x0 - 8.0, y + 4.0, 12.0, "end", &short(v), "");
    }
    s.line(x0, y1, x1, y1, r##"stroke="#1a202c""##);
    s.line(x0, y0, x0, y1, r##"stroke="#1a202c""##);
    let xstep = (n as f64 / 8.0).ceil().max(1.0) as usize;
    for i in (0..n).step_by(xstep) {
        s.line(xf(i), y1, xf(i), y1 + 5.0, r##"stroke="#1a202c""##);
        s.text(xf(i), y1 + 20.0, 12.0, "middle", &i.to_string(), "");
    }
    s.text((x0 + x1) / 2.0, y1 + 42.0, 13.0, "middle", "event", "");
    for x in thinned(scene.marks.iterations.iter().map(|&i| xf(i))) {
        s.line(x, y0, x, y1, r##"stroke="#a0aec0" stroke-dasharray="2 4""##);
    }
    for x in thinned(scene.marks.empty_caches.iter().map(|&i| xf(i))) {
        s.text(x, y0 - 4.0, 11.0, "middle", "E", "");
    }
    // Series, downsampled to the maximum per pixel column.
    let cols = (x1 - x0) as usize;
    for (name, get, style) in [
        (
            "reserved",
            (|p: &StatePoint| p.reserved) as fn(&StatePoint) -> u64,
            format!(r#"stroke="{RESERVED}" stroke-width="2" stroke-dasharray="6 3""#),
        ),
        ("allocated", |p: &StatePoint| p.allocated, format!(r#"stroke="{ALLOCATED}" stroke-width="2""#)),
    ] {
        let mut pts = String::new();
        for c in 0..cols.max(1) {
            let lo = c * n / cols.max(1);
            let hi = ((c + 1) * n / cols.max(1)).max(lo + 1).min(scene.marks.timeline.len());
            if lo >= hi {
                continue;
            }
            let v = scene.marks.timeline[lo..hi].iter().map(get).max().unwrap_or(0);
            let _ = write!(pts, "{:.1},{:.1} ", x0 + c as f64, yf(v));
        }
        let _ = writeln!(s.out, r#"<polyline fill="none" {style} points="{}"/>"#, pts.trim_end());
        let _ = name;
    }
    if let Some(p) = scene.marks.peak_at.filter(|&p| p < scene.marks.timeline.len()) {
        let v = scene.marks.timeline[p].allocated;
        let _ = writeln!(s.out, r#"<circle cx="{:.1}" cy="{:.1}" r="5" fill="{ALLOCATED}"/>"#, xf(p), yf(v));
        // Right of the point, or left of it near the right edge (a label
        // runs past the picture there).
        let (lx, anchor) = if xf(p) > x0 + 0.7 * (x1 - x0) { (xf(p) - 8.0, "end") } else { (xf(p) + 8.0, "start") };
        s.text(
            lx,
            yf(v) - 8.0,
            13.0,
            anchor,
            &format!("peak {} @ event {p}", human_bytes(v)),
            r#" font-weight="bold""#,
        );
    }
    let mut last = f64::NEG_INFINITY;
    for &o in scene.marks.ooms {
        // One mark per two pixel columns, as `thinned`.
        if xf(o) - last < 2.0 {
            continue;
        }
        last = xf(o);
        let (x, y) = (xf(o), yf(scene.marks.timeline.get(o).map_or(0, |p| p.reserved)));
        s.line(x - 5.0, y - 5.0, x + 5.0, y + 5.0, r##"stroke="#c53030" stroke-width="2.5""##);
        s.line(x - 5.0, y + 5.0, x + 5.0, y - 5.0, r##"stroke="#c53030" stroke-width="2.5""##);
    }
    if scene.marks.cursor < n {
        s.line(xf(scene.marks.cursor), y0, xf(scene.marks.cursor), y1, r##"stroke="#1a202c" stroke-width="1""##);
    }
    if let Some(l) = scene.memory_limit {
        s.line(x0, yf(l), x1, yf(l), r##"stroke="#c53030" stroke-width="1.5" stroke-dasharray="8 4""##);
        s.text(x1, yf(l) - 6.0, 13.0, "end", &format!("memory limit {}", human_bytes(l)), r##" fill="#c53030""##);
    }
    // Legend.
    let ly = y1 + 70.0;
    s.line(24.0, ly - 4.0, 54.0, ly - 4.0, &format!(r#"stroke="{ALLOCATED}" stroke-width="2""#));
    s.text(60.0, ly, 13.0, "start", "allocated", "");
    s.line(
        150.0,
        ly - 4.0,
        180.0,
        ly - 4.0,
        &format!(r#"stroke="{RESERVED}" stroke-width="2" stroke-dasharray="6 3""#),
    );
    s.text(186.0, ly, 13.0, "start", "reserved", "");
    s.text(270.0, ly, 13.0, "start", "┆ iteration end   E empty_cache   ✗ OOM   │ cursor", "");
    if scene.memory_limit.is_some() {
        s.line(650.0, ly - 4.0, 680.0, ly - 4.0, r##"stroke="#c53030" stroke-width="1.5" stroke-dasharray="8 4""##);
        s.text(686.0, ly, 13.0, "start", "memory limit", "");
    }
    s.finish(ly + 16.0)
}

fn bars(scene: &Scene, width: f64) -> String {
    let mut s = Svg { out: String::new(), w: width };
    let top = s.header(scene, "Memory");
    let (x0, x1) = (220.0, width - 320.0);
    let max = scene.totals.reserved_peak.max(scene.totals.allocated_peak).max(scene.memory_limit.unwrap_or(0)).max(1);
    let step = tick_step(max, 8);
    let top_v = max.div_ceil(step).saturating_mul(step);
    let xf = |v: u64| x0 + (x1 - x0) * v as f64 / top_v as f64;
    let rows: [(&str, u64, u64); 2] = [
        ("allocated", scene.totals.allocated, scene.totals.allocated_peak),
        ("reserved", scene.totals.reserved, scene.totals.reserved_peak),
    ];
    let mut y = top + 20.0;
    let split = scene.marks.meaning.map(|m| m.bytes());
    for (i, (name, now, peak)) in rows.iter().enumerate() {
        s.text(x0 - 12.0, y + 22.0, 15.0, "end", name, "");
        match (&split, i) {
            // Allocated, split by what it is.
            (Some(b), 0) => {
                let mut x = x0;
                for c in Category::ALL {
                    let w = xf(b.get(c)) - x0;
                    if w > 0.0 {
                        s.rect(x, y, w, 32.0, category_fill(c), "#1a202c");
                        x += w;
                    }
                }
            }
            _ => s.rect(x0, y, xf(*now) - x0, 32.0, if i == 0 { fill(0) } else { RESERVED }, "#1a202c"),
        }
        let _ = writeln!(
            s.out,
            r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#c53030" stroke-width="3"/>"##,
            xf(*peak),
            y - 4.0,
            xf(*peak),
            y + 36.0
        );
        s.text(
            xf(*now).max(x0) + 8.0,
            y + 22.0,
            14.0,
            "start",
            &format!("{} (peak {})", human_bytes(*now), human_bytes(*peak)),
            "",
        );
        y += 56.0;
    }
    y = s.gap_row(scene, x0, y, &xf);
    if let Some(l) = scene.memory_limit {
        let _ = writeln!(
            s.out,
            r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#c53030" stroke-width="1.5" stroke-dasharray="8 4"/>"##,
            xf(l),
            top + 10.0,
            xf(l),
            y
        );
        s.text(xf(l), top + 4.0, 13.0, "middle", &format!("memory limit {}", human_bytes(l)), r##" fill="#c53030""##);
    }
    s.line(x0, y, x1, y, r##"stroke="#1a202c""##);
    for v in ticks(top_v, step) {
        s.line(xf(v), y, xf(v), y + 5.0, r##"stroke="#1a202c""##);
        s.text(xf(v), y + 20.0, 12.0, "middle", &short(v), "");
    }
    let peak_ratio = crate::analysis::peak_ratio_of(scene.totals.allocated_peak, scene.totals.reserved_peak);
    let y = match &split {
        Some(b) => s.category_legend(y + 76.0, Some(b)) - 26.0,
        None => y,
    };
    // (The legend sits under the axis; the figures' line follows it.)
    s.text(
        24.0,
        y + 50.0,
        13.0,
        "start",
        &format!(
            "│ peak (red)   peak_ratio {peak_ratio:.4}   inactive_split {}   rounding_waste {}",
            human_bytes(scene.fragmentation.inactive_split_bytes),
            human_bytes(scene.fragmentation.rounding_waste_bytes)
        ),
        "",
    );
    s.finish(y + 66.0)
}

/// The narrowest layout: labels, bars, axes and legends are placed for at
/// least this many units; a narrower picture is the same drawing scaled
/// down (its `viewBox`), so nothing overlaps, runs backwards or is cut.
const LAYOUT_MIN: f64 = 1200.0;

/// `svg`, laid out `laid` units wide, as a picture `width` pixels wide:
/// the outer size scaled, the drawing's own coordinates kept.
fn scaled(svg: String, laid: f64, width: f64) -> String {
    if width >= laid {
        return svg;
    }
    let head = format!("width=\"{laid}\" height=\"");
    let Some(at) = svg.find(&head) else { return svg };
    let rest = &svg[at + head.len()..];
    let Some(end) = rest.find('"') else { return svg };
    let Ok(h) = rest[..end].parse::<f64>() else { return svg };
    format!("{}width=\"{width}\" height=\"{:.0}\"{}", &svg[..at], h * width / laid, &rest[end + 1..])
}

/// The SVG of `view`, `width` pixels wide.
pub(crate) fn svg(scene: &Scene, view: ViewKind, width: u32) -> String {
    let w = width.clamp(400, 8000) as f64;
    let laid = w.max(LAYOUT_MIN);
    let svg = match view {
        ViewKind::Fragmap => fragmap(scene, laid),
        ViewKind::Timeline => timeline(scene, laid),
        ViewKind::Bars => bars(scene, laid),
    };
    scaled(svg, laid, w)
}

/// Rasterises an SVG made by `svg` with the bundled font only.
pub(crate) fn png(svg: &str) -> Result<Vec<u8>, String> {
    let mut opt = resvg::usvg::Options::default();
    let mut db = resvg::usvg::fontdb::Database::new();
    db.load_font_data(FONT.to_vec());
    db.set_sans_serif_family(FAMILY);
    opt.fontdb = std::sync::Arc::new(db);
    let tree = resvg::usvg::Tree::from_str(svg, &opt).map_err(|e| format!("SVG: {e}"))?;
    let size = tree.size().to_int_size();
    let mut pix = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).ok_or("empty picture")?;
    resvg::render(&tree, resvg::tiny_skia::Transform::default(), &mut pix.as_mut());
    pix.encode_png().map_err(|e| format!("PNG: {e}"))
}

/// `diff --export`: both runs' allocated bytes on one axis, iterations
/// aligned (docs/user/diff.md), `width` pixels wide.
/// The diff's overlay of two runs, titled with both and their peaks: what
/// `diff --export` writes and `s` on the diff screen saves.
pub(crate) fn diff_svg(model: &crate::analysis::diff::DiffModel, width: u32) -> String {
    let h = crate::analysis::human_bytes;
    let r = &model.report;
    overlay_svg(
        &format!("{} → {}", r.base.trace, r.new.trace),
        &format!(
            "peak allocated {} → {}, peak reserved {} → {} (gpumem-top diff; docs/user/diff.md)",
            h(r.peak.allocated.base),
            h(r.peak.allocated.new),
            h(r.peak.reserved.base),
            h(r.peak.reserved.new)
        ),
        &model.base,
        &model.new,
        width,
    )
}

pub(crate) fn overlay_svg(
    title: &str,
    subtitle: &str,
    base: &crate::analysis::diff::Series,
    new: &crate::analysis::diff::Series,
    width: u32,
) -> String {
    let (asked, width) = (width as f64, (width as f64).max(LAYOUT_MIN));
    let mut s = Svg { out: String::new(), w: width };
    s.text(24.0, 36.0, 22.0, "start", &format!("Allocated, two runs ─ {title}"), r#" font-weight="bold""#);
    s.text(24.0, 60.0, 14.0, "start", subtitle, r##" fill="#4a5568""##);
    let (x0, x1, y0, y1) = (110.0, width - 40.0, 114.0, 514.0);
    let span = base.span().max(new.span());
    let max = [base, new].iter().flat_map(|r| r.points.iter().map(|p| p.allocated)).max().unwrap_or(1).max(1);
    let step = tick_step(max, 6);
    let top_v = max.div_ceil(step).saturating_mul(step);
    let xf = |x: f64| x0 + (x1 - x0) * x / span;
    let yf = |v: u64| y1 - (y1 - y0) * v as f64 / top_v as f64;
    for v in ticks(top_v, step) {
        s.line(x0, yf(v), x1, yf(v), r##"stroke="#e2e8f0""##);
        s.text(x0 - 8.0, yf(v) + 4.0, 12.0, "end", &short(v), "");
    }
    s.line(x0, y1, x1, y1, r##"stroke="#1a202c""##);
    s.line(x0, y0, x0, y1, r##"stroke="#1a202c""##);
    // Iteration lines and labels thinned to what the width can show: a
    // label every 60 px at most.
    let every = count_step(span as u64, ((x1 - x0) / 60.0).max(1.0) as u64);
    for k in (0..=span as u64).step_by(every as usize) {
        let x = xf(k as f64);
        s.line(x, y0, x, y1, r##"stroke="#a0aec0" stroke-dasharray="2 4""##);
        s.text(x, y1 + 20.0, 12.0, "middle", &k.to_string(), "");
    }
    s.text((x0 + x1) / 2.0, y1 + 42.0, 13.0, "middle", "iteration (each run's Optimizer.step markers aligned)", "");
    // Each run downsampled to the most allocated per pixel column.
    let cols = (x1 - x0).max(1.0) as usize;
    for (run, color, name) in [(base, theme::RUN_BASE.hex, "base"), (new, theme::RUN_NEW.hex, "new")] {
        let mut col: Vec<Option<u64>> = vec![None; cols + 1];
        for (i, p) in run.points.iter().enumerate() {
            let c = ((run.x_of(i) / span) * cols as f64) as usize;
            let slot = &mut col[c.min(cols)];
            *slot = Some(slot.map_or(p.allocated, |v: u64| v.max(p.allocated)));
        }
        let pts: Vec<String> = col
            .iter()
            .enumerate()
            .filter_map(|(c, v)| v.map(|v| format!("{:.1},{:.1}", x0 + c as f64, yf(v))))
            .collect();
        let _ =
            writeln!(s.out, r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#, pts.join(" "));
        if let Some(p) = run.peak {
            let (x, v) = (xf(run.x_of(p)), run.points[p].allocated);
            s.text(
                x,
                yf(v) - 8.0,
                12.0,
                "middle",
                &format!("{name} peak {}", human_bytes(v)),
                &format!(r#" fill="{color}""#),
            );
        }
    }
    let y = y1 + 70.0;
    for (i, (color, name)) in [(theme::RUN_BASE.hex, "base"), (theme::RUN_NEW.hex, "new")].iter().enumerate() {
        let x = 24.0 + i as f64 * 160.0;
        s.rect(x, y - 11.0, 22.0, 14.0, color, "#1a202c");
        s.text(x + 28.0, y, 13.0, "start", &format!("{name} allocated"), "");
    }
    scaled(s.finish(y + 20.0), width, asked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui_core::style::Color;

    fn hue(hex: &str) -> f64 {
        let v = u32::from_str_radix(hex.trim_start_matches('#'), 16).unwrap_or(0);
        let [r, g, b] = [(v >> 16) & 255, (v >> 8) & 255, v & 255].map(|c| c as f64 / 255.0);
        let (max, min) = (r.max(g).max(b), r.min(g).min(b));
        let d = max - min;
        if d == 0.0 {
            0.0
        } else if max == r {
            60.0 * ((g - b) / d).rem_euclid(6.0)
        } else if max == g {
            60.0 * ((b - r) / d + 2.0)
        } else {
            60.0 * ((r - g) / d + 4.0)
        }
    }

    /// Each state's colour in a picture is the hue the terminal's map gives
    /// it, and the legends list the states in the same order.
    #[test]
    fn pictures_use_the_terminals_colours() {
        let terminal = |c: Color| match c {
            Color::Green => 120.0,
            Color::Yellow => 60.0,
            Color::Magenta => 300.0,
            Color::Red => 0.0,
            Color::Blue => 240.0,
            _ => -1000.0,
        };
        for (i, (cell, _)) in crate::view::Cell::LEGEND.iter().enumerate() {
            let (want, got) = (terminal(cell.color()), hue(BASE[i]));
            let off = (want - got).rem_euclid(360.0).min((got - want).rem_euclid(360.0));
            assert!(off <= 45.0, "{cell:?}: hue {got:.0} in pictures, {want:.0} on the terminal");
            assert!(DEFS.contains(BASE[i]) || fill(i) == BASE[i], "{cell:?}");
        }
        assert!((hue(ALLOCATED) - 120.0).abs() <= 45.0 && (hue(RESERVED) - 240.0).abs() <= 45.0);
    }
}
