//! Metrics derived from allocator state; nothing here mutates it. Names follow
//! docs/design/architecture.md §Fragmentation figures everywhere (screen, JSON, exports, Prometheus).

pub mod categories;
pub(crate) mod diff;
pub(crate) mod range_max;
pub(crate) mod ranks;
pub(crate) mod spans;

use serde::Serialize;

use crate::alloc::{BlockState, DeviceStats, Kind, SegmentInfo, StatePoint};
use crate::trace::{Annotation, Frame};

#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub(crate) struct Fragmentation {
    /// reserved − allocated, now (PyTorch's OOM message's "reserved but unallocated").
    pub(crate) reserved_unallocated_bytes: u64,
    /// Free bytes inside segments that also hold live blocks: `empty_cache` cannot release them.
    pub(crate) inactive_split_bytes: u64,
    /// 1 − largest free block / total free, now (0 when nothing is free);
    /// four decimals in JSON.
    #[serde(serialize_with = "round4")]
    pub(crate) external_fragmentation: f64,
    /// allocated − requested, now.
    pub(crate) rounding_waste_bytes: u64,
    pub(crate) largest_free_block_bytes: u64,
    pub(crate) free_bytes: u64,
}

/// What a byte of a segment is, as the map (terminal and pictures) shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockClass {
    /// Requested bytes of a live block.
    Allocated,
    /// A live block's bytes beyond its request (rounding).
    RoundingWaste,
    /// Freed, waiting for another stream's work (`record_stream`).
    PendingFree,
    /// Free, in a segment that also holds live blocks: `empty_cache` cannot release it.
    FreeInUsedSegment,
    /// Free, in a segment with nothing live: `empty_cache` releases it.
    FreeSegment,
}

impl BlockClass {
    /// Every class, in the order maps and legends list them.
    pub const ALL: [BlockClass; 5] = [
        BlockClass::Allocated,
        BlockClass::RoundingWaste,
        BlockClass::PendingFree,
        BlockClass::FreeInUsedSegment,
        BlockClass::FreeSegment,
    ];
}

/// The byte ranges `[start, end)` (from the segment's address) of each
/// class, in address order.
pub fn class_spans(seg: &SegmentInfo) -> Vec<(u64, u64, BlockClass)> {
    let whole_free = seg.blocks.iter().all(|b| b.state == BlockState::Inactive);
    let mut out = Vec::with_capacity(seg.blocks.len() + 1);
    for b in &seg.blocks {
        let start = b.address - seg.address;
        match b.state {
            BlockState::ActiveAllocated => {
                let used = b.requested_size.min(b.size);
                out.push((start, start + used, BlockClass::Allocated));
                if used < b.size {
                    out.push((start + used, start + b.size, BlockClass::RoundingWaste));
                }
            }
            BlockState::ActivePendingFree => out.push((start, start + b.size, BlockClass::PendingFree)),
            BlockState::Inactive => {
                let c = if whole_free { BlockClass::FreeSegment } else { BlockClass::FreeInUsedSegment };
                out.push((start, start + b.size, c))
            }
        }
    }
    out
}

/// "1 segment", "2 segments": `n` and the noun, plural unless one.
pub(crate) fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// A ratio as JSON carries it: four decimals.
pub(crate) fn round4<S: serde::Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64((x * 10_000.0).round() / 10_000.0)
}

/// Memory held by one pool: the default pools, or one private pool (a CUDA
/// graph's, graph trees', a `MemPool`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct PoolUsage {
    /// `segment_pool_id`; `None` for a private pool whose id the
    /// recording does not carry.
    pub(crate) segment_pool_id: Option<[u64; 2]>,
    pub(crate) kind: PoolKind,
    pub(crate) segments: usize,
    pub(crate) reserved_bytes: u64,
    pub(crate) allocated_bytes: u64,
}

