#!/usr/bin/env python3
"""Who imports whom among the crate's top-level modules, from the code:
every `crate::MODULE` (and `super::MODULE` from a top-level file) outside
`#[cfg(test)]` modules. Prints one line per module, as docs/design/architecture.md
shows it, and the cycles if any.

    tools/module-graph.py [SRC_DIR]
    tools/module-graph.py --write docs/design/architecture.md   # rewrite from the code
    tools/module-graph.py --check docs/design/architecture.md   # exit 1 if it differs

With --write/--check the document's module graph (the code block after
"### The module graph") and the "knows of" column of its module table are
the code's: a module's direct imports."""
import os
import re
import sys

args = sys.argv[1:]
doc_mode = args[0] if args and args[0] in ("--write", "--check") else None
doc = args[1] if doc_mode else None
rest = args[2:] if doc_mode else args
src = rest[0] if rest else os.path.join(os.path.dirname(__file__), "..", "src")
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
lines = [f"{m:<{width}} -> {', '.join(sorted(edges[m])) or '(nothing)'}" for m in mods]
cycles = sorted({tuple(sorted((a, b))) for a in mods for b in edges[a] if a in edges[b]})
lines.append("cycles: " + (", ".join(f"{a} <-> {b}" for a, b in cycles) or "none"))
if not doc_mode:
    print("\n".join(lines))
    sys.exit(0)

text = open(doc, encoding="utf-8").read()
new = text
# The graph: the first code block after its heading.
head = new.index("### The module graph")
start = new.index("```\n", head) + 4
end = new.index("```", start)
new = new[:start] + "\n".join(lines) + "\n" + new[end:]
# The table: rows "| `module` | concern | knows of |".
def knows(m):
    return ", ".join(f"`{o}`" for o in sorted(edges[m])) or "nothing"
def row(match):
    m = match.group(1)
    return f"| `{m}` | {match.group(2)} | {knows(m)} |" if m in edges else match.group(0)
new = re.sub(r"^\| `([a-z_]+)` \| (.*) \| [^|]* \|$", row, new, flags=re.M)
if doc_mode == "--write":
    open(doc, "w", encoding="utf-8").write(new)
elif new != text:
    print(f"{doc}: its module graph or table differs from the code; run tools/module-graph.py --write {doc}")
    sys.exit(1)
