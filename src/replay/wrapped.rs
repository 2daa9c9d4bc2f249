//! Traces whose ring buffer wrapped (`_record_memory_history(max_entries=…)`)
//! start mid-run: their first events free addresses the trace never
//! allocated. The state at the first event is rebuilt backwards from the
//! snapshot's final segments (docs/design/pytorch-allocator.md §15.1): segments are the final ones with
//! the window's segment events undone; live blocks are those the window frees
//! without allocating, and those alive at the end that the window never
//! allocated. Peaks and counters then cover the window only.
//!
//! A block known only from its free has a known requested size but not its
//! block size: large-pool blocks are handed out whole when at most 1 MiB
//! would remain. Such a block gets a short list of sizes PyTorch could have
//! given it (the rounded size, sizes the final snapshot shows for the same
//! requested size, the rounded size widened to a following gap of at most
//! 1 MiB); `replay_wrapped` lets the replay choose among them.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::alloc::config::{K_MIN_BLOCK_SIZE, K_SMALL_BUFFER, K_SMALL_SIZE};
use crate::alloc::{Action, AllocatorConfig, BlockState, EventsRef, SeedBlock, SeedSegment};
use crate::analysis::spans::Spans;
use crate::trace::pickle::FastHash;
use crate::trace::DeviceTrace;

/// Whether the trace can be replayed from an empty allocator.
pub fn starts_empty(dev: &DeviceTrace) -> bool {
    starts_empty_in(dev, Spans::of_cores())
}

/// `starts_empty`, its events cut into `sp`'s spans: each says, per
/// address, what it leaves there from either state it may find it in (held
/// or not), or that a free there finds nothing; those are joined in order
/// (one pass took 0.1 s of a 10M trace after its decoding, most of it the
/// set of live addresses; see `Fate`).
fn starts_empty_in(dev: &DeviceTrace, sp: Spans) -> bool {
    let events = dev.events.view();
    let spans = sp.map(events.len(), |r| {
        // One lookup per event: the fast hasher, as the engine keys addresses.
        let mut blocks: HashMap<u64, Fate, FastHash> = HashMap::default();
        let mut segs: HashMap<u64, Fate, FastHash> = HashMap::default();
        for e in events.slice(r) {
            let (map, op): (_, fn(u8) -> u8) = match e.action {
                Action::Alloc => (&mut blocks, |_| HELD),
                Action::FreeRequested => (&mut blocks, |s| if s == HELD { HELD } else { PARTED }),
                Action::FreeCompleted => (&mut blocks, |s| if s == HELD { FREE } else { PARTED }),
                Action::SegmentAlloc => (&mut segs, |_| HELD),
                Action::SegmentFree => (&mut segs, |s| if s == HELD { FREE } else { PARTED }),
                _ => continue,
            };
            let f = map.entry(e.addr).or_insert(Fate::UNTOUCHED);
            f.0 = f.0.map(|s| if s == PARTED { PARTED } else { op(s) });
        }
        (blocks, segs)
    });
    let (mut live, mut segs): (HashSet<u64, FastHash>, HashSet<u64, FastHash>) = Default::default();
    for (b, s) in spans {
        for (fates, set) in [(b, &mut live), (s, &mut segs)] {
            for (addr, f) in fates {
                match f.0[usize::from(set.contains(&addr))] {
                    HELD => set.insert(addr),
                    FREE => set.remove(&addr),
                    _ => return false,
                };
            }
        }
    }
    let has_segment_events = dev.has_segment_events();
    dev.segments.iter().filter(|s| !s.is_expandable).all(|s| {
        (!has_segment_events || segs.contains(&s.address))
            && s.blocks.iter().filter(|b| b.state != BlockState::Inactive).all(|b| live.contains(&b.address))
    })
}

/// What a span of events leaves at one address, found free (`.0[0]`) or
/// held (`.0[1]`): `FREE`, `HELD`, or `PARTED` where a free there finds
/// nothing held.
#[derive(Debug, Clone, Copy)]
struct Fate([u8; 2]);

