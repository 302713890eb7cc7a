#!/usr/bin/env bash
# GPU machine, one call: build (all cores) + EP gpu/multigpu tests + EP benchmarks; table last.
# Logs go to $OUT (the run tool's folder) or /tmp/out-ep.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out-ep}
mkdir -p "$OUT"
B=${BUILD_DIR:-/tmp/build-ep}
# NOTES: headers and library must be the same NCCL (mismatch segfaulted); nccl_env.sh picks one.
wheel=$(python3 -c "import nvidia.nccl,os;print(os.path.dirname(nvidia.nccl.__file__))" 2>/dev/null || true)
[ -n "$wheel" ] || wheel=$(dirname "$(dirname "$(find / -path '*nvidia/nccl/lib/libnccl.so.2' 2>/dev/null | head -1)")" 2>/dev/null)
echo "NCCL wheel: '$wheel'"; ls "$wheel" "$wheel/lib" "$wheel/include" 2>&1 | head -12
# Prebuilt binaries were compiled against NCCL 2.28.9 headers: they need the wheel's 2.28.9 library.
if [ -n "${PREBUILT:-}" ] && [ -e "$wheel/lib/libnccl.so.2" ]; then export MEGAMOE_NCCL_ROOT=$wheel; fi
source scripts/nccl_env.sh
NCCL_DIR=$MEGAMOE_NCCL_ROOT
ls "$NCCL_DIR/include" | head; ls "$NCCL_DIR/include/nccl_device" >/dev/null 2>&1 || echo "WARNING: no nccl_device/ in $NCCL_DIR/include"
export NCCL_NVLS_ENABLE=0
start=$(date +%s)
# PREBUILT=<dir> with megamoe_tests_gpu, megamoe_tests_multigpu and megamoe built elsewhere against the
# same NCCL version (checked at run time) saves the device-side build; otherwise build here.
if [ -n "${PREBUILT:-}" ] && LD_LIBRARY_PATH="$PREBUILT:$LD_LIBRARY_PATH" "$PREBUILT/megamoe_tests_gpu" --gtest_list_tests >/dev/null 2>&1; then
  TGPU="$PREBUILT/megamoe_tests_gpu"; TMULTI="$PREBUILT/megamoe_tests_multigpu"; CLI="$PREBUILT/megamoe"
  export LD_LIBRARY_PATH="$(cd "$PREBUILT" && pwd):$LD_LIBRARY_PATH"  # libmegamoe.so
  echo "using prebuilt binaries from $PREBUILT"
else
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S . -B "$B" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DNCCL_ROOT="$NCCL_DIR" >"$OUT/cmake.log" 2>&1 || { tail -40 "$OUT/cmake.log"; exit 1; }
  grep NCCL "$OUT/cmake.log"
  cmake --build "$B" -j"$(nproc)" --target megamoe_tests_gpu megamoe_tests_multigpu megamoe_cli >"$OUT/build.log" 2>&1 ||
    { grep -B3 -A12 -E "error|Error" "$OUT/build.log" | head -80; exit 1; }
  echo "build: $(( $(date +%s) - start )) s"
  TGPU="$B/tests/megamoe_tests_gpu"; TMULTI="$B/tests/megamoe_tests_multigpu"; CLI="$B/megamoe"
fi
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
timeout 60 "$TGPU" --gtest_filter='EpSingle.*' >"$OUT/gpu_tests.log" 2>&1; gpu_rc=$?
timeout 130 "$TMULTI" --gtest_filter='EpMulti.*' >"$OUT/multigpu_tests.log" 2>&1; mg_rc=$?
grep -E "^\[  (FAILED|PASSED|  OK|SKIPPED) |Failure|rel_l2|error|Error" "$OUT/gpu_tests.log" | head -40
grep -E "^\[  (FAILED|PASSED|  OK|SKIPPED) |Failure|rel_l2|rror|Expected|Which is|actual" "$OUT/multigpu_tests.log" | head -70
timeout 45 "$CLI" bench ep --ranks 2 --tokens 4096 --hidden 7168 --top-k 8 --experts 256 --iters 20 --json "$OUT/bench_dc_4096.json" >"$OUT/bench_dc.log" 2>&1; b1=$?
timeout 40 "$CLI" bench layer --backend reference,staged --check --tokens 64 >"$OUT/bench_layer_tiny.log" 2>&1; b2=$?
timeout 90 "$CLI" bench ep --ranks 2 --staged --preset dsv3 --format fp8 --tokens 8192 --iters 10 --json "$OUT/bench_staged_dsv3_8192.json" >"$OUT/bench_staged_8192.log" 2>&1; b3=$?
timeout 150 "$CLI" bench layer --backend staged --ranks 2 --preset dsv3 --format fp8_block --tokens 128,8192 --iters 10 --json "$OUT/bench_layer_dsv3.json" >"$OUT/bench_layer_dsv3.log" 2>&1; b4=$?
echo "=================== EP summary ($(( $(date +%s) - start )) s) ==================="
echo "gpu tests rc=$gpu_rc: $(grep -cE '^\[       OK' "$OUT/gpu_tests.log") ok, $(grep -cE '^\[  FAILED  \] Ep' "$OUT/gpu_tests.log") failed lines"
echo "multigpu tests rc=$mg_rc: $(grep -cE '^\[       OK' "$OUT/multigpu_tests.log") ok lines (incl. ranks)"
echo "bench rc: $b1 $b2 $b3 $b4"
tail -12 "$OUT/bench_layer_tiny.log"
tail -12 "$OUT/bench_layer_dsv3.log"
tail -4 "$OUT/bench_dc.log"; tail -4 "$OUT/bench_staged_8192.log"
