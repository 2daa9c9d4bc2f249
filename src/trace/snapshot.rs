//! PyTorch's memory-snapshot schema (spec §12) on top of the pickle decoder:
//! every version from the bare list of segments of 1.x to torch 2.11's
//! `device_traces` with `allocator_settings` and `external_annotations`.

use std::collections::HashMap;
use std::io::Read;
use std::rc::Rc;

use super::pickle::{decode, Compactor, Dict, Limits, List, Shared, Value};
use super::{Annotation, DeviceTrace, Frame, RecordedBlock, RecordedSegment, Settings, Trace, TraceError, TraceFormat};
use crate::alloc::{Action, BlockState, Event};

/// Trace entries as columns, filled while the pickle is decoded.
#[derive(Default)]
struct EntryColumns {
    kind: Vec<Kind>,
    addr: Vec<u64>,
    size: Vec<u64>,
    stream: Vec<u64>,
    time_us: Vec<i64>,
    stack: Vec<u32>,
    /// Frame lists by identity: the pickler shares one list per distinct stack.
    stack_ids: HashMap<usize, u32>,
    stack_lists: Vec<Shared<List>>,
    /// `user_defined` entries (torch ~2.4): record_function markers.
    user_defined: Vec<(u32, String)>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Action(Action),
    /// Pre-2.1 `free`: both phases at once.
    LegacyFree,
    UserDefined,
}

fn kind_of(name: &str) -> Option<Kind> {
    match name {
        "free" => Some(Kind::LegacyFree),
        "user_defined" => Some(Kind::UserDefined),
        _ => Action::from_name(name).map(Kind::Action),
    }
}

impl Compactor for EntryColumns {
    fn compact(&mut self, d: &Dict) -> Result<Option<u32>, String> {
        let Some(action) = d.get("action") else { return Ok(None) };
        let Some(name) = action.as_str() else { return Ok(None) };
        let kind = kind_of(name).ok_or_else(|| format!("trace entry with unknown action {name:?}"))?;
        let num = |key: &str| d.get(key).and_then(Value::as_u64);
        let addr =
            if kind == Kind::Action(Action::Oom) { num("device_free").or_else(|| num("addr")) } else { num("addr") };
        let id = self.kind.len() as u32;
        if kind == Kind::UserDefined {
            let label = d.get("name").and_then(|v| v.as_str()).unwrap_or("user_defined").to_string();
            self.user_defined.push((id, label));
        }
        self.kind.push(kind);
        self.addr.push(addr.unwrap_or(0));
        self.size.push(num("size").unwrap_or(0));
        self.stream.push(num("stream").unwrap_or(0));
        self.time_us.push(d.get("time_us").and_then(Value::as_i64).unwrap_or(0));
        let stack = match d.get("frames") {
            Some(Value::List(l)) if !l.borrow().0.is_empty() => {
                let key = Rc::as_ptr(l) as usize;
                match self.stack_ids.get(&key) {
                    Some(&s) => s,
                    None => {
                        // Keep the list alive so its address cannot be reused.
                        self.stack_lists.push(l.clone());
                        let s = self.stack_lists.len() as u32;
                        self.stack_ids.insert(key, s);
                        s
                    }
                }
            }
            _ => 0,
        };
        self.stack.push(stack);
        Ok(Some(id))
    }
}

fn frame_of(v: &Value) -> Frame {
    let s = |k: &str| v.get(k).and_then(|x| x.as_str().map(str::to_string)).unwrap_or_default();
    Frame { name: s("name"), filename: s("filename"), line: v.get("line").and_then(|x| x.as_i64()).unwrap_or(0) }
}

fn frames_of(v: Option<Value>) -> Vec<Frame> {
    v.and_then(|f| f.items()).map(|items| items.iter().map(frame_of).collect()).unwrap_or_default()
}

struct Walker {
    stacks: Vec<Vec<Frame>>,
    interned: HashMap<Vec<Frame>, u32>,
}

