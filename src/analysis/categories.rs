//! What the memory is: every allocation of a trace put in one category
//! (parameter, gradient, optimizer state, activation, input, temporary, or
//! unknown where the evidence is missing), from the trace alone: its call
//! stacks, the lifetimes of its blocks and the iteration structure that
//! stacks or the optimizer's markers show. The method and its measured
//! accuracy: docs/user/categories.md.

// A fast hasher: the maps here are keyed by addresses and ids, one lookup
// per event of traces of up to millions (docs/measurements/benchmarks.md "Categories").
use foldhash::{HashMap, HashMapExt, HashSet};

use serde::Serialize;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use super::spans::{joined, Spans};
use crate::alloc::{Action, Event, EventsRef};
use crate::trace::deltas::Deltas;
use crate::trace::{Annotation, DeviceTrace, Frame, RecordedSegment};

/// What one allocated block holds (docs/user/categories.md §Categories).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Parameter,
    Gradient,
    OptimizerState,
    Activation,
    Input,
    Temporary,
    Unknown,
}

impl Category {
    /// Every category, in the order bars, legends and reports list them.
    pub const ALL: [Category; 7] = [
        Category::Parameter,
        Category::Gradient,
        Category::OptimizerState,
        Category::Activation,
        Category::Input,
        Category::Temporary,
        Category::Unknown,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Category::Parameter => "parameter",
            Category::Gradient => "gradient",
            Category::OptimizerState => "optimizer_state",
            Category::Activation => "activation",
            Category::Input => "input",
            Category::Temporary => "temporary",
            Category::Unknown => "unknown",
        }
    }

    /// A short label for bars and legends.
    pub fn label(self) -> &'static str {
        match self {
            Category::Parameter => "params",
            Category::Gradient => "grads",
            Category::OptimizerState => "optim",
            Category::Activation => "activ",
            Category::Input => "input",
            Category::Temporary => "temp",
            Category::Unknown => "unknown",
        }
    }

    /// As a sentence names it: "activations", "optimizer state".
    pub fn plural(self) -> &'static str {
        match self {
            Category::Parameter => "parameters",
            Category::Gradient => "gradients",
            Category::OptimizerState => "optimizer state",
            Category::Activation => "activations",
            Category::Input => "inputs",
            Category::Temporary => "temporaries",
            Category::Unknown => "unknown",
        }
    }

    /// What the category holds, as the help screen and docs define it.
    pub fn meaning(self) -> &'static str {
        match self {
            Category::Parameter => "model weights and buffers: alive from before the first forward to the end",
            Category::Gradient => "a parameter's .grad: made in backward, kept across the optimizer step",
            Category::OptimizerState => "made in the optimizer's step and kept after it (Adam's moments, momentum)",
            Category::Activation => "kept by autograd for backward: made in forward, freed in backward",
            Category::Input => "the batch: made outside the model before forward, kept through backward",
            Category::Temporary => "everything else: op workspaces, intermediates, results freed within the step",
            Category::Unknown => "no evidence to tell (no call stacks and no optimizer markers)",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Bytes per category, indexed as `Category::ALL`; in JSON, an object
/// from category name to bytes in that order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CategoryBytes(pub [u64; 7]);

impl Serialize for CategoryBytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(7))?;
        for c in Category::ALL {
            m.serialize_entry(c.name(), &self.get(c))?;
        }
        m.end()
    }
}

impl CategoryBytes {
    pub fn get(&self, c: Category) -> u64 {
        self.0[c.index()]
    }

    pub fn total(&self) -> u64 {
        // Saturating: a publisher's figures are input.
        self.0.iter().fold(0u64, |a, &b| a.saturating_add(b))
    }

    /// "activations 2.9 GiB (54%), temporaries …": the non-empty
    /// categories, largest first.
    pub fn describe(&self) -> String {
        if self.total() == 0 {
            return "no tensors allocated".into();
        }
        self.parts().join(", ")
    }

    /// `describe`'s parts: "activations 2.9 GiB (54%)", one per non-empty
    /// category, largest first.
    pub(crate) fn parts(&self) -> Vec<String> {
        let total = self.total().max(1);
        self.largest_first()
            .iter()
            .map(|&(c, b)| {
                let pct = (u128::from(b) * 100 + u128::from(total) / 2) / u128::from(total);
                format!("{} {} ({pct}%)", c.plural(), crate::analysis::human_bytes(b))
            })
            .collect()
    }

    /// The categories holding bytes, largest first (ties in `ALL` order).
    pub fn largest_first(&self) -> Vec<(Category, u64)> {
        let mut v: Vec<(Category, u64)> = Category::ALL.iter().map(|&c| (c, self.get(c))).filter(|x| x.1 > 0).collect();
        v.sort_by_key(|x| std::cmp::Reverse(x.1));
        v
    }

    pub(crate) fn add(&mut self, c: Category, n: u64) {
        self.0[c.index()] = self.0[c.index()].saturating_add(n);
    }

    pub(crate) fn sub(&mut self, c: Category, n: u64) {
        self.0[c.index()] = self.0[c.index()].saturating_sub(n);
    }
}

/// What the categories were told from (docs/user/categories.md §Evidence).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Evidence {
    /// Per-allocation call stacks, lifetimes and the iteration structure.
    Stacks,
    /// No stacks: lifetimes, and iterations from the optimizer's
    /// `Optimizer.step` markers.
    Markers,
    /// A snapshot without history: the live blocks' own stacks only.
    BlockStacks,
    /// Neither stacks nor markers: everything unknown.
    None,
}

impl Evidence {
    pub fn name(self) -> &'static str {
        match self {
            Evidence::Stacks => "stacks",
            Evidence::Markers => "markers",
            Evidence::BlockStacks => "block_stacks",
            Evidence::None => "none",
        }
    }

    /// One line on what the categories rest on, for summaries and help.
    pub fn describe(self) -> &'static str {
        match self {
            Evidence::Stacks => "from call stacks, lifetimes and iterations",
            Evidence::Markers => "without call stacks: from lifetimes and the optimizer's step markers (less certain)",
            Evidence::BlockStacks => {
                "from the live blocks' own stacks only (no history): activations and temporaries cannot be told apart"
            }
            Evidence::None => "no call stacks and no optimizer markers: nothing to tell categories by",
        }
    }
}

/// Where an allocation was made, from its stack (or, without stacks, from
/// its place in the iteration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The program's own thread outside backward and the optimizer:
    /// building the model, loading the batch, forward.
    Main,
    Backward,
    Optimizer,
}

/// A block alive at the trace's first event (a window's start, or every
/// block of a snapshot without history), with its stack if the snapshot
/// kept one.
#[derive(Debug, Clone, Copy)]
pub struct StartBlock {
    pub address: u64,
    pub size: u64,
    pub stack: u32,
}

/// Every allocation's category, and the bytes per category at any event.
#[derive(Debug, Clone)]
pub struct Categories {
    pub evidence: Evidence,
    /// Per event: the category of the allocation an `alloc` makes or a
    /// `free_requested` ends (`None` for other events).
    of_event: Vec<Option<Category>>,
    /// Per event: the bytes an `alloc` adds to (a `free_requested` takes
    /// from, negative) the allocated total; 0 for other events.
    steps: Arc<Deltas>,
    /// Blocks alive at the first event, by address.
    at_start: HashMap<u64, Category>,
    /// Every `alloc` event by address, then event: the allocation that
    /// made a block is the last one at its address before a point.
    allocs_at: AllocsAt,
    /// Bytes per category before event `k * SAMPLE`; the first, before any.
    samples: Vec<CategoryBytes>,
    /// No step saturates a category (none goes below nothing or past
    /// `u64`): the bytes after an event are also the next sample's with
    /// the steps between taken back.
    exact: bool,
}

/// Events between samples: the bytes after an event walk at most half
/// of them, from the nearer sample. A 10M frame by category walks to each
/// of its 400 columns' peaks; at 128 a frame's walks took half the time
/// of 256's, for 0.44 bytes an event (docs/measurements/benchmarks.md,
/// "Samples of the categories' bytes twice as near").
const SAMPLE: usize = 128;

/// What `Categories::prepare` reads from a trace alone, before the replay.
pub struct Prepared {
    events: usize,
    /// Stacks, markers, or none (block stacks are decided by the start).
    evidence: Evidence,
    of_event: Vec<Option<Category>>,
    runs: Runs,
}

impl Prepared {
    /// Whether it was made from a trace of `events` events.
    pub fn fits(&self, events: usize) -> bool {
        self.events == events
    }
}

impl Categories {
    /// Categorizes a device's trace. `start` are the blocks alive before its
    /// first event (empty for a trace from process start); `allocated`, how
    /// allocated bytes changed at each event as an exact replay counted them
    /// and what they were before the first (`ReplayResult::allocated`),
    /// gives the blocks' sizes: the trace's are the requests'.
    pub fn of(
        dev: &DeviceTrace,
        stacks: &[Vec<Frame>],
        annotations: &[Annotation],
        start: &[StartBlock],
        allocated: Option<(&Arc<Deltas>, u64)>,
    ) -> Categories {
        Self::finish(Self::prepare(dev, stacks, annotations), dev, stacks, start, allocated)
    }

