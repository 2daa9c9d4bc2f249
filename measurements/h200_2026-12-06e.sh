#!/usr/bin/env bash
# tune's lanes beside the decoding, on the generated 10M trace (carried
# xz-compressed as .gpu/gen10m.pickle.xz, as in h200_2026-12-06d.sh).
# Builds (not committed; each reads GT_LEXERS, the lexing threads, where
# set): .gpu/gt-h (322486d), .gpu/gt-x (322486d with max_split_size
# settings riding on a lane while no request could reach them, and
# GT_NICE: the nice value tune's lanes set themselves to), .gpu/gt-xm
# (gt-x with time marks and each thread's CPU time). Three rounds of every
# command alternating, each run's wall and user seconds and peak RSS in
# rounds.txt and its report kept to compare; the marked build's marks;
# measure.sh of gt-x. Packed after every stage.
set -u
for b in gt-h gt-x gt-xm; do python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' .gpu/$b.xz .gpu/$b; chmod +x .gpu/$b; done
W=$(mktemp -d)
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
pack() { (cd $OUT && tar czf results.tgz --exclude=results.tgz *.txt *.json 2>/dev/null); }
python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"), 1 << 22)' .gpu/gen10m.pickle.xz $W/g.pickle
el "unpacked $(stat -c %s $W/g.pickle) bytes" >> $OUT/builds.txt
one() { # label env... -- bin args...
  local label=$1; shift
  sleep 1
  env "$@" > $W/out.json 2> $W/err < /dev/null
  echo "$label rc $? $(tail -1 $W/err)" >> $OUT/rounds.txt
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); r.pop("elapsed_ms",None); json.dump(r,open(sys.argv[2],"w"),sort_keys=True)' $W/out.json $OUT/${label%% *}.json 2>/dev/null
}
T='/usr/bin/time -f %e_s_user_%U_rss_%M'
for k in 1 2 3; do
  one "replay_h $k" $T .gpu/gt-h replay $W/g.pickle --json
  one "tune_h $k" $T .gpu/gt-h tune $W/g.pickle --json
  one "tune_x $k" $T .gpu/gt-x tune $W/g.pickle --json
  one "tune_x_n19 $k" GT_NICE=19 $T .gpu/gt-x tune $W/g.pickle --json
  one "tune_x_n10 $k" GT_NICE=10 $T .gpu/gt-x tune $W/g.pickle --json
  one "tune_x_n19_l8 $k" GT_NICE=19 GT_LEXERS=8 $T .gpu/gt-x tune $W/g.pickle --json
  one "diff_x $k" $T .gpu/gt-x diff $W/g.pickle $W/g.pickle --json
  one "diff_x_l8 $k" GT_LEXERS=8 $T .gpu/gt-x diff $W/g.pickle $W/g.pickle --json
  one "replay_x $k" $T .gpu/gt-x replay $W/g.pickle --json
  el "round $k" >> $OUT/builds.txt
  pack
done
for k in 1 2; do
  for n in 0 19; do
    sleep 1; rm -f /tmp/gt-marks.txt
    GT_NICE=$n /usr/bin/time -f "xm tune nice $n $k %e s user %U rss %M KB" .gpu/gt-xm tune $W/g.pickle --json > /dev/null 2>> $OUT/builds.txt
    cp /tmp/gt-marks.txt $OUT/marks_tune_n${n}_$k.txt
  done
  sleep 1; rm -f /tmp/gt-marks.txt
  /usr/bin/time -f "xm replay $k %e s user %U rss %M KB" .gpu/gt-xm replay $W/g.pickle --json > /dev/null 2>> $OUT/builds.txt
  cp /tmp/gt-marks.txt $OUT/marks_replay_$k.txt
done
el marked >> $OUT/builds.txt
pack
GT_NICE=19 bash measurements/ten_million/measure.sh .gpu/gt-x $W/g.pickle > $OUT/measure_gt-x_n19.txt 2>&1
el "measured gt-x" >> $OUT/builds.txt
pack
cd $OUT && rm -f *.txt *.json
