#!/usr/bin/env bash
# Two builds' `replay --json` of one trace, alternating, on one machine in
# one run (a lease's speed moves by a third from call to call, so builds
# are only compared side by side): each run's wall and user seconds and
# peak RSS, each build's median, and whether the two builds' reports are
# the same (`elapsed_ms` aside).
#   bash measurements/ten_million/alternate.sh OLD NEW TRACE [ROUNDS]
# ROUNDS defaults to 4. Prints a Markdown table; exits 1 where the reports
# differ or a run fails.
set -euo pipefail
old=$1; new=$2; trace=$3; rounds=${4:-4}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "| round | build | wall s | user s | peak RSS KB |"
echo "|---|---|---|---|---|"
for k in $(seq 1 "$rounds"); do
  for b in old new; do
    bin=$old; [ "$b" = new ] && bin=$new
    sleep 1
    /usr/bin/time -f "%e %U %M" -o "$out/time" "$bin" replay "$trace" --json > "$out/$b.json" 2> "$out/err" \
      || { echo "$b failed: $(head -c 300 "$out/err")" >&2; exit 1; }
    read -r wall user kb < <(tail -1 "$out/time")
    echo "$wall" >> "$out/$b.walls"
    echo "| $k | $b | $wall | $user | $kb |"
  done
done
median() { sort -n "$1" | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
echo
echo "median wall: old $(median "$out/old.walls") s, new $(median "$out/new.walls") s"
python3 - "$out/old.json" "$out/new.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
for r in (a, b):
    r.pop("elapsed_ms", None)
print("reports the same:", a == b)
sys.exit(0 if a == b else 1)
PY
