"""Publish this process's PyTorch CUDA allocator state for gpumem-top.

In a training script:

    import gpumem_top_publish
    gpumem_top_publish.start()          # every 0.5 s, the devices it uses

or, with no code change, ``gpumem-top run -- python3 train.py`` (which puts
this module and a ``sitecustomize`` on PYTHONPATH and calls ``start`` once
the program initialises CUDA).

A daemon thread writes ``torch.cuda.memory_stats()`` and, when it changed and
the time budget allows, a compact segment/block layout to
``<dir>/<pid>-<instance>-<device>.json``, written to a temporary name and
renamed so a reader never sees half a file. ``<instance>`` is random, drawn
when publishing starts: the trainers of several containers are each pid 1
of their own namespace, and their files must not collide in a shared
directory; the file also carries the process's start time (in clock ticks
since boot, the same from every namespace), so a reader tells it from
another process of the same pid. ``<dir>`` is ``$GPUMEM_TOP_DIR``, else
``$XDG_RUNTIME_DIR/gpumem-top``, else ``/tmp/gpumem-top-<uid>``; it is created
with mode 0700 and must belong to this user.

What it costs the training (docs/user/live.md in gpumem-top's repository):

* per sample, one ``memory_stats()`` call per device and one small file;
* the layout comes from ``torch.cuda.memory_snapshot()``, which also copies
  the whole memory history when history recording is on, so it is taken
  only when the allocator's counters moved since the last one, and never
  more often than keeps its measured cost under 0.5% of wall time;
* at each optimizer step, a few integers (and with ``step_peaks`` one
  ``memory_stats()`` and one peak reset).

``step_peaks=True`` (``gpumem-top run --step-peaks``) gives each step's true
peak allocated and reserved bytes. PyTorch keeps only all-time peaks, so this
resets its peak counters at every step; ``torch.cuda.memory_stats()``,
``max_memory_allocated()`` and ``reset_peak_memory_stats()`` are wrapped so
that Python code still sees the peaks it would have seen. It is opt-in
because C++ code reading the counters directly sees per-step peaks.

A snapshot on demand: gpumem-top creates
``<dir>/<pid>-<instance>.snapshot-request``; within one interval this
process writes ``torch.cuda.memory._snapshot()`` (the whole history when
recording, else the state) to ``<dir>/<pid>-<instance>.snapshot.pickle``.
"""

import atexit
import json
import os
import pickle
import stat
import sys
import tempfile
import threading
import time

_lock = threading.Lock()
# One writer of the files at a time: the thread, or the final publish.
_publish_lock = threading.Lock()
# Guards PyTorch's peak counters between our read-and-reset and a reader;
# re-entrant, as a watched reset runs the shadow's reset inside it.
_peak_lock = threading.RLock()
# One writer of the files at a time: the thread, or the final publish.
_publish_lock = threading.Lock()
_state = {
    "thread": None,
    "stop": None,
    "steps": [],
    "step_log": [],
    "step_n": 0,
    "hook": None,
    "files": [],
    "owner": None,
    "step_peaks": False,
    "shadow": {},
    "orig": None,
    "last_step_time": None,
    "history": None,
    # Per device, [allocated, reserved]: the highest peaks since publishing
    # started, kept across every reset of PyTorch's peak counters, ours
    # (step peaks) or the script's (per-step logging).
    "true_peaks": {},
}
_STATE_CODES = {"active_allocated": 0, "active_pending_free": 1, "inactive": 2}
# Steps kept in each file: at 10 ms a step, 5 s of them, so a reader
# sampling every 0.5 s sees every step.
_STEP_LOG = 512
# A layout may cost at most 1/_LAYOUT_BUDGET of wall time.
_LAYOUT_BUDGET = 200


# PyTorch releases from which memory history that gathers call stacks at
# frees (context="all", what stacks="python" implies) breaks non-reentrant
# activation checkpointing: backward raises "SystemError: ... returned NULL
# without setting an exception" (pytorch #179536, a regression from 2.10,
# open). On the H200 with 2.11, context="alloc" (stacks gathered at
# allocations only) finished the same Hugging Face training
# (docs/user/live.md, "Memory history and PyTorch 2.11").
_FREE_STACKS_BREAK_FROM = (2, 11)
_CONTEXTS = ("all", "alloc", "state", "none")


def torch_version(text):
    """(major, minor) of a torch version string ("2.11.0+cu130",
    "2.12.0a0+git…"), None when it does not start so."""
    try:
        major, minor = str(text).split(".")[:2]
        return int(major), int("".join(c for c in minor if c.isdigit()) or "x")
    except Exception:
        return None


