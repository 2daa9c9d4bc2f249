#!/usr/bin/env bash
# The second H200 call of 2026-12-04 (docs/measurements/benchmarks.md,
# "The memo and the replay loop"): two real 10M-event recordings
# (ResNet-18 at batch 32 and 48), then on the first, by three builds
# alternating three times: .gpu/gt-prev (8288aa3), .gpu/gt-final (the
# replay loop without its observer, entries appended under one borrow)
# and .gpu/gt-w15 (the same with one worker fewer than the cores, so the
# decoding thread never shares a core): `replay --json`; every report
# compared; `tune --json` and the screen's first frame by prev and final;
# then measure.sh with gt-final.
set -u
for b in prev final w15; do gunzip -c .gpu/gt-$b.gz > .gpu/gt-$b; chmod +x .gpu/gt-$b; done
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; python3 -c "import torch; print(torch.__version__)"; } > $OUT/smi.txt 2>&1
( python3 measurements/ten_million/record_loop.py $W/a.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec_a.txt 2>&1; el a >> $OUT/rec_a.txt ) &
( python3 measurements/ten_million/record_loop.py $W/b.pickle --model resnet18 --batch 48 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec_b.txt 2>&1; el b >> $OUT/rec_b.txt ) &
wait
ls -la $W > $OUT/files.txt
T="%e s user %U sys %S rss %M KB minflt %R"
for round in 1 2 3; do
  for b in prev final w15; do
    sleep 1; /usr/bin/time -f "replay $b $T" .gpu/gt-$b replay $W/a.pickle --json > $W/${b}_$round.json 2>> $OUT/builds.txt
  done
done
for b in prev final; do
  sleep 1; /usr/bin/time -f "tune $b $T" .gpu/gt-$b tune $W/a.pickle --json > $W/tune_$b.json 2>> $OUT/builds.txt
done
for b in prev final; do
  sleep 1; echo "screen $b $(python3 measurements/ten_million/first_frame.py .gpu/gt-$b $W/a.pickle)" >> $OUT/builds.txt
done
python3 - $W >> $OUT/builds.txt 2>&1 <<'PY'
import json, sys, glob, os
w = sys.argv[1]
def load(p):
    d = json.load(open(p)); d.pop("elapsed_ms", None); return d
for pat, ref in (("[pfw]*_[123].json", "prev_1.json"), ("tune_*.json", "tune_prev.json")):
    r = load(os.path.join(w, ref))
    for p in sorted(glob.glob(os.path.join(w, pat))):
        print(os.path.basename(p), "same" if load(p) == r else "DIFFERS")
d = load(os.path.join(w, "prev_1.json"))
print("events", d.get("events"), "start", d.get("start"), "fidelity", d.get("fidelity"))
PY
el builds >> $OUT/builds.txt
timeout 250 bash measurements/ten_million/measure.sh .gpu/gt-final $W/a.pickle $W/b.pickle > $OUT/measure10m.txt 2>&1
el all >> $OUT/measure10m.txt
cd $OUT && tar czf results.tgz *.txt && rm -f *.txt
