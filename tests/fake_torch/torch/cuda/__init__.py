import threading

import torch

from . import memory

_initialized = False
_queued_calls = []
_initialization_lock = threading.Lock()
_tls = threading.local()


def is_initialized():
    return _initialized


def _lazy_call(callable):
    with _initialization_lock:
        if _initialized:
            callable()
        else:
            _queued_calls.append(callable)


def _lazy_init():
    global _initialized
    if _initialized or hasattr(_tls, "is_initializing"):
        return
    with _initialization_lock:
        if _initialized:
            return
        _tls.is_initializing = True
        try:
            for c in _queued_calls:
                c()
        finally:
            del _tls.is_initializing
        _initialized = True


def init():
    _lazy_init()


def is_available():
    return True


def current_device():
    _lazy_init()
    return 0


def device_count():
    return 1


def memory_stats_as_nested_dict(device=None):
    if not is_initialized():
        return {}
    return torch._C._cuda_memoryStats(0 if device is None else device)


def memory_stats(device=None):
    out = {}

    def flat(prefix, v):
        if isinstance(v, dict):
            for k, x in v.items():
                flat(prefix + "." + k if prefix else k, x)
        else:
            out[prefix] = v

    flat("", memory_stats_as_nested_dict(device))
    return dict(sorted(out.items()))


def memory_allocated(device=None):
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def memory_reserved(device=None):
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_allocated(device=None):
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def max_memory_reserved(device=None):
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device=None):
    return torch._C._cuda_resetPeakMemoryStats(0 if device is None else device)


def memory_snapshot(mempool_id=None, include_traces=True):
    # As PyTorch 2.11: the full call (with the history) is what touches
    # torch._inductor; which threads made it is noted.
    if include_traces:
        torch._C._full_snapshots.append(threading.current_thread().name)
    return memory._snapshot()["segments"]


def get_device_properties(device):
    raise RuntimeError("no properties in the stand-in")
