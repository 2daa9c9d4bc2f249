#!/usr/bin/env bash
# The ninth H200 call of 2026-12-03 (docs/measurements/benchmarks.md,
# "diff's two decodings"): two real 10M-event recordings (ResNet-18 at
# batch 32 and 48), then `diff A B --json` with the second run's decoding
# staggered after the first's (GT_STAGGER=1, the build's probe) and both
# at once, alternating, twice, beside `replay --json` of A; JSON compared.
# .gpu/gt-var: 4d94a12 with the stagger behind that probe.
set -u
BIN=$PWD/.gpu/gt-var
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
nproc > $OUT/smi.txt
( python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec_a.txt 2>&1; el a >> $OUT/rec_a.txt ) &
( python3 measurements/ten_million/record_loop.py $W/b.pickle --model resnet18 --batch 48 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec_b.txt 2>&1; el b >> $OUT/rec_b.txt ) &
wait
ls -la $W > $OUT/files.txt
T="%e s user %U sys %S rss %M KB"
for round in 1 2; do
  sleep 1; /usr/bin/time -f "replay $T" $BIN replay $W/a.pickle --json > $W/replay_$round.json 2>> $OUT/diff.txt
  sleep 1; GT_STAGGER=1 /usr/bin/time -f "diff staggered $T" $BIN diff $W/a.pickle $W/b.pickle --json > $W/stag_$round.json 2>> $OUT/diff.txt
  sleep 1; /usr/bin/time -f "diff at once $T" $BIN diff $W/a.pickle $W/b.pickle --json > $W/once_$round.json 2>> $OUT/diff.txt
done
for f in stag_2 once_1 once_2; do cmp -s $W/stag_1.json $W/$f.json && echo "$f same as stag_1" || echo "$f DIFFERS"; done >> $OUT/diff.txt
head -c 600 $W/stag_1.json >> $OUT/diff.txt
el all >> $OUT/diff.txt
