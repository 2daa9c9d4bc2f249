#!/usr/bin/env bash
# The gpt2 frames on the device's cores: the bench binaries of c5ecdb4
# (.gpu/bench-r.xz) and dd281f0 (.gpu/bench-c.xz: the timeline's bytes by
# category in one pass), alternating new, old, new, `frame/gpt2` with
# three seconds' measurement each. lscpu; packed after each run.
set -u
# The benches read their fixtures where they were built (CARGO_MANIFEST_DIR).
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
W=$(mktemp -d)
for b in r c; do python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' .gpu/bench-$b.xz $W/bench-$b; chmod +x $W/bench-$b; done
lscpu > $OUT/lscpu.txt 2>&1
k=0
for b in c r c; do
  k=$((k + 1))
  $W/bench-$b --bench 'frame/gpt2' --measurement-time 3 > $OUT/frames_${k}_$b.txt 2>&1
  (cd $OUT && tar czf results.tgz --exclude=results.tgz *.txt)
done
cd $OUT && rm -f *.txt
