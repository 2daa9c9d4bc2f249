#!/usr/bin/env bash
# The eighth H200 call of 2026-12-04 (docs/measurements/benchmarks.md,
# "The categories on every core"): two real 10M-event recordings
# (ResNet-18 at batch 32), then .gpu/gt-prev (131586e) and .gpu/gt-new
# (the categories' passes cut into spans, the OOMs' indices kept)
# alternating: `replay --json` three times each, every report compared,
# and the screen's first frame twice each; then measure.sh of the new
# build (CPython's pickle.load, --at peak, tune, export, diff A B).
set -u
for b in prev new; do gunzip -c .gpu/gt-$b.gz > .gpu/gt-$b; chmod +x .gpu/gt-$b; done
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
for r in a b; do
  python3 measurements/ten_million/record_loop.py $W/$r.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec_$r.txt 2>&1
  el $r >> $OUT/rec_$r.txt
done
for round in 1 2 3; do
  for b in prev new; do
    sleep 1; /usr/bin/time -f "replay $b %e s user %U rss %M KB" .gpu/gt-$b replay $W/a.pickle --json > $W/${b}_$round.json 2>> $OUT/builds.txt
  done
done
python3 - $W >> $OUT/builds.txt 2>&1 <<'PY'
import json, sys, glob, os
w = sys.argv[1]
def load(p):
    d = json.load(open(p)); d.pop("elapsed_ms", None); return d
r = load(os.path.join(w, "prev_1.json"))
for p in sorted(glob.glob(os.path.join(w, "*_[123].json"))):
    print(os.path.basename(p), "same" if load(p) == r else "DIFFERS")
PY
el replays >> $OUT/builds.txt
for round in 1 2; do
  for b in prev new; do
    sleep 1; echo "screen $b $(python3 measurements/ten_million/first_frame.py .gpu/gt-$b $W/a.pickle)" >> $OUT/builds.txt
  done
done
el screens >> $OUT/builds.txt
bash measurements/ten_million/measure.sh .gpu/gt-new $W/a.pickle $W/b.pickle > $OUT/measure.txt 2>&1
el all >> $OUT/builds.txt
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
