//! The one way a command, a screen or a test opens a trace's replay: pick
//! the device, replay it under the conditions asked for (the recorded ones
//! by default), and build the stepping model or the categories from that
//! one replay (docs/design/architecture.md, "Opening a trace").

use thiserror::Error;

use super::ahead::{Ahead, Followed};
use super::engine::ReplayOptions;
use super::model::ReplayModel;
use super::session::{ReleaseAsk, Session, Want};
use crate::alloc::{AllocatorConfig, Release};
use crate::analysis::categories::Categories;
use crate::trace::{DeviceTrace, Trace};

/// The conditions to replay under; the default is the run as recorded, on
/// the default device.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Which device of a multi-GPU trace (default: the busiest).
    pub device: Option<i32>,
    /// totalGlobalMem of the recorded device.
    pub device_total: u64,
    /// A what-if config instead of the recorded one.
    pub config: Option<AllocatorConfig>,
    /// A per-process memory limit to replay under.
    pub memory_limit: Option<u64>,
    /// Whose allocator to follow (`--torch`); by default what the trace says.
    pub torch: Option<Release>,
    /// Keep the replayed events (`--dump-events`, `--at oom`).
    pub keep_events: bool,
    /// Stop after this many events (`--at EVENT`).
    pub stop_at: Option<usize>,
    /// The caller will want the categories: their first half is made on
    /// another thread while the replay runs (`Categories::prepare`).
    pub categories: bool,
    /// The caller will step through the replay (a screen: `Some(ReplayModel::STEPPING)`)
    /// or draw it (`export`: `Some(ReplayModel::STILL)`): the scrubber's
    /// pass, with a checkpoint every so many events, is made beside the
    /// replay or behind the decoding (`Session::open_beside`).
    pub scrub_every: Option<usize>,
}

impl OpenOptions {
    /// A replay behind the reading of the trace these options will open,
    /// where it may be the one the session takes: not where it stops early
    /// or keeps every event. For a screen or an export it keeps the
    /// scrubber's pass too (docs/design/trace-decoding.md, "The replay
    /// behind the decoder", "The screen behind the decoding").
    pub(crate) fn ahead(&self) -> Option<Ahead> {
        self.ahead_followed(None)
    }

    /// `ahead`, `follower` handed the events as they come too.
    pub(crate) fn ahead_followed(&self, follower: Option<std::sync::mpsc::Sender<Followed>>) -> Option<Ahead> {
        if self.stop_at.is_some() || self.keep_events {
            return None;
        }
        let mut opts = ReplayOptions::new(self.config.clone().unwrap_or_default(), self.device_total);
        opts.memory_limit = self.memory_limit;
        // The first release a file with nothing of later ones allows.
        opts.release = self.torch.unwrap_or(Release::V2_11);
        Ahead::start_followed(opts, self.config.is_none(), follower, self.scrub_every)
    }
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            device: None,
            device_total: crate::device::DEFAULT_DEVICE_TOTAL,
            config: None,
            memory_limit: None,
            torch: None,
            keep_events: false,
            stop_at: None,
            categories: false,
            scrub_every: None,
        }
    }
}

/// Why a trace could not be opened for replay.
#[derive(Debug, Error)]
pub enum OpenError {
    #[error("{name}: the trace has no device {device} (it has: {has})")]
    NoDevice { name: String, device: i32, has: String },
    #[error("{name}: the trace has no events and no segments")]
    Empty { name: String },
    /// The trace contradicts itself (its history cannot start anywhere).
    #[error("{name}: {reason}")]
    Unreadable { name: String, reason: String },
    /// Replayed, but not exactly, where the caller needs an exact replay.
    #[error("{name}: the replay is {fidelity}{at}; {need}")]
    NotExact { name: String, fidelity: &'static str, at: String, need: &'static str },
    /// The replay parted from the recording while a model stepped through it.
    #[error("{name}: replay diverged at {at}")]
    Diverged { name: String, at: String },
}

impl OpenError {
    /// A model's or scrubber's divergence from the recording of `name`.
    pub fn diverged(name: &str, d: &super::engine::Divergence) -> OpenError {
        OpenError::Diverged { name: name.to_string(), at: d.to_string() }
    }

