#!/usr/bin/env bash
# Regenerates tools/hot-functions.txt (the code layout of
# tools/build-monitor.sh): runs the dist build under valgrind's callgrind as
# the live TUI beside a publishing process (benches/live/local_cost.py: a
# stand-in NVML and recorded training states, no GPU needed) and lists every
# function of ours it executed, start-up included. Run it after changing what
# the live view does; a stale list still works, only less well.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in valgrind cc nm python3; do
  command -v "$tool" >/dev/null || { echo "profile-hot-functions: needs $tool" >&2; exit 2; }
done
out="${CARGO_TARGET_DIR:-target}/monitor/dist"
tools/build-monitor.sh
cg=$(mktemp)
trap 'rm -f "$cg"' EXIT
python3 benches/live/local_cost.py --seconds "${1:-20}" --callgrind "$cg" "$out/gpumem-top"
python3 tools/link_order.py hot "$out/gpumem-top" "$cg" >tools/hot-functions.txt
echo "profile-hot-functions: $(wc -l <tools/hot-functions.txt) functions in tools/hot-functions.txt" >&2
