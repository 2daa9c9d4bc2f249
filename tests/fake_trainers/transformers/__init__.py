"""A stand-in for transformers' Trainer callback protocol (see README.md)."""

import torch
from torch.optim.optimizer import step as optimizer_step


class TrainerCallback:
    pass


class TrainerState:
    def __init__(self):
        self.global_step = 0


class Trainer:
    def __init__(self, callbacks=(), steps=3, accumulation=1):
        self.callbacks = list(callbacks)
        self.state = TrainerState()
        self.steps, self.accumulation = steps, accumulation
        self._call("on_init_end")

    def _call(self, event):
        for c in self.callbacks:
            f = getattr(c, event, None)
            if f is not None:
                f(None, self.state, None)

    def train(self):
        self._call("on_train_begin")
        for _ in range(self.steps):
            self._call("on_step_begin")
            for _ in range(self.accumulation):
                torch._C._alloc(1 << 20)
                torch._C._free(1 << 20)
                self._call("on_substep_end")
            optimizer_step()
            self.state.global_step += 1
            self._call("on_step_end")
        self._call("on_train_end")
