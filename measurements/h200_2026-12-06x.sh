#!/usr/bin/env bash
# The 10M issue's figures for 05edbdb on whatever the device tool lends
# (an H200 was hoped for: no figure of the issue came from one yet): the
# frame benches over the generated 10M trace (.gpu/bench-x.xz, the jump
# `frame/big_jump_200x60_by_category` among them), then measure.sh on a
# fresh real 10M recording (ResNet-18 at batch 32) with the stripped
# release binary (.gpu/gt-x.xz), the screen's first frame on it, the frame
# benches over the recording, and the generated trace's frames again;
# each time the generated trace's frames are drawn, those of a build whose
# frames are drawn on up to four threads where 05edbdb drew them on two
# (.gpu/bench-y.xz), and of one that, besides, finds the map's rows on
# free threads and draws the timeline's stacked categories beside the
# rest of its plot (.gpu/bench-z.xz) beside them, in reverse order the
# second time.
# lscpu and the GPU first; packed after every stage.
set -u
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
W=$(mktemp -d)
unxz() { python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"), 1 << 22)' "$1" "$2"; }
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
pack() { (cd $OUT && tar czf results.tgz --exclude=results.tgz *.txt 2>/dev/null); }
lscpu > $OUT/lscpu.txt 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> $OUT/lscpu.txt 2>&1
unxz .gpu/gt-x.xz $W/gt; unxz .gpu/bench-x.xz $W/bench; unxz .gpu/bench-y.xz $W/pool; unxz .gpu/bench-z.xz $W/all
chmod +x $W/gt $W/bench $W/pool $W/all
unxz .gpu/gen10m.pickle.xz $W/gen.pickle
el "unpacked $(stat -c %s $W/gen.pickle) bytes" >> $OUT/builds.txt
frames() {
  echo "== $1 ${3:-bench}" >> $OUT/frames.txt
  GPUMEM_TOP_BIG_TRACE=$2 $W/${3:-bench} --bench 'frame/big' --measurement-time 3 2>&1 | grep -E "^frame|time:" >> $OUT/frames.txt
  el "frames $1" >> $OUT/builds.txt
  pack
}
frames "generated 1" $W/gen.pickle
frames "generated 1" $W/gen.pickle pool
frames "generated 1" $W/gen.pickle all
python3 measurements/ten_million/record_loop.py $W/rec.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec.txt 2>&1
el recorded >> $OUT/rec.txt
pack
if [ -f $W/rec.pickle ]; then
  bash measurements/ten_million/measure.sh $W/gt $W/rec.pickle > $OUT/measure_rec.txt 2>&1
  el "measured rec" >> $OUT/builds.txt
  sleep 1; echo "screen rec $(python3 measurements/ten_million/first_frame.py $W/gt $W/rec.pickle)" >> $OUT/builds.txt
  pack
  frames "recording" $W/rec.pickle
fi
# Within the call's 600 s.
if [ $(( $(date +%s) - T0 )) -lt 420 ]; then
  frames "generated 2" $W/gen.pickle all
  frames "generated 2" $W/gen.pickle pool
  frames "generated 2" $W/gen.pickle
fi
cd $OUT && rm -f *.txt
