"""GPT-2 (124M, random weights, no download) training steps on the GPU, for
checking `gpumem-top run` beside a real run (docs/user/live.md):

  python3 gpt2_steps.py --steps 200 --out steps.json [--varying] [--reset]
                        [--history N] [--snapshot-at STEP]

Each step: forward, backward, AdamW step, zero_grad. With --reset the
script calls torch.cuda.reset_peak_memory_stats() before each step, as a
user measuring per-step peaks does; either way it reads
max_memory_allocated()/max_memory_reserved() right after optimizer.step()
and records them with the step's wall time (synchronised). --varying draws
batch and sequence length per step (as a data loader with buckets does);
--history N records PyTorch's memory history itself (the baseline for the
publisher's cost with history on). --snapshot-at K runs
`$GPUMEM_TOP_BIN snapshot <own pid> -o $SNAPSHOT_OUT` after step K."""

import argparse
import json
import os
import random
import subprocess
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=200)
ap.add_argument("--out", required=True)
ap.add_argument("--varying", action="store_true")
ap.add_argument("--reset", action="store_true")
ap.add_argument("--history", type=int, default=0)
ap.add_argument("--snapshot-at", type=int, default=-1)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--seq", type=int, default=512)
a = ap.parse_args()

torch.manual_seed(0)
rng = random.Random(0)
if a.history:
    torch.cuda.memory._record_memory_history(max_entries=a.history, stacks="python")
dev = torch.device("cuda")
model = GPT2LMHeadModel(GPT2Config()).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
rows = []
for step in range(a.steps):
    if a.varying:
        b, s = rng.choice([2, 4, 6, 8, 12, 16]), rng.choice([128, 256, 384, 512, 768, 1024])
    else:
        b, s = a.batch, a.seq
    x = torch.randint(0, 50257, (b, s), device=dev)
    torch.cuda.synchronize()
    if a.reset:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    rows.append(
        {
            "step": step + 1,
            "batch": b,
            "seq": s,
            "seconds": dt,
            "max_allocated": torch.cuda.max_memory_allocated(),
            "max_reserved": torch.cuda.max_memory_reserved(),
            "allocated_end": torch.cuda.memory_allocated(),
        }
    )
    opt.zero_grad(set_to_none=True)
    if step + 1 == a.snapshot_at:
        r = subprocess.run(
            [os.environ["GPUMEM_TOP_BIN"], "snapshot", str(os.getpid()), "-o", os.environ["SNAPSHOT_OUT"]],
            capture_output=True,
            text=True,
        )
        print("snapshot:", r.returncode, r.stdout.strip(), r.stderr.strip(), flush=True)
with open(a.out, "w") as f:
    json.dump({"pid": os.getpid(), "rows": rows, "stats": {k: int(v) for k, v in torch.cuda.memory_stats().items()}}, f)
ts = sorted(r["seconds"] for r in rows[10:])
print("median step %.2f ms over %d steps" % (1000 * ts[len(ts) // 2], len(ts)), flush=True)
