//! `fit`: peaks at other batch sizes and the largest batch that fits, from
//! snapshots of a few steps at two or more small batches (docs/user/fit.md).

use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{anyhow, Result};
use clap::Args;

use super::args::{parse_conf, InputError, MemoryCap};
use super::io::load_with_progress;
use crate::alloc::AllocatorConfig;
use crate::analysis::human_bytes;
use crate::device::{CUDA_CONTEXT_BYTES, DEFAULT_DEVICE_TOTAL};
use crate::fit::report::{CategoryLine, FitJson, NoGpuJson, SampleRef};
use crate::fit::{Fit, Prediction, Sample, Target, MAX_BATCH};

#[derive(Args, Debug, Clone)]
pub struct FitArgs {
    /// Snapshots of a few training steps, each as PATH@BATCH (two or more
    /// batch sizes, each from process start).
    #[arg(value_name = "SNAPSHOT@BATCH")]
    pub(crate) samples: Vec<String>,
    #[command(flatten)]
    pub(crate) torch: super::args::TorchArg,
    /// Record the samples instead: run the command after `--` once per batch
    /// (`{batch}` in it replaced), recording PyTorch's memory history.
    #[arg(long = "batches", value_name = "B1,B2,...", value_delimiter = ',')]
    pub(crate) record_batches: Vec<u64>,
    /// Record without a GPU: the command runs with CUDA faked (no GPU or
    /// driver needed), the requests PyTorch's allocator would get are
    /// recorded at the --batch sizes (and --batches, default 2 and 4) and
    /// at the largest batch found.
    #[arg(long = "no-gpu")]
    pub(crate) no_gpu: bool,
    /// With --batches: optimizer steps to record before the run is stopped.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub(crate) steps: u32,
    /// With --batches: keep the recorded snapshots here (default: a
    /// temporary directory, named on stderr).
    #[arg(long, value_name = "DIR")]
    pub(crate) record_dir: Option<PathBuf>,
    /// The training command for --batches, with `{batch}` where the batch size goes.
    #[arg(last = true, value_name = "CMD")]
    pub(crate) command: Vec<String>,
    /// A batch size to predict (repeatable; default: 2, 4 and 8 times the largest sample).
    #[arg(long = "batch", value_name = "N")]
    pub(crate) targets: Vec<u64>,
    #[command(flatten)]
    pub(crate) cap: MemoryCap,
    /// Also search the largest batch under this allocator config (repeatable).
    #[arg(long = "alloc-conf", value_name = "CONF")]
    pub(crate) alloc_confs: Vec<String>,
    /// Print one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
    /// totalGlobalMem of the device to predict for.
    #[arg(long, value_name = "BYTES", value_parser = super::args::parse_capacity, default_value_t = DEFAULT_DEVICE_TOTAL)]
    pub(crate) device_total: u64,
    /// Bytes on the device that are not PyTorch's (the CUDA context).
    #[arg(long, value_name = "BYTES", value_parser = super::args::parse_size, default_value_t = CUDA_CONTEXT_BYTES)]
    pub(crate) context: u64,
    /// The largest batch the search tries.
    #[arg(long, value_name = "N", default_value_t = 1 << 16)]
    pub(crate) max_batch: u64,
}

fn sample_of(spec: &str) -> Result<(PathBuf, u64)> {
    let (path, batch) = spec
        .rsplit_once('@')
        .ok_or_else(|| anyhow!(InputError(format!("{spec}: expected SNAPSHOT@BATCH, e.g. gpt2_b2.pickle.gz@2"))))?;
    let batch: u64 =
        batch.parse().ok().filter(|b| (1..=MAX_BATCH).contains(b)).ok_or_else(|| {
            anyhow!(InputError(format!("{spec}: the batch must be an integer from 1 to {MAX_BATCH}")))
        })?;
    Ok((PathBuf::from(path), batch))
}

/// History entries the hook keeps at most: three steps of the models we
/// recorded take 5,000–40,000; a run past this wraps, and `fit` refuses a
/// wrapped window rather than predict from part of a step.
const RECORD_MAX_ENTRIES: u64 = 2_000_000;

