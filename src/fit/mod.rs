//! Will it fit? A training run's peak allocated and reserved memory at any
//! batch size, and the largest batch under a limit, from snapshots of a few
//! steps at two (or more) small batches (docs/user/fit.md).
//!
//! The traces are aligned request by request (the same code path makes the
//! same requests in the same order; call stacks and streams say which is
//! which, and an edit-distance alignment skips those only one run makes, like
//! a workspace). Each aligned request's size is a function of the batch,
//! fitted through its sizes in the samples (constant for parameters and
//! optimizer state, linear for activations). The trace of the largest
//! sample is the skeleton: at a target batch, its requests with their sizes
//! predicted are replayed through our allocator on the simulated device, with
//! PyTorch's retry, free-the-cache and OOM behaviour, under the limit.

mod align;
pub(crate) mod report;

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use crate::alloc::{AllocatorConfig, Kind};
use crate::analysis::categories::{Categories, Category, CategoryBytes};
use crate::device::Sim;
use crate::replay::session::{Session, Want};
use crate::replay::whatif::{requests, run_requests_on, Request};
use crate::trace::{DeviceTrace, Frame};

/// One recorded run: its batch and the requests it made.
#[derive(Debug, Clone)]
pub struct Sample {
    pub(crate) batch: u64,
    reqs: Vec<Request>,
    /// Per request: the alignment key of an `Alloc` (its call stack and
    /// stream), 0 for other requests.
    keys: Vec<u64>,
    /// Whether its allocations carry call stacks (history recorded with
    /// `context=None` or `"state"` gives none: requests are then aligned by
    /// stream, order and size alone).
    pub(crate) call_stacks: bool,
    /// PyTorch's peaks in the recording (for the self-check).
    pub(crate) recorded_allocated_peak: u64,
    pub(crate) recorded_reserved_peak: u64,
    /// What the memory was at its peak (docs/user/categories.md).
    pub(crate) categories_at_peak: CategoryBytes,
    /// Requests that ran out of memory while it was recorded: its peak is
    /// then what it held when it failed, not what its batch needs.
    pub(crate) recorded_ooms: usize,
}

impl Sample {
    /// The requests of `dev` (a snapshot recorded from process start),
    /// with the `empty_cache()` calls an exact replay infers. A recording
    /// of requests alone (`fit --no-gpu`'s: no segment or address is a
    /// device's, `recorded_state` false) is placed by our allocator on the
    /// simulated device instead, its peaks that replay's.
    pub fn new(
        batch: u64,
        dev: &DeviceTrace,
        stacks: &[Vec<Frame>],
        annotations: &[crate::trace::Annotation],
        config: &AllocatorConfig,
        release: &crate::replay::session::ReleaseAsk,
        recorded_state: bool,
    ) -> Result<Sample, FitError> {
        let refuse = |why: &str| FitError::NotASample(why.to_string());
        if batch == 0 {
            return Err(refuse("a batch of 0"));
        }
        let want = Want {
            config: config.clone(),
            changed: false,
            device_total: crate::device::DEFAULT_DEVICE_TOTAL,
            memory_limit: None,
            keep_events: false,
            stop_at: None,
            context_bytes: 0,
            recorded_state,
            release: release.clone(),
        };
        let mut s = Session::open(dev, stacks, &want).map_err(|e| refuse(&e.to_string()))?;
        // Requests from process start are what a prediction replays: a
        // snapshot without history has none, and a window lacks the
        // model's setup (weights, optimizer state) it starts after.
        match s.fidelity {
            crate::replay::session::Fidelity::StateOnly => {
                return Err(refuse("a snapshot without memory history (its state only): fit needs the requests of a few steps from process start; record with torch.cuda.memory._record_memory_history(context=\"alloc\", stacks=\"python\") before the model is built, or use fit --batches"))
            }
            crate::replay::session::Fidelity::ExactWindow => {
                return Err(refuse("a window of a longer run (the history's ring buffer wrapped, or history began mid-run): fit needs the requests from process start; record a few steps with a larger max_entries, or use fit --batches"))
            }
            _ => {}
        }
        let at = if s.exact.divergence.is_none() { s.exact.empty_cache_at.clone() } else { Vec::new() };
        let placed = !recorded_state;
        if placed {
            // `what_if_peak` names its event through the requests.
            let _ = s.requests();
        }
        let st = match &s.what_if {
            Some(w) if placed => w.allocator.stats(),
            _ => s.exact.allocator.stats(),
        };
        let (ap, rp) = (st.get(Kind::AllocatedBytes, 0).peak as u64, st.get(Kind::ReservedBytes, 0).peak as u64);
        let reqs = requests(dev.events.view(), &at);
        // Streams by order of first use: handles differ between processes.
        let mut stream_rank: HashMap<u64, u64> = HashMap::new();
        let mut stack_hash: HashMap<u32, u64> = HashMap::new();
        let mut alloc_i = 0usize;
        let mut anchor = 0u64;
        let alloc_stacks: Vec<u32> = dev
            .events
            .iter()
            .zip(dev.stacks.iter())
            .filter(|(e, _)| e.action == crate::alloc::Action::Alloc)
            .map(|(_, &s)| s)
            .collect();
        let call_stacks =
            alloc_stacks.iter().any(|&sid| sid != 0 && stacks.get(sid as usize - 1).is_some_and(|f| !f.is_empty()));
        let mut keys = Vec::with_capacity(reqs.len());
        for r in &reqs {
            let k = match *r {
                Request::Alloc { stream, .. } => {
                    let n = stream_rank.len() as u64;
                    let rank = *stream_rank.entry(stream).or_insert(n);
                    let sid = alloc_stacks.get(alloc_i).copied().unwrap_or(0);
                    alloc_i += 1;
                    let h = *stack_hash.entry(sid).or_insert_with(|| {
                        let frames = stacks.get((sid as usize).wrapping_sub(1)).map(Vec::as_slice).unwrap_or(&[]);
                        hash_frames(frames)
                    });
                    // An allocation without Python frames (autograd's
                    // backward, C++) is known by the last one with frames.
                    if sid != 0 {
                        anchor = h;
                    }
                    let h = if sid != 0 { h } else { anchor ^ 0x5bd1_e995 };
                    (h ^ rank.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1
                }
                _ => 0,
            };
            keys.push(k);
        }
        let (order, peak_event) = if placed {
            (None, s.what_if_peak().map_or(0, |p| p.event))
        } else {
            (Some((&s.exact.allocated, s.exact.allocated_before)), s.exact.peak.event)
        };
        let cats = Categories::of(dev, stacks, annotations, &[], order);
        let categories_at_peak = cats.bytes_after(Some(peak_event));
        Ok(Sample {
            batch,
            reqs,
            keys,
            call_stacks,
            recorded_allocated_peak: ap,
            recorded_reserved_peak: rp,
            categories_at_peak,
            recorded_ooms: dev.events.ooms().count(),
        })
    }

    fn alloc_sizes(&self) -> Vec<(usize, u64)> {
        self.reqs
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match *r {
                Request::Alloc { size, .. } => Some((i, size)),
                _ => None,
            })
            .collect()
    }
}