def history_settings(torch, environ=None):
    """The keyword arguments for ``torch.cuda.memory._record_memory_history``
    that cannot break this program, and a sentence for the user saying what
    that gives up (None when nothing).

    Activation checkpointing can be turned on at any point after history
    starts (``model.gradient_checkpointing_enable()`` after the model is
    built), so on an affected release the safe setting is taken whatever
    the program does: stacks at allocations only. Every block and
    allocation keeps its call stack; the free events' own stacks are lost
    (gpumem-top reads none). $GPUMEM_TOP_HISTORY_CONTEXT (all, alloc,
    state, none) overrides the choice."""
    env = os.environ if environ is None else environ
    want = (env.get("GPUMEM_TOP_HISTORY_CONTEXT") or "").strip().lower()
    version = getattr(torch, "__version__", "")
    if want in _CONTEXTS:
        context = None if want == "none" else want
        kw = {"context": context} if context is None else {"context": context, "stacks": "python"}
        note = None
        if want == "all" and _affected(version):
            note = ("memory history records stacks at frees as GPUMEM_TOP_HISTORY_CONTEXT=all asks: with PyTorch %s "
                    "non-reentrant activation checkpointing can crash in backward (pytorch #179536)" % version)
        elif want in ("state", "none"):
            note = "memory history without per-event call stacks (GPUMEM_TOP_HISTORY_CONTEXT=%s)" % want
        return kw, note
    if _affected(version):
        return {"context": "alloc", "stacks": "python"}, (
            "PyTorch %s crashes non-reentrant activation checkpointing when memory history gathers call stacks "
            "at frees (pytorch #179536), so history records stacks at allocations only (context='alloc'): every "
            "block and allocation keeps its stack, frees do not" % version)
    return {"context": "all", "stacks": "python"}, None


def _affected(version):
    v = torch_version(version)
    # A version that does not parse is treated as affected: the safe
    # setting loses nothing gpumem-top reads.
    return v is None or v >= _FREE_STACKS_BREAK_FROM


def default_dir():
    d = os.environ.get("GPUMEM_TOP_DIR")
    if d:
        return d
    x = os.environ.get("XDG_RUNTIME_DIR")
    if x:
        return os.path.join(x, "gpumem-top")
    return "/tmp/gpumem-top-%d" % os.getuid()


def _private_dir(path):
    """``path`` as our own 0700 directory: created if missing; an existing
    one must be a real directory (not a symbolic link), ours and private.
    Nothing we did not create is ever chmod-ed. Raises OSError otherwise."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        os.makedirs(parent, mode=0o700, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)  # ours, just made: undo the umask
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise PermissionError("%s is not a directory" % path)
    if st.st_uid != os.getuid():
        raise PermissionError("%s belongs to uid %d, not us" % (path, st.st_uid))
    if st.st_mode & 0o077:
        raise PermissionError("%s has mode %o; it must be 0700" % (path, st.st_mode & 0o777))
    return path


def _fallback_dir():
    """A fresh private directory where gpumem-top also looks
    (``$TMPDIR/gpumem-top-<uid>-*``)."""
    return tempfile.mkdtemp(prefix="gpumem-top-%d-" % os.getuid())


def _warn(msg):
    try:
        sys.stderr.write("gpumem_top_publish: %s\n" % msg)
    except Exception:
        pass


def _usable_dir(directory):
    """The directory to publish into: ``directory`` if it is ours and
    private, else (with one warning) a fresh private one, else None."""
    try:
        return _private_dir(directory)
    except Exception as e:
        try:
            d = _fallback_dir()
        except Exception as e2:
            _warn("not publishing: %s; no fallback directory: %s" % (e, e2))
            return None
        _warn("%s; publishing to %s instead" % (e, d))
        return d


def _start_ticks():
    """This process's start time in clock ticks since boot (field 22 of
    /proc/self/stat): the same number from every pid namespace."""
    try:
        with open("/proc/self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except Exception:
        return None


def _pid_ns():
    """The inode of this process's pid namespace (``/proc/self/ns/pid``):
    the same number from the host, and different in every container, where
    two trainers may also share a start time to the clock tick."""
    try:
        link = os.readlink("/proc/self/ns/pid")
        return int(link[link.index("[") + 1 : -1])
    except Exception:
        return None


def _key():
    """Who this process is in file names: its pid and its instance."""
    return "%d-%s" % (os.getpid(), _state.get("instance") or "0")


def _nspid():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return [int(x) for x in line.split()[1:]]
    except OSError:
        pass
    return [os.getpid()]


def _command():
    """The program's name as people call it: the script's file name
    (``ddp.py`` for ``python3 -u ddp.py --lr 1``, where the command line's
    first two words name the interpreter and an option), the module's for
    ``python -m``; else the command line's first two words."""
    try:
        argv0 = getattr(sys, "argv", None) or [""]
        name = os.path.basename(str(argv0[0]))
        if name and name not in ("-c", "-"):
            return name
    except Exception:
        pass
    try:
        with open("/proc/self/cmdline", "rb") as f:
            parts = [p for p in f.read().split(b"\0") if p][:2]
        return " ".join(os.path.basename(p.decode(errors="replace")) for p in parts)
    except OSError:
        return None