    /// A file we cannot read is the user's (2); one we read but do not
    /// reproduce is ours (1).
    pub fn exit_code(&self) -> u8 {
        match self {
            OpenError::NoDevice { .. } | OpenError::Empty { .. } | OpenError::Unreadable { .. } => 2,
            OpenError::NotExact { .. } | OpenError::Diverged { .. } => 1,
        }
    }
}

/// A trace's device, replayed once under the conditions asked for.
pub struct Opened<'t> {
    pub trace: &'t Trace,
    pub dev: &'t DeviceTrace,
    /// What the replay was asked for (its config, limit and release).
    pub want: Want,
    pub session: Session<'t>,
    /// The input as errors name it (its path).
    pub name: String,
}

/// The device `want` names, or the busiest, of `trace` (read from the
/// input `name`).
pub fn device<'t>(trace: &'t Trace, name: &str, want: Option<i32>) -> Result<&'t DeviceTrace, OpenError> {
    match want {
        Some(d) => trace.devices.iter().find(|x| x.device == d).ok_or_else(|| {
            let has: Vec<String> = trace.devices.iter().map(|x| x.device.to_string()).collect();
            let has = if has.is_empty() { "none".to_string() } else { has.join(", ") };
            OpenError::NoDevice { name: name.to_string(), device: d, has }
        }),
        None => trace.main_device().ok_or_else(|| OpenError::Empty { name: name.to_string() }),
    }
}

/// Replays `trace` (read from the input `name`) as `opts` asks.
pub fn open<'t>(trace: &'t Trace, name: &str, opts: &OpenOptions) -> Result<Opened<'t>, OpenError> {
    open_ahead(trace, name, opts, None)
}

/// `open`, its first replay taken from `ahead` where that is the one
/// `opts` asks for (docs/design/trace-decoding.md, "The replay behind the
/// decoder").
pub(crate) fn open_ahead<'t>(
    trace: &'t Trace,
    name: &str,
    opts: &OpenOptions,
    ahead: Option<&Ahead>,
) -> Result<Opened<'t>, OpenError> {
    let dev = device(trace, name, opts.device)?;
    let want = Want {
        changed: opts.config.is_some() || opts.memory_limit.is_some(),
        config: opts.config.clone().unwrap_or_else(|| trace.settings.as_ref().map(|s| s.config()).unwrap_or_default()),
        memory_limit: opts.memory_limit,
        keep_events: opts.keep_events,
        stop_at: opts.stop_at,
        release: ReleaseAsk::of(trace, opts.torch),
        ..Want::recorded(trace, opts.device_total)
    };
    let replayed = || {
        Session::open_beside(dev, &trace.stacks, &want, opts.scrub_every, ahead)
            .map_err(|e| OpenError::Unreadable { name: name.to_string(), reason: e.to_string() })
    };
    let session = if opts.categories {
        // Independent of the replay, and most of the categories' time on a
        // long trace: beside it (docs/measurements/benchmarks.md).
        std::thread::scope(|s| {
            // A thread the system will not give just means preparing them
            // later, on this one.
            let prepared = std::thread::Builder::new()
                .name("categories".into())
                .spawn_scoped(s, || Categories::prepare(dev, &trace.stacks, &trace.annotations))
                .ok();
            let mut session = replayed()?;
            if let Some(Ok(p)) = prepared.map(|h| h.join()) {
                session.set_prepared(p);
            }
            Ok::<_, OpenError>(session)
        })?
    } else {
        replayed()?
    };
    Ok(Opened { trace, dev, want, session, name: name.to_string() })
}

