//! The exact replay of a PyTorch snapshot run behind its decoding: the
//! decoder hands the events (and their call stacks) over as it reads them
//! (`EventTap`), a thread steps the replay as far as they reach, and the
//! session takes the result where what it settles on once the file is read
//! (the settings, the release, the start, the pools) is what the replay
//! assumed; elsewhere it replays after the decoding as always. For a
//! screen or an export the same pass keeps the scrubber's checkpoints and
//! timeline (docs/design/trace-decoding.md, "The replay behind the
//! decoder", "The screen behind the decoding").

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, SendError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::engine::{Divergence, ReplayOptions, ReplayResult, Replaying};
use super::pools::PoolPlan;
use super::scrub::{Scrubber, Scrubbing};
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
    /// What the thread is told besides the events.
    control: Arc<Control>,
    thread: Mutex<Option<JoinHandle<Caught>>>,
    /// Once the replay reached the end: it, and the device and number of
    /// events of the column it read.
    caught: Mutex<Option<Ran>>,
    /// The columns a thread that left before the decoding was done kept.
    left: Mutex<Option<Columns>>,
}

/// What the replay's thread is told besides the events.
#[derive(Default)]
struct Control {
    /// Set where the replay is not wanted after all: the thread leaves
    /// at its next look at the channel.
    stop: AtomicBool,
    /// Held by a test: the replay does not step past the decoding's end
    /// until let go or stopped.
    #[cfg(test)]
    hold: Mutex<()>,
}

