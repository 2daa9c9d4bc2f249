"""Snapshots recorded under the conditions a run really had (docs/user/replay.md,
"Conditions"): a per-process memory limit, settings changed mid-run by
`torch.cuda.memory._set_allocator_settings`, or both. One fresh process per
case, history recorded from process start:

    python3 measurements/conditions/record.py OUT_DIR [CASE ...]

Each case writes OUT_DIR/CASE.pickle.gz and OUT_DIR/CASE.truth.json:
memory_stats() at the end, the limit in bytes (None without one), the
settings before and after, and `switch_event`, the number of trace entries
recorded when the settings changed (the first event under the new ones).

Workloads: `gpt2` (Hugging Face GPT-2, 6 layers, AdamW, batch 4, sequence
length drawn every step, seeded) and `mlp` (six 4096-wide layers, Adam,
batch and kept side tensors drawn every step). Under a limit a step that
runs out of memory is skipped (counted in num_ooms), as users' loops that
skip a batch do; `stop_at_oom` cases take the snapshot at the first OOM
instead, as a user debugging one does.
"""

import gzip
import json
import os
import pickle
import random
import subprocess
import sys
import zlib

GIB = 1 << 30
# name: (workload, PYTORCH_CUDA_ALLOC_CONF, limit bytes, (step, new settings) or None, stop at first OOM)
CASES = {
    "switch_split_roundup": ("gpt2", "", None, (3, "max_split_size_mb:32,roundup_power2_divisions:4"), False),
    "switch_roundup": ("gpt2", "", None, (4, "roundup_power2_divisions:8"), False),
    "switch_split": ("mlp", "", None, (6, "max_split_size_mb:128"), False),
    "switch_gc_split_limit": ("mlp", "", 5 * GIB, (5, "garbage_collection_threshold:0.6,max_split_size_mb:128"), False),
    "switch_gc_limit": ("mlp", "", 5 * GIB, (8, "garbage_collection_threshold:0.7"), False),
    "switch_es_split": ("gpt2", "", None, (4, "expandable_segments:True,max_split_size_mb:64"), False),
    "switch_from_env": ("gpt2", "max_split_size_mb:256", None, (4, "roundup_power2_divisions:4"), False),
    "switch_es_limit": ("mlp", "", 5 * GIB, (8, "expandable_segments:True"), False),
    "limit_gc": ("mlp", "garbage_collection_threshold:0.8", 5 * GIB, None, False),
    "limit_retries": ("gpt2", "", int(5.25 * GIB), None, False),
    "limit_oom": ("gpt2", "", int(4.5 * GIB), None, False),
    "limit_split_gc": ("gpt2", "max_split_size_mb:128,garbage_collection_threshold:0.6", 6 * GIB, None, False),
    "limit_oom_stop": ("mlp", "", 3 * GIB, None, True),
    "limit_es_gc": ("gpt2", "expandable_segments:True,garbage_collection_threshold:0.7", 5 * GIB, None, False),
}


def run(name, out):
    import torch

    workload, conf, limit, switch, stop_at_oom = CASES[name]
    torch.cuda.init()
    total = torch.cuda.get_device_properties(0).total_memory
    if limit:
        torch.cuda.set_per_process_memory_fraction(limit / total)
    torch.cuda.memory._record_memory_history(context="alloc", stacks="python", max_entries=2_000_000)
    rng = random.Random(zlib.crc32(name.encode()))
    dev = "cuda"
    switch_event = None
    ooms = 0
    if workload == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(n_layer=6)).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step():
            seq = rng.choice([128, 256, 384, 512, 640, 768, 896, 1024])
            ids = torch.randint(0, 50257, (4, seq), device=dev)
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()

        steps = 10
    else:
        torch.manual_seed(0)
        layers = [torch.nn.Linear(4096, 4096).to(dev) for _ in range(6)]
        params = [p for l in layers for p in l.parameters()]
        opt = torch.optim.Adam(params, lr=1e-4)

        def step():
            b = rng.choice([1024, 3072, 5120, 7168, 9216, 11264, 13312])
            widths = [rng.choice([1, 3, 5, 9]) for _ in layers]
            x = torch.randn(b, 4096, device=dev)
            keep = []
            for l, w in zip(layers, widths):
                x = torch.relu(l(x))
                keep.append(torch.randn(w << 20, device=dev))
            x.sum().backward()
            opt.step()

        steps = 16
    for k in range(steps):
        if switch and k == switch[0]:
            torch.cuda.synchronize()
            switch_event = sum(len(t) for t in torch.cuda.memory._snapshot()["device_traces"])
            torch.cuda.memory._set_allocator_settings(switch[1])
        try:
            step()
        except torch.OutOfMemoryError:
            ooms += 1
            if stop_at_oom:
                break
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    s = {k: int(v) for k, v in torch.cuda.memory_stats().items()}
    snap = torch.cuda.memory._snapshot()
    with gzip.open(os.path.join(out, name + ".pickle.gz"), "wb") as f:
        pickle.dump(snap, f)
    truth = {
        "trace": name + ".pickle.gz",
        "recorded_with": "torch %s, %s" % (torch.__version__, torch.cuda.get_device_name()),
        "workload": workload,
        "alloc_conf": conf,
        "memory_limit_bytes": limit,
        "device_total_bytes": total,
        "switch_step": switch[0] if switch else None,
        "switch_to": switch[1] if switch else None,
        "switch_event": switch_event,
        "ooms_caught": ooms,
        "allocator_settings": snap.get("allocator_settings"),
        "stats": s,
    }
    with open(os.path.join(out, name + ".truth.json"), "w") as f:
        json.dump(truth, f, indent=1)
    print("ok %s: %d events, %d segments, retries %d, ooms %d, reserved peak %d" % (
        name, sum(len(t) for t in snap["device_traces"]), len(snap["segments"]), s["num_alloc_retries"],
        s["num_ooms"], s["reserved_bytes.all.peak"]), flush=True)


if __name__ == "__main__":
    out = sys.argv[1]
    if len(sys.argv) > 2 and sys.argv[2] == "--one":
        run(sys.argv[3], out)
        sys.exit(0)
    os.makedirs(out, exist_ok=True)
    names = sys.argv[2:] or list(CASES)
    procs = []
    for n in names:
        while len(procs) >= 4:
            p = procs.pop(0)
            o, e = p[1].communicate()
            print(p[0], p[1].returncode, o.strip(), (e.strip().splitlines() or [""])[-1], flush=True)
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=CASES[n][1])
        procs.append((n, subprocess.Popen([sys.executable, __file__, out, "--one", n], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    for p in procs:
        o, e = p[1].communicate()
        print(p[0], p[1].returncode, o.strip(), (e.strip().splitlines() or [""])[-1], flush=True)
