//! A snapshot's trace entries become columns (events packed, times as
//! offsets, stack ids) on a thread of their own: the decoding thread, which
//! applies entries in file order and bounds a long file's time, only hands
//! each entry over as a plain row (docs/design/trace-decoding.md, "The
//! columns on a thread of their own"). Where a tap takes the events as they
//! come (the replay behind the decoding), this thread hands them to it.

use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::prefault::Room;
use super::{Tap, Times};
use crate::alloc::{Event, Events};

/// One entry as its columns keep it.
#[derive(Clone, Copy)]
pub(super) struct Row {
    pub(super) event: Event,
    pub(super) time_us: i64,
    pub(super) stack: u32,
}

/// Rows handed over at a time: 384 KiB of them.
const BATCH: usize = 8192;
/// Batches waiting at most: the decoding thread waits past that, so what is
/// in flight stays a few MiB.
const IN_FLIGHT: usize = 8;

/// The columns, and the tap they are handed to a chunk at a time.
#[derive(Default)]
pub(super) struct Columns {
    pub(super) events: Events,
    pub(super) time_us: Times,
    pub(super) stack: Vec<u32>,
    tap: Option<Tap>,
    /// Set by the first chunk handed to the tap.
    ahead: Option<Box<Ahead>>,
}

/// The rooms of the first chunk handed to the tap (its events and their
/// stacks), which the tap's thread copies every later chunk into: their
/// pages are faulted in here, two chunks ahead of what is handed over.
struct Ahead {
    rooms: [Room; 2],
    handed: usize,
    faulted: usize,
}

impl Columns {
    /// Empty columns with room for `n` rows (a hint from the file: a failed
    /// reservation just means growing as usual), handing events to `tap`.
    fn with_room(n: usize, tap: Option<Tap>) -> Columns {
        let mut c = Columns { tap, ..Columns::default() };
        let _ = c.events.try_reserve(n);
        let _ = c.time_us.try_reserve(n);
        let _ = c.stack.try_reserve(n);
        c
    }

    fn take(&mut self, rows: &[Row]) {
        for r in rows {
            self.events.push(r.event);
            self.time_us.push(r.time_us);
            self.stack.push(r.stack);
            if let Some(tap) = self.tap.as_ref().filter(|t| self.events.len() >= t.chunk) {
                // The first chunk carries the room reserved for them all.
                let events = std::mem::replace(&mut self.events, Events::with_capacity(tap.chunk));
                let stacks = std::mem::replace(&mut self.stack, Vec::with_capacity(tap.chunk));
                let ahead = self.ahead.get_or_insert_with(|| {
                    let (addr, elem, cap) = events.room();
                    Box::new(Ahead { rooms: [Room::new(addr, elem, cap), Room::of(&stacks)], handed: 0, faulted: 0 })
                });
                ahead.handed += events.len();
                tap.to.events(events, stacks);
                // This thread waits for the decoding most of the time; the
                // tap's does not (docs/design/trace-decoding.md, "Pages
                // faulted ahead").
                let to = ahead.handed + 2 * tap.chunk;
                for room in &ahead.rooms {
                    room.fault_in(ahead.faulted.max(ahead.handed), to);
                }
                ahead.faulted = to;
            }
        }
    }

    /// Every event and stack back from the tap, if one took them;
    /// `whole`: the device whose events they all are, in order.
    fn finish(mut self, whole: Option<i32>) -> Made {
        let Some(tap) = self.tap.take() else { return self.made() };
        let (events, stack) = tap.to.finish(self.events, self.stack, whole);
        Made { events, time_us: self.time_us, stack }
    }

    /// These columns as they stand, shared with no one.
    fn made(self) -> Made {
        Made { events: Arc::new(self.events), time_us: self.time_us, stack: Arc::new(self.stack) }
    }
}

/// The columns made, the events and stacks shared with the tap's thread
/// where one took them (it may still be reading them).
#[derive(Default)]
pub(super) struct Made {
    pub(super) events: Arc<Events>,
    pub(super) time_us: Times,
    pub(super) stack: Arc<Vec<u32>>,
}

enum Handed {
    Rows(Vec<Row>),
    Done(Option<i32>),
}

/// Where the decoding thread puts each entry's row.
pub(super) struct Rows {
    sink: Sink,
    /// Rows given so far.
    count: usize,
}

enum Sink {
    /// A thread makes the columns, handed the rows a batch at a time.
    Thread {
        batch: Vec<Row>,
        rows: SyncSender<Handed>,
        /// Batches the thread is done with, to be filled again (a fresh
        /// one costs a page fault per page).
        back: Receiver<Vec<Row>>,
        thread: JoinHandle<Made>,
    },
    /// Where the system gives no thread: the columns made here.
    Here(Box<Columns>),
    /// The columns were taken (`finish`).
    Taken,
}

impl Default for Rows {
    /// Rows made into columns on the thread that gives them.
    fn default() -> Rows {
        Rows { sink: Sink::Here(Box::default()), count: 0 }
    }
}

impl Rows {
    /// Rows for columns with room for `n` (see `Columns::with_room`), their
    /// events handed to `tap` as they come.
    pub(super) fn new(n: usize, tap: Option<Tap>) -> Rows {
        let (rows, from) = sync_channel(IN_FLIGHT);
        let (give_back, back) = channel();
        let for_thread = tap.clone();
        let spawned =
            std::thread::Builder::new().name("columns".into()).spawn(move || build(n, for_thread, from, give_back));
        let sink = match spawned {
            Ok(thread) => Sink::Thread { batch: Vec::with_capacity(BATCH), rows, back, thread },
            Err(_) => Sink::Here(Box::new(Columns::with_room(n, tap))),
        };
        Rows { sink, count: 0 }
    }

    /// Rows given so far.
    pub(super) fn len(&self) -> usize {
        self.count
    }

    #[inline]
    pub(super) fn push(&mut self, row: Row) {
        self.count += 1;
        match &mut self.sink {
            Sink::Thread { batch, rows, back, .. } => {
                batch.push(row);
                if batch.len() >= BATCH {
                    let next = back.try_recv().unwrap_or_else(|_| Vec::with_capacity(BATCH));
                    // A thread gone has panicked, which `finish` passes on.
                    let _ = rows.send(Handed::Rows(std::mem::replace(batch, next)));
                }
            }
            Sink::Here(cols) => cols.take(std::slice::from_ref(&row)),
            Sink::Taken => {}
        }
    }

    /// The columns of every row; `whole`: the device whose events they all
    /// are, in order (for the tap).
    pub(super) fn finish(&mut self, whole: Option<i32>) -> Made {
        match std::mem::replace(&mut self.sink, Sink::Taken) {
            Sink::Thread { batch, rows, thread, .. } => {
                let _ = rows.send(Handed::Rows(batch));
                let _ = rows.send(Handed::Done(whole));
                drop(rows);
                thread.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
            }
            Sink::Here(cols) => cols.finish(whole),
            Sink::Taken => Made::default(),
        }
    }
}

/// The thread: rows appended to the columns as they come, the batches given
/// back; a decoding that stopped (a bad file) leaves with what it has.
fn build(n: usize, tap: Option<Tap>, from: Receiver<Handed>, back: Sender<Vec<Row>>) -> Made {
    let mut cols = Columns::with_room(n, tap);
    while let Ok(h) = from.recv() {
        match h {
            Handed::Rows(mut rows) => {
                cols.take(&rows);
                rows.clear();
                let _ = back.send(rows);
            }
            Handed::Done(whole) => return cols.finish(whole),
        }
    }
    cols.made()
}
