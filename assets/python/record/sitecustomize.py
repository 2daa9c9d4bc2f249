"""Loaded by Python at start-up when gpumem-top puts this directory first on
PYTHONPATH (`gpumem-top fit --batches … -- CMD`): once the program imports
torch, PyTorch's memory history is recorded from then on; after
$GPUMEM_TOP_RECORD_STEPS optimizer steps (or at exit) the snapshot is written
to $GPUMEM_TOP_RECORD_OUT and, after the steps, the process ends. Nothing
happens in a process that never imports torch, and a failure here never
stops the program: it only means no snapshot. A sitecustomize this one
shadows (a virtual environment's, the user's own) still runs, after it, as
under `gpumem-top run`: the recorded runs are the user's real ones."""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import pickle
import sys

_OUT = os.environ.get("GPUMEM_TOP_RECORD_OUT")
_HERE = os.path.dirname(os.path.abspath(__file__))


def _warn(msg):
    try:
        sys.stderr.write("gpumem-top record: %s\n" % msg)
    except Exception:
        pass


def _dump(torch):
    try:
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
            # Several processes of one command (ranks, workers) may record:
            # the first to finish takes $GPUMEM_TOP_RECORD_OUT (a link
            # fails on a name that exists), each other keeps OUT.PID.
            tmp = "%s.%d.tmp" % (_OUT, os.getpid())
            # As _dump_snapshot writes it, with torch.__version__ added: a
            # replay follows the release that wrote the file.
            snap = torch.cuda.memory._snapshot()
            if isinstance(snap, dict):
                snap["torch_version"] = str(getattr(torch, "__version__", ""))
            # A fresh private file, never through a link someone left there.
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            with os.fdopen(fd, "wb") as f:
                pickle.dump(snap, f, protocol=4)
            try:
                os.link(tmp, _OUT)
                os.unlink(tmp)
            except FileExistsError:
                os.rename(tmp, "%s.%d" % (_OUT, os.getpid()))
            except OSError:
                # A file system without hard links.
                os.rename(tmp, _OUT)
    except Exception as e:
        _warn("no snapshot: %r" % (e,))


def _start(torch):
    try:
        if not torch.cuda.is_available():
            return
        try:
            # Shipped beside this file: the one place that knows which
            # history settings cannot crash this PyTorch (pytorch #179536).
            from gpumem_top_publish import history_settings

            kw, note = history_settings(torch)
        except Exception:
            kw, note = {"context": "alloc", "stacks": "python"}, None
        max_entries = int(os.environ.get("GPUMEM_TOP_RECORD_MAX_ENTRIES", "0") or 0)
        if max_entries > 0:
            kw["max_entries"] = max_entries
        torch.cuda.memory._record_memory_history(**kw)
        if note:
            _warn(note)
        steps = int(os.environ.get("GPUMEM_TOP_RECORD_STEPS", "0") or 0)
        state = {"n": 0, "done": False}

        def at_exit():
            if not state["done"]:
                state["done"] = True
                _dump(torch)

        import atexit

        atexit.register(at_exit)
        if steps > 0:

            def on_step(optimizer, args, kwargs):
                state["n"] += 1
                if state["n"] >= steps and not state["done"]:
                    state["done"] = True
                    _dump(torch)
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(0)

            # torch.optim deletes its submodules' names, so the attribute
            # path does not work; the module itself does.
            from torch.optim.optimizer import register_optimizer_step_post_hook

            register_optimizer_step_post_hook(on_step)
    except Exception as e:
        _warn("not recording: %r" % (e,))


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Runs `_start` once the torch package has finished importing."""

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

        def exec_then_start(module):
            exec_module(module)
            _start(module)

        spec.loader.exec_module = exec_then_start
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


if _OUT:
    sys.meta_path.insert(0, _AfterTorch())
_chain()
