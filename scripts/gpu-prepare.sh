#!/usr/bin/env bash
# Prepares the GPU check pack HERE, on a machine with the compiler (LLVM/MLIR
# 19 and the CUDA toolkit's NVRTC; no GPU needed):
#
#   scripts/gpu-prepare.sh [--quick] [--bench-head-dim N] [PACK_DIR]   (default: gpu-pack/)
#
# 1. builds pagedc, pagedc-gpu-prepare and pagedc-gpu (build-gpu/, or
#    $PAGEDC_GPU_BUILD; PAGEDC_GPU_SKIP_BUILD=1 uses what is there);
# 2. `pagedc --emit=bundle` writes one bundle through the CLI (causal, prefill
#    + decode, bf16, page 16, GQA 4) so the check also covers CLI bundles;
# 3. pagedc-gpu-prepare writes the corpus cases, their bundles and float64
#    references, and the benchmark plan (--quick: a few of each, for tests;
#    --bench-head-dim N: the plan at head dim 64 or 256, the cases as ever);
# 4. copies what the GPU machine lacks: fmt's headers with a header-only CMake
#    package (PACK/deps/fmt), xxhash.h and nlohmann/json (PACK/deps/include);
# 5. dry-runs the pack (`pagedc-gpu check --dry-run`, `bench --dry-run`) and
#    checks its size against the 64 MiB the run tool carries.
#
# Then, on the GPU machine (see docs/gpu.md): scripts/gpu-check.sh
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
quick=()
bench_dim=()
pack=""
expect_dim=0
for arg in "$@"; do
  if [[ $expect_dim == 1 ]]; then bench_dim=(--bench-head-dim "$arg"); expect_dim=0; continue; fi
  case "$arg" in
    --quick) quick=(--quick) ;;
    --bench-head-dim) expect_dim=1 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) pack="$arg" ;;
  esac
done
if [[ $expect_dim == 1 ]]; then echo "gpu-prepare: --bench-head-dim needs 64, 128 or 256" >&2; exit 2; fi
pack=${pack:-$root/gpu-pack}
build=${PAGEDC_GPU_BUILD:-$root/build-gpu}
jobs=${PAGEDC_JOBS:-2}
export PAGEDC_CACHE_DIR=${PAGEDC_CACHE_DIR:-$build/kernel-cache}

if [[ "${PAGEDC_GPU_SKIP_BUILD:-0}" != 1 ]]; then
  cmake -S "$root" -B "$build" -G Ninja >/dev/null
  ninja -C "$build" -j"$jobs" pagedc pagedc-gpu-prepare pagedc-gpu
fi
for tool in pagedc pagedc-gpu-prepare pagedc-gpu; do
  [[ -x "$build/bin/$tool" ]] || { echo "gpu-prepare: $build/bin/$tool is missing" >&2; exit 1; }
done

rm -rf "$pack"
mkdir -p "$pack/bundles"
echo "== pagedc --emit=bundle (CLI bundle)"
# (Its tile shape is the CLI's default for sm_90: $PAGEDC_PREFILL_SHAPE, the
# prefill_shape kernel option as the tools take it from the environment, is
# for the pack's runtime bundles, and a warpgroup shape would need sm_90a.)
env -u PAGEDC_PREFILL_SHAPE "$build/bin/pagedc" --emit=bundle --kernel=prefill,decode --arch=sm_90 --dtype=bf16 \
  --head-dim=128 --page-size=16 --gqa=4 --mask=causal "$root/examples/causal.attn" \
  -o "$pack/bundles/cli-causal"

echo "== pagedc-gpu-prepare"
"$build/bin/pagedc-gpu-prepare" -o "$pack" "${quick[@]}" "${bench_dim[@]}" \
  --cli-bundle "$pack/bundles/cli-causal"

# The commit the pack was prepared from ("-modified" when tracked files
# differ from it): gpu-check.sh writes it into every result.
commit=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
if [[ $commit != unknown ]] && ! git -C "$root" diff --quiet HEAD 2>/dev/null; then
  commit="$commit-modified"
fi
echo "$commit" >"$pack/commit.txt"

echo "== dependencies for the GPU machine (fmt, xxHash, nlohmann/json; header-only)"
fmt_include=""
for candidate in /usr/include /usr/local/include; do
  [[ -f "$candidate/fmt/format.h" ]] && fmt_include=$candidate && break
done
[[ -n "$fmt_include" ]] || { echo "gpu-prepare: fmt headers not found" >&2; exit 1; }
mkdir -p "$pack/deps/fmt/include"
cp -r "$fmt_include/fmt" "$pack/deps/fmt/include/"
cat >"$pack/deps/fmt/fmt-config.cmake" <<'EOF'
# fmt as a header-only package (carried by the pagedc GPU pack; the GPU
# machine has no libfmt). Use with -Dfmt_DIR=<this directory>.
if(NOT TARGET fmt::fmt)
  add_library(fmt::fmt INTERFACE IMPORTED)
  set_target_properties(fmt::fmt PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${CMAKE_CURRENT_LIST_DIR}/include"
    INTERFACE_COMPILE_DEFINITIONS "FMT_HEADER_ONLY=1")
endif()
set(fmt_FOUND TRUE)
EOF

# xxHash and nlohmann/json, header-only, for -DPAGEDC_EXTRA_INCLUDE.
mkdir -p "$pack/deps/include"
for header in xxhash.h nlohmann; do
  found=""
  for candidate in /usr/include /usr/local/include; do
    [[ -e "$candidate/$header" ]] && found=$candidate/$header && break
  done
  [[ -n "$found" ]] || { echo "gpu-prepare: $header not found (libxxhash-dev, nlohmann-json3-dev)" >&2; exit 1; }
  cp -r "$found" "$pack/deps/include/"
done

echo "== dry run"
if ! "$build/bin/pagedc-gpu" check "$pack" --dry-run --json "$pack/dry-run-check.json" \
  >"$pack/dry-run-check.txt"; then
  refused=$(grep -c '^error' "$pack/dry-run-check.txt" || true)
  if [[ -n "${PAGEDC_PREFILL_SHAPE:-}" ]]; then
    # A tile shape override can make some cases' launches refuse (128-key
    # tiles and the pack's 64-key block masks): the pack is still usable
    # with gpu-check --also, where those cases fail their check.
    echo "gpu-prepare: with PAGEDC_PREFILL_SHAPE=$PAGEDC_PREFILL_SHAPE the dry run refuses $refused cases (their lines in $pack/dry-run-check.txt)" >&2
  else
    grep '^error' "$pack/dry-run-check.txt" >&2 || true
    echo "gpu-prepare: the dry run of the pack's checks failed" >&2
    exit 1
  fi
fi
"$build/bin/pagedc-gpu" bench "$pack" --dry-run --json "$pack/dry-run-bench.json" >"$pack/dry-run-bench.txt"
tail -n 1 "$pack/dry-run-check.txt"

size_kib=$(du -sk "$pack" | cut -f1)
echo "gpu-prepare: $pack is $((size_kib / 1024)) MiB"
if (( size_kib > 60 * 1024 )); then
  echo "gpu-prepare: the pack is over 60 MiB; the run tool carries at most 64 MiB with the tree" >&2
  exit 1
fi
