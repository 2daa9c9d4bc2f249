//! A safe, streaming decoder for the data subset of Python's pickle format
//! (protocols 0–5; docs/design/pytorch-allocator.md §13). It never constructs objects or calls code:
//! `GLOBAL`, `REDUCE`, `BUILD` and every other opcode that would are refused
//! with their byte offset. Memo entries are shared (`Rc`), never copied.
//! Containers are dropped iteratively, so deep nesting cannot overflow the
//! stack, and what the decoder allocates is bounded by a multiple of the
//! bytes it has read.
//!
//! A `Compactor` sees each dict as it is appended to a list and may replace
//! it with a small integer (`Value::Entry`), which is how millions of trace
//! entries become columnar records instead of dict objects.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::Read;
use std::rc::Rc;

use thiserror::Error;

mod entries;

use entries::FastEntry;
pub(crate) use entries::Parallel;

#[derive(Debug, Error)]
pub enum PickleError {
    #[error("byte {offset}: refusing opcode {name}: snapshots contain only data, and this reader never constructs objects or runs code")]
    Refused { offset: u64, name: &'static str },
    #[error("byte {offset}: unknown pickle opcode 0x{op:02x}")]
    UnknownOpcode { offset: u64, op: u8 },
    #[error("byte {offset}: file ends inside {what} (truncated?)")]
    Truncated { offset: u64, what: &'static str },
    #[error("byte {offset}: {msg}")]
    Malformed { offset: u64, msg: String },
    #[error("byte {offset}: memo index {index} was never stored")]
    MemoMissing { offset: u64, index: u64 },
    #[error("byte {offset}: {what} exceeds the decoder's limit of {limit}")]
    Limit { offset: u64, what: &'static str, limit: u64 },
    /// `offset` counts the unpacked bytes read: of a compressed file, not
    /// a position in the file itself.
    #[error("{}", io_message(*offset, source))]
    Io { offset: u64, source: std::io::Error },
}

impl PickleError {}

/// A read error, said in the file's terms: a compressed stream that ends
/// early is a truncated file, wherever its unpacked data stopped.
fn io_message(offset: u64, e: &std::io::Error) -> String {
    let text = e.to_string();
    if e.kind() == std::io::ErrorKind::UnexpectedEof || text.contains("deflate") || text.contains("corrupt") {
        format!("the compressed data ends early or is damaged ({text}) after {offset} bytes of unpacked pickle: the file is truncated or corrupt")
    } else {
        format!("unpacked byte {offset}: read error: {text}")
    }
}

pub(crate) type Shared<T> = Rc<RefCell<T>>;

#[derive(Debug, Clone)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An integer wider than 64 bits: little-endian two's complement bytes.
    BigInt(Rc<Vec<u8>>),
    Float(f64),
    Str(Rc<String>),
    Bytes(Rc<Vec<u8>>),
    List(Shared<List>),
    Tuple(Rc<Tuple>),
    Dict(Shared<Dict>),
    /// A dict the `Compactor` took over.
    Entry(u32),
    /// A list the `Compactor` took over (an interned call stack).
    Stack(u32),
}

#[derive(Debug, Default)]
pub struct List {
    items: Vec<Value>,
    /// Consecutive `Value::Entry` ids as (first, count), kept instead of
    /// items while the list holds nothing else: a device's trace costs a few
    /// bytes instead of 16 per entry.
    runs: Vec<(u32, u32)>,
    /// The memo slot this list was stored in, so compaction can release it.
    memo: Option<usize>,
}

impl List {
    pub fn new(items: Vec<Value>) -> Self {
        List { items, runs: Vec::new(), memo: None }
    }

    /// The items; entry runs come back as `Value::Entry`s.
    pub(crate) fn items(&self) -> Vec<Value> {
        if self.runs.is_empty() {
            return self.items.clone();
        }
        self.entry_ids().map(Value::Entry).collect()
    }

    /// The ids of a list made only of compacted entries.
    pub(crate) fn entry_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.runs.iter().flat_map(|&(a, n)| a..a + n)
    }

    /// The plain items (compacted entries excluded).
    pub(crate) fn values(&self) -> &[Value] {
        &self.items
    }

    /// Whether the list holds values other than compacted entries.
    pub(crate) fn has_other_items(&self) -> bool {
        !self.items.is_empty()
    }

    fn push(&mut self, v: Value) {
        if let Value::Entry(id) = v {
            if self.items.is_empty() {
                match self.runs.last_mut() {
                    Some(r) if r.0.checked_add(r.1) == Some(id) => r.1 += 1,
                    _ => self.runs.push((id, 1)),
                }
                return;
            }
        }
        if !self.runs.is_empty() {
            self.items = self.entry_ids().map(Value::Entry).collect();
            self.runs.clear();
        }
        self.items.push(v);
    }
}

const MEMO_CHUNK: usize = 4096;

/// The pickle memo in fixed-size chunks: it grows without doubling or
/// copying. Pickle memoizes every dict, so a trace keeps a slot per entry
/// that nothing reads again: a chunk made only of entries, stacks and
/// strings (PyTorch writes a new `'N/A'` or `''` per entry, each memoized)
/// is kept as 2 bytes a slot (4 where its ids are far apart) instead of a
/// `Value`'s 16 (160 MB at ten million entries;
/// docs/measurements/benchmarks.md), its `Value`s emptied, so that reading
/// a string or a dict (what the fast path reads) costs what it did.
#[derive(Default)]
struct Memo {
    chunks: Vec<Vec<Value>>,
    /// Per chunk, its slots where it is kept compact.
    compact: Vec<Packed>,
    /// The compact slots' strings, each once (the decoder interns them).
    strs: Vec<Rc<String>>,
    str_ids: HashMap<*const String, u32, FastHash>,
    /// The string compacted last and its id: most slots of a chunk hold the
    /// one the decoder shares for PyTorch's per-entry `'N/A'`.
    last_str: Option<(*const String, u32)>,
    len: usize,
    /// Counts writes over a slot that held a dict, a string, a list or a
    /// stack: what the fast path learned from such slots (`FastEntry::known`)
    /// holds while this does not change.
    overwrites: u64,
}

/// A compact chunk's slots: `Value::Entry(id)` as `id << 2`,
/// `Value::Stack(id)` as `id << 2 | 1`, `Value::Str` as its index in
/// `Memo::strs` `<< 2 | 2`; `Narrow` keeps them in 16 bits, an entry's id
/// as its distance from the chunk's first entry (a chunk of 4,096 slots
/// holds a few thousand consecutive entries).
#[derive(Default)]
enum Packed {
    #[default]
    Values,
    Wide(Vec<u32>),
    Narrow {
        base: u32,
        slots: Vec<u16>,
    },
}

impl Packed {
    fn of(wide: Vec<u32>) -> Packed {
        let base = wide.iter().find(|&&x| x & 3 == 0).map_or(0, |&x| x >> 2);
        let narrow = |x: u32| {
            let v = if x & 3 == 0 { (x >> 2).checked_sub(base)? } else { x >> 2 };
            u16::try_from(v << 2 | (x & 3)).ok().filter(|_| v < 1 << 14)
        };
        // Room for every slot at once: collected into an `Option` the
        // vector grew from nothing, a dozen copies per chunk sealed.
        let mut slots = Vec::with_capacity(wide.len());
        for &x in &wide {
            match narrow(x) {
                Some(n) => slots.push(n),
                None => return Packed::Wide(wide),
            }
        }
        Packed::Narrow { base, slots }
    }

    fn get(&self, i: usize) -> Option<u32> {
        match self {
            Packed::Values => None,
            Packed::Wide(w) => w.get(i).copied(),
            Packed::Narrow { base, slots } => {
                let x = u32::from(*slots.get(i)?);
                Some(if x & 3 == 0 { (base + (x >> 2)) << 2 } else { x })
            }
        }
    }

    fn is_values(&self) -> bool {
        matches!(self, Packed::Values)
    }

    fn take_all(&mut self) -> Vec<u32> {
        let n = match self {
            Packed::Values => 0,
            Packed::Wide(w) => w.len(),
            Packed::Narrow { slots, .. } => slots.len(),
        };
        let all = (0..n).filter_map(|i| self.get(i)).collect();
        *self = Packed::Values;
        all
    }
}

impl Memo {
    /// Ids past this are kept as values.
    const ROOM: u32 = 1 << 30;

