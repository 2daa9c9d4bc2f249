"""Ordinary varying-shape training for the live view's leak alert
(docs/user/live.md, "Alerts"), run under `gpumem-top run -o REC -- python3
measurements/live/varying.py`: Hugging Face GPT-2 (6 layers, AdamW), batch 4,
the sequence length drawn every step (seeded), 40 steps. Step-end
allocated moves by a few MiB with the shapes (the optimizer's temporaries,
the caching of the last step's sizes): no leak. With LEAK=1 each step also
keeps 32 MiB alive, a leak under the same noise. With WARMUP=1 the
sequence length rises 128, 256, ... 1024 over the first eight steps (a
sequence-length warmup): step-end allocated rises a few MiB each step,
which is no leak either.
"""

import os
import random

import torch
from transformers import GPT2Config, GPT2LMHeadModel

rng = random.Random(7)
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=6)).to("cuda")
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
leak = os.environ.get("LEAK") == "1"
kept = []
warmup = os.environ.get("WARMUP") == "1"
for step in range(40):
    seq = rng.choice([128, 256, 384, 512, 640, 768, 896, 1024])
    if warmup and step < 8:
        seq = 128 * (step + 1)
    ids = torch.randint(0, 50257, (4, seq), device="cuda")
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if leak:
        kept.append(torch.empty(32 << 20, dtype=torch.uint8, device="cuda"))
torch.cuda.synchronize()
print("steps", step + 1, "allocated", torch.cuda.memory_allocated())
