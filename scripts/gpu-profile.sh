#!/usr/bin/env bash
# Profiles benchmark configurations of a pack with Nsight Compute, ON the GPU
# machine (after, or instead of, scripts/gpu-check.sh; builds the same
# runtime-only tree when it is missing):
#
#   scripts/gpu-profile.sh PACK FILTER [FILTER...]
#
# For each FILTER (a benchmark configuration name, as `pagedc-gpu bench
# --filter` takes it) ncu profiles one launch of the attention kernel
# (pagedc_prefill or pagedc_decode; the block-mask builder and the merge are
# skipped) with the throughput, occupancy, scheduler, warp-state and source
# sections, writing $OUT/ncu-<n>.txt (details, source counters: the SASS
# lines with the most stalls), the report $OUT/ncu-<n>.ncu-rep and every
# metric it holds as CSV, $OUT/ncu-<n>-raw.csv (the warp stall reasons
# among them: the text page prints only their total, 'Warp Cycles Per
# Issued Instruction'). The kernels' SASS goes to $OUT/sass-<n>.txt.gz
# (cuobjdump of the configuration's bundle). Clocks are left as they are
# (--clock-control none). Exit status: 1 when ncu failed for any filter.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[[ $# -ge 2 ]] || { sed -n '2,16p' "$0"; exit 2; }
pack=$(cd "$1" && pwd) || exit 2
shift
source "$root/scripts/gpu-runtime-args.sh"
runtime_tool_setup "$pack" || exit 1
failures=0
n=0
for filter in "$@"; do
  n=$((n + 1))
  bundle=$(python3 - "$pack" "$filter" <<'EOF'
import json, sys
pack = json.load(open(sys.argv[1] + "/pack.json"))
hits = [c for c in pack["bench"] if sys.argv[2] in c["name"]]
print(hits[0]["bundle"] if hits else "")
EOF
)
  echo "== $n: $filter (bundle ${bundle:-none})"
  if [[ -n "$bundle" ]] && command -v cuobjdump >/dev/null; then
    for cubin in "$pack/$bundle"/*.cubin; do
      echo "// $cubin"
      cuobjdump -sass "$cubin"
    done 2>&1 | gzip >"$out/sass-$n.txt.gz"
  fi
  timeout 240 ncu --clock-control none --kernel-name regex:'pagedc_(prefill|decode)$' \
    --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section Occupancy --section LaunchStats --section SchedulerStats \
    --section WarpStateStats --section SourceCounters --section InstructionStats \
    --export "$out/ncu-$n" --force-overwrite \
    "$build/bin/pagedc-gpu" bench "$pack" --filter "$filter" --warmup 2 --iters 2 --copy-mib 64 \
    >"$out/ncu-$n.txt" 2>&1
  status=$?
  echo "== $n: ncu exit $status"
  [[ $status == 0 ]] || failures=$((failures + 1))
  if [[ -f "$out/ncu-$n.ncu-rep" ]]; then
    ncu --import "$out/ncu-$n.ncu-rep" --page raw --csv >"$out/ncu-$n-raw.csv" 2>&1 ||
      echo "== $n: ncu --page raw failed (the report is kept)"
  fi
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued" \
    "$out/ncu-$n.txt" | head -20
done
exit $((failures > 0))
