//! The replay loop. Requests (`alloc`, `oom`) run our `malloc`; the segment
//! events they cause are produced inside it, with cudaMalloc answered by the
//! `Oracle` from the recording. A `segment_free`/`segment_unmap` that no
//! malloc explains was an `empty_cache()`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::pools::{BurstKind, PoolLabel, PoolPlan};
use crate::alloc::{
    Action, AllocatorConfig, BlockId, CachingAllocator, Device, Event, EventsRef, Kind, PackedPools, PoolSlot, Release,
    SeedSegment,
};
use crate::device::Oracle;
use crate::trace::deltas::Deltas;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Divergence {
    /// Index of the first recorded event we did not reproduce.
    pub event: usize,
    pub(crate) expected: Option<Event>,
    pub(crate) got: Option<Event>,
    pub(crate) reason: String,
}

/// Which side of a divergence answered memory pressure: what the search
/// for a run's memory limit reads (docs/user/replay.md, "Conditions").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Pressure {
    /// Neither, or both: not a question of the limit.
    #[default]
    Neither,
    /// We released, retried or ran out where the run did not: the limit
    /// replayed under is lower than the run's.
    Ours,
    /// The run released or ran out where we would not (or only as an
    /// `empty_cache()` that then did not match): the run's limit is lower.
    Recorded,
}

impl Pressure {
    /// Of a divergence met at a step that began at a recorded release no
    /// malloc of ours explained when `inferred`.
    fn of(d: &Divergence, inferred: bool) -> Pressure {
        let relief = |a: Action| matches!(a, Action::SegmentFree | Action::SegmentUnmap | Action::Oom);
        if inferred {
            return Pressure::Recorded;
        }
        match (d.expected, d.got) {
            (Some(w), Some(g)) if relief(g.action) && !relief(w.action) => Pressure::Ours,
            (Some(w), Some(g)) if relief(w.action) && !relief(g.action) => Pressure::Recorded,
            (Some(w), None) if relief(w.action) => Pressure::Recorded,
            _ => Pressure::Neither,
        }
    }
}

/// One sentence a user reads: the event, what PyTorch did, what we would
/// have done instead, in words and sizes (docs/user/replay.md).
impl std::fmt::Display for Divergence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.expected, &self.got) {
            (Some(want), Some(got)) => {
                if got.action == Action::Oom && want.action == Action::SegmentAlloc && got.addr >= want.size {
                    // The device had room: the oracle refused a cudaMalloc
                    // of another size than the run's, which the settings
                    // decide.
                    return write!(
                        f,
                        "event {}: PyTorch {} where we would have asked cudaMalloc for another size (for a request of {}, with {} free): the allocator settings differ from the run's",
                        self.event,
                        did(want, false),
                        crate::analysis::human_bytes(got.size),
                        crate::analysis::human_bytes(got.addr)
                    );
                }
                write!(f, "event {}: PyTorch {} where we would have {}", self.event, did(want, false), did(got, true))
            }
            (Some(want), None) => {
                write!(
                    f,
                    "event {}: PyTorch {}, which we cannot explain: {}",
                    self.event,
                    did(want, false),
                    self.reason
                )
            }
            (None, Some(got)) => {
                write!(f, "event {}: we would have {} after the recording's last event", self.event, did(got, true))
            }
            (None, None) => write!(f, "event {}: {}", self.event, self.reason),
        }
    }
}

/// What an event did, as a clause ("released the 22.00 MiB segment at
/// 0x7fa0…"); `after_have`: the form that follows "would have".
fn did(e: &Event, after_have: bool) -> String {
    let size = crate::analysis::human_bytes(e.size);
    let (took, ran) = if after_have { ("taken", "run") } else { ("took", "ran") };
    match e.action {
        Action::Alloc => format!("allocated {size} at {:#x}", e.addr),
        Action::FreeRequested => format!("freed the {size} block at {:#x} (waiting on its streams)", e.addr),
        Action::FreeCompleted => format!("freed the {size} block at {:#x}", e.addr),
        Action::SegmentAlloc => format!("{took} a new {size} segment at {:#x} (cudaMalloc)", e.addr),
        Action::SegmentFree => format!("released the {size} segment at {:#x} (cudaFree)", e.addr),
        Action::SegmentMap => format!("mapped {size} of an expandable segment at {:#x}", e.addr),
        Action::SegmentUnmap => format!("unmapped {size} of an expandable segment at {:#x}", e.addr),
        Action::Oom => format!(
            "{ran} out of memory on a request of {size} with {} free on the device",
            crate::analysis::human_bytes(e.addr)
        ),
        Action::Snapshot => "took a snapshot".into(),
        Action::Annotate => format!("annotated the {size} block at {:#x}", e.addr),
    }
}