    /// The part of `of` that needs neither the replay nor the blocks alive
    /// at the start (most of its time on a long trace), so that it can run
    /// beside the replay (docs/measurements/benchmarks.md, "Ten million
    /// events").
    pub fn prepare(dev: &DeviceTrace, stacks: &[Vec<Frame>], annotations: &[Annotation]) -> Prepared {
        Self::prepare_in(dev, stacks, annotations, Spans::of_cores())
    }

    /// `prepare`, each pass over the events cut as `sp` says.
    fn prepare_in(dev: &DeviceTrace, stacks: &[Vec<Frame>], annotations: &[Annotation], sp: Spans) -> Prepared {
        let windows = optimizer_windows(&dev.time_us, annotations, dev.device);
        let evidence = if dev.call_stacks(stacks) == crate::trace::CallStacks::PerEvent {
            Evidence::Stacks
        } else if !windows.is_empty() {
            Evidence::Markers
        } else {
            Evidence::None
        };
        // Passes over the events that need nothing of each other side by
        // side where the system gives threads, and each cut into spans
        // where it can be (a 10M trace's categories were 0.5 s after its
        // decoding, one pass after the other: docs/design/trace-decoding.md,
        // "What is left").
        let (end, facts, phases) = std::thread::scope(|s| {
            let end = std::thread::Builder::new().name("lifetimes".into());
            let end = end.spawn_scoped(s, || lifetimes(dev, sp)).ok();
            let facts = stack_facts(dev, stacks, sp);
            let phases = phases(dev, &facts, evidence, &windows, sp);
            (end.map_or_else(|| lifetimes(dev, sp), joined), facts, phases)
        });
        let runs = Runs::of(&phases, sp);
        let t = Trace { dev, evidence, facts, phases, end, runs };
        let of_event = if matches!(evidence, Evidence::Stacks | Evidence::Markers) {
            t.categorize(sp)
        } else {
            vec![None; dev.events.len()]
        };
        let Trace { runs, .. } = t;
        Prepared { events: dev.events.len(), evidence, of_event, runs }
    }

    /// `of` from what `prepare` made of the same trace.
    pub fn finish(
        p: Prepared,
        dev: &DeviceTrace,
        stacks: &[Vec<Frame>],
        start: &[StartBlock],
        allocated: Option<(&Arc<Deltas>, u64)>,
    ) -> Categories {
        let Prepared { evidence, mut of_event, runs, .. } = p;
        let frames = |sid: u32| sid.checked_sub(1).and_then(|s| stacks.get(s as usize)).map(|f| f.as_slice());
        // History recorded as state only (no trace, or one without stacks or
        // markers): the blocks' own stacks.
        let evidence =
            if evidence == Evidence::None && start.iter().any(|b| frames(b.stack).is_some_and(|f| !f.is_empty())) {
                Evidence::BlockStacks
            } else {
                evidence
            };
        let ends = start_ends(dev, start);
        let start_end = |a: u64| ends.get(&a).copied();

        // Blocks alive at the start: by their own stacks where the snapshot
        // kept them, else by when they are freed.
        let mut at_start = HashMap::with_capacity(start.len());
        // What a block's own stack says, read once per stack: many blocks
        // share one (docs/user/input.md, "Bounds").
        let mut by_stack: HashMap<u32, Category> = HashMap::new();
        for b in start {
            let f = frames(b.stack).filter(|f| !f.is_empty());
            let ends_in = start_end(b.address).map(|j| runs.at(j));
            let c = match (f, evidence) {
                (_, Evidence::None) => Category::Unknown,
                (Some(f), _) => *by_stack.entry(b.stack).or_insert_with(|| match phase_of(f, false) {
                    Phase::Optimizer => Category::OptimizerState,
                    Phase::Backward => Category::Gradient,
                    Phase::Main if builds_model(f) => Category::Parameter,
                    Phase::Main if in_model(f) => Category::Activation,
                    Phase::Main => Category::Input,
                }),
                (None, _) if ends_in.is_some_and(|r| runs.phase(r) == Phase::Backward) => Category::Activation,
                (None, _) => Category::Unknown,
            };
            at_start.insert(b.address, c);
            if let Some(j) = start_end(b.address) {
                of_event[j] = Some(c);
            }
        }
        // Where each allocation is, beside the bytes counted (after the
        // categorizing, whose tables are gone by now: a 10M trace's replay
        // is at its most memory then).
        std::thread::scope(|s| {
            let at = std::thread::Builder::new().name("allocations".into());
            let at = at.spawn_scoped(s, || allocs_at(dev, Spans::of_cores())).ok();
            let (steps, (samples, exact)) = Self::counted(dev, start, allocated, &of_event, &at_start);
            let allocs_at = at.map_or_else(|| allocs_at(dev, Spans::of_cores()), joined);
            Categories { evidence, of_event, steps, at_start, allocs_at, samples, exact }
        })
    }

    /// Each event's step of the allocated bytes, and the bytes per category
    /// every `SAMPLE` events.
    fn counted(
        dev: &DeviceTrace,
        start: &[StartBlock],
        allocated: Option<(&Arc<Deltas>, u64)>,
        of_event: &[Option<Category>],
        at_start: &HashMap<u64, Category>,
    ) -> (Arc<Deltas>, (Vec<CategoryBytes>, bool)) {
        let n = dev.events.len();
        let mut bytes = CategoryBytes::default();
        for b in start {
            bytes.add(at_start.get(&b.address).copied().unwrap_or(Category::Unknown), b.size);
        }
        // An event's step: the change of the replay's allocated bytes
        // where there is one, else the trace's (requested) size.
        let signed = |e: Event, n: u64| match e.action {
            Action::Alloc => n as i64,
            Action::FreeRequested => -(n as i64),
            _ => 0,
        };
        let steps: Arc<Deltas> = match allocated.filter(|(a, _)| a.len() == n) {
            // The replay's own changes are the steps where each grows at an
            // alloc, shrinks at a free and stays put elsewhere (as in every
            // exact replay): shared, not copied.
            Some((a, before)) if before == bytes.total() && Self::steps_alike(dev, a, signed) => a.clone(),
            Some((a, before)) => {
                let mut steps = Deltas::with_capacity(n);
                let (mut now, mut prev) = (before, bytes.total());
                for (e, d) in dev.events.iter().zip(a.iter()) {
                    now = now.wrapping_add(d as u64);
                    steps.push(signed(e, now.abs_diff(prev)));
                    prev = now;
                }
                Arc::new(steps)
            }
            None => Arc::new(dev.events.iter().map(|e| signed(e, e.size)).collect()),
        };
        let samples = Self::sampled(bytes, &steps, of_event, Spans::of_cores());
        (steps, samples)
    }

    /// The bytes per category before event `k * SAMPLE`, from `bytes`
    /// before the first, each event's step applied to its category. The
    /// spans (whole samples each) find where their steps can take each
    /// category, so that each span's first bytes are known before it is
    /// counted, and then count side by side; where a category could go
    /// below nothing or past `u64` (the steps saturate there) every span
    /// is counted in turn from the last one's end. With the samples, whether
    /// no step saturates (every span stays within reach).
    fn sampled(
        bytes: CategoryBytes,
        steps: &Deltas,
        of_event: &[Option<Category>],
        sp: Spans,
    ) -> (Vec<CategoryBytes>, bool) {
        let n = of_event.len().min(steps.len());
        let cut = sp.cut_whole(n, SAMPLE);
        // Span `r`'s samples, into `out`: those before its events at
        // whole samples, but the first event's.
        let count = |mut b: CategoryBytes, r: std::ops::Range<usize>, out: &mut [CategoryBytes]| {
            let mut out = out.iter_mut();
            for i in r {
                if i % SAMPLE == 0 && i > 0 {
                    if let Some(o) = out.next() {
                        *o = b;
                    }
                }
                apply(&mut b, steps.get(i), of_event[i]);
            }
        };
        let mut samples = vec![bytes; n.div_ceil(SAMPLE).max(1)];
        // Per span and category: the change, and the least and most it
        // reaches on the way.
        let reach = |r: std::ops::Range<usize>| {
            let mut walk = [(0i128, 0i128, 0i128); 7];
            for i in r {
                let w = &mut walk[of_event[i].unwrap_or(Category::Unknown).index()];
                w.0 += i128::from(steps.get(i));
                (w.1, w.2) = (w.1.min(w.0), w.2.max(w.0));
            }
            walk
        };
        let mut firsts = vec![bytes];
        for walk in super::spans::each(cut.clone(), reach) {
            let b = firsts[firsts.len() - 1];
            let stays = (0..7).all(|c| {
                let at = i128::from(b.0[c]);
                at + walk[c].1 >= 0 && at + walk[c].2 <= i128::from(u64::MAX)
            });
            if !stays {
                count(bytes, 0..n, &mut samples[1..]);
                return (samples, false);
            }
            firsts.push(CategoryBytes(std::array::from_fn(|c| (i128::from(b.0[c]) + walk[c].0) as u64)));
        }
        // Each span's part of the samples: those of its whole samples past
        // the first event's.
        let mut parts = Vec::with_capacity(cut.len());
        let mut rest = &mut samples[1..];
        for (r, b) in cut.into_iter().zip(firsts) {
            let k = r.end.div_ceil(SAMPLE).saturating_sub(r.start.max(1).div_ceil(SAMPLE));
            let k = k.min(rest.len());
            let (part, tail) = std::mem::take(&mut rest).split_at_mut(k);
            parts.push((r, b, part));
            rest = tail;
        }
        super::spans::each(parts, |(r, b, part)| count(b, r, part));
        (samples, true)
    }