/// Whose pool (JSON: "default", "private").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum PoolKind {
    /// The allocator's own large and small pools.
    Default,
    /// A private pool: a CUDA graph's, graph trees', a `MemPool`.
    Private,
}

/// Segments and bytes per pool: the default pools first, then private
/// pools by id.
pub(crate) fn pool_usage(segments: &[SegmentInfo]) -> Vec<PoolUsage> {
    let mut out: Vec<PoolUsage> = Vec::new();
    for s in segments {
        let id = s.pool.map(|p| [p.0, p.1]);
        let kind = if s.private { PoolKind::Private } else { PoolKind::Default };
        match out.iter_mut().find(|p| p.segment_pool_id == id && p.kind == kind) {
            Some(p) => {
                p.segments += 1;
                p.reserved_bytes += s.total_size;
                p.allocated_bytes += s.allocated_size;
            }
            None => out.push(PoolUsage {
                segment_pool_id: id,
                kind,
                segments: 1,
                reserved_bytes: s.total_size,
                allocated_bytes: s.allocated_size,
            }),
        }
    }
    out.sort_by_key(|p| (p.kind == PoolKind::Private, p.segment_pool_id));
    out
}

/// 1 − peak allocated / peak reserved, each at its own peak (GMLake's ratio).
pub(crate) fn peak_ratio(stats: &DeviceStats) -> f64 {
    let peak = |k| stats.get(k, 0).peak.max(0) as u64;
    peak_ratio_of(peak(Kind::AllocatedBytes), peak(Kind::ReservedBytes))
}

/// `peak_ratio` from the two peaks: 1 − allocated / reserved (0 when nothing was reserved).
pub(crate) fn peak_ratio_of(allocated_peak: u64, reserved_peak: u64) -> f64 {
    if reserved_peak == 0 {
        0.0
    } else {
        1.0 - allocated_peak as f64 / reserved_peak as f64
    }
}

pub(crate) fn fragmentation(stats: &DeviceStats, segments: &[SegmentInfo]) -> Fragmentation {
    let cur = |k| stats.get(k, 0).current.max(0) as u64;
    fragmentation_of(
        cur(Kind::ReservedBytes),
        cur(Kind::AllocatedBytes),
        cur(Kind::InactiveSplitBytes),
        cur(Kind::RequestedBytes),
        segments,
    )
}

/// The figures from the four current byte counts (as a published
/// `memory_stats()` has them) and the segments.
pub(crate) fn fragmentation_of(
    reserved: u64,
    allocated: u64,
    inactive_split: u64,
    requested: u64,
    segments: &[SegmentInfo],
) -> Fragmentation {
    let (mut largest, mut free) = (0u64, 0u64);
    for b in segments.iter().flat_map(|s| &s.blocks).filter(|b| b.state == BlockState::Inactive) {
        largest = largest.max(b.size);
        free += b.size;
    }
    Fragmentation {
        reserved_unallocated_bytes: reserved.saturating_sub(allocated),
        inactive_split_bytes: inactive_split,
        external_fragmentation: if free == 0 { 0.0 } else { 1.0 - largest as f64 / free as f64 },
        rounding_waste_bytes: allocated.saturating_sub(requested),
        largest_free_block_bytes: largest,
        free_bytes: free,
    }
}

/// One log2 bucket of the block-size histogram: sizes in `(lo, hi]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub(crate) struct SizeBucket {
    pub(crate) hi: u64,
    pub(crate) allocated_count: u64,
    pub(crate) allocated_bytes: u64,
    pub(crate) free_count: u64,
    pub(crate) free_bytes: u64,
}

