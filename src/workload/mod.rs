//! Synthetic allocation patterns as streams of requests: training and
//! inference loops of real model shapes (`models`), executed the way autograd
//! runs them (`graph`), driven through the allocator by `driver`.

pub(crate) mod cudnn;
pub mod driver;
pub mod graph;
pub mod models;
pub mod report;

pub use models::{ModelKind, ModelShape};

use crate::analysis::categories::Category;

/// One request of a synthetic program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// `site` indexes the workload's call-site table (0: none); `cat` is
    /// what the tensor is (docs/user/categories.md): the model knows.
    Alloc {
        key: u64,
        size: u64,
        site: u32,
        cat: Category,
    },
    Free {
        key: u64,
    },
    /// An iteration ended (the `Optimizer.step` of a real run).
    Iteration(u64),
}

/// The optimizer whose state the loop keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Optimizer {
    /// SGD with momentum: one buffer per parameter.
    Sgd,
    /// Adam (foreach): two buffers per parameter and a parameter-sized
    /// temporary list during each step.
    Adam,
    /// AdamW: Adam's memory exactly (the decay is applied in place); named
    /// apart so a summary says what the user asked for.
    #[serde(rename = "adamw")]
    #[value(name = "adamw")]
    AdamW,
}

/// Activation checkpointing: which layers are recomputed in backward
/// (docs/user/synth.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Checkpoint {
    #[default]
    None,
    /// Every layer on its own (a transformer block, a ResNet bottleneck, an
    /// MLP layer): Hugging Face's `gradient_checkpointing_enable()`, which
    /// also turns the key/value cache off.
    Layer,
    /// Segments of ⌈√layers⌉ layers (`checkpoint_sequential` with √n
    /// segments).
    Sqrt,
}

/// Everything `synth` was asked to run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SynthSpec {
    #[serde(serialize_with = "ser_kind")]
    pub(crate) model: ModelKind,
    pub(crate) shape: ModelShape,
    pub batch: u64,
    pub seq: u64,
    /// `None`: forever (the TUI).
    pub iterations: Option<u64>,
    pub seed: u64,
    pub amp: bool,
    pub checkpoint: Checkpoint,
    pub accum: u64,
    pub optimizer: Optimizer,
    pub inference: bool,
    pub varlen: bool,
    pub leak: u64,
}

fn ser_kind<S: serde::Serializer>(k: &ModelKind, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(k.name())
}

impl SynthSpec {
    /// A transformer of another shape (`synth --layers --hidden --heads
    /// --kv-heads --ffn --vocab`).
    pub fn with_shape(mut self, layers: u64, hidden: u64, heads: u64, kv_heads: u64, ffn: u64, vocab: u64) -> Self {
        self.shape = ModelShape { layers, hidden, heads, kv_heads, ffn, vocab };
        self
    }

    /// The shapes of the calibration runs recorded on an H200 (measurements/calibration), 4 iterations.
    pub fn new(model: ModelKind) -> Self {
        let (batch, seq) = model.default_batch_seq();
        SynthSpec {
            model,
            shape: model.default_shape(),
            batch,
            seq,
            iterations: Some(4),
            seed: 0,
            amp: false,
            checkpoint: Checkpoint::None,
            accum: 1,
            optimizer: match model {
                ModelKind::Resnet50 => Optimizer::Sgd,
                _ => Optimizer::AdamW,
            },
            inference: false,
            varlen: false,
            leak: 0,
        }
    }
}

/// One iteration's requests, planned before any of it runs so a driver can
/// abandon it after an OOM and plan it again smaller.
#[derive(Debug, Clone, Default)]
pub struct StepPlan {
    pub(crate) batch: u64,
    pub(crate) seq: u64,
    pub(crate) ops: Vec<Op>,
}

/// A training (or inference) loop of a real model shape.
#[derive(Debug, Clone)]
pub struct Synthetic {
    pub(crate) spec: SynthSpec,
    persistent: graph::Persistent,
    /// Persistent state as of the start of the step being planned, restored
    /// when that step is abandoned.
    before: Option<graph::Persistent>,
    sites: Vec<String>,
    rng: u64,
    iteration: u64,
    started: bool,
}

/// Call sites every workload has, before the model's own.
const SITE_PARAMS: u32 = 1;
const SITE_STATE: u32 = 2;
const SITE_STEP: u32 = 3;
const SITE_LEAK: u32 = 4;
const SITE_GRAPH: u32 = 5;

impl Synthetic {
    pub fn new(spec: SynthSpec) -> Self {
        let sites = ["", "model.to(cuda) (parameters)", "optimizer state", "optimizer.step (temporaries)", "leak"];
        Synthetic {
            rng: spec.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
            spec,
            persistent: Default::default(),
            before: None,
            sites: sites.iter().map(|s| s.to_string()).collect(),
            iteration: 0,
            started: false,
        }
    }

    /// Call-site labels; `Op::Alloc::site` indexes this.
    pub(crate) fn sites(&self) -> &[String] {
        &self.sites
    }

    pub(crate) fn iteration(&self) -> u64 {
        self.iteration
    }

