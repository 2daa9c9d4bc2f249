"""Random request streams for the allocator oracle (format: README.md).

    python3 gen.py SEED OPS MODE      prints one stream; the first line says the device's total bytes

Modes stress what differs between PyTorch releases (docs/design/pytorch-allocator.md, "Releases"):
equal-size free blocks (tie-breaks), record_stream with pending events, private pools inside and
outside a capture, memory fractions at and around the limit, garbage collection, OOMs, oversize
segments, expandable segments and their 2.15 reserve, throw_on_cudamalloc_oom, exact-address
allocations and annotations.
"""
import random
import sys

GIB = 1 << 30
MIB = 1 << 20
# mode: (device total, allocator settings, features)
MODES = {
    "plain": (80 * GIB, "", ""),
    "ties": (80 * GIB, "", "ties"),
    "rec": (80 * GIB, "", "rec ties"),
    "pool": (80 * GIB, "", "pool rec ties"),
    "capture": (80 * GIB, "", "pool capture rec ties"),
    "frac": (8 * GIB, "", "frac ties"),
    "gc": (8 * GIB, "garbage_collection_threshold:0.6", "frac ties"),
    "oom": (4 * GIB, "", "ties"),
    "maxsplit": (8 * GIB, "max_split_size_mb:40,max_non_split_rounding_mb:60", "ties"),
    "roundup": (8 * GIB, "roundup_power2_divisions:[64:8,256:4,1024:2,>:1]", "ties"),
    "expandable": (4 * GIB, "expandable_segments:True", "ties"),
    "throw": (8 * GIB, "throw_on_cudamalloc_oom:True,per_process_memory_fraction:0.4", "ties"),
    "reserve": (8 * GIB, "expandable_segments_reserve:0.1,expandable_segments:True", "ties"),
    "exact": (80 * GIB, "", "exact ties"),
    "annotate": (80 * GIB, "", "annotate ties"),
    "poolcap": (4 * GIB, "", "pool rec ties"),
    "window": (80 * GIB, "", "window"),
}


def main():
    seed, n, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    total, conf, features = MODES[mode]
    feats = set(features.split())
    r = random.Random(seed * 1000 + sorted(MODES).index(mode))
    out = [f"# total {total}"]
    if conf:
        out.append("conf " + conf)
    if "frac" in feats:
        out.append(f"fraction {r.choice([0.5, 0.25, 0.3333333333333333, 0.7])}")
    if "window" in feats:
        window(r, out)
        return
    out.append("history")
    out.append("stream s1")
    out.append("stream s2")
    pooled = "pool" in feats
    if pooled:
        out.append("pool_create 0 1")
    inpool = False
    deferred_here = False
    live = []
    freed = []
    sizes = {}
    nid = 0
    pending = 0
    # A few sizes that recur: equal-size free blocks are what the releases order differently.
    common = [r.randint(1, 1 << 20) for _ in range(3)] + [r.randint(2 * MIB, 40 * MIB) for _ in range(3)]
    common += [2 * MIB, 20 * MIB, r.randint(40 * MIB, 300 * MIB)]

    def size():
        k = r.random()
        if "ties" in feats and k < 0.45:
            return r.choice(common)
        k = r.random()
        if k < 0.35:
            return r.randint(1, 1 << 20)
        if k < 0.6:
            return r.randint((1 << 20) + 1, 10 << 20)
        if k < 0.85:
            return r.randint(10 << 20, 200 << 20)
        if k < 0.95:
            return r.choice([512, 1024, 4096, 1 << 20, 2 << 20, 20 << 20, 64 << 20])
        return r.randint(200 << 20, min(2 << 30, total // 3))

    for i in range(n):
        k = r.random()
        if k < 0.5 or not live:
            nid += 1
            sid = r.choice(["s0", "s0", "s0", "s1", "s2"])
            if "exact" in feats and freed and r.random() < 0.25:
                ref, sz = r.choice(freed)
                off = r.choice([0, 0, 512, 4096, sz // 2 // 512 * 512])
                want = max(1, r.choice([sz - off, (sz - off) // 2, 512]))
                out.append(f"allocat p{nid} {want} @{ref}+{off}")
            else:
                sz = size()
                sizes[nid] = sz
                out.append(f"alloc p{nid} {sz} {sid}")
            live.append(nid)
            if "annotate" in feats and r.random() < 0.2:
                out.append(f"annotate p{nid} note{nid}")
        elif k < 0.88:
            x = live.pop(r.randrange(len(live)))
            # Inside a pool scope a freed block with stream uses is deferred
            # (a capture's rule, and every pool scope's before 2.13), and
            # PyTorch frees the deferred blocks in the hash order of their
            # heap addresses: not reproducible, so one per scope at most.
            if "rec" in feats and r.random() < 0.25 and not (inpool and deferred_here):
                out.append(f"record p{x} {r.choice(['s1', 's2'])}")
                deferred_here = deferred_here or inpool
            out.append(f"free p{x}")
            freed.append((f"p{x}", sizes.get(x, 512)))
            freed = freed[-8:]
        elif k < 0.91:
            out.append("empty")
        elif k < 0.94 and pooled:
            if not inpool:
                if "capture" in feats:
                    out.append("capture_begin")
                out.append("pool_begin 0 1")
                inpool = True
                deferred_here = False
            else:
                out.append("pool_end 0 1")
                inpool = False
                if "capture" in feats:
                    out.append("capture_end")
        elif k < 0.96 and "rec" in feats:
            pending ^= 1
            out.append(f"pending {pending}")
        elif k < 0.97 and "meta" in feats:
            out.append(f"meta m{i}")
        else:
            out.append("stats")
        if i % 60 == 59:
            out.append("snap")
    if inpool:
        out.append("pool_end 0 1")
        if "capture" in feats:
            out.append("capture_end")
    if pending:
        out.append("pending 0")
    out.append("snapt")
    out.append("stats")
    print("\n".join(out))


def window(r, out):
    """A trace whose ring buffer wrapped, over cached segments of one size
    whose ages disagree with their addresses: some are released and made
    again at the low addresses cudaMalloc hands back, so the youngest sit
    lowest. The window holds none of their segment_alloc entries; the
    allocations of that size in it show which the allocator took."""
    size = r.choice([30, 64, 100, 150]) << 20
    k = r.randint(3, 6)
    out.append("history %d" % r.randint(40, 90))
    out.append("stream s1")
    names = ["w%d" % i for i in range(k)]
    for n in names:
        out.append("alloc %s %d" % (n, size))
    gone = r.sample(names, r.randint(1, k - 1))
    for n in gone:
        out.append("free " + n)
    out.append("empty")
    for n in gone:
        out.append("alloc %s %d" % (n, size))
    for n in r.sample(names, k):
        out.append("free " + n)
    live = []
    for i in range(r.randint(60, 120)):
        if r.random() < 0.55 or not live:
            nid = "f%d" % i
            out.append("alloc %s %d %s" % (nid, r.randint(1, 1 << 20), r.choice(["s0", "s1"])))
            live.append(nid)
        else:
            out.append("free " + live.pop(r.randrange(len(live))))
    held = []
    for i in range(r.randint(2, k)):
        out.append("alloc t%d %d" % (i, size))
        held.append("t%d" % i)
        if r.random() < 0.3:
            out.append("free " + held.pop(0))
    out.append("snapt")
    out.append("stats")
    print("\n".join(out))


if __name__ == "__main__":
    main()
