//! A training step as autograd runs it: a forward graph of ops with the
//! tensors each one allocates and saves for backward, executed into the
//! allocation requests PyTorch makes, in PyTorch's order.
//!
//! Forward allocates each op's outputs, frees a tensor after its last use
//! unless something saved it; backward walks the ops in reverse, allocating
//! input and parameter gradients and freeing each op's output gradients and
//! the tensors it was the last (earliest-in-forward) to have saved.
//! Checkpointed segments save nothing in forward but their inputs, and are
//! recomputed just before their backward.

use std::collections::HashMap;

use super::Op;
use crate::analysis::categories::Category;

/// A tensor of the step: an index into `Graph::sizes`.
pub(crate) type Tid = usize;

/// One op of the forward pass.
#[derive(Debug, Clone, Default)]
pub(crate) struct Node {
    /// Index into the workload's call-site table.
    pub(crate) site: u32,
    pub(crate) inputs: Vec<Tid>,
    pub(crate) outputs: Vec<Tid>,
    /// Tensors (inputs or outputs) kept alive for this op's backward.
    pub(crate) saved: Vec<Tid>,
    /// Forward scratch allocations, freed before the op returns.
    pub(crate) temps: Vec<u64>,
    /// Inputs that receive a gradient from this op's backward.
    pub(crate) grad_in: Vec<Tid>,
    /// Parameters (indices into `Graph::params`) that receive a gradient.
    pub(crate) param_grads: Vec<usize>,
    /// Backward scratch allocations.
    pub(crate) bwd_temps: Vec<u64>,
    /// A workspace taken right after each gradient this op's backward
    /// allocates (`grad_in`, then `param_grads`; 0: none): cuDNN's
    /// backward-data and backward-filter workspaces (`workload::cudnn`).
    pub(crate) grad_ws: Vec<u64>,
    /// A cuBLAS call: the first one in forward and in backward allocates the
    /// handle's workspace (kept for the life of the process).
    pub(crate) matmul: bool,
    /// Checkpoint segment (0: never checkpointed).
    pub(crate) segment: u32,
    /// The gradient reaches the inputs as is (additions): nothing allocated.
    pub(crate) pass_through: bool,
    /// Tensors a Python variable still references here though the op does
    /// not use them: they live at least until it has run.
    pub(crate) refs: Vec<Tid>,
}

/// One step's forward graph.
#[derive(Debug, Clone, Default)]
pub struct Graph {
    /// Bytes each tensor allocates (0 for a view of another tensor).
    pub(crate) sizes: Vec<u64>,
    /// Bytes of the tensor's data, which is what its gradient takes.
    pub(crate) logical: Vec<u64>,
    /// The tensor whose storage a view shares.
    pub(crate) base: Vec<Option<Tid>>,
    /// Autocast's cached weight casts: dropped when the forward ends unless saved.
    pub(crate) autocast_cache: Vec<Tid>,
    pub(crate) nodes: Vec<Node>,
    /// Tensors the training loop holds until backward is done (the batch,
    /// the model's output, the loss).
    pub(crate) held: Vec<Tid>,
    /// Tensors made before the graph runs (the batch): allocated first.
    pub(crate) inputs: Vec<Tid>,
    /// What the loop's `out` references (the model's output, a key/value
    /// cache), and its `loss`: both also in `held`, and kept past backward
    /// until the next micro-batch rebinds the name or the step's end.
    pub(crate) output: Vec<Tid>,
    pub(crate) loss: Option<Tid>,
    /// The first node of the loss (after the model's forward returned).
    pub(crate) loss_from: Option<usize>,
    /// Parameter sizes in bytes (fp32 master weights).
    pub params: Vec<u64>,
    /// Call-site labels, indexed by `Node::site`.
    pub(crate) sites: Vec<String>,
}