const FREE: u8 = 0;
const HELD: u8 = 1;
const PARTED: u8 = 2;

impl Fate {
    const UNTOUCHED: Fate = Fate([FREE, HELD]);
}

/// A live block whose size is a guess, and the other sizes it could have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guess {
    pub(crate) segment: usize,
    pub(crate) block: usize,
    /// The request rounded: the smallest size the block can have.
    pub(crate) rounded: u64,
    pub(crate) options: Vec<u64>,
}

/// The segments and live blocks at the trace's first event, and the blocks
/// whose size is a guess.
pub fn reconstruct(
    dev: &DeviceTrace,
    config: &AllocatorConfig,
    device_total: u64,
) -> Result<(Vec<SeedSegment>, Vec<Guess>), String> {
    let mut out = segments_at_start(dev);
    for es in expandable_at_start(dev, config, device_total) {
        out.insert(es.address, es);
    }
    let initial = live_at_start(dev, config);
    place_blocks(out, dev, config, &initial)
}

/// The plain segments at the window's start, by address: the final ones
/// with the window's segment events undone from the end backwards.
fn segments_at_start(dev: &DeviceTrace) -> BTreeMap<u64, SeedSegment> {
    let pool_of: HashMap<u64, (u64, u64)> = dev.segments.iter().map(|s| (s.address, s.pool)).collect();
    let mut segs: BTreeMap<u64, (u64, u64, bool)> = dev
        .segments
        .iter()
        .filter(|s| !s.is_expandable)
        .map(|s| (s.address, (s.total_size, s.stream, s.small)))
        .collect();
    for e in dev.events.iter().rev() {
        match e.action {
            Action::SegmentAlloc => {
                segs.remove(&e.addr);
            }
            Action::SegmentFree => {
                segs.insert(e.addr, (e.size, e.stream, e.size == K_SMALL_BUFFER));
            }
            _ => {}
        }
    }

    segs.iter()
        .map(|(&address, &(size, stream, small))| {
            let pool = pool_of.get(&address).copied().unwrap_or((0, 0));
            let seg = SeedSegment {
                address,
                size,
                stream,
                small,
                pool,
                blocks: Vec::new(),
                expandable: false,
                mapped: Vec::new(),
            };
            (address, seg)
        })
        .collect()
}

/// A live block at the window's start: its size, requested size, whether
/// its free was requested before the window, and whether the size is
/// known (the final snapshot has it) rather than the request rounded.
type Initial = (u64, u64, bool, bool);

/// The blocks live at the window's start, by address: those the window
/// frees without allocating, and those alive at the end it never allocated.
fn live_at_start(dev: &DeviceTrace, config: &AllocatorConfig) -> HashMap<u64, Initial> {
    let mut initial: HashMap<u64, Initial> = HashMap::new();
    let mut live: HashSet<u64, FastHash> = HashSet::default();
    let mut allocated_in_window: HashSet<u64, FastHash> = HashSet::default();
    for e in dev.events.view() {
        match e.action {
            Action::Alloc => {
                live.insert(e.addr);
                allocated_in_window.insert(e.addr);
            }
            Action::FreeRequested if !live.contains(&e.addr) && !initial.contains_key(&e.addr) => {
                initial.insert(e.addr, (config.round_size(e.size), e.size, false, false));
            }
            // Freed before the window, completed in it.
            Action::FreeCompleted if !live.remove(&e.addr) && !initial.contains_key(&e.addr) => {
                initial.insert(e.addr, (config.round_size(e.size), e.size, true, false));
            }
            _ => {}
        }
    }
    for s in &dev.segments {
        for b in s.blocks.iter().filter(|b| b.state != BlockState::Inactive) {
            if !allocated_in_window.contains(&b.address) && !initial.contains_key(&b.address) {
                let pending = b.state == BlockState::ActivePendingFree;
                initial.insert(b.address, (b.size, b.requested_size, pending, true));
            }
        }
    }
    initial
}

