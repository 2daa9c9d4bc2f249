#!/usr/bin/env bash
# The worst frame at any cursor: `frame/big_jump_200x60_by_category`
# (jumps between two events 2,040 past a checkpoint, far apart, each
# frame replaying from a checkpoint) beside the stepping frames, the
# bench binary of this build (.gpu/bench-t.xz) twice over the generated
# 10M trace. lscpu first; packed after every stage.
set -u
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
W=$(mktemp -d)
unxz() { python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"), 1 << 22)' "$1" "$2"; }
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
pack() { (cd $OUT && tar czf results.tgz --exclude=results.tgz *.txt 2>/dev/null); }
lscpu > $OUT/lscpu.txt 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> $OUT/lscpu.txt 2>&1
unxz .gpu/bench-t.xz $W/bench; chmod +x $W/bench
unxz .gpu/gen10m.pickle.xz $W/gen.pickle
el "unpacked $(stat -c %s $W/gen.pickle) bytes" >> $OUT/builds.txt
for r in 1 2; do
  echo "== round $r" >> $OUT/frames.txt
  GPUMEM_TOP_BIG_TRACE=$W/gen.pickle $W/bench --bench 'frame/big' --measurement-time 3 2>&1 | grep -E "^frame|time:" >> $OUT/frames.txt
  el "frames $r" >> $OUT/builds.txt
  pack
done
cd $OUT && rm -f *.txt
