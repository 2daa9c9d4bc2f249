#!/usr/bin/env bash
# The fifth H200 call of 2026-12-04 (docs/measurements/benchmarks.md,
# "The replay behind the decoder"): one real 10M-event recording
# (ResNet-18 at batch 32), then .gpu/gt-prev (0c31f2a) and .gpu/gt-ahead
# (0cc1e0a) alternating twice: the screen's first frame (200x60 pty,
# then `q`) and `replay --json`.
set -u
for b in prev ahead; do gunzip -c .gpu/gt-$b.gz > .gpu/gt-$b; chmod +x .gpu/gt-$b; done
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec_a.txt 2>&1
el a >> $OUT/rec_a.txt
for round in 1 2; do
  for b in prev ahead; do
    sleep 1; echo "screen $b $(python3 measurements/ten_million/first_frame.py .gpu/gt-$b $W/a.pickle)" >> $OUT/builds.txt
    sleep 1; /usr/bin/time -f "replay $b %e s rss %M KB" .gpu/gt-$b replay $W/a.pickle --json > /dev/null 2>> $OUT/builds.txt
  done
done
el all >> $OUT/builds.txt
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
