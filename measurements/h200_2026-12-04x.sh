#!/usr/bin/env bash
# The twenty-fifth H200 call of 2026-12-04 (docs/measurements/benchmarks.md,
# "A hurried pass", after the review's mends): a real 10M-event recording
# (ResNet-18 at batch 32); the screen's first frame (200x60 pty, then q)
# and `replay --json` of .gpu/gt-a (25159dd, the stop's base) and
# .gpu/gt-z (feff863, its last build) three times each, alternating,
# every report compared; then measure.sh of z.
set -u
for b in a z; do gunzip -c .gpu/gt-$b.gz > .gpu/gt-$b; chmod +x .gpu/gt-$b; done
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec.txt 2>&1
el a >> $OUT/rec.txt
for round in 1 2 3; do
  for b in a z; do
    sleep 1; echo "first frame $b: $(timeout 60 python3 measurements/ten_million/first_frame.py .gpu/gt-$b $W/a.pickle 2>&1 | tail -1)" >> $OUT/builds.txt
    sleep 1; /usr/bin/time -f "replay $b %e s user %U rss %M KB" timeout 60 .gpu/gt-$b replay $W/a.pickle --json > $W/r_${b}_$round.json 2>> $OUT/builds.txt
  done
done
for f in $W/r_*.json; do python3 -c "
import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2])); a.pop('elapsed_ms'); b.pop('elapsed_ms'); print(sys.argv[1].split('/')[-1], 'same' if a==b else 'DIFFERS')" $f $W/r_a_1.json; done >> $OUT/builds.txt
bash measurements/ten_million/measure.sh .gpu/gt-z $W/a.pickle > $OUT/measure.txt 2>&1
el all >> $OUT/builds.txt
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
