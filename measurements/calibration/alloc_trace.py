"""What cudnn_workspaces.py and linear_backward.py read from PyTorch's
allocator trace (`torch.cuda.memory._record_memory_history` must be on)."""
import torch


def trace():
    """The device's trace entries so far."""
    return torch.cuda.memory._snapshot()["device_traces"][0]


def allocs(events):
    """[bytes, transient] per allocation, in order; transient: freed before
    the next allocation (a workspace)."""
    out = []
    for i, e in enumerate(events):
        if e["action"] != "alloc":
            continue
        nxt = next((f for f in events[i + 1:] if f["action"] in ("alloc", "free_requested")), None)
        transient = nxt is not None and nxt["action"] == "free_requested" and nxt["addr"] == e["addr"]
        out.append([e["size"], transient])
    return out
