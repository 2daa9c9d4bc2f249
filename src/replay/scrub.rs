//! Scrubbing through a recorded trace: the allocator state after any event,
//! without replaying from the start. One pass records the allocated and
//! reserved bytes after every event (the timeline) and keeps a checkpoint
//! every `every` events; a seek resumes from the nearest checkpoint at or
//! before the target, or steps on from where it stands.

use crate::alloc::{CachingAllocator, EventsRef, SeedSegment, StatePoint};
use crate::device::Oracle;

use super::engine::Checkpoint;
use super::{Divergence, ReplayOptions, Stepper};

/// Checkpoints kept at most: past twice this many, every other one goes
/// and the interval doubles. A checkpoint is a whole allocator state (tens
/// of KB); at ten million events one per 1,024 held 1.4 GB, while a seek
/// from one of 4,096 replays at most n/4,096 events (2,400 at 10M, about
/// 0.4 ms: docs/measurements/benchmarks.md, "Ten million events").
const MAX_CHECKPOINTS: usize = 4096;

/// The checkpoints' bytes at most (`Checkpoint::approx_heap_bytes`), past
/// which every other one goes too: a run that keeps tens of thousands of
/// blocks live makes each state megabytes, and 8,192 of them would be tens
/// of GB. A seek then replays more events (docs/measurements/benchmarks.md,
/// "The checkpoints' byte budget").
const CHECKPOINT_BYTES: usize = 1 << 30;
/// Checkpoints kept whatever their bytes.
const MIN_CHECKPOINTS: usize = 16;

/// Behind a decoding it cannot keep up with, the first pass copies one
/// checkpoint in this many and leaves the others for `Scrubbing::finish`
/// to make on every core (docs/design/trace-decoding.md, "The screen
/// behind the decoding").
const HURRIED: usize = 4;

pub struct Scrubber<'a> {
    /// The columns the scrubber replays: the events and their stacks.
    rec: EventsRef<'a>,
    tags: &'a [u32],
    /// States to come back to, bound to no column (`Checkpoint::resume`
    /// binds a copy): a first pass run behind the decoding makes them
    /// while the column still grows (docs/design/trace-decoding.md).
    checkpoints: Vec<Checkpoint>,
    every: usize,
    cur: Stepper<'a>,
    /// Allocated and reserved bytes after each recorded event (none for a
    /// forward-only scrubber).
    points: Vec<StatePoint>,
    /// The state `RUNG` events before the target of the last seek that
    /// resumed from a kept state farther back: steps back from there
    /// resume from it.
    rung: Option<Stepper<'a>>,
    /// Steps the last `seek` took (to keep scrubbing honest in tests).
    last_steps: usize,
}

/// Events before its target at which a seek that resumed from a kept state
/// and replays more than this keeps a copy of the state (`Scrubber::rung`).
/// A step back from the checkpoint before replays up to the interval
/// (2,048 events at ten million); from the copy at most this many, plus a
/// copy's cost (about 110 steps) once in this many events walked back
/// (docs/measurements/benchmarks.md, "A rung behind the cursor").
const RUNG: usize = 256;

/// A scrubber's first pass under way: the checkpoints and the timeline
/// kept as a replay steps (`Scrubber::tagged` steps one; the replay run
/// behind the decoding keeps one as it goes).
pub(crate) struct Scrubbing {
    asked: usize,
    every: usize,
    /// Each with its bytes (`Stepper::kept_bytes`) and the position the
    /// step that reached it began at.
    checkpoints: Vec<(Kept, usize, usize)>,
    /// Where the last step left the replay.
    last: usize,
    points: Vec<StatePoint>,
    /// The checkpoints' bytes, and the most they may hold.
    bytes: usize,
    budget: usize,
}

