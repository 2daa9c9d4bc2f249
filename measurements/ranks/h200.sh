#!/usr/bin/env bash
# On the GPU machine, from the repository root, with the release binary in
# .gpu/ (docs/user/ranks.md): jobs under `gpumem-top run`, each rank's own peaks
# beside what gpumem-top recorded, packed into $OUT/ranks.tar.gz.
set -u
B=$PWD/.gpu/gpumem-top
O=${OUT:-$(mktemp -d)}
R=$(mktemp -d)
export GPUMEM_TOP_BIN=$B
nvidia-smi -L > "$R/gpus.txt" 2>&1
job() {
  local name=$1; shift
  mkdir -p "$R/$name"
  GPUMEM_TOP_DIR=$R/$name/pub timeout 240 "$B" run -o "$R/$name/rec.jsonl" --publish-dir "$R/$name/pub" -- "$@" \
    > "$R/$name/stdout.txt" 2> "$R/$name/stderr.txt"
  echo "rc $?" >> "$R/$name/stdout.txt"
  "$B" replay "$R/$name/rec.jsonl" > "$R/$name/replay.txt" 2>&1
  "$B" replay "$R/$name/rec.jsonl" --json > "$R/$name/replay.json" 2>&1
  ls "$R/$name"/job-rank*.pickle > /dev/null 2>&1 && {
    "$B" replay "$R/$name"/job-rank*.pickle > "$R/$name/job_replay.txt" 2>&1
    "$B" replay "$R/$name"/job-rank*.pickle --json > "$R/$name/job_replay.json" 2>&1
  }
  rm -rf "$R/$name/pub"
}
T="python3 -m torch.distributed.run"
CUDA_VISIBLE_DEVICES=0 job gloo3 $T --nproc_per_node 3 measurements/ranks/live_job.py "$R/gloo3" ddp gloo 30
CUDA_VISIBLE_DEVICES=0 job fsdp2 $T --standalone --nproc_per_node 2 measurements/ranks/live_job.py "$R/fsdp2" fsdp2 gloo 20
n=$(nvidia-smi -L | wc -l)
[ "$n" -ge 2 ] && job nccl2 $T --standalone --nproc_per_node 2 measurements/ranks/live_job.py "$R/nccl2" ddp nccl 30
gzip -9 "$R"/*/rec.jsonl
tar -C "$R" -czf "$O/ranks.tar.gz" .
ls -la "$O"
