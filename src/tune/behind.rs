//! The search made before the run's own replay is open: its first stage
//! beside the session's opening (`Early`) or behind the decoding of the
//! trace (`FirstBehind`), and there, once the first stage's figures
//! part-way through the run are known, the second stage it most likely
//! asks for, so that both are mostly done when the file is read
//! (docs/user/tune.md, "What is searched").

use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::{conf_of, hit_of, prefix_of, rider_of, running, stage_two, Ask, FirstStage, Outcome, Point, StageOne};
use crate::alloc::{AllocatorConfig, EventsRef, SeedSegment};
use crate::replay::ahead::{setting_shown, Followed};
use crate::replay::session::{first_start, Start};
use crate::replay::whatif::{FromEvents, Request, Run, Slots, Slotted};
use crate::trace::DeviceTrace;

/// The first stage of a search over a device's requests from where its
/// replay most likely starts (`session::first_start`), made before the
/// session is open so that it runs beside the run's own replay (`tune`);
/// `search_session` keeps it only where the session started there, inferred
/// no `empty_cache()` call and is asked the same.
pub(crate) struct Early {
    pub(super) start: Start,
    pub(super) seed: Vec<SeedSegment>,
    pub(super) first: FirstStage,
}

impl Early {
    /// `None` where the device has no trace to replay.
    pub(crate) fn run(dev: &DeviceTrace, ask: Ask, config: &AllocatorConfig, recorded_state: bool) -> Option<Early> {
        let (start, seed) = first_start(dev, config, ask.device_total, recorded_state)?;
        let reqs = FromEvents { prefix: prefix_of(start, &seed), events: dev.events.view(), empty_cache_at: &[] };
        let first = FirstStage::run(&reqs, ask);
        Some(Early { start, seed, first })
    }
}

/// Events read before the second stage is guessed: about a tenth of a
/// ten-million-event run, by when a training loop has long reached its
/// steady peaks; a run shorter than this has its second stage after the
/// decoding, which for it is quick.
const GUESS_AT: usize = 1 << 20;

/// The first stage replayed behind the decoding of a trace: every point on
/// a thread of its own, each taking the events as the decoder hands them
/// over (`Followed`), for the setting the events show: the default one, or
/// expandable segments where the first segment event is a map (as the
/// replay behind guesses). It stands for the run's where the run's trace
/// is one device's, replayed from process start with nothing inferred, and
/// recorded under that setting (docs/user/tune.md). The second stage's
/// points, guessed from the first's figures at `GUESS_AT` events, are
/// replayed beside it.
pub(crate) struct FirstBehind {
    thread: JoinHandle<Option<(Option<i32>, usize, FirstStage)>>,
}

impl FirstBehind {
    /// The stage's thread, and where to hand it the events; `ask_of` makes
    /// the ask for a recorded setting.
    pub(crate) fn start(
        ask_of: impl Fn(&str) -> Ask + Send + 'static,
    ) -> Option<(FirstBehind, std::sync::mpsc::Sender<Followed>)> {
        FirstBehind::guessing_at(GUESS_AT, ask_of)
    }

    /// As `start`, the second stage guessed at `guess_at` events.
    fn guessing_at(
        guess_at: usize,
        ask_of: impl Fn(&str) -> Ask + Send + 'static,
    ) -> Option<(FirstBehind, std::sync::mpsc::Sender<Followed>)> {
        let (to, from) = channel();
        let thread =
            std::thread::Builder::new().name("tune".into()).spawn(move || follow(&from, ask_of, guess_at)).ok()?;
        Some((FirstBehind { thread }, to))
    }

    /// The stage, where its events were all `dev`'s (waiting for the
    /// points' last events).
    pub(crate) fn take_for(self, dev: &DeviceTrace) -> Option<Early> {
        let (whole, events, first) = self.thread.join().ok()??;
        (whole == Some(dev.device) && events == dev.events.len()).then(|| Early {
            start: Start::ProcessStart,
            seed: Vec::new(),
            first,
        })
    }
}

