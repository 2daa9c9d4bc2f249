"""gpumem-top for Hugging Face's ``Trainer``, in one line:

    from gpumem_top.integrations.huggingface import GpumemTopCallback
    trainer = Trainer(..., callbacks=[GpumemTopCallback()])

It publishes from the Trainer's start (``gpumem-top`` shows the process
live, each optimizer step's true peaks), records PyTorch's memory history without call stacks
(``history`` entries; 0: none; ``history_stacks=True`` adds Python stacks, at
PyTorch's cost: +1.6% of a GPT-2 step on the H200), writes a snapshot at every CUDA
out-of-memory error (``oom_snapshot``, ``{pid}`` and ``{n}`` filled in) and,
with ``snapshot_at_end``, one when training ends. Importable without
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
        history=100_000,
        history_stacks=False,
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