    fn rand(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// The graph of one micro-step at `batch` × `seq`.
    pub fn graph(&self, batch: u64, seq: u64) -> graph::Graph {
        let st = models::StepShape {
            batch,
            seq,
            amp: self.spec.amp,
            checkpoint: self.spec.checkpoint,
            inference: self.spec.inference,
        };
        models::build(self.spec.model, &self.spec.shape, st)
    }

    fn site_base(&mut self, g: &graph::Graph) -> u32 {
        // Graph sites are appended once; every build names them alike.
        let base = SITE_GRAPH;
        for (i, s) in g.sites.iter().enumerate() {
            let at = base as usize + i;
            if at >= self.sites.len() {
                self.sites.push(s.clone());
            } else if self.sites[at] != *s {
                self.sites[at] = s.clone();
            }
        }
        base
    }

    /// True once `iterations` steps were planned and run.
    pub(crate) fn finished(&self) -> bool {
        self.spec.iterations.is_some_and(|n| self.iteration >= n)
    }

    /// Plans the next iteration with the batch scaled by `scale` (1.0, or
    /// 0.9^k when retrying after OOMs). `None` when the run is complete.
    pub fn plan(&mut self, scale: f64) -> Option<StepPlan> {
        if self.finished() {
            return None;
        }
        let mut ops = Vec::new();
        let g0 = self.graph(1, self.spec.seq.max(1));
        if !self.started {
            // model.to(cuda): the parameters outlive any failed step.
            self.started = true;
            let sizes = g0.params.clone();
            for s in sizes {
                let key = self.persistent.key();
                self.persistent.param_keys.push(key);
                self.persistent.grad_keys.push(None);
                ops.push(Op::Alloc { key, size: s, site: SITE_PARAMS, cat: Category::Parameter });
            }
        }
        self.before = Some(self.persistent.clone());
        let (mut batch, mut seq) = (self.spec.batch, self.spec.seq);
        if self.spec.varlen {
            let lo = batch.div_ceil(2);
            batch = lo + self.rand() % (batch - lo + 1);
            if seq > 0 {
                let lo = (seq / 2).max(8);
                seq = (lo + self.rand() % (seq - lo + 1)) / 8 * 8;
                seq = seq.max(8);
            }
        }
        batch = ((batch as f64 * scale).floor() as u64).max(1);
        let mode =
            graph::StepMode { inference: self.spec.inference, checkpoint: self.spec.checkpoint != Checkpoint::None };
        let g = self.graph(batch, seq);
        let base = self.site_base(&g);
        let mut held = graph::Held::default();
        for _ in 0..self.spec.accum.max(1) {
            held = graph::Executor::new(&g, &mut self.persistent, &mut ops, base).step(mode, held);
            if self.spec.inference {
                break;
            }
        }
        if !self.spec.inference {
            self.optimizer_step(&g0.params, &mut ops);
        }
        self.iteration += 1;
        ops.push(Op::Iteration(self.iteration));
        if !self.spec.inference {
            // zero_grad(set_to_none=True)
            for k in self.persistent.grad_keys.iter_mut() {
                if let Some(key) = k.take() {
                    ops.push(Op::Free { key });
                }
            }
        }
        held.release(&mut ops);
        if self.spec.leak > 0 {
            let key = self.persistent.key();
            ops.push(Op::Alloc { key, size: self.spec.leak, site: SITE_LEAK, cat: Category::Temporary });
        }
        Some(StepPlan { batch, seq, ops })
    }

    /// The step just planned failed: forget its persistent effects (state
    /// first allocated in it, gradients) and its iteration number.
    pub(crate) fn abandon(&mut self) {
        if let Some(p) = self.before.take() {
            self.persistent = p;
            for g in self.persistent.grad_keys.iter_mut() {
                *g = None;
            }
            self.iteration -= 1;
        }
    }

    /// The abandoned step is not retried (`--on-oom continue`): it counts.
    pub(crate) fn skip(&mut self) {
        self.iteration += 1;
    }

    /// Keys that outlive a step: parameters, optimizer state, cuBLAS
    /// workspaces, leaks. Everything else live after an OOM belongs to the
    /// failed step.
    pub(crate) fn keeps(&self, key: u64) -> bool {
        let p = self.before.as_ref().unwrap_or(&self.persistent);
        key <= p.last_key()
    }

    fn optimizer_step(&mut self, params: &[u64], ops: &mut Vec<Op>) {
        let first = self.persistent.state_keys.is_empty();
        match self.spec.optimizer {
            Optimizer::Sgd => {
                if first {
                    // momentum_buffer = clone(grad), per parameter.
                    for &s in params {
                        let key = self.persistent.key();
                        self.persistent.state_keys.push(key);
                        ops.push(Op::Alloc { key, size: s, site: SITE_STATE, cat: Category::OptimizerState });
                    }
                }
            }
            Optimizer::Adam | Optimizer::AdamW => {
                if first {
                    for &s in params {
                        for _ in 0..2 {
                            let key = self.persistent.key();
                            self.persistent.state_keys.push(key);
                            ops.push(Op::Alloc { key, size: s, site: SITE_STATE, cat: Category::OptimizerState });
                        }
                    }
                }
                // _multi_tensor_adam: one parameter-sized list of temporaries
                // (the denominators), freed after the update.
                let keys: Vec<u64> = params.iter().map(|_| self.persistent.key()).collect();
                for (&key, &s) in keys.iter().zip(params) {
                    ops.push(Op::Alloc { key, size: s, site: SITE_STEP, cat: Category::Temporary });
                }
                for key in keys {
                    ops.push(Op::Free { key });
                }
            }
        }
    }
}