/// Block sizes in log2 buckets (512 B up), allocated (and pending) versus free.
pub(crate) fn size_histogram(segments: &[SegmentInfo]) -> Vec<SizeBucket> {
    let mut buckets: Vec<SizeBucket> = Vec::new();
    for b in segments.iter().flat_map(|s| &s.blocks) {
        let i = (64 - (b.size.max(512) - 1).leading_zeros()).saturating_sub(9) as usize;
        if buckets.len() <= i {
            let n = buckets.len();
            buckets.extend((n..=i).map(|k| SizeBucket { hi: 512u64 << k, ..Default::default() }));
        }
        let bk = &mut buckets[i];
        if b.state == BlockState::Inactive {
            bk.free_count += 1;
            bk.free_bytes += b.size;
        } else {
            bk.allocated_count += 1;
            bk.allocated_bytes += b.size;
        }
    }
    buckets
}

/// Where each training iteration ends: the first event after each
/// `Optimizer.step` annotation ends (record_function markers PyTorch keeps in
/// `external_annotations`), as event indices into `time_us`.
pub(crate) fn iteration_marks(time_us: &crate::trace::Times, annotations: &[Annotation], device: i32) -> Vec<usize> {
    let mut ends: Vec<i64> = annotations
        .iter()
        .filter(|a| a.device == device)
        .filter(|a| a.field("stage") == Some("END"))
        .filter(|a| a.field("name").is_some_and(|n| n.starts_with("Optimizer.step")))
        .map(|a| a.time_us)
        .collect();
    // In time order, each search starting where the last ended
    // (`Times::partition_point_from`).
    ends.sort_unstable();
    let mut from = 0;
    let mut marks: Vec<usize> = ends
        .into_iter()
        .map(|end| {
            from = time_us.partition_point_from(from, |t| t <= end);
            from
        })
        .filter(|&i| i > 0 && i < time_us.len())
        .collect();
    // In order already: the ends were, and each search starts at the last.
    marks.dedup();
    marks
}

/// Index of the first point with the most allocated bytes.
pub(crate) fn peak_index(points: &[StatePoint]) -> Option<usize> {
    (0..points.len()).max_by_key(|&i| (points[i].allocated, std::cmp::Reverse(i)))
}

/// The highest allocated bytes of each iteration `marks` delimits in `n`
/// points (the part before the first mark and after the last count as
/// iterations too), as (event index of its first occurrence, bytes); each
/// iteration's peak asked of `peak(lo, hi)` (a block index answers without
/// reading every point: `range_max`).
pub(crate) fn iteration_peaks_by(
    n: usize,
    marks: &[usize],
    peak: impl Fn(usize, usize) -> Option<(usize, u64)>,
) -> Vec<(usize, u64)> {
    let mut bounds: Vec<usize> = Vec::with_capacity(marks.len() + 2);
    bounds.push(0);
    bounds.extend(marks.iter().copied().filter(|&m| m > 0 && m < n));
    bounds.push(n);
    bounds.windows(2).filter(|w| w[1] > w[0]).filter_map(|w| peak(w[0], w[1])).collect()
}

