#include "engine/gpu_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "megamoe/error.h"

namespace megamoe::engine {

int64_t kv_block_bytes(int num_layers, int block_size, int kv_heads, int head_dim, int element_bytes) {
  MEGAMOE_CHECK(num_layers > 0 && block_size > 0 && kv_heads > 0 && head_dim > 0 && element_bytes > 0,
                "kv_block_bytes: layers ", num_layers, ", block_size ", block_size, ", kv_heads ", kv_heads,
                ", head_dim ", head_dim, " must all be positive");
  return int64_t{2} * num_layers * block_size * kv_heads * head_dim * element_bytes;
}

KvCachePlan plan_kv_cache(const KvCachePlanInputs& in) {
  MEGAMOE_CHECK(in.gpu_memory_utilization > 0 && in.gpu_memory_utilization <= 1, "--gpu-memory-utilization ",
                in.gpu_memory_utilization, " must be in (0, 1]");
  MEGAMOE_CHECK(in.total_bytes > 0 && in.free_bytes >= 0 && in.free_bytes <= in.total_bytes,
                "GPU memory: free ", in.free_bytes, " must be in [0, total ", in.total_bytes, "]");
  MEGAMOE_CHECK(in.block_bytes > 0, "KV block bytes ", in.block_bytes, " must be positive");
  MEGAMOE_CHECK(in.reserve_bytes >= 0, "reserve_bytes ", in.reserve_bytes, " must be >= 0");
  KvCachePlan plan;
  plan.budget_bytes = static_cast<int64_t>(std::floor(in.gpu_memory_utilization * static_cast<double>(in.total_bytes)));
  plan.used_bytes = in.total_bytes - in.free_bytes;
  const int64_t available =
      std::min(plan.budget_bytes - plan.used_bytes, in.free_bytes) - in.reserve_bytes;
  const int64_t blocks = available > 0 ? available / in.block_bytes : 0;
  const double gib = 1024.0 * 1024.0 * 1024.0;
  MEGAMOE_CHECK(blocks >= 1, "--gpu-memory-utilization ", in.gpu_memory_utilization, ": budget ",
                plan.budget_bytes / gib, " GiB of ", in.total_bytes / gib, " GiB, but ", plan.used_bytes / gib,
                " GiB are in use after the weights, MoE workspaces and activation buffers (+ ", in.reserve_bytes / gib,
                " GiB reserve): no room for one KV block of ", in.block_bytes, " bytes; raise "
                "--gpu-memory-utilization, lower --max-num-batched-tokens, or give --num-kv-blocks");
  plan.num_blocks = static_cast<int>(std::min<int64_t>(blocks, std::numeric_limits<int32_t>::max()));
  plan.cache_bytes = plan.num_blocks * in.block_bytes;
  return plan;
}

std::string describe_kv_cache_plan(const KvCachePlan& plan, const KvCachePlanInputs& in, int block_size) {
  const double gib = 1024.0 * 1024.0 * 1024.0;
  char line[256];
  std::snprintf(line, sizeof(line),
                "KV cache: %d blocks x %d tokens = %lld tokens, %.2f GiB (budget %.2f x %.1f GiB, in use %.2f GiB)",
                plan.num_blocks, block_size, static_cast<long long>(plan.num_blocks) * block_size,
                plan.cache_bytes / gib, in.gpu_memory_utilization, in.total_bytes / gib, plan.used_bytes / gib);
  return line;
}

std::vector<int> decode_graph_buckets(int max_batch) {
  std::vector<int> buckets;
  for (int b : {1, 2, 4})
    if (b <= max_batch) buckets.push_back(b);
  for (int b = 8; b <= std::min(max_batch, 64); b += 8) buckets.push_back(b);
  for (int b = 96; b <= max_batch; b += 32) buckets.push_back(b);
  if (max_batch >= 1 && buckets.back() != max_batch) buckets.push_back(max_batch);
  return buckets;
}

int pick_decode_bucket(const std::vector<int>& buckets, int batch) {
  if (batch < 1) return -1;
  const auto it = std::lower_bound(buckets.begin(), buckets.end(), batch);
  return it == buckets.end() ? -1 : *it;
}

}  // namespace megamoe::engine
