//! Layer tables of the models the synthetic mode knows, written as the ops
//! PyTorch runs for them (torchvision's ResNet-50, Hugging Face's GPT-2,
//! BERT and Llama with SDPA attention), with the tensors each op allocates
//! and saves. The op lists follow recorded H200 runs (measurements/calibration):
//! e.g. GPT-2's tanh GELU runs as five Python-level ops saving four
//! 4h-wide tensors, and its SDPA path keeps a key/value cache copy.
//!
//! Under `amp` (bf16 autocast) matmuls and convolutions cast their fp32
//! inputs and the weights (cached for the forward) to bf16 and produce bf16;
//! layer norms, softmax/cross-entropy and `pow`/`tanh` promote back to fp32,
//! as autocast's op lists say.

use super::graph::{Graph, Node, Tid};

/// The models `synth --model` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModelKind {
    Mlp,
    Resnet50,
    Gpt2,
    Bert,
    Llama,
}

/// Shape of a model; the transformer fields are ignored by `mlp`/`resnet50`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ModelShape {
    pub(crate) layers: u64,
    pub(crate) hidden: u64,
    pub(crate) heads: u64,
    pub(crate) kv_heads: u64,
    pub(crate) ffn: u64,
    pub(crate) vocab: u64,
}

impl ModelKind {
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Mlp => "mlp",
            ModelKind::Resnet50 => "resnet50",
            ModelKind::Gpt2 => "gpt2",
            ModelKind::Bert => "bert",
            ModelKind::Llama => "llama",
        }
    }

    /// GPT-2 small, BERT-base, a Llama-3.2-1B-like shape, an MLP of three
    /// 4096-wide layers.
    pub(crate) fn default_shape(self) -> ModelShape {
        match self {
            ModelKind::Gpt2 => ModelShape { layers: 12, hidden: 768, heads: 12, kv_heads: 12, ffn: 3072, vocab: 50257 },
            ModelKind::Bert => ModelShape { layers: 12, hidden: 768, heads: 12, kv_heads: 12, ffn: 3072, vocab: 30522 },
            ModelKind::Llama => {
                ModelShape { layers: 16, hidden: 2048, heads: 32, kv_heads: 8, ffn: 8192, vocab: 128256 }
            }
            ModelKind::Mlp => ModelShape { layers: 3, hidden: 4096, heads: 0, kv_heads: 0, ffn: 1024, vocab: 1000 },
            ModelKind::Resnet50 => ModelShape { layers: 16, hidden: 0, heads: 0, kv_heads: 0, ffn: 0, vocab: 1000 },
        }
    }

    /// (batch, sequence) of the calibration runs recorded on an H200 (measurements/calibration).
    pub(crate) fn default_batch_seq(self) -> (u64, u64) {
        match self {
            ModelKind::Gpt2 => (8, 1024),
            ModelKind::Bert => (16, 512),
            ModelKind::Llama => (4, 1024),
            ModelKind::Mlp => (1024, 0),
            ModelKind::Resnet50 => (64, 0),
        }
    }
}

const F32: u64 = 4;
const BF16: u64 = 2;

/// Builds one step's graph; parameters are declared in the same order on
/// every build, so their indices are stable across steps.
pub(crate) struct Builder {
    pub(crate) g: Graph,
    amp: bool,
    dtype: Vec<u64>,
    /// Autocast's weight-cast cache: one bf16 copy per parameter per forward.
    casts: std::collections::HashMap<usize, Tid>,
    /// Parameters of the module being built (site label prefix).
    prefix: String,
    segment: u32,
    pub(crate) batch: u64,
    /// `model.eval()`: dropout is the identity and allocates nothing.
    eval: bool,
}

impl Builder {
    pub fn new(amp: bool, batch: u64) -> Self {
        let mut g = Graph::default();
        g.site("batch");
        Builder {
            g,
            amp,
            dtype: Vec::new(),
            casts: Default::default(),
            prefix: String::new(),
            segment: 0,
            batch,
            eval: false,
        }
    }

    /// An inference step: the model is in eval mode.
    pub(crate) fn evaluating(mut self, eval: bool) -> Self {
        self.eval = eval;
        self
    }

