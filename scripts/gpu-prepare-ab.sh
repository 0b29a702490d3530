#!/usr/bin/env bash
# Prepares, HERE, packs whose kernels come from earlier commits' templates, to
# time a kernel change against its predecessor in one call of the GPU check:
#
#   scripts/gpu-prepare-ab.sh BASE_PACK REV[=NAME] [REV[=NAME]...]
#
# BASE_PACK: a pack scripts/gpu-prepare.sh wrote from the working tree. For
# each REV: `git archive REV templates` into a scratch folder, a pack
# gpu-pack-REV (beside BASE_PACK) prepared with PAGEDC_TEMPLATE_DIR pointing
# there (same cases, same benchmark plan; $PAGEDC_PREFILL_SHAPE and the
# like, the kernel options as the tools take them from the environment,
# apply as to BASE_PACK), then its cases/ and deps/ replaced by links to
# BASE_PACK's, so that all the packs stay under the 64 MiB the run tool
# carries with the working tree (a linked pack is ~3 MiB: its bundles go
# into bundles.tar.gz, which gpu-check.sh unpacks); "REV=NAME" names it gpu-pack-NAME
# instead (e.g. `PAGEDC_PREFILL_SHAPE=128x128x64s2,d256=128x64x64
# scripts/gpu-prepare-ab.sh gpu-pack HEAD=ring2`: this commit's kernels
# with another ring). The kernels' launch arguments must not
# have changed between REV and the working tree (docs/gpu.md, "--also").
# Prints the gpu-check.sh command and the carry list. Builds nothing: it
# uses $PAGEDC_GPU_BUILD (default build/) as gpu-prepare.sh does with
# PAGEDC_GPU_SKIP_BUILD=1.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ $# -lt 2 || $1 == -h || $1 == --help ]]; then sed -n '2,20p' "$0"; exit 2; fi
base=$(cd "$1" && pwd) || exit 2
shift
[[ -f "$base/pack.json" ]] || { echo "gpu-prepare-ab: no pack at $base" >&2; exit 1; }
parent=$(dirname "$base")
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for item in "$@"; do
  rev=${item%%=*}
  name=${item#*=}
  commit=$(git -C "$root" rev-parse --short "$rev^{commit}") ||
    { echo "gpu-prepare-ab: $rev is not a commit" >&2; exit 1; }
  [[ $item == *=* ]] || name=$commit
  [[ $name =~ ^[A-Za-z0-9._-]+$ ]] ||
    { echo "gpu-prepare-ab: '$name' is not a pack name (letters, digits, . _ -)" >&2; exit 1; }
  pack="$parent/gpu-pack-$name"
  mkdir -p "$scratch/$commit"
  git -C "$root" archive "$commit" templates | tar -x -C "$scratch/$commit"
  echo "== $pack: templates of $commit${PAGEDC_PREFILL_SHAPE:+, PAGEDC_PREFILL_SHAPE=$PAGEDC_PREFILL_SHAPE}"
  PAGEDC_TEMPLATE_DIR="$scratch/$commit/templates" PAGEDC_GPU_SKIP_BUILD=1 \
    PAGEDC_GPU_BUILD="${PAGEDC_GPU_BUILD:-$root/build}" "$root/scripts/gpu-prepare.sh" "$pack"
  rm -rf "$pack/cases" "$pack/deps"
  ln -s "../$(basename "$base")/cases" "$pack/cases"
  ln -s "../$(basename "$base")/deps" "$pack/deps"
  # The cubins compress about 3:1; gpu-check.sh unpacks bundles.tar.gz where
  # a pack has no bundles/.
  tar -czf "$pack/bundles.tar.gz" -C "$pack" bundles
  rm -rf "$pack/bundles"
done
# BASE_PACK and every pack linked to it (this call's and earlier calls'), in
# name order; the run tool's 64 MiB hold the working tree that travels
# (tracked and untracked files git does not ignore) and the carried packs.
packs=("$base")
for pack in "$parent"/gpu-pack-*; do
  [[ -L "$pack/cases" && $(readlink "$pack/cases") == "../$(basename "$base")/cases" ]] || continue
  packs+=("$pack")
done
tree=$(git -C "$root" ls-files -z --cached --others --exclude-standard |
         (cd "$root" && xargs -0 du -cb 2>/dev/null) | awk '$2 == "total" {s += $1} END {print s + 0}')
packed=$(du -sb "${packs[@]}" | awk '{s += $1} END {print s}')
total=$(( (tree + packed + 1048575) / 1048576 ))
echo "== packs $(( (packed + 1048575) / 1048576 )) MiB + working tree $(( (tree + 1048575) / 1048576 )) MiB = $total MiB (the run tool carries 64 in all)"
[[ $total -le 64 ]] || { echo "gpu-prepare-ab: over 64 MiB: carry fewer packs" >&2; exit 1; }
names=()
also=()
for pack in "${packs[@]}"; do
  names+=("$(basename "$pack")")
  [[ $pack == "$base" ]] || also+=(--also "$(basename "$pack")")
done
echo "== on the GPU machine (carry: ${names[*]}):"
echo "scripts/gpu-check.sh --prefill-options ${also[*]} $(basename "$base")"
