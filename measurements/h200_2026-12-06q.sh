#!/usr/bin/env bash
# This session's first look, at 6a67990 (.gpu/gt-h.xz, a stripped release
# build; .gpu/bench-h.xz, its frame benches): which host the device tool
# lends now (lscpu), measure.sh on the generated 10M trace, the screen's
# first frame three times alternating with `replay --json`, then every
# frame bench over the generated trace. Packed after every stage.
set -u
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
W=$(mktemp -d)
unxz() { python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"), 1 << 22)' "$1" "$2"; }
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
pack() { (cd $OUT && tar czf results.tgz --exclude=results.tgz *.txt 2>/dev/null); }
lscpu > $OUT/lscpu.txt 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> $OUT/lscpu.txt 2>&1
unxz .gpu/gt-h.xz $W/gt; chmod +x $W/gt
unxz .gpu/bench-h.xz $W/bench; chmod +x $W/bench
unxz .gpu/gen10m.pickle.xz $W/gen.pickle
el "unpacked $(stat -c %s $W/gen.pickle) bytes" >> $OUT/builds.txt
pack
GPUMEM_TOP_BIG_TRACE=$W/gen.pickle $W/bench --bench 'frame/' --measurement-time 3 > $OUT/frames.txt 2>&1
el "frames" >> $OUT/builds.txt
pack
for i in 1 2 3; do
  sleep 1; s=$(date +%s%N); $W/gt replay $W/gen.pickle --json > /dev/null
  echo "replay $(( ($(date +%s%N) - s) / 1000000 )) ms" >> $OUT/builds.txt
  sleep 1; echo "screen $(python3 measurements/ten_million/first_frame.py $W/gt $W/gen.pickle)" >> $OUT/builds.txt
done
el "screens" >> $OUT/builds.txt
pack
bash measurements/ten_million/measure.sh $W/gt $W/gen.pickle > $OUT/measure_gen.txt 2>&1
el "measured" >> $OUT/builds.txt
pack
cd $OUT && rm -f *.txt
