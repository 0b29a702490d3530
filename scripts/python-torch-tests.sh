#!/usr/bin/env bash
# Runs the Python package's tests WITH PyTorch (test/python/test_torch.py and the
# torch zero-copy checks, which CI reports as skipped): creates a venv at
# ${PAGEDC_TORCH_VENV:-build/torch-venv} on the interpreter the build used,
# installs torch from PyPI there (`pip install torch`: about 5 GB with its
# dependencies, so never in CI) plus pytest, and runs the whole suite against
# the build tree's package.
#
# Usage: scripts/python-torch-tests.sh [--with-baselines] [BUILD_DIR]
#
# --with-baselines: also FlashInfer and FlashAttention-4 with its CuTe DSL,
# the versions scripts/gpu-wheels.sh pins, without their GPU-only
# dependencies, in $VENV/baselines-site (about 1.2 GB): they import without
# a GPU, so test_gpu_baselines.py binds the benchmark's calls to their real
# functions and wrappers here instead of skipping those tests.
source "$(dirname "$0")/script-help.sh"
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
with_baselines=0
if [[ "${1:-}" == --with-baselines ]]; then
  with_baselines=1
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
if [[ $with_baselines == 1 ]]; then
  site=$venv/baselines-site
  # The pins scripts/gpu-wheels.sh carries to the GPU machine, but for
  # FlashInfer's GPU-only dependencies.
  pins=$(grep -o -E '(flashinfer-python|flash-attn-4|nvidia-cutlass-dsl[a-z0-9-]*|apache-tvm-ffi|torch-c-dlpack-ext|quack-kernels)==[^ )]+' \
         "$root/scripts/gpu-wheels.sh" | sort -u)
  [[ $(wc -l <<<"$pins") -ge 8 ]] || { echo "python-torch-tests: the baselines' pins are not in scripts/gpu-wheels.sh" >&2; exit 1; }
  # The CuTe DSL's modules, which its .pth file would add in a site dir.
  pythonpath_site=$site:$site/nvidia_cutlass_dsl/dsl_packages
  imports="import flashinfer, flash_attn.cute"
  if ! PYTHONPATH=$pythonpath_site "$venv/bin/python" -c "$imports" 2>/dev/null; then
    # shellcheck disable=SC2086 # one pin a word
    "$venv/bin/pip" install -q --no-deps --target "$site" $pins
    # What they import besides torch and numpy (the GPU image has them).
    "$venv/bin/pip" install -q --target "$site" requests tqdm nvidia-ml-py einops
  fi
  PYTHONPATH=$pythonpath_site "$venv/bin/python" -c "$imports"
  pythonpath=$pythonpath:$pythonpath_site
fi
PYTHONPATH="$pythonpath" PAGEDC_SOURCE_DIR="$root" \
  "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$root/test/python"
