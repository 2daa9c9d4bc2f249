//! What changed between two runs of one program (docs/user/diff.md): their
//! peaks and end states side by side, the growth at the peak and at the
//! end by call site and by category, and their requests aligned by call
//! site, so that "this line allocates 1.5× as much" and "this line is new"
//! are told apart.

use std::collections::{BTreeMap, BTreeSet};

use foldhash::{HashMap, HashMapExt};
use serde::Serialize;

use super::categories::{Categories, Category};
use super::spans::Spans;
use crate::alloc::{Action, BlockState, SegmentInfo};
use crate::trace::{DeviceTrace, Frame};

/// What one run holds at one moment: bytes and blocks per call site and
/// per category.
#[derive(Debug, Clone, Default)]
pub(crate) struct Holdings {
    pub(crate) by_call_site: BTreeMap<String, (u64, usize)>,
    pub(crate) by_category: BTreeMap<Category, (u64, usize)>,
}

impl Holdings {
    /// The live blocks of a snapshot's own segments (one without history).
    pub(crate) fn of_recorded(
        segments: &[crate::trace::RecordedSegment],
        stacks: &[Vec<Frame>],
        cats: &Categories,
    ) -> Self {
        let live = segments.iter().flat_map(|s| &s.blocks).filter(|b| b.state != BlockState::Inactive);
        Self::of_blocks(live.map(|b| (b.stack, b.size, cats.of_block(b.address, None))), stacks)
    }

    /// The live blocks of `segments` (the state right after event `at`).
    pub(crate) fn of(segments: &[SegmentInfo], stacks: &[Vec<Frame>], cats: &Categories, at: Option<usize>) -> Self {
        let live = segments.iter().flat_map(|s| &s.blocks).filter(|b| b.state != BlockState::Inactive);
        Self::of_blocks(live.map(|b| (b.tag, b.size, cats.of_block(b.address, at))), stacks)
    }

    /// Live blocks as (stack id (index + 1, 0 for none), bytes, category).
    /// Blocks are summed by stack first, so each stack's frames are read
    /// once however many blocks share it (docs/user/input.md, "Bounds").
    fn of_blocks(blocks: impl Iterator<Item = (u32, u64, Category)>, stacks: &[Vec<Frame>]) -> Self {
        let mut h = Holdings::default();
        let mut by_stack: std::collections::HashMap<u32, (u64, usize)> = std::collections::HashMap::new();
        for (stack, size, cat) in blocks {
            for e in [by_stack.entry(stack).or_default(), h.by_category.entry(cat).or_default()] {
                e.0 = e.0.saturating_add(size);
                e.1 += 1;
            }
        }
        for (stack, (bytes, n)) in by_stack {
            let frames = stack.checked_sub(1).and_then(|t| stacks.get(t as usize)).map_or(&[][..], |f| f.as_slice());
            let e = h.by_call_site.entry(site_label(frames)).or_default();
            e.0 = e.0.saturating_add(bytes);
            e.1 += n;
        }
        h
    }
}

/// A change in bytes with its sign, in the given units ("+1.40 GiB").
pub(crate) fn signed(d: i64, units: fn(u64) -> String) -> String {
    format!("{}{}", if d < 0 { "-" } else { "+" }, units(d.unsigned_abs()))
}

/// The call site of allocations without frames.
pub(crate) const NO_FRAMES: &str = "(no Python frames: autograd's backward, or no stacks recorded)";

/// Where a block was made: the training script's own line first, then the
/// library frame that asked (when that is not the script's).
pub(crate) fn site_label(frames: &[Frame]) -> String {
    if frames.is_empty() {
        return NO_FRAMES.into();
    }
    let lib = super::call_site(frames);
    match super::script_site(frames) {
        Some(s) if s != lib && !lib.is_empty() => format!("{s} → {lib}"),
        Some(s) => s,
        None => lib,
    }
}

/// A call site of the base run matched to the new run's across an edit of
/// the script: the same file, function and library frames, another line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Moved {
    pub(crate) base: String,
    pub(crate) new: String,
}

