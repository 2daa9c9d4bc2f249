"""The real largest batch under a memory limit: the training command run in
a fresh process per try (`{batch}` in it replaced), doubling from --start,
then bisection; a try fits when the process exits 0.
Usage: bisect.py --start 8 --max 1024 -- python3 train_lm.py --batch-size {batch} --limit-gib 16"""
import argparse
import json
import subprocess
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--start", type=int, default=8)
p.add_argument("--max", type=int, default=1024)
p.add_argument("cmd", nargs=argparse.REMAINDER)
a = p.parse_args()
cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
tries = {}


def fits(b):
    if b not in tries:
        t = time.time()
        r = subprocess.run([c.replace("{batch}", str(b)) for c in cmd], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        tries[b] = r.returncode == 0
        print("batch %d: %s (%.1f s)" % (b, "fits" if tries[b] else "fails", time.time() - t), file=sys.stderr, flush=True)
    return tries[b]


lo, hi = 0, None
b = a.start
while b <= a.max:
    if fits(b):
        lo = b
        b *= 2
    else:
        hi = b
        break
if hi is None:
    hi = a.max + 1
while hi - lo > 1:
    mid = (lo + hi) // 2
    if fits(mid):
        lo = mid
    else:
        hi = mid
print(json.dumps({"largest_batch": lo, "tries": {str(k): v for k, v in sorted(tries.items())}}))
