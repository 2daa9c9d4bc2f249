//! Which `PYTORCH_CUDA_ALLOC_CONF`? A search over the caching allocator's
//! settings for one recorded run: each candidate is the run's requests
//! replayed under it on the simulated device (the what-if engine, which
//! predicted 48 of 48 real H200 runs' peaks to the byte), ranked by what a
//! user pays for (docs/user/tune.md).
//!
//! The search is staged. Every setting alone first (each value of one key,
//! the others as recorded); then the combinations of each key's values that
//! did not lose alone (at most the best two of each key, and the recorded
//! one), so a value that cannot help is never combined. Candidates run in
//! parallel, one replay per core.

mod behind;

use std::collections::HashSet;

use serde::Serialize;

use crate::alloc::{AllocatorConfig, Kind, SeedSegment};
use crate::analysis::spans::each;
use crate::device::Sim;
use crate::replay::session::Start;
use crate::replay::whatif::{FromEvents, Keyed, Live, Request, Requests, Run};

pub(crate) use behind::{Early, FirstBehind};

/// One candidate's replay.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Outcome {
    /// The `PYTORCH_CUDA_ALLOC_CONF` value ("" for PyTorch's defaults).
    pub alloc_conf: String,
    pub reserved_peak_bytes: u64,
    pub allocated_peak_bytes: u64,
    pub num_alloc_retries: u64,
    /// Allocations that fail under it (PyTorch's `num_ooms`).
    pub num_ooms: u64,
    /// `cudaMalloc` calls (or page ranges mapped).
    pub num_device_alloc: u64,
    /// 1 − peak allocated / peak reserved: reserved memory that never held
    /// tensors at the peaks.
    pub peak_ratio: f64,
}

impl Outcome {
    /// The ranking: no OOM first, then fewer retries (each a synchronize
    /// and a cache flush), then the lowest peak reserved, then fewer
    /// `cudaMalloc` calls; ties by the shorter setting.
    fn key(&self) -> (u64, u64, u64, u64, usize) {
        let (a, b, c, d) = self.figures();
        (a, b, c, d, self.alloc_conf.len())
    }

    fn figures(&self) -> (u64, u64, u64, u64) {
        (self.num_ooms, self.num_alloc_retries, self.reserved_peak_bytes, self.num_device_alloc)
    }

    /// Whether `self` ranks strictly before `other` on the figures.
    pub fn beats(&self, other: &Outcome) -> bool {
        self.figures() < other.figures()
    }
}

impl Outcome {
    /// The same figures under another setting's name (one that behaves
    /// the same).
    fn renamed(&self, alloc_conf: String) -> Outcome {
        Outcome { alloc_conf, ..self.clone() }
    }

    fn of(alloc_conf: String, st: &crate::alloc::DeviceStats) -> Outcome {
        Outcome {
            alloc_conf,
            reserved_peak_bytes: st.get(Kind::ReservedBytes, 0).peak.max(0) as u64,
            allocated_peak_bytes: st.get(Kind::AllocatedBytes, 0).peak.max(0) as u64,
            num_alloc_retries: st.num_alloc_retries.max(0) as u64,
            num_ooms: st.num_ooms.max(0) as u64,
            num_device_alloc: st.num_device_alloc.max(0) as u64,
            peak_ratio: crate::analysis::peak_ratio(st),
        }
    }
}

/// The keys `tune` sets; any other key of the recorded setting is kept as
/// it was. `pinned_*` and the like are never offered: a trace of device
/// allocations cannot speak for them.
const TUNED: [&str; 4] =
    ["expandable_segments", "max_split_size_mb", "roundup_power2_divisions", "garbage_collection_threshold"];

/// The values tried for each key ("" leaves the key out: PyTorch's default).
fn values(key: &str, limited: bool) -> Vec<&'static str> {
    match key {
        "expandable_segments" => vec!["", "True"],
        "max_split_size_mb" => vec!["", "64", "128", "256", "512", "1024"],
        "roundup_power2_divisions" => {
            vec!["", "1", "2", "4", "8", "16", "[256:1,512:2,1024:4,>:8]", "[256:4,1024:8,>:16]"]
        }
        // The threshold acts only under a memory limit (PyTorch frees
        // cached blocks once reserved passes that share of the limit).
        "garbage_collection_threshold" if limited => vec!["", "0.5", "0.6", "0.7", "0.8", "0.9", "0.95"],
        _ => vec![""],
    }
}

