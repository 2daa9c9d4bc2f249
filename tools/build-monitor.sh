#!/usr/bin/env bash
# Builds the binary to run beside training: the dist profile (fat LTO,
# panic = abort), packed relative relocations, and the functions the live
# view runs (tools/hot-functions.txt) laid out together, so that the code it
# keeps mapped is about 0.8 MB instead of 2.2 MB: the kernel maps a binary's
# code 64 KiB around each page touched, and the hot code is otherwise spread
# over 35 such windows of the 3.6 MB text. Result: target/monitor/dist/gpumem-top
# (its own target directory: the flags below would otherwise rebuild every
# crate of the other profiles' builds and back).
#
#   tools/build-monitor.sh            (needs lld, rustc's default linker on
#                                      x86_64 Linux since 1.90, and nm)
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in nm readelf python3; do
  command -v "$tool" >/dev/null || { echo "build-monitor: needs $tool (binutils, python3)" >&2; exit 2; }
done
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/monitor"
out="$CARGO_TARGET_DIR/dist"
# Packed relocations need glibc >= 2.36 where the binary runs.
export RUSTFLAGS="${RUSTFLAGS:-} -C link-arg=-Wl,-z,pack-relative-relocs"
cargo build --profile dist --bin gpumem-top
if ! readelf -p .comment "$out/gpumem-top" | grep -q 'Linker: LLD'; then
  echo "build-monitor: not linked by lld, so the code is left in the compiler's order" >&2
  exit 0
fi
python3 tools/link_order.py order "$out/gpumem-top" tools/hot-functions.txt >"$out/link-order.txt"
# Only the binary is built again (its LTO included), with the mangled names
# of the first link. Cargo does not see the order file change: touch.
touch src/main.rs
cargo rustc --profile dist --bin gpumem-top -- \
  -C link-arg=-Wl,--symbol-ordering-file="$(realpath "$out/link-order.txt")" -C link-arg=-Wl,--no-warn-symbol-ordering
echo "build-monitor: $out/gpumem-top, $(wc -l <"$out/link-order.txt") functions placed first" >&2
