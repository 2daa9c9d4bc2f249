//! What the replay screens and exports show of a trace: the scrubber over
//! its events with the timeline's marks. The interactive view adds a cursor
//! and keys (`ui`); `export` draws one moment of it; neither owns it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::alloc::{CachingAllocator, StatePoint};
use crate::analysis::categories::{Categories, Category, CategoryBytes, Evidence};
use crate::device::Oracle;
use crate::timeline::Step;
use crate::trace::{Annotation, DeviceTrace, Frame};

use super::engine::Divergence;
use super::scrub::Scrubber;
use super::session::{Session, Start};

/// An allocation PyTorch could not make: what was asked, and who asked.
#[derive(Debug, Clone)]
pub(crate) struct OomNote<'s> {
    pub(crate) event: usize,
    /// As the OOM entry records it (rounded as the allocator rounds).
    pub(crate) size: u64,
    pub(crate) stream: u64,
    /// Innermost first; empty when the trace has none.
    pub(crate) frames: &'s [Frame],
    /// What to set about it, when replays of the run found it.
    pub(crate) advice: Option<String>,
}

/// What the blocks shown are (docs/user/categories.md): a replay's categories at
/// the moment shown, or a synthetic run's, which knows each request's.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Meaning<'m> {
    /// `at`: the event whose state is shown; none for a snapshot's own state.
    Replay { cats: &'m Categories, at: Option<usize> },
    /// Each live block's category by address, and the bytes of each.
    Known { blocks: &'m std::collections::HashMap<u64, Category>, now: CategoryBytes },
}

impl Meaning<'_> {
    /// What the categories rest on; a synthetic run's are as certain as
    /// call stacks make a replay's.
    pub(crate) fn evidence(&self) -> Evidence {
        match self {
            Meaning::Replay { cats, .. } => cats.evidence,
            Meaning::Known { .. } => Evidence::Stacks,
        }
    }

    /// The category of the live block at `address`.
    pub(crate) fn of_block(&self, address: u64) -> Category {
        match self {
            Meaning::Replay { cats, at } => cats.of_block(address, *at),
            Meaning::Known { blocks, .. } => blocks.get(&address).copied().unwrap_or(Category::Unknown),
        }
    }

    /// Bytes per category at the moment shown.
    pub(crate) fn bytes(&self) -> CategoryBytes {
        match self {
            Meaning::Replay { cats, at } => cats.bytes_after(*at),
            Meaning::Known { now, .. } => *now,
        }
    }

    /// Whether the bytes per category are known at every event shown (a
    /// running synthetic run knows them now only).
    pub(crate) fn keeps_history(&self) -> bool {
        matches!(self, Meaning::Replay { .. })
    }

    /// Bytes per category after each of `events` (ascending), where the
    /// history is kept.
    pub(crate) fn bytes_after_each(&self, events: &[usize]) -> Option<Vec<CategoryBytes>> {
        match self {
            Meaning::Replay { cats, .. } => Some(cats.bytes_after_each(events)),
            Meaning::Known { .. } => None,
        }
    }
}

pub struct ReplayModel<'a> {
    /// Behind a lock: the frame that draws a jump seeks on its thread
    /// while another draws the timeline, which reads nothing the lock
    /// holds (`go_shared`; docs/measurements/benchmarks.md, "A jump's
    /// seek beside its timeline").
    scrub: Mutex<Scrubber<'a>>,
    /// Allocated and reserved bytes after each event (the scrubber's first
    /// pass, taken from it).
    points: Vec<StatePoint>,
    pub(crate) stacks: &'a [Vec<Frame>],
    /// The file's name, as the header shows it.
    pub(crate) name: String,
    /// The first event at the highest allocated bytes.
    pub(crate) peak_at: Option<usize>,
    pub(crate) ooms: Vec<usize>,
    /// Per OOM event: the size and stream it records, and its stack.
    oom_requests: Vec<(u64, u64, u32)>,
    pub(crate) empty_caches: Vec<usize>,
    /// Events where training iterations end (`Optimizer.step` annotations).
    pub(crate) iterations: Vec<usize>,
    /// The trace is a window of a longer run (its start was rebuilt).
    pub(crate) window: bool,
    /// What to set about its OOMs, found by replaying it under every
    /// setting (`tune::oom_advice`).
    pub(crate) oom_advice: Option<String>,
    /// What each block is (docs/user/categories.md); none where the screen
    /// does not show it (a paused synth, whose trace has no evidence).
    pub(crate) categories: Option<Categories>,
    /// What the header calls the device and the source, when not a replay
    /// of a file ("recorded device", "replay NAME"): a paused synth's.
    pub(crate) label: Option<(String, String)>,
    /// The highest reserved bytes of the whole trace.
    peak_reserved: u64,
    /// The event whose state the scrubber stands at (`go`): what a frame
    /// draws, read-only. Set with the lock held.
    cursor: AtomicUsize,
    /// The timeline's block maxima, built once.
    maxima: crate::analysis::range_max::RangeMax,
}

