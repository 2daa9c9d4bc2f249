#!/usr/bin/env bash
# How far from its samples a fit prediction stays right (docs/user/fit.md
# "Reach"): per model, samples at two small batches recorded through
# `gpumem-top fit --batches`, the real peaks at batches far beyond them, and
# the real largest batch under a 16 GiB per-process limit found by bisection
# over fresh processes (set_per_process_memory_fraction).
#
#   BIN=path/to/gpumem-top OUT=dir bash measurements/fit/reach.sh
#
# SPECS: "NAME LO HI [train.py flags];…" (LO fits under 16 GiB, HI does not;
# the flags default to --model NAME); each runs in parallel, writing
# OUT/NAME.log and its samples under OUT/NAME/.
set -uo pipefail
LIMIT=17179869184
BIN=${BIN:-gpumem-top}
OUT=${OUT:?set OUT}
TARGETS=${TARGETS:-64 128 256}
IFS=';' read -ra LIST <<< "${SPECS:-efficientnet 300 460;mobilenet 64 2048;densenet 16 1024}"
one() {
  local m=$1 lo=$2 hi=$3
  shift 3
  local flags=("$@")
  [ ${#flags[@]} -gt 0 ] || flags=(--model "$m")
  "$BIN" fit --batches 8,16 --record-dir "$OUT/$m" -- python3 measurements/fit/train.py "${flags[@]}" --steps 6 --batch-size '{batch}' > "$OUT/$m.fit.txt" 2>&1
  for b in $TARGETS; do python3 measurements/fit/train.py "${flags[@]}" --batch-size "$b" 2>/dev/null | grep '^peaks'; done
  for b in $lo $hi; do python3 measurements/fit/train.py "${flags[@]}" --batch-size "$b" --memory-limit $LIMIT 2>/dev/null | grep '^fits'; done
  while [ $((hi - lo)) -gt 1 ]; do
    local mid=$(( (lo + hi) / 2 ))
    local r
    r=$(python3 measurements/fit/train.py "${flags[@]}" --batch-size $mid --memory-limit $LIMIT 2>/dev/null | grep '^fits')
    echo "$r"
    case "$r" in "fits yes"*) lo=$mid ;; *) hi=$mid ;; esac
  done
  echo "largest $m $lo"
}
mkdir -p "$OUT"
for spec in "${LIST[@]}"; do
  set -- $spec
  one "$@" > "$OUT/$1.log" 2>&1 &
done
wait
cat "$OUT"/*.log
