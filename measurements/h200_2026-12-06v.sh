#!/usr/bin/env bash
# The 10M issue's own measurement for 7fb9b7b (.gpu/gt-v.xz, a stripped
# release build; a jump's seek beside its timeline): measure.sh on a fresh
# real 10M recording (ResNet-18 at batch 32), the screen's first frame on
# it, then every frame bench of the same build (.gpu/bench-u.xz) over the
# recording. lscpu and the GPU first; packed after every stage.
set -u
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
W=$(mktemp -d)
unxz() { python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"), 1 << 22)' "$1" "$2"; }
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
pack() { (cd $OUT && tar czf results.tgz --exclude=results.tgz *.txt 2>/dev/null); }
lscpu > $OUT/lscpu.txt 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> $OUT/lscpu.txt 2>&1
unxz .gpu/gt-v.xz $W/gt; chmod +x $W/gt
unxz .gpu/bench-u.xz $W/bench; chmod +x $W/bench
python3 measurements/ten_million/record_loop.py $W/rec.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec.txt 2>&1
el recorded >> $OUT/rec.txt
pack
if [ -f $W/rec.pickle ]; then
  bash measurements/ten_million/measure.sh $W/gt $W/rec.pickle > $OUT/measure_rec.txt 2>&1
  el "measured rec" >> $OUT/builds.txt
  sleep 1; echo "screen rec $(python3 measurements/ten_million/first_frame.py $W/gt $W/rec.pickle)" >> $OUT/builds.txt
  pack
  GPUMEM_TOP_BIG_TRACE=$W/rec.pickle $W/bench --bench 'frame/big' --measurement-time 3 2>&1 | grep -E "^frame|time:" > $OUT/frames_rec.txt
  el "frames rec" >> $OUT/builds.txt
  pack
fi
cd $OUT && rm -f *.txt