def _int_env(env, key):
    try:
        v = int(env.get(key, ""))
        return v if v >= 0 else None
    except (TypeError, ValueError):
        return None


def job_info(environ=None, ppid=None):
    """The process's place in a distributed job, from the variables
    torchrun (and most launchers) set: ``{"rank", "local_rank",
    "world_size", "job"}``, or None outside a job (no ``WORLD_SIZE``/
    ``RANK``). ``job`` is torchrun's ``TORCHELASTIC_RUN_ID``, else a
    Slurm job and step, else the launching parent's pid: the ranks one
    launcher started share it (docs/user/ranks.md)."""
    env = os.environ if environ is None else environ
    rank, world = _int_env(env, "RANK"), _int_env(env, "WORLD_SIZE")
    if rank is None or world is None or world < 1:
        return None
    run_id = (env.get("TORCHELASTIC_RUN_ID") or "").strip()
    if run_id and run_id.lower() != "none":
        job = run_id
    elif env.get("SLURM_JOB_ID"):
        job = "slurm %s.%s" % (env.get("SLURM_JOB_ID"), env.get("SLURM_STEP_ID", "0"))
    else:
        job = "ppid %d" % (os.getppid() if ppid is None else ppid)
    local = _int_env(env, "LOCAL_RANK")
    return {"rank": rank, "local_rank": rank if local is None else local, "world_size": world, "job": job[:128]}


def _segments(torch, safe):
    """``torch.cuda.memory_snapshot()`` without the history (PyTorch 2.11's
    ``include_traces=False``: 0.2 ms on the H200 where the full call with
    6,000 history entries took 5 s); an older torch has only the full call.
    Either may touch ``torch._inductor`` (symbolising the blocks' stacks), so
    it is taken only where ``safe`` (`_snapshots_safe_here`); None when not."""
    if not safe:
        return None
    if _state.get("lightweight", True):
        try:
            return torch.cuda.memory_snapshot(include_traces=False)
        except TypeError:
            _state["lightweight"] = False
    return torch.cuda.memory_snapshot()


def _layout(torch, device, safe=True):
    snap = _segments(torch, safe)
    if snap is None:
        return None
    segs = []
    for s in snap:
        if s.get("device", 0) != device:
            continue
        blocks = [
            [b["size"], b.get("requested_size", b["size"]), _STATE_CODES.get(b["state"], 2)]
            for b in s["blocks"]
        ]
        segs.append(
            {
                "address": s["address"],
                "total_size": s["total_size"],
                "stream": s.get("stream", 0),
                "segment_type": s.get("segment_type", "large"),
                "is_expandable": bool(s.get("is_expandable", False)),
                "segment_pool_id": [int(x) for x in s.get("segment_pool_id", (0, 0))],
                "blocks": blocks,
            }
        )
    return segs


def _uuid(torch, device):
    """The GPU's UUID as NVML spells it, so gpumem-top finds the GPU even
    when CUDA_VISIBLE_DEVICES renumbers devices; None if torch cannot say."""
    cache = _state.setdefault("uuids", {})
    if device not in cache:
        try:
            u = str(torch.cuda.get_device_properties(device).uuid)
            cache[device] = u if u.startswith(("GPU-", "MIG-")) else "GPU-" + u
        except Exception:
            cache[device] = None
    return cache[device]


# --- peaks -----------------------------------------------------------------


def _walk_peaks(d, prefix, out):
    """Every ``…peak`` value of a (nested or flat) stats dict, by path."""
    for k, v in d.items():
        path = prefix + (k,)
        if isinstance(v, dict):
            _walk_peaks(v, path, out)
        elif isinstance(v, int) and (k == "peak" or str(k).endswith(".peak")):
            out[path] = v


def _apply_shadow(d, prefix, shadow):
    """``d`` with each peak raised to what the user would have seen had we
    never reset it."""
    out = {}
    for k, v in d.items():
        path = prefix + (k,)
        if isinstance(v, dict):
            out[k] = _apply_shadow(v, path, shadow)
        elif path in shadow and isinstance(v, int):
            out[k] = max(v, shadow[path])
        else:
            out[k] = v
    return out