impl Walker {
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
        Some(x) => x
            .as_u64()
            .ok_or_else(|| schema(path, format!("'{key}' is a {}, expected a non-negative int", x.type_name()))),
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
        let stack = w.intern(frames_of(frames));
        let address = opt_u64(b, "address").unwrap_or(at);
        at = address + size;
        blocks.push(RecordedBlock { address, size, requested_size, state, stack });
    }
    let small = match v.get("segment_type").and_then(|t| t.as_str().map(str::to_string)) {
        Some(t) => t == "small",
        None => total_size <= 2 << 20,
    };
    Ok(RecordedSegment {
        device: v.get("device").and_then(|d| d.as_i64()).unwrap_or(0) as i32,
        address,
        total_size,
        stream: opt_u64(v, "stream").unwrap_or(0),
        small,
        is_expandable: v.get("is_expandable").and_then(|x| x.as_bool()).unwrap_or(false),
        blocks,
    })
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

fn annotation(v: &Value) -> Option<Annotation> {
    let Value::Dict(d) = v else { return None };
    let d = d.borrow();
    let mut a = Annotation { device: 0, time_us: 0, fields: Vec::new() };
    for (k, val) in &d.items {
        match (k.as_str(), val) {
            (Some("device"), x) => a.device = x.as_i64().unwrap_or(0) as i32,
            (Some("time_us"), x) => a.time_us = x.as_i64().unwrap_or(0),
            (Some(k), Value::Str(s)) => a.fields.push((k.to_string(), s.to_string())),
            (Some(k), x) if x.as_i64().is_some() => a.fields.push((k.to_string(), x.as_i64().unwrap_or(0).to_string())),
            _ => {}
        }
    }
    Some(a)
}

/// Reads a PyTorch snapshot pickle (already decompressed).
pub fn read_snapshot<R: Read>(r: R) -> Result<Trace, TraceError> {
    let mut cols = EntryColumns::default();
    let root = decode(r, &mut cols, Limits::default()).map_err(TraceError::Pickle)?;
    let mut w = Walker { stacks: Vec::new(), interned: HashMap::new() };
    let mut trace = Trace { format: TraceFormat::PytorchSnapshot, ..Default::default() };

    // Frame lists of trace entries, in the order they were first seen.
    for l in &cols.stack_lists {
        let frames: Vec<Frame> = l.borrow().0.iter().map(frame_of).collect();
        w.stacks.push(frames);
    }
    let entry_stack_base = 0u32;

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

    let mut devices: Vec<DeviceTrace> = Vec::new();
    if let Some(tv) = traces_v {
        for (d, dev) in list_of(&tv, "device_traces")?.iter().enumerate() {
            let mut dt = DeviceTrace { device: d as i32, ..Default::default() };
            for (i, e) in list_of(dev, &format!("device_traces[{d}]"))?.iter().enumerate() {
                let Value::Entry(id) = e else {
                    return Err(schema(
                        &format!("device_traces[{d}][{i}]"),
                        format!("is a {}, expected a trace entry", e.type_name()),
                    ));
                };
                let id = *id as usize;
                let ev = |a: Action| Event::new(a, cols.addr[id], cols.size[id], cols.stream[id]);
                let stack = cols.stack[id] + entry_stack_base;
                match cols.kind[id] {
                    Kind::Action(a) => dt.push(ev(a), cols.time_us[id], stack),
                    Kind::LegacyFree => {
                        dt.push(ev(Action::FreeRequested), cols.time_us[id], stack);
                        dt.push(ev(Action::FreeCompleted), cols.time_us[id], stack);
                        dt.legacy_free += 1;
                    }
                    Kind::UserDefined => {
                        let label = cols.user_defined.iter().find(|(x, _)| *x as usize == id).map(|(_, l)| l.clone());
                        trace.annotations.push(Annotation {
                            device: d as i32,
                            time_us: cols.time_us[id],
                            fields: vec![("name".into(), label.unwrap_or_default())],
                        });
                    }
                }
            }
            devices.push(dt);
        }
    }
    for s in segments {
        let d = s.device.max(0) as usize;
        while devices.len() <= d {
            let n = devices.len() as i32;
            devices.push(DeviceTrace { device: n, ..Default::default() });
        }
        devices[d].segments.push(s);
    }
    if let Value::Dict(_) = &root {
        if let Some(s) = root.get("allocator_settings") {
            trace.settings = Some(settings(&s));
        }
        if let Some(a) = root.get("external_annotations").and_then(|a| a.items()) {
            trace.annotations.extend(a.iter().filter_map(annotation));
        }
    }
    trace.annotations.sort_by_key(|a| a.time_us);
    trace.devices = devices;
    trace.stacks = w.stacks;
    drop(root);
    Ok(trace)
}
