#!/usr/bin/env bash
# Every frame bench on the device's cores, before and after this session's
# drawing changes: the bench binaries of 530d628 (.gpu/bench-base.xz,
# built with be7763e's benches/alloc.rs, which adds the 10M frames by
# category) and be7763e (.gpu/bench-new.xz), alternating new, old, new,
# `frame/` over the generated 10M trace (.gpu/gen10m.pickle.xz), three
# seconds' measurement each. lscpu and nvidia-smi; packed after each run.
set -u
# The benches read their fixtures where they were built (CARGO_MANIFEST_DIR).
# The old one was built in a second worktree, /tmp/rn/mk.
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
[ -e /tmp/rn/mk ] || { mkdir -p /tmp/rn && ln -s "$PWD" /tmp/rn/mk; }
W=$(mktemp -d)
unxz() { python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2"; }
for b in base new; do unxz .gpu/bench-$b.xz $W/bench-$b; chmod +x $W/bench-$b; done
unxz .gpu/gen10m.pickle.xz $W/gen10m.pickle
lscpu > $OUT/lscpu.txt 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt 2>&1
k=0
for b in new base new; do
  k=$((k + 1))
  GPUMEM_TOP_BIG_TRACE=$W/gen10m.pickle $W/bench-$b --bench 'frame/' --measurement-time 3 > $OUT/frames_${k}_$b.txt 2>&1
  (cd $OUT && tar czf results.tgz --exclude=results.tgz *.txt)
done
cd $OUT && rm -f *.txt
