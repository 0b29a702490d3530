#!/usr/bin/env bash
# Prepares, HERE, packs whose kernels come from earlier commits' templates, to
# time a kernel change against its predecessor in one call of the GPU check:
#
#   scripts/gpu-prepare-ab.sh BASE_PACK REV [REV...]
#
# BASE_PACK: a pack scripts/gpu-prepare.sh wrote from the working tree. For
# each REV: `git archive REV templates` into a scratch folder, a pack
# gpu-pack-REV (beside BASE_PACK) prepared with PAGEDC_TEMPLATE_DIR pointing
# there (same cases, same benchmark plan; $PAGEDC_PREFILL_SHAPE and the
# like apply as to BASE_PACK), then its cases/ and deps/ replaced by links to
# BASE_PACK's, so that all the packs stay under the 64 MiB the run tool
# carries (a linked pack is ~8 MiB). The kernels' launch arguments must not
# have changed between REV and the working tree (docs/gpu.md, "--also").
# Prints the gpu-check.sh command and the carry list. Builds nothing: it
# uses $PAGEDC_GPU_BUILD (default build/) as gpu-prepare.sh does with
# PAGEDC_GPU_SKIP_BUILD=1.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ $# -lt 2 || $1 == -h || $1 == --help ]]; then sed -n '2,17p' "$0"; exit 2; fi
base=$(cd "$1" && pwd) || exit 2
shift
[[ -f "$base/pack.json" ]] || { echo "gpu-prepare-ab: no pack at $base" >&2; exit 1; }
parent=$(dirname "$base")
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
also=()
packs=("$base")
for rev in "$@"; do
  commit=$(git -C "$root" rev-parse --short "$rev^{commit}") ||
    { echo "gpu-prepare-ab: $rev is not a commit" >&2; exit 1; }
  pack="$parent/gpu-pack-$commit"
  mkdir -p "$scratch/$commit"
  git -C "$root" archive "$commit" templates | tar -x -C "$scratch/$commit"
  echo "== $pack: templates of $commit"
  PAGEDC_TEMPLATE_DIR="$scratch/$commit/templates" PAGEDC_GPU_SKIP_BUILD=1 \
    PAGEDC_GPU_BUILD="${PAGEDC_GPU_BUILD:-$root/build}" "$root/scripts/gpu-prepare.sh" "$pack"
  rm -rf "$pack/cases" "$pack/deps"
  ln -s "../$(basename "$base")/cases" "$pack/cases"
  ln -s "../$(basename "$base")/deps" "$pack/deps"
  also+=(--also "$(basename "$pack")")
  packs+=("$pack")
done
total=$(du -sm "${packs[@]}" | awk '{s += $1} END {print s}')
echo "== packs: $total MiB in all (the run tool carries 64)"
[[ $total -le 64 ]] || { echo "gpu-prepare-ab: over 64 MiB" >&2; exit 1; }
names=()
for pack in "${packs[@]}"; do names+=("$(basename "$pack")"); done
echo "== on the GPU machine (carry: ${names[*]}):"
echo "scripts/gpu-check.sh --prefill-options ${also[*]} $(basename "$base")"