#[derive(Debug, Clone)]
pub struct ReplayOptions {
    pub(crate) config: AllocatorConfig,
    /// `totalGlobalMem` of the recorded device.
    pub(crate) device_total: u64,
    /// `allowed_memory_maximum` in bytes (from a memory fraction), if any.
    pub memory_limit: Option<u64>,
    /// Keep every replayed event and the state after it (for `--dump-events`
    /// and timelines); otherwise memory stays flat however long the trace.
    pub(crate) keep_events: bool,
    /// Stop once this many recorded events have been reproduced.
    pub(crate) stop_at: Option<usize>,
    /// The recording's pools (`pools::plan`); empty: every request in the
    /// default pools.
    pub pools: Arc<PoolPlan>,
    /// The settings changed during the run: from this recorded event on,
    /// these (`config` before it).
    pub(crate) switch: Option<(usize, AllocatorConfig)>,
    /// Whose rules to replay under (docs/design/pytorch-allocator.md, "Releases").
    pub(crate) release: Release,
    /// Events of exact-address allocations (2.13+), ascending.
    pub(crate) exact: Arc<[usize]>,
}

impl ReplayOptions {
    pub fn new(config: AllocatorConfig, device_total: u64) -> Self {
        ReplayOptions {
            config,
            device_total,
            memory_limit: None,
            keep_events: false,
            stop_at: None,
            pools: Arc::new(PoolPlan::default()),
            switch: None,
            release: Release::V2_11,
            exact: Arc::from([]),
        }
    }
}

/// The highest `allocated_bytes.all.current` and where it was first reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Peak {
    pub(crate) event: usize,
    pub(crate) allocated: u64,
    /// Reserved bytes at that event.
    pub(crate) reserved: u64,
}

pub struct ReplayResult<'a> {
    pub allocator: CachingAllocator<Oracle<'a>>,
    /// `None` when every event was reproduced.
    pub divergence: Option<Divergence>,
    /// `empty_cache()` calls inferred from unexplained segment releases.
    pub(crate) inferred_empty_cache: usize,
    /// Events reproduced (all of them unless diverged).
    pub reproduced: usize,
    /// Recorded event indices at which an `empty_cache()` was inferred.
    pub(crate) empty_cache_at: Vec<usize>,
    pub(crate) peak: Peak,
    /// Release bursts replayed from the recording's list of segments.
    pub(crate) directed: usize,
    /// Allocations placed as a graph tree's checkpoint restore put them.
    pub(crate) placed: usize,
    /// OOM retries inferred from a release burst before a segment that
    /// could not have fitted without it: an `empty_cache()` called just then
    /// emits the same events and counts none (docs/user/replay.md).
    pub(crate) burst_retries: usize,
    /// A window's replay: ties between pre-window segments whose order (their
    /// age, 2.12+) the window's allocations showed.
    pub(crate) ties_resolved: usize,
    /// Of the divergence, if any: whether a lower or higher memory limit
    /// could explain it.
    pub(crate) pressure: Pressure,
    /// With `keep_events`: every event our allocator emitted, and the state after it.
    pub(crate) events: Vec<Event>,
    /// How allocated bytes changed at each recorded event reproduced: an
    /// allocation's block size is its step (the trace carries requested
    /// sizes). Four bytes an event (`Deltas`).
    pub(crate) allocated: Arc<Deltas>,
    /// Allocated bytes before the first event (the seed's blocks).
    pub(crate) allocated_before: u64,
}

/// The first request (`alloc`/`oom`) at or after `i`, if no free or snapshot
/// comes before it: segment events right before a request may be that
/// request's own.
fn next_request(rec: EventsRef<'_>, i: usize) -> Option<usize> {
    scan_end(rec, i).filter(|&k| matches!(rec.at(k).action, Action::Alloc | Action::Oom))
}

/// Where `next_request`'s scan from `i` stops: the first request, free or
/// snapshot at or after `i` (what a step reads ahead to).
fn scan_end(rec: EventsRef<'_>, i: usize) -> Option<usize> {
    let ends = |a: Action| {
        matches!(a, Action::Alloc | Action::Oom | Action::FreeRequested | Action::FreeCompleted | Action::Snapshot)
    };
    rec.slice(i.min(rec.len())..).actions().position(ends).map(|j| i + j)
}

/// Replays a recorded trace one step at a time: a step reproduces one
/// recorded event, or all the events one `malloc` produces. It is `Clone`, so
/// a copy is a checkpoint to come back to.
#[derive(Clone)]
pub struct Stepper<'a> {
    rec: EventsRef<'a>,
    /// Per recorded event, its call-stack id (`DeviceTrace::stacks`): live
    /// blocks carry it as their tag. Empty when not asked (`tagged`).
    stacks: &'a [u32],
    alloc: CachingAllocator<Oracle<'a>>,
    /// Live blocks by recorded address.
    live: foldhash::HashMap<u64, BlockId>,
    /// A block whose `free_requested` was the last step and whose
    /// `free_completed` is the next, by address: taken out of `live`
    /// already, as most frees are, so that a free costs one lookup there.
    completing: Option<(u64, BlockId)>,
    empty_cache_at: Vec<usize>,
    pools: Arc<PoolPlan>,
    /// The allocator's pool for each pool of the plan met so far.
    slots: HashMap<PoolLabel, PoolSlot>,
    /// Live segments (and expandable maps) by address: (size, pool).
    segs: BTreeMap<u64, (u64, PoolSlot)>,
    /// Release bursts replayed from the recording's list of segments
    /// because our release order did not match it.
    directed: usize,
    /// Allocations placed where a graph tree's checkpoint put them.
    placed: usize,
    burst_retries: usize,
    /// Device memory held outside the allocator (context, other
    /// processes), as the recording's OOM entries show it; None before one.
    outside: Option<u64>,
    /// At most what is held outside: the device had room for every segment
    /// it gave.
    outside_cap: u64,
    exact: Arc<[usize]>,
    /// The step under way began at a recorded release that no malloc of
    /// ours explained (replayed as an `empty_cache()`).
    inferred_now: bool,
    /// The settings the run changed to and the event from which they
    /// hold (`ReplayOptions::switch`), until then: every replay of the run
    /// (the exact one, the screens' scrubbers) follows the change.
    switch: Option<(usize, AllocatorConfig)>,
}