impl Scrubbing {
    /// A first pass from `start`, a checkpoint every `every` events (more
    /// apart past `MAX_CHECKPOINTS` of them, from the start where `events`,
    /// a bound on the events to come, says so); room for `events` points.
    pub(crate) fn new(start: &mut Stepper<'_>, every: usize, events: usize) -> Scrubbing {
        // A hint (behind the decoding, from the file's size): a failed
        // reservation just means growing as usual.
        let mut points = Vec::new();
        let _ = points.try_reserve(events);
        let first = start.checkpoint();
        let bytes = first.approx_heap_bytes();
        let first = Kept::Copy(Box::new(first));
        // Spaced from the start as thinning would leave them for `events`:
        // otherwise a long trace copied twice the states it keeps, holding
        // half of them at once only to drop every other one. Behind the
        // decoding, `events` is a bound from the file's size (the room the
        // columns reserved, up to 16M): where the file holds fewer, the
        // interval may end twice what thinning reaches, 2,048 events at
        // most below 16M (docs/measurements/benchmarks.md, "Checkpoints
        // spaced from the start, their free lists packed").
        let mut spaced = every.max(1);
        while events / spaced > 2 * MAX_CHECKPOINTS {
            spaced *= 2;
        }
        Scrubbing {
            asked: every,
            every: spaced,
            checkpoints: vec![(first, bytes, start.position())],
            last: start.position(),
            points,
            bytes,
            budget: CHECKPOINT_BYTES,
        }
    }

    /// As `new`, the checkpoints held to `budget` bytes.
    #[cfg(test)]
    fn within(start: &mut Stepper<'_>, every: usize, events: usize, budget: usize) -> Scrubbing {
        Scrubbing { budget, ..Scrubbing::new(start, every, events) }
    }

    /// The checkpoints' interval the pass was asked for.
    pub(crate) fn asked(&self) -> usize {
        self.asked
    }

    /// What the pass keeps of the step `st` has just made. `hurried`: it
    /// runs behind a decoding it has fallen behind, so only one checkpoint
    /// due in `HURRIED` is copied now, the others left as holes for
    /// `finish`; the same ones are kept in the end.
    pub(crate) fn stepped(&mut self, st: &mut Stepper<'_>, hurried: bool) {
        self.points.extend_from_slice(st.allocator().points());
        // A checkpoint after each step that passes a multiple of `every`
        // (one for all it passes: a step may take several events).
        let (from, at) = (self.last, st.position());
        self.last = at;
        if from / self.every < at / self.every {
            let due = self.checkpoints.len();
            let (kept, bytes) = if hurried && due % HURRIED != 0 {
                (Kept::Hole(at), st.kept_bytes())
            } else {
                let c = st.checkpoint();
                let bytes = c.approx_heap_bytes();
                (Kept::Copy(Box::new(c)), bytes)
            };
            self.bytes += bytes;
            self.checkpoints.push((kept, bytes, from));
            while self.checkpoints.len() > 2 * MAX_CHECKPOINTS
                || (self.bytes > self.budget && self.checkpoints.len() > MIN_CHECKPOINTS)
            {
                // Those whose step passed a multiple of twice the interval
                // stay (and the start): the checkpoints a pass at that
                // interval from the start keeps.
                let twice = 2 * self.every;
                let mut first = true;
                self.checkpoints.retain(|(k, _, from)| {
                    let keep = first || from / twice < k.position() / twice;
                    first = false;
                    keep
                });
                self.every = twice;
                self.bytes = self.checkpoints.iter().map(|(_, b, _)| b).sum();
            }
        }
    }

    /// The scrubber over `rec` (tagged from `tags`) the pass made, at the
    /// start: the columns the pass read, whole. The holes a hurried pass
    /// left are made now, each run of them replayed from the copy before
    /// it, the runs on every core.
    pub(crate) fn finish<'a>(self, rec: EventsRef<'a>, tags: &'a [u32]) -> Scrubber<'a> {
        let checkpoints = filled(self.checkpoints, rec, tags);
        let cur = checkpoints[0].resume(rec, tags);
        Scrubber { rec, tags, checkpoints, every: self.every, cur, points: self.points, rung: None, last_steps: 0 }
    }
}

/// A checkpoint a first pass copied, or one it left for `finish` to make.
enum Kept {
    /// Boxed: a state is kilobytes before its heap, and a hole a word.
    Copy(Box<Checkpoint>),
    /// The position it is due at.
    Hole(usize),
}