    fn uncompact(&self, x: u32) -> Option<Value> {
        Some(match x & 3 {
            0 => Value::Entry(x >> 2),
            1 => Value::Stack(x >> 2),
            _ => Value::Str(self.strs.get((x >> 2) as usize)?.clone()),
        })
    }

    /// A value's compact slot, where it has one.
    fn compacted(&mut self, v: &Value) -> Option<u32> {
        match v {
            Value::Entry(id) => Self::code_of_id(*id, false),
            Value::Stack(id) => Self::code_of_id(*id, true),
            Value::Str(s) => {
                // Kept alive by `strs`, so the address stays this string's.
                if let Some((_, id)) = self.last_str.filter(|(p, _)| *p == Rc::as_ptr(s)) {
                    return Some(Self::code_of_str(id));
                }
                let next = u32::try_from(self.strs.len()).ok().filter(|&n| n < Self::ROOM)?;
                let id = *self.str_ids.entry(Rc::as_ptr(s)).or_insert(next);
                if id == next {
                    self.strs.push(s.clone());
                }
                self.last_str = Some((Rc::as_ptr(s), id));
                Some(Self::code_of_str(id))
            }
            _ => None,
        }
    }

    /// A slot of a chunk kept as values (dicts, tuples and lists are never
    /// in a compact one).
    #[inline]
    fn get_ref(&self, i: usize) -> Option<&Value> {
        self.chunks.get(i / MEMO_CHUNK)?.get(i % MEMO_CHUNK)
    }

    /// Any slot's value (a clone: `Value`s share what they hold).
    #[inline]
    fn get(&self, i: usize) -> Option<Value> {
        match self.get_ref(i) {
            Some(v) => Some(v.clone()),
            None => self.uncompact(self.compact.get(i / MEMO_CHUNK)?.get(i % MEMO_CHUNK)?),
        }
    }

    /// A stack slot's stack id, kept as a value or compact.
    #[inline]
    fn get_stack(&self, i: usize) -> Option<u32> {
        match self.get_ref(i) {
            Some(Value::Stack(s)) => Some(*s),
            Some(_) => None,
            None => {
                let x = self.compact.get(i / MEMO_CHUNK)?.get(i % MEMO_CHUNK)?;
                (x & 3 == 1).then_some(x >> 2)
            }
        }
    }

    /// A string slot's string, kept as a value or compact.
    fn get_str(&self, i: usize) -> Option<&Rc<String>> {
        match self.get_ref(i) {
            Some(Value::Str(s)) => Some(s),
            Some(_) => None,
            None => {
                let x = self.compact.get(i / MEMO_CHUNK)?.get(i % MEMO_CHUNK)?;
                (x & 3 == 2).then(|| self.strs.get((x >> 2) as usize)).flatten()
            }
        }
    }

    /// A slot to write over: counted in `overwrites` if it held a dict, a
    /// string, a list or a stack (what the fast path learns slots by).
    fn get_mut(&mut self, i: usize) -> Option<&mut Value> {
        let k = i / MEMO_CHUNK;
        if let Some(c) = self.compact.get_mut(k).filter(|c| !c.is_values()) {
            let c = c.take_all();
            self.chunks[k] = c.into_iter().filter_map(|x| self.uncompact(x)).collect();
        }
        let v = self.chunks.get_mut(k)?.get_mut(i % MEMO_CHUNK)?;
        if matches!(v, Value::Dict(_) | Value::Str(_) | Value::List(_) | Value::Stack(_)) {
            self.overwrites += 1;
        }
        Some(v)
    }

    /// Starts a new chunk where the last is full (or there is none),
    /// sealing the one before it (the slots an entry being read may still
    /// set lie in the last two). A new chunk takes compact slots until a
    /// value without a compact form comes.
    #[inline]
    fn room(&mut self) {
        if self.len == self.chunks.len() * MEMO_CHUNK {
            self.new_chunk();
        }
    }

    #[cold]
    fn new_chunk(&mut self) {
        if let Some(k) = self.chunks.len().checked_sub(2) {
            self.seal(k);
        }
        self.chunks.push(Vec::new());
        self.compact.push(Packed::Wide(Vec::with_capacity(MEMO_CHUNK)));
    }

    /// Keeps a full chunk in as few bytes as its slots allow.
    fn seal(&mut self, k: usize) {
        match &mut self.compact[k] {
            Packed::Wide(w) => {
                let w = std::mem::take(w);
                self.compact[k] = Packed::of(w);
            }
            Packed::Values => {
                let chunk = std::mem::take(&mut self.chunks[k]);
                let packed: Option<Vec<u32>> = chunk.iter().map(|v| self.compacted(v)).collect();
                match packed {
                    Some(p) => self.compact[k] = Packed::of(p),
                    None => self.chunks[k] = chunk,
                }
            }
            Packed::Narrow { .. } => {}
        }
    }

    fn push(&mut self, v: Value) {
        self.room();
        let k = self.chunks.len() - 1;
        if !self.compact[k].is_values() {
            if let Some(x) = self.compacted(&v) {
                return self.push_code(x);
            }
            // Something without a compact form: the chunk becomes values.
            let codes = self.compact[k].take_all();
            let mut values = Vec::with_capacity(MEMO_CHUNK);
            values.extend(codes.into_iter().filter_map(|x| self.uncompact(x)));
            self.chunks[k] = values;
        }
        self.chunks[k].push(v);
        self.len += 1;
    }

    /// Pushes a compact slot (`Packed`'s encoding) without making a value:
    /// what the fast path stores for an entry (docs/design/trace-decoding.md,
    /// "What the decoding thread does per entry").
    #[inline]
    fn push_code(&mut self, x: u32) {
        self.room();
        let k = self.chunks.len() - 1;
        match &mut self.compact[k] {
            Packed::Wide(w) => w.push(x),
            _ => {
                if let Some(v) = self.uncompact(x) {
                    self.chunks[k].push(v);
                }
            }
        }
        self.len += 1;
    }

    /// An entry's or a stack's id as a compact slot, where it fits.
    fn code_of_id(id: u32, stack: bool) -> Option<u32> {
        (id < Self::ROOM).then_some(id << 2 | u32::from(stack))
    }

    /// A string's compact slot, by its index in `strs` (below `ROOM`).
    fn code_of_str(id: u32) -> u32 {
        id << 2 | 2
    }

    /// The compact slot of the string last compacted, if `bytes` are its
    /// text: most strings an entry stores are PyTorch's per-entry `'N/A'`.
    fn last_str_code(&self, bytes: &[u8]) -> Option<u32> {
        let (_, id) = self.last_str?;
        let s = self.strs.get(id as usize)?;
        // Compared in place: nearly every entry asks this of a three-byte
        // `'N/A'`, and a call to `memcmp` for it cost more than the compare.
        let same = s.len() == bytes.len() && s.bytes().zip(bytes).all(|(a, b)| a == *b);
        same.then_some(Self::code_of_str(id))
    }
}

#[derive(Debug, Default)]
pub struct Tuple(pub Vec<Value>);
#[derive(Debug, Default)]
pub struct Dict {
    pub(crate) items: Vec<(Value, Value)>,
    /// The memo slot this dict was stored in, so compaction can release it.
    memo: Option<usize>,
    /// The compactor declined it as it was filled and it has not changed since.
    declined: bool,
}

/// Drops a tree of values without recursion.
fn drop_iteratively(mut work: Vec<Value>) {
    while let Some(v) = work.pop() {
        match v {
            Value::List(rc) => {
                if let Ok(cell) = Rc::try_unwrap(rc) {
                    work.append(&mut cell.into_inner().items);
                }
            }
            Value::Tuple(rc) => {
                if let Ok(mut t) = Rc::try_unwrap(rc) {
                    work.append(&mut t.0);
                }
            }
            Value::Dict(rc) => {
                if let Ok(cell) = Rc::try_unwrap(rc) {
                    let mut d = cell.into_inner();
                    for (k, v) in d.items.drain(..) {
                        work.push(k);
                        work.push(v);
                    }
                }
            }
            _ => {}
        }
    }
}

impl Drop for List {
    fn drop(&mut self) {
        if self.items.iter().any(Value::is_container) {
            drop_iteratively(std::mem::take(&mut self.items));
        }
    }
}
impl Drop for Tuple {
    fn drop(&mut self) {
        if self.0.iter().any(Value::is_container) {
            drop_iteratively(std::mem::take(&mut self.0));
        }
    }
}
impl Drop for Dict {
    fn drop(&mut self) {
        if self.items.iter().any(|(k, v)| k.is_container() || v.is_container()) {
            let mut work = Vec::with_capacity(self.items.len() * 2);
            for (k, v) in self.items.drain(..) {
                work.push(k);
                work.push(v);
            }
            drop_iteratively(work);
        }
    }
}

impl Value {
    fn is_container(&self) -> bool {
        matches!(self, Value::List(_) | Value::Tuple(_) | Value::Dict(_))
    }

    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s.as_str()),
            _ => None,
        }
    }

    pub(crate) fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Bool(b) => Some(*b as i64),
            _ => None,
        }
    }

    /// Non-negative integers up to 2^64 - 1 (addresses, sizes, streams).
    pub(crate) fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Int(i) if *i >= 0 => Some(*i as u64),
            Value::Bool(b) => Some(*b as u64),
            Value::BigInt(b) => {
                if b.len() > 9 || (b.len() == 9 && b[8] != 0) || b.last().is_some_and(|x| x & 0x80 != 0) {
                    return None;
                }
                let mut v = 0u64;
                for (i, byte) in b.iter().take(8).enumerate() {
                    v |= (*byte as u64) << (8 * i);
                }
                Some(v)
            }
            _ => None,
        }
    }

    pub(crate) fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Float(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    pub(crate) fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            Value::Int(i) => Some(*i != 0),
            _ => None,
        }
    }

    /// The value under a string key of a dict.
    pub fn get(&self, key: &str) -> Option<Value> {
        match self {
            Value::Dict(d) => d.borrow().get(key).cloned(),
            _ => None,
        }
    }

    /// Items of a list or tuple (cloned handles; values are shared).
    pub(crate) fn items(&self) -> Option<Vec<Value>> {
        match self {
            Value::List(l) => Some(l.borrow().items()),
            Value::Tuple(t) => Some(t.0.clone()),
            _ => None,
        }
    }

    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::BigInt(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Dict(_) => "dict",
            Value::Entry(_) => "trace entry",
            Value::Stack(_) => "call stack",
        }
    }
}

