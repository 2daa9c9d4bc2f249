"""Records snapshots of the kinds users bring, one fresh process each, with
the memory_stats() PyTorch reports at the end (the truth a replay must
reach): CUDA graphs (make_graphed_callables, graphs sharing a pool, a graph
deleted and its pool freed), torch.compile's CUDA-graph trees, MemPools
(several, destroyed), expandable segments under a graph, a wrapped ring
buffer around graph replays, and a snapshot without history.

    python3 measurements/snapshot_kinds/record_field.py OUT_DIR [SCENARIO ...]

writes OUT_DIR/<scenario>.pickle.gz and OUT_DIR/<scenario>.truth.json, and
OUT_DIR/log.txt. Then, here:

    for f in OUT_DIR/*.pickle.gz; do gpumem-top replay $f --json; done

and compare `stats` with the truth (measurements/snapshot_kinds/compare.py).
"""

import json
import os
import subprocess
import sys
import time

PRELUDE = r'''
import gzip, json, os, pickle, sys, torch
name, out, history, max_entries = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
torch.cuda.init()
if history:
    if max_entries:
        torch.cuda.memory._record_memory_history(stacks="python", max_entries=max_entries)
    else:
        torch.cuda.memory._record_memory_history(stacks="python")
dev = "cuda"
'''

EPILOGUE = r'''
torch.cuda.synchronize()
snap = torch.cuda.memory._snapshot()
with gzip.open(os.path.join(out, name + ".pickle.gz"), "wb") as f:
    pickle.dump(snap, f)
stats = {k: int(v) for k, v in torch.cuda.memory_stats().items()}
json.dump({
    "trace": name + ".pickle.gz",
    "recorded_with": "torch %s, %s" % (torch.__version__, torch.cuda.get_device_name()),
    "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
    "history": history, "max_entries": max_entries,
    "device_total_bytes": torch.cuda.get_device_properties(0).total_memory,
    "stats": stats,
}, open(os.path.join(out, name + ".truth.json"), "w"), indent=1)
print("ok", name, "events", sum(len(t) for t in snap.get("device_traces", [])), "segments", len(snap["segments"]))
'''

# Two graphs sharing one pool, replays, eager work between, one graph
# deleted and the cache emptied twice.
SHARED_POOL = r'''
a = torch.randn(2048, 2048, device=dev)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        b = (a @ a).relu()
torch.cuda.current_stream().wait_stream(s)
del b
g1 = torch.cuda.CUDAGraph()
with torch.cuda.graph(g1):
    o1 = (a @ a).relu()
g2 = torch.cuda.CUDAGraph()
with torch.cuda.graph(g2, pool=g1.pool()):
    o2 = (o1 @ a).sigmoid()
    t = torch.empty(3 << 20, device=dev)
    t2 = torch.empty(700, device=dev)
for _ in range(3):
    g1.replay()
    g2.replay()
eager = [torch.randn(1 << 20, device=dev) for _ in range(8)]
del g2, o2, t, t2
torch.cuda.empty_cache()
del eager[::2]
torch.cuda.empty_cache()
x = torch.randn(4 << 20, device=dev)
'''

SCENARIOS = {
    "graphed_mlp_train": (True, 0, "", r'''
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
g = torch.cuda.make_graphed_callables(model, (torch.randn(256, 1024, device=dev),))
for i in range(5):
    y = g(torch.randn(256, 1024, device=dev))
    loss = y.square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
'''),
    "shared_pool_graphs": (True, 0, "", SHARED_POOL),
    "graphs_expandable": (True, 0, "expandable_segments:True", SHARED_POOL),
    "history_less_graphs": (False, 0, "", SHARED_POOL),
    "mempools_destroyed": (True, 0, "", r'''
p1 = torch.cuda.MemPool()
p2 = torch.cuda.MemPool()
keep = []
with torch.cuda.use_mem_pool(p1):
    keep += [torch.empty(n, dtype=torch.uint8, device=dev) for n in (3 << 20, 5 << 20, 700, 12 << 20)]
x = torch.empty(6 << 20, dtype=torch.uint8, device=dev)
with torch.cuda.use_mem_pool(p2):
    y = [torch.empty(n, dtype=torch.uint8, device=dev) for n in (1000, 2 << 20, 9 << 20)]
del keep[1]
with torch.cuda.use_mem_pool(p1):
    keep.append(torch.empty(4 << 20, dtype=torch.uint8, device=dev))
z = torch.empty(1 << 20, dtype=torch.uint8, device=dev)
del keep, y
del p2
torch.cuda.empty_cache()
w = torch.empty(30 << 20, dtype=torch.uint8, device=dev)
'''),
    "compile_reduce_overhead_mlp": (True, 0, "", r'''
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 512)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
cm = torch.compile(model, mode="reduce-overhead")
for i in range(5):
    x = torch.randn(64, 512, device=dev)
    loss = cm(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
'''),
    "compile_reduce_overhead_infer_shapes": (True, 0, "", r'''
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).to(dev).eval()
cm = torch.compile(model, mode="reduce-overhead", dynamic=False)
with torch.no_grad():
    for bs in (8, 32, 8, 64, 32, 8):
        for _ in range(3):
            y = cm(torch.randn(bs, 256, device=dev))
'''),
    "wrapped_graph_loop": (True, 600, "", r'''
a = torch.randn(1024, 1024, device=dev)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    b = (a @ a).relu()
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    o = (a @ a).relu()
for i in range(200):
    g.replay()
    e = [torch.randn((i % 7 + 1) << 16, device=dev) for _ in range(3)]
    del e
'''),
}


def run(out, name, history, max_entries, conf, body):
    env = dict(os.environ)
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    else:
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    code = PRELUDE + body + EPILOGUE
    t = time.time()
    p = subprocess.run(
        [sys.executable, "-c", code, name, out, "1" if history else "0", str(max_entries)],
        env=env, capture_output=True, text=True, timeout=400,
    )
    tail = (p.stdout + p.stderr).strip().splitlines()[-12:]
    return "%s rc=%d %.1fs\n  %s" % (name, p.returncode, time.time() - t, "\n  ".join(tail))


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    names = sys.argv[2:] or list(SCENARIOS)
    with open(os.path.join(out, "log.txt"), "w") as log:
        for n in names:
            history, max_entries, conf, body = SCENARIOS[n]
            try:
                r = run(out, n, history, max_entries, conf, body)
            except Exception as e:  # one scenario's failure is reported, not fatal
                r = "%s failed: %r" % (n, e)
            print(r, flush=True)
            log.write(r + "\n")
            log.flush()


if __name__ == "__main__":
    main()
