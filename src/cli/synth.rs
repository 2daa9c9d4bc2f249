//! `gpumem-top synth`: a synthetic training loop through the caching
//! allocator, on the GPU (CUDA backend) or the simulated device.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{anyhow, Result};
use clap::{Args, ValueEnum};

use super::args::{parse_conf, InputError, MemoryCap};
use crate::alloc::{AllocatorConfig, CachingAllocator, Kind};
use crate::analysis::{fragmentation, peak_ratio};
use crate::device::{Cuda, Device, Sim};
use crate::workload::driver::{Driver, OnOom, Progress};
use crate::workload::report::{DeviceMaps, NvmlDevice, SynthFragmentation, SynthPeak, SynthReport};
use crate::workload::{Checkpoint, ModelKind, Optimizer, SynthSpec, Synthetic};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Backend {
    /// CUDA when libcuda and a GPU are present, else the simulated device.
    Auto,
    Cuda,
    Sim,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum CheckpointArg {
    Layer,
    Sqrt,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OptimizerArg {
    Sgd,
    Adam,
    Adamw,
}

#[derive(Args, Debug, Clone)]
pub struct SynthArgs {
    /// Draw without colour (also when NO_COLOR is set).
    #[arg(long)]
    pub(crate) no_color: bool,
    /// Where segment memory comes from.
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    pub(crate) backend: Backend,
    #[command(flatten)]
    pub(crate) torch: super::args::TorchArg,
    /// CUDA device index.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub(crate) device: usize,
    /// The model trained: an MLP, ResNet-50, GPT-2, BERT or a Llama-style
    /// decoder (grouped-query attention), each as Hugging Face or
    /// torchvision builds it (docs/user/synth.md).
    #[arg(long, value_enum, default_value_t = ModelKind::Gpt2)]
    pub(crate) model: ModelKind,
    /// Batch size (default: the calibration runs recorded on an H200 (measurements/calibration): resnet50 64, gpt2 8, bert 16, llama 4, mlp 1024).
    #[arg(long, value_name = "B")]
    pub(crate) batch: Option<u64>,
    /// Sequence length of the transformer models (default 1024; bert 512).
    #[arg(long, value_name = "S")]
    pub(crate) seq: Option<u64>,
    /// Transformer layers (gpt2 12, bert 12, llama 16) or MLP hidden layers (3).
    #[arg(long, value_name = "N")]
    pub(crate) layers: Option<u64>,
    /// Hidden size (gpt2/bert 768, llama 2048, mlp 4096).
    #[arg(long, value_name = "H")]
    pub(crate) hidden: Option<u64>,
    /// Attention heads (key/value heads of llama follow with --kv-heads).
    #[arg(long, value_name = "N")]
    pub(crate) heads: Option<u64>,
    /// Key/value heads (grouped-query attention; llama 8 by default, the
    /// others as many as --heads).
    #[arg(long, value_name = "N")]
    pub(crate) kv_heads: Option<u64>,
    /// Feed-forward width (default 4 × hidden; llama 8192).
    #[arg(long, value_name = "N")]
    pub(crate) ffn: Option<u64>,
    /// Vocabulary size (gpt2 50257, bert 30522, llama 128256).
    #[arg(long, value_name = "N")]
    pub(crate) vocab: Option<u64>,
    /// Iterations to run (default: 4 with --json or into a pipe, which print a
    /// summary; until you quit on a terminal).
    #[arg(long, value_name = "N")]
    pub(crate) iterations: Option<u64>,
    /// Seed of --varlen's batch and sequence draws.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// bf16 autocast: bf16 matmul/conv outputs and weight copies.
    #[arg(long)]
    pub(crate) amp: bool,
    /// Activation checkpointing: keep only each segment's input, recompute it in backward. `layer` (the default): every layer on its own, as Hugging Face's gradient_checkpointing_enable() (which also turns the key/value cache off); `sqrt`: segments of about √layers layers.
    #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "layer", value_name = "SCHEME")]
    pub(crate) checkpoint: Option<CheckpointArg>,
    /// Gradient accumulation over K micro-batches per optimizer step.
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub(crate) accum: u64,
    /// Optimizer (default: sgd for resnet50, adamw otherwise).
    #[arg(long, value_enum)]
    pub(crate) optimizer: Option<OptimizerArg>,
    /// Forward passes only, under no_grad.
    #[arg(long)]
    pub(crate) inference: bool,
    /// A random batch (half to full) and sequence (half to full) every step.
    #[arg(long)]
    pub(crate) varlen: bool,
    /// Bytes leaked (allocated and never freed) per iteration.
    #[arg(long, value_name = "BYTES", value_parser = super::args::parse_size)]
    pub(crate) leak: Option<u64>,
    #[arg(long, value_enum, default_value_t = OnOom::Stop)]
    pub(crate) on_oom: OnOom,
    /// Allocator config in PYTORCH_CUDA_ALLOC_CONF syntax (default: that
    /// variable, or PYTORCH_ALLOC_CONF).
    #[arg(long, value_name = "CONF")]
    pub(crate) alloc_conf: Option<String>,
    #[command(flatten)]
    pub(crate) cap: MemoryCap,
    /// Write every new segment (and mapped page) so the driver commits it.
    #[arg(long)]
    pub(crate) touch: bool,
    /// TUI pace: 1 runs about 800 requests a second.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) speed: f64,
    /// Print one JSON object on stdout instead of opening the TUI.
    #[arg(long)]
    pub(crate) json: bool,
}

impl SynthArgs {
    /// Bounds that keep every tensor size far from u64 overflow (and any
    /// real GPU): a model this large fails with an OOM, not with garbage.
    fn check_bounds(&self, s: &SynthSpec) -> Result<()> {
        let bad = |m: String| anyhow!(InputError(m));
        let sh = &s.shape;
        for (name, v, max) in [
            ("--batch", s.batch, 1u64 << 20),
            ("--seq", s.seq, 1 << 22),
            ("--layers", sh.layers, 4096),
            ("--hidden", sh.hidden, 1 << 17),
            ("--ffn", sh.ffn, 1 << 19),
            ("--vocab", sh.vocab, 1 << 22),
            ("--heads", sh.heads, 1 << 12),
            ("--accum", self.accum, 1 << 12),
        ] {
            if v > max {
                return Err(bad(format!("{name} {v} is over the largest this models ({max})")));
            }
        }
        if sh.vocab == 0 {
            return Err(bad("--vocab must be at least 1".into()));
        }
        // The largest tensors (logits, the MLP, fp32 attention
        // probabilities, the embedding) must fit u64 with room to spare.
        let tokens = s.batch as f64 * s.seq.max(1) as f64;
        let largest = [
            tokens * sh.vocab as f64,
            tokens * sh.ffn as f64,
            tokens * sh.heads as f64 * s.seq as f64,
            sh.vocab as f64 * sh.hidden as f64,
            s.batch as f64 * 64.0 * 112.0 * 112.0,
        ]
        .into_iter()
        .fold(0.0, f64::max)
            * 8.0;
        if largest > (1u64 << 56) as f64 {
            return Err(bad(format!("that shape needs a tensor of {largest:.3e} bytes; nothing that large exists")));
        }
        Ok(())
    }

    pub(crate) fn spec(&self) -> Result<SynthSpec> {
        let bad = |m: String| anyhow!(InputError(m));
        // A flag the model has no use for would be ignored silently: the
        // user asked for something the figures do not include.
        if matches!(self.model, ModelKind::Resnet50 | ModelKind::Mlp) {
            for (flag, given) in [
                ("--seq", self.seq.is_some()),
                ("--heads", self.heads.is_some()),
                ("--kv-heads", self.kv_heads.is_some()),
                ("--vocab", self.vocab.is_some()),
                ("--varlen", self.varlen),
            ] {
                if given {
                    return Err(bad(format!(
                        "{flag} does not apply to --model {}: it has no sequence and no attention",
                        self.model.name()
                    )));
                }
            }
        }
        let mut s = SynthSpec::new(self.model);
        let sh = &mut s.shape;
        if let Some(h) = self.hidden {
            sh.hidden = h;
            if self.ffn.is_none() && self.model != ModelKind::Mlp {
                sh.ffn = 4 * h;
            }
        }
        for (dst, src) in [
            (&mut sh.layers, self.layers),
            (&mut sh.heads, self.heads),
            (&mut sh.kv_heads, self.kv_heads),
            (&mut sh.ffn, self.ffn),
            (&mut sh.vocab, self.vocab),
        ] {
            if let Some(v) = src {
                *dst = v;
            }
        }
        if self.heads.is_some() && self.kv_heads.is_none() && self.model != ModelKind::Llama {
            sh.kv_heads = sh.heads;
        }
        if matches!(self.model, ModelKind::Gpt2 | ModelKind::Bert | ModelKind::Llama) {
            if sh.heads == 0 || sh.hidden % sh.heads != 0 {
                return Err(bad(format!("--hidden {} must be a multiple of --heads {}", sh.hidden, sh.heads)));
            }
            if sh.kv_heads == 0 || sh.heads % sh.kv_heads != 0 {
                return Err(bad(format!("--heads {} must be a multiple of --kv-heads {}", sh.heads, sh.kv_heads)));
            }
        }
        if sh.layers == 0 || sh.hidden == 0 && self.model != ModelKind::Resnet50 {
            return Err(bad("--layers and --hidden must be at least 1".into()));
        }
        if let Some(b) = self.batch {
            s.batch = b;
        }
        if let Some(q) = self.seq {
            s.seq = q;
        }
        if s.batch == 0 {
            return Err(bad("--batch must be at least 1".into()));
        }
        self.check_bounds(&s)?;
        if matches!(self.model, ModelKind::Gpt2 | ModelKind::Bert | ModelKind::Llama) && s.seq == 0 {
            return Err(bad("--seq must be at least 1".into()));
        }
        if self.accum == 0 {
            return Err(bad("--accum must be at least 1".into()));
        }
        // Headless (--json, or not on a terminal): 4 iterations unless
        // asked; on a screen, until quit.
        let headless = self.json || !(std::io::stdout().is_terminal() && std::io::stdin().is_terminal());
        s.iterations = match (self.iterations, headless) {
            (Some(0), _) => return Err(bad("--iterations must be at least 1".into())),
            (Some(n), _) => Some(n),
            (None, true) => Some(4),
            (None, false) => None,
        };
        s.seed = self.seed;
        s.amp = self.amp;
        s.checkpoint = match self.checkpoint {
            None => Checkpoint::None,
            Some(CheckpointArg::Layer) => Checkpoint::Layer,
            Some(CheckpointArg::Sqrt) => Checkpoint::Sqrt,
        };
        s.accum = self.accum;
        if let Some(o) = self.optimizer {
            s.optimizer = match o {
                OptimizerArg::Sgd => Optimizer::Sgd,
                OptimizerArg::Adam => Optimizer::Adam,
                OptimizerArg::Adamw => Optimizer::AdamW,
            };
        }
        s.inference = self.inference;
        s.varlen = self.varlen;
        s.leak = self.leak.unwrap_or(0);
        Ok(s)
    }

    fn conf(&self) -> Result<AllocatorConfig> {
        let env = ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"].iter().find_map(|v| std::env::var(v).ok());
        match self.alloc_conf.as_deref().or(env.as_deref()) {
            Some(c) => parse_conf(c),
            None => Ok(AllocatorConfig::default()),
        }
    }
}

/// NVML's view of this process, sampled at each new reserved peak.
#[derive(Debug, Default, Clone)]
struct NvmlSamples {
    context: Option<u64>,
    at_peak: Option<u64>,
    reserved_at_sample: u64,
}

pub fn synth(args: &SynthArgs) -> Result<ExitCode> {
    let spec = args.spec()?;
    let conf = args.conf()?;
    args.cap.check()?;
    if !(args.speed > 0.0 && args.speed.is_finite()) {
        return Err(anyhow!(InputError(format!("--speed must be positive, got {}", args.speed))));
    }
    // On a terminal, the interactive view; scripts and pipes get the
    // summary (or `--json`), as `replay` does.
    let interactive = !args.json && std::io::stdout().is_terminal() && std::io::stdin().is_terminal();

    let use_cuda = match args.backend {
        Backend::Sim => false,
        Backend::Cuda => true,
        Backend::Auto => Cuda::available(),
    };
    if use_cuda {
        let cuda =
            Cuda::open(args.device, args.touch).map_err(|e| anyhow!(InputError(format!("--backend cuda: {e}"))))?;
        eprintln!("gpumem-top: backend cuda: {}", cuda.describe());
        run(args, spec, conf, cuda, interactive)
    } else {
        let why = match args.backend {
            Backend::Sim => "as asked",
            _ => "no CUDA driver or GPU found",
        };
        eprintln!("gpumem-top: backend sim: simulated NVIDIA H200 ({why})");
        run(args, spec, conf, Sim::h200(), interactive)
    }
}

trait Backed: Device + 'static {
    fn backend(&self) -> &'static str;
    fn cuda(&self) -> Option<&Cuda> {
        None
    }
}
impl Backed for Sim {
    fn backend(&self) -> &'static str {
        "sim"
    }
}
impl Backed for Cuda {
    fn backend(&self) -> &'static str {
        "cuda"
    }
    fn cuda(&self) -> Option<&Cuda> {
        Some(self)
    }
}