/// Puts the live blocks into their segments and lists the sizes that are
/// guesses, with the other sizes each could have.
fn place_blocks(
    mut out: BTreeMap<u64, SeedSegment>,
    dev: &DeviceTrace,
    config: &AllocatorConfig,
    initial: &HashMap<u64, Initial>,
) -> Result<(Vec<SeedSegment>, Vec<Guess>), String> {
    // Block sizes the final snapshot shows for each requested size.
    let mut seen_sizes: HashMap<u64, Vec<u64>> = HashMap::new();
    for b in dev.segments.iter().flat_map(|s| &s.blocks).filter(|b| b.state != BlockState::Inactive) {
        let v = seen_sizes.entry(b.requested_size).or_default();
        if !v.contains(&b.size) {
            v.push(b.size);
        }
    }
    let mut guesses = Vec::new();
    let mut exact: HashSet<u64> = HashSet::new();
    for (&addr, &(size, requested, pending, is_exact)) in initial {
        let seg = out
            .range_mut(..=addr)
            .next_back()
            .map(|(_, s)| s)
            .filter(|s| addr < s.address + s.size && mapped_end(s, addr).is_some())
            .ok_or_else(|| format!("a block live before the trace's window, at {addr:#x}, lies in no known segment"))?;
        seg.blocks.push(SeedBlock { address: addr, size, requested, pending });
        if is_exact {
            exact.insert(addr);
        }
    }
    for seg in out.values_mut() {
        seg.blocks.sort_by_key(|b| b.address);
    }
    // Sizes known with confidence (from the snapshot, or a gap of at most
    // 1 MiB that must have been taken whole) show how this program's
    // allocator carved each requested size: offer them to the guesses too.
    // With expandable_segments every large block is split when 512 bytes
    // or more would remain (docs/design/pytorch-allocator.md §6.2): none is handed
    // out whole with room to spare.
    let slack = if config.expandable_segments { K_MIN_BLOCK_SIZE - 1 } else { K_SMALL_SIZE };
    for seg in out.values().filter(|s| !s.small) {
        for (i, b) in seg.blocks.iter().enumerate() {
            let bound = bound(seg, i);
            let room = bound.saturating_sub(b.address);
            let confident = if exact.contains(&b.address) {
                Some(b.size)
            } else {
                (room >= b.size && room - b.size <= slack).then_some(room)
            };
            if let Some(size) = confident {
                let v = seen_sizes.entry(b.requested).or_default();
                if !v.contains(&size) {
                    v.push(size);
                }
            }
        }
    }
    for (si, seg) in out.values_mut().enumerate() {
        for i in 0..seg.blocks.len() {
            let bound = bound(seg, i);
            let b = &mut seg.blocks[i];
            if b.address.checked_add(b.size).is_none_or(|e| e > bound) {
                return Err(format!("blocks live before the trace's window overlap at {:#x}", b.address));
            }
            // Large-pool blocks are handed out whole when at most 1 MiB would
            // remain, or when oversize: a block known only from its free
            // takes such a gap.
            if exact.contains(&b.address) || seg.small {
                continue;
            }
            let rounded = b.size;
            let room = bound - b.address;
            let whole_ok = |s: u64| {
                s >= rounded
                    && s <= room
                    && (s - rounded <= slack || !config.expandable_segments && rounded >= config.max_split_size)
            };
            let mut options = vec![rounded];
            for &s in seen_sizes.get(&b.requested).into_iter().flatten() {
                if whole_ok(s) && !options.contains(&s) {
                    options.push(s);
                }
            }
            if whole_ok(room) && !options.contains(&room) {
                options.push(room);
            }
            // First choice: a gap of at most 1 MiB was taken whole, else the
            // rounded size; the others are for the replay to try.
            b.size = if whole_ok(room) { room } else { rounded };
            options.retain(|&s| s != b.size);
            guesses.push(Guess { segment: si, block: i, rounded, options });
        }
    }
    Ok((out.into_values().collect(), guesses))
}

