#!/usr/bin/env bash
# GPU runner checks on the GPU machine with binaries built elsewhere (same image family) and shipped
# in build-gpu/: gpu tests of the runner and attention kernels, bench attention, the DP2/EP2 generate
# test, and a Qwen3-30B-A3B-geometry prefill (dummy weights, DP2 + EP2, staged). Table last.
#   scripts/gpu_gpuengine.sh   env: LAYERS (full-geometry layers, default 8), FULL=0 skips it, BUILD (binaries dir)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
# The binaries carry this worktree's absolute paths (fixtures, RUNPATH): make them resolve here.
src=/work/wt/gpuengine
if [ "$PWD" != "$src" ]; then mkdir -p /work/wt && ln -sfn "$PWD" "$src"; fi
build=${BUILD:-$src/build-gpu}
source scripts/nccl_env.sh
export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:/usr/local/cuda/lib64"  # libcudnn: dlopen'ed, its path is printed by bench attention
summary=()
step() {  # step NAME TIMEOUT command...
  local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  if timeout "$limit" "$@" >"$out/$name.log" 2>&1; then summary+=("$name|ok|$(( $(date +%s) - t0 ))s")
  else summary+=("$name|FAIL($?)|$(( $(date +%s) - t0 ))s"); tail -25 "$out/$name.log"; fi
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
step test_gpu 80 "$build/tests/megamoe_tests_gpu" --gtest_filter='*GpuTinyModel*:*GpuStaged*:*PagedAttention*:*CudnnAttention*'
step bench_attention 30 "$build/megamoe" bench attention --seq-lens 4096 --heads 32 --kv-heads 4 --head-dim 128 \
     --json "$out/bench_attention.json"
step bench_attention_varlen 25 "$build/megamoe" bench attention --seq-lens 1024 2048 512 512 --heads 32 --kv-heads 4 \
     --head-dim 128 --skip-paged --json "$out/bench_attention_varlen.json"
step memcheck 45 compute-sanitizer --tool memcheck --error-exitcode 1 "$build/tests/megamoe_tests_gpu" \
     --gtest_filter='Shapes/PagedAttention.*:Fixtures/GpuTinyModel.PrefillChunkedDecodeAndPackedAgree/0'
step test_multigpu 50 "$build/tests/megamoe_tests_multigpu" --gtest_filter='GpuGenerate*'
[ "${FULL:-1}" = 1 ] && step full_geometry 100 "$build/megamoe" generate tests/fixtures/qwen3-30b-a3b --load-format dummy --moe-backend staged \
     --data-parallel-size 2 --enable-expert-parallel --random-prompt-len 4096 --max-tokens 1 --repeat 3 \
     --block-size 16 --num-kv-blocks 300 --max-num-batched-tokens 4096 \
     --hf-overrides "{\"num_hidden_layers\": ${LAYERS:-8}}"
for name in test_gpu bench_attention bench_attention_varlen memcheck test_multigpu full_geometry; do
  [ -f "$out/$name.log" ] && { echo "== $name"; grep -E "rel_l2|PASSED|FAILED|kernel|cudnn|cuDNN|paged|rank|tokens/s|Error|error|ERROR SUMMARY" "$out/$name.log" | tail -40; }
done
printf '\n%-24s %-9s %s\n' step result time
for row in "${summary[@]}"; do IFS='|' read -r a b c <<<"$row"; printf '%-24s %-9s %s\n' "$a" "$b" "$c"; done
