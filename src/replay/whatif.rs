//! What-if runs: the recorded run's allocation requests, replayed under
//! another allocator config or memory limit on the simulated device. Addresses
//! are synthesised, so results are exact for that address model, not
//! bit-identical to a real run (docs/design/pytorch-allocator.md §15.5).

use std::collections::HashMap;

use crate::trace::pickle::FastHash;

use crate::alloc::{Action, AllocatorConfig, BlockId, CachingAllocator, EventsRef};
use crate::device::Sim;

/// What the program asked the allocator to do, without the allocator's answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Request {
    /// `key` is the recorded address, used to match the frees.
    Alloc {
        key: u64,
        size: u64,
        stream: u64,
    },
    FreeRequested {
        key: u64,
    },
    FreeCompleted {
        key: u64,
    },
    /// A free requested and completed with nothing between (`Slots` makes
    /// it of the two): one step instead of two, the same outcome.
    Free {
        key: u64,
    },
    EmptyCache,
    /// A request that ran out of memory when recorded (its size is rounded).
    FailedAlloc {
        size: u64,
        stream: u64,
    },
}

/// Requests read in order: a list, or a recorded run's events turned into
/// requests as they are read (a ten-million-event run's list is 320 MB, and
/// `tune` replays it a few dozen times; docs/measurements/benchmarks.md).
pub(crate) trait Requests: Sync {
    type Iter<'s>: Iterator<Item = Request>
    where
        Self: 's;
    fn iter(&self) -> Self::Iter<'_>;
}

impl Requests for [Request] {
    type Iter<'s> = std::iter::Copied<std::slice::Iter<'s, Request>>;
    fn iter(&self) -> Self::Iter<'_> {
        <[Request]>::iter(self).copied()
    }
}

impl Requests for Vec<Request> {
    type Iter<'s> = std::iter::Copied<std::slice::Iter<'s, Request>>;
    fn iter(&self) -> Self::Iter<'_> {
        self.as_slice().iter().copied()
    }
}

/// A recorded run's requests, made from its events as they are read: the
/// same as `requests` gives, after `prefix`.
pub(crate) struct FromEvents<'a> {
    pub(crate) prefix: Vec<Request>,
    pub(crate) events: EventsRef<'a>,
    pub(crate) empty_cache_at: &'a [usize],
}

impl Requests for FromEvents<'_> {
    type Iter<'s>
        = std::iter::Chain<std::iter::Copied<std::slice::Iter<'s, Request>>, RequestsOnly<'s>>
    where
        Self: 's;
    fn iter(&self) -> Self::Iter<'_> {
        let rest = RequestsOnly(EventRequests::new(self.events, self.empty_cache_at));
        self.prefix.as_slice().iter().copied().chain(rest)
    }
}

/// `EventRequests` without the events they come from (a named type, so
/// each candidate's loop calls it directly).
pub(crate) struct RequestsOnly<'a>(EventRequests<'a>);

impl Iterator for RequestsOnly<'_> {
    type Item = Request;

    #[inline]
    fn next(&mut self) -> Option<Request> {
        self.0.next().map(|(_, r)| r)
    }
}

/// The requests of events, one by one, each with the recorded event it
/// comes from (an inferred `empty_cache()`: the event it comes before; one
/// past the last event is never made).
pub(crate) struct EventRequests<'a> {
    events: crate::alloc::event::Iter<'a>,
    /// The index of the next event.
    at: usize,
    empty_cache_at: &'a [usize],
}

impl<'a> EventRequests<'a> {
    pub(crate) fn new(rec: EventsRef<'a>, empty_cache_at: &'a [usize]) -> Self {
        EventRequests { events: rec.iter(), at: 0, empty_cache_at }
    }
}

impl Iterator for EventRequests<'_> {
    type Item = (usize, Request);

    fn next(&mut self) -> Option<(usize, Request)> {
        loop {
            if let Some((&j, rest)) = self.empty_cache_at.split_first() {
                if j <= self.at {
                    self.empty_cache_at = rest;
                    if self.events.len() > 0 {
                        return Some((self.at, Request::EmptyCache));
                    }
                    continue;
                }
            }
            let e = self.events.next()?;
            self.at += 1;
            if let Some(r) = request_of(e) {
                return Some((self.at - 1, r));
            }
        }
    }
}

