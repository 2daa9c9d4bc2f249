#!/usr/bin/env python3
"""Who imports whom among the crate's top-level modules, from the code:
every `crate::MODULE` (and `super::MODULE` from a top-level file) outside
`#[cfg(test)]` modules. Prints one line per module, as docs/architecture.md
shows it, and the cycles if any.  Usage: tools/module-graph.py [SRC_DIR]"""
import os
import re
import sys

src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "src")
mods = sorted(
    n[:-3] if n.endswith(".rs") else n
    for n in os.listdir(src)
    if n not in ("lib.rs", "main.rs") and (n.endswith(".rs") or os.path.isdir(os.path.join(src, n)))
)
edges = {m: set() for m in mods}
for m in mods:
    path = os.path.join(src, m)
    files = [path + ".rs"] if os.path.isfile(path + ".rs") else [
        os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if f.endswith(".rs")
    ]
    for f in files:
        text = open(f, encoding="utf-8").read()
        # Test modules (to the end of the file, as this crate writes them).
        cut = text.find("#[cfg(test)]\nmod ")
        if cut >= 0:
            text = text[:cut]
        text = re.sub(r"//[^\n]*", "", text)
        for other in re.findall(r"\bcrate::([a-z_]+)", text):
            if other in edges and other != m:
                edges[m].add(other)
        # `use crate::{a, b::c}` groups.
        for group in re.findall(r"\bcrate::\{([^}]*)\}", text):
            for other in re.findall(r"(?:^|,)\s*([a-z_]+)", group):
                if other in edges and other != m:
                    edges[m].add(other)
width = max(len(m) for m in mods)
for m in mods:
    print(f"{m:<{width}} -> {', '.join(sorted(edges[m])) or '(nothing)'}")
cycles = sorted({tuple(sorted((a, b))) for a in mods for b in edges[a] if a in edges[b]})
print("cycles: " + (", ".join(f"{a} <-> {b}" for a, b in cycles) or "none"))
