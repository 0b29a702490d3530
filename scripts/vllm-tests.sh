#!/usr/bin/env bash
# Runs the vLLM attention-backend plugin's tests (test/python/test_vllm.py,
# which CI reports as skipped) WITH vLLM: creates a venv at
# ${PAGEDC_VLLM_VENV:-build/vllm-venv} on the interpreter the build used,
# installs vLLM from PyPI there (`pip install vllm`: about 9 GB with torch and
# its CUDA libraries, so never in CI; no GPU is needed to run the tests) plus
# pytest and NumPy, and runs the plugin's tests (test_vllm.py and
# test_vllm_config.py) against the build tree's package. pagedc is not
# installed in the venv: the entry-point test reads python/pyproject.toml.
# Usage: scripts/vllm-tests.sh [BUILD_DIR] [PYTEST_ARGS...]
source "$(dirname "$0")/script-help.sh"
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
shift || true
venv=${PAGEDC_VLLM_VENV:-$build/vllm-venv}
python=$(sed -n 's/^PAGEDC_PYTHON_EXECUTABLE:INTERNAL=//p' "$build/CMakeCache.txt" \
  2>/dev/null || true)
python=${python:-python3}
cmake --build "$build" --target pagedc-python
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -c "import vllm" 2>/dev/null || "$venv/bin/pip" install vllm
"$venv/bin/python" -c "import pytest, numpy" 2>/dev/null || "$venv/bin/pip" install pytest numpy
"$venv/bin/python" -c "import vllm; print('vLLM', vllm.__version__)"
PYTHONPATH="$build/python" PAGEDC_SOURCE_DIR="$root" \
  "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider \
  "$root/test/python/test_vllm.py" "$root/test/python/test_vllm_config.py" "$@"