/// Runs the command once per batch with memory history recorded; returns
/// the samples as SNAPSHOT@BATCH. The hook and the snapshots are written
/// in a fresh private directory (docs/design/security.md): a name another user
/// could guess is never reused, and nothing is written through a link.
fn record_samples(args: &FitArgs, batches: &[u64]) -> Result<Vec<String>> {
    let flag = if args.no_gpu { "--no-gpu" } else { "--batches" };
    if args.command.is_empty() {
        return Err(anyhow!(InputError(format!("{flag} needs the training command after `--`"))));
    }
    if !args.no_gpu && (args.record_batches.len() < 2 || args.record_batches.contains(&0)) {
        return Err(anyhow!(InputError("--batches needs two or more positive batch sizes, e.g. --batches 2,4".into())));
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(b) = args.record_batches.iter().find(|&&b| !seen.insert(b)) {
        return Err(anyhow!(InputError(format!("--batches names batch {b} twice: each batch is recorded once"))));
    }
    if !args.command.iter().any(|a| a.contains("{batch}")) {
        return Err(anyhow!(InputError("the command must say where the batch goes: {batch}".into())));
    }
    let record_dir = match &args.record_dir {
        Some(d) => {
            let d = std::path::absolute(d).map_err(|e| anyhow!(InputError(format!("{}: {e}", d.display()))))?;
            crate::private::ensure_private_dir(&d)
                .or_else(|e| if d.is_dir() && !d.is_symlink() { Ok(()) } else { Err(e) })
                .map_err(|e| anyhow!(InputError(format!("--record-dir {}: {e}", d.display()))))?;
            Some(d)
        }
        None => None,
    };
    // Our own private directory (where the live view's publishers write):
    // one another user made first is refused, never used.
    let user = std::path::absolute(crate::monitor::publisher::default_dir())?;
    let (user, note) = crate::private::own_dir(&user, crate::private::dir_named_by_environment()).map_err(|e| {
        anyhow!(InputError(format!("{e} (set XDG_RUNTIME_DIR or GPUMEM_TOP_DIR to a directory of your own)")))
    })?;
    if let Some(n) = note {
        eprintln!("gpumem-top fit: {n}");
    }
    let work =
        crate::private::fresh_dir(&user, "fit").map_err(|e| anyhow!(InputError(format!("{}: {e}", user.display()))))?;
    let result = record_into(args, batches, &work, record_dir.as_deref());
    let _ = std::fs::remove_dir_all(work.join("hook"));
    match &result {
        Ok(_) if record_dir.is_some() => {
            let _ = std::fs::remove_dir_all(&work);
        }
        Ok(_) => eprintln!("gpumem-top fit: snapshots in {}", work.display()),
        Err(_) => {
            // What was recorded before the failure stays, and is named.
            let kept = std::fs::read_dir(&work).map(|d| d.count()).unwrap_or(0);
            if kept == 0 {
                let _ = std::fs::remove_dir_all(&work);
            } else {
                eprintln!("gpumem-top fit: the snapshots recorded so far are in {}", work.display());
            }
        }
    }
    result
}

/// `record_samples`' runs, in `work` (fresh and private); the snapshots
/// end in `record_dir` when given (created there, never replacing a file).
fn record_into(
    args: &FitArgs,
    batches: &[u64],
    work: &std::path::Path,
    record_dir: Option<&std::path::Path>,
) -> Result<Vec<String>> {
    use crate::private::create_new;
    use std::os::unix::fs::DirBuilderExt;
    // `work` is fresh and private: a fixed name inside it is safe (each
    // call of a --no-gpu fit makes its own).
    let hook = work.join("hook");
    std::fs::DirBuilder::new().mode(0o700).create(&hook)?;
    if args.no_gpu {
        create_new(&hook.join("sitecustomize.py"))?.write_all(crate::launch::NOGPU_SITECUSTOMIZE.as_bytes())?;
        create_new(&hook.join("gpumem_top_nogpu.py"))?.write_all(crate::launch::NOGPU_RECORDER.as_bytes())?;
        // cuDNN's workspaces where they were measured on the H200.
        create_new(&hook.join("cudnn_h200.json"))?.write_all(crate::workload::cudnn::TABLE_JSON.as_bytes())?;
    } else {
        create_new(&hook.join("sitecustomize.py"))?.write_all(crate::launch::RECORD_SITECUSTOMIZE.as_bytes())?;
        create_new(&hook.join("gpumem_top_publish.py"))?.write_all(crate::launch::PUBLISHER.as_bytes())?;
    }
    let path = crate::launch::python_path(&hook);
    let mut out = Vec::new();
    for &b in batches {
        let snap = work.join(format!("batch{b}.pickle"));
        let argv: Vec<String> = args.command.iter().map(|a| a.replace("{batch}", &b.to_string())).collect();
        eprintln!("gpumem-top fit: batch {b}: {}", argv.join(" "));
        // The command's output goes to our stderr: stdout is for the
        // prediction (one JSON object with --json).
        let to_stderr = std::io::stderr().as_fd().try_clone_to_owned().map(std::process::Stdio::from);
        let mut cmd = std::process::Command::new(&argv[0]);
        if let Ok(e) = to_stderr {
            cmd.stdout(e);
        }
        if args.no_gpu {
            // The program must not reach a GPU this machine may have: what
            // it would allocate is the recorder's to see.
            cmd.env("CUDA_VISIBLE_DEVICES", "");
        }
        let status = cmd
            .args(&argv[1..])
            .env("PYTHONPATH", &path)
            .env("GPUMEM_TOP_RECORD_OUT", &snap)
            .env("GPUMEM_TOP_RECORD_STEPS", args.steps.to_string())
            .env("GPUMEM_TOP_RECORD_MAX_ENTRIES", RECORD_MAX_ENTRIES.to_string())
            .status()
            .map_err(|e| anyhow!(InputError(format!("{}: {e}", argv[0]))))?;
        let failed = std::fs::read_to_string(work.join(format!("batch{b}.pickle.error"))).ok();
        if let Some(line) = failed.as_deref().and_then(|l| l.lines().next()).filter(|_| args.no_gpu) {
            return Err(anyhow!(InputError(format!(
                "batch {b}: the command stopped under the fake device ({status}): {}",
                crate::trace::printable::escape(line)
            ))));
        }
        if !snap.exists() {
            return Err(anyhow!(
                "batch {b}: the command ({status}) wrote no snapshot; does it import torch and use CUDA?"
            ));
        }
        // Several processes of the command (ranks, workers) that used
        // CUDA: the first to finish wrote `snap`, each other its own.
        let prefix = format!("batch{b}.pickle.");
        let others =
            std::fs::read_dir(work)?.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(&prefix)).count();
        if others > 0 {
            eprintln!(
                "gpumem-top fit: batch {b}: {} processes of the command recorded; the first to finish is used (the others are {}.PID)",
                others + 1,
                snap.display()
            );
        }
        let used = match record_dir {
            Some(d) => {
                let to = d.join(format!("batch{b}.pickle"));
                let mut dst = create_new(&to).map_err(|e| {
                    anyhow!(InputError(format!("{}: {e}; choose another --record-dir or move it away", to.display())))
                })?;
                std::io::copy(&mut std::fs::File::open(&snap)?, &mut dst)?;
                to
            }
            None => snap,
        };
        out.push(format!("{}@{b}", used.display()));
    }
    Ok(out)
}

