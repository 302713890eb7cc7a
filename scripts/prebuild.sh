#!/usr/bin/env bash
# Builds the GPU binaries HERE (no GPU needed; nvcc compiles sm_90a) so that a device call spends no
# time compiling: `megamoe`, the gpu and multigpu test binaries and libmegamoe.so, without the server
# (the GPU machine lacks ICU / cpp-httplib: a binary that needs them does not load there), into
# /tmp/build-pre-NAME, then copies them to SHIP/.xfer/pre-NAME (SHIP: the checkout the device tool
# ships, default /work/main) with the paths they were built for. On the device, in the same call:
#   source scripts/use_prebuilt.sh NAME [SOURCE-TREE]; "$PREBUILT"/tests/megamoe_tests_gpu ...
# (carry ".xfer/pre-NAME", and for a helper's tree also ".xfer/<its name>" as SOURCE-TREE).
#   scripts/prebuild.sh NAME [SHIP]
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: scripts/prebuild.sh NAME [SHIP]}
ship=${2:-/work/main}
build=/tmp/build-pre-$name
log=/tmp/prebuild-$name.log
# Only what ships (not the CPU tests): configure as scripts/build.sh does, then build four targets.
if ! { BUILD_TARGETS="megamoe_cli megamoe_tests_gpu megamoe_tests_multigpu" \
         scripts/build.sh "$build" -DMEGAMOE_BUILD_SERVER=OFF; } >"$log" 2>&1; then
  tail -30 "$log"
  exit 1
fi
# NOTES: a build without cuDNN attention prefills with the paged kernel, whose rounding flips the router
# near tie of tiny-mixtral's prompt 0 (tests/gpu/test_gpu_model.cpp): GpuTinyModel then fails. A git
# worktree has no .deps of its own: link the main checkout's (ln -s /work/main/.deps .deps).
if grep -q "cuDNN attention left out" "$log" && [ "${ALLOW_NO_CUDNN:-0}" != 1 ]; then
  grep -m1 "cuDNN attention left out" "$log"
  echo "prebuild: no cuDNN attention in this build (ALLOW_NO_CUDNN=1 to ship it anyway)" >&2
  exit 1
fi
dest=$ship/.xfer/pre-$name
rm -rf "$dest"
mkdir -p "$dest/tests"
cp "$build/megamoe" "$build/libmegamoe.so" "$dest/"
cp "$build/tests/megamoe_tests_gpu" "$build/tests/megamoe_tests_multigpu" "$dest/tests/"
# NOTES: the test binaries have MEGAMOE_SOURCE_DIR (fixtures) and MEGAMOE_BINARY_DIR (the megamoe
# they start) compiled in, and libmegamoe.so is found through the RUNPATH: use_prebuilt.sh recreates
# both paths on the device.
{
  echo "build_dir=$build"
  echo "source_dir=$PWD"
  echo "commit=$(git rev-parse HEAD)$(git diff --quiet HEAD || echo ' (uncommitted changes)')"
  grep -m1 "cuDNN attention" "$log" || true
} >"$dest/PATHS"
cat "$dest/PATHS"
du -sh "$dest"
