//! The allocator's trace events, named as PyTorch's `device_traces` actions.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Oom,
    Snapshot,
    /// 2.14+: `torch.cuda.memory._annotate_tensor`: `addr` is the block,
    /// `size` its requested size; memory does not change.
    Annotate,
}

impl Action {
    pub(crate) const ALL: [Action; 10] = [
        Action::Alloc,
        Action::FreeRequested,
        Action::FreeCompleted,
        Action::SegmentAlloc,
        Action::SegmentFree,
        Action::SegmentMap,
        Action::SegmentUnmap,
        Action::Oom,
        Action::Snapshot,
        Action::Annotate,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Oom => "oom",
            Action::Snapshot => "snapshot",
            Action::Annotate => "annotate",
        }
    }

    pub fn from_name(s: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.name() == s)
    }

    pub fn is_segment(self) -> bool {
        matches!(self, Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap)
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One trace entry. For `oom`, `addr` holds PyTorch's `device_free`
/// (cudaMemGetInfo's free bytes) and `size` the rounded request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Event {
    pub action: Action,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
}

impl Event {
    pub fn new(action: Action, addr: u64, size: u64, stream: u64) -> Self {
        Event { action, addr, size, stream }
    }

    /// Equality as a replay judges it: `oom` entries carry the device's free
    /// bytes in `addr`, which no model of the device can reproduce.
    pub fn same_as(&self, other: &Event) -> bool {
        self.action == other.action
            && self.size == other.size
            && self.stream == other.stream
            && (self.action == Action::Oom || self.addr == other.addr)
    }
}

/// A recorded device's events in 16 bytes each instead of `Event`'s 32: the
/// address, and the size, action and stream in one word, streams numbered
/// (a run has a few). An event that does not fit (a size of 2^48 or more,
/// more than 4,094 streams) is kept whole beside. A ten-million-event
/// trace holds 160 MB of them, not 320 (docs/measurements/benchmarks.md,
/// "Ten million events").
#[derive(Debug, Clone, Default)]
pub struct Events {
    words: Vec<Packed>,
    streams: Vec<u64>,
    stream_ids: foldhash::HashMap<u64, u16>,
    /// The last event's stream and its number: runs of one stream are the rule.
    last_stream: Option<(u64, u16)>,
    /// (index, event) of the events kept whole, ascending.
    wide: Vec<(usize, Event)>,
    /// The indices of the OOMs, ascending: found without reading every
    /// event (a read of ten million is tens of milliseconds, and a report
    /// asks several times).
    ooms: Vec<usize>,
    /// The indices of the segment events, ascending: a trace holds a few
    /// among millions, and the pools' plan reads only them
    /// (docs/design/trace-decoding.md, "After the decoding").
    segs: Vec<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Packed {
    addr: u64,
    /// size << 16 | stream number << 4 | action.
    word: u64,
}

const ACTION_BITS: u32 = 4;
const STREAM_BITS: u32 = 12;
const SIZE_SHIFT: u32 = ACTION_BITS + STREAM_BITS;
/// The stream number that says "kept whole in `wide`".
const WHOLE: u64 = (1 << STREAM_BITS) - 1;

impl Events {
    pub fn with_capacity(n: usize) -> Self {
        Events { words: Vec::with_capacity(n), ..Default::default() }
    }

    /// Where the column's room lies: its buffer's address, the bytes an
    /// event takes there, the events it has room for (for its pages to be
    /// faulted in ahead of the thread that fills it:
    /// docs/design/trace-decoding.md, "Pages faulted ahead").
    pub(crate) fn room(&self) -> (usize, usize, usize) {
        (self.words.as_ptr() as usize, std::mem::size_of::<Packed>(), self.words.capacity())
    }

    /// Events it has room for without growing.
    pub(crate) fn capacity(&self) -> usize {
        self.words.capacity()
    }

    /// Reserves room for `n` more, if the memory is there.
    pub(crate) fn try_reserve(&mut self, n: usize) -> Result<(), std::collections::TryReserveError> {
        self.words.try_reserve(n)
    }