/// Where block `i` of `seg` must end by: the next block, else the end of
/// its segment (of an expandable segment, of the mapped range it is in).
fn bound(seg: &SeedSegment, i: usize) -> u64 {
    let b = &seg.blocks[i];
    let end = mapped_end(seg, b.address).unwrap_or(b.address.saturating_add(b.size));
    seg.blocks.get(i + 1).map(|n| n.address.min(end)).unwrap_or(end)
}

/// The end of the mapped memory `addr` lies in: the segment's end, or for
/// a whole expandable segment the end of its mapped range holding `addr`
/// (none where `addr` is unmapped).
fn mapped_end(seg: &SeedSegment, addr: u64) -> Option<u64> {
    if seg.mapped.is_empty() {
        return Some(seg.address.saturating_add(seg.size));
    }
    seg.mapped.iter().find(|&&(a, n)| addr >= a && addr < a.saturating_add(n)).map(|&(a, n)| a.saturating_add(n))
}

/// Adds `[a, a + n)` to a set of disjoint ranges (start → end).
fn add_range(set: &mut BTreeMap<u64, u64>, a: u64, n: u64) {
    // Sizes come from the input: an end past the address space is clipped.
    let (mut lo, mut hi) = (a, a.saturating_add(n));
    let touching: Vec<(u64, u64)> = set.range(..=hi).filter(|&(_, &e)| e >= lo).map(|(&s, &e)| (s, e)).collect();
    for (s, e) in touching {
        set.remove(&s);
        lo = lo.min(s);
        hi = hi.max(e);
    }
    set.insert(lo, hi);
}

/// Removes `[a, a + n)` from a set of disjoint ranges.
fn remove_range(set: &mut BTreeMap<u64, u64>, a: u64, n: u64) {
    let (lo, hi) = (a, a.saturating_add(n));
    let over: Vec<(u64, u64)> = set.range(..hi).filter(|&(_, &e)| e > lo).map(|(&s, &e)| (s, e)).collect();
    for (s, e) in over {
        set.remove(&s);
        if s < lo {
            set.insert(s, lo);
        }
        if e > hi {
            set.insert(hi, e);
        }
    }
}

