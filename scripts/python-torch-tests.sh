#!/usr/bin/env bash
# Runs the Python package's tests WITH PyTorch (test/python/test_torch.py and the
# torch zero-copy checks, which CI reports as skipped): creates a venv at
# ${PAGEDC_TORCH_VENV:-build/torch-venv} on the interpreter the build used,
# installs torch from PyPI there (`pip install torch`: about 5 GB with its
# dependencies, so never in CI) plus pytest, and runs the whole suite against
# the build tree's package. Usage: scripts/python-torch-tests.sh [BUILD_DIR]
source "$(dirname "$0")/script-help.sh"
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
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
PYTHONPATH="$build/python" PAGEDC_SOURCE_DIR="$root" \
  "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$root/test/python"
