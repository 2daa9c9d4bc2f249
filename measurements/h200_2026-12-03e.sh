#!/usr/bin/env bash
# The fifth H200 call of 2026-12-03 (docs/user/fit.md "Reach"): EfficientNet-B0
# snapshots where fit's reserved is off from samples at 8 and 16: fp32 at 128
# (+7.0%), fp16 + GradScaler at 256 (-6.2%), and fp16 at 128 beside them.
set -u
W=$(mktemp -d)
python3 measurements/fit/train.py --model efficientnet --dtype fp32 --steps 3 --batch-size 128 --snapshot $W/effnet_fp32_b128.pickle > $W/fp32_128.txt 2>&1 &
python3 measurements/fit/train.py --model efficientnet --steps 3 --batch-size 256 --snapshot $W/efficientnet_b256.pickle > $W/fp16_256.txt 2>&1 &
python3 measurements/fit/train.py --model efficientnet --steps 3 --batch-size 128 --snapshot $W/efficientnet_b128.pickle > $W/fp16_128.txt 2>&1 &
wait
gzip -9 $W/*.pickle; tar czf $OUT/d.tgz -C $W .
