//! The exact replay of a PyTorch snapshot run behind its decoding: the
//! decoder hands the events over as it reads them (`EventTap`), a thread
//! steps the replay as far as they reach, and the session takes the result
//! where what it settles on once the file is read (the settings, the
//! release, the start, the pools) is what the replay assumed; elsewhere it
//! replays after the decoding as always (docs/design/trace-decoding.md,
//! "The replay behind the decoder").

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::engine::{ReplayOptions, ReplayResult, Replaying};
use super::pools::PoolPlan;
use crate::alloc::{Action, AllocatorConfig, Events, EventsRef};
use crate::trace::{DeviceTrace, EventTap, Tap};

/// A replay run behind the reading of one trace.
pub(crate) struct Ahead {
    behind: Arc<Behind>,
}

struct Behind {
    to: Mutex<Option<Sender<Handed>>>,
    /// Who else reads the events as they come (`tune`'s first stage).
    follower: Mutex<Option<Sender<Followed>>>,
    /// Events handed over so far (none: the next chunk is the first).
    handed: AtomicUsize,
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
    /// Shared with the follower where there is one.
    Events(Arc<Events>),
    /// The last events; the device whose column they all are, if one.
    Done(Events, Option<i32>),
}

/// What the thread hands back: every event, and the replay that read
/// them all, where they are one device's.
struct Caught {
    events: Events,
    ran: Option<Ran>,
}

/// What a follower of the decoding is handed: the events as they come,
/// then the device whose whole column they were (if one) and how many.
pub(crate) enum Followed {
    Events(Arc<Events>),
    Done(Option<i32>, usize),
}

impl Ahead {
    /// A replay under `opts` behind the reading of a trace, on a thread of
    /// its own (`None` where the system gives none). `guess`: no settings
    /// were asked for, so the replay assumes the default ones, with
    /// expandable segments where the first segment event is a map.
    /// `follower`, if any, is handed every event too as they come (shared,
    /// not copied, but for the first chunk, which carries the room the
    /// column reserved).
    pub(crate) fn start_followed(
        opts: ReplayOptions,
        guess: bool,
        follower: Option<Sender<Followed>>,
    ) -> Option<Ahead> {
        let (to, from) = channel();
        let thread = std::thread::Builder::new().name("replay".into()).spawn(move || behind(from, opts, guess)).ok()?;
        let behind = Behind {
            to: Mutex::new(Some(to)),
            follower: Mutex::new(follower),
            handed: AtomicUsize::new(0),
            thread: Mutex::new(Some(thread)),
            caught: Mutex::new(None),
        };
        Some(Ahead { behind: Arc::new(behind) })
    }

    /// Stops handing events to the follower: the decoding is over, so one
    /// that never ended (a reader that did not use the tap) tells it so.
    pub(crate) fn unfollow(&self) {
        drop(self.behind.follower.lock().ok().and_then(|mut f| f.take()));
    }

    /// What the reader hands the events to.
    pub(crate) fn tap(&self) -> Tap {
        Tap { to: self.behind.clone(), chunk: Tap::CHUNK }
    }

    /// Whether a replay ran to the end of one device's whole column and
    /// waits to be taken.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> bool {
        self.behind.caught.lock().is_ok_and(|c| c.is_some())
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
                match setting_shown(events.view().slice(seen..)) {
                    // The default setting is the one assumed already.
                    Some("") => {}
                    Some(shown) => {
                        if let Ok(c) = AllocatorConfig::parse_for(shown, opts.release) {
                            opts.config = c;
                        }
                    }
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

/// The setting a run's events show before its file gives its settings
/// (they follow the events): expandable segments where the first segment
/// event is a map, else the default one; `None` before any segment event.
pub(crate) fn setting_shown(events: EventsRef<'_>) -> Option<&'static str> {
    events.iter().find_map(|e| match e.action {
        Action::SegmentMap => Some("expandable_segments:True"),
        Action::SegmentAlloc => Some(""),
        _ => None,
    })
}

/// Appends what was handed over; `done` set by the last of it.
fn take(h: Handed, events: &mut Events, done: &mut Option<Option<i32>>) {
    match h {
        Handed::Events(c) => match Arc::try_unwrap(c) {
            Ok(c) => events.append(c),
            // The follower has it too: copied, as appending does.
            Err(c) => c.iter().for_each(|e| events.push(e)),
        },
        Handed::Done(rest, whole) => {
            events.append(rest);
            *done = Some(whole);
        }
    }
}

impl Behind {
    /// `chunk` handed to the follower, if any, as well.
    fn follow(&self, chunk: Events) -> Arc<Events> {
        let before = self.handed.fetch_add(chunk.len(), Ordering::Relaxed);
        let follower = self.follower.lock();
        let Some(f) = follower.as_ref().ok().and_then(|f| f.as_ref()) else { return Arc::new(chunk) };
        if before == 0 {
            let _ = f.send(Followed::Events(Arc::new(chunk.iter().collect())));
            return Arc::new(chunk);
        }
        let chunk = Arc::new(chunk);
        let _ = f.send(Followed::Events(chunk.clone()));
        chunk
    }
}

/// Steps between looks at the channel: a few milliseconds of replay.
const STEPS_BETWEEN_TAKES: usize = 1 << 14;

impl EventTap for Behind {
    fn events(&self, chunk: Events) {
        let chunk = self.follow(chunk);
        if let Some(to) = self.to.lock().ok().as_ref().and_then(|t| t.as_ref()) {
            // A thread gone has panicked, which `finish` passes on.
            let _ = to.send(Handed::Events(chunk));
        }
    }

    fn finish(&self, rest: Events, whole: Option<i32>) -> Events {
        if let Some(f) = self.follower.lock().ok().and_then(|mut f| f.take()) {
            // A follower gone just stops following.
            let _ = f.send(Followed::Events(Arc::new(rest.iter().collect())));
            let _ = f.send(Followed::Done(whole, self.handed.load(Ordering::Relaxed) + rest.len()));
        }
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
