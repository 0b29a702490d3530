#!/usr/bin/env bash
# Builds pagedc and runs its main job: compile example mods and run a small
# paged decode loop (GPU when one is usable, otherwise the CPU backend),
# checked against the float64 reference.
#   scripts/demo.sh [ARGUMENTS OF pagedc demo]...
# The arguments go to `pagedc demo` (`build/bin/pagedc demo --help` lists
# them: --device auto|cpu|cuda|emu, --steps N, --page-size N, ...).
source "$(dirname "$0")/script-help.sh"
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PAGEDC_BUILD_DIR:-$root/build}
"$root/scripts/build.sh"
exec "$build/bin/pagedc" demo "$@"