    pub fn push(&mut self, e: Event) {
        let known = match self.last_stream {
            Some((v, s)) if v == e.stream => Some(s),
            _ => self.stream_ids.get(&e.stream).copied(),
        };
        let stream = match known {
            Some(s) => {
                self.last_stream = Some((e.stream, s));
                Some(u64::from(s))
            }
            None if (self.streams.len() as u64) < WHOLE => {
                let s = self.streams.len() as u16;
                self.streams.push(e.stream);
                self.stream_ids.insert(e.stream, s);
                Some(u64::from(s))
            }
            None => None,
        };
        if e.action == Action::Oom {
            self.ooms.push(self.words.len());
        }
        if e.action.is_segment() {
            self.segs.push(self.words.len());
        }
        let action = Action::ALL.iter().position(|&a| a == e.action).unwrap_or(0) as u64;
        let word = match stream {
            Some(s) if e.size >> (64 - SIZE_SHIFT) == 0 => e.size << SIZE_SHIFT | s << ACTION_BITS | action,
            _ => {
                self.wide.push((self.words.len(), e));
                WHOLE << ACTION_BITS | action
            }
        };
        self.words.push(Packed { addr: e.addr, word });
    }

    /// `other`'s events appended after these. Where these are none, `other`
    /// becomes the column, keeping the room it reserved.
    pub fn append(&mut self, other: Events) {
        if self.is_empty() {
            *self = other;
            return;
        }
        self.extend_from(&other);
    }

    /// `other`'s events copied after these: its packed words as they are
    /// where the streams' numbers fit, as `append` does (the replay behind
    /// the decoder copies the chunks `tune` reads too).
    pub(crate) fn extend_from(&mut self, other: &Events) {
        self.words.reserve(other.len());
        match self.numbers_for(&other.streams) {
            Some(numbers) => self.append_renumbered(other, &numbers),
            None => other.iter().for_each(|e| self.push(e)),
        }
    }

    /// This column's number for each of `streams` (numbering the new ones),
    /// or `None` where they would not all fit.
    fn numbers_for(&mut self, streams: &[u64]) -> Option<Vec<u64>> {
        let new = streams.iter().filter(|s| !self.stream_ids.contains_key(s)).count();
        if streams.len() >= WHOLE as usize || self.streams.len() + new >= WHOLE as usize {
            return None;
        }
        let numbers = streams.iter().map(|&s| {
            let n = *self.stream_ids.entry(s).or_insert_with(|| {
                self.streams.push(s);
                (self.streams.len() - 1) as u16
            });
            u64::from(n)
        });
        Some(numbers.collect())
    }

    /// `other`'s packed words moved over as they are, each stream's number
    /// made this column's: what pushing each event would store, without
    /// unpacking it (the replay behind the decoder appends every chunk).
    fn append_renumbered(&mut self, other: &Events, numbers: &[u64]) {
        let at = self.words.len();
        let mask = WHOLE << ACTION_BITS;
        if numbers.iter().enumerate().all(|(i, &n)| i as u64 == n) {
            self.words.extend_from_slice(&other.words);
        } else {
            self.words.extend(other.words.iter().map(|p| {
                let s = (p.word & mask) >> ACTION_BITS;
                match numbers.get(s as usize) {
                    Some(&n) => Packed { addr: p.addr, word: p.word & !mask | n << ACTION_BITS },
                    None => *p,
                }
            }));
        }
        self.wide.extend(other.wide.iter().map(|&(i, e)| (i + at, e)));
        self.ooms.extend(other.ooms.iter().map(|&i| i + at));
        self.segs.extend(other.segs.iter().map(|&i| i + at));
    }

    /// The events before `at` are dropped.
    pub fn drain_front(&mut self, at: usize) {
        let at = at.min(self.words.len());
        self.words.drain(..at);
        self.wide.retain(|w| w.0 >= at);
        self.wide.iter_mut().for_each(|w| w.0 -= at);
        for marks in [&mut self.ooms, &mut self.segs] {
            marks.retain(|&i| i >= at);
            marks.iter_mut().for_each(|i| *i -= at);
        }
    }

    /// The whole column, to read.
    pub fn view(&self) -> EventsRef<'_> {
        EventsRef {
            words: &self.words,
            streams: &self.streams,
            wide: &self.wide,
            ooms: &self.ooms,
            segs: &self.segs,
            base: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.words.len()
    }

    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    pub fn get(&self, i: usize) -> Option<Event> {
        self.view().get(i)
    }

    /// The event at `i`; panics past the end, as indexing does.
    pub fn at(&self, i: usize) -> Event {
        self.view().at(i)
    }

