#!/usr/bin/env bash
# Speed and memory of `gpumem-top replay TRACE --json` against CPython merely
# unpickling the same file, alternating the two in one run on one machine.
#   bash measurements/replay_vs_python.sh [TRACE] [RUNS]
# Default TRACE: tests/fixtures/traces/gpt2_train.pickle.gz (14,327 events).
set -euo pipefail
cd "$(dirname "$0")/.."
trace=${1:-tests/fixtures/traces/gpt2_train.pickle.gz}
runs=${2:-7}
cargo build --release --quiet
bin=target/release/gpumem-top
ours=(); py=(); ours_kb=(); py_kb=()
# A pause before every run, both sides alike: Python frees ~370 MB on exit,
# and reclaiming it would otherwise slow whichever run comes next.
for _ in $(seq "$runs"); do
  # Wall time in milliseconds from the clock (time(1)'s 10 ms steps are
  # coarser than a small trace's replay); peak RSS from time(1).
  sleep 1
  t0=$(date +%s%N)
  o=$( { /usr/bin/time -f "%M" "$bin" replay "$trace" --json >/dev/null; } 2>&1 | tail -1)
  t1=$(date +%s%N)
  sleep 1
  p=$( { /usr/bin/time -f "%M" python3 -c "import gzip,pickle,sys; pickle.load(gzip.open(sys.argv[1]))" "$trace"; } 2>&1 | tail -1)
  t2=$(date +%s%N)
  ours+=("$(( (t1 - t0) / 1000000 ))"); ours_kb+=("$o"); py+=("$(( (t2 - t1 - 1000000000) / 1000000 ))"); py_kb+=("$p")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mo=$(median "${ours[@]}"); mp=$(median "${py[@]}")
echo "trace: $trace ($runs runs each, alternating)"
echo "gpumem-top replay --json: median $mo ms, peak RSS $(median "${ours_kb[@]}") KiB (all: ${ours[*]})"
echo "python3 pickle.load:      median $mp ms, peak RSS $(median "${py_kb[@]}") KiB (all: ${py[*]})"
echo "speedup: $(awk -v a="$mp" -v b="$mo" 'BEGIN {printf "%.2f", a/b}')x"
