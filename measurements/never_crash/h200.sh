#!/usr/bin/env bash
# On the GPU machine (after tools/gpu-bundle.sh here, carrying .gpu):
#
#   bash measurements/never_crash/h200.sh
#
# Checkpointed Hugging Face training recorded by `run --history` and
# `fit --batches` (PyTorch 2.11 crashes it when history gathers stacks at
# frees: pytorch #179536), first with the crashing setting forced, then
# with the one gpumem-top chooses; `fit`'s predictions against the real
# peaks at larger batches; and `run` beside a script that resets PyTorch's
# peak counters every step (the true peaks must be shown). Results in
# $OUT/never_crash.tgz.
set -u
BIN=$PWD/.gpu/gpumem-top
T=$PWD/measurements/fit/train.py
O=${OUT:-/tmp/out}
W=$O/never_crash
mkdir -p "$W"
export PYTHONUNBUFFERED=1
summary() {
  "$BIN" replay "$1" --json | python3 -c '
import json, sys
j = json.load(sys.stdin)
for p in j["processes"]:
    h = p.get("history") or {}
    print("  pid", p["pid"], p["command"], "samples", p["samples"], "peak allocated", p["peak_allocated_bytes"],
          "peak reserved", p["peak_reserved_bytes"], "steps", len(p["steps"]), "history", h.get("context"), "|", h.get("note"))
    for s in p["steps"]:
        print("   step", s["step"], "peak allocated", s["allocated_peak_bytes"], "peak reserved", s["reserved_peak_bytes"])
last = [l for l in open(sys.argv[1]).read().splitlines()[1:]]
pubs = [json.loads(l) for l in last]
pubs = [l for l in pubs if l["publishers"]]
if pubs:
    p = pubs[-1]["publishers"][0]
    print("  last sample with the process: bars peak allocated", p["allocated_peak_bytes"], "peak reserved", p["reserved_peak_bytes"],
          "alerts", [a["message"] for a in pubs[-1]["alerts"]])
' "$1"
}
for m in gpt2 bert; do
  echo "=== $m, checkpointed: run --history, stacks at frees forced (GPUMEM_TOP_HISTORY_CONTEXT=all)"
  GPUMEM_TOP_HISTORY_CONTEXT=all "$BIN" run --history 300000 -o "$W/${m}_forced.jsonl" -- python3 "$T" --model $m --checkpoint --batch-size 4 --steps 3 >"$W/${m}_forced.log" 2>&1
  echo "exit $?"; grep -E "SystemError|peaks|gpumem" "$W/${m}_forced.log" | tail -4
  echo "=== $m, checkpointed: run --history (gpumem-top's choice)"
  "$BIN" run --history 300000 -o "$W/${m}_run.jsonl" -- python3 "$T" --model $m --checkpoint --batch-size 4 --steps 3 >"$W/${m}_run.log" 2>&1
  echo "exit $?"; grep -E "SystemError|peaks|gpumem" "$W/${m}_run.log" | tail -4
  summary "$W/${m}_run.jsonl"
  echo "=== $m, checkpointed: fit --batches 2,4"
  "$BIN" fit --batches 2,4 --batch 8 --batch 16 --memory-limit 17179869184 --record-dir "$W/${m}_fit" -- python3 "$T" --model $m --checkpoint --batch-size '{batch}' 2>"$W/${m}_fit.err" | tee "$W/${m}_fit.txt"
  echo "exit ${PIPESTATUS[0]}"; grep -E "SystemError|gpumem-top" "$W/${m}_fit.err" | tail -5
  for b in 8 16; do python3 "$T" --model $m --checkpoint --batch-size $b 2>&1 | grep "^peaks"; done
done
echo "=== true peaks: run (step peaks by default) beside a script that resets its peak counters every step"
"$BIN" run -o "$W/reset.jsonl" -- python3 "$T" --model gpt2 --batch-size 8 --steps 6 --reset-peaks 2>&1 | grep -E "^step|gpumem"
summary "$W/reset.jsonl"
echo "=== the same with --no-step-peaks"
"$BIN" run --no-step-peaks -o "$W/reset_nosp.jsonl" -- python3 "$T" --model gpt2 --batch-size 8 --steps 6 --reset-peaks 2>&1 | grep -E "^step|gpumem"
summary "$W/reset_nosp.jsonl"
for f in "$W"/*_fit/*.pickle; do gzip -9 "$f"; done
tar czf "$O/never_crash.tgz" -C "$O" never_crash
ls -la "$O"
