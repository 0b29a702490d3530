#!/usr/bin/env bash
# Builds the libFuzzer targets (test/fuzz/) in the clang-19 sanitizer tree
# (scripts/sanitizer-tree.sh, build-fuzz/) and runs each for a bounded time
# from its committed seed corpus (test/fuzz/corpus/<target>/). One line per
# target; exits 1 when any target reports a finding (a crash, a sanitizer
# report, a timeout, running out of memory, or a failed check of the
# harness), with the reproducer kept under build-fuzz/fuzz/artifacts/.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]      default 20
#
# Environment:
#   PAGEDC_FUZZ_TARGETS   targets to run (default: all five), e.g. "npy bundle"
#   PAGEDC_FUZZ_JOBS      targets run at once (default: the number of cores)
#   PAGEDC_FUZZ_KEEP_GOING=1
#                         long runs: libFuzzer's -fork=1 -ignore_crashes=1, so a
#                         target goes on after a finding and saves every one
#   PAGEDC_FUZZ_BUILD_DIR the tree (default build-fuzz/)
#   PAGEDC_FUZZ_SKIP_BUILD=1
#                         run the targets as built (another build may be
#                         running in the tree)
#
# New inputs the fuzzer finds go to build-fuzz/fuzz/corpus/<target>/ (kept
# between runs, never into the source tree). Reproduce a finding with
#   build-fuzz/bin/pagedc-fuzz-<target> FILE
source "$(dirname "$0")/script-help.sh"
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-20}
targets=${PAGEDC_FUZZ_TARGETS:-"attn npy bundle cache-entry runtime-api"}
build=$("$root/scripts/sanitizer-tree.sh")

# The committed seeds are what test/fuzz/make_corpus.py writes.
python3 "$root/test/fuzz/make_corpus.py" --check

if [ "${PAGEDC_FUZZ_SKIP_BUILD:-0}" != 1 ]; then
  echo "pagedc: building fuzz targets ($build), $(date -u +%H:%M:%S) UTC"
  bins=()
  for t in $targets; do bins+=("pagedc-fuzz-$t"); done
  cmake --build "$build" -j "$(nproc)" --target "${bins[@]}"
fi

# Largest input per target: room for every seed, small enough to stay fast.
max_len() {
  case $1 in
    attn) echo 8192 ;;
    bundle) echo 4096 ;;
    *) echo 2048 ;;
  esac
}

# Huge allocations fail (std::bad_alloc, which the harnesses report) instead
# of aborting inside ASan; UBSan prints where.
export ASAN_OPTIONS=${ASAN_OPTIONS:-allocator_may_return_null=1:detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# fuzz_one TARGET: runs one target, writes its summary line to
# $build/fuzz/TARGET.result; exit status 1 on a finding.
fuzz_one() {
  local t=$1 work="$build/fuzz/corpus/$1" artifacts="$build/fuzz/artifacts/$1"
  local log="$build/fuzz/$1.log" result="$build/fuzz/$1.result"
  mkdir -p "$work" "$artifacts"
  rm -f "$artifacts"/* "$result"
  local extra=()
  # Reproducers of fixed findings run first, every time.
  local regressions=()
  [ -d "$root/test/fuzz/regressions/$t" ] && regressions=("$root/test/fuzz/regressions/$t")
  if [ "${PAGEDC_FUZZ_KEEP_GOING:-0}" = 1 ]; then
    extra=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
  fi
  local status=0
  "$build/bin/pagedc-fuzz-$t" "${extra[@]}" -max_total_time="$seconds" -timeout=25 \
    -rss_limit_mb=2048 -malloc_limit_mb=2048 -max_len="$(max_len "$t")" \
    -print_final_stats=1 -artifact_prefix="$artifacts/" \
    "$work" "$root/test/fuzz/corpus/$t" "${regressions[@]}" >"$log" 2>&1 || status=$?
  local runs cov corpus found slow
  runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || true)
  [ -n "$runs" ] || runs=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#' || true)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || true)
  corpus=$(find "$work" -type f | wc -l)
  # slow-unit-* files are inputs that took over 10 s (libFuzzer's report,
  # not a finding: -timeout decides what hangs); everything else is one.
  found=$(find "$artifacts" -type f ! -name 'slow-unit-*' | wc -l)
  slow=$(find "$artifacts" -type f -name 'slow-unit-*' | wc -l)
  if [ "$status" -ne 0 ] || [ "$found" -ne 0 ]; then
    {
      echo "pagedc-fuzz-$t: FINDING (exit $status), ${runs:-?} runs in ${seconds} s," \
        "cov ${cov:-?}, corpus $corpus; reproducers in $artifacts; log $log"
      grep -m1 -E 'FINDING|ERROR: |runtime error|Test unit written' "$log" | sed 's/^/    /' || true
    } >"$result"
    return 1
  fi
  echo "pagedc-fuzz-$t: ok, ${runs:-?} runs in ${seconds} s, cov ${cov:-?}, corpus $corpus" \
    "$([ "$slow" -eq 0 ] || echo "($slow slow inputs, over 10 s each, in $artifacts)")" >"$result"
}

# The targets run side by side, PAGEDC_FUZZ_JOBS at a time (default: one per
# core): each is one process on one core for its whole time, so running them
# one after another would leave the other cores idle.
jobs=${PAGEDC_FUZZ_JOBS:-$(nproc)}
failed=0
start=$(date +%s)
running=0
for t in $targets; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  fuzz_one "$t" &
  running=$((running + 1))
done
wait
for t in $targets; do
  result="$build/fuzz/$t.result"
  if [ -f "$result" ]; then
    cat "$result"
    grep -q "^pagedc-fuzz-$t: ok" "$result" || failed=1
  else
    echo "pagedc-fuzz-$t: FINDING (the run left no result; log $build/fuzz/$t.log)"
    failed=1
  fi
done
echo "pagedc: fuzzing took $(($(date +%s) - start)) s"
exit "$failed"
