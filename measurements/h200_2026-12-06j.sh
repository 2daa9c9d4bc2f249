#!/usr/bin/env bash
# The 10M issue's own measurement again, twice on each trace, for
# .gpu/gt-n (36c4897): measure.sh on a fresh real 10M recording (ResNet-18
# at batch 32) and on the generated 10M trace (carried xz-compressed as
# .gpu/gen10m.pickle.xz), then the screen's first frame twice on each.
# lscpu; packed after every stage. The build is a stripped release build.
set -u
python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' .gpu/gt-n.xz .gpu/gt-n; chmod +x .gpu/gt-n
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
pack() { (cd $OUT && tar czf results.tgz --exclude=results.tgz *.txt 2>/dev/null); }
lscpu > $OUT/lscpu.txt 2>&1
python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"), 1 << 22)' .gpu/gen10m.pickle.xz $W/gen.pickle
el "unpacked $(stat -c %s $W/gen.pickle) bytes" >> $OUT/builds.txt
python3 measurements/ten_million/record_loop.py $W/rec.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec.txt 2>&1
el recorded >> $OUT/rec.txt
pack
for k in 1 2; do
  for t in rec gen; do
    [ -f $W/$t.pickle ] || continue
    bash measurements/ten_million/measure.sh .gpu/gt-n $W/$t.pickle > $OUT/measure_${t}_$k.txt 2>&1
    el "measured $t $k" >> $OUT/builds.txt
    pack
  done
done
for t in rec gen; do
  for k in 1 2; do
    sleep 1; echo "screen $t $k $(python3 measurements/ten_million/first_frame.py .gpu/gt-n $W/$t.pickle)" >> $OUT/builds.txt
  done
  pack
done
cd $OUT && rm -f *.txt
