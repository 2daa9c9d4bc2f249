#!/usr/bin/env bash
# The thirteenth H200 call of 2026-12-03 (docs/measurements/benchmarks.md,
# "tune's first stage and the screen's scrubber beside the replay"): two
# real 10M-event recordings (ResNet-18 at batch 32 and 48), then on the
# first, by two builds alternating: .gpu/gt-prev (a3bbafc) and .gpu/gt-new
# (tune's first stage beside the run's replay, the screens' scrubber
# beside it, a settings change followed by every replay): `replay --json`,
# `tune --json`, the screen's first frame (first_frame.py), `export`;
# every JSON and picture compared; then measure.sh with gt-new.
set -u
for b in prev new; do gunzip -c .gpu/gt-$b.gz > .gpu/gt-$b; chmod +x .gpu/gt-$b; done
PREV=$PWD/.gpu/gt-prev; NEW=$PWD/.gpu/gt-new
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; python3 -c "import torch; print(torch.__version__)"; } > $OUT/smi.txt 2>&1
( python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec_a.txt 2>&1; el a >> $OUT/rec_a.txt ) &
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
    sleep 1; echo "screen ${b%%:*} $(python3 measurements/ten_million/first_frame.py ${b#*:} $W/a.pickle)" >> $OUT/builds.txt
  done
done
for b in prev:$PREV new:$NEW; do
  sleep 1; /usr/bin/time -f "export ${b%%:*} $T" ${b#*:} export $W/a.pickle --view timeline --format txt -o $W/t_${b%%:*}.txt 2>> $OUT/builds.txt >/dev/null
done
python3 - $W >> $OUT/builds.txt 2>&1 <<'PY'
import json, sys, glob, os
w = sys.argv[1]
def load(p):
    d = json.load(open(p)); d.pop("elapsed_ms", None); return d
for pat, ref in (("[pn]*_[12].json", "prev_1.json"), ("tune_*.json", "tune_prev_1.json")):
    r = load(os.path.join(w, ref))
    for p in sorted(glob.glob(os.path.join(w, pat))):
        print(os.path.basename(p), "same" if load(p) == r else "DIFFERS")
t = [open(os.path.join(w, f"t_{b}.txt"), "rb").read() for b in ("prev", "new")]
print("export timeline", "same" if t[0] == t[1] else "DIFFERS", len(t[0]))
d = load(os.path.join(w, "prev_1.json"))
print("events", d.get("events"), "start", d.get("start"), "fidelity", d.get("fidelity"))
print("tune replays", load(os.path.join(w, "tune_new_1.json")).get("replays"))
PY
el builds >> $OUT/builds.txt
timeout 250 bash measurements/ten_million/measure.sh $NEW $W/a.pickle $W/b.pickle > $OUT/measure10m.txt 2>&1
el all >> $OUT/measure10m.txt
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