def _device_key(torch, args, kwargs):
    dev = args[0] if args else kwargs.get("device", kwargs.get("device_index"))
    if dev is None:
        return torch.cuda.current_device()
    return int(getattr(dev, "index", dev) if not isinstance(dev, int) else dev)


def _peak_pair(raw):
    """(allocated, reserved) peaks of a stats dict, nested or flat."""

    def at(*path):
        v = raw
        for k in path:
            v = v.get(k, {}) if isinstance(v, dict) else {}
        return v if isinstance(v, int) else None

    a = at("allocated_bytes", "all", "peak")
    if a is None:
        a = at("allocated_bytes.all.peak")
    r = at("reserved_bytes", "all", "peak")
    if r is None:
        r = at("reserved_bytes.all.peak")
    return a, r


def _fold_true(device, a, r):
    t = _state["true_peaks"].setdefault(device, [None, None])
    t[0], t[1] = _max(t[0], a), _max(t[1], r)


def _stat_functions(C):
    """PyTorch's (stats getter name, getter, peak reset name, reset) pairs
    that ``C`` (``torch._C``) has: CUDA's, and the accelerator API's."""
    out = []
    for get_name, reset_name in (
        ("_cuda_memoryStats", "_cuda_resetPeakMemoryStats"),
        ("_accelerator_getDeviceStats", "_accelerator_resetPeakStats"),
    ):
        get, reset = getattr(C, get_name, None), getattr(C, reset_name, None)
        if get is not None and reset is not None:
            out.append((get_name, get, reset_name, reset))
    return out


def _install_reset_watch(torch):
    """Wraps PyTorch's peak resets so that the peaks a reset is about to
    clear (a script's per-step ``reset_peak_memory_stats()``) are kept as
    the process's true peaks, which every peak gpumem-top shows and judges
    is (docs/user/live.md). The script reads what it would have read. A torch
    without these functions has nothing to watch."""
    C = getattr(torch, "_C", None)
    for _, get, reset_name, reset in _stat_functions(C):

        def make(reset, raw_get):
            def watched(*args, **kwargs):
                with _peak_lock:
                    try:
                        dev = _device_key(torch, args, kwargs)
                        a, r = _peak_pair(raw_get(dev))
                        _fold_true(dev, a, r)
                    except Exception:
                        pass
                    return reset(*args, **kwargs)

            watched.__wrapped__ = reset
            return watched

        setattr(C, reset_name, make(reset, getattr(get, "__wrapped__", get)))


def _install_peak_shadow(torch):
    """Wraps PyTorch's stats getters and peak resets so that Python readers
    see the peaks they would have seen without our resets (docs/user/live.md)."""
    C = torch._C
    pairs = _stat_functions(C)
    if not pairs:
        raise RuntimeError("this torch has no _cuda_memoryStats/_cuda_resetPeakMemoryStats")
    shadow = _state["shadow"]

    def key(args, kwargs):
        return _device_key(torch, args, kwargs)

    def wrap_get(orig):
        def stats(*args, **kwargs):
            with _peak_lock:
                r = orig(*args, **kwargs)
                try:
                    s = shadow.get(key(args, kwargs))
                    return _apply_shadow(r, (), s) if s and isinstance(r, dict) else r
                except Exception:
                    return r

        stats.__wrapped__ = orig
        return stats

    def wrap_reset(orig):
        def reset(*args, **kwargs):
            with _peak_lock:
                try:
                    shadow.pop(key(args, kwargs), None)
                except Exception:
                    shadow.clear()
                return orig(*args, **kwargs)

        reset.__wrapped__ = orig
        return reset

    _state["orig"] = (pairs[0][1], pairs[0][3])
    for get_name, get, reset_name, reset in pairs:
        setattr(C, get_name, wrap_get(get))
        setattr(C, reset_name, wrap_reset(reset))


def _take_peaks(device, step=False):
    """This window's peaks on ``device`` (allocated, reserved), folded into
    the shadow, and PyTorch's counters reset for the next window.

    Windows the sampling thread closed before a step (before the first
    optimizer step, say) are folded into that step's peaks, so a step's
    peaks are always since the previous step, whoever reset in between."""
    get, reset = _state["orig"]

    with _peak_lock:
        raw = get(device)
        peaks = {}
        _walk_peaks(raw, (), peaks)
        s = _state["shadow"].setdefault(device, {})
        for p, v in peaks.items():
            if v > s.get(p, -1):
                s[p] = v
        reset(device)
        a, r = _peak_pair(raw)
        _fold_true(device, a, r)
        acc = _state.setdefault("since_step", {})
        if step:
            pa, pr = acc.pop(device, (None, None))
            return _max(pa, a), _max(pr, r)
        pa, pr = acc.get(device, (None, None))
        acc[device] = (_max(pa, a), _max(pr, r))
        return a, r