/// A replay's state kept to come back to (`Stepper::checkpoint`): the
/// state but its free lists, which it holds packed (an allocation per
/// stream instead of one per bin and a header for each bin of the span:
/// docs/design/allocator.md, "Checkpoints").
#[derive(Clone)]
pub(crate) struct Checkpoint {
    /// Bound to no column, its allocator without free lists.
    st: Stepper<'static>,
    pools: PackedPools,
    /// `Stepper::kept_bytes` of the state it was made of.
    bytes: usize,
}

impl Checkpoint {
    /// The replay again from here, reading `rec` and its tags from `stacks`.
    pub(crate) fn resume<'b>(&self, rec: EventsRef<'b>, stacks: &'b [u32]) -> Stepper<'b> {
        let mut st = self.st.clone().rebind(rec, stacks);
        st.alloc.unpack_pools(&self.pools);
        st
    }

    /// Recorded events reproduced when it was kept.
    pub(crate) fn position(&self) -> usize {
        self.st.position()
    }

    /// About what it holds on the heap (`Stepper::kept_bytes`).
    pub(crate) fn approx_heap_bytes(&self) -> usize {
        self.bytes
    }
}

impl<'a> Stepper<'a> {
    /// A replay of `rec` starting from `seed` (empty for a trace recorded
    /// from process start).
    pub fn new(rec: EventsRef<'a>, opts: &ReplayOptions, seed: &[SeedSegment]) -> Result<Self, Divergence> {
        let mut alloc =
            CachingAllocator::for_release(opts.config.clone(), Oracle::new(rec, opts.device_total), opts.release);
        if opts.memory_limit.is_some() {
            alloc.set_memory_limit(opts.memory_limit);
        }
        let mut live = foldhash::HashMap::default();
        let mut segs = BTreeMap::new();
        let mut slots = HashMap::new();
        for s in seed {
            let blocks = alloc.seed_segment(s).map_err(|reason| Divergence {
                event: 0,
                expected: rec.first(),
                got: None,
                reason,
            })?;
            let slot = alloc.pool_slot(s.pool).unwrap_or(PoolSlot::DEFAULT);
            slots.insert(PoolLabel::Known(s.pool), slot);
            segs.insert(s.address, (s.size, slot));
            live.extend(blocks);
        }
        slots.insert(PoolLabel::DEFAULT, PoolSlot::DEFAULT);
        Ok(Stepper {
            rec,
            stacks: &[],
            alloc,
            live,
            completing: None,
            empty_cache_at: Vec::new(),
            pools: opts.pools.clone(),
            slots,
            segs,
            directed: 0,
            placed: 0,
            burst_retries: 0,
            outside: None,
            outside_cap: u64::MAX,
            exact: opts.exact.clone(),
            inferred_now: false,
            switch: opts.switch.clone(),
        })
    }

    /// The same replay with each live block tagged with its allocation's
    /// call-stack id (`DeviceTrace::stacks`), borrowed: a copy is 4 bytes
    /// an event.
    pub(crate) fn tagged(mut self, stacks: &'a [u32]) -> Self {
        self.stacks = stacks;
        self
    }

    /// The allocator's pool for a pool of the plan, created on first use.
    fn slot_for(&mut self, label: PoolLabel) -> PoolSlot {
        if let Some(&s) = self.slots.get(&label) {
            if self.alloc.pool_live(s) {
                return s;
            }
        }
        let id = match label {
            PoolLabel::Known(id) => Some(id),
            PoolLabel::Anonymous(_) => None,
        };
        let s = self.alloc.create_pool(id).unwrap_or(PoolSlot::DEFAULT);
        self.slots.insert(label, s);
        s
    }

    /// The segment holding recorded address `addr`, if live.
    fn segment_of(&self, addr: u64) -> Option<PoolSlot> {
        let (&a, &(size, slot)) = self.segs.range(..=addr).next_back()?;
        (addr < a.saturating_add(size)).then_some(slot)
    }

    /// Follows the segments the last step created and released.
    fn track(&mut self, slot: PoolSlot) {
        for e in self.alloc.events() {
            match e.action {
                Action::SegmentAlloc | Action::SegmentMap => {
                    self.segs.insert(e.addr, (e.size, slot));
                }
                Action::SegmentFree | Action::SegmentUnmap => {
                    self.segs.remove(&e.addr);
                }
                _ => {}
            }
        }
    }

    /// Recorded events reproduced so far.
    pub(crate) fn position(&self) -> usize {
        self.alloc.emitted() as usize
    }

