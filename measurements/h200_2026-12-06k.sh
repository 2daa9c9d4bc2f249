#!/usr/bin/env bash
# The screen's frames at ten million events on the device's cores: the
# bench binary of 36c4897 (`cargo bench --bench alloc --no-run`, stripped,
# carried as .gpu/bench-n.xz) over the generated 10M trace (carried
# xz-compressed as .gpu/gen10m.pickle.xz): `frame/` (gpt2_train at event
# 4400, stepping; the big trace at its middle, stepping one event right
# then left, unzoomed and zoomed in five times). lscpu; packed.
set -u
# The bench reads its fixtures where it was built (CARGO_MANIFEST_DIR).
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
W=$(mktemp -d)
python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' .gpu/bench-n.xz $W/bench; chmod +x $W/bench
lscpu > $OUT/lscpu.txt 2>&1
ls -la /work/main/tests/fixtures/traces/gpt2_train.pickle.gz > $OUT/fixtures.txt 2>&1
python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"), 1 << 22)' .gpu/gen10m.pickle.xz $W/gen.pickle
for k in 1 2; do
  GPUMEM_TOP_BIG_TRACE=$W/gen.pickle $W/bench --bench 'frame/' > $OUT/frames_$k.txt 2>&1
  (cd $OUT && tar czf results.tgz --exclude=results.tgz *.txt)
done
cd $OUT && rm -f *.txt
