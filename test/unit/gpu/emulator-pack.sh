#!/usr/bin/env bash
# The GPU check pack on the SIMT emulator: pagedc-gpu-prepare builds every
# case of the pack (all kernel kinds, corpus mods, page sizes, GQA, lse, fully
# masked rows) with emulator images, and `pagedc-gpu check` runs each one
# through the runtime's CUDA path on the emulator's driver, every checker on,
# against the pack's float64 references with the GPU check's tolerance.
#   emulator-pack.sh BUILD_DIR WORK_DIR
set -euo pipefail
build=$1
work=$2
rm -rf "$work"
mkdir -p "$work"
export PAGEDC_CACHE_DIR=${PAGEDC_CACHE_DIR:-$build/test/emu-kernel-cache}
start=$(date +%s)
"$build/bin/pagedc-gpu-prepare" -o "$work/pack" --arch emu
prepared=$(date +%s)
PAGEDC_CUDA_DRIVER=emu "$build/bin/pagedc-gpu" check "$work/pack" --json "$work/check.json" \
  | tee "$work/check.log" | tail -n 3
end=$(date +%s)
echo "emulator pack: prepare $((prepared - start)) s, check $((end - prepared)) s"
summary=$(grep -E '^pagedc-gpu check: [0-9]+ passed, 0 failed, 0 planned' "$work/check.log" || true)
if [ -z "$summary" ]; then
  echo "emulator pack: FAILED (some case failed or was not run)"
  grep -E '^(fail|error)' "$work/check.log" | head -20 || true
  exit 1
fi
echo "emulator pack: PASS ($summary)"
