#!/usr/bin/env bash
# The seventh H200 call of 2026-12-04 (docs/measurements/benchmarks.md,
# "The replay behind the decoder"): one real 10M-event recording
# (ResNet-18 at batch 32), then .gpu/gt-ahead (0cc1e0a) and .gpu/gt-cat
# (the categories' first half in three passes side by side) alternating
# four times: `replay --json`; every report compared.
set -u
for b in ahead cat; do gunzip -c .gpu/gt-$b.gz > .gpu/gt-$b; chmod +x .gpu/gt-$b; done
W=$(mktemp -d)
python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec_a.txt 2>&1
for round in 1 2 3 4; do
  for b in ahead cat; do
    sleep 1; /usr/bin/time -f "replay $b %e s user %U rss %M KB" .gpu/gt-$b replay $W/a.pickle --json > $W/${b}_$round.json 2>> $OUT/builds.txt
  done
done
python3 - $W >> $OUT/builds.txt 2>&1 <<'PY'
import json, sys, glob, os
w = sys.argv[1]
def load(p):
    d = json.load(open(p)); d.pop("elapsed_ms", None); return d
r = load(os.path.join(w, "ahead_1.json"))
for p in sorted(glob.glob(os.path.join(w, "*_[1234].json"))):
    print(os.path.basename(p), "same" if load(p) == r else "DIFFERS")
PY
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
