#!/usr/bin/env bash
# The thirty-first H200 call of 2026-12-04 (docs/measurements/benchmarks.md,
# "Settings that round apart only at unseen sizes", the stop's last
# build): a real 10M-event recording (ResNet-18 at batch 32); measure.sh
# of .gpu/gt-h (7b1b61f) twice, then the screen's first frame and
# `replay --json` alternating three times.
set -u
gunzip -c .gpu/gt-h.gz > .gpu/gt-h; chmod +x .gpu/gt-h
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec.txt 2>&1
el a >> $OUT/rec.txt
for k in 1 2; do bash measurements/ten_million/measure.sh .gpu/gt-h $W/a.pickle > $OUT/measure_$k.txt 2>&1; done
el measured >> $OUT/builds.txt
for round in 1 2 3; do
  sleep 1; echo "first frame: $(timeout 60 python3 measurements/ten_million/first_frame.py .gpu/gt-h $W/a.pickle 2>&1 | tail -1)" >> $OUT/builds.txt
  sleep 1; /usr/bin/time -f "replay %e s user %U rss %M KB" timeout 60 .gpu/gt-h replay $W/a.pickle --json > /dev/null 2>> $OUT/builds.txt
done
el all >> $OUT/builds.txt
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
