#!/usr/bin/env bash
# The ninth H200 call of 2026-12-04 (docs/measurements/benchmarks.md,
# "The categories on every core"): one real 10M-event recording
# (ResNet-18 at batch 32), then .gpu/gt-prev (3854423) and .gpu/gt-new
# (tune's first stage replayed behind the decoding) alternating: `tune
# --json` three times each and `replay --json` twice each, every report
# compared.
set -u
for b in prev new; do gunzip -c .gpu/gt-$b.gz > .gpu/gt-$b; chmod +x .gpu/gt-$b; done
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec_a.txt 2>&1
el a >> $OUT/rec_a.txt
for round in 1 2 3; do
  for b in prev new; do
    sleep 1; /usr/bin/time -f "tune $b %e s user %U rss %M KB" .gpu/gt-$b tune $W/a.pickle --json > $W/t_${b}_$round.json 2>> $OUT/builds.txt
  done
done
for round in 1 2; do
  for b in prev new; do
    sleep 1; /usr/bin/time -f "replay $b %e s user %U rss %M KB" .gpu/gt-$b replay $W/a.pickle --json > $W/r_${b}_$round.json 2>> $OUT/builds.txt
  done
done
python3 - $W >> $OUT/builds.txt 2>&1 <<'PY'
import json, sys, glob, os
w = sys.argv[1]
def load(p):
    d = json.load(open(p)); d.pop("elapsed_ms", None); return d
for k in "tr":
    r = load(os.path.join(w, f"{k}_prev_1.json"))
    for p in sorted(glob.glob(os.path.join(w, f"{k}_*.json"))):
        print(os.path.basename(p), "same" if load(p) == r else "DIFFERS")
PY
el all >> $OUT/builds.txt
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
