#!/usr/bin/env bash
# `gpumem-top run` beside GPT-2 training on a GPU machine (docs/user/live.md has
# what it measured). From the repository root, with the release binary at
# $BIN (default target/release/gpumem-top) and $OUT for the results:
#
#   bash measurements/live/beside_gpt2.sh
#
# 1. The publisher's cost: median step time of the same script alone and
#    under `run --step-peaks`, without and with history recording (the
#    script records history itself for the baseline), two rounds each.
# 2. Step peaks: the recording's per-step peaks against the script's own
#    max_memory_allocated()/max_memory_reserved() at each step end, fixed
#    shapes (script never resets: running maximum) and varying shapes
#    (script resets before each step).
# 3. A snapshot taken mid-run (`gpumem-top snapshot`), replayed.
# 4. The live view in tmux (when there is one): the screen, `S`, the
#    replay of the snapshot, `q` back to the live view.
set -uo pipefail
root=$PWD
BIN=$(realpath "${BIN:-target/release/gpumem-top}")
S=$root/measurements/live
# Everything is written in $WORK; $OUT gets the screens and results.txt.
O=${WORK:-$(mktemp -d)}
R=${OUT:-$O}
mkdir -p "$O" "$R" && cd "$O"
exec > >(tee "$R/results.txt") 2>&1
export GPUMEM_TOP_BIN=$BIN
N=${STEPS:-150}
H=100000
train() { python3 "$S/gpt2_steps.py" --steps "$N" "$@"; }
for round in 1 2; do
  echo "== round $round"
  echo -n "alone:                 "; train --out A$round.json
  echo -n "run --step-peaks:      "; "$BIN" run --step-peaks -o B$round.jsonl -- python3 "$S/gpt2_steps.py" --steps "$N" --out B$round.json 2>B$round.err
  echo -n "alone, history:        "; train --history $H --out C$round.json
  snap=(); [[ $round == 1 ]] && snap=(--snapshot-at 100)
  echo -n "run, history:          "; SNAPSHOT_OUT=$O/D1.pickle "$BIN" run --step-peaks --history $H -o D$round.jsonl -- python3 "$S/gpt2_steps.py" --steps "$N" "${snap[@]}" --out D$round.json 2>D$round.err
done
echo "== varying shapes, script resets its peaks each step"
"$BIN" run --step-peaks -o E.jsonl -- python3 "$S/gpt2_steps.py" --steps 100 --varying --reset --out E.json 2>E.err
echo "== step peaks against the script's readings"
for x in B1 B2 D1 D2 E; do
  "$BIN" replay $x.jsonl --json > $x.replay.json
  mode=--running-max; [[ $x == E ]] && mode=
  echo -n "$x: "; python3 "$S/compare_steps.py" $x.replay.json $x.json $mode
done
echo "== the snapshot taken at step 100"
ls -l D1.pickle
"$BIN" replay D1.pickle --json | python3 -c 'import json,sys; j=json.load(sys.stdin); print("fidelity", j["fidelity"], "events", j["events"], "peak", j["peak"])'
if command -v tmux >/dev/null; then
  echo "== the live view in tmux"
  tmux new-session -d -s beside -x 160 -y 50 -c "$O" \
    "'$BIN' run --step-peaks --history $H -- python3 '$S/gpt2_steps.py' --steps 400 --varying --out F.json; echo EXIT \$?; sleep 60"
  sleep 25; tmux capture-pane -p -t beside > F-live.txt
  tmux send-keys -t beside S; sleep 10; tmux capture-pane -p -t beside > F-replay.txt
  tmux send-keys -t beside q; sleep 3; tmux capture-pane -p -t beside > F-back.txt
  for i in $(seq 1 60); do grep -q "q quits" <(tmux capture-pane -p -t beside) && break; sleep 1; done
  tmux capture-pane -p -t beside > F-done.txt
  tmux send-keys -t beside q; sleep 2; tmux capture-pane -p -t beside > F-exit.txt
  tmux kill-session -t beside
  ls gpumem-top-snapshot-* gpumem-top-run-*.log 2>/dev/null
  cp F-*.txt "$R/" 2>/dev/null
  tail -3 gpumem-top-run-*.log
else
  echo "== no tmux here: the live view is not captured"
fi