fn run<D: Backed>(
    args: &SynthArgs,
    spec: SynthSpec,
    conf: AllocatorConfig,
    dev: D,
    interactive: bool,
) -> Result<ExitCode> {
    let started = Instant::now();
    let total = dev.total_memory().max(1);
    let backend = dev.backend();
    let is_cuda = dev.cuda().is_some();
    let index = dev.cuda().map(|c| (c.index(), c.uuid().map(str::to_string)));
    let mut alloc = CachingAllocator::for_release(conf.clone(), dev, args.torch.release.unwrap_or_default());
    let limit = args.cap.limit(total);
    if let Some(f) = args.cap.memory_fraction {
        alloc.set_memory_fraction(f);
    } else if args.cap.memory_limit.is_some() {
        alloc.set_memory_limit(args.cap.memory_limit);
    }
    alloc.set_recording(false);

    // NVML on the CUDA backend: the context's size before any segment, then
    // this process's used memory at each new reserved peak.
    let samples = Arc::new(Mutex::new(NvmlSamples::default()));
    let nvml = match &index {
        Some((i, uuid)) => crate::monitor::ProcessMemory::open_uuid(uuid.as_deref(), *i as u32).ok(),
        None => None,
    };
    let pid = std::process::id();
    // Which GPU NVML watched: CUDA's ordinal, its UUID and NVML's index.
    let nvml_device = match (&index, &nvml) {
        (Some((i, uuid)), Some(nv)) => Some(NvmlDevice { cuda_index: *i, uuid: uuid.clone(), nvml_index: nv.index() }),
        _ => None,
    };
    let mut driver = Driver::new(alloc, Synthetic::new(spec.clone()), args.on_oom);
    if let Some(nv) = nvml {
        samples.lock().map(|mut s| s.context = nv.used_by(pid)).ok();
        let s2 = samples.clone();
        driver = driver.on_reserved_peak(move |a| {
            let reserved = a.stats().get(Kind::ReservedBytes, 0).current as u64;
            if let Ok(mut s) = s2.lock() {
                s.at_peak = nv.used_by(pid);
                s.reserved_at_sample = reserved;
            }
        });
    }

    if interactive {
        watch(args, &spec, driver, backend)
    } else {
        let context = Headless { conf, limit, backend, is_cuda, nvml_device, samples, started };
        headless(args, spec, driver, context)
    }
}

