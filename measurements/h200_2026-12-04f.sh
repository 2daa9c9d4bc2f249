#!/usr/bin/env bash
# The sixth H200 call of 2026-12-04 (docs/design/trace-decoding.md,
# "What is left"): one real 10M-event recording (ResNet-18 at batch 32),
# then `replay --json` three times by .gpu/gt-phases: d1cafb1 with
# timestamps printed (GT_PROBE) where the decoding starts and ends, the
# trace is built, the session opens, plans, takes its first replay, the
# categories' first half is joined, and the report is written.
set -u
gunzip -c .gpu/gt-phases.gz > .gpu/gt-phases; chmod +x .gpu/gt-phases
W=$(mktemp -d)
python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec_a.txt 2>&1
for round in 1 2 3; do
  sleep 1
  GT_PROBE=1 /usr/bin/time -f "replay %e s rss %M KB" .gpu/gt-phases replay $W/a.pickle --json 2>&1 >/dev/null \
    | awk '/^probe:/ {t=$2; if (p) printf "%s→%s %.0f ms; ", prev, $3, (t-p)*1000; p=t; prev=$3; next} {print; print ""}' >> $OUT/phases.txt
done
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