    pub fn first(&self) -> Option<Event> {
        self.view().first()
    }

    pub fn last(&self) -> Option<Event> {
        self.view().last()
    }

    pub fn iter(&self) -> Iter<'_> {
        self.view().iter()
    }

    /// The indices of the OOMs, ascending.
    pub fn ooms(&self) -> impl Iterator<Item = usize> + '_ {
        self.view().ooms()
    }

    /// The indices of the segment events, ascending.
    pub(crate) fn segment_events(&self) -> impl Iterator<Item = usize> + '_ {
        self.view().segment_events()
    }
}

impl FromIterator<Event> for Events {
    fn from_iter<I: IntoIterator<Item = Event>>(it: I) -> Self {
        let it = it.into_iter();
        let mut out = Events::with_capacity(it.size_hint().0);
        it.for_each(|e| out.push(e));
        out
    }
}

impl From<Vec<Event>> for Events {
    fn from(v: Vec<Event>) -> Self {
        v.into_iter().collect()
    }
}

impl PartialEq for Events {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

/// A run of a column's events, to read (what `&[Event]` was): `Copy`,
/// sliced without copying.
#[derive(Debug, Clone, Copy)]
pub struct EventsRef<'a> {
    words: &'a [Packed],
    streams: &'a [u64],
    wide: &'a [(usize, Event)],
    /// The whole column's OOMs.
    ooms: &'a [usize],
    /// The whole column's segment events.
    segs: &'a [usize],
    /// The index in the whole column of `words[0]` (`wide`, `ooms` and
    /// `segs` are the whole's).
    base: usize,
}

impl EventsRef<'static> {
    /// No events: what a replay holds while the column it reads grows
    /// (`Stepper::rebind`).
    pub(crate) const EMPTY: EventsRef<'static> =
        EventsRef { words: &[], streams: &[], wide: &[], ooms: &[], segs: &[], base: 0 };
}

impl<'a> EventsRef<'a> {
    pub fn len(&self) -> usize {
        self.words.len()
    }

    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    #[inline]
    fn unpack(&self, i: usize, p: Packed) -> Event {
        let action = Action::ALL[(p.word & ((1 << ACTION_BITS) - 1)) as usize];
        let s = (p.word >> ACTION_BITS) & WHOLE;
        if s == WHOLE {
            let at = self.base + i;
            if let Ok(k) = self.wide.binary_search_by_key(&at, |w| w.0) {
                return self.wide[k].1;
            }
        }
        Event {
            action,
            addr: p.addr,
            size: p.word >> SIZE_SHIFT,
            stream: self.streams.get(s as usize).copied().unwrap_or(0),
        }
    }

    #[inline]
    pub fn get(&self, i: usize) -> Option<Event> {
        self.words.get(i).map(|&p| self.unpack(i, p))
    }

    /// The event at `i`; panics past the end, as indexing does.
    #[inline]
    pub fn at(&self, i: usize) -> Event {
        self.unpack(i, self.words[i])
    }

    pub fn first(&self) -> Option<Event> {
        self.get(0)
    }

    pub fn last(&self) -> Option<Event> {
        self.len().checked_sub(1).and_then(|i| self.get(i))
    }

    /// The actions of this run, read without unpacking the rest of each
    /// event.
    pub(crate) fn actions(&self) -> impl Iterator<Item = Action> + 'a {
        self.words.iter().map(|p| Action::ALL[(p.word & ((1 << ACTION_BITS) - 1)) as usize])
    }

    /// Events `r` of this run.
    pub fn slice(&self, r: impl std::ops::RangeBounds<usize>) -> EventsRef<'a> {
        use std::ops::Bound;
        let lo = match r.start_bound() {
            Bound::Included(&a) => a,
            Bound::Excluded(&a) => a + 1,
            Bound::Unbounded => 0,
        };
        let hi = match r.end_bound() {
            Bound::Included(&b) => b + 1,
            Bound::Excluded(&b) => b,
            Bound::Unbounded => self.len(),
        };
        EventsRef { words: &self.words[lo..hi], base: self.base + lo, ..*self }
    }

    pub fn iter(&self) -> Iter<'a> {
        Iter { of: *self, front: 0, back: self.len() }
    }

    /// The indices of this run's OOMs, ascending.
    pub fn ooms(&self) -> impl Iterator<Item = usize> + 'a {
        self.marked(self.ooms)
    }

    /// The indices of this run's segment events, ascending.
    pub(crate) fn segment_events(&self) -> impl Iterator<Item = usize> + 'a {
        self.marked(self.segs)
    }

    /// Those of the whole column's indices `all` in this run, as its own.
    fn marked(&self, all: &'a [usize]) -> impl Iterator<Item = usize> + 'a {
        let (from, to) = (self.base, self.base + self.len());
        let run = &all[all.partition_point(|&i| i < from)..all.partition_point(|&i| i < to)];
        run.iter().map(move |&i| i - from)
    }
}