/// Live bytes grouped by where they were allocated, largest first:
/// (call site, bytes, blocks). `tag` of a block is its stack + 1 (0 = none).
pub(crate) fn live_by_call_site(
    segments: &[SegmentInfo],
    stacks: &[Vec<Frame>],
    site: impl Fn(&[Frame]) -> String,
) -> Vec<(String, u64, usize)> {
    // foldhash, not SipHash: the screen asks this every frame, of every
    // live block and call site.
    let mut by_tag: foldhash::HashMap<u32, (u64, usize)> = foldhash::HashMap::default();
    for b in segments.iter().flat_map(|s| &s.blocks).filter(|b| b.state != BlockState::Inactive) {
        let e = by_tag.entry(b.tag).or_default();
        e.0 += b.size;
        e.1 += 1;
    }
    // Different stacks can share a call site (same line, different callers).
    let mut by_site: foldhash::HashMap<String, (u64, usize)> = foldhash::HashMap::default();
    for (tag, (bytes, n)) in by_tag {
        let name = match tag.checked_sub(1).and_then(|t| stacks.get(t as usize)) {
            Some(f) => site(f),
            None => String::new(),
        };
        let name = if name.is_empty() { "(no stack recorded)".to_string() } else { name };
        let e = by_site.entry(name).or_default();
        e.0 += bytes;
        e.1 += n;
    }
    let mut out: Vec<(String, u64, usize)> = by_site.into_iter().map(|(s, (b, n))| (s, b, n)).collect();
    out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

/// Where an allocation was made: the innermost frame of the user's own
/// Python code (PyTorch's files and C++ frames skipped where possible).
pub(crate) fn call_site(frames: &[Frame]) -> String {
    let py = |f: &&Frame| f.filename.ends_with(".py");
    let own = frames.iter().filter(py).find(|f| !in_torch(&f.filename));
    own.or_else(|| frames.iter().find(py)).or(frames.first()).map(frame_label).unwrap_or_default()
}

/// Whether a file is PyTorch's own (its package directory), not a path
/// that merely has a `torch` directory in it (a virtualenv at /opt/torch).
fn in_torch(filename: &str) -> bool {
    filename.starts_with("torch/") || filename.contains("-packages/torch/") || filename.contains("/lib/torch/")
}

/// One frame as `file:line function`, or the function alone for a frame
/// without a line (C++). The basename keeps the line number visible in a
/// narrow pane; the directories rarely disambiguate within one model's trace.
pub(crate) fn frame_label(f: &Frame) -> String {
    if f.line > 0 {
        let base = f.filename.rsplit('/').next().unwrap_or(&f.filename);
        format!("{base}:{} {}", f.line, f.name)
    } else {
        f.name.to_string()
    }
}

/// The index of the innermost frame of the program's own scripts: the first
/// Python frame outside installed packages and PyTorch.
pub(crate) fn script_frame(frames: &[Frame]) -> Option<usize> {
    let library = |f: &Frame| {
        ["site-packages/", "dist-packages/", "<frozen"].iter().any(|p| f.filename.contains(p)) || in_torch(&f.filename)
    };
    frames.iter().position(|f| f.filename.ends_with(".py") && !library(f))
}

/// The innermost frame of the program's own scripts: the first Python frame
/// outside installed packages (site-packages, dist-packages) and PyTorch,
/// as `file:line function`; none when every frame is a library's.
pub(crate) fn script_site(frames: &[Frame]) -> Option<String> {
    Some(frame_label(&frames[script_frame(frames)?]))
}

/// Bytes in human units as PyTorch's `memory_summary()` prints them.
/// The median of `v` (the mean of the middle two for an even count; 0 for none).
pub(crate) fn median(v: &[u64]) -> u64 {
    let mut s = v.to_vec();
    s.sort_unstable();
    match s.len() {
        0 => 0,
        n if n % 2 == 1 => s[n / 2],
        n => ((s[n / 2 - 1] as u128 + s[n / 2] as u128) / 2) as u64,
    }
}

pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let u = unit_of(n, UNITS.len() - 1);
    if u == 0 {
        format!("{n} B")
    } else {
        let q = scaled(n, 10 * u as u32, 100);
        format!("{}.{:02} {}", q / 100, q % 100, UNITS[u])
    }
}

/// The units `short_bytes` prints in; `short_bytes_key` picks one of them.
const SHORT_UNITS: [&str; 5] = ["B", "K", "M", "G", "T"];

/// Bytes in a short form for narrow columns: "148M", "2.0M", "512B".
pub(crate) fn short_bytes(n: u64) -> String {
    match short_bytes_key(n) {
        (0, _, q) => format!("{q}B"),
        (u, 1, q) => format!("{q}{}", SHORT_UNITS[u]),
        (u, _, q) => format!("{}.{}{}", q / 10, q % 10, SHORT_UNITS[u]),
    }
}

