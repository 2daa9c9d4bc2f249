#!/usr/bin/env bash
# The seventh H200 call of 2026-12-03 (docs/measurements/benchmarks.md, "Ten
# million events"; docs/design/trace-decoding.md): two real 10M-event
# recordings (ResNet-18 at batch 32 and 48), the decoding threads' scaling
# (the new build pinned to 1, 2, 4, 8, 16 cores, the build before them on
# all 16, JSON compared), then measure.sh on both (diff A B). Run from the
# repository root with .gpu/gpumem-top (new) and .gpu/gt-before (d14a1d0).
set -u
BIN=$PWD/.gpu/gpumem-top; OLD=$PWD/.gpu/gt-before
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; python3 -c "import torch; print(torch.__version__)"; } > $OUT/smi.txt 2>&1
( python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec_a.txt 2>&1; el a >> $OUT/rec_a.txt ) &
( python3 measurements/ten_million/record_loop.py $W/b.pickle --model resnet18 --batch 48 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec_b.txt 2>&1; el b >> $OUT/rec_b.txt ) &
wait
ls -la $W > $OUT/files.txt
T="%e s user %U sys %S rss %M KB"
for c in 0 0-1 0-3 0-7 0-15; do
  sleep 1; /usr/bin/time -f "new cores=$c $T" taskset -c $c $BIN replay $W/a.pickle --json > $W/new_$c.json 2>> $OUT/threads.txt
done
sleep 1; /usr/bin/time -f "before cores=0-15 $T" $OLD replay $W/a.pickle --json > $W/old.json 2>> $OUT/threads.txt
sleep 1; /usr/bin/time -f "new again cores=0-15 $T" $BIN replay $W/a.pickle --json > $W/new_again.json 2>> $OUT/threads.txt
python3 - $W >> $OUT/threads.txt 2>&1 <<'PY'
import json, sys, glob, os
w = sys.argv[1]
def load(p):
    d = json.load(open(p)); d.pop("elapsed_ms", None); return d
ref = load(os.path.join(w, "old.json"))
for p in sorted(glob.glob(os.path.join(w, "new*.json"))):
    print(os.path.basename(p), "same as before" if load(p) == ref else "DIFFERS")
print("events", ref.get("events"))
PY
el threads >> $OUT/threads.txt
timeout 280 bash measurements/ten_million/measure.sh $BIN $W/a.pickle $W/b.pickle > $OUT/measure10m.txt 2>&1
el all >> $OUT/measure10m.txt