impl<'a> ReplayModel<'a> {
    /// The checkpoints' interval of a screen's model (`open`), in events.
    pub const STEPPING: usize = 1024;
    /// No checkpoint: a model for one picture (`still`).
    pub const STILL: usize = usize::MAX;

    /// The model of a faithful `session` over `dev`, for a screen that
    /// steps anywhere (a checkpoint every `STEPPING` events).
    pub fn open(
        session: &Session<'a>,
        dev: &DeviceTrace,
        stacks: &'a [Vec<Frame>],
        annotations: &[Annotation],
        name: String,
    ) -> Result<Self, Divergence> {
        Ok(Self::of(session, dev, stacks, annotations, name, Self::STEPPING)?.categorized(session, stacks, annotations))
    }

    /// As `open`, for one picture (`export`): no checkpoints, so the cursor
    /// should only go forwards (at ten million events the checkpoints were
    /// most of an export's memory).
    pub fn still(
        session: &Session<'a>,
        dev: &DeviceTrace,
        stacks: &'a [Vec<Frame>],
        annotations: &[Annotation],
        name: String,
    ) -> Result<Self, Divergence> {
        Ok(Self::of(session, dev, stacks, annotations, name, Self::STILL)?.categorized(session, stacks, annotations))
    }

    /// As `open`, without categories (a trace with no evidence for them).
    pub(crate) fn open_uncategorized(
        session: &Session<'a>,
        dev: &DeviceTrace,
        stacks: &'a [Vec<Frame>],
        annotations: &[Annotation],
        name: String,
    ) -> Result<Self, Divergence> {
        Self::of(session, dev, stacks, annotations, name, Self::STEPPING)
    }

    /// The model of `session`, its scrubber keeping a checkpoint every
    /// `every` events, without categories.
    fn of(
        session: &Session<'a>,
        dev: &DeviceTrace,
        stacks: &'a [Vec<Frame>],
        annotations: &[Annotation],
        name: String,
        every: usize,
    ) -> Result<Self, Divergence> {
        Ok(ReplayModel::new(
            session.scrubber(every)?,
            dev,
            stacks,
            session.exact.empty_cache_at.clone(),
            crate::analysis::iteration_marks(&dev.time_us, annotations, dev.device),
            name,
            session.start == Start::Window,
        ))
    }

    /// With what each block is, from the session's own allocation order.
    fn categorized(mut self, session: &Session<'a>, stacks: &[Vec<Frame>], annotations: &[Annotation]) -> Self {
        let order = Some((&session.exact.allocated, session.exact.allocated_before));
        self.categories = Some(session.categories_sized_by(stacks, annotations, order));
        self
    }

    pub fn new(
        mut scrub: Scrubber<'a>,
        dev: &DeviceTrace,
        stacks: &'a [Vec<Frame>],
        empty_caches: Vec<usize>,
        iterations: Vec<usize>,
        name: String,
        window: bool,
    ) -> Self {
        let points = scrub.take_points();
        // The index finds the run's peaks in the same pass it is built in.
        let maxima = crate::analysis::range_max::RangeMax::of(&points, &iterations);
        let whole = maxima.query(&points, 0, points.len());
        let peak_at = whole.map(|p| p.at);
        let peak_reserved = match whole {
            Some(p) => p.reserved,
            None => scrub.seek(0).stats().get(crate::alloc::Kind::ReservedBytes, 0).current.max(0) as u64,
        };
        let ooms: Vec<usize> = dev.events.ooms().collect();
        let oom_requests = ooms
            .iter()
            .map(|&i| (dev.events.at(i).size, dev.events.at(i).stream, dev.stacks.get(i).copied().unwrap_or(0)))
            .collect();
        ReplayModel {
            stacks,
            name,
            peak_at,
            ooms,
            oom_requests,
            empty_caches,
            iterations,
            window,
            oom_advice: None,
            categories: None,
            label: None,
            peak_reserved,
            cursor: AtomicUsize::new(0),
            maxima,
            scrub: Mutex::new(scrub),
            points,
        }
    }

