"""What a Linear layer's backward allocates on this GPU, beyond its
gradients: PyTorch reduces the output gradient over the rows for the bias
gradient, and its reduction kernel can take a global-memory buffer (and a
small semaphore array) when it splits the rows over several blocks.

Run on a CUDA machine: `python3 measurements/calibration/linear_backward.py > linear.jsonl`.
One JSON line per (rows, in, out, dtype, 2-D or 3-D input): the backward's
allocations in order, `[bytes, transient]`, the incoming gradient first.
"""
import json

import torch

from alloc_trace import allocs, trace


def case(rows, fin, fout, dtype, three_d):
    lin = torch.nn.Linear(fin, fout).cuda().to(dtype)
    shape = (rows // 512, 512, fin) if three_d else (rows, fin)
    x = torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=True)
    for record in (False, True):
        y = lin(x)
        torch.cuda.synchronize()
        if record:
            torch.cuda.memory._record_memory_history(max_entries=100000)
            start = len(trace())
        y.backward(torch.randn_like(y))
        torch.cuda.synchronize()
        if record:
            t = trace()[start:]
            torch.cuda.memory._record_memory_history(enabled=None)
        del y
        lin.weight.grad = lin.bias.grad = x.grad = None
    return allocs(t)


def main():
    print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name()}), flush=True)
    for dtype in (torch.float32, torch.bfloat16):
        for fin, fout in ((1024, 4096), (4096, 4096), (4096, 1000), (768, 3072), (3072, 768), (768, 2304)):
            for rows in (256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 32768):
                for three_d in (False, True):
                    if three_d and rows < 512:
                        continue
                    b = case(rows, fin, fout, dtype, three_d)
                    print(json.dumps({"rows": rows, "in": fin, "out": fout, "dtype": str(dtype).split(".")[-1],
                                      "three_d": three_d, "bwd": b}), flush=True)
                    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
