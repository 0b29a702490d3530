#!/usr/bin/env bash
# Configures and builds pagedc into build/ (or $PAGEDC_BUILD_DIR) with Ninja.
#   scripts/build.sh [--target NAME]... [CMAKE_CONFIGURE_ARGUMENTS]...
# Builds every target unless --target names some (scripts/test.sh --quick:
# pagedc-quick-tier); other arguments go to the first configure.
source "$(dirname "$0")/script-help.sh"
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PAGEDC_BUILD_DIR:-$root/build}
targets=()
configure=()
while [ $# -gt 0 ]; do
  case "$1" in
    --target)
      [ $# -ge 2 ] || { echo "scripts/build.sh: --target needs a name" >&2; exit 2; }
      targets+=(--target "$2")
      shift 2 ;;
    *) configure+=("$1"); shift ;;
  esac
done
"$root/scripts/install-deps.sh"
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${configure[@]}"
fi
cmake --build "$build" -j "$(nproc)" "${targets[@]}"
