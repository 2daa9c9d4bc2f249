"""A job to watch live (docs/user/ranks.md): every rank trains Hugging Face GPT-2
(4 layers, AdamW) with batch 4 x (rank + 1), so the last rank peaks
highest, under torchrun and `gpumem-top run`:

    gpumem-top run -o rec.jsonl -- python3 -m torch.distributed.run \\
        --nproc_per_node 3 measurements/ranks/live_job.py OUT_DIR [ddp|fsdp2] [gloo|nccl] [STEPS]

With gloo every rank may share GPU 0 (CUDA_VISIBLE_DEVICES=0); with nccl
rank r uses GPU LOCAL_RANK. FSDP2 shards the model with fully_shard. At
step 10, rank 0 (in a thread, training goes on) runs `gpumem-top snapshot
ITS_PID --job -o OUT_DIR/job` and `gpumem-top --json` (what NVML and the
publishers say then: memory outside the allocator) when $GPUMEM_TOP_BIN
is set. Each rank writes OUT_DIR/rankR.truth.json: its own
max_memory_allocated/reserved and what NVML-visible memory torch reports.
"""

import json
import os
import subprocess
import sys
import threading
import time

import torch
import torch.distributed as dist


def side_tasks(out):
    exe = os.environ.get("GPUMEM_TOP_BIN")
    if not exe:
        return
    d = os.environ.get("GPUMEM_TOP_DIR", "")
    with open(os.path.join(out, "job_snapshot.txt"), "w") as f:
        r = subprocess.run([exe, "snapshot", str(os.getpid()), "--job", "-o", os.path.join(out, "job"),
                            "--publish-dir", d, "--timeout", "120"], capture_output=True, text=True)
        f.write("rc %d\n%s%s" % (r.returncode, r.stdout, r.stderr))
    with open(os.path.join(out, "live.json"), "w") as f:
        r = subprocess.run([exe, "--json", "--publish-dir", d], capture_output=True, text=True)
        f.write(r.stdout or r.stderr)


def main():
    out = sys.argv[1]
    mode = sys.argv[2] if len(sys.argv) > 2 else "ddp"
    backend = sys.argv[3] if len(sys.argv) > 3 else "gloo"
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 30
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group(backend, device_id=dev if backend == "nccl" else None)
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=4)).to(dev)
    if mode == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in model.transformer.h:
            fully_shard(block)
        fully_shard(model)
        net = model
    else:
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    n = 4 * (rank + 1)
    side = None
    t0 = time.time()
    for step in range(steps):
        ids = torch.randint(0, 50257, (n, 256), device=dev)
        net(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step == 10 and rank == 0:
            side = threading.Thread(target=side_tasks, args=(out,))
            side.start()
        time.sleep(0.1)  # a few samples per step for the monitor
    if side is not None:
        side.join()
    truth = {"rank": rank, "world_size": dist.get_world_size(), "batch": n, "mode": mode, "backend": backend,
             "pid": os.getpid(), "steps": steps, "seconds": time.time() - t0,
             "max_memory_allocated": torch.cuda.max_memory_allocated(),
             "max_memory_reserved": torch.cuda.max_memory_reserved(),
             "device": torch.cuda.current_device(),
             "recorded_with": "torch %s, %s" % (torch.__version__, torch.cuda.get_device_name())}
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "rank%d.truth.json" % rank), "w") as f:
        json.dump(truth, f, indent=1)
    print("RESULT %s %s rank %d batch %d max_memory_allocated %d max_memory_reserved %d" % (
        mode, backend, rank, n, truth["max_memory_allocated"], truth["max_memory_reserved"]), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
