//! PyTorch's memory-snapshot schema (docs/design/pytorch-allocator.md §12) on top of the pickle decoder:
//! every version from the bare list of segments of 1.x to torch 2.15's
//! `device_traces` with `allocator_settings`, `external_annotations`, `pool_id`,
//! `annotate` entries and host memory; what each release added is kept as evidence
//! of which release wrote the file (`ReleaseEvidence`).

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::rc::Rc;
use std::sync::Arc;

use super::pickle::{decode_parallel, Compactor, Dict, EntryFields, FastHash, Limits, List, Parallel, Shared, Value};
use super::{
    Annotation, DeviceTrace, Frame, RecordedBlock, RecordedSegment, ReleaseEvidence, Settings, Trace, TraceError,
    TraceFormat,
};
use crate::alloc::{Action, BlockState, Event, Events};

/// Trace entries as columns, filled while the pickle is decoded.
#[derive(Default)]
struct EntryColumns {
    /// Each entry's event, time and stack, made into columns on a thread
    /// of their own (and handed to the tap there, if one takes them).
    rows: super::rows::Rows,
    /// The columns once the decoding is done (`take_back`). Legacy `free`
    /// entries hold `free_requested` here and are listed in `special`.
    events: Arc<Events>,
    time_us: super::Times,
    stack: Arc<Vec<u32>>,
    /// Entries that are not one plain event: legacy `free`, `user_defined`.
    special: HashMap<u32, Kind>,
    /// Frames by the identity of their (memo-shared) dicts, which are kept
    /// alive here so an address cannot be reused.
    frame_ids: HashMap<usize, u32, FastHash>,
    frames: Vec<Shared<Dict>>,
    /// Call stacks as lists of frame ids (ids are index + 1; 0 = none).
    stack_ids: HashMap<Vec<u32>, u32, FastHash>,
    stacks: Vec<Vec<u32>>,
    /// Decode entries only through the generic path (tests compare the two).
    generic_only: bool,
    /// Entries the fast path decoded.
    fast_taken: usize,
    /// Of those, the entries worker threads resolved.
    coded_taken: usize,
    /// Reused key buffers for stack lookups.
    scratch: Vec<u32>,
    ptr_scratch: Vec<usize>,
    /// Stacks by the identities of their (pinned) frame dicts.
    stack_by_ptrs: HashMap<Vec<usize>, u32, FastHash>,
    /// The key strings, recognised by identity once seen (and kept alive
    /// here so the identity stays theirs): see `KEYS`.
    key_rcs: [Option<Rc<String>>; 10],
    /// `user_defined` entries (torch ~2.4): record_function markers.
    user_defined: Vec<(u32, String)>,
    /// Entries of exact-address allocations (`mallocWithAddress`, 2.13+).
    exact: Vec<u32>,
    /// `annotate` entries' texts (2.14+), by entry.
    notes: Vec<(u32, String)>,
    /// Entries with an action this reader does not know, by action: skipped.
    unknown: std::collections::BTreeMap<String, usize>,
    /// Any entry carried `pool_id` (2.12+) / `internal_metadata` (2.15+).
    pool_ids: bool,
    internal_metadata: bool,
    /// Any entry was an `annotate` (2.14+), so that no pass over every
    /// event asks it once they are read.
    annotate: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Action(Action),
    /// Pre-2.1 `free`: both phases at once.
    LegacyFree,
    UserDefined,
    /// An action a later release may add: counted, not replayed.
    Unknown,
}

fn kind_of(name: &str) -> Option<Kind> {
    match name {
        "free" => Some(Kind::LegacyFree),
        "user_defined" => Some(Kind::UserDefined),
        _ => Action::from_name(name).map(Kind::Action),
    }
}

const KEYS: [&str; 10] = [
    "action",
    "addr",
    "device_free",
    "size",
    "stream",
    "time_us",
    "frames",
    "pool_id",
    "user_metadata",
    "internal_metadata",
];

impl Compactor for EntryColumns {
    fn compact(&mut self, kv: &[Value]) -> Result<Option<u32>, String> {
        // One pass over the keys; most dicts (frames, blocks) have no action.
        let (mut action, mut addr, mut device_free, mut size, mut stream, mut time, mut frames) =
            (None, None, None, None, None, None, None);
        let (mut pool, mut exact, mut internal, mut note) = (None, false, false, None);
        for pair in kv.chunks_exact(2) {
            let (k, v) = (&pair[0], &pair[1]);
            let Value::Str(ks) = k else { continue };
            let field = match self.key_rcs.iter().position(|x| x.as_ref().is_some_and(|x| Rc::ptr_eq(x, ks))) {
                Some(f) => f,
                None => match KEYS.iter().position(|&name| name == ks.as_str()) {
                    Some(f) => {
                        self.key_rcs[f] = Some(ks.clone());
                        f
                    }
                    None => continue,
                },
            };
            match field {
                0 => action = v.as_str(),
                1 => addr = v.as_u64(),
                2 => device_free = v.as_u64(),
                3 => size = v.as_u64(),
                4 => stream = v.as_u64(),
                5 => time = v.as_i64(),
                6 => frames = Some(v),
                7 => {
                    if let Value::Tuple(t) = v {
                        if let [a, b] = t.0.as_slice() {
                            pool = a.as_u64().zip(b.as_u64());
                        }
                    }
                }
                _ => {
                    internal |= field == 9;
                    exact |= v.as_str().is_some_and(|t| t.ends_with("mallocWithAddress"));
                    if field == 8 {
                        note = v.as_str().map(|t| Rc::new(t.to_string()));
                    }
                }
            }
        }
        let Some(name) = action else { return Ok(None) };
        let stack = match frames {
            Some(Value::Stack(s)) => *s,
            Some(Value::List(l)) => self.intern_stack(&l.borrow()),
            _ => 0,
        };
        let label = || kv.chunks_exact(2).find(|p| p[0].as_str() == Some("name")).and_then(|p| p[1].as_str());
        let label = label().map(str::to_string);
        let note = note.filter(|_| action == Some("annotate"));
        let tags = EntryFields { pool, exact, internal, note, ..Default::default() };
        let kind = self.kind_named(name);
        self.push_kind(kind, addr, device_free, size, stream, time, stack, label, &tags).map(Some)
    }