/// The expandable segments at the window's start (docs/user/replay.md "Windows of expandable
/// segments"). PyTorch keeps one reservation per pool, stream
/// and block size class, and maps it page by page; the snapshot lists each
/// run of mapped pages as a segment. A reservation's mapped pages at the
/// start are its final ones with the window's maps and unmaps undone, from
/// the end backwards; its base is the lowest page the trace shows of it
/// (pages lie at whole pages from the real base, which is all the model
/// needs of it). Reservations with no page mapped at the start are left out:
/// the replay reserves them at their first map, as PyTorch did.
fn expandable_at_start(dev: &DeviceTrace, config: &AllocatorConfig, device_total: u64) -> Vec<SeedSegment> {
    struct Reservation {
        pool: (u64, u64),
        stream: u64,
        small: bool,
        mapped: BTreeMap<u64, u64>,
        lo: u64,
        hi: u64,
    }
    let va = |small: bool| crate::alloc::reservation_size(device_total, config.page_size(small));
    let mut res: Vec<Reservation> = Vec::new();
    for s in dev.segments.iter().filter(|s| s.is_expandable) {
        let end = s.address.saturating_add(s.total_size);
        let r = match res.iter_mut().position(|r| (r.pool, r.stream, r.small) == (s.pool, s.stream, s.small)) {
            Some(i) => &mut res[i],
            None => {
                let mapped = BTreeMap::new();
                let r = Reservation { pool: s.pool, stream: s.stream, small: s.small, mapped, lo: s.address, hi: end };
                res.push(r);
                res.last_mut().expect("just pushed")
            }
        };
        add_range(&mut r.mapped, s.address, s.total_size);
        (r.lo, r.hi) = (r.lo.min(s.address), r.hi.max(end));
    }
    // Each map and unmap belongs to the reservation of its stream whose
    // pages it lies nearest (reservations are far apart: each spans more
    // than the device).
    let events = dev.events.iter().filter(|e| matches!(e.action, Action::SegmentMap | Action::SegmentUnmap));
    let mut owner = Vec::new();
    for e in events.clone() {
        let dist = |r: &Reservation| {
            if e.addr < r.lo {
                r.lo - e.addr
            } else {
                e.addr.saturating_sub(r.hi)
            }
        };
        let near = (0..res.len())
            .filter(|&i| res[i].stream == e.stream && dist(&res[i]) < va(res[i].small))
            .min_by_key(|&i| dist(&res[i]));
        let i = match near {
            Some(i) => i,
            None => {
                let large = config.page_size(false);
                let small = e.size % large != 0;
                let (lo, hi) = (e.addr, e.addr.saturating_add(e.size));
                res.push(Reservation { pool: (0, 0), stream: e.stream, small, mapped: BTreeMap::new(), lo, hi });
                res.len() - 1
            }
        };
        let r = &mut res[i];
        (r.lo, r.hi) = (r.lo.min(e.addr), r.hi.max(e.addr.saturating_add(e.size)));
        owner.push(i);
    }
    for (e, &i) in events.collect::<Vec<_>>().into_iter().zip(&owner).rev() {
        match e.action {
            Action::SegmentMap => remove_range(&mut res[i].mapped, e.addr, e.size),
            _ => add_range(&mut res[i].mapped, e.addr, e.size),
        }
    }
    res.into_iter()
        .filter(|r| !r.mapped.is_empty())
        .map(|r| {
            let size = va(r.small).max(r.hi - r.lo);
            SeedSegment {
                address: r.lo,
                size,
                stream: r.stream,
                small: r.small,
                pool: r.pool,
                blocks: Vec::new(),
                expandable: true,
                mapped: r.mapped.into_iter().map(|(a, e)| (a, e - a)).collect(),
            }
        })
        .collect()
}