/// The synth screen of `driver`'s run until the user quits; then what ran.
fn watch<D: Backed>(args: &SynthArgs, spec: &SynthSpec, driver: Driver<D>, backend: &str) -> Result<ExitCode> {
    let color = super::io::color(args.no_color);
    let source = format!("synth {}", describe_training(spec));
    let banner = (backend == "sim").then(|| "simulated device: no GPU memory is used".to_string());
    let mut app = crate::ui::app::SynthApp::new(driver, source, banner, color);
    app.speed = args.speed;
    let r = crate::ui::event::run_app(&mut app, crate::ui::event::Events::new());
    // What ran, once the screen is gone: the figures a user came for.
    let d = &app.driver;
    let peak = d.peak_at().map(|i| (d.points[i], d.iterations.iter().filter(|&&m| m <= i).count() + 1));
    eprintln!("gpumem-top synth {}: {}", describe(&d.workload.spec), ran_line(d.iterations.len(), peak));
    app.driver.release_all();
    r.map_err(|e| anyhow!("terminal: {e}"))?;
    if let Some(o) = app.driver.oom_log.iter().find(|o| o.action == crate::workload::driver::OomAction::Stop) {
        eprintln!("torch.OutOfMemoryError: {}", o.message);
        Ok(ExitCode::from(1))
    } else {
        Ok(ExitCode::SUCCESS)
    }
}

