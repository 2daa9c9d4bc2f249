#!/usr/bin/env bash
# .gpu/gt-n (36c4897: a free and its completion one step of the replay)
# against .gpu/gt-z (d4c1766), on a fresh real 10M recording (ResNet-18
# at batch 32) and on the generated 10M trace (carried xz-compressed as
# .gpu/gen10m.pickle.xz). lscpu; the recording; measure.sh of gt-n on
# each trace; three rounds alternating of replay, tune and diff of both
# builds, each run's wall and user seconds and peak RSS in
# rounds_<trace>.txt and its report kept to compare; two replays of
# .gpu/gt-m (gt-n with time marks and each thread's CPU time; not
# committed) with their marks; the screen's first frame twice on each
# trace. Packed after every stage. Builds are stripped release builds.
set -u
for b in gt-z gt-n gt-m; do python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' .gpu/$b.xz .gpu/$b; chmod +x .gpu/$b; done
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
pack() { (cd $OUT && tar czf results.tgz --exclude=results.tgz *.txt *.json 2>/dev/null); }
lscpu > $OUT/lscpu.txt 2>&1
python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"), 1 << 22)' .gpu/gen10m.pickle.xz $W/gen.pickle
el "unpacked $(stat -c %s $W/gen.pickle) bytes" >> $OUT/builds.txt
python3 measurements/ten_million/record_loop.py $W/rec.pickle --model resnet18 --batch 32 --events 10000000 --max-entries 10000000 --budget 200 > $OUT/rec.txt 2>&1
el recorded >> $OUT/rec.txt
pack
one() { # trace label bin args...
  local trace=$1 label=$2; shift 2
  sleep 1
  /usr/bin/time -f %e_s_user_%U_rss_%M "$@" > $W/out.json 2> $W/err < /dev/null
  echo "$label rc $? $(tail -1 $W/err)" >> $OUT/rounds_$trace.txt
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); r.pop("elapsed_ms",None); json.dump(r,open(sys.argv[2],"w"),sort_keys=True)' $W/out.json $OUT/${trace}_${label%% *}.json 2>/dev/null
}
for t in rec gen; do
  [ -f $W/$t.pickle ] || continue
  bash measurements/ten_million/measure.sh .gpu/gt-n $W/$t.pickle > $OUT/measure_gt-n_$t.txt 2>&1
  el "measured gt-n on $t" >> $OUT/builds.txt
  pack
  for k in 1 2 3; do
    for b in z n; do
      one $t "replay_$b $k" .gpu/gt-$b replay $W/$t.pickle --json
      one $t "tune_$b $k" .gpu/gt-$b tune $W/$t.pickle --json
      one $t "diff_$b $k" .gpu/gt-$b diff $W/$t.pickle $W/$t.pickle --json
    done
    el "$t round $k" >> $OUT/builds.txt
    pack
  done
  for k in 1 2; do
    sleep 1; rm -f /tmp/gt-marks.txt
    /usr/bin/time -f %e_s_user_%U_rss_%M .gpu/gt-m replay $W/$t.pickle --json > /dev/null 2> $W/err < /dev/null
    echo "marked $t $k $(tail -1 $W/err)" >> $OUT/builds.txt
    cp /tmp/gt-marks.txt $OUT/marks_${t}_$k.txt
  done
  for k in 1 2; do
    sleep 1; echo "screen $t $k $(python3 measurements/ten_million/first_frame.py .gpu/gt-n $W/$t.pickle)" >> $OUT/builds.txt
  done
  pack
done
cd $OUT && rm -f *.txt *.json
