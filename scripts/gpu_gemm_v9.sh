#!/usr/bin/env bash
# One device call (2 x H200) for GEMM 1 v9 with binaries compiled here (scripts/prebuild.sh gemm-v9 /work/main):
# smoke test (40 s), then GroupedGemmFp8.* on GPU 0 while bench gemm (old split-N vs v9, skews 0 2 4) runs on GPU 1.
# From the checkout the device tool ships, carrying .xfer/pre-gemm-v9:   bash .xfer/pre-gemm-v9/gpu_gemm_v9.sh
set -uo pipefail
source scripts/use_prebuilt.sh gemm-v9 >/dev/null || exit 1
T=$PREBUILT/tests/megamoe_tests_gpu
cd "${OUT:-out}" 2>/dev/null || { mkdir -p out && cd out; }
timeout 40 "$T" --gtest_filter='GroupedGemmFp8.Gemm1SiluTopk:GroupedGemmFp8.RejectsBadGemm1Packing' >smoke.log 2>&1 ||
  { echo SMOKE FAILED; tail -40 smoke.log; exit 1; }
grep 'v9 vs' smoke.log
(CUDA_VISIBLE_DEVICES=1 timeout 300 "$PREBUILT/megamoe" bench gemm --models dsv3 ms4 qwen3-30b --rows 1024 4096 \
   --gemm1-v9 both --v9-skews 0 2 4 --json bench.json >bench.log 2>&1; echo "bench rc=$?" >>bench.log) &
CUDA_VISIBLE_DEVICES=0 timeout 420 "$T" --gtest_filter='GroupedGemmFp8.*' >tests.log 2>&1; echo "tests rc=$?"
wait
grep -E '^\[  (PASSED|FAILED)' tests.log
echo "v9==split-N runs: $(grep -c 'v9 vs split-N: 0 /' tests.log), differing: $(grep 'v9 vs split-N' tests.log | grep -vc ': 0 /')"
grep -E 'gemm1|rc=' bench.log