def _max(x, y):
    return y if x is None else x if y is None else max(x, y)


# --- steps -----------------------------------------------------------------


def _optimizer_bytes(torch, optimizer, dev):
    """Bytes on device ``dev`` of the optimizer's parameters, their
    gradients and its state (each storage counted once, rounded up to the
    allocator's 512 bytes), as [parameters, gradients, optimizer state]
    (docs/user/categories.md, "Live")."""
    seen = set()
    out = [0, 0, 0]

    def add(k, t):
        if t is None or not isinstance(t, torch.Tensor) or not t.is_cuda or t.device.index != dev:
            return
        s = t.untyped_storage()
        ptr = s.data_ptr()
        if ptr == 0 or ptr in seen:
            return
        seen.add(ptr)
        out[k] += (s.nbytes() + 511) // 512 * 512

    for g in optimizer.param_groups:
        for p in g["params"]:
            add(0, p)
            add(1, p.grad)
    for st in optimizer.state.values():
        for v in st.values():
            add(2, v)
    return out


def _note_categories(torch, optimizer, dev, n, alloc):
    """At most once per publishing interval: what the optimizer holds, at
    this step's end (gradients not yet zeroed), beside allocated then."""
    now = time.time()
    last = _state.get("categories_time", 0.0)
    if now - last < _state.get("interval", 0.5):
        return
    _state["categories_time"] = now
    per = _state.setdefault("optimizers", {})
    per[id(optimizer)] = _optimizer_bytes(torch, optimizer, dev)
    # Several optimizers (a GAN's two): their sums, each as last seen.
    tot = [sum(v[k] for v in per.values()) for k in range(3)]
    _state["categories"] = {
        "step": n,
        "time": now,
        "device": dev,
        "allocated": alloc,
        "parameter": tot[0],
        "gradient": tot[1],
        "optimizer_state": tot[2],
    }


def _on_step(optimizer, args, kwargs, _manual=False):
    if os.getpid() != _state["owner"]:
        return  # a forked child: CUDA is not usable here
    if not _manual:
        _state["hooked"] = _state.get("hooked", 0) + 1
    try:
        import torch

        dev = torch.cuda.current_device()
        n = _state["step_n"] + 1
        _state["step_n"] = n
        alloc = int(torch.cuda.memory_allocated(dev))
        try:
            res = int(torch.cuda.memory_reserved(dev))
        except Exception:
            res = None
        pa = pr = None
        if _state["step_peaks"]:
            pa, pr = _take_peaks(dev, step=True)
        steps = _state["steps"]
        steps.append(alloc)
        del steps[:-64]
        log = _state["step_log"]
        log.append([n, time.time(), dev, alloc, res, pa, pr])
        del log[:-_STEP_LOG]
        _state["last_step_time"] = time.time()
        try:
            _note_categories(torch, optimizer, dev, n, alloc)
        except Exception:
            pass
        if _state.get("in_step") is not None and not _snapshots_safe_here():
            _state["in_step"]()
    except Exception:
        pass  # Publishing must never break training.


# --- files -----------------------------------------------------------------


def _write_atomic(directory, name, data):
    tmp = ".%s.%d.tmp" % (name, threading.get_ident())
    # Through a descriptor of the directory, never following a link: a
    # directory swapped for a symbolic link after the check gets nothing.
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        os.close(dfd)
    return os.path.join(directory, name)


def _fingerprint(stats):
    """Counters that move whenever the layout can have changed."""
    return tuple(
        stats.get(k, 0)
        for k in (
            "allocation.all.allocated",
            "allocation.all.freed",
            "segment.all.allocated",
            "segment.all.freed",
            "reserved_bytes.all.current",
        )
    )


