"""A small real PyTorch training loop for the GPU test of `gpumem-top run`
(tests/gpu.rs): an MLP whose batch varies per step, AdamW; the script
resets the peaks before each step (as a user measuring per-step peaks does)
and writes, per step, max_memory_allocated()/max_memory_reserved() read
right after optimizer.step(); after step 20 it asks gpumem-top for a
snapshot of itself."""

import json
import os
import subprocess
import sys

import torch

torch.manual_seed(0)
dev = torch.device("cuda")
model = torch.nn.Sequential(
    torch.nn.Linear(4096, 8192), torch.nn.GELU(), torch.nn.Linear(8192, 8192), torch.nn.GELU(), torch.nn.Linear(8192, 10)
).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
rows = []
for step, batch in enumerate([256, 2048, 512, 4096, 1024, 3072, 128, 4096] * 4):
    x = torch.randn(batch, 4096, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    torch.cuda.reset_peak_memory_stats()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    rows.append({"step": step + 1, "max_allocated": torch.cuda.max_memory_allocated(), "max_reserved": torch.cuda.max_memory_reserved()})
    opt.zero_grad(set_to_none=True)
    if step + 1 == 20:
        r = subprocess.run([os.environ["GPUMEM_TOP_BIN"], "snapshot", str(os.getpid()), "-o", os.environ["SNAPSHOT_OUT"]])
        rows[-1]["snapshot_rc"] = r.returncode
json.dump({"pid": os.getpid(), "rows": rows}, open(sys.argv[1], "w"))
