#!/usr/bin/env bash
# Frames on the device's cores with the iteration labels from the index:
# the bench binaries of dd281f0 (.gpu/bench-c.xz) and 530d628
# (.gpu/bench-p.xz), alternating new, old, new, `frame/big_step` (the
# generated 10M trace, .gpu/gen10m.pickle.xz) and the gpt2 frame by
# category, three seconds' measurement each. lscpu and nvidia-smi;
# packed after each run.
set -u
# The benches read their fixtures where they were built (CARGO_MANIFEST_DIR).
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
W=$(mktemp -d)
unxz() { python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2"; }
for b in c p; do unxz .gpu/bench-$b.xz $W/bench-$b; chmod +x $W/bench-$b; done
unxz .gpu/gen10m.pickle.xz $W/gen10m.pickle
lscpu > $OUT/lscpu.txt 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt 2>&1
k=0
for b in p c p; do
  k=$((k + 1))
  GPUMEM_TOP_BIG_TRACE=$W/gen10m.pickle $W/bench-$b --bench 'frame/(big_step|gpt2_step_200x60_by_category)' \
    --measurement-time 3 > $OUT/frames_${k}_$b.txt 2>&1
  (cd $OUT && tar czf results.tgz --exclude=results.tgz *.txt)
done
cd $OUT && rm -f *.txt
