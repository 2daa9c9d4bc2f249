//! Trace entries read straight from the pickle's bytes, on one thread or
//! several (docs/design/trace-decoding.md).
//!
//! A trace entry is a dict laid out as Python's pickler writes it:
//! `EMPTY_DICT MEMOIZE MARK (key value)* SETITEMS`, every key a memoized
//! string. Reading one is split in two: `lex_entry` finds the entry's
//! fields and the memo slots it names from its bytes alone (it needs no memo
//! and no `Rc`, so it can run on any thread), then `resolve` looks the
//! slots up and `apply` stores what the entry memoizes, in order. Anything
//! else goes to the generic decoder, which is the reference.
//!
//! Several threads: from a window of the input, each worker lexes the
//! entries of its share, starting at the first byte sequence that looks
//! like an entry's start. A share is taken only where the one before it
//! ended exactly there (so a start that was a guess inside some value is
//! never believed), and the main thread resolves and applies the entries in
//! file order while the later shares are still being lexed: the memo, the
//! interned stacks and every id come out as one thread would make them.

use std::collections::HashMap;
use std::io::Read;
use std::rc::Rc;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;

use super::{Compactor, EntryFields, FastHash, List, Memo, PickleError, Shared, Tuple, Value, Vm};

/// How runs of trace entries are read on several threads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Parallel {
    /// Threads that lex (1: all on the decoding thread).
    pub(crate) workers: usize,
    /// Bytes of input each worker lexes at a time, on average.
    pub(crate) share: usize,
    /// Each share this many percent longer than the one before (0: all
    /// alike), so that the decoding thread waits only for a short first.
    pub(crate) grow: u32,
    /// Entries read on one thread before the first attempt.
    pub(crate) first_after: u32,
    /// … and after a run that broke off early.
    pub(crate) retry_after: u32,
}

impl Default for Parallel {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        // Past 16 workers the main thread, which applies every entry, is
        // the bound (docs/design/trace-decoding.md).
        // The decoding thread applies a share in about a third of the time
        // a worker lexes it: shares a quarter longer each are lexed before
        // it reaches them (docs/design/trace-decoding.md, "Shares that
        // grow").
        Parallel { workers: cores.min(16), share: 1 << 18, grow: 25, first_after: 256, retry_after: 4096 }
    }
}

impl Parallel {
    /// Everything on the decoding thread.
    #[cfg(test)]
    pub(crate) fn off() -> Parallel {
        Parallel { workers: 1, ..Parallel::default() }
    }
}

/// Memo slots an entry stores, in order, once it is accepted.
pub(super) enum Put {
    Dict,
    /// A memoized string: where its bytes are in the buffer lexed.
    Str(std::ops::Range<usize>),
    FramesList,
    /// A memoized `pool_id` tuple.
    Pool(i64, i64),
}

/// A memo slot an entry stores, compact where it has a compact form.
enum Slot {
    Compact(u32),
    Value(Value),
}

/// What the fast path found for a `frames` value.
pub(super) enum Frames {
    None,
    /// A stack already interned.
    Stack(u32),
    /// A memoized list not yet interned (its memo slot is released after).
    List(Shared<List>),
    /// A list built in the entry: its frame values are in `FastEntry::items`.
    Inline,
}

/// A string value of an entry.
#[derive(Debug, Clone, Default, PartialEq)]
enum Text {
    #[default]
    Absent,
    /// Its bytes in the buffer lexed.
    At(std::ops::Range<usize>),
    /// A memo slot.
    Get(u32),
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
enum RawFrames {
    #[default]
    Absent,
    Get(u32),
    /// A list written in the entry: its items' memo slots, a range of the
    /// lexer's `items`.
    Inline {
        first: u32,
        n: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum RawPool {
    Get(u32),
    Pair(u64, u64),
}

/// One entry as `lex_entry` read it: values and the memo slots they name.
#[derive(Debug, Clone, Default, PartialEq)]
struct RawEntry {
    /// Its first byte after the EMPTY_DICT, in the buffer lexed.
    at: usize,
    len: usize,
    action: Option<u32>,
    addr: Option<u64>,
    device_free: Option<u64>,
    size: Option<u64>,
    stream: Option<u64>,
    time_us: Option<i64>,
    frames: RawFrames,
    pool: Option<RawPool>,
    user_metadata: Text,
    internal_metadata: Text,
    /// Its memo stores, a range of the lexer's `puts`.
    puts: std::ops::Range<usize>,
    /// What a worker resolved of it, where it could.
    ready: Option<Ready>,
}

impl RawEntry {
    /// The memo slots of the frame dicts its frames list names, where the
    /// list is written in the entry.
    fn inline_frames<'s>(&self, slots: &'s [u32]) -> Option<&'s [u32]> {
        match self.frames {
            RawFrames::Inline { first, n } => slots.get(first as usize..first as usize + n as usize),
            _ => None,
        }
    }
}

/// The fast path's reused buffers.
#[derive(Default)]
pub(super) struct FastEntry {
    puts: Vec<Put>,
    slots: Vec<u32>,
    items: Vec<Value>,
    /// What the workers resolve entries from, and what was learned since
    /// they last read it.
    known: Known,
    learning: Learning,
    /// The workers' shares, kept from one run to the next: fresh vectors
    /// for every run cost a page fault per page they touched
    /// (docs/design/trace-decoding.md, "What it costs").
    shares: Vec<Share>,
    /// The threads that lex the shares, started at the first window.
    lexers: Option<Lexers>,
}

/// A window's bytes and what the workers read entries by, shared with them
/// while they lex; the decoding thread takes them back once every share is.
#[derive(Clone)]
struct Window {
    bytes: Arc<Box<[u8]>>,
    keys: Arc<[(u32, u8)]>,
    known: Arc<Known>,
}

/// Where share `i` of `n` starts in `window` (`i == n`: where the last
/// ends), each `grow` percent longer than the one before.
fn share_start(window: std::ops::Range<usize>, n: usize, grow: u32, i: usize) -> usize {
    if i >= n {
        return window.end;
    }
    let g = 1.0 + f64::from(grow) / 100.0;
    let weight = |k: usize| g.powi(i32::try_from(k).unwrap_or(i32::MAX));
    let (before, all): (f64, f64) = ((0..i).map(weight).sum(), (0..n).map(weight).sum());
    let at = window.start + (window.len() as f64 * before / all) as usize;
    at.min(window.end)
}

/// One share to lex: where, with what, into which reused buffers.
struct Job {
    share: Share,
    window: Window,
    bounds: (usize, usize),
    /// The window's bytes end here.
    end: usize,
    guess: bool,
}

/// Threads that lex shares, kept for the whole decoding: a window's
/// threads started and joined for it cost the decoding thread 40–55 µs
/// each, three thousand times for a 10M trace
/// (docs/design/trace-decoding.md, "Several threads").
struct Lexers {
    workers: Vec<Lexer>,
}

struct Lexer {
    jobs: Option<Sender<Job>>,
    done: Receiver<Share>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Lexers {
    /// Up to `n` threads, as many as the system gives.
    fn start(n: usize) -> Lexers {
        let mut workers = Vec::with_capacity(n);
        for _ in 0..n {
            let (jobs, inbox) = std::sync::mpsc::channel::<Job>();
            let (outbox, done) = std::sync::mpsc::channel::<Share>();
            let lex = move || {
                while let Ok(Job { mut share, window, bounds, end, guess }) = inbox.recv() {
                    let bytes = window.bytes.get(..end).unwrap_or(&window.bytes);
                    lex_share(&mut share, bytes, bounds, guess, &window.keys, &window.known);
                    // The window goes back before the share, so that the
                    // decoding thread holds it alone once every share is in.
                    drop(window);
                    if outbox.send(share).is_err() {
                        return;
                    }
                }
            };
            let Ok(thread) = std::thread::Builder::new().name("lex".into()).spawn(lex) else { break };
            workers.push(Lexer { jobs: Some(jobs), done, thread: Some(thread) });
        }
        Lexers { workers }
    }

    /// Worker `i`'s share; its panic passed on.
    fn share(&mut self, i: usize) -> Share {
        let w = &mut self.workers[i];
        match w.done.recv() {
            Ok(s) => s,
            Err(_) => {
                let thread = w.thread.take().map(|t| t.join());
                match thread {
                    Some(Err(p)) => std::panic::resume_unwind(p),
                    _ => panic!("a lexing thread stopped"),
                }
            }
        }
    }
}

impl Drop for Lexers {
    fn drop(&mut self) {
        for w in &mut self.workers {
            w.jobs = None;
        }
        for w in &mut self.workers {
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
    }
}

/// What the decoding thread learned of memo slots, so that an entry naming
/// only such slots is resolved from them alone: on a worker, off the
/// decoding thread, as it is lexed (docs/design/trace-decoding.md, "Entries
/// resolved on the workers"). Most entries name the same action strings,
/// the same few thousand lists of frame dicts, the same metadata string and
/// pool tuple, and a slot names the same value until it is written over, so
/// what a slot gave once it gives again. The workers read it during a
/// window; the decoding thread takes in what it learned after (`Learning`),
/// and forgets it all when a slot it could have learned from is written
/// over (`Memo::overwrites`).
#[derive(Default)]
struct Known {
    /// `Memo::overwrites` when these were learned: any change forgets them.
    overwrites: u64,
    /// Interned stacks by the memo slots of the frame dicts a list written
    /// in the entry names.
    by_slots: HashMap<Box<[u32]>, u32, FastHash>,
    /// Action strings' slots and the compactor's codes for them.
    actions: Vec<(u32, u8)>,
    /// Metadata strings' slots, and whether each says `mallocWithAddress`.
    texts: Vec<(u32, bool)>,
    /// `pool_id` tuples' slots and their pairs.
    pools: Vec<(u32, (u64, u64))>,
}

/// One thing the decoding thread learned of a slot during a window.
enum Learned {
    Slots(Box<[u32]>, u32),
    Action(u32, u8),
    Text(u32, bool),
    Pool(u32, (u64, u64)),
}

/// What a worker resolved of an entry: with its lexed fields, all the
/// decoding thread needs to store it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Ready {
    /// The compactor's code for its action (`Compactor::action_code`).
    action: u8,
    stack: u32,
    exact: bool,
    pool: Option<(u64, u64)>,
}

impl Known {
    /// Bounded like the interner's own table of frame lists.
    const MOST: usize = 1 << 16;
    /// Action and metadata strings are a handful; a file with more reads
    /// the rest on the decoding thread.
    const FEW: usize = 16;

