#!/usr/bin/env bash
# The GPU check, run ON the GPU machine in one command (no LLVM there):
#
#   scripts/gpu-check.sh [--dry-run] [--prefill-options] [--decode-options]
#                        [--also PACK2]... [--also-with SETTINGS PACK2]...
#                        [--baselines LIST | --no-baselines] [--wheels]
#                        [--rows TEXT[,TEXT...]] [PACK_DIR]
#                                                             (default: gpu-pack/)
#
# The launch options and tiles below are kernel options (docs/kernels.md,
# "Kernel options": prefill_tma, prefill_shape, ...); this script sets them
# for pagedc-gpu as their environment variables, PAGEDC_ and the name in
# capitals, which pagedc-gpu maps onto the options of its calls.
#
# --prefill-options: the pack's prefill checks and benchmarks again with each
# launch option of the warpgroup prefill set against its default: "gather"
# (PAGEDC_PREFILL_TMA=0: every K/V tile gathered with cp.async instead of
# the default tensor-map copies of pages of 16 rows or more) and "pingpong"
# (PAGEDC_PREFILL_PINGPONG=1: the consumer warpgroups take turns; off by
# default) and "page-boxes" (PAGEDC_PREFILL_TMA_RUNS=0: one tensor-map box per
# page even where a tile's pages are consecutive) and "persistent"
# (PAGEDC_PREFILL_PERSISTENT=1: one CTA per SM, each taking the next query
# tile from a work counter when it is free, whatever the mask; by default
# only where the block mask's visits grow, as causal and sliding-window
# masks' do) and "per-tile" (PAGEDC_PREFILL_PERSISTENT=0: a CTA per query
# tile), each with a compute-sanitizer memcheck of one prefill case of
# 16-row pages; files prefixed with the option's name. (Persistent CTAs in
# fixed snaking rounds instead of a work counter: --also-with
# "PAGEDC_PREFILL_PERSISTENT=1 PAGEDC_PREFILL_TILE_COUNTER=0".)
# --decode-options: the same for the decode kernel's options, "decode-gather"
# (PAGEDC_DECODE_TMA=0: every K/V tile gathered with cp.async instead of
# the default tensor-map copies of whole tiles of pages of 16 rows or more),
# "decode-page-boxes" (PAGEDC_DECODE_TMA_RUNS=0: one box per page even for a
# tile of consecutive pages), "decode-splits2" (PAGEDC_DECODE_SPLIT_FACTOR=2:
# twice the splits the plan chooses, about two waves of CTAs where it chose
# one) and "decode-merge1" (PAGEDC_DECODE_MERGE_CHUNKS=1: one merge CTA a
# query row, where few rows' columns are divided among several by default),
# each with the pack's decode checks, benchmarks and a memcheck of one
# decode case.
# --also PACK2: a second pack (e.g. one prepared with
# PAGEDC_PREFILL_SHAPE=64x64x16, whose prefill bundles are the mma.sync
# kernel, or with PAGEDC_TEMPLATE_DIR holding an earlier commit's templates,
# for comparison) is checked and benchmarked after the first, its files
# prefixed "also-"; --also may be given again: the third pack's files are
# prefixed "also2-", and so on (summary.txt names each pack). Every step is
# killed after PAGEDC_STEP_TIMEOUT_S seconds (default 300): a hung kernel
# fails its step instead of the whole call.
# --also-with SETTINGS PACK2: the same, with SETTINGS (space-separated
# VAR=VALUE, e.g. "PAGEDC_PREFILL_PERSISTENT=1") in the environment of its
# checks and benchmarks; its checks also take PAGEDC_PREFILL_PERSISTENT_CTAS=3
# where SETTINGS make the CTAs persistent (as the "persistent" option does).
# The --also and --also-with packs share one numbering (also-, also2-, ...),
# in the order given; a pack may come twice, with different settings.
#
# --baselines LIST: the strongest baselines beside pagedc, in one process
# after PyTorch's flex (bench/gpu/baselines.py: sdpa_cudnn, fa4, flashinfer,
# flex_flash; default all), each checked against a float32 reference before
# it is timed; a package that does not import is reported unavailable.
# $PAGEDC_BASELINE_BUDGET_S (default 120) bounds them. --no-baselines: none.
# --rows TEXT[,TEXT...]: benchmark only the rows whose names hold one of the
# texts (e.g. prefill-causal-B4-S1024,prefill-document), in every pack and
# for PyTorch and the baselines (a launch option of --prefill-options or
# --decode-options: the texts that begin with its kind, prefill or decode);
# the checks still run every case. An A/B of a few rows then fits a short
# lease of the GPU.
# --wheels: first install the wheels scripts/gpu-wheels.sh staged on this
# machine (FlashAttention-4 and the CuTe DSL, FlashInfer) and put them on
# PYTHONPATH for the PyTorch steps.
#
# Results go to $OUT (the run tool's folder) or gpu-results/:
#   summary.txt          every step's status and the tables
#   gpu-check.json       correctness: per case and variant, the error, NaNs
#   sanitizer.txt        compute-sanitizer memcheck over one small case of
#                        each kernel (prefill, decode + merge, block-mask builder)
#   gpu-bench-pagedc.json, gpu-bench-torch.json, gpu-bench-baselines.json,
#   gpu-bench.json       section 4 benchmark: ours, PyTorch's, the baselines',
#                        merged (the commit, the clock, the strongest anchor
#                        of each row and where it wins) + targets; a decode
#                        row's split kernel and merge timed apart too
#                        (gpu-bench-pagedc.json, launch_queued_median_ms)
#   clocks.csv           nvidia-smi every 0.5 s from the first launch on: SM
#                        clock (and its maximum), power, temperature
#   clocks.json          their summary under load (bench/gpu/clocks.py):
#                        the SM clock's median, range, power, temperature
#
# Steps: (0) configure + build runtime-only (-DPAGEDC_ENABLE_COMPILER=OFF;
# fmt from the pack when the machine has none): pagedc-gpu and
# pagedc-device-query; (1) pagedc-gpu check; (2) compute-sanitizer; (3)
# pagedc-gpu bench + bench/gpu/torch_flex.py + bench/gpu/baselines.py +
# bench/gpu/report.py. The commit is the pack's (commit.txt, written by
# scripts/gpu-prepare.sh), else this tree's.
# --dry-run builds and runs everything up to the first launch (steps 0-1
# with --dry-run; no driver needed) and plans the baselines (which runs
# where, which rows each cannot express), which is what the tests do
# without a GPU.
# Exit status: 0 when every step passed, 1 otherwise.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dry=0
pack=""
also=()
also_env=()
options=0
baselines=all
wheels=0
expect_list=0
rows=""
expect_rows=0
for arg in "$@"; do
  if [[ $expect_list == 1 ]]; then baselines=$arg; expect_list=0; continue; fi
  if [[ $expect_rows == 1 ]]; then rows=$arg; expect_rows=0; continue; fi
  case "$arg" in
    --rows) expect_rows=1; continue ;;
    --dry-run) dry=1; continue ;;
    --baselines) expect_list=1; continue ;;
    --no-baselines) baselines=none; continue ;;
    --wheels) wheels=1; continue ;;
    --prefill-options) options=1; continue ;;
    --decode-options) decode_options=1; continue ;;
    --also) if [[ ${expect_also:-0} == 0 ]]; then expect_also=1; pending_env=""; continue; fi ;;
    --also-with) if [[ ${expect_also:-0} == 0 ]]; then expect_also=2; continue; fi ;;
    -h|--help) sed -n '2,/^# Exit status/p' "$0"; exit 0 ;;
    -*) [[ ${expect_also:-0} == 2 ]] ||
          { echo "gpu-check: unknown option '$arg' (--help lists them)" >&2; exit 2; } ;;
  esac
  if [[ ${expect_also:-0} == 2 ]]; then
    # The settings of --also-with: VAR=VALUE words only.
    for word in $arg; do
      [[ $word =~ ^[A-Z_][A-Z0-9_]*=[^[:space:]]*$ ]] ||
        { echo "gpu-check: --also-with: '$word' is not VAR=VALUE" >&2; exit 2; }
    done
    pending_env=$arg
    expect_also=1
    continue
  fi
  if [[ ${expect_also:-0} == 1 ]]; then
    also+=("$arg")
    also_env+=("${pending_env:-}")
    pending_env=""
  else
    pack="$arg"
  fi
  expect_also=0
