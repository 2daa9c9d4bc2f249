#!/usr/bin/env bash
# On the GPU machine: the settings `tune` ranked first or second that the
# first menu (workloads.py --menu) did not run, each run for real.
#   bash measurements/tune/validate.sh   -> $OUT/validate.jsonl
set -u
W=$PWD/measurements/tune/workloads.py
O=${OUT:-/tmp/out}; mkdir -p "$O/v"
run() { PYTORCH_CUDA_ALLOC_CONF="$2" python3 "$W" "$1" "$O/v" 2>/dev/null | grep '^RESULT' | cut -c8- ; }
{
  run mlp_limit "garbage_collection_threshold:0.5" &
  run mlp_limit "garbage_collection_threshold:0.7" &
  run gpt2_varying "roundup_power2_divisions:[256:4,1024:8,>:16]" &
  run vit_infer "expandable_segments:True,roundup_power2_divisions:4" &
  wait
} > "$O/validate.jsonl"
cat "$O/validate.jsonl"
