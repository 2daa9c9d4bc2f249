"""cuDNN's convolution workspaces on this GPU, per convolution of
torchvision's ResNet-50, as PyTorch allocates them (torch.backends.cudnn
defaults: benchmark off, so cuDNN's heuristics pick the algorithm, and its
workspace is one allocation freed when the kernel is queued).

Run on a CUDA machine: `python3 measurements/calibration/cudnn_workspaces.py > table.jsonl`.
For each distinct convolution of the model (channels, kernel, stride,
padding, input size), each dtype (fp32; bf16 as autocast runs it) and each
batch, one warm-up call, then one recorded forward and backward. Prints one
JSON line per case: the allocations of the forward (the output first) and
of the backward (the incoming gradient first) in order, each `[bytes,
transient]` (transient: freed before the next allocation, i.e. a workspace). `src/workload/cudnn.rs` reads the table these
lines make (`tests/fixtures/calibration/cudnn_h200.json`).
"""
import json, sys

import torch
import torchvision

from alloc_trace import allocs, trace

BATCHES = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512]


def geometries():
    """Every distinct Conv2d of ResNet-50 with its input size, in call order."""
    m = torchvision.models.resnet50()
    seen, out = set(), []

    def hook(mod, inp, _):
        g = (mod.in_channels, mod.out_channels, mod.kernel_size[0], mod.stride[0], mod.padding[0], inp[0].shape[-1])
        if g not in seen:
            seen.add(g)
            out.append(g)

    for mod in m.modules():
        if isinstance(mod, torch.nn.Conv2d):
            mod.register_forward_hook(hook)
    with torch.no_grad():
        m(torch.zeros(1, 3, 224, 224))
    return out


def case(geom, dtype, batch):
    cin, cout, k, s, p, h = geom
    conv = torch.nn.Conv2d(cin, cout, k, s, p, bias=False).cuda().to(dtype)
    # The model's first convolution takes the images: no gradient for them.
    x = torch.randn(batch, cin, h, h, device="cuda", dtype=dtype, requires_grad=cin != 3)
    y = conv(x)
    y.backward(torch.randn_like(y))
    del y
    conv.weight.grad, x.grad = None, None
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
    start = len(trace())
    y = conv(x)
    torch.cuda.synchronize()
    mid = len(trace())
    g = torch.randn_like(y)
    y.backward(g)
    torch.cuda.synchronize()
    t = trace()
    torch.cuda.memory._record_memory_history(enabled=None)
    fwd, bwd = allocs(t[start:mid]), allocs(t[mid:])
    del y, g, x, conv
    torch.cuda.empty_cache()
    return fwd, bwd


def main():
    print(json.dumps({"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                      "device": torch.cuda.get_device_name(), "benchmark": torch.backends.cudnn.benchmark}),
          flush=True)
    for geom in geometries():
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            for b in BATCHES:
                try:
                    fwd, bwd = case(geom, dtype, b)
                except torch.OutOfMemoryError as e:
                    print(json.dumps({"geom": geom, "dtype": name, "batch": b, "error": str(e)[:200]}), flush=True)
                    continue
                print(json.dumps({"geom": geom, "dtype": name, "batch": b, "fwd": fwd, "bwd": bwd}), flush=True)


if __name__ == "__main__":
    main()