/// The request an event makes, if any.
pub(crate) fn request_of(e: crate::alloc::Event) -> Option<Request> {
    Some(match e.action {
        Action::Alloc => Request::Alloc { key: e.addr, size: e.size, stream: e.stream },
        Action::FreeRequested => Request::FreeRequested { key: e.addr },
        Action::FreeCompleted => Request::FreeCompleted { key: e.addr },
        Action::Oom => Request::FailedAlloc { size: e.size, stream: e.stream },
        _ => return None,
    })
}

/// The requests of a recorded event stream. `empty_cache_at` are the event
/// indices where the exact replay inferred `empty_cache()` calls.
pub(crate) fn requests(rec: EventsRef<'_>, empty_cache_at: &[usize]) -> Vec<Request> {
    EventRequests::new(rec, empty_cache_at).map(|(_, r)| r).collect()
}

/// As `requests`, with the recorded event each request comes from (an
/// inferred `empty_cache()`: the event it comes before).
pub(crate) fn requests_with_events(rec: EventsRef<'_>, empty_cache_at: &[usize]) -> (Vec<Request>, Vec<usize>) {
    EventRequests::new(rec, empty_cache_at).map(|(i, r)| (r, i)).unzip()
}

#[derive(Debug, Clone)]
pub(crate) struct WhatIf {
    pub(crate) allocator: CachingAllocator<Sim>,
    /// Allocations that failed in this run but succeeded when recorded.
    pub(crate) new_ooms: u64,
    /// Allocations that failed when recorded but succeed in this run.
    pub(crate) avoided_ooms: u64,
    /// The first request that failed in this run but not when recorded
    /// (its index in the requests).
    pub(crate) first_new_oom: Option<usize>,
    /// The highest allocated bytes, the request that first reached them
    /// (its index), and the reserved bytes then.
    pub(crate) peak: Option<(usize, u64, u64)>,
}

/// Runs `reqs` on a fresh allocator with `config` over a simulated device of
/// `device_total` bytes (less `context` for the CUDA context).
pub(crate) fn run_requests<R: Requests + ?Sized>(
    reqs: &R,
    config: AllocatorConfig,
    device_total: u64,
    context: u64,
    limit: Option<u64>,
) -> WhatIf {
    run_stream(reqs.iter(), config, Sim::new("simulated device", device_total, context), limit)
}

/// As `run_requests`, on a given simulated device.
pub(crate) fn run_requests_on<R: Requests + ?Sized>(
    reqs: &R,
    config: AllocatorConfig,
    device: Sim,
    limit: Option<u64>,
) -> WhatIf {
    run_stream(reqs.iter(), config, device, limit)
}

/// As `run_requests_on`, the requests taken as they come.
pub(crate) fn run_stream(
    reqs: impl Iterator<Item = Request>,
    config: AllocatorConfig,
    device: Sim,
    limit: Option<u64>,
) -> WhatIf {
    Run::<Keyed>::new(config, device, limit).through(reqs)
}

/// Where a run keeps the blocks it made, by the key their frees name.
pub(crate) trait Live: Default {
    fn insert(&mut self, key: u64, b: BlockId);
    fn get(&self, key: u64) -> Option<BlockId>;
    fn remove(&mut self, key: u64) -> Option<BlockId>;
}

/// Keyed by the recorded addresses: the std hasher's SipHash was 14% of
/// tune's time on a ten-million-event trace (docs/measurements/benchmarks.md).
pub(crate) type Keyed = HashMap<u64, BlockId, FastHash>;

impl Live for Keyed {
    #[inline]
    fn insert(&mut self, key: u64, b: BlockId) {
        HashMap::insert(self, key, b);
    }
    #[inline]
    fn get(&self, key: u64) -> Option<BlockId> {
        HashMap::get(self, &key).copied()
    }
    #[inline]
    fn remove(&mut self, key: u64) -> Option<BlockId> {
        HashMap::remove(self, &key)
    }
}

/// Keyed by slots (`Slots`): a table, without a hash per request.
#[derive(Default)]
pub(crate) struct Slotted(Vec<Option<BlockId>>);

impl Live for Slotted {
    #[inline]
    fn insert(&mut self, key: u64, b: BlockId) {
        let k = key as usize;
        if k >= self.0.len() {
            self.0.resize(k + 1, None);
        }
        self.0[k] = Some(b);
    }
    #[inline]
    fn get(&self, key: u64) -> Option<BlockId> {
        self.0.get(key as usize).copied().flatten()
    }
    #[inline]
    fn remove(&mut self, key: u64) -> Option<BlockId> {
        self.0.get_mut(key as usize).and_then(Option::take)
    }
}

