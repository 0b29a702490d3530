#!/usr/bin/env bash
# The GPU check pack on the SIMT emulator: pagedc-gpu-prepare builds every
# case of the pack (all kernel kinds, corpus mods, page sizes, GQA, lse, fully
# masked rows) with emulator images, and `pagedc-gpu check` runs each one
# through the runtime's CUDA path on the emulator's driver, every checker on,
# against the pack's float64 references with the GPU check's tolerance.
#   emulator-pack.sh BUILD_DIR WORK_DIR
set -euo pipefail
build=$1
work=$2
rm -rf "$work"
mkdir -p "$work"
export PAGEDC_CACHE_DIR=${PAGEDC_CACHE_DIR:-$build/test/emu-kernel-cache}
# The emulator's per-launch counters say which launches copied K/V with
# tensor maps (cp.async.bulk.tensor): with PAGEDC_PREFILL_TMA=1 some
# warpgroup prefill must; the decode kernel must unless PAGEDC_DECODE_TMA=0
# (its default on sm_90 code, the emulator's), and then none may.
tma=${PAGEDC_PREFILL_TMA:-0}
decode_tma=${PAGEDC_DECODE_TMA:-1}
export PAGEDC_EMU_COUNTERS="$work/counters.jsonl"
start=$(date +%s)
"$build/bin/pagedc-gpu-prepare" -o "$work/pack" --arch emu
prepared=$(date +%s)
# PAGEDC_PACK_CASES: only the cases whose names contain it (the variants
# that change the prefill alone run "-prefill-": their decodes would repeat
# gpu.emulator-pack's).
filter=()
[ -n "${PAGEDC_PACK_CASES:-}" ] && filter=(--filter "$PAGEDC_PACK_CASES")
PAGEDC_CUDA_DRIVER=emu "$build/bin/pagedc-gpu" check "$work/pack" --json "$work/check.json" \
  "${filter[@]}" | tee "$work/check.log" | tail -n 3
end=$(date +%s)
echo "emulator pack: prepare $((prepared - start)) s, check $((end - prepared)) s"
summary=$(grep -E '^pagedc-gpu check: [1-9][0-9]* passed, 0 failed, 0 planned' "$work/check.log" || true)
if [ -z "$summary" ]; then
  echo "emulator pack: FAILED (some case failed or was not run)"
  grep -E '^(fail|error)' "$work/check.log" | head -20 || true
  exit 1
fi
if [ "$tma" = 1 ]; then
  prefill=$(grep -c '"kernel":"pagedc_prefill"' "$work/counters.jsonl" || true)
  bulk=$(grep '"kernel":"pagedc_prefill"' "$work/counters.jsonl" |
           grep -c '"bulk_copies":[1-9]' || true)
  echo "emulator pack: $bulk of $prefill prefill launches copied K/V with tensor maps"
  if [ "$bulk" -eq 0 ]; then
    echo "emulator pack: FAILED (PAGEDC_PREFILL_TMA=1 but no prefill launch used tensor maps)"
    exit 1
  fi
fi
if [ -z "${PAGEDC_PREFILL_PERSISTENT:-}" ] && [ -n "${PAGEDC_EMU_MULTIPROCESSORS:-}" ]; then
  # Persistent CTAs chosen by the mask (the default): on N emulated SMs, the
  # warpgroup prefills of more than N query tiles run N CTAs taking tiles
  # from the work counter where the block mask's visits grow (causal,
  # sliding window, no block mask), and a CTA per tile where they do not
  # (a document mask's, inverse causal's): both must occur. With
  # PAGEDC_PACK_CTAS_PER_SM=C (kernels built for C CTAs an SM, whose
  # shared memory lets the occupancy count that many), N x C CTAs.
  sms=$((PAGEDC_EMU_MULTIPROCESSORS * ${PAGEDC_PACK_CTAS_PER_SM:-1}))
  persistent=$(grep "\"kernel\":\"pagedc_prefill\",\"grid\":\[$sms," "$work/counters.jsonl" |
                 grep -c '"atomics":[1-9]' || true)
  over=$(grep -o '"kernel":"pagedc_prefill","grid":\[[0-9]*' "$work/counters.jsonl" |
           grep -o '[0-9]*$' | awk -v c="$sms" '$1 > c' | wc -l)
  echo "emulator pack: $persistent prefill launches ran $sms persistent CTAs by default," \
    "$over a CTA per tile over $sms"
  if [ "$persistent" -eq 0 ] || [ "$over" -eq 0 ]; then
    echo "emulator pack: FAILED (persistent CTAs by default not chosen by the mask)"
    exit 1
  fi