    /// The same replay reading `rec` and its tags from `stacks` (see
    /// `Replaying::rebind`): the columns it read, grown or moved.
    pub(crate) fn rebind<'b>(self, rec: EventsRef<'b>, stacks: &'b [u32]) -> Stepper<'b> {
        Stepper {
            rec,
            stacks,
            alloc: self.alloc.with_device(|o| o.rebind(rec)),
            live: self.live,
            completing: self.completing,
            empty_cache_at: self.empty_cache_at,
            pools: self.pools,
            slots: self.slots,
            segs: self.segs,
            directed: self.directed,
            placed: self.placed,
            burst_retries: self.burst_retries,
            outside: self.outside,
            outside_cap: self.outside_cap,
            exact: self.exact,
            inferred_now: self.inferred_now,
            switch: self.switch,
        }
    }

    pub(crate) fn allocator(&self) -> &CachingAllocator<Oracle<'a>> {
        &self.alloc
    }

    /// This state kept to come back to (a scrubber's checkpoint): bound to
    /// no column, the allocator's free lists packed. `&mut`: they are set
    /// aside while the rest is copied, then put back as they were.
    pub(crate) fn checkpoint(&mut self) -> Checkpoint {
        let bytes = self.kept_bytes();
        let pools = self.alloc.packed_pools();
        let aside = self.alloc.pools_aside();
        let st = self.clone().rebind(EventsRef::EMPTY, &[]);
        self.alloc.pools_back(aside);
        Checkpoint { st, pools, bytes }
    }

    /// About what `checkpoint` would hold on the heap (the allocator's,
    /// the live blocks by address, the segments), without making it: for
    /// the screens' checkpoint budget.
    pub(crate) fn kept_bytes(&self) -> usize {
        self.alloc.approx_kept_bytes()
            + self.live.capacity() * 24
            + self.segs.len() * 64
            + self.empty_cache_at.capacity() * 8
    }

    /// Runs the request recorded at `k` (its events start at `from`);
    /// returns the block on success.
    fn request(&mut self, from: usize, k: usize) -> Option<BlockId> {
        let e = self.rec.at(k);
        let tag = self.stacks.get(k).copied().unwrap_or(0);
        if !self.pools.any_private {
            let got = self.alloc.malloc_tagged(e.size, e.stream, tag).ok();
            self.track(PoolSlot::DEFAULT);
            return got;
        }
        self.request_in_pools(from, k, e, tag)
    }

    /// `request` where the recording has private pools. Out of line: the
    /// default pools' requests, most of a trace, step without its state
    /// copies on their stack (docs/design/trace-decoding.md, "The replay
    /// behind the decoder").
    #[inline(never)]
    fn request_in_pools(&mut self, from: usize, k: usize, e: Event, tag: u32) -> Option<BlockId> {
        // The pool of the segment the request landed in: a live one, or
        // the one the recording creates for it.
        let created = (from..k).rev().find(|&c| {
            let s = self.rec.at(c);
            matches!(s.action, Action::SegmentAlloc | Action::SegmentMap)
                && e.addr >= s.addr
                && e.addr < s.addr.saturating_add(s.size)
        });
        let slot = match (e.action, self.segment_of(e.addr), created) {
            (Action::Oom, _, _) => PoolSlot::DEFAULT,
            (_, _, Some(c)) => {
                let first = self.pools.segment_at(c);
                let slot = self.slot_for(first);
                if self.pools.certain.contains(&c) {
                    slot
                } else {
                    // A pool with a free block that fits needs no new
                    // segment: try the plan's choice, then the others.
                    let mut options = vec![slot, PoolSlot::DEFAULT];
                    options.extend(self.alloc.pools().iter().map(|p| p.slot));
                    options.dedup();
                    let saved = self.alloc.clone();
                    let mut chosen = None;
                    for &o in options.iter().chain([PoolSlot(u16::MAX)].iter()) {
                        let o = if o.0 == u16::MAX {
                            match self.alloc.create_pool(None) {
                                Ok(s) => s,
                                Err(_) => break,
                            }
                        } else {
                            o
                        };
                        let got = self.alloc.malloc_in(o, e.size, e.stream, tag).ok();
                        if self.check(from).is_ok() && self.position() == k + 1 {
                            chosen = Some((o, got));
                            break;
                        }
                        self.alloc = saved.clone();
                    }
                    match chosen {
                        Some((o, got)) => {
                            self.track(o);
                            return got;
                        }
                        None => slot,
                    }
                }
            }
            (_, Some(slot), None) => slot,
            (_, None, None) => PoolSlot::DEFAULT,
        };
        let got = self.alloc.malloc_in(slot, e.size, e.stream, tag).ok();
        self.track(slot);
        got
    }

    /// A graph tree's `setCheckpointPoolState` re-allocates each block of a
    /// checkpointed segment in place (`alloc_found_block` on the block at a
    /// pointer, with the block's size), not by best fit: where a request
    /// recorded at `i` did not reproduce, and the recording puts it at the
    /// start of a free block of a private pool, it is placed there
    /// (docs/user/replay.md). `saved` is the state before the request.
    fn place(
        &mut self,
        i: usize,
        saved: (CachingAllocator<Oracle<'a>>, BTreeMap<u64, (u64, PoolSlot)>),
    ) -> Option<BlockId> {
        let e = self.rec.at(i);
        let tried = std::mem::replace(&mut self.alloc, saved.0);
        self.segs = saved.1;
        let slot = self.segment_of(e.addr).filter(|s| !s.is_default());
        let tag = self.stacks.get(i).copied().unwrap_or(0);
        let placed = slot.and_then(|_| self.alloc.alloc_at(e.addr, e.size, e.stream, tag));
        if placed.is_some() && self.check(i).is_ok() {
            self.placed += 1;
            return placed;
        }
        self.alloc = tried;
        None
    }

    /// Whether the last request's release-and-retry could have happened: a
    /// retry follows a failed cudaMalloc, so the segment it took must not
    /// have fitted before the release (`before` is the state then), under
    /// the memory limit or on the device beside what is held outside the
    /// allocator (what OOM entries showed, else a 64th of the device, but no
    /// more than the room the device had when it last gave a segment). A
    /// burst of `segment_free`s before a segment that fitted anyway was an
    /// `empty_cache()`, which emits the same events and counts no retry.
    fn retry_possible(&self, before: &CachingAllocator<Oracle<'a>>) -> bool {
        if self.alloc.stats().num_alloc_retries == before.stats().num_alloc_retries {
            return true;
        }
        let Some(seg) =
            self.alloc.events().iter().find(|e| matches!(e.action, Action::SegmentAlloc | Action::SegmentMap))
        else {
            return true;
        };
        let want = before.total_allocated_memory().saturating_add(seg.size);
        let total = before.device().total_memory();
        if before.memory_limit().is_some_and(|l| want > l) {
            return true;
        }
        want.saturating_add(self.outside.unwrap_or(total / 64).min(self.outside_cap)) > total
    }

    /// A release burst from `i` that no malloc explains: `empty_cache()` or
    /// a pool's `emptyCache(id)` as the plan says, checked against the
    /// recording; where our order differs, the recorded segments are
    /// released as listed.
    fn release_burst(&mut self, i: usize) {
        let rec = self.rec;
        if !self.pools.any_private {
            self.alloc.empty_cache();
            self.track(PoolSlot::DEFAULT);
            self.empty_cache_at.push(i);
            return;
        }
        let end = self.pools.burst_end.get(&i).copied().unwrap_or_else(|| {
            (i..rec.len())
                .find(|&k| !matches!(rec.at(k).action, Action::SegmentFree | Action::SegmentUnmap))
                .unwrap_or(rec.len())
        });
        let saved = self.alloc.clone();
        match self.pools.bursts.get(&i).cloned() {
            Some(BurstKind::PoolOnly(label)) => {
                let slot = self.slot_for(label);
                self.alloc.release_pool(slot);
                self.alloc.empty_cache_pool(slot);
            }
            Some(BurstKind::EmptyCache(labels)) => {
                for l in labels {
                    if let Some(&slot) = self.slots.get(&l) {
                        self.alloc.release_pool(slot);
                    }
                }
                self.alloc.empty_cache();
                self.empty_cache_at.push(i);
            }
            None => {
                self.alloc.empty_cache();
                self.empty_cache_at.push(i);
            }
        }
        if self.check(i).is_ok() && self.position() == end {
            self.track(PoolSlot::DEFAULT);
            return;
        }
        if rec.slice(i..end).iter().any(|e| e.action == Action::SegmentUnmap) {
            // Expandable pages cannot be released as listed: keep our
            // release, and let the check report where it differs.
            self.track(PoolSlot::DEFAULT);
            return;
        }
        self.alloc = saved;
        self.alloc.clear_events();
        let addrs: Vec<u64> =
            rec.slice(i..end).iter().filter(|e| e.action == Action::SegmentFree).map(|e| e.addr).collect();
        if self.alloc.release_segments(&addrs).is_ok() {
            self.directed += 1;
        }
        self.track(PoolSlot::DEFAULT);
    }

    fn note_live(&mut self, b: Option<BlockId>) {
        if let Some(b) = b {
            if let Ok(v) = self.alloc.block(b) {
                self.live.insert(v.ptr, b);
            }
        }
    }

    /// Compares what the allocator emitted since `from` with the recording.
    fn check(&self, from: usize) -> Result<(), Divergence> {
        for (j, got) in self.alloc.events().iter().enumerate() {
            let i = from + j;
            match self.rec.get(i) {
                Some(want) if want.same_as(got) => {}
                want => {
                    return Err(Divergence {
                        event: i,
                        expected: want,
                        got: Some(*got),
                        reason: "emitted event differs from the recorded one".into(),
                    })
                }
            }
        }
        Ok(())
    }

    /// A segment released at event `i`: the release path of the next
    /// malloc (OOM retry, max_split_size release, GC) when replaying that
    /// malloc reproduces it, else an `empty_cache()` call.
    #[inline(never)]
    fn step_release(&mut self, i: usize) {
        let rec = self.rec;
        // Either the release path of the next malloc (OOM retry,
        // max_split_size release, GC) or an empty_cache() call.
        let mut explained = false;
        let framed = self.pools.framed.contains(&i);
        if let Some(k) = next_request(rec, i).filter(|_| !framed) {
            let saved = (self.alloc.clone(), self.segs.clone());
            let got = self.request(i, k);
            if self.check(i).is_ok() && self.position() == k + 1 && self.retry_possible(&saved.0) {
                if self.alloc.stats().num_alloc_retries > saved.0.stats().num_alloc_retries {
                    self.burst_retries += 1;
                }
                self.note_live(got);
                explained = true;
            } else {
                (self.alloc, self.segs) = saved;
            }
        }
        if !explained {
            self.inferred_now = true;
            self.alloc.clear_events();
            self.release_burst(i);
        }
    }

    /// An `alloc` recorded at `i` in a private pool's segment: run, or
    /// placed where a checkpoint restore put it (`place`).
    #[inline(never)]
    fn step_in_private(&mut self, i: usize) {
        let saved = (self.alloc.clone(), self.segs.clone());
        let got = self.request(i, i);
        if self.check(i).is_ok() {
            self.note_live(got);
        } else if let Some(b) = self.place(i, saved) {
            self.note_live(Some(b));
        } else {
            self.note_live(got);
        }
    }

    /// An OOM at event `i`: the request retried in the pools and capture
    /// states a trace does not mark until one reproduces it.
    #[inline(never)]
    fn step_oom(&mut self, i: usize, ev: Event) {
        // An OOM with no release before it where our allocator would
        // release and retry: the request was made under a capture,
        // or (before 2.13) inside any private pool's scope, which a
        // trace does not mark (docs/user/replay.md, "Which release").
        // The pool a request went to is not in a 2.11 trace either:
        // one whose free blocks could not serve it.
        let saved = (self.alloc.clone(), self.segs.clone());
        let mut got = self.request(i, i);
        let mut tries = vec![(PoolSlot::DEFAULT, true)];
        tries.extend(
            self.alloc.pools().iter().filter(|p| !p.slot.is_default()).flat_map(|p| [(p.slot, true), (p.slot, false)]),
        );
        for (slot, captured) in tries {
            if self.check(i).is_ok() {
                break;
            }
            (self.alloc, self.segs) = saved.clone();
            self.alloc.set_assume_capture(captured);
            let tag = self.stacks.get(i).copied().unwrap_or(0);
            got = self.alloc.malloc_in(slot, ev.size, ev.stream, tag).ok();
            self.alloc.set_assume_capture(false);
            self.track(slot);
        }
        self.note_live(got);
        let held = self.alloc.total_allocated_memory().saturating_add(ev.addr);
        let outside = self.alloc.device().total_memory().saturating_sub(held);
        self.outside = Some(self.outside.map_or(outside, |o| o.max(outside)));
    }

    /// Reproduces the next recorded event(s). The events it emitted, and the
    /// state after each, are in `allocator().events()` / `points()` until the
    /// next step.
    pub(crate) fn step(&mut self) -> Result<(), Divergence> {
        self.step_within(0)
    }

    /// As `step`, but a `free_requested` whose `free_completed` is the next
    /// event, both before `end`, is reproduced with it, as one call of our
    /// `free`: most of a trace's frees cost one step, not two. A pass made
    /// this way never stops between the two, where a seek still can
    /// (docs/design/trace-decoding.md, "The replay behind the decoder").
    pub(crate) fn step_whole(&mut self) -> Result<(), Divergence> {
        self.step_within(usize::MAX)
    }

    fn step_within(&mut self, end: usize) -> Result<(), Divergence> {
        let rec = self.rec;
        let i = self.position();
        if let Some((_, conf)) = self.switch.take_if(|(at, _)| *at <= i) {
            self.alloc.set_config(conf);
        }
        let ev = rec.at(i);
        self.alloc.clear_events();
        self.inferred_now = false;
        let fail = |reason: String| Divergence { event: i, expected: Some(ev), got: None, reason };
        match ev.action {
            Action::SegmentFree | Action::SegmentUnmap => self.step_release(i),
            Action::SegmentAlloc | Action::SegmentMap => match next_request(rec, i) {
                Some(k) => {
                    let got = self.request(i, k);
                    self.note_live(got);
                }
                None => return Err(fail(format!("{} with no allocation request after it", ev.action))),
            },
            // An exact-address allocation (2.13+): its prefix's `alloc`,
            // when there is one, then its own, made by one call.
            Action::Alloc if self.exact.binary_search(&i).is_ok() => {
                // A prefix is allocated, then the target, then the prefix
                // freed: its `free_requested` is two entries on.
                let next = rec.get(i + 1).filter(|n| {
                    n.action == Action::Alloc
                        && self.exact.binary_search(&(i + 1)).is_ok()
                        && rec.get(i + 2).is_some_and(|f| f.action == Action::FreeRequested && f.addr == ev.addr)
                });
                let target = next.unwrap_or(ev);
                match self.alloc.malloc_at(target.size, target.addr, target.stream) {
                    Some(b) => self.note_live(Some(b)),
                    None => {
                        return Err(fail(format!(
                            "an exact-address allocation of {} B at {:#x} found no free block holding it",
                            target.size, target.addr
                        )))
                    }
                }
            }
            // Only a block of a private pool can have been placed by a
            // checkpoint restore: keep the state to retry there, and only there.
            // Without a private pool in the plan every segment is the
            // default pool's, and the lookup is skipped.
            Action::Alloc if self.pools.any_private && self.segment_of(ev.addr).is_some_and(|s| !s.is_default()) => {
                self.step_in_private(i)
            }
            Action::Oom => self.step_oom(i, ev),
            Action::Alloc => {
                let got = self.request(i, i);
                self.note_live(got);
            }
            Action::FreeRequested => {
                // Held: a free ends the scan of what a step reads, and two
                // events past it are there (`reads_only_held`).
                let completes = rec.get(i + 1).is_some_and(|n| n.action == Action::FreeCompleted && n.addr == ev.addr);
                let b = if completes { self.live.remove(&ev.addr) } else { self.live.get(&ev.addr).copied() };
                let Some(b) = b else {
                    return Err(fail(format!("free_requested of {:#x}, which is not allocated", ev.addr)));
                };
                if completes && i + 2 <= end {
                    // No stream use is replayed: our `free` completes at once.
                    self.alloc.free(b).map_err(|e| fail(e.to_string()))?;
                } else {
                    self.alloc.free_requested(b).map_err(|e| fail(e.to_string()))?;
                    self.completing = completes.then_some((ev.addr, b));
                }
            }
            Action::FreeCompleted => {
                let b = match self.completing.take() {
                    Some((a, b)) if a == ev.addr => Some(b),
                    _ => self.live.remove(&ev.addr),
                };
                let Some(b) = b else {
                    return Err(fail(format!("free_completed of {:#x}, which is not allocated", ev.addr)));
                };
                self.alloc.free_completed(b).map_err(|e| fail(e.to_string()))?;
            }
            // Markers: memory does not change.
            Action::Snapshot | Action::Annotate => self.alloc.push_external_event(ev),
        }
        self.check(i)?;
        if self.position() == i {
            return Err(fail("nothing was emitted for this event".into()));
        }
        if self.alloc.events().iter().any(|e| matches!(e.action, Action::SegmentAlloc | Action::SegmentMap)) {
            let room = self.alloc.device().total_memory().saturating_sub(self.alloc.total_allocated_memory());
            self.outside_cap = self.outside_cap.min(room);
        }
        Ok(())
    }
}

