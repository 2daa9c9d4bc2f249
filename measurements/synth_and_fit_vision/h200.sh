#!/usr/bin/env bash
# #31 items 6 and 7 on the GPU machine (from the repository root, with the
# release binary at $BIN, default .gpu/gpumem-top): real PyTorch peaks for
# synth's inference under AMP and Adam with accumulation (with snapshots),
# and fit's samples and real peaks for two vision models (Swin-T, ConvNeXt-T).
# Everything lands in $OUT/field4.tar.gz.
set -uo pipefail
BIN=${BIN:-.gpu/gpumem-top}
OUT=${OUT:-$(mktemp -d)}
W=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__)'
SNAP=1 python3 measurements/calibration/measure.py "$W/calib" bert_b64_s512_amp_inference bert_b32_s256_amp_inference \
  bert_b64_s512_inference gpt2_b4_s512_adam gpt2_b4_s512_adam_accum3 gpt2_b2_s1024_adam_accum3 gpt2_b8_s512_adamw_accum3
for m in swin_t convnext_t; do
  mkdir -p "$W/fit/$m"
  "$BIN" fit --batches 8,16 --record-dir "$W/fit/$m" --batch 64 --batch 128 --memory-limit 17179869184 --json \
    -- python3 measurements/fit/train.py --model "$m" --batch-size '{batch}' > "$W/fit/$m/predicted.json" 2> "$W/fit/$m/fit.log"
  echo "fit $m: rc $?"; head -c 600 "$W/fit/$m/predicted.json"; echo
  for b in 64 128; do
    python3 measurements/fit/train.py --model "$m" --batch-size $b 2>&1 | grep '^peaks' | tee -a "$W/fit/$m/real.txt"
  done
done
tar -czf "$OUT/field4.tar.gz" -C "$W" .
ls -la "$OUT"