/// What `short_bytes` prints, as (unit, tenths or units, digits): equal
/// keys, equal texts, found without formatting (the timeline compares
/// thousands of iterations' peaks by their labels).
pub(crate) fn short_bytes_key(n: u64) -> (usize, u64, u64) {
    let u = unit_of(n, SHORT_UNITS.len() - 1);
    let shift = 10 * u as u32;
    match u {
        0 => (0, 1, n),
        _ if n >> shift >= 100 => (u, 1, scaled(n, shift, 1)),
        _ => (u, 10, scaled(n, shift, 10)),
    }
}

/// The power of 1024 to show `n` in: the largest whose quotient is at least 1.
pub(crate) fn unit_of(n: u64, most: usize) -> usize {
    (1..=most).take_while(|&u| u < 7 && n >> (10 * u) != 0).last().unwrap_or(0)
}

/// `n / 2^shift` in units of `1/per` (`per` a power of ten), rounded half
/// to even: the digits `{:.k}` prints for the f64 quotient, without float
/// formatting (a measurable part of drawing a live frame, which shows a few
/// dozen of these twice a second).
pub(crate) fn scaled(n: u64, shift: u32, per: u64) -> u64 {
    // Past 2^53 the float is n rounded to 53 bits: round it the same way
    // first (its value is an integer, and dividing it by 2^shift is exact).
    let n = if n >= 1 << 53 { (n as f64) as u128 } else { n as u128 };
    let d = 1u128 << shift;
    let num = n * per as u128;
    let (mut q, r) = (num / d, num % d);
    if 2 * r > d || (2 * r == d && q & 1 == 1) {
        q += 1;
    }
    q as u64
}

