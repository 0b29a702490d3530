#!/usr/bin/env bash
# The CUDA unit tests that CI runs on the SIMT emulator, run on a GPU instead:
# BatchAttention's CUDA backend (mixed steps, cache layouts, cascade, MLA,
# merge_state), 8-bit float caches, attention sinks and every head dim, each
# case against its float64 reference, on the system's NVIDIA driver
# (PAGEDC_TEST_CUDA_DRIVER=system; test/unit/cuda/EmulatorEnvironment.h).
#
#   scripts/gpu-tests.sh prepare [DIR]   HERE: copy the test binaries from
#       $PAGEDC_BUILD_DIR (default build/; ninja builds them if missing) and
#       the shared libraries they need beyond the C and C++ runtimes into
#       DIR (default gpu-tests/, ignored by git), to carry to the GPU machine
#   scripts/gpu-tests.sh run [DIR]       THERE: run every test of each binary
#       (the extended tier too) in $PAGEDC_GPU_TEST_SHARDS gtest shards
#       (default 4) a binary, all at once; NVRTC compiles the kernels at
#       first use into one kernel cache. Results in $OUT (or gpu-results/):
#       gpu-tests.txt (each shard's counts and failures) and gpu-tests.log.gz
#       (every shard's output)
#
# Exit status: 0 every test passed or was skipped, 1 a test failed or a
# shard did not finish, 2 usage error.
source "$(dirname "$0")/script-help.sh"
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tests=(cuda-batch-attention-test cuda-float8-test cuda-sinks-test emu-head-dim-test)

usage() { echo "gpu-tests: $*" >&2; echo "usage: scripts/gpu-tests.sh prepare|run [DIR]" >&2; exit 2; }

prepare() {
  local dir=$1 build=${PAGEDC_BUILD_DIR:-$root/build} test lib
  ninja -C "$build" "${tests[@]}" >/dev/null || { echo "gpu-tests: build failed" >&2; exit 1; }
  rm -rf "$dir" && mkdir -p "$dir/lib"
  for test in "${tests[@]}"; do
    cp "$build/bin/$test" "$dir/"
    # The libraries a GPU machine's image may lack: everything but the C
    # and C++ runtimes, which it has in newer versions.
    ldd "$build/bin/$test" | awk '$3 ~ /^\// {print $3}' |
      grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
      while read -r lib; do cp -L "$lib" "$dir/lib/"; done
  done
  git -C "$root" rev-parse HEAD >"$dir/commit.txt" 2>/dev/null || echo unknown >"$dir/commit.txt"
  git -C "$root" diff --quiet HEAD 2>/dev/null || sed -i 's/$/-modified/' "$dir/commit.txt"
  echo "gpu-tests: $(du -sm "$dir" | cut -f1) MiB in $dir ($(ls "$dir/lib" | tr '\n' ' '))"
}

run() {
  local dir=$1 out=${OUT:-$root/gpu-results} shards=${PAGEDC_GPU_TEST_SHARDS:-4}
  local logs summary test shard pids=() names=() status failed=0
  [[ -x "$dir/${tests[0]}" ]] || { echo "gpu-tests: no tests in $dir (prepare them first)" >&2; exit 1; }
  [[ $shards =~ ^[1-9][0-9]*$ ]] || usage "PAGEDC_GPU_TEST_SHARDS must be a positive number"
  # NVRTC and the CUDA headers: the toolkit of the nvcc on PATH where
  # CUDA_HOME names none.
  if [[ -z ${CUDA_HOME:-} ]] && command -v nvcc >/dev/null; then
    CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
    export CUDA_HOME
  fi
  mkdir -p "$out"
  logs=$(mktemp -d)
  summary=$out/gpu-tests.txt
  {
    echo "pagedc CUDA unit tests on the system's driver $(date -u +%Y-%m-%dT%H:%M:%SZ)" \
      "commit=$(cat "$dir/commit.txt" 2>/dev/null)"
    command -v nvidia-smi >/dev/null &&
      nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    echo "CUDA_HOME=${CUDA_HOME:-unset}"
  } | tee "$summary"
  export PAGEDC_TEST_CUDA_DRIVER=system
  export PAGEDC_CACHE_DIR=${PAGEDC_CACHE_DIR:-$(mktemp -d)}
  export LD_LIBRARY_PATH=$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  for test in "${tests[@]}"; do
    for ((shard = 0; shard < shards; shard++)); do
      GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$shard GTEST_COLOR=no \
        "$dir/$test" >"$logs/$test.$shard.log" 2>&1 &
      pids+=($!)
      names+=("$test.$shard")
    done
  done
  echo "running ${#pids[@]} shards" | tee -a "$summary"
  for i in "${!pids[@]}"; do
    wait "${pids[i]}"
    status=$?
    local log=$logs/${names[i]}.log
    local passed skipped
    passed=$(grep -o -E '^\[  PASSED  \] [0-9]+' "$log" | grep -o -E '[0-9]+$' || echo 0)
    skipped=$(grep -o -E '^\[  SKIPPED \] [0-9]+ test' "$log" | grep -o -E '[0-9]+' || echo 0)
    echo "${names[i]}: exit $status, passed ${passed:-0}, skipped ${skipped:-0}" | tee -a "$summary"
    grep -E '^\[  FAILED  \] [A-Za-z][^ ]*$' "$log" | sort -u | tee -a "$summary"
    [[ $status == 0 ]] || failed=1
  done
  for test in "${tests[@]}"; do
    for log in "$logs/$test".*.log; do echo "===== ${log##*/}"; cat "$log"; done
  done | gzip >"$out/gpu-tests.log.gz"
  rm -rf "$logs"
  echo "gpu-tests: $([[ $failed == 0 ]] && echo "all shards passed" || echo "FAILED");" \
    "logs in $out/gpu-tests.log.gz" | tee -a "$summary"
  return $failed
}

case "${1:-}" in
  prepare) prepare "${2:-$root/gpu-tests}" ;;
  run) run "${2:-$root/gpu-tests}" ;;
  *) usage "unknown command '${1:-}'" ;;
esac
