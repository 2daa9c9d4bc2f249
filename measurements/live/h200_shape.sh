#!/usr/bin/env bash
# #32 on the GPU machine (after tools/gpu-bundle.sh, with the dist build
# and the bare NVML loop copied into .gpu/): from the repository root,
#
#   bash measurements/live/h200_shape.sh
#
# 1. The live view in tmux beside GPT-2 training under `run`: the screen,
#    `S` (the snapshot opens over the live view in the one loop of
#    screens), `q` back to the live view, `q` twice to leave.
# 2. The monitor's cost beside training (measurements/live/monitor_cost.py, 60 s
#    per monitor): CPU and RSS against the bare NVML loop and nvitop in the
#    same run.
# 3. The GPU-only tests of the binaries in .gpu/tests.
set -uo pipefail
root=$PWD
OUT=${OUT:-$(mktemp -d)}
R=$OUT/shape; mkdir -p "$R"
W=$(mktemp -d)
BIN=$root/.gpu/gpumem-top
S=$root/measurements/live
exec > >(tee "$R/results.txt") 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if command -v tmux >/dev/null; then
  echo "== the live view in tmux: S opens the snapshot over it, q comes back"
  tmux new-session -d -s shape -x 160 -y 50 -c "$W" \
    "'$BIN' run --step-peaks -- python3 '$S/gpt2_steps.py' --steps 300 --varying --out F.json; echo EXIT \$?; sleep 60"
  sleep 25; tmux capture-pane -p -t shape > "$R/1-live.txt"
  tmux send-keys -t shape S; sleep 12; tmux capture-pane -p -t shape > "$R/2-snapshot.txt"
  tmux send-keys -t shape Right; sleep 1; tmux capture-pane -p -t shape > "$R/3-snapshot-step.txt"
  tmux send-keys -t shape q; sleep 3; tmux capture-pane -p -t shape > "$R/4-back.txt"
  tmux send-keys -t shape q; sleep 1; tmux capture-pane -p -t shape > "$R/5-asks.txt"
  tmux send-keys -t shape q; sleep 3; tmux capture-pane -p -t shape > "$R/6-left.txt"
  tmux kill-session -t shape
  ls "$W"
  for f in "$R"/[1-6]-*.txt; do echo "--- $(basename "$f")"; head -6 "$f"; tail -2 "$f"; done
else
  echo "== no tmux: the live view is not captured"
fi
export PYTHONPATH=$root/assets/python${PYTHONPATH:+:$PYTHONPATH}  # gpu_load.py publishes
echo "== the monitor's cost beside training (${SECONDS_EACH:-60} s each)"
python3 "$S/monitor_cost.py" "$root/.gpu/gpumem-top-dist" "${SECONDS_EACH:-60}" "$root/.gpu/nvml_loop" | tee "$R/monitor_cost.jsonl"
echo "== GPU-only tests"
bash .gpu/run.sh > "$R/tests.txt" 2>&1; echo "tests exit $?"
grep -E "^test result|FAILED|panicked|^=== " "$R/tests.txt"
tar czf "$OUT/shape.tgz" -C "$OUT" shape
