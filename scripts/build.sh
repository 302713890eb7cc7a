#!/usr/bin/env bash
# Configure + build everything (or BUILD_TARGETS) into $1 (default build/) with all cores. Extra args go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}; shift || true
generator=(); command -v ninja >/dev/null && generator=(-G Ninja)
launcher=(); command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$dir" "${generator[@]}" "${launcher[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
# BUILD_TARGETS (optional, space-separated): build only these targets (scripts/prebuild.sh).
targets=(); for t in ${BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$dir" -j "$(nproc)" "${targets[@]}"