/// Some events' requests, keyed by slot, for every lane, and the
/// intervals their sizes are rounded in (`AllocatorConfig::rounding_bit`).
struct Chunk {
    events: usize,
    reqs: Vec<Request>,
    hit: u16,
}

impl Chunk {
    fn of(events: EventsRef<'_>, slots: &mut Slots) -> Chunk {
        let reqs = slots.requests(events);
        let hit = hit_of(reqs.iter().copied());
        Chunk { events: events.len(), reqs, hit }
    }
}

/// The events' requests, made once for every lane, held until the setting
/// is guessed, then each chunk handed to every point's thread.
fn follow(
    from: &Receiver<Followed>,
    ask_of: impl Fn(&str) -> Ask,
    guess_at: usize,
) -> Option<(Option<i32>, usize, FirstStage)> {
    let mut held: Vec<Arc<Chunk>> = Vec::new();
    let mut lanes: Option<Lanes> = None;
    let mut slots = Slots::default();
    loop {
        match from.recv().ok()? {
            Followed::Events(c) => match &mut lanes {
                Some(l) => l.hand(&Arc::new(Chunk::of(c.view(), &mut slots))),
                None => {
                    let guess = setting_shown(c.view());
                    held.push(Arc::new(Chunk::of(c.view(), &mut slots)));
                    if let Some(g) = guess {
                        lanes = Some(Lanes::start(ask_of(g), held.drain(..), guess_at));
                    }
                }
            },
            Followed::Done(whole, events) => {
                let l = lanes.unwrap_or_else(|| Lanes::start(ask_of(""), held.drain(..), guess_at));
                return Some((whole, events, l.finish()?));
            }
        }
    }
}

/// A thread replaying one point's requests from the events it is handed.
struct Lane {
    point: Point,
    /// None once told the events are over.
    to: Option<Sender<Arc<Chunk>>>,
    thread: Option<JoinHandle<Option<Outcome>>>,
}

impl Lane {
    /// `report`: the event count past which the lane sends its figures so
    /// far, once (at the end where the events never reach it), and where.
    fn start(point: Point, ask: &Ask, others: &[(String, String)], report: Option<(usize, Sender<Outcome>)>) -> Lane {
        let (to, from) = channel::<Arc<Chunk>>();
        let (conf, ask) = (conf_of(&point, others), ask.clone());
        let run = move || {
            let mut run = running::<Slotted>(&conf, &ask)?;
            let (mut seen, mut report) = (0usize, report);
            // A guesser gone has given up guessing.
            let tell =
                |tell: Sender<Outcome>, run: &Run<Slotted>| drop(tell.send(Outcome::of(conf.clone(), run.stats())));
            while let Ok(c) = from.recv() {
                for &r in &c.reqs {
                    run.step(r);
                }
                seen += c.events;
                if let Some((_, to)) = report.take_if(|(at, _)| seen >= *at) {
                    tell(to, &run);
                }
            }
            if let Some((_, to)) = report {
                tell(to, &run);
            }
            Some(Outcome::of(conf, run.finish().allocator.stats()))
        };
        let thread = std::thread::Builder::new().name("tune".into()).spawn(run).ok();
        Lane { point, to: Some(to), thread }
    }

    fn hand(&self, c: &Arc<Chunk>) {
        // A thread gone has panicked: `finish` says so.
        if let Some(to) = &self.to {
            let _ = to.send(c.clone());
        }
    }

    /// Tells the lane the events are over.
    fn close(&mut self) {
        self.to = None;
    }

    /// The lane's outcome once it has read every event (none where its
    /// setting does not parse); none where its thread could not be had or
    /// panicked.
    fn finish(mut self) -> Option<Option<Outcome>> {
        self.close();
        self.thread?.join().ok()
    }
}

/// A point without a lane of its own: its setting acts apart from its
/// lane's only in the intervals `apart` (`AllocatorConfig::acts_apart`;
/// none for `roundup_power2_divisions:1` beside the default), so that
/// lane's replay is its own until a request falls in one of them. In most
/// runs none does (`[256:1,512:2,1024:4,>:8]` rounds as the default below
/// 512 MiB, `max_split_size_mb:256` splits as no limit does while no
/// request could make a segment that large): a first-stage point then
/// leaves its replay to another, and the second stage most of its own
/// (docs/user/tune.md).
struct Rider {
    point: Point,
    /// The lane in `Lanes::first` (`second`: in `Lanes::second`).
    lane: usize,
    second: bool,
    apart: u16,
}

