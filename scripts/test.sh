#!/usr/bin/env bash
# Builds pagedc and runs every test: the runtime and CPU-kernel unit tests
# under AddressSanitizer + UndefinedBehaviorSanitizer (a runtime-only build, no
# compiler, cheap on 2 cores), then all lit suites and unit tests through
# ctest. ctest's summary of the full run is the last thing printed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PAGEDC_BUILD_DIR:-$root/build}
asan=${PAGEDC_ASAN_BUILD_DIR:-$root/build-asan}
"$root/scripts/build.sh"

echo "pagedc: runtime unit tests under ASan + UBSan ($asan), $(date -u +%H:%M:%S) UTC"
if [ ! -f "$asan/build.ninja" ]; then
  cmake -S "$root" -B "$asan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DPAGEDC_ENABLE_COMPILER=OFF -DPAGEDC_SANITIZE=ON -DPAGEDC_BUILD_BENCHMARKS=OFF >/dev/null
fi
cmake --build "$asan" -j "$(nproc)" --target RuntimeTests CpuAttentionTests
(cd "$asan" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --output-on-failure -R '^unit\.(RuntimeTests|CpuAttentionTests)$')

echo "pagedc: all tests ($build), $(date -u +%H:%M:%S) UTC"
cd "$build"
# No test takes more than about three minutes on two cores; one that runs
# for 15 is stuck. ctest then kills it, prints its output (the gtest case it
# was in) and runs it once more, so a stall is reported by name and a
# one-off stall does not hold the whole run until the CI limit.
ctest --output-on-failure -j "$(nproc)" --timeout 900 --repeat after-timeout:2
