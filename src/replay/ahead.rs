//! The exact replay of a PyTorch snapshot run behind its decoding: the
//! decoder hands the events over as it reads them (`EventTap`), a thread
//! steps the replay as far as they reach, and the session takes the result
//! where what it settles on once the file is read (the settings, the
//! release, the start, the pools) is what the replay assumed; elsewhere it
//! replays after the decoding as always (docs/design/trace-decoding.md,
//! "The replay behind the decoder").

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::engine::{ReplayOptions, ReplayResult, Replaying};
use super::open::OpenOptions;
use super::pools::PoolPlan;
use crate::alloc::{Action, AllocatorConfig, Events, EventsRef, Release};
use crate::trace::{DeviceTrace, EventTap, Tap};

/// A replay run behind the reading of one trace.
pub(crate) struct Ahead {
    behind: Arc<Behind>,
}

struct Behind {
    to: Mutex<Option<Sender<Handed>>>,
    thread: Mutex<Option<JoinHandle<Caught>>>,
    /// Once the decoding is done: the replay, and the device and number
    /// of events of the column it read.
    caught: Mutex<Option<Ran>>,
}

/// A replay that read one device's whole column.
struct Ran {
    device: i32,
    events: usize,
    /// What it assumed: from process start, the default pools, these.
    opts: ReplayOptions,
    replay: Replaying<'static>,
}

enum Handed {
    Events(Events),
    /// The last events; the device whose column they all are, if one.
    Done(Events, Option<i32>),
}

/// What the thread hands back: every event, and the replay that read
/// them all, where they are one device's.
struct Caught {
    events: Events,
    ran: Option<Ran>,
}

impl Ahead {
    /// A replay behind the reading of a trace that `opts` will open, where
    /// it may be the one the session takes: not for a screen (its scrubber
    /// is made beside the replay) nor where it stops early or keeps every
    /// event. `None` also where the system gives no thread.
    pub(crate) fn for_open(o: &OpenOptions) -> Option<Ahead> {
        if o.scrub_every.is_some() || o.stop_at.is_some() || o.keep_events {
            return None;
        }
        let mut opts = ReplayOptions::new(o.config.clone().unwrap_or_default(), o.device_total);
        opts.memory_limit = o.memory_limit;
        // The first release a file with nothing of later ones allows.
        opts.release = o.torch.unwrap_or(Release::V2_11);
        let (to, from) = channel();
        let guess = o.config.is_none();
        let thread = std::thread::Builder::new().name("replay".into()).spawn(move || behind(from, opts, guess)).ok()?;
        let behind = Behind { to: Mutex::new(Some(to)), thread: Mutex::new(Some(thread)), caught: Mutex::new(None) };
        Some(Ahead { behind: Arc::new(behind) })
    }

    /// What the reader hands the events to.
    pub(crate) fn tap(&self) -> Tap {
        Tap { to: self.behind.clone(), chunk: Tap::CHUNK }
    }

    /// The replay of `dev` under `opts`, if it is the one run behind the
    /// decoding: the same column, whole, and the same options.
    pub(crate) fn take_for<'a>(&self, dev: &'a DeviceTrace, opts: &ReplayOptions) -> Option<ReplayResult<'a>> {
        let mut caught = self.behind.caught.lock().ok()?;
        let ran = caught.as_ref()?;
        if ran.device != dev.device || ran.events != dev.events.len() || !same_replay(&ran.opts, opts) {
            return None;
        }
        let ran = caught.take()?;
        Some(ran.replay.rebind(dev.events.view()).finish())
    }
}

/// Whether a replay under `a` is one under `b`, both from process start
/// with no private pool and no settings change (what the engine reads of
/// a plan without private pools is `framed`).
fn same_replay(a: &ReplayOptions, b: &ReplayOptions) -> bool {
    let plain = |p: &PoolPlan| !p.any_private && p.framed.is_empty();
    a.config == b.config
        && a.device_total == b.device_total
        && a.memory_limit == b.memory_limit
        && a.keep_events == b.keep_events
        && a.stop_at == b.stop_at
        && a.switch.is_none()
        && b.switch.is_none()
        && a.release == b.release
        && a.exact.is_empty()
        && b.exact.is_empty()
        && plain(&a.pools)
        && plain(&b.pools)
}

