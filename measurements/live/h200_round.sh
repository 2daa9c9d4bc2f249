#!/usr/bin/env bash
# On the GPU machine, from the repository root, with the release binary at
# $BIN (default .gpu/gpumem-top): the edited-script diff pair
# (measurements/diff/edited.py) and two `run -o` recordings of varying-shape
# GPT-2 training, without and with a 32 MiB-per-step leak
# (measurements/live/varying.py), and one with a sequence-length warmup.
# ONLY_LIVE=1 skips the diff pair; KINDS picks the recordings. Everything lands in $OUT/round.tar.gz.
set -uo pipefail
BIN=${BIN:-.gpu/gpumem-top}
OUT=${OUT:-$(mktemp -d)}
W=$(mktemp -d)
[ -n "${ONLY_LIVE:-}" ] || python3 measurements/diff/edited.py "$W/diff"
mkdir -p "$W/live"
for kind in ${KINDS:-varying leak warmup}; do
  LEAK=$([ "$kind" = leak ] && echo 1 || echo 0) WARMUP=$([ "$kind" = warmup ] && echo 1 || echo 0) "$BIN" run --interval 200 -o "$W/live/$kind.jsonl" \
    -- python3 measurements/live/varying.py > "$W/live/$kind.log" 2>&1
  echo "run $kind: rc $?"; tail -2 "$W/live/$kind.log"
  "$BIN" replay "$W/live/$kind.jsonl" --json > "$W/live/$kind.replay.json"; echo "replay $kind: rc $?"
done
rm -rf "$W/diff/work/__pycache__"
tar -czf "$OUT/round.tar.gz" -C "$W" .
ls -la "$OUT"