/// A setting's top-level `key:value` pairs (commas inside `[…]` kept).
pub(crate) fn pairs(conf: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    let bytes = conf.as_bytes();
    for (i, &b) in bytes.iter().enumerate().chain(std::iter::once((bytes.len(), &b','))) {
        match b {
            b'[' => depth += 1,
            b']' => depth -= 1,
            b',' if depth <= 0 => {
                let part = conf[start..i].trim();
                if let Some((k, v)) = part.split_once(':') {
                    out.push((k.trim().to_string(), v.trim().to_string()));
                }
                start = i + 1;
            }
            _ => {}
        }
    }
    out
}

/// One point of the search: a value (possibly "") for each tuned key.
type Point = [&'static str; 4];

/// The setting string of `p` over the recorded one's other keys.
fn conf_of(p: &Point, others: &[(String, String)]) -> String {
    let mut parts: Vec<String> =
        TUNED.iter().zip(p.iter()).filter(|(_, v)| !v.is_empty()).map(|(k, v)| format!("{k}:{v}")).collect();
    parts.extend(others.iter().map(|(k, v)| format!("{k}:{v}")));
    parts.join(",")
}

/// The recorded setting as a point: each tuned key's recorded value when it
/// is one of the values tried, else left as it was (in `others`).
fn recorded_point(recorded: &str, limited: bool) -> (Point, Vec<(String, String)>) {
    let mut p: Point = [""; 4];
    let mut others = Vec::new();
    for (k, v) in pairs(recorded) {
        match TUNED.iter().position(|t| *t == k) {
            Some(i) => match values(&k, limited).into_iter().find(|c| c.eq_ignore_ascii_case(&v)) {
                Some(c) => p[i] = c,
                // A value we do not try ("False", a threshold off the
                // grid) stays as recorded, and that key is not searched.
                None => others.push((k, v)),
            },
            None => others.push((k, v)),
        }
    }
    (p, others)
}

/// What `tune` found.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Search {
    /// The recorded setting's replay (the baseline every figure is against).
    pub recorded: Outcome,
    /// Every candidate tried, best first (the recorded one among them).
    pub candidates: Vec<Outcome>,
    /// Settings replayed (one that behaves as another takes its replay:
    /// `twin_of`).
    pub replays: usize,
    /// Whether the recorded row is the run's own exact replay (else the
    /// recorded setting replayed on the simulated device, as every other).
    pub recorded_is_the_run: bool,
}

impl Search {
    /// The best candidate; the recorded setting when nothing beats it.
    pub fn best(&self) -> &Outcome {
        self.candidates.first().unwrap_or(&self.recorded)
    }
}

/// Searches the settings for `reqs` (a run's requests, from its start or a
/// window's rebuilt start), recorded under `recorded`, on a device of
/// `device_total` bytes less `context`, under `limit` if any. `exact`: the
/// exact replay's statistics, which stand for the recorded setting (they
/// are PyTorch's own; a what-if's synthesised addresses can split blocks
/// otherwise and move the allocated peak by a few MiB).
pub(crate) fn search<R: Requests + ?Sized>(
    reqs: &R,
    recorded: &str,
    device_total: u64,
    context: u64,
    limit: Option<u64>,
    exact: Option<&crate::alloc::DeviceStats>,
) -> Search {
    let ask = Ask { recorded: recorded.to_string(), device_total, context, limit };
    search_from(reqs, &ask, exact, None)
}

/// What a search is for: the setting the run recorded, the device (its
/// bytes, less `context`) and the limit every candidate runs under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ask {
    pub(crate) recorded: String,
    pub(crate) device_total: u64,
    pub(crate) context: u64,
    pub(crate) limit: Option<u64>,
}

impl Ask {
    /// The search for a run recorded under the setting `recorded`, on a
    /// device of `device_total` bytes less CUDA's context, under `limit`.
    pub(crate) fn of_run(recorded: &str, device_total: u64, limit: Option<u64>) -> Ask {
        Ask { recorded: recorded.to_string(), device_total, context: crate::device::CUDA_CONTEXT_BYTES, limit }
    }
}

/// The search's first stage: the recorded setting, and each searched key's
/// values alone (the recorded point first); the others as recorded.
struct StageOne {
    base: Point,
    others: Vec<(String, String)>,
    searched: Vec<usize>,
    points: Vec<Point>,
}

impl StageOne {
    fn of(ask: &Ask) -> StageOne {
        let limited = ask.limit.is_some();
        let (base, others) = recorded_point(&ask.recorded, limited);
        let searched: Vec<usize> = (0..TUNED.len()).filter(|&i| !others.iter().any(|(k, _)| k == TUNED[i])).collect();
        let mut points: Vec<Point> = vec![base];
        for &i in &searched {
            for v in values(TUNED[i], limited) {
                let mut p = base;
                p[i] = v;
                if !points.contains(&p) {
                    points.push(p);
                }
            }
        }
        StageOne { base, others, searched, points }
    }
}