impl Graph {
    pub(crate) fn tensor(&mut self, bytes: u64) -> Tid {
        self.sizes.push(bytes);
        self.logical.push(bytes);
        self.base.push(None);
        self.sizes.len() - 1
    }
    /// A view of `of` (in-place results, reshapes): never allocated.
    pub(crate) fn alias(&mut self, of: Tid, bytes: u64) -> Tid {
        let root = self.root(of);
        self.sizes.push(0);
        self.logical.push(bytes);
        self.base.push(Some(root));
        self.sizes.len() - 1
    }
    pub(crate) fn root(&self, t: Tid) -> Tid {
        self.base[t].unwrap_or(t)
    }
    pub(crate) fn site(&mut self, label: impl Into<String>) -> u32 {
        let label = label.into();
        if let Some(i) = self.sites.iter().position(|s| *s == label) {
            return i as u32;
        }
        self.sites.push(label);
        self.sites.len() as u32 - 1
    }
}

/// cuBLAS workspace a handle takes on Hopper at its first GEMM: 32 MiB plus
/// cuBLASLt's 1 MiB (both seen in the recorded H200 traces, never freed).
pub(crate) const CUBLAS_WORKSPACE: u64 = 32 << 20;
pub(crate) const CUBLASLT_WORKSPACE: u64 = 1 << 20;

/// What persists across steps: parameters, their gradients, optimizer state,
/// the cuBLAS workspaces, and key numbering.
#[derive(Debug, Clone, Default)]
pub(crate) struct Persistent {
    next_key: u64,
    pub(crate) param_keys: Vec<u64>,
    /// Present between backward and `zero_grad`.
    pub(crate) grad_keys: Vec<Option<u64>>,
    pub(crate) state_keys: Vec<u64>,
    pub(crate) fwd_workspace: bool,
    pub(crate) bwd_workspace: bool,
}

impl Persistent {
    pub(crate) fn key(&mut self) -> u64 {
        self.next_key += 1;
        self.next_key
    }
    /// The last key handed out.
    pub(crate) fn last_key(&self) -> u64 {
        self.next_key
    }
}

/// What the training loop still references of a micro-batch after its
/// backward (`x, y`, `out`, `loss`): each is freed when the next
/// micro-batch rebinds its name (`x, y = batch()` once the new batch is
/// made, `out = model(x)` once the new forward returned, `loss = …` once
/// the new loss is made), the last one's after the optimizer step and
/// `zero_grad` (`del loss, out, x, y`). docs/user/synth.md.
#[derive(Debug, Default)]
pub(crate) struct Held {
    batch: Vec<u64>,
    output: Vec<u64>,
    loss: Vec<u64>,
}

impl Held {
    /// `del loss, out, x, y`.
    pub(crate) fn release(self, out: &mut Vec<Op>) {
        for key in self.loss.into_iter().chain(self.output).chain(self.batch) {
            out.push(Op::Free { key });
        }
    }
}

/// How one step runs its graph.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct StepMode {
    /// `torch.no_grad()`: nothing saved, no backward.
    pub(crate) inference: bool,
    /// Checkpoint segments (`Node::segment` > 0) save only their inputs.
    pub(crate) checkpoint: bool,
}

/// Emits the requests of one forward (and backward) pass of `g`.
pub(crate) struct Executor<'a> {
    g: &'a Graph,
    p: &'a mut Persistent,
    out: &'a mut Vec<Op>,
    site_base: u32,
    keys: Vec<Option<u64>>,
    grads: HashMap<Tid, Option<u64>>,
    /// The previous micro-batch's `out`, freed when forward reaches this node.
    rebind: Option<(usize, Vec<u64>)>,
    /// Per tensor (root): whether a backward node frees it (an activation).
    saved: Vec<bool>,
    /// Recomputing a checkpointed segment in backward: what it makes is
    /// temporary (docs/user/categories.md).
    recomputing: bool,
}

impl<'a> Executor<'a> {
    pub fn new(g: &'a Graph, p: &'a mut Persistent, out: &'a mut Vec<Op>, site_base: u32) -> Self {
        Executor {
            g,
            p,
            out,
            site_base,
            keys: vec![None; g.sizes.len()],
            grads: HashMap::new(),
            rebind: None,
            saved: vec![false; g.sizes.len()],
            recomputing: false,
        }
    }

    fn alloc_key(&mut self, size: u64, site: u32, cat: Category) -> u64 {
        let key = self.p.key();
        self.out.push(Op::Alloc { key, size, site: self.site_base + site, cat });
        key
    }