/// Requests made from events with each recorded address turned into a
/// slot: a small number held while the address is (from its `alloc` to its
/// `free_completed`), then given to the next. Runs of many settings over
/// the same requests (`tune`'s lanes) key their blocks by slot in a table,
/// the addresses hashed once for all of them (the map was a sixth of each
/// what-if replay: docs/measurements/benchmarks.md). A free of an address
/// not held names a slot never given, as it names a key never inserted.
#[derive(Default)]
pub(crate) struct Slots {
    of: Keyed32,
    free: Vec<u32>,
    next: u32,
}

type Keyed32 = HashMap<u64, u32, FastHash>;

/// The slot of an address not held.
const NO_SLOT: u64 = u32::MAX as u64;

impl Slots {
    /// The requests of `events`, in order, keyed by slot.
    pub(crate) fn requests(&mut self, events: EventsRef<'_>) -> Vec<Request> {
        let mut out = Vec::with_capacity(events.len());
        for e in events.iter() {
            let Some(r) = request_of(e) else { continue };
            let r = match r {
                Request::Alloc { key, size, stream } => {
                    // One lookup: a held address keeps its slot.
                    let (free, next) = (&mut self.free, &mut self.next);
                    let slot = *self.of.entry(key).or_insert_with(|| {
                        free.pop().unwrap_or_else(|| {
                            *next += 1;
                            *next - 1
                        })
                    });
                    Request::Alloc { key: slot.into(), size, stream }
                }
                Request::FreeRequested { key } => {
                    Request::FreeRequested { key: self.of.get(&key).map_or(NO_SLOT, |&s| s.into()) }
                }
                Request::FreeCompleted { key } => match self.of.remove(&key) {
                    Some(s) => {
                        self.free.push(s);
                        let slot = s.into();
                        // Most frees complete at once: the pair is one step.
                        if out.last() == Some(&Request::FreeRequested { key: slot }) {
                            out.pop();
                            Request::Free { key: slot }
                        } else {
                            Request::FreeCompleted { key: slot }
                        }
                    }
                    None => Request::FreeCompleted { key: NO_SLOT },
                },
                other => other,
            };
            out.push(r);
        }
        out
    }
}

/// A what-if run handed its requests one at a time, whose figures can be
/// read on the way (`tune` guesses its second stage from them while the
/// trace is still being read); its blocks kept in `L`.
pub(crate) struct Run<L = Keyed> {
    a: CachingAllocator<Sim>,
    live: L,
    /// The index of the next request.
    at: usize,
    new_ooms: u64,
    avoided_ooms: u64,
    first_new_oom: Option<usize>,
    peak: Option<(usize, u64, u64)>,
}

impl<L: Live> Run<L> {
    /// A run on a fresh allocator with `config` over `device`, under `limit`.
    pub(crate) fn new(config: AllocatorConfig, device: Sim, limit: Option<u64>) -> Run<L> {
        let mut a = CachingAllocator::new(config, device);
        a.set_recording(false);
        if limit.is_some() {
            a.set_memory_limit(limit);
        }
        let live = L::default();
        Run { a, live, at: 0, new_ooms: 0, avoided_ooms: 0, first_new_oom: None, peak: None }
    }

    #[inline]
    pub(crate) fn step(&mut self, r: Request) {
        let (a, i) = (&mut self.a, self.at);
        self.at += 1;
        match r {
            Request::Alloc { key, size, stream } => match a.malloc(size, stream) {
                Ok(b) => {
                    self.live.insert(key, b);
                    let now = a.stats().get(crate::alloc::Kind::AllocatedBytes, 0).current.max(0) as u64;
                    if self.peak.is_none_or(|p| now > p.1) {
                        let reserved = a.stats().get(crate::alloc::Kind::ReservedBytes, 0).current.max(0) as u64;
                        self.peak = Some((i, now, reserved));
                    }
                }
                Err(_) => {
                    self.new_ooms += 1;
                    self.first_new_oom.get_or_insert(i);
                }
            },
            // A tensor that was never allocated here has nothing to free.
            Request::FreeRequested { key } => {
                if let Some(b) = self.live.get(key) {
                    let _ = a.free_requested(b);
                }
            }
            Request::FreeCompleted { key } => {
                if let Some(b) = self.live.remove(key) {
                    let _ = a.free_completed(b);
                }
            }
            Request::Free { key } => {
                // Two requests: the indices stay those of the events'.
                self.at += 1;
                if let Some(b) = self.live.remove(key) {
                    // A what-if block is never used on another stream, so
                    // `free` returns it at once, as the two steps would.
                    let _ = a.free(b);
                }
            }
            Request::EmptyCache => a.empty_cache(),
            Request::FailedAlloc { size, stream } => {
                // The program went on without this tensor; if it fits now,
                // count it and give it back.
                if let Ok(b) = a.malloc(size, stream) {
                    self.avoided_ooms += 1;
                    let _ = a.free(b);
                }
            }
        }
    }