/// Byte counts to hold the integer formatting of `human_bytes` and
/// `short_bytes` to the float formatting they replaced: every value up
/// to 4 MiB, exact ties (n / 1024^u, n·10 / 1024^u and n·100 / 1024^u
/// ending in .5) in each unit, and a spread of values up to u64::MAX.
#[cfg(test)]
pub(crate) fn byte_values() -> Vec<u64> {
    let mut ns: Vec<u64> = (0..4 << 20).collect();
    for u in 1..=4u32 {
        let d = 1u64 << (10 * u);
        for k in 0..3000u64 {
            let t = (2 * k + 1) * d;
            ns.extend([t / 2, t / 20, k * d / 100 + k, k * d + k]);
            if t % 200 == 0 {
                ns.push(t / 200);
            }
        }
    }
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..200_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ns.push(x >> (x % 64));
    }
    ns.extend([u64::MAX, 1 << 53, (1 << 53) - 1, (1 << 53) + 1, 1 << 60, (1 << 50) - 1]);
    ns
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::{AllocatorConfig, CachingAllocator};
    use crate::device::Sim;

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(&[]), 0);
        assert_eq!(median(&[7]), 7);
        assert_eq!(median(&[9, 1, 5]), 5);
        assert_eq!(median(&[4, 1, 3, 10]), 3);
        assert_eq!(median(&[u64::MAX, u64::MAX]), u64::MAX);
    }

    /// Short labels' keys are equal exactly where their texts are, and
    /// fall as the bytes do (the timeline skips a run of equal labels).
    #[test]
    fn short_labels_keys_match_their_texts() {
        assert_eq!(short_bytes(512), "512B");
        assert_eq!(short_bytes(3 << 29), "1.5G");
        assert_eq!(short_bytes(208 << 20), "208M");
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut ns: Vec<u64> = (0..20_000)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x >> (i % 64)
            })
            .chain(
                (0..4).flat_map(|u| [99, 100, 1023, 1024].map(|b| (b << (10 * u)) - 1..(b << (10 * u)) + 2)).flatten(),
            )
            .collect();
        ns.sort_unstable();
        for w in ns.windows(2) {
            let (a, b) = (short_bytes_key(w[0]), short_bytes_key(w[1]));
            assert_eq!(a == b, short_bytes(w[0]) == short_bytes(w[1]), "{} {}", w[0], w[1]);
            let num = |k: (usize, u64, u64)| k.2 as f64 / k.1 as f64 * 1024f64.powi(k.0 as i32);
            assert!(num(a) <= num(b), "{} {}", w[0], w[1]);
        }
    }

    #[test]
    fn figures_from_a_split_segment() {
        let mut a = CachingAllocator::new(AllocatorConfig::default(), Sim::h200());
        let x = a.malloc(5 << 20, 0).unwrap();
        let y = a.malloc(3 << 20, 0).unwrap();
        a.free(x).unwrap();
        let _ = y;
        // One 20 MiB segment: [5 MiB free][3 MiB alloc][12 MiB free].
        let f = fragmentation(a.stats(), &a.snapshot());
        assert_eq!(f.reserved_unallocated_bytes, 17 << 20);
        assert_eq!(f.inactive_split_bytes, 17 << 20);
        assert_eq!(f.largest_free_block_bytes, 12 << 20);
        assert_eq!(f.free_bytes, 17 << 20);
        assert!((f.external_fragmentation - (1.0 - 12.0 / 17.0)).abs() < 1e-12);
        assert_eq!(f.rounding_waste_bytes, 0);
        assert!((peak_ratio(a.stats()) - (1.0 - 8.0 / 20.0)).abs() < 1e-12);
        let h = size_histogram(&a.snapshot());
        let b3 = h.iter().find(|b| b.hi == 4 << 20).unwrap();
        assert_eq!((b3.allocated_count, b3.allocated_bytes), (1, 3 << 20));
        let b5 = h.iter().find(|b| b.hi == 8 << 20).unwrap();
        assert_eq!((b5.free_count, b5.free_bytes), (1, 5 << 20));
        assert_eq!(human_bytes(17 << 20), "17.00 MiB");
    }

    /// The float formatting these replace.
    fn human_bytes_f64(n: u64) -> String {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut v = n as f64;
        let mut u = 0;
        while v >= 1024.0 && u < UNITS.len() - 1 {
            v /= 1024.0;
            u += 1;
        }
        if u == 0 {
            format!("{n} B")
        } else {
            format!("{v:.2} {}", UNITS[u])
        }
    }

    #[test]
    fn human_bytes_prints_what_float_formatting_did() {
        for n in byte_values() {
            assert_eq!(human_bytes(n), human_bytes_f64(n), "{n}");
        }
    }

    fn ann(stage: &str, name: &str, t: i64) -> Annotation {
        Annotation { device: 0, time_us: t, fields: vec![("stage".into(), stage.into()), ("name".into(), name.into())] }
    }

    #[test]
    fn iterations_end_after_each_optimizer_step() {
        let times: crate::trace::Times = [10, 20, 30, 40, 50, 60, 70].into_iter().collect();
        let anns = [
            ann("START", "Optimizer.step#SGD.step", 25),
            ann("END", "Optimizer.step#SGD.step", 30),
            ann("START", "Optimizer.zero_grad#SGD.zero_grad", 31),
            ann("END", "Optimizer.zero_grad#SGD.zero_grad", 32),
            ann("END", "Optimizer.step#SGD.step", 55),
        ];
        // Ends at t=30 and t=55: the next iterations start at events 3 and 5.
        assert_eq!(iteration_marks(&times, &anns, 0), vec![3, 5]);
        assert_eq!(iteration_marks(&times, &anns, 1), Vec::<usize>::new());
        let p = |a| StatePoint { allocated: a, reserved: a };
        let pts = [p(1), p(5), p(5), p(2), p(7), p(3), p(4)];
        let index = range_max::RangeMax::of(&pts, &[]);
        let iteration_peaks = |marks: &[usize]| {
            iteration_peaks_by(pts.len(), marks, |lo, hi| index.query(&pts, lo, hi).map(|p| (p.at, p.allocated)))
        };
        assert_eq!(iteration_peaks(&[3, 5]), vec![(1, 5), (4, 7), (6, 4)]);
        assert_eq!(iteration_peaks(&[]), vec![(4, 7)]);
    }
}
