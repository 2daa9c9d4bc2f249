#!/usr/bin/env bash
# The H200 round of 2026-12-03 (docs/measurements/benchmarks.md "A real
# recording", docs/user/fit.md "Reach" and "Without a GPU"): run on the
# GPU machine from the repository root with the release binary at
# .gpu/gpumem-top; results under $OUT. In parallel: a real 10M-event
# ResNet-18 recording, T5 real samples and the recorder with the GPU
# hidden, the reach of fit under four conditions; then measure.sh alone.
set -u
BIN=$PWD/.gpu/gpumem-top
W=$(mktemp -d); R=$W/res; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/smi.txt
nproc >> $R/smi.txt; python3 -c "import torch, transformers, torchvision; print(torch.__version__, transformers.__version__, torchvision.__version__)" >> $R/smi.txt 2>&1
T0=$(date +%s)
( python3 measurements/ten_million/record_loop.py $W/rn18_10m.pickle --model resnet18 --events 10000000 --max-entries 10000000 --budget 230 > $R/record10m.txt 2>&1; echo "record done $(( $(date +%s) - T0 )) s" >> $R/record10m.txt ) &
( for amp in --amp ""; do n=t5${amp:+_bf16}
    timeout 200 $BIN fit --batches 8,16 --steps 3 --record-dir $R/${n}_real -- python3 measurements/nogpu/train_lm.py --model t5 --seq 256 $amp --batch-size {batch} > $R/${n}_real.txt 2>&1
    CUDA_VISIBLE_DEVICES= timeout 200 $BIN fit --no-gpu --batches 8,16 --batch 32 --record-dir $R/${n}_fake -- python3 measurements/nogpu/train_lm.py --model t5 --seq 256 $amp --batch-size {batch} > $R/${n}_fake.txt 2>&1
  done; echo "t5 done $(( $(date +%s) - T0 )) s" > $R/t5_done.txt ) &
( BIN=$BIN OUT=$R/reach TARGETS="128" SPECS="effnet_bf16 300 460 --model efficientnet --dtype bf16;effnet_bench 200 460 --model efficientnet --cudnn-benchmark;effnet_fp32 100 300 --model efficientnet --dtype fp32;mobilenet_bench 400 1024 --model mobilenet --cudnn-benchmark" timeout 330 bash measurements/fit/reach.sh > $R/reach.txt 2>&1; echo "reach done $(( $(date +%s) - T0 )) s" >> $R/reach.txt ) &
wait
echo "phase 1 $(( $(date +%s) - T0 )) s" > $R/phase.txt
ls -la $W >> $R/phase.txt
tar czf $OUT/res.tgz -C $W res
bash measurements/ten_million/measure.sh $BIN $W/rn18_10m.pickle > $OUT/measure10m.txt 2>&1
echo "all $(( $(date +%s) - T0 )) s" >> $OUT/measure10m.txt
