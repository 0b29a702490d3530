#!/usr/bin/env bash
# The baselines' Python packages for a GPU machine that cannot download
# (bench/gpu/baselines.py; docs/gpu.md, "Baselines"). FlashAttention-4 and
# compiled flex's FLASH backend need the CuTe DSL (about 100 MB of wheels),
# FlashInfer about 140 MB more: more than one call of the run tool carries
# (64 MiB with the working tree), so the wheels travel in parts, one part a
# call, while the machine stays warm between the calls.
#
#   scripts/gpu-wheels.sh download [--aot PACK] [SET...]   HERE: fetch the
#       wheels of the sets (fa4, flashinfer; default both), cut them into
#       parts of at most $PAGEDC_WHEEL_PART_MIB MiB (default 40) under
#       .gpu-wheels/part-N/, with .gpu-wheels/manifest (each wheel's sha256
#       and size); prints the commands of the device calls. With --aot PACK
#       and the flashinfer set, also compiles here the FlashInfer kernels
#       PACK's baseline rows load (bench/gpu/flashinfer_aot.py; nvcc from
#       $CUDA_HOME, default /usr/local/cuda; a Python with torch,
#       $PAGEDC_TORCH_PYTHON, default the venv scripts/python-torch-tests.sh
#       makes (build/torch-venv), else python3; minutes on 2 cores, kept in
#       .gpu-wheels-cache/ for the next download) and ships them as one more
#       wheel that `install` unpacks where FlashInfer looks first, so the GPU
#       machine loads them instead of compiling
#   scripts/gpu-wheels.sh stage N             THERE: keep part N (carried as
#       .gpu-wheels/part-N and .gpu-wheels/manifest) in $PAGEDC_WHEEL_STAGE
#       (default /tmp/pagedc-wheels)
#   scripts/gpu-wheels.sh install             THERE: stage the parts this call
#       carries, join the staged parts, check every wheel against the
#       manifest, install them without their dependencies into
#       $PAGEDC_WHEEL_SITE (default /tmp/pagedc-site); then PYTHONPATH from
#       $PAGEDC_WHEEL_SITE/pythonpath (scripts/gpu-check.sh --wheels does it)
#
# Only the packages the GPU machine's image lacks are fetched (its image has
# torch, triton, numpy, einops, ninja, nvidia-ml-py, cuda-bindings, cuDNN).
# Exit status: 0 done, 1 a download, part or check failed, 2 usage error.
source "$(dirname "$0")/script-help.sh"
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=$root/.gpu-wheels
stage=${PAGEDC_WHEEL_STAGE:-/tmp/pagedc-wheels}
site=${PAGEDC_WHEEL_SITE:-/tmp/pagedc-site}
part_mib=${PAGEDC_WHEEL_PART_MIB:-40}

# Pinned: the versions the baselines' calls were written against.
fa4_set=(flash-attn-4==4.0.0b40 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1
         nvidia-cutlass-dsl-libs-base==4.8.1
         nvidia-cutlass-dsl-libs-cu13==4.8.1 apache-tvm-ffi==0.1.15.post2
         torch-c-dlpack-ext==0.1.5 quack-kernels==0.6.5)
flashinfer_set=(flashinfer-python==0.7.4 cuda-tile==1.7.0 nccl4py==0.6.0
                nccl-extensions==0.1.0 nvidia-cudnn-frontend==1.32.0)

usage() { echo "gpu-wheels: $*" >&2; echo "usage: scripts/gpu-wheels.sh download [--aot PACK] [fa4|flashinfer]... | stage N | install" >&2; exit 2; }

