#!/usr/bin/env bash
# One H200 call for the changes of 2026-12-05 (docs/design/trace-decoding.md,
# "Reading ahead", "Several threads", "Annotations"; docs/measurements/
# benchmarks.md, "diff's call sites"): a real 10M-event recording (ResNet-18
# at batch 32); `replay --json` of .gpu/gt-o (562a637, the last build
# measured there only in part) and .gpu/gt-n (9aa726d, the last build)
# alternating four rounds (measurements/ten_million/alternate.sh), then
# gt-n and .gpu/gt-pf (gt-n reading a plain file ahead on a thread of its
# own, as 33f6d8d did; "Reading ahead") three rounds; two runs of .gpu/gt-mk
# (gt-n with time marks and the decoding thread's CPU time, not committed),
# their marks kept; `diff A A --json` of gt-o and gt-n alternating twice;
# measure.sh of gt-n.
set -u
for b in gt-o gt-n gt-pf gt-mk; do gunzip -c .gpu/$b.gz > .gpu/$b; chmod +x .gpu/$b; done
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec.txt 2>&1
el recorded >> $OUT/rec.txt
bash measurements/ten_million/alternate.sh .gpu/gt-o .gpu/gt-n $W/a.pickle 4 > $OUT/alternate.txt 2>&1
bash measurements/ten_million/alternate.sh .gpu/gt-n .gpu/gt-pf $W/a.pickle 3 > $OUT/alternate_pf.txt 2>&1
el alternated >> $OUT/builds.txt
for k in 1 2; do
  sleep 1; rm -f /tmp/gt-marks.txt
  /usr/bin/time -f "gt-mk $k replay %e s user %U rss %M KB" timeout 60 .gpu/gt-mk replay $W/a.pickle --json > /dev/null 2>> $OUT/builds.txt
  cp /tmp/gt-marks.txt $OUT/marks_$k.txt
done
for k in 1 2; do
  for b in gt-o gt-n; do
    sleep 1
    /usr/bin/time -f "$b $k diff %e s user %U rss %M KB" timeout 90 .gpu/$b diff $W/a.pickle $W/a.pickle --json > $OUT/d_$b.json 2>> $OUT/builds.txt
  done
done
cmp -s $OUT/d_gt-o.json $OUT/d_gt-n.json && echo "diff reports the same" >> $OUT/builds.txt || echo "diff reports differ" >> $OUT/builds.txt
el runs >> $OUT/builds.txt
bash measurements/ten_million/measure.sh .gpu/gt-n $W/a.pickle > $OUT/measure.txt 2>&1
el all >> $OUT/builds.txt
rm -f $OUT/d_*.json
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
