#!/usr/bin/env python3
"""A big, realistic snapshot from a small real one: the steady-state
iteration of a recorded training loop repeated until the trace holds
about N events.

    python3 tools/big-snapshot.py IN.pickle[.gz] OUT.pickle[.gz] --events N [--force]

Why it replays exactly: two consecutive iterations with the same requests
(action, address, size, stream) start from the same allocator state, so
the iteration between them can be repeated any number of times and every
copy (and everything after it) gets the addresses the recording had.
Copies keep the original's frames *objects*, so pickle writes each stack
once and refers back to it, as PyTorch's own snapshots share frames; times
and the Optimizer.step annotations that mark iterations are shifted along.
Needs only the standard library (no torch). docs/measurements/benchmarks.md,
"Ten million events", has the figures it was made for.
"""
import argparse
import bisect
import gzip
import pickle
import sys


def load(path):
    with open(path, "rb") as f:
        head = f.read(2)
    opener = gzip.open if head == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        return pickle.load(f)


def key(e):
    return (e.get("action"), e.get("addr"), e.get("size"), e.get("stream"))


def iteration_ends(trace, annotations, device):
    """Event indices where iterations end: the first event after each
    Optimizer.step END (what gpumem-top marks as iterations)."""
    times = [e.get("time_us", 0) for e in trace]
    ends = sorted(
        {
            bisect.bisect_right(times, a["time_us"])
            for a in annotations
            if a.get("device") == device
            and a.get("stage") == "END"
            and str(a.get("name", "")).startswith("Optimizer.step")
        }
    )
    return [i for i in ends if 0 < i < len(trace)]


def steady_period(trace, ends):
    """(start, end) of the last run of k iterations (k from 1 to 4: the
    state may cycle, a loss kept across steps alternating its address)
    whose requests equal the k before them, else of the shortest period
    the trace's tail repeats."""
    keys = [key(e) for e in trace]
    for k in range(1, 5):
        for i in range(len(ends) - 2 * k - 1, -1, -1):
            a, b, c = ends[i], ends[i + k], ends[i + 2 * k]
            if b - a == c - b and keys[a:b] == keys[b:c]:
                return b, c
    n = len(keys)
    for p in range(1, n // 2 + 1):
        if keys[n - 1] == keys[n - 1 - p] and keys[n - p:] == keys[n - 2 * p:n - p]:
            return n - p, n
    return None


def refuse(why):
    """One line naming the file, exit code 2, as gpumem-top says bad input."""
    print(f"big-snapshot: {why}", file=sys.stderr)
    sys.exit(2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--events", type=int, required=True, help="about how many events the trace should hold")
    ap.add_argument("--force", action="store_true", help="replace OUT if it exists")
    args = ap.parse_args()
    snap = load(args.input)
    traces = snap["device_traces"]
    device = max(range(len(traces)), key=lambda d: len(traces[d]))
    trace = traces[device]
    annotations = snap.get("external_annotations", []) or []
    found = steady_period(trace, iteration_ends(trace, annotations, device))
    if found is None:
        refuse(f"{args.input}: no two consecutive iterations with the same requests to repeat")
    start, end = found
    period = trace[start:end]
    copies = max(0, -(-(args.events - len(trace)) // len(period)))
    # One period's duration: from its first event to the next period's.
    nxt = trace[end]["time_us"] if end < len(trace) else period[-1]["time_us"] + 1
    span = nxt - period[0]["time_us"]
    out = trace[:end]

    def fresh(e):
        """A copy as PyTorch's snapshot makes each entry: a frames list
        with frames is one object shared by every entry of that stack
        (pickled once), but an empty one and `compile_context`'s string
        are new objects per entry, each memoized by the pickle."""
        c = dict(e)
        if isinstance(c.get("frames"), list) and not c["frames"]:
            c["frames"] = []
        if isinstance(c.get("compile_context"), str) and len(c["compile_context"]) > 1:
            c["compile_context"] = "".join(list(c["compile_context"]))
        return c

    for k in range(1, copies + 1):
        dt = k * span
        for e in period:
            c = fresh(e)
            c["time_us"] = e["time_us"] + dt
            out.append(c)
    shift = copies * span
    for e in trace[end:]:
        c = dict(e)
        c["time_us"] = e["time_us"] + shift
        out.append(c)
    traces[device] = out
    t0, t1 = period[0]["time_us"], nxt
    marks = []
    for a in annotations:
        if a.get("time_us", 0) >= t1:
            marks.append(dict(a, time_us=a["time_us"] + shift))
            continue
        marks.append(a)
        if a.get("device") == device and t0 <= a.get("time_us", 0) < t1:
            marks.extend(dict(a, time_us=a["time_us"] + k * span) for k in range(1, copies + 1))
    marks.sort(key=lambda a: a.get("time_us", 0))
    if annotations:
        snap["external_annotations"] = marks
    opener = gzip.open if args.output.endswith(".gz") else open
    # A new file (never through a link or over another's file) unless --force.
    try:
        f = opener(args.output, "wb" if args.force else "xb")
    except FileExistsError:
        refuse(f"{args.output}: already exists (--force replaces it)")
    with f:
        pickle.dump(snap, f, protocol=pickle.DEFAULT_PROTOCOL)
    print(
        f"{args.output}: device {device}, {len(out):,} events "
        f"({len(trace):,} recorded; events {start:,}..{end:,}, {len(period):,} a period, repeated {copies:,} times)"
    )


if __name__ == "__main__":
    main()
