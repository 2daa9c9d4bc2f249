"""gpumem-top from Python: the ``gpumem-top`` command (``python -m gpumem_top``)
and the publisher it injects with ``gpumem-top run``, for scripts whose
launcher is not yours (a cluster's job wrapper, a notebook, a Trainer):

    import gpumem_top
    gpumem_top.publish()            # as `gpumem-top run` would; never raises

then ``gpumem-top`` in another terminal shows the process live. With
``history=N`` PyTorch records its memory history (N entries), so a snapshot
replays the run; ``gpumem_top.snapshot(path)`` writes one now, and
``gpumem_top.snapshot_on_oom(path)`` at every out-of-memory error.
Trainers: ``gpumem_top.integrations.huggingface`` and
``gpumem_top.integrations.lightning``.

Nothing here raises into training: a failure is one line on stderr and a
False/None result (docs/user/live.md in the repository says what it costs).
"""

from . import _publish

__all__ = ["__version__", "publish", "step", "snapshot", "snapshot_on_oom", "stop", "binary"]


def _version():
    try:
        from importlib.metadata import version

        return version("gpumem-top")
    except Exception:
        return "0+unknown"


__version__ = _version()


def publish(interval=0.5, directory=None, devices=None, layout=True, step_peaks=False, history=None, history_stacks=True):
    """Starts publishing this process's CUDA allocator state every
    ``interval`` seconds, as ``gpumem-top run`` does: the same files, in the
    same private directory (``$GPUMEM_TOP_DIR``, else
    ``$XDG_RUNTIME_DIR/gpumem-top``, else ``/tmp/gpumem-top-<uid>``, mode
    0700). ``step_peaks``: each optimizer step's true peaks; ``history``:
    record PyTorch's memory history, this many entries (with Python call
    stacks unless ``history_stacks=False``, which costs far less).
    Idempotent; returns whether it publishes."""
    return _publish.start(
        interval=interval,
        directory=directory,
        devices=devices,
        layout=layout,
        step_peaks=step_peaks,
        history=history,
        history_stacks=history_stacks,
    ) is not None


def step():
    """Marks the end of a step where no ``torch.optim`` optimizer marks it
    (inference, a hand-written update); after an optimizer's step, which
    marks it already, it does nothing. Returns whether it marked one."""
    return _publish.mark_step()


def snapshot(path):
    """Writes what gpumem-top's ``S`` asks a process for (the memory
    history when recording, else the allocator's state) to ``path``, which
    must not exist yet; returns the path, or None if it could not."""
    return _publish.write_snapshot(path)


def snapshot_on_oom(path="gpumem-top-oom-{pid}-{n}.pickle"):
    """At each CUDA out-of-memory error, before PyTorch raises it, writes a
    snapshot to ``path`` (``{pid}``, ``{n}`` filled in). Returns whether it
    is set."""
    return _publish.snapshot_on_oom(path)


def stop():
    """Stops publishing and writes the final files (also done at exit)."""
    try:
        _publish.stop_publishing()
    except Exception:
        pass


def binary():
    """The path of the ``gpumem-top`` command installed with this package."""
    from ._binary import find

    return find()