    /// Whether each of `a` is `signed` of its event and its size: a pass
    /// over every event, cut into spans.
    fn steps_alike(dev: &DeviceTrace, a: &Deltas, signed: impl Fn(Event, u64) -> i64 + Sync) -> bool {
        let events = dev.events.view();
        let alike = Spans::of_cores().map(events.len(), |r| {
            r.clone().zip(events.slice(r)).all(|(i, e)| {
                let d = a.get(i);
                signed(e, d.unsigned_abs()) == d
            })
        });
        alike.into_iter().all(|x| x)
    }

    /// Bytes per category right after event `i` (before the first event
    /// when `i` is `None`).
    pub fn bytes_after(&self, i: Option<usize>) -> CategoryBytes {
        match i {
            Some(i) => self.going_on(None, i),
            None => self.samples.first().copied().unwrap_or_default(),
        }
    }

    /// `bytes_after(Some(i))` for each of `events`, ascending: each goes on
    /// from the one before where that is past its sample, so a timeline's
    /// columns a few events apart apply each step once, not up to a
    /// sample's worth each (docs/measurements/benchmarks.md, "Frames on the
    /// device's cores, and range maxima in three levels").
    pub fn bytes_after_each(&self, events: &[usize]) -> Vec<CategoryBytes> {
        let mut at = None;
        events
            .iter()
            .map(|&i| {
                let b = self.going_on(at, i);
                at = Some((i, b));
                b
            })
            .collect()
    }

    /// Bytes per category right after event `i`: from `before` (the bytes
    /// right after an earlier event) where that is past `i`'s sample, else
    /// from the sample.
    fn going_on(&self, before: Option<(usize, CategoryBytes)>, i: usize) -> CategoryBytes {
        let first = self.samples.first().copied().unwrap_or_default();
        if self.steps.is_empty() {
            return first;
        }
        let i = i.min(self.steps.len() - 1);
        let k = i / SAMPLE;
        let (from, mut b) = match before {
            Some((p, b)) if p <= i && p >= k * SAMPLE => (p + 1, b),
            _ => (k * SAMPLE, self.samples.get(k).copied().unwrap_or(first)),
        };
        // Nearer the next sample, and no step saturates: back from it, half
        // the steps on average (a 10M timeline's columns are each in a
        // sample of their own).
        let next = (k + 1) * SAMPLE;
        if let Some(&after) = self.samples.get(k + 1).filter(|_| self.exact && next - 1 - i < i + 1 - from) {
            let mut b = after;
            for (d, &c) in self.steps.range(i + 1..next).zip(&self.of_event[i + 1..next]) {
                let at = c.unwrap_or(Category::Unknown).index();
                // The inverse of the step `apply` made, which did not saturate.
                b.0[at] = b.0[at].wrapping_sub(d as u64);
            }
            return b;
        }
        for (d, &c) in self.steps.range(from..i + 1).zip(&self.of_event[from..=i]) {
            apply(&mut b, d, c);
        }
        b
    }

    /// The category of the block at `address` alive right after event `i`.
    pub fn of_block(&self, address: u64, i: Option<usize>) -> Category {
        let made = i.and_then(|i| self.allocs_at.last_at(address, i));
        match made {
            Some(a) => self.of_event[a].unwrap_or(Category::Unknown),
            None => self.at_start.get(&address).copied().unwrap_or(Category::Unknown),
        }
    }
}

/// Every allocation's event, by address, then event: the distinct
/// addresses in order, and after each its allocations' events, ascending.
/// Four bytes an allocation (a table of (address, event) pairs took 12).
#[derive(Debug, Clone, Default, PartialEq)]
struct AllocsAt {
    addrs: Vec<u64>,
    /// `events[from[k]..from[k + 1]]` are those at `addrs[k]`.
    from: Vec<u32>,
    events: Vec<u32>,
}

impl AllocsAt {
    /// The last allocation at `address` at or before event `i`.
    fn last_at(&self, address: u64, i: usize) -> Option<usize> {
        let k = self.addrs.binary_search(&address).ok()?;
        let run = self.events.get(self.from[k] as usize..self.from[k + 1] as usize)?;
        let p = run.partition_point(|&e| e as usize <= i);
        Some(run[p.checked_sub(1)?] as usize)
    }
}

/// Where `of_block` finds which allocation made a block. The allocator
/// hands the same few thousand addresses out again and again, so this is a
/// counting sort over the distinct addresses (a hash lookup per
/// allocation) rather than a comparison sort of millions, cut into spans:
/// each counts its allocations per address, the counts say where each
/// span's go (the earlier spans' first, so each address's events stay
/// increasing), and each places its own (one thread took 0.12 s of a 10M
/// trace on the H200).
fn allocs_at(dev: &DeviceTrace, sp: Spans) -> AllocsAt {
    let events = dev.events.view();
    let allocs = |r| events.slice(r).iter().filter(|e| e.action == Action::Alloc).map(|e| e.addr);
    let cut = sp.cut(events.len());
    let counts = super::spans::each(cut.clone(), |r| {
        let mut c: HashMap<u64, u32> = HashMap::new();
        allocs(r).for_each(|a| *c.entry(a).or_default() += 1);
        c
    });
    let mut addrs: Vec<u64> = counts.iter().flat_map(|c| c.keys().copied()).collect();
    addrs.sort_unstable();
    addrs.dedup();
    let k_of: HashMap<u64, usize> = addrs.iter().enumerate().map(|(k, &a)| (a, k)).collect();
    let mut whole = vec![0u32; addrs.len()];
    for (a, n) in counts.iter().flatten() {
        whole[k_of[a]] += n;
    }
    let mut from = Vec::with_capacity(addrs.len() + 1);
    let mut at = 0u32;
    for n in &whole {
        from.push(at);
        at += n;
    }
    from.push(at);
    // Where each span's first allocation at each address goes.
    let mut next = from.clone();
    let starts: Vec<HashMap<u64, u32>> = counts
        .into_iter()
        .map(|c| {
            let place = |(a, n): (u64, u32)| {
                let k = k_of[&a];
                next[k] += n;
                (a, next[k] - n)
            };
            c.into_iter().map(place).collect()
        })
        .collect();
    drop(k_of);
    let placed: Vec<AtomicU32> = (0..at).map(|_| AtomicU32::new(0)).collect();
    super::spans::each(cut.into_iter().zip(starts).collect(), |(r, mut next)| {
        for (i, e) in r.clone().zip(events.slice(r)).filter(|(_, e)| e.action == Action::Alloc) {
            if let Some(slot) = next.get_mut(&e.addr) {
                placed[*slot as usize].store(i as u32, Ordering::Relaxed);
                *slot += 1;
            }
        }
    });
    AllocsAt { addrs, from, events: placed.into_iter().map(AtomicU32::into_inner).collect() }
}

/// Lifetimes: each alloc's free_requested (PyTorch's allocated bytes drop
/// there). Each span of events follows the blocks it allocates and frees
/// itself, and says what it leaves allocated and, per address, whether a
/// free came there before any allocation; those are joined in order. (The
/// addresses dealt out to a thread each, every thread reading every event,
/// took 0.14–0.2 s of a 10M trace on the H200: the reading is the cost.)
fn lifetimes(dev: &DeviceTrace, sp: Spans) -> Ends {
    let events = dev.events.view();
    let n = events.len();
    // Which events are allocations, 64 to a word, each span whole words.
    let mask: Vec<u64> = super::spans::each(sp.cut_whole(n, 64), |r| {
        let word = |w: usize| {
            let e = events.slice(w * 64..(w * 64 + 64).min(n));
            e.iter().enumerate().filter(|(_, e)| e.action == Action::Alloc).fold(0u64, |m, (b, _)| m | 1 << b)
        };
        (r.start.div_ceil(64)..r.end.div_ceil(64)).map(word).collect::<Vec<u64>>()
    })
    .concat();
    let mut allocs = 0u32;
    let before = mask.iter().map(|m| {
        let b = allocs;
        allocs += m.count_ones();
        b
    });
    let mut ends = Ends { end: Vec::new(), before: before.collect(), mask };
    let end: Vec<AtomicU32> = (0..allocs).map(|_| AtomicU32::new(Ends::NONE)).collect();
    let at = |i: usize| u32::try_from(i).unwrap_or(Ends::NONE);
    let spans = sp.map(n, |r| {
        // Each live block's allocation, by its rank among the allocations.
        let mut live: HashMap<u64, u32> = HashMap::new();
        // Per address, its first event here: a free (its event) or an
        // allocation (none), which ends or replaces what came before.
        let mut first: HashMap<u64, Option<u32>> = HashMap::new();
        let mut rank = ends.rank(r.start);
        for (i, e) in r.clone().zip(events.slice(r)) {
            match e.action {
                Action::Alloc => {
                    first.entry(e.addr).or_insert(None);
                    live.insert(e.addr, rank);
                    rank += 1;
                }
                Action::FreeRequested | Action::FreeCompleted => match live.remove(&e.addr) {
                    Some(a) => end[a as usize].store(at(i), Ordering::Relaxed),
                    None => {
                        first.entry(e.addr).or_insert(Some(at(i)));
                    }
                },
                _ => {}
            }
        }
        (first, live)
    });
    // What the spans before leave allocated, span after span.
    let mut carried: HashMap<u64, u32> = HashMap::new();
    for (first, live) in spans {
        for (addr, f) in first {
            if let (Some(a), Some(j)) = (carried.remove(&addr), f) {
                end[a as usize].store(j, Ordering::Relaxed);
            }
        }
        carried.extend(live);
    }
    ends.end = end.into_iter().map(AtomicU32::into_inner).collect();
    ends
}