impl<'t> Opened<'t> {
    /// The same trace replayed again under `memory_limit` (tune's retry
    /// under the limit the run had).
    pub fn reopened_under(&self, memory_limit: Option<u64>) -> Result<Opened<'t>, OpenError> {
        // The limit is the run's own, a condition it had rather than a change.
        let want = Want { memory_limit, ..self.want.clone() };
        let session = Session::open(self.dev, &self.trace.stacks, &want)
            .map_err(|e| OpenError::Unreadable { name: self.name.clone(), reason: e.to_string() })?;
        Ok(Opened { trace: self.trace, dev: self.dev, want, session, name: self.name.clone() })
    }

    /// Whether the replay reproduced every recorded event (a snapshot
    /// without history has none to reproduce and counts as exact).
    pub fn is_exact(&self) -> bool {
        self.session.fidelity.is_faithful()
    }

    /// `Ok` when the replay is exact; else why not, with what the caller
    /// (`need`: "diff compares runs that replay exactly") needs it for.
    pub fn require_exact(&self, need: &'static str) -> Result<(), OpenError> {
        if self.is_exact() {
            return Ok(());
        }
        let at = self.session.divergence().map(|d| format!(" at {d}")).unwrap_or_default();
        Err(OpenError::NotExact { name: self.name.clone(), fidelity: self.session.fidelity.name(), at, need })
    }

    /// The model a screen or an export steps through, titled `title`.
    pub fn model(&self, title: String) -> Result<ReplayModel<'t>, OpenError> {
        ReplayModel::open(&self.session, self.dev, &self.trace.stacks, &self.trace.annotations, title)
            .map_err(|d| self.diverged(&d))
    }

    /// `model` for one picture (`export`): no checkpoints, the cursor going
    /// forwards only (`ReplayModel::still`).
    pub fn still_model(&self, title: String) -> Result<ReplayModel<'t>, OpenError> {
        ReplayModel::still(&self.session, self.dev, &self.trace.stacks, &self.trace.annotations, title)
            .map_err(|d| self.diverged(&d))
    }

    /// The error a model or scrubber's divergence becomes.
    pub fn diverged(&self, d: &super::engine::Divergence) -> OpenError {
        OpenError::diverged(&self.name, d)
    }

    /// What each block of the recorded run is (`Session::categories`).
    pub fn categories(&self) -> Categories {
        self.session.categories(&self.trace.stacks, &self.trace.annotations)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::input::Input;
    use crate::trace::Tap;
    use std::sync::Arc;

    fn read(path: &std::path::Path, tap: Option<Tap>) -> Trace {
        Input::open(path).unwrap().read_trace_tapped(None, tap).unwrap()
    }

    /// What a replay's report rests on, as text: two sessions that print
    /// the same replayed the same.
    fn outcome(o: &Opened<'_>) -> String {
        let (s, r) = (&o.session, &o.session.exact);
        format!(
            "{:?} {:?} {} {:?} {:?} {:?} {} {} {} {} {:?} {:?} {:?} {} {:?} {:?} {:?}",
            s.fidelity,
            s.release,
            r.reproduced,
            r.divergence.as_ref().map(|d| d.to_string()),
            r.peak,
            r.pressure,
            r.inferred_empty_cache,
            r.directed,
            r.placed,
            r.burst_retries,
            r.empty_cache_at,
            s.replayed,
            s.recorded,
            r.allocated_before,
            // Every change of allocated bytes, folded.
            r.allocated.iter().fold((0usize, 0u64), |(n, h), d| (n + 1, h.wrapping_mul(1_000_003) ^ d as u64)),
            s.limit_found.as_ref().map(|l| l.used_bytes),
            s.settings_changed.as_ref().map(|c| c.event),
        )
    }

    /// On real snapshots of every kind, the session opened with a replay
    /// run behind the decoding (handed a few events at a time, so that it
    /// waits at every point of the trace) reports what the session that
    /// replays after the decoding reports; the replay is taken only from
    /// process start without private pools, and the reader gets every
    /// event back.
    #[test]
    fn a_replay_behind_the_decoding_is_the_replay_after_it() {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        for (name, taken) in [
            ("traces/gpt2_train.pickle.gz", true),
            ("traces/resnet50_train.pickle.gz", true),
            ("traces/multistream_pipeline.pickle.gz", true),
            ("traces/gpt2_train_expandable.pickle.gz", true),
            ("traces/llama_pressure.pickle.gz", true),
            // A window of a longer run: rebuilt from its end.
            ("traces/gpt2_train_wrapped.pickle.gz", false),
            // A run under a per-process limit: found after the first
            // replay, which diverges there.
            ("conditions/limit_oom.pickle.gz", true),
            // Settings other than the default (and changed mid-run): the
            // file gives them after the events.
            ("conditions/switch_split.pickle.gz", false),
            // A CUDA graph's private pool.
            ("snapshot_kinds/graphed_mlp_train.pickle.gz", false),
            // 2.15's rules (and an action no release we know has: the
            // column is not the device's whole).
            ("releases/snapshots/torch215.pickle.gz", false),
            ("releases/snapshots/torch213.pickle.gz", false),
        ] {
            let path = root.join(name);
            let plain = read(&path, None);
            let after = open(&plain, name, &OpenOptions::default()).unwrap();
            for chunk in [3, 64, Tap::CHUNK] {
                let ahead = OpenOptions::default().ahead().unwrap();
                let tapped = read(&path, Some(Tap { chunk, ..ahead.tap() }));
                assert_eq!(tapped.devices.len(), plain.devices.len(), "{name}");
                for (t, p) in tapped.devices.iter().zip(&plain.devices) {
                    assert!(t.events == p.events, "{name}: the events came back changed");
                }
                let ran = ahead.waiting();
                let behind = open_ahead(&tapped, name, &OpenOptions::default(), Some(&ahead)).unwrap();
                assert_eq!(outcome(&behind), outcome(&after), "{name} in chunks of {chunk}");
                let was_taken = ran && !ahead.waiting();
                assert_eq!(was_taken, taken, "{name} in chunks of {chunk}: taken");
            }
        }
    }

    /// A screen's or an export's scrubber made in the same pass as the
    /// replay behind the decoding (the blocks tagged from the stacks handed
    /// over with the events) is the one made after it: the same timeline,
    /// and every seek, forwards or back, the same state, tags included.
    #[test]
    fn a_scrubber_behind_the_decoding_is_the_scrubber_after_it() {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        for (name, taken) in [
            ("traces/gpt2_train.pickle.gz", true),
            ("traces/multistream_pipeline.pickle.gz", true),
            ("traces/gpt2_train_expandable.pickle.gz", true),
            // Taken, parted from the recording at the limit: the session's
            // scrubber is made after, under the limit found.
            ("conditions/limit_oom.pickle.gz", true),
            ("traces/gpt2_train_wrapped.pickle.gz", false),
            ("snapshot_kinds/graphed_mlp_train.pickle.gz", false),
        ] {
            let path = root.join(name);
            let plain = read(&path, None);
            for every in [256, crate::replay::model::ReplayModel::STILL] {
                let opts = OpenOptions { scrub_every: Some(every), ..OpenOptions::default() };
                let after = open(&plain, name, &opts).unwrap();
                let mut want = after.session.scrubber(every).unwrap();
                for chunk in [3, Tap::CHUNK] {
                    let ahead = opts.ahead().unwrap();
                    let tapped = read(&path, Some(Tap { chunk, ..ahead.tap() }));
                    for (t, p) in tapped.devices.iter().zip(&plain.devices) {
                        assert!(t.events == p.events && t.stacks == p.stacks, "{name}: the columns came back changed");
                    }
                    let ran = ahead.waiting();
                    let behind = open_ahead(&tapped, name, &opts, Some(&ahead)).unwrap();
                    assert_eq!(outcome(&behind), outcome(&after), "{name} in chunks of {chunk}");
                    assert_eq!(ran && !ahead.waiting(), taken, "{name} in chunks of {chunk}: taken");
                    let mut got = behind.session.scrubber(every).unwrap();
                    assert_eq!(got.points(), want.points(), "{name} every {every} in chunks of {chunk}");
                    // A pass behind a decoding in chunks of 3 hurries (more
                    // than two chunks not yet replayed): the holes it left
                    // are made, where the others were kept.
                    assert_eq!(got.kept_at(), want.kept_at(), "{name} every {every} in chunks of {chunk}");
                    let n = plain.devices.iter().map(|d| d.events.len()).max().unwrap();
                    let at = after.session.exact.peak.event;
                    let places = if every == 256 { vec![n - 1, at, 0, n / 2, at + 1, 1] } else { vec![0, at, n - 1] };
                    for e in places {
                        assert_eq!(got.seek(e).snapshot(), want.seek(e).snapshot(), "{name} at {e}");
                    }
                }
            }
        }
    }

    /// The decoding gets its columns back as soon as the last events are
    /// appended, shared with the replay behind it (not copied), which
    /// reaches their end after: the trace is made and opened meanwhile,
    /// and what is taken is that replay.
    #[test]
    fn the_columns_come_back_before_the_replay_behind_reaches_their_end() {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let (name, path) = ("gpt2_train", root.join("traces/gpt2_train.pickle.gz"));
        let plain = read(&path, None);
        let after = open(&plain, name, &OpenOptions::default()).unwrap();
        let ahead = OpenOptions::default().ahead().unwrap();
        let held = ahead.hold();
        let (tap, from) = (Tap { chunk: 64, ..ahead.tap() }, path.clone());
        let (give, got) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = give.send(read(&from, Some(tap)));
        });
        let tapped = got.recv_timeout(std::time::Duration::from_secs(60)).expect("the decoding waited for the replay");
        let (t, p) = (tapped.main_device().unwrap(), plain.main_device().unwrap());
        assert!(t.events == p.events && t.stacks == p.stacks, "the columns came back changed");
        // The replay's thread holds the same columns: it has not reached
        // their end, and they were not copied.
        assert_eq!((Arc::strong_count(&t.events), Arc::strong_count(&t.stacks)), (2, 2));
        drop(held);
        let behind = open_ahead(&tapped, name, &OpenOptions::default(), Some(&ahead)).unwrap();
        assert_eq!(outcome(&behind), outcome(&after));
        assert!(!ahead.waiting(), "the replay behind was not taken");
        assert_eq!((Arc::strong_count(&t.events), Arc::strong_count(&t.stacks)), (1, 1));
    }

    /// A window's replay does not start where the decoding ends: the one
    /// behind it is stopped, not run to the end beside the session's.
    #[test]
    fn a_window_stops_the_replay_behind_the_decoding() {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let (name, path) = ("gpt2_train_wrapped", root.join("traces/gpt2_train_wrapped.pickle.gz"));
        let plain = read(&path, None);
        let after = open(&plain, name, &OpenOptions::default()).unwrap();
        let ahead = OpenOptions::default().ahead().unwrap();
        let held = ahead.hold();
        let tapped = read(&path, Some(Tap { chunk: 64, ..ahead.tap() }));
        let t = tapped.main_device().unwrap();
        assert_eq!(Arc::strong_count(&t.events), 2);
        // Held at the decoding's end, it can only let go of the columns by
        // stopping there.
        let behind = open_ahead(&tapped, name, &OpenOptions::default(), Some(&ahead)).unwrap();
        assert_eq!(Arc::strong_count(&t.events), 1);
        drop(held);
        assert_eq!(outcome(&behind), outcome(&after));
        assert!(!ahead.waiting(), "a stopped replay was kept");
    }

    /// A file that breaks off mid-trace is the same error with a replay
    /// behind it, and the thread ends with the reading.
    #[test]
    fn a_broken_file_read_with_a_replay_behind_is_the_same_error() {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let mut raw = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::MultiGzDecoder::new(
                std::fs::File::open(root.join("traces/gpt2_train.pickle.gz")).unwrap(),
            ),
            &mut raw,
        )
        .unwrap();
        let dir = std::env::temp_dir().join(format!("gpumem-top-ahead-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cut = dir.join("cut.pickle");
        std::fs::write(&cut, &raw[..raw.len() * 2 / 3]).unwrap();
        let plain = Input::open(&cut).unwrap().read_trace(None).map(drop).unwrap_err().to_string();
        let ahead = OpenOptions::default().ahead().unwrap();
        let tapped = Input::open(&cut).unwrap().read_trace_tapped(None, Some(Tap { chunk: 5, ..ahead.tap() }));
        assert_eq!(tapped.map(drop).unwrap_err().to_string(), plain);
        assert!(plain.contains("byte"), "{plain}");
        drop(ahead);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