    fn t(&mut self, elems: u64, dtype: u64) -> Tid {
        self.dtype.push(dtype);
        self.g.tensor(elems * dtype)
    }
    /// A view sharing storage with `of` (reshape, in-place results): it is
    /// never allocated; gradients still have its full size.
    fn alias(&mut self, of: Tid) -> Tid {
        let d = self.dtype[of];
        let bytes = self.g.logical[of];
        self.dtype.push(d);
        self.g.alias(of, bytes)
    }
    fn elems(&self, t: Tid) -> u64 {
        self.g.logical[t] / self.dtype[t]
    }
    fn act_dtype(&self) -> u64 {
        if self.amp {
            BF16
        } else {
            F32
        }
    }
    pub(crate) fn param(&mut self, elems: u64) -> usize {
        self.g.params.push(elems * F32);
        self.g.params.len() - 1
    }
    pub(crate) fn input(&mut self, bytes: u64) -> Tid {
        let t = self.t(bytes, 1);
        self.g.inputs.push(t);
        t
    }
    fn node(&mut self, what: &str, mut n: Node) {
        n.site = self.g.site(format!("{}{what}", self.prefix));
        n.segment = self.segment;
        self.g.nodes.push(n);
    }
    /// `refs` in eval mode only: a module's locals that outlive their last
    /// use (docs/user/synth.md "Module variables"). Measured exact for BERT
    /// inference; training steps free them at their last use, as the
    /// calibration was fitted (their activations are mostly saved anyway).
    fn eval_refs(&mut self, ts: &[Tid]) {
        if self.eval {
            self.refs(ts);
        }
    }
    /// The last op built runs while Python variables still reference `ts`.
    fn refs(&mut self, ts: &[Tid]) {
        if let Some(n) = self.g.nodes.last_mut() {
            n.refs.extend_from_slice(ts);
        }
    }
    pub(crate) fn module(&mut self, prefix: impl Into<String>) {
        self.prefix = prefix.into();
    }
    /// Ops built from now on form checkpoint segment `s` (0: none).
    pub(crate) fn segment(&mut self, s: u32) {
        self.segment = s;
    }

    /// `x` as bf16 under autocast (a saved copy), else `x`.
    fn cast_bf16(&mut self, what: &str, x: Tid) -> Tid {
        if !self.amp || self.dtype[x] == BF16 {
            return x;
        }
        let c = self.t(self.elems(x), BF16);
        self.node(what, Node { inputs: vec![x], outputs: vec![c], grad_in: vec![x], ..Default::default() });
        c
    }
    /// `x` promoted to fp32 (autocast's fp32 ops), else `x`.
    fn cast_f32(&mut self, what: &str, x: Tid) -> Tid {
        if self.dtype[x] == F32 {
            return x;
        }
        let c = self.t(self.elems(x), F32);
        self.node(what, Node { inputs: vec![x], outputs: vec![c], grad_in: vec![x], ..Default::default() });
        c
    }
    fn weight(&mut self, what: &str, p: usize) -> Option<Tid> {
        if !self.amp {
            return None;
        }
        if let Some(&c) = self.casts.get(&p) {
            return Some(c);
        }
        let c = self.t(self.g.params[p] / F32, BF16);
        self.node(what, Node { outputs: vec![c], param_grads: vec![p], ..Default::default() });
        self.g.autocast_cache.push(c);
        self.casts.insert(p, c);
        Some(c)
    }

    /// `x @ w + b` over `rows` rows: a GEMM (cuBLAS) saving its input.
    /// Its backward's bias gradient sums the output gradient over the rows,
    /// taking the reduction's buffer right after (`bias_reduction`).
    pub(crate) fn linear(&mut self, what: &str, x: Tid, rows: u64, fout: u64, w: usize, b: Option<usize>) -> Tid {
        let reduction = if b.is_some() { bias_reduction(rows, fout) } else { 0 };
        match self.weight(what, w) {
            Some(wc) => {
                let xc = self.cast_bf16(what, x);
                let bc = b.and_then(|b| self.weight(what, b));
                let y = self.t(rows * fout, BF16);
                let mut inputs = vec![xc, wc];
                inputs.extend(bc);
                self.node(
                    what,
                    Node {
                        grad_in: inputs.clone(),
                        inputs,
                        outputs: vec![y],
                        saved: vec![xc, wc],
                        matmul: true,
                        grad_ws: vec![0, 0, reduction],
                        ..Default::default()
                    },
                );
                // Autocast casts inside the op: its fp32 argument stays
                // referenced until the op returns (docs/user/synth.md).
                if xc != x {
                    self.eval_refs(&[x]);
                }
                y
            }
            None => {
                let y = self.t(rows * fout, F32);
                let mut params = vec![w];
                params.extend(b);
                self.node(
                    what,
                    Node {
                        inputs: vec![x],
                        outputs: vec![y],
                        saved: vec![x],
                        grad_in: vec![x],
                        param_grads: params,
                        matmul: true,
                        grad_ws: vec![0, 0, reduction],
                        ..Default::default()
                    },
                );
                y
            }
        }
    }

    /// An elementwise op producing `dtype`, saving `saved`.
    fn pointwise(&mut self, what: &str, inputs: &[Tid], dtype: u64, saved: &[Tid]) -> Tid {
        let y = self.t(self.elems(inputs[0]), dtype);
        self.node(
            what,
            Node {
                inputs: inputs.to_vec(),
                outputs: vec![y],
                saved: saved.to_vec(),
                grad_in: inputs.to_vec(),
                ..Default::default()
            },
        );
        y
    }
    /// `a + b` (residual): saves nothing; the gradient passes through.
    fn add(&mut self, what: &str, a: Tid, b: Tid) -> Tid {
        let d = self.dtype[a].max(self.dtype[b]);
        let y = self.t(self.elems(a), d);
        self.node(
            what,
            Node {
                inputs: vec![a, b],
                grad_in: vec![a, b],
                outputs: vec![y],
                pass_through: true,
                ..Default::default()
            },
        );
        y
    }
    fn dropout(&mut self, what: &str, x: Tid) -> Tid {
        if self.eval {
            return x;
        }
        let n = self.elems(x);
        let mask = self.t(n, 1);
        let y = self.t(n, self.dtype[x]);
        self.node(
            what,
            Node { inputs: vec![x], outputs: vec![mask, y], saved: vec![mask], grad_in: vec![x], ..Default::default() },
        );
        y
    }
    /// LayerNorm over rows of `h` (fp32 under autocast), saving its input
    /// and the per-row mean and rstd.
    fn layer_norm(&mut self, what: &str, x: Tid, rows: u64, h: u64) -> Tid {
        let y = self.t(rows * h, F32);
        self.normalize(what, x, y, rows, h)
    }

