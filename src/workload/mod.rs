//! Synthetic allocation patterns as streams of requests. For now one built-in
//! training-loop pattern drives `demo`; the model-based generators of the
//! synthetic-workload issue will live here too.

/// One request of a synthetic program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Alloc {
        key: u64,
        size: u64,
    },
    Free {
        key: u64,
    },
    EmptyCache,
    /// An iteration ended (the `Optimizer.step` of a real run).
    Iteration(u64),
}

/// A small transformer-like training loop: parameters and optimizer state
/// up front, then per iteration activations kept for backward, temporaries,
/// gradients, and an optimizer step, with the batch varying by up to ±25%
/// so that the cache fragments. Deterministic for a seed.
#[derive(Debug, Clone)]
pub struct DemoLoop {
    rng: u64,
    next_key: u64,
    queue: std::collections::VecDeque<Op>,
    iteration: u64,
    layers: usize,
    params: Vec<u64>,
}

const MIB: u64 = 1 << 20;

impl DemoLoop {
    pub fn new(seed: u64) -> Self {
        let mut d = DemoLoop {
            rng: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
            next_key: 1,
            queue: Default::default(),
            iteration: 0,
            layers: 12,
            params: Vec::new(),
        };
        // Parameters, gradients and two optimizer states per layer.
        for l in 0..d.layers {
            let size = (9 + (l % 3) as u64 * 4) * MIB;
            for _ in 0..4 {
                let k = d.key();
                d.params.push(k);
                d.queue.push_back(Op::Alloc { key: k, size });
            }
        }
        d
    }

    fn key(&mut self) -> u64 {
        self.next_key += 1;
        self.next_key
    }

    fn rand(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    fn plan_iteration(&mut self) {
        self.iteration += 1;
        // Batch factor 0.75..1.25, in percent.
        let batch = 75 + self.rand() % 51;
        let mut acts = Vec::new();
        for l in 0..self.layers {
            let act = (6 + (l % 4) as u64 * 3) * MIB * batch / 100 + (self.rand() % 4096) * 512;
            let k = self.key();
            self.queue.push_back(Op::Alloc { key: k, size: act });
            acts.push((k, act));
            // A temporary of the layer's forward.
            let t = self.key();
            let ts = 256 * 1024 + self.rand() % (2 * MIB);
            self.queue.push_back(Op::Alloc { key: t, size: ts });
            self.queue.push_back(Op::Free { key: t });
        }
        for (k, act) in acts.into_iter().rev() {
            let g = self.key();
            self.queue.push_back(Op::Alloc { key: g, size: act });
            self.queue.push_back(Op::Free { key: k });
            self.queue.push_back(Op::Free { key: g });
        }
        // Optimizer step temporaries.
        let o = self.key();
        self.queue.push_back(Op::Alloc { key: o, size: 24 * MIB });
        self.queue.push_back(Op::Free { key: o });
        self.queue.push_back(Op::Iteration(self.iteration));
        if self.iteration % 10 == 0 {
            self.queue.push_back(Op::EmptyCache);
        }
    }
}

impl Iterator for DemoLoop {
    type Item = Op;
    fn next(&mut self) -> Option<Op> {
        if self.queue.is_empty() {
            self.plan_iteration();
        }
        self.queue.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_loop_is_deterministic_and_balanced() {
        let a: Vec<Op> = DemoLoop::new(7).take(2000).collect();
        let b: Vec<Op> = DemoLoop::new(7).take(2000).collect();
        assert_eq!(a, b);
        assert_ne!(a, DemoLoop::new(8).take(2000).collect::<Vec<_>>());
        // Every iteration frees what it allocated: only the 48 parameter
        // tensors stay live across iterations.
        let mut live = std::collections::HashSet::new();
        let mut iterations = 0;
        for op in DemoLoop::new(7).take(5000) {
            match op {
                Op::Alloc { key, .. } => assert!(live.insert(key)),
                Op::Free { key } => assert!(live.remove(&key)),
                Op::Iteration(_) => {
                    iterations += 1;
                    assert_eq!(live.len(), 48);
                }
                Op::EmptyCache => {}
            }
        }
        assert!(iterations > 40);
    }
}
