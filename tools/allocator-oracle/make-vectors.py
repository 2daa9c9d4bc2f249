"""Regenerates tests/fixtures/releases/: request streams and what each PyTorch release's own caching
allocator did with them (run through ./run.sh; build the releases first with ./build.sh).

    python3 make-vectors.py [--streams N] [--ops N] 2.11.0 2.12.1 2.13.0 2.15.0

One gzip file per mode; `free_completed` entries stay in the order the allocator wrote them (the
test sorts runs of them where the order follows heap addresses). Each holds, per stream, the stream and one output per distinct behaviour,
headed by the releases that produced it:

    === stream SEED
    ...stream lines...
    === out 2.11.0 2.12.1
    ...normalised output...
    === diff 2.13.0 2.15.0
    ...the next behaviour as edits of the first: `= N` keeps N lines, `- N` drops N, `+ TEXT` adds one...

Not run in CI: building the oracle downloads each release's wheel.
"""
import argparse
import difflib
import gzip
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
import gen  # noqa: E402


def delta(base, lines):
    """`lines` as edits of `base`: `= N` keeps N lines, `- N` drops N, `+ TEXT` adds one."""
    out = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, base, lines, autojunk=False).get_opcodes():
        if op == "equal":
            out.append(f"= {i2 - i1}")
            continue
        if i2 > i1:
            out.append(f"- {i2 - i1}")
        out.extend("+ " + line for line in lines[j1:j2])
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=24)
    ap.add_argument("--ops", type=int, default=300)
    ap.add_argument("--out", default=os.path.join(here, "..", "..", "tests", "fixtures", "releases"))
    ap.add_argument("--modes", default=",".join(gen.MODES))
    ap.add_argument("--sorted", action="store_true", help="sort free_completed runs (norm.py's default)")
    ap.add_argument("releases", nargs="+")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for mode in a.modes.split(","):
        parts = []
        differ = 0
        for seed in range(1, a.streams + 1):
            stream = subprocess.run([sys.executable, os.path.join(here, "gen.py"), str(seed), str(a.ops), mode],
                                    check=True, capture_output=True, text=True).stdout
            total = stream.split("\n", 1)[0].split()[2]
            outs = {}
            for rel in a.releases:
                raw = subprocess.run([os.path.join(here, "run.sh"), rel], input=stream, capture_output=True, text=True,
                                     env={**os.environ, "FAKE_TOTAL": total}, check=True).stdout
                norm = subprocess.run([sys.executable, os.path.join(here, "norm.py")] + ([] if a.sorted else ["--raw"]), input=raw, capture_output=True,
                                      text=True, check=True).stdout
                outs.setdefault(norm, []).append(rel)
            differ += len(outs) > 1
            parts.append(f"=== stream {seed}\n{stream.rstrip()}\n")
            base = None
            for norm, rels in outs.items():
                if base is None:
                    base = norm.rstrip().split("\n")
                    parts.append(f"=== out {' '.join(rels)}\n" + "\n".join(base) + "\n")
                else:
                    parts.append(f"=== diff {' '.join(rels)}\n{delta(base, norm.rstrip().split(chr(10)))}")
        with gzip.open(os.path.join(a.out, f"{mode}.txt.gz"), "wt", compresslevel=9) as f:
            f.write("".join(parts))
        print(f"{mode}: {a.streams} streams, {differ} where the releases differ", flush=True)


if __name__ == "__main__":
    main()