fn hash_frames(frames: &[Frame]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for f in frames {
        f.filename.hash(&mut h);
        f.line.hash(&mut h);
        f.name.hash(&mut h);
    }
    h.finish()
}

/// How a request's size depends on the batch.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Size {
    /// Only the skeleton has it: kept as recorded.
    Fixed(u64),
    /// Through the samples' sizes: `at(b) = a + k·b`, least squares over the
    /// samples (exact through two).
    Linear { a: f64, k: f64 },
    /// A line up to `cap`: a reduction's partial sums, which PyTorch bounds
    /// (`REDUCTION_CAP`).
    Capped { a: f64, k: f64, cap: u64 },
    /// A line below batch `stop`, from there `after`: cuDNN's buffer for a
    /// weight gradient's partial sums split over the batch, which it stops
    /// taking at `stop` (`split_buffer`, `SPLIT_STOP_BATCH`).
    Split { a: f64, k: f64, stop: u64, after: u64 },
}

impl Size {
    fn at(self, batch: u64) -> u64 {
        match self {
            Size::Fixed(s) => s,
            Size::Linear { a, k } => {
                let v = a + k * batch as f64;
                if v < 1.0 {
                    1
                } else {
                    v.round() as u64
                }
            }
            Size::Capped { a, k, cap } => Size::Linear { a, k }.at(batch).min(cap),
            Size::Split { a, k, stop, after } => {
                if batch < stop {
                    Size::Linear { a, k }.at(batch)
                } else {
                    after
                }
            }
        }
    }
}

/// The most bytes PyTorch's reduction kernel takes for its partial sums on
/// the GPUs the samples come from (an H100 or H200: 132 SMs × 2^18 fp32
/// values; measured by measurements/calibration/linear_backward.py, and what
/// `workload`'s bias gradients use). A Linear's bias gradient sums its
/// output's gradient over the rows into such a buffer, freed at once: in
/// proportion to the batch in small samples, and no larger than this at a
/// large batch (docs/user/fit.md "Reductions").
pub(crate) const REDUCTION_CAP: u64 = (132 << 18) * 4;

/// A workspace's size at a batch that was not sampled is known only to
/// within a few percent (cuDNN picks its algorithm by shape), while whether
/// it reuses a cached segment turns on its size to the rounding unit; so a
/// prediction away from the samples averages over sizes within this
/// fraction of the fitted one (docs/user/fit.md, "Workspaces").
pub(crate) const WORKSPACE_SPREAD: f64 = 0.02;
/// Replays averaged over when the run has workspaces.
pub(crate) const WORKSPACE_RUNS: u64 = 16;

/// A fitted training run.
#[derive(Debug, Clone)]
pub(crate) struct Fit {
    /// The skeleton: the largest sample's requests.
    skeleton: Vec<Request>,
    /// Per skeleton request index of an `Alloc`: its size model.
    sizes: HashMap<usize, Size>,
    /// Skeleton indices of workspaces (allocations freed before the next
    /// one whose size changes with the batch but not in proportion to it),
    /// each with a hash of its sizes in the samples: equal sizes at every
    /// sample are the same shape, which gets the same algorithm and so
    /// varies alike.
    workspaces: HashMap<usize, u64>,
    /// Requests whose sizes in three or more samples are off any line
    /// (cuDNN changed kernels between them): their sizes by batch, sorted,
    /// read between neighbouring samples (`between_samples`).
    bent: HashMap<usize, Vec<(u64, u64)>>,
    pub(crate) samples: Vec<u64>,
    pub(crate) report: FitReport,
}

/// How well the samples agree (the prediction's confidence).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct FitReport {
    /// Allocations in the skeleton.
    pub(crate) requests: usize,
    /// Of those, aligned in every sample.
    pub(crate) aligned: usize,
    /// Allocations of the other samples with no partner.
    pub(crate) unaligned_elsewhere: usize,
    /// Aligned requests whose size changes with the batch.
    pub(crate) scaling: usize,
    /// Of those, workspaces (freed before the next allocation, a size not
    /// in proportion to the batch): their sizes away from the samples are
    /// uncertain, and predictions there average over them.
    pub(crate) workspaces: usize,
    /// With three or more samples: aligned requests whose sizes are not on a
    /// line (more than 1% off it).
    pub(crate) nonlinear: usize,
    /// Whether every sample carried call stacks; without them requests
    /// were aligned by stream, order and size alone.
    pub(crate) call_stacks: bool,
    /// The replay of each sample's own requests, against its recorded peaks:
    /// (batch, allocated error, reserved error) as fractions.
    pub(crate) self_check: Vec<(u64, f64, f64)>,
}

/// Below this share of the skeleton's requests aligned in every sample,
/// the samples are not one program's steps (docs/user/fit.md "Samples that
/// cannot be right"): the same script at two batches aligns 93–100%.
pub(crate) const MIN_ALIGNED: f64 = 0.8;
/// A self-check off by more than this (allocated, reserved) refuses the
/// samples: the fit does not reproduce its own input.
pub(crate) const REFUSE_SELF_CHECK: (f64, f64) = (0.05, 0.10);
/// Off by more than this, the predictions are printed with a warning.
pub(crate) const WARN_SELF_CHECK: (f64, f64) = (0.01, 0.05);

/// Samples `fit` cannot predict from: bad input, exit code 2.
#[derive(Debug, thiserror::Error)]
pub enum FitError {
    /// Fewer than two batch sizes.
    #[error("{0}")]
    TooFew(String),
    /// Samples that cannot be right: one run given twice, a run that ran
    /// out of memory, a larger batch peaking lower (swapped labels).
    #[error("{0}")]
    Samples(String),
    /// Samples that are not one program at their batches: too few
    /// requests align, or the fit does not reproduce its own samples.
    #[error("{0}")]
    NotOneProgram(String),
    /// A snapshot that cannot be a sample: no history, a window, a batch
    /// of 0, or one whose replay cannot start.
    #[error("{0}")]
    NotASample(String),
}

impl FitError {
    /// Every one is the user's samples: exit code 2.
    pub fn exit_code(&self) -> u8 {
        2
    }
}