/// Where each block alive at the start ends: the first free at its address
/// before any allocation there.
fn start_ends(dev: &DeviceTrace, start: &[StartBlock]) -> HashMap<u64, usize> {
    let mut open: HashSet<u64> = start.iter().map(|b| b.address).collect();
    let mut ends = HashMap::with_capacity(open.len());
    for (i, e) in dev.events.iter().enumerate() {
        if open.is_empty() {
            break;
        }
        match e.action {
            Action::Alloc => {
                open.remove(&e.addr);
            }
            Action::FreeRequested | Action::FreeCompleted if open.remove(&e.addr) => {
                ends.insert(e.addr, i);
            }
            _ => {}
        }
    }
    ends
}

/// Each alloc's free_requested, if any, kept by the alloc's rank among the
/// allocations: four bytes an allocation and a bit and a half an event
/// (a column of every event took four bytes an event; a ten-million-event
/// trace needs the difference: docs/measurements/benchmarks.md).
struct Ends {
    /// By rank.
    end: Vec<u32>,
    /// Allocations before event `64 * k`.
    before: Vec<u32>,
    /// Which of events `64 * k..64 * k + 64` are allocations.
    mask: Vec<u64>,
}

impl Ends {
    const NONE: u32 = u32::MAX;

    /// The free_requested of the allocation at event `i`.
    fn get(&self, i: usize) -> Option<usize> {
        let m = *self.mask.get(i / 64)?;
        if m >> (i % 64) & 1 == 0 {
            return None;
        }
        let rank = self.rank(i) as usize;
        self.end.get(rank).filter(|&&j| j != Self::NONE).map(|&j| j as usize)
    }

    /// How many allocations come before event `i`.
    fn rank(&self, i: usize) -> u32 {
        let (w, b) = (i / 64, i % 64);
        match (self.before.get(w), self.mask.get(w)) {
            (Some(&before), Some(&m)) => before + (m & ((1u64 << b) - 1)).count_ones(),
            // Past the last word: every allocation.
            _ => self.before.last().zip(self.mask.last()).map_or(0, |(&b, &m)| b + m.count_ones()),
        }
    }
}

/// Each allocation's phase; other events only inside the optimizer's calls
/// (a step that allocates nothing still ends an iteration).
fn phases(
    dev: &DeviceTrace,
    facts: &[StackFacts],
    evidence: Evidence,
    windows: &[(usize, usize)],
    sp: Spans,
) -> Vec<Option<Phase>> {
    let n = dev.events.len();
    match evidence {
        Evidence::Stacks => {
            let mut out = vec![None; n];
            let windows = Windows::of(windows);
            sp.map_mut(&mut out, |r, part| {
                let events = r.clone().zip(windows.mask(r.clone())).zip(dev.events.view().slice(r));
                for (((i, in_optimizer), e), p) in events.zip(part) {
                    *p = if in_optimizer {
                        Some(Phase::Optimizer)
                    } else if e.action == Action::Alloc {
                        let sid = dev.stacks.get(i).copied().unwrap_or(0);
                        facts.get(sid as usize).map(|f| f.phase)
                    } else {
                        None
                    };
                }
            });
            out
        }
        Evidence::Markers => phases_from_markers(dev.events.view(), windows),
        _ => vec![None; n],
    }
}

/// What each stack says, read once per stack (a trace with stacks="all"
/// has dozens of frames per allocation); by stack id, 0 for none. Those of
/// stacks no allocation has are left as an empty stack's.
fn stack_facts(dev: &DeviceTrace, stacks: &[Vec<Frame>], sp: Spans) -> Vec<StackFacts> {
    let events = dev.events.view();
    let n = events.len().min(dev.stacks.len());
    // One flag per stack for every span: the same few are set over and
    // over, so each is read before it is written and the lines stay shared.
    let used: Vec<AtomicBool> = (0..=stacks.len()).map(|_| AtomicBool::new(false)).collect();
    sp.map(n, |r| {
        for (e, &sid) in events.slice(r.clone()).iter().zip(&dev.stacks[r]) {
            if e.action == Action::Alloc {
                if let Some(u) = used.get(sid as usize).filter(|u| !u.load(Ordering::Relaxed)) {
                    u.store(true, Ordering::Relaxed);
                }
            }
        }
    });
    used.into_iter()
        .map(AtomicBool::into_inner)
        .enumerate()
        .map(|(sid, u)| match (sid as u32).checked_sub(1).and_then(|s| stacks.get(s as usize)).filter(|_| u) {
            Some(f) => StackFacts { in_model: in_model(f), builds_model: builds_model(f), phase: phase_of(f, true) },
            None => StackFacts::default(),
        })
        .collect()
}

/// A trace with its evidence read (stacks or markers): what categorizing
/// its events rests on.
struct Trace<'t> {
    dev: &'t DeviceTrace,
    evidence: Evidence,
    facts: Vec<StackFacts>,
    phases: Vec<Option<Phase>>,
    /// Each alloc's free_requested.
    end: Ends,
    runs: Runs,
}

/// What the rules of `Trace::category` look up, computed once.
struct Rules {
    /// Per run, its first activation's event.
    first_activation: HashMap<usize, usize>,
    /// Where setting up ends: the first backward or optimizer step, or in a
    /// trace without training, the model's first forward.
    setup_end: usize,
    /// With stacks, the model's first forward: the first allocation inside
    /// the model that is not building it. A tensor the script makes after
    /// it and keeps (a leak, a log) is not a parameter.
    first_forward: usize,
    /// The model's allocations of the program's thread, ascending: "does
    /// the model run between i and the next backward" is two binary
    /// searches (a table per event cost 4 bytes an event).
    model_allocs: Vec<u32>,
    /// The parameters' sizes.
    param_sizes: HashSet<u64>,
    first_oom: Option<usize>,
    trained: bool,
}

