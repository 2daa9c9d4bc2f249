//! The replay loop. Requests (`alloc`, `oom`) run our `malloc`; the segment
//! events they cause are produced inside it, with cudaMalloc answered by the
//! `Oracle` from the recording. A `segment_free`/`segment_unmap` that no
//! malloc explains was an `empty_cache()`.

use std::collections::HashMap;

use crate::alloc::{Action, AllocatorConfig, BlockId, CachingAllocator, Event, SeedSegment, StatePoint};
use crate::device::Oracle;
use crate::trace::pickle::FastHash;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Divergence {
    /// Index of the first recorded event we did not reproduce.
    pub event: usize,
    pub expected: Option<Event>,
    pub got: Option<Event>,
    pub reason: String,
}

#[derive(Debug, Clone)]
pub struct ReplayOptions {
    pub config: AllocatorConfig,
    /// `totalGlobalMem` of the recorded device.
    pub device_total: u64,
    /// `allowed_memory_maximum` in bytes (from a memory fraction), if any.
    pub memory_limit: Option<u64>,
    /// Keep every replayed event and the state after it (for `--dump-events`
    /// and timelines); otherwise memory stays flat however long the trace.
    pub keep_events: bool,
    /// Stop once this many recorded events have been reproduced.
    pub stop_at: Option<usize>,
}

impl ReplayOptions {
    pub fn new(config: AllocatorConfig, device_total: u64) -> Self {
        ReplayOptions { config, device_total, memory_limit: None, keep_events: false, stop_at: None }
    }
}

/// The highest `allocated_bytes.all.current` and where it was first reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Peak {
    pub event: usize,
    pub allocated: u64,
    /// Reserved bytes at that event.
    pub reserved: u64,
}

/// Called after each recorded event is reproduced, with the allocator's
/// state at that point.
pub trait ReplayObserver {
    fn after_event(&mut self, index: usize, event: &Event, alloc: &CachingAllocator<Oracle<'_>>);
}

impl ReplayObserver for () {
    fn after_event(&mut self, _: usize, _: &Event, _: &CachingAllocator<Oracle<'_>>) {}
}

impl<F: FnMut(usize, &Event, &CachingAllocator<Oracle<'_>>)> ReplayObserver for F {
    fn after_event(&mut self, index: usize, event: &Event, alloc: &CachingAllocator<Oracle<'_>>) {
        self(index, event, alloc)
    }
}

pub struct ReplayResult<'a> {
    pub allocator: CachingAllocator<Oracle<'a>>,
    /// `None` when every event was reproduced.
    pub divergence: Option<Divergence>,
    /// `empty_cache()` calls inferred from unexplained segment releases.
    pub inferred_empty_cache: usize,
    /// Events reproduced (all of them unless diverged).
    pub reproduced: usize,
    /// Recorded event indices at which an `empty_cache()` was inferred.
    pub empty_cache_at: Vec<usize>,
    pub peak: Peak,
    /// With `keep_events`: every event our allocator emitted, and the state after it.
    pub events: Vec<Event>,
    pub points: Vec<StatePoint>,
}

/// The first request (`alloc`/`oom`) at or after `i`, if no free or snapshot
/// comes before it: segment events right before a request may be that
/// request's own.
fn next_request(rec: &[Event], i: usize) -> Option<usize> {
    for (k, e) in rec.iter().enumerate().skip(i) {
        match e.action {
            Action::Alloc | Action::Oom => return Some(k),
            Action::FreeRequested | Action::FreeCompleted | Action::Snapshot => return None,
            _ => {}
        }
    }
    None
}

struct State<'a> {
    alloc: CachingAllocator<Oracle<'a>>,
    /// Live blocks by recorded address.
    live: HashMap<u64, BlockId, FastHash>,
}

impl State<'_> {
    /// Runs the request recorded at `k`; returns the block on success.
    fn request(&mut self, rec: &[Event], k: usize) -> Option<BlockId> {
        let e = rec[k];
        self.alloc.malloc(e.size, e.stream).ok()
    }

    /// Compares what the allocator emitted since `from` with the recording.
    fn check(&self, rec: &[Event], from: usize) -> Result<(), Divergence> {
        for (j, got) in self.alloc.events().iter().enumerate() {
            let i = from + j;
            match rec.get(i) {
                Some(want) if want.same_as(got) => {}
                want => {
                    return Err(Divergence {
                        event: i,
                        expected: want.copied(),
                        got: Some(*got),
                        reason: "emitted event differs from the recorded one".into(),
                    })
                }
            }
        }
        Ok(())
    }
}

/// Replays `rec` from an empty allocator.
pub fn replay_events<'a>(rec: &'a [Event], opts: &ReplayOptions, observer: impl ReplayObserver) -> ReplayResult<'a> {
    replay_events_from(rec, opts, &[], observer)
}

