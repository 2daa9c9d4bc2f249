#!/usr/bin/env bash
# The second H200 round of 2026-12-03 (docs/user/fit.md "Batch-split
# buffers" and "Without a GPU", docs/measurements/benchmarks.md): EfficientNet
# bf16/fp16 snapshots at 32 and 128, T5 under the recorder with the GPU
# hidden, real bisections of T5 and ConvNeXt under 16 GiB, a real
# 10M-event trace measured. Run from the repository root with the release
# binary at .gpu/gpumem-top; results under $OUT.
set -u
BIN=$PWD/.gpu/gpumem-top
W=$(mktemp -d); R=$W/res; mkdir -p $R
T0=$(date +%s)
el() { echo "$1 $(( $(date +%s) - T0 )) s"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/smi.txt
python3 -c "import torch, transformers, torchvision; print(torch.__version__, transformers.__version__, torchvision.__version__)" >> $OUT/smi.txt 2>&1
( python3 measurements/ten_million/record_loop.py $W/rn18_10m.pickle --model resnet18 --events 10000000 --max-entries 10000000 --budget 200 > $W/record10m.txt 2>&1; el record >> $W/record10m.txt ) &
P10=$!
( mkdir -p $R/eff
  for dt in bf16 fp16; do
    timeout 150 $BIN fit --batches 32,128 --record-dir $R/eff/$dt -- python3 measurements/fit/train.py --model efficientnet --dtype $dt --steps 6 --batch-size {batch} > $R/eff/$dt.txt 2>&1
  done
  el eff >> $R/eff/done.txt; tar czf $OUT/eff.tgz -C $R eff ) &
( mkdir -p $R/t5
  for amp in --amp ""; do n=t5${amp:+_bf16}
    CUDA_VISIBLE_DEVICES= timeout 200 $BIN fit --no-gpu --batches 8,16 --batch 32 --json --record-dir $R/t5/${n}_fake -- python3 measurements/nogpu/train_lm.py --model t5 --seq 256 $amp --batch-size {batch} > $R/t5/${n}_fake.json 2> $R/t5/${n}_fake.err
    el $n >> $R/t5/done.txt
  done
  rm -f $R/t5/*/*.pickle; tar czf $OUT/t5.tgz -C $R t5 ) &
( timeout 330 python3 measurements/nogpu/bisect.py --start 32 --max 512 -- python3 measurements/nogpu/train_lm.py --model t5 --seq 256 --amp --batch-size {batch} --limit-gib 16 > $OUT/bisect_t5.txt 2>&1; el t5bisect >> $OUT/bisect_t5.txt ) &
( timeout 330 python3 measurements/nogpu/bisect.py --start 64 --max 1024 -- python3 measurements/nogpu/train_cnn.py --model convnext_tiny --amp --optim adamw --batch-size {batch} --limit-gib 16 > $OUT/bisect_convnext.txt 2>&1; el cnbisect >> $OUT/bisect_convnext.txt ) &
wait $P10
wait
el phase1 > $OUT/measure10m.txt
cat $W/record10m.txt >> $OUT/measure10m.txt
ls -la $W >> $OUT/measure10m.txt
timeout 200 bash measurements/ten_million/measure.sh $BIN $W/rn18_10m.pickle >> $OUT/measure10m.txt 2>&1
el all >> $OUT/measure10m.txt