download() {
  local specs=() set aot_pack="" with_flashinfer=0
  if [[ ${1:-} == --aot ]]; then
    [[ $# -ge 2 ]] || usage "--aot needs a pack"
    aot_pack=$2; shift 2
    [[ -f "$aot_pack/pack.json" ]] || usage "--aot: no $aot_pack/pack.json (scripts/gpu-prepare.sh)"
  fi
  [[ $# -gt 0 ]] || set -- fa4 flashinfer
  for set in "$@"; do
    case "$set" in
      fa4) specs+=("${fa4_set[@]}") ;;
      flashinfer) specs+=("${flashinfer_set[@]}" "${fa4_set[@]:1}"); with_flashinfer=1 ;;
      *) usage "unknown set '$set' (fa4, flashinfer)" ;;
    esac
  done
  [[ -z $aot_pack || $with_flashinfer == 1 ]] || usage "--aot needs the flashinfer set"
  # The GPU image's Python is 3.12 on x86-64 (manylinux).
  local platforms=()
  for n in 2_17 2_24 2_27 2_28 2_34; do platforms+=(--platform "manylinux_${n}_x86_64"); done
  rm -rf "$dir.new" && mkdir -p "$dir.new/wheels"
  python3 -m pip download -q --pre --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" --platform manylinux2014_x86_64 \
    -d "$dir.new/wheels" $(printf '%s\n' "${specs[@]}" | sort -u) ||
    { echo "gpu-wheels: download failed" >&2; exit 1; }
  [[ -z $aot_pack ]] || flashinfer_aot "$aot_pack" "$dir.new/wheels"
  (cd "$dir.new/wheels" && sha256sum -- *.whl) >"$dir.new/manifest"
  # Cut every wheel into pieces, then fill the parts with whole pieces,
  # largest first, each into the first part with room: the fewest calls.
  mkdir -p "$dir.new/pieces"
  local wheel
  for wheel in "$dir.new/wheels"/*.whl; do
    split -b "$((part_mib - 1))M" -d -a 3 "$wheel" "$dir.new/pieces/$(basename "$wheel")."
  done
  local part=0 piece size i limit=$((part_mib << 20)) used=()
  while read -r size piece; do
    for ((i = 1; i <= part; i++)); do
      ((used[i] + size <= limit)) && break
    done
    if ((i > part)); then part=$i; used[i]=0; fi
    used[i]=$((used[i] + size))
    mkdir -p "$dir.new/part-$i" && mv "$piece" "$dir.new/part-$i/"
  done < <(for piece in "$dir.new/pieces"/*; do echo "$(stat -c %s "$piece") $piece"; done |
             sort -rn)
  rm -rf "$dir.new/wheels" "$dir.new/pieces" "$dir" && mv "$dir.new" "$dir"
  echo "gpu-wheels: $(wc -l <"$dir/manifest") wheels, $(du -sm "$dir" | cut -f1) MiB in $part parts under $dir"
  echo "device calls, back to back (the machine stays warm only briefly between them):"
  local n
  for n in $(seq 1 "$((part - 1))"); do
    echo "  carry [.gpu-wheels/part-$n, .gpu-wheels/manifest]: scripts/gpu-wheels.sh stage $n"
  done
  echo "  carry [PACK, .gpu-wheels/part-$part, .gpu-wheels/manifest]:" \
    "scripts/gpu-check.sh --wheels [options] PACK"
  echo "  (the last part, $(du -sm "$dir/part-$part" | cut -f1) MiB, travels with the check only" \
    "when it, the pack and the working tree stay under 64 MiB; else stage it as the others)"
}

# FlashInfer's kernels for PACK's rows, compiled here into a wheel of
# flashinfer/data/aot/ (bench/gpu/flashinfer_aot.py) placed in WHEELS. The
# downloaded FlashInfer wheel is installed for this machine's Python with
# what its import needs in .gpu-wheels-cache/ (once per wheel: ninja
# recompiles whatever includes a header newer than its object, and a fresh
# install makes every header new), and nvcc's objects stay beside it, so a
# second download compiles only variants it has not seen.
flashinfer_aot() {
  local pack=$1 wheels=$2 python=${PAGEDC_TORCH_PYTHON:-}
  if [[ -z $python ]]; then
    python=${PAGEDC_TORCH_VENV:-$root/build/torch-venv}/bin/python
    [[ -x $python ]] || python=python3
  fi
  "$python" -c "import torch" 2>/dev/null ||
    { echo "gpu-wheels: --aot needs a Python with torch (PAGEDC_TORCH_PYTHON=$python has none)" >&2; exit 1; }
  local wheel
  wheel=$(compgen -G "$wheels/flashinfer_python-*.whl" | head -1)
  [[ -n $wheel ]] || { echo "gpu-wheels: no FlashInfer wheel was downloaded" >&2; exit 1; }
  local cache=$root/.gpu-wheels-cache hash
  hash=$(sha256sum <"$wheel" | cut -c1-16)
  local scratch=$cache/site-$hash
  if [[ ! -f $scratch/.installed ]]; then
    local tvm_ffi
    tvm_ffi=$(printf '%s\n' "${fa4_set[@]}" | grep '^apache-tvm-ffi==')
    echo "gpu-wheels: installing FlashInfer for this machine's Python in $scratch"
    rm -rf "$scratch"
    "$python" -m pip install -q --no-deps --target "$scratch" "$wheel" "$tvm_ffi" einops \
      tabulate tqdm click nvidia-ml-py cuda-python cuda-bindings cuda-pathfinder packaging \
      requests urllib3 idna certifi ||
      { echo "gpu-wheels: installing FlashInfer here failed" >&2; exit 1; }
    touch "$scratch/.installed"
  fi
  # Only this pack's variants go into the wheel.
  rm -rf "$scratch/flashinfer/data/aot"
  (export PYTHONPATH=$scratch FLASHINFER_WORKSPACE_BASE=$cache \
          CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} MAX_JOBS=${MAX_JOBS:-$(nproc)}
   "$python" "$root/bench/gpu/flashinfer_aot.py" build "$pack" "$scratch" &&
   "$python" "$root/bench/gpu/flashinfer_aot.py" check "$pack" "$scratch") ||
    { echo "gpu-wheels: compiling FlashInfer's kernels failed" >&2; exit 1; }
  local version=${wheel##*/flashinfer_python-}; version=${version%%-*}
  "$python" - "$scratch" "$wheels/pagedc_flashinfer_aot-$version-py3-none-any.whl" <<'PY' ||
import os, sys, zipfile
site, out = sys.argv[1], sys.argv[2]
top = os.path.join(site, "flashinfer", "data", "aot")
with zipfile.ZipFile(out + ".part", "w", zipfile.ZIP_DEFLATED) as archive:
    for folder, _, files in sorted(os.walk(top)):
        for name in sorted(files):
            path = os.path.join(folder, name)
            archive.write(path, os.path.relpath(path, site))
os.replace(out + ".part", out)
PY
    { echo "gpu-wheels: packing FlashInfer's kernels failed" >&2; exit 1; }
}