/// Samples whose labels cannot be right: a larger batch whose recorded
/// peak allocated is more than 1% below a smaller batch's (the labels
/// swapped, most likely). `names`: each sample's file, in `samples`' order.
pub(crate) fn check_order(samples: &[Sample], names: &[String]) -> Result<(), FitError> {
    // One run given at two batches (the same file, or a copy of it: the
    // same requests) fits a line through one point.
    for (j, (s, n)) in samples.iter().zip(names).enumerate() {
        let same = samples[..j].iter().zip(names).find(|(o, _)| o.batch != s.batch && o.reqs == s.reqs);
        if let Some((o, on)) = same {
            return Err(FitError::Samples(format!(
                "{n} (batch {}) and {on} (batch {}) are the same snapshot: the samples must be runs at their own batches",
                s.batch, o.batch
            )));
        }
    }
    // A sample that ran out of memory peaked at what it held when it
    // failed: said as that, before any order it breaks is blamed on labels.
    if let Some((s, n)) = samples.iter().zip(names).find(|(s, _)| s.recorded_ooms > 0) {
        return Err(FitError::Samples(format!(
            "{n} (batch {}) ran out of memory while it was recorded ({} OOM{}): its peak, {}, is what it held when it failed, not what batch {} needs; record the samples at batches that fit the device (smaller ones: fit predicts the larger)",
            s.batch,
            s.recorded_ooms,
            if s.recorded_ooms == 1 { "" } else { "s" },
            crate::analysis::human_bytes(s.recorded_allocated_peak),
            s.batch
        )));
    }
    let mut by_batch: Vec<(&Sample, &String)> = samples.iter().zip(names).collect();
    by_batch.sort_by_key(|(s, _)| s.batch);
    for w in by_batch.windows(2) {
        let ((small, sn), (large, ln)) = (w[0], w[1]);
        if large.batch > small.batch
            && (large.recorded_allocated_peak as f64) < 0.99 * small.recorded_allocated_peak as f64
        {
            return Err(FitError::Samples(format!(
                "{ln} (batch {}) peaked at {} allocated, below {sn} (batch {}) at {}: a larger batch cannot need less memory; are the @BATCH labels swapped?",
                large.batch,
                crate::analysis::human_bytes(large.recorded_allocated_peak),
                small.batch,
                crate::analysis::human_bytes(small.recorded_allocated_peak)
            )));
        }
    }
    Ok(())
}

impl FitReport {
    /// Whether the samples can be one program at their batches: an error
    /// where they cannot (too few requests align, or the fit does not
    /// reproduce its own samples), else warnings to print with the
    /// predictions.
    pub(crate) fn judge(&self) -> Result<Vec<String>, FitError> {
        let share = self.aligned as f64 / self.requests.max(1) as f64;
        if share < MIN_ALIGNED {
            return Err(FitError::NotOneProgram(format!(
                "only {} of {} requests align across the samples ({:.0}%; one script at two batches aligns over {:.0}%): they are not the same program's steps (another model, script or settings?)",
                self.aligned,
                self.requests,
                share * 100.0,
                MIN_ALIGNED * 100.0
            )));
        }
        let mut warnings = Vec::new();
        for &(b, ea, er) in &self.self_check {
            let said = format!(
                "the fit replays its own sample at batch {b} {:+.2}% off in peak allocated and {:+.2}% in peak reserved",
                ea * 100.0,
                er * 100.0
            );
            if ea.abs() > REFUSE_SELF_CHECK.0 || er.abs() > REFUSE_SELF_CHECK.1 {
                return Err(FitError::NotOneProgram(format!(
                    "{said}: the samples do not describe one program at these batches; check that each SNAPSHOT@BATCH names the batch it ran and that all come from one script"
                )));
            }
            if ea.abs() > WARN_SELF_CHECK.0 || er.abs() > WARN_SELF_CHECK.1 {
                warnings.push(format!("{said}: the predictions are less certain than docs/user/fit.md measures"));
            }
        }
        Ok(warnings)
    }
}

/// One category's bytes at the samples' peaks, and the line through them
/// (least squares over the batch): what grows with the batch and what does
/// not (docs/user/fit.md "Categories").
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CategoryFit {
    pub(crate) category: Category,
    /// (batch, bytes at that sample's peak).
    pub(crate) at_samples: Vec<(u64, u64)>,
    pub(crate) fixed_bytes: f64,
    pub(crate) bytes_per_batch_item: f64,
}

impl CategoryFit {
    /// The line's bytes at `batch` (never below 0).
    pub(crate) fn at(&self, batch: u64) -> u64 {
        (self.fixed_bytes + self.bytes_per_batch_item * batch as f64).max(0.0).round() as u64
    }

    /// Each category with bytes in some sample, its line through them.
    pub(crate) fn of(samples: &[Sample]) -> Vec<CategoryFit> {
        Category::ALL
            .into_iter()
            .filter(|&c| samples.iter().any(|s| s.categories_at_peak.get(c) > 0))
            .map(|c| {
                let pts: Vec<(u64, u64)> = samples.iter().map(|s| (s.batch, s.categories_at_peak.get(c))).collect();
                let n = pts.len() as f64;
                let mx = pts.iter().map(|p| p.0 as f64).sum::<f64>() / n;
                let my = pts.iter().map(|p| p.1 as f64).sum::<f64>() / n;
                let sxx: f64 = pts.iter().map(|p| (p.0 as f64 - mx).powi(2)).sum();
                let sxy: f64 = pts.iter().map(|p| (p.0 as f64 - mx) * (p.1 as f64 - my)).sum();
                // Weights, their gradients and the optimizer's state do not
                // depend on the batch: what differs between samples is which
                // of them the peak catches (in the optimizer's step or in
                // forward); the largest sample's is the nearest to the
                // batches predicted.
                if matches!(c, Category::Parameter | Category::Gradient | Category::OptimizerState) {
                    let last = pts.iter().max_by_key(|p| p.0).map_or(0.0, |p| p.1 as f64);
                    return CategoryFit { category: c, at_samples: pts, fixed_bytes: last, bytes_per_batch_item: 0.0 };
                }
                let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
                CategoryFit { category: c, at_samples: pts, fixed_bytes: my - slope * mx, bytes_per_batch_item: slope }
            })
            .collect()
    }
}

/// One prediction.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Prediction {
    pub(crate) batch: u64,
    /// With workspaces away from the samples: the mean over the runs.
    pub(crate) allocated_peak_bytes: u64,
    pub(crate) reserved_peak_bytes: u64,
    /// The lowest and highest reserved peak of the runs (equal with one).
    pub(crate) reserved_peak_range_bytes: [u64; 2],
    /// Whether more than half of the runs finished without an OOM.
    pub(crate) fits: bool,
    /// The most OOMs and retries any run had.
    pub(crate) ooms: u64,
    pub(crate) num_alloc_retries: i64,
    /// Replays the figures come from, and how many of them ran out of
    /// memory under the limit.
    pub(crate) runs: u64,
    pub(crate) runs_out_of_memory: u64,
}