    fn compact_list(&mut self, key: &str, list: &List) -> Option<u32> {
        (key == "frames").then(|| self.intern_stack(list))
    }

    fn fast_entries(&self) -> bool {
        !self.generic_only
    }

    fn next_entry(&self) -> Option<u32> {
        u32::try_from(self.entries()).ok()
    }

    fn entry(&mut self, f: &EntryFields) -> Result<u32, String> {
        self.fast_taken += 1;
        let name = f.action.as_deref().ok_or("trace entry without an action")?;
        let kind = self.kind_named(name);
        self.push_kind(kind, f.addr, f.device_free, f.size, f.stream, f.time_us, f.stack, None, f)
    }

    fn stack_of(&mut self, frames: &[Value]) -> u32 {
        self.intern_frames(frames)
    }

    /// The actions whose entries are events and nothing else, by their
    /// place in `Action::ALL`; `annotate` keeps its text, the others
    /// (`free`, `user_defined`, unknown names) are kept aside by name.
    fn action_code(&self, name: &str) -> Option<u8> {
        match kind_of(name)? {
            Kind::Action(Action::Annotate) => None,
            Kind::Action(a) => Action::ALL.iter().position(|&x| x == a).and_then(|i| u8::try_from(i).ok()),
            Kind::LegacyFree | Kind::UserDefined | Kind::Unknown => None,
        }
    }

    fn entry_coded(&mut self, code: u8, f: &EntryFields) -> Result<u32, String> {
        let action = *Action::ALL.get(usize::from(code)).ok_or("trace entry with an unknown action code")?;
        self.fast_taken += 1;
        self.coded_taken += 1;
        self.push_kind(Kind::Action(action), f.addr, f.device_free, f.size, f.stream, f.time_us, f.stack, None, f)
    }
}

impl EntryColumns {
    /// An action name's kind; an unknown one is counted.
    fn kind_named(&mut self, name: &str) -> Kind {
        kind_of(name).unwrap_or_else(|| {
            // Bounded: the first 64 names are kept, the rest counted under one.
            let key = if self.unknown.len() < 64 || self.unknown.contains_key(name) { name } else { "…" };
            *self.unknown.entry(key.chars().take(64).collect()).or_default() += 1;
            Kind::Unknown
        })
    }

    /// An entry of a known kind: its row, and where its kind or tags ask,
    /// what is kept aside.
    #[allow(clippy::too_many_arguments)]
    fn push_kind(
        &mut self,
        kind: Kind,
        addr: Option<u64>,
        device_free: Option<u64>,
        size: Option<u64>,
        stream: Option<u64>,
        time: Option<i64>,
        stack: u32,
        label: Option<String>,
        tags: &EntryFields,
    ) -> Result<u32, String> {
        self.pool_ids |= tags.pool.is_some();
        self.internal_metadata |= tags.internal;
        self.annotate |= kind == Kind::Action(Action::Annotate);
        let addr = if kind == Kind::Action(Action::Oom) { device_free.or(addr) } else { addr };
        let id = self.entries() as u32;
        let action = match kind {
            Kind::Action(a) => a,
            Kind::LegacyFree | Kind::UserDefined | Kind::Unknown => {
                self.special.insert(id, kind);
                Action::FreeRequested
            }
        };
        if tags.exact {
            self.exact.push(id);
        }
        if let (Kind::Action(Action::Annotate), Some(n)) = (kind, &tags.note) {
            // Bounded by the file: one string per entry that carries one.
            self.notes.push((id, n.chars().take(1024).collect()));
        }
        if kind == Kind::UserDefined {
            self.user_defined.push((id, label.unwrap_or_else(|| "user_defined".into())));
        }
        let event = Event::new(action, addr.unwrap_or(0), size.unwrap_or(0), stream.unwrap_or(0));
        self.rows.push(super::rows::Row { event, time_us: time.unwrap_or(0), stack });
        Ok(id)
    }

    /// Entries decoded so far.
    fn entries(&self) -> usize {
        self.rows.len()
    }

    /// Every entry's event, time and stack in `events`, `time_us` and
    /// `stack` (back from the tap where one took them); `whole`: the device
    /// whose events they all are, in order.
    fn take_back(&mut self, whole: Option<i32>) {
        let c = self.rows.finish(whole);
        (self.events, self.time_us, self.stack) = (c.events, c.time_us, c.stack);
    }

    /// Interns a list of frame dicts by content. The pickler gives most
    /// entries a list of their own but shares the frame dicts in it.
    fn intern_stack(&mut self, list: &List) -> u32 {
        self.intern_frames(list.values())
    }