stage_part() {
  [[ $1 =~ ^[0-9]+$ ]] || usage "stage needs a part number"
  [[ -d "$dir/part-$1" ]] || { echo "gpu-wheels: no $dir/part-$1 (carry it)" >&2; exit 1; }
  mkdir -p "$stage"
  cp "$dir/part-$1"/* "$stage/"
  cp "$dir/manifest" "$stage/manifest"
  echo "gpu-wheels: part $1 staged in $stage ($(du -sm "$stage" | cut -f1) MiB there)"
}

install_staged() {
  # Parts carried by this very call are staged first: the last, smallest
  # part can travel with the check's own call.
  local carried
  for carried in "$dir"/part-*; do
    [[ -d "$carried" ]] && stage_part "${carried##*/part-}"
  done
  [[ -f "$stage/manifest" ]] || { echo "gpu-wheels: nothing staged in $stage" >&2; exit 1; }
  local joined=$stage/joined hash name missing=0
  rm -rf "$joined" && mkdir -p "$joined"
  while read -r hash name; do
    if ! compgen -G "$stage/$name.[0-9][0-9][0-9]" >/dev/null; then
      echo "gpu-wheels: $name: no pieces staged" >&2; missing=1; continue
    fi
    cat "$stage/$name".[0-9][0-9][0-9] >"$joined/$name"
    if [[ $(sha256sum <"$joined/$name" | cut -d' ' -f1) != "$hash" ]]; then
      echo "gpu-wheels: $name: checksum differs (a part missing or cut short)" >&2; missing=1
    fi
  done <"$stage/manifest"
  [[ $missing == 0 ]] || exit 1
  # Unpacked, not `pip install --target`: the CuTe DSL's three wheels fill
  # the same directories, and pip's --target keeps only the last wheel's
  # copy of a directory they share. Their .pth file (which puts the DSL's
  # packages on the path) is read by site.addsitedir, not from PYTHONPATH, so
  # the path it yields is written to $site/pythonpath for gpu-check.sh.
  rm -rf "$site" && mkdir -p "$site"
  python3 - "$site" "$joined"/*.whl <<'PY' || { echo "gpu-wheels: install failed" >&2; exit 1; }
import site, sys, zipfile
target = sys.argv[1]
for wheel in sys.argv[2:]:
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(target)
before = list(sys.path)
site.addsitedir(target)
added = [p for p in sys.path if p not in before]
with open(target + "/pythonpath", "w") as f:
    f.write(":".join(added) + "\n")
PY
  echo "gpu-wheels: $(wc -l <"$stage/manifest") wheels installed in $site;" \
    "PYTHONPATH=$(cat "$site/pythonpath")"
  if compgen -G "$joined/flashinfer_python-*.whl" >/dev/null &&
     ! compgen -G "$joined/pagedc_flashinfer_aot-*.whl" >/dev/null; then
    echo "gpu-wheels: no FlashInfer kernels came with the wheels (download --aot PACK):" \
      "FlashInfer compiles each one here when first used, minutes of the run"
  fi
}

case "${1:-}" in
  download) shift; download "$@" ;;
  stage) [[ $# == 2 ]] || usage "stage takes one part number"; stage_part "$2" ;;
  install) [[ $# == 1 ]] || usage "install takes no arguments"; install_staged ;;
  *) usage "unknown command '${1:-}'" ;;
esac
