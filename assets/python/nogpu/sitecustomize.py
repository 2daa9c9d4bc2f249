"""Loaded by Python at start-up when gpumem-top puts this directory first on
PYTHONPATH (`gpumem-top fit --no-gpu -- CMD`): once the program imports
torch, CUDA is faked and the requests the caching allocator would get are
recorded (gpumem_top_nogpu.py, beside this file); after
$GPUMEM_TOP_RECORD_STEPS optimizer steps (or at exit) they are written to
$GPUMEM_TOP_RECORD_OUT as a snapshot and the process ends. Why the program
stopped, when an operation fails under the fake device, goes to
$GPUMEM_TOP_RECORD_OUT.error (the operation and the program's line). A
sitecustomize this one shadows still runs, after it."""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_OUT = os.environ.get("GPUMEM_TOP_RECORD_OUT")
_HERE = os.path.dirname(os.path.abspath(__file__))


def _warn(msg):
    try:
        sys.stderr.write("gpumem-top fit --no-gpu: %s\n" % msg)
    except Exception:
        pass


def _user_line(tb):
    """The innermost frame of the program itself (not torch, not Python's
    library, not ours)."""
    import traceback

    best = None
    for fs in traceback.extract_tb(tb):
        f = fs.filename
        if "site-packages" in f or "dist-packages" in f or f.startswith(_HERE) or f.startswith(sys.prefix):
            continue
        if f.startswith("<"):
            continue
        best = fs
    return "%s:%d" % (best.filename, best.lineno) if best else None


def _start(torch):
    try:
        from gpumem_top_nogpu import install

        steps = int(os.environ.get("GPUMEM_TOP_RECORD_STEPS", "0") or 0)
        rec = install(torch, _OUT, steps)
    except Exception as e:
        # Without the fake the program would reach for a real GPU: it is
        # stopped, and says why.
        _warn("could not fake CUDA: %r" % (e,))
        try:
            fd = os.open(_OUT + ".error", os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            with os.fdopen(fd, "w") as f:
                f.write("could not fake CUDA with this PyTorch (%s): %r\n" % (getattr(torch, "__version__", "?"), e))
        except Exception:
            pass
        os._exit(3)
    import atexit

    hook = sys.excepthook

    def on_error(kind, value, tb):
        # One line for gpumem-top: the operation (where one failed) and
        # the program's line it came from.
        try:
            op = rec.state.get("error")
            where = _user_line(tb)
            what = "%s: %s" % (kind.__name__, str(value).splitlines()[0] if str(value) else "")
            if op is not None and op[1] is value:
                what = "%s failed under the fake device: %s" % (op[0], what)
            line = "%s%s" % (what, " at " + where if where else "")
            fd = os.open(_OUT + ".error", os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(line + "\n")
        except Exception:
            pass
        hook(kind, value, tb)

    sys.excepthook = on_error
    atexit.register(rec.finish)


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
