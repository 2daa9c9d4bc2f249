"""Normalises the oracle's output so two runs compare: drops the registration counter and the GC
counter (neither reaches Python's snapshot), keeps the release-only statistics without their
marker, cuts OOM messages before "GPU N has" and error messages to nothing (their tails differ by
release), and sorts `free_completed` entries released in one pass (their order follows heap
addresses in PyTorch)."""
import re
import sys

RAW = "--raw" in sys.argv
out, run = [], []
for line in sys.stdin.read().split("\n"):
    line = re.sub(r" (regctr|gc)=-?\d+", "", line)
    line = re.sub(r"\[v>=2\.1\d\] ", "", line)
    line = re.sub(r"^(\d+) OOM: (.*?) GPU \d+ has .*", r"\1 OOM: \2", line)
    line = re.sub(r"^(\d+) (STD)?ERROR: .*", r"\1 ERROR", line)
    if line.startswith("  free_completed ") and not RAW:
        run.append(line)
        continue
    out.extend(sorted(run))
    run = []
    out.append(line)
out.extend(sorted(run))
print("\n".join(out).rstrip("\n"))
