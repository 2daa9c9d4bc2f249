#!/usr/bin/env bash
# The eighth H200 call of 2026-12-03 (docs/measurements/benchmarks.md, "Ten
# million events"; docs/design/trace-decoding.md): two real 10M-event
# recordings (ResNet-18 at batch 32 and 48), then `replay --json` of the
# first by three builds alternating, twice, on all 16 cores and pinned to 8:
# .gpu/gpumem-top (the share buffers kept, 715a36d), .gpu/gt-par (the
# decoding threads as they first landed, 5fe06ab), .gpu/gt-before (no
# decoding threads, d14a1d0); JSON compared; then measure.sh with the first.
set -u
BIN=$PWD/.gpu/gpumem-top; PAR=$PWD/.gpu/gt-par; OLD=$PWD/.gpu/gt-before
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; python3 -c "import torch; print(torch.__version__)"; } > $OUT/smi.txt 2>&1
( python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec_a.txt 2>&1; el a >> $OUT/rec_a.txt ) &
( python3 measurements/ten_million/record_loop.py $W/b.pickle --model resnet18 --batch 48 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec_b.txt 2>&1; el b >> $OUT/rec_b.txt ) &
wait
ls -la $W > $OUT/files.txt
T="%e s user %U sys %S rss %M KB minflt %R"
for round in 1 2; do
  for c in 0-15 0-7; do
    for b in kept:$BIN par:$PAR before:$OLD; do
      sleep 1; /usr/bin/time -f "${b%%:*} cores=$c $T" taskset -c $c ${b#*:} replay $W/a.pickle --json > $W/${b%%:*}_${c}_$round.json 2>> $OUT/threads.txt
    done
  done
done
python3 - $W >> $OUT/threads.txt 2>&1 <<'PY'
import json, sys, glob, os
w = sys.argv[1]
def load(p):
    d = json.load(open(p)); d.pop("elapsed_ms", None); return d
ref = load(os.path.join(w, "before_0-15_1.json"))
for p in sorted(glob.glob(os.path.join(w, "*.json"))):
    print(os.path.basename(p), "same" if load(p) == ref else "DIFFERS")
print("events", ref.get("events"))
PY
el threads >> $OUT/threads.txt
timeout 250 bash measurements/ten_million/measure.sh $BIN $W/a.pickle $W/b.pickle > $OUT/measure10m.txt 2>&1
el all >> $OUT/measure10m.txt
