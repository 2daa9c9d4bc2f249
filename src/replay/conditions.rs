//! The conditions a run had that its snapshot does not state: a per-process
//! memory limit (`set_per_process_memory_fraction`) and allocator settings
//! changed mid-run (`torch.cuda.memory._set_allocator_settings`), found by
//! replaying under candidates until one reproduces the trace
//! (docs/user/replay.md, "Conditions").
//!
//! A limit leaves three marks: a retry (a release before a cudaMalloc that
//! then fits), a `garbage_collection_threshold` release, and an OOM with the
//! device's memory free (`process_limit`). Too low a limit makes us release or
//! fail where the run did not; too high one, the reverse. So the limits under
//! which the replay is exact form a range, found by bisection, and bounded by
//! the recorded peak reserved below (the allocator never holds more than its
//! limit) and by each `process_limit` OOM above.
//!
//! A change of settings leaves the trace explained by the earlier settings up
//! to some event and by the final ones (the snapshot's) after it. The earlier
//! settings are not in the file (`_set_allocator_settings` resets every key it
//! does not name), so common ones are tried, and the one that explains the
//! longest prefix is taken.

use std::cell::Cell;

use super::{Pressure, ReplayOptions, ReplayResult};
use crate::alloc::{Action, AllocatorConfig, Event, EventsRef, SeedSegment};

/// A per-process limit the replay found the run had.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct LimitFound {
    /// The replay is exact under any limit from `lo_bytes` to `hi_bytes`
    /// (both replayed; to 2 MiB, the grain of the allocator's requests).
    pub(crate) lo_bytes: u64,
    pub(crate) hi_bytes: u64,
    /// The one replayed under: the roundest in the range.
    pub(crate) used_bytes: u64,
    /// What in the trace says a limit was in force.
    pub(crate) evidence: String,
}

/// Settings changed during the run, as found.
#[derive(Debug, Clone)]
pub(crate) struct SwitchFound {
    pub(crate) event: usize,
    pub(crate) earliest: usize,
    pub(crate) before: AllocatorConfig,
}

/// What the search found: replay under `opts` (its limit, config and switch
/// set) to reproduce the run.
pub(crate) struct Found {
    pub(crate) limit: Option<LimitFound>,
    pub(crate) switch: Option<SwitchFound>,
    pub(crate) opts: ReplayOptions,
}

/// How far a replay got, as the search compares them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reach {
    pub(crate) reached: usize,
    pub(crate) exact: bool,
    pub(crate) inferred: usize,
    pub(crate) pressure: Pressure,
}

impl Reach {
    pub(crate) fn of(r: &ReplayResult<'_>) -> Reach {
        Reach {
            reached: r.reproduced,
            exact: r.divergence.is_none(),
            inferred: r.inferred_empty_cache,
            pressure: r.pressure,
        }
    }

    /// The same outcome, for the purpose of a limit's range.
    fn same(&self, o: &Reach) -> bool {
        self.reached == o.reached
            && self.exact == o.exact
            && self.inferred == o.inferred
            && o.pressure != Pressure::Ours
    }
}

/// The allocator's requests come in 2 MiB steps (docs/design/pytorch-allocator.md):
/// limits closer than that are not told apart.
const GRAIN: u64 = 2 << 20;

/// Replays of the trace allowed to one search, in events (a search on a huge
/// trace stops and says so rather than run for minutes).
const BUDGET_EVENTS: u64 = 400_000_000;

/// What the recorded segment events say of the allocator's reserved bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Recorded {
    /// The most it held: a lower bound of any limit.
    pub(crate) peak_reserved: u64,
    /// Below the least of reserved + the cudaMalloc a `process_limit` OOM
    /// attempted: the limit refused it.
    pub(crate) oom_bound: Option<u64>,
    pub(crate) process_limit_ooms: usize,
}

impl Recorded {
    pub(crate) fn of(rec: EventsRef<'_>, start_reserved: u64, conf: &AllocatorConfig) -> Recorded {
        let mut reserved = start_reserved;
        let mut out = Recorded { peak_reserved: reserved, oom_bound: None, process_limit_ooms: 0 };
        for e in rec {
            match e.action {
                Action::SegmentAlloc | Action::SegmentMap => {
                    reserved = reserved.saturating_add(e.size);
                    out.peak_reserved = out.peak_reserved.max(reserved);
                }
                Action::SegmentFree | Action::SegmentUnmap => reserved = reserved.saturating_sub(e.size),
                // The device had room: a per-process limit refused it
                // (`addr` is the device's free memory).
                Action::Oom if e.addr >= e.size => {
                    // Expandable segments map only what is missing, at most
                    // the request in 2 MiB pages: an upper bound is safe.
                    let attempt = if conf.expandable_segments {
                        e.size.div_ceil(GRAIN).saturating_mul(GRAIN)
                    } else {
                        conf.allocation_size(conf.round_size(e.size))
                    };
                    let bound = reserved.saturating_add(attempt);
                    out.oom_bound = Some(out.oom_bound.map_or(bound, |b| b.min(bound)));
                    out.process_limit_ooms += 1;
                }
                _ => {}
            }
        }
        out
    }
}

