"""Pairs of runs whose difference is known, for checking `gpumem-top diff`
(docs/user/diff.md):

    python3 measurements/diff/pairs.py NAME OUT_DIR

trains Hugging Face GPT-2 (6 layers, AdamW) for four steps with memory
history on and writes OUT_DIR/NAME.pickle.gz and OUT_DIR/NAME.truth.json.

    base      batch 8, sequence 256, fp32
    same      base again (the unchanged pair: base/same)
    leak      base, and each step keeps the last position's logits alive
              (`kept.append(...)`, LEAK_LINE below): 1.6 MB more per step
    leak_fwd  base, and each step keeps a copy of the last position's logits
              made between forward and backward (LEAK_FWD_LINE below)
    ckpt      base with gradient checkpointing
    batch16   base at batch 16
    amp       base under bf16 autocast
    vocab     base with a 100,000-token vocabulary

    python3 measurements/diff/pairs.py --all OUT_DIR    every one
"""

import gzip
import json
import os
import pickle
import subprocess
import sys

PAIRS = ["base", "same", "leak", "leak_fwd", "ckpt", "batch16", "amp", "vocab"]


def run(name, out):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    dev = "cuda"
    torch.cuda.init()
    torch.cuda.memory._record_memory_history(context="alloc", stacks="python", max_entries=2_000_000)
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=6, vocab_size=100_000 if name == "vocab" else 50257)
    model = GPT2LMHeadModel(cfg).to(dev)
    if name == "ckpt":
        model.gradient_checkpointing_enable()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    n = 16 if name == "batch16" else 8
    kept = []
    for _ in range(4):
        ids = torch.randint(0, cfg.vocab_size, (n, 256), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=name == "amp"):
            out_ = model(input_ids=ids, labels=ids)
        if name == "leak_fwd":
            kept.append(out_.logits[:, -1].detach().clone())  # LEAK_FWD_LINE
        out_.loss.backward()
        if name == "leak":
            kept.append(out_.logits[:, -1].detach().clone())  # LEAK_LINE
        opt.step()
        opt.zero_grad(set_to_none=True)
        del out_
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    os.makedirs(out, exist_ok=True)
    with gzip.open(os.path.join(out, name + ".pickle.gz"), "wb") as f:
        pickle.dump(snap, f)
    s = torch.cuda.memory_stats()
    truth = {
        "pair": name,
        "allocated_peak_bytes": s["allocated_bytes.all.peak"],
        "reserved_peak_bytes": s["reserved_bytes.all.peak"],
        "allocated_end_bytes": s["allocated_bytes.all.current"],
        "stats": {k: v for k, v in s.items() if isinstance(v, int)},
        "recorded_with": "torch %s, %s" % (torch.__version__, torch.cuda.get_device_name()),
    }
    with open(os.path.join(out, name + ".truth.json"), "w") as f:
        json.dump(truth, f, indent=1)
    print("RESULT %s peak allocated %d reserved %d end %d" % (
        name, truth["allocated_peak_bytes"], truth["reserved_peak_bytes"], truth["allocated_end_bytes"]), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--all":
        out = sys.argv[2]
        procs = [subprocess.Popen([sys.executable, __file__, w, out]) for w in PAIRS]
        sys.exit(max(p.wait() for p in procs))
    run(sys.argv[1], sys.argv[2])