/// What an interactive run did, once its screen is gone: the iterations
/// finished (and the one under way when it was quit), and the peak with
/// the iteration it came in, unfinished if it had not ended.
fn ran_line(done: usize, peak: Option<(crate::alloc::StatePoint, usize)>) -> String {
    let mut o = format!("{} finished", crate::analysis::count(done, "iteration"));
    if let Some((p, it)) = peak {
        o.push_str(&format!(
            "; peak allocated {}, reserved {} then (iteration {it}{})",
            crate::analysis::human_bytes(p.allocated),
            crate::analysis::human_bytes(p.reserved),
            if it > done { ", not finished when quit" } else { "" }
        ));
    }
    o
}

/// What a headless run's report says beside the driver's own figures.
struct Headless {
    conf: AllocatorConfig,
    limit: Option<u64>,
    backend: &'static str,
    is_cuda: bool,
    nvml_device: Option<NvmlDevice>,
    samples: Arc<Mutex<NvmlSamples>>,
    started: Instant,
}

/// Runs `driver` to its end (or Ctrl-C) and prints the report (JSON or
/// the summary).
fn headless<D: Backed>(args: &SynthArgs, spec: SynthSpec, mut driver: Driver<D>, h: Headless) -> Result<ExitCode> {
    let Headless { conf, limit, backend, is_cuda, nvml_device, samples, started } = h;
    let conf_text = conf.source.clone();
    // Ctrl-C and SIGTERM stop the run between requests; memory is
    // returned below either way.
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    while *driver.progress() == Progress::Running && !stop.load(Ordering::Relaxed) {
        driver.advance(1024);
    }
    let interrupted = *driver.progress() == Progress::Running;
    let stats = driver.alloc.stats().clone();
    let segments = driver.alloc.snapshot();
    let frag = fragmentation(&stats, &segments);
    let peak = driver.peak_at().map(|i| {
        let p = driver.points[i];
        let iteration = driver.iterations.iter().filter(|&&m| m <= i).count() as u64 + 1;
        SynthPeak {
            event: driver.peak_event.map(|e| e.0),
            request: i + driver.dropped,
            allocated_bytes: p.allocated,
            reserved_bytes: p.reserved,
            iteration,
        }
    });
    let device_desc = driver.alloc.device().describe();
    let maps = driver.alloc.device().cuda().map(|c| DeviceMaps { range_maps: c.range_maps, page_maps: c.page_maps });
    let requests = driver.points.len() + driver.dropped;
    let outcome = match driver.progress() {
        _ if interrupted => "interrupted",
        Progress::Finished => "finished",
        Progress::Stopped => "stopped by OOM",
        Progress::Running => "interrupted",
    };
    let oom_stop =
        driver.oom_log.iter().find(|o| o.action == crate::workload::driver::OomAction::Stop).map(|o| o.message.clone());
    let ooms = driver.oom_log.clone();
    let iterations_done = driver.iterations.len();
    // What was live at the end, before it is all returned.
    let end_categories = driver.categories;
    driver.release_all();
    let held_after = driver.alloc.device().cuda().map(|c| c.held());
    let s = samples.lock().map(|s| s.clone()).unwrap_or_default();
    let effects = crate::workload::report::effects(&spec);
    let out = SynthReport {
        trace: None,
        format: "synthetic",
        workload: spec,
        backend,
        device: device_desc,
        events: driver.alloc.emitted(),
        requests,
        iterations: iterations_done,
        outcome,
        alloc_conf: conf_text,
        memory_limit_bytes: limit,
        fidelity: "synthetic",
        first_divergence: None,
        compare: Vec::new(),
        on_oom: args.on_oom,
        ooms,
        stats: stats.memory_stats(&conf, args.torch.release.unwrap_or_default()),
        peak,
        categories: crate::workload::report::SynthCategories {
            evidence: "model",
            at_peak: driver.peak_categories,
            at_end: end_categories,
        },
        fragmentation: SynthFragmentation { peak_ratio: peak_ratio(&stats), now: frag },
        nvml_device,
        cuda_context_bytes: if is_cuda { s.context } else { None },
        nvml_used_bytes_at_peak: if is_cuda { s.at_peak } else { None },
        reserved_bytes_at_nvml_sample: if is_cuda { Some(s.reserved_at_sample) } else { None },
        device_maps: maps,
        device_bytes_held_after_release: held_after,
        effects,
        elapsed_ms: started.elapsed().as_secs_f64() * 1000.0,
    };
    let mut so = super::io::text_out();
    if args.json {
        serde_json::to_writer(&mut so, &out)?;
        writeln!(so)?;
    } else {
        write!(so, "{}", summary(&out))?;
    }
    if let Some(m) = oom_stop {
        eprintln!("torch.OutOfMemoryError: {m}");
        Ok(ExitCode::from(1))
    } else if interrupted {
        Ok(ExitCode::from(130))
    } else {
        Ok(ExitCode::SUCCESS)
    }
}

