#!/usr/bin/env bash
# The fourteenth H200 call of 2026-12-04 (docs/measurements/benchmarks.md,
# "diff's decodings overlapping"): one real 10M-event recording;
# .gpu/gt-head (2996204: diff loads its second run once the first is
# loaded) and .gpu/gt-diff (once half the first's file is read)
# alternating three times on `diff A A --json` (every report compared),
# and `replay --json` once each.
set -u
for b in head diff; do gunzip -c .gpu/gt-$b.gz > .gpu/gt-$b; chmod +x .gpu/gt-$b; done
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec_a.txt 2>&1
el a >> $OUT/rec_a.txt
for round in 1 2 3; do
  for b in head diff; do
    sleep 1; /usr/bin/time -f "diff $b %e s user %U rss %M KB" .gpu/gt-$b diff $W/a.pickle $W/a.pickle --json > $W/d_${b}_$round.json 2>> $OUT/builds.txt
  done
done
for b in head diff; do
  sleep 1; /usr/bin/time -f "replay $b %e s user %U rss %M KB" .gpu/gt-$b replay $W/a.pickle --json > /dev/null 2>> $OUT/builds.txt
done
for f in $W/d_*.json; do cmp -s $f $W/d_head_1.json && echo "$(basename $f) same" || echo "$(basename $f) DIFFERS"; done >> $OUT/builds.txt
el all >> $OUT/builds.txt
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