impl Trace<'_> {
    fn fact(&self, i: usize) -> StackFacts {
        let sid = self.dev.stacks.get(i).copied().unwrap_or(0) as usize;
        self.facts.get(sid).copied().unwrap_or_default()
    }

    /// The allocations of events `r`.
    fn allocs(&self, r: std::ops::Range<usize>) -> impl Iterator<Item = (usize, Event)> + '_ {
        r.clone().zip(self.dev.events.view().slice(r)).filter(|(_, e)| e.action == Action::Alloc)
    }

    fn rules(&self, sp: Spans) -> Rules {
        let (dev, n) = (self.dev, self.dev.events.len());
        let first = |found: Vec<Option<usize>>| found.into_iter().flatten().next();
        let first_forward = match self.evidence {
            Evidence::Stacks => first(sp.map(n, |r| {
                self.allocs(r).map(|(i, _)| i).find(|&i| {
                    self.phases[i] == Some(Phase::Main) && self.fact(i).in_model && !self.fact(i).builds_model
                })
            }))
            .unwrap_or(n),
            _ => n,
        };
        let setup_end = self.runs.runs.get(self.runs.first_training).map_or(first_forward, |r| r.0);
        // The model's allocations and each run's first activation, in one
        // pass over each span's allocations.
        let parts = sp.map(n, |r| {
            let (mut model, mut first) = (Vec::new(), HashMap::new());
            for (i, _) in self.allocs(r) {
                if self.phases[i] == Some(Phase::Main) && self.fact(i).in_model {
                    model.push(i as u32);
                }
                if let Some(run) = self.runs.activation_run(i, &self.end) {
                    first.entry(run).or_insert(i);
                }
            }
            (model, first)
        });
        let mut model_allocs = Vec::with_capacity(parts.iter().map(|p| p.0.len()).sum());
        let mut first_activation = HashMap::new();
        // The spans in order: the first found is the earliest.
        for (allocs, found) in parts {
            model_allocs.extend(allocs);
            for (r, i) in found {
                first_activation.entry(r).or_insert(i);
            }
        }
        let mut r = Rules {
            first_activation,
            setup_end,
            first_forward,
            model_allocs,
            param_sizes: HashSet::default(),
            first_oom: dev.events.ooms().next(),
            trained: self.runs.first_training < self.runs.runs.len(),
        };
        let r0 = &r;
        r.param_sizes = sp
            .map(n, |span| {
                self.allocs(span)
                    .filter(|&(i, _)| self.is_parameter(i, r0))
                    .map(|(_, e)| e.size)
                    .collect::<HashSet<u64>>()
            })
            .into_iter()
            .flatten()
            .collect();
        r
    }

    /// Without stacks, the batch (and the model, in the first iteration) is
    /// what an iteration allocates before its first activation.
    fn before_forward(&self, i: usize, r: &Rules) -> bool {
        r.first_activation.get(&self.runs.at(i)).is_none_or(|&a| i < a)
    }

    /// Parameters: made while setting up, outside the model's forward, kept
    /// past the last optimizer step (to the end without one).
    fn is_parameter(&self, i: usize, r: &Rules) -> bool {
        let kept = match (self.end.get(i), self.runs.last_optimizer_end) {
            (None, _) => true,
            (Some(j), Some(last)) => j > last,
            (Some(_), None) => false,
        };
        let outside_forward = match self.evidence {
            Evidence::Stacks => {
                let f = self.fact(i);
                f.builds_model || (i < r.setup_end.min(r.first_forward) && !f.in_model)
            }
            _ => i < r.setup_end && self.before_forward(i, r),
        };
        self.phases[i] == Some(Phase::Main) && kept && outside_forward
    }

    /// The batch of an iteration: fed to the model before any backward or
    /// step comes. A tensor made after the forward (a copy of its output
    /// the script keeps) is not, although no backward has run since.
    fn forward_follows(&self, i: usize, r: &Rules) -> bool {
        let run = self.runs.at(i);
        let to = [Phase::Backward, Phase::Optimizer]
            .into_iter()
            .filter_map(|p| self.runs.next_start(run, p))
            .min()
            .unwrap_or(self.dev.events.len());
        let from = r.model_allocs.partition_point(|&a| (a as usize) < i + 1);
        to > i && r.model_allocs.get(from).is_some_and(|&a| (a as usize) < to)
    }

    /// A gradient has its parameter's size (a cuBLAS workspace made in
    /// backward and kept does not).
    fn grad_sized(&self, i: usize, r: &Rules) -> bool {
        r.param_sizes.is_empty() || r.param_sizes.contains(&self.dev.events.at(i).size)
    }

    /// A forward no backward followed: the trace ends in it, or an OOM cut
    /// it short (in a run that trained, or ran out).
    fn unfinished(&self, i: usize, r: &Rules) -> bool {
        !self.runs.backward_after(self.runs.at(i)) && (r.trained || r.first_oom.is_some_and(|o| o > i))
    }

    /// The category of allocation `i` made in `phase`; none for one of an
    /// unfinished forward (`cut_short` decides it).
    fn category(&self, i: usize, phase: Phase, r: &Rules) -> Option<Category> {
        let run = self.runs.at(i);
        let ends_in = self.end.get(i).map(|j| self.runs.at(j));
        Some(match phase {
            Phase::Optimizer => match ends_in {
                Some(re) if re == run => Category::Temporary,
                _ => Category::OptimizerState,
            },
            Phase::Backward => match ends_in {
                Some(re) if re == run => Category::Temporary,
                _ if self.grad_sized(i, r) => Category::Gradient,
                _ => Category::Temporary,
            },
            Phase::Main if self.is_parameter(i, r) => Category::Parameter,
            Phase::Main if ends_in.is_some_and(|re| self.runs.phase(re) == Phase::Backward) => Category::Activation,
            Phase::Main if self.runs.backward_between(run, ends_in) => {
                let batch = match self.evidence {
                    // Made outside the model, and fed to a forward before
                    // the next backward (not a tensor the script keeps
                    // after backward: a log, a leak).
                    Evidence::Stacks => !self.fact(i).in_model && self.forward_follows(i, r),
                    _ => self.before_forward(i, r),
                };
                if batch {
                    Category::Input
                } else if self.evidence == Evidence::Markers
                    && !r.param_sizes.is_empty()
                    && self.grad_sized(i, r)
                    && self.runs.crosses_optimizer(run, ends_in)
                {
                    // Without stacks, backward's first gradients come
                    // before the most allocated point.
                    Category::Gradient
                } else {
                    Category::Temporary
                }
            }
            Phase::Main if self.unfinished(i, r) => return None,
            Phase::Main => Category::Temporary,
        })
    }

    /// Every allocation's category, and its free's: the allocations' span
    /// by span, then each free given its allocation's.
    fn categorize(&self, sp: Spans) -> Vec<Option<Category>> {
        let r = self.rules(sp);
        let mut of_event: Vec<Option<Category>> = vec![None; self.dev.events.len()];
        // A free takes its allocation's category: in the same pass where
        // it falls in the span, after it where it does not (a few).
        let parts = sp.map_mut(&mut of_event, |span, part| {
            let (mut cut_short, mut later) = (Vec::new(), Vec::new());
            for (i, _) in self.allocs(span.clone()) {
                let Some(phase) = self.phases[i] else { continue };
                let c = self.category(i, phase, &r).unwrap_or_else(|| {
                    cut_short.push(i);
                    Category::Temporary
                });
                part[i - span.start] = Some(c);
                match self.end.get(i) {
                    Some(j) if span.contains(&j) => part[j - span.start] = Some(c),
                    Some(j) => later.push((j, c)),
                    None => {}
                }
            }
            (cut_short, later)
        });
        let mut cut_short = Vec::new();
        for (c, later) in parts {
            cut_short.extend(c);
            for (j, c) in later {
                of_event[j] = Some(c);
            }
        }
        self.cut_short(&mut of_event, &cut_short, &r, sp);
        of_event
    }

    /// An iteration the trace ends in, or an OOM cuts short, never reaches
    /// its backward: what its forward made is what the same line made in
    /// the iterations before (an activation there is one here); with no
    /// iteration before, a block the model made and kept to the end or the
    /// OOM is what backward would keep.
    fn cut_short(&self, of_event: &mut [Option<Category>], cut_short: &[usize], r: &Rules, sp: Spans) {
        if cut_short.is_empty() {
            return;
        }
        let dev = self.dev;
        let sid = |i: usize| dev.stacks.get(i).copied().unwrap_or(0);
        // Only the lines the cut-short allocations were made at vote.
        let asked: HashSet<u32> = cut_short.iter().map(|&i| sid(i)).filter(|&s| s != 0).collect();
        let mut votes: HashMap<u32, [u32; 7]> = HashMap::new();
        let counted = sp.map(of_event.len(), |span| {
            let mut votes: HashMap<u32, [u32; 7]> = HashMap::new();
            for (i, _) in self.allocs(span) {
                if let (Some(Phase::Main), Some(c)) = (self.phases[i], of_event[i]) {
                    if asked.contains(&sid(i)) && !self.unfinished(i, r) {
                        votes.entry(sid(i)).or_default()[c as usize] += 1;
                    }
                }
            }
            votes
        });
        for (s, v) in counted.into_iter().flatten() {
            let all = votes.entry(s).or_default();
            for (a, b) in all.iter_mut().zip(v) {
                *a += b;
            }
        }
        for &i in cut_short {
            let c = match votes.get(&sid(i)) {
                Some(v) => Category::ALL[(0..7).max_by_key(|&k| (v[k], std::cmp::Reverse(k))).unwrap_or(5)],
                None if self.evidence == Evidence::Stacks
                    && self.fact(i).in_model
                    && self.end.get(i).is_none_or(|j| r.first_oom.is_some_and(|o| j > o)) =>
                {
                    Category::Activation
                }
                None => Category::Temporary,
            };
            of_event[i] = Some(c);
            if let Some(j) = self.end.get(i) {
                of_event[j] = Some(c);
            }
        }
    }
}

fn apply(b: &mut CategoryBytes, step: i64, c: Option<Category>) {
    let c = c.unwrap_or(Category::Unknown);
    if step > 0 {
        b.add(c, step as u64);
    } else if step < 0 {
        b.sub(c, step.unsigned_abs());
    }
}

/// The blocks alive at a trace's start: a window's rebuilt first state, or
/// a snapshot's blocks when it has no history.
pub(crate) fn start_blocks(dev: &DeviceTrace, seed: &[crate::alloc::SeedSegment]) -> Vec<StartBlock> {
    // A seed block still alive at the end is the snapshot's block: its stack.
    let recorded: HashMap<u64, (u64, u32)> = dev
        .segments
        .iter()
        .flat_map(|s: &RecordedSegment| &s.blocks)
        .filter(|b| b.state != crate::alloc::BlockState::Inactive)
        .map(|b| (b.address, (b.size, b.stack)))
        .collect();
    let mut out: Vec<StartBlock> = seed
        .iter()
        .flat_map(|s| s.blocks.iter())
        .filter(|b| !b.pending)
        .map(|b| StartBlock {
            address: b.address,
            size: b.size,
            stack: recorded.get(&b.address).filter(|r| r.0 == b.size).map_or(0, |r| r.1),
        })
        .collect();
    if out.is_empty() && dev.events.is_empty() {
        out = recorded.iter().map(|(&address, &(size, stack))| StartBlock { address, size, stack }).collect();
        out.sort_by_key(|b| b.address);
    }
    out
}

