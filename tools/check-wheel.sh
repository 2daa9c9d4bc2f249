#!/usr/bin/env bash
# The pip package (pyproject.toml, maturin): builds the wheel with maturin
# from PyPI (its environment cached like the torch one), installs it into a
# fresh virtual environment with nothing else, and checks the installed
# command and package (tests/scripts/wheel_check.py). Prints the wheel's
# name and size.
set -euo pipefail
cd "$(dirname "$0")/.."
maturin_env=${XDG_CACHE_HOME:-$HOME/.cache}/gpumem-top-ci/maturin-1.16.0
if ! "$maturin_env/bin/maturin" --version >/dev/null 2>&1; then
  rm -rf "$maturin_env"
  python3 -m venv "$maturin_env"
  "$maturin_env/bin/pip" install -q maturin==1.16.0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! "$maturin_env/bin/maturin" build --release -o "$work/wheels" >"$work/build.log" 2>&1; then
  cat "$work/build.log" >&2
  exit 1
fi
wheel=$(ls "$work"/wheels/*.whl)
echo "wheel: $(basename "$wheel"), $(stat -c %s "$wheel") bytes"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q --no-index "$wheel"
PATH="$work/venv/bin:$PATH" "$work/venv/bin/python" tests/scripts/wheel_check.py
