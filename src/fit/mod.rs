//! Will it fit? A training run's peak allocated and reserved memory at any
//! batch size, and the largest batch under a limit, from snapshots of a few
//! steps at two (or more) small batches (docs/fit.md).
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

use std::collections::HashMap;

use serde::Serialize;

use crate::alloc::{AllocatorConfig, Kind};
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
    /// PyTorch's peaks in the recording (for the self-check).
    pub(crate) recorded_allocated_peak: u64,
    pub(crate) recorded_reserved_peak: u64,
}

impl Sample {
    /// The requests of `dev` (a snapshot recorded from process start),
    /// with the `empty_cache()` calls an exact replay infers.
    pub fn new(
        batch: u64,
        dev: &DeviceTrace,
        stacks: &[Vec<Frame>],
        config: &AllocatorConfig,
    ) -> Result<Sample, String> {
        if batch == 0 {
            return Err("a batch of 0".into());
        }
        let want = Want {
            config: config.clone(),
            changed: false,
            device_total: crate::cli::DEFAULT_DEVICE_TOTAL,
            memory_limit: None,
            keep_events: false,
            stop_at: None,
            context_bytes: 0,
            recorded_state: true,
        };
        let s = Session::open(dev, stacks, &want)?;
        let at = if s.exact.divergence.is_none() { s.exact.empty_cache_at.clone() } else { Vec::new() };
        let st = s.exact.allocator.stats();
        let (ap, rp) = (st.get(Kind::AllocatedBytes, 0).peak as u64, st.get(Kind::ReservedBytes, 0).peak as u64);
        let reqs = requests(&dev.events, &at);
        // Streams by order of first use: handles differ between processes.
        let mut stream_rank: HashMap<u64, u64> = HashMap::new();
        let mut stack_hash: HashMap<u32, u64> = HashMap::new();
        let mut alloc_i = 0usize;
        let mut anchor = 0u64;
        let alloc_stacks: Vec<u32> = dev
            .events
            .iter()
            .zip(&dev.stacks)
            .filter(|(e, _)| e.action == crate::alloc::Action::Alloc)
            .map(|(_, &s)| s)
            .collect();
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
        Ok(Sample { batch, reqs, keys, recorded_allocated_peak: ap, recorded_reserved_peak: rp })
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
        }
    }
}

/// A fitted training run.
#[derive(Debug, Clone)]
pub(crate) struct Fit {
    /// The skeleton: the largest sample's requests.
    skeleton: Vec<Request>,
    /// Per skeleton request index of an `Alloc`: its size model.
    sizes: HashMap<usize, Size>,
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
    /// With three or more samples: aligned requests whose sizes are not on a
    /// line (more than 1% off it).
    pub(crate) nonlinear: usize,
    /// The replay of each sample's own requests, against its recorded peaks:
    /// (batch, allocated error, reserved error) as fractions.
    pub(crate) self_check: Vec<(u64, f64, f64)>,
}

/// One prediction.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Prediction {
    pub(crate) batch: u64,
    pub(crate) allocated_peak_bytes: u64,
    pub(crate) reserved_peak_bytes: u64,
    pub(crate) fits: bool,
    pub(crate) ooms: u64,
    pub(crate) num_alloc_retries: i64,
}

impl Prediction {
    /// Peaks from one run, whether it fits from another (the same, or the
    /// run under the limit).
    fn of(batch: u64, peaks: &crate::alloc::DeviceStats, fits: &crate::alloc::DeviceStats) -> Prediction {
        Prediction {
            batch,
            allocated_peak_bytes: peaks.get(Kind::AllocatedBytes, 0).peak as u64,
            reserved_peak_bytes: peaks.get(Kind::ReservedBytes, 0).peak as u64,
            fits: fits.num_ooms == 0,
            ooms: fits.num_ooms as u64,
            num_alloc_retries: fits.num_alloc_retries,
        }
    }
}

/// The device a prediction runs on.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) device_total: u64,
    /// CUDA context and other non-PyTorch memory on the device.
    pub(crate) context: u64,
    /// `set_per_process_memory_fraction(limit / total)`, in bytes.
    pub(crate) limit: Option<u64>,
}

impl Fit {
    /// Aligns the samples (at least two, different batches) and fits each
    /// request's size.
    pub fn new(mut samples: Vec<Sample>) -> Result<Fit, String> {
        samples.sort_by_key(|s| s.batch);
        if samples.len() < 2 || samples.windows(2).any(|w| w[0].batch == w[1].batch) {
            return Err("fit needs snapshots at two or more different batch sizes".into());
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
        let mut sizes = HashMap::new();
        let (mut aligned, mut scaling, mut nonlinear) = (0, 0, 0);
        for (&i, pts) in &points {
            let size = if pts.len() == samples.len() {
                aligned += 1;
                let m = fit_line(pts);
                if let Size::Linear { k, .. } = m {
                    if k.abs() > 0.0 {
                        scaling += 1;
                    }
                }
                if pts.len() > 2 && pts.iter().any(|&(b, s)| (m.at(b) as f64 - s as f64).abs() > 0.01 * s as f64) {
                    nonlinear += 1;
                }
                m
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
            nonlinear,
            self_check: Vec::new(),
        };
        Ok(Fit { skeleton: sk.reqs.clone(), sizes, samples: samples.iter().map(|s| s.batch).collect(), report })
    }

    /// The skeleton's requests with their sizes at `batch`.
    pub(crate) fn requests_at(&self, batch: u64) -> Vec<Request> {
        self.skeleton
            .iter()
            .enumerate()
            .map(|(i, r)| match *r {
                Request::Alloc { key, size, stream } => {
                    let size = self.sizes.get(&i).map_or(size, |m| m.at(batch));
                    Request::Alloc { key, size, stream }
                }
                other => other,
            })
            .collect()
    }

    /// Replays the requests at `batch` under `config` with `limit`.
    fn run(
        &self,
        batch: u64,
        config: &AllocatorConfig,
        target: &Target,
        limit: Option<u64>,
    ) -> crate::alloc::DeviceStats {
        let sim = Sim::new("simulated device", target.device_total, target.context).with_descending_addresses();
        run_requests_on(&self.requests_at(batch), config.clone(), sim, limit).allocator.stats().clone()
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
        let st = self.run(batch, config, target, None);
        let limited = target.limit.map(|l| self.run(batch, config, target, Some(l)));
        Prediction::of(batch, &st, limited.as_ref().unwrap_or(&st))
    }

    /// The largest batch that runs without an OOM (0: not even batch 1),
    /// searched by doubling then bisection, at most `max` (a run that still
    /// fits there reports `max`).
    pub(crate) fn max_batch(&self, config: &AllocatorConfig, target: &Target, max: u64) -> u64 {
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
