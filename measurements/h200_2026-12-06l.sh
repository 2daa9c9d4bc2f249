#!/usr/bin/env bash
# The frames again on the device's cores, the bench binaries of 36c4897
# (.gpu/bench-n.xz) and c5ecdb4 (.gpu/bench-r.xz: column maxima in three
# levels), alternating new, old, new, over the generated 10M trace
# (carried xz-compressed as .gpu/gen10m.pickle.xz): `frame/` with three
# seconds' measurement each. lscpu; packed after each run.
set -u
# The benches read their fixtures where they were built (CARGO_MANIFEST_DIR).
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
W=$(mktemp -d)
for b in n r; do python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' .gpu/bench-$b.xz $W/bench-$b; chmod +x $W/bench-$b; done
lscpu > $OUT/lscpu.txt 2>&1
python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"), 1 << 22)' .gpu/gen10m.pickle.xz $W/gen.pickle
k=0
for b in r n r; do
  k=$((k + 1))
  GPUMEM_TOP_BIG_TRACE=$W/gen.pickle $W/bench-$b --bench 'frame/' --measurement-time 3 > $OUT/frames_${k}_$b.txt 2>&1
  (cd $OUT && tar czf results.tgz --exclude=results.tgz *.txt)
done
cd $OUT && rm -f *.txt
