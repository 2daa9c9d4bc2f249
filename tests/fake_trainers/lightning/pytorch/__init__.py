"""A stand-in for Lightning's Trainer callback protocol (see README.md)."""

import torch
from torch.optim.optimizer import step as optimizer_step

from . import callbacks


class Trainer:
    def __init__(self, callbacks=(), batches=3, accumulate_grad_batches=1):
        self.callbacks = list(callbacks)
        self.batches, self.accumulate = batches, accumulate_grad_batches

    def fit(self, module=None):
        for c in self.callbacks:
            c.setup(self, module, "fit")
        for i in range(self.batches):
            torch._C._alloc(1 << 20)
            torch._C._free(1 << 20)
            if (i + 1) % self.accumulate == 0:
                optimizer_step()
                for c in self.callbacks:
                    c.on_before_zero_grad(self, module, None)
            for c in self.callbacks:
                c.on_train_batch_end(self, module, None, None, i)
        for c in self.callbacks:
            c.on_train_end(self, module)