impl<'a> From<&'a Events> for EventsRef<'a> {
    fn from(e: &'a Events) -> Self {
        e.view()
    }
}

impl<'a> IntoIterator for EventsRef<'a> {
    type Item = Event;
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl<'a> IntoIterator for &'a Events {
    type Item = Event;
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

/// The events of a run, by value.
#[derive(Debug, Clone)]
pub struct Iter<'a> {
    of: EventsRef<'a>,
    front: usize,
    back: usize,
}

impl Iterator for Iter<'_> {
    type Item = Event;

    #[inline]
    fn next(&mut self) -> Option<Event> {
        (self.front < self.back).then(|| {
            self.front += 1;
            self.of.at(self.front - 1)
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.back - self.front;
        (n, Some(n))
    }

    fn nth(&mut self, n: usize) -> Option<Event> {
        self.front = self.front.saturating_add(n).min(self.back);
        self.next()
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Event> {
        (self.front < self.back).then(|| {
            self.back -= 1;
            self.of.at(self.back)
        })
    }
}

impl ExactSizeIterator for Iter<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_come_back_as_pushed_in_sixteen_bytes() {
        assert_eq!(std::mem::size_of::<Packed>(), 16);
        let mut v = vec![
            Event::new(Action::SegmentAlloc, 0x7f00_0000_0000, 2 << 20, 0),
            Event::new(Action::Alloc, 0x7f00_0000_0000, 512, 0x55d5_e4c0_b2a0),
            Event::new(Action::Oom, u64::MAX, (1 << 48) + 3, 0),
            Event::new(Action::Annotate, 1, 0, 7),
            Event::new(Action::FreeCompleted, 0x7f00_0000_0000, 512, 0x55d5_e4c0_b2a0),
        ];
        // Past 4,094 streams, the rest are kept whole.
        v.extend((0..5000u64).map(|s| Event::new(Action::Alloc, s << 9, s, 1000 + s)));
        let col: Events = v.iter().copied().collect();
        assert_eq!(col.len(), v.len());
        assert_eq!(col.iter().collect::<Vec<_>>(), v);
        assert_eq!(col.iter().rev().collect::<Vec<_>>(), v.iter().rev().copied().collect::<Vec<_>>());
        assert_eq!(col.at(2), v[2]);
        let s = col.view().slice(3..4100);
        assert_eq!(s.len(), 4097);
        assert_eq!(s.iter().collect::<Vec<_>>(), v[3..4100].to_vec());
        assert_eq!(s.slice(4090..).iter().collect::<Vec<_>>(), v[4093..4100].to_vec());
        assert_eq!(col.iter().nth(4099), Some(v[4099]));
        // Appended in chunks, each numbering its streams afresh.
        let mut joined = Events::default();
        for part in v.chunks(1000) {
            joined.append(part.iter().copied().collect());
        }
        assert_eq!(joined, col);
        let mut cut = col.clone();
        cut.drain_front(4000);
        assert_eq!(cut.iter().collect::<Vec<_>>(), v[4000..].to_vec());
        assert_eq!(cut.last(), v.last().copied());
    }

    /// Appending moves (or copies) the packed words over with their streams
    /// renumbered: the column stores exactly what pushing each event would, streams met
    /// in another order in each chunk, events kept whole and OOMs included;
    /// the actions read alone are the events'.
    #[test]
    fn appended_chunks_store_what_pushing_each_event_does() {
        let v: Vec<Event> = (0..5000u64)
            .map(|i| {
                let action = if i % 211 == 7 { Action::Oom } else { Action::ALL[(i % 6) as usize] };
                let size = if i % 333 == 1 { (1 << 48) + i } else { i << 9 };
                // Chunk k meets streams in its own order, new ones on the way.
                let stream = [3u64, 9, 0, 0x55d5_e4c0_b2a0][((i / 700 + i) % 4) as usize] + (i / 1500) * 17;
                Event::new(action, i << 12, size, stream)
            })
            .collect();
        let pushed: Events = v.iter().copied().collect();
        let mut joined = Events::default();
        for part in v.chunks(700) {
            joined.append(part.iter().copied().collect());
        }
        assert_eq!(joined.words, pushed.words);
        assert_eq!(joined.streams, pushed.streams);
        assert_eq!(joined.wide, pushed.wide);
        assert_eq!(joined.ooms, pushed.ooms);
        assert_eq!(joined.segs, pushed.segs);
        assert_eq!(joined.wide.len(), 16);
        assert_eq!(joined.streams.len(), 16);
        // Copied from chunks held elsewhere too (`tune` reads them), the same.
        let mut copied = Events::default();
        for part in v.chunks(700) {
            copied.extend_from(&part.iter().copied().collect());
        }
        assert_eq!(
            (&copied.words, &copied.streams, &copied.wide, &copied.ooms, &copied.segs),
            (&pushed.words, &pushed.streams, &pushed.wide, &pushed.ooms, &pushed.segs)
        );
        let actions: Vec<Action> = joined.view().slice(10..).actions().collect();
        assert_eq!(actions, v[10..].iter().map(|e| e.action).collect::<Vec<_>>());
    }

    /// The OOMs' indices are those a scan of every event finds, in a
    /// slice, after appending and after dropping the front.
    #[test]
    fn ooms_are_found_without_reading_every_event() {
        let v: Vec<Event> = (0..3000u64)
            .map(|i| Event::new(if i % 97 == 5 || i == 2999 { Action::Oom } else { Action::Alloc }, i << 9, 512, i % 3))
            .collect();
        let scan = |v: &[Event]| {
            v.iter().enumerate().filter(|(_, e)| e.action == Action::Oom).map(|(i, _)| i).collect::<Vec<_>>()
        };
        let col: Events = v.iter().copied().collect();
        assert_eq!(col.ooms().collect::<Vec<_>>(), scan(&v));
        assert_eq!(col.ooms().count(), 32);
        assert_eq!(col.view().slice(102..2999).ooms().collect::<Vec<_>>(), scan(&v[102..2999]));
        assert_eq!(col.view().slice(100..2000).slice(5..).ooms().next(), Some(199 - 105));
        let mut joined = Events::default();
        for part in v.chunks(700) {
            joined.append(part.iter().copied().collect());
        }
        assert_eq!(joined.ooms().collect::<Vec<_>>(), scan(&v));
        joined.drain_front(1000);
        assert_eq!(joined.ooms().collect::<Vec<_>>(), scan(&v[1000..]));
        assert_eq!(Events::default().ooms().next(), None);
    }

    /// The segment events' indices are those a scan finds, in a slice,
    /// after appending and after dropping the front.
    #[test]
    fn segment_events_are_found_without_reading_every_event() {
        let v: Vec<Event> = (0..3000u64)
            .map(|i| {
                let action = [Action::SegmentAlloc, Action::SegmentFree, Action::SegmentMap, Action::SegmentUnmap]
                    .get((i % 89) as usize)
                    .copied()
                    .unwrap_or(if i % 2 == 0 { Action::Alloc } else { Action::FreeCompleted });
                Event::new(action, i << 9, 512, i % 3)
            })
            .collect();
        let scan = |v: &[Event]| {
            v.iter().enumerate().filter(|(_, e)| e.action.is_segment()).map(|(i, _)| i).collect::<Vec<_>>()
        };
        let col: Events = v.iter().copied().collect();
        assert_eq!(col.segment_events().collect::<Vec<_>>(), scan(&v));
        assert_eq!(col.segment_events().count(), 34 * 4);
        assert_eq!(col.view().slice(90..2999).segment_events().collect::<Vec<_>>(), scan(&v[90..2999]));
        let mut joined = Events::default();
        for part in v.chunks(700) {
            joined.append(part.iter().copied().collect());
        }
        assert_eq!(joined.segment_events().collect::<Vec<_>>(), scan(&v));
        joined.drain_front(1000);
        assert_eq!(joined.segment_events().collect::<Vec<_>>(), scan(&v[1000..]));
    }
}
