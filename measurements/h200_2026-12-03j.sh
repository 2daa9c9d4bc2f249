#!/usr/bin/env bash
# The tenth H200 call of 2026-12-03 (docs/measurements/benchmarks.md, "Ten
# million events"): one real 10M-event recording (ResNet-18, batch 32),
# then `replay --json` of it by two builds alternating, twice:
# .gpu/gt-head (4065ffc) and .gpu/gt-new (the categories' allocations
# sorted by counting); then a build of gt-new with timing probes
# (.gpu/gt-probe, not committed) that prints where the main thread's time
# goes, for the plain replay and for a what-if (`--alloc-conf`); then tune.
set -u
HEAD=$PWD/.gpu/gt-head; NEW=$PWD/.gpu/gt-new; PROBE=$PWD/.gpu/gt-probe
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; python3 -c "import torch; print(torch.__version__)"; } > $OUT/smi.txt 2>&1
python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec_a.txt 2>&1
el rec >> $OUT/rec_a.txt
ls -la $W > $OUT/files.txt
T="%e s user %U sys %S rss %M KB minflt %R"
for round in 1 2; do
  for b in head:$HEAD new:$NEW; do
    sleep 1; /usr/bin/time -f "${b%%:*} $T" ${b#*:} replay $W/a.pickle --json > $W/${b%%:*}_$round.json 2>> $OUT/builds.txt
  done
done
for round in 1 2; do
  sleep 1; /usr/bin/time -f "probe $T" $PROBE replay $W/a.pickle --json > $W/probe_$round.json 2>> $OUT/probe.txt
done
sleep 1; /usr/bin/time -f "probe what-if $T" $PROBE replay $W/a.pickle --alloc-conf expandable_segments:True --json > $W/whatif.json 2>> $OUT/probe.txt
sleep 1; /usr/bin/time -f "tune new $T" $NEW tune $W/a.pickle --json > $W/tune.json 2>> $OUT/probe.txt
python3 - $W >> $OUT/builds.txt 2>&1 <<'PY'
import json, sys, glob, os
w = sys.argv[1]
def load(p):
    d = json.load(open(p)); d.pop("elapsed_ms", None); return d
ref = load(os.path.join(w, "head_1.json"))
for p in sorted(glob.glob(os.path.join(w, "*_[12].json"))):
    print(os.path.basename(p), "same" if load(p) == ref else "DIFFERS")
print("events", ref.get("events"))
t = json.load(open(os.path.join(w, "tune.json"))); print("tune replays", t.get("replays"), "elapsed_ms", t.get("elapsed_ms"))
PY
el all >> $OUT/builds.txt
cp $W/whatif.json $W/tune.json $W/head_1.json $OUT/
cd $OUT && tar czf results.tgz *.txt *.json && rm -f *.txt *.json
