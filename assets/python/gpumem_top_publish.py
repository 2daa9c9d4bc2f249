"""Publish this process's PyTorch CUDA allocator state for gpumem-top.

In a training script:

    import gpumem_top_publish
    gpumem_top_publish.start()          # every 0.5 s, the current device

A daemon thread writes ``torch.cuda.memory_stats()`` and a compact
segment/block layout (from ``torch.cuda.memory_snapshot()``) to
``<dir>/<pid>-<device>.json``, written to a temporary name and renamed so a
reader never sees half a file. ``<dir>`` is ``$GPUMEM_TOP_DIR``, else
``$XDG_RUNTIME_DIR/gpumem-top``, else ``/tmp/gpumem-top-<uid>``; it is created
with mode 0700 and must belong to this user. The allocated bytes at the end of
each optimizer step are kept too (gpumem-top's leak alert reads them).
"""

import atexit
import json
import os
import stat
import sys
import tempfile
import threading
import time

_lock = threading.Lock()
_state = {"thread": None, "stop": None, "steps": [], "hook": None, "files": []}
_STATE_CODES = {"active_allocated": 0, "active_pending_free": 1, "inactive": 2}


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
    try:
        with open("/proc/self/cmdline", "rb") as f:
            parts = [p for p in f.read().split(b"\0") if p][:2]
        return " ".join(os.path.basename(p.decode(errors="replace")) for p in parts)
    except OSError:
        return None


def _layout(torch, device):
    segs = []
    for s in torch.cuda.memory_snapshot():
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


def publish_once(torch, directory, device, interval, layout=True):
    """Writes one file now; returns its path."""
    stats = torch.cuda.memory_stats(device)
    doc = {
        "version": 1,
        "pid": os.getpid(),
        "nspid": _nspid(),
        "device": device,
        "uuid": _uuid(torch, device),
        "time": time.time(),
        "interval": interval,
        "command": _command(),
        "stats": {k: int(v) for k, v in stats.items()},
        "segments": _layout(torch, device) if layout else [],
        "steps": list(_state["steps"]),
    }
    name = "%d-%d.json" % (os.getpid(), device)
    path = os.path.join(directory, name)
    tmp = ".%s.%d.tmp" % (name, threading.get_ident())
    data = json.dumps(doc, separators=(",", ":")).encode()
    # Through a descriptor of the directory, never following a link: a
    # directory swapped for a symbolic link after the check gets nothing.
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        os.close(dfd)
    return path


def _on_step(optimizer, args, kwargs):
    import torch

    steps = _state["steps"]
    steps.append(int(torch.cuda.memory_allocated()))
    del steps[:-64]


def start(interval=0.5, directory=None, devices=None, layout=True):
    """Starts publishing every ``interval`` seconds (idempotent).

    ``devices``: CUDA device indices (default: the current device).
    ``layout``: include the segment/block layout (the fragmentation map).
    """
    try:
        return _start(interval, directory, devices, layout)
    except Exception as e:
        # Publishing must never break training.
        _warn("not publishing: %s" % e)
        return None


def _start(interval, directory, devices, layout):
    import torch

    with _lock:
        if _state["thread"] is not None:
            return _state["thread"]
        directory = _usable_dir(directory or default_dir())
        if directory is None:
            return None
        devs = list(devices) if devices is not None else [torch.cuda.current_device()]
        stop = threading.Event()
        try:
            # torch.optim deletes its submodules' names: import the function.
            from torch.optim.optimizer import register_optimizer_step_post_hook

            _state["hook"] = register_optimizer_step_post_hook(_on_step)
        except (AttributeError, ImportError):
            _state["hook"] = None

        def loop():
            while not stop.is_set():
                for d in devs:
                    try:
                        p = publish_once(torch, directory, d, interval, layout)
                        if p not in _state["files"]:
                            _state["files"].append(p)
                    except Exception:
                        # Publishing must never break training.
                        pass
                stop.wait(interval)

        t = threading.Thread(target=loop, name="gpumem-top-publish", daemon=True)
        _state["thread"], _state["stop"] = t, stop
        t.start()
        atexit.register(stop_publishing)
        return t


def stop_publishing():
    """Stops the thread and removes this process's files."""
    with _lock:
        if _state["stop"] is not None:
            _state["stop"].set()
        if _state["hook"] is not None:
            _state["hook"].remove()
        for p in _state["files"]:
            try:
                os.unlink(p)
            except OSError:
                pass
        _state.update(thread=None, stop=None, hook=None, files=[])