    /// A normalization writing `y`: `stats` per-row (or per-channel) fp32
    /// means and inverse deviations saved with the input, and a weight and
    /// a bias of `affine` elements.
    fn normalize(&mut self, what: &str, x: Tid, y: Tid, stats: u64, affine: u64) -> Tid {
        let (w, b) = (self.param(affine), self.param(affine));
        let (m, r) = (self.t(stats, F32), self.t(stats, F32));
        self.node(
            what,
            Node {
                inputs: vec![x],
                outputs: vec![y, m, r],
                saved: vec![x, m, r],
                grad_in: vec![x],
                param_grads: vec![w, b],
                ..Default::default()
            },
        );
        y
    }
    /// Memory-efficient SDPA (flash/efficient kernels): output, logsumexp and
    /// the RNG state are saved with q, k, v.
    #[allow(clippy::too_many_arguments)]
    fn sdpa(&mut self, q_of: Tid, k: Tid, v: Tid, b: u64, heads: u64, s: u64, h: u64, dropout: bool) -> Tid {
        let d = self.dtype[k];
        let mut outputs = Vec::new();
        if dropout {
            let (s1, s2) = (self.t(1, 8), self.t(1, 8));
            outputs.extend([s1, s2]);
        }
        let o = self.t(b * s * h, d);
        outputs.push(o);
        // The log-sum-exp is kept for backward; without grad (eval under
        // no_grad) none is made.
        if !self.eval {
            outputs.push(self.t(b * heads * s, F32));
        }
        let mut saved = vec![q_of, k, v];
        saved.extend(&outputs);
        self.node(
            "attention (sdpa)",
            Node {
                inputs: vec![q_of, k, v],
                outputs,
                saved,
                temps: vec![256],
                grad_in: vec![q_of, k, v],
                ..Default::default()
            },
        );
        o
    }
    /// Cross-entropy over `rows` × `vocab` logits: log_softmax in fp32 (its
    /// output saved), then the loss. Returns the loss.
    fn cross_entropy(&mut self, logits: Tid, rows: u64, vocab: u64) -> Tid {
        let amp = self.amp;
        let x = if amp {
            // Autocast's fp32 policy copies the logits before log_softmax;
            // the copy lives until the gradient has reached the logits.
            let c = self.t(rows * vocab, self.dtype[logits]);
            self.node(
                "cross_entropy",
                Node {
                    inputs: vec![logits],
                    outputs: vec![c],
                    saved: vec![c],
                    grad_in: vec![logits],
                    ..Default::default()
                },
            );
            c
        } else {
            logits
        };
        let ls = self.t(rows * vocab, F32);
        // Under autocast the fp32 log-probabilities go once the loss's own
        // gradient is made, before log_softmax's (as recorded).
        self.node(
            "cross_entropy",
            Node {
                inputs: vec![x],
                outputs: vec![ls],
                saved: if amp { vec![] } else { vec![ls] },
                grad_in: vec![x],
                ..Default::default()
            },
        );
        let loss = self.t(1, F32);
        let tw = self.t(1, F32);
        self.node(
            "cross_entropy",
            Node {
                inputs: vec![ls],
                outputs: vec![tw, loss],
                saved: if amp { vec![tw, ls] } else { vec![tw] },
                grad_in: vec![ls],
                ..Default::default()
            },
        );
        loss
    }

    /// The loss over `logits`, unless this is an inference step; then the
    /// graph ends at the logits, held by the loop.
    fn head(mut self, logits: Tid, rows: u64, vocab: u64, inference: bool) -> Graph {
        if inference {
            self.g.held.push(logits);
            return self.g;
        }
        self.g.loss_from = Some(self.g.nodes.len());
        let loss = self.cross_entropy(logits, rows, vocab);
        self.finish(logits, loss)
    }

    fn finish(mut self, output: Tid, loss: Tid) -> Graph {
        // The loop keeps the model's output and the loss until backward is
        // done (`out = model(x); loss = lf(out, y); loss.backward()`).
        self.g.held.extend([output, loss]);
        self.g.output.push(output);
        self.g.loss = Some(loss);
        // The loss must be the last node's first output for backward to start.
        let last = self.g.nodes.last_mut().expect("a model has ops");
        if let Some(pos) = last.outputs.iter().position(|&t| t == loss) {
            last.outputs.swap(0, pos);
        }
        self.g
    }
}

