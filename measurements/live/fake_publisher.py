"""Publishes recorded states as this process, every 0.5 s, the way
assets/python/gpumem_top_publish.py does (atomic rename, 0700 directory).
A new layout every LAYOUT_EVERY files (default 4; the publisher keeps its
layout while taking one would exceed its time budget: GPT-2 on the H200
published a new one in 31 of 121 files), the stats of every state.

    python3 measurements/live/fake_publisher.py RECORDING.jsonl DIR [LAYOUT_EVERY]
"""
import json, os, sys, time

rec, d = sys.argv[1], sys.argv[2]
every = int(sys.argv[3]) if len(sys.argv) > 3 else 4
os.makedirs(d, mode=0o700, exist_ok=True)
lines = [json.loads(l) for l in open(rec)][1:]
docs = [p for l in lines for p in l.get("published", []) if isinstance(p.get("segments"), list)]
if not docs:
    sys.exit("%s: no published states with segments" % rec)
k = 0
while True:
    doc = dict(docs[k % len(docs)])
    layout = docs[(k - k % every) % len(docs)]
    k += 1
    doc.update(pid=os.getpid(), nspid=[os.getpid()], time=time.time(), device=0,
               segments=layout["segments"], layout_time=layout.get("time"))
    tmp = os.path.join(d, ".tmp%d" % os.getpid())
    with open(tmp, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    os.replace(tmp, os.path.join(d, "%d-0.json" % os.getpid()))
    time.sleep(0.5)