    fn intern_frames(&mut self, frames: &[Value]) -> u32 {
        if frames.is_empty() {
            return 0;
        }
        // Fast path: the same frame dicts (by identity) as a stack seen
        // before. Every dict in such a key was pinned when the key was
        // stored, so an address cannot have been reused by another dict.
        let mut ptrs = std::mem::take(&mut self.ptr_scratch);
        ptrs.clear();
        ptrs.extend(frames.iter().map(|f| match f {
            Value::Dict(fd) => Rc::as_ptr(fd) as usize,
            _ => 0,
        }));
        if let Some(&s) = self.stack_by_ptrs.get(ptrs.as_slice()) {
            self.ptr_scratch = ptrs;
            return s;
        }
        let mut key = std::mem::take(&mut self.scratch);
        key.clear();
        for f in frames {
            let Value::Dict(fd) = f else { continue };
            let ptr = Rc::as_ptr(fd) as usize;
            let id = match self.frame_ids.get(&ptr) {
                Some(&id) => id,
                None => {
                    self.frames.push(fd.clone());
                    let id = self.frames.len() as u32;
                    self.frame_ids.insert(ptr, id);
                    id
                }
            };
            key.push(id);
        }
        let s = match self.stack_ids.get(key.as_slice()) {
            Some(&s) => {
                self.scratch = key;
                s
            }
            None => {
                self.stacks.push(key.clone());
                let s = self.stacks.len() as u32;
                self.stack_ids.insert(key, s);
                s
            }
        };
        if self.stack_by_ptrs.len() < 1 << 16 {
            self.stack_by_ptrs.insert(ptrs, s);
        }
        s
    }
}

/// A frame as we keep it: its names with any control character escaped
/// (they reach terminals, pictures and JSON: docs/design/security.md).
fn frame_of(v: &Value) -> Frame {
    let s = |k: &str| {
        v.get(k)
            .and_then(|x| x.as_str().map(|t| Arc::<str>::from(super::printable::escape(t).as_ref())))
            .unwrap_or_default()
    };
    Frame { name: s("name"), filename: s("filename"), line: v.get("line").and_then(|x| x.as_i64()).unwrap_or(0) }
}

struct Walker {
    stacks: Vec<Vec<Frame>>,
    interned: HashMap<Vec<Frame>, u32>,
    /// Frames by the identity of their (memo-shared) dicts, so a frame
    /// referenced from many blocks is made once.
    made: HashMap<usize, Frame>,
    /// What is left of the decoder's allowance for the frames of stacks.
    budget: u64,
}

impl Walker {
    /// The stack of a block's frames not interned while decoding (a
    /// pre-2.1 `history` entry's), charged to the allowance.
    fn intern_value(&mut self, v: Option<Value>, path: &str) -> Result<u32, TraceError> {
        let items = v.and_then(|f| f.items()).unwrap_or_default();
        let cost = (items.len() as u64 + 1) * std::mem::size_of::<Frame>() as u64;
        self.budget = self.budget.checked_sub(cost).ok_or_else(|| {
            schema(path, "its call stack's frames exceed the decoder's limit (24 times the unpacked bytes read, at most 16 per byte of a compressed file, plus 64 MiB)")
        })?;
        let frames = items
            .iter()
            .map(|f| match f {
                Value::Dict(d) => self.made.entry(Rc::as_ptr(d) as usize).or_insert_with(|| frame_of(f)).clone(),
                _ => frame_of(f),
            })
            .collect();
        Ok(self.intern(frames))
    }

    fn intern(&mut self, frames: Vec<Frame>) -> u32 {
        if frames.is_empty() {
            return 0;
        }
        if let Some(&id) = self.interned.get(&frames) {
            return id;
        }
        self.stacks.push(frames.clone());
        let id = self.stacks.len() as u32;
        self.interned.insert(frames, id);
        id
    }
}

fn schema(path: &str, msg: impl std::fmt::Display) -> TraceError {
    TraceError::Schema(format!("{path}: {msg}"))
}

fn req_u64(v: &Value, key: &str, path: &str) -> Result<u64, TraceError> {
    match v.get(key) {
        Some(x) => x.as_u64().ok_or_else(|| match x.as_i64() {
            Some(v) if v < 0 => schema(path, format!("'{key}' is negative ({v})")),
            _ => schema(path, format!("'{key}' is a {}, expected a non-negative integer", x.type_name())),
        }),
        None => Err(schema(path, format!("missing '{key}'"))),
    }
}

fn opt_u64(v: &Value, key: &str) -> Option<u64> {
    v.get(key).and_then(|x| x.as_u64())
}

fn list_of(v: &Value, path: &str) -> Result<Vec<Value>, TraceError> {
    v.items().ok_or_else(|| schema(path, format!("is a {}, expected a list", v.type_name())))
}