/// The thread: events appended as they come, the replay stepped as far as
/// they reach (`Replaying::reads_only_held`), then to the end once they
/// are all there and one device's. `guess`: no settings were asked for,
/// and the file gives the run's last (they follow the events): the default
/// ones, with expandable segments where the first segment event is a map.
fn behind(from: Receiver<Handed>, mut opts: ReplayOptions, guess: bool) -> Caught {
    let mut events = Events::default();
    let mut replay = None;
    // Events before this one hold no segment event (while guessing).
    let mut unseen = guess.then_some(0);
    let mut done = None;
    // Events handed over wait in the channel as copies until appended:
    // taken between short runs of steps, they stay a chunk or two.
    while done.is_none() {
        let Ok(h) = from.recv() else {
            // The decoding stopped (a bad file): nothing to keep.
            return Caught { events, ran: None };
        };
        take(h, &mut events, &mut done);
        loop {
            while let Ok(h) = from.try_recv() {
                take(h, &mut events, &mut done);
            }
            if done == Some(None) {
                return Caught { events, ran: None };
            }
            if let Some(seen) = unseen {
                let segment = |a: Action| matches!(a, Action::SegmentAlloc | Action::SegmentMap);
                match events.view().slice(seen..).iter().find(|e| segment(e.action)) {
                    Some(e) if e.action == Action::SegmentMap => {
                        if let Ok(c) = AllocatorConfig::parse_for("expandable_segments:True", opts.release) {
                            opts.config = c;
                        }
                    }
                    Some(_) => {}
                    None if done.is_none() => {
                        unseen = Some(events.len());
                        break;
                    }
                    None => {}
                }
                unseen = None;
            }
            let Some(r) = replay.take().or_else(|| Replaying::new(EventsRef::EMPTY, &opts, &[], 0).ok()) else {
                break;
            };
            let mut r = r.rebind(events.view());
            let all = done.is_some();
            let mut steps = 0;
            while steps < STEPS_BETWEEN_TAKES && r.position() < events.len() && (all || r.reads_only_held()) && r.step()
            {
                steps += 1;
            }
            replay = Some(r.rebind(EventsRef::EMPTY));
            // As far as the events reach (or the replay parted from them):
            // wait for more, or, all there, done.
            if steps < STEPS_BETWEEN_TAKES {
                break;
            }
        }
    }
    let ran = replay.zip(done.flatten()).map(|(replay, device)| Ran { device, events: events.len(), opts, replay });
    Caught { events, ran }
}

/// Appends what was handed over; `done` set by the last of it.
fn take(h: Handed, events: &mut Events, done: &mut Option<Option<i32>>) {
    match h {
        Handed::Events(c) => events.append(c),
        Handed::Done(rest, whole) => {
            events.append(rest);
            *done = Some(whole);
        }
    }
}

/// Steps between looks at the channel: a few milliseconds of replay.
const STEPS_BETWEEN_TAKES: usize = 1 << 14;

impl EventTap for Behind {
    fn events(&self, chunk: Events) {
        if let Some(to) = self.to.lock().ok().as_ref().and_then(|t| t.as_ref()) {
            // A thread gone has panicked, which `finish` passes on.
            let _ = to.send(Handed::Events(chunk));
        }
    }

    fn finish(&self, rest: Events, whole: Option<i32>) -> Events {
        let to = self.to.lock().ok().and_then(|mut t| t.take());
        let thread = self.thread.lock().ok().and_then(|mut t| t.take());
        let (Some(to), Some(thread)) = (to, thread) else { return rest };
        let _ = to.send(Handed::Done(rest, whole));
        drop(to);
        let caught = thread.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        if let (Some(ran), Ok(mut c)) = (caught.ran, self.caught.lock()) {
            *c = Some(ran);
        }
        caught.events
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::{open, open_ahead, Opened};
    use crate::trace::input::Input;
    use crate::trace::Trace;

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
                let ahead = Ahead::for_open(&OpenOptions::default()).unwrap();
                let tapped = read(&path, Some(Tap { chunk, ..ahead.tap() }));
                assert_eq!(tapped.devices.len(), plain.devices.len(), "{name}");
                for (t, p) in tapped.devices.iter().zip(&plain.devices) {
                    assert!(t.events == p.events, "{name}: the events came back changed");
                }
                let ran = ahead.behind.caught.lock().unwrap().is_some();
                let behind = open_ahead(&tapped, name, &OpenOptions::default(), Some(&ahead)).unwrap();
                assert_eq!(outcome(&behind), outcome(&after), "{name} in chunks of {chunk}");
                let was_taken = ran && ahead.behind.caught.lock().unwrap().is_none();
                assert_eq!(was_taken, taken, "{name} in chunks of {chunk}: taken");
            }
        }
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
        let ahead = Ahead::for_open(&OpenOptions::default()).unwrap();
        let tapped = Input::open(&cut).unwrap().read_trace_tapped(None, Some(Tap { chunk: 5, ..ahead.tap() }));
        assert_eq!(tapped.map(drop).unwrap_err().to_string(), plain);
        assert!(plain.contains("byte"), "{plain}");
        drop(ahead);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
