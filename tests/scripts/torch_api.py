"""Checks, against a real PyTorch (PyPI's build runs on a CPU), every torch API gpumem-top's
Python side uses: the publisher, `run`'s hook and `fit --batches`' hook. Prints one line per
check and "ok" at the end; exits 1 at the first that fails. Run with assets/python on PYTHONPATH."""
import inspect
import sys

import torch
import gpumem_top_publish as g


def check(what, cond):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        sys.exit(1)


print("torch", torch.__version__)
check("torch_version parses", g.torch_version(torch.__version__) is not None)
kw, note = g.history_settings(torch, environ={})
check("history keeps stacks at allocations only (pytorch #179536 not known fixed)", kw.get("context") == "alloc")
params = inspect.signature(torch.cuda.memory._record_memory_history).parameters
for p in ("enabled", "context", "stacks", "max_entries"):
    check("_record_memory_history takes %s" % p, p in params)
for path in (
    "cuda.memory._snapshot",
    "cuda.memory._dump_snapshot",
    "cuda.memory_snapshot",
    "cuda.memory_stats",
    "cuda.reset_peak_memory_stats",
    "cuda.max_memory_allocated",
    "cuda.max_memory_reserved",
    "cuda.is_available",
    "cuda.is_initialized",
    "cuda.synchronize",
    "cuda.current_device",
    "cuda._lazy_call",
):
    obj = torch
    for part in path.split("."):
        obj = getattr(obj, part, None)
    check("torch.%s" % path, callable(obj))
check("torch.cuda.memory_snapshot takes include_traces",
      "include_traces" in inspect.signature(torch.cuda.memory_snapshot).parameters
      or any(p.kind == p.VAR_KEYWORD for p in inspect.signature(torch.cuda.memory_snapshot).parameters.values()))
check("the publisher finds the stats and peak-reset functions", len(g._stat_functions(torch._C)) > 0)
import importlib

opt = importlib.import_module("torch.optim.optimizer")
check("torch.optim.optimizer.register_optimizer_step_post_hook", callable(getattr(opt, "register_optimizer_step_post_hook", None)))
# The step hook on a real optimizer step, CUDA absent: training goes on.
seen = []
h = opt.register_optimizer_step_post_hook(lambda o, a, k: seen.append(type(o).__name__))
m = torch.nn.Linear(4, 4)
o = torch.optim.AdamW(m.parameters())
m(torch.randn(2, 4)).sum().backward()
o.step()
h.remove()
check("an optimizer step runs the post hook", seen == ["AdamW"])
print("ok")