/// Every batch the command line names: 1 to `MAX_BATCH`.
fn check_batches(args: &FitArgs) -> Result<()> {
    let named = args.targets.iter().map(|&b| ("--batch", b));
    let named = named.chain(args.record_batches.iter().map(|&b| ("--batches", b)));
    for (flag, b) in named.chain(std::iter::once(("--max-batch", args.max_batch))) {
        if !(1..=MAX_BATCH).contains(&b) {
            return Err(anyhow!(InputError(format!("{flag} {b}: a batch must be from 1 to {MAX_BATCH}"))));
        }
    }
    Ok(())
}

/// Each SNAPSHOT@BATCH read and replayed as a sample; their names, and the
/// first one's recorded allocator config. Samples that cannot be right are
/// refused, not fitted.
fn read_samples(specs: &[String], args: &FitArgs) -> Result<(Vec<Sample>, Vec<String>, AllocatorConfig, NoGpuNotes)> {
    let mut samples = Vec::new();
    let mut notes: NoGpuNotes = None;
    let mut recorded_conf: Option<AllocatorConfig> = None;
    let mut names = Vec::new();
    for spec in specs {
        let (path, batch) = sample_of(spec)?;
        let trace = load_with_progress(&path)?;
        let dev = crate::replay::open::device(&trace, &path.display().to_string(), None)?;
        let conf = trace.settings.as_ref().map(|s| s.config()).unwrap_or_default();
        recorded_conf.get_or_insert(conf.clone());
        let release = crate::replay::session::ReleaseAsk::of(&trace, args.torch.release);
        let recorded_state = trace.format != crate::trace::TraceFormat::NoGpu;
        if !recorded_state {
            // The largest batch's recording says the most (later samples
            // are larger: `check_order`).
            notes = Some(trace.nogpu_notes.clone());
        }
        let s = Sample::new(batch, dev, &trace.stacks, &trace.annotations, &conf, &release, recorded_state)
            .map_err(|e| anyhow!(e).context(path.display().to_string()))?;
        names.push(path.display().to_string());
        samples.push(s);
    }
    crate::fit::check_order(&samples, &names)?;
    Ok((samples, names, recorded_conf.unwrap_or_default(), notes))
}

