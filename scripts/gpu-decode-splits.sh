#!/usr/bin/env bash
# Times a pack's decode rows at each of several split counts, ON the GPU
# machine (after, or instead of, scripts/gpu-check.sh; builds the same
# runtime-only tree when it is missing):
#
#   scripts/gpu-decode-splits.sh PACK [FILTER] [SPLITS...]
#
# FILTER: the benchmark rows, as `pagedc-gpu bench --filter` takes it
# (comma-separated names or parts of names; default: five rows without a
# mod at page 128 where a call's fixed cost shows, B 1 x 1k and 32k, B 16 x
# 1k and 8k, B 64 x 1k). SPLITS (default 1 2 3 4 6 8 12 16 24 32 47 64):
# the kernel option decode_splits of each run (kept within what a row
# allows, so a short row's largest counts repeat its longest plan). Each run
# is `pagedc-gpu bench --launch-times` (call by call, queued after an L2
# flush, and the split kernel and the merge apart), written to
# $OUT/decode-splits-<N>-gpu-bench-pagedc.json; then
# $OUT/decode-splits.json and a table: per row, the queued time at each
# count, the planner's own count and time (one more run, without the
# option), and the fastest count (bench/gpu/decode_splits.py). Clocks are
# left as they are.
# Exit status: 0 every run ok, 1 a run failed, 2 usage.
source "$(dirname "$0")/script-help.sh"
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[[ $# -ge 1 ]] || { awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0" >&2; exit 2; }
pack=$(cd "$1" && pwd) || exit 2
filter=${2:-decode-none-B1-ctx1024-p128,decode-none-B1-ctx32768-p128,decode-none-B16-ctx1024-p128,decode-none-B16-ctx8192-p128,decode-none-B64-ctx1024-p128}
shift $(( $# >= 2 ? 2 : 1 ))
splits=("$@")
[[ ${#splits[@]} -gt 0 ]] || splits=(1 2 3 4 6 8 12 16 24 32 47 64)
for n in "${splits[@]}"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "gpu-decode-splits: '$n' is not a split count" >&2; exit 2; }
done
source "$root/scripts/gpu-runtime-args.sh"
runtime_tool_setup "$pack" || exit 1
failures=0
run() {
  local label=$1
  shift
  echo "== $label"
  timeout "${PAGEDC_STEP_TIMEOUT_S:-300}" "$build/bin/pagedc-gpu" bench "$pack" --filter "$filter" \
    --launch-times --copy-mib 64 "$@" --json "$out/decode-splits-$label-gpu-bench-pagedc.json" \
    >"$out/decode-splits-$label.log" 2>&1 || { echo "== $label: failed"; failures=$((failures + 1)); }
}
# The option is the runs' own: a variable of the planner's would change them.
unset PAGEDC_DECODE_SPLITS PAGEDC_DECODE_SPLIT_FACTOR
run planned
for n in "${splits[@]}"; do
  run "$n" --kernel-option "decode_splits=$n"
done
python3 "$root/bench/gpu/decode_splits.py" "$out" "${splits[@]}" || failures=$((failures + 1))
exit $((failures > 0))
