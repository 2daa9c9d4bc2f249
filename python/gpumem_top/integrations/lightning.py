"""gpumem-top for Lightning, in one line:

    from gpumem_top.integrations.lightning import GpumemTopCallback
    trainer = lightning.Trainer(..., callbacks=[GpumemTopCallback()])

It publishes from ``setup`` (``gpumem-top`` shows the process live, each
optimizer step's true peaks) and writes a snapshot at every CUDA
out-of-memory error (``oom_snapshot``, ``{pid}`` and ``{n}`` filled in) and,
with ``snapshot_at_end``, one when training ends: the allocator's state at
the OOM. ``history=100_000`` has PyTorch record its memory history too, so
the snapshot replays the run up to the failed request, at about 2% of a
step (measurements/package; ``history_stacks=False``: without call stacks).
Works with ``lightning`` or
``pytorch_lightning``; importable without either, creating the callback
then raises ImportError.
"""

from ._common import Publishing, missing

try:
    from lightning.pytorch.callbacks import Callback as _Base

    _missing = None
except ImportError:
    try:
        from pytorch_lightning.callbacks import Callback as _Base

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
            raise missing("lightning", "lightning", _missing)
        super().__init__()
        self._p = Publishing(interval, step_peaks, history, history_stacks, oom_snapshot, snapshot_at_end)

    def setup(self, trainer, pl_module, stage):
        self._p.start()

    # Once per optimizer step under automatic optimization (after any
    # accumulation); the optimizer's own hook has marked it when it is a
    # torch.optim one.
    def on_before_zero_grad(self, trainer, pl_module, optimizer):
        self._p.step()

    def on_train_end(self, trainer, pl_module):
        self._p.end()
