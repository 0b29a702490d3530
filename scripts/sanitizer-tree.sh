#!/usr/bin/env bash
# Configures the clang-19 tree that serves both the libFuzzer targets
# (scripts/fuzz.sh) and the sanitized `pagedc` (scripts/test-sanitizers.sh):
# -DPAGEDC_BUILD_FUZZERS=ON, which builds everything with
# -fsanitize=address,undefined (no recovery) plus libFuzzer's coverage
# instrumentation. -O1 with line tables keeps the MLIR-heavy objects cheap to
# build while giving symbolized stack traces. Only the targets the scripts
# ask for are built, never the whole tree.
#
#   scripts/sanitizer-tree.sh        configure build-fuzz/ (or
#                                    $PAGEDC_FUZZ_BUILD_DIR) if needed and
#                                    print its path
source "$(dirname "$0")/script-help.sh"
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PAGEDC_FUZZ_BUILD_DIR:-$root/build-fuzz}
"$root/scripts/install-deps.sh" >&2
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja \
    -DCMAKE_C_COMPILER=clang-19 -DCMAKE_CXX_COMPILER=clang++-19 \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
    -DPAGEDC_BUILD_FUZZERS=ON -DPAGEDC_BUILD_BENCHMARKS=OFF >/dev/null
fi
echo "$build"