class _Layouts:
    """When to take a layout, and the last one taken, per device."""

    def __init__(self):
        self.last = {}  # device -> (fingerprint, json text, time)
        self.next_at = 0.0
        self.lock = threading.Lock()

    def due(self, device, stats, now):
        prev = self.last.get(device)
        return prev is None or (prev[0] != _fingerprint(stats) and now >= self.next_at)

    def take(self, torch, device, stats, now, safe=True):
        """Takes a layout now (the caller has checked it is due)."""
        t0 = time.perf_counter()
        segs = _layout(torch, device, safe)
        if segs is None:
            return
        text = json.dumps(segs, separators=(",", ":"))
        cost = time.perf_counter() - t0
        self.next_at = now + cost * _LAYOUT_BUDGET
        self.last[device] = (_fingerprint(stats), text, now)

    def get(self, torch, device, stats, now, enabled, may_take=True, safe=True):
        """The layout to publish: a new one when due and ``may_take``, else
        the last one."""
        if not enabled:
            return "[]", None
        with self.lock:
            if may_take and self.due(device, stats, now):
                self.take(torch, device, stats, now, safe)
            prev = self.last.get(device)
            return (prev[1], prev[2]) if prev else ("[]", None)


def publish_once(
    torch, directory, device, interval, layout=True, layouts=None, window=None, final=False, safe=True
):
    """Writes one file now; returns its path. ``final``: the last one, at
    exit, left for gpumem-top to read once and remove (so the last steps
    and an OOM that ends the run are seen), with the layout taken before.
    ``safe``: the full snapshot may be taken from this thread (see
    `_snapshots_safe_here`)."""
    stats = {k: int(v) for k, v in torch.cuda.memory_stats(device).items()}
    now = time.time()
    layouts = layouts if layouts is not None else _Layouts()
    seg_text, layout_time = layouts.get(torch, device, stats, now, layout, not final, safe)
    doc = {
        "version": 1,
        "pid": os.getpid(),
        "nspid": _nspid(),
        "instance": _state.get("instance"),
        "start_ticks": _state.get("start_ticks"),
        "pid_ns": _state.get("pid_ns"),
        "device": device,
        "uuid": _uuid(torch, device),
        "time": now,
        "interval": interval,
        "command": _state.get("command") or _command(),
        "stats": stats,
        "steps": list(_state["steps"]),
        "step_peaks": bool(_state["step_peaks"]),
        "step_log": [s for s in list(_state["step_log"]) if s[2] == device],
        "layout_time": layout_time,
        "final": final,
    }
    if _state["history"] is not None:
        doc["history"] = _state["history"]
    job = _state.get("job")
    if job is not None:
        doc.update(job)
    cats = _state.get("categories")
    if cats is not None and cats.get("device") == device:
        doc["categories"] = cats
    a, r = _peak_pair(stats)
    tp = _state["true_peaks"].get(device, (None, None))
    doc["true_peaks"] = [_max(tp[0], a), _max(tp[1], r)]
    if window is not None:
        doc["window_peak"] = window
    text = json.dumps(doc, separators=(",", ":"))
    # The layout is spliced in as the text it was serialised to once.
    data = (text[:-1] + ',"segments":' + seg_text + "}").encode()
    return _write_atomic(directory, "%s-%d.json" % (_key(), device), data)


def _snapshots_safe_here():
    """May this (the sampling) thread call torch.cuda.memory_snapshot()?

    PyTorch 2.11's _cuda_memorySnapshot touches ``torch._inductor`` (also
    with include_traces=False, once blocks carry recorded stacks), which
    torch imports lazily; imported from our thread while the training
    thread imports torch._dynamo (an optimizer's constructor does), the two
    imports deadlock and Python hands the training thread a half-initialised
    module: an ImportError that killed a training script on the H200
    (docs/user/live.md). So our thread takes layouts and snapshots only once
    ``torch._inductor`` is fully imported; until then the training thread
    takes them at its optimizer steps, and between steps (a program without
    any, a paused run) our thread does once neither a step nor an import
    has happened for four samples."""
    m = sys.modules.get("torch._inductor")
    if m is not None and not getattr(getattr(m, "__spec__", None), "_initializing", False):
        return True
    last = _state["last_step_time"]
    stepping = last is not None and time.time() - last < 4 * _state.get("interval", 0.5)
    return not stepping and _state.get("quiet_samples", 0) >= 4


def _snapshot_requested(directory):
    return os.path.exists(os.path.join(directory, "%s.snapshot-request" % _key()))


def _serve_snapshot_request(torch, directory):
    """Answers ``<pid>-<instance>.snapshot-request`` with
    ``<pid>-<instance>.snapshot.pickle`` (or ``.snapshot.error``)."""
    key = _key()
    req = os.path.join(directory, "%s.snapshot-request" % key)
    if not os.path.exists(req):
        return
    try:
        os.unlink(req)
    except OSError:
        return
    try:
        data = pickle.dumps(snapshot_with_version(torch), protocol=4)
        _write_atomic(directory, "%s.snapshot.pickle" % key, data)
    except Exception as e:
        try:
            _write_atomic(directory, "%s.snapshot.error" % key, repr(e).encode())
        except Exception:
            pass


