#!/usr/bin/env bash
# The twelfth H200 call of 2026-12-04 (docs/measurements/benchmarks.md,
# "The columns on a thread of their own"): two real 10M-event recordings
# (ResNet-18 at batch 32); .gpu/gt-a (2d6d419), .gpu/gt-b (the entries'
# columns built on a thread of their own) and .gpu/gt-c (b, and the memo's
# compaction remembering the last string) alternating five times on
# `replay --json`, every report compared, and twice on tune and diff;
# then measure.sh of c.
set -u
for b in a b c; do gunzip -c .gpu/gt-$b.gz > .gpu/gt-$b; chmod +x .gpu/gt-$b; done
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
for r in a b; do
  python3 measurements/ten_million/record_loop.py $W/$r.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec_$r.txt 2>&1
  el $r >> $OUT/rec_$r.txt
done
for round in 1 2 3 4 5; do
  for b in a b c; do
    sleep 1; /usr/bin/time -f "replay $b %e s user %U rss %M KB" .gpu/gt-$b replay $W/a.pickle --json > $W/r_${b}_$round.json 2>> $OUT/builds.txt
  done
done
for round in 1 2; do
  for b in a c; do
    sleep 1; /usr/bin/time -f "tune $b %e s user %U rss %M KB" .gpu/gt-$b tune $W/a.pickle --json > $W/t_${b}_$round.json 2>> $OUT/builds.txt
    sleep 1; /usr/bin/time -f "diff $b %e s user %U rss %M KB" .gpu/gt-$b diff $W/a.pickle $W/b.pickle --json > $W/d_${b}_$round.json 2>> $OUT/builds.txt
  done
done
python3 - $W >> $OUT/builds.txt 2>&1 <<'PY'
import json, sys, glob, os
w = sys.argv[1]
def load(p):
    d = json.load(open(p)); d.pop("elapsed_ms", None); return d
for k in "rtd":
    r = load(os.path.join(w, f"{k}_a_1.json"))
    for p in sorted(glob.glob(os.path.join(w, f"{k}_*.json"))):
        print(os.path.basename(p), "same" if load(p) == r else "DIFFERS")
PY
el compared >> $OUT/builds.txt
bash measurements/ten_million/measure.sh .gpu/gt-c $W/a.pickle $W/b.pickle > $OUT/measure.txt 2>&1
el all >> $OUT/builds.txt
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
