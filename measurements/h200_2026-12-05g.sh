#!/usr/bin/env bash
# The pools' plan made from the segment events alone (b4b0550,
# docs/design/trace-decoding.md, "What is left") against 6a03e8b: a real
# 10M-event recording (ResNet-18 at batch 32); `replay --json` of .gpu/gt-n
# (6a03e8b) against .gpu/gt-h (b4b0550) four rounds, every report
# compared; two runs each of .gpu/gt-mn and .gpu/gt-mh (the same with time
# marks and the replay thread's CPU time; not committed); measure.sh of
# gt-h three times, so the ratio to `pickle.load` is seen on each run, two
# of them first (little device time was left for the call). The
# builds are made from the commits they name, stripped and gzipped into
# .gpu/ before the call.
# It never ran: no device machine started for it, and h200_2026-12-06b.sh
# measured b4b0550 in its place, against shares that grow.
set -u
for b in gt-n gt-h gt-mn gt-mh; do gunzip -c .gpu/$b.gz > .gpu/$b; chmod +x .gpu/$b; done
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
# Packed after every stage, so a call cut short still brings back what ran.
pack() { (cd $OUT && tar czf results.tgz --exclude=results.tgz *.txt); }
python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec.txt 2>&1
el recorded >> $OUT/rec.txt
pack
for k in 1 2; do
  bash measurements/ten_million/measure.sh .gpu/gt-h $W/a.pickle > $OUT/measure_$k.txt 2>&1
  el "measured $k" >> $OUT/builds.txt
  pack
done
bash measurements/ten_million/alternate.sh .gpu/gt-n .gpu/gt-h $W/a.pickle 4 > $OUT/alternate.txt 2>&1
el alternated >> $OUT/builds.txt
pack
for k in 1 2; do
  for b in gt-mn gt-mh; do
    sleep 1; rm -f /tmp/gt-marks.txt
    /usr/bin/time -f "$b $k replay %e s user %U rss %M KB" timeout 60 .gpu/$b replay $W/a.pickle --json > /dev/null 2>> $OUT/builds.txt
    cp /tmp/gt-marks.txt $OUT/marks_${b}_$k.txt
  done
done
el runs >> $OUT/builds.txt
pack
bash measurements/ten_million/measure.sh .gpu/gt-h $W/a.pickle > $OUT/measure_3.txt 2>&1
el "measured 3" >> $OUT/builds.txt
pack
cd $OUT && rm -f *.txt
