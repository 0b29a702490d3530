#!/usr/bin/env bash
# Usage: scripts/test.sh [--quick | --extended]
#
# --quick: the everyday tier. Builds build/ and runs every ctest entry not
# labelled `full`: the lit suites (lit.Runtime runs each CUDA kernel kind on
# the emulator: mma.sync and warpgroup prefill (D 256 included),
# persistent CTAs, decode with split merges), the
# unit tests and pytest. The emulator matrices, the GPU pack on the emulator
# and its dry run, the seeded bugs, the corpus compiled for every CUDA
# target, the install check and the sanitized tree are the full tier's.
#
# Without --quick: the full suite, which CI runs (.ci/run). It leaves out
# the ctest entries labelled `extended` (the emulator's corpus matrix at the
# head dims other than 64 / 128 / 256 and each mod's whole covering at 64 /
# 128, the head-dim test's full matrix, the CUDA batch call's 1000-token
# chunk and head dim 256 on pages of 128, and the whole products of the
# NVRTC compile sweeps and of the corpus's CUDA compiles, of which the full
# suite compiles coverings: about 55 minutes more on two cores, by the
# entries' recorded costs); --extended runs those too.
#
# Builds pagedc and runs every test, in two trees:
#
#  1. build/ (Release, scripts/build.sh): every lit suite, unit test, emulator
#     test and pytest through ctest.
#  2. build-fuzz/ (clang 19, AddressSanitizer + UndefinedBehaviorSanitizer and
#     libFuzzer coverage, scripts/sanitizer-tree.sh; only the targets below
#     are built): the runtime and CPU-kernel unit tests, the `pagedc run` and
#     CLI lit tests with a sanitized pagedc (scripts/test-sanitizers.sh), and
#     each fuzz target for $PAGEDC_FUZZ_SECONDS (default 15) from its
#     committed seed corpus (scripts/fuzz.sh).
#
# Every step runs even when an earlier one failed; the exit status is
# non-zero when any did, and a summary of the steps is the last thing
# printed (ctest's own summary just above it).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PAGEDC_BUILD_DIR:-$root/build}
export PAGEDC_FUZZ_BUILD_DIR=${PAGEDC_FUZZ_BUILD_DIR:-$root/build-fuzz}
fuzz_seconds=${PAGEDC_FUZZ_SECONDS:-15}
summary=()
failed=0
quick=0
extended=0
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    --extended) extended=1 ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "scripts/test.sh: unknown argument '$arg' (use --quick, --extended or" \
         "nothing)" >&2; exit 2 ;;
  esac
done
if [ "$quick" = 1 ] && [ "$extended" = 1 ]; then
  echo "scripts/test.sh: --quick and --extended exclude each other" >&2
  exit 2
fi
step() { # step NAME COMMAND...: runs COMMAND, records its outcome
  local name=$1 start=$SECONDS
  shift
  echo "pagedc: $name, $(date -u +%H:%M:%S) UTC"
  if "$@"; then
    summary+=("ok      $name ($((SECONDS - start)) s)")
  else
    summary+=("FAILED  $name ($((SECONDS - start)) s)")
    failed=1
  fi
}

# The quick tier builds what its entries run (no benchmarks, no test
# programs of the full tier's alone).
if [ "$quick" = 1 ]; then
  "$root/scripts/build.sh" --target pagedc-quick-tier || exit 1
else
  "$root/scripts/build.sh" || exit 1
fi

# ctest -j starts the entries it expects to take longest first, from the
# costs it keeps in the build tree; a fresh tree has none, and ctest would
# start them in the order they are declared, ending on a long entry with the
# other core idle. test/ctest-costs.txt (each entry's seconds on the 2-core
# machine, the sanitized tree's CPU-kernel shards among them; ctest's own
# format) stands in until ctest has its own, in both trees.
seed_costs() { # seed_costs TREE
  local costs="$1/Testing/Temporary/CTestCostData.txt"
  if [ ! -f "$costs" ]; then
    mkdir -p "$(dirname "$costs")" && cp "$root/test/ctest-costs.txt" "$costs"
  fi
}
seed_costs "$build"

if [ "$quick" = 1 ]; then
  quick_tests() {
    (cd "$build" && ctest --output-on-failure -j "$(nproc)" -LE full --timeout 900)
  }
  step "quick tier: ctest -LE full ($build)" quick_tests
  echo "pagedc: test summary"
  printf '  %s\n' "${summary[@]}"
  exit "$failed"
fi

sanitized_build() {
  local tree
  tree=$("$root/scripts/sanitizer-tree.sh") &&
    cmake --build "$tree" -j "$(nproc)" --target RuntimeTests CpuAttentionTests \
      pagedc pagedc-device-query pagedc-jit pagedc-codegen pagedc-fuzzers
}
sanitized_units() {
  seed_costs "$PAGEDC_FUZZ_BUILD_DIR"
  (cd "$PAGEDC_FUZZ_BUILD_DIR" &&
     ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure --no-tests=error -j "$(nproc)" \
       -R '^unit\.(RuntimeTests|CpuAttentionTests\.shard[0-9]+)$')
}
step "sanitized tree: build ($PAGEDC_FUZZ_BUILD_DIR)" sanitized_build
if [ "$failed" = 0 ]; then
  step "sanitized tree: runtime and CPU-kernel unit tests" sanitized_units
  step "sanitized tree: pagedc run and CLI lit tests" \
    env PAGEDC_SANITIZER_SKIP_BUILD=1 "$root/scripts/test-sanitizers.sh"
  step "sanitized tree: fuzz targets, $fuzz_seconds s each" \
    env PAGEDC_FUZZ_SKIP_BUILD=1 "$root/scripts/fuzz.sh" "$fuzz_seconds"
fi

# No test takes more than about three minutes on two cores; one that runs
# for 15 is stuck. ctest then kills it, prints its output (the gtest case it
# was in) and runs it once more, so a stall is reported by name and a
# one-off stall does not hold the whole run until the CI limit.
all_tests() {
  local exclude=(-LE extended)
  [ "$extended" = 1 ] && exclude=()
  (cd "$build" && ctest --output-on-failure -j "$(nproc)" --timeout 900 \
     --repeat after-timeout:2 "${exclude[@]}")
}
if [ "$extended" = 1 ]; then
  step "all tests, the extended entries included ($build)" all_tests
else
  step "all tests but the extended entries ($build)" all_tests
fi

# ctest prints a passing test's output only into its log: show pytest's
# skips (tests that need PyTorch, with the reason) and its count here.
if [ -f "$build/Testing/Temporary/LastTest.log" ]; then
  echo "pagedc: python.pytest (from $build/Testing/Temporary/LastTest.log)"
  sed -n '/Test: python.pytest/,/^"python.pytest" end time/p' \
    "$build/Testing/Temporary/LastTest.log" |
    grep -E '^SKIPPED|^[0-9]+ (passed|failed)|(passed|failed|skipped).* in [0-9.]+s' |
    sed 's/^/  /' || true
fi

echo "pagedc: test summary"
printf '  %s\n' "${summary[@]}"
exit "$failed"