fi
if [ "${PAGEDC_PREFILL_PERSISTENT:-0}" = 1 ] && [ -n "${PAGEDC_PREFILL_PERSISTENT_CTAS:-}" ]; then
  # Persistent CTAs: no warpgroup prefill grid over the CTA count, and
  # some at it (those CTAs then take several query tiles each). The pack's
  # head dims other than 64, 128 and 256 run the mma.sync prefill, which
  # has no persistent CTAs (its launches do no wgmma).
  ctas=$PAGEDC_PREFILL_PERSISTENT_CTAS
  grids=$(grep '"kernel":"pagedc_prefill"' "$work/counters.jsonl" |
            grep -v '"wgmma_flop":0[,}]' |
            grep -o '"kernel":"pagedc_prefill","grid":\[[0-9]*' |
            grep -o '[0-9]*$' || true)
  over=$(echo "$grids" | awk -v c="$ctas" '$1 > c' | wc -l)
  full=$(echo "$grids" | awk -v c="$ctas" '$1 == c' | wc -l)
  echo "emulator pack: $full warpgroup prefill launches ran $ctas persistent CTAs, $over more"
  if [ "$over" -ne 0 ] || [ "$full" -eq 0 ]; then
    echo "emulator pack: FAILED (PAGEDC_PREFILL_PERSISTENT_CTAS=$ctas not followed)"
    exit 1
  fi
  # With the work counter (the default): every launch at the CTA count took
  # its tiles from it (atomics in its counters); in fixed rounds, none.
  counted=$(grep "\"kernel\":\"pagedc_prefill\",\"grid\":\[$ctas," "$work/counters.jsonl" |
              grep -c '"atomics":[1-9]' || true)
  echo "emulator pack: $counted of those took their tiles from the work counter"
  if [ "${PAGEDC_PREFILL_TILE_COUNTER:-1}" = 1 ] && [ "$counted" -ne "$full" ]; then
    echo "emulator pack: FAILED (persistent launches without the work counter)"
    exit 1
  fi
  if [ "${PAGEDC_PREFILL_TILE_COUNTER:-1}" = 0 ] && [ "$counted" -ne 0 ]; then
    echo "emulator pack: FAILED (PAGEDC_PREFILL_TILE_COUNTER=0 but a launch took atomics)"
    exit 1
  fi
fi
decode=$(grep -c '"kernel":"pagedc_decode"' "$work/counters.jsonl" || true)
decode_bulk=$(grep '"kernel":"pagedc_decode"' "$work/counters.jsonl" |
                grep -c '"bulk_copies":[1-9]' || true)
echo "emulator pack: $decode_bulk of $decode decode launches copied K/V with tensor maps"
if [ "$decode_tma" = 0 ] && [ "$decode_bulk" -ne 0 ]; then
  echo "emulator pack: FAILED (PAGEDC_DECODE_TMA=0 but a decode launch used tensor maps)"
  exit 1
fi
if [ "$decode_tma" != 0 ] && [ "$decode_bulk" -eq 0 ] &&
   { [ -z "${PAGEDC_PACK_CASES:-}" ] || [ "$decode" -ne 0 ]; }; then
  echo "emulator pack: FAILED (no decode launch used tensor maps)"
  exit 1
fi
# PAGEDC_PACK_EXPECT_KERNELS: comma-separated parts of kernel descriptions
# (extended regular expressions, e.g. "m128w64 n128,d256 page[0-9]+ m128w64")
# each of which some case must have run.
if [ -n "${PAGEDC_PACK_EXPECT_KERNELS:-}" ]; then
  IFS=',' read -ra expected <<< "$PAGEDC_PACK_EXPECT_KERNELS"
  for part in "${expected[@]}"; do
    ran=$(grep -o '"kernel": "[^"]*"' "$work/check.json" | grep -cE -- " $part " || true)
    echo "emulator pack: $ran cases ran a '$part' kernel"
    if [ "$ran" -eq 0 ]; then
      echo "emulator pack: FAILED (no case ran a '$part' kernel)"
      exit 1
    fi
  done
fi
# The benchmark's per-launch timing on one decode row, split in two
# whatever the emulated SM count (the kernel option decode_splits; the
# emulator's event times are its own wall clock: only the shape of the
# result is checked): a time for the split kernel and one for the merge,
# each positive.
if [ -z "${PAGEDC_PACK_CASES:-}" ]; then
  PAGEDC_CUDA_DRIVER=emu "$build/bin/pagedc-gpu" bench "$work/pack" \
    --filter decode-none-B1-ctx1024-p16 --iters 2 --warmup 0 --flush-mib 1 --copy-mib 1 \
    --kernel-option decode_splits=2 --launch-times --json "$work/launch-times.json" \
    > "$work/launch-times.log" 2>&1 || {
    echo "emulator pack: FAILED (pagedc-gpu bench --launch-times)"
    tail -5 "$work/launch-times.log"
    exit 1
  }
  python3 - "$work/launch-times.json" <<'PY' || exit 1
import json, sys
row = json.load(open(sys.argv[1]))["configurations"][0]
times, launches = row.get("launch_queued_median_ms", []), row["launches"]
ok = (row["status"] == "ok" and len(launches) == 2 and len(times) == 2 and
      all(t > 0 for t in times) and launches[0].startswith("pagedc_decode grid (2,") and
      launches[1].startswith("pagedc_decode_merge"))
print("emulator pack: launch times %s for %s" % (times, [l.split(" grid")[0] for l in launches]))
if not ok:
    print("emulator pack: FAILED (launch times do not match the launches)")
    sys.exit(1)
PY
fi
echo "emulator pack: PASS ($summary)"