/// Each point's outcome under `ask`, on every core (a setting that does not
/// parse has none); a point whose setting behaves as an earlier one's on
/// these requests (`rider_of`, where no request falls in the intervals
/// they act apart in) takes that one's replay.
fn run_points<R: Requests + ?Sized>(
    reqs: &R,
    ask: &Ask,
    others: &[(String, String)],
    points: &[Point],
) -> Vec<Option<Outcome>> {
    let twins_at = |hit: u16| -> Vec<Option<usize>> {
        (0..points.len()).map(|i| rider_of(&points[i], &points[..i], others, hit).map(|(j, _)| j)).collect()
    };
    let mut twins = twins_at(u16::MAX);
    // The requests' intervals are read (one pass) only where a point could
    // ride on them.
    if twins_at(0) != twins {
        twins = twins_at(hit_of(reqs.iter()));
    }
    let alone = points.iter().zip(&twins).filter(|(_, t)| t.is_none()).map(|(p, _)| p).collect();
    let mut ran = each(alone, |p| outcome_of(conf_of(p, others), ask, reqs.iter())).into_iter();
    let mut out: Vec<Option<Outcome>> = Vec::with_capacity(points.len());
    for (p, t) in points.iter().zip(twins) {
        let o = match t {
            Some(j) => out[j].as_ref().map(|o| o.renamed(conf_of(p, others))),
            None => ran.next().flatten(),
        };
        out.push(o);
    }
    out
}

/// `made` (an outcome for each of `points`, none where not made yet) with
/// those not made replayed now, on every core (a setting that does not
/// parse still has none).
fn made_or_run<R: Requests + ?Sized>(
    reqs: &R,
    ask: &Ask,
    others: &[(String, String)],
    points: &[Point],
    mut made: Vec<Option<Outcome>>,
) -> Vec<Option<Outcome>> {
    let missing: Vec<Point> = points.iter().zip(&made).filter(|(_, o)| o.is_none()).map(|(p, _)| *p).collect();
    let mut ran = run_points(reqs, ask, others, &missing).into_iter();
    made.iter_mut().filter(|o| o.is_none()).for_each(|o| *o = ran.next().flatten());
    made
}

/// The first of `among` whose setting behaves as `p`'s on every request
/// (`AllocatorConfig::acts_apart` nowhere: `roundup_power2_divisions:1`
/// rounds as the default does), so that its replay stands for `p`'s; none
/// where either setting does not parse.
fn twin_of(p: &Point, among: &[Point], others: &[(String, String)]) -> Option<usize> {
    // Every interval hit: only a setting that never acts apart rides.
    rider_of(p, among, others, u16::MAX).map(|(j, _)| j)
}

/// The intervals (`AllocatorConfig::rounding_bit`) some of `reqs` ask in.
pub(crate) fn hit_of(reqs: impl Iterator<Item = Request>) -> u16 {
    reqs.filter_map(|r| match r {
        Request::Alloc { size, .. } | Request::FailedAlloc { size, .. } => Some(size),
        _ => None,
    })
    .fold(0, |m, s| m | AllocatorConfig::rounding_bit(s))
}

/// The one of `among` whose replay stands for `p`'s as long as no request
/// falls in the intervals where their settings act apart (returned, with
/// its index; `AllocatorConfig::acts_apart`: `roundup_power2_divisions:1`
/// rounds as the default does everywhere, `max_split_size_mb:512` acts as
/// no limit where no segment could reach 512 MiB), none of them among
/// `hit`: the one apart only at the largest sizes.
fn rider_of(p: &Point, among: &[Point], others: &[(String, String)], hit: u16) -> Option<(usize, u16)> {
    let of = |p: &Point| AllocatorConfig::parse(&conf_of(p, others)).ok();
    let c = of(p)?;
    let apart = |q: &Point| of(q)?.acts_apart(&c).filter(|m| m & hit == 0);
    let found = among.iter().enumerate().filter_map(|(j, q)| Some((j, apart(q)?)));
    // The first of those whose lowest interval apart is highest.
    found.fold(None, |best: Option<(usize, u16)>, (j, m)| match best {
        Some((_, b)) if b.trailing_zeros() >= m.trailing_zeros() => best,
        _ => Some((j, m)),
    })
}

/// A what-if run of the setting `conf` under `ask`, on the simulated device
/// (none where the setting does not parse).
fn running<L: Live>(conf: &str, ask: &Ask) -> Option<Run<L>> {
    let c = AllocatorConfig::parse(conf).ok()?;
    Some(Run::new(c, Sim::new("simulated device", ask.device_total, ask.context), ask.limit))
}