#[cfg(test)]
impl Control {
    /// Past the decoding's end (`at_end`), waits while a test holds the
    /// replay or until it is stopped.
    fn wait_while_held(&self, at_end: bool) {
        while at_end && self.hold.try_lock().is_err() && !self.stop.load(Ordering::Relaxed) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

/// A replay that read one device's whole column.
struct Ran {
    device: i32,
    events: usize,
    /// What it assumed: from process start, the default pools, these.
    opts: ReplayOptions,
    replay: Replaying<'static>,
    /// The scrubber's first pass, where one was asked for.
    scrub: Option<Scrubbing>,
}

enum Handed {
    /// Events and their call stacks; the events shared with the follower
    /// where there is one.
    Events(Arc<Events>, Vec<u32>),
    /// The last events and stacks; the device whose column they all are,
    /// if one; where the whole columns go back, shared, before the replay
    /// reaches their end.
    Done(Events, Vec<u32>, Option<i32>, Sender<Shared>),
}

/// The whole columns, shared: the replay goes on reading them while the
/// reader makes and opens its trace.
type Shared = (Arc<Events>, Arc<Vec<u32>>);

/// The columns the thread keeps: every event and its call stack, appended
/// to while only it holds them, shared once the decoding is done.
#[derive(Default)]
struct Columns {
    events: Arc<Events>,
    stacks: Arc<Vec<u32>>,
    /// The most events handed over at once: the reader's chunk.
    chunk: usize,
}

impl Columns {
    /// Appends a chunk and its stacks; only while unshared, so in place.
    fn append(&mut self, chunk: Arc<Events>, stacks: Vec<u32>) {
        self.chunk = self.chunk.max(stacks.len());
        let events = Arc::make_mut(&mut self.events);
        match Arc::try_unwrap(chunk) {
            Ok(c) => events.append(c),
            // The follower has it too: copied, as appending does.
            Err(c) => events.extend_from(&c),
        }
        let column = Arc::make_mut(&mut self.stacks);
        // The first carries the room the decoder reserved for them all.
        if column.is_empty() {
            *column = stacks;
        } else {
            column.extend_from_slice(&stacks);
        }
    }
}

/// What the thread hands back: the replay that read every event, where
/// they are one device's; the columns, where the reader was not given them
/// (the thread left before the decoding was done).
struct Caught {
    cols: Option<Columns>,
    ran: Option<Ran>,
}

/// What a session takes of the work run behind the decoding: the replay,
/// and the scrubber's first pass where it asked for one (a replay that
/// parted from the recording has none).
pub(crate) type Taken<'a> = (ReplayResult<'a>, Option<Result<Scrubber<'a>, Divergence>>);

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
    /// column reserved). `scrub_every`: the same pass keeps a scrubber's
    /// checkpoints (one every so many events) and timeline.
    pub(crate) fn start_followed(
        opts: ReplayOptions,
        guess: bool,
        follower: Option<Sender<Followed>>,
        scrub_every: Option<usize>,
    ) -> Option<Ahead> {
        let (to, from) = channel();
        let control = Arc::new(Control::default());
        let told = control.clone();
        let thread = std::thread::Builder::new()
            .name("replay".into())
            .spawn(move || behind(from, &told, opts, guess, scrub_every))
            .ok()?;
        let behind = Behind {
            to: Mutex::new(Some(to)),
            follower: Mutex::new(follower),
            handed: AtomicUsize::new(0),
            control,
            thread: Mutex::new(Some(thread)),
            caught: Mutex::new(None),
            left: Mutex::new(None),
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
        self.behind.caught_up();
        self.behind.caught.lock().is_ok_and(|c| c.is_some())
    }

    /// Keeps the replay from stepping past the decoding's end while held.
    #[cfg(test)]
    pub(crate) fn hold(&self) -> std::sync::MutexGuard<'_, ()> {
        self.behind.control.hold.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stops the replay where it is: not the one wanted.
    pub(crate) fn cancel(&self) {
        if let Err(panic) = self.behind.stop() {
            std::panic::resume_unwind(panic);
        }
    }

    /// The replay of `dev` under `opts`, if it is the one run behind the
    /// decoding: the same column, whole, the same options, and a scrubber
    /// kept as `scrub_every` asks (none, or one every so many events).
    pub(crate) fn take_for<'a>(
        &self,
        dev: &'a DeviceTrace,
        opts: &ReplayOptions,
        scrub_every: Option<usize>,
    ) -> Option<Taken<'a>> {
        self.behind.caught_up();
        let mut caught = self.behind.caught.lock().ok()?;
        let ran = caught.as_ref()?;
        if ran.device != dev.device
            || ran.events != dev.events.len()
            || !same_replay(&ran.opts, opts)
            || ran.scrub.as_ref().map(Scrubbing::asked) != scrub_every
        {
            return None;
        }
        let ran = caught.take()?;
        let (rec, tags) = (dev.events.view(), dev.stacks.as_slice());
        let tagged = if ran.scrub.is_some() { tags } else { &[] };
        let result = ran.replay.rebind(rec, tagged).finish();
        let scrubber = ran.scrub.map(|pass| match &result.divergence {
            Some(d) => Err(d.clone()),
            None => Ok(pass.finish(rec, tags)),
        });
        Some((result, scrubber))
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
/// `scrub_every`: the replay's blocks are tagged with their stacks and
/// each step kept for a scrubber (`Scrubbing`).
fn behind(
    from: Receiver<Handed>,
    control: &Control,
    mut opts: ReplayOptions,
    guess: bool,
    scrub_every: Option<usize>,
) -> Caught {
    let mut cols = Columns::default();
    let mut replay = None;
    let mut scrub: Option<Scrubbing> = None;
    // Events before this one hold no segment event (while guessing).
    let mut unseen = guess.then_some(0);
    let mut done = None;
    // Events handed over wait in the channel as copies until appended:
    // taken between short runs of steps, they stay a chunk or two.
    while done.is_none() {
        let Ok(h) = from.recv() else {
            // The decoding stopped (a bad file), or the replay is not
            // wanted: the columns are the reader's (`finish`).
            return Caught { cols: Some(cols), ran: None };
        };
        take(h, &mut cols, &mut done);
        loop {
            while let Ok(h) = from.try_recv() {
                take(h, &mut cols, &mut done);
            }
            #[cfg(test)]
            control.wait_while_held(done.is_some());
            if control.stop.load(Ordering::Relaxed) {
                // Whoever stopped it closes the intake next: every event
                // handed over is kept, and columns sent back are the reader's.
                while let Ok(h) = from.recv() {
                    take(h, &mut cols, &mut done);
                }
                return Caught { cols: done.is_none().then_some(cols), ran: None };
            }
            if done == Some(None) {
                return Caught { cols: None, ran: None };
            }
            if let Some(seen) = unseen {
                match setting_shown(cols.events.view().slice(seen..)) {
                    // The default setting is the one assumed already.
                    Some("") => {}
                    Some(shown) => {
                        if let Ok(c) = AllocatorConfig::parse_for(shown, opts.release) {
                            opts.config = c;
                        }
                    }
                    None if done.is_none() => {
                        unseen = Some(cols.events.len());
                        break;
                    }
                    None => {}
                }
                unseen = None;
            }
            let Some(r) = replay.take().or_else(|| Replaying::new(EventsRef::EMPTY, &opts, &[], 0).ok()) else {
                break;
            };
            let tags: &[u32] = if scrub_every.is_some() { &cols.stacks } else { &[] };
            let mut r = r.rebind(cols.events.view(), tags);
            if let (Some(every), None) = (scrub_every, &scrub) {
                // Room for the timeline of every event the column has room for.
                scrub = Some(Scrubbing::new(r.stepper(), every, cols.events.capacity()));
            }
            let all = done.is_some();
            // Fallen behind the decoding, more than two of the reader's
            // chunks (or it is over and the rest is catching up): the
            // scrubber's pass copies fewer checkpoints now and makes the
            // others once the file is read, on every core.
            let hurried = cols.events.len().saturating_sub(r.position()) > 2 * cols.chunk;
            let mut steps = 0;
            while steps < STEPS_BETWEEN_TAKES
                && r.position() < cols.events.len()
                && (all || r.reads_only_held())
                && r.step()
            {
                steps += 1;
                if let Some(pass) = scrub.as_mut() {
                    pass.stepped(r.stepper(), hurried);
                }
            }
            replay = Some(r.rebind(EventsRef::EMPTY, &[]));
            // As far as the events reach (or the replay parted from them):
            // wait for more, or, all there, done.
            if steps < STEPS_BETWEEN_TAKES {
                break;
            }
        }
    }
    let events = cols.events.len();
    let ran = replay.zip(done.flatten()).map(|(replay, device)| Ran { device, events, opts, replay, scrub });
    Caught { cols: None, ran }
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

/// Appends what was handed over; `done` set by the last of it, and the
/// whole columns then sent back shared.
fn take(h: Handed, cols: &mut Columns, done: &mut Option<Option<i32>>) {
    match h {
        Handed::Events(c, stacks) => cols.append(c, stacks),
        Handed::Done(rest, stacks, whole, back) => {
            cols.append(Arc::new(rest), stacks);
            *done = Some(whole);
            // A reader gone takes nothing.
            let _ = back.send((cols.events.clone(), cols.stacks.clone()));
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
    fn events(&self, chunk: Events, stacks: Vec<u32>) {
        let chunk = self.follow(chunk);
        let to = self.to.lock().unwrap_or_else(|e| e.into_inner());
        let Some(to) = to.as_ref() else { return self.keep(chunk, stacks) };
        // A thread gone has panicked, which `finish` passes on.
        if let Err(SendError(Handed::Events(chunk, stacks))) = to.send(Handed::Events(chunk, stacks)) {
            self.keep(chunk, stacks);
        }
    }

    fn finish(&self, rest: Events, rest_stacks: Vec<u32>, whole: Option<i32>) -> Shared {
        if let Some(f) = self.follower.lock().ok().and_then(|mut f| f.take()) {
            // A follower gone just stops following.
            let _ = f.send(Followed::Events(Arc::new(rest.iter().collect())));
            let _ = f.send(Followed::Done(whole, self.handed.load(Ordering::Relaxed) + rest.len()));
        }
        let mut rest = (rest, rest_stacks);
        if let Some(to) = self.to.lock().ok().and_then(|mut t| t.take()) {
            let (back, shared) = channel();
            let last = Handed::Done(std::mem::take(&mut rest.0), std::mem::take(&mut rest.1), whole, back);
            match to.send(last) {
                // The columns come back as soon as the last are appended;
                // the replay reaches their end later (`caught_up`).
                Ok(()) => {
                    if let Ok(cols) = shared.recv() {
                        return cols;
                    }
                }
                Err(SendError(Handed::Done(r, s, ..))) => rest = (r, s),
                Err(_) => {}
            }
        }
        // The thread left before the decoding was done (it panicked, which
        // this passes on, or was stopped): the columns it kept, then these.
        self.caught_up();
        let mut cols = self.left.lock().ok().and_then(|mut l| l.take()).unwrap_or_default();
        cols.append(Arc::new(rest.0), rest.1);
        (cols.events, cols.stacks)
    }
}

impl Behind {
    /// Waits for the replay to reach the end of the columns (or leave, once
    /// nothing more can come) and keeps what it made; a panic there is
    /// passed on.
    fn caught_up(&self) {
        if let Err(panic) = self.join() {
            std::panic::resume_unwind(panic);
        }
    }

    /// Closes the thread's intake (no more events can come to it; before
    /// the decoding is done this ends the replay where it is), waits for
    /// it and keeps what it made. The intake's lock is held throughout, so
    /// events handed over meanwhile are kept after the columns it had.
    fn join(&self) -> std::thread::Result<()> {
        let mut to = self.to.lock().unwrap_or_else(|e| e.into_inner());
        drop(to.take());
        let Some(thread) = self.thread.lock().ok().and_then(|mut t| t.take()) else { return Ok(()) };
        let caught = thread.join()?;
        if let (Some(ran), Ok(mut c)) = (caught.ran, self.caught.lock()) {
            *c = Some(ran);
        }
        if let (Some(cols), Ok(mut l)) = (caught.cols, self.left.lock()) {
            *l = Some(cols);
        }
        Ok(())
    }

    /// Stops the replay where it is (`join`).
    fn stop(&self) -> std::thread::Result<()> {
        self.control.stop.store(true, Ordering::Relaxed);
        self.join()
    }

    /// Events the thread can no longer take, kept for the reader's `finish`.
    fn keep(&self, chunk: Arc<Events>, stacks: Vec<u32>) {
        let mut left = self.left.lock().unwrap_or_else(|e| e.into_inner());
        left.get_or_insert_with(Columns::default).append(chunk, stacks);
    }
}

impl Drop for Ahead {
    /// A replay not taken stops where it is rather than run on unseen.
    fn drop(&mut self) {
        // A panic there has nothing left to spoil.
        let _ = self.behind.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::Event;

    fn chunk(from: u64, n: u64) -> (Events, Vec<u32>) {
        let events = (from..from + n).map(|k| Event::new(Action::Alloc, k << 9, 512, 0)).collect();
        (events, (from..from + n).map(|k| k as u32).collect())
    }

    /// A replay dropped while the file is still read (a reader unwinding,
    /// a command that gave up) stops, and the reader still gets every
    /// event and stack it handed over, in order, then the last.
    #[test]
    fn a_replay_dropped_mid_decoding_leaves_the_reader_every_event() {
        let ahead = Ahead::start_followed(ReplayOptions::new(AllocatorConfig::default(), 1 << 40), true, None, None)
            .expect("a thread");
        let tap = ahead.tap();
        let (a, sa) = chunk(0, 100);
        tap.to.events(a, sa);
        drop(ahead);
        // Handed to no one once it is gone: kept by the reader.
        let (b, sb) = chunk(100, 50);
        tap.to.events(b, sb);
        let (rest, sr) = chunk(150, 7);
        let (events, stacks) = tap.to.finish(rest, sr, Some(0));
        let (want, want_stacks) = chunk(0, 157);
        assert_eq!(events.iter().collect::<Vec<_>>(), want.iter().collect::<Vec<_>>());
        assert_eq!(*stacks, want_stacks);
    }
}
