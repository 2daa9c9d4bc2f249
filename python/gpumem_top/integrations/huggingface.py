"""gpumem-top for Hugging Face's ``Trainer``, in one line:

    from gpumem_top.integrations.huggingface import GpumemTopCallback
    trainer = Trainer(..., callbacks=[GpumemTopCallback()])

It publishes from the Trainer's start (``gpumem-top`` shows the process
live, each optimizer step's true peaks) and writes a snapshot at every CUDA
out-of-memory error (``oom_snapshot``, ``{pid}`` and ``{n}`` filled in) and,
with ``snapshot_at_end``, one when training ends. Publishing alone cost
+0.5% of a GPT-2 step on the H200; the snapshot then holds the allocator's
state at the OOM. ``history=100_000`` has PyTorch record its memory history
too, so the snapshot replays the run up to the failed request, at about 2%
of a step (``history_stacks=False``: without call stacks). Importable without
transformers; creating the callback then raises ImportError.
"""

from ._common import Publishing, missing

try:
    from transformers import TrainerCallback as _Base

    _missing = None
except ImportError as e:  # the module imports; the callback says why not
    _Base = object
    _missing = e

__all__ = ["GpumemTopCallback"]


class GpumemTopCallback(_Base):
    def __init__(
        self,
        interval=0.5,
        step_peaks=True,
        history=0,
        history_stacks=True,
        oom_snapshot="gpumem-top-oom-{pid}-{n}.pickle",
        snapshot_at_end=None,
    ):
        if _missing is not None:
            raise missing("huggingface", "transformers", _missing)
        self._p = Publishing(interval, step_peaks, history, history_stacks, oom_snapshot, snapshot_at_end)

    # The Trainer has placed the model by now: CUDA is initialised.
    def on_init_end(self, args, state, control, **kwargs):
        self._p.start()

    def on_train_begin(self, args, state, control, **kwargs):
        self._p.start()

    # Once per optimizer step (after any accumulation); the optimizer's own
    # hook has marked it when it is a torch.optim one.
    def on_step_end(self, args, state, control, **kwargs):
        self._p.step()

    def on_train_end(self, args, state, control, **kwargs):
        self._p.end()