done
if [[ $expect_list == 1 ]]; then
  echo "gpu-check: --baselines needs a comma list (sdpa_cudnn,fa4,flashinfer,flex_flash)" >&2
  exit 2
fi
if [[ $expect_rows == 1 || ( -n $rows && ! $rows =~ ^[A-Za-z0-9_+.-]+(,[A-Za-z0-9_+.-]+)*$ ) ]]; then
  echo "gpu-check: --rows needs a comma list of texts in row names (e.g." \
    "prefill-causal-B4-S1024,prefill-document)" >&2
  exit 2
fi
# The benchmarks' row filter: --rows, as pagedc-gpu and the Python benches
# take it.
row_args=()
[[ -z $rows ]] || row_args=(--filter "$rows")
# kind_rows KIND: the --rows texts that name rows of KIND (prefill, decode),
# or KIND itself without --rows; nothing when --rows names none of KIND.
kind_rows() {
  if [[ -z $rows ]]; then echo "$1"; return; fi
  local text picked=()
  IFS=',' read -ra texts <<<"$rows"
  for text in "${texts[@]}"; do
    [[ $text == "$1"* ]] && picked+=("$text")
  done
  (IFS=','; echo "${picked[*]}")
}
if [[ ${expect_also:-0} != 0 ]]; then
  echo "gpu-check: --also needs a pack directory (--also-with: settings, then a pack)" >&2
  exit 2