/// A replay under other options; None where it cannot start.
type Run<'r, 'a> = &'r dyn Fn(&ReplayOptions) -> Option<(Vec<SeedSegment>, ReplayResult<'a>)>;

/// A search over replays of one trace.
pub(crate) struct Search<'r, 'a> {
    run: Run<'r, 'a>,
    events: u64,
    spent: Cell<u64>,
    device_total: u64,
}

impl<'r, 'a> Search<'r, 'a> {
    pub(crate) fn new(run: Run<'r, 'a>, events: usize, device_total: u64) -> Self {
        Search { run, events: events.max(1) as u64, spent: Cell::new(0), device_total }
    }

    /// Whether the budget allows another replay.
    fn can(&self) -> bool {
        self.spent.get() < 4 || self.spent.get().saturating_mul(self.events) < BUDGET_EVENTS
    }

    /// Whether the search stopped for its budget.
    pub(crate) fn ran_out(&self) -> bool {
        !self.can()
    }

    /// One replay under `o`, as far as the budget allows.
    pub(crate) fn eval(&self, o: &ReplayOptions) -> Option<Reach> {
        if !self.can() {
            return None;
        }
        self.spent.set(self.spent.get() + 1);
        (self.run)(o).map(|(_, r)| Reach::of(&r))
    }

    fn under(o: &ReplayOptions, limit: u64) -> ReplayOptions {
        let mut o = o.clone();
        o.memory_limit = Some(limit);
        o
    }

    /// The range of limits under which `o` (its limit ignored) reproduces
    /// the trace better than `base` (the replay without one), given what the
    /// recorded events say; `None` where no limit does.
    pub(crate) fn limit(&self, o: &ReplayOptions, base: &Reach, rec: &Recorded) -> Option<(LimitFound, Reach)> {
        let lo0 = rec.peak_reserved.max(GRAIN);
        let hi0 = rec.oom_bound.map_or(self.device_total, |b| b.saturating_sub(1)).min(self.device_total);
        if hi0 < lo0 {
            return None;
        }
        let eval = |l: u64| self.eval(&Self::under(o, l));
        // The least limit under which we do not release or fail early.
        let mut at_lo = eval(lo0)?;
        let mut lo = lo0;
        if at_lo.pressure == Pressure::Ours {
            let at_hi = eval(hi0)?;
            if at_hi.pressure == Pressure::Ours {
                return None;
            }
            let (mut a, mut b, mut rb) = (lo0, hi0, at_hi);
            while b - a > GRAIN {
                let mid = a + (b - a) / 2;
                let r = eval(mid)?;
                if r.pressure == Pressure::Ours {
                    a = mid;
                } else {
                    (b, rb) = (mid, r);
                }
            }
            (lo, at_lo) = (b, rb);
        }
        let evidence = self.evidence(base, &at_lo, rec)?;
        // The greatest limit with the same outcome.
        let hi = match eval(hi0)? {
            r if at_lo.same(&r) => hi0,
            _ => {
                let (mut a, mut b) = (lo, hi0);
                while b - a > GRAIN {
                    let mid = a + (b - a) / 2;
                    if at_lo.same(&eval(mid)?) {
                        a = mid;
                    } else {
                        b = mid;
                    }
                }
                a
            }
        };
        let pick = roundest(lo, hi, self.device_total);
        let used = if pick == lo || eval(pick).is_some_and(|r| at_lo.same(&r)) { pick } else { lo };
        Some((LimitFound { lo_bytes: lo, hi_bytes: hi, used_bytes: used, evidence }, at_lo))
    }