/// What one step is built from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StepShape {
    pub(crate) batch: u64,
    pub(crate) seq: u64,
    pub(crate) amp: bool,
    pub(crate) checkpoint: super::Checkpoint,
    /// No loss: the loop only runs the model (`torch.no_grad()`).
    pub(crate) inference: bool,
}

/// The buffer PyTorch's reduction kernel takes to sum a `rows` × `out`
/// gradient over its rows (a Linear's bias gradient) on an H200: none up
/// to 512 rows, then fp32 partial sums for 2 × `rows` row blocks, at most
/// about 132 SMs × 2^18 values. Measured for 2-D and 3-D inputs, fp32 and
/// bf16 alike (measurements/calibration/linear_backward.py; docs/user/synth.md).
fn bias_reduction(rows: u64, out: u64) -> u64 {
    const MOST: u64 = 132 << 18;
    if rows <= 512 || out == 0 {
        return 0;
    }
    (2 * rows).min(MOST.div_ceil(out)) * out * F32
}

/// Checkpoint segment of layer `l` of `n` (0: none).
fn segment_of(l: u64, n: u64, scheme: super::Checkpoint) -> u32 {
    match scheme {
        super::Checkpoint::None => 0,
        super::Checkpoint::Layer => (l + 1) as u32,
        super::Checkpoint::Sqrt => (l / (n as f64).sqrt().ceil().max(1.0) as u64 + 1) as u32,
    }
}

pub(crate) fn build(kind: ModelKind, shape: &ModelShape, step: StepShape) -> Graph {
    match kind {
        ModelKind::Gpt2 => gpt2(shape, step),
        ModelKind::Bert => bert(shape, step),
        ModelKind::Llama => llama(shape, step),
        ModelKind::Resnet50 => resnet50(step),
        ModelKind::Mlp => mlp(shape, step),
    }
}

/// Hugging Face `GPT2LMHeadModel` (SDPA attention, `gelu_new`, tied head).
fn gpt2(m: &ModelShape, st: StepShape) -> Graph {
    let (b, s, h, v) = (st.batch, st.seq, m.hidden, m.vocab);
    let rows = b * s;
    let mut k = Builder::new(st.amp, st.batch).evaluating(st.inference);
    let ids = k.input(rows * 8);
    k.module("transformer.");
    let wte = k.param(v * h);
    let wpe = k.param(1024.max(s) * h);
    let e = k.t(rows * h, F32);
    k.node("wte", Node { inputs: vec![ids], outputs: vec![e], param_grads: vec![wte], ..Default::default() });
    let pos = k.t(s, 8);
    k.node("position_ids", Node { outputs: vec![pos], ..Default::default() });
    let pe = k.t(s * h, F32);
    k.node("wpe", Node { inputs: vec![pos], outputs: vec![pe], param_grads: vec![wpe], ..Default::default() });
    let x0 = k.t(rows * h, F32);
    k.node(
        "embeddings",
        Node { inputs: vec![e, pe], grad_in: vec![e, pe], outputs: vec![x0], pass_through: true, ..Default::default() },
    );
    let mut r = k.dropout("drop", x0);
    for l in 0..m.layers {
        k.module(format!("transformer.h.{l}."));
        k.segment(segment_of(l, m.layers, st.checkpoint));
        let ln = k.layer_norm("ln_1", r, rows, h);
        let (w, bi) = (k.param(h * 3 * h), k.param(3 * h));
        let qkv = k.linear("attn.c_attn", ln, rows, 3 * h, w, Some(bi));
        // DynamicCache.update keeps copies of k and v (use_cache=True),
        // in the output's past_key_values: they live as long as `out`.
        // Hugging Face's checkpointing turns the cache off: attention reads
        // k and v as views of the projection.
        let (q, kc, vc) = if st.checkpoint == super::Checkpoint::Layer {
            // `split` gives three views; backward concatenates their
            // gradients into one buffer for the projection.
            let d = k.dtype[qkv];
            let parts: Vec<Tid> = (0..3)
                .map(|_| {
                    k.dtype.push(d);
                    k.g.alias(qkv, rows * h * d)
                })
                .collect();
            k.node(
                "attn (split)",
                Node { inputs: vec![qkv], outputs: parts.clone(), grad_in: vec![qkv], ..Default::default() },
            );
            (parts[0], parts[1], parts[2])
        } else {
            let d = k.dtype[qkv];
            let kc = k.t(rows * h, d);
            let vc = k.t(rows * h, d);
            k.node("attn (kv cache)", Node { inputs: vec![qkv], outputs: vec![kc, vc], ..Default::default() });
            k.g.held.extend([kc, vc]);
            k.g.output.extend([kc, vc]);
            (qkv, kc, vc)
        };
        let o = k.sdpa(q, kc, vc, b, m.heads, s, h, true);
        let (w, bi) = (k.param(h * h), k.param(h));
        let y = k.linear("attn.c_proj", o, rows, h, w, Some(bi));
        let y = k.dropout("attn.resid_dropout", y);
        // GPT2Attention.forward's query/key/value views keep the
        // projection until it returns (under no_grad nothing else does).
        k.refs(&[qkv]);
        let attn_out = y;
        let r2 = k.add("residual", y, r);
        // GPT2Block.forward's `hidden_states` holds ln_1's output until this
        // addition rebinds it (docs/user/synth.md).
        k.refs(&[ln]);
        let ln2 = k.layer_norm("ln_2", r2, rows, h);
        let (w, bi) = (k.param(h * m.ffn), k.param(m.ffn));
        let f = k.linear("mlp.c_fc", ln2, rows, m.ffn, w, Some(bi));
        let g = gelu_tanh(&mut k, f);
        let (w, bi) = (k.param(m.ffn * h), k.param(h));
        let y = k.linear("mlp.c_proj", g, rows, h, w, Some(bi));
        let y = k.dropout("mlp.dropout", y);
        r = k.add("residual", y, r2);
        // ln_2's output, and `attn_output` until the block returns.
        k.refs(&[ln2, attn_out]);
    }
    k.segment(0);
    k.module("transformer.");
    let lnf = k.layer_norm("ln_f", r, rows, h);
    k.module("");
    let logits = k.linear("lm_head", lnf, rows, v, wte, None);
    k.head(logits, rows, v, st.inference)
}

