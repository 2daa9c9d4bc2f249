#!/usr/bin/env bash
# h200_2026-12-05e.sh (the columns shared at the end and frees in one
# lookup, 6a03e8b against 6ed4002) with a third build beside it: .gpu/gt-x,
# the free-block bins holding their first block inline (0fb369a)
# (docs/design/allocator.md, "Free-block bins"). A real 10M-event recording
# (ResNet-18 at batch 32); `replay --json` of gt-p (6ed4002) against gt-n
# (6a03e8b) five rounds and of gt-n against gt-x four, every report
# compared; two runs each of the marked builds gt-mp, gt-mn, gt-mx (time
# marks and the replay thread's CPU time; not committed); measure.sh of
# gt-n and of gt-x twice each, interleaved, so the ratio to `pickle.load`
# is seen on each run. The builds are made from the commits they name,
# stripped and gzipped into .gpu/ before the call.
set -u
for b in gt-p gt-n gt-x gt-mp gt-mn gt-mx; do gunzip -c .gpu/$b.gz > .gpu/$b; chmod +x .gpu/$b; done
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec.txt 2>&1
el recorded >> $OUT/rec.txt
bash measurements/ten_million/alternate.sh .gpu/gt-p .gpu/gt-n $W/a.pickle 5 > $OUT/alternate_pn.txt 2>&1
bash measurements/ten_million/alternate.sh .gpu/gt-n .gpu/gt-x $W/a.pickle 4 > $OUT/alternate_nx.txt 2>&1
el alternated >> $OUT/builds.txt
for k in 1 2; do
  for b in gt-mn gt-mp gt-mx; do
    sleep 1; rm -f /tmp/gt-marks.txt
    /usr/bin/time -f "$b $k replay %e s user %U rss %M KB" timeout 60 .gpu/$b replay $W/a.pickle --json > /dev/null 2>> $OUT/builds.txt
    cp /tmp/gt-marks.txt $OUT/marks_${b}_$k.txt
  done
done
el runs >> $OUT/builds.txt
for k in 1 2; do
  for b in gt-n gt-x; do
    bash measurements/ten_million/measure.sh .gpu/$b $W/a.pickle > $OUT/measure_${b}_$k.txt 2>&1
    el "measured $b $k" >> $OUT/builds.txt
  done
done
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