/// The lanes of the first stage, and of the second once it is guessed.
struct Lanes {
    ask: Ask,
    one: StageOne,
    first: Vec<Lane>,
    /// Each first-stage point's lane (its own or the one it rides).
    lane_of: Vec<usize>,
    second: Vec<Lane>,
    riders: Vec<Rider>,
    /// The intervals the requests so far fell in.
    hit: u16,
    guess: Option<Guess>,
}

/// What the second stage's guess waits for: each first-stage lane's
/// figures at the same event, as they come, and every chunk so far, for
/// the lanes it starts.
struct Guess {
    figures: Vec<(Receiver<Outcome>, Option<Outcome>)>,
    kept: Vec<Arc<Chunk>>,
    at: usize,
}

/// Where a guess stands.
enum Guessing {
    Waiting,
    /// A first-stage lane is gone (its setting does not parse, or its
    /// thread): the second stage is made after the decoding.
    GivenUp,
    Made(Vec<Outcome>),
}

impl Guess {
    /// The figures, where every lane has told them (`wait`: waiting for
    /// them).
    fn look(&mut self, wait: bool) -> Guessing {
        for (from, got) in &mut self.figures {
            if got.is_none() {
                let o = if wait { from.recv().map_err(|_| TryRecvError::Disconnected) } else { from.try_recv() };
                match o {
                    Ok(o) => *got = Some(o),
                    Err(TryRecvError::Empty) => return Guessing::Waiting,
                    Err(TryRecvError::Disconnected) => return Guessing::GivenUp,
                }
            }
        }
        Guessing::Made(self.figures.iter_mut().filter_map(|(_, o)| o.take()).collect())
    }
}

impl Lanes {
    fn start(ask: Ask, held: impl Iterator<Item = Arc<Chunk>>, guess_at: usize) -> Lanes {
        let one = StageOne::of(&ask);
        // Riders only where the requests held do not part them at once.
        let held: Vec<Arc<Chunk>> = held.collect();
        let hit = held.iter().fold(0, |m, c| m | c.hit);
        let guess = Some(Guess { figures: Vec::new(), kept: Vec::new(), at: guess_at });
        let mut lanes = Lanes {
            ask,
            one,
            first: Vec::new(),
            lane_of: Vec::new(),
            second: Vec::new(),
            riders: Vec::new(),
            hit: 0,
            guess,
        };
        for (i, p) in lanes.one.points.clone().iter().enumerate() {
            let own: Vec<Point> = lanes.first.iter().map(|l| l.point).collect();
            match rider_of(p, &own, &lanes.one.others, hit) {
                Some((lane, apart)) => {
                    lanes.riders.push(Rider { point: *p, lane, second: false, apart });
                    lanes.lane_of.push(lane);
                }
                None => {
                    let lane = lanes.start_first(i);
                    lanes.lane_of.push(lane);
                }
            }
        }
        held.iter().for_each(|c| lanes.hand(c));
        lanes
    }

    /// A lane of its own for the first stage's point `i`, handed every
    /// chunk kept and, while the guess waits, reporting its figures for it;
    /// its index.
    fn start_first(&mut self, i: usize) -> usize {
        let report = self.guess.as_mut().map(|g| {
            let (tell, told) = channel();
            g.figures.push((told, None));
            (g.at, tell)
        });
        let lane = Lane::start(self.one.points[i], &self.ask, &self.one.others, report);
        if let Some(g) = &self.guess {
            g.kept.iter().for_each(|c| lane.hand(c));
        }
        self.first.push(lane);
        self.first.len() - 1
    }