/// The samples read and fitted, with the self-check of each sample's own
/// batch against its recorded peaks.
fn fit_samples(specs: &[String], args: &FitArgs) -> Result<Fitted> {
    let (samples, names, base, notes) = read_samples(specs, args)?;
    let limit = args.cap.limit(args.device_total);
    let target = Target { device_total: args.device_total, context: args.context, limit };
    // The replay of each sample's own requests, against PyTorch's peaks.
    let mut self_check = Vec::new();
    let fitted = Fit::new(samples.clone()).and_then(|mut fitted| {
        for s in &samples {
            let p = fitted.predict(s.batch, &base, &Target { limit: None, ..target.clone() });
            let err = |got: u64, want: u64| if want == 0 { 0.0 } else { got as f64 / want as f64 - 1.0 };
            self_check.push((
                s.batch,
                err(p.allocated_peak_bytes, s.recorded_allocated_peak),
                err(p.reserved_peak_bytes, s.recorded_reserved_peak),
            ));
        }
        fitted.report.self_check = std::mem::take(&mut self_check);
        let warnings = fitted.report.judge()?;
        Ok((fitted, warnings))
    });
    match fitted {
        Ok((fitted, warnings)) => Ok(Fitted { samples, names, base, fitted, warnings, notes, fell_back: false }),
        // Without a GPU the answers need no line through the samples:
        // each asked batch and the largest are recorded and replayed as
        // they are. What the samples could not say is said instead.
        Err(e) if args.no_gpu => {
            let last = samples.last().cloned().ok_or_else(|| anyhow!("no samples"))?;
            let warnings = vec![format!(
                "{e}; so every answer here stands on recordings alone: each asked batch, and the largest batch searched by recording batches from the largest sample up"
            )];
            Ok(Fitted { samples, names, base, fitted: Fit::recorded(last), warnings, notes, fell_back: true })
        }
        Err(e) => Err(e.into()),
    }
}

/// What `fit --no-gpu`'s recorder said it did or could not do (each with
/// how many times), where the samples are its recordings.
type NoGpuNotes = Option<Vec<(String, u64)>>;

/// The samples and their fit.
struct Fitted {
    samples: Vec<Sample>,
    names: Vec<String>,
    base: AllocatorConfig,
    fitted: Fit,
    warnings: Vec<String>,
    notes: NoGpuNotes,
    /// The samples could not be fitted (`--no-gpu` goes on with
    /// recordings alone).
    fell_back: bool,
}

/// The device a recording without a GPU stands for: the kernels'
/// workspaces the recorder adds were measured on one.
pub(crate) const NOGPU_DEVICE: &str = "NVIDIA H200";

/// What a recording without a GPU cannot see (docs/user/fit.md "Without a
/// GPU"), said with every such prediction.
pub(crate) const NOGPU_NOT_SEEN: &[&str] = &[
    "memory taken outside PyTorch's caching allocator (custom CUDA extensions' own cudaMalloc, NCCL's buffers, the CUDA context beyond --context)",
    "cuDNN's convolution workspaces beyond the shapes measured on an H200 (ResNet-50's convolutions; the algorithm cuDNN picks is known only on the GPU): a network with other convolutions may peak higher by its largest workspace",
    "shapes that depend on the data on the GPU: the recorded steps' own shapes are used",
    "torch.compile and CUDA graphs: the eager program is recorded",
];

/// `--no-gpu`'s samples: --batches, default 2 and 4 (the asked batches
/// are recorded apart and replayed as they are).
fn nogpu_batches(args: &FitArgs) -> Vec<u64> {
    if args.record_batches.is_empty() {
        vec![2, 4]
    } else {
        args.record_batches.clone()
    }
}

