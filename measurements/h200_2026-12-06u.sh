#!/usr/bin/env bash
# A jump's seek beside its timeline: the frame benches over the generated
# 10M trace (`frame/big_*`, the jump `frame/big_jump_200x60_by_category`
# among them) of 609956e (.gpu/bench-base.xz) and of this build
# (.gpu/bench-u.xz), alternating old, new, old, new. lscpu first; packed
# after every stage.
set -u
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
# The old binary was built in a worktree at /tmp/rn/base and reads its
# fixtures there (its first call ran without this line: every old run
# stopped at once; measurements/h200_2026-12-06w.sh ran them again).
[ -e /tmp/rn/base ] || { mkdir -p /tmp/rn && ln -s "$PWD" /tmp/rn/base; }
W=$(mktemp -d)
unxz() { python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"), 1 << 22)' "$1" "$2"; }
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
pack() { (cd $OUT && tar czf results.tgz --exclude=results.tgz *.txt 2>/dev/null); }
lscpu > $OUT/lscpu.txt 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> $OUT/lscpu.txt 2>&1
unxz .gpu/bench-base.xz $W/old; unxz .gpu/bench-u.xz $W/new; chmod +x $W/old $W/new
unxz .gpu/gen10m.pickle.xz $W/gen.pickle
el "unpacked $(stat -c %s $W/gen.pickle) bytes" >> $OUT/builds.txt
for r in 1 2; do
  for b in old new; do
    echo "== round $r $b" >> $OUT/frames.txt
    GPUMEM_TOP_BIG_TRACE=$W/gen.pickle $W/$b --bench 'frame/big' --measurement-time 3 2>&1 | grep -E "^frame|time:" >> $OUT/frames.txt
    el "frames $r $b" >> $OUT/builds.txt
    pack
  done
done
cd $OUT && rm -f *.txt
