#!/usr/bin/env bash
# The call before measured `export --view timeline` of its recording at
# 1.73x that replay's time in measure.sh, once. Again, in rounds: .gpu/gt-n
# (36c4897) against .gpu/gt-z (d4c1766) on a fresh real 10M recording
# (ResNet-18 at batch 32) and on the generated 10M trace (carried
# xz-compressed as .gpu/gen10m.pickle.xz). lscpu; the recording; three
# rounds alternating of replay, --at peak and both exports of both builds,
# each run's wall and user seconds and peak RSS in rounds_<trace>.txt, the
# exports' outputs compared; then measure.sh of gt-n on each trace.
# Packed after every stage. Builds are stripped release builds.
set -u
for b in gt-z gt-n; do python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' .gpu/$b.xz .gpu/$b; chmod +x .gpu/$b; done
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
one() { # trace label bin args...
  local trace=$1 label=$2; shift 2
  sleep 1
  /usr/bin/time -f %e_s_user_%U_rss_%M "$@" > /dev/null 2> $W/err < /dev/null
  echo "$label rc $? $(tail -1 $W/err)" >> $OUT/rounds_$trace.txt
}
for t in rec gen; do
  [ -f $W/$t.pickle ] || continue
  for k in 1 2 3; do
    for b in z n; do
      one $t "replay_$b $k" .gpu/gt-$b replay $W/$t.pickle --json
      one $t "peak_$b $k" .gpu/gt-$b replay $W/$t.pickle --json --at peak
      one $t "timeline_$b $k" .gpu/gt-$b export $W/$t.pickle --view timeline --format txt -o $W/t_$b.txt --force
      one $t "fragmap_$b $k" .gpu/gt-$b export $W/$t.pickle --view fragmap --format svg -o $W/m_$b.svg --force
    done
    el "$t round $k" >> $OUT/builds.txt
    pack
  done
  cmp -s $W/t_z.txt $W/t_n.txt && echo "$t timeline same" >> $OUT/builds.txt || echo "$t timeline DIFFERS" >> $OUT/builds.txt
  cmp -s $W/m_z.svg $W/m_n.svg && echo "$t fragmap same" >> $OUT/builds.txt || echo "$t fragmap DIFFERS" >> $OUT/builds.txt
  pack
done
for t in rec gen; do
  bash measurements/ten_million/measure.sh .gpu/gt-n $W/$t.pickle > $OUT/measure_gt-n_$t.txt 2>&1
  el "measured gt-n on $t" >> $OUT/builds.txt
  pack
done
cd $OUT && rm -f *.txt
