// Causal GQA attention of packed query tokens over a paged KV cache: the decode and chunked-prefill
// kernel of the GPU model runner (whole prefills take the cuDNN path when it is available).
//
// One CTA per (query token, KV head): the CTA serves the `group` = heads / kv_heads query heads that
// share the KV head, so every K/V row is read once per group. Keys are walked in tiles of kKeyTile
// positions: K and V rows are gathered through the block table into shared memory, the CTA computes
// the group's scores, an online softmax (fp32 running max and sum per head), and accumulates P V in
// registers (thread i owns elements i, i + 128, ... of the [group, D] output).
//
// NOTES:
// - Shared memory: q [group][D] fp32 + K, V [kKeyTile][D + 2] bf16 + P [group][kKeyTile] fp32
//   (see paged_attention_smem_bytes). The +2 padding makes the score loop's K reads conflict-free
//   (consecutive keys differ by D/2 + 1 banks).
// - Causality is "key position <= query position": a query at position p reads keys [0, p], all of
//   which are in the cache (the runner writes the step's K/V before attending).
// - Simple by design (SIMT fp32): correct for any block size, head_dim <= 256 and group <= 16; the
//   tensor-core prefill is cuDNN's.
// - Split-KV (flash-decoding): a decode step has few (token, KV head) pairs (one sequence of a GQA
//   model with 4 KV heads = 4 CTAs on 132 SMs, each walking the whole context). With num_splits > 1,
//   gridDim.z CTAs share a pair: split s takes keys [s * per_split, (s + 1) * per_split) of the
//   token's context (per_split = ceil(context / num_splits) rounded up to kKeyTile, computed on the
//   device, so a CUDA graph replayed at a longer context stays correct), and writes its unnormalised
//   fp32 accumulator and (running max, running sum) per query head to the split workspace;
//   paged_attention_merge_kernel rescales and sums the splits. A split past the context writes
//   (max -inf, sum 0) and drops out of the merge.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace megamoe::engine::kernels {

inline constexpr int kAttnThreads = 128;
inline constexpr int kKeyTile = 32;
inline constexpr int kAttnMaxGroup = 16;
inline constexpr int kAttnMaxHeadDim = 256;
inline constexpr int kAttnMaxSplits = 64;

inline size_t paged_attention_smem_bytes(int group, int head_dim) {
  return sizeof(float) * group * head_dim + 2 * sizeof(__nv_bfloat16) * kKeyTile * (head_dim + 2) +
         sizeof(float) * group * kKeyTile + 3 * sizeof(float) * group;
}

__global__ void __launch_bounds__(kAttnThreads)
paged_attention_kernel(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k_cache,
                       const __nv_bfloat16* __restrict__ v_cache, const int32_t* __restrict__ block_tables,
                       const int32_t* __restrict__ seq_of_token, const int32_t* __restrict__ positions,
                       int max_blocks_per_seq, int heads, int kv_heads, int head_dim, int block_size, float scale,
                       __nv_bfloat16* __restrict__ out, float* __restrict__ split_acc,
                       float2* __restrict__ split_stats) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int group = heads / kv_heads, D = head_dim, row = D + 2;
  float* q_s = reinterpret_cast<float*>(smem);                             // [group][D], pre-scaled
  __nv_bfloat16* k_s = reinterpret_cast<__nv_bfloat16*>(q_s + group * D);  // [kKeyTile][row]
  __nv_bfloat16* v_s = k_s + kKeyTile * row;                               // [kKeyTile][row]
  float* p_s = reinterpret_cast<float*>(v_s + kKeyTile * row);             // [group][kKeyTile]
  float* max_s = p_s + group * kKeyTile;                                   // [group] running max
  float* sum_s = max_s + group;                                            // [group] running sum
  float* alpha_s = sum_s + group;                                          // [group] rescale of this tile

  const int64_t t = blockIdx.x;
  const int kvh = blockIdx.y;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int32_t* table = block_tables + static_cast<int64_t>(seq_of_token[t]) * max_blocks_per_seq;
  const int context = positions[t] + 1;
  // This CTA's key range [begin, end) (the whole context without splits).
  const int num_splits = gridDim.z, split = blockIdx.z;
  const int per_split = num_splits == 1 ? context : ((context + num_splits - 1) / num_splits + kKeyTile - 1) / kKeyTile * kKeyTile;
  const int begin = min(context, split * per_split), end = min(context, begin + per_split);
  const int64_t q_base = (t * heads + static_cast<int64_t>(kvh) * group) * D;

  for (int i = tid; i < group * D; i += kAttnThreads) q_s[i] = __bfloat162float(q[q_base + i]) * scale;
  for (int g = tid; g < group; g += kAttnThreads) {
    max_s[g] = -INFINITY;
    sum_s[g] = 0.0f;
  }
  constexpr int kMaxOwned = kAttnMaxGroup * kAttnMaxHeadDim / kAttnThreads;
  float acc[kMaxOwned];
