"""A recording with stacks, as if recorded without
(docs/user/categories.md §Evidence): every event's and block's frames emptied,
nothing else changed.

    python3 measurements/categories/remove_stacks.py IN.pickle.gz OUT.pickle.gz

tests/fixtures/categories/stacks_removed/ holds the stack recordings of
tests/fixtures/categories/ passed through this: the notes that say what each
block truly is are the same, so the rules without stacks are scored on the
same models as the rules with them.
"""

import gzip
import pickle
import sys

with gzip.open(sys.argv[1], "rb") as f:
    snap = pickle.load(f)
for trace in snap.get("device_traces", []):
    for e in trace:
        e["frames"] = []
for seg in snap.get("segments", []):
    for b in seg.get("blocks", []):
        if "frames" in b:
            b["frames"] = []
with gzip.open(sys.argv[2], "wb") as f:
    pickle.dump(snap, f)
