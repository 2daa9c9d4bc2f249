#!/usr/bin/env bash
# The short form of h200_2026-12-06c.sh, for a call with too little device
# time left for a recording: the generated 10M trace
# (`python3 tools/big-snapshot.py resnet50_long.pickle.gz gen10m.pickle
# --events 10000000`: 10,002,199 events, 780,389,027 bytes), carried
# xz-compressed as .gpu/gen10m.pickle.xz. measure.sh of .gpu/gt-c
# (b404dd5) and .gpu/gt-h (b4b0550); `replay --json` of the two
# alternating, every report compared; the screen's first frame twice;
# measure.sh of gt-c again. Packed after every stage.
set -u
for b in gt-h gt-c; do gunzip -c .gpu/$b.gz > .gpu/$b; chmod +x .gpu/$b; done
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
pack() { (cd $OUT && tar czf results.tgz --exclude=results.tgz *.txt); }
python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"), 1 << 22)' .gpu/gen10m.pickle.xz $W/g.pickle
el "unpacked $(stat -c %s $W/g.pickle) bytes" >> $OUT/builds.txt
for b in gt-c gt-h; do
  bash measurements/ten_million/measure.sh .gpu/$b $W/g.pickle > $OUT/measure_${b}_1.txt 2>&1
  el "measured $b" >> $OUT/builds.txt
  pack
done
bash measurements/ten_million/alternate.sh .gpu/gt-h .gpu/gt-c $W/g.pickle 3 > $OUT/alternate.txt 2>&1
el alternated >> $OUT/builds.txt
pack
for k in 1 2; do
  sleep 1; echo "screen $k $(python3 measurements/ten_million/first_frame.py .gpu/gt-c $W/g.pickle)" >> $OUT/builds.txt
done
el screens >> $OUT/builds.txt
pack
bash measurements/ten_million/measure.sh .gpu/gt-c $W/g.pickle > $OUT/measure_gt-c_2.txt 2>&1
el "measured gt-c 2" >> $OUT/builds.txt
pack
cd $OUT && rm -f *.txt
