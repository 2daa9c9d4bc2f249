//! PyTorch's `DeviceCachingAllocator` for one device (docs/design/pytorch-allocator.md §5–§11), as
//! the `Release` it is given behaves ("Releases" there).
//!
//! Blocks live in an arena and are linked to their segment neighbours by
//! index. Free blocks sit in per-(pool, stream) ordered maps keyed by
//! (size, tie, address): the stream-major order of PyTorch's block
//! comparator with the stream split out, since a lookup never crosses
//! streams; `tie` is the release's tie-break (0 in 2.11, where the address
//! alone decides).

use std::collections::{BTreeMap, HashMap, VecDeque};

use thiserror::Error;

use super::backing::Device;
use super::config::{format_size, AllocatorConfig, K_MIN_BLOCK_SIZE, K_SMALL_SIZE, ONE_EXA_BYTES, UNLIMITED};
use super::event::{Action, Event};
use super::index::{Entry, FreeBlocks, PackedBlocks};
use super::release::{Release, TieBreak};
use super::snapshot::{BlockInfo, BlockState, SegmentInfo};
use super::stats::{DeviceStats, Kind, LARGE_POOL, SMALL_POOL};

const NIL: u32 = u32::MAX;

/// A handle to an allocation. Stale handles (to blocks since merged or
/// released) are detected and refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockId {
    idx: u32,
    gen: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AllocError {
    #[error("block handle is stale (the block was freed and reused)")]
    StaleBlock,
    #[error("block at {0:#x} is not allocated")]
    NotAllocated(u64),
    #[error("block at {0:#x} is not waiting for its free to complete")]
    NotPending(u64),
    #[error("the default pool (0,0) is not a private pool")]
    DefaultPool,
    #[error("pool {0:?} was released and cannot be used again")]
    PoolReleased(MempoolId),
    #[error("already allocating to pool {0:?}")]
    AlreadyRouting(MempoolId),
    #[error("too many private pools")]
    TooManyPools,
    #[error("block recorded on too many streams")]
    TooManyStreams,
}

/// PyTorch's `OutOfMemoryError`; its `Display` is PyTorch's message text,
/// made only when shown (a what-if replay of a run with many OOMs makes
/// thousands and shows none).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub struct OutOfMemory {
    /// The size asked for.
    pub(crate) requested: u64,
    /// The rounded size (the `oom` trace entry's size).
    pub(crate) rounded: u64,
    /// The segment size that could not be obtained ("Tried to allocate").
    pub(crate) alloc_size: u64,
    pub(crate) stream: u64,
    pub(crate) device_free: u64,
    /// What the message says of the device and the process then; None for
    /// a request of an exabyte or more, refused before anything is asked.
    state: Option<Box<OomState>>,
    /// Refused by `throw_on_cudamalloc_oom` (2.12+) before any retry: no
    /// `oom` entry, `num_ooms` unchanged, `num_oom_rejections` counts it.
    pub(crate) rejected: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct OomState {
    device_index: i32,
    total: u64,
    process_used: Option<u64>,
    allowed: Option<u64>,
    allocated: u64,
    reserved: u64,
    /// 2.14+ drops the advice to turn expandable segments on when they are.
    expandable_on: bool,
    /// 2.15's `expandable_segments_reserve` the request was larger than.
    over_reserve: Option<u64>,
}

impl std::fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some(s) = &self.state else {
            return f.write_str("CUDA out of memory. Tried to allocate more than 1EB memory.");
        };
        if self.rejected {
            return write!(
                f,
                "CUDA out of memory. Allocation was preemptively rejected because it would exceed per_process_memory_fraction limit. Requested size: {}",
                format_size(self.requested)
            );
        }
        write!(
            f,
            "CUDA out of memory. Tried to allocate {}. GPU {} has a total capacity of {} of which {} is free. ",
            format_size(self.alloc_size),
            s.device_index,
            format_size(s.total),
            format_size(self.device_free)
        )?;
        if let Some(used) = s.process_used {
            write!(f, "Including non-PyTorch memory, this process has {} memory in use. ", format_size(used))?;
        }
        if let Some(a) = s.allowed {
            write!(f, "{} allowed; ", format_size(a))?;
        }
        write!(
            f,
            "Of the allocated memory {} is allocated by PyTorch, and {} is reserved by PyTorch but unallocated.",
            format_size(s.allocated),
            format_size(s.reserved.saturating_sub(s.allocated)),
        )?;
        if let Some(r) = s.over_reserve {
            return write!(
                f,
                " This allocation exceeds the expandable-segment reserve of {} for this stream, and a single allocation cannot span expandable segments. Raise PYTORCH_CUDA_ALLOC_CONF expandable_segments_reserve or expandable_segments_reserve_by_class (or unset it) so that a segment is at least {}.",
                format_size(r),
                format_size(self.alloc_size)
            );
        }
        if !s.expandable_on {
            f.write_str(" If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")?;
        }
        f.write_str("  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
    }
}

/// One cache line: the hot path loads a block per neighbour it looks at.
#[derive(Debug, Clone)]
#[repr(align(64))]
struct Block {
    ptr: u64,
    size: u64,
    /// Size asked for by the last allocation of this block; stale once it is free.
    requested: u64,
    stream: u64,
    prev: u32,
    next: u32,
    /// Expandable segment index, or NIL.
    es: u32,
    gen: u32,
    gc_count_base: i64,
    /// Pool index: `2 * slot + kind` (kind 0 = small, 1 = large; slot 0 is
    /// the default pools, others private pools, docs/design/allocator.md §Private pools).
    pool: u16,
    /// Outstanding stream events (record_stream) before the free completes.
    event_count: u8,
    allocated: bool,
    mapped: bool,
    /// Free requested, completion left to the caller (`free_completed`).
    pending: bool,
    alive: bool,
    /// Streams recorded with `record_stream` are in `CachingAllocator::stream_uses`.
    has_uses: bool,
}

const _: () = assert!(std::mem::size_of::<Block>() == 64);

#[derive(Debug, Clone, Default)]
struct StreamBlocks {
    stream: u64,
    /// Free mapped blocks by (size, ptr).
    blocks: FreeBlocks,
    /// Unmapped expandable-segment ranges by ptr.
    unmapped: BTreeMap<u64, u32>,
}

#[derive(Debug, Clone, Default)]
struct Pool {
    /// By stream, as PyTorch's comparator orders streams first. A map: a
    /// trace may use a stream per allocation (docs/user/input.md, "Bounds").
    streams: BTreeMap<u64, StreamBlocks>,
    get_free_blocks_call_count: i64,
}

/// A pool's free lists packed for keeping (`PackedPools`).
#[derive(Debug, Clone)]
struct PackedPool {
    streams: Box<[PackedStream]>,
    get_free_blocks_call_count: i64,
}

/// One stream's: its key in the pool, its free blocks in order, its
/// unmapped ranges.
#[derive(Debug, Clone)]
struct PackedStream {
    key: u64,
    stream: u64,
    blocks: PackedBlocks,
    unmapped: BTreeMap<u64, u32>,
}

impl Pool {
    fn packed(&self) -> PackedPool {
        let streams = self
            .streams
            .iter()
            .map(|(&key, s)| PackedStream {
                key,
                stream: s.stream,
                blocks: s.blocks.packed(),
                unmapped: s.unmapped.clone(),
            })
            .collect();
        PackedPool { streams, get_free_blocks_call_count: self.get_free_blocks_call_count }
    }
}

impl PackedPool {
    fn unpacked(&self) -> Pool {
        let streams = self
            .streams
            .iter()
            .map(|s| {
                (s.key, StreamBlocks { stream: s.stream, blocks: s.blocks.unpacked(), unmapped: s.unmapped.clone() })
            })
            .collect();
        Pool { streams, get_free_blocks_call_count: self.get_free_blocks_call_count }
    }
}

/// Every pool's free lists packed: what a state kept to come back to (a
/// screen's checkpoint) holds instead of their bins, one allocation per
/// stream instead of one per bin and a header per bin of its span
/// (docs/design/allocator.md, "Checkpoints").
#[derive(Debug, Clone)]
pub(crate) struct PackedPools(Box<[PackedPool]>);

/// Every pool's free lists, taken out while the rest of an allocator is
/// copied (`CachingAllocator::pools_aside`).
pub(crate) struct PoolsAside(Vec<Pool>);

/// Streams whose emptied free lists are kept for reuse; past this many, a
/// stream's entry goes when it holds no free block, so memory follows the
/// streams that hold blocks.
const KEPT_STREAMS: usize = 16;

impl Pool {
    #[inline]
    fn find(&self, stream: u64) -> Option<&StreamBlocks> {
        self.streams.get(&stream)
    }
    #[inline]
    fn find_mut(&mut self, stream: u64) -> Option<&mut StreamBlocks> {
        self.streams.get_mut(&stream)
    }
    #[inline]
    fn entry(&mut self, stream: u64) -> &mut StreamBlocks {
        self.streams.entry(stream).or_insert_with(|| StreamBlocks { stream, ..Default::default() })
    }
    /// Drops `stream`'s entry if it holds nothing and many streams are kept.
    #[inline]
    fn prune(&mut self, stream: u64) {
        if self.streams.len() > KEPT_STREAMS
            && self.streams.get(&stream).is_some_and(|s| s.blocks.is_empty() && s.unmapped.is_empty())
        {
            self.streams.remove(&stream);
        }
    }
}

#[derive(Debug, Clone)]
struct ExpandableSegment {
    base: u64,
    size: u64,
    page: u64,
}

/// The address range an expandable segment reserves on a device of
/// `total` bytes: the total and an eighth, in whole `page`s.
pub(crate) fn reservation_size(total: u64, page: u64) -> u64 {
    total.saturating_add(total / 8).div_ceil(page).saturating_mul(page)
}

#[inline]
fn stat_pool(pool: u16) -> usize {
    if is_small(pool) {
        SMALL_POOL
    } else {
        LARGE_POOL
    }
}

/// Whether pool index `pool` is a small-block pool.
#[inline]
fn is_small(pool: u16) -> bool {
    pool & 1 == 0
}

/// The pool index for a request of `size` (rounded) in pool slot `slot`.
#[inline]
fn pool_index(slot: PoolSlot, size: u64) -> u16 {
    slot.0 * 2 + u16::from(size > K_SMALL_SIZE)
}

/// A pool slot of one allocator: `PoolSlot::DEFAULT` is the default pools
/// (PyTorch's `large_blocks`/`small_blocks`), every other slot a private pool
/// (CUDA graphs, graph trees, `MemPool`; docs/design/allocator.md "Private pools").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct PoolSlot(pub(crate) u16);

impl PoolSlot {
    pub const DEFAULT: PoolSlot = PoolSlot(0);
    pub(crate) fn is_default(self) -> bool {
        self.0 == 0
    }
    pub(crate) fn index(self) -> usize {
        self.0 as usize
    }
}

/// PyTorch's `MempoolId_t`: (0,0) the default pools, (uid,0) a graph's own
/// pool, (0,n) a `graph_pool_handle()` or `MemPool`.
pub type MempoolId = (u64, u64);

/// Which mallocs a `begin_allocate_to_pool` routes (the `captures_underway`
/// filter): those on one stream (a capture), or all of them (`use_mem_pool`
/// on the one thread the model has).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Stream(u64),
    Always,
}