/// Replays `rec` from the state `seed`: segments that existed before the
/// first event (see `wrapped::reconstruct`).
pub fn replay_events_from<'a>(
    rec: &'a [Event],
    opts: &ReplayOptions,
    seed: &[SeedSegment],
    mut observer: impl ReplayObserver,
) -> ReplayResult<'a> {
    let mut alloc = CachingAllocator::new(opts.config.clone(), Oracle::new(rec, opts.device_total));
    if opts.memory_limit.is_some() {
        alloc.set_memory_limit(opts.memory_limit);
    }
    let mut live: HashMap<u64, BlockId, FastHash> = HashMap::default();
    let mut seed_error = None;
    for s in seed {
        match alloc.seed_segment(s) {
            Ok(blocks) => live.extend(blocks),
            Err(e) => seed_error = Some(e),
        }
    }
    let mut st = State { alloc, live };
    let mut inferred_empty_cache = 0;
    let mut empty_cache_at = Vec::new();
    let mut peak = Peak::default();
    let mut kept_events = Vec::new();
    let mut kept_points = Vec::new();
    let mut divergence =
        seed_error.map(|reason| Divergence { event: 0, expected: rec.first().copied(), got: None, reason });
    let end = opts.stop_at.unwrap_or(usize::MAX).min(rec.len());

    while divergence.is_none() && (st.alloc.emitted() as usize) < end {
        let i = st.alloc.emitted() as usize;
        let ev = rec[i];
        st.alloc.clear_events();
        let fail = |reason: String| Divergence { event: i, expected: Some(ev), got: None, reason };
        let step: Result<(), Divergence> = match ev.action {
            Action::SegmentFree | Action::SegmentUnmap => {
                // Either the release path of the next malloc (OOM retry,
                // max_split_size release, GC) or an empty_cache() call.
                let mut explained = false;
                if let Some(k) = next_request(rec, i) {
                    let saved = st.alloc.clone();
                    let got = st.request(rec, k);
                    if st.check(rec, i).is_ok() && st.alloc.emitted() as usize == k + 1 {
                        if let Some(b) = got {
                            if let Ok(v) = st.alloc.block(b) {
                                st.live.insert(v.ptr, b);
                            }
                        }
                        explained = true;
                    } else {
                        st.alloc = saved;
                    }
                }
                if !explained {
                    st.alloc.clear_events();
                    st.alloc.empty_cache();
                    inferred_empty_cache += 1;
                    empty_cache_at.push(i);
                }
                Ok(())
            }
            Action::SegmentAlloc | Action::SegmentMap => match next_request(rec, i) {
                Some(k) => {
                    if let Some(b) = st.request(rec, k) {
                        if let Ok(v) = st.alloc.block(b) {
                            st.live.insert(v.ptr, b);
                        }
                    }
                    Ok(())
                }
                None => Err(fail(format!("{} with no allocation request after it", ev.action))),
            },
            Action::Alloc | Action::Oom => {
                if let Some(b) = st.request(rec, i) {
                    if let Ok(v) = st.alloc.block(b) {
                        st.live.insert(v.ptr, b);
                    }
                }
                Ok(())
            }
            Action::FreeRequested => match st.live.get(&ev.addr) {
                Some(&b) => st.alloc.free_requested(b).map_err(|e| fail(e.to_string())),
                None => Err(fail(format!("free_requested of {:#x}, which is not allocated", ev.addr))),
            },
            Action::FreeCompleted => match st.live.remove(&ev.addr) {
                Some(b) => st.alloc.free_completed(b).map_err(|e| fail(e.to_string())),
                None => Err(fail(format!("free_completed of {:#x}, which is not allocated", ev.addr))),
            },
            Action::Snapshot => {
                st.alloc.push_external_event(ev);
                Ok(())
            }
        };
        let step = step.and_then(|_| st.check(rec, i));
        if let Err(d) = step {
            divergence = Some(d);
            break;
        }
        if st.alloc.emitted() as usize == i {
            divergence = Some(Divergence {
                event: i,
                expected: Some(ev),
                got: None,
                reason: "nothing was emitted for this event".into(),
            });
            break;
        }
        for (k, p) in st.alloc.points().iter().enumerate() {
            if p.allocated > peak.allocated {
                peak = Peak { event: i + k, allocated: p.allocated, reserved: p.reserved };
            }
        }
        if opts.keep_events {
            kept_events.extend_from_slice(st.alloc.events());
            kept_points.extend_from_slice(st.alloc.points());
        }
        for (j, e) in rec.iter().enumerate().take(st.alloc.emitted() as usize).skip(i) {
            observer.after_event(j, e, &st.alloc);
        }
    }
    st.alloc.clear_events();
    let reproduced = divergence.as_ref().map(|d| d.event).unwrap_or(st.alloc.emitted() as usize);
    ReplayResult {
        allocator: st.alloc,
        divergence,
        inferred_empty_cache,
        reproduced,
        empty_cache_at,
        peak,
        events: kept_events,
        points: kept_points,
    }
}