/// transformers' `NewGELUActivation`, op by op:
/// `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))`.
fn gelu_tanh(k: &mut Builder, x: Tid) -> Tid {
    let half = k.pointwise("mlp.act (0.5*x)", &[x], k.dtype[x], &[]);
    let xf = k.cast_f32("mlp.act (pow)", x);
    let p = k.pointwise("mlp.act (pow)", &[xf], F32, &[xf]);
    let p2 = k.pointwise("mlp.act (mul)", &[p], F32, &[]);
    let p3 = k.pointwise("mlp.act (add)", &[x, p2], F32, &[]);
    let p4 = k.pointwise("mlp.act (mul)", &[p3], F32, &[]);
    let t = k.pointwise("mlp.act (tanh)", &[p4], F32, &[]);
    let tn = k.g.nodes.len() - 1;
    k.g.nodes[tn].saved = vec![t];
    let u = k.pointwise("mlp.act (add)", &[t], F32, &[]);
    let y = k.pointwise("mlp.act (mul)", &[half, u], F32, &[half, u]);
    // `input` is the function's argument until it returns.
    k.refs(&[x]);
    y
}

/// Hugging Face `BertForMaskedLM` (post-LN encoder, exact GELU, SDPA).
fn bert(m: &ModelShape, st: StepShape) -> Graph {
    let (b, s, h, v) = (st.batch, st.seq, m.hidden, m.vocab);
    let rows = b * s;
    let mut k = Builder::new(st.amp, st.batch).evaluating(st.inference);
    let ids = k.input(rows * 8);
    k.module("bert.embeddings.");
    let (we, pe, te) = (k.param(v * h), k.param(512.max(s) * h), k.param(2 * h));
    let tt = k.t(rows, 8);
    k.node("token_type_ids", Node { outputs: vec![tt], ..Default::default() });
    let e1 = k.t(rows * h, F32);
    k.node(
        "word_embeddings",
        Node { inputs: vec![ids], outputs: vec![e1], param_grads: vec![we], ..Default::default() },
    );
    let e2 = k.t(rows * h, F32);
    k.node(
        "token_type_embeddings",
        Node { inputs: vec![tt], outputs: vec![e2], param_grads: vec![te], ..Default::default() },
    );
    let x = k.add("embeddings", e1, e2);
    // The position embeddings' lookup is one row per position, added by
    // broadcasting; it lives until the module returns.
    let pl = k.t(s * h, F32);
    k.node("position_embeddings (lookup)", Node { outputs: vec![pl], ..Default::default() });
    let p = k.t(rows * h, F32);
    k.node(
        "position_embeddings",
        Node {
            inputs: vec![x],
            grad_in: vec![x],
            outputs: vec![p],
            param_grads: vec![pe],
            pass_through: true,
            ..Default::default()
        },
    );
    let x = k.layer_norm("LayerNorm", p, rows, h);
    // `BertEmbeddings.forward`'s locals (`inputs_embeds`,
    // `token_type_embeddings`) live until it returns (docs/user/synth.md).
    k.eval_refs(&[e1, e2, pl]);
    let mut r = k.dropout("dropout", x);
    let embedding_output = r;
    for l in 0..m.layers {
        k.module(format!("bert.encoder.layer.{l}."));
        let r_in = r;
        k.segment(segment_of(l, m.layers, st.checkpoint));
        let mut qkv = Vec::new();
        for name in ["attention.self.query", "attention.self.key", "attention.self.value"] {
            let (w, bi) = (k.param(h * h), k.param(h));
            qkv.push(k.linear(name, r, rows, h, w, Some(bi)));
        }
        let o = k.sdpa(qkv[0], qkv[1], qkv[2], b, m.heads, s, h, true);
        let (w, bi) = (k.param(h * h), k.param(h));
        let yd = k.linear("attention.output.dense", o, rows, h, w, Some(bi));
        let y = k.dropout("attention.output.dropout", yd);
        let a = k.add("attention.output (residual)", y, r);
        let a = k.layer_norm("attention.output.LayerNorm", a, rows, h);
        // Until `BertAttention` returns: its `self_outputs` and the dense
        // output `BertSelfOutput` rebinds.
        k.eval_refs(&[o, yd, y]);
        let (w, bi) = (k.param(h * m.ffn), k.param(m.ffn));
        let f = k.linear("intermediate.dense", a, rows, m.ffn, w, Some(bi));
        let g = k.pointwise("intermediate.act (gelu)", &[f], k.dtype[f], &[f]);
        let (w, bi) = (k.param(m.ffn * h), k.param(h));
        let yd = k.linear("output.dense", g, rows, h, w, Some(bi));
        let y = k.dropout("output.dropout", yd);
        let a2 = k.add("output (residual)", y, a);
        r = k.layer_norm("output.LayerNorm", a2, rows, h);
        // Until the layer returns, in the order Python lets them go: the
        // dense output, the feed-forward's input (`apply_chunking_to_forward`),
        // the attention's output; then the encoder's `hidden_states` until
        // the new one rebinds it (the first is `BertModel`'s
        // `embedding_output`, held until the encoder returns).
        k.eval_refs(&[yd, y, g, a]);
        if l > 0 {
            k.eval_refs(&[r_in]);
        }
    }
    k.eval_refs(&[embedding_output]);
    k.segment(0);
    k.module("cls.predictions.");
    let (w, bi) = (k.param(h * h), k.param(h));
    let t = k.linear("transform.dense", r, rows, h, w, Some(bi));
    let t = k.pointwise("transform.act (gelu)", &[t], k.dtype[t], &[t]);
    let t = k.layer_norm("transform.LayerNorm", t, rows, h);
    let bi = k.param(v);
    let logits = k.linear("decoder", t, rows, v, we, Some(bi));
    // `BertForMaskedLM.forward` holds the encoder's output
    // (`sequence_output`) while its head runs.
    k.eval_refs(&[r]);
    k.head(logits, rows, v, st.inference)
}

