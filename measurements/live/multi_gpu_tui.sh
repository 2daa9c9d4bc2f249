# Issue 8 on a machine with several GPUs: the real TUI in tmux (and a pty) beside
# `synth --backend cuda --device 1`; run from the repository root with the
# bundle in .gpu and $OUT set (the device tool sets it).
set -u
B=$PWD/.gpu/gpumem-top
which tmux || echo "no tmux"
nvidia-smi --query-gpu=index,uuid,memory.used --format=csv
$B synth --backend cuda --device 1 --model gpt2 --iterations 100000 --json > $OUT/synth.json 2>$OUT/synth.err & SP=$!
sleep 4
if which tmux >/dev/null; then
  tmux new-session -d -s m -x 160 -y 45 "$B"; sleep 2.5
  tmux capture-pane -p -t m > $OUT/tui-1.txt
  tmux send-keys -t m 2; sleep 1.5; tmux capture-pane -p -t m > $OUT/tui-2.txt
  tmux send-keys -t m 3; sleep 0.7; tmux capture-pane -p -t m > $OUT/tui-3.txt
  tmux send-keys -t m q; sleep 0.5
  head -12 $OUT/tui-1.txt; head -12 $OUT/tui-2.txt; tail -3 $OUT/tui-3.txt
fi
python3 measurements/live/tui_pty.py 160 45 $OUT/tui-raw.bin "2.5:2,4.0:3,5.0:q" $B
$B --json > $OUT/json.json; head -c 600 $OUT/json.json; echo
kill -INT $SP; wait $SP; echo "synth rc=$?"; head -c 300 $OUT/synth.json; cat $OUT/synth.err | tail -2
nvidia-smi --query-gpu=index,memory.used --format=csv