    /// What says the run had a limit, where `with` (under one) does better
    /// than `base` (without), or a `process_limit` OOM bounds it.
    fn evidence(&self, base: &Reach, with: &Reach, rec: &Recorded) -> Option<String> {
        if with.pressure == Pressure::Ours {
            return None;
        }
        if with.reached > base.reached {
            return Some(format!(
                "without a limit the replay parts from the run at event {}, under one it {}",
                base.reached,
                if with.exact { "is exact".to_string() } else { format!("reaches event {}", with.reached) }
            ));
        }
        if with.exact && base.exact && with.inferred < base.inferred {
            return Some(format!(
                "{} of the run's releases are retries or garbage collection under a limit, not empty_cache() calls",
                base.inferred - with.inferred
            ));
        }
        if with.exact && rec.process_limit_ooms > 0 {
            return Some(format!(
                "{} OOM{} with the device's memory free (cause process_limit)",
                rec.process_limit_ooms,
                if rec.process_limit_ooms == 1 { "" } else { "s" }
            ));
        }
        None
    }

    /// The settings before a change, and where it came: each of `befores`
    /// is replayed until it parts from the trace; the furthest is switched
    /// to the final settings there, or at an earlier request the two
    /// settings serve differently (its block is already another size when
    /// the difference shows), under a limit where the trace needs one, and
    /// kept if the whole trace then reproduces. `kinds`: the events at which
    /// a change of segment kind (expandable or not) may have come.
    pub(crate) fn switch(
        &self,
        rec: EventsRef<'_>,
        o: &ReplayOptions,
        befores: &[AllocatorConfig],
        kinds: &[usize],
        recd: &Recorded,
    ) -> Option<(Option<LimitFound>, SwitchFound, Reach)> {
        let mut ranked = Vec::new();
        for b in befores {
            let mut ob = o.clone();
            ob.config = b.clone();
            ob.switch = None;
            ob.memory_limit = None;
            let mut r = self.eval(&ob)?;
            let mut limit = None;
            if (!r.exact && r.pressure == Pressure::Recorded) || (r.exact && r.inferred > 0) {
                if let Some((l, rl)) = self.limit(&ob, &r, recd) {
                    ob.memory_limit = Some(l.used_bytes);
                    (limit, r) = (Some(l), rl);
                }
            }
            if r.reached > 0 {
                ranked.push((r, ob, limit));
            }
        }
        ranked.sort_by_key(|(r, _, _)| std::cmp::Reverse(r.reached));
        for (r, ob, limit) in ranked.into_iter().take(3) {
            // Where the change may have come, latest first.
            let at = r.reached;
            let mut at_list = vec![at];
            if ob.config.expandable_segments != o.config.expandable_segments {
                at_list.extend(kinds.iter().copied().filter(|&k| k < at));
                // Past the last segment of the earlier kind, the final
                // settings could have served everything.
                let old = |e: Event| match ob.config.expandable_segments {
                    true => matches!(e.action, Action::SegmentMap | Action::SegmentUnmap),
                    false => e.action == Action::SegmentAlloc,
                };
                if let Some(last) = rec.slice(..at.min(rec.len())).iter().rposition(old) {
                    at_list.push(last + 1);
                }
                at_list.sort_unstable_by(|a, b| b.cmp(a));
                at_list.dedup();
            } else {
                let (b, f) = (&ob.config, &o.config);
                let split = b.max_split_size.min(f.max_split_size);
                let differs = |e: &Event| {
                    let (rb, rf) = (b.round_size(e.size), f.round_size(e.size));
                    rb != rf || b.allocation_size(rb) != f.allocation_size(rf) || rb >= split
                };
                at_list.extend(
                    rec.slice(..at.min(rec.len()))
                        .iter()
                        .enumerate()
                        .rev()
                        .filter(|(_, e)| e.action == Action::Alloc && differs(e))
                        .map(|(k, _)| k)
                        .take(MAX_SWITCH_TRIES),
                );
            }
            let mut limit = limit;
            let mut found: Option<(usize, Reach, ReplayOptions)> = None;
            let mut earliest = None;
            for &s in &at_list {
                let mut os = ob.clone();
                os.switch = Some((s, o.config.clone()));
                let Some(mut got) = self.eval(&os) else { break };
                if !got.exact && got.pressure == Pressure::Recorded && limit.is_none() {
                    if let Some((l, rl)) = self.limit(&os, &got, recd) {
                        if rl.exact {
                            os.memory_limit = Some(l.used_bytes);
                            (limit, got) = (Some(l), rl);
                        }
                    }
                }
                match (got.exact, &found) {
                    (true, None) => found = Some((s, got, os)),
                    (true, Some(_)) => {}
                    (false, Some(_)) => {
                        earliest = Some(s + 1);
                        break;
                    }
                    (false, None) => {}
                }
                if found.is_some() {
                    earliest = Some(s);
                }
            }
            if let Some((s, got, _)) = found {
                let switch =
                    SwitchFound { event: s, earliest: earliest.unwrap_or(s).min(s), before: ob.config.clone() };
                return Some((limit, switch, got));
            }
        }
        None
    }
}

