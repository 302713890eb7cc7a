#!/usr/bin/env bash
# Verifies the engine-mem branch on a 2x H200 machine: shared MoE workspace, --gpu-memory-utilization
# KV sizing, decode CUDA graphs (bit-identical to eager), and Qwen3-30B-A3B-geometry full 48-layer
# DP2/EP2 generate (dummy weights, FP8 experts) with staged and mega: prefill tokens/s and peak
# memory per GPU. Logs to $OUT (or out/); a short table last.
#   scripts/gpu_engine_mem.sh [build-dir]      (default /tmp/build-engine-mem)
#   env: STEPS="build tests full" (any subset; the whole set may exceed one 600 s device call: then run
#        STEPS="build tests" and STEPS=full as two calls on the warm machine), LAYERS (default 48),
#        PROMPT (prompt tokens per rank, default 4096), SANITIZE=0 skips memcheck, EAGER=1 adds the full
#        runs with --enforce-eager (decode ms/step without graphs)
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-/tmp/build-engine-mem}
out=${OUT:-out}; mkdir -p "$out"
steps=" ${STEPS:-build tests full} "
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source scripts/nccl_env.sh
source scripts/cudnn_env.sh
export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:/usr/local/cuda/lib64"
summary=()
step() {  # step NAME TIMEOUT command...
  local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  if timeout "$limit" "$@" >"$out/$name.log" 2>&1; then summary+=("$name|ok|$(( $(date +%s) - t0 ))s")
  else summary+=("$name|FAIL($?)|$(( $(date +%s) - t0 ))s"); tail -30 "$out/$name.log"; fi
}
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader | tee "$out/gpus.txt"
if [[ $steps == *" build "* ]]; then
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  step configure 120 cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DMEGAMOE_BUILD_SERVER=OFF \
       -DNCCL_ROOT="$MEGAMOE_NCCL_ROOT" -DCUDNN_ROOT="${CUDNN_ROOT:-}"
  step build 480 cmake --build "$build" -j "$(nproc)" --target megamoe_cli megamoe_tests_gpu megamoe_tests_multigpu
fi
gpu="$build/tests/megamoe_tests_gpu"; multi="$build/tests/megamoe_tests_multigpu"; cli="$build/megamoe"
if [[ $steps == *" tests "* ]]; then
  # New: shared workspace (staged, mega), KV sizing, decode graphs vs eager.
  step test_workspace 120 "$gpu" --gtest_filter='*MoeWorkspaceSingle*'
  step test_runner_mem 240 "$gpu" --gtest_filter='GpuRunnerMemory.*:*GpuDecodeGraphs*'
  # Regressions over the code this branch changed (backends, qkv_prepare, the runner).
  step test_regress 240 "$gpu" --gtest_filter='*GpuTinyModel*:*GpuStaged*:*MegaSingle*:*EpSingle*:*PagedAttention*'
  step test_multigpu 300 "$multi" --gtest_filter='GpuGenerate*:MoeWorkspaceMulti.*:*MegaMulti*:*EpMulti*Staged*'
  [ "${SANITIZE:-1}" = 1 ] && step memcheck 200 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 \
       "$gpu" --gtest_filter='Backends/GpuDecodeGraphs.ReplayMatchesEager/staged:Backends/MoeWorkspaceSingle.LayersSharingAWorkspaceReplayFromOneGraph/*'
fi
if [[ $steps == *" full "* ]]; then
  variants="staged mega"; [ "${EAGER:-0}" = 1 ] && variants="$variants staged_eager mega_eager"
  for variant in $variants; do
    backend=${variant%_eager}; extra=(); [ "$variant" != "$backend" ] && extra=(--enforce-eager)
    step "full_${variant}" 420 "$cli" generate tests/fixtures/qwen3-30b-a3b --load-format dummy --quantization fp8 \
         --moe-backend "$backend" --data-parallel-size 2 --enable-expert-parallel --random-prompt-len "${PROMPT:-4096}" \
         --max-tokens 4 --repeat 2 --block-size 16 --max-num-batched-tokens 4096 --gpu-memory-utilization 0.9 \
         --hf-overrides "{\"num_hidden_layers\": ${LAYERS:-48}}" "${extra[@]}"
  done
fi
for name in test_workspace test_runner_mem test_regress test_multigpu memcheck; do
  [ -f "$out/$name.log" ] && { echo "== $name"; grep -E "^\[(staged|mega)\]|decode graphs|PASSED|FAILED|ERROR SUMMARY|Error" "$out/$name.log" | tail -20; }
done
printf '\n%-13s %-5s %-10s %-9s %-9s %-10s %-8s %s\n' run rank "prefill s" "tok/s" "peak GiB" "KV blocks" graphs "decode ms"
for backend in staged mega staged_eager mega_eager; do
  log="$out/full_${backend}.log"; [ -f "$log" ] || continue
  for r in 0 1; do
    p=$(grep -E "^rank $r load" "$log" | sed -E 's/.*prefill ([0-9.]+) s = ([0-9]+) tokens.*/\1 \2/')
    peak=$(grep -E "^rank $r peak device memory" "$log" | sed -E 's/.*memory: ([0-9.]+) GiB.*/\1/')
    kv=$(grep -E "^rank $r KV cache" "$log" | sed -E 's/.*KV cache: ([0-9]+) blocks.*/\1/')
    g=$(grep -E "^rank $r decode graphs" "$log" | sed -E 's/.*graphs: ([0-9]+) captured, ([0-9]+) replays.*/\1|\2/')
    d=$(grep -E "^rank $r decode graphs" "$log" | sed -E 's/.*decode ([0-9.]+) ms per step.*/\1/')
    printf '%-13s %-5s %-10s %-9s %-9s %-10s %-8s %s\n' "$backend" "$r" ${p:-"- -"} "${peak:--}" "${kv:--}" "${g:--}" "${d:--}"
  done
done
printf '\n%-16s %-9s %s\n' step result time
for row in "${summary[@]}"; do IFS='|' read -r a b c <<<"$row"; printf '%-16s %-9s %s\n' "$a" "$b" "$c"; done
