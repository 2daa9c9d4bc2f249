#!/usr/bin/env bash
# The H200 call that h200_2026-12-06.sh was written for (no device could be
# started in that session, so it never ran): the replay behind the decoder
# handing the columns back at the decoding's end and the frees that take one
# lookup (docs/design/trace-decoding.md, "The columns shared at the end").
# A real 10M-event recording (ResNet-18 at batch 32); `replay --json` of
# .gpu/gt-p (6ed4002) against .gpu/gt-n (6a03e8b) five rounds, every report
# compared; two runs each of .gpu/gt-mp and .gpu/gt-mn (the same with time
# marks and the replay thread's CPU time; not committed); measure.sh of gt-n
# three times, so the ratio to `pickle.load` is seen on each. The builds are
# made from the commits they name, stripped and gzipped into .gpu/.
# It did not run either (no device came); h200_2026-12-05f.sh, the same
# with a third build beside, is the call that ran.
set -u
for b in gt-p gt-n gt-mp gt-mn; do gunzip -c .gpu/$b.gz > .gpu/$b; chmod +x .gpu/$b; done
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec.txt 2>&1
el recorded >> $OUT/rec.txt
bash measurements/ten_million/alternate.sh .gpu/gt-p .gpu/gt-n $W/a.pickle 5 > $OUT/alternate.txt 2>&1
el alternated >> $OUT/builds.txt
for k in 1 2; do
  for b in gt-mn gt-mp; do
    sleep 1; rm -f /tmp/gt-marks.txt
    /usr/bin/time -f "$b $k replay %e s user %U rss %M KB" timeout 60 .gpu/$b replay $W/a.pickle --json > /dev/null 2>> $OUT/builds.txt
    cp /tmp/gt-marks.txt $OUT/marks_${b}_$k.txt
  done
done
el runs >> $OUT/builds.txt
for k in 1 2 3; do bash measurements/ten_million/measure.sh .gpu/gt-n $W/a.pickle > $OUT/measure_$k.txt 2>&1; el measured$k >> $OUT/builds.txt; done
el all >> $OUT/builds.txt
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
