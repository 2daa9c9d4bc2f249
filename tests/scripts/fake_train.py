"""A training loop over the stand-in torch (tests/fake_torch) for
`gpumem-top run` tests: varying transient peaks per step, reads of
max_memory_allocated() as a user's script makes them, a fork, and a
snapshot asked of itself through `gpumem-top snapshot`."""

import json
import os
import pickle
import subprocess
import sys
import time

import torch
from torch.optim import optimizer as _unused  # noqa: F401  (as a script imports it)
import torch.optim.optimizer as opt

MIB = 1 << 20
out = {"before_init": "gpumem_top_publish" in sys.modules}
torch.cuda.init()
time.sleep(0.2)
out["after_init"] = "gpumem_top_publish" in sys.modules
# Before the first optimizer step the publisher closes a window each
# sample; this transient peak must still count in step 1's own peak.
torch._C._alloc(150 * MIB)
torch._C._free(150 * MIB)
time.sleep(0.15)
reads = []
for step, mb in enumerate([100, 300, 200, 400]):
    torch._C._alloc(mb * MIB)
    torch._C._free(mb * MIB)
    torch._C._alloc(MIB)  # one MiB kept per step
    opt.step()
    reads.append(torch.cuda.max_memory_allocated())
    time.sleep(0.12)
out["reads"] = reads
out["reserved_read"] = torch.cuda.max_memory_reserved()
torch.cuda.reset_peak_memory_stats()
out["after_reset"] = torch.cuda.max_memory_allocated()
# A forked child that exits normally leaves the parent's file alone.
pid = os.fork()
if pid == 0:
    sys.exit(0)
os.waitpid(pid, 0)
time.sleep(0.15)
d = os.environ["GPUMEM_TOP_DIR"]
out["files"] = sorted(f for f in os.listdir(d) if not f.startswith("."))
snap = os.path.join(os.environ["SNAP_DIR"], "self.pickle")
r = subprocess.run(
    [os.environ["GPUMEM_TOP_BIN"], "snapshot", str(os.getpid()), "-o", snap, "--publish-dir", d],
    capture_output=True,
    text=True,
)
out["snapshot_rc"] = r.returncode
out["snapshot_out"] = r.stdout.strip()
with open(snap, "rb") as f:
    out["snapshot"] = pickle.load(f)
out["full_snapshots"] = torch._C._full_snapshots
print(json.dumps(out))