/// Requests tried as the point of a change of settings, for each earlier
/// setting: enough for the few the settings serve differently between
/// the change and the event that shows it.
const MAX_SWITCH_TRIES: usize = 48;

/// The roundest limit from `lo` to `hi`: a whole number of GiB, of percent
/// of the device (`set_per_process_memory_fraction(0.4)`), then of ever
/// smaller powers of two.
pub(crate) fn roundest(lo: u64, hi: u64, total: u64) -> u64 {
    let multiple = |g: u64| Some(lo.div_ceil(g).saturating_mul(g)).filter(|v| *v <= hi);
    if let Some(v) = multiple(1 << 30) {
        return v;
    }
    if let Some(v) = (1..100u64).map(|p| (p as f64 / 100.0 * total as f64) as u64).find(|v| (lo..=hi).contains(v)) {
        return v;
    }
    (21..30).rev().find_map(|s| multiple(1 << s)).unwrap_or(lo)
}

/// The settings a run may have had before it changed them to `fin`: PyTorch's
/// defaults, then common values of each key and pairs of them, each with
/// `expandable_segments` as `es` says (the segment events tell it).
pub(crate) fn befores(fin: &AllocatorConfig, es: bool, release: crate::alloc::Release) -> Vec<AllocatorConfig> {
    let mut keys: Vec<String> = vec![String::new()];
    let splits = [16, 32, 64, 128, 256, 512, 1024];
    let rounds = [2, 4, 8, 16];
    keys.extend(splits.iter().map(|m| format!("max_split_size_mb:{m}")));
    keys.extend(rounds.iter().map(|d| format!("roundup_power2_divisions:{d}")));
    keys.extend([0.5, 0.6, 0.7, 0.8, 0.9].iter().map(|t| format!("garbage_collection_threshold:{t}")));
    for m in [64, 128, 256, 512] {
        keys.extend([2, 4, 8].iter().map(|d| format!("max_split_size_mb:{m},roundup_power2_divisions:{d}")));
    }
    let mut out: Vec<AllocatorConfig> = Vec::new();
    for k in keys {
        let s = match (es, k.is_empty()) {
            (true, true) => "expandable_segments:True".to_string(),
            (true, false) => format!("expandable_segments:True,{k}"),
            (false, _) => k,
        };
        let Ok(c) = AllocatorConfig::parse_for(&s, release) else { continue };
        if !same_effect(&c, fin) && !out.iter().any(|o| same_effect(o, &c)) {
            out.push(c);
        }
    }
    out
}

/// Whether two configs decide every allocation alike.
pub(crate) fn same_effect(a: &AllocatorConfig, b: &AllocatorConfig) -> bool {
    a.max_split_size == b.max_split_size
        && a.roundup_power2_divisions == b.roundup_power2_divisions
        && a.garbage_collection_threshold == b.garbage_collection_threshold
        && a.expandable_segments == b.expandable_segments
        && a.max_non_split_rounding_size == b.max_non_split_rounding_size
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_roundest_limit_is_whole_gib_then_percent_then_finer() {
        let total = 150_011_101_184u64;
        assert_eq!(roundest(5_232_394_240, 5_700_000_000, total), 5_368_709_120);
        assert_eq!(roundest(5_232_394_240, 5_400_000_000, total), 5_368_709_120);
        // 4% of an H200 is 6000444047 bytes.
        assert_eq!(roundest(5_950_000_000, 6_050_000_000, total), 6_000_444_047);
        assert_eq!(roundest(5_950_000_000, 5_990_000_000, total), 5_972_688_896);
        assert_eq!(roundest(100, 100, total), 100);
    }

    #[test]
    fn the_settings_before_a_change_exclude_the_final_ones() {
        let fin = AllocatorConfig::parse("max_split_size_mb:32,roundup_power2_divisions:4").unwrap();
        let b = befores(&fin, false, crate::alloc::Release::V2_11);
        assert_eq!(b[0].source, "");
        assert!(b.iter().all(|c| !same_effect(c, &fin) && !c.expandable_segments));
        assert!(b.iter().any(|c| c.source == "max_split_size_mb:256"));
        let es =
            befores(&AllocatorConfig::parse("expandable_segments:True").unwrap(), false, crate::alloc::Release::V2_11);
        assert_eq!(es[0].source, "");
    }
}