    /// The OOM that event `cursor` is, if it is one.
    pub(crate) fn oom_at(&self, cursor: usize) -> Option<OomNote<'a>> {
        let k = self.ooms.binary_search(&cursor).ok()?;
        let (size, stream, sid) = self.oom_requests[k];
        let frames = self.stacks.get((sid as usize).wrapping_sub(1)).map_or(&[][..], |f| f.as_slice());
        Some(OomNote { event: cursor, size, stream, frames, advice: self.oom_advice.clone() })
    }

    /// Allocated and reserved bytes after each event.
    pub(crate) fn points(&self) -> &[StatePoint] {
        &self.points
    }

    /// The scrubber, unlocked: no frame draws from a model borrowed
    /// mutably.
    fn scrub(&mut self) -> &mut Scrubber<'a> {
        self.scrub.get_mut().unwrap_or_else(PoisonError::into_inner)
    }

    /// The scrubber, locked (a panic in a frame that held it leaves a
    /// state that is still whole: the next seek goes on from it).
    fn locked(&self) -> MutexGuard<'_, Scrubber<'a>> {
        self.scrub.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The highest reserved bytes of the whole trace (a state-only
    /// snapshot's own): the replay's bars are to this scale at every event.
    pub(crate) fn peak_reserved(&self) -> u64 {
        self.peak_reserved
    }

    /// The last event's index (0 for a state-only snapshot).
    pub(crate) fn last(&self) -> usize {
        self.points().len().saturating_sub(1)
    }

    /// Moves to the state after event `cursor` (after the whole malloc it
    /// is part of); returns the event shown. Frames then draw that state
    /// through `&self` (`now`, `cursor`).
    pub(crate) fn go(&mut self, cursor: usize) -> usize {
        let shown = self.scrub().shown(cursor);
        *self.cursor.get_mut() = shown;
        shown
    }

    /// As `go`, through a shared model: a frame seeks on one thread while
    /// the other draws the timeline from `marks_at` (`ReplayScreen::going`).
    pub(crate) fn go_shared(&self, cursor: usize) -> usize {
        let mut scrub = self.locked();
        let shown = scrub.shown(cursor);
        self.cursor.store(shown, Ordering::Relaxed);
        shown
    }

    /// The event whose state the model stands at.
    pub(crate) fn cursor(&self) -> usize {
        self.cursor.load(Ordering::Relaxed)
    }

    /// Moves the cursor by `step`; returns the event shown. The previous
    /// and next are states shown (the events of one malloc, segment_alloc
    /// then alloc, show one state: the alloc's). The replay and a paused
    /// synth step alike.
    pub(crate) fn step(&mut self, step: Step) -> usize {
        let (cursor, last) = (self.cursor(), self.last());
        let to = match step {
            Step::Previous | Step::Next => {
                let from = self.scrub().shown(cursor);
                let mut c = cursor;
                loop {
                    let next = step.from(c, last, 1);
                    if next == c {
                        break;
                    }
                    c = next;
                    if self.scrub().shown(c) != from {
                        break;
                    }
                }
                c
            }
            _ => return self.go(self.jump(step)),
        };
        self.go(to)
    }

    /// Where `step` goes from the cursor when it is not to a neighbour
    /// (a page, the first or the last event): no state is needed to say.
    pub(crate) fn jump(&self, step: Step) -> usize {
        step.from(self.cursor(), self.last(), (self.points().len() / 20).max(1))
    }

    /// The state the model stands at (`go`) with the timeline and its
    /// marks, borrowed (a frame draws them all; nothing is copied). The
    /// scrubber stays locked while it is held.
    pub(crate) fn now(&self) -> ReplayAt<'_, 'a> {
        ReplayAt { marks: self.marks_at(self.cursor()), scrub: self.locked() }
    }

    /// The timeline and its marks with the cursor at `cursor`: what the
    /// timeline draws, read without the lock.
    pub(crate) fn marks_at(&self, cursor: usize) -> ReplayMarks<'_> {
        let points = &self.points[..];
        // A state-only snapshot has no events: its blocks are the start's.
        let shown = (!points.is_empty()).then_some(cursor);
        ReplayMarks {
            points,
            ooms: &self.ooms,
            empty_caches: &self.empty_caches,
            iterations: &self.iterations,
            meaning: self.categories.as_ref().map(|cats| Meaning::Replay { cats, at: shown }),
            maxima: Some(&self.maxima),
        }
    }

    /// "event 12/300", or what kind of recording this is.
    pub(crate) fn position(&self, cursor: usize) -> String {
        let n = self.points().len();
        match (n, self.window) {
            (0, _) => "state only: no trace in this snapshot".into(),
            (_, true) => format!("event {cursor}/{n} of a window (peaks since its start)"),
            _ => format!("event {cursor}/{n}"),
        }
    }
}

/// What one moment of a replay draws: `ReplayModel::now`.
pub(crate) struct ReplayAt<'m, 'a> {
    pub(crate) marks: ReplayMarks<'m>,
    scrub: MutexGuard<'m, Scrubber<'a>>,
}

impl<'a> ReplayAt<'_, 'a> {
    /// The allocator after the event shown.
    pub(crate) fn state(&self) -> &CachingAllocator<Oracle<'a>> {
        self.scrub.current()
    }
}

/// The timeline of a replay and its marks at one moment: all of it but
/// the state (`ReplayModel::marks_at`).
pub(crate) struct ReplayMarks<'m> {
    pub(crate) points: &'m [StatePoint],
    pub(crate) ooms: &'m [usize],
    pub(crate) empty_caches: &'m [usize],
    pub(crate) iterations: &'m [usize],
    pub(crate) meaning: Option<Meaning<'m>>,
    /// The timeline's block maxima.
    pub(crate) maxima: Option<&'m crate::analysis::range_max::RangeMax>,
}
