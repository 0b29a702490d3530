# Sourced by gpu-check.sh and gpu-profile.sh: sets the array runtime_args to
# the cmake arguments of the runtime-only tree the GPU machine builds (no
# LLVM there): compiler, tests and benchmarks off; fmt's headers from the pack
# when the machine has none (or $PAGEDC_FORCE_PACK_FMT is set); xxHash and
# nlohmann/json from the pack when it carries them.
#   runtime_cmake_args PACK
runtime_cmake_args() {
  local pack=$1
  runtime_args=(-DPAGEDC_ENABLE_COMPILER=OFF -DPAGEDC_BUILD_TESTS=OFF -DPAGEDC_BUILD_BENCHMARKS=OFF)
  if [[ ! -f /usr/include/fmt/format.h && ! -f /usr/local/include/fmt/format.h ]] ||
     [[ -n "${PAGEDC_FORCE_PACK_FMT:-}" ]]; then
    runtime_args+=(-Dfmt_DIR="$pack/deps/fmt")
  fi
  [[ -d "$pack/deps/include" ]] && runtime_args+=(-DPAGEDC_EXTRA_INCLUDE="$pack/deps/include")
  return 0
}
