#!/usr/bin/env bash
# The fifteenth H200 call of 2026-12-04 (docs/measurements/benchmarks.md,
# "Entries resolved on the workers"): a real 10M-event recording
# (ResNet-18 at batch 32); .gpu/gt-a (fa4cdc6), .gpu/gt-b (the memo's
# slots stored compact as the entries are applied) and .gpu/gt-c (b, and
# entries resolved on the workers) alternating five times on
# `replay --json`, every report compared; .gpu/gt-p (c with a probe line:
# how many entries the workers resolved) once; measure.sh of c; then a
# second recording for diff A B and tune, a and c alternating twice.
set -u
for b in a b c p; do gunzip -c .gpu/gt-$b.gz > .gpu/gt-$b; chmod +x .gpu/gt-$b; done
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec.txt 2>&1
el a >> $OUT/rec.txt
for round in 1 2 3 4 5; do
  for b in a b c; do
    sleep 1; /usr/bin/time -f "replay $b %e s user %U rss %M KB" timeout 60 .gpu/gt-$b replay $W/a.pickle --json > $W/r_${b}_$round.json 2>> $OUT/builds.txt
  done
done
.gpu/gt-p replay $W/a.pickle --json 2>&1 >/dev/null | grep probe >> $OUT/builds.txt
el replays >> $OUT/builds.txt
timeout 150 bash measurements/ten_million/measure.sh .gpu/gt-c $W/a.pickle $W/a.pickle > $OUT/measure.txt 2>&1
el measure >> $OUT/builds.txt
python3 measurements/ten_million/record_loop.py $W/b.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 >> $OUT/rec.txt 2>&1
el b >> $OUT/rec.txt
for round in 1 2; do
  for b in a c; do
    sleep 1; /usr/bin/time -f "diff $b %e s user %U rss %M KB" timeout 60 .gpu/gt-$b diff $W/a.pickle $W/b.pickle --json > $W/d_${b}_$round.json 2>> $OUT/builds.txt
    sleep 1; /usr/bin/time -f "tune $b %e s user %U rss %M KB" timeout 60 .gpu/gt-$b tune $W/a.pickle --json > $W/t_${b}_$round.json 2>> $OUT/builds.txt
  done
done
python3 - $W >> $OUT/builds.txt 2>&1 <<'PY'
import json, sys, glob, os
w = sys.argv[1]
def load(p):
    d = json.load(open(p)); d.pop("elapsed_ms", None); return d
for k in "rdt":
    r = load(os.path.join(w, f"{k}_a_1.json"))
    for p in sorted(glob.glob(os.path.join(w, f"{k}_*.json"))):
        print(os.path.basename(p), "same" if load(p) == r else "DIFFERS")
PY
el all >> $OUT/builds.txt
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
