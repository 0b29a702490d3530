#!/usr/bin/env bash
# Runs the runtime host-overhead benchmarks (bench/README.md targets §2) with
# repetitions and writes medians (and means, stddevs) to
# bench/results/runtime.json. Extra arguments go to the benchmark binary,
# e.g. --benchmark_filter=CreateBlockMask.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${PAGEDC_BUILD_DIR:-$root/build-runtime}
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPAGEDC_ENABLE_COMPILER=OFF
fi
cmake --build "$build" --target pagedc-bench-runtime
mkdir -p "$root/bench/results"
"$build/bin/pagedc-bench-runtime" \
  --benchmark_repetitions="${PAGEDC_BENCH_REPETITIONS:-5}" \
  --benchmark_report_aggregates_only=true \
  --benchmark_out="$root/bench/results/runtime.json" --benchmark_out_format=json "$@"