def mark_step():
    """Ends a step where no torch optimizer step does (an inference loop, an
    optimizer of one's own): what the optimizer's post-hook records. Where
    an optimizer stepped since the last call, it marked the step already and
    this does nothing. Returns whether it marked one; never raises."""
    try:
        if _state["owner"] != os.getpid():
            return False
        hooked = _state.get("hooked", 0)
        if hooked != _state.get("hooked_seen", 0):
            _state["hooked_seen"] = hooked
            return False
        _on_step(None, (), {}, _manual=True)
        return True
    except Exception:
        return False


def write_snapshot(path):
    """Writes what gpumem-top's ``S`` asks for (``snapshot_with_version``:
    the whole history when recording, else the state) to ``path``, through a
    fresh private temporary file linked to its name, so an existing file
    (or a link someone planted there) is refused, never overwritten.
    Returns the path, or None (with one warning) if it could not; never
    raises."""
    try:
        import torch

        path = os.path.abspath(str(path))
        data = pickle.dumps(snapshot_with_version(torch), protocol=4)
        fd, tmp = tempfile.mkstemp(prefix=".gpumem-top-", dir=os.path.dirname(path) or ".")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.link(tmp, path)
        finally:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return path
    except Exception as e:
        _warn("no snapshot written to %s: %s" % (path, e))
        return None


def snapshot_on_oom(path):
    """At each CUDA out-of-memory error, before PyTorch raises it, writes a
    snapshot to ``path`` (``{pid}`` and ``{n}``, the OOM's number from 1,
    are filled in): with memory history recording, one that replays the run
    up to the failed request. Returns whether the observer is attached;
    never raises."""
    try:
        import torch

        attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is None:
            _warn("this torch has no out-of-memory observer: no snapshot at an OOM")
            return False
        _state["oom_path"] = str(path)
        if _state.get("oom_observer"):
            return True

        def observer(device, alloc, device_alloc, device_free):
            n = _state.get("ooms", 0) + 1
            _state["ooms"] = n
            try:
                write_snapshot(_state["oom_path"].format(pid=os.getpid(), n=n))
            except Exception:
                pass

        attach(observer)
        _state["oom_observer"] = True
        return True
    except Exception as e:
        _warn("no snapshot at an OOM: %s" % e)
        return False


def snapshot_with_version(torch):
    """``torch.cuda.memory._snapshot()`` with ``torch_version`` added: the
    allocator's rules changed in 2.12 and 2.13, and a replay follows the
    release that wrote the file (docs/user/replay.md, "Which release")."""
    snap = torch.cuda.memory._snapshot()
    if isinstance(snap, dict):
        snap["torch_version"] = str(getattr(torch, "__version__", ""))
    return snap


def _devices(torch, fixed):
    """The devices to publish: those given, else the one current at start
    plus every device where this process holds memory."""
    if fixed is not None:
        return fixed
    devs = list(_state.get("home", []))
    try:
        n = torch.cuda.device_count()
        for d in range(n):
            if d not in devs and torch.cuda.memory_reserved(d) > 0:
                devs.append(d)
    except Exception:
        pass
    return devs


def start(interval=0.5, directory=None, devices=None, layout=True, step_peaks=False, history=None, history_stacks=True):
    """Starts publishing every ``interval`` seconds (idempotent).

    ``devices``: CUDA device indices (default: the current device and any
    other this process allocates on).
    ``layout``: include the segment/block layout (the fragmentation map).
    ``step_peaks``: each optimizer step's true peaks (resets PyTorch's peak
    counters at each step; Python readers see them as if it did not).
    ``history``: also record PyTorch's memory history, this many entries;
    ``history_stacks=False``: without call stacks (``context=None``), which
    costs the training next to nothing and still replays exactly.
    """
    try:
        return _start(interval, directory, devices, layout, step_peaks, history, history_stacks)
    except Exception as e:
        # Publishing must never break training.
        _warn("not publishing: %s" % e)
        return None


def _after_fork_in_child():
    # The thread does not exist here and CUDA is unusable in a forked
    # child; the files are the parent's, never removed from here.
    _state.update(thread=None, stop=None, files=[])


