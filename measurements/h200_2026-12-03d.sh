#!/usr/bin/env bash
# The fourth H200 call of 2026-12-03 (docs/user/fit.md "Without a GPU"):
# GPT-2 bf16 (seq 512) at the batches an earlier bisection left untried
# (20 fits, 24 does not), each in its own process under its own 16 GiB
# per-process limit, in parallel.
set -u
for b in 20 21 22 23 24; do
  ( python3 measurements/nogpu/train_lm.py --model gpt2 --seq 512 --amp --batch-size $b --limit-gib 16 > $OUT/log_$b.txt 2>&1; echo "batch $b: rc $?" >> $OUT/gpt2_bf16.txt ) &
done
wait
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)" >> $OUT/gpt2_bf16.txt
tail -n 2 $OUT/log_2*.txt > $OUT/tails.txt; rm -f $OUT/log_*.txt
