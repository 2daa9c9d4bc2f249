"""Replays every OUT_DIR/*.pickle.gz with gpumem-top and compares the JSON
with the truth PyTorch reported (record_field.py):

    python3 measurements/snapshot_kinds/compare.py OUT_DIR [path/to/gpumem-top]

One line per snapshot: fidelity, whether allocated/reserved/segments now
equal the truth, and every other stat that differs.
"""

import glob
import json
import os
import subprocess
import sys

CURRENT = ["allocated_bytes.all.current", "reserved_bytes.all.current", "segment.all.current"]


def main():
    d = sys.argv[1]
    exe = sys.argv[2] if len(sys.argv) > 2 else "target/release/gpumem-top"
    bad = 0
    for f in sorted(glob.glob(os.path.join(d, "*.pickle.gz"))):
        tf = f[: -len(".pickle.gz")] + ".truth.json"
        if not os.path.exists(tf):
            continue
        truth = json.load(open(tf))["stats"]
        p = subprocess.run([exe, "replay", f, "--json"], capture_output=True, text=True)
        name = os.path.basename(f)
        try:
            j = json.loads(p.stdout)
        except ValueError:
            print("%-40s rc=%d %s" % (name, p.returncode, p.stderr.strip()))
            bad += 1
            continue
        st = j["stats"]
        cur = all(st.get(k) == truth[k] for k in CURRENT)
        diff = [(k, truth[k], st.get(k)) for k in sorted(truth) if st.get(k) != truth[k] and k not in CURRENT]
        print("%-40s %-13s current %s directed %s; other stats differing: %d %s" % (
            name, j["fidelity"], "equal" if cur else "DIFFER", j.get("directed_releases"), len(diff), diff[:6]))
        if j["first_divergence"]:
            print("    first divergence:", j["first_divergence"])
        bad += not cur
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
