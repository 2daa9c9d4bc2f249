//! Which pool each segment of a recording belonged to (docs/design/allocator.md,
//! "Inferring pools"). Snapshots of PyTorch 2.11 name the pool of the
//! segments alive at the end (`segment_pool_id`) but not the pool of a
//! trace entry. A block never leaves its segment's pool, so a request's pool
//! is the pool of the segment it landed in; only segments created and freed
//! inside the trace need a guess, which the release burst that freed them
//! gives:
//!
//! - `torch.cuda.empty_cache()` (frames through `empty_cache`, or no frames
//!   at all) releases the default large pool, the default small pool, then
//!   each freeable private pool's small and large segments, each run sorted
//!   by (stream, size, address). A run ends where the kind changes or that
//!   order stops increasing.
//! - A burst with frames but none of `empty_cache` and not inside a malloc
//!   is `~MemPool`'s `emptyCache(id)`: one private pool.
//! - A burst inside a malloc (the request right after it has the same
//!   frames) is that malloc's retry path: default pools.
//!
//! The guess is only a first choice: the replay checks it when the segment
//! is created (a pool with a free block that fits could not have needed a
//! new segment) and when it is released (`Stepper`).

use std::collections::HashMap;

use crate::alloc::config::K_SMALL_BUFFER;
use crate::alloc::{Action, EventsRef, MempoolId};
use crate::trace::{DeviceTrace, Frame};

/// A pool as the plan knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum PoolLabel {
    /// A pool whose id the snapshot records ((0,0) = the default pools).
    Known(MempoolId),
    /// A private pool whose id the recording does not carry, numbered in
    /// the order the plan met it.
    Anonymous(u32),
}

impl PoolLabel {
    pub const DEFAULT: PoolLabel = PoolLabel::Known((0, 0));
}

/// How a burst of segment releases that no malloc explains is replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BurstKind {
    /// `torch.cuda.empty_cache()`: the default pools, then the private pools
    /// listed (in the order their segments appear), made freeable first.
    EmptyCache(Vec<PoolLabel>),
    /// `emptyCache(id)` of one private pool (what `~MemPool` does).
    PoolOnly(PoolLabel),
}

/// The pools of one recording.
#[derive(Debug, Clone, Default)]
pub struct PoolPlan {
    /// First-choice pool of the segment each `segment_alloc`/`segment_map`
    /// (by recorded event index) creates.
    pub(crate) segment: HashMap<usize, PoolLabel>,
    /// Segments whose pool the snapshot records (event index of their
    /// `segment_alloc`): no other choice is tried.
    pub(crate) certain: std::collections::HashSet<usize>,
    /// Release bursts by the index of their first event.
    pub(crate) bursts: HashMap<usize, BurstKind>,
    /// Bursts whose frames say they are not inside a malloc (an
    /// `empty_cache` or `~MemPool`): no malloc's retry path explains them.
    pub(crate) framed: std::collections::HashSet<usize>,
    /// Where each burst ends (exclusive), by its first event.
    pub(crate) burst_end: HashMap<usize, usize>,
    /// Whether any private pool appears: without one, the replay is the
    /// default-pool replay it always was.
    pub any_private: bool,
    /// Anonymous pools the plan made.
    pub(crate) anonymous: u32,
}

impl PoolPlan {
    /// The first choice for the segment created at recorded event `i`.
    pub(crate) fn segment_at(&self, i: usize) -> PoolLabel {
        self.segment.get(&i).copied().unwrap_or(PoolLabel::DEFAULT)
    }
}

fn is_empty_cache(stack: &[Frame]) -> bool {
    stack.iter().any(|f| &*f.name == "empty_cache")
}

/// Segment lifetimes: the live segments at the end (address → index of
/// their `segment_alloc`), and each `segment_free`'s `segment_alloc`.
fn segment_lifetimes(ev: EventsRef<'_>) -> (HashMap<u64, usize>, HashMap<usize, usize>) {
    let mut live: HashMap<u64, usize> = HashMap::new();
    let mut freed_at: HashMap<usize, usize> = HashMap::new();
    for i in ev.segment_events() {
        let e = ev.at(i);
        match e.action {
            Action::SegmentAlloc => {
                live.insert(e.addr, i);
            }
            Action::SegmentFree => {
                if let Some(start) = live.remove(&e.addr) {
                    freed_at.insert(i, start);
                }
            }
            _ => {}
        }
    }
    (live, freed_at)
}

/// A release burst's passes (small or not, and their events): a new one
/// where the kind changes or (stream, size, tie) stops increasing.
fn passes(
    run: std::ops::Range<usize>,
    ev: EventsRef<'_>,
    freed_at: &HashMap<usize, usize>,
    by_age: bool,
) -> Vec<(bool, Vec<usize>)> {
    let mut passes: Vec<(bool, Vec<usize>)> = Vec::new();
    let key = |k: usize| {
        let e = ev.at(k);
        let age = if by_age { freed_at.get(&k).map_or(0, |&s| s + 1) } else { 0 };
        (e.stream, e.size, age, e.addr)
    };
    for k in run {
        let small = ev.at(k).size == K_SMALL_BUFFER;
        let continues = passes.last().is_some_and(|(s, ks)| {
            let p = *ks.last().unwrap_or(&k);
            *s == small && key(p) < key(k)
        });
        match passes.last_mut() {
            Some((_, ks)) if continues => ks.push(k),
            _ => passes.push((small, vec![k])),
        }
    }
    passes
}