    fn alloc(&mut self, t: Tid, site: u32) {
        if self.keys[t].is_none() && self.g.sizes[t] > 0 {
            let root = self.g.root(t);
            let cat = if self.g.inputs.contains(&t) {
                Category::Input
            } else if self.saved[root] && !self.recomputing && !self.g.held.contains(&root) {
                Category::Activation
            } else {
                Category::Temporary
            };
            let k = self.alloc_key(self.g.sizes[t], site, cat);
            self.keys[t] = Some(k);
        }
    }

    fn free(&mut self, t: Tid) {
        if let Some(k) = self.keys[t].take() {
            self.out.push(Op::Free { key: k });
        }
    }

    fn free_keys(&mut self, keys: impl IntoIterator<Item = u64>) {
        self.out.extend(keys.into_iter().map(|key| Op::Free { key }));
    }

    fn scratch(&mut self, size: u64, site: u32) {
        let k = self.alloc_key(size, site, Category::Temporary);
        self.out.push(Op::Free { key: k });
    }

    fn checkpointed(&self, mode: StepMode, n: &Node) -> bool {
        mode.checkpoint && n.segment > 0
    }

    /// Runs forward over `range`; a tensor used last at node i is freed
    /// there unless `keep` says it lives on.
    fn forward(&mut self, range: std::ops::Range<usize>, keep: &[bool], ws_flag: bool) {
        let mut last_use: HashMap<Tid, usize> = HashMap::new();
        for i in range.clone() {
            let n = &self.g.nodes[i];
            for &t in n.inputs.iter().chain(&n.outputs).chain(&n.refs) {
                last_use.insert(self.g.root(t), i);
            }
        }
        for i in range.clone() {
            if self.rebind.as_ref().is_some_and(|r| r.0 == i) {
                let keys = self.rebind.take().map(|r| r.1).unwrap_or_default();
                self.free_keys(keys);
            }
            let n = &self.g.nodes[i];
            for j in 0..n.outputs.len() {
                let t = self.g.nodes[i].outputs[j];
                self.alloc(t, self.g.nodes[i].site);
            }
            let n = &self.g.nodes[i];
            // The handle's workspaces come with the first GEMM, after its output.
            if n.matmul && ws_flag && !self.p.fwd_workspace {
                self.p.fwd_workspace = true;
                let site = n.site;
                let (_k1, _k2) = (
                    self.alloc_key(CUBLAS_WORKSPACE, site, Category::Temporary),
                    self.alloc_key(CUBLASLT_WORKSPACE, site, Category::Temporary),
                );
            }
            let n = &self.g.nodes[i];
            for j in 0..n.temps.len() {
                let (s, site) = (self.g.nodes[i].temps[j], self.g.nodes[i].site);
                self.scratch(s, site);
            }
            let n = &self.g.nodes[i];
            let mut dead: Vec<Tid> = Vec::new();
            for &t in n.inputs.iter().chain(&n.outputs).chain(&n.refs) {
                let t = self.g.root(t);
                if last_use.get(&t) == Some(&i) && !keep[t] && !dead.contains(&t) {
                    dead.push(t);
                }
            }
            for t in dead {
                self.free(t);
            }
        }
    }

    /// Frees what node `i`'s backward was the last to need.
    fn release(&mut self, i: usize, release_at: &[Option<usize>]) {
        let g = self.g;
        let n = &g.nodes[i];
        for &t in n.saved.iter().chain(&n.inputs) {
            let t = g.root(t);
            if release_at[t] == Some(i) && !g.held.contains(&t) && !g.inputs.contains(&t) {
                self.free(t);
            }
        }
    }