pub fn fit(args: &FitArgs) -> Result<ExitCode> {
    args.cap.check()?;
    check_batches(args)?;
    let mut confs: Vec<(String, AllocatorConfig)> = Vec::new();
    for c in &args.alloc_confs {
        confs.push((c.clone(), parse_conf(c)?));
    }
    let limit = args.cap.limit(args.device_total);
    let target = Target { device_total: args.device_total, context: args.context, limit };
    let specs: Vec<String> = if args.no_gpu {
        if !args.samples.is_empty() {
            return Err(anyhow!(InputError(
                "--no-gpu records its own samples: give the command after `--`, not snapshots".into()
            )));
        }
        record_samples(args, &nogpu_batches(args))?
    } else if args.record_batches.is_empty() {
        if args.samples.len() < 2 {
            return Err(anyhow!(InputError(
                "fit needs two or more SNAPSHOT@BATCH, or --batches B1,B2 -- CMD to record them".into()
            )));
        }
        args.samples.clone()
    } else {
        record_samples(args, &args.record_batches)?
    };
    let Fitted { samples, names, base, fitted, warnings, notes, fell_back } = fit_samples(&specs, args)?;
    let largest = *fitted.samples.last().unwrap_or(&1);
    let batches: Vec<u64> = if args.targets.is_empty() {
        [2, 4, 8].iter().map(|k| largest.saturating_mul(*k).min(MAX_BATCH)).collect()
    } else {
        args.targets.clone()
    };
    // Without a GPU a recording costs no device memory: each asked batch
    // is recorded and replayed as it is, and the largest batch the samples
    // point to is confirmed by recordings at it and beside it.
    let mut direct = Recordings::new(args, &samples);
    let predict = |b: u64, direct: &mut Recordings| -> Result<Prediction> {
        if args.no_gpu && !fitted.samples.contains(&b) {
            Ok(direct.fit(b)?.predict(b, &base, &target))
        } else {
            Ok(fitted.predict(b, &base, &target))
        }
    };
    let mut predictions = Vec::with_capacity(batches.len());
    for &b in &batches {
        predictions.push(predict(b, &mut direct)?);
    }
    // What grows with the batch: each category's line through the samples'
    // peaks (docs/user/fit.md "Categories").
    let category_fits = crate::fit::CategoryFit::of(&samples);
    // Per config: the largest batch under it, and the peaks there. Without
    // a GPU each is confirmed by recordings (shared between configs): the
    // samples' answer is where the search starts, or the largest sample
    // where they could not be fitted.
    let sampled = samples.last().map_or(1, |s| s.batch);
    let largest = |conf: &AllocatorConfig, direct: &mut Recordings| -> Result<(u64, Option<Prediction>)> {
        let guess = if fell_back { sampled } else { fitted.max_batch(conf, &target, args.max_batch) };
        if !args.no_gpu {
            return Ok((guess, (guess > 0).then(|| fitted.predict_limited(guess, conf, &target))));
        }
        let mb = direct.confirm(guess, conf, &target)?;
        let at = if mb > 0 { Some(direct.fit(mb)?.predict_limited(mb, conf, &target)) } else { None };
        Ok((mb, at))
    };
    let mut by_config: Vec<(String, u64, Option<Prediction>)> = Vec::new();
    for (label, conf) in std::iter::once((String::new(), base.clone())).chain(confs) {
        let (mb, at) = largest(&conf, &mut direct)?;
        by_config.push((label, mb, at));
    }
    let max_batch = by_config[0].1;
    // The setting tune recommends for the run at its largest batch (the
    // predicted requests there, replayed under every setting), and the
    // largest batch under it beside the recorded one (docs/user/tune.md);
    // without a GPU, that batch's own recording.
    let tuned_at = max_batch.max(fitted.samples.last().copied().unwrap_or(1));
    let tuned_reqs = if args.no_gpu && max_batch > 0 {
        direct.fit(max_batch)?.requests_at(max_batch)
    } else {
        fitted.requests_at(tuned_at)
    };
    let search = crate::tune::search(&tuned_reqs, &base.source, args.device_total, args.context, limit, None);
    let recommended = search.best().alloc_conf.clone();
    let new = recommended != base.source && !by_config.iter().any(|(l, _, _)| *l == recommended);
    if new && search.best().beats(&search.recorded) {
        if let Ok(conf) = AllocatorConfig::parse(&recommended) {
            let (mb, at) = largest(&conf, &mut direct)?;
            by_config.push((recommended.clone(), mb, at));
        }
    }

    let o = Outcome {
        args,
        samples: &samples,
        names: &names,
        fitted: &fitted,
        warnings: &warnings,
        limit,
        batches: &batches,
        predictions: &predictions,
        category_fits: &category_fits,
        by_config: &by_config,
        max_batch,
        base: &base,
        recommended: &recommended,
        notes: notes.as_deref(),
        recorded: direct.at.keys().copied().collect(),
    };
    let mut so = super::io::text_out();
    if args.json {
        write_json(&mut so, &o)?;
    } else {
        write_summary(&mut so, &o)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// What a fit found, for its JSON or its summary.
struct Outcome<'a> {
    args: &'a FitArgs,
    samples: &'a [Sample],
    names: &'a [String],
    fitted: &'a Fit,
    warnings: &'a [String],
    limit: Option<u64>,
    batches: &'a [u64],
    predictions: &'a [Prediction],
    category_fits: &'a [crate::fit::CategoryFit],
    by_config: &'a [(String, u64, Option<Prediction>)],
    max_batch: u64,
    base: &'a AllocatorConfig,
    recommended: &'a str,
    /// `--no-gpu`'s recorder's notes (None: samples from a GPU).
    notes: Option<&'a [(String, u64)]>,
    /// Batches recorded to be replayed as they are (`--no-gpu`).
    recorded: Vec<u64>,
}

/// `--no-gpu`'s recordings of single batches, each replayed as it is.
struct Recordings<'a> {
    args: &'a FitArgs,
    at: BTreeMap<u64, Fit>,
}

