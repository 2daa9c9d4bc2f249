"""A training loop recorded with memory history from process start, for
tools/big-snapshot.py: many iterations, each marked by Optimizer.step.

    python3 record_loop.py OUT.pickle --model mlp|resnet18 --steps N
        [--batch B] [--max-entries M]

mlp: a small MLP (a small fixture, tests/fixtures/traces/small_loop);
resnet18: ResNet-18 on 64x64 images, with python stacks, for a real
ten-million-event snapshot (max_entries 10,000,000 and enough steps).
"""
import argparse
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--model", choices=["mlp", "resnet18"], default="mlp")
ap.add_argument("--steps", type=int, default=12)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--max-entries", type=int, default=1_000_000)
ap.add_argument("--events", type=int, default=0, help="run until about this many events (counted after 20 steps)")
ap.add_argument("--budget", type=float, default=330.0, help="seconds of training at most, with --events")
args = ap.parse_args()

torch.cuda.memory._record_memory_history(max_entries=args.max_entries, context="alloc", stacks="python")
if args.model == "mlp":
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)
    ).cuda()
    make = lambda: (torch.randn(args.batch, 512, device="cuda"), torch.randint(0, 10, (args.batch,), device="cuda"))
else:
    import torchvision

    model = torchvision.models.resnet18(num_classes=100).cuda()
    make = lambda: (
        torch.randn(args.batch, 3, 64, 64, device="cuda"),
        torch.randint(0, 100, (args.batch,), device="cuda"),
    )
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
def step():
    x, y = make()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


t0 = time.time()
steps = args.steps
if args.events:
    # Events per step from a count after 20 steps, then as many steps as
    # the target needs, within the time budget.
    for _ in range(20):
        step()
    before = len(torch.cuda.memory._snapshot()["device_traces"][0])
    torch.cuda.synchronize()
    t_steady = time.time()
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    # Steady steps only: the first ones pay for cuDNN's autotuning.
    per_s = (time.time() - t_steady) / 10
    per = (len(torch.cuda.memory._snapshot()["device_traces"][0]) - before) / 10
    steps = min(int((args.events - before) / per) + 1, int(args.budget / per_s)) - 10
    print(f"{per:.0f} events and {per_s * 1000:.1f} ms a step: {steps} more steps")
for _ in range(steps):
    step()
torch.cuda.synchronize()
t1 = time.time()
torch.cuda.memory._dump_snapshot(args.out)
t2 = time.time()
s = torch.cuda.memory_stats()
print(
    f"{args.out}: {args.model} {steps} steps in {t1 - t0:.1f} s, dumped in {t2 - t1:.1f} s; "
    f"peak allocated {s['allocated_bytes.all.peak']} reserved {s['reserved_bytes.all.peak']}"
)
