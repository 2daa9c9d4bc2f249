"""Compares the step peaks a recording holds (`gpumem-top replay REC --json`)
with what the training script read at each step end (gpt2_steps.py --out):

  python3 compare_steps.py REPLAY.json STEPS.json [--running-max]

--running-max: the script did not reset its peaks, so its readings are the
running maximum of the per-step peaks. Prints the worst relative error and
the steps compared; exits 1 when any differs by more than 1%."""

import json
import sys

rep = json.load(open(sys.argv[1]))
script = json.load(open(sys.argv[2]))
running = "--running-max" in sys.argv
proc = [p for p in rep["processes"] if p["pid"] == script["pid"]]
if not proc:
    sys.exit("no process %d in the recording: %s" % (script["pid"], [p["pid"] for p in rep["processes"]]))
steps = {s["step"]: s for s in proc[0]["steps"]}
worst, n, hi_a, hi_r = 0.0, 0, 0, 0
for row in script["rows"]:
    s = steps.get(row["step"])
    if s is None or s["allocated_peak_bytes"] is None:
        continue
    hi_a, hi_r = max(hi_a, s["allocated_peak_bytes"]), max(hi_r, s["reserved_peak_bytes"])
    ours_a = hi_a if running else s["allocated_peak_bytes"]
    ours_r = hi_r if running else s["reserved_peak_bytes"]
    for ours, theirs in ((ours_a, row["max_allocated"]), (ours_r, row["max_reserved"])):
        worst = max(worst, abs(ours - theirs) / max(theirs, 1))
    n += 1
print(
    "%d of %d steps compared; worst relative error %.6f%%; steps logged %d; alerts at the end: %s"
    % (n, len(script["rows"]), 100 * worst, len(steps), [a["kind"] for a in (rep.get("last") or {}).get("alerts", [])])
)
sys.exit(0 if n >= len(script["rows"]) * 0.95 and worst <= 0.01 else 1)
