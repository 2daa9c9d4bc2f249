"""Live categories against the training script's own count
(docs/user/categories.md "Live"):

    gpumem-top run -o rec.jsonl -- python3 measurements/categories/live_check.py OUT.json
    python3 measurements/categories/live_check.py --compare OUT.json rec.jsonl

The first trains Hugging Face GPT-2 (6 layers, AdamW, bf16 autocast) for 40
steps and writes, per step, the bytes of its parameters, their gradients
and the optimizer's state right after optimizer.step() (each storage once,
rounded up to 512 as the allocator rounds). The second prints every step
the recording published categories for, with both counts, and exits 1 if
any differs.
"""

import json
import sys


def count(torch, opt):
    seen, out = set(), [0, 0, 0]

    def add(k, t):
        if isinstance(t, torch.Tensor) and t.is_cuda:
            s = t.untyped_storage()
            if s.data_ptr() not in seen:
                seen.add(s.data_ptr())
                out[k] += (s.nbytes() + 511) // 512 * 512

    for g in opt.param_groups:
        for p in g["params"]:
            add(0, p)
            add(1, p.grad)
    for st in opt.state.values():
        for v in st.values():
            add(2, v)
    return out


def train(path):
    import time

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=6)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rows = []
    for step in range(1, 41):
        ids = torch.randint(0, 50257, (8, 512), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        p, g, o = count(torch, opt)
        rows.append({"step": step, "parameter": p, "gradient": g, "optimizer_state": o,
                     "allocated": torch.cuda.memory_allocated()})
        opt.zero_grad(set_to_none=True)
        time.sleep(0.05)
    with open(path, "w") as f:
        json.dump(rows, f)


def compare(own_path, rec_path):
    own = {r["step"]: r for r in json.load(open(own_path))}
    seen, bad = {}, 0
    for line in open(rec_path):
        d = json.loads(line)
        for p in d.get("published") or []:
            c = p.get("categories")
            if c:
                seen[c["step"]] = c
    for step, c in sorted(seen.items()):
        o = own[step]
        same = all(c[k] == o[k] for k in ("parameter", "gradient", "optimizer_state"))
        bad += not same
        print("step %d published params %d grads %d optim %d (allocated %d) / script %d %d %d (allocated %d) %s" % (
            step, c["parameter"], c["gradient"], c["optimizer_state"], c["allocated"],
            o["parameter"], o["gradient"], o["optimizer_state"], o["allocated"], "same" if same else "DIFFERENT"))
    print("%d steps published categories, %d differ" % (len(seen), bad))
    sys.exit(1 if bad or not seen else 0)


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        train(sys.argv[1])
