"""Field snapshots of round 4 (docs/user/replay.md), one fresh process each:

    python3 measurements/snapshot_kinds/record_round4.py OUT_DIR

- history_less_expandable: GPT-2 (4 layers) training steps under
  expandable_segments:True, then `torch.cuda.memory._snapshot()` with
  history never enabled;
- settings_changed: history from process start; training under the default
  settings, then `torch.cuda.memory._set_allocator_settings(
  "expandable_segments:True")` (as libraries do) and more steps;
- wrapped_expandable_gpt2: GPT-2 steps under expandable_segments:True with
  `max_entries=3000` (the ring buffer wraps).

Each writes OUT_DIR/NAME.pickle.gz and NAME.truth.json (memory_stats() at
the end).
"""

import gzip
import json
import os
import pickle
import subprocess
import sys

BODY = r'''
import gzip, json, os, pickle, sys, torch
name, out = sys.argv[1], sys.argv[2]
torch.cuda.init()
if name == "settings_changed" or name == "wrapped_expandable_gpt2":
    kw = dict(context="alloc", stacks="python")
    if name == "wrapped_expandable_gpt2":
        kw["max_entries"] = 3000
    torch.cuda.memory._record_memory_history(**kw)
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=4)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
def step(seq):
    ids = torch.randint(0, 50257, (4, seq), device="cuda")
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
for seq in (256, 512, 384):
    step(seq)
if name == "settings_changed":
    torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    for seq in (640, 256, 512):
        step(seq)
torch.cuda.synchronize()
snap = torch.cuda.memory._snapshot()
with gzip.open(os.path.join(out, name + ".pickle.gz"), "wb") as f:
    pickle.dump(snap, f)
stats = {k: int(v) for k, v in torch.cuda.memory_stats().items()}
json.dump({"trace": name + ".pickle.gz", "recorded_with": "torch %s, %s" % (torch.__version__, torch.cuda.get_device_name()),
           "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "stats": stats},
          open(os.path.join(out, name + ".truth.json"), "w"), indent=1)
print("ok", name, sum(len(t) for t in snap.get("device_traces", [])), "events", len(snap["segments"]), "segments")
'''

if __name__ == "__main__":
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, conf in [("history_less_expandable", "expandable_segments:True"), ("settings_changed", ""),
                       ("wrapped_expandable_gpt2", "expandable_segments:True")]:
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf)
        p = subprocess.run([sys.executable, "-c", BODY, name, out], env=env, capture_output=True, text=True)
        print(name, p.returncode, p.stdout.strip(), (p.stderr.strip().splitlines() or [""])[-1])