/// RMSNorm as transformers writes it: fp32 `pow`, `mean`, `rsqrt`, two
/// multiplies; saves its input, the rsqrt and the normalised tensor.
fn rms_norm(k: &mut Builder, what: &str, x: Tid, rows: u64, h: u64) -> Tid {
    let w = k.param(h);
    let x = k.cast_f32(what, x);
    let sq = k.t(rows * h, F32);
    let var = k.t(rows, F32);
    k.node(what, Node { inputs: vec![x], outputs: vec![sq], saved: vec![x], grad_in: vec![x], ..Default::default() });
    k.node(what, Node { inputs: vec![sq], outputs: vec![var], grad_in: vec![sq], ..Default::default() });
    let rs = k.t(rows, F32);
    k.node(
        what,
        Node { inputs: vec![var], outputs: vec![rs], saved: vec![rs], grad_in: vec![var], ..Default::default() },
    );
    let n = k.pointwise(what, &[x, rs], F32, &[x, rs]);
    let y = k.t(rows * h, F32);
    k.node(
        what,
        Node {
            inputs: vec![n],
            outputs: vec![y],
            saved: vec![n],
            grad_in: vec![n],
            param_grads: vec![w],
            ..Default::default()
        },
    );
    y
}

/// Hugging Face `LlamaForCausalLM` (RMSNorm, RoPE, GQA, SwiGLU, tied head).
fn llama(m: &ModelShape, st: StepShape) -> Graph {
    let (b, s, h, v) = (st.batch, st.seq, m.hidden, m.vocab);
    let rows = b * s;
    let hd = h / m.heads.max(1);
    let kvh = m.kv_heads.max(1) * hd;
    let mut k = Builder::new(st.amp, st.batch).evaluating(st.inference);
    let ids = k.input(rows * 8);
    k.module("model.");
    let we = k.param(v * h);
    let mut r = k.t(rows * h, F32);
    k.node("embed_tokens", Node { inputs: vec![ids], outputs: vec![r], param_grads: vec![we], ..Default::default() });
    let cos = k.t(b * s * hd, F32);
    let sin = k.t(b * s * hd, F32);
    k.node("rotary_emb", Node { outputs: vec![cos, sin], ..Default::default() });
    k.g.held.extend([cos, sin]);
    for l in 0..m.layers {
        k.module(format!("model.layers.{l}."));
        k.segment(segment_of(l, m.layers, st.checkpoint));
        let x = rms_norm(&mut k, "input_layernorm", r, rows, h);
        let (wq, wk, wv) = (k.param(h * h), k.param(h * kvh), k.param(h * kvh));
        let q = k.linear("self_attn.q_proj", x, rows, h, wq, None);
        let kk = k.linear("self_attn.k_proj", x, rows, kvh, wk, None);
        let vv = k.linear("self_attn.v_proj", x, rows, kvh, wv, None);
        // apply_rotary_pos_emb: q*cos + rotate_half(q)*sin, for q and k.
        let mut rot = Vec::new();
        for (name, t) in [("q", q), ("k", kk)] {
            let d = k.dtype[t];
            let a = k.pointwise(&format!("self_attn (rope {name}*cos)"), &[t], d.max(F32), &[]);
            let half = k.pointwise(&format!("self_attn (rope rotate_half {name})"), &[t], d, &[]);
            let c = k.pointwise("self_attn (rope *sin)", &[half], d.max(F32), &[]);
            rot.push(k.add(&format!("self_attn (rope {name})"), a, c));
        }
        let (qr, kr) = (rot[0], rot[1]);
        let qr = k.cast_bf16("self_attn (sdpa cast)", qr);
        let kr = k.cast_bf16("self_attn (sdpa cast)", kr);
        // repeat_kv for grouped-query attention copies k and v per head.
        let d = k.dtype[vv];
        let (ke, ve) = (k.t(rows * h, k.dtype[kr]), k.t(rows * h, d));
        k.node(
            "self_attn (repeat_kv)",
            Node { inputs: vec![kr], outputs: vec![ke], grad_in: vec![kr], ..Default::default() },
        );
        k.node(
            "self_attn (repeat_kv)",
            Node { inputs: vec![vv], outputs: vec![ve], grad_in: vec![vv], ..Default::default() },
        );
        let o = if st.amp {
            k.sdpa(qr, ke, ve, b, m.heads, s, h, false)
        } else {
            // fp32 with a causal mask takes SDPA's math path: the
            // probabilities are materialised and saved.
            let probs = k.t(b * m.heads * s * s, F32);
            let o = k.t(rows * h, F32);
            k.node(
                "self_attn (sdpa math)",
                Node {
                    inputs: vec![qr, ke, ve],
                    outputs: vec![probs, o],
                    saved: vec![qr, ke, ve, probs],
                    grad_in: vec![qr, ke, ve],
                    temps: vec![b * m.heads * s * s * F32],
                    ..Default::default()
                },
            );
            o
        };
        let oc = k.pointwise("self_attn (transpose)", &[o], k.dtype[o], &[]);
        let wo = k.param(h * h);
        let y = k.linear("self_attn.o_proj", oc, rows, h, wo, None);
        // LlamaDecoderLayer's `hidden_states` holds the norm's output, and
        // the attention's `value_states` the projection, until it returns.
        k.refs(&[x, vv]);
        let r2 = k.add("residual", y, r);
        let x2 = rms_norm(&mut k, "post_attention_layernorm", r2, rows, h);
        let (wg, wu, wd) = (k.param(h * m.ffn), k.param(h * m.ffn), k.param(m.ffn * h));
        let gt = k.linear("mlp.gate_proj", x2, rows, m.ffn, wg, None);
        let act = k.pointwise("mlp.act_fn (silu)", &[gt], k.dtype[gt], &[gt]);
        let up = k.linear("mlp.up_proj", x2, rows, m.ffn, wu, None);
        let pr = k.pointwise("mlp (act*up)", &[act, up], k.dtype[up], &[act, up]);
        let y = k.linear("mlp.down_proj", pr, rows, h, wd, None);
        k.refs(&[x2]);
        r = k.add("residual", y, r2);
    }
    k.segment(0);
    k.module("model.");
    let x = rms_norm(&mut k, "norm", r, rows, h);
    k.module("");
    let logits = k.linear("lm_head", x, rows, v, we, None);
    k.head(logits, rows, v, st.inference)
}