fn segment(v: &Value, path: &str, w: &mut Walker) -> Result<RecordedSegment, TraceError> {
    if !matches!(v, Value::Dict(_)) {
        return Err(schema(path, format!("is a {}, expected a dict", v.type_name())));
    }
    let address = req_u64(v, "address", path)?;
    let total_size = req_u64(v, "total_size", path)?;
    // A size no device holds (7·2^61 B, say) is a corrupt or hostile file:
    // every loop over sizes after this (the map's ticks, export) is bounded
    // by this check (docs/user/input.md).
    if total_size > MAX_SEGMENT_BYTES {
        return Err(schema(path, format!("'total_size' {total_size} is more than any device holds (256 TiB)")));
    }
    let end = address.checked_add(total_size).ok_or_else(|| schema(path, "the segment runs past the address space"))?;
    let blocks_v = v.get("blocks").ok_or_else(|| schema(path, "missing 'blocks'"))?;
    let mut blocks = Vec::new();
    let mut at = address;
    for (i, b) in list_of(&blocks_v, &format!("{path}.blocks"))?.iter().enumerate() {
        let bpath = format!("{path}.blocks[{i}]");
        let size = req_u64(b, "size", &bpath)?;
        let state_v = b.get("state").ok_or_else(|| schema(&bpath, "missing 'state'"))?;
        let state_name = state_v.as_str().ok_or_else(|| schema(&bpath, "'state' is not a string"))?;
        let state = BlockState::from_name(state_name)
            .or_else(|| (state_name == "active_awaiting_free").then_some(BlockState::ActivePendingFree))
            .ok_or_else(|| schema(&bpath, format!("unknown block state {state_name:?}")))?;
        // Before ~2.1 the requested size and stack lived in a `history` list.
        let history_last = b.get("history").and_then(|h| h.items()).and_then(|h| h.last().cloned());
        let requested_size = opt_u64(b, "requested_size")
            .or_else(|| history_last.as_ref().and_then(|h| opt_u64(h, "real_size")))
            .unwrap_or(size);
        let frames = b.get("frames").or_else(|| history_last.as_ref().and_then(|h| h.get("frames")));
        // Frame lists already interned while decoding share the entries' ids.
        let stack = match frames {
            Some(Value::Stack(s)) => s,
            other => w.intern_value(other, &bpath)?,
        };
        // PyTorch's blocks tile their segment in address order.
        let address = opt_u64(b, "address").unwrap_or(at);
        if address != at {
            return Err(schema(
                &bpath,
                format!("starts at {address:#x}, not where the block before it ends ({at:#x})"),
            ));
        }
        at = address.checked_add(size).filter(|&e| e <= end).ok_or_else(|| {
            schema(&bpath, format!("runs past the end of its segment ({total_size} bytes from {:#x})", address))
        })?;
        blocks.push(RecordedBlock { address, size, requested_size, state, stack });
    }
    if at != end {
        return Err(schema(
            path,
            format!("its blocks cover {} of its {total_size} bytes (blocks tile a segment)", at - address),
        ));
    }
    let small = match v.get("segment_type").and_then(|t| t.as_str().map(str::to_string)) {
        Some(t) => t == "small",
        None => total_size <= 2 << 20,
    };
    Ok(RecordedSegment {
        device: match v.get("device").map(|d| d.as_i64()) {
            None => 0,
            Some(Some(d)) if (0..=i32::MAX as i64).contains(&d) => d as i32,
            Some(_) => return Err(schema(path, "'device' is not a device index (0 to 2^31-1)")),
        },
        address,
        total_size,
        stream: opt_u64(v, "stream").unwrap_or(0),
        small,
        is_expandable: v.get("is_expandable").and_then(|x| x.as_bool()).unwrap_or(false),
        pool: v
            .get("segment_pool_id")
            .and_then(|p| p.items())
            .and_then(|p| Some((p.first()?.as_u64()?, p.get(1)?.as_u64()?)))
            .unwrap_or((0, 0)),
        blocks,
    })
}

/// The most bytes one segment may claim: 256 TiB, far past any device.
pub(crate) const MAX_SEGMENT_BYTES: u64 = 1 << 48;

/// Segments of one device never overlap (nor repeat): a snapshot whose do
/// describes no allocator's state.
fn check_disjoint(segments: &[RecordedSegment]) -> Result<(), TraceError> {
    let mut order: Vec<usize> = (0..segments.len()).collect();
    order.sort_by_key(|&i| (segments[i].device, segments[i].address));
    for w in order.windows(2) {
        let (a, b) = (&segments[w[0]], &segments[w[1]]);
        if a.device == b.device && b.address < a.address + a.total_size {
            return Err(schema(
                &format!("segments[{}]", w[1]),
                format!("overlaps segments[{}] (both at {:#x}… on device {})", w[0], b.address, a.device),
            ));
        }
    }
    Ok(())
}

fn settings(v: &Value) -> Settings {
    let rp = v.get("roundup_power2_divisions").and_then(|d| match d {
        Value::Dict(_) => {
            let mut out = [0u64; 16];
            for (i, slot) in out.iter_mut().enumerate() {
                *slot = opt_u64(&d, &(1u64 << i).to_string())?;
            }
            Some(out)
        }
        _ => None,
    });
    Settings {
        conf: v.get("PYTORCH_CUDA_ALLOC_CONF").and_then(|s| s.as_str().map(str::to_string)).unwrap_or_default(),
        max_split_size: v.get("max_split_size").and_then(|x| x.as_i64()),
        garbage_collection_threshold: v.get("garbage_collection_threshold").and_then(|x| x.as_f64()),
        expandable_segments: v.get("expandable_segments").and_then(|x| x.as_bool()),
        roundup_power2_divisions: rp,
    }
}

/// One copy of each text the annotations hold. The decoder shares a short
/// string's copy, so the few texts met last are known by that copy first,
/// without hashing their text.
#[derive(Default)]
struct Texts {
    all: HashSet<Arc<str>, FastHash>,
    recent: Vec<(Rc<String>, Arc<str>)>,
}

impl Texts {
    const RECENT: usize = 16;

    fn of(&mut self, s: &Rc<String>) -> Arc<str> {
        if let Some((_, t)) = self.recent.iter().find(|(r, _)| Rc::ptr_eq(r, s)) {
            return t.clone();
        }
        let t = match self.all.get(s.as_str()) {
            Some(t) => t.clone(),
            None => {
                let t: Arc<str> = s.as_str().into();
                self.all.insert(t.clone());
                t
            }
        };
        if self.recent.len() < Self::RECENT {
            self.recent.push((s.clone(), t.clone()));
        }
        t
    }
}

fn annotation(v: &Value, texts: &mut Texts) -> Option<Annotation> {
    let Value::Dict(d) = v else { return None };
    let d = d.borrow();
    let mut a = Annotation { device: 0, time_us: 0, fields: Vec::with_capacity(d.items.len().saturating_sub(2)) };
    for (k, val) in &d.items {
        let Value::Str(k) = k else { continue };
        match (k.as_str(), val) {
            ("device", x) => a.device = x.as_i64().unwrap_or(0) as i32,
            ("time_us", x) => a.time_us = x.as_i64().unwrap_or(0),
            (_, Value::Str(s)) => a.fields.push((texts.of(k), texts.of(s))),
            (_, x) if x.as_i64().is_some() => a.fields.push((texts.of(k), x.as_i64().unwrap_or(0).to_string().into())),
            _ => {}
        }
    }
    Some(a)
}

