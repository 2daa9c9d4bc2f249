"""Workloads whose best PYTORCH_CUDA_ALLOC_CONF is not obvious, for checking
`gpumem-top tune` against real runs (docs/user/tune.md):

    python3 measurements/tune/workloads.py NAME OUT_DIR [--record]

runs workload NAME once under the PYTORCH_CUDA_ALLOC_CONF in the
environment and prints one JSON line with PyTorch's own figures (peak
reserved and allocated, retries, OOMs, cudaMalloc calls). With --record it
also records memory history from process start and writes
OUT_DIR/NAME.pickle.gz and OUT_DIR/NAME.truth.json.

    gpt2_varying   Hugging Face GPT-2 (6 layers), AdamW, batch 4, the
                   sequence length changing every step (seeded)
    vit_infer      torchvision ViT-B/16 inference, bf16, the batch changing
                   every call (seeded)
    mlp_limit      an MLP trained at varying batch and width under
                   set_per_process_memory_fraction (5 GiB of the H200):
                   retries, where garbage_collection_threshold matters

    python3 measurements/tune/workloads.py --menu OUT_DIR
runs every workload under every setting of the menu (six at a time) and
writes OUT_DIR/real.jsonl.

    GPUMEM_TUNE_LIMIT_BYTES=N python3 measurements/tune/workloads.py --menu OUT_DIR gpt2_varying
runs one workload's menu under set_per_process_memory_fraction(N / total)
(a step that runs out of memory is skipped, as in mlp_limit): the real
runs `tune --memory-limit N` is checked against (tests/it/tune.rs).
"""

import gzip
import json
import os
import pickle
import random
import subprocess
import sys

MENU = [
    "",
    "expandable_segments:True",
    "max_split_size_mb:64",
    "max_split_size_mb:128",
    "max_split_size_mb:256",
    "max_split_size_mb:512",
    "roundup_power2_divisions:2",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:8",
    "roundup_power2_divisions:16",
    "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
    "garbage_collection_threshold:0.6",
    "garbage_collection_threshold:0.8",
    "expandable_segments:True,roundup_power2_divisions:4",
    "max_split_size_mb:256,roundup_power2_divisions:4",
    "expandable_segments:True,garbage_collection_threshold:0.8",
    "max_split_size_mb:128,garbage_collection_threshold:0.8",
]
WORKLOADS = ["gpt2_varying", "vit_infer", "mlp_limit"]
LIMIT_BYTES = 5 << 30


def run(name, out, record):
    import torch

    torch.cuda.init()
    limit = int(os.environ.get("GPUMEM_TUNE_LIMIT_BYTES") or (LIMIT_BYTES if name == "mlp_limit" else 0))
    if limit:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(limit / total)
    if record:
        torch.cuda.memory._record_memory_history(context="alloc", stacks="python", max_entries=2_000_000)
    rng = random.Random(1234)
    dev = "cuda"
    if name == "gpt2_varying":
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(n_layer=6)).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for _ in range(10):
            seq = rng.choice([128, 256, 384, 512, 640, 768, 896, 1024])
            try:
                ids = torch.randint(0, 50257, (4, seq), device=dev)
                model(input_ids=ids, labels=ids).loss.backward()
                opt.step()
            except torch.OutOfMemoryError:
                pass  # under a limit: counted in num_ooms, the step skipped
            opt.zero_grad(set_to_none=True)
    elif name == "vit_infer":
        import torchvision

        model = torchvision.models.vit_b_16().to(dev).eval()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            for _ in range(12):
                b = rng.choice([8, 16, 32, 48, 64, 96, 128, 160])
                model(torch.randn(b, 3, 224, 224, device=dev))
    elif name == "mlp_limit":
        torch.manual_seed(0)
        layers = [torch.nn.Linear(4096, 4096).to(dev) for _ in range(6)]
        params = [p for l in layers for p in l.parameters()]
        opt = torch.optim.Adam(params, lr=1e-4)
        for _ in range(30):
            b = rng.choice([1024, 3072, 5120, 7168, 9216, 11264, 13312])
            widths = [rng.choice([1, 3, 5, 9]) for _ in layers]
            try:
                x = torch.randn(b, 4096, device=dev)
                keep = []
                for l, w in zip(layers, widths):
                    x = torch.relu(l(x))
                    keep.append(torch.randn(w << 20, device=dev))
                x.sum().backward()
                opt.step()
            except torch.OutOfMemoryError:
                pass  # counted in num_ooms; the run goes on, as users' loops that skip a batch do
            opt.zero_grad(set_to_none=True)
            x = keep = None
    else:
        raise SystemExit("unknown workload " + name)
    torch.cuda.synchronize()
    s = {k: int(v) for k, v in torch.cuda.memory_stats().items()}
    res = {
        "workload": name,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "reserved_peak_bytes": s["reserved_bytes.all.peak"],
        "allocated_peak_bytes": s["allocated_bytes.all.peak"],
        "num_alloc_retries": s["num_alloc_retries"],
        "num_ooms": s["num_ooms"],
        "num_device_alloc": s.get("num_device_alloc", 0),
        "memory_limit_bytes": limit or None,
    }
    if record:
        snap = torch.cuda.memory._snapshot()
        with gzip.open(os.path.join(out, name + ".pickle.gz"), "wb") as f:
            pickle.dump(snap, f)
        truth = dict(res, stats=s, memory_limit_bytes=LIMIT_BYTES if name == "mlp_limit" else None,
                     device_total_bytes=torch.cuda.get_device_properties(0).total_memory,
                     recorded_with="torch %s, %s" % (torch.__version__, torch.cuda.get_device_name()))
        with open(os.path.join(out, name + ".truth.json"), "w") as f:
            json.dump(truth, f, indent=1)
    print("RESULT " + json.dumps(res), flush=True)


def menu(out, only=None):
    os.makedirs(out, exist_ok=True)
    workloads = [only] if only else WORKLOADS
    jobs = [(w, c, False) for w in workloads for c in MENU] + ([] if only else [(w, "", True) for w in WORKLOADS])
    procs, rows = [], []

    def reap(p):
        o, e = p[1].communicate()
        line = [l for l in o.splitlines() if l.startswith("RESULT ")]
        if line:
            r = json.loads(line[-1][7:])
        else:
            r = {"workload": p[0][0], "alloc_conf": p[0][1], "error": (e.strip().splitlines() or [""])[-1]}
        r["recorded"] = p[0][2]
        rows.append(r)
        print(json.dumps(r), flush=True)

    for job in jobs:
        while len(procs) >= 6:
            reap(procs.pop(0))
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=job[1])
        args = [sys.executable, __file__, job[0], out] + (["--record"] if job[2] else [])
        procs.append((job, subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    for p in procs:
        reap(p)
    with open(os.path.join(out, "real.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "--menu":
        menu(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
    else:
        run(sys.argv[1], sys.argv[2], "--record" in sys.argv)
