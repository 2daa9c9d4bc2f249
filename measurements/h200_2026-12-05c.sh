#!/usr/bin/env bash
# The third H200 call of 2026-12-05 (docs/design/trace-decoding.md, "Pages
# faulted ahead"; docs/measurements/benchmarks.md, "The decoding thread on
# the H200"): a real 10M-event recording (ResNet-18 at batch 32);
# `replay --json` of .gpu/gt-r (aee963e) and .gpu/gt-p (de3def7: the
# replay's column faulted in on the columns thread) alternating four rounds;
# gt-p against .gpu/gt-s (shares growing by a quarter each) and against
# .gpu/gt-w (three lexing threads fewer than the cores), three rounds each;
# two runs each of .gpu/gt-mp, gt-ms, gt-mw (the same three with time
# marks of each thread's CPU time and waits; not committed); measure.sh of
# gt-p.
set -u
for b in gt-r gt-p gt-s gt-w gt-mp gt-ms gt-mw; do gunzip -c .gpu/$b.gz > .gpu/$b; chmod +x .gpu/$b; done
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec.txt 2>&1
el recorded >> $OUT/rec.txt
bash measurements/ten_million/alternate.sh .gpu/gt-r .gpu/gt-p $W/a.pickle 4 > $OUT/alternate.txt 2>&1
bash measurements/ten_million/alternate.sh .gpu/gt-p .gpu/gt-s $W/a.pickle 3 > $OUT/alternate_s.txt 2>&1
bash measurements/ten_million/alternate.sh .gpu/gt-p .gpu/gt-w $W/a.pickle 3 > $OUT/alternate_w.txt 2>&1
el alternated >> $OUT/builds.txt
for k in 1 2; do
  for b in gt-mp gt-ms gt-mw; do
    sleep 1; rm -f /tmp/gt-marks.txt
    /usr/bin/time -f "$b $k replay %e s user %U rss %M KB" timeout 60 .gpu/$b replay $W/a.pickle --json > /dev/null 2>> $OUT/builds.txt
    cp /tmp/gt-marks.txt $OUT/marks_${b}_$k.txt
  done
done
el runs >> $OUT/builds.txt
bash measurements/ten_million/measure.sh .gpu/gt-p $W/a.pickle > $OUT/measure.txt 2>&1
el all >> $OUT/builds.txt
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