fi
pack=${pack:-$root/gpu-pack}
# Absolute paths: cmake reads -D paths relative to the build tree.
pack=$(cd "$pack" 2>/dev/null && pwd || echo "$pack")
for i in "${!also[@]}"; do
  also[i]=$(cd "${also[i]}" 2>/dev/null && pwd || echo "${also[i]}")
done
# also_prefix I: the file prefix of the I-th --also pack (also-, also2-, ...).
also_prefix() { if [[ $1 == 0 ]]; then echo also-; else echo "also$(($1 + 1))-"; fi; }
# also_check_env I: the I-th pack's settings for its checks (3 persistent
# CTAs where its settings make them persistent, so that the pack's small
# cases run several query tiles a CTA).
also_check_env() {
  local settings=${also_env[$1]}
  if [[ " $settings " == *" PAGEDC_PREFILL_PERSISTENT=1 "* &&
        " $settings " != *" PAGEDC_PREFILL_PERSISTENT_CTAS="* ]]; then
    settings="$settings PAGEDC_PREFILL_PERSISTENT_CTAS=3"
  fi
  echo "$settings"
}
out=${OUT:-$root/gpu-results}
build=${PAGEDC_GPU_RT_BUILD:-$root/build-gpu-check}
jobs=${PAGEDC_JOBS:-$(nproc 2>/dev/null || echo 4)}
budget=${PAGEDC_TORCH_BUDGET_S:-180}
baseline_budget=${PAGEDC_BASELINE_BUDGET_S:-120}
baseline_args=()
[[ $baselines == all || $baselines == none ]] || baseline_args=(--only "$baselines")
step_timeout=${PAGEDC_STEP_TIMEOUT_S:-300}
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
failures=0
note() { echo "$*" | tee -a "$summary"; }
step() {  # step NAME COMMAND...: runs, records the status
  local name=$1; shift
  note "== $name"
  local limit=${step_limit:-$step_timeout}
  timeout --kill-after=15 "$limit" "$@" 2>&1 | tee -a "$summary"
  local status=${PIPESTATUS[0]}
  local why="exit $status"
  [[ $status == 124 || $status == 137 ]] && why="killed after ${limit} s"
  note "== $name: $([[ $status == 0 ]] && echo ok || echo "FAILED ($why)")"
  [[ $status == 0 ]] || failures=$((failures + 1))
  return $status
}

