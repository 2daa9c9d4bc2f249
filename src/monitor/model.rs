//! The live model: what the monitor keeps between samples (per-GPU and
//! per-process histories, the alerts of the latest sample). The TUI draws
//! it; `replay RECORDING --json` reports from it; neither owns it.

use std::collections::BTreeMap;

use super::alerts::{alerts, Alert, Thresholds};
use super::{Published, Snapshot};
use crate::timeline::{Sample, Series, DAY_AT_1HZ};

/// One publishing process's history.
pub struct ProcHistory {
    pub(crate) last: Published,
    /// Shared with the models a recording shows at each of its samples
    /// (`as_of` copies no series; a push copies one only while shared).
    pub series: std::sync::Arc<Series>,
    pub(crate) gone: bool,
    /// In the latest snapshot.
    pub(crate) fresh: bool,
    pub(crate) nvml_used: Option<u64>,
    /// The highest step number taken into the series.
    pub(crate) last_step: u64,
    /// Every step seen, oldest first (at most `MAX_STEPS`).
    pub(crate) steps: std::collections::VecDeque<StepPoint>,
    /// Samples it published in (the series also holds a point per step).
    pub(crate) samples: usize,
}

/// One optimizer step of a publishing process as the timeline shows it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct StepPoint {
    pub(crate) n: u64,
    pub(crate) t: f64,
    /// Its own peaks, when the process publishes them (`run --step-peaks`).
    pub(crate) peak_allocated: Option<u64>,
    pub(crate) peak_reserved: Option<u64>,
    pub(crate) allocated_end: u64,
}

/// Steps kept per process (under 1 MiB).
pub(crate) const MAX_STEPS: usize = 20_000;

impl ProcHistory {
    /// When its timeline peaks (samples and steps' own peaks alike): a
    /// recording's `p` and `export --at peak` go to the first sample at or
    /// after it (a step's own peak falls between samples).
    pub(crate) fn peak_time(&self) -> Option<f64> {
        let i = crate::analysis::peak_index(&self.series.state_points())?;
        self.series.points().get(i).map(|p| p.t)
    }

    /// Takes the steps `p` logged that are not in the series yet, each as a
    /// point at its end: its own peaks where published, else its end state.
    fn take_steps(&mut self, used: u64) {
        let p = &self.last;
        let since = self.last_step;
        for s in p.step_log.iter().filter(|s| s.n() > since) {
            // In time order with the samples: a step that ended while the
            // file was written can carry a time after the file's.
            let t = s.time().max(self.series.last_time().unwrap_or(f64::MIN)).min(p.time.max(s.time()));
            let (pa, pr) = if p.step_peaks { (s.peak_allocated(), s.peak_reserved()) } else { (None, None) };
            let allocated = pa.unwrap_or(s.allocated_end());
            let reserved = pr.or(s.reserved_end()).unwrap_or(0);
            std::sync::Arc::make_mut(&mut self.series).push_step(Sample { t, allocated, reserved, used });
            if self.steps.len() == MAX_STEPS {
                self.steps.pop_front();
            }
            self.steps.push_back(StepPoint {
                n: s.n(),
                t,
                peak_allocated: pa,
                peak_reserved: pr,
                allocated_end: s.allocated_end(),
            });
            self.last_step = s.n();
        }
    }
}

/// Process histories kept at most (gone ones are dropped first): every
/// rank of a 16-rank job on one node. Each series holds at most a day at
/// 1 Hz (2.6 MiB): with 8 GPUs' series the timelines stay under 70 MiB.
pub const MAX_HISTORIES: usize = 16;

/// GPUs given a series at most (a node has 8 or 16; a recording claiming
/// 400,000 indices gets no series past these: docs/user/input.md).
pub const MAX_GPU_SERIES: usize = 64;

/// Publishers of one sample taken in at most, those holding the most
/// reserved memory first: the histories keep `MAX_HISTORIES` anyway.
pub const MAX_PUBLISHERS_PER_SAMPLE: usize = 256;

