"""Loaded by Python at start-up when `gpumem-top run -- CMD` puts this
directory first on PYTHONPATH. Once the program imports torch, it asks torch
to call `gpumem_top_publish.start()` when CUDA is initialised (torch's own
queue of calls deferred to CUDA initialisation), so a process that never
touches CUDA (a launcher, a data worker) publishes nothing. Settings come
from the environment gpumem-top sets:

  GPUMEM_TOP_INTERVAL    seconds between samples
  GPUMEM_TOP_HISTORY     record PyTorch's memory history, this many entries
  GPUMEM_TOP_STEP_PEAKS  "1": each optimizer step's true peaks
  GPUMEM_TOP_DIR         where to publish

A failure here never stops the program. A sitecustomize this one shadows
(a virtual environment's, say) still runs, after it."""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _warn(msg):
    try:
        sys.stderr.write("gpumem-top run: %s\n" % msg)
    except Exception:
        pass


def _start_publishing():
    try:
        import gpumem_top_publish

        env = os.environ
        gpumem_top_publish.start(
            interval=float(env.get("GPUMEM_TOP_INTERVAL") or 0.5),
            step_peaks=env.get("GPUMEM_TOP_STEP_PEAKS") == "1",
            history=int(env.get("GPUMEM_TOP_HISTORY") or 0) or None,
        )
    except Exception as e:
        _warn("not publishing: %r" % (e,))


def _after_torch(torch):
    try:
        cuda = torch.cuda
        lazy = getattr(cuda, "_lazy_call", None)
        if lazy is None:
            _warn("this torch has no torch.cuda._lazy_call; call gpumem_top_publish.start() in the script")
            return
        # Runs now if CUDA is initialised, else inside torch's CUDA
        # initialisation; it must not raise there (torch would re-raise).
        lazy(_start_publishing)
    except Exception as e:
        _warn("not publishing: %r" % (e,))


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Runs `_after_torch` once the torch package has finished importing."""

    def find_spec(self, name, path, target=None):
        if name != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_hook(module):
            exec_module(module)
            _after_torch(module)

        spec.loader.exec_module = exec_then_hook
        return spec


def _chain():
    """Runs the sitecustomize this one hides, if there is one."""
    try:
        rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None:
            return
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    except Exception as e:
        _warn("the other sitecustomize failed: %r" % (e,))


if os.environ.get("GPUMEM_TOP_RUN") == "1":
    sys.meta_path.insert(0, _AfterTorch())
_chain()