    /// One step: forward, then (unless inference) backward, parameter
    /// gradients accumulating into `Persistent::grad_keys`. `prev` is what
    /// the loop held of the previous micro-batch; the result is what it
    /// holds of this one (nothing under inference, whose loop drops it).
    pub(crate) fn step(mut self, mode: StepMode, prev: Held) -> Held {
        let g = self.g;
        for &t in &g.inputs {
            self.alloc(t, 0);
        }
        self.free_keys(prev.batch);
        let at = g.loss_from.unwrap_or(g.nodes.len());
        self.rebind = Some((at, prev.output));
        let (keep, mut release_at) = self.saved_for_backward(mode);
        let needs = self.needs_grad();
        for (t, r) in release_at.iter().enumerate() {
            self.saved[t] = r.is_some();
        }
        self.forward(0..g.nodes.len(), &keep, true);
        let out = self.rebind.take().map(|r| r.1).unwrap_or_default();
        self.free_keys(out.into_iter().chain(prev.loss));
        if mode.inference {
            for &t in g.autocast_cache.iter().chain(&g.held).chain(&g.inputs) {
                self.free(t);
            }
            return Held::default();
        }
        // Leaving autocast drops the casts nothing saved.
        for &t in &g.autocast_cache {
            if release_at[t].is_none() {
                self.free(t);
            }
        }
        // Backward, from the loss.
        let Some(last) = g.nodes.last() else { return Held::default() };
        let root = last.outputs[0];
        let k = self.alloc_key(g.logical[root].max(4), last.site, Category::Temporary);
        self.grads.insert(root, Some(k));
        for i in (0..g.nodes.len()).rev() {
            self.backward_node(i, mode, &keep, &mut release_at, &needs);
        }
        // Gradients of inputs nobody asked for (the batch) are dropped.
        let rest: Vec<u64> = self.grads.drain().filter_map(|(_, k)| k).collect();
        for k in rest {
            self.out.push(Op::Free { key: k });
        }
        self.held_after()
    }

    /// What forward keeps (held tensors, and what backward will need), and
    /// for each tensor the earliest forward node whose backward needs it: it
    /// is freed once that node's backward ran.
    fn saved_for_backward(&self, mode: StepMode) -> (Vec<bool>, Vec<Option<usize>>) {
        let g = self.g;
        let n_t = g.sizes.len();
        let mut keep = vec![false; n_t];
        for &t in g.held.iter().chain(&g.inputs).chain(&g.autocast_cache) {
            keep[g.root(t)] = true;
        }
        let mut release_at: Vec<Option<usize>> = vec![None; n_t];
        if mode.inference {
            return (keep, release_at);
        }
        let mut seg_start: HashMap<u32, usize> = HashMap::new();
        for (i, n) in g.nodes.iter().enumerate() {
            if self.checkpointed(mode, n) {
                seg_start.entry(n.segment).or_insert(i);
            }
        }
        let produced_in: HashMap<Tid, u32> =
            g.nodes.iter().flat_map(|n| n.outputs.iter().map(move |&t| (t, n.segment))).collect();
        for (i, n) in g.nodes.iter().enumerate() {
            if self.checkpointed(mode, n) {
                // Only the segment's inputs from outside it are kept.
                for &t in &n.inputs {
                    if produced_in.get(&t) != Some(&n.segment) {
                        keep[g.root(t)] = true;
                        release_after(g, t, seg_start[&n.segment], &mut release_at);
                    }
                }
            } else {
                for &t in &n.saved {
                    keep[g.root(t)] = true;
                    release_after(g, t, i, &mut release_at);
                }
            }
        }
        (keep, release_at)
    }

    /// Which tensors autograd computes a gradient for: those made from a
    /// parameter, not the batch and what is made from it alone.
    fn needs_grad(&self) -> Vec<bool> {
        let g = self.g;
        let mut needs = vec![false; g.sizes.len()];
        for n in &g.nodes {
            if !n.param_grads.is_empty() || n.inputs.iter().any(|&t| needs[g.root(t)]) {
                for &t in &n.outputs {
                    needs[g.root(t)] = true;
                }
            }
        }
        needs
    }