/// Replays `rec` from an empty allocator.
pub fn replay_events<'a>(rec: EventsRef<'a>, opts: &ReplayOptions) -> ReplayResult<'a> {
    replay_events_from(rec, opts, &[])
}

/// Replays `rec` from the state `seed`: segments that existed before the
/// first event (see `wrapped::reconstruct`).
pub fn replay_events_from<'a>(rec: EventsRef<'a>, opts: &ReplayOptions, seed: &[SeedSegment]) -> ReplayResult<'a> {
    let end = opts.stop_at.unwrap_or(usize::MAX).min(rec.len());
    let mut run = match Replaying::new(rec, opts, seed, end) {
        Ok(run) => run,
        Err(unseeded) => return *unseeded,
    };
    while run.position() < end && run.step() {}
    run.finish()
}

/// A replay under way: the stepper, and what the loop keeps of each step
/// (the peak, allocated bytes' changes, the events where asked). One loop
/// for the replay after the decoding and the one behind it
/// (docs/design/trace-decoding.md, "The replay behind the decoder").
pub(crate) struct Replaying<'a> {
    st: Stepper<'a>,
    keep_events: bool,
    peak: Peak,
    kept: Vec<Event>,
    allocated: Deltas,
    allocated_before: u64,
    last: u64,
    divergence: Option<Divergence>,
    pressure: Pressure,
    /// Where the replay stops (`ReplayOptions::stop_at`): no step folds a
    /// free past it (`Stepper::step_whole`).
    end: usize,
}

