#!/usr/bin/env bash
# Two "containers" on one GPU: GPT-2 training as pid 1 of its own pid
# namespace (unshare --pid, as a pod's trainer is), twice, both publishing
# into one shared directory with the publisher imported in the script
# (no `run`), and gpumem-top recording from the host's namespace
# (docs/user/cluster.md, "Several containers, one directory"). From the
# repository root, as root, with $BIN (default target/release/gpumem-top):
#
#   bash measurements/live/pods.sh
#
# Prints the files in the directory, then per sample of the recording the
# publishers seen (pid here, allocated), then the same after one pod is
# killed: two processes under their host pids, then one and the other gone.
set -uo pipefail
root=$PWD
BIN=$(realpath "${BIN:-target/release/gpumem-top}")
W=$(mktemp -d)
D=$W/shared && mkdir -m 700 "$D"
R=${OUT:-$W}
exec > >(tee "$R/pods.txt") 2>&1
pod() {
  PYTHONPATH=$root/assets/python GPUMEM_TOP_DIR=$D unshare --pid --fork --kill-child --mount-proc \
    python3 -c "
import os, sys, time, torch, gpumem_top_publish as g
sys.argv = ['pod$1.py']
from transformers import GPT2Config, GPT2LMHeadModel
m = GPT2LMHeadModel(GPT2Config(n_layer=$1)).cuda()
opt = torch.optim.AdamW(m.parameters())
g.start(interval=0.2)
print('pod $1 trains as pid', os.getpid(), flush=True)
t = time.time()
while time.time() - t < 60:
    x = torch.randint(0, 50257, (4, 256), device='cuda')
    m(input_ids=x, labels=x).loss.backward(); opt.step(); opt.zero_grad()
" &
}
pod 2; A=$!
pod 6; B=$!
# Until both publish (a cold machine takes a while to import torch).
for i in $(seq 1 120); do [[ $(ls "$D" | grep -c '\.json$') -ge 2 ]] && break; sleep 1; done
sleep 2
echo "files:"; ls "$D"
GPUMEM_TOP_DIR=$D "$BIN" record --count 3 --interval 500 -o "$W/both.jsonl" >/dev/null 2>&1
python3 - "$W/both.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]).readlines()[1:]:
    s = json.loads(l)
    print("sample:", sorted((p["pid"], p["stats"].get("allocated_bytes.all.current")) for p in s["published"]))
PY
kill -9 $A; wait $A 2>/dev/null
sleep 2
GPUMEM_TOP_DIR=$D "$BIN" record --count 2 --interval 500 -o "$W/one.jsonl" >/dev/null 2>&1
python3 - "$W/one.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]).readlines()[1:]:
    s = json.loads(l)
    print("after one pod was killed:", sorted((p["pid"], p["stats"].get("allocated_bytes.all.current")) for p in s["published"]), "gone:", s.get("gone"))
PY
kill -9 $B 2>/dev/null; wait
