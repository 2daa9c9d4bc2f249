#!/usr/bin/env bash
# #31 item 6: the largest batch that really runs under a 16 GiB
# per-process limit (set_per_process_memory_fraction), for the two vision
# models, found by bisection over real runs of measurements/fit/train.py.
set -uo pipefail
LIMIT=17179869184
# SPECS: "MODEL LO HI;…" (LO fits, HI does not).
IFS=';' read -ra LIST <<< "${SPECS:-swin_t 150 300;convnext_t 150 340}"
for spec in "${LIST[@]}"; do
  set -- $spec; m=$1; lo=$2; hi=$3   # lo fits, hi does not (checked first)
  for b in $lo $hi; do python3 measurements/fit/train.py --model $m --batch-size $b --memory-limit $LIMIT 2>/dev/null | grep '^fits'; done
  while [ $((hi - lo)) -gt 1 ]; do
    mid=$(( (lo + hi) / 2 ))
    r=$(python3 measurements/fit/train.py --model $m --batch-size $mid --memory-limit $LIMIT 2>/dev/null | grep '^fits')
    echo "$r"
    case "$r" in "fits yes"*) lo=$mid ;; *) hi=$mid ;; esac
  done
  echo "largest $m $lo"
done