/// What a stack says of where its allocation was made.
#[derive(Debug, Clone, Copy)]
struct StackFacts {
    in_model: bool,
    builds_model: bool,
    /// `phase_of` in a trace whose allocations carry stacks.
    phase: Phase,
}

impl Default for StackFacts {
    /// An empty stack's (`phase_of`).
    fn default() -> Self {
        StackFacts { in_model: false, builds_model: false, phase: Phase::Backward }
    }
}

/// Where each allocation's stack says it was made. `empty_is_backward`: in
/// a trace whose allocations carry Python stacks, an allocation without
/// any was made off the program's thread: the autograd engine's.
fn phase_of(frames: &[Frame], empty_is_backward: bool) -> Phase {
    if frames.is_empty() {
        return if empty_is_backward { Phase::Backward } else { Phase::Main };
    }
    let backward = frames.iter().any(|f| {
        f.name.contains("autograd::Engine::")
            || (f.filename.ends_with("torch/autograd/__init__.py") && matches!(&*f.name, "backward" | "grad"))
            || (f.filename.ends_with("torch/_tensor.py") && &*f.name == "backward")
            || (f.filename.ends_with("torch/autograd/graph.py") && &*f.name == "_engine_run_backward")
    });
    if backward {
        return Phase::Backward;
    }
    if frames.iter().any(|f| f.filename.contains("torch/optim/")) {
        return Phase::Optimizer;
    }
    Phase::Main
}

/// Whether an allocation of the program's thread was made inside the model
/// (a module's forward, torch.nn.functional, a loss): not the batch.
fn in_model(frames: &[Frame]) -> bool {
    frames.iter().any(|f| f.filename.contains("torch/nn/") || &*f.name == "forward")
}

/// Whether a stack builds or loads the model (its parameters and buffers).
fn builds_model(frames: &[Frame]) -> bool {
    frames.iter().any(|f| {
        (f.filename.contains("torch/nn/") || f.filename.contains("transformers/"))
            && matches!(
                &*f.name,
                "_apply" | "convert" | "__init__" | "load_state_dict" | "_load_from_state_dict" | "reset_parameters"
            )
            || &*f.name == "from_pretrained"
    })
}

/// The event ranges `[start, end)` of the optimizer's calls, from its
/// `Optimizer.step` and `Optimizer.zero_grad` markers (a step GradScaler
/// skips leaves only zero_grad's). A range may hold no event: it still ends
/// an iteration.
fn optimizer_windows(time_us: &crate::trace::Times, annotations: &[Annotation], device: i32) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut open: Option<usize> = None;
    let mut marks: Vec<&Annotation> = annotations
        .iter()
        .filter(|a| a.device == device && a.field("name").is_some_and(|n| n.starts_with("Optimizer.")))
        .collect();
    marks.sort_by_key(|a| a.time_us);
    // In time order, so each search starts where the last one ended.
    let mut from = 0;
    for a in marks {
        let at = time_us.partition_point_from(from, |t| t < a.time_us);
        from = at;
        match a.field("stage") {
            Some("START") => open = Some(at),
            Some("END") => {
                if let Some(s) = open.take() {
                    out.push((s, time_us.partition_point_from(at, |t| t <= a.time_us).max(s)));
                }
            }
            _ => {}
        }
    }
    out
}

/// The optimizer's calls' event ranges, by start, and how far the
/// furthest reaches among each and those before it: whether an event is in
/// one, without a flag per event.
struct Windows {
    ranges: Vec<(usize, usize)>,
    reach: Vec<usize>,
}

impl Windows {
    fn of(w: &[(usize, usize)]) -> Windows {
        let mut ranges = w.to_vec();
        ranges.sort_unstable();
        let mut far = 0;
        let reach = ranges.iter().map(|w| {
            far = w.1.max(far);
            far
        });
        let reach = reach.collect();
        Windows { ranges, reach }
    }

    /// Per event of `r`, whether it falls in one of the ranges.
    fn mask(&self, r: std::ops::Range<usize>) -> impl Iterator<Item = bool> + '_ {
        // How many ranges start at or before the event.
        let mut k = self.ranges.partition_point(|w| w.0 <= r.start);
        r.map(move |i| {
            while self.ranges.get(k).is_some_and(|w| w.0 <= i) {
                k += 1;
            }
            k > 0 && self.reach[k - 1] > i
        })
    }
}

/// Without stacks: the optimizer's steps from its markers; between them,
/// each micro-batch's forward up to where it ends and backward after
/// (docs/user/categories.md §Evidence).
fn phases_from_markers(events: EventsRef<'_>, windows: &[(usize, usize)]) -> Vec<Option<Phase>> {
    let n = events.len();
    let mut out = vec![None; n];
    let mut gaps = Vec::new();
    let mut from = 0;
    for &(s, e) in windows {
        gaps.push((from, s));
        for p in out.iter_mut().take(e).skip(s) {
            *p = Some(Phase::Optimizer);
        }
        from = e;
    }
    gaps.push((from, n));
    let levels = Levels::of(events, &gaps);
    for (s, e) in gaps {
        for (a, b) in levels.micro_batches(s, e) {
            let end = levels.forward_end(a, b);
            for (i, p) in out.iter_mut().enumerate().take(b).skip(a) {
                *p = Some(if i <= end { Phase::Main } else { Phase::Backward });
            }
        }
    }
    for (i, e) in events.iter().enumerate() {
        if e.action != Action::Alloc && out[i] != Some(Phase::Optimizer) {
            out[i] = None;
        }
    }
    out
}

/// Per event, what is alive after it: the bytes allocated, and how many
/// blocks made between two optimizer steps are freed before the next (the
/// forward's activations and temporaries, backward's temporaries; not the
/// gradients, parameters or optimizer state, which outlive the step).
struct Levels {
    bytes: Vec<i128>,
    inner: Vec<i64>,
}

impl Levels {
    fn of(events: EventsRef<'_>, gaps: &[(usize, usize)]) -> Levels {
        let mut gap_of = vec![usize::MAX; events.len()];
        for (g, &(s, e)) in gaps.iter().enumerate() {
            for x in gap_of.iter_mut().take(e).skip(s) {
                *x = g;
            }
        }
        // Each block made and freed within one span: +1 where it is made,
        // -1 where it is freed; then summed in place into the count alive.
        let mut made: HashMap<u64, usize> = HashMap::new();
        let mut inner = vec![0i64; events.len()];
        for (i, e) in events.iter().enumerate() {
            match e.action {
                Action::Alloc => {
                    made.insert(e.addr, i);
                }
                Action::FreeRequested => {
                    if let Some(a) = made.remove(&e.addr) {
                        if gap_of[a] == gap_of[i] && gap_of[a] != usize::MAX {
                            inner[a] += 1;
                            inner[i] -= 1;
                        }
                    }
                }
                _ => {}
            }
        }
        let mut b = 0i128;
        let bytes = events
            .iter()
            .map(|e| {
                match e.action {
                    Action::Alloc => b += e.size as i128,
                    Action::FreeRequested => b -= e.size as i128,
                    _ => {}
                }
                b
            })
            .collect();
        for i in 1..inner.len() {
            inner[i] += inner[i - 1];
        }
        Levels { bytes, inner }
    }

    /// The micro-batches between two optimizer steps: under gradient
    /// accumulation each forward and backward frees what it made before the
    /// next forward starts, so the blocks made and freed within the span
    /// fall to (almost) none between them.
    fn micro_batches(&self, s: usize, e: usize) -> Vec<(usize, usize)> {
        let top = (s..e).map(|i| self.inner[i]).max().unwrap_or(0);
        if top <= 0 {
            return vec![(s, e)];
        }
        let (low, high) = (top / 10, top / 2);
        let mut cuts = Vec::new();
        // After a micro-batch has risen: the latest fewest blocks alive
        // since it fell low (its backward's last gradients come after its
        // last activation is freed).
        let (mut risen, mut bottom): (bool, Option<(i64, usize)>) = (false, None);
        for i in s..e {
            let c = self.inner[i];
            if c >= high {
                if let (true, Some((_, at))) = (risen, bottom) {
                    cuts.push(at + 1);
                }
                risen = true;
                bottom = None;
            } else if risen && (bottom.is_some() || c <= low) && bottom.is_none_or(|(m, _)| c <= m) {
                bottom = Some((c, i));
            }
        }
        let mut spans = Vec::with_capacity(cuts.len() + 1);
        let mut a = s;
        for c in cuts {
            spans.push((a, c));
            a = c;
        }
        spans.push((a, e));
        spans
    }