/// The outcome of `reqs` under the setting `conf` (none where it does not
/// parse).
fn outcome_of(conf: String, ask: &Ask, reqs: impl Iterator<Item = Request>) -> Option<Outcome> {
    let w = running::<Keyed>(&conf, ask)?.through(reqs);
    Some(Outcome::of(conf, w.allocator.stats()))
}

/// The first stage's replays of some requests, made before it was known
/// whether they are the run's (`tune` runs them beside the run's own
/// replay, or behind the decoding): `search_from` takes them for the `ask`
/// they were made for. `outcomes`: each first-stage point's, where it was
/// made (none where its setting does not parse, or a replay that stood for
/// it did not to the end). `second`: points of the second stage guessed
/// before the first was done, with their outcomes.
#[cfg_attr(test, derive(Clone))]
pub(crate) struct FirstStage {
    ask: Ask,
    outcomes: Vec<Option<Outcome>>,
    second: Vec<(Point, Outcome)>,
}

impl FirstStage {
    pub(crate) fn run<R: Requests + ?Sized>(reqs: &R, ask: Ask) -> FirstStage {
        let one = StageOne::of(&ask);
        let outcomes = run_points(reqs, &ask, &one.others, &one.points);
        FirstStage { ask, outcomes, second: Vec::new() }
    }
}

