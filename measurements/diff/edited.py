"""Two runs of one training script, edited between them, for checking that
`gpumem-top diff` matches call sites across an edit (docs/user/diff.md):

    python3 measurements/diff/edited.py OUT_DIR

writes WORK/train.py (version A), runs it, then rewrites the same path as
version B and runs that: B is A with 21 lines added near the top of the
training function (a docstring, logging, a seed note), which moves every
call site below them, and one real change, the last position's logits
kept alive each step (1.6 MB per step). Each run records memory history
from process start and writes OUT_DIR/edit_a.pickle.gz / edit_b.pickle.gz
and their truth files (memory_stats() at the end, and for B the lines
that moved: A's line -> B's line of each statement).
"""

import os
import subprocess
import sys

A = '''import gzip, json, pickle, sys, torch
from transformers import GPT2Config, GPT2LMHeadModel


def train(out, name):
    torch.cuda.init()
    torch.cuda.memory._record_memory_history(context="alloc", stacks="python", max_entries=2_000_000)
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=6)
    model = GPT2LMHeadModel(cfg).to("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    kept = []
    for _ in range(4):
        ids = torch.randint(0, cfg.vocab_size, (8, 256), device="cuda")
        out_ = model(input_ids=ids, labels=ids)
        out_.loss.backward()
#KEEP
        opt.step()
        opt.zero_grad(set_to_none=True)
        del out_
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    with gzip.open(out + "/" + name + ".pickle.gz", "wb") as f:
        pickle.dump(snap, f)
    s = torch.cuda.memory_stats()
    json.dump({"allocated_peak_bytes": s["allocated_bytes.all.peak"], "reserved_peak_bytes": s["reserved_bytes.all.peak"],
               "allocated_end_bytes": s["allocated_bytes.all.current"], "stats": {k: v for k, v in s.items() if isinstance(v, int)},
               "recorded_with": "torch %s, %s" % (torch.__version__, torch.cuda.get_device_name())},
              open(out + "/" + name + ".truth.json", "w"), indent=1)
    print("RESULT", name, s["allocated_bytes.all.peak"], s["allocated_bytes.all.current"])


train(sys.argv[1], sys.argv[2])
'''

ADDED = '''    """Train GPT-2 for four steps and snapshot its memory.

    Edited for the second run: this docstring, the logging below and the
    kept logits are new; nothing else changed.
    """
    import logging
    logging.basicConfig(level=logging.INFO)
    log = logging.getLogger("train")
    log.info("starting")
    # The seed is fixed so both runs draw the same ids.
    # (torch.manual_seed below.)
    #
    # Memory history is recorded from process start, so the replay of
    # either snapshot is exact.
    #
    # The model: GPT-2 with six layers, AdamW.
    #
    # Nothing above allocates on the GPU.
    #
    #
    #
'''


def version_b():
    lines = A.split("\n")
    at = lines.index("def train(out, name):") + 1
    b = lines[:at] + ADDED.rstrip("\n").split("\n") + lines[at:]
    return "\n".join(b).replace("#KEEP", "        kept.append(out_.logits[:, -1].detach().clone())")


if __name__ == "__main__":
    out = os.path.abspath(sys.argv[1])
    os.makedirs(out, exist_ok=True)
    work = os.path.join(out, "work")
    os.makedirs(work, exist_ok=True)
    script = os.path.join(work, "train.py")
    for name, text in [("edit_a", A.replace("#KEEP\n", "")), ("edit_b", version_b())]:
        with open(script, "w") as f:
            f.write(text)
        p = subprocess.run([sys.executable, script, out, name], capture_output=True, text=True)
        print(name, p.returncode, p.stdout.strip(), (p.stderr.strip().splitlines() or [""])[-1], flush=True)
