//! Runs a synthetic loop through the caching allocator on any `Device`
//! (simulated or CUDA), one request at a time, with PyTorch-style OOM
//! handling and the timeline every view draws from.

use crate::analysis::categories::{Category, CategoryBytes};
use std::collections::{HashMap, VecDeque};

use crate::alloc::stats::Kind;
use crate::alloc::{BlockId, CachingAllocator, OutOfMemory, StatePoint};
use crate::device::Device;

use super::{Op, Synthetic};

/// What a run does when an allocation fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnOom {
    /// Mark it, keep PyTorch's message, stop.
    Stop,
    /// The `safe_forward` pattern: free the step, `empty_cache()`, retry the
    /// step with the batch ×0.9, up to three times.
    Shrink,
    /// Free the failed step and go on with the next one.
    Continue,
}

/// Retries `shrink` makes before giving up.
pub(crate) const SHRINK_RETRIES: u32 = 3;

/// One OOM the run met.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OomRecord {
    /// Index of the timeline point (one per request).
    pub(crate) at: usize,
    pub iteration: u64,
    pub batch: u64,
    pub message: String,
    /// What the run did about it.
    pub action: OomAction,
}

/// What a synthetic run did about an OOM (JSON: "stop", "retry", "skip").
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OomAction {
    Stop,
    Retry,
    Skip,
}

impl OomAction {
    /// As JSON and the screens name it.
    pub fn name(self) -> &'static str {
        match self {
            OomAction::Stop => "stop",
            OomAction::Retry => "retry",
            OomAction::Skip => "skip",
        }
    }
}

impl std::fmt::Display for OomAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What one call to `Driver::advance` ended with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    Running,
    /// Every iteration ran.
    Finished,
    /// Stopped by an OOM (`--on-oom stop`, or `shrink` out of retries).
    Stopped,
}

/// Sees the allocator at each new reserved peak.
type PeakHook<D> = Box<dyn FnMut(&CachingAllocator<D>) + Send>;

pub struct Driver<D: Device> {
    pub alloc: CachingAllocator<D>,
    pub(crate) workload: Synthetic,
    on_oom: OnOom,
    /// Each live request: its block, what it is and the bytes it holds.
    live: HashMap<u64, (BlockId, Category, u64)>,
    /// Each live block's category by its address: what the map shows by
    /// category (`w`) while the run runs.
    pub(crate) block_categories: HashMap<u64, Category>,
    /// Allocated bytes per category now, at the allocated peak, and at the
    /// end of the latest iteration (docs/user/categories.md).
    pub(crate) categories: CategoryBytes,
    pub(crate) peak_categories: CategoryBytes,
    pub(crate) step_categories: Option<(u64, CategoryBytes)>,
    queue: VecDeque<Op>,
    scale: f64,
    retries: u32,
    pub points: Vec<StatePoint>,
    /// Timeline indices of OOMs, `empty_cache` calls and iteration ends.
    pub ooms: Vec<usize>,
    pub empty_caches: Vec<usize>,
    pub iterations: Vec<usize>,
    /// The allocator's event count at the latest iteration ends (at most
    /// 4096): where a paused run's events mark them.
    pub(crate) iteration_events: VecDeque<u64>,
    /// Allocated bytes at the end of the most recent iterations (at most
    /// 64), as the publisher reports them after each optimizer step.
    pub(crate) step_ends: VecDeque<u64>,
    /// The most recent iterations (at most 512): their number and their own
    /// peak allocated and reserved bytes, as `run --step-peaks` publishes them.
    pub(crate) step_log: VecDeque<StepPeak>,
    /// Highest (allocated, reserved) since the last iteration ended.
    step_max: (u64, u64),
    pub oom_log: Vec<OomRecord>,
    /// Points dropped from the front of the timeline (bounded runs).
    pub(crate) dropped: usize,
    max_points: Option<usize>,
    /// Called after each request that raised reserved memory to a new peak.
    on_reserved_peak: Option<PeakHook<D>>,
    reserved_peak_seen: u64,
    /// (allocator event index, allocated bytes) at the first highest allocated.
    pub(crate) peak_event: Option<(u64, u64)>,
    /// Batch and sequence of the step now running.
    pub(crate) batch: u64,
    pub(crate) seq: u64,
    state: Progress,
}

/// One finished iteration's figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StepPeak {
    pub(crate) n: u64,
    pub(crate) allocated_end: u64,
    pub(crate) reserved_end: u64,
    pub(crate) peak_allocated: u64,
    pub(crate) peak_reserved: u64,
}

