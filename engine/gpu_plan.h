// Host-side planning of the GPU runner (plain C++, tested on the CPU): how many KV cache blocks fit
// in GPU memory (--gpu-memory-utilization), and which decode batch sizes get a CUDA graph.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megamoe::engine {

// Bytes one KV block takes over all layers: K and V, [block_size, kv_heads, head_dim] each.
int64_t kv_block_bytes(int num_layers, int block_size, int kv_heads, int head_dim, int element_bytes = 2);

struct KvCachePlanInputs {
  int64_t total_bytes = 0;  // cudaMemGetInfo total
  int64_t free_bytes = 0;   // cudaMemGetInfo free, measured after weights, MoE workspaces, activations
  double gpu_memory_utilization = 0.9;
  int64_t block_bytes = 0;  // kv_block_bytes(...)
  // Kept free for what is allocated later (cuDNN plan workspaces, CUDA graph pools).
  int64_t reserve_bytes = 0;
};
struct KvCachePlan {
  int64_t budget_bytes = 0;  // utilization * total
  int64_t used_bytes = 0;    // total - free: this process (and any other on the device) before the cache
  int64_t cache_bytes = 0;   // num_blocks * block_bytes
  int num_blocks = 0;
};
// vLLM's rule: the cache takes utilization * total - (memory in use) - reserve, in whole blocks, and
// never more than is free. Throws megamoe::Error naming the flag and the figures when not even one
// block fits (or the inputs are out of range).
KvCachePlan plan_kv_cache(const KvCachePlanInputs& in);
// "KV cache: 1234 blocks x 16 tokens = 19744 tokens, 12.3 GiB (budget 0.90 x 139.8 GiB, in use 40.1 GiB)"
std::string describe_kv_cache_plan(const KvCachePlan& plan, const KvCachePlanInputs& in, int block_size);

// Decode batch sizes captured as CUDA graphs: 1, 2, 4, then multiples of 8 up to 64, then of 32 up
// to max_batch (vLLM-like granularity), max_batch itself last. Empty when max_batch < 1.
std::vector<int> decode_graph_buckets(int max_batch);
// The smallest bucket >= batch, or -1 when batch exceeds the largest (then the step runs eagerly).
int pick_decode_bucket(const std::vector<int>& buckets, int batch);

}  // namespace megamoe::engine