/// What one or more replays at a batch reached.
#[derive(Debug, Clone, Copy, Default)]
struct Outcome {
    allocated_sum: u128,
    reserved_sum: u128,
    reserved_low: u64,
    reserved_high: u64,
    ooms: u64,
    retries: i64,
    runs: u64,
    oom_runs: u64,
}

impl Outcome {
    /// `failed`: allocations the replay could not make, counted as OOMs
    /// also where PyTorch counts none (a request of 1 EB or more fails
    /// before the counters move; a saturated prediction is one).
    fn add(&mut self, st: &crate::alloc::DeviceStats, failed: u64) {
        let r = st.get(Kind::ReservedBytes, 0).peak as u64;
        self.allocated_sum += st.get(Kind::AllocatedBytes, 0).peak as u128;
        self.reserved_sum += r as u128;
        self.reserved_low = if self.runs == 0 { r } else { self.reserved_low.min(r) };
        self.reserved_high = self.reserved_high.max(r);
        let ooms = (st.num_ooms as u64).max(failed);
        self.ooms = self.ooms.max(ooms);
        self.oom_runs += u64::from(ooms > 0);
        self.retries = self.retries.max(st.num_alloc_retries);
        self.runs += 1;
    }
    fn mean(sum: u128, n: u64) -> u64 {
        (sum / u128::from(n.max(1))) as u64
    }
}

impl Prediction {
    /// Peaks from one set of runs, whether it fits from another (the same,
    /// or the runs under the limit).
    fn of(batch: u64, peaks: &Outcome, fits: &Outcome) -> Prediction {
        Prediction {
            batch,
            allocated_peak_bytes: Outcome::mean(peaks.allocated_sum, peaks.runs),
            reserved_peak_bytes: Outcome::mean(peaks.reserved_sum, peaks.runs),
            reserved_peak_range_bytes: [peaks.reserved_low, peaks.reserved_high],
            // Most runs fit: the batch fits as the workspaces most likely
            // turn out (`runs_out_of_memory` says how many did not).
            fits: fits.oom_runs * 2 < fits.runs,
            ooms: fits.ooms,
            num_alloc_retries: fits.retries,
            runs: peaks.runs,
            runs_out_of_memory: fits.oom_runs,
        }
    }
}

/// A device with room for any batch's peaks (4 PiB): where a prediction
/// measures what a batch needs.
const NEED_DEVICE: u64 = 1 << 52;

/// The device a prediction runs on.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) device_total: u64,
    /// CUDA context and other non-PyTorch memory on the device.
    pub(crate) context: u64,
    /// `set_per_process_memory_fraction(limit / total)`, in bytes.
    pub(crate) limit: Option<u64>,
}

/// The requests (by index) that are scratch space of one op: allocations
/// freed before the next one. A kernel's few bytes of its own (a
/// reduction's 12-byte counter, taken and freed inside) do not count as a
/// next allocation; scratch space with such a counter beside it is a
/// reduction's partial sums (`REDUCTION_CAP`), the second set.
fn scratch_space(reqs: &[Request]) -> (HashSet<usize>, HashSet<usize>) {
    let mut transient = HashSet::new();
    let mut reductions = HashSet::new();
    let mut last_alloc: Option<(usize, u64)> = None;
    let mut counter = false;
    for (i, r) in reqs.iter().enumerate() {
        match *r {
            Request::Alloc { size, .. } if size < 512 => counter = last_alloc.is_some(),
            Request::Alloc { key, .. } => {
                last_alloc = Some((i, key));
                counter = false;
            }
            Request::FreeRequested { key } if last_alloc.is_some_and(|(_, k)| k == key) => {
                if let Some((j, _)) = last_alloc.take() {
                    transient.insert(j);
                    if counter {
                        reductions.insert(j);
                    }
                }
            }
            _ => {}
        }
    }
    (transient, reductions)
}

/// The size of the last allocation before request `i` (0: none).
fn alloc_before(reqs: &[Request], i: usize) -> u64 {
    reqs[..i]
        .iter()
        .rev()
        .find_map(|r| match *r {
            Request::Alloc { size, .. } => Some(size),
            _ => None,
        })
        .unwrap_or(0)
}