/// A private pool's bookkeeping (`PrivatePool`).
#[derive(Debug, Clone, Default)]
struct PoolState {
    /// `None` for a private pool whose id the recording does not carry.
    id: Option<MempoolId>,
    use_count: i32,
    /// Live cudaMallocs (or expandable maps) of the pool.
    cuda_malloc_count: i32,
    /// In `graph_pools` (the default slot always is).
    live: bool,
    no_split: bool,
    use_on_oom: bool,
}

/// What a pool looks like from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolView {
    pub slot: PoolSlot,
    pub(crate) id: Option<MempoolId>,
    pub use_count: i32,
    pub(crate) freeable: bool,
}

/// A live block of a segment that existed before a trace's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeedBlock {
    pub(crate) address: u64,
    pub(crate) size: u64,
    pub(crate) requested: u64,
    /// Freed by the program, waiting for `free_completed`.
    pub(crate) pending: bool,
}

/// A (non-expandable) segment to start from; the space between its live
/// blocks is free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedSegment {
    pub(crate) address: u64,
    pub(crate) size: u64,
    pub(crate) stream: u64,
    pub(crate) small: bool,
    /// `segment_pool_id`; a private pool is created on first use.
    pub(crate) pool: MempoolId,
    pub(crate) blocks: Vec<SeedBlock>,
    /// An expandable segment's mapped part (a snapshot without history):
    /// PyTorch counts it in no `segment` and no `inactive_split` statistic.
    pub(crate) expandable: bool,
    /// A whole expandable segment (a window's start, docs/user/replay.md
    /// "Windows of expandable segments"): `address` and `size` are its
    /// reserved address range, these its mapped ranges (page-aligned, in
    /// order, apart); the rest is reserved but unmapped. Empty otherwise.
    pub(crate) mapped: Vec<(u64, u64)>,
}

/// The allocator's totals right after one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatePoint {
    pub(crate) allocated: u64,
    pub(crate) reserved: u64,
}

/// What one handle points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockView {
    pub ptr: u64,
    pub size: u64,
    pub(crate) requested: u64,
    pub(crate) stream: u64,
    pub(crate) allocated: bool,
}

#[derive(Debug, Clone)]
pub struct CachingAllocator<D> {
    config: AllocatorConfig,
    device: D,
    device_index: i32,
    allowed_memory_maximum: Option<u64>,
    blocks: Vec<Block>,
    free_slots: Vec<u32>,
    /// Indexed by pool index (`2 * slot + kind`).
    pools: Vec<Pool>,
    /// Indexed by slot; slot 0 is the default pools.
    pool_state: Vec<PoolState>,
    /// `graph_pools_freeable`, in the order the pools became freeable.
    freeable: Vec<PoolSlot>,
    /// `captures_underway` (pools being allocated to), searched newest first.
    captures: Vec<(PoolSlot, Route)>,
    /// Set by `alloc_block` when `throw_on_cudamalloc_oom` refuses a segment.
    rejected: bool,
    /// The expandable-segment reserve (unrounded, as PyTorch's message says
    /// it) that the last request was larger than.
    over_reserve: Option<u64>,
    /// Behave as under a capture whatever the scopes say: a replay whose
    /// recording shows an OOM without the retry a capture skips.
    assume_capture: bool,
    /// Whether queued stream work is still running: `process_events` then
    /// completes no event (a sync still completes them all).
    events_pending: bool,
    /// Real stream captures underway (`markCaptureBegin`, 2.13+): from 2.13
    /// only these, not pool scopes, make the allocator behave as captured.
    active_captures: u32,
    release: Release,
    /// Per block index, its tie-break key (`TieBreak`); unused in 2.11.
    ties: Vec<u64>,
    /// The last tie-break number given out.
    tie_clock: u64,
    /// Frees postponed by a capture (blocks with stream uses freed during it).
    deferred: Vec<u32>,
    /// `record_stream` streams recorded during a capture, by block index.
    capture_uses: HashMap<u32, Vec<u64>>,
    stats: DeviceStats,
    total_allocated_memory: u64,
    es: Vec<Option<ExpandableSegment>>,
    /// Outstanding stream events: (the stream recorded on, block index).
    cuda_events: VecDeque<(u64, u32)>,
    /// `record_stream` streams of allocated blocks, by block index.
    stream_uses: HashMap<u32, Vec<u64>>,
    /// Caller's context id per block index (e.g. an interned call stack); 0 = none.
    tags: Vec<u32>,
    events: Vec<Event>,
    points: Vec<StatePoint>,
    /// Per kept event, the tag of the block an `alloc` made (0 for other
    /// events); kept only when `set_recording_tags` asked for them.
    event_tags: Vec<u32>,
    record_events: bool,
    record_tags: bool,
    emitted: u64,
}

impl<D> CachingAllocator<D> {
    /// The same allocator over the device `f` makes of this one's: a replay
    /// read behind a decoder moves its oracle from the growing column to
    /// the finished one this way (docs/design/trace-decoding.md, "The
    /// replay behind the decoder").
    pub(crate) fn with_device<E>(self, f: impl FnOnce(D) -> E) -> CachingAllocator<E> {
        CachingAllocator {
            device: f(self.device),
            config: self.config,
            allowed_memory_maximum: self.allowed_memory_maximum,
            device_index: self.device_index,
            blocks: self.blocks,
            free_slots: self.free_slots,
            pools: self.pools,
            pool_state: self.pool_state,
            freeable: self.freeable,
            captures: self.captures,
            rejected: self.rejected,
            over_reserve: self.over_reserve,
            assume_capture: self.assume_capture,
            events_pending: self.events_pending,
            active_captures: self.active_captures,
            release: self.release,
            ties: self.ties,
            tie_clock: self.tie_clock,
            deferred: self.deferred,
            capture_uses: self.capture_uses,
            stats: self.stats,
            total_allocated_memory: self.total_allocated_memory,
            es: self.es,
            cuda_events: self.cuda_events,
            stream_uses: self.stream_uses,
            tags: self.tags,
            events: self.events,
            points: self.points,
            event_tags: self.event_tags,
            record_events: self.record_events,
            record_tags: self.record_tags,
            emitted: self.emitted,
        }
    }

    /// The free lists packed, for a copy kept to come back to.
    pub(crate) fn packed_pools(&self) -> PackedPools {
        PackedPools(self.pools.iter().map(Pool::packed).collect())
    }

    /// The free lists taken out, so that a copy of the rest leaves them
    /// (`pools_back` returns them): a kept copy holds them packed.
    pub(crate) fn pools_aside(&mut self) -> PoolsAside {
        PoolsAside(std::mem::take(&mut self.pools))
    }

    pub(crate) fn pools_back(&mut self, aside: PoolsAside) {
        self.pools = aside.0;
    }

    /// The free lists `packed` holds, in place of this copy's (a copy made
    /// while they were aside has none).
    pub(crate) fn unpack_pools(&mut self, packed: &PackedPools) {
        self.pools = packed.0.iter().map(PackedPool::unpacked).collect();
    }

    /// Block slots held, live or free: a bound on the events one request
    /// or release can emit.
    pub(crate) fn block_slots(&self) -> usize {
        self.blocks.len()
    }

    /// About what a copy of this state kept with its free lists packed
    /// (`packed_pools`) holds on the heap, without making it: the blocks
    /// with their tie keys and tags, the free lists' entries, the
    /// expandable segments. An estimate for budgets (the screens'
    /// checkpoints), not an account.
    pub(crate) fn approx_kept_bytes(&self) -> usize {
        let stream = |b: &StreamBlocks| {
            std::mem::size_of::<PackedStream>() + b.blocks.len() * std::mem::size_of::<Entry>() + b.unmapped.len() * 48
        };
        let pools: usize = self.pools.iter().flat_map(|p| p.streams.values()).map(stream).sum();
        let per_block = std::mem::size_of::<Block>() + 8 + 4;
        self.blocks.capacity() * per_block
            + self.free_slots.capacity() * 4
            + self.pools.len() * std::mem::size_of::<PackedPool>()
            + pools
            + self.es.len() * 256
    }
}

impl<D: Device> CachingAllocator<D> {
    /// An allocator that behaves as PyTorch 2.11's.
    pub fn new(config: AllocatorConfig, device: D) -> Self {
        Self::for_release(config, device, Release::V2_11)
    }

    /// An allocator that behaves as `release`'s.
    pub fn for_release(config: AllocatorConfig, device: D, release: Release) -> Self {
        let mut a = CachingAllocator {
            allowed_memory_maximum: None,
            device_index: 0,
            blocks: Vec::new(),
            free_slots: Vec::new(),
            pools: vec![Pool::default(), Pool::default()],
            pool_state: vec![PoolState { id: Some((0, 0)), use_count: 1, live: true, ..Default::default() }],
            freeable: Vec::new(),
            captures: Vec::new(),
            active_captures: 0,
            rejected: false,
            over_reserve: None,
            assume_capture: false,
            events_pending: false,
            release: Release::V2_11,
            ties: Vec::new(),
            tie_clock: 0,
            deferred: Vec::new(),
            capture_uses: HashMap::new(),
            stats: DeviceStats::default(),
            total_allocated_memory: 0,
            es: Vec::new(),
            cuda_events: VecDeque::new(),
            stream_uses: HashMap::new(),
            tags: Vec::new(),
            events: Vec::new(),
            points: Vec::new(),
            event_tags: Vec::new(),
            record_events: true,
            record_tags: false,
            emitted: 0,
            device,
            config,
        };
        a.release = release;
        if let Some(f) = a.config.per_process_memory_fraction {
            a.set_memory_fraction(f);
        }
        a
    }

    pub fn release(&self) -> Release {
        self.release
    }

