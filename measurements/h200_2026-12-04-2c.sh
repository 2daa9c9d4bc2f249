#!/usr/bin/env bash
# The thirtieth H200 call of 2026-12-04 (docs/measurements/benchmarks.md,
# "Settings that round apart only at unseen sizes"): a real 10M-event recording
# (ResNet-18 at batch 32); `replay --json` then `tune --json` of .gpu/gt-q
# (b0c96bd, settings that behave alike replayed once) and .gpu/gt-r
# (97ed80c, those that round apart only at unseen sizes riding along),
# three rounds alternating, every tune report compared;
# then measure.sh of r.
set -u
for b in q r; do gunzip -c .gpu/gt-$b.gz > .gpu/gt-$b; chmod +x .gpu/gt-$b; done
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec.txt 2>&1
el a >> $OUT/rec.txt
for round in 1 2 3; do
  for b in q r; do
    sleep 1
    /usr/bin/time -f "replay $b %e s user %U rss %M KB" timeout 60 .gpu/gt-$b replay $W/a.pickle --json > /dev/null 2>> $OUT/builds.txt
    sleep 1
    /usr/bin/time -f "tune $b %e s user %U rss %M KB" timeout 60 .gpu/gt-$b tune $W/a.pickle --json > $W/t_${b}_$round.json 2>> $OUT/builds.txt
  done
done
for f in $W/t_*.json; do python3 -c "
import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2])); a.pop('elapsed_ms'); b.pop('elapsed_ms'); print(sys.argv[1].split('/')[-1], 'same' if a==b else 'DIFFERS')" $f $W/t_q_1.json; done >> $OUT/builds.txt
el rounds >> $OUT/builds.txt
bash measurements/ten_million/measure.sh .gpu/gt-r $W/a.pickle > $OUT/measure.txt 2>&1
el all >> $OUT/builds.txt
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