impl<D: Device> Driver<D> {
    pub fn new(alloc: CachingAllocator<D>, workload: Synthetic, on_oom: OnOom) -> Self {
        Driver {
            alloc,
            workload,
            on_oom,
            live: HashMap::new(),
            block_categories: HashMap::new(),
            categories: CategoryBytes::default(),
            peak_categories: CategoryBytes::default(),
            step_categories: None,
            queue: VecDeque::new(),
            scale: 1.0,
            retries: 0,
            points: Vec::new(),
            ooms: Vec::new(),
            empty_caches: Vec::new(),
            iterations: Vec::new(),
            iteration_events: VecDeque::new(),
            step_ends: VecDeque::new(),
            step_log: VecDeque::new(),
            step_max: (0, 0),
            oom_log: Vec::new(),
            dropped: 0,
            max_points: None,
            on_reserved_peak: None,
            reserved_peak_seen: 0,
            peak_event: None,
            batch: 0,
            seq: 0,
            state: Progress::Running,
        }
    }

    /// Keeps at most `n` timeline points, dropping the oldest half when full.
    pub(crate) fn bounded(mut self, n: usize) -> Self {
        self.max_points = Some(n.max(2));
        self
    }

    /// `f` sees the allocator each time reserved memory reaches a new peak
    /// (the CUDA backend samples NVML there).
    pub(crate) fn on_reserved_peak(mut self, f: impl FnMut(&CachingAllocator<D>) + Send + 'static) -> Self {
        self.on_reserved_peak = Some(Box::new(f));
        self
    }

    pub fn progress(&self) -> &Progress {
        &self.state
    }

    fn point(&mut self) {
        let s = self.alloc.stats();
        let reserved = s.get(Kind::ReservedBytes, 0).current as u64;
        let allocated = s.get(Kind::AllocatedBytes, 0).current as u64;
        if allocated > self.peak_event.map_or(0, |p| p.1) {
            // The allocator's event count: the peak's index in the event stream.
            self.peak_event = Some((self.alloc.emitted().saturating_sub(1), allocated));
            self.peak_categories = self.categories;
        }
        self.points.push(StatePoint { allocated, reserved });
        self.step_max = (self.step_max.0.max(allocated), self.step_max.1.max(reserved));
        if reserved > self.reserved_peak_seen {
            self.reserved_peak_seen = reserved;
            if let Some(f) = self.on_reserved_peak.as_mut() {
                f(&self.alloc);
            }
        }
        if let Some(max) = self.max_points {
            if self.points.len() > max {
                let drop = self.points.len() - max / 2;
                self.points.drain(..drop);
                self.dropped += drop;
                for marks in [&mut self.ooms, &mut self.empty_caches, &mut self.iterations] {
                    marks.retain(|&m| m >= drop);
                    for m in marks.iter_mut() {
                        *m -= drop;
                    }
                }
            }
        }
    }

    /// Runs up to `n` requests; stops early at the end of the run or an OOM stop.
    pub fn advance(&mut self, n: usize) -> &Progress {
        for _ in 0..n {
            if self.state != Progress::Running {
                break;
            }
            self.one();
        }
        &self.state
    }

    /// Runs to the end (or the stopping OOM).
    pub fn run(&mut self) -> &Progress {
        while self.state == Progress::Running {
            self.one();
        }
        &self.state
    }

