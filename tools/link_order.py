"""The monitor's code layout (see tools/build-monitor.sh).

    python3 tools/link_order.py hot BINARY CALLGRIND_OUT   > tools/hot-functions.txt
    python3 tools/link_order.py order BINARY HOT_LIST      > ORDER_FILE

`hot` lists, by demangled name without the hash, BINARY's functions that a
callgrind run of it executed (run with --demangle=no --compress-strings=no).
`order` writes lld's --symbol-ordering-file for BINARY: the mangled names of
its functions whose demangled names are in HOT_LIST. Names survive rebuilds
and compiler versions where mangled names (whose hashes change) would not;
an entry that no longer exists just orders nothing.
"""
import subprocess, sys


def functions(binary):
    """(mangled, demangled) for each function symbol, in symbol table order."""
    def nm(*flags):
        out = subprocess.run(["nm", "--no-sort", *flags, binary], capture_output=True, text=True, check=True).stdout
        return out.splitlines()

    pairs = []
    for raw, shown in zip(nm(), nm("--demangle")):
        f, g = raw.split(maxsplit=2), shown.split(maxsplit=2)
        if len(f) == 3 and f[1] in "tTwW":
            pairs.append((f[2], g[2]))
    return pairs


def main():
    mode, binary, path = sys.argv[1:4]
    pairs = functions(binary)
    if mode == "hot":
        ran = set()
        for line in open(path, errors="replace"):
            if line.startswith(("fn=", "cfn=")):
                ran.add(line.split("=", 1)[1].strip())
        names = sorted({shown for raw, shown in pairs if raw in ran})
        if not names:
            sys.exit("%s: no function of %s ran (was callgrind run with --demangle=no?)" % (path, binary))
        print("\n".join(names))
    elif mode == "order":
        hot = {line.rstrip("\n") for line in open(path) if line.strip() and not line.startswith("#")}
        for raw, shown in pairs:
            if shown in hot:
                print(raw)
    else:
        sys.exit("mode is hot or order")


if __name__ == "__main__":
    main()