/// The sizes of the allocations that keep their size at every batch and
/// are never freed (weights, their gradients, optimizer state): what a
/// weight's gradient takes in fp32.
fn weight_sizes(reqs: &[Request], points: &HashMap<usize, Vec<(u64, u64)>>, samples: usize) -> Vec<u64> {
    let freed: HashSet<u64> = reqs
        .iter()
        .filter_map(|r| match *r {
            Request::FreeRequested { key } => Some(key),
            _ => None,
        })
        .collect();
    let mut sizes: Vec<u64> = reqs
        .iter()
        .enumerate()
        .filter_map(|(i, r)| match *r {
            Request::Alloc { key, size, .. } if size >= 4096 && !freed.contains(&key) => {
                let pts = points.get(&i)?;
                (pts.len() == samples && pts.iter().all(|p| p.1 == size)).then_some(size)
            }
            _ => None,
        })
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// Whether scratch space growing by `k` bytes per batch item, allocated
/// right after an allocation of `before` bytes, is cuDNN's buffer for a
/// weight gradient's partial sums split over the batch: one fp32 copy of a
/// weight (`k` is one of `weights`) per item, taken just after that
/// gradient (the weight's size in fp32, or half of it in fp16 or bf16).
/// cuDNN splits so while the batch is too small to fill the GPU, and at
/// larger batches picks kernels that need no such buffer: measured on the
/// H200, a 1280×320 convolution's 13.1 MB at 8, 26.2 at 16 and 183.5 at
/// 112 became 20.1 MB at 128 (docs/user/fit.md "Batch-split buffers").
fn split_buffer(k: f64, before: u64, weights: &[u64]) -> bool {
    k >= 4096.0 && weights.iter().any(|&w| (k - w as f64).abs() <= w as f64 * 1e-3 && (before == w || before * 2 == w))
}

/// From this batch on cuDNN no longer splits a weight gradient's sums over
/// the batch (measured on the H200: EfficientNet-B0's 1280×320 and
/// 1152×192 convolutions' buffers grew with the batch up to 112 and were
/// gone at 128, as was MobileNetV3-L's 960×160 one). What takes their place
/// is the other kernel's scratch space (EfficientNet's 1280×320: 20.1 MB at
/// 128, its input and output copied), which the samples do not show: the
/// buffer's size in the largest sample stands for it (26.2 MB at 16).
const SPLIT_STOP_BATCH: u64 = 128;

impl Fit {
    /// Aligns the samples (at least two, different batches) and fits each
    /// request's size.
    pub fn new(mut samples: Vec<Sample>) -> Result<Fit, FitError> {
        samples.sort_by_key(|s| s.batch);
        if samples.len() < 2 || samples.windows(2).any(|w| w[0].batch == w[1].batch) {
            return Err(FitError::TooFew("fit needs snapshots at two or more different batch sizes".into()));
        }
        let last = samples.len() - 1;
        let sk = &samples[last];
        let sk_allocs = sk.alloc_sizes();
        // Per skeleton alloc (by request index): its size in each sample.
        let mut points: HashMap<usize, Vec<(u64, u64)>> =
            sk_allocs.iter().map(|&(i, s)| (i, vec![(sk.batch, s)])).collect();
        let mut unaligned_elsewhere = 0;
        for other in &samples[..last] {
            let o_allocs = other.alloc_sizes();
            let small: Vec<(u64, u64)> = o_allocs.iter().map(|&(i, s)| (other.keys[i], s)).collect();
            let large: Vec<(u64, u64)> = sk_allocs.iter().map(|&(i, s)| (sk.keys[i], s)).collect();
            let pairs = align::scored(&small, &large, sk.batch as f64 / other.batch as f64);
            unaligned_elsewhere += o_allocs.len() - pairs.len();
            for (y, x) in pairs {
                if let Some(v) = points.get_mut(&sk_allocs[x].0) {
                    v.push((other.batch, o_allocs[y].1));
                }
            }
        }
        let (transient, reductions) = scratch_space(&sk.reqs);
        let weights = weight_sizes(&sk.reqs, &points, samples.len());
        let mut sizes = HashMap::new();
        let mut workspaces = HashMap::new();
        let mut bent = HashMap::new();
        let (mut aligned, mut scaling, mut nonlinear) = (0, 0, 0);
        for (&i, pts) in &points {
            let size = if pts.len() == samples.len() {
                aligned += 1;
                let m = fit_line(pts);
                let mut by_batch = pts.clone();
                by_batch.sort_unstable();
                if let Size::Linear { k, .. } = m {
                    if k.abs() > 0.0 {
                        scaling += 1;
                    }
                }
                if pts.len() > 2 && pts.iter().any(|&(b, s)| (m.at(b) as f64 - s as f64).abs() > 0.01 * s as f64) {
                    nonlinear += 1;
                    bent.insert(i, by_batch.clone());
                }
                // A tensor whose size changes with the batch is in
                // proportion to it (the batch is one of its dimensions);
                // scratch space that is not is a workspace an algorithm
                // chose (cuDNN's), whose size elsewhere is uncertain.
                let proportional = matches!(m, Size::Linear { a, .. } if a.abs() < 1.0);
                let varies = pts.iter().any(|p| p.1 != pts[0].1);
                let reduction = reductions.contains(&i) || transient.contains(&i) && proportional;
                if transient.contains(&i) && varies && !reduction {
                    workspaces.insert(i, by_batch.iter().fold(0, |h, &(_, s)| splitmix(h ^ s)));
                }
                // A reduction's scratch space: in proportion to the batch
                // below the bound, or at the bound already in the largest
                // sample (its size there within 1% of it: the bound is
                // rounded up to whole rows of the output).
                let largest = pts.iter().max_by_key(|p| p.0).map_or(0, |p| p.1);
                let at_bound = largest.abs_diff(REDUCTION_CAP) * 100 <= REDUCTION_CAP;
                let workspace = transient.contains(&i) && varies && !reduction;
                let b_largest = pts.iter().map(|p| p.0).max().unwrap_or(1).max(1);
                match m {
                    // Samples past the batch cuDNN stops splitting at show
                    // what it does there: their line stands.
                    Size::Linear { a, k }
                        if b_largest < SPLIT_STOP_BATCH
                            && transient.contains(&i)
                            && split_buffer(k, alloc_before(&sk.reqs, i), &weights) =>
                    {
                        Size::Split { a, k, stop: SPLIT_STOP_BATCH, after: largest }
                    }
                    Size::Linear { a, k } if reduction && varies => {
                        Size::Capped { a, k, cap: if at_bound { largest } else { REDUCTION_CAP } }
                    }
                    // A workspace growing faster than the batch between the
                    // samples grows in proportion to it beyond them (docs/user/fit.md
                    // "Workspaces").
                    Size::Linear { a, .. } if workspace && a < 0.0 => {
                        Size::Linear { a: 0.0, k: largest as f64 / b_largest as f64 }
                    }
                    m => m,
                }
            } else {
                Size::Fixed(pts[0].1)
            };
            sizes.insert(i, size);
        }
        let report = FitReport {
            requests: sk_allocs.len(),
            aligned,
            unaligned_elsewhere,
            scaling,
            workspaces: workspaces.len(),
            nonlinear,
            call_stacks: samples.iter().all(|s| s.call_stacks),
            self_check: Vec::new(),
        };
        Ok(Fit {
            skeleton: sk.reqs.clone(),
            sizes,
            workspaces,
            bent,
            samples: samples.iter().map(|s| s.batch).collect(),
            report,
        })
    }

    /// The skeleton's requests with their sizes at `batch`.
    /// One recording as it is (`fit --no-gpu` records the batch it
    /// predicts): every size fixed, so a prediction at that batch replays
    /// the recording's own requests.
    pub(crate) fn recorded(sample: Sample) -> Fit {
        let sizes: HashMap<usize, Size> = sample.alloc_sizes().into_iter().map(|(i, s)| (i, Size::Fixed(s))).collect();
        let report = FitReport {
            requests: sizes.len(),
            aligned: sizes.len(),
            unaligned_elsewhere: 0,
            scaling: 0,
            workspaces: 0,
            nonlinear: 0,
            call_stacks: sample.call_stacks,
            self_check: Vec::new(),
        };
        Fit {
            skeleton: sample.reqs,
            sizes,
            workspaces: HashMap::new(),
            bent: HashMap::new(),
            samples: vec![sample.batch],
            report,
        }
    }

    pub(crate) fn requests_at(&self, batch: u64) -> Vec<Request> {
        self.requests_varied(batch, None)
    }

    /// As `requests_at`, with run `run`'s workspace sizes: each within
    /// `WORKSPACE_SPREAD` of the fitted size, drawn from a fixed sequence so
    /// that predictions repeat exactly.
    fn requests_varied(&self, batch: u64, run: Option<u64>) -> Vec<Request> {
        self.skeleton
            .iter()
            .enumerate()
            .map(|(i, r)| match *r {
                Request::Alloc { key, size, stream } => {
                    let mut size = match self.bent.get(&i) {
                        Some(pts) => between_samples(pts, batch),
                        None => self.sizes.get(&i).map_or(size, |m| m.at(batch)),
                    };
                    if let (Some(run), Some(&shape)) = (run, self.workspaces.get(&i)) {
                        let u = unit(splitmix(shape ^ splitmix(run)));
                        size = ((size as f64) * (1.0 + WORKSPACE_SPREAD * u)).round().max(1.0) as u64;
                    }
                    Request::Alloc { key, size, stream }
                }
                other => other,
            })
            .collect()
    }

    /// Replays the requests at `batch` under `config` with `limit`.
    fn run(&self, batch: u64, config: &AllocatorConfig, target: &Target, limit: Option<u64>) -> Outcome {
        let once = |reqs: &[Request]| {
            let sim = Sim::new("simulated device", target.device_total, target.context).with_descending_addresses();
            let w = run_requests_on(reqs, config.clone(), sim, limit);
            (w.allocator.stats().clone(), w.new_ooms)
        };
        let mut out = Outcome::default();
        // At a sampled batch the workspaces are known: one exact replay.
        if self.workspaces.is_empty() || self.samples.contains(&batch) {
            let (st, failed) = once(&self.requests_at(batch));
            out.add(&st, failed);
        } else {
            for run in 0..WORKSPACE_RUNS {
                let (st, failed) = once(&self.requests_varied(batch, Some(run)));
                out.add(&st, failed);
            }
        }
        out
    }

    /// The peaks at `batch` as the run would reach them under the target's
    /// limit (the cache freed and retried as PyTorch does when it nears it).
    pub(crate) fn predict_limited(&self, batch: u64, config: &AllocatorConfig, target: &Target) -> Prediction {
        let st = self.run(batch, config, target, target.limit);
        Prediction::of(batch, &st, &st)
    }

    /// The peaks at `batch` under `config`: what the run would reach on the
    /// whole device (so a batch that does not fit still gets its peaks), and
    /// whether it fits under the target's limit.
    pub(crate) fn predict(&self, batch: u64, config: &AllocatorConfig, target: &Target) -> Prediction {
        // The peaks a batch needs, on a device with room for any of them
        // (one that does not fit still gets its need, not what it held
        // when it ran out), and whether it fits the target's device and limit.
        let need = self.run(batch, config, &Target { device_total: NEED_DEVICE, limit: None, ..target.clone() }, None);
        let fits = self.run(batch, config, target, target.limit);
        Prediction::of(batch, &need, &fits)
    }

    /// The largest batch that runs without an OOM (0: not even batch 1),
    /// searched by doubling then bisection, at most `max` (a run that still
    /// fits there reports `max`).
    pub(crate) fn max_batch(&self, config: &AllocatorConfig, target: &Target, max: u64) -> u64 {
        // Bounded so that `max + 1` and the doubling cannot wrap.
        let max = max.min(MAX_BATCH);
        let fits = |b: u64| self.predict_limited(b, config, target).fits;
        if !fits(1) {
            return 0;
        }
        let (mut lo, mut hi) = (1u64, 2u64);
        while hi <= max && fits(hi) {
            lo = hi;
            hi = hi.saturating_mul(2);
        }
        let mut hi = hi.min(max + 1);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }
}

/// The largest batch `fit` takes or answers (samples, `--batch`,
/// `--max-batch`): far past any real one, small enough that no sum of
/// request sizes or search step wraps.
pub const MAX_BATCH: u64 = 1 << 32;

/// A size off any line through three or more samples (`pts` sorted by
/// batch): between two samples, on the line through them; beyond the
/// largest, on the line through the last two if that grows (through the
/// origin and the largest where its intercept is negative, as a workspace
/// growing faster than the batch is taken to: "Workspaces"), else the
/// largest's size, a kernel that needs less at larger batches needing no
/// more beyond them (docs/user/fit.md "Batch-split buffers").
fn between_samples(pts: &[(u64, u64)], batch: u64) -> u64 {
    let n = pts.len();
    if n < 2 {
        return pts.first().map_or(1, |p| p.1);
    }
    let j = pts.iter().position(|p| p.0 >= batch).unwrap_or(n - 1).clamp(1, n - 1);
    let ((b0, s0), (b1, s1)) = (pts[j - 1], pts[j]);
    let k = (s1 as f64 - s0 as f64) / (b1 as f64 - b0 as f64);
    if batch > b1 {
        if k <= 0.0 {
            return s1;
        }
        let a = s1 as f64 - k * b1 as f64;
        let v = if a < 0.0 { s1 as f64 * batch as f64 / b1 as f64 } else { a + k * batch as f64 };
        return v.round().max(1.0) as u64;
    }
    (s0 as f64 + k * (batch as f64 - b0 as f64)).round().max(1.0) as u64
}

/// SplitMix64's mixing function: a fixed, well-spread sequence.
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A hash as a number in [-1, 1).
fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

/// Least squares through the points; a constant when the sizes agree.
fn fit_line(pts: &[(u64, u64)]) -> Size {
    if pts.iter().all(|p| p.1 == pts[0].1) {
        return Size::Fixed(pts[0].1);
    }
    let n = pts.len() as f64;
    let mx = pts.iter().map(|p| p.0 as f64).sum::<f64>() / n;
    let my = pts.iter().map(|p| p.1 as f64).sum::<f64>() / n;
    let sxx: f64 = pts.iter().map(|p| (p.0 as f64 - mx).powi(2)).sum();
    let sxy: f64 = pts.iter().map(|p| (p.0 as f64 - mx) * (p.1 as f64 - my)).sum();
    let k = if sxx == 0.0 { 0.0 } else { sxy / sxx };
    if k < 0.0 {
        // A size that shrinks as the batch grows is a choice (a cuDNN
        // algorithm's workspace), not a shape: the largest seen stands.
        return Size::Fixed(pts.iter().map(|p| p.1).max().unwrap_or(0));
    }
    Size::Linear { a: my - k * mx, k }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run at `b`: a kept tensor, then allocations each freed before the
    /// next: one in proportion to the batch (a temporary tensor), one
    /// constant, and three not in proportion (an algorithm's workspaces, two
    /// of one shape).
    fn sample(b: u64) -> Sample {
        let allocs = [
            (1, 1000 * b, false),
            (2, 512 * b, true),
            (3, 4096, true),
            (4, 4096 + 100 * b, true),
            (5, 4096 + 100 * b, true),
            (6, 4000 + 100 * b, true),
        ];
        let mut reqs = Vec::new();
        let mut keys = Vec::new();
        for (k, size, freed) in allocs {
            reqs.push(Request::Alloc { key: k, size, stream: 0 });
            keys.push(k * 2 + 1);
            if freed {
                reqs.push(Request::FreeRequested { key: k });
                reqs.push(Request::FreeCompleted { key: k });
                keys.extend([0, 0]);
            }
        }
        Sample {
            batch: b,
            reqs,
            keys,
            call_stacks: true,
            recorded_allocated_peak: 0,
            recorded_reserved_peak: 0,
            categories_at_peak: CategoryBytes::default(),
            recorded_ooms: 0,
        }
    }

    fn size_of(reqs: &[Request], key: u64) -> u64 {
        reqs.iter()
            .find_map(|r| match *r {
                Request::Alloc { key: k, size, .. } if k == key => Some(size),
                _ => None,
            })
            .unwrap_or(0)
    }

    #[test]
    fn only_scratch_space_out_of_proportion_is_a_workspace() {
        let f = Fit::new(vec![sample(2), sample(4)]).unwrap();
        assert_eq!((f.report.scaling, f.report.workspaces), (5, 3));
        let exact = f.requests_at(64);
        assert_eq!([1, 2, 3, 4].map(|k| size_of(&exact, k)), [64_000, 32_768, 4096, 10_496]);
        // Varied runs move the workspaces only, within the spread, not all
        // to one size; one shape's alike, another's on its own.
        let mut seen = HashSet::new();
        for run in 0..WORKSPACE_RUNS {
            let v = f.requests_varied(64, Some(run));
            assert_eq!([1, 2, 3].map(|k| size_of(&v, k)), [64_000, 32_768, 4096]);
            let w = size_of(&v, 4) as f64;
            assert!((w / 10_496.0 - 1.0).abs() <= WORKSPACE_SPREAD, "{w}");
            seen.insert(w as u64);
            assert_eq!(size_of(&v, 5), size_of(&v, 4));
            assert_ne!(size_of(&v, 6) + 96, size_of(&v, 4));
        }
        assert!(seen.len() > WORKSPACE_RUNS as usize / 2, "{seen:?}");
        // A sampled batch is replayed once, as recorded; others average runs.
        let t = Target { device_total: 1 << 34, context: 0, limit: None };
        let c = AllocatorConfig::default();
        assert_eq!(f.predict(4, &c, &t).runs, 1);
        assert_eq!(f.predict(64, &c, &t).runs, WORKSPACE_RUNS);
    }

    /// Off a line through three samples: on the line through the two
    /// neighbours between them, and beyond the largest on the last two's if
    /// that grows, else the largest's size.
    #[test]
    fn a_bent_size_is_read_between_neighbouring_samples() {
        let pts = [(8, 1000), (16, 2000), (128, 100)];
        assert_eq!(between_samples(&pts, 12), 1500);
        assert_eq!(between_samples(&pts, 72), 1050);
        assert_eq!(between_samples(&pts, 256), 100);
        assert_eq!(between_samples(&pts, 4), 500);
        let up = [(8, 1000), (16, 2000), (32, 5000)];
        assert_eq!(between_samples(&up, 64), 10_000);
        let steep = [(8, 100), (16, 200), (32, 2000)];
        assert_eq!(between_samples(&steep, 64), 4000);
    }

    /// A weight of 409,600 fp32 values kept, and scratch space growing by
    /// one fp32 copy of it per batch item (cuDNN's batch-split buffer for
    /// its gradient, with 400 bytes beside) grows so below
    /// `SPLIT_STOP_BATCH`, then takes its size in the largest sample;
    /// scratch space growing by another amount per item goes on growing.
    #[test]
    fn a_weight_gradients_batch_split_buffer_stops_growing() {
        let w = 1_638_400;
        let at = |b: u64| {
            let mut s = sample(b);
            let n = s.reqs.len();
            s.reqs.insert(0, Request::Alloc { key: 9, size: w, stream: 0 });
            s.keys.insert(0, 19);
            // The weight's gradient in bf16, then the buffer.
            s.reqs.push(Request::Alloc { key: 12, size: w / 2, stream: 0 });
            s.keys.push(25);
            for (k, size) in [(10, w * b + 400), (11, (w + 4096) * b + 400)] {
                s.reqs.extend([
                    Request::Alloc { key: k, size, stream: 0 },
                    Request::FreeRequested { key: k },
                    Request::FreeCompleted { key: k },
                ]);
                s.keys.extend([k * 2 + 1, 0, 0]);
            }
            assert_eq!(s.reqs.len(), n + 8);
            s
        };
        let f = Fit::new(vec![at(8), at(16)]).unwrap();
        let size = |b: u64, k: u64| size_of(&f.requests_at(b), k);
        assert_eq!(size(32, 10), w * 32 + 400);
        assert_eq!(size(127, 10), w * 127 + 400);
        assert_eq!(size(128, 10), w * 16 + 400);
        assert_eq!(size(512, 10), w * 16 + 400);
        assert_eq!(size(128, 11), (w + 4096) * 128 + 400);
        assert_eq!(size(128, 9), w);
    }
}

/// Recorded without call stacks (`_record_memory_history(context=None)`, or
/// `"state"`, what PyTorch 2.11 users record to keep checkpointing alive),
/// the same samples align by stream, order and size alone and predict the
/// same peaks: exactly PyTorch's for the transformers, the same replays for
/// ResNet-50's workspaces.
#[cfg(test)]
mod without_stacks {
    use super::*;

    fn sample(model: &str, batch: u64, stacks: bool) -> Sample {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("tests/fixtures/fit/{model}_b{batch}.pickle.gz"));
        let t = crate::trace::load(&path).unwrap();
        let none: Vec<Vec<Frame>> = Vec::new();
        let d = &t.devices[0];
        let release = crate::replay::session::ReleaseAsk::of(&t, None);
        Sample::new(
            batch,
            d,
            if stacks { &t.stacks } else { &none },
            &t.annotations,
            &AllocatorConfig::default(),
            &release,
            true,
        )
        .unwrap()
    }

    #[test]
    fn samples_without_stacks_predict_what_samples_with_them_do() {
        let target = Target { device_total: crate::device::DEFAULT_DEVICE_TOTAL, context: 0, limit: None };
        for (model, a, b, at) in
            [("gpt2", 2, 4, [8, 16, 32]), ("bert", 2, 4, [8, 16, 32]), ("resnet50", 8, 16, [32, 64, 128])]
        {
            let with = Fit::new(vec![sample(model, a, true), sample(model, b, true)]).unwrap();
            let without = Fit::new(vec![sample(model, a, false), sample(model, b, false)]).unwrap();
            assert!(with.report.call_stacks && !without.report.call_stacks);
            assert_eq!(with.report.aligned, without.report.aligned, "{model}");
            for batch in at {
                let (p, q) = (
                    with.predict(batch, &AllocatorConfig::default(), &target),
                    without.predict(batch, &AllocatorConfig::default(), &target),
                );
                assert_eq!(
                    (p.allocated_peak_bytes, p.reserved_peak_bytes),
                    (q.allocated_peak_bytes, q.reserved_peak_bytes),
                    "{model} at batch {batch}"
                );
            }
        }
    }
}

