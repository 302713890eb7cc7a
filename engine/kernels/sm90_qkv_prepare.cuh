// Per-token q/k/v preparation after the fused QKV projection: optional per-head RMSNorm of q and k
// (Qwen3), RoPE (rotate-half), and the KV-cache write. One CTA per token, one warp per head.
//
// NOTES:
// - Order and precision follow the CPU runner: the bf16 projection output is read as fp32, normed
//   (fp64 sum of squares), rotated with the same fp32 cos/sin values (tables built on the host the
//   way the CPU runner computes them), and rounded once to bf16.
// - v is copied unchanged (bit-exact) into the cache.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace megamoe::engine::kernels {

inline constexpr int kQkvWarps = 8;
inline constexpr int kQkvMaxHeadDim = 256;

__global__ void __launch_bounds__(kQkvWarps * 32)
qkv_prepare_kernel(const __nv_bfloat16* __restrict__ qkv, int heads, int kv_heads, int head_dim,
                   const float* __restrict__ q_norm, const float* __restrict__ k_norm, float eps,
                   const float* __restrict__ rope_cos, const float* __restrict__ rope_sin,
                   const int32_t* __restrict__ positions, const int64_t* __restrict__ slot_mapping,
                   __nv_bfloat16* __restrict__ q_out, __nv_bfloat16* __restrict__ k_cache,
                   __nv_bfloat16* __restrict__ v_cache, __nv_bfloat16* __restrict__ k_out,
                   __nv_bfloat16* __restrict__ v_out) {
  __shared__ float staged[kQkvWarps][kQkvMaxHeadDim];
  const int64_t t = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int D = head_dim, half = D / 2;
  const int64_t row = static_cast<int64_t>(heads + 2 * kv_heads) * D;
  const __nv_bfloat16* in = qkv + t * row;
  const int32_t position = positions[t];
  const int64_t slot = slot_mapping[t];
  const float* cos_row = rope_cos + static_cast<int64_t>(position) * half;
  const float* sin_row = rope_sin + static_cast<int64_t>(position) * half;
  float* s = staged[warp];
  for (int h = warp; h < heads + 2 * kv_heads; h += kQkvWarps) {
    const __nv_bfloat16* src = in + static_cast<int64_t>(h) * D;
    if (h >= heads + kv_heads) {  // v: copy
      const int kvh = h - heads - kv_heads;
      for (int i = lane; i < D; i += 32) {
        const __nv_bfloat16 v = src[i];
        if (slot >= 0) v_cache[(slot * kv_heads + kvh) * D + i] = v;
        if (v_out) v_out[(t * kv_heads + kvh) * D + i] = v;
      }
      continue;
    }
    const bool is_q = h < heads;
    const float* norm = is_q ? q_norm : k_norm;
    double sum_sq = 0;
    for (int i = lane; i < D; i += 32) {
      const float v = __bfloat162float(src[i]);
      s[i] = v;
      sum_sq += static_cast<double>(v) * v;
    }
    if (norm) {
      for (int offset = 16; offset > 0; offset /= 2) sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, offset);
      const float inv = 1.0f / sqrtf(static_cast<float>(sum_sq / D) + eps);
      for (int i = lane; i < D; i += 32) s[i] = norm[i] * (s[i] * inv);
    }
    __syncwarp();
    float rotated[kQkvMaxHeadDim / 32];
    for (int i = lane, j = 0; i < D; i += 32, ++j) {
      const int k = i < half ? i : i - half;
      const float c = cos_row[k], sn = sin_row[k];
      rotated[j] = i < half ? s[i] * c - s[i + half] * sn : s[i] * c + s[i - half] * sn;
    }
    __syncwarp();
    for (int i = lane, j = 0; i < D; i += 32, ++j) {
      const __nv_bfloat16 r = __float2bfloat16(rotated[j]);
      if (is_q) {
        q_out[(t * heads + h) * D + i] = r;
      } else {
        const int kvh = h - heads;
        if (slot >= 0) k_cache[(slot * kv_heads + kvh) * D + i] = r;
        if (k_out) k_out[(t * kv_heads + kvh) * D + i] = r;
      }
    }
  }
}

}  // namespace megamoe::engine::kernels