    fn stack_of_slots(&self, memo: &Memo, slots: &[u32]) -> Option<u32> {
        (self.overwrites == memo.overwrites).then(|| self.by_slots.get(slots).copied()).flatten()
    }

    /// Takes in what was learned since the last time, forgetting everything
    /// if a slot was written over since.
    fn merge(&mut self, memo: &Memo, learned: &mut Learning) {
        if self.overwrites != memo.overwrites {
            *self = Known { overwrites: memo.overwrites, ..Known::default() };
        }
        if learned.overwrites != memo.overwrites {
            learned.items.clear();
            return;
        }
        for l in learned.items.drain(..) {
            match l {
                Learned::Slots(k, v) if self.by_slots.len() < Self::MOST => {
                    self.by_slots.insert(k, v);
                }
                Learned::Action(k, v) => add_slot(&mut self.actions, k, v),
                Learned::Text(k, v) => add_slot(&mut self.texts, k, v),
                Learned::Pool(k, v) => add_slot(&mut self.pools, k, v),
                Learned::Slots(..) => {}
            }
        }
    }

    /// An entry resolved from what is known of the slots it names; `None`
    /// where it names any other (the decoding thread resolves it).
    fn ready(&self, e: &RawEntry, items: &[u32], buf: &[u8]) -> Option<Ready> {
        let slot = e.action?;
        let action = of_slot(&self.actions, slot)?;
        // A memoized list's stack is the decoding thread's to read: the
        // list is most often stored in the same window (PyTorch gives a
        // block's free the list its allocation stored, a few entries
        // before), where no worker can know its slot.
        let stack = match e.frames {
            RawFrames::Absent | RawFrames::Get(_) => 0,
            RawFrames::Inline { .. } => *self.by_slots.get(e.inline_frames(items)?)?,
        };
        let pool = match e.pool {
            None => None,
            Some(RawPool::Pair(a, b)) => Some((a, b)),
            Some(RawPool::Get(slot)) => Some(of_slot(&self.pools, slot)?),
        };
        let exact = |t: &Text| -> Option<bool> {
            Some(match t {
                Text::Absent => false,
                Text::At(r) => buf.get(r.clone())?.ends_with(EXACT),
                Text::Get(slot) => of_slot(&self.texts, *slot)?,
            })
        };
        let exact = exact(&e.user_metadata)? | exact(&e.internal_metadata)?;
        Some(Ready { action, stack, exact, pool })
    }
}

/// What a small table of slots (`Known`'s actions, texts, pools) says of
/// `slot`.
fn of_slot<T: Copy>(table: &[(u32, T)], slot: u32) -> Option<T> {
    table.iter().find(|a| a.0 == slot).map(|a| a.1)
}

/// Adds `slot` to a small table where it is new and there is room.
fn add_slot<T>(table: &mut Vec<(u32, T)>, slot: u32, v: T) {
    if table.len() < Known::FEW && !table.iter().any(|a| a.0 == slot) {
        table.push((slot, v));
    }
}

/// What the decoding thread learned during a window, taken in by
/// `Known::merge` after it.
#[derive(Default)]
struct Learning {
    /// `Memo::overwrites` when these were learned.
    overwrites: u64,
    items: Vec<Learned>,
}

impl Learning {
    /// Learned now: what was learned before a slot was written over goes.
    fn learn(&mut self, memo: &Memo, l: Learned) {
        if self.overwrites != memo.overwrites {
            self.items.clear();
            self.overwrites = memo.overwrites;
        }
        self.items.push(l);
    }

    fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// The decoding thread's buffers an entry is applied with.
struct Scratch<'a> {
    items: &'a mut Vec<Value>,
    known: &'a Known,
    learning: &'a mut Learning,
}

/// Bytes a window holds for its first entry besides the workers' shares
/// (Python's pickler writes an entry in a few hundred).
const FIRST_ROOM: usize = 1 << 16;

/// The metadata that marks an exact-address allocation's entry.
const EXACT: &[u8] = b"mallocWithAddress";

/// Why an entry was not lexed.
#[derive(Debug, PartialEq)]
enum Miss {
    /// A key's memo slot not yet known: the caller may learn it and retry.
    Key(u32),
    /// Not an entry this path reads (or not all in the buffer).
    Other,
}

impl From<std::num::TryFromIntError> for Miss {
    fn from(_: std::num::TryFromIntError) -> Miss {
        Miss::Other
    }
}

/// The field a trace entry's key names (0 action, 1 addr, 2 device_free,
/// 3 size, 4 stream, 5 time_us, 6 frames, 7 compile_context, 8 pool_id,
/// 9 user_metadata, 10 internal_metadata).
fn field_named(k: &str) -> Option<u8> {
    Some(match k {
        "action" => 0,
        "addr" => 1,
        "device_free" => 2,
        "size" => 3,
        "stream" => 4,
        "time_us" => 5,
        "frames" => 6,
        "compile_context" => 7,
        "pool_id" => 8,
        "user_metadata" => 9,
        "internal_metadata" => 10,
        _ => return None,
    })
}

/// Where the lexer is in the bytes.
struct Lex<'b> {
    buf: &'b [u8],
    p: usize,
}

impl Lex<'_> {
    fn byte(&mut self) -> Result<u8, Miss> {
        let b = *self.buf.get(self.p).ok_or(Miss::Other)?;
        self.p += 1;
        Ok(b)
    }

    /// The next opcode, past any FRAME: the pickler starts a frame between
    /// any two values, so one can fall inside an entry.
    fn op(&mut self) -> Result<u8, Miss> {
        loop {
            let b = self.byte()?;
            if b != 0x95 {
                return Ok(b);
            }
            self.take(8)?;
        }
    }

    fn take(&mut self, n: usize) -> Result<&[u8], Miss> {
        let w = self.buf.get(self.p..self.p.checked_add(n).ok_or(Miss::Other)?).ok_or(Miss::Other)?;
        self.p += n;
        Ok(w)
    }

    /// A MEMOIZE right here (the pickler writes it right after the value).
    fn memoized(&mut self) -> bool {
        let m = self.buf.get(self.p) == Some(&0x94);
        self.p += usize::from(m);
        m
    }

    /// A BINGET or LONG_BINGET's index (`op` read).
    fn index(&mut self, op: u8) -> Result<u32, Miss> {
        match op {
            b'h' => self.byte().map(u32::from),
            b'j' => self.take(4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])),
            _ => Err(Miss::Other),
        }
    }

    /// BININT1, BININT2, BININT or an up to 8-byte LONG1 (`op` read).
    fn int(&mut self, op: u8) -> Result<i64, Miss> {
        Ok(match op {
            b'K' => i64::from(self.byte()?),
            b'M' => self.take(2).map(|w| i64::from(u16::from_le_bytes([w[0], w[1]])))?,
            b'J' => self.take(4).map(|w| i64::from(i32::from_le_bytes([w[0], w[1], w[2], w[3]])))?,
            0x8a => {
                let n = self.byte()? as usize;
                if !(1..=8).contains(&n) {
                    return Err(Miss::Other);
                }
                let w = self.take(n)?;
                // Byte by byte: a copy of a run-time length calls memcpy.
                let mut v = w.iter().rev().fold(0i64, |v, &x| v << 8 | i64::from(x));
                if n < 8 && w[n - 1] & 0x80 != 0 {
                    v |= -1i64 << (8 * n);
                }
                v
            }
            _ => return Err(Miss::Other),
        })
    }

    fn uint(&mut self, op: u8) -> Result<u64, Miss> {
        Ok(u64::try_from(self.int(op)?)?)
    }

    /// A SHORT_BINUNICODE (its opcode read): where its bytes are; one
    /// memoized takes a memo slot.
    fn short_str(&mut self, puts: &mut Vec<Put>) -> Result<std::ops::Range<usize>, Miss> {
        let n = self.byte()? as usize;
        let start = self.p;
        self.take(n)?;
        if self.memoized() {
            puts.push(Put::Str(start..start + n));
        }
        Ok(start..start + n)
    }

    /// An entry's `frames` (`op` read): a memo slot, or a list written in
    /// the entry whose items are memo slots (frame dicts seen before).
    fn frames(&mut self, op: u8, puts: &mut Vec<Put>, items: &mut Vec<u32>) -> Result<RawFrames, Miss> {
        match op {
            b'h' | b'j' => Ok(RawFrames::Get(self.index(op)?)),
            b']' => {
                if self.memoized() {
                    puts.push(Put::FramesList);
                }
                let first = u32::try_from(items.len())?;
                let at = self.p;
                match self.op()? {
                    b'(' => loop {
                        let op = self.op()?;
                        if op == b'e' {
                            break;
                        }
                        items.push(self.index(op)?);
                    },
                    // One frame (`BINGET idx APPEND`), or an empty list and
                    // the entry's next key (2.12+ writes `pool_id` after
                    // `frames`).
                    op @ (b'h' | b'j') => {
                        let idx = self.index(op)?;
                        if self.op()? == b'a' {
                            items.push(idx);
                        } else {
                            self.p = at;
                        }
                    }
                    _ => self.p = at,
                }
                let n = u32::try_from(items.len())? - first;
                Ok(RawFrames::Inline { first, n })
            }
            _ => Err(Miss::Other),
        }
    }
}

/// Lexes the entry whose bytes start at `at` (its EMPTY_DICT read), keys
/// named by `keys` (memo slot, field). Its memo stores go to `puts`, its
/// inline frames' slots to `items`.
fn lex_entry(
    buf: &[u8],
    at: usize,
    keys: &[(u32, u8)],
    puts: &mut Vec<Put>,
    items: &mut Vec<u32>,
) -> Result<RawEntry, Miss> {
    let mut c = Lex { buf, p: at };
    let first_put = puts.len();
    puts.push(Put::Dict);
    if c.byte()? != 0x94 || c.op()? != b'(' {
        return Err(Miss::Other);
    }
    let mut e = RawEntry { at, ..RawEntry::default() };
    let mut seen = 0u16;
    loop {
        let op = c.op()?;
        if op == b'u' {
            break;
        }
        // The key: a memoized string, each once (a dict that repeats a
        // key goes to the generic decoder, which keeps the last).
        let slot = c.index(op)?;
        let field = keys.iter().find(|k| k.0 == slot).map(|k| k.1).ok_or(Miss::Key(slot))?;
        if seen & 1 << field != 0 {
            return Err(Miss::Other);
        }
        seen |= 1 << field;
        let op = c.op()?;
        match field {
            0 => e.action = Some(c.index(op)?),
            1 => e.addr = Some(c.uint(op)?),
            2 => e.device_free = Some(c.uint(op)?),
            3 => e.size = Some(c.uint(op)?),
            4 => e.stream = Some(c.uint(op)?),
            5 => e.time_us = Some(c.int(op)?),
            6 => e.frames = c.frames(op, puts, items)?,
            8 => {
                e.pool = Some(match op {
                    b'h' | b'j' => RawPool::Get(c.index(op)?),
                    _ => {
                        let a = c.int(op)?;
                        let op = c.op()?;
                        let b = c.int(op)?;
                        if c.op()? != 0x86 {
                            return Err(Miss::Other);
                        }
                        if c.memoized() {
                            puts.push(Put::Pool(a, b));
                        }
                        RawPool::Pair(u64::try_from(a)?, u64::try_from(b)?)
                    }
                })
            }
            9 | 10 => {
                let text = match op {
                    0x8c => Text::At(c.short_str(puts)?),
                    b'h' | b'j' => Text::Get(c.index(op)?),
                    _ => return Err(Miss::Other),
                };
                match field {
                    9 => e.user_metadata = text,
                    _ => e.internal_metadata = text,
                }
            }
            // compile_context: skipped, a memoized string still takes its slot.
            _ => match op {
                0x8c => {
                    c.short_str(puts)?;
                }
                b'h' | b'j' => {
                    c.index(op)?;
                }
                b'N' | 0x88 | 0x89 => {}
                _ => return Err(Miss::Other),
            },
        }
    }
    e.len = c.p - at;
    e.puts = first_put..puts.len();
    Ok(e)
}

