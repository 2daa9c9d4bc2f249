#!/usr/bin/env bash
# The twenty-eighth H200 call of 2026-12-04 (docs/measurements/benchmarks.md,
# "tune's lanes keyed by slot"): a real 10M-event recording (ResNet-18 at
# batch 32); `replay --json` then `tune --json` of .gpu/gt-s (158dce1, the
# second stage guessed) and .gpu/gt-k (the lanes handed requests keyed by
# slot), both with time marks written to /tmp/gt-marks.txt, three rounds
# alternating, every tune report compared; then measure.sh of .gpu/gt-p
# (k without the marks).
set -u
for b in s k p; do gunzip -c .gpu/gt-$b.gz > .gpu/gt-$b; chmod +x .gpu/gt-$b; done
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec.txt 2>&1
el a >> $OUT/rec.txt
for round in 1 2 3; do
  for b in s k; do
    sleep 1
    /usr/bin/time -f "replay $b %e s user %U rss %M KB" timeout 60 .gpu/gt-$b replay $W/a.pickle --json > /dev/null 2>> $OUT/builds.txt
    sleep 1; rm -f /tmp/gt-marks.txt
    /usr/bin/time -f "tune $b %e s user %U rss %M KB" timeout 60 .gpu/gt-$b tune $W/a.pickle --json > $W/t_${b}_$round.json 2>> $OUT/builds.txt
    cp /tmp/gt-marks.txt $OUT/marks_${b}_$round.txt
  done
done
for f in $W/t_*.json; do python3 -c "
import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2])); a.pop('elapsed_ms'); b.pop('elapsed_ms'); print(sys.argv[1].split('/')[-1], 'same' if a==b else 'DIFFERS')" $f $W/t_s_1.json; done >> $OUT/builds.txt
el rounds >> $OUT/builds.txt
bash measurements/ten_million/measure.sh .gpu/gt-p $W/a.pickle > $OUT/measure.txt 2>&1
el all >> $OUT/builds.txt
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