    /// Where a micro-batch's forward ends in `s..e`: at its most allocated
    /// point, unless backward's first gradients climb above the forward's
    /// own top (a large vocabulary's logits: the loss's gradient is as large
    /// as what the forward kept). So: where the most blocks made within the
    /// span are alive, up to its most allocated point (the earliest such
    /// point: the forward's last allocations, before it releases what the
    /// loss no longer needs).
    fn forward_end(&self, s: usize, e: usize) -> usize {
        let Some(top) = (s..e).max_by_key(|&i| (self.bytes[i], std::cmp::Reverse(i))) else { return s };
        (s..=top).max_by_key(|&i| (self.inner[i], std::cmp::Reverse(i))).unwrap_or(top)
    }
}

/// Consecutive allocations of one phase, and the frees between them.
struct Runs {
    /// (first event, phase) per run.
    runs: Vec<(usize, Phase)>,
    /// The run of every `RUN_INDEX`-th event, where `at` starts looking (a
    /// run per event cost 4 bytes an event).
    run_index: Vec<u32>,
    /// Per run k: how many backward (optimizer) runs come before it; one
    /// more entry for the end.
    backward_before: Vec<u32>,
    optimizer_before: Vec<u32>,
    /// The first run of backward or the optimizer.
    first_training: usize,
    /// The first event after the optimizer's last, if it ran.
    last_optimizer_end: Option<usize>,
}

/// Events between two entries of `Runs::run_index`.
const RUN_INDEX: usize = 256;

impl Runs {
    fn of(phases: &[Option<Phase>], sp: Spans) -> Runs {
        // Each span's runs as if it began the trace, joined in order: a
        // span's first run goes on the last one's where their phases agree.
        let parts = sp.map(phases.len(), |r| {
            let mut runs: Vec<(usize, Phase)> = Vec::new();
            for (i, p) in r.clone().zip(&phases[r]) {
                if let Some(p) = *p {
                    if runs.last().is_none_or(|r| r.1 != p) {
                        runs.push((i, p));
                    }
                }
            }
            runs
        });
        let mut runs: Vec<(usize, Phase)> = Vec::with_capacity(parts.iter().map(Vec::len).sum());
        for part in parts {
            let same = runs.last().zip(part.first()).is_some_and(|(a, b)| a.1 == b.1);
            runs.extend(part.into_iter().skip(usize::from(same)));
        }
        let mut run_index = Vec::with_capacity(phases.len() / RUN_INDEX + 1);
        let mut k = 0;
        for i in (0..phases.len()).step_by(RUN_INDEX) {
            while k + 1 < runs.len() && runs[k + 1].0 <= i {
                k += 1;
            }
            run_index.push(k as u32);
        }
        let first_training = runs.iter().position(|r| r.1 != Phase::Main).unwrap_or(runs.len());
        // Right after the last event of the optimizer's: a block freed
        // later (the model deleted at the end) lived through training.
        // Found from the runs, so a trace the optimizer never ran in is
        // not read from end to start.
        let last_optimizer_end = runs.iter().rposition(|r| r.1 == Phase::Optimizer).map(|k| {
            let to = runs.get(k + 1).map_or(phases.len(), |r| r.0);
            runs[k].0 + phases[runs[k].0..to].iter().rposition(|p| *p == Some(Phase::Optimizer)).unwrap_or(0) + 1
        });
        let before = |p: Phase| {
            let mut v = Vec::with_capacity(runs.len() + 1);
            let mut n = 0u32;
            for r in &runs {
                v.push(n);
                n += u32::from(r.1 == p);
            }
            v.push(n);
            v
        };
        let (backward_before, optimizer_before) = (before(Phase::Backward), before(Phase::Optimizer));
        Runs { runs, run_index, backward_before, optimizer_before, first_training, last_optimizer_end }
    }

    /// How many runs of `p` lie in runs `[from, to)`.
    fn count(&self, p: Phase, from: usize, to: usize) -> u32 {
        let v = if p == Phase::Backward { &self.backward_before } else { &self.optimizer_before };
        let to = to.min(self.runs.len());
        if from >= to {
            return 0;
        }
        v[to] - v[from]
    }

    /// The run event `i` falls in (a free belongs to the run of the
    /// allocations before it).
    fn at(&self, i: usize) -> usize {
        let Some(&k) = self.run_index.get(i / RUN_INDEX) else {
            return self.runs.partition_point(|r| r.0 <= i).saturating_sub(1);
        };
        let mut k = k as usize;
        while self.runs.get(k + 1).is_some_and(|r| r.0 <= i) {
            k += 1;
        }
        k
    }

    fn phase(&self, r: usize) -> Phase {
        self.runs.get(r).map_or(Phase::Main, |r| r.1)
    }

    /// Whether a backward run lies after run `from` and before run `to`
    /// (or anywhere after `from` when the block lives to the end).
    fn backward_between(&self, from: usize, to: Option<usize>) -> bool {
        self.count(Phase::Backward, from + 1, to.unwrap_or(self.runs.len())) > 0
    }

    /// The first event of the first run of `p` after run `r`.
    fn next_start(&self, r: usize, p: Phase) -> Option<usize> {
        self.runs.iter().skip(r + 1).find(|x| x.1 == p).map(|x| x.0)
    }

    /// Whether a backward run comes after run `r`.
    fn backward_after(&self, r: usize) -> bool {
        self.count(Phase::Backward, r + 1, self.runs.len()) > 0
    }

    /// Whether a block made in run `from` and freed in run `to` is alive
    /// into an optimizer run.
    fn crosses_optimizer(&self, from: usize, to: Option<usize>) -> bool {
        self.count(Phase::Optimizer, from + 1, to.map_or(self.runs.len(), |t| t + 1)) > 0
    }

