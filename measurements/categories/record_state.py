"""A snapshot without history (state only, block stacks), with ground truth
for its categories (docs/user/categories.md "Evidence"):

    python3 measurements/categories/record_state.py OUT_DIR

trains Hugging Face GPT-2 (6 layers, AdamW, batch 8 × 512) with
`_record_memory_history(enabled="state", context="state", stacks="python")`
(blocks keep the stack that made them; no trace) and takes the snapshot at
the third step's forward end, activations alive. Writes
OUT_DIR/gpt2_state_only.pickle.gz and .notes.jsonl.gz: every parameter,
optimizer state tensor and, for the current step only, each batch tensor
and saved tensor, as {"ptr", "bytes", "cat"}.
"""

import gzip
import json
import os
import pickle
import sys


def main(out):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.cuda.init()
    torch.cuda.memory._record_memory_history(enabled="state", context="state", stacks="python")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=6)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    kept, step_notes = [], []

    def note(where, t, cat):
        if isinstance(t, torch.Tensor) and t.is_cuda:
            s = t.untyped_storage()
            where.append({"ptr": s.data_ptr(), "bytes": s.nbytes(), "cat": cat})

    for p in model.parameters():
        note(kept, p, "parameter")
    for step in range(3):
        step_notes = []
        ids = torch.randint(0, 50257, (8, 512), device="cuda")
        note(step_notes, ids, "input")
        with torch.autograd.graph.saved_tensors_hooks(lambda t: (note(step_notes, t, "activation"), t)[1], lambda t: t):
            loss = model(input_ids=ids, labels=ids).loss
        if step == 2:
            torch.cuda.synchronize()
            snap = torch.cuda.memory._snapshot()
            break
        loss.backward()
        opt.step()
        if step == 0:
            for st in opt.state.values():
                for v in st.values():
                    note(kept, v, "optimizer_state")
        opt.zero_grad(set_to_none=True)
    os.makedirs(out, exist_ok=True)
    with gzip.open(os.path.join(out, "gpt2_state_only.pickle.gz"), "wb") as f:
        pickle.dump(snap, f)
    with gzip.open(os.path.join(out, "gpt2_state_only.notes.jsonl.gz"), "wt") as f:
        for n in kept + step_notes:
            f.write(json.dumps(n) + "\n")
    blocks = sum(1 for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
    print("RESULT state-only snapshot: %d live blocks, %d traces entries, allocated %d" % (
        blocks, sum(len(t) for t in snap["device_traces"]), torch.cuda.memory_allocated()), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