impl<'a> Replaying<'a> {
    /// A replay of `rec` from `seed` under `opts`, with room for `events`
    /// events' changes; where the seed does not fit, the result that says so.
    pub(crate) fn new(
        rec: EventsRef<'a>,
        opts: &ReplayOptions,
        seed: &[SeedSegment],
        events: usize,
    ) -> Result<Self, Box<ReplayResult<'a>>> {
        let st = match Stepper::new(rec, opts, seed) {
            Ok(st) => st,
            Err(d) => {
                // The seed did not fit: nothing was replayed.
                return Err(Box::new(ReplayResult {
                    allocator: CachingAllocator::for_release(
                        opts.config.clone(),
                        Oracle::new(rec, opts.device_total),
                        opts.release,
                    ),
                    divergence: Some(d),
                    inferred_empty_cache: 0,
                    reproduced: 0,
                    empty_cache_at: Vec::new(),
                    peak: Peak::default(),
                    directed: 0,
                    placed: 0,
                    burst_retries: 0,
                    ties_resolved: 0,
                    pressure: Pressure::Neither,
                    events: Vec::new(),
                    allocated: Arc::default(),
                    allocated_before: 0,
                }));
            }
        };
        let allocated_before = st.alloc.stats().get(Kind::AllocatedBytes, 0).current as u64;
        Ok(Replaying {
            st,
            keep_events: opts.keep_events,
            peak: Peak::default(),
            kept: Vec::new(),
            allocated: Deltas::with_capacity(events),
            allocated_before,
            last: allocated_before,
            divergence: None,
            pressure: Pressure::Neither,
            end: opts.stop_at.unwrap_or(usize::MAX),
        })
    }

    /// Recorded events reproduced so far.
    pub(crate) fn position(&self) -> usize {
        self.st.position()
    }

    /// The replay's state, as a scrubber's first pass keeps it.
    pub(crate) fn stepper(&mut self) -> &mut Stepper<'a> {
        &mut self.st
    }

    /// Reproduces the next recorded event(s); `false` once the replay
    /// has parted from the recording (and every step after).
    pub(crate) fn step(&mut self) -> bool {
        if self.divergence.is_some() {
            return false;
        }
        let i = self.st.position();
        if let Err(d) = self.st.step_within(self.end) {
            self.pressure = Pressure::of(&d, self.st.inferred_now);
            self.divergence = Some(d);
            return false;
        }
        for (k, p) in self.st.alloc.points().iter().enumerate() {
            self.allocated.push(p.allocated.wrapping_sub(self.last) as i64);
            self.last = p.allocated;
            if p.allocated > self.peak.allocated {
                self.peak = Peak { event: i + k, allocated: p.allocated, reserved: p.reserved };
            }
        }
        if self.keep_events {
            self.kept.extend_from_slice(self.st.alloc.events());
        }
        true
    }

    /// Whether the next step reads only events `rec` holds, where `rec`
    /// is the start of a column still growing: a step reads ahead to the
    /// next request, free or snapshot (`next_request`), two past it (an
    /// exact-address allocation's prefix), and one event for each it
    /// emits, which a release of every cached segment bounds by the block
    /// slots held.
    pub(crate) fn reads_only_held(&self) -> bool {
        let (rec, i) = (self.st.rec, self.st.position());
        let n = rec.len();
        if i.saturating_add(2 * self.st.alloc.block_slots() + 64) >= n {
            return false;
        }
        scan_end(rec, i).is_some_and(|k| k + 2 < n)
    }

    /// The same replay reading `rec`, its blocks tagged from `stacks`
    /// (empty: untagged): the columns it read, grown or moved.
    pub(crate) fn rebind<'b>(self, rec: EventsRef<'b>, stacks: &'b [u32]) -> Replaying<'b> {
        Replaying {
            st: self.st.rebind(rec, stacks),
            keep_events: self.keep_events,
            peak: self.peak,
            kept: self.kept,
            allocated: self.allocated,
            allocated_before: self.allocated_before,
            last: self.last,
            divergence: self.divergence,
            pressure: self.pressure,
            end: self.end,
        }
    }

    pub(crate) fn finish(self) -> ReplayResult<'a> {
        let mut st = self.st;
        st.alloc.clear_events();
        let reproduced = self.divergence.as_ref().map(|d| d.event).unwrap_or(st.position());
        ReplayResult {
            allocator: st.alloc,
            divergence: self.divergence,
            inferred_empty_cache: st.empty_cache_at.len(),
            reproduced,
            directed: st.directed,
            placed: st.placed,
            burst_retries: st.burst_retries,
            ties_resolved: 0,
            pressure: self.pressure,
            empty_cache_at: st.empty_cache_at,
            peak: self.peak,
            events: self.kept,
            allocated: Arc::new(self.allocated),
            allocated_before: self.allocated_before,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(action: Action, addr: u64, size: u64) -> Event {
        Event::new(action, addr, size, 0)
    }

    #[test]
    fn a_divergence_reads_as_one_sentence() {
        let d = |want, got| Divergence { event: 7, expected: Some(want), got: Some(got), reason: String::new() };
        let s = d(
            ev(Action::SegmentAlloc, 0x7f00_0000_0000, 64 << 20),
            ev(Action::SegmentFree, 0x7f00_0200_0000, 22 << 20),
        );
        assert_eq!(
            s.to_string(),
            "event 7: PyTorch took a new 64.00 MiB segment at 0x7f0000000000 (cudaMalloc) where we would have released the 22.00 MiB segment at 0x7f0002000000 (cudaFree)"
        );
        let s =
            d(ev(Action::SegmentFree, 0x7f00_0000_0000, 22 << 20), ev(Action::SegmentAlloc, 0x7f00_0200_0000, 2 << 20));
        assert!(s
            .to_string()
            .ends_with("where we would have taken a new 2.00 MiB segment at 0x7f0002000000 (cudaMalloc)"));
        // The oracle refusing another size than the run's, with the device
        // free: the settings differ, not the memory.
        let s = d(ev(Action::SegmentAlloc, 0x7f00_0000_0000, 148 << 20), ev(Action::Oom, 100 << 30, 160 << 20));
        assert_eq!(
            s.to_string(),
            "event 7: PyTorch took a new 148.00 MiB segment at 0x7f0000000000 (cudaMalloc) where we would have asked cudaMalloc for another size (for a request of 160.00 MiB, with 100.00 GiB free): the allocator settings differ from the run's"
        );
        let s = d(ev(Action::Alloc, 0x10, 512), ev(Action::Oom, 1 << 20, 64 << 20));
        assert!(s.to_string().ends_with(
            "where we would have run out of memory on a request of 64.00 MiB with 1.00 MiB free on the device"
        ));
    }
}