/// A call-site label with its line numbers set aside ("train.py:# train →
/// modeling_gpt2.py:# forward"), and the numbers in order.
fn shape(label: &str) -> (String, Vec<u64>) {
    let (mut out, mut nums) = (String::with_capacity(label.len()), Vec::new());
    let mut chars = label.chars().peekable();
    while let Some(c) = chars.next() {
        out.push(c);
        if c == ':' && chars.peek().is_some_and(|d| d.is_ascii_digit()) {
            let mut n = 0u64;
            while let Some(d) = chars.peek().and_then(|d| d.to_digit(10)) {
                n = n.saturating_mul(10).saturating_add(u64::from(d));
                chars.next();
            }
            out.push('#');
            nums.push(n);
        }
    }
    (out, nums)
}

/// The call sites that moved when the script was edited between the runs:
/// each label only one run has, paired with one only the other has that is
/// the same with line numbers set aside. Within a shape, pairs are taken
/// best first by how alike their requests are (`profile`: allocations and
/// bytes over the run), then by how near their line's move is to the move
/// the identical ones share; where both runs have as many of a shape every
/// label pairs, else only pairs within a factor of two of each other
/// (a line the edit added is new, not a moved one).
pub(crate) fn moved_sites<'a>(
    base: &BTreeSet<&'a str>,
    new: &BTreeSet<&'a str>,
    profile: impl Fn(bool, &str) -> (u64, u64),
) -> Vec<Moved> {
    if base == new {
        return Vec::new();
    }
    // A line the edit left in place may now hold another call (a line
    // inserted above one that moved lands on its old number), so every
    // label takes part in the pairing, not only those one run lacks; the
    // shared move is weighed on those alone.
    let (bs, ns) = (shapes(base), shapes(new));
    let far = |b: (u64, u64), n: (u64, u64)| {
        let l = |x: u64| ((x + 1) as f64).ln();
        (l(b.0) - l(n.0)).abs() + (l(b.1) - l(n.1)).abs()
    };
    let groups: Vec<(&Sites<'a>, &Sites<'a>)> = bs.iter().filter_map(|(s, b)| ns.get(s).map(|n| (b, n))).collect();
    // Pairs are weighed within a shape only where there are not too many of
    // them (an input's count of call sites must not cost its square); a
    // larger shape with as many sites in both runs pairs in line order.
    let weighed = |b: usize, n: usize| b.saturating_mul(n) <= MAX_WEIGHED_PAIRS;
    // The move the identical call sites share, among the labels one run lacks.
    let mut shifts: BTreeMap<i64, usize> = BTreeMap::new();
    for (b, n) in &groups {
        let b: Vec<_> = b.iter().filter(|(_, l)| !new.contains(l)).collect();
        let n: Vec<_> = n.iter().filter(|(_, l)| !base.contains(l)).collect();
        if b.is_empty() || n.is_empty() || !weighed(b.len(), n.len()) {
            continue;
        }
        for (bn, bl) in b {
            for (nn, nl) in &n {
                if far(profile(false, bl), profile(true, nl)) == 0.0 {
                    *shifts.entry(nn[0] as i64 - bn[0] as i64).or_default() += 1;
                }
            }
        }
    }
    let shift = shifts.iter().max_by_key(|(_, &c)| c).map_or(0, |(&s, _)| s);
    let mut out = Vec::new();
    for (b, n) in groups {
        if !weighed(b.len(), n.len()) {
            if b.len() == n.len() {
                out.extend(
                    b.iter()
                        .zip(n)
                        .filter(|(x, y)| x.1 != y.1)
                        .map(|(x, y)| Moved { base: x.1.to_string(), new: y.1.to_string() }),
                );
            }
            continue;
        }
        let mut pairs: Vec<(f64, usize, usize)> = Vec::new();
        for (x, (bn, bl)) in b.iter().enumerate() {
            for (y, (nn, nl)) in n.iter().enumerate() {
                let moved = (nn[0] as i64 - bn[0] as i64 - shift).unsigned_abs() as f64;
                pairs.push((far(profile(false, bl), profile(true, nl)) + moved / 1000.0, x, y));
            }
        }
        pairs.sort_by(|p, q| p.0.total_cmp(&q.0));
        let even = b.len() == n.len();
        let (mut bt, mut nt) = (vec![false; b.len()], vec![false; n.len()]);
        for (cost, x, y) in pairs {
            if bt[x] || nt[y] || (!even && cost > 2.0 * std::f64::consts::LN_2) {
                continue;
            }
            (bt[x], nt[y]) = (true, true);
            if b[x].1 != n[y].1 {
                out.push(Moved { base: b[x].1.to_string(), new: n[y].1.to_string() });
            }
        }
    }
    out.sort_by(|a, b| a.base.cmp(&b.base));
    out
}

