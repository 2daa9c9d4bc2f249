#!/usr/bin/env python3
"""Import cycles between the crate's files, of any length: every
`crate::…`, `super::…` and `self::…` path (and a mod.rs's bare paths into
its own child modules) outside `#[cfg(test)]` modules resolved to the file
that defines it, then the strongly connected components (Tarjan) of that
graph. Prints the counts and each cycle; exits 1 when there is one.
tools/module-graph.py draws the top-level modules' graph.

    tools/file-cycles.py [SRC_DIR]
"""
import os
import re
import sys

src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "src")
files = {}
for d, _, fs in os.walk(src):
    for f in fs:
        if f.endswith(".rs"):
            parts = os.path.relpath(os.path.join(d, f), src)[:-3].split(os.sep)
            if parts[-1] == "mod":
                parts = parts[:-1]
            files["::".join(parts)] = os.path.join(d, f)
ROOTS = ("lib", "main")


def code(path):
    text = open(path, encoding="utf-8").read()
    # Test modules (to the end of the file, as this crate writes them).
    cut = text.find("#[cfg(test)]\nmod ")
    if cut >= 0:
        text = text[:cut]
    return re.sub(r"//[^\n]*", "", text)


def resolve(parts):
    """The file defining the longest prefix of a module path."""
    for k in range(len(parts), 0, -1):
        key = "::".join(parts[:k])
        if key in files:
            return key
    return None


edges = {m: set() for m in files}
for m, path in files.items():
    text = code(path)
    here = [] if m in ROOTS else m.split("::")
    # `super` from a mod.rs is its parent module, as from any other file.
    for p in re.findall(r"\b((?:crate|super|self)(?:::[a-z_][a-z0-9_]*)+)", text):
        parts = p.split("::")
        if parts[0] == "crate":
            base, rest = [], parts[1:]
        elif parts[0] == "super":
            base, rest = here[:-1], parts[1:]
            while rest and rest[0] == "super":
                base, rest = base[:-1], rest[1:]
        else:
            base, rest = here, parts[1:]
        t = resolve(base + rest)
        if t and t != m and t not in ROOTS:
            edges[m].add(t)
    for prefix, group in re.findall(r"\bcrate::((?:[a-z_]+::)*)\{([^}]*)\}", text):
        base = [x for x in prefix.split("::") if x]
        for other in re.findall(r"(?:^|,)\s*([a-z_][a-z0-9_]*)", group):
            t = resolve(base + [other])
            if t and t != m and t not in ROOTS:
                edges[m].add(t)
    if path.endswith("mod.rs"):
        depth = m.count("::") + 1
        for child in (k for k in files if k.startswith(m + "::") and k.count("::") == depth):
            if re.search(r"(?<![:\w])" + child.split("::")[-1] + r"::", text):
                edges[m].add(child)

index, low, stack, on, cycles = {}, {}, [], set(), []
sys.setrecursionlimit(10000)


def connect(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in sorted(edges[v]):
        if w not in index:
            connect(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            cycles.append(sorted(comp))


for v in sorted(edges):
    if v not in index:
        connect(v)
print(f"{len(files)} files, {sum(len(e) for e in edges.values())} imports between them")
for c in cycles:
    print("cycle: " + " ".join(c))
print(f"{len(cycles)} cycle(s)")
sys.exit(1 if cycles else 0)