/// torchvision's ResNet-50 (v1.5: stride in the 3x3 conv), 224x224 input.
fn resnet50(st: StepShape) -> Graph {
    let b = st.batch;
    let mut k = Builder::new(st.amp, st.batch).evaluating(st.inference);
    let img = k.input(b * 3 * 224 * 224 * F32);
    k.dtype[img] = F32;
    // The labels: allocated with the batch, read only by the loss.
    k.input(b * 8);
    let x = conv(&mut k, "conv1", img, [3, 64, 7, 2, 224]);
    let x = bn_relu(&mut k, "bn1", x, 64, 112, true);
    // Max pooling keeps int64 indices for backward.
    let d = k.dtype[x];
    let pooled = k.t(b * 64 * 56 * 56, d);
    let idx = k.t(b * 64 * 56 * 56, 8);
    k.node(
        "maxpool",
        Node { inputs: vec![x], outputs: vec![pooled, idx], saved: vec![idx], grad_in: vec![x], ..Default::default() },
    );
    let mut x = pooled;
    let mut cin = 64;
    let stages = [(3u64, 64u64, 56u64), (4, 128, 28), (6, 256, 14), (3, 512, 7)];
    let n_blocks: u64 = stages.iter().map(|s| s.0).sum();
    let mut block = 0;
    for (si, &(n, width, hw)) in stages.iter().enumerate() {
        for bi in 0..n {
            k.segment(segment_of(block, n_blocks, st.checkpoint));
            block += 1;
            let p = format!("layer{}.{bi}.", si + 1);
            let out = width * 4;
            let in_hw = if bi == 0 && si > 0 { hw * 2 } else { hw };
            let stride = in_hw / hw;
            let y = conv(&mut k, &format!("{p}conv1"), x, [cin, width, 1, 1, in_hw]);
            let y = bn_relu(&mut k, &format!("{p}bn1"), y, width, in_hw, true);
            let y = conv(&mut k, &format!("{p}conv2"), y, [width, width, 3, stride, in_hw]);
            let y = bn_relu(&mut k, &format!("{p}bn2"), y, width, hw, true);
            let y = conv(&mut k, &format!("{p}conv3"), y, [width, out, 1, 1, hw]);
            let y = bn_relu(&mut k, &format!("{p}bn3"), y, out, hw, false);
            let identity = if bi == 0 {
                let d = conv(&mut k, &format!("{p}downsample.0"), x, [cin, out, 1, stride, in_hw]);
                bn_relu(&mut k, &format!("{p}downsample.1"), d, out, hw, false)
            } else {
                x
            };
            // out += identity; relu(out), both in place.
            let s = k.alias(y);
            k.node(
                &format!("{p}add"),
                Node {
                    inputs: vec![y, identity],
                    grad_in: vec![y, identity],
                    outputs: vec![s],
                    pass_through: true,
                    ..Default::default()
                },
            );
            let o = k.alias(y);
            k.node(
                &format!("{p}relu"),
                Node { inputs: vec![s], outputs: vec![o], saved: vec![y], grad_in: vec![s], ..Default::default() },
            );
            // Bottleneck.forward's argument `x` lives until it returns
            // (under no_grad nothing else keeps it past the downsample).
            k.refs(&[x]);
            x = o;
            cin = out;
        }
    }
    k.segment(0);
    let d = k.dtype[x];
    let pooled = k.t(b * 2048, d);
    k.node("avgpool", Node { inputs: vec![x], outputs: vec![pooled], grad_in: vec![x], ..Default::default() });
    let (w, bi) = (k.param(2048 * 1000), k.param(1000));
    let logits = k.linear("fc", pooled, b, 1000, w, Some(bi));
    k.head(logits, b, 1000, st.inference)
}