    fn hand(&mut self, c: &Arc<Chunk>) {
        self.first.iter().chain(&self.second).for_each(|l| l.hand(c));
        if let Some(g) = &mut self.guess {
            g.kept.push(c.clone());
        }
        self.hit |= c.hit;
        self.part(c.hit);
        self.guess_now(false);
    }

    /// Riders whose intervals apart a request fell in: a first-stage one
    /// gets a lane of its own while the chunks are kept; past the guess
    /// (or in the second stage, started after it) it is left to the search,
    /// which replays it after the decoding.
    fn part(&mut self, hit: u16) {
        let (parted, riding) = std::mem::take(&mut self.riders).into_iter().partition(|r| r.apart & hit != 0);
        self.riders = riding;
        let kept = self.guess.is_some();
        for r in parted.into_iter().filter(|r: &Rider| !r.second && kept) {
            if let Some(i) = self.one.points.iter().position(|p| *p == r.point) {
                self.lane_of[i] = self.start_first(i);
            }
        }
    }

    /// Starts the second stage's lanes where the first stage's figures are
    /// in (`wait`: waiting for them), handing them every event so far.
    fn guess_now(&mut self, wait: bool) {
        let Some(g) = &mut self.guess else { return };
        let lanes = match g.look(wait) {
            Guessing::Waiting => return,
            Guessing::GivenUp => Vec::new(),
            Guessing::Made(figures) => figures,
        };
        let kept = std::mem::take(&mut g.kept);
        self.guess = None;
        if lanes.len() != self.first.len() {
            return;
        }
        let (one, others) = (&self.one, &self.one.others);
        let figures: Vec<Outcome> =
            one.points.iter().zip(&self.lane_of).map(|(p, &l)| lanes[l].renamed(conf_of(p, others))).collect();
        // The first point is the recorded setting.
        for p in stage_two(one, &figures, &figures[0]) {
            // A setting that rounds as one already replayed rides along.
            let own: Vec<Point> = self.first.iter().chain(&self.second).map(|l| l.point).collect();
            if let Some((j, apart)) = rider_of(&p, &own, others, self.hit) {
                let (lane, second) = if j < self.first.len() { (j, false) } else { (j - self.first.len(), true) };
                self.riders.push(Rider { point: p, lane, second, apart });
                continue;
            }
            let lane = Lane::start(p, &self.ask, others, None);
            kept.iter().for_each(|c| lane.hand(c));
            self.second.push(lane);
        }
    }

