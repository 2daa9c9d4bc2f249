#!/usr/bin/env bash
# Shares that grow (docs/design/trace-decoding.md, "Shares that grow")
# on a fresh real 10M-event recording (ResNet-18 at batch 32):
# .gpu/gt-h (b4b0550, equal shares), .gpu/gt-g (the same with each share a
# quarter longer than the one before) and .gpu/gt-g13 (growing, and three
# lexing threads fewer than the cores; not committed). measure.sh of gt-g
# first, then of gt-h, so the ratio to `pickle.load` is seen on each;
# `replay --json` of the three alternating, every report compared; two
# runs each of the marked builds (time marks and each thread's CPU time;
# not committed); measure.sh of gt-g and gt-g13 last. The builds are
# made from the commits they name, stripped and gzipped into .gpu/ before
# the call.
set -u
for b in gt-h gt-g gt-g13 gt-mh gt-mg gt-mg13; do gunzip -c .gpu/$b.gz > .gpu/$b; chmod +x .gpu/$b; done
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
# Packed after every stage, so a call cut short still brings back what ran.
pack() { (cd $OUT && tar czf results.tgz --exclude=results.tgz *.txt); }
python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec.txt 2>&1
el recorded >> $OUT/rec.txt
pack
for b in gt-g gt-h; do
  bash measurements/ten_million/measure.sh .gpu/$b $W/a.pickle > $OUT/measure_${b}_1.txt 2>&1
  el "measured $b" >> $OUT/builds.txt
  pack
done
bash measurements/ten_million/alternate.sh .gpu/gt-h .gpu/gt-g $W/a.pickle 3 > $OUT/alternate_hg.txt 2>&1
bash measurements/ten_million/alternate.sh .gpu/gt-g .gpu/gt-g13 $W/a.pickle 3 > $OUT/alternate_g13.txt 2>&1
el alternated >> $OUT/builds.txt
pack
for k in 1 2; do
  for b in gt-mh gt-mg gt-mg13; do
    sleep 1; rm -f /tmp/gt-marks.txt
    /usr/bin/time -f "$b $k replay %e s user %U rss %M KB" timeout 60 .gpu/$b replay $W/a.pickle --json > /dev/null 2>> $OUT/builds.txt
    cp /tmp/gt-marks.txt $OUT/marks_${b}_$k.txt
  done
done
el runs >> $OUT/builds.txt
pack
for b in gt-g gt-g13; do
  bash measurements/ten_million/measure.sh .gpu/$b $W/a.pickle > $OUT/measure_${b}_2.txt 2>&1
  el "measured $b 2" >> $OUT/builds.txt
  pack
done
cd $OUT && rm -f *.txt