/// The second stage's points, from the first stage's outcomes (`first`, in
/// the order of `one.points`) against the recorded setting's: per key, its
/// recorded value and the best two values that did not lose alone; every
/// combination of those the first stage did not try.
fn stage_two(one: &StageOne, first: &[Outcome], recorded: &Outcome) -> Vec<Point> {
    let base = one.base;
    let mut keep: Vec<Vec<&'static str>> = (0..TUNED.len()).map(|i| vec![base[i]]).collect();
    for &i in &one.searched {
        let mut alone: Vec<(&Outcome, &'static str)> = one
            .points
            .iter()
            .zip(first)
            .filter(|(p, _)| p[i] != base[i] && (0..TUNED.len()).all(|j| j == i || p[j] == base[j]))
            .map(|(p, o)| (o, p[i]))
            .filter(|(o, _)| !recorded.beats(o))
            .collect();
        alone.sort_by_key(|a| a.0.key());
        keep[i].extend(alone.iter().take(2).map(|(_, v)| *v));
    }
    let mut stage2: Vec<Point> = Vec::new();
    let seen: HashSet<Point> = one.points.iter().copied().collect();
    for a in &keep[0] {
        for b in &keep[1] {
            for c in &keep[2] {
                for d in &keep[3] {
                    let p = [*a, *b, *c, *d];
                    if !seen.contains(&p) && !stage2.contains(&p) {
                        stage2.push(p);
                    }
                }
            }
        }
    }
    stage2
}

/// `search`, for `ask`, with the first stage's replays (and any second
/// stage's guessed) taken from `early` where they were made for the same
/// `ask` (and for `reqs`: the caller's word).
fn search_from<R: Requests + ?Sized>(
    reqs: &R,
    ask: &Ask,
    exact: Option<&crate::alloc::DeviceStats>,
    early: Option<FirstStage>,
) -> Search {
    let one = StageOne::of(ask);
    let (base, others, stage1) = (one.base, &one.others, &one.points);
    let (mut made, guessed) = match early.filter(|e| e.ask == *ask && e.outcomes.len() == stage1.len()) {
        Some(e) => (e.outcomes, e.second),
        None => (vec![None; stage1.len()], Vec::new()),
    };
    // The exact replay stands for the recorded point (first) where there
    // is one: its own replay is then not needed.
    if let (Some(st), Some(f)) = (exact, made.first_mut()) {
        *f = Some(Outcome::of(conf_of(&base, others), st));
    }
    let first: Vec<Outcome> = made_or_run(reqs, ask, others, stage1, made).into_iter().flatten().collect();
    let recorded_outcome = first.first().cloned().unwrap_or_else(|| Outcome {
        alloc_conf: ask.recorded.clone(),
        reserved_peak_bytes: 0,
        allocated_peak_bytes: 0,
        num_alloc_retries: 0,
        num_ooms: 0,
        num_device_alloc: 0,
        peak_ratio: 0.0,
    });
    let stage2 = stage_two(&one, &first, &recorded_outcome);
    // The points guessed right are taken, and those whose setting behaves
    // as a first-stage one's take its replay; the others run now.
    let twin = |p: &Point| {
        // Not the recorded setting's, whose figures may be the exact
        // replay's (no point of the second stage behaves as it anyway).
        let j = twin_of(p, stage1, others).filter(|&j| j > 0 && first.len() == stage1.len())?;
        Some(first[j].renamed(conf_of(p, others)))
    };
    let made = stage2.iter().map(|p| guessed.iter().find(|(q, _)| q == p).map(|(_, o)| o.clone()).or_else(|| twin(p)));
    let second = made_or_run(reqs, ask, others, &stage2, made.collect());
    let mut candidates: Vec<Outcome> = first.into_iter().chain(second.into_iter().flatten()).collect();
    let replays = candidates.len();
    candidates.sort_by_key(Outcome::key);
    // Settings that give the same figures as a shorter one before them add
    // a key that does nothing for this run: only the shortest is shown
    // (the recorded setting always is).
    let mut shown: Vec<Outcome> = Vec::new();
    for c in candidates {
        let same = |o: &Outcome| o.figures() == c.figures() && o.allocated_peak_bytes == c.allocated_peak_bytes;
        if c.alloc_conf == recorded_outcome.alloc_conf || !shown.iter().any(same) {
            shown.push(c);
        }
    }
    Search { recorded: recorded_outcome, candidates: shown, replays, recorded_is_the_run: exact.is_some() }
}

/// Why `o` ranks where it does against `recorded`, in a sentence the user
/// can check against the figures.
pub fn why(o: &Outcome, recorded: &Outcome, limit: Option<u64>) -> String {
    use crate::analysis::human_bytes;
    let mut parts = Vec::new();
    if o.num_ooms < recorded.num_ooms {
        let under = limit.map(|l| format!(" under the {} limit", human_bytes(l))).unwrap_or_default();
        let plural = if recorded.num_ooms == 1 { "" } else { "s" };
        parts.push(if o.num_ooms == 0 {
            format!("it avoids the {} OOM{plural} the recorded setting hits{under}", recorded.num_ooms)
        } else {
            format!("it hits {} of the {} OOM{plural} the recorded setting hits{under}", o.num_ooms, recorded.num_ooms)
        });
    }
    if o.num_alloc_retries < recorded.num_alloc_retries {
        parts.push(format!(
            "{} allocation retr{} fewer (each one synchronizes the device and frees the cache)",
            recorded.num_alloc_retries - o.num_alloc_retries,
            if recorded.num_alloc_retries - o.num_alloc_retries == 1 { "y" } else { "ies" }
        ));
    }
    let (r0, r1) = (recorded.reserved_peak_bytes, o.reserved_peak_bytes);
    if r1 < r0 {
        parts.push(format!(
            "peak reserved falls from {} to {} ({:.1}% less): reserved memory that never held tensors at the peaks goes from {:.1}% to {:.1}% (1 − peak allocated / peak reserved){}",
            human_bytes(r0),
            human_bytes(r1),
            100.0 * (r0 - r1) as f64 / r0.max(1) as f64,
            100.0 * recorded.peak_ratio,
            100.0 * o.peak_ratio,
            rounding(o, recorded)
        ));
    } else if r1 > r0 {
        parts.push(format!("peak reserved rises from {} to {}", human_bytes(r0), human_bytes(r1)));
    }
    if parts.is_empty() {
        if o.alloc_conf == recorded.alloc_conf {
            return "the recorded setting: no other setting tried does better on this run".into();
        }
        return "the same figures as the recorded setting".into();
    }
    parts.join("; ")
}

/// What rounding costs, when the peak allocated bytes moved (rounding more
/// finely, or less, changes them).
fn rounding(o: &Outcome, recorded: &Outcome) -> String {
    use crate::analysis::human_bytes;
    let (a0, a1) = (recorded.allocated_peak_bytes, o.allocated_peak_bytes);
    if a1 > a0 {
        format!(
            ", though peak allocated rises by {} (requests rounded up further before they are served)",
            human_bytes(a1 - a0)
        )
    } else if a1 < a0 {
        format!(", and peak allocated is {} lower (requests rounded and split differently)", human_bytes(a0 - a1))
    } else {
        String::new()
    }
}

/// `search` over a session's requests: its exact replay's statistics stand
/// for the recorded setting; a window's others start from the blocks live
/// at its first event. `early`: the first stage, made beside the session.
pub(crate) fn search_session(session: &mut crate::replay::session::Session, ask: &Ask, early: Option<Early>) -> Search {
    let reqs = requests_of(session);
    // The recorded row is the run's own replay only where that replay is
    // exact from process start and the run fits the device or limit asked
    // about; else (requests without segment events, a smaller device) the
    // recorded setting is replayed as every other is.
    let cap = ask.limit.unwrap_or(ask.device_total.saturating_sub(ask.context));
    // A window's exact replay too: its figures are PyTorch's own over the
    // window (docs/user/tune.md), which the recorded row must state.
    let exact = (session.fidelity.is_faithful() && session.start != Start::StateOnly)
        .then(|| session.exact.allocator.stats().clone())
        .filter(|st| st.get(crate::alloc::Kind::ReservedBytes, 0).peak.max(0) as u64 <= cap);
    let early = early
        .filter(|e| e.start == session.start && e.seed == session.seed && reqs.empty_cache_at.is_empty())
        .map(|e| e.first);
    search_from(&reqs, ask, exact.as_ref(), early)
}

/// The requests from where a replay starts: a window's blocks live at its
/// first event allocated first (`seed`, in its order), their addresses the
/// keys its frees name.
fn prefix_of(start: Start, seed: &[SeedSegment]) -> Vec<Request> {
    let mut prefix = Vec::new();
    if start == Start::Window {
        for seg in seed {
            for b in &seg.blocks {
                prefix.push(Request::Alloc { key: b.address, size: b.requested, stream: seg.stream });
                if b.pending {
                    prefix.push(Request::FreeRequested { key: b.address });
                }
            }
        }
    }
    prefix
}

/// The requests of a session, from its start, made from its events as
/// each candidate reads them.
fn requests_of<'s>(session: &'s crate::replay::session::Session<'_>) -> FromEvents<'s> {
    let prefix = prefix_of(session.start, &session.seed);
    FromEvents { prefix, events: session.dev.events.view(), empty_cache_at: session.empty_cache_at() }
}

/// One line for a status bar: what the search found, against the run's own
/// setting.
pub(crate) fn verdict(s: &Search) -> String {
    use crate::analysis::human_bytes;
    let best = s.best();
    if best.alloc_conf != s.recorded.alloc_conf && best.beats(&s.recorded) {
        format!(
            "tuned: PYTORCH_CUDA_ALLOC_CONF={} (peak reserved {} → {}, retries {} → {}, OOMs {} → {}; {} replays of its snapshot)",
            if best.alloc_conf.is_empty() { "\"\"" } else { &best.alloc_conf },
            human_bytes(s.recorded.reserved_peak_bytes),
            human_bytes(best.reserved_peak_bytes),
            s.recorded.num_alloc_retries,
            best.num_alloc_retries,
            s.recorded.num_ooms,
            best.num_ooms,
            s.replays
        )
    } else {
        format!("tuned: no setting does better than its own ({} replays of its snapshot)", s.replays)
    }
}

/// What to do about a run's OOMs, checked by replaying it under every
/// setting (`s`): the best setting that avoids them all, or that none does
/// and by how much the first failed request overshot (`overshoot`: the
/// allocated bytes then plus the request, less the limit). None when the
/// recorded setting has no OOM.
pub(crate) fn oom_advice(s: &Search, overshoot: Option<u64>) -> Option<String> {
    use crate::analysis::human_bytes;
    if s.recorded.num_ooms == 0 {
        return None;
    }
    let fixed = s.candidates.iter().find(|c| c.num_ooms == 0);
    Some(match fixed {
        Some(c) => format!(
            "PYTORCH_CUDA_ALLOC_CONF={} avoids {} (peak reserved {}; checked by replaying this run under {} settings: gpumem-top tune)",
            if c.alloc_conf.is_empty() { "\"\"" } else { &c.alloc_conf },
            if s.recorded.num_ooms == 1 { "it".to_string() } else { format!("all {}", s.recorded.num_ooms) },
            human_bytes(c.reserved_peak_bytes),
            s.replays
        ),
        None => format!(
            "no allocator setting avoids it (replayed under {} settings){}: the peaks themselves do not fit; a smaller batch, activation checkpointing or mixed precision lowers them",
            s.replays,
            overshoot.map(|b| format!("; the request overshot the limit by {}", human_bytes(b))).unwrap_or_default()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_split_at_top_level_commas() {
        assert_eq!(
            pairs("expandable_segments:True,roundup_power2_divisions:[256:1,512:2,>:8],max_split_size_mb:128"),
            vec![
                ("expandable_segments".to_string(), "True".to_string()),
                ("roundup_power2_divisions".to_string(), "[256:1,512:2,>:8]".to_string()),
                ("max_split_size_mb".to_string(), "128".to_string()),
            ]
        );
        let (p, others) = recorded_point("pinned_use_background_threads:True,max_split_size_mb:256", false);
        assert_eq!(p, ["", "256", "", ""]);
        assert_eq!(
            conf_of(&["True", "", "4", ""], &others),
            "expandable_segments:True,roundup_power2_divisions:4,pinned_use_background_threads:True"
        );
    }

    /// The first stage made beside the session gives the search the
    /// session would make alone, and is taken only where the session
    /// started where it guessed and the same is asked: a window and a run
    /// from process start.
    #[test]
    fn the_first_stage_made_beside_the_session_is_kept_only_where_it_agrees() {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        for (name, start) in [
            ("snapshot_kinds/wrapped_steady_resnet50.pickle.gz", Start::Window),
            ("traces/resnet50_train.pickle.gz", Start::ProcessStart),
        ] {
            let t = crate::trace::load(&root.join(name)).unwrap();
            let mut opened = crate::replay::open(&t, name, &crate::replay::OpenOptions::default()).unwrap();
            assert_eq!(opened.session.start, start, "{name}");
            let ask = Ask::of_run(&opened.want.config.source, opened.want.device_total, None);
            let (dev, config) = (opened.dev, opened.want.config.clone());
            let early = || Early::run(dev, ask.clone(), &config, true).unwrap();
            let plain = search_session(&mut opened.session, &ask, None);
            assert!(plain.replays > 10, "{name}: {}", plain.replays);
            assert_eq!(search_session(&mut opened.session, &ask, Some(early())), plain, "{name}");
            // Its replays are the ones taken: a figure changed in one shows.
            let changed = || {
                let mut e = early();
                if let Some(o) = e.first.outcomes[1].as_mut() {
                    o.reserved_peak_bytes += 1 << 20;
                }
                e
            };
            assert_ne!(search_session(&mut opened.session, &ask, Some(changed())), plain, "{name}");
            // Guessed from another start, or made for another ask: not taken.
            let mut other = changed();
            match start {
                Start::Window => other.seed.truncate(other.seed.len() - 1),
                _ => other.start = Start::Window,
            }
            assert_eq!(search_session(&mut opened.session, &ask, Some(other)), plain, "{name}");
            let limited = Ask { limit: Some(plain.recorded.reserved_peak_bytes * 2), ..ask.clone() };
            let alone = search_session(&mut opened.session, &limited, None);
            assert_eq!(search_session(&mut opened.session, &limited, Some(changed())), alone, "{name}");
        }
    }

    /// A setting that behaves as an earlier one's takes its replay, and the
    /// figures are the ones its own replay gives: on a real run, every point
    /// of both stages.
    #[test]
    fn twins_take_replays_equal_to_their_own() {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/traces");
        let t = crate::trace::load(&root.join("resnet50_train.pickle.gz")).unwrap();
        let dev = t.main_device().unwrap();
        let reqs = FromEvents { prefix: Vec::new(), events: dev.events.view(), empty_cache_at: &[] };
        let ask = Ask::of_run("", 150 << 30, None);
        let one = StageOne::of(&ask);
        let first: Vec<Outcome> = run_points(&reqs, &ask, &[], &one.points).into_iter().flatten().collect();
        // With combinations where roundup_power2_divisions:1 (the default,
        // alone and combined) meets other keys.
        let ones = [["True", "", "1", ""], ["", "64", "1", ""], ["True", "64", "", ""], ["True", "64", "1", ""]];
        let points: Vec<Point> =
            one.points.iter().copied().chain(stage_two(&one, &first, &first[0])).chain(ones).collect();
        let twins = (0..points.len()).filter(|&i| twin_of(&points[i], &points[..i], &[]).is_some()).count();
        assert_eq!(twins, 4, "{points:?}");
        // And those that act apart only where none of these requests ask
        // (up to 512 MiB): the 1 GiB split limit, alone and with divisions,
        // and the rounding that differs only from 512 MiB; their figures
        // too are their own replays' (below).
        let hit = hit_of(reqs.iter());
        let rides = |i: usize| rider_of(&points[i], &points[..i], &[], hit).is_some();
        let riders: Vec<Point> = (0..points.len()).filter(|&i| rides(i)).map(|i| points[i]).collect();
        assert_eq!((hit, riders.len()), (0x1ff, 9), "{riders:?}");
        for p in [["", "1024", "", ""], ["", "1024", "8", ""], ["", "", "[256:4,1024:8,>:16]", ""]] {
            assert!(riders.contains(&p), "{p:?}");
        }
        let alone: Vec<Option<Outcome>> =
            points.iter().map(|p| outcome_of(conf_of(p, &[]), &ask, reqs.iter())).collect();
        assert_eq!(run_points(&reqs, &ask, &[], &points), alone);
    }

    #[test]
    fn settings_act_apart_where_their_rounding_or_split_limits_differ() {
        let c = |s: &str| AllocatorConfig::parse(s).unwrap();
        let apart = |a: &str, b: &str| c(a).acts_apart(&c(b));
        // Alike everywhere: divisions of 1 round as none do.
        assert_eq!(apart("", "roundup_power2_divisions:1"), Some(0));
        assert_eq!(
            apart(
                "max_split_size_mb:64,roundup_power2_divisions:[256:1,>:1]",
                "roundup_power2_divisions:1,max_split_size_mb:64"
            ),
            Some(0)
        );
        assert_eq!(apart("roundup_power2_divisions:4", "roundup_power2_divisions:[>:4]"), Some(0));
        // Apart at every size, or from 512 MiB (the intervals [512 MiB, 1
        // GiB) and up: bits 9 to 15).
        assert_eq!(apart("", "roundup_power2_divisions:2"), Some(u16::MAX));
        assert_eq!(apart("", "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]"), Some(0xfe00));
        assert_eq!(apart("roundup_power2_divisions:4", "roundup_power2_divisions:[256:4,1024:8,>:16]"), Some(0xfe00));
        // Split limits: apart where a request could make a segment as
        // large as the smaller limit (intervals from [512 MiB, 1 GiB) for
        // 1 GiB, from [128, 256) for 256 MiB; every one where the 20 MiB
        // segments of small requests reach it), with rounding or not.
        assert_eq!(apart("", "max_split_size_mb:1024"), Some(0xfe00));
        assert_eq!(apart("max_split_size_mb:256", "max_split_size_mb:1024"), Some(0xff80));
        assert_eq!(
            apart("max_split_size_mb:1024", "max_split_size_mb:1024,roundup_power2_divisions:2"),
            Some(u16::MAX)
        );
        assert_eq!(apart("max_split_size_mb:20", ""), Some(u16::MAX));
        assert_eq!(apart("max_split_size_mb:64", "large_segment_size_mb:64"), None);
        assert_eq!(apart("max_split_size_mb:64,large_segment_size_mb:64", "large_segment_size_mb:64"), Some(u16::MAX));
        assert_eq!(apart("max_split_size_mb:64,large_segment_size_mb:32", "large_segment_size_mb:32"), Some(0xffe0));
        // Other keys apart, or split limits under expandable segments
        // (which grow past any request): never alike.
        assert_eq!(apart("roundup_power2_divisions:1", "expandable_segments:True"), None);
        assert_eq!(apart("expandable_segments:True", "expandable_segments:True,max_split_size_mb:1024"), None);
        assert_eq!(apart("max_split_size_mb:1024", "max_split_size_mb:1024,garbage_collection_threshold:0.5"), None);
        // The bit a size is rounded by.
        let bit = AllocatorConfig::rounding_bit;
        assert_eq!(
            (bit(1), bit((1 << 20) - 1), bit(3 << 20), bit(600 << 20), bit(1 << 50)),
            (1, 1, 2, 1 << 9, 1 << 15)
        );
    }

    fn outcome(conf: &str, ooms: u64, reserved: u64) -> Outcome {
        Outcome {
            alloc_conf: conf.into(),
            reserved_peak_bytes: reserved,
            allocated_peak_bytes: reserved / 2,
            num_alloc_retries: 0,
            num_ooms: ooms,
            num_device_alloc: 3,
            peak_ratio: 0.5,
        }
    }

    /// OOM advice names the best setting without an OOM, or says none
    /// avoids it and by how much the request overshot; nothing without one.
    #[test]
    fn oom_advice_names_a_checked_setting_or_says_none_does() {
        let rec = outcome("", 1, 8 << 30);
        let s = Search {
            recorded: rec.clone(),
            candidates: vec![outcome("expandable_segments:True", 0, 7 << 30), rec.clone()],
            replays: 9,
            recorded_is_the_run: true,
        };
        assert_eq!(
            oom_advice(&s, None).unwrap(),
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True avoids it (peak reserved 7.00 GiB; checked by replaying this run under 9 settings: gpumem-top tune)"
        );
        let s = Search {
            recorded: rec.clone(),
            candidates: vec![outcome("max_split_size_mb:64", 1, 7 << 30), rec],
            replays: 9,
            recorded_is_the_run: true,
        };
        assert_eq!(
            oom_advice(&s, Some(96 << 20)).unwrap(),
            "no allocator setting avoids it (replayed under 9 settings); the request overshot the limit by 96.00 MiB: the peaks themselves do not fit; a smaller batch, activation checkpointing or mixed precision lowers them"
        );
        let ok = outcome("", 0, 1 << 30);
        assert!(oom_advice(
            &Search { recorded: ok.clone(), candidates: vec![ok], replays: 1, recorded_is_the_run: true },
            None
        )
        .is_none());
    }
}
