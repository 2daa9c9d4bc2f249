#!/usr/bin/env bash
# tune's lanes cut (split limits riding, frees in one step) and diff's
# second decoding started sooner, on a fresh real 10M recording (ResNet-18
# at batch 32) and on the generated 10M trace (carried xz-compressed as
# .gpu/gen10m.pickle.xz, as in h200_2026-12-06d.sh). Builds (not
# committed; each reads GT_LEXERS, the lexing threads, and GT_DIFF_AT,
# diff's second decoding started once 1/GT_DIFF_AT of the first file is
# read, default 2): .gpu/gt-h (322486d), .gpu/gt-y (the working tree: split
# limits riding, frees in one step), .gpu/gt-ym (gt-y with time marks and
# each thread's CPU time). lscpu; the recording; measure.sh of gt-y on
# each trace; three rounds alternating of replay and tune of both builds
# and diff of gt-y starting its second decoding at a half and at a third,
# each run's wall and user seconds and peak RSS in rounds_<trace>.txt and
# its report kept to compare; the marked build's tune twice. Packed after
# every stage.
set -u
for b in gt-h gt-y gt-ym; do python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' .gpu/$b.xz .gpu/$b; chmod +x .gpu/$b; done
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
one() { # trace label env... bin args...
  local trace=$1 label=$2; shift 2
  sleep 1
  env "$@" > $W/out.json 2> $W/err < /dev/null
  echo "$label rc $? $(tail -1 $W/err)" >> $OUT/rounds_$trace.txt
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); r.pop("elapsed_ms",None); json.dump(r,open(sys.argv[2],"w"),sort_keys=True)' $W/out.json $OUT/${trace}_${label%% *}.json 2>/dev/null
}
T='/usr/bin/time -f %e_s_user_%U_rss_%M'
for t in rec gen; do
  [ -f $W/$t.pickle ] || continue
  bash measurements/ten_million/measure.sh .gpu/gt-y $W/$t.pickle > $OUT/measure_gt-y_$t.txt 2>&1
  el "measured gt-y on $t" >> $OUT/builds.txt
  pack
  for k in 1 2 3; do
    one $t "replay_h $k" $T .gpu/gt-h replay $W/$t.pickle --json
    one $t "replay_y $k" $T .gpu/gt-y replay $W/$t.pickle --json
    one $t "tune_h $k" $T .gpu/gt-h tune $W/$t.pickle --json
    one $t "tune_y $k" $T .gpu/gt-y tune $W/$t.pickle --json
    one $t "diff_y_at2 $k" $T .gpu/gt-y diff $W/$t.pickle $W/$t.pickle --json
    one $t "diff_y_at3 $k" GT_DIFF_AT=3 $T .gpu/gt-y diff $W/$t.pickle $W/$t.pickle --json
    el "$t round $k" >> $OUT/builds.txt
    pack
  done
done
for k in 1 2; do
  sleep 1; rm -f /tmp/gt-marks.txt
  /usr/bin/time -f "ym tune gen $k %e s user %U rss %M KB" .gpu/gt-ym tune $W/gen.pickle --json > /dev/null 2>> $OUT/builds.txt
  cp /tmp/gt-marks.txt $OUT/marks_tune_$k.txt
done
el marked >> $OUT/builds.txt
pack
cd $OUT && rm -f *.txt *.json
