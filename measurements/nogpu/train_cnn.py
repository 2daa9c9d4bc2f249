"""A torchvision model's training loop on random images: the ground truth
`fit --no-gpu` is measured against on the H200 (docs/user/fit.md "Without
a GPU")."""
import argparse

import torch

p = argparse.ArgumentParser()
p.add_argument("--model", default="resnet50")
p.add_argument("--batch-size", type=int, default=8)
p.add_argument("--size", type=int, default=224)
p.add_argument("--amp", action="store_true", help="bf16 autocast")
p.add_argument("--optim", default="sgd", choices=["sgd", "adamw"])
p.add_argument("--steps", type=int, default=3)
p.add_argument("--limit-gib", type=float, default=0, help="set_per_process_memory_fraction to this many GiB")
a = p.parse_args()

import torchvision  # noqa: E402

torch.manual_seed(0)
if a.limit_gib:
    torch.cuda.set_per_process_memory_fraction(a.limit_gib * 2**30 / torch.cuda.get_device_properties(0).total_memory)
m = getattr(torchvision.models, a.model)(num_classes=1000).to("cuda").train()
if a.optim == "sgd":
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
else:
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
crit = torch.nn.CrossEntropyLoss()
for step in range(a.steps):
    x = torch.randn(a.batch_size, 3, a.size, a.size).to("cuda", non_blocking=True)
    y = torch.randint(0, 1000, (a.batch_size,)).to("cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.amp):
        loss = crit(m(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    print("step", step, float(loss.item()), torch.cuda.max_memory_allocated(), flush=True)