#pragma unroll
  for (int j = 0; j < kMaxOwned; ++j) acc[j] = 0.0f;

  for (int base = begin; base < end; base += kKeyTile) {
    __syncthreads();  // the previous tile's readers are done; q_s and the state are written
    // Gather the K and V rows of positions [base, base + kKeyTile).
    if (D % 8 == 0) {
      // 16-byte loads, all of the thread's loads issued before any shared store so the tile's
      // global latency is paid once (the smem rows are D + 2 wide: stored as 4-byte pieces).
      const int chunks = D / 8;
      constexpr int kMaxChunks = kKeyTile * (kAttnMaxHeadDim / 8) / kAttnThreads;
      uint4 k8[kMaxChunks], v8[kMaxChunks];
#pragma unroll
      for (int n = 0; n < kMaxChunks; ++n) {
        const int i = tid + n * kAttnThreads;
        k8[n] = v8[n] = make_uint4(0, 0, 0, 0);
        const int j = i / chunks, pos = base + j;
        if (i < kKeyTile * chunks && pos < end) {
          const int64_t slot = static_cast<int64_t>(table[pos / block_size]) * block_size + pos % block_size;
          const int64_t offset = (slot * kv_heads + kvh) * D + 8 * (i - j * chunks);
          k8[n] = __ldg(reinterpret_cast<const uint4*>(k_cache + offset));
          v8[n] = __ldg(reinterpret_cast<const uint4*>(v_cache + offset));
        }
      }
#pragma unroll
      for (int n = 0; n < kMaxChunks; ++n) {
        const int i = tid + n * kAttnThreads;
        if (i < kKeyTile * chunks) {
          const int j = i / chunks, c = i - j * chunks;
          uint32_t* kd = reinterpret_cast<uint32_t*>(k_s + j * row + 8 * c);
          uint32_t* vd = reinterpret_cast<uint32_t*>(v_s + j * row + 8 * c);
          kd[0] = k8[n].x, kd[1] = k8[n].y, kd[2] = k8[n].z, kd[3] = k8[n].w;
          vd[0] = v8[n].x, vd[1] = v8[n].y, vd[2] = v8[n].z, vd[3] = v8[n].w;
        }
      }
    } else {
      const int pairs = D / 2;
      for (int i = tid; i < kKeyTile * pairs; i += kAttnThreads) {
        const int j = i / pairs, c = i - j * pairs;
        const int pos = base + j;
        __nv_bfloat162 k2 = __float2bfloat162_rn(0.0f), v2 = k2;
        if (pos < end) {
          const int64_t slot = static_cast<int64_t>(table[pos / block_size]) * block_size + pos % block_size;
          const int64_t offset = (slot * kv_heads + kvh) * D + 2 * c;
          k2 = *reinterpret_cast<const __nv_bfloat162*>(k_cache + offset);
          v2 = *reinterpret_cast<const __nv_bfloat162*>(v_cache + offset);
        }
        *reinterpret_cast<__nv_bfloat162*>(k_s + j * row + 2 * c) = k2;
        *reinterpret_cast<__nv_bfloat162*>(v_s + j * row + 2 * c) = v2;
      }
    }
    __syncthreads();
    // Scores: thread -> (head g, key j); a warp covers the kKeyTile keys of one head.
    for (int i = tid; i < group * kKeyTile; i += kAttnThreads) {
      const int g = i / kKeyTile, j = i - g * kKeyTile;
      float dot = 0.0f;
      const float* qg = q_s + g * D;
      const __nv_bfloat162* kj = reinterpret_cast<const __nv_bfloat162*>(k_s + j * row);
      for (int c = 0; c < D / 2; ++c) {
        const float2 kf = __bfloat1622float2(kj[c]);
        dot = fmaf(qg[2 * c], kf.x, dot);
        dot = fmaf(qg[2 * c + 1], kf.y, dot);
      }
      p_s[i] = base + j < end ? dot : -INFINITY;
    }
    __syncthreads();
    // Online softmax: warp w updates heads w, w + 4, ...; lane = key within the tile.
    for (int g = warp; g < group; g += kAttnThreads / 32) {
      const float score = p_s[g * kKeyTile + lane];
      float tile_max = score;
      for (int offset = 16; offset > 0; offset /= 2)
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, offset));
      const float old_max = max_s[g];
      const float new_max = fmaxf(old_max, tile_max);  // finite: key `base` is always valid
      const float p = expf(score - new_max);           // 0 for masked keys
      float tile_sum = p;
      for (int offset = 16; offset > 0; offset /= 2) tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, offset);
      p_s[g * kKeyTile + lane] = p;
      __syncwarp();
      if (lane == 0) {
        const float alpha = expf(old_max - new_max);  // 0 on the first tile (old_max = -inf)
        alpha_s[g] = alpha;
        sum_s[g] = sum_s[g] * alpha + tile_sum;
        max_s[g] = new_max;
      }
    }
    __syncthreads();
    // acc[g, d] = acc * alpha[g] + sum_j p[g, j] v[j, d]