/// A step of a run of entries, in file order.
enum Step {
    /// An entry: an index into `Share::entries`.
    Entry(usize),
    /// MARK, APPENDS or APPEND between entries (the pickler appends a list's
    /// items a thousand at a time), at this offset.
    Op(u8, usize),
}

/// Why a share's lexing stopped where it did.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stop {
    /// At the first entry at or past the share's end: the next share
    /// should have started here.
    Boundary,
    /// The buffer ended (mid-entry, or it is the last share).
    End,
    /// Something this path does not read: the generic decoder goes on.
    Other,
}

/// What one worker lexed.
#[derive(Default)]
struct Share {
    /// Where its first entry's EMPTY_DICT is (the first share: just past it).
    start: usize,
    steps: Vec<Step>,
    entries: Vec<RawEntry>,
    puts: Vec<Put>,
    items: Vec<u32>,
    /// Where it stopped, and why.
    end: usize,
    stop: Option<Stop>,
}

/// The first offset at or past `from` that looks like an entry's start
/// (`EMPTY_DICT MEMOIZE MARK`); a guess the caller checks.
fn entry_start(buf: &[u8], from: usize) -> Option<usize> {
    let rest = buf.get(from..)?;
    rest.windows(3).position(|w| w == b"}\x94(").map(|i| from + i)
}

/// Lexes into `s` (cleared first) the entries from `from` (a guess at the
/// first entry's start when `guess`) to the first entry at or past `to`.
/// Each entry whose slots `known` knows is resolved too.
fn lex_share(s: &mut Share, buf: &[u8], (from, to): (usize, usize), guess: bool, keys: &[(u32, u8)], known: &Known) {
    s.steps.clear();
    s.entries.clear();
    s.puts.clear();
    s.items.clear();
    let start = if guess { entry_start(buf, from) } else { Some(from) };
    let Some(mut p) = start else {
        s.start = buf.len();
        s.end = buf.len();
        s.stop = Some(Stop::End);
        return;
    };
    s.start = p;
    // Python's pickler writes an entry in 80 bytes or more.
    let n = to.saturating_sub(from) / 64;
    s.entries.reserve(n);
    s.steps.reserve(n + n / 512);
    s.puts.reserve(2 * n);
    let stop = loop {
        // Between entries: frames, and the list's MARK and APPENDS.
        match buf.get(p) {
            None => break Stop::End,
            Some(0x95) if p + 9 > buf.len() => break Stop::End,
            Some(0x95) => {
                p += 9;
                continue;
            }
            Some(&op @ (b'(' | b'e' | b'a')) => {
                s.steps.push(Step::Op(op, p));
                p += 1;
                continue;
            }
            Some(b'}') => {}
            Some(_) => break Stop::Other,
        }
        if p >= to {
            break Stop::Boundary;
        }
        match lex_entry(buf, p + 1, keys, &mut s.puts, &mut s.items) {
            Ok(mut e) => {
                e.ready = known.ready(&e, &s.items, buf);
                p += 1 + e.len;
                s.steps.push(Step::Entry(s.entries.len()));
                s.entries.push(e);
            }
            // An entry cut by the buffer's end is read again with the next.
            Err(_) if buf.len() - p < 1 << 12 => break Stop::End,
            Err(_) => break Stop::Other,
        }
    };
    s.end = p;
    s.stop = Some(stop);
}