    fn one(&mut self) {
        if self.queue.is_empty() {
            match self.workload.plan(self.scale) {
                Some(p) => {
                    self.batch = p.batch;
                    self.seq = p.seq;
                    self.queue.extend(p.ops.iter().copied());
                }
                None => {
                    self.state = Progress::Finished;
                    return;
                }
            }
        }
        let Some(op) = self.queue.pop_front() else { return };
        match op {
            Op::Alloc { key, size, site, cat } => match self.alloc.malloc_tagged(size, 0, site) {
                Ok(b) => {
                    // The block's bytes, as allocated_bytes counts them.
                    let (held, at) = self.alloc.block(b).map_or((0, 0), |v| (v.size, v.ptr));
                    self.categories.add(cat, held);
                    self.block_categories.insert(at, cat);
                    self.live.insert(key, (b, cat, held));
                }
                Err(oom) => {
                    self.point();
                    self.oom(oom);
                    return;
                }
            },
            Op::Free { key } => self.free_key(key),
            Op::Iteration(n) => {
                // After the optimizer step, before zero_grad: what the
                // publisher of a real run counts at a step's end.
                self.step_categories = Some((n, self.categories));
                self.iterations.push(self.points.len());
                if self.iteration_events.len() == 4096 {
                    self.iteration_events.pop_front();
                }
                self.iteration_events.push_back(self.alloc.emitted());
                if self.step_ends.len() == 64 {
                    self.step_ends.pop_front();
                }
                let s = self.alloc.stats();
                let (a, r) =
                    (s.get(Kind::AllocatedBytes, 0).current as u64, s.get(Kind::ReservedBytes, 0).current as u64);
                self.step_ends.push_back(a);
                if self.step_log.len() == 512 {
                    self.step_log.pop_front();
                }
                let n = self.step_log.back().map_or(1, |p| p.n + 1);
                let (pa, pr) = (self.step_max.0.max(a), self.step_max.1.max(r));
                self.step_log.push_back(StepPeak {
                    n,
                    allocated_end: a,
                    reserved_end: r,
                    peak_allocated: pa,
                    peak_reserved: pr,
                });
                self.step_max = (a, r);
                // A step that completes resets the shrink ladder.
                self.retries = 0;
                self.scale = 1.0;
            }
        }
        self.point();
    }

    /// Frees what the failed step holds (its tensors die with the
    /// exception), including gradients, as `zero_grad()` would.
    fn unwind(&mut self) {
        let step_keys: Vec<u64> = self.live.keys().copied().filter(|&k| !self.workload.keeps(k)).collect();
        let mut keys = step_keys;
        // Newest first, as Python drops the frames' locals.
        keys.sort_by_key(|&k| std::cmp::Reverse(k));
        for k in keys {
            self.free_key(k);
        }
        self.queue.clear();
        self.workload.abandon();
    }

    fn oom(&mut self, oom: OutOfMemory) {
        let at = self.points.len() - 1;
        self.ooms.push(at);
        let iteration = self.workload.iteration();
        let action = match self.on_oom {
            OnOom::Stop => OomAction::Stop,
            OnOom::Shrink if self.retries < SHRINK_RETRIES => OomAction::Retry,
            OnOom::Shrink => OomAction::Stop,
            OnOom::Continue => OomAction::Skip,
        };
        self.oom_log.push(OomRecord { at, iteration, batch: self.batch, message: oom.to_string(), action });
        self.unwind();
        match action {
            OomAction::Retry => {
                self.retries += 1;
                self.scale *= 0.9;
                self.alloc.empty_cache();
                self.empty_caches.push(self.points.len());
                self.point();
            }
            OomAction::Skip => {
                // The step is lost; the next one starts at full size.
                self.workload.skip();
                self.point();
            }
            OomAction::Stop => {
                self.point();
                self.state = Progress::Stopped;
            }
        }
    }

    /// Frees every live block and empties the cache, returning all device
    /// memory (on exit, Ctrl-C and after an OOM).
    pub(crate) fn release_all(&mut self) {
        let mut keys: Vec<u64> = self.live.keys().copied().collect();
        keys.sort_by_key(|&k| std::cmp::Reverse(k));
        for k in keys {
            self.free_key(k);
        }
        self.alloc.empty_cache();
    }

    /// Frees the request `key`, if live.
    fn free_key(&mut self, key: u64) {
        if let Some((b, cat, held)) = self.live.remove(&key) {
            self.categories.sub(cat, held);
            if let Ok(v) = self.alloc.block(b) {
                self.block_categories.remove(&v.ptr);
            }
            // Handles come from our own map: a refusal is a bug in the plan.
            let r = self.alloc.free(b);
            debug_assert!(r.is_ok(), "{r:?}");
        }
    }

    /// Index of the allocated-bytes peak in `points` (first of equals).
    pub(crate) fn peak_at(&self) -> Option<usize> {
        crate::analysis::peak_index(&self.points)
    }
}

/// The demo's training loop (the `demo` screen and `--source demo`): GPT-2
/// small, batch up to 8 × up to 1024 tokens varying every step (`--varlen`),
/// AdamW, on the simulated H200, forever.
pub(crate) fn demo(seed: u64) -> Driver<crate::device::Sim> {
    let mut spec = crate::workload::SynthSpec::new(crate::workload::ModelKind::Gpt2);
    spec.varlen = true;
    spec.seed = seed;
    spec.iterations = None;
    let alloc = CachingAllocator::new(crate::alloc::AllocatorConfig::default(), crate::device::Sim::h200());
    Driver::new(alloc, Synthetic::new(spec), OnOom::Continue)
}