impl<'a> Recordings<'a> {
    /// With the samples' own recordings: a batch asked for that is a
    /// sample's is that recording (made again it would meet the sample's
    /// file in --record-dir).
    fn new(args: &'a FitArgs, samples: &[Sample]) -> Recordings<'a> {
        let at = if args.no_gpu {
            samples.iter().map(|s| (s.batch, Fit::recorded(s.clone()))).collect()
        } else {
            BTreeMap::new()
        };
        Recordings { args, at }
    }

    /// The recording at `b`, made the first time it is asked for.
    fn fit(&mut self, b: u64) -> Result<&Fit> {
        if !self.at.contains_key(&b) {
            let spec = record_samples(self.args, &[b])?;
            let (mut s, ..) = read_samples(&spec, self.args)?;
            let sample = s.pop().ok_or_else(|| anyhow!("batch {b}: no recording"))?;
            self.at.insert(b, Fit::recorded(sample));
        }
        self.at.get(&b).ok_or_else(|| anyhow!("batch {b}: no recording"))
    }

    fn fits(&mut self, b: u64, conf: &AllocatorConfig, target: &Target) -> Result<bool> {
        Ok(self.fit(b)?.predict_limited(b, conf, target).fits)
    }

    /// The largest batch whose own recording fits, searched from `guess`
    /// (the samples' answer): up by doubling steps while it fits, then by
    /// bisection, each try a recording; at most `--max-batch`.
    fn confirm(&mut self, guess: u64, conf: &AllocatorConfig, target: &Target) -> Result<u64> {
        let max = self.args.max_batch;
        let (mut lo, mut hi) = (0u64, max.saturating_add(1));
        let start = guess.clamp(1, max);
        if self.fits(start, conf, target)? {
            lo = start;
            let mut step = 1u64;
            while lo < max {
                let c = lo.saturating_add(step).min(max);
                if self.fits(c, conf, target)? {
                    lo = c;
                    step = step.saturating_mul(2);
                } else {
                    hi = c;
                    break;
                }
            }
        } else {
            hi = start;
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.fits(mid, conf, target)? {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }
}

/// Whether the lines through each category's bytes at the samples' peaks
/// add up to the predicted peak at every predicted batch (within 5%). They
/// do not where the samples peak in different phases (a larger batch's
/// peak in the forward, a smaller one's at the optimizer step), and a table
/// that contradicts the prediction above it is left out, saying why.
fn categories_disagree(fits: &[crate::fit::CategoryFit], predictions: &[Prediction]) -> Option<String> {
    predictions.iter().find_map(|p| {
        let sum: u64 = fits.iter().map(|f| f.at(p.batch)).sum();
        let want = p.allocated_peak_bytes.max(1);
        ((sum as f64 / want as f64 - 1.0).abs() > 0.05).then(|| {
            format!(
                "a line through each category's bytes at the samples' peaks sums to {} at batch {}, not the predicted {}: the samples peak in different phases of a step, so per-category lines do not describe the predicted peak",
                human_bytes(sum),
                p.batch,
                human_bytes(p.allocated_peak_bytes)
            )
        })
    })
}

/// `fit --json`: one object, `predictions` and `max_batch` first (docs/user/json.md).
fn write_json(so: &mut impl Write, o: &Outcome) -> Result<()> {
    let Outcome {
        args,
        samples,
        names,
        fitted,
        warnings,
        limit,
        batches,
        predictions,
        category_fits,
        by_config,
        max_batch,
        base,
        recommended,
        notes,
        ref recorded,
    } = *o;
    let note = categories_disagree(category_fits, predictions);
    let out = FitJson {
        recommended_alloc_conf: recommended,
        predictions,
        max_batch,
        max_batch_by_config: by_config.iter().map(|(l, b, _)| (l.as_str(), *b)).collect(),
        peak_at_max_batch_by_config: by_config.iter().map(|(l, _, p)| (l.as_str(), p.clone())).collect(),
        samples: samples.iter().zip(names).map(|(s, n)| SampleRef { snapshot: n, batch: s.batch }).collect(),
        alloc_conf: &base.source,
        memory_limit_bytes: limit,
        device_total_bytes: args.device_total,
        context_bytes: args.context,
        alignment: &fitted.report,
        warnings,
        categories: match &note {
            Some(_) => Vec::new(),
            None => category_fits
                .iter()
                .map(|f| CategoryLine { fit: f, predicted_bytes: batches.iter().map(|&b| f.at(b)).collect() })
                .collect(),
        },
        categories_note: note,
        // Without a GPU every asked batch and the largest were recorded:
        // nothing is predicted beyond the samples.
        reach: crate::fit::Reach::of(&fitted.samples, batches, max_batch, args.max_batch, fitted.report.workspaces)
            .filter(|_| !args.no_gpu),
        no_gpu: notes.map(|n| NoGpuJson {
            assumed_device: NOGPU_DEVICE,
            recorder_notes: n.iter().map(|(w, c)| (w.as_str(), *c)).collect(),
            recorded_batches: recorded,
            not_seen: NOGPU_NOT_SEEN,
        }),
    };
    serde_json::to_writer(&mut *so, &out)?;
    writeln!(so)?;
    Ok(())
}

/// Below the predictions: what the spread of the draws is, and how far the
/// farthest batch reaches beyond the samples.
fn write_table_notes(
    so: &mut impl Write,
    ranged: bool,
    reach: Option<&crate::fit::Reach>,
    samples: &[u64],
) -> Result<()> {
    if ranged {
        // What the range is, and is not (docs/user/fit.md "Workspaces").
        writeln!(
            so,
            "spread of the draws: the lowest and highest peak reserved of the {} replays, each with the workspaces' sizes drawn within ±{}% of their fit; how far the workspaces alone move the peak, not a bound on the real one (docs/user/fit.md \"Measured\" gives the real runs' errors)",
            crate::fit::WORKSPACE_RUNS,
            crate::fit::WORKSPACE_SPREAD * 100.0
        )?;
    }
    if let Some(r) = reach {
        writeln!(so, "{}", r.describe(samples))?;
    }
    Ok(())
}

/// The predictions' table; whether it has the spread of the draws.
fn write_predictions(so: &mut impl Write, predictions: &[Prediction], lim: &str) -> Result<bool> {
    let ranged = predictions.iter().any(|p| p.runs > 1);
    let range_head = if ranged { format!("  {:>21}", "spread of the draws") } else { String::new() };
    writeln!(so, "\n{:>8}  {:>15}  {:>15}{range_head}  fits ({lim})", "batch", "peak allocated", "peak reserved")?;
    for p in predictions {
        let range = match (ranged, p.runs > 1) {
            (false, _) => String::new(),
            (true, false) => format!("  {:>21}", "(sampled)"),
            (true, true) => format!(
                "  {:>21}",
                format!(
                    "{}–{}",
                    human_bytes(p.reserved_peak_range_bytes[0]),
                    human_bytes(p.reserved_peak_range_bytes[1])
                )
            ),
        };
        writeln!(
            so,
            "{:>8}  {:>15}  {:>15}{range}  {}",
            p.batch,
            human_bytes(p.allocated_peak_bytes),
            human_bytes(p.reserved_peak_bytes),
            if p.fits {
                "yes".to_string()
            } else if p.runs > 1 {
                format!("no (out of memory in {} of {} replays)", p.runs_out_of_memory, p.runs)
            } else {
                format!("no ({} OOMs)", p.ooms)
            }
        )?;
    }
    Ok(ranged)
}

/// What the peak is by category, and which of it grows with the batch (a
/// line through the samples' peaks, per category); why not, where the
/// lines do not add up to the predictions.
fn write_categories(
    so: &mut impl Write,
    category_fits: &[crate::fit::CategoryFit],
    predictions: &[Prediction],
    batches: &[u64],
) -> Result<()> {
    if let (false, Some(why)) = (category_fits.is_empty(), categories_disagree(category_fits, predictions)) {
        writeln!(so, "\nwhat the peak is, by category: not shown: {why} (docs/user/fit.md, \"Categories\")")?;
    } else if !category_fits.is_empty() {
        let last = batches.last().copied().unwrap_or(1);
        writeln!(so, "\nwhat the peak is, by category (a line through the samples' peaks; docs/user/categories.md):")?;
        for f in category_fits {
            let samples_txt: Vec<String> =
                f.at_samples.iter().map(|(b, v)| format!("{} at {b}", human_bytes(*v))).collect();
            let growth = if f.bytes_per_batch_item.abs() * (last as f64) < 0.01 * f.fixed_bytes.abs().max(1.0) {
                "fixed".to_string()
            } else if f.bytes_per_batch_item < 0.0 {
                format!("−{} per batch item", human_bytes((-f.bytes_per_batch_item) as u64))
            } else {
                format!("{} per batch item", human_bytes(f.bytes_per_batch_item as u64))
            };
            writeln!(
                so,
                "  {:<16} {:<40} {growth:<24} → {} at {last}",
                f.category.plural(),
                samples_txt.join(", "),
                human_bytes(f.at(last))
            )?;
        }
    }
    Ok(())
}

/// Where the samples were recorded without a GPU: what was assumed, what
/// the recorder met, what it cannot see, and which batches were recorded
/// as asked.
fn write_nogpu(so: &mut impl Write, notes: Option<&[(String, u64)]>, recorded: &[u64]) -> Result<()> {
    let Some(n) = notes else {
        return Ok(());
    };
    let said: Vec<String> = n.iter().map(|(w, c)| format!("{w} ×{c}")).collect();
    writeln!(
        so,
        "recorded without a GPU: CUDA faked, the kernels' workspaces of an {NOGPU_DEVICE} (docs/user/fit.md \"Without a GPU\"){}",
        if said.is_empty() { String::new() } else { format!("; the recorder saw: {}", said.join(", ")) }
    )?;
    writeln!(so, "not seen without a GPU: {}", NOGPU_NOT_SEEN.join("; "))?;
    if !recorded.is_empty() {
        writeln!(
            so,
            "recorded as asked (each replayed as it is, not predicted from the samples): batch {}",
            recorded.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(", ")
        )?;
    }
    Ok(())
}

/// `fit`'s summary: the alignment, the self-check, the predictions, what
/// grows with the batch and the largest batch per allocator config.
fn write_summary(so: &mut impl Write, o: &Outcome) -> Result<()> {
    let Outcome {
        args,
        samples,
        fitted,
        warnings,
        limit,
        batches,
        predictions,
        category_fits,
        by_config,
        max_batch,
        base,
        recommended,
        notes,
        ref recorded,
        ..
    } = *o;
    let r = &fitted.report;
    writeln!(
        so,
        "gpumem-top fit: {} samples (batch {}); {} requests, {} aligned in every sample ({} change with the batch), {} only in smaller samples{}",
        samples.len(),
        fitted.samples.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(", "),
        r.requests,
        r.aligned,
        r.scaling,
        r.unaligned_elsewhere,
        if samples.len() > 2 { format!(", {} off a line", r.nonlinear) } else { String::new() }
    )?;
    write_nogpu(so, notes, recorded)?;
    if !r.call_stacks {
        writeln!(
            so,
            "the samples carry no call stacks (history recorded with context=None or \"state\"): requests were aligned by stream, order and size alone"
        )?;
    }
    if r.workspaces > 0 {
        writeln!(
            so,
            "{} of them are workspaces (freed at once, sizes not in proportion to the batch, as cuDNN's): between and beyond the samples their sizes are uncertain, so a prediction there is the mean of {} replays with each workspace's size drawn within ±{}% of its fit (docs/user/fit.md)",
            r.workspaces,
            crate::fit::WORKSPACE_RUNS,
            crate::fit::WORKSPACE_SPREAD * 100.0
        )?;
    }
    for (b, ea, er) in &r.self_check {
        writeln!(
            so,
            "self-check at batch {b}: peak allocated {:+.2}%, peak reserved {:+.2}% against the recording",
            ea * 100.0,
            er * 100.0
        )?;
    }
    for w in warnings {
        writeln!(so, "warning: {w}")?;
    }
    let lim = match limit {
        Some(l) => format!("memory limit {}", human_bytes(l)),
        None => format!("device {} less {} of context", human_bytes(args.device_total), human_bytes(args.context)),
    };
    let ranged = write_predictions(so, predictions, &lim)?;
    let reach = crate::fit::Reach::of(&fitted.samples, batches, max_batch, args.max_batch, fitted.report.workspaces)
        .filter(|_| !args.no_gpu);
    write_table_notes(so, ranged, reach.as_ref(), &fitted.samples)?;
    write_categories(so, category_fits, predictions, batches)?;
    let names: Vec<String> = by_config
        .iter()
        .map(|(label, _, _)| {
            if label.is_empty() {
                format!("{} (recorded)", if base.source.is_empty() { "default" } else { &base.source })
            } else if *label == recommended {
                format!("{label} (tune's pick)")
            } else {
                label.clone()
            }
        })
        .collect();
    let w = names.iter().map(|n| n.chars().count()).max().unwrap_or(0).max(40);
    writeln!(so, "\n{:<w$}  {:>13}  {:>15}", "allocator config", "largest batch", "peak reserved")?;
    for (name, (_, b, p)) in names.iter().zip(by_config) {
        writeln!(
            so,
            "{:<w$}  {:>13}  {:>15}",
            name,
            b,
            p.as_ref().map(|p| human_bytes(p.reserved_peak_bytes)).unwrap_or_else(|| "-".into())
        )?;
    }
    Ok(())
}