/// "gpt2 batch 8 × seq 1024, AdamW, amp" for summaries.
pub(crate) fn describe(s: &SynthSpec) -> String {
    let mut shape = format!(" batch {}", s.batch);
    if s.seq > 0 && s.model != ModelKind::Resnet50 && s.model != ModelKind::Mlp {
        shape += &format!(" × seq {}", s.seq);
    }
    let rest = describe_training(s);
    let (model, tail) = rest.split_once(',').map_or((rest.as_str(), ""), |(m, t)| (m, t));
    format!("{model}{shape},{tail}")
}

/// "gpt2, AdamW, amp": the model and how it trains, without the batch and
/// sequence (the screen's position line shows those as they are now).
pub(crate) fn describe_training(s: &SynthSpec) -> String {
    let mut out = s.model.name().to_string();
    if s.inference {
        out += ", inference";
    } else {
        out += match s.optimizer {
            Optimizer::Sgd => ", SGD",
            Optimizer::Adam => ", Adam",
            Optimizer::AdamW => ", AdamW",
        };
    }
    for (on, what) in [(s.amp, "amp"), (s.varlen, "varlen")] {
        if on {
            out += &format!(", {what}");
        }
    }
    match s.checkpoint {
        Checkpoint::None => {}
        Checkpoint::Layer => out += ", checkpoint per layer",
        Checkpoint::Sqrt => out += ", checkpoint per √layers",
    }
    if s.accum > 1 {
        out += &format!(", accum {}", s.accum);
    }
    out
}

