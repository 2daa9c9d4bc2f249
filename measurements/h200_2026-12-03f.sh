#!/usr/bin/env bash
# The sixth H200 call of 2026-12-03 (docs/measurements/benchmarks.md): diff's
# staggered loading against the build before it, on a real 3M-event
# recording, and the replay's time split user/system.
set -u
W=$(mktemp -d)
python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --events 3000000 --max-entries 3000000 --budget 60 > $OUT/e.txt 2>&1
T="%e s user %U sys %S rss %M KB minflt %R"
for i in 1; do
  /usr/bin/time -f "replay $T" .gpu/gpumem-top replay $W/a.pickle --json > /dev/null 2>> $OUT/e.txt
  /usr/bin/time -f "diff-before $T" .gpu/gt-before diff $W/a.pickle $W/a.pickle --json > $W/d0.json 2>> $OUT/e.txt
  /usr/bin/time -f "diff-after $T" .gpu/gpumem-top diff $W/a.pickle $W/a.pickle --json > $W/d1.json 2>> $OUT/e.txt
done
cmp $W/d0.json $W/d1.json >> $OUT/e.txt 2>&1 && echo "diff json identical" >> $OUT/e.txt