impl<R: Read, C: Compactor> Vm<'_, R, C> {
    /// The fast path for a trace entry (its EMPTY_DICT just read); false
    /// when the generic path must decode it.
    pub(super) fn try_fast_entry(&mut self, offset: u64) -> Result<bool, PickleError> {
        if !self.compactor.fast_entries() || !self.memo_sparse.is_empty() {
            return Ok(false);
        }
        if self.par.workers > 1 && self.par.first_after == 0 {
            return self.parallel_entries(offset);
        }
        let r = self.one_entry(offset);
        if matches!(r, Ok(true)) {
            self.par.first_after = self.par.first_after.saturating_sub(1);
        }
        r
    }

    /// Lexes, resolves and applies the entry at the source's position, with
    /// the reused buffers and the source's bytes taken for the while.
    fn one_entry(&mut self, offset: u64) -> Result<bool, PickleError> {
        let mut e = self.fast.take().unwrap_or_default();
        let buf = std::mem::take(&mut self.src.buf);
        let r = self.entry_in(offset, &buf[..self.src.end], &mut e);
        self.src.buf = buf;
        self.fast = Some(e);
        r
    }

    fn entry_in(&mut self, offset: u64, buf: &[u8], e: &mut FastEntry) -> Result<bool, PickleError> {
        let raw = loop {
            e.puts.clear();
            e.slots.clear();
            match lex_entry(buf, self.src.pos, &self.keys, &mut e.puts, &mut e.slots) {
                Ok(raw) => break raw,
                Err(Miss::Key(slot)) if self.learn_key(slot) => {}
                Err(_) => return Ok(false),
            }
        };
        if !e.learning.is_empty() {
            e.known.merge(&self.memo, &mut e.learning);
        }
        let Some((fields, frames)) = self.resolve(&raw, buf, &e.slots, &mut e.items, &e.known) else {
            return Ok(false);
        };
        let scratch = Scratch { items: &mut e.items, known: &e.known, learning: &mut e.learning };
        self.apply(offset, &raw, buf, (&e.puts, &e.slots), fields, frames, scratch)?;
        Ok(true)
    }

    /// Learns the field a key's memo slot names; false if it names none
    /// (or too many keys are known: the generic path reads the rest).
    fn learn_key(&mut self, slot: u32) -> bool {
        if self.keys.len() >= 16 {
            return false;
        }
        let Some(Value::Str(k)) = self.memo.get(slot as usize) else { return false };
        let Some(field) = field_named(&k) else { return false };
        self.keys.push((slot, field));
        true
    }

    /// The entry's fields and frames from the memo slots it names; `None`
    /// where a slot holds something else (the generic path decides).
    fn resolve(
        &self,
        raw: &RawEntry,
        buf: &[u8],
        slots: &[u32],
        items: &mut Vec<Value>,
        known: &Known,
    ) -> Option<(EntryFields, Frames)> {
        let memo: &Memo = &self.memo;
        let action = match raw.action {
            Some(slot) => Some(memo.get_str(slot as usize)?.clone()),
            None => None,
        };
        let frames = match raw.frames {
            RawFrames::Absent => Frames::None,
            RawFrames::Get(slot) => match memo.get(slot as usize)? {
                Value::Stack(s) => Frames::Stack(s),
                Value::List(l) => Frames::List(l),
                _ => return None,
            },
            RawFrames::Inline { .. } => {
                let named = raw.inline_frames(slots)?;
                match known.stack_of_slots(memo, named) {
                    Some(s) => Frames::Stack(s),
                    None => {
                        items.clear();
                        for &slot in named {
                            match memo.get_ref(slot as usize)? {
                                v @ Value::Dict(_) => items.push(v.clone()),
                                _ => return None,
                            }
                        }
                        Frames::Inline
                    }
                }
            }
        };
        let pool = match raw.pool {
            None => None,
            Some(RawPool::Pair(a, b)) => Some((a, b)),
            Some(RawPool::Get(slot)) => match memo.get_ref(slot as usize)? {
                Value::Tuple(t) => match t.0.as_slice() {
                    [Value::Int(a), Value::Int(b)] => Some((u64::try_from(*a).ok()?, u64::try_from(*b).ok()?)),
                    _ => return None,
                },
                _ => return None,
            },
        };
        let text = |t: &Text| -> Option<Option<&[u8]>> {
            Some(match t {
                Text::Absent => None,
                Text::At(r) => Some(buf.get(r.clone())?),
                Text::Get(slot) => Some(memo.get_str(*slot as usize)?.as_bytes()),
            })
        };
        let (user, internal) = (text(&raw.user_metadata)?, text(&raw.internal_metadata)?);
        let exact = |t: Option<&[u8]>| t.is_some_and(|t| t.ends_with(EXACT));
        let annotate = action.as_deref().is_some_and(|a| a.as_str() == "annotate");
        let fields = EntryFields {
            exact: exact(user) || exact(internal),
            internal: internal.is_some(),
            note: user.filter(|_| annotate).map(|t| Rc::new(String::from_utf8_lossy(t).into_owned())),
            action,
            addr: raw.addr,
            device_free: raw.device_free,
            size: raw.size,
            stream: raw.stream,
            time_us: raw.time_us,
            stack: 0,
            pool,
        };
        Some((fields, frames))
    }

    /// Stores a resolved entry: its stack, its memo slots, the entry; learns
    /// what its slots gave, for the workers.
    #[allow(clippy::too_many_arguments)]
    fn apply(
        &mut self,
        offset: u64,
        raw: &RawEntry,
        buf: &[u8],
        (puts, slots): (&[Put], &[u32]),
        mut fields: EntryFields,
        frames: Frames,
        s: Scratch,
    ) -> Result<(), PickleError> {
        fields.stack = match frames {
            Frames::None => 0,
            Frames::Stack(s) => s,
            Frames::List(l) => {
                let s = self.compactor.stack_of(l.borrow().values());
                let slot = l.borrow().memo;
                if let Some(m) = slot.and_then(|m| self.memo.get_mut(m)) {
                    if matches!(m, Value::List(x) if Rc::ptr_eq(x, &l)) {
                        *m = Value::Stack(s);
                    }
                }
                s
            }
            Frames::Inline => {
                let st = self.compactor.stack_of(s.items);
                s.items.clear();
                if let Some(named) = raw.inline_frames(slots) {
                    s.learning.learn(&self.memo, Learned::Slots(named.into(), st));
                }
                st
            }
        };
        if self.par.workers > 1 {
            self.learn_slots(raw, &fields, s.known, s.learning);
        }
        self.store(offset, raw, buf, puts, &fields, None)
    }

    /// Learns what an entry resolved on this thread gave for the action,
    /// pool and metadata slots it names, where the workers do not know it
    /// yet.
    fn learn_slots(&self, raw: &RawEntry, fields: &EntryFields, known: &Known, learning: &mut Learning) {
        let memo = &self.memo;
        if let (Some(slot), Some(name)) = (raw.action, &fields.action) {
            if of_slot(&known.actions, slot).is_none() {
                if let Some(code) = self.compactor.action_code(name) {
                    learning.learn(memo, Learned::Action(slot, code));
                }
            }
        }
        if let (Some(RawPool::Get(slot)), Some(pool)) = (raw.pool, fields.pool) {
            if of_slot(&known.pools, slot).is_none() {
                learning.learn(memo, Learned::Pool(slot, pool));
            }
        }
        for t in [&raw.user_metadata, &raw.internal_metadata] {
            if let Text::Get(slot) = *t {
                if let (None, Some(text)) = (of_slot(&known.texts, slot), memo.get_str(slot as usize)) {
                    learning.learn(memo, Learned::Text(slot, text.as_bytes().ends_with(EXACT)));
                }
            }
        }
    }

    /// Stores an entry the worker that lexed it resolved.
    fn apply_ready(
        &mut self,
        offset: u64,
        raw: &RawEntry,
        buf: &[u8],
        puts: &[Put],
        r: Ready,
    ) -> Result<(), PickleError> {
        let fields = EntryFields {
            action: None,
            addr: raw.addr,
            device_free: raw.device_free,
            size: raw.size,
            stream: raw.stream,
            time_us: raw.time_us,
            stack: r.stack,
            pool: r.pool,
            exact: r.exact,
            internal: raw.internal_metadata != Text::Absent,
            note: None,
        };
        self.store(offset, raw, buf, puts, &fields, Some(r.action))
    }

    /// Stores an entry whose stack is known: its memo slots, in the order
    /// the pickle stores them, then the entry (by its action's code where
    /// a worker resolved it).
    fn store(
        &mut self,
        offset: u64,
        raw: &RawEntry,
        buf: &[u8],
        puts: &[Put],
        fields: &EntryFields,
        code: Option<u8>,
    ) -> Result<(), PickleError> {
        self.src.pos = raw.at + raw.len;
        // The entry's id first, so that its memo slots are stored as what
        // they end as.
        let next = self.compactor.next_entry();
        let mut dict_slot = None;
        for put in &puts[raw.puts.clone()] {
            // Stored compact where the slot has a compact form, as the memo
            // would keep it once its chunk is full.
            let v = match put {
                Put::Dict => {
                    dict_slot = Some(self.memo.len);
                    match next.and_then(|id| Memo::code_of_id(id, false)) {
                        Some(x) => Slot::Compact(x),
                        None => Slot::Value(next.map_or(Value::None, Value::Entry)),
                    }
                }
                Put::FramesList => match Memo::code_of_id(fields.stack, true) {
                    Some(x) => Slot::Compact(x),
                    None => Slot::Value(Value::Stack(fields.stack)),
                },
                Put::Pool(a, b) => Slot::Value(Value::Tuple(Rc::new(Tuple(vec![Value::Int(*a), Value::Int(*b)])))),
                Put::Str(r) => {
                    let slice = &buf[r.clone()];
                    match self.memo.last_str_code(slice) {
                        Some(x) => Slot::Compact(x),
                        None => Slot::Value(match self.shared_str(slice) {
                            Some(rc) => Value::Str(rc),
                            None => self.string(offset, slice.to_vec())?,
                        }),
                    }
                }
            };
            self.charge(offset, 16)?;
            match v {
                Slot::Compact(x) => self.memo.push_code(x),
                Slot::Value(v) => self.memo.push(v),
            }
        }
        let id = match code {
            Some(c) => self.compactor.entry_coded(c, fields),
            None => self.compactor.entry(fields),
        };
        let id = id.map_err(|m| self.malformed(offset, m))?;
        if let Some(m) = dict_slot.filter(|_| next != Some(id)).and_then(|m| self.memo.get_mut(m)) {
            *m = Value::Entry(id);
        }
        self.push(offset, Value::Entry(id))
    }

    /// Reads the run of entries from here (the first one's EMPTY_DICT just
    /// read) on several threads: see the module's comment.
    fn parallel_entries(&mut self, offset: u64) -> Result<bool, PickleError> {
        let lexers = self.fast.as_mut().and_then(|f| f.lexers.take());
        let mut lexers = lexers.unwrap_or_else(|| Lexers::start(self.par.workers));
        let workers = lexers.workers.len();
        if workers < 2 {
            // The system gives no threads: everything on this one.
            self.par.workers = 1;
            return self.one_entry(offset);
        }
        let size = workers.saturating_mul(self.par.share);
        // The window is read before the first entry, with room for it: the
        // last window's bytes may end inside it, and an entry cut by the
        // buffer's end would go to the generic decoder, whose compaction
        // writes over its slots and so forgets what was learned of them.
        let r = self.src.window(size.saturating_add(FIRST_ROOM));
        // The first on this thread: it learns the keys the workers look for.
        let r = r.and_then(|()| self.one_entry(offset));
        let r = match r {
            Ok(true) => self.lexed_window(&mut lexers, size),
            other => other.map(|_| None),
        };
        if let Some(f) = self.fast.as_mut() {
            f.lexers = Some(lexers);
        }
        let Some((applied, stop)) = r? else { return Ok(false) };
        self.in_parallel += applied as u64;
        // A run that ended in something else is read on one thread for a
        // while, longer when it yielded little, so a file that keeps
        // breaking runs does not pay for threads it cannot use.
        self.par.first_after = match stop {
            Stop::Other if applied < 4096 => self.par.retry_after,
            Stop::Other => self.par.retry_after.min(256),
            Stop::Boundary | Stop::End => 0,
        };
        Ok(true)
    }

    /// The window from the source's position, `size` bytes, lexed by the
    /// workers in shares and applied here in order as each is done: how
    /// many entries, and why the run stopped.
    fn lexed_window(&mut self, lexers: &mut Lexers, size: usize) -> Result<Option<(usize, Stop)>, PickleError> {
        let workers = lexers.workers.len();
        // The source's buffer may hold more than the window: the rest waits.
        let (from, end) = (self.src.pos, self.src.end.min(self.src.pos.saturating_add(size)));
        let mut pool = self.fast.as_mut().map(|f| std::mem::take(&mut f.shares)).unwrap_or_default();
        pool.resize_with(workers, Share::default);
        // What the workers resolve entries from, up to date, read by them
        // and this thread until the window is done.
        let known = (self.fast.as_mut())
            .map(|f| {
                f.known.merge(&self.memo, &mut f.learning);
                std::mem::take(&mut f.known)
            })
            .unwrap_or_default();
        let window = Window {
            bytes: Arc::new(std::mem::take(&mut self.src.buf)),
            keys: self.keys.as_slice().into(),
            known: Arc::new(known),
        };
        let bound = |i: usize| share_start(from..end, workers, self.par.grow, i);
        for (i, share) in pool.drain(..).enumerate() {
            let job = Job { share, window: window.clone(), bounds: (bound(i), bound(i + 1)), end, guess: i > 0 };
            // A thread gone has panicked, which `share` passes on.
            if let Some(jobs) = &lexers.workers[i].jobs {
                let _ = jobs.send(job);
            }
        }
        let (mut applied, mut outcome) = (0usize, None);
        for i in 0..workers {
            let share = lexers.share(i);
            if outcome.is_none() {
                outcome = self.take_share(i, &share, &window, end, &mut applied);
            }
            pool.push(share);
        }
        // Every share is back, and with it the window.
        let Window { bytes, known, .. } = window;
        self.src.buf = Arc::try_unwrap(bytes).unwrap_or_else(|b| b.as_ref().clone());
        if let Some(f) = self.fast.as_mut() {
            f.shares = pool;
            // Held elsewhere (it never is): forgotten, which is only slower.
            f.known = Arc::try_unwrap(known).unwrap_or_default();
        }
        outcome.unwrap_or(Ok(Stop::Boundary)).map(|stop| Some((applied, stop)))
    }

    /// Applies share `i` where it starts where the last one ended; what
    /// stops the run, if anything.
    fn take_share(
        &mut self,
        i: usize,
        share: &Share,
        window: &Window,
        end: usize,
        applied: &mut usize,
    ) -> Option<Result<Stop, PickleError>> {
        // A share whose start was a guess counts only where the one before
        // it ended.
        if i > 0 && share.start != self.src.pos {
            return Some(Ok(Stop::Boundary));
        }
        match self.apply_share(&window.bytes[..end], share, &window.known, applied) {
            Ok(true) => {}
            Ok(false) => return Some(Ok(Stop::Other)),
            Err(e) => return Some(Err(e)),
        }
        self.src.pos = share.end;
        match share.stop {
            Some(Stop::Boundary) => None,
            stop => Some(Ok(stop.unwrap_or(Stop::Other))),
        }
    }

    /// Resolves and applies a share's steps in order; false where an entry
    /// did not resolve (the source is then at its EMPTY_DICT, for the
    /// generic decoder).
    fn apply_share(
        &mut self,
        buf: &[u8],
        share: &Share,
        known: &Known,
        applied: &mut usize,
    ) -> Result<bool, PickleError> {
        let mut e = self.fast.take().unwrap_or_default();
        let mut r = Ok(true);
        for step in &share.steps {
            let res = match *step {
                Step::Entry(k) => {
                    let raw = &share.entries[k];
                    let off = self.src.base + raw.at as u64 - 1;
                    // The stack of a memoized frames list, from the memo.
                    let ready = match (raw.ready, raw.frames) {
                        (Some(r), RawFrames::Get(slot)) => {
                            self.memo.get_stack(slot as usize).map(|stack| Ready { stack, ..r })
                        }
                        (r, _) => r,
                    };
                    if let Some(ready) = ready {
                        *applied += 1;
                        self.apply_ready(off, raw, buf, &share.puts, ready)
                    } else {
                        let Some((fields, frames)) = self.resolve(raw, buf, &share.items, &mut e.items, known) else {
                            self.src.pos = raw.at - 1;
                            r = Ok(false);
                            break;
                        };
                        *applied += 1;
                        let scratch = Scratch { items: &mut e.items, known, learning: &mut e.learning };
                        self.apply(off, raw, buf, (&share.puts, &share.items), fields, frames, scratch)
                    }
                }
                Step::Op(op, at) => {
                    self.src.pos = at + 1;
                    let off = self.src.base + at as u64;
                    if op == b'(' {
                        self.build(off, op)
                    } else {
                        self.fill(off, op)
                    }
                }
            };
            if let Err(err) = res {
                r = Err(err);
                break;
            }
        }
        self.fast = Some(e);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Python's pickler's bytes for two entries in a list, the keys and the
    /// action memoized before (slots 0..=4), a FRAME inside the second.
    fn two_entries() -> Vec<u8> {
        let mut b = Vec::new();
        for (addr, frame_inside) in [(0x7f00u16, false), (0x7f10, true)] {
            b.extend_from_slice(b"}\x94(h\x00h\x01h\x02M");
            b.extend_from_slice(&addr.to_le_bytes());
            if frame_inside {
                b.push(0x95);
                b.extend_from_slice(&[0; 8]);
            }
            b.extend_from_slice(b"h\x03K\x10h\x04]\x94u");
        }
        b
    }

    #[test]
    fn an_entry_is_lexed_from_its_bytes_alone_across_a_frame() {
        let b = two_entries();
        let keys = [(0, 0), (2, 1), (3, 3), (4, 6)];
        let (mut puts, mut items) = (Vec::new(), Vec::new());
        let e = lex_entry(&b, 1, &keys, &mut puts, &mut items).unwrap();
        assert_eq!((e.action, e.addr, e.size), (Some(1), Some(0x7f00), Some(16)));
        assert_eq!(e.frames, RawFrames::Inline { first: 0, n: 0 });
        assert_eq!(e.puts, 0..2);
        assert!(matches!(puts[..], [Put::Dict, Put::FramesList]));
        let second = 1 + e.len;
        assert_eq!(b[second], b'}');
        let f = lex_entry(&b, second + 1, &keys, &mut puts, &mut items).unwrap();
        assert_eq!(f.addr, Some(0x7f10));
        assert_eq!(second + 1 + f.len, b.len());
        // A key not known yet is asked for; a repeated one is refused.
        assert_eq!(lex_entry(&b, 1, &keys[1..], &mut puts, &mut items), Err(Miss::Key(0)));
        let mut twice = b.clone();
        twice[8] = 0; // `h\x02` (addr) becomes `h\x00` (action) again
        assert_eq!(lex_entry(&twice, 1, &keys, &mut puts, &mut items), Err(Miss::Other));
    }

    /// The workers resolve an entry only where every slot it names was
    /// learned (actions, stacks by frame slots, metadata strings, pool
    /// tuples), and nothing learned survives a slot written over, not even
    /// what was learned but not yet taken in.
    #[test]
    fn the_workers_resolve_an_entry_only_from_slots_learned_since_the_last_write_over() {
        let mut memo = Memo::default();
        memo.push(Value::Str(Rc::new("alloc".into())));
        let (mut known, mut learning) = (Known::default(), Learning::default());
        learning.learn(&memo, Learned::Action(1, 0));
        learning.learn(&memo, Learned::Slots(vec![7, 8].into(), 42));
        learning.learn(&memo, Learned::Text(3, true));
        learning.learn(&memo, Learned::Text(4, false));
        learning.learn(&memo, Learned::Pool(12, (1, 2)));
        known.merge(&memo, &mut learning);
        assert!(learning.is_empty());
        let items = [7, 8, 7];
        let e = RawEntry {
            action: Some(1),
            addr: Some(0x7f00),
            frames: RawFrames::Inline { first: 0, n: 2 },
            ..RawEntry::default()
        };
        let ready = |stack, exact| Some(Ready { action: 0, stack, exact, pool: None });
        assert_eq!(known.ready(&e, &items, b""), ready(42, false));
        let with = |f: &dyn Fn(&mut RawEntry)| {
            let mut x = e.clone();
            f(&mut x);
            x
        };
        // Frames by slots not learned; a memoized list (its stack is the
        // decoding thread's to read from the memo).
        assert_eq!(known.ready(&with(&|x| x.frames = RawFrames::Inline { first: 1, n: 2 }), &items, b""), None);
        assert_eq!(known.ready(&with(&|x| x.frames = RawFrames::Get(9)), &items, b""), ready(0, false));
        assert_eq!(known.ready(&with(&|x| x.frames = RawFrames::Absent), &items, b""), ready(0, false));
        // An action slot not learned; a pool by slot (a tuple the decoding
        // thread reads); one written in the entry.
        assert_eq!(known.ready(&with(&|x| x.action = Some(2)), &items, b""), None);
        let pooled = Some(Ready { action: 0, stack: 42, exact: false, pool: Some((1, 2)) });
        assert_eq!(known.ready(&with(&|x| x.pool = Some(RawPool::Get(1))), &items, b""), None);
        assert_eq!(known.ready(&with(&|x| x.pool = Some(RawPool::Get(12))), &items, b""), pooled);
        assert_eq!(known.ready(&with(&|x| x.pool = Some(RawPool::Pair(1, 2))), &items, b""), pooled);
        // Metadata: in the entry's bytes, or a string slot learned (or not).
        let buf = b"xmallocWithAddress";
        let at = with(&|x| x.internal_metadata = Text::At(1..buf.len()));
        assert_eq!(known.ready(&at, &items, buf), ready(42, true));
        assert_eq!(known.ready(&with(&|x| x.user_metadata = Text::Get(3)), &items, b""), ready(42, true));
        assert_eq!(known.ready(&with(&|x| x.user_metadata = Text::Get(4)), &items, b""), ready(42, false));
        assert_eq!(known.ready(&with(&|x| x.user_metadata = Text::Get(5)), &items, b""), None);
        // A slot written over: everything known is forgotten at the next
        // merge, and so is what was learned before the write.
        learning.learn(&memo, Learned::Action(2, 1));
        *memo.get_mut(0).unwrap() = Value::Int(1);
        known.merge(&memo, &mut learning);
        assert_eq!(known.ready(&e, &items, b""), None);
        assert!(known.actions.is_empty());
        assert!(known.by_slots.is_empty() && known.texts.is_empty() && known.pools.is_empty());
    }

    #[test]
    fn a_share_stops_at_the_first_entry_past_its_end_and_a_guess_is_checked() {
        let b = two_entries();
        let keys = [(0, 0), (2, 1), (3, 3), (4, 6)];
        let second = b.iter().skip(1).position(|&x| x == b'}').unwrap() + 1;
        let mut s = Share::default();
        lex_share(&mut s, &b, (0, 1), false, &keys, &Known::default());
        assert_eq!((s.entries.len(), s.end, s.stop), (1, second, Some(Stop::Boundary)));
        assert!(matches!(s.steps[..], [Step::Entry(0)]));
        let mut t = Share::default();
        lex_share(&mut t, &b, (2, b.len()), true, &keys, &Known::default());
        assert_eq!((t.start, t.entries.len(), t.end, t.stop), (second, 1, b.len(), Some(Stop::End)));
        // Bytes that look like an entry's start inside a value are found
        // too: the share before says where entries really start.
        assert_eq!(entry_start(b"\x8a\x03}\x94(}\x94(", 1), Some(2));
    }

    /// The kept threads lex a share as this thread would, window after
    /// window, and give every window back unshared once its shares are in
    /// (else the decoding thread would copy its bytes each time).
    #[test]
    fn kept_lexers_lex_as_this_thread_and_give_the_window_back() {
        let b = crafted(5000);
        let keys: Arc<[(u32, u8)]> = vec![(2, 0), (4, 1), (5, 3), (6, 6)].into();
        let mut lexers = Lexers::start(3);
        assert_eq!(lexers.workers.len(), 3);
        let mut buf: Box<[u8]> = b.clone().into_boxed_slice();
        for (round, end) in [b.len(), b.len() / 2, b.len() / 3].into_iter().enumerate() {
            let window = Window { bytes: Arc::new(buf), keys: keys.clone(), known: Arc::new(Known::default()) };
            // From the second entry, the first to name its keys by slot.
            let first = b.windows(5).position(|w| w == b"}\x94(h\x02").unwrap();
            let bound = |i: usize| first + (end - first) / 3 * i;
            for i in 0..3 {
                let (share, window) = (Share::default(), window.clone());
                let job = Job {
                    share,
                    window,
                    bounds: (bound(i), if i == 2 { end } else { bound(i + 1) }),
                    end,
                    guess: i > 0,
                };
                lexers.workers[i].jobs.as_ref().unwrap().send(job).unwrap();
            }
            for i in 0..3 {
                let got = lexers.share(i);
                let mut here = Share::default();
                let to = if i == 2 { end } else { bound(i + 1) };
                lex_share(&mut here, &b[..end], (bound(i), to), i > 0, &keys, &Known::default());
                assert!(got.entries.len() > 100, "round {round} share {i}: {}", got.entries.len());
                assert_eq!(
                    (got.start, got.end, got.stop),
                    (here.start, here.end, here.stop),
                    "round {round} share {i}"
                );
                assert_eq!(got.entries, here.entries, "round {round} share {i}");
            }
            buf = Arc::try_unwrap(window.bytes).expect("the window is back, unshared");
        }
        assert_eq!(&buf[..], &b[..]);
    }

    use super::super::Limits;

    /// Records the entries either path gives it.
    #[derive(Default)]
    struct Recorder {
        fast: bool,
        entries: Vec<(String, u64, u64)>,
    }

    impl Compactor for Recorder {
        fn compact(&mut self, kv: &[Value]) -> Result<Option<u32>, String> {
            let get = |k: &str| kv.chunks_exact(2).find(|p| p[0].as_str() == Some(k)).map(|p| p[1].clone());
            let Some(a) = get("action").and_then(|v| v.as_str().map(str::to_string)) else { return Ok(None) };
            let n = |k: &str| get(k).and_then(|v| v.as_u64()).unwrap_or(0);
            self.entries.push((a, n("addr"), n("size")));
            Ok(Some(self.entries.len() as u32 - 1))
        }

        fn fast_entries(&self) -> bool {
            self.fast
        }

        fn entry(&mut self, f: &EntryFields) -> Result<u32, String> {
            let a = f.action.as_deref().cloned().unwrap_or_default();
            self.entries.push((a, f.addr.unwrap_or(0), f.size.unwrap_or(0)));
            Ok(self.entries.len() as u32 - 1)
        }
    }

    /// A list of `n` entries as Python's pickler lays them out (appended
    /// seven at a time, frames between and inside entries), where every
    /// fourth address holds the bytes an entry starts with.
    fn crafted(n: usize) -> Vec<u8> {
        let addr = |i: usize| -> [u8; 8] {
            let lie = if i % 4 == 0 { 0x28_947d_u64 << 16 } else { 0x7f_0000 << 16 };
            (lie | (i as u64 & 0xffff)).to_le_bytes()
        };
        let frame = |b: &mut Vec<u8>| {
            b.push(0x95);
            b.extend_from_slice(&[0; 8]);
        };
        let mut b = b"\x80\x04]\x94(".to_vec();
        // Memo: 0 the list, 1 the dict, 2 to 6 the keys and the action, 7 its frames.
        b.extend_from_slice(b"}\x94(\x8c\x06action\x94\x8c\x05alloc\x94\x8c\x04addr\x94\x8a\x08");
        b.extend_from_slice(&addr(0));
        b.extend_from_slice(b"\x8c\x04size\x94K\x10\x8c\x06frames\x94]\x94u");
        for i in 1..n {
            if i % 7 == 0 {
                b.extend_from_slice(b"e(");
            }
            if i % 5 == 0 {
                frame(&mut b);
            }
            b.extend_from_slice(b"}\x94(h\x02h\x03h\x04\x8a\x08");
            b.extend_from_slice(&addr(i));
            if i % 3 == 0 {
                frame(&mut b);
            }
            b.extend_from_slice(b"h\x05M");
            b.extend_from_slice(&(i as u16).to_le_bytes());
            b.extend_from_slice(b"h\x06]\x94u");
        }
        b.extend_from_slice(b"e.");
        b
    }

    #[test]
    fn a_list_appended_entries_and_other_values_keeps_their_order() {
        // Three entries in one APPENDS with a number before the last.
        let mut b = crafted(3);
        let last = b.windows(3).rposition(|w| w == b"}\x94(").unwrap();
        b.splice(last..last, *b"K\x05");
        for fast in [false, true] {
            let mut rec = Recorder { fast, ..Recorder::default() };
            let v = super::super::decode(&b[..], &mut rec, Limits::default()).unwrap();
            let Value::List(l) = v else { panic!("not a list") };
            let items: Vec<String> = l.borrow().items().iter().map(|v| format!("{v:?}")).collect();
            assert_eq!(items, ["Entry(0)", "Entry(1)", "Int(5)", "Entry(2)"], "fast path {fast}");
            assert_eq!(rec.entries.len(), 3);
        }
    }

    #[test]
    fn shares_cover_the_window_in_order_each_a_quarter_longer() {
        let starts: Vec<usize> = (0..=5).map(|i| share_start(1000..21_000, 5, 25, i)).collect();
        assert_eq!(starts, [1000, 3436, 6483, 10_290, 15_050, 21_000]);
        let even: Vec<usize> = (0..=4).map(|i| share_start(0..1000, 4, 0, i)).collect();
        assert_eq!(even, [0, 250, 500, 750, 1000]);
        assert_eq!(share_start(7..7, 3, 25, 1), 7);
    }

    #[test]
    fn entries_read_on_several_threads_are_those_one_thread_reads() {
        let b = crafted(500);
        let read = |fast: bool, par: Parallel| {
            let mut rec = Recorder { fast, ..Recorder::default() };
            let (v, charged) = super::super::decode_parallel(&b[..], &mut rec, Limits::default(), par).unwrap();
            let Value::List(l) = v else { panic!("not a list") };
            let ids: Vec<u32> = l.borrow().entry_ids().collect();
            (rec.entries, ids, charged.in_parallel)
        };
        let (generic, ids, _) = read(false, Parallel::off());
        assert_eq!(generic.len(), 500);
        assert_eq!(ids, (0..500).collect::<Vec<u32>>());
        assert_eq!(generic[4], ("alloc".to_string(), 0x28_947d_0004, 4));
        assert_eq!(read(true, Parallel::off()), (generic.clone(), ids.clone(), 0));
        for workers in [2, 3, 7] {
            for (share, grow) in [40, 97, 200, 1000, 5000].into_iter().flat_map(|s| [(s, 0), (s, 25)]) {
                let par = Parallel { workers, share, grow, first_after: 0, retry_after: 0 };
                let (entries, got, in_parallel) = read(true, par);
                assert_eq!((&entries, &got), (&generic, &ids), "{workers} × {share} B, growing {grow}%");
                assert!(in_parallel >= 250, "{workers} × {share} B, growing {grow}%: {in_parallel} in parallel");
            }
        }
    }
}