impl Dict {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.items.iter().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v)
    }
}

/// Sees every dict as it is filled (and again as it is appended to a list);
/// returning `Some(id)` replaces the dict with `Value::Entry(id)` everywhere
/// (stack and memo), so no dict object is kept for it.
pub trait Compactor {
    /// `kv` holds the dict's keys and values alternately.
    fn compact(&mut self, kv: &[Value]) -> Result<Option<u32>, String>;
    /// Offered each list value (under `key`) of a dict before `compact` sees
    /// the dict; `Some(id)` replaces the list by `Value::Stack(id)`.
    fn compact_list(&mut self, _key: &str, _list: &List) -> Option<u32> {
        None
    }
    /// Whether `entry` and `stack_of` take trace entries read straight from
    /// the byte stream (the decoder's fast path).
    fn fast_entries(&self) -> bool {
        false
    }
    /// The id `entry` gives the next entry it takes, where it is known
    /// before (the fast path then memoizes the entry as it, not as a
    /// placeholder written over after).
    fn next_entry(&self) -> Option<u32> {
        None
    }
    /// A trace entry decoded by the fast path.
    fn entry(&mut self, _fields: &EntryFields) -> Result<u32, String> {
        Err("trace entries are not taken".into())
    }
    /// A code for an action name whose entries `entry_coded` takes, so
    /// that they can be resolved off the decoding thread; `None` for a name
    /// `entry` must see.
    fn action_code(&self, _name: &str) -> Option<u8> {
        None
    }
    /// A trace entry the fast path resolved off the decoding thread: its
    /// action given by `action_code`'s code (`fields.action` is `None`).
    fn entry_coded(&mut self, _code: u8, _fields: &EntryFields) -> Result<u32, String> {
        Err("trace entries are not taken".into())
    }
    /// A call stack given as its frame values.
    fn stack_of(&mut self, _frames: &[Value]) -> u32 {
        0
    }
}

/// The fields of a trace entry as the fast path reads them.
#[derive(Debug, Clone, Default)]
pub struct EntryFields {
    pub(crate) action: Option<Rc<String>>,
    pub(crate) addr: Option<u64>,
    pub(crate) device_free: Option<u64>,
    pub(crate) size: Option<u64>,
    pub(crate) stream: Option<u64>,
    pub(crate) time_us: Option<i64>,
    pub(crate) stack: u32,
    /// `pool_id` (2.12+).
    pub(crate) pool: Option<(u64, u64)>,
    /// `user_metadata` (2.13, 2.14) or `internal_metadata` (2.15) says
    /// `mallocWithAddress`: an exact-address allocation's entry.
    pub(crate) exact: bool,
    /// `internal_metadata` present (2.15+).
    pub(crate) internal: bool,
    /// An `annotate` entry's text (its `user_metadata`, 2.14+).
    pub(crate) note: Option<Rc<String>>,
}

impl Compactor for () {
    fn compact(&mut self, _: &[Value]) -> Result<Option<u32>, String> {
        Ok(None)
    }
}

/// Decoder limits. The defaults bound a hostile file to a small multiple of
/// its own size.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Bytes the decoder may account for per byte read, plus `slack`.
    pub bytes_per_input_byte: u64,
    pub slack: u64,
    /// Open MARKs at once.
    pub max_marks: usize,
    /// The bytes of the file read so far, when the pickle comes through a
    /// decompressor: the allowance grows with the unpacked bytes read, but
    /// counting at most `UNPACKED_PER_FILE_BYTE` of them per byte of the
    /// file, so memory stays bounded by the file (docs/user/input.md).
    pub consumed: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
}

/// Unpacked bytes a compressed input's allowance counts per byte of the
/// file: real snapshots unpack 10 to 50 times (a re-pickled one whose
/// strings are no longer shared, more), while a bomb's ratio is what it
/// would need; 16 keeps a 52 KB file under 84 MiB of decoded values.
pub(crate) const UNPACKED_PER_FILE_BYTE: u64 = 16;

impl Limits {
    /// What the allowance grows with: the unpacked bytes read, at most
    /// `UNPACKED_PER_FILE_BYTE` per byte of the file read.
    fn counted(&self, unpacked: u64) -> u64 {
        match &self.consumed {
            Some(c) => {
                unpacked.min(c.load(std::sync::atomic::Ordering::Relaxed).saturating_mul(UNPACKED_PER_FILE_BYTE))
            }
            None => unpacked,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits { bytes_per_input_byte: 24, slack: 64 << 20, max_marks: 100_000, consumed: None }
    }
}

const BUF: usize = 1 << 16;

/// FNV-1a-style hashing for the interners: their keys are short, and the
/// default SipHash showed up in profiles. The tables are bounded by the input
/// size, so a crafted collision costs time linear in what was read.
#[derive(Default, Clone, Copy)]
pub(crate) struct FastHasher(u64);

impl std::hash::Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 { 0xcbf2_9ce4_8422_2325 } else { self.0 };
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            h = (h ^ u64::from_le_bytes(w)).wrapping_mul(0x0100_0000_01b3).rotate_left(23);
        }
        self.0 = h;
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64)
    }
    fn write_u64(&mut self, v: u64) {
        // splitmix64's finalizer: addresses are multiples of 512, and every
        // input bit must reach the bits hashbrown uses for bucket and tag.
        let mut z = (self.0 ^ v).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        self.0 = z ^ (z >> 31);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64)
    }
}

pub(crate) type FastHash = std::hash::BuildHasherDefault<FastHasher>;

/// A buffered byte source that knows its offset.
struct Source<R> {
    r: R,
    buf: Box<[u8]>,
    pos: usize,
    end: usize,
    base: u64,
}

impl<R: Read> Source<R> {
    fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    fn fill(&mut self) -> Result<bool, PickleError> {
        self.base += self.end as u64;
        self.pos = 0;
        self.end = 0;
        loop {
            match self.r.read(&mut self.buf) {
                Ok(n) => {
                    self.end = n;
                    return Ok(n > 0);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(PickleError::Io { offset: self.base, source: e }),
            }
        }
    }

    #[inline]
    fn byte(&mut self, what: &'static str) -> Result<u8, PickleError> {
        if self.pos == self.end && !self.fill()? {
            return Err(PickleError::Truncated { offset: self.offset(), what });
        }
        let b = self.buf[self.pos];
        self.pos += 1;
        Ok(b)
    }

    /// Reads exactly N bytes into an array.
    #[inline]
    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], PickleError> {
        let mut out = [0u8; N];
        if self.end - self.pos >= N {
            out.copy_from_slice(&self.buf[self.pos..self.pos + N]);
            self.pos += N;
            return Ok(out);
        }
        for slot in out.iter_mut() {
            *slot = self.byte(what)?;
        }
        Ok(out)
    }

