#!/usr/bin/env bash
# The 10M issue's own measurement for dee0c12 (.gpu/gt-s.xz, a stripped
# release build), with this session's drawing changes: measure.sh on a
# fresh real 10M recording (ResNet-18 at batch 32) and on the generated
# 10M trace (.gpu/gen10m.pickle.xz), the screen's first frame on each,
# then every frame bench of be7763e (.gpu/bench-new.xz, the same drawing
# code) over the generated trace. lscpu; packed after every stage.
set -u
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
W=$(mktemp -d)
unxz() { python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"), 1 << 22)' "$1" "$2"; }
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
pack() { (cd $OUT && tar czf results.tgz --exclude=results.tgz *.txt 2>/dev/null); }
lscpu > $OUT/lscpu.txt 2>&1
unxz .gpu/gt-s.xz $W/gt; chmod +x $W/gt
unxz .gpu/bench-new.xz $W/bench; chmod +x $W/bench
unxz .gpu/gen10m.pickle.xz $W/gen.pickle
el "unpacked $(stat -c %s $W/gen.pickle) bytes" >> $OUT/builds.txt
python3 measurements/ten_million/record_loop.py $W/rec.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec.txt 2>&1
el recorded >> $OUT/rec.txt
pack
for t in rec gen; do
  [ -f $W/$t.pickle ] || continue
  bash measurements/ten_million/measure.sh $W/gt $W/$t.pickle > $OUT/measure_$t.txt 2>&1
  el "measured $t" >> $OUT/builds.txt
  sleep 1; echo "screen $t $(python3 measurements/ten_million/first_frame.py $W/gt $W/$t.pickle)" >> $OUT/builds.txt
  pack
done
GPUMEM_TOP_BIG_TRACE=$W/gen.pickle $W/bench --bench 'frame/' --measurement-time 3 > $OUT/frames.txt 2>&1
el "frames" >> $OUT/builds.txt
pack
cd $OUT && rm -f *.txt
