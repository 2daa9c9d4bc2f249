"""Which `_record_memory_history` settings crash activation checkpointing on
this PyTorch (issue: PyTorch 2.11's memory history with stacks breaks
non-reentrant checkpointing), and what each safe setting records.

    python3 measurements/never_crash/modes.py OUT_DIR

Runs each (workload, history setting) pair in a fresh process and prints a
line each: ok/crash, the error, and for the runs that finish, how many
trace entries the snapshot holds, how many alloc entries and how many blocks
carry frames. Writes OUT_DIR/modes.jsonl.
"""

import json
import os
import subprocess
import sys

MODES = {
    "off": None,
    "stacks_python": dict(stacks="python"),
    "stacks_all": dict(stacks="all"),
    "alloc_python": dict(context="alloc", stacks="python"),
    "alloc_all": dict(context="alloc", stacks="all"),
    "state_python": dict(context="state", stacks="python"),
    "no_context": dict(context=None),
}

WORKLOADS = ["hf_gpt2", "hf_gpt2_reentrant", "torch_checkpoint", "save_on_cpu", "plain"]


def child(workload, mode, out):
    import torch

    dev = "cuda"
    torch.cuda.init()
    kw = MODES[mode]
    if kw is not None:
        torch.cuda.memory._record_memory_history(**kw)
    if workload.startswith("hf_gpt2"):
        from transformers import GPT2Config, GPT2LMHeadModel

        model = GPT2LMHeadModel(GPT2Config(n_layer=4)).to(dev)
        if workload == "hf_gpt2_reentrant":
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        else:
            model.gradient_checkpointing_enable()
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for _ in range(2):
            ids = torch.randint(0, 50257, (2, 256), device=dev)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    else:
        from torch.utils.checkpoint import checkpoint

        layers = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                                                         torch.nn.Linear(4096, 1024)) for _ in range(4)).to(dev)
        opt = torch.optim.AdamW(layers.parameters(), lr=1e-4)
        for _ in range(2):
            x = torch.randn(64, 1024, device=dev, requires_grad=True)
            if workload == "save_on_cpu":
                with torch.autograd.graph.save_on_cpu():
                    for l in layers:
                        x = l(x)
            else:
                for l in layers:
                    x = checkpoint(l, x, use_reentrant=False) if workload == "torch_checkpoint" else l(x)
            x.sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    res = {"workload": workload, "mode": mode, "ok": True}
    if kw is not None:
        snap = torch.cuda.memory._snapshot()
        tr = [e for t in snap["device_traces"] for e in t]
        allocs = [e for e in tr if e["action"] == "alloc"]
        frees = [e for e in tr if e["action"] in ("free_requested", "free_completed")]
        blocks = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
        res.update(entries=len(tr), allocs=len(allocs), allocs_with_frames=sum(1 for e in allocs if e.get("frames")),
                   frees_with_frames=sum(1 for e in frees if e.get("frames")), frees=len(frees),
                   blocks=len(blocks), blocks_with_frames=sum(1 for b in blocks if b.get("frames")))
    print("RESULT " + json.dumps(res), flush=True)


def main(out):
    os.makedirs(out, exist_ok=True)
    import torch

    print("torch", torch.__version__, flush=True)
    try:
        import transformers

        print("transformers", transformers.__version__, flush=True)
    except Exception as e:
        print("transformers missing", e)
    rows = []
    for w in WORKLOADS:
        for m in MODES:
            if w in ("hf_gpt2_reentrant", "plain", "save_on_cpu") and m not in ("off", "stacks_python", "alloc_python", "state_python"):
                continue
            p = subprocess.run([sys.executable, __file__, "child", w, m, out], capture_output=True, text=True, timeout=300)
            res = None
            for line in p.stdout.splitlines():
                if line.startswith("RESULT "):
                    res = json.loads(line[7:])
            if res is None:
                err = [l for l in p.stderr.splitlines() if l.strip()]
                res = {"workload": w, "mode": m, "ok": False, "rc": p.returncode, "error": err[-1] if err else ""}
            rows.append(res)
            print(json.dumps(res), flush=True)
    with open(os.path.join(out, "modes.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "child":
        child(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        main(sys.argv[1])
