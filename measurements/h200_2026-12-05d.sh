#!/usr/bin/env bash
# The fourth H200 call of 2026-12-05 (docs/measurements/benchmarks.md, "The
# decoding thread on the H200"): the machine's CPU topology; a real
# 10M-event recording (ResNet-18 at batch 32); `replay --json` of .gpu/gt-p
# (de3def7) against .gpu/gt-s8 (shares growing by a quarter each, lexing
# threads half the cores) four rounds, and .gpu/gt-s (growing shares, as
# many lexing threads as cores up to 16) against gt-s8 three rounds; two
# runs each of .gpu/gt-ms8, gt-ms, gt-mp (the same with time marks; not
# committed); measure.sh of gt-s8. Not run on 2026-12-05: no device machine
# could be started for the rest of that session; the builds are to be made
# again from the commit it measures against.
set -u
for b in gt-p gt-s gt-s8 gt-mp gt-ms gt-ms8; do gunzip -c .gpu/$b.gz > .gpu/$b; chmod +x .gpu/$b; done
{ lscpu; for c in 0 1 8; do echo "cpu$c siblings $(cat /sys/devices/system/cpu/cpu$c/topology/thread_siblings_list 2>/dev/null)"; done; cat /sys/kernel/mm/transparent_hugepage/enabled; uname -r; } > $OUT/cpu.txt 2>&1
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec.txt 2>&1
el recorded >> $OUT/rec.txt
bash measurements/ten_million/alternate.sh .gpu/gt-p .gpu/gt-s8 $W/a.pickle 4 > $OUT/alternate.txt 2>&1
bash measurements/ten_million/alternate.sh .gpu/gt-s .gpu/gt-s8 $W/a.pickle 3 > $OUT/alternate_s.txt 2>&1
el alternated >> $OUT/builds.txt
for k in 1 2; do
  for b in gt-ms8 gt-ms gt-mp; do
    sleep 1; rm -f /tmp/gt-marks.txt
    /usr/bin/time -f "$b $k replay %e s user %U rss %M KB" timeout 60 .gpu/$b replay $W/a.pickle --json > /dev/null 2>> $OUT/builds.txt
    cp /tmp/gt-marks.txt $OUT/marks_${b}_$k.txt
  done
done
el runs >> $OUT/builds.txt
bash measurements/ten_million/measure.sh .gpu/gt-s8 $W/a.pickle > $OUT/measure.txt 2>&1
el all >> $OUT/builds.txt
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