/// Histories and alerts over the samples seen so far.
pub struct LiveModel {
    pub(crate) latest: Option<Snapshot>,
    pub(crate) gpu_series: BTreeMap<u32, std::sync::Arc<Series>>,
    pub procs: BTreeMap<(u32, u32), ProcHistory>,
    pub alerts: Vec<Alert>,
    /// Each alert the first time it was raised (by kind, GPU and process),
    /// with the sample it came at: what a recording replayed would have
    /// shown (docs/user/live.md, "Alerts").
    pub(crate) raised: Vec<(usize, Alert)>,
    raised_keys: std::collections::BTreeSet<(super::alerts::AlertKind, u32, Option<u32>)>,
    samples: usize,
    pub(crate) thresholds: Thresholds,
    /// Why publisher files were ignored in the latest sample, if any.
    pub(crate) ignored: Option<String>,
    series_cap: usize,
}

impl Default for LiveModel {
    fn default() -> Self {
        LiveModel::new(Thresholds::default())
    }
}

impl LiveModel {
    /// The jobs among the model's histories: every rank seen, a gone one
    /// with its last state (docs/user/ranks.md). Here, not in `job`, so that
    /// `job` (which `alerts` reads) does not import the model that runs
    /// the alerts.
    pub fn jobs(&self) -> Vec<super::job::Job> {
        super::job::jobs_of(self.procs.values().filter_map(|h| {
            let j = h.last.job.as_ref()?;
            Some((j.job.clone(), j.world_size, super::job::RankRow::of(&h.last, h.nvml_used, h.gone)))
        }))
    }
    pub fn new(thresholds: Thresholds) -> Self {
        LiveModel {
            latest: None,
            gpu_series: BTreeMap::new(),
            procs: BTreeMap::new(),
            alerts: Vec::new(),
            raised: Vec::new(),
            raised_keys: Default::default(),
            samples: 0,
            thresholds,
            ignored: None,
            series_cap: DAY_AT_1HZ,
        }
    }

    pub fn ingest(&mut self, mut snap: Snapshot) {
        let t = snap.time;
        self.alerts = alerts(&snap, &self.thresholds);
        for a in &self.alerts {
            // An index of what was raised: as many processes as a recording
            // holds cost a lookup each, not a scan of every earlier alert.
            if self.raised_keys.insert((a.kind, a.gpu, a.pid)) {
                self.raised.push((self.samples, a.clone()));
            }
        }
        self.samples += 1;
        for g in &snap.gpus {
            let (a, r) = snap
                .publishers
                .iter()
                .filter(|p| p.device == g.index)
                .fold((0, 0), |(a, r), p| (a + p.allocated(), r + p.reserved()));
            let cap = self.series_cap;
            if !self.gpu_series.contains_key(&g.index) && self.gpu_series.len() >= MAX_GPU_SERIES {
                continue;
            }
            std::sync::Arc::make_mut(self.gpu_series.entry(g.index).or_insert_with(|| Series::new(cap).into()))
                .push(Sample { t, allocated: a, reserved: r, used: g.used_bytes.unwrap_or(0) });
        }
        for h in self.procs.values_mut() {
            h.fresh = false;
        }
        // Publishers move into their histories: their layouts are the
        // biggest thing a sample holds, kept once, not cloned.
        let mut publishers = std::mem::take(&mut snap.publishers);
        if publishers.len() > MAX_PUBLISHERS_PER_SAMPLE {
            publishers.sort_by_key(|p| std::cmp::Reverse(p.reserved()));
            publishers.truncate(MAX_PUBLISHERS_PER_SAMPLE);
        }
        for p in publishers {
            let nvml_used = snap.nvml_used_of(&p);
            // With step peaks on and no optimizer step yet, a sample is the
            // window since the previous one: its peaks.
            let (wa, wr) = p.window_peak.map_or((None, None), |w| (w.1, w.2));
            let sample = Sample {
                t: p.time,
                allocated: p.allocated().max(wa.unwrap_or(0)),
                reserved: p.reserved().max(wr.unwrap_or(0)),
                used: nvml_used.unwrap_or(0),
            };
            let (time, ooms) = (p.time, p.stats.get("num_ooms").copied().unwrap_or(0));
            let cap = self.series_cap;
            let h = match self.procs.entry((p.device, p.pid)) {
                std::collections::btree_map::Entry::Occupied(e) => {
                    let h = e.into_mut();
                    h.last = p;
                    h
                }
                std::collections::btree_map::Entry::Vacant(e) => e.insert(ProcHistory {
                    last: p,
                    series: Series::new(cap).into(),
                    gone: false,
                    fresh: true,
                    nvml_used,
                    last_step: 0,
                    steps: Default::default(),
                    samples: 0,
                }),
            };
            h.samples += 1;
            h.take_steps(nvml_used.unwrap_or(0));
            let series = std::sync::Arc::make_mut(&mut h.series);
            series.push(sample);
            series.note_ooms(time, ooms);
            h.gone = false;
            h.fresh = true;
            h.nvml_used = nvml_used;
        }
        let gone: std::collections::HashSet<u32> = snap.gone.iter().copied().collect();
        for ((_, p), h) in self.procs.iter_mut() {
            if gone.contains(p) {
                h.gone = true;
            }
        }
        // Past the cap, gone processes go first, then the lowest keys: in
        // one pass (one at a time was quadratic in the publishers).
        if self.procs.len() > MAX_HISTORIES {
            let mut order: Vec<(bool, (u32, u32))> = self.procs.iter().map(|(k, h)| (!h.gone, *k)).collect();
            order.sort_unstable();
            for (_, k) in order.into_iter().take(self.procs.len() - MAX_HISTORIES) {
                self.procs.remove(&k);
            }
        }
        self.ignored = snap.skipped.first().cloned();
        self.latest = Some(snap);
    }

