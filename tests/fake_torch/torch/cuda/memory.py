import torch


def _record_memory_history(**kw):
    torch._C._history.update(kw)


def _snapshot(device=None):
    s = torch._C._d(0)
    return {
        "segments": [],
        "device_traces": [[{"action": "alloc", "size": s["cur"]}]],
        "history": dict(torch._C._history),
    }
