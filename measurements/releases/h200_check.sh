#!/usr/bin/env bash
# On the GPU machine (torch 2.11, H200), from the repository root with the
# release binary at $BIN: fit --batches records two real training runs with
# the hook that now takes torch.cuda.memory._snapshot() itself and stores
# torch.__version__; each recording must replay exactly under the release it
# names. Prints one line per recording and the fit's prediction.
set -uo pipefail
BIN=${BIN:-.gpu/gpumem-top}
d=$(mktemp -d)
cat > "$d/train.py" <<'PY'
import sys, torch
b = int(sys.argv[sys.argv.index("--batch-size") + 1])
m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
o = torch.optim.AdamW(m.parameters())
for step in range(10):
    x = torch.randn(b * 64, 1024, device="cuda")
    m(x).square().mean().backward()
    o.step()
    o.zero_grad(set_to_none=True)
PY
"$BIN" fit --batches 2,4 --steps 3 --batch 8 --json --record-dir "$d/rec" -- python3 "$d/train.py" --batch-size '{batch}' > "$d/fit.json"
echo "fit exit $?"
python3 - "$d" "$BIN" <<'PY'
import json, subprocess, sys
d, bin_ = sys.argv[1], sys.argv[2]
f = json.load(open(d + "/fit.json"))
print("fit predictions:", json.dumps(f.get("predictions"))[:300])
for b in (2, 4):
    p = "%s/rec/batch%d.pickle" % (d, b)
    r = json.loads(subprocess.run([bin_, "replay", p, "--json"], capture_output=True, text=True).stdout)
    print("batch%d: fidelity %s, rules %s, why: %s; events %d, peak allocated %s" % (
        b, r["fidelity"], r["torch_release"]["rules"], r["torch_release"]["why"], r["events"],
        r["stats"]["allocated_bytes.all.peak"]))
PY