    /// A recording as it stood at `snaps[at]`, for stepping back through it:
    /// `self` has taken in every one of `snaps`, and its histories stay
    /// whole (the timeline shows the recording, with a cursor at `at`).
    /// Processes that had not published by then are left out; the others
    /// show what they published at or before it, and are gone if that
    /// sample lacks them. The GPUs and alerts are that sample's.
    pub(crate) fn as_of(&self, snaps: &[Snapshot], at: usize) -> LiveModel {
        let Some(now) = snaps.get(at) else { return LiveModel::new(self.thresholds) };
        let mut procs = BTreeMap::new();
        for (&(dev, pid), h) in &self.procs {
            let Some(last) = snaps[..=at].iter().rev().find_map(|s| s.publisher(dev, pid)) else { continue };
            let fresh = now.publisher(dev, pid).is_some();
            let nvml_used = now
                .gpus
                .iter()
                .find(|g| g.index == dev)
                .and_then(|g| g.processes.iter().find(|x| last.matches(x)))
                .and_then(|x| x.used_bytes);
            procs.insert(
                (dev, pid),
                ProcHistory {
                    last: last.clone(),
                    series: h.series.clone(),
                    gone: !fresh,
                    fresh,
                    nvml_used,
                    last_step: h.last_step,
                    steps: h.steps.clone(),
                    samples: snaps[..=at].iter().filter(|s| s.publisher(dev, pid).is_some()).count(),
                },
            );
        }
        let mut latest = now.clone();
        latest.publishers.clear();
        LiveModel {
            alerts: alerts(now, &self.thresholds),
            raised: self.raised.iter().filter(|(i, _)| *i <= at).cloned().collect(),
            raised_keys: self.raised.iter().filter(|(i, _)| *i <= at).map(|(_, a)| (a.kind, a.gpu, a.pid)).collect(),
            samples: at + 1,
            gpu_series: self.gpu_series.clone(),
            procs,
            thresholds: self.thresholds,
            ignored: now.skipped.first().cloned(),
            series_cap: self.series_cap,
            latest: Some(latest),
        }
    }

    /// The latest snapshot with its publishers (which `ingest` moved into
    /// the histories).
    pub(crate) fn latest_full(&self) -> Option<Snapshot> {
        let mut s = self.latest.clone()?;
        s.publishers = self.procs.values().filter(|h| h.fresh).map(|h| h.last.clone()).collect();
        Some(s)
    }

    /// The publisher in the latest snapshot that is NVML's process `p` on GPU `gpu`.
    pub(crate) fn publisher_of(&self, gpu: u32, p: &crate::monitor::ProcessSample) -> Option<&Published> {
        self.procs.iter().find(|((d, _), h)| *d == gpu && h.fresh && h.last.matches(p)).map(|(_, h)| &h.last)
    }

    /// Histories of GPU `gpu`'s publishers, live ones first.
    pub(crate) fn publishers_on(&self, gpu: u32) -> Vec<&ProcHistory> {
        let mut v: Vec<&ProcHistory> = self.procs.iter().filter(|((d, _), _)| *d == gpu).map(|(_, h)| h).collect();
        v.sort_by_key(|h| (h.gone, h.last.pid));
        v
    }
}