/// Reads a PyTorch snapshot pickle (already decompressed).
pub fn read_snapshot<R: Read>(r: R) -> Result<Trace, TraceError> {
    read_snapshot_sized(r, 0)
}

/// As `read_snapshot`, with the unpacked size if known: the event columns
/// are sized for it up front instead of growing by copies. (Capacity never
/// written costs no resident memory.)
pub fn read_snapshot_sized<R: Read>(r: R, unpacked_bytes: u64) -> Result<Trace, TraceError> {
    read_snapshot_with(r, unpacked_bytes, Decoding::default(), &super::ReadLimits::default()).map(|(t, _)| t)
}

/// As `read_snapshot_sized`, with the decoder's memory bounded by the bytes
/// of the file read (`ReadLimits::consumed`) rather than the unpacked bytes.
pub fn read_snapshot_limited<R: Read>(
    r: R,
    unpacked_bytes: u64,
    limits: &super::ReadLimits,
) -> Result<Trace, TraceError> {
    read_snapshot_with(r, unpacked_bytes, Decoding::default(), limits).map(|(t, _)| t)
}

/// An `annotate` entry (`torch.cuda.memory._annotate_tensor`, 2.14+) as an
/// annotation: its text, on the block it names.
fn annotate_note(device: i32, time_us: i64, addr: u64, text: &str) -> Annotation {
    Annotation {
        device,
        time_us,
        fields: vec![
            ("name".into(), text.into()),
            ("action".into(), "annotate".into()),
            ("addr".into(), format!("{addr:#x}").into()),
        ],
    }
}

/// The per-device traces of `device_traces` (`tv`), entries taken from
/// `cols`; `user_defined` entries become `annotations`.
fn device_traces(
    tv: Option<Value>,
    cols: &mut EntryColumns,
    annotations: &mut Vec<Annotation>,
) -> Result<Vec<DeviceTrace>, TraceError> {
    let mut devices: Vec<DeviceTrace> = Vec::new();
    if let Some(tv) = tv {
        let lists = list_of(&tv, "device_traces")?;
        // Each device's list of entries, read as ids only where needed: a
        // list of ten million ids is 40 MB (docs/measurements/benchmarks.md).
        let mut per_device: Vec<Shared<List>> = Vec::with_capacity(lists.len());
        for (d, dev) in lists.iter().enumerate() {
            let Value::List(list) = dev else {
                return Err(schema(
                    &format!("device_traces[{d}]"),
                    format!("is a {}, expected a list", dev.type_name()),
                ));
            };
            let l = list.borrow();
            if l.has_other_items() {
                let (i, e) = l
                    .items()
                    .into_iter()
                    .enumerate()
                    .find(|(_, e)| !matches!(e, Value::Entry(_)))
                    .unwrap_or((0, Value::None));
                return Err(schema(
                    &format!("device_traces[{d}][{i}]"),
                    format!("is a {}, expected a trace entry", e.type_name()),
                ));
            }
            drop(l);
            per_device.push(list.clone());
        }
        drop(lists);
        drop(tv);
        // The usual layout: one device whose entries are all of them, in
        // order; its columns move over without a copy.
        let n = cols.entries();
        let empty = |l: &Shared<List>| l.borrow().entry_ids().next().is_none();
        let whole = per_device.iter().filter(|l| !empty(l)).count() == 1
            && cols.special.is_empty()
            && per_device
                .iter()
                .find(|l| !empty(l))
                .is_some_and(|l| l.borrow().entry_ids().map(|x| x as usize).eq(0..n));
        cols.take_back(per_device.iter().position(|l| whole && !empty(l)).map(|d| d as i32));
        for (d, l) in per_device.iter().enumerate() {
            let mut dt = DeviceTrace { device: d as i32, ..Default::default() };
            if whole && !empty(l) {
                dt.events = std::mem::take(&mut cols.events);
                dt.time_us = std::mem::take(&mut cols.time_us);
                dt.stacks = std::mem::take(&mut cols.stack);
                dt.exact = cols.exact.iter().map(|&x| x as usize).collect();
                for (id, text) in &cols.notes {
                    let k = *id as usize;
                    annotations.push(annotate_note(
                        d as i32,
                        dt.time_us.get(k).unwrap_or(0),
                        dt.events.at(k).addr,
                        text,
                    ));
                }
                devices.push(dt);
                continue;
            }
            let v: Vec<u32> = l.borrow().entry_ids().collect();
            let mut made = super::DeviceColumns::default();
            for &id in &v {
                let id = id as usize;
                let (e, t, st) = (cols.events.at(id), cols.time_us.get(id).unwrap_or(0), cols.stack[id]);
                match cols.special.get(&(id as u32)) {
                    None => {
                        if cols.exact.binary_search(&(id as u32)).is_ok() {
                            dt.exact.push(made.len());
                        }
                        if let Ok(n) = cols.notes.binary_search_by_key(&(id as u32), |n| n.0) {
                            annotations.push(annotate_note(d as i32, t, e.addr, &cols.notes[n].1));
                        }
                        made.push(e, t, st);
                    }
                    Some(Kind::LegacyFree) => {
                        made.push(Event { action: Action::FreeRequested, ..e }, t, st);
                        made.push(Event { action: Action::FreeCompleted, ..e }, t, st);
                        dt.legacy_free += 1;
                    }
                    Some(Kind::Unknown) => {}
                    Some(_) => {
                        let label = cols.user_defined.iter().find(|(x, _)| *x as usize == id).map(|(_, l)| l.clone());
                        annotations.push(Annotation {
                            device: d as i32,
                            time_us: t,
                            fields: vec![("name".into(), label.unwrap_or_default().into())],
                        });
                    }
                }
            }
            (dt.events, dt.time_us, dt.stacks) = made.shared();
            devices.push(dt);
        }
    }
    Ok(devices)
}

