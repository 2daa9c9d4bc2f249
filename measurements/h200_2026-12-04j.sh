#!/usr/bin/env bash
# The tenth H200 call of 2026-12-04 (docs/measurements/benchmarks.md,
# "The categories on every core"): two real 10M-event recordings
# (ResNet-18 at batch 32); .gpu/gt-prev (3854423) and .gpu/gt-new
# (3522827, tune's first stage behind the decoding) alternating four
# times on `replay --json`, every report compared; the new build's
# screen first frame twice; then measure.sh of the new build (CPython's
# pickle.load, --at peak, tune, export, diff A B).
set -u
for b in prev new; do gunzip -c .gpu/gt-$b.gz > .gpu/gt-$b; chmod +x .gpu/gt-$b; done
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
for r in a b; do
  python3 measurements/ten_million/record_loop.py $W/$r.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec_$r.txt 2>&1
  el $r >> $OUT/rec_$r.txt
done
for round in 1 2 3 4; do
  for b in prev new; do
    sleep 1; /usr/bin/time -f "replay $b %e s user %U rss %M KB" .gpu/gt-$b replay $W/a.pickle --json > $W/r_${b}_$round.json 2>> $OUT/builds.txt
  done
done
python3 - $W >> $OUT/builds.txt 2>&1 <<'PY'
import json, sys, glob, os
w = sys.argv[1]
def load(p):
    d = json.load(open(p)); d.pop("elapsed_ms", None); return d
r = load(os.path.join(w, "r_prev_1.json"))
for p in sorted(glob.glob(os.path.join(w, "r_*.json"))):
    print(os.path.basename(p), "same" if load(p) == r else "DIFFERS")
PY
for round in 1 2; do
  sleep 1; echo "screen new $(python3 measurements/ten_million/first_frame.py .gpu/gt-new $W/a.pickle)" >> $OUT/builds.txt
done
bash measurements/ten_million/measure.sh .gpu/gt-new $W/a.pickle $W/b.pickle > $OUT/measure.txt 2>&1
el all >> $OUT/builds.txt
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
