#!/usr/bin/env bash
# Runs the Python package's tests WITH PyTorch (test/python/test_torch.py and the
# torch zero-copy checks, which CI reports as skipped): creates a venv at
# ${PAGEDC_TORCH_VENV:-build/torch-venv} on the interpreter the build used,
# installs torch from PyPI there (`pip install torch`: about 5 GB with its
# dependencies, so never in CI) plus pytest, and runs the whole suite against
# the build tree's package.
#
# Usage: scripts/python-torch-tests.sh [--with-flashinfer] [BUILD_DIR]
#
# --with-flashinfer: also FlashInfer, the version scripts/gpu-wheels.sh pins,
# without its GPU-only dependencies, in $VENV/flashinfer-site (about 0.9 GB):
# it imports without a GPU, so test_gpu_baselines.py binds the benchmark's
# FlashInfer calls to its real wrappers here instead of skipping them.
source "$(dirname "$0")/script-help.sh"
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
with_flashinfer=0
if [[ "${1:-}" == --with-flashinfer ]]; then
  with_flashinfer=1
  shift
fi
[[ "${1:-}" != -* ]] || { echo "python-torch-tests: unknown option '$1' (see --help)" >&2; exit 2; }
build=${1:-$root/build}
venv=${PAGEDC_TORCH_VENV:-$build/torch-venv}
python=$(sed -n 's/^PAGEDC_PYTHON_EXECUTABLE:INTERNAL=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
python=${python:-python3}
cmake --build "$build" --target pagedc-python
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv --system-site-packages "$venv"
fi
"$venv/bin/python" -c "import torch" 2>/dev/null || "$venv/bin/pip" install torch
# ml_dtypes: an independent float8 implementation the FP8 tests compare with.
"$venv/bin/python" -c "import ml_dtypes" 2>/dev/null || "$venv/bin/pip" install ml_dtypes
"$venv/bin/python" -c "import pytest, numpy" 2>/dev/null || "$venv/bin/pip" install pytest numpy
pythonpath=$build/python
if [[ $with_flashinfer == 1 ]]; then
  site=$venv/flashinfer-site
  # The pins scripts/gpu-wheels.sh carries to the GPU machine.
  pins=$(grep -o -E '(flashinfer-python|apache-tvm-ffi)==[^ )]+' "$root/scripts/gpu-wheels.sh" | sort -u)
  [[ $(wc -l <<<"$pins") == 2 ]] || { echo "python-torch-tests: no FlashInfer pins in scripts/gpu-wheels.sh" >&2; exit 1; }
  if ! PYTHONPATH=$site "$venv/bin/python" -c "import flashinfer" 2>/dev/null; then
    # shellcheck disable=SC2086 # one pin a word
    "$venv/bin/pip" install -q --no-deps --target "$site" $pins
    # What it imports besides torch and numpy (the GPU image has them).
    "$venv/bin/pip" install -q --target "$site" requests tqdm nvidia-ml-py
  fi
  PYTHONPATH=$site "$venv/bin/python" -c "import flashinfer"
  pythonpath=$pythonpath:$site
fi
PYTHONPATH="$pythonpath" PAGEDC_SOURCE_DIR="$root" \
  "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$root/test/python"
