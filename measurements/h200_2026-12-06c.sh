#!/usr/bin/env bash
# The stop's last builds on a fresh real 10M-event recording (ResNet-18 at
# batch 32): .gpu/gt-c (b404dd5: shares that grow, the free's category
# in the allocations' pass) against .gpu/gt-h (b4b0550, equal shares).
# measure.sh of gt-c three times, so the ratio to `pickle.load` is seen
# on each run; `replay --json` of the two alternating, every report
# compared; the screen's first frame twice; two runs each of .gpu/gt-mg
# (babeef4) and .gpu/gt-mc (b404dd5) with time marks and each thread's
# CPU time (not committed); measure.sh of gt-h last. In that order, since
# the device time left may cut the call short. The builds are
# made from the commits they name, stripped and gzipped into .gpu/
# before the call.
# It never ran: no device machine started in eleven tries, and what was
# left of the session's device time was too little for a recording;
# h200_2026-12-06d.sh ran instead.
set -u
for b in gt-h gt-c gt-mg gt-mc; do gunzip -c .gpu/$b.gz > .gpu/$b; chmod +x .gpu/$b; done
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
# Packed after every stage, so a call cut short still brings back what ran.
pack() { (cd $OUT && tar czf results.tgz --exclude=results.tgz *.txt); }
python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec.txt 2>&1
el recorded >> $OUT/rec.txt
pack
bash measurements/ten_million/measure.sh .gpu/gt-c $W/a.pickle > $OUT/measure_gt-c_1.txt 2>&1
el "measured gt-c 1" >> $OUT/builds.txt
pack
bash measurements/ten_million/alternate.sh .gpu/gt-h .gpu/gt-c $W/a.pickle 3 > $OUT/alternate.txt 2>&1
el alternated >> $OUT/builds.txt
pack
bash measurements/ten_million/measure.sh .gpu/gt-c $W/a.pickle > $OUT/measure_gt-c_2.txt 2>&1
el "measured gt-c 2" >> $OUT/builds.txt
pack
for k in 1 2; do
  sleep 1; echo "screen $k $(python3 measurements/ten_million/first_frame.py .gpu/gt-c $W/a.pickle)" >> $OUT/builds.txt
done
bash measurements/ten_million/measure.sh .gpu/gt-c $W/a.pickle > $OUT/measure_gt-c_3.txt 2>&1
el "measured gt-c 3" >> $OUT/builds.txt
pack
bash measurements/ten_million/marked_runs.sh $OUT $W/a.pickle 2 .gpu/gt-mg .gpu/gt-mc
el runs >> $OUT/builds.txt
pack
bash measurements/ten_million/measure.sh .gpu/gt-h $W/a.pickle > $OUT/measure_gt-h_1.txt 2>&1
el "measured gt-h" >> $OUT/builds.txt
pack
cd $OUT && rm -f *.txt
