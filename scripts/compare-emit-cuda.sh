#!/usr/bin/env bash
# Compares `pagedc --emit=cuda` for every mod of examples/*.attn (prefill and
# decode, sm_90 and sm_80) between an older commit and this tree, section by
# section (Prelude.cuh, generated mod code, each template, ...). A refactor
# must leave every section byte-identical; a section that differs is listed
# with the commits since BASE that touched its source, which must explain it.
#
#   scripts/compare-emit-cuda.sh BASE [BUILD_DIR]
#
# BASE is built (target pagedc only) in a worktree under ${TMPDIR:-/tmp},
# kept for later runs; BUILD_DIR (default build/) holds this tree's pagedc.
# Exit status: 0 when every section of every kernel matches, 1 otherwise.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -lt 1 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
base=$(git -C "$root" rev-parse --short=12 "$1^{commit}")
head_pagedc=${2:-$root/build}/bin/pagedc
[ -x "$head_pagedc" ] || { echo "no pagedc at $head_pagedc: build this tree first" >&2; exit 2; }
tree=${TMPDIR:-/tmp}/pagedc-emit-$base
if [ ! -x "$tree/build/bin/pagedc" ]; then
  [ -d "$tree" ] || git -C "$root" worktree add --detach "$tree" "$base" >/dev/null
  echo "building pagedc at $base in $tree ..." >&2
  cmake -S "$tree" -B "$tree/build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$tree/build" --target pagedc -j "$(nproc)" >&2
fi
base_pagedc=$tree/build/bin/pagedc
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Splits an --emit=cuda translation unit at its "// ---- NAME ----" markers
# into $2/NAME.
split_sections() {
  mkdir -p "$2"
  awk -v dir="$2" '
    /^\/\/ ---- .* ----$/ { name = $3; next }
    name != "" { print > (dir "/" name) }' "$1"
}

# The source of a section, for the commits that explain a difference.
section_source() {
  case "$1" in
    generated) echo "compiler dialects" ;;
    configuration) echo "runtime/src/kernels" ;;
    KernelArgs.h) echo "runtime/internal/pagedc/KernelArgs.h" ;;
    *) echo "templates/$1" ;;
  esac
}

kernels=0 same=0
declare -A differing seen
for file in "$root"/examples/*.attn; do
  mods=$("$head_pagedc" --emit=lowered "$file" 2>/dev/null |
           grep -o 'flex.mod \(mask\|score\) @[A-Za-z0-9_]*' | sed 's/flex.mod //; s/ @/=/' || true)
  for mod in $mods; do
    kind=${mod%%=*} name=${mod#*=}
    for kernel in prefill decode; do
      for arch in sm_90 sm_80; do
        args=("$file" --emit=cuda "--$kind=$name" "--kernel=$kernel" "--arch=$arch")
        label="$(basename "$file") $kind=$name $kernel $arch"
        if ! "$head_pagedc" "${args[@]}" -o "$work/head.cu" 2>"$work/err" ||
           ! "$base_pagedc" "${args[@]}" -o "$work/base.cu" 2>>"$work/err"; then
          echo "$label: not emitted by both ($(head -1 "$work/err"))"
          continue
        fi
        kernels=$((kernels + 1))
        if cmp -s "$work/head.cu" "$work/base.cu"; then
          same=$((same + 1))
          continue
        fi
        rm -rf "$work/h" "$work/b"
        split_sections "$work/head.cu" "$work/h"
        split_sections "$work/base.cu" "$work/b"
        for section in $( (ls "$work/h"; ls "$work/b") | sort -u); do
          seen[$section]=1
          if ! cmp -s "$work/h/$section" "$work/b/$section" 2>/dev/null; then
            differing[$section]=$(( ${differing[$section]:-0} + 1 ))
          fi
        done
      done
    done
  done
done

echo "compared $kernels kernels (examples/*.attn, prefill and decode, sm_90 and sm_80):" \
  "$same byte-identical to $base"
identical=""
for section in "${!seen[@]}"; do
  [ -n "${differing[$section]:-}" ] || identical="$identical $section"
done
[ -z "$identical" ] || echo "sections identical in every kernel:$identical"
status=0
for section in "${!differing[@]}"; do
  status=1
  echo
  echo "section $section differs in ${differing[$section]} kernels; commits since $base" \
    "touching $(section_source "$section"):"
  # shellcheck disable=SC2046
  git -C "$root" log --oneline "$base..HEAD" -- $(section_source "$section") | sed 's/^/  /'
done
exit $status
