#!/usr/bin/env bash
# The fourteenth H200 call of 2026-12-03 (docs/measurements/benchmarks.md,
# "tune's first stage and the screen's scrubber beside the replay"): the
# same on a window: a real ResNet-18 loop recorded past its ring buffer
# (batch 32, max_entries 9,500,000: a 9.5M-event window) and one from
# process start (batch 48, 10M events); by a3bbafc's build (.gpu/gt-prev)
# and HEAD's (.gpu/gt-new, which also takes diff's end state from the
# exact replay), alternating: `replay --json`, `tune --json`, `diff A B
# --json`, the screen's first frame; every JSON compared; then measure.sh
# with gt-new on the window.
set -u
for b in prev new; do gunzip -c .gpu/gt-$b.gz > .gpu/gt-$b; chmod +x .gpu/gt-$b; done
PREV=$PWD/.gpu/gt-prev; NEW=$PWD/.gpu/gt-new
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; python3 -c "import torch; print(torch.__version__)"; } > $OUT/smi.txt 2>&1
( python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 9500000 --budget 200 > $OUT/rec_a.txt 2>&1; el a >> $OUT/rec_a.txt ) &
( python3 measurements/ten_million/record_loop.py $W/b.pickle --model resnet18 --batch 48 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec_b.txt 2>&1; el b >> $OUT/rec_b.txt ) &
wait
ls -la $W > $OUT/files.txt
T="%e s user %U sys %S rss %M KB minflt %R"
for round in 1 2; do
  for b in prev:$PREV new:$NEW; do
    sleep 1; /usr/bin/time -f "replay ${b%%:*} $T" ${b#*:} replay $W/a.pickle --json > $W/${b%%:*}_$round.json 2>> $OUT/builds.txt
  done
done
for round in 1 2; do
  for b in prev:$PREV new:$NEW; do
    sleep 1; /usr/bin/time -f "tune ${b%%:*} $T" ${b#*:} tune $W/a.pickle --json > $W/tune_${b%%:*}_$round.json 2>> $OUT/builds.txt
  done
done
for round in 1 2; do
  for b in prev:$PREV new:$NEW; do
    sleep 1; /usr/bin/time -f "diff ${b%%:*} $T" ${b#*:} diff $W/a.pickle $W/b.pickle --json > $W/diff_${b%%:*}_$round.json 2>> $OUT/builds.txt
  done
done
for b in prev:$PREV new:$NEW; do
  sleep 1; echo "screen ${b%%:*} $(python3 measurements/ten_million/first_frame.py ${b#*:} $W/a.pickle)" >> $OUT/builds.txt
done
python3 - $W >> $OUT/builds.txt 2>&1 <<'PY'
import json, sys, glob, os
w = sys.argv[1]
def load(p):
    d = json.load(open(p)); d.pop("elapsed_ms", None); return d
for pat, ref in (("[pn]*_[12].json", "prev_1.json"), ("tune_*.json", "tune_prev_1.json"), ("diff_*.json", "diff_prev_1.json")):
    r = load(os.path.join(w, ref))
    for p in sorted(glob.glob(os.path.join(w, pat))):
        print(os.path.basename(p), "same" if load(p) == r else "DIFFERS")
d = load(os.path.join(w, "prev_1.json"))
print("events", d.get("events"), "start", d.get("start"), "fidelity", d.get("fidelity"))
t = load(os.path.join(w, "tune_new_1.json"))
print("tune replays", t.get("replays"), "covers", t.get("covers"), "recorded_is_the_run", t.get("recorded_is_the_run"))
PY
el builds >> $OUT/builds.txt
timeout 250 bash measurements/ten_million/measure.sh $NEW $W/a.pickle $W/b.pickle > $OUT/measure10m.txt 2>&1
el all >> $OUT/measure10m.txt
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
