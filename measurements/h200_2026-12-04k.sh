#!/usr/bin/env bash
# The eleventh H200 call of 2026-12-04 (docs/measurements/benchmarks.md,
# "The screen behind the decoding"): two real 10M-event recordings
# (ResNet-18 at batch 32); .gpu/gt-prev (b51ded1) and .gpu/gt-new
# (2d6d419, the scrubber's pass behind the decoding) alternating three
# times on the screen's first frame (200x60, the bytes drawn compared)
# and `replay --json` (every report compared); then measure.sh of the
# new build (CPython's pickle.load, --at peak, tune, export, diff A B).
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
    sleep 1; echo "screen $b $(FF_DUMP=$W/ff_${b}_$round.bin python3 measurements/ten_million/first_frame.py .gpu/gt-$b $W/a.pickle)" >> $OUT/builds.txt
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
def frame(p):
    b = open(p, "rb").read()
    return b.split(b"\x1b[?1049h", 1)[1] if b"\x1b[?1049h" in b else b""
f = frame(os.path.join(w, "ff_prev_1.bin"))
for p in sorted(glob.glob(os.path.join(w, "ff_*.bin"))):
    print(os.path.basename(p), len(frame(p)), "same frame" if frame(p) == f else "FRAME DIFFERS")
PY
el compared >> $OUT/builds.txt
bash measurements/ten_million/measure.sh .gpu/gt-new $W/a.pickle $W/b.pickle > $OUT/measure.txt 2>&1
el all >> $OUT/builds.txt
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
