#!/usr/bin/env bash
# Installs the Debian packages pagedc needs, only those that are missing.
# Quiet when everything is already there; safe to run any number of times.
source "$(dirname "$0")/script-help.sh"
set -euo pipefail
packages=(cmake ninja-build g++ lld python3 llvm-19-dev libmlir-19-dev mlir-19-tools llvm-19-tools
          libfmt-dev libgtest-dev libbenchmark-dev libxxhash-dev nlohmann-json3-dev
          clang-19 libclang-rt-19-dev
          python3-dev pybind11-dev python3-numpy python3-pytest)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -ne 0 ]; then
  echo "pagedc: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
