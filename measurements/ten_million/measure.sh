#!/usr/bin/env bash
# Each command on a big snapshot beside CPython merely unpickling it, in one
# run on one machine: wall seconds and peak RSS (time(1)), and the ratios.
#   bash measurements/ten_million/measure.sh GPUMEM_TOP TRACE [TRACE_B]
# TRACE_B (default TRACE) is diff's second run. Prints a Markdown table.
set -euo pipefail
bin=$1; a=$2; b=${3:-$2}
out=$(mktemp -d)
events=$("$bin" replay "$a" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['events'])")
row() {
  local name=$1; shift
  sleep 1
  local t0 t1 kb
  t0=$(date +%s%N)
  /usr/bin/time -f "%M" -o "$out/rss" "$@" >/dev/null 2>"$out/err" || { echo "$name failed: $(head -c 300 "$out/err")" >&2; exit 1; }
  kb=$(tail -1 "$out/rss")
  t1=$(date +%s%N)
  local s; s=$(awk -v n="$(( t1 - t0 ))" 'BEGIN {printf "%.2f", n / 1e9}')
  echo "$name|$s|$kb"
}
rows=()
rows+=("$(row 'python3 pickle.load' python3 -c 'import pickle,sys; pickle.load(open(sys.argv[1],"rb"))' "$a")")
rows+=("$(row 'replay --json' "$bin" replay "$a" --json)")
rows+=("$(row 'replay --json --at peak' "$bin" replay "$a" --json --at peak)")
rows+=("$(row 'tune --json' "$bin" tune "$a" --json)")
rows+=("$(row 'export --view timeline --format txt' "$bin" export "$a" --view timeline --format txt -o "$out/t.txt")")
rows+=("$(row 'export --view fragmap --format svg' "$bin" export "$a" --view fragmap --format svg -o "$out/m.svg")")
rows+=("$(row 'diff A B --json' "$bin" diff "$a" "$b" --json)")
py=$(echo "${rows[0]}" | cut -d'|' -f2); rp=$(echo "${rows[1]}" | cut -d'|' -f2); rk=$(echo "${rows[1]}" | cut -d'|' -f3)
echo "trace: $a ($events events, $(stat -c %s "$a") bytes); machine: $(nproc) cores"
echo
echo "| command | wall s | peak RSS MiB | bytes per event | × replay time | × pickle.load time |"
echo "|---|---|---|---|---|---|"
for r in "${rows[@]}"; do
  IFS='|' read -r name s kb <<<"$r"
  awk -v n="$name" -v s="$s" -v kb="$kb" -v ev="$events" -v rp="$rp" -v py="$py" \
    'BEGIN {printf "| %s | %.2f | %.0f | %.0f | %.2f | %.3f |\n", n, s, kb/1024, kb*1024/ev, s/rp, s/py}'
done
rm -rf "$out"