commit=$(cat "$pack/commit.txt" 2>/dev/null || git -C "$root" rev-parse HEAD 2>/dev/null ||
         echo unknown)
note "pagedc GPU check $(date -u +%Y-%m-%dT%H:%M:%SZ) pack=$pack commit=$commit dry_run=$dry"
[[ -f "$pack/pack.json" ]] || { note "no pack at $pack (run scripts/gpu-prepare.sh first)"; exit 1; }
if [[ $dry == 0 ]] && command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | tee -a "$summary"
fi

# Packs from scripts/gpu-prepare-ab.sh hold their bundles compressed (the
# run tool's 64 MiB): unpacked here where a pack has no bundles/.
for dir in "$pack" "${also[@]}"; do
  if [[ ! -d "$dir/bundles" && -f "$dir/bundles.tar.gz" ]]; then
    tar -xzf "$dir/bundles.tar.gz" -C "$dir" && note "unpacked $dir/bundles.tar.gz" ||
      { note "cannot unpack $dir/bundles.tar.gz"; failures=$((failures + 1)); }
  fi
done

# (0) Build: runtime only.
source "$root/scripts/gpu-runtime-args.sh"
runtime_cmake_args "$pack"
step "configure (runtime only)" cmake -S "$root" -B "$build" -G Ninja "${runtime_args[@]}" || exit 1
step "build" ninja -C "$build" -j"$jobs" pagedc-gpu pagedc-device-query || exit 1
gpu="$build/bin/pagedc-gpu"

# smallest_case KIND MIN_PAGE: the pack's smallest case of KIND with a
# device-built block mask and pages of at least MIN_PAGE rows (what a
# compute-sanitizer memcheck runs), or nothing.
smallest_case() {
  python3 - "$pack" "$1" "$2" <<'EOF'
import json, sys
pack = json.load(open(sys.argv[1] + "/pack.json"))
cases = [c for c in pack["cases"] if c["kind"] == sys.argv[2] and c["q_block"] > 0
         and c["page_size"] >= int(sys.argv[3])]
cases.sort(key=lambda c: c["batch"] * c["heads_q"] * c["q_len"] * c["max_kv_len"])
print(cases[0]["name"] if cases else "")
EOF
}

# The launch options (--prefill-options, --decode-options) as
# label:setting:kernel kind[:settings for the checks only]; the memcheck
# case of each kind. (Persistent CTAs: the benchmarks take one per SM, the
# checks 3, so that the pack's small cases run several query tiles per CTA.)
variants=()
if [[ $options == 1 ]]; then
  variants+=("gather:PAGEDC_PREFILL_TMA=0:prefill" "pingpong:PAGEDC_PREFILL_PINGPONG=1:prefill"
            "page-boxes:PAGEDC_PREFILL_TMA_RUNS=0:prefill"
            "persistent:PAGEDC_PREFILL_PERSISTENT=1:prefill:PAGEDC_PREFILL_PERSISTENT_CTAS=3"
            "per-tile:PAGEDC_PREFILL_PERSISTENT=0:prefill")
fi
if [[ ${decode_options:-0} == 1 ]]; then
  variants+=("decode-gather:PAGEDC_DECODE_TMA=0:decode"
            "decode-page-boxes:PAGEDC_DECODE_TMA_RUNS=0:decode"
            "decode-splits2:PAGEDC_DECODE_SPLIT_FACTOR=2:decode"
            "decode-merge1:PAGEDC_DECODE_MERGE_CHUNKS=1:decode")
