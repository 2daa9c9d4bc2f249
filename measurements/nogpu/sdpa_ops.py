"""The ATen ops (and their outputs' shapes and dtypes) of one attention call
as T5 makes it (bf16 autocast, a learned fp32 position bias as the mask,
dropout), forward and backward, with the caching allocator's requests in
order: run on the GPU and under `fit --no-gpu` to compare what the recorder
sees with what CUDA runs (docs/user/fit.md "Without a GPU").

    python3 sdpa_ops.py --batch-size 16 [--dropout 0.1] [--mask-batch 1] [--log 1]
"""
import argparse
import contextlib
import sys

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=16)
p.add_argument("--dropout", type=float, default=0.1)
p.add_argument("--mask-batch", type=int, default=1, help="the bias's batch dimension (1: broadcast)")
p.add_argument("--mask-grad", type=int, default=1)
p.add_argument("--log", type=int, default=0, help="1: print each ATen op (a dispatch mode: it changes what ATen runs)")
a = p.parse_args()


class Log(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = torch.cuda.memory_allocated()
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else [out]
        shapes = [(tuple(o.shape), str(o.dtype).replace("torch.", "")) for o in outs if isinstance(o, torch.Tensor)]
        print("op", func, shapes, torch.cuda.memory_allocated() - before, file=sys.stderr, flush=True)
        return out


B, H, S, D = a.batch_size, 8, 256, 64
dev = "cuda"
q, k, v = (torch.randn(B, S, H * D, device=dev).view(B, S, H, D).transpose(1, 2).requires_grad_() for _ in range(3))
bias = torch.randn(a.mask_batch, H, S, S, device=dev).requires_grad_(bool(a.mask_grad))
torch.cuda.synchronize()
print("start", torch.cuda.memory_allocated(), file=sys.stderr, flush=True)
with torch.autocast("cuda", dtype=torch.bfloat16):
    with (Log() if a.log else contextlib.nullcontext()):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=a.dropout, scale=1.0)
print("forward", torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated(), file=sys.stderr, flush=True)
with (Log() if a.log else contextlib.nullcontext()):
    out.float().sum().backward()
print("backward", torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated(), file=sys.stderr, flush=True)