/// The most pairs of call sites of one shape weighed against each other.
const MAX_WEIGHED_PAIRS: usize = 1 << 16;

/// Call-site labels of one shape, each with its line numbers.
type Sites<'a> = Vec<(Vec<u64>, &'a str)>;

/// The labels of `a` by shape, each with its line numbers, in line order.
fn shapes<'a>(a: &BTreeSet<&'a str>) -> BTreeMap<String, Sites<'a>> {
    let mut m: BTreeMap<String, Sites<'a>> = BTreeMap::new();
    for &l in a {
        let (s, nums) = shape(l);
        if !nums.is_empty() {
            m.entry(s).or_default().push((nums, l));
        }
    }
    m.values_mut().for_each(|v| v.sort());
    m
}

/// `map` with the base run's labels of `moved` renamed to the new run's.
pub(crate) fn relabel<V>(map: BTreeMap<String, V>, moved: &[Moved]) -> BTreeMap<String, V> {
    let to: BTreeMap<&str, &str> = moved.iter().map(|m| (m.base.as_str(), m.new.as_str())).collect();
    map.into_iter().map(|(k, v)| (to.get(k.as_str()).map_or(k, |n| n.to_string()), v)).collect()
}

/// Per call site over a whole trace: allocations made and bytes requested.
/// As `fit` aligns requests, the stream counts too: streams by order of
/// first use (their handles differ between processes), a side stream's
/// requests apart from the default one's.
pub(crate) fn requests_by_site(dev: &DeviceTrace, stacks: &[Vec<Frame>]) -> BTreeMap<String, (u64, u64)> {
    requests_by_site_in(dev, stacks, Spans::of_cores())
}

/// `requests_by_site`, the events cut as `sp` says: each span counts by
/// stack and stream, and names its streams in order of first use; labels
/// are made once per stack at the end (a label per allocation, cloned and
/// looked up by text, was 0.12 s of a 10M diff on one thread after both
/// runs were open: docs/measurements/benchmarks.md, "diff's call sites").
fn requests_by_site_in(dev: &DeviceTrace, stacks: &[Vec<Frame>], sp: Spans) -> BTreeMap<String, (u64, u64)> {
    type Counts = HashMap<(u32, u64), (u64, u64)>;
    // Bytes are the file's: summed without wrapping.
    let add = |t: &mut (u64, u64), made: u64, bytes: u64| {
        t.0 += made;
        t.1 = t.1.saturating_add(bytes);
    };
    let events = dev.events.view();
    let n = events.len().min(dev.stacks.len());
    // Per span, each stream's first allocation there, and the counts.
    let parts = sp.map(n, |r| {
        let (mut first, mut counts) = (HashMap::<u64, usize>::new(), Counts::new());
        for (i, (e, &sid)) in r.clone().zip(events.slice(r.clone()).iter().zip(&dev.stacks[r])) {
            if e.action == Action::Alloc {
                first.entry(e.stream).or_insert(i);
                add(counts.entry((sid, e.stream)).or_default(), 1, e.size);
            }
        }
        (first, counts)
    });
    let (mut first, mut counts) = (HashMap::<u64, usize>::new(), Counts::new());
    for (f, c) in parts {
        // The spans in order: a stream's first span says its first use.
        for (stream, i) in f {
            first.entry(stream).or_insert(i);
        }
        for (k, (made, bytes)) in c {
            add(counts.entry(k).or_default(), made, bytes);
        }
    }
    // Ranked by first use with a sort, not a search per stream: a file
    // names as many streams as it likes.
    let mut by_use: Vec<(usize, u64)> = first.into_iter().map(|(stream, i)| (i, stream)).collect();
    by_use.sort_unstable();
    let rank: HashMap<u64, usize> = by_use.into_iter().enumerate().map(|(k, (_, stream))| (stream, k)).collect();
    let mut labels: HashMap<u32, String> = HashMap::new();
    let mut out: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for ((sid, stream), (made, bytes)) in counts {
        let mut label = labels
            .entry(sid)
            .or_insert_with(|| {
                site_label(sid.checked_sub(1).and_then(|s| stacks.get(s as usize)).map_or(&[][..], |f| f.as_slice()))
            })
            .clone();
        if let Some(&k) = rank.get(&stream).filter(|&&k| k > 0) {
            label.push_str(&format!(" [stream {k}]"));
        }
        add(out.entry(label).or_default(), made, bytes);
    }
    out
}

