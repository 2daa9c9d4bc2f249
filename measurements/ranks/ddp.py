"""A DDP job whose ranks differ, for checking multi-rank views (docs/user/ranks.md):

    python3 -m torch.distributed.run --nproc_per_node 3 measurements/ranks/ddp.py OUT_DIR [BACKEND]

Every rank trains Hugging Face GPT-2 (4 layers, AdamW) on the GPU
LOCAL_RANK % device_count() with batch 4 × (rank + 1), so rank 2 peaks
highest; with BACKEND gloo (the default) all ranks may share one GPU. Each
rank writes OUT_DIR/rankR.pickle.gz (memory history from the start) and
OUT_DIR/rankR.truth.json (its own max_memory_allocated/reserved).
"""

import gzip
import json
import os
import pickle
import sys

import torch
import torch.distributed as dist


def main():
    out = sys.argv[1]
    backend = sys.argv[2] if len(sys.argv) > 2 else "gloo"
    rank = int(os.environ["RANK"])
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.memory._record_memory_history(context="alloc", stacks="python", max_entries=2_000_000)
    dist.init_process_group(backend)
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=4)).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    n = 4 * (rank + 1)
    for _ in range(3):
        ids = torch.randint(0, 50257, (n, 256), device=dev)
        ddp(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    os.makedirs(out, exist_ok=True)
    with gzip.open(os.path.join(out, "rank%d.pickle.gz" % rank), "wb") as f:
        pickle.dump(snap, f)
    truth = {"rank": rank, "world_size": dist.get_world_size(), "batch": n, "backend": backend,
             "max_memory_allocated": torch.cuda.max_memory_allocated(),
             "max_memory_reserved": torch.cuda.max_memory_reserved(),
             "recorded_with": "torch %s, %s" % (torch.__version__, torch.cuda.get_device_name())}
    with open(os.path.join(out, "rank%d.truth.json" % rank), "w") as f:
        json.dump(truth, f, indent=1)
    print("RESULT rank %d batch %d max_memory_allocated %d" % (rank, n, truth["max_memory_allocated"]), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