    /// Node `i`'s backward (recomputing its checkpoint segment first when
    /// it is the segment's last node).
    fn backward_node(
        &mut self,
        i: usize,
        mode: StepMode,
        keep: &[bool],
        release_at: &mut [Option<usize>],
        needs: &[bool],
    ) {
        let g = self.g;
        let n = &g.nodes[i];
        if self.checkpointed(mode, n) && (i + 1 == g.nodes.len() || g.nodes[i + 1].segment != n.segment) {
            // Recompute the segment, saving as a normal forward would.
            let start = (0..=i).rev().take_while(|&j| g.nodes[j].segment == n.segment).last().unwrap_or(i);
            let mut keep2 = keep.to_vec();
            for j in start..=i {
                for &t in &g.nodes[j].saved {
                    keep2[g.root(t)] = true;
                    release_after(g, t, j, release_at);
                }
            }
            self.recomputing = true;
            self.forward(start..i + 1, &keep2, false);
            self.recomputing = false;
        }
        let n = &g.nodes[i];
        if !n.outputs.iter().any(|t| self.grads.contains_key(t)) {
            // Nothing flows back through this op (e.g. the batch's casts).
            self.release(i, release_at);
            return;
        }
        if n.matmul && !self.p.bwd_workspace {
            self.p.bwd_workspace = true;
            self.alloc_key(CUBLAS_WORKSPACE, n.site, Category::Temporary);
        }
        // An addition hands its output's gradient to its inputs as is:
        // the first input without a gradient takes the buffer.
        let mut handed = if n.pass_through {
            n.outputs.iter().find_map(|t| self.grads.get_mut(t).and_then(|k| k.take()))
        } else {
            None
        };
        let ws = |j: usize| g.nodes[i].grad_ws.get(j).copied().unwrap_or(0);
        for j in 0..n.grad_in.len() {
            let t = g.nodes[i].grad_in[j];
            if !needs[g.root(t)] {
                continue;
            }
            if g.nodes[i].pass_through {
                if let std::collections::hash_map::Entry::Vacant(e) = self.grads.entry(t) {
                    e.insert(handed.take());
                }
                continue;
            }
            let k = self.alloc_key(g.logical[t], g.nodes[i].site, Category::Temporary);
            if ws(j) > 0 {
                self.scratch(ws(j), g.nodes[i].site);
            }
            match self.grads.entry(t) {
                // Accumulated into the existing buffer in place.
                std::collections::hash_map::Entry::Occupied(_) => self.out.push(Op::Free { key: k }),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(Some(k));
                }
            }
        }
        let n_in = g.nodes[i].grad_in.len();
        for j in 0..g.nodes[i].param_grads.len() {
            let p = g.nodes[i].param_grads[j];
            let k = self.alloc_key(g.params[p], g.nodes[i].site, Category::Gradient);
            if ws(n_in + j) > 0 {
                self.scratch(ws(n_in + j), g.nodes[i].site);
            }
            if self.p.grad_keys[p].is_some() {
                self.out.push(Op::Free { key: k });
            } else {
                self.p.grad_keys[p] = Some(k);
            }
        }
        for j in 0..n.bwd_temps.len() {
            let (s, site) = (g.nodes[i].bwd_temps[j], g.nodes[i].site);
            self.scratch(s, site);
        }
        if let Some(k) = handed {
            self.out.push(Op::Free { key: k });
        }
        let n = &g.nodes[i];
        for &t in &n.outputs {
            if let Some(Some(k)) = self.grads.remove(&t) {
                self.out.push(Op::Free { key: k });
            }
        }
        self.release(i, release_at);
    }

    /// What the loop holds of this micro-batch (its batch, output and
    /// loss); the rest is freed.
    fn held_after(&mut self) -> Held {
        let g = self.g;
        let mut held = Held::default();
        for &t in &g.inputs {
            held.batch.extend(self.keys[g.root(t)].take());
        }
        for &t in &g.output {
            held.output.extend(self.keys[g.root(t)].take());
        }
        if let Some(t) = g.loss {
            held.loss.extend(self.keys[g.root(t)].take());
        }
        for &t in &g.held {
            self.free(t);
        }
        for t in 0..g.sizes.len() {
            self.free(t);
        }
        held
    }
}

/// Tensor `t` (its root) is released after node `i`'s backward, or earlier
/// where another node needs it first.
fn release_after(g: &Graph, t: Tid, i: usize, release_at: &mut [Option<usize>]) {
    let t = g.root(t);
    release_at[t] = Some(release_at[t].map_or(i, |r: usize| r.min(i)));
}
