#!/usr/bin/env bash
# The sixteenth H200 call of 2026-12-04 (docs/measurements/benchmarks.md,
# "Entries resolved on the workers"): a real 10M-event recording
# (ResNet-18 at batch 32); .gpu/gt-a (fa4cdc6), .gpu/gt-b (the memo's
# slots stored compact as the entries are applied) and .gpu/gt-d (b, and
# entries resolved on the workers, a memoized frames list's stack read by
# the decoding thread) alternating five times on `replay --json`, every
# report compared; .gpu/gt-q (d with a probe line: how many entries the
# workers resolved) once; the screen's first frame of a and d twice each;
# measure.sh of d (diff A A: one recording).
set -u
for b in a b d q; do gunzip -c .gpu/gt-$b.gz > .gpu/gt-$b; chmod +x .gpu/gt-$b; done
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec.txt 2>&1
el a >> $OUT/rec.txt
for round in 1 2 3 4 5; do
  for b in a b d; do
    sleep 1; /usr/bin/time -f "replay $b %e s user %U rss %M KB" timeout 60 .gpu/gt-$b replay $W/a.pickle --json > $W/r_${b}_$round.json 2>> $OUT/builds.txt
  done
done
.gpu/gt-q replay $W/a.pickle --json 2>&1 >/dev/null | grep probe >> $OUT/builds.txt
el replays >> $OUT/builds.txt
for round in 1 2; do
  for b in a d; do
    sleep 1; echo "first frame $b: $(timeout 60 python3 measurements/ten_million/first_frame.py .gpu/gt-$b $W/a.pickle 2>&1 | tail -1)" >> $OUT/builds.txt
  done
done
python3 - $W >> $OUT/builds.txt 2>&1 <<'PY'
import json, sys, glob, os
w = sys.argv[1]
def load(p):
    d = json.load(open(p)); d.pop("elapsed_ms", None); return d
r = load(os.path.join(w, "r_a_1.json"))
for p in sorted(glob.glob(os.path.join(w, "r_*.json"))):
    print(os.path.basename(p), "same" if load(p) == r else "DIFFERS")
PY
el compared >> $OUT/builds.txt
timeout 200 bash measurements/ten_million/measure.sh .gpu/gt-d $W/a.pickle $W/a.pickle > $OUT/measure.txt 2>&1
el all >> $OUT/builds.txt
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
