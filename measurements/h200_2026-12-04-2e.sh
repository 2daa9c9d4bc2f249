#!/usr/bin/env bash
# The first H200 call of the stop after 2026-12-04's (docs/measurements/
# benchmarks.md, "The chain after the decoding, step by step"): a real
# 10M-event recording (ResNet-18 at batch 32), then `replay --json` of
# .gpu/gt-mk (cd29fa4 with time marks at each step after the decoding,
# not committed) and .gpu/gt-mk2 (the same with the passes after the
# decoding cut over the cores) alternating, four rounds, each run's marks
# kept.
set -u
for b in gt-mk gt-mk2; do gunzip -c .gpu/$b.gz > .gpu/$b; chmod +x .gpu/$b; done
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
nproc > $OUT/machine.txt; lscpu | head -20 >> $OUT/machine.txt
python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec.txt 2>&1
el a >> $OUT/rec.txt
for k in 1 2 3 4; do
  for b in gt-mk gt-mk2; do
    sleep 1; rm -f /tmp/gt-marks.txt
    echo "$b $k" >> $OUT/builds.txt
    /usr/bin/time -f "replay %e s user %U rss %M KB" timeout 60 .gpu/$b replay $W/a.pickle --json > /dev/null 2>> $OUT/builds.txt
    cp /tmp/gt-marks.txt $OUT/marks_${b}_$k.txt
  done
done
el all >> $OUT/builds.txt
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
