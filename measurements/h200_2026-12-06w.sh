#!/usr/bin/env bash
# The frame benches of 609956e (.gpu/bench-base.xz) then of d2c50cd
# (.gpu/bench-u.xz, a jump's seek beside its timeline) over the generated
# 10M trace, one run each: run twice on one H100 host, after
# h200_2026-12-06v.sh in the first call, whose old runs had stopped at
# once (see h200_2026-12-06u.sh). Prints what it measured.
set -u
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
[ -e /tmp/rn/base ] || { mkdir -p /tmp/rn && ln -s "$PWD" /tmp/rn/base; }
W=$(mktemp -d)
unxz() { python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"), 1 << 22)' "$1" "$2"; }
unxz .gpu/bench-base.xz $W/old; unxz .gpu/bench-u.xz $W/new; unxz .gpu/gen10m.pickle.xz $W/gen.pickle
chmod +x $W/old $W/new
lscpu | grep -E "L3|Model name" > $OUT/ab.txt
for b in old new; do
  echo "== $b" >> $OUT/ab.txt
  GPUMEM_TOP_BIG_TRACE=$W/gen.pickle timeout 80 $W/$b --bench 'frame/big' --measurement-time 3 2>&1 | grep -E "^frame|time:|panic" >> $OUT/ab.txt
done
cat $OUT/ab.txt