/// One row of growth: a call site's or a category's bytes in each run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct GrowthRow {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) call_site: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) category: Option<Category>,
    pub(crate) base_bytes: u64,
    pub(crate) new_bytes: u64,
    pub(crate) delta_bytes: i64,
    /// Blocks in the new run (`base_blocks` in the base).
    pub(crate) blocks: usize,
    pub(crate) base_blocks: usize,
}

/// Every key of either map, the largest change of either sign first (a
/// run that fell shows where first, not a small growth); keys that did not
/// change are left out.
fn rows<K: Ord + Clone>(
    base: &BTreeMap<K, (u64, usize)>,
    new: &BTreeMap<K, (u64, usize)>,
    make: impl Fn(&K) -> (Option<String>, Option<Category>),
) -> Vec<GrowthRow> {
    let mut keys: Vec<&K> = base.keys().chain(new.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut out: Vec<GrowthRow> = keys
        .into_iter()
        .map(|k| {
            let (b, n) = (base.get(k).copied().unwrap_or_default(), new.get(k).copied().unwrap_or_default());
            let (call_site, category) = make(k);
            GrowthRow {
                call_site,
                category,
                base_bytes: b.0,
                new_bytes: n.0,
                delta_bytes: n.0 as i64 - b.0 as i64,
                blocks: n.1,
                base_blocks: b.1,
            }
        })
        .filter(|r| r.delta_bytes != 0 || r.blocks != r.base_blocks)
        .collect();
    out.sort_by_key(|r| {
        (std::cmp::Reverse(r.delta_bytes.unsigned_abs()), std::cmp::Reverse(r.delta_bytes), r.call_site.clone())
    });
    out
}

/// The growth between two moments, by call site and by category.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Growth {
    pub(crate) by_call_site: Vec<GrowthRow>,
    pub(crate) by_category: Vec<GrowthRow>,
}

impl Growth {
    pub(crate) fn between(base: &Holdings, new: &Holdings) -> Growth {
        Growth {
            by_call_site: rows(&base.by_call_site, &new.by_call_site, |k| (Some(k.clone()), None)),
            by_category: rows(&base.by_category, &new.by_category, |k| (None, Some(*k))),
        }
    }
}

/// A call site's requests in each run, and what changed.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RequestRow {
    pub(crate) call_site: String,
    pub(crate) base_allocations: u64,
    pub(crate) new_allocations: u64,
    pub(crate) base_bytes: u64,
    pub(crate) new_bytes: u64,
    /// new / base bytes (null for a new line).
    pub(crate) ratio: Option<f64>,
    pub(crate) change: Change,
}

/// What became of a call site's requests (JSON: "new", "gone", "grew",
/// "shrank", "same").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Change {
    New,
    Gone,
    Grew,
    Shrank,
    /// Within 1% either way.
    Same,
}

impl Change {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Change::New => "new",
            Change::Gone => "gone",
            Change::Grew => "grew",
            Change::Shrank => "shrank",
            Change::Same => "same",
        }
    }
}