    /// Changes the settings from now on, as
    /// `torch.cuda.memory._set_allocator_settings` does: existing segments
    /// stay; each later request reads the new settings.
    pub fn set_config(&mut self, config: AllocatorConfig) {
        self.config = config;
    }

    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }
    pub fn device(&self) -> &D {
        &self.device
    }

    /// `torch.cuda.set_per_process_memory_fraction(f)` (2.9+ semantics: a
    /// fraction of 1.0 or more removes the limit).
    /// `set_per_process_memory_fraction`: 2.13 rounds the limit, earlier
    /// releases truncate it.
    pub fn set_memory_fraction(&mut self, fraction: f64) {
        let limit = fraction * self.device.total_memory() as f64;
        let limit = if self.release.rounds_fraction() { limit.round() } else { limit };
        self.allowed_memory_maximum = if fraction < 1.0 { Some(limit as u64) } else { None };
    }
    /// Sets `allowed_memory_maximum` directly, in bytes.
    pub fn set_memory_limit(&mut self, bytes: Option<u64>) {
        self.allowed_memory_maximum = bytes;
    }
    pub fn memory_limit(&self) -> Option<u64> {
        self.allowed_memory_maximum
    }

    /// Whether emitted events are kept for `events()`/`take_events()`.
    /// They are always counted.
    pub fn set_recording(&mut self, on: bool) {
        self.record_events = on;
    }
    /// Whether kept events keep their block's tag too (`take_event_tags`).
    pub fn set_recording_tags(&mut self, on: bool) {
        self.record_tags = on;
    }
    pub fn events(&self) -> &[Event] {
        &self.events
    }
    /// Allocated and reserved bytes after each kept event.
    pub(crate) fn points(&self) -> &[StatePoint] {
        &self.points
    }
    pub fn take_events(&mut self) -> Vec<Event> {
        self.points.clear();
        self.event_tags.clear();
        std::mem::take(&mut self.events)
    }
    /// `take_events` with each event's tag (`set_recording_tags`; all 0
    /// without it).
    pub fn take_tagged_events(&mut self) -> Vec<(Event, u32)> {
        let mut tags = std::mem::take(&mut self.event_tags);
        tags.resize(self.events.len(), 0);
        self.points.clear();
        std::mem::take(&mut self.events).into_iter().zip(tags).collect()
    }
    /// Drops the kept events, keeping the buffer's capacity.
    pub fn clear_events(&mut self) {
        self.events.clear();
        self.points.clear();
        self.event_tags.clear();
    }
    /// Number of events emitted since creation (kept or not).
    pub(crate) fn emitted(&self) -> u64 {
        self.emitted
    }
    /// Appends an event the allocator did not produce itself (a `snapshot` marker).
    pub(crate) fn push_external_event(&mut self, e: Event) {
        self.emit(e);
    }

    pub fn stats(&self) -> &DeviceStats {
        &self.stats
    }
    /// `torch.cuda.memory_stats()`: all 121 entries, sorted by key.
    pub fn memory_stats(&self) -> Vec<(String, i64)> {
        self.stats.flat_for(self.release)
    }
    /// Bytes currently obtained from the device (== `reserved_bytes.all.current`).
    pub fn total_allocated_memory(&self) -> u64 {
        self.total_allocated_memory
    }

    pub fn block(&self, id: BlockId) -> Result<BlockView, AllocError> {
        let b = self.get(id)?;
        Ok(BlockView { ptr: b.ptr, size: b.size, requested: b.requested, stream: b.stream, allocated: b.allocated })
    }

    fn get(&self, id: BlockId) -> Result<&Block, AllocError> {
        match self.blocks.get(id.idx as usize) {
            Some(b) if b.alive && b.gen == id.gen => Ok(b),
            _ => Err(AllocError::StaleBlock),
        }
    }

    /// Records an event after the state change it describes, with the
    /// allocated and reserved bytes it left.
    #[inline]
    fn emit(&mut self, e: Event) {
        self.emit_tagged(e, 0);
    }

    #[inline]
    fn emit_tagged(&mut self, e: Event, tag: u32) {
        self.emitted += 1;
        if self.record_events {
            if self.record_tags {
                self.event_tags.resize(self.events.len(), 0);
                self.event_tags.push(tag);
            }
            self.events.push(e);
            let s = &self.stats;
            self.points.push(StatePoint {
                allocated: s.get(Kind::AllocatedBytes, 0).current as u64,
                reserved: s.get(Kind::ReservedBytes, 0).current as u64,
            });
        }
    }

    /// The tie-break key of a block made for a segment just obtained from
    /// the device.
    #[inline]
    fn segment_tie(&mut self) -> u64 {
        match self.release.tie_break() {
            TieBreak::Address => 0,
            TieBreak::BlockAge | TieBreak::SegmentAge => {
                self.tie_clock += 1;
                self.tie_clock
            }
        }
    }

    /// The tie-break key of a new block carved from block `of`: a new
    /// object in 2.12 (a fresh number), of `of`'s segment from 2.13.
    #[inline]
    fn piece_tie(&mut self, of: u32) -> u64 {
        match self.release.tie_break() {
            TieBreak::Address => 0,
            TieBreak::BlockAge => {
                self.tie_clock += 1;
                self.tie_clock
            }
            TieBreak::SegmentAge => self.tie(of),
        }
    }

    #[inline]
    fn tie(&self, i: u32) -> u64 {
        self.ties.get(i as usize).copied().unwrap_or(0)
    }

    #[inline]
    fn new_block(&mut self, stream: u64, size: u64, ptr: u64, pool: u16, es: u32, tie: u64) -> u32 {
        let b = Block {
            ptr,
            size,
            requested: 0,
            stream,
            prev: NIL,
            next: NIL,
            es,
            gen: 0,
            gc_count_base: 0,
            event_count: 0,
            pool,
            allocated: false,
            mapped: true,
            pending: false,
            alive: true,
            has_uses: false,
        };
        let i = match self.free_slots.pop() {
            Some(i) => {
                let gen = self.blocks[i as usize].gen.wrapping_add(1);
                self.blocks[i as usize] = Block { gen, ..b };
                i
            }
            None => {
                self.blocks.push(b);
                (self.blocks.len() - 1) as u32
            }
        };
        if tie != 0 || (i as usize) < self.ties.len() {
            if i as usize >= self.ties.len() {
                self.ties.resize(self.blocks.len().max(i as usize + 1), 0);
            }
            self.ties[i as usize] = tie;
        }
        i
    }

    #[inline]
    fn set_tag(&mut self, i: u32, tag: u32) {
        let i = i as usize;
        if i >= self.tags.len() {
            if tag == 0 {
                return;
            }
            self.tags.resize(self.blocks.len().max(i + 1), 0);
        }
        self.tags[i] = tag;
    }

    #[inline]
    fn delete_block(&mut self, i: u32) {
        let b = &mut self.blocks[i as usize];
        b.alive = false;
        if b.has_uses {
            self.stream_uses.remove(&i);
        }
        self.free_slots.push(i);
    }

    #[inline]
    fn is_split(&self, i: u32) -> bool {
        let b = &self.blocks[i as usize];
        b.prev != NIL || b.next != NIL
    }

    /// `pool.insert(b)`: also stamps the block's GC age base.
    #[inline]
    fn pool_insert(&mut self, i: u32) {
        let b = &mut self.blocks[i as usize];
        let pool = &mut self.pools[b.pool as usize];
        b.gc_count_base = pool.get_free_blocks_call_count;
        let tie = self.ties.get(i as usize).copied().unwrap_or(0);
        pool.entry(b.stream).blocks.insert(b.size, tie, b.ptr, i);
    }

    #[inline]
    fn pool_remove(&mut self, i: u32) {
        let b = &self.blocks[i as usize];
        let tie = self.ties.get(i as usize).copied().unwrap_or(0);
        let (pool, stream) = (&mut self.pools[b.pool as usize], b.stream);
        if let Some(s) = pool.find_mut(stream) {
            s.blocks.remove(b.size, tie, b.ptr);
        }
        pool.prune(stream);
    }

    fn unmapped_insert(&mut self, i: u32) {
        let b = &self.blocks[i as usize];
        let (ptr, stream) = (b.ptr, b.stream);
        self.pools[b.pool as usize].entry(stream).unmapped.insert(ptr, i);
    }

    fn unmapped_remove(&mut self, i: u32) {
        let b = &self.blocks[i as usize];
        let (pool, stream) = (&mut self.pools[b.pool as usize], b.stream);
        if let Some(s) = pool.find_mut(stream) {
            s.unmapped.remove(&b.ptr);
        }
        pool.prune(stream);
    }

    fn gc_active(&self) -> bool {
        self.allowed_memory_maximum.is_some() && self.config.garbage_collection_threshold > 0.0
    }

    /// `malloc` (docs/design/pytorch-allocator.md §6). `tag` is kept with the block until its free completes.
    pub fn malloc(&mut self, orig_size: u64, stream: u64) -> Result<BlockId, OutOfMemory> {
        self.malloc_tagged(orig_size, stream, 0)
    }

    pub(crate) fn malloc_tagged(&mut self, orig_size: u64, stream: u64, tag: u32) -> Result<BlockId, OutOfMemory> {
        let slot = self.route(stream);
        self.malloc_in(slot, orig_size, stream, tag)
    }

    /// Whether the allocator behaves as under a stream capture: any pool
    /// being allocated to up to 2.12, only a real capture from 2.13.
    #[inline]
    fn in_capture(&self) -> bool {
        if self.assume_capture {
            return true;
        }
        if self.release.pool_scope_is_capture() {
            !self.captures.is_empty()
        } else {
            self.active_captures > 0
        }
    }

    /// `markCaptureBegin` (2.13+): a real stream capture starts. Earlier
    /// releases do not tell captures from pool scopes; it is kept anyway.
    pub fn mark_capture_begin(&mut self) {
        self.active_captures += 1;
    }

    /// `markCaptureEnd`.
    pub fn mark_capture_end(&mut self) {
        self.active_captures = self.active_captures.saturating_sub(1);
    }

    /// See `assume_capture`.
    pub(crate) fn set_assume_capture(&mut self, on: bool) {
        self.assume_capture = on;
    }

    /// Whether queued work is still running, so `process_events` completes
    /// no stream event until it is not (a sync completes them regardless).
    pub fn set_events_pending(&mut self, pending: bool) {
        self.events_pending = pending;
    }

    /// `get_pool`'s routing: the newest capture whose filter takes the stream.
    fn route(&self, stream: u64) -> PoolSlot {
        for &(slot, r) in self.captures.iter().rev() {
            if r == Route::Always || r == Route::Stream(stream) {
                return slot;
            }
        }
        PoolSlot::DEFAULT
    }

    /// `malloc` into pool slot `slot` whatever the routing says: replay uses
    /// it with the pool the recording shows (docs/design/allocator.md "Private pools").
    pub fn malloc_in(&mut self, slot: PoolSlot, orig_size: u64, stream: u64, tag: u32) -> Result<BlockId, OutOfMemory> {
        if orig_size >= ONE_EXA_BYTES {
            return Err(OutOfMemory {
                requested: orig_size,
                rounded: orig_size,
                alloc_size: orig_size,
                stream,
                device_free: 0,
                state: None,
                rejected: false,
            });
        }
        let slot = if self.pool_live(slot) { slot } else { PoolSlot::DEFAULT };
        // While any capture is underway, malloc leaves events alone.
        if !self.in_capture() {
            self.process_events();
        }
        let size = self.config.round_size(orig_size);
        let pool = pool_index(slot, size);
        let alloc_size = self.config.allocation_size(size);
        self.over_reserve = None;
        let es_active = self.config.expandable_segments;

        let mut found = self.get_free_block(pool, size, stream, es_active);
        let mut pool_used = pool;
        if found.is_none() {
            if self.gc_active() {
                self.garbage_collect_cached_blocks();
            }
            found = self.alloc_block(pool, size, alloc_size, stream, es_active, false);
            if self.rejected {
                return Err(self.rejection(orig_size, size, alloc_size, stream));
            }
            if found.is_none() && slot.is_default() {
                if let Some((b, p)) = self.try_mempool_fallback(size, stream, es_active) {
                    found = Some(b);
                    pool_used = p;
                }
            }
            if found.is_none() && self.release_available_cached_blocks(pool, size, stream) {
                found = self.alloc_block(pool, size, alloc_size, stream, es_active, false);
            }
            if found.is_none() && !self.rejected && !self.in_capture() {
                self.release_cached_blocks(None);
                found = self.alloc_block(pool, size, alloc_size, stream, es_active, true);
            }
            if self.rejected {
                return Err(self.rejection(orig_size, size, alloc_size, stream));
            }
        }
        let Some(block) = found else {
            return Err(self.out_of_memory(orig_size, size, alloc_size, stream));
        };
        let split = self.should_split(block, size, es_active);
        let i = self.alloc_found_block(block, pool_used, size, orig_size, split, tag);
        Ok(BlockId { idx: i, gen: self.blocks[i as usize].gen })
    }

    /// `try_mempool_fallback`: a default-pool request that cudaMalloc could
    /// not serve takes a cached block of a `use_on_oom` pool (best fit only).
    fn try_mempool_fallback(&mut self, size: u64, stream: u64, es_active: bool) -> Option<(u32, u16)> {
        let pools: Vec<PoolSlot> = (1..self.pool_state.len())
            .filter(|&i| self.pool_state[i].live && self.pool_state[i].use_on_oom)
            .map(|i| PoolSlot(i as u16))
            .collect();
        for slot in pools {
            let pool = pool_index(slot, size);
            if let Some(b) = self.get_free_block(pool, size, stream, es_active) {
                return Some((b, pool));
            }
        }
        None
    }

    // ---- private pools (docs/design/allocator.md "Private pools")

    /// `create_or_incref_pool`: a pool with `id` that is alive gains a
    /// reference; otherwise a new pool starts with one. `None` makes a
    /// new pool whose id is not known (replay of a recording without it).
    pub fn create_pool(&mut self, id: Option<MempoolId>) -> Result<PoolSlot, AllocError> {
        if id == Some((0, 0)) {
            return Err(AllocError::DefaultPool);
        }
        if let Some(id) = id {
            if let Some(i) = self.pool_state.iter().position(|p| p.live && p.id == Some(id)) {
                let p = &mut self.pool_state[i];
                if p.use_count == 0 {
                    return Err(AllocError::PoolReleased(id));
                }
                p.use_count += 1;
                return Ok(PoolSlot(i as u16));
            }
        }
        let fresh = PoolState { id, use_count: 1, live: true, ..Default::default() };
        let i = match self.pool_state.iter().skip(1).position(|p| !p.live) {
            Some(k) => {
                self.pool_state[k + 1] = fresh;
                k + 1
            }
            None => {
                if self.pool_state.len() >= (u16::MAX / 2) as usize {
                    return Err(AllocError::TooManyPools);
                }
                self.pool_state.push(fresh);
                self.pools.push(Pool::default());
                self.pools.push(Pool::default());
                self.pool_state.len() - 1
            }
        };
        Ok(PoolSlot(i as u16))
    }

    /// A freeable pool left without segments leaves `graph_pools`.
    fn erase_if_empty(&mut self, slot: PoolSlot) {
        let p = &mut self.pool_state[slot.index()];
        if !slot.is_default() && p.cuda_malloc_count == 0 {
            *p = PoolState::default();
            self.freeable.retain(|&s| s != slot);
        }
    }

    /// Whether `slot` is a pool in use (the default pools always are).
    pub(crate) fn pool_live(&self, slot: PoolSlot) -> bool {
        self.pool_state.get(slot.index()).is_some_and(|p| p.live)
    }

    /// The live pool with this id.
    pub(crate) fn pool_slot(&self, id: MempoolId) -> Option<PoolSlot> {
        if id == (0, 0) {
            return Some(PoolSlot::DEFAULT);
        }
        self.pool_state.iter().position(|p| p.live && p.id == Some(id)).map(|i| PoolSlot(i as u16))
    }

    /// Every live pool, default first.
    pub fn pools(&self) -> Vec<PoolView> {
        (0..self.pool_state.len())
            .filter(|&i| self.pool_state[i].live)
            .map(|i| {
                let slot = PoolSlot(i as u16);
                let p = &self.pool_state[i];
                PoolView { slot, id: p.id, use_count: p.use_count, freeable: self.freeable.contains(&slot) }
            })
            .collect()
    }

    /// `MemPool(use_on_oom=…, no_split=…)`.
    pub fn set_pool_flags(&mut self, slot: PoolSlot, no_split: bool, use_on_oom: bool) {
        if let Some(p) = self.pool_state.get_mut(slot.index()).filter(|_| !slot.is_default()) {
            p.no_split = no_split;
            p.use_on_oom = use_on_oom;
        }
    }

    /// `beginAllocateToPool`: a reference to the pool (created if needed),
    /// and mallocs that `route` takes go to it until `end_allocate_to_pool`.
    pub fn begin_allocate_to_pool(&mut self, id: MempoolId, route: Route) -> Result<PoolSlot, AllocError> {
        let slot = self.create_pool(Some(id))?;
        if self.captures.iter().any(|&(s, _)| s == slot) {
            return Err(AllocError::AlreadyRouting(id));
        }
        self.captures.push((slot, route));
        Ok(slot)
    }

    /// `endAllocateToPool`: routing stops; nothing is freed.
    pub fn end_allocate_to_pool(&mut self, slot: PoolSlot) {
        self.captures.retain(|&(s, _)| s != slot);
    }

    /// `releasePool`: one reference less; at none the pool is freeable, and
    /// the next `empty_cache` returns its free segments.
    pub fn release_pool(&mut self, slot: PoolSlot) {
        if slot.is_default() {
            return;
        }
        let Some(p) = self.pool_state.get_mut(slot.index()).filter(|p| p.live && p.use_count > 0) else {
            return;
        };
        p.use_count -= 1;
        if p.use_count == 0 && !self.freeable.contains(&slot) {
            self.freeable.push(slot);
        }
    }

    /// Releases exactly these whole free segments, as one `empty_cache`
    /// would (one sync): for a replay whose recording says which segments
    /// went where our model's release order cannot tell. Returns the
    /// address of the first segment that is not a whole free segment.
    pub(crate) fn release_segments(&mut self, addrs: &[u64]) -> Result<(), u64> {
        self.stats.num_sync_all_streams += 1;
        for &a in addrs {
            let i = (0..self.blocks.len() as u32)
                .find(|&i| {
                    let b = &self.blocks[i as usize];
                    b.alive && b.ptr == a && b.mapped && b.es == NIL
                })
                .ok_or(a)?;
            let b = &self.blocks[i as usize];
            if b.prev != NIL || b.next != NIL || Self::block_state(b) != BlockState::Inactive {
                return Err(a);
            }
            let slot = PoolSlot(b.pool >> 1);
            self.release_block(i);
            if self.freeable.contains(&slot) {
                self.erase_if_empty(slot);
            }
        }
        Ok(())
    }

    /// `alloc_found_block` on the free block that starts at `addr`, with
    /// exactly `size` bytes (split off when the block is larger): how a
    /// graph tree's `setCheckpointPoolState` restores a segment's blocks in
    /// place. `None` if no free block of a private pool starts there, on
    /// that stream, with room for `size`.
    pub(crate) fn alloc_at(&mut self, addr: u64, size: u64, stream: u64, tag: u32) -> Option<BlockId> {
        let i = (0..self.blocks.len() as u32).find(|&i| {
            let b = &self.blocks[i as usize];
            b.alive && b.ptr == addr && b.mapped && b.stream == stream && b.pool >> 1 != 0
        })?;
        let b = &self.blocks[i as usize];
        if Self::block_state(b) != BlockState::Inactive || b.size < size || size == 0 {
            return None;
        }
        let (pool, split) = (b.pool, b.size > size);
        self.pool_remove(i);
        let j = self.alloc_found_block(i, pool, size, size, split, tag);
        Some(BlockId { idx: j, gen: self.blocks[j as usize].gen })
    }

    /// `allocateWithAddress` (2.13+, `storage._resize_with_addr_`): `size`
    /// bytes at exactly `addr`, taken from the free block holding it in the
    /// pool the size and stream route to. A free block that starts below
    /// `addr` gives up a prefix first, allocated and freed at once as
    /// PyTorch does (`alloc` prefix, `alloc`, `free_requested` and
    /// `free_completed` prefix). `None` if no free block holds the range.
    pub fn malloc_at(&mut self, orig_size: u64, addr: u64, stream: u64) -> Option<BlockId> {
        if !self.in_capture() {
            self.process_events();
        }
        let size = self.config.round_size(orig_size);
        let slot = self.route(stream);
        let pool = pool_index(slot, size);
        let s = self.pools[pool as usize].find(stream)?;
        let i = s.blocks.values().find(|&i| {
            let b = &self.blocks[i as usize];
            b.ptr <= addr && addr.checked_add(size).is_some_and(|end| end <= b.ptr + b.size)
        })?;
        let es_active = self.config.expandable_segments;
        let mut target = i;
        self.pool_remove(i);
        let prefix = addr - self.blocks[i as usize].ptr;
        let mut front = None;
        if prefix > 0 {
            // The prefix is carved off as an allocation of its own; the rest
            // goes back to the pool and is taken again at once.
            front = Some(self.alloc_found_block(i, pool, prefix, prefix, true, 0));
            target = i;
            self.pool_remove(target);
        }
        let split = self.should_split(target, size, es_active);
        let j = self.alloc_found_block(target, pool, size, orig_size, split, 0);
        if let Some(f) = front {
            let id = BlockId { idx: f, gen: self.blocks[f as usize].gen };
            let _ = self.free(id);
        }
        Some(BlockId { idx: j, gen: self.blocks[j as usize].gen })
    }

    /// `emptyCache(id)` (what `~MemPool` does): only that pool, and only if
    /// it is freeable.
    pub fn empty_cache_pool(&mut self, slot: PoolSlot) {
        if !slot.is_default() {
            self.release_cached_blocks(Some(slot));
        }
    }

    fn out_of_memory(&mut self, orig_size: u64, size: u64, alloc_size: u64, stream: u64) -> OutOfMemory {
        let device_free = self.device.free_memory(self.emitted);
        self.stats.num_ooms += 1;
        self.emit(Event::new(Action::Oom, device_free, size, stream));
        self.oom_error(orig_size, size, alloc_size, stream, device_free, false)
    }

    /// `throw_on_cudamalloc_oom`'s refusal (2.12+): counted in
    /// `num_oom_rejections` only; no `oom` entry, no `num_ooms`.
    fn rejection(&mut self, orig_size: u64, size: u64, alloc_size: u64, stream: u64) -> OutOfMemory {
        self.rejected = false;
        self.stats.num_oom_rejections += 1;
        let device_free = self.device.free_memory(self.emitted);
        self.oom_error(orig_size, size, alloc_size, stream, device_free, true)
    }

    /// The error, with what its message says of the device and the process now.
    fn oom_error(
        &self,
        orig_size: u64,
        size: u64,
        alloc_size: u64,
        stream: u64,
        device_free: u64,
        rejected: bool,
    ) -> OutOfMemory {
        let state = OomState {
            device_index: self.device_index,
            total: self.device.total_memory(),
            process_used: self.device.process_used(),
            allowed: self.allowed_memory_maximum,
            allocated: self.stats.get(Kind::AllocatedBytes, 0).current.max(0) as u64,
            reserved: self.stats.get(Kind::ReservedBytes, 0).current.max(0) as u64,
            expandable_on: self.config.expandable_segments && self.release.omits_expandable_advice(),
            over_reserve: self.over_reserve,
        };
        OutOfMemory {
            requested: orig_size,
            rounded: size,
            alloc_size,
            stream,
            device_free,
            state: Some(Box::new(state)),
            rejected,
        }
    }

    /// Best fit (docs/design/pytorch-allocator.md §6.1).
    #[inline]
    fn get_free_block(&mut self, pool: u16, size: u64, stream: u64, es_active: bool) -> Option<u32> {
        if self.gc_active() {
            self.pools[pool as usize].get_free_blocks_call_count += 1;
        }
        let mss = self.config.max_split_size;
        let max_non_split = self.config.max_non_split_rounding_size;
        // PyTorch's two oversize rules (docs/design/pytorch-allocator.md §6.1).
        let accept = |bsize: u64| {
            let oversize_for_normal = size < mss && bsize >= mss;
            let too_loose_for_oversize = size >= mss && bsize >= size.saturating_add(max_non_split);
            !(oversize_for_normal || too_loose_for_oversize)
        };
        let p = &mut self.pools[pool as usize];
        if self.es.is_empty() {
            // No expandable segment exists, so the first block at or above the
            // size is the candidate: look it up and take it in one step.
            let got = p.find_mut(stream)?.blocks.take_first_from(size, |e| accept(e.0)).map(|e| e.3);
            p.prune(stream);
            return got;
        }
        let p = &self.pools[pool as usize];
        let cand = {
            let free = &p.find(stream)?.blocks;
            let mut cand = free.first_from(size)?.3;
            let blocks = &self.blocks;
            if blocks[cand as usize].es != NIL {
                let mut it = free.range_from(size).map(|e| e.3).skip(1);
                if es_active {
                    // Prefer blocks that cannot grow into unmapped space, keeping
                    // the segment tail free to extend.
                    let expandable_size = |i: u32| {
                        let b = &blocks[i as usize];
                        b.size
                            + if b.next != NIL && !blocks[b.next as usize].mapped {
                                blocks[b.next as usize].size
                            } else {
                                0
                            }
                    };
                    for n in it {
                        if blocks[cand as usize].es == NIL || expandable_size(n) >= expandable_size(cand) {
                            break;
                        }
                        cand = n;
                    }
                } else {
                    cand = it.find(|&n| blocks[n as usize].es == NIL)?;
                }
            }
            cand
        };
        let b = &self.blocks[cand as usize];
        if !accept(b.size) {
            return None;
        }
        let (bsize, bptr, btie) = (b.size, b.ptr, self.tie(cand));
        let p = &mut self.pools[pool as usize];
        if let Some(s) = p.find_mut(stream) {
            s.blocks.remove(bsize, btie, bptr);
        }
        p.prune(stream);
        Some(cand)
    }

    #[inline]
    fn should_split(&self, i: u32, size: u64, es_active: bool) -> bool {
        let b = &self.blocks[i as usize];
        if self.pool_state[(b.pool >> 1) as usize].no_split {
            return false;
        }
        let remaining = b.size - size;
        if is_small(b.pool) || es_active {
            remaining >= K_MIN_BLOCK_SIZE
        } else {
            size < self.config.max_split_size && remaining > K_SMALL_SIZE
        }
    }

    /// docs/design/pytorch-allocator.md §6.3: carve `size` from the front of block `i` when splitting.
    #[inline]
    fn alloc_found_block(&mut self, i: u32, pool: u16, size: u64, orig_size: u64, split: bool, tag: u32) -> u32 {
        let sp = stat_pool(pool);
        let already_split = self.is_split(i);
        let es = self.blocks[i as usize].es;
        let mut b = i;
        if split {
            let rem = i;
            let (ptr, stream, prev) = {
                let r = &self.blocks[rem as usize];
                (r.ptr, r.stream, r.prev)
            };
            let tie = self.piece_tie(rem);
            b = self.new_block(stream, size, ptr, pool, es, tie);
            self.blocks[b as usize].prev = prev;
            if prev != NIL {
                self.blocks[prev as usize].next = b;
            }
            self.blocks[b as usize].next = rem;
            {
                let r = &mut self.blocks[rem as usize];
                r.prev = b;
                r.ptr += size;
                r.size -= size;
            }
            self.pool_insert(rem);
            if es == NIL {
                if already_split {
                    self.stats.decrease(Kind::InactiveSplitBytes, sp, size as i64);
                } else {
                    let rsize = self.blocks[rem as usize].size as i64;
                    self.stats.increase(Kind::InactiveSplitBytes, sp, rsize);
                    self.stats.increase(Kind::InactiveSplit, sp, 1);
                }
            }
        } else if already_split && es == NIL {
            let bsize = self.blocks[b as usize].size as i64;
            self.stats.decrease(Kind::InactiveSplitBytes, sp, bsize);
            self.stats.decrease(Kind::InactiveSplit, sp, 1);
        }
        let (ptr, bsize, stream) = {
            let blk = &mut self.blocks[b as usize];
            blk.allocated = true;
            blk.requested = orig_size;
            (blk.ptr, blk.size, blk.stream)
        };
        self.set_tag(b, tag);
        self.stats.increase(Kind::Allocation, sp, 1);
        self.stats.increase(Kind::AllocatedBytes, sp, bsize as i64);
        self.stats.increase(Kind::Active, sp, 1);
        self.stats.increase(Kind::ActiveBytes, sp, bsize as i64);
        self.stats.increase(Kind::RequestedBytes, sp, orig_size as i64);
        if bsize >= self.config.max_split_size {
            self.stats.oversize_allocations.increase(1);
        }
        self.emit_tagged(Event::new(Action::Alloc, ptr, orig_size, stream), tag);
        b
    }

    /// docs/design/pytorch-allocator.md §6.4: a new segment from the device.
    fn alloc_block(
        &mut self,
        pool: u16,
        size: u64,
        alloc_size: u64,
        stream: u64,
        es_active: bool,
        retry: bool,
    ) -> Option<u32> {
        if retry {
            self.stats.num_alloc_retries += 1;
        }
        if let Some(allowed) = self.allowed_memory_maximum {
            if self.total_allocated_memory + alloc_size > allowed {
                return None;
            }
        }
        if self.config.throw_on_cudamalloc_oom && self.release.has_oom_rejections() {
            // The configured fraction, whether or not it became the limit
            // above (a fraction set at start-up already refused there).
            let fraction = self.config.per_process_memory_fraction.unwrap_or(1.0);
            if (self.total_allocated_memory + alloc_size) as f64 > fraction * self.device.total_memory() as f64 {
                self.rejected = true;
                return None;
            }
        }
        if es_active {
            return self.try_allocate_expandable_block(pool, size, stream);
        }
        let ptr = self.device.malloc(alloc_size, self.emitted).ok()?;
        self.total_allocated_memory += alloc_size;
        let tie = self.segment_tie();
        let b = self.new_block(stream, alloc_size, ptr, pool, NIL, tie);
        self.pool_state[(pool >> 1) as usize].cuda_malloc_count += 1;
        let sp = stat_pool(pool);
        self.stats.increase(Kind::Segment, sp, 1);
        self.reserved_change(pool, alloc_size as i64);
        if alloc_size >= self.config.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        self.emit(Event::new(Action::SegmentAlloc, ptr, alloc_size, stream));
        Some(b)
    }

    /// Reserved bytes change by `n` in pool index `pool`, and in the private
    /// pool's own statistic (2.13's `reserved_bytes_by_private_pools`).
    fn reserved_change(&mut self, pool: u16, n: i64) {
        // The private pool's id is read before the pool may be erased.
        let sp = stat_pool(pool);
        self.stats.change(Kind::ReservedBytes, sp, n);
        if let Some(id) = self.pool_state[(pool >> 1) as usize].id.filter(|&id| id != (0, 0)) {
            self.stats.change_private_reserved(id, sp, n);
        }
    }

    /// cudaFree of a whole free segment (docs/design/pytorch-allocator.md §6.6).
    fn release_block(&mut self, i: u32) {
        let (ptr, size, stream, pool) = {
            let b = &self.blocks[i as usize];
            (b.ptr, b.size, b.stream, b.pool)
        };
        self.stats.num_device_free += 1;
        self.device.free(ptr, size);
        self.pool_state[(pool >> 1) as usize].cuda_malloc_count -= 1;
        self.total_allocated_memory -= size;
        let sp = stat_pool(pool);
        self.stats.decrease(Kind::Segment, sp, 1);
        self.reserved_change(pool, -(size as i64));
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.decrease(1);
        }
        self.emit(Event::new(Action::SegmentFree, ptr, size, stream));
        self.pool_remove(i);
        self.delete_block(i);
    }

    /// docs/design/pytorch-allocator.md §6.5: free oversize cached blocks until the request could fit.
    fn release_available_cached_blocks(&mut self, pool: u16, size: u64, stream: u64) -> bool {
        let mss = self.config.max_split_size;
        if mss == UNLIMITED {
            return false;
        }
        let want = size.max(mss);
        let p = &self.pools[pool as usize];
        let Some(s) = p.find(stream) else {
            return false;
        };
        let map = &s.blocks;
        let at = map.first_from(want).map(|e| e.3);
        match at {
            Some(i) if self.blocks[i as usize].es == NIL => {
                self.release_block(i);
                true
            }
            _ => {
                // Walk down from the largest block below `want`, releasing
                // oversize non-expandable blocks.
                let below: Vec<u32> = map
                    .range_below_rev(want)
                    .map(|e| e.3)
                    .take_while(|&i| self.blocks[i as usize].size >= mss)
                    .collect();
                let mut released = 0u64;
                for i in below {
                    if released >= want {
                        break;
                    }
                    if self.blocks[i as usize].es == NIL {
                        released += self.blocks[i as usize].size;
                        self.release_block(i);
                    }
                }
                released >= want
            }
        }
    }

    /// `torch.cuda.empty_cache()`.
    pub fn empty_cache(&mut self) {
        self.release_cached_blocks(None);
    }

    /// `release_cached_blocks(mempool_id)` (docs/design/pytorch-allocator.md §6.6; docs/design/allocator.md
    /// "Private pools"): with no pool, the default pools (large first; not
    /// while a capture is underway), then every freeable private pool's small
    /// and large segments; with a pool, only that one if it is freeable.
    /// A freeable pool left with no segments is erased.
    fn release_cached_blocks(&mut self, target: Option<PoolSlot>) -> bool {
        if target.is_none() && !self.in_capture() {
            self.synchronize_and_free_events(None);
            self.release_blocks(1);
            self.release_blocks(0);
        }
        for slot in self.freeable.clone() {
            if let Some(t) = target {
                if t != slot {
                    continue;
                }
                self.synchronize_and_free_events(Some(slot));
            }
            self.release_blocks(slot.0 * 2);
            self.release_blocks(slot.0 * 2 + 1);
            self.erase_if_empty(slot);
        }
        true
    }

    /// Completes pending stream events: all of them, or those of one pool's blocks.
    fn synchronize_and_free_events(&mut self, only: Option<PoolSlot>) {
        self.stats.num_sync_all_streams += 1;
        self.insert_events_deferred_until_no_capture();
        match only {
            None => self.complete_stream_events(),
            Some(slot) => {
                let (mine, rest): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut self.cuda_events)
                    .into_iter()
                    .partition(|&(_, i)| self.blocks[i as usize].pool >> 1 == slot.0);
                self.cuda_events = rest;
                self.complete(mine);
            }
        }
    }

    fn release_blocks(&mut self, pool: u16) {
        let all: Vec<u32> = self.pools[pool as usize].streams.values().flat_map(|s| s.blocks.values()).collect();
        let mut to_unmap = Vec::new();
        for i in all {
            if self.blocks[i as usize].es != NIL {
                to_unmap.push(i);
            } else if !self.is_split(i) {
                self.release_block(i);
            }
        }
        for i in to_unmap {
            self.unmap_block(i);
            let b = &self.blocks[i as usize];
            if !b.mapped && b.prev == NIL && b.next == NIL {
                let es = b.es;
                self.unmapped_remove(i);
                if let Some(seg) = self.es[es as usize].take() {
                    self.device.release_reservation(seg.base, seg.size);
                }
                self.delete_block(i);
            }
        }
    }

    /// docs/design/pytorch-allocator.md §6.7: release old unsplit large-pool segments while reserved is
    /// above `garbage_collection_threshold` of the memory limit.
    fn garbage_collect_cached_blocks(&mut self) {
        let Some(allowed) = self.allowed_memory_maximum else {
            return;
        };
        let threshold = (self.config.garbage_collection_threshold * allowed as f64) as u64;
        if self.total_allocated_memory <= threshold {
            return;
        }
        let target = self.total_allocated_memory - threshold;
        let calls = self.pools[1].get_free_blocks_call_count;
        let mut total_age: i64 = 0;
        let mut count: i64 = 0;
        for s in self.pools[1].streams.values() {
            for i in s.blocks.values() {
                if !self.is_split(i) {
                    total_age += calls - self.blocks[i as usize].gc_count_base;
                    count += 1;
                }
            }
        }
        if count == 0 {
            return;
        }
        let mut reclaimed = 0u64;
        let mut freed = true;
        while reclaimed < target && freed && count > 0 {
            let age_threshold = total_age as f64 / count as f64;
            freed = false;
            let all: Vec<u32> = self.pools[1].streams.values().flat_map(|s| s.blocks.values()).collect();
            for i in all {
                let b = &self.blocks[i as usize];
                let age = calls - b.gc_count_base;
                if !self.is_split(i) && b.es == NIL && age as f64 >= age_threshold {
                    freed = true;
                    reclaimed += b.size;
                    total_age -= age;
                    count -= 1;
                    self.release_block(i);
                }
            }
        }
    }

    /// PyTorch's `free` (docs/design/pytorch-allocator.md §7): allocated stats drop now; the block becomes
    /// reusable now, or once the streams it was used on are done.
    #[inline]
    pub fn free(&mut self, id: BlockId) -> Result<(), AllocError> {
        let i = self.free_phase_one(id)?;
        if !self.blocks[i as usize].has_uses {
            self.free_block(i);
        } else if self.in_capture() {
            // A capture may still use the block: its free waits until no
            // capture is underway (`deferred_blocks`).
            self.blocks[i as usize].pending = true;
            self.deferred.push(i);
        } else {
            self.insert_events(i);
        }
        Ok(())
    }

    /// One event per stream the block was used on; the free completes when
    /// the last of them does.
    fn insert_events(&mut self, i: u32) {
        let uses = self.stream_uses.remove(&i).unwrap_or_default();
        let b = &mut self.blocks[i as usize];
        b.has_uses = false;
        b.pending = false;
        if uses.is_empty() {
            self.free_block(i);
            return;
        }
        b.event_count += uses.len() as u8;
        for s in uses {
            self.cuda_events.push_back((s, i));
        }
    }

    /// Frees a capture postponed: the stream uses recorded during a capture
    /// are dropped, the rest become events as usual.
    fn insert_events_deferred_until_no_capture(&mut self) {
        if self.deferred.is_empty() {
            return;
        }
        for i in std::mem::take(&mut self.deferred) {
            if let Some(during) = self.capture_uses.remove(&i) {
                if let Some(u) = self.stream_uses.get_mut(&i) {
                    u.retain(|s| !during.contains(s));
                }
            }
            self.insert_events(i);
        }
        self.capture_uses.clear();
    }

    /// The first phase of a free alone (`free_requested`); the block waits for
    /// `free_completed`. Replay uses this to follow a recorded trace.
    pub(crate) fn free_requested(&mut self, id: BlockId) -> Result<(), AllocError> {
        let i = self.free_phase_one(id)?;
        self.blocks[i as usize].pending = true;
        Ok(())
    }

    /// Completes a free started with `free_requested`.
    pub(crate) fn free_completed(&mut self, id: BlockId) -> Result<(), AllocError> {
        let b = self.get(id)?;
        if !b.pending {
            return Err(AllocError::NotPending(b.ptr));
        }
        self.free_block(id.idx);
        Ok(())
    }

    /// What `torch.cuda.memory._snapshot()` leaves in the trace while history
    /// is recorded: a `snapshot` entry whose size is the active bytes.
    pub fn record_snapshot(&mut self) {
        let active = self.stats.get(Kind::ActiveBytes, 0).current.max(0) as u64;
        self.emit(Event::new(Action::Snapshot, 0, active, 0));
    }

    /// `annotateMemory` (2.14+, `torch.cuda.memory._annotate_tensor`): an
    /// `annotate` trace entry for the block; memory does not change.
    pub fn annotate(&mut self, id: BlockId) -> Result<(), AllocError> {
        let b = self.get(id)?;
        if !b.allocated {
            return Err(AllocError::NotAllocated(b.ptr));
        }
        let e = Event::new(Action::Annotate, b.ptr, b.requested, b.stream);
        self.emit(e);
        Ok(())
    }

    /// `tensor.record_stream(s)`: the free waits for work queued on `s`.
    pub fn record_stream(&mut self, id: BlockId, stream: u64) -> Result<(), AllocError> {
        let b = self.get(id)?;
        if !b.allocated {
            return Err(AllocError::NotAllocated(b.ptr));
        }
        if stream != b.stream {
            let uses = self.stream_uses.entry(id.idx).or_default();
            if !uses.contains(&stream) {
                if uses.len() >= u8::MAX as usize {
                    return Err(AllocError::TooManyStreams);
                }
                uses.push(stream);
                if self.in_capture() {
                    self.capture_uses.entry(id.idx).or_default().push(stream);
                }
            }
            self.blocks[id.idx as usize].has_uses = true;
        }
        Ok(())
    }

    /// `process_events`: the simulated GPU has finished all queued work by the
    /// next allocation, so every recorded stream event completes.
    #[inline]
    pub(crate) fn process_events(&mut self) {
        if !self.in_capture() {
            self.insert_events_deferred_until_no_capture();
        }
        if !self.cuda_events.is_empty() && !self.events_pending {
            self.complete_stream_events();
        }
    }

    fn complete_stream_events(&mut self) {
        let all = std::mem::take(&mut self.cuda_events);
        self.complete(all);
    }

    /// Completes `events`. PyTorch walks its events stream by stream, in the
    /// slot order of a `ska::flat_hash_map` keyed by stream, each stream's
    /// queue first in, first out; the order of the frees decides which
    /// merges happen and so the `inactive_split` counts. The model takes
    /// that slot order for the streams' ids (docs/design/allocator.md, "Stream
    /// events"); a replay follows the trace's own order.
    fn complete(&mut self, events: VecDeque<(u64, u32)>) {
        let mut events: Vec<(u64, u32)> = events.into();
        let mut streams: Vec<u64> = events.iter().map(|e| e.0).collect();
        streams.sort_unstable();
        streams.dedup();
        // Fibonacci hashing of `c10::Stream::hash()` (device type CUDA in the
        // top byte, the low 48 bits of the id) into a table that keeps its
        // load under one half; at least 4 slots.
        let bits = (2 * streams.len()).next_power_of_two().max(4).trailing_zeros();
        let slot =
            |s: u64| ((1u64 << 56 | (s & ((1 << 48) - 1))).wrapping_mul(11_400_714_819_323_198_485)) >> (64 - bits);
        events.sort_by_key(|e| (slot(e.0), e.0));
        for (_, i) in events {
            let b = &mut self.blocks[i as usize];
            b.event_count -= 1;
            if b.event_count == 0 {
                self.free_block(i);
            }
        }
    }

    #[inline]
    fn free_phase_one(&mut self, id: BlockId) -> Result<u32, AllocError> {
        let b = self.get(id)?;
        if !b.allocated {
            return Err(AllocError::NotAllocated(b.ptr));
        }
        let i = id.idx;
        let (ptr, size, requested, stream, pool) = {
            let b = &mut self.blocks[i as usize];
            b.allocated = false;
            (b.ptr, b.size, b.requested, b.stream, b.pool)
        };
        let sp = stat_pool(pool);
        self.stats.decrease(Kind::Allocation, sp, 1);
        self.stats.decrease(Kind::AllocatedBytes, sp, size as i64);
        if size >= self.config.max_split_size {
            self.stats.oversize_allocations.decrease(1);
        }
        self.emit(Event::new(Action::FreeRequested, ptr, requested, stream));
        Ok(i)
    }

    /// `free_block` (docs/design/pytorch-allocator.md §7): merge with free neighbours and return to the pool.
    #[inline]
    fn free_block(&mut self, i: u32) {
        let (ptr, orig_size, req, stream, pool, es) = {
            let b = &mut self.blocks[i as usize];
            b.pending = false;
            (b.ptr, b.size, b.requested, b.stream, b.pool, b.es)
        };
        self.set_tag(i, 0);
        let mut net_n: i64 = 0;
        let mut net_bytes: i64 = 0;
        for cand in [self.blocks[i as usize].prev, self.blocks[i as usize].next] {
            let s = self.try_merge_blocks(i, cand);
            if s > 0 {
                net_n -= 1;
                net_bytes -= s as i64;
            }
        }
        self.pool_insert(i);
        if self.is_split(i) {
            net_n += 1;
            net_bytes += self.blocks[i as usize].size as i64;
        }
        let sp = stat_pool(pool);
        if es == NIL {
            self.stats.change(Kind::InactiveSplit, sp, net_n);
            self.stats.change(Kind::InactiveSplitBytes, sp, net_bytes);
        }
        self.stats.decrease(Kind::Active, sp, 1);
        self.stats.decrease(Kind::ActiveBytes, sp, orig_size as i64);
        self.stats.decrease(Kind::RequestedBytes, sp, req as i64);
        self.emit(Event::new(Action::FreeCompleted, ptr, req, stream));
    }

    /// Absorbs `src` into `dst` when `src` is free, settled and mapped alike.
    #[inline]
    fn try_merge_blocks(&mut self, dst: u32, src: u32) -> u64 {
        if src == NIL {
            return 0;
        }
        {
            let s = &self.blocks[src as usize];
            let d = &self.blocks[dst as usize];
            if s.allocated || s.pending || s.event_count > 0 || d.mapped != s.mapped {
                return 0;
            }
        }
        if self.blocks[src as usize].mapped {
            self.pool_remove(src);
        } else {
            self.unmapped_remove(src);
        }
        let (sptr, ssize, sprev, snext) = {
            let s = &self.blocks[src as usize];
            (s.ptr, s.size, s.prev, s.next)
        };
        if self.blocks[dst as usize].prev == src {
            let d = &mut self.blocks[dst as usize];
            d.ptr = sptr;
            d.prev = sprev;
            if sprev != NIL {
                self.blocks[sprev as usize].next = dst;
            }
        } else {
            let d = &mut self.blocks[dst as usize];
            d.next = snext;
            if snext != NIL {
                self.blocks[snext as usize].prev = dst;
            }
        }
        self.blocks[dst as usize].size += ssize;
        self.delete_block(src);
        ssize
    }

    // ---- expandable segments (docs/design/pytorch-allocator.md §9)

    fn allocatable(&self, i: u32) -> bool {
        if i == NIL {
            return false;
        }
        let b = &self.blocks[i as usize];
        !b.allocated && !b.pending && b.event_count == 0
    }

    fn find_expandable_block(&mut self, pool: u16, size: u64, stream: u64) -> Option<u32> {
        let p = &self.pools[pool as usize];
        let page = self.config.page_size(is_small(pool));
        let total = self.device.total_memory();
        let mut va = reservation_size(total, page);
        // 2.15's `expandable_segments_reserve`: each segment spans only the
        // reserve, another opens when one is full, and a request above it
        // fails in the new segment it opened, as in PyTorch.
        if let Some(r) = self.config.expandable_segments_reserve.filter(|_| self.release.has_expandable_reserve()) {
            va = r.bytes(total).div_ceil(page).max(1).saturating_mul(page);
            if size > va {
                self.over_reserve = Some(r.bytes(total));
                // PyTorch reserves the new segment's range, finds the request
                // larger, and drops it unmapped.
                if let Ok(base) = self.device.reserve(va, page, self.emitted) {
                    self.device.release_reservation(base, va);
                }
                return None;
            }
        }
        // Every segment spans `va`: a request larger than that fits none, so
        // PyTorch's scan of them all finds nothing. Skipping it keeps a run
        // of such OOMs (each leaves a reservation behind, as PyTorch's do)
        // linear (docs/design/allocator.md, "Expandable segments").
        if let Some(s) = p.find(stream).filter(|_| size <= va) {
            for &u in s.unmapped.values() {
                let prev = self.blocks[u as usize].prev;
                let c = if self.allocatable(prev) { prev } else { u };
                let mut n = 0u64;
                let mut b = c;
                while n < size && self.allocatable(b) {
                    n += self.blocks[b as usize].size;
                    b = self.blocks[b as usize].next;
                }
                if n >= size {
                    return Some(c);
                }
            }
        }
        let base = self.device.reserve(va, page, self.emitted).ok()?;
        self.es.push(Some(ExpandableSegment { base, size: va, page }));
        let es = (self.es.len() - 1) as u32;
        let tie = self.segment_tie();
        let c = self.new_block(stream, va, base, pool, es, tie);
        self.blocks[c as usize].mapped = false;
        self.unmapped_insert(c);
        Some(c)
    }

    fn es_of(&self, i: u32) -> (u64, u64) {
        let es = self.blocks[i as usize].es;
        match self.es.get(es as usize) {
            Some(Some(s)) => (s.base, s.page),
            _ => unreachable!("expandable block without its segment"),
        }
    }

    fn map_block(&mut self, i: u32, size: u64) -> bool {
        let (base, page) = self.es_of(i);
        let (ptr, bsize, stream, pool, es) = {
            let b = &self.blocks[i as usize];
            (b.ptr, b.size, b.stream, b.pool, b.es)
        };
        let off = ptr - base;
        let begin = off / page;
        let end = (off + size).div_ceil(page);
        let msize = (end - begin) * page;
        if msize == 0 {
            return true;
        }
        let maddr = base + begin * page;
        if self.device.map(maddr, msize, page, self.emitted).is_err() {
            return false;
        }
        self.unmapped_remove(i);
        self.blocks[i as usize].mapped = true;
        if msize < bsize {
            let tie = self.piece_tie(i);
            let r = self.new_block(stream, bsize - msize, ptr + msize, pool, es, tie);
            let next = self.blocks[i as usize].next;
            {
                let rb = &mut self.blocks[r as usize];
                rb.mapped = false;
                rb.prev = i;
                rb.next = next;
            }
            if next != NIL {
                self.blocks[next as usize].prev = r;
            }
            self.blocks[i as usize].next = r;
            self.blocks[i as usize].size = msize;
            self.unmapped_insert(r);
        }
        let prev = self.blocks[i as usize].prev;
        self.try_merge_blocks(i, prev);
        let next = self.blocks[i as usize].next;
        self.try_merge_blocks(i, next);
        self.pool_insert(i);
        self.total_allocated_memory += msize;
        self.pool_state[(pool >> 1) as usize].cuda_malloc_count += 1;
        self.reserved_change(pool, msize as i64);
        self.stats.num_device_alloc += 1;
        self.emit(Event::new(Action::SegmentMap, maddr, msize, stream));
        true
    }

    fn try_allocate_expandable_block(&mut self, pool: u16, size: u64, stream: u64) -> Option<u32> {
        let mut c = self.find_expandable_block(pool, size, stream)?;
        if !self.blocks[c as usize].mapped {
            let csize = self.blocks[c as usize].size;
            if !self.map_block(c, csize.min(size)) {
                return None;
            }
        }
        while self.blocks[c as usize].size < size {
            let nc = self.blocks[c as usize].next;
            if nc == NIL || self.blocks[nc as usize].mapped {
                return None;
            }
            let want = (size - self.blocks[c as usize].size).min(self.blocks[nc as usize].size);
            if !self.map_block(nc, want) {
                return None;
            }
            c = nc;
        }
        self.pool_remove(c);
        Some(c)
    }

    fn unmap_block(&mut self, i: u32) {
        let (base, page) = self.es_of(i);
        let (ptr, bsize, stream, pool, es) = {
            let b = &self.blocks[i as usize];
            (b.ptr, b.size, b.stream, b.pool, b.es)
        };
        let off = ptr - base;
        let begin = off.div_ceil(page);
        let end = (off + bsize) / page;
        if begin >= end {
            return;
        }
        self.pool_remove(i);
        let uptr = base + begin * page;
        let usize_ = (end - begin) * page;
        let before = uptr - ptr;
        if before > 0 {
            let tie = self.piece_tie(i);
            let bf = self.new_block(stream, before, ptr, pool, es, tie);
            let prev = self.blocks[i as usize].prev;
            self.blocks[bf as usize].prev = prev;
            self.blocks[bf as usize].next = i;
            if prev != NIL {
                self.blocks[prev as usize].next = bf;
            }
            self.blocks[i as usize].prev = bf;
            self.pool_insert(bf);
        }
        let after = bsize - (before + usize_);
        if after > 0 {
            let tie = self.piece_tie(i);
            let af = self.new_block(stream, after, uptr + usize_, pool, es, tie);
            let next = self.blocks[i as usize].next;
            self.blocks[af as usize].prev = i;
            self.blocks[af as usize].next = next;
            if next != NIL {
                self.blocks[next as usize].prev = af;
            }
            self.blocks[i as usize].next = af;
            self.pool_insert(af);
        }
        {
            let b = &mut self.blocks[i as usize];
            b.ptr = uptr;
            b.size = usize_;
            b.mapped = false;
        }
        let prev = self.blocks[i as usize].prev;
        self.try_merge_blocks(i, prev);
        let next = self.blocks[i as usize].next;
        self.try_merge_blocks(i, next);
        self.unmapped_insert(i);
        self.device.unmap(uptr, usize_, page);
        self.pool_state[(pool >> 1) as usize].cuda_malloc_count -= 1;
        self.total_allocated_memory -= usize_;
        self.reserved_change(pool, -(usize_ as i64));
        self.stats.num_device_free += 1;
        self.emit(Event::new(Action::SegmentUnmap, uptr, usize_, stream));
    }

    // ---- snapshot and checks

    fn block_state(b: &Block) -> BlockState {
        if b.allocated {
            BlockState::ActiveAllocated
        } else if b.pending || b.event_count > 0 {
            BlockState::ActivePendingFree
        } else {
            BlockState::Inactive
        }
    }

    /// `torch.cuda.memory_snapshot()`: segments (one per contiguous mapped
    /// range for expandable segments) with their blocks, by address.
    pub fn snapshot(&self) -> Vec<SegmentInfo> {
        let mut segs = Vec::new();
        for (head, b) in (0u32..).zip(self.blocks.iter()) {
            if !b.alive || !b.mapped || (b.prev != NIL && self.blocks[b.prev as usize].mapped) {
                continue;
            }
            let mut seg = SegmentInfo {
                device: self.device_index,
                address: b.ptr,
                total_size: 0,
                allocated_size: 0,
                active_size: 0,
                requested_size: 0,
                stream: b.stream,
                segment_type: if is_small(b.pool) { "small" } else { "large" },
                is_expandable: b.es != NIL,
                pool: self.pool_state[(b.pool >> 1) as usize].id,
                private: b.pool >> 1 != 0,
                blocks: Vec::new(),
            };
            let mut idx = head;
            let mut cur = b;
            loop {
                let state = Self::block_state(cur);
                seg.total_size += cur.size;
                if cur.allocated {
                    seg.allocated_size += cur.size;
                }
                if state != BlockState::Inactive {
                    seg.active_size += cur.size;
                    seg.requested_size += cur.requested;
                }
                seg.blocks.push(BlockInfo {
                    address: cur.ptr,
                    size: cur.size,
                    requested_size: cur.requested,
                    state,
                    tag: self.tags.get(idx as usize).copied().unwrap_or(0),
                });
                if cur.next == NIL || !self.blocks[cur.next as usize].mapped {
                    break;
                }
                idx = cur.next;
                cur = &self.blocks[idx as usize];
            }
            segs.push(seg);
        }
        segs.sort_by_key(|s| s.address);
        segs
    }

    /// Installs a segment that was obtained before the events being replayed
    /// (a trace whose ring buffer wrapped). Stats account for it as if it had
    /// been allocated now; no trace event is emitted. Returns the handles of
    /// its live blocks by address. Blocks must lie inside the segment, in
    /// address order, without overlap.
    pub(crate) fn seed_segment(&mut self, seg: &SeedSegment) -> Result<Vec<(u64, BlockId)>, String> {
        if seg.expandable && !seg.mapped.is_empty() {
            return self.seed_expandable(seg);
        }
        let slot = match self.pool_slot(seg.pool) {
            Some(s) => s,
            None => self.create_pool(Some(seg.pool)).map_err(|e| e.to_string())?,
        };
        let pool: u16 = slot.0 * 2 + u16::from(!seg.small);
        self.pool_state[slot.index()].cuda_malloc_count += 1;
        let sp = stat_pool(pool);
        let mut at = seg.address;
        let end = seg.address.checked_add(seg.size).ok_or("segment wraps the address space")?;
        for b in &seg.blocks {
            if b.address < at || b.size == 0 || b.address.checked_add(b.size).is_none_or(|e| e > end) {
                return Err(format!(
                    "block {:#x}+{} does not fit segment {:#x}+{}",
                    b.address, b.size, seg.address, seg.size
                ));
            }
            at = b.address + b.size;
        }
        self.total_allocated_memory += seg.size;
        // Expandable segments are mapped page by page: PyTorch counts them
        // in no segment statistic (docs/design/allocator.md), only in reserved bytes.
        if !seg.expandable {
            self.stats.increase(Kind::Segment, sp, 1);
            if seg.size >= self.config.max_split_size {
                self.stats.oversize_segments.increase(1);
            }
        }
        self.reserved_change(pool, seg.size as i64);
        // Pieces in address order: free gaps and live blocks.
        let mut pieces: Vec<(u64, u64, Option<&SeedBlock>)> = Vec::new();
        let mut at = seg.address;
        for b in &seg.blocks {
            if b.address > at {
                pieces.push((at, b.address - at, None));
            }
            pieces.push((b.address, b.size, Some(b)));
            at = b.address + b.size;
        }
        if at < end {
            pieces.push((at, end - at, None));
        }
        let split = pieces.len() > 1;
        let mut prev = NIL;
        let mut out = Vec::new();
        for (addr, size, live) in pieces {
            // Seeded segments rank in the order they are seeded; their real
            // age is not in the recording (docs/user/replay.md, "Releases").
            let tie = if prev == NIL { self.segment_tie() } else { self.piece_tie(prev) };
            let i = self.new_block(seg.stream, size, addr, pool, NIL, tie);
            self.blocks[i as usize].prev = prev;
            if prev != NIL {
                self.blocks[prev as usize].next = i;
            }
            prev = i;
            match live {
                Some(b) => out.push((addr, self.seed_live(i, b))),
                None => {
                    self.pool_insert(i);
                    if split && !seg.expandable {
                        self.stats.increase(Kind::InactiveSplit, sp, 1);
                        self.stats.increase(Kind::InactiveSplitBytes, sp, size as i64);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Makes block `i` the live (or pending-free) block `b` of a seeded
    /// segment, counted as an allocation made before the trace.
    fn seed_live(&mut self, i: u32, b: &SeedBlock) -> BlockId {
        let sp = stat_pool(self.blocks[i as usize].pool);
        let size = self.blocks[i as usize].size;
        let blk = &mut self.blocks[i as usize];
        blk.requested = b.requested;
        blk.allocated = !b.pending;
        blk.pending = b.pending;
        if !b.pending {
            self.stats.increase(Kind::Allocation, sp, 1);
            self.stats.increase(Kind::AllocatedBytes, sp, size as i64);
            if size >= self.config.max_split_size {
                self.stats.oversize_allocations.increase(1);
            }
        }
        self.stats.increase(Kind::Active, sp, 1);
        self.stats.increase(Kind::ActiveBytes, sp, size as i64);
        self.stats.increase(Kind::RequestedBytes, sp, b.requested as i64);
        BlockId { idx: i, gen: self.blocks[i as usize].gen }
    }

    /// Installs a whole expandable segment obtained before the events being
    /// replayed: its reservation, its mapped ranges (free space and the live
    /// blocks in them) and the unmapped rest, as `find_expandable_block` and
    /// `map_block` would have left them. Stats count the mapped bytes as
    /// reserved and, as for any expandable segment, no segment or
    /// inactive_split. Returns the live blocks' handles by address.
    fn seed_expandable(&mut self, seg: &SeedSegment) -> Result<Vec<(u64, BlockId)>, String> {
        let slot = match self.pool_slot(seg.pool) {
            Some(s) => s,
            None => self.create_pool(Some(seg.pool)).map_err(|e| e.to_string())?,
        };
        let pool: u16 = slot.0 * 2 + u16::from(!seg.small);
        let page = self.config.page_size(seg.small);
        let end = seg.address.checked_add(seg.size).ok_or("segment wraps the address space")?;
        // Mapped ranges page-aligned, in order, apart, inside the reservation;
        // each live block inside one of them.
        let mut at = seg.address;
        for &(a, n) in &seg.mapped {
            if (a - seg.address.min(a)) % page != 0
                || n % page != 0
                || n == 0
                || a < at
                || (a == at && at != seg.address)
                || a.checked_add(n).is_none_or(|e| e > end)
            {
                return Err(format!(
                    "mapped range {a:#x}+{n} of expandable segment {:#x} is not page-aligned, in order and apart",
                    seg.address
                ));
            }
            at = a + n;
        }
        let mut last = seg.address;
        for b in &seg.blocks {
            // The ranges were checked above: `a + n` cannot wrap.
            let inside = seg
                .mapped
                .iter()
                .any(|&(a, n)| b.address >= a && b.address.checked_add(b.size).is_some_and(|e| e <= a + n));
            if b.address < last || b.size == 0 || !inside {
                return Err(format!(
                    "block {:#x}+{} lies in no mapped range of expandable segment {:#x}",
                    b.address, b.size, seg.address
                ));
            }
            last = b.address + b.size;
        }
        self.es.push(Some(ExpandableSegment { base: seg.address, size: seg.size, page }));
        let es = (self.es.len() - 1) as u32;
        self.pool_state[slot.index()].cuda_malloc_count += 1;
        // Pieces in address order: (address, size, mapped, live block).
        let mut pieces: Vec<(u64, u64, bool, Option<&SeedBlock>)> = Vec::new();
        let mut at = seg.address;
        let mut blocks = seg.blocks.iter().peekable();
        for &(a, n) in &seg.mapped {
            if a > at {
                pieces.push((at, a - at, false, None));
            }
            let mut p = a;
            while let Some(b) = blocks.next_if(|b| b.address < a + n) {
                if b.address > p {
                    pieces.push((p, b.address - p, true, None));
                }
                pieces.push((b.address, b.size, true, Some(b)));
                p = b.address + b.size;
            }
            if p < a + n {
                pieces.push((p, a + n - p, true, None));
            }
            at = a + n;
            self.total_allocated_memory += n;
            self.reserved_change(pool, n as i64);
        }
        if at < end {
            pieces.push((at, end - at, false, None));
        }
        let mut prev = NIL;
        let mut out = Vec::new();
        for (addr, size, mapped, live) in pieces {
            let tie = if prev == NIL { self.segment_tie() } else { self.piece_tie(prev) };
            let i = self.new_block(seg.stream, size, addr, pool, es, tie);
            self.blocks[i as usize].prev = prev;
            self.blocks[i as usize].mapped = mapped;
            if prev != NIL {
                self.blocks[prev as usize].next = i;
            }
            prev = i;
            match live {
                Some(b) => out.push((addr, self.seed_live(i, b))),
                None if mapped => self.pool_insert(i),
                None => self.unmapped_insert(i),
            }
        }
        Ok(out)
    }

    /// Checks every structural and accounting invariant; used by tests.
    #[allow(clippy::too_many_lines, reason = "the allocator port: one check per invariant, in PyTorch's order")]
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut in_pool = vec![false; self.blocks.len()];
        for (pi, p) in self.pools.iter().enumerate() {
            for s in p.streams.values() {
                for (size, _, ptr, i) in s.blocks.iter() {
                    let b = &self.blocks[i as usize];
                    if !b.alive || b.allocated || !b.mapped || b.pending || b.event_count > 0 {
                        return Err(format!("pool holds a block that is not free and mapped: {b:?}"));
                    }
                    if (size, ptr) != (b.size, b.ptr) || b.stream != s.stream || b.pool as usize != pi {
                        return Err(format!("pool key out of date for {b:?}"));
                    }
                    in_pool[i as usize] = true;
                }
                for (&ptr, &i) in s.unmapped.iter() {
                    let b = &self.blocks[i as usize];
                    if !b.alive || b.mapped || b.ptr != ptr || b.es == NIL {
                        return Err(format!("unmapped set holds a bad block: {b:?}"));
                    }
                }
            }
        }
        let (mut allocated, mut active, mut requested, mut reserved) = ([0i64; 3], [0i64; 3], [0i64; 3], [0i64; 3]);
        let (mut n_alloc, mut n_active, mut n_seg, mut n_split, mut split_bytes) =
            ([0i64; 3], [0i64; 3], [0i64; 3], [0i64; 3], [0i64; 3]);
        for (i, b) in self.blocks.iter().enumerate() {
            if !b.alive {
                continue;
            }
            let sp = stat_pool(b.pool);
            if b.prev != NIL {
                let p = &self.blocks[b.prev as usize];
                if !p.alive || p.next != i as u32 || p.ptr + p.size != b.ptr {
                    return Err(format!("block {b:?} does not tile with its predecessor {p:?}"));
                }
                let free = |x: &Block| Self::block_state(x) == BlockState::Inactive;
                if b.mapped && p.mapped && free(b) && free(p) {
                    return Err(format!("adjacent free blocks not merged: {p:?} {b:?}"));
                }
                if !b.mapped && !p.mapped {
                    return Err(format!("adjacent unmapped ranges not merged: {p:?} {b:?}"));
                }
            } else if b.es == NIL && b.mapped {
                n_seg[sp] += 1;
            }
            if b.next != NIL && self.blocks[b.next as usize].prev != i as u32 {
                return Err(format!("broken next link at {b:?}"));
            }
            if !b.mapped {
                continue;
            }
            reserved[sp] += b.size as i64;
            let state = Self::block_state(b);
            if b.allocated {
                allocated[sp] += b.size as i64;
                n_alloc[sp] += 1;
            }
            if state != BlockState::Inactive {
                active[sp] += b.size as i64;
                n_active[sp] += 1;
                requested[sp] += b.requested as i64;
            } else {
                if !in_pool[i] {
                    return Err(format!("free block missing from its pool: {b:?}"));
                }
                if b.es == NIL && (b.prev != NIL || b.next != NIL) {
                    n_split[sp] += 1;
                    split_bytes[sp] += b.size as i64;
                }
            }
        }
        let check = |name: &str, kind: Kind, want: [i64; 3]| -> Result<(), String> {
            for (pool, w) in [(SMALL_POOL, want[SMALL_POOL]), (LARGE_POOL, want[LARGE_POOL])] {
                let got = self.stats.get(kind, pool).current;
                if got != w {
                    return Err(format!("{name} pool {pool}: stat {got} != recomputed {w}"));
                }
            }
            let all = self.stats.get(kind, 0).current;
            if all != want[SMALL_POOL] + want[LARGE_POOL] {
                return Err(format!("{name}.all {all} != sum of pools"));
            }
            Ok(())
        };
        check("allocated_bytes", Kind::AllocatedBytes, allocated)?;
        check("allocation", Kind::Allocation, n_alloc)?;
        check("active_bytes", Kind::ActiveBytes, active)?;
        check("active", Kind::Active, n_active)?;
        check("requested_bytes", Kind::RequestedBytes, requested)?;
        check("reserved_bytes", Kind::ReservedBytes, reserved)?;
        check("segment", Kind::Segment, n_seg)?;
        check("inactive_split", Kind::InactiveSplit, n_split)?;
        check("inactive_split_bytes", Kind::InactiveSplitBytes, split_bytes)?;
        if self.total_allocated_memory as i64 != self.stats.get(Kind::ReservedBytes, 0).current {
            return Err("total_allocated_memory != reserved_bytes.all.current".into());
        }
        let s = &self.stats;
        for k in [Kind::AllocatedBytes, Kind::ActiveBytes, Kind::ReservedBytes] {
            if s.get(k, 0).current > s.get(k, 0).peak {
                return Err(format!("{k:?} current above peak"));
            }
        }
        let (al, ac, re) = (
            s.get(Kind::AllocatedBytes, 0).current,
            s.get(Kind::ActiveBytes, 0).current,
            s.get(Kind::ReservedBytes, 0).current,
        );
        if !(al <= ac && ac <= re) {
            return Err(format!("allocated {al} <= active {ac} <= reserved {re} does not hold"));
        }
        Ok(())
    }
}