#[cfg(test)]
mod judging {
    use super::*;

    fn report(aligned: usize, self_check: Vec<(u64, f64, f64)>) -> FitReport {
        FitReport {
            requests: 1000,
            aligned,
            unaligned_elsewhere: 0,
            scaling: 0,
            workspaces: 0,
            nonlinear: 0,
            call_stacks: true,
            self_check,
        }
    }

    #[test]
    fn too_few_aligned_or_a_self_check_far_off_refuses_and_a_little_off_warns() {
        assert!(report(799, vec![]).judge().unwrap_err().to_string().contains("only 799 of 1000 requests align"));
        assert_eq!(report(800, vec![(2, 0.0, 0.0), (4, -0.01, 0.05)]).judge().unwrap(), Vec::<String>::new());
        let w = report(1000, vec![(2, 0.0, 0.0), (4, 0.0101, 0.0)]).judge().unwrap();
        assert_eq!(w.len(), 1);
        assert!(w[0].starts_with("the fit replays its own sample at batch 4 +1.01% off in peak allocated"), "{w:?}");
        assert_eq!(report(1000, vec![(8, 0.0, -0.051)]).judge().unwrap().len(), 1);
        let e = report(1000, vec![(2, -0.0501, 0.0)]).judge().unwrap_err();
        assert!(matches!(e, FitError::NotOneProgram(_)));
        let e = e.to_string();
        assert!(e.contains("-5.01% off in peak allocated") && e.contains("do not describe one program"), "{e}");
        assert!(report(1000, vec![(2, 0.0, 0.1001)]).judge().is_err());
    }
}

