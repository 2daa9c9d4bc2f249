#!/usr/bin/env bash
# The thirteenth H200 call of 2026-12-04 (docs/measurements/benchmarks.md,
# "The columns on a thread of their own"): the stop's last build
# (.gpu/gt-head, 2996204) on two new real 10M-event recordings: the
# screen's first frame (200x60) and `replay --json` three times each,
# then measure.sh (CPython's pickle.load, --at peak, tune, export, diff A B).
set -u
gunzip -c .gpu/gt-head.gz > .gpu/gt-head; chmod +x .gpu/gt-head
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
for r in a b; do
  python3 measurements/ten_million/record_loop.py $W/$r.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec_$r.txt 2>&1
  el $r >> $OUT/rec_$r.txt
done
for round in 1 2 3; do
  sleep 1; echo "screen $(python3 measurements/ten_million/first_frame.py .gpu/gt-head $W/a.pickle)" >> $OUT/builds.txt
  sleep 1; /usr/bin/time -f "replay %e s user %U rss %M KB" .gpu/gt-head replay $W/a.pickle --json > /dev/null 2>> $OUT/builds.txt
done
bash measurements/ten_million/measure.sh .gpu/gt-head $W/a.pickle $W/b.pickle > $OUT/measure.txt 2>&1
el all >> $OUT/builds.txt
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
