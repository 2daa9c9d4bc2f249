_dev = {}
_history = {}
# Threads that took a full memory_snapshot() (with the history).
_full_snapshots = []


def _d(d):
    return _dev.setdefault(d, {"cur": 0, "peak": 0, "res": 0, "rpeak": 0, "nalloc": 0, "nfree": 0})


def _stat(current, peak, allocated=0, freed=0):
    return {"current": current, "peak": peak, "allocated": allocated, "freed": freed}


def _cuda_memoryStats(device):
    s = _d(device)
    return {
        "allocated_bytes": {"all": _stat(s["cur"], s["peak"]), "large_pool": _stat(s["cur"], s["peak"])},
        "reserved_bytes": {"all": _stat(s["res"], s["rpeak"])},
        "allocation": {"all": _stat(s["nalloc"] - s["nfree"], 0, s["nalloc"], s["nfree"])},
        "segment": {"all": _stat(1 if s["res"] else 0, 1)},
        "num_alloc_retries": 0,
        "num_ooms": 0,
    }


def _cuda_resetPeakMemoryStats(device):
    s = _d(device)
    s["peak"], s["rpeak"] = s["cur"], s["res"]


def _alloc(n, device=0):
    s = _d(device)
    s["cur"] += n
    s["nalloc"] += 1
    s["peak"] = max(s["peak"], s["cur"])
    if s["cur"] > s["res"]:
        s["res"] = s["cur"]
    s["rpeak"] = max(s["rpeak"], s["res"])


def _free(n, device=0):
    s = _d(device)
    s["cur"] -= n
    s["nfree"] += 1


_oom_observers = []


def _cuda_attach_out_of_memory_observer(f):
    _oom_observers.append(f)


def _oom(n, device=0):
    """A request the caching allocator cannot meet: as PyTorch, the
    out-of-memory observers are called, then the error is raised."""
    import torch

    for f in list(_oom_observers):
        f(device, n, _d(device)["res"], 0)
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate %d bytes." % n)
