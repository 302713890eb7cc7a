#!/usr/bin/env bash
# Debian packages the build needs (the CUDA toolkit with NCCL is part of the machine image).
set -euo pipefail
packages=(cmake ninja-build g++ pkg-config nlohmann-json3-dev libcpp-httplib-dev libcli11-dev
          libpcre2-dev libicu-dev libgtest-dev libgmock-dev libbenchmark-dev)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || {
  echo "nvcc not found: the CUDA toolkit 13 is required to build the kernels" >&2; exit 1; }
