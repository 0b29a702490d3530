#!/usr/bin/env bash
# Runs the `pagedc run` lit tests (test/Runtime) and the CLI lit tests
# (test/CLI) with a `pagedc` built with AddressSanitizer + UBSan, in the
# clang-19 tree the fuzz targets use (scripts/sanitizer-tree.sh,
# build-fuzz/), so one extra tree serves both. Fails on a failing test or on
# any sanitizer report, also one a test would not notice (a report from a
# command whose exit status or output the test ignores): reports are written
# to files (log_path) and every one is printed.
#
# run-emu*.test are left out: the SIMT emulator is not built in sanitized trees
# (emulator/CMakeLists.txt); run-out-of-memory.test and hostile-sweep.test too:
# they run pagedc under an address-space limit (`ulimit -v`, RLIMIT_AS), and
# AddressSanitizer reserves its shadow memory as terabytes of address space at
# start, so it aborts before pagedc runs. The runtime's unit
# tests run under ASan + UBSan in the same tree (scripts/test.sh).
#
#   scripts/test-sanitizers.sh      PAGEDC_SANITIZER_SKIP_BUILD=1: use the
#                                   pagedc already built there
source "$(dirname "$0")/script-help.sh"
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$("$root/scripts/sanitizer-tree.sh")

echo "pagedc: sanitized pagedc ($build), $(date -u +%H:%M:%S) UTC"
if [ "${PAGEDC_SANITIZER_SKIP_BUILD:-0}" != 1 ]; then
  cmake --build "$build" -j "$(nproc)" --target pagedc pagedc-device-query pagedc-jit pagedc-codegen
fi

reports="$build/sanitizer-reports"
rm -rf "$reports"
mkdir -p "$reports"
# abort_on_error: a report ends the process with SIGABRT, never with an exit
# status a test could take for pagedc's own 1 (input error) or 2 (usage).
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:allocator_may_return_null=1:log_path=$reports/asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:abort_on_error=1:log_path=$reports/ubsan"

lit=/usr/lib/llvm-19/build/utils/lit/lit.py
[ -f "$lit" ] || lit=$(command -v lit)
status=0
python3 "$lit" -sv --order=lexical --filter-out='run-emu.*\.test|run-out-of-memory\.test|hostile-sweep\.test' \
  "$build/test/Runtime" "$build/test/CLI" || status=1

if [ -n "$(ls -A "$reports")" ]; then
  status=1
  echo "pagedc: sanitizer reports:"
  for f in "$reports"/*; do
    echo "==> $f"
    cat "$f"
  done
fi
exit "$status"