fi
declare -A options_case=()
if [[ ${#variants[@]} -gt 0 ]]; then
  options_case=([prefill]="$(smallest_case prefill 16)" [decode]="$(smallest_case decode 16)")
fi

if [[ $dry == 1 ]]; then
  step "check --dry-run" "$gpu" check "$pack" --dry-run --json "$out/gpu-check.json"
  step "bench --dry-run" "$gpu" bench "$pack" --dry-run "${row_args[@]}" \
    --json "$out/gpu-bench-pagedc.json"
  for i in "${!also[@]}"; do
    step "check --dry-run (also: ${also[i]}${also_env[i]:+ with ${also_env[i]}})" \
      env $(also_check_env "$i") "$gpu" check "${also[i]}" --dry-run \
      --json "$out/$(also_prefix "$i")gpu-check.json"
  done
  for variant in "${variants[@]}"; do
    IFS=: read -r label settings kind check_only <<<"$variant"
    step "check --dry-run ($settings $check_only; memcheck case: ${options_case[$kind]:-none})" \
      env $settings $check_only \
      "$gpu" check "$pack" --dry-run --filter "$kind" --json "$out/$label-gpu-check.json"
    picked=$(kind_rows "$kind")
    [[ -n $picked ]] || continue
    step "bench --dry-run ($settings)" env $settings "$gpu" bench "$pack" --dry-run \
      --filter "$picked" --json "$out/$label-gpu-bench-pagedc.json"
  done
  if [[ $baselines != none ]]; then
    step "baselines --dry-run ($baselines)" python3 "$root/bench/gpu/baselines.py" --dry-run \
      --pack "$pack" --json "$out/gpu-bench-baselines.json" --commit "$commit" \
      "${baseline_args[@]}" "${row_args[@]}"
  fi
  note "gpu-check (dry run): $failures step(s) failed"
  exit $((failures > 0))
fi

step "device" "$build/bin/pagedc-device-query" || exit 1

# The SM clock, power and temperature every half second while the checks
# and benchmarks run (clocks.csv): TFLOP/s are compared with the model's
# peak at 1.83 GHz, and under load the clock may sit well below that.
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.max.sm,power.draw,temperature.gpu \
    --format=csv -lms 500 >"$out/clocks.csv" 2>&1 &
  clock_sampler=$!
  trap 'kill "$clock_sampler" 2>/dev/null' EXIT
fi

# (1) Correctness.
step "check" "$gpu" check "$pack" --json "$out/gpu-check.json"

# (2) compute-sanitizer memcheck on one small case of each kernel: the first
# prefill and decode cases with a device-built block mask (builder + kernel).
if command -v compute-sanitizer >/dev/null; then
  : >"$out/sanitizer.txt"
  for kind in prefill decode; do
    name=$(smallest_case "$kind" 1)
    [[ -n "$name" ]] || continue
    step "compute-sanitizer memcheck $name" compute-sanitizer --tool memcheck \
      --error-exitcode 3 --log-file "$out/sanitizer-$kind.log" \
      "$gpu" check "$pack" --filter "$name"
    cat "$out/sanitizer-$kind.log" >>"$out/sanitizer.txt" 2>/dev/null
    rm -f "$out/sanitizer-$kind.log"
  done
else
  note "compute-sanitizer not found: memcheck skipped"
  failures=$((failures + 1))
fi

# (3) Benchmarks: ours, (4) the second pack, then PyTorch's on the same GPU, then the merge.
step "bench (pagedc)" "$gpu" bench "$pack" --launch-times "${row_args[@]}" \
  --json "$out/gpu-bench-pagedc.json"
# (4) The second pack: correctness and our benchmark, before PyTorch's (which
# is not rerun: the configurations are the same); merged with it after.
also_done=()
for i in "${!also[@]}"; do
  prefix=$(also_prefix "$i")
  if [[ -f "${also[i]}/pack.json" ]]; then
    with=${also_env[i]:+ with ${also_env[i]}}
    step "check (also: ${also[i]}$with; files $prefix*)" env $(also_check_env "$i") \
      "$gpu" check "${also[i]}" --json "$out/${prefix}gpu-check.json"
    step "bench (pagedc, also: ${also[i]}$with; files $prefix*)" env ${also_env[i]} \
      "$gpu" bench "${also[i]}" "${row_args[@]}" --json "$out/${prefix}gpu-bench-pagedc.json"
    also_done+=("$prefix")
  else
    note "no pack at ${also[i]}"
    failures=$((failures + 1))
  fi
done

# (5) The launch options, on the same pack.
for variant in "${variants[@]}"; do
  IFS=: read -r label settings kind check_only <<<"$variant"
  step "check ($settings $check_only)" env $settings $check_only "$gpu" check "$pack" \
    --filter "$kind" --json "$out/$label-gpu-check.json"
  memcheck_case=${options_case[$kind]}
  if [[ -n "$memcheck_case" ]] && command -v compute-sanitizer >/dev/null; then
    step "compute-sanitizer memcheck $memcheck_case ($settings $check_only)" \
      env $settings $check_only \
      compute-sanitizer --tool memcheck --error-exitcode 3 \
      --log-file "$out/$label-sanitizer.txt" "$gpu" check "$pack" --filter "$memcheck_case"
  fi
  picked=$(kind_rows "$kind")
  if [[ -n $picked ]]; then
    step "bench (pagedc, $settings)" env $settings "$gpu" bench "$pack" --filter "$picked" \
      --launch-times --json "$out/$label-gpu-bench-pagedc.json"
  else
    note "bench (pagedc, $settings): skipped, --rows names no $kind row"
  fi
done

if [[ $wheels == 1 ]]; then
  step "install the staged baseline wheels" "$root/scripts/gpu-wheels.sh" install &&
    export PYTHONPATH=$(cat "${PAGEDC_WHEEL_SITE:-/tmp/pagedc-site}/pythonpath")${PYTHONPATH:+:$PYTHONPATH}
fi
PYTHONUNBUFFERED=1 step_limit=$((budget + 180)) step "bench (PyTorch flex_attention + PagedAttention, SDPA flash)" \
  python3 "$root/bench/gpu/torch_flex.py" --pack "$pack" --json "$out/gpu-bench-torch.json" \
  --budget-s "$budget" "${row_args[@]}"
if [[ $baselines != none ]]; then
  PYTHONUNBUFFERED=1 step_limit=$((baseline_budget + 180)) step "bench (baselines: $baselines)" \
    python3 "$root/bench/gpu/baselines.py" --pack "$pack" --json "$out/gpu-bench-baselines.json" \
    --budget-s "$baseline_budget" --commit "$commit" "${baseline_args[@]}" "${row_args[@]}"
fi

# The clock under load, from the samples (bench/gpu/clocks.py): what the
# TFLOP/s above ran at; the reports carry it.
if [[ -n ${clock_sampler:-} ]]; then
  kill "$clock_sampler" 2>/dev/null
  wait "$clock_sampler" 2>/dev/null
  step "clocks" python3 "$root/bench/gpu/clocks.py" "$out/clocks.csv" --json "$out/clocks.json"
fi

report_args=(--commit "$commit" --clocks "$out/clocks.json")
[[ $baselines == none ]] || report_args+=(--baselines "$out/gpu-bench-baselines.json")
step "report" python3 "$root/bench/gpu/report.py" "$out/gpu-bench-pagedc.json" \
  "$out/gpu-bench-torch.json" "${report_args[@]}" --json "$out/gpu-bench.json"

for prefix in "${also_done[@]}"; do
  step "report (${prefix%-})" python3 "$root/bench/gpu/report.py" "$out/${prefix}gpu-bench-pagedc.json" \
    "$out/gpu-bench-torch.json" "${report_args[@]}" --json "$out/${prefix}gpu-bench.json"
done

for variant in "${variants[@]}"; do
  label=${variant%%:*}
  [[ -f "$out/$label-gpu-bench-pagedc.json" ]] || continue
  step "report ($label)" python3 "$root/bench/gpu/report.py" "$out/$label-gpu-bench-pagedc.json" \
    "$out/gpu-bench-torch.json" "${report_args[@]}" --json "$out/$label-gpu-bench.json"
done

note "gpu-check: $failures step(s) failed; results in $out"
exit $((failures > 0))