    /// The main run of allocation `i` where it is freed in backward (an
    /// activation): the first such of each run is its first activation.
    fn activation_run(&self, i: usize, end: &Ends) -> Option<usize> {
        let r = self.at(i);
        let freed_in_backward = end.get(i).is_some_and(|j| self.phase(self.at(j)) == Phase::Backward);
        (self.phase(r) == Phase::Main && freed_in_backward).then_some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::Event;

    /// However the passes are cut into spans (the lifetimes' joined across
    /// them), every allocation gets the same category and the same free:
    /// on every trace of the categories' fixtures (stacks, markers,
    /// accumulation, OOMs, state only), cut into 1, 3 and 64 spans.
    #[test]
    fn spans_change_nothing() {
        let traces = crate::trace::fixture_traces("categories");
        assert!(traces.len() >= 10, "{}", traces.len());
        let mut cut_short = 0;
        for (path, t) in &traces {
            let Some(dev) = t.main_device() else { continue };
            let ends = |sp| {
                let e = lifetimes(dev, sp);
                (e.end, e.before, e.mask)
            };
            let one = Categories::prepare_in(dev, &t.stacks, &t.annotations, Spans::exactly(1));
            let one_ends = ends(Spans::exactly(1));
            // Which events are allocations, 64 to a word, and how many
            // come before each word, as the events say.
            let ev = dev.events.view();
            let alloc = |i: usize| ev.at(i).action == Action::Alloc;
            let words = ev.len().div_ceil(64);
            let mask: Vec<u64> = (0..words)
                .map(|w| (w * 64..ev.len().min(w * 64 + 64)).filter(|&i| alloc(i)).fold(0, |m, i| m | 1 << (i % 64)))
                .collect();
            let before: Vec<u32> = (0..words).map(|w| (0..w * 64).filter(|&i| alloc(i)).count() as u32).collect();
            assert_eq!((&one_ends.1, &one_ends.2), (&before, &mask), "{}", path.display());
            for k in [3, 64] {
                let many = Categories::prepare_in(dev, &t.stacks, &t.annotations, Spans::exactly(k));
                assert_eq!(many.of_event, one.of_event, "{} in {k} spans", path.display());
                assert_eq!(many.evidence, one.evidence, "{}", path.display());
                assert_eq!(ends(Spans::exactly(k)), one_ends, "{} in {k} spans", path.display());
            }
            assert!(one.of_event.iter().any(|c| c.is_some()) || one.evidence == Evidence::None, "{}", path.display());
            cut_short += usize::from(path.to_string_lossy().contains("oom"));
        }
        assert!(cut_short >= 2);
    }

    fn trace(events: &[(Action, u64)]) -> DeviceTrace {
        let mut d = crate::trace::DeviceColumns::default();
        for (i, &(a, addr)) in events.iter().enumerate() {
            d.push(Event::new(a, addr, 512, 0), i as i64, 0);
        }
        d.into_trace(0)
    }

    /// The allocations by address, then event, as a comparison sort puts
    /// them: addresses above 4 GiB split in halves, reused addresses in
    /// event order, frees left out.
    #[test]
    fn allocations_are_sorted_by_address_then_event() {
        use Action::*;
        let hi = 0x7f00_0000_0000u64;
        let events: Vec<(Action, u64)> = (0..600u64)
            .map(|i| {
                let addr = [hi + 0x400, 0x200, hi, hi + 0x1_0000_0200, 0x200 + (i % 7) * 0x200][(i % 5) as usize];
                (if i % 3 == 2 { FreeRequested } else { Alloc }, addr)
            })
            .collect();
        let d = trace(&events);
        let mut want: Vec<(u64, usize)> =
            (events.iter().enumerate()).filter(|(_, (a, _))| *a == Alloc).map(|(i, &(_, addr))| (addr, i)).collect();
        want.sort_unstable();
        assert_eq!(want.len(), 400);
        let got = allocs_at(&d, Spans::exactly(1));
        for k in [2, 3, 7, 64] {
            assert_eq!(allocs_at(&d, Spans::exactly(k)), got, "{k} spans");
        }
        let pairs: Vec<(u64, usize)> = (got.addrs.iter().enumerate())
            .flat_map(|(k, &a)| {
                got.events[got.from[k] as usize..got.from[k + 1] as usize].iter().map(move |&e| (a, e as usize))
            })
            .collect();
        assert_eq!(pairs, want);
        // The last allocation at an address at or before an event.
        for &(addr, i) in want.iter().step_by(7) {
            assert_eq!(got.last_at(addr, i), Some(i));
            assert_eq!(
                got.last_at(addr, i + 1),
                want.iter().filter(|w| w.0 == addr && w.1 <= i + 1).map(|w| w.1).max()
            );
        }
        assert_eq!(got.last_at(0x200, 0), None);
        assert_eq!(got.last_at(0x300, 599), None);
        assert_eq!(allocs_at(&trace(&[]), Spans::exactly(3)), AllocsAt { from: vec![0], ..Default::default() });
    }

    /// A block alive at the start ends at the first free of its address,
    /// unless an allocation there came first; blocks the trace made, and a
    /// free_completed after the free_requested, are no start block's end.
    #[test]
    fn a_start_block_ends_at_its_first_free_before_any_allocation_there() {
        use Action::*;
        let d = trace(&[
            (Alloc, 0x100),
            (FreeRequested, 0x200), // start block A ends here
            (FreeCompleted, 0x200),
            (FreeRequested, 0x100),
            (Alloc, 0x300), // start block B's address reused: B never freed in the trace
            (FreeRequested, 0x300),
            (FreeRequested, 0x400), // not a start block
        ]);
        let start = [0x200, 0x300, 0x500].map(|address| StartBlock { address, size: 512, stack: 0 });
        let ends = start_ends(&d, &start);
        assert_eq!(ends.into_iter().collect::<Vec<_>>(), [(0x200, 1)]);
        // The allocations' own ends.
        let end = lifetimes(&d, Spans::exactly(3));
        assert_eq!((0..7).map(|i| end.get(i)).collect::<Vec<_>>(), [Some(3), None, None, None, Some(5), None, None]);
        // Across words of the index: every third event an allocation, freed
        // two on, the last one never.
        let events: Vec<(Action, u64)> = (0..300u64)
            .map(|i| {
                (
                    if i % 3 == 0 {
                        Alloc
                    } else if i % 3 == 2 {
                        FreeRequested
                    } else {
                        Annotate
                    },
                    i / 3,
                )
            })
            .collect();
        let end = lifetimes(&trace(&events[..299]), Spans::exactly(3));
        let want = |i: usize| (i % 3 == 0 && i + 2 < 299).then_some(i + 2);
        assert_eq!((0..310).map(|i| end.get(i)).collect::<Vec<_>>(), (0..310).map(want).collect::<Vec<_>>());
    }

    /// The bytes per category every `SAMPLE` events are one pass's in any
    /// number of spans: where each span's first bytes are found ahead, and
    /// where a category would go below nothing (the steps saturate there)
    /// and the spans are counted in turn.
    #[test]
    fn samples_as_one_pass() {
        let one_pass = |mut b: CategoryBytes, steps: &Deltas, of: &[Option<Category>]| {
            let mut out = vec![b];
            for (i, (d, &c)) in steps.iter().zip(of).enumerate() {
                if i % SAMPLE == 0 && i > 0 {
                    out.push(b);
                }
                apply(&mut b, d, c);
            }
            out
        };
        let start = CategoryBytes([512, 0, 1 << 20, 0, 0, 0, 64]);
        // Blocks of a category made and freed later, some never; in the
        // second, frees of bytes a category never had.
        for (saturates, n) in [(false, 5000), (true, 5000), (false, 0), (false, 300)] {
            let mut of = Vec::with_capacity(n);
            let mut steps = Deltas::with_capacity(n);
            let mut held: Vec<(Option<Category>, i64)> = Vec::new();
            for i in 0..n {
                let c = [None, Some(Category::ALL[i % 7])][i % 4 / 3];
                let (c, step) = if i % 3 != 2 || held.is_empty() {
                    let size = 512 * (1 + (i as i64 * 7919) % 97);
                    held.push((c, size));
                    (c, size)
                } else if saturates && i % 11 == 0 {
                    (Some(Category::Input), -(1 << 40))
                } else {
                    let (c, size) = held.remove((i * 31) % held.len());
                    (c, -size)
                };
                of.push(c);
                steps.push(step);
            }
            let want = one_pass(start, &steps, &of);
            assert_eq!(want.len(), 1 + n.saturating_sub(1) / SAMPLE);
            for k in [1, 2, 3, 7, 64] {
                let (got, exact) = Categories::sampled(start, &steps, &of, Spans::exactly(k));
                assert_eq!(got, want, "{n} events, saturating {saturates}, {k} spans");
                assert_eq!(exact, !saturates || n < 11, "{n} events, saturating {saturates}, {k} spans");
            }
            // The bytes after each event, forward from a sample or back
            // from the next (where nothing saturates), alone and together:
            // one pass's.
            let (samples, exact) = Categories::sampled(start, &steps, &of, Spans::exactly(3));
            let cats = Categories {
                evidence: Evidence::Stacks,
                of_event: of.clone(),
                steps: Arc::new(steps.iter().collect()),
                at_start: HashMap::new(),
                allocs_at: AllocsAt::default(),
                samples,
                exact,
            };
            let mut b = start;
            let after: Vec<CategoryBytes> = steps
                .iter()
                .zip(&of)
                .map(|(d, &c)| {
                    apply(&mut b, d, c);
                    b
                })
                .collect();
            for (i, want) in after.iter().enumerate() {
                assert_eq!(cats.bytes_after(Some(i)), *want, "{n} events, saturating {saturates}: after {i}");
            }
            let mut points: Vec<usize> = (0..n).step_by(37).chain((0..n).step_by(200)).collect();
            points.sort();
            let each = cats.bytes_after_each(&points);
            for (&i, got) in points.iter().zip(&each) {
                assert_eq!(*got, after[i], "{n} events, saturating {saturates}: after {i}, with the others");
            }
        }
    }

    /// Each allocation ends at the first free at its address, however the
    /// events are cut into spans: a block freed spans later, an address
    /// allocated again while held (the first never ends), frees of nothing,
    /// a free_completed after the free_requested, one never freed.
    #[test]
    fn lifetimes_join_across_spans() {
        use Action::*;
        let d = trace(&[
            (Alloc, 0x100),
            (Alloc, 0x200),
            (FreeRequested, 0x300),
            (Alloc, 0x200),
            (FreeRequested, 0x100),
            (FreeCompleted, 0x100),
            (Alloc, 0x100),
            (FreeRequested, 0x200),
            (FreeRequested, 0x200),
            (Alloc, 0x400),
            (FreeCompleted, 0x100),
            (Alloc, 0x200),
            (FreeRequested, 0x200),
        ]);
        let mut want = vec![None; 14];
        for (i, j) in [(0, 4), (3, 7), (6, 10), (11, 12)] {
            want[i] = Some(j);
        }
        for k in 1..=14 {
            let end = lifetimes(&d, Spans::exactly(k));
            assert_eq!((0..14).map(|i| end.get(i)).collect::<Vec<_>>(), want, "{k} spans");
            assert_eq!((0..15).map(|i| end.rank(i)).collect::<Vec<_>>(), [0, 1, 2, 2, 3, 3, 3, 4, 4, 4, 5, 5, 6, 6, 6]);
        }
    }

    /// Without stacks or markers, the start blocks' own stacks decide the
    /// evidence, after the replay (`finish`), as `of` decides it.
    #[test]
    fn block_stacks_are_the_evidence_only_when_a_start_block_has_one() {
        let d = trace(&[(Action::FreeRequested, 0x200)]);
        let stacks = vec![vec![Frame { filename: "train.py".into(), line: 3, name: "main".into() }]];
        let with = [StartBlock { address: 0x200, size: 512, stack: 1 }];
        let without = [StartBlock { address: 0x200, size: 512, stack: 0 }];
        let p = || Categories::prepare(&d, &stacks, &[]);
        assert_eq!(Categories::finish(p(), &d, &stacks, &with, None).evidence, Evidence::BlockStacks);
        assert_eq!(Categories::finish(p(), &d, &stacks, &without, None).evidence, Evidence::None);
        assert_eq!(Categories::of(&d, &stacks, &[], &with, None).evidence, Evidence::BlockStacks);
    }
}