/// Builds the plan of `dev`, whose stacks index `stacks` (1-based, 0 = none).
pub fn plan(dev: &DeviceTrace, stacks: &[Vec<Frame>], release: crate::alloc::Release) -> PoolPlan {
    // Equal-size segments of a pass go in address order up to 2.11, in
    // the order they were made from 2.12 (docs/design/pytorch-allocator.md,
    // "Releases"); one made before the trace ranks before all made in it.
    let by_age = release.tie_break() != crate::alloc::TieBreak::Address;
    let ev = dev.events.view();
    let mut out = PoolPlan::default();
    let (live, freed_at) = segment_lifetimes(ev);
    // Alive at the end: the snapshot's pool id.
    for s in &dev.segments {
        if let Some(&start) = live.get(&s.address) {
            out.segment.insert(start, PoolLabel::Known(s.pool));
            out.certain.insert(start);
        }
        if s.pool != (0, 0) {
            out.any_private = true;
        }
    }
    let stack_of = |i: usize| -> &[Frame] {
        let id = dev.stacks.get(i).copied().unwrap_or(0) as usize;
        stacks.get(id.wrapping_sub(1)).map(Vec::as_slice).unwrap_or(&[])
    };
    // Release bursts: only segment events are read to find them, since a
    // trace holds a few among millions.
    let release = |a: Action| matches!(a, Action::SegmentFree | Action::SegmentUnmap);
    let releases = ev.segment_events().filter(|&k| release(ev.at(k).action));
    let mut i = 0;
    for k in releases {
        if k < i {
            // Inside the burst read last.
            continue;
        }
        i = k;
        let start = i;
        // One call's releases share its frames: a change of frames starts
        // another burst.
        let sid = dev.stacks.get(start).copied();
        while i < ev.len() && release(ev.at(i).action) && dev.stacks.get(i).copied() == sid {
            i += 1;
        }
        let run = start..i;
        out.burst_end.insert(start, i);
        let stack_id = dev.stacks.get(start).copied().unwrap_or(0);
        let next_request = ev.get(i).is_some_and(|e| {
            matches!(e.action, Action::SegmentAlloc | Action::Alloc | Action::Oom | Action::SegmentMap)
        });
        let in_malloc = stack_id != 0 && next_request && dev.stacks.get(i).copied() == Some(stack_id);
        if in_malloc {
            continue;
        }
        let framed = run.clone().any(|k| !stack_of(k).is_empty());
        if framed {
            out.framed.insert(start);
        }
        let global = run.clone().any(|k| is_empty_cache(stack_of(k))) || !framed;
        let passes = passes(run, ev, &freed_at, by_age);
        let label_pass = |out: &mut PoolPlan, ks: &[usize], label: PoolLabel| {
            for k in ks {
                if let Some(&s) = freed_at.get(k) {
                    out.segment.insert(s, label);
                }
            }
        };
        // Expandable segments release page ranges in the order of their
        // free blocks, whose sizes the unmaps do not show: their order says
        // nothing of pools. Without a private pool in the snapshot, such a
        // burst is the default pools'.
        let unmaps = ev.slice(start..i).iter().any(|e| e.action == Action::SegmentUnmap);
        if global && unmaps && !dev.segments.iter().any(|s| s.pool != (0, 0)) {
            for (_, ks) in &passes {
                label_pass(&mut out, ks, PoolLabel::DEFAULT);
            }
            out.bursts.insert(start, BurstKind::EmptyCache(Vec::new()));
        } else if global {
            let mut p = 0;
            if passes.first().is_some_and(|(small, _)| !small) {
                label_pass(&mut out, &passes[0].1, PoolLabel::DEFAULT);
                p = 1;
            }
            if passes.get(p).is_some_and(|(small, _)| *small) {
                label_pass(&mut out, &passes[p].1, PoolLabel::DEFAULT);
                p += 1;
            }
            // Each later [small][large] group: one freeable private pool.
            let mut privates = Vec::new();
            while p < passes.len() {
                let label = PoolLabel::Anonymous(out.anonymous);
                out.anonymous += 1;
                out.any_private = true;
                let small_first = passes[p].0;
                label_pass(&mut out, &passes[p].1, label);
                p += 1;
                if small_first && passes.get(p).is_some_and(|(small, _)| !small) {
                    label_pass(&mut out, &passes[p].1, label);
                    p += 1;
                }
                privates.push(label);
            }
            out.bursts.insert(start, BurstKind::EmptyCache(privates));
        } else {
            let label = PoolLabel::Anonymous(out.anonymous);
            out.anonymous += 1;
            out.any_private = true;
            for (_, ks) in &passes {
                label_pass(&mut out, ks, label);
            }
            out.bursts.insert(start, BurstKind::PoolOnly(label));
        }
    }
    out
}
