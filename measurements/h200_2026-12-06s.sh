#!/usr/bin/env bash
# This session's frame changes at d1aa7f6 (the timeline beside the other
# panes, a rung behind the cursor, columns on the blocks' boundaries, the
# categories' samples twice as near): the big-trace frame benches of
# 6a67990 (.gpu/bench-h.xz) and d1aa7f6 (.gpu/bench-s.xz) alternating,
# old, new, old, new, over the generated 10M trace; then d1aa7f6's
# release binary (.gpu/gt-s.xz): the screen's
# first frame three times alternating with `replay --json`, measure.sh on
# the generated trace, and the gpt2 frame benches once. lscpu first;
# packed after every stage.
set -u
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
W=$(mktemp -d)
unxz() { python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"), 1 << 22)' "$1" "$2"; }
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
pack() { (cd $OUT && tar czf results.tgz --exclude=results.tgz *.txt 2>/dev/null); }
lscpu > $OUT/lscpu.txt 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> $OUT/lscpu.txt 2>&1
for b in bench-h bench-s gt-s; do unxz .gpu/$b.xz $W/$b; chmod +x $W/$b; done
unxz .gpu/gen10m.pickle.xz $W/gen.pickle
el "unpacked $(stat -c %s $W/gen.pickle) bytes" >> $OUT/builds.txt
pack
for r in 1 2; do
  for b in bench-h bench-s; do
    echo "== $b round $r" >> $OUT/frames.txt
    GPUMEM_TOP_BIG_TRACE=$W/gen.pickle $W/$b --bench 'frame/big' --measurement-time 3 2>&1 | grep -E "^frame|time:" >> $OUT/frames.txt
    el "frames $b $r" >> $OUT/builds.txt
    pack
  done
done
for i in 1 2 3; do
  sleep 1; s=$(date +%s%N); $W/gt-s replay $W/gen.pickle --json > /dev/null
  echo "replay $(( ($(date +%s%N) - s) / 1000000 )) ms" >> $OUT/builds.txt
  sleep 1; echo "screen $(python3 measurements/ten_million/first_frame.py $W/gt-s $W/gen.pickle)" >> $OUT/builds.txt
done
el "screens" >> $OUT/builds.txt
pack
bash measurements/ten_million/measure.sh $W/gt-s $W/gen.pickle > $OUT/measure_gen.txt 2>&1
el "measured" >> $OUT/builds.txt
pack
echo "== gpt2, bench-s" >> $OUT/frames.txt
$W/bench-s --bench 'frame/gpt2' --measurement-time 3 2>&1 | grep -E "^frame|time:" >> $OUT/frames.txt
el "gpt2 frames" >> $OUT/builds.txt
pack
cd $OUT && rm -f *.txt
