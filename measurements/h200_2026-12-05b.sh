#!/usr/bin/env bash
# The second H200 call of 2026-12-05 (docs/measurements/benchmarks.md, "The
# decoding thread on the H200"): a real 10M-event recording (ResNet-18 at
# batch 32); `replay --json` of .gpu/gt-n (9aa726d) and .gpu/gt-r (aee963e:
# the replay thread appends chunks as packed words and scans actions alone)
# alternating five rounds; two runs each of .gpu/gt-mk3 and .gpu/gt-mk3b
# (the same two builds with time marks, each thread's CPU time and where the
# decoding, columns and replay threads wait; not committed), their marks
# kept; measure.sh of gt-r.
set -u
for b in gt-n gt-r gt-mk3 gt-mk3b; do gunzip -c .gpu/$b.gz > .gpu/$b; chmod +x .gpu/$b; done
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec.txt 2>&1
el recorded >> $OUT/rec.txt
bash measurements/ten_million/alternate.sh .gpu/gt-n .gpu/gt-r $W/a.pickle 5 > $OUT/alternate.txt 2>&1
el alternated >> $OUT/builds.txt
for k in 1 2; do
  for b in gt-mk3 gt-mk3b; do
    sleep 1; rm -f /tmp/gt-marks.txt
    /usr/bin/time -f "$b $k replay %e s user %U rss %M KB" timeout 60 .gpu/$b replay $W/a.pickle --json > /dev/null 2>> $OUT/builds.txt
    cp /tmp/gt-marks.txt $OUT/marks_${b}_$k.txt
  done
done
el runs >> $OUT/builds.txt
bash measurements/ten_million/measure.sh .gpu/gt-r $W/a.pickle > $OUT/measure.txt 2>&1
el all >> $OUT/builds.txt
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
