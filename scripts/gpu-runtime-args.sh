# Sourced by gpu-check.sh, gpu-profile.sh and gpu-decode-splits.sh: sets
# the array runtime_args to the cmake arguments of the runtime-only tree the
# GPU machine builds (no LLVM there): compiler, tests and benchmarks off; fmt's headers from the pack
# when the machine has none (or $PAGEDC_FORCE_PACK_FMT is set); xxHash and
# nlohmann/json from the pack when it carries them. Release, unless
# $PAGEDC_GPU_RT_BUILD_TYPE names another build type: the dry run's test
# (test/unit/gpu/dry-run.sh) builds "None", unoptimized, because it only
# checks that the tree builds and plans, and optimizing doubles its compile.
#   runtime_cmake_args PACK
runtime_cmake_args() {
  local pack=$1
  runtime_args=(-DPAGEDC_ENABLE_COMPILER=OFF -DPAGEDC_BUILD_TESTS=OFF -DPAGEDC_BUILD_BENCHMARKS=OFF
                -DCMAKE_BUILD_TYPE="${PAGEDC_GPU_RT_BUILD_TYPE:-Release}")
  if [[ ! -f /usr/include/fmt/format.h && ! -f /usr/local/include/fmt/format.h ]] ||
     [[ -n "${PAGEDC_FORCE_PACK_FMT:-}" ]]; then
    runtime_args+=(-Dfmt_DIR="$pack/deps/fmt")
  fi
  [[ -d "$pack/deps/include" ]] && runtime_args+=(-DPAGEDC_EXTRA_INCLUDE="$pack/deps/include")
  return 0
}

# For the profiling and sweep scripts, which may run without gpu-check.sh
# first: sets out ($OUT, else gpu-results/, created) and build (the
# runtime-only tree, $PAGEDC_GPU_RT_BUILD, else build-gpu-check/), and builds
# pagedc-gpu there unless it is built.
#   runtime_tool_setup PACK
runtime_tool_setup() {
  local pack=$1 root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  out=${OUT:-$root/gpu-results}
  build=${PAGEDC_GPU_RT_BUILD:-$root/build-gpu-check}
  mkdir -p "$out" || return 1
  [[ -x "$build/bin/pagedc-gpu" ]] && return 0
  runtime_cmake_args "$pack"
  cmake -S "$root" -B "$build" -G Ninja "${runtime_args[@]}" >/dev/null || return 1
  ninja -C "$build" -j"$(nproc)" pagedc-gpu >/dev/null
}
