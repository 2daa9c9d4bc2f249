#!/usr/bin/env bash
# #31 item 6: the real runs at batch 64 of the two vision models fit
# over-predicted in reserved, with their memory history, to compare with the
# predicted requests (measurements/synth_and_fit_vision/h200.sh recorded the samples).
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
W=$(mktemp -d)
for m in swin_t convnext_t; do
  python3 measurements/fit/train.py --model "$m" --batch-size 64 --snapshot "$W/${m}_b64.pickle" 2>&1 | grep '^peaks'
done
tar -czf "$OUT/vision64.tar.gz" -C "$W" .
ls -la "$OUT"