/// How far a prediction reaches beyond the samples, and what real runs at
/// that reach measured (docs/user/fit.md "Reach"): from samples at batch 8 and
/// 16, EfficientNet-B0, MobileNetV3-L and DenseNet-121 on the H200 came out
/// with peak reserved up to 3.3% low at 4 times the largest sample, 4.9% at
/// 8 and 6.2% at 16, and EfficientNet-B0 in fp32 7.0% high at 8 (cuDNN
/// picks other algorithms, with other workspaces, at large batches: there
/// three backward workspaces of 34 to 91 MB at 16 took under 2 MB at 128). The largest batch under 16 GiB came out exact up to
/// 12 times the largest sample (DenseNet-121 fp32, EfficientNet-B0 fp32)
/// and within 2.2% beyond, either way (EfficientNet-B0 with
/// `cudnn.benchmark`: 366 where real runs reach 374; MobileNetV3-L: 740
/// where they reach 728). A third sample at half the farthest batch brings
/// the prediction back within 0.2%.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Reach {
    /// The farthest batch asked about (a prediction or the largest batch
    /// found), over the largest sample's.
    pub(crate) times: f64,
    pub(crate) largest_sample: u64,
    pub(crate) farthest: u64,
    /// The largest error in peak reserved real runs showed at this reach
    /// (a fraction; predictions came out within it, above or below).
    pub(crate) measured_reserved_error: f64,
    /// The same for the largest batch under a limit (predictions came out
    /// within it of the real one, above or below).
    pub(crate) measured_largest_error: f64,
    /// The batch a third sample should run at to settle it.
    pub(crate) third_sample: u64,
}

