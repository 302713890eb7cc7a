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

# Header-only cudnn-frontend (cuDNN SDPA prefill attention, engine/cudnn_attention.cpp) from PyPI's
# nvidia-cudnn-frontend wheel, into .deps/cudnn-frontend/include (CMake finds it there; without it the
# engine builds its own attention only). cuDNN 9 itself comes with the CUDA image / a torch venv.
CUDNN_FRONTEND_VERSION=1.32.0
deps="$(cd "$(dirname "$0")/.." && pwd)/.deps/cudnn-frontend"
if [ ! -f "$deps/include/cudnn_frontend.h" ]; then
  tmp=$(mktemp -d)
  if python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
       --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d "$tmp" \
       "nvidia-cudnn-frontend==$CUDNN_FRONTEND_VERSION"; then
    mkdir -p "$deps" && python3 -m zipfile -e "$tmp"/nvidia_cudnn_frontend-*.whl "$tmp/wheel" &&
      cp -r "$tmp/wheel/include" "$deps/"
  else
    echo "warning: cudnn-frontend not fetched: the engine builds without the cuDNN attention path" >&2
  fi
  rm -rf "$tmp"
fi