def _start(interval, directory, devices, layout, step_peaks, history, history_stacks=True):
    import torch

    with _lock:
        if _state["thread"] is not None and _state["owner"] == os.getpid():
            return _state["thread"]
        directory = _usable_dir(directory or default_dir())
        if directory is None:
            return None
        _state["owner"] = os.getpid()
        # Drawn anew in a forked child that publishes: its files are its own.
        _state["instance"] = "%016x" % int.from_bytes(os.urandom(8), "big")
        _state["start_ticks"] = _start_ticks()
        _state["pid_ns"] = _pid_ns()
        _state["interval"] = interval
        _state["home"] = [torch.cuda.current_device()]
        # Read once: the names and the job do not change while it runs.
        try:
            _state["command"] = _command()
            _state["job"] = job_info()
        except Exception:
            _state["job"] = None
        fixed = list(devices) if devices is not None else None
        if history:
            kw, note = history_settings(torch) if history_stacks else ({"context": None}, None)
            torch.cuda.memory._record_memory_history(max_entries=int(history), **kw)
            _state["history"] = {"context": kw["context"] or "none", "max_entries": int(history), "note": note}
            if note:
                _warn(note)
        if step_peaks:
            try:
                _install_peak_shadow(torch)
                _state["step_peaks"] = True
            except Exception as e:
                _warn("no step peaks: %s" % e)
        try:
            _install_reset_watch(torch)
        except Exception as e:
            _warn("peaks after the script's own resets may be low: %s" % e)
        stop = threading.Event()
        try:
            # torch.optim deletes its submodules' names: import the function.
            from torch.optim.optimizer import register_optimizer_step_post_hook

            _state["hook"] = register_optimizer_step_post_hook(_on_step)
        except (AttributeError, ImportError):
            _state["hook"] = None
        layouts = _Layouts()

        def publish_all(window, final=False):
            safe = _snapshots_safe_here()
            for d in _devices(torch, fixed):
                try:
                    p = publish_once(torch, directory, d, interval, layout, layouts, window.get(d), final, safe)
                    if p not in _state["files"]:
                        _state["files"].append(p)
                except Exception:
                    # Publishing must never break training.
                    pass

        def in_step():
            # In the training thread, at an optimizer step, while our thread
            # may not (`_snapshots_safe_here`): a requested snapshot, a due
            # layout. The lock is only tried: a step never waits for us.
            if _snapshot_requested(directory):
                _serve_snapshot_request(torch, directory)
            if not layouts.lock.acquire(blocking=False):
                return
            try:
                now = time.time()
                for d in _devices(torch, fixed):
                    stats = {k: int(v) for k, v in torch.cuda.memory_stats(d).items()}
                    if layout and layouts.due(d, stats, now):
                        layouts.take(torch, d, stats, now)
            finally:
                layouts.lock.release()

        _state["in_step"] = in_step

        def final():
            # Under the publish lock, so no sample of the thread's lands
            # after it.
            with _publish_lock:
                stop.set()
                publish_all({}, final=True)

        _state["final"] = final

        def loop():
            while not stop.is_set():
                window = {}
                if _state["step_peaks"]:
                    # Without optimizer steps, each interval is a window.
                    # Once steps are seen, only they end windows: an
                    # interval reset inside a step would cut its peak.
                    if _state["last_step_time"] is None:
                        for d in _devices(torch, fixed):
                            try:
                                a, r = _take_peaks(d)
                                window[d] = [time.time(), a, r]
                            except Exception:
                                pass
                with _publish_lock:
                    if stop.is_set():
                        return
                    publish_all(window)
                try:
                    if _snapshots_safe_here():
                        _serve_snapshot_request(torch, directory)
                except Exception:
                    pass
                # Counts samples during which no module was imported.
                n = len(sys.modules)
                quiet = _state.get("quiet_samples", 0) + 1 if n == _state.get("modules") else 0
                _state.update(modules=n, quiet_samples=quiet)
                stop.wait(interval)

        t = threading.Thread(target=loop, name="gpumem-top-publish", daemon=True)
        _state["thread"], _state["stop"] = t, stop
        t.start()
        if not _state.get("registered"):
            _state["registered"] = True
            atexit.register(stop_publishing)
            if hasattr(os, "register_at_fork"):
                os.register_at_fork(after_in_child=_after_fork_in_child)
        return t


def stop_publishing():
    """Stops the thread and writes a final file per device (marked so,
    which gpumem-top reads once and removes); where that fails, removes
    this process's files."""
    with _lock:
        if _state["owner"] != os.getpid():
            return
        if _state["hook"] is not None:
            try:
                _state["hook"].remove()
            except Exception:
                pass
        done = False
        if _state.get("final") is not None and _state["thread"] is not None:
            try:
                _state["final"]()
                done = True
            except Exception:
                pass
        if _state["stop"] is not None:
            _state["stop"].set()
        if not done:
            for p in _state["files"]:
                try:
                    os.unlink(p)
                except OSError:
                    pass
        _state.update(thread=None, stop=None, hook=None, files=[], final=None, in_step=None)