/// A convolution `[cin, cout, ks, stride, size]`: `ks`×`ks` at `stride` over `size`² inputs (padding
/// `ks / 2`, as torchvision's): saves its input; cuDNN's workspaces where
/// they were measured (`workload::cudnn`).
fn conv(k: &mut Builder, what: &str, x: Tid, [cin, cout, ks, stride, size]: [u64; 5]) -> Tid {
    let b = k.batch;
    let geom = super::cudnn::Conv { cin, cout, kernel: ks, stride, padding: ks / 2, size };
    let hw = (size + 2 * geom.padding - ks) / stride + 1;
    let ws = super::cudnn::workspaces(geom, k.amp, b).unwrap_or_default();
    let w = k.param(cout * cin * ks * ks);
    let (xc, wc) = match k.weight(what, w) {
        Some(wc) => {
            let xc = k.cast_bf16(what, x);
            (xc, Some(wc))
        }
        None => (x, None),
    };
    let y = k.t(b * cout * hw * hw, k.act_dtype());
    let mut inputs = vec![xc];
    inputs.extend(wc);
    let mut saved = vec![xc];
    saved.extend(wc);
    k.node(
        what,
        Node {
            grad_in: inputs.clone(),
            inputs,
            outputs: vec![y],
            saved,
            param_grads: if wc.is_some() { vec![] } else { vec![w] },
            temps: [ws.forward].into_iter().filter(|&w| w > 0).collect(),
            grad_ws: vec![ws.backward_data, ws.backward_filter],
            ..Default::default()
        },
    );
    y
}

/// BatchNorm (cuDNN: saves its input, mean and inverse std), then `relu`
/// in place, which saves the output.
fn bn_relu(k: &mut Builder, what: &str, x: Tid, c: u64, hw: u64, relu: bool) -> Tid {
    let y = k.t(k.batch * c * hw * hw, k.dtype[x]);
    let y = k.normalize(what, x, y, c, c);
    if !relu {
        return y;
    }
    let o = k.alias(y);
    k.node(
        &format!("{what} relu"),
        Node { inputs: vec![y], outputs: vec![o], saved: vec![y], grad_in: vec![y], ..Default::default() },
    );
    o
}

/// Linear layers with ReLU over `hidden` units: 1024 → hidden ×layers → 1000.
fn mlp(m: &ModelShape, st: StepShape) -> Graph {
    let b = st.batch;
    let mut k = Builder::new(st.amp, st.batch).evaluating(st.inference);
    let x0 = k.input(b * m.ffn * F32);
    k.dtype[x0] = F32;
    k.input(b * 8);
    let mut x = x0;
    let mut fin = m.ffn;
    for l in 0..m.layers {
        k.segment(segment_of(l, m.layers, st.checkpoint));
        let (w, bi) = (k.param(fin * m.hidden), k.param(m.hidden));
        let y = k.linear(&format!("{}", 2 * l), x, b, m.hidden, w, Some(bi));
        x = k.pointwise(&format!("{} relu", 2 * l + 1), &[y], k.dtype[y], &[]);
        let n = k.g.nodes.len() - 1;
        k.g.nodes[n].saved = vec![x];
        fin = m.hidden;
    }
    k.segment(0);
    let (w, bi) = (k.param(fin * m.vocab), k.param(m.vocab));
    let logits = k.linear("head", x, b, m.vocab, w, Some(bi));
    k.head(logits, b, m.vocab, st.inference)
}