impl Kept {
    /// The position it holds, or is to hold, the state at.
    fn position(&self) -> usize {
        match self {
            Kept::Copy(c) => c.position(),
            Kept::Hole(at) => *at,
        }
    }
}

/// The checkpoints of `kept`, the holes made: each run of them replayed
/// from the copy before it (the first is always one), the runs side by
/// side. The pass reproduced every event, so a step cannot fail here.
fn filled(kept: Vec<(Kept, usize, usize)>, rec: EventsRef<'_>, tags: &[u32]) -> Vec<Checkpoint> {
    let mut made: Vec<Option<Checkpoint>> = Vec::with_capacity(kept.len());
    // Per run: the copy's index, then each hole's index and position.
    let mut runs: Vec<(usize, Vec<(usize, usize)>)> = Vec::new();
    for (i, (k, _, _)) in kept.into_iter().enumerate() {
        match k {
            Kept::Copy(c) => made.push(Some(*c)),
            Kept::Hole(at) => {
                made.push(None);
                match runs.last_mut() {
                    Some((_, holes)) if holes.last().is_some_and(|&(j, _)| j + 1 == i) => holes.push((i, at)),
                    _ => runs.push((i - 1, vec![(i, at)])),
                }
            }
        }
    }
    let from = &made;
    let runs = crate::analysis::spans::each(runs, |(copy, holes)| {
        let mut st = from[copy].as_ref().map(|c| c.resume(rec, tags));
        holes
            .into_iter()
            .filter_map(|(i, at)| {
                let st = st.as_mut()?;
                while st.position() < at && st.step().is_ok() {}
                Some((i, st.checkpoint()))
            })
            .collect::<Vec<_>>()
    });
    for (i, c) in runs.into_iter().flatten() {
        made[i] = Some(c);
    }
    made.into_iter().flatten().collect()
}

impl<'a> Scrubber<'a> {
    /// Replays `rec` once, keeping a checkpoint every `every` events (more
    /// apart on a trace longer than `MAX_CHECKPOINTS` of them).
    pub fn new(
        rec: EventsRef<'a>,
        opts: &ReplayOptions,
        seed: &[SeedSegment],
        every: usize,
    ) -> Result<Self, Divergence> {
        Self::tagged(rec, &[], opts, seed, every)
    }

    /// As `new`, live blocks tagged with their call stacks (`Stepper::tagged`).
    pub(crate) fn tagged(
        rec: EventsRef<'a>,
        tags: &'a [u32],
        opts: &ReplayOptions,
        seed: &[SeedSegment],
        every: usize,
    ) -> Result<Self, Divergence> {
        let mut st = Stepper::new(rec, opts, seed)?.tagged(tags);
        let mut pass = Scrubbing::new(&mut st, every, rec.len());
        while st.position() < rec.len() {
            st.step_whole()?;
            pass.stepped(&mut st, false);
        }
        Ok(pass.finish(rec, tags))
    }

    /// A scrubber that only goes forwards from the start, without the first
    /// pass: no timeline, no checkpoint but the start, each seek going on
    /// from the last (one going back starts over). For reading a state or
    /// two of a replay known to be exact.
    pub fn forward(
        rec: EventsRef<'a>,
        tags: &'a [u32],
        opts: &ReplayOptions,
        seed: &[SeedSegment],
    ) -> Result<Self, Divergence> {
        let mut st = Stepper::new(rec, opts, seed)?.tagged(tags);
        let start = st.checkpoint();
        Ok(Scrubber {
            rec,
            tags,
            checkpoints: vec![start],
            every: usize::MAX,
            cur: st,
            points: Vec::new(),
            rung: None,
            last_steps: 0,
        })
    }

    /// Events in the trace.
    pub(crate) fn len(&self) -> usize {
        self.rec.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rec.is_empty()
    }

    /// The timeline, kept when the scrubber is done with (a copy is 16
    /// bytes an event).
    pub(crate) fn into_points(self) -> Vec<StatePoint> {
        self.points
    }

    /// The timeline, taken by a model that keeps it beside the scrubber
    /// (`ReplayModel`); seeks do not read it.
    pub(crate) fn take_points(&mut self) -> Vec<StatePoint> {
        std::mem::take(&mut self.points)
    }

