#!/usr/bin/env bash
# Builds made with time marks (each writes its marks and its threads' CPU
# times to /tmp/gt-marks.txt; such builds are not committed), run
# alternating: each round runs every build once on TRACE. Each run's marks
# are kept as DIR/marks_<build>_<round>.txt and its wall and user seconds
# and peak RSS appended to DIR/builds.txt.
#   bash measurements/ten_million/marked_runs.sh DIR TRACE ROUNDS BUILD...
set -u
dir=$1; trace=$2; rounds=$3; shift 3
for k in $(seq 1 "$rounds"); do
  for bin in "$@"; do
    b=$(basename "$bin")
    sleep 1; rm -f /tmp/gt-marks.txt
    /usr/bin/time -f "$b $k replay %e s user %U rss %M KB" timeout 60 "$bin" replay "$trace" --json > /dev/null 2>> "$dir/builds.txt"
    cp /tmp/gt-marks.txt "$dir/marks_${b}_$k.txt"
  done
done
