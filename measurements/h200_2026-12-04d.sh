#!/usr/bin/env bash
# The fourth H200 call of 2026-12-04 (docs/measurements/benchmarks.md,
# "The replay behind the decoder"): two real 10M-event recordings
# (ResNet-18 at batch 32 and 48), then on the first, four builds
# alternating three times: .gpu/gt-prev (0c31f2a), .gpu/gt-ahead
# (0cc1e0a: replay, diff and tune with the replay behind the decoding),
# .gpu/gt-probe (the same, saying where the replay was when the decoding
# ended and how long its tail took) and .gpu/gt-w1 (the probe with one
# decoding worker fewer while a replay runs behind): `replay --json`;
# `diff A B` and `tune` by prev and ahead; every report compared; then
# measure.sh with gt-ahead.
set -u
for b in prev ahead probe w1; do gunzip -c .gpu/gt-$b.gz > .gpu/gt-$b; chmod +x .gpu/gt-$b; done
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; python3 -c "import torch; print(torch.__version__)"; } > $OUT/smi.txt 2>&1
( python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec_a.txt 2>&1; el a >> $OUT/rec_a.txt ) &
( python3 measurements/ten_million/record_loop.py $W/b.pickle --model resnet18 --batch 48 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec_b.txt 2>&1; el b >> $OUT/rec_b.txt ) &
wait
ls -la $W > $OUT/files.txt
T="%e s user %U sys %S rss %M KB"
export GT_PROBE=1
for round in 1 2 3; do
  for b in prev ahead probe w1; do
    sleep 1; /usr/bin/time -f "replay $b $T" .gpu/gt-$b replay $W/a.pickle --json > $W/${b}_$round.json 2>> $OUT/builds.txt
  done
done
for b in prev ahead; do
  sleep 1; /usr/bin/time -f "diff $b $T" .gpu/gt-$b diff $W/a.pickle $W/b.pickle --json > $W/diff_$b.json 2>> $OUT/builds.txt
  sleep 1; /usr/bin/time -f "tune $b $T" .gpu/gt-$b tune $W/a.pickle --json > $W/tune_$b.json 2>> $OUT/builds.txt
done
python3 - $W >> $OUT/builds.txt 2>&1 <<'PY'
import json, sys, glob, os
w = sys.argv[1]
def load(p):
    d = json.load(open(p)); d.pop("elapsed_ms", None); return d
for pat, ref in (("*_[123].json", "prev_1.json"), ("diff_*.json", "diff_prev.json"), ("tune_*.json", "tune_prev.json")):
    r = load(os.path.join(w, ref))
    for p in sorted(glob.glob(os.path.join(w, pat))):
        print(os.path.basename(p), "same" if load(p) == r else "DIFFERS")
d = load(os.path.join(w, "prev_1.json"))
print("events", d.get("events"), "start", d.get("start"), "fidelity", d.get("fidelity"))
PY
el builds >> $OUT/builds.txt
unset GT_PROBE
timeout 250 bash measurements/ten_million/measure.sh .gpu/gt-ahead $W/a.pickle $W/b.pickle > $OUT/measure10m.txt 2>&1
el all >> $OUT/measure10m.txt
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