    /// The stages, once every point has read every event; none where a
    /// first-stage lane could not be had or panicked (the search makes it
    /// again; a second-stage lane that failed, or a rider that parted
    /// past the guess, is made again too). Where the events never reached
    /// the point of the guess, it is made from the first stage's figures
    /// at their end.
    fn finish(mut self) -> Option<FirstStage> {
        self.first.iter_mut().for_each(Lane::close);
        self.guess_now(true);
        let mut firsts = Vec::new();
        for l in self.first {
            firsts.push((l.point, l.finish()?));
        }
        let seconds: Vec<(Point, Option<Outcome>)> =
            self.second.into_iter().filter_map(|l| Some((l.point, l.finish()?))).collect();
        let others = &self.one.others;
        let ridden = |r: &Rider| {
            let (_, o) = if r.second { seconds.get(r.lane)? } else { firsts.get(r.lane)? };
            Some((r.point, o.as_ref()?.renamed(conf_of(&r.point, others))))
        };
        let riders: Vec<(Point, Outcome)> = self.riders.iter().filter_map(ridden).collect();
        let outcome = |p: &Point| {
            let own = firsts.iter().find(|(q, _)| q == p).and_then(|(_, o)| o.clone());
            own.or_else(|| riders.iter().find(|(q, _)| q == p).map(|(_, o)| o.clone()))
        };
        let outcomes = self.one.points.iter().map(outcome).collect();
        let second = seconds
            .into_iter()
            .filter_map(|(q, o)| Some((q, o?)))
            .chain(riders.into_iter().filter(|(q, _)| !self.one.points.contains(q)))
            .collect();
        Some(FirstStage { ask: self.ask, outcomes, second })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::whatif::Requests;

    /// The first stage replayed behind the decoding, handed the events in
    /// chunks with the setting guessed from them, gives the outcomes the
    /// stage made after the decoding gives; so do the second stage's
    /// points guessed part-way, and the search taking them is the search
    /// made without them. It is taken only for the device whose whole
    /// column it read, and a decoding that stopped gives none.
    #[test]
    fn the_stages_behind_the_decoding_are_the_ones_made_after_it() {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/traces");
        // The second stage of the first has a dozen points; of the second,
        // none (no setting beats the recorded one alone).
        for (name, guessed, seconds) in
            [("resnet50_train.pickle.gz", "", 12), ("gpt2_train_expandable.pickle.gz", "expandable_segments:True", 0)]
        {
            let t = crate::trace::load(&root.join(name)).unwrap();
            let dev = t.main_device().unwrap();
            let ask_of = |recorded: &str| Ask::of_run(recorded, 150 << 30, None);
            let config = AllocatorConfig::parse(guessed).unwrap();
            let want = Early::run(dev, ask_of(guessed), &config, true).unwrap();
            assert_eq!(want.start, Start::ProcessStart, "{name}");
            assert!(want.first.outcomes.len() > 10, "{name}");
            // Handed over in chunks of 1,000 events, as the decoder does;
            // then told whose column they were, and how many. The second
            // stage guessed at `guess_at` events.
            let behind = |device: i32, events: usize, guess_at: usize| {
                let (b, to) = FirstBehind::guessing_at(guess_at, ask_of).unwrap();
                let all: Vec<crate::alloc::Event> = dev.events.iter().collect();
                for c in all.chunks(1000) {
                    to.send(Followed::Events(Arc::new(c.iter().copied().collect()))).unwrap();
                }
                to.send(Followed::Done(Some(device), events)).unwrap();
                b.take_for(dev)
            };
            let n = dev.events.len();
            let reqs = FromEvents { prefix: Vec::new(), events: dev.events.view(), empty_cache_at: &[] };
            let plain = super::super::search_from(&reqs, &ask_of(guessed), None, None);
            for guess_at in [n / 5, n / 2, n + 1] {
                let got = behind(dev.device, n, guess_at).unwrap();
                assert_eq!(got.first.ask, ask_of(guessed), "{name}: the setting guessed");
                assert_eq!(got.first.outcomes, want.first.outcomes, "{name}");
                assert_eq!((got.start, got.seed.len()), (Start::ProcessStart, 0));
                // Each point guessed has the outcome it has after the
                // decoding.
                let second = &got.first.second;
                for (p, o) in second {
                    let after = super::super::outcome_of(conf_of(p, &[]), &ask_of(guessed), reqs.iter());
                    assert_eq!(Some(o), after.as_ref(), "{name} at {guess_at}");
                }
                // From half-way (or, past the events, from their end) the
                // guess is the second stage made after the decoding, and
                // its replays are the ones taken: a figure changed in one
                // shows.
                let one = StageOne::of(&ask_of(guessed));
                let made: Vec<Outcome> = want.first.outcomes.iter().flatten().cloned().collect();
                let after = stage_two(&one, &made, &made[0]);
                assert_eq!(after.len(), seconds, "{name}: {after:?}");
                if guess_at >= n / 2 && seconds > 0 {
                    assert!(after.iter().all(|p| second.iter().any(|(q, _)| q == p)), "{name}");
                    let mut changed = got.first.clone();
                    changed.second[0].1.reserved_peak_bytes += 1 << 20;
                    let taken = super::super::search_from(&reqs, &ask_of(guessed), None, Some(changed));
                    assert_ne!(taken, plain, "{name}");
                }
                let taken = super::super::search_from(&reqs, &ask_of(guessed), None, Some(got.first));
                assert_eq!(taken, plain, "{name} at {guess_at}");
            }
            // Another device's events, or not all of them: not taken.
            assert!(behind(dev.device + 1, n, n / 2).is_none(), "{name}");
            assert!(behind(dev.device, n + 1, n / 2).is_none(), "{name}");
        }
        // The decoding stopped (a bad file): nothing.
        let (b, to) =
            FirstBehind::start(|_| Ask { recorded: String::new(), device_total: 1 << 30, context: 0, limit: None })
                .unwrap();
        drop(to);
        assert!(b.thread.join().unwrap().is_none());
    }

    /// Settings that act apart only from 512 MiB (rounding, or a split
    /// limit no segment below that reaches) ride on the lanes of those
    /// they act as, until a request falls there: before the guess the
    /// rider gets a lane of its own; after it, the search replays it.
    /// Every outcome made is the one its own replay gives, and the search
    /// is the one made without the lanes.
    #[test]
    fn a_rider_parts_where_a_request_falls_apart() {
        let mb = 1 << 20;
        let chunk = |from: u64, big: bool, slots: &mut Slots| {
            let mut ev = Vec::new();
            for k in from..from + 400 {
                let size = if big && k == from + 7 { 600 * mb } else { (k % 50 + 1) * 3 * mb + 12_345 };
                ev.push(crate::alloc::Event::new(crate::alloc::Action::Alloc, 100 + k, size, 0));
                if k >= 5 {
                    for a in [crate::alloc::Action::FreeRequested, crate::alloc::Action::FreeCompleted] {
                        ev.push(crate::alloc::Event::new(a, 100 + k - 5, 0, 0));
                    }
                }
            }
            let ev: crate::alloc::Events = ev.into_iter().collect();
            (Arc::new(Chunk::of(ev.view(), slots)), ev)
        };
        let ask = Ask::of_run("", 150 << 30, None);
        let one = StageOne::of(&ask);
        let at = |p: Point| one.points.iter().position(|q| q == &p).unwrap();
        // `big`: which chunk holds the 600 MiB request; `guessed`: whether
        // the guess is made before it. The first chunk is held until the
        // lanes start.
        for (big, guessed) in [(None, false), (Some(1), false), (Some(2), true)] {
            let mut slots = Slots::default();
            let (c, mut all) = chunk(0, false, &mut slots);
            let mut lanes = Lanes::start(ask.clone(), std::iter::once(c), if guessed { 1 } else { usize::MAX });
            // roundup_power2_divisions:1, [256:1,512:2,1024:4,>:8] and
            // max_split_size_mb 512 and 1024 on the default's lane (the
            // requests, up to 150 MiB, make segments of up to 256 MiB),
            // [256:4,1024:8,>:16] on 4's.
            assert_eq!((lanes.first.len(), lanes.riders.len()), (one.points.len() - 5, 5));
            if guessed {
                lanes.guess_now(true);
            }
            for k in 1..3 {
                let (c, ev) = chunk(k * 400, big == Some(k as usize), &mut slots);
                all.append(ev);
                lanes.hand(&c);
            }
            // Past a 600 MiB request only divisions:1 still rides (a
            // segment of 600 MiB splits under neither limit).
            assert_eq!(lanes.riders.len(), if big.is_some() { 1 } else { 5 }, "{big:?}");
            let first = lanes.finish().unwrap();
            let reqs = FromEvents { prefix: Vec::new(), events: all.view(), empty_cache_at: &[] };
            for (p, o) in one.points.iter().zip(&first.outcomes) {
                let alone = super::super::outcome_of(conf_of(p, &[]), &ask, reqs.iter());
                if let Some(o) = o {
                    assert_eq!(Some(o), alone.as_ref(), "{big:?} {p:?}");
                }
            }
            // Made, but for a rider parted past the guess.
            let made = |p: Point| first.outcomes[at(p)].is_some();
            assert!(made(["", "", "1", ""]));
            for p in [
                ["", "", "[256:1,512:2,1024:4,>:8]", ""],
                ["", "", "[256:4,1024:8,>:16]", ""],
                ["", "512", "", ""],
                ["", "1024", "", ""],
            ] {
                assert_eq!(made(p), !guessed, "{big:?} {p:?}");
            }
            let plain = super::super::search_from(&reqs, &ask, None, None);
            assert_eq!(super::super::search_from(&reqs, &ask, None, Some(first)), plain, "{big:?}");
        }
    }
}
