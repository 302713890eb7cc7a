#!/usr/bin/env bash
# The whole one-GPU suite (megamoe_tests_gpu) in two shards, for a machine of ONE H200 (both shards on GPU 0) or two
# (SHARD_GPUS="0 1"). <= LIMIT_S s (default 330: the two shards took 146-150 s each on two GPUs in session 16).
#   source scripts/use_prebuilt.sh NAME [TREE] && OUT=$OUT bash scripts/gpu_one_gpu_suite.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh NAME first}
budget_s=${BUDGET_S:-${LIMIT_S:-330}}; pack_name=${PACK_NAME:-one_gpu_suite.tgz}
source "$(dirname "$0")/device_steps.sh"
SHARD_GPUS=${SHARD_GPUS:-0 0} step_sharded_gpu_suite test_gpu "${LIMIT_S:-330}" "$B/tests/megamoe_tests_gpu"
print_test_counts
grep -h "^\[  SKIPPED \]" "$logs"/test_gpu.log | sort -u
print_summary