    /// Reads `n` bytes, growing the result only as data arrives, so a length
    /// field that lies cannot make the decoder allocate what is not there.
    fn vec(&mut self, n: u64, what: &'static str) -> Result<Vec<u8>, PickleError> {
        let mut out = Vec::with_capacity(n.min(BUF as u64) as usize);
        let mut left = n;
        while left > 0 {
            if self.pos == self.end && !self.fill()? {
                return Err(PickleError::Truncated { offset: self.offset(), what });
            }
            let take = ((self.end - self.pos) as u64).min(left) as usize;
            out.extend_from_slice(&self.buf[self.pos..self.pos + take]);
            self.pos += take;
            left -= take as u64;
        }
        Ok(out)
    }

    /// Moves the unread bytes to the buffer's start, grows it to `size`
    /// and fills it as far as the input goes: a window that threads can
    /// read entries from (entries.rs).
    fn window(&mut self, size: usize) -> Result<(), PickleError> {
        self.buf.copy_within(self.pos..self.end, 0);
        self.base += self.pos as u64;
        self.end -= self.pos;
        self.pos = 0;
        if self.buf.len() < size {
            let mut grown = vec![0u8; size].into_boxed_slice();
            grown[..self.end].copy_from_slice(&self.buf[..self.end]);
            self.buf = grown;
        }
        while self.end < self.buf.len() {
            match self.r.read(&mut self.buf[self.end..]) {
                Ok(0) => break,
                Ok(n) => self.end += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(PickleError::Io { offset: self.base + self.end as u64, source: e }),
            }
        }
        Ok(())
    }

    fn line(&mut self, what: &'static str) -> Result<Vec<u8>, PickleError> {
        let mut out = Vec::new();
        loop {
            let b = self.byte(what)?;
            if b == b'\n' {
                return Ok(out);
            }
            // Text arguments of protocol 0 (numbers, quoted strings): long
            // lines are strings, which the caller charges once read.
            if out.len() > 1 << 20 {
                return Err(PickleError::Malformed { offset: self.offset(), msg: format!("{what} line is too long") });
            }
            out.push(b);
        }
    }
}

/// Protocol 0's UNICODE argument: raw-unicode-escape, where bytes are
/// Latin-1 characters and only `\uXXXX` / `\UXXXXXXXX` are escapes.
fn raw_unicode_escape(b: &[u8]) -> Option<String> {
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'\\' && i + 1 < b.len() && (b[i + 1] == b'u' || b[i + 1] == b'U') {
            let n = if b[i + 1] == b'u' { 4 } else { 8 };
            let hex = std::str::from_utf8(b.get(i + 2..i + 2 + n)?).ok()?;
            out.push(char::from_u32(u32::from_str_radix(hex, 16).ok()?)?);
            i += 2 + n;
        } else {
            out.push(char::from(c));
            i += 1;
        }
    }
    Some(out)
}

/// Protocol 0's STRING argument: a Python string literal in single or
/// double quotes with backslash escapes.
fn python_string_literal(b: &[u8]) -> Option<Vec<u8>> {
    let q = *b.first()?;
    if !(q == b'\'' || q == b'"') || b.len() < 2 || *b.last()? != q {
        return None;
    }
    let body = &b[1..b.len() - 1];
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        if body[i] != b'\\' {
            out.push(body[i]);
            i += 1;
            continue;
        }
        let e = *body.get(i + 1)?;
        i += 2;
        match e {
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'0'..=b'7' => {
                let mut v = u32::from(e - b'0');
                let mut k = 0;
                while k < 2 && i < body.len() && (b'0'..=b'7').contains(&body[i]) {
                    v = v * 8 + u32::from(body[i] - b'0');
                    i += 1;
                    k += 1;
                }
                out.push(u8::try_from(v).ok()?);
            }
            b'x' => {
                let hex = std::str::from_utf8(body.get(i..i + 2)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b'\\' | b'\'' | b'"' => out.push(e),
            b'a' => out.push(7),
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'v' => out.push(11),
            _ => {
                out.push(b'\\');
                out.push(e);
            }
        }
    }
    Some(out)
}

/// What one container value costs in memory (the `Rc`, its `RefCell` and
/// an empty `Vec`, with the allocator's rounding): charged for every
/// container an opcode makes, so a pickle of empty tuples cannot outgrow its
/// allowance (docs/user/input.md).
const CONTAINER: u64 = 128;

fn refused_name(op: u8) -> Option<&'static str> {
    Some(match op {
        b'c' => "GLOBAL",
        0x93 => "STACK_GLOBAL",
        b'R' => "REDUCE",
        b'b' => "BUILD",
        b'i' => "INST",
        b'o' => "OBJ",
        0x81 => "NEWOBJ",
        0x92 => "NEWOBJ_EX",
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        _ => return None,
    })
}

struct Vm<'c, R, C> {
    src: Source<R>,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: Memo,
    memo_sparse: HashMap<u64, Value>,
    strings: HashMap<Box<[u8]>, Rc<String>, FastHash>,
    /// The string `shared_str` gave last: entries repeat one ("N/A") each.
    last_str: Option<Rc<String>>,
    /// The memo slots of the key strings the fast path has recognised, and
    /// the field each names (cleared when a slot is stored over).
    keys: Vec<(u32, u8)>,
    /// The fast path's reused buffers, boxed: taken and put back per entry,
    /// a move of the struct itself cost 4% of a big trace's decoding.
    fast: Option<Box<FastEntry>>,
    /// How runs of trace entries are read on several threads.
    par: Parallel,
    /// Entries read by workers.
    in_parallel: u64,
    allowance: u64,
    charged: u64,
    limits: Limits,
    compactor: &'c mut C,
}

/// Decodes one pickle from `r` (already decompressed).
pub fn decode<R: Read, C: Compactor>(r: R, compactor: &mut C, limits: Limits) -> Result<Value, PickleError> {
    decode_charged(r, compactor, limits).map(|(v, _)| v)
}

/// What decoding charged against the allowance, and the allowance then: a
/// caller that builds more from the values (the call stacks' frames) charges
/// it to the same allowance.
#[derive(Debug, Clone, Copy)]
pub struct Charged {
    pub charged: u64,
    pub allowance: u64,
    /// Trace entries read by worker threads (entries.rs).
    pub(crate) in_parallel: u64,
}

/// As `decode`, also saying what the values were charged.
pub fn decode_charged<R: Read, C: Compactor>(
    r: R,
    compactor: &mut C,
    limits: Limits,
) -> Result<(Value, Charged), PickleError> {
    decode_parallel(r, compactor, limits, Parallel::default())
}

/// As `decode_charged`, reading runs of trace entries as `par` says.
pub(crate) fn decode_parallel<R: Read, C: Compactor>(
    r: R,
    compactor: &mut C,
    limits: Limits,
    par: Parallel,
) -> Result<(Value, Charged), PickleError> {
    let mut vm = Vm {
        src: Source { r, buf: vec![0u8; BUF].into_boxed_slice(), pos: 0, end: 0, base: 0 },
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Memo::default(),
        memo_sparse: HashMap::new(),
        strings: HashMap::default(),
        last_str: None,
        keys: Vec::new(),
        fast: Some(Box::default()),
        par,
        in_parallel: 0,
        allowance: limits.slack,
        charged: 0,
        limits,
        compactor,
    };
    let out = vm.run();
    let read = vm.limits.counted(vm.src.offset());
    let charged = Charged {
        charged: vm.charged,
        allowance: read.saturating_mul(vm.limits.bytes_per_input_byte).saturating_add(vm.limits.slack),
        in_parallel: vm.in_parallel,
    };
    // Release everything without recursion, whatever state decoding ended in.
    drop_iteratively(std::mem::take(&mut vm.stack));
    for chunk in std::mem::take(&mut vm.memo.chunks) {
        drop_iteratively(chunk);
    }
    drop_iteratively(vm.memo_sparse.drain().map(|(_, v)| v).collect());
    out.map(|v| (v, charged))
}