/// Reach at which the measured error in peak reserved passes 5%: beyond
/// it, `Reach` is said.
pub(crate) const REACH_SAID: f64 = 4.0;

/// (times the largest sample, the largest error in peak reserved measured
/// at up to that reach); beyond the last, the last.
const REACH_MEASURED: [(f64, f64); 3] = [(4.0, 0.033), (8.0, 0.071), (16.0, 0.071)];

/// The same for the largest batch under 16 GiB: exact up to 12 times the
/// samples, within 2.2% either way beyond (tests/fixtures/fit/reach/truth.json).
const REACH_LARGEST_MEASURED: [(f64, f64); 2] = [(12.0, 0.0), (64.0, 0.022)];

impl Reach {
    /// The reach of predictions at `batches` and of the largest batch found
    /// (`max_batch`, ignored at the search's cap), from samples at
    /// `samples` with `workspaces` requests of cuDNN's kind; none within
    /// `REACH_SAID` times the largest sample, or without workspaces (every
    /// request then scales exactly: the transformers' peaks came out to the
    /// byte at 16 times their samples).
    pub(crate) fn of(samples: &[u64], batches: &[u64], max_batch: u64, cap: u64, workspaces: usize) -> Option<Reach> {
        if workspaces == 0 {
            return None;
        }
        let largest_sample = samples.iter().copied().max()?.max(1);
        let farthest = batches.iter().copied().chain((max_batch < cap).then_some(max_batch)).max()?;
        let times = farthest as f64 / largest_sample as f64;
        if times <= REACH_SAID {
            return None;
        }
        let at = |table: &[(f64, f64)]| table.iter().find(|(r, _)| times <= *r).or(table.last()).map_or(0.0, |x| x.1);
        let (measured_reserved_error, measured_largest_error) = (at(&REACH_MEASURED), at(&REACH_LARGEST_MEASURED));
        // Half the farthest: from there the farthest is twice a sample away.
        let third_sample = (farthest / 2).max(largest_sample * 2);
        Some(Reach { times, largest_sample, farthest, measured_reserved_error, measured_largest_error, third_sample })
    }

    /// One paragraph for `fit`'s summary.
    pub(crate) fn describe(&self, sample_batches: &[u64]) -> String {
        let mut with: Vec<u64> = sample_batches.to_vec();
        with.push(self.third_sample);
        with.sort_unstable();
        with.dedup();
        let largest = if self.measured_largest_error > 0.0 {
            format!(
                "the largest batch under a limit within {:.1}% of the real one (above or below)",
                self.measured_largest_error * 100.0
            )
        } else {
            "the largest batch under a limit exact".to_string()
        };
        format!(
            "reach: batch {} is {:.0} times the largest sample ({}); from samples that far below, real runs' peak reserved came out within {:.1}% of the prediction (cuDNN picks other workspaces at large batches), {largest} (docs/user/fit.md \"Reach\"). A third sample at batch {} settles it: --batches {}",
            self.farthest,
            self.times,
            self.largest_sample,
            self.measured_reserved_error * 100.0,
            self.third_sample,
            with.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(",")
        )
    }
}