    /// The allocator right after `event` (after the whole malloc, for an
    /// event that is part of one).
    pub fn seek(&mut self, event: usize) -> &CachingAllocator<Oracle<'a>> {
        if self.is_empty() {
            // A state-only snapshot: the seeded state is the only one.
            return self.cur.allocator();
        }
        let target = event.min(self.len().saturating_sub(1)) + 1;
        self.last_steps = 0;
        if self.cur.position() > target || target - self.cur.position() > self.every {
            // In order of position: a jump among thousands searches them.
            let at = self.checkpoints.partition_point(|c| c.position() <= target).saturating_sub(1);
            let from = self.checkpoints[at].position();
            self.cur = match self.rung.as_ref().filter(|r| r.position() <= target && r.position() > from) {
                Some(rung) => rung.clone(),
                None => self.checkpoints[at].resume(self.rec, self.tags),
            };
            if target - self.cur.position() > RUNG {
                self.step_to(target - RUNG);
                self.rung = Some(self.cur.clone());
            }
        }
        self.step_to(target);
        self.cur.allocator()
    }

    /// Steps on until the state is at `position` or just past it (a step
    /// may take several events).
    fn step_to(&mut self, position: usize) {
        while self.cur.position() < position {
            // The first pass reproduced every event, so a step cannot fail here.
            if self.cur.step().is_err() {
                break;
            }
            self.last_steps += 1;
        }
    }

    /// The allocator where the last `seek` left it.
    pub(crate) fn current(&self) -> &CachingAllocator<Oracle<'a>> {
        self.cur.allocator()
    }

    /// The event whose state `seek(event)` shows: the last event of the
    /// malloc `event` is part of (a segment_alloc and the alloc it serves
    /// replay as one step).
    pub(crate) fn shown(&mut self, event: usize) -> usize {
        self.seek(event);
        self.cur.position().saturating_sub(1).min(self.len().saturating_sub(1))
    }
}

