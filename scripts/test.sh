#!/usr/bin/env bash
# Builds pagedc and runs every test (lit suites and unit tests) through ctest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PAGEDC_BUILD_DIR:-$root/build}
"$root/scripts/build.sh"
cd "$build"
ctest --output-on-failure -j "$(nproc)"

# The runtime's unit tests again under AddressSanitizer + UndefinedBehavior-
# Sanitizer, in a runtime-only build (no compiler, no benchmarks) to stay
# cheap on 2 cores.
asan=${PAGEDC_ASAN_BUILD_DIR:-$root/build-asan}
if [ ! -f "$asan/build.ninja" ]; then
  cmake -S "$root" -B "$asan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DPAGEDC_ENABLE_COMPILER=OFF -DPAGEDC_SANITIZE=ON -DPAGEDC_BUILD_BENCHMARKS=OFF
fi
cmake --build "$asan" -j "$(nproc)" --target RuntimeTests
cd "$asan"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --output-on-failure -R '^unit\.RuntimeTests$'