impl<R: Read, C: Compactor> Vm<'_, R, C> {
    fn malformed(&self, offset: u64, msg: impl Into<String>) -> PickleError {
        PickleError::Malformed { offset, msg: msg.into() }
    }

    #[inline]
    fn charge(&mut self, offset: u64, bytes: u64) -> Result<(), PickleError> {
        self.charged += bytes;
        if self.charged > self.allowance {
            // The allowance grows with the input read; recompute it only when passed.
            let read = self.limits.counted(self.src.offset());
            self.allowance = read.saturating_mul(self.limits.bytes_per_input_byte) + self.limits.slack;
            if self.charged > self.allowance {
                return Err(PickleError::Limit {
                    offset,
                    what: "memory for decoded values (24 times the unpacked bytes read, at most 16 per byte of a compressed file, plus 64 MiB; --max-unpacked BYTES lets a compressed file use 24 times all its unpacked bytes)",
                    limit: self.allowance,
                });
            }
        }
        Ok(())
    }

    #[inline]
    fn push(&mut self, offset: u64, v: Value) -> Result<(), PickleError> {
        self.charge(offset, 16)?;
        self.stack.push(v);
        Ok(())
    }

    fn pop(&mut self, offset: u64) -> Result<Value, PickleError> {
        if self.marks.last().is_some_and(|&m| self.stack.len() <= m) {
            return Err(self.malformed(offset, "pop across a MARK"));
        }
        self.stack.pop().ok_or_else(|| self.malformed(offset, "stack underflow"))
    }

    fn top(&self, offset: u64) -> Result<&Value, PickleError> {
        self.stack.last().ok_or_else(|| self.malformed(offset, "stack underflow"))
    }

    /// Pops everything above the last MARK.
    fn pop_mark(&mut self, offset: u64) -> Result<Vec<Value>, PickleError> {
        let m = self.marks.pop().ok_or_else(|| self.malformed(offset, "no MARK on the stack"))?;
        Ok(self.stack.split_off(m))
    }

    fn memo_put(&mut self, offset: u64, idx: u64) -> Result<(), PickleError> {
        let v = self.top(offset)?.clone();
        self.charge(offset, 16)?;
        match &v {
            Value::Dict(d) => d.borrow_mut().memo = Some(idx as usize),
            Value::List(l) => l.borrow_mut().memo = Some(idx as usize),
            _ => {}
        }
        let len = self.memo.len as u64;
        if let Some(slot) = self.memo.get_mut(idx as usize) {
            // A key string's slot stored over no longer names its field.
            self.keys.clear();
            let old = std::mem::replace(slot, v);
            drop_iteratively(vec![old]);
        } else if idx == len {
            self.memo.push(v);
        } else if let Some(old) = self.memo_sparse.insert(idx, v) {
            drop_iteratively(vec![old]);
        }
        Ok(())
    }

    #[inline]
    fn memo_get(&mut self, offset: u64, idx: u64) -> Result<(), PickleError> {
        // Charge first and clone straight into the stack: a clone held across
        // a call is spilled piecewise and reloaded whole, which stalls.
        self.charge(offset, 16)?;
        match self.memo.get(idx as usize) {
            Some(v) => self.stack.push(v),
            None => {
                let v = self.memo_sparse.get(&idx).cloned().ok_or(PickleError::MemoMissing { offset, index: idx })?;
                self.stack.push(v);
            }
        }
        Ok(())
    }

    /// Offers a dict's keys and values to the compactor: its list values
    /// first (call stacks, whose memo slots are then released), then the dict.
    fn compact_pairs(&mut self, offset: u64, kv: &mut [Value]) -> Result<Option<u32>, PickleError> {
        for pair in kv.chunks_exact_mut(2) {
            let (Some(key), Value::List(l)) = (pair[0].as_str(), &pair[1]) else { continue };
            let Some(id) = self.compactor.compact_list(key, &l.borrow()) else { continue };
            let slot = l.borrow().memo;
            if let Some(s) = slot.and_then(|m| self.memo.get_mut(m)) {
                if matches!(s, Value::List(x) if Rc::ptr_eq(x, l)) {
                    *s = Value::Stack(id);
                }
            }
            pair[1] = Value::Stack(id);
        }
        self.compactor.compact(kv).map_err(|m| self.malformed(offset, m))
    }

    /// Replaces a compacted dict's memo slot by its entry id.
    fn release_dict_memo(&mut self, d: &Shared<Dict>, id: u32) {
        let slot = d.borrow().memo;
        if let Some(s) = slot.and_then(|m| self.memo.get_mut(m)) {
            if matches!(s, Value::Dict(x) if Rc::ptr_eq(x, d)) {
                *s = Value::Entry(id);
            }
        }
    }

    /// Offers a dict about to go into a list to the compactor (dicts that
    /// were not built by a single SETITEMS).
    fn maybe_compact(&mut self, offset: u64, v: Value) -> Result<Value, PickleError> {
        let Value::Dict(d) = &v else { return Ok(v) };
        if d.borrow().declined {
            return Ok(v);
        }
        let mut kv: Vec<Value> = d.borrow().items.iter().flat_map(|(k, v)| [k.clone(), v.clone()]).collect();
        let Some(id) = self.compact_pairs(offset, &mut kv)? else { return Ok(v) };
        self.release_dict_memo(d, id);
        Ok(Value::Entry(id))
    }

    fn list_target(&self, offset: u64, v: &Value) -> Result<Shared<List>, PickleError> {
        match v {
            Value::List(l) => Ok(l.clone()),
            other => Err(self.malformed(offset, format!("APPEND to a {}", other.type_name()))),
        }
    }

    fn dict_target(&self, offset: u64, v: &Value) -> Result<Shared<Dict>, PickleError> {
        match v {
            Value::Dict(d) => Ok(d.clone()),
            other => Err(self.malformed(offset, format!("SETITEM on a {}", other.type_name()))),
        }
    }

    fn text_int(&mut self, offset: u64, what: &'static str) -> Result<Value, PickleError> {
        let line = self.src.line(what)?;
        let s = String::from_utf8_lossy(&line);
        let s = s.trim_end_matches('L');
        match s {
            "00" => Ok(Value::Bool(false)),
            "01" => Ok(Value::Bool(true)),
            _ => s
                .parse::<i64>()
                .map(Value::Int)
                .map_err(|_| self.malformed(offset, format!("bad {what} literal {s:?}"))),
        }
    }

    /// The decimal memo index of the protocol-0 PUT and GET opcodes.
    fn text_index(&mut self, offset: u64, what: &'static str) -> Result<u64, PickleError> {
        let line = self.src.line(what)?;
        String::from_utf8_lossy(&line).parse::<u64>().map_err(|_| self.malformed(offset, format!("bad {what} index")))
    }

    fn long_bytes(&mut self, offset: u64, bytes: Vec<u8>) -> Result<Value, PickleError> {
        if bytes.len() <= 8 {
            let mut v: i64 = 0;
            for (i, b) in bytes.iter().enumerate() {
                v |= (*b as i64) << (8 * i);
            }
            if let Some(&last) = bytes.last() {
                if last & 0x80 != 0 && bytes.len() < 8 {
                    v |= -1i64 << (8 * bytes.len());
                }
            }
            Ok(Value::Int(v))
        } else {
            self.charge(offset, bytes.len() as u64)?;
            Ok(Value::BigInt(Rc::new(bytes)))
        }
    }

    /// The shared copy of a short string read before, if any; the one
    /// given last is checked before the table, without hashing.
    fn shared_str(&mut self, bytes: &[u8]) -> Option<Rc<String>> {
        if let Some(last) = self.last_str.as_ref().filter(|s| s.as_bytes() == bytes) {
            return Some(last.clone());
        }
        if bytes.len() > 64 {
            return None;
        }
        let rc = self.strings.get(bytes)?.clone();
        self.last_str = Some(rc.clone());
        Some(rc)
    }

    fn string(&mut self, offset: u64, bytes: Vec<u8>) -> Result<Value, PickleError> {
        // Snapshots repeat short strings (action names, "N/A" contexts) as
        // separate objects; share one copy of each.
        let short = bytes.len() <= 64;
        if let Some(rc) = self.shared_str(&bytes) {
            return Ok(Value::Str(rc));
        }
        self.charge(offset, bytes.len() as u64 + 32)?;
        let s = String::from_utf8(bytes).map_err(|e| self.malformed(offset, format!("string is not UTF-8: {e}")))?;
        let rc = Rc::new(s);
        if short && self.strings.len() < 1 << 16 {
            self.strings.insert(rc.as_bytes().to_vec().into_boxed_slice(), rc.clone());
        }
        Ok(Value::Str(rc))
    }

    fn run(&mut self) -> Result<Value, PickleError> {
        loop {
            let offset = self.src.offset();
            let op = self.src.byte("an opcode")?;
            if let Some(name) = refused_name(op) {
                return Err(PickleError::Refused { offset, name });
            }
            match op {
                0x80 => {
                    let proto = self.src.byte("PROTO")?;
                    if proto > 5 {
                        return Err(self.malformed(offset, format!("unsupported pickle protocol {proto}")));
                    }
                }
                0x95 => {
                    self.src.array::<8>("FRAME")?;
                }
                b'.' => {
                    let v = self.pop(offset)?;
                    if !self.stack.is_empty() || !self.marks.is_empty() {
                        return Err(self.malformed(offset, "STOP with values left on the stack"));
                    }
                    return Ok(v);
                }
                // A dict that is a trace entry is read straight from the bytes.
                b'}' if self.try_fast_entry(offset)? => {}
                b'N' | 0x88 | 0x89 | b'K' | b'M' | b'J' | 0x8a | 0x8b | b'I' | b'L' | b'G' | b'F' => {
                    self.scalar(offset, op)?
                }
                0x8c | b'V' | b'S' | b'X' | 0x8d | b'C' | b'U' | b'B' | b'T' | 0x8e | 0x96 => self.text(offset, op)?,
                0x94 | b'q' | b'r' | b'p' | b'h' | b'j' | b'g' => self.memo_op(offset, op)?,
                b'a' | b'e' | 0x90 | b's' | b'u' => self.fill(offset, op)?,
                b'}' | b']' | b')' | 0x8f | b'(' | b'0' | b'1' | b'2' | b'l' | b't' | 0x91 | b'd' | 0x85..=0x87 => {
                    self.build(offset, op)?
                }
                _ => return Err(PickleError::UnknownOpcode { offset, op }),
            }
        }
    }

    /// None, booleans, integers and floats, pushed.
    fn scalar(&mut self, offset: u64, op: u8) -> Result<(), PickleError> {
        match op {
            b'N' => self.push(offset, Value::None)?,
            0x88 => self.push(offset, Value::Bool(true))?,
            0x89 => self.push(offset, Value::Bool(false))?,
            b'K' => {
                let b = self.src.byte("BININT1")?;
                self.push(offset, Value::Int(b as i64))?
            }
            b'M' => {
                let b = self.src.array::<2>("BININT2")?;
                self.push(offset, Value::Int(u16::from_le_bytes(b) as i64))?
            }
            b'J' => {
                let b = self.src.array::<4>("BININT")?;
                self.push(offset, Value::Int(i32::from_le_bytes(b) as i64))?
            }
            0x8a => {
                let n = self.src.byte("LONG1")? as usize;
                let v = if n <= 8 {
                    let mut b = [0u8; 8];
                    if self.src.end - self.src.pos >= 8 {
                        // A whole word, masked: no variable-length copy.
                        let mut w = [0u8; 8];
                        w.copy_from_slice(&self.src.buf[self.src.pos..self.src.pos + 8]);
                        let mask = if n == 8 { u64::MAX } else { (1u64 << (8 * n)) - 1 };
                        b = (u64::from_le_bytes(w) & mask).to_le_bytes();
                        self.src.pos += n;
                    } else {
                        for slot in b.iter_mut().take(n) {
                            *slot = self.src.byte("LONG1")?;
                        }
                    }
                    let mut v = i64::from_le_bytes(b);
                    if n > 0 && n < 8 && b[n - 1] & 0x80 != 0 {
                        v |= -1i64 << (8 * n);
                    }
                    Value::Int(v)
                } else {
                    let bytes = self.src.vec(n as u64, "LONG1")?;
                    self.long_bytes(offset, bytes)?
                };
                self.push(offset, v)?
            }
            0x8b => {
                let n = i32::from_le_bytes(self.src.array::<4>("LONG4")?);
                if n < 0 {
                    return Err(self.malformed(offset, "LONG4 with a negative length"));
                }
                let bytes = self.src.vec(n as u64, "LONG4")?;
                let v = self.long_bytes(offset, bytes)?;
                self.push(offset, v)?
            }
            b'I' | b'L' => {
                let v = self.text_int(offset, "INT")?;
                self.push(offset, v)?
            }
            b'G' => {
                let b = self.src.array::<8>("BINFLOAT")?;
                self.push(offset, Value::Float(f64::from_be_bytes(b)))?
            }
            b'F' => {
                let line = self.src.line("FLOAT")?;
                let s = String::from_utf8_lossy(&line).to_string();
                let f =
                    s.trim().parse::<f64>().map_err(|_| self.malformed(offset, format!("bad FLOAT literal {s:?}")))?;
                self.push(offset, Value::Float(f))?
            }
            _ => return Err(PickleError::UnknownOpcode { offset, op }),
        }
        Ok(())
    }

    /// Strings and byte strings, pushed (each charged against the budget).
    fn text(&mut self, offset: u64, op: u8) -> Result<(), PickleError> {
        match op {
            0x8c => {
                let n = self.src.byte("SHORT_BINUNICODE")? as usize;
                let v = if n <= 64 && self.src.end - self.src.pos >= n {
                    let (a, b) = (self.src.pos, self.src.pos + n);
                    self.src.pos = b;
                    match self.strings.get(&self.src.buf[a..b]) {
                        Some(rc) => Value::Str(rc.clone()),
                        None => {
                            let bytes = self.src.buf[a..b].to_vec();
                            self.string(offset, bytes)?
                        }
                    }
                } else {
                    let bytes = self.src.vec(n as u64, "SHORT_BINUNICODE")?;
                    self.string(offset, bytes)?
                };
                self.push(offset, v)?
            }
            b'V' => {
                let line = self.src.line("UNICODE")?;
                let text = raw_unicode_escape(&line).ok_or_else(|| self.malformed(offset, "bad UNICODE escape"))?;
                let v = self.string(offset, text.into_bytes())?;
                self.push(offset, v)?
            }
            b'S' => {
                let line = self.src.line("STRING")?;
                let bytes = python_string_literal(&line)
                    .ok_or_else(|| self.malformed(offset, "bad STRING literal (expected a quoted string)"))?;
                // Protocol 0's STRING is a byte string; text where it is UTF-8.
                let v = match String::from_utf8(bytes) {
                    Ok(t) => self.string(offset, t.into_bytes())?,
                    Err(e) => {
                        let b = e.into_bytes();
                        self.charge(offset, b.len() as u64)?;
                        Value::Bytes(Rc::new(b))
                    }
                };
                self.push(offset, v)?
            }
            b'X' => {
                let n = u32::from_le_bytes(self.src.array::<4>("BINUNICODE")?) as u64;
                let bytes = self.src.vec(n, "BINUNICODE")?;
                let v = self.string(offset, bytes)?;
                self.push(offset, v)?
            }
            0x8d => {
                let n = u64::from_le_bytes(self.src.array::<8>("BINUNICODE8")?);
                let bytes = self.src.vec(n, "BINUNICODE8")?;
                let v = self.string(offset, bytes)?;
                self.push(offset, v)?
            }
            b'C' | b'U' => {
                let n = self.src.byte("SHORT_BINBYTES")? as u64;
                let bytes = self.src.vec(n, "SHORT_BINBYTES")?;
                self.charge(offset, n)?;
                self.push(offset, Value::Bytes(Rc::new(bytes)))?
            }
            b'B' | b'T' => {
                let n = u32::from_le_bytes(self.src.array::<4>("BINBYTES")?) as u64;
                let bytes = self.src.vec(n, "BINBYTES")?;
                self.charge(offset, n)?;
                self.push(offset, Value::Bytes(Rc::new(bytes)))?
            }
            0x8e | 0x96 => {
                let n = u64::from_le_bytes(self.src.array::<8>("BINBYTES8")?);
                let bytes = self.src.vec(n, "BINBYTES8")?;
                self.charge(offset, n)?;
                self.push(offset, Value::Bytes(Rc::new(bytes)))?
            }
            _ => return Err(PickleError::UnknownOpcode { offset, op }),
        }
        Ok(())
    }

    /// PUT and GET in their forms: the memo.
    fn memo_op(&mut self, offset: u64, op: u8) -> Result<(), PickleError> {
        match op {
            0x94 => {
                let idx = (self.memo.len + self.memo_sparse.len()) as u64;
                self.memo_put(offset, idx)?
            }
            b'q' => {
                let idx = self.src.byte("BINPUT")? as u64;
                self.memo_put(offset, idx)?
            }
            b'r' => {
                let idx = u32::from_le_bytes(self.src.array::<4>("LONG_BINPUT")?) as u64;
                self.memo_put(offset, idx)?
            }
            b'p' => {
                let idx = self.text_index(offset, "PUT")?;
                self.memo_put(offset, idx)?
            }
            b'h' => {
                let idx = self.src.byte("BINGET")? as u64;
                self.memo_get(offset, idx)?
            }
            b'j' => {
                let idx = u32::from_le_bytes(self.src.array::<4>("LONG_BINGET")?) as u64;
                self.memo_get(offset, idx)?
            }
            b'g' => {
                let idx = self.text_index(offset, "GET")?;
                self.memo_get(offset, idx)?
            }
            _ => return Err(PickleError::UnknownOpcode { offset, op }),
        }
        Ok(())
    }

    /// APPEND(S) and SETITEM(S): values into the list or dict below them.
    fn fill(&mut self, offset: u64, op: u8) -> Result<(), PickleError> {
        match op {
            b'a' => {
                let v = self.pop(offset)?;
                let l = self.list_target(offset, self.top(offset)?)?;
                let v = self.maybe_compact(offset, v)?;
                l.borrow_mut().push(v);
            }
            b'e' | 0x90 => {
                let m = self.marks.pop().ok_or_else(|| self.malformed(offset, "no MARK on the stack"))?;
                if m == 0 {
                    return Err(self.malformed(offset, "APPENDS with no list below its MARK"));
                }
                let l = self.list_target(offset, &self.stack[m - 1])?;
                let mut stack = std::mem::take(&mut self.stack);
                let n = stack.len() - m;
                if l.borrow().runs.is_empty() {
                    l.borrow_mut().items.reserve(n);
                }
                let mut res = Ok(());
                for v in stack.drain(m..) {
                    // The list is borrowed only to push: a dict may hold
                    // the very list it is appended to.
                    match self.maybe_compact(offset, v) {
                        Ok(v) => l.borrow_mut().push(v),
                        Err(e) => {
                            res = Err(e);
                            break;
                        }
                    }
                }
                stack.truncate(m);
                self.stack = stack;
                res?;
            }
            b's' => {
                let v = self.pop(offset)?;
                let k = self.pop(offset)?;
                let d = self.dict_target(offset, self.top(offset)?)?;
                let mut d = d.borrow_mut();
                d.declined = false;
                d.items.push((k, v));
            }
            b'u' => {
                let m = self.marks.pop().ok_or_else(|| self.malformed(offset, "no MARK on the stack"))?;
                if (self.stack.len() - m) % 2 != 0 {
                    return Err(self.malformed(offset, "SETITEMS with an odd number of values"));
                }
                if m == 0 {
                    return Err(self.malformed(offset, "SETITEMS with no dict below its MARK"));
                }
                let d = self.dict_target(offset, &self.stack[m - 1])?;
                // A dict filled at once may be a trace entry: compact it
                // straight from the stack, never building its items.
                let fresh = d.borrow().items.is_empty();
                let mut compacted = None;
                if fresh {
                    let mut stack = std::mem::take(&mut self.stack);
                    let r = self.compact_pairs(offset, &mut stack[m..]);
                    self.stack = stack;
                    compacted = r?;
                }
                if let Some(id) = compacted {
                    self.stack.truncate(m);
                    self.release_dict_memo(&d, id);
                    self.stack[m - 1] = Value::Entry(id);
                } else {
                    let mut d = d.borrow_mut();
                    d.declined = fresh;
                    d.items.reserve((self.stack.len() - m) / 2);
                    let mut it = self.stack.drain(m..);
                    while let (Some(k), Some(v)) = (it.next(), it.next()) {
                        d.items.push((k, v));
                    }
                }
            }
            _ => return Err(PickleError::UnknownOpcode { offset, op }),
        }
        Ok(())
    }

    /// MARK, POP, DUP and the containers built from the stack.
    fn build(&mut self, offset: u64, op: u8) -> Result<(), PickleError> {
        match op {
            b'}' => {
                self.charge(offset, CONTAINER)?;
                self.push(offset, Value::Dict(Rc::new(RefCell::new(Dict::default()))))?
            }
            b']' => {
                self.charge(offset, CONTAINER)?;
                self.push(offset, Value::List(Rc::new(RefCell::new(List::default()))))?
            }
            b')' => {
                self.charge(offset, CONTAINER)?;
                self.push(offset, Value::Tuple(Rc::new(Tuple::default())))?
            }
            0x8f => {
                self.charge(offset, CONTAINER)?;
                self.push(offset, Value::List(Rc::new(RefCell::new(List::default()))))?
            }
            b'(' => {
                if self.marks.len() >= self.limits.max_marks {
                    return Err(PickleError::Limit { offset, what: "open MARKs", limit: self.limits.max_marks as u64 });
                }
                self.charge(offset, 8)?;
                self.marks.push(self.stack.len());
            }
            b'0' => {
                let v = self.pop(offset)?;
                drop_iteratively(vec![v]);
            }
            b'1' => {
                let items = self.pop_mark(offset)?;
                drop_iteratively(items);
            }
            b'2' => {
                let v = self.top(offset)?.clone();
                self.push(offset, v)?
            }
            b'l' => {
                let items = self.pop_mark(offset)?;
                self.charge(offset, CONTAINER)?;
                self.push(offset, Value::List(Rc::new(RefCell::new(List::new(items)))))?
            }
            b't' | 0x91 => {
                let items = self.pop_mark(offset)?;
                self.charge(offset, CONTAINER)?;
                self.push(offset, Value::Tuple(Rc::new(Tuple(items))))?
            }
            b'd' => {
                let items = self.pop_mark(offset)?;
                if items.len() % 2 != 0 {
                    return Err(self.malformed(offset, "DICT with an odd number of values"));
                }
                self.charge(offset, CONTAINER)?;
                let mut d = Dict::default();
                let mut it = items.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    d.items.push((k, v));
                }
                self.push(offset, Value::Dict(Rc::new(RefCell::new(d))))?
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                let floor = self.marks.last().copied().unwrap_or(0);
                if self.stack.len() < floor + n {
                    return Err(self.malformed(offset, "TUPLE with too few values on the stack"));
                }
                let items = self.stack.split_off(self.stack.len() - n);
                self.charge(offset, CONTAINER)?;
                self.push(offset, Value::Tuple(Rc::new(Tuple(items))))?
            }
            _ => return Err(PickleError::UnknownOpcode { offset, op }),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memo_of_entries_stacks_and_strings_keeps_two_bytes_a_slot_and_reads_back() {
        let mut m = Memo::default();
        let n = 5 * MEMO_CHUNK + 7;
        // PyTorch's pickle memoizes a new 'N/A' per entry: one string here,
        // as the decoder interns it, and a few others.
        let na: Rc<String> = Rc::new("N/A".into());
        let other: Vec<Rc<String>> = (0..3).map(|i| Rc::new(format!("s{i}"))).collect();
        let want = |i: usize| match i % 5 {
            0 => Value::Stack(i as u32),
            1 => Value::Str(na.clone()),
            2 => Value::Str(other[i % 3].clone()),
            _ => Value::Entry(i as u32),
        };
        for i in 0..n {
            m.push(want(i));
        }
        // A chunk with anything else in it (a number here) stays as values.
        m.push(Value::Int(3));
        for i in 0..MEMO_CHUNK as u32 * 2 {
            m.push(Value::Entry(i));
        }
        let compact: Vec<bool> = m.compact.iter().map(|c| !c.is_values()).collect();
        assert_eq!(compact, [true, true, true, true, true, false, true, true]);
        // The chunks not yet sealed take four bytes a slot, sealed two.
        assert!(matches!(m.compact[7], Packed::Wide(_)));
        // In two bytes a slot: stack ids here are below 2^14, and entries
        // near their chunk's first.
        assert!(matches!(m.compact[1], Packed::Narrow { .. }));
        // Stack ids past 2^14 take four.
        assert!(matches!(m.compact[4], Packed::Wide(_)));
        // Each string kept once.
        assert_eq!(m.strs.len(), 4);
        for i in 0..n {
            let got = m.get(i).unwrap();
            assert_eq!(format!("{got:?}"), format!("{:?}", want(i)), "slot {i}");
            if let (Value::Str(a), Value::Str(b)) = (&got, &want(i)) {
                assert!(Rc::ptr_eq(a, b), "slot {i}: the same string, shared");
            }
            // What the fast path reads: strings and dicts of chunks kept
            // as values only.
            assert!(m.get_ref(i).is_none() || i >= 5 * MEMO_CHUNK);
        }
        assert_eq!(m.get_ref(n).and_then(|v| v.as_i64()), Some(3));
        // A PUT over an old slot makes its chunk values again.
        *m.get_mut(5).unwrap() = Value::Int(9);
        assert_eq!(m.get_ref(5).and_then(|v| v.as_i64()), Some(9));
        assert!(matches!(m.get_ref(6), Some(Value::Str(s)) if Rc::ptr_eq(s, &na)));
        assert!(matches!(m.get_ref(8), Some(Value::Entry(8))));
        assert!(m.compact[0].is_values() && !m.compact[1].is_values());
        assert!(m.get(m.len).is_none());
    }

    #[test]
    fn compact_slots_pushed_as_codes_read_back_as_the_values_they_stand_for() {
        let na: Rc<String> = Rc::new("N/A".into());
        let mut by_value = Memo::default();
        let mut by_code = Memo::default();
        // The string compacted once (as the fast path's first 'N/A' is), then
        // entries, stacks and that string as codes, and a value without a
        // compact form in the middle of a chunk.
        by_value.push(Value::Str(na.clone()));
        by_code.push(Value::Str(na.clone()));
        for i in 1..3 * MEMO_CHUNK as u32 - 1 {
            let (v, code) = match i % 3 {
                0 => (Value::Entry(i), Memo::code_of_id(i, false)),
                1 => (Value::Stack(i), Memo::code_of_id(i, true)),
                _ => (Value::Str(na.clone()), by_code.last_str_code(b"N/A")),
            };
            if i == MEMO_CHUNK as u32 + 5 {
                by_code.push(Value::Int(7));
                by_value.push(Value::Int(7));
            }
            by_value.push(v.clone());
            match code {
                Some(x) => by_code.push_code(x),
                None => by_code.push(v),
            }
        }
        assert_eq!(by_code.last_str_code(b"N/B"), None);
        assert_eq!(Memo::code_of_id(Memo::ROOM, false), None);
        assert_eq!(by_code.len, by_value.len);
        for i in 0..by_code.len {
            assert_eq!(format!("{:?}", by_code.get(i)), format!("{:?}", by_value.get(i)), "slot {i}");
        }
        // The chunk with the number became values; the others are compact.
        let compact: Vec<bool> = by_code.compact.iter().map(|c| !c.is_values()).collect();
        assert_eq!(compact, [true, false, true]);
        assert_eq!(by_code.strs.len(), 1);
    }

    fn decode_bytes(b: &[u8]) -> Result<Value, PickleError> {
        decode(b, &mut (), Limits::default())
    }

    #[test]
    fn decodes_python_protocol4_data() {
        // pickle.dumps({'a': [1, -2, 2**40, 'x', None, True, 1.5], 'b': (1, 2)}, protocol=4)
        let p = b"\x80\x04\x955\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01J\xfe\xff\xff\xff\x8a\x06\x00\x00\x00\x00\x00\x01\x8c\x01x\x94N\x88G?\xf8\x00\x00\x00\x00\x00\x00e\x8c\x01b\x94K\x01K\x02\x86\x94u.";
        let v = decode_bytes(p).unwrap();
        let a = v.get("a").unwrap().items().unwrap();
        assert_eq!(a[0].as_i64(), Some(1));
        assert_eq!(a[1].as_i64(), Some(-2));
        assert_eq!(a[2].as_u64(), Some(1 << 40));
        assert_eq!(a[3].as_str(), Some("x"));
        assert!(matches!(a[4], Value::None));
        assert_eq!(a[5].as_bool(), Some(true));
        assert_eq!(a[6].as_f64(), Some(1.5));
        let b = v.get("b").unwrap().items().unwrap();
        assert_eq!((b[0].as_i64(), b[1].as_i64()), (Some(1), Some(2)));
    }

    #[test]
    fn memo_entries_are_shared_not_copied() {
        // x = [1]; pickle.dumps([x, x], protocol=4)
        let p = b"\x80\x04\x95\x0c\x00\x00\x00\x00\x00\x00\x00]\x94(]\x94K\x01ah\x01e.";
        let v = decode_bytes(p).unwrap();
        let items = v.items().unwrap();
        match (&items[0], &items[1]) {
            (Value::List(a), Value::List(b)) => assert!(Rc::ptr_eq(a, b)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn text_put_and_get_share_the_memo() {
        // [[7], <GET 0>] with the inner list stored by PUT 0 (protocol 0/1 style).
        let p = b"\x80\x02](]p0\nK\x07ag0\ne.";
        let v = decode_bytes(p).unwrap();
        let items = v.items().unwrap();
        match (&items[0], &items[1]) {
            (Value::List(a), Value::List(b)) => assert!(Rc::ptr_eq(a, b)),
            other => panic!("{other:?}"),
        }
        let e = decode_bytes(b"\x80\x02]g12x\n.").unwrap_err();
        assert_eq!(e.to_string(), "byte 3: bad GET index");
    }

    #[test]
    fn nine_byte_longs_hold_u64_addresses() {
        // pickle.dumps(2**64 - 512, protocol=4)[11:]
        let p = b"\x80\x04\x8a\x09\x00\xfe\xff\xff\xff\xff\xff\xff\x00.";
        assert_eq!(decode_bytes(p).unwrap().as_u64(), Some(u64::MAX - 511));
    }

    #[test]
    fn refuses_code_with_the_offset() {
        // pickle.dumps of a class instance that would call os.system through REDUCE
        let p = b"\x80\x04\x95\x1d\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94\x8c\x06system\x94\x93\x94\x8c\x02id\x94\x85\x94R\x94.";
        let e = decode_bytes(p).unwrap_err();
        assert_eq!(e.to_string(), "byte 28: refusing opcode STACK_GLOBAL: snapshots contain only data, and this reader never constructs objects or runs code");
        let e = decode_bytes(b"\x80\x02cos\nsystem\n.").unwrap_err();
        assert!(matches!(e, PickleError::Refused { offset: 2, name: "GLOBAL" }), "{e}");
    }

    #[test]
    fn lying_lengths_and_truncation_are_errors_without_allocating() {
        let e = decode_bytes(b"\x80\x04\x8d\x00\x00\x00\x80\x02\x00\x00\x00abc").unwrap_err();
        assert!(matches!(e, PickleError::Truncated { .. }), "{e}");
        let e = decode_bytes(b"\x80\x04]\x94(K\x01").unwrap_err();
        assert!(matches!(e, PickleError::Truncated { offset: 7, .. }), "{e}");
        let e = decode_bytes(b"\x80\x04h\x07.").unwrap_err();
        assert_eq!(e.to_string(), "byte 2: memo index 7 was never stored");
    }

    #[test]
    fn a_dict_appended_to_a_list_it_contains_does_not_panic() {
        // l = []; d = {}; d['action'] = 'alloc'; d['frames'] = l; l.extend([d])
        // (SETITEM one at a time, then APPENDS, so the compactor inspects d
        // while it is being appended to l).
        let p = b"\x80\x04]\x94(}\x94\x8c\x06action\x94\x8c\x05alloc\x94s\x8c\x06frames\x94h\x00se.";
        let mut c = Inspect::default();
        let v = decode(&p[..], &mut c, Limits::default()).unwrap();
        assert_eq!(c.seen, 1);
        assert_eq!(v.items().map(|i| i.len()), Some(1));
    }

    #[derive(Default)]
    struct Inspect {
        seen: u32,
    }

    impl Compactor for Inspect {
        fn compact(&mut self, kv: &[Value]) -> Result<Option<u32>, String> {
            self.seen += kv.chunks_exact(2).any(|p| p[0].as_str() == Some("action")) as u32;
            Ok(None)
        }
        fn compact_list(&mut self, _key: &str, list: &List) -> Option<u32> {
            // Looks at the list the dict is being appended to.
            let _ = list;
            None
        }
    }

    #[test]
    fn a_million_nested_lists_neither_overflow_nor_blow_up() {
        let mut p = vec![0x80, 0x04];
        p.extend(std::iter::repeat_n(b']', 1_000_000));
        p.extend(std::iter::repeat_n(b'a', 999_999));
        p.push(b'.');
        // A million lists cost more than the default allowance of a 2 MB
        // input; with room for them, decoding and dropping never recurse.
        let v = decode(&p[..], &mut (), Limits { slack: 512 << 20, ..Limits::default() }).unwrap();
        drop(v);
        assert!(decode_bytes(&p).unwrap_err().to_string().contains("exceeds the decoder's limit"));
    }
}
