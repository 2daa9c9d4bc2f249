#!/usr/bin/env bash
# Build everything that must run on the GPU machine into .gpu/ (ignored by git),
# so that one run there, carrying .gpu, can execute it.
#
#   tools/gpu-bundle.sh            # release binary + every test binary
#   then run on the GPU machine, carrying .gpu:
#     bash .gpu/run.sh [TEST_FILTER]
#
# .gpu/run.sh prints the GPU it finds, then runs every test binary with
# --include-ignored (so GPU-only tests marked #[ignore] run there), with
# CARGO_MANIFEST_DIR pointing at the copied tree so fixtures resolve. It writes
# logs under $OUT when set. The GPU machine is x86-64 with glibc 2.39: binaries built here run there.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu/tests
export CARGO_PROFILE_RELEASE_DEBUG=0
cargo build --release --bins
cargo test --release --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["executable"])
' > .gpu/test-list
while read -r exe; do cp "$exe" .gpu/tests/; done < .gpu/test-list
for b in target/release/*; do
  [[ -f $b && -x $b && $b != *.d ]] && cp "$b" .gpu/
done
strip .gpu/tests/* .gpu/* 2>/dev/null || true
cat > .gpu/run.sh <<'RUN'
#!/usr/bin/env bash
# Runs on the GPU machine from the repository root.
set -uo pipefail
filter=${1:-}
export CARGO_MANIFEST_DIR=$PWD RUST_BACKTRACE=1
OUT=${OUT:-$(mktemp -d)}; mkdir -p "$OUT"
nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv | tee "$OUT/nvidia-smi.txt"
status=0
for t in .gpu/tests/*; do
  echo "=== $t"
  "$t" --include-ignored $filter 2>&1 | tee -a "$OUT/tests.log" | tail -25
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
done
echo "device test status: $status"
exit $status
RUN
chmod +x .gpu/run.sh
du -sh .gpu
echo "bundle ready: on the GPU machine run 'bash .gpu/run.sh', carrying .gpu (64 MiB limit for the whole tree)"