/// How trace entries are decoded: tests compare the ways.
#[derive(Default)]
struct Decoding {
    /// Only through the generic decoder.
    generic_only: bool,
    parallel: Parallel,
}

/// How many entries the fast path decoded, how many of them worker threads
/// read, and how many they resolved too (the tests that compare the ways
/// read them).
#[cfg_attr(not(test), allow(dead_code))]
struct Taken {
    fast: usize,
    in_parallel: u64,
    on_workers: usize,
}

fn read_snapshot_with<R: Read>(
    r: R,
    unpacked_bytes: u64,
    how: Decoding,
    limits: &super::ReadLimits,
) -> Result<(Trace, Taken), TraceError> {
    // A trace entry takes at least ~40 bytes of pickle. The size is a hint
    // from the file: a failed reservation just means growing as usual.
    let n = (unpacked_bytes / 40).min(1 << 24) as usize;
    let rows = super::rows::Rows::new(n, limits.tap.clone());
    let mut cols = EntryColumns { generic_only: how.generic_only, rows, ..Default::default() };
    // With an explicit unpacked-size cap the user has vouched for the
    // unpacked bytes: the allowance follows them instead of the file.
    let consumed = if limits.max_unpacked.is_some() { None } else { limits.consumed.clone() };
    let lim = Limits { consumed, ..Limits::default() };
    let (root, charged) = decode_parallel(r, &mut cols, lim, how.parallel).map_err(TraceError::Pickle)?;
    let mut trace = Trace { format: TraceFormat::PytorchSnapshot, ..Default::default() };

    // Call stacks of trace entries, in the order they were first seen. Each
    // frame of each stack costs a `Frame` (its strings shared): a file that
    // references a few frames from many long stacks pays for them out of
    // the decoder's allowance (docs/user/input.md, "Bounds").
    let refs: u64 = cols.stacks.iter().map(|s| s.len() as u64 + 1).sum();
    let cost = refs.saturating_mul(std::mem::size_of::<Frame>() as u64);
    if charged.charged.saturating_add(cost) > charged.allowance {
        return Err(TraceError::Corrupt(format!(
            "the call stacks' {refs} frame references need {cost} bytes, past the decoder's limit of {} \
             (24 times the unpacked bytes read, at most 16 per byte of a compressed file, plus 64 MiB; --max-unpacked BYTES lets a compressed file use 24 times all its unpacked bytes)",
            charged.allowance
        )));
    }
    let budget = charged.allowance - charged.charged - cost;
    let mut w = Walker { stacks: Vec::new(), interned: HashMap::new(), made: HashMap::new(), budget };
    let frames: Vec<Frame> = cols.frames.iter().map(|d| frame_of(&Value::Dict(d.clone()))).collect();
    for st in &cols.stacks {
        w.stacks.push(st.iter().map(|&f| frames[f as usize - 1].clone()).collect());
    }

    let (segments_v, traces_v) = match &root {
        // torch.cuda.memory_snapshot() before device traces: a bare list.
        Value::List(_) => (Some(root.clone()), None),
        Value::Dict(_) => (root.get("segments"), root.get("device_traces")),
        other => return Err(schema("snapshot", format!("is a {}, expected a dict or a list", other.type_name()))),
    };
    let segments_v = segments_v.ok_or_else(|| schema("snapshot", "missing 'segments'"))?;
    let mut segments = Vec::new();
    for (i, s) in list_of(&segments_v, "segments")?.iter().enumerate() {
        segments.push(segment(s, &format!("segments[{i}]"), &mut w)?);
    }
    check_disjoint(&segments)?;

    let mut devices = device_traces(traces_v, &mut cols, &mut trace.annotations)?;

    // Segments join the device they name; a device index only names a
    // device, so memory stays bounded by what the file holds.
    let mut at: HashMap<i32, usize> = devices.iter().enumerate().map(|(i, d)| (d.device, i)).collect();
    for s in segments {
        let d = s.device;
        let i = *at.entry(d).or_insert_with(|| {
            devices.push(DeviceTrace { device: d, ..Default::default() });
            devices.len() - 1
        });
        devices[i].segments.push(s);
    }
    devices.sort_by_key(|d| d.device);
    let mut ev = ReleaseEvidence {
        pool_ids: cols.pool_ids,
        internal_metadata: cols.internal_metadata,
        exact_in_user_metadata: !cols.exact.is_empty() && !cols.internal_metadata,
        annotate: cols.annotate,
        unknown_actions: std::mem::take(&mut cols.unknown).into_iter().collect(),
        ..Default::default()
    };
    if let Value::Dict(_) = &root {
        ev.host_memory = root.get("host_segments").is_some() || root.get("host_traces").is_some();
        if let Some(s) = root.get("allocator_settings") {
            trace.settings = Some(settings(&s));
            ev.settings_keys_2_13 = s.get("max_round_threshold").is_some() || s.get("max_cached_size").is_some();
            ev.settings_recorded = true;
        }
        ev.recorded_version = root.get("torch_version").and_then(|v| v.as_str().map(str::to_string));
        if let Some(a) = root.get("external_annotations").and_then(|a| a.items()) {
            let mut texts = Texts::default();
            trace.annotations.extend(a.iter().filter_map(|a| annotation(a, &mut texts)));
        }
        if let Some(n) = root.get("gpumem_top_nogpu") {
            trace.format = TraceFormat::NoGpu;
            let notes = n.get("notes").and_then(|v| v.items()).unwrap_or_default();
            for pair in notes {
                let kv = pair.items().unwrap_or_default();
                if let (Some(what), Some(count)) =
                    (kv.first().and_then(|v| v.as_str()), kv.get(1).and_then(|v| v.as_u64()))
                {
                    trace.nogpu_notes.push((what.to_string(), count));
                }
            }
        }
    }
    trace.annotations.sort_by_key(|a| a.time_us);
    ev.has_entries = devices.iter().any(|d| !d.events.is_empty());
    trace.release = ev;
    trace.devices = devices;
    trace.stacks = w.stacks;
    drop(root);
    let taken = Taken { fast: cols.fast_taken, in_parallel: charged.in_parallel, on_workers: cols.coded_taken };
    Ok((trace, taken))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// Each event's call stack, as frames.
    fn event_frames(t: &Trace, d: &DeviceTrace) -> Vec<Vec<Frame>> {
        d.stacks.iter().map(|&s| if s == 0 { vec![] } else { t.stacks[s as usize - 1].clone() }).collect()
    }

    /// The trace entries' fast path, on one thread or several, and the
    /// generic decoder give the same trace, field for field, on real
    /// snapshots; several threads with shares small enough that their
    /// boundaries fall everywhere.
    #[test]
    fn fast_parallel_and_generic_entry_paths_agree_on_real_snapshots() {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/traces");
        let lim = crate::trace::ReadLimits::default();
        for name in [
            "gpt2_train.pickle.gz",
            "multistream_pipeline.pickle.gz",
            "fixture_py3000.pickle.gz",
            "gpt2_train_wrapped.pickle.gz",
            // Python's pickler's layout of what 2.12 to 2.15 added (tests/fixtures/releases/snapshots/make.py).
            "../releases/snapshots/torch212.pickle.gz",
            "../releases/snapshots/torch215.pickle.gz",
            "../releases/snapshots/torch213.pickle.gz",
        ] {
            let mut raw = Vec::new();
            flate2::read::MultiGzDecoder::new(std::fs::File::open(root.join(name)).unwrap())
                .read_to_end(&mut raw)
                .unwrap();
            let one = Decoding { parallel: Parallel::off(), ..Decoding::default() };
            let (fast, taken) = read_snapshot_with(&raw[..], raw.len() as u64, one, &lim).unwrap();
            let generic = Decoding { generic_only: true, parallel: Parallel::off() };
            let (slow, none) = read_snapshot_with(&raw[..], 0, generic, &lim).unwrap();
            assert_eq!((none.fast, taken.in_parallel), (0, 0));
            let events = fast.devices[0].events.len();
            assert!(taken.fast * 100 >= events * 99, "{name}: fast path took {}", taken.fast);
            let mut ways = vec![(fast, format!("{name} one thread")), (slow, format!("{name} generic"))];
            for (workers, share, grow) in [(3, 200, 0), (2, 777, 25), (5, 4096, 25), (7, 4096, 0)] {
                let par = Parallel { workers, share, grow, first_after: 0, retry_after: 0 };
                let (t, taken) =
                    read_snapshot_with(&raw[..], 0, Decoding { parallel: par, ..Decoding::default() }, &lim).unwrap();
                // All but each run's first entry, and those with a stack
                // not seen before (the generic decoder's).
                assert!(
                    taken.in_parallel as usize * 2 >= events,
                    "{name}: {} of {events} entries in parallel ({workers} × {share} B)",
                    taken.in_parallel
                );
                // Most resolved on the workers too, from what the decoding
                // thread learned in the windows before.
                assert!(
                    taken.on_workers * 3 >= events,
                    "{name}: {} of {events} entries resolved on the workers ({workers} × {share} B)",
                    taken.on_workers
                );
                ways.push((t, format!("{name} {workers} × {share} B")));
            }
            let (fast, _) = &ways[0];
            let a = &fast.devices[0];
            assert!(!a.events.is_empty(), "{name}");
            for (other, way) in &ways[1..] {
                let b = &other.devices[0];
                assert_eq!(a.events, b.events, "{way}");
                assert_eq!(a.time_us, b.time_us, "{way}");
                assert_eq!(event_frames(fast, a), event_frames(other, b), "{way}");
                assert_eq!(a.segments, b.segments, "{way}");
                assert_eq!(fast.settings, other.settings, "{way}");
                assert_eq!(a.exact, b.exact, "{way}");
                assert_eq!(fast.release, other.release, "{way}");
                assert_eq!(fast.annotations, other.annotations, "{way}");
            }
        }
    }

    /// A frame dict's memo slot written over between two entries that name
    /// the same slots: the later entry's stack is the new dict's, on every
    /// path (the fast path's stacks by slots must forget what they learned).
    /// Python's own unpickler reads the last two entries' frames as
    /// `other.py`, `model.py`.
    #[test]
    fn a_frame_slot_written_over_changes_the_stack_on_every_path() {
        let raw: &[u8] =
            b"\x80\x04}\x94(\x8c\x08segments\x94]\x94\x8c\x0ddevice_traces\x94]\x94(]\x94(}\x94(\x8c\x06action\
            \x94\x8c\x05alloc\x94\x8c\x04addr\x94\x8a\x08\x00\x00\x00\x00\x00\x7f\x00\x00\x8c\x04size\x94J\
            \x00\x02\x00\x00\x8c\x06stream\x94J\x00\x00\x00\x00\x8c\x07time_us\x94\x8a\x08\xf5\x03\x00\x00\
            \x00\x00\x00\x00\x8c\x06frames\x94]\x94(}\x94(\x8c\x08filename\x94\x8c\x08train.py\x94\x8c\x04li\
            ne\x94J\x0a\x00\x00\x00\x8c\x04name\x94\x8c\x04step\x94u}\x94(h\x10\x8c\x08model.py\x94h\x12J\
            \x14\x00\x00\x00h\x13\x8c\x07forward\x94ueu}\x94(h\x07h\x08h\x09\x8a\x08\x00\x02\x00\x00\x00\x7f\
            \x00\x00h\x0aJ\x00\x02\x00\x00h\x0bJ\x00\x00\x00\x00h\x0c\x8a\x08\x10\x04\x00\x00\x00\x00\x00\
            \x00h\x0d]\x94(h\x0fh\x15eu}\x94(h\x07h\x08h\x09\x8a\x08\x00\x04\x00\x00\x00\x7f\x00\x00h\x0aJ\
            \x00\x02\x00\x00h\x0bJ\x00\x00\x00\x00h\x0c\x8a\x08+\x04\x00\x00\x00\x00\x00\x00h\x0d]\x94(h\x0f\
            h\x15eu}\x94(h\x10\x8c\x08other.py\x94h\x12J\x1e\x00\x00\x00h\x13\x8c\x09elsewhere\x94u0h\x1cq\
            \x0f0}\x94(h\x07h\x08h\x09\x8a\x08\x00\x06\x00\x00\x00\x7f\x00\x00h\x0aJ\x00\x02\x00\x00h\x0bJ\
            \x00\x00\x00\x00h\x0c\x8a\x08F\x04\x00\x00\x00\x00\x00\x00h\x0d]\x94(h\x0fh\x15eu}\x94(h\x07h\
            \x08h\x09\x8a\x08\x00\x08\x00\x00\x00\x7f\x00\x00h\x0aJ\x00\x02\x00\x00h\x0bJ\x00\x00\x00\x00h\
            \x0c\x8a\x08\x00\x04\x00\x00\x00\x00\x00\x00h\x0d]\x94(h\x0fh\x15eueeu.";
        let lim = crate::trace::ReadLimits::default();
        let files = |t: &Trace| -> Vec<Vec<String>> {
            let frames = event_frames(t, &t.devices[0]);
            frames.iter().map(|f| f.iter().map(|f| f.filename.to_string()).collect()).collect()
        };
        let old = vec!["train.py".to_string(), "model.py".to_string()];
        let new = vec!["other.py".to_string(), "model.py".to_string()];
        let want = vec![old.clone(), old.clone(), old, new.clone(), new];
        let ways = [
            Decoding { parallel: Parallel::off(), ..Decoding::default() },
            Decoding { generic_only: true, parallel: Parallel::off() },
            Decoding {
                parallel: Parallel { workers: 2, share: 64, grow: 25, first_after: 0, retry_after: 0 },
                ..Decoding::default()
            },
        ];
        for (k, way) in ways.into_iter().enumerate() {
            let (t, taken) = read_snapshot_with(raw, raw.len() as u64, way, &lim).unwrap();
            assert_eq!(files(&t), want, "way {k}");
            if k == 0 {
                // The entries after the first were the fast path's.
                assert_eq!(taken.fast, 4);
            }
        }
    }

    /// Each release's fields are read where they are, and say which
    /// release wrote the file; an unknown action is counted, not fatal.
    #[test]
    fn the_fields_later_releases_added_name_the_release() {
        use crate::alloc::Release;
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/releases/snapshots");
        let r = |s: &str| Release::parse(s).unwrap();
        for (name, lo, hi, exact) in [
            ("torch211", r("2.11"), r("2.11"), vec![]),
            ("torch212", r("2.12"), r("2.12"), vec![]),
            ("torch213", r("2.13"), Release::NEWEST, vec![1505, 1506, 1507, 1508]),
            ("torch214", r("2.14"), Release::NEWEST, vec![1506, 1507, 1508, 1509]),
            ("torch215", r("2.15"), Release::NEWEST, vec![1506, 1507, 1508, 1509]),
        ] {
            let t = crate::trace::load(&root.join(format!("{name}.pickle.gz"))).unwrap();
            let (l, h, why) = t.release.bounds();
            assert_eq!((l, h), (lo, hi), "{name}: {why}");
            assert_eq!(t.release.unknown_actions, vec![("some_future_action".to_string(), 1)], "{name}");
            assert_eq!(t.devices[0].exact, exact, "{name}");
            let annotate = t.devices[0].events.iter().filter(|e| e.action == Action::Annotate).count();
            assert_eq!(annotate, usize::from(lo >= r("2.14")), "{name}");
            // Kept as the entries were read, not by a pass over the events.
            assert_eq!(t.release.annotate, annotate > 0, "{name}");
            assert_eq!(t.release.host_memory, lo >= r("2.14"), "{name}");
            let notes: Vec<&Annotation> =
                t.annotations.iter().filter(|a| a.field("action") == Some("annotate")).collect();
            assert_eq!(notes.len(), annotate, "{name}");
            if let Some(a) = notes.first() {
                assert_eq!(a.fields[0], ("name".into(), "activations of block 3".into()), "{name}");
                assert_eq!(a.fields[2], ("addr".into(), "0x7f0000300000".into()), "{name}");
            }
        }
    }

    /// Annotations keep each key and text once, however many markers
    /// repeat them (PyTorch writes every marker's strings anew), and read
    /// as the file says: on every trace fixture with optimizer markers.
    #[test]
    fn annotations_share_their_texts() {
        let mut checked = 0;
        for (path, t) in crate::trace::fixture_traces("traces").iter().filter(|(_, t)| t.annotations.len() >= 4) {
            let mut seen: HashMap<&str, &Arc<str>> = HashMap::new();
            for (k, v) in t.annotations.iter().flat_map(|a| &a.fields) {
                for s in [k, v] {
                    let first = *seen.entry(&**s).or_insert(s);
                    assert!(Arc::ptr_eq(first, s), "{}: {s:?} held twice", path.display());
                }
            }
            let steps = t.annotations.iter().filter(|a| a.field("name").is_some_and(|n| n.starts_with("Optimizer.")));
            let stages: HashSet<&str> = steps.filter_map(|a| a.field("stage")).collect();
            assert_eq!(stages, HashSet::from(["START", "END"]), "{}", path.display());
            assert!(seen.len() <= 8, "{}: {:?}", path.display(), seen.keys());
            checked += 1;
        }
        assert!(checked >= 5, "{checked}");
    }
}
