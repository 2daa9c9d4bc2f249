#!/usr/bin/env bash
# The twenty-sixth H200 call of 2026-12-04 (docs/measurements/benchmarks.md,
# "Where tune's time goes"): a real 10M-event recording (ResNet-18 at
# batch 32); `tune --json` of .gpu/gt-m (2171f13 with time marks written to
# /tmp/gt-marks.txt: the decoding's end, each candidate's replay with its
# thread's CPU seconds, the session opened, the second stage) three times,
# each after a `replay --json` of the same build.
set -u
for b in m; do gunzip -c .gpu/gt-$b.gz > .gpu/gt-$b; chmod +x .gpu/gt-$b; done
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
nproc > $OUT/rec.txt
python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 >> $OUT/rec.txt 2>&1
el a >> $OUT/rec.txt
for round in 1 2 3; do
  sleep 1; rm -f /tmp/gt-marks.txt
  /usr/bin/time -f "replay m %e s user %U rss %M KB" timeout 60 .gpu/gt-m replay $W/a.pickle --json > $W/r_$round.json 2>> $OUT/builds.txt
  sleep 1; rm -f /tmp/gt-marks.txt
  /usr/bin/time -f "tune m %e s user %U rss %M KB" timeout 60 .gpu/gt-m tune $W/a.pickle --json > $W/t_$round.json 2>> $OUT/builds.txt
  cp /tmp/gt-marks.txt $OUT/marks_$round.txt
done
cp $W/t_1.json $OUT/tune1.txt
el all >> $OUT/builds.txt
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
