"""A real transformers.Trainer run with gpumem-top's callback and no
`gpumem-top run` (docs/user/live.md, "The Python package"), on the GPU:

    PYTHONPATH=python python3 measurements/package/hf_trainer.py --out steps.json
        [--steps 40] [--oom-at K] [--callback history|history_nostacks|publish|none]

GPT-2 (124M, random weights, no download), batch 8 x 512, AdamW, the
Trainer's own loop. A second callback reads max_memory_allocated() and
max_memory_reserved() at each step's end (never resetting: with step peaks
the publisher keeps Python's view of them as if it did not, so these are the
running maxima) and the step's wall time (--callback: with memory history
of 100,000 entries and Python stacks, the same without stacks, as the
callback comes (publishing alone), or none); written to --out as
{"pid", "rows": [{"step", "max_allocated", "max_reserved", "seconds"}]}
for measurements/live/compare_steps.py --running-max. --oom-at K asks for 1 TiB
at step K's start: the callback's OOM snapshot must then replay exactly.
"""

import argparse
import json
import os
import tempfile
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--oom-at", type=int, default=-1)
ap.add_argument("--callback", default="history", choices=["history", "history_nostacks", "publish", "none"])
a = ap.parse_args()

torch.manual_seed(0)


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return a.steps * 8

    def __getitem__(self, i):
        ids = torch.randint(0, 50257, (512,))
        return {"input_ids": ids, "labels": ids}


rows = []


class Reader(TrainerCallback):
    def on_step_begin(self, args, state, control, **kw):
        torch.cuda.synchronize()
        self.t0 = time.perf_counter()
        if state.global_step + 1 == a.oom_at:
            torch.empty(1 << 40, dtype=torch.uint8, device="cuda")

    def on_step_end(self, args, state, control, **kw):
        torch.cuda.synchronize()
        rows.append({
            "step": state.global_step,
            "max_allocated": torch.cuda.max_memory_allocated(),
            "max_reserved": torch.cuda.max_memory_reserved(),
            "seconds": time.perf_counter() - self.t0,
        })


callbacks = [Reader()]
if a.callback != "none":
    from gpumem_top.integrations.huggingface import GpumemTopCallback

    callbacks.insert(0, GpumemTopCallback(history=0 if a.callback == "publish" else 100_000,
                                          history_stacks=a.callback == "history",
                                          oom_snapshot=os.path.join(os.path.dirname(os.path.abspath(a.out)),
                                                                    "oom-{pid}-{n}.pickle")))
model = GPT2LMHeadModel(GPT2Config())
args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=8, max_steps=a.steps,
                         logging_steps=10_000, save_strategy="no", report_to=[], disable_tqdm=True,
                         dataloader_num_workers=0, learning_rate=1e-4)
trainer = Trainer(model=model, args=args, train_dataset=Data(), callbacks=callbacks)
try:
    trainer.train()
    status = "done"
except torch.OutOfMemoryError as e:
    status = "oom: " + str(e).splitlines()[0][:100]
with open(a.out, "w") as f:
    json.dump({"pid": os.getpid(), "status": status, "rows": rows}, f)
print("RESULT", a.callback, status, len(rows), "steps",
      "median step %.4f s" % sorted(r["seconds"] for r in rows)[len(rows) // 2] if rows else "", flush=True)