    /// The allocator's statistics so far.
    pub(crate) fn stats(&self) -> &crate::alloc::DeviceStats {
        self.a.stats()
    }

    /// Every one of `reqs` stepped, then `finish`.
    pub(crate) fn through(mut self, reqs: impl IntoIterator<Item = Request>) -> WhatIf {
        for r in reqs {
            self.step(r);
        }
        self.finish()
    }

    pub(crate) fn finish(self) -> WhatIf {
        let Run { a, new_ooms, avoided_ooms, first_new_oom, peak, .. } = self;
        WhatIf { allocator: a, new_ooms, avoided_ooms, first_new_oom, peak }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::{Event, Events};

    #[test]
    fn requests_made_as_read_equal_the_list() {
        let ev: Events = [
            Event::new(Action::SegmentAlloc, 0, 2 << 20, 0),
            Event::new(Action::Alloc, 0, 512, 0),
            Event::new(Action::FreeRequested, 0, 512, 0),
            Event::new(Action::FreeCompleted, 0, 512, 0),
            Event::new(Action::Oom, 9, 1 << 30, 0),
            Event::new(Action::SegmentFree, 0, 2 << 20, 0),
            Event::new(Action::Alloc, 4096, 1024, 7),
        ]
        .into_iter()
        .collect();
        let first = Request::Alloc { key: 1, size: 2, stream: 3 };
        // Calls before an event, two at one, and one past the end (never made).
        for at in [&[][..], &[0, 5, 5], &[6, 7], &[2, 100]] {
            let want: Vec<Request> = std::iter::once(first).chain(requests(ev.view(), at)).collect();
            let lazy = FromEvents { prefix: vec![first], events: ev.view(), empty_cache_at: at };
            assert_eq!(Requests::iter(&lazy).collect::<Vec<_>>(), want, "{at:?}");
        }
        // Each request with the event it comes from; an empty_cache() before
        // the event it was inferred at, none past the last event.
        let (a, f, c) = (
            Request::Alloc { key: 0, size: 512, stream: 0 },
            Request::FreeRequested { key: 0 },
            Request::FreeCompleted { key: 0 },
        );
        let (oom, b) =
            (Request::FailedAlloc { size: 1 << 30, stream: 0 }, Request::Alloc { key: 4096, size: 1024, stream: 7 });
        let e = Request::EmptyCache;
        let (r, at) = requests_with_events(ev.view(), &[0, 5, 5]);
        assert_eq!(r, [e, a, f, c, oom, e, e, b]);
        assert_eq!(at, [0, 1, 2, 3, 4, 5, 5, 6]);
        let (r, at) = requests_with_events(ev.view(), &[2, 100]);
        assert_eq!(r, [a, e, f, c, oom, b]);
        assert_eq!(at, [1, 2, 2, 3, 4, 6]);
    }

    /// Requests keyed by slot run as those keyed by address do, in a run
    /// whose addresses are reused, allocated twice while held, freed
    /// without an allocation or with another free between request and
    /// completion, and whose allocations fail under a limit; a free whose
    /// completion follows its request is one step.
    #[test]
    fn requests_keyed_by_slot_run_as_those_keyed_by_address() {
        let mb = 1 << 20;
        let mut ev = Vec::new();
        for round in 0..6u64 {
            for k in 0..8u64 {
                // Every third round at new addresses; the rest reuse them.
                let addr = if round % 3 == 0 { 1000 + round * 10 + k } else { k };
                ev.push(Event::new(Action::Alloc, addr, (k + round + 1) * 7 * mb, 0));
            }
            // Allocated again while held: the later block is the one freed.
            ev.push(Event::new(Action::Alloc, 3, 40 * mb, 0));
            ev.push(Event::new(Action::FreeRequested, 555, 0, 0));
            ev.push(Event::new(Action::FreeCompleted, 556, 0, 0));
            ev.push(Event::new(Action::Oom, 0, 300 * mb, 0));
            // Two frees completing after both were requested.
            for a in [7000, 7001] {
                ev.push(Event::new(Action::Alloc, a, 5 * mb, 0));
            }
            for (action, a) in [(Action::FreeRequested, 7000), (Action::FreeRequested, 7001)]
                .into_iter()
                .chain([(Action::FreeCompleted, 7000), (Action::FreeCompleted, 7001)])
            {
                ev.push(Event::new(action, a, 0, 0));
            }
            for k in (0..8u64).rev() {
                let addr = if round % 3 == 0 { 1000 + round * 10 + k } else { k };
                if (k + round) % 4 != 0 {
                    ev.push(Event::new(Action::FreeRequested, addr, 0, 0));
                    ev.push(Event::new(Action::FreeCompleted, addr, 0, 0));
                }
            }
        }
        let ev = Events::from(ev);
        let mut slots = Slots::default();
        // Cut anywhere (here between a free's request and its completion),
        // the slots carry on from one piece to the next.
        let (a, b) = (ev.view().slice(..19), ev.view().slice(19..));
        let mut slotted = slots.requests(a);
        slotted.extend(slots.requests(b));
        let one_step = slotted.iter().filter(|r| matches!(r, Request::Free { .. })).count();
        let apart = slotted.iter().filter(|r| matches!(r, Request::FreeCompleted { .. })).count();
        // The frees completed at once (one cut by the pieces' edge, whose
        // request and completion stay two), those completed later and
        // those of addresses not held.
        assert_eq!((one_step, apart), (35, 6 + 12 + 1));
        assert_eq!(slotted.len() + one_step, requests(ev.view(), &[]).len());
        // The inferred empty_cache() calls are not the slots' business.
        assert_ne!(requests(ev.view(), &[2, 40]).len(), slotted.len());
        // Far fewer slots than addresses.
        assert!(slots.next < 30, "{}", slots.next);
        for limit in [None, Some(400 * mb), Some(150 * mb)] {
            let run = |reqs: &[Request], slotted: bool| {
                let c = AllocatorConfig::default();
                let device = Sim::new("simulated device", 80 << 30, 0);
                let w = if slotted {
                    Run::<Slotted>::new(c, device, limit).through(reqs.iter().copied())
                } else {
                    run_stream(reqs.iter().copied(), c, device, limit)
                };
                (w.new_ooms, w.avoided_ooms, w.first_new_oom, w.peak, w.allocator.stats().clone())
            };
            let plain = run(&requests(ev.view(), &[]), false);
            assert_eq!(run(&slotted, true), plain, "{limit:?}");
            if limit == Some(150 * mb) {
                assert!(plain.0 > 0, "allocations fail under the limit");
            }
        }
    }

    #[test]
    fn what_if_runs_follow_each_config_exactly() {
        // Eight 25 MiB tensors, every other one freed, then a 30 MiB request.
        let mut rec = Vec::new();
        for k in 0..8u64 {
            rec.push(Event::new(Action::Alloc, k, 25 << 20, 0));
        }
        for k in (0..8u64).step_by(2) {
            rec.push(Event::new(Action::FreeRequested, k, 25 << 20, 0));
            rec.push(Event::new(Action::FreeCompleted, k, 25 << 20, 0));
        }
        rec.push(Event::new(Action::Alloc, 100, 30 << 20, 0));
        let rec = Events::from(rec);
        let reqs = requests(rec.view(), &[]);
        assert_eq!(reqs.len(), 17);
        let total = 80 << 30;
        let peak = |conf: &str| {
            let w = run_requests(&reqs, AllocatorConfig::parse(conf).unwrap(), total, 0, None);
            assert_eq!(w.new_ooms, 0);
            w.allocator.stats().get(crate::alloc::Kind::ReservedBytes, 0).peak
        };
        // Default: eight 26 MiB segments (25 MiB rounded up to 2 MiB, the
        // 1 MiB tail too small to split off), then a new 30 MiB one, since no
        // 26 MiB hole fits 30 MiB.
        assert_eq!(peak(""), 8 * (26 << 20) + (30 << 20));
        // Expandable: 25 MiB blocks packed into 20 MiB pages (200 MiB), then
        // two more pages for the 30 MiB request at the tail.
        assert_eq!(peak("expandable_segments:True"), 240 << 20);
    }

    #[test]
    fn a_tight_limit_turns_allocations_into_ooms() {
        let rec: Vec<Event> = (0..4u64).map(|k| Event::new(Action::Alloc, k, 100 << 20, 0)).collect();
        let w = run_requests(
            &requests(Events::from(rec).view(), &[]),
            AllocatorConfig::default(),
            80 << 30,
            0,
            Some(250 << 20),
        );
        assert_eq!(w.new_ooms, 2);
        assert_eq!(w.allocator.stats().num_ooms, 2);
    }
}
