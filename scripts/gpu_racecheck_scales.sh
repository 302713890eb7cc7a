#!/usr/bin/env bash
# One device call (ONE H200, <= BUDGET_S s, default 560): racecheck of mega's FP8 fused tiles (the per-group scale
# reads of fp8_kblock_groups, kScalesPerGroup; docs/perf.md "Session 24") on libmegamoe.so variants, then mega fused
# bench A/B, then the loopback mega suite at 2 ranks and the error tests on the base library.
# Variants: $PREBUILT/var_<NAME>/libmegamoe.so (an experimental mega_backend.cu compiled here and linked into a copy
# of the library; session 25 used it for the UPFRONT / ALL_LANES stage-release variants, docs/perf.md), picked
# through LD_LIBRARY_PATH ahead of the binaries' RUNPATH; VARIANTS lists them ("base" = the prebuilt library).
# RACECHECK_FILTER (gtest filter, default the FP8 routing suite at 2 in-process ranks), RACECHECK_LIMIT, BENCH_ROUNDS,
# MEGA_2=0 (skip the 2-rank mega suite).
#   source scripts/use_prebuilt.sh main && OUT=$OUT bash scripts/gpu_racecheck_scales.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh main first}; T=$B/tests
budget_s=${BUDGET_S:-560}; pack_name=${PACK_NAME:-racecheck.tgz}
source scripts/device_steps.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$logs/gpu.txt"
export MEGAMOE_TEST_LAUNCH_TIMEOUT_S=150
variants=${VARIANTS:-base}
lib_of() { [ "$1" = base ] && echo "$B" || echo "$B/var_$1"; }
racecheck_filter=${RACECHECK_FILTER:-Ranks/EpLoopback.MegaMatchesReferenceOnEveryRouting/2ranks}
for v in $variants; do
  LD_LIBRARY_PATH="$(lib_of "$v"):$LD_LIBRARY_PATH" MEGAMOE_LOOPBACK_CHILD=1 CUDA_MODULE_LOADING=EAGER \
    CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_EP_TIMEOUT_MS=120000 \
    step "racecheck_$v" "${RACECHECK_LIMIT:-100}" compute-sanitizer --tool racecheck "$T/megamoe_tests_gpu" --gtest_filter="$racecheck_filter"
done
# Bench A/B/A: mega fused (the path the variants change), dsv3 FP8 with 128 experts on one rank.
for round in $(seq 1 "${BENCH_ROUNDS:-2}"); do
  for v in $variants; do
    LD_LIBRARY_PATH="$(lib_of "$v"):$LD_LIBRARY_PATH" step "bench_${v}_$round" 90 "$B/megamoe" bench layer --backend mega \
      --mega-path fused --ranks 1 --preset dsv3 --experts 128 --format fp8_block --tokens 128 8192 --iters 10 \
      --json "$logs/bench_${v}_$round.json"
  done
done
[ "${MEGA_2:-1}" = 1 ] && step test_loopback_mega_2 180 "$T/megamoe_tests_gpu" --gtest_filter='Ranks/EpLoopback.Mega*/2ranks'
step test_loopback_errors 60 "$T/megamoe_tests_gpu" --gtest_filter='EpLoopbackErrors.*'
echo; echo "racecheck:"; for v in $variants; do
  echo "$v: $(grep -h "RACECHECK SUMMARY" "$logs/racecheck_$v.log" || echo 'no summary') $(grep -h '^\[  PASSED\|^\[  FAILED' "$logs/racecheck_$v.log" | head -1)"
  grep -h "^=========     and Read access\|^========= Error: Race" "$logs/racecheck_$v.log" | sed 's/.* in \([a-z0-9_.]*:[0-9]*\).*/\1/' | sort | uniq -c | head -8
done
echo; echo "bench (mega fused, µs at 128 / 8192 tokens):"
for f in "$logs"/bench_*.log; do echo "$(basename "$f" .log): $(grep -E '^\| mega' "$f" | awk -F'|' '{printf "%s us (min %s) g1/g2 %s; ", $5, $6, $13}')"; done
echo; print_test_counts
print_summary
