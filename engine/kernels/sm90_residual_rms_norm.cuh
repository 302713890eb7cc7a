// Residual add + RMSNorm over rows of the fp32 residual stream, one CTA per row.
//
// NOTES: the sum of squares is accumulated in fp64 (like the CPU runner), so the normalisation
// factor differs from the CPU's only by the order of the additions; the output rounds once to bf16.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace megamoe::engine::kernels {

inline constexpr int kNormThreads = 256;

__global__ void __launch_bounds__(kNormThreads)
residual_rms_norm_kernel(float* __restrict__ x, const __nv_bfloat16* __restrict__ delta_bf16,
                         const float* __restrict__ delta_f32, const float* __restrict__ weight, float eps,
                         int64_t hidden, const int32_t* __restrict__ rows_index,
                         __nv_bfloat16* __restrict__ out_bf16, float* __restrict__ out_f32) {
  const int64_t row = blockIdx.x;
  const int64_t src = rows_index ? rows_index[row] : row;
  float* xr = x + src * hidden;
  double sum_sq = 0;
  for (int64_t i = threadIdx.x; i < hidden; i += kNormThreads) {
    float v = xr[i];
    if (delta_bf16) v += __bfloat162float(delta_bf16[src * hidden + i]);
    if (delta_f32) v += delta_f32[src * hidden + i];
    if (delta_bf16 || delta_f32) xr[i] = v;
    sum_sq += static_cast<double>(v) * v;
  }
  __shared__ double partial[kNormThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, offset);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum_sq;
  __syncthreads();
  double total = 0;
  for (int w = 0; w < kNormThreads / 32; ++w) total += partial[w];
  const float inv = 1.0f / sqrtf(static_cast<float>(total / hidden) + eps);
  for (int64_t i = threadIdx.x; i < hidden; i += kNormThreads) {
    const float y = weight[i] * (xr[i] * inv);
    out_bf16[row * hidden + i] = __float2bfloat16(y);
    if (out_f32) out_f32[row * hidden + i] = y;
  }
}

}  // namespace megamoe::engine::kernels