#pragma unroll
    for (int j = 0; j < kMaxOwned; ++j) {
      const int i = tid + j * kAttnThreads;
      if (i < group * D) {
        const int g = i / D, d = i - g * D;
        float a = acc[j] * alpha_s[g];
        const float* pg = p_s + g * kKeyTile;
        const int keys = min(kKeyTile, end - base);
        for (int k = 0; k < keys; ++k) a = fmaf(pg[k], __bfloat162float(v_s[k * row + d]), a);
        acc[j] = a;
      }
    }
  }
  __syncthreads();
  if (num_splits == 1) {
#pragma unroll
    for (int j = 0; j < kMaxOwned; ++j) {
      const int i = tid + j * kAttnThreads;
      if (i < group * D) {
        const int g = i / D;
        out[q_base + i] = __float2bfloat16(acc[j] / sum_s[g]);
      }
    }
    return;
  }
  // Partial results: row (t * heads + head) * num_splits + split; q_base / D is the group's first head.
  const int64_t first_row = (q_base / D) * num_splits + split;
#pragma unroll
  for (int j = 0; j < kMaxOwned; ++j) {
    const int i = tid + j * kAttnThreads;
    if (i < group * D) {
      const int g = i / D, d = i - g * D;
      split_acc[(first_row + static_cast<int64_t>(g) * num_splits) * D + d] = acc[j];
    }
  }
  for (int g = tid; g < group; g += kAttnThreads)
    split_stats[first_row + static_cast<int64_t>(g) * num_splits] = make_float2(max_s[g], sum_s[g]);
}

// One CTA per (token, query head): out = sum_s w_s acc_s / sum_s w_s sum_s with w_s = exp(max_s - max),
// the splits in index order (deterministic).
__global__ void __launch_bounds__(kAttnThreads)
paged_attention_merge_kernel(const float* __restrict__ split_acc, const float2* __restrict__ split_stats,
                             int num_splits, int head_dim, __nv_bfloat16* __restrict__ out) {
  __shared__ float weight_s[kAttnMaxSplits];
  __shared__ float inv_total_s;
  const int64_t row = blockIdx.x;  // t * heads + head
  const float2* stats = split_stats + row * num_splits;
  if (threadIdx.x < 32) {
    float max_all = -INFINITY;
    for (int s = threadIdx.x; s < num_splits; s += 32) max_all = fmaxf(max_all, stats[s].x);
    for (int offset = 16; offset > 0; offset /= 2) max_all = fmaxf(max_all, __shfl_xor_sync(0xffffffffu, max_all, offset));
    float total = 0.0f;
    for (int s = threadIdx.x; s < num_splits; s += 32) {
      const float2 st = stats[s];
      const float w = st.y > 0.0f ? expf(st.x - max_all) : 0.0f;  // an empty split (past the context) drops out
      weight_s[s] = w;
      total += w * st.y;
    }
    for (int offset = 16; offset > 0; offset /= 2) total += __shfl_xor_sync(0xffffffffu, total, offset);
    if (threadIdx.x == 0) inv_total_s = 1.0f / total;
  }
  __syncthreads();
  const float* acc = split_acc + row * num_splits * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float value = 0.0f;
    for (int s = 0; s < num_splits; ++s) value = fmaf(weight_s[s], acc[static_cast<int64_t>(s) * head_dim + d], value);
    out[row * head_dim + d] = __float2bfloat16(value * inv_total_s);
  }
}

}  // namespace megamoe::engine::kernels