/// The requests of both runs aligned by call site: what is new, gone, or
/// asks for more or less (a change of 1% or less is "same"); the share of
/// the requested bytes whose call site both runs have.
pub(crate) fn align(base: &BTreeMap<String, (u64, u64)>, new: &BTreeMap<String, (u64, u64)>) -> (Vec<RequestRow>, f64) {
    let mut keys: Vec<&String> = base.keys().chain(new.keys()).collect();
    keys.sort();
    keys.dedup();
    let (mut shared, mut all) = (0u128, 0u128);
    let mut out: Vec<RequestRow> = keys
        .into_iter()
        .map(|k| {
            let (b, n) = (base.get(k).copied(), new.get(k).copied());
            let (bb, nb) = (b.map_or(0, |x| x.1), n.map_or(0, |x| x.1));
            // Allocations without frames align with anything: they say
            // nothing of whether the programs are one.
            if k.as_str() != NO_FRAMES {
                all += u128::from(bb) + u128::from(nb);
                if b.is_some() && n.is_some() {
                    shared += u128::from(bb) + u128::from(nb);
                }
            }
            let ratio = (bb > 0).then(|| nb as f64 / bb as f64);
            let change = match (b, n, ratio) {
                (None, _, _) => Change::New,
                (_, None, _) => Change::Gone,
                (_, _, Some(r)) if r > 1.01 => Change::Grew,
                (_, _, Some(r)) if r < 0.99 => Change::Shrank,
                _ => Change::Same,
            };
            RequestRow {
                call_site: k.clone(),
                base_allocations: b.map_or(0, |x| x.0),
                new_allocations: n.map_or(0, |x| x.0),
                base_bytes: bb,
                new_bytes: nb,
                ratio,
                change,
            }
        })
        .filter(|r| r.change != Change::Same)
        .collect();
    out.sort_by_key(|r| (std::cmp::Reverse(r.new_bytes.abs_diff(r.base_bytes)), r.call_site.clone()));
    let share = if all == 0 { 1.0 } else { shared as f64 / all as f64 };
    (out, share)
}

/// How much `new` grew over `base`, as a fraction (0 when base is 0 and new
/// is too).
pub(crate) fn growth(base: u64, new: u64) -> f64 {
    match base {
        0 if new == 0 => 0.0,
        0 => f64::INFINITY,
        b => new as f64 / b as f64 - 1.0,
    }
}

/// One run's timeline for the overlay: allocated and reserved after each
/// event, and where its iterations end.
#[derive(Debug, Clone)]
pub(crate) struct Series {
    pub(crate) points: Vec<crate::alloc::StatePoint>,
    pub(crate) peak: Option<usize>,
    /// 0, each iteration's end (`Optimizer.step` markers), the event count.
    bounds: Vec<usize>,
}

impl Series {
    pub(crate) fn new(points: Vec<crate::alloc::StatePoint>, iterations: &[usize]) -> Series {
        let n = points.len().max(1);
        let mut bounds = vec![0usize];
        bounds.extend(iterations.iter().copied().filter(|&m| m > 0 && m < n));
        bounds.push(n);
        bounds.dedup();
        let peak = super::peak_index(&points);
        Series { points, peak, bounds }
    }

    /// Event `i` on the shared axis: iterations aligned, so that iteration
    /// k spans [k, k+1) in both runs whatever their event counts; a run
    /// without markers spans [0, 1).
    pub(crate) fn x_of(&self, i: usize) -> f64 {
        let b = &self.bounds;
        let k = b.partition_point(|&x| x <= i).saturating_sub(1).min(b.len().saturating_sub(2));
        let (lo, hi) = (b[k], b[k + 1].max(b[k] + 1));
        k as f64 + i.saturating_sub(lo) as f64 / (hi - lo) as f64
    }

    /// Iterations on the shared axis.
    pub(crate) fn span(&self) -> f64 {
        (self.bounds.len() - 1).max(1) as f64
    }