/// Replays a wrapped trace from its reconstructed start. Where the replay
/// diverges, the guessed block sizes nearest the diverging address are tried
/// in turn (at most `max_tries` re-runs), keeping a change only when the
/// replay gets further.
pub fn replay_wrapped<'a>(
    rec: EventsRef<'a>,
    opts: &super::engine::ReplayOptions,
    dev: &DeviceTrace,
    max_tries: usize,
) -> Result<(super::engine::ReplayResult<'a>, Vec<SeedSegment>), String> {
    let (mut seed, guesses) = reconstruct(dev, &opts.config, opts.device_total)?;
    // The order segments are seeded in is their age (2.12+ break ties by
    // it; docs/design/pytorch-allocator.md, "Releases"), which the recording does
    // not hold for segments made before the window: address order first,
    // then what the window's ties show.
    let mut order: Vec<usize> = (0..seed.len()).collect();
    let ordered = |seed: &[SeedSegment], order: &[usize]| -> Vec<SeedSegment> {
        order.iter().map(|&i| seed[i].clone()).collect()
    };
    let mut best = super::engine::replay_events_from(rec, opts, &ordered(&seed, &order));
    let mut best_seed = ordered(&seed, &order);
    let mut tries = 0;
    let mut ties = 0;
    while let Some(d) = best.divergence.clone() {
        let target = d.expected.map(|e| e.addr).unwrap_or(0);
        // A tie between equal free blocks of two pre-window segments,
        // resolved the other way: the one the run took is the older.
        if opts.release.tie_break() != crate::alloc::TieBreak::Address && tries < max_tries {
            let at = |a: u64| order.iter().position(|&i| a >= seed[i].address && a - seed[i].address < seed[i].size);
            if let (Some(e), Some(g)) = (d.expected, d.got) {
                if let (Action::Alloc, Action::Alloc, Some(want), Some(took)) =
                    (e.action, g.action, at(e.addr), at(g.addr))
                {
                    if want > took {
                        tries += 1;
                        let mut o = order.clone();
                        let moved = o.remove(want);
                        o.insert(took, moved);
                        let r = super::engine::replay_events_from(rec, opts, &ordered(&seed, &o));
                        if r.divergence.as_ref().map(|x| x.event).unwrap_or(usize::MAX) > d.event {
                            order = o;
                            best = r;
                            best_seed = ordered(&seed, &order);
                            ties += 1;
                            continue;
                        }
                    }
                }
            }
        }
        let mut nearest: Vec<&Guess> = guesses.iter().collect();
        nearest.sort_by_key(|g| seed[g.segment].blocks[g.block].address.abs_diff(target));
        let mut improved = false;
        'search: for g in nearest {
            // The diverging allocation landed where a larger block would
            // have ended: that size is a candidate too.
            let b = seed[g.segment].blocks[g.block];
            let mut options = g.options.clone();
            if target > b.address && target - b.address >= g.rounded && target - b.address - g.rounded <= K_SMALL_SIZE {
                options.insert(0, target - b.address);
            }
            for &size in &options {
                if tries >= max_tries {
                    break 'search;
                }
                tries += 1;
                let old = seed[g.segment].blocks[g.block].size;
                if size == old {
                    continue;
                }
                seed[g.segment].blocks[g.block].size = size;
                let r = super::engine::replay_events_from(rec, opts, &ordered(&seed, &order));
                let further = r.divergence.as_ref().map(|x| x.event).unwrap_or(usize::MAX) > d.event;
                if further {
                    best = r;
                    best_seed = ordered(&seed, &order);
                    improved = true;
                    break 'search;
                }
                seed[g.segment].blocks[g.block].size = old;
            }
        }
        if !improved {
            break;
        }
    }
    best.ties_resolved = ties;
    Ok((best, best_seed))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `starts_empty` as one pass over the events states it.
    fn one_pass(dev: &DeviceTrace) -> bool {
        let (mut live, mut segs) = (HashSet::new(), HashSet::new());
        for e in dev.events.view() {
            let fine = match e.action {
                Action::Alloc => live.insert(e.addr) | true,
                Action::FreeRequested => live.contains(&e.addr),
                Action::FreeCompleted => live.remove(&e.addr),
                Action::SegmentAlloc => segs.insert(e.addr) | true,
                Action::SegmentFree => segs.remove(&e.addr),
                _ => true,
            };
            if !fine {
                return false;
            }
        }
        let seg_events = dev.has_segment_events();
        dev.segments.iter().filter(|s| !s.is_expandable).all(|s| {
            (!seg_events || segs.contains(&s.address))
                && s.blocks.iter().filter(|b| b.state != BlockState::Inactive).all(|b| live.contains(&b.address))
        })
    }

    /// However the events are cut into spans, whether a trace starts empty
    /// is what one pass says: every trace fixture's devices whole and cut at
    /// eleven points (windows of a longer run), in 1, 3 and 16 spans.
    #[test]
    fn spans_answer_as_one_pass() {
        let (mut empty, mut not) = (0, 0);
        for (path, t) in crate::trace::fixture_traces("traces") {
            for full in &t.devices {
                for k in 0..12 {
                    let mut dev = full.clone();
                    let cut = dev.events.len() * k / 12 + k;
                    if k > 0 && cut < dev.events.len() {
                        std::sync::Arc::make_mut(&mut dev.events).drain_front(cut);
                        let stacks = std::sync::Arc::make_mut(&mut dev.stacks);
                        stacks.drain(..cut.min(stacks.len()));
                    }
                    let want = one_pass(&dev);
                    for k in [1, 3, 16] {
                        let got = starts_empty_in(&dev, Spans::exactly(k));
                        assert_eq!(got, want, "{} cut at {cut}, {k} spans", path.display());
                    }
                    (empty, not) = if want { (empty + 1, not) } else { (empty, not + 1) };
                }
            }
        }
        assert!(empty >= 5 && not >= 50, "{empty} start empty, {not} do not");
    }
}