#[cfg(test)]
impl Scrubber<'_> {
    /// Allocated and reserved bytes after each event.
    pub(crate) fn points(&self) -> &[StatePoint] {
        &self.points
    }

    /// Steps the last `seek` replayed.
    fn last_steps(&self) -> usize {
        self.last_steps
    }

    fn checkpoints(&self) -> usize {
        self.checkpoints.len()
    }

    /// The events the checkpoints were kept at.
    pub(crate) fn kept_at(&self) -> Vec<usize> {
        self.checkpoints.iter().map(Checkpoint::position).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::engine::replay_events_from;
    use crate::replay::replay_events;
    use crate::trace;

    fn fixture(name: &str) -> trace::Trace {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/traces");
        trace::load(&root.join(name)).unwrap()
    }

    /// Each seek of `s` to `events` lands where a fresh replay stopped
    /// there does (blocks, tags and statistics), within `within` steps.
    fn lands_exactly(s: &mut Scrubber, opts: &ReplayOptions, events: &[usize], within: usize) {
        for &e in events {
            let mut o = opts.clone();
            o.stop_at = Some(e + 1);
            let r = replay_events(s.rec, &o);
            let got = s.seek(e);
            assert_eq!(got.snapshot(), r.allocator.snapshot(), "event {e}");
            assert_eq!(got.memory_stats(), r.allocator.memory_stats(), "event {e}");
            assert!(s.last_steps() <= within, "event {e}: {} steps", s.last_steps());
        }
    }

    /// Seeking anywhere, forwards or backwards, gives exactly the state a
    /// replay from the start reaches, and a step back replays at most one
    /// checkpoint interval.
    #[test]
    fn seeks_match_a_fresh_replay_and_stay_local() {
        let t = fixture("resnet50_train.pickle.gz");
        let d = &t.devices[0];
        let opts = ReplayOptions::new(t.settings.as_ref().unwrap().config(), 150_109_880_320);
        let mut s = Scrubber::new(d.events.view(), &opts, &[], 256).unwrap();
        assert_eq!(s.len(), d.events.len());
        assert_eq!(s.checkpoints(), d.events.len() / 256 + 1);
        for &e in &[3041usize, 3040, 9000, 17, 5000, 5001, 4999, 0, 9788] {
            let got = s.seek(e).memory_stats();
            let mut o = opts.clone();
            o.stop_at = Some(e + 1);
            let r = replay_events(d.events.view(), &o);
            assert!(r.divergence.is_none());
            assert_eq!(got, r.allocator.memory_stats(), "event {e}");
            assert_eq!(s.seek(e).snapshot(), r.allocator.snapshot(), "event {e}");
            assert!(s.last_steps() <= 256, "event {e}: {} steps", s.last_steps());
        }
        // The timeline point of the peak event is the peak.
        let peak = s.points().iter().map(|p| p.allocated).max().unwrap();
        assert_eq!(peak, 5_855_043_584);
        assert_eq!(s.points()[3041].allocated, 5_855_043_584);
        // One step forward is one step.
        s.seek(100);
        s.seek(101);
        assert!(s.last_steps() <= 1);
    }

    /// Stepping back one event at a time, each seek resumes from the copy
    /// kept `RUNG` events before the last target that needed a checkpoint,
    /// not from the checkpoint, and lands where a fresh replay does.
    #[test]
    fn steps_back_resume_from_the_rung_behind_the_cursor() {
        let t = fixture("resnet50_train.pickle.gz");
        let d = &t.devices[0];
        let opts = ReplayOptions::new(t.settings.as_ref().unwrap().config(), 150_109_880_320);
        let mut s = Scrubber::new(d.events.view(), &opts, &[], 2048).unwrap();
        let fresh = |e: usize| {
            let mut o = opts.clone();
            o.stop_at = Some(e + 1);
            replay_events(d.events.view(), &o).allocator
        };
        // 1,852 events past the checkpoint at 2,048.
        s.seek(3900);
        assert!(s.last_steps() > RUNG, "{}", s.last_steps());
        let mut long = Vec::new();
        for e in (3300..3900).rev() {
            let got = s.seek(e).snapshot();
            if s.last_steps() > RUNG + 1 {
                long.push(e);
            }
            if e % 97 == 0 {
                assert_eq!(got, fresh(e).snapshot(), "event {e}");
            }
        }
        // From the checkpoint only past each rung: two in 600 steps back.
        assert_eq!(long.len(), 2, "{long:?}");
        assert!(long[0] < 3900 - RUNG && long[1] < long[0] - RUNG + 2, "{long:?}");
        // Forward past the rung and back: from a new rung, then from it.
        s.seek(3700);
        assert_eq!(s.seek(3650).memory_stats(), fresh(3650).memory_stats());
        assert_eq!(s.seek(3649).memory_stats(), fresh(3649).memory_stats());
        assert!(s.last_steps() <= RUNG + 1, "{}", s.last_steps());
    }

    /// A forward-only scrubber keeps neither timeline nor checkpoints, and
    /// lands where a fresh replay does, going on from its last seek.
    #[test]
    fn a_forward_scrubber_lands_where_a_fresh_replay_does() {
        let t = fixture("resnet50_train.pickle.gz");
        let d = &t.devices[0];
        let opts = ReplayOptions::new(t.settings.as_ref().unwrap().config(), 150_109_880_320);
        let mut s = Scrubber::forward(d.events.view(), &[], &opts, &[]).unwrap();
        assert_eq!((s.len(), s.points().len(), s.checkpoints()), (d.events.len(), 0, 1));
        let mut before = 0;
        for &e in &[3041usize, 5000, 5001, 17, 9788] {
            let got = s.seek(e).memory_stats();
            let mut o = opts.clone();
            o.stop_at = Some(e + 1);
            let r = replay_events(d.events.view(), &o);
            assert_eq!(got, r.allocator.memory_stats(), "event {e}");
            // Forwards from the last seek; back means from the start.
            let from = if e + 1 >= before { before } else { 0 };
            assert!(s.last_steps() <= e + 1 - from, "event {e}: {} steps", s.last_steps());
            before = e + 1;
        }
    }

    /// A checkpoint after every event of a 9,789-event trace would be
    /// 9,789 states: past twice `MAX_CHECKPOINTS` every other one goes and
    /// the interval doubles, and seeks still land exactly, within it.
    #[test]
    fn checkpoints_thin_out_on_a_long_trace() {
        let t = fixture("resnet50_train.pickle.gz");
        let d = &t.devices[0];
        let opts = ReplayOptions::new(t.settings.as_ref().unwrap().config(), 150_109_880_320);
        let mut s = Scrubber::new(d.events.view(), &opts, &[], 1).unwrap();
        assert_eq!(s.every, 2);
        assert_eq!(s.checkpoints(), d.events.len() / 2 + 1);
        for &e in &[9788usize, 3041, 1, 6000] {
            let mut o = opts.clone();
            o.stop_at = Some(e + 1);
            let r = replay_events(d.events.view(), &o);
            assert_eq!(s.seek(e).snapshot(), r.allocator.snapshot(), "event {e}");
            assert!(s.last_steps() <= 2, "event {e}: {} steps", s.last_steps());
        }
    }

    /// A pass told how many events may come spaces its checkpoints from
    /// the start as thinning would end: told the 14,327 events, it copies a
    /// state every other event from the first, never holding more than it
    /// keeps (told nothing, it holds 8,192 before thinning), and seeks land
    /// as the thinned pass's do. (A pass steps over most frees whole, so a
    /// trace of fewer steps than 8,192 would never thin.)
    #[test]
    fn a_pass_told_the_events_spaces_its_checkpoints_from_the_start() {
        let t = fixture("gpt2_train.pickle.gz");
        let d = &t.devices[0];
        let opts = ReplayOptions::new(t.settings.as_ref().unwrap().config(), 150_109_880_320);
        let rec = d.events.view();
        let thinned = Scrubber::new(rec, &opts, &[], 1).unwrap();
        for (bound, held_most) in [(rec.len(), rec.len() / 2 + 1), (0, 2 * MAX_CHECKPOINTS)] {
            let mut st = Stepper::new(rec, &opts, &[]).unwrap();
            let mut pass = Scrubbing::new(&mut st, 1, bound);
            let mut most = 0;
            while st.position() < rec.len() {
                st.step_whole().unwrap();
                pass.stepped(&mut st, false);
                most = most.max(pass.checkpoints.len());
            }
            assert_eq!((pass.every, most), (2, held_most), "told {bound}");
            let mut s = pass.finish(rec, &[]);
            assert_eq!(s.checkpoints(), thinned.checkpoints());
            assert_eq!(s.points(), thinned.points());
            lands_exactly(&mut s, &opts, &[14326, 3041, 1, 6000, 9001], 2);
        }
    }

    /// A pass hurried for a stretch (behind a decoding it could not keep
    /// up with) copies one checkpoint in four there and makes the others
    /// as it finishes: the same checkpoints, at the same events, with the
    /// same states, as a pass never hurried, thinned the same way.
    #[test]
    fn a_hurried_pass_keeps_the_checkpoints_an_unhurried_one_does() {
        let t = fixture("resnet50_train.pickle.gz");
        let d = &t.devices[0];
        let opts = ReplayOptions::new(t.settings.as_ref().unwrap().config(), 150_109_880_320);
        let rec = d.events.view();
        for every in [16, 1] {
            let calm = Scrubber::new(rec, &opts, &[], every).unwrap();
            let mut st = Stepper::new(rec, &opts, &[]).unwrap();
            let mut pass = Scrubbing::new(&mut st, every, rec.len());
            while st.position() < rec.len() {
                st.step_whole().unwrap();
                let hurried = (2_000..7_000).contains(&st.position());
                pass.stepped(&mut st, hurried);
            }
            let holes = pass.checkpoints.iter().filter(|(k, _, _)| matches!(k, Kept::Hole(_))).count();
            // Three in four of those due in the stretch were left.
            let stretch = 5_000 / pass.every;
            assert!(holes * 2 > stretch && holes < stretch, "every {every}: {holes} holes of {stretch}");
            assert_eq!(pass.bytes, pass.checkpoints.iter().map(|(_, b, _)| b).sum::<usize>());
            let mut s = pass.finish(rec, &[]);
            assert_eq!(s.kept_at(), calm.kept_at(), "every {every}");
            assert_eq!((s.every, s.points()), (calm.every, calm.points()));
            let every = s.every;
            lands_exactly(&mut s, &opts, &[9788, 3041, 1, 6000, 4500, 2001], every);
        }
    }

    /// Checkpoints past their byte budget thin out as past their count:
    /// every other goes and the interval doubles, down to
    /// `MIN_CHECKPOINTS`; seeks still land exactly, within the interval.
    #[test]
    fn checkpoints_thin_out_past_their_bytes() {
        let t = fixture("resnet50_train.pickle.gz");
        let d = &t.devices[0];
        let opts = ReplayOptions::new(t.settings.as_ref().unwrap().config(), 150_109_880_320);
        let rec = d.events.view();
        let one = Scrubber::new(rec, &opts, &[], 16).unwrap();
        let each: Vec<usize> = one.checkpoints.iter().map(Checkpoint::approx_heap_bytes).collect();
        let most = *each.iter().max().unwrap();
        assert!(most > 10_000 && most < 10_000_000, "{most} bytes a state");
        // Room for about 40 of the largest: of the 612 asked for, a few
        // dozen stay.
        let budget = 40 * most;
        let mut st = Stepper::new(rec, &opts, &[]).unwrap();
        let mut pass = Scrubbing::within(&mut st, 16, rec.len(), budget);
        while st.position() < rec.len() {
            st.step_whole().unwrap();
            pass.stepped(&mut st, false);
            assert!(pass.bytes <= budget || pass.checkpoints.len() <= MIN_CHECKPOINTS);
        }
        let (kept, every) = (pass.checkpoints.len(), pass.every);
        assert_eq!(one.checkpoints(), 612);
        assert!((MIN_CHECKPOINTS..=80).contains(&kept), "{kept} kept");
        assert!(every >= 16 * 8, "every {every}");
        let mut s = pass.finish(rec, &[]);
        assert_eq!(s.points(), one.points());
        for &e in &[9788usize, 3041, 1, 6000, 6001, 2] {
            let mut o = opts.clone();
            o.stop_at = Some(e + 1);
            let r = replay_events(rec, &o);
            assert_eq!(s.seek(e).snapshot(), r.allocator.snapshot(), "event {e}");
            assert!(s.last_steps() <= every, "event {e}: {} steps", s.last_steps());
        }
    }

    /// A run whose settings changed mid-run (recorded on the H200 with
    /// `_set_allocator_settings`): the screens' scrubbers follow the change
    /// as the exact replay does, so every seek, before the change or after
    /// it, forwards or back, lands where the session's replay went.
    #[test]
    fn scrubbers_follow_a_change_of_settings_mid_run() {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/conditions");
        for name in ["switch_split.pickle.gz", "switch_es_split.pickle.gz", "switch_roundup.pickle.gz"] {
            let t = trace::load(&root.join(name)).unwrap();
            let opened = crate::replay::open(&t, name, &crate::replay::OpenOptions::default()).unwrap();
            let session = &opened.session;
            let at = session.settings_changed.as_ref().expect(name).event;
            let (n, peak) = (opened.dev.events.len(), session.exact.peak.event);
            let fresh = |e: usize| {
                let mut o = session.opts.clone();
                o.stop_at = Some(e + 1);
                replay_events_from(opened.dev.events.view(), &o, &session.seed).allocator.memory_stats()
            };
            let end = session.exact.allocator.memory_stats();
            let mut s = session.scrubber(256).unwrap();
            assert_eq!(s.seek(n - 1).memory_stats(), end, "{name}");
            for e in [at + 40, at - 1, at, peak] {
                assert_eq!(s.seek(e).memory_stats(), fresh(e), "{name}: event {e}");
            }
            assert!(peak > at, "{name}: the peak {peak} comes after the change at {at}");
            let mut f = session.forward_scrubber().unwrap();
            let st = f.seek(peak).stats().get(crate::alloc::Kind::AllocatedBytes, 0).current;
            assert_eq!(st as u64, session.exact.peak.allocated, "{name}");
            assert_eq!(f.seek(n - 1).memory_stats(), end, "{name}");
        }
    }
}