    /// The last event at or before `x` on the shared axis.
    pub(crate) fn at_x(&self, x: f64) -> usize {
        let n = self.points.len();
        let (mut lo, mut hi) = (0usize, n);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.x_of(mid) <= x {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo.saturating_sub(1)
    }
}

/// One run's own figures, as its own replay gives them.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RunReport {
    pub(crate) trace: String,
    pub(crate) events: usize,
    /// "exact" or "exact-window"; a window's peaks are the window's.
    pub(crate) fidelity: &'static str,
    /// Optimizer steps seen (its `Optimizer.step` markers).
    pub(crate) iterations: usize,
    pub(crate) peak_allocated_bytes: u64,
    pub(crate) peak_reserved_bytes: u64,
    /// Allocated at the end of the trace: what is still alive.
    pub(crate) end_allocated_bytes: u64,
    pub(crate) num_alloc_retries: i64,
    pub(crate) num_ooms: i64,
}

/// A figure in both runs.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Pair {
    pub(crate) base: u64,
    pub(crate) new: u64,
    pub(crate) delta: i64,
    /// new / base − 1 (null when base is 0).
    pub(crate) growth: Option<f64>,
}

impl Pair {
    pub(crate) fn of(base: u64, new: u64) -> Pair {
        let g = growth(base, new);
        Pair { base, new, delta: new as i64 - base as i64, growth: g.is_finite().then_some(g) }
    }
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Peaks {
    pub(crate) allocated: Pair,
    pub(crate) reserved: Pair,
    pub(crate) end_allocated: Pair,
    pub(crate) num_alloc_retries: [i64; 2],
    pub(crate) num_ooms: [i64; 2],
}

#[derive(Debug, Serialize)]
pub(crate) struct DiffReport {
    pub(crate) base: RunReport,
    pub(crate) new: RunReport,
    pub(crate) peak: Peaks,
    pub(crate) at_peak: Growth,
    pub(crate) at_end: Growth,
    /// Requests aligned by call site: new, gone, grown or shrunk lines.
    pub(crate) requests: Vec<RequestRow>,
    /// Share of the requested bytes whose call site both runs have.
    pub(crate) aligned_share: f64,
    /// Call sites matched across an edit of the script (compared as one).
    pub(crate) moved_call_sites: Vec<Moved>,
    /// What the comparison covers, and its limits.
    pub(crate) notes: Vec<String>,
    /// With `--fail-on-growth`: what grew past it (empty: the gate passes).
    pub(crate) regressions: Vec<String>,
}

/// What the diff screen shows (built by `cli::diff`, drawn by `view::diff`).
pub(crate) struct DiffModel {
    pub(crate) report: DiffReport,
    pub(crate) base: Series,
    pub(crate) new: Series,
}

impl DiffModel {
    /// The shared axis's length: the longer run's iterations.
    pub(crate) fn span(&self) -> f64 {
        self.base.span().max(self.new.span())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests per call site as one pass reads them: a label per
    /// allocation, the streams ranked as each is first used.
    fn requests_in_one_pass(dev: &DeviceTrace, stacks: &[Vec<Frame>]) -> BTreeMap<String, (u64, u64)> {
        let (mut streams, mut out) = (Vec::new(), BTreeMap::<String, (u64, u64)>::new());
        for (e, &sid) in dev.events.iter().zip(dev.stacks.iter()).filter(|(e, _)| e.action == Action::Alloc) {
            if !streams.contains(&e.stream) {
                streams.push(e.stream);
            }
            let rank = streams.iter().position(|&s| s == e.stream).unwrap_or(0);
            let frames = sid.checked_sub(1).and_then(|s| stacks.get(s as usize)).map_or(&[][..], |f| f.as_slice());
            let mut label = site_label(frames);
            if rank > 0 {
                label.push_str(&format!(" [stream {rank}]"));
            }
            let r = out.entry(label).or_default();
            r.0 += 1;
            r.1 += e.size;
        }
        out
    }

    /// A file may name a new stream at every allocation, and sizes near
    /// `u64::MAX`: the streams are ranked by a sort (a search per stream was
    /// quadratic in them) and the totals stop at `u64::MAX`, not wrap.
    #[test]
    fn a_stream_per_allocation_is_ranked_by_a_sort_and_huge_sizes_do_not_wrap() {
        let n = 100_000u64;
        let mut d = crate::trace::DeviceColumns::default();
        for i in 0..n {
            // Every stream distinct (7,919 and 100,000 share no factor).
            d.push(crate::alloc::Event::new(Action::Alloc, 512 * i, 512, (1 << 20) | ((i * 7_919) % n)), i as i64, 0);
        }
        d.push(crate::alloc::Event::new(Action::Alloc, 1 << 40, u64::MAX - 1, 1 << 20), n as i64, 0);
        let d = d.into_trace(0);
        let t = std::time::Instant::now();
        let got = requests_by_site_in(&d, &[], Spans::exactly(4));
        assert!(t.elapsed() < std::time::Duration::from_secs(2), "{:?}", t.elapsed());
        assert_eq!(got.len(), n as usize);
        // The first stream used is the default's; the last used ranks last.
        assert_eq!(got[NO_FRAMES], (2, u64::MAX));
        assert_eq!(got[&format!("{NO_FRAMES} [stream {}]", n - 1)], (1, 512));
    }

    /// However the events are cut, the requests per call site are one
    /// pass's: on every trace of the diff and categories fixtures, and on
    /// one whose side streams are first used in later spans than others
    /// (ranked by first use over the whole trace, not per span) and whose
    /// two stacks share a label.
    #[test]
    fn requests_by_site_in_spans_are_one_pass() {
        let mut traces = crate::trace::fixture_traces("diff");
        traces.extend(crate::trace::fixture_traces("categories"));
        let mut d = crate::trace::DeviceColumns::default();
        let at = |file: &str, line| crate::trace::Frame { name: "step".into(), filename: file.into(), line };
        let stacks = vec![vec![at("train.py", 7)], vec![at("train.py", 7)]];
        for i in 0..1200u64 {
            // Stream 9 from the middle on, stream 5 only near the end.
            let stream = match i {
                1100.. if i % 3 == 0 => 5,
                600.. if i % 2 == 0 => 9,
                _ => 1,
            };
            // Stacks 1 and 2 (one label) and none; every fourth event a free.
            let action = if i % 4 == 3 { Action::FreeRequested } else { Action::Alloc };
            d.push(crate::alloc::Event::new(action, 512 * i, 512 + i, stream), i as i64, (i % 4) as u32);
        }
        let d = d.into_trace(0);
        let mut checked = 0;
        let devs = traces.iter().filter_map(|(p, t)| Some((p.display().to_string(), t.main_device()?, &t.stacks)));
        for (name, dev, stacks) in devs.chain([("side streams".to_string(), &d, &stacks)]) {
            let one = requests_in_one_pass(dev, stacks);
            for k in [1, 2, 3, 7] {
                assert_eq!(requests_by_site_in(dev, stacks, Spans::exactly(k)), one, "{name} in {k} spans");
            }
            checked += usize::from(!one.is_empty());
        }
        let side = requests_in_one_pass(&d, &stacks);
        assert_eq!(side.len(), 6, "{side:?}");
        assert!(side.contains_key("train.py:7 step [stream 2]"), "{side:?}");
        assert!(checked >= 12, "{checked}");
    }

    #[test]
    fn a_thousand_moved_lines_of_one_shape_pair_in_line_order_without_weighing_a_million_pairs() {
        let base: Vec<String> = (0..1000).map(|k| format!("train.py:{k} step")).collect();
        let new: Vec<String> = (0..1000).map(|k| format!("train.py:{} step", k + 2000)).collect();
        let (b, n) = (base.iter().map(String::as_str).collect(), new.iter().map(String::as_str).collect());
        let t = std::time::Instant::now();
        let moved = moved_sites(&b, &n, |_, _| (1, 512));
        assert!(t.elapsed() < std::time::Duration::from_secs(2), "{:?}", t.elapsed());
        assert_eq!(moved.len(), 1000);
        for m in &moved {
            let line = |l: &str| -> u64 { shape(l).1[0] };
            assert_eq!(line(&m.new), line(&m.base) + 2000, "{m:?}");
        }
    }
}
