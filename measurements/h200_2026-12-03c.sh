#!/usr/bin/env bash
# The third H200 call of 2026-12-03 (docs/user/fit.md "Batch-split
# buffers" and "Without a GPU", docs/measurements/benchmarks.md): where
# cuDNN stops splitting weight gradients over the batch (EfficientNet-B0 bf16
# and MobileNetV3-L at 48..112), fit --no-gpu under 16 GiB for T5 and
# ConvNeXt with the GPU hidden, a 3M-event trace's replay timed in detail.
set -u
BIN=$PWD/.gpu/gpumem-top
W=$(mktemp -d); R=$W/res; mkdir -p $R/split
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
( for b in 48 64 80 96 112; do python3 measurements/fit/train.py --model efficientnet --dtype bf16 --steps 3 --batch-size $b --snapshot $R/split/eff_$b.pickle > $R/split/eff_$b.txt 2>&1 & done; wait
  for b in 64 96; do python3 measurements/fit/train.py --model mobilenet --steps 3 --batch-size $b --snapshot $R/split/mob_$b.pickle > $R/split/mob_$b.txt 2>&1 & done; wait
  gzip -9 $R/split/*.pickle; el split >> $R/split/done.txt; tar czf $OUT/split.tgz -C $R split ) &
( mkdir -p $R/ng
  CUDA_VISIBLE_DEVICES= timeout 280 $BIN fit --no-gpu --batches 8,16 --batch 32 --memory-limit 16GiB --json -- python3 measurements/nogpu/train_lm.py --model t5 --seq 256 --amp --batch-size {batch} > $R/ng/t5_bf16.json 2> $R/ng/t5_bf16.err; el t5 >> $R/ng/done.txt ) &
( mkdir -p $R/ng2
  CUDA_VISIBLE_DEVICES= timeout 280 $BIN fit --no-gpu --batches 8,16 --batch 64 --memory-limit 16GiB --json -- python3 measurements/nogpu/train_cnn.py --model convnext_tiny --amp --optim adamw --batch-size {batch} > $R/ng2/convnext.json 2> $R/ng2/convnext.err; el convnext >> $R/ng2/done.txt ) &
( python3 measurements/ten_million/record_loop.py $W/rn18_3m.pickle --model resnet18 --events 3000000 --max-entries 3000000 --budget 60 > $R/rec3m.txt 2>&1
  for i in 1 2; do /usr/bin/time -f "replay %e s user %U sys %S rss %M KB majflt %F minflt %R ctx %c/%w" $BIN replay $W/rn18_3m.pickle --json > /dev/null 2>> $R/rec3m.txt; done
  /usr/bin/time -f "pickle.load %e s user %U sys %S rss %M KB minflt %R" python3 -c 'import pickle,sys; pickle.load(open(sys.argv[1],"rb"))' $W/rn18_3m.pickle 2>> $R/rec3m.txt
  MALLOC_ARENA_MAX=1 /usr/bin/time -f "replay arena1 %e s user %U sys %S rss %M KB minflt %R" $BIN replay $W/rn18_3m.pickle --json > /dev/null 2>> $R/rec3m.txt
  taskset -c 2 /usr/bin/time -f "replay 1cpu %e s user %U sys %S rss %M KB minflt %R" $BIN replay $W/rn18_3m.pickle --json > /dev/null 2>> $R/rec3m.txt
  lscpu | head -20 >> $R/rec3m.txt; cat /sys/kernel/mm/transparent_hugepage/enabled >> $R/rec3m.txt 2>&1
  cp $R/rec3m.txt $OUT/rec3m.txt ) &
wait
tar czf $OUT/ng.tgz -C $R ng ng2
el all > $OUT/done.txt
