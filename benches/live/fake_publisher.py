"""Publishes recorded states as this process, every 0.5 s, the way
assets/python/gpumem_top_publish.py does (atomic rename, 0700 directory).

    python3 benches/live/fake_publisher.py RECORDING.jsonl DIR
"""
import json, os, sys, time

rec, d = sys.argv[1], sys.argv[2]
os.makedirs(d, mode=0o700, exist_ok=True)
lines = [json.loads(l) for l in open(rec)][1:]
docs = [p for l in lines for p in l.get("published", []) if isinstance(p.get("segments"), list)]
if not docs:
    sys.exit("%s: no published states with segments" % rec)
k = 0
while True:
    doc = dict(docs[k % len(docs)])
    k += 1
    doc.update(pid=os.getpid(), nspid=[os.getpid()], time=time.time(), device=0)
    tmp = os.path.join(d, ".tmp%d" % os.getpid())
    with open(tmp, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    os.replace(tmp, os.path.join(d, "%d-0.json" % os.getpid()))
    time.sleep(0.5)
