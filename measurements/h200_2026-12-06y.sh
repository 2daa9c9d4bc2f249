#!/usr/bin/env bash
# The frame benches of 0846953 (.gpu/bench-h.xz: four frame threads, the
# map's rows and the stacked categories apart) over the generated 10M
# trace, twice, for an H200 should the device tool lend one (none was
# lent for h200_2026-12-06x.sh). lscpu and the GPU first. Prints them.
set -u
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
W=$(mktemp -d)
unxz() { python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"), 1 << 22)' "$1" "$2"; }
lscpu | grep -E "L3|Model name|^CPU\(s\)" > $OUT/frames.txt
nvidia-smi --query-gpu=name --format=csv,noheader >> $OUT/frames.txt 2>&1
unxz .gpu/bench-h.xz $W/bench; chmod +x $W/bench
unxz .gpu/gen10m.pickle.xz $W/gen.pickle
for r in 1 2; do
  echo "== round $r" >> $OUT/frames.txt
  GPUMEM_TOP_BIG_TRACE=$W/gen.pickle $W/bench --bench 'frame/big' --measurement-time 3 2>&1 | grep -E "^frame|time:" >> $OUT/frames.txt
done
cat $OUT/frames.txt