/// The text summary of a headless run (`synth | cat`): what ran, its peak,
/// its OOMs, what the memory was at the peak.
fn summary(r: &crate::workload::report::SynthReport) -> String {
    use crate::analysis::{count, human_bytes};
    let mut out = format!(
        "gpumem-top synth {} on {} ({}): {}, {} requests, {}\n",
        describe(&r.workload),
        r.device,
        r.backend,
        count(r.iterations, "iteration"),
        r.requests,
        r.outcome
    );
    out += &format!("allocator config: {}\n", if r.alloc_conf.is_empty() { "default" } else { &r.alloc_conf });
    if let Some(p) = &r.peak {
        out += &format!(
            "peak: allocated {}, reserved {} then (iteration {}, request {}); peak reserved {}\n",
            human_bytes(p.allocated_bytes),
            human_bytes(p.reserved_bytes),
            p.iteration,
            p.request,
            human_bytes(r.stats.get("reserved_bytes.all.peak").copied().unwrap_or(0).max(0) as u64)
        );
    }
    out += &format!(
        "fragmentation: peak_ratio {:.4}; at the end: reserved_unallocated_bytes {}\n",
        r.fragmentation.peak_ratio,
        human_bytes(r.fragmentation.now.reserved_unallocated_bytes)
    );
    for o in &r.ooms {
        out += &format!("OOM in iteration {} (batch {}), {}: {}\n", o.iteration, o.batch, o.action, o.message);
    }
    if r.categories.at_peak.total() > 0 {
        out += &format!("what the memory is at the peak: {}\n", r.categories.at_peak.describe());
    }
    out
}

#[cfg(test)]
mod ran_tests {
    use super::ran_line;
    use crate::alloc::StatePoint;

    #[test]
    fn the_exit_line_counts_finished_iterations_and_says_an_unfinished_peak() {
        let p = StatePoint { allocated: 1 << 30, reserved: 2 << 30 };
        assert_eq!(
            ran_line(1, Some((p, 2))),
            "1 iteration finished; peak allocated 1.00 GiB, reserved 2.00 GiB then (iteration 2, not finished when quit)"
        );
        assert_eq!(
            ran_line(3, Some((p, 2))),
            "3 iterations finished; peak allocated 1.00 GiB, reserved 2.00 GiB then (iteration 2)"
        );
        assert_eq!(ran_line(0, None), "0 iterations finished");
    }
}
