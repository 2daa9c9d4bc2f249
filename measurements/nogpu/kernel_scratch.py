"""What CUDA kernels take from PyTorch's caching allocator besides their
outputs, measured per case on the GPU (the recorder of `fit --no-gpu`
adds them: docs/user/fit.md "Without a GPU"). One JSON line per case: the
case and the allocator requests made inside it, in order, as
[action, size] with action "a" (alloc) or "f" (free)."""
import json
import sys

import torch
import torch.nn.functional as F


def requests(fn):
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=100000)
    fn()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    out = []
    for e in snap["device_traces"][0]:
        if e["action"] == "alloc":
            out.append(["a", e["size"]])
        elif e["action"] == "free_completed":
            out.append(["f", e["size"]])
    return out


def emit(case, reqs):
    print(json.dumps({"case": case, "requests": reqs}), flush=True)


dev = "cuda"
# Sums over rows (a bias gradient): the reduction kernel's partial sums.
for dt in (torch.float32, torch.bfloat16):
    for rows in (256, 512, 513, 1024, 2048, 4096, 8192, 32768, 131072):
        for out in (64, 768, 1024, 2304, 3072, 4096, 8192, 16384, 30522, 50257):
            g = torch.randn(rows, out, device=dev, dtype=dt)
            emit({"op": "sum0", "rows": rows, "out": out, "dtype": str(dt)}, requests(lambda: g.sum(0)))
            del g
# A Linear's backward with a bias, 3-D input, as models call it.
for dt in (torch.float32, torch.bfloat16):
    for b, s, i, o in ((2, 512, 768, 768), (8, 1024, 768, 3072), (2, 512, 768, 30522), (16, 128, 1024, 4096)):
        lin = torch.nn.Linear(i, o, device=dev, dtype=dt)
        x = torch.randn(b, s, i, device=dev, dtype=dt, requires_grad=True)
        y = lin(x)
        gy = torch.randn_like(y)
        emit({"op": "linear_backward", "shape": [b, s, i, o], "dtype": str(dt)}, requests(lambda: y.backward(gy)))
        del lin, x, y, gy
# Attention's backward: flash (half types), memory-efficient (fp32, masks), GQA.
for dt, b, h, hk, l, d, causal, mask in (
        (torch.bfloat16, 2, 12, 12, 512, 64, False, False),
        (torch.bfloat16, 2, 12, 12, 512, 64, True, False),
        (torch.bfloat16, 4, 16, 4, 1024, 64, True, False),
        (torch.bfloat16, 2, 8, 8, 300, 128, True, False),
        (torch.float32, 2, 12, 12, 512, 64, False, False),
        (torch.float32, 2, 12, 12, 512, 64, True, False),
        (torch.float32, 8, 12, 12, 256, 64, False, False),
        (torch.bfloat16, 2, 12, 12, 512, 64, False, True),
        (torch.float32, 2, 12, 12, 512, 64, False, True),
):
    q = torch.randn(b, h, l, d, device=dev, dtype=dt, requires_grad=True)
    k = torch.randn(b, hk, l, d, device=dev, dtype=dt, requires_grad=True)
    v = torch.randn(b, hk, l, d, device=dev, dtype=dt, requires_grad=True)
    m = torch.zeros(b, 1, l, l, device=dev, dtype=dt) if mask else None
    case = {"op": "sdpa", "dtype": str(dt), "b": b, "h": h, "hk": hk, "l": l, "d": d, "causal": causal, "mask": mask}
    fwd = []

    def run():
        fwd.append(F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal, dropout_p=0.1,
                                                  enable_gqa=hk != h))

    case["forward"] = requests(run)
    o = fwd[0]
    go = torch.randn_like(o)
    emit(case, requests(lambda: o.backward(go)))
    del q, k, v, o, go, fwd, m
# Embedding's backward (sorting the indices).
for n, vocab, d in ((1024, 50257, 768), (8192, 50257, 768), (4096, 32000, 1024), (1024, 512, 768)):
    emb = torch.nn.Embedding(vocab, d, device=dev)
    ids = torch.randint(0, vocab, (n,), device=dev)
    y = emb(ids)
    gy = torch.randn_like(y)
    emit({"op": "embedding_backward", "n": n, "vocab": vocab, "d": d}, requests(lambda: y.backward(gy)))
    del emb, ids, y, gy
# LayerNorm's backward.
for rows, n in ((1024, 768), (8192, 768), (65536, 768), (4096, 4096)):
    ln = torch.nn.LayerNorm(n, device=dev)
    x = torch.randn(rows, n, device=dev, dtype=torch.float32, requires_grad=True)
    y = ln(x)
    gy = torch.randn_like(y)
    emit({"op": "layer_norm_backward", "rows": rows, "n": n}, requests(lambda: y.backward(gy)))
    del ln, x, y, gy
print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name()}), file=sys.stderr)
